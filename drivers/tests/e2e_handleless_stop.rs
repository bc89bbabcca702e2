//! Issue 16, item 6, second half, with the real binary: the Worker is killed (SIGKILL) after the
//! supervisor spawned the user process and before `started` (with its handle) is durable. The
//! supervisor published the process's durable handle (`receipts/<aa>/<attemptId>.handle`, 0600)
//! before the user command ran, so the restarted Worker, whose record has no handle
//! (`recovery_required(launch_outcome_unknown)`), still stops the exact process group when the
//! control plane asks — seconds, not the Run's 40 s — and the supervisor's receipt (143) then
//! completes the Run. Before this change the stop was `Unknown`: the Run ignored every stop
//! request and ran its full length.
//!
//! ```sh
//! cargo test --release -p ql-worker --test e2e_handleless_stop
//! ```

mod e2e_common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use e2e_common::{KillOnDrop, World, kill9};
use ql_worker::supervisor::DurableHandle;
use ql_worker::test_hooks::{STALL_HOOK_ENV, StallPoint};
use ql_worker_core::record::{RecoveryReason, State};
use ql_worker_tests::control_plane::{RevisionBuilder, RunSpec};

const SETTLE: Duration = Duration::from_secs(60);
/// How long the stop may take once the control plane asked (the lease-control cadence is
/// 100 ms here; TERM, verify, KILL takes a few seconds at most).
const STOP_WITHIN: Duration = Duration::from_secs(10);

/// The pid the user command wrote, once it exists.
fn user_pid(file: &Path) -> u32 {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(file)
            && let Ok(pid) = text.trim().parse()
        {
            return pid;
        }
        assert!(
            start.elapsed() < SETTLE,
            "the user command never wrote its pid"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn exists(pid: u32) -> bool {
    // A zombie still has its /proc entry; its state is `Z`.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| !stat[stat.rfind(')').unwrap() + 2..].starts_with('Z'))
}

#[test]
fn a_run_whose_worker_crashed_before_started_is_stopped_by_its_published_handle() {
    let world = World::new();
    let pid_file = world.dir.path().join("user.pid");
    // What the user command sees when it starts: the handle files already published.
    let seen = world.dir.path().join("seen-at-start");
    let script = format!(
        "ls {}/receipts/*/ > {}; echo $$ > {}; exec sleep 40",
        world.root().display(),
        seen.display(),
        pid_file.display()
    );
    let revision = RevisionBuilder::shell(&script).build().unwrap();
    let run = world
        .cp
        .enqueue_run(RunSpec::numbered(1, revision))
        .unwrap();
    let log = world.dir.path().join("worker.log");
    // The first Worker stalls once the supervisor reported the spawn, before `started`.
    let mut first = KillOnDrop(
        world.spawn_hooked_worker_logged(&[(STALL_HOOK_ENV, StallPoint::SPAWNED)], &log),
    );
    let user = user_pid(&pid_file);
    assert_eq!(
        world.state_of(&run),
        Some(State::Launching),
        "stalled before `started`"
    );
    let record = world.records().remove(&run).unwrap();
    assert_eq!(record.executor_handle, None);

    // The published identity: a private file holding the handle of exactly this process.
    let attempt = &record.offer.candidate.attempt_id;
    let published = ql_worker::layout::Paths::new(world.root()).published_handle(attempt);
    let meta = std::fs::symlink_metadata(&published).unwrap();
    assert!(meta.is_file());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600, "{published:?}");
    let text = std::fs::read_to_string(&published).unwrap();
    let handle = DurableHandle::parse(&text).unwrap();
    assert_eq!(handle.handle_id, attempt.as_str());
    assert_eq!(
        handle.identity.pid, user,
        "the handle names the user process"
    );
    assert_eq!(handle.identity.pgid, user);
    // Published before the user command ran: it saw the file when it started.
    let seen = std::fs::read_to_string(&seen).unwrap();
    assert!(
        seen.lines()
            .any(|l| l == format!("{}.handle", attempt.as_str())),
        "the user command started before its handle was published: {seen:?}"
    );

    kill9(&mut first.0);
    let _second = KillOnDrop(world.spawn_worker_logged(&[], &log));
    world.wait_for("launch_outcome_unknown recorded", SETTLE, |w| {
        w.records()
            .get(&run)
            .is_some_and(|r| r.recovery() == Some(RecoveryReason::LaunchOutcomeUnknown))
    });
    assert_eq!(world.records()[&run].executor_handle, None);
    assert!(exists(user), "the user process runs on after the restart");

    let asked = Instant::now();
    world.cp.cancel_run(&run).unwrap();
    while exists(user) {
        assert!(
            asked.elapsed() < STOP_WITHIN,
            "the user process (pid {user}) still runs {:?} after the stop request: a Run \
             without a handle in its record was not stopped\n{}",
            asked.elapsed(),
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let stopped_after = asked.elapsed();

    // The supervisor's receipt (killed by SIGTERM: 143) completes the Run.
    world.wait_for("completion_acknowledged", SETTLE, |w| {
        w.state_of(&run) == Some(State::CompletionAcknowledged)
    });
    let facts = world.cp.run(&run).unwrap().completion.unwrap();
    assert_eq!(facts.result.exit_code, 143);
    // The published handle goes with the receipt (removed right after completion_acknowledged
    // is durable).
    world.wait_for("the published handle removed", SETTLE, |_| {
        !published.exists()
    });
    println!("stopped {stopped_after:?} after the stop request");
}
