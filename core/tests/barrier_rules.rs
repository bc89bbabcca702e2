//! The unit tests of `core/src/barrier.rs` (they need the sim crate's samples, so they live
//! outside core).
use ql_worker_core::barrier::*;
use ql_worker_core::ids::Sha256Digest;
use ql_worker_core::ids::{CallbackSequence, CapabilityDigest, LogArtifactId};
use ql_worker_core::record::{InboxRecord, State};
use ql_worker_core::time::UnixMillis;
use ql_worker_sim::testkit;

/// The barrier seeded `launching` record 1 carries (see `testkit::record`).
struct Facts {
    record: InboxRecord,
    log: LogArtifactId,
    sequence: CallbackSequence,
    started: UnixMillis,
    digest: CapabilityDigest,
}

fn facts() -> Facts {
    let record = testkit::record(1, State::Launching);
    Facts {
        log: record.log_artifact_id.clone().unwrap(),
        sequence: record.completion_receipt_callback_sequence.unwrap(),
        started: record.executor_started_at_ms.unwrap(),
        digest: CapabilityDigest::new(Sha256Digest::of(&testkit::seeded_capability(1))),
        record,
    }
}

fn barrier(f: &Facts) -> Barrier<'_> {
    let c = &f.record.offer.candidate;
    Barrier {
        offer_id: &f.record.offer.offer_id,
        run_id: &c.run_id,
        attempt_id: &c.attempt_id,
        callback_sequence: f.sequence,
        token_digest: f.digest,
        log_artifact_id: &f.log,
        executor_started_at: f.started,
    }
}

#[test]
fn the_seeded_launching_record_matches_its_own_barrier() {
    let f = facts();
    assert_eq!(barrier(&f).check(&f.record), Ok(()));
}

#[test]
fn every_drifted_field_is_named_and_only_launching_passes() {
    let f = facts();
    let other = testkit::record(2, State::Launching);
    let oc = &other.offer.candidate;
    let later = UnixMillis::new(f.started.get() + 1).unwrap();
    let other_log = other.log_artifact_id.clone().unwrap();
    let cases: [(Barrier<'_>, BarrierField); 7] = [
        (
            Barrier {
                offer_id: &other.offer.offer_id,
                ..barrier(&f)
            },
            BarrierField::OfferId,
        ),
        (
            Barrier {
                run_id: &oc.run_id,
                ..barrier(&f)
            },
            BarrierField::RunId,
        ),
        (
            Barrier {
                attempt_id: &oc.attempt_id,
                ..barrier(&f)
            },
            BarrierField::AttemptId,
        ),
        (
            Barrier {
                callback_sequence: f.sequence.next().unwrap(),
                ..barrier(&f)
            },
            BarrierField::CallbackSequence,
        ),
        (
            Barrier {
                token_digest: CapabilityDigest::new(Sha256Digest::of(b"other")),
                ..barrier(&f)
            },
            BarrierField::TokenDigest,
        ),
        (
            Barrier {
                log_artifact_id: &other_log,
                ..barrier(&f)
            },
            BarrierField::LogArtifactId,
        ),
        (
            Barrier {
                executor_started_at: later,
                ..barrier(&f)
            },
            BarrierField::ExecutorStartedAtMs,
        ),
    ];
    for (drifted, field) in cases {
        assert_eq!(drifted.check(&f.record), Err(field));
    }
    for state in State::ALL {
        if state == State::Launching {
            continue;
        }
        // Past `launching` the record keeps its barrier fields: only the state differs.
        let mut record = f.record.clone();
        record.state = state;
        assert_eq!(
            barrier(&f).check(&record),
            Err(BarrierField::State(state)),
            "{state}"
        );
    }
}

#[test]
fn a_record_without_barrier_fields_fails_at_the_first_of_them() {
    let f = facts();
    let mut record = f.record.clone();
    record.completion_receipt_callback_sequence = None;
    record.completion_receipt_token_digest = None;
    assert_eq!(
        barrier(&f).check(&record),
        Err(BarrierField::CallbackSequence)
    );
    assert_eq!(
        std::format!("{}", BarrierField::State(State::Started)),
        "state is started, not launching"
    );
}
