//! A Worker wired to a simulated [`World`]: the driver loop of `worker.rs`, with crashes,
//! restarts, forks and fingerprints.
//!
//! The driver alternates as the real one does: after every input it polls until the Worker has
//! [`Sim::window`] commands outstanding (the first kept as [`Sim::pending`], the others in
//! [`Sim::held`]; [`Status::Busy`]) or a local command (storage, spawn, stop, entropy, which the
//! real driver performs on its loop at once, before any other outcome), or is idle, stopped or
//! halted. Control-plane calls (POSTs, uploads) may be outstanding together. [`Sim::answer`] performs the
//! pending command in the world as an [`Answer`] says and feeds the outcome back;
//! [`Sim::choose`] makes another outstanding command the pending one, so that outcomes come back
//! in any order. A crash drops the Worker (memory lost, every outstanding command with it) and
//! builds a new one from the same configuration, while the world (disk, processes, control
//! plane) stays. With a window of 1 (the default) the Worker has one command outstanding at a
//! time.

use ql_worker_core::wire::error::ErrorCode;
use std::hash::Hasher;

use crate::testkit::act;
use crate::testkit::world::check::{self, License};
use crate::testkit::world::{Answer, Event, WorkerClock, World, hash_debug};
use ql_worker_core::io::{Action, Input, OpId, Outcome};
use ql_worker_core::record::State;
use ql_worker_core::retention::SweepKey;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::route::Operation;
use ql_worker_core::worker::{HaltReason, Output, StopReason, Worker, WorkerConfig};

/// What the Worker is doing, as the driver sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Status {
    /// A command is outstanding ([`Sim::pending`]).
    Busy,
    /// Idle until `wake_at`.
    Idle(Option<UnixMillis>),
    /// Stopped on purpose.
    Stopped(StopReason),
    /// Halted; only a restart helps.
    Halted(HaltReason),
}

/// Which commands a scripted answer applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum On {
    /// A POST to this operation.
    Post(Operation),
    /// A record write proposing this state.
    Persist(State),
    /// Any command of this kind ([`act::kind`]).
    Kind(&'static str),
}

impl On {
    /// Whether `action` is such a command.
    #[must_use]
    pub fn matches(&self, action: &Action) -> bool {
        match (self, action) {
            (Self::Post(op), Action::Post(call)) => act::operation(call) == *op,
            (Self::Persist(state), Action::PersistRecord { record, .. }) => record.state == *state,
            (Self::Kind(kind), action) => act::kind(action) == *kind,
            (Self::Post(_) | Self::Persist(_), _) => false,
        }
    }
}

/// A Worker, its world, and the driver between them.
#[derive(Debug)]
pub struct Sim {
    /// The simulated host.
    pub world: World,
    /// The Worker (rebuilt on every crash).
    pub worker: Worker,
    /// The Worker's configuration (kept across crashes).
    pub config: WorkerConfig,
    /// The true time (the control plane's clock).
    pub now: UnixMillis,
    /// How far the host's wall clock is off the true time (see [`crate::clock`]): the Worker
    /// reads `now + wall_skew` on its wall clock; its monotonic clock never sees it.
    pub wall_skew: i64,
    /// The outstanding command answered next.
    pub pending: Option<(OpId, Action)>,
    /// The other outstanding commands, in the order they were issued.
    pub held: Vec<(OpId, Action)>,
    /// How many commands the driver lets be outstanding at once (at least 1).
    pub window: usize,
    /// With calls outstanding, the Worker has nothing else to do until this wake-up (`Some`
    /// only then): the driver ticks meanwhile, as the real one does while calls are in flight.
    pub waiting: Option<Option<UnixMillis>>,
    /// What the Worker is doing.
    pub status: Status,
    /// Crashes and restarts so far.
    pub restarts: u32,
    /// When (true time, which is the monotonic clock's too) this incarnation of the Worker took
    /// a drain request: its drain budget is timed from there.
    pub drain_asked: Option<UnixMillis>,
    /// The driver's retention (issue 14): after every outcome and before a tick of an idle
    /// Worker, when the driver's rule says the inbox's own sweep is due (`retention::due`), the
    /// records the core's retention plan names are removed and each removal is reported
    /// ([`Sim::retain`]).
    pub retention: bool,
    /// The records retention removed, as they were (for the outcome counts).
    pub retained: Vec<ql_worker_core::record::InboxRecord>,
    /// What the last sweep of this incarnation saw, as the driver keeps it
    /// (`retention::due`), with `released` 0: the releases since then count as one (`released`
    /// 1 in the key), so the key stays finite for the model's fingerprints.
    pub last_swept: Option<SweepKey>,
    /// Whether a receipt was removed or a claim cleared since the last sweep.
    pub released: bool,
    /// While an answer is being delivered (or a tick fed): what it licenses should the Worker
    /// halt on it (`halt-licensed`); `None` otherwise (a hand-made outcome is not checked).
    halt_license: Option<License>,
    /// When recording: one line per command (its summary) and per driver event.
    pub trail: Option<Vec<String>>,
    /// When recording: every command, in order (see [`act::canonical`]).
    pub stream: Option<Vec<Action>>,
    script: Vec<(On, Answer)>,
    /// When (true time) each outstanding command was issued.
    sent: std::collections::BTreeMap<OpId, UnixMillis>,
    /// The highest wall-clock reading this incarnation of the Worker had when it performed a
    /// command: a lease it judged expired by its wall clock then stays expired to it after the
    /// clock steps back (it never trusts a lease again once it judged it lost), so the lease
    /// checks judge by the highest reading ([`WorkerClock::wall`]).
    pub wall_high: Option<UnixMillis>,
    /// Whether this incarnation of the Worker listed the whole inbox (an inbox page answered
    /// with no next cursor): startup reconciliation is done, and a Pull may begin
    /// (`reconcile-first`).
    pub reconciled: bool,
    /// The response body the world gave the last command [`Sim::answer`] performed, if it
    /// responded (not part of the state; the cadence phase reads what the control plane applied
    /// from it).
    pub last_response: Option<Vec<u8>>,
}

impl Sim {
    /// A fresh Worker at `now` (inert until the first tick).
    #[must_use]
    pub fn new(config: WorkerConfig, world: World, now: UnixMillis) -> Self {
        Self {
            worker: Worker::new(config.clone(), crate::clock::reading(now, 0)),
            world,
            config,
            now,
            wall_skew: 0,
            pending: None,
            held: Vec::new(),
            window: 1,
            waiting: None,
            status: Status::Idle(Some(now)),
            restarts: 0,
            drain_asked: None,
            retention: false,
            retained: Vec::new(),
            last_swept: None,
            released: false,
            halt_license: None,
            trail: None,
            stream: None,
            script: Vec::new(),
            sent: std::collections::BTreeMap::new(),
            last_response: None,
            reconciled: false,
            wall_high: None,
        }
    }

    /// The scenario tests' simulation: the model configuration (edge profile, one concurrent
    /// Run), `world`, the clock at 1 000 ms, recording.
    #[must_use]
    pub fn scenario(world: World) -> Self {
        let start = UnixMillis::new(1_000).unwrap_or(UnixMillis::ZERO);
        Self::new(crate::testkit::explore::model_config(), world, start).recording()
    }

    /// A scenario Worker holding o1 in `state` with its process running, registered and
    /// reconciled; the trail emptied (the lease-control and uncertain-outcome scenarios).
    #[must_use]
    pub fn holding(state: State) -> Self {
        let mut world = World::new(1, Vec::new());
        world.seed(1, crate::testkit::record(1, state), true);
        let mut sim = Self::scenario(world);
        sim.run(2);
        sim.take_trail();
        sim
    }

    /// The stored record of the control plane's first Run.
    ///
    /// # Panics
    /// If the plane has no Run or the disk no record of it.
    #[must_use]
    pub fn first_record(&self) -> ql_worker_core::record::InboxRecord {
        let id = self
            .world
            .plane
            .runs
            .keys()
            .next()
            .expect("a Run at the plane");
        self.world.disk.record(id).expect("its record").clone()
    }

    /// Records the trail and the canonical command stream from now on.
    #[must_use]
    pub fn recording(mut self) -> Self {
        self.trail = Some(Vec::new());
        self.stream = Some(Vec::new());
        self
    }

    /// A copy of this simulation (the Worker forked), without trail, stream or script.
    #[must_use]
    pub fn fork(&self) -> Self {
        Self {
            world: self.world.clone(),
            worker: self.worker.fork(),
            config: self.config.clone(),
            now: self.now,
            wall_skew: self.wall_skew,
            pending: self.pending.clone(),
            held: self.held.clone(),
            window: self.window,
            waiting: self.waiting,
            status: self.status.clone(),
            restarts: self.restarts,
            drain_asked: self.drain_asked,
            retention: self.retention,
            retained: self.retained.clone(),
            last_swept: self.last_swept,
            released: self.released,
            halt_license: None,
            trail: None,
            stream: None,
            script: Vec::new(),
            sent: self.sent.clone(),
            last_response: None,
            reconciled: self.reconciled,
            wall_high: self.wall_high,
        }
    }

    /// Writes a canonical rendering of the whole simulation state: world, Worker, outstanding
    /// commands and when they were issued, status and clock (not the trail, the restart count
    /// or the violations).
    pub fn fingerprint(&self, hasher: &mut dyn Hasher) {
        self.world.fingerprint(hasher);
        self.worker.fingerprint(hasher);
        self.hash_outstanding(hasher);
        let sent: Vec<&UnixMillis> = self.sent.values().collect();
        let drain = self.drain_asked;
        hash_debug(hasher, &(&self.status, self.waiting, self.now, sent, drain));
        hasher.write_u8(u8::from(self.reconciled));
        hash_debug(hasher, &self.wall_high);
        hash_debug(hasher, &(self.last_swept, self.released));
    }

    /// Writes a canonical rendering of the system state only: the world's state
    /// ([`World::state_fingerprint`]), the Worker's memory without its clock reading
    /// ([`Worker::state_fingerprint`]), the outstanding command and the status. Not the clock,
    /// the entropy stream's position or the checkers' evidence (the model check counts distinct
    /// states with it).
    pub fn state_fingerprint(&self, hasher: &mut dyn Hasher) {
        self.world.state_fingerprint(hasher);
        self.worker.state_fingerprint(hasher);
        self.hash_outstanding(hasher);
        hash_debug(hasher, &(&self.status, self.waiting.is_some()));
        hash_debug(hasher, &(self.last_swept, self.released));
    }

    /// Every outstanding command, canonical and in issue order: which one is answered next is
    /// the explorer's choice, not a state.
    fn hash_outstanding(&self, hasher: &mut dyn Hasher) {
        let mut outstanding: Vec<&(OpId, Action)> = self.pending.iter().chain(&self.held).collect();
        outstanding.sort_by_key(|(id, _)| *id);
        hasher.write_usize(outstanding.len());
        for (_, action) in outstanding {
            hasher.write(&act::canonical(action));
        }
    }

    /// The outstanding commands: the pending one first, then the held ones.
    pub fn outstanding(&self) -> impl Iterator<Item = &Action> {
        self.pending
            .iter()
            .chain(&self.held)
            .map(|(_, action)| action)
    }

    /// Makes the outstanding command at `index` ([`Sim::outstanding`]'s order) the pending one;
    /// the one it replaces is held again, in issue order.
    pub fn choose(&mut self, index: usize) {
        if index == 0 || index > self.held.len() {
            return;
        }
        let chosen = self.held.remove(index - 1);
        if let Some(previous) = self.pending.replace(chosen) {
            let at = self.held.partition_point(|(id, _)| *id < previous.0);
            self.held.insert(at, previous);
        }
    }

    /// Takes the pending command; the first held one becomes pending.
    fn take_pending(&mut self) -> Option<(OpId, Action)> {
        let taken = self.pending.take();
        if !self.held.is_empty() {
            self.pending = Some(self.held.remove(0));
        }
        taken
    }

    /// Adds `line` to the trail, when recording.
    pub(crate) fn note(&mut self, line: String) {
        if let Some(trail) = &mut self.trail {
            trail.push(line);
        }
    }

    /// Polls until the Worker has [`Sim::window`] commands outstanding or a local one, is idle
    /// (with or without calls outstanding), stopped or halted.
    pub fn poll(&mut self) {
        self.waiting = None;
        loop {
            let outstanding = usize::from(self.pending.is_some()) + self.held.len();
            if outstanding >= self.window.max(1) {
                self.status = Status::Busy;
                return;
            }
            let output = self.worker.poll_output();
            self.status = match output {
                Output::Command(command) => {
                    let call = act::is_call(&command.action);
                    self.issued(command.id, command.action);
                    if call {
                        continue;
                    }
                    // The driver performs a local command (storage, spawn, stop, entropy) on its
                    // loop at once: it is answered before anything else happens.
                    Status::Busy
                }
                Output::Idle { wake_at } if outstanding > 0 => {
                    self.waiting = Some(wake_at.map(crate::clock::true_time));
                    Status::Busy
                }
                Output::Idle { wake_at } => Status::Idle(wake_at.map(crate::clock::true_time)),
                Output::Stopped(reason) => {
                    self.abandon();
                    Status::Stopped(reason)
                }
                Output::Halted(reason) => {
                    // A conflict the store did not report on purpose means the Worker's own
                    // revision sequence broke.
                    let injected = self.halt_license.is_some_and(|l| l.conflict);
                    if matches!(reason, HaltReason::StoreConflict) && !injected {
                        self.world
                            .violation("worker-error", format!("the Worker halted: {reason}"));
                    } else if self.halt_license.is_some_and(|l| !l.allows(&reason)) {
                        self.world.violation(
                            "halt-licensed",
                            format!(
                                "the Worker halted ({reason}) on an answer that allows no such halt"
                            ),
                        );
                    }
                    self.note(format!("halted: {reason}"));
                    self.abandon();
                    Status::Halted(reason)
                }
            };
            return;
        }
    }

    /// A command the Worker issued: checked, recorded, and outstanding.
    fn issued(&mut self, id: OpId, action: Action) {
        if matches!(action, Action::ReadClaim)
            && self.worker.phase() == ql_worker_core::worker::Phase::Draining
        {
            self.world.violation(
                "drain-no-pull",
                String::from("a Pull starts while draining"),
            );
        }
        if matches!(action, Action::ReadClaim) && !self.reconciled {
            self.world.violation(
                "reconcile-first",
                String::from("a Pull starts before startup reconciliation listed the whole inbox"),
            );
        }
        // A launch (its starting ACK, its spawn) never begins once a drain was asked of this
        // incarnation, nor while it is fail-closed.
        let launch =
            matches!(action, Action::Spawn(_)) || act::is_post(&action, Operation::Starting);
        if launch && self.drain_asked.is_some() {
            self.world.violation(
                "drain-no-launch",
                format!("{} after the drain was requested", act::kind(&action)),
            );
        }
        if launch && let Some(latch) = self.worker.fail_closed() {
            self.world.violation(
                "fail-closed-no-launch",
                format!("{} while fail-closed ({latch:?})", act::kind(&action)),
            );
        }
        // A claim write comes before every `offers` request (a Pull that only settles a claim
        // whose offer is stored, while the inbox is full, reads and clears it and writes none).
        if matches!(action, Action::PersistClaim { .. })
            && !check::pull_with_room(self.world.disk.records.len(), self.config.capacity.get())
        {
            self.world.violation(
                "pull-with-room",
                format!(
                    "a Pull with {} records in an inbox of {}",
                    self.world.disk.records.len(),
                    self.config.capacity.get()
                ),
            );
        }
        let summary = self.trail.is_some().then(|| self.world.summary(&action));
        if let Some(line) = summary {
            self.note(line);
        }
        if let Some(stream) = &mut self.stream {
            stream.push(action.clone());
        }
        self.sent.insert(id, self.now);
        if self.pending.is_none() {
            self.pending = Some((id, action));
        } else {
            self.held.push((id, action));
        }
    }

    /// The Worker stopped or halted: commands still outstanding are abandoned (never performed),
    /// as a driver abandons calls in flight.
    fn abandon(&mut self) {
        self.pending = None;
        self.held.clear();
        self.sent.clear();
    }

    /// Answers the outstanding command.
    ///
    /// # Panics
    /// When no command is outstanding.
    pub fn answer(&mut self, answer: Answer) {
        // INVARIANT: callers answer only a Busy simulation.
        let (id, action) = self.take_pending().expect("a command is outstanding");
        match answer {
            Answer::CrashBefore => self.crash(),
            Answer::CrashAfter => {
                self.world.worker_clock = self.worker_clock(id);
                let _ = self.world.perform(self.now, &action, Answer::Ok);
                self.crash();
            }
            answer => {
                // A fault may leave the Worker unsure whether a launch started; a healthy
                // answer, delivered once or twice, does not.
                if !matches!(answer, Answer::Ok | Answer::Duplicated) {
                    self.world.launch_uncertain();
                }
                self.world.worker_clock = self.worker_clock(id);
                let duplicated = answer == Answer::Duplicated;
                let answer = if duplicated { Answer::Ok } else { answer };
                // A second outcome of the same kind, from a copy of the world (no side effect).
                let again =
                    duplicated.then(|| self.world.clone().perform(self.now, &action, answer));
                let outcome = self.world.perform(self.now, &action, answer);
                if act::is_post(&action, Operation::Offers) && offer_fenced(&outcome) {
                    self.world.plane.fenced_replays += 1;
                }
                self.reconciled |= matches!(
                    (&action, &outcome),
                    (
                        Action::ListInbox { .. },
                        Outcome::InboxListed {
                            next_after: None,
                            ..
                        }
                    )
                );
                // Tracked only with retention on, so it is no state of the other models.
                self.released |= self.retention && releases(&action, &outcome);
                self.halt_license = Some(check::halt_license(&action, answer, &outcome));
                self.last_response = match &outcome {
                    Outcome::Responded(bytes) => Some(bytes.to_vec()),
                    _ => None,
                };
                if let Err(e) = self
                    .worker
                    .handle(self.clock(), Input::Outcome { id, outcome })
                {
                    self.world.violation(
                        "worker-error",
                        format!("the Worker refused an outcome: {e}"),
                    );
                }
                self.housekeep();
                self.poll();
                self.halt_license = None;
                if let Some(again) = again {
                    self.deliver_again(id, again);
                }
            }
        }
    }

    /// Feeds `outcome` for the outstanding command without asking the world (a hand-made
    /// answer the world does not produce, e.g. a drifted offer).
    ///
    /// # Panics
    /// When no command is outstanding.
    pub fn deliver(&mut self, outcome: Outcome) {
        // INVARIANT: callers deliver only to a Busy simulation.
        let (id, _) = self.take_pending().expect("a command is outstanding");
        if let Err(e) = self
            .worker
            .handle(self.clock(), Input::Outcome { id, outcome })
        {
            self.world.violation(
                "worker-error",
                format!("the Worker refused an outcome: {e}"),
            );
        }
        self.poll();
    }

    /// `duplicate-refused`: a second outcome for the answered command `id` is refused, and the
    /// Worker's state is what it was.
    fn deliver_again(&mut self, id: OpId, outcome: Outcome) {
        let state = |worker: &Worker| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            worker.state_fingerprint(&mut h);
            h.finish()
        };
        let before = state(&self.worker);
        self.note(format!("  duplicate delivery of {id:?}"));
        let accepted = (self.worker)
            .handle(self.clock(), Input::Outcome { id, outcome })
            .is_ok();
        if accepted || state(&self.worker) != before {
            self.world.violation(
                "duplicate-refused",
                format!("a second outcome for {id:?} was accepted or changed the Worker"),
            );
        }
    }

    /// The driver's housekeeping, after every outcome and before a tick of an idle Worker:
    /// with retention on, the inbox's own sweep when `retention::due` says so.
    fn housekeep(&mut self) {
        if self.retention && self.sweep_due() {
            self.retain();
            self.released = false;
            self.last_swept = Some(self.sweep_key());
        }
    }

    /// What the driver's inbox sweep is decided on (`retention::due`; no periodic sweep here,
    /// so the inbox's own sweep alone must free every place that can be freed).
    fn sweep_key(&self) -> SweepKey {
        let inbox = self.worker.inbox_status();
        SweepKey {
            records: inbox.records,
            settled: inbox.settled,
            released: u64::from(self.released),
        }
    }

    fn sweep_due(&self) -> bool {
        let policy = self.retention_policy();
        ql_worker_core::retention::due(self.sweep_key(), self.last_swept, false, &policy)
    }

    /// The driver's retention policy here: high-water mark half the inbox capacity, no age
    /// limit, logs kept.
    fn retention_policy(&self) -> ql_worker_core::retention::RetentionPolicy {
        ql_worker_core::retention::RetentionPolicy {
            high_water_records: self.config.capacity.get() / 2,
            max_settled_age_ms: None,
            log_keep_ms: u64::MAX,
        }
    }

    /// The driver's retention sweep: the core's plan (`retention::plan`, high-water mark half
    /// the inbox capacity, no age limit, logs kept) over the durable records, receipts and
    /// claim; each removal is made and reported to the Worker. `retention-removes-only-unneeded`:
    /// a removed record is settled, has no receipt on disk and no pending claim names it
    /// (checked here, independently of the plan).
    pub fn retain(&mut self) {
        use ql_worker_core::retention::{RecordFacts, plan};
        let disk = &self.world.disk;
        let claimed = disk.claim.as_ref().map(|(c, _)| c.offer_id.clone());
        let facts: Vec<RecordFacts> = (disk.records.values())
            .map(|(r, _)| {
                let receipt = disk.receipts.contains_key(&r.offer.candidate.attempt_id);
                let claim = claimed.as_ref() == Some(&r.offer.offer_id);
                RecordFacts::of(r, receipt, claim)
            })
            .collect();
        let removals = plan(&facts, None, None, self.now, &self.retention_policy()).records;
        for (offer_id, _) in removals {
            let Some(record) = self.world.disk.record(&offer_id).cloned() else {
                continue;
            };
            let disk = &self.world.disk;
            let receipt = disk
                .receipts
                .contains_key(&record.offer.candidate.attempt_id);
            let claim = disk
                .claim
                .as_ref()
                .is_some_and(|(c, _)| c.offer_id == offer_id);
            if !record.state.is_terminal() || receipt || claim {
                self.world.violation(
                    "retention-removes-only-unneeded",
                    format!("{offer_id} ({}) removed", record.state),
                );
            }
            if self.world.mutation != Some(crate::testkit::world::Mutation::RemovalNotDone) {
                self.world.disk.records.remove(&offer_id);
            }
            self.note(format!("retention removed {}", self.world.alias(&offer_id)));
            self.retained.push(record);
            let removed = Input::RecordRemoved { offer_id };
            if let Err(e) = self.worker.handle(self.clock(), removed) {
                self.world.violation(
                    "worker-error",
                    format!("the Worker refused a removal report: {e}"),
                );
            }
        }
    }

    /// Panics with the violations, if any invariant was broken so far.
    ///
    /// # Panics
    /// When [`World::violations`] is not empty.
    pub fn assert_no_violations(&self) {
        assert!(
            self.world.violations.is_empty(),
            "{:?}",
            self.world.violations
        );
    }

    /// The outstanding command, if any.
    #[must_use]
    pub fn act(&self) -> Option<&Action> {
        self.pending.as_ref().map(|(_, action)| action)
    }

    /// The pending command's id and canonical bytes ([`act::canonical`]), to compare the
    /// pending command across steps.
    #[must_use]
    pub fn pending_canonical(&self) -> Option<(OpId, Vec<u8>)> {
        let pending = self.pending.as_ref();
        pending.map(|(id, action)| (*id, act::canonical(action)))
    }

    /// What the Worker's clocks say of its leases now, and when it issued command `id` (see
    /// [`WorkerClock`]).
    fn worker_clock(&mut self, id: OpId) -> WorkerClock {
        let wall = self.worker.clock_reading().wall;
        let wall = self.wall_high.map_or(wall, |high| high.max(wall));
        self.wall_high = Some(wall);
        let offers = self.world.disk.records.keys();
        WorkerClock {
            wall: Some(wall),
            timed: offers
                .filter(|o| self.worker.times_lease(o))
                .cloned()
                .collect(),
            sent_at: self.sent.remove(&id),
            drain_budget_ended: self
                .drain_asked
                .is_some_and(|at| self.now.saturating_since(at) >= self.config.drain_budget_ms),
        }
    }

    /// Drops the Worker (memory lost) and starts a new one at `now` from the durable world.
    pub fn crash(&mut self) {
        self.note(String::from("crash"));
        self.world.launch_uncertain();
        let mut config = self.config.clone();
        if let Some(session_id) = &self.world.session_id {
            config.session_id = session_id.clone();
        }
        self.worker = Worker::new(config, self.clock());
        self.drain_asked = None;
        self.reconciled = false;
        self.wall_high = None;
        self.last_swept = None;
        self.released = false;
        self.abandon();
        self.waiting = None;
        self.status = Status::Idle(Some(self.now));
        self.restarts += 1;
    }

    /// The Worker's two clock readings now.
    #[must_use]
    pub fn clock(&self) -> ql_worker_core::time::Now {
        crate::clock::reading(self.now, self.wall_skew)
    }

    /// Steps the host's wall clock by `ms` (either way); the true time and the monotonic
    /// clock do not move.
    pub fn step_wall_clock(&mut self, ms: i64) {
        self.note(format!("wall clock stepped {ms:+} ms"));
        self.wall_skew = self.wall_skew.saturating_add(ms);
    }

    /// Moves the clock to `at` (never backwards).
    pub fn advance_to(&mut self, at: UnixMillis) {
        self.now = self.now.max(at);
    }

    /// Feeds a tick at the current time.
    pub fn tick(&mut self) {
        if matches!(self.status, Status::Idle(_)) {
            self.housekeep();
        }
        if matches!(self.status, Status::Idle(_)) || self.waiting.is_some() {
            self.note(format!("tick {}", self.now));
            if self.worker.handle(self.clock(), Input::Tick).is_ok() {
                self.halt_license = Some(License::default());
                self.poll();
                self.halt_license = None;
            }
        }
    }

    /// Feeds a drain request.
    pub fn request_drain(&mut self) {
        if matches!(self.status, Status::Idle(_)) {
            self.note(String::from("drain requested"));
            if self
                .worker
                .handle(self.clock(), Input::DrainRequested)
                .is_ok()
            {
                self.drain_asked.get_or_insert(self.now);
                self.poll();
            }
        }
    }

    /// Feeds a driver notification (a supervisor exited, retention removed a record) while the
    /// Worker is idle (with or without calls outstanding), then polls.
    pub fn notify(&mut self, input: Input) {
        if matches!(self.status, Status::Idle(_)) || self.waiting.is_some() {
            self.note(format!("{input:?}"));
            if let Err(e) = self.worker.handle(self.clock(), input) {
                self.world
                    .violation("worker-error", format!("the Worker refused an input: {e}"));
            }
            self.poll();
        }
    }

    /// Applies a world event (a process exit; the supervisor's timestamps come from the
    /// host's wall clock).
    pub fn event(&mut self, event: Event) {
        self.note(format!("{event:?}"));
        let wall = crate::clock::wall(self.now, self.wall_skew);
        self.world.apply_event(wall, event);
    }

    /// Scripts the answer for the next command `on` matches (answers are used in order).
    pub fn on(&mut self, on: On, answer: Answer) {
        self.script.push((on, answer));
    }

    fn scripted(&mut self, action: &Action) -> Answer {
        match self.script.iter().position(|(on, _)| on.matches(action)) {
            Some(index) => self.script.remove(index).1,
            None => Answer::Ok,
        }
    }

    /// Answers commands (scripted answers first, else [`Answer::Ok`]) until the Worker is idle,
    /// stopped or halted.
    ///
    /// # Panics
    /// After 10 000 commands without settling (a livelock).
    pub fn settle(&mut self) {
        for _ in 0..10_000 {
            let Some((_, action)) = &self.pending else {
                return;
            };
            let action = action.clone();
            let answer = self.scripted(&action);
            self.answer(answer);
        }
        panic!("the Worker did not settle within 10 000 commands");
    }

    /// Answers every command healthily ([`Answer::Ok`], no script), ticking at the Worker's
    /// wake-up whenever it is idle, until the pending command is one `matches` accepts.
    ///
    /// # Panics
    /// When no such command is pending within 500 steps.
    pub fn answer_until(&mut self, matches: impl Fn(&Action) -> bool) {
        for _ in 0..500 {
            match self.act() {
                Some(action) if matches(action) => return,
                Some(_) => self.answer(Answer::Ok),
                None => {
                    if let Status::Idle(Some(wake)) = self.status {
                        self.advance_to(wake);
                    }
                    self.tick();
                }
            }
        }
        panic!("never outstanding: {:#?}", self.commands());
    }

    /// Ticks at the Worker's wake-up time (or now) and settles; `rounds` times.
    pub fn run(&mut self, rounds: usize) {
        for _ in 0..rounds {
            if let Status::Idle(Some(wake)) = self.status {
                self.advance_to(wake);
            }
            self.tick();
            self.settle();
        }
    }

    /// The trail recorded so far, without tick lines.
    #[must_use]
    pub fn commands(&self) -> Vec<String> {
        self.trail
            .iter()
            .flatten()
            .filter(|l| !l.starts_with("tick "))
            .cloned()
            .collect()
    }

    /// Drains the trail.
    pub fn take_trail(&mut self) -> Vec<String> {
        self.trail.as_mut().map(std::mem::take).unwrap_or_default()
    }
}

/// Whether `action`, answered `outcome`, removed a receipt or cleared the claim: either may let
/// retention remove a settled record without changing the inbox's counts.
pub(crate) fn releases(action: &Action, outcome: &Outcome) -> bool {
    matches!(
        (action, outcome),
        (Action::ClearClaim { .. }, Outcome::Persisted)
            | (
                Action::RemoveReceipt { .. },
                Outcome::ReceiptRemoved { existed: true }
            )
    )
}

/// Whether `outcome` is the control plane's replay fence of an `offers` call (409
/// `worker_offer_fenced`).
fn offer_fenced(outcome: &Outcome) -> bool {
    matches!(
        outcome,
        Outcome::Http(ql_worker_core::io::HttpFailure::Status { status: 409, code: Some(c) })
            if c == ErrorCode::WorkerOfferFenced.as_str()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::world::World;

    /// `duplicate-refused` can fail: an outcome the Worker takes (here for the command still
    /// outstanding, as a driver that mixed up its ids would deliver it) is reported; the second
    /// delivery of an answered command is not.
    #[test]
    fn a_second_delivery_the_worker_takes_is_reported() {
        let mut sim = Sim::scenario(World::one_offer(1));
        sim.tick();
        let (id, action) = sim.pending.clone().expect("the first command");
        let outcome = sim.world.clone().perform(sim.now, &action, Answer::Ok);
        sim.deliver_again(id, outcome);
        assert_eq!(
            sim.world.violations.first().map(|v| v.invariant),
            Some("duplicate-refused")
        );

        let mut sim = Sim::scenario(World::one_offer(1));
        sim.tick();
        sim.answer(Answer::Duplicated);
        assert!(
            sim.world.violations.is_empty(),
            "{:?}",
            sim.world.violations
        );
        assert!(
            sim.take_trail()
                .iter()
                .any(|l| l.contains("duplicate delivery")),
            "the second delivery happened"
        );
    }
}
