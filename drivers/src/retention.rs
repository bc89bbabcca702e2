//! Bounded retention of settled records and their logs (SPEC §3, "inbox retention").
//!
//! Rules:
//! * Only **settled** records (`completion_acknowledged`, `start_failure_acknowledged`) are ever
//!   removed; a non-terminal record never is (the journal re-checks this under the lock,
//!   [`Journal::remove_settled_record`]).
//! * A settled Run's **log** (and its truncation fact) is removed only after its completion was
//!   acknowledged and `log_keep_ms` passed since `completionAcknowledgedAtMs`. For
//!   `start_failure_acknowledged` there is no completion: the Executor proved that no user
//!   process started, so the log can hold nothing to upload, and it is removed `log_keep_ms`
//!   after the record settled (`updatedAtMs`). This is a deliberate addition to the brief's rule;
//!   without it such logs could never go.
//! * A settled **record** is removable only once its log is (so no log is ever orphaned). Among
//!   removable records, those settled longer than `max_settled_age_ms` go, then the oldest
//!   (by `updatedAtMs`, then offer id) go while the inbox holds more than `high_water_records`.
//! * The log goes first, the record second: a crash between them leaves a settled record whose
//!   log is already gone, and the next sweep finishes the job (log removal is idempotent).
//!
//! [`plan`] is pure (and unit-tested); [`sweep`] reads the records and carries the plan out.

use std::path::PathBuf;

use ql_worker_core::ids::{LogArtifactId, OfferId, Revision};
use ql_worker_core::listing::PageLimit;
use ql_worker_core::record::{InboxRecord, State};
use ql_worker_core::time::UnixMillis;

use crate::fsio::FileSystem;
use crate::journal::{Journal, JournalError};
use crate::spool::{self, SpoolError};

/// Retention configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Above this many records in the inbox, the oldest removable settled records are removed.
    pub high_water_records: usize,
    /// Settled records older than this (since `updatedAtMs`) are removed; `None`: never by age.
    pub max_settled_age_ms: Option<u64>,
    /// How long a settled Run's log is kept after its completion was acknowledged.
    pub log_keep_ms: u64,
}

impl Default for RetentionPolicy {
    /// Keep the inbox at most three quarters full of the default capacity (48 of 64), settled
    /// records at most 7 days, logs 24 hours after acknowledgement.
    fn default() -> Self {
        Self {
            high_water_records: 48,
            max_settled_age_ms: Some(7 * 24 * 3600 * 1000),
            log_keep_ms: 24 * 3600 * 1000,
        }
    }
}

/// What retention needs to know about one settled record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    /// The offer.
    pub offer_id: OfferId,
    /// Its revision (the removal is a CAS on it).
    pub revision: Revision,
    /// `completion_acknowledged` or `start_failure_acknowledged`.
    pub state: State,
    /// `updatedAtMs`: when it settled.
    pub settled_at_ms: UnixMillis,
    /// `completionAcknowledgedAtMs`.
    pub completion_acknowledged_at_ms: Option<UnixMillis>,
    /// Its log, if one was allocated.
    pub log_artifact_id: Option<LogArtifactId>,
}

impl Settled {
    /// The settled view of a record, or `None` for a record that is not settled.
    #[must_use]
    pub fn of(record: &InboxRecord) -> Option<Self> {
        record.state.is_terminal().then(|| Self {
            offer_id: record.offer.offer_id.clone(),
            revision: record.revision,
            state: record.state,
            settled_at_ms: record.updated_at_ms,
            completion_acknowledged_at_ms: record.completion_acknowledged_at_ms,
            log_artifact_id: record.log_artifact_id.clone(),
        })
    }

    /// Whether its log (if any) may be removed at `now`.
    #[must_use]
    pub fn log_removable(&self, now: UnixMillis, policy: &RetentionPolicy) -> bool {
        let since = match self.state {
            State::CompletionAcknowledged => self.completion_acknowledged_at_ms,
            State::StartFailureAcknowledged => Some(self.settled_at_ms),
            State::Accepted
            | State::StartingAcknowledged
            | State::Launching
            | State::Started
            | State::RunningAcknowledged
            | State::StartFailed
            | State::RecoveryRequired => None,
        };
        since.is_some_and(|t| now.saturating_since(t) >= policy.log_keep_ms)
    }
}

/// What to remove.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    /// Logs to remove (of settled records past their keep period), in offer order.
    pub logs: Vec<(OfferId, LogArtifactId)>,
    /// Records to remove, oldest first, each with its revision.
    pub records: Vec<(OfferId, Revision)>,
}

/// The pure retention decision for an inbox of `total_records` records whose settled ones are
/// `settled` (see the module docs).
#[must_use]
pub fn plan(
    total_records: usize,
    settled: &[Settled],
    now: UnixMillis,
    policy: &RetentionPolicy,
) -> Plan {
    let mut logs: Vec<(OfferId, LogArtifactId)> = settled
        .iter()
        .filter(|s| s.log_removable(now, policy))
        .filter_map(|s| {
            s.log_artifact_id
                .clone()
                .map(|log| (s.offer_id.clone(), log))
        })
        .collect();
    logs.sort();
    let mut removable: Vec<&Settled> = settled
        .iter()
        .filter(|s| s.state.is_terminal())
        .filter(|s| s.log_artifact_id.is_none() || s.log_removable(now, policy))
        .collect();
    removable.sort_by(|a, b| (a.settled_at_ms, &a.offer_id).cmp(&(b.settled_at_ms, &b.offer_id)));
    let mut remaining = total_records;
    let mut records = Vec::new();
    for s in removable {
        let expired = policy
            .max_settled_age_ms
            .is_some_and(|age| now.saturating_since(s.settled_at_ms) >= age);
        if expired || remaining > policy.high_water_records {
            records.push((s.offer_id.clone(), s.revision));
            remaining -= 1;
        }
    }
    Plan { logs, records }
}

/// What a sweep removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Logs actually removed (already-absent ones are not counted).
    pub logs_removed: usize,
    /// Records removed.
    pub records_removed: Vec<OfferId>,
}

/// A retention failure; the sweep stops at the first one (fail closed).
#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    /// Reading or removing a record failed.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// Removing a log failed.
    #[error("removing the log of {offer_id}: {source}")]
    Spool {
        /// The record whose log it is.
        offer_id: OfferId,
        /// What failed.
        source: SpoolError,
    },
    /// A listed record vanished during the sweep (only the owner removes records).
    #[error("record {path} vanished during retention")]
    Vanished {
        /// The record.
        path: PathBuf,
    },
}

impl RetentionError {
    /// Whether the caller must stop (an fsync failed: durability unknown).
    #[must_use]
    pub fn is_fatal(&self) -> bool {
        match self {
            Self::Journal(e) => e.is_fatal(),
            Self::Spool { source, .. } => source.is_fatal(),
            Self::Vanished { .. } => false,
        }
    }
}

/// Reads every record (bounded by the journal's capacity scan), plans, and removes: logs first,
/// then records, each record removal re-checked under the owner lock.
///
/// # Errors
/// The first [`RetentionError`]; what was removed before it stays removed.
pub fn sweep<F: FileSystem>(
    journal: &mut Journal<F>,
    now: UnixMillis,
    policy: &RetentionPolicy,
) -> Result<Report, RetentionError> {
    let mut settled = Vec::new();
    let mut total = 0usize;
    let mut after: Option<OfferId> = None;
    // Bounded: the offers directory holds at most `MAX_OFFERS_DIR_ENTRIES`, 64 per page.
    for _ in 0..=crate::journal::MAX_OFFERS_DIR_ENTRIES / 64 + 1 {
        let page = journal.list(after.as_ref(), PageLimit::new(64).unwrap_or_default())?;
        for id in &page.offer_ids {
            let Some(record) = journal.read_record(id)? else {
                return Err(RetentionError::Vanished {
                    path: crate::layout::Paths::new(journal.root()).record(id),
                });
            };
            total += 1;
            settled.extend(Settled::of(&record));
        }
        match page.next_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let plan = plan(total, &settled, now, policy);
    let mut report = Report::default();
    for (offer_id, log_id) in &plan.logs {
        let removed =
            spool::remove_with(journal.fs(), journal.root(), log_id).map_err(|source| {
                RetentionError::Spool {
                    offer_id: offer_id.clone(),
                    source,
                }
            })?;
        report.logs_removed += usize::from(removed);
    }
    for (offer_id, revision) in &plan.records {
        journal.remove_settled_record(offer_id, *revision)?;
        report.records_removed.push(offer_id.clone());
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> UnixMillis {
        UnixMillis::new(v).unwrap()
    }

    fn settled(n: u32, state: State, at: u64, log: bool) -> Settled {
        Settled {
            offer_id: OfferId::new(format!("offer-{n:03}")).unwrap(),
            revision: Revision::new(5).unwrap(),
            state,
            settled_at_ms: ms(at),
            completion_acknowledged_at_ms: (state == State::CompletionAcknowledged)
                .then_some(ms(at)),
            log_artifact_id: log.then(|| LogArtifactId::new(format!("wlog-{n:030x}")).unwrap()),
        }
    }

    const POLICY: RetentionPolicy = RetentionPolicy {
        high_water_records: 3,
        max_settled_age_ms: Some(10_000),
        log_keep_ms: 100,
    };

    #[test]
    fn nothing_is_removed_below_the_high_water_mark_before_the_age() {
        let s = [settled(1, State::CompletionAcknowledged, 1000, true)];
        let p = plan(3, &s, ms(1050), &POLICY);
        assert_eq!(p, Plan::default(), "log keep period not passed");
        let p = plan(3, &s, ms(1100), &POLICY);
        assert_eq!(p.logs.len(), 1, "log keep period passed");
        assert!(p.records.is_empty(), "at the high-water mark, record kept");
    }

    #[test]
    fn above_the_high_water_mark_the_oldest_removable_settled_go_first() {
        let s = [
            settled(1, State::CompletionAcknowledged, 3000, true),
            settled(2, State::StartFailureAcknowledged, 1000, false),
            settled(3, State::CompletionAcknowledged, 2000, true),
            // Its log is still within the keep period: neither log nor record may go.
            settled(4, State::CompletionAcknowledged, 5000, true),
        ];
        let p = plan(6, &s, ms(5050), &POLICY);
        let ids: Vec<&str> = p.records.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["offer-002", "offer-003", "offer-001"]);
        assert_eq!(p.logs.len(), 2);
    }

    #[test]
    fn records_past_the_age_go_even_below_the_mark() {
        let s = [
            settled(1, State::StartFailureAcknowledged, 1000, false),
            settled(2, State::CompletionAcknowledged, 9000, false),
        ];
        let p = plan(2, &s, ms(11_000), &POLICY);
        let ids: Vec<&str> = p.records.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["offer-001"]);
    }

    #[test]
    fn non_terminal_records_are_never_planned() {
        let mut s = settled(1, State::CompletionAcknowledged, 0, true);
        s.state = State::RecoveryRequired;
        let p = plan(100, &[s], ms(1_000_000), &POLICY);
        assert_eq!(p, Plan::default());
    }
}
