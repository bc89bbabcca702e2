//! Fault injection through the seam: for every operation that writes durable state, a clean run
//! counts its system calls; then, for every N in 1..=count, with EIO and with ENOSPC, once and
//! sticky (a dead disk, so the cleanup fails too), call N fails. Each time we assert:
//!
//! * the operation fails (fail closed: every call on the path is essential);
//! * an fsync failure is reported as fatal (`FsyncFailed`);
//! * what is on disk is exactly the state before the operation when the failing call came at or
//!   before the publishing step (rename / link / unlink), and exactly the state after it when it
//!   came later (only the directory fsync is later) — never a torn or half-visible file;
//! * no temp file is ever mistaken for a record, and reopening the journal sweeps them;
//! * a non-fatal failure leaves the journal usable: the same operation then succeeds.

mod storage_support;

use std::fs;
use std::path::Path;
use std::sync::Arc;

use ql_worker::fsio::{FileSystem, RealFs};
use ql_worker::journal::{Journal, JournalError};
use ql_worker::{receipts, spool};
use ql_worker_core::claim::PendingClaim;
use ql_worker_core::envelope;
use ql_worker_core::ids::Revision;
use ql_worker_core::listing::Capacity;
use ql_worker_core::receipt::Receipt;
use ql_worker_core::record::InboxRecord;
use ql_worker_core::truncation::TruncationFact;
use ql_worker_sim::fault_fs::{FaultFs, FaultPlan};
use ql_worker_sim::testkit;
use rustix::io::Errno;
use storage_support::*;

type Seam = Arc<FaultFs<RealFs>>;
type FaultJournal = Journal<Seam>;

/// What is durably there, decoded straight from the bytes on disk (no sweeping, no lock).
#[derive(Clone, Debug, PartialEq, Eq)]
enum Observed {
    Record(Option<Box<InboxRecord>>),
    Claim(Option<PendingClaim>),
    Receipt(Option<Receipt>),
    Fact(Option<TruncationFact>),
}

fn decode_file<T: envelope::Durable>(path: &Path) -> Option<T> {
    match fs::read(path) {
        Ok(bytes) => Some(
            envelope::decode(&bytes)
                .unwrap_or_else(|e| panic!("torn or corrupt file {}: {e}", path.display())),
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => panic!("{}: {e}", path.display()),
    }
}

fn claim() -> PendingClaim {
    PendingClaim::new(
        &testkit::worker(),
        testkit::offer_id(1),
        testkit::lease_token(1),
        ms(1000),
    )
}

fn claim_next() -> PendingClaim {
    let mut next = claim();
    next.revision = Revision::new(1).unwrap();
    next.attempt_count = 1;
    next.updated_at_ms = ms(1010);
    next.last_attempt_at_ms = Some(ms(1010));
    next
}

/// One durable operation under test.
struct Case {
    name: &'static str,
    /// Prepares the root through the journal (never faulted).
    setup: fn(&mut FaultJournal),
    /// The operation; it may use the journal or the seam directly.
    op: fn(&mut FaultJournal, &Seam, &Path) -> Result<(), String>,
    /// Whether an error is fatal, from the operation's own error type.
    observe: fn(&Path) -> Observed,
    before: fn() -> Observed,
    after: fn() -> Observed,
    /// The system call that makes the change visible.
    effect: &'static str,
}

fn journal_op(result: Result<impl Sized, JournalError>) -> Result<(), String> {
    result
        .map(|_| ())
        .map_err(|e| format!("{}{e}", fatal_tag(e.is_fatal())))
}

fn fatal_tag(fatal: bool) -> &'static str {
    if fatal { "FATAL: " } else { "" }
}

fn record_at(root: &Path) -> Observed {
    Observed::Record(decode_file(&root.join("offers/offer-000001.rec")).map(Box::new))
}

fn claim_at(root: &Path) -> Observed {
    Observed::Claim(decode_file(&root.join("pending-claim")))
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "publish_record",
            setup: |_| {},
            op: |j, _, _| journal_op(j.publish_record(&accepted(1))),
            observe: record_at,
            before: || Observed::Record(None),
            after: || Observed::Record(Some(Box::new(accepted(1)))),
            effect: "renameat2",
        },
        Case {
            name: "replace_record",
            setup: |j| j.publish_record(&accepted(1)).unwrap(),
            op: |j, _, _| {
                let r0 = accepted(1);
                journal_op(j.replace_record(&r0.offer.offer_id, &touched(&r0), r0.revision))
            },
            observe: record_at,
            before: || Observed::Record(Some(Box::new(accepted(1)))),
            after: || Observed::Record(Some(Box::new(touched(&accepted(1))))),
            effect: "renameat",
        },
        Case {
            name: "remove_settled_record",
            setup: |j| {
                let chain = to_start_failure(1, 500);
                j.publish_record(&chain[0]).unwrap();
                for pair in chain.windows(2) {
                    j.replace_record(&pair[0].offer.offer_id, &pair[1], pair[0].revision)
                        .unwrap();
                }
            },
            op: |j, _, _| {
                let last = to_start_failure(1, 500).pop().unwrap();
                journal_op(j.remove_settled_record(&last.offer.offer_id, last.revision))
            },
            observe: record_at,
            before: || Observed::Record(to_start_failure(1, 500).pop().map(Box::new)),
            after: || Observed::Record(None),
            effect: "unlinkat",
        },
        Case {
            name: "create_claim",
            setup: |_| {},
            op: |j, _, _| journal_op(j.create_claim(&claim())),
            observe: claim_at,
            before: || Observed::Claim(None),
            after: || Observed::Claim(Some(claim())),
            effect: "renameat2",
        },
        Case {
            name: "replace_claim",
            setup: |j| {
                let _ = j.create_claim(&claim()).unwrap();
            },
            op: |j, _, _| journal_op(j.replace_claim(&claim_next(), claim().revision)),
            observe: claim_at,
            before: || Observed::Claim(Some(claim())),
            after: || Observed::Claim(Some(claim_next())),
            effect: "renameat",
        },
        Case {
            name: "clear_claim",
            setup: |j| {
                let _ = j.create_claim(&claim()).unwrap();
            },
            op: |j, _, _| journal_op(j.clear_claim(&testkit::offer_id(1), claim().revision)),
            observe: claim_at,
            before: || Observed::Claim(Some(claim())),
            after: || Observed::Claim(None),
            effect: "unlinkat",
        },
        Case {
            name: "receipt_publish",
            setup: |_| {},
            op: |_, seam, root| {
                receipts::publish_with(&**seam, root, &receipt(1))
                    .map(|_| ())
                    .map_err(|e| format!("{}{e}", fatal_tag(e.is_fatal())))
            },
            observe: |root| {
                Observed::Receipt(decode_file(&root.join("receipts/at/attempt-1.rcpt")))
            },
            before: || Observed::Receipt(None),
            after: || Observed::Receipt(Some(receipt(1))),
            effect: "renameat2",
        },
        Case {
            name: "truncation_fact_publish",
            setup: |j| {
                spool::allocate(j.root(), &log_id(1), spool::SpoolPolicy::EDGE).unwrap();
            },
            op: |_, seam, root| {
                let fact = fact(1, spool::SpoolPolicy::EDGE.maximum_attempt_bytes, false);
                spool::publish_truncation_fact_with(&**seam, root, &fact)
                    .map_err(|e| format!("{}{e}", fatal_tag(e.is_fatal())))
            },
            observe: |root| {
                let id = log_id(1);
                let path = root
                    .join("logs")
                    .join(&id.as_str()[5..7])
                    .join(format!(".{id}.fact"));
                Observed::Fact(decode_file(&path))
            },
            before: || Observed::Fact(None),
            after: || {
                Observed::Fact(Some(fact(
                    1,
                    spool::SpoolPolicy::EDGE.maximum_attempt_bytes,
                    false,
                )))
            },
            effect: "renameat2",
        },
    ]
}

fn prepared(case: &Case) -> (Sandbox, Seam, FaultJournal) {
    let sb = sandbox();
    let seam: Seam = Arc::new(FaultFs::new(RealFs));
    let mut journal = Journal::open_with(Arc::clone(&seam), &sb.root, Capacity::DEFAULT).unwrap();
    (case.setup)(&mut journal);
    seam.arm(None);
    (sb, seam, journal)
}

/// Every name in `dir` is either one of `allowed` or one of our temp names.
fn only_expected_names(dir: &Path, allowed: &[&str]) -> usize {
    let mut temps = 0;
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    for entry in entries {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if ql_worker::layout::temp_target(&name).is_some() {
            temps += 1;
        } else {
            assert!(
                allowed.contains(&name.as_str()),
                "unexpected entry {name} in {}",
                dir.display()
            );
        }
    }
    temps
}

fn run_case(case: &Case) -> usize {
    // The clean run fixes the call sequence.
    let (sb, seam, mut journal) = prepared(case);
    (case.op)(&mut journal, &seam, &sb.root).unwrap();
    let trace = seam.trace();
    assert_eq!(
        (case.observe)(&sb.root),
        (case.after)(),
        "{}: clean run",
        case.name
    );
    let effect_at = trace
        .iter()
        .position(|op| *op == case.effect)
        .unwrap_or_else(|| panic!("{}: no {} in {trace:?}", case.name, case.effect))
        + 1;
    drop(journal);
    let mut runs = 0;
    for nth in 1..=trace.len() as u64 {
        for errno in [Errno::IO, Errno::NOSPC] {
            for sticky in [false, true] {
                runs += 1;
                let what = format!(
                    "{} failing call {nth} ({}) with {errno:?}{}",
                    case.name,
                    trace[nth as usize - 1],
                    if sticky { ", sticky" } else { "" }
                );
                let (sb, seam, mut journal) = prepared(case);
                seam.arm(Some(FaultPlan { nth, errno, sticky }));
                let err = (case.op)(&mut journal, &seam, &sb.root)
                    .expect_err(&format!("{what}: must fail closed"));
                let failed_op = seam.trace()[nth as usize - 1];
                assert_eq!(
                    failed_op,
                    trace[nth as usize - 1],
                    "{what}: same call sequence"
                );
                if failed_op == "fsync" {
                    assert!(
                        err.starts_with("FATAL: "),
                        "{what}: fsync failure is fatal: {err}"
                    );
                } else {
                    assert!(!err.starts_with("FATAL: "), "{what}: not fatal: {err}");
                }
                let expected = if nth as usize <= effect_at {
                    (case.before)()
                } else {
                    (case.after)()
                };
                assert_eq!((case.observe)(&sb.root), expected, "{what}: durable state");
                // Nothing but records, claims and our temps, and temps are never read as records.
                only_expected_names(&sb.root.join("offers"), &["offer-000001.rec"]);
                if !err.starts_with("FATAL: ") {
                    // Usable after a non-fatal failure: the same operation now succeeds.
                    seam.arm(None);
                    (case.op)(&mut journal, &seam, &sb.root)
                        .unwrap_or_else(|e| panic!("{what}: retry failed: {e}"));
                    assert_eq!((case.observe)(&sb.root), (case.after)(), "{what}: retry");
                }
                drop(journal);
                // Reopening (a restart) sweeps stale temps and sees a valid journal.
                let reopened = Journal::open(&sb.root, Capacity::DEFAULT)
                    .unwrap_or_else(|e| panic!("{what}: reopen: {e}"));
                assert_eq!(
                    only_expected_names(&sb.root.join("offers"), &["offer-000001.rec"]),
                    0,
                    "{what}: record temps swept on open"
                );
                assert!(
                    temps_in(&sb.root).is_empty(),
                    "{what}: claim temps swept on open"
                );
                let _ = reopened.len().unwrap();
            }
        }
    }
    runs
}

#[test]
fn eio_and_enospc_at_every_call_of_publish_replace_and_clear_fail_closed_without_torn_files() {
    let mut total = 0;
    for case in cases() {
        let runs = run_case(&case);
        eprintln!("{}: {runs} injected faults", case.name);
        total += runs;
    }
    // 8 operations, each with several calls, times two errnos, times once/sticky.
    assert!(total >= 8 * 4 * 4, "ran {total} fault cases");
}

#[test]
fn fsync_failure_is_reported_as_fsync_failed_and_fatal() {
    let sb = sandbox();
    let seam: Seam = Arc::new(FaultFs::new(RealFs));
    let mut journal = Journal::open_with(Arc::clone(&seam), &sb.root, Capacity::DEFAULT).unwrap();
    seam.arm(None);
    journal.publish_record(&accepted(1)).unwrap();
    let fsync_at = seam.trace().iter().position(|op| *op == "fsync").unwrap() as u64 + 1;
    drop(journal);
    let sb = sandbox();
    let mut journal = Journal::open_with(Arc::clone(&seam), &sb.root, Capacity::DEFAULT).unwrap();
    seam.arm(Some(FaultPlan {
        nth: fsync_at,
        errno: Errno::IO,
        sticky: false,
    }));
    let err = journal.publish_record(&accepted(1)).unwrap_err();
    assert!(err.is_fatal(), "{err:?}");
    match err {
        JournalError::Storage(ql_worker::fsio::StorageError::FsyncFailed { path, errno }) => {
            assert_eq!(errno, Errno::IO);
            assert!(
                path.starts_with(sb.root.join("offers")),
                "{}",
                path.display()
            );
        }
        other => panic!("expected FsyncFailed, got {other:?}"),
    }
    // The seam is object safe: the same wrapper works as a `&dyn FileSystem`.
    let dyn_seam: &dyn FileSystem = &*seam;
    assert!(format!("{dyn_seam:?}").contains("FaultFs"));
}

#[test]
fn publish_falls_back_to_link_and_unlink_when_rename_noreplace_is_unsupported() {
    // EINVAL from renameat2 is what a file system without RENAME_NOREPLACE answers.
    let sb = sandbox();
    let seam: Seam = Arc::new(FaultFs::new(RealFs));
    let mut journal = Journal::open_with(Arc::clone(&seam), &sb.root, Capacity::DEFAULT).unwrap();
    seam.arm(None);
    journal.publish_record(&accepted(1)).unwrap();
    let rename_at = seam
        .trace()
        .iter()
        .position(|op| *op == "renameat2")
        .unwrap() as u64
        + 1;
    let plan = FaultPlan {
        nth: rename_at,
        errno: Errno::INVAL,
        sticky: false,
    };
    seam.arm(Some(plan));
    journal.publish_record(&accepted(2)).unwrap();
    let trace = seam.trace();
    let tail: Vec<&str> = trace[rename_at as usize - 1..].to_vec();
    assert_eq!(
        tail,
        ["renameat2", "linkat", "unlinkat", "fsync"],
        "{trace:?}"
    );
    let meta = fs::metadata(sb.root.join("offers/offer-000002.rec")).unwrap();
    assert_eq!(std::os::unix::fs::MetadataExt::nlink(&meta), 1);
    assert_eq!(
        record_at_2(&sb.root),
        Some(accepted(2)),
        "published through the fallback"
    );
    assert!(temps_in(&sb.root.join("offers")).is_empty());
    // The fallback keeps the no-replace guarantee: an existing target is AlreadyExists. The
    // journal refuses an existing name before writing, so this goes to the recipe itself.
    drop(journal);
    fs::remove_file(sb.root.join("offers/offer-000002.rec")).unwrap();
    fs::write(sb.root.join("offers/offer-000002.rec"), b"placeholder").unwrap();
    let root = ql_worker::fsio::open_root(&*seam, &sb.root, false).unwrap();
    let offers = ql_worker::fsio::open_subdir(&*seam, &root, "offers", false)
        .unwrap()
        .unwrap();
    let before = snapshot(&sb.root);
    // publish_new's calls: getrandom, openat, write, fsync, renameat2 (the 5th).
    seam.arm(Some(FaultPlan { nth: 5, ..plan }));
    let err =
        ql_worker::fsio::publish_new(&*seam, &offers, "offer-000002.rec", b"new").unwrap_err();
    assert!(
        matches!(err, ql_worker::fsio::StorageError::AlreadyExists { .. }),
        "{err:?}"
    );
    assert_eq!(seam.trace()[4..], ["renameat2", "linkat", "unlinkat"]);
    assert_eq!(snapshot(&sb.root), before, "target untouched, temp removed");
}

fn record_at_2(root: &Path) -> Option<InboxRecord> {
    decode_file(&root.join("offers/offer-000002.rec"))
}

/// A retention batch syncs `offers/` once, not once per record (a first sweep may remove
/// hundreds); a record that may not be removed stops the batch, and what was unlinked before it
/// is still synced and stays removed.
#[test]
fn a_batch_of_settled_records_is_removed_with_one_directory_fsync() {
    let sb = sandbox();
    let seam: Seam = Arc::new(FaultFs::new(RealFs));
    let mut journal = Journal::open_with(Arc::clone(&seam), &sb.root, Capacity::DEFAULT).unwrap();
    let mut settled = Vec::new();
    for n in 1..=8 {
        let chain = to_start_failure(n, 500);
        journal.publish_record(&chain[0]).unwrap();
        for pair in chain.windows(2) {
            journal
                .replace_record(&pair[0].offer.offer_id, &pair[1], pair[0].revision)
                .unwrap();
        }
        let last = chain.last().unwrap();
        settled.push((last.offer.offer_id.clone(), last.revision));
    }
    let live = to_recovery(9);
    journal.publish_record(&live[0]).unwrap();

    seam.arm(None);
    let mut removed = Vec::new();
    journal
        .remove_settled_records(&settled[..5], &mut removed)
        .unwrap();
    assert_eq!(seam.fsyncs(), 1, "one directory fsync for five removals");
    assert_eq!(
        removed,
        settled[..5]
            .iter()
            .map(|(id, _)| id.clone())
            .collect::<Vec<_>>()
    );
    for (id, _) in &settled[..5] {
        assert_eq!(journal.read_record(id).unwrap(), None);
    }

    // The live record stops the batch after the two settled ones before it.
    seam.arm(None);
    let mut removed = Vec::new();
    let batch = [
        settled[5].clone(),
        settled[6].clone(),
        (live[0].offer.offer_id.clone(), live[0].revision),
        settled[7].clone(),
    ];
    let err = journal
        .remove_settled_records(&batch, &mut removed)
        .unwrap_err();
    assert!(matches!(err, JournalError::NotSettled { .. }), "{err:?}");
    assert_eq!(removed, vec![settled[5].0.clone(), settled[6].0.clone()]);
    assert_eq!(seam.fsyncs(), 1, "what was unlinked is synced");
    assert!(
        journal
            .read_record(&live[0].offer.offer_id)
            .unwrap()
            .is_some()
    );
    assert!(journal.read_record(&settled[7].0).unwrap().is_some());
}
