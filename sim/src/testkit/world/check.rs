//! The safety invariants, checked on every command before it takes effect.
//!
//! * `single-spawn`: at most one spawn per offer, across every crash and restart.
//! * `at-most-once-attempt`: at most one spawn per Attempt id, whatever offer carries it.
//! * `at-most-once-run`: a second spawn of a Run only for an Attempt the control plane created
//!   after it declared every earlier spawned Attempt of the Run lost (its decision, not a
//!   Worker double execution), and never of an Attempt it already declared lost.
//! * `spawn-barrier`: a spawn only while the durable record is `launching` with exactly the
//!   plan's offer, Run, Attempt, start time, log id, callback sequence and capability digest
//!   (core's `Barrier::check`, the rule the real supervisor runs).
//! * `fail-start-proof`: `start-failure` only when no spawn was issued for the offer, or the
//!   spawn was answered `Rejected` (and no process of the offer exists).
//! * `running-ack-after-started`: the running ACK only while `started` (with the same handle)
//!   is durable.
//! * `revision-plus-one`: every record write is a first publication at revision 0 or a replace
//!   at exactly `expected + 1` that the journal's `check_transition` accepts; every claim write
//!   obeys the claim rules of `ql_worker_core::claim`.
//! * `no-raw-capability`: no persisted record or claim contains drawn capability bytes (raw,
//!   base64url or hex).
//! * `claim-before-pull`: the `offers` request only with its claim (offer id, token) durable.
//! * `stored-before-clear`: a claim whose offer was delivered is cleared only once the offer is
//!   in the inbox.
//! * `upload-before-completion`: completion only names an artifact whose upload the Worker heard
//!   succeed (same log id, length and SHA-256).
//! * `genuine-receipt-only`: upload and completion only while the attempt's receipt is the
//!   supervisor's genuine one (never after a forged or malformed receipt).
//! * `completion-before-acknowledged`: `completion_acknowledged` is persisted only after the
//!   control plane applied the completion.
//! * `receipt-removed-after-acknowledged`: a receipt is removed only while its record is durably
//!   `completion_acknowledged`.
//! * `logs-kept`: no command deletes or shortens a log.
//! * `stop-after-durable-lease`: a stop only when the durable lease has expired locally, the
//!   control plane said the Run is terminal, or the `stop_requested` lease version is durable.
//! * `fail-closed-no-pull`: no Pull starts (its first command, reading the claim) while any
//!   durable record is `recovery_required` (reference §4.7: fail closed, never pull again).
//!
//! The driver adds `worker-error` (the Worker refused an outcome or halted on a conflict) and
//! `drain-no-pull` (no Pull starts once the Worker is draining), and the explorer `panic` (a
//! core assertion fired).

use base64::Engine as _;
use serde_json::Value;

use super::{SpawnPlan, World};
use crate::testkit::act;
use ql_worker_core::ids::{AttemptId, LogArtifactId, OfferId, Sha256Digest};
use ql_worker_core::io::Action;
use ql_worker_core::record::State;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::route::Operation;
use ql_worker_core::wire::session::SessionStatus;

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

impl World {
    /// Checks `action` against every invariant that concerns it, before it takes effect.
    pub(super) fn check_act(&mut self, now: UnixMillis, action: &Action) {
        match action {
            Action::Spawn(plan) => self.check_spawn(&SpawnPlan::of(plan)),
            Action::PersistRecord { record, .. } => {
                if let Ok(bytes) = ql_worker_core::envelope::encode(&**record) {
                    self.check_capability_free(&bytes, "record");
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
                if let Ok(bytes) = ql_worker_core::envelope::encode(&**claim) {
                    self.check_capability_free(&bytes, "claim");
                }
            }
            Action::ClearClaim { offer_id, .. } => {
                let delivered = self.evidence.delivered.get(offer_id) == Some(&true);
                if delivered && self.disk.record(offer_id).is_none() {
                    self.violation(
                        "stored-before-clear",
                        format!("claim of delivered offer {offer_id} cleared before it was stored"),
                    );
                }
            }
            Action::RemoveReceipt { attempt_id } => {
                let state = self.disk.record_of_attempt(attempt_id).map(|r| r.state);
                if state != Some(State::CompletionAcknowledged) {
                    self.violation(
                        "receipt-removed-after-acknowledged",
                        format!("receipt of {attempt_id} removed while the record is {state:?}"),
                    );
                }
            }
            Action::Post(call) => self.check_post(act::operation(call), &call.body),
            Action::UploadLog { header, .. } => {
                let v: Value = serde_json::from_slice(header).unwrap_or(Value::Null);
                let attempt = v.get("attemptId").and_then(Value::as_str).unwrap_or("");
                self.check_receipt_genuine(attempt, "upload");
            }
            Action::Stop { handle } => self.check_stop(now, handle.as_str()),
            Action::ReadClaim => {
                let evidence = self
                    .disk
                    .records
                    .values()
                    .find(|(r, _)| r.recovery().is_some());
                if let Some((record, _)) = evidence {
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

    /// A new Session replaces the stored one only while the control plane holds it draining or
    /// offline, and (draining) only once none of its Runs may still be live: a new Session
    /// fences every lease of the old one.
    fn check_renewal(&mut self) {
        let status = self.plane.session_status;
        if status == SessionStatus::Online {
            self.violation(
                "renewal-only-retired",
                String::from("a new Session while the stored one is online"),
            );
            return;
        }
        let live = self.disk.records.values().find(|(r, _)| {
            matches!(
                r.state,
                State::Launching | State::Started | State::RunningAcknowledged
            ) || r.recovery_reason
                == Some(ql_worker_core::record::RecoveryReason::LaunchOutcomeUnknown)
        });
        if let Some((record, _)) = live
            && status == SessionStatus::Draining
        {
            let name = alias(self, &record.offer.offer_id);
            self.violation(
                "renewal-after-runs",
                format!(
                    "a new Session while {name} ({}) may still run",
                    record.state
                ),
            );
        }
    }

    /// Checks that no command shortened or deleted a log (`before`: lengths before it ran).
    pub(crate) fn check_logs_kept(&mut self, before: &[(LogArtifactId, usize)]) {
        for (id, length) in before {
            let now = self.disk.logs.get(id).map(|l| l.content.len());
            if now.is_none_or(|n| n < *length) {
                self.violation(
                    "logs-kept",
                    format!("log {id} went from {length} to {now:?}"),
                );
            }
        }
    }

    /// Log lengths, for [`World::check_logs_kept`].
    #[must_use]
    pub fn log_lengths(&self) -> Vec<(LogArtifactId, usize)> {
        self.disk
            .logs
            .iter()
            .map(|(id, l)| (id.clone(), l.content.len()))
            .collect()
    }

    fn check_spawn(&mut self, plan: &SpawnPlan) {
        let name = alias(self, &plan.offer_id);
        let earlier = self.evidence.spawns.get(&plan.offer_id).map_or(0, |s| s.0);
        if earlier > 0 {
            self.violation("single-spawn", format!("spawn #{} of {name}", earlier + 1));
        }
        self.check_once_per_run(plan, &name);
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

    fn check_once_per_run(&mut self, plan: &SpawnPlan, name: &str) {
        let earlier = self
            .evidence
            .run_spawns
            .get(&plan.run_id)
            .cloned()
            .unwrap_or_default();
        if let Some((_, offer)) = earlier.iter().find(|(a, _)| *a == plan.attempt_id) {
            let first = alias(self, offer);
            self.violation(
                "at-most-once-attempt",
                format!("second spawn of {} ({first}, then {name})", plan.attempt_id),
            );
        }
        let lost = &self.plane.lost_attempts;
        let detail = if lost.contains(&plan.attempt_id) {
            Some(format!(
                "spawn of {name}: the control plane declared {} lost",
                plan.attempt_id
            ))
        } else {
            earlier
                .iter()
                .find(|(a, _)| *a != plan.attempt_id && !lost.contains(a))
                .map(|(attempt, offer)| {
                    format!(
                        "second spawn of Run {} ({name}) while Attempt {attempt} ({}) was not \
                         declared lost",
                        plan.run_id,
                        alias(self, offer)
                    )
                })
        };
        if let Some(detail) = detail {
            self.violation("at-most-once-run", detail);
        }
        self.evidence
            .run_spawns
            .entry(plan.run_id.clone())
            .or_default()
            .push((plan.attempt_id.clone(), plan.offer_id.clone()));
    }

    fn check_capability_free(&mut self, bytes: &[u8], what: &str) {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let leaked = self.evidence.windows.iter().any(|w| {
            contains(bytes, w)
                || contains(bytes, b64.encode(w).as_bytes())
                || contains(bytes, Sha256Digest::from_bytes(*w).to_hex().as_bytes())
        });
        if leaked {
            self.violation(
                "no-raw-capability",
                format!("a persisted {what} contains drawn capability bytes"),
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
                let durable = self.disk.claim.as_ref().is_some_and(|(c, _)| {
                    c.offer_id == offer_id && c.lease_token.expose() == text("leaseToken")
                });
                if !durable {
                    self.violation(
                        "claim-before-pull",
                        format!("offers request for {offer_id} without its durable claim"),
                    );
                }
            }
            Operation::StartFailure => {
                let spawned = self.evidence.spawns.get(&offer_id).copied();
                let alive = self.supervisor.of_offer(&offer_id).next().is_some();
                let proven = match spawned {
                    None => !alive,
                    Some((_, answer)) => answer == super::Answer::Rejected && !alive,
                };
                if !proven {
                    self.violation(
                        "fail-start-proof",
                        format!("start-failure of {name} after spawn {spawned:?}"),
                    );
                }
            }
            Operation::Running => {
                let handle = text("executorHandle");
                let ok = self.disk.record(&offer_id).is_some_and(|r| {
                    r.state == State::Started
                        && r.executor_handle.as_ref().map(|h| h.as_str()) == Some(handle.as_str())
                });
                if !ok {
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
        let artifact = v.get("artifact").cloned().unwrap_or(Value::Null);
        let log = artifact
            .get("logArtifactId")
            .and_then(Value::as_str)
            .unwrap_or("");
        let length = artifact
            .get("byteLength")
            .and_then(Value::as_u64)
            .unwrap_or(u64::MAX);
        let sha = artifact.get("sha256").and_then(Value::as_str).unwrap_or("");
        let uploaded = self.plane.runs.get(offer_id).is_some_and(|run| {
            run.uploads.iter().any(|(l, n, s, heard)| {
                *heard && l.as_str() == log && *n == length && s.to_hex() == sha
            })
        });
        if !uploaded {
            self.violation(
                "upload-before-completion",
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
            .is_some_and(|r| r.genuine && !r.malformed);
        if !genuine {
            self.violation(
                "genuine-receipt-only",
                format!("{what} for {attempt} without a genuine receipt"),
            );
        }
    }

    fn check_stop(&mut self, now: UnixMillis, handle: &str) {
        let Some(offer_id) = self
            .supervisor
            .by_handle(handle)
            .map(|p| p.offer_id.clone())
        else {
            return;
        };
        let record = self.disk.record(&offer_id);
        let expired = record.is_some_and(|r| r.offer.lease.expired_at(now));
        let durable_version = record.map_or(0, |r| r.offer.lease.version.get());
        let run = self.plane.runs.get(&offer_id);
        let terminal = run.is_some_and(|r| r.terminal_answered);
        let requested = run
            .and_then(|r| r.stop_requested_version)
            .is_some_and(|v| durable_version >= v);
        if !(expired || terminal || requested) {
            let name = alias(self, &offer_id);
            self.violation(
                "stop-after-durable-lease",
                format!("stop of {name} with durable lease version {durable_version}"),
            );
        }
    }
}

fn alias(world: &World, offer_id: &OfferId) -> String {
    world.alias(offer_id)
}
