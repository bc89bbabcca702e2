//! The simulated host: everything outside the Worker, as plain data.
//!
//! * **Disk** ([`Disk`]): inbox records, checked exactly as the journal checks them
//!   ([`check_transition`](ql_worker_core::record::check_transition) on every replace, revision 0 on
//!   every first publication), the pending claim (create/replace/clear rules of
//!   [`ql_worker_core::claim`]), completion receipts and the log spool (content and truncation fact).
//!   Writes may fail cleanly ([`Answer::Unchanged`]) or uncertainly: the bytes land
//!   ([`Answer::UncertainLanded`]) or not ([`Answer::UncertainLost`]), and either way the
//!   Worker hears `Uncertain`.
//! * **Supervisor** ([`Supervisor`]): the process table. A spawn re-verifies the durable barrier
//!   like the real supervisor; a process keeps running across Worker crashes and, when it
//!   exits (an [`Event`]), writes its receipt.
//! * **Control plane** ([`ControlPlane`]): one consistent view per Run, whose [`Answer::Ok`]
//!   is the answer a correct control plane gives; every other answer is a deliberate
//!   alternative (adversarial but well-formed statuses, `409`, transport loss, a malformed
//!   body, or a commit whose response is lost). It fences what the reference fences, whatever
//!   the answer: an offer replay whose lease can no longer be recovered (409
//!   `worker_offer_fenced`, reference §2.2), a `starting` of an expired lease and any ACK of a
//!   re-delivered offer (409 `worker_activation_fenced`), a stale lease or Session version.
//! * **Entropy**: deterministic bytes from the world seed and a draw counter; the
//!   [`Answer::EntropyVariant`] alternative draws other bytes (maximal backoff jitter).
//!
//! Every command is checked against the safety invariants before it takes effect; a broken
//! invariant is pushed to [`World::violations`] (see [`check`]).

pub mod check;
mod disk;
mod plane;
mod supervisor;

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hasher;

use sha2::{Digest as _, Sha256};

pub use self::disk::{Disk, Log, StoredReceipt};
pub use self::plane::{ControlPlane, CpRun, CpStatus, OfferTemplate};
pub use self::supervisor::{Process, ProcessState, ReceiptKind, SpawnPlan, Supervisor};
use crate::testkit::act;
use ql_worker_core::capability::{ENTROPY_BYTES, Entropy};
use ql_worker_core::ids::{AttemptId, OfferId, RunId, SessionId};
use ql_worker_core::io::{Action, HttpCall, Outcome, StoreFailure};
use ql_worker_core::record::State;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::route::Operation;

/// How the world answers one command. [`Answer::Ok`] is the healthy, consistent answer; every
/// other variant is an alternative a command kind may allow (see [`World::options`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Answer {
    /// The healthy, consistent answer.
    Ok,
    /// Crash the Worker before the command takes effect.
    CrashBefore,
    /// Perform the command (healthy answer), then crash before the outcome is delivered.
    CrashAfter,
    /// Storage: nothing written, `Store(Unchanged)` (also a transient read failure).
    Unchanged,
    /// Storage: the write lands, but the Worker hears `Store(Uncertain)`.
    UncertainLanded,
    /// Storage: the write is lost, and the Worker hears `Store(Uncertain)`.
    UncertainLost,
    /// Storage: the read or write found an unsafe or corrupt file (a symlink, another owner,
    /// a mode too open, bytes that do not decode); nothing is written and the Worker hears
    /// `Store(Unsafe)`: it must fail closed (halt).
    Unsafe,
    /// Control plane: `applied`.
    Applied,
    /// Control plane: `already_starting`.
    AlreadyStarting,
    /// Control plane: `already_running`.
    AlreadyRunning,
    /// Control plane: `already_terminal` (the Run became terminal elsewhere).
    AlreadyTerminal,
    /// Control plane: `already_completed` / `already_stored` (an exact replay).
    AlreadyDone,
    /// Offers: `idle`, for a new offer id only: a replay the fence admits is answered with its
    /// offer, as the reference recovers it (§2.2).
    Idle,
    /// Offers: redeliver the claimed offer with a newer lease version (a fresh claim, or a
    /// replay the plane recovers; a fenced replay stays fenced).
    NewerLease,
    /// Lease control: `renewed`.
    Renewed,
    /// Lease control: `stop_requested` (reason `timeout`).
    StopRequested,
    /// Lease control: `terminal` (`cancelled`).
    Terminal,
    /// HTTP 409 with a fence code.
    Fenced,
    /// No usable response (transport loss before the control plane saw the request).
    Unavailable,
    /// A 200 whose body is not the contract's JSON (`{}`): an uncertain outcome.
    Invalid,
    /// A 200 of the contract's shape that drifts from its request (Secrets: the answer names
    /// another execution digest): the control plane's definite, wrong answer.
    Drifted,
    /// The control plane commits the request, then the response is lost (`Uncertain`).
    LostAfterCommit,
    /// Spawn: `Rejected` (proof of no spawn).
    Rejected,
    /// Spawn: a process exists, but the reported handle is unusable.
    BadHandle,
    /// Spawn: `Unknown`, and a process does exist.
    UnknownSpawned,
    /// Spawn: `Unknown`, and no process exists.
    UnknownNotSpawned,
    /// Stop: `Unknown`; the process (if any) keeps running.
    StopUnknown,
    /// Entropy: other bytes (the first eight all `0xff`: the longest backoff jitter).
    EntropyVariant,
    /// The healthy answer, then the same command's outcome delivered a second time (a stale or
    /// duplicate delivery, as a driver's retry or a late answer would bring): the Worker must
    /// refuse it and change nothing (`duplicate-refused`, checked by the driver).
    Duplicated,
    /// Control plane: an HTTP status without a usable body (400, 401, 409 without a code, 503,
    /// 302), the call not applied.
    HttpStatus(u16),
    /// Control plane: the call applied, its response damaged on the way back (one byte of the
    /// healthy body flipped).
    Garbled,
    /// Control plane: the call applied, its response cut short (the healthy body's first half).
    Truncated,
    /// Storage: the file authority refuses the write as a conflict though none happened
    /// (nothing written, `Store(Conflict)`): the Worker must halt.
    StoreConflict,
    /// Storage: the file authority refuses the write for want of room (nothing written,
    /// `Store(CapacityExhausted)`).
    StoreFull,
}

/// What an [`Answer`] costs against the explorer's budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cost {
    /// The healthy answer.
    Free,
    /// A fault or an alternative answer.
    Fault,
    /// A crash of the Worker.
    Crash,
    /// An entropy variation.
    Entropy,
}

impl Answer {
    /// The budget this answer uses.
    #[must_use]
    pub fn cost(self) -> Cost {
        match self {
            Self::Ok => Cost::Free,
            Self::CrashBefore | Self::CrashAfter => Cost::Crash,
            Self::EntropyVariant => Cost::Entropy,
            _ => Cost::Fault,
        }
    }
}

/// Which alternatives the world offers (the model's nondeterminism). Every field enables one
/// family of [`Answer`]s or [`Event`]s; disabled families only ever get [`Answer::Ok`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Menu {
    /// Crash before or after any command.
    pub crashes: bool,
    /// Record writes fail cleanly or uncertainly.
    pub record_faults: bool,
    /// Claim writes and clears fail cleanly or uncertainly.
    pub claim_faults: bool,
    /// Reads (list, record, claim, receipt) fail transiently.
    pub read_faults: bool,
    /// Every activation status for `starting`, `running`, `start-failure`.
    pub ack_answers: bool,
    /// Offers: idle, newer lease, faults.
    pub offer_answers: bool,
    /// Secrets faults.
    pub secret_answers: bool,
    /// Every executor outcome.
    pub spawn_answers: bool,
    /// Spool allocation and inspection faults.
    pub log_faults: bool,
    /// Receipts: forged, malformed or missing at exit; unreadable store; removal failure.
    pub receipt_answers: bool,
    /// Upload answers and faults.
    pub upload_answers: bool,
    /// Completion answers and faults.
    pub completion_answers: bool,
    /// Lease-control answers and faults.
    pub lease_answers: bool,
    /// Stop outcomes.
    pub stop_answers: bool,
    /// Session register/heartbeat/transition faults.
    pub session_answers: bool,
    /// Entropy variations.
    pub entropy_variants: bool,
    /// Processes exit on their own.
    pub exits: bool,
    /// An answered command's outcome is delivered a second time ([`Answer::Duplicated`]).
    pub duplicates: bool,
    /// Storage reads and writes may find an unsafe or corrupt file ([`Answer::Unsafe`]).
    pub unsafe_storage: bool,
    /// Rougher faults (once the fuzz host's): control-plane calls answered with bare HTTP statuses or
    /// damaged bodies ([`Answer::HttpStatus`], [`Answer::Garbled`], [`Answer::Truncated`]),
    /// record and claim writes refused as conflicts or for want of room
    /// ([`Answer::StoreConflict`], [`Answer::StoreFull`]).
    pub damaged_answers: bool,
}

impl Menu {
    /// Every family of answers and events enabled (the random walks of the tests).
    #[must_use]
    pub fn everything() -> Self {
        Self {
            crashes: true,
            record_faults: true,
            claim_faults: true,
            read_faults: true,
            ack_answers: true,
            offer_answers: true,
            secret_answers: true,
            spawn_answers: true,
            log_faults: true,
            receipt_answers: true,
            upload_answers: true,
            completion_answers: true,
            lease_answers: true,
            stop_answers: true,
            session_answers: true,
            entropy_variants: true,
            exits: true,
            duplicates: true,
            unsafe_storage: true,
            damaged_answers: true,
        }
    }
}

/// A world move that is not an answer to a command: a process exits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Event {
    /// Process `index` of the table exits with `code` and leaves a receipt of `receipt` kind.
    Exit {
        /// Index in [`Supervisor::processes`].
        index: usize,
        /// Exit code.
        code: u8,
        /// What the supervisor leaves as a receipt.
        receipt: ReceiptKind,
    },
}

/// A broken safety invariant.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The invariant's name (see [`check`]).
    pub invariant: &'static str,
    /// What happened.
    pub detail: String,
}

/// A deliberately broken host, for the explorer's self-test: the checker must catch what the
/// Worker does on top of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// Acknowledges writes of records in this state without storing them.
    DropWrites(State),
    /// Acknowledges lease-only writes (same state, newer lease) without storing them.
    DropLeaseWrites,
    /// The Worker's side lies: every `started` write reaches the disk as
    /// `recovery_required(launch_outcome_unknown)`, as a Worker that sends every Run to recovery
    /// would write.
    StartedAsRecovery,
    /// The Worker's side lies: every `recovery_required` write reaches the disk with
    /// `control_plane_already_running` (or, when that is the true reason,
    /// `control_plane_terminal`) instead of the reason the Worker chose.
    WrongRecoveryReason,
    /// The Worker's side lies: clearing the claim of a delivered offer it did not store, it
    /// stores that offer instead (`accepted`), the digest its revision has in place of the
    /// pinned one, as a Worker that trusts the revision over the control plane's pin would.
    StoresEveryOffer,
    /// The Worker's side lies: every spawn command reaches the supervisor twice (a forged
    /// double spawn, as a driver that retried a spawn would make).
    DoubleSpawn,
    /// The Worker's side lies: next to every spawn, a forged spawn of the same Attempt under
    /// another offer id.
    SpawnsAttemptTwice,
    /// The Worker's side lies: next to every spawn, a forged spawn of the same Run with another
    /// Attempt id the control plane never made.
    SpawnsRunTwice,
    /// The Worker's side lies: every spawn plan's start time is one millisecond off the durable
    /// barrier's.
    DriftedPlan,
    /// The supervisor starts the process of a valid spawn but answers `Rejected`.
    SpawnedButRejected,
    /// A valid upload is answered `stored`, but nothing reaches the control plane.
    UploadNotStored,
    /// User processes never end on their own (an unfair environment): exits do not happen.
    HungProcesses,
    /// The driver's retention reports a removal but leaves the record in the inbox.
    RemovalNotDone,
    /// The control plane registers every Session `draining` (so it never takes work).
    SessionStaysDraining,
}

/// Facts the invariants need that are not part of the disk, the process table or the control
/// plane (all deterministic data).
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Evidence {
    /// Every 32-byte window of entropy that may have become a capability (bytes 0..32 of every
    /// draw).
    pub windows: Vec<[u8; 32]>,
    /// Spawn commands received per offer, with the answer given to the last one.
    pub spawns: BTreeMap<OfferId, (u32, Answer)>,
    /// Spawn commands received per Run: the Attempt and offer of each, in order.
    pub run_spawns: BTreeMap<RunId, Vec<(AttemptId, OfferId)>>,
    /// For each claimed offer id: whether the last `offers` reply the Worker heard delivered it
    /// (`false` too once the plane fenced a replay of it, heard or not: it never delivers that
    /// offer id again, so the claim may go unstored).
    pub delivered: BTreeMap<OfferId, bool>,
    /// For each lease granted (offer, lease version) while the call that obtained it was in
    /// flight for a while: how long (ms) between its issue and the plane applying it. The Worker
    /// times a lease from the issue of that call, so its local deadline comes that much early.
    pub lease_slack: BTreeMap<(OfferId, u64), u64>,
    /// Per offer, the recovery reasons something the seed injected leads to
    /// (`recovery-licensed`): `launch_outcome_unknown` after a crash or a fault while the
    /// record was durably `launching`; `control_plane_already_running` and
    /// `control_plane_terminal` after the control plane said so ([`check::answer_causes`]);
    /// `lease_lost_local_execution_stopped` after the supervisor said a Run's supervisor and
    /// process are gone with no genuine receipt on disk.
    pub recovery_causes: BTreeMap<OfferId, BTreeSet<ql_worker_core::record::RecoveryReason>>,
}

/// The simulated host.
#[derive(Clone, Debug)]
pub struct World {
    /// Seed of the entropy stream.
    pub seed: u64,
    /// Entropy draws so far.
    pub draws: u32,
    /// The disk.
    pub disk: Disk,
    /// The supervisor's process table.
    pub supervisor: Supervisor,
    /// The control plane.
    pub plane: ControlPlane,
    /// Facts for the invariants.
    pub evidence: Evidence,
    /// Invariants broken so far (not part of the state; drained by the driver).
    pub violations: Vec<Violation>,
    /// A deliberately broken host, if any.
    pub mutation: Option<Mutation>,
    /// Short names of offers (`o<n>`), for summaries.
    pub aliases: BTreeMap<OfferId, String>,
    /// The stored Session id once the Worker replaced it (`None`: the configured one).
    pub session_id: Option<SessionId>,
    /// The Worker's own view of its leases, set by the driver before each command it performs
    /// (not part of the state).
    pub worker_clock: WorkerClock,
    /// Set by a driver whose calls take time (the cadence phase) before it performs an upload:
    /// the Run's lease version when the upload's header reached the control plane. The
    /// reference authorizes the fence then, before it takes any content (reference §2.7), so a
    /// renewal applied while the content streams does not fence it. Taken by the upload.
    pub header_lease_version: Option<u64>,
}

/// What the Worker's clocks say of its leases: its wall-clock reading and the offers whose
/// current lease it times on the monotonic clock (from the sending of the call that obtained
/// it). A lease it does not time (read from disk after a restart, or the offer of a retried
/// claim) it judges by its wall clock, so a clock set ahead sees it expired early
/// (`docs/state-machine.md`, "Which clock decides a lease"); `stop-after-durable-lease` allows
/// for that.
#[derive(Clone, Debug, Default)]
pub struct WorkerClock {
    /// The highest wall-clock reading the Worker had in this incarnation (`None` before the
    /// driver set it): a lease it judged expired once stays expired to it.
    pub wall: Option<UnixMillis>,
    /// Offers whose current lease the Worker times on its monotonic clock.
    pub timed: BTreeSet<OfferId>,
    /// When (true time) the Worker issued the command being performed.
    pub sent_at: Option<UnixMillis>,
    /// The Worker's drain budget has ended: it stops every Run still running by identity
    /// (`SupervisionResult::DrainStopped`), whatever its lease.
    pub drain_budget_ended: bool,
}

impl World {
    /// A world whose control plane hands out `templates` in order, one per fresh claim.
    #[must_use]
    pub fn new(seed: u64, templates: Vec<OfferTemplate>) -> Self {
        Self {
            seed,
            draws: 0,
            disk: Disk::default(),
            supervisor: Supervisor::default(),
            plane: ControlPlane::new(templates),
            evidence: Evidence::default(),
            violations: Vec::new(),
            mutation: None,
            aliases: BTreeMap::new(),
            session_id: None,
            worker_clock: WorkerClock::default(),
            header_lease_version: None,
        }
        .with_capacity(64)
    }

    /// The world of most tests: one offer (`o1`: the sample revision, Run `run-1`).
    #[must_use]
    pub fn one_offer(seed: u64) -> Self {
        Self::new(seed, std::vec![OfferTemplate::sample(1)])
    }

    fn with_capacity(mut self, capacity: usize) -> Self {
        self.disk.capacity = capacity;
        self
    }

    pub(crate) fn violation(&mut self, invariant: &'static str, detail: String) {
        self.violations.push(Violation { invariant, detail });
    }

    /// The answers `action` allows under `menu`: [`Answer::Ok`] first.
    #[must_use]
    pub fn options(&self, action: &Action, menu: &Menu) -> Vec<Answer> {
        use Answer as A;
        let mut out = std::vec![A::Ok];
        if menu.crashes {
            out.extend([A::CrashBefore, A::CrashAfter]);
        }
        let store = [A::Unchanged, A::UncertainLanded, A::UncertainLost];
        match action {
            Action::ListInbox { .. } | Action::ReadRecord { .. } | Action::ReadClaim => {
                if menu.read_faults {
                    out.push(A::Unchanged);
                }
            }
            Action::PersistRecord { .. } if menu.record_faults => out.extend(store),
            Action::PersistClaim { .. } | Action::ClearClaim { .. } if menu.claim_faults => {
                out.extend(store);
            }
            Action::PersistRecord { .. }
            | Action::PersistClaim { .. }
            | Action::ClearClaim { .. } => {}
            Action::ReadReceipt { .. } | Action::RemoveReceipt { .. } if menu.receipt_answers => {
                out.push(A::Unchanged);
            }
            Action::ReadReceipt { .. } | Action::RemoveReceipt { .. } => {}
            Action::AllocateLog { .. } | Action::InspectLog { .. } if menu.log_faults => {
                out.push(A::Unavailable);
            }
            Action::AllocateLog { .. } | Action::InspectLog { .. } => {}
            Action::Post(call) => out.extend(self.post_options(call, menu)),
            Action::UploadLog { .. } if menu.upload_answers => out.extend([
                A::AlreadyDone,
                A::Unavailable,
                A::LostAfterCommit,
                A::Fenced,
                A::Invalid,
            ]),
            Action::UploadLog { .. } => {}
            Action::Spawn(_) if menu.spawn_answers => out.extend([
                A::Rejected,
                A::BadHandle,
                A::UnknownSpawned,
                A::UnknownNotSpawned,
            ]),
            Action::Spawn(_) => {}
            Action::Stop { .. } if menu.stop_answers => out.push(A::StopUnknown),
            Action::Stop { .. } => {}
            Action::InspectSupervision { .. } if menu.stop_answers => out.push(A::StopUnknown),
            Action::InspectSupervision { .. } => {}
            Action::ReadPublishedHandle { .. } if menu.stop_answers => out.push(A::StopUnknown),
            Action::ReadPublishedHandle { .. } => {}
            Action::DrawEntropy if menu.entropy_variants => out.push(A::EntropyVariant),
            Action::DrawEntropy => {}
            Action::PersistSession { .. } if menu.record_faults => out.extend(store),
            Action::PersistSession { .. } => {}
        }
        let storage = matches!(
            action,
            Action::ListInbox { .. }
                | Action::ReadRecord { .. }
                | Action::ReadClaim
                | Action::PersistRecord { .. }
                | Action::PersistClaim { .. }
                | Action::ClearClaim { .. }
        );
        if menu.unsafe_storage && storage {
            out.push(A::Unsafe);
        }
        if menu.damaged_answers {
            match action {
                Action::Post(_) | Action::UploadLog { .. } => {
                    out.extend([
                        A::HttpStatus(400),
                        A::HttpStatus(401),
                        A::HttpStatus(409),
                        A::HttpStatus(503),
                        A::HttpStatus(302),
                        A::Truncated,
                    ]);
                    // Not for an offer: a flipped byte in its revision is a control plane that
                    // pins another revision than it delivers, which the Worker rightly refuses
                    // for good (`pull::refused_for_good`, claim cleared) although this plane
                    // delivered the offer. TLS keeps the bytes intact on the way, so only a
                    // plane that answers so every time does that (`OfferTemplate::refused`).
                    if !act::is_post(action, Operation::Offers) {
                        out.push(A::Garbled);
                    }
                }
                Action::PersistRecord { .. } => out.extend([A::StoreConflict, A::StoreFull]),
                Action::PersistClaim { .. } | Action::ClearClaim { .. } => {
                    out.push(A::StoreConflict);
                }
                _ => {}
            }
        }
        if menu.duplicates {
            out.push(A::Duplicated);
        }
        out
    }

    fn post_options(&self, call: &HttpCall, menu: &Menu) -> Vec<Answer> {
        use Answer as A;
        let operation = act::operation(call);
        let faults = [A::Fenced, A::Unavailable, A::Invalid, A::LostAfterCommit];
        let mut out = Vec::new();
        match operation {
            Operation::Starting | Operation::Running | Operation::StartFailure
                if menu.ack_answers =>
            {
                out.extend([A::Applied, A::AlreadyStarting, A::AlreadyRunning]);
                out.push(A::AlreadyTerminal);
                out.extend(faults);
            }
            Operation::Offers if menu.offer_answers => {
                // A replay of a known offer id is answered with its offer or fenced, never
                // `idle` (`plane::offers`): there `idle` would only repeat `Ok`'s successor.
                if !self.plane.names_known_offer(&call.body) {
                    out.push(A::Idle);
                }
                out.push(A::NewerLease);
                out.extend(faults);
            }
            Operation::Secrets if menu.secret_answers => {
                out.extend([
                    A::Fenced,
                    A::Unavailable,
                    A::Invalid,
                    A::Drifted,
                    A::LostAfterCommit,
                ]);
            }
            Operation::Completion if menu.completion_answers => {
                out.extend([A::AlreadyTerminal]);
                out.extend(faults);
            }
            Operation::LeaseControl if menu.lease_answers => {
                out.extend([A::Renewed, A::StopRequested, A::Terminal]);
                out.extend(faults);
            }
            Operation::Register | Operation::Heartbeat | Operation::Transition
                if menu.session_answers =>
            {
                out.extend([A::Unavailable, A::Fenced, A::Invalid, A::LostAfterCommit]);
            }
            Operation::Artifacts
            | Operation::Attestations
            | Operation::Completion
            | Operation::Heartbeat
            | Operation::LeaseControl
            | Operation::Offers
            | Operation::Register
            | Operation::Running
            | Operation::Secrets
            | Operation::StartFailure
            | Operation::Starting
            | Operation::Transition => {}
        }
        out
    }

    /// The events possible now under `menu`: every running process may exit.
    #[must_use]
    pub fn events(&self, menu: &Menu) -> Vec<Event> {
        let mut out = Vec::new();
        if !menu.exits {
            return out;
        }
        for (index, p) in self.supervisor.processes.iter().enumerate() {
            if p.state == ProcessState::Running {
                out.push(Event::Exit {
                    index,
                    code: 0,
                    receipt: ReceiptKind::Genuine,
                });
                if menu.receipt_answers {
                    for receipt in [
                        ReceiptKind::Forged,
                        ReceiptKind::Malformed,
                        ReceiptKind::Missing,
                    ] {
                        out.push(Event::Exit {
                            index,
                            code: 1,
                            receipt,
                        });
                    }
                }
            }
        }
        out
    }

    /// The cost of an event.
    #[must_use]
    pub fn event_cost(event: &Event) -> Cost {
        match event {
            Event::Exit {
                receipt: ReceiptKind::Genuine,
                ..
            } => Cost::Free,
            Event::Exit { .. } => Cost::Fault,
        }
    }

    /// Applies an event.
    pub fn apply_event(&mut self, now: UnixMillis, event: Event) {
        if self.mutation == Some(Mutation::HungProcesses) {
            return;
        }
        match event {
            Event::Exit {
                index,
                code,
                receipt,
            } => self.exit(now, index, code, receipt),
        }
    }

    /// Performs `action` as `answer` says and returns the outcome the Worker hears. Invariants
    /// are checked first; violations are pushed to [`World::violations`].
    ///
    /// # Panics
    /// On [`Answer::CrashBefore`] / [`Answer::CrashAfter`] (the driver handles crashes).
    pub fn perform(&mut self, now: UnixMillis, action: &Action, answer: Answer) -> Outcome {
        assert!(
            !matches!(answer, Answer::CrashBefore | Answer::CrashAfter),
            "crashes are the driver's"
        );
        let lied = self.worker_lie(action);
        let action = lied.as_ref().unwrap_or(action);
        self.check_act(now, action);
        let outcome = self.apply(now, action, answer);
        if let (Some(Mutation::DoubleSpawn), Action::Spawn(_)) = (self.mutation, action) {
            // The lying Worker's spawn reaches the supervisor a second time; its outcome is
            // the driver's to drop.
            self.check_act(now, action);
            let _ = self.apply(now, action, answer);
        }
        outcome
    }

    /// Performs `action` healthily long after the Worker sent it and gave up on its answer (a
    /// call its driver timed out on, which the control plane applies later): the effect only.
    /// The safety checks judged the Worker when it sent the call, not now, so none runs.
    pub fn perform_late(&mut self, now: UnixMillis, action: &Action) -> Outcome {
        self.apply(now, action, Answer::Ok)
    }

    fn apply(&mut self, now: UnixMillis, action: &Action, answer: Answer) -> Outcome {
        match answer {
            // A storage command that met an unsafe file: nothing read, nothing written.
            Answer::Unsafe => return Outcome::Store(StoreFailure::Unsafe),
            Answer::StoreConflict => return Outcome::Store(StoreFailure::Conflict),
            Answer::StoreFull => return Outcome::Store(StoreFailure::CapacityExhausted),
            _ => {}
        }
        let before = self.log_lengths();
        let outcome = match action {
            Action::ListInbox { after, limit } => self.list(after.as_ref(), limit.get(), answer),
            Action::ReadRecord { offer_id } => self.read_record(offer_id, answer),
            Action::PersistRecord { expected, record } => {
                self.persist_record(*expected, record, answer)
            }
            Action::ReadClaim => self.read_claim(answer),
            Action::PersistClaim { expected, claim } => {
                self.persist_claim(*expected, claim, answer)
            }
            Action::ClearClaim { offer_id, revision } => {
                self.clear_claim(offer_id, *revision, answer)
            }
            Action::ReadReceipt { attempt_id } => self.read_receipt(attempt_id, answer),
            Action::RemoveReceipt { attempt_id } => self.remove_receipt(attempt_id, answer),
            Action::AllocateLog { log_artifact_id } => self.allocate_log(log_artifact_id, answer),
            Action::InspectLog { log_artifact_id } => self.inspect_log(log_artifact_id, answer),
            Action::Post(call) => {
                let outcome = self.post(now, act::operation(call), &call.body, answer);
                self.note_slack(now, &call.body, &outcome);
                if let (Outcome::Responded(bytes), Some(offer)) =
                    (&outcome, plane::body_offer(&call.body))
                {
                    for reason in check::answer_causes(bytes) {
                        self.cause(&offer, reason);
                    }
                }
                outcome
            }
            Action::UploadLog { header, .. } => self.upload(header, answer),
            Action::Spawn(plan) => self.spawn(plan, answer),
            Action::Stop { handle } => self.stop(now, handle, answer),
            Action::InspectSupervision { handle, .. } => self.inspect_supervision(handle, answer),
            Action::ReadPublishedHandle { attempt_id } => {
                self.read_published_handle(attempt_id, answer)
            }
            Action::DrawEntropy => Outcome::EntropyDrawn(self.draw(answer)),
            Action::PersistSession { session_id } => self.persist_session(session_id, answer),
        };
        self.check_logs_kept(&before);
        outcome
    }

    /// The command as a lying Worker would have sent it ([`Mutation::StartedAsRecovery`],
    /// [`Mutation::WrongRecoveryReason`], [`Mutation::StoresEveryOffer`],
    /// [`Mutation::DriftedPlan`]), or `None`.
    fn worker_lie(&self, action: &Action) -> Option<Action> {
        use ql_worker_core::record::RecoveryReason as R;
        if let (Some(Mutation::DriftedPlan), Action::Spawn(plan)) = (self.mutation, action) {
            let mut drifted = forged_plan(plan);
            drifted.executor_started_at = plan.executor_started_at.saturating_add(1);
            return Some(Action::Spawn(Box::new(drifted)));
        }
        if let (Some(Mutation::StoresEveryOffer), Action::ClearClaim { offer_id, .. }) =
            (self.mutation, action)
            && self.disk.record(offer_id).is_none()
            && let Some(run) = self.plane.runs.get(offer_id)
        {
            // Its own digest put in place of the pinned one, so the record is well formed.
            let mut offer = run.offer.clone();
            offer.execution_digest = offer.execution_revision.content_digest;
            let at = offer.lease.acquired_at_ms;
            let record = ql_worker_core::record::InboxRecord::accepted(offer, at);
            return Some(Action::PersistRecord {
                expected: None,
                record: Box::new(record),
            });
        }
        let Action::PersistRecord { expected, record } = action else {
            return None;
        };
        let mut record = record.clone();
        match (self.mutation, record.state) {
            (Some(Mutation::StartedAsRecovery), State::Started) => {
                record.state = State::RecoveryRequired;
                record.recovery_reason = Some(R::LaunchOutcomeUnknown);
            }
            (Some(Mutation::WrongRecoveryReason), State::RecoveryRequired) => {
                record.recovery_reason = Some(match record.recovery_reason {
                    Some(R::ControlPlaneAlreadyRunning) => R::ControlPlaneTerminal,
                    _ => R::ControlPlaneAlreadyRunning,
                });
            }
            _ => return None,
        }
        Some(Action::PersistRecord {
            expected: *expected,
            record,
        })
    }

    /// A call that may grant the lease of the offer it names was applied at `now`: if it
    /// granted one after a time in flight, note how long ([`Evidence::lease_slack`]).
    fn note_slack(&mut self, now: UnixMillis, body: &[u8], outcome: &Outcome) {
        let (Outcome::Responded(answer), Some(sent)) = (outcome, self.worker_clock.sent_at) else {
            return;
        };
        let slack = now.saturating_since(sent);
        let body: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        let offer = body.get("offerId").and_then(serde_json::Value::as_str);
        let offer = offer.and_then(|o| OfferId::new(o).ok());
        if let (true, Some(offer), Some(version)) =
            (slack > 0, offer, check::granted_version(answer))
        {
            self.evidence.lease_slack.insert((offer, version), slack);
        }
    }

    fn draw(&mut self, answer: Answer) -> Entropy {
        let mut bytes = [0u8; ENTROPY_BYTES];
        for (half, chunk) in bytes.chunks_mut(32).enumerate() {
            let mut h = Sha256::new();
            h.update(b"ql-worker-sim-entropy");
            h.update(self.seed.to_le_bytes());
            h.update(self.draws.to_le_bytes());
            h.update([u8::from(answer == Answer::EntropyVariant), half as u8]);
            chunk.copy_from_slice(&h.finalize());
        }
        if answer == Answer::EntropyVariant {
            bytes[..8].fill(0xff);
        }
        self.draws += 1;
        let mut window = [0u8; 32];
        window.copy_from_slice(&bytes[..32]);
        self.evidence.windows.push(window);
        Entropy::new(bytes)
    }

    /// The short name of an offer (`o<n>`), or its id.
    #[must_use]
    pub fn alias(&self, offer_id: &OfferId) -> String {
        self.aliases
            .get(offer_id)
            .cloned()
            .unwrap_or_else(|| String::from(offer_id.as_str()))
    }

    /// A one-line summary of `action`, as the scenario tests assert it.
    #[must_use]
    pub fn summary(&self, action: &Action) -> String {
        let kind = act::kind(action);
        match action {
            Action::ListInbox { after, .. } => match after {
                Some(after) => format!("{kind} after {}", self.alias(after)),
                None => String::from(kind),
            },
            Action::ReadRecord { offer_id } => format!("{kind} {}", self.alias(offer_id)),
            Action::PersistRecord { record, .. } => format!(
                "{kind} {} r{} {}",
                self.alias(&record.offer.offer_id),
                record.revision,
                record.state
            ),
            Action::ReadClaim | Action::DrawEntropy | Action::PersistSession { .. } => {
                String::from(kind)
            }
            Action::PersistClaim { claim, .. } => format!("{kind} r{}", claim.revision),
            Action::ClearClaim { revision, .. } => format!("{kind} r{revision}"),
            Action::ReadReceipt { attempt_id }
            | Action::RemoveReceipt { attempt_id }
            | Action::ReadPublishedHandle { attempt_id } => {
                format!("{kind} {attempt_id}")
            }
            Action::AllocateLog { log_artifact_id }
            | Action::InspectLog { log_artifact_id }
            | Action::UploadLog {
                log_artifact_id, ..
            } => format!("{kind} {}", self.log_alias(log_artifact_id)),
            Action::Post(call) => match act::operation(call) {
                Operation::Offers => format!("{kind} offers"),
                operation => match plane::body_offer(&call.body) {
                    Some(id) => format!("{kind} {} {}", operation.as_str(), self.alias(&id)),
                    None => format!("{kind} {}", operation.as_str()),
                },
            },
            Action::Spawn(plan) => format!("{kind} {}", self.alias(&plan.offer_id)),
            Action::Stop { handle } | Action::InspectSupervision { handle, .. } => {
                match self.supervisor.by_handle(handle.as_str()) {
                    Some(p) => format!("{kind} {}", self.alias(&p.offer_id)),
                    None => format!("{kind} {handle}"),
                }
            }
        }
    }

    fn log_alias(&self, log: &ql_worker_core::ids::LogArtifactId) -> String {
        for run in self.plane.runs.values() {
            if run.log_artifact_id() == *log {
                return self.alias(&run.offer.offer_id);
            }
        }
        String::from(log.as_str())
    }

    /// Turns on re-delivery of expired Runs under fresh offer ids ([`ControlPlane::reoffers`]).
    #[must_use]
    pub fn with_reoffers(mut self) -> Self {
        self.plane.reoffers = true;
        self
    }

    /// Writes a canonical rendering of the world (without [`World::violations`]): its state
    /// ([`World::state_fingerprint`]) and its history — the entropy seed and draw counter, the
    /// checkers' evidence (every drawn window, spawn counts, deliveries) — and the mutation.
    pub fn fingerprint(&self, hasher: &mut dyn Hasher) {
        hasher.write_u64(self.seed);
        hasher.write_u32(self.draws);
        self.state_fingerprint(hasher);
        for window in &self.evidence.windows {
            hasher.write(window);
        }
        hash_debug(hasher, &(&self.evidence.spawns, &self.evidence.delivered));
        hash_debug(hasher, &self.evidence.run_spawns);
        hash_debug(hasher, &self.evidence.recovery_causes);
        hash_debug(hasher, &self.mutation);
    }

    /// Writes a canonical rendering of the world's state only: the disk (records, claim,
    /// receipts, logs), the supervisor's process table, the control plane and the stored
    /// Session id. Not the entropy stream's position, not the checkers' evidence.
    pub fn state_fingerprint(&self, hasher: &mut dyn Hasher) {
        self.disk.fingerprint(hasher);
        self.supervisor.fingerprint(hasher);
        self.plane.fingerprint(hasher);
        hash_debug(hasher, &self.session_id);
    }
}

/// Writes `value`'s `Debug` rendering into `hasher`.
pub(crate) fn hash_debug(hasher: &mut dyn Hasher, value: &dyn std::fmt::Debug) {
    struct W<'a>(&'a mut dyn Hasher);
    impl std::fmt::Write for W<'_> {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            self.0.write(s.as_bytes());
            Ok(())
        }
    }
    let _ = std::fmt::write(&mut W(hasher), format_args!("{value:?}"));
    hasher.write_u8(0xfe);
}

/// A copy of `plan` (the capability's bytes copied), for the lying Worker's forged spawns.
fn forged_plan(plan: &ql_worker_core::io::LaunchPlan) -> ql_worker_core::io::LaunchPlan {
    ql_worker_core::io::LaunchPlan {
        offer_id: plan.offer_id.clone(),
        run_id: plan.run_id.clone(),
        attempt_id: plan.attempt_id.clone(),
        executor_started_at: plan.executor_started_at,
        command: plan.command.clone(),
        environment: plan.environment.clone(),
        working_directory: plan.working_directory.clone(),
        timeout: plan.timeout,
        log_artifact_id: plan.log_artifact_id.clone(),
        callback_sequence: plan.callback_sequence,
        capability: ql_worker_core::capability::Capability::from_bytes(*plan.capability.expose()),
    }
}
