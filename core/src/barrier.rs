//! The spawn barrier (ADR-0116 §1; reference §4.4 step 5; SPEC §6): just before spawning, the
//! supervisor re-reads the inbox record and requires it to be `launching` with exactly the
//! plan's offer, Run, Attempt, callback sequence, capability digest, log id and start time.
//! Drift means zero spawns.
//!
//! This is the one home of that comparison: the supervisor (`drivers/src/supervisor`) calls
//! [`Barrier::check`] on the record it read, and so can any checker that must decide whether a
//! spawn was allowed. Reading the record is the caller's job; this is a pure function of the
//! record and the plan's facts.

use serde::{Deserialize, Serialize};

use crate::ids::{AttemptId, CallbackSequence, CapabilityDigest, LogArtifactId, OfferId, RunId};
use crate::io::LaunchPlan;
use crate::record::{InboxRecord, State};
use crate::time::UnixMillis;

/// What a launch plan promises the durable `launching` record holds: the facts a spawn must find
/// on disk, exactly. Borrowed from whichever plan the caller holds (the core's [`LaunchPlan`],
/// the supervisor's decoded plan, a simulated one).
#[derive(Clone, Copy, Debug)]
pub struct Barrier<'a> {
    /// `offer.offerId` (the record's own name).
    pub offer_id: &'a OfferId,
    /// `offer.candidate.runId`.
    pub run_id: &'a RunId,
    /// `offer.candidate.attemptId`.
    pub attempt_id: &'a AttemptId,
    /// `completionReceiptCallbackSequence`.
    pub callback_sequence: CallbackSequence,
    /// `completionReceiptTokenDigest`: SHA-256 of the raw capability the plan carries.
    pub token_digest: CapabilityDigest,
    /// `logArtifactId`.
    pub log_artifact_id: &'a LogArtifactId,
    /// `executorStartedAtMs`.
    pub executor_started_at: UnixMillis,
}

/// The first inbox field whose durable value differs from the plan (spawn barrier drift), in the
/// order the check compares them. Names the field, never a value (one is a capability digest).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum BarrierField {
    /// The record is not in `launching` (it is in the carried state).
    #[error("state is {0}, not launching")]
    State(State),
    /// `offer.offerId`.
    #[error("offerId")]
    OfferId,
    /// `offer.candidate.runId`.
    #[error("runId")]
    RunId,
    /// `offer.candidate.attemptId`.
    #[error("attemptId")]
    AttemptId,
    /// `completionReceiptCallbackSequence`.
    #[error("completionReceiptCallbackSequence")]
    CallbackSequence,
    /// `completionReceiptTokenDigest`.
    #[error("completionReceiptTokenDigest")]
    TokenDigest,
    /// `logArtifactId`.
    #[error("logArtifactId")]
    LogArtifactId,
    /// `executorStartedAtMs`.
    #[error("executorStartedAtMs")]
    ExecutorStartedAtMs,
}

impl<'a> Barrier<'a> {
    /// The barrier of the core's own launch plan (the digest is computed from its capability).
    #[must_use]
    pub fn of(plan: &'a LaunchPlan) -> Self {
        Self {
            offer_id: &plan.offer_id,
            run_id: &plan.run_id,
            attempt_id: &plan.attempt_id,
            callback_sequence: plan.callback_sequence,
            token_digest: plan.capability.digest(),
            log_artifact_id: &plan.log_artifact_id,
            executor_started_at: plan.executor_started_at,
        }
    }

    /// Whether `record` lets this plan spawn: `launching`, with every barrier field equal to the
    /// plan's. The capability digests are compared in constant time (`CapabilityDigest`).
    ///
    /// # Errors
    /// The first [`BarrierField`] that differs.
    pub fn check(&self, record: &InboxRecord) -> Result<(), BarrierField> {
        let candidate = &record.offer.candidate;
        let checks = [
            (
                record.state == State::Launching,
                BarrierField::State(record.state),
            ),
            (
                record.offer.offer_id == *self.offer_id,
                BarrierField::OfferId,
            ),
            (candidate.run_id == *self.run_id, BarrierField::RunId),
            (
                candidate.attempt_id == *self.attempt_id,
                BarrierField::AttemptId,
            ),
            (
                record.completion_receipt_callback_sequence == Some(self.callback_sequence),
                BarrierField::CallbackSequence,
            ),
            (
                record.completion_receipt_token_digest == Some(self.token_digest),
                BarrierField::TokenDigest,
            ),
            (
                record.log_artifact_id.as_ref() == Some(self.log_artifact_id),
                BarrierField::LogArtifactId,
            ),
            (
                record.executor_started_at_ms == Some(self.executor_started_at),
                BarrierField::ExecutorStartedAtMs,
            ),
        ];
        let differs = checks.into_iter().find(|(same, _)| !same);
        differs.map_or(Ok(()), |(_, field)| Err(field))
    }
}
