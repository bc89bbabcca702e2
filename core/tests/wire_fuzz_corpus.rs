//! Runs every checked-in fuzz seed (`fuzz/corpus/<target>/*`) through the same entry point the
//! cargo-fuzz target uses (`ql_worker_sim::fuzzing::wire`), on stable, in every test run. The
//! seeds are the reference examples, so each must be accepted; mutated variants must not panic.

use std::fs;
use std::path::PathBuf;

use ql_worker_sim::fuzzing::wire as fuzzing;

type Entry = fn(&[u8]) -> bool;

const TARGETS: [(&str, Entry); 8] = [
    ("wire_offer_response", fuzzing::offer_response),
    ("wire_offer_admission", fuzzing::offer_admission),
    ("wire_activation_response", fuzzing::activation_response),
    ("wire_secrets_response", fuzzing::secrets_response),
    ("wire_artifact_response", fuzzing::artifact_response),
    ("wire_completion_response", fuzzing::completion_response),
    (
        "wire_lease_control_response",
        fuzzing::lease_control_response,
    ),
    ("wire_session_responses", fuzzing::session_responses),
];

fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target);
    let mut files: Vec<(String, Vec<u8>)> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.unwrap().path();
            (path.display().to_string(), fs::read(&path).unwrap())
        })
        .collect();
    files.sort();
    files
}

#[test]
fn wire_fuzz_seed_corpora_are_accepted_by_their_targets() {
    for (target, entry) in TARGETS {
        let files = corpus(target);
        assert!(!files.is_empty(), "{target} has seeds");
        for (name, bytes) in files {
            assert!(entry(&bytes), "{target}: seed {name} must be accepted");
        }
    }
}

#[test]
fn wire_fuzz_targets_survive_truncations_and_byte_flips_of_every_seed() {
    for (target, entry) in TARGETS {
        for (_, bytes) in corpus(target) {
            for cut in (0..bytes.len()).step_by(7) {
                let _ = entry(&bytes[..cut]);
            }
            for i in (0..bytes.len()).step_by(3) {
                let mut flipped = bytes.clone();
                flipped[i] ^= 0x20;
                let _ = entry(&flipped);
            }
        }
    }
}
