//! The inbox record and its transition graph (ADR-0111 §1; reference §3.5–§3.6; SPEC §4).
//!
//! One record per offer is the single authority for delivery and execution. Every durable update
//! goes through [`check_transition`], which enforces the revision CAS, offer authority, time and
//! lease monotonicity, write-once fields and the edge table. The edge table is one exhaustive
//! `match` with no wildcard arm (CONVENTIONS C7): a row of every target state per source state.
#![deny(clippy::wildcard_enum_match_arm)]

use core::fmt;

use serde::{Deserialize, Serialize};

use crate::ids::{CallbackSequence, CapabilityDigest, ExecutorHandle, LogArtifactId, Revision};
use crate::offer::{Offer, OfferError};
use crate::time::UnixMillis;

/// The on-disk schema version of the record body (reference `schemaVersion: 1`).
pub const RECORD_SCHEMA_VERSION: u8 = 1;

wire_enum! {
    /// The nine inbox states (reference §3.6), in the reference's order.
    State {
        /// Durably accepted from a Pull; nothing acknowledged yet.
        Accepted = "accepted",
        /// The control plane applied `starting`.
        StartingAcknowledged = "starting_acknowledged",
        /// The spawn barrier: about to spawn; start time, log id and callback digest are durable.
        Launching = "launching",
        /// Spawned; the durable executor handle is stored.
        Started = "started",
        /// The control plane applied `running`.
        RunningAcknowledged = "running_acknowledged",
        /// Proven no-spawn failure, not yet reported.
        StartFailed = "start_failed",
        /// Start failure reported and applied. Terminal.
        StartFailureAcknowledged = "start_failure_acknowledged",
        /// Completion applied by the control plane. Terminal.
        CompletionAcknowledged = "completion_acknowledged",
        /// Fail-closed evidence; see [`RecoveryReason`].
        RecoveryRequired = "recovery_required",
    }
}

impl State {
    /// Settled states: the record will never change state again (the edge table gives them
    /// only their self-edge).
    #[must_use]
    pub fn is_terminal(self) -> bool {
        Self::ALL
            .into_iter()
            .all(|to| to == self || !edge_allowed(self, to))
    }

    /// States before the spawn barrier: no process was ever started for the record (a
    /// `start_failed` record carries the proof that none was).
    #[must_use]
    pub const fn is_pre_barrier(self) -> bool {
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

wire_enum! {
    /// Why a record is `recovery_required` (reference §3.5).
    RecoveryReason {
        /// A spawn may or may not have happened (restart in `launching`, unknown executor
        /// outcome, failed `started` write). Completion from a trusted receipt is still possible.
        LaunchOutcomeUnknown = "launch_outcome_unknown",
        /// The control plane says the Run is already running while we hold no proof of our spawn.
        ControlPlaneAlreadyRunning = "control_plane_already_running",
        /// The control plane reports the Run terminal.
        ControlPlaneTerminal = "control_plane_terminal",
        /// The lease expired locally and the local process was conclusively stopped.
        LeaseLostLocalExecutionStopped = "lease_lost_local_execution_stopped",
        /// The lease expired locally and stopping the local process could not be verified.
        LeaseLostLocalExecutionUnverified = "lease_lost_local_execution_unverified",
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

wire_enum! {
    /// The optional fields of a record, by wire name, in the column order of [`presence`]'s
    /// table.
    OptionalField {
        ExecutorHandle = "executorHandle",
        ExecutorStartedAtMs = "executorStartedAtMs",
        LogArtifactId = "logArtifactId",
        /// `completionReceiptCallbackSequence` and `completionReceiptTokenDigest` (always
        /// paired).
        CompletionReceipt = "completionReceiptCallbackSequence/TokenDigest",
        CompletionAcknowledgedAtMs = "completionAcknowledgedAtMs",
        RecoveryReason = "recoveryReason",
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
    use Presence::{Absent as A, Optional as O, Required as R};
    // Columns, in `OptionalField`'s order: handle, startedAt, logId, callback seq+digest,
    // completionAckAt, recoveryReason.
    let row: [Presence; OptionalField::ALL.len()] = match state {
        State::Accepted | State::StartingAcknowledged => [A, A, A, A, A, A],
        State::Launching => [A, R, R, R, A, A],
        State::Started | State::RunningAcknowledged => [R, R, R, R, A, A],
        State::StartFailed | State::StartFailureAcknowledged => [A, O, O, O, A, A],
        State::CompletionAcknowledged => [O, R, R, R, R, A],
        State::RecoveryRequired => [O, O, O, O, A, R],
    };
    row[field as usize]
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
            let wrong = matches!(
                (expected, self.has(field)),
                (Presence::Required, false) | (Presence::Absent, true)
            );
            if wrong {
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
        self.recovery_reason
            .filter(|_| self.state == State::RecoveryRequired)
    }
}

/// Whether `from → to` is an edge of the reference table (§3.6). Self-edges exist for every
/// state (lease-version updates); terminal states have only their self-edge.
#[must_use]
pub const fn edge_allowed(from: State, to: State) -> bool {
    const Y: bool = true;
    const N: bool = false;
    // Columns, in `State::ALL`'s order: accepted, starting_acknowledged, launching, started,
    // running_acknowledged, start_failed, start_failure_acknowledged, completion_acknowledged,
    // recovery_required.
    let row: [bool; State::ALL.len()] = match from {
        // accepted → starting ACK applied, or fail closed.
        State::Accepted => [Y, Y, N, N, N, N, N, N, Y],
        // starting_acknowledged → spawn barrier, proven materialization failure, or fail closed.
        State::StartingAcknowledged => [N, Y, Y, N, N, Y, N, N, Y],
        // launching → spawned, proven no-spawn (Rejected), completion from a trusted receipt
        // (crash window before `started`, ADR-0116 §2), or unknown outcome.
        State::Launching => [N, N, Y, Y, N, Y, N, Y, Y],
        // started → running ACK applied, completion, or fail closed.
        State::Started => [N, N, N, Y, Y, N, N, Y, Y],
        // running_acknowledged → completion, or fail closed (lease loss, terminal).
        State::RunningAcknowledged => [N, N, N, N, Y, N, N, Y, Y],
        // start_failed → failStart applied, or fail closed (control plane already running).
        State::StartFailed => [N, N, N, N, N, Y, Y, N, Y],
        // Terminal states keep their state forever.
        State::StartFailureAcknowledged => [N, N, N, N, N, N, Y, N, N],
        State::CompletionAcknowledged => [N, N, N, N, N, N, N, Y, N],
        // recovery_required → completion from a trusted receipt (launch_outcome_unknown).
        State::RecoveryRequired => [N, N, N, N, N, N, N, Y, Y],
    };
    row[to as usize]
}

/// A rejected update. Blame: the caller (stale or illegal proposal) — nothing was written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    /// The stored revision is not the one the caller expected (a concurrent or stale writer).
    #[error("stale revision: expected {expected}, stored {found}")]
    StaleRevision {
        /// What the caller expected.
        expected: Revision,
        /// What is stored.
        found: Revision,
    },
    /// The proposed revision is not `expected + 1`.
    #[error("proposed revision {proposed}{}", match .required {
        Some(r) => alloc::format!(" must be {r}"),
        None => alloc::string::String::from(": the revision space is exhausted"),
    })]
    RevisionNotNext {
        /// `expected + 1` (or `None` when `expected` is the maximum).
        required: Option<Revision>,
        /// What was proposed.
        proposed: Revision,
    },
    /// The proposed record is invalid by itself.
    #[error("proposed record is invalid: {0}")]
    InvalidProposed(RecordError),
    /// The stored record is invalid by itself (a corrupt authority; fail closed).
    #[error("stored record is invalid: {0}")]
    InvalidStored(RecordError),
    /// An offer authority field changed.
    #[error("offer authority must not change: {field} differs")]
    AuthorityChanged {
        /// The first field that differs, by wire name.
        field: &'static str,
    },
    /// `acceptedAtMs` changed.
    #[error("acceptedAtMs must never change")]
    AcceptedAtChanged,
    /// `updatedAtMs` went backwards.
    #[error("updatedAtMs must not decrease: stored {stored}, proposed {proposed}")]
    UpdatedAtRegressed {
        /// Stored value.
        stored: UnixMillis,
        /// Proposed value.
        proposed: UnixMillis,
    },
    /// The lease version went backwards.
    #[error("lease version must not decrease: stored {stored}, proposed {proposed}")]
    LeaseVersionRegressed {
        /// Stored version.
        stored: u64,
        /// Proposed version.
        proposed: u64,
    },
    /// The lease changed without a version change.
    #[error("the lease must be identical while its version is unchanged")]
    LeaseChangedAtSameVersion,
    /// `from → to` is not an edge of the table.
    #[error("illegal transition {from} -> {to}")]
    IllegalEdge {
        /// Stored state.
        from: State,
        /// Proposed state.
        to: State,
    },
    /// A write-once field changed or disappeared.
    #[error("write-once field {} must keep its value", .field.as_str())]
    WriteOnceChanged {
        /// The field.
        field: OptionalField,
    },
}

/// Checks one durable update of an inbox record (reference §3.6, SPEC §4):
/// 1. CAS: `stored.revision == expected` and `proposed.revision == expected + 1`;
/// 2. both records valid by themselves;
/// 3. offer authority unchanged (every field but the lease version/timings and the score);
/// 4. `acceptedAtMs` fixed, `updatedAtMs` not decreasing;
/// 5. lease version not decreasing, and the lease identical at the same version;
/// 6. `stored.state → proposed.state` is a table edge;
/// 7. write-once: a set optional field keeps its value unless the new state forbids it (of the
///    table's edges, only `recovery_required → completion_acknowledged` drops one:
///    `recoveryReason`).
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
        let dropped = presence(proposed.state, field) == Presence::Absent;
        if stored.has(field) && !dropped && !stored.same(proposed, field) {
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
