//! Deterministic sample values and the simulated host for tests, fuzzing, the model checker and
//! the whole-Worker simulation. Not part of the API.
//!
//! * Sample values (this module): pure data derived from a small integer, so tests in every
//!   crate build the same offers and records.
//! * [`act`]: what the testkit reads off a driver command ([`ql_worker_core::io::Action`]): its
//!   kind, the operation of a POST, its canonical bytes.
//! * [`world`]: the simulated host — disk (inbox with the journal's CAS and transition checks,
//!   pending claim, receipts, log spool), supervisor (process table), control plane and
//!   entropy — which answers every command as the chosen [`world::Answer`] says, and checks the
//!   safety invariants on every command ([`world::Violation`]).
//! * [`sim`]: a Worker wired to a world: the driver loop, crashes and restarts, forks and
//!   fingerprints.
//! * [`explore`]: the exhaustive, bounded explorer of the model checks.

pub mod act;
pub mod cadence;
pub mod explore;
pub mod sim;
pub mod world;

use ql_worker_core::ids::{
    AttemptId, CallbackSequence, CapabilityDigest, ExecutorHandle, LeaseGeneration, LeaseToken,
    LeaseVersion, OfferId, Revision, RunId, Sha256Digest,
};
use ql_worker_core::offer::{Candidate, DeliveryKind, ExecutorType, Lease, LeaseStatus, Offer};
use ql_worker_core::record::{InboxRecord, RecoveryReason, State};
use ql_worker_core::revision::{
    Architecture, EnvBinding, EnvName, EnvValue, ExecutionRevision, SecretRef,
};
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::session::Capabilities;
use ql_worker_core::worker::WorkerConfig;
use ql_worker_tests::control_plane::revisions::Seal as _;

fn ms(value: u64) -> UnixMillis {
    // INVARIANT: every sample time is far below 2^53.
    UnixMillis::new(value).expect("sample time")
}

/// The sample Worker Session (the fuzz targets' own sample, at generation 2).
pub use crate::fuzzing::samples::{offer_id, worker};

/// A sample lease token derived from `n`.
#[must_use]
pub fn lease_token(n: u32) -> LeaseToken {
    LeaseToken::new(format!("worker_generated_lease_capability_{n:016}")).expect("sample token")
}

/// A sample execution revision (argv `/bin/true`, one public binding, a 5 s timeout): the fuzz
/// targets' sample revision with a timeout and no Secret.
#[must_use]
pub fn revision() -> ExecutionRevision {
    crate::fuzzing::samples::revision(false, true)
}

/// The sample revision with one more binding, `SECRET_VALUE`, resolved through the Secrets
/// endpoint (`qlsecret:v1:` reference to secret `db-password` of `project-1`).
#[must_use]
pub fn secret_revision() -> ExecutionRevision {
    let mut revision = revision();
    let reference = SecretRef::create("project-1", "db-password", None).expect("sample ref");
    revision.environment.push(EnvBinding {
        name: EnvName::new("SECRET_VALUE").expect("sample env name"),
        value: EnvValue::Secret(SecretRef::new(&reference).expect("sample ref")),
    });
    // INVARIANT: adding a well-formed binding keeps the revision normalized.
    revision.seal().expect("sample secret revision")
}

/// The sample revision without `timeoutMs` (the starting ACK then carries no deadline).
#[must_use]
pub fn untimed_revision() -> ExecutionRevision {
    let mut revision = revision();
    revision.timeout_ms = None;
    // INVARIANT: dropping the timeout keeps the revision normalized.
    revision.seal().expect("sample untimed revision")
}

/// The sample edge configuration of the Worker Session of [`worker`].
#[must_use]
pub fn config() -> WorkerConfig {
    let worker = worker();
    WorkerConfig {
        // Every supervision pass calls lease control, as the reference does: the scenarios and
        // the model checks follow the reference's cadence (pacing has its own scenario).
        lease_control_interval_ms: 0,
        ..WorkerConfig::edge(
            worker.worker_id,
            worker.session_id,
            Capabilities::for_architecture(Architecture::Amd64),
        )
    }
}

/// A valid sample offer for Run `run-<n>` / Attempt `attempt-<n>`, lease version 0, expiring at
/// 30 020 ms.
#[must_use]
pub fn offer(n: u32) -> Offer {
    offer_for(n, offer_id(n), lease_token(n), revision(), ms(20), 30_000)
}

/// An offer for Run `run-<n>` / Attempt `attempt-<n>` under `offer_id` and `lease_token` (the
/// pending claim's), pinned to `revision`, leased at `acquired` for `lease_ms` (version 0): what
/// the control plane of the simulation delivers for a claim.
#[must_use]
pub fn offer_for(
    n: u32,
    offer_id: OfferId,
    token: LeaseToken,
    revision: ExecutionRevision,
    acquired: UnixMillis,
    lease_ms: u64,
) -> Offer {
    let worker = worker();
    let run_id = RunId::new(format!("run-{n}")).expect("sample run");
    let attempt_id = AttemptId::new(format!("attempt-{n}")).expect("sample attempt");
    Offer {
        offer_id,
        delivery_kind: DeliveryKind::NewClaim,
        execution_digest: revision.content_digest,
        candidate: Candidate {
            run_id: run_id.clone(),
            attempt_id: attempt_id.clone(),
            project_id: revision.project_id.clone(),
            task_id: revision.task_id.clone(),
            task_revision: revision.task_revision.clone(),
            priority: 1,
            queued_at_ms: ms(10),
            attempt_created_at_ms: ms(11),
            attempt_number: 1,
            executor_type: ExecutorType::RemoteWorker,
        },
        lease: Lease {
            attempt_id,
            run_id,
            status: LeaseStatus::Leased,
            version: LeaseVersion::FIRST,
            lease_generation: LeaseGeneration::new(1).expect("sample generation"),
            worker_id: worker.worker_id.clone(),
            worker_session_id: worker.session_id.clone(),
            worker_generation: worker.generation,
            lease_token_digest: token.digest(),
            acquired_at_ms: acquired,
            renewed_at_ms: acquired,
            expires_at_ms: acquired.saturating_add(lease_ms),
            updated_at_ms: acquired,
        },
        worker,
        lease_token: token,
        execution_revision: revision,
        placement_score: 0,
    }
}

/// The raw completion capability of seeded record `n` (its digest is what [`record`] stores).
#[must_use]
pub fn seeded_capability(n: u32) -> [u8; 32] {
    let mut bytes = [0x5a; 32];
    bytes[..4].copy_from_slice(&n.to_le_bytes());
    bytes
}

/// The durable handle of seeded record `n`.
#[must_use]
pub fn seeded_handle(n: u32) -> ExecutorHandle {
    ExecutorHandle::new(format!("ql3lp1.seeded.attempt-{n}")).expect("sample handle")
}

/// A valid record of [`offer`]`(n)` in `state`, as if it had walked the happy path there:
/// accepted at 100 ms, one revision per step, the spawn barrier (start time 102 ms, derived log
/// id, callback sequence 1, digest of [`seeded_capability`]) from `launching` on, the handle of
/// [`seeded_handle`] from `started` on. `recovery_required` records carry
/// `launch_outcome_unknown` and the barrier; `start_failed` ones none.
#[must_use]
pub fn record(n: u32, state: State) -> InboxRecord {
    let mut r = InboxRecord::accepted(offer(n), ms(100));
    let steps: u64 = match state {
        State::Accepted => 0,
        State::StartingAcknowledged => 1,
        State::Launching | State::StartFailed => 2,
        State::Started | State::RecoveryRequired => 3,
        State::RunningAcknowledged | State::StartFailureAcknowledged => 4,
        State::CompletionAcknowledged => 5,
    };
    r.revision = Revision::new(steps).expect("sample revision");
    r.state = state;
    r.updated_at_ms = ms(100 + steps);
    let barrier = !matches!(
        state,
        State::Accepted
            | State::StartingAcknowledged
            | State::StartFailed
            | State::StartFailureAcknowledged
    );
    if barrier {
        let c = &r.offer.candidate;
        r.executor_started_at_ms = Some(ms(102));
        r.log_artifact_id = Some(ql_worker_core::wire::derive_log_artifact_id(
            &c.project_id,
            &c.run_id,
            &c.attempt_id,
            &r.offer.offer_id,
        ));
        r.completion_receipt_callback_sequence = Some(CallbackSequence::FIRST);
        let digest = Sha256Digest::of(&seeded_capability(n));
        r.completion_receipt_token_digest = Some(CapabilityDigest::new(digest));
    }
    if matches!(
        state,
        State::Started | State::RunningAcknowledged | State::CompletionAcknowledged
    ) {
        r.executor_handle = Some(seeded_handle(n));
    }
    match state {
        State::CompletionAcknowledged => r.completion_acknowledged_at_ms = Some(r.updated_at_ms),
        State::RecoveryRequired => r.recovery_reason = Some(RecoveryReason::LaunchOutcomeUnknown),
        State::Accepted
        | State::StartingAcknowledged
        | State::Launching
        | State::Started
        | State::RunningAcknowledged
        | State::StartFailed
        | State::StartFailureAcknowledged => {}
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_records_are_valid_in_every_state() {
        for state in State::ALL {
            let record = record(1, state);
            assert_eq!(record.validate(), Ok(()), "{state}");
            assert_eq!(record.state, state);
        }
    }

    #[test]
    fn sample_revisions_are_sealed() {
        assert!(secret_revision().validate().is_ok());
        assert!(untimed_revision().validate().is_ok());
        assert_eq!(untimed_revision().timeout_ms, None);
    }
}
