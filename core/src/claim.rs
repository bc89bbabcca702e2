//! The pending Pull claim (reference §3.4): at most one, persisted **before** the Pull request
//! is sent, so a crash or a lost response retries with the same offer id and lease token.

use serde::{Deserialize, Serialize};

use crate::ids::{LeaseToken, OfferId, Revision, SessionId, WorkerGeneration, WorkerId};
use crate::offer::OfferWorker;
use crate::time::UnixMillis;

/// The on-disk schema version of the claim body.
pub const CLAIM_SCHEMA_VERSION: u8 = 1;
/// Pull attempts allowed per claim (`MAX_WORKER_REMOTE_OFFER_ATTEMPTS`).
pub(crate) const MAX_CLAIM_ATTEMPTS: u8 = 16;

/// `pending-claim` (reference §3.4), every field in the reference's order.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingClaim {
    /// Always [`CLAIM_SCHEMA_VERSION`].
    pub schema_version: u8,
    /// 0 at creation, +1 per replace.
    pub revision: Revision,
    /// Worker the claim belongs to.
    pub worker_id: WorkerId,
    /// Session the claim belongs to.
    pub worker_session_id: SessionId,
    /// Session generation the claim belongs to.
    pub worker_generation: WorkerGeneration,
    /// Worker-generated offer id, reused across retries and restarts.
    pub offer_id: OfferId,
    /// Worker-generated lease capability, reused across retries and restarts.
    pub lease_token: LeaseToken,
    /// Pull requests sent so far, 0..=16.
    pub attempt_count: u8,
    /// Creation time.
    pub created_at_ms: UnixMillis,
    /// Last update, ≥ creation.
    pub updated_at_ms: UnixMillis,
    /// Last attempt, within creation..=update.
    pub last_attempt_at_ms: Option<UnixMillis>,
    /// Earliest next attempt, ≥ creation.
    pub next_attempt_at_ms: UnixMillis,
}

/// A claim that breaks its own rules or a create/replace/clear rule. Nothing was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// A field breaks its bound.
    #[error("pending claim {field} must be {rule}")]
    Invalid {
        /// Wire name of the field.
        field: &'static str,
        /// The rule.
        rule: &'static str,
    },
    /// A different claim already exists (reference `offer_conflict`).
    #[error("a different pending claim already exists")]
    Conflict,
    /// Revision CAS or identity mismatch on replace/clear (reference `claim_revision_conflict`).
    #[error(
        "pending claim revision conflict: expected {expected}, stored {found} (or the claim \
         identity differs)"
    )]
    RevisionConflict {
        /// The revision the caller expected.
        expected: Revision,
        /// The stored revision.
        found: Revision,
    },
}

/// What creating a claim amounts to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub enum ClaimCreate {
    /// No claim exists: publish the new one.
    Publish,
    /// An identical claim exists: nothing to write (create is idempotent).
    AlreadyExists,
}

impl PendingClaim {
    /// A fresh claim at revision 0 (reference §4.1 step 1).
    #[must_use]
    pub fn new(
        worker: &OfferWorker,
        offer_id: OfferId,
        lease_token: LeaseToken,
        now: UnixMillis,
    ) -> Self {
        Self {
            schema_version: CLAIM_SCHEMA_VERSION,
            revision: Revision::FIRST,
            worker_id: worker.worker_id.clone(),
            worker_session_id: worker.session_id.clone(),
            worker_generation: worker.generation,
            offer_id,
            lease_token,
            attempt_count: 0,
            created_at_ms: now,
            updated_at_ms: now,
            last_attempt_at_ms: None,
            next_attempt_at_ms: now,
        }
    }

    /// The Session identity this claim was made for.
    #[must_use]
    pub fn worker(&self) -> OfferWorker {
        OfferWorker {
            worker_id: self.worker_id.clone(),
            session_id: self.worker_session_id.clone(),
            generation: self.worker_generation,
        }
    }

    /// Claim identity: worker, session, generation, offer id and token.
    #[must_use]
    pub(crate) fn same_identity(&self, other: &Self) -> bool {
        self.worker() == other.worker()
            && self.offer_id == other.offer_id
            && self.lease_token == other.lease_token
    }

    /// The claim's own field rules (reference §3.4).
    ///
    /// # Errors
    /// [`ClaimError::Invalid`] naming the field.
    pub fn validate(&self) -> Result<(), ClaimError> {
        let invalid = |field, rule| Err(ClaimError::Invalid { field, rule });
        if self.schema_version != CLAIM_SCHEMA_VERSION {
            return invalid("schemaVersion", "1");
        }
        if self.attempt_count > MAX_CLAIM_ATTEMPTS {
            return invalid("attemptCount", "0..=16");
        }
        if self.updated_at_ms < self.created_at_ms {
            return invalid("updatedAtMs", ">= createdAtMs");
        }
        if let Some(last) = self.last_attempt_at_ms
            && (last < self.created_at_ms || last > self.updated_at_ms)
        {
            return invalid("lastAttemptAtMs", "within createdAtMs..=updatedAtMs");
        }
        if self.next_attempt_at_ms < self.created_at_ms {
            return invalid("nextAttemptAtMs", ">= createdAtMs");
        }
        Ok(())
    }
}

/// Create rule: idempotent only for an identical claim identity (reference §3.4).
///
/// # Errors
/// [`ClaimError::Conflict`] when a different claim exists, or the proposal is invalid.
pub fn check_create(
    existing: Option<&PendingClaim>,
    proposed: &PendingClaim,
) -> Result<ClaimCreate, ClaimError> {
    proposed.validate()?;
    if proposed.revision != Revision::FIRST {
        return Err(ClaimError::Invalid {
            field: "revision",
            rule: "0 at creation",
        });
    }
    match existing {
        None => Ok(ClaimCreate::Publish),
        Some(stored) if stored.same_identity(proposed) => Ok(ClaimCreate::AlreadyExists),
        Some(_) => Err(ClaimError::Conflict),
    }
}

/// Replace rule: `stored.revision == expected`, `proposed.revision == expected + 1`, identical
/// identity (reference §3.4).
///
/// # Errors
/// [`ClaimError::RevisionConflict`], or [`ClaimError::Invalid`] for an invalid proposal.
pub fn check_replace(
    stored: &PendingClaim,
    proposed: &PendingClaim,
    expected: Revision,
) -> Result<(), ClaimError> {
    proposed.validate()?;
    let allowed = stored.revision == expected
        && expected.next().ok() == Some(proposed.revision)
        && stored.same_identity(proposed)
        && proposed.created_at_ms == stored.created_at_ms
        && proposed.attempt_count >= stored.attempt_count;
    revision_cas(allowed, stored, expected)
}

/// Clear rule: the stored claim has this offer id and revision (reference §3.4).
///
/// # Errors
/// [`ClaimError::RevisionConflict`] otherwise.
pub fn check_clear(
    stored: &PendingClaim,
    offer_id: &OfferId,
    revision: Revision,
) -> Result<(), ClaimError> {
    let allowed = stored.offer_id == *offer_id && stored.revision == revision;
    revision_cas(allowed, stored, revision)
}

/// `Ok` when the replace or clear is `allowed`, else the conflict of `stored` with `expected`.
fn revision_cas(
    allowed: bool,
    stored: &PendingClaim,
    expected: Revision,
) -> Result<(), ClaimError> {
    allowed.then_some(()).ok_or(ClaimError::RevisionConflict {
        expected,
        found: stored.revision,
    })
}
