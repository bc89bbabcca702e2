//! Machine targets: the real [`Worker`] driven by a fuzzed op sequence through the fuzz
//! [`Host`], with the safety invariants checked on every command and after every step.
//!
//! The op sequence is read from the fuzz bytes as the run goes:
//! * a **setup** (configuration profile, pages, concurrency; scenario-specific durable state);
//! * then, each step, one byte deciding what happens next: for an emitted command, how the host
//!   answers it (valid, a fault of that command's kind, a crash before performing it, or a
//!   crash after performing it); when the Worker is idle, a tick, a time jump, a drain request,
//!   a crash, or a user process ending.
//!
//! Zero is always the cooperative choice, and the input reads as zeros past its end: after the
//! fuzzed part, the run continues for [`HEAL_STEPS`] healthy steps, so the empty input is the
//! happy path and every input ends in a quiet stretch that lets pending work surface.
//!
//! A crash rebuilds the Worker from nothing but the host's durable state. A halt or a stop is
//! checked (only for a cause the host produced) and followed by a restart.

use ql_worker_core::ids::OfferId;
use ql_worker_core::io::{Command, Input, Outcome};
use ql_worker_core::listing::PageLimit;
use ql_worker_core::record::{InboxRecord, RecoveryReason, State};
use ql_worker_core::revision::Architecture;
use ql_worker_core::time::{MonoMillis, UnixMillis};
use ql_worker_core::wire::session::Capabilities;
use ql_worker_core::worker::{HaltReason, Output, StopReason, Worker, WorkerConfig};

use super::bytes::Bytes;
use super::host::{Host, Mode, Process};
use super::plane::{OfferPolicy, Plane};
use super::samples;
use crate::testkit::world::check::{License, SpawnFate};

/// Steps per run, at most.
pub const MAX_STEPS: u32 = 4_000;
/// Healthy steps after the input is used up.
pub const HEAL_STEPS: u32 = 150;
/// Restarts (crashes, halts, stops) per run, at most.
pub const MAX_RESTARTS: u32 = 48;
/// Steps of the simulation's liveness phase, at most ([`Sim::settle`]).
pub const LIVE_STEPS: u32 = 4_000;

/// What only the whole-Worker simulation (`tests/tests/simulation.rs`) turns on: two fault
/// classes that read extra bytes (so the fuzz targets, all off, keep the meaning of their
/// corpora) and the control plane's Run timeout in the liveness phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimOptions {
    /// A control-plane call (JSON or upload) may be delayed in flight: the request before the
    /// plane sees it, or the response after the plane committed it (one byte per call).
    pub delays: bool,
    /// An answered command's outcome may be delivered a second time (a duplicate or stale
    /// delivery); the Worker must refuse it (one byte per answered command).
    pub duplicates: bool,
    /// In the second half of the liveness phase, the control plane ends (`terminal` on lease
    /// control) every Run that has no receipt on disk: the control plane's own Run timeout,
    /// which is what ends a Run whose supervisor died (`docs/simulation.md`, finding F1).
    pub plane_timeout: bool,
    /// A small inbox (capacity: the preloaded records plus one or two) and the driver's
    /// retention: after every outcome and at every idle step, when the driver's rule says a
    /// sweep is due (`retention::due`), the host removes what the core's retention plan says
    /// (`retention::plan`, high-water mark half the capacity) and reports each removal
    /// (issue 14: the inbox fills, no offer is stranded, work resumes once places are freed).
    pub small_inbox: bool,
    /// The liveness phase begins with an unclean drain: a drain request, then a crash as soon
    /// as the control plane holds the Session draining. The restarted Worker must settle
    /// everything and take new work again through a new Session (issue 14).
    pub unclean_drain: bool,
    /// The control plane may answer a fresh claim with an existing Run whose lease expired
    /// before any activation call reached it: the same Run and Attempt under the new offer id,
    /// as a control plane re-delivers an unstarted Attempt (`docs/simulation.md`).
    pub reoffers: bool,
    /// Control-plane calls (JSON and uploads) may stay in flight while the Worker goes on, as
    /// on the driver's call threads (issue 16): up to [`MAX_IN_FLIGHT`] at once, answered in an
    /// order the bytes choose, with other commands, ticks and time between. One byte per call
    /// and one per step while calls are in flight.
    pub concurrent: bool,
    /// This host's wall clock steps while the Worker runs (issue 16, item 5): back an hour,
    /// forward an hour, or (chosen at setup) it starts near 1970 and jumps to the true time
    /// when "NTP syncs". The control plane keeps the true time; the Worker's monotonic clock
    /// never steps. One byte at setup, and idle steps may step the clock.
    pub clock_steps: bool,
}

/// Calls in flight at once, at most, with [`SimOptions::concurrent`].
pub const MAX_IN_FLIGHT: usize = 4;

/// Which part of the Worker a target focuses on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scenario {
    /// Pull and the Processor: every Pull is offered a Run.
    StartPath,
    /// Records already launched or started, with receipts present or absent: completion, lease
    /// control, stops. Pulls are answered idle.
    FinishPath,
    /// Register, heartbeat, drain and fail-closed, over records in any state.
    Lifecycle,
}

/// What a run did (for the corpus test and for minimising seeds).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// Steps taken.
    pub steps: u32,
    /// Commands answered or dropped.
    pub commands: u32,
    /// Offers that got a spawn.
    pub spawns: u32,
    /// Records `completion_acknowledged` at the end.
    pub completed: u32,
    /// Records `start_failure_acknowledged` at the end.
    pub start_failed: u32,
    /// Records `recovery_required` at the end.
    pub recovery: u32,
    /// Crashes and restarts.
    pub restarts: u32,
    /// Halts (each licensed by a host fault).
    pub halts: u32,
    /// Stops after a drain.
    pub stops: u32,
    /// Steps the liveness phase took to settle every Run ([`simulate`] only).
    pub live_steps: u32,
    /// Whether the control plane's Run timeout had to end a silent Run ([`simulate`] only).
    pub plane_timeout: bool,
    /// Records retention removed ([`SimOptions::small_inbox`]).
    pub retained: u32,
    /// Session ids the Worker replaced ([`SimOptions::unclean_drain`] and the safety phase).
    pub renewals: u32,
    /// Runs the control plane re-delivered under a new offer id ([`SimOptions::reoffers`]).
    pub redelivered: u32,
    /// Wall-clock steps injected ([`SimOptions::clock_steps`]), a start near 1970 included.
    pub clock_steps: u32,
    /// Runs this simulation settled, by how (preloaded settled records are not counted; records
    /// retention removed are).
    pub runs: RunOutcomes,
}

/// How the Runs of one simulation ended, counted from the records the Worker itself moved into
/// a final state (a record counts once, under the state it ends in).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunOutcomes {
    /// `completion_acknowledged`, and the completion the Worker reported had exit code 0.
    pub succeeded: u32,
    /// `completion_acknowledged` with a non-zero exit code.
    pub failed: u32,
    /// `start_failure_acknowledged` (the control plane applied the start failure).
    pub start_failed: u32,
    /// `recovery_required` (each needs a cause the seed injected: `recovery-licensed`).
    pub recovery: u32,
}

impl RunOutcomes {
    /// Counts a record that ends in `state`; `exit` is the exit code of its completion (for
    /// `completion_acknowledged`: none counts as failed). Records in other states count nowhere.
    pub fn count(&mut self, state: State, exit: Option<u64>) {
        match state {
            State::CompletionAcknowledged if exit == Some(0) => self.succeeded += 1,
            State::CompletionAcknowledged => self.failed += 1,
            State::StartFailureAcknowledged => self.start_failed += 1,
            State::RecoveryRequired => self.recovery += 1,
            State::Accepted
            | State::StartingAcknowledged
            | State::Launching
            | State::Started
            | State::RunningAcknowledged
            | State::StartFailed => {}
        }
    }

    /// Adds `other`'s counts.
    pub fn add(&mut self, other: Self) {
        self.succeeded += other.succeeded;
        self.failed += other.failed;
        self.start_failed += other.start_failed;
        self.recovery += other.recovery;
    }
}

impl Summary {
    /// Whether the run reached an end of a Run's or a Worker's life (a seed must).
    #[must_use]
    pub fn milestone(&self) -> bool {
        self.completed + self.start_failed + self.stops > 0
    }
}

/// `machine_start_path`.
#[must_use]
pub fn machine_start_path(data: &[u8]) -> Summary {
    run(Scenario::StartPath, data)
}

/// `machine_finish_path`.
#[must_use]
pub fn machine_finish_path(data: &[u8]) -> Summary {
    run(Scenario::FinishPath, data)
}

/// `machine_lifecycle`.
#[must_use]
pub fn machine_lifecycle(data: &[u8]) -> Summary {
    run(Scenario::Lifecycle, data)
}

/// Runs one fuzz case of `scenario`.
#[must_use]
pub fn run(scenario: Scenario, data: &[u8]) -> Summary {
    run_traced(scenario, data, &mut |_| {})
}

/// [`run`], reporting every step to `trace` (for reading a reproducer).
pub fn run_traced(scenario: Scenario, data: &[u8], trace: &mut dyn FnMut(&str)) -> Summary {
    let mut r = Bytes::new(data);
    let mut sim = Sim::new(scenario, &mut r);
    sim.trace = Some(trace);
    let mut healing = 0;
    sim.note(format_args!("setup: {} records", sim.host.records.len()));
    while sim.summary.steps < MAX_STEPS {
        if r.is_empty() {
            healing += 1;
            if healing > HEAL_STEPS {
                break;
            }
        }
        sim.summary.steps += 1;
        if !sim.step(&mut r) {
            break;
        }
        sim.host.check_state();
    }
    sim.finish()
}

/// The whole simulation: the safety phase of [`run_traced`] over `data` (with the extra
/// `faults` and the host's `lie`, if any), then the liveness phase ([`Sim::settle`], at most
/// [`LIVE_STEPS`] steps). Panics with `INVARIANT <name>` on the first violation, liveness
/// included.
pub fn simulate(
    scenario: Scenario,
    data: &[u8],
    faults: SimOptions,
    lie: Option<crate::testkit::world::Lie>,
    trace: &mut dyn FnMut(&str),
) -> Summary {
    let mut r = Bytes::new(data);
    let mut sim = Sim::new(scenario, &mut r);
    sim.faults = faults;
    sim.host.lie = lie;
    sim.host.plane.new_sessions_draining =
        lie == Some(crate::testkit::world::Lie::SessionStaysDraining);
    sim.host.plane.reoffers = faults.reoffers;
    sim.trace = Some(trace);
    if faults.clock_steps && r.u8().is_multiple_of(4) {
        // The host booted without a clock: its wall clock starts 5 s after the epoch until a
        // clock step (NTP) sets it.
        sim.host.wall_skew = 5_000 - i64::try_from(sim.host.now.get()).unwrap_or(0);
        sim.worker = Worker::new(sim.config.clone(), sim.host.clock());
        sim.summary.clock_steps += 1;
    }
    if faults.small_inbox {
        let places = sim.host.records.len() + 1 + usize::from(r.u8() % 2);
        let capacity = ql_worker_core::listing::Capacity::new(u64::try_from(places).unwrap_or(1));
        sim.config.capacity = capacity.unwrap_or_default();
        sim.worker = Worker::new(sim.config.clone(), sim.host.clock());
    }
    sim.note(format_args!(
        "setup: {} records, inbox capacity {}",
        sim.host.records.len(),
        sim.config.capacity.get()
    ));
    while sim.summary.steps < MAX_STEPS && !r.is_empty() {
        sim.summary.steps += 1;
        if !sim.step(&mut r) {
            break;
        }
        sim.host.check_state();
    }
    sim.note(format_args!("liveness phase"));
    match sim.settle(LIVE_STEPS) {
        Ok(steps) => sim.summary.live_steps = steps,
        Err(stuck) => panic!("INVARIANT liveness: not settled after {LIVE_STEPS} steps: {stuck}"),
    }
    sim.finish()
}

/// The Worker and its host.
pub struct Sim<'t> {
    trace: Option<&'t mut dyn FnMut(&str)>,
    /// The simulation's options (off for the fuzz targets).
    pub faults: SimOptions,
    live: bool,
    config: WorkerConfig,
    worker: Worker,
    /// The host.
    pub host: Host,
    license: License,
    /// What happened so far.
    pub summary: Summary,
    /// After the liveness phase's unclean drain: Pulls made since the restart by a Session the
    /// control plane holds online (`None`: no unclean drain in this run).
    pulls_after_unclean: Option<u32>,
    /// Whether the last step found the Worker idle (no operation in flight).
    idle: bool,
    /// Records retention removed (for the outcome counts).
    removed: Vec<InboxRecord>,
    /// What the last sweep of this incarnation saw (the driver's `retention::due`).
    last_swept: Option<ql_worker_core::retention::SweepKey>,
    /// Receipts removed and claims cleared in this incarnation (`SweepKey::released`).
    released: u64,
    /// Calls issued and not answered yet ([`SimOptions::concurrent`]), oldest first.
    in_flight: Vec<Command>,
    /// The highest time the host's wall clock showed before a clock step.
    wall_high: UnixMillis,
    /// When each control-plane call was issued (true time), until it is performed.
    sent_at: std::collections::BTreeMap<ql_worker_core::io::OpId, UnixMillis>,
}

fn config(r: &mut Bytes<'_>) -> WorkerConfig {
    let worker = samples::worker();
    let capabilities = Capabilities::for_architecture(Architecture::Amd64);
    let c = r.u8();
    let mut config = if c & 1 == 1 {
        WorkerConfig::node(worker.worker_id, worker.session_id, capabilities)
    } else {
        WorkerConfig::edge(worker.worker_id, worker.session_id, capabilities)
    };
    let page = |bits: u8| PageLimit::new(u64::from(bits % 4) + 1).unwrap_or_default();
    config.startup_page = page(c >> 1);
    config.supervision_page = page(c >> 3);
    config.max_concurrent_runs = u16::from((c >> 5) % 3) + 1;
    config
}

impl std::fmt::Debug for Sim<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sim")
            .field("host", &self.host)
            .field("summary", &self.summary)
            .finish_non_exhaustive()
    }
}

impl Sim<'_> {
    fn note(&mut self, line: std::fmt::Arguments<'_>) {
        if let Some(trace) = &mut self.trace {
            trace(&std::format!("[{}] {line}", self.host.now));
        }
    }

    /// Sets up `scenario` from the first bytes of `r`.
    pub fn new(scenario: Scenario, r: &mut Bytes<'_>) -> Self {
        let config = config(r);
        let now = samples::ms(1_000_000 + u64::from(r.u16()));
        let policy = match scenario {
            Scenario::StartPath => OfferPolicy::Always,
            Scenario::FinishPath => OfferPolicy::Never,
            Scenario::Lifecycle => OfferPolicy::Sometimes,
        };
        let mut host = Host::new(now, Plane::new(policy));
        match scenario {
            Scenario::StartPath => preload_claim(&mut host, r),
            Scenario::FinishPath => {
                let states = [
                    State::Launching,
                    State::Started,
                    State::RunningAcknowledged,
                    State::RecoveryRequired,
                    State::CompletionAcknowledged,
                    State::RecoveryRequired,
                ];
                for i in 0..=r.below(3) {
                    let s = r.below(6);
                    let reason = if s == 5 {
                        RecoveryReason::ALL[usize::from(r.below(5))]
                    } else {
                        RecoveryReason::LaunchOutcomeUnknown
                    };
                    let extras = samples::Extras {
                        barrier: true,
                        handle: r.flag(),
                    };
                    preload(
                        &mut host,
                        10 + u32::from(i),
                        states[usize::from(s)],
                        reason,
                        extras,
                        r,
                    );
                }
            }
            Scenario::Lifecycle => {
                for i in 0..r.below(4) {
                    let state = State::ALL[usize::from(r.below(9))];
                    let reason = RecoveryReason::ALL[usize::from(r.below(5))];
                    let extras = samples::Extras {
                        barrier: r.flag(),
                        handle: r.flag(),
                    };
                    preload(&mut host, 20 + u32::from(i), state, reason, extras, r);
                }
                preload_claim(&mut host, r);
            }
        }
        let worker = Worker::new(config.clone(), host.clock());
        Self {
            trace: None,
            faults: SimOptions::default(),
            live: false,
            config,
            worker,
            host,
            license: License::default(),
            summary: Summary::default(),
            pulls_after_unclean: None,
            idle: false,
            removed: Vec::new(),
            last_swept: None,
            released: 0,
            in_flight: Vec::new(),
            sent_at: std::collections::BTreeMap::new(),
            wall_high: UnixMillis::ZERO,
        }
    }

    /// One step; false when the run must end (restart budget used up).
    pub fn step(&mut self, r: &mut Bytes<'_>) -> bool {
        // Calls in flight: most steps answer one of them (any one: outcomes come back in any
        // order); past the end of the bytes, always. A Worker that halted or stopped meanwhile
        // hears none of them: the driver stops feeding it (the restart drops them).
        if !self.in_flight.is_empty()
            && self.worker.phase() != ql_worker_core::worker::Phase::Finished
            && r.u8() < 96
        {
            self.answer_in_flight(r);
            return true;
        }
        match self.worker.poll_output() {
            Output::Command(command) => {
                self.idle = false;
                if self.faults.concurrent
                    && self.in_flight.len() < MAX_IN_FLIGHT
                    && matches!(
                        command.action,
                        ql_worker_core::io::Action::Post(_)
                            | ql_worker_core::io::Action::UploadLog { .. }
                    )
                    && r.flag()
                {
                    self.count(&command);
                    self.note(format_args!("  in flight"));
                    self.in_flight.push(command);
                } else {
                    self.command(command, r);
                }
                true
            }
            Output::Idle { .. } if !self.in_flight.is_empty() && r.flag() => {
                self.answer_in_flight(r);
                true
            }
            Output::Idle { wake_at } => {
                // Ticks, time, exits and operator requests may come while calls are in flight.
                self.idle = self.in_flight.is_empty();
                self.idle(wake_at, r);
                true
            }
            Output::Stopped(reason) => {
                self.note(format_args!("stopped: {reason:?}"));
                assert!(
                    self.host.ghost.drain_requested,
                    "INVARIANT stop-only-drained: stopped ({reason:?}) without a drain request"
                );
                if reason == StopReason::Drained {
                    // Settled, or dormant: before the spawn barrier with its lease expired,
                    // so nothing ran and nothing can start (docs/model-check.md, findings).
                    let settled = self
                        .host
                        .all_records()
                        .iter()
                        .all(|r| r.state.is_terminal() || self.dormant_to_worker(r));
                    assert!(
                        settled,
                        "INVARIANT drain: drained with records neither settled nor dormant"
                    );
                }
                self.summary.stops += 1;
                self.restart()
            }
            Output::Halted(reason) => {
                self.note(format_args!("halted: {reason}"));
                self.check_halt(&reason);
                self.summary.halts += 1;
                self.restart()
            }
        }
    }

    /// Whether the Worker may rightly take `record` for dormant (before the spawn barrier, its
    /// lease expired): by the true time; by its local deadline, which falls before the control
    /// plane's expiry by how long the granting call was on its way (`Host::lease_slack`); or,
    /// for a lease it holds no local deadline for, by its own wall clock (`LeaseClock`).
    fn dormant_to_worker(&self, record: &InboxRecord) -> bool {
        let offer = &record.offer.offer_id;
        let deadline = samples::ms(self.host.now.get().saturating_add(self.host.slack(record)));
        record.is_dormant(deadline)
            || (!self.worker.times_lease(offer)
                && record.is_dormant(self.worker.clock_reading().wall))
    }

    fn check_halt(&self, reason: &HaltReason) {
        assert!(
            self.license.allows(reason),
            "INVARIANT halt-licensed: halted ({reason}) without a host fault that causes it \
             (last answer licensed {:?})",
            self.license
        );
    }

    /// Counts `command`: commands, Session renewals, and Pulls of an online Session after an
    /// unclean drain.
    fn count(&mut self, command: &Command) {
        self.summary.commands += 1;
        if matches!(
            command.action,
            ql_worker_core::io::Action::Post(_) | ql_worker_core::io::Action::UploadLog { .. }
        ) {
            self.sent_at.insert(command.id, self.host.now);
        }
        self.note(format_args!("{} {:?}", command.id, command.action));
        self.host.on_command(&command.action, &self.worker);
        if matches!(
            command.action,
            ql_worker_core::io::Action::PersistSession { .. }
        ) {
            self.summary.renewals += 1;
        }
        if let (Some(pulls), ql_worker_core::io::Action::ReadClaim) =
            (&mut self.pulls_after_unclean, &command.action)
            && self.host.plane.status == ql_worker_core::wire::session::SessionStatus::Online
            && self.host.plane.session_id == self.host.session_id
        {
            *pulls += 1;
        }
    }

    fn command(&mut self, mut command: Command, r: &mut Bytes<'_>) {
        if self.host.lie == Some(crate::testkit::world::Lie::WorkerWrongRecovery)
            && let ql_worker_core::io::Action::PersistRecord { record, .. } = &mut command.action
            && let Some(reason) = &mut record.recovery_reason
        {
            *reason = if *reason == RecoveryReason::ControlPlaneAlreadyRunning {
                RecoveryReason::ControlPlaneTerminal
            } else {
                RecoveryReason::ControlPlaneAlreadyRunning
            };
        }
        if self.host.lie == Some(crate::testkit::world::Lie::WorkerSpawnsDriftedPlan)
            && let ql_worker_core::io::Action::Spawn(plan) = &mut command.action
        {
            plan.executor_started_at = plan.executor_started_at.saturating_add(1);
        }
        self.count(&command);
        if let ql_worker_core::io::Action::Spawn(plan) = &command.action {
            self.forge_spawn(plan);
        }
        self.answer(command, r);
    }

    /// Answers one of the calls in flight, chosen by the bytes.
    fn answer_in_flight(&mut self, r: &mut Bytes<'_>) {
        let index = usize::from(r.u8()) % self.in_flight.len().max(1);
        let command = self.in_flight.remove(index);
        self.note(format_args!(
            "answering {} ({} more in flight)",
            command.id,
            self.in_flight.len()
        ));
        self.answer(command, r);
    }

    /// Performs `command` (valid, a fault, or a crash before or after it) and hands its outcome
    /// to the Worker.
    fn answer(&mut self, command: Command, r: &mut Bytes<'_>) {
        let byte = r.u8();
        if byte >= 200 {
            self.note(format_args!("  answer byte {byte}"));
        }
        let mode = match byte {
            0..=199 => Mode::Valid,
            m @ 200..=239 => {
                self.host.launch_uncertain();
                Mode::Fault(m - 200)
            }
            240..=247 => {
                // Crash before the driver performed the command.
                let _ = self.restart();
                return;
            }
            _ => {
                // Performed, then the process died before reporting.
                self.host.call_sent_at = self.sent_at.remove(&command.id);
                let _ = self.host.perform(command.action, Mode::Valid, r);
                let _ = self.restart();
                return;
            }
        };
        let reconciling = matches!(command.action, ql_worker_core::io::Action::ListInbox { .. })
            && self.worker.phase() == ql_worker_core::worker::Phase::Reconciling;
        let remote = matches!(
            command.action,
            ql_worker_core::io::Action::Post(_) | ql_worker_core::io::Action::UploadLog { .. }
        );
        let delay = if self.faults.delays && remote {
            r.u8()
        } else {
            0
        };
        let lag = u64::from(delay % 16 + 1) * 2_000;
        if (224..240).contains(&delay) {
            self.note(format_args!("  request delayed {lag} ms"));
            self.advance(lag);
        }
        self.host.call_sent_at = self.sent_at.remove(&command.id);
        let action = command.action.clone();
        let answer = self.host.perform(command.action, mode, r);
        self.released += u64::from(crate::testkit::sim::releases(&action, &answer.outcome));
        if delay >= 240 {
            self.note(format_args!("  response delayed {lag} ms"));
            self.advance(lag);
        }
        self.note(format_args!("  -> {:?}", answer.outcome));
        if reconciling
            && let Outcome::InboxListed {
                next_after: None, ..
            } = &answer.outcome
        {
            self.host.ghost.reconciled = true;
        }
        self.license = answer.license;
        let id = command.id;
        let result = self.worker.handle(
            self.host.clock(),
            Input::Outcome {
                id,
                outcome: answer.outcome,
            },
        );
        assert!(
            result.is_ok(),
            "INVARIANT input-accepted: handle refused a well-formed outcome: {result:?}"
        );
        self.housekeep();
        if self.worker.fail_closed().is_none() {
            self.host.ghost.latched_at_tick = false;
        }
        if self.faults.duplicates && r.u8() >= 240 {
            self.note(format_args!("  duplicate delivery of {id}"));
            let again = Input::Outcome {
                id,
                outcome: Outcome::Http(ql_worker_core::io::HttpFailure::Unavailable),
            };
            let result = self.worker.handle(self.host.clock(), again);
            assert!(
                result.is_err(),
                "INVARIANT duplicate-refused: a second outcome for {id} was accepted"
            );
        }
    }

    /// The Worker-side lies of the self-test: a spawn issued twice, or a forged spawn of the
    /// same Attempt (another offer id) or of the same Run (another Attempt id).
    fn forge_spawn(&mut self, plan: &ql_worker_core::io::LaunchPlan) {
        use crate::testkit::world::Lie;
        let (offer, attempt) = match self.host.lie {
            Some(Lie::WorkerDoubleSpawn) => {
                let again = ql_worker_core::io::Action::Spawn(Box::new(forged(plan, None, None)));
                self.host.on_command(&again, &self.worker);
                return;
            }
            Some(Lie::WorkerSpawnsAttemptTwice) => (Some("forged-offer"), None),
            Some(Lie::WorkerSpawnsRunTwice) => (Some("forged-offer"), Some("forged-attempt")),
            _ => return,
        };
        let plan = forged(plan, offer, attempt);
        self.host.on_command(
            &ql_worker_core::io::Action::Spawn(Box::new(plan)),
            &self.worker,
        );
    }

    fn idle(&mut self, wake_at: Option<MonoMillis>, r: &mut Bytes<'_>) {
        let wake_at = wake_at.map(crate::clock::true_time);
        self.license = License::default();
        self.housekeep();
        if self.live {
            // Healed: a process ends (slowly: one per idle step) with its receipt, and time
            // moves even when the Worker has no wake-up.
            let hung = self.host.lie == Some(crate::testkit::world::Lie::HungProcesses);
            let alive = self.host.processes.iter().position(|p| p.alive);
            if let Some(index) = alive.filter(|_| !hung) {
                self.host.exit(index, 0, true);
            }
            if wake_at.is_none_or(|wake| wake <= self.host.now) {
                self.advance(1_000);
            }
        }
        let op = r.u8();
        let (phase, latch) = (self.worker.phase(), self.worker.fail_closed().cloned());
        self.note(format_args!(
            "idle (wake {wake_at:?}) op {op}; {phase:?} fail-closed {latch:?}"
        ));
        match op {
            0..=159 => {
                if let Some(wake) = wake_at {
                    self.host.now = self.host.now.max(wake);
                }
            }
            160..=179 => self.advance(u64::from(r.u16()) * 100),
            180..=189 => {
                self.host.ghost.drain_requested = true;
                let result = self.worker.handle(self.host.clock(), Input::DrainRequested);
                assert!(
                    result.is_ok(),
                    "INVARIANT input-accepted: drain: {result:?}"
                );
                return;
            }
            190..=199 => {
                let _ = self.restart();
                return;
            }
            200..=219 => {
                let alive: Vec<usize> = (0..self.host.processes.len())
                    .filter(|i| self.host.processes[*i].alive)
                    .collect();
                if !alive.is_empty() {
                    let pick = alive[usize::from(r.u8()) % alive.len()];
                    let code = r.u8();
                    self.host.exit(pick, code, code % 8 != 7);
                }
            }
            220..=239 => self.advance(u64::from(r.u8()) * 10),
            248..=255 if self.faults.clock_steps => self.step_clock(r),
            240..=255 => {}
        }
        self.host.ghost.latched_at_tick = self.worker.fail_closed().is_some();
        let result = self.worker.handle(self.host.clock(), Input::Tick);
        assert!(result.is_ok(), "INVARIANT input-accepted: tick: {result:?}");
    }

    /// The liveness phase: every answer valid, no crash, no drain, processes end, time moves.
    /// `Ok(steps)` once every Run is settled ([`Self::unsettled`] is empty), else the unsettled
    /// Runs after `max_steps` steps.
    ///
    /// # Errors
    /// The description of the Runs still unsettled.
    pub fn settle(&mut self, max_steps: u32) -> Result<u32, String> {
        self.live = true;
        let mut healed = Bytes::new(&[]);
        // The wall clock steps no more: one behind the true time is set right, and one that was
        // stepped back after running ahead returns to the highest time it showed (receipts the
        // supervisors wrote meanwhile carry those times, and a receipt is authenticated only
        // once the Worker's clock has reached its `finishedAtMs`, as in the reference).
        let high = i64::try_from(self.wall_high.get()).unwrap_or(i64::MAX);
        let now = i64::try_from(self.host.now.get()).unwrap_or(i64::MAX);
        self.host.wall_skew = self.host.wall_skew.max(0).max(high - now);
        if self.faults.unclean_drain {
            self.unclean_drain(&mut healed);
        }
        for step in 0..max_steps {
            if self.unsettled().is_empty() {
                return Ok(step);
            }
            if self.faults.plane_timeout && step == max_steps / 2 && !self.host.plane_timeout {
                self.note(format_args!("control plane: Run timeout for silent Runs"));
                self.host.plane_timeout = true;
                self.summary.plane_timeout = true;
            }
            let _ = self.step(&mut healed);
            self.host.check_state();
        }
        let stuck = self.unsettled();
        if stuck.is_empty() {
            Ok(max_steps)
        } else {
            Err(stuck.join("; "))
        }
    }

    /// The Runs not settled: records neither terminal (`completion_acknowledged`,
    /// `start_failure_acknowledged`, `recovery_required` — the last only for a cause the seed
    /// injected, which `recovery-licensed` checked when it was written) nor dormant (before the spawn barrier
    /// with the lease expired), a `completion_acknowledged` record whose receipt is still on
    /// disk, a pending claim, or a live process.
    #[must_use]
    pub fn unsettled(&self) -> Vec<String> {
        let now = self.host.now;
        let mut stuck = Vec::new();
        for record in self.host.all_records() {
            let dormant = matches!(
                record.state,
                State::Accepted | State::StartingAcknowledged | State::StartFailed
            ) && record.offer.lease.expires_at_ms <= now;
            let attempt = &record.offer.candidate.attempt_id;
            let receipt = record.state == State::CompletionAcknowledged
                && self.host.receipts.contains_key(attempt);
            let settled = record.state.is_terminal() || record.state == State::RecoveryRequired;
            if !(settled || dormant) || receipt {
                stuck.push(std::format!(
                    "{} {} (lease expires {}, receipt on disk {})",
                    record.offer.offer_id,
                    record.state,
                    record.offer.lease.expires_at_ms,
                    self.host.receipts.contains_key(attempt)
                ));
            }
        }
        // A claim, or new work, needs a place in the inbox: one full of records nothing can
        // settle (dormant or `recovery_required`, which only an operator's archive removes)
        // waits for the operator, as it should.
        let room = self.host.records.len() < self.config.capacity.get();
        if self.host.claim.is_some() && self.worker.fail_closed().is_none() && room {
            stuck.push(String::from("a pending claim"));
        }
        for attempt in self.host.receipts.keys() {
            let named = self
                .host
                .all_records()
                .iter()
                .any(|r| r.offer.candidate.attempt_id == *attempt);
            if !named {
                stuck.push(std::format!(
                    "the receipt of {attempt} without its record (a capability left behind)"
                ));
            }
        }
        if self.pulls_after_unclean == Some(0) && self.worker.fail_closed().is_none() && room {
            stuck.push(String::from(
                "no Pull by an online Session since the restart after an unclean drain",
            ));
        }
        for process in self.host.processes.iter().filter(|p| p.alive) {
            stuck.push(std::format!("process {} alive", process.handle));
        }
        stuck
    }

    /// The driver's housekeeping, after every outcome and at every idle step: with a small
    /// inbox, the inbox's own sweep whenever the driver's rule says it is due
    /// (`retention::due`; no periodic sweep to fall back on).
    fn housekeep(&mut self) {
        if !self.faults.small_inbox {
            return;
        }
        let key = |sim: &Self| {
            let inbox = sim.worker.inbox_status();
            ql_worker_core::retention::SweepKey {
                records: inbox.records,
                settled: inbox.settled,
                released: sim.released,
            }
        };
        let policy = ql_worker_core::retention::RetentionPolicy {
            high_water_records: self.config.capacity.get() / 2,
            max_settled_age_ms: None,
            log_keep_ms: 60_000,
        };
        if ql_worker_core::retention::due(key(self), self.last_swept, false, &policy) {
            self.retain(&policy);
            self.last_swept = Some(key(self));
        }
    }

    /// The driver's retention: the core's plan over the host's records (receipts and the claim
    /// as they are), then each removal reported to the Worker. A removed record must have been
    /// settled, receipt-free and unclaimed (checked here independently of the plan).
    fn retain(&mut self, policy: &ql_worker_core::retention::RetentionPolicy) {
        use ql_worker_core::retention::{RecordFacts, plan};
        let claimed = self.host.claim.as_ref().and_then(|bytes| {
            ql_worker_core::envelope::decode::<ql_worker_core::claim::PendingClaim>(bytes)
                .ok()
                .map(|c| c.offer_id)
        });
        let facts: Vec<RecordFacts> = self
            .host
            .all_records()
            .iter()
            .map(|record| {
                let receipt = self
                    .host
                    .receipts
                    .contains_key(&record.offer.candidate.attempt_id);
                let claim = claimed.as_ref() == Some(&record.offer.offer_id);
                RecordFacts::of(record, receipt, claim)
            })
            .collect();
        let plan = plan(&facts, None, None, self.host.now, policy);
        for log in &plan.logs {
            self.host.logs.remove(log);
        }
        for (offer_id, _) in plan.records {
            let Some(record) = self.host.record(&offer_id) else {
                continue;
            };
            assert!(
                record.state.is_terminal()
                    && !self
                        .host
                        .receipts
                        .contains_key(&record.offer.candidate.attempt_id)
                    && claimed.as_ref() != Some(&offer_id),
                "INVARIANT retention-removes-only-unneeded: {offer_id} ({}) removed",
                record.state
            );
            if self.host.lie != Some(crate::testkit::world::Lie::RemovalNotDone) {
                self.host.records.remove(&offer_id);
            }
            self.removed.push(record);
            self.summary.retained += 1;
            self.note(format_args!("retention removed {offer_id}"));
            let result = self
                .worker
                .handle(self.host.clock(), Input::RecordRemoved { offer_id });
            assert!(
                result.is_ok(),
                "INVARIANT input-accepted: removal report: {result:?}"
            );
        }
    }

    /// The liveness phase's unclean drain: a drain request, healthy steps until the control
    /// plane holds the Session draining (or the drain ended cleanly), then a crash.
    fn unclean_drain(&mut self, healed: &mut Bytes<'_>) {
        self.note(format_args!("liveness: unclean drain"));
        // The operator's request reaches a Worker between operations (as the idle step's drain
        // does): never in the middle of a launch.
        for _ in 0..LIVE_STEPS / 8 {
            if self.idle {
                break;
            }
            let _ = self.step(healed);
            self.host.check_state();
        }
        if self.worker.phase() != ql_worker_core::worker::Phase::Finished {
            self.host.ghost.drain_requested = true;
            let result = self.worker.handle(self.host.clock(), Input::DrainRequested);
            assert!(
                result.is_ok(),
                "INVARIANT input-accepted: drain: {result:?}"
            );
        }
        for _ in 0..LIVE_STEPS / 8 {
            if self.host.plane.status != ql_worker_core::wire::session::SessionStatus::Online {
                break;
            }
            let _ = self.step(healed);
            self.host.check_state();
        }
        let _ = self.restart();
        self.pulls_after_unclean = Some(0);
    }

    /// A clock-step fault ([`SimOptions::clock_steps`]): the wall clock goes back an hour,
    /// forward an hour, or back to the true time (NTP syncs).
    fn step_clock(&mut self, r: &mut Bytes<'_>) {
        let skew = match r.u8() % 3 {
            0 => self.host.wall_skew.saturating_sub(crate::clock::HOUR_MS),
            1 => self.host.wall_skew.saturating_add(crate::clock::HOUR_MS),
            _ => 0,
        };
        self.note(format_args!(
            "wall clock steps {:+} ms (now {:+} ms off)",
            skew - self.host.wall_skew,
            skew
        ));
        self.wall_high = self.wall_high.max(self.host.local_wall());
        self.host.wall_skew = skew;
        self.summary.clock_steps += 1;
    }

    fn advance(&mut self, ms: u64) {
        self.host.now = samples::ms(self.host.now.get().saturating_add(ms));
    }

    /// A crash or restart: the Worker is rebuilt from the durable state alone.
    fn restart(&mut self) -> bool {
        self.note(format_args!("restart"));
        // The calls in flight die with the process, unperformed (a call that commits and loses
        // its answer is a fault byte of its own).
        self.in_flight.clear();
        self.sent_at.clear();
        self.host.launch_uncertain();
        self.summary.restarts += 1;
        self.host.ghost.restart();
        self.license = License::default();
        self.last_swept = None;
        self.released = 0;
        let mut config = self.config.clone();
        config.session_id = self.host.session_id.clone();
        self.worker = Worker::new(config, self.host.clock());
        self.summary.restarts <= MAX_RESTARTS
    }

    fn finish(mut self) -> Summary {
        let records = self.host.all_records();
        let count = |state: State| {
            u32::try_from(records.iter().filter(|r| r.state == state).count()).unwrap_or(0)
        };
        self.summary.completed = count(State::CompletionAcknowledged);
        self.summary.start_failed = count(State::StartFailureAcknowledged);
        self.summary.recovery = count(State::RecoveryRequired);
        self.summary.spawns = u32::try_from(self.host.ghost.spawns.len()).unwrap_or(0);
        self.summary.redelivered = self.host.plane.redelivered;
        let mut runs = RunOutcomes::default();
        for record in records.iter().chain(&self.removed) {
            let offer = &record.offer.offer_id;
            if self.host.ghost.written.get(offer) != Some(&record.state) {
                continue;
            }
            let exit = self.host.ghost.completion_exit.get(offer).copied();
            assert!(
                record.state != State::CompletionAcknowledged || exit.is_some(),
                "INVARIANT completion-before-acknowledged: {offer} acknowledged without a \
                 completion"
            );
            runs.count(record.state, exit);
        }
        self.summary.runs = runs;
        self.summary
    }
}

/// A durable record of sample `n` left by a previous incarnation, with its process (exited
/// with a receipt, still alive, exited without a receipt, or never started) and its log.
fn preload(
    host: &mut Host,
    n: u32,
    state: State,
    reason: RecoveryReason,
    extras: samples::Extras,
    r: &mut Bytes<'_>,
) {
    let now = host.now;
    let expires = match r.below(4) {
        0 | 3 => samples::ms(now.get() + 30_000),
        1 => samples::ms(now.get() + 3_000),
        _ => samples::ms(21),
    };
    let at = samples::ms(now.get() - 500);
    let record = samples::record(samples::offer(n, expires), n, state, reason, at, extras);
    host.ghost.candidate(samples::capability(n));
    if state == State::Launching {
        // A previous incarnation left it launching: whether its process started is unknown.
        host.ghost
            .cause(&record.offer.offer_id, RecoveryReason::LaunchOutcomeUnknown);
    }
    host.put_record(&record);
    if record.executor_started_at_ms.is_none() {
        return;
    }
    let capability = samples::capability(n);
    let offer: OfferId = record.offer.offer_id.clone();
    let fate = match state {
        State::StartFailed | State::StartFailureAcknowledged => SpawnFate::Rejected,
        State::Started | State::RunningAcknowledged => SpawnFate::Started,
        _ if record.executor_handle.is_some() => SpawnFate::Started,
        _ => SpawnFate::Unknown,
    };
    let candidate = &record.offer.candidate;
    host.ghost
        .preloaded_spawn(&offer, &candidate.attempt_id, &candidate.run_id);
    host.ghost.spawns.insert(offer, fate);
    if let Some(handle) = &record.executor_handle {
        host.ghost.handles.insert(String::from(handle.as_str()));
    }
    let process = r.below(4);
    // A settled completion proves the process exited and its receipt was read (then removed):
    // no process is left for it.
    if fate == SpawnFate::Rejected || process == 3 || state == State::CompletionAcknowledged {
        return;
    }
    let handle = record.executor_handle.as_ref().map_or_else(
        || std::format!("ql3lp1.fuzz-pre-{n}"),
        |h| String::from(h.as_str()),
    );
    host.ghost.handles.insert(handle.clone());
    host.processes.push(Process {
        launching: record,
        capability,
        handle,
        alive: true,
    });
    let index = host.processes.len() - 1;
    match process {
        0 => host.exit(index, r.u8() % 4, true),
        2 => host.exit(index, 1, false),
        _ => {}
    }
}

/// Maybe a pending claim left by a previous incarnation: of this Session (some attempts
/// used) or of an older generation.
fn preload_claim(host: &mut Host, r: &mut Bytes<'_>) {
    let p = r.u8();
    let mut claim = samples::claim(90, p % 17);
    match p % 4 {
        1 => {}
        2 => {
            claim.worker_generation =
                ql_worker_core::ids::WorkerGeneration::new(1).unwrap_or(claim.worker_generation);
        }
        _ => return,
    }
    host.put_claim(&claim);
}

/// A copy of `plan` (self-test lies only), with another offer id and Attempt id if given.
fn forged(
    plan: &ql_worker_core::io::LaunchPlan,
    offer: Option<&str>,
    attempt: Option<&str>,
) -> ql_worker_core::io::LaunchPlan {
    let offer_id = offer.and_then(|o| OfferId::new(o).ok());
    let attempt_id = attempt.and_then(|a| ql_worker_core::ids::AttemptId::new(a).ok());
    ql_worker_core::io::LaunchPlan {
        offer_id: offer_id.unwrap_or_else(|| plan.offer_id.clone()),
        run_id: plan.run_id.clone(),
        attempt_id: attempt_id.unwrap_or_else(|| plan.attempt_id.clone()),
        executor_started_at: plan.executor_started_at,
        command: plan.command.clone(),
        environment: Vec::new(),
        working_directory: None,
        timeout: plan.timeout,
        log_artifact_id: plan.log_artifact_id.clone(),
        callback_sequence: plan.callback_sequence,
        capability: ql_worker_core::capability::Capability::from_bytes(*plan.capability.expose()),
    }
}
