//! The simulated control plane: one consistent view per Run, and well-formed responses for every
//! [`Answer`] (built with the wire module's own `to_json`, so they pass the strict parsers
//! unless the answer is [`Answer::Invalid`]).
//!
//! `offers` follows the reference's claim service (§2.2): a fresh offer id claims the next
//! Run (a Run whose lease expired first, with re-delivery on, else the next template); a known
//! offer id is a replay, re-delivered (`lease_recovery`) only while its lease is still `leased`
//! (the Run not terminal), unexpired, held by the Session the Worker calls with (the plane's
//! current one, not offline) at the same generation and for the same token, and otherwise
//! fenced with 409 `worker_offer_fenced` whatever answer the model picked.

use ql_worker_core::wire::error::ErrorCode;
use std::collections::{BTreeMap, VecDeque};
use std::hash::Hasher;

use serde_json::Value;

use super::{Answer, World, hash_debug};
use crate::testkit::{offer_for, worker};
use ql_worker_core::ids::{
    AttemptId, CallbackSequence, ExecutorHandle, LeaseToken, LeaseVersion, LogArtifactId, OfferId,
    SessionId, Sha256Digest,
};
use ql_worker_core::io::{HttpFailure, Outcome};
use ql_worker_core::offer::Offer;
use ql_worker_core::record::InboxRecord;
use ql_worker_core::revision::ExecutionRevision;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::Fence;
use ql_worker_core::wire::activation::{
    ActivationResponse, ActivationSnapshot, ActivationStatus, AttemptStatus, RunStatus,
    SnapshotShape,
};
use ql_worker_core::wire::artifact::{ArtifactReceipt, UploadStatus};
use ql_worker_core::wire::completion::{CompletionResponse, CompletionStatus};
use ql_worker_core::wire::lease_control::{
    LeaseControlRequest, LeaseControlResponse, RenewedLease, StopReason, StopRequest,
    TerminalStatus,
};
use ql_worker_core::wire::offer::{
    IdleReason, OfferResponse, OfferStats, OfferedLease, OfferedOffer,
};
use ql_worker_core::wire::route::Operation;
use ql_worker_core::wire::secrets::{ResolvedSecret, SecretValue, SecretsRequest, SecretsResponse};
use ql_worker_core::wire::session::{
    HEARTBEAT_SCHEMA, REGISTER_SCHEMA, SessionResponse, SessionStatus, TRANSITION_SCHEMA,
};
use ql_worker_tests::server_wire::{ToJson as _, ToJsonFor as _, parse_artifact_preamble};

/// An offer the control plane will hand out for the next fresh claim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OfferTemplate {
    /// Run `run-<n>`, Attempt `attempt-<n>`, alias `o<n>`.
    pub n: u32,
    /// The pinned revision.
    pub revision: ExecutionRevision,
    /// Lease duration.
    pub lease_ms: u64,
    /// The control plane pins an execution digest that is not its revision's: an offer the
    /// Worker must refuse for good (`pull::refused_for_good`), storing nothing.
    pub refused: bool,
}

impl OfferTemplate {
    /// Run `n` with the sample revision and a 30 s lease.
    #[must_use]
    pub fn sample(n: u32) -> Self {
        Self {
            n,
            revision: crate::testkit::revision(),
            lease_ms: 30_000,
            refused: false,
        }
    }

    /// Run `n`, its pinned execution digest not its revision's: the Worker must refuse it.
    #[must_use]
    pub fn refused(n: u32) -> Self {
        Self {
            refused: true,
            ..Self::sample(n)
        }
    }

    /// Run `n` with `revision` and a 30 s lease.
    #[must_use]
    pub fn with_revision(n: u32, revision: ExecutionRevision) -> Self {
        Self {
            revision,
            ..Self::sample(n)
        }
    }
}

/// The control plane's status of one Run/Attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CpStatus {
    /// Leased to the Worker, not started.
    Leased,
    /// `starting` applied.
    Starting,
    /// `running` applied.
    Running,
    /// `start-failure` applied.
    StartFailed,
    /// Completion applied.
    Completed,
    /// Terminal by another path (cancelled, timed out).
    Cancelled,
    /// This offer's lease expired and the control plane re-delivered its Run under another
    /// offer id ([`ControlPlane::reoffers`]): the lease is gone (terminal for this offer).
    Superseded,
}

impl CpStatus {
    fn terminal(self) -> bool {
        matches!(
            self,
            Self::StartFailed | Self::Completed | Self::Cancelled | Self::Superseded
        )
    }
}

/// The control plane's view of one Run.
#[derive(Clone, Debug)]
pub struct CpRun {
    /// Template number.
    pub n: u32,
    /// The offer as delivered (lease as the control plane last renewed it).
    pub offer: Offer,
    /// Status.
    pub status: CpStatus,
    /// Snapshot callback sequence.
    pub callback_sequence: u64,
    /// Durable deadline (revisions with `timeoutMs`).
    pub deadline: Option<UnixMillis>,
    /// Executor handle recorded by `running`.
    pub handle: Option<ExecutorHandle>,
    /// Start time recorded by `running`.
    pub started_at: Option<UnixMillis>,
    /// Stored artifacts: log id, length, SHA-256, and whether the Worker heard the success.
    pub uploads: Vec<(LogArtifactId, u64, Sha256Digest, bool)>,
    /// The applied completion's callback sequence.
    pub completion: Option<CallbackSequence>,
    /// The `expectedLeaseVersion` the applied completion named: an exact replay (of the upload
    /// or the completion) must name it too, as the reference's `replay_mismatch` rule says.
    pub completed_version: Option<u64>,
    /// The control plane wants the process stopped (answers `stop_requested`).
    pub wants_stop: bool,
    /// Highest lease version sent with `stop_requested`.
    pub stop_requested_version: Option<u64>,
    /// Whether the control plane ever told the Worker the Run is terminal.
    pub terminal_answered: bool,
}

impl CpRun {
    /// The log id the Worker derives for this Run.
    #[must_use]
    pub fn log_artifact_id(&self) -> LogArtifactId {
        let c = &self.offer.candidate;
        ql_worker_core::wire::derive_log_artifact_id(
            &c.project_id,
            &c.run_id,
            &c.attempt_id,
            &self.offer.offer_id,
        )
    }
}

/// The control plane.
#[derive(Clone, Debug)]
pub struct ControlPlane {
    /// Offers still to hand out, in order.
    pub templates: VecDeque<OfferTemplate>,
    /// Runs handed out, by offer id.
    pub runs: BTreeMap<OfferId, CpRun>,
    /// Worker Session record version.
    pub session_version: u64,
    /// Worker Session status.
    pub session_status: SessionStatus,
    /// The Session registered last (`None`: the sample one).
    pub session_id: Option<SessionId>,
    /// Session lease granted per register/heartbeat.
    pub session_lease_ms: u64,
    /// Re-delivery: a fresh claim is answered with an existing Run whose lease expired (before
    /// any template): the same Attempt when no activation call reached the plane (`leased`),
    /// else a new Attempt of the Run, the old one declared lost (`docs/simulation.md`, "At most
    /// once per Run and per Attempt").
    pub reoffers: bool,
    /// Attempts the control plane declared lost (it gave up on them and made a new Attempt).
    pub lost_attempts: std::collections::BTreeSet<AttemptId>,
    /// Runs (template numbers) whose pinned digest is not their revision's
    /// ([`OfferTemplate::refused`]): no record of theirs may ever be written.
    pub refused: std::collections::BTreeSet<u32>,
    /// Offers of such Runs delivered (a count, not part of the state).
    pub refusable_delivered: u32,
    /// Replays of a known offer id answered 409 `worker_offer_fenced` that the Worker heard
    /// (counted by the driver, [`crate::testkit::sim::Sim::answer`]; a count, not part of the
    /// state).
    pub fenced_replays: u32,
}

impl ControlPlane {
    /// Whether an `offers` body names an offer id this plane handed out (a replay).
    pub(super) fn names_known_offer(&self, body: &[u8]) -> bool {
        serde_json::from_slice::<Value>(body)
            .ok()
            .and_then(|v| OfferId::new(text(&v, "offerId")).ok())
            .is_some_and(|id| self.runs.contains_key(&id))
    }

    pub(super) fn new(templates: Vec<OfferTemplate>) -> Self {
        Self {
            templates: templates.into(),
            runs: BTreeMap::new(),
            session_version: 0,
            session_status: SessionStatus::Online,
            session_id: None,
            session_lease_ms: 30_000,
            reoffers: false,
            lost_attempts: std::collections::BTreeSet::new(),
            refused: std::collections::BTreeSet::new(),
            refusable_delivered: 0,
            fenced_replays: 0,
        }
    }

    pub(super) fn fingerprint(&self, hasher: &mut dyn Hasher) {
        hasher.write_usize(self.templates.len());
        hash_debug(hasher, &(self.reoffers, &self.lost_attempts, &self.refused));
        hash_debug(
            hasher,
            &(self.session_version, self.session_status, &self.session_id),
        );
        for run in self.runs.values() {
            hash_debug(
                hasher,
                &(run.n, run.status, run.callback_sequence, run.deadline),
            );
            hash_debug(hasher, &(&run.handle, run.started_at, &run.uploads));
            hash_debug(hasher, &(run.completion, run.wants_stop));
            hash_debug(hasher, &(run.stop_requested_version, run.terminal_answered));
            hasher.write(run.offer.offer_id.as_str().as_bytes());
            // The lease as its exact postcard bytes (its `Debug` redacts the token digest).
            let lease = postcard::to_allocvec(&run.offer.lease).expect("a lease serializes");
            hasher.write(&lease);
            hasher.write_u8(0xfd);
        }
    }
}

fn json(body: &[u8]) -> Value {
    serde_json::from_slice(body).unwrap_or(Value::Null)
}

fn text<'a>(v: &'a Value, key: &str) -> &'a str {
    v.get(key).and_then(Value::as_str).unwrap_or("")
}

fn number(v: &Value, key: &str) -> u64 {
    v.get(key).and_then(Value::as_u64).unwrap_or(0)
}

/// The offer id a request body names, if any.
pub(super) fn body_offer(body: &[u8]) -> Option<OfferId> {
    OfferId::new(text(&json(body), "offerId")).ok()
}

/// `outcome` with its response body damaged as `answer` says ([`Answer::Garbled`]: the middle
/// byte flipped; [`Answer::Truncated`]: the first half kept); any other answer leaves it.
fn damaged(outcome: Outcome, answer: Answer) -> Outcome {
    let damage = |mut body: Vec<u8>| {
        match answer {
            Answer::Truncated => body.truncate(body.len() / 2),
            Answer::Garbled => {
                let middle = body.len() / 2;
                if let Some(byte) = body.get_mut(middle) {
                    *byte ^= 0x5a;
                }
            }
            _ => {}
        }
        body
    };
    match outcome {
        Outcome::Responded(body) => Outcome::Responded(damage(body)),
        Outcome::Uploaded {
            body,
            sent_bytes,
            sent_sha256,
        } => Outcome::Uploaded {
            body: damage(body),
            sent_bytes,
            sent_sha256,
        },
        other => other,
    }
}

/// The reference's 409 of `operation`, with the code its route answers (reference §1, error
/// table; the artifact upload is the completion's fence).
fn fenced(operation: Operation) -> Outcome {
    let code = match operation {
        Operation::Register | Operation::Heartbeat | Operation::Transition => {
            ErrorCode::WorkerSessionFenced
        }
        Operation::Offers => ErrorCode::WorkerOfferFenced,
        Operation::Starting | Operation::Running | Operation::StartFailure => {
            ErrorCode::WorkerActivationFenced
        }
        Operation::Secrets => ErrorCode::WorkerSecretDeliveryFenced,
        Operation::Artifacts | Operation::Completion => ErrorCode::WorkerCompletionFenced,
        Operation::LeaseControl => ErrorCode::WorkerLeaseControlFenced,
        Operation::Attestations => ErrorCode::WorkerAttestationFenced,
    };
    Outcome::Http(HttpFailure::Status {
        status: 409,
        code: Some(String::from(code.as_str())),
    })
}

fn not_found() -> Outcome {
    Outcome::Http(HttpFailure::Status {
        status: 404,
        code: Some(String::from("not_found")),
    })
}

impl World {
    /// A JSON POST: the faults first, then the operation.
    pub(super) fn post(
        &mut self,
        now: UnixMillis,
        operation: Operation,
        body: &[u8],
        answer: Answer,
    ) -> Outcome {
        match answer {
            // The reference fences an `offers` call only as the replay of an offer id whose
            // lease cannot be recovered (§2.2), which `offers` decides itself: a drawn fence of
            // this route is a bare 409, which the Worker reads as a failed Pull.
            Answer::Fenced if operation == Operation::Offers => {
                return Outcome::Http(HttpFailure::Status {
                    status: 409,
                    code: None,
                });
            }
            Answer::Fenced => return fenced(operation),
            Answer::Unavailable => return Outcome::Http(HttpFailure::Unavailable),
            Answer::Invalid => return Outcome::Responded(Vec::from(&b"{}"[..])),
            Answer::HttpStatus(status) => {
                return Outcome::Http(HttpFailure::Status { status, code: None });
            }
            Answer::Garbled | Answer::Truncated => {
                let outcome = self.answer_post(now, operation, body, Answer::Ok, false);
                return damaged(outcome, answer);
            }
            Answer::LostAfterCommit => {
                let _ = self.answer_post(now, operation, body, Answer::Ok, false);
                return Outcome::Http(HttpFailure::Uncertain);
            }
            _ => {}
        }
        self.answer_post(now, operation, body, answer, true)
    }

    fn answer_post(
        &mut self,
        now: UnixMillis,
        operation: Operation,
        body: &[u8],
        answer: Answer,
        heard: bool,
    ) -> Outcome {
        let v = json(body);
        match operation {
            Operation::Register | Operation::Heartbeat | Operation::Transition => {
                self.session(now, operation, &v)
            }
            Operation::Offers => self.offers(now, &v, answer, heard),
            Operation::Starting | Operation::Running | Operation::StartFailure => {
                self.activation(now, operation, &v, answer)
            }
            Operation::Secrets => self.secrets(&v, answer),
            Operation::Completion => self.completion(&v, answer),
            Operation::LeaseControl => self.lease_control(now, &v, answer),
            Operation::Artifacts | Operation::Attestations => not_found(),
        }
    }

    fn session(&mut self, now: UnixMillis, operation: Operation, v: &Value) -> Outcome {
        // The Worker calls with the stored Session id (the sample one until it replaces it).
        let stored = self.session_id.clone();
        let plane = &mut self.plane;
        let schema = match operation {
            Operation::Register => {
                if plane.session_id != stored {
                    // A new Session id replaces the old Session: online, version 0.
                    plane.session_id = stored.clone();
                    plane.session_status = SessionStatus::Online;
                    plane.session_version = 0;
                } else {
                    plane.session_version += 1;
                }
                if self.mutation == Some(super::Mutation::SessionStaysDraining) {
                    plane.session_status = SessionStatus::Draining;
                }
                REGISTER_SCHEMA
            }
            // The version CAS of the reference's heartbeat and transition: a stale
            // `expectedVersion` (an earlier exchange committed unanswered) is fenced.
            Operation::Heartbeat | Operation::Transition
                if number(v, "expectedVersion") != plane.session_version =>
            {
                return Outcome::Http(HttpFailure::Status {
                    status: 409,
                    code: Some(String::from("worker_session_fenced")),
                });
            }
            Operation::Transition => {
                plane.session_version = number(v, "expectedVersion") + 1;
                plane.session_status = match text(v, "status") {
                    "offline" => SessionStatus::Offline,
                    _ => SessionStatus::Draining,
                };
                TRANSITION_SCHEMA
            }
            _ => {
                plane.session_version = number(v, "expectedVersion") + 1;
                HEARTBEAT_SCHEMA
            }
        };
        let w = worker();
        let response = SessionResponse {
            worker_id: w.worker_id,
            session_id: stored.unwrap_or(w.session_id),
            generation: w.generation,
            version: plane.session_version,
            status: plane.session_status,
            lease_expires_at_ms: now.saturating_add(plane.session_lease_ms),
            replaced_session: (operation == Operation::Register).then_some(false),
        };
        Outcome::Responded(response.to_json(schema))
    }

    fn offers(&mut self, now: UnixMillis, v: &Value, answer: Answer, heard: bool) -> Outcome {
        let (Ok(id), Ok(token)) = (
            OfferId::new(text(v, "offerId")),
            LeaseToken::new(text(v, "leaseToken")),
        ) else {
            return Outcome::Http(HttpFailure::Status {
                status: 400,
                code: None,
            });
        };
        let known = self.plane.runs.contains_key(&id);
        if known && !self.recoverable(now, &id, &token, number(v, "workerGeneration")) {
            // The reference's replay fence (§2.2): the lease this offer id names can no longer
            // be recovered. The plane will never deliver this offer id again, so the Worker may
            // clear its claim (`stored-before-clear`).
            self.evidence.delivered.insert(id, false);
            return fenced(Operation::Offers);
        }
        let expired = self.expired_run(now);
        // A replay the fence admits is always answered with its offer (reference §2.2,
        // recovery): an idle answer is drawn only for a new offer id.
        let deliver = known
            || match answer {
                Answer::Idle => false,
                _ => expired.is_some() || !self.plane.templates.is_empty(),
            };
        if !deliver {
            if heard {
                self.evidence.delivered.insert(id, false);
            }
            return Outcome::Responded(
                OfferResponse::Idle {
                    reason: IdleReason::NoCandidates,
                    stats: OfferStats::default(),
                    truncated: false,
                }
                .to_json(),
            );
        }
        if !known && let Some(old) = expired {
            self.redeliver(&old, &id, token, now);
        } else if !known && let Some(t) = self.plane.templates.pop_front() {
            let mut offer = offer_for(t.n, id.clone(), token, t.revision, now, t.lease_ms);
            if t.refused {
                offer.execution_digest = Sha256Digest::of(b"not the pinned revision");
                self.plane.refused.insert(t.n);
            }
            // Claimed by the Session the Worker calls with (a new one once it replaced it).
            if let Some(session_id) = &self.session_id {
                offer.worker.session_id = session_id.clone();
                offer.lease.worker_session_id = session_id.clone();
            }
            self.aliases.insert(id.clone(), format!("o{}", t.n));
            self.plane.runs.insert(id.clone(), new_run(t.n, offer));
        }
        if answer == Answer::NewerLease
            && let Some(run) = self.plane.runs.get_mut(&id)
        {
            bump_lease(&mut run.offer, now);
        }
        if heard {
            self.evidence.delivered.insert(id.clone(), true);
        }
        let Some(run) = self.plane.runs.get(&id) else {
            return not_found();
        };
        if heard && self.plane.refused.contains(&run.n) {
            self.plane.refusable_delivered += 1;
        }
        Outcome::Responded(
            OfferResponse::Offered {
                offer: Box::new(offered(&run.offer)),
                stats: OfferStats::default(),
                truncated: false,
            }
            .to_json(),
        )
    }
}

impl World {
    /// Whether a replay of the known offer `id` with `token` and Session generation
    /// `generation` at `now` recovers its lease (reference §2.2, `lease_recovery`): the lease is
    /// still `leased` (the Run not terminal: the reference keeps the lease `leased` through
    /// `starting` and `running` until a completion, a start failure or the reaper closes it;
    /// here also a Run terminal by another path or re-delivered under another offer id),
    /// unexpired at `now`, held by the Session the Worker calls with while that Session is the
    /// plane's current one and not offline, at the same Session generation, for the same token.
    /// Otherwise the plane answers 409 `worker_offer_fenced`.
    fn recoverable(
        &self,
        now: UnixMillis,
        id: &OfferId,
        token: &LeaseToken,
        generation: u64,
    ) -> bool {
        let Some(run) = self.plane.runs.get(id) else {
            return false;
        };
        let lease = &run.offer.lease;
        let caller = self
            .session_id
            .clone()
            .unwrap_or_else(|| worker().session_id);
        !run.status.terminal()
            && now < lease.expires_at_ms
            && self.plane.session_id == self.session_id
            && self.plane.session_status != SessionStatus::Offline
            && lease.worker_session_id == caller
            && lease.worker_generation.get() == generation
            && lease.lease_token_digest == token.digest()
    }

    /// With re-delivery on, the first Run (by offer id) whose lease expired at `now` and that
    /// is not terminal.
    fn expired_run(&self, now: UnixMillis) -> Option<OfferId> {
        if !self.plane.reoffers {
            return None;
        }
        self.plane
            .runs
            .iter()
            .find(|(_, run)| !run.status.terminal() && run.offer.lease.expires_at_ms <= now)
            .map(|(id, _)| id.clone())
    }

    /// Re-delivers the Run of offer `old` (lease expired) under the fresh offer `id`: the same
    /// Attempt when no activation call reached the plane, else a new Attempt (the old one is
    /// declared lost). The old offer's lease is gone ([`CpStatus::Superseded`]).
    fn redeliver(&mut self, old: &OfferId, id: &OfferId, token: LeaseToken, now: UnixMillis) {
        let Some(previous) = self.plane.runs.get_mut(old) else {
            return;
        };
        let unstarted = previous.status == CpStatus::Leased;
        previous.status = CpStatus::Superseded;
        let (n, lease_ms) = (previous.n, 30_000);
        let revision = previous.offer.execution_revision.clone();
        let mut candidate = previous.offer.candidate.clone();
        if !unstarted {
            self.plane
                .lost_attempts
                .insert(candidate.attempt_id.clone());
            let number = candidate.attempt_number + 1;
            let attempt = format!("attempt-{n}-{number}");
            candidate.attempt_id = AttemptId::new(attempt).unwrap_or(candidate.attempt_id);
            candidate.attempt_number = number;
            candidate.attempt_created_at_ms = now;
        }
        let pinned = previous.offer.execution_digest;
        let mut offer = offer_for(n, id.clone(), token, revision, now, lease_ms);
        // The control plane re-delivers what it pinned for the Run.
        offer.execution_digest = pinned;
        offer.lease.attempt_id = candidate.attempt_id.clone();
        offer.candidate = candidate;
        if let Some(session_id) = &self.session_id {
            offer.worker.session_id = session_id.clone();
            offer.lease.worker_session_id = session_id.clone();
        }
        let alias = format!("{}'", self.alias(old));
        self.aliases.insert(id.clone(), alias);
        self.plane.runs.insert(id.clone(), new_run(n, offer));
    }

    /// Seeds the world with `record` of offer `n` as if the Worker had written it: stored on
    /// disk, known to the control plane (with the status that record implies), and, when
    /// `running`, with the process of its seeded capability and handle running under the
    /// supervisor (and its log allocated).
    pub fn seed(&mut self, n: u32, record: InboxRecord, running: bool) {
        use ql_worker_core::record::State as S;
        let id = record.offer.offer_id.clone();
        if record.state == S::Launching {
            // A previous incarnation left it launching: whether its process started is unknown.
            self.cause(
                &id,
                ql_worker_core::record::RecoveryReason::LaunchOutcomeUnknown,
            );
        }
        let mut run = new_run(n, record.offer.clone());
        run.status = match record.state {
            S::Accepted => CpStatus::Leased,
            S::StartingAcknowledged | S::Launching | S::Started | S::StartFailed => {
                CpStatus::Starting
            }
            S::RunningAcknowledged | S::RecoveryRequired => CpStatus::Running,
            S::StartFailureAcknowledged => CpStatus::StartFailed,
            S::CompletionAcknowledged => CpStatus::Completed,
        };
        if run.status == CpStatus::Running {
            run.handle = record.executor_handle.clone();
            run.started_at = record.executor_started_at_ms;
            run.callback_sequence = 1;
        }
        if running && let Some(log) = record.log_artifact_id.clone() {
            self.disk.logs.entry(log.clone()).or_insert(super::Log {
                content: Vec::new(),
                truncated: None,
            });
            let handle = record
                .executor_handle
                .clone()
                .unwrap_or_else(|| crate::testkit::seeded_handle(n));
            self.supervisor.processes.push(super::Process {
                offer_id: id.clone(),
                run_id: record.offer.candidate.run_id.clone(),
                attempt_id: record.offer.candidate.attempt_id.clone(),
                handle: String::from(handle.as_str()),
                started_at: record.executor_started_at_ms.unwrap_or(UnixMillis::ZERO),
                sequence: record
                    .completion_receipt_callback_sequence
                    .unwrap_or(CallbackSequence::FIRST),
                capability: crate::testkit::seeded_capability(n),
                log_artifact_id: log,
                state: super::ProcessState::Running,
            });
        }
        self.aliases.insert(id.clone(), format!("o{n}"));
        self.plane.runs.insert(id, run);
        self.disk.put(record);
    }
}

fn new_run(n: u32, offer: Offer) -> CpRun {
    CpRun {
        n,
        offer,
        status: CpStatus::Leased,
        callback_sequence: 0,
        deadline: None,
        handle: None,
        started_at: None,
        uploads: Vec::new(),
        completion: None,
        wants_stop: false,
        stop_requested_version: None,
        terminal_answered: false,
        completed_version: None,
    }
}

fn bump_lease(offer: &mut Offer, now: UnixMillis) {
    let lease = &mut offer.lease;
    let version = lease.version.get() + 1;
    lease.version = LeaseVersion::new(version).unwrap_or(lease.version);
    lease.renewed_at_ms = now.max(lease.renewed_at_ms);
    lease.updated_at_ms = lease.renewed_at_ms;
    lease.expires_at_ms = lease.renewed_at_ms.saturating_add(30_000);
}

fn offered(offer: &Offer) -> OfferedOffer {
    let l = &offer.lease;
    OfferedOffer {
        offer_id: offer.offer_id.clone(),
        delivery_kind: offer.delivery_kind,
        execution_digest: offer.execution_digest,
        candidate: offer.candidate.clone(),
        worker: offer.worker.clone(),
        lease: OfferedLease {
            version: l.version,
            lease_generation: l.lease_generation,
            acquired_at_ms: l.acquired_at_ms,
            renewed_at_ms: l.renewed_at_ms,
            expires_at_ms: l.expires_at_ms,
            updated_at_ms: l.updated_at_ms,
        },
        execution_revision: offer.execution_revision.clone(),
        placement_score: offer.placement_score,
    }
}

/// The status a consistent control plane answers to an activation command.
fn consistent(operation: Operation, status: CpStatus) -> Answer {
    match (operation, status) {
        (_, s) if s.terminal() => Answer::AlreadyTerminal,
        (Operation::Starting, CpStatus::Leased) => Answer::Applied,
        (Operation::Starting, CpStatus::Starting) => Answer::AlreadyStarting,
        (_, CpStatus::Running) => Answer::AlreadyRunning,
        _ => Answer::Applied,
    }
}

impl World {
    fn activation(
        &mut self,
        now: UnixMillis,
        operation: Operation,
        v: &Value,
        answer: Answer,
    ) -> Outcome {
        let Some(run) = OfferId::new(text(v, "offerId"))
            .ok()
            .and_then(|id| self.plane.runs.get_mut(&id))
        else {
            return not_found();
        };
        let expired_start = operation == Operation::Starting
            && matches!(run.status, CpStatus::Leased | CpStatus::Starting)
            && now >= run.offer.lease.expires_at_ms;
        if expired_start || run.status == CpStatus::Superseded {
            // The reference fences an activation ACK by the Run lease (ADR-0013): a `starting`
            // (first or replayed) of a lease that expired gets a 409, whatever the Worker
            // believed of the lease (the fuzz plane's `activation_fenced`); so does every ACK of
            // an offer whose Run was re-delivered under another offer id (its lease is gone),
            // whatever answer the model chose.
            return Outcome::Http(HttpFailure::Status {
                status: 409,
                code: Some(String::from("worker_activation_fenced")),
            });
        }
        let answer = match answer {
            Answer::Ok => consistent(operation, run.status),
            other => other,
        };
        if run.offer.execution_revision.timeout_ms.is_some() && run.deadline.is_none() {
            let timeout = run.offer.execution_revision.timeout_ms.unwrap_or(0);
            run.deadline = Some(now.saturating_add(timeout));
        }
        let (status, shape) = match (operation, answer) {
            (Operation::Starting, Answer::Applied) => {
                run.status = CpStatus::Starting;
                (ActivationStatus::Applied, SnapshotShape::Starting)
            }
            (Operation::Running, Answer::Applied) => {
                run.status = CpStatus::Running;
                run.handle = ExecutorHandle::new(text(v, "executorHandle")).ok();
                run.started_at = Some(now);
                run.callback_sequence = number(v, "callbackSequence");
                (ActivationStatus::Applied, SnapshotShape::Running)
            }
            (_, Answer::Applied) => {
                run.status = CpStatus::StartFailed;
                (ActivationStatus::Applied, SnapshotShape::Terminal)
            }
            (_, Answer::AlreadyStarting) => {
                if run.status == CpStatus::Leased {
                    run.status = CpStatus::Starting;
                }
                (ActivationStatus::AlreadyStarting, SnapshotShape::Starting)
            }
            (_, Answer::AlreadyRunning) => {
                if run.status != CpStatus::Running {
                    run.status = CpStatus::Running;
                    run.handle = ExecutorHandle::new("ql3lp1.elsewhere").ok();
                    run.started_at = Some(now);
                }
                (ActivationStatus::AlreadyRunning, SnapshotShape::Running)
            }
            _ => {
                if !run.status.terminal() {
                    run.status = CpStatus::Cancelled;
                }
                run.terminal_answered = true;
                (ActivationStatus::AlreadyTerminal, SnapshotShape::Terminal)
            }
        };
        let snapshot = snapshot(run, v, shape, now);
        Outcome::Responded(
            ActivationResponse {
                status,
                snapshot,
                shape,
            }
            .to_json(),
        )
    }
}

fn snapshot(run: &CpRun, v: &Value, shape: SnapshotShape, now: UnixMillis) -> ActivationSnapshot {
    let (run_status, attempt_status) = match (shape, run.status) {
        (SnapshotShape::Starting, _) => (RunStatus::Dispatching, AttemptStatus::Starting),
        (SnapshotShape::Running, _) => (RunStatus::Running, AttemptStatus::Running),
        (SnapshotShape::Terminal, CpStatus::StartFailed) => {
            (RunStatus::Failed, AttemptStatus::Failed)
        }
        (SnapshotShape::Terminal, _) => (RunStatus::Cancelled, AttemptStatus::Cancelled),
    };
    let running = shape == SnapshotShape::Running;
    let terminal = shape == SnapshotShape::Terminal;
    ActivationSnapshot {
        run_id: run.offer.candidate.run_id.clone(),
        attempt_id: run.offer.candidate.attempt_id.clone(),
        run_status,
        attempt_status,
        lease_version: LeaseVersion::new(number(v, "expectedLeaseVersion"))
            .unwrap_or(LeaseVersion::FIRST),
        lease_generation: number(v, "leaseGeneration"),
        callback_sequence: run.callback_sequence,
        deadline_at_ms: run.deadline,
        started_at_ms: running.then(|| run.started_at.unwrap_or(now)),
        finished_at_ms: terminal.then_some(now),
        executor_handle: if running {
            run.handle
                .clone()
                .or_else(|| ExecutorHandle::new("ql3lp1.elsewhere").ok())
        } else {
            None
        },
        log_artifact_id: None,
        error_code: terminal.then(|| String::from("cancelled")),
    }
}

/// The value of every Secret the control plane resolves (`no-secret-at-rest` looks for it).
pub(super) const SECRET_VALUE: &str = "sim-secret-value";

impl World {
    fn secrets(&mut self, v: &Value, answer: Answer) -> Outcome {
        let Some(run) = OfferId::new(text(v, "offerId"))
            .ok()
            .and_then(|id| self.plane.runs.get(&id))
        else {
            return not_found();
        };
        let Ok(Some(request)) = SecretsRequest::from_offer(&run.offer) else {
            return not_found();
        };
        let values = request
            .secret_refs
            .iter()
            .map(|r| ResolvedSecret {
                secret_ref: r.clone(),
                value: SecretValue::new(String::from(SECRET_VALUE)),
            })
            .collect();
        let response = SecretsResponse {
            values,
            environment_bundles: Vec::new(),
        };
        let mut answered = request.clone();
        if answer == Answer::Drifted {
            answered.execution_digest = Sha256Digest::of(b"another execution");
        }
        Outcome::Responded(response.to_json(&answered).to_vec())
    }

    fn completion(&mut self, v: &Value, answer: Answer) -> Outcome {
        let Some(run) = OfferId::new(text(v, "offerId"))
            .ok()
            .and_then(|id| self.plane.runs.get_mut(&id))
        else {
            return not_found();
        };
        let Ok(sequence) = CallbackSequence::new(number(v, "callbackSequence")) else {
            return not_found();
        };
        let expected = number(v, "expectedLeaseVersion");
        // The reference's fence: a live lease at exactly the expected version, or an exact
        // replay of the applied completion (which named the version it left one behind).
        let status = match answer {
            Answer::AlreadyTerminal => CompletionStatus::AlreadyTerminal,
            _ if run.completion.is_some() => {
                if run.completed_version != Some(expected) {
                    return fenced(Operation::Completion);
                }
                CompletionStatus::AlreadyCompleted
            }
            _ if run.status.terminal() => CompletionStatus::AlreadyTerminal,
            _ if expected != run.offer.lease.version.get() => {
                return fenced(Operation::Completion);
            }
            _ => CompletionStatus::Applied,
        };
        match status {
            CompletionStatus::Applied => {
                run.completion = Some(sequence);
                run.completed_version = Some(expected);
                run.status = CpStatus::Completed;
                if let Ok(next) = run.offer.lease.version.next() {
                    run.offer.lease.version = next;
                }
            }
            CompletionStatus::AlreadyTerminal => {
                if !run.status.terminal() {
                    run.status = CpStatus::Cancelled;
                }
                run.terminal_answered = true;
            }
            CompletionStatus::AlreadyCompleted => {}
        }
        let response = CompletionResponse {
            status,
            run_id: run.offer.candidate.run_id.clone(),
            attempt_id: run.offer.candidate.attempt_id.clone(),
            callback_sequence: sequence,
        };
        Outcome::Responded(response.to_json())
    }

    fn lease_control(&mut self, now: UnixMillis, v: &Value, answer: Answer) -> Outcome {
        let Some(run) = OfferId::new(text(v, "offerId"))
            .ok()
            .and_then(|id| self.plane.runs.get_mut(&id))
        else {
            return not_found();
        };
        let expected = number(v, "expectedLeaseVersion");
        // The reference fences a stale `expectedLeaseVersion` (a renewal that committed without
        // its answer reaching the Worker leaves the lease one version on), and the renewal of an
        // expired lease (§2.9: "stale session/version/expired lease → 409").
        let lease = &run.offer.lease;
        if !run.status.terminal() && (expected != lease.version.get() || now >= lease.expires_at_ms)
        {
            return fenced(Operation::LeaseControl);
        }
        let mut fence = Fence::from_offer(&run.offer);
        fence.expected_lease_version = LeaseVersion::new(expected).unwrap_or(LeaseVersion::FIRST);
        let request = LeaseControlRequest { fence };
        let answer = match answer {
            Answer::Ok if run.status.terminal() => Answer::Terminal,
            Answer::Ok if run.wants_stop => Answer::StopRequested,
            Answer::Ok => Answer::Renewed,
            other => other,
        };
        let response = if answer == Answer::Terminal {
            if !run.status.terminal() {
                run.status = CpStatus::Cancelled;
            }
            run.terminal_answered = true;
            LeaseControlResponse::Terminal(match run.status {
                CpStatus::Completed => TerminalStatus::Succeeded,
                _ => TerminalStatus::Cancelled,
            })
        } else {
            let version = expected + 1;
            let lease = RenewedLease {
                lease_version: LeaseVersion::new(version).unwrap_or(LeaseVersion::FIRST),
                renewed_at_ms: now,
                expires_at_ms: now.saturating_add(30_000),
            };
            let l = &mut run.offer.lease;
            if version > l.version.get() {
                l.version = lease.lease_version;
                l.renewed_at_ms = now.max(l.renewed_at_ms);
                l.updated_at_ms = l.renewed_at_ms;
                l.expires_at_ms = lease.expires_at_ms;
            }
            if answer == Answer::StopRequested {
                run.wants_stop = true;
                let highest = run.stop_requested_version.unwrap_or(0).max(version);
                run.stop_requested_version = Some(highest);
                let stop = StopRequest {
                    reason: StopReason::Timeout,
                    requested_at_ms: now,
                };
                LeaseControlResponse::StopRequested(lease, stop)
            } else {
                LeaseControlResponse::Renewed(lease)
            }
        };
        Outcome::Responded(response.to_json(&request))
    }

    /// The artifact upload: the bytes the "driver" streams are the spool's.
    pub(super) fn upload(&mut self, header: &[u8], answer: Answer) -> Outcome {
        let header_version = self.header_lease_version.take();
        let mut framed = Vec::with_capacity(header.len() + 4);
        framed.extend_from_slice(&(header.len() as u32).to_be_bytes());
        framed.extend_from_slice(header);
        let Ok((upload, _)) = parse_artifact_preamble(&framed, None) else {
            return Outcome::Http(HttpFailure::Status {
                status: 400,
                code: None,
            });
        };
        let Some(log) = self.disk.logs.get(&upload.log_artifact_id) else {
            return Outcome::LogMissing;
        };
        let Ok(length) = usize::try_from(upload.byte_length) else {
            return Outcome::LogUnavailable;
        };
        let Some(bytes) = log.content.get(..length) else {
            return Outcome::LogUnavailable;
        };
        let sent = Sha256Digest::of(bytes);
        match answer {
            Answer::Fenced => return fenced(Operation::Artifacts),
            Answer::Unavailable => return Outcome::Http(HttpFailure::Unavailable),
            Answer::HttpStatus(status) => {
                return Outcome::Http(HttpFailure::Status { status, code: None });
            }
            _ => {}
        }
        let Some(run) = self.plane.runs.get_mut(&upload.fence.offer_id) else {
            return not_found();
        };
        // The reference authorizes the fence before it takes any content: a live lease at the
        // expected version, or after the completion only an exact replay under its version.
        let expected = upload.fence.expected_lease_version.get();
        let version = header_version.unwrap_or(run.offer.lease.version.get());
        let authorized = if run.completion.is_some() {
            run.completed_version == Some(expected)
        } else {
            !run.status.terminal() && expected == version
        };
        if !authorized {
            return fenced(Operation::Artifacts);
        }
        let entry = (upload.log_artifact_id.clone(), upload.byte_length, sent);
        let index = run
            .uploads
            .iter()
            .position(|(l, n, s, _)| (l, n, s) == (&entry.0, &entry.1, &entry.2));
        let status = match index {
            Some(_) => UploadStatus::AlreadyStored,
            None if answer == Answer::AlreadyDone => UploadStatus::AlreadyStored,
            None => UploadStatus::Stored,
        };
        let heard = !matches!(
            answer,
            Answer::LostAfterCommit | Answer::Invalid | Answer::Garbled | Answer::Truncated
        );
        if self.mutation == Some(super::Mutation::UploadNotStored) {
            // Answered `stored`; nothing reaches the control plane.
            return Outcome::Uploaded {
                body: ArtifactReceipt {
                    status,
                    sha256: sent,
                }
                .to_json(&upload),
                sent_bytes: upload.byte_length,
                sent_sha256: sent,
            };
        }
        match index {
            Some(i) => run.uploads[i].3 |= heard,
            None => run.uploads.push((entry.0, entry.1, entry.2, heard)),
        }
        if answer == Answer::LostAfterCommit {
            return Outcome::Http(HttpFailure::Unavailable);
        }
        let claimed = if answer == Answer::Invalid {
            Sha256Digest::of(b"not what was sent")
        } else {
            sent
        };
        let body = ArtifactReceipt {
            status,
            sha256: claimed,
        }
        .to_json(&upload);
        let outcome = Outcome::Uploaded {
            body,
            sent_bytes: upload.byte_length,
            sent_sha256: sent,
        };
        damaged(outcome, answer)
    }
}
