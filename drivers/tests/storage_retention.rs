//! Retention on real files: settled records go oldest-first above the high-water mark or past
//! their age; non-terminal records never go; a settled Run's log goes only after its completion
//! was acknowledged and the keep period passed, and always before its record.

mod storage_support;

use ql_worker::journal::Journal;
use ql_worker::retention::{self, RetentionPolicy};
use ql_worker::spool::{self, SpoolPolicy};
use ql_worker_core::ids::OfferId;
use ql_worker_core::listing::{Capacity, PageLimit};
use ql_worker_core::record::InboxRecord;
use ql_worker_core::testkit;
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

#[test]
fn retention_removes_settled_oldest_first_never_live_and_logs_only_after_ack_and_keep() {
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
        high_water_records: 4,
        max_settled_age_ms: None,
        log_keep_ms: 1500,
    };
    // At 2600 only log 1 is past its keep period (1000 + 1500): it goes; of the records above
    // the mark (6 > 4), only those whose log may go are removable: 4 (no log) and 1.
    let report = retention::sweep(&mut journal, ms(2600), &policy).unwrap();
    assert_eq!(report.logs_removed, 1);
    assert_eq!(
        report.records_removed,
        vec![testkit::offer_id(4), testkit::offer_id(1)]
    );
    assert!(!log_exists(&sb, 1));
    assert!(log_exists(&sb, 2) && log_exists(&sb, 3) && log_exists(&sb, 6));
    assert_eq!(ids(&journal), [2, 3, 5, 6].map(testkit::offer_id).to_vec());

    // Much later everything settled may go down to the mark, but the live records stay.
    let policy = RetentionPolicy {
        high_water_records: 0,
        ..policy
    };
    let report = retention::sweep(&mut journal, ms(1_000_000), &policy).unwrap();
    assert_eq!(report.logs_removed, 2);
    assert_eq!(
        report.records_removed,
        vec![testkit::offer_id(2), testkit::offer_id(3)]
    );
    assert_eq!(ids(&journal), [5, 6].map(testkit::offer_id).to_vec());
    assert!(log_exists(&sb, 6), "a live Run's log is never removed");
    // Nothing left to do: a second sweep changes nothing.
    let again = unchanged(&sb.root, || {
        retention::sweep(&mut journal, ms(2_000_000), &policy).unwrap()
    });
    assert_eq!(again, retention::Report::default());
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
    let report = retention::sweep(&mut journal, ms(10_000), &policy).unwrap();
    assert_eq!(report.records_removed, vec![testkit::offer_id(1)]);
    assert_eq!(ids(&journal), vec![testkit::offer_id(2)]);
}
