//! Retention: which settled records, archived records and logs may be removed (SPEC §3, "inbox
//! retention"; SPEC §10, "capacity"). Pure functions of facts the driver gathers; the driver
//! only carries the [`Plan`] out (`drivers/src/retention.rs`).
//!
//! Rules:
//! * A **record** is removable once nothing can need it again: it is settled
//!   (`completion_acknowledged`, `start_failure_acknowledged`: the control plane acknowledged
//!   it), its receipt is gone (the receipt holds the completion capability and is removed only
//!   after `completion_acknowledged` is durable) and no pending claim names its offer (a crash
//!   between storing an offer and clearing its claim leaves such a claim; the next Pull clears
//!   it after finding the record). How long its log is kept does not matter.
//! * Removable records older than `max_settled_age_ms` (since `updatedAtMs`) go; then, while the
//!   inbox holds more than `high_water_records`, the oldest removable ones (by `updatedAtMs`,
//!   then offer id).
//! * A **log** (and its truncation fact) is kept `log_keep_ms` on its own. While its record is
//!   in the inbox, from the record's settlement: `completionAcknowledgedAtMs`, or `updatedAtMs`
//!   for a `start_failure_acknowledged` record (the Executor proved nothing ran). Once no inbox
//!   record names it (its record was removed or archived), from the log's own metadata: the
//!   time it was last written (the later of the log's and its fact's modification times),
//!   which is when capture ended. A log an inbox record names is never removed before that
//!   record is settled.
//! * An **archived** record (`ql-worker recover --archive`, `<root>/archive/`) is kept
//!   `max_settled_age_ms` after it was archived, then removed; it never counts against the
//!   inbox.
//!
//! [`due`] says when a sweep is worth running; [`archivable`] is the operator's archive rule.

use alloc::vec::Vec;

use crate::ids::{LogArtifactId, OfferId, Revision};
use crate::record::{InboxRecord, State};
use crate::time::UnixMillis;

/// Retention configuration (`[retention]` in the configuration file).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Above this many records in the inbox, the oldest removable settled records are removed.
    pub high_water_records: usize,
    /// Removable records settled longer than this, and archived records archived longer than
    /// this, are removed; `None`: never by age.
    pub max_settled_age_ms: Option<u64>,
    /// How long a log is kept after its Run settled (or, once no record names it, after it was
    /// last written).
    pub log_keep_ms: u64,
}

impl Default for RetentionPolicy {
    /// 48 records (three quarters of the default capacity of 64), 7 days, 24 hours.
    fn default() -> Self {
        Self {
            high_water_records: 48,
            max_settled_age_ms: Some(7 * 24 * 3600 * 1000),
            log_keep_ms: 24 * 3600 * 1000,
        }
    }
}

/// One inbox record as retention sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecordFacts {
    /// The offer.
    pub offer_id: OfferId,
    /// Its revision (the removal is a CAS on it).
    pub revision: Revision,
    /// Its state.
    pub state: State,
    /// `updatedAtMs`.
    pub updated_at_ms: UnixMillis,
    /// `completionAcknowledgedAtMs`.
    pub completion_acknowledged_at_ms: Option<UnixMillis>,
    /// The log this record names or will name (the id is derived from the offer, so a record
    /// that has not reached `launching` yet already owns it).
    pub log_artifact_id: LogArtifactId,
    /// Whether the completion receipt of its attempt is on disk (an unreadable one counts as
    /// present).
    pub receipt_present: bool,
    /// Whether the pending claim names this offer.
    pub claimed: bool,
}

impl RecordFacts {
    /// The facts of `record`, given what the driver found beside it.
    #[must_use]
    pub fn of(record: &InboxRecord, receipt_present: bool, claimed: bool) -> Self {
        let offer = &record.offer;
        Self {
            offer_id: offer.offer_id.clone(),
            revision: record.revision,
            state: record.state,
            updated_at_ms: record.updated_at_ms,
            completion_acknowledged_at_ms: record.completion_acknowledged_at_ms,
            log_artifact_id: record
                .log_artifact_id
                .clone()
                .unwrap_or_else(|| offer.log_artifact_id()),
            receipt_present,
            claimed,
        }
    }

    /// Whether nothing can need this record again (see the module rules).
    #[must_use]
    pub fn removable(&self) -> bool {
        may_remove_in(self.state) && !self.receipt_present && !self.claimed
    }

    /// When this record's Run settled, for its log's keep period (`None`: not settled).
    #[must_use]
    pub fn settled_at(&self) -> Option<UnixMillis> {
        match self.state {
            State::CompletionAcknowledged => self.completion_acknowledged_at_ms,
            State::StartFailureAcknowledged => Some(self.updated_at_ms),
            State::Accepted
            | State::StartingAcknowledged
            | State::Launching
            | State::Started
            | State::RunningAcknowledged
            | State::StartFailed
            | State::RecoveryRequired => None,
        }
    }
}

/// Whether a record in `state` may ever be removed by retention: only a settled one
/// (`completion_acknowledged`, `start_failure_acknowledged`). For any other state the plan keeps
/// the record whatever else is true, so the driver need not even look for its receipt.
#[must_use]
pub fn may_remove_in(state: State) -> bool {
    state.is_terminal()
}

/// Why the journal must not carry out one removal of a [`Plan`], checked on the record it reads
/// under the owner lock just before removing it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RemovalRefused {
    /// The record changed since the plan was made (a revision CAS, as for every update).
    #[error("stale revision: expected {expected}, stored {found}")]
    StaleRevision {
        /// The revision the plan saw.
        expected: Revision,
        /// The revision stored now.
        found: Revision,
    },
    /// The record is not settled: retention never removes a live record.
    #[error("state {0} is not settled")]
    NotSettled(State),
}

/// The re-check of one planned removal against the record stored now (`stored`), at the
/// revision the plan saw (`expected`).
///
/// # Errors
/// [`RemovalRefused`]; nothing may be removed.
pub fn check_removal(stored: &InboxRecord, expected: Revision) -> Result<(), RemovalRefused> {
    if stored.revision != expected {
        return Err(RemovalRefused::StaleRevision {
            expected,
            found: stored.revision,
        });
    }
    if !may_remove_in(stored.state) {
        return Err(RemovalRefused::NotSettled(stored.state));
    }
    Ok(())
}

/// A log file on disk, with its own metadata.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogFacts {
    /// The log.
    pub log_artifact_id: LogArtifactId,
    /// When it was last written: the later modification time of the log and its truncation
    /// fact (capture ended then).
    pub written_at_ms: UnixMillis,
}

/// An archived record, with the time it was archived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArchivedFacts {
    /// The offer.
    pub offer_id: OfferId,
    /// When it was moved into the archive.
    pub archived_at_ms: UnixMillis,
}

/// What to remove, in this order: logs, records, archived records.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Logs to remove (with their truncation facts), ascending.
    pub logs: Vec<LogArtifactId>,
    /// Inbox records to remove, oldest first, each with the revision it must still have.
    pub records: Vec<(OfferId, Revision)>,
    /// Archived records to remove, ascending.
    pub archived: Vec<OfferId>,
}

impl Plan {
    /// Whether the plan removes nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.logs.is_empty() && self.records.is_empty() && self.archived.is_empty()
    }
}

/// The retention decision for an inbox of `records` (every record of it), the logs on disk
/// (`None`: not scanned this time, so only logs of inbox records are considered) and the
/// archived records (`None`: not scanned). See the module rules.
#[must_use]
pub fn plan(
    records: &[RecordFacts],
    logs: Option<&[LogFacts]>,
    archived: Option<&[ArchivedFacts]>,
    now: UnixMillis,
    policy: &RetentionPolicy,
) -> Plan {
    let mut removable: Vec<&RecordFacts> = records.iter().filter(|r| r.removable()).collect();
    removable.sort_by(|a, b| (a.updated_at_ms, &a.offer_id).cmp(&(b.updated_at_ms, &b.offer_id)));
    let older_than = |since: UnixMillis, ms: u64| now.saturating_since(since) >= ms;
    let expired = |since| {
        policy
            .max_settled_age_ms
            .is_some_and(|age| older_than(since, age))
    };
    let mut remaining = records.len();
    let mut removed_records = Vec::new();
    for r in removable {
        if expired(r.updated_at_ms) || remaining > policy.high_water_records {
            removed_records.push((r.offer_id.clone(), r.revision));
            remaining -= 1;
        }
    }
    // Logs of inbox records: only once the record is settled and the keep period passed.
    let mut removed_logs: Vec<LogArtifactId> = records
        .iter()
        .filter(|r| {
            r.settled_at()
                .is_some_and(|at| older_than(at, policy.log_keep_ms))
        })
        .map(|r| r.log_artifact_id.clone())
        .collect();
    // Logs no inbox record names, by their own metadata. A log named by a record removed in
    // this very plan counts as named here; the next sweep sees it unnamed.
    if let Some(logs) = logs {
        for log in logs {
            let named = records
                .iter()
                .any(|r| r.log_artifact_id == log.log_artifact_id);
            if !named && older_than(log.written_at_ms, policy.log_keep_ms) {
                removed_logs.push(log.log_artifact_id.clone());
            }
        }
    }
    removed_logs.sort();
    removed_logs.dedup();
    let mut removed_archived: Vec<OfferId> = archived
        .unwrap_or_default()
        .iter()
        .filter(|a| expired(a.archived_at_ms))
        .map(|a| a.offer_id.clone())
        .collect();
    removed_archived.sort();
    Plan {
        logs: removed_logs,
        records: removed_records,
        archived: removed_archived,
    }
}

/// What decides whether the inbox's own sweep is worth running (see [`due`]): the inbox's
/// record and settled counts, and how many durable facts so far may have made a settled record
/// removable without changing those counts (a receipt removed, a claim cleared).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SweepKey {
    /// Records in the inbox.
    pub records: usize,
    /// Of them, those settled.
    pub settled: usize,
    /// Receipts removed and claims cleared since start (a counter).
    pub released: u64,
}

/// Whether a sweep is worth running now: the periodic sweep is due (`periodic_due`), or the
/// inbox holds more than `high_water_records` and its [`SweepKey`] changed since the last sweep
/// (`last_swept`): a record came, one settled, or a receipt or claim that kept a settled record
/// went. So an inbox above the mark is brought back as soon as a record may go, and one full of
/// live Runs is not rescanned between every two commands.
#[must_use]
pub fn due(
    key: SweepKey,
    last_swept: Option<SweepKey>,
    periodic_due: bool,
    policy: &RetentionPolicy,
) -> bool {
    periodic_due || (key.records > policy.high_water_records && last_swept != Some(key))
}

/// Why a record may not be archived.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ArchiveRefusal {
    /// Only `recovery_required` records, or dormant ones (before the spawn barrier with the
    /// lease expired: nothing ran and nothing can start), may be archived.
    #[error("the record is {0}: {rule}", rule = Self::RULE)]
    NotReviewable(State),
}

impl ArchiveRefusal {
    /// The archive rule, as operators read it.
    pub const RULE: &'static str = "only a recovery_required record or a dormant one (accepted, \
        starting_acknowledged or start_failed with its lease expired) can be archived; settled \
        records are removed by retention";
}

/// The operator's archive rule (`ql-worker recover --archive`): a `recovery_required` record,
/// or a dormant one at `now`. Archiving moves the record out of the inbox and removes its
/// receipt (the capability it holds can never be used again: no completion follows an archive).
///
/// # Errors
/// [`ArchiveRefusal`] for any other record.
pub fn archivable(record: &InboxRecord, now: UnixMillis) -> Result<(), ArchiveRefusal> {
    if record.state == State::RecoveryRequired || record.is_dormant(now) {
        Ok(())
    } else {
        Err(ArchiveRefusal::NotReviewable(record.state))
    }
}
