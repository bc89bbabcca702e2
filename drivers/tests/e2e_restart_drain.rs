//! A restart after an unclean drain (issue 14) with the real binary: the control plane holds the
//! stored Session `draining` (the reference's control plane keeps a draining Session draining
//! when it registers again), so the Worker can take no new work under it. A start that finds
//! its Session draining lets that Session's live Runs finish under it (a new Session would
//! fence their leases), then registers a new Session id, stores it, and takes new work at once.
//!
//! * `a_restart_after_a_second_signal_takes_new_work_within_one_cadence`: a second signal cuts
//!   the drain short with a Run unsettled (exit 4, the Session left `draining`); the Run finishes
//!   under its supervisor before the restart; the restarted Worker (cadence 30 s) completes it
//!   under the old Session and has the next Run claimed and completed by a new Session in less
//!   than one cadence.
//! * `a_restart_after_a_budget_ended_drain_takes_new_work_within_one_cadence`: since issue 18 a
//!   drain whose budget ends stops the Run in flight, completes it and sets the Session
//!   `offline` (exit 0); the restart finds that Session `offline` and a new Session takes the
//!   next Run within one cadence all the same.
//!
//! The Run still running at the restart (the drain budget ended and the Run outlived the
//! restart) is `e2e_drain.rs`.

mod e2e_common;

use std::time::{Duration, Instant};

use e2e_common::{KillOnDrop, World, marker_lines, sigterm, wait_exit};
use ql_worker::session_store;
use ql_worker_core::record::State;
use ql_worker_core::wire::session::SessionStatus;
use ql_worker_tests::control_plane::{RevisionBuilder, RunEventKind, RunSpec};

const CADENCE: Duration = Duration::from_secs(30);
const SETTLE: Duration = Duration::from_secs(60);

fn world() -> World {
    World::edge("\n[limits]\ncadence_ms = 30000\ndrain_budget_ms = 1000\n")
}

fn stored_session(world: &World) -> String {
    std::fs::read_to_string(world.root().join(session_store::SESSION_FILE)).unwrap()
}

fn claimed_at(world: &World, run: &ql_worker_core::ids::RunId) -> Option<u64> {
    world.cp.run(run).and_then(|r| {
        r.events.iter().find_map(|e| match e.kind {
            RunEventKind::Claimed { .. } => Some(e.at.get()),
            _ => None,
        })
    })
}

/// Starts a Worker on `world`, lets a 3-second Run start, drains, and ends the drain uncleanly:
/// by its budget (1 s) or by a second signal. Returns the Run, the marker and the stored
/// Session file of the stopped Worker, once the Run has finished and its receipt is published.
fn unclean_drain(
    world: &World,
    second_signal: bool,
    log: &std::path::Path,
) -> (ql_worker_core::ids::RunId, std::path::PathBuf, String) {
    let marker = world.dir.path().join("marker");
    let slow = RevisionBuilder::shell(&format!("echo slow >> {}; sleep 3", marker.display()))
        .build()
        .unwrap();
    let slow_run = world.cp.enqueue_run(RunSpec::numbered(1, slow)).unwrap();
    let mut first = KillOnDrop(world.spawn_worker_logged(&[], log));
    world.wait_for("the slow Run running", SETTLE, |w| {
        w.state_of(&slow_run) == Some(State::RunningAcknowledged)
    });
    let old_session = stored_session(world);
    sigterm(&first);
    world.wait_for("the Session draining", SETTLE, |w| {
        w.cp.session(w.cp.worker_id())
            .is_some_and(|s| s.status == SessionStatus::Draining)
    });
    if second_signal {
        sigterm(&first);
    }
    let status = wait_exit(&mut first, Duration::from_secs(30));
    let session = world.cp.session(world.cp.worker_id()).unwrap();
    if second_signal {
        assert_eq!(
            status.code(),
            Some(4),
            "the drain ended with the Run unsettled"
        );
        assert_eq!(session.status, SessionStatus::Draining);
        // The Run finishes after the Worker stopped (its supervisor outlives the Worker).
        // The receipt itself: its shard also holds the handle published before the command ran.
        world.wait_for("the slow Run's receipt", SETTLE, |w| {
            let mut found = false;
            e2e_common::each_file(&w.root().join("receipts"), |path, _| {
                found |= path.extension().is_some_and(|e| e == "rcpt");
            });
            found
        });
    } else {
        // The budget ended: the Run was stopped and completed, then the Session went offline.
        assert_eq!(
            status.code(),
            Some(0),
            "the budget-ended drain settles its Run"
        );
        assert_eq!(session.status, SessionStatus::Offline);
        let completion = world.cp.run(&slow_run).unwrap().completion.unwrap();
        assert_eq!(
            completion.result.exit_code, 143,
            "stopped by the drain budget"
        );
    }
    assert_eq!(marker_lines(&marker), 1, "the slow Run started once");
    (slow_run, marker, old_session)
}

/// The restart: the old Run completes under the old Session, then a new Session registers and
/// the next Run is claimed and completed, all in less than one cadence (30 s).
fn restart_takes_new_work(world: &World, second_signal: bool) {
    let log = world.dir.path().join("worker.stderr");
    let (slow_run, marker, old_session) = unclean_drain(world, second_signal, &log);
    let quick = RevisionBuilder::shell(&format!("echo quick >> {}", marker.display()))
        .build()
        .unwrap();
    let quick_run = world.cp.enqueue_run(RunSpec::numbered(2, quick)).unwrap();
    let restart = Instant::now();
    let start_ms = ql_worker_tests::control_plane::ReferenceControlPlane::now().get();
    let mut second = KillOnDrop(world.spawn_worker_logged(&[], &log));
    // Less than one cadence: nothing may wait for the next tick.
    world.wait_for(
        "the next Run completed",
        CADENCE - Duration::from_secs(5),
        |w| w.completed_at_cp(&quick_run),
    );
    let took = restart.elapsed();
    assert_eq!(
        world.state_of(&slow_run),
        Some(State::CompletionAcknowledged),
        "the old Run completed"
    );
    // The old Run was completed under the old Session; the new one was claimed by a new
    // Session, after the old Run was done.
    let slow_done = world.cp.run(&slow_run).unwrap().finished_at.unwrap().get();
    let quick_claimed = claimed_at(world, &quick_run).unwrap();
    assert!(
        slow_done <= quick_claimed,
        "the old Session's Run settled first"
    );
    let new_session = stored_session(world);
    assert_ne!(new_session, old_session, "a new Session id is stored");
    let session = world.cp.session(world.cp.worker_id()).unwrap();
    assert_eq!(session.status, SessionStatus::Online);
    assert!(new_session.contains(session.session_id.as_str()));
    let records = world.records();
    assert_eq!(
        records[&quick_run].offer.worker.session_id,
        session.session_id
    );
    assert_ne!(
        records[&slow_run].offer.worker.session_id,
        session.session_id
    );

    sigterm(&second);
    let status = wait_exit(&mut second, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "the new Session drains cleanly");
    assert_eq!(marker_lines(&marker), 2, "each Run ran once");
    let stderr = std::fs::read_to_string(&log).unwrap();
    if second_signal {
        // The old Session's Run is live at the restart: the Worker says why it waits, then
        // that a new Session replaces the old one. (After a drain that ended offline the start
        // registers a fresh Session id at once: nothing to replace.)
        assert!(
            stderr.contains("is draining or offline at the control plane")
                && stderr.contains("event=session.retiring"),
            "{stderr}"
        );
        assert!(
            stderr.contains("new Session") && stderr.contains("event=session.renewed"),
            "{stderr}"
        );
    }
    eprintln!(
        "restart after an unclean drain (second signal: {second_signal}): next Run claimed {} \
         ms after the restart, completed after {took:?} (cadence {CADENCE:?})",
        quick_claimed.saturating_sub(start_ms)
    );
}

#[test]
fn a_restart_after_a_budget_ended_drain_takes_new_work_within_one_cadence() {
    restart_takes_new_work(&world(), false);
}

#[test]
fn a_restart_after_a_second_signal_takes_new_work_within_one_cadence() {
    restart_takes_new_work(&world(), true);
}
