//! Soak (issue 14): the real `ql-worker run` binary with the **edge** profile's defaults
//! (cadence 2 s, inbox 64, 2 concurrent Runs, `high_water_records` 32, retention and log keep
//! defaults) against the loopback reference control plane takes `QL_SOAK_RUNS` quick Runs
//! (default 500) queued at once, and:
//!
//! * every Run succeeds (exit 0, `succeeded` at the control plane) and ran exactly once (each
//!   appends its number to one marker file);
//! * the inbox never holds more than `high_water_records + max_concurrent_runs` records
//!   (sampled every millisecond by a watcher thread reading `offers/`; the sample count is
//!   printed);
//! * no offer is stranded: every Run was claimed exactly once and that claim went on to
//!   `starting` (no `lease_recovery`, no claim left `claimed`), and at the end no pending claim
//!   and no receipt is left and a drain exits 0.
//!
//! It prints the throughput (Runs per second, from the first claim to the last completion) as a
//! measurement, never an assertion; the bench row in `docs/performance.md` is the figure.

mod e2e_common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use e2e_common::{KillOnDrop, World, sigterm, wait_exit};
use ql_worker_core::wire::activation::RunStatus;
use ql_worker_tests::control_plane::RunEventKind;

/// Edge defaults the test checks against (`docs/ql-worker.example.toml`).
const HIGH_WATER: usize = 32;
const MAX_CONCURRENT: usize = 2;

fn runs() -> u32 {
    std::env::var("QL_SOAK_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(500)
}

/// Counts `<offerId>.rec` entries of `offers/` until stopped; returns (max, samples).
fn watch_inbox(
    dir: std::path::PathBuf,
    stop: Arc<AtomicBool>,
) -> std::thread::JoinHandle<(usize, usize)> {
    std::thread::spawn(move || {
        let (mut max, mut samples) = (0, 0);
        while !stop.load(Ordering::SeqCst) {
            if let Ok(entries) = std::fs::read_dir(&dir) {
                let n = entries
                    .flatten()
                    .filter(|e| e.file_name().to_string_lossy().ends_with(".rec"))
                    .count();
                max = max.max(n);
                samples += 1;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        (max, samples)
    })
}

#[test]
fn edge_defaults_take_hundreds_of_quick_runs_with_a_bounded_inbox_and_nothing_stranded() {
    let world = World::edge("");
    assert_eq!(world.config.retention.high_water_records, HIGH_WATER as u64);
    assert_eq!(
        usize::from(world.config.limits.max_concurrent_runs),
        MAX_CONCURRENT
    );
    let marker = world.dir.path().join("marker");
    let n = runs();
    let mut ids = Vec::new();
    for i in 1..=n {
        ids.push(world.enqueue_shell(i, &format!("echo {i} >> {}", marker.display())));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = watch_inbox(world.root().join("offers"), stop.clone());
    let started = Instant::now();
    let log = world.dir.path().join("worker.stderr");
    let mut worker = KillOnDrop(world.spawn_worker_logged(&[], &log));
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let done = world.cp.with_model(|m| {
            ids.iter()
                .filter(|r| m.run(r).is_some_and(|r| r.completion.is_some()))
                .count()
        });
        if done == ids.len() {
            break;
        }
        if Instant::now() > deadline {
            let stderr = std::fs::read_to_string(&log).unwrap_or_default();
            let records = world.records();
            let states: Vec<_> = records.values().map(|r| r.state).collect();
            panic!(
                "only {done} of {n} Runs completed in 600 s; inbox {} records {states:?}; \
                 Worker stderr:\n{stderr}",
                records.len()
            );
        }
        // The control plane's lock is shared with the Worker's requests: poll gently.
        std::thread::sleep(Duration::from_millis(200));
    }
    let stderr = std::fs::read_to_string(&log).unwrap_or_default();
    let elapsed = started.elapsed();
    sigterm(&worker);
    let status = wait_exit(&mut worker, Duration::from_secs(60));
    stop.store(true, Ordering::SeqCst);
    let (max_records, samples) = watcher.join().unwrap();
    assert_eq!(status.code(), Some(0), "a drained Worker exits 0");

    // Every Run succeeded, and each ran once.
    let text = std::fs::read_to_string(&marker).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let unique: BTreeSet<&str> = lines.iter().copied().collect();
    assert_eq!(lines.len(), n as usize, "one line per Run");
    assert_eq!(unique.len(), n as usize, "no Run ran twice");
    let state = world.cp.state();
    let (mut first_claim, mut last_finish) = (u64::MAX, 0);
    for id in &ids {
        let run = &state.runs[id];
        assert_eq!(run.run_status, RunStatus::Succeeded, "{id}");
        assert_eq!(run.completion.as_ref().unwrap().result.exit_code, 0, "{id}");
        let claims: Vec<usize> = run
            .events
            .iter()
            .enumerate()
            .filter(|(_, e)| matches!(e.kind, RunEventKind::Claimed { .. }))
            .map(|(i, _)| i)
            .collect();
        assert_eq!(claims.len(), 1, "{id} claimed once: {:?}", run.events);
        assert_eq!(
            run.events.get(claims[0] + 1).map(|e| &e.kind),
            Some(&RunEventKind::AttemptStarting),
            "{id}: its claim went on to starting (not stranded)"
        );
        assert!(
            !run.events
                .iter()
                .any(|e| e.kind == RunEventKind::LeaseExpired),
            "{id}: no lease ran out"
        );
        first_claim = first_claim.min(run.events[claims[0]].at.get());
        last_finish = last_finish.max(run.finished_at.unwrap().get());
    }
    assert!(
        !world.root().join("pending-claim").exists(),
        "no pending claim left"
    );
    let mut receipts = Vec::new();
    e2e_common::each_file(&world.root().join("receipts"), |path, _| {
        receipts.push(path.to_path_buf());
    });
    assert!(receipts.is_empty(), "no receipt left: {receipts:?}");

    // The inbox stayed bounded: settled records leave as soon as nothing needs them.
    assert!(
        samples > 100,
        "the watcher sampled the inbox ({samples} samples)"
    );
    assert!(
        max_records <= HIGH_WATER + MAX_CONCURRENT,
        "the inbox held {max_records} records, above {HIGH_WATER} + {MAX_CONCURRENT}"
    );
    assert!(
        !stderr.contains("inbox full"),
        "the inbox never filled: {stderr}"
    );
    let left = world.records().len();
    assert!(left <= HIGH_WATER, "{left} records left after the drain");

    let span = Duration::from_millis(last_finish.saturating_sub(first_claim));
    eprintln!(
        "soak: {n} quick Runs on edge defaults, all succeeded once; {:.2} Runs/s from the first \
         claim to the last completion ({:.1} s; {:.1} s from enqueue); inbox at most \
         {max_records} records ({samples} samples); {left} records left",
        f64::from(n) / span.as_secs_f64().max(0.001),
        span.as_secs_f64(),
        elapsed.as_secs_f64()
    );
}
