//! Log capture and truncation (reference §6.10, `launcher.test.cjs`): byte-exact capture up to
//! the quota, the rest counted and dropped, the immutable truncation fact, and capture failure.

mod supervisor_common;

use std::fs;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::Path;

use ql_worker::supervisor::{Executor as _, ExecutorOutcome};
use supervisor_common::{Fixture, WAIT, alive, argv, authenticate, in_clean_process, sh, wait_for};

const QUOTA: usize = 64 * 1024;

/// Deterministic bytes covering every value, NULs included.
fn payload(len: usize, seed: u32) -> Vec<u8> {
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..len)
        .map(|_| {
            state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (state >> 24) as u8
        })
        .collect()
}

/// Mostly zeros with scattered binary bytes and newlines.
fn sparse_payload(len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| match i % 4099 {
            0 => 0xff,
            1 => b'\n',
            2 => 0x01,
            3 => 0x80,
            _ => 0,
        })
        .collect()
}

/// Pre-fills the log with `bytes`, as a reopened attempt would find it.
fn prefill_log(fx: &Fixture, bytes: &[u8]) {
    let path = fx.log_path();
    let shard = path.parent().unwrap();
    fs::create_dir_all(shard).unwrap();
    for dir in [shard, shard.parent().unwrap()] {
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700)).unwrap();
    }
    fs::write(&path, bytes).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
}

/// Runs `cat <payload>` with `existing` bytes already in the log and checks the log and the
/// fact exactly.
fn capture_case(n: u32, existing: usize, produced: usize) {
    let fx = Fixture::new(n);
    let old = payload(existing, n + 1000);
    if existing > 0 {
        prefill_log(&fx, &old);
    }
    let new = payload(produced, n);
    let source = fx.scratch("payload");
    fs::write(&source, &new).unwrap();
    let outcome = fx.start(argv("/bin/cat", &[source.to_str().unwrap()]), vec![]);
    assert!(
        matches!(outcome, ExecutorOutcome::Started { .. }),
        "{outcome:?}"
    );
    let receipt = fx.wait_receipt();
    authenticate(&receipt, &fx.record);
    assert_eq!(receipt.exit_code, 0);
    let room = QUOTA - existing;
    let mut expected = old;
    expected.extend_from_slice(&new[..produced.min(room)]);
    let log = fx.log();
    assert_eq!(log.len(), expected.len(), "log length");
    assert!(log == expected, "log bytes must be exact");
    let fact = fx.fact().expect("a complete capture publishes its fact");
    assert_eq!(fact.quota_reached, produced > room, "quotaReached");
    assert_eq!(fact.maximum_bytes, QUOTA as u64);
    assert_eq!(
        fact.log_artifact_id,
        *fx.record.log_artifact_id.as_ref().unwrap()
    );
    assert_eq!(fact.run_id, fx.record.offer.candidate.run_id);
    assert_eq!(fact.attempt_id, fx.record.offer.candidate.attempt_id);
}

#[test]
fn hard_caps_durable_output_and_publishes_an_immutable_truncation_fact() {
    in_clean_process(
        "hard_caps_durable_output_and_publishes_an_immutable_truncation_fact",
        || {
            capture_case(20, 0, 256 * 1024);
            let fx = Fixture::new(21);
            let source = fx.scratch("payload");
            fs::write(&source, payload(256 * 1024, 21)).unwrap();
            let _ = fx.start(sh(&format!("cat {}; exit 3", source.display())), vec![]);
            assert_eq!(
                fx.wait_receipt().exit_code,
                3,
                "truncation never changes the exit code"
            );
            assert_eq!(fx.log().len(), QUOTA);
            assert!(fx.fact().unwrap().quota_reached);
            // The fact is a private, single-link file, and nothing else is left beside the log.
            let fact_path = fx.paths().fact(fx.record.log_artifact_id.as_ref().unwrap());
            let meta = fs::metadata(&fact_path).unwrap();
            assert_eq!((meta.mode() & 0o777, meta.nlink()), (0o600, 1));
            let mut names: Vec<String> = fs::read_dir(fact_path.parent().unwrap())
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            names.sort();
            let id = fx
                .record
                .log_artifact_id
                .as_ref()
                .unwrap()
                .as_str()
                .to_owned();
            assert_eq!(names, vec![format!(".{id}.fact"), format!("{id}.log")]);
        },
    );
}

#[test]
fn keeps_byte_exact_capture_and_truncation_for_empty_output() {
    in_clean_process(
        "keeps_byte_exact_capture_and_truncation_for_empty_output",
        || {
            capture_case(22, 0, 0);
        },
    );
}

#[test]
fn keeps_byte_exact_capture_and_truncation_for_exact_quota() {
    in_clean_process(
        "keeps_byte_exact_capture_and_truncation_for_exact_quota",
        || {
            capture_case(23, 0, QUOTA);
        },
    );
}

#[test]
fn keeps_byte_exact_capture_and_truncation_for_one_byte_overflow() {
    in_clean_process(
        "keeps_byte_exact_capture_and_truncation_for_one_byte_overflow",
        || capture_case(24, 0, QUOTA + 1),
    );
}

#[test]
fn keeps_byte_exact_capture_and_truncation_for_partial_final_block() {
    in_clean_process(
        "keeps_byte_exact_capture_and_truncation_for_partial_final_block",
        || {
            // Not a multiple of the 16 KiB copy block, below the quota; and a reopened log whose
            // remaining room ends mid-block.
            capture_case(25, 0, 3 * 16_384 + 123);
            capture_case(26, 1000, QUOTA);
        },
    );
}

#[test]
fn keeps_byte_exact_capture_and_truncation_for_exhausted_quota() {
    in_clean_process(
        "keeps_byte_exact_capture_and_truncation_for_exhausted_quota",
        || capture_case(27, QUOTA, 10),
    );
}

#[test]
fn keeps_byte_exact_capture_and_truncation_for_exhausted_quota_without_overflow() {
    in_clean_process(
        "keeps_byte_exact_capture_and_truncation_for_exhausted_quota_without_overflow",
        || capture_case(28, QUOTA, 0),
    );
}

fn sparse_binary_case(n: u32, shell: bool) {
    let fx = Fixture::new(n);
    let data = sparse_payload(40_000);
    let source = fx.scratch("payload");
    fs::write(&source, &data).unwrap();
    let gate = fx.scratch("gate");
    let script = format!(
        "cat {}; while [ ! -e {} ]; do sleep 0.02; done; exit 7",
        source.display(),
        gate.display()
    );
    let command = if shell {
        sh(&script)
    } else {
        argv("/bin/sh", &["-c", &script])
    };
    let outcome = fx.start(command, vec![]);
    let pid = Fixture::user_pid(&outcome);
    // The bytes are in the spool while the process still runs.
    assert!(
        wait_for(WAIT, || (fx.log() == data).then_some(())).is_some(),
        "binary output must reach the spool before exit"
    );
    assert!(alive(pid), "the user process is still running");
    assert!(fx.receipt().is_none());
    fs::write(&gate, b"").unwrap();
    let receipt = fx.wait_receipt();
    authenticate(&receipt, &fx.record);
    assert_eq!(receipt.exit_code, 7);
    assert!(fx.log() == data);
    assert!(!fx.fact().unwrap().quota_reached);
}

#[test]
fn publishes_sparse_binary_argv_output_before_the_process_exits() {
    in_clean_process(
        "publishes_sparse_binary_argv_output_before_the_process_exits",
        || sparse_binary_case(29, false),
    );
}

#[test]
fn publishes_sparse_binary_shell_output_before_the_process_exits() {
    in_clean_process(
        "publishes_sparse_binary_shell_output_before_the_process_exits",
        || sparse_binary_case(30, true),
    );
}

#[test]
fn capture_failure_drains_output_without_forging_a_truncation_fact_or_changing_user_exit() {
    in_clean_process(
        "capture_failure_drains_output_without_forging_a_truncation_fact_or_changing_user_exit",
        || {
            let fx = Fixture::new(31);
            let source = fx.scratch("payload");
            // Four pipe buffers: the user would block forever if the supervisor stopped reading.
            fs::write(&source, payload(256 * 1024, 31)).unwrap();
            let mut executor = fx.executor().with_failing_log_writes();
            let outcome =
                executor.start(fx.launch(sh(&format!("cat {}; exit 9", source.display())), vec![]));
            assert!(
                matches!(outcome, ExecutorOutcome::Started { .. }),
                "{outcome:?}"
            );
            let receipt = fx.wait_receipt();
            authenticate(&receipt, &fx.record);
            assert_eq!(receipt.exit_code, 9);
            assert!(fx.log().is_empty());
            assert!(
                fx.fact().is_none(),
                "no fact may be forged after a capture failure"
            );
            assert!(Path::new(&fx.log_path()).exists());
        },
    );
}
