//! The offer journal on real files: layout and modes, the owner lock, publish/replace/clear/read,
//! the core's CAS under the lock, listing, capacity and stale temp removal.

mod storage_support;

use std::fs;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

use ql_worker::fsio::Rule;
use ql_worker::journal::{self, Journal, JournalError};
use ql_worker_core::claim::{ClaimCreate, ClaimError, PendingClaim};
use ql_worker_core::ids::{OfferId, Revision};
use ql_worker_core::listing::{Capacity, PageLimit};
use ql_worker_core::record::{State, TransitionError};
use ql_worker_sim::testkit;
use storage_support::*;

fn open(root: &std::path::Path) -> Journal {
    Journal::open(root, Capacity::DEFAULT).unwrap()
}

#[test]
fn open_creates_root_and_offers_0700_and_lock_file_0600() {
    let sb = sandbox();
    let journal = open(&sb.root);
    let mode = |p: &std::path::Path| fs::symlink_metadata(p).unwrap().mode() & 0o7777;
    assert_eq!(mode(&sb.root), 0o700);
    assert_eq!(mode(&sb.root.join("offers")), 0o700);
    assert_eq!(mode(&sb.root.join(".owner.lock")), 0o600);
    assert_eq!(journal.owner_lock().path(), sb.root.join(".owner.lock"));
    assert_eq!(journal.len().unwrap(), 0);
}

#[test]
fn second_owner_fails_at_once_with_already_owned_naming_the_lock() {
    let sb = sandbox();
    let first = open(&sb.root);
    let err = Journal::open(&sb.root, Capacity::DEFAULT).unwrap_err();
    match &err {
        JournalError::AlreadyOwned { path } => assert_eq!(path, &sb.root.join(".owner.lock")),
        other => panic!("expected AlreadyOwned, got {other:?}"),
    }
    assert!(err.to_string().contains(".owner.lock"), "{err}");
    drop(first);
    // The kernel released the flock with the fd: a new owner gets it at once.
    let _second = open(&sb.root);
}

#[test]
fn published_record_reads_back_with_0600_and_one_link() {
    let sb = sandbox();
    let mut journal = open(&sb.root);
    let record = accepted(1);
    journal.publish_record(&record).unwrap();
    let id = &record.offer.offer_id;
    assert_eq!(journal.read_record(id).unwrap(), Some(record.clone()));
    assert_eq!(journal::read_record_unlocked(&sb.root, id).unwrap(), record);
    let meta = fs::symlink_metadata(sb.root.join("offers/offer-000001.rec")).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o600);
    assert_eq!(meta.nlink(), 1);
    assert!(temps_in(&sb.root.join("offers")).is_empty());
}

#[test]
fn publishing_an_existing_record_is_already_exists_and_changes_nothing() {
    let sb = sandbox();
    let mut journal = open(&sb.root);
    let record = accepted(1);
    journal.publish_record(&record).unwrap();
    let err = unchanged(&sb.root, || journal.publish_record(&record).unwrap_err());
    assert!(matches!(err, JournalError::AlreadyExists { .. }), "{err:?}");
}

#[test]
fn publishing_a_record_above_revision_zero_is_refused() {
    let sb = sandbox();
    let mut journal = open(&sb.root);
    let r1 = touched(&accepted(1));
    let err = unchanged(&sb.root, || journal.publish_record(&r1).unwrap_err());
    assert!(matches!(err, JournalError::Refused { .. }), "{err:?}");
}

#[test]
fn replace_walks_the_chain_and_the_core_cas_refuses_stale_and_illegal_updates() {
    let sb = sandbox();
    let mut journal = open(&sb.root);
    let chain = to_completed(1, 1000);
    let id = chain[0].offer.offer_id.clone();
    journal.publish_record(&chain[0]).unwrap();
    for pair in chain.windows(2) {
        journal
            .replace_record(&id, &pair[1], pair[0].revision)
            .unwrap();
        assert_eq!(journal.read_record(&id).unwrap().as_ref(), Some(&pair[1]));
    }
    let last = chain.last().unwrap();
    assert_eq!(last.state, State::CompletionAcknowledged);

    // Stale expected revision: the core says no, nothing is written.
    let again = touched(last);
    let err = unchanged(&sb.root, || {
        journal
            .replace_record(&id, &again, chain[1].revision)
            .unwrap_err()
    });
    assert!(
        matches!(
            err,
            JournalError::Transition {
                source: TransitionError::StaleRevision { .. },
                ..
            }
        ),
        "{err:?}"
    );
    // Terminal state never changes.
    let illegal = step(last, State::RecoveryRequired, |r| {
        r.recovery_reason = Some(ql_worker_core::record::RecoveryReason::ControlPlaneTerminal);
        r.completion_acknowledged_at_ms = None;
    });
    let err = unchanged(&sb.root, || {
        journal
            .replace_record(&id, &illegal, last.revision)
            .unwrap_err()
    });
    assert!(matches!(err, JournalError::Transition { .. }), "{err:?}");
}

#[test]
fn replace_refuses_a_proposed_record_whose_revision_is_not_the_stored_one() {
    // The proposed record's revision is not digested again: it must equal the stored one, which
    // was validated when it was decoded. Changed without a new digest, it is an authority change.
    let sb = sandbox();
    let mut journal = open(&sb.root);
    let r0 = accepted(1);
    journal.publish_record(&r0).unwrap();
    let mut proposed = touched(&r0);
    proposed.offer.execution_revision.timeout_ms = Some(1);
    let err = unchanged(&sb.root, || {
        journal
            .replace_record(&r0.offer.offer_id, &proposed, r0.revision)
            .unwrap_err()
    });
    assert!(
        matches!(
            err,
            JournalError::Transition {
                source: TransitionError::AuthorityChanged {
                    field: "executionRevision"
                },
                ..
            }
        ),
        "{err:?}"
    );
}

#[test]
fn replace_of_a_missing_record_is_not_found() {
    let sb = sandbox();
    let mut journal = open(&sb.root);
    let r0 = accepted(1);
    let err = unchanged(&sb.root, || {
        journal
            .replace_record(&r0.offer.offer_id, &touched(&r0), r0.revision)
            .unwrap_err()
    });
    assert!(matches!(err, JournalError::NotFound { .. }), "{err:?}");
}

#[test]
fn capacity_exhausted_at_the_configured_capacity_counts_settled_records() {
    let sb = sandbox();
    let mut journal = Journal::open(&sb.root, Capacity::new(2).unwrap()).unwrap();
    journal.publish_record(&accepted(1)).unwrap();
    let settled = to_start_failure(2, 500);
    journal.publish_record(&settled[0]).unwrap();
    for pair in settled.windows(2) {
        journal
            .replace_record(&pair[0].offer.offer_id, &pair[1], pair[0].revision)
            .unwrap();
    }
    let err = unchanged(&sb.root, || {
        journal.publish_record(&accepted(3)).unwrap_err()
    });
    assert!(
        matches!(err, JournalError::CapacityExhausted { capacity: 2, .. }),
        "{err:?}"
    );
    assert!(Capacity::new(1025).is_err());
    assert_eq!(Capacity::DEFAULT.get(), 64);
}

#[test]
fn listing_is_a_stable_keyset_with_pages_of_at_most_64() {
    let sb = sandbox();
    let mut journal = Journal::open(&sb.root, Capacity::new(200).unwrap()).unwrap();
    // Publish in a scrambled order; the listing is sorted regardless of directory order.
    let mut ns: Vec<u32> = (1..=150).collect();
    ns.sort_by_key(|n| (n * 7919) % 151);
    for n in &ns {
        journal.publish_record(&accepted(*n)).unwrap();
    }
    let mut seen = Vec::new();
    let mut after: Option<OfferId> = None;
    for _ in 0..10 {
        let page = journal
            .list(after.as_ref(), PageLimit::new(64).unwrap())
            .unwrap();
        assert!(page.offer_ids.len() <= 64);
        seen.extend(page.offer_ids.iter().cloned());
        match page.next_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let expected: Vec<OfferId> = (1..=150).map(testkit::offer_id).collect();
    assert_eq!(seen, expected);
    // A record published after the cursor's position appears on a later page, never twice.
    let first = journal.list(None, PageLimit::new(10).unwrap()).unwrap();
    assert_eq!(first.next_after, Some(testkit::offer_id(10)));
    journal.publish_record(&accepted(151)).unwrap();
    let second = journal
        .list(first.next_after.as_ref(), PageLimit::new(10).unwrap())
        .unwrap();
    assert_eq!(second.offer_ids.first(), Some(&testkit::offer_id(11)));
    assert!(PageLimit::new(65).is_err());
}

#[test]
fn pending_claim_create_is_idempotent_then_replace_and_clear_follow_the_core_rules() {
    let sb = sandbox();
    let mut journal = open(&sb.root);
    let claim = PendingClaim::new(
        &testkit::worker(),
        testkit::offer_id(1),
        testkit::lease_token(1),
        ms(1000),
    );
    assert_eq!(journal.create_claim(&claim).unwrap(), ClaimCreate::Publish);
    assert_eq!(
        unchanged(&sb.root, || journal.create_claim(&claim).unwrap()),
        ClaimCreate::AlreadyExists
    );
    let other = PendingClaim::new(
        &testkit::worker(),
        testkit::offer_id(2),
        testkit::lease_token(2),
        ms(1000),
    );
    let err = unchanged(&sb.root, || journal.create_claim(&other).unwrap_err());
    assert!(
        matches!(
            err,
            JournalError::Claim {
                source: ClaimError::Conflict,
                ..
            }
        ),
        "{err:?}"
    );
    let mut next = claim.clone();
    next.revision = Revision::new(1).unwrap();
    next.attempt_count = 1;
    next.updated_at_ms = ms(1010);
    next.last_attempt_at_ms = Some(ms(1010));
    let stale = Revision::new(7).unwrap();
    let err = unchanged(&sb.root, || {
        journal.replace_claim(&next, stale).unwrap_err()
    });
    assert!(matches!(err, JournalError::Claim { .. }), "{err:?}");
    journal.replace_claim(&next, claim.revision).unwrap();
    assert_eq!(journal.read_claim().unwrap(), Some(next.clone()));
    let err = unchanged(&sb.root, || {
        journal
            .clear_claim(&testkit::offer_id(1), claim.revision)
            .unwrap_err()
    });
    assert!(matches!(err, JournalError::Claim { .. }), "{err:?}");
    journal
        .clear_claim(&testkit::offer_id(1), next.revision)
        .unwrap();
    assert_eq!(journal.read_claim().unwrap(), None);
    assert!(!sb.root.join("pending-claim").exists());
}

#[test]
fn stale_temps_of_our_pattern_are_removed_on_open_and_never_listed() {
    let sb = sandbox();
    let mut journal = open(&sb.root);
    journal.publish_record(&accepted(1)).unwrap();
    // A temp left by a crash mid-write is listed as nothing.
    let stale = sb
        .root
        .join("offers")
        .join(format!(".offer-000002.rec.{}.tmp", "0f".repeat(16)));
    fs::write(&stale, b"half a rec").unwrap();
    fs::set_permissions(&stale, fs::Permissions::from_mode(0o600)).unwrap();
    let claim_temp = sb
        .root
        .join(format!(".pending-claim.{}.tmp", "a1".repeat(16)));
    fs::write(&claim_temp, b"").unwrap();
    let page = journal.list(None, PageLimit::DEFAULT).unwrap();
    assert_eq!(page.offer_ids, vec![testkit::offer_id(1)]);
    assert_eq!(journal.len().unwrap(), 1);
    drop(journal);
    let journal = open(&sb.root);
    assert!(!stale.exists(), "stale record temp removed on open");
    assert!(!claim_temp.exists(), "stale claim temp removed on open");
    assert_eq!(journal.len().unwrap(), 1);
}

#[test]
fn read_record_unlocked_works_while_the_owner_holds_the_lock_and_reports_not_found() {
    let sb = sandbox();
    let mut journal = open(&sb.root);
    let chain = to_launching(1);
    journal.publish_record(&chain[0]).unwrap();
    journal
        .replace_record(&chain[0].offer.offer_id, &chain[1], chain[0].revision)
        .unwrap();
    let read = journal::read_record_unlocked(&sb.root, &chain[0].offer.offer_id).unwrap();
    assert_eq!(read, chain[1]);
    let err = journal::read_record_unlocked(&sb.root, &testkit::offer_id(9)).unwrap_err();
    assert!(matches!(err, JournalError::NotFound { .. }), "{err:?}");
    let missing_root = sb.dir.path().join("nowhere");
    let err = journal::read_record_unlocked(&missing_root, &testkit::offer_id(1)).unwrap_err();
    assert!(matches!(err, JournalError::NotFound { .. }), "{err:?}");
    assert!(!missing_root.exists(), "an unlocked read creates nothing");
}

#[test]
fn remove_settled_record_refuses_non_terminal_and_removes_terminal() {
    let sb = sandbox();
    let mut journal = open(&sb.root);
    let live = to_recovery(1);
    journal.publish_record(&live[0]).unwrap();
    journal
        .replace_record(&live[0].offer.offer_id, &live[1], live[0].revision)
        .unwrap();
    let err = unchanged(&sb.root, || {
        journal
            .remove_settled_record(&live[1].offer.offer_id, live[1].revision)
            .unwrap_err()
    });
    assert!(
        matches!(
            err,
            JournalError::NotSettled {
                state: State::RecoveryRequired,
                ..
            }
        ),
        "{err:?}"
    );
    let done = to_start_failure(2, 400);
    journal.publish_record(&done[0]).unwrap();
    for pair in done.windows(2) {
        journal
            .replace_record(&pair[0].offer.offer_id, &pair[1], pair[0].revision)
            .unwrap();
    }
    let last = done.last().unwrap();
    // A handle its supervisor published (issue 16) goes with the settled record.
    let attempt = &last.offer.candidate.attempt_id;
    let published =
        ql_worker::receipts::publish_handle(&sb.root, attempt, "ql3lp1.example").unwrap();
    journal
        .remove_settled_record(&last.offer.offer_id, last.revision)
        .unwrap();
    assert_eq!(journal.read_record(&last.offer.offer_id).unwrap(), None);
    assert!(!published.exists(), "{published:?} left behind");
}

#[test]
fn a_relative_or_dotted_root_is_refused_before_anything_is_created() {
    let sb = sandbox();
    for bad in ["relative/root", "/tmp/../etc"] {
        let err = Journal::open(std::path::Path::new(bad), Capacity::DEFAULT).unwrap_err();
        assert!(
            matches!(err.unsafe_rule(), Some(Rule::RootPath(_))),
            "{bad}: {err:?}"
        );
    }
    assert!(!sb.root.exists());
}

/// A seam that plays the owner's replace at the worst moment: after a lockless reader opened
/// the record and before its `fstat`, a new inode (same bytes, mode 0600) is renamed over the
/// name, exactly as `Journal::replace_record` does. Everything else is the real file system.
#[derive(Debug)]
struct RaceFs {
    record: &'static str,
    replacement: std::path::PathBuf,
    target: std::path::PathBuf,
    armed: std::sync::atomic::AtomicBool,
    raced: std::sync::atomic::AtomicU32,
}

mod race_seam {
    use std::os::fd::{BorrowedFd, OwnedFd};
    use std::path::Path;
    use std::sync::atomic::Ordering;

    use ql_worker::fsio::{Entry, FileSystem, Meta, RealFs, Space};
    use rustix::fs::OFlags;
    use rustix::io::Errno;

    impl FileSystem for super::RaceFs {
        fn open(&self, path: &Path, flags: OFlags, mode: u32) -> Result<OwnedFd, Errno> {
            RealFs.open(path, flags, mode)
        }
        fn mkdir(&self, path: &Path, mode: u32) -> Result<(), Errno> {
            RealFs.mkdir(path, mode)
        }
        fn openat(
            &self,
            dir: BorrowedFd<'_>,
            name: &str,
            flags: OFlags,
            mode: u32,
        ) -> Result<OwnedFd, Errno> {
            let fd = RealFs.openat(dir, name, flags, mode)?;
            if name == self.record && self.raced.load(Ordering::SeqCst) == 0 {
                self.armed.store(true, Ordering::SeqCst);
            }
            Ok(fd)
        }
        fn mkdirat(&self, dir: BorrowedFd<'_>, name: &str, mode: u32) -> Result<(), Errno> {
            RealFs.mkdirat(dir, name, mode)
        }
        fn fstat(&self, fd: BorrowedFd<'_>) -> Result<Meta, Errno> {
            if self.armed.swap(false, Ordering::SeqCst) {
                std::fs::rename(&self.replacement, &self.target).unwrap();
                self.raced.fetch_add(1, Ordering::SeqCst);
            }
            RealFs.fstat(fd)
        }
        fn stat_nofollow(&self, dir: BorrowedFd<'_>, name: &str) -> Result<Meta, Errno> {
            RealFs.stat_nofollow(dir, name)
        }
        fn fstatvfs(&self, fd: BorrowedFd<'_>) -> Result<Space, Errno> {
            RealFs.fstatvfs(fd)
        }
        fn fchmod(&self, fd: BorrowedFd<'_>, mode: u32) -> Result<(), Errno> {
            RealFs.fchmod(fd, mode)
        }
        fn clear_nonblock(&self, fd: BorrowedFd<'_>) -> Result<(), Errno> {
            RealFs.clear_nonblock(fd)
        }
        fn read(&self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
            RealFs.read(fd, buf)
        }
        fn write(&self, fd: BorrowedFd<'_>, buf: &[u8]) -> Result<usize, Errno> {
            RealFs.write(fd, buf)
        }
        fn fsync(&self, fd: BorrowedFd<'_>) -> Result<(), Errno> {
            RealFs.fsync(fd)
        }
        fn rename(
            &self,
            old_dir: BorrowedFd<'_>,
            old: &str,
            new_dir: BorrowedFd<'_>,
            new: &str,
        ) -> Result<(), Errno> {
            RealFs.rename(old_dir, old, new_dir, new)
        }
        fn rename_noreplace(
            &self,
            old_dir: BorrowedFd<'_>,
            old: &str,
            new_dir: BorrowedFd<'_>,
            new: &str,
        ) -> Result<(), Errno> {
            RealFs.rename_noreplace(old_dir, old, new_dir, new)
        }
        fn link(
            &self,
            old_dir: BorrowedFd<'_>,
            old: &str,
            new_dir: BorrowedFd<'_>,
            new: &str,
        ) -> Result<(), Errno> {
            RealFs.link(old_dir, old, new_dir, new)
        }
        fn unlink(&self, dir: BorrowedFd<'_>, name: &str) -> Result<(), Errno> {
            RealFs.unlink(dir, name)
        }
        fn read_dir(&self, dir: BorrowedFd<'_>, max: usize) -> Result<Vec<Entry>, Errno> {
            RealFs.read_dir(dir, max)
        }
        fn lock_exclusive(&self, fd: BorrowedFd<'_>) -> Result<(), Errno> {
            RealFs.lock_exclusive(fd)
        }
        fn random(&self, buf: &mut [u8]) -> Result<(), Errno> {
            RealFs.random(buf)
        }
    }
}

/// Finding 6 of docs/reliability.md: a read-only reader (`ql-worker inbox`, `recover`, the
/// supervisor's barrier re-check) beside a busy owner. The owner's replace renames a new inode
/// over the record; a reader that opened the old inode sees no link left at its `fstat`. That
/// is a lost race, not unsafe storage: the read must open the name again and return the record.
#[test]
fn a_lockless_read_that_loses_the_race_with_a_replace_reads_the_new_inode() {
    use std::os::unix::fs::PermissionsExt as _;
    let sb = sandbox();
    let mut journal = open(&sb.root);
    let record = accepted(1);
    journal.publish_record(&record).unwrap();
    let target = sb.root.join("offers/offer-000001.rec");
    let replacement = sb.root.join("offers.replacement");
    fs::copy(&target, &replacement).unwrap();
    fs::set_permissions(&replacement, fs::Permissions::from_mode(0o600)).unwrap();
    let seam = RaceFs {
        record: "offer-000001.rec",
        replacement,
        target,
        armed: std::sync::atomic::AtomicBool::new(false),
        raced: std::sync::atomic::AtomicU32::new(0),
    };
    let id = &record.offer.offer_id;
    let read = journal::read_record_unlocked_with(&seam, &sb.root, id);
    assert_eq!(
        seam.raced.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "the race was played"
    );
    assert_eq!(read.unwrap(), record);
}
