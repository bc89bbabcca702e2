//! A full inbox strands no offer (issue 14), with the real binary: `inbox_capacity = 4` and
//! eight slots, six 2-second Runs queued. The Worker takes four; while the inbox is full it takes
//! no offer (the other two stay queued, unclaimed, at the control plane: none is claimed and
//! left there), reports the full inbox once on stderr, and offers no slot it could not store.
//! Once Runs settle, retention frees places (settled, receipt gone) and the last two are taken.
//! Every Run ran once, each was claimed exactly once.

mod e2e_common;

use std::time::Duration;

use e2e_common::{KillOnDrop, World, marker_lines, sigterm, wait_exit};
use ql_worker_core::record::State;
use ql_worker_tests::control_plane::RunEventKind;

const SETTLE: Duration = Duration::from_secs(60);

#[test]
fn a_full_inbox_takes_no_offer_and_resumes_once_retention_frees_places() {
    let world =
        World::edge("\n[limits]\ncadence_ms = 200\ninbox_capacity = 4\nmax_concurrent_runs = 8\n");
    assert_eq!(world.config.retention.high_water_records, 2);
    let marker = world.dir.path().join("marker");
    let mut ids = Vec::new();
    for i in 1..=6 {
        ids.push(world.enqueue_shell(i, &format!("sleep 2; echo {i} >> {}", marker.display())));
    }
    let log = world.dir.path().join("worker.stderr");
    let mut worker = KillOnDrop(world.spawn_worker_logged(&[], &log));
    world.wait_for("four Runs running", SETTLE, |w| {
        w.records()
            .values()
            .filter(|r| r.state == State::RunningAcknowledged)
            .count()
            == 4
    });
    // Several Pull decisions (cadence 200 ms) while the four run: none claims an offer.
    std::thread::sleep(Duration::from_millis(1000));
    let state = world.cp.state();
    let unclaimed: Vec<_> = ids
        .iter()
        .filter(|id| state.runs[*id].lease.is_none())
        .collect();
    assert_eq!(
        unclaimed.len(),
        2,
        "two Runs wait unclaimed at the control plane"
    );
    assert_eq!(
        world.records().len(),
        4,
        "the inbox is full, nothing more was stored"
    );
    let session = world.cp.session(world.cp.worker_id()).unwrap();
    assert!(
        session.available_slots <= 4,
        "never more slots offered than the inbox can store: {}",
        session.available_slots
    );
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        stderr.matches("inbox full: 4 of 4 records").count(),
        1,
        "the full inbox is reported once: {stderr}"
    );

    let start = std::time::Instant::now();
    while !ids.iter().all(|id| world.completed_at_cp(id)) {
        if start.elapsed() > SETTLE {
            let stderr = std::fs::read_to_string(&log).unwrap();
            let states: Vec<_> = world.records().values().map(|r| r.state).collect();
            let log: Vec<_> = world.cp.with_model(|m| {
                m.request_log()
                    .map(|e| (e.at.get(), e.operation, e.status, e.reason))
                    .collect::<Vec<_>>()
            });
            panic!("not all completed: {states:?}\n{stderr}\n{log:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    sigterm(&worker);
    assert_eq!(
        wait_exit(&mut worker, Duration::from_secs(30)).code(),
        Some(0)
    );
    assert_eq!(marker_lines(&marker), 6, "each Run ran once");
    let state = world.cp.state();
    for id in &ids {
        let claims = state.runs[id]
            .events
            .iter()
            .filter(|e| matches!(e.kind, RunEventKind::Claimed { .. }))
            .count();
        assert_eq!(claims, 1, "{id} claimed once");
        assert!(
            !state.runs[id]
                .events
                .iter()
                .any(|e| e.kind == RunEventKind::LeaseExpired),
            "{id}: no lease ran out"
        );
    }
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(stderr.contains("inbox has room again"), "{stderr}");
}
