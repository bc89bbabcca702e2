//! Soak: many quick Runs through the real binary with the edge profile's defaults.
mod e2e_common;

use std::time::{Duration, Instant};

use e2e_common::{KillOnDrop, World};
use ql_worker_tests::control_plane::{RevisionBuilder, RunSpec};

fn runs() -> u32 {
    std::env::var("QL_SOAK_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60)
}

#[test]
fn soak_measure() {
    let world = World::edge("");
    let marker = world.dir.path().join("marker");
    let n = runs();
    let mut ids = Vec::new();
    for i in 1..=n {
        let revision = RevisionBuilder::shell(&format!("echo {i} >> {}", marker.display()))
            .build()
            .unwrap();
        ids.push(
            world
                .cp
                .enqueue_run(RunSpec::numbered(i, revision))
                .unwrap(),
        );
    }
    let start = Instant::now();
    let _worker = KillOnDrop(world.spawn_worker(&[]));
    world.wait_for("all completed", Duration::from_secs(3000), |w| {
        ids.iter().all(|r| w.completed_at_cp(r))
    });
    let secs = start.elapsed().as_secs_f64();
    eprintln!("{n} runs in {secs:.1} s: {:.2} Runs/s", f64::from(n) / secs);
}
