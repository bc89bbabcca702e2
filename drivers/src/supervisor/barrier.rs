//! The spawn barrier re-check (ADR-0116 §1; reference §4.4 step 5): just before spawning, the
//! supervisor re-reads the inbox record and requires it to be `launching` with exactly the
//! plan's offer, Run, Attempt, callback sequence, capability digest, log id and start time.
//!
//! This is a pure comparison; reading the record is the file authority's job.

use ql_worker_core::record::{InboxRecord, State};

use super::plan::Plan;
use super::report::BarrierField;

/// Compares the durable record with the plan.
///
/// # Errors
/// The first [`BarrierField`] that differs.
pub fn check(record: &InboxRecord, plan: &Plan) -> Result<(), BarrierField> {
    if record.state != State::Launching {
        return Err(BarrierField::State(record.state));
    }
    if record.offer.offer_id != plan.offer_id {
        return Err(BarrierField::OfferId);
    }
    if record.offer.candidate.run_id != plan.run_id {
        return Err(BarrierField::RunId);
    }
    if record.offer.candidate.attempt_id != plan.attempt_id {
        return Err(BarrierField::AttemptId);
    }
    if record.completion_receipt_callback_sequence != Some(plan.callback_sequence) {
        return Err(BarrierField::CallbackSequence);
    }
    // Constant-time comparison (`CapabilityDigest: PartialEq` uses `subtle`).
    if record.completion_receipt_token_digest != Some(plan.capability.digest()) {
        return Err(BarrierField::TokenDigest);
    }
    if record.log_artifact_id.as_ref() != Some(&plan.log_artifact_id) {
        return Err(BarrierField::LogArtifactId);
    }
    if record.executor_started_at_ms != Some(plan.started_at_ms) {
        return Err(BarrierField::ExecutorStartedAtMs);
    }
    Ok(())
}
