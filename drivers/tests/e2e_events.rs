//! The event log of the real binary (issue 18): every case that used to be silent produces a
//! named event, asserted on the Worker's own stderr written with `--log-format json` (each line
//! must be one JSON object), and ends the way `docs/operations.md` says.
//!
//! * a wrong CA, a TLS-1.2-only server, a server name that does not match: `call.failed` with
//!   `class = tls` and the cause (`UnknownIssuer`, `ProtocolVersion`, `NotValidForName`); a drain
//!   then exits 0 at once (nothing was registered, nothing runs); left alone, the Worker halts
//!   after `control_plane.give_up_after_ms` (exit 5, `control_plane.unreachable`);
//! * a non-JSON 200 answer to a Pull: `call.invalid_answer` and `pull.failed`;
//! * the credential file made 0644 while running: `credential.unreadable` naming the rule, and
//!   the Worker works again once it is fixed;
//! * a corrupt record: `storage.fault` naming the file and the rule, exit 3;
//! * a garbage pending claim: exit 3 from `run`, reported by `inbox list` and `recover`;
//! * a launch left `launching` by a crash: `recovery.required` with the reason and the next step.

mod e2e_common;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use e2e_common::{
    HOOKED_BINARY, KillOnDrop, PRODUCTION_BINARY, World, events, events_named, kill9, sigterm,
    wait_event, wait_exit,
};
use ql_worker_core::record::State;
use ql_worker_tests::control_plane::{Fault, RevisionBuilder, RunSpec};
use ql_worker_tests::https_server::{
    HttpsServer, Request, Response, ServerMode, ServerOptions, ServerTls,
};

const SETTLE: Duration = Duration::from_secs(60);
const JSON: &[&str] = &["--log-format", "json"];

/// A server that answers every request with a 503 (it is only there to fail the handshake).
struct Nobody;

impl ql_worker_tests::https_server::Handler for Nobody {
    fn handle(&self, _req: &mut Request<'_>) -> Response {
        let mut response = Response::json(b"{\"code\":\"worker_ingress_unavailable\"}".to_vec());
        response.status = 503;
        response
    }
}

fn server(world: &World, mode: ServerMode, cert: &Path, key: &Path) -> HttpsServer {
    let pki = world.cp.pki();
    let tls = ServerTls::from_pem_files(cert, key, &[&pki.ca.cert]).unwrap();
    let options = ServerOptions {
        mode,
        ..ServerOptions::default()
    };
    HttpsServer::start(options, &tls, Arc::new(Nobody)).unwrap()
}

/// Starts the Worker, waits for `call.failed` with this TLS cause, then drains it: exit 0 at
/// once (nothing was registered; the drain budget is 10 minutes).
fn tls_failure_then_quick_drain(world: &World, cause: &str) {
    let log = world.dir.path().join(format!("{cause}.log"));
    let mut worker = KillOnDrop(world.spawn_with_args(JSON, &[], &log));
    let event = wait_event(&log, "call.failed", SETTLE, |e| e["tls_cause"] == cause);
    assert_eq!(event["class"], "tls", "{event}");
    assert_eq!(event["operation"], "register", "{event}");
    assert_eq!(event["level"], "warn");
    assert!(
        event["cause"].as_str().is_some_and(|c| c.contains("TLS")),
        "{event}"
    );
    sigterm(&worker);
    let status = wait_exit(&mut worker, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "{}", read(&log));
    let stopped = events_named(&log, "worker.stopped");
    assert_eq!(stopped.len(), 1, "{}", read(&log));
    assert_eq!(stopped[0]["how"], "not_registered");
    assert!(
        events_named(&log, "drain.begun").len() == 1,
        "{}",
        read(&log)
    );
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

#[test]
fn tls_failures_are_named_with_their_cause_and_a_drain_does_not_wait_for_the_budget() {
    let mut world = World::new();
    world.edit_config("drain_budget_ms = 20000", "drain_budget_ms = 600000");
    let pki = world.cp.pki().clone();
    let good_origin = world.cp.origin().to_owned();

    // A CA that did not issue the server's certificate.
    let ca = pki.ca.cert.display().to_string();
    let other_ca = pki.other_ca.cert.display().to_string();
    world.edit_config(&ca, &other_ca);
    tls_failure_then_quick_drain(&world, "UnknownIssuer");
    world.edit_config(&other_ca, &ca);

    // A server that speaks TLS 1.2 only.
    let tls12 = server(
        &world,
        ServerMode::Tls12Only,
        &pki.server.cert,
        &pki.server.key,
    );
    world.edit_config(&good_origin, &tls12.origin());
    tls_failure_then_quick_drain(&world, "ProtocolVersion");
    world.edit_config(&tls12.origin(), &good_origin);
    drop(tls12);

    // A server whose certificate is for another name.
    let wrong = server(
        &world,
        ServerMode::Tls13,
        &pki.wrong_host_server.cert,
        &pki.wrong_host_server.key,
    );
    world.edit_config(&good_origin, &wrong.origin());
    tls_failure_then_quick_drain(&world, "NotValidForName");
}

#[test]
fn persistent_tls_failures_halt_after_the_documented_bound() {
    let mut world = World::new();
    let ca = world.cp.pki().ca.cert.display().to_string();
    let other_ca = world.cp.pki().other_ca.cert.display().to_string();
    world.edit_config(&ca, &other_ca);
    world.edit_config(
        "timeout_ms = 5000\n",
        "timeout_ms = 5000\ngive_up_after_ms = 5000\n",
    );
    let log = world.dir.path().join("worker.log");
    let mut worker = KillOnDrop(world.spawn_with_args(JSON, &[], &log));
    let status = wait_exit(&mut worker, SETTLE);
    assert_eq!(status.code(), Some(5), "{}", read(&log));
    let failures = events_named(&log, "call.failed");
    assert!(
        failures.len() >= 2
            && failures
                .iter()
                .all(|e| e["tls_cause"] == "UnknownIssuer" && e["class"] == "tls"),
        "every attempt is logged with its cause: {failures:?}"
    );
    let unreachable = events_named(&log, "control_plane.unreachable");
    assert_eq!(unreachable.len(), 1, "{}", read(&log));
    assert_eq!(unreachable[0]["level"], "error");
    assert!(
        unreachable[0]["message"]
            .as_str()
            .is_some_and(
                |m| m.contains("give_up_after_ms") && m.contains("UnknownIssuer")
                    || m.contains("trust anchor")
            ),
        "{}",
        unreachable[0]
    );
    let stopped = events_named(&log, "worker.stopped");
    assert_eq!(stopped[0]["exit_code"], 5);
}

#[test]
fn a_non_json_answer_and_a_credential_file_made_0644_are_named_and_survived() {
    let world = World::new();
    let log = world.dir.path().join("worker.log");
    let mut worker = KillOnDrop(world.spawn_with_args(JSON, &[], &log));
    let registered = wait_event(&log, "session.registered", SETTLE, |_| true);
    let session = registered["session"].as_str().unwrap().to_owned();
    let offers = format!(
        "/api/v3/worker-ingress/workers/{}/sessions/{session}/offers",
        world.cp.worker_id()
    );
    // The next Pull gets a 200 whose body is not JSON.
    world.cp.inject_for(
        &offers,
        Fault::Rewrite {
            find: String::from("{"),
            replace: String::from("<html>"),
        },
    );
    let invalid = wait_event(&log, "call.invalid_answer", SETTLE, |e| {
        e["operation"] == "offers"
    });
    assert_eq!(invalid["level"], "warn", "{invalid}");
    // Not the contract's JSON: an uncertain outcome (the offer may have been granted; the claim
    // is kept for the retry), named as such.
    let failed = wait_event(&log, "pull.failed", SETTLE, |_| true);
    assert!(
        failed["cause"].as_str().is_some_and(
            |c| c.contains("uncertain outcome") && c.contains("not the contract's JSON")
        ),
        "{failed}"
    );
    assert!(failed["retry_in_ms"].as_u64().is_some(), "{failed}");

    // The credential file made readable by others while running.
    let credential = &world.config.control_plane.credential_file;
    let mode = |m: u32| {
        std::fs::set_permissions(credential, std::os::unix::fs::PermissionsExt::from_mode(m))
            .unwrap();
    };
    mode(0o644);
    let unreadable = wait_event(&log, "credential.unreadable", SETTLE, |_| true);
    assert_eq!(unreadable["level"], "error");
    let rule = unreadable["rule"].as_str().unwrap();
    assert!(
        rule.contains("0600") && rule.contains("0644") && rule.contains("credential file"),
        "{unreadable}"
    );
    assert!(
        !rule.contains("ql3w_"),
        "the rule names the file, never its content"
    );
    mode(0o600);
    // It works again: a Run goes through once the file is fixed (the backoff of the failed
    // Pull ends within a minute).
    let quick = RevisionBuilder::shell("true").build().unwrap();
    let run = world.cp.enqueue_run(RunSpec::numbered(1, quick)).unwrap();
    world.wait_for("the Run completed", Duration::from_secs(90), |w| {
        w.state_of(&run) == Some(State::CompletionAcknowledged)
    });
    sigterm(&worker);
    assert_eq!(
        wait_exit(&mut worker, SETTLE).code(),
        Some(0),
        "{}",
        read(&log)
    );
    // Every line of the event log was one JSON object (`events` fails otherwise).
    assert!(events(&log).len() > 5);
}

#[test]
fn a_corrupt_record_and_a_garbage_pending_claim_stop_with_exit_3_naming_file_and_rule() {
    let world = World::new();
    e2e_common::init_root(world.root());
    // A garbage record.
    let record = world
        .root()
        .join("offers/0a0a0a0a-0000-4000-8000-000000000001.rec");
    write_private(&record, b"this is not an envelope");
    let log = world.dir.path().join("record.log");
    let mut worker = KillOnDrop(world.spawn_with_args(JSON, &[], &log));
    let status = wait_exit(&mut worker, SETTLE);
    assert_eq!(status.code(), Some(3), "{}", read(&log));
    let fault = wait_event(&log, "storage.fault", Duration::from_secs(1), |e| {
        e["halting"] == true
    });
    let error = fault["error"].as_str().unwrap();
    assert!(error.contains(&record.display().to_string()), "{fault}");
    let stopped = &events_named(&log, "worker.stopped")[0];
    assert_eq!(stopped["exit_code"], 3);
    assert!(
        stopped["message"]
            .as_str()
            .is_some_and(|m| m.contains(&record.display().to_string())),
        "the last word names the file: {stopped}"
    );
    std::fs::remove_file(&record).unwrap();

    // A garbage pending claim.
    let claim = world.root().join("pending-claim");
    write_private(&claim, b"garbage");
    let log = world.dir.path().join("claim.log");
    let mut worker = KillOnDrop(world.spawn_with_args(JSON, &[], &log));
    assert_eq!(
        wait_exit(&mut worker, SETTLE).code(),
        Some(3),
        "{}",
        read(&log)
    );
    let stopped = &events_named(&log, "worker.stopped")[0];
    assert!(
        stopped["message"]
            .as_str()
            .is_some_and(|m| m.contains(&claim.display().to_string())),
        "{stopped}"
    );
    for args in [&["inbox", "list"][..], &["recover"][..]] {
        let out = Command::new(PRODUCTION_BINARY)
            .args(args)
            .arg("--root")
            .arg(world.root())
            .output()
            .unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(out.status.code(), Some(3), "{args:?}: {all}");
        assert!(
            all.contains("pending claim") && all.contains(&claim.display().to_string()),
            "{args:?}: {all}"
        );
    }
}

#[test]
fn a_launch_left_by_a_crash_is_reported_with_its_reason_and_the_next_step() {
    let world = World::new();
    let marker = world.dir.path().join("marker");
    let revision = RevisionBuilder::shell(&format!("echo ran >> {}", marker.display()))
        .build()
        .unwrap();
    let run = world
        .cp
        .enqueue_run(RunSpec::numbered(1, revision))
        .unwrap();
    let stall = world.dir.path().join("stall.log");
    let mut hooked = KillOnDrop(world.spawn_hooked_worker_logged(
        &[(
            ql_worker::test_hooks::STALL_HOOK_ENV,
            State::Launching.as_str(),
        )],
        &stall,
    ));
    world.wait_for("the record launching", SETTLE, |w| {
        w.state_of(&run) == Some(State::Launching)
    });
    kill9(&mut hooked);
    let _ = HOOKED_BINARY;
    let log = world.dir.path().join("worker.log");
    let mut worker = KillOnDrop(world.spawn_with_args(JSON, &[], &log));
    let event = wait_event(&log, "recovery.required", SETTLE, |_| true);
    assert_eq!(event["reason"], "launch_outcome_unknown", "{event}");
    assert_eq!(event["level"], "error");
    assert!(
        event["next_step"]
            .as_str()
            .is_some_and(|s| s.contains("receipt")),
        "{event}"
    );
    let transition = wait_event(&log, "record.transition", SETTLE, |e| {
        e["to"] == "recovery_required"
    });
    assert_eq!(transition["from"], "launching", "{transition}");
    assert_eq!(transition["run"], run.as_str());
    sigterm(&worker);
    let _ = wait_exit(&mut worker, SETTLE);
}

fn write_private(path: &Path, bytes: &[u8]) {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .unwrap();
    file.write_all(bytes).unwrap();
}

/// A state root whose file system fills while the Worker runs: the failed write is a
/// `storage.fault` naming the operation and ENOSPC (the issue measured silence here), and once
/// space is back the Run goes through.
#[test]
fn a_record_write_that_fails_with_enospc_while_running_is_a_named_event() {
    let mut world = World::new();
    let mount = world.dir.path().join("small");
    let Some(_unmount) = e2e_common::small_tmpfs(&mount, "1m") else {
        return;
    };
    let root = mount.join("state");
    let old_root = format!("root = \"{}\"", world.root().display());
    world.edit_config(&old_root, &format!("root = \"{}\"", root.display()));
    let log = world.dir.path().join("worker.log");
    let mut worker = KillOnDrop(world.spawn_with_args(JSON, &[], &log));
    wait_event(&log, "reconciliation.done", SETTLE, |_| true);
    // Fill the file system to the last byte, then offer a Run.
    let filler = mount.join("filler");
    e2e_common::fill(&filler);
    let quick = RevisionBuilder::shell("true").build().unwrap();
    let run = world.cp.enqueue_run(RunSpec::numbered(1, quick)).unwrap();
    let fault = wait_event(&log, "storage.fault", SETTLE, |_| true);
    // A write that changed nothing and is retried is a warning; one that halts, an error.
    let halting = fault["halting"].as_bool().unwrap();
    assert_eq!(
        fault["level"],
        if halting { "error" } else { "warn" },
        "{fault}"
    );
    let error = fault["error"].as_str().unwrap_or_default();
    assert!(error.contains("No space left on device"), "{fault}");
    assert!(
        fault["operation"].as_str().is_some_and(|o| !o.is_empty()),
        "the fault names what was being written: {fault}"
    );
    std::fs::remove_file(&filler).unwrap();
    match worker.try_wait().unwrap() {
        // Still running: once space is back the Run goes through.
        None => {
            world.wait_for("the Run completed", Duration::from_secs(90), |w| {
                w.state_of(&run) == Some(State::CompletionAcknowledged)
            });
            sigterm(&worker);
            assert_eq!(
                wait_exit(&mut worker, SETTLE).code(),
                Some(0),
                "{}",
                read(&log)
            );
        }
        // Stopped: the documented exit 3, with the fault as its message.
        Some(status) => {
            assert_eq!(status.code(), Some(3), "{}", read(&log));
            let stopped = &events_named(&log, "worker.stopped")[0];
            assert!(
                stopped["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("No space left on device")),
                "{stopped}"
            );
        }
    }
}

/// One Run through a Worker started with `args`; its events.
fn one_run_with(world: &World, args: &[&str], n: u32) -> Vec<serde_json::Value> {
    let log = world.dir.path().join(format!("worker-{n}.log"));
    let mut worker = KillOnDrop(world.spawn_with_args(args, &[], &log));
    let quick = RevisionBuilder::shell("true").build().unwrap();
    let run = world.cp.enqueue_run(RunSpec::numbered(n, quick)).unwrap();
    world.wait_for("the Run completed", SETTLE, |w| {
        w.state_of(&run) == Some(State::CompletionAcknowledged)
    });
    sigterm(&worker);
    assert_eq!(wait_exit(&mut worker, SETTLE).code(), Some(0));
    events(&log)
}

/// `--log-level warn` drops info and debug events; `debug` adds the pending-claim steps.
#[test]
fn log_level_drops_what_is_below_it() {
    let world = World::new();
    let quiet = one_run_with(&world, &["--log-format", "json", "--log-level", "warn"], 1);
    assert!(
        quiet
            .iter()
            .all(|e| e["level"] == "warn" || e["level"] == "error"),
        "{quiet:?}"
    );
    let loud = one_run_with(&world, &["--log-format", "json", "--log-level", "debug"], 2);
    for name in ["claim.persisted", "record.transition", "worker.stopped"] {
        assert!(
            loud.iter().any(|e| e["event"] == name),
            "{name} at debug: {loud:?}"
        );
    }
}
