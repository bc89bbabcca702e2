//! Walks over the model checks' world (`ql_worker_sim::testkit::explore::walk`): where the model
//! checks take every path within short bounds, a walk takes one long path (up to 3 000 moves
//! and then a settling phase), chosen by its input's bytes, through the same [`World`]: the
//! same disk, process table, control plane and checkers, with every family of answers and
//! events, three Runs, two slots (even seeds) or one (odd seeds), three commands outstanding,
//! re-delivery, and the host's wall clock stepped an hour either way. The fuzz target `machine_walk` walks the same way from the
//! fuzzer's bytes.
//!
//! `walks` runs `QL_WALKS` seeded walks (default 20 000) and prints one line; every walk must
//! keep every invariant and settle (`liveness`). The other tests show that the walks are
//! deterministic, that the empty input is the happy path, and that they catch a broken host.
//!
//! [`World`]: ql_worker_sim::testkit::world::World

use ql_worker_core::record::State;
use ql_worker_sim::testkit::explore::walk::{self, RunOutcomes, Walk, Walked};
use ql_worker_sim::testkit::explore::{self, CatchPanics, Model};
use ql_worker_sim::testkit::world::Mutation;

/// The input of seed `seed`: `len` bytes of a xorshift stream.
fn input(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x.to_le_bytes()[3]
        })
        .collect()
}

/// Walks seed `seed` from root `seed % 5` (an empty inbox with two slots, with one slot; an
/// inbox a previous incarnation left, without and with a `launching` record; a small inbox with
/// retention).
fn walk_seed(model: &Model, seed: u64) -> Walked {
    let plan = Walk {
        model,
        root: usize::try_from(seed % 5).unwrap(),
        clock_steps: true,
    };
    walk::walk(&plan, &input(seed, 600), &CatchPanics)
}

fn quiet_panics() {
    std::panic::set_hook(Box::new(|_| {}));
}

#[test]
fn walks() {
    let n: u64 = std::env::var("QL_WALKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let model = explore::walks();
    quiet_panics();
    let mut ended = RunOutcomes::default();
    let (mut moves, mut unhealthy, mut clock_steps, mut duplicates) = (0, 0, 0, 0);
    let (mut refusable, mut fenced, mut halts) = (0, 0, 0);
    let mut violations = Vec::new();
    for seed in 0..n {
        let walked = walk_seed(&model, seed);
        moves += walked.moves;
        unhealthy += walked.unhealthy;
        clock_steps += walked.clock_steps;
        duplicates += walked.duplicates;
        refusable += walked.refusable;
        fenced += walked.fenced;
        halts += walked.halts;
        ended.add(walked.ended);
        if let Some(found) = walked.found {
            violations.push((seed, found));
        }
    }
    let _ = std::panic::take_hook();
    report_line(&format!(
        "walks: {n} seeds, {} violations, runs {} succeeded {} failed {} start-failed {} \
         recovery; {moves} moves ({unhealthy} not the healthy one, {clock_steps} wall-clock \
         steps, {duplicates} answers delivered twice, {refusable} offers to refuse, {fenced} \
         replays fenced, {halts} halts)",
        violations.len(),
        ended.succeeded,
        ended.failed,
        ended.start_failed,
        ended.recovery
    ));
    for (seed, found) in violations.iter().take(3) {
        println!("seed {seed}: {} {}", found.invariant, found.detail);
        for step in &found.trace {
            println!("    {step}");
        }
    }
    assert!(
        violations.is_empty(),
        "{} walks broke an invariant",
        violations.len()
    );
    // The walks reach every ending, and not only the healthy path.
    assert!(ended.succeeded > 0 && ended.start_failed > 0 && ended.recovery > 0);
    assert!(unhealthy > 0 && clock_steps > 0 && duplicates > 0 && refusable > 0 && halts > 0);
}

/// The empty input is the happy path: every Run the Worker may take succeeds (the one pinned to
/// another digest is refused), nothing else happens.
#[test]
fn the_empty_input_is_the_happy_path() {
    let model = explore::walks();
    let plan = Walk {
        model: &model,
        root: 0,
        clock_steps: true,
    };
    let walked = walk::walk(&plan, &[], &CatchPanics);
    assert!(walked.found.is_none(), "{:?}", walked.found);
    assert_eq!(
        walked.ended,
        RunOutcomes {
            succeeded: 3,
            ..RunOutcomes::default()
        }
    );
    assert_eq!((walked.unhealthy, walked.clock_steps), (0, 0));
    assert!(
        walked.refusable >= 1,
        "the Run pinned to another digest was offered"
    );
}

/// The same input walks the same path, move for move, to the same end.
#[test]
fn the_same_input_walks_the_same_path() {
    let model = explore::walks();
    for seed in [3, 41, 978] {
        let (a, b) = (walk_seed(&model, seed), walk_seed(&model, seed));
        assert_eq!(format!("{a:?}"), format!("{b:?}"), "seed {seed}");
        assert!(a.moves > 50, "seed {seed}: {} moves", a.moves);
    }
}

/// The walks' checkers can fail: over a host that acknowledges some writes without storing
/// them, some walk breaks the invariant that guards what those writes protect (the same broken
/// hosts as the model checks' self-tests); with a Worker whose record writes lie about
/// recovery (every Run sent to recovery, or another reason than its own), some walk breaks
/// `recovery-licensed`; with one that stores every offer it is delivered, some walk breaks
/// `refused-offer-stored`.
#[test]
fn walks_catch_a_broken_host() {
    quiet_panics();
    for (mutation, invariant) in [
        (Mutation::DropWrites(State::Launching), "spawn-barrier"),
        (
            Mutation::DropWrites(State::CompletionAcknowledged),
            "receipt-removed-after-acknowledged",
        ),
        (Mutation::DropLeaseWrites, "stop-after-durable-lease"),
        (Mutation::StartedAsRecovery, "recovery-licensed"),
        (Mutation::WrongRecoveryReason, "recovery-licensed"),
        (Mutation::StoresEveryOffer, "refused-offer-stored"),
        (Mutation::DoubleSpawn, "at-most-one-spawn"),
        (Mutation::SpawnsAttemptTwice, "at-most-once-attempt"),
        (Mutation::SpawnsRunTwice, "at-most-once-run"),
        (Mutation::DriftedPlan, "spawn-barrier"),
        (Mutation::SpawnedButRejected, "start-failure-proof"),
        (Mutation::UploadNotStored, "upload-first"),
        (Mutation::HungProcesses, "liveness"),
        (Mutation::RemovalNotDone, "pull-with-room"),
        (Mutation::SessionStaysDraining, "liveness"),
    ] {
        let mut model = explore::walks();
        for root in &mut model.roots {
            root.world.mutation = Some(mutation);
        }
        // The first catching seed moves whenever the Worker's command sequence changes (a
        // walk's bytes pick among the moves of the commands it meets); the search stops there.
        let caught = (0..20_000).find(|seed| {
            walk_seed(&model, *seed)
                .found
                .is_some_and(|f| f.invariant == invariant)
        });
        println!("{mutation:?}: {invariant} first broken by seed {caught:?}");
        assert!(caught.is_some(), "{mutation:?}: no walk broke {invariant}");
    }
    let _ = std::panic::take_hook();
}

/// The fuzz target's entry point walks the same model: the empty input settles healthily, a
/// seeded one as `walks` does.
#[test]
fn the_fuzz_entry_point_walks_the_same_model() {
    assert_eq!(walk::fuzz(&[]).ended.succeeded, 3);
    let model = explore::walks();
    for seed in [40, 43, 44] {
        // The first byte picks the root, as `walk_seed` does by the seed.
        let mut data = std::vec![u8::try_from(seed % 5).unwrap()];
        data.extend(input(seed, 600));
        assert_eq!(
            format!("{:?}", walk::fuzz(&data)),
            format!("{:?}", walk_seed(&model, seed)),
            "seed {seed}"
        );
    }
}

/// Writes the seed corpus of the fuzz target: `seed-<n>` is the walk of seed `n` (its root byte,
/// then its input), `seed-empty` the happy path. Run by hand after changing the walks' model.
#[test]
#[ignore = "writes fuzz/corpus/machine_walk; run by hand after changing the walks' model"]
fn write_walk_corpus() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/machine_walk");
    for seed in 1..=5u64 {
        let mut data = std::vec![u8::try_from(seed % 5).unwrap()];
        data.extend(input(seed, 600));
        std::fs::write(dir.join(format!("seed-{seed}")), data).unwrap();
    }
    std::fs::write(dir.join("seed-empty"), []).unwrap();
}

/// Every checked-in input of the fuzz target (`fuzz/corpus/machine_walk/*`, and its minimised
/// corpus when a long run has written one) walks without a broken invariant, on stable, in
/// every test run.
#[test]
fn the_fuzz_corpus_walks_clean() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut walked = 0;
    for dir in ["corpus/machine_walk", "corpus-min/machine_walk"] {
        let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
            continue;
        };
        for entry in entries {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            let result = std::panic::catch_unwind(|| walk::fuzz(&data));
            assert!(result.is_ok(), "{} broke an invariant", path.display());
            walked += 1;
        }
    }
    assert!(walked >= 5, "only {walked} corpus files");
}

/// Prints a result line even while libtest captures test output, so `.ci/run` shows it: a
/// direct write to the process's stdout, which the capture does not intercept.
fn report_line(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}
