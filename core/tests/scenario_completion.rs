//! Reference §6.5 (`WR/workerCompletionCoordinator.test.cjs`): the completion coordinator,
//! driven through the whole Worker (supervision runs completion first on every tick) against
//! the simulated host. Each test is named after the reference scenario and asserts the exact
//! commands.

use ql_worker_core::io::Action;
use ql_worker_core::record::{RecoveryReason, State};
use ql_worker_sim::testkit::sim::{On, Sim};
use ql_worker_sim::testkit::world::{Answer, Event, ReceiptKind, World};
use ql_worker_sim::testkit::{self};

fn lines(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_string()).collect()
}

/// A Worker holding o1 `running_acknowledged` with its process running, registered and
/// reconciled; `take_trail` emptied.
fn running() -> Sim {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, State::RunningAcknowledged), true);
    let mut sim = Sim::scenario(world);
    sim.run(2);
    assert_eq!(
        sim.take_trail(),
        lines(&["tick 1000", "post register", "tick 1000", "list-inbox"])
    );
    sim
}

fn exit(sim: &mut Sim, receipt: ReceiptKind) {
    sim.event(Event::Exit {
        index: 0,
        code: 0,
        receipt,
    });
    sim.take_trail();
}

const COMPLETE: [&str; 9] = [
    "list-inbox",
    "read-record o1",
    "read-receipt attempt-1",
    "inspect-log o1",
    "upload-log o1",
    "read-record o1",
    "post completion o1",
    "persist-record o1 r5 completion_acknowledged",
    "remove-receipt attempt-1",
];

/// The completion freed the Run's slot: the next Pull goes out at once, not at the next tick
/// (issue 14); the control plane has nothing more.
const FREED_SLOT_PULL: [&str; 5] = [
    "read-claim",
    "draw-entropy",
    "persist-claim r0",
    "post offers",
    "clear-claim r0",
];

/// [`COMPLETE`] with the completion at revision `r`, then the Pull of the freed slot.
fn completed_then_pull(r: &str) -> Vec<String> {
    let mut out: Vec<String> = lines(&COMPLETE)
        .iter()
        .map(|l| l.replace("r5", r))
        .collect();
    out.extend(lines(&FREED_SLOT_PULL));
    out
}

/// Receipt, log, upload, completion, durable `completion_acknowledged`, then the receipt
/// removal — in that order; the log is kept.
#[test]
fn uploads_before_completion_and_deletes_the_receipt_only_after_durable_ack() {
    let mut sim = running();
    exit(&mut sim, ReceiptKind::Genuine);
    sim.run(1);
    assert_eq!(sim.commands(), completed_then_pull("r5"));
    assert!(sim.world.disk.receipts.is_empty());
    assert_eq!(
        sim.world.disk.logs.len(),
        1,
        "the log is never deleted here"
    );
    let id = sim.world.plane.runs.keys().next().unwrap().clone();
    assert_eq!(
        sim.world.disk.record(&id).unwrap().state,
        State::CompletionAcknowledged
    );
    // The completion named the uploaded artifact (the `upload-first` check).
    sim.assert_no_violations();
}

/// A crash between the spawn and the `started` write leaves a durable `launching` record and a
/// live process. The restart records `recovery_required(launch_outcome_unknown)` (never a
/// respawn) and then completes receipt-first: the record has the barrier (start time, log id,
/// callback sequence and digest) but no executor handle. (The reference's coordinator can also
/// complete straight from `launching`; here startup reconciliation records the crash window
/// first, and `recovery_required → completion_acknowledged` drops the reason.)
#[test]
fn recovers_a_receipt_from_the_durable_launching_crash_window() {
    let mut sim = Sim::scenario(World::one_offer(1));
    sim.run(2);
    sim.on(On::Kind("spawn"), Answer::CrashAfter);
    sim.run(1);
    exit(&mut sim, ReceiptKind::Genuine);
    sim.run(3);
    assert_eq!(
        sim.commands(),
        lines(&[
            "post register",
            "list-inbox",
            "read-record o1",
            "persist-record o1 r3 recovery_required",
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "inspect-log o1",
            "upload-log o1",
            "read-record o1",
            "post completion o1",
            "persist-record o1 r4 completion_acknowledged",
            "remove-receipt attempt-1",
            // The evidence resolved and the slot is free: the next Pull at once.
            "read-claim",
            "draw-entropy",
            "persist-claim r0",
            "post offers",
            "clear-claim r0",
        ])
    );
    let id = sim.world.plane.runs.keys().next().unwrap().clone();
    let record = sim.world.disk.record(&id).unwrap();
    assert_eq!(record.executor_handle, None);
    assert_eq!(record.recovery_reason, None);
    assert!(sim.stream.iter().flatten().any(|a| matches!(a,
        Action::PersistRecord { record, .. } if record.recovery_reason
            == Some(RecoveryReason::LaunchOutcomeUnknown))));
}

/// A receipt whose token does not hash to the persisted digest is rejected before anything is
/// uploaded: no upload, no completion, no removal, the receipt kept as evidence. The supervisor
/// and the process are gone and no receipt can ever authenticate (a supervisor never writes
/// over an existing one): the Run is recorded as gone and renewed no more (the exact commands
/// of that pass: `scenario_dead_supervisor`).
#[test]
fn rejects_a_non_matching_raw_capability_before_upload() {
    let mut sim = running();
    exit(&mut sim, ReceiptKind::Forged);
    sim.run(2);
    let trail = sim.commands();
    for never in [
        "upload-log",
        "post completion",
        "remove-receipt",
        "post lease-control",
    ] {
        assert!(
            !trail.iter().any(|l| l.starts_with(never)),
            "{never}: {trail:#?}"
        );
    }
    assert_eq!(
        sim.first_record().recovery_reason,
        Some(RecoveryReason::LeaseLostLocalExecutionStopped)
    );
    assert_eq!(sim.world.disk.receipts.len(), 1, "kept as evidence");
}

/// An unreadable receipt store is transient: the next pass reads the receipt and completes.
/// A malformed receipt is evidence: it is never uploaded or completed, and it is kept; with the
/// supervisor and the process gone, the Run is recorded as gone.
#[test]
fn distinguishes_unavailable_receipt_storage_from_invalid_evidence() {
    let mut sim = running();
    exit(&mut sim, ReceiptKind::Genuine);
    sim.on(On::Kind("read-receipt"), Answer::Unchanged);
    sim.run(2);
    let trail = sim.commands();
    assert_eq!(
        trail[..6],
        lines(&[
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "read-record o1",
            "post lease-control o1",
            "persist-record o1 r5 running_acknowledged",
        ])[..]
    );
    assert_eq!(trail[6..], completed_then_pull("r6")[..]);

    let mut sim = running();
    exit(&mut sim, ReceiptKind::Malformed);
    sim.run(3);
    let trail = sim.commands();
    assert!(!trail.iter().any(|l| l.starts_with("upload-log")));
    assert!(!trail.iter().any(|l| l.starts_with("post completion")));
    // Read by the pass and once more after the inspection; then the Run is recorded as gone.
    assert_eq!(
        trail
            .iter()
            .filter(|l| *l == "read-receipt attempt-1")
            .count(),
        2
    );
    assert_eq!(sim.first_record().state, State::RecoveryRequired);
    assert_eq!(sim.world.disk.receipts.len(), 1, "kept as evidence");
}

/// A failed upload stops the pass before completion: no completion, no removal, the record
/// state unchanged, receipt and log kept; the next pass uploads again and completes.
#[test]
fn keeps_durable_evidence_when_upload_fails() {
    let mut sim = running();
    exit(&mut sim, ReceiptKind::Genuine);
    sim.on(On::Kind("upload-log"), Answer::Unavailable);
    sim.run(1);
    assert_eq!(
        sim.take_trail(),
        lines(&[
            "tick 1000",
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "inspect-log o1",
            "upload-log o1",
            "read-record o1",
            "post lease-control o1",
            "persist-record o1 r5 running_acknowledged",
        ])
    );
    let id = sim.world.plane.runs.keys().next().unwrap().clone();
    assert_eq!(
        sim.world.disk.record(&id).unwrap().state,
        State::RunningAcknowledged
    );
    assert_eq!(sim.world.disk.receipts.len(), 1);
    assert!(sim.world.plane.runs[&id].completion.is_none());
    sim.run(1);
    assert_eq!(sim.commands(), completed_then_pull("r6"));
}

/// A `recovery_required(launch_outcome_unknown)` record may lack barrier fields (they are
/// optional for it). Completion needs all four (start time, log id, callback sequence, token
/// digest): a record missing only its start time is deferred without reading the receipt, so
/// nothing is uploaded or completed, and the evidence stays. (Kills the three `&&` → `||`
/// mutants of the barrier check in `CompletionOp::on_record`; docs/mutation.md.)
#[test]
fn a_launch_outcome_unknown_record_missing_its_start_time_is_never_completed() {
    let mut world = World::new(1, Vec::new());
    let mut record = testkit::record(1, State::RecoveryRequired);
    record.recovery_reason = Some(RecoveryReason::LaunchOutcomeUnknown);
    record.executor_handle = None;
    record.executor_started_at_ms = None;
    assert!(record.log_artifact_id.is_some());
    assert!(record.completion_receipt_callback_sequence.is_some());
    assert!(record.completion_receipt_token_digest.is_some());
    world.seed(1, record, true);
    let mut sim = Sim::scenario(world);
    sim.run(2);
    exit(&mut sim, ReceiptKind::Genuine);
    sim.run(3);
    let trail = sim.commands();
    assert!(
        trail.iter().filter(|l| *l == "read-record o1").count() >= 3,
        "supervised every tick: {trail:?}"
    );
    assert!(
        !trail.iter().any(|l| l.starts_with("read-receipt")
            || l.starts_with("upload-log")
            || l.starts_with("post completion")),
        "{trail:?}"
    );
    assert_eq!(sim.world.disk.receipts.len(), 1, "kept as evidence");
}

/// A `started` record is both replayed (its running ACK) and supervised in the same pass. The
/// replay learns that the control plane ended the Run (`already_terminal`), stops the process
/// and records `recovery_required(control_plane_terminal)`; the supervision queued behind it
/// for the same offer does not begin: no receipt is read, nothing is uploaded or completed for
/// a Run the control plane has settled.
#[test]
fn a_record_settled_by_its_running_replay_is_not_completed_in_the_same_pass() {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, State::Started), true);
    let mut sim = Sim::scenario(world);
    sim.on(
        On::Post(ql_worker_core::wire::route::Operation::Running),
        Answer::AlreadyTerminal,
    );
    sim.run(2);
    let commands = sim.commands();
    let record = sim.first_record();
    assert_eq!(record.state, State::RecoveryRequired, "{commands:#?}");
    assert_eq!(
        record.recovery_reason,
        Some(RecoveryReason::ControlPlaneTerminal)
    );
    assert!(
        !commands
            .iter()
            .any(|l| l.starts_with("read-receipt") || l.starts_with("upload-log")),
        "{commands:#?}"
    );
}
