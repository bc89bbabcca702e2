//! The offer as the inbox stores it (reference §2.2 and §3.5): the claimed candidate, the Worker
//! Session it was claimed for, the full reconstructed Run lease, the plaintext lease token (the
//! inbox is a capability store) and the pinned execution revision.

use core::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{
    AttemptId, CapabilityDigest, LeaseGeneration, LeaseToken, LeaseVersion, LogArtifactId,
    MAX_SAFE_INTEGER, OfferId, ProjectId, RunId, SessionId, Sha256Digest, TaskId, TaskRevision,
    WorkerGeneration, WorkerId,
};
use crate::revision::ExecutionRevision;
use crate::time::UnixMillis;
use crate::wire::artifact::derive_log_artifact_id;

/// How the control plane delivered the offer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryKind {
    /// A fresh claim.
    NewClaim,
    /// A replay of an existing lease (same offer id and token).
    LeaseRecovery,
}

/// The executor type of a remote candidate; the only value the Worker accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutorType {
    /// `"remote_worker"`.
    RemoteWorker,
}

/// The status of a reconstructed lease; always `leased` in an offer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeaseStatus {
    /// `"leased"`.
    Leased,
}

/// The Run/Attempt the offer is for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Candidate {
    /// Run.
    pub run_id: RunId,
    /// Attempt.
    pub attempt_id: AttemptId,
    /// Project.
    pub project_id: ProjectId,
    /// Task.
    pub task_id: TaskId,
    /// Task revision, equal to the execution revision's.
    pub task_revision: TaskRevision,
    /// Scheduling priority, a JavaScript safe integer (may be negative).
    pub priority: i64,
    /// When the Run was queued.
    pub queued_at_ms: UnixMillis,
    /// When the Attempt was created.
    pub attempt_created_at_ms: UnixMillis,
    /// 1-based attempt number.
    pub attempt_number: u64,
    /// Always `remote_worker`.
    pub executor_type: ExecutorType,
}

/// The Worker Session the offer was claimed for (`offer.worker`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OfferWorker {
    /// Worker.
    pub worker_id: WorkerId,
    /// Session.
    pub session_id: SessionId,
    /// Session generation.
    pub generation: WorkerGeneration,
}

/// The full Run lease, reconstructed by the Worker from the response and its pending claim.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Lease {
    /// Attempt, from the candidate.
    pub attempt_id: AttemptId,
    /// Run, from the candidate.
    pub run_id: RunId,
    /// Always `leased`.
    pub status: LeaseStatus,
    /// Lease version; only moves forward.
    pub version: LeaseVersion,
    /// Lease generation.
    pub lease_generation: LeaseGeneration,
    /// Worker, from the claim.
    pub worker_id: WorkerId,
    /// Session, from the claim.
    pub worker_session_id: SessionId,
    /// Session generation, from the claim.
    pub worker_generation: WorkerGeneration,
    /// `sha256_hex(utf8(leaseToken))`.
    pub lease_token_digest: CapabilityDigest,
    /// When the lease was acquired.
    pub acquired_at_ms: UnixMillis,
    /// When it was last renewed (≥ acquired).
    pub renewed_at_ms: UnixMillis,
    /// When it expires (> renewed).
    pub expires_at_ms: UnixMillis,
    /// Last update (≥ acquired).
    pub updated_at_ms: UnixMillis,
}

/// The offer, as persisted in the inbox record.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Offer {
    /// Worker-generated offer id (equals the pending claim's).
    pub offer_id: OfferId,
    /// New claim or lease recovery.
    pub delivery_kind: DeliveryKind,
    /// Equals `execution_revision.content_digest`.
    pub execution_digest: Sha256Digest,
    /// The Run/Attempt.
    pub candidate: Candidate,
    /// The Session it was claimed for.
    pub worker: OfferWorker,
    /// The reconstructed lease.
    pub lease: Lease,
    /// The plaintext lease capability (the inbox is a capability store).
    pub lease_token: LeaseToken,
    /// The pinned execution revision.
    pub execution_revision: ExecutionRevision,
    /// Placement score, a safe integer ≥ 0.
    pub placement_score: u64,
}

impl fmt::Debug for Offer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The derived form would be correct too (the token and digest redact themselves), but
        // the revision is large; keep debug output to the identity of the offer.
        f.debug_struct("Offer")
            .field("offer_id", &self.offer_id)
            .field("delivery_kind", &self.delivery_kind)
            .field("run_id", &self.candidate.run_id)
            .field("attempt_id", &self.candidate.attempt_id)
            .field("lease_version", &self.lease.version)
            .field("lease_token", &self.lease_token)
            .finish_non_exhaustive()
    }
}

/// An offer whose fields contradict each other. Blame: the control plane (or a corrupted
/// record).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum OfferError {
    /// A field's value is outside its bounds.
    #[error("offer field {field} must be {rule}")]
    Bound {
        /// The field, as named on the wire.
        field: &'static str,
        /// The rule.
        rule: &'static str,
    },
    /// Two fields that must agree do not.
    #[error("offer field {field} must equal {must_equal}")]
    Mismatch {
        /// The field that disagrees.
        field: &'static str,
        /// What it must equal.
        must_equal: &'static str,
    },
}

fn bound(ok: bool, field: &'static str, rule: &'static str) -> Result<(), OfferError> {
    ok.then_some(()).ok_or(OfferError::Bound { field, rule })
}

fn agree(ok: bool, field: &'static str, must_equal: &'static str) -> Result<(), OfferError> {
    ok.then_some(())
        .ok_or(OfferError::Mismatch { field, must_equal })
}

impl Offer {
    /// Every rule of an offer (reference §2.2, §3.5): [`Self::validate_fields`], then the
    /// execution revision's own normalization and digest ([`ExecutionRevision::validate`]: the
    /// revision re-normalized and its SHA-256 recomputed).
    ///
    /// # Errors
    /// [`OfferError`] naming the first broken rule.
    pub fn validate(&self) -> Result<(), OfferError> {
        self.validate_fields()?;
        self.execution_revision
            .validate()
            .map_err(|_| OfferError::Bound {
                field: "executionRevision",
                rule: "normalized, with a matching contentDigest",
            })
    }

    /// Cross-field consistency of a reconstructed offer, with the execution revision trusted
    /// (parsed at admission, or equal to a revision validated before): its `contentDigest` is
    /// compared with `executionDigest`, never recomputed.
    ///
    /// # Errors
    /// [`OfferError`] naming the first broken rule.
    pub(crate) fn validate_fields(&self) -> Result<(), OfferError> {
        let c = &self.candidate;
        let l = &self.lease;
        let r = &self.execution_revision;
        let safe = i64::try_from(MAX_SAFE_INTEGER).unwrap_or(i64::MAX);
        bound(
            (-safe..=safe).contains(&c.priority),
            "candidate.priority",
            "a safe integer",
        )?;
        bound(
            (1..=MAX_SAFE_INTEGER).contains(&c.attempt_number),
            "candidate.attemptNumber",
            "1..=2^53-1",
        )?;
        bound(
            self.placement_score <= MAX_SAFE_INTEGER,
            "placementScore",
            "0..=2^53-1",
        )?;
        // Lease timing (reference §2.2).
        bound(
            l.renewed_at_ms >= l.acquired_at_ms,
            "lease.renewedAtMs",
            ">= lease.acquiredAtMs",
        )?;
        bound(
            l.expires_at_ms > l.renewed_at_ms,
            "lease.expiresAtMs",
            "> lease.renewedAtMs",
        )?;
        bound(
            l.updated_at_ms >= l.acquired_at_ms,
            "lease.updatedAtMs",
            ">= lease.acquiredAtMs",
        )?;
        agree(l.run_id == c.run_id, "lease.runId", "candidate.runId")?;
        agree(
            l.attempt_id == c.attempt_id,
            "lease.attemptId",
            "candidate.attemptId",
        )?;
        let w = &self.worker;
        agree(
            l.worker_id == w.worker_id,
            "lease.workerId",
            "worker.workerId",
        )?;
        agree(
            l.worker_session_id == w.session_id,
            "lease.workerSessionId",
            "worker.sessionId",
        )?;
        agree(
            l.worker_generation == w.generation,
            "lease.workerGeneration",
            "worker.generation",
        )?;
        agree(
            l.lease_token_digest == self.lease_token.digest(),
            "lease.leaseTokenDigest",
            "sha256_hex(leaseToken)",
        )?;
        agree(
            self.execution_digest == r.content_digest,
            "executionDigest",
            "executionRevision.contentDigest",
        )?;
        agree(
            r.project_id == c.project_id,
            "executionRevision.projectId",
            "candidate",
        )?;
        agree(
            r.task_id == c.task_id,
            "executionRevision.taskId",
            "candidate",
        )?;
        agree(
            r.task_revision == c.task_revision,
            "executionRevision.taskRevision",
            "candidate.taskRevision",
        )
    }

    /// The log artifact of this offer's Attempt (derived, so the same at every step and before
    /// the record names it).
    #[must_use]
    pub(crate) fn log_artifact_id(&self) -> LogArtifactId {
        let c = &self.candidate;
        derive_log_artifact_id(&c.project_id, &c.run_id, &c.attempt_id, &self.offer_id)
    }

    /// The first authority field that differs between two offers, by its wire name (reference
    /// §3.6 rule 2: everything but the lease version and timings, and the placement score).
    /// `compare_delivery_kind` is false for the admission replay check (§3.7), which ignores
    /// `deliveryKind`.
    #[must_use]
    pub fn authority_difference(
        &self,
        other: &Self,
        compare_delivery_kind: bool,
    ) -> Option<&'static str> {
        let (a, b) = (&self.lease, &other.lease);
        let checks: [(&'static str, bool); 15] = [
            ("offerId", self.offer_id == other.offer_id),
            (
                "deliveryKind",
                !compare_delivery_kind || self.delivery_kind == other.delivery_kind,
            ),
            (
                "executionDigest",
                self.execution_digest == other.execution_digest,
            ),
            ("candidate", self.candidate == other.candidate),
            ("worker", self.worker == other.worker),
            ("lease.attemptId", a.attempt_id == b.attempt_id),
            ("lease.runId", a.run_id == b.run_id),
            ("lease.status", a.status == b.status),
            (
                "lease.leaseGeneration",
                a.lease_generation == b.lease_generation,
            ),
            ("lease.workerId", a.worker_id == b.worker_id),
            (
                "lease.workerSessionId",
                a.worker_session_id == b.worker_session_id,
            ),
            (
                "lease.workerGeneration",
                a.worker_generation == b.worker_generation,
            ),
            (
                "lease.leaseTokenDigest",
                a.lease_token_digest == b.lease_token_digest,
            ),
            ("leaseToken", self.lease_token == other.lease_token),
            (
                "executionRevision",
                self.execution_revision == other.execution_revision,
            ),
        ];
        checks
            .iter()
            .find(|(_, same)| !same)
            .map(|(field, _)| *field)
    }
}
