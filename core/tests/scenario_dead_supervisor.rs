//! Issue 16, item 6: no lease renewed forever for nothing. A Run whose supervisor died without
//! a receipt and whose user process is gone is not renewed any more: the Worker records
//! `recovery_required(lease_lost_local_execution_stopped)` (what `ql-worker recover` lists), the
//! Run no longer holds a drain, and the control plane's lease lapses. Driven through the whole
//! Worker against the simulated host; the exact commands are asserted.

use ql_worker_core::io::{Action, Liveness, Outcome};
use ql_worker_core::record::{RecoveryReason, State};
use ql_worker_core::wire::route::Operation;
use ql_worker_core::worker::StopReason;
use ql_worker_sim::testkit::sim::{On, Sim, Status};
use ql_worker_sim::testkit::world::{Answer, Event, ReceiptKind};

fn lines(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_string()).collect()
}

/// A pass that inspects, concludes nothing is gone, and renews as before.
const RENEWED: [&str; 7] = [
    "list-inbox",
    "read-record o1",
    "read-receipt attempt-1",
    "read-record o1",
    "inspect-supervision o1",
    "post lease-control o1",
    "persist-record o1 r5 running_acknowledged",
];

/// A pass that inspects, finds both gone, reads the receipt once more and records the Run as
/// gone.
const RECORDED_GONE: [&str; 8] = [
    "list-inbox",
    "read-record o1",
    "read-receipt attempt-1",
    "read-record o1",
    "inspect-supervision o1",
    "read-record o1",
    "read-receipt attempt-1",
    "persist-record o1 r5 recovery_required",
];

/// o1 running, then its supervisor and process end without a receipt.
fn died_without_receipt() -> Sim {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.event(Event::Exit {
        index: 0,
        code: 1,
        receipt: ReceiptKind::Missing,
    });
    sim.take_trail();
    sim
}

fn renewals(sim: &Sim) -> usize {
    sim.commands()
        .iter()
        .filter(|l| *l == "post lease-control o1")
        .count()
}

/// Both gone, no receipt (read once more after the inspection): no renewal; the evidence is
/// recorded, the Worker is fail-closed on it, and later passes neither renew nor inspect it.
#[test]
fn a_supervisor_gone_without_receipt_with_its_process_gone_is_recorded_not_renewed() {
    let mut sim = died_without_receipt();
    sim.run(1);
    assert_eq!(sim.commands(), lines(&RECORDED_GONE));
    let record = sim.first_record();
    assert_eq!(record.state, State::RecoveryRequired);
    assert_eq!(
        record.recovery_reason,
        Some(RecoveryReason::LeaseLostLocalExecutionStopped)
    );
    assert_eq!(
        sim.worker.fail_closed().map(|f| f.reason),
        Some(RecoveryReason::LeaseLostLocalExecutionStopped)
    );
    sim.take_trail();
    sim.run(5);
    assert_eq!(renewals(&sim), 0, "{:#?}", sim.commands());
    assert!(
        !sim.commands()
            .iter()
            .any(|l| l.starts_with("inspect-supervision")),
        "{:#?}",
        sim.commands()
    );
    sim.assert_no_violations();
}

/// A drain after that does not wait for the Run (it holds nothing any more): it ends at once,
/// `Unsettled` (exit 4) because recovery evidence remains for the operator.
#[test]
fn a_drain_after_the_evidence_is_not_held_by_the_gone_run() {
    let mut sim = died_without_receipt();
    sim.run(1);
    sim.take_trail();
    sim.request_drain();
    sim.settle();
    assert_eq!(sim.status, Status::Stopped(StopReason::Unsettled));
    assert_eq!(renewals(&sim), 0, "{:#?}", sim.commands());
}

/// Nothing can be concluded (the inspection is unknown): renewed as before.
#[test]
fn an_inconclusive_inspection_renews_as_before() {
    let mut sim = died_without_receipt();
    sim.on(On::Kind("inspect-supervision"), Answer::StopUnknown);
    sim.run(1);
    assert_eq!(sim.commands(), lines(&RENEWED));
    assert_eq!(sim.first_record().state, State::RunningAcknowledged);
}

/// Steps `sim` until the outstanding command is the inspection, then delivers `supervisor` and
/// `process` and settles.
fn inspect_as(sim: &mut Sim, supervisor: Liveness, process: Liveness) {
    sim.tick();
    for _ in 0..100 {
        match sim.act() {
            Some(Action::InspectSupervision { .. }) => {
                sim.deliver(Outcome::SupervisionInspected {
                    supervisor,
                    process,
                });
                sim.settle();
                return;
            }
            Some(_) => sim.answer(Answer::Ok),
            None => panic!("no inspection: {:#?}", sim.commands()),
        }
    }
    panic!("no inspection within 100 commands");
}

/// One of the two still exists: a live supervisor still publishes its receipt, a live process
/// is still stopped by identity when the control plane asks. Renewed as before.
#[test]
fn a_supervisor_or_process_still_alive_is_renewed_as_before() {
    for (supervisor, process) in [
        (Liveness::Gone, Liveness::Alive),
        (Liveness::Alive, Liveness::Gone),
        (Liveness::Gone, Liveness::Unknown),
        (Liveness::Unknown, Liveness::Gone),
    ] {
        let mut sim = Sim::holding(State::RunningAcknowledged);
        inspect_as(&mut sim, supervisor, process);
        assert_eq!(
            sim.commands(),
            lines(&RENEWED),
            "{supervisor:?} {process:?}"
        );
    }
}

/// The receipt was published between the first read and the inspection (the supervisor
/// publishes it, then exits): the confirming read finds it and the Run is completed, never
/// recorded as lost.
#[test]
fn a_receipt_published_just_before_the_supervisor_exited_is_completed() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.tick();
    for _ in 0..100 {
        match sim.act() {
            Some(Action::InspectSupervision { .. }) => break,
            Some(_) => sim.answer(Answer::Ok),
            None => panic!("no inspection: {:#?}", sim.commands()),
        }
    }
    // The process exits now with a genuine receipt; the world then says both are gone.
    sim.event(Event::Exit {
        index: 0,
        code: 0,
        receipt: ReceiptKind::Genuine,
    });
    sim.answer(Answer::Ok);
    sim.settle();
    let trail = sim.commands();
    assert!(
        trail.contains(&"persist-record o1 r5 completion_acknowledged".to_string()),
        "{trail:#?}"
    );
    assert!(
        !trail.iter().any(|l| l.contains("recovery_required")),
        "{trail:#?}"
    );
    assert!(
        !trail
            .iter()
            .any(|l| l == &format!("post {} o1", Operation::LeaseControl.as_str())),
        "{trail:#?}"
    );
    assert_eq!(sim.first_record().state, State::CompletionAcknowledged);
}

/// o1 running, then its supervisor and process end leaving a receipt of `kind` that can never
/// authenticate (forged: another token; malformed: not a receipt). The supervisor writes its
/// receipt once and never over an existing file, so nothing will replace it: the Run is
/// recorded as gone, exactly as without a receipt, and renewed no more. Before, its lease was
/// renewed at every pass for ever, each `stop_requested` answered by a stop of a process
/// long gone (found by the walks over the model checks' world, `docs/simulation.md`).
#[test]
fn a_supervisor_gone_leaving_a_receipt_that_never_authenticates_is_recorded_not_renewed() {
    for kind in [ReceiptKind::Forged, ReceiptKind::Malformed] {
        let mut sim = Sim::holding(State::RunningAcknowledged);
        sim.event(Event::Exit {
            index: 0,
            code: 1,
            receipt: kind,
        });
        sim.take_trail();
        sim.run(1);
        assert_eq!(sim.commands(), lines(&RECORDED_GONE), "{kind:?}");
        let record = sim.first_record();
        assert_eq!(
            record.recovery_reason,
            Some(RecoveryReason::LeaseLostLocalExecutionStopped),
            "{kind:?}"
        );
        sim.take_trail();
        sim.run(5);
        assert_eq!(renewals(&sim), 0, "{kind:?}: {:#?}", sim.commands());
        sim.assert_no_violations();
    }
}

/// o1 running; its process exits while this host's wall clock is an hour ahead, leaving a
/// receipt of `kind`; then the clock is set right (stepped back an hour).
fn exited_while_the_clock_was_ahead(kind: ReceiptKind) -> Sim {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.step_wall_clock(3_600_000);
    sim.event(Event::Exit {
        index: 0,
        code: u8::from(kind != ReceiptKind::Genuine),
        receipt: kind,
    });
    sim.step_wall_clock(-3_600_000);
    sim.take_trail();
    sim
}

/// A receipt that is genuine but "finished in the future" for this host's wall clock (stepped
/// back an hour after the process ended) may pass once the clock catches up: the Run is not
/// given up, and it is renewed as before.
#[test]
fn a_receipt_finished_in_the_future_is_not_given_up() {
    let mut sim = exited_while_the_clock_was_ahead(ReceiptKind::Genuine);
    sim.run(1);
    let trail = sim.commands();
    assert!(
        !trail.iter().any(|l| l.contains("inspect-supervision")),
        "{trail:#?}"
    );
    assert!(
        !trail.iter().any(|l| l.contains("recovery_required")),
        "{trail:#?}"
    );
    assert_eq!(sim.first_record().state, State::RunningAcknowledged);
}

/// A forged receipt dated by a wall clock that was an hour ahead and has been stepped back: the
/// token is checked before the time, so it is known never to authenticate whatever the clock
/// reads, and the Run is recorded as gone at once rather than renewed until the clock catches
/// up.
#[test]
fn a_forged_receipt_dated_ahead_of_the_clock_is_known_for_what_it_is() {
    let mut sim = exited_while_the_clock_was_ahead(ReceiptKind::Forged);
    sim.run(1);
    let record = sim.first_record();
    assert_eq!(
        record.recovery_reason,
        Some(RecoveryReason::LeaseLostLocalExecutionStopped),
        "{:#?}",
        sim.commands()
    );
    assert_eq!(renewals(&sim), 0, "{:#?}", sim.commands());
}
