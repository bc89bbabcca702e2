//! A full inbox strands no offer (issue 14), with the real binary: `inbox_capacity = 4` and
//! eight slots, six 2-second Runs queued. The Worker takes four; while the inbox is full it takes
//! no offer (the other two stay queued, unclaimed, at the control plane: none is claimed and
//! left there), reports the full inbox once on stderr and in its metrics
//! (`ql_worker_inbox_full`, `ql_worker_pull_deferrals_total`), and offers no slot it could not
//! store.
//! Once Runs settle, retention frees places (settled, receipt gone) and the last two are taken.
//! Every Run ran once, each was claimed exactly once.

mod e2e_common;

use std::time::Duration;

use e2e_common::{KillOnDrop, World, kill9, marker_lines, sigterm, wait_exit};
use ql_worker::test_hooks::STALL_HOOK_ENV;
use ql_worker_core::ids::RunId;
use ql_worker_core::record::State;
use ql_worker_tests::control_plane::RunEventKind;

const SETTLE: Duration = Duration::from_secs(60);

#[test]
fn a_full_inbox_takes_no_offer_and_resumes_once_retention_frees_places() {
    let mut world =
        World::edge("\n[limits]\ncadence_ms = 200\ninbox_capacity = 4\nmax_concurrent_runs = 8\n");
    let metrics = world.dir.path().join("metrics.prom");
    world.append_config(&format!(
        "\n[metrics]\ntextfile = \"{}\"\ninterval_ms = 1000\n",
        metrics.display()
    ));
    assert_eq!(world.config.retention.high_water_records, 2);
    let marker = world.dir.path().join("marker");
    let mut ids = Vec::new();
    for i in 1..=6 {
        ids.push(world.enqueue_shell(i, &format!("sleep 3; echo {i} >> {}", marker.display())));
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
    assert!(stderr.contains("event=inbox.full"), "{stderr}");
    // The metrics file (written every second) says so too, while the four still run.
    world.wait_for("the metrics of a full inbox", SETTLE, |_| {
        let text = std::fs::read_to_string(&metrics).unwrap_or_default();
        metric(&text, "ql_worker_inbox_full") == Some(1.0)
            && metric(&text, "ql_worker_inbox_capacity") == Some(4.0)
            && metric(&text, "ql_worker_pull_deferrals_total").is_some_and(|n| n >= 1.0)
    });

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
    drained_each_run_once_claimed_once(&world, &mut worker, &marker, &ids);
    let state = world.cp.state();
    for id in &ids {
        assert!(
            !state.runs[id]
                .events
                .iter()
                .any(|e| e.kind == RunEventKind::LeaseExpired),
            "{id}: no lease ran out"
        );
    }
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(
        stderr.contains("inbox has room again") && stderr.contains("event=inbox.room"),
        "{stderr}"
    );
    let text = std::fs::read_to_string(&metrics).unwrap();
    assert_eq!(metric(&text, "ql_worker_inbox_full"), Some(0.0), "{text}");
}

/// A crash between storing an offer and clearing its claim, with the inbox then full (capacity
/// 1): the restarted Worker may not Pull (no room), and retention keeps a record its claim
/// names, so that claim would hold the inbox full for good. The Worker reads the claim alone,
/// finds its offer stored and clears it (`PullResult::ClaimChecked`); the Run settles,
/// retention removes it, and the next Run queued at the control plane is taken and runs.
#[test]
fn a_claim_left_by_a_crash_does_not_keep_a_full_inbox_full() {
    let world =
        World::edge("\n[limits]\ncadence_ms = 200\ninbox_capacity = 1\nmax_concurrent_runs = 1\n");
    assert_eq!(world.config.retention.high_water_records, 0);
    let marker = world.dir.path().join("marker");
    let first = world.enqueue_shell(1, &format!("echo 1 >> {}", marker.display()));
    let mut stalled = world.spawn_hooked_worker(&[(STALL_HOOK_ENV, State::Accepted.as_str())]);
    world.wait_for("the offer stored", SETTLE, |w| {
        w.state_of(&first) == Some(State::Accepted)
    });
    kill9(&mut stalled);
    let claim = world.root().join(ql_worker::layout::PENDING_CLAIM_FILE);
    assert!(
        claim.exists(),
        "the crash left the claim of the stored offer"
    );
    let second = world.enqueue_shell(2, &format!("echo 2 >> {}", marker.display()));

    let log = world.dir.path().join("worker.stderr");
    let mut worker = KillOnDrop(world.spawn_worker_logged(&[], &log));
    // Well inside the periodic full sweep (every 60 s): the inbox's own sweep frees the place
    // as soon as the receipt and the claim that kept the record are gone.
    let start = std::time::Instant::now();
    while !(world.completed_at_cp(&first) && world.completed_at_cp(&second)) {
        if start.elapsed() > Duration::from_secs(30) {
            let stderr = std::fs::read_to_string(&log).unwrap();
            let records: Vec<_> = world.records().into_values().map(|r| r.state).collect();
            panic!(
                "not both completed; records {records:?}, claim left: {}\n{stderr}",
                claim.exists()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    drained_each_run_once_claimed_once(&world, &mut worker, &marker, &[first, second]);
}

/// Drains the Worker (SIGTERM, exit 0), then: the marker holds one line per Run (each ran
/// once), and the control plane saw each claimed exactly once.
fn drained_each_run_once_claimed_once(
    world: &World,
    worker: &mut KillOnDrop,
    marker: &std::path::Path,
    ids: &[RunId],
) {
    sigterm(worker);
    assert_eq!(wait_exit(worker, Duration::from_secs(30)).code(), Some(0));
    assert_eq!(marker_lines(marker), ids.len(), "each Run ran once");
    let state = world.cp.state();
    for id in ids {
        let claims = state.runs[id]
            .events
            .iter()
            .filter(|e| matches!(e.kind, RunEventKind::Claimed { .. }))
            .count();
        assert_eq!(claims, 1, "{id} claimed once");
    }
}

/// The value of the sample named `name` (no labels) in a Prometheus text exposition.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}
