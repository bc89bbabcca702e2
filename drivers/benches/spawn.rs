//! Supervisor spawn-to-receipt of `/bin/true` against a bare `std::process::Command`
//! spawn-and-wait, in the same run. `cargo bench -p ql-worker --bench spawn`; `QL_BENCH_RUNS`
//! sets the run count (default 100, at most 1000).
//!
//! The supervised path measures, per run: `SupervisorExecutor::start` (supervisor exec from the
//! image fd, plan over the pipe, barrier re-read, log open, spawn, identity, report) until the
//! receipt is published (capture drained, log fsynced, fact and receipt each published with
//! temp + fsync + link + dir fsync). Record and log setup is not timed.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ql_worker::journal::Journal;
use ql_worker::layout::Paths;
use ql_worker::spool::{self, SpoolPolicy};
use ql_worker::supervisor::{
    Capability, Executor as _, ExecutorOutcome, Launch, SupervisorExecutor, SupervisorImage,
};
use ql_worker_core::ids::{CallbackSequence, LogArtifactId, Revision};
use ql_worker_core::listing::Capacity;
use ql_worker_core::record::{InboxRecord, State};
use ql_worker_core::revision::ExecCommand;
use ql_worker_core::time::UnixMillis;
use ql_worker_sim::testkit;

const CLEAN_ENV: &str = "QL_BENCH_CLEAN";
const CLOSE_STRAYS_AND_EXEC: &str = r#"for fd in /proc/$$/fd/*; do n=${fd##*/}; if [ "$n" -gt 2 ]; then eval "exec $n>&-" 2>/dev/null; fi; done; exec "$@""#;

fn now_ms() -> UnixMillis {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_millis();
    UnixMillis::new(u64::try_from(ms).expect("fits")).expect("safe")
}

fn capability(n: u32) -> [u8; 32] {
    let mut bytes = [0u8; 32];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (n as u8) ^ (i as u8).wrapping_mul(13);
    }
    bytes
}

/// Puts offer `n` into `launching` and allocates its log; returns the matching launch.
fn prepare(journal: &mut Journal, root: &Path, n: u32) -> Launch {
    let log_id = LogArtifactId::new(format!("wlog-{n:030x}")).expect("log id");
    let started = UnixMillis::new(now_ms().get() - 1).expect("start");
    let accepted = InboxRecord::accepted(testkit::offer(n), UnixMillis::new(100).expect("t"));
    journal.publish_record(&accepted).expect("publish");
    let mut ack = accepted.clone();
    ack.revision = Revision::new(1).expect("rev");
    ack.state = State::StartingAcknowledged;
    ack.updated_at_ms = UnixMillis::new(200).expect("t");
    let offer_id = ack.offer.offer_id.clone();
    journal
        .replace_record(&offer_id, &ack, Revision::new(0).expect("rev"))
        .expect("ack");
    let mut launching = ack;
    launching.revision = Revision::new(2).expect("rev");
    launching.state = State::Launching;
    launching.updated_at_ms = started;
    launching.executor_started_at_ms = Some(started);
    launching.log_artifact_id = Some(log_id.clone());
    launching.completion_receipt_callback_sequence = Some(CallbackSequence::new(1).expect("seq"));
    launching.completion_receipt_token_digest =
        Some(Capability::from_bytes(capability(n)).digest());
    journal
        .replace_record(&offer_id, &launching, Revision::new(1).expect("rev"))
        .expect("launching");
    let policy = SpoolPolicy::custom(64 * 1024, 0, 1024 * 1024).expect("policy");
    spool::allocate(root, &log_id, policy).expect("allocate");
    Launch {
        offer_id,
        run_id: launching.offer.candidate.run_id.clone(),
        attempt_id: launching.offer.candidate.attempt_id.clone(),
        executor_started_at: started,
        command: ExecCommand::Argv {
            file: "/bin/true".into(),
            args: vec![],
        },
        environment: vec![],
        working_directory: None,
        timeout_ms: None,
        execution_deadline_at: None,
        log_artifact_id: log_id,
        log_quota_bytes: 64 * 1024,
        callback_sequence: CallbackSequence::new(1).expect("seq"),
        capability: Capability::from_bytes(capability(n)),
    }
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort_unstable();
    samples[samples.len() / 2]
}

fn main() {
    // `cargo bench` passes `--bench`; ignore arguments. Re-execute through bash when this process
    // holds inheritable descriptors (the supervisor refuses to leak them to the user).
    let stray =
        ql_worker::supervisor::inheritable_descriptors().map_or(true, |fds| !fds.is_empty());
    if stray && std::env::var_os(CLEAN_ENV).is_none() {
        let status = Command::new("/bin/bash")
            .arg("-c")
            .arg(CLOSE_STRAYS_AND_EXEC)
            .arg("bash")
            .arg(std::env::current_exe().expect("bench path"))
            .env(CLEAN_ENV, "1")
            .status()
            .expect("bash");
        std::process::exit(status.code().unwrap_or(1));
    }
    let runs: u32 = std::env::var("QL_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100)
        .clamp(1, 1000);
    let image_path = Path::new(env!("CARGO_BIN_EXE_ql-worker"));
    let dir = tempfile::Builder::new()
        .prefix("ql-bench-spawn-")
        .tempdir()
        .expect("tempdir");
    let root = dir.path().join("state");
    let mut journal =
        Journal::open(&root, Capacity::new(1024).expect("capacity")).expect("journal");
    let mut executor =
        SupervisorExecutor::new(SupervisorImage::open(image_path).expect("image"), &root);
    let paths = Paths::new(&root);

    // Warm-up: one of each (page cache, dynamic loader).
    let mut bare = Vec::with_capacity(runs as usize);
    let mut supervised = Vec::with_capacity(runs as usize);
    let mut reported = Vec::with_capacity(runs as usize);
    for n in 0..=runs {
        let t = Instant::now();
        let status = Command::new("/bin/true").status().expect("spawn /bin/true");
        let elapsed = t.elapsed();
        assert!(status.success());

        let launch = prepare(&mut journal, &root, n + 1);
        let receipt = paths.receipt(&launch.attempt_id);
        let t = Instant::now();
        let outcome = executor.start(launch);
        let report_elapsed = t.elapsed();
        assert!(
            matches!(outcome, ExecutorOutcome::Started { .. }),
            "{outcome:?}"
        );
        while !receipt.exists() {
            std::thread::sleep(Duration::from_micros(100));
            assert!(
                t.elapsed() < Duration::from_secs(30),
                "receipt never appeared"
            );
        }
        let supervised_elapsed = t.elapsed();
        if n > 0 {
            bare.push(elapsed);
            supervised.push(supervised_elapsed);
            reported.push(report_elapsed);
        }
        executor.reap_exited();
    }
    let bare_median = median(&mut bare);
    let supervised_median = median(&mut supervised);
    let reported_median = median(&mut reported);
    let ratio = supervised_median.as_secs_f64() / bare_median.as_secs_f64();
    println!("runs per path: {runs}");
    println!("bare Command spawn+wait /bin/true:     median {bare_median:?}");
    println!("supervisor start() returns Started:    median {reported_median:?}");
    println!("supervisor spawn-to-receipt /bin/true: median {supervised_median:?}");
    println!("ratio (supervised / bare): {ratio:.1}x");
}
