//! The Worker's own certificate with the real binary against the loopback plane (issue 18,
//! Deliver 4):
//!
//! * SIGHUP with a rotated client certificate in place: `tls.reloaded` (changed), and every
//!   connection opened afterwards presents the new certificate (the plane records the SHA-256 of
//!   the leaf each connection presented); a bad new file (an expired certificate) is refused with
//!   `tls.reload_failed` naming why, the rotated one stays in use and work goes on;
//! * at start, an expired, a not-yet-valid or a serverAuth-only client certificate is refused
//!   (exit 2, the setting and the rule named) before the state root is created;
//! * a certificate expiring within `certificate_warning_days` is a `certificate.expiring` warning
//!   and `ql_worker_client_certificate_expiring 1` in the metrics file.

mod e2e_common;

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use e2e_common::{KillOnDrop, World, events_named, signal, sigterm, wait_event, wait_exit};
use ql_worker_core::record::State;
use ql_worker_tests::control_plane::{RevisionBuilder, RunSpec};
use ql_worker_tests::pki::CertKeyFiles;
use sha2::Digest as _;

const SETTLE: Duration = Duration::from_secs(30);
const JSON: &[&str] = &["--log-format", "json"];

/// SHA-256 of the DER of the first certificate of a PEM file.
fn leaf_sha256(pem: &Path) -> [u8; 32] {
    let text = std::fs::read_to_string(pem).unwrap();
    let body: String = text
        .lines()
        .skip_while(|l| !l.starts_with("-----BEGIN CERTIFICATE-----"))
        .skip(1)
        .take_while(|l| !l.starts_with("-----END"))
        .collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .unwrap();
    sha2::Sha256::digest(der).into()
}

/// Replaces `to` by a copy of `from` (a new 0600 file renamed over it, as an operator's
/// deployment tool would).
fn install(from: &Path, to: &Path) {
    let temp = to.with_extension("new");
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)
        .unwrap();
    file.write_all(&std::fs::read(from).unwrap()).unwrap();
    file.sync_all().unwrap();
    std::fs::rename(&temp, to).unwrap();
}

/// Installs `pair` as the Worker's configured client certificate and key.
fn install_pair(world: &World, pair: &CertKeyFiles) {
    install(&pair.cert, &world.config.control_plane.client_certificate);
    install(&pair.key, &world.config.control_plane.client_key);
}

/// The leaf digests of the requests on connections numbered above `after`.
fn digests_after(world: &World, after: u64) -> Vec<Option<[u8; 32]>> {
    world
        .cp
        .http_records()
        .iter()
        .filter(|r| r.connection_id > after)
        .map(|r| r.tls.client_cert_sha256)
        .collect()
}

fn last_connection(world: &World) -> u64 {
    world
        .cp
        .http_records()
        .iter()
        .map(|r| r.connection_id)
        .max()
        .unwrap_or(0)
}

fn run_one(world: &World, n: u32) {
    let quick = RevisionBuilder::shell("true").build().unwrap();
    let run = world.cp.enqueue_run(RunSpec::numbered(n, quick)).unwrap();
    world.wait_for("the Run completed", SETTLE, |w| {
        w.state_of(&run) == Some(State::CompletionAcknowledged)
    });
}

#[test]
fn sighup_swaps_the_client_certificate_and_a_bad_new_one_keeps_the_old() {
    let world = World::new();
    let pki = world.cp.pki().clone();
    let original = leaf_sha256(&world.config.control_plane.client_certificate);
    let rotated = leaf_sha256(&pki.client_rotated.cert);
    assert_ne!(original, rotated);
    let log = world.dir.path().join("worker.log");
    let mut worker = KillOnDrop(world.spawn_with_args(JSON, &[], &log));
    wait_event(&log, "reconciliation.done", SETTLE, |_| true);
    run_one(&world, 1);
    assert!(
        digests_after(&world, 0)
            .iter()
            .all(|d| *d == Some(original)),
        "before the reload, every connection presented the original certificate"
    );

    // A rotated certificate and key, then SIGHUP.
    install_pair(&world, &pki.client_rotated);
    let before = last_connection(&world);
    signal(&worker, rustix::process::Signal::HUP);
    let reloaded = wait_event(&log, "tls.reloaded", SETTLE, |_| true);
    assert_eq!(reloaded["changed"], true, "{reloaded}");
    run_one(&world, 2);
    let after = digests_after(&world, before);
    assert!(!after.is_empty(), "new connections after the reload");
    assert!(
        after.iter().all(|d| *d == Some(rotated)),
        "every connection after the reload presented the rotated certificate"
    );

    // An expired certificate: refused, the rotated one stays in use.
    install_pair(&world, &pki.client_expired);
    let before = last_connection(&world);
    signal(&worker, rustix::process::Signal::HUP);
    let failed = wait_event(&log, "tls.reload_failed", SETTLE, |_| true);
    let cause = failed["cause"].as_str().unwrap_or_default();
    assert!(cause.contains("has expired"), "{failed}");
    assert!(
        failed["message"]
            .as_str()
            .unwrap_or_default()
            .contains("the old stays in use"),
        "{failed}"
    );
    run_one(&world, 3);
    let after = digests_after(&world, before);
    assert!(
        after.iter().all(|d| *d == Some(rotated)),
        "after a refused reload the rotated certificate is still the one presented"
    );
    assert_eq!(events_named(&log, "tls.reloaded").len(), 1);
    assert!(worker.try_wait().unwrap().is_none(), "the Worker runs on");
    sigterm(&worker);
    assert_eq!(wait_exit(&mut worker, SETTLE).code(), Some(0));
}

#[test]
fn an_expired_not_yet_valid_or_server_only_certificate_is_refused_at_start() {
    let world = World::new();
    let pki = world.cp.pki().clone();
    for (pair, rule) in [
        (&pki.client_expired, "has expired"),
        (&pki.client_not_yet_valid, "is not valid yet"),
        (
            &pki.client_server_auth,
            "may not be used for TLS client authentication",
        ),
    ] {
        install_pair(&world, pair);
        let output = Command::new(env!("CARGO_BIN_EXE_ql-worker"))
            .arg("run")
            .arg("--config")
            .arg(&world.config_path)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{rule}: {stderr}");
        assert!(
            stderr.contains("control_plane.client_certificate") && stderr.contains(rule),
            "the setting and the rule are named: {stderr}"
        );
        assert!(
            !world.root().exists(),
            "a refused start creates no state root"
        );
    }
    assert!(
        world.cp.session(world.cp.worker_id()).is_none(),
        "no Session was registered"
    );
    // With --log-format json the refusal is one JSON object too (`worker.refused`).
    let output = Command::new(env!("CARGO_BIN_EXE_ql-worker"))
        .args(["--log-format", "json", "run", "--config"])
        .arg(&world.config_path)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8(output.stderr).unwrap();
    let lines: Vec<serde_json::Value> = stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    assert_eq!(lines[0]["event"], "worker.refused");
    assert_eq!(lines[0]["level"], "error");
    assert_eq!(lines[0]["exit_code"], 2);
    assert!(
        lines[0]["message"]
            .as_str()
            .is_some_and(|m| m.contains("control_plane.client_certificate")),
        "{stderr}"
    );
}

#[test]
fn a_certificate_expiring_within_the_window_is_a_warning_and_a_metric() {
    let mut world = World::new();
    let pki = world.cp.pki().clone();
    install_pair(&world, &pki.client_expiring);
    let metrics_file = world.dir.path().join("ql-worker.prom");
    world.append_config(&format!(
        "\n[metrics]\ntextfile = \"{}\"\ninterval_ms = 1000\n",
        metrics_file.display()
    ));
    let log = world.dir.path().join("worker.log");
    let mut worker = KillOnDrop(world.spawn_with_args(JSON, &[], &log));
    let warning = wait_event(&log, "certificate.expiring", SETTLE, |_| true);
    assert_eq!(warning["level"], "warn", "{warning}");
    let days = warning["days_left"].as_i64().unwrap();
    assert!((4..=5).contains(&days), "5 days from generation: {warning}");
    let start = Instant::now();
    let text = loop {
        let text = std::fs::read_to_string(&metrics_file).unwrap_or_default();
        if text
            .lines()
            .any(|l| l.starts_with("ql_worker_client_certificate_expiring "))
        {
            break text;
        }
        assert!(start.elapsed() < SETTLE, "no metrics file");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        text.lines()
            .any(|l| l == "ql_worker_client_certificate_expiring 1"),
        "{text}"
    );
    // The Worker still works with it.
    run_one(&world, 1);
    sigterm(&worker);
    assert_eq!(wait_exit(&mut worker, SETTLE).code(), Some(0));
}
