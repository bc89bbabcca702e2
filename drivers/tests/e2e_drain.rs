//! Drains with the real binary (issue 18, "drains strand nothing"; issue 19 for the request
//! file).
//!
//! * When the drain budget ends with a Run still running, the Worker stops that Run by
//!   identity, completes it through the normal path (its receipt: exit 143, log uploaded, then
//!   completion), then sets the Session offline and exits 0 — it keeps ownership until every
//!   record is settled. The request file ends with the Worker that answered it, and the next
//!   start takes new work instead of draining again at once.
//! * A second signal stays the immediate stop (exit 4); the Run resumes at the next start.
//! * A drain with nothing in flight exits 0 at once (the budget is ten minutes here).

mod e2e_common;

use std::process::Command;
use std::time::Duration;

use e2e_common::{KillOnDrop, World, events_named, marker_lines, sigterm, wait_event, wait_exit};
use ql_worker::runtime::DRAIN_FILE;
use ql_worker_core::record::State;
use ql_worker_tests::control_plane::{RevisionBuilder, RunSpec};

const SETTLE: Duration = Duration::from_secs(60);
const JSON: &[&str] = &["--log-format", "json"];

#[test]
fn the_drain_budget_stops_the_runs_in_flight_and_completes_them_before_going_offline() {
    let mut world = World::new();
    world.edit_config("drain_budget_ms = 20000", "drain_budget_ms = 1000");
    let marker = world.dir.path().join("marker");
    let slow = RevisionBuilder::shell(&format!("echo ran >> {}; sleep 30", marker.display()))
        .build()
        .unwrap();
    let first_run = world.cp.enqueue_run(RunSpec::numbered(1, slow)).unwrap();
    let log = world.dir.path().join("worker.log");
    let mut worker = KillOnDrop(world.spawn_with_args(JSON, &[], &log));
    world.wait_for("the slow Run running", SETTLE, |w| {
        w.state_of(&first_run) == Some(State::RunningAcknowledged)
    });

    let drain = Command::new(env!("CARGO_BIN_EXE_ql-worker"))
        .args(["drain", "--config"])
        .arg(&world.config_path)
        .output()
        .unwrap();
    assert!(drain.status.success(), "{drain:?}");
    let file = world.root().join(DRAIN_FILE);
    assert!(file.exists(), "`ql-worker drain` writes {}", file.display());
    // The wait is the bound: the Run would otherwise sleep for 30 s.
    let status = wait_exit(&mut worker, Duration::from_secs(25));
    let text = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.code(), Some(0), "{text}");
    assert!(
        !file.exists(),
        "the drain request ended with the Worker that answered it"
    );
    // Stopped by identity, completed through the normal path, then offline.
    let ended = &events_named(&log, "drain.budget_ended")[0];
    assert_eq!(ended["in_flight"], 1, "{ended}");
    let stopped = &events_named(&log, "drain.run_stopped")[0];
    assert_eq!(stopped["stop"], "Stopped", "{stopped}");
    let run = world.cp.run(&first_run).unwrap();
    let completion = run
        .completion
        .as_ref()
        .expect("the stopped Run was completed");
    assert_eq!(
        completion.result.exit_code, 143,
        "SIGTERM from the stop: {completion:?}"
    );
    assert_eq!(
        world.state_of(&first_run),
        Some(State::CompletionAcknowledged)
    );
    let session = world.cp.session(world.cp.worker_id()).unwrap();
    assert_eq!(
        session.status,
        ql_worker_core::wire::session::SessionStatus::Offline
    );
    let last = &events_named(&log, "worker.stopped")[0];
    assert_eq!(last["how"], "drained", "{last}");

    // The next start takes new work (the request file is gone).
    let quick = RevisionBuilder::shell("true").build().unwrap();
    let second_run = world.cp.enqueue_run(RunSpec::numbered(2, quick)).unwrap();
    let _worker = KillOnDrop(world.spawn_worker(&[]));
    world.wait_for("the second Run completed", SETTLE, |w| {
        w.state_of(&second_run) == Some(State::CompletionAcknowledged)
    });
    assert_eq!(marker_lines(&marker), 1, "the slow Run ran once");
    let records = world.records();
    let (slow, quick) = (&records[&first_run], &records[&second_run]);
    assert_ne!(
        slow.offer.worker.session_id, quick.offer.worker.session_id,
        "the new work came through a new Session"
    );
    let slow_done = world.cp.run(&first_run).unwrap().finished_at.unwrap();
    assert!(
        slow_done <= quick.accepted_at_ms,
        "the draining Session's Run settled before the new Session took work"
    );
}

#[test]
fn a_second_signal_stops_at_once_and_the_run_resumes_at_the_next_start() {
    let world = World::new();
    let marker = world.dir.path().join("marker");
    let slow = RevisionBuilder::shell(&format!("echo ran >> {}; sleep 3", marker.display()))
        .build()
        .unwrap();
    let run = world.cp.enqueue_run(RunSpec::numbered(1, slow)).unwrap();
    let log = world.dir.path().join("worker.log");
    let mut worker = KillOnDrop(world.spawn_with_args(JSON, &[], &log));
    world.wait_for("the Run running", SETTLE, |w| {
        w.state_of(&run) == Some(State::RunningAcknowledged)
    });
    sigterm(&worker);
    wait_event(&log, "drain.begun", SETTLE, |e| e["in_flight"] == 1);
    sigterm(&worker);
    assert_eq!(wait_exit(&mut worker, SETTLE).code(), Some(4));
    assert_ne!(
        world.state_of(&run),
        Some(State::CompletionAcknowledged),
        "stopped before the Run ended"
    );
    let _worker = KillOnDrop(world.spawn_worker(&[]));
    world.wait_for("the Run completed after the restart", SETTLE, |w| {
        w.state_of(&run) == Some(State::CompletionAcknowledged)
    });
    assert_eq!(marker_lines(&marker), 1, "the Run ran once");
    assert_eq!(
        world
            .cp
            .run(&run)
            .unwrap()
            .completion
            .unwrap()
            .result
            .exit_code,
        0,
        "it ran to its end under its supervisor"
    );
}

#[test]
fn a_drain_with_nothing_in_flight_exits_0_at_once() {
    let mut world = World::new();
    world.edit_config("drain_budget_ms = 20000", "drain_budget_ms = 600000");
    let log = world.dir.path().join("worker.log");
    let mut worker = KillOnDrop(world.spawn_with_args(JSON, &[], &log));
    wait_event(&log, "reconciliation.done", SETTLE, |_| true);
    sigterm(&worker);
    // The wait is the bound: the budget is ten minutes.
    assert_eq!(
        wait_exit(&mut worker, Duration::from_secs(20)).code(),
        Some(0)
    );
    assert_eq!(
        world.cp.session(world.cp.worker_id()).unwrap().status,
        ql_worker_core::wire::session::SessionStatus::Offline
    );
}
