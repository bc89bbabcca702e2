//! The spare supervisor with the real binary: an idle Worker keeps one supervisor started ahead
//! of need, the next Run's plan goes to it (the Run's shell is its child), a new one is started
//! once that Run is done, and a drain leaves none behind.

mod e2e_common;

use std::time::Duration;

use e2e_common::{KillOnDrop, World, sigterm, wait_exit};
use ql_worker_core::record::State;
use ql_worker_tests::control_plane::{RevisionBuilder, RunSpec};

const WAIT: Duration = Duration::from_secs(30);

/// `/proc/<pid>/cmdline` ends with `ql-worker <mode>` (`__supervise`, `__hold`): natively the
/// whole of it; under a binfmt_misc emulator the interpreter and the executed path come first.
fn runs_mode(pid: u32, mode: &str) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
        let args: Vec<&[u8]> = cmdline
            .strip_suffix(b"\0")
            .unwrap_or(&cmdline)
            .split(|b| *b == 0)
            .collect();
        args.ends_with(&[b"ql-worker", mode.as_bytes()])
    })
}

fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, tail) = stat.rsplit_once(')')?;
    tail.split_ascii_whitespace().nth(1)?.parse().ok()
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc").map_or_else(
        |_| Vec::new(),
        |dir| {
            dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        },
    )
}

fn children_of(pid: u32) -> Vec<u32> {
    all_pids()
        .into_iter()
        .filter(|&p| parent_of(p) == Some(pid))
        .collect()
}

/// The Worker's children that run `ql-worker __supervise` and whose only child is their held
/// process, still `ql-worker __hold` (a supervisor waiting for a plan; it starts its held
/// process before it has one).
fn idle_supervisors(worker: u32) -> Vec<u32> {
    children_of(worker)
        .into_iter()
        .filter(|&pid| runs_mode(pid, ql_worker::supervisor::SUPERVISE_ARG))
        .filter(|&pid| {
            matches!(children_of(pid).as_slice(),
                [held] if runs_mode(*held, ql_worker::supervisor::HOLD_ARG))
        })
        .collect()
}

fn wait_one_spare(worker: u32, not: Option<u32>) -> u32 {
    let start = std::time::Instant::now();
    loop {
        let idle = idle_supervisors(worker);
        if let [one] = idle.as_slice()
            && Some(*one) != not
        {
            return *one;
        }
        assert!(idle.len() <= 1, "one spare at most: {idle:?}");
        assert!(start.elapsed() < WAIT, "no spare supervisor appeared");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_next_run_goes_to_the_spare_supervisor_and_a_drain_retires_it() {
    let world = World::new();
    let mut worker = KillOnDrop(world.spawn_worker(&[]));
    let pid = worker.id();
    let spare = wait_one_spare(pid, None);

    let revision = RevisionBuilder::shell("echo \"$PPID\"").build().unwrap();
    let run = world
        .cp
        .enqueue_run(RunSpec::numbered(1, revision))
        .unwrap();
    world.wait_for("the Run completed", WAIT, |w| {
        w.state_of(&run) == Some(State::CompletionAcknowledged)
    });
    assert_eq!(
        world.artifact_heads(&run),
        vec![format!("{spare}\n").into_bytes()],
        "the Run's shell is a child of the supervisor started ahead of need"
    );

    // Once that Run is done, another spare waits; a drain retires it and the Worker exits 0.
    let next = wait_one_spare(pid, Some(spare));
    let held = children_of(next);
    assert_eq!(held.len(), 1, "the spare's held process: {held:?}");
    sigterm(&worker);
    assert_eq!(wait_exit(&mut worker, WAIT).code(), Some(0));
    assert!(
        !std::path::Path::new(&format!("/proc/{next}")).exists(),
        "the spare {next} was retired and reaped"
    );
    assert!(
        !std::path::Path::new(&format!("/proc/{}", held[0])).exists(),
        "the spare's held process {} went with it",
        held[0]
    );
}
