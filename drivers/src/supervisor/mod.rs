//! The supervisor and launcher (ADR-0116 §1–2, §4; reference §4.3–§4.4, §5.1–§5.3, §5.5–§5.6;
//! SPEC §6). See `docs/supervisor.md` for the process tree and what survives what.
//!
//! * [`executor`]: the Executor port and [`SupervisorExecutor`], which the Worker uses to start a
//!   supervisor from its verified image and map the launch report to
//!   `Started` / `Rejected` / `Unknown`.
//! * [`main`]: the supervisor process itself (`ql-worker __supervise`): plan over stdin, spawn
//!   barrier re-check, spawn in its own process group, identity, log capture, truncation fact,
//!   receipt, exit with the user's code.
//! * [`stop`]: the stop controller, which signals a process group only after matching its durable
//!   identity.
//! * [`identity`]: `/proc` identity and the `ql3lp1.` handle.

pub mod capture;
pub mod executor;
mod frame;
pub mod identity;
pub mod mask;
pub mod plan;
pub mod reap;
pub mod report;
mod run;
pub mod stop;

mod authority;

use ql_worker_core::time::UnixMillis;

pub use executor::{
    DEFAULT_REPORT_TIMEOUT, Executor, ExecutorOutcome, Launch, SupervisorExecutor, SupervisorImage,
};
pub use identity::{DurableHandle, ProcRoot, ProcessIdentity};
pub use plan::{Capability, EnvVar, SecretString};
pub use report::{BarrierField, RejectReason, UnknownReason};
pub use run::NO_SPAWN_EXIT;
pub use stop::{StopController, StopOutcome, StopSignal, StopUnknown};

/// `argv[1]` that turns the `ql-worker` binary into a supervisor. No plan data is ever on argv.
pub const SUPERVISE_ARG: &str = "__supervise";

/// `argv[1]` of the held user process: the supervisor spawns this image with the user's
/// program and arguments after it; it waits until the supervisor has published its durable
/// handle, then executes them (issue 16).
pub const HOLD_ARG: &str = "__hold";

/// The held user process's entry point (see [`HOLD_ARG`]): executes the user command once
/// released, or exits without running it.
pub fn hold_main() -> ! {
    std::process::exit(run::hold())
}

/// The supervisor entry point: runs the supervisor and exits the process with the user's exit
/// code (or [`NO_SPAWN_EXIT`]). Every buffer that held the plan is wiped before exit.
pub fn main() -> ! {
    // The Worker's event-log format (its diagnostics share the Worker's stderr).
    let format = std::env::var(crate::events::ENV_LOG_FORMAT)
        .ok()
        .and_then(|f| crate::events::Format::parse(&f))
        .unwrap_or_default();
    crate::events::init(format, log::LevelFilter::Info);
    let code = run::supervise();
    std::process::exit(code)
}

/// The descriptors above 2 that a child process would inherit (no `FD_CLOEXEC`), read from
/// `/proc/self/fdinfo`. The supervisor refuses to spawn while this is not empty: without
/// `unsafe` it cannot close descriptors it does not own, and the user must inherit nothing but
/// stdin, stdout and stderr. Start the Worker with a clean descriptor table (systemd does); the
/// CLI can call this at start-up to fail loudly instead of rejecting every launch.
///
/// # Errors
/// When `/proc/self/fdinfo` cannot be listed.
pub fn inheritable_descriptors() -> std::io::Result<Vec<u32>> {
    const O_CLOEXEC: u32 = 0o2_000_000;
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fdinfo")? {
        let entry = entry?;
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if fd <= 2 {
            continue;
        }
        // A descriptor closed since the listing (the listing's own, for one) is skipped.
        let Ok(info) = std::fs::read_to_string(entry.path()) else {
            continue;
        };
        let flags = info
            .lines()
            .find_map(|l| l.strip_prefix("flags:"))
            .and_then(|f| u32::from_str_radix(f.trim(), 8).ok());
        if flags.is_none_or(|flags| flags & O_CLOEXEC == 0) {
            found.push(fd);
        }
    }
    found.sort_unstable();
    Ok(found)
}

/// The wall clock, in Unix milliseconds (launch and receipt times), read in [`crate::os`].
pub(crate) fn unix_millis_now() -> UnixMillis {
    crate::os::now()
}
