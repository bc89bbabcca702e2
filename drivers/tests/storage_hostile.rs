//! Hostile input on real files. Each test prepares a valid state root, tampers with it the way
//! an attacker or a broken disk would, then asserts that every storage operation that meets the
//! tampering fails with a typed error naming the rule, and that the whole tree (paths, types,
//! modes, owners, link counts, inodes, sizes, content hashes) is exactly as before.
//!
//! Tests run as root (CI is root): that is what lets them chown files to uid 65534.

mod storage_support;

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};

use ql_worker::fsio::{Rule, StorageError};
use ql_worker::journal::{self, Journal, JournalError};
use ql_worker::receipts::{self, ReceiptStoreError};
use ql_worker::spool::{self, SpoolError, SpoolPolicy};
use ql_worker_core::envelope::EnvelopeError;
use ql_worker_core::ids::{AttemptId, OfferId};
use ql_worker_core::listing::{Capacity, PageLimit};
use ql_worker_sim::testkit;
use storage_support::*;

const POLICY: SpoolPolicy = SpoolPolicy::EDGE;

/// A valid root: record 1 in `launching`, a pending claim, receipt 1, log 1 with 5 bytes and its
/// truncation fact. The journal is closed again (the lock file stays, as after any run).
fn prepared() -> Sandbox {
    let sb = sandbox();
    let mut journal = Journal::open(&sb.root, Capacity::DEFAULT).unwrap();
    let chain = to_launching(1);
    journal.publish_record(&chain[0]).unwrap();
    for pair in chain.windows(2) {
        journal
            .replace_record(&pair[0].offer.offer_id, &pair[1], pair[0].revision)
            .unwrap();
    }
    let claim = ql_worker_core::claim::PendingClaim::new(
        &testkit::worker(),
        testkit::offer_id(2),
        testkit::lease_token(2),
        ms(1000),
    );
    let _ = journal.create_claim(&claim).unwrap();
    drop(journal);
    spool::allocate(&sb.root, &log_id(1), POLICY).unwrap();
    let mut capture =
        spool::open_for_capture(&sb.root, &log_id(1), POLICY.maximum_attempt_bytes).unwrap();
    std::io::Write::write_all(&mut capture.file, b"hello").unwrap();
    drop(capture);
    spool::publish_truncation_fact(&sb.root, &fact(1, POLICY.maximum_attempt_bytes, false))
        .unwrap();
    receipts::publish(&sb.root, &receipt(1)).unwrap();
    sb
}

fn offer1() -> OfferId {
    testkit::offer_id(1)
}

fn attempt1() -> AttemptId {
    AttemptId::new("attempt-1").unwrap()
}

fn record_path(sb: &Sandbox) -> PathBuf {
    sb.root.join("offers/offer-000001.rec")
}

fn log_path(sb: &Sandbox) -> PathBuf {
    let id = log_id(1);
    sb.root
        .join("logs")
        .join(&id.as_str()[5..7])
        .join(format!("{id}.log"))
}

fn log_shard_path(sb: &Sandbox) -> PathBuf {
    log_path(sb).parent().unwrap().to_path_buf()
}

fn receipt_path(sb: &Sandbox) -> PathBuf {
    sb.root.join("receipts/at/attempt-1.rcpt")
}

fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

/// Asserts that a journal operation fails with the given unsafe-storage rule at `path`.
fn journal_rule(result: Result<impl std::fmt::Debug, JournalError>, path: &Path, want: Rule) {
    match result {
        Err(JournalError::Storage(StorageError::UnsafeStorage { path: p, rule })) => {
            assert_eq!(rule, want, "rule at {}", p.display());
            assert_eq!(p, path, "path named by the error");
        }
        other => panic!(
            "expected UnsafeStorage({want:?}) at {}, got {other:?}",
            path.display()
        ),
    }
}

fn spool_rule(result: Result<impl std::fmt::Debug, SpoolError>, path: &Path, want: Rule) {
    match result {
        Err(SpoolError::Storage(StorageError::UnsafeStorage { path: p, rule })) => {
            assert_eq!(rule, want, "rule at {}", p.display());
            assert_eq!(p, path, "path named by the error");
        }
        other => panic!(
            "expected UnsafeStorage({want:?}) at {}, got {other:?}",
            path.display()
        ),
    }
}

fn receipt_rule(result: Result<impl std::fmt::Debug, ReceiptStoreError>, path: &Path, want: Rule) {
    match result {
        Err(ReceiptStoreError::Storage(StorageError::UnsafeStorage { path: p, rule })) => {
            assert_eq!(rule, want, "rule at {}", p.display());
            assert_eq!(p, path, "path named by the error");
        }
        other => panic!(
            "expected UnsafeStorage({want:?}) at {}, got {other:?}",
            path.display()
        ),
    }
}

/// Every journal read path must refuse the tampered record with `want`.
fn journal_reads_refuse(sb: &Sandbox, want: Rule) {
    let path = record_path(sb);
    journal_rule(
        journal::read_record_unlocked(&sb.root, &offer1()),
        &path,
        want,
    );
}

fn corrupt_source(result: Result<impl std::fmt::Debug, JournalError>) -> EnvelopeError {
    match result {
        Err(JournalError::Storage(StorageError::Corrupt { source, path })) => {
            assert!(
                path.ends_with("offers/offer-000001.rec"),
                "{}",
                path.display()
            );
            source
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn symlinked_root_is_refused_by_every_entry_point() {
    let sb = prepared();
    let real = sb.dir.path().join("real-root");
    fs::rename(&sb.root, &real).unwrap();
    std::os::unix::fs::symlink(&real, &sb.root).unwrap();
    unchanged(sb.dir.path(), || {
        journal_rule(
            Journal::open(&sb.root, Capacity::DEFAULT).map(|_| ()),
            &sb.root,
            Rule::Symlink,
        );
        journal_rule(
            journal::read_record_unlocked(&sb.root, &offer1()),
            &sb.root,
            Rule::Symlink,
        );
        spool_rule(
            spool::open_reader(&sb.root, &log_id(1), POLICY).map(|_| ()),
            &sb.root,
            Rule::Symlink,
        );
        spool_rule(
            spool::allocate(&sb.root, &log_id(2), POLICY),
            &sb.root,
            Rule::Symlink,
        );
        receipt_rule(
            receipts::read(&sb.root, &attempt1()),
            &sb.root,
            Rule::Symlink,
        );
    });
}

#[test]
fn symlinked_record_is_refused_on_open_read_list_and_replace() {
    let sb = prepared();
    let mut journal = Journal::open(&sb.root, Capacity::DEFAULT).unwrap();
    let victim = sb.dir.path().join("victim.rec");
    fs::rename(record_path(&sb), &victim).unwrap();
    std::os::unix::fs::symlink(&victim, record_path(&sb)).unwrap();
    let path = record_path(&sb);
    unchanged(sb.dir.path(), || {
        journal_rule(journal.read_record(&offer1()), &path, Rule::Symlink);
        journal_rule(journal.list(None, PageLimit::DEFAULT), &path, Rule::Symlink);
        let next = touched(&to_launching(1)[2]);
        journal_rule(
            journal.replace_record(&offer1(), &next, to_launching(1)[2].revision),
            &path,
            Rule::Symlink,
        );
        journal_rule(journal.publish_record(&accepted(5)), &path, Rule::Symlink);
        journal_reads_refuse(&sb, Rule::Symlink);
    });
    drop(journal);
    unchanged(sb.dir.path(), || {
        journal_rule(
            Journal::open(&sb.root, Capacity::DEFAULT).map(|_| ()),
            &path,
            Rule::Symlink,
        );
    });
}

#[test]
fn symlinked_pending_claim_is_refused() {
    let sb = prepared();
    let victim = sb.dir.path().join("victim-claim");
    let path = sb.root.join("pending-claim");
    // Planted while the owner runs: the next read refuses it.
    let journal = Journal::open(&sb.root, Capacity::DEFAULT).unwrap();
    fs::rename(&path, &victim).unwrap();
    std::os::unix::fs::symlink(&victim, &path).unwrap();
    unchanged(sb.dir.path(), || {
        journal_rule(journal.read_claim(), &path, Rule::Symlink);
    });
    drop(journal);
    // Found at the next open: the root's own check refuses it before the lock is taken.
    unchanged(sb.dir.path(), || {
        journal_rule(
            Journal::open(&sb.root, Capacity::DEFAULT).map(|_| ()),
            &path,
            Rule::Symlink,
        );
    });
}

#[test]
fn symlinked_log_shard_and_receipt_shard_are_never_followed() {
    let sb = prepared();
    let shard = log_shard_path(&sb);
    let elsewhere = sb.dir.path().join("elsewhere-logs");
    fs::rename(&shard, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &shard).unwrap();
    let receipt_shard = sb.root.join("receipts/at");
    let elsewhere_receipts = sb.dir.path().join("elsewhere-receipts");
    fs::rename(&receipt_shard, &elsewhere_receipts).unwrap();
    std::os::unix::fs::symlink(&elsewhere_receipts, &receipt_shard).unwrap();
    unchanged(sb.dir.path(), || {
        spool_rule(
            spool::open_reader(&sb.root, &log_id(1), POLICY).map(|_| ()),
            &shard,
            Rule::Symlink,
        );
        spool_rule(
            spool::open_for_capture(&sb.root, &log_id(1), POLICY.maximum_attempt_bytes).map(|_| ()),
            &shard,
            Rule::Symlink,
        );
        spool_rule(
            spool::allocate(&sb.root, &log_id(1), POLICY),
            &shard,
            Rule::Symlink,
        );
        spool_rule(
            spool::publish_truncation_fact(&sb.root, &fact(1, POLICY.maximum_attempt_bytes, true)),
            &shard,
            Rule::Symlink,
        );
        spool_rule(spool::remove(&sb.root, &log_id(1)), &shard, Rule::Symlink);
        receipt_rule(
            receipts::read(&sb.root, &attempt1()),
            &receipt_shard,
            Rule::Symlink,
        );
        receipt_rule(
            receipts::publish(&sb.root, &receipt(1)),
            &receipt_shard,
            Rule::Symlink,
        );
        receipt_rule(
            receipts::remove(&sb.root, &attempt1()),
            &receipt_shard,
            Rule::Symlink,
        );
        receipt_rule(
            receipts::quarantine(&sb.root, &attempt1()),
            &receipt_shard,
            Rule::Symlink,
        );
    });
}

#[test]
fn symlinked_log_file_is_refused_and_the_victim_is_unchanged() {
    let sb = prepared();
    let victim = sb.dir.path().join("victim.log");
    fs::write(&victim, b"do not touch").unwrap();
    set_mode(&victim, 0o600);
    fs::remove_file(log_path(&sb)).unwrap();
    std::os::unix::fs::symlink(&victim, log_path(&sb)).unwrap();
    let path = log_path(&sb);
    unchanged(sb.dir.path(), || {
        spool_rule(
            spool::open_for_capture(&sb.root, &log_id(1), POLICY.maximum_attempt_bytes).map(|_| ()),
            &path,
            Rule::Symlink,
        );
        spool_rule(
            spool::open_reader(&sb.root, &log_id(1), POLICY).map(|_| ()),
            &path,
            Rule::Symlink,
        );
        spool_rule(
            spool::allocate(&sb.root, &log_id(1), POLICY),
            &path,
            Rule::Symlink,
        );
    });
}

#[test]
fn hard_linked_record_log_and_receipt_are_refused() {
    let sb = prepared();
    fs::hard_link(record_path(&sb), sb.dir.path().join("second-link.rec")).unwrap();
    fs::hard_link(log_path(&sb), sb.dir.path().join("second-link.log")).unwrap();
    fs::hard_link(receipt_path(&sb), sb.dir.path().join("second-link.rcpt")).unwrap();
    let two = Rule::LinkCount { found: 2 };
    unchanged(sb.dir.path(), || {
        journal_reads_refuse(&sb, two);
        let journal = Journal::open(&sb.root, Capacity::DEFAULT).unwrap();
        journal_rule(journal.read_record(&offer1()), &record_path(&sb), two);
        drop(journal);
        spool_rule(
            spool::open_reader(&sb.root, &log_id(1), POLICY).map(|_| ()),
            &log_path(&sb),
            two,
        );
        spool_rule(
            spool::open_for_capture(&sb.root, &log_id(1), POLICY.maximum_attempt_bytes).map(|_| ()),
            &log_path(&sb),
            two,
        );
        receipt_rule(
            receipts::read(&sb.root, &attempt1()),
            &receipt_path(&sb),
            two,
        );
    });
}

#[test]
fn mode_0644_record_log_receipt_and_claim_are_refused() {
    let sb = prepared();
    let claim = sb.root.join("pending-claim");
    for path in [
        record_path(&sb),
        log_path(&sb),
        receipt_path(&sb),
        claim.clone(),
    ] {
        set_mode(&path, 0o644);
    }
    let mode = Rule::Mode { found: 0o644 };
    unchanged(sb.dir.path(), || {
        journal_reads_refuse(&sb, mode);
        let journal = Journal::open(&sb.root, Capacity::DEFAULT).unwrap();
        journal_rule(journal.read_claim(), &claim, mode);
        drop(journal);
        spool_rule(
            spool::open_reader(&sb.root, &log_id(1), POLICY).map(|_| ()),
            &log_path(&sb),
            mode,
        );
        receipt_rule(
            receipts::read(&sb.root, &attempt1()),
            &receipt_path(&sb),
            mode,
        );
    });
}

#[test]
fn log_mode_0400_is_refused_because_logs_must_be_exactly_0600() {
    let sb = prepared();
    set_mode(&log_path(&sb), 0o400);
    unchanged(sb.dir.path(), || {
        spool_rule(
            spool::open_reader(&sb.root, &log_id(1), POLICY).map(|_| ()),
            &log_path(&sb),
            Rule::Mode { found: 0o400 },
        );
    });
}

#[test]
fn mode_0755_root_offers_and_shard_directories_are_refused() {
    let sb = prepared();
    let offers = sb.root.join("offers");
    set_mode(&offers, 0o755);
    let mode = Rule::Mode { found: 0o755 };
    unchanged(sb.dir.path(), || {
        journal_rule(
            Journal::open(&sb.root, Capacity::DEFAULT).map(|_| ()),
            &offers,
            mode,
        );
        journal_rule(
            journal::read_record_unlocked(&sb.root, &offer1()),
            &offers,
            mode,
        );
    });
    set_mode(&offers, 0o700);
    let shard = log_shard_path(&sb);
    set_mode(&shard, 0o755);
    unchanged(sb.dir.path(), || {
        spool_rule(
            spool::open_reader(&sb.root, &log_id(1), POLICY).map(|_| ()),
            &shard,
            mode,
        );
        spool_rule(spool::allocate(&sb.root, &log_id(1), POLICY), &shard, mode);
    });
    set_mode(&shard, 0o700);
    set_mode(&sb.root, 0o755);
    unchanged(sb.dir.path(), || {
        journal_rule(
            Journal::open(&sb.root, Capacity::DEFAULT).map(|_| ()),
            &sb.root,
            mode,
        );
        receipt_rule(receipts::read(&sb.root, &attempt1()), &sb.root, mode);
    });
}

#[test]
fn foreign_owner_on_record_offers_dir_log_and_receipt_is_refused() {
    let sb = prepared();
    let nobody = 65534;
    let owner = Rule::Owner {
        expected: 0,
        found: nobody,
    };
    assert_eq!(
        rustix::process::geteuid().as_raw(),
        0,
        "these tests run as root"
    );
    std::os::unix::fs::chown(record_path(&sb), Some(nobody), Some(nobody)).unwrap();
    std::os::unix::fs::chown(log_path(&sb), Some(nobody), Some(nobody)).unwrap();
    std::os::unix::fs::chown(receipt_path(&sb), Some(nobody), Some(nobody)).unwrap();
    unchanged(sb.dir.path(), || {
        journal_reads_refuse(&sb, owner);
        spool_rule(
            spool::open_for_capture(&sb.root, &log_id(1), POLICY.maximum_attempt_bytes).map(|_| ()),
            &log_path(&sb),
            owner,
        );
        receipt_rule(
            receipts::read(&sb.root, &attempt1()),
            &receipt_path(&sb),
            owner,
        );
    });
    let offers = sb.root.join("offers");
    std::os::unix::fs::chown(&offers, Some(nobody), None).unwrap();
    unchanged(sb.dir.path(), || {
        journal_rule(
            Journal::open(&sb.root, Capacity::DEFAULT).map(|_| ()),
            &offers,
            owner,
        );
    });
}

#[test]
fn oversized_record_receipt_and_log_are_refused_before_reading() {
    let sb = prepared();
    let record = record_path(&sb);
    fs::write(&record, vec![0u8; 160 * 1024 + 1]).unwrap();
    let receipt = receipt_path(&sb);
    fs::write(&receipt, vec![0u8; 4 * 1024 + 1]).unwrap();
    let log = log_path(&sb);
    let file = fs::OpenOptions::new().write(true).open(&log).unwrap();
    file.set_len(POLICY.maximum_attempt_bytes + 1).unwrap();
    drop(file);
    unchanged(sb.dir.path(), || {
        journal_reads_refuse(
            &sb,
            Rule::TooLarge {
                size: 160 * 1024 + 1,
                max: 160 * 1024,
            },
        );
        receipt_rule(
            receipts::read(&sb.root, &attempt1()),
            &receipt,
            Rule::TooLarge {
                size: 4097,
                max: 4096,
            },
        );
        let too_large = Rule::TooLarge {
            size: POLICY.maximum_attempt_bytes + 1,
            max: POLICY.maximum_attempt_bytes,
        };
        spool_rule(
            spool::open_reader(&sb.root, &log_id(1), POLICY).map(|_| ()),
            &log,
            too_large,
        );
        spool_rule(
            spool::open_for_capture(&sb.root, &log_id(1), POLICY.maximum_attempt_bytes).map(|_| ()),
            &log,
            too_large,
        );
    });
}

#[test]
fn truncated_record_is_corrupt() {
    let sb = prepared();
    let bytes = fs::read(record_path(&sb)).unwrap();
    fs::write(record_path(&sb), &bytes[..bytes.len() / 2]).unwrap();
    let err = unchanged(sb.dir.path(), || {
        corrupt_source(journal::read_record_unlocked(&sb.root, &offer1()))
    });
    assert!(
        matches!(err, EnvelopeError::LengthMismatch { .. }),
        "{err:?}"
    );
    fs::write(record_path(&sb), &bytes[..10]).unwrap();
    let err = unchanged(sb.dir.path(), || {
        corrupt_source(journal::read_record_unlocked(&sb.root, &offer1()))
    });
    assert!(
        matches!(err, EnvelopeError::TooShort { len: 10 }),
        "{err:?}"
    );
}

#[test]
fn bit_flipped_record_body_fails_its_checksum() {
    let sb = prepared();
    let mut bytes = fs::read(record_path(&sb)).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    fs::write(record_path(&sb), &bytes).unwrap();
    let journal = Journal::open(&sb.root, Capacity::DEFAULT).unwrap();
    let err = unchanged(sb.dir.path(), || {
        corrupt_source(journal.read_record(&offer1()))
    });
    assert_eq!(err, EnvelopeError::ChecksumMismatch);
    drop(journal);
    // The same for a receipt and a truncation fact.
    let mut receipt = fs::read(receipt_path(&sb)).unwrap();
    receipt[50] ^= 0x80;
    fs::write(receipt_path(&sb), &receipt).unwrap();
    let id = log_id(1);
    let fact = log_shard_path(&sb).join(format!(".{id}.fact"));
    let mut fact_bytes = fs::read(&fact).unwrap();
    let last = fact_bytes.len() - 1;
    fact_bytes[last] ^= 0x04;
    fs::write(&fact, &fact_bytes).unwrap();
    unchanged(sb.dir.path(), || {
        match receipts::read(&sb.root, &attempt1()) {
            Err(ReceiptStoreError::Storage(StorageError::Corrupt {
                source: EnvelopeError::ChecksumMismatch,
                ..
            })) => {}
            other => panic!("expected a checksum failure, got {other:?}"),
        }
        match spool::open_reader(&sb.root, &id, POLICY) {
            Err(SpoolError::Storage(StorageError::Corrupt {
                source: EnvelopeError::ChecksumMismatch,
                path,
            })) => assert_eq!(path, fact),
            other => panic!("expected a checksum failure, got {other:?}"),
        }
    });
}

#[test]
fn garbage_record_is_corrupt_bad_magic() {
    let sb = prepared();
    fs::write(
        record_path(&sb),
        b"{\"schemaVersion\":1,\"this is\":\"json\"} and more garbage",
    )
    .unwrap();
    let err = unchanged(sb.dir.path(), || {
        corrupt_source(journal::read_record_unlocked(&sb.root, &offer1()))
    });
    assert_eq!(err, EnvelopeError::BadMagic);
}

#[test]
fn a_record_renamed_to_another_offers_name_is_a_name_mismatch() {
    let sb = prepared();
    let other = sb.root.join("offers/offer-000007.rec");
    fs::rename(record_path(&sb), &other).unwrap();
    unchanged(sb.dir.path(), || {
        journal_rule(
            journal::read_record_unlocked(&sb.root, &testkit::offer_id(7)),
            &other,
            Rule::NameMismatch,
        );
    });
}

#[test]
fn a_receipt_renamed_to_another_attempt_is_an_attempt_mismatch() {
    let sb = prepared();
    let other = sb.root.join("receipts/at/attempt-2.rcpt");
    fs::rename(receipt_path(&sb), &other).unwrap();
    unchanged(sb.dir.path(), || {
        match receipts::read(&sb.root, &AttemptId::new("attempt-2").unwrap()) {
            Err(ReceiptStoreError::AttemptMismatch { path }) => assert_eq!(path, other),
            other => panic!("expected AttemptMismatch, got {other:?}"),
        }
    });
}

#[test]
fn a_directory_where_a_record_belongs_is_not_regular() {
    let sb = prepared();
    fs::remove_file(record_path(&sb)).unwrap();
    fs::create_dir(record_path(&sb)).unwrap();
    set_mode(&record_path(&sb), 0o700);
    unchanged(sb.dir.path(), || {
        journal_reads_refuse(&sb, Rule::NotRegular);
        journal_rule(
            Journal::open(&sb.root, Capacity::DEFAULT).map(|_| ()),
            &record_path(&sb),
            Rule::NotRegular,
        );
    });
}

#[test]
fn a_fifo_where_a_record_or_log_belongs_is_not_regular_and_never_blocks() {
    let sb = prepared();
    let mode = rustix::fs::Mode::from_raw_mode(0o600);
    fs::remove_file(record_path(&sb)).unwrap();
    rustix::fs::mkfifoat(rustix::fs::CWD, record_path(&sb), mode).unwrap();
    fs::remove_file(log_path(&sb)).unwrap();
    rustix::fs::mkfifoat(rustix::fs::CWD, log_path(&sb), mode).unwrap();
    unchanged(sb.dir.path(), || {
        journal_reads_refuse(&sb, Rule::NotRegular);
        spool_rule(
            spool::open_reader(&sb.root, &log_id(1), POLICY).map(|_| ()),
            &log_path(&sb),
            Rule::NotRegular,
        );
        spool_rule(
            spool::open_for_capture(&sb.root, &log_id(1), POLICY.maximum_attempt_bytes).map(|_| ()),
            &log_path(&sb),
            Rule::NotRegular,
        );
        journal_rule(
            Journal::open(&sb.root, Capacity::DEFAULT).map(|_| ()),
            &record_path(&sb),
            Rule::NotRegular,
        );
    });
}

#[test]
fn a_socket_where_a_record_or_receipt_belongs_is_not_regular() {
    let sb = prepared();
    fs::remove_file(record_path(&sb)).unwrap();
    let _record_socket = std::os::unix::net::UnixListener::bind(record_path(&sb)).unwrap();
    fs::remove_file(receipt_path(&sb)).unwrap();
    let _receipt_socket = std::os::unix::net::UnixListener::bind(receipt_path(&sb)).unwrap();
    unchanged(sb.dir.path(), || {
        journal_reads_refuse(&sb, Rule::NotRegular);
        receipt_rule(
            receipts::read(&sb.root, &attempt1()),
            &receipt_path(&sb),
            Rule::NotRegular,
        );
        journal_rule(
            Journal::open(&sb.root, Capacity::DEFAULT).map(|_| ()),
            &record_path(&sb),
            Rule::NotRegular,
        );
    });
}

#[test]
fn a_stray_file_in_the_offers_directory_fails_closed() {
    let sb = prepared();
    let mut journal = Journal::open(&sb.root, Capacity::DEFAULT).unwrap();
    let stray = sb.root.join("offers/README.txt");
    fs::write(&stray, b"hello").unwrap();
    set_mode(&stray, 0o600);
    // A temp-looking name that is not exactly our pattern is foreign too.
    unchanged(sb.dir.path(), || {
        journal_rule(
            journal.list(None, PageLimit::DEFAULT),
            &stray,
            Rule::ForeignEntry,
        );
        journal_rule(journal.len(), &stray, Rule::ForeignEntry);
        journal_rule(
            journal.publish_record(&accepted(3)),
            &stray,
            Rule::ForeignEntry,
        );
    });
    drop(journal);
    unchanged(sb.dir.path(), || {
        journal_rule(
            Journal::open(&sb.root, Capacity::DEFAULT).map(|_| ()),
            &stray,
            Rule::ForeignEntry,
        );
    });
    fs::remove_file(&stray).unwrap();
    let near_temp = sb
        .root
        .join(format!("offers/.offer-000002.rec.{}.tmp", "AB".repeat(16)));
    fs::write(&near_temp, b"").unwrap();
    unchanged(sb.dir.path(), || {
        journal_rule(
            Journal::open(&sb.root, Capacity::DEFAULT).map(|_| ()),
            &near_temp,
            Rule::ForeignEntry,
        );
    });
}

#[test]
fn a_truncation_fact_for_another_quota_is_a_mismatch_and_a_missing_one_is_unknown() {
    let sb = prepared();
    unchanged(sb.dir.path(), || {
        match spool::open_reader(&sb.root, &log_id(1), SpoolPolicy::NODE) {
            // The log (5 bytes) fits the node quota; the fact was written for the edge quota.
            Err(SpoolError::FactMismatch { field, .. }) => assert_eq!(field, "maximumBytes"),
            other => panic!("expected FactMismatch, got {other:?}"),
        }
    });
    let id = log_id(1);
    fs::remove_file(log_shard_path(&sb).join(format!(".{id}.fact"))).unwrap();
    let reader = unchanged(sb.dir.path(), || {
        spool::open_reader(&sb.root, &id, POLICY).unwrap()
    });
    assert_eq!(reader.truncation, None, "missing fact means unknown");
}

/// An envelope sealed around `body` with a correct checksum (what a tamperer who knows the
/// format writes).
fn resealed(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut out = b"QLWE".to_vec();
    out.extend_from_slice(&[kind, 1, 0, 0]);
    out.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
    out.extend_from_slice(sha256(body).as_bytes());
    out.extend_from_slice(body);
    out
}

#[test]
fn a_record_resealed_around_a_changed_revision_is_corrupt_for_every_reader_and_for_replace() {
    // The revision is trusted as a type only after the one validation a record read from disk
    // gets, when it is decoded: a good checksum is not enough.
    let sb = prepared();
    let stored = journal::read_record_unlocked(&sb.root, &offer1()).unwrap();
    let mut tampered = stored.clone();
    tampered.offer.execution_revision.working_directory = Some(String::from("/tmp"));
    fs::write(
        record_path(&sb),
        resealed(1, &postcard::to_allocvec(&tampered).unwrap()),
    )
    .unwrap();
    let mut journal = Journal::open(&sb.root, Capacity::DEFAULT).unwrap();
    let next = touched(&tampered);
    unchanged(sb.dir.path(), || {
        for err in [
            corrupt_source(journal.read_record(&offer1())),
            corrupt_source(journal::read_record_unlocked(&sb.root, &offer1())),
            corrupt_source(journal.replace_record(&offer1(), &next, tampered.revision)),
        ] {
            assert!(
                matches!(err, EnvelopeError::Invalid(_)),
                "{err:?} must be the record's own rules"
            );
            assert!(err.to_string().contains("executionRevision"), "{err}");
        }
    });
}
