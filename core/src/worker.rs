//! The Worker: one sans-IO machine that composes the Session lifecycle, startup reconciliation,
//! supervision, the Pull coordinator and the per-offer operations (reference §4.7; SPEC §8).
//!
//! # Driving it
//!
//! Method categories: inputs go in through [`Worker::handle`], outputs come out of
//! [`Worker::poll_output`]. Several commands may be outstanding at once, one per lane (the
//! Session, the Pull, each offer; see `Lane`), so that no Run and no Session waits behind
//! another's call. The driver:
//!
//! 1. calls `poll_output()` until it returns something other than [`Output::Command`], and
//!    starts every command (it may perform one at once, or hand a network call off to be
//!    performed concurrently);
//! 2. feeds each command's outcome as [`Input::Outcome`] with the command's [`OpId`], in any
//!    order, as outcomes arrive, and polls again after each (an outcome for no outstanding
//!    command, or of another kind than its command's, is refused with an [`InputError`] and
//!    changes nothing);
//! 3. on [`Output::Idle`], waits until `wake_at` (on the monotonic clock), an outcome, a
//!    supervisor's exit or a signal, then feeds what came (`handle(now, Input::Tick)` for the
//!    deadline);
//! 4. on [`Output::Stopped`] or [`Output::Halted`], exits (calls still in flight are abandoned,
//!    as a crash would; the owner lock is released with the process).
//!
//! A driver that performs each command at once and feeds its outcome before polling again (the
//! simulations do) is one valid order among many; the core is deterministic in the order of its
//! inputs (same inputs in the same order ⇒ byte-identical commands).
//!
//! **Durability rule**: a command whose safety depends on a record being durable (spawn after
//! `launching`, receipt removal after `completion_acknowledged`, clearing the claim after the
//! offer is stored) is only emitted after [`Outcome::Persisted`] for that write. A write that
//! may or may not have happened ([`StoreFailure::Uncertain`]) halts the machine: the next start
//! reconciles from disk, never from memory.
//!
//! ```no_run
//! # use ql_worker_core::worker::{Worker, Output};
//! # use ql_worker_core::io::{Input, Outcome, Command};
//! # use ql_worker_core::time::{MonoMillis, Now};
//! # fn perform(_: Command) -> Outcome { unimplemented!() }
//! # fn now() -> Now { unimplemented!() } // both clocks, read together
//! # fn sleep_until(_: Option<MonoMillis>) {}
//! # fn run(mut worker: Worker) {
//! // The simplest valid driver: one command at a time.
//! loop {
//!     match worker.poll_output() {
//!         Output::Command(command) => {
//!             let id = command.id;
//!             let outcome = perform(command);
//!             worker.handle(now(), Input::Outcome { id, outcome }).expect("driver bug");
//!         }
//!         Output::Idle { wake_at } => {
//!             sleep_until(wake_at);
//!             worker.handle(now(), Input::Tick).expect("driver bug");
//!         }
//!         Output::Stopped(_) | Output::Halted(_) => break,
//!     }
//! }
//! # }
//! ```
//!
//! # One tick
//!
//! What one tick plans (reference §4.7), and how finished operations feed the next. Every
//! decision is a pure function of the Worker's memory and `now`.
//!
//! One tick, in order:
//! 1. `Registering`: register the Session (retried every tick until it answers).
//! 2. `Reconciling`: one page of the inbox per tick, before any Pull: recovery evidence latches
//!    fail-closed; `accepted`, `starting_acknowledged`, `launching`, `started` and `start_failed`
//!    records go to the Processor (restart rules of reference §4.8).
//! 3. `Active` / `Draining`: heartbeat when due; supervise one page (cursor kept across ticks) —
//!    completion first, then lease control; then, only when active, not fail-closed, the
//!    Session usable, a slot free and no backoff pending: one Pull, whose admitted offer is
//!    processed at once. Draining stops once every known record is settled, or when the drain
//!    budget ends.
//!
//! Fail-closed (recovery evidence seen): no Pull and no new launch (`accepted` and
//! `starting_acknowledged` records wait); supervision, receipt-first completion, running-ACK
//! replays and start-failure replays continue, because none of them can start a process.
//!
//! # Operations
//!
//! An operation consumes one reply at a time (the [`Outcome`] of its action, taken apart by
//! that action's kind: `io::Reply`) and answers with the next [`Action`] (`Step::Wait`), its
//! result (`Step::Done`) or a halt. The Worker runs one operation per lane at a time (see
//! `Lane`); each operation module owns its states and transitions; the helpers they share
//! (`next_record`, `persist`, the classification of a call's outcome) are here.
//!
//! No wildcard arm (CONVENTIONS C7): every match names the variants it covers.
#![deny(clippy::wildcard_enum_match_arm)]

use alloc::boxed::Box;
use alloc::collections::{BTreeMap, VecDeque};
use alloc::string::String;
use alloc::vec::Vec;

use crate::completion::{Cleanup, CompletionOutcome};
#[cfg(feature = "sim-hooks")]
use crate::fingerprint;
use crate::ids::{OfferId, SessionId, WorkerId};
use crate::io::{
    Action, Answer, Command, HttpFailure, Input, InputError, OpId, Outcome, Reply, StoreFailure,
};
use crate::listing::{Capacity, PageLimit};
use crate::offer::{Lease, OfferWorker};
use crate::processor::{ProcessOp, ProcessResult};
use crate::pull::{PullOp, PullResult};
use crate::record::{InboxRecord, RecoveryReason, State, check_transition};
use crate::session::{Exchange, SessionOp, SessionResult};
use crate::supervision::{SupervisionOp, SupervisionResult};
use crate::time::{MonoMillis, Now, UnixMillis};
use crate::wire::WireError;
use crate::wire::session::Capabilities;

pub use crate::facts::Fact;

/// Tunables of one Worker (reference §7 production defaults; see [`WorkerConfig::edge`] and
/// [`WorkerConfig::node`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkerConfig {
    /// This Worker.
    pub worker_id: WorkerId,
    /// Its Session id (persisted by the driver across restarts).
    pub session_id: SessionId,
    /// Tick interval.
    pub cadence_ms: u64,
    /// Records per startup reconciliation page.
    pub startup_page: PageLimit,
    /// Records per supervision page.
    pub supervision_page: PageLimit,
    /// Inbox capacity.
    pub capacity: Capacity,
    /// Concurrent Runs (`maxConcurrentRuns`).
    pub max_concurrent_runs: u16,
    /// Session lease asked for at register/heartbeat.
    pub session_lease_ms: u64,
    /// Heartbeat interval.
    pub heartbeat_interval_ms: u64,
    /// Pull backoff base (full jitter, capped at 60 s).
    pub backoff_base_ms: u64,
    /// Drain budget.
    pub drain_budget_ms: u64,
    /// Least time between two lease-control calls for one Run (0: every supervision pass, as
    /// the reference). Each call renews the lease and writes it durably, so pacing divides the
    /// renewal writes; a stop request (cancel, timeout) is then seen within this interval.
    pub lease_control_interval_ms: u64,
    /// Capabilities announced at `register`.
    pub capabilities: Capabilities,
}

impl WorkerConfig {
    /// Edge profile: cadence 2 s, pages 4/4, 64 records, 2 concurrent Runs, drain 60 s.
    #[must_use]
    pub fn edge(worker_id: WorkerId, session_id: SessionId, capabilities: Capabilities) -> Self {
        Self {
            worker_id,
            session_id,
            cadence_ms: 2_000,
            startup_page: PageLimit::new(4).unwrap_or_default(),
            supervision_page: PageLimit::new(4).unwrap_or_default(),
            capacity: Capacity::DEFAULT,
            max_concurrent_runs: 2,
            session_lease_ms: 30_000,
            heartbeat_interval_ms: 10_000,
            backoff_base_ms: 1_000,
            drain_budget_ms: 60_000,
            lease_control_interval_ms: 5_000,
            capabilities,
        }
    }

    /// Node profile: cadence 500 ms, pages 16/32, 256 records, 16 concurrent Runs, drain 300 s.
    #[must_use]
    pub fn node(worker_id: WorkerId, session_id: SessionId, capabilities: Capabilities) -> Self {
        Self {
            cadence_ms: 500,
            startup_page: PageLimit::new(16).unwrap_or_default(),
            supervision_page: PageLimit::new(32).unwrap_or_default(),
            capacity: Capacity::new(256).unwrap_or_default(),
            max_concurrent_runs: 16,
            drain_budget_ms: 300_000,
            ..Self::edge(worker_id, session_id, capabilities)
        }
    }
}

pub use crate::wire::session::SessionStatus;

/// What the Worker knows of its Session from the last register/heartbeat/transition response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionView {
    /// Worker, Session and generation, as an offer names them.
    pub worker: OfferWorker,
    /// Session record version (heartbeat CAS).
    pub version: u64,
    /// Status.
    pub status: SessionStatus,
    /// Session lease expiry, on the control plane's clock (for the log; never compared with
    /// this host's wall clock).
    pub lease_expires_at: UnixMillis,
    /// The same lease on this Worker's monotonic clock: when the exchange that granted it was
    /// sent, plus the lease it asked for (`leaseDurationMs`) or the shorter one the control
    /// plane granted (see `session::view`).
    pub lease_deadline: MonoMillis,
}

impl SessionView {
    /// Usable for execution: not offline and its lease unexpired at `now` (monotonic).
    #[must_use]
    pub fn usable(&self, now: MonoMillis) -> bool {
        self.status != SessionStatus::Offline && now < self.lease_deadline
    }
}

/// Why the machine stopped on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// Drained: every record settled; the Session is offline (or, when the control plane could
    /// not be reached for the last transition, left to expire there).
    Drained,
    /// The drain ended with records this Worker could not settle: recovery evidence, records
    /// that never launched, Runs the drain-budget stop could not complete. They stay for the
    /// next start.
    Unsettled,
    /// The drain came before the Session was ever registered (the control plane was never
    /// reached): this run started nothing; what an earlier run left is reconciled at the next
    /// start.
    NotRegistered,
}

/// Why the machine halted: a fact it cannot safely continue from. The next start reconciles
/// from disk.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HaltReason {
    /// A write may or may not be durable.
    #[error("a durable write may or may not have happened (fsync failed)")]
    StoreUncertain,
    /// The store refused a write the core proposed (concurrent writer or core bug).
    #[error("the store refused a proposed write (CAS conflict)")]
    StoreConflict,
    /// A read found an unsafe or corrupt file.
    #[error("unsafe or corrupt storage")]
    UnsafeStorage,
    /// A write that records what became of a launch (`start_failed` after a proven rejection,
    /// `recovery_required(launch_outcome_unknown)`) failed cleanly. Nothing was written; going
    /// on would act on a fact that is not durable, so the Worker stops and the next start
    /// reconciles from disk.
    #[error(
        "the write recording a launch outcome failed (nothing written); the next start \
         reconciles from disk"
    )]
    LaunchOutcomeUnrecorded,
    /// The control plane fenced or replaced this Session.
    #[error("the Worker Session was fenced: {detail}")]
    SessionFenced {
        /// The response that fenced it.
        detail: String,
    },
    /// A Session exchange was refused for good: a register (400, 404, 409, 413, 415, or a
    /// register again after a fence answered that another Session replaced this one), a
    /// heartbeat or a transition (400, 404, 413, 415), or its request could not be built.
    #[error("a Session exchange was refused for good: {detail}")]
    RegisterRejected {
        /// Why.
        detail: String,
    },
}

/// What [`Worker::poll_output`] returns.
#[derive(Debug)]
#[must_use]
pub enum Output {
    /// Perform this and report its outcome.
    Command(Command),
    /// Nothing to do before `wake_at` (`None`: only an operator input can wake it).
    Idle {
        /// Earliest deadline (tick cadence, heartbeat, backoff, drain budget).
        wake_at: Option<MonoMillis>,
    },
    /// Stopped on purpose.
    Stopped(StopReason),
    /// Halted on a fact it cannot continue from.
    Halted(HaltReason),
}

/// The fail-closed latch: recovery evidence on a record (reference §4.7 step 1).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailClosed {
    /// The record that carries the evidence.
    pub offer_id: OfferId,
    /// Its reason.
    pub reason: RecoveryReason,
}

/// What one Worker is doing, at the coarsest level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Registering its Session.
    Registering,
    /// Startup reconciliation: its pages back to back, before any Pull.
    Reconciling,
    /// Normal operation.
    Active,
    /// Drain requested: no Pulls; stops when every record is settled or the budget ends.
    Draining,
    /// Stopped or halted.
    Finished,
}

/// A unit of work of one tick.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Work {
    Register,
    /// Register again after the Session was fenced (see [`Fact::Rejoining`]).
    Rejoin,
    Heartbeat,
    Transition(SessionStatus),
    /// A new Session id replaces a draining or offline one (see `Worker::retiring`).
    RenewSession,
    ListPage {
        purpose: ListPurpose,
        after: Option<OfferId>,
    },
    Pull,
    Process(OfferId),
    Supervise(OfferId),
    /// A lease renewal only, beside the offer's own pass while that one uploads its log (a
    /// supervision pass that found its offer's lane uploading becomes this).
    Renew(OfferId),
}

impl Work {
    /// The lane this work runs in.
    pub(crate) fn lane(&self) -> Lane {
        match self {
            Self::Register
            | Self::Rejoin
            | Self::Heartbeat
            | Self::Transition(_)
            | Self::RenewSession => Lane::Session,
            Self::ListPage { .. } => Lane::Inbox,
            Self::Pull => Lane::Pull,
            Self::Process(id) | Self::Supervise(id) => Lane::Offer(id.clone()),
            Self::Renew(id) => Lane::Lease(id.clone()),
        }
    }
}

/// Where an operation runs. Lanes run concurrently, each with at most one operation and one
/// command outstanding: no Run and no Session waits behind another's call. One lane per offer
/// keeps each record's revision sequence simple; the only exception is [`Lane::Lease`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Lane {
    /// Register, heartbeat, transition, a new Session id.
    Session,
    /// Listing pages of the inbox (startup reconciliation, supervision).
    Inbox,
    /// The Pull coordinator.
    Pull,
    /// Processing and supervising one offer (at most `max_concurrent_runs` at once).
    Offer(OfferId),
    /// Renewing one offer's lease while its lane uploads the log (a transfer may outlast the
    /// lease). The offer's next step waits until this ends (`Worker::gated`).
    Lease(OfferId),
}

/// One operation in progress.
#[cfg_attr(feature = "sim-hooks", derive(Clone))]
#[derive(Debug)]
pub(crate) struct Slot {
    /// What it was started for.
    pub(crate) work: Work,
    /// When its last control-plane call was sent, or when it began before its first one
    /// (monotonic): what that call obtained, the control plane granted after this.
    pub(crate) call_sent: MonoMillis,
    pub(crate) op: Running,
    pub(crate) pending: Pending,
}

/// The operation's next action: not yet polled, or sent and awaiting its outcome.
#[cfg_attr(feature = "sim-hooks", derive(Clone))]
#[derive(Debug)]
pub(crate) enum Pending {
    Staged(Action),
    Outstanding {
        id: OpId,
        /// The kind of outcome that answers it.
        answer: Answer,
        /// The record a `PersistRecord` writes: known durable once `Persisted` answers.
        write: Option<Box<InboxRecord>>,
    },
}

impl Slot {
    fn is_staged(&self) -> bool {
        matches!(self.pending, Pending::Staged(_))
    }

    fn uploading(&self) -> bool {
        matches!(
            self.pending,
            Pending::Outstanding {
                answer: Answer::Upload,
                ..
            }
        )
    }

    /// Sends the staged action under `id`.
    fn send(&mut self, id: OpId) -> Option<Action> {
        let placeholder = Pending::Outstanding {
            id,
            answer: Answer::Durable,
            write: None,
        };
        let Pending::Staged(action) = core::mem::replace(&mut self.pending, placeholder) else {
            return None;
        };
        let write = if let Action::PersistRecord { record, .. } = &action {
            Some(record.clone())
        } else {
            None
        };
        let answer = action.answer();
        self.pending = Pending::Outstanding { id, answer, write };
        Some(action)
    }

    /// A canonical rendering (model checking): the operation and whether its action is sent,
    /// without the command's id.
    #[cfg(feature = "sim-hooks")]
    fn fingerprint(&self, mut hasher: &mut dyn core::hash::Hasher) {
        let sent = match &self.pending {
            Pending::Staged(_) => None,
            Pending::Outstanding { write, .. } => Some(write),
        };
        core::hash::Hash::hash(&(self.call_sent, &self.op, sent), &mut hasher);
    }
}

/// Why a page is listed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ListPurpose {
    Reconcile,
    Supervise,
}

/// The context an operation sees: configuration, Session and time, never the driver.
pub(crate) struct Ctx<'a> {
    pub(crate) config: &'a WorkerConfig,
    pub(crate) session: Option<&'a SessionView>,
    pub(crate) now: UnixMillis,
    /// The monotonic reading of the same moment.
    pub(crate) mono: MonoMillis,
    /// When the operation's last control-plane call was sent (monotonic; see
    /// `Slot::call_sent`).
    pub(crate) call_sent: MonoMillis,
    /// The leases this process obtained or renewed, with their local deadlines.
    pub(crate) leases: &'a BTreeMap<OfferId, LeaseClock>,
    /// The highest lease version the control plane may hold per offer (renewals whose answers
    /// were lost; see `Worker::lease_may_hold`).
    pub(crate) lease_may_hold: &'a BTreeMap<OfferId, crate::ids::LeaseVersion>,
    /// Whether a launch may begin or go on now (not fail-closed, no drain): read at every step,
    /// since another lane's outcome may latch fail-closed while a launch is under way.
    pub(crate) may_launch: bool,
}

impl Ctx<'_> {
    /// Whether `record`'s lease has expired (see [`Self::lease_remaining_ms`]).
    pub(crate) fn lease_expired(&self, record: &InboxRecord) -> bool {
        self.lease_remaining_ms(record) == 0
    }

    /// What is left of `record`'s lease at `now` / `mono`, in milliseconds (0: expired): on the
    /// monotonic clock against its local deadline when this process obtained or renewed this
    /// very grant; otherwise (a lease read from disk after a restart, not renewed since) on the
    /// wall clock against the control plane's expiry.
    pub(crate) fn lease_remaining_ms(&self, record: &InboxRecord) -> u64 {
        self.remaining_ms(&record.offer.offer_id, &record.offer.lease)
    }

    /// [`Self::lease_remaining_ms`] of `offer_id`'s `lease`.
    fn remaining_ms(&self, offer_id: &OfferId, lease: &Lease) -> u64 {
        match self.leases.get(offer_id).filter(|clock| clock.names(lease)) {
            Some(clock) => clock.deadline.saturating_since(self.mono),
            None => lease.expires_at_ms.saturating_since(self.now),
        }
    }

    /// Whether the Session is usable now (monotonic) and is `worker`'s.
    pub(crate) fn serves(&self, worker: &OfferWorker) -> bool {
        self.session
            .is_some_and(|s| s.worker == *worker && s.usable(self.mono))
    }
}

/// The Worker's deadlines, one entry per kind (issue 16), all on the monotonic clock. Each is
/// set by the fact that starts its interval (an answer, a failure, a drain request). Every kind
/// but the backoffs is a deadline the Worker wakes for, and fires once: `wake_at` is the earliest
/// of them, and [`Worker::on_tick`] removes each that has come and plans its work (a heartbeat
/// that cannot go out yet is set again a cadence later), so none can spin. A backoff is a gate
/// instead: the work it holds back is retried at the first tick after it (the retry's time then
/// follows the cadence, not the jitter drawn from entropy), and it stays until a good answer
/// clears it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Timer {
    /// The next tick: every cadence, or at once after a phase change (a Session registered, a
    /// reconciliation page listed, a fence). Always present until the machine ends.
    Tick,
    /// The next heartbeat: `heartbeat_interval` after the sending of the last answered Session
    /// exchange; the next tick after one that got no usable answer.
    Heartbeat,
    /// The end of the backoff after registers that got no usable answer (a gate).
    RegisterBackoff,
    /// The end of the backoff after Session renewals whose new Session the control plane
    /// registered draining or offline too (a gate).
    RenewalBackoff,
    /// The end of the Pull's backoff: a failed Pull, a claim's backoff (a gate).
    PullBackoff,
    /// The end of the drain budget.
    DrainBudget,
    /// The next renewal of a running Run's lease: `lease_control_interval` after the sending
    /// of the last renewal the control plane answered.
    Renewal(OfferId),
}

/// Whether a drain was asked for, and whether its budget has ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Drain {
    NotRequested,
    /// Asked for; its budget runs ([`Timer::DrainBudget`]).
    Requested,
    /// The budget ended: the Runs still in flight are stopped, then completed.
    BudgetEnded,
}

/// A lease this process obtained or renewed, on both clocks: the control plane's
/// `renewedAtMs` and `expiresAtMs`, which name the grant, and its local deadline: the
/// monotonic time at which the call that obtained it was sent plus the lease's length on the
/// control plane's own clock (`expiresAtMs - renewedAtMs`). The control plane granted it after
/// that call was sent, so the local deadline comes before the control plane's expiry, never
/// after it, whatever this host's wall clock says. A lease this process did not obtain itself
/// (read from disk after a restart; the offer of a claim retried from an earlier attempt, which
/// the control plane may have granted before) has none until its first renewal here, and is
/// judged by the wall clock against `expiresAtMs` meanwhile.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeaseClock {
    renewed_at: UnixMillis,
    expires_at: UnixMillis,
    /// The sending of the call that obtained this grant.
    pub(crate) began: MonoMillis,
    deadline: MonoMillis,
}

impl LeaseClock {
    fn of(lease: &Lease, began: MonoMillis) -> Self {
        Self {
            renewed_at: lease.renewed_at_ms,
            expires_at: lease.expires_at_ms,
            began,
            deadline: began
                .saturating_add(lease.expires_at_ms.saturating_since(lease.renewed_at_ms)),
        }
    }

    fn names(&self, lease: &Lease) -> bool {
        self.renewed_at == lease.renewed_at_ms && self.expires_at == lease.expires_at_ms
    }
}

/// One step of an operation.
pub(crate) enum Step<S, R> {
    /// Perform this action; resume with its outcome.
    Wait(S, Action),
    /// Finished with a result.
    Done(R),
    /// A fact the Worker cannot continue from.
    Halt(HaltReason),
}

impl<S, R> Step<S, R> {
    pub(crate) fn map<T, Q>(
        self,
        state: impl FnOnce(S) -> T,
        result: impl FnOnce(R) -> Q,
    ) -> Step<T, Q> {
        match self {
            Self::Wait(s, a) => Step::Wait(state(s), a),
            Self::Done(r) => Step::Done(result(r)),
            Self::Halt(h) => Step::Halt(h),
        }
    }
}

/// Maps a storage failure on a write to the Worker's reaction: only `Unchanged` lets the
/// operation continue (nothing was written); everything else halts.
pub(crate) fn write_failure<S, R>(
    failure: StoreFailure,
    unchanged: impl FnOnce() -> Step<S, R>,
) -> Step<S, R> {
    match failure {
        StoreFailure::Unchanged | StoreFailure::CapacityExhausted => unchanged(),
        StoreFailure::Uncertain => Step::Halt(HaltReason::StoreUncertain),
        StoreFailure::Conflict => Step::Halt(HaltReason::StoreConflict),
        StoreFailure::Unsafe => Step::Halt(HaltReason::UnsafeStorage),
    }
}

/// Maps a storage failure on a read: unsafe storage halts (fail closed); a transient failure
/// ends the operation with no change.
pub(crate) fn read_failure<S, R>(
    failure: StoreFailure,
    transient: impl FnOnce() -> Step<S, R>,
) -> Step<S, R> {
    match failure {
        StoreFailure::Unsafe => Step::Halt(HaltReason::UnsafeStorage),
        StoreFailure::Unchanged
        | StoreFailure::CapacityExhausted
        | StoreFailure::Uncertain
        | StoreFailure::Conflict => transient(),
    }
}

/// The in-memory Worker. See the module documentation for the driving contract. `Clone` exists
/// only for [`Worker::fork`] (`sim-hooks` feature).
#[cfg_attr(feature = "sim-hooks", derive(Clone))]
#[derive(Debug)]
pub struct Worker {
    pub(crate) config: WorkerConfig,
    /// The last wall-clock reading, as the driver read it (it may step either way).
    pub(crate) now: UnixMillis,
    /// The last monotonic reading: every interval below runs on it.
    pub(crate) mono: MonoMillis,
    pub(crate) next_op: u64,
    /// The phase, with how the machine ended once it has (one value: no `finished` flag
    /// beside a `Finished` phase).
    pub(crate) stage: Stage,
    pub(crate) session: Option<SessionView>,
    pub(crate) known: BTreeMap<OfferId, State>,
    pub(crate) drain: Drain,
    pub(crate) queue: VecDeque<Work>,
    /// The operations in progress, one per lane (see [`Lane`]).
    pub(crate) lanes: BTreeMap<Lane, Slot>,
    /// What this process knows of the Pull coordinator's pending claim.
    pub(crate) claim: ClaimView,
    pub(crate) supervision_cursor: Option<OfferId>,
    pub(crate) reconcile_cursor: Option<OfferId>,
    pub(crate) transition_offline_queued: bool,
    /// Recovery evidence by record: the Worker is fail-closed while this is not empty.
    pub(crate) evidence: BTreeMap<OfferId, RecoveryReason>,
    /// Lease expiry of records that never crossed the spawn barrier (`accepted`,
    /// `starting_acknowledged`, `start_failed`): once it passes they are dormant.
    pub(crate) pre_barrier_expiry: BTreeMap<OfferId, Lease>,
    /// Settled records whose receipt removal failed: retried at the next tick.
    pub(crate) pending_cleanup: alloc::collections::BTreeSet<OfferId>,
    /// When each live Run's lease was last renewed (monotonic: the sending of the renewal
    /// that the control plane answered), for pacing.
    pub(crate) last_renewal: BTreeMap<OfferId, MonoMillis>,
    /// Every deadline, one per kind (see [`Timer`]).
    pub(crate) timers: BTreeMap<Timer, MonoMillis>,
    /// The local deadline of each lease this process obtained or renewed (see [`LeaseClock`]).
    pub(crate) leases: BTreeMap<OfferId, LeaseClock>,
    /// For each live Run whose renewals got uncertain outcomes since its lease was last made
    /// durable: the highest lease version the control plane may hold (each lost renewal at
    /// version `x` may have left it at `x + 1`). A fenced renewal is tried at every version up
    /// to it (issue 17). Lost with a restart: then only the persisted version + 1 is tried.
    pub(crate) lease_may_hold: BTreeMap<OfferId, crate::ids::LeaseVersion>,
    /// The Session registered at start is `draining` or `offline` at the control plane although
    /// this incarnation asked for no drain (a previous one stopped during its drain): once no
    /// Run of it is live, a new Session replaces it (reference §2.10: a new Session id at each
    /// start).
    pub(crate) retiring: bool,
    /// The inbox status of the last Pull decision, and how often a Pull was held back because
    /// the inbox had no room (the metric behind the driver's "inbox full" event).
    pub(crate) inbox: InboxStatus,
    /// `availableSlots` the control plane last accepted (register, heartbeat), and what the
    /// exchange in flight sends. A Session that reported none gets no offer: a Pull for a slot
    /// freed since is preceded by a heartbeat that reports it.
    pub(crate) reported_slots: Option<u64>,
    pub(crate) reporting_slots: Option<u64>,
    /// Facts for the driver's event log, when it asked for them ([`Worker::report_facts`]),
    /// oldest first.
    pub(crate) facts: Option<VecDeque<Fact>>,
    /// Facts dropped because the queue was full.
    pub(crate) facts_dropped: u64,
    /// The control plane refused the credentials (this HTTP status): admission is paused until
    /// the next authenticated exchange.
    pub(crate) auth_paused: Option<u16>,
    /// The Session was fenced: register it again before anything else (admission paused).
    pub(crate) rejoin: bool,
    /// Fences in a row without a good heartbeat in between (a fence right after an uncertain
    /// exchange is not counted).
    pub(crate) fences: u8,
    /// The last heartbeat or transition had an uncertain outcome (it may have committed): the
    /// fence that follows is expected (issue 17).
    pub(crate) session_uncertain: bool,
    /// Registers in a row that got no usable answer (the next waits for
    /// [`Timer::RegisterBackoff`]).
    pub(crate) register_failures: u32,
    /// Session renewals in this incarnation since a register was last answered online: a new
    /// Session the control plane registers draining or offline too is renewed again only after
    /// [`Timer::RenewalBackoff`] (else a control plane that holds every Session draining would
    /// get a new Session, each with a durable write, as fast as it answers).
    pub(crate) renewals: u32,
    /// Records whose Run the drain-budget stop has already stopped.
    pub(crate) drain_stopped: alloc::collections::BTreeSet<OfferId>,
    /// `launch_outcome_unknown` records whose supervisor and user process are gone with no
    /// receipt that could complete them ([`SupervisionResult::UnknownLaunchGone`]): not
    /// supervised again and holding no drain in this incarnation (the record cannot say so: its
    /// first reason stays; a restart inspects them once more).
    pub(crate) gone_launches: alloc::collections::BTreeSet<OfferId>,
    /// What the driver should log, oldest first (at most [`MAX_NOTICES`]).
    pub(crate) notices: VecDeque<Notice>,
}

/// Most [`Notice`]s kept for the driver; past it the oldest is dropped (the driver drains them
/// after every input, so this only bounds a driver that never does).
pub const MAX_NOTICES: usize = 64;

/// Something that went wrong without stopping the Worker, for the driver's log. Carries ids,
/// field paths and rules, never a value.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Notice {
    /// An offered offer was refused for a reason its claim cannot change; the claim was cleared
    /// (nothing stored, nothing run) and Pulls go on (see [`crate::pull::refused_for_good`]).
    #[error(
        "offer {offer_id} refused for good, its claim cleared (nothing stored, nothing run; the \
         control plane's lease expires by itself): {reason}"
    )]
    OfferRefused {
        /// The cleared claim's offer id.
        offer_id: OfferId,
        /// Why.
        reason: WireError,
    },
}

/// The inbox as the Pull decision sees it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InboxStatus {
    /// Records in the inbox, settled ones included (what the Worker knows of: every record it
    /// listed or wrote, less those retention reported removed).
    pub records: usize,
    /// The inbox capacity.
    pub capacity: usize,
    /// Whether the last Pull decision found no room: the Worker takes no offer until retention
    /// frees a place (no offer is ever claimed that could not be stored).
    pub full: bool,
    /// Pull decisions held back because the inbox was full, since start (a counter).
    pub full_deferrals: u64,
    /// Of [`Self::records`], those settled (`completion_acknowledged`,
    /// `start_failure_acknowledged`): what retention may remove.
    pub settled: usize,
}

/// What the Worker knows of the Pull coordinator's pending claim (the inbox's claim file),
/// from the results of its Pulls. Each state says what the next Pull and `availableSlots` make
/// of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ClaimView {
    /// Not known: no Pull has read it in this process. One may remain, naming an offer already
    /// stored ([`Worker::claim_check_due`]); it is taken as absent in `availableSlots` (a Pull
    /// stores at most one record, and only with room for it, so this only shapes what is
    /// offered).
    Unknown,
    /// None remains: the last Pull cleared it or found none.
    Settled,
    /// One may remain (the last Pull kept it: a failure or a backoff; or the claim-only check
    /// found its offer not stored): it may still bring one record, so it takes one place of
    /// the inbox's room in `availableSlots`.
    Pending(HeldClaim),
}

/// What the Worker knows of a claim a Pull kept ([`ClaimView::Pending`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct HeldClaim {
    /// Kept by a Pull and not checked since: it may name an offer already stored (its clear
    /// after storing the offer did not land).
    unchecked: bool,
    /// Its backoff is waited out in this process, on the monotonic clock
    /// ([`Timer::PullBackoff`]): the next Pull does not compare its persisted wall-clock time
    /// again.
    timed_here: bool,
    /// An `offers` call of it got an uncertain outcome: the control plane may hold a lease for
    /// it, which runs out while the backoff lasts (up to 60 s against a 30 s lease by default).
    /// The next Session answer ends that backoff (`on_session`): the plane is reachable, and a
    /// replay now can still recover the Run.
    may_hold_lease: bool,
}

impl ClaimView {
    fn held(self) -> Option<HeldClaim> {
        match self {
            Self::Pending(held) => Some(held),
            Self::Unknown | Self::Settled => None,
        }
    }
}

/// The machine's phase ([`Phase`] is its public, coarse form), with how it ended once it has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Stage {
    Registering,
    Reconciling,
    Active,
    Draining,
    Finished(Finish),
}

/// How the machine ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Finish {
    Stopped(StopReason),
    Halted(HaltReason),
}

impl Worker {
    /// A new Worker. Inert until the first [`Input::Tick`]; the driver must already hold the
    /// inbox owner lock.
    #[must_use]
    pub fn new(config: WorkerConfig, now: Now) -> Self {
        let config_capacity = config.capacity.get();
        Self {
            config,
            now: now.wall,
            mono: now.mono,
            next_op: 0,
            stage: Stage::Registering,
            session: None,
            known: BTreeMap::new(),
            drain: Drain::NotRequested,
            queue: VecDeque::new(),
            lanes: BTreeMap::new(),
            claim: ClaimView::Unknown,
            supervision_cursor: None,
            reconcile_cursor: None,
            transition_offline_queued: false,
            evidence: BTreeMap::new(),
            pre_barrier_expiry: BTreeMap::new(),
            pending_cleanup: alloc::collections::BTreeSet::new(),
            last_renewal: BTreeMap::new(),
            timers: BTreeMap::from([(Timer::Tick, now.mono)]),
            leases: BTreeMap::new(),
            lease_may_hold: BTreeMap::new(),
            notices: VecDeque::new(),
            retiring: false,
            reported_slots: None,
            reporting_slots: None,
            inbox: InboxStatus {
                capacity: config_capacity,
                ..InboxStatus::default()
            },
            facts: None,
            facts_dropped: 0,
            auth_paused: None,
            rejoin: false,
            fences: 0,
            session_uncertain: false,
            register_failures: 0,
            renewals: 0,
            drain_stopped: alloc::collections::BTreeSet::new(),
            gone_launches: alloc::collections::BTreeSet::new(),
        }
    }

    /// Starts keeping [`Fact`]s for the driver (see [`crate::facts`]); [`Worker::poll_fact`]
    /// takes them. Off by default.
    pub fn report_facts(&mut self) {
        self.facts.get_or_insert_with(VecDeque::new);
    }

    /// The oldest fact not yet taken.
    pub fn poll_fact(&mut self) -> Option<Fact> {
        self.facts.as_mut()?.pop_front()
    }

    /// Facts dropped because the queue was full.
    #[must_use]
    pub fn facts_dropped(&self) -> u64 {
        self.facts_dropped
    }

    /// Records `fact` (if it is one) when facts are reported (built only then); past
    /// [`crate::facts::MAX_QUEUED_FACTS`] the oldest is dropped (and counted).
    pub(crate) fn fact<F: Into<Option<Fact>>>(&mut self, fact: impl FnOnce() -> F) {
        if let Some(facts) = &mut self.facts
            && let Some(fact) = fact().into()
        {
            if facts.len() >= crate::facts::MAX_QUEUED_FACTS {
                facts.pop_front();
                self.facts_dropped = self.facts_dropped.saturating_add(1);
            }
            facts.push_back(fact);
        }
    }

    /// Whether admission is paused (credentials refused, or the Session being registered again
    /// after a fence): no Pull, no slots offered.
    #[must_use]
    pub fn admission_paused(&self) -> bool {
        self.auth_paused.is_some() || self.rejoin
    }

    /// Records that hold a drain now (see [`Worker::holds_drain`]).
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.known
            .iter()
            .filter(|(id, state)| self.holds_drain(id, **state))
            .count()
    }

    /// Whether a record keeps a drain from finishing: a record that may still hold a process or
    /// still be settled by this Worker. Never a settled or dormant record, nor recovery evidence
    /// other than `launch_outcome_unknown` (which a receipt may still complete, unless its
    /// supervisor and process were found gone without one: `gone_launches`). Once the drain
    /// budget has ended, only records past the spawn barrier hold it (their Runs are stopped and
    /// completed); the others stay for the next start.
    pub(crate) fn holds_drain(&self, id: &OfferId, state: State) -> bool {
        if state.is_terminal() || self.dormant(id) {
            return false;
        }
        match state {
            State::Launching | State::Started | State::RunningAcknowledged => true,
            State::RecoveryRequired => {
                self.drain != Drain::BudgetEnded
                    && self.evidence.get(id) == Some(&RecoveryReason::LaunchOutcomeUnknown)
                    && !self.gone_launches.contains(id)
            }
            State::Accepted | State::StartingAcknowledged | State::StartFailed => {
                self.drain != Drain::BudgetEnded
            }
            State::StartFailureAcknowledged | State::CompletionAcknowledged => false,
        }
    }

    /// The inbox as the last Pull decision saw it (records, capacity, full, deferrals).
    #[must_use]
    pub fn inbox_status(&self) -> InboxStatus {
        InboxStatus {
            records: self.known.len(),
            settled: self.known.values().filter(|s| s.is_terminal()).count(),
            ..self.inbox
        }
    }

    /// Whether the Session registered at start is draining or offline at the control plane
    /// although this start asked for no drain (an earlier drain did not finish): new work
    /// waits until none of its Runs is live, then a new Session replaces it.
    #[must_use]
    pub fn retiring(&self) -> bool {
        self.retiring
    }

    /// The Session id in use: the configured one, or the new one that replaced it when this
    /// start found the stored Session draining or offline (see [`Action::PersistSession`]).
    #[must_use]
    pub fn session_id(&self) -> &SessionId {
        &self.config.session_id
    }

    /// The coarse phase.
    #[must_use]
    pub fn phase(&self) -> Phase {
        match self.stage {
            Stage::Registering => Phase::Registering,
            Stage::Reconciling => Phase::Reconciling,
            Stage::Active => Phase::Active,
            Stage::Draining => Phase::Draining,
            Stage::Finished(_) => Phase::Finished,
        }
    }

    /// The Session as last confirmed by the control plane.
    #[must_use]
    pub fn session(&self) -> Option<&SessionView> {
        self.session.as_ref()
    }

    /// The fail-closed latch: the first piece of recovery evidence known (in offer id order),
    /// if any.
    #[must_use]
    pub fn fail_closed(&self) -> Option<FailClosed> {
        let (offer_id, reason) = self.evidence.first_key_value()?;
        Some(FailClosed {
            offer_id: offer_id.clone(),
            reason: *reason,
        })
    }

    /// Records known to this Worker and their last known state.
    #[must_use]
    pub fn known_records(&self) -> &BTreeMap<OfferId, State> {
        &self.known
    }

    /// A copy of this Worker, for the model checker, which branches one Worker into every
    /// possible outcome of its outstanding commands. Only with the `sim-hooks` feature (not for
    /// production): a fork duplicates the in-memory completion capability of a launch in flight,
    /// and a staged action too (the explorer's driver may stop polling with commands staged, its
    /// window of outstanding commands full).
    #[cfg(feature = "sim-hooks")]
    #[must_use]
    pub fn fork(&self) -> Self {
        self.clone()
    }

    /// The Worker's clock readings as it holds them (the last wall-clock reading, the highest
    /// monotonic one). Only with the `sim-hooks` feature (not for production).
    #[cfg(feature = "sim-hooks")]
    #[must_use]
    pub fn clock_reading(&self) -> Now {
        Now::new(self.now, self.mono)
    }

    /// Whether this process holds a local deadline for `offer_id`'s current lease (see
    /// `LeaseClock`). Only with the `sim-hooks` feature (not for production).
    #[cfg(feature = "sim-hooks")]
    #[must_use]
    pub fn times_lease(&self, offer_id: &OfferId) -> bool {
        self.leases.contains_key(offer_id)
    }

    /// Writes a canonical rendering of the whole in-memory state into `hasher`, for the model
    /// checker's deduplication of states: the last clock reading, then
    /// [`Worker::state_fingerprint`]. Only with the `sim-hooks` feature (not for production).
    #[cfg(feature = "sim-hooks")]
    pub fn fingerprint(&self, hasher: &mut dyn core::hash::Hasher) {
        fingerprint::debug(hasher, &(self.now, self.mono));
        self.state_fingerprint(hasher);
    }

    /// Writes a canonical rendering of the in-memory state without the last clock reading (the
    /// deadlines and timestamps the Worker holds stay), for the model checker's count of
    /// distinct states. The command counter and the outstanding commands' ids are left out: two
    /// Workers that differ only in how many commands they issued behave alike. Only with the
    /// `sim-hooks` feature (not for production).
    #[cfg(feature = "sim-hooks")]
    pub fn state_fingerprint(&self, hasher: &mut dyn core::hash::Hasher) {
        fingerprint::debug(
            hasher,
            &(
                (&self.stage, &self.session, &self.known),
                (self.drain, &self.queue, &self.timers, &self.last_renewal),
                (self.claim, &self.leases),
                (&self.supervision_cursor, &self.reconcile_cursor),
                self.transition_offline_queued,
                (self.retiring, &self.config.session_id),
                (self.inbox, self.reported_slots, self.reporting_slots),
                (self.auth_paused, self.rejoin, self.fences),
                (
                    self.session_uncertain,
                    self.register_failures,
                    self.renewals,
                ),
                (&self.drain_stopped, &self.gone_launches, &self.evidence),
                (
                    &self.pre_barrier_expiry,
                    &self.pending_cleanup,
                    &self.lease_may_hold,
                ),
            ),
        );
        hasher.write_usize(self.lanes.len());
        for (lane, slot) in &self.lanes {
            fingerprint::debug(hasher, &(lane, &slot.work));
            slot.fingerprint(hasher);
        }
    }

    /// Feeds one input. `now` holds the driver's two clock readings, taken together. An older
    /// monotonic reading than the last one is clamped (intervals never run backwards). The
    /// wall-clock reading is taken as it is, stepped back or not: it only stamps what the
    /// Worker writes and sends, and those must follow the host's clock (the supervisor's
    /// timestamps and the control plane's bounds compare them with it). A record's own times
    /// never go back (`next_record` keeps `updatedAtMs` monotonic).
    ///
    /// # Errors
    /// [`InputError`] when the input answers no outstanding command, or is of another kind
    /// than its command's; nothing changes.
    pub fn handle(&mut self, now: Now, input: Input) -> Result<(), InputError> {
        if matches!(self.stage, Stage::Finished(_)) {
            return Err(InputError::Halted);
        }
        self.now = now.wall;
        self.mono = self.mono.max(now.mono);
        match input {
            Input::Tick => self.on_tick(),
            Input::DrainRequested => self.begin_drain(),
            Input::Outcome { id, outcome } => return self.on_outcome(id, outcome),
            Input::ProcessExited { offer_id } => self.on_process_exited(offer_id),
            Input::RecordRemoved { offer_id } => self.forget(&offer_id),
        }
        Ok(())
    }

    /// Takes the notices gathered since the last call, oldest first, for the driver's log.
    pub fn drain_notices(&mut self) -> impl Iterator<Item = Notice> + '_ {
        self.notices.drain(..)
    }

    /// The next output. See the module documentation.
    pub fn poll_output(&mut self) -> Output {
        loop {
            if let Stage::Finished(finish) = &self.stage {
                return match finish {
                    Finish::Stopped(reason) => Output::Stopped(*reason),
                    Finish::Halted(reason) => Output::Halted(reason.clone()),
                };
            }
            if let Some(command) = self.emit_staged() {
                return Output::Command(command);
            }
            if self.busy_tick_due() {
                self.on_tick();
                if matches!(self.stage, Stage::Finished(_)) {
                    continue;
                }
            }
            match self.next_startable() {
                Some(work) => self.start(work),
                None => {
                    return Output::Idle {
                        wake_at: self.wake_at(),
                    };
                }
            }
        }
    }

    /// Whether a tick is overdue by a whole cadence while work is still queued (a burst of
    /// Pulls and the Runs it started, completions the supervisors' exits brought): it is then
    /// planned between two commands, so that no stream of quick Runs starves the Session or a
    /// long Run's lease control. Otherwise ticks come from the driver ([`Input::Tick`]), which
    /// plans them whatever is in flight.
    fn busy_tick_due(&self) -> bool {
        let overdue = self.tick_at().saturating_add(self.config.cadence_ms);
        !self.queue.is_empty()
            && matches!(self.stage, Stage::Active | Stage::Draining)
            && self.mono >= overdue
    }

    /// The first staged action of a lane that may go out now, as a command.
    fn emit_staged(&mut self) -> Option<Command> {
        if !self.may_launch() {
            self.withdraw_launches();
        }
        let lane = self
            .lanes
            .iter()
            .find(|(lane, slot)| slot.is_staged() && !self.gated(lane))
            .map(|(lane, _)| lane.clone())?;
        let id = OpId(self.next_op);
        self.next_op += 1;
        let slot = self.lanes.get_mut(&lane)?;
        let action = slot.send(id)?;
        if matches!(action, Action::Post(_) | Action::UploadLog { .. }) {
            // The driver sends it after this reading, never before.
            slot.call_sent = self.mono;
        }
        Some(Command { id, action })
    }

    /// Withdraws every staged command that would begin or continue a launch before the spawn
    /// barrier ([`crate::processor::ProcessOp::launching`]): fail-closed latched or a drain
    /// began after it was staged. Its operation ends `Deferred`.
    fn withdraw_launches(&mut self) {
        let withdrawn: Vec<(Lane, OfferId)> = self
            .lanes
            .iter()
            .filter(|(_, slot)| slot.is_staged())
            .filter_map(|(lane, slot)| Some((lane.clone(), slot.op.launching()?.clone())))
            .collect();
        for (lane, offer_id) in withdrawn {
            if let Some(slot) = self.lanes.remove(&lane) {
                let finished = Finished::Process(offer_id, ProcessResult::Deferred);
                self.on_finished(finished, slot.call_sent);
            }
        }
    }

    /// An offer's next step waits while a renewal of its lease runs beside its upload: both
    /// write the record, and its revisions are a single sequence.
    fn gated(&self, lane: &Lane) -> bool {
        matches!(lane, Lane::Offer(id) if self.lanes.contains_key(&Lane::Lease(id.clone())))
    }

    /// Takes the first queued unit of work whose lane is free (see [`Lane`]), if any may start.
    fn next_startable(&mut self) -> Option<Work> {
        if self.lanes.values().any(|s| s.work == Work::RenewSession) {
            // A new Session id replaces the old one: nothing else goes out meanwhile.
            return None;
        }
        let offers = self
            .lanes
            .keys()
            .filter(|l| matches!(l, Lane::Offer(_)))
            .count();
        let index = (0..self.queue.len()).find(|&i| self.startable(i, offers))?;
        let work = self.queue.remove(index)?;
        // The pass's completion is in progress (uploading): renew the lease beside it.
        if let Work::Supervise(id) = &work
            && self.lanes.contains_key(&Lane::Offer(id.clone()))
        {
            return Some(Work::Renew(id.clone()));
        }
        Some(work)
    }

    /// Whether the queued work at `index` may start now.
    fn startable(&self, index: usize, offers: usize) -> bool {
        let work = &self.queue[index];
        let free = |lane: Lane| !self.lanes.contains_key(&lane);
        match work {
            Work::RenewSession => self.lanes.is_empty(),
            // Every Session exchange ahead of it first (a heartbeat that reports the slots);
            // every processing ahead of it too (startup reconciliation's and an admitted
            // offer's: their evidence latches fail-closed before another offer is taken).
            Work::Pull => {
                free(Lane::Pull)
                    && free(Lane::Session)
                    && !self
                        .lanes
                        .values()
                        .any(|s| matches!(s.work, Work::Process(_)))
                    && !self
                        .queue
                        .range(..index)
                        .any(|w| matches!(w.lane(), Lane::Session) || matches!(w, Work::Process(_)))
            }
            Work::Supervise(id) if !free(Lane::Offer(id.clone())) => {
                free(Lane::Lease(id.clone()))
                    && self
                        .beside_upload_at(work)
                        .is_some_and(|at| self.mono >= at)
            }
            Work::Process(_) | Work::Supervise(_) | Work::Renew(_) => {
                free(work.lane()) && offers < usize::from(self.config.max_concurrent_runs.max(1))
            }
            Work::Register
            | Work::Rejoin
            | Work::Heartbeat
            | Work::Transition(_)
            | Work::ListPage { .. } => free(work.lane()),
        }
    }

    /// When the queued `work`, a supervision pass of an offer whose lane uploads its log, may
    /// start beside that upload as a renewal (`None`: any other work): once the upload has been
    /// outstanding for `lease_control_interval`, or once half the lease is spent, whichever
    /// comes first. The control plane checks an upload's lease fence when its header arrives;
    /// a renewal sent together with the upload can be applied first and fence it (409), and
    /// the upload then goes again, whole. With a slow control plane and a short interval every
    /// retry met the next renewal (`e2e_slow_plane`: up to 7 fenced uploads for one Run). An
    /// upload long enough to need a renewal beside it outlasts the wait; half the lease left
    /// leaves the renewal time to come back. A lease without a local clock (obtained before a
    /// restart) is renewed at once.
    fn beside_upload_at(&self, work: &Work) -> Option<MonoMillis> {
        let Work::Supervise(offer_id) = work else {
            return None;
        };
        let lane = Lane::Offer(offer_id.clone());
        let slot = self.lanes.get(&lane).filter(|slot| slot.uploading())?;
        let settled = slot
            .call_sent
            .saturating_add(self.config.lease_control_interval_ms);
        Some(match self.leases.get(offer_id) {
            Some(clock) => {
                let half = clock.deadline.saturating_since(clock.began) / 2;
                settled.min(clock.began.saturating_add(half))
            }
            None => slot.call_sent,
        })
    }

    /// Sets the renewal timer of `offer_id`'s lease, obtained by a call sent at `began`
    /// (see [`Timer::Renewal`]). An interval of 0 renews at every tick: no timer then.
    pub(crate) fn arm_renewal(&mut self, offer_id: &OfferId, began: MonoMillis) {
        let interval = self.config.lease_control_interval_ms;
        if interval > 0 {
            let due = began.saturating_add(interval);
            self.timers.insert(Timer::Renewal(offer_id.clone()), due);
        }
    }

    /// Whether `work` is queued or in progress (nothing is planned twice).
    pub(crate) fn planned(&self, work: &Work) -> bool {
        self.queue.contains(work) || self.lanes.values().any(|s| &s.work == work)
    }

    /// The earliest deadline: the timer table's (see [`Timer`]), or a renewal's that waits
    /// beside its offer's upload.
    fn wake_at(&self) -> Option<MonoMillis> {
        // A renewal queued behind its offer's upload starts at `beside_upload_at` (one whose
        // time has come waits only for its lease lane, whose answer wakes the Worker).
        let beside = self
            .queue
            .iter()
            .filter_map(|work| self.beside_upload_at(work))
            .filter(|at| *at > self.mono);
        // The backoffs are gates: the Worker does not wake for them.
        let gates = [
            Timer::RegisterBackoff,
            Timer::RenewalBackoff,
            Timer::PullBackoff,
        ];
        let timers = self
            .timers
            .iter()
            .filter(|(timer, _)| !gates.contains(timer))
            .map(|(_, at)| *at);
        timers.chain(beside).min()
    }

    /// When the next tick is due.
    pub(crate) fn tick_at(&self) -> MonoMillis {
        self.timers.get(&Timer::Tick).copied().unwrap_or(self.mono)
    }

    /// Whether `timer` is set and has come.
    pub(crate) fn due(&self, timer: &Timer) -> bool {
        self.timers.get(timer).is_some_and(|at| self.mono >= *at)
    }

    /// Whether `timer` is set and has not come yet.
    pub(crate) fn pending(&self, timer: &Timer) -> bool {
        self.timers.get(timer).is_some_and(|at| self.mono < *at)
    }

    /// Ticks at once (the next poll plans a tick).
    pub(crate) fn tick_now(&mut self) {
        self.timers.insert(Timer::Tick, self.mono);
    }

    /// Sets `timer` `delay_ms` from now (monotonic).
    fn set_timer(&mut self, timer: Timer, delay_ms: u64) {
        self.timers
            .insert(timer, self.mono.saturating_add(delay_ms));
    }

    fn on_outcome(&mut self, id: OpId, outcome: Outcome) -> Result<(), InputError> {
        let awaited = self
            .lanes
            .iter()
            .find_map(|(lane, slot)| match slot.pending {
                Pending::Outstanding {
                    id: sent, answer, ..
                } if sent == id => Some((lane.clone(), answer)),
                Pending::Outstanding { .. } | Pending::Staged(_) => None,
            });
        let Some((lane, answer)) = awaited else {
            return Err(InputError::UnexpectedOutcome { id });
        };
        let Ok(reply) = answer.reply(outcome) else {
            return Err(InputError::OutcomeMismatch { id });
        };
        let Some(slot) = self.lanes.remove(&lane) else {
            return Err(InputError::UnexpectedOutcome { id });
        };
        self.observe_authentication(&reply);
        if let (
            Outcome::Persisted,
            Pending::Outstanding {
                write: Some(record),
                ..
            },
        ) = (&reply.0, slot.pending)
        {
            if slot.op.grants_lease() {
                // The lease it writes was granted in answer to its last call; its renewal
                // is due `lease_control_interval` after that call's sending, and the
                // Worker wakes for it rather than wait for a supervision visit.
                let offer_id = record.offer.offer_id.clone();
                if matches!(slot.op, Running::Process(_)) {
                    // A renewal inside the start path paces the first supervision pass's,
                    // and settles what lost renewals may have left at the control plane.
                    self.last_renewal.insert(offer_id.clone(), slot.call_sent);
                    self.lease_may_hold.remove(&offer_id);
                }
                self.arm_renewal(&offer_id, slot.call_sent);
                self.leases.insert(
                    offer_id,
                    LeaseClock::of(&record.offer.lease, slot.call_sent),
                );
            }
            self.observe(&record);
        } else if let Outcome::RecordRead(Some(record)) = &reply.0 {
            self.observe(record);
        }
        let step = slot.op.resume(&self.ctx(slot.call_sent), reply);
        self.apply(lane, slot.work, slot.call_sent, step);
        Ok(())
    }

    /// What an operation sees, its last call sent at `call_sent` (see `Slot::call_sent`).
    fn ctx(&self, call_sent: MonoMillis) -> Ctx<'_> {
        Ctx {
            config: &self.config,
            session: self.session.as_ref(),
            now: self.now,
            mono: self.mono,
            call_sent,
            leases: &self.leases,
            lease_may_hold: &self.lease_may_hold,
            may_launch: self.may_launch(),
        }
    }

    fn start(&mut self, work: Work) {
        if work == Work::Pull && !self.decide_pull() && !self.claim_check_due() {
            // Planned at the start of the tick (or of a burst), but since then supervision has
            // latched fail-closed, a drain began, or the slots or the inbox filled: no Pull.
            return;
        }
        if work == Work::RenewSession && !self.renewal_ready() {
            // Queued when no Run of the retiring Session was live, but one started since (or a
            // drain began): the next tick decides again.
            return;
        }
        // What a register or heartbeat reports (`available_slots` never exceeds
        // `max_concurrent_runs`; a heartbeat of a Session that is not online, none); the other
        // work sends no slots.
        let online = self
            .session
            .as_ref()
            .is_some_and(|s| s.status == SessionStatus::Online);
        let slots = if online || work != Work::Heartbeat {
            self.available_slots()
        } else {
            0
        };
        if matches!(work, Work::Register | Work::Rejoin | Work::Heartbeat) {
            self.reporting_slots = Some(slots);
        }
        let step = self.begin(work.clone(), slots);
        self.apply(work.lane(), work, self.mono, step);
    }

    /// Starts the operation for one unit of work, offering `slots` to the control plane.
    fn begin(&self, work: Work, slots: u64) -> Step<Running, Finished> {
        let ctx = &self.ctx(self.mono);
        let interval = self.config.lease_control_interval_ms;
        // Paced: the lease was renewed less than the pacing interval ago.
        let paced = |offer_id: &OfferId| {
            let last = self.last_renewal.get(offer_id);
            last.is_some_and(|at| self.mono < at.saturating_add(interval))
                .then_some(interval)
        };
        let session = |step: Step<_, _>| step.map(Running::Session, Finished::Session);
        match work {
            Work::Register | Work::Rejoin => {
                session(SessionOp::register(ctx, slots, work == Work::Rejoin))
            }
            Work::Heartbeat => session(SessionOp::heartbeat(ctx, slots)),
            Work::Transition(status) => session(SessionOp::transition(ctx, status)),
            Work::RenewSession => session(SessionOp::renew()),
            Work::ListPage { purpose, after } => {
                let limit = match purpose {
                    ListPurpose::Reconcile => ctx.config.startup_page,
                    ListPurpose::Supervise => ctx.config.supervision_page,
                };
                Step::Wait(Running::List(purpose), Action::ListInbox { after, limit })
            }
            // With the inbox full, it goes out only to settle a claim whose offer is already
            // stored (`claim_check_due`).
            Work::Pull => {
                let timed_here = self.claim.held().is_some_and(|held| held.timed_here);
                PullOp::begin(ctx, timed_here, self.inbox_room() == 0)
                    .map(Running::Pull, Finished::Pull)
            }
            Work::Process(offer_id) => ProcessOp::begin(offer_id.clone())
                .map(Running::Process, |r| Finished::Process(offer_id, r)),
            Work::Supervise(offer_id) => {
                // The drain budget ended: stop the Run by identity (once), then complete it.
                let drain_stop =
                    self.drain == Drain::BudgetEnded && !self.drain_stopped.contains(&offer_id);
                SupervisionOp::begin(ctx, offer_id.clone(), paced(&offer_id), drain_stop)
                    .map(Running::Supervise, |r| Finished::Supervise(offer_id, r))
            }
            Work::Renew(offer_id) => SupervisionOp::renew(ctx, offer_id.clone(), paced(&offer_id))
                .map(Running::Supervise, |r| Finished::Supervise(offer_id, r)),
        }
    }

    fn apply(
        &mut self,
        lane: Lane,
        work: Work,
        call_sent: MonoMillis,
        step: Step<Running, Finished>,
    ) {
        match step {
            Step::Wait(op, action) => {
                self.lanes.insert(
                    lane,
                    Slot {
                        work,
                        call_sent,
                        op,
                        pending: Pending::Staged(action),
                    },
                );
            }
            Step::Done(finished) => self.on_finished(finished, call_sent),
            Step::Halt(reason) => self.finish(Finish::Halted(reason)),
        }
    }

    /// Ends the machine (halted, or stopped). Calls still in flight are abandoned, as a crash
    /// would (the lanes are idle whenever a drain completes; otherwise the next start
    /// reconciles).
    fn finish(&mut self, finish: Finish) {
        self.queue.clear();
        self.lanes.clear();
        self.stage = Stage::Finished(finish);
    }

    /// Records the state of a record the Worker read or wrote. Fail-closed follows the
    /// evidence: it holds while any known record is `recovery_required` (startup
    /// reconciliation lists every record, so nothing on disk is missed), and lifts once the last
    /// piece of evidence resolves (a `launch_outcome_unknown` record completed from its receipt).
    pub(crate) fn observe(&mut self, record: &InboxRecord) {
        let id = record.offer.offer_id.clone();
        self.known.insert(id.clone(), record.state);
        // A local lease deadline holds only for the very grant it was computed for.
        if record.state.is_terminal()
            || self
                .leases
                .get(&id)
                .is_some_and(|clock| !clock.names(&record.offer.lease))
        {
            self.leases.remove(&id);
        }
        if let Some(reason) = record.recovery() {
            self.evidence.insert(id.clone(), reason);
        } else {
            self.evidence.remove(&id);
        }
        // Kept to tell dormant records apart (`InboxRecord::is_dormant`) without the record.
        if record.state.is_pre_barrier() {
            self.pre_barrier_expiry
                .insert(id, record.offer.lease.clone());
        } else {
            self.pre_barrier_expiry.remove(&id);
        }
    }

    /// Records that still hold, or may hold, a Run: every non-terminal record except dormant
    /// ones — records that never crossed the spawn barrier and whose lease has expired. Those can
    /// never progress (every call would be fenced) and hold no process; they stay on disk for
    /// the operator (`ql-worker recover` lists them) but neither take a slot nor keep a drain
    /// from completing.
    pub(crate) fn active_count(&self) -> usize {
        self.known
            .iter()
            .filter(|(id, state)| !state.is_terminal() && !self.dormant(id))
            .count()
    }

    /// Whether a record that never crossed the spawn barrier has outlived its lease (see
    /// [`Ctx::lease_remaining_ms`]): it can never progress.
    fn dormant(&self, id: &OfferId) -> bool {
        let ctx = self.ctx(self.mono);
        self.pre_barrier_expiry
            .get(id)
            .is_some_and(|lease| ctx.remaining_ms(id, lease) == 0)
    }

    /// A supervisor of this Worker exited: its receipt is published (or it failed). The record's
    /// completion pass runs now instead of at the next supervision tick; the slot it frees is
    /// offered to the next Pull at once (see `on_finished`).
    fn on_process_exited(&mut self, offer_id: OfferId) {
        let live = self.known.get(&offer_id).is_some_and(|s| !s.is_terminal());
        let work = Work::Supervise(offer_id);
        if live && !self.queue.contains(&work) {
            self.queue.push_back(work);
        }
    }

    /// Retention removed a settled record: it no longer takes a place in the inbox. A record
    /// that is not settled in memory is kept (only settled records are ever removed; a report
    /// about another one is ignored rather than trusted).
    fn forget(&mut self, offer_id: &OfferId) {
        if self.known.get(offer_id).is_some_and(|s| s.is_terminal())
            && !self.pending_cleanup.contains(offer_id)
        {
            self.known.remove(offer_id);
            self.pre_barrier_expiry.remove(offer_id);
            self.gone_launches.remove(offer_id);
            self.drain_stopped.remove(offer_id);
            self.leases.remove(offer_id);
            self.run_ended(offer_id);
        }
    }

    fn begin_drain(&mut self) {
        if self.drain == Drain::NotRequested {
            self.drain = Drain::Requested;
            self.set_timer(Timer::DrainBudget, self.config.drain_budget_ms);
            let in_flight = self.in_flight();
            self.fact(|| Fact::DrainBegun { in_flight });
            match self.stage {
                Stage::Active => {
                    self.stage = Stage::Draining;
                    self.queue
                        .push_back(Work::Transition(SessionStatus::Draining));
                }
                // Never registered: this incarnation started nothing, and what a previous one
                // left is reconciled at the next start. Stop at once (an unreachable control
                // plane must not hold a stop for the whole drain budget).
                Stage::Registering if self.lanes.is_empty() => {
                    self.finish(Finish::Stopped(StopReason::NotRegistered));
                }
                Stage::Registering | Stage::Reconciling | Stage::Draining | Stage::Finished(_) => {}
            }
        }
    }

    /// Credentials refused (401/403 on any call) pause admission; any answered call (the
    /// control plane authenticated the Worker) lifts the pause.
    fn observe_authentication(&mut self, reply: &Reply) {
        match &reply.0 {
            Outcome::Http(HttpFailure::Status {
                status: status @ (401 | 403),
                code,
            }) if self.auth_paused.is_none() => {
                let (status, code) = (*status, code.clone());
                self.auth_paused = Some(status);
                self.fact(|| Fact::AdmissionPaused { status, code });
            }
            Outcome::Responded(_) | Outcome::Uploaded { .. } if self.auth_paused.is_some() => {
                self.auth_paused = None;
                self.fact(|| Fact::AdmissionResumed);
            }
            // Refused again while paused, answered while not paused, or no call at all.
            Outcome::Http(_)
            | Outcome::Responded(_)
            | Outcome::Uploaded { .. }
            | Outcome::InboxListed { .. }
            | Outcome::RecordRead(_)
            | Outcome::ClaimRead(_)
            | Outcome::Persisted
            | Outcome::Store(_)
            | Outcome::ReceiptRead(_)
            | Outcome::ReceiptRemoved { .. }
            | Outcome::LogAllocated
            | Outcome::LogInspected { .. }
            | Outcome::LogMissing
            | Outcome::LogUnavailable
            | Outcome::Spawned(_)
            | Outcome::Stopped(_)
            | Outcome::SupervisionInspected { .. }
            | Outcome::PublishedHandle(_)
            | Outcome::EntropyDrawn(_) => {}
        }
    }
}

// The lifecycle tick.

/// Why the Worker does not Pull now ([`Worker::pull_blocker`]): only what its callers tell
/// apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PullBlocker {
    /// Not in the active phase (registering, reconciling, draining, finished).
    NotActive,
    /// Recovery evidence is present, admission is paused (the credentials were refused, or the
    /// Session is being registered again after a fence), or no usable, online Session.
    Closed,
    /// The inbox has no room for one more record.
    InboxFull,
    /// Every Run slot is taken, or a Pull backoff is pending.
    Busy,
}

impl Worker {
    /// Plans a tick when its time has come. A spurious early wake-up is a no-op. Operations
    /// still in flight do not hold a tick back: its periodic work (the heartbeat first, then a
    /// supervision page and a Pull) joins the queue unless the same work is already queued or
    /// in progress, and each starts as soon as its lane is free (see `worker::Lane`).
    pub(crate) fn on_tick(&mut self) {
        if self.due(&Timer::DrainBudget) {
            self.timers.remove(&Timer::DrainBudget);
            // ADR-0121: ownership is kept until every record is settled. The Runs still in
            // flight are stopped by identity and completed through the normal path; records
            // that cannot settle any more no longer hold the drain (`holds_drain`).
            self.drain = Drain::BudgetEnded;
            let in_flight = self.in_flight();
            self.fact(|| Fact::DrainBudgetEnded { in_flight });
            match self.stage {
                Stage::Draining => {}
                // Never registered: nothing of this incarnation runs.
                Stage::Registering => {
                    return self.finish(Finish::Stopped(StopReason::NotRegistered));
                }
                // Reconciliation never finished (reads kept failing).
                Stage::Reconciling | Stage::Active | Stage::Finished(_) => {
                    return self.finish(Finish::Stopped(StopReason::Unsettled));
                }
            }
            self.tick_now();
        }
        self.plan_timers();
        if !self.due(&Timer::Tick) {
            return;
        }
        self.set_timer(Timer::Tick, self.config.cadence_ms);
        match self.stage {
            Stage::Registering
                if self.pending(&Timer::RegisterBackoff) || self.planned(&Work::Register) => {}
            Stage::Registering => self.queue.push_back(Work::Register),
            Stage::Reconciling => self.list_next(ListPurpose::Reconcile),
            Stage::Active | Stage::Draining => self.plan_active_tick(),
            Stage::Finished(_) => {}
        }
    }

    /// A start-path pass ended: a renewal of its whose answer was lost may have moved the
    /// control plane's lease version (the next pass catches up to it: `lease_may_hold`). A Run
    /// that got past its start path: its lease's renewal timer may have come while it was
    /// starting (and was dropped then); it is set again, from the sending of the call that
    /// obtained the lease.
    fn on_processed(&mut self, offer_id: OfferId, result: &ProcessResult) {
        if let ProcessResult::RenewalUncertain { attempted, .. } = result {
            self.renewal_lost(&offer_id, *attempted);
        }
        let began = self.leases.get(&offer_id).map(|c| c.began);
        if let (true, Some(began)) = (self.running(&offer_id), began) {
            self.arm_renewal(&offer_id, began);
        }
    }

    /// A renewal of `offer_id`'s lease at version `attempted` got no answer: the control plane
    /// may hold the next version (see `lease_may_hold`).
    fn renewal_lost(&mut self, offer_id: &OfferId, attempted: crate::ids::LeaseVersion) {
        if let Ok(next) = attempted.next() {
            let held = self.lease_may_hold.entry(offer_id.clone()).or_insert(next);
            *held = (*held).max(next);
        }
    }

    /// Whether `offer_id`'s Run is started (acknowledged or not).
    fn running(&self, offer_id: &OfferId) -> bool {
        matches!(
            self.known.get(offer_id),
            Some(State::Started | State::RunningAcknowledged)
        )
    }

    /// Plans the work of every timer that has come (see [`Timer`]), without waiting for the
    /// tick: a heartbeat, a running Run's renewal (through its supervision pass, which renews
    /// beside an upload in progress). Each fires once; a heartbeat that cannot go out yet
    /// (registering, reconciling, registering again after a fence) is set again a cadence
    /// later. The drain budget and the tick are `on_tick`'s; a backoff is a gate.
    fn plan_timers(&mut self) {
        let due: Vec<Timer> = self
            .timers
            .iter()
            .filter(|(timer, at)| {
                self.mono >= **at && matches!(timer, Timer::Heartbeat | Timer::Renewal(_))
            })
            .map(|(timer, _)| timer.clone())
            .collect();
        let active = matches!(self.stage, Stage::Active | Stage::Draining) && !self.rejoin;
        for timer in due {
            self.timers.remove(&timer);
            match timer {
                Timer::Heartbeat if !active => {
                    self.set_timer(Timer::Heartbeat, self.config.cadence_ms);
                }
                Timer::Heartbeat if self.session.is_none() || self.planned(&Work::Heartbeat) => {}
                Timer::Heartbeat => self.queue.push_front(Work::Heartbeat),
                Timer::Renewal(offer_id) => {
                    // Queued even while a pass of this offer is in progress: if that pass
                    // goes on to upload the log, the renewal starts beside the upload at once
                    // (`Worker::next_startable`) rather than at the next supervision page.
                    let work = Work::Supervise(offer_id.clone());
                    if active
                        && self.running(&offer_id)
                        && !self.queue.contains(&work)
                        && !self.planned(&Work::Renew(offer_id))
                    {
                        self.queue.push_back(work);
                    }
                }
                Timer::Tick
                | Timer::DrainBudget
                | Timer::RegisterBackoff
                | Timer::RenewalBackoff
                | Timer::PullBackoff => {}
            }
        }
    }

    /// The active tick: after a fence, the register again (first, ahead of anything still
    /// queued; the heartbeat is [`Timer::Heartbeat`]'s), the receipts whose removal failed, one
    /// supervision page, then a Pull or the Session renewal. Nothing already queued is queued
    /// twice.
    fn plan_active_tick(&mut self) {
        // Fenced: register again before anything else talks to the control plane (after the
        // backoff of a register that got no usable answer).
        if self.rejoin && !self.pending(&Timer::RegisterBackoff) && !self.planned(&Work::Rejoin) {
            self.queue.push_front(Work::Rejoin);
        }
        // A receipt whose removal failed holds the capability: retry every tick until it is gone.
        let cleanup: Vec<Work> = self
            .pending_cleanup
            .iter()
            .map(|offer_id| Work::Supervise(offer_id.clone()))
            .filter(|work| !self.planned(work))
            .collect();
        self.queue.extend(cleanup);
        self.list_next(ListPurpose::Supervise);
        self.renew_or_pull();
    }

    /// Queues the Session renewal when it is ready (see [`Self::renewal_ready`]) and not queued
    /// yet, else a Pull when one may go out ([`Self::pull_again`]).
    fn renew_or_pull(&mut self) {
        if self.renewal_ready() && !self.planned(&Work::RenewSession) {
            self.queue.push_back(Work::RenewSession);
        } else {
            self.pull_again(false);
        }
    }

    /// Queues the page at `purpose`'s cursor, unless a page for `purpose` is queued or being
    /// listed.
    fn list_next(&mut self, purpose: ListPurpose) {
        let listing = |w: &Work| matches!(w, Work::ListPage { purpose: p, .. } if *p == purpose);
        if self.queue.iter().any(listing) || self.lanes.values().any(|s| listing(&s.work)) {
            return;
        }
        let after = match purpose {
            ListPurpose::Reconcile => self.reconcile_cursor.clone(),
            ListPurpose::Supervise => self.supervision_cursor.clone(),
        };
        self.queue.push_back(Work::ListPage { purpose, after });
    }

    /// Why the Worker does not Pull now, if it does not: not active, fail-closed, admission
    /// paused, no usable online Session, no room in the inbox, no free slot, or a backoff
    /// pending. The order is the order of the checks; [`PullBlocker::InboxFull`] comes before
    /// the slots so that a full inbox is reported whatever the Runs do.
    pub(crate) fn pull_blocker(&self) -> Option<PullBlocker> {
        let online = self
            .session
            .as_ref()
            .is_some_and(|s| s.usable(self.mono) && s.status == SessionStatus::Online);
        if self.stage != Stage::Active {
            Some(PullBlocker::NotActive)
        } else if !self.evidence.is_empty() || self.admission_paused() || !online {
            Some(PullBlocker::Closed)
        } else if self.inbox_room() == 0 {
            Some(PullBlocker::InboxFull)
        } else if self.active_count() >= usize::from(self.config.max_concurrent_runs)
            || self.pending(&Timer::PullBackoff)
        {
            Some(PullBlocker::Busy)
        } else {
            None
        }
    }

    /// Whether a Pull may go out now: active, not fail-closed, admission not paused, the Session
    /// usable and online, a place free in the inbox, a slot free and no backoff. Records what the
    /// decision saw of the inbox: whether it was full, and one more deferral when that held the
    /// Pull back.
    pub(crate) fn decide_pull(&mut self) -> bool {
        let blocker = self.pull_blocker();
        if blocker != Some(PullBlocker::NotActive) {
            self.inbox.full = blocker == Some(PullBlocker::InboxFull);
            if self.inbox.full {
                self.inbox.full_deferrals = self.inbox.full_deferrals.saturating_add(1);
            }
        }
        blocker.is_none()
    }

    /// Whether a Pull should go out although the inbox is full, only to settle the pending
    /// claim: one may name an offer already stored (the claim's clear after storing it did not
    /// land, or an earlier incarnation left it), and while a claim names a record retention
    /// keeps that record, so the inbox would stay full for good. Nothing is pulled
    /// (`PullResult::ClaimChecked`).
    pub(crate) fn claim_check_due(&self) -> bool {
        let unsettled =
            (self.claim.held()).map_or(self.claim == ClaimView::Unknown, |held| held.unchecked);
        unsettled && self.pull_blocker() == Some(PullBlocker::InboxFull)
    }

    /// Places left in the inbox: the capacity less every record the Worker knows of, settled
    /// ones included (they leave only when retention reports them removed).
    pub(crate) fn inbox_room(&self) -> usize {
        self.config.capacity.get().saturating_sub(self.known.len())
    }

    /// Whether a start that found its Session draining or offline (a previous incarnation's
    /// unfinished drain) may now replace it: active, no drain of its own, and no Run of that
    /// Session live any more (an offline Session serves none). Until then its Runs finish under
    /// it: a new Session fences every lease of the old one at the control plane. Checked again
    /// when the renewal starts (work queued before it, such as a launch of a `lease_recovery`
    /// record, may have started a Run of the old Session meanwhile).
    pub(crate) fn renewal_ready(&self) -> bool {
        let offline = self
            .session
            .as_ref()
            .is_some_and(|s| s.status == SessionStatus::Offline);
        // Records that may hold a process, or be completed from a receipt: past the spawn
        // barrier and not settled.
        let live_runs = self.known.values().any(|s| {
            matches!(
                s,
                State::Launching | State::Started | State::RunningAcknowledged
            )
        }) || self
            .evidence
            .values()
            .any(|r| *r == RecoveryReason::LaunchOutcomeUnknown);
        self.retiring
            && self.stage == Stage::Active
            && self.drain == Drain::NotRequested
            && !self.pending(&Timer::RenewalBackoff)
            && (offline || !live_runs)
    }

    /// Whether a launch (starting ACK and spawn) may begin now.
    pub(crate) fn may_launch(&self) -> bool {
        self.evidence.is_empty() && self.drain == Drain::NotRequested
    }

    /// Slots offered to the control plane: none while no launch may begin (fail-closed, a drain)
    /// or admission is paused; else the free Run slots, but never more than the inbox can still
    /// store (less one place for a pending claim, which may still bring a record).
    pub(crate) fn available_slots(&self) -> u64 {
        if !self.may_launch() || self.admission_paused() {
            return 0;
        }
        let max = usize::from(self.config.max_concurrent_runs);
        let room = self
            .inbox_room()
            .saturating_sub(usize::from(self.claim.held().is_some()));
        u64::try_from(max.saturating_sub(self.active_count()).min(room)).unwrap_or(0)
    }

    /// Queues a Pull right away (a burst, or a slot freed between ticks) when one may go out and
    /// none is queued. The control plane offers nothing to a Session whose last heartbeat (or
    /// register) reported no free slot: then a heartbeat that reports the slots goes first.
    fn pull_again(&mut self, at_front: bool) {
        if self.planned(&Work::Pull) || !(self.decide_pull() || self.claim_check_due()) {
            return;
        }
        let stale = self.reported_slots == Some(0) && !self.planned(&Work::Heartbeat);
        if at_front {
            self.queue.push_front(Work::Pull);
            if stale {
                self.queue.push_front(Work::Heartbeat);
            }
        } else {
            if stale {
                self.queue.push_back(Work::Heartbeat);
            }
            self.queue.push_back(Work::Pull);
        }
    }

    /// Applies a finished operation and queues what follows from it.
    pub(crate) fn on_finished(&mut self, finished: Finished, call_sent: MonoMillis) {
        self.fact(|| finished.fact());
        match finished {
            Finished::Session(result) => self.on_session(result, call_sent),
            Finished::Listed(purpose, page) => self.on_listed(purpose, page),
            Finished::Pull(result) => self.on_pull(result),
            // Recovery evidence an operation wrote was observed with its durable write.
            Finished::Process(offer_id, result) => self.on_processed(offer_id, &result),
            Finished::Supervise(offer_id, result) => match result {
                SupervisionResult::Uncertain { attempted, .. } => {
                    self.renewal_lost(&offer_id, attempted);
                }
                SupervisionResult::Renewed | SupervisionResult::StopRequested(_) => {
                    // Paced from the renewal's sending: the next one is due
                    // `lease_control_interval` after it, however long the answer took (a
                    // slow control plane must not stretch the time between two renewals past
                    // the lease); the Worker wakes for it (`Timer::Renewal`, set when the
                    // renewed lease was written).
                    self.last_renewal.insert(offer_id.clone(), call_sent);
                    self.lease_may_hold.remove(&offer_id);
                }
                SupervisionResult::DrainStopped(_) => {
                    self.drain_stopped.insert(offer_id);
                }
                SupervisionResult::Paced
                | SupervisionResult::SessionUnavailable
                | SupervisionResult::Unavailable
                | SupervisionResult::Refused(_)
                | SupervisionResult::LeaseResponseInvalid(_)
                | SupervisionResult::StorageUnchanged
                | SupervisionResult::Pending(_) => {}
                // A pending cleanup ends only with a pass that reached it (completed) or a
                // record that is gone; a pass that ended before (a failed read, then
                // `Settled`) keeps it pending (whole-Worker simulation, seed 1913).
                SupervisionResult::Completed(outcome) => {
                    if matches!(
                        outcome,
                        CompletionOutcome::Acknowledged(Cleanup::Pending)
                            | CompletionOutcome::AlreadyCompleted(Cleanup::Pending)
                    ) {
                        self.pending_cleanup.insert(offer_id.clone());
                    } else {
                        self.pending_cleanup.remove(&offer_id);
                    }
                    self.run_ended(&offer_id);
                    // A completion frees a slot: offered to the next Pull at once rather
                    // than at the next tick (or, for a retiring Session, its last Run lets
                    // the new one in).
                    if matches!(outcome, CompletionOutcome::Acknowledged(_)) {
                        self.renew_or_pull();
                    }
                }
                SupervisionResult::NotFound => {
                    self.pending_cleanup.remove(&offer_id);
                    self.run_ended(&offer_id);
                }
                SupervisionResult::UnknownLaunchGone => {
                    self.gone_launches.insert(offer_id.clone());
                    self.run_ended(&offer_id);
                }
                SupervisionResult::Settled
                | SupervisionResult::CompletionTerminal(_)
                | SupervisionResult::LeaseExpired(_)
                | SupervisionResult::Terminal(_)
                | SupervisionResult::Recovered(..)
                | SupervisionResult::SupervisorGone => self.run_ended(&offer_id),
            },
        }
        self.maybe_finish_drain();
    }

    /// `offer_id`'s Run is no longer renewed here: its pacing, renewal timer and lost renewals
    /// go.
    fn run_ended(&mut self, offer_id: &OfferId) {
        self.last_renewal.remove(offer_id);
        self.timers.remove(&Timer::Renewal(offer_id.clone()));
        self.lease_may_hold.remove(offer_id);
    }

    fn on_session(&mut self, result: SessionResult, call_sent: MonoMillis) {
        let registered = matches!(result, SessionResult::Registered(_));
        match result {
            SessionResult::Registered(view) | SessionResult::Heartbeat(view) => {
                self.reported_slots = self.reporting_slots.take();
                self.session_uncertain = false;
                // The control plane answers again: a claim that may hold a lease is replayed at
                // the next tick, before that lease can run out during the claim's backoff.
                if let ClaimView::Pending(held) = &mut self.claim
                    && held.may_hold_lease
                    && self.timers.remove(&Timer::PullBackoff).is_some()
                {
                    held.timed_here = true;
                }
                if registered {
                    self.register_failures = 0;
                    self.timers.remove(&Timer::RegisterBackoff);
                } else {
                    self.fences = 0;
                }
                if registered && self.rejoin {
                    self.rejoin = false;
                    self.fact(|| Fact::Rejoined);
                    if self.stage == Stage::Draining {
                        // The new registration is online: announce the drain again, and let
                        // the final transition be queued anew.
                        self.transition_offline_queued = false;
                        self.queue
                            .push_back(Work::Transition(SessionStatus::Draining));
                    }
                }
                if self.stage == Stage::Registering {
                    // Draining or offline although this start asked for no drain: a previous
                    // incarnation stopped during its drain. See `renewal_ready`.
                    self.retiring =
                        view.status != SessionStatus::Online && self.drain == Drain::NotRequested;
                    if view.status == SessionStatus::Online {
                        // Once a Session is online this incarnation renews no more (`retiring`
                        // is set only here, at the registering stage, which only a renewal
                        // returns to): the reset changes no behaviour, it keeps the state
                        // canonical for the model checks' fingerprint.
                        self.renewals = 0;
                        self.timers.remove(&Timer::RenewalBackoff);
                    } else if self.retiring && self.renewals > 0 {
                        // The Session this incarnation renewed is not online either.
                        let delay = register_backoff(self.config.backoff_base_ms, self.renewals);
                        self.set_timer(Timer::RenewalBackoff, delay);
                    }
                    self.stage = Stage::Reconciling;
                    self.tick_now();
                }
                self.session = Some(view);
                // Paced from the exchange's sending, as renewals are: with a control plane
                // that takes long to answer, pacing from the answer would let the Session's
                // local deadline (the sending plus the lease) pass before the next answer.
                let heartbeat = call_sent.saturating_add(self.config.heartbeat_interval_ms);
                self.timers.insert(Timer::Heartbeat, heartbeat);
            }
            SessionResult::Transitioned(view) => {
                self.session_uncertain = false;
                let offline = view.status == SessionStatus::Offline;
                self.session = Some(view);
                if offline {
                    self.finish(Finish::Stopped(self.drain_end()));
                }
            }
            SessionResult::Renewed(session_id) => {
                // The new id is durable: register it (then reconcile, then work). Everything
                // queued was planned for the old Session.
                self.renewals = self.renewals.saturating_add(1);
                self.config.session_id = session_id;
                self.session = None;
                self.reported_slots = None;
                self.retiring = false;
                self.stage = Stage::Registering;
                self.reconcile_cursor = None;
                self.queue.clear();
                self.tick_now();
                self.timers.remove(&Timer::Heartbeat);
            }
            SessionResult::Unanswered { exchange, fault } => self.on_unanswered(exchange, fault),
            SessionResult::Fenced(detail) => self.on_fenced(detail),
            SessionResult::Rejected(detail) => {
                self.finish(Finish::Halted(HaltReason::RegisterRejected { detail }));
            }
        }
    }

    /// A Session exchange got no usable answer: retried; the Session lease decides what stays
    /// usable.
    fn on_unanswered(&mut self, exchange: Exchange, fault: CallFault) {
        // An uncertain heartbeat or transition may have moved the Session's version at the
        // control plane: the fence that then answers the next exchange is expected (see
        // `on_fenced`). The next tick tries again.
        if !matches!(exchange, Exchange::Register) {
            let next_tick = self.tick_at();
            self.timers.insert(Timer::Heartbeat, next_tick);
        }
        if matches!(fault, CallFault::Uncertain(_))
            && matches!(exchange, Exchange::Heartbeat | Exchange::Transition(_))
        {
            self.session_uncertain = true;
        }
        match exchange {
            Exchange::Register => {
                self.register_failures = self.register_failures.saturating_add(1);
                let delay = register_backoff(self.config.backoff_base_ms, self.register_failures);
                self.set_timer(Timer::RegisterBackoff, delay);
                let attempt = self.register_failures;
                self.fact(|| Fact::RegisterRetry {
                    attempt,
                    fault,
                    retry_in_ms: delay,
                });
            }
            Exchange::Heartbeat | Exchange::Transition(SessionStatus::Draining) => {}
            // Nothing is in flight (the final transition is queued only then): the
            // drain is done; the Session's lease expires at the control plane.
            Exchange::Transition(SessionStatus::Offline | SessionStatus::Online) => {
                self.finish(Finish::Stopped(self.drain_end()));
            }
        }
    }

    /// The Session was fenced: register it again (the reference's resume).
    fn on_fenced(&mut self, detail: String) {
        if !self.rejoin {
            // A fence right after an uncertain exchange is what a committed, unanswered
            // exchange leaves (the control plane holds version + 1): register again
            // (the reference's resume) without counting it against the Worker.
            let expected = core::mem::take(&mut self.session_uncertain);
            if !expected {
                self.fences = self.fences.saturating_add(1);
            }
            if self.fences > MAX_FENCES_IN_A_ROW {
                let detail = alloc::format!(
                    "{detail} ({} fences in a row, each after registering again)",
                    self.fences
                );
                self.finish(Finish::Halted(HaltReason::SessionFenced { detail }));
                return;
            }
            let attempt = self.fences.max(1);
            self.rejoin = true;
            self.tick_now();
            self.fact(|| Fact::Rejoining {
                detail,
                attempt,
                after_uncertain: expected,
            });
        }
    }

    fn on_listed(
        &mut self,
        purpose: ListPurpose,
        page: Option<(Vec<InboxRecord>, Option<OfferId>)>,
    ) {
        let Some((records, next_after)) = page else {
            // Nothing was learned: keep the phase and the cursor; the next tick lists the same
            // page again (startup reconciliation never completes on a failed read).
            return;
        };
        for record in &records {
            self.observe(record);
        }
        let mut work = page_work(purpose, &records);
        match purpose {
            ListPurpose::Reconcile => {
                // A settled completion's receipt may still be on disk (a crash before its
                // removal): its cleanup pass is retried every tick until one reaches the
                // receipt, like a failed removal's (a pass cut short by a failed read would
                // otherwise leave the capability on disk for good; simulation seed 5581).
                for r in &records {
                    if r.state == State::CompletionAcknowledged {
                        self.pending_cleanup.insert(r.offer.offer_id.clone());
                    }
                }
                for item in work {
                    if !self.queue.contains(&item) {
                        self.queue.push_back(item);
                    }
                }
                self.reconcile_cursor = next_after.clone();
                if next_after.is_none() {
                    if self.drain != Drain::NotRequested {
                        self.stage = Stage::Draining;
                        self.queue
                            .push_back(Work::Transition(SessionStatus::Draining));
                    } else {
                        self.stage = Stage::Active;
                    }
                }
                // The next page (or the first active tick) follows at once.
                self.tick_now();
            }
            ListPurpose::Supervise => {
                let active = records.iter().filter(|r| !r.state.is_terminal()).count();
                let gone = &self.gone_launches;
                work.retain(|w| !matches!(w, Work::Supervise(id) if gone.contains(id)));
                // Settled records fill pages without needing supervision: when a page held fewer
                // active records than a page's worth, the next page follows in the same tick, so
                // the time between two visits of a live Run does not grow with settled records
                // (found by the crash campaign). Bounded: the cursor ends at the inbox's end.
                if active < self.config.supervision_page.get()
                    && let Some(after) = next_after.clone()
                {
                    work.push(Work::ListPage {
                        purpose: ListPurpose::Supervise,
                        after: Some(after),
                    });
                }
                // Supervision runs before the Pull queued behind it in this tick; what is queued
                // already is not queued twice (an offer's pass may outlast a tick).
                for item in work.into_iter().rev() {
                    if !self.queue.contains(&item) {
                        self.queue.push_front(item);
                    }
                }
                self.supervision_cursor = next_after;
            }
        }
    }

    fn on_pull(&mut self, result: PullResult) {
        match result {
            PullResult::Admitted { offer_id, .. } => {
                self.claim_settled();
                // The offer is processed first, then the next Pull goes out at once while slots
                // and room remain (re-checked when it starts); an idle answer ends the burst.
                self.pull_again(true);
                self.queue.push_front(Work::Process(offer_id));
            }
            PullResult::Idle | PullResult::Fenced { .. } => self.claim_settled(),
            // The claim is gone: the next tick pulls afresh, with no backoff.
            PullResult::Refused { offer_id, reason } => {
                self.claim_settled();
                if self.notices.len() == MAX_NOTICES {
                    self.notices.pop_front();
                }
                self.notices
                    .push_back(Notice::OfferRefused { offer_id, reason });
            }
            // The claim's backoff is waited out here, on the monotonic clock.
            PullResult::Backoff { retry_in_ms } => self.claim_kept(retry_in_ms, true, false),
            // Its 16 attempts are spent: the Pull cleared the claim (durably) and waits no backoff.
            PullResult::Failed {
                fault: crate::pull::PullFault::BudgetExhausted,
                ..
            } => self.claim_settled(),
            // Only a backoff this Pull persisted is waited out on the monotonic clock; a Pull
            // that ended before it compared the persisted one (a read that failed, nothing
            // changed: `retry_in_ms` 0) leaves that comparison to the next Pull.
            PullResult::Failed { retry_in_ms, fault } => {
                let uncertain =
                    matches!(fault, crate::pull::PullFault::Call(CallFault::Uncertain(_)));
                self.claim_kept(retry_in_ms, retry_in_ms > 0, uncertain);
            }
            PullResult::SessionUnavailable => {}
            // Nothing was pulled; the backoff, if any, still holds the next Pull.
            PullResult::ClaimChecked { pending: false } => self.claim = ClaimView::Settled,
            PullResult::ClaimChecked { pending: true } => {
                let held = self.claim.held().unwrap_or_default();
                self.claim = ClaimView::Pending(HeldClaim {
                    unchecked: false,
                    ..held
                });
            }
        }
    }

    /// A Pull ended keeping its claim: the next waits `retry_in_ms`. `timed`: this backoff is
    /// waited out here; `uncertain`: an `offers` call got an uncertain outcome. Both hold on
    /// from earlier Pulls of the same claim.
    fn claim_kept(&mut self, retry_in_ms: u64, timed: bool, uncertain: bool) {
        self.set_timer(Timer::PullBackoff, retry_in_ms);
        let was = self.claim.held().unwrap_or_default();
        self.claim = ClaimView::Pending(HeldClaim {
            unchecked: true,
            timed_here: timed || was.timed_here,
            may_hold_lease: uncertain || was.may_hold_lease,
        });
    }

    /// The Pull's claim is gone (cleared, or none was found): no backoff, nothing pending.
    fn claim_settled(&mut self) {
        self.timers.remove(&Timer::PullBackoff);
        self.claim = ClaimView::Settled;
    }

    /// How a finished drain ends: every record settled, or some left for the next start.
    fn drain_end(&self) -> StopReason {
        if self.active_count() == 0 {
            StopReason::Drained
        } else {
            StopReason::Unsettled
        }
    }

    fn maybe_finish_drain(&mut self) {
        let settled = self.in_flight() == 0;
        if self.stage == Stage::Draining
            && settled
            && self.queue.is_empty()
            && self.lanes.is_empty()
            && !self.transition_offline_queued
        {
            self.transition_offline_queued = true;
            self.queue
                .push_back(Work::Transition(SessionStatus::Offline));
        }
    }
}

/// Fences of the Session in a row (each followed by registering again without a good heartbeat
/// in between) before the Worker halts.
const MAX_FENCES_IN_A_ROW: u8 = 3;

/// The wait before registering again after `failures` registers in a row got no usable answer:
/// `min(60 s, base · 2^(failures − 1))`. Also the Pull backoff's ceiling, before its jitter (a
/// register is one per Worker, not one per claim, and the core draws no entropy for it).
pub(crate) fn register_backoff(base_ms: u64, failures: u32) -> u64 {
    let exponent = failures.saturating_sub(1).min(20);
    base_ms
        .saturating_mul(1u64 << exponent)
        .min(crate::pull::MAX_BACKOFF_MS)
}

/// The work one listed page plans, record by record (reference §4.7, §4.8).
///
/// Startup reconciliation ([`ListPurpose::Reconcile`]): which records go to the Processor. A
/// `completion_acknowledged` record also gets one completion pass, which only removes its
/// receipt: a crash between the durable acknowledgement and the removal would otherwise leave
/// the receipt, and the capability it holds, on disk for good (settled records are never
/// supervised again).
///
/// Supervision ([`ListPurpose::Supervise`]): completion first, then lease control, for every
/// record that may have a live process; running-ACK and start-failure replays; retries of
/// unfinished starts. A `launching` record outside this incarnation's own start path was left
/// by an earlier one (its reconciliation's read may have failed): the Processor applies the
/// restart rule, as it does for `started`'s running ACK.
fn page_work(purpose: ListPurpose, records: &[InboxRecord]) -> Vec<Work> {
    let reconcile = purpose == ListPurpose::Reconcile;
    let mut work = Vec::new();
    for r in records {
        // Whether the record goes to the Processor, and whether it gets a supervision pass.
        let (process, supervise) = match r.state {
            State::Accepted | State::StartingAcknowledged | State::StartFailed => (true, false),
            State::Launching | State::Started => (true, !reconcile),
            State::RunningAcknowledged => (false, !reconcile),
            State::RecoveryRequired => (
                false,
                !reconcile && r.recovery_reason == Some(RecoveryReason::LaunchOutcomeUnknown),
            ),
            State::CompletionAcknowledged => (false, reconcile),
            State::StartFailureAcknowledged => (false, false),
        };
        let id = &r.offer.offer_id;
        if process {
            work.push(Work::Process(id.clone()));
        }
        if supervise {
            work.push(Work::Supervise(id.clone()));
        }
    }
    work
}

// Dispatch of the operations, and the helpers they share.

/// The operation in progress. `Clone` and `Hash` exist only for `Worker::fork` and the model
/// checker's fingerprints (it branches a Worker between two commands; `sim-hooks` feature).
#[cfg_attr(feature = "sim-hooks", derive(Clone, Hash))]
#[derive(Debug)]
pub(crate) enum Running {
    Session(SessionOp),
    List(ListPurpose),
    Pull(PullOp),
    Process(ProcessOp),
    Supervise(SupervisionOp),
}

/// A finished operation's result.
#[derive(Debug)]
pub(crate) enum Finished {
    Session(SessionResult),
    /// A listed page (its records and the cursor after it), or `None` when it could not be
    /// read (a transient storage failure): nothing was learned, and the same page must be
    /// listed again — never mistaken for an empty last page.
    Listed(ListPurpose, Option<(Vec<InboxRecord>, Option<OfferId>)>),
    Pull(PullResult),
    /// The Worker's decisions come from the records it observed; the result itself is kept for
    /// the facts ([`Fact::Process`]) and `Debug` traces.
    Process(OfferId, ProcessResult),
    Supervise(OfferId, SupervisionResult),
}

impl Finished {
    /// The fact this result reports to the driver (none for a listed page: the driver saw it).
    pub(crate) fn fact(&self) -> Option<Fact> {
        match self {
            Self::Session(result) => Some(Fact::Session(result.clone())),
            Self::Listed(..) => None,
            Self::Pull(result) => Some(Fact::Pull(result.clone())),
            Self::Process(offer_id, result) => Some(Fact::Process {
                offer_id: offer_id.clone(),
                result: result.clone(),
            }),
            Self::Supervise(offer_id, result) => Some(Fact::Supervise {
                offer_id: offer_id.clone(),
                result: result.clone(),
            }),
        }
    }
}

impl Running {
    /// Whether the record write this operation awaits stores a lease the control plane granted
    /// in answer to one of its own calls (the Worker then times that lease from when the
    /// operation began; see `worker::LeaseClock`).
    pub(crate) fn grants_lease(&self) -> bool {
        match self {
            Self::Pull(op) => op.grants_lease(),
            Self::Supervise(op) => op.grants_lease(),
            Self::Process(op) => op.grants_lease(),
            Self::Session(_) | Self::List(_) => false,
        }
    }

    /// The offer whose launch this operation's next command begins or continues before the
    /// spawn barrier ([`ProcessOp::launching`]), if any.
    pub(crate) fn launching(&self) -> Option<&OfferId> {
        match self {
            Self::Process(op) => op.launching().then_some(op.offer_id()),
            Self::Session(_) | Self::List(_) | Self::Pull(_) | Self::Supervise(_) => None,
        }
    }

    /// Feeds the outcome of this operation's outstanding action.
    pub(crate) fn resume(self, ctx: &Ctx<'_>, reply: Reply) -> Step<Self, Finished> {
        match self {
            Self::Session(op) => op.resume(ctx, reply).map(Self::Session, Finished::Session),
            Self::List(purpose) => match reply.listing() {
                Ok(page) => Step::Done(Finished::Listed(purpose, Some(page))),
                Err(failure) => {
                    read_failure(failure, || Step::Done(Finished::Listed(purpose, None)))
                }
            },
            Self::Pull(op) => op.resume(ctx, reply).map(Self::Pull, Finished::Pull),
            Self::Process(op) => {
                let offer_id = op.offer_id().clone();
                op.resume(ctx, reply)
                    .map(Self::Process, |r| Finished::Process(offer_id, r))
            }
            Self::Supervise(op) => {
                let offer_id = op.offer_id().clone();
                op.resume(ctx, reply)
                    .map(Self::Supervise, |r| Finished::Supervise(offer_id, r))
            }
        }
    }
}

/// The next revision of `stored` in `state`, `updatedAtMs = max(now, stored.updatedAtMs)`, with
/// `edit` applied (reference §4.2: every replace is a revision CAS).
pub(crate) fn next_record(
    stored: &InboxRecord,
    state: State,
    now: UnixMillis,
    edit: impl FnOnce(&mut InboxRecord),
) -> InboxRecord {
    let mut next = stored.clone();
    // INVARIANT: revisions stay far below 2^53 (one per durable step of a bounded lifecycle).
    next.revision = stored.revision.next().unwrap_or(stored.revision);
    next.state = state;
    next.updated_at_ms = now.max(stored.updated_at_ms);
    edit(&mut next);
    next
}

/// The write that records `reason` as `stored`'s recovery evidence (`recovery_required`).
pub(crate) fn recovery(stored: &InboxRecord, reason: RecoveryReason, now: UnixMillis) -> Action {
    let proposed = next_record(stored, State::RecoveryRequired, now, |r| {
        r.recovery_reason = Some(reason);
    });
    persist(stored, proposed)
}

/// The replace action for `proposed`, after checking the transition here too (pair assertion:
/// the core never proposes a write the journal would refuse).
pub(crate) fn persist(stored: &InboxRecord, proposed: InboxRecord) -> Action {
    let check = check_transition(stored, &proposed, stored.revision);
    assert!(
        check.is_ok(),
        "core proposed an invalid transition: {check:?}"
    );
    Action::PersistRecord {
        expected: Some(stored.revision),
        record: Box::new(proposed),
    }
}

/// How a control-plane call failed, from the core's point of view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallFault {
    /// No answer, and the request cannot have taken effect (no connection, 5xx, 408, 429):
    /// retry later.
    Unavailable,
    /// The request may have taken effect, but no usable answer came back (issue 17): the
    /// connection was lost after sending, the answer was not the contract's JSON, or its status
    /// was neither 200 nor an error. Retried like [`CallFault::Unavailable`]; an operation whose
    /// retry is fenced by a version the lost call advanced reasons about it (lease control,
    /// completion, the Session).
    Uncertain(Uncertainty),
    /// 409: the control plane fenced the request (stale Session, lease or version).
    Fenced {
        /// The error code.
        code: Option<String>,
    },
    /// Another 4xx status (400, 401, 403, 404, 413, 415): a configuration or contract problem on
    /// one side, or refused credentials.
    Rejected {
        /// HTTP status.
        status: u16,
        /// The error code.
        code: Option<String>,
    },
    /// A 200 response of the contract's JSON shape that breaks a rule or drifts from its
    /// request: the control plane said something definite, and it is wrong.
    Invalid(WireError),
}

/// Why a call's outcome is uncertain.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Uncertainty {
    /// The connection closed, reset or timed out after the request may have been sent, or the
    /// response broke the transport rules.
    #[error("the answer was lost (connection or transport)")]
    Transport,
    /// A status that is neither 200 nor an error status (a 201, a redirect).
    #[error("the answer had status {0}, not 200")]
    Status(u16),
    /// A 200 whose body is not the contract's JSON (not JSON, a key added or missing, outside
    /// its size bounds).
    #[error("the answer is not the contract's JSON: {0}")]
    Garbled(WireError),
}

/// Classifies an HTTP failure.
pub(crate) fn http_fault(failure: HttpFailure) -> CallFault {
    match failure {
        HttpFailure::Unavailable => CallFault::Unavailable,
        HttpFailure::Uncertain => CallFault::Uncertain(Uncertainty::Transport),
        HttpFailure::Status { status: 409, code } => CallFault::Fenced { code },
        HttpFailure::Status { status, code } => match status {
            408 | 429 | 500.. => CallFault::Unavailable,
            400..=499 => CallFault::Rejected { status, code },
            _ => CallFault::Uncertain(Uncertainty::Status(status)),
        },
    }
}

/// Classifies a 200 body that failed to parse: a body that is not the contract's JSON at all
/// (not JSON, a key added or missing, outside its size bounds) is an uncertain outcome; a body
/// of the right shape whose values break a rule or drift from the request is the control
/// plane's definite, wrong answer ([`CallFault::Invalid`]).
pub(crate) fn parse_fault(error: WireError) -> CallFault {
    match error {
        WireError::Size { .. } | WireError::Json { .. } => {
            CallFault::Uncertain(Uncertainty::Garbled(error))
        }
        other @ (WireError::Field { .. }
        | WireError::Mismatch { .. }
        | WireError::Revision(_)
        | WireError::Request { .. }
        | WireError::RequestTooLarge { .. }) => CallFault::Invalid(other),
    }
}
