use std::time::Instant;
use ql_worker_core::testkit::{self, explore::*, sim::Sim, world::*};
use ql_worker_core::time::UnixMillis;

struct CatchPanics;
impl Guard for CatchPanics {
    fn run(&self, f: &mut dyn FnMut()) -> Result<(), String> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f())).map_err(|e| {
            e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
        })
    }
}

fn all() -> Menu {
    Menu { crashes: true, record_faults: true, claim_faults: true, read_faults: true, ack_answers: true, offer_answers: true, secret_answers: true, spawn_answers: true, log_faults: true, receipt_answers: true, upload_answers: true, completion_answers: true, lease_answers: true, stop_answers: true, session_answers: true, entropy_variants: true, exits: true }
}

#[test]
fn scratch_two_offers() {
    let mut config = testkit::config();
    config.max_concurrent_runs = 2;
    let world = World::new(1, vec![OfferTemplate::sample(1), OfferTemplate::with_revision(2, testkit::secret_revision())]);
    let root = Sim::new(config, world, UnixMillis::new(1000).unwrap());
    let bounds = Bounds { faults: 1, crashes: 1, entropy: 0, ticks: 7, jumps: 1, drains: 1, max_states: 3_000_000 };
    let model = Model { name: "x", menu: all(), bounds, roots: vec![root] };
    let t = Instant::now();
    let report = explore(&model, &CatchPanics);
    println!("two offers: {} states, {} transitions, {} violations ({:?}, deepest {})", report.states, report.transitions, report.violations, t.elapsed(), report.deepest);
    for f in &report.found { println!("{} {}\n  {}", f.invariant, f.detail, f.trace.join("\n  ")); }
    println!("{:?}", report.coverage);
}

#[test]
fn scratch_all_one() {
    let mut config = testkit::config();
    config.max_concurrent_runs = 1;
    let world = World::new(1, vec![OfferTemplate::with_revision(1, testkit::secret_revision())]);
    let root = Sim::new(config, world, UnixMillis::new(1000).unwrap());
    let bounds = Bounds { faults: 2, crashes: 1, entropy: 1, ticks: 7, jumps: 1, drains: 1, max_states: 3_000_000 };
    let model = Model { name: "x", menu: all(), bounds, roots: vec![root] };
    let t = Instant::now();
    let report = explore(&model, &CatchPanics);
    println!("all one: {} states, {} transitions, {} violations ({:?}, deepest {})", report.states, report.transitions, report.violations, t.elapsed(), report.deepest);
    for f in &report.found { println!("{} {}\n  {}", f.invariant, f.detail, f.trace.join("\n  ")); }
    println!("{:?}", report.coverage);
}
