//! Edges of the Worker machine itself (`core/src/worker.rs` outside its tick) that the other
//! scenarios do not reach, found by mutation testing (`docs/mutation.md`): refused credentials
//! pausing admission, which records hold a drain, and the bounded queue of facts. Driven
//! through the whole Worker against the simulated host.

use ql_worker_core::io::{Action, HttpFailure, Input, OpId, Outcome};
use ql_worker_core::record::State;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::route::Operation;
use ql_worker_core::worker::StopReason;
use ql_worker_sim::testkit;
use ql_worker_sim::testkit::act;
use ql_worker_sim::testkit::sim::{Sim, Status};
use ql_worker_sim::testkit::world::{Answer, World};

fn ms(v: u64) -> UnixMillis {
    UnixMillis::new(v).unwrap()
}

fn is_post(op: Operation) -> impl Fn(&Action) -> bool {
    move |action| act::is_post(action, op)
}

fn pulls(sim: &Sim) -> usize {
    sim.commands()
        .iter()
        .filter(|c| c.starts_with("post offers"))
        .count()
}

/// Credentials refused (401 on a Pull) pause admission: until a call is answered again, no
/// Pull goes out, however many ticks pass; the next answered call (the heartbeat) lifts the
/// pause and the Pulls resume (SPEC: refused credentials stop new work, never running work).
#[test]
fn refused_credentials_pause_the_pulls_until_a_call_is_answered() {
    let mut sim = Sim::scenario(World::new(1, Vec::new()));
    sim.answer_until(is_post(Operation::Offers));
    sim.deliver(Outcome::Http(HttpFailure::Status {
        status: 401,
        code: Some("worker_credential_invalid".into()),
    }));
    assert!(sim.worker.admission_paused());
    let before = pulls(&sim);
    // Ticks until the heartbeat is outstanding: no Pull meanwhile.
    sim.answer_until(is_post(Operation::Heartbeat));
    assert!(sim.worker.admission_paused());
    assert_eq!(pulls(&sim), before, "{:#?}", sim.commands());
    sim.answer(Answer::Ok);
    assert!(!sim.worker.admission_paused());
    sim.answer_until(is_post(Operation::Offers));
    sim.assert_no_violations();
}

/// A record that never crossed the spawn barrier and whose lease has expired (dormant) holds
/// no process and can never progress: it does not hold a drain, which ends at once (not at the
/// end of the 60 s budget), `Drained`.
#[test]
fn a_dormant_record_does_not_hold_a_drain() {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, State::Accepted), false);
    // The sample lease expires at 30 020 ms: dormant from the start.
    let mut sim = Sim::new(testkit::explore::model_config(), world, ms(40_000)).recording();
    sim.run(3);
    assert_eq!(sim.worker.in_flight(), 0);
    sim.request_drain();
    let asked = sim.now;
    for _ in 0..20 {
        if matches!(sim.status, Status::Stopped(_)) {
            break;
        }
        sim.run(1);
    }
    assert_eq!(sim.status, Status::Stopped(StopReason::Drained));
    assert!(
        sim.now.get() < asked.get() + 10_000,
        "stopped at {} ms, asked at {} ms",
        sim.now.get(),
        asked.get()
    );
}

/// Before the drain budget ends, a record that may still be launched (`accepted`, lease
/// valid) and a `launch_outcome_unknown` record (a receipt may still complete it) hold the
/// drain. The `accepted` one holds it until its lease expires (30 020 ms; dormant then), and
/// the drain ends `Drained`; the `launch_outcome_unknown` one until the budget ends (60 s),
/// after which this Worker can no longer settle it, and the drain ends `Unsettled`.
#[test]
fn launchable_and_launch_unknown_records_hold_a_drain() {
    for (state, reason) in [
        (State::Accepted, StopReason::Drained),
        (State::RecoveryRequired, StopReason::Unsettled),
    ] {
        let mut world = World::new(1, Vec::new());
        world.seed(1, testkit::record(1, state), false);
        let mut sim = Sim::scenario(world);
        // Asked while the register is in flight: no launch ever begins, so the `accepted`
        // record stays as it is.
        sim.answer_until(is_post(Operation::Register));
        let asked = sim.now.get();
        sim.worker
            .handle(sim.clock(), Input::DrainRequested)
            .unwrap();
        sim.answer(Answer::Ok);
        sim.run(2);
        assert_eq!(sim.worker.in_flight(), 1, "{state:?}");
        let budget_end = asked + sim.config.drain_budget_ms;
        for _ in 0..100 {
            if matches!(sim.status, Status::Stopped(_)) {
                break;
            }
            sim.run(1);
        }
        assert_eq!(sim.status, Status::Stopped(reason), "{state:?}");
        let stopped = sim.now.get();
        match state {
            State::Accepted => assert!(
                (30_020..budget_end).contains(&stopped),
                "stopped at {stopped} ms"
            ),
            _ => assert!(stopped >= budget_end, "stopped at {stopped} ms"),
        }
        assert_eq!(sim.worker.in_flight(), 0, "{state:?}");
    }
}

/// Facts the driver does not take are bounded: past 1,024 queued the oldest are dropped and
/// counted, exactly; taking the queue leaves the count as it is.
#[test]
fn facts_not_taken_are_dropped_oldest_first_and_counted() {
    let mut sim = Sim::scenario(World::new(1, Vec::new()));
    sim.worker.report_facts();
    for _ in 0..5_000 {
        if sim.worker.facts_dropped() >= 3 {
            break;
        }
        sim.run(1);
    }
    let dropped = sim.worker.facts_dropped();
    assert!(dropped >= 3, "only {dropped} dropped");
    let queued = std::iter::from_fn(|| sim.worker.poll_fact()).count();
    assert_eq!(queued, 1_024);
    assert_eq!(sim.worker.facts_dropped(), dropped);
}

/// What the driver reads of the Worker for its status and metrics: the Session as the control
/// plane last confirmed it (none before the register is answered), and every record it knows
/// with its last known state.
#[test]
fn the_session_and_the_known_records_are_what_the_worker_last_saw() {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, State::RunningAcknowledged), true);
    let mut sim = Sim::scenario(world);
    assert!(sim.worker.session().is_none());
    assert!(sim.worker.known_records().is_empty());
    sim.run(2);
    let session = sim.worker.session().expect("registered");
    assert_eq!(session.worker.worker_id, testkit::worker().worker_id);
    assert_eq!(
        session.status,
        ql_worker_core::wire::session::SessionStatus::Online
    );
    let known: Vec<(String, State)> = sim
        .worker
        .known_records()
        .iter()
        .map(|(id, state)| (id.as_str().to_owned(), *state))
        .collect();
    assert_eq!(
        known,
        vec![(
            testkit::offer_id(1).as_str().to_owned(),
            State::RunningAcknowledged
        )]
    );
}

/// Two running Runs and one slot: o1's lease-control call is taken out of the simulation (the
/// world has performed it; its id and outcome are returned, to be fed later) while o2's pass
/// waits in the queue.
fn two_runs_one_held() -> (Sim, OpId, Outcome) {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, State::RunningAcknowledged), true);
    world.seed(2, testkit::record(2, State::RunningAcknowledged), true);
    let mut sim = Sim::scenario(world);
    assert_eq!(sim.config.max_concurrent_runs, 1);
    sim.run(2);
    sim.answer_until(is_post(Operation::LeaseControl));
    let (id, act) = sim.pending.take().expect("lease control outstanding");
    let outcome = sim.world.perform(sim.now, &act, Answer::Ok);
    (sim, id, outcome)
}

/// A tick overdue by a whole cadence while work is still queued is planned between two
/// commands: here one Run's lease control is held 12 s (past two cadences and the heartbeat's
/// due time) while the other Run's pass waits for the only slot; the heartbeat goes out before
/// that pass, not after the queue has drained (no stream of queued work starves the Session).
#[test]
fn an_overdue_tick_is_planned_between_commands_while_work_is_queued() {
    let (mut sim, id, outcome) = two_runs_one_held();
    let from = sim.commands().len();
    let later = sim.now.saturating_add(12_000);
    sim.advance_to(later);
    sim.worker
        .handle(sim.clock(), Input::Outcome { id, outcome })
        .unwrap();
    sim.status = Status::Idle(None);
    sim.poll();
    sim.settle();
    let after: Vec<String> = sim.commands()[from..].to_vec();
    let heartbeat = after.iter().position(|c| c == "post heartbeat");
    let second_pass = after
        .iter()
        .position(|c| c.starts_with("post lease-control o2"));
    assert!(
        heartbeat.is_some() && second_pass.is_some() && heartbeat < second_pass,
        "{after:#?}"
    );
}

/// The `availableSlots` of each heartbeat body.
fn heartbeat_slots(sim: &Sim) -> Vec<u64> {
    sim.stream
        .iter()
        .flatten()
        .filter_map(|a| match act::post(a) {
            Some((Operation::Heartbeat, call)) => {
                let v: serde_json::Value = serde_json::from_slice(&call.body).expect("JSON body");
                v["availableSlots"].as_u64()
            }
            _ => None,
        })
        .collect()
}

/// An online Session's heartbeat offers the free slots (one here: one slot, nothing running),
/// and the Worker takes them as reported: the Pulls that follow go out at the cadence without
/// a heartbeat before each (one is needed only after a report of no slot).
#[test]
fn an_online_heartbeat_offers_the_free_slots() {
    let mut sim = Sim::scenario(World::new(1, Vec::new()));
    sim.answer_until(is_post(Operation::Heartbeat));
    sim.answer(Answer::Ok);
    let slots = heartbeat_slots(&sim);
    assert_eq!(slots.last(), Some(&1), "{slots:?}");
    sim.settle();
    let from = sim.commands().len();
    for _ in 0..3 {
        let at = sim.now.saturating_add(2_000);
        sim.advance_to(at);
        sim.tick();
        sim.settle();
    }
    let after: Vec<String> = sim.commands()[from..].to_vec();
    assert_eq!(
        after.iter().filter(|c| *c == "post offers").count(),
        3,
        "{after:#?}"
    );
    assert!(!after.iter().any(|c| c == "post heartbeat"), "{after:#?}");
}

/// A register again after a fence offers no slot (admission is paused while it runs): the
/// control plane then offers nothing to the Session, so the first Pull after it is preceded by
/// a heartbeat that reports the free slot.
#[test]
fn after_registering_again_a_heartbeat_reports_the_slots_before_the_next_pull() {
    let mut sim = Sim::scenario(World::new(1, Vec::new()));
    sim.answer_until(is_post(Operation::Heartbeat));
    sim.answer(Answer::Fenced);
    sim.answer_until(is_post(Operation::Register));
    let from = sim.commands().len() - 1;
    sim.answer(Answer::Ok);
    sim.answer_until(is_post(Operation::Offers));
    let after: Vec<String> = sim.commands()[from..].to_vec();
    let heartbeat = after.iter().position(|c| c == "post heartbeat");
    let pull = after.iter().position(|c| c == "post offers");
    assert!(
        heartbeat.is_some() && heartbeat < pull,
        "a heartbeat before the Pull: {after:#?}"
    );
    assert_eq!(heartbeat_slots(&sim).last(), Some(&1));
}

/// Driver notifications about records are checked against what the Worker knows: a
/// supervisor's exit for a settled record plans no pass (nothing is read), and a removal
/// report for a live record is ignored (only settled records are ever removed).
#[test]
fn notifications_about_the_wrong_records_change_nothing() {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, State::CompletionAcknowledged), false);
    world.seed(2, testkit::record(2, State::RunningAcknowledged), true);
    let mut sim = Sim::scenario(world);
    sim.run(3);
    let from = sim.commands().len();
    sim.notify(Input::ProcessExited {
        offer_id: testkit::offer_id(1),
    });
    sim.settle();
    let commands: Vec<String> = sim.commands()[from..]
        .iter()
        .filter(|c| !c.starts_with("ProcessExited"))
        .cloned()
        .collect();
    assert!(commands.is_empty(), "{commands:#?}");
    sim.notify(Input::RecordRemoved {
        offer_id: testkit::offer_id(2),
    });
    assert_eq!(
        sim.worker.known_records().get(&testkit::offer_id(2)),
        Some(&State::RunningAcknowledged)
    );
}

/// A drain asked before the Session was ever registered (nothing in flight) stops the Worker
/// at once, `NotRegistered`: an unreachable control plane must not hold a stop for the whole
/// drain budget.
#[test]
fn a_drain_before_any_register_stops_at_once() {
    let mut sim = Sim::scenario(World::new(1, Vec::new()));
    sim.request_drain();
    assert_eq!(sim.status, Status::Stopped(StopReason::NotRegistered));
    assert_eq!(sim.commands(), vec!["drain requested".to_owned()]);
}

/// At most `max_concurrent_runs` offers have an operation in progress at once (one here): while
/// one Run's pass waits for its lease-control answer, the other Run's pass does not begin.
#[test]
fn one_slot_runs_one_offer_operation_at_a_time() {
    let (mut sim, id, outcome) = two_runs_one_held();
    sim.status = Status::Idle(None);
    let from = sim.commands().len();
    sim.poll();
    sim.settle();
    let meanwhile: Vec<String> = sim.commands()[from..].to_vec();
    assert!(
        !meanwhile.iter().any(|c| c.contains("o2")),
        "{meanwhile:#?}"
    );
    sim.worker
        .handle(sim.clock(), Input::Outcome { id, outcome })
        .unwrap();
    sim.poll();
    sim.settle();
    assert!(
        sim.commands()[from..]
            .iter()
            .any(|c| c == "post lease-control o2"),
        "{:#?}",
        sim.commands()
    );
}

/// An offer whose lane is busy waits, whatever the free slots: with two slots, a supervision
/// pass of a `started` Run in flight (its supervisor exited), the start-path work the next
/// page plans for the same Run does not begin beside it (one operation per record).
#[test]
fn work_for_an_offer_whose_lane_is_busy_waits_for_it() {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, State::Started), true);
    let mut config = testkit::explore::model_config();
    config.max_concurrent_runs = 2;
    let mut sim = Sim::new(config, world, ms(1_000)).recording();
    // The running ACK never gets an answer: the record stays `started`.
    for _ in 0..20 {
        sim.on(
            testkit::sim::On::Post(Operation::Running),
            Answer::Unavailable,
        );
    }
    sim.run(3);
    sim.notify(Input::ProcessExited {
        offer_id: testkit::offer_id(1),
    });
    let (id, act) = sim.pending.take().expect("the exit's pass began");
    let outcome = sim.world.perform(sim.now, &act, Answer::Ok);
    sim.status = Status::Idle(None);
    let at = sim.now.saturating_add(2_000);
    sim.advance_to(at);
    sim.tick();
    sim.settle();
    sim.assert_no_violations();
    sim.worker
        .handle(sim.clock(), Input::Outcome { id, outcome })
        .expect("the pass's outcome is still expected");
    sim.poll();
    sim.settle();
    sim.assert_no_violations();
}
