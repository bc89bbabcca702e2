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

#[test]
fn model_check_start_path() {
    let mut config = testkit::config();
    config.max_concurrent_runs = 1;
    let root = Sim::new(config, World::one_offer(1), UnixMillis::new(1000).unwrap());
    let menu = Menu { crashes: true, record_faults: true, claim_faults: true, ack_answers: true, offer_answers: true, spawn_answers: true, entropy_variants: true, ..Menu::default() };
    let bounds = Bounds { faults: 2, crashes: 1, entropy: 1, ticks: 7, jumps: 0, drains: 0, max_states: 2_000_000 };
    let model = Model { name: "start-path", menu, bounds, roots: vec![root] };
    let t = Instant::now();
    let report = explore(&model, &CatchPanics);
    println!("model-check start-path: {} states, {} transitions, {} violations ({:?}, deepest {})", report.states, report.transitions, report.violations, t.elapsed(), report.deepest);
    for f in &report.found { println!("{} {}\n  {}", f.invariant, f.detail, f.trace.join("\n  ")); }
    println!("{:?}", report.coverage);
}

#[test]
fn mutation() {
    for m in [Mutation::DropWrites(ql_worker_core::record::State::Launching), Mutation::DropWrites(ql_worker_core::record::State::Started), Mutation::DropWrites(ql_worker_core::record::State::CompletionAcknowledged), Mutation::DropLeaseWrites] {
    let mut config = testkit::config();
    config.max_concurrent_runs = 1;
    let mut world = World::one_offer(1);
    world.mutation = Some(m);
    let root = Sim::new(config, world, UnixMillis::new(1000).unwrap());
    let menu = Menu { crashes: true, exits: true, lease_answers: true, ..Menu::default() };
    let bounds = Bounds { faults: 1, crashes: 1, entropy: 0, ticks: 6, jumps: 0, drains: 0, max_states: 2_000_000 };
    let model = Model { name: "mut", menu, bounds, roots: vec![root] };
    let report = explore(&model, &CatchPanics);
    println!("{m:?}: {} states, {} transitions, {} violations", report.states, report.transitions, report.violations);
    for f in &report.found { println!("{} {}\n  {}", f.invariant, f.detail, f.trace.join("\n  ")); }
    }
}
