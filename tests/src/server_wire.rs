//! The server side of the wire, as the reference control plane writes it: response bodies, error
//! bodies, and the route, artifact frame and client body readers. The Worker never sends these, so they live here, beside the
//! loopback control plane that answers with them (and the simulated world of `ql-worker-sim`,
//! which answers with the same bytes), not in the audited core.
//!
//! The bodies are written with this crate's [`JsonWriter`] in the reference's key order, so the
//! Worker's parsers read exactly what the reference would send.

use std::fmt;

use crate::json_writer::JsonWriter;
use ql_worker_core::ids::{
    AttemptId, LeaseGeneration, LeaseToken, LeaseVersion, LogArtifactId, OfferId, ProjectId, RunId,
    SessionId, WorkerGeneration, WorkerId,
};
use ql_worker_core::offer::DeliveryKind;
use ql_worker_core::wire::activation::{self, ActivationResponse};
use ql_worker_core::wire::artifact::{self, ArtifactReceipt, ArtifactUpload, UploadStatus};
use ql_worker_core::wire::completion::{self, CompletionResponse};
use ql_worker_core::wire::error::{ErrorCode, MAX_ERROR_BODY_BYTES};
use ql_worker_core::wire::lease_control::{self, LeaseControlRequest, LeaseControlResponse};
use ql_worker_core::wire::offer::{self, OfferResponse, OfferStats, OfferedOffer};
use ql_worker_core::wire::route::{Operation, PREFIX, path};
use ql_worker_core::wire::secrets::{self, SecretsRequest, SecretsResponse};
use ql_worker_core::wire::session::{self, SessionResponse};
use ql_worker_core::wire::{Fence, WireError, parse_json};
use serde::Deserialize;
use zeroize::Zeroizing;

/// A response body as the reference control plane serializes it.
pub trait ToJson {
    /// The body.
    fn to_json(&self) -> Vec<u8>;
}

/// A response body that repeats fields of its request (`context`), as the reference serializes
/// it.
pub trait ToJsonFor<Context: ?Sized> {
    /// The body (wiped on drop where it carries Secret values).
    type Body;
    /// The body for `context`.
    fn to_json(&self, context: &Context) -> Self::Body;
}

impl ToJson for OfferResponse {
    fn to_json(&self) -> Vec<u8> {
        offer_response(self)
    }
}

impl ToJson for CompletionResponse {
    fn to_json(&self) -> Vec<u8> {
        completion_response(self)
    }
}

impl ToJson for ActivationResponse {
    fn to_json(&self) -> Vec<u8> {
        activation_response(self)
    }
}

impl ToJsonFor<ArtifactUpload> for ArtifactReceipt {
    type Body = Vec<u8>;
    fn to_json(&self, upload: &ArtifactUpload) -> Vec<u8> {
        artifact_receipt(self, upload)
    }
}

impl ToJsonFor<LeaseControlRequest> for LeaseControlResponse {
    type Body = Vec<u8>;
    fn to_json(&self, request: &LeaseControlRequest) -> Vec<u8> {
        lease_control_response(self, request)
    }
}

impl ToJsonFor<SecretsRequest> for SecretsResponse {
    type Body = Zeroizing<Vec<u8>>;
    fn to_json(&self, request: &SecretsRequest) -> Zeroizing<Vec<u8>> {
        secrets_response(self, request)
    }
}

/// `context` is the response's schema (`REGISTER_SCHEMA`, `HEARTBEAT_SCHEMA` or
/// `TRANSITION_SCHEMA`).
impl ToJsonFor<str> for SessionResponse {
    type Body = Vec<u8>;
    fn to_json(&self, schema: &str) -> Vec<u8> {
        session_response(self, schema)
    }
}

/// The `offers` response as the reference control plane serializes it.
#[must_use]
fn offer_response(response: &OfferResponse) -> Vec<u8> {
    let mut w = JsonWriter::with_cap(offer::MAX_RESPONSE_BYTES * 2);
    w.begin_object().field_str("schema", offer::SCHEMA);
    match response {
        OfferResponse::Idle {
            reason,
            stats,
            truncated,
        } => {
            w.field_str("status", "idle")
                .field_str("reason", reason.as_str());
            write_stats(&mut w, stats);
            w.key("truncated").bool(*truncated);
        }
        OfferResponse::Offered {
            offer,
            stats,
            truncated,
        } => {
            w.field_str("status", "offered").key("offer");
            write_offer(&mut w, offer);
            write_stats(&mut w, stats);
            w.key("truncated").bool(*truncated);
        }
    }
    w.end_object();
    finish(w)
}

fn write_offer(w: &mut JsonWriter, o: &OfferedOffer) {
    let c = &o.candidate;
    let l = &o.lease;
    w.begin_object()
        .field_str("offerId", o.offer_id.as_str())
        .field_str(
            "deliveryKind",
            match o.delivery_kind {
                DeliveryKind::NewClaim => "new_claim",
                DeliveryKind::LeaseRecovery => "lease_recovery",
            },
        )
        .field_str("executionDigest", &o.execution_digest.to_hex())
        .key("candidate")
        .begin_object()
        .field_str("runId", c.run_id.as_str())
        .field_str("attemptId", c.attempt_id.as_str())
        .field_str("projectId", c.project_id.as_str())
        .field_str("taskId", c.task_id.as_str())
        .field_str("taskRevision", c.task_revision.as_str())
        .key("priority")
        .int(c.priority)
        .field_uint("queuedAtMs", c.queued_at_ms.get())
        .field_uint("attemptCreatedAtMs", c.attempt_created_at_ms.get())
        .field_uint("attemptNumber", c.attempt_number)
        .field_str("executorType", "remote_worker")
        .end_object()
        .key("worker")
        .begin_object()
        .field_str("workerId", o.worker.worker_id.as_str())
        .field_str("sessionId", o.worker.session_id.as_str())
        .field_uint("generation", o.worker.generation.get())
        .end_object()
        .key("lease")
        .begin_object()
        .field_uint("version", l.version.get())
        .field_uint("leaseGeneration", l.lease_generation.get())
        .field_uint("acquiredAtMs", l.acquired_at_ms.get())
        .field_uint("renewedAtMs", l.renewed_at_ms.get())
        .field_uint("expiresAtMs", l.expires_at_ms.get())
        .field_uint("updatedAtMs", l.updated_at_ms.get())
        .end_object()
        .key("executionRevision")
        .raw(&o.execution_revision.to_json())
        .field_uint("placementScore", o.placement_score)
        .end_object();
}

fn write_stats(w: &mut JsonWriter, stats: &OfferStats) {
    w.key("stats")
        .begin_object()
        .field_uint("pages", stats.pages)
        .field_uint("candidates", stats.candidates)
        .field_uint("plansUnavailable", stats.plans_unavailable)
        .field_uint("placementMismatches", stats.placement_mismatches)
        .field_uint("claimAttempts", stats.claim_attempts)
        .field_uint("claimRaces", stats.claim_races)
        .end_object();
}

/// The `completion` response as the reference serializes it.
#[must_use]
fn completion_response(response: &CompletionResponse) -> Vec<u8> {
    let mut w = JsonWriter::with_cap(completion::MAX_RESPONSE_BYTES);
    w.begin_object()
        .field_str("schema", completion::SCHEMA)
        .field_str("status", response.status.as_str())
        .field_str("runId", response.run_id.as_str())
        .field_str("attemptId", response.attempt_id.as_str())
        .field_uint("callbackSequence", response.callback_sequence.get())
        .end_object();
    finish(w)
}

/// The `artifacts` receipt as the reference serializes it for `upload`.
#[must_use]
fn artifact_receipt(receipt: &ArtifactReceipt, upload: &ArtifactUpload) -> Vec<u8> {
    let f = &upload.fence;
    let mut w = JsonWriter::with_cap(artifact::MAX_RESPONSE_BYTES);
    w.begin_object()
        .field_str("schema", artifact::SCHEMA)
        .field_str(
            "status",
            match receipt.status {
                UploadStatus::AlreadyStored => "already_stored",
                UploadStatus::Stored => "stored",
            },
        )
        .field_str("projectId", f.project_id.as_str())
        .field_str("runId", f.run_id.as_str())
        .field_str("attemptId", f.attempt_id.as_str())
        .field_str("logArtifactId", upload.log_artifact_id.as_str())
        .field_uint("byteLength", upload.byte_length)
        .field_str("sha256", &receipt.sha256.to_hex())
        .field_opt_bool("truncated", upload.truncated)
        .end_object();
    finish(w)
}

/// The `lease-control` response as the reference serializes it for `request`.
#[must_use]
fn lease_control_response(
    response: &LeaseControlResponse,
    request: &LeaseControlRequest,
) -> Vec<u8> {
    let f = &request.fence;
    let mut w = JsonWriter::with_cap(lease_control::MAX_RESPONSE_BYTES);
    let (status, lease, stop, terminal) = match response {
        LeaseControlResponse::Renewed(l) => ("renewed", Some(l), None, None),
        LeaseControlResponse::StopRequested(l, s) => ("stop_requested", Some(l), Some(s), None),
        LeaseControlResponse::Terminal(t) => ("terminal", None, None, Some(t)),
    };
    w.begin_object()
        .field_str("schema", lease_control::SCHEMA)
        .field_str("status", status)
        .field_str("projectId", f.project_id.as_str())
        .field_str("runId", f.run_id.as_str())
        .field_str("attemptId", f.attempt_id.as_str())
        .field_str("offerId", f.offer_id.as_str())
        .field_uint("leaseGeneration", f.lease_generation.get());
    match lease {
        Some(l) => w
            .field_uint("leaseVersion", l.lease_version.get())
            .field_uint("renewedAtMs", l.renewed_at_ms.get())
            .field_uint("expiresAtMs", l.expires_at_ms.get()),
        None => w
            .key("leaseVersion")
            .null()
            .key("renewedAtMs")
            .null()
            .key("expiresAtMs")
            .null(),
    };
    w.key("stop");
    match stop {
        Some(s) => w
            .begin_object()
            .field_str("reason", s.reason.as_str())
            .field_uint("requestedAtMs", s.requested_at_ms.get())
            .end_object(),
        None => w.null(),
    };
    w.key("terminalStatus");
    match terminal {
        Some(t) => w.string(t.as_str()),
        None => w.null(),
    };
    w.end_object();
    finish(w)
}

/// The `secrets` response as the reference serializes it for `request`; exposes every value, so the
/// buffer is wiped on drop (tests and the loopback control plane only).
#[must_use]
fn secrets_response(response: &SecretsResponse, request: &SecretsRequest) -> Zeroizing<Vec<u8>> {
    let f = &request.fence;
    let mut w = JsonWriter::with_cap(secrets::MAX_RESPONSE_BYTES * 2);
    w.begin_object()
        .field_str("schema", secrets::SCHEMA)
        .field_str("runId", f.run_id.as_str())
        .field_str("attemptId", f.attempt_id.as_str())
        .field_str("offerId", f.offer_id.as_str())
        .field_str("executionDigest", &request.execution_digest.to_hex());
    for (key, list) in [
        ("values", &response.values),
        ("environmentBundles", &response.environment_bundles),
    ] {
        w.key(key).begin_array();
        for item in list {
            w.begin_object()
                .field_str("secretRef", item.secret_ref.as_str())
                .field_str("value", item.value.expose())
                .end_object();
        }
        w.end_array();
    }
    w.end_object();
    // INVARIANT: a response built from parsed values fits twice its parser's cap.
    w.finish()
        .expect("a secrets response within its writer's cap")
}

/// The `starting` / `running` / `start-failure` response as the reference serializes it.
#[must_use]
fn activation_response(response: &ActivationResponse) -> Vec<u8> {
    let s = &response.snapshot;
    let mut w = JsonWriter::with_cap(activation::MAX_RESPONSE_BYTES * 2);
    w.begin_object()
        .field_str("schema", activation::SCHEMA)
        .field_str("status", response.status.as_str())
        .key("snapshot")
        .begin_object()
        .field_str("runId", s.run_id.as_str())
        .field_str("attemptId", s.attempt_id.as_str())
        .field_str("runStatus", s.run_status.as_str())
        .field_str("attemptStatus", s.attempt_status.as_str())
        .field_uint("leaseVersion", s.lease_version.get())
        .field_uint("leaseGeneration", s.lease_generation)
        .field_uint("callbackSequence", s.callback_sequence);
    for (key, value) in [
        ("deadlineAtMs", s.deadline_at_ms),
        ("startedAtMs", s.started_at_ms),
        ("finishedAtMs", s.finished_at_ms),
    ] {
        if let Some(v) = value {
            w.field_uint(key, v.get());
        }
    }
    if let Some(h) = &s.executor_handle {
        w.field_str("executorHandle", h.as_str());
    }
    if let Some(l) = &s.log_artifact_id {
        w.field_str("logArtifactId", l);
    }
    if let Some(e) = &s.error_code {
        w.field_str("errorCode", e);
    }
    w.end_object().end_object();
    finish(w)
}

/// A Session response (`register`, `heartbeat`, `transition`) as the reference serializes it
/// under `schema`.
#[must_use]
fn session_response(response: &SessionResponse, schema: &str) -> Vec<u8> {
    let mut w = JsonWriter::with_cap(session::MAX_RESPONSE_BYTES);
    w.begin_object()
        .field_str("schema", schema)
        .field_str("workerId", response.worker_id.as_str())
        .field_str("sessionId", response.session_id.as_str())
        .field_uint("generation", response.generation.get())
        .field_uint("version", response.version)
        .field_str("status", response.status.as_str())
        .field_uint("leaseExpiresAtMs", response.lease_expires_at_ms.get());
    if let Some(r) = response.replaced_session {
        w.key("replacedSession").bool(r);
    }
    w.end_object();
    finish(w)
}

/// The error body the server sends for `code`.
#[must_use]
pub fn error_body(code: ErrorCode) -> Vec<u8> {
    let mut w = JsonWriter::with_cap(MAX_ERROR_BODY_BYTES);
    w.begin_object()
        .field_str("code", code.as_str())
        .end_object();
    finish(w)
}

/// A path that does not match the route template (the server answers 404
/// `worker_route_not_found`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteError {
    /// Which part is wrong.
    pub part: &'static str,
}

impl fmt::Display for RouteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "worker ingress path rejected: invalid {}", self.part)
    }
}

impl core::error::Error for RouteError {}

/// A parsed route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// Worker.
    pub worker_id: WorkerId,
    /// Session.
    pub session_id: SessionId,
    /// Operation.
    pub operation: Operation,
}

impl Route {
    /// The path of this route.
    #[must_use]
    pub fn path(&self) -> String {
        path(&self.worker_id, &self.session_id, self.operation)
    }
}

/// The operation a route's last path segment names, if any.
#[must_use]
pub fn operation_of_segment(segment: &str) -> Option<Operation> {
    Operation::ALL.into_iter().find(|op| op.as_str() == segment)
}

/// Parses and validates a request path (no query string, no fragment, exact template).
///
/// # Errors
/// [`RouteError`] naming the part that does not match.
pub fn parse_route(path: &str) -> Result<Route, RouteError> {
    if path.contains(['?', '#']) {
        return Err(RouteError { part: "query" });
    }
    let rest = path
        .strip_prefix(PREFIX)
        .ok_or(RouteError { part: "prefix" })?;
    let mut parts = rest.split('/');
    let worker = parts.next().ok_or(RouteError { part: "workerId" })?;
    if parts.next() != Some("sessions") {
        return Err(RouteError { part: "template" });
    }
    let session = parts.next().ok_or(RouteError { part: "sessionId" })?;
    let operation = parts
        .next()
        .and_then(operation_of_segment)
        .ok_or(RouteError { part: "operation" })?;
    if parts.next().is_some() {
        return Err(RouteError { part: "template" });
    }
    Ok(Route {
        worker_id: WorkerId::new(worker).map_err(|_| RouteError { part: "workerId" })?,
        session_id: SessionId::new(session).map_err(|_| RouteError { part: "sessionId" })?,
        operation,
    })
}

/// How the Worker client sends a body to an operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientBody {
    /// `application/json`, exact `content-length`.
    Json,
    /// `application/vnd.qinglong.worker-artifact`, framed stream.
    ArtifactStream,
    /// The Worker never calls this operation.
    NotCalled,
}

/// How the Worker client may call `operation`: JSON POST, artifact stream, or not at all.
#[must_use]
pub const fn client_body(operation: Operation) -> ClientBody {
    match operation {
        Operation::Artifacts => ClientBody::ArtifactStream,
        Operation::Attestations => ClientBody::NotCalled,
        Operation::Completion
        | Operation::Heartbeat
        | Operation::LeaseControl
        | Operation::Offers
        | Operation::Register
        | Operation::Running
        | Operation::Secrets
        | Operation::StartFailure
        | Operation::Starting
        | Operation::Transition => ClientBody::Json,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct HeaderWire {
    schema: String,
    worker_generation: u64,
    project_id: String,
    run_id: String,
    attempt_id: String,
    offer_id: String,
    lease_generation: u64,
    lease_token: LeaseToken,
    expected_lease_version: u64,
    log_artifact_id: String,
    byte_length: u64,
    #[serde(deserialize_with = "crate::control_plane::requests::nullable")]
    truncated: Option<bool>,
}

fn field(path: &'static str, rule: &'static str) -> WireError {
    WireError::Field { path, rule }
}

fn ensure(ok: bool, path: &'static str, rule: &'static str) -> Result<(), WireError> {
    if ok { Ok(()) } else { Err(field(path, rule)) }
}

fn id<T>(
    result: Result<T, ql_worker_core::error::IdError>,
    path: &'static str,
) -> Result<T, WireError> {
    result.map_err(|e| field(path, e.rule))
}

/// Parses an artifact frame preamble as the server does: `bytes` starts with the 4-byte length;
/// returns the header and the offset at which content starts. `content_length`, when known, must
/// equal `4 + N + byteLength`.
///
/// # Errors
/// [`WireError`] for a bad length prefix, header shape or bound.
pub fn parse_artifact_preamble(
    bytes: &[u8],
    content_length: Option<u64>,
) -> Result<(ArtifactUpload, usize), WireError> {
    let prefix: [u8; 4] = bytes
        .get(..4)
        .and_then(|p| p.try_into().ok())
        .ok_or(field("frame", "a 4-byte big-endian header length"))?;
    let n = u32::from_be_bytes(prefix) as usize;
    ensure(
        (artifact::MIN_HEADER_BYTES..=artifact::MAX_HEADER_BYTES).contains(&n),
        "frame",
        "a header length of 2..=4096 bytes",
    )?;
    let header = bytes
        .get(4..4 + n)
        .ok_or(field("frame", "the whole header"))?;
    let wire: HeaderWire = parse_json("artifact header", header, artifact::MAX_HEADER_BYTES)?;
    ensure(wire.schema == artifact::SCHEMA, "schema", artifact::SCHEMA)?;
    ensure(
        wire.byte_length <= artifact::MAX_ARTIFACT_BYTES,
        "byteLength",
        "0..=64 MiB",
    )?;
    if let Some(total) = content_length {
        ensure(
            total == 4 + n as u64 + wire.byte_length,
            "content-length",
            "4 + header length + byteLength",
        )?;
    }
    let upload = ArtifactUpload {
        fence: Fence {
            worker_generation: id(
                WorkerGeneration::new(wire.worker_generation),
                "workerGeneration",
            )?,
            project_id: id(ProjectId::new(wire.project_id), "projectId")?,
            run_id: id(RunId::new(wire.run_id), "runId")?,
            attempt_id: id(AttemptId::new(wire.attempt_id), "attemptId")?,
            offer_id: id(OfferId::new(wire.offer_id), "offerId")?,
            lease_generation: id(
                LeaseGeneration::new(wire.lease_generation),
                "leaseGeneration",
            )?,
            lease_token: wire.lease_token,
            expected_lease_version: id(
                LeaseVersion::new(wire.expected_lease_version),
                "expectedLeaseVersion",
            )?,
        },
        log_artifact_id: id(LogArtifactId::new(wire.log_artifact_id), "logArtifactId")?,
        byte_length: wire.byte_length,
        truncated: wire.truncated,
    };
    Ok((upload, 4 + n))
}

/// The finished body of a response writer.
fn finish(w: JsonWriter) -> Vec<u8> {
    // INVARIANT: every writer here is given twice (or exactly) its parser's cap, which a response
    // built from parsed values never exceeds.
    w.finish()
        .expect("a response within its writer's cap")
        .to_vec()
}
