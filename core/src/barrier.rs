//! The spawn barrier (ADR-0116 §1; reference §4.4 step 5; SPEC §6): just before spawning, the
//! supervisor re-reads the inbox record and requires it to be `launching` with exactly the
//! plan's offer, Run, Attempt, callback sequence, capability digest, log id and start time.
//! Drift means zero spawns.
//!
//! This is the one home of that comparison: the supervisor (`drivers/src/supervisor`) calls
//! [`Barrier::check`] on the record it read, and so can any checker that must decide whether a
//! spawn was allowed. Reading the record is the caller's job; this is a pure function of the
//! record and the plan's facts.

use core::fmt;

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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum BarrierField {
    /// The record is not in `launching` (it is in the carried state).
    State(State),
    /// `offer.offerId`.
    OfferId,
    /// `offer.candidate.runId`.
    RunId,
    /// `offer.candidate.attemptId`.
    AttemptId,
    /// `completionReceiptCallbackSequence`.
    CallbackSequence,
    /// `completionReceiptTokenDigest`.
    TokenDigest,
    /// `logArtifactId`.
    LogArtifactId,
    /// `executorStartedAtMs`.
    ExecutorStartedAtMs,
}

impl fmt::Display for BarrierField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::State(state) => write!(f, "state is {state}, not launching"),
            Self::OfferId => f.write_str("offerId"),
            Self::RunId => f.write_str("runId"),
            Self::AttemptId => f.write_str("attemptId"),
            Self::CallbackSequence => f.write_str("completionReceiptCallbackSequence"),
            Self::TokenDigest => f.write_str("completionReceiptTokenDigest"),
            Self::LogArtifactId => f.write_str("logArtifactId"),
            Self::ExecutorStartedAtMs => f.write_str("executorStartedAtMs"),
        }
    }
}

impl core::error::Error for BarrierField {}

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
        match checks.into_iter().find(|(same, _)| !same) {
            Some((_, field)) => Err(field),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::Sha256Digest;
    use crate::testkit;

    /// The barrier seeded `launching` record 1 carries (see `testkit::record`).
    struct Facts {
        record: InboxRecord,
        log: LogArtifactId,
        sequence: CallbackSequence,
        started: UnixMillis,
        digest: CapabilityDigest,
    }

    fn facts() -> Facts {
        let record = testkit::record(1, State::Launching);
        Facts {
            log: record.log_artifact_id.clone().unwrap(),
            sequence: record.completion_receipt_callback_sequence.unwrap(),
            started: record.executor_started_at_ms.unwrap(),
            digest: CapabilityDigest::new(Sha256Digest::of(&testkit::seeded_capability(1))),
            record,
        }
    }

    fn barrier(f: &Facts) -> Barrier<'_> {
        let c = &f.record.offer.candidate;
        Barrier {
            offer_id: &f.record.offer.offer_id,
            run_id: &c.run_id,
            attempt_id: &c.attempt_id,
            callback_sequence: f.sequence,
            token_digest: f.digest,
            log_artifact_id: &f.log,
            executor_started_at: f.started,
        }
    }

    #[test]
    fn the_seeded_launching_record_matches_its_own_barrier() {
        let f = facts();
        assert_eq!(barrier(&f).check(&f.record), Ok(()));
    }

    #[test]
    fn every_drifted_field_is_named_and_only_launching_passes() {
        let f = facts();
        let other = testkit::record(2, State::Launching);
        let oc = &other.offer.candidate;
        let later = UnixMillis::new(f.started.get() + 1).unwrap();
        let other_log = other.log_artifact_id.clone().unwrap();
        let cases: [(Barrier<'_>, BarrierField); 7] = [
            (
                Barrier {
                    offer_id: &other.offer.offer_id,
                    ..barrier(&f)
                },
                BarrierField::OfferId,
            ),
            (
                Barrier {
                    run_id: &oc.run_id,
                    ..barrier(&f)
                },
                BarrierField::RunId,
            ),
            (
                Barrier {
                    attempt_id: &oc.attempt_id,
                    ..barrier(&f)
                },
                BarrierField::AttemptId,
            ),
            (
                Barrier {
                    callback_sequence: f.sequence.next().unwrap(),
                    ..barrier(&f)
                },
                BarrierField::CallbackSequence,
            ),
            (
                Barrier {
                    token_digest: CapabilityDigest::new(Sha256Digest::of(b"other")),
                    ..barrier(&f)
                },
                BarrierField::TokenDigest,
            ),
            (
                Barrier {
                    log_artifact_id: &other_log,
                    ..barrier(&f)
                },
                BarrierField::LogArtifactId,
            ),
            (
                Barrier {
                    executor_started_at: later,
                    ..barrier(&f)
                },
                BarrierField::ExecutorStartedAtMs,
            ),
        ];
        for (drifted, field) in cases {
            assert_eq!(drifted.check(&f.record), Err(field));
        }
        for state in State::ALL {
            if state == State::Launching {
                continue;
            }
            // Past `launching` the record keeps its barrier fields: only the state differs.
            let mut record = f.record.clone();
            record.state = state;
            assert_eq!(
                barrier(&f).check(&record),
                Err(BarrierField::State(state)),
                "{state}"
            );
        }
    }

    #[test]
    fn a_record_without_barrier_fields_fails_at_the_first_of_them() {
        let f = facts();
        let mut record = f.record.clone();
        record.completion_receipt_callback_sequence = None;
        record.completion_receipt_token_digest = None;
        assert_eq!(
            barrier(&f).check(&record),
            Err(BarrierField::CallbackSequence)
        );
        assert_eq!(
            alloc::format!("{}", BarrierField::State(State::Started)),
            "state is started, not launching"
        );
    }
}
