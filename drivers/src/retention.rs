//! Bounded retention of settled records, archived records and logs (SPEC §3, "inbox
//! retention"). The decision is the core's pure [`plan`] (`ql_worker_core::retention`, with the
//! rules); this module only gathers the facts it needs and carries the plan out:
//!
//! 1. every inbox record, with whether its attempt's receipt is on disk and whether the pending
//!    claim names it;
//! 2. on a full sweep, the logs on disk with their own metadata (the later modification time of
//!    the log and its truncation fact) and the archived records with the time they were
//!    archived (the archive file's `st_ctime`, which the archiving rename set);
//! 3. removal, logs first, then records (each re-checked by the core's `check_removal` under the
//!    owner lock: settled, and a CAS on its revision), then archived records.
//!
//! A crash between two removals leaves a state the next sweep finishes: a log without its
//! record is kept `log_keep_ms` from its own write time, a record without its log is settled.

use std::path::PathBuf;

use ql_worker_core::ids::{LogArtifactId, OfferId};
use ql_worker_core::listing::PageLimit;
use ql_worker_core::retention;
pub use ql_worker_core::retention::{
    ArchivedFacts, LogFacts, Plan, RecordFacts, RetentionPolicy, plan,
};
use ql_worker_core::time::UnixMillis;

use crate::fsio::{self, Dir, FileSystem, Kind, StorageError};
use crate::journal::{ARCHIVE_DIR, Journal, JournalError};
use crate::layout;
use crate::spool::{self, SpoolError};

/// Most entries read from `logs/` (its shards) or from `archive/`.
const MAX_DIR_ENTRIES: usize = 4096;

/// What a sweep removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Logs actually removed (already-absent ones are not counted).
    pub logs_removed: usize,
    /// Inbox records removed, in the order removed.
    pub records_removed: Vec<OfferId>,
    /// Archived records removed.
    pub archived_removed: Vec<OfferId>,
}

/// A retention failure; the sweep stops at the first one (fail closed).
#[derive(Debug, thiserror::Error)]
pub enum RetentionError {
    /// Reading or removing a record failed.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// Scanning or removing in `logs/` or `archive/` failed.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// Removing a log failed.
    #[error("removing log {log_artifact_id}: {source}")]
    Spool {
        /// The log.
        log_artifact_id: LogArtifactId,
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
            Self::Storage(e) => e.is_fatal(),
            Self::Spool { source, .. } => source.is_fatal(),
            Self::Vanished { .. } => false,
        }
    }
}

/// How much a sweep looks at.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scope {
    /// The inbox records only (enough to bring the inbox back to the high-water mark).
    Records,
    /// Also the logs on disk and the archive (age and keep-time removals).
    Full,
}

/// Gathers the facts of `scope`, plans with the core's [`plan`] and removes: logs first, then
/// records, then archived records.
///
/// # Errors
/// The first [`RetentionError`]; what was removed before it stays removed.
pub fn sweep<F: FileSystem>(
    journal: &mut Journal<F>,
    now: UnixMillis,
    policy: &RetentionPolicy,
    scope: Scope,
) -> Result<Report, RetentionError> {
    let records = record_facts(journal)?;
    let (logs, archived) = match scope {
        Scope::Records => (None, None),
        Scope::Full => {
            let root = fsio::open_root(journal.fs(), journal.root(), false)?;
            (
                Some(log_facts(journal.fs(), &root)?),
                Some(archived_facts(journal.fs(), &root)?),
            )
        }
    };
    let plan = plan(&records, logs.as_deref(), archived.as_deref(), now, policy);
    let mut report = Report::default();
    for log_id in &plan.logs {
        let removed =
            spool::remove_with(journal.fs(), journal.root(), log_id).map_err(|source| {
                RetentionError::Spool {
                    log_artifact_id: log_id.clone(),
                    source,
                }
            })?;
        report.logs_removed += usize::from(removed);
    }
    journal.remove_settled_records(&plan.records, &mut report.records_removed)?;
    if !plan.archived.is_empty() {
        let root = fsio::open_root(journal.fs(), journal.root(), false)?;
        if let Some(archive) = fsio::open_subdir(journal.fs(), &root, ARCHIVE_DIR, false)? {
            for offer_id in &plan.archived {
                let name = layout::record_file_name(offer_id);
                if fsio::remove(journal.fs(), &archive, &name)? {
                    report.archived_removed.push(offer_id.clone());
                }
            }
        }
    }
    Ok(report)
}

/// Every inbox record (bounded by the journal's directory scan), with its receipt and claim.
fn record_facts<F: FileSystem>(journal: &Journal<F>) -> Result<Vec<RecordFacts>, RetentionError> {
    let claimed = journal.read_claim()?.map(|claim| claim.offer_id);
    let mut facts = Vec::new();
    let mut after: Option<OfferId> = None;
    // Bounded: the offers directory holds at most `MAX_OFFERS_DIR_ENTRIES`, 64 per page.
    for _ in 0..=crate::journal::MAX_OFFERS_DIR_ENTRIES / 64 + 1 {
        let page = journal.list(after.as_ref(), PageLimit::new(64).unwrap_or_default())?;
        for id in &page.offer_ids {
            let Some(record) = journal.read_record(id)? else {
                return Err(RetentionError::Vanished {
                    path: layout::Paths::new(journal.root()).record(id),
                });
            };
            // Only the receipt of a record the plan may remove matters (the core says which);
            // an unreadable receipt counts as present.
            let receipt_present = retention::may_remove_in(record.state)
                && !matches!(
                    crate::receipts::read_with(
                        journal.fs(),
                        journal.root(),
                        &record.offer.candidate.attempt_id
                    ),
                    Ok(None)
                );
            let claimed = claimed.as_ref() == Some(id);
            facts.push(RecordFacts::of(&record, receipt_present, claimed));
        }
        match page.next_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    Ok(facts)
}

/// The logs in `logs/<shard>/`: `<logId>.log` files (regular, in their own shard), each with
/// the later modification time of the log and its truncation fact. Anything else is left alone
/// (temps are the spool's; nothing foreign is ever removed).
fn log_facts(fs: &dyn FileSystem, root: &Dir) -> Result<Vec<LogFacts>, RetentionError> {
    let mut out = Vec::new();
    let Some(logs) = fsio::open_subdir(fs, root, layout::LOGS_DIR, false)? else {
        return Ok(out);
    };
    for shard in fsio::scan_dir(fs, &logs, MAX_DIR_ENTRIES)? {
        if shard.kind != Kind::Directory {
            continue;
        }
        let Some(dir) = fsio::open_subdir(fs, &logs, &shard.name, false)? else {
            continue;
        };
        for entry in fsio::scan_dir(fs, &dir, spool::MAX_SHARD_ENTRIES)? {
            let id = entry
                .name
                .strip_suffix(layout::LOG_SUFFIX)
                .and_then(|id| LogArtifactId::new(id).ok())
                .filter(|id| layout::log_shard(id) == shard.name);
            let (Kind::Regular, Some(id)) = (entry.kind, id) else {
                continue;
            };
            let Some(log) = modified(fs, &dir, &entry.name)? else {
                continue;
            };
            let fact = modified(fs, &dir, &layout::fact_file_name(&id))?;
            out.push(LogFacts {
                log_artifact_id: id,
                written_at_ms: log.max(fact.unwrap_or(UnixMillis::ZERO)),
            });
        }
    }
    Ok(out)
}

/// The archived records (`archive/<offerId>.rec`, regular), each with its `st_ctime`: the
/// archiving rename set it, and nothing changes an archived record afterwards.
fn archived_facts(fs: &dyn FileSystem, root: &Dir) -> Result<Vec<ArchivedFacts>, RetentionError> {
    let mut out = Vec::new();
    let Some(archive) = fsio::open_subdir(fs, root, ARCHIVE_DIR, false)? else {
        return Ok(out);
    };
    for entry in fsio::scan_dir(fs, &archive, MAX_DIR_ENTRIES)? {
        let (Kind::Regular, Some(offer_id)) =
            (entry.kind, layout::parse_record_file_name(&entry.name))
        else {
            continue;
        };
        let meta = match fs.stat_nofollow(archive.fd(), &entry.name) {
            Ok(meta) => meta,
            Err(rustix::io::Errno::NOENT) => continue,
            Err(errno) => {
                return Err(StorageError::Io {
                    op: "fstatat",
                    path: archive.child(&entry.name),
                    errno,
                }
                .into());
            }
        };
        out.push(ArchivedFacts {
            offer_id,
            archived_at_ms: UnixMillis::new(meta.ctime_ms).unwrap_or(UnixMillis::ZERO),
        });
    }
    Ok(out)
}

/// The modification time of a regular `<dir>/<name>`, `None` when it is absent.
fn modified(
    fs: &dyn FileSystem,
    dir: &Dir,
    name: &str,
) -> Result<Option<UnixMillis>, RetentionError> {
    match fs.stat_nofollow(dir.fd(), name) {
        Ok(meta) if meta.kind == Kind::Regular => Ok(Some(
            UnixMillis::new(meta.mtime_ms).unwrap_or(UnixMillis::ZERO),
        )),
        Ok(_) | Err(rustix::io::Errno::NOENT) => Ok(None),
        Err(errno) => Err(StorageError::Io {
            op: "fstatat",
            path: dir.child(name),
            errno,
        }
        .into()),
    }
}
