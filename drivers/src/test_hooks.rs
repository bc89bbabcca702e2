//! The test-only stall hook, compiled only with the `test-hooks` feature and installed only by the
//! `ql-worker-test-hooks` binary (never by `ql-worker`, even when the library was compiled with
//! the feature, as it is in `cargo test` builds).
//!
//! `QL_WORKER_FAULT_STALL_AFTER=<state>|spawned`: the Worker stops answering at that point (see
//! [`StallPoint`]), so a test can SIGKILL it with exactly that fact on disk. (The fault-injecting
//! file seam, `FaultFs`, is in the test crate `ql-worker-sim`.)

use std::sync::OnceLock;

pub use crate::host::StallPoint;

/// Environment variable of the crash-test stall hook.
pub const STALL_HOOK_ENV: &str = "QL_WORKER_FAULT_STALL_AFTER";

static STALL: OnceLock<StallPoint> = OnceLock::new();

/// Reads the hooks from the environment and installs them for this process (called by the
/// `ql-worker-test-hooks` binary before anything else).
///
/// # Errors
/// A value that names no stall point.
pub fn install_from_env() -> Result<(), String> {
    let Some(name) = std::env::var_os(STALL_HOOK_ENV) else {
        return Ok(());
    };
    let text = name.to_string_lossy();
    let point = StallPoint::parse(&text).ok_or_else(|| {
        format!(
            "{STALL_HOOK_ENV}: must be a record state (accepted, launching, ...) or `{}`",
            StallPoint::SPAWNED
        )
    })?;
    let _ = STALL.set(point);
    Ok(())
}

/// The installed stall point, if any.
#[must_use]
pub fn stall_point() -> Option<StallPoint> {
    STALL.get().copied()
}
