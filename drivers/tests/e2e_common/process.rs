//! The user process of a Run, seen from outside: its pid (written by the user command), its
//! supervisor (its parent), whether it still exists, and killing both at once.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use super::{events_named, wait_exit};

const SETTLE: Duration = Duration::from_secs(60);

/// The pid the user command wrote to `file`, once it exists.
pub fn user_pid(file: &Path) -> u32 {
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

/// The parent of `pid` (field 4 of `/proc/<pid>/stat`, after the last `)`).
pub fn parent_of(pid: u32) -> u32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    after.split(' ').nth(1).unwrap().parse().unwrap()
}

/// Whether `pid` exists and is not a zombie (a zombie keeps its `/proc` entry, state `Z`).
pub fn exists(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| !stat[stat.rfind(')').unwrap() + 2..].starts_with('Z'))
}

/// SIGKILLs the supervisor of the user process `user`, then the user's whole process group:
/// nothing of the Run is left and no receipt was published.
pub fn kill_supervisor_and_run(user: u32) {
    let supervisor = parent_of(user);
    assert_ne!(supervisor, 1, "the user process's parent is its supervisor");
    let kill = |pid: i32| {
        let status = Command::new("kill")
            .args(["-KILL", "--", &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill -KILL {pid}");
    };
    kill(i32::try_from(supervisor).unwrap());
    kill(-i32::try_from(user).unwrap());
    let start = Instant::now();
    while exists(supervisor) || exists(user) {
        assert!(start.elapsed() < SETTLE, "the Run's processes did not die");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `ql-worker drain` for the Worker `worker` (configuration `config`, JSON event log `log`),
/// whose only Run holds nothing any more: the drain does not wait for its 20 s budget. It ends
/// within 15 s with exit 4 (recovery evidence remains for the operator), no
/// `drain.budget_ended`, and exactly one `run.supervisor_gone`.
pub fn drain_ends_at_once(config: &Path, worker: &mut Child, log: &Path) {
    let started = Instant::now();
    let drain = Command::new(env!("CARGO_BIN_EXE_ql-worker"))
        .args(["drain", "--config"])
        .arg(config)
        .output()
        .unwrap();
    assert!(drain.status.success(), "{drain:?}");
    let status = wait_exit(worker, Duration::from_secs(15));
    let text = std::fs::read_to_string(log).unwrap();
    assert_eq!(status.code(), Some(4), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the drain waited {:?}",
        started.elapsed()
    );
    assert!(events_named(log, "drain.budget_ended").is_empty(), "{text}");
    assert_eq!(events_named(log, "run.supervisor_gone").len(), 1, "{text}");
}
