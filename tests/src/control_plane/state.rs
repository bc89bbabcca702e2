//! The control plane's durable state, fully inspectable: Worker Sessions, Runs with their one
//! Attempt and Run lease, stored artifacts and attestations. [`CpState`] is `Clone + Eq`, so a
//! test can snapshot it before a request and assert that a refused request changed nothing.

use std::collections::BTreeMap;

use ql_worker_core::ids::{
    AttemptId, CallbackSequence, CapabilityDigest, ExecutorHandle, LeaseGeneration, LeaseVersion,
    LogArtifactId, OfferId, ProjectId, RunId, SessionId, Sha256Digest, TaskId, WorkerGeneration,
    WorkerId,
};
use ql_worker_core::revision::ExecutionRevision;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::activation::{AttemptStatus, RunStatus};
use ql_worker_core::wire::completion::CompletionResult;
use ql_worker_core::wire::lease_control::StopReason;
use ql_worker_core::wire::session::{Capabilities, SessionStatus};

use super::requests::{ArtifactRef, AttestationState};

/// Everything the control plane persists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CpState {
    /// The current Session of each Worker.
    pub sessions: BTreeMap<WorkerId, SessionRecord>,
    /// Runs by id.
    pub runs: BTreeMap<RunId, RunRecord>,
    /// Stored log artifacts.
    pub artifacts: BTreeMap<ArtifactKey, StoredArtifact>,
    /// Accepted attestations by id.
    pub attestations: BTreeMap<String, AttestationRecord>,
}

/// A Worker Session (reference `WorkerSessionRecord`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionRecord {
    /// Worker.
    pub worker_id: WorkerId,
    /// Current Session.
    pub session_id: SessionId,
    /// Generation: +1 whenever a new Session replaces the old one.
    pub generation: WorkerGeneration,
    /// Record version: +1 per register (same Session), heartbeat and transition; 0 for a new
    /// generation.
    pub version: u64,
    /// `online`, `draining` or `offline`.
    pub status: SessionStatus,
    /// The canonical capabilities JSON as registered.
    pub capabilities_json: String,
    /// The parsed capabilities.
    pub capabilities: Capabilities,
    /// `maxConcurrentRuns`.
    pub max_concurrent_runs: u64,
    /// `availableSlots` as last reported (0 unless online).
    pub available_slots: u64,
    /// Session lease duration asked for.
    pub lease_duration_ms: u64,
    /// First registration of this generation.
    pub registered_at: UnixMillis,
    /// Last register or heartbeat.
    pub last_heartbeat_at: UnixMillis,
    /// Session lease expiry.
    pub lease_expires_at: UnixMillis,
    /// Last update.
    pub updated_at: UnixMillis,
}

impl SessionRecord {
    /// Online, with a free slot and an unexpired Session lease at `now`.
    pub fn accepts_work(&self, now: UnixMillis) -> bool {
        self.status == SessionStatus::Online
            && self.available_slots >= 1
            && now < self.lease_expires_at
    }
}

/// The Run lease's own status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseState {
    /// Held by a Worker.
    Leased,
    /// Closed by completion or start failure (version +1).
    Completed,
    /// Closed by [`super::ControlPlane::reap_expired_leases`] after its expiry.
    Expired,
}

/// A Run lease (reference `RunDispatchLease`); stores only the token's digest.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseRecord {
    /// The Worker-generated offer id it was claimed with.
    pub offer_id: OfferId,
    /// Holder.
    pub worker_id: WorkerId,
    /// Holder's Session.
    pub session_id: SessionId,
    /// Holder's Session generation.
    pub worker_generation: WorkerGeneration,
    /// `sha256_hex(utf8(leaseToken))`, compared in constant time.
    pub token_digest: CapabilityDigest,
    /// Status.
    pub state: LeaseState,
    /// Version: 0 at claim, +1 per renewal, +1 at completion or start failure.
    pub version: LeaseVersion,
    /// Generation of this Attempt's lease.
    pub lease_generation: LeaseGeneration,
    /// Claim time.
    pub acquired_at: UnixMillis,
    /// Last renewal.
    pub renewed_at: UnixMillis,
    /// Expiry.
    pub expires_at: UnixMillis,
    /// Last update.
    pub updated_at: UnixMillis,
}

/// A durable cancel intent (ADR-0118): user cancellation or the timeout deadline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CancelIntent {
    /// `user`, `timeout`, ….
    pub reason: StopReason,
    /// When it was written.
    pub requested_at: UnixMillis,
}

/// The facts of an applied completion; an exact replay must repeat them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompletionFacts {
    /// The lease version the completion was fenced with (the lease is now at +1).
    pub expected_lease_version: LeaseVersion,
    /// `callbackSequence`.
    pub callback_sequence: CallbackSequence,
    /// `callbackTokenDigest`.
    pub callback_token_digest: Sha256Digest,
    /// `result`.
    pub result: CompletionResult,
    /// `artifact`.
    pub artifact: ArtifactRef,
}

/// What happened to a Run, in order (server-generated events).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunEventKind {
    /// Enqueued by the test API.
    Queued,
    /// Claimed through an offer.
    Claimed {
        /// The offer.
        offer_id: OfferId,
    },
    /// Starting ACK applied (Attempt `claimed → starting`).
    AttemptStarting,
    /// Running ACK applied: the Attempt event.
    AttemptRunning,
    /// Running ACK applied: the Run event.
    RunRunning,
    /// Lease renewed to this version.
    LeaseRenewed {
        /// The new version.
        version: LeaseVersion,
    },
    /// A cancel intent was written.
    CancelRequested {
        /// Why.
        reason: StopReason,
    },
    /// The Attempt reached a terminal status.
    AttemptFinished {
        /// Its status.
        status: AttemptStatus,
    },
    /// The Run reached a terminal status.
    RunFinished {
        /// Its status.
        status: RunStatus,
    },
    /// The lease expired and was reaped.
    LeaseExpired,
}

/// One Run event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunEvent {
    /// Server sequence number (deterministic counter).
    pub seq: u64,
    /// Server time.
    pub at: UnixMillis,
    /// What.
    pub kind: RunEventKind,
}

/// A Run and its single Attempt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunRecord {
    /// Run.
    pub run_id: RunId,
    /// Its Attempt.
    pub attempt_id: AttemptId,
    /// Project (from the revision).
    pub project_id: ProjectId,
    /// Task (from the revision).
    pub task_id: TaskId,
    /// The pinned execution revision.
    pub revision: ExecutionRevision,
    /// Scheduling priority (higher first).
    pub priority: i64,
    /// Enqueue time.
    pub queued_at: UnixMillis,
    /// Attempt creation time.
    pub attempt_created_at: UnixMillis,
    /// 1-based.
    pub attempt_number: u64,
    /// Enqueue order (tie breaker).
    pub enqueue_seq: u64,
    /// Run status.
    pub run_status: RunStatus,
    /// Attempt status; `None` while the Run waits in the queue unclaimed.
    pub attempt_status: Option<AttemptStatus>,
    /// The Run lease, once claimed.
    pub lease: Option<LeaseRecord>,
    /// `deadline_at = starting time + timeoutMs`, set by the first starting ACK.
    pub deadline_at: Option<UnixMillis>,
    /// Running ACK time.
    pub started_at: Option<UnixMillis>,
    /// Terminal time.
    pub finished_at: Option<UnixMillis>,
    /// From the running ACK.
    pub executor_handle: Option<ExecutorHandle>,
    /// From the running ACK (`null` ⇒ `None`).
    pub log_artifact_id: Option<String>,
    /// 0 until the running ACK (or a completion from `starting`) sets it.
    pub callback_sequence: u64,
    /// From the running ACK.
    pub callback_token_digest: Option<Sha256Digest>,
    /// Terminal error code.
    pub error_code: Option<String>,
    /// The cancel intent, if any.
    pub cancel_intent: Option<CancelIntent>,
    /// The applied completion.
    pub completion: Option<CompletionFacts>,
    /// Events, in order.
    pub events: Vec<RunEvent>,
}

impl RunRecord {
    /// Whether the Attempt is live (`claimed`, `starting` or `running`).
    pub fn is_live(&self) -> bool {
        matches!(
            self.attempt_status,
            Some(AttemptStatus::Claimed | AttemptStatus::Starting | AttemptStatus::Running)
        )
    }

    /// Whether the Attempt is terminal.
    pub fn is_terminal(&self) -> bool {
        matches!(
            self.attempt_status,
            Some(
                AttemptStatus::Succeeded
                    | AttemptStatus::Failed
                    | AttemptStatus::Cancelled
                    | AttemptStatus::TimedOut
                    | AttemptStatus::Lost
            )
        ) || matches!(self.run_status, RunStatus::Cancelled) && self.attempt_status.is_none()
    }

    /// The lease version, if claimed.
    pub fn lease_version(&self) -> Option<LeaseVersion> {
        self.lease.as_ref().map(|l| l.version)
    }
}

/// Key of a stored artifact: the Run, Attempt and log id it belongs to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ArtifactKey {
    /// Project.
    pub project_id: ProjectId,
    /// Run.
    pub run_id: RunId,
    /// Attempt.
    pub attempt_id: AttemptId,
    /// Log id.
    pub log_artifact_id: LogArtifactId,
}

/// An immutable stored artifact: its length and digest (computed while streaming), its
/// truncation fact and the first bytes of its content.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredArtifact {
    /// Content length.
    pub byte_length: u64,
    /// SHA-256 of the content.
    pub sha256: Sha256Digest,
    /// Truncation fact (`None` = unknown).
    pub truncated: Option<bool>,
    /// Storage time.
    pub stored_at: UnixMillis,
    /// The first [`super::CpConfig::artifact_head_bytes`] content bytes.
    pub head: Vec<u8>,
}

/// An accepted attestation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttestationRecord {
    /// Worker.
    pub worker_id: WorkerId,
    /// Session.
    pub session_id: SessionId,
    /// Run.
    pub run_id: RunId,
    /// Attempt.
    pub attempt_id: AttemptId,
    /// Sequence.
    pub sequence: u64,
    /// State.
    pub state: AttestationState,
    /// Everything else the body carried, for exact-replay comparison.
    pub fence: String,
    /// Receipt time.
    pub received_at: UnixMillis,
}
