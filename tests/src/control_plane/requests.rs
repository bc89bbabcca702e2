//! Strict server-side parsers of the Worker's JSON request bodies (reference §2.2–2.11).
//!
//! Every body must be a JSON object with exactly the reference's key set (unknown, missing or
//! duplicate key ⇒ rejection), integers must be non-negative integers within their bounds,
//! keys the reference always sends as `null` when empty must be present, and every value is
//! validated with the core's newtypes. A body that is not JSON at all is `invalid_json`; any other
//! violation is `invalid_worker_request` (both 400), as the reference's pipeline maps them.

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};

use ql_worker_core::ids::{
    AttemptId, CallbackSequence, ExecutorHandle, LeaseGeneration, LeaseToken, LeaseVersion,
    MAX_INT32, MAX_SAFE_INTEGER, OfferId, ProjectId, RunId, Sha256Digest, TaskId, TaskRevision,
    WorkerGeneration,
};
use ql_worker_core::revision::SecretRef;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::Fence;
use ql_worker_core::wire::error::ErrorCode;
use ql_worker_core::wire::session::SessionStatus;
use ql_worker_core::wire::{completion, lease_control, secrets, session};

/// Why a request was refused: the error code the server answers with and a short reason for
/// inspection (never a value from the body).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reject {
    /// The code (its HTTP status follows from it).
    pub code: ErrorCode,
    /// What was wrong.
    pub reason: &'static str,
}

impl Reject {
    /// A rejection with `code` for `reason`.
    pub fn new(code: ErrorCode, reason: &'static str) -> Self {
        Self { code, reason }
    }

    /// `invalid_worker_request` for `reason`.
    pub fn invalid(reason: &'static str) -> Self {
        Self::new(ErrorCode::InvalidWorkerRequest, reason)
    }
}

fn check(ok: bool, reason: &'static str) -> Result<(), Reject> {
    if ok {
        Ok(())
    } else {
        Err(Reject::invalid(reason))
    }
}

fn valid<T, E>(result: Result<T, E>, reason: &'static str) -> Result<T, Reject> {
    result.map_err(|_| Reject::invalid(reason))
}

/// Parses `body` as exactly the shape `T`: empty or non-object ⇒ `invalid_worker_request`,
/// not JSON ⇒ `invalid_json`.
pub(crate) fn parse_json<T: DeserializeOwned>(body: &[u8]) -> Result<T, Reject> {
    if body.is_empty() {
        return Err(Reject::invalid("empty body"));
    }
    serde_json::from_slice(body).map_err(|e| match e.classify() {
        serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
            Reject::new(ErrorCode::InvalidJson, "body is not JSON")
        }
        serde_json::error::Category::Data | serde_json::error::Category::Io => {
            Reject::invalid("body does not have the exact shape")
        }
    })
}

/// A required key whose value may be `null` (a missing key is an error).
pub(crate) fn nullable<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer)
}

fn exact_schema(value: &str, schema: &'static str) -> Result<(), Reject> {
    check(value == schema, "schema")
}

fn bounded_text(value: &str, max: usize) -> bool {
    let chars = value.encode_utf16().count();
    (1..=max).contains(&chars) && !value.chars().any(char::is_control)
}

/// The execution fence of activation, secrets, artifact, completion and lease-control bodies.
/// Activation bodies carry no `projectId`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecFence {
    /// `projectId`, absent from activation bodies.
    pub project_id: Option<ProjectId>,
    /// `runId`.
    pub run_id: RunId,
    /// `attemptId`.
    pub attempt_id: AttemptId,
    /// `workerGeneration`.
    pub worker_generation: WorkerGeneration,
    /// `offerId`.
    pub offer_id: OfferId,
    /// `leaseGeneration`.
    pub lease_generation: LeaseGeneration,
    /// `leaseToken` (redacted in `Debug`).
    pub lease_token: LeaseToken,
    /// `expectedLeaseVersion`.
    pub expected_lease_version: LeaseVersion,
}

impl ExecFence {
    /// The core's fence (for building responses with the core's serializers); `project_id`
    /// stands in for an activation body's missing one.
    pub(crate) fn to_core(&self, project_id: &ProjectId) -> Fence {
        Fence {
            worker_generation: self.worker_generation,
            project_id: self
                .project_id
                .clone()
                .unwrap_or_else(|| project_id.clone()),
            run_id: self.run_id.clone(),
            attempt_id: self.attempt_id.clone(),
            offer_id: self.offer_id.clone(),
            lease_generation: self.lease_generation,
            lease_token: self.lease_token.clone(),
            expected_lease_version: self.expected_lease_version,
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn fence(
    project_id: Option<String>,
    run_id: String,
    attempt_id: String,
    worker_generation: u64,
    offer_id: String,
    lease_generation: u64,
    lease_token: String,
    expected_lease_version: u64,
) -> Result<ExecFence, Reject> {
    Ok(ExecFence {
        project_id: project_id
            .map(|p| valid(ProjectId::new(p), "projectId"))
            .transpose()?,
        run_id: valid(RunId::new(run_id), "runId")?,
        attempt_id: valid(AttemptId::new(attempt_id), "attemptId")?,
        worker_generation: valid(WorkerGeneration::new(worker_generation), "workerGeneration")?,
        offer_id: valid(OfferId::new(offer_id), "offerId")?,
        lease_generation: valid(LeaseGeneration::new(lease_generation), "leaseGeneration")?,
        lease_token: valid(LeaseToken::new(lease_token), "leaseToken")?,
        expected_lease_version: valid(
            LeaseVersion::new(expected_lease_version),
            "expectedLeaseVersion",
        )?,
    })
}

// ---------------------------------------------------------------------------------------------
// offers
// ---------------------------------------------------------------------------------------------

/// `POST …/offers`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimRequest {
    /// The Session generation the Worker holds.
    pub worker_generation: WorkerGeneration,
    /// The pending claim's offer id.
    pub offer_id: OfferId,
    /// The pending claim's lease capability.
    pub lease_token: LeaseToken,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ClaimWire {
    worker_generation: u64,
    offer_id: String,
    lease_token: String,
}

/// Parses an offer claim body.
pub(crate) fn claim(body: &[u8]) -> Result<ClaimRequest, Reject> {
    let w: ClaimWire = parse_json(body)?;
    Ok(ClaimRequest {
        worker_generation: valid(
            WorkerGeneration::new(w.worker_generation),
            "workerGeneration",
        )?,
        offer_id: valid(OfferId::new(w.offer_id), "offerId")?,
        lease_token: valid(LeaseToken::new(w.lease_token), "leaseToken")?,
    })
}

// ---------------------------------------------------------------------------------------------
// starting, running, start-failure
// ---------------------------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ActivationWire {
    run_id: String,
    attempt_id: String,
    worker_generation: u64,
    offer_id: String,
    lease_generation: u64,
    lease_token: String,
    expected_lease_version: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RunningWire {
    run_id: String,
    attempt_id: String,
    worker_generation: u64,
    offer_id: String,
    lease_generation: u64,
    lease_token: String,
    expected_lease_version: u64,
    executor_handle: String,
    #[serde(deserialize_with = "nullable")]
    log_artifact_id: Option<String>,
    callback_sequence: u64,
    callback_token_digest: String,
}

/// The running ACK's extra facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunningFacts {
    /// `executorHandle`.
    pub executor_handle: ExecutorHandle,
    /// `logArtifactId` (`null` ⇒ `None`), ≤ 36 characters.
    pub log_artifact_id: Option<String>,
    /// `callbackSequence`.
    pub callback_sequence: CallbackSequence,
    /// `callbackTokenDigest`.
    pub callback_token_digest: Sha256Digest,
}

/// Parses a `starting` or `start-failure` body (exactly the 7 fence keys).
pub(crate) fn activation(body: &[u8]) -> Result<ExecFence, Reject> {
    let w: ActivationWire = parse_json(body)?;
    check(
        w.worker_generation <= MAX_INT32 && w.lease_generation <= MAX_INT32,
        "activation integers",
    )?;
    fence(
        None,
        w.run_id,
        w.attempt_id,
        w.worker_generation,
        w.offer_id,
        w.lease_generation,
        w.lease_token,
        w.expected_lease_version,
    )
}

/// Parses a `running` body (the 7 fence keys and 4 more).
pub(crate) fn running(body: &[u8]) -> Result<(ExecFence, RunningFacts), Reject> {
    let w: RunningWire = parse_json(body)?;
    if let Some(log) = &w.log_artifact_id {
        check(bounded_text(log, 36), "logArtifactId")?;
    }
    let facts = RunningFacts {
        executor_handle: valid(ExecutorHandle::new(w.executor_handle), "executorHandle")?,
        log_artifact_id: w.log_artifact_id,
        callback_sequence: valid(
            CallbackSequence::new(w.callback_sequence),
            "callbackSequence",
        )?,
        callback_token_digest: valid(
            Sha256Digest::from_hex(&w.callback_token_digest),
            "callbackTokenDigest",
        )?,
    };
    let fence = fence(
        None,
        w.run_id,
        w.attempt_id,
        w.worker_generation,
        w.offer_id,
        w.lease_generation,
        w.lease_token,
        w.expected_lease_version,
    )?;
    Ok((fence, facts))
}

// ---------------------------------------------------------------------------------------------
// secrets
// ---------------------------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SecretsWire {
    schema: String,
    worker_generation: u64,
    run_id: String,
    attempt_id: String,
    project_id: String,
    task_id: String,
    task_revision: String,
    execution_digest: String,
    offer_id: String,
    lease_generation: u64,
    lease_token: String,
    expected_lease_version: u64,
    secret_refs: Vec<String>,
    environment_bundle_refs: Vec<String>,
}

/// `POST …/secrets`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretsRequest {
    /// The fence (with `projectId`).
    pub fence: ExecFence,
    /// `taskId`.
    pub task_id: TaskId,
    /// `taskRevision`.
    pub task_revision: TaskRevision,
    /// `executionDigest`.
    pub execution_digest: Sha256Digest,
    /// `secretRefs`, in request order.
    pub secret_refs: Vec<SecretRef>,
    /// `environmentBundleRefs`.
    pub environment_bundle_refs: Vec<SecretRef>,
}

impl SecretsRequest {
    /// The core's request value (to serialize the response with the core's writer).
    pub(crate) fn to_core(&self, project_id: &ProjectId) -> secrets::SecretsRequest {
        secrets::SecretsRequest {
            fence: self.fence.to_core(project_id),
            task_id: self.task_id.clone(),
            task_revision: self.task_revision.clone(),
            execution_digest: self.execution_digest,
            secret_refs: self.secret_refs.clone(),
            environment_bundle_refs: self.environment_bundle_refs.clone(),
        }
    }
}

/// Parses a secrets body: exact keys, schema, ≤ 64 unique canonical references, ≤ 1 bundle
/// reference, at least one in total, the two lists disjoint.
pub(crate) fn secrets(body: &[u8]) -> Result<SecretsRequest, Reject> {
    let w: SecretsWire = parse_json(body)?;
    exact_schema(&w.schema, secrets::SCHEMA)?;
    let parse_refs = |list: Vec<String>, reason| -> Result<Vec<SecretRef>, Reject> {
        list.iter()
            .map(|r| valid(SecretRef::new(r), reason))
            .collect()
    };
    let secret_refs = parse_refs(w.secret_refs, "secretRefs")?;
    let bundle_refs = parse_refs(w.environment_bundle_refs, "environmentBundleRefs")?;
    check(
        secret_refs.len() <= secrets::MAX_SECRET_REFS,
        "secretRefs count",
    )?;
    check(
        bundle_refs.len() <= secrets::MAX_BUNDLE_REFS,
        "environmentBundleRefs count",
    )?;
    check(
        !secret_refs.is_empty() || !bundle_refs.is_empty(),
        "at least one reference",
    )?;
    check(
        secret_refs
            .iter()
            .enumerate()
            .all(|(i, r)| !secret_refs[..i].contains(r)),
        "secretRefs unique",
    )?;
    check(
        secret_refs.iter().all(|r| !bundle_refs.contains(r)),
        "reference lists disjoint",
    )?;
    let fence = fence(
        Some(w.project_id),
        w.run_id,
        w.attempt_id,
        w.worker_generation,
        w.offer_id,
        w.lease_generation,
        w.lease_token,
        w.expected_lease_version,
    )?;
    Ok(SecretsRequest {
        fence,
        task_id: valid(TaskId::new(w.task_id), "taskId")?,
        task_revision: valid(TaskRevision::new(w.task_revision), "taskRevision")?,
        execution_digest: valid(
            Sha256Digest::from_hex(&w.execution_digest),
            "executionDigest",
        )?,
        secret_refs,
        environment_bundle_refs: bundle_refs,
    })
}

// ---------------------------------------------------------------------------------------------
// completion
// ---------------------------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CompletionWire {
    schema: String,
    worker_generation: u64,
    project_id: String,
    run_id: String,
    attempt_id: String,
    offer_id: String,
    lease_generation: u64,
    lease_token: String,
    expected_lease_version: u64,
    callback_sequence: u64,
    callback_token_digest: String,
    result: ResultWire,
    artifact: ArtifactRefWire,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ResultWire {
    outcome: OutcomeWire,
    started_at_ms: u64,
    finished_at_ms: u64,
    exit_code: u64,
}

#[derive(Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
enum OutcomeWire {
    Succeeded,
    Failed,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ArtifactRefWire {
    log_artifact_id: String,
    byte_length: u64,
    sha256: String,
    #[serde(deserialize_with = "nullable")]
    truncated: Option<bool>,
}

/// The artifact a completion refers to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArtifactRef {
    /// `logArtifactId` (≤ 36 characters).
    pub log_artifact_id: String,
    /// `byteLength`.
    pub byte_length: u64,
    /// `sha256`.
    pub sha256: Sha256Digest,
    /// `truncated` (`null` ⇒ unknown).
    pub truncated: Option<bool>,
}

/// `POST …/completion`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompletionRequest {
    /// The fence (with `projectId`).
    pub fence: ExecFence,
    /// `callbackSequence`.
    pub callback_sequence: CallbackSequence,
    /// `callbackTokenDigest`.
    pub callback_token_digest: Sha256Digest,
    /// `result`.
    pub result: completion::CompletionResult,
    /// `artifact`.
    pub artifact: ArtifactRef,
}

/// Parses a completion body: exact keys at every level, schema, `finishedAtMs ≥ startedAtMs`,
/// `succeeded` iff `exitCode == 0`, exit code ≤ 255, artifact ≤ 64 MiB.
pub(crate) fn completion(body: &[u8]) -> Result<CompletionRequest, Reject> {
    let w: CompletionWire = parse_json(body)?;
    exact_schema(&w.schema, completion::SCHEMA)?;
    let r = &w.result;
    check(r.exit_code <= 255, "result.exitCode")?;
    check(
        matches!(r.outcome, OutcomeWire::Succeeded) == (r.exit_code == 0),
        "result.outcome",
    )?;
    check(r.finished_at_ms >= r.started_at_ms, "result.finishedAtMs")?;
    let started = valid(UnixMillis::new(r.started_at_ms), "result.startedAtMs")?;
    let finished = valid(UnixMillis::new(r.finished_at_ms), "result.finishedAtMs")?;
    let exit_code = u8::try_from(r.exit_code).map_err(|_| Reject::invalid("result.exitCode"))?;
    let a = w.artifact;
    check(
        bounded_text(&a.log_artifact_id, 36),
        "artifact.logArtifactId",
    )?;
    check(
        a.byte_length <= ql_worker_core::wire::artifact::MAX_ARTIFACT_BYTES,
        "artifact.byteLength",
    )?;
    let fence = fence(
        Some(w.project_id),
        w.run_id,
        w.attempt_id,
        w.worker_generation,
        w.offer_id,
        w.lease_generation,
        w.lease_token,
        w.expected_lease_version,
    )?;
    Ok(CompletionRequest {
        fence,
        callback_sequence: valid(
            CallbackSequence::new(w.callback_sequence),
            "callbackSequence",
        )?,
        callback_token_digest: valid(
            Sha256Digest::from_hex(&w.callback_token_digest),
            "callbackTokenDigest",
        )?,
        result: completion::CompletionResult::from_exit(started, finished, exit_code),
        artifact: ArtifactRef {
            sha256: valid(Sha256Digest::from_hex(&a.sha256), "artifact.sha256")?,
            log_artifact_id: a.log_artifact_id,
            byte_length: a.byte_length,
            truncated: a.truncated,
        },
    })
}

// ---------------------------------------------------------------------------------------------
// lease-control
// ---------------------------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct LeaseControlWire {
    schema: String,
    worker_generation: u64,
    project_id: String,
    run_id: String,
    attempt_id: String,
    offer_id: String,
    lease_generation: u64,
    lease_token: String,
    expected_lease_version: u64,
}

/// Parses a lease-control body (schema and the 8 execution fence keys).
pub(crate) fn lease_control(body: &[u8]) -> Result<ExecFence, Reject> {
    let w: LeaseControlWire = parse_json(body)?;
    exact_schema(&w.schema, lease_control::SCHEMA)?;
    fence(
        Some(w.project_id),
        w.run_id,
        w.attempt_id,
        w.worker_generation,
        w.offer_id,
        w.lease_generation,
        w.lease_token,
        w.expected_lease_version,
    )
}

// ---------------------------------------------------------------------------------------------
// register, heartbeat, transition
// ---------------------------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RegisterWire {
    schema: String,
    capabilities_json: String,
    capabilities_hash: String,
    max_concurrent_runs: u64,
    available_slots: u64,
    lease_duration_ms: u64,
}

/// `POST …/register` (capabilities are checked by the Session module).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisterRequest {
    /// `capabilitiesJson`.
    pub capabilities_json: String,
    /// `capabilitiesHash`.
    pub capabilities_hash: Sha256Digest,
    /// `maxConcurrentRuns`, 1..=1024.
    pub max_concurrent_runs: u64,
    /// `availableSlots`, ≤ `maxConcurrentRuns`.
    pub available_slots: u64,
    /// `leaseDurationMs`, 5 000..=600 000.
    pub lease_duration_ms: u64,
}

fn lease_duration(ms: u64) -> Result<u64, Reject> {
    check(
        (session::MIN_LEASE_DURATION_MS..=session::MAX_LEASE_DURATION_MS).contains(&ms),
        "leaseDurationMs",
    )?;
    Ok(ms)
}

/// Parses a register body.
pub(crate) fn register(body: &[u8]) -> Result<RegisterRequest, Reject> {
    let w: RegisterWire = parse_json(body)?;
    exact_schema(&w.schema, session::REGISTER_SCHEMA)?;
    check(
        (1..=session::MAX_CONCURRENT_RUNS).contains(&w.max_concurrent_runs),
        "maxConcurrentRuns",
    )?;
    check(w.available_slots <= w.max_concurrent_runs, "availableSlots")?;
    check(
        (2..=session::MAX_CAPABILITIES_BYTES).contains(&w.capabilities_json.len()),
        "capabilitiesJson size",
    )?;
    Ok(RegisterRequest {
        capabilities_hash: valid(
            Sha256Digest::from_hex(&w.capabilities_hash),
            "capabilitiesHash",
        )?,
        capabilities_json: w.capabilities_json,
        max_concurrent_runs: w.max_concurrent_runs,
        available_slots: w.available_slots,
        lease_duration_ms: lease_duration(w.lease_duration_ms)?,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct HeartbeatWire {
    schema: String,
    generation: u64,
    expected_version: u64,
    available_slots: u64,
    lease_duration_ms: u64,
}

/// `POST …/heartbeat`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeartbeatRequest {
    /// `generation`.
    pub generation: WorkerGeneration,
    /// `expectedVersion`.
    pub expected_version: u64,
    /// `availableSlots`.
    pub available_slots: u64,
    /// `leaseDurationMs`.
    pub lease_duration_ms: u64,
}

/// Parses a heartbeat body.
pub(crate) fn heartbeat(body: &[u8]) -> Result<HeartbeatRequest, Reject> {
    let w: HeartbeatWire = parse_json(body)?;
    exact_schema(&w.schema, session::HEARTBEAT_SCHEMA)?;
    check(w.expected_version <= MAX_SAFE_INTEGER, "expectedVersion")?;
    check(
        w.available_slots <= session::MAX_CONCURRENT_RUNS,
        "availableSlots",
    )?;
    Ok(HeartbeatRequest {
        generation: valid(WorkerGeneration::new(w.generation), "generation")?,
        expected_version: w.expected_version,
        available_slots: w.available_slots,
        lease_duration_ms: lease_duration(w.lease_duration_ms)?,
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct TransitionWire {
    schema: String,
    generation: u64,
    expected_version: u64,
    status: SessionStatus,
}

/// `POST …/transition`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransitionRequest {
    /// `generation`.
    pub generation: WorkerGeneration,
    /// `expectedVersion`.
    pub expected_version: u64,
    /// `draining` or `offline`.
    pub status: SessionStatus,
}

/// Parses a transition body (`online` is refused).
pub(crate) fn transition(body: &[u8]) -> Result<TransitionRequest, Reject> {
    let w: TransitionWire = parse_json(body)?;
    exact_schema(&w.schema, session::TRANSITION_SCHEMA)?;
    check(w.status != SessionStatus::Online, "status")?;
    check(w.expected_version <= MAX_SAFE_INTEGER, "expectedVersion")?;
    Ok(TransitionRequest {
        generation: valid(WorkerGeneration::new(w.generation), "generation")?,
        expected_version: w.expected_version,
        status: w.status,
    })
}

// ---------------------------------------------------------------------------------------------
// attestations
// ---------------------------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct AttestationWire {
    attestation_id: String,
    run_id: String,
    attempt_id: String,
    sequence: u64,
    state: AttestationState,
    worker_generation: u64,
    lease_token_digest: String,
    lease_generation: u64,
    lease_version: u64,
    offer_id: String,
    callback_sequence: u64,
    executor_handle: String,
    journal_revision: u64,
}

/// The state an attestation reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AttestationState {
    /// `running`.
    Running,
    /// `stopped`.
    Stopped,
}

impl AttestationState {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Running => "running",
            Self::Stopped => "stopped",
        }
    }
}

/// `POST …/attestations` (control plane only; the Worker never calls it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttestationRequest {
    /// `attestationId` (1..=128 characters).
    pub attestation_id: String,
    /// `runId`.
    pub run_id: RunId,
    /// `attemptId`.
    pub attempt_id: AttemptId,
    /// `sequence` ≥ 1.
    pub sequence: u64,
    /// `state`.
    pub state: AttestationState,
    /// `workerGeneration`.
    pub worker_generation: WorkerGeneration,
    /// `leaseTokenDigest`.
    pub lease_token_digest: Sha256Digest,
    /// `leaseGeneration`.
    pub lease_generation: LeaseGeneration,
    /// `leaseVersion`.
    pub lease_version: LeaseVersion,
    /// `offerId`.
    pub offer_id: OfferId,
    /// `callbackSequence`.
    pub callback_sequence: CallbackSequence,
    /// `executorHandle`.
    pub executor_handle: ExecutorHandle,
    /// `journalRevision`.
    pub journal_revision: u64,
}

/// Parses an attestation body.
pub(crate) fn attestation(body: &[u8]) -> Result<AttestationRequest, Reject> {
    let w: AttestationWire = parse_json(body)?;
    check(bounded_text(&w.attestation_id, 128), "attestationId")?;
    check((1..=MAX_SAFE_INTEGER).contains(&w.sequence), "sequence")?;
    check(w.journal_revision <= MAX_SAFE_INTEGER, "journalRevision")?;
    Ok(AttestationRequest {
        attestation_id: w.attestation_id,
        run_id: valid(RunId::new(w.run_id), "runId")?,
        attempt_id: valid(AttemptId::new(w.attempt_id), "attemptId")?,
        sequence: w.sequence,
        state: w.state,
        worker_generation: valid(
            WorkerGeneration::new(w.worker_generation),
            "workerGeneration",
        )?,
        lease_token_digest: valid(
            Sha256Digest::from_hex(&w.lease_token_digest),
            "leaseTokenDigest",
        )?,
        lease_generation: valid(LeaseGeneration::new(w.lease_generation), "leaseGeneration")?,
        lease_version: valid(LeaseVersion::new(w.lease_version), "leaseVersion")?,
        offer_id: valid(OfferId::new(w.offer_id), "offerId")?,
        callback_sequence: valid(
            CallbackSequence::new(w.callback_sequence),
            "callbackSequence",
        )?,
        executor_handle: valid(ExecutorHandle::new(w.executor_handle), "executorHandle")?,
        journal_revision: w.journal_revision,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_are_exact_and_json_errors_are_classified() {
        let ok = br#"{"workerGeneration":2,"offerId":"offer-1","leaseToken":"worker_generated_lease_capability_0000000000000001"}"#;
        assert!(claim(ok).is_ok());
        let widened = br#"{"workerGeneration":2,"offerId":"offer-1","leaseToken":"worker_generated_lease_capability_0000000000000001","workerId":"edge-1"}"#;
        assert_eq!(
            claim(widened).unwrap_err().code,
            ErrorCode::InvalidWorkerRequest
        );
        let dup = br#"{"workerGeneration":2,"workerGeneration":2,"offerId":"offer-1","leaseToken":"worker_generated_lease_capability_0000000000000001"}"#;
        assert_eq!(
            claim(dup).unwrap_err().code,
            ErrorCode::InvalidWorkerRequest
        );
        assert_eq!(claim(b"{").unwrap_err().code, ErrorCode::InvalidJson);
        assert_eq!(
            claim(b"").unwrap_err().code,
            ErrorCode::InvalidWorkerRequest
        );
        assert_eq!(
            claim(b"[]").unwrap_err().code,
            ErrorCode::InvalidWorkerRequest
        );
        let float = br#"{"workerGeneration":2.5,"offerId":"offer-1","leaseToken":"worker_generated_lease_capability_0000000000000001"}"#;
        assert_eq!(
            claim(float).unwrap_err().code,
            ErrorCode::InvalidWorkerRequest
        );
    }

    #[test]
    fn running_requires_the_nullable_log_id_key() {
        let base = r#""runId":"run-1","attemptId":"attempt-1","workerGeneration":2,"offerId":"offer-1","leaseGeneration":3,"leaseToken":"worker_generated_lease_capability_0000000000000001","expectedLeaseVersion":4,"executorHandle":"h","callbackSequence":1,"callbackTokenDigest":"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa""#;
        let with_null = format!("{{{base},\"logArtifactId\":null}}");
        assert_eq!(
            running(with_null.as_bytes()).unwrap().1.log_artifact_id,
            None
        );
        let missing = format!("{{{base}}}");
        assert!(running(missing.as_bytes()).is_err());
    }

    #[test]
    fn transition_refuses_online() {
        let body = br#"{"schema":"qinglong/worker-session-transition@v1","generation":1,"expectedVersion":0,"status":"online"}"#;
        assert_eq!(transition(body).unwrap_err().reason, "status");
    }
}
