//! Replays every checked-in corpus of the decoder and machine fuzz targets
//! (`fuzz/corpus/<target>/*`) through the same entry points the cargo-fuzz targets use
//! (`ql_worker_sim::fuzzing`), on stable, in every test run. Files named `seed-*` are the
//! generated seeds and must be accepted (decoders) or reach a milestone (machines); every other
//! file (minimised fuzzer finds, regression inputs) must run without a panic. The minimised
//! corpora (`fuzz/corpus-min/<target>/*`) of the decoder, machine and wire targets are replayed
//! here too (the wire seeds are replayed by `wire_fuzz_corpus.rs`; `machine_walk`'s corpora by
//! `walks.rs`). See `docs/fuzzing.md`.
//!
//! The seeds are written by the ignored test `write_seed_corpora`:
//! `cargo test -p ql-worker-core --test fuzz_corpus -- --ignored write_seed_corpora`.

use std::fs;
use std::path::{Path, PathBuf};

use ql_worker_core::claim::PendingClaim;
use ql_worker_core::envelope;
use ql_worker_core::receipt::Receipt;
use ql_worker_core::record::InboxRecord;
use ql_worker_core::truncation::TruncationFact;
use ql_worker_sim::fuzzing::decoders::{self, Tally, frame};
use ql_worker_sim::fuzzing::machine::{self, Scenario, Summary};
use ql_worker_sim::fuzzing::samples;
use ql_worker_sim::fuzzing::wire;

type Decoder = fn(&[u8]) -> bool;
type Machine = fn(&[u8]) -> Summary;

const DECODERS: [(&str, Decoder); 5] = [
    ("envelope_inbox_record", decoders::envelope_inbox_record),
    ("envelope_pending_claim", decoders::envelope_pending_claim),
    ("envelope_receipt", decoders::envelope_receipt),
    (
        "envelope_truncation_fact",
        decoders::envelope_truncation_fact,
    ),
    ("receipt_authenticate", decoders::receipt_authenticate),
];

const MACHINES: [(&str, Machine); 3] = [
    ("machine_start_path", machine::machine_start_path),
    ("machine_finish_path", machine::machine_finish_path),
    ("machine_lifecycle", machine::machine_lifecycle),
];

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir(target);
    let mut files: Vec<(String, Vec<u8>)> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    files
}

/// The wire targets, for their minimised corpora (`fuzz/corpus-min/<target>/`).
const WIRE: [(&str, Decoder); 8] = [
    ("wire_offer_response", wire::offer_response),
    ("wire_offer_admission", wire::offer_admission),
    ("wire_activation_response", wire::activation_response),
    ("wire_secrets_response", wire::secrets_response),
    ("wire_artifact_response", wire::artifact_response),
    ("wire_completion_response", wire::completion_response),
    ("wire_lease_control_response", wire::lease_control_response),
    ("wire_session_responses", wire::session_responses),
];

/// The minimised corpus of `target`: `fuzz/corpus-min/<target>/`, the `-set_cover_merge=1` of
/// the last long libFuzzer run (docs/fuzzing.md, "Runs"). Kept beside `fuzz/corpus/` because
/// `wire_fuzz_corpus.rs` requires every file in `fuzz/corpus/wire_*` to be accepted, and most
/// minimised inputs are rejections.
fn minimised(target: &str) -> Vec<Vec<u8>> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus-min")
        .join(target);
    let files: Vec<Vec<u8>> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| fs::read(entry.unwrap().path()).unwrap())
        .collect();
    assert!(!files.is_empty(), "{} is empty", dir.display());
    files
}

/// Every target's minimised corpus replays through the entry point the fuzzer used: wire and
/// decoder inputs without a panic, machine inputs with every invariant checked.
#[test]
fn minimised_corpora_replay() {
    let mut replayed = 0;
    for (target, entry) in WIRE.iter().chain(DECODERS.iter()) {
        for bytes in minimised(target) {
            let _ = entry(&bytes);
            replayed += 1;
        }
    }
    for (target, entry) in MACHINES {
        for bytes in minimised(target) {
            let _ = entry(&bytes);
            replayed += 1;
        }
    }
    println!("minimised corpora: {replayed} inputs replayed");
}

/// Where the decoder targets' inputs ended: the checked-in corpora (`fuzz/corpus/`) and the
/// minimised fuzzer finds (`fuzz/corpus-min/`) of each envelope target, tallied by layer.
#[test]
fn decoder_corpora_replay_and_seeds_are_accepted() {
    for (target, entry) in DECODERS {
        let files = corpus(target);
        assert!(
            files.iter().any(|(n, _)| n.starts_with("seed-")),
            "{target} has seeds"
        );
        for (name, bytes) in files {
            let accepted = entry(&bytes);
            if name.starts_with("seed-") {
                assert!(accepted, "{target}: seed {name} must be accepted");
            }
        }
    }
    for (target, layers) in decoders::ENVELOPE_LAYERS {
        let mut replay = Tally::default();
        let inputs = corpus(target)
            .into_iter()
            .map(|(_, bytes)| bytes)
            .chain(minimised(target));
        for bytes in inputs {
            replay.add(&layers(&bytes));
        }
        println!("decoder replay {target}: {replay}");
        let mut mutated = Tally::default();
        for bytes in mutations(&sample_envelopes(target), MUTATIONS) {
            mutated.add(&layers(&bytes));
        }
        println!("decoder mutations {target}: {mutated}");
        for (what, tally) in [("replay", replay), ("mutations", mutated)] {
            assert!(
                tally.rejected_by_body() > 0 && tally.accepted > 0,
                "{what} {target}: the body decoder must both accept and reject: {tally}"
            );
        }
        assert!(
            mutated.validation > 0 && mutated.postcard > 0,
            "mutations {target}: both the postcard parser and the validation must reject some: \
             {mutated}"
        );
    }
}

/// Seeded mutations per envelope target.
const MUTATIONS: usize = 2_000;

/// A sample value of each envelope target, encoded (the values the seeds are written from).
fn sample_envelopes(target: &str) -> Vec<Vec<u8>> {
    fn encoded<T: envelope::Durable>(values: &[T]) -> Vec<Vec<u8>> {
        values
            .iter()
            .map(|v| envelope::encode(v).unwrap().to_vec())
            .collect()
    }
    let values = SampleValues::new();
    match target {
        "envelope_inbox_record" => encoded(&values.records),
        "envelope_pending_claim" => encoded(&values.claims),
        "envelope_receipt" => encoded(&values.receipts),
        "envelope_truncation_fact" => encoded(&values.facts),
        other => panic!("not an envelope target: {other}"),
    }
}

/// `count` deterministic mutations of the sample envelopes `envelopes`: byte flips, byte
/// overwrites, truncations, extensions, insertions and deletions (one to three each) of a
/// sample's body. Even ones are the mutated body alone (re-sealed by the target as a body);
/// odd ones keep the sample's now stale header (the raw envelope fails its checksum or length,
/// and the target re-seals the bytes after the header).
fn mutations(envelopes: &[Vec<u8>], count: usize) -> Vec<Vec<u8>> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = move |below: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        usize::try_from(x % u64::try_from(below.max(1)).unwrap()).unwrap()
    };
    (0..count)
        .map(|i| {
            let sample = &envelopes[i % envelopes.len()];
            let (header, body) = sample.split_at(envelope::HEADER_BYTES);
            let mut body = body.to_vec();
            for _ in 0..=next(3) {
                let at = next(body.len());
                let byte = u8::try_from(next(256)).unwrap();
                match next(6) {
                    0 if !body.is_empty() => body[at] ^= 1 << next(8),
                    1 if !body.is_empty() => body[at] = byte,
                    2 => body.truncate(at),
                    3 => body.extend((0..=next(8)).map(|_| u8::try_from(next(256)).unwrap())),
                    4 => body.insert(at, byte),
                    5 if !body.is_empty() => {
                        body.remove(at);
                    }
                    _ => body.push(byte),
                }
            }
            if i % 2 == 0 {
                body
            } else {
                [header, &body].concat()
            }
        })
        .collect()
}

#[test]
fn decoder_targets_survive_truncations_and_byte_flips_of_every_seed() {
    for (target, entry) in DECODERS {
        for (name, bytes) in corpus(target) {
            if !name.starts_with("seed-") {
                continue;
            }
            for cut in (0..bytes.len()).step_by(5) {
                let _ = entry(&bytes[..cut]);
            }
            for i in (0..bytes.len()).step_by(3) {
                let mut flipped = bytes.clone();
                flipped[i] ^= 0x01;
                let _ = entry(&flipped);
            }
        }
    }
}

#[test]
fn machine_corpora_replay_and_seeds_reach_a_milestone() {
    for (target, entry) in MACHINES {
        let files = corpus(target);
        assert!(
            files.iter().any(|(n, _)| n.starts_with("seed-")),
            "{target} has seeds"
        );
        for (name, bytes) in files {
            let summary = entry(&bytes);
            if name.starts_with("seed-") {
                assert!(summary.milestone(), "{target}: seed {name}: {summary:?}");
            }
        }
    }
}

#[test]
fn the_empty_input_is_the_happy_path() {
    let start = machine::machine_start_path(&[]);
    assert!(start.completed >= 1 && start.halts == 0, "{start:?}");
    let finish = machine::machine_finish_path(&[]);
    assert!(finish.completed >= 1 && finish.halts == 0, "{finish:?}");
    let life = machine::machine_lifecycle(&[]);
    assert!(life.halts == 0 && life.restarts == 0, "{life:?}");
    assert!(decoders::receipt_authenticate(&[]));
    println!("{start:?}\n{finish:?}\n{life:?}");
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join(name), bytes).unwrap();
}

fn write_envelope_seeds<T: envelope::Durable>(target: &str, values: &[T]) {
    let dir = corpus_dir(target);
    for (i, value) in values.iter().enumerate() {
        let bytes = envelope::encode(value).unwrap();
        let body = envelope::open::<T>(&bytes).unwrap();
        assert_eq!(frame::<T>(body), *bytes);
        write(&dir, &format!("seed-{i:02}.env"), &bytes);
        write(&dir, &format!("seed-{i:02}.body"), body);
    }
}

/// Machine seeds: the happy path of each setup byte, and single faults at a few positions.
fn write_machine_seeds(target: &str, entry: Machine) {
    let dir = corpus_dir(target);
    let mut kept: Vec<Summary> = Vec::new();
    let mut index = 0;
    for setup in [0u8, 0x21, 0x4b, 0x96] {
        for (at, byte) in [
            (0, 0),
            (12, 200),
            (20, 203),
            (30, 241),
            (30, 250),
            (40, 185),
            (25, 212),
        ] {
            let mut input = vec![setup, 0, 0, 0, 0, 0, 0, 0, 0, 0];
            input.resize(at + 10, 0);
            input.push(byte);
            let summary = entry(&input);
            if summary.milestone() && !kept.contains(&summary) && index < 8 {
                kept.push(summary);
                write(&dir, &format!("seed-{index:02}.bin"), &input);
                index += 1;
            }
        }
    }
    assert!(index > 0, "{target}: no seed reached a milestone");
}

/// The sample values of the envelope seeds (`fuzzing::samples`).
struct SampleValues {
    records: Vec<InboxRecord>,
    claims: Vec<PendingClaim>,
    receipts: Vec<Receipt>,
    facts: Vec<TruncationFact>,
}

impl SampleValues {
    fn new() -> Self {
        let records = samples::every_record();
        let claims = [(1, 0), (2, 3), (3, 16)]
            .iter()
            .map(|(n, a)| samples::claim(*n, *a))
            .collect();
        let receipts = records
            .iter()
            .filter(|r| r.executor_started_at_ms.is_some())
            .take(4)
            .enumerate()
            .map(|(i, r)| {
                let n = u32::try_from(i).unwrap();
                samples::receipt_for(r, &samples::capability(n), samples::ms(5_000), 0)
            })
            .collect();
        let facts = [(1, false), (2, true)]
            .iter()
            .map(|(n, q)| samples::truncation_fact(*n, *q))
            .collect();
        Self {
            records,
            claims,
            receipts,
            facts,
        }
    }
}

#[test]
#[ignore = "writes the seed corpora into fuzz/corpus; run by hand after changing samples"]
fn write_seed_corpora() {
    let values = SampleValues::new();
    write_envelope_seeds::<InboxRecord>("envelope_inbox_record", &values.records);
    write_envelope_seeds("envelope_pending_claim", &values.claims);
    write_envelope_seeds("envelope_receipt", &values.receipts);
    write_envelope_seeds("envelope_truncation_fact", &values.facts);
    let dir = corpus_dir("receipt_authenticate");
    let mut i = 0;
    for state in 0..9u8 {
        for n in 0..2u8 {
            let input = [
                n, state, 0, 0x10, 0, 0, 0, 0, 3, 0, 0, 9, 0, 0xff, 0xff, 0, 0,
            ];
            if decoders::receipt_authenticate(&input) {
                write(&dir, &format!("seed-{i:02}.bin"), &input);
                i += 1;
            }
        }
    }
    write(&dir, "seed-empty.bin", &[]);
    for (target, entry) in MACHINES {
        write_machine_seeds(target, entry);
    }
}

fn machine_target(name: &str) -> Scenario {
    match name {
        "machine_start_path" => Scenario::StartPath,
        "machine_finish_path" => Scenario::FinishPath,
        "machine_lifecycle" => Scenario::Lifecycle,
        other => panic!("FUZZ_TARGET must name a machine target, not {other:?}"),
    }
}

/// Prints the step-by-step trace of one machine input:
/// `FUZZ_TARGET=machine_start_path FUZZ_INPUT=path cargo test -p
/// ql-worker-core --test fuzz_corpus -- --ignored --nocapture trace_machine_input`.
#[test]
#[ignore = "a tool: reads FUZZ_TARGET and FUZZ_INPUT"]
fn trace_machine_input() {
    let scenario = machine_target(&std::env::var("FUZZ_TARGET").unwrap());
    let data = fs::read(std::env::var("FUZZ_INPUT").unwrap()).unwrap();
    let summary = machine::run_traced(scenario, &data, &mut |line| println!("{line}"));
    println!("{summary:?}");
}

/// Many pseudo-random op sequences through every machine target (a quick stable stand-in for
/// the fuzzer): `FUZZ_RUNS=2000 FUZZ_SEED=7 [FUZZ_TARGET=machine_…] cargo test
/// --release -p ql-worker-core --test fuzz_corpus -- --ignored random_machine_inputs`. A failing
/// input is written to `target/fuzz-failure-<target>.bin`.
#[test]
#[ignore = "a tool: slow in debug builds"]
fn random_machine_inputs() {
    let runs: u64 = std::env::var("FUZZ_RUNS").map_or(300, |v| v.parse().unwrap());
    let mut x: u64 = std::env::var("FUZZ_SEED").map_or(1, |v| v.parse().unwrap());
    for i in 0..runs {
        let len = 20 + usize::try_from(i % 200).unwrap();
        let data: Vec<u8> = (0..len)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let b = u8::try_from((x >> 24) & 0xff).unwrap();
                match x % 4 {
                    0 => 0,
                    1 => 200 + b % 56,
                    _ => b,
                }
            })
            .collect();
        for (target, _) in MACHINES {
            if std::env::var("FUZZ_TARGET").is_ok_and(|t| t != target) {
                continue;
            }
            let scenario = machine_target(target);
            let run = std::panic::catch_unwind(|| machine::run(scenario, &data));
            if run.is_err() {
                let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join(format!("../target/fuzz-failure-{target}.bin"));
                fs::write(&path, &data).unwrap();
                panic!("{target}: failing input written to {}", path.display());
            }
        }
    }
}

/// The panic message of a machine input, if it panics.
fn machine_failure(scenario: Scenario, data: &[u8]) -> Option<String> {
    let run = std::panic::catch_unwind(|| machine::run(scenario, data));
    let payload = run.err()?;
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_string()))
        .or_else(|| Some(String::from("panic")))
}

/// Shrinks a failing machine input while it keeps failing with the same invariant (drops
/// chunks, then zeroes bytes) and writes `<FUZZ_INPUT>.min`:
/// `FUZZ_TARGET=… FUZZ_INPUT=… cargo test --release -p ql-worker-core --test
/// fuzz_corpus -- --ignored minimize_machine_input`.
#[test]
#[ignore = "a tool: reads FUZZ_TARGET and FUZZ_INPUT"]
fn minimize_machine_input() {
    let scenario = machine_target(&std::env::var("FUZZ_TARGET").unwrap());
    let input = std::env::var("FUZZ_INPUT").unwrap();
    let mut data = fs::read(&input).unwrap();
    std::panic::set_hook(Box::new(|_| {}));
    let failure = machine_failure(scenario, &data).expect("the input must fail");
    let invariant: String = failure.split(':').next().unwrap().to_string();
    let same = |d: &[u8]| machine_failure(scenario, d).is_some_and(|f| f.starts_with(&invariant));
    let mut chunk = data.len().max(1);
    while chunk >= 1 {
        let mut at = 0;
        while at < data.len() {
            let mut candidate = data.clone();
            candidate.drain(at..(at + chunk).min(data.len()));
            if same(&candidate) {
                data = candidate;
            } else {
                at += chunk;
            }
        }
        chunk /= 2;
    }
    for i in 0..data.len() {
        if data[i] != 0 {
            let mut candidate = data.clone();
            candidate[i] = 0;
            if same(&candidate) {
                data = candidate;
            }
        }
    }
    let _ = std::panic::take_hook();
    fs::write(format!("{input}.min"), &data).unwrap();
    println!("{invariant}\n{} bytes: {data:02x?}", data.len());
}

/// Runs the committed reproducer of a bug these targets found (fixed in `0f4c600`); every
/// invariant is checked.
fn reproducer(target: &str, file: &str) {
    let data = fs::read(corpus_dir(target).join(file)).unwrap();
    let summary = machine::run(machine_target(target), &data);
    println!("{summary:?}");
}

/// Known bug `pull-after-midtick-latch` (then `core/src/lifecycle.rs`): the Pull queued when the
/// tick was planned still runs after supervision in the same tick recorded lease loss and
/// latched fail-closed (reference lifecycle test 6.7 #4: "fails closed before Pull when active
/// supervision records lease loss"). Fixed in `0f4c600`.
#[test]
fn regression_pull_after_midtick_latch() {
    reproducer("machine_start_path", "bug-pull-after-midtick-latch.bin");
}

/// Known bug `pull-before-reconciled` (then `core/src/ops.rs` `list_resume`, `lifecycle.rs`
/// `on_listed`): a storage failure on a startup reconciliation page is reported as an empty
/// last page, so reconciliation "completes" without listing the inbox; the Worker goes active,
/// never applies the restart rules (a `launching` record is not marked recovery), and pulls.
#[test]
fn regression_pull_before_reconciled() {
    reproducer("machine_finish_path", "bug-pull-before-reconciled.bin");
}

/// Known bug `pull-before-reconciled`, drain variant: after the same failed reconciliation page
/// a drain request stops the Worker (`Drained`, Session offline) with an unsettled `launching`
/// record on disk.
#[test]
fn regression_drained_with_unsettled_records() {
    reproducer(
        "machine_finish_path",
        "bug-pull-before-reconciled-drain.bin",
    );
}

/// Copies the inputs of `FUZZ_FROM` that the wire target `FUZZ_TARGET` accepts into its
/// checked-in corpus (the wire replay test requires every wire corpus file to be accepted):
/// `FUZZ_TARGET=wire_offer_response FUZZ_FROM=/tmp/min/wire_offer_response cargo test -p
/// ql-worker-core --test fuzz_corpus -- --ignored copy_accepted_wire_inputs`.
#[test]
#[ignore = "a tool: reads FUZZ_TARGET and FUZZ_FROM"]
fn copy_accepted_wire_inputs() {
    let target = std::env::var("FUZZ_TARGET").unwrap();
    let (_, entry) = WIRE
        .into_iter()
        .find(|(name, _)| *name == target)
        .unwrap_or_else(|| panic!("not a wire target: {target}"));
    let from = PathBuf::from(std::env::var("FUZZ_FROM").unwrap());
    let dir = corpus_dir(&target);
    let mut copied = 0;
    for entry_path in fs::read_dir(&from).unwrap() {
        let path = entry_path.unwrap().path();
        let bytes = fs::read(&path).unwrap();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if entry(&bytes) && !dir.join(&name).exists() {
            fs::write(dir.join(&name), &bytes).unwrap();
            copied += 1;
        }
    }
    println!("{target}: {copied} accepted inputs copied");
}
