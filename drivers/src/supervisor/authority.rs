//! The supervisor's only door to the file authority (`journal`, `spool`, `receipts`): the spawn
//! barrier's re-read, the verified capture open, and the two publications. Every durable write
//! goes through the file authority's one recipe (temp + fsync + link no-replace + dir fsync);
//! nothing here touches a file by itself.

use std::path::Path;

use ql_worker_core::ids::{LogArtifactId, OfferId};
use ql_worker_core::receipt::Receipt;
use ql_worker_core::record::InboxRecord;
use ql_worker_core::truncation::TruncationFact;

use crate::journal::{self, JournalError};
use crate::receipts::{self, ReceiptStoreError};
use crate::spool::{self, CaptureFile, SpoolError};

/// The spawn barrier's re-read: full checks, no lock (the Worker holds it).
pub(crate) fn read_record(root: &Path, offer_id: &OfferId) -> Result<InboxRecord, JournalError> {
    journal::read_record_unlocked(root, offer_id)
}

/// Verified append-open of the allocated log (regular, owned, 0600, one link, same inode as the
/// path, size ≤ quota), with the remaining quota.
pub(crate) fn open_capture(
    root: &Path,
    log_id: &LogArtifactId,
    quota_bytes: u64,
) -> Result<CaptureFile, SpoolError> {
    spool::open_for_capture(root, log_id, quota_bytes)
}

/// Locks the capture file for the supervisor's life (the Worker's sign that it lives).
pub(crate) fn hold_capture(capture: &CaptureFile) -> Result<std::fs::File, SpoolError> {
    spool::hold_for_capture(capture)
}

/// Publishes the immutable truncation fact next to the log.
pub(crate) fn publish_fact(root: &Path, fact: &TruncationFact) -> Result<(), SpoolError> {
    spool::publish_truncation_fact(root, fact)
}

/// Publishes the user process's durable handle next to where its receipt will be, before the
/// user command runs (issue 16).
pub(crate) fn publish_handle(
    root: &Path,
    attempt_id: &ql_worker_core::ids::AttemptId,
    handle: &str,
) -> Result<(), ReceiptStoreError> {
    receipts::publish_handle(root, attempt_id, handle).map(|_| ())
}

/// Removes a published handle whose user command never ran (best effort: the Worker removes it
/// with the receipt otherwise).
pub(crate) fn withdraw_handle(root: &Path, attempt_id: &ql_worker_core::ids::AttemptId) {
    let _ = receipts::remove_handle(root, attempt_id);
}

/// Publishes the receipt; the encoded bytes are wiped by the store.
pub(crate) fn publish_receipt(root: &Path, receipt: &Receipt) -> Result<(), ReceiptStoreError> {
    receipts::publish(root, receipt).map(|_| ())
}
