//! The completion receipt store (reference §5.5): `<root>/receipts/<attemptId[0..2]>/
//! <attemptId>.rcpt`, quarantine at `<root>/receipts/.quarantine/<aa>/<attemptId>.rcpt`.
//!
//! The supervisor publishes (it does not own the root: publication is create-only and never
//! replaces, so it needs no lock); the completion coordinator reads, authenticates (core), and
//! removes the receipt only after `completion_acknowledged` is durable. A receipt that fails its
//! checks is quarantined, never deleted, so the evidence survives.
//!
//! The receipt holds the completion capability: its envelope is built in a wiped buffer
//! ([`zeroize::Zeroizing`]) that is cleared right after the write, and read buffers are wiped
//! too. The capability itself reaches the disk only in this file, only until the completion is
//! acknowledged.

use std::path::{Path, PathBuf};

use ql_worker_core::envelope;
use ql_worker_core::ids::AttemptId;
use ql_worker_core::receipt::{MAX_RECEIPT_BYTES, Receipt};
use rustix::io::Errno;

use crate::fsio::{self, Dir, FileSystem, RealFs, Rule, StorageError};
use crate::layout;

/// Most entries read from a receipt shard when sweeping temps.
pub const MAX_SHARD_ENTRIES: usize = 4096;

/// A receipt store failure.
#[derive(Debug, thiserror::Error)]
pub enum ReceiptStoreError {
    /// Unsafe storage, a corrupt receipt, a failed call, or a fatal fsync failure.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A receipt for this attempt already exists; it was left untouched.
    #[error("{path} already exists")]
    AlreadyExists {
        /// The receipt.
        path: PathBuf,
    },
    /// The receipt's content names another attempt than its path.
    #[error("receipt {path} names another attempt in its content")]
    AttemptMismatch {
        /// The receipt.
        path: PathBuf,
    },
    /// The quarantine already holds a receipt for this attempt; nothing was moved.
    #[error("quarantine slot {path} is already occupied")]
    QuarantineOccupied {
        /// The quarantine slot.
        path: PathBuf,
    },
    /// The root does not exist.
    #[error("{path} does not exist")]
    NotFound {
        /// The missing path.
        path: PathBuf,
    },
}

impl ReceiptStoreError {
    /// Whether the caller must stop (an fsync failed: durability unknown).
    #[must_use]
    pub fn is_fatal(&self) -> bool {
        matches!(self, Self::Storage(e) if e.is_fatal())
    }

    /// The unsafe-storage rule, if that is what this is.
    #[must_use]
    pub fn unsafe_rule(&self) -> Option<Rule> {
        match self {
            Self::Storage(e) => e.unsafe_rule(),
            Self::AlreadyExists { .. }
            | Self::AttemptMismatch { .. }
            | Self::QuarantineOccupied { .. }
            | Self::NotFound { .. } => None,
        }
    }
}

/// Where a receipt was published.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    /// `<root>/receipts/<aa>/<attemptId>.rcpt`
    pub path: PathBuf,
}

fn open_root(fs: &dyn FileSystem, root: &Path) -> Result<Dir, ReceiptStoreError> {
    fsio::open_root(fs, root, false).map_err(|e| match e {
        StorageError::Io { errno, path, .. } if errno == Errno::NOENT => {
            ReceiptStoreError::NotFound { path }
        }
        other => ReceiptStoreError::Storage(other),
    })
}

/// `<root>/receipts/<aa>`, created when `create`; `None` when missing and not created.
fn open_shard(
    fs: &dyn FileSystem,
    root: &Path,
    attempt_id: &AttemptId,
    create: bool,
) -> Result<Option<Dir>, ReceiptStoreError> {
    let root_dir = open_root(fs, root)?;
    let Some(receipts) = fsio::open_subdir(fs, &root_dir, layout::RECEIPTS_DIR, create)? else {
        return Ok(None);
    };
    Ok(fsio::open_subdir(
        fs,
        &receipts,
        layout::receipt_shard(attempt_id),
        create,
    )?)
}

/// Publishes the receipt (temp 0600 + fsync + link no-replace + dir fsync). The envelope bytes
/// are wiped after writing.
///
/// # Errors
/// [`ReceiptStoreError::AlreadyExists`] (left untouched), unsafe storage, or a failed call;
/// [`ReceiptStoreError::is_fatal`] for an fsync failure.
pub fn publish(root: &Path, receipt: &Receipt) -> Result<Published, ReceiptStoreError> {
    publish_with(&RealFs, root, receipt)
}

/// [`publish`] through a given seam.
///
/// # Errors
/// See [`publish`].
pub fn publish_with(
    fs: &dyn FileSystem,
    root: &Path,
    receipt: &Receipt,
) -> Result<Published, ReceiptStoreError> {
    let path = layout::Paths::new(root).receipt(&receipt.attempt_id);
    let shard = open_shard(fs, root, &receipt.attempt_id, true)?
        .ok_or_else(|| ReceiptStoreError::NotFound { path: path.clone() })?;
    let name = layout::receipt_file_name(&receipt.attempt_id);
    // `Zeroizing`: the buffer holding the capability is wiped when it drops, right after the
    // write, on every path.
    let bytes = envelope::encode(receipt).map_err(|source| StorageError::Unencodable {
        path: path.clone(),
        source,
    })?;
    fsio::publish_new(fs, &shard, &name, &bytes).map_err(|e| match e {
        StorageError::AlreadyExists { path } => ReceiptStoreError::AlreadyExists { path },
        other => ReceiptStoreError::Storage(other),
    })?;
    drop(bytes);
    Ok(Published { path })
}

/// Reads the receipt of `attempt_id`: `O_NOFOLLOW`, regular, owned, one link, no group/other
/// bits, ≤ 4 KiB, envelope checksum and shape, and the attempt id in the content equal to the
/// one in the path. `None` when there is none.
///
/// # Errors
/// [`ReceiptStoreError::AttemptMismatch`], unsafe storage, a corrupt receipt, or a failed call.
pub fn read(root: &Path, attempt_id: &AttemptId) -> Result<Option<Receipt>, ReceiptStoreError> {
    read_with(&RealFs, root, attempt_id)
}

/// [`read`] through a given seam.
///
/// # Errors
/// See [`read`].
pub fn read_with(
    fs: &dyn FileSystem,
    root: &Path,
    attempt_id: &AttemptId,
) -> Result<Option<Receipt>, ReceiptStoreError> {
    let Some(shard) = open_shard(fs, root, attempt_id, false)? else {
        return Ok(None);
    };
    let name = layout::receipt_file_name(attempt_id);
    let path = shard.child(&name);
    let Some(bytes) = fsio::read_checked(fs, &shard, &name, MAX_RECEIPT_BYTES)? else {
        return Ok(None);
    };
    let receipt: Receipt = envelope::decode(&bytes).map_err(|source| StorageError::Corrupt {
        path: path.clone(),
        source,
    })?;
    if receipt.attempt_id != *attempt_id {
        return Err(ReceiptStoreError::AttemptMismatch { path });
    }
    Ok(Some(receipt))
}

/// Removes the receipt of `attempt_id` and stale temps of it, then fsyncs the shard. Call only
/// after `completion_acknowledged` is durable. Returns whether it existed.
///
/// # Errors
/// Unsafe storage (a symlinked shard is never followed), a failed call, or a fatal fsync error.
pub fn remove(root: &Path, attempt_id: &AttemptId) -> Result<bool, ReceiptStoreError> {
    remove_with(&RealFs, root, attempt_id)
}

/// [`remove`] through a given seam.
///
/// # Errors
/// See [`remove`].
pub fn remove_with(
    fs: &dyn FileSystem,
    root: &Path,
    attempt_id: &AttemptId,
) -> Result<bool, ReceiptStoreError> {
    let Some(shard) = open_shard(fs, root, attempt_id, false)? else {
        return Ok(false);
    };
    let name = layout::receipt_file_name(attempt_id);
    let handle = layout::handle_file_name(attempt_id);
    let removed = fsio::remove(fs, &shard, &name)?;
    // The published handle goes with the receipt (issue 16): nothing of the attempt is left.
    fsio::remove(fs, &shard, &handle)?;
    let entries = fsio::scan_dir(fs, &shard, MAX_SHARD_ENTRIES)?;
    fsio::sweep_temps(fs, &shard, &entries, |target| {
        target == name || target == handle
    })?;
    Ok(removed)
}

/// Publishes the durable handle of the attempt's user process (the supervisor, before the user
/// command runs; issue 16): `<root>/receipts/<aa>/<attemptId>.handle`, temp 0600 + rename
/// no-replace, **without fsync**, so the Worker can stop the Run by identity when a crash of
/// the Worker fell between the spawn and `started`. Within the boot the page cache shows the
/// renamed file to a restarted Worker; after a reboot the handle names a process of another
/// boot (void), and a lost, empty or short file reads as no handle (with a warning if garbled) (docs/supervisor.md). The
/// handle names the process only (boot id, pid, process group, start time, attempt id): no
/// secret. Creating the shard directory itself (once per shard) is fsynced, as for a receipt.
///
/// # Errors
/// [`ReceiptStoreError::AlreadyExists`] (left untouched), unsafe storage, or a failed call
/// (an fsync failure only when the shard had to be created).
pub fn publish_handle(
    root: &Path,
    attempt_id: &AttemptId,
    handle: &str,
) -> Result<PathBuf, ReceiptStoreError> {
    publish_handle_with(&RealFs, root, attempt_id, handle)
}

/// [`publish_handle`] through a given seam.
///
/// # Errors
/// See [`publish_handle`].
pub fn publish_handle_with(
    fs: &dyn FileSystem,
    root: &Path,
    attempt_id: &AttemptId,
    handle: &str,
) -> Result<PathBuf, ReceiptStoreError> {
    let path = layout::Paths::new(root).published_handle(attempt_id);
    let shard = open_shard(fs, root, attempt_id, true)?
        .ok_or_else(|| ReceiptStoreError::NotFound { path: path.clone() })?;
    let name = layout::handle_file_name(attempt_id);
    fsio::publish_new_unsynced(fs, &shard, &name, handle.as_bytes()).map_err(|e| match e {
        StorageError::AlreadyExists { path } => ReceiptStoreError::AlreadyExists { path },
        other => ReceiptStoreError::Storage(other),
    })?;
    Ok(path)
}

/// Removes the attempt's published handle only (a supervisor whose user command never ran),
/// then fsyncs the shard. Returns whether it existed.
///
/// # Errors
/// Unsafe storage, a failed call, or a fatal fsync error.
pub fn remove_handle(root: &Path, attempt_id: &AttemptId) -> Result<bool, ReceiptStoreError> {
    remove_handle_with(&RealFs, root, attempt_id)
}

/// [`remove_handle`] through a given seam.
///
/// # Errors
/// See [`remove_handle`].
pub fn remove_handle_with(
    fs: &dyn FileSystem,
    root: &Path,
    attempt_id: &AttemptId,
) -> Result<bool, ReceiptStoreError> {
    let Some(shard) = open_shard(fs, root, attempt_id, false)? else {
        return Ok(false);
    };
    Ok(fsio::remove(
        fs,
        &shard,
        &layout::handle_file_name(attempt_id),
    )?)
}

/// The text of the attempt's published handle (the same checks as a receipt read: no
/// symlink, regular, owned, one link, no group/other bits, ≤ 512 bytes); `None` when there is
/// none. Validation is the caller's.
///
/// # Errors
/// Unsafe storage, or a failed call.
pub fn read_handle(
    root: &Path,
    attempt_id: &AttemptId,
) -> Result<Option<Vec<u8>>, ReceiptStoreError> {
    let fs = &RealFs;
    let Some(shard) = open_shard(fs, root, attempt_id, false)? else {
        return Ok(None);
    };
    let name = layout::handle_file_name(attempt_id);
    let bytes = fsio::read_checked(
        fs,
        &shard,
        &name,
        crate::supervisor::identity::MAX_HANDLE_BYTES,
    )?;
    Ok(bytes.map(|b| b.to_vec()))
}

/// Moves the receipt of `attempt_id` (whatever the entry is: a symlink moves as a symlink) to
/// `<root>/receipts/.quarantine/<aa>/<attemptId>.rcpt` without replacing anything there, then
/// fsyncs both directories. Returns whether there was something to move.
///
/// # Errors
/// [`ReceiptStoreError::QuarantineOccupied`] (nothing moved), unsafe storage, a failed call, or
/// a fatal fsync error.
pub fn quarantine(root: &Path, attempt_id: &AttemptId) -> Result<bool, ReceiptStoreError> {
    quarantine_with(&RealFs, root, attempt_id)
}

/// [`quarantine`] through a given seam.
///
/// # Errors
/// See [`quarantine`].
pub fn quarantine_with(
    fs: &dyn FileSystem,
    root: &Path,
    attempt_id: &AttemptId,
) -> Result<bool, ReceiptStoreError> {
    let root_dir = open_root(fs, root)?;
    let Some(receipts) = fsio::open_subdir(fs, &root_dir, layout::RECEIPTS_DIR, false)? else {
        return Ok(false);
    };
    let shard_name = layout::receipt_shard(attempt_id);
    let Some(shard) = fsio::open_subdir(fs, &receipts, shard_name, false)? else {
        return Ok(false);
    };
    let name = layout::receipt_file_name(attempt_id);
    match fs.stat_nofollow(shard.fd(), &name) {
        Ok(_) => {}
        Err(Errno::NOENT) => return Ok(false),
        Err(errno) => {
            return Err(StorageError::Io {
                op: "fstatat",
                path: shard.child(&name),
                errno,
            }
            .into());
        }
    }
    let quarantine =
        fsio::open_subdir(fs, &receipts, layout::QUARANTINE_DIR, true)?.ok_or_else(|| {
            ReceiptStoreError::NotFound {
                path: receipts.child(layout::QUARANTINE_DIR),
            }
        })?;
    let slot_dir = fsio::open_subdir(fs, &quarantine, shard_name, true)?.ok_or_else(|| {
        ReceiptStoreError::NotFound {
            path: quarantine.child(shard_name),
        }
    })?;
    let slot = slot_dir.child(&name);
    let moved = match fs.rename_noreplace(shard.fd(), &name, slot_dir.fd(), &name) {
        Ok(()) => Ok(()),
        Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => fs
            .link(shard.fd(), &name, slot_dir.fd(), &name)
            .and_then(|()| fs.unlink(shard.fd(), &name)),
        Err(e) => Err(e),
    };
    match moved {
        Ok(()) => {}
        Err(Errno::EXIST) => return Err(ReceiptStoreError::QuarantineOccupied { path: slot }),
        Err(errno) => {
            return Err(StorageError::Io {
                op: "renameat2",
                path: slot,
                errno,
            }
            .into());
        }
    }
    fsio::sync_dir(fs, &slot_dir)?;
    fsio::sync_dir(fs, &shard)?;
    Ok(true)
}
