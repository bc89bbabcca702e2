//! Reaping as a child subreaper.
//!
//! The supervisor sets `PR_SET_CHILD_SUBREAPER`, so every descendant of the user process that
//! loses its parent (a double-forked daemon, a `setsid` escapee) is re-parented to the supervisor
//! instead of PID 1. The rule: **the job ends when the user process (the group leader) exits.**
//! At that moment the supervisor `SIGKILL`s the user's process group while the leader is still an
//! unreaped zombie (so the group id cannot have been reused), reaps the leader, and then kills and
//! reaps every remaining descendant, which by then are all its own children or their descendants.
//! Only the supervisor's own unreaped children are signalled individually: their pids cannot be
//! reused until they are reaped, so no unrelated process can be hit.

use std::fs;
use std::io;
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::process::{
    Pid, Signal, WaitId, WaitIdOptions, WaitOptions, WaitStatus, getpid, kill_process,
    kill_process_group, wait, waitid, waitpid,
};

/// How the user process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Exited with this code.
    Code(u8),
    /// Killed by this signal.
    Signal(u8),
}

impl Exit {
    /// The receipt's exit code: the code, or 128 + the signal number.
    #[must_use]
    pub fn receipt_code(self) -> u8 {
        match self {
            Self::Code(code) => code,
            Self::Signal(signal) => 128u8.saturating_add(signal),
        }
    }

    fn from_status(status: WaitStatus) -> Self {
        if let Some(code) = status.exit_status() {
            Self::Code(u8::try_from(code & 0xff).unwrap_or(u8::MAX))
        } else if let Some(signal) = status.terminating_signal() {
            Self::Signal(u8::try_from(signal & 0x7f).unwrap_or(0x7f))
        } else {
            // Stopped/continued statuses are not requested; treat anything else as a failure.
            Self::Code(u8::MAX)
        }
    }
}

/// Waits for the user process (`user`, leader of its own process group) to exit. Orphaned
/// descendants that exit meanwhile are reaped. When the leader exits, its group is killed while
/// the leader is still a zombie, and then the leader is reaped.
///
/// # Errors
/// An unexpected `wait` error (not `EINTR`).
pub fn wait_for_user(user: Pid) -> io::Result<Exit> {
    loop {
        // Block until some child has exited, leaving it waitable.
        match waitid(WaitId::All, WaitIdOptions::EXITED | WaitIdOptions::NOWAIT) {
            Ok(_) => {}
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
        // Is it the user process? Peek without reaping: the zombie pins the group id.
        match waitid(
            WaitId::Pid(user),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT | WaitIdOptions::NOHANG,
        ) {
            Ok(Some(_)) => {
                let _ = kill_process_group(user, Signal::KILL);
                return reap_exact(user);
            }
            Ok(None) => {}
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
        // An orphaned descendant exited. Reap one child; if the user process exited in between
        // and is the one reaped, that is its status (its group is then cleaned up by
        // `kill_descendants`, which signals only our own children).
        match wait(WaitOptions::NOHANG) {
            Ok(Some((pid, status))) if pid == user => return Ok(Exit::from_status(status)),
            Ok(_) | Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Waits for and reaps exactly `pid`.
pub(crate) fn reap_exact(pid: Pid) -> io::Result<Exit> {
    loop {
        match waitpid(Some(pid), WaitOptions::empty()) {
            Ok(Some((_, status))) => return Ok(Exit::from_status(status)),
            Ok(None) | Err(Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
}

/// Polls (without reaping) whether `pid`, our child, has exited, for up to `grace`.
pub fn exited_within(pid: Pid, grace: Duration) -> bool {
    let deadline = Instant::now() + grace;
    loop {
        match waitid(
            WaitId::Pid(pid),
            WaitIdOptions::EXITED | WaitIdOptions::NOWAIT | WaitIdOptions::NOHANG,
        ) {
            Ok(Some(_)) | Err(Errno::CHILD) => return true,
            Ok(None) | Err(_) => {}
        }
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// The pids whose parent is this process, from `/proc/*/stat`.
fn own_children(proc_root: &Path) -> Vec<Pid> {
    let me = getpid().as_raw_pid();
    let Ok(entries) = fs::read_dir(proc_root) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(stat) = fs::read_to_string(proc_root.join(pid.to_string()).join("stat")) else {
                return false;
            };
            stat.rsplit_once(')')
                .and_then(|(_, tail)| tail.split_ascii_whitespace().nth(1)?.parse::<i32>().ok())
                == Some(me)
        })
        .filter_map(Pid::from_raw)
        .collect()
}

/// After the user process has exited: kill and reap every remaining descendant, until none is
/// left or `deadline` passes. Returns whether no child remains.
pub fn kill_descendants(proc_root: &Path, deadline: Instant) -> bool {
    loop {
        // Reap everything that has already exited.
        loop {
            match wait(WaitOptions::NOHANG) {
                Ok(Some(_)) | Err(Errno::INTR) => {}
                Ok(None) => break,
                Err(Errno::CHILD) => return true,
                Err(_) => return false,
            }
        }
        if Instant::now() >= deadline {
            return false;
        }
        // Children of ours that are still alive: unreaped, so their pids are pinned.
        for pid in own_children(proc_root) {
            let _ = kill_process(pid, Signal::KILL);
        }
        thread::sleep(Duration::from_millis(5));
    }
}
