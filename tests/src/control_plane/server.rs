//! The HTTPS adapter: the [`ControlPlane`] model behind the loopback
//! [`HttpsServer`] (TLS 1.3 only, client certificate required, `127.0.0.1`, ephemeral port), with
//! transport fault injection. The product's `ql-worker demo` uses exactly this API:
//!
//! ```no_run
//! use ql_worker_tests::control_plane::{ReferenceControlPlane, ReferenceOptions, RevisionBuilder, RunSpec};
//!
//! let cp = ReferenceControlPlane::start(ReferenceOptions::default())?;
//! let revision = RevisionBuilder::shell("echo hello").build()?;
//! cp.enqueue_run(RunSpec::numbered(1, revision))?;
//! let settings = cp.worker_settings(); // origin, worker id, TLS files, credential file
//! # let _ = settings;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The model sees one request at a time (a mutex); the server's clock is the system clock, read
//! here only ([`ReferenceControlPlane::now`]). Artifact bodies stream from the socket into the
//! model's hasher without being buffered. Dropping the value stops the server and removes the
//! generated files.

use std::collections::VecDeque;
use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use tempfile::TempDir;

use ql_worker_core::ids::{ProjectId, RunId, WorkerId};
use ql_worker_core::revision::SecretRef;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::auth::WorkerCredential;
use ql_worker_core::wire::error::ErrorCode;
use ql_worker_core::wire::route::Operation;

use super::model::{
    CancelOutcome, ControlPlane, CpConfig, CpError, CpHead, CpResponse, RunSpec, ServiceFault,
};
use super::state::{CpState, RunRecord, SessionRecord};
use crate::https_server::{
    self, Handler, HttpsServer, Request, RequestRecord, Response, ServerOptions, ServerTls,
};
use crate::pki::{TestPki, write_private};

/// The body of a [`Fault::NotJson`] answer.
const NOT_JSON: &[u8] = b"not json";

/// Granularity of the interruptible sleep of [`Fault::Slow`].
const SLEEP_STEP: Duration = Duration::from_millis(10);

/// A transport fault for one request. "Applied" means the model handled the request (its state
/// may have changed); "not applied" means the model never saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Applied, then the connection is closed without a response: the Worker sees a connection
    /// error although the command committed; its retry gets the replay answer.
    CommitThenDrop,
    /// Not applied: 503 `worker_ingress_unavailable`.
    Unavailable,
    /// The request waits this long before the model sees it, then is applied and answered. If
    /// the server stops meanwhile, it is never applied. With a client timeout shorter than the
    /// delay the Worker sees a timeout while the model is still unchanged.
    Slow(Duration),
    /// Not applied: bytes that are not HTTP, then the connection closes.
    Garbage,
    /// Applied, and the answer gets an extra key (`"widened":true`) in its top-level object.
    WidenedJson,
    /// Applied, and whatever the model answered goes out as `200` with
    /// `content-type: application/json` and the body `not json` (a garbled answer: the request
    /// committed, the Worker cannot read the outcome).
    NotJson,
    /// Not applied: `302 Found` with a `location` to another path of this server.
    Redirect,
    /// Applied, and the model's answer goes out with this status instead.
    WrongStatus(u16),
    /// Applied, and every occurrence of `find` in the answer is replaced by `replace` (to forge
    /// an answer that drifts from its request).
    Rewrite {
        /// Text to find.
        find: String,
        /// Replacement.
        replace: String,
    },
    /// Not applied: a valid JSON object of exactly this many bytes (≥ 12).
    Oversize(usize),
    /// Not applied: the error answer of this code (its own status and `{"code":…}` body), e.g.
    /// `WorkerAuthenticationRequired` for a 401 as if the credential had been refused.
    Refuse(ErrorCode),
    /// Not applied: `403` with `{"code":"forbidden"}`, a code the reference does not have, as a
    /// gateway in front of the control plane answers when it refuses the client.
    Forbidden,
}

impl Fault {
    /// The fault the transport layer adds for the same request, if any.
    fn transport(&self) -> Option<https_server::Fault> {
        match self {
            Self::CommitThenDrop => Some(https_server::Fault::DropAfterBody),
            Self::Garbage => Some(https_server::Fault::garbage()),
            Self::Oversize(len) => Some(https_server::Fault::OversizeBody(*len)),
            Self::Unavailable
            | Self::Slow(_)
            | Self::WidenedJson
            | Self::NotJson
            | Self::Redirect
            | Self::WrongStatus(_)
            | Self::Refuse(_)
            | Self::Forbidden
            | Self::Rewrite { .. } => None,
        }
    }
}

/// Options of [`ReferenceControlPlane::start`].
#[derive(Clone, Debug)]
pub struct ReferenceOptions {
    /// The Worker the generated credential is bound to.
    pub worker_id: WorkerId,
    /// The credential id (`ql3w_<credentialId>_…`).
    pub credential_id: String,
    /// Model tunables.
    pub model: CpConfig,
    /// Transport options (bind address, timeouts, worker threads, …).
    pub server: ServerOptions,
}

impl Default for ReferenceOptions {
    fn default() -> Self {
        Self {
            // INVARIANT: a constant, valid Worker id.
            worker_id: WorkerId::new("worker-1").unwrap_or_else(|_| unreachable!("worker id")),
            credential_id: "worker-primary".to_owned(),
            model: CpConfig::default(),
            server: ServerOptions::default(),
        }
    }
}

/// What a Worker needs to talk to this control plane.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerSettings {
    /// `https://127.0.0.1:<port>`.
    pub origin: String,
    /// The Worker id the credential is bound to.
    pub worker_id: WorkerId,
    /// Client certificate (PEM).
    pub client_cert: PathBuf,
    /// Client private key (PEM, mode 0600).
    pub client_key: PathBuf,
    /// The CA that issued the server certificate (the Worker's trust anchor).
    pub ca_cert: PathBuf,
    /// A file (mode 0600) holding exactly the credential token `ql3w_<credentialId>_<secret>`
    /// (no newline); the `authorization` header is `Worker ` + that token.
    pub credential_file: PathBuf,
}

/// Which request a queued fault is for.
enum Target {
    /// The next request, whatever its path.
    Any,
    /// The next request to exactly this path.
    Path(String),
    /// The next request to this operation, whatever the Worker and Session in its path.
    Operation(Operation),
}

impl Target {
    fn matches(&self, path: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Path(p) => p == path,
            // The same rule as the transport's suffix match, so both layers pick one request.
            Self::Operation(operation) => path.ends_with(&operation_suffix(*operation)),
        }
    }
}

/// The path suffix that selects `operation` (its last path segment).
fn operation_suffix(operation: Operation) -> String {
    format!("/{}", operation.as_str())
}

struct FaultRule {
    target: Target,
    fault: Fault,
}

struct Shared {
    model: Mutex<ControlPlane>,
    faults: Mutex<VecDeque<FaultRule>>,
    stopping: AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The running reference control plane. Dropping it stops the server.
pub struct ReferenceControlPlane {
    server: Option<HttpsServer>,
    shared: Arc<Shared>,
    settings: WorkerSettings,
    credential: WorkerCredential,
    pki: TestPki,
    _dir: Option<TempDir>,
}

impl fmt::Debug for ReferenceControlPlane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReferenceControlPlane")
            .field("origin", &self.settings.origin)
            .field("worker_id", &self.settings.worker_id)
            .field("credential", &self.credential)
            .finish_non_exhaustive()
    }
}

impl ReferenceControlPlane {
    /// Generates a PKI (CA, server and client certificates with rcgen) and a credential into a
    /// fresh private temporary directory, and starts the server.
    pub fn start(options: ReferenceOptions) -> io::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("ql-worker-reference-cp-")
            .tempdir()?;
        let pki = TestPki::generate(&dir.path().join("pki"))?;
        Self::start_inner(pki, Some(dir), options)
    }

    /// Starts on an existing PKI (the credential file is written into `pki.dir`).
    pub fn start_with_pki(pki: TestPki, options: ReferenceOptions) -> io::Result<Self> {
        Self::start_inner(pki, None, options)
    }

    fn start_inner(
        pki: TestPki,
        dir: Option<TempDir>,
        options: ReferenceOptions,
    ) -> io::Result<Self> {
        let credential = derive_credential(&pki, &options.credential_id)?;
        let credential_file = pki.dir.join("worker-credential");
        let token = credential.header_value();
        let token = token.strip_prefix("Worker ").unwrap_or(&token);
        write_private(&credential_file, token.as_bytes())?;
        let mut model = ControlPlane::new(options.model);
        model.add_credential(&credential, options.worker_id.clone());
        let shared = Arc::new(Shared {
            model: Mutex::new(model),
            faults: Mutex::new(VecDeque::new()),
            stopping: AtomicBool::new(false),
        });
        let tls = ServerTls::from_pem_files(&pki.server.cert, &pki.server.key, &[&pki.ca.cert])?;
        let handler = Arc::new(CpHandler {
            shared: shared.clone(),
        });
        let server = HttpsServer::start(options.server, &tls, handler)?;
        let settings = WorkerSettings {
            origin: server.origin(),
            worker_id: options.worker_id,
            client_cert: pki.client.cert.clone(),
            client_key: pki.client.key.clone(),
            ca_cert: pki.ca.cert.clone(),
            credential_file,
        };
        Ok(Self {
            server: Some(server),
            shared,
            settings,
            credential,
            pki,
            _dir: dir,
        })
    }

    /// The server's clock (the system clock, in Unix milliseconds).
    pub fn now() -> UnixMillis {
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        UnixMillis::new(ms).unwrap_or(UnixMillis::ZERO)
    }

    /// `https://127.0.0.1:<port>`.
    pub fn origin(&self) -> &str {
        &self.settings.origin
    }

    /// Everything the Worker's configuration needs.
    pub fn worker_settings(&self) -> &WorkerSettings {
        &self.settings
    }

    /// The Worker id the credential is bound to.
    pub fn worker_id(&self) -> &WorkerId {
        &self.settings.worker_id
    }

    /// The Worker credential (its `header_value()` is the `authorization` header).
    pub fn credential(&self) -> &WorkerCredential {
        &self.credential
    }

    /// The generated certificates and keys.
    pub fn pki(&self) -> &TestPki {
        &self.pki
    }

    /// The directory holding the PKI and the credential file.
    pub fn dir(&self) -> &Path {
        &self.pki.dir
    }

    /// Enqueues a Run at the server's clock.
    pub fn enqueue_run(&self, spec: RunSpec) -> Result<RunId, CpError> {
        lock(&self.shared.model).enqueue_run(Self::now(), spec)
    }

    /// A user cancels a Run at the server's clock.
    pub fn cancel_run(&self, run_id: &RunId) -> Result<CancelOutcome, CpError> {
        lock(&self.shared.model).cancel_run(Self::now(), run_id)
    }

    /// Stores a Secret value and returns its reference.
    pub fn set_secret(
        &self,
        project_id: &ProjectId,
        name: &str,
        value: &str,
    ) -> Result<SecretRef, CpError> {
        lock(&self.shared.model).set_secret(project_id, name, value)
    }

    /// Stores an environment bundle and returns its versioned reference (see
    /// [`ControlPlane::set_environment_bundle`]).
    pub fn set_environment_bundle(
        &self,
        project_id: &ProjectId,
        name: &str,
        version: u64,
        entries: &[(&str, &str)],
    ) -> Result<SecretRef, CpError> {
        lock(&self.shared.model).set_environment_bundle(project_id, name, version, entries)
    }

    /// Queues a transport fault for the next request, whatever its path.
    pub fn inject(&self, fault: Fault) {
        self.push_fault(Target::Any, fault);
    }

    /// Queues a transport fault for the next request to exactly `path`.
    pub fn inject_for(&self, path: &str, fault: Fault) {
        self.push_fault(Target::Path(path.to_owned()), fault);
    }

    /// Queues a transport fault for the next request to `operation`, whatever the Worker and
    /// Session in its path: usable before the Worker has chosen its Session id (the first
    /// `register`, or the first call of a Run queued before the Worker starts).
    pub fn inject_for_operation(&self, operation: Operation, fault: Fault) {
        self.push_fault(Target::Operation(operation), fault);
    }

    fn push_fault(&self, target: Target, fault: Fault) {
        // Both queues are consumed by the same request: the transport takes its fault when the
        // request head arrives, the adapter when the handler runs.
        if let (Some(server), Some(transport)) = (&self.server, fault.transport()) {
            match &target {
                Target::Any => server.inject(transport),
                Target::Path(p) => server.inject_for(p, transport),
                Target::Operation(operation) => {
                    server.inject_for_suffix(&operation_suffix(*operation), transport);
                }
            }
        }
        lock(&self.shared.faults).push_back(FaultRule { target, fault });
    }

    /// Drops every queued transport fault no request has taken yet, in both layers: later
    /// requests are answered normally. For a fault that must last until something the test
    /// observes rather than for a known number of requests: queue more than can be taken, then
    /// clear the rest (e.g. `offers` answers lost until the plane's lease for the claim expired).
    /// The transport's queue is cleared first, so a request arriving meanwhile takes at most the
    /// adapter's part of a fault (an ordinary answer, or a 503 for a fault "not applied"). A
    /// request whose head had already arrived keeps the transport's part and may lose the
    /// adapter's: for `CommitThenDrop` the outcome is the same (applied, no answer).
    pub fn clear_faults(&self) {
        if let Some(server) = &self.server {
            server.clear_faults();
        }
        lock(&self.shared.faults).clear();
    }

    /// Queues a fault of the control plane's own services (see [`ServiceFault`]).
    pub fn inject_service_fault(&self, operation: Option<Operation>, fault: ServiceFault) {
        lock(&self.shared.model).inject_service_fault(operation, fault);
    }

    /// Runs `f` on the model (inspection, or the test API with an explicit `now`).
    pub fn with_model<R>(&self, f: impl FnOnce(&mut ControlPlane) -> R) -> R {
        f(&mut lock(&self.shared.model))
    }

    /// A copy of the model's state.
    pub fn state(&self) -> CpState {
        lock(&self.shared.model).state().clone()
    }

    /// A copy of one Run.
    pub fn run(&self, run_id: &RunId) -> Option<RunRecord> {
        lock(&self.shared.model).run(run_id).cloned()
    }

    /// A copy of a Worker's current Session.
    pub fn session(&self, worker_id: &WorkerId) -> Option<SessionRecord> {
        lock(&self.shared.model).session(worker_id).cloned()
    }

    /// What the transport saw, per request.
    pub fn http_records(&self) -> Vec<RequestRecord> {
        self.server
            .as_ref()
            .map(HttpsServer::records)
            .unwrap_or_default()
    }

    /// Waits (bounded by `timeout`) until the transport has recorded `n` requests.
    pub fn wait_http_records(&self, n: usize, timeout: Duration) -> Vec<RequestRecord> {
        let deadline = Instant::now() + timeout;
        loop {
            let records = self.http_records();
            if records.len() >= n || Instant::now() >= deadline {
                return records;
            }
            std::thread::sleep(SLEEP_STEP);
        }
    }
}

impl Drop for ReferenceControlPlane {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        // The server joins its threads (bounded) before the directory goes.
        drop(self.server.take());
    }
}

/// The credential secret: SHA-256 of a domain and the CA's private key, so it is unpredictable
/// per PKI and needs no random source here.
fn derive_credential(pki: &TestPki, credential_id: &str) -> io::Result<WorkerCredential> {
    let ca_key = std::fs::read(&pki.ca.key)?;
    let mut hasher = Sha256::new();
    hasher.update(b"ql-worker reference control plane credential\0");
    hasher.update(&ca_key);
    let secret: [u8; 32] = hasher.finalize().into();
    WorkerCredential::new(credential_id, secret)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
}

struct CpHandler {
    shared: Arc<Shared>,
}

impl CpHandler {
    fn take_fault(&self, path: &str) -> Option<Fault> {
        let mut faults = lock(&self.shared.faults);
        let index = faults.iter().position(|rule| rule.target.matches(path))?;
        faults.remove(index).map(|rule| rule.fault)
    }

    /// Hands the request to the model; the body streams from the socket. The model is locked
    /// while a request is admitted and answered, but not while an artifact's content streams:
    /// like the reference, other requests (heartbeats, lease renewals of the same Run) proceed
    /// during a slow upload.
    fn apply(&self, req: &mut Request<'_>) -> CpResponse {
        if req.method != "POST" {
            return CpResponse::error(ErrorCode::WorkerRouteNotFound);
        }
        let head = CpHead {
            path: req.path.clone(),
            authorization: req.header("authorization").map(str::to_owned),
            content_type: req.header("content-type").map(str::to_owned),
            content_length: req.content_length,
        };
        let now = ReferenceControlPlane::now();
        let begun = lock(&self.shared.model).begin_stream(now, &head, req);
        let ticket = match begun {
            Ok(ticket) => ticket,
            Err(response) => return response,
        };
        // Unlocked: the content may take minutes over a slow link.
        let streamed = ticket.stream_content(req);
        let now = ReferenceControlPlane::now();
        lock(&self.shared.model).finish_artifact(now, ticket, streamed)
    }

    /// Sleeps up to `delay`; returns `false` if the server started stopping meanwhile.
    fn sleep(&self, delay: Duration) -> bool {
        let deadline = Instant::now() + delay;
        while Instant::now() < deadline {
            if self.shared.stopping.load(Ordering::SeqCst) {
                return false;
            }
            std::thread::sleep(SLEEP_STEP.min(deadline.saturating_duration_since(Instant::now())));
        }
        !self.shared.stopping.load(Ordering::SeqCst)
    }
}

fn to_response(cp: CpResponse) -> Response {
    let mut response = Response::json(cp.body);
    response.status = cp.status;
    response
}

fn widen(body: &[u8]) -> Vec<u8> {
    match body.first() {
        Some(b'{') if body.len() > 2 => {
            let mut out = b"{\"widened\":true,".to_vec();
            out.extend_from_slice(&body[1..]);
            out
        }
        _ => body.to_vec(),
    }
}

fn replace_all(body: &[u8], find: &str, replace: &str) -> Vec<u8> {
    match std::str::from_utf8(body) {
        Ok(text) if !find.is_empty() => text.replace(find, replace).into_bytes(),
        _ => body.to_vec(),
    }
}

impl Handler for CpHandler {
    fn handle(&self, req: &mut Request<'_>) -> Response {
        let Some(fault) = self.take_fault(&req.path) else {
            return to_response(self.apply(req));
        };
        match fault {
            Fault::CommitThenDrop => to_response(self.apply(req)),
            Fault::Unavailable => {
                to_response(CpResponse::error(ErrorCode::WorkerIngressUnavailable))
            }
            Fault::Slow(delay) => {
                if self.sleep(delay) {
                    to_response(self.apply(req))
                } else {
                    to_response(CpResponse::error(ErrorCode::WorkerIngressUnavailable))
                }
            }
            // The transport replaces these answers; the model never sees the request.
            Fault::Garbage | Fault::Oversize(_) => {
                to_response(CpResponse::error(ErrorCode::WorkerIngressUnavailable))
            }
            Fault::WidenedJson => {
                let mut cp = self.apply(req);
                if cp.status == 200 {
                    cp.body = widen(&cp.body);
                }
                to_response(cp)
            }
            Fault::NotJson => {
                // The model's own answer (success or error) is discarded: the request committed
                // or was refused, and the Worker cannot tell which.
                drop(self.apply(req));
                Response::json(NOT_JSON.to_vec())
            }
            Fault::Redirect => Response {
                status: 302,
                headers: vec![("location".to_owned(), "/redirected".to_owned())],
                body: Vec::new(),
            },
            Fault::WrongStatus(status) => {
                let mut cp = self.apply(req);
                cp.status = status;
                to_response(cp)
            }
            Fault::Refuse(code) => to_response(CpResponse::error(code)),
            Fault::Forbidden => {
                let mut response = Response::json(br#"{"code":"forbidden"}"#.to_vec());
                response.status = 403;
                response
            }
            Fault::Rewrite { find, replace } => {
                let mut cp = self.apply(req);
                cp.body = replace_all(&cp.body, &find, &replace);
                to_response(cp)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn widening_adds_one_key_to_an_object() {
        assert_eq!(widen(br#"{"a":1}"#), br#"{"widened":true,"a":1}"#.to_vec());
        assert_eq!(widen(b"{}"), b"{}".to_vec());
    }

    #[test]
    fn an_operation_target_matches_only_that_operation() {
        let base = "/api/v3/worker-ingress/workers/w/sessions/s";
        let target = Target::Operation(Operation::Running);
        assert!(target.matches(&format!("{base}/running")));
        assert!(!target.matches(&format!("{base}/starting")));
        assert!(!target.matches(&format!("{base}/running/x")));
        let lease = Target::Operation(Operation::LeaseControl);
        assert!(lease.matches(&format!("{base}/lease-control")));
        assert!(!lease.matches(&format!("{base}/completion")));
    }
}
