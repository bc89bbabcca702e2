//! What the driver observes, as events and metrics (issue 18).
//!
//! The driver makes no protocol decision; it reports. [`Telemetry`] derives every event and
//! metric from three sources only:
//!
//! * what the driver itself performs and sees: each call and its transport error (operation,
//!   class, status, code, TLS cause), each record it reads or persists (a transition is the state
//!   it persists against the state it last saw), each storage fault with its path and rule, each
//!   upload's bytes and seconds;
//! * the typed facts of the core ([`ql_worker_core::facts::Fact`]): what a finished operation
//!   concluded, why admission paused, that the drain budget ended;
//! * the loop's own housekeeping (retention, signals, TLS reloads).
//!
//! It is one value owned by the effects ([`crate::host::Host`]), with one method per observation,
//! so a reshaped loop (issue 16: lanes, calls on worker threads) calls the same methods from
//! wherever the observation is made.

use std::collections::{HashMap, HashSet};
use std::fmt;

use ql_worker_core::facts::Fact;
use ql_worker_core::ids::OfferId;
use ql_worker_core::record::{InboxRecord, RecoveryReason, State};
use ql_worker_core::session::Exchange;
use ql_worker_core::worker::{CallFault, SessionStatus, Uncertainty};

use crate::events::Event;
use crate::https::{Blame, TlsFailure, TransportError};
use crate::metrics::Metrics;

/// The result class of a control-plane call (the `class` field and the `result` label).
#[must_use]
pub fn call_class(error: &TransportError) -> &'static str {
    match error {
        TransportError::Status {
            status: 401 | 403, ..
        } => "refused",
        TransportError::Status { status: 409, .. } => "fenced",
        TransportError::Status { status, .. }
            if *status >= 500 || *status == 408 || *status == 429 =>
        {
            "unavailable"
        }
        TransportError::Status { .. } => "rejected",
        other => match other.blame() {
            Blame::Tls => "tls",
            Blame::Connection => "connection",
            Blame::Local => "local",
            Blame::Remote => "protocol",
        },
    }
}

/// A stable name for a TLS failure's cause (the `tls_cause` field).
#[must_use]
pub fn tls_cause(failure: &TlsFailure) -> &'static str {
    match failure {
        TlsFailure::UnknownIssuer => "UnknownIssuer",
        TlsFailure::HostnameMismatch => "NotValidForName",
        TlsFailure::Expired => "Expired",
        TlsFailure::NotYetValid => "NotValidYet",
        TlsFailure::BadServerCertificate { .. } => "BadServerCertificate",
        TlsFailure::ProtocolVersion => "ProtocolVersion",
        TlsFailure::ClientCertificateRejected { .. } => "ClientCertificateRejected",
        TlsFailure::NotTls { .. } => "NotTls",
        _ => "Other",
    }
}

/// The operation of a Worker-ingress path (its last segment).
#[must_use]
pub fn operation(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn fault_text(fault: &CallFault) -> String {
    match fault {
        CallFault::Unavailable => String::from("no usable answer"),
        CallFault::Uncertain(why) => {
            format!("an uncertain outcome (it may have taken effect): {why}")
        }
        CallFault::Fenced { code } => {
            format!("409 {}", code.as_deref().unwrap_or("without a code"))
        }
        CallFault::Rejected { status, code } => {
            format!("{status} {}", code.as_deref().unwrap_or("without a code"))
        }
        CallFault::Invalid(e) => format!("an answer that breaks the contract: {e}"),
    }
}

/// Failures that a restart or a retry cannot fix without an operator (wrong CA, wrong name,
/// refused credentials): after a bounded time of nothing else, the Worker halts.
#[derive(Debug, Default)]
struct Unreachable {
    /// Since when (monotonic ms, `os::mono`) every such failure has gone unanswered by a good
    /// exchange.
    since_ms: Option<u64>,
    /// The last such failure.
    last: String,
}

/// Events and metrics of one Worker run.
#[derive(Debug)]
pub struct Telemetry {
    metrics: Metrics,
    /// Last state seen of each record (reads, listings, writes), for transitions and gauges.
    states: HashMap<OfferId, State>,
    /// Records reported as not startable here (`start.fenced`, `start.expired`) and unchanged
    /// since: each is reported once, not at every supervision page that finds it so; the gauge
    /// `unstartable_records` counts them.
    unstartable: HashSet<OfferId>,
    unreachable: Unreachable,
    /// The last storage fault that made the core halt or changed nothing (path and rule).
    last_storage_fault: Option<String>,
    last_in_flight: Option<usize>,
}

impl Telemetry {
    /// Telemetry into `metrics`.
    #[must_use]
    pub fn new(metrics: Metrics) -> Self {
        Self {
            metrics,
            states: HashMap::new(),
            unstartable: HashSet::new(),
            unreachable: Unreachable::default(),
            last_storage_fault: None,
            last_in_flight: None,
        }
    }

    /// The metrics registry.
    #[must_use]
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    fn count_call(&self, operation: &str, result: &'static str) {
        self.metrics.update(|r| {
            *r.calls.entry((operation.to_owned(), result)).or_default() += 1;
        });
    }

    /// A call answered 200.
    pub fn call_answered(&mut self, path: &str) {
        self.count_call(operation(path), "ok");
        self.unreachable = Unreachable::default();
    }

    /// A call that failed in transport or with a non-200 status.
    pub fn call_failed(&mut self, path: &str, error: &TransportError, now_ms: u64) {
        let op = operation(path);
        let class = call_class(error);
        self.count_call(op, class);
        let mut event = Event::warn("call.failed")
            .text("operation", op)
            .text("class", class);
        if let TransportError::Status { status, code } = error {
            event = event
                .number("status", u64::from(*status))
                .maybe("code", code.as_deref());
        }
        if let TransportError::Tls(failure) = error {
            event = event.text("tls_cause", tls_cause(failure));
        }
        event
            .text("cause", error)
            .emit(format_args!("{op} call failed ({class}): {error}"));
        if matches!(class, "tls" | "refused") {
            self.unreachable_failure(now_ms, format!("{op}: {error}"));
        }
    }

    /// The credential file could not be used (the call was not sent).
    pub fn credential_unreadable(&mut self, path: &str, problem: &str, now_ms: u64) {
        let op = operation(path);
        self.count_call(op, "credential");
        Event::error("credential.unreadable")
            .text("operation", op)
            .text("rule", problem)
            .emit(format_args!("{op} call not sent: {problem}"));
        self.unreachable_failure(now_ms, problem.to_owned());
    }

    fn unreachable_failure(&mut self, now_ms: u64, what: String) {
        self.unreachable.since_ms.get_or_insert(now_ms);
        self.unreachable.last = what;
    }

    /// When TLS or credential failures, and no good exchange, have lasted `bound_ms` or more:
    /// what to say as the Worker halts.
    #[must_use]
    pub fn unreachable_for(&self, now_ms: u64, bound_ms: u64) -> Option<String> {
        let since = self.unreachable.since_ms?;
        let lasted = now_ms.saturating_sub(since);
        (lasted >= bound_ms).then(|| {
            format!(
                "no authenticated exchange with the control plane for {} s, only TLS or \
                 credential failures (control_plane.give_up_after_ms = {bound_ms}); the last: {}",
                lasted / 1000,
                self.unreachable.last
            )
        })
    }

    /// A record as read from the inbox (no transition: the state as it is).
    pub fn record_seen(&mut self, record: &InboxRecord) {
        self.states
            .insert(record.offer.offer_id.clone(), record.state);
        self.refresh_records();
    }

    /// A record durably written: its transition from the state last seen.
    pub fn record_persisted(&mut self, record: &InboxRecord) {
        let id = &record.offer.offer_id;
        let from = self.states.insert(id.clone(), record.state);
        if from != Some(record.state) {
            // It moved on: whatever made it not startable has passed.
            self.unstartable.remove(id);
        }
        self.refresh_records();
        if from == Some(record.state) {
            return; // a renewed lease: same state, counted with the renewals
        }
        let from_name = from.map_or("none", State::as_str);
        let reason = record.recovery_reason.map(RecoveryReason::as_str);
        let candidate = &record.offer.candidate;
        Event::info("record.transition")
            .text("offer", id)
            .text("run", &candidate.run_id)
            .text("attempt", &candidate.attempt_id)
            .text("from", from_name)
            .text("to", record.state.as_str())
            .number("revision", record.revision.get())
            .maybe("reason", reason)
            .emit(format_args!(
                "offer {id} (run {}, attempt {}): {from_name} -> {}{}",
                candidate.run_id,
                candidate.attempt_id,
                record.state,
                reason.map(|r| format!("({r})")).unwrap_or_default()
            ));
        let outcome = match record.state {
            State::CompletionAcknowledged => Some("completed"),
            State::StartFailureAcknowledged => Some("start_failed"),
            State::RecoveryRequired => Some("recovery_required"),
            _ => None,
        };
        if let Some(outcome) = outcome {
            self.metrics
                .update(|r| *r.runs.entry(outcome).or_default() += 1);
        }
        if let Some(reason) = record.recovery_reason
            && record.state == State::RecoveryRequired
        {
            let next = crate::cli::advice(reason);
            Event::error("recovery.required")
                .text("offer", id)
                .text("run", &candidate.run_id)
                .text("attempt", &candidate.attempt_id)
                .text("reason", reason.as_str())
                .maybe("executor_handle", record.executor_handle.as_ref())
                .text("next_step", next)
                .emit(format_args!(
                    "offer {id} is recovery_required ({reason}); the Worker takes no new work \
                     until it is archived. Next step: {next} (`ql-worker recover` shows it)"
                ));
        }
    }

    /// The inbox as the core's last Pull decision saw it; an event when it became full or has
    /// room again (`changed`).
    pub fn inbox(&mut self, inbox: &ql_worker_core::worker::InboxStatus, changed: bool) {
        self.metrics.update(|r| {
            r.inbox_capacity = inbox.capacity as u64;
            r.inbox_full = inbox.full;
            r.pull_deferrals = inbox.full_deferrals;
        });
        if changed && inbox.full {
            Event::warn("inbox.full")
                .number("records", inbox.records as u64)
                .number("capacity", inbox.capacity as u64)
                .number("deferrals", inbox.full_deferrals)
                .emit(format_args!(
                    "inbox full: {} of {} records; no offer is taken until retention frees a \
                     place (settled records with their receipt gone; see `ql-worker inbox \
                     list`; dormant and recovery_required records stay until archived, see \
                     `ql-worker recover`); Pulls held back so far: {}",
                    inbox.records, inbox.capacity, inbox.full_deferrals
                ));
        } else if changed {
            Event::info("inbox.room")
                .number("records", inbox.records as u64)
                .number("capacity", inbox.capacity as u64)
                .emit(format_args!(
                    "inbox has room again: {} of {} records",
                    inbox.records, inbox.capacity
                ));
        }
    }

    /// Records retention removed.
    pub fn records_removed(&mut self, removed: &[OfferId], logs: usize) {
        for id in removed {
            self.states.remove(id);
            self.unstartable.remove(id);
        }
        self.refresh_records();
        if !removed.is_empty() || logs > 0 {
            let count = removed.len();
            self.metrics.update(|r| {
                r.retention_records_removed += count as u64;
                r.retention_logs_removed += logs as u64;
            });
            Event::info("retention.removed")
                .number("records", count as u64)
                .number("logs", logs as u64)
                .emit(format_args!(
                    "retention removed {count} settled record(s) and {logs} log(s)"
                ));
        }
    }

    fn refresh_records(&self) {
        let mut by_state: std::collections::BTreeMap<&'static str, u64> = Default::default();
        for state in self.states.values() {
            *by_state.entry(state.as_str()).or_default() += 1;
        }
        let unstartable = self.unstartable.len() as u64;
        self.metrics.update(|r| {
            r.records = by_state;
            r.unstartable = unstartable;
        });
    }

    /// The pending claim is durable (the Pull is sent next).
    pub fn claim_persisted(&self, offer_id: &OfferId) {
        Event::debug("claim.persisted")
            .text("offer", offer_id)
            .emit(format_args!(
                "pending claim for offer {offer_id} is durable"
            ));
    }

    /// The pending claim was cleared.
    pub fn claim_cleared(&self, offer_id: &OfferId) {
        Event::debug("claim.cleared")
            .text("offer", offer_id)
            .emit(format_args!("pending claim for offer {offer_id} cleared"));
    }

    /// A storage fault: `what` the Worker was doing, the error naming the path and the rule.
    /// `halting`: the core halts on it (unsafe storage, or durability unknown).
    pub fn storage_fault(&mut self, what: &str, error: &dyn fmt::Display, halting: bool) {
        let text = error.to_string();
        let event = if halting {
            Event::error("storage.fault")
        } else {
            Event::warn("storage.fault")
        };
        event
            .text("operation", what)
            .text("error", &text)
            .flag("halting", halting)
            .emit(format_args!(
                "{what}: {text}{}",
                if halting {
                    ""
                } else {
                    " (nothing was changed; retried)"
                }
            ));
        if halting {
            self.last_storage_fault = Some(text);
        }
    }

    /// The last storage fault that made the core halt (path and rule).
    pub fn take_storage_fault(&mut self) -> Option<String> {
        self.last_storage_fault.take()
    }

    /// A log was uploaded.
    pub fn uploaded(&self, log: &ql_worker_core::ids::LogArtifactId, bytes: u64, seconds: f64) {
        self.metrics.update(|r| {
            r.uploads += 1;
            r.upload_bytes += bytes;
            r.upload_seconds += seconds;
        });
        Event::info("upload.done")
            .text("log", log)
            .number("bytes", bytes)
            .text("seconds", format_args!("{seconds:.3}"))
            .emit(format_args!(
                "log {log} uploaded: {bytes} bytes in {seconds:.3} s"
            ));
    }

    /// Drain progress: the records still in flight, when that number changed.
    pub fn drain_progress(&mut self, in_flight: usize) {
        self.metrics.update(|r| r.in_flight = in_flight as u64);
        if self.last_in_flight != Some(in_flight) {
            if self.last_in_flight.is_some() {
                Event::info("drain.progress")
                    .number("in_flight", in_flight as u64)
                    .emit(format_args!(
                        "draining: {in_flight} record(s) still in flight"
                    ));
            }
            self.last_in_flight = Some(in_flight);
        }
    }

    /// A fact of the core.
    #[allow(
        clippy::too_many_lines,
        reason = "one arm per fact, each a short mapping"
    )]
    pub fn fact(&mut self, fact: &Fact, now_ms: u64) {
        use ql_worker_core::completion::CompletionOutcome;
        use ql_worker_core::processor::ProcessResult;
        use ql_worker_core::pull::{PullFault, PullResult};
        use ql_worker_core::session::SessionResult;
        use ql_worker_core::supervision::SupervisionResult;
        match fact {
            Fact::Session(SessionResult::Registered(view)) => {
                self.metrics.update(|r| {
                    r.last_heartbeat_ms = Some(now_ms);
                    r.session_status = status_name(view.status);
                });
                Event::info("session.registered")
                    .text("session", &view.worker.session_id)
                    .number("generation", view.worker.generation.get())
                    .number("version", view.version)
                    .text("status", view.status.as_str())
                    .emit(format_args!(
                        "Session {} registered (generation {}, {})",
                        view.worker.session_id,
                        view.worker.generation.get(),
                        view.status.as_str()
                    ));
            }
            Fact::Session(SessionResult::Heartbeat(view)) => {
                self.metrics.update(|r| {
                    r.last_heartbeat_ms = Some(now_ms);
                    r.session_status = status_name(view.status);
                });
            }
            Fact::Session(SessionResult::Transitioned(view)) => {
                self.metrics
                    .update(|r| r.session_status = status_name(view.status));
                Event::info("session.transitioned")
                    .text("status", view.status.as_str())
                    .emit(format_args!("Session is {}", view.status.as_str()));
            }
            Fact::Session(SessionResult::Unanswered {
                exchange: Exchange::Transition(status),
                fault,
            }) => {
                Event::warn("session.transition_failed")
                    .text("status", status.as_str())
                    .text("cause", fault_text(fault))
                    .emit(format_args!(
                        "the transition to {} got no usable answer: {}",
                        status.as_str(),
                        fault_text(fault)
                    ));
            }
            // A register's failure is reported with its backoff (`session.register_failed`).
            Fact::Session(SessionResult::Unanswered {
                exchange: Exchange::Register,
                ..
            }) => {}
            Fact::Session(SessionResult::Unanswered {
                exchange: Exchange::Heartbeat,
                fault,
            }) => {
                // A failed call was reported with its cause (`call.failed`,
                // `credential.unreadable`); an answer that arrived but was unusable only the core
                // saw.
                if let CallFault::Uncertain(Uncertainty::Garbled(e)) = fault {
                    self.invalid_answer("heartbeat", &e.to_string());
                }
            }
            // The driver reports it with the Session it replaced (`session.renewed`).
            Fact::Session(SessionResult::Renewed(_)) => {}
            // Fences are reported as `Rejoining`; a final refusal ends the run with its message.
            Fact::Session(SessionResult::Fenced(_) | SessionResult::Rejected(_)) => {}
            Fact::Pull(PullResult::Failed { fault, retry_in_ms }) => {
                let wait = *retry_in_ms;
                let text = match fault {
                    PullFault::Call(fault) => {
                        if let CallFault::Uncertain(Uncertainty::Garbled(e))
                        | CallFault::Invalid(e) = fault
                        {
                            self.invalid_answer("offers", &e.to_string());
                        }
                        fault_text(fault)
                    }
                    PullFault::Admission(why) => format!("the offer was not admitted: {why}"),
                    PullFault::OfferConflict => {
                        String::from("a stored record for this offer id has another authority")
                    }
                    PullFault::CapacityExhausted => String::from("the inbox is full"),
                    PullFault::StorageUnchanged => {
                        String::from("a write failed cleanly (nothing changed)")
                    }
                    PullFault::BudgetExhausted => {
                        String::from("the claim used its 16 attempts and was cleared")
                    }
                };
                Event::warn("pull.failed")
                    .text("cause", &text)
                    .number("retry_in_ms", wait)
                    .emit(format_args!("Pull failed: {text}; retried in {wait} ms"));
            }
            Fact::Pull(PullResult::Fenced { offer_id }) => {
                Event::warn("pull.claim_fenced")
                    .text("offer", offer_id)
                    .emit(format_args!(
                        "Pull: the control plane fenced the replay of claim {offer_id} \
                         (409 worker_offer_fenced: its lease expired or moved on); the claim is \
                         cleared and the next Pull makes a fresh one"
                    ));
            }
            Fact::Pull(_) => {}
            Fact::Process { offer_id, result } => match result {
                ProcessResult::Refused(fault) => {
                    Event::warn("start.failed")
                        .text("offer", offer_id)
                        .text("cause", fault_text(fault))
                        .emit(format_args!(
                            "offer {offer_id}: the start path was refused: {}; the record is \
                             unchanged and retried",
                            fault_text(fault)
                        ));
                }
                ProcessResult::ActivationInvalid(why) => {
                    self.invalid_answer("starting", why);
                }
                ProcessResult::TargetFenced if self.unstartable.insert(offer_id.clone()) => {
                    self.refresh_records();
                    Event::warn("start.fenced")
                        .text("offer", offer_id)
                        .emit(format_args!(
                            "offer {offer_id} cannot start in this Session: it names another \
                             Session of this Worker, or this one is draining or its lease ran \
                             out (nothing changed; reported once). If it stays so until the \
                             offer's lease expires, the record is dormant: nothing ran, the \
                             control plane reclaims the Run, and `ql-worker recover` lists it \
                             for archiving"
                        ));
                }
                ProcessResult::OfferExpired if self.unstartable.insert(offer_id.clone()) => {
                    self.refresh_records();
                    Event::warn("start.expired")
                        .text("offer", offer_id)
                        .emit(format_args!(
                            "offer {offer_id}: its lease expired before it started; the record \
                             is dormant (nothing ran, the control plane reclaims the Run; \
                             reported once). It keeps a place in the inbox until archived: \
                             `ql-worker recover` lists it"
                        ));
                }
                ProcessResult::Uncertain(why) | ProcessResult::RenewalUncertain { why, .. } => {
                    if let Uncertainty::Garbled(e) = why {
                        self.invalid_answer("start-path", &e.to_string());
                    }
                    Event::warn("start.uncertain")
                        .text("offer", offer_id)
                        .text("cause", format_args!("{why}"))
                        .emit(format_args!(
                            "offer {offer_id}: a start-path call got no usable answer ({why}); \
                             the record is unchanged and the call retried"
                        ));
                }
                _ => {}
            },
            Fact::Supervise { offer_id, result } => {
                self.supervised(offer_id, result);
                if let SupervisionResult::Pending(outcome) = result {
                    let why = match outcome {
                        CompletionOutcome::ReceiptInvalid(e) => Some(format!(
                            "the receipt does not authenticate ({}); kept as evidence",
                            e.as_ref()
                                .map_or_else(|| String::from("unreadable"), ToString::to_string)
                        )),
                        CompletionOutcome::ArtifactMissing => {
                            Some(String::from("the log's spool file is missing"))
                        }
                        CompletionOutcome::ArtifactUnavailable => {
                            Some(String::from("the log's spool file cannot be read"))
                        }
                        CompletionOutcome::ReceiptUnavailable => {
                            Some(String::from("the receipt store cannot be read"))
                        }
                        CompletionOutcome::ArtifactResponseInvalid(e) => {
                            self.invalid_answer("artifacts", e);
                            Some(format!("the upload answer does not match: {e}"))
                        }
                        CompletionOutcome::CompletionResponseInvalid(e) => {
                            self.invalid_answer("completion", e);
                            Some(format!("the completion answer does not match: {e}"))
                        }
                        CompletionOutcome::Refused(fault) => {
                            Some(format!("the control plane refused: {}", fault_text(fault)))
                        }
                        _ => None,
                    };
                    if let Some(why) = why {
                        Event::warn("completion.failed")
                            .text("offer", offer_id)
                            .text("cause", &why)
                            .emit(format_args!(
                                "offer {offer_id}: completion did not finish: {why}; retried"
                            ));
                    }
                }
            }
            Fact::AdmissionPaused { status, code } => {
                self.metrics.update(|r| r.admission_paused = true);
                Event::warn("admission.paused")
                    .number("status", u64::from(*status))
                    .maybe("code", code.as_deref())
                    .emit(format_args!(
                        "the control plane refused the credentials ({status} {}): no new work \
                         until the next authenticated exchange; the Session and running Runs \
                         are kept",
                        code.as_deref().unwrap_or("without a code")
                    ));
            }
            Fact::AdmissionResumed => {
                self.metrics.update(|r| r.admission_paused = false);
                Event::info("admission.resumed")
                    .emit("the control plane authenticated the Worker again: taking new work");
            }
            Fact::Rejoining {
                detail,
                attempt,
                after_uncertain,
            } => {
                self.metrics.update(|r| r.admission_paused = true);
                let why = if *after_uncertain {
                    " after an exchange whose answer was lost (it may have committed)"
                } else {
                    ""
                };
                Event::warn("session.fenced")
                    .text("cause", detail)
                    .number("attempt", u64::from(*attempt))
                    .flag("after_uncertain", *after_uncertain)
                    .emit(format_args!(
                        "the control plane fenced the Session ({detail}){why}; registering it \
                         again (no new work meanwhile)"
                    ));
            }
            Fact::RegisterRetry {
                attempt,
                fault,
                retry_in_ms,
            } => {
                if let CallFault::Uncertain(Uncertainty::Garbled(e)) | CallFault::Invalid(e) = fault
                {
                    self.invalid_answer("register", &e.to_string());
                }
                Event::warn("session.register_failed")
                    .number("attempt", u64::from(*attempt))
                    .text("cause", fault_text(fault))
                    .number("retry_in_ms", *retry_in_ms)
                    .emit(format_args!(
                        "register got no usable answer ({}); attempt {attempt}, retried in \
                         {retry_in_ms} ms",
                        fault_text(fault)
                    ));
            }
            Fact::Rejoined => {
                self.metrics.update(|r| r.admission_paused = false);
                Event::info("session.rejoined")
                    .emit("the Session is registered again: taking new work");
            }
            Fact::DrainBegun { in_flight } => {
                self.metrics.update(|r| {
                    r.draining = true;
                    r.in_flight = *in_flight as u64;
                });
                self.last_in_flight = Some(*in_flight);
                Event::info("drain.begun")
                    .number("in_flight", *in_flight as u64)
                    .emit(format_args!(
                        "draining: no new work; {in_flight} record(s) in flight"
                    ));
            }
            Fact::DrainBudgetEnded { in_flight } => {
                Event::warn("drain.budget_ended")
                    .number("in_flight", *in_flight as u64)
                    .emit(format_args!(
                        "the drain budget ended with {in_flight} record(s) in flight: their \
                         Runs are stopped and completed, then the Session goes offline (a \
                         second signal stops at once)"
                    ));
            }
        }
    }

    fn invalid_answer(&self, operation: &'static str, why: &str) {
        self.metrics
            .update(|r| *r.invalid_answers.entry(operation).or_default() += 1);
        Event::warn("call.invalid_answer")
            .text("operation", operation)
            .text("cause", why)
            .emit(format_args!(
                "{operation}: the control plane's answer breaks the contract: {why}"
            ));
    }

    fn supervised(
        &self,
        offer_id: &OfferId,
        result: &ql_worker_core::supervision::SupervisionResult,
    ) {
        use ql_worker_core::supervision::SupervisionResult;
        let renewal = match result {
            SupervisionResult::Renewed => Some("renewed"),
            SupervisionResult::StopRequested(stopped) => {
                Event::info("run.stop_requested")
                    .text("offer", offer_id)
                    .text("stop", format_args!("{stopped:?}"))
                    .emit(format_args!(
                        "offer {offer_id}: the control plane asked to stop the Run; stop: \
                         {stopped:?}"
                    ));
                Some("stop_requested")
            }
            SupervisionResult::Unavailable => {
                Event::warn("renewal.failed")
                    .text("offer", offer_id)
                    .text("cause", "no usable answer")
                    .emit(format_args!(
                        "offer {offer_id}: lease renewal got no usable answer; retried"
                    ));
                Some("unavailable")
            }
            SupervisionResult::Uncertain { why, .. } => {
                if let Uncertainty::Garbled(e) = why {
                    self.invalid_answer("lease-control", &e.to_string());
                }
                Event::warn("renewal.uncertain")
                    .text("offer", offer_id)
                    .text("cause", format_args!("{why}"))
                    .emit(format_args!(
                        "offer {offer_id}: lease renewal may have committed but its answer is \
                         unusable ({why}); asked again, a fence then is retried one version on"
                    ));
                Some("uncertain")
            }
            SupervisionResult::Refused(CallFault::Fenced { code }) => {
                Event::warn("renewal.fenced")
                    .text("offer", offer_id)
                    .maybe("code", code.as_deref())
                    .emit(format_args!(
                        "offer {offer_id}: the control plane fenced the lease renewal (409 {}); \
                         the local lease expiry decides what happens to the Run",
                        code.as_deref().unwrap_or("without a code")
                    ));
                Some("fenced")
            }
            SupervisionResult::Refused(fault) => {
                Event::warn("renewal.failed")
                    .text("offer", offer_id)
                    .text("cause", fault_text(fault))
                    .emit(format_args!(
                        "offer {offer_id}: lease renewal refused: {}",
                        fault_text(fault)
                    ));
                Some("refused")
            }
            SupervisionResult::LeaseResponseInvalid(why) => {
                self.invalid_answer("lease-control", why);
                Some("invalid")
            }
            SupervisionResult::SupervisorGone => {
                Event::warn("run.supervisor_gone")
                    .text("offer", offer_id)
                    .emit(format_args!(
                        "offer {offer_id}: the Run's supervisor and user process are gone and \
                         no receipt was published: its lease is no longer renewed; recorded \
                         recovery_required(lease_lost_local_execution_stopped) (see `ql-worker \
                         recover`)"
                    ));
                None
            }
            SupervisionResult::UnknownLaunchGone => {
                Event::warn("run.supervisor_gone")
                    .text("offer", offer_id)
                    .emit(format_args!(
                        "offer {offer_id}: the Run's supervisor and user process are gone and \
                         no receipt was published: nothing of it is left to stop, renew or \
                         complete; its record keeps recovery_required(launch_outcome_unknown) \
                         (see `ql-worker recover`)"
                    ));
                None
            }
            SupervisionResult::DrainStopped(stopped) => {
                Event::warn("drain.run_stopped")
                    .text("offer", offer_id)
                    .text("stop", format_args!("{stopped:?}"))
                    .emit(format_args!(
                        "offer {offer_id}: Run stopped because the drain budget ended ({stopped:?}); \
                         its receipt completes it"
                    ));
                None
            }
            _ => None,
        };
        if let Some(result) = renewal {
            self.metrics
                .update(|r| *r.renewals.entry(result).or_default() += 1);
        }
    }
}

fn status_name(status: SessionStatus) -> &'static str {
    status.as_str()
}
