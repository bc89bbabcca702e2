//! The log spool on real files (reference §6.4 scenarios): policies, modes, capacity admission
//! before creating anything, byte-exact reopen, bounded streaming with an incremental SHA-256,
//! and the authenticated truncation fact.

mod storage_support;

use std::fs;
use std::io::{Read as _, Write as _};
use std::os::unix::fs::MetadataExt as _;

use ql_worker::fsio::RealFs;
use ql_worker::spool::{self, READ_CHUNK_BYTES, SpoolError, SpoolPolicy};
use ql_worker_sim::fault_fs::FaultFs;
use storage_support::*;

const POLICY: SpoolPolicy = SpoolPolicy::EDGE;

fn root_dir() -> Sandbox {
    let sb = sandbox();
    fs::create_dir(&sb.root).unwrap();
    fs::set_permissions(
        &sb.root,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    sb
}

#[test]
fn edge_and_node_policies_match_the_reference_and_custom_ones_are_bounded() {
    const MIB: u64 = 1024 * 1024;
    assert_eq!(
        (
            SpoolPolicy::EDGE.maximum_attempt_bytes,
            SpoolPolicy::EDGE.minimum_free_bytes,
            SpoolPolicy::EDGE.maximum_write_chunk_bytes
        ),
        (4 * MIB, 32 * MIB, MIB)
    );
    assert_eq!(
        (
            SpoolPolicy::NODE.maximum_attempt_bytes,
            SpoolPolicy::NODE.minimum_free_bytes,
            SpoolPolicy::NODE.maximum_write_chunk_bytes
        ),
        (64 * MIB, 256 * MIB, MIB)
    );
    assert!(SpoolPolicy::custom(64 * 1024, 0, 1).is_ok());
    assert!(SpoolPolicy::custom(64 * 1024 - 1, 0, MIB).is_err());
    assert!(SpoolPolicy::custom(1024 * MIB + 1, 0, MIB).is_err());
    assert!(SpoolPolicy::custom(MIB, 1024 * 1024 * MIB + 1, MIB).is_err());
    assert!(SpoolPolicy::custom(MIB, 0, MIB + 1).is_err());
}

#[test]
fn allocate_creates_shard_0700_and_empty_file_0600() {
    let sb = root_dir();
    let id = log_id(1);
    spool::allocate(&sb.root, &id, POLICY).unwrap();
    let shard = sb.root.join("logs").join(&id.as_str()[5..7]);
    let file = shard.join(format!("{id}.log"));
    let mode = |p: &std::path::Path| fs::symlink_metadata(p).unwrap().mode() & 0o7777;
    assert_eq!(mode(&sb.root.join("logs")), 0o700);
    assert_eq!(mode(&shard), 0o700);
    assert_eq!(mode(&file), 0o600);
    assert_eq!(fs::metadata(&file).unwrap().len(), 0);
}

#[test]
fn capacity_admission_fails_before_creating_a_shard_or_file() {
    let sb = root_dir();
    // A reserve of 1 TiB cannot be met on the test machine's disk.
    let greedy = SpoolPolicy::custom(4 * 1024 * 1024, 1024 * 1024 * 1024 * 1024, 1024).unwrap();
    let err = unchanged(sb.dir.path(), || {
        spool::allocate(&sb.root, &log_id(1), greedy).unwrap_err()
    });
    match err {
        SpoolError::CapacityUnavailable {
            available_bytes,
            required_bytes,
            ..
        } => assert!(available_bytes < required_bytes),
        other => panic!("expected CapacityUnavailable, got {other:?}"),
    }
    assert_eq!(
        fs::read_dir(&sb.root).unwrap().count(),
        0,
        "root stays empty"
    );
}

#[test]
fn capacity_is_measured_with_statvfs_before_any_directory_is_made() {
    let sb = root_dir();
    let fs_seam = FaultFs::new(RealFs);
    spool::allocate_with(&fs_seam, &sb.root, &log_id(1), POLICY).unwrap();
    let trace = fs_seam.trace();
    let statvfs = trace.iter().position(|op| *op == "fstatvfs").unwrap();
    let first_mkdir = trace.iter().position(|op| *op == "mkdirat").unwrap();
    assert!(statvfs < first_mkdir, "{trace:?}");
}

#[test]
fn reopen_for_capture_appends_and_never_truncates() {
    let sb = root_dir();
    let id = log_id(1);
    spool::allocate(&sb.root, &id, POLICY).unwrap();
    let mut capture = spool::open_for_capture(&sb.root, &id, POLICY.maximum_attempt_bytes).unwrap();
    assert_eq!(capture.length_bytes, 0);
    assert_eq!(capture.remaining_quota_bytes, POLICY.maximum_attempt_bytes);
    let flags = rustix::fs::fcntl_getfl(&capture.file).unwrap();
    assert!(flags.contains(rustix::fs::OFlags::APPEND), "{flags:?}");
    assert!(!flags.contains(rustix::fs::OFlags::NONBLOCK), "{flags:?}");
    let fd_flags = rustix::io::fcntl_getfd(&capture.file).unwrap();
    assert!(fd_flags.contains(rustix::io::FdFlags::CLOEXEC));
    capture.file.write_all(b"before-").unwrap();
    drop(capture);
    // A replayed allocation keeps the prefix.
    spool::allocate(&sb.root, &id, POLICY).unwrap();
    let mut capture = spool::open_for_capture(&sb.root, &id, POLICY.maximum_attempt_bytes).unwrap();
    assert_eq!(capture.length_bytes, 7);
    assert_eq!(
        capture.remaining_quota_bytes,
        POLICY.maximum_attempt_bytes - 7
    );
    capture.file.write_all(b"after").unwrap();
    drop(capture);
    let mut reader = spool::open_reader(&sb.root, &id, POLICY).unwrap();
    let mut all = Vec::new();
    reader.read_to_end(&mut all).unwrap();
    assert_eq!(all, b"before-after");
}

#[test]
fn capture_requires_an_allocated_file_and_a_quota_within_bounds() {
    let sb = root_dir();
    let id = log_id(1);
    let err = unchanged(sb.dir.path(), || {
        spool::open_for_capture(&sb.root, &id, POLICY.maximum_attempt_bytes).unwrap_err()
    });
    assert!(matches!(err, SpoolError::NotFound { .. }), "{err:?}");
    spool::allocate(&sb.root, &id, POLICY).unwrap();
    let err = spool::open_for_capture(&sb.root, &id, 1024).unwrap_err();
    assert!(matches!(err, SpoolError::InvalidPolicy { .. }), "{err:?}");
}

#[test]
fn reader_streams_chunks_of_at_most_64_kib_and_hashes_incrementally() {
    let sb = root_dir();
    let id = log_id(1);
    spool::allocate(&sb.root, &id, POLICY).unwrap();
    let content: Vec<u8> = (0..200_000u32).map(|i| (i * 31 % 251) as u8).collect();
    let mut capture = spool::open_for_capture(&sb.root, &id, POLICY.maximum_attempt_bytes).unwrap();
    capture.file.write_all(&content).unwrap();
    drop(capture);
    let mut reader = spool::open_reader(&sb.root, &id, POLICY).unwrap();
    assert_eq!(reader.len(), content.len() as u64);
    let mut buf = vec![0u8; 1024 * 1024];
    let mut got = Vec::new();
    for _ in 0..1000 {
        let n = reader.read(&mut buf).unwrap();
        assert!(n <= READ_CHUNK_BYTES, "chunk of {n} bytes");
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    assert_eq!(got, content);
    assert_eq!(reader.truncation, None, "no fact published yet: unknown");
    let digest = reader.finish();
    assert_eq!(digest.byte_length, content.len() as u64);
    assert_eq!(digest.sha256, sha256(&content));
}

#[test]
fn truncation_fact_is_authenticated_immutable_and_read_back() {
    let sb = root_dir();
    let id = log_id(1);
    spool::allocate(&sb.root, &id, POLICY).unwrap();
    let fact = fact(1, POLICY.maximum_attempt_bytes, true);
    spool::publish_truncation_fact(&sb.root, &fact).unwrap();
    let other = storage_support::fact(1, POLICY.maximum_attempt_bytes, false);
    let err = unchanged(sb.dir.path(), || {
        spool::publish_truncation_fact(&sb.root, &other).unwrap_err()
    });
    assert!(matches!(err, SpoolError::AlreadyExists { .. }), "{err:?}");
    let fact_path = sb
        .root
        .join("logs")
        .join(&id.as_str()[5..7])
        .join(format!(".{id}.fact"));
    assert_eq!(fs::metadata(&fact_path).unwrap().mode() & 0o7777, 0o600);
    let reader = spool::open_reader(&sb.root, &id, POLICY).unwrap();
    assert_eq!(reader.truncation, Some(true));
    assert_eq!(reader.fact.as_ref(), Some(&fact));
    let digest = reader.finish();
    assert_eq!((digest.byte_length, digest.sha256), (0, sha256(b"")));
}

#[test]
fn a_fact_published_under_another_log_id_name_is_a_mismatch() {
    let sb = root_dir();
    let (one, two) = (log_id(1), log_id(2));
    for id in [&one, &two] {
        spool::allocate(&sb.root, id, POLICY).unwrap();
    }
    spool::publish_truncation_fact(&sb.root, &fact(1, POLICY.maximum_attempt_bytes, false))
        .unwrap();
    let shard =
        |id: &ql_worker_core::ids::LogArtifactId| sb.root.join("logs").join(&id.as_str()[5..7]);
    fs::rename(
        shard(&one).join(format!(".{one}.fact")),
        shard(&two).join(format!(".{two}.fact")),
    )
    .unwrap();
    let err = unchanged(sb.dir.path(), || {
        spool::open_reader(&sb.root, &two, POLICY).unwrap_err()
    });
    match err {
        SpoolError::FactMismatch { field, .. } => assert_eq!(field, "logArtifactId"),
        other => panic!("expected FactMismatch, got {other:?}"),
    }
}

#[test]
fn remove_deletes_log_fact_and_stale_fact_temps_only() {
    let sb = root_dir();
    let (one, two) = (log_id(1), log_id(2));
    for id in [&one, &two] {
        spool::allocate(&sb.root, id, POLICY).unwrap();
    }
    spool::publish_truncation_fact(&sb.root, &fact(1, POLICY.maximum_attempt_bytes, false))
        .unwrap();
    let shard = sb.root.join("logs").join(&one.as_str()[5..7]);
    let stale = shard.join(format!("..{one}.fact.{}.tmp", "3c".repeat(16)));
    fs::write(&stale, b"").unwrap();
    assert!(spool::remove(&sb.root, &one).unwrap());
    assert!(!shard.join(format!("{one}.log")).exists());
    assert!(!shard.join(format!(".{one}.fact")).exists());
    assert!(!stale.exists());
    let two_path = sb
        .root
        .join("logs")
        .join(&two.as_str()[5..7])
        .join(format!("{two}.log"));
    assert!(two_path.exists(), "another log is untouched");
    assert!(!spool::remove(&sb.root, &one).unwrap(), "idempotent");
}
