//! Quick-Run throughput (issue 14): `QL_BENCH_THROUGHPUT_RUNS` `/bin/true` Runs (default 115,
//! the case the issue measured) queued at once, taken by the real Worker with the **edge**
//! profile's defaults (cadence 2 s, 2 slots), the edge profile with `max_concurrent_runs = 16`,
//! and the **node** profile's defaults (500 ms, 16 slots), timed on the control plane's clock
//! from the first claim to the last completion. Baseline, measured in the same run (ten samples
//! before the Worker runs, ten after, the median): the physical floor of one lifecycle done
//! serially (its fsyncs in the durable-write recipe on the same disk, one bare spawn of
//! `/bin/true`, its essential HTTPS round trips to the same server), as Runs per second. With
//! more than one slot the Worker overlaps lifecycles (and the supervisors' fsyncs with its own),
//! so it can beat this serial floor. The note gives what one claim per tick would allow (the
//! design before issue 14: one offer per cadence).

use std::time::Duration;

use ql_worker_tests::control_plane::RunEventKind;

use crate::latency::{Floor, largest_record};
use crate::table::{Table, median};
use crate::world::{World, wait_until};

fn runs() -> u32 {
    crate::env_number("QL_BENCH_THROUGHPUT_RUNS", 115, 10, 5000)
}

/// Essential requests of a `/bin/true` lifecycle: offers, starting, running, artifacts,
/// completion.
const ROUND_TRIPS: usize = 5;

struct Measured {
    label: String,
    runs: u32,
    slots: u16,
    cadence_ms: u64,
    span: Duration,
    floor: Duration,
    inbox_max: usize,
}

/// The serial floor of one lifecycle, `samples` times.
fn floors(world: &World, record_bytes: usize, fsyncs: u64, samples: usize) -> Vec<Duration> {
    let floor = Floor::new(world, record_bytes);
    (0..samples)
        .map(|_| floor.lifecycle(fsyncs, ROUND_TRIPS))
        .collect()
}

fn measure_profile(
    exe: &std::path::Path,
    profile: &'static str,
    max_concurrent_runs: Option<u16>,
    fsyncs: u64,
) -> Measured {
    let mut world = World::with_profile(profile, max_concurrent_runs);
    let n = runs();
    // The disk is shared and its speed drifts: half the floor before the Worker runs, half
    // after (when the record size is known), the median of both.
    let mut floor = floors(&world, 1024, fsyncs, 10);
    let queued: Vec<_> = (0..n).map(|_| world.enqueue_true()).collect();
    let worker = world.spawn(exe, &[]);
    let mut inbox_max = 0;
    let done = wait_until(Duration::from_secs(900), Duration::from_millis(50), || {
        inbox_max = inbox_max.max(
            std::fs::read_dir(world.root().join("offers"))
                .map(|d| d.count())
                .unwrap_or(0),
        );
        world.cp.with_model(|m| {
            queued
                .iter()
                .all(|q| m.run(&q.run_id).is_some_and(|r| r.completion.is_some()))
        })
    });
    assert!(done, "{profile}: the Runs did not all complete");
    let state = world.cp.state();
    let (mut first, mut last) = (u64::MAX, 0);
    for q in &queued {
        let run = &state.runs[&q.run_id];
        for e in &run.events {
            if matches!(e.kind, RunEventKind::Claimed { .. }) {
                first = first.min(e.at.get());
            }
        }
        last = last.max(run.finished_at.map_or(0, |t| t.get()));
    }
    let status = worker.drain(Duration::from_secs(120));
    assert!(
        status.is_some_and(|s| s.success()),
        "{profile}: the Worker did not drain cleanly: {status:?}"
    );
    let record_bytes = largest_record(world.root()).max(1024);
    floor.extend(floors(&world, record_bytes, fsyncs, 10));
    let label = match max_concurrent_runs {
        None => format!("{profile} profile defaults"),
        Some(n) => format!("{profile} profile, max_concurrent_runs = {n}"),
    };
    Measured {
        label,
        runs: n,
        slots: world.config.limits.max_concurrent_runs,
        cadence_ms: world.config.limits.cadence_ms,
        span: Duration::from_millis(last.saturating_sub(first).max(1)),
        floor: median(&floor),
        inbox_max,
    }
}

pub(crate) fn measure(exe: &std::path::Path, fsyncs: u64, table: &mut Table) {
    for (profile, slots) in [("edge", None), ("edge", Some(16)), ("node", None)] {
        let m = measure_profile(exe, profile, slots, fsyncs);
        let ours = f64::from(m.runs) / m.span.as_secs_f64();
        let floor = 1.0 / m.floor.as_secs_f64();
        let per_tick = 1000.0 / m.cadence_ms as f64;
        table.push(
            format!("quick-Run throughput, {}", m.label),
            format!("{ours:.2} Runs/s"),
            format!("{floor:.2} Runs/s (serial floor)"),
            Some(ours / floor),
            format!(
                "{} `/bin/true` Runs queued at once, {} slots, cadence {} ms; first claim → last \
                 completion {:.1} s. Floor = one lifecycle's {fsyncs} fsyncs + one spawn + \
                 {ROUND_TRIPS} round trips, serially ({:.1} ms). One claim per tick would allow \
                 {per_tick:.2} Runs/s. Inbox at most {} records (sampled every 50 ms)",
                m.runs,
                m.slots,
                m.cadence_ms,
                m.span.as_secs_f64(),
                m.floor.as_secs_f64() * 1e3,
                m.inbox_max,
            ),
        );
    }
}
