//! Issue 16, item 6, second half: a Run whose record has no handle (the Worker crashed between
//! the spawn and `started`) still honours `stop_requested` and its lease. The supervisor
//! published the user process's durable handle before the user command ran; when the core must
//! stop such a Run it reads that handle (`read-published-handle`) and stops the exact process
//! group by it, as for a Run with a handle. Nothing published (or a garbled file): today's
//! behaviour, the stop is unknown. Driven through the whole Worker against the simulated host;
//! the exact commands are asserted.

use ql_worker_core::io::Action;
use ql_worker_core::record::{RecoveryReason, State};
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::route::Operation;
use ql_worker_sim::testkit::act;
use ql_worker_sim::testkit::sim::{On, Sim};
use ql_worker_sim::testkit::world::{Answer, ProcessState, World};
use ql_worker_sim::testkit::{self};

fn lines(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_string()).collect()
}

/// o1 durably `launching` without a handle, its user process running (the crash fell after the
/// spawn), and its handle published by the supervisor when `published`. The Worker restarts:
/// the record becomes `recovery_required(launch_outcome_unknown)`, still without a handle.
fn crashed_after_spawn(published: bool) -> Sim {
    let mut world = World::new(1, Vec::new());
    let record = testkit::record(1, State::Launching);
    let attempt = record.offer.candidate.attempt_id.clone();
    world.seed(1, record, true);
    if published {
        world
            .disk
            .published
            .insert(attempt, String::from(testkit::seeded_handle(1).as_str()));
    }
    let mut sim = Sim::scenario(world);
    sim.run(2);
    let record = sim.first_record();
    assert_eq!(record.state, State::RecoveryRequired);
    assert_eq!(
        record.recovery_reason,
        Some(RecoveryReason::LaunchOutcomeUnknown)
    );
    assert_eq!(record.executor_handle, None);
    sim.take_trail();
    sim
}

fn stops(sim: &Sim) -> Vec<String> {
    sim.stream
        .iter()
        .flatten()
        .filter_map(|a| match a {
            Action::Stop { handle } => Some(String::from(handle.as_str())),
            _ => None,
        })
        .collect()
}

/// `stop_requested` for the handle-less Run: the renewed lease is persisted first, then the
/// published handle is read and the exact process group stopped by it; the supervisor's receipt
/// (signal exit code) then completes the Run like any other.
#[test]
fn a_stop_request_for_a_run_without_handle_stops_it_by_the_published_handle() {
    let mut sim = crashed_after_spawn(true).recording();
    sim.on(On::Post(Operation::LeaseControl), Answer::StopRequested);
    sim.run(1);
    assert_eq!(
        sim.commands(),
        lines(&[
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "read-record o1",
            "post lease-control o1",
            "persist-record o1 r4 recovery_required",
            "read-published-handle attempt-1",
            "stop o1",
        ])
    );
    assert_eq!(stops(&sim), vec![testkit::seeded_handle(1).as_str()]);
    assert_eq!(
        sim.world.supervisor.processes[0].state,
        ProcessState::Exited(143)
    );
    sim.take_trail();
    sim.run(2);
    let record = sim.first_record();
    assert_eq!(record.state, State::CompletionAcknowledged, "{record:?}");
    let completion = sim
        .stream
        .iter()
        .flatten()
        .find_map(|a| match act::post(a) {
            Some((Operation::Completion, call)) => {
                Some(serde_json::from_slice::<serde_json::Value>(&call.body).unwrap())
            }
            _ => None,
        });
    assert_eq!(completion.unwrap()["result"]["exitCode"], 143);
    // The published handle went with the receipt.
    assert!(sim.world.disk.published.is_empty());
    assert!(
        sim.world.violations.is_empty(),
        "{:?}",
        sim.world.violations
    );
}

/// The lease expires locally for the handle-less Run: stopped by the published handle, no
/// control-plane call; the conclusive stop is what the record keeps (the first reason stays).
#[test]
fn a_local_lease_expiry_stops_a_run_without_handle_by_the_published_handle() {
    let mut sim = crashed_after_spawn(true).recording();
    sim.on(On::Post(Operation::LeaseControl), Answer::Unavailable);
    sim.advance_to(UnixMillis::new(30_020).unwrap());
    sim.tick();
    sim.settle();
    let trail = sim.commands();
    assert!(
        trail.contains(&"read-published-handle attempt-1".to_string()),
        "{trail:#?}"
    );
    assert!(trail.contains(&"stop o1".to_string()), "{trail:#?}");
    assert_eq!(
        sim.world.supervisor.processes[0].state,
        ProcessState::Exited(143)
    );
}

/// Nothing was published (a supervisor of before this change, or one that died before it
/// published): today's behaviour. The stop is unknown, nothing is signalled, the process runs on.
#[test]
fn without_a_published_handle_the_stop_stays_unknown() {
    let mut sim = crashed_after_spawn(false).recording();
    sim.on(On::Post(Operation::LeaseControl), Answer::StopRequested);
    sim.run(1);
    assert_eq!(
        sim.commands(),
        lines(&[
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "read-record o1",
            "post lease-control o1",
            "persist-record o1 r4 recovery_required",
            "read-published-handle attempt-1",
        ])
    );
    assert!(stops(&sim).is_empty());
    assert_eq!(
        sim.world.supervisor.processes[0].state,
        ProcessState::Running
    );
    let record = sim.first_record();
    assert_eq!(record.state, State::RecoveryRequired);
    assert_eq!(
        record.recovery_reason,
        Some(RecoveryReason::LaunchOutcomeUnknown)
    );
}

/// A garbled or unsafe published file reads as nothing (the driver reports an event): the same
/// unknown stop, never a signal to a process the Worker cannot identify.
#[test]
fn a_garbled_published_handle_is_never_used() {
    let mut sim = crashed_after_spawn(true).recording();
    sim.on(On::Post(Operation::LeaseControl), Answer::StopRequested);
    sim.on(On::Kind("read-published-handle"), Answer::StopUnknown);
    sim.run(1);
    assert!(stops(&sim).is_empty(), "{:#?}", sim.commands());
    assert_eq!(
        sim.world.supervisor.processes[0].state,
        ProcessState::Running
    );
}
