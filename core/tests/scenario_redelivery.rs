//! Issue 15: at most once per Run and per Attempt when the control plane re-delivers a Run
//! whose lease expired under a new offer id (`docs/simulation.md`, "At most once per Run and
//! per Attempt"), driven through the whole Worker against the simulated host
//! (`testkit::world`, `World::with_reoffers`), and the checker catching a Worker side that
//! spawns an Attempt or a Run twice.

use ql_worker_core::ids::{AttemptId, OfferId, RunId};
use ql_worker_core::io::{Action, LaunchPlan};
use ql_worker_core::record::State;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::route::Operation;
use ql_worker_sim::testkit::sim::{On, Sim};
use ql_worker_sim::testkit::world::{Answer, CpStatus, World};

/// Runs ticks until `done` holds (at most `rounds`), failing on any violation.
fn run_until(sim: &mut Sim, rounds: usize, done: impl Fn(&Sim) -> bool) {
    for _ in 0..rounds {
        if done(sim) {
            break;
        }
        sim.run(1);
        assert!(
            sim.world.violations.is_empty(),
            "violations: {:?}\ntrail: {:#?}",
            sim.world.violations,
            sim.commands()
        );
    }
    assert!(done(sim), "not reached; trail: {:#?}", sim.commands());
}

/// The spawn plans the Worker issued, in order.
fn spawns(sim: &Sim) -> Vec<LaunchPlan> {
    sim.stream
        .iter()
        .flatten()
        .filter_map(|act| match act {
            Action::Spawn(plan) => Some((**plan).clone()),
            _ => None,
        })
        .collect()
}

/// The offer ids the control plane handed out for Run `run-1`, with their Attempt.
fn deliveries(sim: &Sim) -> Vec<(OfferId, AttemptId, CpStatus)> {
    let run = RunId::new("run-1").unwrap();
    sim.world
        .plane
        .runs
        .iter()
        .filter(|(_, r)| r.offer.candidate.run_id == run)
        .map(|(id, r)| (id.clone(), r.offer.candidate.attempt_id.clone(), r.status))
        .collect()
}

/// Lets `o1`'s lease expire after the Worker stored it but before `on` took effect, by
/// crashing there and moving the clock past the lease; then runs until the re-delivered Run
/// is spawned.
fn expire_before(on: On) -> Sim {
    let mut sim = Sim::scenario(World::one_offer(1).with_reoffers());
    sim.on(on, Answer::CrashBefore);
    run_until(&mut sim, 20, |s| s.restarts == 1);
    let later = UnixMillis::new(sim.now.get() + 60_000).unwrap();
    sim.advance_to(later);
    run_until(&mut sim, 40, |s| !spawns(s).is_empty());
    sim.run(3);
    sim
}

#[test]
fn an_unstarted_attempt_is_redelivered_and_spawned_once() {
    // The crash comes before the starting ACK reaches the plane: the Attempt is still
    // `claimed` there, so it is handed out again, same Run and Attempt, under a new offer id.
    let sim = expire_before(On::Post(Operation::Starting));
    let deliveries = deliveries(&sim);
    assert_eq!(deliveries.len(), 2, "{deliveries:?}");
    assert!(deliveries.iter().all(|(_, a, _)| a.as_str() == "attempt-1"));
    assert!(sim.world.plane.lost_attempts.is_empty());
    let spawns = spawns(&sim);
    assert_eq!(spawns.len(), 1);
    let (first, _, status) = deliveries
        .iter()
        .find(|(id, _, _)| *id != spawns[0].offer_id)
        .unwrap();
    assert_eq!(*status, CpStatus::Superseded);
    // The first offer's record stays before the barrier, dormant, and can never launch.
    assert_eq!(sim.world.disk.record(first).unwrap().state, State::Accepted);
    sim.assert_no_violations();
}

#[test]
fn a_started_attempt_is_lost_and_a_new_attempt_of_the_run_is_spawned_once() {
    // The starting ACK reached the plane (Attempt `starting`), then the Worker crashed before
    // recording it: the plane cannot know whether the Attempt ran, declares it lost and makes
    // a new Attempt of the same Run.
    let sim = expire_before(On::Persist(State::StartingAcknowledged));
    let deliveries = deliveries(&sim);
    assert_eq!(deliveries.len(), 2, "{deliveries:?}");
    let lost = AttemptId::new("attempt-1").unwrap();
    assert!(sim.world.plane.lost_attempts.contains(&lost));
    let spawns = spawns(&sim);
    assert_eq!(spawns.len(), 1);
    assert_eq!(spawns[0].attempt_id.as_str(), "attempt-1-2");
    sim.assert_no_violations();
}

/// The plane fences a replay whose lease ran out (reference §2.2, as the loopback plane's
/// `offers` does): the first `offers` answer is lost after the plane leased `o1` to the claim,
/// and the claim's retry comes after that lease expired, so the plane answers 409
/// `worker_offer_fenced` and the Worker clears the claim at once, nothing stored. The next Pull
/// claims afresh, and the plane re-delivers the Run (the same Attempt: no activation call
/// reached it) under the new offer id, which is spawned once.
#[test]
fn a_replay_after_the_lease_ran_out_is_fenced_and_the_run_comes_back_under_a_fresh_claim() {
    let mut sim = Sim::scenario(World::one_offer(1).with_reoffers());
    sim.on(On::Post(Operation::Offers), Answer::LostAfterCommit);
    run_until(&mut sim, 6, |s| !s.world.plane.runs.is_empty());
    let (first, _, _) = deliveries(&sim).remove(0);
    assert!(sim.world.disk.records.is_empty(), "{:#?}", sim.commands());
    // Past the lease and any backoff of the claim's retry.
    let expiry = sim.world.plane.runs[&first].offer.lease.expires_at_ms;
    sim.advance_to(UnixMillis::new(expiry.get() + 60_000).unwrap());
    run_until(&mut sim, 40, |s| !spawns(s).is_empty());
    sim.run(3);
    assert_eq!(sim.world.plane.fenced_replays, 1, "{:#?}", sim.commands());
    assert!(
        sim.world.disk.record(&first).is_none(),
        "the fenced offer is never stored"
    );
    let deliveries = deliveries(&sim);
    assert_eq!(deliveries.len(), 2, "{deliveries:?}");
    assert!(deliveries.iter().all(|(_, a, _)| a.as_str() == "attempt-1"));
    let spawns = spawns(&sim);
    assert_eq!(spawns.len(), 1);
    assert_ne!(
        spawns[0].offer_id, first,
        "the Run runs under the fresh claim"
    );
    let status = deliveries.iter().find(|(id, _, _)| *id == first).unwrap().2;
    assert_eq!(status, CpStatus::Superseded);
    sim.assert_no_violations();
}

/// The checker can fail on the Worker's side: a forged second spawn of the same Attempt (under
/// another offer id) is `at-most-once-attempt`; a spawn of the Attempt the plane declared lost
/// is `at-most-once-run`.
#[test]
fn the_checker_catches_a_worker_side_that_spawns_an_attempt_or_a_run_twice() {
    let sim = expire_before(On::Post(Operation::Starting));
    let plan = spawns(&sim).remove(0);
    let mut world = sim.world.clone();
    let mut forged = plan.clone();
    forged.offer_id = OfferId::new("forged-offer").unwrap();
    let _ = world.perform(sim.now, &Action::Spawn(Box::new(forged)), Answer::Ok);
    assert!(
        world
            .violations
            .iter()
            .any(|v| v.invariant == "at-most-once-attempt"),
        "{:?}",
        world.violations
    );

    let sim = expire_before(On::Persist(State::StartingAcknowledged));
    let plan = spawns(&sim).remove(0);
    let mut world = sim.world.clone();
    let mut forged = plan;
    forged.attempt_id = AttemptId::new("attempt-1").unwrap();
    let _ = world.perform(sim.now, &Action::Spawn(Box::new(forged)), Answer::Ok);
    assert!(
        world
            .violations
            .iter()
            .any(|v| v.invariant == "at-most-once-run"),
        "{:?}",
        world.violations
    );
}

/// The simulated control plane fences a `starting` ACK by the Run lease, as the reference does
/// (ADR-0013): the ACK the Worker sent for o1 is applied within the lease and answered 409
/// `worker_activation_fenced` once the lease has expired, whatever the Worker believed of it.
#[test]
fn the_plane_fences_a_starting_ack_sent_after_the_lease_expired() {
    let mut sim = Sim::scenario(World::one_offer(1));
    sim.answer_until(|a| ql_worker_sim::testkit::act::is_post(a, Operation::Starting));
    let starting = sim.act().cloned().expect("the starting ACK is pending");
    let expires = sim
        .world
        .plane
        .runs
        .values()
        .next()
        .unwrap()
        .offer
        .lease
        .expires_at_ms;
    let mut late = sim.world.clone();
    let fenced = late.perform(expires, &starting, Answer::Ok);
    assert!(
        matches!(&fenced, ql_worker_core::io::Outcome::Http(
            ql_worker_core::io::HttpFailure::Status { status: 409, code: Some(code) }
        ) if code == "worker_activation_fenced"),
        "{fenced:?}"
    );
    let applied = sim.world.perform(sim.now, &starting, Answer::Ok);
    assert!(
        matches!(applied, ql_worker_core::io::Outcome::Responded(_)),
        "{applied:?}"
    );
    let run = sim.world.plane.runs.values().next().unwrap();
    assert_eq!(run.status, CpStatus::Starting);
}
