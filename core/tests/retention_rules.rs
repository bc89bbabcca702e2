//! The unit tests of `core/src/retention.rs` (they need the sim crate's samples, so they live
//! outside core).
use ql_worker_core::ids::{LogArtifactId, OfferId, Revision};
use ql_worker_core::record::State;
use ql_worker_core::retention::*;
use ql_worker_core::time::UnixMillis;

fn ms(v: u64) -> UnixMillis {
    UnixMillis::new(v).unwrap()
}

fn log(n: u32) -> LogArtifactId {
    LogArtifactId::new(std::format!("wlog-{n:030x}")).unwrap()
}

fn facts(n: u32, state: State, at: u64) -> RecordFacts {
    RecordFacts {
        offer_id: OfferId::new(std::format!("offer-{n:03}")).unwrap(),
        revision: Revision::new(5).unwrap(),
        state,
        updated_at_ms: ms(at),
        completion_acknowledged_at_ms: (state == State::CompletionAcknowledged).then_some(ms(at)),
        log_artifact_id: log(n),
        receipt_present: false,
        claimed: false,
    }
}

const POLICY: RetentionPolicy = RetentionPolicy {
    high_water_records: 3,
    max_settled_age_ms: Some(10_000),
    log_keep_ms: 100,
};

fn ids(plan: &Plan) -> Vec<&str> {
    plan.records.iter().map(|(id, _)| id.as_str()).collect()
}

#[test]
fn above_the_mark_the_oldest_removable_go_whatever_their_log_keep_time() {
    let records = [
        facts(1, State::CompletionAcknowledged, 3000),
        facts(2, State::StartFailureAcknowledged, 1000),
        facts(3, State::CompletionAcknowledged, 2000),
        // Settled a moment ago: its log is kept, the record goes anyway.
        facts(4, State::CompletionAcknowledged, 5040),
        facts(5, State::RunningAcknowledged, 10),
        facts(6, State::Accepted, 10),
    ];
    let p = plan(&records, None, None, ms(5050), &POLICY);
    assert_eq!(ids(&p), ["offer-002", "offer-003", "offer-001"]);
    // Logs 1-3 are past the keep period; 4 is not, 5 and 6 are not settled.
    assert_eq!(p.logs, [log(1), log(2), log(3)]);
}

#[test]
fn at_or_below_the_mark_nothing_goes_before_the_age() {
    let records = [
        facts(1, State::CompletionAcknowledged, 1000),
        facts(2, State::RunningAcknowledged, 1000),
        facts(3, State::Accepted, 1000),
    ];
    let p = plan(&records, None, None, ms(1050), &POLICY);
    assert_eq!(p, Plan::default(), "at the mark, before the log keep time");
    let p = plan(&records, None, None, ms(1100), &POLICY);
    assert!(p.records.is_empty(), "at the mark: the record stays");
    assert_eq!(p.logs, [log(1)], "its log goes after the keep period");
    let p = plan(&records, None, None, ms(11_000), &POLICY);
    assert_eq!(ids(&p), ["offer-001"], "past the age even below the mark");
}

#[test]
fn a_receipt_on_disk_a_pending_claim_or_an_unsettled_state_keeps_a_record() {
    let mut with_receipt = facts(1, State::CompletionAcknowledged, 0);
    with_receipt.receipt_present = true;
    let mut claimed = facts(2, State::CompletionAcknowledged, 0);
    claimed.claimed = true;
    let mut records = std::vec![with_receipt, claimed];
    for (n, state) in [
        State::Accepted,
        State::StartingAcknowledged,
        State::Launching,
        State::Started,
        State::RunningAcknowledged,
        State::StartFailed,
        State::RecoveryRequired,
    ]
    .into_iter()
    .enumerate()
    {
        records.push(facts(10 + u32::try_from(n).unwrap(), state, 0));
    }
    let p = plan(&records, None, None, ms(1_000_000_000), &POLICY);
    assert!(p.records.is_empty(), "{p:?}");
    assert_eq!(p.logs, [log(1), log(2)], "settled: the logs may go");
}

#[test]
fn a_log_no_record_names_is_kept_from_its_own_write_time() {
    let records = [facts(1, State::RunningAcknowledged, 0)];
    let logs = [
        // Named by the live record: never removed here, however old.
        LogFacts {
            log_artifact_id: log(1),
            written_at_ms: ms(0),
        },
        LogFacts {
            log_artifact_id: log(7),
            written_at_ms: ms(1000),
        },
        LogFacts {
            log_artifact_id: log(8),
            written_at_ms: ms(1001),
        },
    ];
    let p = plan(&records, Some(&logs), None, ms(1100), &POLICY);
    assert_eq!(p.logs, [log(7)]);
    assert!(p.records.is_empty());
}

#[test]
fn archived_records_go_after_the_age_since_they_were_archived() {
    let archived = [
        ArchivedFacts {
            offer_id: OfferId::new("offer-a").unwrap(),
            archived_at_ms: ms(1000),
        },
        ArchivedFacts {
            offer_id: OfferId::new("offer-b").unwrap(),
            archived_at_ms: ms(5000),
        },
    ];
    let p = plan(&[], None, Some(&archived), ms(11_000), &POLICY);
    assert_eq!(p.archived, [OfferId::new("offer-a").unwrap()]);
    let never = RetentionPolicy {
        max_settled_age_ms: None,
        ..POLICY
    };
    assert!(plan(&[], None, Some(&archived), ms(u64::MAX >> 12), &never).is_empty());
}

#[test]
fn a_sweep_is_due_above_the_mark_once_per_change_or_when_periodic() {
    let key = |records, settled, released| SweepKey {
        records,
        settled,
        released,
    };
    assert!(!due(key(3, 3, 0), None, false, &POLICY), "at the mark");
    assert!(
        due(key(4, 0, 0), None, false, &POLICY),
        "above the mark, never swept"
    );
    assert!(
        !due(key(4, 0, 0), Some(key(4, 0, 0)), false, &POLICY),
        "nothing changed since"
    );
    let last = Some(key(4, 0, 0));
    assert!(due(key(5, 0, 0), last, false, &POLICY), "one more record");
    assert!(due(key(4, 1, 0), last, false, &POLICY), "one more settled");
    assert!(
        due(key(4, 1, 1), Some(key(4, 1, 0)), false, &POLICY),
        "a receipt or claim that kept a settled record went"
    );
    assert!(
        due(key(0, 0, 0), Some(key(0, 0, 0)), true, &POLICY),
        "periodic"
    );
}

#[test]
fn a_removal_is_rechecked_settled_and_at_the_planned_revision() {
    for state in State::ALL {
        let record = ql_worker_sim::testkit::record(1, state);
        let at = record.revision;
        let outcome = check_removal(&record, at);
        if state.is_terminal() {
            assert_eq!(outcome, Ok(()), "{state}");
            let stale = Revision::new(at.get() + 1).unwrap();
            assert_eq!(
                check_removal(&record, stale),
                Err(RemovalRefused::StaleRevision {
                    expected: stale,
                    found: at
                })
            );
        } else {
            assert_eq!(outcome, Err(RemovalRefused::NotSettled(state)), "{state}");
        }
        assert_eq!(may_remove_in(state), outcome.is_ok(), "{state}");
    }
}

#[test]
fn only_recovery_or_dormant_records_are_archivable_and_the_refusal_says_why() {
    let running = ql_worker_sim::testkit::record(1, State::RunningAcknowledged);
    let refusal = archivable(&running, ms(0)).unwrap_err();
    let text = std::format!("{refusal}");
    assert!(
        text.starts_with("the record is running_acknowledged: only"),
        "{text}"
    );
    assert!(
        text.ends_with("settled records are removed by retention"),
        "{text}"
    );
    assert_eq!(
        archivable(
            &ql_worker_sim::testkit::record(1, State::RecoveryRequired),
            ms(0)
        ),
        Ok(())
    );
    let accepted = ql_worker_sim::testkit::record(1, State::Accepted);
    let expiry = accepted.offer.lease.expires_at_ms;
    assert!(archivable(&accepted, ms(expiry.get() - 1)).is_err());
    assert_eq!(archivable(&accepted, expiry), Ok(()));
}
