//! The secret scan after the demo (issue 10, item 4; the crash campaign runs the same scan after
//! its kills, in `crash_campaign.rs`).
//!
//! A black-box test cannot see a completion capability, except where the product itself puts
//! it: the receipt the supervisor writes when the user process exits, which lives until the
//! completion is durably acknowledged. The scan collects capabilities from receipts while Runs
//! are unfinished, then asserts that after settlement neither their base64url text nor their
//! 32 raw bytes, nor any Secret value, appears in any file (state root, spool, receipts,
//! archive, configuration, captured output), in the stored artifacts, or in the argv or
//! environment of the Worker and its supervisors, sampled from `/proc` while Runs were live.
//! A user process's environment legitimately holds its own Secret values; its argv must not.
//! The Worker's event log (JSON, every level) and every metrics text it wrote while the Runs
//! were live are scanned too, also for every lease token the Worker sent.

mod e2e_common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use e2e_common::evidence::{
    Needles, ProcSnapshot, Role, capability_bytes, harvest_receipts, scan_tree, snapshot_processes,
};
use e2e_common::{KillOnDrop, World, sigterm, wait_exit};
use ql_worker_core::ids::AttemptId;
use ql_worker_core::record::State;
use ql_worker_tests::control_plane::Fault;

/// The demo's Secret value (`drivers/src/demo.rs`, `SECRET_VALUE`).
const DEMO_SECRET: &str = "s3cr3t-demo-value-7f3a";
/// Environment variable the demo's Secret Run receives it in.
const DEMO_SECRET_ENV: &str = "DEMO_TOKEN";

/// What one scan saw and found.
struct Findings {
    files: usize,
    bytes: u64,
    hits: Vec<String>,
}

/// Needles: the Secret value and every capability, as text and as raw bytes.
fn needles(tokens: &BTreeMap<AttemptId, String>) -> Needles {
    let mut needles = Needles::default();
    needles.add("the demo Secret value", DEMO_SECRET.as_bytes());
    for (attempt, token) in tokens {
        needles.add(
            format!("capability of {attempt} (base64url)"),
            token.as_bytes(),
        );
        needles.add(
            format!("capability of {attempt} (raw)"),
            &capability_bytes(token),
        );
    }
    needles
}

/// Every `leaseToken` string in the JSON request bodies the control plane received.
fn lease_tokens(world: &World) -> Vec<String> {
    fn walk(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    match value {
                        serde_json::Value::String(token) if key == "leaseToken" => {
                            if !out.contains(token) {
                                out.push(token.clone());
                            }
                        }
                        other => walk(other, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            _ => {}
        }
    }
    let mut out = Vec::new();
    for record in world.cp.http_records() {
        if let Ok(value) = serde_json::from_slice::<serde_json::Value>(&record.body) {
            walk(&value, &mut out);
        }
    }
    out
}

/// Scans `dirs` (every file) and the process views; index 0 is the Secret value.
fn scan(dirs: &[&Path], procs: &[ProcSnapshot], needles: &Needles) -> Findings {
    let mut findings = Findings {
        files: 0,
        bytes: 0,
        hits: Vec::new(),
    };
    for dir in dirs {
        let tree = scan_tree(dir, needles);
        findings.files += tree.files;
        findings.bytes += tree.bytes;
        for (path, n) in tree.hits {
            findings
                .hits
                .push(format!("{} in {}", needles.label(n), path.display()));
        }
    }
    for p in procs {
        for n in needles.find(&p.cmdline) {
            findings.hits.push(format!(
                "{} in the argv of a {} process",
                needles.label(n),
                p.role.as_str()
            ));
        }
        let own_secret = p.role == Role::User && p.env(DEMO_SECRET_ENV).is_some();
        for n in needles.find(&p.environ) {
            if !(n == 0 && own_secret) {
                findings.hits.push(format!(
                    "{} in the environment of a {} process",
                    needles.label(n),
                    p.role.as_str()
                ));
            }
        }
    }
    findings
}

fn count(procs: &[ProcSnapshot], role: Role) -> usize {
    procs.iter().filter(|p| p.role == role).count()
}

/// Samples processes (distinct snapshots only) and harvests receipts until `done`.
struct Sampler {
    binary: std::path::PathBuf,
    procs: Vec<ProcSnapshot>,
    tokens: BTreeMap<AttemptId, String>,
    polls: u64,
}

impl Sampler {
    fn new() -> Self {
        Self {
            binary: env!("CARGO_BIN_EXE_ql-worker").into(),
            procs: Vec::new(),
            tokens: BTreeMap::new(),
            polls: 0,
        }
    }

    fn poll(&mut self, root: &Path, worker: u32) {
        self.polls += 1;
        for (attempt, token) in harvest_receipts(root) {
            self.tokens.entry(attempt).or_insert(token);
        }
        if self.polls.is_multiple_of(10) {
            for snapshot in snapshot_processes(Some(worker), &self.binary) {
                if !self.procs.contains(&snapshot) {
                    self.procs.push(snapshot);
                }
            }
        }
    }
}

/// The demo's five Runs with the real `ql-worker run` binary against the loopback control
/// plane. The artifact uploads are slowed (1 s each, two per Run) so every receipt stays on disk
/// long enough to be read: all five capabilities are collected.
#[test]
fn after_the_demo_runs_no_secret_or_capability_is_on_disk_or_in_a_process_view() {
    let mut world = World::new();
    // The event log at its most talkative (every level, other crates' records included) and
    // the metrics file are scanned too (issue 18): the log file and the metrics file are in
    // the scanned directory, and every distinct metrics text seen while Runs were live is kept.
    let metrics_file = world.dir.path().join("ql-worker.prom");
    world.append_config(&format!(
        "\n[metrics]\ntextfile = \"{}\"\ninterval_ms = 1000\n",
        metrics_file.display()
    ));
    let log = world.dir.path().join("worker-stderr.log");
    let mut worker = KillOnDrop(world.spawn_with_args(
        &["--log-format", "json", "--log-level", "trace"],
        &[],
        &log,
    ));
    world.wait_for("the Session registered", Duration::from_secs(30), |w| {
        w.cp.session(w.cp.worker_id()).is_some()
    });
    let session = world.cp.session(world.cp.worker_id()).unwrap();
    let artifacts = format!(
        "/api/v3/worker-ingress/workers/{}/sessions/{}/artifacts",
        world.cp.worker_id(),
        session.session_id
    );
    let expected = ql_worker::demo::enqueue_samples(&world.cp).unwrap();
    // Two slowed uploads per Run: an upload sent again (fenced by a renewal beside it, say)
    // must not leave a later Run's receipt too short-lived for the sampler, whose poll of
    // every process can itself take hundreds of milliseconds on a loaded machine.
    for _ in 0..2 * expected.len() {
        world
            .cp
            .inject_for(&artifacts, Fault::Slow(Duration::from_millis(1_000)));
    }
    let mut sampler = Sampler::new();
    let mut metrics_texts: Vec<String> = Vec::new();
    let start = Instant::now();
    loop {
        sampler.poll(world.root(), worker.id());
        if let Ok(text) = std::fs::read_to_string(&metrics_file)
            && !metrics_texts.contains(&text)
        {
            metrics_texts.push(text);
        }
        let records = world.records();
        if expected.iter().all(|e| {
            records
                .get(&e.run_id)
                .is_some_and(|r| r.state.is_terminal())
        }) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "the demo Runs did not settle"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    sigterm(&worker);
    assert_eq!(
        wait_exit(&mut worker, Duration::from_secs(30)).code(),
        Some(0)
    );
    for record in world.records().values() {
        assert_eq!(record.state, State::CompletionAcknowledged);
    }
    assert_eq!(
        sampler.tokens.len(),
        expected.len(),
        "a capability collected from every receipt"
    );
    assert!(
        count(&sampler.procs, Role::Worker) > 0
            && count(&sampler.procs, Role::Supervisor) > 0
            && count(&sampler.procs, Role::User) > 0,
        "the Worker, a supervisor and a user process were sampled"
    );

    // The scan looks for the value the demo really uses: its Secret Run printed the length.
    let secret_run = &expected
        .iter()
        .find(|e| e.name == "secret env")
        .unwrap()
        .run_id;
    let printed = format!("the secret has {} characters", DEMO_SECRET.len());
    assert!(
        world.cp.with_model(|m| m
            .artifacts_of(secret_run)
            .iter()
            .any(|(_, a)| String::from_utf8_lossy(&a.head).contains(&printed))),
        "DEMO_SECRET matches the demo's Secret value"
    );
    // The lease tokens the Worker itself sent (every leaseToken of its request bodies).
    let lease_tokens = lease_tokens(&world);
    assert!(
        lease_tokens.len() >= expected.len(),
        "a lease token of every Run: {}",
        lease_tokens.len()
    );
    let needles = needles(&sampler.tokens);
    // The inbox records hold the lease token by design (the Worker needs it after a restart;
    // `inbox show` redacts it): lease tokens are looked for in what an operator or a collector
    // reads, the event log and the metrics, together with everything above.
    let mut talk = needles.clone();
    for token in &lease_tokens {
        talk.add("a lease token", token.as_bytes());
    }
    let events = e2e_common::events(&log);
    assert!(
        events.iter().any(|e| e["event"] == "record.transition")
            && events.iter().any(|e| e["event"] == "upload.done")
            && events.iter().any(|e| e["level"] == "debug"),
        "the event log holds the Runs' events, debug included"
    );
    // The last metrics text (written at exit) counts every Run.
    let last = std::fs::read_to_string(&metrics_file).unwrap();
    if !metrics_texts.contains(&last) {
        metrics_texts.push(last.clone());
    }
    let ended: f64 = last
        .lines()
        .filter(|l| l.starts_with("ql_worker_runs_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(ended as usize, expected.len(), "{last}");
    assert!(
        metrics_texts.len() >= 2,
        "metrics texts sampled while Runs were live"
    );
    let mut findings = scan(&[world.dir.path()], &sampler.procs, &needles);
    for n in talk.find(&std::fs::read(&log).unwrap()) {
        findings
            .hits
            .push(format!("{} in the event log", talk.label(n)));
    }
    for (i, text) in metrics_texts.iter().enumerate() {
        for n in talk.find(text.as_bytes()) {
            findings
                .hits
                .push(format!("{} in metrics text {i}", talk.label(n)));
        }
    }
    println!(
        "secret-scan: event log {} events ({} bytes), {} metrics texts, {} lease tokens",
        events.len(),
        std::fs::metadata(&log).map_or(0, |m| m.len()),
        metrics_texts.len(),
        lease_tokens.len()
    );
    // The artifacts as the control plane stored them.
    world.cp.with_model(|m| {
        for (key, artifact) in &m.state().artifacts {
            for n in needles.find(&artifact.head) {
                findings.hits.push(format!(
                    "{} in the uploaded log of {}",
                    needles.label(n),
                    key.run_id
                ));
            }
        }
    });
    report("demo Runs (real binary)", &sampler, &findings);
}

/// `ql-worker demo --keep DIR` as a child process: everything it leaves (state root, spool,
/// configuration, certificates) and everything it printed holds no Secret value and no
/// capability seen in a receipt while it ran (collected best effort: the demo cannot be
/// slowed from outside).
#[test]
fn ql_worker_demo_keep_leaves_no_secret_or_capability() {
    let base = tempfile::tempdir().unwrap();
    let keep = base.path().join("demo");
    let output = base.path().join("output");
    std::fs::create_dir(&output).unwrap();
    let stdout = std::fs::File::create(output.join("stdout")).unwrap();
    let stderr = std::fs::File::create(output.join("stderr")).unwrap();
    let mut demo = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_ql-worker"))
            .arg("demo")
            .arg("--keep")
            .arg(&keep)
            .stdin(Stdio::null())
            .stdout(Stdio::from(stdout))
            .stderr(Stdio::from(stderr))
            .spawn()
            .unwrap(),
    );
    let root = keep.join("state");
    let mut sampler = Sampler::new();
    let start = Instant::now();
    let status = loop {
        if let Some(status) = demo.try_wait().unwrap() {
            break status;
        }
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the demo did not finish"
        );
        sampler.poll(&root, demo.id());
        std::thread::sleep(Duration::from_millis(2));
    };
    assert!(status.success(), "ql-worker demo failed: {status}");
    let needles = needles(&sampler.tokens);
    let findings = scan(&[&keep, &output], &sampler.procs, &needles);
    report("ql-worker demo --keep", &sampler, &findings);
}

/// The scanner finds what it looks for: a Secret value, a capability's text and its raw bytes,
/// anywhere in a file and across the 8-byte index boundary.
#[test]
fn the_scanner_finds_each_needle_in_files_and_process_views() {
    let token = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8";
    let raw = capability_bytes(token);
    assert_eq!(raw, (0u8..32).collect::<Vec<_>>());
    let tokens = BTreeMap::from([(AttemptId::new("attempt-9").unwrap(), token.to_owned())]);
    let needles = needles(&tokens);
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("sub")).unwrap();
    let junk = |inner: &[u8]| [b"xxxxxxx".as_slice(), inner, b"yyy"].concat();
    std::fs::write(dir.path().join("a"), junk(DEMO_SECRET.as_bytes())).unwrap();
    std::fs::write(dir.path().join("sub/b"), junk(token.as_bytes())).unwrap();
    std::fs::write(dir.path().join("sub/c"), junk(&raw)).unwrap();
    std::fs::write(dir.path().join("d"), b"nothing here").unwrap();
    let user = |env: &str| ProcSnapshot {
        role: Role::User,
        pid: 1,
        cmdline: b"/bin/sh\0-c\0echo hi\0".to_vec(),
        environ: env.as_bytes().to_vec(),
    };
    let procs = [
        // Its own Secret value in a user process's environment is legitimate …
        user(&format!("{DEMO_SECRET_ENV}={DEMO_SECRET}\0")),
        // … a capability is not, nor a Secret value in a supervisor's argv.
        user(&format!("X={token}\0")),
        ProcSnapshot {
            role: Role::Supervisor,
            pid: 2,
            cmdline: format!("ql-worker\0{DEMO_SECRET}\0").into_bytes(),
            environ: Vec::new(),
        },
    ];
    let findings = scan(&[dir.path()], &procs, &needles);
    assert_eq!(findings.files, 4);
    assert_eq!(findings.hits.len(), 5, "{:#?}", findings.hits);
}

/// Prints the scan's summary line and asserts it found nothing.
fn report(what: &str, sampler: &Sampler, findings: &Findings) {
    println!(
        "secret-scan: {what}: 1 Secret value, {} capabilities, {} files ({} bytes), {} process \
         snapshots ({} worker, {} supervisor, {} user): {} hits",
        sampler.tokens.len(),
        findings.files,
        findings.bytes,
        sampler.procs.len(),
        count(&sampler.procs, Role::Worker),
        count(&sampler.procs, Role::Supervisor),
        count(&sampler.procs, Role::User),
        findings.hits.len()
    );
    assert!(findings.hits.is_empty(), "{:#?}", findings.hits);
}
