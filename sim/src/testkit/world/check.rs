//! The one checker set: the safety invariants of the one simulated host ([`World`]), which the
//! scenario tests, the model checks, the walks, the simulation and the fuzz target
//! `machine_walk` all drive.
//!
//! Rules with a function of their own (a pure rule over plain facts):
//!
//! * `at-most-one-spawn`, `at-most-once-attempt`, `at-most-once-run` ([`spawn_once`]): at most
//!   one spawn per offer, across every crash and restart; at most one spawn per Attempt id,
//!   whatever offer carries it; a second spawn of a Run only for an Attempt the control plane
//!   created after it declared every earlier spawned Attempt of the Run lost (its decision, not
//!   a Worker double execution), and never of an Attempt it already declared lost.
//! * `start-failure-proof` ([`start_failure_proven`]): `start-failure` only when no spawn was
//!   issued for the offer, or the spawn was answered `Rejected`, and no process of the offer
//!   exists.
//! * `no-capability-at-rest` ([`CapabilityForms`]): no persisted record or claim contains a
//!   capability (any entropy draw's first 32 bytes), raw, base64url or hex; `no-capability-sent`:
//!   no request body or upload header carries a launch's capability.
//! * `persist-valid` ([`record_write`]): every record write is a first publication of a valid
//!   `accepted` record at revision 0 over no stored record, or a replace at exactly
//!   `expected + 1` that the journal's `check_transition` accepts.
//! * `claim-cas` ([`claim_write`], [`claim_clear`]): every claim write and clear obeys the
//!   claim rules of `ql_worker_core::claim` ([`World`] also refuses a second, identical create:
//!   its Worker model never needs one).
//! * `claim-before-pull` ([`claim_durable`]): the `offers` request only with its claim (offer
//!   id, token) durable.
//! * `receipt-removed-after-acknowledged` ([`receipt_removable`]): a receipt is removed only
//!   while its record is durably `completion_acknowledged`.
//! * `renewal-only-retired`, `renewal-after-runs` ([`renewal`]): a new Session replaces the
//!   stored one only while the control plane holds the stored one draining or offline, and,
//!   draining, only once no Run of the stored Session may still be live.
//! * `upload-first` ([`upload_heard`]): completion only names an artifact whose upload the
//!   Worker heard succeed (same length and SHA-256, and the same log id where the host keeps
//!   it).
//! * `receipt-authenticated` ([`receipt_authenticated`]): upload and completion only while
//!   the host knows the Attempt's receipt is the supervisor's genuine one (never after a forged
//!   or malformed receipt), by the receipt on disk.
//! * `no-secret-at-rest` ([`secret_free`]): no Secret value the control plane handed out in a
//!   persisted record or claim, a request body or an upload header.
//! * `running-ack-after-started` ([`running_ack_allowed`]): the running ACK only while
//!   `started` (with the same handle) is durable.
//! * `logs-kept` ([`logs_kept`]): no command deletes or shortens a log.
//! * `request-cap` ([`request_within_cap`]): no request body above the cap its call carries.
//! * `spawn-barrier`: a spawn only while the durable record is `launching` with exactly the
//!   plan's offer, Run, Attempt, start time, log id, callback sequence and capability digest
//!   (core's `Barrier::check`, the rule the real supervisor runs).
//!
//! And, on every command before it takes effect:
//!
//! * `stored-before-clear`: a claim whose offer was delivered is cleared only once the offer is
//!   in the inbox, unless the claim was given up: it belongs to another Session than the one
//!   the Worker stored last, or it used its [`CLAIM_ATTEMPTS`]. A replay the plane fenced (409
//!   `worker_offer_fenced`) counts as not delivered: that offer id is never delivered again.
//! * `completion-before-acknowledged`: `completion_acknowledged` is persisted only after the
//!   control plane applied the completion.
//! * `recovery-licensed` ([`recovery_licensed`]): a record
//!   enters `recovery_required` only for a cause the seed injected
//!   ([`super::Evidence`]'s `recovery_causes`; `docs/simulation.md` has the table), or, for a
//!   lease-loss reason, once the lease has expired as the Worker may judge it (the rule of
//!   `stop-after-durable-lease`).
//! * `stop-after-durable-lease`: a stop only when the durable lease has expired (by the true
//!   time less how long the call that obtained it was on its way, [`super::Evidence`]'s
//!   `lease_slack`; or, for a lease the Worker does not time, by its wall clock:
//!   [`super::WorkerClock`]), the control plane said the Run is terminal, the
//!   `stop_requested` lease version is durable, or the Worker's drain budget has ended.
//! * `fail-closed-no-pull` ([`fail_closed_by`]): no Pull
//!   starts (its first command, reading the claim) while any durable record is
//!   `recovery_required` (reference §4.7: fail closed, never pull again).
//! * `durable-decode`: every record and claim written encodes as its envelope and decodes back
//!   to itself (the disk keeps those bytes, so every read returns what they decode to).
//! * `started-needs-spawn`: a `started` write names the handle of a process the supervisor
//!   spawned for that offer; `start-failure-proof` holds for a `start_failed` write as for the
//!   `start-failure` request (the record says nothing of a live process: the spawn's fate only).
//! * `stop-known-handle`: a stop names a handle the supervisor issued.
//! * `pull-with-room` ([`pull_with_room`], checked by the scenario driver, which knows the
//!   configured capacity): no claim written (the step before every `offers` request) while
//!   every place of the inbox is taken.
//!
//! The driver ([`crate::testkit::sim::Sim`]) adds `worker-error` (the Worker refused an outcome,
//! or halted on a conflict the store did not report), `halt-licensed` (every halt on an answer
//! that allows it), `duplicate-refused`, `drain-no-pull` (no Pull starts once the Worker is
//! draining), `drain-no-launch` and `fail-closed-no-launch` (no starting ACK and no spawn once a drain was asked of this incarnation, or while it is fail-closed),
//! `reconcile-first` (no Pull before this incarnation's startup reconciliation listed the whole
//! inbox) and `retention-removes-only-unneeded`; the walks add `liveness`, the explorer `panic`
//! (a core assertion fired), the cadence phase its cadence checks.

use std::collections::BTreeSet;

use base64::Engine as _;
use serde_json::Value;

use super::{Answer, SpawnPlan, Violation, World};
use crate::testkit::act;
use ql_worker_core::claim::{ClaimCreate, PendingClaim, check_clear, check_create, check_replace};
use ql_worker_core::ids::{
    AttemptId, LogArtifactId, OfferId, Revision, RunId, SessionId, Sha256Digest,
};
use ql_worker_core::io::{Action, HttpCall, HttpFailure, Outcome, StoreFailure};
use ql_worker_core::record::{InboxRecord, RecoveryReason, State, check_transition};
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::route::Operation;
use ql_worker_core::wire::session::SessionStatus;
use ql_worker_core::worker::HaltReason;

/// A stored log's length in bytes.
fn log_length(log: &super::Log) -> u64 {
    u64::try_from(log.content.len()).unwrap_or(u64::MAX)
}

impl World {
    /// Checks `action` against every invariant that concerns it, before it takes effect.
    pub(super) fn check_act(&mut self, now: UnixMillis, action: &Action) {
        match action {
            Action::Spawn(plan) => {
                let plan = SpawnPlan::of(plan);
                self.check_spawn(&plan);
                // A lying Worker's forged second spawn reaches the supervisor too.
                if let Some(forged) = self.forged_spawn(&plan) {
                    self.check_spawn(&forged);
                }
            }
            Action::PersistRecord { record, .. } => {
                if let Some(bytes) = self.check_durable(&**record, "record") {
                    self.check_capability_free(&bytes, "persisted record");
                    self.check_secret_free(&bytes, "persisted record");
                }
                self.check_started_spawned(record);
                self.check_start_failed(record);
                self.check_recovery_licensed(now, record);
                let run = self.plane.runs.get(&record.offer.offer_id).map(|r| r.n);
                if run.is_some_and(|n| self.plane.refused.contains(&n)) {
                    self.violation(
                        "refused-offer-stored",
                        format!(
                            "{} stored although its pinned digest is not its revision's",
                            alias(self, &record.offer.offer_id)
                        ),
                    );
                }
                let fresh = self
                    .disk
                    .record(&record.offer.offer_id)
                    .is_none_or(|s| s.state != State::CompletionAcknowledged);
                if record.state == State::CompletionAcknowledged && fresh {
                    let applied = self
                        .plane
                        .runs
                        .get(&record.offer.offer_id)
                        .is_some_and(|r| r.completion.is_some());
                    if !applied {
                        self.violation(
                            "completion-before-acknowledged",
                            format!(
                                "{} acknowledged without an applied completion",
                                alias(self, &record.offer.offer_id)
                            ),
                        );
                    }
                }
            }
            Action::PersistClaim { claim, .. } => {
                if let Some(bytes) = self.check_durable(&**claim, "claim") {
                    self.check_capability_free(&bytes, "persisted claim");
                    self.check_secret_free(&bytes, "persisted claim");
                }
            }
            Action::ClearClaim { offer_id, .. } => {
                let delivered = self.evidence.delivered.get(offer_id) == Some(&true);
                // A claim of another Session can never be admitted, and one that used its
                // attempts is given up (reference §4.1): the Run is reclaimed by its lease.
                let current = self
                    .session_id
                    .clone()
                    .unwrap_or_else(|| crate::testkit::worker().session_id);
                let claim = self.disk.claim.as_ref().map(|(c, _)| c);
                let given_up = claim.is_some_and(|c| {
                    c.worker_session_id != current || c.attempt_count >= CLAIM_ATTEMPTS
                });
                // An offer pinned to another digest is refused for good: nothing to store.
                let refused = (self.plane.runs.get(offer_id))
                    .is_some_and(|r| self.plane.refused.contains(&r.n));
                if delivered && !given_up && !refused && self.disk.record(offer_id).is_none() {
                    self.violation(
                        "stored-before-clear",
                        format!("claim of delivered offer {offer_id} cleared before it was stored"),
                    );
                }
            }
            Action::RemoveReceipt { attempt_id } => {
                // The receipt is the one of the process spawned for the Attempt: its offer's
                // record decides (a re-delivery leaves other records of the same Attempt).
                let spawned = self.supervisor.processes.iter();
                let offer = spawned
                    .filter(|p| p.attempt_id == *attempt_id)
                    .map(|p| &p.offer_id)
                    .next();
                let record = match offer {
                    Some(offer_id) => self.disk.record(offer_id),
                    None => self.disk.record_of_attempt(attempt_id),
                };
                let state = record.map(|r| r.state);
                if !receipt_removable(state) {
                    self.violation(
                        "receipt-removed-after-acknowledged",
                        format!("receipt of {attempt_id} removed while the record is {state:?}"),
                    );
                }
            }
            Action::Post(call) => {
                if !request_within_cap(call) {
                    self.violation(
                        "request-cap",
                        format!(
                            "a {} body of {} bytes above its cap of {}",
                            act::operation(call).as_str(),
                            call.body.len(),
                            call.request_cap
                        ),
                    );
                }
                self.check_secret_free(&call.body, "request body");
                self.check_capability_unsent(&call.body, "request body");
                self.check_post(act::operation(call), &call.body);
            }
            Action::UploadLog { header, .. } => {
                self.check_secret_free(header, "upload header");
                self.check_capability_unsent(header, "upload header");
                let v: Value = serde_json::from_slice(header).unwrap_or(Value::Null);
                let attempt = v.get("attemptId").and_then(Value::as_str).unwrap_or("");
                self.check_receipt_genuine(attempt, "upload");
            }
            Action::Stop { handle } => self.check_stop(now, handle.as_str()),
            Action::ReadClaim => {
                let evidence = fail_closed_by(self.disk.records.values().map(|(r, _)| r));
                if let Some(record) = evidence {
                    let name = alias(self, &record.offer.offer_id);
                    self.violation(
                        "fail-closed-no-pull",
                        format!("a Pull starts while {name} is durably recovery_required"),
                    );
                }
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

    /// A new Session replaces the stored one only under [`renewal`]'s rules.
    fn check_renewal(&mut self) {
        let stored = self
            .session_id
            .clone()
            .unwrap_or_else(|| crate::testkit::worker().session_id);
        let holds = self.plane.session_id == self.session_id;
        let records = self.disk.records.values().map(|(r, _)| r);
        if let Some(broken) = renewal(self.plane.session_status, holds, &stored, records) {
            self.violations.push(broken);
        }
    }

    /// Checks that no command shortened or deleted a log (`before`: lengths before it ran).
    pub(crate) fn check_logs_kept(&mut self, before: &[(LogArtifactId, u64)]) {
        let now = |id: &LogArtifactId| self.disk.logs.get(id).map(log_length);
        let broken = logs_kept(before, now);
        self.violations.extend(broken);
    }

    /// Log lengths, for [`World::check_logs_kept`].
    #[must_use]
    pub fn log_lengths(&self) -> Vec<(LogArtifactId, u64)> {
        self.disk
            .logs
            .iter()
            .map(|(id, l)| (id.clone(), log_length(l)))
            .collect()
    }

    /// The spawn a lying Worker forges beside `plan` ([`super::Mutation::SpawnsAttemptTwice`],
    /// [`super::Mutation::SpawnsRunTwice`]).
    fn forged_spawn(&self, plan: &SpawnPlan) -> Option<SpawnPlan> {
        use super::Mutation as M;
        let mut forged = plan.clone();
        match self.mutation? {
            M::SpawnsAttemptTwice => forged.offer_id = crate::testkit::offer_id(99),
            M::SpawnsRunTwice => {
                forged.offer_id = crate::testkit::offer_id(99);
                forged.attempt_id = AttemptId::new("attempt-forged").ok()?;
            }
            _ => return None,
        }
        Some(forged)
    }

    fn check_spawn(&mut self, plan: &SpawnPlan) {
        let name = alias(self, &plan.offer_id);
        let earlier = self.evidence.spawns.get(&plan.offer_id).map_or(0, |s| s.0);
        let of_run = self
            .evidence
            .run_spawns
            .entry(plan.run_id.clone())
            .or_default();
        let broken = spawn_once(
            earlier,
            of_run,
            (&plan.offer_id, &plan.attempt_id, &plan.run_id),
            &self.plane.lost_attempts,
            &|offer| {
                self.aliases
                    .get(offer)
                    .cloned()
                    .unwrap_or_else(|| String::from(offer.as_str()))
            },
        );
        self.violations.extend(broken);
        match self
            .disk
            .record(&plan.offer_id)
            .map(|r| plan.barrier().check(r))
        {
            Some(Ok(())) => {}
            Some(Err(field)) => self.violation(
                "spawn-barrier",
                format!("spawn of {name} against a durable record that differs: {field}"),
            ),
            None => self.violation("spawn-barrier", format!("spawn of {name} without a record")),
        }
    }

    fn check_capability_free(&mut self, bytes: &[u8], what: &str) {
        let leaked = self
            .evidence
            .windows
            .iter()
            .any(|w| CapabilityForms::of(*w).found_in(bytes));
        if leaked {
            self.violation(
                "no-capability-at-rest",
                format!("a {what} contains drawn capability bytes"),
            );
        }
    }

    /// `no-capability-sent`: no request body or upload header carries the capability of a
    /// launch (raw, base64url or hex), only its digest. Checked against the capabilities the
    /// supervisor was handed (every launch's), not every entropy draw: a body is sent far more
    /// often than a record is written.
    fn check_capability_unsent(&mut self, bytes: &[u8], what: &str) {
        let sent = (self.supervisor.processes.iter())
            .any(|p| CapabilityForms::of(p.capability).found_in(bytes));
        if sent {
            self.violation(
                "no-capability-sent",
                format!("a {what} carries a launch's capability"),
            );
        }
    }

    fn check_secret_free(&mut self, bytes: &[u8], what: &str) {
        if !secret_free(bytes, &[super::plane::SECRET_VALUE]) {
            self.violation(
                "no-secret-at-rest",
                format!("a {what} holds a Secret value"),
            );
        }
    }

    fn check_post(&mut self, operation: Operation, body: &[u8]) {
        let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
        let text = |key: &str| String::from(v.get(key).and_then(Value::as_str).unwrap_or(""));
        let Ok(offer_id) = OfferId::new(text("offerId")) else {
            return;
        };
        let name = alias(self, &offer_id);
        match operation {
            Operation::Offers => {
                let stored = self.disk.claim.as_ref().map(|(c, _)| c);
                if !claim_durable(stored, &offer_id, &text("leaseToken")) {
                    self.violation(
                        "claim-before-pull",
                        format!("offers request for {offer_id} without its durable claim"),
                    );
                }
            }
            Operation::StartFailure => {
                let spawned = self.evidence.spawns.get(&offer_id).copied();
                let alive = self.supervisor.of_offer(&offer_id).next().is_some();
                let fate = spawned.map(|(_, answer)| SpawnFate::of(answer));
                if !start_failure_proven(fate, alive) {
                    self.violation(
                        "start-failure-proof",
                        format!("start-failure of {name} after spawn {spawned:?}"),
                    );
                }
            }
            Operation::Running => {
                let handle = text("executorHandle");
                if !running_ack_allowed(self.disk.record(&offer_id), &handle) {
                    let state = self.disk.record(&offer_id).map(|r| r.state);
                    self.violation(
                        "running-ack-after-started",
                        format!("running ACK of {name} while the durable record is {state:?}"),
                    );
                }
            }
            Operation::Completion => self.check_completion(&offer_id, &v),
            Operation::Artifacts
            | Operation::Attestations
            | Operation::Heartbeat
            | Operation::LeaseControl
            | Operation::Register
            | Operation::Secrets
            | Operation::Starting
            | Operation::Transition => {}
        }
    }

    fn check_completion(&mut self, offer_id: &OfferId, v: &Value) {
        let name = alias(self, offer_id);
        let heard = self.plane.runs.get(offer_id).into_iter().flat_map(|run| {
            run.uploads
                .iter()
                .filter(|(_, _, _, heard)| *heard)
                .map(|(log, length, sha, _)| (Some(log), *length, sha))
        });
        if !upload_heard(v, heard) {
            self.violation(
                "upload-first",
                format!("completion of {name} names an artifact whose upload was not acknowledged"),
            );
        }
        let attempt = v.get("attemptId").and_then(Value::as_str).unwrap_or("");
        self.check_receipt_genuine(attempt, "completion");
    }

    fn check_receipt_genuine(&mut self, attempt: &str, what: &str) {
        let genuine = AttemptId::new(attempt)
            .ok()
            .and_then(|a| self.disk.receipts.get(&a))
            .map(|r| r.genuine && !r.malformed);
        if !receipt_authenticated(genuine) {
            self.violation(
                "receipt-authenticated",
                format!("{what} for {attempt} without a genuine receipt"),
            );
        }
    }

    /// `durable-decode`: what the Worker writes encodes as an envelope and decodes back to
    /// itself (the journal returns exactly what it stored). Returns the bytes.
    fn check_durable<T>(&mut self, value: &T, what: &str) -> Option<Vec<u8>>
    where
        T: ql_worker_core::envelope::Durable + PartialEq + std::fmt::Debug,
    {
        let bytes = match ql_worker_core::envelope::encode(value) {
            Ok(bytes) => bytes,
            Err(e) => {
                self.violation(
                    "persist-valid",
                    format!("a {what} that does not encode: {e}"),
                );
                return None;
            }
        };
        let bytes = bytes.to_vec();
        match ql_worker_core::envelope::decode::<T>(&bytes) {
            Ok(back) if back == *value => {}
            Ok(back) => self.violation(
                "durable-decode",
                format!("a {what} decodes to another value: {back:?}"),
            ),
            Err(e) => self.violation("durable-decode", format!("a written {what}: {e}")),
        }
        Some(bytes)
    }

    /// `started-needs-spawn`: a `started` write names the handle of a process the supervisor
    /// spawned for that offer.
    fn check_started_spawned(&mut self, record: &InboxRecord) {
        if record.state != State::Started {
            return;
        }
        let offer_id = &record.offer.offer_id;
        let handle = record.executor_handle.as_ref().map(|h| h.as_str());
        let spawned = self
            .supervisor
            .of_offer(offer_id)
            .any(|p| Some(p.handle.as_str()) == handle);
        if !spawned {
            let name = alias(self, offer_id);
            self.violation(
                "started-needs-spawn",
                format!("{name} written started with a handle no spawn of it reported"),
            );
        }
    }

    /// `start-failure-proof` on the record: a `start_failed` (or acknowledged) write only when
    /// the offer got no spawn, or its spawn was answered `Rejected` (the record says nothing of
    /// a live process; the `start-failure` request is checked for that too).
    fn check_start_failed(&mut self, record: &InboxRecord) {
        if !matches!(
            record.state,
            State::StartFailed | State::StartFailureAcknowledged
        ) {
            return;
        }
        let offer_id = &record.offer.offer_id;
        let spawned = self.evidence.spawns.get(offer_id).copied();
        let fate = spawned.map(|(_, answer)| SpawnFate::of(answer));
        if !start_failure_proven(fate, false) {
            let name = alias(self, offer_id);
            self.violation(
                "start-failure-proof",
                format!("{name} written {} after spawn {spawned:?}", record.state),
            );
        }
    }

    fn check_stop(&mut self, now: UnixMillis, handle: &str) {
        let Some(offer_id) = self
            .supervisor
            .by_handle(handle)
            .map(|p| p.offer_id.clone())
        else {
            self.violation(
                "stop-known-handle",
                String::from("stop of a handle the supervisor never issued"),
            );
            return;
        };
        let record = self.disk.record(&offer_id);
        let expired = record.is_some_and(|r| self.lease_expired_for_worker(now, r));
        let durable_version = record.map_or(0, |r| r.offer.lease.version.get());
        let run = self.plane.runs.get(&offer_id);
        let terminal = run.is_some_and(|r| r.terminal_answered);
        let requested = run
            .and_then(|r| r.stop_requested_version)
            .is_some_and(|v| durable_version >= v);
        let drained = self.worker_clock.drain_budget_ended;
        if !(expired || terminal || requested || drained) {
            let name = alias(self, &offer_id);
            self.violation(
                "stop-after-durable-lease",
                format!("stop of {name} with durable lease version {durable_version}"),
            );
        }
    }
}

impl World {
    /// Whether the Worker may judge `record`'s durable lease expired at true time `now`: the
    /// Worker's local deadline falls before the plane's expiry by how long the call that
    /// obtained the lease was on its way ([`super::Evidence`]'s `lease_slack`), and a lease it
    /// does not time it judges by its wall clock ([`super::WorkerClock`]).
    fn lease_expired_for_worker(&self, now: UnixMillis, record: &InboxRecord) -> bool {
        let offer_id = &record.offer.offer_id;
        let clock = &self.worker_clock;
        let by_wall = clock.wall.filter(|_| !clock.timed.contains(offer_id));
        let lease = &record.offer.lease;
        let key = (offer_id.clone(), lease.version.get());
        let slack = self.evidence.lease_slack.get(&key).copied().unwrap_or(0);
        now.saturating_add(slack) >= lease.expires_at_ms
            || by_wall.is_some_and(|wall| wall >= lease.expires_at_ms)
    }

    /// `recovery-licensed` ([`recovery_licensed`]) for a record newly `recovery_required`.
    fn check_recovery_licensed(&mut self, now: UnixMillis, record: &InboxRecord) {
        let offer_id = &record.offer.offer_id;
        let stored = self.disk.record(offer_id);
        if record.state != State::RecoveryRequired
            || stored.is_some_and(|s| s.state == State::RecoveryRequired)
        {
            return;
        }
        // The lease the Worker judged is the one it read, i.e. the stored one.
        let expired = stored.is_some_and(|s| self.lease_expired_for_worker(now, s))
            || self.lease_expired_for_worker(now, record);
        let causes = self.evidence.recovery_causes.get(offer_id);
        if let Err(detail) = recovery_licensed(record, causes, expired) {
            self.violation("recovery-licensed", detail);
        }
    }

    /// Licenses `reason` for `offer` (a fault or answer that leads there happened).
    pub fn cause(&mut self, offer: &OfferId, reason: RecoveryReason) {
        let causes = self.evidence.recovery_causes.entry(offer.clone());
        causes.or_default().insert(reason);
    }

    /// Licenses `launch_outcome_unknown` for every record durably `launching`: a crash, halt,
    /// stop or fault now may leave the Worker unable to know whether its process started.
    pub fn launch_uncertain(&mut self) {
        let launching: Vec<OfferId> = (self.disk.records.values())
            .filter(|(r, _)| r.state == State::Launching)
            .map(|(r, _)| r.offer.offer_id.clone())
            .collect();
        for offer in launching {
            self.cause(&offer, RecoveryReason::LaunchOutcomeUnknown);
        }
    }
}

fn alias(world: &World, offer_id: &OfferId) -> String {
    world.alias(offer_id)
}

/// Whether `needle` occurs in `haystack` (first-byte filter before each comparison).
#[must_use]
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    let Some(first) = needle.first() else {
        return false;
    };
    haystack
        .windows(needle.len())
        .any(|w| w[0] == *first && w == needle)
}

/// A capability in its three forms at rest: raw, base64url (no padding) and the lowercase hex of
/// its bytes (`no-capability-at-rest`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapabilityForms {
    /// The raw bytes.
    pub raw: [u8; 32],
    /// Base64url without padding.
    pub base64url: String,
    /// Lowercase hex.
    pub hex: String,
}

impl CapabilityForms {
    /// The three forms of `raw`.
    #[must_use]
    pub fn of(raw: [u8; 32]) -> Self {
        Self {
            raw,
            base64url: base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw),
            hex: Sha256Digest::from_bytes(raw).to_hex(),
        }
    }

    /// Whether any form occurs in `bytes`.
    #[must_use]
    pub fn found_in(&self, bytes: &[u8]) -> bool {
        contains(bytes, &self.raw)
            || contains(bytes, self.base64url.as_bytes())
            || contains(bytes, self.hex.as_bytes())
    }
}

/// What became of the one spawn an offer may get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpawnFate {
    /// The command was emitted but never answered (crash): a process may exist.
    Emitted,
    /// The supervisor reported a process.
    Started,
    /// The supervisor proved that no process was started.
    Rejected,
    /// The outcome is unknown to the Worker (a process may exist).
    Unknown,
}

impl SpawnFate {
    /// The fate of a spawn the [`World`] answered with `answer`.
    #[must_use]
    pub fn of(answer: Answer) -> Self {
        match answer {
            Answer::Ok => Self::Started,
            Answer::Rejected => Self::Rejected,
            Answer::CrashBefore | Answer::CrashAfter => Self::Emitted,
            _ => Self::Unknown,
        }
    }
}

/// `start-failure-proof`: a start failure is proven only when the offer got no spawn, or its
/// spawn was answered `Rejected`, and no process of the offer is alive.
#[must_use]
pub fn start_failure_proven(fate: Option<SpawnFate>, alive: bool) -> bool {
    matches!(fate, None | Some(SpawnFate::Rejected)) && !alive
}

/// The spawn rules `at-most-one-spawn`, `at-most-once-attempt` and `at-most-once-run`, for a
/// spawn of `(offer, attempt, run)`: `earlier` spawns of the same offer came before it, `of_run`
/// holds the Attempt and offer of every earlier spawn of the Run (this spawn is appended), and
/// `lost` the Attempts the control plane declared lost (a later Attempt of the Run may then
/// run; a lost one never again). `alias` names an offer. Returns the rules broken.
pub fn spawn_once(
    earlier: u32,
    of_run: &mut Vec<(AttemptId, OfferId)>,
    (offer, attempt, run): (&OfferId, &AttemptId, &RunId),
    lost: &BTreeSet<AttemptId>,
    alias: &dyn Fn(&OfferId) -> String,
) -> Vec<Violation> {
    let name = alias(offer);
    let mut broken = Vec::new();
    if earlier > 0 {
        broken.push(Violation {
            invariant: "at-most-one-spawn",
            detail: format!("spawn #{} of {name}", earlier + 1),
        });
    }
    if let Some((_, first)) = of_run.iter().find(|(a, _)| a == attempt) {
        broken.push(Violation {
            invariant: "at-most-once-attempt",
            detail: format!("second spawn of {attempt} ({}, then {name})", alias(first)),
        });
    }
    let detail = if lost.contains(attempt) {
        Some(format!(
            "spawn of {name}: the control plane declared {attempt} lost"
        ))
    } else {
        of_run
            .iter()
            .find(|(a, _)| a != attempt && !lost.contains(a))
            .map(|(other, first)| {
                format!(
                    "second spawn of Run {run} ({name}) while Attempt {other} ({}) was not \
                     declared lost",
                    alias(first)
                )
            })
    };
    if let Some(detail) = detail {
        broken.push(Violation {
            invariant: "at-most-once-run",
            detail,
        });
    }
    of_run.push((attempt.clone(), offer.clone()));
    broken
}

/// Which halts the last answer licenses: the Worker may halt only for a fact the host caused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct License {
    /// A write that may or may not have landed.
    pub uncertain: bool,
    /// A must-land write (a launch outcome) that failed cleanly.
    pub unrecorded: bool,
    /// The store refused a write.
    pub conflict: bool,
    /// Unsafe storage.
    pub unsafe_storage: bool,
    /// A Session exchange answered with anything but a valid answer.
    pub session: bool,
}

impl License {
    /// Whether `reason` is licensed.
    #[must_use]
    pub fn allows(self, reason: &HaltReason) -> bool {
        match reason {
            HaltReason::StoreUncertain => self.uncertain,
            HaltReason::LaunchOutcomeUnrecorded => self.unrecorded,
            HaltReason::StoreConflict => self.conflict,
            HaltReason::UnsafeStorage => self.unsafe_storage,
            HaltReason::SessionFenced { .. } | HaltReason::RegisterRejected { .. } => self.session,
        }
    }
}
/// Whether a Session exchange answered with `outcome` may end in a halt: a 409 (the fences
/// repeat), another 4xx refusal but 401/403, or a 200 whose body may be of the contract's shape
/// and break its CAS. Never an unavailable or uncertain outcome.
pub fn licenses_session_halt(outcome: &Outcome) -> bool {
    match outcome {
        Outcome::Http(HttpFailure::Status { status, .. }) => {
            matches!(status, 400..=499) && !matches!(status, 401 | 403 | 408 | 429)
        }
        Outcome::Responded(body) => serde_json::from_slice::<Value>(body).is_ok(),
        _ => false,
    }
}

/// What the answer `answer` (outcome `outcome`) to `action` licenses, should the Worker halt on
/// it: an uncertain write, a must-land record write that
/// failed cleanly, a refused write, unsafe storage, a final answer to a Session exchange.
#[must_use]
pub fn halt_license(action: &Action, answer: Answer, outcome: &Outcome) -> License {
    let store = |failure: StoreFailure| matches!(outcome, Outcome::Store(f) if *f == failure);
    let session = matches!(
        action,
        Action::Post(call) if matches!(
            act::operation(call),
            Operation::Register | Operation::Heartbeat | Operation::Transition
        )
    );
    License {
        uncertain: store(StoreFailure::Uncertain),
        unrecorded: answer == Answer::Unchanged && matches!(action, Action::PersistRecord { .. }),
        conflict: store(StoreFailure::Conflict),
        unsafe_storage: store(StoreFailure::Unsafe),
        session: session && licenses_session_halt(outcome),
    }
}

/// `recovery-licensed`: a `recovery_required` record only for a cause the seed injected: a
/// reason in `causes` (what the host licensed for this offer), or a lease-loss reason once the
/// durable lease has `expired` as the Worker may judge it. A lease-loss reason is also licensed
/// without expiry once the host said the supervisor and the process are gone with no receipt
/// that could complete the Run (issue 16).
///
/// # Errors
/// What is unlicensed.
pub fn recovery_licensed(
    record: &InboxRecord,
    causes: Option<&BTreeSet<RecoveryReason>>,
    expired: bool,
) -> Result<(), String> {
    let Some(reason) = record.recovery_reason else {
        return Ok(());
    };
    let caused = causes.is_some_and(|c| c.contains(&reason));
    let licensed = match reason {
        RecoveryReason::LeaseLostLocalExecutionUnverified
        | RecoveryReason::LeaseLostLocalExecutionStopped => expired || caused,
        RecoveryReason::LaunchOutcomeUnknown
        | RecoveryReason::ControlPlaneAlreadyRunning
        | RecoveryReason::ControlPlaneTerminal => caused,
    };
    if licensed {
        return Ok(());
    }
    Err(format!(
        "{} recovery_required({reason}) without an injected fault that leads there (causes \
         seen: {causes:?}; lease expires {})",
        record.offer.offer_id, record.offer.lease.expires_at_ms
    ))
}

/// The recovery reasons a control-plane answer licenses for the offer its request names: the
/// Run is already running elsewhere, or terminal.
#[must_use]
pub fn answer_causes(answer: &[u8]) -> Vec<RecoveryReason> {
    let mut out = Vec::new();
    if contains(answer, b"\"already_running\"") {
        out.push(RecoveryReason::ControlPlaneAlreadyRunning);
    }
    let terminal = [
        &b"\"already_terminal\""[..],
        b"\"status\":\"terminal\"",
        b"\"attemptStatus\":\"failed\"",
        b"\"attemptStatus\":\"cancelled\"",
        b"\"attemptStatus\":\"timed_out\"",
    ];
    if terminal.iter().any(|t| contains(answer, t)) {
        out.push(RecoveryReason::ControlPlaneTerminal);
    }
    out
}

/// `fail-closed-no-pull`: the durable record that forbids every Pull, if any: one that is
/// `recovery_required` (reference §4.7: fail closed; only an operator's archive removes it).
pub fn fail_closed_by<'a>(
    records: impl IntoIterator<Item = &'a InboxRecord>,
) -> Option<&'a InboxRecord> {
    records.into_iter().find(|r| r.recovery().is_some())
}

/// `pull-with-room`: a Pull writes a claim (the step before every `offers` request) only while
/// the inbox has a place for the offer it may bring (`records` stored, every one counting, of
/// `capacity`). A Pull that only settles a claim whose offer is already stored, while the inbox
/// is full, reads and clears that claim and writes none.
#[must_use]
pub fn pull_with_room(records: usize, capacity: usize) -> bool {
    records < capacity
}

/// `persist-valid`: a record write is a first publication of a valid `accepted` record at
/// revision 0 over no stored record, or a replace of the stored record at exactly
/// `expected + 1` that the journal's `check_transition` accepts.
///
/// # Errors
/// What the write breaks.
pub fn record_write(
    expected: Option<Revision>,
    stored: Option<&InboxRecord>,
    record: &InboxRecord,
) -> Result<(), String> {
    let id = &record.offer.offer_id;
    match (expected, stored) {
        (None, None) if record.revision != Revision::FIRST => Err(format!(
            "first publication of {id} at revision {}",
            record.revision
        )),
        (None, None) if record.state != State::Accepted || record.validate().is_err() => Err(
            format!("first publication of {id} is not a valid accepted record"),
        ),
        (None, None) => Ok(()),
        (None, Some(_)) => Err(format!("publication over the stored record of {id}")),
        (Some(_), None) => Err(format!("replace of the absent record of {id}")),
        (Some(revision), Some(stored)) => check_transition(stored, record, revision)
            .map_err(|e| format!("{id} {} -> {}: {e}", stored.state, record.state)),
    }
}

/// `claim-cas`: a claim write obeys the claim rules of `ql_worker_core::claim` (a create over
/// no claim, or over the identical one, which writes nothing; a replace at `expected + 1`).
///
/// # Errors
/// What the write breaks.
pub fn claim_write(
    expected: Option<Revision>,
    stored: Option<&PendingClaim>,
    proposed: &PendingClaim,
) -> Result<ClaimCreate, String> {
    match (expected, stored) {
        (None, stored) => check_create(stored, proposed).map_err(|e| format!("create: {e}")),
        (Some(revision), Some(stored)) => check_replace(stored, proposed, revision)
            .map(|()| ClaimCreate::Publish)
            .map_err(|e| format!("replace: {e}")),
        (Some(_), None) => Err(String::from("replace of an absent claim")),
    }
}

/// `claim-cas`: a claim clear names the stored claim and its revision.
///
/// # Errors
/// What the clear breaks.
pub fn claim_clear(
    stored: Option<&PendingClaim>,
    offer_id: &OfferId,
    revision: Revision,
) -> Result<(), String> {
    match stored {
        Some(stored) => check_clear(stored, offer_id, revision).map_err(|e| format!("clear: {e}")),
        None => Err(String::from("clear of an absent claim")),
    }
}

/// `claim-before-pull`: the `offers` request for `offer_id` with `token` only while that claim
/// is durable.
#[must_use]
pub fn claim_durable(stored: Option<&PendingClaim>, offer_id: &OfferId, token: &str) -> bool {
    stored.is_some_and(|c| c.offer_id == *offer_id && c.lease_token.expose() == token)
}

/// The lease version a control-plane answer grants (an `offers` answer's offer, or a
/// lease-control answer's renewed lease), if any.
#[must_use]
pub fn granted_version(answer: &[u8]) -> Option<u64> {
    let answer: Value = serde_json::from_slice(answer).unwrap_or(Value::Null);
    [
        &answer["leaseVersion"],
        &answer["offer"]["lease"]["version"],
    ]
    .into_iter()
    .find_map(Value::as_u64)
}

/// The attempts a pending claim gets before the Worker gives it up (reference §4.1, SPEC §8:
/// "≤ 16 attempts").
pub const CLAIM_ATTEMPTS: u8 = 16;

/// `receipt-removed-after-acknowledged`: a receipt is removed only while the record of its
/// Attempt (durably in `state`) is `completion_acknowledged`.
#[must_use]
pub fn receipt_removable(state: Option<State>) -> bool {
    state == Some(State::CompletionAcknowledged)
}

/// `renewal-only-retired` and `renewal-after-runs`: a new Session replaces the `stored` one only
/// while the control plane holds the stored one (`plane_holds_stored`) draining or offline,
/// and, draining, only once no Run of the stored Session may still be live (`launching`,
/// `started`, `running_acknowledged`, or `recovery_required(launch_outcome_unknown)`): a new
/// Session fences every lease of the old one. `records`: the durable inbox.
pub fn renewal<'r>(
    status: SessionStatus,
    plane_holds_stored: bool,
    stored: &SessionId,
    records: impl IntoIterator<Item = &'r InboxRecord>,
) -> Option<Violation> {
    if !plane_holds_stored || status == SessionStatus::Online {
        return Some(Violation {
            invariant: "renewal-only-retired",
            detail: format!(
                "a new Session while the stored one is {status:?} at the control plane (it holds \
                 the stored one: {plane_holds_stored})"
            ),
        });
    }
    if status == SessionStatus::Offline {
        return None;
    }
    records
        .into_iter()
        .find(|r| {
            let live = matches!(
                r.state,
                State::Launching | State::Started | State::RunningAcknowledged
            ) || r.recovery_reason == Some(RecoveryReason::LaunchOutcomeUnknown);
            live && r.offer.worker.session_id == *stored
        })
        .map(|r| Violation {
            invariant: "renewal-after-runs",
            detail: format!(
                "a new Session while {} ({}) of the old one may still run",
                r.offer.offer_id, r.state
            ),
        })
}

/// `request-cap`: a request body within the cap its call carries.
#[must_use]
pub fn request_within_cap(call: &HttpCall) -> bool {
    call.body.len() <= call.request_cap
}

/// `upload-first`: the artifact a completion `body` names (log id, byte length, SHA-256) is one
/// whose upload the Worker heard succeed: one of `heard` (the log id where the host keeps it,
/// the byte length, the SHA-256).
pub fn upload_heard<'u>(
    body: &Value,
    heard: impl IntoIterator<Item = (Option<&'u LogArtifactId>, u64, &'u Sha256Digest)>,
) -> bool {
    let artifact = body.get("artifact").unwrap_or(&Value::Null);
    let text = |key: &str| artifact.get(key).and_then(Value::as_str).unwrap_or("");
    let length = artifact
        .get("byteLength")
        .and_then(Value::as_u64)
        .unwrap_or(u64::MAX);
    let (log, sha) = (text("logArtifactId"), text("sha256"));
    heard
        .into_iter()
        .any(|(l, n, s)| l.is_none_or(|l| l.as_str() == log) && n == length && s.to_hex() == sha)
}

/// `no-secret-at-rest`: none of the Secret `values` the control plane handed out occurs in
/// `bytes`.
#[must_use]
pub fn secret_free<S: AsRef<str>>(bytes: &[u8], values: &[S]) -> bool {
    !values
        .iter()
        .any(|value| contains(bytes, value.as_ref().as_bytes()))
}

/// `receipt-authenticated`: an upload or a completion for an Attempt only while what the host
/// knows of its receipt (`genuine`; `None`: no receipt known) says it is the supervisor's
/// genuine one.
#[must_use]
pub fn receipt_authenticated(genuine: Option<bool>) -> bool {
    genuine == Some(true)
}

/// `running-ack-after-started`: the running ACK naming `handle` only while the durable record
/// (`stored`) is `started` with that handle.
#[must_use]
pub fn running_ack_allowed(stored: Option<&InboxRecord>, handle: &str) -> bool {
    stored.is_some_and(|r| {
        r.state == State::Started && r.executor_handle.as_ref().map(|h| h.as_str()) == Some(handle)
    })
}

/// `logs-kept`: no command deleted or shortened a log. `before`: every log's length before the
/// command; `now`: a log's length after it (`None`: gone). Returns the logs it broke.
pub fn logs_kept(
    before: &[(LogArtifactId, u64)],
    now: impl Fn(&LogArtifactId) -> Option<u64>,
) -> Vec<Violation> {
    before
        .iter()
        .filter_map(|(id, length)| {
            let after = now(id);
            after.is_none_or(|n| n < *length).then(|| Violation {
                invariant: "logs-kept",
                detail: format!("log {id} went from {length} to {after:?}"),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use ql_worker_core::io::Action;
    use ql_worker_core::record::State;
    use ql_worker_core::time::UnixMillis;

    use crate::testkit::world::World;
    use crate::testkit::{record, seeded_handle};

    fn violations(world: &mut World, action: &Action) -> Vec<&'static str> {
        world.check_act(UnixMillis::ZERO, action);
        world.violations.drain(..).map(|v| v.invariant).collect()
    }

    /// A stop names a handle the supervisor issued; a `started` write names the handle of a
    /// process spawned for its offer. Both checks fire on a command no spawn backs.
    #[test]
    fn a_stop_or_a_started_write_without_its_spawn_is_a_violation() {
        let mut world = World::one_offer(1);
        let stop = Action::Stop {
            handle: seeded_handle(1),
        };
        assert_eq!(violations(&mut world, &stop), ["stop-known-handle"]);
        let started = Action::PersistRecord {
            expected: None,
            record: Box::new(record(1, State::Started)),
        };
        assert!(
            violations(&mut world, &started).contains(&"started-needs-spawn"),
            "a started write with no process"
        );
        let running = Action::PersistRecord {
            expected: None,
            record: Box::new(record(1, State::RunningAcknowledged)),
        };
        assert!(!violations(&mut world, &running).contains(&"started-needs-spawn"));
    }

    #[test]
    fn a_pull_needs_a_place_in_the_inbox() {
        assert!(super::pull_with_room(63, 64));
        assert!(!super::pull_with_room(64, 64));
    }
}
