//! The exhaustive, bounded explorer behind the model checks (`core/tests/model_check_*.rs`).
//!
//! A state is a whole [`Sim`]: the world (disk, processes, control plane, entropy counter),
//! the Worker's memory, its outstanding command, the clock, and the budget left. From each
//! state the explorer takes **every** move the [`Model`] allows:
//!
//! * with a command outstanding: every [`Answer`] the world offers for it under the model's
//!   [`Menu`] — including a crash before and after it, i.e. a crash at every command boundary
//!   (the Worker is dropped and rebuilt from the durable world);
//! * when the Worker is idle: a tick at its wake-up time, a jump past the earliest lease
//!   expiry, a drain request;
//! * when it halted: a restart;
//! * at any time: every world event (a running process exits, with a genuine, forged,
//!   malformed or missing receipt).
//!
//! Every move is checked by the world's invariants ([`crate::testkit::world::check`]); a move
//! that breaks one is reported with its trace and not explored further.
//!
//! Two fingerprints (128-bit, of canonical renderings) are kept per node:
//!
//! * the **search key** — [`Sim::fingerprint`] plus the budget left: the system state, the
//!   clock, the entropy stream's position and the checkers' evidence (spawn counts, drawn
//!   windows, deliveries). The visited set is keyed by it, so two nodes are merged only when
//!   every future move and every check behaves alike; the search is depth-first over an
//!   explicit stack, which keeps memory at (depth × branching) nodes, and with the budget in the
//!   key it visits exactly the nodes a breadth-first search would. [`Report::histories`]
//!   counts these keys.
//! * the **system state** — [`Sim::state_fingerprint`]: the Worker's memory (without its clock
//!   reading) and the world's disk, process table, control plane and stored Session id, the
//!   command in flight and the driver status; no budget, no clock, no entropy position, no
//!   evidence. [`Report::states`] counts these: the number of distinct system states reached.

pub mod walk;

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hasher;

use crate::testkit::act;
use crate::testkit::sim::{Sim, Status};
use crate::testkit::world::{
    Answer, Cost, Event, Menu, OfferTemplate, Violation, World, hash_debug,
};
use ql_worker_core::time::UnixMillis;
use ql_worker_core::worker::Phase;

/// How far the explorer may go along one path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Bounds {
    /// Faults and alternative answers per path.
    pub faults: u8,
    /// Worker crashes per path, anywhere.
    pub crashes: u8,
    /// Further Worker crashes per path, only during recovery: after a restart, while the
    /// Worker registers or reconciles again (spent before `crashes` there).
    pub recovery_crashes: u8,
    /// Entropy variations per path.
    pub entropy: u8,
    /// Ticks per path.
    pub ticks: u8,
    /// Jumps past a lease expiry per path.
    pub jumps: u8,
    /// Drain requests per path.
    pub drains: u8,
    /// Commands the driver lets be outstanding at once ([`Sim::window`]): with 2 or more, the
    /// explorer answers them in every order.
    pub outstanding: u8,
    /// Stop after this many search keys ([`Report::histories`]; the report then says it is
    /// truncated).
    pub max_states: usize,
}

impl Bounds {
    /// A human-readable statement of the bounds, for the printed line and the docs.
    #[must_use]
    pub fn describe(&self) -> String {
        format!(
            "faults<={} crashes<={} recovery-crashes<={} entropy-variations<={} ticks<={} \
             lease-jumps<={} drains<={} outstanding<={} max-states={}",
            self.faults,
            self.crashes,
            self.recovery_crashes,
            self.entropy,
            self.ticks,
            self.jumps,
            self.drains,
            self.outstanding,
            self.max_states
        )
    }
}

/// A model: where to start, which nondeterminism to explore, and how far.
#[derive(Debug)]
pub struct Model {
    /// Name, for the printed line.
    pub name: &'static str,
    /// The world's alternatives.
    pub menu: Menu,
    /// The bounds.
    pub bounds: Bounds,
    /// Initial states.
    pub roots: Vec<Sim>,
}

/// One move of the explorer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Move {
    /// Answer the pending command (the first outstanding).
    Answer(Answer),
    /// Answer the outstanding command at this index of [`Sim::outstanding`] (1 or more: out of
    /// the order the Worker issued them).
    AnswerOther(usize, Answer),
    /// A world event.
    Event(Event),
    /// Tick at this time.
    Tick(UnixMillis),
    /// Jump the clock past a lease expiry, then tick.
    Jump(UnixMillis),
    /// Request a drain.
    Drain,
    /// Restart a halted Worker.
    Restart,
}

/// A broken invariant, with the moves that led to it.
#[derive(Clone, Debug)]
pub struct Found {
    /// The invariant (or `panic`).
    pub invariant: &'static str,
    /// What happened.
    pub detail: String,
    /// The moves from the initial state, the last one breaking the invariant.
    pub trace: Vec<String>,
}

/// What an exploration found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Distinct system states reached ([`Sim::state_fingerprint`]: no budget, clock, entropy
    /// position or checker evidence).
    pub states: usize,
    /// Distinct search keys visited ([`Sim::fingerprint`] plus the budget left): the system
    /// state together with the clock, the entropy position, the checkers' evidence and the
    /// remaining budget. Always at least [`Report::states`].
    pub histories: usize,
    /// Moves taken (edges explored, including those into known states).
    pub transitions: usize,
    /// Moves that broke an invariant (or panicked).
    pub violations: usize,
    /// The first violation of each invariant, with its trace.
    pub found: Vec<Found>,
    /// Whether `max_states` cut the exploration short.
    pub truncated: bool,
    /// Longest path (in moves) to a visited state.
    pub deepest: usize,
    /// Distinct system states per record state (with its recovery reason) present on disk.
    pub coverage: BTreeMap<String, usize>,
    /// Crash moves taken during recovery: on a path that already spent a crash, from a Worker
    /// that is registering or reconciling again (the restart rules), i.e. a second crash landing
    /// in the recovery that followed the first. (A restart after a halt is not a crash.)
    pub crashes_during_recovery: usize,
    /// Moves that answered a command other than the first outstanding one (outcomes in another
    /// order than the commands were issued: [`Bounds::outstanding`] of 2 or more).
    pub out_of_order: usize,
}

impl Report {
    /// Prints every violation found, with its trace.
    pub fn print_found(&self) {
        for found in &self.found {
            println!("violation {}: {}", found.invariant, found.detail);
            for step in &found.trace {
                println!("    {step}");
            }
        }
    }

    /// The one result line of a model check: distinct states, histories, transitions, the
    /// bounds explored, whether the exploration completed within them, and the violations.
    #[must_use]
    pub fn line(&self, model: &Model) -> String {
        format!(
            "model-check {}: {} distinct states ({} histories), {} transitions, bounds: {}, \
             deepest path {} moves, crashes-during-recovery explored: {}, answers out of issue \
             order: {}, {}, {} violations",
            model.name,
            self.states,
            self.histories,
            self.transitions,
            model.bounds.describe(),
            self.deepest,
            self.crashes_during_recovery,
            self.out_of_order,
            if self.truncated {
                "TRUNCATED by the state cap"
            } else {
                "complete within the bounds"
            },
            self.violations
        )
    }
}

/// Runs one move so that a panic in it becomes a violation (tests implement it with
/// the standard library's `catch_unwind`).
pub trait Guard {
    /// Runs `f`; `Err(message)` when it panicked.
    ///
    /// # Errors
    /// The panic message.
    fn run(&self, f: &mut dyn FnMut()) -> Result<(), String>;
}

/// A guard that lets panics through.
#[derive(Clone, Copy, Debug)]
pub struct Unguarded;

impl Guard for Unguarded {
    fn run(&self, f: &mut dyn FnMut()) -> Result<(), String> {
        f();
        Ok(())
    }
}

/// A guard that turns a panic of the core (a broken pair assertion, an `unreachable!`, an
/// `invariant:` expect) into a violation.
#[derive(Clone, Copy, Debug)]
pub struct CatchPanics;

impl Guard for CatchPanics {
    fn run(&self, f: &mut dyn FnMut()) -> Result<(), String> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).map_err(|e| {
            e.downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| (*s).to_string()))
                .unwrap_or_default()
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Budget {
    faults: u8,
    crashes: u8,
    recovery_crashes: u8,
    entropy: u8,
    ticks: u8,
    jumps: u8,
    drains: u8,
}

impl Budget {
    fn new(b: &Bounds) -> Self {
        Self {
            faults: b.faults,
            crashes: b.crashes,
            recovery_crashes: b.recovery_crashes,
            entropy: b.entropy,
            ticks: b.ticks,
            jumps: b.jumps,
            drains: b.drains,
        }
    }

    /// `recovering`: the Worker was restarted and registers or reconciles again; a crash there
    /// is paid from `recovery_crashes` first.
    fn afford(&self, cost: Cost, recovering: bool) -> Option<Self> {
        let mut next = *self;
        let left = match cost {
            Cost::Free => return Some(next),
            Cost::Fault => &mut next.faults,
            Cost::Crash if recovering && next.recovery_crashes > 0 => &mut next.recovery_crashes,
            Cost::Crash => &mut next.crashes,
            Cost::Entropy => &mut next.entropy,
        };
        *left = left.checked_sub(1)?;
        Some(next)
    }
}

struct Node {
    sim: Sim,
    budget: Budget,
    depth: usize,
}

/// A 128-bit streaming hash (two independent multiply-fold lanes over 8-byte words) for state
/// fingerprints. Bytes are buffered into words, so many tiny writes cost little.
#[derive(Debug)]
struct Fp128 {
    a: u64,
    b: u64,
    word: u64,
    fill: u32,
    total: u64,
}

const P: [u64; 4] = [
    0xa076_1d64_78bd_642f,
    0xe703_7ed1_a0b4_28db,
    0x8ebc_6af0_9c88_c6e3,
    0x5899_65cc_7537_4cc3,
];

fn fold(x: u64, y: u64) -> u64 {
    let r = u128::from(x) * u128::from(y);
    (r as u64) ^ ((r >> 64) as u64)
}

impl Fp128 {
    fn new() -> Self {
        Self {
            a: P[2],
            b: P[3],
            word: 0,
            fill: 0,
            total: 0,
        }
    }

    fn mix(&mut self, word: u64) {
        self.a = fold(self.a ^ word ^ P[0], P[1] ^ word.rotate_left(23));
        self.b = fold(self.b ^ word.rotate_left(41) ^ P[2], P[3] ^ word);
    }

    /// Appends up to `8 - fill` bytes to the pending word.
    fn append(&mut self, bytes: &[u8]) -> usize {
        let take = bytes.len().min(8 - self.fill as usize);
        let mut padded = [0u8; 8];
        padded[..take].copy_from_slice(&bytes[..take]);
        self.word |= u64::from_le_bytes(padded) << (8 * self.fill);
        self.fill += take as u32;
        if self.fill == 8 {
            self.mix(self.word);
            self.word = 0;
            self.fill = 0;
        }
        take
    }

    fn value(mut self) -> u128 {
        let tail = self.word ^ (self.total << 8) ^ u64::from(self.fill);
        self.mix(tail);
        let a = fold(self.a ^ P[1], self.b ^ P[0]);
        let b = fold(self.b ^ P[3], self.a ^ P[2]);
        (u128::from(a) << 64) | u128::from(b)
    }
}

impl Hasher for Fp128 {
    fn write(&mut self, bytes: &[u8]) {
        self.total = self.total.wrapping_add(bytes.len() as u64);
        let mut rest = bytes;
        if self.fill != 0 {
            let taken = self.append(rest);
            rest = &rest[taken..];
        }
        let mut chunks = rest.chunks_exact(8);
        for chunk in &mut chunks {
            let mut word = [0u8; 8];
            word.copy_from_slice(chunk);
            self.mix(u64::from_le_bytes(word));
        }
        let tail = chunks.remainder();
        if !tail.is_empty() {
            self.append(tail);
        }
    }

    fn finish(&self) -> u64 {
        self.a ^ self.b.rotate_left(32)
    }
}

/// The search key: the whole simulation (history included) and the budget left.
fn fingerprint(node: &Node) -> u128 {
    let mut h = Fp128::new();
    node.sim.fingerprint(&mut h);
    hash_debug(&mut h, &node.budget);
    h.value()
}

/// The system state alone (no budget, clock, entropy position or evidence).
fn state_fingerprint(sim: &Sim) -> u128 {
    let mut h = Fp128::new();
    sim.state_fingerprint(&mut h);
    h.value()
}

/// The earliest lease expiry among unsettled records that lies after `after`.
fn jump_target(world: &World, after: UnixMillis) -> Option<UnixMillis> {
    world
        .disk
        .records
        .values()
        .map(|(r, _)| r)
        .filter(|r| !r.state.is_terminal())
        .map(|r| r.offer.lease.expires_at_ms)
        .filter(|t| *t > after)
        .min()
}

/// Whether the Worker is recovering: restarted (after a crash or a halt) and registering or
/// reconciling again, before it supervises and pulls.
fn recovering(sim: &Sim) -> bool {
    sim.restarts > 0 && matches!(sim.worker.phase(), Phase::Registering | Phase::Reconciling)
}

fn moves(node: &Node, menu: &Menu) -> Vec<(Move, Budget)> {
    let mut out = Vec::new();
    let sim = &node.sim;
    let b = node.budget;
    let recovering = recovering(sim);
    match &sim.status {
        Status::Busy => {
            // A local command is performed at once (the driver's loop): it alone is answered.
            let local = sim.outstanding().position(|action| !act::is_call(action));
            let answerable = sim
                .outstanding()
                .enumerate()
                .filter(|(index, _)| local.is_none_or(|l| l == *index));
            for (index, act) in answerable {
                for answer in sim.world.options(act, menu) {
                    if let Some(next) = b.afford(answer.cost(), recovering) {
                        let mv = match index {
                            0 => Move::Answer(answer),
                            other => Move::AnswerOther(other, answer),
                        };
                        out.push((mv, next));
                    }
                }
            }
            // Only calls outstanding and the Worker idle otherwise: a tick at its wake-up, as the
            // driver ticks while calls are in flight (a heartbeat or a renewal comes due).
            if let (Some(wake), None, true) = (sim.waiting, local, b.ticks > 0) {
                let at = wake.unwrap_or(sim.now).max(sim.now);
                out.push((
                    Move::Tick(at),
                    Budget {
                        ticks: b.ticks - 1,
                        ..b
                    },
                ));
            }
        }
        Status::Idle(wake) => {
            let at = wake.unwrap_or(sim.now).max(sim.now);
            if b.ticks > 0 {
                let next = Budget {
                    ticks: b.ticks - 1,
                    ..b
                };
                out.push((Move::Tick(at), next));
                if b.jumps > 0
                    && let Some(target) = jump_target(&sim.world, at)
                {
                    out.push((
                        Move::Jump(target),
                        Budget {
                            jumps: b.jumps - 1,
                            ..next
                        },
                    ));
                }
            }
            if b.drains > 0 && sim.worker.phase() != Phase::Finished {
                let next = Budget {
                    drains: b.drains - 1,
                    ..b
                };
                out.push((Move::Drain, next));
            }
        }
        Status::Halted(_) => out.push((Move::Restart, b)),
        Status::Stopped(_) => return out,
    }
    for event in sim.world.events(menu) {
        if let Some(next) = b.afford(World::event_cost(&event), recovering) {
            out.push((Move::Event(event), next));
        }
    }
    out
}

fn apply(sim: &mut Sim, mv: Move) {
    match mv {
        Move::Answer(answer) => sim.answer(answer),
        Move::AnswerOther(index, answer) => {
            sim.choose(index);
            sim.answer(answer);
        }
        Move::Event(event) => sim.event(event),
        Move::Tick(at) | Move::Jump(at) => {
            sim.advance_to(at);
            sim.tick();
        }
        Move::Drain => sim.request_drain(),
        Move::Restart => sim.crash(),
    }
}

fn describe(sim: &Sim, mv: Move) -> String {
    match (mv, &sim.pending) {
        (Move::Answer(answer), Some((_, act))) => {
            format!("{} -> {answer:?}", sim.world.summary(act))
        }
        (Move::AnswerOther(index, answer), _) => match sim.outstanding().nth(index) {
            Some(act) => format!("{} (out of order) -> {answer:?}", sim.world.summary(act)),
            None => format!("{mv:?}"),
        },
        (Move::Tick(at), _) => format!("tick at {at}"),
        (Move::Jump(at), _) => format!("jump to {at} and tick"),
        (other, _) => format!("{other:?}"),
    }
}

struct Search<'a> {
    model: &'a Model,
    guard: &'a dyn Guard,
    visited: BTreeMap<u128, u32>,
    states: BTreeSet<u128>,
    arena: Vec<(u32, String)>,
    stack: Vec<(Node, u32)>,
    report: Report,
}

impl Search<'_> {
    fn trace(&self, mut id: u32, last: String) -> Vec<String> {
        let mut out = std::vec![last];
        while let Some((parent, step)) = self.arena.get(id as usize) {
            out.push(step.clone());
            id = *parent;
        }
        out.reverse();
        out
    }

    fn admit(&mut self, node: Node, fp: u128, parent: u32, step: String) {
        let id = u32::try_from(self.arena.len()).unwrap_or(u32::MAX);
        self.visited.insert(fp, id);
        self.arena.push((parent, step));
        self.report.deepest = self.report.deepest.max(node.depth);
        if self.states.insert(state_fingerprint(&node.sim)) {
            self.coverage(&node.sim);
        }
        self.stack.push((node, id));
    }

    fn coverage(&mut self, sim: &Sim) {
        for (record, _) in sim.world.disk.records.values() {
            let key = match record.recovery_reason {
                Some(reason) => format!("{}({reason})", record.state),
                None => format!("{}", record.state),
            };
            *self.report.coverage.entry(key).or_default() += 1;
        }
        let plane = &sim.world.plane;
        let superseded = plane
            .runs
            .values()
            .any(|r| r.status == crate::testkit::world::CpStatus::Superseded);
        if superseded {
            let key = if plane.lost_attempts.is_empty() {
                "plane:redelivered-same-attempt"
            } else {
                "plane:redelivered-new-attempt"
            };
            *self.report.coverage.entry(String::from(key)).or_default() += 1;
        }
    }

    fn record(&mut self, violations: Vec<Violation>, parent: u32, step: String) {
        self.report.violations += 1;
        for v in violations {
            if self.report.found.iter().all(|f| f.invariant != v.invariant) {
                let trace = self.trace(parent, step.clone());
                self.report.found.push(Found {
                    invariant: v.invariant,
                    detail: v.detail,
                    trace,
                });
            }
        }
    }

    fn expand(&mut self, node: &Node, id: u32) {
        // A second crash during recovery: the path already spent a crash, and the Worker
        // registers or reconciles again.
        let spent = node.budget.crashes < self.model.bounds.crashes
            || node.budget.recovery_crashes < self.model.bounds.recovery_crashes;
        let recovering = spent && recovering(&node.sim);
        for (mv, budget) in moves(node, &self.model.menu) {
            self.report.transitions += 1;
            let crash = matches!(
                mv,
                Move::Answer(Answer::CrashBefore | Answer::CrashAfter)
                    | Move::AnswerOther(_, Answer::CrashBefore | Answer::CrashAfter)
            );
            if recovering && crash {
                self.report.crashes_during_recovery += 1;
            }
            if matches!(mv, Move::AnswerOther(..)) {
                self.report.out_of_order += 1;
            }
            let mut sim = node.sim.fork();
            let outcome = self.guard.run(&mut || apply(&mut sim, mv));
            let mut violations = std::mem::take(&mut sim.world.violations);
            if let Err(message) = outcome {
                violations.push(Violation {
                    invariant: "panic",
                    detail: message,
                });
            }
            if !violations.is_empty() {
                let step = describe(&node.sim, mv);
                self.record(violations, id, step);
                continue;
            }
            let child = Node {
                sim,
                budget,
                depth: node.depth + 1,
            };
            let fp = fingerprint(&child);
            if !self.visited.contains_key(&fp) {
                self.admit(child, fp, id, describe(&node.sim, mv));
            }
        }
    }
}

/// Explores `model` exhaustively within its bounds.
#[must_use]
pub fn explore(model: &Model, guard: &dyn Guard) -> Report {
    let mut search = Search {
        model,
        guard,
        visited: BTreeMap::new(),
        states: BTreeSet::new(),
        arena: Vec::new(),
        stack: Vec::new(),
        report: Report::default(),
    };
    for root in &model.roots {
        let mut sim = root.fork();
        sim.window = usize::from(model.bounds.outstanding.max(1));
        let node = Node {
            sim,
            budget: Budget::new(&model.bounds),
            depth: 0,
        };
        let fp = fingerprint(&node);
        if !search.visited.contains_key(&fp) {
            search.admit(node, fp, u32::MAX, String::from("start"));
        }
    }
    while let Some((node, id)) = search.stack.pop() {
        if search.visited.len() >= model.bounds.max_states {
            search.report.truncated = true;
            break;
        }
        search.expand(&node, id);
    }
    search.report.histories = search.visited.len();
    search.report.states = search.states.len();
    search.report
}

/// The Worker configuration of the model checks: the edge profile with one concurrent Run, so
/// that the Worker pulls again only once its Run is settled.
#[must_use]
pub fn model_config() -> ql_worker_core::worker::WorkerConfig {
    let mut config = crate::testkit::config();
    config.max_concurrent_runs = 1;
    config
}

fn roots(worlds: Vec<World>, slots: u16) -> Vec<Sim> {
    let start = UnixMillis::new(1_000).unwrap_or(UnixMillis::ZERO);
    let mut config = model_config();
    config.max_concurrent_runs = slots;
    worlds
        .into_iter()
        .map(|world| Sim::new(config.clone(), world, start))
        .collect()
}

/// Issue 4's model: the Pull coordinator and the Processor together, from an empty inbox to a
/// running (or failed, or recovery) Run. Every ACK answer, every executor outcome, clean and
/// uncertain write failures, transient read failures, Secrets and spool failures, Session
/// answers (register, heartbeat, transition: loss, 409, malformed, commit then lost response),
/// entropy variations, and up to two crashes per path, each before or after any command (so
/// the second may land while the Worker recovers from the first). Two roots: the sample revision (a
/// timeout, so the starting ACK carries a deadline) and one with a Secret binding (the Secrets
/// call). Processes never exit here; supervision answers are healthy.
#[must_use]
pub fn start_path() -> Model {
    // Everything but the finish path's families.
    let menu = Menu {
        receipt_answers: false,
        upload_answers: false,
        completion_answers: false,
        lease_answers: false,
        stop_answers: false,
        exits: false,
        duplicates: false,
        unsafe_storage: false,
        damaged_answers: false,
        ..Menu::everything()
    };
    let secret = crate::testkit::secret_revision();
    Model {
        name: "start-path",
        menu,
        bounds: Bounds {
            faults: 2,
            crashes: 2,
            recovery_crashes: 0,
            entropy: 1,
            ticks: 7,
            jumps: 0,
            drains: 0,
            outstanding: 1,
            max_states: 2_000_000,
        },
        roots: roots(
            std::vec![
                World::one_offer(1),
                World::new(2, std::vec![OfferTemplate::with_revision(1, secret)]),
            ],
            1,
        ),
    }
}

/// Issue 15's model: the start path with re-delivery ([`World::with_reoffers`]). One lease
/// expiry jump lets `o1`'s lease run out wherever the Worker is idle; the next fresh claim then
/// gets the same Run again under a new offer id — the same Attempt if no activation call
/// reached the plane, else a new Attempt — and every spawn is checked for at most once per
/// offer, Attempt and Run. Two faults, one crash per path (the faults and the crash are what
/// leave `o1` behind, unstarted or started, when its lease expires); a second crash during
/// recovery is left to the other two models (it more than doubles this one: 930 940 histories,
/// 49 s of CPU).
#[must_use]
pub fn redelivery() -> Model {
    let menu = Menu {
        crashes: true,
        record_faults: true,
        ack_answers: true,
        spawn_answers: true,
        ..Menu::default()
    };
    Model {
        name: "redelivery",
        menu,
        bounds: Bounds {
            faults: 2,
            crashes: 1,
            recovery_crashes: 0,
            entropy: 0,
            ticks: 10,
            jumps: 1,
            drains: 0,
            outstanding: 1,
            max_states: 2_000_000,
        },
        roots: roots(std::vec![World::one_offer(1).with_reoffers()], 1),
    }
}

/// Issue 5's model: the start-path harness extended to the finish path and supervision, with
/// two slots (so the Worker keeps pulling — and the control plane answers `idle` — while its Run
/// is supervised, which is how a Pull racing fail-closed shows). Processes exit (genuine,
/// forged, malformed or missing receipts); every upload, completion and lease-control answer
/// (including commit-then-lost-response and replays), stop outcomes, Session answers, spool
/// and receipt-store faults, clean and uncertain record and claim write failures, transient
/// read failures, every executor outcome (for the spawn crash window), a crash before or after
/// any command plus a second one during the recovery after a restart, a jump past the lease
/// expiry and a drain request.
#[must_use]
pub fn finish_path() -> Model {
    // Everything but the start path's own answers and entropy variations.
    let menu = Menu {
        ack_answers: false,
        offer_answers: false,
        secret_answers: false,
        entropy_variants: false,
        duplicates: false,
        unsafe_storage: false,
        damaged_answers: false,
        ..Menu::everything()
    };
    Model {
        name: "finish-path",
        menu,
        bounds: Bounds {
            faults: 2,
            crashes: 1,
            recovery_crashes: 1,
            entropy: 0,
            ticks: 6,
            jumps: 1,
            drains: 1,
            outstanding: 1,
            max_states: 2_000_000,
        },
        roots: roots(std::vec![World::one_offer(1)], 2),
    }
}

/// Issue 16's model: the whole lifecycle with the driver's calls concurrent. The driver lets
/// two commands be outstanding at once ([`Bounds::outstanding`]) and the explorer answers them
/// in either order: a heartbeat beside a starting ACK, a Pull beside a supervision pass, a
/// renewal beside an upload, a record read beside a call. Two slots, so the Worker keeps
/// pulling while its Run runs. Every ACK, upload, completion, lease-control and Session answer,
/// process exits with every receipt, clean and uncertain record write failures, one fault and
/// one crash (before or after any command, every outstanding command lost with it) per path, a
/// jump past the lease expiry.
#[must_use]
pub fn concurrency() -> Model {
    // The finish path's choices, with every ACK answer and without spool faults.
    let menu = Menu {
        ack_answers: true,
        log_faults: false,
        ..finish_path().menu
    };
    Model {
        name: "concurrency",
        menu,
        bounds: Bounds {
            faults: 1,
            crashes: 1,
            recovery_crashes: 1,
            entropy: 0,
            ticks: 6,
            jumps: 1,
            drains: 0,
            outstanding: 2,
            max_states: 2_000_000,
        },
        roots: roots(std::vec![World::one_offer(1)], 2),
    }
}

/// The walks' model ([`walk`]): the whole lifecycle with every family of answers and events,
/// three Runs (one with a Secret binding), up to three commands outstanding, the control plane
/// re-delivering expired Runs, and a budget far beyond the exhaustive models' (a walk takes one
/// path, so its budget bounds the path, not a search). Five roots: two slots, and one slot (the
/// Worker pulls again only once its Run is settled), over an empty inbox; two slots over an
/// inbox a previous incarnation left ([`preloaded`]), without and with a `launching` record;
/// and one slot behind a small inbox with the driver's retention ([`small_inbox`]).
#[must_use]
pub fn walks() -> Model {
    let secret = crate::testkit::secret_revision();
    let world = World::new(
        0,
        std::vec![
            OfferTemplate::sample(1),
            OfferTemplate::refused(10),
            OfferTemplate::with_revision(2, secret),
            OfferTemplate::sample(3),
        ],
    )
    .with_reoffers();
    let mut starts = roots(std::vec![world.clone()], 2);
    starts.extend(roots(std::vec![world.clone()], 1));
    starts.extend(roots(
        std::vec![
            preloaded(world.clone(), false),
            preloaded(world.clone(), true)
        ],
        2,
    ));
    starts.push(small_inbox(world));
    Model {
        name: "walks",
        menu: Menu::everything(),
        bounds: Bounds {
            faults: 40,
            crashes: 4,
            recovery_crashes: 2,
            entropy: 4,
            ticks: 250,
            jumps: 3,
            drains: 1,
            outstanding: 3,
            max_states: 0,
        },
        roots: starts,
    }
}

/// Places in the inbox of the walks' small-inbox root ([`small_inbox`]).
pub const SMALL_INBOX: u16 = 3;

/// `world` behind an inbox of [`SMALL_INBOX`] places, one slot, with the driver's retention
/// (`Sim::retention`: high-water mark one record): the inbox fills with settled records, and
/// work goes on only as retention frees places (issue 14).
fn small_inbox(mut world: World) -> Sim {
    world.disk.capacity = usize::from(SMALL_INBOX);
    let mut config = model_config();
    config.capacity = ql_worker_core::listing::Capacity::new(u64::from(SMALL_INBOX))
        .expect("a capacity in 1..=1024");
    let start = UnixMillis::new(1_000).unwrap_or(UnixMillis::ZERO);
    let mut sim = Sim::new(config, world, start);
    sim.retention = true;
    sim
}

/// `world` over an inbox a previous incarnation left (the Worker starts as after a restart):
/// o4 `started` and o5 `running_acknowledged`, their processes running; o6 `start_failed`; o7
/// `accepted`; o8 `completion_acknowledged`. With `launching`, also o9 `launching`, its process
/// running and its handle published (the restart rule then fails the Worker closed).
fn preloaded(mut world: World, launching: bool) -> World {
    use ql_worker_core::record::State;
    let records = [
        (4, State::Started, true),
        (5, State::RunningAcknowledged, true),
        (6, State::StartFailed, false),
        (7, State::Accepted, false),
        (8, State::CompletionAcknowledged, false),
    ];
    for (n, state, running) in records {
        world.seed(n, crate::testkit::record(n, state), running);
    }
    if launching {
        let record = crate::testkit::record(9, State::Launching);
        let attempt = record.offer.candidate.attempt_id.clone();
        world.seed(9, record, true);
        let handle = crate::testkit::seeded_handle(9);
        world
            .disk
            .published
            .insert(attempt, String::from(handle.as_str()));
    }
    world
}
