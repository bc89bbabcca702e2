//! Property tests of the transition check: whatever sequence of proposals arrives, the stored
//! record (advanced only through accepted proposals) always satisfies every invariant, and the
//! same sequence always yields the same outcome (determinism).

use proptest::prelude::*;
use ql_worker_core::ids::{
    CallbackSequence, CapabilityDigest, ExecutorHandle, LeaseVersion, LogArtifactId, Revision,
    Sha256Digest,
};
use ql_worker_core::record::{
    InboxRecord, RecoveryReason, State, TransitionError, check_transition,
};
use ql_worker_core::time::UnixMillis;
use ql_worker_sim::testkit;

/// One proposed mutation, applied to a copy of the stored record.
#[derive(Clone, Debug)]
enum Mutation {
    State(usize),
    StartedAt(u64),
    LogId(u8),
    Callback(u8),
    Handle(u8),
    AckAt(u64),
    Reason(usize),
    ClearOptional(u8),
    LeaseVersion(u32),
    LeaseExpiry(u64),
    UpdatedAt(i64),
    AcceptedAt(u64),
    Revision(i8),
    Token(u8),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        4 => (0usize..9).prop_map(Mutation::State),
        1 => (0u64..400).prop_map(Mutation::StartedAt),
        1 => any::<u8>().prop_map(Mutation::LogId),
        1 => (1u8..4).prop_map(Mutation::Callback),
        1 => any::<u8>().prop_map(Mutation::Handle),
        1 => (0u64..400).prop_map(Mutation::AckAt),
        1 => (0usize..5).prop_map(Mutation::Reason),
        1 => (0u8..6).prop_map(Mutation::ClearOptional),
        1 => (0u32..4).prop_map(Mutation::LeaseVersion),
        1 => (30_000u64..40_000).prop_map(Mutation::LeaseExpiry),
        2 => (-5i64..20).prop_map(Mutation::UpdatedAt),
        1 => (90u64..110).prop_map(Mutation::AcceptedAt),
        1 => (-1i8..3).prop_map(Mutation::Revision),
        1 => (0u8..2).prop_map(Mutation::Token),
    ]
}

fn ms(v: u64) -> UnixMillis {
    UnixMillis::new(v).unwrap()
}

fn apply(stored: &InboxRecord, mutations: &[Mutation]) -> InboxRecord {
    let mut r = stored.clone();
    r.revision = stored.revision.next().unwrap();
    for m in mutations {
        match m {
            Mutation::State(i) => r.state = State::ALL[*i],
            Mutation::StartedAt(v) => r.executor_started_at_ms = Some(ms(*v)),
            Mutation::LogId(v) => {
                r.log_artifact_id =
                    Some(LogArtifactId::new(format!("wlog-{:030x}", u128::from(*v))).unwrap());
            }
            Mutation::Callback(v) => {
                r.completion_receipt_callback_sequence =
                    Some(CallbackSequence::new(u64::from(*v)).unwrap());
                r.completion_receipt_token_digest =
                    Some(CapabilityDigest::new(Sha256Digest::of(&[*v])));
            }
            Mutation::Handle(v) => {
                r.executor_handle = Some(ExecutorHandle::new(format!("h{v}")).unwrap())
            }
            Mutation::AckAt(v) => r.completion_acknowledged_at_ms = Some(ms(*v)),
            Mutation::Reason(i) => r.recovery_reason = Some(RecoveryReason::ALL[*i]),
            Mutation::ClearOptional(i) => match i {
                0 => r.executor_handle = None,
                1 => r.executor_started_at_ms = None,
                2 => r.log_artifact_id = None,
                3 => {
                    r.completion_receipt_callback_sequence = None;
                    r.completion_receipt_token_digest = None;
                }
                4 => r.completion_acknowledged_at_ms = None,
                _ => r.recovery_reason = None,
            },
            Mutation::LeaseVersion(v) => {
                r.offer.lease.version = LeaseVersion::new(u64::from(*v)).unwrap();
            }
            Mutation::LeaseExpiry(v) => r.offer.lease.expires_at_ms = ms(*v),
            Mutation::UpdatedAt(d) => {
                r.updated_at_ms = ms(stored.updated_at_ms.get().saturating_add_signed(*d));
            }
            Mutation::AcceptedAt(v) => r.accepted_at_ms = ms(*v),
            Mutation::Revision(d) => {
                r.revision =
                    Revision::new(stored.revision.get().saturating_add_signed(i64::from(*d)))
                        .unwrap();
            }
            Mutation::Token(v) => {
                r.offer.lease_token = testkit::lease_token(u32::from(*v) + 1);
                r.offer.lease.lease_token_digest = r.offer.lease_token.digest();
            }
        }
    }
    r
}

/// Runs a whole sequence; returns the outcome of every proposal and the final stored record.
fn run(steps: &[Vec<Mutation>]) -> (Vec<Result<(), TransitionError>>, InboxRecord) {
    let mut stored = InboxRecord::accepted(testkit::offer(1), ms(100));
    let mut outcomes = Vec::new();
    for mutations in steps {
        let proposed = apply(&stored, mutations);
        let outcome = check_transition(&stored, &proposed, stored.revision);
        if outcome.is_ok() {
            assert_invariants(&stored, &proposed);
            stored = proposed;
        }
        outcomes.push(outcome);
    }
    (outcomes, stored)
}

/// Invariants between consecutive stored records: the stored record is always valid by itself,
/// the revision advances by one, the state follows the table, the authority never changes,
/// time and the lease never go back, and the capability never appears on the record.
fn assert_invariants(before: &InboxRecord, after: &InboxRecord) {
    after.validate().expect("a stored record is always valid");
    assert_eq!(after.revision.get(), before.revision.get() + 1);
    assert!(ql_worker_core::record::edge_allowed(
        before.state,
        after.state
    ));
    assert!(
        before
            .offer
            .authority_difference(&after.offer, true)
            .is_none()
    );
    assert_eq!(before.accepted_at_ms, after.accepted_at_ms);
    assert!(after.updated_at_ms >= before.updated_at_ms);
    assert!(after.offer.lease.version >= before.offer.lease.version);
    if before.state.is_terminal() {
        assert_eq!(before.state, after.state);
    }
    if before.executor_started_at_ms.is_some() {
        assert_eq!(before.executor_started_at_ms, after.executor_started_at_ms);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn random_proposals_never_leave_an_invalid_stored_record(
        steps in prop::collection::vec(prop::collection::vec(mutation(), 0..5), 1..40)
    ) {
        let (_, stored) = run(&steps);
        prop_assert!(stored.validate().is_ok());
    }

    #[test]
    fn the_same_sequence_always_yields_the_same_result(
        steps in prop::collection::vec(prop::collection::vec(mutation(), 0..5), 1..30)
    ) {
        let (a, ra) = run(&steps);
        let (b, rb) = run(&steps);
        prop_assert_eq!(a, b);
        prop_assert_eq!(ra, rb);
    }
}

#[test]
fn random_walks_reach_deep_states() {
    // A guard against a property test that only ever exercises rejections: a scripted walk
    // through the same `apply` must reach `completion_acknowledged`.
    let walk = vec![
        vec![Mutation::State(1), Mutation::UpdatedAt(1)],
        vec![
            Mutation::State(2),
            Mutation::StartedAt(150),
            Mutation::LogId(1),
            Mutation::Callback(1),
            Mutation::UpdatedAt(1),
        ],
        vec![Mutation::State(3), Mutation::Handle(1)],
        vec![Mutation::State(4)],
        vec![
            Mutation::State(7),
            Mutation::AckAt(300),
            Mutation::UpdatedAt(2),
        ],
    ];
    let (outcomes, stored) = run(&walk);
    assert!(outcomes.iter().all(Result::is_ok), "{outcomes:?}");
    assert_eq!(stored.state, State::CompletionAcknowledged);
}
