//! Deterministic whole-Worker simulation (issue 10, item 1; `docs/simulation.md`), on the one
//! simulated world (`ql_worker_sim::testkit::world::World`) of the model checks and the walks.
//!
//! One `u64` seed decides everything: a splitmix64 stream picks the walk's root (an empty inbox
//! with two slots or one, an inbox a previous incarnation left without or with a `launching`
//! record, a small inbox with the driver's retention), a fault rate, and the walk's input bytes
//! (an even byte takes the healthy move, an odd one the fault, alternative answer, crash, drain,
//! time jump or clock step its upper bits pick: `testkit::explore::walk`). The world's checkers
//! run on every command; the walk ends with a settling phase in which every Run must settle
//! (`liveness`). In half the seeds a cadence phase follows on a fresh world
//! (`testkit::cadence`): calls that take the time a seeded link and control plane give them,
//! checked for the Session's and the leases' cadence.
//!
//! * `simulation`: `QL_SIM_SEEDS` seeds (10,000 in release, 500 in debug builds), or the single
//!   seed `QL_SIM_SEED` with its cadence trail. Prints
//!   `simulation: <N> seeds, <V> violations, runs <S> succeeded <F> failed <X> start-failed <R>
//!   recovery` after any failing seeds, then the cadence line, and asserts `V == 0`
//!   (`docs/simulation.md` says what each count means).
//! * `checkers_can_fail`: the cadence phase's lying Workers must make its checkers report
//!   violations (the world's other lies are `core/tests/walks.rs::walks_catch_a_broken_host`'s).
//! * `same_seed_same_result`: a seed replays move for move.

use std::time::Instant;

use ql_worker_sim::testkit::cadence::{self, CadenceStats, Lie};
use ql_worker_sim::testkit::explore::walk::{self, RunOutcomes, Walk, Walked};
use ql_worker_sim::testkit::explore::{self, CatchPanics, Model};

const REPLAY: &str = "cargo test --release -p ql-worker-tests --test simulation -- --nocapture";

/// The seed stream (splitmix64).
use ql_worker_tests::splitmix::SplitMix64 as SplitMix;

/// Everything a seed decides.
#[derive(Debug)]
struct Case {
    /// The walk's root (`explore::walks`' five).
    root: usize,
    /// Chance of an odd (not the healthy) byte, per 1024.
    fault_rate: u64,
    /// The walk's input.
    data: Vec<u8>,
    /// The cadence phase's seed, in half the seeds.
    link: Option<u64>,
}

/// Fault rates per 1024 bytes: rare, occasional, frequent, hostile.
const FAULT_RATES: [u64; 4] = [16, 64, 160, 320];

fn case(seed: u64) -> Case {
    let mut g = SplitMix(seed);
    let root = usize::try_from(g.below(5)).unwrap_or(0);
    let fault_rate = *g.pick(&FAULT_RATES);
    let len = 200 + usize::try_from(g.below(1_000)).unwrap_or(0);
    let data = (0..len)
        .map(|_| {
            // Even: the healthy move; odd: another, its upper bits pick which.
            let byte = g.byte();
            if g.below(1024) < fault_rate {
                byte | 1
            } else {
                byte & !1
            }
        })
        .collect();
    let mut l = SplitMix(seed ^ 0x1607_1607_1607_1607);
    let link = (l.below(2) == 0).then(|| l.next_u64());
    Case {
        root,
        fault_rate,
        data,
        link,
    }
}

/// What a seed did: the walk, then the cadence phase if the seed has one.
#[derive(Debug)]
struct Seeded {
    walked: Walked,
    cadence: Option<(CadenceStats, RunOutcomes)>,
}

/// Runs `seed` (the cadence phase with `lie`, if any; `record` keeps its trail for `trace`);
/// `Err` holds the first violation, `<name>: <detail>`, with the walk's last moves.
fn run_seed(
    model: &Model,
    seed: u64,
    lie: Option<Lie>,
    trace: Option<&mut dyn FnMut(&str)>,
) -> Result<Seeded, String> {
    let case = case(seed);
    let plan = Walk {
        model,
        root: case.root,
        clock_steps: true,
    };
    let walked = walk::walk(&plan, &case.data, &CatchPanics);
    if let Some(found) = &walked.found {
        return Err(format!(
            "{}: {}\n    {}",
            found.invariant,
            found.detail,
            found.trace.join("\n    ")
        ));
    }
    let record = trace.is_some();
    let cadence = case.link.map(|link| cadence::run(link, lie, record));
    if let (Some(trace), Some(phase)) = (trace, &cadence) {
        for line in &phase.trail {
            trace(line);
        }
    }
    match cadence {
        Some(phase) => match phase.violations.first() {
            Some(violation) => Err(violation.clone()),
            None => Ok(Seeded {
                walked,
                cadence: Some((phase.stats, phase.ended)),
            }),
        },
        None => Ok(Seeded {
            walked,
            cadence: None,
        }),
    }
}

/// What the seeds of a run did, summed.
#[derive(Debug, Default)]
struct Totals {
    moves: u64,
    unhealthy: u64,
    clock_steps: u64,
    duplicates: u64,
    halts: u64,
    runs: RunOutcomes,
    cadence: CadenceTotals,
}

/// The cadence phases' figures.
#[derive(Debug, Default)]
struct CadenceTotals {
    phases: u64,
    timely: u64,
    runs: u64,
    succeeded: u64,
    /// Timely phases: the longest Session gap, and the largest gap / bound (per mille).
    heartbeat_gap: u64,
    heartbeat_ratio: u64,
    /// Timely phases: the longest renewal gap of a running Run, the largest gap / bound (per
    /// mille), and the phases whose longest renewal gap was at most a third of the lease.
    renewal_gap: u64,
    renewal_ratio: u64,
    renewal_third: u64,
    outstanding: u32,
    timeouts: u64,
    /// Runs of timely phases, of which succeeded (all: `cadence-no-run-lost`).
    timely_runs: u64,
    timely_succeeded: u64,
    /// Runs that lost their lease, in slow phases (none in timely ones).
    slow_lease_lost: u64,
    /// Replays of a claim the control plane fenced, in slow phases (none in timely ones).
    slow_fenced: u64,
}

/// A third of the simulated control plane's 30 s lease.
const LEASE_THIRD_MS: u64 = 10_000;

impl CadenceTotals {
    fn add(&mut self, c: &CadenceStats) {
        let permille = |gap: u64, bound: u64| gap * 1_000 / bound.max(1);
        self.phases += 1;
        self.runs += u64::from(c.runs);
        self.succeeded += u64::from(c.succeeded);
        self.outstanding = self.outstanding.max(c.max_outstanding);
        self.timeouts += u64::from(c.timeouts);
        if c.timely {
            self.timely += 1;
            self.timely_runs += u64::from(c.runs);
            self.timely_succeeded += u64::from(c.succeeded);
            self.heartbeat_gap = self.heartbeat_gap.max(c.max_heartbeat_gap);
            self.heartbeat_ratio = self
                .heartbeat_ratio
                .max(permille(c.max_heartbeat_gap, c.heartbeat_bound));
            self.renewal_gap = self.renewal_gap.max(c.max_renewal_gap);
            self.renewal_ratio = self
                .renewal_ratio
                .max(permille(c.max_renewal_gap, c.renewal_bound));
            self.renewal_third += u64::from(c.max_renewal_gap <= LEASE_THIRD_MS);
        } else {
            self.slow_lease_lost += u64::from(c.lease_lost);
            self.slow_fenced += u64::from(c.fenced);
        }
    }

    fn merge(&mut self, o: &Self) {
        self.phases += o.phases;
        self.timely += o.timely;
        self.runs += o.runs;
        self.succeeded += o.succeeded;
        self.heartbeat_gap = self.heartbeat_gap.max(o.heartbeat_gap);
        self.heartbeat_ratio = self.heartbeat_ratio.max(o.heartbeat_ratio);
        self.renewal_gap = self.renewal_gap.max(o.renewal_gap);
        self.renewal_ratio = self.renewal_ratio.max(o.renewal_ratio);
        self.renewal_third += o.renewal_third;
        self.outstanding = self.outstanding.max(o.outstanding);
        self.timeouts += o.timeouts;
        self.timely_runs += o.timely_runs;
        self.timely_succeeded += o.timely_succeeded;
        self.slow_lease_lost += o.slow_lease_lost;
        self.slow_fenced += o.slow_fenced;
    }

    fn line(&self) -> String {
        let pct = |permille: u64| format!("{}.{}", permille / 10, permille % 10);
        format!(
            "simulation cadence: {} phases ({} timely, {} slow), {} runs {} succeeded; timely: {} \
             runs {} succeeded, max heartbeat gap {} ms ({} % of its bound), max renewal gap of \
             a running Run {} ms ({} % of its bound; within lease/3 in {} of {} phases); slow: {} \
             Runs lost their lease, {} replays fenced; up to {} calls outstanding; {} calls timed \
             out",
            self.phases,
            self.timely,
            self.phases - self.timely,
            self.runs,
            self.succeeded,
            self.timely_runs,
            self.timely_succeeded,
            self.heartbeat_gap,
            pct(self.heartbeat_ratio),
            self.renewal_gap,
            pct(self.renewal_ratio),
            self.renewal_third,
            self.timely,
            self.slow_lease_lost,
            self.slow_fenced,
            self.outstanding,
            self.timeouts
        )
    }
}

impl Totals {
    fn add(&mut self, seeded: &Seeded) {
        let w = &seeded.walked;
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        self.moves += count(w.moves);
        self.unhealthy += count(w.unhealthy);
        self.clock_steps += count(w.clock_steps);
        self.duplicates += count(w.duplicates);
        self.halts += count(w.halts);
        self.runs.add(w.ended);
        if let Some((cadence, ended)) = &seeded.cadence {
            self.cadence.add(cadence);
            self.runs.add(*ended);
        }
    }

    fn merge(&mut self, o: &Self) {
        self.moves += o.moves;
        self.unhealthy += o.unhealthy;
        self.clock_steps += o.clock_steps;
        self.duplicates += o.duplicates;
        self.halts += o.halts;
        self.runs.add(o.runs);
        self.cadence.merge(&o.cadence);
    }

    /// The Run outcomes part of the result line.
    fn runs(&self) -> String {
        format!(
            "runs {} succeeded {} failed {} start-failed {} recovery",
            self.runs.succeeded, self.runs.failed, self.runs.start_failed, self.runs.recovery
        )
    }
}

/// Runs seeds `0..n` on every core; the violations, by seed, and the totals.
fn run_seeds(n: u64, lie: Option<Lie>) -> (Vec<(u64, String)>, Totals) {
    let threads = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let threads = threads.clamp(1, 8);
    let parts: Vec<(Vec<(u64, String)>, Totals)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                scope.spawn(move || {
                    let model = explore::walks();
                    let mut totals = Totals::default();
                    let mut violations = Vec::new();
                    let first = u64::try_from(t).unwrap_or(0);
                    for seed in (first..n).step_by(threads) {
                        match run_seed(&model, seed, lie, None) {
                            Ok(seeded) => totals.add(&seeded),
                            Err(violation) => violations.push((seed, violation)),
                        }
                    }
                    (violations, totals)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .expect("a simulation thread panicked outside a seed")
            })
            .collect()
    });
    let mut violations = Vec::new();
    let mut totals = Totals::default();
    for (part, sum) in parts {
        violations.extend(part);
        totals.merge(&sum);
    }
    violations.sort_by_key(|(seed, _)| *seed);
    (violations, totals)
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().map(|v| {
        v.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a u64, got {v:?}"))
    })
}

/// Walks quietly: a violation is reported once, by the simulation, not by the panic hook.
fn quiet_panics() {
    std::panic::set_hook(Box::new(|_| {}));
}

#[test]
fn simulation() {
    let model = explore::walks();
    if let Some(seed) = env_u64("QL_SIM_SEED") {
        let c = case(seed);
        println!(
            "seed {seed}: root {}, fault rate {}/1024, {} input bytes, cadence seed {:?}",
            c.root,
            c.fault_rate,
            c.data.len(),
            c.link
        );
        let result = run_seed(&model, seed, None, Some(&mut |line| println!("{line}")));
        match &result {
            Ok(seeded) => println!("{seeded:?}"),
            Err(violation) => println!("seed {seed}: VIOLATION {violation}"),
        }
        let violations = usize::from(result.is_err());
        let mut totals = Totals::default();
        if let Ok(seeded) = &result {
            totals.add(seeded);
        }
        println!(
            "simulation: 1 seeds, {violations} violations, {}",
            totals.runs()
        );
        assert_eq!(violations, 0, "seed {seed} violates an invariant");
        return;
    }
    let default = if cfg!(debug_assertions) { 500 } else { 10_000 };
    let n = env_u64("QL_SIM_SEEDS").unwrap_or(default);
    let started = Instant::now();
    quiet_panics();
    let (violations, totals) = run_seeds(n, None);
    let _ = std::panic::take_hook();
    for (seed, violation) in violations.iter().take(5) {
        println!("seed {seed}: {violation}\n  replay: QL_SIM_SEED={seed} {REPLAY}");
    }
    if std::env::var_os("QL_SIM_STATS").is_some() {
        let secs = started.elapsed().as_secs_f64();
        eprintln!("simulation stats: {secs:.1} s, {totals:?}");
    }
    report_line(&format!(
        "simulation: {n} seeds, {} violations, {}",
        violations.len(),
        totals.runs()
    ));
    report_line(&totals.cadence.line());
    assert!(
        violations.is_empty(),
        "{} of {n} seeds violate an invariant (first: seed {})",
        violations.len(),
        violations[0].0
    );
    // The seeds reach every ending, and not only the healthy path.
    let runs = totals.runs;
    assert!(runs.succeeded > 0 && runs.failed > 0 && runs.start_failed > 0 && runs.recovery > 0);
    assert!(totals.unhealthy > 0 && totals.clock_steps > 0 && totals.duplicates > 0);
    assert!(totals.halts > 0 && totals.cadence.timely > 0);
    assert!(totals.cadence.phases > totals.cadence.timely);
}

/// A checker that cannot fail is a defect: each lie of the cadence phase must be reported, by
/// the checker named, on a seed that is clean without the lie. (The world's other lies, of the
/// host and of the Worker's side, are `core/tests/walks.rs::walks_catch_a_broken_host`'s.)
#[test]
fn checkers_can_fail() {
    let model = explore::walks();
    let lies = [
        // Either cadence check: a renewal or a heartbeat waiting behind a long upload.
        (Lie::SerialCalls, "-cadence: "),
        // A Run whose calls before running take the whole lease loses it.
        (Lie::NoStartPathRenewal, "cadence-no-run-lost: "),
    ];
    quiet_panics();
    for (lie, invariant) in lies {
        let caught = (0..400).find_map(|seed| {
            let violation = run_seed(&model, seed, Some(lie), None).err()?;
            violation.contains(invariant).then_some((seed, violation))
        });
        let Some((seed, violation)) = caught else {
            panic!("{lie:?}: no seed in 0..400 made `{invariant}` report a violation");
        };
        let honest = run_seed(&model, seed, None, None);
        assert!(
            honest.is_ok(),
            "{lie:?}: seed {seed} fails without the lie too ({honest:?}); caught: {violation}"
        );
    }
    let _ = std::panic::take_hook();
}

/// The same seed yields the same walk and the same cadence trail, byte for byte; different
/// seeds differ.
#[test]
fn same_seed_same_result() {
    let model = explore::walks();
    let run = |seed: u64| {
        let mut lines = Vec::new();
        let result = run_seed(
            &model,
            seed,
            None,
            Some(&mut |line| lines.push(line.to_owned())),
        );
        (lines.join("\n"), format!("{result:?}"))
    };
    let mut traced = 0;
    for seed in [0, 1, 7, 4242, u64::MAX] {
        let first = run(seed);
        traced += usize::from(first.0.contains(" applied"));
        assert_eq!(first, run(seed), "seed {seed} is not deterministic");
    }
    assert!(traced > 0, "no seed's cadence trail recorded a call");
    assert_ne!(run(1).1, run(2).1, "seeds 1 and 2 give the same result");
}

/// Prints a result line even while libtest captures test output, so `.ci/run` shows it: a
/// direct write to the process's stdout, which the capture does not intercept.
fn report_line(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}
