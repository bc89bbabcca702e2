//! Walks: one long path through the model checks' world per input, where the explorer takes
//! every path up to short bounds.
//!
//! A walk starts at a root [`Sim`] and, step by step, reads one byte of its input (zeros past
//! the end, as the fuzz targets read theirs) and takes one of the moves the explorer would
//! take from there ([`moves`]: every answer the [`Menu`] allows to every answerable command, a
//! tick, a jump past a lease expiry, a drain, a restart, a process exit), paid from the same
//! [`Bounds`]. An even byte takes the healthy move (the healthy answer, else a tick, else a
//! restart), an odd one the move its upper bits pick. With [`Walk::clock_steps`], an idle step
//! may also step the host's wall clock an hour back or forward (the monotonic clock never
//! steps).
//!
//! Every move is checked by the world's invariants, as in the explorer. When the input is used
//! up, a **settling** phase follows: healthy answers, ticks at the Worker's wake-ups, every
//! running process exits with its genuine receipt, a stopped or halted Worker is restarted.
//! The walk ends when the control plane has nothing left to offer, no process runs, every
//! record is terminal or `recovery_required`, and the Worker is idle; if that does not happen
//! within [`SETTLE_MS`] of simulated time plus the largest wall-clock skew the walk reached (or
//! within [`SETTLE_MOVES`]), the walk reports a `liveness` violation.

use super::{Budget, Found, Guard, Model, Move, Node, apply, describe, moves};
use crate::fuzzing::bytes::Bytes;
use crate::testkit::sim::{Sim, Status};
use crate::testkit::world::{Answer, Event, ProcessState, ReceiptKind, check};
use ql_worker_core::record::State;

/// Moves of the fuzzed part of a walk, at most.
pub const MAX_MOVES: usize = 3_000;
/// Simulated time the settling phase may take, beyond the largest wall-clock skew the walk
/// reached, before the walk reports a `liveness` violation. (A receipt written while the clock
/// was ahead "finished in the future" once it is set right; it authenticates once the clock has
/// caught up, so the skew is added.)
pub const SETTLE_MS: u64 = 600_000;
/// Moves of the settling phase, at most, whatever the time (a Worker that spins without letting
/// time pass is not settling either).
pub const SETTLE_MOVES: usize = 400_000;
/// Trace lines kept (the last ones) for a violation's report.
const TRACE_LINES: usize = 4000;
/// One hour, the size of a wall-clock step.
const HOUR_MS: i64 = 3_600_000;

/// How the Runs of a walk (or of the cadence phase) ended, counted from the records the Worker
/// itself moved into a final state (a record counts once, under the state it ends in; records
/// the driver's retention removed count under the state they left in).
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

/// What a walk explores: the model's menu and bounds (the budget of the fuzzed part), its root,
/// and whether the host's wall clock may step.
#[derive(Debug)]
pub struct Walk<'m> {
    /// The model (menu, bounds, roots).
    pub model: &'m Model,
    /// Which root the walk starts from.
    pub root: usize,
    /// Whether an idle step may step the wall clock by an hour, back or forward.
    pub clock_steps: bool,
}

/// What a walk did.
#[derive(Clone, Debug, Default)]
pub struct Walked {
    /// Moves taken (fuzzed part and settling phase).
    pub moves: usize,
    /// Moves that were not the healthy one (faults, crashes, alternative answers, out-of-order
    /// answers, drains, jumps, clock steps, faulty exits).
    pub unhealthy: usize,
    /// Wall-clock steps taken.
    pub clock_steps: usize,
    /// Answers delivered twice ([`Answer::Duplicated`]), each second delivery checked refused.
    pub duplicates: usize,
    /// Offers the Worker must refuse (pinned to another digest) the control plane delivered,
    /// each checked never stored (`refused-offer-stored`).
    pub refusable: u32,
    /// Replays of a claim the control plane fenced (409 `worker_offer_fenced`, reference §2.2),
    /// each one's claim then cleared (`stored-before-clear` allows it: the plane will not
    /// deliver that offer id again).
    pub fenced: u32,
    /// Halts of the Worker, each checked licensed by the answer it halted on (`halt-licensed`).
    pub halts: usize,
    /// The largest distance (ms, either way) between the host's wall clock and the true time.
    pub max_skew_ms: u64,
    /// The first broken invariant (or panic, or `liveness`), with the last moves before it.
    pub found: Option<Found>,
    /// How the Runs ended (when the walk settled), from the durable records.
    pub ended: RunOutcomes,
}

/// Whether `mv` is the healthy move of its kind.
fn healthy(mv: &Move) -> bool {
    matches!(
        mv,
        Move::Answer(Answer::Ok)
            | Move::AnswerOther(_, Answer::Ok)
            | Move::Tick(_)
            | Move::Restart
            | Move::Event(Event::Exit {
                receipt: ReceiptKind::Genuine,
                ..
            })
    )
}

/// The healthy move among `options`: the healthy answer, else a tick, else a restart.
fn pick_healthy(options: &[(Move, Budget)]) -> Option<(Move, Budget)> {
    let rank = |mv: &Move| match mv {
        Move::Answer(Answer::Ok) | Move::AnswerOther(_, Answer::Ok) => 0,
        Move::Tick(_) => 1,
        Move::Restart => 2,
        _ => 3,
    };
    options
        .iter()
        .filter(|(mv, _)| rank(mv) < 3)
        .min_by_key(|(mv, _)| rank(mv))
        .copied()
}

/// Whether the walk has settled: nothing left to offer, no process running, every record
/// terminal, `recovery_required` or dormant (before the spawn barrier with its lease expired:
/// it can never start, and the control plane reclaims its Run), the Worker idle with nothing
/// outstanding, and no `completion_acknowledged` record's receipt (which holds the capability)
/// left on disk. A Worker that
/// fails closed (a `recovery_required` record) takes no more offers and launches nothing, so
/// then offers may be left and records before the spawn barrier may stay where they are.
fn settled(sim: &Sim) -> bool {
    let world = &sim.world;
    let fail_closed = check::fail_closed_by(world.disk.records.values().map(|(r, _)| r)).is_some();
    matches!(sim.status, Status::Idle(_))
        && sim.pending.is_none()
        && (world.plane.templates.is_empty() || fail_closed || full_for_good(sim))
        && world
            .supervisor
            .processes
            .iter()
            .all(|p| p.state != ProcessState::Running)
        && world.disk.records.values().all(|(r, _)| {
            r.state.is_terminal()
                || r.state == State::RecoveryRequired
                || r.is_dormant(sim.now)
                || (fail_closed && r.state.is_pre_barrier())
        })
        // A settled Run's receipt (it holds the capability) is gone.
        && world.disk.records.values().all(|(r, _)| {
            r.state != State::CompletionAcknowledged
                || !world.disk.receipts.contains_key(&r.offer.candidate.attempt_id)
        })
}

/// The inbox is full, and retention may free no place in it: every record is one only an
/// operator removes (SPEC: retention removes settled records, never a non-terminal one; a
/// dormant or `recovery_required` record is archived by `ql-worker recover --archive`). The
/// Worker then rightly takes no offer. A full inbox with a removable record is not settled:
/// retention must free it and work must go on (issue 14).
fn full_for_good(sim: &Sim) -> bool {
    use ql_worker_core::retention::may_remove_in;
    let disk = &sim.world.disk;
    sim.retention
        && disk.records.len() >= disk.capacity
        && disk.records.values().all(|(r, _)| !may_remove_in(r.state))
}

/// The settling phase's move: a running process exits healthily, else the healthy answer to
/// the pending command, else a tick at the Worker's wake-up; a stopped or halted Worker is
/// restarted.
fn settling_move(sim: &Sim) -> Move {
    let running = sim
        .world
        .supervisor
        .processes
        .iter()
        .position(|p| p.state == ProcessState::Running);
    match (&sim.status, running) {
        (Status::Halted(_) | Status::Stopped(_), _) => Move::Restart,
        (_, Some(index)) if sim.pending.is_none() || sim.waiting.is_some() => {
            Move::Event(Event::Exit {
                index,
                code: 0,
                receipt: ReceiptKind::Genuine,
            })
        }
        (Status::Busy, _) => {
            // A local command is performed first, as the driver does.
            match sim
                .outstanding()
                .position(|a| !crate::testkit::act::is_call(a))
            {
                Some(index) if index > 0 => Move::AnswerOther(index, Answer::Ok),
                _ => Move::Answer(Answer::Ok),
            }
        }
        (Status::Idle(wake), _) => Move::Tick(wake.unwrap_or(sim.now).max(sim.now)),
    }
}

/// How the Runs ended, from the durable records (a completion's exit code is its process's).
pub(crate) fn ended(sim: &Sim) -> RunOutcomes {
    let world = &sim.world;
    let mut out = RunOutcomes::default();
    let stored = world.disk.records.values().map(|(record, _)| record);
    // Records the driver's retention removed (settled ones) count under the state they left in.
    for record in stored.chain(&sim.retained) {
        let exit = world
            .supervisor
            .of_offer(&record.offer.offer_id)
            .find_map(|p| match p.state {
                ProcessState::Exited(code) => Some(u64::from(code)),
                ProcessState::Running => None,
            });
        out.count(record.state, exit);
    }
    out
}

struct Walker<'g> {
    node: Node,
    guard: &'g dyn Guard,
    trace: std::collections::VecDeque<String>,
    walked: Walked,
}

impl Walker<'_> {
    /// Takes `mv`; `false` when it broke an invariant (then [`Walked::found`] says which).
    fn take(&mut self, mv: Move, budget: Budget) -> bool {
        let step = describe(&self.node.sim, mv);
        self.walked.moves += 1;
        if !healthy(&mv) {
            self.walked.unhealthy += 1;
        }
        let sim = &mut self.node.sim;
        let was_halted = matches!(sim.status, Status::Halted(_));
        let outcome = self.guard.run(&mut || apply(sim, mv));
        if !was_halted && matches!(self.node.sim.status, Status::Halted(_)) {
            self.walked.halts += 1;
        }
        self.node.budget = budget;
        self.note(step);
        let mut violations = std::mem::take(&mut self.node.sim.world.violations);
        if let Err(message) = outcome {
            violations.push(crate::testkit::world::Violation {
                invariant: "panic",
                detail: message,
            });
        }
        match violations.into_iter().next() {
            None => true,
            Some(v) => {
                self.found(v.invariant, v.detail);
                false
            }
        }
    }

    fn note(&mut self, step: String) {
        if self.trace.len() == TRACE_LINES {
            self.trace.pop_front();
        }
        self.trace.push_back(step);
    }

    fn found(&mut self, invariant: &'static str, detail: String) {
        self.walked.found = Some(Found {
            invariant,
            detail,
            trace: self.trace.iter().cloned().collect(),
        });
    }
}

/// Walks `walk`'s model from its root as `data` says, then settles; see the module docs.
#[must_use]
pub fn walk(walk: &Walk<'_>, data: &[u8], guard: &dyn Guard) -> Walked {
    let model = walk.model;
    let mut sim = model.roots[walk.root % model.roots.len()].fork();
    sim.window = usize::from(model.bounds.outstanding.max(1));
    let mut walker = Walker {
        node: Node {
            sim,
            budget: Budget::new(&model.bounds),
            depth: 0,
        },
        guard,
        trace: std::collections::VecDeque::new(),
        walked: Walked::default(),
    };
    let mut r = Bytes::new(data);
    while !r.is_empty() && walker.walked.moves < MAX_MOVES {
        let byte = r.u8();
        let sim = &walker.node.sim;
        if walk.clock_steps && byte % 16 == 15 && matches!(sim.status, Status::Idle(_)) {
            let ms = if byte & 32 == 0 { -HOUR_MS } else { HOUR_MS };
            walker.node.sim.step_wall_clock(ms);
            walker.walked.clock_steps += 1;
            let skew = walker.node.sim.wall_skew.unsigned_abs();
            walker.walked.max_skew_ms = walker.walked.max_skew_ms.max(skew);
            walker.walked.unhealthy += 1;
            walker.note(format!("wall clock stepped {ms:+} ms"));
            continue;
        }
        let options = moves(&walker.node, &model.menu);
        let chosen = if byte & 1 == 0 {
            pick_healthy(&options)
        } else {
            options
                .get(usize::from(byte >> 1) % options.len().max(1))
                .copied()
        };
        let Some((mv, budget)) = chosen.or_else(|| options.first().copied()) else {
            break;
        };
        if matches!(
            mv,
            Move::Answer(Answer::Duplicated) | Move::AnswerOther(_, Answer::Duplicated)
        ) {
            walker.walked.duplicates += 1;
        }
        if !walker.take(mv, budget) {
            return walker.walked;
        }
    }
    // Settling: no budget is spent (only healthy moves are taken), and the host's wall clock
    // is right again (NTP corrected it).
    let skew = walker.node.sim.wall_skew;
    if skew != 0 {
        walker.node.sim.step_wall_clock(-skew);
        walker.note(format!("wall clock stepped {:+} ms", -skew));
    }
    let deadline = walker
        .node
        .sim
        .now
        .saturating_add(SETTLE_MS + walker.walked.max_skew_ms);
    for _ in 0..SETTLE_MOVES {
        if walker.node.sim.now > deadline {
            break;
        }
        if settled(&walker.node.sim) {
            walker.walked.ended = ended(&walker.node.sim);
            walker.walked.refusable = walker.node.sim.world.plane.refusable_delivered;
            walker.walked.fenced = walker.node.sim.world.plane.fenced_replays;
            return walker.walked;
        }
        let mv = settling_move(&walker.node.sim);
        let budget = walker.node.budget;
        if !walker.take(mv, budget) {
            return walker.walked;
        }
    }
    let sim = &walker.node.sim;
    let unsettled: Vec<String> = sim
        .world
        .disk
        .records
        .values()
        .map(|(r, _)| format!("{}: {}", sim.world.alias(&r.offer.offer_id), r.state))
        .collect();
    walker.found(
        "liveness",
        format!(
            "not settled within {} ms ({} moves) of healthy moves: status {:?}, templates \
             left {}, records {unsettled:?}",
            SETTLE_MS + walker.walked.max_skew_ms,
            walker.walked.moves,
            sim.status,
            sim.world.plane.templates.len()
        ),
    );
    walker.walked
}

/// The fuzz target `machine_walk`: walks the walks' model ([`super::walks`]) as `data` says,
/// with wall-clock steps, and panics on the first broken invariant (with the last moves). The
/// first byte picks the root (modulo the model's five), the rest is the walk; the empty input
/// walks root 0 healthily.
///
/// # Panics
/// When the walk broke an invariant, panicked in the core, or did not settle.
#[must_use]
pub fn fuzz(data: &[u8]) -> Walked {
    let model = super::walks();
    let (root, data) = match data.split_first() {
        Some((root, rest)) => (usize::from(*root), rest),
        None => (0, data),
    };
    let plan = Walk {
        model: &model,
        root,
        clock_steps: true,
    };
    let walked = walk(&plan, data, &super::Unguarded);
    if let Some(found) = &walked.found {
        panic!(
            "INVARIANT {}: {}\n    {}",
            found.invariant,
            found.detail,
            found.trace.join("\n    ")
        );
    }
    walked
}
