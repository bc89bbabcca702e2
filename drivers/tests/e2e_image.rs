//! What actually runs: the Worker and its supervisor are the binary under test, end to end.
//!
//! Natively, `/proc/<pid>/exe` of the Worker and of the supervisor (the parent of the user
//! process) is this build's `ql-worker`: the supervisor is the Worker's own image, executed from
//! the descriptor it opened at start-up. Under the edge smoke (`tests/edge/smoke.sh`, which sets
//! `QL_WORKER_BIN_UNDER_TEST` to a static cross build and `QL_WORKER_EMULATOR` to the qemu-user
//! interpreter `binfmt_misc` hands it to), both must be the emulator: the supervisor really ran
//! emulated, never silently as a host binary. The user command reads its parent's `exe` and
//! `cmdline`, and the log the Worker uploaded to the control plane carries them. The same holds
//! for `ql-worker-test-hooks`, which the restart tests run.

mod e2e_common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e_common::bin_under_test::{
    assert_supervisor_cmdline, emulator, expected_exe, expected_hooked_exe,
};
use e2e_common::{KillOnDrop, World, sigterm, wait_exit};
use ql_worker_core::record::State;
use ql_worker_core::wire::activation::RunStatus;
use ql_worker_tests::control_plane::{RevisionBuilder, RunSpec};

const SETTLE: Duration = Duration::from_secs(120);

fn canonical(path: &Path) -> PathBuf {
    std::fs::canonicalize(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn worker_and_supervisor_run_the_binary_under_test_and_complete_a_run() {
    let expected = canonical(&expected_exe());
    let world = World::new();
    // Line 1: the supervisor's executable; line 2: its argv (NULs as newlines).
    let revision =
        RevisionBuilder::shell("readlink /proc/$PPID/exe; tr '\\0' '\\n' < /proc/$PPID/cmdline")
            .build()
            .unwrap();
    let run = world
        .cp
        .enqueue_run(RunSpec::numbered(1, revision))
        .unwrap();
    let mut worker = KillOnDrop(world.spawn_worker(&[]));
    let worker_exe = std::fs::read_link(format!("/proc/{}/exe", worker.id())).unwrap();
    assert_eq!(
        worker_exe,
        expected,
        "the Worker runs {} (emulator: {:?})",
        expected.display(),
        emulator()
    );
    world.wait_for("completion_acknowledged", SETTLE, |w| {
        w.state_of(&run) == Some(State::CompletionAcknowledged)
    });
    sigterm(&worker);
    let status = wait_exit(&mut worker, Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "a drained Worker exits 0");

    let record = world.cp.run(&run).unwrap();
    assert_eq!(record.run_status, RunStatus::Succeeded);
    let completion = record.completion.unwrap();
    assert_eq!(completion.result.exit_code, 0);
    let log = world.cp.with_model(|m| {
        let artifacts = m.artifacts_of(&run);
        assert_eq!(artifacts.len(), 1, "one uploaded log");
        artifacts[0].1.head.clone()
    });
    assert_eq!(
        log.len() as u64,
        completion.artifact.byte_length,
        "the whole log fits in the stored head"
    );
    let text = String::from_utf8(log).unwrap();
    let (exe_line, argv) = text.split_once('\n').unwrap_or((&text, ""));
    assert_eq!(
        Path::new(exe_line),
        expected,
        "the supervisor (the user's parent) runs {}; log:\n{text}",
        expected.display()
    );
    let cmdline: Vec<u8> = argv
        .bytes()
        .map(|b| if b == b'\n' { 0 } else { b })
        .collect();
    assert_supervisor_cmdline(&cmdline);
}

#[test]
fn the_test_hooks_twin_runs_the_binary_under_test_too() {
    // The restart tests stop the Worker through `ql-worker-test-hooks`: it must be the binary
    // under test as well (emulated under the edge smoke), not silently this build's.
    let expected = canonical(&expected_hooked_exe());
    let world = World::new();
    let worker = KillOnDrop(world.spawn_hooked_worker(&[]));
    let exe = std::fs::read_link(format!("/proc/{}/exe", worker.id())).unwrap();
    assert_eq!(exe, expected, "emulator: {:?}", emulator());
}
