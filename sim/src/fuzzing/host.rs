//! The fuzz host: an in-memory stand-in for the driver (file authority, spool, supervisor,
//! HTTPS client and control plane) that answers every [`Action`] — validly, with a fault, or
//! not at all (a crash) as the fuzz input decides — and checks the Worker's safety invariants
//! on every command it receives ([`Host::on_command`]) and on the durable state after every
//! step ([`Host::check_state`]).
//!
//! Durable state survives crashes: records and the claim are kept as **envelope bytes** (so
//! every write is encoded, scanned for secrets and decoded again on every read), receipts,
//! logs and live processes. The [`Ghost`] holds what only the host knows.

use std::collections::BTreeMap;

use serde_json::Value;

use ql_worker_core::capability::{ENTROPY_BYTES, Entropy};
use ql_worker_core::claim::PendingClaim;
use ql_worker_core::envelope;
use ql_worker_core::ids::{AttemptId, LogArtifactId, OfferId, Revision, Sha256Digest};
use ql_worker_core::io::{
    Action, HttpCall, HttpFailure, LaunchPlan, Liveness, Outcome, ReceiptRead, SpawnOutcome,
    StopOutcome, StoreFailure,
};
use ql_worker_core::listing::{PageLimit, page};
use ql_worker_core::receipt::{Receipt, ReceiptToken};
use ql_worker_core::record::{InboxRecord, RecoveryReason, State};
use ql_worker_core::time::{Now, UnixMillis};
use ql_worker_core::wire::artifact::{ArtifactReceipt, ArtifactUpload, UploadStatus};
use ql_worker_core::wire::route::Operation;
use ql_worker_core::worker::Worker;

use super::bytes::Bytes;
use super::plane::{self, Plane};
use super::samples;
use crate::testkit::world::Lie;
use crate::testkit::world::check::{self, Ghost, License, SpawnFate, licenses_session_halt};
use ql_worker_tests::server_wire::{ToJsonFor as _, parse_route};

/// A spool file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Log {
    /// Bytes captured.
    pub len: u64,
    /// The truncation fact (`None`: missing, i.e. unknown).
    pub truncated: Option<bool>,
}

impl Log {
    /// The deterministic content of a log of `len` bytes.
    #[must_use]
    pub fn content(len: u64) -> Vec<u8> {
        (0..len)
            .map(|i| b'a' + u8::try_from(i % 26).unwrap_or(0))
            .collect()
    }

    /// The SHA-256 of [`Log::content`] of `len` bytes.
    #[must_use]
    pub fn digest(len: u64) -> Sha256Digest {
        Sha256Digest::of(&Self::content(len))
    }
}

/// A user process started by the supervisor.
#[derive(Debug)]
pub struct Process {
    /// The `launching` record it was started from (its barrier fields).
    pub launching: InboxRecord,
    /// The raw capability the supervisor writes into the receipt.
    pub capability: [u8; 32],
    /// Its durable handle.
    pub handle: String,
    /// Still running.
    pub alive: bool,
}

/// How the host answers one command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Perform it and answer the truth.
    Valid,
    /// Answer a fault (the number picks which one for this kind of action).
    Fault(u8),
}

/// The answer to one command.
#[derive(Debug)]
pub struct Answer {
    /// What to feed back.
    pub outcome: Outcome,
    /// Which halts it licenses.
    pub license: License,
}

impl Answer {
    /// `outcome`, licensing no halt.
    #[must_use]
    pub fn unlicensed(outcome: Outcome) -> Self {
        Self::new(outcome)
    }

    fn new(outcome: Outcome) -> Self {
        Self {
            outcome,
            license: License::default(),
        }
    }
}

/// The fuzz host.
#[derive(Debug)]
pub struct Host {
    /// The true time, the control plane's clock (never goes back).
    pub now: UnixMillis,
    /// How far this host's wall clock is off the true time (clock-step faults): the Worker's
    /// wall readings and the supervisors' timestamps are `now + wall_skew` (at least 0); its
    /// monotonic readings never see it (see [`Host::clock`]).
    pub wall_skew: i64,
    /// When the Worker sent the control-plane call being performed (the true time of its
    /// emission), and, per lease granted (offer and lease version), how long the call that
    /// granted it had been on its way when the control plane granted it: the Worker times a
    /// lease from the sending of that call, so its local deadline is the plane's expiry less
    /// this.
    pub call_sent_at: Option<UnixMillis>,
    /// See [`Host::call_sent_at`].
    pub lease_slack: BTreeMap<(OfferId, u64), u64>,
    /// Inbox records: the envelope as written and the value it decoded to.
    pub records: BTreeMap<OfferId, (Vec<u8>, InboxRecord)>,
    /// The pending claim as an envelope.
    pub claim: Option<Vec<u8>>,
    /// The stored Session id (the driver's `<root>/session`): a restarted Worker uses it.
    pub session_id: ql_worker_core::ids::SessionId,
    /// Completion receipts by attempt.
    pub receipts: BTreeMap<AttemptId, Receipt>,
    /// Spool files.
    pub logs: BTreeMap<LogArtifactId, Log>,
    /// Processes ever started.
    pub processes: Vec<Process>,
    /// The control plane.
    pub plane: Plane,
    /// The host's private knowledge.
    pub ghost: Ghost,
    /// A deliberate lie (self-test only).
    pub lie: Option<Lie>,
    /// The control plane ends every Run without a receipt on disk (`terminal` on lease
    /// control): its own Run timeout (simulation liveness phase only).
    pub plane_timeout: bool,
    draws: u64,
}

fn store(failure: StoreFailure) -> Answer {
    let license = License {
        uncertain: failure == StoreFailure::Uncertain,
        unrecorded: false,
        conflict: failure == StoreFailure::Conflict,
        unsafe_storage: failure == StoreFailure::Unsafe,
        session: false,
    };
    Answer {
        outcome: Outcome::Store(failure),
        license,
    }
}

/// The write failures, by fault number; `true` when an uncertain write lands anyway.
fn write_fault(f: u8) -> (StoreFailure, bool) {
    match f % 6 {
        0 => (StoreFailure::Unchanged, false),
        1 => (StoreFailure::Uncertain, false),
        2 => (StoreFailure::Uncertain, true),
        3 => (StoreFailure::Conflict, false),
        4 => (StoreFailure::CapacityExhausted, false),
        _ => (StoreFailure::Unsafe, false),
    }
}

fn read_fault(f: u8) -> StoreFailure {
    if f.is_multiple_of(2) {
        StoreFailure::Unchanged
    } else {
        StoreFailure::Unsafe
    }
}

impl Host {
    /// This host's wall clock: the true time off by [`Host::wall_skew`].
    #[must_use]
    pub fn local_wall(&self) -> UnixMillis {
        crate::clock::wall(self.now, self.wall_skew)
    }

    /// The Worker's two readings: the skewed wall clock and the monotonic clock.
    #[must_use]
    pub fn clock(&self) -> Now {
        crate::clock::reading(self.now, self.wall_skew)
    }

    /// A host at `now` with an empty store and `plane`.
    #[must_use]
    pub fn new(now: UnixMillis, plane: Plane) -> Self {
        Self {
            now,
            wall_skew: 0,
            call_sent_at: None,
            lease_slack: BTreeMap::new(),
            records: BTreeMap::new(),
            claim: None,
            session_id: samples::worker().session_id,
            receipts: BTreeMap::new(),
            logs: BTreeMap::new(),
            processes: Vec::new(),
            plane,
            ghost: Ghost::default(),
            lie: None,
            plane_timeout: false,
            draws: 0,
        }
    }

    /// The durable record of `offer_id` (decoded once, when written).
    #[must_use]
    pub fn record(&self, offer_id: &OfferId) -> Option<InboxRecord> {
        self.records.get(offer_id).map(|(_, record)| record.clone())
    }

    /// Every durable record, ascending.
    #[must_use]
    pub fn all_records(&self) -> Vec<InboxRecord> {
        self.records
            .values()
            .map(|(_, record)| record.clone())
            .collect()
    }

    /// The record of `attempt`: the one past the spawn barrier when a re-delivered Attempt
    /// has two records (only one of them can ever have launched).
    fn record_of_attempt(&self, attempt: &AttemptId) -> Option<InboxRecord> {
        let mut of = self
            .all_records()
            .into_iter()
            .filter(|r| r.offer.candidate.attempt_id == *attempt);
        let first = of.next()?;
        Some(
            std::iter::once(first.clone())
                .chain(of)
                .find(|r| r.executor_started_at_ms.is_some())
                .unwrap_or(first),
        )
    }

    fn stored_claim(&self) -> Option<PendingClaim> {
        self.claim.as_ref().map(|bytes| {
            envelope::decode(bytes)
                .unwrap_or_else(|e| panic!("INVARIANT durable-decode: claim: {e}"))
        })
    }

    /// Stores a record durably (encode, scan, keep the bytes).
    pub fn put_record(&mut self, record: &InboxRecord) {
        if let Some(digest) = &record.completion_receipt_token_digest {
            self.ghost.capability_of(digest.expose());
        }
        let bytes = envelope::encode(record)
            .unwrap_or_else(|e| panic!("INVARIANT persist-valid: record does not encode: {e}"));
        self.ghost.check_no_secret("a persisted record", &bytes);
        let decoded: InboxRecord = envelope::decode(&bytes)
            .unwrap_or_else(|e| panic!("INVARIANT durable-decode: a written record: {e}"));
        assert_eq!(
            &decoded, record,
            "INVARIANT durable-decode: record round trip"
        );
        self.records
            .insert(record.offer.offer_id.clone(), (bytes.to_vec(), decoded));
    }

    /// Stores the claim durably.
    pub fn put_claim(&mut self, claim: &PendingClaim) {
        let bytes = envelope::encode(claim)
            .unwrap_or_else(|e| panic!("INVARIANT persist-valid: claim does not encode: {e}"));
        self.ghost.check_no_secret("the persisted claim", &bytes);
        self.claim = Some(bytes.to_vec());
    }

    /// Invariants on a command as the Worker emits it (before the host performs it).
    pub fn on_command(&mut self, action: &Action, worker: &Worker) {
        match action {
            Action::PersistRecord { expected, record } => {
                let offer = &record.offer.offer_id;
                let stored = self.record(offer).map(|r| r.state);
                if record.state == State::RecoveryRequired
                    && stored != Some(State::RecoveryRequired)
                {
                    // A lease the Worker holds no local deadline for is judged by its wall
                    // clock (the highest reading it was fed): one that was set ahead of the
                    // true time sees it expired early (a restart, or a retried claim's offer,
                    // while the clock is or was ahead; `LeaseClock`).
                    if !worker.times_lease(offer)
                        && let Some(reason) = record.recovery_reason
                        && record.offer.lease.expired_at(worker.clock_reading().wall)
                    {
                        self.ghost.cause(offer, reason);
                    }
                    let slack = self.slack(record);
                    self.ghost.check_recovery(record, self.now, slack);
                }
                self.check_persist(*expected, record);
                self.ghost.written.insert(offer.clone(), record.state);
            }
            Action::PersistClaim { expected, claim } => {
                // A claim write comes before every `offers` request (a Pull that only settles a
                // claim whose offer is stored, while the inbox is full, writes none).
                let capacity = worker.inbox_status().capacity;
                assert!(
                    check::pull_with_room(self.records.len(), capacity),
                    "INVARIANT pull-with-room: a Pull with {} records in an inbox of {capacity}",
                    self.records.len()
                );
                self.check_claim(*expected, claim);
            }
            Action::ClearClaim { offer_id, revision } => {
                let stored = self.stored_claim();
                if let Err(detail) = check::claim_clear(stored.as_ref(), offer_id, *revision) {
                    panic!("INVARIANT claim-cas: {detail}");
                }
            }
            Action::ReadClaim => {
                self.ghost.check_pull(worker.fail_closed().is_some());
                if let Some(record) = check::fail_closed_by(self.records.values().map(|(_, r)| r)) {
                    panic!(
                        "INVARIANT fail-closed-no-pull: a Pull starts while {} is durably \
                         recovery_required",
                        record.offer.offer_id
                    );
                }
            }
            Action::RemoveReceipt { attempt_id } => {
                let state = self.record_of_attempt(attempt_id).map(|r| r.state);
                assert!(
                    check::receipt_removable(state),
                    "INVARIANT receipt-removed-after-acknowledged: receipt of {attempt_id} \
                     removed while the record is {state:?}"
                );
            }
            Action::UploadLog {
                log_artifact_id,
                header,
                ..
            } => self.check_upload(log_artifact_id, header),
            Action::Spawn(plan) => {
                assert!(
                    worker.fail_closed().is_none(),
                    "INVARIANT fail-closed: a spawn while the Worker is fail-closed"
                );
                let stored = self.record(&plan.offer_id);
                self.ghost.check_spawn(plan, stored.as_ref());
            }
            Action::Stop { handle } => assert!(
                self.ghost.handles.contains(handle.as_str()),
                "INVARIANT stop-known-handle: stop of a handle the supervisor never issued"
            ),
            Action::Post(call) => {
                self.check_post(call, worker);
                self.note_completion(call);
            }
            Action::PersistSession { .. } => self.check_renewal(),
            Action::ListInbox { .. }
            | Action::ReadRecord { .. }
            | Action::ReadReceipt { .. }
            | Action::AllocateLog { .. }
            | Action::InspectLog { .. }
            | Action::InspectSupervision { .. }
            | Action::ReadPublishedHandle { .. }
            | Action::DrawEntropy => {}
        }
    }

    /// Remembers the exit code a completion reports (for the simulation's outcome counts).
    fn note_completion(&mut self, call: &HttpCall) {
        if !parse_route(&call.path).is_ok_and(|r| r.operation == Operation::Completion) {
            return;
        }
        let body: Value = serde_json::from_slice(&call.body).unwrap_or(Value::Null);
        let offer = OfferId::new(plane::text(&body, "offerId"));
        let exit = body.get("result").and_then(|r| r.get("exitCode"));
        if let (Ok(offer), Some(exit)) = (offer, exit.and_then(Value::as_u64)) {
            self.ghost.completion_exit.insert(offer, exit);
        }
    }

    /// Licenses `launch_outcome_unknown` for every record durably `launching`: a crash, halt,
    /// stop or fault now may leave the Worker unable to know whether its process started.
    pub fn launch_uncertain(&mut self) {
        let launching: Vec<OfferId> = self
            .records
            .values()
            .filter(|(_, r)| r.state == State::Launching)
            .map(|(_, r)| r.offer.offer_id.clone())
            .collect();
        for offer in launching {
            self.ghost
                .cause(&offer, RecoveryReason::LaunchOutcomeUnknown);
        }
    }

    /// Licenses the recovery reasons an answer about `offer` leads to: the control plane said
    /// the Run is already running elsewhere, or terminal.
    fn note_plane_answer(&mut self, offer: &OfferId, outcome: &Outcome) {
        if let Outcome::Responded(bytes) = outcome {
            for reason in check::answer_causes(bytes) {
                self.ghost.cause(offer, reason);
            }
        }
    }

    /// A new Session replaces the stored one only under [`check::renewal`]'s rules.
    fn check_renewal(&self) {
        let holds = self.plane.session_id == self.session_id;
        let records = self.records.values().map(|(_, r)| r);
        if let Some(v) = check::renewal(self.plane.status, holds, &self.session_id, records) {
            panic!("INVARIANT {}: {}", v.invariant, v.detail);
        }
    }

    fn check_persist(&self, expected: Option<Revision>, record: &InboxRecord) {
        let stored = self.record(&record.offer.offer_id);
        if let Err(detail) = check::record_write(expected, stored.as_ref(), record) {
            panic!("INVARIANT persist-valid: {detail}");
        }
    }

    fn check_claim(&self, expected: Option<Revision>, proposed: &PendingClaim) {
        let stored = self.stored_claim();
        if let Err(detail) = check::claim_write(expected, stored.as_ref(), proposed) {
            panic!("INVARIANT claim-cas: {detail}");
        }
    }

    fn check_upload(&self, log: &LogArtifactId, header: &[u8]) {
        self.ghost.check_no_secret("an upload header", header);
        let record = self
            .all_records()
            .into_iter()
            .find(|r| r.log_artifact_id.as_ref() == Some(log));
        let Some(record) = record else {
            panic!("INVARIANT upload-known-log: upload of a log no record names");
        };
        let attempt = &record.offer.candidate.attempt_id;
        assert!(
            check::receipt_authenticated(self.ghost.genuine.get(attempt).copied()),
            "INVARIANT receipt-authenticated: upload for {attempt} without a genuine receipt"
        );
    }

    fn check_post(&self, call: &HttpCall, worker: &Worker) {
        assert!(
            check::request_within_cap(call),
            "INVARIANT request-cap: body above its cap"
        );
        self.ghost.check_no_secret("a request body", &call.body);
        let route = parse_route(&call.path)
            .unwrap_or_else(|e| panic!("INVARIANT route: {}: {e}", call.path));
        let body: Value = serde_json::from_slice(&call.body)
            .unwrap_or_else(|_| panic!("INVARIANT request-json: {} body", call.path));
        let offer = OfferId::new(plane::text(&body, "offerId")).ok();
        match (route.operation, offer) {
            (Operation::Offers, Some(offer)) => {
                let claim = self.stored_claim();
                let token = plane::text(&body, "leaseToken");
                assert!(
                    check::claim_durable(claim.as_ref(), &offer, token),
                    "INVARIANT claim-before-pull: offers POST without its durable claim"
                );
            }
            (Operation::StartFailure, Some(offer)) => {
                let alive = self
                    .processes
                    .iter()
                    .any(|p| p.alive && p.launching.offer.offer_id == offer);
                self.ghost.check_start_failure(&offer, alive);
            }
            (Operation::Starting, Some(_)) => {
                assert!(
                    worker.fail_closed().is_none() && !self.ghost.drain_requested,
                    "INVARIANT fail-closed: a starting ACK while fail-closed or draining"
                );
            }
            (Operation::Completion, Some(offer)) => self.check_completion(&offer, &body),
            (Operation::Register | Operation::Heartbeat | Operation::Transition, _) => {}
            (op, None) => panic!("INVARIANT request-json: {} without an offerId", op.as_str()),
            (Operation::Running, Some(offer)) => {
                let stored = self.record(&offer);
                let handle = plane::text(&body, "executorHandle");
                assert!(
                    check::running_ack_allowed(stored.as_ref(), handle),
                    "INVARIANT running-ack-after-started: running ACK of {offer} while the \
                     durable record is {:?}",
                    stored.as_ref().map(|r| r.state)
                );
            }
            (Operation::Secrets | Operation::LeaseControl, Some(_)) => {}
            (op @ (Operation::Artifacts | Operation::Attestations), _) => {
                panic!("INVARIANT route: {} is not a JSON call", op.as_str())
            }
        }
    }

    fn check_completion(&self, offer: &OfferId, body: &Value) {
        let uploaded = self.ghost.uploaded.get(offer);
        let heard = uploaded.map(|(length, sha)| (None, *length, sha));
        assert!(
            check::upload_heard(body, heard),
            "INVARIANT upload-first: completion for {offer} without a matching valid upload"
        );
        let attempt = plane::text(body, "attemptId");
        let genuine = AttemptId::new(attempt)
            .ok()
            .and_then(|a| self.ghost.genuine.get(&a).copied());
        assert!(
            check::receipt_authenticated(genuine),
            "INVARIANT receipt-authenticated: completion without a genuine receipt"
        );
    }

    /// State invariants after every step.
    pub fn check_state(&self) {
        for (_, record) in self.records.values() {
            self.ghost.check_record(record);
        }
    }

    /// Performs `action` in `mode`, checking `logs-kept` across it ([`check::logs_kept`]).
    pub fn perform(&mut self, action: Action, mode: Mode, r: &mut Bytes<'_>) -> Answer {
        let before: Vec<(LogArtifactId, u64)> = self
            .logs
            .iter()
            .map(|(id, l)| (id.clone(), l.len))
            .collect();
        let answer = self.perform_unchecked(action, mode, r);
        if let Some(v) = check::logs_kept(&before, |id| self.logs.get(id).map(|l| l.len)).first() {
            panic!("INVARIANT {}: {}", v.invariant, v.detail);
        }
        answer
    }

    fn perform_unchecked(&mut self, action: Action, mode: Mode, r: &mut Bytes<'_>) -> Answer {
        match action {
            Action::ListInbox { after, limit } => self.list(after, limit, mode),
            Action::ReadRecord { offer_id } => match mode {
                Mode::Fault(f) => store(read_fault(f)),
                Mode::Valid => {
                    Answer::new(Outcome::RecordRead(self.record(&offer_id).map(Box::new)))
                }
            },
            Action::PersistRecord { record, .. } => self.persist_record(*record, mode),
            Action::ReadClaim => match mode {
                Mode::Fault(f) => store(read_fault(f)),
                Mode::Valid => Answer::new(Outcome::ClaimRead(self.stored_claim().map(Box::new))),
            },
            Action::PersistClaim { claim, .. } => self.write(mode, |h| h.put_claim(&claim)),
            Action::ClearClaim { .. } => self.write(mode, |h| h.claim = None),
            Action::ReadReceipt { attempt_id } => self.read_receipt(&attempt_id, mode),
            Action::RemoveReceipt { attempt_id } => match mode {
                Mode::Fault(_) => store(StoreFailure::Unchanged),
                Mode::Valid => Answer::new(Outcome::ReceiptRemoved {
                    existed: self.receipts.remove(&attempt_id).is_some(),
                }),
            },
            Action::AllocateLog { log_artifact_id } => match mode {
                Mode::Fault(_) => Answer::new(Outcome::LogUnavailable),
                Mode::Valid => {
                    self.logs.entry(log_artifact_id).or_insert(Log {
                        len: 0,
                        truncated: None,
                    });
                    Answer::new(Outcome::LogAllocated)
                }
            },
            Action::InspectLog { log_artifact_id } => match (mode, self.logs.get(&log_artifact_id))
            {
                (Mode::Fault(_), _) => Answer::new(Outcome::LogUnavailable),
                (Mode::Valid, None) => Answer::new(Outcome::LogMissing),
                (Mode::Valid, Some(log)) => Answer::new(Outcome::LogInspected {
                    byte_length: log.len,
                    truncated: log.truncated,
                }),
            },
            Action::UploadLog {
                log_artifact_id,
                header,
                byte_length,
                ..
            } => self.upload(&log_artifact_id, &header, byte_length, mode, r),
            Action::Post(call) => self.post(&call, mode, r),
            Action::Spawn(plan) => self.spawn(*plan, mode, r),
            Action::Stop { handle } => self.stop(handle.as_str(), mode),
            Action::InspectSupervision { handle, .. } => self.inspect(handle.as_str(), mode),
            Action::ReadPublishedHandle { attempt_id } => self.published(&attempt_id, mode),
            Action::DrawEntropy => Answer::new(Outcome::EntropyDrawn(self.entropy(r.u8()))),
            Action::PersistSession { session_id } => {
                self.write(mode, |h| h.session_id = session_id)
            }
        }
    }

    fn list(&self, after: Option<OfferId>, limit: PageLimit, mode: Mode) -> Answer {
        if let Mode::Fault(f) = mode {
            return store(read_fault(f));
        }
        let ids: Vec<OfferId> = self.records.keys().cloned().collect();
        let page = page(ids, after.as_ref(), limit);
        let records = page
            .offer_ids
            .iter()
            .filter_map(|id| self.record(id))
            .collect();
        Answer::new(Outcome::InboxListed {
            records,
            next_after: page.next_after,
        })
    }

    fn write(&mut self, mode: Mode, apply: impl FnOnce(&mut Self)) -> Answer {
        match mode {
            Mode::Valid => {
                apply(self);
                Answer::new(Outcome::Persisted)
            }
            Mode::Fault(f) => {
                let (failure, lands) = write_fault(f);
                if lands {
                    apply(self);
                }
                store(failure)
            }
        }
    }

    fn persist_record(&mut self, record: InboxRecord, mode: Mode) -> Answer {
        let stored = self.record(&record.offer.offer_id).map(|r| r.state);
        let must_land = (record.state == State::RecoveryRequired
            && record.recovery_reason == Some(RecoveryReason::LaunchOutcomeUnknown))
            || (record.state == State::StartFailed && stored == Some(State::Launching));
        let mut answer = self.write(mode, |h| h.put_record(&record));
        if answer.outcome_is(StoreFailure::Unchanged) && must_land {
            answer.license.unrecorded = true;
        }
        answer
    }

    /// Fresh entropy: distinct for every draw (so no capability can collide with a lease token
    /// or offer id), with the fuzz byte `salt` mixed in.
    pub fn entropy(&mut self, salt: u8) -> Entropy {
        self.draws += 1;
        let mut bytes = [0u8; ENTROPY_BYTES];
        for (half, chunk) in bytes.chunks_mut(32).enumerate() {
            let seed = format!("ql-fuzz-entropy-{}-{salt}-{half}", self.draws);
            chunk.copy_from_slice(Sha256Digest::of(seed.as_bytes()).as_bytes());
        }
        let mut first = [0u8; 32];
        first.copy_from_slice(&bytes[..32]);
        self.ghost.candidate(first);
        Entropy::new(bytes)
    }

    fn read_receipt(&mut self, attempt: &AttemptId, mode: Mode) -> Answer {
        let genuine = self.receipts.get(attempt).cloned();
        let (read, is_genuine) = match (mode, genuine) {
            (Mode::Valid, Some(receipt)) => (ReceiptRead::Present(receipt), true),
            (Mode::Valid, None) => (ReceiptRead::Absent, false),
            (Mode::Fault(f), genuine) => (self.forged(attempt, genuine, f), false),
        };
        self.ghost.genuine.insert(attempt.clone(), is_genuine);
        Answer::new(Outcome::ReceiptRead(read))
    }

    /// A receipt that must not authenticate.
    fn forged(&self, attempt: &AttemptId, genuine: Option<Receipt>, f: u8) -> ReceiptRead {
        let base = genuine.or_else(|| {
            let record = self.record_of_attempt(attempt)?;
            record.executor_started_at_ms?;
            let capability = samples::capability(0);
            Some(samples::receipt_for(&record, &capability, self.now, 0))
        });
        let Some(mut receipt) = base else {
            return ReceiptRead::Invalid;
        };
        match f % 6 {
            0 => return ReceiptRead::Invalid,
            1 => return ReceiptRead::Unavailable,
            2 => {
                let forged = samples::base64url(&samples::capability(u32::MAX));
                receipt.token = ReceiptToken::new(forged).unwrap_or(receipt.token);
            }
            3 => {
                receipt.callback_sequence = receipt
                    .callback_sequence
                    .next()
                    .unwrap_or(receipt.callback_sequence);
            }
            4 => receipt.started_at_ms = samples::ms(receipt.started_at_ms.get() + 1),
            // Later than the Worker may accept: its wall clock (this host's, which clock steps
            // move) and the start time.
            _ => {
                let latest = self.local_wall().max(receipt.started_at_ms);
                receipt.finished_at_ms = samples::ms(latest.get() + 1);
            }
        }
        if receipt.finished_at_ms < receipt.started_at_ms {
            receipt.finished_at_ms = receipt.started_at_ms;
        }
        ReceiptRead::Present(receipt)
    }

    fn upload(
        &mut self,
        log: &LogArtifactId,
        header: &[u8],
        byte_length: u64,
        mode: Mode,
        r: &mut Bytes<'_>,
    ) -> Answer {
        let offer = self
            .all_records()
            .into_iter()
            .find(|rec| rec.log_artifact_id.as_ref() == Some(log))
            .map(|rec| rec.offer.offer_id);
        if let Some(offer) = &offer {
            self.ghost.uploaded.remove(offer);
        }
        let Some(stored) = self.logs.get(log).copied() else {
            return Answer::new(Outcome::LogMissing);
        };
        if stored.len != byte_length {
            return Answer::new(Outcome::LogUnavailable);
        }
        let mut framed = Vec::with_capacity(header.len() + 4);
        framed.extend_from_slice(&u32::try_from(header.len()).unwrap_or(0).to_be_bytes());
        framed.extend_from_slice(header);
        let upload = ArtifactUpload::parse_preamble(&framed, None)
            .unwrap_or_else(|e| panic!("INVARIANT request-json: upload header: {e}"))
            .0;
        let sha = Log::digest(stored.len);
        let receipt = ArtifactReceipt {
            status: UploadStatus::Stored,
            sha256: sha,
        };
        let mut body = receipt.to_json(&upload);
        let mut sent = stored.len;
        match mode {
            Mode::Valid => {
                if let Some(offer) = offer
                    && self.lie != Some(Lie::UploadNotStored)
                {
                    self.ghost.uploaded.insert(offer, (stored.len, sha));
                }
            }
            Mode::Fault(f) => match f % 6 {
                0 if (f / 6) % 2 == 1 => {
                    return Answer::new(Outcome::Http(HttpFailure::Uncertain));
                }
                0 => return Answer::new(Outcome::Http(HttpFailure::Unavailable)),
                1 => return Answer::new(http_status(409)),
                2 => body = r.slice(64).to_vec(),
                3 => {
                    let other = ArtifactReceipt {
                        status: UploadStatus::AlreadyStored,
                        sha256: Sha256Digest::of(b"other content"),
                    };
                    body = other.to_json(&upload);
                }
                4 => sent = sent.saturating_sub(1).min(stored.len.saturating_add(1)),
                _ => return Answer::new(Outcome::LogUnavailable),
            },
        }
        Answer::new(Outcome::Uploaded {
            body,
            sent_bytes: sent,
            sent_sha256: if sent == stored.len {
                sha
            } else {
                Sha256Digest::of(b"short")
            },
        })
    }

    fn post(&mut self, call: &HttpCall, mode: Mode, r: &mut Bytes<'_>) -> Answer {
        let Ok(route) = parse_route(&call.path) else {
            return Answer::new(http_status(404));
        };
        let body: Value = serde_json::from_slice(&call.body).unwrap_or(Value::Null);
        let session = matches!(
            route.operation,
            Operation::Register | Operation::Heartbeat | Operation::Transition
        );
        let v = r.u8();
        if route.operation == Operation::Starting
            && let Ok(offer) = OfferId::new(plane::text(&body, "offerId"))
            && self.plane.activation_fenced(&offer, self.now)
        {
            // The reference fences every activation ACK by the Run lease (ADR-0013): an offer
            // whose lease expired, or that was re-offered under another offer id, gets a 409.
            // The Worker's own expiry judgement stands in front of this, but a lease it holds
            // no local deadline for is judged by its wall clock, which a clock-step fault may
            // have set behind (simulation seed 91523 of `clock_steps`).
            return Answer::new(Outcome::Http(HttpFailure::Status {
                status: 409,
                code: Some(String::from("worker_activation_fenced")),
            }));
        }
        let valid = self.valid_body(route.operation, &route.session_id, &body, v);
        let mut answer = match (mode, valid) {
            (Mode::Valid, Some(bytes)) => Answer::new(Outcome::Responded(bytes)),
            (Mode::Valid, None) => Answer::new(http_status(404)),
            (Mode::Fault(f), valid) => {
                let mut answer = Answer::new(post_fault(f, valid, r));
                // Only a final answer licenses a Session halt: a fence (repeated, it is two
                // Workers on one worker id), a refusal, or an answer of the contract's shape
                // that breaks the version CAS. An unavailable or uncertain answer (no answer, a
                // 503, a 401, a 302, a 201, a body that is not JSON) never does (issue 17).
                answer.license.session = session && licenses_session_halt(&answer.outcome);
                answer
            }
        };
        if let Ok(offer) = OfferId::new(plane::text(&body, "offerId")) {
            self.note_plane_answer(&offer, &answer.outcome);
        }
        if session && licenses_session_halt(&answer.outcome) {
            answer.license.session = true;
        }
        // A register answered `replacedSession: true`: another Session of this worker id had
        // replaced ours, which is final for a Worker registering again after a fence.
        if route.operation == Operation::Register
            && let Outcome::Responded(bytes) = &answer.outcome
            && bytes.windows(22).any(|w| w == b"\"replacedSession\":true")
        {
            answer.license.session = true;
        }
        answer
    }

    /// The valid answer of the control plane, when it has one.
    fn valid_body(
        &mut self,
        op: Operation,
        session: &ql_worker_core::ids::SessionId,
        body: &Value,
        v: u8,
    ) -> Option<Vec<u8>> {
        let now = self.now;
        let record = OfferId::new(plane::text(body, "offerId"))
            .ok()
            .and_then(|id| self.record(&id));
        match op {
            Operation::Register | Operation::Heartbeat | Operation::Transition => {
                Some(self.plane.session(op.as_str(), session, body, now, v))
            }
            Operation::Offers => {
                let answer = self.plane.offers(session, body, now, v);
                self.granted(body, &answer);
                Some(answer)
            }
            Operation::Starting | Operation::Running | Operation::StartFailure => {
                if let Ok(offer) = OfferId::new(plane::text(body, "offerId")) {
                    self.plane.activation_seen(&offer);
                }
                Some(self.plane.activation(op.as_str(), body, &record?, now, v))
            }
            Operation::Secrets => {
                let answer = self.plane.secrets(&record?, v);
                self.ghost.secret_values = self.plane.secret_values.clone();
                answer
            }
            Operation::Completion => Plane::completion(body, v),
            Operation::LeaseControl => {
                let record = record?;
                let attempt = &record.offer.candidate.attempt_id;
                let timed_out = self.plane_timeout && !self.receipts.contains_key(attempt);
                let answer =
                    Plane::lease_control(body, &record, now, if timed_out { 4 } else { v });
                if let Some(bytes) = &answer {
                    self.granted(body, bytes);
                }
                answer
            }
            Operation::Artifacts | Operation::Attestations => None,
        }
    }

    /// How long before the control plane's expiry of `record`'s lease the Worker's local
    /// deadline for it falls (see [`Host::lease_slack`]).
    #[must_use]
    pub fn slack(&self, record: &InboxRecord) -> u64 {
        let lease = (
            record.offer.offer_id.clone(),
            record.offer.lease.version.get(),
        );
        self.lease_slack.get(&lease).copied().unwrap_or(0)
    }

    /// A call that may grant the lease of the offer it names was applied now, answered with
    /// `answer`: if it granted one (its lease version), how long the call was on its way (see
    /// [`Host::lease_slack`]).
    fn granted(&mut self, body: &Value, answer: &[u8]) {
        let version = check::granted_version(answer);
        if let (Ok(offer), Some(sent), Some(version)) = (
            OfferId::new(plane::text(body, "offerId")),
            self.call_sent_at,
            version,
        ) {
            let slack = self.now.saturating_since(sent);
            self.lease_slack.insert((offer, version), slack);
        }
    }

    fn spawn(&mut self, plan: LaunchPlan, mode: Mode, r: &mut Bytes<'_>) -> Answer {
        let Some(launching) = self.record(&plan.offer_id) else {
            return Answer::new(Outcome::Spawned(SpawnOutcome::Rejected));
        };
        let handle = format!("ql3lp1.fuzz-{}", self.processes.len());
        let started_at = plan.executor_started_at;
        let (outcome, fate, exists) = match mode {
            Mode::Valid if self.lie == Some(Lie::SpawnedButRejected) => {
                (SpawnOutcome::Rejected, SpawnFate::Started, true)
            }
            Mode::Valid => (
                SpawnOutcome::Started {
                    handle: handle.clone(),
                    started_at,
                },
                SpawnFate::Started,
                true,
            ),
            Mode::Fault(f) => match f % 5 {
                0 => (SpawnOutcome::Rejected, SpawnFate::Rejected, false),
                1 => (SpawnOutcome::Unknown, SpawnFate::Unknown, true),
                2 => (SpawnOutcome::Unknown, SpawnFate::Unknown, false),
                3 => (
                    SpawnOutcome::Started {
                        handle: handle.clone(),
                        started_at: samples::ms(started_at.get() + 1),
                    },
                    SpawnFate::Unknown,
                    true,
                ),
                _ => (
                    SpawnOutcome::Started {
                        handle: String::from("bad\nhandle"),
                        started_at,
                    },
                    SpawnFate::Unknown,
                    true,
                ),
            },
        };
        self.ghost.spawns.insert(plan.offer_id.clone(), fate);
        if exists {
            self.ghost.handles.insert(handle.clone());
            self.processes.push(Process {
                launching,
                capability: *plan.capability.expose(),
                handle,
                alive: true,
            });
            let last = self.processes.len() - 1;
            match r.below(4) {
                0 => self.exit(last, 0, true),
                2 => self.exit(last, 1, false),
                _ => {}
            }
        }
        Answer::new(Outcome::Spawned(outcome))
    }

    /// Process `index` ends: the log is captured and, when `receipt`, the supervisor publishes
    /// the genuine receipt.
    pub fn exit(&mut self, index: usize, code: u8, receipt: bool) {
        self.exit_logged(index, code, receipt, u64::from(code) * 7 + 5);
    }

    /// [`Host::exit`] with a log of `len` bytes.
    pub fn exit_logged(&mut self, index: usize, code: u8, receipt: bool, len: u64) {
        // The supervisor's timestamps come from this host's wall clock.
        let now = self.local_wall();
        let Some(process) = self.processes.get_mut(index) else {
            return;
        };
        if !process.alive {
            return;
        }
        process.alive = false;
        let record = &process.launching;
        if let Some(log) = &record.log_artifact_id {
            self.logs.insert(
                log.clone(),
                Log {
                    len,
                    truncated: (code % 3 != 2).then_some(code % 3 == 1),
                },
            );
        }
        if receipt {
            let genuine = samples::receipt_for(record, &process.capability, now, code);
            self.receipts
                .insert(record.offer.candidate.attempt_id.clone(), genuine);
        }
    }

    /// Whether the supervisor and the process of `handle` exist: in this host they end
    /// together (the receipt, if any, is published as the process exits). A process that ended
    /// without a receipt, or whose receipt the Worker last read as one that cannot
    /// authenticate (a forged or garbled read: the Worker treats such a receipt as final, since
    /// a supervisor never writes over an existing one), licenses
    /// `lease_lost_local_execution_stopped` (issue 16).
    fn inspect(&mut self, handle: &str, mode: Mode) -> Answer {
        let index = self.processes.iter().position(|p| p.handle == handle);
        let liveness = match (mode, index) {
            (Mode::Fault(_), _) | (Mode::Valid, None) => Liveness::Unknown,
            (Mode::Valid, Some(i)) if self.processes[i].alive => Liveness::Alive,
            (Mode::Valid, Some(i)) => {
                let record = &self.processes[i].launching;
                let attempt = &record.offer.candidate.attempt_id;
                let read_unusable = self.ghost.genuine.get(attempt) == Some(&false);
                if !self.receipts.contains_key(attempt) || read_unusable {
                    let offer = record.offer.offer_id.clone();
                    self.ghost
                        .cause(&offer, RecoveryReason::LeaseLostLocalExecutionStopped);
                }
                Liveness::Gone
            }
        };
        Answer::new(Outcome::SupervisionInspected {
            supervisor: liveness,
            process: liveness,
        })
    }

    /// The handle the supervisor of `attempt_id` published before its user command ran (every
    /// process this host spawned has one); a fault is a garbled file (`None`).
    fn published(&self, attempt_id: &AttemptId, mode: Mode) -> Answer {
        let found = match mode {
            Mode::Fault(_) => None,
            Mode::Valid => self
                .processes
                .iter()
                .rev()
                .find(|p| p.launching.offer.candidate.attempt_id == *attempt_id)
                .and_then(|p| ql_worker_core::ids::ExecutorHandle::new(p.handle.clone()).ok()),
        };
        Answer::new(Outcome::PublishedHandle(found))
    }

    fn stop(&mut self, handle: &str, mode: Mode) -> Answer {
        let index = self.processes.iter().position(|p| p.handle == handle);
        let outcome = match (mode, index) {
            (Mode::Fault(f), _) if f.is_multiple_of(2) => StopOutcome::Unknown,
            (Mode::Fault(_), _) | (Mode::Valid, None) => StopOutcome::AlreadyExited,
            (Mode::Valid, Some(i)) if self.processes[i].alive => {
                self.exit(i, 143, true);
                StopOutcome::Stopped
            }
            (Mode::Valid, Some(_)) => StopOutcome::AlreadyExited,
        };
        Answer::new(Outcome::Stopped(outcome))
    }
}

impl Answer {
    fn outcome_is(&self, failure: StoreFailure) -> bool {
        matches!(self.outcome, Outcome::Store(f) if f == failure)
    }
}

fn http_status(status: u16) -> Outcome {
    Outcome::Http(HttpFailure::Status {
        status,
        code: Some(String::from("worker_fenced")),
    })
}

/// A faulty answer to a JSON call. The high bits of `f` pick among kinds of one family: no
/// answer (unsent, or uncertain: the request may have taken effect), and an answer that is not
/// a 200 or an error (503, or the uncertain 302 and 201).
fn post_fault(f: u8, valid: Option<Vec<u8>>, r: &mut Bytes<'_>) -> Outcome {
    match f % 8 {
        0 if (f / 8) % 2 == 1 => Outcome::Http(HttpFailure::Uncertain),
        0 => Outcome::Http(HttpFailure::Unavailable),
        1 => http_status(409),
        2 => http_status(400),
        3 => Outcome::Http(HttpFailure::Status {
            status: [503, 302, 201][usize::from(f / 8) % 3],
            code: None,
        }),
        4 => Outcome::Responded(r.slice(96).to_vec()),
        5 => {
            let mut bytes = valid.unwrap_or_default();
            if !bytes.is_empty() {
                let at = usize::from(r.u16()) % bytes.len();
                bytes[at] ^= r.u8() | 1;
            }
            Outcome::Responded(bytes)
        }
        6 => {
            let mut bytes = valid.unwrap_or_default();
            bytes.truncate(usize::from(r.u16()) % (bytes.len() + 1));
            Outcome::Responded(bytes)
        }
        _ => Outcome::Http(HttpFailure::Status {
            status: 401,
            code: None,
        }),
    }
}
