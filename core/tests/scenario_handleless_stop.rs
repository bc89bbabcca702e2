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
use ql_worker_core::worker::StopReason;
use ql_worker_sim::testkit::act;
use ql_worker_sim::testkit::sim::{On, Sim, Status};
use ql_worker_sim::testkit::world::{Answer, Event, ProcessState, ReceiptKind, World};
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

/// `stop_requested` for the handle-less Run: with no receipt yet, the pass first asks, by the
/// published handle, whether anything of the Run is left (its process lives); the renewed lease
/// is persisted, then the published handle is read again and the exact process group stopped by
/// it; the supervisor's receipt (signal exit code) then completes the Run like any other.
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
            "read-published-handle attempt-1",
            "inspect-supervision o1",
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
    sim.assert_no_violations();
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
/// published): nothing can be inspected, the lease is renewed; the stop is unknown, nothing is
/// signalled, the process runs on.
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
            "read-published-handle attempt-1",
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
    // Read before the inspection, and again for the stop.
    sim.on(On::Kind("read-published-handle"), Answer::StopUnknown);
    sim.on(On::Kind("read-published-handle"), Answer::StopUnknown);
    sim.run(1);
    assert!(stops(&sim).is_empty(), "{:#?}", sim.commands());
    assert_eq!(
        sim.world.supervisor.processes[0].state,
        ProcessState::Running
    );
}

/// The handle-less Run's supervisor and user process end without a receipt (a reboot, or both
/// killed together): nothing can complete it any more. The Worker inspects it by the published
/// handle, reads the receipt once more, and stops supervising it: no renewal, no stop at later
/// passes, and a drain is not held by it (it ends at once, `Unsettled`, exit 4, because the
/// evidence stays for the operator). The record keeps its first reason; `recover` lists it.
#[test]
fn a_run_without_handle_whose_supervisor_and_process_are_gone_is_no_longer_supervised() {
    let mut sim = crashed_after_spawn(true).recording();
    sim.event(Event::Exit {
        index: 0,
        code: 1,
        receipt: ReceiptKind::Missing,
    });
    sim.take_trail();
    sim.run(1);
    assert_eq!(
        sim.commands(),
        lines(&[
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "read-record o1",
            "read-published-handle attempt-1",
            "inspect-supervision o1",
            "read-record o1",
            "read-receipt attempt-1",
        ])
    );
    sim.take_trail();
    // Past the lease: no stop of a process known gone, no renewal, no inspection.
    sim.advance_to(UnixMillis::new(40_000).unwrap());
    sim.run(5);
    let trail = sim.commands();
    assert!(
        !trail.iter().any(|l| l.starts_with("stop")
            || l.starts_with("post lease-control")
            || l.starts_with("inspect-supervision")),
        "{trail:#?}"
    );
    sim.request_drain();
    sim.run(3);
    assert_eq!(sim.status, Status::Stopped(StopReason::Unsettled));
    let record = sim.first_record();
    assert_eq!(
        record.recovery_reason,
        Some(RecoveryReason::LaunchOutcomeUnknown)
    );
    sim.assert_no_violations();
}

/// While the user process lives, the inspection says so and the Run is supervised as before:
/// its lease is renewed.
#[test]
fn a_run_without_handle_whose_process_lives_is_renewed_as_before() {
    let mut sim = crashed_after_spawn(true).recording();
    sim.run(1);
    let trail = sim.commands();
    assert!(
        trail.contains(&"inspect-supervision o1".to_string())
            && trail.contains(&"post lease-control o1".to_string()),
        "{trail:#?}"
    );
    assert_eq!(
        sim.world.supervisor.processes[0].state,
        ProcessState::Running
    );
}
