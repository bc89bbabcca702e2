//! Issue 16, item 7, third bullet: the real binary on a slow uplink. The Worker (node profile,
//! defaults: Session lease 30 s, heartbeat every 10 s, lease control every 5 s at most, request
//! timeout 15 s) reaches the loopback plane through a proxy that carries the Worker → plane
//! direction at 64 KiB/s in total (one 512 kbit/s uplink shared by every connection); the plane
//! → Worker direction is not throttled. Four Runs each print 4 MiB (about 64 s of uplink each,
//! 256 s together) while a fifth one sleeps across the uploads. Every Run must succeed exactly
//! once; the sleeping Run's lease must be renewed throughout (no gap between its renewals, as
//! the plane saw them, above lease / 3 + the request timeout, and at least one renewal per
//! lease / 3 of its life); no gap between the Session's heartbeats above the heartbeat interval
//! + the request timeout; no Session fence; the Worker drains with exit 0.
//!
//! The defect it catches: a Worker whose one loop sits in a log upload for a minute renews
//! nothing meanwhile, so the sleeping Run's lease and the Session lease both lapse.
//!
//! Knobs: `QL_SLOWLINK_RATE` (Worker → plane bytes per second, default 65536),
//! `QL_SLOWLINK_RUNS` (printing Runs, default 4), `QL_SLOWLINK_LOG_BYTES` (bytes each prints,
//! default 4 MiB), `QL_SLOWLINK_SLEEP_S` (the sleeping Run's seconds; default: the time the
//! uploads need on the link + 10 s, at least 30 s), `QL_SLOWLINK_LOG=<file>` (keep a copy of the
//! Worker's event log there).
#![forbid(unsafe_code)]

mod e2e_common;

use std::path::Path;
use std::time::{Duration, Instant};

use e2e_common::proxy::Throttled;
use e2e_common::{KillOnDrop, World, env_number, events_named, marker_lines, sigterm};
use ql_worker_core::ids::RunId;
use ql_worker_core::record::State;
use ql_worker_core::wire::activation::AttemptStatus;
use ql_worker_core::wire::error::ErrorCode;
use ql_worker_core::wire::route::Operation;
use ql_worker_tests::control_plane::{
    CpConfig, ReferenceControlPlane, ReferenceOptions, RunEventKind, RunRecord,
};

const JSON: &[&str] = &["--log-format", "json"];
/// The Session lease the configuration asks for (the node default, written out).
const SESSION_LEASE_MS: u64 = 30_000;

fn now_ms() -> u64 {
    ReferenceControlPlane::now().get()
}

/// The largest gap between consecutive instants of `points` (sorted here).
fn max_gap(points: &mut [u64]) -> u64 {
    points.sort_unstable();
    points.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)
}

/// What the plane saw of one Run's lease: claim, renewals, end (its completion, or the end of
/// the observation when it has none).
struct LeaseTrace {
    claimed_at: u64,
    renewals: Vec<u64>,
    end: u64,
}

impl LeaseTrace {
    fn of(run: &RunRecord, observed_until: u64) -> Self {
        let mut claimed_at = None;
        let mut finished_at = None;
        let mut renewals = Vec::new();
        for event in &run.events {
            match event.kind {
                RunEventKind::Claimed { .. } => claimed_at = claimed_at.or(Some(event.at.get())),
                RunEventKind::LeaseRenewed { .. } => renewals.push(event.at.get()),
                RunEventKind::AttemptFinished { .. } => finished_at = Some(event.at.get()),
                _ => {}
            }
        }
        let claimed_at = claimed_at.unwrap_or(observed_until);
        Self {
            claimed_at,
            renewals,
            end: finished_at.unwrap_or(observed_until).max(claimed_at),
        }
    }

    /// The largest time the lease went without a renewal (claim → renewals → end).
    fn max_gap(&self) -> u64 {
        let mut points = vec![self.claimed_at, self.end];
        points.extend(&self.renewals);
        max_gap(&mut points)
    }

    fn duration(&self) -> u64 {
        self.end - self.claimed_at
    }
}

/// The Worker's events worth reading after a failure (at most `max` lines).
fn notable(log: &Path, max: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text
        .lines()
        .filter(|l| {
            [
                "fenced",
                "renewal.",
                "halt",
                "stopped",
                "uncertain",
                "call.",
                "lease",
            ]
            .iter()
            .any(|w| l.contains(w))
        })
        .collect();
    let skip = lines.len().saturating_sub(max);
    lines[skip..].join("\n")
}

#[test]
fn a_slow_uplink_starves_neither_lease_renewals_nor_the_session() {
    let started = Instant::now();
    let rate = env_number("QL_SLOWLINK_RATE", 64 * 1024).max(1);
    let printers = env_number("QL_SLOWLINK_RUNS", 4);
    let log_bytes = env_number("QL_SLOWLINK_LOG_BYTES", 4 << 20);
    let upload_s = (printers * log_bytes).div_ceil(rate);
    let sleep_s = env_number("QL_SLOWLINK_SLEEP_S", (upload_s + 10).max(30));

    let model = CpConfig {
        // Every request of the test stays in the plane's log.
        request_log_max: 1 << 20,
        ..CpConfig::default()
    };
    let run_lease_ms = model.run_lease_ms;
    let options = ReferenceOptions {
        model,
        ..ReferenceOptions::default()
    };
    let mut world = World::node(
        options,
        &format!("\n[limits]\nsession_lease_ms = {SESSION_LEASE_MS}\n"),
    );
    let limits = world.config.limits;
    let timeout_ms = world.config.control_plane.timeout_ms;
    assert!(
        limits.spool.maximum_attempt_bytes >= log_bytes,
        "the profile's log quota ({} bytes) keeps the {log_bytes} bytes each Run prints",
        limits.spool.maximum_attempt_bytes
    );
    assert!(
        u64::from(limits.max_concurrent_runs) > printers,
        "the profile runs all {} Runs at once",
        printers + 1
    );
    let renewal_bound_ms = run_lease_ms / 3 + timeout_ms;
    let heartbeat_bound_ms = limits.heartbeat_interval_ms + timeout_ms;
    println!(
        "slow-link: uplink {rate} B/s, {printers} Runs printing {log_bytes} B (about {upload_s} s \
         of uplink), one sleeping {sleep_s} s; Run lease {run_lease_ms} ms, Session lease {} ms, \
         heartbeat {} ms, lease control every {} ms, request timeout {timeout_ms} ms",
        limits.session_lease_ms, limits.heartbeat_interval_ms, limits.lease_control_interval_ms
    );

    let origin = world.cp.origin().to_owned();
    let upstream = origin.trim_start_matches("https://").parse().unwrap();
    let proxy = Throttled::start(upstream, rate);
    world.edit_config(&origin, &format!("https://{}", proxy.addr()));

    // The sleeping Run first, so that it runs from the start; then the printers.
    let marker = |n: u32| world.dir.path().join(format!("marker-{n}"));
    let sleeper = world.enqueue_shell(
        1,
        &format!("echo ran >> '{}'; sleep {sleep_s}", marker(1).display()),
    );
    let mut runs: Vec<(u32, RunId)> = vec![(1, sleeper.clone())];
    for n in 2..=u32::try_from(printers).unwrap() + 1 {
        let script = format!(
            "echo ran >> '{}'; head -c {log_bytes} /dev/zero | tr '\\0' x",
            marker(n).display()
        );
        runs.push((n, world.enqueue_shell(n, &script)));
    }

    let log = world.dir.path().join("worker.log");
    let t0 = now_ms();
    let mut worker = KillOnDrop(world.spawn_with_args(JSON, &[], &log));
    let deadline = Instant::now() + Duration::from_secs(sleep_s + 60);
    let mut exited = None;
    loop {
        if let Some(status) = worker.0.try_wait().unwrap() {
            exited = Some(status);
            break;
        }
        // Done when every Run completed, or ended here without completing (the Worker gave its
        // lease up: nothing more will happen to it).
        let records = world.records();
        let settled = runs.iter().all(|(_, r)| {
            world.completed_at_cp(r)
                || records
                    .get(r)
                    .is_some_and(|rec| rec.state == State::RecoveryRequired)
        });
        if settled || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let observed_until = now_ms();
    let status = match exited {
        Some(status) => Some(status),
        None => {
            // A drain waits for the uploads in flight: bounded by what is left of them.
            sigterm(&worker);
            let until = Instant::now() + Duration::from_secs(sleep_s + 60);
            loop {
                if let Some(status) = worker.0.try_wait().unwrap() {
                    break Some(status);
                }
                if Instant::now() >= until {
                    break None;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    };
    let bytes = proxy.uplink().carried();
    let connections = proxy.connections();
    drop(proxy);

    // What the plane saw.
    let state = world.cp.state();
    let requests: Vec<(u64, Option<Operation>, u16, Option<ErrorCode>)> =
        world.cp.with_model(|m| {
            m.request_log()
                .map(|e| (e.at.get(), e.operation, e.status, e.code))
                .collect()
        });
    let session_fences = requests
        .iter()
        .filter(|r| r.3 == Some(ErrorCode::WorkerSessionFenced))
        .count();
    let lease_fences = requests
        .iter()
        .filter(|r| r.3 == Some(ErrorCode::WorkerLeaseControlFenced))
        .count();
    let mut session_renewals: Vec<u64> = requests
        .iter()
        .filter(|r| r.2 == 200 && matches!(r.1, Some(Operation::Register | Operation::Heartbeat)))
        .map(|r| r.0)
        .collect();
    let first_register = session_renewals.iter().copied().min().unwrap_or(t0);
    session_renewals.push(observed_until);
    session_renewals.push(first_register);
    let heartbeat_gap = max_gap(&mut session_renewals);
    let fenced_events = events_named(&log, "session.fenced").len();
    if let Ok(keep) = std::env::var("QL_SLOWLINK_LOG") {
        std::fs::copy(&log, &keep).unwrap();
    }

    let mut succeeded = 0;
    let mut details = Vec::new();
    let mut failures = Vec::new();
    for (n, run_id) in &runs {
        let record = state.runs.get(run_id).expect("the plane knows every Run");
        let trace = LeaseTrace::of(record, observed_until);
        let ran = marker_lines(&marker(*n));
        let stored: Vec<u64> = state
            .artifacts
            .iter()
            .filter(|(k, _)| &k.run_id == run_id)
            .map(|(_, a)| a.byte_length)
            .collect();
        let ok = record.attempt_status == Some(AttemptStatus::Succeeded)
            && record.completion.is_some()
            && record.attempt_number == 1
            && ran == 1;
        succeeded += usize::from(ok);
        details.push(format!(
            "  Run {n} ({}): {:?}, attempt {}, executions {ran}, renewals {}, max renewal gap {} \
             ms over {} ms, log stored {stored:?} B, finished at t = {}",
            if *n == 1 { "sleep" } else { "print" },
            record.attempt_status,
            record.attempt_number,
            trace.renewals.len(),
            trace.max_gap(),
            trace.duration(),
            record
                .events
                .iter()
                .find(|e| matches!(e.kind, RunEventKind::AttemptFinished { .. }))
                .map_or("-".to_owned(), |e| format!(
                    "{} ms",
                    e.at.get().saturating_sub(t0)
                )),
        ));
        if !ok {
            failures.push(format!(
                "Run {n} did not end succeeded with exactly one execution (status {:?}, attempt \
                 {}, executions {ran})",
                record.attempt_status, record.attempt_number
            ));
        }
        if *n != 1 && ok && stored != [log_bytes] {
            failures.push(format!(
                "Run {n}'s stored log is {stored:?} B, not {log_bytes}"
            ));
        }
    }
    let sleep = LeaseTrace::of(&state.runs[&sleeper], observed_until);
    let renewal_gap = sleep.max_gap();
    let needed_renewals = sleep.duration().div_ceil(run_lease_ms / 3);
    // Renewals per lease-length of the sleeping Run's life (3 or more is one per lease / 3).
    let per_lease = if sleep.duration() == 0 {
        0.0
    } else {
        sleep.renewals.len() as f64 * run_lease_ms as f64 / sleep.duration() as f64
    };
    if renewal_gap > renewal_bound_ms {
        failures.push(format!(
            "the sleeping Run went {renewal_gap} ms without a lease renewal (bound: Run lease \
             {run_lease_ms} / 3 + request timeout {timeout_ms} = {renewal_bound_ms} ms)"
        ));
    }
    if (sleep.renewals.len() as u64) < needed_renewals {
        failures.push(format!(
            "the sleeping Run's lease was renewed {} times in {} ms (at least ceil({} / ({run_lease_ms} \
             / 3)) = {needed_renewals})",
            sleep.renewals.len(),
            sleep.duration(),
            sleep.duration()
        ));
    }
    if heartbeat_gap > heartbeat_bound_ms {
        failures.push(format!(
            "the Session went {heartbeat_gap} ms without a successful register or heartbeat \
             (bound: heartbeat interval {} + request timeout {timeout_ms} = {heartbeat_bound_ms} \
             ms)",
            limits.heartbeat_interval_ms
        ));
    }
    if session_fences != 0 || fenced_events != 0 {
        failures.push(format!(
            "the Session was fenced: {session_fences} answers 409 worker_session_fenced, \
             {fenced_events} session.fenced events"
        ));
    }
    let Some(status) = status else {
        failures.push(format!(
            "the Worker did not exit within {} s of SIGTERM (killed)",
            sleep_s + 60
        ));
        panic!("{}\n{}", failures.join("\n"), notable(&log, 80));
    };
    if status.code() != Some(0) {
        failures.push(format!(
            "the Worker ended with {status} ({}), not a drain with exit 0",
            if exited.is_some() {
                "by itself, before every Run completed"
            } else {
                "after SIGTERM"
            }
        ));
    }

    println!(
        "slow-link: runs {} succeeded {succeeded}, max renewal gap {renewal_gap} ms, min renewals \
         per Run per lease {per_lease:.1}, max heartbeat gap {heartbeat_gap} ms, session fences \
         {session_fences}, bytes {bytes}",
        runs.len()
    );
    println!(
        "slow-link: observed {} ms, {connections} connections, {lease_fences} answers 409 \
         worker_lease_control_fenced, wall time {:.1} s\n{}",
        observed_until - t0,
        started.elapsed().as_secs_f64(),
        details.join("\n")
    );
    if !failures.is_empty() {
        // What the plane answered, in order (Pulls left out), for the record of the failure.
        let timeline: Vec<String> = requests
            .iter()
            .filter(|r| r.1 != Some(Operation::Offers))
            .take(200)
            .map(|(at, op, status, code)| {
                format!(
                    "  t = {:>6} ms {:<14} {status}{}",
                    at.saturating_sub(t0),
                    op.map_or("-", Operation::as_str),
                    code.map_or(String::new(), |c| format!(" {}", c.as_str()))
                )
            })
            .collect();
        println!(
            "slow-link: the plane's answers (Pulls left out):\n{}",
            timeline.join("\n")
        );
    }
    assert!(
        failures.is_empty(),
        "slow-link: {} bound(s) broken at {rate} B/s:\n- {}\nthe Worker's notable events (last \
         40):\n{}",
        failures.len(),
        failures.join("\n- "),
        notable(&log, 40)
    );
}
