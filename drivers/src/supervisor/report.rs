//! The launch report: one small frame the supervisor writes on its stdout pipe, once, and the
//! reasons it can carry. Reasons are fixed vocabularies: no path, value or message text that could
//! carry a Secret.

use serde::{Deserialize, Serialize};

pub use ql_worker_core::barrier::BarrierField;

use super::frame::{self, FrameError};
use super::plan::PlanError;
use crate::containment::PolicyRule;

/// Magic of a report frame.
pub(crate) const REPORT_MAGIC: [u8; 4] = *b"QLSR";
/// Largest report frame.
pub(crate) const MAX_REPORT_BYTES: usize = 1024;

/// What the supervisor tells the Worker about the launch.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Report {
    /// The user process exists; here is its durable handle.
    Started {
        /// The `ql3lp1.` handle.
        handle: String,
        /// `executorStartedAtMs`, echoed from the plan.
        started_at_ms: u64,
    },
    /// Proof that no user process was started.
    Rejected(RejectReason),
    /// A user process may exist but its outcome is not proven.
    Unknown(UnknownReason),
}

impl Report {
    pub(crate) fn encode(&self) -> Result<zeroize::Zeroizing<Vec<u8>>, FrameError> {
        frame::encode(REPORT_MAGIC, self, MAX_REPORT_BYTES)
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, FrameError> {
        frame::decode(REPORT_MAGIC, bytes, MAX_REPORT_BYTES)
    }
}

/// Why no user process was started. Every variant is proof of no spawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum RejectReason {
    /// The durable `launching` record differs from the plan: the spawn barrier drifted.
    #[error("spawn barrier drifted: {0}")]
    BarrierDrift(BarrierField),
    /// The inbox record could not be read, so the barrier could not be crossed.
    #[error("spawn barrier unreadable: the inbox record could not be read")]
    BarrierUnreadable,
    /// The plan broke a launcher rule.
    #[error("launch plan invalid: {0}")]
    PlanInvalid(PlanError),
    /// The supervisor did not receive one complete plan.
    #[error("launch plan not received by the supervisor")]
    PlanNotReceived,
    /// `executorStartedAtMs` was later than the launcher's clock. No longer produced (issue 16,
    /// item 5): a wall clock stepped back between the Worker's reading and the supervisor's
    /// refused a good launch, and the check protected nothing the barrier match does not (the
    /// start time is the Worker's own, matched against the durable record). Kept so that the
    /// report encoding of the variants after it does not change.
    #[error("executorStartedAtMs is in the future")]
    StartTimeInFuture,
    /// `timeoutMs` and `executionDeadlineAtMs` are not both present or both absent.
    #[error("timeout without durable deadline authority (or deadline without timeout)")]
    TimeoutWithoutDeadline,
    /// The log spool file could not be opened for capture.
    #[error("log spool unavailable")]
    LogUnavailable,
    /// The supervisor could not become a child subreaper.
    #[error("child subreaper unavailable")]
    SubreaperUnavailable,
    /// The supervisor holds an inheritable descriptor beyond 0-2 that the user would inherit.
    #[error("supervisor holds an inheritable descriptor {0} beyond stdio")]
    InheritedDescriptor(u32),
    /// The capture pipe could not be created.
    #[error("capture pipe unavailable")]
    PipeUnavailable,
    /// `spawn` failed before exec: the user program never ran.
    #[error("spawn failed before exec (os error {errno})")]
    SpawnFailed {
        /// The OS error number, or 0.
        errno: i32,
    },
    /// The execution policy refused the command (decided by the Worker before it started a
    /// supervisor, and again by the supervisor after its barrier re-check).
    #[error("refused by the execution policy: {0}")]
    PolicyRefused(PolicyRule),
    /// The Run's directory in the runs area could not be created (or no uid of the range is
    /// free).
    #[error("the Run's directory in the runs area could not be created (os error {errno})")]
    RunDirectoryUnavailable {
        /// The OS error number, or 0.
        errno: i32,
    },
    /// The Run's cgroup could not be created or limited, or the held process moved into it.
    #[error(
        "the Run's cgroup could not be created or limited, or the held process moved into it (os error {errno})"
    )]
    CgroupUnavailable {
        /// The OS error number, or 0.
        errno: i32,
    },
    /// No new privileges, the capability sets or a resource limit could not be set.
    #[error(
        "no_new_privileges, capabilities or a resource limit could not be set (os error {errno})"
    )]
    LimitsUnavailable {
        /// The OS error number, or 0.
        errno: i32,
    },
    /// The supervisor image could not be executed.
    #[error("supervisor could not be started (os error {errno})")]
    SupervisorSpawnFailed {
        /// The OS error number, or 0.
        errno: i32,
    },
    /// The user process's durable handle could not be published before the user command ran:
    /// the held process was killed before it could run it (issue 16).
    #[error("the durable handle could not be published before the user command ran")]
    HandleUnpublished,
}

/// Why the launch outcome is not known. A user process may exist.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum UnknownReason {
    /// The user process was spawned but its durable identity could not be captured; the
    /// supervisor stopped its process group.
    #[error("identity capture failed after spawn; process group stopped")]
    IdentityCaptureFailed,
    /// The durable handle could not be encoded.
    #[error("durable handle could not be encoded")]
    HandleUnencodable,
    /// The supervisor closed its report pipe without a report.
    #[error("supervisor ended without a launch report")]
    ReportMissing,
    /// The report bytes are not a valid report.
    #[error("supervisor launch report is malformed")]
    ReportGarbled,
    /// No report arrived in time.
    #[error("supervisor launch report timed out")]
    ReportTimedOut,
    /// Reading the report failed.
    #[error("supervisor launch report unreadable")]
    ReportUnreadable,
    /// The reported handle is not a valid `ql3lp1.` handle.
    #[error("reported executor handle is invalid")]
    HandleInvalid,
    /// The reported start time differs from the durable one.
    #[error("reported start time differs from executorStartedAtMs")]
    StartTimeMismatch,
}

#[cfg(test)]
mod tests {
    use ql_worker_core::record::State;

    use super::*;

    #[test]
    fn reports_round_trip() {
        for report in [
            Report::Started {
                handle: "ql3lp1.x".into(),
                started_at_ms: 5,
            },
            Report::Rejected(RejectReason::BarrierDrift(BarrierField::State(
                State::Started,
            ))),
            Report::Rejected(RejectReason::SpawnFailed { errno: 2 }),
            Report::Rejected(RejectReason::PolicyRefused(PolicyRule::ShellRefused)),
            Report::Unknown(UnknownReason::IdentityCaptureFailed),
        ] {
            let frame = report.encode().unwrap();
            assert_eq!(Report::decode(&frame).unwrap(), report);
        }
    }
}
