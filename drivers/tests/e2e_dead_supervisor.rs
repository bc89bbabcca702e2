//! Issue 16, item 6, with the real binary: a Run whose supervisor and user process were
//! SIGKILLed (no receipt can come), or whose receipt's place was taken by a garbled file before
//! the supervisor could publish (no receipt that authenticates can come), is no longer renewed. The Worker records
//! `recovery_required(lease_lost_local_execution_stopped)` (event `run.supervisor_gone`),
//! `ql-worker recover` lists it, its lease stops moving, and a drain ends at once — exit 4,
//! because recovery evidence remains for the operator (docs/operations.md, "Exit codes") —
//! instead of waiting for a Run that holds nothing. Both while the Worker that started the
//! supervisor runs, and after a Worker restart (the supervisor was the previous incarnation's).
//!
//! ```sh
//! cargo test --release -p ql-worker --test e2e_dead_supervisor
//! ```

mod e2e_common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e_common::evidence::run_cli;
use e2e_common::process::{
    drain_ends_at_once, exists, kill_supervisor_and_run, parent_of, user_pid,
};
use e2e_common::{KillOnDrop, World, kill9, wait_event};
use ql_worker_core::ids::RunId;
use ql_worker_core::record::{RecoveryReason, State};
use ql_worker_tests::control_plane::{RevisionBuilder, RunSpec};

const SETTLE: Duration = Duration::from_secs(60);
const JSON: &[&str] = &["--log-format", "json"];

/// A Run whose user command writes its pid, then runs `rest` (shell).
fn run_of(world: &World, rest: &str) -> (RunId, PathBuf) {
    let pid_file = world.dir.path().join("user.pid");
    let script = format!("echo $$ > {}; {rest}", pid_file.display());
    let revision = RevisionBuilder::shell(&script).build().unwrap();
    let run = world
        .cp
        .enqueue_run(RunSpec::numbered(1, revision))
        .unwrap();
    (run, pid_file)
}

/// A Worker (JSON event log) running one slow Run.
fn running() -> (World, RunId, PathBuf, PathBuf, KillOnDrop) {
    running_with(World::new(), "exec sleep 120")
}

/// A Worker (JSON event log) running the Run of [`run_of`]`(world, rest)`.
fn running_with(world: World, rest: &str) -> (World, RunId, PathBuf, PathBuf, KillOnDrop) {
    let (run, pid_file) = run_of(&world, rest);
    let log = world.dir.path().join("worker.log");
    let worker = KillOnDrop(world.spawn_with_args(JSON, &[], &log));
    world.wait_for("the Run running", SETTLE, |w| {
        w.state_of(&run) == Some(State::RunningAcknowledged)
    });
    (world, run, pid_file, log, worker)
}

/// The record is recorded, stays put (no renewal writes it any more), `recover` lists it, and a
/// drain ends at once with exit 4.
fn check_recorded_and_drain(world: &World, run: &RunId, worker: &mut KillOnDrop, log: &Path) {
    world.wait_for("the Run recorded as gone", SETTLE, |w| {
        w.state_of(run) == Some(State::RecoveryRequired)
    });
    let record = &world.records()[run];
    assert_eq!(
        record.recovery_reason,
        Some(RecoveryReason::LeaseLostLocalExecutionStopped)
    );
    // The event follows the durable write.
    let offer = record.offer.offer_id.as_str().to_owned();
    wait_event(log, "run.supervisor_gone", SETTLE, |e| {
        e["offer"] == offer.as_str()
    });
    // Several lease-control cadences (100 ms here): nothing renews the lease any more.
    std::thread::sleep(Duration::from_millis(1_500));
    let later = &world.records()[run];
    assert_eq!(
        later.revision, record.revision,
        "the record was written again"
    );
    assert_eq!(later.offer.lease.version, record.offer.lease.version);

    let root = world.root().to_str().unwrap().to_owned();
    let (code, text) = run_cli(&["recover", "--root", &root, "--json"]);
    assert_eq!(code, Some(6), "{text}");
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let listed = json["recoveryRequired"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{json}");
    assert_eq!(
        listed[0]["reason"], "lease_lost_local_execution_stopped",
        "{json}"
    );

    drain_ends_at_once(&world.config_path, &mut worker.0, log);
}

#[test]
fn a_run_whose_supervisor_and_process_were_killed_is_recorded_and_no_longer_renewed() {
    let (world, run, pid_file, log, mut worker) = running();
    kill_supervisor_and_run(user_pid(&pid_file));
    check_recorded_and_drain(&world, &run, &mut worker, &log);
}

#[test]
fn after_a_restart_a_run_whose_supervisor_and_process_died_is_recorded() {
    let (world, run, pid_file, log, mut first) = running();
    // The Worker dies first: the supervisor is no child of the next incarnation.
    kill9(&mut first.0);
    kill_supervisor_and_run(user_pid(&pid_file));
    let mut second = KillOnDrop(world.spawn_with_args(JSON, &[], &log));
    check_recorded_and_drain(&world, &run, &mut second, &log);
}

/// Another local writer put a garbled file where the Run's receipt goes, before the user
/// process ended. The supervisor publishes its receipt only where none exists, so the genuine
/// one never lands; once the supervisor and the process are gone, the Worker records the Run as
/// gone instead of renewing it for ever (found by the walks over the model checks' world).
#[test]
fn a_run_whose_receipt_place_was_taken_by_a_garbled_file_is_recorded_and_no_longer_renewed() {
    let world = World::new();
    let go = world.dir.path().join("go");
    let rest = format!(
        "while [ ! -e {} ]; do sleep 0.05; done; exit 0",
        go.display()
    );
    let (world, run, pid_file, log, mut worker) = running_with(world, &rest);
    let user = user_pid(&pid_file);
    let supervisor = parent_of(user);
    let attempt = world.records()[&run].offer.candidate.attempt_id.clone();
    let receipt = ql_worker::layout::Paths::new(world.root()).receipt(&attempt);
    std::fs::write(&receipt, b"not a receipt").unwrap();
    std::fs::write(&go, b"").unwrap();
    let start = Instant::now();
    while exists(user) || exists(supervisor) {
        assert!(start.elapsed() < SETTLE, "the Run's processes did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
    check_recorded_and_drain(&world, &run, &mut worker, &log);
    assert_eq!(
        std::fs::read(&receipt).unwrap(),
        b"not a receipt",
        "the garbled file is kept as evidence"
    );
}
