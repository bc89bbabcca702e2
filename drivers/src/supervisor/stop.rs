//! The stop controller (reference §5.6): stop exactly the process group named by a durable
//! handle, and never signal a process whose identity does not match.
//!
//! 1. Parse the handle (bad → `unknown(invalid_handle)`, no signal).
//! 2. Inspect: not running → `already_exited`; inconclusive → `unknown`.
//! 3. `SIGTERM` the group; poll until the leader is gone or the TERM grace ends → `stopped(TERM)`.
//! 4. Re-inspect the full identity; gone → `stopped(TERM)`; inconclusive → `unknown`.
//! 5. `SIGKILL` the group; poll until gone → `stopped(KILL)`, else `unknown(timed_out)`.
//!
//! The user process is the group leader and the supervisor's child, not the Worker's, so the
//! supervisor survives the stop and publishes the receipt with exit code 128 + signal.
//!
//! Residual race (shared with the reference): between an inspection that says `running` and the
//! `kill`, the leader could exit, be reaped by the supervisor, and its pid and group id be reused
//! by a new group leader. The supervisor kills the group and reaps the leader immediately when
//! the leader exits, which keeps this window to microseconds.

use std::thread;
use std::time::{Duration, Instant};

use rustix::io::Errno;
use rustix::process::{Pid, Signal, kill_process_group};

use super::identity::{DurableHandle, InspectUnknown, Inspection, ProcRoot, inspect};

/// Which signal ended the process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopSignal {
    /// `SIGTERM` sufficed.
    Term,
    /// `SIGKILL` was needed.
    Kill,
}

/// Why a stop is inconclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopUnknown {
    /// The handle is not a canonical `ql3lp1.` handle; nothing was signalled.
    InvalidHandle,
    /// The identity provider could not be read; nothing more was signalled.
    ProviderUnavailable,
    /// `/proc/<pid>/stat` could not be read.
    StatUnreadable,
    /// `kill` failed with something other than `ESRCH`.
    SignalFailed,
    /// The process was still alive after `SIGKILL` and its grace.
    TimedOut,
}

/// The result of a stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopOutcome {
    /// The exact process was running and is now gone.
    Stopped(StopSignal),
    /// The exact process was already gone; nothing was signalled.
    AlreadyExited,
    /// Nothing can be concluded.
    Unknown(StopUnknown),
}

impl From<StopOutcome> for ql_worker_core::io::StopOutcome {
    /// The core's input: stopped, already exited, or unknown.
    fn from(outcome: StopOutcome) -> Self {
        match outcome {
            StopOutcome::Stopped(_) => Self::Stopped,
            StopOutcome::AlreadyExited => Self::AlreadyExited,
            StopOutcome::Unknown(_) => Self::Unknown,
        }
    }
}

/// Stop controller settings (reference defaults: 1 s TERM grace, 1 s KILL grace, 25 ms poll).
#[derive(Clone, Debug)]
pub struct StopController {
    proc_root: ProcRoot,
    term_grace: Duration,
    kill_grace: Duration,
    poll: Duration,
}

impl Default for StopController {
    fn default() -> Self {
        Self {
            proc_root: ProcRoot::system(),
            term_grace: Duration::from_millis(1000),
            kill_grace: Duration::from_millis(1000),
            poll: Duration::from_millis(25),
        }
    }
}

const MAX_GRACE: Duration = Duration::from_secs(30);

impl StopController {
    /// Sets the graces and the poll interval, each clamped to 1 ms ..= 30 s, poll ≤ graces.
    #[must_use]
    pub fn with_timing(
        mut self,
        term_grace: Duration,
        kill_grace: Duration,
        poll: Duration,
    ) -> Self {
        let clamp = |d: Duration| d.clamp(Duration::from_millis(1), MAX_GRACE);
        self.term_grace = clamp(term_grace);
        self.kill_grace = clamp(kill_grace);
        self.poll = clamp(poll).min(self.term_grace).min(self.kill_grace);
        self
    }

    /// Reads identities from another `/proc`-like tree (tests).
    #[doc(hidden)]
    #[must_use]
    pub fn with_proc_root(mut self, proc_root: ProcRoot) -> Self {
        self.proc_root = proc_root;
        self
    }

    /// Stops the process group named by `handle`.
    #[must_use]
    pub fn stop(&self, handle: &str) -> StopOutcome {
        let Ok(handle) = DurableHandle::parse(handle) else {
            return StopOutcome::Unknown(StopUnknown::InvalidHandle);
        };
        let identity = &handle.identity;
        let Some(pgid) = i32::try_from(identity.pgid).ok().and_then(Pid::from_raw) else {
            return StopOutcome::Unknown(StopUnknown::InvalidHandle);
        };
        match inspect(&self.proc_root, identity) {
            Inspection::NotRunning => return StopOutcome::AlreadyExited,
            Inspection::Unknown(why) => return StopOutcome::Unknown(unknown(why)),
            Inspection::Running => {}
        }
        if let Err(outcome) = signal(pgid, Signal::TERM) {
            return outcome;
        }
        match self.poll_gone(identity, self.term_grace) {
            Inspection::NotRunning => return StopOutcome::Stopped(StopSignal::Term),
            Inspection::Unknown(why) => return StopOutcome::Unknown(unknown(why)),
            Inspection::Running => {}
        }
        // Re-inspect the full identity right before escalating.
        match inspect(&self.proc_root, identity) {
            Inspection::NotRunning => return StopOutcome::Stopped(StopSignal::Term),
            Inspection::Unknown(why) => return StopOutcome::Unknown(unknown(why)),
            Inspection::Running => {}
        }
        if let Err(outcome) = signal(pgid, Signal::KILL) {
            return outcome;
        }
        match self.poll_gone(identity, self.kill_grace) {
            Inspection::NotRunning => StopOutcome::Stopped(StopSignal::Kill),
            Inspection::Unknown(why) => StopOutcome::Unknown(unknown(why)),
            Inspection::Running => StopOutcome::Unknown(StopUnknown::TimedOut),
        }
    }

    /// Whether the process named by `handle` still runs, without signalling anything: `Gone`
    /// when its full identity matches no live process, `Unknown` for a bad handle or an
    /// unreadable identity.
    #[must_use]
    pub fn liveness(&self, handle: &str) -> ql_worker_core::io::Liveness {
        use ql_worker_core::io::Liveness;
        let Ok(handle) = DurableHandle::parse(handle) else {
            return Liveness::Unknown;
        };
        match inspect(&self.proc_root, &handle.identity) {
            Inspection::Running => Liveness::Alive,
            Inspection::NotRunning => Liveness::Gone,
            Inspection::Unknown(_) => Liveness::Unknown,
        }
    }

    fn poll_gone(
        &self,
        identity: &super::identity::ProcessIdentity,
        grace: Duration,
    ) -> Inspection {
        let deadline = Instant::now() + grace;
        loop {
            let seen = inspect(&self.proc_root, identity);
            if seen != Inspection::Running || Instant::now() >= deadline {
                return seen;
            }
            thread::sleep(self.poll);
        }
    }
}

fn unknown(why: InspectUnknown) -> StopUnknown {
    match why {
        InspectUnknown::ProviderUnavailable => StopUnknown::ProviderUnavailable,
        InspectUnknown::StatUnreadable => StopUnknown::StatUnreadable,
    }
}

fn signal(pgid: Pid, signal: Signal) -> Result<(), StopOutcome> {
    match kill_process_group(pgid, signal) {
        Ok(()) | Err(Errno::SRCH) => Ok(()),
        Err(_) => Err(StopOutcome::Unknown(StopUnknown::SignalFailed)),
    }
}
