//! Issue 14 against the simulated host: Pull bursts while slots and room remain, a supervisor's
//! exit offering its freed slot at once, no Pull without room in the inbox (and no slot offered
//! that the inbox could not store), retention's removals freeing room, and a start that finds
//! its Session draining: its live Runs finish under it, then a new Session takes work.

use ql_worker_core::io::{Action, Input, OpId};
use ql_worker_core::listing::Capacity;
use ql_worker_core::record::State;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::route::Operation;
use ql_worker_core::wire::session::SessionStatus;
use ql_worker_core::worker::Output;
use ql_worker_sim::testkit::act;
use ql_worker_sim::testkit::sim::{On, Sim, Status};
use ql_worker_sim::testkit::world::{
    Answer, Event, OfferTemplate, ProcessState, ReceiptKind, World,
};
use ql_worker_sim::testkit::{self};

fn ms(v: u64) -> UnixMillis {
    UnixMillis::new(v).unwrap()
}

fn sim(world: World, slots: u16, capacity: u64) -> Sim {
    let mut config = testkit::config();
    config.max_concurrent_runs = slots;
    config.capacity = Capacity::new(capacity).unwrap();
    Sim::new(config, world, ms(1_000)).recording()
}

fn count(trail: &[String], line: &str) -> usize {
    trail.iter().filter(|l| *l == line).count()
}

/// The offer id the control plane handed out for Run `n` (offer ids are drawn by the Worker).
fn offer_of(sim: &Sim, n: u32) -> ql_worker_core::ids::OfferId {
    sim.world
        .plane
        .runs
        .iter()
        .find(|(_, run)| run.n == n)
        .map(|(id, _)| id.clone())
        .unwrap_or_else(|| panic!("no offer for run {n}"))
}

fn offers(n: u32) -> World {
    World::new(1, (1..=n).map(OfferTemplate::sample).collect())
}

/// The `availableSlots` of every heartbeat sent so far.
fn heartbeat_slots(sim: &Sim) -> Vec<u64> {
    sim.stream
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
        .collect()
}

#[test]
fn one_tick_pulls_until_the_slots_are_full_and_a_freed_slot_is_offered_at_once() {
    let mut sim = sim(offers(3), 2, 64);
    sim.run(3);
    let trail = sim.commands();
    // Register, reconcile, then one active tick: two Pulls back to back (both slots), no third.
    assert_eq!(count(&trail, "post offers"), 2, "{trail:#?}");
    assert_eq!(count(&trail, "spawn o1") + count(&trail, "spawn o2"), 2);
    assert!(!trail.iter().any(|l| l == "spawn o3"));
    let first = trail.iter().position(|l| l == "post offers").unwrap();
    let spawn = trail.iter().position(|l| l == "spawn o1").unwrap();
    let second = trail.iter().rposition(|l| l == "post offers").unwrap();
    assert!(
        first < spawn && spawn < second,
        "the burst Pulls after the offer started"
    );

    // o1's process exits: without waiting for a tick, its completion runs and the freed slot
    // takes o3 (the clock has not moved).
    sim.take_trail();
    let now = sim.now;
    sim.event(Event::Exit {
        index: 0,
        code: 0,
        receipt: ReceiptKind::Genuine,
    });
    sim.notify(Input::ProcessExited {
        offer_id: offer_of(&sim, 1),
    });
    sim.settle();
    assert_eq!(sim.now, now);
    let trail = sim.commands();
    let completed = trail
        .iter()
        .position(|l| l.contains("o1") && l.ends_with("completion_acknowledged"))
        .unwrap_or_else(|| panic!("o1 completed: {trail:#?}"));
    let spawned = trail.iter().position(|l| l == "spawn o3").unwrap();
    assert!(completed < spawned);
    sim.assert_no_violations();
}

#[test]
fn an_idle_answer_ends_the_burst() {
    let mut sim = sim(offers(1), 4, 64);
    sim.run(3);
    let trail = sim.commands();
    // The first Pull gets o1, the burst's second is answered idle, and no third follows.
    assert_eq!(count(&trail, "post offers"), 2, "{trail:#?}");
    assert_eq!(count(&trail, "spawn o1"), 1);
}

#[test]
fn a_full_inbox_takes_no_offer_and_offers_no_slot_until_retention_frees_a_place() {
    let mut world = offers(1);
    world.seed(7, testkit::record(7, State::CompletionAcknowledged), false);
    world.seed(
        8,
        testkit::record(8, State::StartFailureAcknowledged),
        false,
    );
    let mut sim = sim(world, 2, 2);
    // Past the heartbeat interval (10 s at a 2 s cadence), so a heartbeat reports the slots.
    sim.run(8);
    let trail = sim.commands();
    assert!(
        !trail
            .iter()
            .any(|l| l.starts_with("persist-claim") || l == "post offers"),
        "no Pull without room: {trail:#?}"
    );
    // Only the start's check of the pending claim (there is none) reads it.
    assert_eq!(count(&trail, "read-claim"), 1, "{trail:#?}");
    let status = sim.worker.inbox_status();
    assert!(status.full && status.full_deferrals >= 5, "{status:?}");
    assert_eq!((status.records, status.capacity, status.settled), (2, 2, 2));
    // Two free slots, but no place to store an offer: the heartbeat offers none.
    let slots = heartbeat_slots(&sim);
    assert!(
        !slots.is_empty() && slots.iter().all(|s| *s == 0),
        "{slots:?}"
    );

    // A report about a record retention did not remove, or a live one, changes nothing.
    sim.notify(Input::RecordRemoved {
        offer_id: testkit::offer_id(99),
    });
    assert_eq!(sim.worker.inbox_status().records, 2);

    // Retention removes one settled record and reports it: the next tick Pulls (after a
    // heartbeat reporting the freed slot, since the last one said none).
    sim.world.disk.records.remove(&testkit::offer_id(7));
    sim.notify(Input::RecordRemoved {
        offer_id: testkit::offer_id(7),
    });
    sim.take_trail();
    sim.run(1);
    let trail = sim.commands();
    let beat = trail.iter().position(|l| l == "post heartbeat");
    let pull = trail.iter().position(|l| l == "post offers");
    assert!(beat.is_some() && beat < pull, "{trail:#?}");
    assert_eq!(count(&trail, "spawn o1"), 1);
    assert_eq!(heartbeat_slots(&sim).last(), Some(&1));
    // Full again (o1 and o8): no second Pull.
    assert_eq!(count(&trail, "post offers"), 1);
    assert!(sim.worker.inbox_status().full);
    sim.assert_no_violations();
}

/// The claim of a stored offer whose clear did not land, in an inbox that the offer filled:
/// retention keeps a record its claim names, and the Pull that would clear the claim waits for
/// room, so before, the inbox stayed full for good and the second Run was never taken (found
/// by the walks behind a small inbox). Now a full inbox with such a claim gets a claim-only
/// Pull (read the claim, find its offer stored, clear it; no claim written, no `offers`), then
/// retention frees the place and work goes on.
#[test]
fn a_claim_left_by_a_failed_clear_does_not_keep_a_full_inbox_full() {
    let mut world = offers(2);
    world.disk.capacity = 1;
    let mut sim = sim(world, 1, 1);
    sim.retention = true;
    sim.on(On::Kind("clear-claim"), Answer::Unchanged);
    for _ in 0..40 {
        if let Some(index) = sim
            .world
            .supervisor
            .processes
            .iter()
            .position(|p| p.state == ProcessState::Running)
        {
            sim.event(Event::Exit {
                index,
                code: 0,
                receipt: ReceiptKind::Genuine,
            });
        }
        sim.run(1);
    }
    let trail = sim.commands();
    // The claim-only Pull: no claim written, no `offers`; then retention removes o1.
    let check = ["read-claim", "read-record o1", "clear-claim r0"].map(String::from);
    let checked = trail.windows(3).position(|w| w == check);
    let removed = trail.iter().position(|l| l == "retention removed o1");
    assert!(
        checked.is_some() && removed.is_some() && checked < removed,
        "the claim is cleared, then o1 removed: {trail:#?}"
    );
    assert_eq!(count(&trail, "spawn o2"), 1, "{trail:#?}");
    // o2 completed (and retention removed it in turn).
    let o2 = offer_of(&sim, 2);
    let stored = sim.world.disk.records.values().map(|(r, _)| r);
    let completed = stored
        .chain(&sim.retained)
        .any(|r| r.offer.offer_id == o2 && r.state == State::CompletionAcknowledged);
    assert!(completed, "{trail:#?}");
    sim.assert_no_violations();
}

#[test]
fn a_session_found_draining_finishes_its_live_runs_then_a_new_session_takes_work() {
    let mut world = offers(1);
    world.seed(5, testkit::record(5, State::RunningAcknowledged), true);
    // A previous start's drain did not finish: the control plane holds the Session draining.
    world.plane.session_status = SessionStatus::Draining;
    let mut sim = sim(world, 2, 64);
    sim.run(4);
    let trail = sim.commands();
    assert!(sim.worker.retiring());
    assert!(
        !trail
            .iter()
            .any(|l| l == "persist-session" || l == "post offers"),
        "no new Session and no Pull while o5 runs: {trail:#?}"
    );
    assert!(
        trail.iter().any(|l| l == "post lease-control o5"),
        "o5 supervised"
    );

    // o5 ends: completed under the old Session, then the new Session, then work.
    sim.take_trail();
    sim.event(Event::Exit {
        index: 0,
        code: 0,
        receipt: ReceiptKind::Genuine,
    });
    sim.run(5);
    let trail = sim.commands();
    let at = |line: &str| {
        trail
            .iter()
            .position(|l| l == line)
            .unwrap_or_else(|| panic!("{line} in {trail:#?}"))
    };
    let completed = trail
        .iter()
        .position(|l| l.starts_with("persist-record o5") && l.ends_with("completion_acknowledged"))
        .unwrap();
    let persisted = at("persist-session");
    let registered = at("post register");
    let pulled = at("post offers");
    assert!(completed < persisted && persisted < registered && registered < pulled);
    assert_eq!(count(&trail, "spawn o1"), 1);
    let new = sim
        .world
        .session_id
        .clone()
        .expect("a new Session id stored");
    assert_ne!(new, testkit::worker().session_id);
    assert_eq!(sim.worker.session_id(), &new);
    assert!(!sim.worker.retiring());
    let o1 = sim.world.disk.record(&offer_of(&sim, 1)).unwrap().clone();
    assert_eq!(
        o1.offer.worker.session_id, new,
        "o1 belongs to the new Session"
    );
    sim.assert_no_violations();

    // A crash now restarts on the stored (new) Session: nothing is replaced again.
    sim.crash();
    sim.take_trail();
    sim.run(3);
    assert!(!sim.commands().iter().any(|l| l == "persist-session"));
    assert!(!sim.worker.retiring());
}

#[test]
fn a_drain_asked_for_at_this_start_is_not_a_retiring_session() {
    let mut world = offers(1);
    world.plane.session_status = SessionStatus::Draining;
    let mut sim = sim(world, 2, 64);
    sim.request_drain();
    sim.run(4);
    assert!(!sim.worker.retiring());
    assert!(!sim.commands().iter().any(|l| l == "persist-session"));
}

/// Every command the Worker issues until it is idle, none answered: a driver whose storage
/// answers come late (the core accepts outcomes in any order), so the lanes stay busy.
fn issue_all(sim: &mut Sim) -> Vec<(OpId, Action)> {
    let mut issued = Vec::new();
    for _ in 0..64 {
        match sim.worker.poll_output() {
            Output::Command(command) => issued.push((command.id, command.action)),
            Output::Idle { .. } => return issued,
            other => panic!("the Worker ended: {other:?}"),
        }
    }
    panic!("more than 64 commands at once: {issued:?}")
}

/// Answers `command` as the world does, healthily.
fn answer_ok(sim: &mut Sim, (id, action): (OpId, Action)) {
    let outcome = sim.world.perform(sim.now, &action, Answer::Ok);
    sim.worker
        .handle(sim.clock(), Input::Outcome { id, outcome })
        .expect("a valid outcome");
}

/// An admitted offer is processed before the next Pull goes out, even while its processing
/// waits for an offer lane: here both are held by receipt removals of settled Runs (slot
/// count 2), whose answers come late. The burst's Pull waits behind the processing; it does not
/// overtake it.
#[test]
fn a_pull_does_not_overtake_an_admitted_offer_waiting_for_an_offer_lane() {
    let mut sim = sim(offers(2), 2, 64);
    sim.run(3);
    // o1 and o2 run; both exit, complete, and their receipt removals fail: both receipts wait
    // for the next tick's cleanup.
    sim.on(On::Kind("remove-receipt"), Answer::Unchanged);
    sim.on(On::Kind("remove-receipt"), Answer::Unchanged);
    for (index, n) in [(0, 1), (1, 2)] {
        sim.event(Event::Exit {
            index,
            code: 0,
            receipt: ReceiptKind::Genuine,
        });
        sim.notify(Input::ProcessExited {
            offer_id: offer_of(&sim, n),
        });
        sim.settle();
    }
    for n in [1, 2] {
        let record = sim.world.disk.record(&offer_of(&sim, n)).unwrap();
        assert_eq!(record.state, State::CompletionAcknowledged);
    }
    // The control plane has a third Run now. The next tick: both cleanups (o1, o2), a
    // supervision page, and a Pull, all at once.
    sim.world
        .plane
        .templates
        .push_back(OfferTemplate::sample(3));
    if let Status::Idle(Some(wake)) = sim.status {
        sim.advance_to(wake);
    }
    sim.worker.handle(sim.clock(), Input::Tick).unwrap();
    let mut held = issue_all(&mut sim);
    let kinds: Vec<&str> = held.iter().map(|(_, a)| act::kind(a)).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "read-record").count(),
        2,
        "both cleanups began: {kinds:?}"
    );
    assert!(kinds.contains(&"read-claim"), "{kinds:?}");
    // Only the Pull is answered, until it has stored o3 and cleared its claim.
    let mut pull = held
        .iter()
        .position(|(_, a)| matches!(a, Action::ReadClaim))
        .map(|i| held.remove(i));
    let mut after = Vec::new();
    while let Some(command) = pull.take() {
        let cleared = matches!(command.1, Action::ClearClaim { .. });
        answer_ok(&mut sim, command);
        let mut issued = issue_all(&mut sim);
        if cleared {
            after = issued;
            break;
        }
        assert_eq!(issued.len(), 1, "the Pull's next step alone: {issued:?}");
        pull = issued.pop();
    }
    let o3 = offer_of(&sim, 3);
    assert_eq!(
        sim.world.disk.record(&o3).map(|r| r.state),
        Some(State::Accepted)
    );
    // o3's processing waits for an offer lane (two slots, both lanes busy), and so does the
    // next Pull: nothing goes out.
    assert!(
        after.is_empty(),
        "nothing may overtake o3's processing: {after:?}"
    );
    // The cleanups are answered: o3's processing comes first, and no Pull while it runs.
    let mut order = Vec::new();
    for _ in 0..64 {
        let Some(command) = held.pop() else { break };
        answer_ok(&mut sim, command);
        let issued = issue_all(&mut sim);
        order.extend(issued.iter().map(|(_, a)| sim.world.summary(a)));
        held.extend(issued);
        if order.iter().any(|l| l.starts_with("read-claim")) {
            break;
        }
    }
    let processing = order
        .iter()
        .position(|l| l == "read-record o3")
        .unwrap_or_else(|| panic!("o3 processed: {order:#?}"));
    let next_pull = order.iter().position(|l| l == "read-claim");
    assert!(
        next_pull.is_none_or(|p| p > processing),
        "the next Pull after o3's processing began: {order:#?}"
    );
    sim.assert_no_violations();
}

/// A claim a failed Pull kept takes one place of the inbox's room in the slots a heartbeat
/// offers (it may still bring a record); once a Pull admits its offer the claim is gone, and
/// that place is offered again.
#[test]
fn a_claim_admitted_gives_back_the_place_it_held_in_the_slots_offered() {
    // Four slots, room for three records: the room is what bounds the slots offered.
    let mut sim = sim(offers(1), 4, 3);
    sim.on(On::Post(Operation::Offers), Answer::Unavailable);
    let mut rounds = 0;
    while !sim
        .world
        .disk
        .records
        .values()
        .any(|r| r.0.state == State::RunningAcknowledged)
    {
        sim.run(1);
        rounds += 1;
        assert!(rounds < 20, "{:#?}", sim.commands());
    }
    let trail = sim.commands();
    assert_eq!(
        count(&trail, "post offers"),
        3,
        "failed, admitted, idle: {trail:#?}"
    );
    // The next heartbeat: one record stored, no claim left (a kept claim would take a place).
    let sent = heartbeat_slots(&sim).len();
    while heartbeat_slots(&sim).len() == sent {
        sim.run(1);
        rounds += 1;
        assert!(rounds < 40, "{:#?}", sim.commands());
    }
    assert_eq!(
        heartbeat_slots(&sim).last(),
        Some(&2),
        "min(4 - 1 Run, 3 - 1 record)"
    );
}

/// A claim check that found the claim's offer not stored settles the question for as long as
/// the inbox stays full: no further claim-only Pull reads the claim (a Pull with room retries
/// the claim itself). Here a previous incarnation left a claim whose `offers` call failed and
/// an inbox it filled since; the start's first check cannot read the claim (the claim counts
/// as kept and unchecked), the second finds its offer not stored.
#[test]
fn a_claim_found_not_stored_is_not_checked_again_while_the_inbox_stays_full() {
    let mut world = offers(1);
    world.seed(7, testkit::record(7, State::CompletionAcknowledged), false);
    let mut sim = sim(world, 1, 2);
    sim.on(On::Post(Operation::Offers), Answer::Unavailable);
    sim.run(3);
    assert!(sim.world.disk.claim.is_some(), "{:#?}", sim.commands());
    sim.crash();
    sim.world.seed(
        8,
        testkit::record(8, State::StartFailureAcknowledged),
        false,
    );
    sim.on(On::Kind("read-claim"), Answer::Unchanged);
    sim.take_trail();
    sim.run(10);
    let trail = sim.commands();
    assert_eq!(count(&trail, "read-claim"), 2, "{trail:#?}");
    let (kept, _) = sim.world.disk.claim.as_ref().unwrap();
    let read = format!("read-record {}", kept.offer_id.as_str());
    assert_eq!(
        count(&trail, &read),
        1,
        "its offer looked up once: {trail:#?}"
    );
    assert!(!trail.iter().any(|l| l == "post offers"), "{trail:#?}");
    assert!(sim.worker.inbox_status().full);
    sim.assert_no_violations();
}
