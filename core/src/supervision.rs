//! The lease-control supervisor of one offer (ADR-0118; reference §4.6): completion first,
//! then the lease.
//!
//! ```text
//! completion pass ─► acknowledged ─► done
//!                 ─► control plane terminal ─► stop ─► recovery_required(control_plane_terminal)
//! re-read record ─► lease expired locally ─► stop (no call) ─► recovery_required(lease_lost_*)
//!                ─► Session unusable ─► wait (no call, no stop)
//!                ─► lease-control ─► terminal ─► stop ─► recovery_required(control_plane_terminal)
//!                                 ─► renewed / stop_requested ─► persist the new lease FIRST
//!                                        ─► stop_requested ─► stop the exact process group
//! ```
//!
//! A renewal fenced at the persisted lease version `v` is tried again at `v + 1`, `v + 2`, … up
//! to the highest version the control plane may hold (issue 17): each renewal at version `x`
//! whose answer was lost (or garbled) may have committed and left it at `x + 1`, and the Worker
//! remembers the highest such version per Run (`Worker::lease_may_hold`); after a restart, which
//! forgets it, a crash between the control plane's commit and the Worker's write can have left
//! at most `v + 1`. Only a fence at that ceiling leaves the lease to its local expiry.
//!
//! Before a renewal is sent for a Run whose receipt is missing, the driver is asked whether the
//! Run's supervisor and user process still exist (issue 16): when both are gone, no receipt can
//! ever come and nothing runs, so renewing would hold the lease for nothing. The pass reads the
//! receipt once more (the supervisor publishes it before it exits), and if it is still missing
//! records `recovery_required(lease_lost_local_execution_stopped)` instead of renewing: the
//! Worker gives the lease up, the local execution is conclusively over, and the control plane
//! decides the outcome when the lease lapses there.
//!
//! A stop is only ever sent after the new lease is durable. Local lease expiry never contacts the
//! control plane: the Worker records whether its own stop was conclusive
//! (`lease_lost_local_execution_stopped`) or not (`…_unverified`) and never reports the Run lost.
//!
//! Each state takes the one kind of reply its action is answered with (`io::Reply`) and matches
//! every value of that kind: no wildcard arm (CONVENTIONS C7).
#![deny(clippy::wildcard_enum_match_arm)]

use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;

use crate::completion::{CompletionOp, CompletionOutcome, answer, post, read_record};
use crate::ids::{LeaseVersion, OfferId};
use crate::io::{Action, Liveness, Reply, StopOutcome};
use crate::record::{InboxRecord, RecoveryReason, State};
use crate::wire::lease_control::{LeaseControlRequest, LeaseControlResponse, RenewedLease};
use crate::wire::route::Operation;
use crate::worker::{CallFault, Uncertainty, next_record, persist, recovery};
use crate::worker::{Ctx, Step, write_failure};

/// What one supervision pass concluded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SupervisionResult {
    /// No such record.
    NotFound,
    /// Completion is acknowledged (now or before).
    Completed(CompletionOutcome),
    /// Nothing to supervise (settled or not supervised in this state).
    Settled,
    /// The control plane settled the Run at completion; stopped and recorded.
    CompletionTerminal(StopOutcome),
    /// The lease expired locally; stopped without contacting the control plane.
    LeaseExpired(StopOutcome),
    /// The Session is not usable; no call, no stop.
    SessionUnavailable,
    /// The lease was renewed and persisted.
    Renewed,
    /// The lease was renewed recently: no call this pass (pacing).
    Paced,
    /// Renewed and persisted, then the process was stopped as requested.
    StopRequested(StopOutcome),
    /// The Attempt is terminal at the control plane; stopped and recorded.
    Terminal(StopOutcome),
    /// The lease-control call got no answer and cannot have taken effect.
    Unavailable,
    /// The lease-control call at `attempted` may have renewed the lease (to `attempted + 1`),
    /// but no usable answer came back: the Worker remembers that the control plane may hold
    /// that version, and a fence at the next pass is retried up to it.
    Uncertain {
        /// The `expectedLeaseVersion` of the call whose answer was lost.
        attempted: LeaseVersion,
        /// Why.
        why: Uncertainty,
    },
    /// The lease-control call was refused.
    Refused(CallFault),
    /// The lease-control answer breaks the contract.
    LeaseResponseInvalid(String),
    /// A write failed cleanly.
    StorageUnchanged,
    /// Completion did not finish (receipt missing, upload failed...): the pass went on to the
    /// lease; this is what completion said.
    Pending(CompletionOutcome),
    /// The record carries recovery evidence written in this pass.
    Recovered(RecoveryReason, StopOutcome),
    /// The drain budget ended: the Run was stopped by identity (no call, nothing recorded);
    /// its receipt completes it through the normal path.
    DrainStopped(StopOutcome),
    /// The Run's supervisor and user process are both gone and no receipt that could complete
    /// the Run was published (none, or one that can never authenticate): no renewal was sent,
    /// and `recovery_required(lease_lost_local_execution_stopped)` was recorded (issue 16).
    SupervisorGone,
    /// A `launch_outcome_unknown` Run's supervisor and user process are both gone and no
    /// receipt that could complete it was published (a reboot, or both killed together):
    /// nothing is left to stop, renew or complete. Its record keeps its evidence (the first
    /// reason stays); the Worker supervises it no more in this incarnation.
    UnknownLaunchGone,
}

/// Why the process is being stopped, and what to record afterwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "sim-hooks", derive(Hash))]
enum StopCause {
    ControlPlaneTerminal,
    CompletionTerminal,
    LeaseExpired,
    Requested,
    /// The drain budget ended.
    Drain,
}

/// What a completion pass inside a supervision pass is for.
#[derive(Clone)]
#[cfg_attr(feature = "sim-hooks", derive(Hash))]
enum Pass {
    /// The pass's own completion (step 2).
    Own,
    /// The replay after lease control answered `terminal`.
    Replay,
    /// The supervisor and the process are both gone: completion once more (a receipt published
    /// just before the supervisor exited is found here) before concluding that none will come.
    Confirm(Box<InboxRecord>),
}

/// Whom an inspection or a read of the published handle serves: the pass's own next step
/// (`Own`: the lease-control call, or the stop), or a `launch_outcome_unknown` Run with no
/// receipt that could complete it (`Unknown`: what its completion said).
#[derive(Clone)]
#[cfg_attr(feature = "sim-hooks", derive(Hash))]
enum For<T> {
    Own(T),
    Unknown(CompletionOutcome),
}

#[derive(Clone)]
#[cfg_attr(feature = "sim-hooks", derive(Hash))]
enum SupervisionState {
    Completing(CompletionOp, Pass),
    Reading(CompletionOutcome),
    /// The call in flight.
    Controlling(Box<InboxRecord>, LeaseControlRequest),
    PersistingLease(Box<InboxRecord>, bool),
    Stopping(Box<InboxRecord>, StopCause),
    /// Recording the evidence a stop left (`Recovered`), or that the supervisor and the process
    /// are gone without a receipt (`SupervisorGone`); once it is durable the pass ends with this
    /// result.
    Recording(SupervisionResult),
    /// The completion replay did not settle a Run the control plane calls terminal: the record
    /// is read again before the stop (a renewal beside the replay's upload may have moved it).
    Restopping,
    /// Asking whether the supervisor and the user process still exist: before the call, or for
    /// a `launch_outcome_unknown` Run.
    Inspecting(Box<InboxRecord>, For<LeaseControlRequest>),
    /// Reading the handle the supervisor published before the user command ran: the record has
    /// none (a crash fell between the spawn and `started`), to stop by it; or a
    /// `launch_outcome_unknown` Run's, to ask whether anything of it is left.
    ReadingPublished(Box<InboxRecord>, For<StopCause>),
}

/// One supervision pass.
#[derive(Clone)]
#[cfg_attr(feature = "sim-hooks", derive(Hash))]
pub(crate) struct SupervisionOp {
    offer_id: OfferId,
    /// The lease was renewed less than the pacing interval ago (local time): skip the
    /// lease-control call this pass unless the lease is close to expiry.
    paced_ms: Option<u64>,
    /// The drain budget ended and this Run was not stopped yet: stop it (after completion,
    /// before any lease call).
    drain_stop: bool,
    /// The highest lease version the control plane may hold (lost renewals that may have
    /// committed; `Worker::lease_may_hold` when the pass began): a fenced renewal is retried at
    /// each version up to it.
    may_hold: Option<LeaseVersion>,
    /// A renewal beside the offer's own pass ([`SupervisionOp::renew`]): no completion of its own.
    renew_only: bool,
    state: SupervisionState,
}

impl core::fmt::Debug for SupervisionOp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("SupervisionOp")
            .field("offer_id", &self.offer_id)
            .finish_non_exhaustive()
    }
}

type LStep = Step<SupervisionOp, SupervisionResult>;

impl SupervisionOp {
    /// Whether the write awaited stores a lease this operation's lease-control call renewed (the
    /// control plane renews at the moment it answers, after the call was sent).
    pub(crate) fn grants_lease(&self) -> bool {
        matches!(self.state, SupervisionState::PersistingLease(..))
    }

    /// A pass for `offer_id`. `paced_ms`: the interval, when the lease was renewed less than it
    /// ago (the call is then skipped while more than three intervals of lease remain).
    /// `drain_stop`: the drain budget ended; stop the Run
    /// (see [`SupervisionResult::DrainStopped`]).
    pub(crate) fn begin(
        ctx: &Ctx<'_>,
        offer_id: OfferId,
        paced_ms: Option<u64>,
        drain_stop: bool,
    ) -> LStep {
        let pass = Self {
            may_hold: ctx.lease_may_hold.get(&offer_id).copied(),
            offer_id,
            paced_ms,
            drain_stop,
            renew_only: false,
            state: SupervisionState::Reading(CompletionOutcome::Deferred),
        };
        pass.complete(Pass::Own)
    }

    /// A renewal only (no completion): for an offer whose own pass is uploading its log, so
    /// that a transfer longer than the lease does not lose it. The same lease path as
    /// [`SupervisionOp::begin`]'s after its completion step.
    pub(crate) fn renew(ctx: &Ctx<'_>, offer_id: OfferId, paced_ms: Option<u64>) -> LStep {
        let pass = Self {
            may_hold: ctx.lease_may_hold.get(&offer_id).copied(),
            offer_id,
            paced_ms,
            drain_stop: false,
            renew_only: true,
            state: SupervisionState::Reading(CompletionOutcome::Deferred),
        };
        pass.after_completion(CompletionOutcome::Deferred)
    }

    pub(crate) fn offer_id(&self) -> &OfferId {
        &self.offer_id
    }

    fn wait(self, state: SupervisionState, action: Action) -> LStep {
        Step::Wait(Self { state, ..self }, action)
    }

    /// Reads the record, then goes on in `state`.
    fn reading(self, state: SupervisionState) -> LStep {
        let offer_id = self.offer_id.clone();
        self.wait(state, Action::ReadRecord { offer_id })
    }

    /// Begins a completion pass for `pass`.
    fn complete(self, pass: Pass) -> LStep {
        let (op, action) = CompletionOp::begin(self.offer_id.clone());
        self.wait(SupervisionState::Completing(op, pass), action)
    }

    pub(crate) fn resume(mut self, ctx: &Ctx<'_>, reply: Reply) -> LStep {
        match core::mem::replace(
            &mut self.state,
            SupervisionState::Reading(CompletionOutcome::Deferred),
        ) {
            SupervisionState::Completing(op, pass) => match op.resume(ctx, reply) {
                Step::Wait(op, action) => self.wait(SupervisionState::Completing(op, pass), action),
                Step::Done(result) => match pass {
                    Pass::Own => self.after_completion(result),
                    Pass::Replay => self.after_recompleting(result),
                    Pass::Confirm(record) => self.after_confirming(ctx, &record, result),
                },
                Step::Halt(reason) => Step::Halt(reason),
            },
            SupervisionState::Reading(completion) => self.on_record(ctx, completion, reply),
            SupervisionState::Restopping => match read(reply) {
                Ok(record) if record.state.is_terminal() => Step::Done(SupervisionResult::Settled),
                Ok(record) => self.stop(ctx, &record, StopCause::ControlPlaneTerminal),
                Err(step) => step,
            },
            SupervisionState::Controlling(record, request) => {
                self.on_control(ctx, record, &request, reply)
            }
            SupervisionState::PersistingLease(record, stop) => durable(reply, || {
                if stop {
                    self.stop(ctx, &record, StopCause::Requested)
                } else {
                    Step::Done(SupervisionResult::Renewed)
                }
            }),
            SupervisionState::Stopping(record, cause) => {
                self.record_recovery(ctx, &record, cause, reply.stop())
            }
            SupervisionState::Recording(result) => durable(reply, || Step::Done(result)),
            // The steps of a Run whose supervisor may be gone (issue 16).
            // Either may still exist, or nothing can be concluded: renew as before (a supervisor
            // that lives publishes its receipt; a process that lives is stopped by identity when
            // the control plane asks), or, for a `launch_outcome_unknown` Run, supervise it as
            // before (stopped by its published handle once the lease has expired).
            SupervisionState::Inspecting(record, then) => {
                match (both_gone(reply.supervision()), then) {
                    (true, _) => self.complete(Pass::Confirm(record)),
                    (false, For::Own(request)) => self.control(ctx, record, request),
                    (false, For::Unknown(completion)) => self.go_on(ctx, record, &completion),
                }
            }
            SupervisionState::ReadingPublished(record, then) => {
                match (reply.published_handle(), then) {
                    (handle, For::Own(cause)) => self.stop_by(ctx, &record, cause, handle),
                    (Some(handle), For::Unknown(completion)) => {
                        self.inspect_unknown(ctx, record, completion, handle)
                    }
                    (None, For::Unknown(completion)) => self.go_on(ctx, record, &completion),
                }
            }
        }
    }

    /// Asks whether a `launch_outcome_unknown` Run's supervisor and user process still exist,
    /// by `handle` (its record's, or the one its supervisor published).
    fn inspect_unknown(
        self,
        ctx: &Ctx<'_>,
        record: Box<InboxRecord>,
        completion: CompletionOutcome,
        handle: crate::ids::ExecutorHandle,
    ) -> LStep {
        let Some(log_artifact_id) = record.log_artifact_id.clone() else {
            return self.go_on(ctx, record, &completion);
        };
        self.inspect(record, handle, log_artifact_id, For::Unknown(completion))
    }

    /// Asks the host whether anything of the Run is left (its supervisor or user process, by
    /// the durable identity), `purpose` saying what follows the answer.
    fn inspect(
        self,
        record: Box<InboxRecord>,
        handle: crate::ids::ExecutorHandle,
        log_artifact_id: crate::ids::LogArtifactId,
        purpose: For<LeaseControlRequest>,
    ) -> LStep {
        let action = Action::InspectSupervision {
            log_artifact_id,
            handle,
        };
        self.wait(SupervisionState::Inspecting(record, purpose), action)
    }

    /// The completion replay after lease control answered `terminal` ended with `result`.
    fn after_recompleting(self, result: CompletionOutcome) -> LStep {
        match result {
            CompletionOutcome::AlreadyCompleted(_) | CompletionOutcome::Acknowledged(_) => {
                Step::Done(SupervisionResult::Completed(result))
            }
            // The replay got no usable answer, a transient read or write failed, or the control
            // plane refused the Worker's credentials (401, 403: an operator fixes them, the
            // completion must not be lost meanwhile): nothing says the control plane settled the
            // Run otherwise (the lost answer may well be our own completion's). The next pass
            // asks again; found by the hostile-network test (issue 17).
            CompletionOutcome::Unavailable
            | CompletionOutcome::StorageUnchanged
            | CompletionOutcome::ReceiptUnavailable
            | CompletionOutcome::ArtifactUnavailable
            | CompletionOutcome::Refused(CallFault::Rejected {
                status: 401 | 403, ..
            }) => Step::Done(SupervisionResult::Pending(result)),
            CompletionOutcome::NotFound
            | CompletionOutcome::Deferred
            | CompletionOutcome::ReceiptMissing
            | CompletionOutcome::ReceiptInvalid(_)
            | CompletionOutcome::ArtifactMissing
            | CompletionOutcome::ArtifactResponseInvalid(_)
            | CompletionOutcome::CompletionResponseInvalid(_)
            | CompletionOutcome::ControlPlaneTerminal
            | CompletionOutcome::Refused(_) => self.reading(SupervisionState::Restopping),
        }
    }

    /// After the confirming completion pass: still no receipt that could complete the Run
    /// ([`no_receipt_can_come`]) ⇒ record that the supervisor and the process are gone (no
    /// renewal); a completion ⇒ done; anything else ⇒ the next pass decides again.
    fn after_confirming(
        self,
        ctx: &Ctx<'_>,
        record: &InboxRecord,
        completion: CompletionOutcome,
    ) -> LStep {
        if let Some(done) = finished(&completion) {
            return Step::Done(done);
        }
        if !no_receipt_can_come(&completion) {
            return Step::Done(SupervisionResult::Pending(completion));
        }
        // Its evidence is written already: the first reason stays.
        if record.state == State::RecoveryRequired {
            return Step::Done(SupervisionResult::UnknownLaunchGone);
        }
        // Nothing wrote this record since it was read in this pass (the confirming completion
        // writes only on success), so the proposal is based on what was read.
        let reason = RecoveryReason::LeaseLostLocalExecutionStopped;
        let action = recovery(record, reason, ctx.now);
        let gone = SupervisionState::Recording(SupervisionResult::SupervisorGone);
        self.wait(gone, action)
    }

    /// Step 2–3: completion first.
    fn after_completion(self, completion: CompletionOutcome) -> LStep {
        if let Some(done) = finished(&completion) {
            return Step::Done(done);
        }
        self.reading(SupervisionState::Reading(completion))
    }

    /// Steps 3–6.
    fn on_record(self, ctx: &Ctx<'_>, completion: CompletionOutcome, reply: Reply) -> LStep {
        let record = match read(reply) {
            Ok(record) => record,
            Err(step) => return step,
        };
        if record.state.is_terminal() {
            return Step::Done(SupervisionResult::Settled);
        }
        if completion == CompletionOutcome::ControlPlaneTerminal {
            return self.stop(ctx, &record, StopCause::CompletionTerminal);
        }
        // A Run left `launch_outcome_unknown` with no receipt that could complete it: before
        // stopping or renewing, ask whether anything of it is left (a reboot ends both its
        // supervisor and its process; nothing would ever end its supervision otherwise).
        if record.recovery_reason == Some(RecoveryReason::LaunchOutcomeUnknown)
            && no_receipt_can_come(&completion)
        {
            return match record.executor_handle.clone() {
                Some(handle) => self.inspect_unknown(ctx, record, completion, handle),
                None => self.read_published(record, For::Unknown(completion)),
            };
        }
        self.go_on(ctx, record, &completion)
    }

    /// Steps 3–6 past the completion and the inspections: a stop, or the lease-control call.
    fn go_on(
        self,
        ctx: &Ctx<'_>,
        record: Box<InboxRecord>,
        completion: &CompletionOutcome,
    ) -> LStep {
        if ctx.lease_expired(&record) {
            return self.stop(ctx, &record, StopCause::LeaseExpired);
        }
        if self.drain_stop {
            return self.stop(ctx, &record, StopCause::Drain);
        }
        if !ctx.serves(&record.offer.worker) {
            return Step::Done(SupervisionResult::SessionUnavailable);
        }
        let remaining = ctx.lease_remaining_ms(&record);
        if self
            .paced_ms
            .is_some_and(|interval| remaining > interval.saturating_mul(3))
        {
            return Step::Done(SupervisionResult::Paced);
        }
        let request = LeaseControlRequest::from_offer(&record.offer);
        // No usable receipt: before renewing, ask whether anything of the Run is left (issue 16).
        if no_receipt_can_come(completion)
            && matches!(record.state, State::Started | State::RunningAcknowledged)
            && let (Some(handle), Some(log_artifact_id)) = (
                record.executor_handle.clone(),
                record.log_artifact_id.clone(),
            )
        {
            return self.inspect(record, handle, log_artifact_id, For::Own(request));
        }
        self.control(ctx, record, request)
    }

    /// Step 6: the lease-control call.
    fn control(
        self,
        ctx: &Ctx<'_>,
        record: Box<InboxRecord>,
        request: LeaseControlRequest,
    ) -> LStep {
        let body = request.to_body().expect(
            "invariant: a lease-control body of validated ids and a lease token (at most about \
             1 KiB) is far below its 8 KiB cap",
        );
        let action = post(ctx, Operation::LeaseControl, body);
        self.wait(SupervisionState::Controlling(record, request), action)
    }

    /// Steps 6–9.
    fn on_control(
        self,
        ctx: &Ctx<'_>,
        record: Box<InboxRecord>,
        request: &LeaseControlRequest,
        reply: Reply,
    ) -> LStep {
        let attempted = request.fence.expected_lease_version;
        let answer = match answer(reply, |body| LeaseControlResponse::parse(body, request)) {
            Ok(answer) => answer,
            Err(CallFault::Unavailable) => return Step::Done(SupervisionResult::Unavailable),
            Err(CallFault::Uncertain(why)) => {
                return Step::Done(SupervisionResult::Uncertain { attempted, why });
            }
            // Fenced: earlier renewals may have committed without their answers reaching the
            // disk. Ask at the next version, up to the highest one they could have left (the
            // persisted version + 1 at least: a renewal lost to a crash leaves no memory). There
            // is no version past the top of the range, at the control plane either.
            Err(CallFault::Fenced { code }) => {
                let persisted = record.offer.lease.version;
                let ceiling = persisted.next().ok().max(self.may_hold);
                return match request.fence.one_version_on() {
                    Some(fence) if ceiling.is_some_and(|c| fence.expected_lease_version <= c) => {
                        self.control(ctx, record, LeaseControlRequest { fence })
                    }
                    Some(_) | None => {
                        Step::Done(SupervisionResult::Refused(CallFault::Fenced { code }))
                    }
                };
            }
            Err(CallFault::Invalid(e)) => {
                return Step::Done(SupervisionResult::LeaseResponseInvalid(format!("{e}")));
            }
            Err(fault) => return Step::Done(SupervisionResult::Refused(fault)),
        };
        match answer {
            // A terminal lease may be our own completion whose answer was lost: replay the
            // completion once (an exact replay answers `already_completed`) before concluding
            // the control plane settled the Run otherwise.
            // A renewal beside the offer's own pass (which is uploading: see
            // `SupervisionOp::renew`) leaves a terminal Run to that pass: it is the one
            // completing it.
            LeaseControlResponse::Terminal(_) if self.renew_only => Step::Done(
                SupervisionResult::Pending(CompletionOutcome::ControlPlaneTerminal),
            ),
            LeaseControlResponse::Terminal(_) if crate::completion::eligible_state(&record) => {
                self.complete(Pass::Replay)
            }
            LeaseControlResponse::Terminal(_) => {
                self.stop(ctx, &record, StopCause::ControlPlaneTerminal)
            }
            LeaseControlResponse::Renewed(lease) => self.persist_lease(ctx, record, lease, false),
            LeaseControlResponse::StopRequested(lease, _) => {
                self.persist_lease(ctx, record, lease, true)
            }
        }
    }

    /// Step 8: the new lease is durable before anything else happens.
    fn persist_lease(
        self,
        ctx: &Ctx<'_>,
        record: Box<InboxRecord>,
        lease: RenewedLease,
        stop: bool,
    ) -> LStep {
        let old = &record.offer.lease;
        if lease.renewed_at_ms < old.renewed_at_ms || lease.renewed_at_ms < old.updated_at_ms {
            return Step::Done(SupervisionResult::LeaseResponseInvalid(String::from(
                "renewedAtMs is before the persisted lease",
            )));
        }
        let now = ctx.now.max(record.updated_at_ms);
        let proposed = next_record(&record, record.state, now, |r| {
            r.offer.lease.version = lease.lease_version;
            r.offer.lease.renewed_at_ms = lease.renewed_at_ms;
            r.offer.lease.expires_at_ms = lease.expires_at_ms;
            r.offer.lease.updated_at_ms = lease.renewed_at_ms.max(r.offer.lease.updated_at_ms);
        });
        let action = persist(&record, proposed.clone());
        self.wait(
            SupervisionState::PersistingLease(Box::new(proposed), stop),
            action,
        )
    }

    /// The stop helper: the exact process group of the durable handle. Without a handle, a
    /// `launching` record's process (or a `launch_outcome_unknown` one's) is found by the handle
    /// its supervisor published before the user command ran (issue 16); any other record has
    /// none.
    fn stop(self, ctx: &Ctx<'_>, record: &InboxRecord, cause: StopCause) -> LStep {
        if record.executor_handle.is_none() && may_have_process(record) {
            return self.read_published(Box::new(record.clone()), For::Own(cause));
        }
        self.stop_by(ctx, record, cause, record.executor_handle.clone())
    }

    /// Reads the handle `record`'s supervisor published, then goes on as `then` says.
    fn read_published(self, record: Box<InboxRecord>, then: For<StopCause>) -> LStep {
        let attempt_id = record.offer.candidate.attempt_id.clone();
        let action = Action::ReadPublishedHandle { attempt_id };
        self.wait(SupervisionState::ReadingPublished(record, then), action)
    }

    /// Stops by `handle`, or, without one, records what is known: nothing can be verified for
    /// a Run that may have a process (`launching`, `launch_outcome_unknown`); any other record
    /// has none.
    fn stop_by(
        self,
        ctx: &Ctx<'_>,
        record: &InboxRecord,
        cause: StopCause,
        handle: Option<crate::ids::ExecutorHandle>,
    ) -> LStep {
        match handle {
            Some(handle) => {
                let action = Action::Stop { handle };
                self.wait(
                    SupervisionState::Stopping(Box::new(record.clone()), cause),
                    action,
                )
            }
            None => {
                let stopped = if may_have_process(record) {
                    StopOutcome::Unknown
                } else {
                    StopOutcome::AlreadyExited
                };
                // No command was needed; continue as if the stop answered.
                self.record_recovery(ctx, record, cause, stopped)
            }
        }
    }

    /// Records the evidence after a stop, unless the record already carries recovery evidence
    /// (the first reason is kept) or is settled.
    fn record_recovery(
        self,
        ctx: &Ctx<'_>,
        record: &InboxRecord,
        cause: StopCause,
        stopped: StopOutcome,
    ) -> LStep {
        // What the pass concluded, and the evidence the stop leaves.
        let terminal = Some(RecoveryReason::ControlPlaneTerminal);
        let (done, reason) = match cause {
            StopCause::ControlPlaneTerminal => (SupervisionResult::Terminal(stopped), terminal),
            StopCause::CompletionTerminal => {
                (SupervisionResult::CompletionTerminal(stopped), terminal)
            }
            StopCause::LeaseExpired => (
                SupervisionResult::LeaseExpired(stopped),
                Some(match stopped {
                    StopOutcome::Stopped | StopOutcome::AlreadyExited => {
                        RecoveryReason::LeaseLostLocalExecutionStopped
                    }
                    StopOutcome::Unknown => RecoveryReason::LeaseLostLocalExecutionUnverified,
                }),
            ),
            StopCause::Requested => (SupervisionResult::StopRequested(stopped), None),
            StopCause::Drain => (SupervisionResult::DrainStopped(stopped), None),
        };
        let Some(reason) = reason else {
            return Step::Done(done);
        };
        if record.state == State::RecoveryRequired || record.state.is_terminal() {
            return Step::Done(done);
        }
        // Nothing wrote this record since it was read in this pass (a renewal's lease persist
        // never leads here), so the proposal is based on what was read.
        let action = recovery(record, reason, ctx.now);
        let result = SupervisionResult::Recovered(reason, stopped);
        self.wait(SupervisionState::Recording(result), action)
    }
}

/// What a completion pass that ends the supervision pass concluded (the Run is completed, or
/// its record is gone); `None` when the pass goes on.
fn finished(completion: &CompletionOutcome) -> Option<SupervisionResult> {
    match completion {
        CompletionOutcome::AlreadyCompleted(_) | CompletionOutcome::Acknowledged(_) => {
            Some(SupervisionResult::Completed(completion.clone()))
        }
        CompletionOutcome::NotFound => Some(SupervisionResult::NotFound),
        CompletionOutcome::Deferred
        | CompletionOutcome::ReceiptMissing
        | CompletionOutcome::ReceiptUnavailable
        | CompletionOutcome::ReceiptInvalid(_)
        | CompletionOutcome::ArtifactMissing
        | CompletionOutcome::ArtifactUnavailable
        | CompletionOutcome::ArtifactResponseInvalid(_)
        | CompletionOutcome::CompletionResponseInvalid(_)
        | CompletionOutcome::ControlPlaneTerminal
        | CompletionOutcome::Unavailable
        | CompletionOutcome::Refused(_)
        | CompletionOutcome::StorageUnchanged => None,
    }
}

/// Whether completion found no receipt that could ever complete the Run: none at all, or one
/// that can never authenticate (unreadable, forged, of another Run or start). A supervisor
/// writes its receipt once and never over an existing file, so once the supervisor and the
/// process are gone, nothing will replace it. A receipt "finished in the future" may pass once
/// this host's wall clock catches up (a clock stepped back), so it is not among them.
fn no_receipt_can_come(completion: &CompletionOutcome) -> bool {
    match completion {
        CompletionOutcome::ReceiptMissing => true,
        CompletionOutcome::ReceiptInvalid(error) => {
            *error != Some(crate::receipt::ReceiptError::FinishedInFuture)
        }
        CompletionOutcome::AlreadyCompleted(_)
        | CompletionOutcome::Acknowledged(_)
        | CompletionOutcome::NotFound
        | CompletionOutcome::Deferred
        | CompletionOutcome::ReceiptUnavailable
        | CompletionOutcome::ArtifactMissing
        | CompletionOutcome::ArtifactUnavailable
        | CompletionOutcome::ArtifactResponseInvalid(_)
        | CompletionOutcome::CompletionResponseInvalid(_)
        | CompletionOutcome::ControlPlaneTerminal
        | CompletionOutcome::Unavailable
        | CompletionOutcome::Refused(_)
        | CompletionOutcome::StorageUnchanged => false,
    }
}

/// Whether an inspection found the Run's supervisor and user process both gone.
fn both_gone(found: (Liveness, Liveness)) -> bool {
    match found {
        (Liveness::Gone, Liveness::Gone) => true,
        (Liveness::Alive | Liveness::Unknown, _)
        | (Liveness::Gone, Liveness::Alive | Liveness::Unknown) => false,
    }
}

/// Whether a record without a handle may still have a process (`launching`, or
/// `launch_outcome_unknown`): its supervisor's published handle is the only way to it.
fn may_have_process(record: &InboxRecord) -> bool {
    record.state == State::Launching
        || record.recovery_reason == Some(RecoveryReason::LaunchOutcomeUnknown)
}

/// The record a read returned, or how the pass ends without one.
#[allow(clippy::result_large_err)]
fn read(reply: Reply) -> Result<Box<InboxRecord>, LStep> {
    read_record(
        reply.record(),
        SupervisionResult::NotFound,
        SupervisionResult::StorageUnchanged,
    )
}

/// A write's answer: `then` once it is durable; a clean failure ends the pass unchanged.
fn durable(reply: Reply, then: impl FnOnce() -> LStep) -> LStep {
    match reply.durable() {
        Ok(()) => then(),
        Err(failure) => write_failure(failure, || Step::Done(SupervisionResult::StorageUnchanged)),
    }
}
