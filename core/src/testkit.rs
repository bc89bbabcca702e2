//! Deterministic sample values for tests, fuzzing and the simulation. Not part of the API.
//!
//! Everything here is pure data derived from a small integer, so tests in every crate build the
//! same offers and records.

use alloc::format;
use alloc::string::String;
use alloc::vec;

use crate::ids::{
    AttemptId, LeaseGeneration, LeaseToken, LeaseVersion, OfferId, ProjectId, RunId, SessionId,
    Sha256Digest, TaskId, TaskRevision, WorkerGeneration, WorkerId,
};
use crate::offer::{Candidate, DeliveryKind, ExecutorType, Lease, LeaseStatus, Offer, OfferWorker};
use crate::revision::{EnvBinding, EnvName, EnvValue, ExecCommand, ExecutionRevision};
use crate::time::UnixMillis;

fn ms(value: u64) -> UnixMillis {
    // INVARIANT: every sample time is far below 2^53.
    UnixMillis::new(value).expect("sample time")
}

/// The sample Worker Session.
#[must_use]
pub fn worker() -> OfferWorker {
    OfferWorker {
        worker_id: WorkerId::new("edge-1").expect("sample worker id"),
        session_id: SessionId::new("018f0000-0000-7000-8000-000000000001").expect("sample session"),
        generation: WorkerGeneration::new(2).expect("sample generation"),
    }
}

/// A sample lease token derived from `n`.
#[must_use]
pub fn lease_token(n: u32) -> LeaseToken {
    LeaseToken::new(format!("worker_generated_lease_capability_{n:016}")).expect("sample token")
}

/// A sample offer id derived from `n`.
#[must_use]
pub fn offer_id(n: u32) -> OfferId {
    OfferId::new(format!("offer-{n:06}")).expect("sample offer id")
}

/// A sample execution revision (argv `/bin/true`, one public and one secret binding, a timeout).
#[must_use]
pub fn revision() -> ExecutionRevision {
    let source_digest = "a".repeat(64);
    let revision = ExecutionRevision {
        project_id: ProjectId::new("project-1").expect("sample project"),
        task_id: TaskId::new("task-1").expect("sample task"),
        task_revision: TaskRevision::new(format!("qltd:v1:1:{source_digest}"))
            .expect("sample task revision"),
        source_revision: 1,
        source_content_digest: Sha256Digest::from_hex(&source_digest).expect("sample digest"),
        command: ExecCommand::Argv {
            file: String::from("/bin/true"),
            args: vec![],
        },
        environment: vec![EnvBinding {
            name: EnvName::new("PUBLIC_VALUE").expect("sample env name"),
            value: EnvValue::Public(String::from("visible")),
        }],
        environment_bundle_ref: None,
        working_directory: None,
        timeout_ms: Some(5000),
        placement: None,
        created_at_ms: ms(1),
        content_digest: Sha256Digest::from_bytes([0; 32]),
    };
    // INVARIANT: the sample revision satisfies every normalization rule.
    revision.seal().expect("sample revision")
}

/// A valid sample offer for Run `run-<n>` / Attempt `attempt-<n>`, lease version 0, expiring at
/// 30 020 ms.
#[must_use]
pub fn offer(n: u32) -> Offer {
    let token = lease_token(n);
    let worker = worker();
    let revision = revision();
    let run_id = RunId::new(format!("run-{n}")).expect("sample run");
    let attempt_id = AttemptId::new(format!("attempt-{n}")).expect("sample attempt");
    Offer {
        offer_id: offer_id(n),
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
            acquired_at_ms: ms(20),
            renewed_at_ms: ms(20),
            expires_at_ms: ms(30_020),
            updated_at_ms: ms(20),
        },
        worker,
        lease_token: token,
        execution_revision: revision,
        placement_score: 0,
    }
}
