//! Retention on real files (issue 14): settled records go oldest-first above the high-water
//! mark or past their age, whatever their log's keep time; a receipt on disk or the pending
//! claim keeps a record; non-terminal records never go; a log is kept `log_keep_ms` on its own
//! (from its Run's settlement while the record is there, from its own write time after); an
//! archived record goes `max_settled_age_ms` after it was archived.

mod storage_support;

use ql_worker::journal::{self, Journal};
use ql_worker::retention::{self, RetentionPolicy, Scope};
use ql_worker::spool::{self, SpoolPolicy};
use ql_worker::{os, receipts};
use ql_worker_core::claim::PendingClaim;
use ql_worker_core::ids::OfferId;
use ql_worker_core::listing::{Capacity, PageLimit};
use ql_worker_core::record::InboxRecord;
use ql_worker_sim::testkit;
use storage_support::*;

fn publish_chain(journal: &mut Journal, chain: &[InboxRecord]) {
    journal.publish_record(&chain[0]).unwrap();
    for pair in chain.windows(2) {
        journal
            .replace_record(&pair[0].offer.offer_id, &pair[1], pair[0].revision)
            .unwrap();
    }
}

fn ids(journal: &Journal) -> Vec<OfferId> {
    journal
        .list(None, PageLimit::new(64).unwrap())
        .unwrap()
        .offer_ids
}

fn log_exists(sb: &Sandbox, n: u32) -> bool {
    let id = log_id(n);
    sb.root
        .join("logs")
        .join(&id.as_str()[5..7])
        .join(format!("{id}.log"))
        .exists()
}

const MINUTE: u64 = 60_000;

#[test]
fn settled_records_go_oldest_first_above_the_mark_whatever_their_logs_keep_time() {
    let sb = sandbox();
    let mut journal = Journal::open(&sb.root, Capacity::DEFAULT).unwrap();
    // 1, 2, 3: completed at 1000, 2000, 3000 with logs; 4: start failure at 500 (no log);
    // 5: live in recovery_required; 6: live in launching with a log.
    for (n, ack) in [(1, 1000), (2, 2000), (3, 3000)] {
        spool::allocate(&sb.root, &log_id(n), SpoolPolicy::EDGE).unwrap();
        publish_chain(&mut journal, &to_completed(n, ack));
    }
    publish_chain(&mut journal, &to_start_failure(4, 500));
    publish_chain(&mut journal, &to_recovery(5));
    spool::allocate(&sb.root, &log_id(6), SpoolPolicy::EDGE).unwrap();
    publish_chain(&mut journal, &to_launching(6));
    assert_eq!(journal.len().unwrap(), 6);

    let policy = RetentionPolicy {
        high_water_records: 3,
        max_settled_age_ms: None,
        log_keep_ms: 1500,
    };
    // At 2600, 6 > 3: the oldest settled go, 4, 1 and 2, although the logs of 2 (and 3) are
    // still within their keep period (before issue 14 only 4 and 1 could go). Only log 1 is
    // past it (1000 + 1500).
    let report = retention::sweep(&mut journal, ms(2600), &policy, Scope::Records).unwrap();
    assert_eq!(report.logs_removed, 1);
    assert_eq!(
        report.records_removed,
        [4, 1, 2].map(testkit::offer_id).to_vec()
    );
    assert!(!log_exists(&sb, 1));
    assert!(log_exists(&sb, 2) && log_exists(&sb, 3) && log_exists(&sb, 6));
    assert_eq!(ids(&journal), [3, 5, 6].map(testkit::offer_id).to_vec());

    // At the mark nothing more goes; the live records never do, however far below the mark.
    let policy = RetentionPolicy {
        high_water_records: 0,
        ..policy
    };
    let report = retention::sweep(&mut journal, ms(1_000_000), &policy, Scope::Records).unwrap();
    assert_eq!(report.records_removed, vec![testkit::offer_id(3)]);
    assert_eq!(report.logs_removed, 1, "log 3 is past its keep period");
    assert_eq!(ids(&journal), [5, 6].map(testkit::offer_id).to_vec());
    assert!(log_exists(&sb, 6), "a live Run's log is never removed");
    let again = unchanged(&sb.root, || {
        retention::sweep(&mut journal, ms(2_000_000), &policy, Scope::Records).unwrap()
    });
    assert_eq!(again, retention::Report::default());
}

#[test]
fn a_receipt_on_disk_or_the_pending_claim_keeps_a_settled_record() {
    let sb = sandbox();
    let mut journal = Journal::open(&sb.root, Capacity::DEFAULT).unwrap();
    for n in [1, 2, 3] {
        publish_chain(&mut journal, &to_completed(n, 1000));
    }
    // 1's receipt is still on disk (a crash before its removal); the claim names 2's offer (a
    // crash between storing the offer and clearing the claim).
    receipts::publish(&sb.root, &receipt(1)).unwrap();
    let record = testkit::record(2, ql_worker_core::record::State::Accepted);
    let claim = PendingClaim::new(
        &record.offer.worker,
        record.offer.offer_id.clone(),
        record.offer.lease_token.clone(),
        ms(10),
    );
    assert_eq!(
        journal.create_claim(&claim).unwrap(),
        ql_worker_core::claim::ClaimCreate::Publish
    );
    let policy = RetentionPolicy {
        high_water_records: 0,
        max_settled_age_ms: Some(1),
        log_keep_ms: 0,
    };
    let report = retention::sweep(&mut journal, ms(5000), &policy, Scope::Records).unwrap();
    assert_eq!(report.records_removed, vec![testkit::offer_id(3)]);

    receipts::remove(&sb.root, &receipt(1).attempt_id).unwrap();
    journal
        .clear_claim(&claim.offer_id, claim.revision)
        .unwrap();
    let report = retention::sweep(&mut journal, ms(5000), &policy, Scope::Records).unwrap();
    assert_eq!(
        report.records_removed,
        [1, 2].map(testkit::offer_id).to_vec()
    );
    assert!(ids(&journal).is_empty());
}

#[test]
fn a_log_whose_record_is_gone_is_kept_from_its_own_write_time() {
    let sb = sandbox();
    let mut journal = Journal::open(&sb.root, Capacity::DEFAULT).unwrap();
    spool::allocate(&sb.root, &log_id(1), SpoolPolicy::EDGE).unwrap();
    spool::publish_truncation_fact(
        &sb.root,
        &fact(1, SpoolPolicy::EDGE.maximum_attempt_bytes, false),
    )
    .unwrap();
    publish_chain(&mut journal, &to_completed(1, 1000));
    let written = os::now();
    let policy = RetentionPolicy {
        high_water_records: 0,
        max_settled_age_ms: None,
        log_keep_ms: 10 * MINUTE,
    };
    // The record goes at once (above the mark); its log stays: its keep period has not passed.
    let report = retention::sweep(&mut journal, ms(1001), &policy, Scope::Full).unwrap();
    assert_eq!(report.records_removed, vec![testkit::offer_id(1)]);
    assert!(log_exists(&sb, 1));
    // No record names it now: it is kept ten minutes from the time it was last written.
    let soon = ms(written.get() + MINUTE);
    let report = retention::sweep(&mut journal, soon, &policy, Scope::Full).unwrap();
    assert_eq!(report, retention::Report::default());
    assert!(log_exists(&sb, 1));
    // A sweep of the records only never looks at logs no record names.
    let later = ms(written.get() + 11 * MINUTE);
    let report = retention::sweep(&mut journal, later, &policy, Scope::Records).unwrap();
    assert_eq!(report, retention::Report::default());
    let report = retention::sweep(&mut journal, later, &policy, Scope::Full).unwrap();
    assert_eq!(report.logs_removed, 1);
    assert!(!log_exists(&sb, 1));
    let fact_path = sb
        .root
        .join("logs")
        .join(&log_id(1).as_str()[5..7])
        .join(format!(".{}.fact", log_id(1)));
    assert!(!fact_path.exists(), "the truncation fact goes with its log");
}

#[test]
fn retention_by_age_removes_old_settled_records_below_the_mark() {
    let sb = sandbox();
    let mut journal = Journal::open(&sb.root, Capacity::DEFAULT).unwrap();
    publish_chain(&mut journal, &to_start_failure(1, 1000));
    publish_chain(&mut journal, &to_start_failure(2, 9000));
    let policy = RetentionPolicy {
        high_water_records: 64,
        max_settled_age_ms: Some(5000),
        log_keep_ms: 0,
    };
    let report = retention::sweep(&mut journal, ms(10_000), &policy, Scope::Records).unwrap();
    assert_eq!(report.records_removed, vec![testkit::offer_id(1)]);
    assert_eq!(ids(&journal), vec![testkit::offer_id(2)]);
}

/// Archiving removes the attempt's receipt with the record (it holds the completion capability,
/// and no completion follows an archive); retention removes the archived record
/// `max_settled_age_ms` after it was archived, and its log once its keep time passed.
#[test]
fn an_archived_record_loses_its_receipt_at_once_and_goes_after_the_age() {
    let sb = sandbox();
    {
        let mut journal = Journal::open(&sb.root, Capacity::DEFAULT).unwrap();
        spool::allocate(&sb.root, &log_id(6), SpoolPolicy::EDGE).unwrap();
        let mut chain = to_launching(6);
        let last = chain.last().unwrap().clone();
        chain.push(step(
            &last,
            ql_worker_core::record::State::RecoveryRequired,
            |r| {
                r.recovery_reason =
                    Some(ql_worker_core::record::RecoveryReason::LaunchOutcomeUnknown);
            },
        ));
        publish_chain(&mut journal, &chain);
    }
    receipts::publish(&sb.root, &receipt(6)).unwrap();
    let attempt = receipt(6).attempt_id;
    let archived = journal::archive_record(&sb.root, &testkit::offer_id(6), ms(1)).unwrap();
    assert!(archived.exists());
    assert_eq!(
        receipts::read(&sb.root, &attempt).unwrap(),
        None,
        "receipt removed"
    );
    let at = os::now();

    let mut journal = Journal::open(&sb.root, Capacity::DEFAULT).unwrap();
    let policy = RetentionPolicy {
        high_water_records: 64,
        max_settled_age_ms: Some(60 * MINUTE),
        log_keep_ms: 10 * MINUTE,
    };
    let soon = ms(at.get() + MINUTE);
    let report = retention::sweep(&mut journal, soon, &policy, Scope::Full).unwrap();
    assert_eq!(report, retention::Report::default());
    assert!(archived.exists() && log_exists(&sb, 6));
    let later = ms(at.get() + 61 * MINUTE);
    let report = retention::sweep(&mut journal, later, &policy, Scope::Full).unwrap();
    assert_eq!(report.archived_removed, vec![testkit::offer_id(6)]);
    assert_eq!(
        report.logs_removed, 1,
        "no inbox record names the log any more"
    );
    assert!(!archived.exists() && !log_exists(&sb, 6));
}
