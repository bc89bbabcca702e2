//! The lifecycle tick's timers and budgets (`core/src/worker.rs`) that the other scenarios
//! do not reach, found by mutation testing (`docs/mutation.md`): the drain budget's end, a
//! renewal or heartbeat that falls between two cadence ticks, a renewal timer that comes while
//! the Run is still starting (or during a rejoin, set again once the start path ends), no
//! heartbeat before reconciliation finishes, and the lease version a lost start-path renewal
//! may have left. Driven through the whole Worker against the simulated host; the exact
//! commands are asserted.

use ql_worker_core::facts::Fact;
use ql_worker_core::io::{Action, Input, StopOutcome};
use ql_worker_core::listing::Capacity;
use ql_worker_core::pull::{PullFault, PullResult};
use ql_worker_core::record::State;
use ql_worker_core::supervision::SupervisionResult;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::route::Operation;
use ql_worker_core::wire::session::SessionStatus;
use ql_worker_core::worker::{CallFault, Uncertainty, WorkerConfig};
use ql_worker_sim::testkit::act;
use ql_worker_sim::testkit::sim::{On, Sim, Status};
use ql_worker_sim::testkit::world::{Answer, Event, Mutation, OfferTemplate, ReceiptKind, World};
use ql_worker_sim::testkit::{self};

fn ms(v: u64) -> UnixMillis {
    UnixMillis::new(v).unwrap()
}

fn count(trail: &[String], line: &str) -> usize {
    trail.iter().filter(|l| *l == line).count()
}

fn lines(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_string()).collect()
}

/// A recording simulation of the model configuration changed by `tune`, holding o1 in `state`
/// (its process running when `running`), from 1 000 ms.
fn sim_with(state: State, running: bool, tune: impl FnOnce(&mut WorkerConfig)) -> Sim {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, state), running);
    let mut config = testkit::explore::model_config();
    tune(&mut config);
    Sim::new(config, world, ms(1_000)).recording()
}

/// The drain budget (5 s here) ends with the Run still in flight: the Worker says so
/// (`DrainBudgetEnded`) and its next supervision pass stops the Run by identity, without a
/// lease-control call.
#[test]
fn the_end_of_the_drain_budget_stops_the_run_still_in_flight() {
    let mut sim = sim_with(State::RunningAcknowledged, true, |c| {
        c.drain_budget_ms = 5_000;
    });
    sim.run(2);
    sim.worker.report_facts();
    sim.request_drain();
    sim.settle();
    sim.run(3); // 1 000, 3 000, 5 000: renewed.
    sim.take_trail();
    sim.run(1); // 6 000: the budget ends.
    assert_eq!(
        sim.take_trail(),
        lines(&[
            "tick 6000",
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "read-record o1",
            "stop o1",
        ])
    );
    let facts: Vec<Fact> = std::iter::from_fn(|| sim.worker.poll_fact())
        .filter(|f| matches!(f, Fact::DrainBudgetEnded { .. } | Fact::Supervise { .. }))
        .collect();
    let ended = facts
        .iter()
        .position(|f| *f == Fact::DrainBudgetEnded { in_flight: 1 })
        .unwrap_or_else(|| panic!("{facts:#?}"));
    assert!(
        matches!(
            &facts[ended + 1..],
            [Fact::Supervise {
                result: SupervisionResult::DrainStopped(StopOutcome::Stopped),
                ..
            }]
        ),
        "{facts:#?}"
    );
}

/// o1's renewal pass at the tick of 6 000 ms, renewing its lease.
const RENEWED_AT_6000: [&str; 7] = [
    "tick 6000",
    "read-record o1",
    "read-receipt attempt-1",
    "read-record o1",
    "inspect-supervision o1",
    "post lease-control o1",
    "persist-record o1 r6 running_acknowledged",
];

/// Timers come between cadence ticks (every 3 s here, from 1 000 ms): the renewal due 5 s after
/// the one sent at 1 000 ms starts at 6 000 ms on its own (a supervision pass of o1, no
/// listing), and the heartbeat due 10 s after the registration at 11 000 ms; neither waits for
/// the next tick.
#[test]
fn a_renewal_and_a_heartbeat_due_between_ticks_start_when_due() {
    let mut sim = sim_with(State::RunningAcknowledged, true, |c| {
        c.lease_control_interval_ms = 5_000;
        c.cadence_ms = 3_000;
    });
    sim.run(4); // 1 000 (register, reconcile, supervise: renewed), 4 000 (paced).
    assert_eq!(
        sim.take_trail().last().map(String::as_str),
        Some("read-record o1")
    );
    sim.run(1);
    assert_eq!(sim.take_trail(), lines(&RENEWED_AT_6000));
    sim.run(2); // 7 000, 10 000: paced.
    sim.take_trail();
    sim.run(1);
    let trail = sim.take_trail();
    assert_eq!(trail[..2], lines(&["tick 11000", "post heartbeat"])[..]);
}

/// A Run that ends drops its renewal timer: the lease renewed at 1 000 ms would be due again at
/// 6 000 ms, but the Run completes at 4 000 ms (its process exited with a genuine receipt; the
/// completion comes first in the supervision pass), so
/// the Worker next wakes for its cadence tick at 7 000 ms, not for a renewal of a settled Run.
/// (The three forgets of `Worker::run_ended` were missed by the mutation run of stop 47.)
#[test]
fn a_run_that_ends_drops_its_renewal_timer() {
    let mut sim = sim_with(State::RunningAcknowledged, true, |c| {
        c.lease_control_interval_ms = 5_000;
        c.cadence_ms = 3_000;
    });
    sim.run(3); // 1 000: register, reconcile, supervise (renewed: the next renewal due at 6 000).
    sim.event(Event::Exit {
        index: 0,
        code: 0,
        receipt: ReceiptKind::Genuine,
    });
    sim.run(1); // 4 000: the completion pass.
    assert_eq!(sim.first_record().state, State::CompletionAcknowledged);
    assert!(
        sim.commands()
            .iter()
            .any(|l| l == "remove-receipt attempt-1"),
        "{:#?}",
        sim.commands()
    );
    sim.take_trail();
    sim.run(1);
    let trail = sim.take_trail();
    assert_eq!(
        trail.first().map(String::as_str),
        Some("tick 7000"),
        "{trail:#?}"
    );
}

/// The renewal timer of the lease renewed at 1 000 ms (before the starting ACK) comes at
/// 6 500 ms while the starting ACK is in flight: the Run is not running yet, so no supervision
/// pass is queued for it (the start path renews before its running ACK itself).
#[test]
fn a_renewal_timer_that_comes_while_the_run_is_starting_is_dropped() {
    let mut sim = sim_with(State::Accepted, false, |c| {
        c.lease_control_interval_ms = 5_000;
    });
    sim.run(1);
    // Two outstanding commands: ticks come while the starting ACK is in flight.
    sim.window = 2;
    sim.tick();
    for _ in 0..100 {
        if sim.commands().last().map(String::as_str) == Some("post starting o1") {
            break;
        }
        sim.answer(Answer::Ok);
    }
    sim.take_trail();
    sim.advance_to(ms(6_500));
    sim.tick();
    sim.settle();
    assert_eq!(
        sim.take_trail(),
        lines(&[
            "tick 6500",
            "list-inbox",
            "persist-record o1 r2 starting_acknowledged",
            "draw-entropy",
            "allocate-log o1",
            "persist-record o1 r3 launching",
            "spawn o1",
            "persist-record o1 r4 started",
            "read-record o1",
            "post lease-control o1",
            "persist-record o1 r5 started",
            "read-record o1",
            "post running o1",
            "persist-record o1 r6 running_acknowledged",
            "read-record o1",
        ])
    );
}

/// The renewal timer of the lease renewed at 1 000 ms (before the starting ACK) is due at
/// 6 000 ms, after the start path's last renewal. The running ACK is in flight from 1 000 ms
/// (the control plane applied it; its answer comes late); the heartbeat at 4 000 ms is fenced,
/// and the Worker registers again: the timer comes at 6 000 ms during that rejoin and is dropped.
/// The register is answered, the page listed after it fails (nothing learned, no supervision
/// queued), and then the running ACK's answer arrives: the Run got past its start path, its
/// renewal timer is set again (already due), and a supervision pass renews the lease at once,
/// not at the next cadence tick (20 s here) nor with the next heartbeat (7 000 ms).
#[test]
fn a_renewal_timer_dropped_during_a_rejoin_is_set_again_after_the_start_path() {
    let mut sim = sim_with(State::Accepted, false, |c| {
        c.lease_control_interval_ms = 5_000;
        c.heartbeat_interval_ms = 3_000;
        c.cadence_ms = 20_000;
    });
    sim.run(1);
    sim.tick();
    for _ in 0..100 {
        match sim.act() {
            Some(a) if act::is_post(a, Operation::Running) => break,
            Some(_) => sim.answer(Answer::Ok),
            None => panic!("no running ACK: {:#?}", sim.commands()),
        }
    }
    // The running ACK goes out of the simulation: performed now, its answer fed later.
    let (id, ack) = sim.pending.take().expect("the running ACK");
    let outcome = sim.world.perform(sim.now, &ack, Answer::Ok);
    sim.status = Status::Idle(None);
    sim.poll();
    sim.settle();
    // 4 000 ms: the active tick's page fails (nothing learned), the heartbeat is fenced, and
    // the register of the rejoin stays outstanding.
    sim.advance_to(ms(4_000));
    sim.tick();
    for _ in 0..100 {
        match (sim.act(), &sim.status) {
            (Some(a), _) if act::is_post(a, Operation::Register) => break,
            (Some(a), _) if act::is_post(a, Operation::Heartbeat) => sim.answer(Answer::Fenced),
            (Some(a), _) if act::kind(a) == "list-inbox" => sim.answer(Answer::Unchanged),
            (Some(_), _) => sim.answer(Answer::Ok),
            (None, Status::Idle(Some(at))) if *at <= sim.now => sim.tick(),
            (None, _) => panic!("no rejoin: {:#?}", sim.commands()),
        }
    }
    sim.take_trail();
    assert!(sim.worker.admission_paused(), "rejoining");
    sim.advance_to(ms(6_000));
    sim.worker.handle(sim.clock(), Input::Tick).unwrap();
    sim.poll();
    sim.on(On::Kind("list-inbox"), Answer::Unchanged);
    sim.settle();
    sim.worker
        .handle(sim.clock(), Input::Outcome { id, outcome })
        .unwrap();
    sim.poll();
    sim.settle();
    assert_eq!(
        sim.take_trail(),
        lines(&["list-inbox", "persist-record o1 r5 running_acknowledged"])
    );
    sim.run(1);
    assert_eq!(sim.take_trail(), lines(&RENEWED_AT_6000));
}

/// While startup reconciliation has not finished (its listing keeps failing), the heartbeat
/// timer (due at 11 000 ms) plans nothing: the tick's heartbeat belongs to the active phase.
#[test]
fn no_heartbeat_is_planned_before_reconciliation_finishes() {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, State::RunningAcknowledged), true);
    let mut sim = Sim::scenario(world);
    for _ in 0..7 {
        sim.on(On::Kind("list-inbox"), Answer::Unchanged);
    }
    sim.run(8);
    assert_eq!(
        sim.commands(),
        lines(&[
            "post register",
            "list-inbox",
            "list-inbox",
            "list-inbox",
            "list-inbox",
            "list-inbox",
            "list-inbox",
            "list-inbox",
        ])
    );
}

/// Two start-path renewals whose answers are lost after the control plane committed them (at
/// version 0, then, after a fence, at version 1): the control plane may hold version 2, which
/// the Worker remembers from the second. The third pass is fenced at 0 and at 1 and catches up
/// at 2; the Run then starts under the renewed lease (version 3).
#[test]
fn a_lost_start_path_renewal_is_caught_up_to_the_version_it_may_have_left() {
    let mut sim = sim_with(State::Accepted, false, |c| {
        c.lease_control_interval_ms = 5_000;
    });
    sim.on(On::Post(Operation::LeaseControl), Answer::LostAfterCommit);
    sim.on(On::Post(Operation::LeaseControl), Answer::Ok);
    sim.on(On::Post(Operation::LeaseControl), Answer::LostAfterCommit);
    sim.run(4);
    let trail = sim.commands();
    let starting = trail.iter().position(|l| l == "post starting o1").unwrap();
    let calls = trail[..starting]
        .iter()
        .filter(|l| *l == "post lease-control o1")
        .count();
    assert_eq!(calls, 1 + 2 + 3, "{trail:#?}");
    assert_eq!(
        trail[starting - 5..=starting],
        lines(&[
            "post lease-control o1",
            "post lease-control o1",
            "post lease-control o1",
            "persist-record o1 r1 accepted",
            "read-record o1",
            "post starting o1",
        ])[..],
        "{trail:#?}"
    );
    let record = sim.first_record();
    assert_eq!(record.state, State::RunningAcknowledged);
    assert_eq!(record.offer.lease.version.get(), 3);
}

/// A rejoin (the heartbeat at 11 000 ms was fenced) whose register gets no answer backs off
/// (6 s base here: the retry is due at exactly 17 000 ms): the ticks at 13 000 and 15 000 ms
/// send no register, the one at 17 000 ms does.
#[test]
fn a_rejoin_waits_out_its_register_backoff() {
    let mut sim = sim_with(State::RunningAcknowledged, true, |c| {
        c.backoff_base_ms = 6_000
    });
    sim.worker.report_facts();
    sim.on(On::Post(Operation::Heartbeat), Answer::Fenced);
    sim.on(On::Post(Operation::Register), Answer::Ok);
    sim.on(On::Post(Operation::Register), Answer::Unavailable);
    while sim.now < ms(11_000) {
        sim.run(1);
    }
    sim.run(1); // 11 000 again: the rejoin's register.
    let registers = |trail: &[String]| trail.iter().filter(|l| *l == "post register").count();
    assert_eq!(registers(&sim.take_trail()), 2);
    let retry = std::iter::from_fn(|| sim.worker.poll_fact()).find_map(|f| match f {
        Fact::RegisterRetry { retry_in_ms, .. } => Some(retry_in_ms),
        _ => None,
    });
    assert_eq!(retry, Some(6_000));
    for (at, sent) in [(13_000, 0), (15_000, 0), (17_000, 1)] {
        sim.run(1);
        let trail = sim.take_trail();
        assert_eq!(trail[0], format!("tick {at}"));
        assert_eq!(registers(&trail), sent, "{trail:#?}");
    }
}

/// The removal of a completed Run's receipt fails (nothing removed): the receipt holds the
/// completion capability, so the next tick retries the cleanup (a pass of its own, ahead of the
/// supervision page) and the receipt is gone.
#[test]
fn a_receipt_whose_removal_failed_is_removed_at_the_next_tick() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.event(Event::Exit {
        index: 0,
        code: 0,
        receipt: ReceiptKind::Genuine,
    });
    sim.on(On::Kind("remove-receipt"), Answer::Unchanged);
    sim.run(1);
    assert_eq!(sim.first_record().state, State::CompletionAcknowledged);
    assert_eq!(sim.world.disk.receipts.len(), 1);
    sim.take_trail();
    sim.run(1);
    assert_eq!(
        sim.take_trail()[..3],
        lines(&["tick 3000", "read-record o1", "remove-receipt attempt-1"])[..]
    );
    assert!(sim.world.disk.receipts.is_empty());
}

/// A tick that comes while the supervision page is still being listed (the driver ticks
/// whenever its timer says, here with the listing outstanding) does not list it a second time.
#[test]
fn a_page_still_being_listed_is_not_listed_again() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.advance_to(ms(3_000));
    sim.tick();
    assert_eq!(sim.act().map(act::kind), Some("list-inbox"));
    sim.advance_to(ms(5_000));
    sim.worker.handle(sim.clock(), Input::Tick).unwrap();
    sim.settle();
    let trail = sim.take_trail();
    assert_eq!(
        trail.iter().filter(|l| *l == "list-inbox").count(),
        1,
        "{trail:#?}"
    );
}

/// A Pull that got no answer backs off for its jittered delay (9 ms with the test kit's
/// entropy): with a 9 ms cadence, the tick at exactly the end of the backoff (1 009 ms) pulls.
#[test]
fn a_pull_backoff_ends_at_its_exact_time() {
    let world = World::new(1, vec![OfferTemplate::sample(1)]);
    let mut config = testkit::explore::model_config();
    config.cadence_ms = 9;
    let mut sim = Sim::new(config, world, ms(1_000)).recording();
    sim.worker.report_facts();
    sim.on(On::Post(Operation::Offers), Answer::Unavailable);
    sim.run(3); // 1 000: register, reconcile, supervise and Pull (no answer).
    let retry = std::iter::from_fn(|| sim.worker.poll_fact()).find_map(|f| match f {
        Fact::Pull(PullResult::Failed { retry_in_ms, .. }) => Some(retry_in_ms),
        _ => None,
    });
    assert_eq!(retry, Some(9));
    sim.take_trail();
    sim.run(1);
    let trail = sim.take_trail();
    assert_eq!(
        trail[..3],
        lines(&["tick 1009", "list-inbox", "read-claim"])[..],
        "{trail:#?}"
    );
}

/// An `offers` answer cut short (not the contract's JSON) is an uncertain outcome, as a damaged
/// answer to any other call is: the control plane may have granted the offer, so the claim is
/// kept for the retry (no clear), and the fact says so rather than "breaks the contract".
#[test]
fn a_truncated_offers_answer_is_an_uncertain_outcome_and_keeps_the_claim() {
    let world = World::new(1, vec![OfferTemplate::sample(1)]);
    let mut sim = Sim::new(testkit::explore::model_config(), world, ms(1_000)).recording();
    sim.worker.report_facts();
    sim.on(On::Post(Operation::Offers), Answer::Truncated);
    sim.run(3); // 1 000: register, reconcile, supervise and Pull (its answer cut short).
    let fault = std::iter::from_fn(|| sim.worker.poll_fact()).find_map(|f| match f {
        Fact::Pull(PullResult::Failed { fault, .. }) => Some(fault),
        _ => None,
    });
    assert!(
        matches!(
            fault,
            Some(PullFault::Call(CallFault::Uncertain(Uncertainty::Garbled(
                _
            ))))
        ),
        "{fault:?}"
    );
    let trail = sim.commands();
    let pulled = trail.iter().position(|l| l == "post offers").unwrap();
    assert!(
        !trail[pulled..].iter().any(|l| l.starts_with("clear-claim")),
        "{trail:#?}"
    );
}

/// Recovery evidence on o2 (`launch_outcome_unknown`) latches fail-closed: the `accepted` o1
/// is not launched (no starting ACK), and the heartbeats offer no slot, although three of the
/// four are free.
#[test]
fn a_fail_closed_worker_launches_nothing_and_offers_no_slot() {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, State::Accepted), false);
    world.seed(2, testkit::record(2, State::RecoveryRequired), false);
    let mut config = testkit::explore::model_config();
    config.max_concurrent_runs = 4;
    let mut sim = Sim::new(config, world, ms(1_000)).recording();
    while sim.now < ms(21_000) {
        sim.run(1);
    }
    let trail = sim.commands();
    assert!(trail.iter().any(|l| l == "read-record o1"), "{trail:#?}");
    assert!(
        !trail.iter().any(|l| l.starts_with("post starting")),
        "{trail:#?}"
    );
    let slots: Vec<u64> = sim
        .stream
        .iter()
        .flatten()
        .filter_map(|action| match act::post(action) {
            Some((Operation::Heartbeat, call)) => {
                serde_json::from_slice::<serde_json::Value>(&call.body)
                    .ok()
                    .and_then(|v| v["availableSlots"].as_u64())
            }
            _ => None,
        })
        .collect();
    assert_eq!(slots, vec![0, 0], "{trail:#?}");
}

/// A Session found draining (a previous start's unfinished drain) is replaced only once none
/// of its Runs is live: a `launch_outcome_unknown` record may still be completed from a receipt,
/// so it keeps the old Session (no new one is stored) as a running Run does.
#[test]
fn a_retiring_session_is_kept_while_a_launch_outcome_unknown_run_remains() {
    let mut world = World::new(1, Vec::new());
    world.seed(5, testkit::record(5, State::RecoveryRequired), false);
    world.plane.session_status = SessionStatus::Draining;
    let mut sim = Sim::scenario(world);
    sim.run(4);
    assert!(sim.worker.retiring());
    let trail = sim.commands();
    assert!(trail.iter().any(|l| l == "read-record o5"), "{trail:#?}");
    assert!(!trail.iter().any(|l| l == "persist-session"), "{trail:#?}");
}

/// Fences count only in a row: four heartbeats fenced, each followed (after registering again)
/// by an answered heartbeat, never halt the Worker (a run of more than three would).
#[test]
fn fences_separated_by_answered_heartbeats_do_not_add_up() {
    let mut sim = Sim::scenario(World::new(1, Vec::new()));
    sim.run(2);
    for _ in 0..4 {
        sim.on(On::Post(Operation::Heartbeat), Answer::Fenced);
        sim.on(On::Post(Operation::Heartbeat), Answer::Ok);
    }
    for _ in 0..60 {
        sim.run(1);
    }
    let trail = sim.commands();
    assert!(matches!(sim.status, Status::Idle(_)), "{:?}", sim.status);
    assert!(count(&trail, "post heartbeat") >= 8, "{trail:#?}");
    assert_eq!(count(&trail, "post register"), 1 + 4, "{trail:#?}");
}

/// The first registration is not a rejoin: no `Rejoined` fact at startup.
#[test]
fn the_first_registration_reports_no_rejoin() {
    let mut sim = Sim::scenario(World::new(1, Vec::new()));
    sim.worker.report_facts();
    sim.run(3);
    let facts: Vec<Fact> = std::iter::from_fn(|| sim.worker.poll_fact()).collect();
    assert!(
        facts.iter().any(|f| matches!(f, Fact::Session(_))),
        "{facts:#?}"
    );
    assert!(!facts.contains(&Fact::Rejoined), "{facts:#?}");
}

/// Three heartbeats fenced in a row (each after registering again) are within the limit: the
/// Worker goes on (the fourth would halt it: `plain_fences_in_a_row_still_halt`).
#[test]
fn three_fences_in_a_row_do_not_halt() {
    let mut sim = Sim::scenario(World::new(1, Vec::new()));
    sim.run(2);
    for _ in 0..3 {
        sim.on(On::Post(Operation::Heartbeat), Answer::Fenced);
    }
    for _ in 0..60 {
        sim.run(1);
    }
    let trail = sim.commands();
    assert!(matches!(sim.status, Status::Idle(_)), "{:?}", sim.status);
    assert_eq!(count(&trail, "post register"), 1 + 3, "{trail:#?}");
}

/// A heartbeat that got no answer and cannot have taken effect (`Unavailable`, unlike a lost
/// answer) does not excuse the fence that follows it: four such fences in a row halt.
#[test]
fn a_fence_after_an_unavailable_heartbeat_still_counts() {
    let mut sim = Sim::scenario(World::new(1, Vec::new()));
    sim.run(2);
    for _ in 0..4 {
        sim.on(On::Post(Operation::Heartbeat), Answer::Unavailable);
        sim.on(On::Post(Operation::Heartbeat), Answer::Fenced);
    }
    for _ in 0..80 {
        sim.run(1);
        if matches!(sim.status, Status::Halted(_)) {
            break;
        }
    }
    assert!(
        matches!(sim.status, Status::Halted(_)),
        "{:?}: {:#?}",
        sim.status,
        sim.commands()
    );
}

/// A supervision page of exactly a page's worth of live Runs (4) leaves the next page to the
/// next tick (only a page with fewer live records than that goes on at once): one listing per
/// tick.
#[test]
fn a_page_full_of_live_runs_leaves_the_next_page_to_the_next_tick() {
    let mut world = World::new(5, Vec::new());
    for n in 1..=5 {
        world.seed(n, testkit::record(n, State::RunningAcknowledged), true);
    }
    let mut config = testkit::explore::model_config();
    config.max_concurrent_runs = 8;
    let mut sim = Sim::new(config, world, ms(1_000)).recording();
    sim.run(4); // 1 000: register, reconcile (two pages), supervise o1-o4.
    sim.take_trail();
    sim.run(1);
    let trail = sim.take_trail(); // 3 000: the second page (o5) only.
    let listings = trail.iter().filter(|l| l.starts_with("list-inbox")).count();
    assert_eq!(listings, 1, "{trail:#?}");
    assert!(
        trail.iter().any(|l| l == "post lease-control o5"),
        "{trail:#?}"
    );
}

/// A Pull that got no answer leaves its claim pending (the retry resumes it, and it may still
/// bring a record): the heartbeats offer one slot less than the inbox room would allow (capacity
/// 2, two slots: one offered).
#[test]
fn a_pending_claim_takes_a_place_from_the_slots_offered() {
    let world = World::new(1, vec![OfferTemplate::sample(1)]);
    let mut config = testkit::explore::model_config();
    config.max_concurrent_runs = 2;
    config.capacity = Capacity::new(2).unwrap();
    let mut sim = Sim::new(config, world, ms(1_000)).recording();
    for _ in 0..20 {
        sim.on(On::Post(Operation::Offers), Answer::Unavailable);
    }
    while sim.now < ms(11_000) {
        sim.run(1);
    }
    let slots: Vec<u64> = sim
        .stream
        .iter()
        .flatten()
        .filter_map(|action| match act::post(action) {
            Some((Operation::Heartbeat, call)) => {
                serde_json::from_slice::<serde_json::Value>(&call.body)
                    .ok()
                    .and_then(|v| v["availableSlots"].as_u64())
            }
            _ => None,
        })
        .collect();
    assert_eq!(slots, vec![1], "{:#?}", sim.commands());
}

/// A control plane that registers every Session draining (a hostile or broken one: the
/// reference registers a new Session online) gets a new Session at once the first time, then
/// only after a backoff that doubles (1 s, 2 s, 4 s, … from the edge profile's 1 s base, up to
/// 60 s): before, the Worker stored a new Session id and registered it again as fast as the
/// control plane answered, a durable write each time (found by the walks with the control plane
/// of `Mutation::SessionStaysDraining`: 400,000 renewals without time passing).
#[test]
fn a_session_a_previous_incarnation_drained_is_renewed_without_a_backoff() {
    // The backoff is for renewals into draining Sessions, not for the first renewal.
    let mut world = World::new(1, Vec::new());
    world.plane.session_status = SessionStatus::Draining;
    let mut sim = Sim::scenario(world);
    let start = sim.now.get();
    sim.answer_until(|a| matches!(a, Action::PersistSession { .. }));
    assert_eq!(sim.now.get(), start, "the renewal waited");
    sim.answer(Answer::Ok);
    sim.run(3);
    assert_eq!(sim.world.plane.session_status, SessionStatus::Online);
    sim.assert_no_violations();
}

#[test]
fn a_session_renewed_into_another_draining_session_is_renewed_again_only_after_a_backoff() {
    let mut world = World::new(1, Vec::new());
    world.plane.session_status = SessionStatus::Draining;
    world.mutation = Some(Mutation::SessionStaysDraining);
    let mut sim = Sim::scenario(world);
    let mut renewed_at = Vec::new();
    for _ in 0..6 {
        sim.answer_until(|a| matches!(a, Action::PersistSession { .. }));
        renewed_at.push(sim.now.get());
        sim.answer(Answer::Ok);
    }
    let gaps: Vec<u64> = renewed_at.windows(2).map(|w| w[1] - w[0]).collect();
    // Each wait is at least the backoff (the renewal goes out at the first tick after it).
    for (i, gap) in gaps.iter().enumerate() {
        let backoff = 1_000u64 << i;
        assert!(
            *gap >= backoff,
            "renewals at {renewed_at:?}: gap {i} under {backoff} ms"
        );
    }
    // The waits grow (the first two round up to the 2 s tick): here 2, 2, 4, 8, 16 s.
    assert!(gaps.windows(2).all(|w| w[1] >= w[0]), "{renewed_at:?}");
    assert!(gaps.last().is_some_and(|g| *g >= 16_000), "{renewed_at:?}");
    sim.assert_no_violations();
}
