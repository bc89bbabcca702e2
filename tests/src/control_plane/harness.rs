//! Worker-side helpers for driving the reference control plane by hand in tests: the Worker's
//! identity and paths, and request bodies built with the core's own builders, so every body is
//! byte for byte what the Worker sends. [`ModelHarness`] drives the pure model with a manual
//! clock; the same bodies go over HTTPS with the real client.

use ql_worker_core::capability::Capability;
use ql_worker_core::ids::{
    CallbackSequence, ExecutorHandle, LeaseToken, OfferId, SessionId, Sha256Digest,
    WorkerGeneration, WorkerId,
};
use ql_worker_core::offer::{Offer, OfferWorker};
use ql_worker_core::revision::Architecture;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::activation::{ActivationRequest, ActivationResponse, RunningAck};
use ql_worker_core::wire::artifact::{ArtifactUpload, derive_log_artifact_id};
use ql_worker_core::wire::auth::WorkerCredential;
use ql_worker_core::wire::completion::{CompletionArtifact, CompletionRequest, CompletionResult};
use ql_worker_core::wire::lease_control::LeaseControlRequest;
use ql_worker_core::wire::offer::{OfferRequest, OfferResponse, admit_offer};
use ql_worker_core::wire::route::{self, Operation};
use ql_worker_core::wire::session::{
    Capabilities, HeartbeatRequest, RegisterRequest, SessionResponse, SessionStatus,
    TransitionRequest,
};
use ql_worker_core::wire::{Fence, WireError};

use super::model::{ControlPlane, CpConfig, CpRequest, CpResponse, sha256};

/// A lowercase UUIDv7 Session id derived from `n`.
pub fn session_id(n: u32) -> SessionId {
    // INVARIANT: the template is a valid lowercase UUIDv7 for every `n`.
    SessionId::new(format!("018f0000-0000-7000-8000-{n:012}"))
        .unwrap_or_else(|_| unreachable!("session id"))
}

/// A Worker-generated offer id derived from `n`.
pub fn offer_id(n: u32) -> OfferId {
    // INVARIANT: `offer-<decimal>` is a valid offer id.
    OfferId::new(format!("offer-{n:06}")).unwrap_or_else(|_| unreachable!("offer id"))
}

/// A Worker-generated lease token derived from `n` (43 characters, like the reference's).
pub fn lease_token(n: u32) -> LeaseToken {
    // INVARIANT: 27 + 16 characters of [A-Za-z0-9_].
    LeaseToken::new(format!("worker_lease_capability_xx_{n:016}"))
        .unwrap_or_else(|_| unreachable!("lease token"))
}

/// A deterministic 32-byte completion capability derived from `n`.
pub fn capability(n: u32) -> Capability {
    Capability::from_bytes(*sha256(format!("capability-{n}").as_bytes()).as_bytes())
}

/// The Worker as the control plane sees it: its id, its current Session and its credential.
#[derive(Clone, Debug)]
pub struct WorkerIdentity {
    /// Worker.
    pub worker_id: WorkerId,
    /// Session.
    pub session_id: SessionId,
    /// Credential (redacted in `Debug`).
    pub credential: WorkerCredential,
}

impl WorkerIdentity {
    /// Worker `worker_id`, Session 1, a credential `worker-primary` with a secret derived from the
    /// Worker id.
    pub fn new(worker_id: &WorkerId) -> Self {
        let secret = *sha256(format!("secret-of-{worker_id}").as_bytes()).as_bytes();
        Self {
            worker_id: worker_id.clone(),
            session_id: session_id(1),
            // INVARIANT: a constant, valid credential id.
            credential: WorkerCredential::new("worker-primary", secret)
                .unwrap_or_else(|_| unreachable!("credential id")),
        }
    }

    /// The same Worker and credential in another Session.
    #[must_use]
    pub fn with_session(&self, session_id: SessionId) -> Self {
        Self {
            session_id,
            ..self.clone()
        }
    }

    /// The route path of `operation`.
    pub fn path(&self, operation: Operation) -> String {
        route::path(&self.worker_id, &self.session_id, operation)
    }

    /// The `authorization` header value.
    pub fn authorization(&self) -> String {
        self.credential.header_value().to_string()
    }
}

/// The register body of an amd64 Worker with `max_runs` concurrent Runs, all free, 30 s lease.
pub fn register_body(max_runs: u64) -> Vec<u8> {
    let capabilities = Capabilities::for_architecture(Architecture::Amd64);
    // INVARIANT: the sample capabilities and bounds are valid.
    RegisterRequest::new(&capabilities, max_runs, max_runs, 30_000)
        .and_then(|r| r.to_body())
        .unwrap_or_else(|e| unreachable!("register body: {e}"))
}

/// A heartbeat body.
pub fn heartbeat_body(generation: WorkerGeneration, expected_version: u64, slots: u64) -> Vec<u8> {
    HeartbeatRequest {
        generation,
        expected_version,
        available_slots: slots,
        lease_duration_ms: 30_000,
    }
    .to_body()
    .unwrap_or_else(|e| unreachable!("heartbeat body: {e}"))
}

/// A transition body.
pub fn transition_body(
    generation: WorkerGeneration,
    expected_version: u64,
    status: SessionStatus,
) -> Vec<u8> {
    TransitionRequest {
        generation,
        expected_version,
        status,
    }
    .to_body()
    .unwrap_or_else(|e| unreachable!("transition body: {e}"))
}

/// The running ACK the Worker sends for `offer` with capability `n`: handle `ql3lp1.test-<n>`,
/// the derived log id (or `null`), sequence 1.
pub fn running_ack(offer: &Offer, n: u32, with_log_id: bool) -> RunningAck {
    let c = &offer.candidate;
    RunningAck {
        // INVARIANT: a short printable handle.
        executor_handle: ExecutorHandle::new(format!("ql3lp1.test-{n}"))
            .unwrap_or_else(|_| unreachable!("handle")),
        log_artifact_id: with_log_id.then(|| {
            derive_log_artifact_id(&c.project_id, &c.run_id, &c.attempt_id, &offer.offer_id)
        }),
        callback_sequence: CallbackSequence::FIRST,
        callback_token_digest: capability(n).digest(),
    }
}

/// The artifact upload header for `offer` at its current lease version.
pub fn upload(offer: &Offer, content: &[u8], truncated: Option<bool>) -> ArtifactUpload {
    let c = &offer.candidate;
    ArtifactUpload {
        fence: Fence::from_offer(offer),
        log_artifact_id: derive_log_artifact_id(
            &c.project_id,
            &c.run_id,
            &c.attempt_id,
            &offer.offer_id,
        ),
        byte_length: content.len() as u64,
        truncated,
    }
}

/// The whole framed artifact body: preamble, then `content`.
pub fn artifact_body(upload: &ArtifactUpload, content: &[u8]) -> Vec<u8> {
    let mut body = upload
        .preamble()
        .map(|p| p.to_vec())
        .unwrap_or_else(|e| unreachable!("preamble: {e}"));
    body.extend_from_slice(content);
    body
}

/// Frames an artifact body from the JSON header the Worker's `UploadLog` command carries and the
/// content bytes: 4-byte big-endian header length, header, content (reference §2.7).
pub fn frame_artifact(header_json: &[u8], content: &[u8]) -> Vec<u8> {
    let len = u32::try_from(header_json.len()).unwrap_or(u32::MAX);
    let mut body = Vec::with_capacity(4 + header_json.len() + content.len());
    body.extend_from_slice(&len.to_be_bytes());
    body.extend_from_slice(header_json);
    body.extend_from_slice(content);
    body
}

/// The completion for `offer` after uploading `content` as `upload`, with exit code `exit`,
/// started at `started` and finished at `finished`, capability `n`.
pub fn completion(
    offer: &Offer,
    upload: &ArtifactUpload,
    content: &[u8],
    n: u32,
    exit: u8,
    started: UnixMillis,
    finished: UnixMillis,
) -> CompletionRequest {
    CompletionRequest {
        fence: Fence::from_offer(offer),
        callback_sequence: CallbackSequence::FIRST,
        callback_token_digest: capability(n).digest(),
        result: CompletionResult::from_exit(started, finished, exit),
        artifact: CompletionArtifact {
            log_artifact_id: upload.log_artifact_id.clone(),
            byte_length: content.len() as u64,
            sha256: sha256(content),
            truncated: upload.truncated,
        },
    }
}

/// Drives the pure model with a manual clock, as one Worker.
#[derive(Debug)]
pub struct ModelHarness {
    /// The model.
    pub cp: ControlPlane,
    /// The Worker.
    pub worker: WorkerIdentity,
    /// The clock (ms).
    pub now: u64,
}

impl ModelHarness {
    /// A model with the reference defaults, the Worker `edge-1`'s credential registered, clock at
    /// 1 000 000 ms.
    pub fn new() -> Self {
        Self::with_config(CpConfig::default())
    }

    /// As [`Self::new`] with `config`.
    pub fn with_config(config: CpConfig) -> Self {
        // INVARIANT: a constant, valid Worker id.
        let worker_id = WorkerId::new("edge-1").unwrap_or_else(|_| unreachable!("worker id"));
        let worker = WorkerIdentity::new(&worker_id);
        let mut cp = ControlPlane::new(config);
        cp.add_credential(&worker.credential, worker_id);
        Self {
            cp,
            worker,
            now: 1_000_000,
        }
    }

    /// The clock.
    pub fn at(&self) -> UnixMillis {
        UnixMillis::new(self.now).unwrap_or(UnixMillis::ZERO)
    }

    /// Moves the clock forward.
    pub fn advance(&mut self, ms: u64) {
        self.now += ms;
    }

    /// POSTs a JSON body to `operation` as the Worker.
    pub fn post(&mut self, operation: Operation, body: &[u8]) -> CpResponse {
        let request = CpRequest::json(
            self.worker.path(operation),
            &self.worker.authorization(),
            body.to_vec(),
        );
        let now = self.at();
        self.cp.handle(now, &request)
    }

    /// Uploads a framed artifact as the Worker.
    pub fn post_artifact(&mut self, body: Vec<u8>) -> CpResponse {
        let request = CpRequest::artifact(
            self.worker.path(Operation::Artifacts),
            &self.worker.authorization(),
            body,
        );
        let now = self.at();
        self.cp.handle(now, &request)
    }

    /// Registers (asserting 200) and returns the Session projection.
    pub fn register(&mut self, max_runs: u64) -> SessionResponse {
        let response = self.post(Operation::Register, &register_body(max_runs));
        assert_eq!(response.status, 200, "register: {response:?}");
        SessionResponse::parse_register(
            &response.body,
            &self.worker.worker_id,
            &self.worker.session_id,
        )
        .unwrap_or_else(|e| panic!("register response: {e}"))
    }

    /// Pulls with claim `n` (offer id and token derived from `n`) at `generation`; the raw
    /// answer.
    pub fn pull(&mut self, generation: WorkerGeneration, n: u32) -> CpResponse {
        let body = OfferRequest {
            worker_generation: generation,
            offer_id: offer_id(n),
            lease_token: lease_token(n),
        }
        .to_body()
        .unwrap_or_else(|e| unreachable!("offer body: {e}"));
        self.post(Operation::Offers, &body)
    }

    /// Pulls with claim `n` and admits the offer exactly as the Worker does; `None` when idle.
    pub fn claim(&mut self, generation: WorkerGeneration, n: u32) -> Option<Offer> {
        let response = self.pull(generation, n);
        assert_eq!(response.status, 200, "offers: {response:?}");
        let worker = OfferWorker {
            worker_id: self.worker.worker_id.clone(),
            session_id: self.worker.session_id.clone(),
            generation,
        };
        parse_and_admit(&response.body, &offer_id(n), &worker, &lease_token(n))
            .unwrap_or_else(|e| panic!("offer admission: {e}"))
    }

    /// Sends an activation request; the raw answer.
    pub fn activate(&mut self, request: &ActivationRequest) -> CpResponse {
        let body = request
            .to_body()
            .unwrap_or_else(|e| unreachable!("activation body: {e}"));
        self.post(request.operation(), &body)
    }

    /// Sends an activation request and parses the answer (asserting 200).
    pub fn activate_ok(&mut self, request: &ActivationRequest) -> ActivationResponse {
        let response = self.activate(request);
        assert_eq!(response.status, 200, "activation: {response:?}");
        ActivationResponse::parse(&response.body, request)
            .unwrap_or_else(|e| panic!("activation response: {e}"))
    }

    /// Sends a lease-control request for `offer`; the raw answer.
    pub fn lease_control(&mut self, offer: &Offer) -> CpResponse {
        let body = LeaseControlRequest::from_offer(offer)
            .to_body()
            .unwrap_or_else(|e| unreachable!("lease-control body: {e}"));
        self.post(Operation::LeaseControl, &body)
    }

    /// Sends a completion request; the raw answer.
    pub fn complete(&mut self, request: &CompletionRequest) -> CpResponse {
        let body = request
            .to_body()
            .unwrap_or_else(|e| unreachable!("completion body: {e}"));
        self.post(Operation::Completion, &body)
    }
}

impl Default for ModelHarness {
    fn default() -> Self {
        Self::new()
    }
}

/// The SHA-256 of `bytes` (lowercase-hex digest type).
pub fn digest(bytes: &[u8]) -> Sha256Digest {
    sha256(bytes)
}

/// [`OfferResponse::parse`] then [`admit_offer`] when offered, as the Worker admits an offer:
/// `Ok(None)` for idle.
///
/// # Errors
/// The message of the [`WireError`] or of the admission error.
pub fn parse_and_admit(
    bytes: &[u8],
    offer_id: &OfferId,
    worker: &OfferWorker,
    lease_token: &LeaseToken,
) -> Result<Option<Offer>, String> {
    match OfferResponse::parse(bytes).map_err(|e| e.to_string())? {
        OfferResponse::Idle { .. } => Ok(None),
        OfferResponse::Offered { offer, .. } => admit_offer(&offer, offer_id, worker, lease_token)
            .map(Some)
            .map_err(|e| e.to_string()),
    }
}

/// Parses a wire response with the core parser and names the endpoint on failure.
pub fn expect_wire<T>(result: Result<T, WireError>, what: &str) -> T {
    result.unwrap_or_else(|e| panic!("{what}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn framing_from_the_header_equals_the_core_preamble() {
        let offer = ql_worker_sim::testkit::offer(1);
        let up = upload(&offer, b"content", Some(true));
        let header = up.header_json().unwrap();
        assert_eq!(
            frame_artifact(&header, b"content"),
            artifact_body(&up, b"content")
        );
    }
}
