//! The transition check against an independent model.
//!
//! The model below is written out from the reference (`qinglong-wire-and-behaviour.md` §3.5,
//! §3.6) and `docs/state-machine.md`: the literal edge table, the literal per-state presence
//! table and the seven rules in their documented order. It calls no core helper (`validate`,
//! `edge_allowed`, `presence`, `authority_difference`, `is_terminal`, …): only the record's
//! public fields.
//!
//! Histories are generated the way the Worker writes them: from `accepted`, each step proposes a
//! successor state from the table (a well-formed record for that state, its write-once fields
//! kept), sometimes any state at all, sometimes with a perturbation that breaks one rule. Every
//! step's verdict from `check_transition` must equal the model's (accepted, or rejected for the
//! first rule the model finds broken); the stored record only advances through accepted steps,
//! so the histories reach `launching`, `started`, `running_acknowledged`, both terminal states
//! and `recovery_required`. `generated_histories_cover_every_edge_and_every_rule` proves the
//! generator reaches all of it; `every_path_of_the_table_accepts_its_edges_and_rejects_the_rest`
//! walks every path of the table exhaustively.

use std::collections::BTreeSet;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;
use ql_worker_core::ids::{
    CallbackSequence, CapabilityDigest, ExecutorHandle, LeaseVersion, LogArtifactId, Revision,
    Sha256Digest,
};
use ql_worker_core::offer::{DeliveryKind, Offer};
use ql_worker_core::record::{
    InboxRecord, OptionalField, RecordError, RecoveryReason, State, TransitionError,
    check_transition,
};
use ql_worker_core::time::UnixMillis;
use ql_worker_sim::testkit;

use State::{
    Accepted as Acc, CompletionAcknowledged as Cack, Launching as Lau, RecoveryRequired as Rr,
    RunningAcknowledged as Rack, StartFailed as Sf, StartFailureAcknowledged as Sfack,
    Started as Sta, StartingAcknowledged as Sack,
};

// ---------------------------------------------------------------------------------------------
// The independent model.
// ---------------------------------------------------------------------------------------------

/// Reference §3.6, row by row: `from` → every allowed `to` (self-edges included).
const EDGES: [(State, &[State]); 9] = [
    (Acc, &[Acc, Sack, Rr]),
    (Sack, &[Sack, Lau, Sf, Rr]),
    (Lau, &[Lau, Sta, Sf, Cack, Rr]),
    (Sta, &[Sta, Rack, Cack, Rr]),
    (Rack, &[Rack, Cack, Rr]),
    (Sf, &[Sf, Sfack, Rr]),
    (Sfack, &[Sfack]),
    (Cack, &[Cack]),
    (Rr, &[Rr, Cack]),
];

/// The optional fields, in the columns of the presence table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Field {
    Handle,
    StartedAt,
    LogId,
    Receipt,
    AckAt,
    Reason,
}

const FIELDS: [Field; 6] = [
    Field::Handle,
    Field::StartedAt,
    Field::LogId,
    Field::Receipt,
    Field::AckAt,
    Field::Reason,
];

/// Reference §3.5 "Per-state field presence": R required, O optional, A absent; columns in
/// [`FIELDS`] order (handle, startedAt, logId, callback seq + digest, completionAckAt, reason).
const PRESENCE: [(State, &str); 9] = [
    (Acc, "AAAAAA"),
    (Sack, "AAAAAA"),
    (Lau, "ARRRAA"),
    (Sta, "RRRRAA"),
    (Rack, "RRRRAA"),
    (Sf, "AOOOAA"),
    (Sfack, "AOOOAA"),
    (Cack, "ORRRRA"),
    (Rr, "OOOOAR"),
];

fn model_edge(from: State, to: State) -> bool {
    EDGES
        .iter()
        .find(|(f, _)| *f == from)
        .unwrap()
        .1
        .contains(&to)
}

fn model_presence(state: State, field: Field) -> char {
    let row = PRESENCE.iter().find(|(s, _)| *s == state).unwrap().1;
    let column = FIELDS.iter().position(|f| *f == field).unwrap();
    row.as_bytes()[column] as char
}

/// Whether each half of `field` is present (the receipt has two halves, the others one).
fn halves(r: &InboxRecord, field: Field) -> Vec<bool> {
    match field {
        Field::Handle => vec![r.executor_handle.is_some()],
        Field::StartedAt => vec![r.executor_started_at_ms.is_some()],
        Field::LogId => vec![r.log_artifact_id.is_some()],
        Field::Receipt => vec![
            r.completion_receipt_callback_sequence.is_some(),
            r.completion_receipt_token_digest.is_some(),
        ],
        Field::AckAt => vec![r.completion_acknowledged_at_ms.is_some()],
        Field::Reason => vec![r.recovery_reason.is_some()],
    }
}

fn is_set(r: &InboxRecord, field: Field) -> bool {
    halves(r, field).into_iter().any(|h| h)
}

fn same_value(a: &InboxRecord, b: &InboxRecord, field: Field) -> bool {
    match field {
        Field::Handle => a.executor_handle == b.executor_handle,
        Field::StartedAt => a.executor_started_at_ms == b.executor_started_at_ms,
        Field::LogId => a.log_artifact_id == b.log_artifact_id,
        Field::Receipt => {
            a.completion_receipt_callback_sequence == b.completion_receipt_callback_sequence
                && a.completion_receipt_token_digest == b.completion_receipt_token_digest
        }
        Field::AckAt => a.completion_acknowledged_at_ms == b.completion_acknowledged_at_ms,
        Field::Reason => a.recovery_reason == b.recovery_reason,
    }
}

/// One broken shape rule of a record by itself (reference §3.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Schema,
    UpdatedBeforeAccepted,
    /// The field breaks the state's column (the letter it must follow).
    Presence(State, Field, char),
    HandleWithoutStartedAt,
    HalfReceipt,
}

/// Every shape rule `r` breaks. The generator never makes the embedded offer inconsistent, so
/// the model has no offer rule: a core answer of `RecordError::Offer` is a disagreement.
fn model_shape(r: &InboxRecord) -> Vec<Shape> {
    let mut broken = Vec::new();
    if r.schema_version != 1 {
        broken.push(Shape::Schema);
    }
    if r.updated_at_ms < r.accepted_at_ms {
        broken.push(Shape::UpdatedBeforeAccepted);
    }
    for field in FIELDS {
        let letter = model_presence(r.state, field);
        for present in halves(r, field) {
            let ok = match letter {
                'R' => present,
                'A' => !present,
                _ => true,
            };
            if !ok {
                broken.push(Shape::Presence(r.state, field, letter));
            }
        }
    }
    if r.executor_handle.is_some() && r.executor_started_at_ms.is_none() {
        broken.push(Shape::HandleWithoutStartedAt);
    }
    let receipt = halves(r, Field::Receipt);
    if receipt[0] != receipt[1] {
        broken.push(Shape::HalfReceipt);
    }
    broken
}

/// The offer with everything a newer lease may change blanked: what must stay equal
/// (reference §3.6 rule 2: everything but the lease version and timings, and the score).
fn offer_authority(offer: &Offer) -> Offer {
    let mut o = offer.clone();
    o.lease.version = LeaseVersion::FIRST;
    o.lease.acquired_at_ms = UnixMillis::ZERO;
    o.lease.renewed_at_ms = UnixMillis::ZERO;
    o.lease.expires_at_ms = UnixMillis::ZERO;
    o.lease.updated_at_ms = UnixMillis::ZERO;
    o.placement_score = 0;
    o
}

/// The rules of one update, in the documented order (docs/state-machine.md "Rules checked on
/// every update"), with what the model knows about the broken ones.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Rule {
    StaleRevision,
    RevisionNotNext,
    InvalidStored(Vec<Shape>),
    InvalidProposed(Vec<Shape>),
    Authority,
    AcceptedAtChanged,
    UpdatedAtRegressed,
    LeaseVersionRegressed,
    LeaseChangedAtSameVersion,
    IllegalEdge,
    WriteOnce(Vec<Field>),
}

impl Rule {
    fn name(&self) -> &'static str {
        match self {
            Self::StaleRevision => "stale revision",
            Self::RevisionNotNext => "revision not next",
            Self::InvalidStored(_) => "invalid stored",
            Self::InvalidProposed(_) => "invalid proposed",
            Self::Authority => "authority",
            Self::AcceptedAtChanged => "acceptedAt changed",
            Self::UpdatedAtRegressed => "updatedAt regressed",
            Self::LeaseVersionRegressed => "lease version regressed",
            Self::LeaseChangedAtSameVersion => "lease changed at the same version",
            Self::IllegalEdge => "illegal edge",
            Self::WriteOnce(_) => "write-once",
        }
    }
}

/// Every rule the update breaks, first rule first; empty when the update is legal.
fn model_verdict(stored: &InboxRecord, proposed: &InboxRecord, expected: Revision) -> Vec<Rule> {
    let mut broken = Vec::new();
    if stored.revision != expected {
        broken.push(Rule::StaleRevision);
    }
    if proposed.revision.get() != expected.get() + 1 {
        broken.push(Rule::RevisionNotNext);
    }
    let stored_shape = model_shape(stored);
    if !stored_shape.is_empty() {
        broken.push(Rule::InvalidStored(stored_shape));
    }
    let proposed_shape = model_shape(proposed);
    if !proposed_shape.is_empty() {
        broken.push(Rule::InvalidProposed(proposed_shape));
    }
    if offer_authority(&stored.offer) != offer_authority(&proposed.offer) {
        broken.push(Rule::Authority);
    }
    if proposed.accepted_at_ms != stored.accepted_at_ms {
        broken.push(Rule::AcceptedAtChanged);
    }
    if proposed.updated_at_ms < stored.updated_at_ms {
        broken.push(Rule::UpdatedAtRegressed);
    }
    let (old, new) = (&stored.offer.lease, &proposed.offer.lease);
    if new.version < old.version {
        broken.push(Rule::LeaseVersionRegressed);
    }
    if new.version == old.version && new != old {
        broken.push(Rule::LeaseChangedAtSameVersion);
    }
    if !model_edge(stored.state, proposed.state) {
        broken.push(Rule::IllegalEdge);
    }
    let changed: Vec<Field> = FIELDS
        .into_iter()
        .filter(|f| is_set(stored, *f) && !same_value(stored, proposed, *f))
        .filter(|f| !(*f == Field::Reason && stored.state == Rr && proposed.state == Cack))
        .collect();
    if !changed.is_empty() {
        broken.push(Rule::WriteOnce(changed));
    }
    broken
}

fn field_of(field: OptionalField) -> Field {
    match field {
        OptionalField::ExecutorHandle => Field::Handle,
        OptionalField::ExecutorStartedAtMs => Field::StartedAt,
        OptionalField::LogArtifactId => Field::LogId,
        OptionalField::CompletionReceipt => Field::Receipt,
        OptionalField::CompletionAcknowledgedAtMs => Field::AckAt,
        OptionalField::RecoveryReason => Field::Reason,
    }
}

fn shape_of(error: &RecordError) -> Option<Shape> {
    match error {
        RecordError::SchemaVersion { .. } => Some(Shape::Schema),
        RecordError::UpdatedBeforeAccepted => Some(Shape::UpdatedBeforeAccepted),
        RecordError::FieldPresence {
            state,
            field,
            expected,
        } => Some(Shape::Presence(
            *state,
            field_of(*field),
            match expected {
                ql_worker_core::record::Presence::Required => 'R',
                ql_worker_core::record::Presence::Absent => 'A',
                ql_worker_core::record::Presence::Optional => 'O',
            },
        )),
        RecordError::HandleWithoutStartTime => Some(Shape::HandleWithoutStartedAt),
        RecordError::CompletionReceiptHalfPresent => Some(Shape::HalfReceipt),
        RecordError::Offer(_) => None,
    }
}

/// Panics unless core's answer is the model's: `Ok` iff no rule is broken, otherwise the first
/// broken rule, with a shape or field the model also found broken.
fn assert_agrees(
    core: &Result<(), TransitionError>,
    model: &[Rule],
    stored: &InboxRecord,
    proposed: &InboxRecord,
) {
    let context = || {
        format!(
            "{} -> {}: core {core:?}, model {model:?}",
            stored.state, proposed.state
        )
    };
    let Err(error) = core else {
        assert!(model.is_empty(), "core accepted: {}", context());
        return;
    };
    let first = model
        .first()
        .unwrap_or_else(|| panic!("core rejected a legal update: {}", context()));
    let agrees = match (error, first) {
        (TransitionError::StaleRevision { expected, found }, Rule::StaleRevision) => {
            *found == stored.revision && expected != found
        }
        (TransitionError::RevisionNotNext { proposed: p, .. }, Rule::RevisionNotNext) => {
            *p == proposed.revision
        }
        (TransitionError::InvalidStored(e), Rule::InvalidStored(shapes))
        | (TransitionError::InvalidProposed(e), Rule::InvalidProposed(shapes)) => {
            shape_of(e).is_some_and(|s| shapes.contains(&s))
        }
        (TransitionError::AuthorityChanged { .. }, Rule::Authority)
        | (TransitionError::AcceptedAtChanged, Rule::AcceptedAtChanged)
        | (TransitionError::LeaseChangedAtSameVersion, Rule::LeaseChangedAtSameVersion) => true,
        (
            TransitionError::UpdatedAtRegressed {
                stored: s,
                proposed: p,
            },
            Rule::UpdatedAtRegressed,
        ) => *s == stored.updated_at_ms && *p == proposed.updated_at_ms,
        (
            TransitionError::LeaseVersionRegressed {
                stored: s,
                proposed: p,
            },
            Rule::LeaseVersionRegressed,
        ) => *s == stored.offer.lease.version.get() && *p == proposed.offer.lease.version.get(),
        (TransitionError::IllegalEdge { from, to }, Rule::IllegalEdge) => {
            *from == stored.state && *to == proposed.state
        }
        (TransitionError::WriteOnceChanged { field }, Rule::WriteOnce(fields)) => {
            fields.contains(&field_of(*field))
        }
        _ => false,
    };
    assert!(agrees, "core and model disagree: {}", context());
}

// ---------------------------------------------------------------------------------------------
// The generator: histories the Worker could write, and perturbations of them.
// ---------------------------------------------------------------------------------------------

fn ms(v: u64) -> UnixMillis {
    UnixMillis::new(v).unwrap()
}

/// A fresh value for `field` in `r`, distinct for every `salt`.
fn fill(r: &mut InboxRecord, field: Field, salt: u64, reason: usize) {
    match field {
        Field::Handle => r.executor_handle = Some(ExecutorHandle::new(format!("h{salt}")).unwrap()),
        Field::StartedAt => r.executor_started_at_ms = Some(r.updated_at_ms.saturating_add(salt)),
        Field::LogId => {
            r.log_artifact_id = Some(LogArtifactId::new(format!("wlog-{salt:030x}")).unwrap());
        }
        Field::Receipt => {
            r.completion_receipt_callback_sequence = Some(CallbackSequence::new(salt).unwrap());
            r.completion_receipt_token_digest =
                Some(CapabilityDigest::new(Sha256Digest::of(&salt.to_le_bytes())));
        }
        Field::AckAt => {
            r.completion_acknowledged_at_ms = Some(r.updated_at_ms.saturating_add(salt))
        }
        Field::Reason => r.recovery_reason = Some(RecoveryReason::ALL[reason % 5]),
    }
}

fn clear(r: &mut InboxRecord, field: Field) {
    match field {
        Field::Handle => r.executor_handle = None,
        Field::StartedAt => r.executor_started_at_ms = None,
        Field::LogId => r.log_artifact_id = None,
        Field::Receipt => {
            r.completion_receipt_callback_sequence = None;
            r.completion_receipt_token_digest = None;
        }
        Field::AckAt => r.completion_acknowledged_at_ms = None,
        Field::Reason => r.recovery_reason = None,
    }
}

/// What the Worker would write for `stored → target`: revision + 1, time moved by `delay`,
/// every field the target's column requires filled if missing, every absent one cleared, the
/// optional ones kept.
fn well_formed(
    stored: &InboxRecord,
    target: State,
    delay: u64,
    salt: u64,
    reason: usize,
) -> InboxRecord {
    let mut p = stored.clone();
    p.revision = Revision::new(stored.revision.get() + 1).unwrap();
    p.state = target;
    p.updated_at_ms = stored.updated_at_ms.saturating_add(delay);
    for field in FIELDS {
        match model_presence(target, field) {
            'R' if !is_set(&p, field) => fill(&mut p, field, salt, reason),
            'A' => clear(&mut p, field),
            _ => {}
        }
    }
    p
}

/// One rule-breaking (or, for `Renew` and `Score`, legal) change to a well-formed proposal.
#[derive(Clone, Debug)]
enum Perturb {
    /// Propose revision `stored + 1 + d` (d ≠ 0).
    RevisionOffset(i8),
    /// The caller expects a revision other than the stored one.
    StaleExpected,
    UpdatedBack(u8),
    AcceptedAtMoved(u8),
    SchemaVersion(u8),
    /// A newer lease (legal): version + 1, timings moved forward.
    Renew(u16),
    LeaseVersionBack,
    LeaseDrift(u8),
    Token(u8),
    Priority,
    DeliveryKind,
    /// The placement score is not authority (legal).
    Score(u8),
    Set(usize),
    Clear(usize),
    HalfReceipt,
    HandleWithoutStartedAt,
}

fn perturb() -> impl Strategy<Value = Perturb> {
    prop_oneof![
        1 => prop_oneof![Just(-1i8), Just(1), Just(2)].prop_map(Perturb::RevisionOffset),
        1 => Just(Perturb::StaleExpected),
        1 => (1u8..5).prop_map(Perturb::UpdatedBack),
        1 => any::<u8>().prop_map(Perturb::AcceptedAtMoved),
        1 => (2u8..4).prop_map(Perturb::SchemaVersion),
        3 => (0u16..500).prop_map(Perturb::Renew),
        1 => Just(Perturb::LeaseVersionBack),
        1 => (1u8..10).prop_map(Perturb::LeaseDrift),
        1 => (1u8..4).prop_map(Perturb::Token),
        1 => Just(Perturb::Priority),
        1 => Just(Perturb::DeliveryKind),
        1 => (1u8..10).prop_map(Perturb::Score),
        3 => (0usize..6).prop_map(Perturb::Set),
        3 => (0usize..6).prop_map(Perturb::Clear),
        1 => Just(Perturb::HalfReceipt),
        1 => Just(Perturb::HandleWithoutStartedAt),
    ]
}

/// One step of a history.
#[derive(Clone, Debug)]
struct Step {
    /// 0..=5: a non-self successor from the table; 6: the self-edge; 7: any state.
    kind: u8,
    pick: u8,
    delay: u8,
    reason: u8,
    perturbations: Vec<Perturb>,
}

fn step() -> impl Strategy<Value = Step> {
    (
        0u8..8,
        any::<u8>(),
        0u8..4,
        any::<u8>(),
        prop_oneof![
            3 => Just(Vec::new()),
            2 => prop::collection::vec(perturb(), 1..3),
        ],
    )
        .prop_map(|(kind, pick, delay, reason, perturbations)| Step {
            kind,
            pick,
            delay,
            reason,
            perturbations,
        })
}

fn history() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(step(), 1..30)
}

fn target_of(from: State, step: &Step) -> State {
    let successors: Vec<State> = EDGES
        .iter()
        .find(|(f, _)| *f == from)
        .unwrap()
        .1
        .iter()
        .copied()
        .filter(|to| *to != from)
        .collect();
    match step.kind {
        // Half the time the first successor of the row: the Worker's main path, so that histories
        // get deep; otherwise any successor.
        0..=5 if !successors.is_empty() && step.pick < 128 => successors[0],
        0..=5 if !successors.is_empty() => successors[usize::from(step.pick) % successors.len()],
        7 => State::ALL[usize::from(step.pick) % 9],
        _ => from,
    }
}

/// Applies `p` to the proposal (and perhaps to the revision the caller expects).
fn apply(
    p: &Perturb,
    stored: &InboxRecord,
    r: &mut InboxRecord,
    expected: &mut Revision,
    salt: u64,
) {
    match p {
        Perturb::RevisionOffset(d) => {
            let next = stored.revision.get() + 1;
            r.revision = Revision::new(next.saturating_add_signed(i64::from(*d))).unwrap();
        }
        Perturb::StaleExpected => *expected = Revision::new(stored.revision.get() + 1).unwrap(),
        Perturb::UpdatedBack(d) => {
            r.updated_at_ms = ms(stored.updated_at_ms.get().saturating_sub(u64::from(*d)));
        }
        Perturb::AcceptedAtMoved(d) => {
            r.accepted_at_ms = ms(stored.accepted_at_ms.get() + 1 + u64::from(*d));
        }
        Perturb::SchemaVersion(v) => r.schema_version = *v,
        Perturb::Renew(d) => {
            let lease = &mut r.offer.lease;
            lease.version = LeaseVersion::new(lease.version.get() + 1).unwrap();
            lease.renewed_at_ms = lease.renewed_at_ms.saturating_add(u64::from(*d));
            lease.expires_at_ms = lease.renewed_at_ms.saturating_add(30_000);
            lease.updated_at_ms = lease.renewed_at_ms;
        }
        Perturb::LeaseVersionBack => {
            let lease = &mut r.offer.lease;
            lease.version = LeaseVersion::new(lease.version.get().saturating_sub(1)).unwrap();
        }
        Perturb::LeaseDrift(d) => {
            let lease = &mut r.offer.lease;
            lease.expires_at_ms = lease.expires_at_ms.saturating_add(u64::from(*d));
        }
        Perturb::Token(n) => {
            r.offer.lease_token = testkit::lease_token(u32::from(*n) + 1);
            r.offer.lease.lease_token_digest = r.offer.lease_token.digest();
        }
        Perturb::Priority => r.offer.candidate.priority += 1,
        Perturb::DeliveryKind => {
            r.offer.delivery_kind = match r.offer.delivery_kind {
                DeliveryKind::NewClaim => DeliveryKind::LeaseRecovery,
                DeliveryKind::LeaseRecovery => DeliveryKind::NewClaim,
            };
        }
        Perturb::Score(s) => r.offer.placement_score = u64::from(*s),
        Perturb::Set(i) => fill(r, FIELDS[*i], salt + 1_000, usize::from(salt as u8) + 1),
        Perturb::Clear(i) => clear(r, FIELDS[*i]),
        Perturb::HalfReceipt => {
            if r.completion_receipt_token_digest.is_some() {
                r.completion_receipt_token_digest = None;
            } else {
                r.completion_receipt_callback_sequence = Some(CallbackSequence::new(7).unwrap());
            }
        }
        Perturb::HandleWithoutStartedAt => {
            r.executor_started_at_ms = None;
            r.executor_handle = Some(ExecutorHandle::new("h-alone").unwrap());
        }
    }
}

fn fresh() -> InboxRecord {
    InboxRecord::accepted(testkit::offer(1), ms(100))
}

/// What a run of one history saw.
#[derive(Default)]
struct Seen {
    outcomes: Vec<Result<(), TransitionError>>,
    accepted: BTreeSet<(State, State)>,
    illegal: BTreeSet<(State, State)>,
    rules: BTreeSet<&'static str>,
    legal_perturbed: usize,
}

/// Runs one history against core and the model; panics on the first disagreement.
fn run(history: &[Step]) -> (Seen, InboxRecord) {
    let mut stored = fresh();
    let mut seen = Seen::default();
    for (i, step) in history.iter().enumerate() {
        let salt = i as u64 + 1;
        let target = target_of(stored.state, step);
        let mut proposed = well_formed(
            &stored,
            target,
            u64::from(step.delay),
            salt,
            usize::from(step.reason),
        );
        let mut expected = stored.revision;
        for p in &step.perturbations {
            apply(p, &stored, &mut proposed, &mut expected, salt);
        }
        let model = model_verdict(&stored, &proposed, expected);
        let core = check_transition(&stored, &proposed, expected);
        assert_agrees(&core, &model, &stored, &proposed);
        match model.first() {
            None => {
                seen.accepted.insert((stored.state, proposed.state));
                seen.legal_perturbed += usize::from(!step.perturbations.is_empty());
                stored = proposed;
            }
            Some(rule) => {
                if *rule == Rule::IllegalEdge {
                    seen.illegal.insert((stored.state, proposed.state));
                }
                seen.rules.insert(rule.name());
            }
        }
        seen.outcomes.push(core);
    }
    assert!(model_shape(&stored).is_empty(), "{stored:?}");
    (seen, stored)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn every_generated_step_gets_the_models_verdict(history in history()) {
        let (seen, stored) = run(&history);
        prop_assert_eq!(seen.outcomes.len(), history.len());
        prop_assert!(stored.revision.get() as usize <= history.len());
    }

    #[test]
    fn the_same_history_always_yields_the_same_result(history in history()) {
        let (a, ra) = run(&history);
        let (b, rb) = run(&history);
        prop_assert_eq!(a.outcomes, b.outcomes);
        prop_assert_eq!(ra, rb);
    }
}

/// The generator is only as good as what it reaches: over a fixed sample of histories (the
/// deterministic runner, so the figure is stable), every edge of the table is taken, every pair
/// outside it is proposed and refused as an illegal edge, and every rule is the first one broken
/// at least once.
#[test]
fn generated_histories_cover_every_edge_and_every_rule() {
    let mut runner = TestRunner::deterministic();
    let strategy = history();
    let mut accepted = BTreeSet::new();
    let mut illegal = BTreeSet::new();
    let mut rules = BTreeSet::new();
    let mut legal_perturbed = 0;
    for _ in 0..2_000 {
        let history = strategy.new_tree(&mut runner).unwrap().current();
        let (seen, _) = run(&history);
        accepted.extend(seen.accepted);
        illegal.extend(seen.illegal);
        rules.extend(seen.rules);
        legal_perturbed += seen.legal_perturbed;
    }
    let mut edges = 0;
    for (from, tos) in EDGES {
        for to in State::ALL {
            if tos.contains(&to) {
                edges += 1;
                assert!(accepted.contains(&(from, to)), "never took {from} -> {to}");
            } else {
                assert!(
                    illegal.contains(&(from, to)),
                    "never refused {from} -> {to}"
                );
            }
        }
    }
    assert_eq!((edges, accepted.len(), illegal.len()), (26, 26, 81 - 26));
    let every_rule = [
        "stale revision",
        "revision not next",
        "invalid proposed",
        "authority",
        "acceptedAt changed",
        "updatedAt regressed",
        "lease version regressed",
        "lease changed at the same version",
        "illegal edge",
        "write-once",
    ];
    for rule in every_rule {
        assert!(
            rules.contains(rule),
            "no history broke `{rule}` first: {rules:?}"
        );
    }
    assert!(
        legal_perturbed > 0,
        "no legal lease renewal or score change was accepted"
    );
}

/// Exhaustive over the table: every path from `accepted` (the graph without self-edges is acyclic)
/// is written step by step; at every record on the way, every one of the nine targets is proposed
/// well-formed (accepted iff the table has the edge, else `IllegalEdge`), and on every allowed
/// edge each set field is changed and removed in turn (refused: write-once or presence).
#[test]
fn every_path_of_the_table_accepts_its_edges_and_rejects_the_rest() {
    let mut stack = vec![fresh()];
    let mut taken = BTreeSet::new();
    let (mut records, mut field_changes) = (0, 0);
    while let Some(record) = stack.pop() {
        records += 1;
        for (i, to) in State::ALL.into_iter().enumerate() {
            let salt = record.revision.get() * 10 + i as u64 + 1;
            let proposed = well_formed(&record, to, 1, salt, 0);
            let outcome = check_transition(&record, &proposed, record.revision);
            if model_edge(record.state, to) {
                assert_eq!(outcome, Ok(()), "{} -> {to}", record.state);
                taken.insert((record.state, to));
                if to != record.state {
                    stack.push(proposed.clone());
                }
            } else {
                assert_eq!(
                    outcome,
                    Err(TransitionError::IllegalEdge {
                        from: record.state,
                        to
                    })
                );
                continue;
            }
            for field in FIELDS.into_iter().filter(|f| is_set(&record, *f)) {
                let dropped = field == Field::Reason && record.state == Rr && to == Cack;
                let mut changed = proposed.clone();
                fill(&mut changed, field, salt + 500, 1);
                let mut removed = proposed.clone();
                clear(&mut removed, field);
                let mut halves = Vec::new();
                if field == Field::Receipt {
                    // One half changed, the other kept: still a write-once change.
                    let mut sequence = proposed.clone();
                    sequence.completion_receipt_callback_sequence =
                        Some(CallbackSequence::new(salt + 700).unwrap());
                    let mut digest = proposed.clone();
                    digest.completion_receipt_token_digest =
                        Some(CapabilityDigest::new(Sha256Digest::of(b"other")));
                    halves = vec![sequence, digest];
                }
                for bad in [changed, removed].into_iter().chain(halves) {
                    if dropped && !is_set(&bad, field) {
                        continue;
                    }
                    let outcome = check_transition(&record, &bad, record.revision);
                    let model = model_verdict(&record, &bad, record.revision);
                    assert!(
                        outcome.is_err(),
                        "{} -> {to}: {field:?} {bad:?}",
                        record.state
                    );
                    assert_agrees(&outcome, &model, &record, &bad);
                    field_changes += 1;
                }
            }
        }
    }
    assert_eq!(taken.len(), 26);
    assert!(records >= 20, "walked only {records} records");
    assert!(
        field_changes >= 100,
        "only {field_changes} write-once probes"
    );
}

#[test]
fn a_scripted_history_reaches_completion_through_every_acknowledgement() {
    let history: Vec<Step> = [0u8, 0, 0, 0, 0]
        .iter()
        .map(|_| Step {
            kind: 0,
            pick: 0,
            delay: 1,
            reason: 0,
            perturbations: Vec::new(),
        })
        .collect();
    let (seen, stored) = run(&history);
    assert!(
        seen.outcomes.iter().all(Result::is_ok),
        "{:?}",
        seen.outcomes
    );
    let path: Vec<(State, State)> = seen.accepted.into_iter().collect();
    assert_eq!(path.len(), 5);
    assert_eq!(stored.state, Cack);
    assert_eq!(stored.revision.get(), 5);
}
