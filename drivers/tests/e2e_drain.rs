//! `ql-worker drain` with the real binary: the request file is answered by the Worker that saw
//! it, however that Worker ends. Here the drain budget ends with a Run still running (exit 4,
//! the record resumes at the next start); the file is gone, so the next start takes new work
//! instead of draining again at once. The control plane still holds the Session `draining`
//! (issue 14): the Run still running finishes under it, then a new Session takes the new work
//! (`e2e_restart_drain.rs` has the Run finished before the restart).

mod e2e_common;

use std::process::Command;
use std::time::Duration;

use e2e_common::{KillOnDrop, World, marker_lines, wait_exit};
use ql_worker::runtime::DRAIN_FILE;
use ql_worker_core::record::State;
use ql_worker_tests::control_plane::{RevisionBuilder, RunSpec};

const SETTLE: Duration = Duration::from_secs(60);

#[test]
fn a_drain_request_ends_with_the_worker_that_answered_it() {
    let world = World::new();
    let text = std::fs::read_to_string(&world.config_path).unwrap();
    let text = text.replace("drain_budget_ms = 20000", "drain_budget_ms = 1000");
    assert!(text.contains("drain_budget_ms = 1000"));
    std::fs::write(&world.config_path, text).unwrap();
    let marker = world.dir.path().join("marker");
    let slow = RevisionBuilder::shell(&format!("echo ran >> {}; sleep 4", marker.display()))
        .build()
        .unwrap();
    let first_run = world.cp.enqueue_run(RunSpec::numbered(1, slow)).unwrap();
    let mut worker = KillOnDrop(world.spawn_worker(&[]));
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
    let status = wait_exit(&mut worker, Duration::from_secs(30));
    assert_eq!(
        status.code(),
        Some(4),
        "the drain budget ended with a Run unsettled"
    );
    assert!(
        !file.exists(),
        "the drain request ended with the Worker that answered it"
    );

    // The next start resumes the unsettled Run and takes new work.
    let quick = RevisionBuilder::shell("true").build().unwrap();
    let second_run = world.cp.enqueue_run(RunSpec::numbered(2, quick)).unwrap();
    let _worker = KillOnDrop(world.spawn_worker(&[]));
    world.wait_for("both Runs completed", SETTLE, |w| {
        w.state_of(&first_run) == Some(State::CompletionAcknowledged)
            && w.state_of(&second_run) == Some(State::CompletionAcknowledged)
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
