//! The inbox record and its transition graph (ADR-0111 §1; reference §3.5–§3.6; SPEC §4).
//!
//! One record per offer is the single authority for delivery and execution. Every durable update
//! goes through [`check_transition`], which enforces the revision CAS, offer authority, time and
//! lease monotonicity, write-once fields and the edge table. The edge table is one exhaustive
//! `match` with no wildcard arm (CONVENTIONS C7).
#![deny(clippy::wildcard_enum_match_arm)]

use core::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{CallbackSequence, CapabilityDigest, ExecutorHandle, LogArtifactId, Revision};
use crate::offer::{Offer, OfferError};
use crate::time::UnixMillis;

/// The on-disk schema version of the record body (reference `schemaVersion: 1`).
pub const RECORD_SCHEMA_VERSION: u8 = 1;

/// The nine inbox states (reference §3.6), in the reference's order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Durably accepted from a Pull; nothing acknowledged yet.
    Accepted,
    /// The control plane applied `starting`.
    StartingAcknowledged,
    /// The spawn barrier: about to spawn; start time, log id and callback digest are durable.
    Launching,
    /// Spawned; the durable executor handle is stored.
    Started,
    /// The control plane applied `running`.
    RunningAcknowledged,
    /// Proven no-spawn failure, not yet reported.
    StartFailed,
    /// Start failure reported and applied. Terminal.
    StartFailureAcknowledged,
    /// Completion applied by the control plane. Terminal.
    CompletionAcknowledged,
    /// Fail-closed evidence; see [`RecoveryReason`].
    RecoveryRequired,
}

impl State {
    /// Every state, in the reference's order.
    pub const ALL: [Self; 9] = [
        Self::Accepted,
        Self::StartingAcknowledged,
        Self::Launching,
        Self::Started,
        Self::RunningAcknowledged,
        Self::StartFailed,
        Self::StartFailureAcknowledged,
        Self::CompletionAcknowledged,
        Self::RecoveryRequired,
    ];

    /// The reference's wire name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Accepted => "accepted",
            Self::StartingAcknowledged => "starting_acknowledged",
            Self::Launching => "launching",
            Self::Started => "started",
            Self::RunningAcknowledged => "running_acknowledged",
            Self::StartFailed => "start_failed",
            Self::StartFailureAcknowledged => "start_failure_acknowledged",
            Self::CompletionAcknowledged => "completion_acknowledged",
            Self::RecoveryRequired => "recovery_required",
        }
    }

    /// Settled states: the record will never change state again.
    #[must_use]
    pub const fn is_terminal(self) -> bool {
        match self {
            Self::StartFailureAcknowledged | Self::CompletionAcknowledged => true,
            Self::Accepted
            | Self::StartingAcknowledged
            | Self::Launching
            | Self::Started
            | Self::RunningAcknowledged
            | Self::StartFailed
            | Self::RecoveryRequired => false,
        }
    }

    /// States before the spawn barrier: no process was ever started for the record (a
    /// `start_failed` record carries the proof that none was).
    #[must_use]
    pub(crate) const fn is_pre_barrier(self) -> bool {
        match self {
            Self::Accepted | Self::StartingAcknowledged | Self::StartFailed => true,
            Self::Launching
            | Self::Started
            | Self::RunningAcknowledged
            | Self::StartFailureAcknowledged
            | Self::CompletionAcknowledged
            | Self::RecoveryRequired => false,
        }
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a record is `recovery_required` (reference §3.5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecoveryReason {
    /// A spawn may or may not have happened (restart in `launching`, unknown executor outcome,
    /// failed `started` write). Completion from a trusted receipt is still possible.
    LaunchOutcomeUnknown,
    /// The control plane says the Run is already running while we hold no proof of our spawn.
    ControlPlaneAlreadyRunning,
    /// The control plane reports the Run terminal.
    ControlPlaneTerminal,
    /// The lease expired locally and the local process was conclusively stopped.
    LeaseLostLocalExecutionStopped,
    /// The lease expired locally and stopping the local process could not be verified.
    LeaseLostLocalExecutionUnverified,
}

impl RecoveryReason {
    /// Every reason, in the reference's order.
    pub const ALL: [Self; 5] = [
        Self::LaunchOutcomeUnknown,
        Self::ControlPlaneAlreadyRunning,
        Self::ControlPlaneTerminal,
        Self::LeaseLostLocalExecutionStopped,
        Self::LeaseLostLocalExecutionUnverified,
    ];

    /// The reference's wire name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::LaunchOutcomeUnknown => "launch_outcome_unknown",
            Self::ControlPlaneAlreadyRunning => "control_plane_already_running",
            Self::ControlPlaneTerminal => "control_plane_terminal",
            Self::LeaseLostLocalExecutionStopped => "lease_lost_local_execution_stopped",
            Self::LeaseLostLocalExecutionUnverified => "lease_lost_local_execution_unverified",
        }
    }
}

impl fmt::Display for RecoveryReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One offer's inbox record (reference §3.5): every field of the reference, same names.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InboxRecord {
    /// Always [`RECORD_SCHEMA_VERSION`].
    pub schema_version: u8,
    /// 0 at first accept, exactly +1 per update.
    pub revision: Revision,
    /// Current state.
    pub state: State,
    /// The full offer, including the plaintext lease token.
    pub offer: Offer,
    /// When the offer was accepted; never changes.
    pub accepted_at_ms: UnixMillis,
    /// Last update; never decreases.
    pub updated_at_ms: UnixMillis,
    /// Durable executor handle (from `started`).
    pub executor_handle: Option<ExecutorHandle>,
    /// Durable pre-spawn timestamp (from `launching`).
    pub executor_started_at_ms: Option<UnixMillis>,
    /// Log artifact id (from `launching`).
    pub log_artifact_id: Option<LogArtifactId>,
    /// Completion callback sequence (from `launching`); present iff the digest is.
    pub completion_receipt_callback_sequence: Option<CallbackSequence>,
    /// SHA-256 of the raw 32-byte completion capability (never the capability itself).
    pub completion_receipt_token_digest: Option<CapabilityDigest>,
    /// When completion was acknowledged; present iff `completion_acknowledged`.
    pub completion_acknowledged_at_ms: Option<UnixMillis>,
    /// Present iff `recovery_required`.
    pub recovery_reason: Option<RecoveryReason>,
}

/// The optional fields of a record, by wire name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum OptionalField {
    /// `executorHandle`.
    ExecutorHandle,
    /// `executorStartedAtMs`.
    ExecutorStartedAtMs,
    /// `logArtifactId`.
    LogArtifactId,
    /// `completionReceiptCallbackSequence` and `completionReceiptTokenDigest` (always paired).
    CompletionReceipt,
    /// `completionAcknowledgedAtMs`.
    CompletionAcknowledgedAtMs,
    /// `recoveryReason`.
    RecoveryReason,
}

impl OptionalField {
    /// Every optional field.
    pub const ALL: [Self; 6] = [
        Self::ExecutorHandle,
        Self::ExecutorStartedAtMs,
        Self::LogArtifactId,
        Self::CompletionReceipt,
        Self::CompletionAcknowledgedAtMs,
        Self::RecoveryReason,
    ];

    /// Wire name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ExecutorHandle => "executorHandle",
            Self::ExecutorStartedAtMs => "executorStartedAtMs",
            Self::LogArtifactId => "logArtifactId",
            Self::CompletionReceipt => "completionReceiptCallbackSequence/TokenDigest",
            Self::CompletionAcknowledgedAtMs => "completionAcknowledgedAtMs",
            Self::RecoveryReason => "recoveryReason",
        }
    }
}

/// Whether a state requires, allows or forbids an optional field.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Presence {
    /// Must be present.
    Required,
    /// May be present.
    Optional,
    /// Must be absent.
    Absent,
}

/// Per-state field presence (reference §3.5, `normalizeWorkerRemoteExecutionInboxRecord`).
#[must_use]
pub const fn presence(state: State, field: OptionalField) -> Presence {
    use OptionalField as F;
    use Presence::{Absent as A, Optional as O, Required as R};
    // Columns: handle, startedAt, logId, callback seq+digest, completionAckAt, recoveryReason.
    let row: [Presence; 6] = match state {
        State::Accepted | State::StartingAcknowledged => [A, A, A, A, A, A],
        State::Launching => [A, R, R, R, A, A],
        State::Started | State::RunningAcknowledged => [R, R, R, R, A, A],
        State::StartFailed | State::StartFailureAcknowledged => [A, O, O, O, A, A],
        State::CompletionAcknowledged => [O, R, R, R, R, A],
        State::RecoveryRequired => [O, O, O, O, A, R],
    };
    let column = match field {
        F::ExecutorHandle => 0,
        F::ExecutorStartedAtMs => 1,
        F::LogArtifactId => 2,
        F::CompletionReceipt => 3,
        F::CompletionAcknowledgedAtMs => 4,
        F::RecoveryReason => 5,
    };
    row[column]
}

/// A record whose shape is invalid by itself. Blame: whoever produced it (a corrupted file, or a
/// core bug when proposed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RecordError {
    /// `schemaVersion` is not 1.
    #[error("record schemaVersion must be 1, found {found}")]
    SchemaVersion {
        /// The version found.
        found: u8,
    },
    /// `updatedAtMs < acceptedAtMs`.
    #[error("record updatedAtMs is before acceptedAtMs")]
    UpdatedBeforeAccepted,
    /// An optional field is present where the state forbids it, or absent where required.
    #[error("record field {} must be {} in state {state}", .field.as_str(), match .expected {
        Presence::Required => "present",
        Presence::Absent => "absent",
        Presence::Optional => "optional",
    })]
    FieldPresence {
        /// The record's state.
        state: State,
        /// The field.
        field: OptionalField,
        /// What the state requires of it.
        expected: Presence,
    },
    /// `executorHandle` without `executorStartedAtMs`.
    #[error("record executorHandle requires executorStartedAtMs")]
    HandleWithoutStartTime,
    /// Only one of callback sequence and token digest is present.
    #[error(
        "record completionReceiptCallbackSequence and TokenDigest must be both present or both \
         absent"
    )]
    CompletionReceiptHalfPresent,
    /// The embedded offer is inconsistent.
    #[error("record offer is invalid: {0}")]
    Offer(OfferError),
}

impl InboxRecord {
    /// A fresh `accepted` record at revision 0 (reference §3.7).
    #[must_use]
    pub fn accepted(offer: Offer, now: UnixMillis) -> Self {
        Self {
            schema_version: RECORD_SCHEMA_VERSION,
            revision: Revision::FIRST,
            state: State::Accepted,
            offer,
            accepted_at_ms: now,
            updated_at_ms: now,
            executor_handle: None,
            executor_started_at_ms: None,
            log_artifact_id: None,
            completion_receipt_callback_sequence: None,
            completion_receipt_token_digest: None,
            completion_acknowledged_at_ms: None,
            recovery_reason: None,
        }
    }

    /// Whether `field` is set.
    #[must_use]
    pub fn has(&self, field: OptionalField) -> bool {
        match field {
            OptionalField::ExecutorHandle => self.executor_handle.is_some(),
            OptionalField::ExecutorStartedAtMs => self.executor_started_at_ms.is_some(),
            OptionalField::LogArtifactId => self.log_artifact_id.is_some(),
            OptionalField::CompletionReceipt => {
                self.completion_receipt_callback_sequence.is_some()
                    || self.completion_receipt_token_digest.is_some()
            }
            OptionalField::CompletionAcknowledgedAtMs => {
                self.completion_acknowledged_at_ms.is_some()
            }
            OptionalField::RecoveryReason => self.recovery_reason.is_some(),
        }
    }

    /// Whether `field` has the same value (or absence) in both records.
    fn same(&self, other: &Self, field: OptionalField) -> bool {
        match field {
            OptionalField::ExecutorHandle => self.executor_handle == other.executor_handle,
            OptionalField::ExecutorStartedAtMs => {
                self.executor_started_at_ms == other.executor_started_at_ms
            }
            OptionalField::LogArtifactId => self.log_artifact_id == other.log_artifact_id,
            OptionalField::CompletionReceipt => {
                self.completion_receipt_callback_sequence
                    == other.completion_receipt_callback_sequence
                    && self.completion_receipt_token_digest == other.completion_receipt_token_digest
            }
            OptionalField::CompletionAcknowledgedAtMs => {
                self.completion_acknowledged_at_ms == other.completion_acknowledged_at_ms
            }
            OptionalField::RecoveryReason => self.recovery_reason == other.recovery_reason,
        }
    }

    /// The record's own rules: schema version, time order, per-state field presence, paired
    /// fields and the offer's consistency, its execution revision re-normalized and its digest
    /// recomputed. Run on every record from outside (decode, [`ValidRecord::new`]); a
    /// [`ValidRecord`] and its successors are not validated again.
    ///
    /// # Errors
    /// The first [`RecordError`] found.
    pub fn validate(&self) -> Result<(), RecordError> {
        self.validate_fields()?;
        self.offer.validate().map_err(RecordError::Offer)
    }

    /// [`Self::validate`] with the execution revision trusted (compared, not recomputed).
    fn validate_fields(&self) -> Result<(), RecordError> {
        if self.schema_version != RECORD_SCHEMA_VERSION {
            return Err(RecordError::SchemaVersion {
                found: self.schema_version,
            });
        }
        if self.updated_at_ms < self.accepted_at_ms {
            return Err(RecordError::UpdatedBeforeAccepted);
        }
        if self.completion_receipt_callback_sequence.is_some()
            != self.completion_receipt_token_digest.is_some()
        {
            return Err(RecordError::CompletionReceiptHalfPresent);
        }
        if self.executor_handle.is_some() && self.executor_started_at_ms.is_none() {
            return Err(RecordError::HandleWithoutStartTime);
        }
        for field in OptionalField::ALL {
            let expected = presence(self.state, field);
            let ok = match expected {
                Presence::Required => self.has(field),
                Presence::Absent => !self.has(field),
                Presence::Optional => true,
            };
            if !ok {
                return Err(RecordError::FieldPresence {
                    state: self.state,
                    field,
                    expected,
                });
            }
        }
        self.offer.validate_fields().map_err(RecordError::Offer)
    }

    /// Whether the record is *dormant* at `now`: before the spawn barrier (`accepted`,
    /// `starting_acknowledged`, `start_failed`: nothing ran) with its lease expired, so it can
    /// never start and the control plane reclaims the Run. A dormant record takes no slot, does
    /// not hold a drain, and may be archived by an operator (`ql-worker recover`).
    #[must_use]
    pub fn is_dormant(&self, now: UnixMillis) -> bool {
        self.state.is_pre_barrier() && self.offer.lease.expires_at_ms <= now
    }

    /// The recovery reason, when the record is `recovery_required`.
    #[must_use]
    pub fn recovery(&self) -> Option<RecoveryReason> {
        match self.state {
            State::RecoveryRequired => self.recovery_reason,
            State::Accepted
            | State::StartingAcknowledged
            | State::Launching
            | State::Started
            | State::RunningAcknowledged
            | State::StartFailed
            | State::StartFailureAcknowledged
            | State::CompletionAcknowledged => None,
        }
    }
}

/// Whether `from → to` is an edge of the reference table (§3.6). Self-edges exist for every
/// state (lease-version updates); terminal states have only their self-edge.
#[must_use]
pub const fn edge_allowed(from: State, to: State) -> bool {
    use State::{
        Accepted as Acc, CompletionAcknowledged as Cack, Launching as Lau, RecoveryRequired as Rr,
        RunningAcknowledged as Rack, StartFailed as Sf, StartFailureAcknowledged as Sfack,
        Started as Sta, StartingAcknowledged as Sack,
    };
    match (from, to) {
        // accepted → starting ACK applied, or fail closed.
        (Acc, Acc | Sack | Rr) => true,
        (Acc, Lau | Sta | Rack | Sf | Sfack | Cack) => false,
        // starting_acknowledged → spawn barrier, proven materialization failure, or fail closed.
        (Sack, Sack | Lau | Sf | Rr) => true,
        (Sack, Acc | Sta | Rack | Sfack | Cack) => false,
        // launching → spawned, proven no-spawn (Rejected), completion from a trusted receipt
        // (crash window before `started`, ADR-0116 §2), or unknown outcome.
        (Lau, Lau | Sta | Sf | Cack | Rr) => true,
        (Lau, Acc | Sack | Rack | Sfack) => false,
        // started → running ACK applied, completion, or fail closed.
        (Sta, Sta | Rack | Cack | Rr) => true,
        (Sta, Acc | Sack | Lau | Sf | Sfack) => false,
        // running_acknowledged → completion, or fail closed (lease loss, terminal).
        (Rack, Rack | Cack | Rr) => true,
        (Rack, Acc | Sack | Lau | Sta | Sf | Sfack) => false,
        // start_failed → failStart applied, or fail closed (control plane already running).
        (Sf, Sf | Sfack | Rr) => true,
        (Sf, Acc | Sack | Lau | Sta | Rack | Cack) => false,
        // Terminal states keep their state forever.
        (Sfack, Sfack) => true,
        (Sfack, Acc | Sack | Lau | Sta | Rack | Sf | Cack | Rr) => false,
        (Cack, Cack) => true,
        (Cack, Acc | Sack | Lau | Sta | Rack | Sf | Sfack | Rr) => false,
        // recovery_required → completion from a trusted receipt (launch_outcome_unknown).
        (Rr, Rr | Cack) => true,
        (Rr, Acc | Sack | Lau | Sta | Rack | Sf | Sfack) => false,
    }
}

/// A rejected update. Blame: the caller (stale or illegal proposal) — nothing was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TransitionError {
    /// The stored revision is not the one the caller expected (a concurrent or stale writer).
    StaleRevision {
        /// What the caller expected.
        expected: Revision,
        /// What is stored.
        found: Revision,
    },
    /// The proposed revision is not `expected + 1`.
    RevisionNotNext {
        /// `expected + 1` (or `None` when `expected` is the maximum).
        required: Option<Revision>,
        /// What was proposed.
        proposed: Revision,
    },
    /// The proposed record is invalid by itself.
    InvalidProposed(RecordError),
    /// The stored record is invalid by itself (a corrupt authority; fail closed).
    InvalidStored(RecordError),
    /// An offer authority field changed.
    AuthorityChanged {
        /// The first field that differs, by wire name.
        field: &'static str,
    },
    /// `acceptedAtMs` changed.
    AcceptedAtChanged,
    /// `updatedAtMs` went backwards.
    UpdatedAtRegressed {
        /// Stored value.
        stored: UnixMillis,
        /// Proposed value.
        proposed: UnixMillis,
    },
    /// The lease version went backwards.
    LeaseVersionRegressed {
        /// Stored version.
        stored: u64,
        /// Proposed version.
        proposed: u64,
    },
    /// The lease changed without a version change.
    LeaseChangedAtSameVersion,
    /// `from → to` is not an edge of the table.
    IllegalEdge {
        /// Stored state.
        from: State,
        /// Proposed state.
        to: State,
    },
    /// A write-once field changed or disappeared.
    WriteOnceChanged {
        /// The field.
        field: OptionalField,
    },
}

impl fmt::Display for TransitionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::StaleRevision { expected, found } => {
                write!(f, "stale revision: expected {expected}, stored {found}")
            }
            Self::RevisionNotNext {
                required: Some(r),
                proposed,
            } => {
                write!(f, "proposed revision {proposed} must be {r}")
            }
            Self::RevisionNotNext {
                required: None,
                proposed,
            } => {
                write!(
                    f,
                    "proposed revision {proposed}: the revision space is exhausted"
                )
            }
            Self::InvalidProposed(e) => write!(f, "proposed record is invalid: {e}"),
            Self::InvalidStored(e) => write!(f, "stored record is invalid: {e}"),
            Self::AuthorityChanged { field } => {
                write!(f, "offer authority must not change: {field} differs")
            }
            Self::AcceptedAtChanged => f.write_str("acceptedAtMs must never change"),
            Self::UpdatedAtRegressed { stored, proposed } => {
                write!(
                    f,
                    "updatedAtMs must not decrease: stored {stored}, proposed {proposed}"
                )
            }
            Self::LeaseVersionRegressed { stored, proposed } => {
                write!(
                    f,
                    "lease version must not decrease: stored {stored}, proposed {proposed}"
                )
            }
            Self::LeaseChangedAtSameVersion => {
                f.write_str("the lease must be identical while its version is unchanged")
            }
            Self::IllegalEdge { from, to } => write!(f, "illegal transition {from} -> {to}"),
            Self::WriteOnceChanged { field } => {
                write!(f, "write-once field {} must keep its value", field.as_str())
            }
        }
    }
}

impl core::error::Error for TransitionError {}

/// Checks one durable update of an inbox record (reference §3.6, SPEC §4):
/// 1. CAS: `stored.revision == expected` and `proposed.revision == expected + 1`;
/// 2. both records valid by themselves;
/// 3. offer authority unchanged (every field but the lease version/timings and the score);
/// 4. `acceptedAtMs` fixed, `updatedAtMs` not decreasing;
/// 5. lease version not decreasing, and the lease identical at the same version;
/// 6. `stored.state → proposed.state` is a table edge;
/// 7. write-once: a set optional field keeps its value — except that `recoveryReason` is dropped
///    on `recovery_required → completion_acknowledged`.
///
/// `stored` is validated in full (its revision re-normalized and digested once); `proposed`'s
/// revision is then proven valid by rule 3 (byte-identical to the stored one), so it is not
/// digested again. A caller holding a [`ValidRecord`] uses [`ValidRecord::advance`], which
/// digests nothing.
///
/// # Errors
/// The first rule broken, as a [`TransitionError`].
pub fn check_transition(
    stored: &InboxRecord,
    proposed: &InboxRecord,
    expected_revision: Revision,
) -> Result<(), TransitionError> {
    check_cas(stored, proposed, expected_revision)?;
    stored.validate().map_err(TransitionError::InvalidStored)?;
    check_successor(stored, proposed)
}

/// Rule 1.
fn check_cas(
    stored: &InboxRecord,
    proposed: &InboxRecord,
    expected_revision: Revision,
) -> Result<(), TransitionError> {
    if stored.revision != expected_revision {
        return Err(TransitionError::StaleRevision {
            expected: expected_revision,
            found: stored.revision,
        });
    }
    let required = expected_revision.next().ok();
    if required != Some(proposed.revision) {
        return Err(TransitionError::RevisionNotNext {
            required,
            proposed: proposed.revision,
        });
    }
    Ok(())
}

/// Rules 2–7 for a `stored` record already known valid.
fn check_successor(stored: &InboxRecord, proposed: &InboxRecord) -> Result<(), TransitionError> {
    proposed
        .validate_fields()
        .map_err(TransitionError::InvalidProposed)?;
    if let Some(field) = stored.offer.authority_difference(&proposed.offer, true) {
        return Err(TransitionError::AuthorityChanged { field });
    }
    if proposed.accepted_at_ms != stored.accepted_at_ms {
        return Err(TransitionError::AcceptedAtChanged);
    }
    if proposed.updated_at_ms < stored.updated_at_ms {
        return Err(TransitionError::UpdatedAtRegressed {
            stored: stored.updated_at_ms,
            proposed: proposed.updated_at_ms,
        });
    }
    let (old_lease, new_lease) = (&stored.offer.lease, &proposed.offer.lease);
    if new_lease.version < old_lease.version {
        return Err(TransitionError::LeaseVersionRegressed {
            stored: old_lease.version.get(),
            proposed: new_lease.version.get(),
        });
    }
    if new_lease.version == old_lease.version && new_lease != old_lease {
        return Err(TransitionError::LeaseChangedAtSameVersion);
    }
    if !edge_allowed(stored.state, proposed.state) {
        return Err(TransitionError::IllegalEdge {
            from: stored.state,
            to: proposed.state,
        });
    }
    for field in OptionalField::ALL {
        let dropped_reason = field == OptionalField::RecoveryReason
            && stored.state == State::RecoveryRequired
            && proposed.state == State::CompletionAcknowledged;
        if stored.has(field) && !dropped_reason && !stored.same(proposed, field) {
            return Err(TransitionError::WriteOnceChanged { field });
        }
    }
    Ok(())
}

/// An inbox record whose every rule held when it was made, kept as a type so that nothing
/// validates it again (SPEC §4; issue 15): its execution revision was re-normalized and digested
/// exactly once, when the record came in from outside ([`ValidRecord::new`], or the envelope
/// decoder's [`crate::envelope::decode_record`], which also checks the envelope's checksum), and
/// every successor made by [`ValidRecord::advance`] carries the same revision byte for byte.
///
/// Read-only: `Deref` gives the record; a change goes through [`ValidRecord::advance`].
#[derive(Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct ValidRecord(InboxRecord);

impl ValidRecord {
    /// Validates `record` in full ([`InboxRecord::validate`]).
    ///
    /// # Errors
    /// The first [`RecordError`].
    pub fn new(record: InboxRecord) -> Result<Self, RecordError> {
        record.validate()?;
        Ok(Self(record))
    }

    /// A record the caller has just validated in full (the envelope decoder).
    pub(crate) const fn validated(record: InboxRecord) -> Self {
        Self(record)
    }

    /// The update of this record to `proposed` at `expected_revision`, by every rule of
    /// [`check_transition`]; `proposed`'s revision is proven valid by being this one's, so no
    /// digest is computed.
    ///
    /// # Errors
    /// The first rule broken, as a [`TransitionError`]; `proposed` is dropped.
    pub fn advance(
        &self,
        proposed: InboxRecord,
        expected_revision: Revision,
    ) -> Result<Self, TransitionError> {
        check_cas(&self.0, &proposed, expected_revision)?;
        check_successor(&self.0, &proposed)?;
        Ok(Self(proposed))
    }

    /// The record.
    #[must_use]
    pub fn into_inner(self) -> InboxRecord {
        self.0
    }
}

impl core::ops::Deref for ValidRecord {
    type Target = InboxRecord;

    fn deref(&self) -> &InboxRecord {
        &self.0
    }
}

impl fmt::Debug for ValidRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{LeaseVersion, Sha256Digest};
    use crate::testkit;

    fn ms(v: u64) -> UnixMillis {
        UnixMillis::new(v).unwrap()
    }

    fn accepted() -> InboxRecord {
        InboxRecord::accepted(testkit::offer(1), ms(100))
    }

    /// `record` advanced to `state` at revision + 1, with `edit` applied.
    fn step(
        record: &InboxRecord,
        state: State,
        edit: impl FnOnce(&mut InboxRecord),
    ) -> InboxRecord {
        let mut next = record.clone();
        next.revision = record.revision.next().unwrap();
        next.state = state;
        next.updated_at_ms = record.updated_at_ms.saturating_add(1);
        edit(&mut next);
        next
    }

    fn launching(record: &InboxRecord) -> InboxRecord {
        step(record, State::Launching, |r| {
            r.executor_started_at_ms = Some(ms(102));
            r.log_artifact_id =
                Some(LogArtifactId::new("wlog-0123456789abcdef0123456789abcd").unwrap());
            r.completion_receipt_callback_sequence = Some(CallbackSequence::new(1).unwrap());
            r.completion_receipt_token_digest =
                Some(CapabilityDigest::new(Sha256Digest::of(b"capability")));
        })
    }

    fn check(stored: &InboxRecord, proposed: &InboxRecord) -> Result<(), TransitionError> {
        check_transition(stored, proposed, stored.revision)
    }

    #[test]
    fn the_happy_path_walks_every_acknowledgement_to_revision_five() {
        let r0 = accepted();
        let r1 = step(&r0, State::StartingAcknowledged, |_| {});
        let r2 = launching(&r1);
        let r3 = step(&r2, State::Started, |r| {
            r.executor_handle = Some(ExecutorHandle::new("ql3lp1.handle").unwrap());
        });
        let r4 = step(&r3, State::RunningAcknowledged, |_| {});
        let r5 = step(&r4, State::CompletionAcknowledged, |r| {
            r.completion_acknowledged_at_ms = Some(ms(200));
        });
        for (a, b) in [(&r0, &r1), (&r1, &r2), (&r2, &r3), (&r3, &r4), (&r4, &r5)] {
            assert_eq!(check(a, b), Ok(()), "{} -> {}", a.state, b.state);
        }
        assert_eq!(r5.revision.get(), 5);
    }

    #[test]
    fn stale_expected_revision_is_rejected_with_both_revisions() {
        let r0 = accepted();
        let r1 = step(&r0, State::StartingAcknowledged, |_| {});
        let err = check_transition(&r1, &step(&r1, State::Launching, |_| {}), Revision::FIRST);
        assert_eq!(
            err,
            Err(TransitionError::StaleRevision {
                expected: Revision::FIRST,
                found: r1.revision
            })
        );
    }

    #[test]
    fn revision_must_be_exactly_expected_plus_one() {
        let r0 = accepted();
        let mut skip = step(&r0, State::StartingAcknowledged, |_| {});
        skip.revision = Revision::new(2).unwrap();
        assert_eq!(
            check(&r0, &skip),
            Err(TransitionError::RevisionNotNext {
                required: Some(Revision::new(1).unwrap()),
                proposed: Revision::new(2).unwrap()
            })
        );
        let mut same = skip.clone();
        same.revision = Revision::FIRST;
        assert!(matches!(
            check(&r0, &same),
            Err(TransitionError::RevisionNotNext { .. })
        ));
    }

    #[test]
    fn offer_authority_changes_name_the_field() {
        let r0 = accepted();
        let mut other_token = step(&r0, State::Accepted, |_| {});
        other_token.offer.lease_token = testkit::lease_token(9);
        other_token.offer.lease.lease_token_digest = other_token.offer.lease_token.digest();
        assert_eq!(
            check(&r0, &other_token),
            Err(TransitionError::AuthorityChanged {
                field: "lease.leaseTokenDigest"
            })
        );
        let mut other_kind = step(&r0, State::Accepted, |_| {});
        other_kind.offer.delivery_kind = crate::offer::DeliveryKind::LeaseRecovery;
        assert_eq!(
            check(&r0, &other_kind),
            Err(TransitionError::AuthorityChanged {
                field: "deliveryKind"
            })
        );
        let mut other_priority = step(&r0, State::Accepted, |_| {});
        other_priority.offer.candidate.priority = 7;
        assert_eq!(
            check(&r0, &other_priority),
            Err(TransitionError::AuthorityChanged { field: "candidate" })
        );
    }

    #[test]
    fn accepted_at_is_fixed_and_updated_at_never_goes_back() {
        let r0 = accepted();
        let moved = step(&r0, State::Accepted, |r| {
            r.accepted_at_ms = ms(50);
            r.updated_at_ms = ms(100);
        });
        assert_eq!(check(&r0, &moved), Err(TransitionError::AcceptedAtChanged));
        let r1 = step(&r0, State::StartingAcknowledged, |r| {
            r.updated_at_ms = ms(150)
        });
        let back = step(&r1, State::Launching, |r| r.updated_at_ms = ms(149));
        let back = launching(&back);
        let back = InboxRecord {
            revision: r1.revision.next().unwrap(),
            updated_at_ms: ms(149),
            ..back
        };
        assert_eq!(
            check(&r1, &back),
            Err(TransitionError::UpdatedAtRegressed {
                stored: ms(150),
                proposed: ms(149)
            })
        );
    }

    #[test]
    fn lease_version_only_moves_forward_and_is_identical_at_the_same_version() {
        let r0 = accepted();
        let mut renewed = step(&r0, State::Accepted, |_| {});
        renewed.offer.lease.version = LeaseVersion::new(1).unwrap();
        renewed.offer.lease.renewed_at_ms = ms(40);
        renewed.offer.lease.expires_at_ms = ms(70_000);
        assert_eq!(check(&r0, &renewed), Ok(()));
        let mut back = step(&renewed, State::Accepted, |_| {});
        back.offer.lease = r0.offer.lease.clone();
        assert_eq!(
            check(&renewed, &back),
            Err(TransitionError::LeaseVersionRegressed {
                stored: 1,
                proposed: 0
            })
        );
        let mut drift = step(&r0, State::Accepted, |_| {});
        drift.offer.lease.expires_at_ms = ms(99_999);
        assert_eq!(
            check(&r0, &drift),
            Err(TransitionError::LeaseChangedAtSameVersion)
        );
    }

    #[test]
    fn edges_outside_the_table_are_illegal() {
        let r0 = accepted();
        let skip = launching(&r0);
        assert_eq!(
            check(&r0, &skip),
            Err(TransitionError::IllegalEdge {
                from: State::Accepted,
                to: State::Launching
            })
        );
    }

    #[test]
    fn terminal_states_never_leave() {
        let r1 = step(&accepted(), State::StartingAcknowledged, |_| {});
        let failed = step(&r1, State::StartFailed, |_| {});
        let acked = step(&failed, State::StartFailureAcknowledged, |_| {});
        assert_eq!(check(&failed, &acked), Ok(()));
        let out = step(&acked, State::RecoveryRequired, |r| {
            r.recovery_reason = Some(RecoveryReason::ControlPlaneTerminal);
        });
        assert_eq!(
            check(&acked, &out),
            Err(TransitionError::IllegalEdge {
                from: State::StartFailureAcknowledged,
                to: State::RecoveryRequired
            })
        );
        assert!(State::CompletionAcknowledged.is_terminal());
        assert!(!State::RecoveryRequired.is_terminal());
    }

    #[test]
    fn write_once_fields_keep_their_value() {
        let r2 = launching(&step(&accepted(), State::StartingAcknowledged, |_| {}));
        let moved = step(&r2, State::Launching, |r| {
            r.executor_started_at_ms = Some(ms(103))
        });
        assert_eq!(
            check(&r2, &moved),
            Err(TransitionError::WriteOnceChanged {
                field: OptionalField::ExecutorStartedAtMs
            })
        );
        let recovery = step(&r2, State::RecoveryRequired, |r| {
            r.recovery_reason = Some(RecoveryReason::LaunchOutcomeUnknown);
        });
        assert_eq!(check(&r2, &recovery), Ok(()));
        let other_reason = step(&recovery, State::RecoveryRequired, |r| {
            r.recovery_reason = Some(RecoveryReason::ControlPlaneTerminal);
        });
        assert_eq!(
            check(&recovery, &other_reason),
            Err(TransitionError::WriteOnceChanged {
                field: OptionalField::RecoveryReason
            })
        );
    }

    #[test]
    fn recovery_reason_is_dropped_only_on_completion_from_recovery() {
        let r2 = launching(&step(&accepted(), State::StartingAcknowledged, |_| {}));
        let recovery = step(&r2, State::RecoveryRequired, |r| {
            r.recovery_reason = Some(RecoveryReason::LaunchOutcomeUnknown);
        });
        let completed = step(&recovery, State::CompletionAcknowledged, |r| {
            r.recovery_reason = None;
            r.completion_acknowledged_at_ms = Some(ms(300));
        });
        assert_eq!(check(&recovery, &completed), Ok(()));
        assert_eq!(completed.recovery(), None);
        assert_eq!(
            recovery.recovery(),
            Some(RecoveryReason::LaunchOutcomeUnknown)
        );
    }

    #[test]
    fn per_state_presence_is_enforced_on_the_proposed_record() {
        let r1 = step(&accepted(), State::StartingAcknowledged, |_| {});
        let bare = step(&r1, State::Launching, |_| {});
        assert_eq!(
            check(&r1, &bare),
            Err(TransitionError::InvalidProposed(
                RecordError::FieldPresence {
                    state: State::Launching,
                    field: OptionalField::ExecutorStartedAtMs,
                    expected: Presence::Required,
                }
            ))
        );
        let half = step(&launching(&r1), State::Launching, |r| {
            r.completion_receipt_token_digest = None
        });
        assert_eq!(
            half.validate(),
            Err(RecordError::CompletionReceiptHalfPresent)
        );
        let mut handle_only = accepted();
        handle_only.state = State::RecoveryRequired;
        handle_only.recovery_reason = Some(RecoveryReason::LaunchOutcomeUnknown);
        handle_only.executor_handle = Some(ExecutorHandle::new("h").unwrap());
        assert_eq!(
            handle_only.validate(),
            Err(RecordError::HandleWithoutStartTime)
        );
    }

    #[test]
    fn a_corrupt_stored_record_fails_closed() {
        let mut stored = accepted();
        stored.schema_version = 2;
        let proposed = step(&stored, State::StartingAcknowledged, |r| {
            r.schema_version = 1
        });
        assert_eq!(
            check(&stored, &proposed),
            Err(TransitionError::InvalidStored(RecordError::SchemaVersion {
                found: 2
            }))
        );
        let mut before = accepted();
        before.updated_at_ms = ms(99);
        assert_eq!(before.validate(), Err(RecordError::UpdatedBeforeAccepted));
    }

    #[test]
    fn an_inconsistent_offer_is_an_invalid_record() {
        let mut r = accepted();
        r.offer.lease.run_id = crate::ids::RunId::new("run-2").unwrap();
        assert!(matches!(r.validate(), Err(RecordError::Offer(_))));
    }

    #[test]
    fn only_the_states_before_the_spawn_barrier_can_be_dormant() {
        // docs/state-machine.md: nothing was spawned in these three states.
        let pre_barrier = [
            State::Accepted,
            State::StartingAcknowledged,
            State::StartFailed,
        ];
        for state in State::ALL {
            assert_eq!(
                state.is_pre_barrier(),
                pre_barrier.contains(&state),
                "{state}"
            );
        }
        let r0 = accepted();
        let expiry = r0.offer.lease.expires_at_ms;
        let before = ms(expiry.get() - 1);
        // The lease is live while `now < expiresAtMs`: dormant from the expiry on, not before.
        assert!(!r0.is_dormant(before));
        assert!(r0.is_dormant(expiry));
        let r1 = step(&r0, State::StartingAcknowledged, |_| {});
        let failed = step(&r1, State::StartFailed, |_| {});
        assert!(failed.is_dormant(expiry) && !failed.is_dormant(before));
        let spawning = launching(&r1);
        assert!(!spawning.is_dormant(expiry));
        assert!(!spawning.is_dormant(ms(expiry.get() + 1)));
    }

    #[test]
    fn either_half_of_the_completion_receipt_counts_as_set() {
        let r2 = launching(&step(&accepted(), State::StartingAcknowledged, |_| {}));
        let mut sequence_only = r2.clone();
        sequence_only.completion_receipt_token_digest = None;
        let mut digest_only = r2.clone();
        digest_only.completion_receipt_callback_sequence = None;
        for half in [&sequence_only, &digest_only] {
            assert!(half.has(OptionalField::CompletionReceipt));
            assert_eq!(
                half.validate(),
                Err(RecordError::CompletionReceiptHalfPresent)
            );
        }
        assert!(!accepted().has(OptionalField::CompletionReceipt));
    }

    #[test]
    fn names_are_the_reference_wire_names() {
        use alloc::string::ToString;
        let reasons = [
            "launch_outcome_unknown",
            "control_plane_already_running",
            "control_plane_terminal",
            "lease_lost_local_execution_stopped",
            "lease_lost_local_execution_unverified",
        ];
        for (reason, name) in RecoveryReason::ALL.into_iter().zip(reasons) {
            assert_eq!(reason.as_str(), name);
            assert_eq!(reason.to_string(), name);
            assert_eq!(
                serde_json::to_string(&reason).unwrap(),
                alloc::format!("\"{name}\"")
            );
        }
        let fields = [
            "executorHandle",
            "executorStartedAtMs",
            "logArtifactId",
            "completionReceiptCallbackSequence/TokenDigest",
            "completionAcknowledgedAtMs",
            "recoveryReason",
        ];
        for (field, name) in OptionalField::ALL.into_iter().zip(fields) {
            assert_eq!(field.as_str(), name);
        }
    }

    #[test]
    fn record_errors_render_the_rule_and_the_field() {
        use alloc::string::ToString;
        let presence = |expected| RecordError::FieldPresence {
            state: State::Launching,
            field: OptionalField::ExecutorStartedAtMs,
            expected,
        };
        let cases = [
            (
                RecordError::SchemaVersion { found: 2 },
                "record schemaVersion must be 1, found 2",
            ),
            (
                RecordError::UpdatedBeforeAccepted,
                "record updatedAtMs is before acceptedAtMs",
            ),
            (
                presence(Presence::Required),
                "record field executorStartedAtMs must be present in state launching",
            ),
            (
                presence(Presence::Absent),
                "record field executorStartedAtMs must be absent in state launching",
            ),
            (
                presence(Presence::Optional),
                "record field executorStartedAtMs must be optional in state launching",
            ),
            (
                RecordError::HandleWithoutStartTime,
                "record executorHandle requires executorStartedAtMs",
            ),
            (
                RecordError::CompletionReceiptHalfPresent,
                "record completionReceiptCallbackSequence and TokenDigest must be both present \
                 or both absent",
            ),
        ];
        for (error, text) in cases {
            assert_eq!(error.to_string(), text);
        }
        let e = TransitionError::WriteOnceChanged {
            field: OptionalField::LogArtifactId,
        };
        assert_eq!(
            e.to_string(),
            "write-once field logArtifactId must keep its value"
        );
    }

    #[test]
    fn errors_render_the_rule() {
        use alloc::string::ToString;
        let e = TransitionError::IllegalEdge {
            from: State::Accepted,
            to: State::Started,
        };
        assert_eq!(e.to_string(), "illegal transition accepted -> started");
        let e = TransitionError::StaleRevision {
            expected: Revision::FIRST,
            found: Revision::new(3).unwrap(),
        };
        assert_eq!(e.to_string(), "stale revision: expected 0, stored 3");
    }

    /// A record whose revision was changed without re-sealing: its own `contentDigest` and the
    /// offer's `executionDigest` still agree, so only re-digesting (or comparing with a
    /// validated revision) can tell.
    fn with_tampered_revision(record: &InboxRecord) -> InboxRecord {
        let mut tampered = record.clone();
        tampered.offer.execution_revision.working_directory = Some("/tmp".into());
        tampered
    }

    #[test]
    fn a_valid_record_walks_the_happy_path_with_the_verdicts_of_check_transition() {
        let r0 = accepted();
        let r1 = step(&r0, State::StartingAcknowledged, |_| {});
        let r2 = launching(&r1);
        let r3 = step(&r2, State::Started, |r| {
            r.executor_handle = Some(ExecutorHandle::new("ql3lp1.handle").unwrap());
        });
        let mut valid = ValidRecord::new(r0.clone()).unwrap();
        for next in [&r1, &r2, &r3] {
            let stored = valid.clone();
            valid = stored.advance(next.clone(), stored.revision).unwrap();
            assert_eq!(&*valid, next);
        }
        // Refusals are the same as check_transition's, for the same reasons.
        let back = step(&r3, State::Launching, |_| {});
        let refused = valid.advance(back.clone(), r3.revision).map(|_| ());
        assert!(refused.is_err());
        assert_eq!(refused, check(&r3, &back));
        let at_r1 = ValidRecord::new(r1.clone()).unwrap();
        let to_accepted = step(&r1, State::Accepted, |_| {});
        assert_eq!(
            at_r1.advance(to_accepted, r1.revision).map(|_| ()),
            Err(TransitionError::IllegalEdge {
                from: State::StartingAcknowledged,
                to: State::Accepted
            })
        );
        assert!(matches!(
            valid.advance(step(&r3, State::Started, |_| {}), r2.revision),
            Err(TransitionError::StaleRevision { .. })
        ));
        assert_eq!(valid.into_inner(), r3);
    }

    #[test]
    fn a_tampered_revision_is_caught_once_by_validation_and_then_by_comparison() {
        let r0 = accepted();
        let tampered = with_tampered_revision(&r0);
        // From outside (a decode, a new ValidRecord): re-normalized and re-digested.
        assert!(matches!(
            ValidRecord::new(tampered.clone()),
            Err(RecordError::Offer(OfferError::Bound {
                field: "executionRevision",
                ..
            }))
        ));
        assert!(matches!(
            check(
                &tampered,
                &step(&tampered, State::StartingAcknowledged, |_| {})
            ),
            Err(TransitionError::InvalidStored(RecordError::Offer(_)))
        ));
        // As a successor of a valid record: compared with the validated revision, not digested.
        let proposed = with_tampered_revision(&step(&r0, State::StartingAcknowledged, |_| {}));
        let changed = Err(TransitionError::AuthorityChanged {
            field: "executionRevision",
        });
        assert_eq!(check(&r0, &proposed), changed);
        let valid = ValidRecord::new(r0.clone()).unwrap();
        assert_eq!(valid.advance(proposed, r0.revision).map(|_| ()), changed);
    }
}
