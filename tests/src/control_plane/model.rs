//! The reference control plane as a pure, deterministic model: no sockets, no threads, no clock
//! and no randomness of its own. One request in, one response out:
//!
//! ```text
//! ControlPlane::handle(now, &CpRequest) -> CpResponse              (whole body in memory)
//! ControlPlane::handle_stream(now, &CpHead, &mut dyn Read) -> CpResponse   (body streamed)
//! ```
//!
//! `handle_stream` is [`ControlPlane::begin_stream`] (admission, and a JSON request's whole
//! handling) then, for an artifact upload, [`ArtifactTicket::stream_content`] (no model needed)
//! and [`ControlPlane::finish_artifact`] (store and log): a server holds the model's lock only
//! for the first and last, never while an upload's content streams.
//!
//! Every request goes through the reference's ingress order (§2.1): route match (404) →
//! authenticate `Worker ql3w_…` and bind the credential's Worker to the path (401, before any
//! body byte is read) → audit → media type and size (415, 413) → read the body → exact shape
//! (400) → the endpoint's server semantics (409 fences, 200 answers). Time only moves forward: an
//! older `now` than the last one seen is clamped.
//!
//! The test API ([`ControlPlane::enqueue_run`], [`ControlPlane::cancel_run`],
//! [`ControlPlane::set_secret`], [`ControlPlane::inject_service_fault`], …) is the control plane's
//! other side; the inspection API ([`ControlPlane::state`], [`ControlPlane::audit`],
//! [`ControlPlane::request_log`]) shows everything. Transport faults (dropped connections, slow or
//! garbage responses) are not the model's business: see [`super::server`].

mod activation;
mod artifacts;
mod attestation;
mod completion;
mod lease_control;
mod offers;
mod secrets;
mod session;

pub use activation::START_FAILED_ERROR_CODE;

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::io::{self, Read};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use ql_worker_core::ids::{
    AttemptId, LeaseVersion, ProjectId, RunId, SessionId, Sha256Digest, WorkerGeneration, WorkerId,
};
use ql_worker_core::revision::{ExecutionRevision, SecretRef};
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::activation::{AttemptStatus, RunStatus};
use ql_worker_core::wire::artifact::CONTENT_TYPE as ARTIFACT_CONTENT_TYPE;
use ql_worker_core::wire::auth::WorkerCredential;
use ql_worker_core::wire::error::ErrorCode;
use ql_worker_core::wire::lease_control::StopReason;
use ql_worker_core::wire::route::Operation;
use ql_worker_core::wire::session::SessionStatus;

use super::requests::{ExecFence, Reject};
use super::state::{
    ArtifactKey, CancelIntent, CpState, LeaseRecord, LeaseState, RunEvent, RunEventKind, RunRecord,
    SessionRecord, StoredArtifact,
};
use crate::server_wire::{ClientBody, Route, client_body, error_body, parse_route};

/// Domain separator of the credential HMAC (reference `workerCredentialAuthenticator.ts`).
pub const CREDENTIAL_HMAC_DOMAIN: &[u8] = b"qinglong-worker-credential-v1\0";

/// The media type of every answer.
pub const JSON_CONTENT_TYPE: &str = "application/json; charset=utf-8";

/// Tunables of the model. `Default` is the reference's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpConfig {
    /// Run lease duration at claim and renewal (reference 30 000 ms).
    pub run_lease_ms: u64,
    /// Largest JSON request body (reference server default 1 MiB); above ⇒ 413.
    pub max_json_body_bytes: u64,
    /// How far a completion's `finishedAtMs` may be ahead of server time (5 min).
    pub completion_clock_skew_ms: u64,
    /// Offer scan: candidates per page (8).
    pub offer_page_size: usize,
    /// Offer scan: pages per Pull (2).
    pub offer_max_pages: usize,
    /// Offer scan: claims per Pull (8).
    pub offer_max_claims: u64,
    /// Content bytes kept per stored artifact for inspection (the digest covers all of them).
    pub artifact_head_bytes: usize,
    /// Entries kept in the request log (oldest dropped first).
    pub request_log_max: usize,
    /// The 32-byte HMAC key of the credential check.
    pub credential_pepper: [u8; 32],
}

impl Default for CpConfig {
    fn default() -> Self {
        Self {
            run_lease_ms: 30_000,
            max_json_body_bytes: 1024 * 1024,
            completion_clock_skew_ms: 5 * 60_000,
            offer_page_size: 8,
            offer_max_pages: 2,
            offer_max_claims: 8,
            artifact_head_bytes: 64 * 1024,
            request_log_max: 4096,
            credential_pepper: [0x51; 32],
        }
    }
}

/// One request with its whole body.
#[derive(Clone, PartialEq, Eq)]
pub struct CpRequest {
    /// Request target (path and any query).
    pub path: String,
    /// The `authorization` header, if sent.
    pub authorization: Option<String>,
    /// The `content-type` header, if sent.
    pub content_type: Option<String>,
    /// The body.
    pub body: Vec<u8>,
}

impl fmt::Debug for CpRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpRequest")
            .field("path", &self.path)
            .field("content_type", &self.content_type)
            .field("body_len", &self.body.len())
            .finish_non_exhaustive()
    }
}

impl CpRequest {
    /// A JSON POST to `path` with `authorization`.
    pub fn json(path: impl Into<String>, authorization: &str, body: impl Into<Vec<u8>>) -> Self {
        Self {
            path: path.into(),
            authorization: Some(authorization.to_owned()),
            content_type: Some("application/json".to_owned()),
            body: body.into(),
        }
    }

    /// An artifact upload (`application/vnd.qinglong.worker-artifact`) with the whole framed body.
    pub fn artifact(
        path: impl Into<String>,
        authorization: &str,
        body: impl Into<Vec<u8>>,
    ) -> Self {
        Self {
            path: path.into(),
            authorization: Some(authorization.to_owned()),
            content_type: Some(ARTIFACT_CONTENT_TYPE.to_owned()),
            body: body.into(),
        }
    }

    /// The request head.
    pub fn head(&self) -> CpHead {
        CpHead {
            path: self.path.clone(),
            authorization: self.authorization.clone(),
            content_type: self.content_type.clone(),
            content_length: self.body.len() as u64,
        }
    }
}

/// A request head: everything but the body, which [`ControlPlane::handle_stream`] reads.
#[derive(Clone, PartialEq, Eq)]
pub struct CpHead {
    /// Request target.
    pub path: String,
    /// The `authorization` header.
    pub authorization: Option<String>,
    /// The `content-type` header.
    pub content_type: Option<String>,
    /// The declared `content-length`.
    pub content_length: u64,
}

impl fmt::Debug for CpHead {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CpHead")
            .field("path", &self.path)
            .field("content_type", &self.content_type)
            .field("content_length", &self.content_length)
            .finish_non_exhaustive()
    }
}

/// One response.
#[derive(Clone, PartialEq, Eq)]
pub struct CpResponse {
    /// HTTP status.
    pub status: u16,
    /// JSON body (an answer, or `{"code":…}`).
    pub body: Vec<u8>,
    /// Always [`JSON_CONTENT_TYPE`].
    pub content_type: &'static str,
}

impl fmt::Debug for CpResponse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Bodies may carry Secret values: show only the status and length.
        f.debug_struct("CpResponse")
            .field("status", &self.status)
            .field("code", &self.code())
            .field("body_len", &self.body.len())
            .finish()
    }
}

impl CpResponse {
    /// 200 with a JSON body.
    pub fn ok(body: Vec<u8>) -> Self {
        Self::with_status(200, body)
    }

    /// `status` with a JSON body.
    pub fn with_status(status: u16, body: Vec<u8>) -> Self {
        Self {
            status,
            body,
            content_type: JSON_CONTENT_TYPE,
        }
    }

    /// The error answer for `code`: its status and `{"code":"…"}`.
    pub fn error(code: ErrorCode) -> Self {
        Self::with_status(code.http_status(), error_body(code))
    }

    /// The error code of an error answer.
    pub fn code(&self) -> Option<ErrorCode> {
        if self.status == 200 || self.status == 201 {
            return None;
        }
        ql_worker_core::wire::error::parse_error_body(&self.body).ok()
    }
}

/// A failure inside the control plane's own services, injected by a test. Each is consumed by
/// the next request whose operation matches (or by any request, if queued without one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServiceFault {
    /// The authenticator throws: 503 `worker_authentication_unavailable`, body never read.
    AuthenticationUnavailable,
    /// The security audit write fails: 503 `worker_audit_unavailable`, body never read.
    AuditUnavailable,
    /// Storage is down: 503 `worker_ingress_unavailable` after the body was parsed, before any
    /// state change.
    StorageUnavailable,
    /// `offers` only: the claim commits, but the offer projection cannot be built: 503
    /// `worker_ingress_unavailable` (the Worker's retry with the same claim gets
    /// `lease_recovery`).
    MalformedOfferProjection,
    /// `secrets` only: the secret service answers for another Run: 503
    /// `worker_ingress_unavailable`, no value leaves.
    SecretAuthorityDrift,
}

/// Audit outcomes (reference `security-audit`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AuditOutcome {
    /// Authenticated and bound to the path's Worker.
    Allowed,
    /// No, invalid, unknown or inactive credential, or a credential of another Worker.
    AuthenticationRejected,
    /// The authenticator failed.
    AuthenticationUnavailable,
}

/// One security audit record, written before any body byte is read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuditRecord {
    /// Server sequence.
    pub seq: u64,
    /// Server time.
    pub at: UnixMillis,
    /// The route's operation.
    pub operation: Operation,
    /// The authenticated Worker (`Allowed` only).
    pub worker_id: Option<WorkerId>,
    /// The credential id presented, if the header parsed.
    pub credential_id: Option<String>,
    /// Outcome.
    pub outcome: AuditOutcome,
}

/// What the model did with one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestLogEntry {
    /// Server sequence.
    pub seq: u64,
    /// Server time.
    pub at: UnixMillis,
    /// The request target.
    pub path: String,
    /// The operation, if the route matched.
    pub operation: Option<Operation>,
    /// Status answered.
    pub status: u16,
    /// Error code answered, if any.
    pub code: Option<ErrorCode>,
    /// Why (for refusals) or what (for answers), never a value from the body.
    pub reason: &'static str,
    /// Body bytes the model read (0 for anything refused before the body).
    pub body_bytes_read: u64,
}

/// Why a test-API call was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CpError {
    /// A Run with this id already exists.
    DuplicateRun(RunId),
    /// No such Run.
    UnknownRun(RunId),
    /// The revision does not validate (normalization or digest).
    InvalidRevision(String),
    /// The secret reference cannot be built.
    InvalidSecret,
}

impl fmt::Display for CpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::DuplicateRun(id) => write!(f, "run {id} already exists"),
            Self::UnknownRun(id) => write!(f, "no run {id}"),
            Self::InvalidRevision(e) => write!(f, "invalid execution revision: {e}"),
            Self::InvalidSecret => f.write_str("invalid secret reference parts"),
        }
    }
}

impl std::error::Error for CpError {}

/// A Run to enqueue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunSpec {
    /// Run id.
    pub run_id: RunId,
    /// Its (single) Attempt id.
    pub attempt_id: AttemptId,
    /// The sealed execution revision (see [`super::revisions`]).
    pub revision: ExecutionRevision,
    /// Priority; higher is offered first.
    pub priority: i64,
}

impl RunSpec {
    /// `run-<n>` / `attempt-<n>` with priority 0.
    pub fn numbered(n: u32, revision: ExecutionRevision) -> Self {
        Self {
            // INVARIANT: `run-<decimal>` and `attempt-<decimal>` satisfy the id rules.
            run_id: RunId::new(format!("run-{n}")).unwrap_or_else(|_| unreachable!("run id")),
            attempt_id: AttemptId::new(format!("attempt-{n}"))
                .unwrap_or_else(|_| unreachable!("attempt id")),
            revision,
            priority: 0,
        }
    }
}

/// What [`ControlPlane::cancel_run`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The Run was still queued: cancelled at once, never offered.
    CancelledInQueue,
    /// A cancel intent was written; the next lease control answers `stop_requested` and the
    /// terminal status follows it.
    StopRequested,
    /// A cancel intent already existed; unchanged.
    AlreadyRequested,
    /// The Attempt is already terminal; unchanged.
    AlreadyTerminal,
}

#[derive(Clone)]
struct CredentialRecord {
    worker_id: WorkerId,
    digest: [u8; 32],
    active: bool,
}

/// The reference control plane, in memory. See the module documentation. `Clone` copies
/// everything (a simulation can fork it).
#[derive(Clone)]
pub struct ControlPlane {
    config: CpConfig,
    state: CpState,
    credentials: BTreeMap<String, CredentialRecord>,
    secrets: BTreeMap<String, String>,
    audit: Vec<AuditRecord>,
    log: VecDeque<RequestLogEntry>,
    faults: VecDeque<(Option<Operation>, ServiceFault)>,
    last_now: UnixMillis,
    next_seq: u64,
}

impl fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ControlPlane")
            .field("sessions", &self.state.sessions.len())
            .field("runs", &self.state.runs.len())
            .field("artifacts", &self.state.artifacts.len())
            .field("credentials", &self.credentials.len())
            .field("secrets", &self.secrets.len())
            .finish_non_exhaustive()
    }
}

/// The context of one authenticated request.
pub(crate) struct Ctx<'a> {
    pub(crate) now: UnixMillis,
    pub(crate) route: &'a Route,
    pub(crate) fault: Option<ServiceFault>,
}

impl Ctx<'_> {
    fn worker_id(&self) -> &WorkerId {
        &self.route.worker_id
    }

    fn session_id(&self) -> &SessionId {
        &self.route.session_id
    }

    /// `StorageUnavailable` ⇒ 503 before any state change.
    fn storage(&self) -> Result<(), Reject> {
        if self.fault == Some(ServiceFault::StorageUnavailable) {
            return Err(Reject::new(
                ErrorCode::WorkerIngressUnavailable,
                "storage unavailable",
            ));
        }
        Ok(())
    }
}

/// Outcome of one endpoint handler: an answer and a short description for the log.
pub(crate) type Handled = Result<(CpResponse, &'static str), Reject>;

/// What dispatching an admitted request produced.
enum Step {
    /// The answer and a short description for the log.
    Answered(CpResponse, &'static str),
    /// An artifact upload whose frame was read and fence authorized; its content is unread.
    Upload(artifacts::Authorized),
}

/// An artifact upload admitted by [`ControlPlane::begin_stream`]: its frame was read and its
/// fence authorized; its content is still to stream ([`ArtifactTicket::stream_content`]) and to
/// be stored ([`ControlPlane::finish_artifact`]).
#[must_use = "an admitted upload is logged only by ControlPlane::finish_artifact"]
pub struct ArtifactTicket {
    head: CpHead,
    operation: Option<Operation>,
    authorized: artifacts::Authorized,
    keep: usize,
    /// Body bytes read while admitting (prefix and header).
    read: u64,
    /// Body bytes left by `content-length`.
    remaining: u64,
}

impl fmt::Debug for ArtifactTicket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArtifactTicket")
            .field("path", &self.head.path)
            .field("byte_length", &self.authorized.byte_length())
            .field("read", &self.read)
            .field("remaining", &self.remaining)
            .finish_non_exhaustive()
    }
}

impl ArtifactTicket {
    /// Reads the upload's content from `body` (the rest of the same body, at most what
    /// `content-length` leaves), hashing it and keeping its first bytes. Touches no
    /// `ControlPlane`: a server streams without holding the model.
    pub fn stream_content(&self, body: &mut dyn Read) -> StreamedContent {
        let mut counted = CountingReader {
            inner: body,
            remaining: self.remaining,
            read: 0,
        };
        let content =
            artifacts::stream_content(&mut counted, self.authorized.byte_length(), self.keep);
        StreamedContent {
            content,
            read: counted.read,
        }
    }
}

/// The result of [`ArtifactTicket::stream_content`], for [`ControlPlane::finish_artifact`].
#[must_use = "pass it to ControlPlane::finish_artifact"]
pub struct StreamedContent {
    content: Result<artifacts::Content, Reject>,
    read: u64,
}

impl fmt::Debug for StreamedContent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamedContent")
            .field("complete", &self.content.is_ok())
            .field("read", &self.read)
            .finish_non_exhaustive()
    }
}

impl ControlPlane {
    /// An empty control plane.
    pub fn new(config: CpConfig) -> Self {
        Self {
            config,
            state: CpState::default(),
            credentials: BTreeMap::new(),
            secrets: BTreeMap::new(),
            audit: Vec::new(),
            log: VecDeque::new(),
            faults: VecDeque::new(),
            last_now: UnixMillis::ZERO,
            next_seq: 1,
        }
    }

    // -----------------------------------------------------------------------------------------
    // Test API: the control plane's other side.
    // -----------------------------------------------------------------------------------------

    /// Registers `credential` for `worker_id` (stores only its HMAC digest). Replaces an
    /// existing credential of the same id.
    pub fn add_credential(&mut self, credential: &WorkerCredential, worker_id: WorkerId) {
        let digest = self.credential_digest(credential);
        self.credentials.insert(
            credential.credential_id().to_owned(),
            CredentialRecord {
                worker_id,
                digest,
                active: true,
            },
        );
    }

    /// Deactivates a credential; later requests with it get 401. Returns whether it existed.
    pub fn revoke_credential(&mut self, credential_id: &str) -> bool {
        match self.credentials.get_mut(credential_id) {
            Some(record) => {
                record.active = false;
                true
            }
            None => false,
        }
    }

    /// Stores the value of secret `name` of `project_id` (unversioned) and returns its reference.
    pub fn set_secret(
        &mut self,
        project_id: &ProjectId,
        name: &str,
        value: &str,
    ) -> Result<SecretRef, CpError> {
        let text = SecretRef::create(project_id.as_str(), name, None)
            .map_err(|_| CpError::InvalidSecret)?;
        let reference = SecretRef::new(&text).map_err(|_| CpError::InvalidSecret)?;
        self.set_secret_value(&reference, value);
        Ok(reference)
    }

    /// Stores an environment bundle (`qinglong/environment-bundle@v1`, entries in the given
    /// order) behind a new versioned reference of `project_id`, and returns the reference (for
    /// [`super::RevisionBuilder::environment_bundle`]). The bundle is served as given: the
    /// Worker checks its rules.
    pub fn set_environment_bundle(
        &mut self,
        project_id: &ProjectId,
        name: &str,
        version: u64,
        entries: &[(&str, &str)],
    ) -> Result<SecretRef, CpError> {
        let text = SecretRef::create(project_id.as_str(), name, Some(version))
            .map_err(|_| CpError::InvalidSecret)?;
        let reference = SecretRef::new(&text).map_err(|_| CpError::InvalidSecret)?;
        let entries: Vec<serde_json::Value> = entries
            .iter()
            .map(|(name, value)| serde_json::json!({"name": name, "value": value}))
            .collect();
        let bundle = serde_json::json!({
            "schema": ql_worker_core::wire::secrets::BUNDLE_SCHEMA,
            "entries": entries,
        });
        self.set_secret_value(&reference, &bundle.to_string());
        Ok(reference)
    }

    /// Stores the value behind any reference (versioned ones and environment bundles too).
    pub fn set_secret_value(&mut self, reference: &SecretRef, value: &str) {
        self.secrets
            .insert(reference.as_str().to_owned(), value.to_owned());
    }

    /// Enqueues a Run with one Attempt; it is offered in priority order, then FIFO.
    pub fn enqueue_run(&mut self, now: UnixMillis, spec: RunSpec) -> Result<RunId, CpError> {
        let now = self.clamp(now);
        if self.state.runs.contains_key(&spec.run_id) {
            return Err(CpError::DuplicateRun(spec.run_id));
        }
        spec.revision
            .validate()
            .map_err(|e| CpError::InvalidRevision(e.to_string()))?;
        let seq = self.seq();
        let run = RunRecord {
            run_id: spec.run_id.clone(),
            attempt_id: spec.attempt_id,
            project_id: spec.revision.project_id.clone(),
            task_id: spec.revision.task_id.clone(),
            revision: spec.revision,
            priority: spec.priority,
            queued_at: now,
            attempt_created_at: now,
            attempt_number: 1,
            enqueue_seq: seq,
            run_status: RunStatus::Queued,
            attempt_status: None,
            lease: None,
            deadline_at: None,
            started_at: None,
            finished_at: None,
            executor_handle: None,
            log_artifact_id: None,
            callback_sequence: 0,
            callback_token_digest: None,
            error_code: None,
            cancel_intent: None,
            completion: None,
            events: vec![RunEvent {
                seq,
                at: now,
                kind: RunEventKind::Queued,
            }],
        };
        self.state.runs.insert(spec.run_id.clone(), run);
        Ok(spec.run_id)
    }

    /// A user cancels a Run (reason `user`); see [`Self::request_stop`].
    pub fn cancel_run(
        &mut self,
        now: UnixMillis,
        run_id: &RunId,
    ) -> Result<CancelOutcome, CpError> {
        self.request_stop(now, run_id, StopReason::User)
    }

    /// Writes a durable cancel intent with `reason`. A queued Run is cancelled at once; a live
    /// Attempt gets `stop_requested` at its next lease control, and its terminal status follows
    /// the intent (`timed_out` for `timeout`, `cancelled` otherwise).
    pub fn request_stop(
        &mut self,
        now: UnixMillis,
        run_id: &RunId,
        reason: StopReason,
    ) -> Result<CancelOutcome, CpError> {
        let now = self.clamp(now);
        let seq = self.next_seq;
        let run = self
            .state
            .runs
            .get_mut(run_id)
            .ok_or_else(|| CpError::UnknownRun(run_id.clone()))?;
        let outcome = if run.attempt_status.is_none() && run.run_status == RunStatus::Queued {
            run.run_status = RunStatus::Cancelled;
            run.finished_at = Some(now);
            run.cancel_intent = Some(CancelIntent {
                reason,
                requested_at: now,
            });
            push_event(run, seq, now, RunEventKind::CancelRequested { reason });
            push_event(
                run,
                seq + 1,
                now,
                RunEventKind::RunFinished {
                    status: RunStatus::Cancelled,
                },
            );
            CancelOutcome::CancelledInQueue
        } else if run.is_terminal() {
            CancelOutcome::AlreadyTerminal
        } else if run.cancel_intent.is_some() {
            CancelOutcome::AlreadyRequested
        } else {
            run.cancel_intent = Some(CancelIntent {
                reason,
                requested_at: now,
            });
            push_event(run, seq, now, RunEventKind::CancelRequested { reason });
            CancelOutcome::StopRequested
        };
        self.next_seq += 2;
        Ok(outcome)
    }

    /// Closes every live lease that expired at or before `now`: lease `expired`, Attempt and Run
    /// `lost`. The model has no timer; a test or simulation calls this when it wants the reaper
    /// to have run. Returns the Runs reaped, in id order.
    pub fn reap_expired_leases(&mut self, now: UnixMillis) -> Vec<RunId> {
        let now = self.clamp(now);
        let mut reaped = Vec::new();
        for run in self.state.runs.values_mut() {
            let expired = run.is_live()
                && run
                    .lease
                    .as_ref()
                    .is_some_and(|l| l.state == LeaseState::Leased && l.expires_at <= now);
            if !expired {
                continue;
            }
            if let Some(lease) = run.lease.as_mut() {
                lease.state = LeaseState::Expired;
                lease.updated_at = now;
            }
            run.attempt_status = Some(AttemptStatus::Lost);
            run.run_status = RunStatus::Lost;
            run.finished_at = Some(now);
            run.error_code = Some("LEASE_EXPIRED".to_owned());
            let seq = self.next_seq;
            self.next_seq += 3;
            push_event(run, seq, now, RunEventKind::LeaseExpired);
            push_event(
                run,
                seq + 1,
                now,
                RunEventKind::AttemptFinished {
                    status: AttemptStatus::Lost,
                },
            );
            push_event(
                run,
                seq + 2,
                now,
                RunEventKind::RunFinished {
                    status: RunStatus::Lost,
                },
            );
            reaped.push(run.run_id.clone());
        }
        reaped
    }

    /// Queues a service fault for the next request of `operation` (any operation if `None`).
    pub fn inject_service_fault(&mut self, operation: Option<Operation>, fault: ServiceFault) {
        self.faults.push_back((operation, fault));
    }

    // -----------------------------------------------------------------------------------------
    // Inspection.
    // -----------------------------------------------------------------------------------------

    /// The configuration.
    pub fn config(&self) -> &CpConfig {
        &self.config
    }

    /// All durable state (clone it to compare before and after a request).
    pub fn state(&self) -> &CpState {
        &self.state
    }

    /// One Run.
    pub fn run(&self, run_id: &RunId) -> Option<&RunRecord> {
        self.state.runs.get(run_id)
    }

    /// A Worker's current Session.
    pub fn session(&self, worker_id: &WorkerId) -> Option<&SessionRecord> {
        self.state.sessions.get(worker_id)
    }

    /// The artifacts stored for a Run, in key order.
    pub fn artifacts_of(&self, run_id: &RunId) -> Vec<(&ArtifactKey, &StoredArtifact)> {
        self.state
            .artifacts
            .iter()
            .filter(|(k, _)| &k.run_id == run_id)
            .collect()
    }

    /// The security audit, in order.
    pub fn audit(&self) -> &[AuditRecord] {
        &self.audit
    }

    /// The most recent requests, in order.
    pub fn request_log(&self) -> impl Iterator<Item = &RequestLogEntry> {
        self.log.iter()
    }

    /// The last request handled.
    pub fn last_request(&self) -> Option<&RequestLogEntry> {
        self.log.back()
    }

    /// The latest `now` seen.
    pub fn now(&self) -> UnixMillis {
        self.last_now
    }

    // -----------------------------------------------------------------------------------------
    // Requests.
    // -----------------------------------------------------------------------------------------

    /// Handles one request whose body is in memory.
    pub fn handle(&mut self, now: UnixMillis, request: &CpRequest) -> CpResponse {
        let mut body: &[u8] = &request.body;
        self.handle_stream(now, &request.head(), &mut body)
    }

    /// Handles one request, reading at most `head.content_length` body bytes from `body`, and
    /// none at all unless the request is authenticated and audited. An artifact's content is
    /// hashed while it streams and never buffered whole.
    ///
    /// The same as [`Self::begin_stream`], then, for an admitted upload,
    /// [`ArtifactTicket::stream_content`] and [`Self::finish_artifact`] in a row.
    pub fn handle_stream(
        &mut self,
        now: UnixMillis,
        head: &CpHead,
        body: &mut dyn Read,
    ) -> CpResponse {
        match self.begin_stream(now, head, body) {
            Err(response) => response,
            Ok(ticket) => {
                let streamed = ticket.stream_content(body);
                self.finish_artifact(now, ticket, streamed)
            }
        }
    }

    /// First phase of a request: route, fault injection, authentication and audit, media type
    /// and size. A JSON request (or any refusal) is handled in full here: `Err` is its answer,
    /// already logged. An artifact upload stops after its prefix and header were read and its
    /// fence authorized: `Ok` is the ticket whose content the caller streams with
    /// [`ArtifactTicket::stream_content`], which needs no `ControlPlane` (so a server can release
    /// the model meanwhile), and hands to [`Self::finish_artifact`], which stores and logs.
    pub fn begin_stream(
        &mut self,
        now: UnixMillis,
        head: &CpHead,
        body: &mut dyn Read,
    ) -> Result<ArtifactTicket, CpResponse> {
        let now = self.clamp(now);
        let mut counted = CountingReader {
            inner: body,
            remaining: head.content_length,
            read: 0,
        };
        let (operation, outcome) = self.admit_and_dispatch(now, head, &mut counted);
        let (response, reason) = match outcome {
            Ok(Step::Upload(authorized)) => {
                return Ok(ArtifactTicket {
                    head: head.clone(),
                    operation,
                    authorized,
                    keep: self.config.artifact_head_bytes,
                    read: counted.read,
                    remaining: counted.remaining,
                });
            }
            Ok(Step::Answered(response, reason)) => (response, reason),
            Err(reject) => (CpResponse::error(reject.code), reject.reason),
        };
        self.log_request(now, head, operation, &response, reason, counted.read);
        Err(response)
    }

    /// Last phase of an artifact upload begun with [`Self::begin_stream`]: stores the streamed
    /// content put-if-absent (or refuses it) and logs the request once, with every body byte
    /// read in both phases. The fence is not checked again (the reference authorizes it from the
    /// header): a lease renewal committed while the content streamed does not refuse the upload.
    pub fn finish_artifact(
        &mut self,
        now: UnixMillis,
        ticket: ArtifactTicket,
        streamed: StreamedContent,
    ) -> CpResponse {
        let now = self.clamp(now);
        let outcome = streamed
            .content
            .and_then(|content| self.store_artifact(now, &ticket.authorized, content));
        let (response, reason) = match outcome {
            Ok(pair) => pair,
            Err(reject) => (CpResponse::error(reject.code), reject.reason),
        };
        let read = ticket.read + streamed.read;
        self.log_request(now, &ticket.head, ticket.operation, &response, reason, read);
        response
    }

    fn admit_and_dispatch(
        &mut self,
        now: UnixMillis,
        head: &CpHead,
        body: &mut CountingReader<'_>,
    ) -> (Option<Operation>, Result<Step, Reject>) {
        let route = match parse_route(&head.path) {
            Ok(route) => route,
            Err(_) => {
                let reject = Reject::new(ErrorCode::WorkerRouteNotFound, "route");
                return (None, Err(reject));
            }
        };
        let operation = route.operation;
        let fault = self.take_fault(operation);
        let ctx = Ctx {
            now,
            route: &route,
            fault,
        };
        if let Err(reject) = self.authenticate_and_audit(&ctx, head) {
            return (Some(operation), Err(reject));
        }
        (Some(operation), self.dispatch(&ctx, head, body))
    }

    fn dispatch(
        &mut self,
        ctx: &Ctx<'_>,
        head: &CpHead,
        body: &mut CountingReader<'_>,
    ) -> Result<Step, Reject> {
        let operation = ctx.route.operation;
        let media = media_type(head.content_type.as_deref());
        match client_body(operation) {
            ClientBody::ArtifactStream => {
                if media.as_deref() != Some(ARTIFACT_CONTENT_TYPE) {
                    return Err(Reject::new(
                        ErrorCode::UnsupportedContentType,
                        "artifact media type",
                    ));
                }
                self.admit_artifact(ctx, head.content_length, body)
                    .map(Step::Upload)
            }
            ClientBody::Json | ClientBody::NotCalled => {
                if media.as_deref() != Some("application/json") {
                    return Err(Reject::new(
                        ErrorCode::UnsupportedContentType,
                        "JSON media type",
                    ));
                }
                if head.content_length > self.config.max_json_body_bytes {
                    return Err(Reject::new(ErrorCode::RequestTooLarge, "JSON body cap"));
                }
                let mut bytes = Vec::new();
                let complete = body
                    .read_to_end(&mut bytes)
                    .is_ok_and(|n| n as u64 == head.content_length);
                if !complete {
                    return Err(Reject::new(
                        ErrorCode::ContentLengthMismatch,
                        "body shorter than content-length",
                    ));
                }
                let (response, reason) = self.dispatch_json(ctx, &bytes)?;
                Ok(Step::Answered(response, reason))
            }
        }
    }

    fn dispatch_json(&mut self, ctx: &Ctx<'_>, body: &[u8]) -> Handled {
        match ctx.route.operation {
            Operation::Register => self.register(ctx, body),
            Operation::Heartbeat => self.heartbeat(ctx, body),
            Operation::Transition => self.transition(ctx, body),
            Operation::Offers => self.offers(ctx, body),
            Operation::Starting => self.starting(ctx, body),
            Operation::Running => self.running(ctx, body),
            Operation::StartFailure => self.start_failure(ctx, body),
            Operation::Secrets => self.secrets(ctx, body),
            Operation::Completion => self.completion(ctx, body),
            Operation::LeaseControl => self.lease_control(ctx, body),
            Operation::Attestations => self.attestations(ctx, body),
            Operation::Artifacts => Err(Reject::new(
                ErrorCode::UnsupportedContentType,
                "artifacts are streamed",
            )),
        }
    }

    /// Authenticates the header and binds it to the path's Worker, then audits; reads nothing.
    fn authenticate_and_audit(&mut self, ctx: &Ctx<'_>, head: &CpHead) -> Result<(), Reject> {
        let operation = ctx.route.operation;
        let parsed = head
            .authorization
            .as_deref()
            .and_then(|h| WorkerCredential::parse_header(h).ok());
        let credential_id = parsed.as_ref().map(|c| c.credential_id().to_owned());
        if ctx.fault == Some(ServiceFault::AuthenticationUnavailable) {
            self.record_audit(
                ctx.now,
                operation,
                None,
                credential_id,
                AuditOutcome::AuthenticationUnavailable,
            );
            return Err(Reject::new(
                ErrorCode::WorkerAuthenticationUnavailable,
                "authenticator unavailable",
            ));
        }
        let audit_down = ctx.fault == Some(ServiceFault::AuditUnavailable);
        let principal = parsed.as_ref().and_then(|c| self.principal(c));
        if principal.as_ref() != Some(ctx.worker_id()) {
            if audit_down {
                return Err(Reject::new(
                    ErrorCode::WorkerAuditUnavailable,
                    "audit write",
                ));
            }
            self.record_audit(
                ctx.now,
                operation,
                None,
                credential_id,
                AuditOutcome::AuthenticationRejected,
            );
            return Err(Reject::new(
                ErrorCode::WorkerAuthenticationRequired,
                "credential refused or bound to another Worker",
            ));
        }
        if audit_down {
            return Err(Reject::new(
                ErrorCode::WorkerAuditUnavailable,
                "audit write",
            ));
        }
        self.record_audit(
            ctx.now,
            operation,
            principal,
            credential_id,
            AuditOutcome::Allowed,
        );
        Ok(())
    }

    fn principal(&self, credential: &WorkerCredential) -> Option<WorkerId> {
        let record = self.credentials.get(credential.credential_id())?;
        let digest = self.credential_digest(credential);
        let equal: bool = digest.ct_eq(&record.digest).into();
        (equal && record.active).then(|| record.worker_id.clone())
    }

    fn credential_digest(&self, credential: &WorkerCredential) -> [u8; 32] {
        // The Worker's crate gives the secret out only inside the header value, whose last 43
        // characters are its canonical base64url.
        let header = credential.header_value();
        let secret = Zeroizing::new(
            URL_SAFE_NO_PAD
                .decode(&header[header.len() - 43..])
                .expect("a credential's header value ends with its canonical secret"),
        );
        hmac_sha256(
            &self.config.credential_pepper,
            &[
                CREDENTIAL_HMAC_DOMAIN,
                credential.credential_id().as_bytes(),
                b"\0",
                secret.as_slice(),
            ],
        )
    }

    fn record_audit(
        &mut self,
        now: UnixMillis,
        operation: Operation,
        worker_id: Option<WorkerId>,
        credential_id: Option<String>,
        outcome: AuditOutcome,
    ) {
        let seq = self.seq();
        self.audit.push(AuditRecord {
            seq,
            at: now,
            operation,
            worker_id,
            credential_id,
            outcome,
        });
    }

    fn log_request(
        &mut self,
        now: UnixMillis,
        head: &CpHead,
        operation: Option<Operation>,
        response: &CpResponse,
        reason: &'static str,
        body_bytes_read: u64,
    ) {
        let seq = self.seq();
        if self.log.len() >= self.config.request_log_max.max(1) {
            self.log.pop_front();
        }
        self.log.push_back(RequestLogEntry {
            seq,
            at: now,
            path: head.path.clone(),
            operation,
            status: response.status,
            code: response.code(),
            reason,
            body_bytes_read,
        });
    }

    fn take_fault(&mut self, operation: Operation) -> Option<ServiceFault> {
        let index = self
            .faults
            .iter()
            .position(|(op, _)| op.is_none_or(|op| op == operation))?;
        self.faults.remove(index).map(|(_, fault)| fault)
    }

    fn clamp(&mut self, now: UnixMillis) -> UnixMillis {
        if now > self.last_now {
            self.last_now = now;
        }
        self.last_now
    }

    fn seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    // -----------------------------------------------------------------------------------------
    // Shared fence checks.
    // -----------------------------------------------------------------------------------------

    /// Whether `worker`'s current Session is `session` at `generation` and not offline.
    pub(crate) fn session_current(
        &self,
        worker: &WorkerId,
        session: &SessionId,
        generation: WorkerGeneration,
    ) -> bool {
        self.state.sessions.get(worker).is_some_and(|s| {
            &s.session_id == session
                && s.generation == generation
                && s.status != SessionStatus::Offline
        })
    }

    /// The identity part of every execution fence: the Run and Attempt exist, the lease was
    /// claimed by this Worker and Session with this offer, generation, lease generation and
    /// token, and the Worker's Session is still that one. Versions and expiry are per endpoint.
    pub(crate) fn check_identity(
        &self,
        ctx: &Ctx<'_>,
        fence: &ExecFence,
    ) -> Result<(&RunRecord, &LeaseRecord), &'static str> {
        let run = self.state.runs.get(&fence.run_id).ok_or("missing")?;
        if run.attempt_id != fence.attempt_id {
            return Err("attempt mismatch");
        }
        if fence
            .project_id
            .as_ref()
            .is_some_and(|p| *p != run.project_id)
        {
            return Err("project mismatch");
        }
        let lease = run.lease.as_ref().ok_or("not claimed")?;
        let identity = lease.offer_id == fence.offer_id
            && &lease.worker_id == ctx.worker_id()
            && &lease.session_id == ctx.session_id()
            && lease.worker_generation == fence.worker_generation
            && lease.lease_generation == fence.lease_generation;
        if !identity {
            return Err("authority mismatch");
        }
        if lease.token_digest != fence.lease_token.digest() {
            return Err("lease token mismatch");
        }
        if !self.session_current(ctx.worker_id(), ctx.session_id(), fence.worker_generation) {
            return Err("worker unavailable");
        }
        Ok((run, lease))
    }

    /// The live-lease part: `expectedLeaseVersion` is the lease's version and it has not expired.
    pub(crate) fn check_live_lease(
        now: UnixMillis,
        lease: &LeaseRecord,
        expected: LeaseVersion,
    ) -> Result<(), &'static str> {
        if lease.state != LeaseState::Leased {
            return Err("lease closed");
        }
        if lease.version != expected {
            return Err("version mismatch");
        }
        if lease.expires_at <= now {
            return Err("lease expired");
        }
        Ok(())
    }

    /// Appends an event with the next sequence number.
    pub(crate) fn event(&mut self, run_id: &RunId, now: UnixMillis, kind: RunEventKind) {
        let seq = self.seq();
        if let Some(run) = self.state.runs.get_mut(run_id) {
            push_event(run, seq, now, kind);
        }
    }
}

fn push_event(run: &mut RunRecord, seq: u64, at: UnixMillis, kind: RunEventKind) {
    run.events.push(RunEvent { seq, at, kind });
}

/// The media type before any parameter, lowercased.
fn media_type(value: Option<&str>) -> Option<String> {
    value.map(|v| {
        v.split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_ascii_lowercase()
    })
}

/// The body as a reader bounded by `content-length`, counting what the model consumed.
struct CountingReader<'a> {
    inner: &'a mut dyn Read,
    remaining: u64,
    read: u64,
}

impl Read for CountingReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 || buf.is_empty() {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.remaining -= n as u64;
        self.read += n as u64;
        Ok(n)
    }
}

/// HMAC-SHA-256 (RFC 2104) over the concatenation of `parts`; `key` ≤ 64 bytes.
pub(crate) fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    assert!(
        key.len() <= 64,
        "HMAC keys above the block size are not used here"
    );
    let mut inner_pad = [0x36_u8; 64];
    let mut outer_pad = [0x5c_u8; 64];
    for (i, k) in key.iter().enumerate() {
        inner_pad[i] ^= k;
        outer_pad[i] ^= k;
    }
    let mut inner = Sha256::new();
    inner.update(inner_pad);
    for part in parts {
        inner.update(part);
    }
    let inner_digest = inner.finalize();
    let mut outer = Sha256::new();
    outer.update(outer_pad);
    outer.update(inner_digest);
    outer.finalize().into()
}

/// The lowercase-hex SHA-256 of `bytes`.
pub(crate) fn sha256(bytes: &[u8]) -> Sha256Digest {
    Sha256Digest::from_bytes(Sha256::digest(bytes).into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc_4231_test_case_2() {
        let mac = hmac_sha256(b"Jefe", &[b"what do ya ", b"want for nothing?"]);
        assert_eq!(
            Sha256Digest::from_bytes(mac).to_hex(),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }

    #[test]
    fn media_type_ignores_parameters_and_case() {
        assert_eq!(
            media_type(Some("Application/JSON; charset=utf-8")).as_deref(),
            Some("application/json")
        );
        assert_eq!(media_type(None), None);
    }
}
