//! The supervisor's only door to the file authority: barrier re-read, verified capture open,
//! truncation fact and receipt publication. Every durable write goes through the file
//! authority's one publication recipe (`fsio::publish_new`: temp + fsync + link no-replace + dir
//! fsync); nothing here writes a file by itself.
//!
//! INTERIM: `spool::open_for_capture`, `spool::publish_truncation_fact` and `receipts::publish`
//! (branch `fa`) have not landed yet; until they do, the last three functions compose the same
//! steps from `fsio` and `layout`. Each is a one-line swap once they exist.

use std::fs::File;
use std::path::Path;

use ql_worker_core::envelope;
use ql_worker_core::ids::{LogArtifactId, OfferId};
use ql_worker_core::receipt::Receipt;
use ql_worker_core::record::InboxRecord;
use ql_worker_core::truncation::TruncationFact;
use rustix::fs::OFlags;

use crate::fsio::{self, Dir, FileRules, FileSystem as _, RealFs, StorageError};
use crate::journal::{self, JournalError};
use crate::layout;

/// Why a file-authority step failed (kept for diagnostics; the supervisor maps any failure to a
/// fixed reason).
#[derive(Debug, thiserror::Error)]
pub(crate) enum AuthorityError {
    /// Journal read.
    #[error(transparent)]
    Journal(#[from] JournalError),
    /// Storage step.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The log holds more than the quota already, or an envelope could not be encoded.
    #[error("{0}")]
    Refused(&'static str),
}

/// The spawn barrier's re-read: full checks, no lock.
pub(crate) fn read_record(root: &Path, offer_id: &OfferId) -> Result<InboxRecord, AuthorityError> {
    Ok(journal::read_record_unlocked(root, offer_id)?)
}

fn log_shard_dir(root: &Path, log_id: &LogArtifactId) -> Result<Dir, AuthorityError> {
    let root = fsio::open_root(&RealFs, root, false)?;
    let logs = fsio::open_subdir(&RealFs, &root, layout::LOGS_DIR, true)?
        .ok_or(AuthorityError::Refused("logs directory missing"))?;
    fsio::open_subdir(&RealFs, &logs, layout::log_shard(log_id), true)?
        .ok_or(AuthorityError::Refused("log shard missing"))
}

/// Opens the log for appending after verifying it (regular, owned, 0600, one link, same inode
/// as the path, size ≤ quota); returns the file and the remaining quota.
pub(crate) fn open_capture(
    root: &Path,
    log_id: &LogArtifactId,
    quota_bytes: u64,
) -> Result<(File, u64), AuthorityError> {
    let shard = log_shard_dir(root, log_id)?;
    let name = layout::log_file_name(log_id);
    let create = OFlags::WRONLY | OFlags::CREATE | OFlags::APPEND | OFlags::NOFOLLOW;
    let created = RealFs
        .openat(
            shard.fd(),
            &name,
            create | OFlags::CLOEXEC,
            layout::FILE_MODE,
        )
        .map_err(|errno| StorageError::Io {
            op: "openat",
            path: shard.child(&name),
            errno,
        })?;
    drop(created);
    let rules = FileRules {
        max_size: quota_bytes,
        exact_mode: Some(layout::FILE_MODE),
        same_inode: true,
    };
    let (fd, meta) = fsio::open_verified(
        &RealFs,
        &shard,
        &name,
        OFlags::WRONLY | OFlags::APPEND,
        rules,
    )?
    .ok_or(AuthorityError::Refused("log vanished"))?;
    Ok((File::from(fd), quota_bytes - meta.size))
}

/// Publishes the immutable truncation fact (core envelope) next to the log.
pub(crate) fn publish_fact(root: &Path, fact: &TruncationFact) -> Result<(), AuthorityError> {
    let bytes = envelope::encode(fact).map_err(|_| AuthorityError::Refused("fact unencodable"))?;
    let shard = log_shard_dir(root, &fact.log_artifact_id)?;
    fsio::publish_new(
        &RealFs,
        &shard,
        &layout::fact_file_name(&fact.log_artifact_id),
        &bytes,
    )?;
    Ok(())
}

/// Publishes the receipt (core envelope); the encoded bytes are wiped on drop.
pub(crate) fn publish_receipt(root: &Path, receipt: &Receipt) -> Result<(), AuthorityError> {
    let bytes =
        envelope::encode(receipt).map_err(|_| AuthorityError::Refused("receipt unencodable"))?;
    let root = fsio::open_root(&RealFs, root, false)?;
    let receipts = fsio::open_subdir(&RealFs, &root, layout::RECEIPTS_DIR, true)?
        .ok_or(AuthorityError::Refused("receipts directory missing"))?;
    let shard = fsio::open_subdir(
        &RealFs,
        &receipts,
        layout::receipt_shard(&receipt.attempt_id),
        true,
    )?
    .ok_or(AuthorityError::Refused("receipt shard missing"))?;
    fsio::publish_new(
        &RealFs,
        &shard,
        &layout::receipt_file_name(&receipt.attempt_id),
        &bytes,
    )?;
    Ok(())
}
