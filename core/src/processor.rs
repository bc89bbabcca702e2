//! The Processor: the start path of one offer across the spawn barrier (ADR-0111 §2–§4;
//! reference §4.2; SPEC §5).
//!
//! ```text
//! read record ─► terminal shortcuts ─► target check (Session, drain, leases)
//!   launching (seen here, i.e. at restart) ─► recovery_required(launch_outcome_unknown),
//!                                             no materializer, executor or ACK
//!   accepted ─► starting ACK ─► starting_acknowledged ─┐
//!   starting_acknowledged ─► replay starting ACK ──────┴─► capability (entropy) ─► secrets
//!       ─► log allocation ─► exact environment ─► launching (durable) ─► spawn
//!            Started  ─► started ─► running ACK ─► running_acknowledged
//!            Rejected ─► start_failed ─► start-failure ─► start_failure_acknowledged
//!            Unknown  ─► recovery_required(launch_outcome_unknown)   (never start-failure)
//!   started ─► running ACK only (restart rule)
//!   start_failed ─► start-failure replay
//! ```
//!
//! The capability is drawn fresh for each launch attempt, lives only in this operation and in
//! the launch plan handed to the driver, and is wiped on drop; only its SHA-256 and the callback
//! sequence are persisted, in `launching`. Any failure before `launching` is durable leaves no
//! process behind: materialization failures become `start_failed`; transport failures leave
//! the record as it was, to be retried.
//!
//! Each state takes the one kind of reply its action is answered with (`io::Reply`) and matches
//! every value of that kind: no wildcard arm (CONVENTIONS C7).
#![deny(clippy::wildcard_enum_match_arm)]

use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use zeroize::Zeroizing;

use crate::capability::Capability;
use crate::completion::{answer, post, read_record};
use crate::ids::{CallbackSequence, ExecutorHandle, LeaseVersion, OfferId};
use crate::io::{Action, LaunchPlan, Reply, SpawnOutcome, StopOutcome, StoreFailure};
use crate::offer::DeliveryKind;
use crate::record::{InboxRecord, RecoveryReason, State};
use crate::revision::EnvValue;
use crate::supervision::{SupervisionOp, SupervisionResult};
use crate::time::UnixMillis;
use crate::wire::activation::{
    ActivationRequest, ActivationResponse, ActivationStatus, RunningAck, SnapshotShape,
};
use crate::wire::route::Operation;
use crate::wire::secrets::{self, EnvironmentBundle, SecretsRequest, SecretsResponse};
use crate::wire::session::SessionStatus;
use crate::worker::{CallFault, Uncertainty, next_record, persist, recovery};
use crate::worker::{Ctx, HaltReason, Step, write_failure};

/// What processing one offer concluded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcessResult {
    /// Running and acknowledged.
    Running,
    /// Already `running_acknowledged`.
    AlreadyRunning,
    /// Start failure reported and acknowledged.
    StartFailed,
    /// Already `start_failure_acknowledged`.
    AlreadyFailed,
    /// Already `completion_acknowledged`.
    AlreadyCompleted,
    /// The record is (now) `recovery_required`.
    RecoveryRequired(RecoveryReason),
    /// No such record.
    NotFound,
    /// The offer belongs to another Session, or the Session is offline, draining (for a new
    /// claim) or its lease expired. Nothing changed.
    TargetFenced,
    /// The offer's lease expired. Nothing changed.
    OfferExpired,
    /// A launch is not allowed now (fail-closed or draining). Nothing changed.
    Deferred,
    /// A call got no answer and cannot have taken effect; the record is unchanged and will be
    /// retried.
    Unavailable,
    /// A call may have taken effect but got no usable answer (issue 17); the record is
    /// unchanged and the call is retried (every call of the start path is replay-safe: the
    /// ACKs answer their replay, the Secret batch is a read).
    Uncertain(Uncertainty),
    /// The start path's renewal of the lease (at `attempted`) got no usable answer: the
    /// control plane may hold `attempted + 1`, which the next start-path call would name one
    /// behind. The record is unchanged; the next pass renews first, catching up to it.
    RenewalUncertain {
        /// The `expectedLeaseVersion` of the renewal whose answer was lost.
        attempted: LeaseVersion,
        /// Why.
        why: Uncertainty,
    },
    /// A call was refused; the record is unchanged.
    Refused(CallFault),
    /// An activation answer breaks the start contract (e.g. deadline without timeout); nothing
    /// spawned, nothing changed.
    ActivationInvalid(String),
    /// A write failed cleanly; nothing changed.
    StorageUnchanged,
}

/// The launch authority learned from the starting ACK.
#[derive(Clone)]
#[cfg_attr(feature = "sim-hooks", derive(Hash))]
struct Authority {
    record: Box<InboxRecord>,
    sequence: CallbackSequence,
    deadline: Option<UnixMillis>,
}

/// A launch attempt after the capability was drawn. `Clone` exists only for `Worker::fork` (the
/// model checker branches a Worker between two commands, which duplicates the in-memory
/// capability of a launch in flight, never persisted; `sim-hooks` feature).
#[cfg_attr(feature = "sim-hooks", derive(Clone, Hash))]
struct Launch {
    authority: Authority,
    capability: Capability,
}

/// The child's exact environment, Secret values included (see [`environment`]).
#[cfg_attr(feature = "sim-hooks", derive(Clone))]
struct Env(Vec<(String, Zeroizing<String>)>);

/// `Hash` by hand (`sim-hooks` feature): the values are `Zeroizing`, which has none.
#[cfg(feature = "sim-hooks")]
impl core::hash::Hash for Env {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        self.0.len().hash(state);
        for (name, value) in &self.0 {
            (name, value.as_str()).hash(state);
        }
    }
}

/// The Processor's states; each names the outcome it waits for.
#[cfg_attr(feature = "sim-hooks", derive(Clone, Hash))]
enum StartState {
    Reading,
    /// The starting ACK, first (from `accepted`) or replayed (from `starting_acknowledged`).
    AckingStarting(Box<InboxRecord>, ActivationRequest),
    PersistingStartingAck(Authority),
    DrawingCapability(Authority),
    FetchingSecrets(Box<Launch>, SecretsRequest),
    AllocatingLog(Box<Launch>, Env),
    PersistingLaunching(Box<Launch>, Env, Box<InboxRecord>),
    Spawning(Box<InboxRecord>),
    PersistingStarted(Box<InboxRecord>, Box<InboxRecord>),
    PersistingStartFailed(Box<InboxRecord>, bool),
    StoppingTerminal(Box<InboxRecord>),
    AckingRunning(Box<InboxRecord>, ActivationRequest),
    FailingStart(Box<InboxRecord>, ActivationRequest),
    /// The pass's last write (the running or start-failure ACK, or recovery evidence); once it
    /// is durable the pass ends with this result. `bool`: the write must land (a process may
    /// exist), else the Worker halts.
    Concluding(ProcessResult, bool),
    /// A renewal of the offer's lease before the next start-path call (see
    /// [`ProcessOp::renewal_due`]); then the record is read again in the state held here:
    /// `Reading` (before a starting or running ACK, the record is taken from its state), or
    /// `RereadingForSecrets`.
    Renewing(Box<SupervisionOp>, Box<StartState>),
    /// The record read again after a renewal, for the Secrets fetch of this launch.
    RereadingForSecrets(Box<Launch>),
}

/// One offer being processed.
#[cfg_attr(feature = "sim-hooks", derive(Clone, Hash))]
pub(crate) struct ProcessOp {
    offer_id: OfferId,
    /// The record state at which this pass last renewed the lease: at most one renewal per
    /// start-path call, whatever the renewal answered.
    renewed_in: Option<State>,
    state: StartState,
}

impl core::fmt::Debug for ProcessOp {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("ProcessOp")
            .field("offer_id", &self.offer_id)
            .finish_non_exhaustive()
    }
}

type PStep = Step<ProcessOp, ProcessResult>;

impl ProcessOp {
    /// The offer this operation processes.
    pub(crate) fn offer_id(&self) -> &OfferId {
        &self.offer_id
    }

    /// Whether this operation's next command begins or continues a launch before the spawn
    /// barrier (the starting ACK, the log, the `launching` write). Such a command, staged while
    /// a launch was allowed, is withdrawn if the Worker latched fail-closed or began to drain
    /// before it went out (another lane's outcome came in between: found by the simulation once
    /// calls overlapped, seed 8873): the record stays before the barrier, as a launch never
    /// begun does, and the operation ends [`ProcessResult::Deferred`].
    pub(crate) fn launching(&self) -> bool {
        matches!(
            self.state,
            StartState::AckingStarting(..)
                | StartState::AllocatingLog(..)
                | StartState::PersistingLaunching(..)
        )
    }

    /// Whether the write awaited stores a lease this pass's renewal obtained (see
    /// [`SupervisionOp::grants_lease`]).
    pub(crate) fn grants_lease(&self) -> bool {
        matches!(&self.state, StartState::Renewing(op, _) if op.grants_lease())
    }

    pub(crate) fn begin(offer_id: OfferId) -> PStep {
        let op = Self {
            offer_id,
            renewed_in: None,
            state: StartState::Reading,
        };
        op.reading(StartState::Reading)
    }

    fn wait(self, state: StartState, action: Action) -> PStep {
        Step::Wait(Self { state, ..self }, action)
    }

    /// Reads the record, then goes on in `state`.
    fn reading(self, state: StartState) -> PStep {
        let offer_id = self.offer_id.clone();
        self.wait(state, Action::ReadRecord { offer_id })
    }

    pub(crate) fn resume(mut self, ctx: &Ctx<'_>, reply: Reply) -> PStep {
        match core::mem::replace(&mut self.state, StartState::Reading) {
            StartState::Reading => self.on_read(ctx, reply.record()),
            StartState::AckingStarting(record, request) => {
                self.answered(reply, &request, |op, a| op.on_starting(ctx, record, a))
            }
            StartState::PersistingStartingAck(authority) => {
                self.durable(reply, false, |op| op.draw_capability(authority))
            }
            StartState::DrawingCapability(authority) => {
                let capability = Capability::from_entropy(&reply.entropy());
                let launch = Box::new(Launch {
                    authority,
                    capability,
                });
                self.fetch_secrets(ctx, launch)
            }
            StartState::FetchingSecrets(launch, request) => {
                self.on_secrets(ctx, launch, &request, reply)
            }
            StartState::AllocatingLog(launch, env) => {
                if reply.log_allocation() {
                    self.persist_launching(ctx, launch, env)
                } else {
                    self.start_failed(ctx, &launch.authority.record)
                }
            }
            StartState::PersistingLaunching(launch, env, record) => {
                self.durable(reply, false, |op| op.spawn(*launch, env, record))
            }
            StartState::Spawning(launching) => self.on_spawned(ctx, launching, reply.spawn()),
            StartState::PersistingStarted(launching, started) => match reply.durable() {
                Ok(()) => self.ack_running(ctx, started),
                // The process exists but `started` is not durable: record that the outcome is
                // unknown, or halt if even that cannot be written.
                Err(StoreFailure::Unchanged) => {
                    self.recover(ctx, &launching, RecoveryReason::LaunchOutcomeUnknown, true)
                }
                Err(failure) => self.write_failed(failure, true),
            },
            StartState::PersistingStartFailed(record, must_land) => {
                self.durable(reply, must_land, |op| op.fail_start(ctx, record))
            }
            // Whatever the stop found, the control plane holds the Run terminal.
            StartState::StoppingTerminal(record) => match reply.stop() {
                StopOutcome::Stopped | StopOutcome::AlreadyExited | StopOutcome::Unknown => {
                    self.recover(ctx, &record, RecoveryReason::ControlPlaneTerminal, false)
                }
            },
            StartState::AckingRunning(record, request) => {
                self.answered(reply, &request, |op, a| op.on_running(ctx, record, a))
            }
            StartState::FailingStart(record, request) => {
                self.answered(reply, &request, |op, a| op.on_start_failure(ctx, record, a))
            }
            StartState::Concluding(result, must_land) => {
                self.durable(reply, must_land, |_| Step::Done(result))
            }
            StartState::Renewing(op, resume) => self.renewing(op.resume(ctx, reply), resume),
            StartState::RereadingForSecrets(launch) => {
                self.on_reread_for_secrets(ctx, launch, reply.record())
            }
        }
    }

    /// A step of the renewal inside the start path (see [`ProcessOp::renewal_due`]).
    fn renewing(
        self,
        step: Step<SupervisionOp, SupervisionResult>,
        resume: Box<StartState>,
    ) -> PStep {
        match step {
            Step::Wait(op, action) => self.wait(StartState::Renewing(Box::new(op), resume), action),
            // A renewal whose answer was lost may have moved the control plane's lease version:
            // the pass ends there, as any uncertain call does, rather than send a call fenced by
            // the version it may have left behind (a fenced Secrets fetch is a start failure).
            Step::Done(SupervisionResult::Uncertain { attempted, why }) => {
                Step::Done(ProcessResult::RenewalUncertain { attempted, why })
            }
            // Any other answer leaves the next call to find out: the record is read again (the
            // renewal moved its revision and lease version, which the next call names).
            Step::Done(_) => self.reading(*resume),
            Step::Halt(reason) => Step::Halt(reason),
        }
    }

    /// The record read again after a renewal, before this launch's Secrets fetch.
    fn on_reread_for_secrets(
        self,
        ctx: &Ctx<'_>,
        mut launch: Box<Launch>,
        read: Result<Option<Box<InboxRecord>>, StoreFailure>,
    ) -> PStep {
        match read {
            Ok(Some(record)) if record.state == State::StartingAcknowledged => {
                launch.authority.record = record;
                self.fetch_secrets(ctx, launch)
            }
            // Moved on meanwhile (the renewal's own stop path recorded recovery): taken from
            // its state, as any pass would.
            read => self.on_read(ctx, read),
        }
    }

    /// Whether to renew `record`'s lease before the start-path call about to be sent: its
    /// renewal timer has come (`lease_control_interval` after the sending of the call that
    /// obtained the lease, on the monotonic clock) and this pass has not renewed at this state
    /// yet. A start path whose calls each take most of the request timeout (four calls of up
    /// to 15 s against a 30 s lease) would otherwise spend the lease before the first renewal,
    /// which lease control sends only once the Run is running. A lease this process did not
    /// obtain (a record found at restart, the offer of a claim replayed from an earlier
    /// attempt, granted who knows when) is renewed before its first call here. An interval of
    /// 0 (renew at every supervision tick) renews nothing here.
    fn renewal_due(&self, ctx: &Ctx<'_>, record: &InboxRecord) -> bool {
        let interval = ctx.config.lease_control_interval_ms;
        let offer_id = &record.offer.offer_id;
        interval > 0
            && self.renewed_in != Some(record.state)
            && (ctx.lease_may_hold.contains_key(offer_id)
                || ctx
                    .leases
                    .get(offer_id)
                    .is_none_or(|clock| ctx.mono >= clock.began.saturating_add(interval)))
            && !ctx.lease_expired(record)
    }

    /// Renews the lease through a renewal-only supervision pass on this lane (the record's
    /// revisions stay one sequence: nothing else of this offer is outstanding), then goes on
    /// by reading the record in the state `resume`.
    fn renew_first(mut self, ctx: &Ctx<'_>, state: State, resume: StartState) -> PStep {
        self.renewed_in = Some(state);
        let step = SupervisionOp::renew(ctx, self.offer_id.clone(), None);
        self.renewing(step, Box::new(resume))
    }

    /// An activation call's answer: `then` with it parsed, else the result that ends the
    /// operation without a change.
    fn answered(
        self,
        reply: Reply,
        request: &ActivationRequest,
        then: impl FnOnce(Self, &ActivationResponse) -> PStep,
    ) -> PStep {
        match answer(reply, |body| ActivationResponse::parse(body, request)) {
            Ok(answer) => then(self, &answer),
            Err(CallFault::Unavailable) => Step::Done(ProcessResult::Unavailable),
            Err(CallFault::Uncertain(why)) => Step::Done(ProcessResult::Uncertain(why)),
            Err(CallFault::Invalid(e)) => {
                Step::Done(ProcessResult::ActivationInvalid(format!("{e}")))
            }
            Err(fault) => Step::Done(ProcessResult::Refused(fault)),
        }
    }

    /// A write's answer: `then` once it is durable, else [`ProcessOp::write_failed`].
    fn durable(self, reply: Reply, must_land: bool, then: impl FnOnce(Self) -> PStep) -> PStep {
        match reply.durable() {
            Ok(()) => then(self),
            Err(failure) => self.write_failed(failure, must_land),
        }
    }

    /// A write did not land. `must_land`: the write records that a process may exist, so a
    /// clean failure still halts (the next start reconciles from disk).
    fn write_failed(self, failure: StoreFailure, must_land: bool) -> PStep {
        if must_land && failure == StoreFailure::Unchanged {
            return Step::Halt(HaltReason::LaunchOutcomeUnrecorded);
        }
        write_failure(failure, || Step::Done(ProcessResult::StorageUnchanged))
    }

    fn on_read(self, ctx: &Ctx<'_>, read: Result<Option<Box<InboxRecord>>, StoreFailure>) -> PStep {
        let record = match read_record(
            read,
            ProcessResult::NotFound,
            ProcessResult::StorageUnchanged,
        ) {
            Ok(record) => record,
            Err(step) => return step,
        };
        // Step 1: terminal shortcuts, then step 2: the target check.
        match (record.state, target_refusal(ctx, &record)) {
            (State::CompletionAcknowledged, _) => Step::Done(ProcessResult::AlreadyCompleted),
            (State::RunningAcknowledged, _) => Step::Done(ProcessResult::AlreadyRunning),
            (State::StartFailureAcknowledged, _) => Step::Done(ProcessResult::AlreadyFailed),
            (State::RecoveryRequired, _) => {
                let reason = record
                    .recovery_reason
                    .unwrap_or(RecoveryReason::LaunchOutcomeUnknown);
                Step::Done(ProcessResult::RecoveryRequired(reason))
            }
            (
                State::Accepted
                | State::StartingAcknowledged
                | State::Launching
                | State::Started
                | State::StartFailed,
                Some(refused),
            ) => Step::Done(refused),
            // Step 3: a `launching` record seen here was left by a previous incarnation.
            (State::Launching, None) => {
                self.recover(ctx, &record, RecoveryReason::LaunchOutcomeUnknown, true)
            }
            (State::Accepted | State::StartingAcknowledged, None) if ctx.may_launch => {
                self.ack_starting(ctx, record)
            }
            (State::Accepted | State::StartingAcknowledged, None) => {
                Step::Done(ProcessResult::Deferred)
            }
            (State::Started, None) => self.ack_running(ctx, record),
            (State::StartFailed, None) => self.fail_start(ctx, record),
        }
    }

    /// Step 4: the starting ACK, or its replay from `starting_acknowledged`.
    fn ack_starting(self, ctx: &Ctx<'_>, record: Box<InboxRecord>) -> PStep {
        if self.renewal_due(ctx, &record) {
            return self.renew_first(ctx, record.state, StartState::Reading);
        }
        let request = ActivationRequest::starting(&record.offer);
        let action = activation_call(ctx, &request);
        self.wait(StartState::AckingStarting(record, request), action)
    }

    /// Steps 4 and 6a: the starting ACK (first, or replayed from `starting_acknowledged`).
    fn on_starting(
        self,
        ctx: &Ctx<'_>,
        record: Box<InboxRecord>,
        answer: &ActivationResponse,
    ) -> PStep {
        match (answer.status, answer.shape) {
            (ActivationStatus::AlreadyRunning, _) | (_, SnapshotShape::Running) => self.recover(
                ctx,
                &record,
                RecoveryReason::ControlPlaneAlreadyRunning,
                false,
            ),
            (ActivationStatus::AlreadyTerminal, _) | (_, SnapshotShape::Terminal) => {
                self.recover(ctx, &record, RecoveryReason::ControlPlaneTerminal, false)
            }
            (
                ActivationStatus::Applied | ActivationStatus::AlreadyStarting,
                SnapshotShape::Starting,
            ) => {
                let mut authority = match launch_authority(record, answer) {
                    Ok(authority) => authority,
                    Err(reason) => return Step::Done(ProcessResult::ActivationInvalid(reason)),
                };
                if authority.record.state == State::StartingAcknowledged {
                    return self.draw_capability(authority);
                }
                let stored = &authority.record;
                let proposed = next_record(stored, State::StartingAcknowledged, ctx.now, |_| {});
                let action = persist(stored, proposed.clone());
                authority.record = Box::new(proposed);
                self.wait(StartState::PersistingStartingAck(authority), action)
            }
        }
    }

    fn draw_capability(self, authority: Authority) -> PStep {
        let action = Action::DrawEntropy;
        self.wait(StartState::DrawingCapability(authority), action)
    }

    /// Step 6c: resolve Secrets (in memory only).
    fn fetch_secrets(self, ctx: &Ctx<'_>, launch: Box<Launch>) -> PStep {
        let record = &launch.authority.record;
        match SecretsRequest::from_offer(&record.offer) {
            Ok(None) => {
                let none = SecretsResponse {
                    values: Vec::new(),
                    environment_bundles: Vec::new(),
                };
                self.materialize(ctx, launch, &none)
            }
            Ok(Some(_)) if self.renewal_due(ctx, record) => {
                let state = record.state;
                self.renew_first(ctx, state, StartState::RereadingForSecrets(launch))
            }
            Ok(Some(request)) => match request.to_body() {
                Ok(body) => {
                    let action = post(ctx, Operation::Secrets, body);
                    self.wait(StartState::FetchingSecrets(launch, request), action)
                }
                Err(_) => self.start_failed(ctx, &launch.authority.record),
            },
            Err(_) => self.start_failed(ctx, &launch.authority.record),
        }
    }

    fn on_secrets(
        self,
        ctx: &Ctx<'_>,
        launch: Box<Launch>,
        request: &SecretsRequest,
        reply: Reply,
    ) -> PStep {
        // The Secret batch is a read: every answer that is not final is retried at the next
        // pass, within the offer's lease (`target_refusal`), before any start failure. Final:
        // a fence (a ref that does not exist, a drifted digest, a stale lease), a request the
        // control plane refused as malformed, an answer of the contract's shape that drifts.
        match answer(reply, |body| SecretsResponse::parse(body, request)) {
            Ok(resolved) => self.materialize(ctx, launch, &resolved),
            Err(CallFault::Unavailable) => Step::Done(ProcessResult::Unavailable),
            Err(CallFault::Uncertain(why)) => Step::Done(ProcessResult::Uncertain(why)),
            Err(
                fault @ CallFault::Rejected {
                    status: 401 | 403, ..
                },
            ) => Step::Done(ProcessResult::Refused(fault)),
            Err(CallFault::Fenced { .. } | CallFault::Rejected { .. } | CallFault::Invalid(_)) => {
                self.start_failed(ctx, &launch.authority.record)
            }
        }
    }

    /// Step 6d: the exact environment with `secrets`, then the log; without one, a start
    /// failure.
    fn materialize(self, ctx: &Ctx<'_>, launch: Box<Launch>, secrets: &SecretsResponse) -> PStep {
        match environment(&launch.authority.record, secrets) {
            Some(env) => {
                let log_artifact_id = launch.authority.record.offer.log_artifact_id();
                let action = Action::AllocateLog { log_artifact_id };
                self.wait(StartState::AllocatingLog(launch, Env(env)), action)
            }
            None => self.start_failed(ctx, &launch.authority.record),
        }
    }

    /// Step 6e: the spawn barrier.
    fn persist_launching(self, ctx: &Ctx<'_>, launch: Box<Launch>, env: Env) -> PStep {
        let record = &launch.authority.record;
        // The target check again, right before the barrier: the calls since step 2 (the starting
        // ACK, Secrets, a renewal) may each have taken up to the request timeout, and a lease
        // that ran out meanwhile may already be the control plane's to hand out again.
        if let Some(refused) = target_refusal(ctx, record) {
            return Step::Done(refused);
        }
        let log_artifact_id = record.offer.log_artifact_id();
        // The host's clock as it reads now (reference §4.2 step 6e: `executorStartedAtMs = now`),
        // not the record's later `updatedAtMs` after the clock was stepped back: the start time
        // goes to the control plane, which refuses times too far ahead of its own.
        let started_at = ctx.now;
        let digest = launch.capability.digest();
        let sequence = launch.authority.sequence;
        let proposed = next_record(record, State::Launching, started_at, |r| {
            r.executor_started_at_ms = Some(started_at);
            r.log_artifact_id = Some(log_artifact_id);
            r.completion_receipt_callback_sequence = Some(sequence);
            r.completion_receipt_token_digest = Some(digest);
        });
        let action = persist(record, proposed.clone());
        self.wait(
            StartState::PersistingLaunching(launch, env, Box::new(proposed)),
            action,
        )
    }

    /// Step 6g: only now, with `launching` durable, spawn.
    fn spawn(self, launch: Launch, environment: Env, launching: Box<InboxRecord>) -> PStep {
        let Some(started_at) = launching.executor_started_at_ms else {
            unreachable!("a launching record carries its barrier fields");
        };
        let revision = &launching.offer.execution_revision;
        let plan = LaunchPlan {
            offer_id: launching.offer.offer_id.clone(),
            run_id: launching.offer.candidate.run_id.clone(),
            attempt_id: launching.offer.candidate.attempt_id.clone(),
            executor_started_at: started_at,
            command: revision.command.clone(),
            environment: environment.0,
            working_directory: revision.working_directory.clone(),
            timeout: revision.timeout_ms.zip(launch.authority.deadline),
            // The log id and the sequence `launching` was written with (`persist_launching`).
            log_artifact_id: launching.offer.log_artifact_id(),
            callback_sequence: launch.authority.sequence,
            capability: launch.capability,
        };
        let action = Action::Spawn(Box::new(plan));
        self.wait(StartState::Spawning(launching), action)
    }

    fn on_spawned(
        self,
        ctx: &Ctx<'_>,
        launching: Box<InboxRecord>,
        spawned: SpawnOutcome,
    ) -> PStep {
        let valid = match spawned {
            // The supervisor must echo the start time persisted in `launching`. It is not
            // compared with the wall clock again (the reference also requires `≤ now`): a clock
            // stepped back since the barrier would make a good spawn look like one from the
            // future, and `recovery_required` would follow.
            SpawnOutcome::Started { handle, started_at } => ExecutorHandle::new(handle)
                .ok()
                .filter(|_| Some(started_at) == launching.executor_started_at_ms),
            SpawnOutcome::Rejected => return self.start_failed(ctx, &launching),
            SpawnOutcome::Unknown => None,
        };
        let Some(handle) = valid else {
            return self.recover(ctx, &launching, RecoveryReason::LaunchOutcomeUnknown, true);
        };
        let proposed = next_record(&launching, State::Started, ctx.now, |r| {
            r.executor_handle = Some(handle);
        });
        let action = persist(&launching, proposed.clone());
        self.wait(
            StartState::PersistingStarted(launching, Box::new(proposed)),
            action,
        )
    }

    /// Step 7: the running ACK.
    fn ack_running(self, ctx: &Ctx<'_>, record: Box<InboxRecord>) -> PStep {
        let (Some(handle), Some(sequence), Some(digest)) = (
            record.executor_handle.clone(),
            record.completion_receipt_callback_sequence,
            record.completion_receipt_token_digest,
        ) else {
            unreachable!("a started record carries its handle and callback fields");
        };
        if self.renewal_due(ctx, &record) {
            return self.renew_first(ctx, record.state, StartState::Reading);
        }
        let ack = RunningAck {
            executor_handle: handle,
            log_artifact_id: record.log_artifact_id.clone(),
            callback_sequence: sequence,
            callback_token_digest: digest,
        };
        let request = ActivationRequest::running(&record.offer, ack);
        let action = activation_call(ctx, &request);
        self.wait(StartState::AckingRunning(record, request), action)
    }

    fn on_running(
        self,
        ctx: &Ctx<'_>,
        record: Box<InboxRecord>,
        answer: &ActivationResponse,
    ) -> PStep {
        match (answer.status, answer.shape) {
            // The control plane settled the Run while our process runs: stop the exact process
            // group first (as lease control's `terminal` does), then record the evidence.
            (ActivationStatus::AlreadyTerminal, _) | (_, SnapshotShape::Terminal) => {
                match record.executor_handle.clone() {
                    Some(handle) => self.wait(
                        StartState::StoppingTerminal(record),
                        Action::Stop { handle },
                    ),
                    None => self.recover(ctx, &record, RecoveryReason::ControlPlaneTerminal, false),
                }
            }
            (
                ActivationStatus::Applied | ActivationStatus::AlreadyRunning,
                SnapshotShape::Running,
            ) => {
                let result = if answer.status == ActivationStatus::AlreadyRunning {
                    ProcessResult::AlreadyRunning
                } else {
                    ProcessResult::Running
                };
                let proposed = next_record(&record, State::RunningAcknowledged, ctx.now, |_| {});
                let action = persist(&record, proposed);
                self.wait(StartState::Concluding(result, false), action)
            }
            (ActivationStatus::AlreadyStarting, SnapshotShape::Running)
            | (
                ActivationStatus::Applied
                | ActivationStatus::AlreadyRunning
                | ActivationStatus::AlreadyStarting,
                SnapshotShape::Starting,
            ) => Step::Done(ProcessResult::ActivationInvalid(String::from(
                "running ACK answered with a starting snapshot or status",
            ))),
        }
    }

    /// Persists `start_failed` (proof of no spawn), then reports it. From `launching` (the
    /// supervisor's `Rejected`) the write must land: left in `launching`, the record would be
    /// supervised as if a process existed and the proof of no spawn would be lost, so a failed
    /// write halts and the next start reconciles from disk.
    fn start_failed(self, ctx: &Ctx<'_>, record: &InboxRecord) -> PStep {
        let must_land = record.state == State::Launching;
        let proposed = next_record(record, State::StartFailed, ctx.now, |_| {});
        let action = persist(record, proposed.clone());
        self.wait(
            StartState::PersistingStartFailed(Box::new(proposed), must_land),
            action,
        )
    }

    /// Step 8: report the start failure.
    fn fail_start(self, ctx: &Ctx<'_>, record: Box<InboxRecord>) -> PStep {
        let request = ActivationRequest::start_failure(&record.offer);
        let action = activation_call(ctx, &request);
        self.wait(StartState::FailingStart(record, request), action)
    }

    fn on_start_failure(
        self,
        ctx: &Ctx<'_>,
        record: Box<InboxRecord>,
        answer: &ActivationResponse,
    ) -> PStep {
        if answer.status == ActivationStatus::AlreadyRunning
            || answer.shape == SnapshotShape::Running
        {
            return self.recover(
                ctx,
                &record,
                RecoveryReason::ControlPlaneAlreadyRunning,
                false,
            );
        }
        let allowed = record.offer.lease.version.get() + 1;
        if answer.snapshot.lease_version.get() > allowed {
            return Step::Done(ProcessResult::ActivationInvalid(format!(
                "start-failure snapshot lease version above {allowed}"
            )));
        }
        let proposed = next_record(&record, State::StartFailureAcknowledged, ctx.now, |_| {});
        let action = persist(&record, proposed);
        let failed = StartState::Concluding(ProcessResult::StartFailed, false);
        self.wait(failed, action)
    }

    /// Persists `recovery_required(reason)`. `must_land`: a process may exist, so the write
    /// must succeed or the Worker halts.
    fn recover(
        self,
        ctx: &Ctx<'_>,
        record: &InboxRecord,
        reason: RecoveryReason,
        must_land: bool,
    ) -> PStep {
        let action = recovery(record, reason, ctx.now);
        let result = ProcessResult::RecoveryRequired(reason);
        self.wait(StartState::Concluding(result, must_land), action)
    }
}

/// Step 2 (reference §4.2): the current Session must be the offer's, usable, not draining for a
/// new claim; the offer's lease must be unexpired.
///
/// Unlike the reference, a draining Session does not refuse the restart rule of a `launching`
/// record (step 3): a local write that starts nothing and sends nothing. Refused, it was never
/// done while the Session drained, and supervision (which does not ask whether the Session
/// drains) renewed the record for ever; when its process had ended without a receipt that could
/// complete it, nothing else ever settled it and the drain never ended (found by the walks from
/// a preloaded inbox).
fn target_refusal(ctx: &Ctx<'_>, record: &InboxRecord) -> Option<ProcessResult> {
    let offer = &record.offer;
    let restart_rule = record.state == State::Launching;
    let session_ok = ctx.session.is_some_and(|s| {
        s.worker == offer.worker
            && s.usable(ctx.mono)
            && !(!restart_rule
                && s.status == SessionStatus::Draining
                && offer.delivery_kind == DeliveryKind::NewClaim)
    });
    if !session_ok {
        Some(ProcessResult::TargetFenced)
    } else if ctx.lease_expired(record) {
        Some(ProcessResult::OfferExpired)
    } else {
        None
    }
}

fn activation_call(ctx: &Ctx<'_>, request: &ActivationRequest) -> Action {
    let body = request.to_body().expect(
        "invariant: an activation body of validated ids, a lease token and a handle of at most \
         512 bytes (at most about 2 KiB) is below its 4 KiB cap",
    );
    post(ctx, request.operation(), body)
}

/// Step 6a: the callback sequence (snapshot + 1) and the deadline, which must be present iff
/// the revision has `timeoutMs`; the snapshot's lease version must be the persisted one.
fn launch_authority(
    record: Box<InboxRecord>,
    answer: &ActivationResponse,
) -> Result<Authority, String> {
    let snapshot = &answer.snapshot;
    if snapshot.lease_version != record.offer.lease.version {
        return Err(String::from(
            "starting snapshot lease version differs from the inbox",
        ));
    }
    let sequence = CallbackSequence::new(snapshot.callback_sequence + 1)
        .map_err(|_| String::from("starting snapshot callbackSequence + 1 is out of range"))?;
    let timeout = record.offer.execution_revision.timeout_ms.is_some();
    if timeout != snapshot.deadline_at_ms.is_some() {
        return Err(String::from(
            "deadlineAtMs must be present exactly when the revision has timeoutMs",
        ));
    }
    Ok(Authority {
        record,
        sequence,
        deadline: snapshot.deadline_at_ms,
    })
}

/// Step 6d: the child's exact environment (the reference's newer materializer, `4abf125`): the
/// revision's bindings in revision order (public values as Node passes them, Secrets from the
/// response), then the entries of its environment bundle, if any, in the bundle's normalized
/// order. `None` refuses the start before any spawn: a Secret missing, a value with a NUL, a name
/// that is empty, holds `=` or comes twice, a bundle that breaks its rules, a bundle name that
/// is also a binding's, more than 256 variables, or names and values above 64 KiB. (A valid
/// revision has at most 256 bindings, so the count binds only with the bundle's entries.)
fn environment(
    record: &InboxRecord,
    secrets: &SecretsResponse,
) -> Option<Vec<(String, Zeroizing<String>)>> {
    let revision = &record.offer.execution_revision;
    // At most one bundle, bound to the revision's reference by the response parser.
    let bundle = match (
        &revision.environment_bundle_ref,
        &secrets.environment_bundles[..],
    ) {
        (None, []) => Vec::new(),
        (Some(reference), [bundle]) if bundle.secret_ref == *reference => {
            EnvironmentBundle::parse(&bundle.value).ok()?.entries
        }
        _ => return None,
    };
    let bindings = revision.environment.iter().map(|binding| {
        // A public value reaches the child as Node would pass it: lone surrogates as U+FFFD.
        let value = match &binding.value {
            EnvValue::Public(value) => value.to_utf8_lossy().into_owned(),
            EnvValue::Secret(reference) => {
                let found = secrets.values.iter().find(|v| v.secret_ref == *reference);
                String::from(found?.value.expose())
            }
        };
        Some((binding.name.as_str(), Zeroizing::new(value)))
    });
    let entries = bundle
        .iter()
        .map(|(name, value)| Some((name.as_str(), Zeroizing::new(String::from(value.expose())))));
    let mut env: Vec<(String, Zeroizing<String>)> = Vec::new();
    let mut bytes = 0usize;
    for variable in bindings.chain(entries) {
        let (name, value) = variable?;
        let taken = env.iter().any(|(n, _)| n == name);
        bytes += name.len() + value.len();
        if value.contains('\0')
            || name.contains('=')
            || name.is_empty()
            || taken
            || env.len() >= secrets::MAX_BUNDLE_ENTRIES
            || bytes > secrets::MAX_BUNDLE_TOTAL_BYTES
        {
            return None;
        }
        env.push((String::from(name), value));
    }
    Some(env)
}
