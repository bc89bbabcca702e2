//! Issue 16, item 6, second half, with the real binary: the Worker is killed (SIGKILL) after the
//! supervisor spawned the user process and before `started` (with its handle) is durable. The
//! supervisor published the process's durable handle (`receipts/<aa>/<attemptId>.handle`, 0600)
//! before the user command ran, so the restarted Worker, whose record has no handle
//! (`recovery_required(launch_outcome_unknown)`), still stops the exact process group when the
//! control plane asks — seconds, not the Run's 40 s — and the supervisor's receipt (143) then
//! completes the Run. Before this change the stop was `Unknown`: the Run ignored every stop
//! request and ran its full length.
//!
//! When that Run's supervisor and user process are killed as well (a reboot ends both), the
//! restarted Worker finds nothing left by the published handle and stops supervising the Run:
//! no renewal, no stop, and a drain that ends at once instead of waiting out its budget.
//!
//! ```sh
//! cargo test --release -p ql-worker --test e2e_handleless_stop
//! ```

mod e2e_common;

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use e2e_common::process::{drain_ends_at_once, exists, kill_supervisor_and_run, user_pid};
use e2e_common::{KillOnDrop, World, kill9, wait_event};
use ql_worker::supervisor::DurableHandle;
use ql_worker::test_hooks::{STALL_HOOK_ENV, StallPoint};
use ql_worker_core::ids::RunId;
use ql_worker_core::record::{RecoveryReason, State};
use ql_worker_tests::control_plane::{RevisionBuilder, RunSpec};

const SETTLE: Duration = Duration::from_secs(60);
/// How long the stop may take once the control plane asked (the lease-control cadence is
/// 100 ms here; TERM, verify, KILL takes a few seconds at most).
const STOP_WITHIN: Duration = Duration::from_secs(10);

/// A Run whose user command writes its pid, lists the published handles it sees, then runs
/// `rest`; a hooked Worker stalls once the supervisor reported the spawn, before `started`.
/// Returns the Run, the user process's pid and the stalled Worker, after checking the handle the
/// supervisor published: a private file naming exactly this process, there before the user
/// command ran.
fn stalled_after_spawn(world: &World, rest: &str, log: &Path) -> (RunId, u32, KillOnDrop) {
    let pid_file = world.dir.path().join("user.pid");
    // What the user command sees when it starts: the handle files already published.
    let seen = world.dir.path().join("seen-at-start");
    let script = format!(
        "ls {}/receipts/*/ > {}; echo $$ > {}; {rest}",
        world.root().display(),
        seen.display(),
        pid_file.display()
    );
    let revision = RevisionBuilder::shell(&script).build().unwrap();
    let run = world
        .cp
        .enqueue_run(RunSpec::numbered(1, revision))
        .unwrap();
    // The first Worker stalls once the supervisor reported the spawn, before `started`.
    let first =
        KillOnDrop(world.spawn_hooked_worker_logged(&[(STALL_HOOK_ENV, StallPoint::SPAWNED)], log));
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
    (run, user, first)
}

#[test]
fn a_run_whose_worker_crashed_before_started_is_stopped_by_its_published_handle() {
    let world = World::new();
    let log = world.dir.path().join("worker.log");
    let (run, user, mut first) = stalled_after_spawn(&world, "exec sleep 40", &log);
    let attempt = world.records()[&run].offer.candidate.attempt_id.clone();
    let published = ql_worker::layout::Paths::new(world.root()).published_handle(&attempt);

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

/// The Worker crashed before `started`, then the Run's supervisor and user process were killed
/// together (as a reboot ends them): no receipt can come. The restarted Worker records
/// `launch_outcome_unknown`, asks by the published handle whether anything of the Run is left,
/// finds nothing and stops supervising it: event `run.supervisor_gone` once, the record no
/// longer written (no renewal), and a drain ends at once with exit 4 (evidence stays for the
/// operator) instead of waiting out its budget for a Run that holds nothing.
#[test]
fn a_run_whose_worker_crashed_before_started_and_whose_processes_died_is_no_longer_supervised() {
    let world = World::new();
    let first_log = world.dir.path().join("first.log");
    let (run, user, mut first) = stalled_after_spawn(&world, "exec sleep 120", &first_log);
    kill9(&mut first.0);
    kill_supervisor_and_run(user);
    let log = world.dir.path().join("worker.log");
    let mut second = KillOnDrop(world.spawn_with_args(&["--log-format", "json"], &[], &log));
    world.wait_for("launch_outcome_unknown recorded", SETTLE, |w| {
        w.records()
            .get(&run)
            .is_some_and(|r| r.recovery() == Some(RecoveryReason::LaunchOutcomeUnknown))
    });
    let offer = world.records()[&run].offer.offer_id.as_str().to_owned();
    wait_event(&log, "run.supervisor_gone", SETTLE, |e| {
        e["offer"] == offer.as_str()
    });
    let record = world.records()[&run].clone();
    // Several lease-control cadences (100 ms here): nothing renews the lease any more.
    std::thread::sleep(Duration::from_millis(1_500));
    let later = &world.records()[&run];
    assert_eq!(
        later.revision, record.revision,
        "the record was written again"
    );
    assert_eq!(later.offer.lease.version, record.offer.lease.version);
    assert_eq!(
        later.recovery(),
        Some(RecoveryReason::LaunchOutcomeUnknown),
        "the first reason stays"
    );

    drain_ends_at_once(&world.config_path, &mut second.0, &log);
}
