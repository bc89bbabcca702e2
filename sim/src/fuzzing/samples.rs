//! Deterministic sample values, derived from small integers: the Worker Session, offer ids and
//! revisions that `crate::testkit` uses too, and the variations the fuzz targets need:
//! revisions with and without a Secret binding and a timeout, records in every state with their
//! barrier fields, genuine receipts, truncation facts and claims.

use base64::Engine as _;

use ql_worker_core::claim::PendingClaim;
use ql_worker_core::ids::{
    AttemptId, CallbackSequence, CapabilityDigest, ExecutorHandle, LeaseToken, LeaseVersion,
    OfferId, ProjectId, Revision, RunId, SessionId, Sha256Digest, TaskId, TaskRevision,
    WorkerGeneration, WorkerId,
};
use ql_worker_core::offer::{Offer, OfferWorker};
use ql_worker_core::receipt::{Receipt, ReceiptToken};
use ql_worker_core::record::{
    InboxRecord, OptionalField, Presence, RecoveryReason, State, presence,
};
use ql_worker_core::revision::{
    EnvBinding, EnvName, EnvValue, ExecCommand, ExecutionRevision, SecretRef,
};
use ql_worker_core::time::UnixMillis;
use ql_worker_core::truncation::{FACT_SCHEMA_VERSION, MIN_LOG_QUOTA_BYTES, TruncationFact};
use ql_worker_core::wire::artifact::derive_log_artifact_id;
use ql_worker_tests::control_plane::revisions::Seal as _;

/// The Session generation of the sample Worker.
pub const GENERATION: u64 = 2;
/// The name of the Secret binding of [`revision`] with `secret`.
pub const SECRET_NAME: &str = "API_TOKEN";

/// A time in milliseconds (values are far below 2^53).
#[must_use]
pub fn ms(value: u64) -> UnixMillis {
    UnixMillis::new(value.min(1 << 52)).expect("sample time below 2^53")
}

/// The sample Worker Session at `generation`.
#[must_use]
pub fn worker_at(generation: u64) -> OfferWorker {
    OfferWorker {
        worker_id: WorkerId::new("edge-1").expect("sample worker id"),
        session_id: SessionId::new("018f0000-0000-7000-8000-000000000001").expect("sample session"),
        generation: WorkerGeneration::new(generation.max(1)).expect("sample generation"),
    }
}

/// The sample Worker Session at [`GENERATION`].
#[must_use]
pub fn worker() -> OfferWorker {
    worker_at(GENERATION)
}

/// A sample lease token derived from `n`.
#[must_use]
pub fn lease_token(n: u32) -> LeaseToken {
    LeaseToken::new(format!("fuzz_lease_capability_token_{n:016}")).expect("sample token")
}

/// A sample offer id derived from `n`.
#[must_use]
pub fn offer_id(n: u32) -> OfferId {
    OfferId::new(format!("offer-{n:06}")).expect("sample offer id")
}

/// The canonical reference of the sample Secret.
#[must_use]
pub fn secret_ref() -> SecretRef {
    let text = SecretRef::create("project-1", SECRET_NAME, None).expect("sample secret ref");
    SecretRef::new(&text).expect("sample secret ref parses")
}

/// A sample execution revision: argv `/bin/true`, one public binding, optionally a Secret
/// binding and a 5 s timeout.
#[must_use]
pub fn revision(secret: bool, timeout: bool) -> ExecutionRevision {
    unsealed_revision(secret, timeout)
        .seal()
        .expect("sample revision is normalized")
}

/// [`revision`] before sealing: normalized by construction but with a zero content digest, so
/// an offer built from it does not validate. Cheap; for targets that never validate the offer.
#[must_use]
pub fn unsealed_revision(secret: bool, timeout: bool) -> ExecutionRevision {
    let source_digest = "a".repeat(64);
    let mut environment = vec![EnvBinding {
        name: EnvName::new("PUBLIC_VALUE").expect("sample env name"),
        value: EnvValue::Public("visible".into()),
    }];
    if secret {
        environment.push(EnvBinding {
            name: EnvName::new(SECRET_NAME).expect("sample secret name"),
            value: EnvValue::Secret(secret_ref()),
        });
    }
    ExecutionRevision {
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
        environment,
        environment_bundle_ref: None,
        working_directory: None,
        timeout_ms: timeout.then_some(5000),
        placement: None,
        created_at_ms: ms(1),
        content_digest: Sha256Digest::from_bytes([0; 32]),
    }
}

/// Run, Attempt and offer of sample `n`.
#[must_use]
pub fn ids(n: u32) -> (RunId, AttemptId, OfferId) {
    (
        RunId::new(format!("run-{n}")).expect("sample run"),
        AttemptId::new(format!("attempt-{n}")).expect("sample attempt"),
        offer_id(n),
    )
}

/// A valid offer for sample `n` with `revision`, claimed by `worker` with `token`, its lease
/// (version `version`) acquired at `acquired` and expiring at `expires` (> `acquired`).
#[must_use]
pub fn offer_with(
    n: u32,
    offer_id: OfferId,
    worker: OfferWorker,
    token: LeaseToken,
    revision: ExecutionRevision,
    lease: (u64, UnixMillis, UnixMillis),
) -> Offer {
    let (version, acquired, expires) = lease;
    let expires = expires.max(acquired.saturating_add(1));
    let lease_ms = expires.saturating_since(acquired);
    let mut offer = crate::testkit::offer_for(n, offer_id, token, revision, acquired, lease_ms);
    offer.lease.version = LeaseVersion::new(version).expect("sample lease version");
    offer.lease.worker_id = worker.worker_id.clone();
    offer.lease.worker_session_id = worker.session_id.clone();
    offer.lease.worker_generation = worker.generation;
    offer.worker = worker;
    offer
}

/// The sample offer `n` (no Secret, with timeout) at lease version 0, acquired at 20 ms and
/// expiring at `expires`.
#[must_use]
pub fn offer(n: u32, expires: UnixMillis) -> Offer {
    offer_with(
        n,
        offer_id(n),
        worker(),
        lease_token(n),
        revision(false, true),
        (0, ms(20), expires),
    )
}

/// The 32-byte completion capability of sample `n`.
#[must_use]
pub fn capability(n: u32) -> [u8; 32] {
    *Sha256Digest::of(format!("ql-fuzz-capability-{n}").as_bytes()).as_bytes()
}

/// Canonical base64url of a capability (the receipt form).
#[must_use]
pub fn base64url(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// The durable executor handle of sample `n`.
#[must_use]
pub fn handle(n: u32) -> ExecutorHandle {
    ExecutorHandle::new(format!("ql3lp1.fuzz-handle-{n}")).expect("sample handle")
}

/// What optional barrier fields a sample record carries where its state leaves them optional.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extras {
    /// Set the launch barrier fields (start time, log id, callback) where optional.
    pub barrier: bool,
    /// Set the executor handle where optional (implies the barrier).
    pub handle: bool,
}

/// A valid record of sample `n` in `state` (revision 3, accepted at `at`, updated at `at`),
/// carrying every required field and the optional ones `extras` asks for. The callback digest
/// is the SHA-256 of [`capability`]`(n)`, the start time `at`.
#[must_use]
pub fn record(
    offer: Offer,
    n: u32,
    state: State,
    reason: RecoveryReason,
    at: UnixMillis,
    extras: Extras,
) -> InboxRecord {
    let mut r = InboxRecord::accepted(offer, at);
    r.revision = Revision::new(3).expect("sample revision");
    r.state = state;
    let wanted = |field| match presence(state, field) {
        Presence::Required => true,
        Presence::Optional => extras.barrier || extras.handle,
        Presence::Absent => false,
    };
    if wanted(OptionalField::ExecutorStartedAtMs) {
        r.executor_started_at_ms = Some(at);
    }
    if wanted(OptionalField::LogArtifactId) {
        let o = &r.offer;
        r.log_artifact_id = Some(derive_log_artifact_id(
            &o.candidate.project_id,
            &o.candidate.run_id,
            &o.candidate.attempt_id,
            &o.offer_id,
        ));
    }
    if wanted(OptionalField::CompletionReceipt) {
        r.completion_receipt_callback_sequence = Some(CallbackSequence::FIRST);
        r.completion_receipt_token_digest =
            Some(CapabilityDigest::new(Sha256Digest::of(&capability(n))));
    }
    let handle_wanted = match presence(state, OptionalField::ExecutorHandle) {
        Presence::Required => true,
        Presence::Optional => extras.handle && r.executor_started_at_ms.is_some(),
        Presence::Absent => false,
    };
    if handle_wanted {
        r.executor_handle = Some(handle(n));
    }
    if wanted(OptionalField::CompletionAcknowledgedAtMs) {
        r.completion_acknowledged_at_ms = Some(at);
    }
    if presence(state, OptionalField::RecoveryReason) == Presence::Required {
        r.recovery_reason = Some(reason);
    }
    r
}

/// The genuine receipt of a record carrying barrier fields, for capability `capability`.
#[must_use]
pub fn receipt_for(
    record: &InboxRecord,
    capability: &[u8; 32],
    finished: UnixMillis,
    exit_code: u8,
) -> Receipt {
    let started = record.executor_started_at_ms.unwrap_or(UnixMillis::ZERO);
    Receipt {
        schema_version: 1,
        run_id: record.offer.candidate.run_id.clone(),
        attempt_id: record.offer.candidate.attempt_id.clone(),
        callback_sequence: record
            .completion_receipt_callback_sequence
            .unwrap_or(CallbackSequence::FIRST),
        token: ReceiptToken::new(base64url(capability)).expect("43 base64url characters"),
        started_at_ms: started,
        finished_at_ms: finished.max(started),
        exit_code,
    }
}

/// A sample truncation fact of sample `n`.
#[must_use]
pub fn truncation_fact(n: u32, quota_reached: bool) -> TruncationFact {
    let (run_id, attempt_id, offer_id) = ids(n);
    let project = ProjectId::new("project-1").expect("sample project");
    TruncationFact {
        schema_version: FACT_SCHEMA_VERSION,
        log_artifact_id: derive_log_artifact_id(&project, &run_id, &attempt_id, &offer_id),
        run_id,
        attempt_id,
        maximum_bytes: MIN_LOG_QUOTA_BYTES * u64::from(n.max(1)),
        quota_reached,
        observed_at_ms: ms(1_000 + u64::from(n)),
    }
}

/// A sample pending claim of sample `n` after `attempts` attempts.
#[must_use]
pub fn claim(n: u32, attempts: u8) -> PendingClaim {
    let mut claim = PendingClaim::new(&worker(), offer_id(n), lease_token(n), ms(100));
    claim.attempt_count = attempts;
    if attempts > 0 {
        claim.revision = Revision::new(u64::from(attempts)).expect("sample claim revision");
        claim.last_attempt_at_ms = Some(ms(100 + u64::from(attempts)));
        claim.updated_at_ms = ms(100 + u64::from(attempts));
        claim.next_attempt_at_ms = ms(200 + u64::from(attempts));
    }
    claim
}

/// Every sample record (one per state, with and without the optional barrier fields).
#[must_use]
pub fn every_record() -> Vec<InboxRecord> {
    let mut out = Vec::new();
    let mut n = 1;
    for state in State::ALL {
        for (barrier, handle) in [(false, false), (true, false), (true, true)] {
            let reason = RecoveryReason::ALL[(n as usize) % RecoveryReason::ALL.len()];
            let offer = offer_with(
                n,
                offer_id(n),
                worker(),
                lease_token(n),
                revision(n.is_multiple_of(2), !n.is_multiple_of(3)),
                (u64::from(n % 4), ms(20), ms(30_020)),
            );
            let extras = Extras { barrier, handle };
            let record = record(offer, n, state, reason, ms(1_000), extras);
            if !out.contains(&record) {
                out.push(record);
            }
            n += 1;
        }
    }
    out
}
