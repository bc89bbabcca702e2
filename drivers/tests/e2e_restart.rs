//! Restart scenarios with real processes (reference §4.8): the Worker is SIGKILLed while a Run's
//! record is durably in each state, then restarted. The user command appends one line to a
//! marker file; after every scenario the marker holds at most one line, and the Run ends the way
//! the restart table says.
//!
//! The Worker is stopped in a state deterministically with the crash-test hook
//! `QL_WORKER_FAULT_STALL_AFTER=<state>`: after persisting the first record in that state it
//! never answers again, so the kill lands with exactly that record on disk.

mod e2e_common;

use std::path::Path;
use std::time::Duration;

use e2e_common::{World, kill9, marker_lines, sigterm, wait_exit};
use ql_worker::test_hooks::STALL_HOOK_ENV;
use ql_worker_core::ids::RunId;
use ql_worker_core::record::{RecoveryReason, State};
use ql_worker_tests::control_plane::{RevisionBuilder, RunSpec};

const SETTLE: Duration = Duration::from_secs(60);

fn enqueue(world: &World, marker: &Path, sleep_s: f64) -> RunId {
    let command = format!("echo ran >> {}; sleep {sleep_s}", marker.display());
    let revision = RevisionBuilder::shell(&command).build().unwrap();
    world
        .cp
        .enqueue_run(RunSpec::numbered(1, revision))
        .unwrap()
}

/// Kills the Worker while the Run's record is durably `state`, restarts it, and returns the
/// world and the restarted Worker for the scenario's own checks.
fn kill_in(state: State, sleep_s: f64) -> (World, RunId, std::path::PathBuf, std::process::Child) {
    let world = World::new();
    let marker = world.dir.path().join("marker");
    let run = enqueue(&world, &marker, sleep_s);
    let mut first = world.spawn_hooked_worker(&[(STALL_HOOK_ENV, state.as_str())]);
    world.wait_for(&format!("the record durably {state}"), SETTLE, |w| {
        w.state_of(&run) == Some(state)
    });
    kill9(&mut first);
    let second = world.spawn_worker(&[]);
    (world, run, marker, second)
}

fn finish(world: &World, worker: &mut std::process::Child, drain: bool) {
    sigterm(worker);
    if !drain {
        std::thread::sleep(Duration::from_millis(200));
        sigterm(worker);
    }
    let status = wait_exit(worker, Duration::from_secs(30));
    if drain {
        assert_eq!(status.code(), Some(0), "drained");
    }
    let _ = world;
}

fn settles_once(state: State, sleep_s: f64) {
    let (world, run, marker, mut worker) = kill_in(state, sleep_s);
    world.wait_for("the Run completed at the control plane", SETTLE, |w| {
        w.completed_at_cp(&run)
    });
    world.wait_for("completion_acknowledged", SETTLE, |w| {
        w.state_of(&run) == Some(State::CompletionAcknowledged)
    });
    finish(&world, &mut worker, true);
    assert_eq!(
        marker_lines(&marker),
        1,
        "the user command ran exactly once"
    );
    let facts = world.cp.run(&run).unwrap().completion.unwrap();
    assert_eq!(facts.result.exit_code, 0);
}

#[test]
fn restart_in_accepted_replays_the_starting_ack_and_runs_once() {
    settles_once(State::Accepted, 0.0);
}

#[test]
fn restart_in_starting_acknowledged_replays_the_ack_and_launches_once() {
    settles_once(State::StartingAcknowledged, 0.0);
}

#[test]
fn restart_in_launching_never_respawns_and_records_launch_outcome_unknown() {
    let (world, run, marker, mut worker) = kill_in(State::Launching, 0.0);
    world.wait_for("recovery_required", SETTLE, |w| {
        w.state_of(&run) == Some(State::RecoveryRequired)
    });
    let record = world.records().remove(&run).unwrap();
    assert_eq!(
        record.recovery_reason,
        Some(RecoveryReason::LaunchOutcomeUnknown)
    );
    // The hook stalled before the spawn: nothing ran, and nothing ever will from this record.
    std::thread::sleep(Duration::from_millis(500));
    finish(&world, &mut worker, false);
    assert_eq!(marker_lines(&marker), 0, "never respawned");
    assert!(world.cp.run(&run).unwrap().completion.is_none());
}

#[test]
fn restart_in_started_only_replays_the_running_ack() {
    settles_once(State::Started, 1.0);
}

#[test]
fn restart_in_running_acknowledged_supervises_and_completes_once() {
    settles_once(State::RunningAcknowledged, 1.0);
}
