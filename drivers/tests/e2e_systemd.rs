//! systemd readiness and metrics with the real binary (issue 18, Deliver 2 and 3).
//!
//! * `NOTIFY_SOCKET` is a real Unix datagram socket bound by the test: the Worker sends
//!   `READY=1` once startup reconciliation is done (after the `reconciliation.done` event),
//!   `STATUS=` lines, `WATCHDOG=1` while `WATCHDOG_USEC` is set, and `STOPPING=1` when the drain
//!   begins — in that order, each once where it must be once.
//! * The metrics file is parsed with the Prometheus project's own Python parser
//!   (`prometheus_client.parser`, installed from PyPI into the test's target directory when it
//!   is not importable), and so is the text served by the loopback listener.

mod e2e_common;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use e2e_common::{KillOnDrop, World, events_named, sigterm, wait_event, wait_exit};
use ql_worker_core::record::State;
use ql_worker_tests::control_plane::{RevisionBuilder, RunSpec};

const SETTLE: Duration = Duration::from_secs(60);
const JSON: &[&str] = &["--log-format", "json"];
/// The parser's version, pinned.
const PROMETHEUS_CLIENT: &str = "prometheus-client==0.21.1";

/// Where `prometheus_client` can be imported from (installed there on first use).
fn python_path() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pydeps");
    let importable = |dir: &Path| {
        Command::new("python3")
            .args(["-c", "import prometheus_client.parser"])
            .env("PYTHONPATH", dir)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if !importable(&dir) {
        let out = Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
                "--no-input",
                "--upgrade",
                "--target",
            ])
            .arg(&dir)
            .arg(PROMETHEUS_CLIENT)
            .output()
            .expect("python3 runs");
        assert!(
            out.status.success(),
            "pip install {PROMETHEUS_CLIENT}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            importable(&dir),
            "prometheus_client importable after install"
        );
    }
    dir
}

/// Parses exposition text with `prometheus_client.parser.text_string_to_metric_families` and
/// returns `{family: {"type": …, "samples": [[name, labels, value], …]}}`.
fn parse(text: &str) -> serde_json::Value {
    let script = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for family in text_string_to_metric_families(sys.stdin.read()):
    out[family.name] = {
        "type": family.type,
        "samples": [[s.name, s.labels, s.value] for s in family.samples],
    }
print(json.dumps(out))
"#;
    let mut child = Command::new("python3")
        .args(["-c", script])
        .env("PYTHONPATH", python_path())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "the Prometheus parser refused the text: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The value of the sample `name` with exactly these labels.
fn sample(families: &serde_json::Value, family: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    let samples = families[family]["samples"]
        .as_array()
        .unwrap_or_else(|| panic!("no family {family}: {families}"));
    samples
        .iter()
        .find(|s| {
            s[0] == name
                && s[1].as_object().is_some_and(|l| {
                    l.len() == labels.len() && labels.iter().all(|(k, v)| l[*k] == *v)
                })
        })
        .unwrap_or_else(|| panic!("no sample {name}{labels:?} in {}", families[family]))[2]
        .as_f64()
        .unwrap()
}

/// Reads every datagram as it arrives (as systemd does), until the socket is shut down.
fn collect(socket: UnixDatagram) -> std::thread::JoinHandle<Vec<String>> {
    std::thread::spawn(move || {
        socket
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(120) {
            match socket.recv(&mut buf) {
                Ok(n) => {
                    let text = String::from_utf8_lossy(&buf[..n]).into_owned();
                    let last = text == "QUIT";
                    out.push(text);
                    if last {
                        break;
                    }
                }
                Err(_) => continue,
            }
        }
        out
    })
}

#[test]
fn sd_notify_sequence_and_metrics_parsed_by_prometheus() {
    let mut world = World::new();
    let metrics_file = world.dir.path().join("ql-worker.prom");
    world.append_config(&format!(
        "\n[metrics]\ntextfile = \"{}\"\ninterval_ms = 1000\nlisten = \"127.0.0.1:0\"\n",
        metrics_file.display()
    ));
    let socket_path = world.dir.path().join("notify.sock");
    let collector = collect(UnixDatagram::bind(&socket_path).unwrap());
    let log = world.dir.path().join("worker.log");
    let mut worker = KillOnDrop(world.spawn_with_args(
        JSON,
        &[
            ("NOTIFY_SOCKET", socket_path.to_str().unwrap()),
            ("WATCHDOG_USEC", "400000"),
        ],
        &log,
    ));
    wait_event(&log, "reconciliation.done", SETTLE, |_| true);
    let started = &events_named(&log, "worker.started")[0];
    let listen = started["metrics_listen"].as_str().unwrap().to_owned();
    let quick = RevisionBuilder::shell("echo metrics").build().unwrap();
    let run = world.cp.enqueue_run(RunSpec::numbered(1, quick)).unwrap();
    world.wait_for("the Run completed", SETTLE, |w| {
        w.state_of(&run) == Some(State::CompletionAcknowledged)
    });

    // The metrics file, once it shows the completed Run.
    let start = Instant::now();
    let families = loop {
        let text = std::fs::read_to_string(&metrics_file).unwrap_or_default();
        if !text.is_empty() {
            let families = parse(&text);
            if sample(
                &families,
                "ql_worker_runs",
                "ql_worker_runs_total",
                &[("outcome", "completed")],
            ) >= 1.0
            {
                break families;
            }
        }
        assert!(start.elapsed() < SETTLE, "the metrics file shows no Run");
        std::thread::sleep(Duration::from_millis(100));
    };
    let mode = std::fs::metadata(&metrics_file).unwrap().permissions();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
        0o644,
        "readable by the collector"
    );
    assert_eq!(families["ql_worker_runs"]["type"], "counter");
    assert_eq!(families["ql_worker_fsync_seconds"]["type"], "histogram");
    assert_eq!(families["ql_worker_records"]["type"], "gauge");
    assert!(
        sample(
            &families,
            "ql_worker_calls",
            "ql_worker_calls_total",
            &[("operation", "completion"), ("result", "ok")]
        ) >= 1.0
    );
    assert!(
        sample(
            &families,
            "ql_worker_calls",
            "ql_worker_calls_total",
            &[("operation", "register"), ("result", "ok")]
        ) >= 1.0
    );
    assert!(
        sample(
            &families,
            "ql_worker_records",
            "ql_worker_records",
            &[("state", "completion_acknowledged")]
        ) >= 1.0
    );
    assert_eq!(
        sample(
            &families,
            "ql_worker_session_status",
            "ql_worker_session_status",
            &[("status", "online")]
        ),
        1.0
    );
    let since = sample(
        &families,
        "ql_worker_seconds_since_last_heartbeat",
        "ql_worker_seconds_since_last_heartbeat",
        &[],
    );
    assert!((0.0..30.0).contains(&since), "{since}");
    assert!(
        sample(
            &families,
            "ql_worker_fsync_seconds",
            "ql_worker_fsync_seconds_count",
            &[]
        ) >= 5.0,
        "every durable write of a lifecycle fsyncs"
    );
    assert!(
        sample(
            &families,
            "ql_worker_upload_bytes",
            "ql_worker_upload_bytes_total",
            &[]
        ) >= 8.0
    );
    assert!(
        sample(
            &families,
            "ql_worker_uploads",
            "ql_worker_uploads_total",
            &[]
        ) >= 1.0
    );
    assert!(
        sample(
            &families,
            "ql_worker_upload_seconds",
            "ql_worker_upload_seconds_total",
            &[]
        ) > 0.0
    );

    // The same text from the loopback listener.
    let served = http_get(&listen);
    let (head, body) = served.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.0 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    let served = parse(body);
    assert!(served["ql_worker_runs"].is_object());

    sigterm(&worker);
    wait_event(&log, "worker.stopped", Duration::from_secs(30), |_| true);
    assert_eq!(wait_exit(&mut worker, SETTLE).code(), Some(0));
    UnixDatagram::unbound()
        .unwrap()
        .send_to(b"QUIT", &socket_path)
        .unwrap();
    let mut messages = collector.join().unwrap();
    assert_eq!(messages.pop().as_deref(), Some("QUIT"));
    let ready: Vec<usize> = positions(&messages, |m| m.starts_with("READY=1"));
    let stopping: Vec<usize> = positions(&messages, |m| m.starts_with("STOPPING=1"));
    assert_eq!(ready.len(), 1, "{messages:#?}");
    assert_eq!(stopping.len(), 1, "{messages:#?}");
    assert!(ready[0] < stopping[0], "{messages:#?}");
    assert!(
        messages[ready[0]].contains("\nSTATUS=online"),
        "{messages:#?}"
    );
    assert!(
        messages[stopping[0]].contains("STATUS=draining"),
        "{messages:#?}"
    );
    assert!(
        messages.iter().filter(|m| *m == "WATCHDOG=1").count() >= 2,
        "{messages:#?}"
    );
    assert!(
        messages.iter().any(|m| m.starts_with("STATUS=")),
        "{messages:#?}"
    );
    // The listener's socket is closed with the Worker.
    assert!(std::net::TcpStream::connect(&listen).is_err());
}

fn positions(messages: &[String], f: impl Fn(&str) -> bool) -> Vec<usize> {
    messages
        .iter()
        .enumerate()
        .filter(|(_, m)| f(m))
        .map(|(i, _)| i)
        .collect()
}

fn http_get(address: &str) -> String {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(address).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nhost: x\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

#[test]
fn no_metrics_file_and_no_socket_by_default() {
    let world = World::new();
    let log = world.dir.path().join("worker.log");
    let mut worker = KillOnDrop(world.spawn_with_args(JSON, &[], &log));
    wait_event(&log, "reconciliation.done", SETTLE, |_| true);
    let started = &events_named(&log, "worker.started")[0];
    assert!(started.get("metrics_listen").is_none(), "{started}");
    // No TCP listener of the Worker's (its /proc entry lists only its descriptors).
    let pid = worker.id();
    let sockets = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_link(e.path()).is_ok_and(|t| t.to_string_lossy().starts_with("socket:"))
        })
        .count();
    // The kept-alive HTTPS connections (one per call made at the same time: the register, a
    // heartbeat and a Pull at most so far), the call threads' wake-up socketpair and the signal
    // pipe's socketpair at most; none of them listens (below).
    assert!(sockets <= 7, "{sockets} sockets");
    let listening = std::fs::read_to_string("/proc/net/tcp").unwrap();
    let listen_inodes: Vec<String> = listening
        .lines()
        .skip(1)
        .filter(|l| l.split_whitespace().nth(3) == Some("0A"))
        .filter_map(|l| l.split_whitespace().nth(9).map(str::to_owned))
        .collect();
    for entry in std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
    {
        let target = std::fs::read_link(entry.path()).unwrap_or_default();
        let target = target.to_string_lossy();
        for inode in &listen_inodes {
            assert_ne!(
                target,
                format!("socket:[{inode}]"),
                "the Worker listens on nothing by default"
            );
        }
    }
    sigterm(&worker);
    assert_eq!(wait_exit(&mut worker, SETTLE).code(), Some(0));
}
