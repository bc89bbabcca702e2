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

use std::collections::BTreeMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::Hasher;

use ql_worker_sim::testkit::act;
use ql_worker_sim::testkit::sim::{Sim, Status};
use ql_worker_sim::testkit::world::{Menu, OfferTemplate, World};
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
