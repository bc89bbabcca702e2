//! The fuzz host's control plane: fabricates **valid** answers for every Worker-ingress call
//! with the wire types' own `to_json` (so a valid answer always parses), with a variation byte
//! choosing among the valid alternatives (`already_*` statuses, terminal snapshots, stop
//! requests, generation changes…). Faulty answers are made by the host around these.

use std::collections::BTreeMap;

use serde_json::Value;

use ql_worker_core::ids::{
    AttemptId, CallbackSequence, ExecutorHandle, LeaseGeneration, LeaseToken, LeaseVersion,
    OfferId, RunId, SessionId, WorkerGeneration,
};
use ql_worker_core::offer::DeliveryKind;
use ql_worker_core::record::InboxRecord;
use ql_worker_core::revision::{ExecutionRevision, SecretRef};
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::Fence;
use ql_worker_core::wire::activation::{
    ActivationResponse, ActivationSnapshot, ActivationStatus, AttemptStatus, RunStatus,
    SnapshotShape,
};
use ql_worker_core::wire::completion::{CompletionResponse, CompletionStatus};
use ql_worker_core::wire::lease_control::{
    LeaseControlRequest, LeaseControlResponse, RenewedLease, StopReason, StopRequest,
    TerminalStatus,
};
use ql_worker_core::wire::offer::{
    IdleReason, OfferResponse, OfferStats, OfferedLease, OfferedOffer,
};
use ql_worker_core::wire::secrets::{ResolvedSecret, SecretValue, SecretsRequest, SecretsResponse};
use ql_worker_core::wire::session::{
    HEARTBEAT_SCHEMA, REGISTER_SCHEMA, SessionResponse, SessionStatus, TRANSITION_SCHEMA,
};

use super::samples;
use ql_worker_tests::server_wire::{ToJson as _, ToJsonFor as _};

/// Whether the control plane has work for the Worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OfferPolicy {
    /// Every Pull is offered a Run (new or replayed), up to [`MAX_RUNS`].
    Always,
    /// Every Pull is answered idle.
    Never,
    /// The variation byte decides.
    Sometimes,
}

/// Distinct Runs the control plane hands out per fuzz case (bounds the inbox).
pub const MAX_RUNS: u32 = 4;

/// What the control plane remembers of an offer it made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Offered {
    /// Sample number (Run `run-<n>`).
    pub n: u32,
    /// Whether its revision has a Secret binding.
    pub secret: bool,
    /// Whether its revision has a timeout.
    pub timeout: bool,
    /// Lease version last handed out.
    pub lease_version: u64,
    /// When the lease last handed out expires (the control plane's view; renewals happen only
    /// after the starting ACK, so it is exact while [`Self::starting_seen`] is false).
    pub expires_at: UnixMillis,
    /// Whether any activation call (`starting`, `running`, `start-failure`) for this offer
    /// reached the control plane: from then on it cannot know whether the Attempt ran.
    pub starting_seen: bool,
    /// Whether the control plane re-offered this Attempt under another offer id (this offer's
    /// lease is gone; a replay of it gets nothing).
    pub superseded: bool,
}

/// The simulated control plane.
#[derive(Debug)]
pub struct Plane {
    /// The Worker's current Session at the control plane.
    pub session_id: SessionId,
    /// Its status (`transition` sets it; a register of the same Session keeps it, as the
    /// reference does; a new Session id starts `online`).
    pub status: SessionStatus,
    /// Session generation handed out at register.
    pub generation: u64,
    /// Session version.
    pub version: u64,
    /// Offers made, by offer id.
    pub offers: BTreeMap<OfferId, Offered>,
    /// Next sample number.
    pub next_run: u32,
    /// When to offer.
    pub policy: OfferPolicy,
    /// Secret values handed out (the host checks none reaches the disk).
    pub secret_values: Vec<String>,
    /// The four sample revisions (Secret × timeout), sealed once.
    revisions: [ExecutionRevision; 4],
    /// A lie for the simulation's self-test: a new Session is registered `draining`.
    pub new_sessions_draining: bool,
    /// Re-delivery (`SimOptions::reoffers`): a fresh claim may be answered with an existing
    /// Run whose lease expired before any activation call reached the control plane — the same
    /// Run and Attempt under the new offer id (`docs/simulation.md`, at-most-once).
    pub reoffers: bool,
    /// Re-deliveries made.
    pub redelivered: u32,
    /// The highest sample number handed out ([`MAX_RUNS`]).
    pub max_runs: u32,
}

/// A string field of a request body.
#[must_use]
pub fn text<'a>(body: &'a Value, key: &str) -> &'a str {
    body.get(key).and_then(Value::as_str).unwrap_or("")
}

/// An integer field of a request body.
#[must_use]
pub fn number(body: &Value, key: &str) -> u64 {
    body.get(key).and_then(Value::as_u64).unwrap_or(0)
}

fn later(now: UnixMillis, ms: u64) -> UnixMillis {
    samples::ms(now.get().saturating_add(ms))
}

impl Plane {
    /// A control plane at generation [`samples::GENERATION`].
    #[must_use]
    pub fn new(policy: OfferPolicy) -> Self {
        Self {
            session_id: samples::worker().session_id,
            status: SessionStatus::Online,
            generation: samples::GENERATION,
            version: 0,
            offers: BTreeMap::new(),
            next_run: 1,
            policy,
            secret_values: Vec::new(),
            revisions: [
                samples::revision(false, false),
                samples::revision(false, true),
                samples::revision(true, false),
                samples::revision(true, true),
            ],
            new_sessions_draining: false,
            reoffers: false,
            redelivered: 0,
            max_runs: MAX_RUNS,
        }
    }

    /// The sample revision with or without a Secret and a timeout.
    #[must_use]
    pub fn revision(&self, secret: bool, timeout: bool) -> &ExecutionRevision {
        &self.revisions[usize::from(secret) * 2 + usize::from(timeout)]
    }

    /// `register`, `heartbeat` or `transition` of Session `session` (the route's).
    pub fn session(
        &mut self,
        op: &str,
        session: &SessionId,
        body: &Value,
        now: UnixMillis,
        v: u8,
    ) -> Vec<u8> {
        let worker = samples::worker_at(self.generation);
        let mut response = SessionResponse {
            worker_id: worker.worker_id,
            session_id: session.clone(),
            generation: worker.generation,
            version: number(body, "expectedVersion").saturating_add(1),
            status: self.status,
            lease_expires_at_ms: later(now, number(body, "leaseDurationMs").max(5_000)),
            replaced_session: None,
        };
        let schema = match op {
            "register" => {
                let replaced = *session != self.session_id;
                // A new Session id replaces the old one; an offline Session starts a new
                // generation; the same Session keeps its status (a draining one stays draining).
                if replaced || self.status == SessionStatus::Offline || v % 8 == 6 {
                    self.generation += 1;
                }
                if replaced || self.status == SessionStatus::Offline {
                    self.status = if replaced && self.new_sessions_draining {
                        SessionStatus::Draining
                    } else {
                        SessionStatus::Online
                    };
                }
                self.session_id = session.clone();
                response.status = self.status;
                response.generation =
                    WorkerGeneration::new(self.generation).unwrap_or(response.generation);
                self.version += 1;
                response.version = self.version;
                response.replaced_session = Some(replaced || v % 8 == 5);
                if v % 8 == 7 {
                    response.lease_expires_at_ms = later(now, 1);
                }
                REGISTER_SCHEMA
            }
            "heartbeat" => {
                response.generation = WorkerGeneration::new(number(body, "generation"))
                    .unwrap_or(response.generation);
                // A heartbeat answer is never `offline` (the plane would fence it instead; the
                // valid answer the fuzz plane can give is the online one).
                if v % 4 == 3 || self.status == SessionStatus::Draining {
                    response.status = SessionStatus::Draining;
                } else {
                    response.status = SessionStatus::Online;
                }
                HEARTBEAT_SCHEMA
            }
            _ => {
                response.generation = WorkerGeneration::new(number(body, "generation"))
                    .unwrap_or(response.generation);
                response.status = if text(body, "status") == "offline" {
                    SessionStatus::Offline
                } else {
                    SessionStatus::Draining
                };
                if *session == self.session_id {
                    self.status = response.status;
                }
                TRANSITION_SCHEMA
            }
        };
        self.version = self.version.max(response.version);
        response.to_json(schema)
    }

    /// `offers` of Session `session`: idle, a new Run, or the replay of the offer made for this
    /// offer id. A Session that is not the current online one gets nothing.
    pub fn offers(&mut self, session: &SessionId, body: &Value, now: UnixMillis, v: u8) -> Vec<u8> {
        let idle = OfferResponse::Idle {
            reason: IdleReason::NoCandidates,
            stats: OfferStats::default(),
            truncated: false,
        };
        if *session != self.session_id || self.status != SessionStatus::Online {
            return OfferResponse::Idle {
                reason: IdleReason::WorkerUnavailable,
                stats: OfferStats::default(),
                truncated: false,
            }
            .to_json();
        }
        let Ok(offer_id) = OfferId::new(text(body, "offerId")) else {
            return idle.to_json();
        };
        let expires = if v & 16 != 0 { 1_000 } else { 30_000 };
        let redeliverable = self
            .offers
            .iter()
            .find(|(_, o)| !o.starting_seen && !o.superseded && o.expires_at <= now)
            .map(|(id, _)| id.clone());
        let offer = match (self.offers.get(&offer_id).copied(), self.policy) {
            (Some(known), _) if known.superseded => return idle.to_json(),
            (Some(known), _) => known,
            (None, OfferPolicy::Always | OfferPolicy::Sometimes)
                if self.reoffers && redeliverable.is_some() =>
            {
                // The lease of an unstarted Attempt expired: the control plane hands the same
                // Run and Attempt out again under the new offer id; the old lease is gone.
                let old = redeliverable.unwrap_or_else(|| offer_id.clone());
                let Some(previous) = self.offers.get_mut(&old) else {
                    return idle.to_json();
                };
                previous.superseded = true;
                self.redelivered += 1;
                Offered {
                    lease_version: 0,
                    starting_seen: false,
                    superseded: false,
                    ..*previous
                }
            }
            (None, OfferPolicy::Never) => return idle.to_json(),
            (None, OfferPolicy::Sometimes) if v & 1 == 1 => return idle.to_json(),
            (None, _) if self.next_run > self.max_runs => return idle.to_json(),
            (None, _) => {
                let made = Offered {
                    n: self.next_run,
                    secret: v & 2 == 0,
                    timeout: v & 4 == 0,
                    lease_version: 0,
                    expires_at: now,
                    starting_seen: false,
                    superseded: false,
                };
                self.next_run += 1;
                made
            }
        };
        let mut offer = offer;
        if v & 8 != 0 {
            offer.lease_version += 1;
        }
        offer.expires_at = later(now, expires);
        self.offers.insert(offer_id.clone(), offer);
        let Ok(token) = LeaseToken::new(text(body, "leaseToken")) else {
            return idle.to_json();
        };
        let mut worker = samples::worker_at(number(body, "workerGeneration"));
        worker.session_id = session.clone();
        let full = samples::offer_with(
            offer.n,
            offer_id.clone(),
            worker.clone(),
            token,
            self.revision(offer.secret, offer.timeout).clone(),
            (offer.lease_version, now, later(now, expires)),
        );
        let offered = OfferedOffer {
            offer_id,
            delivery_kind: if v & 32 != 0 {
                DeliveryKind::LeaseRecovery
            } else {
                DeliveryKind::NewClaim
            },
            execution_digest: full.execution_digest,
            candidate: full.candidate,
            worker,
            lease: OfferedLease {
                version: full.lease.version,
                lease_generation: full.lease.lease_generation,
                acquired_at_ms: now,
                renewed_at_ms: now,
                expires_at_ms: full.lease.expires_at_ms,
                updated_at_ms: now,
            },
            execution_revision: full.execution_revision,
            placement_score: 0,
        };
        OfferResponse::Offered {
            offer: Box::new(offered),
            stats: OfferStats::default(),
            truncated: false,
        }
        .to_json()
    }

    /// An activation call for `offer` reached the control plane.
    pub fn activation_seen(&mut self, offer: &OfferId) {
        if let Some(o) = self.offers.get_mut(offer) {
            o.starting_seen = true;
        }
    }

    /// Whether a `starting` ACK for `offer` is fenced at `now`: the offer was re-offered under
    /// another offer id, or its lease expired before any activation call reached the plane.
    #[must_use]
    pub fn activation_fenced(&self, offer: &OfferId, now: UnixMillis) -> bool {
        self.offers
            .get(offer)
            .is_some_and(|o| o.superseded || (!o.starting_seen && o.expires_at <= now))
    }

    /// `starting`, `running` or `start-failure` for `record`.
    #[must_use]
    pub fn activation(
        &self,
        op: &str,
        body: &Value,
        record: &InboxRecord,
        now: UnixMillis,
        v: u8,
    ) -> Vec<u8> {
        let expected = number(body, "expectedLeaseVersion");
        let timeout = record.offer.execution_revision.timeout_ms.is_some();
        let (status, shape, version) = match (op, v % 8) {
            ("starting", 1) => (
                ActivationStatus::AlreadyStarting,
                SnapshotShape::Starting,
                0,
            ),
            ("starting", 4) => (ActivationStatus::AlreadyRunning, SnapshotShape::Running, 0),
            ("starting", 5) => (
                ActivationStatus::AlreadyTerminal,
                SnapshotShape::Terminal,
                0,
            ),
            ("starting", 6) => (ActivationStatus::Applied, SnapshotShape::Starting, 1),
            ("starting", _) => (ActivationStatus::Applied, SnapshotShape::Starting, 0),
            ("running", 1 | 5) => (ActivationStatus::AlreadyRunning, SnapshotShape::Running, 0),
            ("running", 2) => (
                ActivationStatus::AlreadyTerminal,
                SnapshotShape::Terminal,
                0,
            ),
            ("running", 3) => (ActivationStatus::Applied, SnapshotShape::Starting, 0),
            ("running", _) => (ActivationStatus::Applied, SnapshotShape::Running, 0),
            (_, 1) => (
                ActivationStatus::AlreadyTerminal,
                SnapshotShape::Terminal,
                1,
            ),
            (_, 2) => (ActivationStatus::AlreadyRunning, SnapshotShape::Running, 1),
            (_, _) => (ActivationStatus::Applied, SnapshotShape::Terminal, 1),
        };
        let deadline = (timeout != (op == "starting" && v % 8 == 7)).then(|| later(now, 5_000));
        let started = record.executor_started_at_ms.unwrap_or(now);
        let running = shape == SnapshotShape::Running;
        let terminal = shape == SnapshotShape::Terminal;
        let handle = text(body, "executorHandle");
        let snapshot = ActivationSnapshot {
            run_id: RunId::new(text(body, "runId")).unwrap_or(record.offer.lease.run_id.clone()),
            attempt_id: AttemptId::new(text(body, "attemptId"))
                .unwrap_or(record.offer.lease.attempt_id.clone()),
            run_status: match shape {
                SnapshotShape::Starting => RunStatus::Dispatching,
                SnapshotShape::Running => RunStatus::Running,
                SnapshotShape::Terminal => RunStatus::Failed,
            },
            attempt_status: match shape {
                SnapshotShape::Starting => AttemptStatus::Starting,
                SnapshotShape::Running => AttemptStatus::Running,
                SnapshotShape::Terminal => AttemptStatus::Failed,
            },
            lease_version: LeaseVersion::new(expected.saturating_add(version))
                .unwrap_or(LeaseVersion::FIRST),
            lease_generation: number(body, "leaseGeneration"),
            callback_sequence: if v % 16 == 15 { (1 << 31) - 1 } else { 0 },
            deadline_at_ms: deadline,
            started_at_ms: running.then_some(started),
            finished_at_ms: terminal.then_some(now),
            executor_handle: running.then(|| {
                ExecutorHandle::new(if handle.is_empty() {
                    "ql3lp1.other"
                } else {
                    handle
                })
                .unwrap_or_else(|_| samples::handle(0))
            }),
            log_artifact_id: None,
            error_code: terminal.then(|| String::from("start_failed")),
        };
        ActivationResponse {
            status,
            snapshot,
            shape,
        }
        .to_json()
    }

    /// `secrets` for `record`; `None` when the revision names no Secret.
    pub fn secrets(&mut self, record: &InboxRecord, v: u8) -> Option<Vec<u8>> {
        let request = SecretsRequest::from_offer(&record.offer).ok().flatten()?;
        let value = if v % 4 == 1 {
            String::from("bad\0value")
        } else {
            format!("s3cr3t-value-{:04}", self.secret_values.len())
        };
        self.secret_values.push(value.clone());
        let values = request
            .secret_refs
            .iter()
            .map(|r: &SecretRef| ResolvedSecret {
                secret_ref: r.clone(),
                value: SecretValue::new(value.clone()),
            })
            .collect();
        let response = SecretsResponse {
            values,
            environment_bundles: vec![],
        };
        Some(response.to_json(&request).to_vec())
    }

    /// `completion`.
    #[must_use]
    pub fn completion(body: &Value, v: u8) -> Option<Vec<u8>> {
        let status = match v % 4 {
            1 => CompletionStatus::AlreadyCompleted,
            2 => CompletionStatus::AlreadyTerminal,
            _ => CompletionStatus::Applied,
        };
        let response = CompletionResponse {
            status,
            run_id: RunId::new(text(body, "runId")).ok()?,
            attempt_id: AttemptId::new(text(body, "attemptId")).ok()?,
            callback_sequence: CallbackSequence::new(number(body, "callbackSequence")).ok()?,
        };
        Some(response.to_json())
    }

    /// `lease-control` for `record`.
    #[must_use]
    pub fn lease_control(
        body: &Value,
        record: &InboxRecord,
        now: UnixMillis,
        v: u8,
    ) -> Option<Vec<u8>> {
        let mut fence = Fence::from_offer(&record.offer);
        fence.expected_lease_version =
            LeaseVersion::new(number(body, "expectedLeaseVersion")).ok()?;
        fence.lease_generation = LeaseGeneration::new(number(body, "leaseGeneration")).ok()?;
        let lease = RenewedLease {
            lease_version: fence.expected_lease_version.next().ok()?,
            renewed_at_ms: now,
            expires_at_ms: later(now, if v % 8 == 5 { 1 } else { 30_000 }),
        };
        let response = match v % 8 {
            3 => LeaseControlResponse::StopRequested(
                lease,
                StopRequest {
                    reason: StopReason::Policy,
                    requested_at_ms: now,
                },
            ),
            4 => LeaseControlResponse::Terminal(TerminalStatus::Cancelled),
            _ => LeaseControlResponse::Renewed(lease),
        };
        Some(response.to_json(&LeaseControlRequest { fence }))
    }
}
