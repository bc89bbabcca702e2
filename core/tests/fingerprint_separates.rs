//! The model checks count and prune by fingerprint: two moments whose fingerprints are equal are
//! taken for one state, and only one of them is explored further (`docs/model-check.md`). A
//! fingerprint that leaves out part of an operation's state merges moments that behave
//! differently, and the explorer silently skips what one of them would do.
//!
//! The Worker's next command is a function of its state, so a sound fingerprint has this
//! necessary property: two moments with the same `Worker::state_fingerprint` have the same
//! outstanding commands. This test walks the Worker through seeded random runs of the simulated
//! world (faults of every family, crashes, process exits, ticks) and checks the property at every
//! step. Each operation's `fingerprint` (Pull, Processor, supervision, completion, Session, the
//! lanes) feeds the Worker's; one that wrote nothing would merge consecutive steps of its pass,
//! which issue different commands.
//!
//! Part of a launch in flight shows in no outstanding command: the starting ACK's callback
//! sequence and deadline, the capability drawn, the environment resolved. The walks never reach
//! two moments that differ only there, so the `separated_*` tests build such pairs: two
//! simulations in the same state, one of them handed another starting ACK, entropy or Secret
//! value (its world answered the same), then driven in lockstep, each world answering
//! healthily. While their commands agree the worlds stay equal, so the two Workers hear the same
//! answers; once a later command differs, the two were never one state, and every moment before
//! must have had different Worker fingerprints (else the explorer would merge them and skip one
//! future).

use std::collections::BTreeMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::Hasher;

use ql_worker_core::capability::{ENTROPY_BYTES, Entropy};
use ql_worker_core::io::{Action, Outcome};
use ql_worker_core::wire::route::Operation;
use ql_worker_sim::testkit::sim::{Sim, Status};
use ql_worker_sim::testkit::world::{Answer, Menu, OfferTemplate, World};
use ql_worker_sim::testkit::{self, act};
use ql_worker_tests::splitmix::SplitMix64;

const SEEDS: u64 = 48;
const STEPS: u32 = 600;

/// A value in `0..n`, from the test crates' one random stream.
fn pick(rng: &mut SplitMix64, n: usize) -> usize {
    let n = u64::try_from(n).expect("a small count");
    usize::try_from(rng.below(n)).expect("below n")
}

fn fingerprint(sim: &Sim) -> u64 {
    let mut hasher = DefaultHasher::new();
    sim.worker.state_fingerprint(&mut hasher);
    hasher.finish()
}

/// The outstanding commands, whole (`act::canonical`), sorted.
fn outstanding(sim: &Sim) -> Vec<String> {
    let mut out: Vec<String> = sim
        .outstanding()
        .map(|a| String::from_utf8_lossy(&act::canonical(a)).into_owned())
        .collect();
    out.sort();
    out
}

/// One seeded walk; every moment with a command outstanding is checked against the earlier
/// moments of the same fingerprint in `seen`. Returns the moments checked.
fn walk(seed: u64, seen: &mut BTreeMap<u64, (Vec<String>, String)>) -> u32 {
    let templates = (1..=3).map(OfferTemplate::sample).collect();
    let mut sim = Sim::scenario(World::new(seed, templates));
    let mut rng = SplitMix64(seed);
    let menu = Menu::everything();
    let mut checked = 0;
    for step in 0..STEPS {
        if matches!(sim.status, Status::Stopped(_) | Status::Halted(_)) {
            sim.crash();
            continue;
        }
        let Some(action) = sim.act().cloned() else {
            let events = sim.world.events(&menu);
            if !events.is_empty() && pick(&mut rng, 3) == 0 {
                let event = events[pick(&mut rng, events.len())];
                sim.event(event);
            } else {
                let at = sim.now.saturating_add(500 + 500 * rng.below(8));
                sim.advance_to(at);
                sim.tick();
            }
            continue;
        };
        let here = (outstanding(&sim), format!("seed {seed} step {step}"));
        match seen.get(&fingerprint(&sim)) {
            Some((commands, at)) => assert_eq!(
                commands, &here.0,
                "two moments share a Worker fingerprint but not their outstanding commands: \
                 {at} and {}",
                here.1
            ),
            None => {
                seen.insert(fingerprint(&sim), here);
            }
        }
        checked += 1;
        let options = sim.world.options(&action, &menu);
        let answer = if pick(&mut rng, 4) == 0 {
            options[pick(&mut rng, options.len())]
        } else {
            options[0]
        };
        sim.answer(answer);
    }
    checked
}

#[test]
fn equal_worker_fingerprints_have_equal_outstanding_commands() {
    let mut seen = BTreeMap::new();
    let checked: u32 = (1..=SEEDS).map(|seed| walk(seed, &mut seen)).sum();
    // The walks reach far: many distinct states, not one repeated moment.
    assert!(
        seen.len() > 2_000,
        "{} distinct fingerprints over {checked} moments",
        seen.len()
    );
    println!(
        "fingerprints: {} distinct over {checked} moments checked",
        seen.len()
    );
}

/// The world of the `separated_*` tests: one offer whose revision has a timeout (the starting
/// ACK carries a deadline) and a Secret binding (the start path fetches Secrets).
fn secret_world() -> World {
    World::new(
        1,
        vec![OfferTemplate::with_revision(1, testkit::secret_revision())],
    )
}

/// Performs the pending command in the world as [`Answer::Ok`] says, but hands the Worker
/// `edit`'s version of the outcome: the world moves as for the other simulation, only this
/// Worker's memory differs.
fn answer_edited(sim: &mut Sim, edit: impl FnOnce(Outcome) -> Outcome) {
    let action = sim.act().cloned().expect("a command is outstanding");
    let outcome = sim.world.perform(sim.now, &action, Answer::Ok);
    sim.deliver(edit(outcome));
}

/// A JSON answer with `edit` applied to its body.
fn json_edited(outcome: Outcome, edit: impl FnOnce(&mut serde_json::Value)) -> Outcome {
    let Outcome::Responded(body) = outcome else {
        panic!("expected a JSON answer");
    };
    let mut v: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    edit(&mut v);
    Outcome::Responded(serde_json::to_vec(&v).expect("JSON"))
}

fn world_fingerprint(sim: &Sim) -> u64 {
    let mut hasher = DefaultHasher::new();
    sim.world.state_fingerprint(&mut hasher);
    hasher.finish()
}

/// Drives `a` and `b` in lockstep, each world answering healthily, while their outstanding
/// commands agree; at every such moment the worlds must be equal and the Worker fingerprints
/// different. Returns the kinds of the commands pending at those moments; panics unless the
/// commands finally differ and the first to differ is of kind `diverges_at`.
fn separated(mut a: Sim, mut b: Sim, diverges_at: &str) -> Vec<&'static str> {
    let mut moments = Vec::new();
    loop {
        let (ours, theirs) = (outstanding(&a), outstanding(&b));
        if ours != theirs {
            let kind = a.act().map(act::kind);
            assert_eq!(
                kind,
                Some(diverges_at),
                "the runs diverged at another command: {ours:?} / {theirs:?}"
            );
            return moments;
        }
        let Some(action) = a.act() else {
            panic!("the runs went idle and their commands never differed");
        };
        let kind = act::kind(action);
        assert_eq!(
            world_fingerprint(&a),
            world_fingerprint(&b),
            "the worlds differ at {kind}: the two Workers would not hear the same answers"
        );
        assert_ne!(
            fingerprint(&a),
            fingerprint(&b),
            "moment {} (pending {kind}): equal Worker fingerprints, yet after the same answers the \
             commands differ (at {diverges_at})",
            moments.len()
        );
        moments.push(kind);
        a.answer(Answer::Ok);
        b.answer(Answer::Ok);
    }
}

/// A simulation of [`secret_world`] answered healthily until the first of `stops` is pending,
/// then (that one answered too) until the next, and so on.
fn at(stops: &[&dyn Fn(&Action) -> bool]) -> Sim {
    let mut sim = Sim::scenario(secret_world());
    for (i, stop) in stops.iter().enumerate() {
        if i > 0 {
            sim.answer(Answer::Ok);
        }
        sim.answer_until(stop);
    }
    sim
}

fn starting(action: &Action) -> bool {
    act::is_post(action, Operation::Starting)
}

/// `a` and `b` at the starting ACK of o1, `b`'s answer edited by `edit` (its snapshot).
fn starting_answered(edit: fn(&mut serde_json::Value)) -> (Sim, Sim) {
    let (mut a, mut b) = (at(&[&starting]), at(&[&starting]));
    a.answer(Answer::Ok);
    answer_edited(&mut b, |outcome| {
        json_edited(outcome, |v| edit(&mut v["snapshot"]))
    });
    (a, b)
}

/// The launch authority's callback sequence (the starting snapshot's `callbackSequence` + 1)
/// lives only in the Processor's memory until the `launching` record carries it: the drawing of
/// the capability, the Secrets fetch and the log allocation show nothing of it. Two Workers
/// that heard different sequences must not share a fingerprint there (`Authority::fingerprint`,
/// `Launch::fingerprint`).
#[test]
fn separated_by_the_callback_sequence_of_the_starting_ack() {
    let (a, b) = starting_answered(|snapshot| {
        let sequence = snapshot["callbackSequence"].as_u64().expect("a sequence");
        snapshot["callbackSequence"] = serde_json::json!(sequence + 4);
    });
    let moments = separated(a, b, "persist-record");
    assert_eq!(
        moments,
        ["persist-record", "draw-entropy", "post", "allocate-log"]
    );
}

/// The launch authority's deadline lives only in the Processor's memory until the spawn's plan
/// carries it (the plan's timeout): not in the `launching` record either. Two Workers that
/// heard different deadlines must not share a fingerprint before the spawn.
#[test]
fn separated_by_the_deadline_of_the_starting_ack() {
    let (a, b) = starting_answered(|snapshot| {
        let deadline = snapshot["deadlineAtMs"].as_u64().expect("a deadline");
        snapshot["deadlineAtMs"] = serde_json::json!(deadline + 1_000);
    });
    let moments = separated(a, b, "spawn");
    assert_eq!(
        moments,
        [
            "persist-record",
            "draw-entropy",
            "post",
            "allocate-log",
            "persist-record"
        ]
    );
}

/// The capability lives only in the Processor's memory until the `launching` record carries
/// its digest: the Secrets fetch and the log allocation show nothing of it. Two Workers that
/// drew different capabilities must not share a fingerprint there (`Launch::fingerprint`).
#[test]
fn separated_by_the_capability_drawn() {
    // Past the Pull's own draw (the claim's identity): the draw after the starting ACK.
    let entropy = |action: &Action| act::kind(action) == "draw-entropy";
    let (mut a, mut b) = (at(&[&starting, &entropy]), at(&[&starting, &entropy]));
    a.answer(Answer::Ok);
    answer_edited(&mut b, |_| {
        Outcome::EntropyDrawn(Entropy::new([0x5a; ENTROPY_BYTES]))
    });
    let moments = separated(a, b, "persist-record");
    assert_eq!(moments, ["post", "allocate-log"]);
}

/// The resolved environment lives only in the Processor's memory until the spawn's plan
/// carries it. Two Workers that heard different Secret values must not share a fingerprint
/// before the spawn (`env_fingerprint`).
#[test]
fn separated_by_the_secret_values_resolved() {
    let secrets = |action: &Action| act::is_post(action, Operation::Secrets);
    let (mut a, mut b) = (at(&[&secrets]), at(&[&secrets]));
    a.answer(Answer::Ok);
    answer_edited(&mut b, |outcome| {
        json_edited(outcome, |v| {
            v["values"][0]["value"] = serde_json::json!("another-secret-value");
        })
    });
    let moments = separated(a, b, "spawn");
    assert_eq!(moments, ["allocate-log", "persist-record"]);
}
