//! The slow-link scenario (issue 16), one home for the end-to-end test `e2e_slow_link` (which
//! asserts its bounds) and the `slowlink` row of the whole-Worker benchmark (which reports
//! them): the real binary (node profile, defaults, Session lease 30 s) reaches the loopback plane
//! through a [`Throttled`] proxy; printing Runs and one sleeping Run; what the plane saw of the
//! Session's heartbeats and each Run's lease renewals, read from its records.
//!
//! Knobs (environment): `QL_SLOWLINK_RATE` (Worker → plane bytes per second, default 65536),
//! `QL_SLOWLINK_RUNS` (printing Runs, default 4), `QL_SLOWLINK_LOG_BYTES` (bytes each prints,
//! default 4 MiB), `QL_SLOWLINK_SLEEP_S` (the sleeping Run's seconds; default: the time the
//! uploads need on the link + 10 s, at least 30 s), `QL_SLOWLINK_LOG=<file>` (keep a copy of the
//! Worker's event log there).
#![allow(dead_code, unreachable_pub)]

use std::path::Path;
use std::process::ExitStatus;
use std::time::{Duration, Instant};

use ql_worker_core::ids::RunId;
use ql_worker_core::record::State;
use ql_worker_core::wire::activation::AttemptStatus;
use ql_worker_core::wire::error::ErrorCode;
use ql_worker_core::wire::route::Operation;
use ql_worker_tests::control_plane::{
    CpConfig, ReferenceControlPlane, ReferenceOptions, RunEventKind, RunRecord,
};

use super::proxy::Throttled;
use super::{KillOnDrop, World, env_number, events_named, marker_lines, sigterm};

const JSON: &[&str] = &["--log-format", "json"];
/// The Session lease the configuration asks for (the node default, written out).
pub const SESSION_LEASE_MS: u64 = 30_000;

fn now_ms() -> u64 {
    ReferenceControlPlane::now().get()
}

/// The largest gap between consecutive instants of `points` (sorted here).
pub fn max_gap(points: &mut [u64]) -> u64 {
    points.sort_unstable();
    points.windows(2).map(|w| w[1] - w[0]).max().unwrap_or(0)
}

/// The scenario's size, from the knobs.
#[derive(Clone, Copy, Debug)]
pub struct Params {
    /// Worker → plane bytes per second.
    pub rate: u64,
    /// Printing Runs.
    pub printers: u64,
    /// Bytes each printing Run prints.
    pub log_bytes: u64,
    /// The sleeping Run's seconds.
    pub sleep_s: u64,
}

impl Params {
    pub fn from_env() -> Self {
        let rate = env_number("QL_SLOWLINK_RATE", 64 * 1024).max(1);
        let printers = env_number("QL_SLOWLINK_RUNS", 4);
        let log_bytes = env_number("QL_SLOWLINK_LOG_BYTES", 4 << 20);
        let upload_s = (printers * log_bytes).div_ceil(rate);
        let sleep_s = env_number("QL_SLOWLINK_SLEEP_S", (upload_s + 10).max(30));
        Self {
            rate,
            printers,
            log_bytes,
            sleep_s,
        }
    }

    /// Seconds of uplink the printed bytes need (rounded up).
    pub fn upload_s(&self) -> u64 {
        (self.printers * self.log_bytes).div_ceil(self.rate)
    }
}

/// What the plane saw of one Run's lease: claim, renewals, end (its completion, or the end of
/// the observation when it has none).
#[derive(Clone, Debug)]
pub struct LeaseTrace {
    pub claimed_at: u64,
    pub renewals: Vec<u64>,
    pub end: u64,
}

impl LeaseTrace {
    pub fn of(run: &RunRecord, observed_until: u64) -> Self {
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
    pub fn max_gap(&self) -> u64 {
        let mut points = vec![self.claimed_at, self.end];
        points.extend(&self.renewals);
        max_gap(&mut points)
    }

    pub fn duration(&self) -> u64 {
        self.end - self.claimed_at
    }

    /// Renewals per `lease_ms` of the Run's life (3 or more is one per lease / 3); 0 for a Run
    /// that did not live.
    pub fn per_lease(&self, lease_ms: u64) -> f64 {
        if self.duration() == 0 {
            0.0
        } else {
            self.renewals.len() as f64 * lease_ms as f64 / self.duration() as f64
        }
    }
}

/// One Run of the scenario as it ended.
#[derive(Clone, Debug)]
pub struct RunOutcome {
    /// 1 is the sleeping Run, 2.. the printing ones.
    pub n: u32,
    pub attempt_status: Option<AttemptStatus>,
    pub attempt_number: u64,
    /// Executions (lines of its marker file).
    pub ran: usize,
    /// Byte lengths of the log artifacts the plane stored for it.
    pub stored: Vec<u64>,
    pub completed: bool,
    pub trace: LeaseTrace,
    /// When the plane recorded its end (`AttemptFinished`), if it did.
    pub finished_at: Option<u64>,
}

impl RunOutcome {
    pub fn sleeping(&self) -> bool {
        self.n == 1
    }

    /// Succeeded, completed, first attempt, executed exactly once.
    pub fn ok(&self) -> bool {
        self.attempt_status == Some(AttemptStatus::Succeeded)
            && self.completed
            && self.attempt_number == 1
            && self.ran == 1
    }
}

/// One answer of the plane: when, to what, status, error code.
pub type Answer = (u64, Option<Operation>, u16, Option<ErrorCode>);

/// Every answer in the plane's request log, in order.
pub fn answers(world: &World) -> Vec<Answer> {
    world.cp.with_model(|m| {
        m.request_log()
            .map(|e| (e.at.get(), e.operation, e.status, e.code))
            .collect()
    })
}

/// How many of `answers` carry `code`.
pub fn count_code(answers: &[Answer], code: ErrorCode) -> usize {
    answers.iter().filter(|r| r.3 == Some(code)).count()
}

/// The largest gap between the Session's successful registers and heartbeats as the plane
/// answered them, from the first register (`t0` when there was none) to `until`.
pub fn heartbeat_gap(answers: &[Answer], t0: u64, until: u64) -> u64 {
    let mut renewals: Vec<u64> = answers
        .iter()
        .filter(|r| r.2 == 200 && matches!(r.1, Some(Operation::Register | Operation::Heartbeat)))
        .map(|r| r.0)
        .collect();
    let first_register = renewals.iter().copied().min().unwrap_or(t0);
    renewals.extend([first_register, until]);
    max_gap(&mut renewals)
}

/// Everything the scenario measured.
#[derive(Debug)]
pub struct Outcome {
    pub params: Params,
    pub run_lease_ms: u64,
    pub timeout_ms: u64,
    pub session_lease_ms: u64,
    pub heartbeat_interval_ms: u64,
    pub lease_control_interval_ms: u64,
    /// Plane time just before the Worker was spawned.
    pub t0: u64,
    /// Plane time when the observation ended.
    pub observed_until: u64,
    /// Bytes the uplink had carried when every printing Run was first seen completed.
    pub carried_when_printed: Option<u64>,
    /// The Worker's exit status (`None`: it did not exit within the bound after SIGTERM).
    pub status: Option<ExitStatus>,
    /// It exited by itself (before every Run settled), not after SIGTERM.
    pub exited_by_itself: bool,
    /// Worker → plane bytes carried in all.
    pub bytes: u64,
    pub connections: u64,
    pub answers: Vec<Answer>,
    pub session_fences: usize,
    pub lease_fences: usize,
    pub fenced_events: usize,
    /// The largest gap between the Session's successful registers and heartbeats (and the ends
    /// of the observation), as the plane saw them.
    pub heartbeat_gap: u64,
    /// The sleeping Run first, then the printing ones.
    pub runs: Vec<RunOutcome>,
    /// The Worker's notable events (the last 80).
    pub notable: String,
    /// Wall time of the whole scenario (setup to the Worker's exit).
    pub wall: Duration,
}

/// Runs the scenario with `binary` as the Worker.
pub fn run(params: Params, binary: &Path) -> Outcome {
    let started = Instant::now();
    let Params {
        rate,
        printers,
        log_bytes,
        sleep_s,
    } = params;
    let model = CpConfig {
        // Every request of the scenario stays in the plane's log.
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
    eprintln!(
        "slow-link: uplink {rate} B/s, {printers} Runs printing {log_bytes} B (about {} s of \
         uplink), one sleeping {sleep_s} s; Run lease {run_lease_ms} ms, Session lease {} ms, \
         heartbeat {} ms, lease control every {} ms, request timeout {timeout_ms} ms",
        params.upload_s(),
        limits.session_lease_ms,
        limits.heartbeat_interval_ms,
        limits.lease_control_interval_ms
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
    let mut runs: Vec<(u32, RunId)> = vec![(1, sleeper)];
    for n in 2..=u32::try_from(printers).unwrap() + 1 {
        let script = format!(
            "echo ran >> '{}'; head -c {log_bytes} /dev/zero | tr '\\0' x",
            marker(n).display()
        );
        runs.push((n, world.enqueue_shell(n, &script)));
    }

    let log = world.dir.path().join("worker.log");
    let t0 = now_ms();
    let mut worker = KillOnDrop(world.spawn_logged(binary, JSON, &[], &log));
    let deadline = Instant::now() + Duration::from_secs(sleep_s + 60);
    let mut exited = None;
    let mut carried_when_printed = None;
    // Notes the bytes carried when every printing Run is first seen completed.
    let mut note_printed = || {
        if carried_when_printed.is_none() && runs[1..].iter().all(|(_, r)| world.completed_at_cp(r))
        {
            carried_when_printed = Some(proxy.uplink().carried());
        }
    };
    loop {
        if let Some(status) = worker.0.try_wait().unwrap() {
            exited = Some(status);
            break;
        }
        note_printed();
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
                note_printed();
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
    let answers = answers(&world);
    let session_fences = count_code(&answers, ErrorCode::WorkerSessionFenced);
    let lease_fences = count_code(&answers, ErrorCode::WorkerLeaseControlFenced);
    let heartbeat_gap = heartbeat_gap(&answers, t0, observed_until);
    let fenced_events = events_named(&log, "session.fenced").len();
    if let Ok(keep) = std::env::var("QL_SLOWLINK_LOG") {
        std::fs::copy(&log, &keep).unwrap();
    }

    let runs = runs
        .iter()
        .map(|(n, run_id)| {
            let record = state.runs.get(run_id).expect("the plane knows every Run");
            RunOutcome {
                n: *n,
                attempt_status: record.attempt_status,
                attempt_number: record.attempt_number,
                ran: marker_lines(&marker(*n)),
                stored: state
                    .artifacts
                    .iter()
                    .filter(|(k, _)| &k.run_id == run_id)
                    .map(|(_, a)| a.byte_length)
                    .collect(),
                completed: record.completion.is_some(),
                trace: LeaseTrace::of(record, observed_until),
                finished_at: record
                    .events
                    .iter()
                    .find(|e| matches!(e.kind, RunEventKind::AttemptFinished { .. }))
                    .map(|e| e.at.get()),
            }
        })
        .collect();
    Outcome {
        params,
        run_lease_ms,
        timeout_ms,
        session_lease_ms: limits.session_lease_ms,
        heartbeat_interval_ms: limits.heartbeat_interval_ms,
        lease_control_interval_ms: limits.lease_control_interval_ms,
        t0,
        observed_until,
        carried_when_printed,
        status,
        exited_by_itself: exited.is_some(),
        bytes,
        connections,
        answers,
        session_fences,
        lease_fences,
        fenced_events,
        heartbeat_gap,
        runs,
        notable: notable(&log, 80),
        wall: started.elapsed(),
    }
}

impl Outcome {
    /// The allowed gap between the Session's renewals: heartbeat interval + request timeout.
    pub fn heartbeat_bound_ms(&self) -> u64 {
        self.heartbeat_interval_ms + self.timeout_ms
    }

    /// The allowed gap between one Run's renewals: Run lease / 3 + request timeout.
    pub fn renewal_bound_ms(&self) -> u64 {
        self.run_lease_ms / 3 + self.timeout_ms
    }

    pub fn sleeper(&self) -> &RunOutcome {
        &self.runs[0]
    }

    pub fn printers(&self) -> &[RunOutcome] {
        &self.runs[1..]
    }

    pub fn succeeded(&self) -> usize {
        self.runs.iter().filter(|r| r.ok()).count()
    }

    /// Runs that did not succeed exactly once.
    pub fn lost(&self) -> usize {
        self.runs.len() - self.succeeded()
    }

    /// The fewest renewals per Run lease of any Run that lived at least a third of a lease
    /// (a shorter one needed none), `None` when none did.
    pub fn min_per_lease(&self) -> Option<f64> {
        self.runs
            .iter()
            .filter(|r| r.trace.duration() >= self.run_lease_ms / 3)
            .map(|r| r.trace.per_lease(self.run_lease_ms))
            .min_by(f64::total_cmp)
    }

    /// Plane time from just before the spawn to the last printing Run's end (`None` when one
    /// has no end).
    pub fn printed_after_ms(&self) -> Option<u64> {
        self.printers()
            .iter()
            .map(|r| r.finished_at)
            .collect::<Option<Vec<u64>>>()
            .map(|ends| ends.into_iter().max().unwrap_or(self.t0) - self.t0)
    }

    /// Every bound the scenario broke (empty: none).
    pub fn failures(&self) -> Vec<String> {
        let mut failures = Vec::new();
        for run in &self.runs {
            let n = run.n;
            if !run.ok() {
                failures.push(format!(
                    "Run {n} did not end succeeded with exactly one execution (status {:?}, \
                     attempt {}, executions {})",
                    run.attempt_status, run.attempt_number, run.ran
                ));
            }
            if !run.sleeping() && run.ok() && run.stored != [self.params.log_bytes] {
                failures.push(format!(
                    "Run {n}'s stored log is {:?} B, not {}",
                    run.stored, self.params.log_bytes
                ));
            }
        }
        let sleep = &self.sleeper().trace;
        let renewal_gap = sleep.max_gap();
        let (run_lease_ms, timeout_ms) = (self.run_lease_ms, self.timeout_ms);
        let needed_renewals = sleep.duration().div_ceil(run_lease_ms / 3);
        if renewal_gap > self.renewal_bound_ms() {
            failures.push(format!(
                "the sleeping Run went {renewal_gap} ms without a lease renewal (bound: Run lease \
                 {run_lease_ms} / 3 + request timeout {timeout_ms} = {} ms)",
                self.renewal_bound_ms()
            ));
        }
        if (sleep.renewals.len() as u64) < needed_renewals {
            failures.push(format!(
                "the sleeping Run's lease was renewed {} times in {} ms (at least ceil({} / \
                 ({run_lease_ms} / 3)) = {needed_renewals})",
                sleep.renewals.len(),
                sleep.duration(),
                sleep.duration()
            ));
        }
        if self.heartbeat_gap > self.heartbeat_bound_ms() {
            failures.push(format!(
                "the Session went {} ms without a successful register or heartbeat (bound: \
                 heartbeat interval {} + request timeout {timeout_ms} = {} ms)",
                self.heartbeat_gap,
                self.heartbeat_interval_ms,
                self.heartbeat_bound_ms()
            ));
        }
        if self.session_fences != 0 || self.fenced_events != 0 {
            failures.push(format!(
                "the Session was fenced: {} answers 409 worker_session_fenced, {} session.fenced \
                 events",
                self.session_fences, self.fenced_events
            ));
        }
        match self.status {
            None => failures.push(format!(
                "the Worker did not exit within {} s of SIGTERM (killed)",
                self.params.sleep_s + 60
            )),
            Some(status) if status.code() != Some(0) => failures.push(format!(
                "the Worker ended with {status} ({}), not a drain with exit 0",
                if self.exited_by_itself {
                    "by itself, before every Run completed"
                } else {
                    "after SIGTERM"
                }
            )),
            Some(_) => {}
        }
        failures
    }

    /// The figures, then one line per Run.
    pub fn summary(&self) -> String {
        let details: Vec<String> = self
            .runs
            .iter()
            .map(|run| {
                format!(
                    "  Run {} ({}): {:?}, attempt {}, executions {}, renewals {}, max renewal gap \
                     {} ms over {} ms, log stored {:?} B, finished at t = {}",
                    run.n,
                    if run.sleeping() { "sleep" } else { "print" },
                    run.attempt_status,
                    run.attempt_number,
                    run.ran,
                    run.trace.renewals.len(),
                    run.trace.max_gap(),
                    run.trace.duration(),
                    run.stored,
                    run.finished_at.map_or("-".to_owned(), |at| format!(
                        "{} ms",
                        at.saturating_sub(self.t0)
                    )),
                )
            })
            .collect();
        format!(
            "slow-link: runs {} succeeded {}, max renewal gap {} ms, sleeping Run's renewals per \
             lease {:.1}, max heartbeat gap {} ms, session fences {}, bytes {}\n\
             slow-link: observed {} ms, {} connections, {} answers 409 \
             worker_lease_control_fenced, wall time {:.1} s\n{}",
            self.runs.len(),
            self.succeeded(),
            self.sleeper().trace.max_gap(),
            self.sleeper().trace.per_lease(self.run_lease_ms),
            self.heartbeat_gap,
            self.session_fences,
            self.bytes,
            self.observed_until - self.t0,
            self.connections,
            self.lease_fences,
            self.wall.as_secs_f64(),
            details.join("\n")
        )
    }

    /// What the plane answered, in order (Pulls left out; the first 200).
    pub fn timeline(&self) -> String {
        let lines: Vec<String> = self
            .answers
            .iter()
            .filter(|r| r.1 != Some(Operation::Offers))
            .take(200)
            .map(|(at, op, status, code)| {
                format!(
                    "  t = {:>6} ms {:<14} {status}{}",
                    at.saturating_sub(self.t0),
                    op.map_or("-", Operation::as_str),
                    code.map_or(String::new(), |c| format!(" {}", c.as_str()))
                )
            })
            .collect();
        lines.join("\n")
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
