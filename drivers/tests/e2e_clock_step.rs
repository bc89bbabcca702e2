//! Issue 16, item 5, on the real binary: the host's wall clock steps an hour back, then an hour
//! forward, then back to the true time, while a Run sleeps. The Worker (node profile, defaults:
//! Session lease 30 s, heartbeat every 10 s, lease control every 5 s, Run lease 30 s) reads its
//! wall clock through libfaketime (`LD_PRELOAD`, the offset re-read from a file at every call);
//! its monotonic clock (`CLOCK_BOOTTIME`, read through the vDSO) and the control plane (this
//! process) keep the true time.
//!
//! Every Run must succeed exactly once, the sleeping Run's lease must be renewed throughout (no
//! gap between its renewals above lease / 3 + the request timeout, as the plane saw them), no gap
//! between the Session's heartbeats above the heartbeat interval + the request timeout, no
//! Session fence, no record in `recovery_required`, and the Worker drains with exit 0.
//!
//! The defects it catches: intervals on the wall clock. After the step back, such a Worker's
//! time stands still for an hour (the core never lets time go back), so it sends no heartbeat
//! and no renewal and both leases lapse. After the step forward, a lease renewed a moment ago
//! reads as expired an hour ago, and the Run is stopped and sent to recovery.
//!
//! Needs libfaketime (Debian: `apt-get install libfaketime`; `.ci/run` installs it), found at
//! `QL_FAKETIME_LIB` or the Debian path. Without it the test says SKIPPED, except under CI
//! (`CI` set), where it fails.
#![forbid(unsafe_code)]

mod e2e_common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use e2e_common::slow_link::{self, LeaseTrace};
use e2e_common::{KillOnDrop, World, marker_lines, sigterm, wait_exit, worker_bin};
use ql_worker_core::record::State;
use ql_worker_core::wire::activation::AttemptStatus;
use ql_worker_core::wire::error::ErrorCode;
use ql_worker_tests::control_plane::{ReferenceControlPlane, ReferenceOptions};

const DEBIAN_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";
/// The wall clock's offsets, in order, and how long each holds (seconds).
const STEPS: [(&str, u64); 4] = [("+0", 8), ("-1h", 25), ("+1h", 25), ("+0", 12)];

/// The library, or `None` (and a SKIPPED line) where it is missing outside CI.
fn faketime_lib() -> Option<PathBuf> {
    let lib = std::env::var_os("QL_FAKETIME_LIB")
        .map_or_else(|| PathBuf::from(DEBIAN_LIB), PathBuf::from);
    if lib.exists() {
        return Some(lib);
    }
    let missing = format!(
        "{} is missing: install libfaketime (Debian: apt-get install libfaketime; .ci/run \
         installs it) or set QL_FAKETIME_LIB",
        lib.display()
    );
    assert!(std::env::var_os("CI").is_none(), "{missing}");
    eprintln!("SKIPPED: {missing}");
    None
}

fn now_ms() -> u64 {
    ReferenceControlPlane::now().get()
}

fn set_offset(file: &Path, offset: &str) {
    // Written whole, then renamed: libfaketime never reads half a line.
    let tmp = file.with_extension("tmp");
    std::fs::write(&tmp, format!("{offset}\n")).unwrap();
    std::fs::rename(&tmp, file).unwrap();
}

#[test]
fn wall_clock_steps_neither_stall_the_session_nor_lose_a_lease() {
    let Some(lib) = faketime_lib() else {
        return;
    };
    let world = World::node(ReferenceOptions::default(), "");
    let limits = world.config.limits;
    let timeout_ms = world.config.control_plane.timeout_ms;
    let run_lease_ms = 30_000;
    let sleep_s: u64 = STEPS.iter().map(|s| s.1).sum::<u64>() + 5;
    let marker = world.dir.path().join("marker");
    let run = world.enqueue_shell(
        1,
        &format!("echo ran >> '{}'; sleep {sleep_s}", marker.display()),
    );
    // A quick Run after the steps: Pulls still go on.
    let offset_file = world.dir.path().join("faketime");
    set_offset(&offset_file, STEPS[0].0);
    let log = world.dir.path().join("worker.log");
    let lib_text = lib.to_str().unwrap().to_owned();
    let offset_text = offset_file.to_str().unwrap().to_owned();
    let env = [
        ("LD_PRELOAD", lib_text.as_str()),
        ("FAKETIME_TIMESTAMP_FILE", offset_text.as_str()),
        ("FAKETIME_NO_CACHE", "1"),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ];
    let t0 = now_ms();
    let mut worker =
        KillOnDrop(world.spawn_logged(&worker_bin(), &["--log-format", "json"], &env, &log));
    world.wait_for("the Run running", Duration::from_secs(30), |w| {
        w.state_of(&run) == Some(State::RunningAcknowledged)
    });
    let mut steps = Vec::new();
    for (offset, hold) in STEPS {
        set_offset(&offset_file, offset);
        steps.push((now_ms(), offset));
        eprintln!("clock-step: wall clock {offset} for {hold} s");
        let until = Instant::now() + Duration::from_secs(hold);
        while Instant::now() < until {
            assert!(
                worker.0.try_wait().unwrap().is_none(),
                "the Worker exited during the steps"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let second = world.enqueue_shell(2, &format!("echo ran >> '{}-2'", marker.display()));
    // Bounded, and read below rather than asserted here, so that a failure prints what the
    // plane saw.
    let until = Instant::now() + Duration::from_secs(60);
    while !(world.completed_at_cp(&run) && world.completed_at_cp(&second)) && Instant::now() < until
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    let completed = [world.completed_at_cp(&run), world.completed_at_cp(&second)];
    let observed_until = now_ms();
    sigterm(&worker);
    let status = wait_exit(&mut worker.0, Duration::from_secs(60));

    let state = world.cp.state();
    let answers = slow_link::answers(&world);
    let heartbeat_gap = slow_link::heartbeat_gap(&answers, t0, observed_until);
    let fences = slow_link::count_code(&answers, ErrorCode::WorkerSessionFenced);
    let record = state.runs.get(&run).unwrap();
    let trace = LeaseTrace::of(record, observed_until);
    let recovery: Vec<_> = world
        .records()
        .into_iter()
        .filter(|(_, r)| r.state == State::RecoveryRequired)
        .collect();
    let summary = format!(
        "clock-step: steps {steps:?} (plane ms); heartbeat gap {heartbeat_gap} ms (bound {}); \
         lease renewals {} over {} ms, largest gap {} ms (bound {}); Session fences {fences}; \
         executions {}/{}, completed {completed:?}; recovery {}; exit {status:?}",
        limits.heartbeat_interval_ms + timeout_ms,
        trace.renewals.len(),
        trace.duration(),
        trace.max_gap(),
        run_lease_ms / 3 + timeout_ms,
        marker_lines(&marker),
        marker_lines(&PathBuf::from(format!("{}-2", marker.display()))),
        recovery.len(),
    );
    println!("{summary}");
    assert_eq!(completed, [true, true], "{summary}");
    assert_eq!(
        record.attempt_status,
        Some(AttemptStatus::Succeeded),
        "{summary}"
    );
    assert_eq!(record.attempt_number, 1, "{summary}");
    assert_eq!(marker_lines(&marker), 1, "{summary}");
    assert!(recovery.is_empty(), "{summary}");
    assert_eq!(fences, 0, "{summary}");
    assert!(
        heartbeat_gap <= limits.heartbeat_interval_ms + timeout_ms,
        "{summary}"
    );
    assert!(
        trace.max_gap() <= run_lease_ms / 3 + timeout_ms,
        "{summary}"
    );
    assert!(status.success(), "{summary}");
}
