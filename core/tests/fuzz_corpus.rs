//! Replays every checked-in corpus of the decoder fuzz targets (`fuzz/corpus/<target>/*`)
//! through the same entry points the cargo-fuzz targets use (`ql_worker_sim::fuzzing`), on
//! stable, in every test run. Files named `seed-*` are the generated seeds and must be accepted;
//! every other file (minimised fuzzer finds, regression inputs) must run without a panic. The
//! minimised corpora (`fuzz/corpus-min/<target>/*`) of the decoder and wire targets are replayed
//! here too (the wire seeds are replayed by `wire_fuzz_corpus.rs`; the machine target
//! `machine_walk`'s corpus by `walks.rs`). See `docs/fuzzing.md`.
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
use ql_worker_sim::fuzzing::samples;
use ql_worker_sim::fuzzing::wire;

type Decoder = fn(&[u8]) -> bool;

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

/// Every target's minimised corpus replays through the entry point the fuzzer used, without a
/// panic.
#[test]
fn minimised_corpora_replay() {
    let mut replayed = 0;
    for (target, entry) in WIRE.iter().chain(DECODERS.iter()) {
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

/// The receipt target's empty input is its happy path: a genuine receipt authenticates.
#[test]
fn the_empty_receipt_input_authenticates() {
    assert!(decoders::receipt_authenticate(&[]));
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
}
