//! Reference §6.6 (`WR/workerExecutionControlCoordinator.test.cjs`): the lease-control
//! supervisor (completion first, then the lease), driven through the whole Worker against the
//! simulated host. Each test is named after the reference scenario and asserts the exact
//! commands.

use ql_worker_core::io::{Action, Input};
use ql_worker_core::record::{RecoveryReason, State};
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::route::Operation;
use ql_worker_sim::testkit::act;
use ql_worker_sim::testkit::sim::{On, Sim, Status};
use ql_worker_sim::testkit::world::{Answer, Event, ReceiptKind, World};
use ql_worker_sim::testkit::{self};

fn ms(v: u64) -> UnixMillis {
    UnixMillis::new(v).unwrap()
}

fn lines(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_string()).collect()
}

/// Completion is tried first (the receipt read), then the lease is renewed, then the new lease
/// version is persisted in the same state.
#[test]
fn replays_completion_first_renews_authority_then_persists_the_next_lease_version() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.run(1);
    assert_eq!(
        sim.commands(),
        lines(&[
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "read-record o1",
            "inspect-supervision o1",
            "post lease-control o1",
            "persist-record o1 r5 running_acknowledged",
        ])
    );
    let record = sim.first_record();
    assert_eq!(record.offer.lease.version.get(), 1);
    assert_eq!(record.offer.lease.expires_at_ms, ms(31_000));
}

/// `stop_requested` (timeout): the renewed lease is persisted first, then the exact process
/// group (the durable handle) is stopped; the supervisor's receipt (signal exit code) is then
/// completed like any other.
#[test]
fn persists_stop_request_lease_authority_before_stopping_the_exact_process() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.on(On::Post(Operation::LeaseControl), Answer::StopRequested);
    sim.run(2);
    assert_eq!(
        sim.commands(),
        lines(&[
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "read-record o1",
            "inspect-supervision o1",
            "post lease-control o1",
            "persist-record o1 r5 running_acknowledged",
            "stop o1",
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "inspect-log o1",
            "upload-log o1",
            "read-record o1",
            "post completion o1",
            "persist-record o1 r6 completion_acknowledged",
            "remove-receipt attempt-1",
            // The freed slot goes to the next Pull at once (issue 14); nothing is queued.
            "read-claim",
            "draw-entropy",
            "persist-claim r0",
            "post offers",
            "clear-claim r0",
        ])
    );
    let stop = sim.stream.iter().flatten().find_map(|a| match a {
        Action::Stop { handle } => Some(handle.clone()),
        _ => None,
    });
    assert_eq!(stop, Some(testkit::seeded_handle(1)));
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
}

fn expire(sim: &mut Sim) {
    // The seeded lease expires at 30 020 ms; the Session was renewed by heartbeats.
    sim.advance_to(ms(30_020));
    sim.tick();
    sim.settle();
}

/// Local lease expiry: no control-plane call; the process is stopped and the conclusive stop is
/// recorded as `recovery_required(lease_lost_local_execution_stopped)`.
#[test]
fn stops_locally_and_records_conclusive_recovery_after_lease_expiry() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.on(On::Post(Operation::LeaseControl), Answer::Unavailable);
    sim.run(1);
    sim.take_trail();
    expire(&mut sim);
    assert_eq!(
        sim.commands(),
        lines(&[
            "post heartbeat",
            "list-inbox",
            "read-record o1",
            "read-record o1",
            "stop o1",
            "persist-record o1 r5 recovery_required",
        ])
    );
    assert_eq!(
        sim.first_record().recovery_reason,
        Some(RecoveryReason::LeaseLostLocalExecutionStopped)
    );
}

/// The same, with a stop whose effect cannot be verified:
/// `recovery_required(lease_lost_local_execution_unverified)`.
#[test]
fn keeps_inconclusive_stop_evidence_distinct_after_lease_expiry() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.on(On::Post(Operation::LeaseControl), Answer::Unavailable);
    sim.run(1);
    sim.take_trail();
    sim.on(On::Kind("stop"), Answer::StopUnknown);
    expire(&mut sim);
    assert_eq!(
        sim.commands(),
        lines(&[
            "post heartbeat",
            "list-inbox",
            "read-record o1",
            "read-record o1",
            "stop o1",
            "persist-record o1 r5 recovery_required",
        ])
    );
    assert_eq!(
        sim.first_record().recovery_reason,
        Some(RecoveryReason::LeaseLostLocalExecutionUnverified)
    );
}

/// Once `completion_acknowledged` is durable, supervision never calls the control plane again.
#[test]
fn does_not_contact_control_after_completion_acknowledgement() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.event(Event::Exit {
        index: 0,
        code: 0,
        receipt: ReceiptKind::Genuine,
    });
    sim.run(4);
    let trail = sim.commands();
    let done = trail
        .iter()
        .position(|l| l == "remove-receipt attempt-1")
        .unwrap();
    assert!(
        !trail[done..]
            .iter()
            .any(|l| l.starts_with("post lease-control")),
        "{trail:#?}"
    );
    assert!(!trail.iter().any(|l| l.starts_with("post lease-control")));
}

/// While the Session is unusable (its lease expired: heartbeats failed) but the Run lease is
/// still live, supervision neither calls lease control nor stops anything: it waits.
#[test]
fn waits_for_the_bound_worker_session_while_local_lease_authority_remains_live() {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, State::RunningAcknowledged), true);
    world.plane.session_lease_ms = 5_000;
    let mut sim = Sim::scenario(world);
    sim.run(4); // 1 000 (register, reconcile, supervise), 3 000: Session usable until 6 000.
    sim.take_trail();
    sim.run(1); // 5 000: still usable.
    sim.take_trail();
    sim.run(1); // 7 000: the Session lease has expired; the Run lease (31 000) has not.
    assert_eq!(
        sim.take_trail(),
        lines(&[
            "tick 7000",
            "list-inbox",
            "read-record o1",
            "read-record o1"
        ])
    );
    assert_eq!(sim.first_record().state, State::RunningAcknowledged);
}

/// `terminal` at lease control: the completion is replayed once first (a terminal lease may be
/// this Worker's own completion whose answer was lost — found by the crash campaign; here there
/// is no receipt), then the process is stopped and the record quarantined as
/// `recovery_required(control_plane_terminal)`.
#[test]
fn stops_and_quarantines_execution_when_the_control_plane_is_terminal() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.on(On::Post(Operation::LeaseControl), Answer::Terminal);
    sim.run(1);
    assert_eq!(
        sim.commands(),
        lines(&[
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "read-record o1",
            "inspect-supervision o1",
            "post lease-control o1",
            "read-record o1",
            "read-receipt attempt-1",
            // The record is read again before the stop (a renewal beside an upload may have
            // moved it).
            "read-record o1",
            "stop o1",
            "persist-record o1 r5 recovery_required",
        ])
    );
    assert_eq!(
        sim.first_record().recovery_reason,
        Some(RecoveryReason::ControlPlaneTerminal)
    );
    assert!(sim.worker.fail_closed().is_some());
}

/// One supervision pass per offer per tick: ticks that arrive while an operation of the offer is
/// in flight are coalesced (the first plans one supervision page, the others find it planned;
/// nothing of the same offer starts beside the one in flight), and a `started` record gets its
/// running-ACK replay and exactly one lease-control call per planned pass.
#[test]
fn coalesces_concurrent_supervision_for_the_same_offer() {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, State::Started), true);
    let mut sim = Sim::scenario(world);
    sim.run(1);
    sim.tick();
    sim.answer(Answer::Ok); // the reconcile page
    sim.take_trail();
    // Concurrent ticks while the Processor's read is outstanding change nothing.
    let pending = sim.pending_canonical();
    for _ in 0..3 {
        sim.worker.handle(sim.clock(), Input::Tick).unwrap();
        sim.poll();
    }
    assert_eq!(sim.pending_canonical(), pending);
    assert_eq!(sim.status, Status::Busy);
    sim.settle();
    sim.run(2);
    let trail = sim.commands();
    assert_eq!(
        trail[..10],
        lines(&[
            "post running o1",
            "persist-record o1 r4 running_acknowledged",
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "read-record o1",
            "inspect-supervision o1",
            "post lease-control o1",
            "persist-record o1 r5 running_acknowledged",
            "list-inbox",
        ])[..]
    );
    // Two rounds, and the one pass the three concurrent ticks planned.
    let passes = 2 + 1;
    assert_eq!(
        trail
            .iter()
            .filter(|l| *l == "post lease-control o1")
            .count(),
        passes
    );
}
