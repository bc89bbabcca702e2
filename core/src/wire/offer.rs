//! `POST …/offers` (reference §2.2, schema `qinglong/remote-execution-offer@v1`) and offer
//! admission: turning an `offered` response plus the pending claim into the inbox's [`Offer`].

use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;

use serde::de::IgnoredAny;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use zeroize::Zeroizing;

use super::{WireError, bind, ensure, exact, id, parse_json, sealed_body};
use crate::ids::{
    AttemptId, LeaseGeneration, LeaseToken, LeaseVersion, MAX_SAFE_INTEGER, OfferId, ProjectId,
    RunId, SessionId, Sha256Digest, TaskId, TaskRevision, WorkerGeneration, WorkerId,
};
use crate::offer::{
    Candidate, DeliveryKind, ExecutorType, Lease, LeaseStatus, Offer, OfferError, OfferWorker,
};
use crate::revision::ExecutionRevision;
use crate::time::UnixMillis;

/// Schema id of the offer pull response.
pub const SCHEMA: &str = "qinglong/remote-execution-offer@v1";
/// `MAX_REMOTE_EXECUTION_OFFER_RESPONSE_BYTES`.
pub const MAX_RESPONSE_BYTES: usize = 128 * 1024;
/// Request cap (the 4 KiB default).
pub const MAX_REQUEST_BYTES: usize = super::DEFAULT_REQUEST_CAP;

/// The Pull request: exactly `workerGeneration, offerId, leaseToken` (no schema field).
/// Serializes as its body, with the lease token as the placeholder [`Self::to_body`] fills in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct OfferRequest {
    /// Current Session generation.
    pub worker_generation: WorkerGeneration,
    /// The pending claim's offer id.
    pub offer_id: OfferId,
    /// The pending claim's lease capability; redacted in `Debug`.
    #[serde(serialize_with = "super::token_slot")]
    pub lease_token: LeaseToken,
}

impl OfferRequest {
    /// The request body; carries the lease token, so it is wiped on drop.
    ///
    /// # Errors
    /// [`WireError::RequestTooLarge`] above 4 KiB (cannot happen with valid ids).
    pub fn to_body(&self) -> Result<Zeroizing<Vec<u8>>, WireError> {
        sealed_body(self, &self.lease_token, "offers", MAX_REQUEST_BYTES)
    }
}

wire_enum! {
    /// Why the control plane had nothing to offer.
    IdleReason {
        ClaimBudgetExhausted = "claim_budget_exhausted",
        ClaimRaced = "claim_raced",
        NoCandidates = "no_candidates",
        NoMatch = "no_match",
        PlansUnavailable = "plans_unavailable",
        ScanBudgetExhausted = "scan_budget_exhausted",
        WorkerUnavailable = "worker_unavailable",
    }
}

/// Scan statistics; bounded (`pages ≤ 16`, `candidates ≤ 1024`, `claimAttempts ≤ 64`, and the
/// sub-counts within their totals).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct OfferStats {
    /// Candidate pages scanned.
    pub pages: u64,
    /// Candidates seen.
    pub candidates: u64,
    /// Candidates without a plan.
    pub plans_unavailable: u64,
    /// Candidates whose placement did not match.
    pub placement_mismatches: u64,
    /// Claims attempted.
    pub claim_attempts: u64,
    /// Claims lost to a race.
    pub claim_races: u64,
}

impl OfferStats {
    fn validate(&self) -> Result<(), WireError> {
        ensure(self.pages <= 16, "stats.pages", "<= 16")?;
        ensure(self.candidates <= 1024, "stats.candidates", "<= 1024")?;
        ensure(
            self.plans_unavailable <= self.candidates,
            "stats.plansUnavailable",
            "<= stats.candidates",
        )?;
        ensure(
            self.placement_mismatches <= self.candidates,
            "stats.placementMismatches",
            "<= stats.candidates",
        )?;
        ensure(self.claim_attempts <= 64, "stats.claimAttempts", "<= 64")?;
        ensure(
            self.claim_races <= self.claim_attempts,
            "stats.claimRaces",
            "<= stats.claimAttempts",
        )
    }
}

/// The lease as the response carries it: no token, no token digest, no identity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OfferedLease {
    /// Lease version.
    pub version: LeaseVersion,
    /// Lease generation.
    pub lease_generation: LeaseGeneration,
    /// Acquired.
    pub acquired_at_ms: UnixMillis,
    /// Last renewed (≥ acquired).
    pub renewed_at_ms: UnixMillis,
    /// Expiry (> renewed).
    pub expires_at_ms: UnixMillis,
    /// Last update (≥ acquired).
    pub updated_at_ms: UnixMillis,
}

/// The `offer` object of an `offered` response, validated but not yet admitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OfferedOffer {
    /// Must equal the pending claim's offer id.
    pub offer_id: OfferId,
    /// New claim or lease recovery.
    pub delivery_kind: DeliveryKind,
    /// Equals `execution_revision.content_digest`.
    pub execution_digest: Sha256Digest,
    /// The Run/Attempt.
    pub candidate: Candidate,
    /// Must equal the claim's Worker, Session and generation.
    pub worker: OfferWorker,
    /// The lease timings and versions.
    pub lease: OfferedLease,
    /// The normalized, digest-checked revision.
    pub execution_revision: ExecutionRevision,
    /// Placement score.
    pub placement_score: u64,
}

/// A parsed offer pull response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OfferResponse {
    /// Nothing offered.
    Idle {
        /// Why.
        reason: IdleReason,
        /// Scan statistics.
        stats: OfferStats,
        /// Whether the scan stopped at a budget.
        truncated: bool,
    },
    /// An offer for the pending claim.
    Offered {
        /// The offer (boxed: it holds the whole revision).
        offer: Box<OfferedOffer>,
        /// Scan statistics.
        stats: OfferStats,
        /// Whether the scan stopped at a budget.
        truncated: bool,
    },
}

/// The first pass: only `status` (duplicate `status` keys are refused; the rest is skipped).
#[derive(Deserialize)]
struct StatusProbe {
    status: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IdleWire {
    schema: String,
    // `status`, already read by `StatusProbe`; here and in `OfferedWire`.
    #[serde(rename = "status")]
    _status: IgnoredAny,
    reason: IdleReason,
    stats: OfferStats,
    truncated: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OfferedWire<'a> {
    schema: String,
    #[serde(rename = "status")]
    _status: IgnoredAny,
    #[serde(borrow)]
    offer: OfferWire<'a>,
    stats: OfferStats,
    truncated: bool,
}

/// The revision stays raw text here and is parsed on its own ([`ExecutionRevision::parse_json`]):
/// its public values are JavaScript strings that may hold lone surrogates, which only a direct
/// parse keeps, and every verdict on it (JSON shape included) is a [`WireError::Revision`].
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct OfferWire<'a> {
    offer_id: String,
    delivery_kind: DeliveryKind,
    execution_digest: String,
    candidate: CandidateWire,
    worker: WorkerWire,
    lease: LeaseWire,
    #[serde(borrow)]
    execution_revision: &'a RawValue,
    placement_score: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CandidateWire {
    run_id: String,
    attempt_id: String,
    project_id: String,
    task_id: String,
    task_revision: String,
    priority: i64,
    queued_at_ms: u64,
    attempt_created_at_ms: u64,
    attempt_number: u64,
    executor_type: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WorkerWire {
    worker_id: String,
    session_id: String,
    generation: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct LeaseWire {
    version: u64,
    lease_generation: u64,
    acquired_at_ms: u64,
    renewed_at_ms: u64,
    expires_at_ms: u64,
    updated_at_ms: u64,
}

impl CandidateWire {
    fn into_candidate(self) -> Result<Candidate, WireError> {
        ensure(
            self.priority.unsigned_abs() <= MAX_SAFE_INTEGER,
            "offer.candidate.priority",
            "a safe integer",
        )?;
        ensure(
            (1..=MAX_SAFE_INTEGER).contains(&self.attempt_number),
            "offer.candidate.attemptNumber",
            "1..=2^53-1",
        )?;
        exact(
            &self.executor_type,
            "remote_worker",
            "offer.candidate.executorType",
        )?;
        Ok(Candidate {
            run_id: id(RunId::new(self.run_id), "offer.candidate.runId")?,
            attempt_id: id(AttemptId::new(self.attempt_id), "offer.candidate.attemptId")?,
            project_id: id(ProjectId::new(self.project_id), "offer.candidate.projectId")?,
            task_id: id(TaskId::new(self.task_id), "offer.candidate.taskId")?,
            task_revision: id(
                TaskRevision::new(self.task_revision),
                "offer.candidate.taskRevision",
            )?,
            priority: self.priority,
            queued_at_ms: id(
                UnixMillis::new(self.queued_at_ms),
                "offer.candidate.queuedAtMs",
            )?,
            attempt_created_at_ms: id(
                UnixMillis::new(self.attempt_created_at_ms),
                "offer.candidate.attemptCreatedAtMs",
            )?,
            attempt_number: self.attempt_number,
            executor_type: ExecutorType::RemoteWorker,
        })
    }
}

impl LeaseWire {
    fn into_lease(self) -> Result<OfferedLease, WireError> {
        let t = |v, path| id(UnixMillis::new(v), path);
        let lease = OfferedLease {
            version: id(LeaseVersion::new(self.version), "offer.lease.version")?,
            lease_generation: id(
                LeaseGeneration::new(self.lease_generation),
                "offer.lease.leaseGeneration",
            )?,
            acquired_at_ms: t(self.acquired_at_ms, "offer.lease.acquiredAtMs")?,
            renewed_at_ms: t(self.renewed_at_ms, "offer.lease.renewedAtMs")?,
            expires_at_ms: t(self.expires_at_ms, "offer.lease.expiresAtMs")?,
            updated_at_ms: t(self.updated_at_ms, "offer.lease.updatedAtMs")?,
        };
        ensure(
            lease.renewed_at_ms >= lease.acquired_at_ms,
            "offer.lease.renewedAtMs",
            ">= offer.lease.acquiredAtMs",
        )?;
        ensure(
            lease.expires_at_ms > lease.renewed_at_ms,
            "offer.lease.expiresAtMs",
            "> offer.lease.renewedAtMs",
        )?;
        ensure(
            lease.updated_at_ms >= lease.acquired_at_ms,
            "offer.lease.updatedAtMs",
            ">= offer.lease.acquiredAtMs",
        )?;
        Ok(lease)
    }
}

impl OfferWire<'_> {
    fn into_offer(self) -> Result<OfferedOffer, WireError> {
        let candidate = self.candidate.into_candidate()?;
        let w = self.worker;
        let worker = OfferWorker {
            worker_id: id(WorkerId::new(w.worker_id), "offer.worker.workerId")?,
            session_id: id(SessionId::new(w.session_id), "offer.worker.sessionId")?,
            generation: id(
                WorkerGeneration::new(w.generation),
                "offer.worker.generation",
            )?,
        };
        let lease = self.lease.into_lease()?;
        let execution_revision =
            ExecutionRevision::parse_json(self.execution_revision.get().as_bytes())?;
        let execution_digest = id(
            Sha256Digest::from_hex(&self.execution_digest),
            "offer.executionDigest",
        )?;
        bind(
            execution_digest == execution_revision.content_digest,
            "offer.executionDigest",
            "offer.executionRevision.contentDigest",
        )?;
        bind(
            execution_revision.project_id == candidate.project_id
                && execution_revision.task_id == candidate.task_id
                && execution_revision.task_revision == candidate.task_revision,
            "offer.executionRevision",
            "the candidate's projectId, taskId and taskRevision",
        )?;
        ensure(
            self.placement_score <= MAX_SAFE_INTEGER,
            "offer.placementScore",
            "0..=2^53-1",
        )?;
        Ok(OfferedOffer {
            offer_id: id(OfferId::new(self.offer_id), "offer.offerId")?,
            delivery_kind: self.delivery_kind,
            execution_digest,
            candidate,
            worker,
            lease,
            execution_revision,
            placement_score: self.placement_score,
        })
    }
}

impl OfferResponse {
    /// Parses a response strictly: size `2..=128 KiB` first, exact shapes at every level, the
    /// schema, every bound, the stats budget, and the revision's normalization and digest.
    ///
    /// # Errors
    /// [`WireError`] naming the first violation.
    pub fn parse(bytes: &[u8]) -> Result<Self, WireError> {
        let probe: StatusProbe = parse_json("offers", bytes, MAX_RESPONSE_BYTES)?;
        match probe.status.as_str() {
            "idle" => {
                let idle: IdleWire = parse_json("offers", bytes, MAX_RESPONSE_BYTES)?;
                exact(&idle.schema, SCHEMA, "schema")?;
                idle.stats.validate()?;
                Ok(Self::Idle {
                    reason: idle.reason,
                    stats: idle.stats,
                    truncated: idle.truncated,
                })
            }
            "offered" => {
                let offered: OfferedWire<'_> = parse_json("offers", bytes, MAX_RESPONSE_BYTES)?;
                exact(&offered.schema, SCHEMA, "schema")?;
                let offer = offered.offer.into_offer()?;
                offered.stats.validate()?;
                Ok(Self::Offered {
                    offer: Box::new(offer),
                    stats: offered.stats,
                    truncated: offered.truncated,
                })
            }
            _ => Err(super::field("status", "\"idle\" or \"offered\"")),
        }
    }
}

/// Why an `offered` response could not be admitted for the pending claim.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AdmissionError {
    /// The offer is not for this claim or this Session.
    #[error("offered {path} must equal {must_equal}")]
    ClaimMismatch {
        /// The offer field.
        path: &'static str,
        /// What it must equal.
        must_equal: &'static str,
    },
    /// The reconstructed offer is inconsistent.
    #[error("offered offer rejected: {0}")]
    Offer(OfferError),
}

/// Offer admission (reference `parseRemoteExecutionOfferPullResponse` +
/// `createClusterRemoteExecutionOffer`): binds the offered offer to the pending claim
/// (`offer_id`, `worker` = Worker/Session/generation, `lease_token`), reconstructs the full lease
/// (`status: leased`, Run/Attempt from the candidate, Worker fields from the claim,
/// `leaseTokenDigest = sha256_hex(utf8(token))`) and validates the whole offer, including the
/// execution revision's normalization and digest.
///
/// # Errors
/// [`AdmissionError`] naming the first violation.
pub fn admit_offer(
    offered: &OfferedOffer,
    offer_id: &OfferId,
    worker: &OfferWorker,
    lease_token: &LeaseToken,
) -> Result<Offer, AdmissionError> {
    let mismatch = |path, must_equal| AdmissionError::ClaimMismatch { path, must_equal };
    if offered.offer_id != *offer_id {
        return Err(mismatch("offer.offerId", "the pending claim's offerId"));
    }
    if offered.worker.worker_id != worker.worker_id {
        return Err(mismatch("offer.worker.workerId", "the claim's workerId"));
    }
    if offered.worker.session_id != worker.session_id {
        return Err(mismatch(
            "offer.worker.sessionId",
            "the claim's workerSessionId",
        ));
    }
    if offered.worker.generation != worker.generation {
        return Err(mismatch(
            "offer.worker.generation",
            "the claim's workerGeneration",
        ));
    }
    let l = &offered.lease;
    let offer = Offer {
        offer_id: offer_id.clone(),
        delivery_kind: offered.delivery_kind,
        execution_digest: offered.execution_digest,
        candidate: offered.candidate.clone(),
        worker: worker.clone(),
        lease: Lease {
            attempt_id: offered.candidate.attempt_id.clone(),
            run_id: offered.candidate.run_id.clone(),
            status: LeaseStatus::Leased,
            version: l.version,
            lease_generation: l.lease_generation,
            worker_id: worker.worker_id.clone(),
            worker_session_id: worker.session_id.clone(),
            worker_generation: worker.generation,
            lease_token_digest: lease_token.digest(),
            acquired_at_ms: l.acquired_at_ms,
            renewed_at_ms: l.renewed_at_ms,
            expires_at_ms: l.expires_at_ms,
            updated_at_ms: l.updated_at_ms,
        },
        lease_token: lease_token.clone(),
        execution_revision: offered.execution_revision.clone(),
        placement_score: offered.placement_score,
    };
    offer.validate().map_err(AdmissionError::Offer)?;
    Ok(offer)
}
