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
fn model_check_finish_path() {
    let mut config = testkit::config();
    config.max_concurrent_runs = 1;
    let root = Sim::new(config, World::one_offer(1), UnixMillis::new(1000).unwrap());
    let menu = Menu { crashes: true, record_faults: true, receipt_answers: true, log_faults: true, upload_answers: true, completion_answers: true, lease_answers: true, stop_answers: true, exits: true, spawn_answers: true, ..Menu::default() };
    let bounds = Bounds { faults: 2, crashes: 1, entropy: 0, ticks: 8, jumps: 1, drains: 1, max_states: 3_000_000 };
    let model = Model { name: "finish-path", menu, bounds, roots: vec![root] };
    let t = Instant::now();
    let report = explore(&model, &CatchPanics);
    println!("model-check finish-path: {} states, {} transitions, {} violations ({:?}, deepest {})", report.states, report.transitions, report.violations, t.elapsed(), report.deepest);
    for f in &report.found { println!("{} {}\n  {}", f.invariant, f.detail, f.trace.join("\n  ")); }
    println!("{:?}", report.coverage);
}
