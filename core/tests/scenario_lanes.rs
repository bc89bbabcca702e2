//! Issue 16: no Run and no Session is starved by another call. The Worker keeps several commands
//! outstanding, one per lane (the Session, the Pull, each offer, and a lease renewal beside an
//! offer's log upload), and takes their outcomes in any order. Each scenario holds one command
//! outstanding (the simulated control plane performs it when it goes out, as a real one
//! authorizes an upload from its header, and its outcome is fed later) and asserts what goes out
//! meanwhile.

use ql_worker_core::io::{Action, Input, InputError, OpId, Outcome, StopOutcome};
use ql_worker_core::record::State;
use ql_worker_core::wire::route::Operation;
use ql_worker_sim::testkit::act;
use ql_worker_sim::testkit::sim::{Sim, Status};
use ql_worker_sim::testkit::world::{Answer, Event, ReceiptKind};

/// Takes the outstanding command out of the simulation: the world performs it now; its outcome
/// is returned to be fed later. The simulation is left idle, with the command in flight.
fn hold(sim: &mut Sim) -> (OpId, Action, Outcome) {
    let (id, act) = sim.pending.take().expect("a command is outstanding");
    let outcome = sim.world.perform(sim.now, &act, Answer::Ok);
    sim.status = Status::Idle(None);
    sim.poll();
    (id, act, outcome)
}

/// Feeds the outcome of a command [`hold`] took out, as its answer arriving late.
fn release(sim: &mut Sim, id: OpId, outcome: Outcome) {
    sim.worker
        .handle(sim.clock(), Input::Outcome { id, outcome })
        .expect("the held command's outcome is expected");
    sim.poll();
}

/// Answers commands until `matches` is outstanding; returns whether it came.
fn until(sim: &mut Sim, matches: impl Fn(&Action) -> bool) -> bool {
    for _ in 0..200 {
        match sim.act() {
            Some(act) if matches(act) => return true,
            Some(_) => sim.answer(Answer::Ok),
            None => return false,
        }
    }
    false
}

/// Advances the clock by `ms` and ticks, answering everything that goes out meanwhile.
fn tick_after(sim: &mut Sim, ms: u64) {
    let at = sim.now.saturating_add(ms);
    sim.advance_to(at);
    sim.tick();
    sim.settle();
}

fn posts(sim: &Sim, operation: Operation) -> Vec<u64> {
    sim.stream
        .iter()
        .flatten()
        .filter_map(|a| match act::post(a) {
            Some((op, call)) if op == operation => {
                let v: serde_json::Value = serde_json::from_slice(&call.body).expect("JSON body");
                Some(v["expectedLeaseVersion"].as_u64().unwrap_or(u64::MAX))
            }
            _ => None,
        })
        .collect()
}

fn position(sim: &Sim, line: &str) -> Option<usize> {
    sim.commands().iter().position(|l| l.starts_with(line))
}

/// o1's process exits; its completion pass (at the next tick, 2 s on) runs until its log
/// upload is outstanding.
fn exit_until_upload(sim: &mut Sim) {
    sim.event(Event::Exit {
        index: 0,
        code: 0,
        receipt: ReceiptKind::Genuine,
    });
    let at = sim.now.saturating_add(2_000);
    sim.advance_to(at);
    sim.tick();
    assert!(
        until(sim, |a| matches!(a, Action::UploadLog { .. })),
        "{:#?}",
        sim.commands()
    );
}

/// A log upload that outlasts several supervision passes: the Run's lease is renewed beside it
/// (a renewal-only pass in the offer's lease lane), the heartbeat goes out, and the completion
/// that follows the upload names the lease as it is then.
#[test]
fn a_long_upload_keeps_its_lease_and_the_session_alive() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    exit_until_upload(&mut sim);
    let version_at_upload = sim.first_record().offer.lease.version.get();
    let (upload, _, uploaded) = hold(&mut sim);
    // Three passes and a heartbeat while the upload is in flight.
    for _ in 0..6 {
        tick_after(&mut sim, 2_000);
        assert!(sim.pending.is_none(), "{:#?}", sim.commands());
    }
    let renewed = sim.first_record();
    assert_eq!(
        renewed.state,
        State::RunningAcknowledged,
        "not completed yet"
    );
    assert!(
        renewed.offer.lease.version.get() >= version_at_upload + 3,
        "renewed beside the upload: v{} -> v{}\n{:#?}",
        version_at_upload,
        renewed.offer.lease.version.get(),
        sim.commands()
    );
    assert!(
        sim.commands().iter().any(|l| l == "post heartbeat"),
        "the heartbeat went out during the upload: {:#?}",
        sim.commands()
    );
    // The upload's answer arrives: the record is read again and completion names the lease
    // the renewals left.
    release(&mut sim, upload, uploaded);
    sim.settle();
    let record = sim.first_record();
    assert_eq!(
        record.state,
        State::CompletionAcknowledged,
        "{:#?}",
        sim.commands()
    );
    assert_eq!(
        posts(&sim, Operation::Completion),
        vec![renewed.offer.lease.version.get()],
        "one completion, under the renewed lease"
    );
    let upload_at = position(&sim, "upload-log o1").expect("an upload");
    let renewal_at = sim
        .commands()
        .iter()
        .enumerate()
        .skip(upload_at)
        .find(|(_, l)| *l == "post lease-control o1")
        .map(|(i, _)| i)
        .expect("a renewal after the upload went out");
    let completion_at = position(&sim, "post completion o1").expect("a completion");
    assert!(upload_at < renewal_at && renewal_at < completion_at);
    sim.assert_no_violations();
}

/// A Run's lease-control call without an answer yet does not hold the Session back: the
/// heartbeat goes out and is answered, then the late renewal answer is taken.
#[test]
fn a_slow_renewal_does_not_hold_the_heartbeat() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    let at = sim.now.saturating_add(2_000);
    sim.advance_to(at);
    sim.tick();
    assert!(until(&mut sim, |a| act::is_post(
        a,
        Operation::LeaseControl
    )));
    let (renewal, _, renewed) = hold(&mut sim);
    let before = sim.commands().len();
    tick_after(&mut sim, 12_000);
    let meanwhile: Vec<String> = sim.commands()[before..].to_vec();
    assert!(
        meanwhile.iter().any(|l| l == "post heartbeat"),
        "{meanwhile:#?}"
    );
    assert!(
        !meanwhile.iter().any(|l| l == "post lease-control o1"),
        "one operation per offer: no second renewal while one is in flight: {meanwhile:#?}"
    );
    release(&mut sim, renewal, renewed);
    sim.settle();
    // The held renewal (v0 -> v1), then the pass that waited in the queue behind it.
    assert_eq!(
        posts(&sim, Operation::LeaseControl),
        vec![0, 1],
        "{:#?}",
        sim.commands()
    );
    assert_eq!(sim.first_record().offer.lease.version.get(), 2);
    sim.assert_no_violations();
}

/// Outcomes are correlated by id: one that answers no outstanding command is refused and
/// changes nothing; the same inputs in the same order give the same commands.
#[test]
fn an_outcome_for_no_outstanding_command_is_refused() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    let at = sim.now.saturating_add(2_000);
    sim.advance_to(at);
    sim.tick();
    let (id, _) = sim.pending.clone().expect("a command");
    let stranger = OpId(id.0 + 1_000);
    let refused = sim.worker.handle(
        sim.clock(),
        Input::Outcome {
            id: stranger,
            outcome: Outcome::Persisted,
        },
    );
    assert_eq!(refused, Err(InputError::UnexpectedOutcome { id: stranger }));
    sim.settle();
    sim.assert_no_violations();
}

/// An outcome of another kind than its command's (a driver bug: a stop result for a record
/// write, say) is refused with a typed error before any operation sees it, and changes nothing:
/// the command stays outstanding, its real outcome is taken afterwards, and the same inputs give
/// the same commands as a run without the stray outcome.
#[test]
fn an_outcome_of_another_kind_is_refused_and_the_command_stays_outstanding() {
    let run = |stray: bool| {
        let mut sim = Sim::holding(State::RunningAcknowledged);
        let at = sim.now.saturating_add(2_000);
        sim.advance_to(at);
        sim.tick();
        let (id, act) = sim.pending.clone().expect("a command");
        if stray {
            let wrong = if matches!(act, Action::Stop { .. }) {
                Outcome::Persisted
            } else {
                Outcome::Stopped(StopOutcome::Stopped)
            };
            let refused = sim
                .worker
                .handle(sim.clock(), Input::Outcome { id, outcome: wrong });
            assert_eq!(refused, Err(InputError::OutcomeMismatch { id }));
            assert_eq!(sim.worker.phase(), ql_worker_core::worker::Phase::Active);
        }
        sim.settle();
        tick_after(&mut sim, 10_000);
        sim.assert_no_violations();
        sim.commands()
    };
    let clean = run(false);
    assert!(
        clean.iter().any(|c| c.contains("lease")),
        "the Run's lease is controlled: {clean:#?}"
    );
    assert_eq!(run(true), clean);
}

/// While a renewal runs beside an offer's upload, the offer's own next step waits for it: both
/// write the record, whose revisions are one sequence. The upload's answer comes first; nothing
/// of the offer's lane goes out until the renewal is answered, then completion follows.
#[test]
fn an_offer_waits_for_the_renewal_beside_its_upload() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    exit_until_upload(&mut sim);
    let (upload, _, uploaded) = hold(&mut sim);
    let mut beside = false;
    for _ in 0..10 {
        let at = sim.now.saturating_add(2_000);
        sim.advance_to(at);
        sim.tick();
        if until(&mut sim, is_renewal) {
            beside = true;
            break;
        }
    }
    assert!(beside, "{:#?}", sim.commands());
    let (renewal, _, renewed) = hold(&mut sim);
    release(&mut sim, upload, uploaded);
    assert!(
        sim.pending.is_none(),
        "the offer's next step waits for the renewal: {:?}",
        sim.pending
    );
    released_and_completed(&mut sim, renewal, renewed);
}

/// A Sim holding o1 `running_acknowledged`, registered and reconciled, with `edit` applied to
/// the scenario configuration.
fn holding_with(edit: impl FnOnce(&mut ql_worker_core::worker::WorkerConfig)) -> Sim {
    let mut world = ql_worker_sim::testkit::world::World::new(1, Vec::new());
    world.seed(
        1,
        ql_worker_sim::testkit::record(1, State::RunningAcknowledged),
        true,
    );
    let mut config = ql_worker_sim::testkit::explore::model_config();
    edit(&mut config);
    let start = sim_ms(1_000);
    let mut sim = Sim::new(config, world, start).recording();
    sim.run(2);
    sim.take_trail();
    sim
}

fn sim_ms(v: u64) -> ql_worker_core::time::UnixMillis {
    ql_worker_core::time::UnixMillis::new(v).unwrap()
}

/// Advances to each wake-up and ticks (answering every other command) until `matches` is
/// outstanding; returns the time it went out.
fn when(sim: &mut Sim, matches: impl Fn(&Action) -> bool) -> u64 {
    sim.answer_until(matches);
    sim.now.get()
}

fn is_renewal(action: &Action) -> bool {
    act::is_post(action, Operation::LeaseControl)
}

/// A Sim holding o1 with lease control every 5 s and a cadence of `cadence_ms`, after a renewal
/// it obtained: the lease (30 s) has a local clock from then. Returns the Sim and the time that
/// renewal went out.
fn renewed_with_cadence(cadence_ms: u64) -> (Sim, u64) {
    let mut sim = holding_with(|c| {
        c.cadence_ms = cadence_ms;
        c.lease_control_interval_ms = 5_000;
    });
    let granted = when(&mut sim, is_renewal);
    sim.answer(Answer::Ok);
    sim.settle();
    (sim, granted)
}

/// o1's process exits at `at` and the driver says so; returns when its log upload went out.
fn exit_until_upload_at(sim: &mut Sim, at: u64) -> u64 {
    sim.advance_to(sim_ms(at));
    exit_now(sim);
    when(sim, |a| matches!(a, Action::UploadLog { .. }))
}

/// o1's process exits now with a genuine receipt, and the driver says so.
fn exit_now(sim: &mut Sim) {
    sim.event(Event::Exit {
        index: 0,
        code: 0,
        receipt: ReceiptKind::Genuine,
    });
    sim.notify(Input::ProcessExited {
        offer_id: ql_worker_sim::testkit::offer_id(1),
    });
}

/// The held command's answer arrives (the last one o1 waited for): o1 completes, and the world
/// saw no violation.
fn released_and_completed(sim: &mut Sim, id: OpId, outcome: Outcome) {
    release(sim, id, outcome);
    sim.settle();
    assert_eq!(sim.first_record().state, State::CompletionAcknowledged);
    sim.assert_no_violations();
}

/// With lease control paced (every 5 s) and a long cadence (10 s), the renewal beside an
/// upload goes out `lease_control_interval` after the upload was sent, not at once (a renewal
/// sent with the upload can fence it), and not at the next tick either: the Worker wakes for
/// that moment (`beside_upload_at`, `wake_at`).
#[test]
fn the_renewal_beside_an_upload_goes_out_one_interval_after_it() {
    let (mut sim, granted) = renewed_with_cadence(10_000);
    // The Run exits 3 s later: its upload is in flight when the renewal timer comes (at
    // `granted` + 5 s), and that renewal waits for the upload's own interval.
    let uploaded_at = exit_until_upload_at(&mut sim, granted + 3_000);
    let (upload, _, uploaded) = hold(&mut sim);
    assert_eq!(uploaded_at, granted + 3_000, "{:#?}", sim.commands());
    let renewed_at = when(&mut sim, is_renewal);
    // One interval after the upload, or half the lease after the grant, whichever is first.
    let expected = (uploaded_at + 5_000).min(granted + 15_000);
    assert!(renewed_at - granted < 30_000, "within the lease");
    assert_eq!(
        renewed_at,
        expected,
        "granted at {granted} ms, upload at {uploaded_at} ms: {:#?}",
        sim.commands()
    );
    sim.answer(Answer::Ok);
    sim.settle();
    released_and_completed(&mut sim, upload, uploaded);
}

/// A second exit notice for o1 comes at the very moment its renewal beside the upload went
/// out (both in flight): the pass it queues waits for the renewal's lane, whose answer wakes the
/// Worker. Until then the Worker sleeps until its next timer; it does not wake at once (again
/// and again) for the renewal time that has come (`wake_at` takes only times still ahead).
#[test]
fn a_pass_queued_beside_a_renewal_in_flight_does_not_wake_the_worker_at_once() {
    let (mut sim, granted) = renewed_with_cadence(10_000);
    exit_until_upload_at(&mut sim, granted + 3_000);
    let (upload, _, uploaded) = hold(&mut sim);
    let renewed_at = when(&mut sim, is_renewal);
    let (renewal, _, renewed) = hold(&mut sim);
    sim.notify(Input::ProcessExited {
        offer_id: ql_worker_sim::testkit::offer_id(1),
    });
    assert_eq!(sim.now.get(), renewed_at, "the clock has not moved");
    assert!(sim.pending.is_none(), "{:#?}", sim.commands());
    let wake = match sim.status {
        Status::Idle(wake) => wake,
        ref other => panic!("idle with both calls held: {other:?}"),
    };
    assert!(
        wake.is_some_and(|w| w.get() > renewed_at),
        "the next wake-up is ahead ({wake:?}), not at {renewed_at} ms"
    );
    release(&mut sim, renewal, renewed);
    sim.settle();
    released_and_completed(&mut sim, upload, uploaded);
}

/// As above (with a 2 s cadence), but the renewals after the grant get no answer (the lease's
/// local clock stays at the grant) and the Run exits 12 s after it: one interval after the
/// upload would be 17 s into a 30 s lease, so the renewal beside the upload goes out at half the
/// lease (15 s), leaving it time to come back.
#[test]
fn the_renewal_beside_a_late_upload_goes_out_at_half_the_lease() {
    let (mut sim, granted) = renewed_with_cadence(2_000);
    let exit_at = granted + 12_000;
    for _ in 0..200 {
        match sim.act() {
            Some(a) if is_renewal(a) => sim.answer(Answer::Unavailable),
            Some(_) => sim.answer(Answer::Ok),
            None => match sim.status {
                Status::Idle(Some(wake)) if wake.get() <= exit_at => {
                    sim.advance_to(wake);
                    sim.tick();
                }
                _ => break,
            },
        }
    }
    let unanswered = sim
        .commands()
        .iter()
        .filter(|l| *l == "post lease-control o1")
        .count();
    assert!(unanswered >= 2, "{:#?}", sim.commands());
    let uploaded_at = exit_until_upload_at(&mut sim, exit_at);
    assert_eq!(uploaded_at, exit_at, "{:#?}", sim.commands());
    let _in_flight = hold(&mut sim);
    let renewed_at = when(&mut sim, is_renewal);
    assert_eq!(
        renewed_at,
        granted + 15_000,
        "granted at {granted} ms, upload at {uploaded_at} ms: {:#?}",
        sim.commands()
    );
}

/// Nothing is planned twice: a register that gets no answer for three ticks is not sent
/// again meanwhile; once answered, one register went out in all.
#[test]
fn a_register_in_flight_is_not_planned_again() {
    let mut sim = Sim::scenario(ql_worker_sim::testkit::world::World::new(1, Vec::new()));
    when(&mut sim, |a| act::is_post(a, Operation::Register));
    let (register, _, registered) = hold(&mut sim);
    for _ in 0..3 {
        let at = sim.now.saturating_add(2_000);
        sim.advance_to(at);
        sim.tick();
        assert!(sim.pending.is_none(), "{:#?}", sim.commands());
    }
    release(&mut sim, register, registered);
    sim.settle();
    sim.run(2);
    let registers = sim
        .commands()
        .iter()
        .filter(|l| *l == "post register")
        .count();
    assert_eq!(registers, 1, "{:#?}", sim.commands());
}

/// A Pull waits for a Session exchange in flight (a heartbeat that reports the slots goes
/// first): with the heartbeat held, ticks plan no Pull; once it is answered, the Pull goes out.
#[test]
fn a_pull_waits_for_the_session_exchange_in_flight() {
    let mut sim = Sim::scenario(ql_worker_sim::testkit::world::World::new(1, Vec::new()));
    sim.run(2);
    let heartbeat = |a: &Action| act::is_post(a, Operation::Heartbeat);
    when(&mut sim, heartbeat);
    let (id, _, answered) = hold(&mut sim);
    let before = sim.commands().len();
    for _ in 0..3 {
        let at = sim.now.saturating_add(2_000);
        sim.advance_to(at);
        sim.tick();
        sim.settle();
    }
    let meanwhile = sim.commands()[before..].to_vec();
    assert!(
        !meanwhile.iter().any(|l| l == "post offers"),
        "{meanwhile:#?}"
    );
    release(&mut sim, id, answered);
    sim.settle();
    sim.run(1);
    assert!(
        sim.commands()[before..].iter().any(|l| l == "post offers"),
        "{:#?}",
        sim.commands()
    );
}

/// An upload that outlasted the Run's local lease deadline, with no renewal beside it and the
/// record unchanged when it is read again (completion step 7): the completion still goes out
/// under that lease, and the control plane judges it. Deferring would leave the next pass a
/// lease it can no longer complete under.
#[test]
fn an_upload_that_outlasted_the_local_lease_still_reports_its_completion() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    exit_until_upload(&mut sim);
    let before = sim.first_record();
    let (upload, _, uploaded) = hold(&mut sim);
    let lease_ms = before
        .offer
        .lease
        .expires_at_ms
        .get()
        .saturating_sub(before.offer.lease.renewed_at_ms.get());
    let at = sim.now.saturating_add(lease_ms + 1_000);
    sim.advance_to(at);
    let read_at = sim.commands().len();
    release(&mut sim, upload, uploaded);
    assert_eq!(sim.first_record(), before, "nothing moved the record");
    sim.answer(Answer::Ok);
    let after: Vec<String> = sim.commands()[read_at..].to_vec();
    assert_eq!(
        after,
        ["read-record o1", "post completion o1"],
        "{:#?}",
        sim.commands()
    );
}

/// The Session changes while a Pull's request is in flight: a heartbeat is fenced and the
/// register that follows is answered under a new generation (as a control plane does that
/// replaced the Session meanwhile). The offer the Pull's answer carries was bound to the
/// Session of the claim, not to the Worker's Session now: it is not admitted, nothing is
/// stored, and the claim is kept for its retry.
#[test]
fn an_offer_answered_after_the_session_changed_is_not_admitted() {
    let mut sim = Sim::scenario(ql_worker_sim::testkit::world::World::one_offer(1));
    sim.run(2);
    when(&mut sim, |a| act::is_post(a, Operation::Offers));
    let (id, _, answered) = hold(&mut sim);
    let claimed = sim.world.disk.claim.clone().expect("a claim").0;
    let session = sim.worker.session().expect("a Session").clone();
    assert_eq!(claimed.worker(), session.worker);
    let action = (0..200)
        .find_map(|_| {
            match sim.act() {
                Some(a) if act::is_post(a, Operation::Register) => return Some(a.clone()),
                Some(a) if act::is_post(a, Operation::Heartbeat) => sim.answer(Answer::Fenced),
                Some(_) => sim.answer(Answer::Ok),
                None => {
                    if let Status::Idle(Some(wake)) = sim.status {
                        sim.advance_to(wake);
                    }
                    sim.tick();
                }
            }
            None
        })
        .unwrap_or_else(|| panic!("no register: {:#?}", sim.commands()));
    let Outcome::Responded(body) = sim.world.perform(sim.now, &action, Answer::Ok) else {
        panic!("the register is answered");
    };
    let mut v: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    v["generation"] = serde_json::json!(session.worker.generation.get() + 1);
    sim.deliver(Outcome::Responded(serde_json::to_vec(&v).expect("JSON")));
    sim.settle();
    let now = sim.worker.session().expect("a Session again").clone();
    assert_ne!(now.worker, session.worker, "{:#?}", sim.commands());
    let before = sim.commands().len();
    release(&mut sim, id, answered);
    sim.settle();
    let after = sim.commands()[before..].to_vec();
    assert!(
        !after.iter().any(|l| l.starts_with("persist-record")),
        "{after:#?}"
    );
    assert!(sim.world.disk.records.is_empty(), "{after:#?}");
    assert_eq!(
        sim.world.disk.claim.as_ref().map(|(c, _)| &c.offer_id),
        Some(&claimed.offer_id),
        "the claim is kept"
    );
}

/// A heartbeat that reports a freed slot (queued with the Pull, `Worker::pull_again`) is still in
/// flight when the heartbeat timer comes: the timer plans no second one behind it. The next
/// heartbeat goes out a heartbeat interval after the one in flight was sent, not as soon as it
/// is answered.
#[test]
fn a_heartbeat_in_flight_when_its_timer_comes_is_not_planned_again() {
    let heartbeat = |a: &Action| act::is_post(a, Operation::Heartbeat);
    let mut sim = holding_with(|_| {});
    // One slot, held by o1: the heartbeats report no free slot.
    let regular = when(&mut sim, heartbeat);
    sim.answer(Answer::Ok);
    let at = sim.now.saturating_add(3_000);
    sim.advance_to(at);
    exit_now(&mut sim);
    let sent = when(&mut sim, heartbeat);
    assert!(sent < regular + 10_000, "{:#?}", sim.commands());
    let (id, _, answered) = hold(&mut sim);
    // The timer of the regular heartbeat comes while this one is in flight.
    let at = sim_ms(sent + 9_000);
    sim.advance_to(at);
    sim.tick();
    sim.settle();
    let before = sim.commands().len();
    release(&mut sim, id, answered);
    sim.settle();
    let at = sim_ms(sent + 9_500);
    sim.advance_to(at);
    sim.tick();
    sim.settle();
    let after = sim.commands()[before..].to_vec();
    assert!(
        !after.iter().any(|l| l == "post heartbeat"),
        "regular heartbeat at {regular} ms, this one sent at {sent} ms: {:#?}",
        sim.commands()
    );
    sim.assert_no_violations();
}
