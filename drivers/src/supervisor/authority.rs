//! The supervisor's only door to the file authority: barrier re-read, verified capture open,
//! truncation fact and receipt publication.
//!
//! INTERIM: the file-authority modules (`journal`, `spool`, `receipts`, branch `fa`) have not
//! landed yet. Until they do, these four functions use the same layout with plain,
//! non-durable std calls so the process mechanics can be exercised. They are replaced by calls to
//! `journal::read_record_unlocked`, `spool::open_for_capture`, `spool::publish_truncation_fact`
//! and `receipts::publish` as soon as those exist; no durable-publication recipe lives here.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use ql_worker_core::envelope;
use ql_worker_core::ids::{AttemptId, LogArtifactId, OfferId};
use ql_worker_core::receipt::Receipt;
use ql_worker_core::record::InboxRecord;
use ql_worker_core::truncation::TruncationFact;

const O_NOFOLLOW: i32 = 0o400_000;

/// `<root>/offers/<offerId>.rec`
pub(crate) fn record_path(root: &Path, offer_id: &OfferId) -> PathBuf {
    root.join("offers").join(format!("{offer_id}.rec"))
}

/// `<root>/logs/<id[5..7]>/<logId>.log`
pub(crate) fn log_path(root: &Path, log_id: &LogArtifactId) -> PathBuf {
    let id = log_id.as_str();
    root.join("logs").join(&id[5..7]).join(format!("{id}.log"))
}

/// `<root>/logs/<id[5..7]>/.<logId>.fact`
pub(crate) fn fact_path(root: &Path, log_id: &LogArtifactId) -> PathBuf {
    let id = log_id.as_str();
    root.join("logs")
        .join(&id[5..7])
        .join(format!(".{id}.fact"))
}

/// `<root>/receipts/<aa>/<attemptId>.rcpt`
pub(crate) fn receipt_path(root: &Path, attempt_id: &AttemptId) -> PathBuf {
    let id = attempt_id.as_str();
    let shard: String = id.chars().take(2).collect();
    root.join("receipts").join(shard).join(format!("{id}.rcpt"))
}

pub(crate) fn read_record(root: &Path, offer_id: &OfferId) -> io::Result<InboxRecord> {
    let bytes = fs::read(record_path(root, offer_id))?;
    envelope::decode::<InboxRecord>(&bytes)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "record envelope invalid"))
}

fn private_dir(path: &Path) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
}

pub(crate) fn open_capture(
    root: &Path,
    log_id: &LogArtifactId,
    quota_bytes: u64,
) -> io::Result<(File, u64)> {
    let path = log_path(root, log_id);
    if let Some(parent) = path.parent() {
        private_dir(parent)?;
    }
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(O_NOFOLLOW)
        .open(&path)?;
    let meta = file.metadata()?;
    if !meta.is_file() || meta.len() > quota_bytes {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "log unusable"));
    }
    Ok((file, quota_bytes - meta.len()))
}

fn create_new(path: &Path, bytes: &[u8]) -> io::Result<()> {
    if let Some(parent) = path.parent() {
        private_dir(parent)?;
    }
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(O_NOFOLLOW)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

pub(crate) fn publish_fact(root: &Path, fact: &TruncationFact) -> io::Result<()> {
    let bytes = envelope::encode(fact)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "fact unencodable"))?;
    create_new(&fact_path(root, &fact.log_artifact_id), &bytes)
}

pub(crate) fn publish_receipt(root: &Path, receipt: &Receipt) -> io::Result<()> {
    let bytes = envelope::encode(receipt)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "receipt unencodable"))?;
    create_new(&receipt_path(root, &receipt.attempt_id), &bytes)
}
