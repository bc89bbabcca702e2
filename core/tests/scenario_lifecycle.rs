//! Reference §6.7 (`WR/headlessExecutionLifecycle.test.cjs`): the Worker's lifecycle tick —
//! register, startup reconciliation, supervision before Pull, fail-closed, drain — against the
//! simulated host. Each test is named after the reference scenario and asserts the exact
//! commands.

use ql_worker_core::io::Input;
use ql_worker_core::record::State;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::route::Operation;
use ql_worker_core::worker::{Output, StopReason, Worker};
use ql_worker_sim::testkit::act;
use ql_worker_sim::testkit::sim::{On, Sim, Status};
use ql_worker_sim::testkit::world::{Answer, Event, OfferTemplate, ReceiptKind, World};
use ql_worker_sim::testkit::{self};

fn ms(v: u64) -> UnixMillis {
    UnixMillis::new(v).unwrap()
}

fn lines(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_string()).collect()
}

/// A simulation with `slots` concurrent Runs.
fn with_slots(world: World, slots: u16) -> Sim {
    let mut config = testkit::config();
    config.max_concurrent_runs = slots;
    Sim::new(config, world, ms(1_000)).recording()
}

/// Until its first tick the Worker does nothing: no command, idle. The single journal owner
/// (the `flock` on the inbox root) is the driver's and is released with the process:
/// `drivers/tests/storage_journal.rs`
/// (`second_owner_fails_at_once_with_already_owned_naming_the_lock`); here, the drained stop
/// that lets the driver exit and release it.
#[test]
fn is_inert_until_explicit_start_and_releases_the_single_journal_owner() {
    let start = ql_worker_sim::clock::reading(ms(1_000), 0);
    let mut worker = Worker::new(testkit::config(), start);
    for _ in 0..3 {
        assert!(matches!(
            worker.poll_output(),
            Output::Idle {
                wake_at: Some(at)
            } if at == start.mono
        ));
    }
    let mut sim = with_slots(World::new(1, Vec::new()), 1);
    sim.poll();
    assert_eq!(sim.status, Status::Idle(Some(ms(1_000))));
    assert!(sim.commands().is_empty());
    sim.run(3);
    sim.request_drain();
    sim.settle();
    assert_eq!(
        sim.commands(),
        lines(&[
            "post register",
            "list-inbox",
            "list-inbox",
            "read-claim",
            "draw-entropy",
            "persist-claim r0",
            "post offers",
            "clear-claim r0",
            "drain requested",
            "post transition",
            "post transition",
        ])
    );
    assert_eq!(sim.status, Status::Stopped(StopReason::Drained));
}

/// Startup reconciliation walks the inbox page by page (edge: 4 per page) and finishes every
/// unfinished start before the first Pull: the `accepted` record is started, the `started` one
/// gets its running ACK, the `start_failed` one its start-failure report.
#[test]
fn finishes_bounded_startup_reconciliation_before_pulling_and_processing() {
    let mut world = World::new(1, vec![OfferTemplate::sample(9)]);
    world.seed(1, testkit::record(1, State::Accepted), false);
    world.seed(2, testkit::record(2, State::StartFailed), false);
    world.seed(3, testkit::record(3, State::Started), true);
    world.seed(
        4,
        testkit::record(4, State::StartFailureAcknowledged),
        false,
    );
    world.seed(5, testkit::record(5, State::CompletionAcknowledged), false);
    let mut sim = with_slots(world, 8);
    sim.run(4);
    let trail = sim.commands();
    assert_eq!(
        trail[..18],
        lines(&[
            "post register",
            "list-inbox",
            "read-record o1",
            "post starting o1",
            "persist-record o1 r1 starting_acknowledged",
            "draw-entropy",
            "allocate-log o1",
            "persist-record o1 r2 launching",
            "spawn o1",
            "persist-record o1 r3 started",
            "post running o1",
            "persist-record o1 r4 running_acknowledged",
            "read-record o2",
            "post start-failure o2",
            "persist-record o2 r3 start_failure_acknowledged",
            "read-record o3",
            "post running o3",
            "persist-record o3 r4 running_acknowledged",
        ])[..]
    );
    let first_pull = trail.iter().position(|l| l == "read-claim").unwrap();
    let last_page = trail
        .iter()
        .position(|l| l == "list-inbox after o4")
        .unwrap();
    assert!(last_page < first_pull, "{trail:#?}");
    // The settled record of the last page gets one receipt cleanup (a crash between its durable
    // acknowledgement and the removal must not leave the capability on disk; found by the crash
    // campaign), then the first active page follows.
    assert_eq!(
        trail[last_page + 1..last_page + 4],
        lines(&["read-record o5", "remove-receipt attempt-5", "list-inbox"])[..],
        "{trail:#?}"
    );
}

/// An active tick supervises its page (completion first, then lease control) before it pulls.
#[test]
fn supervises_a_bounded_active_page_before_pulling_new_work() {
    let mut world = World::new(2, vec![OfferTemplate::sample(2)]);
    world.seed(1, testkit::record(1, State::RunningAcknowledged), true);
    let mut sim = with_slots(world, 2);
    sim.run(3);
    assert_eq!(
        sim.commands()[2..13],
        lines(&[
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "read-record o1",
            "inspect-supervision o1",
            "post lease-control o1",
            "persist-record o1 r5 running_acknowledged",
            "read-claim",
            "draw-entropy",
            "persist-claim r0",
            "post offers",
        ])[..]
    );
}

/// Supervision that records lease loss latches fail-closed before the Pull of the same tick:
/// no Pull follows, in that tick or later.
#[test]
fn fails_closed_before_pull_when_active_supervision_records_lease_loss() {
    let mut world = World::new(2, vec![OfferTemplate::sample(2)]);
    world.seed(1, testkit::record(1, State::RunningAcknowledged), true);
    let mut sim = with_slots(world, 2);
    // No renewal (the seeded lease expires at 30 020 ms) and nothing to pull yet.
    sim.on(On::Post(Operation::LeaseControl), Answer::Unavailable);
    sim.on(On::Post(Operation::Offers), Answer::Idle);
    sim.run(3);
    sim.take_trail();
    sim.advance_to(ms(30_020));
    sim.tick();
    sim.settle();
    sim.run(2);
    assert_eq!(
        sim.commands(),
        lines(&[
            "post heartbeat",
            "list-inbox",
            "read-record o1",
            "read-record o1",
            "stop o1",
            "persist-record o1 r5 recovery_required",
            "list-inbox",
            "list-inbox",
        ])
    );
    assert!(sim.worker.fail_closed().is_some());
}

/// A `recovery_required` record found at startup latches fail-closed: the Worker never pulls.
#[test]
fn fails_closed_on_durable_recovery_evidence_and_never_pulls_again() {
    let mut world = World::new(2, vec![OfferTemplate::sample(2)]);
    world.seed(1, testkit::record(1, State::RecoveryRequired), false);
    let mut sim = with_slots(world, 4);
    sim.run(6);
    let trail = sim.commands();
    assert!(!trail.iter().any(|l| l == "read-claim"), "{trail:#?}");
    assert_eq!(trail[..2], lines(&["post register", "list-inbox"])[..]);
    assert!(sim.worker.fail_closed().is_some());
}

/// Ticks are coalesced: one that arrives while work is in flight, or before the wake-up time,
/// does nothing. A drain requested while a Pull is in flight lets that one command finish (the
/// core cannot abort I/O; the driver's request timeout bounds it) but starts no further Pull;
/// the Worker goes `draining`, then `offline`, and stops, so the driver releases the owner lock.
#[test]
fn coalesces_ticks_and_aborts_a_pending_pull_before_releasing_ownership() {
    let mut sim = with_slots(World::new(1, Vec::new()), 1);
    sim.run(2);
    sim.tick();
    sim.answer(Answer::Ok); // list-inbox
    assert!(sim.act().is_some_and(|a| act::kind(a) == "read-claim"));
    let pending = sim.pending_canonical();
    sim.worker.handle(sim.clock(), Input::Tick).unwrap();
    sim.poll();
    assert_eq!(
        sim.pending_canonical(),
        pending,
        "a tick during a Pull is coalesced"
    );
    sim.worker
        .handle(sim.clock(), Input::DrainRequested)
        .unwrap();
    sim.poll();
    sim.settle();
    assert_eq!(sim.status, Status::Stopped(StopReason::Drained));
    // Early ticks before the drain changed nothing either.
    assert_eq!(
        sim.commands(),
        lines(&[
            "post register",
            "list-inbox",
            "list-inbox",
            "read-claim",
            "draw-entropy",
            "persist-claim r0",
            "post offers",
            "clear-claim r0",
            "post transition",
            "post transition",
        ])
    );
    let mut idle = with_slots(World::new(1, Vec::new()), 1);
    idle.run(3);
    let before = idle.commands().len();
    idle.tick(); // before the wake-up time: nothing.
    idle.settle();
    assert_eq!(idle.commands().len(), before);
}

/// Draining stops Pulls but keeps supervising (and keeps the journal) until every record is
/// settled; only then does the Worker go offline and stop.
#[test]
fn draining_aborts_pull_but_keeps_ownership_until_final_stop() {
    let mut world = World::new(2, vec![OfferTemplate::sample(2)]);
    world.seed(1, testkit::record(1, State::RunningAcknowledged), true);
    let mut sim = with_slots(world, 2);
    sim.run(2);
    sim.take_trail();
    sim.request_drain();
    sim.settle();
    sim.run(2);
    assert!(
        matches!(sim.status, Status::Idle(_)),
        "still owning: {:?}",
        sim.status
    );
    sim.event(Event::Exit {
        index: 0,
        code: 0,
        receipt: ReceiptKind::Genuine,
    });
    sim.run(2);
    let trail = sim.commands();
    assert!(!trail.iter().any(|l| l == "read-claim"), "{trail:#?}");
    assert_eq!(
        trail,
        lines(&[
            "drain requested",
            "post transition",
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "read-record o1",
            "inspect-supervision o1",
            "post lease-control o1",
            "persist-record o1 r5 running_acknowledged",
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "read-record o1",
            "inspect-supervision o1",
            "post lease-control o1",
            "persist-record o1 r6 running_acknowledged",
            "Exit { index: 0, code: 0, receipt: Genuine }",
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "inspect-log o1",
            "upload-log o1",
            "read-record o1",
            "post completion o1",
            "persist-record o1 r7 completion_acknowledged",
            "remove-receipt attempt-1",
            "post transition",
        ])
    );
    assert_eq!(sim.status, Status::Stopped(StopReason::Drained));
}
