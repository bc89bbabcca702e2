//! The log spool (reference §5.4): one capped file per attempt at
//! `<root>/logs/<id[5..7]>/<logArtifactId>.log`, and its immutable truncation fact at
//! `<root>/logs/<shard>/.<logArtifactId>.fact`.
//!
//! * [`allocate`] (Worker, before spawning): capacity admission with `statvfs` **before creating
//!   anything**, then the shard (0700) and an empty file (0600). Re-allocating an existing file
//!   verifies it and never truncates (a replayed offer keeps its accepted prefix).
//! * [`open_for_capture`] (supervisor): verified `O_WRONLY|O_APPEND|O_NOFOLLOW|O_CLOEXEC` open —
//!   regular, owned, one link, mode exactly 0600, path and fd the same inode, size ≤ quota.
//! * [`publish_truncation_fact`] (supervisor, after capture): temp + fsync + link no-replace +
//!   dir fsync; an existing fact is [`SpoolError::AlreadyExists`] (facts are immutable).
//! * [`open_reader`] (completion coordinator): the same verified open for reading, the fact
//!   authenticated against the log id and the policy quota (missing ⇒ truncation unknown), and a
//!   [`LogReader`] that streams ≤ 64 KiB per read and hashes as it goes.
//! * [`remove`] (retention only): the log, its fact and stale temps of the fact.
//! * [`hold_for_capture`] (supervisor, before spawning) and [`capture_liveness`] (Worker): the
//!   supervisor holds `flock(LOCK_EX)` on its open log from before the spawn until it exits,
//!   after its receipt is published; the kernel releases it when the supervisor dies, however
//!   it dies. A free lock on a Run's log means no supervisor of that Run lives (issue 16).
//!
//! The log id comes from the core (it is derived from the offer authority); the spool only
//! turns it into a path.

use std::io;
use std::os::fd::{AsFd as _, OwnedFd};
use std::path::{Path, PathBuf};

use ql_worker_core::envelope;
use ql_worker_core::ids::{LogArtifactId, Sha256Digest};
use ql_worker_core::truncation::{
    MAX_FACT_BYTES, MAX_LOG_QUOTA_BYTES, MIN_LOG_QUOTA_BYTES, TruncationFact,
};
use rustix::fs::OFlags;
use rustix::io::Errno;
use sha2::Digest as _;

use crate::fsio::{self, Dir, FileRules, FileSystem, RealFs, Rule, StorageError};
use crate::layout;

/// Largest chunk one [`LogReader`] read returns (`min(maximumWriteChunkBytes, 64 KiB)`).
pub const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Largest write chunk any policy allows (1 MiB).
pub const MAX_WRITE_CHUNK_BYTES: u64 = 1024 * 1024;
/// Largest free-space reserve any policy allows (1 TiB).
pub const MAX_RESERVE_BYTES: u64 = 1024 * 1024 * 1024 * 1024;
/// Most entries read from a log shard when sweeping temps.
pub const MAX_SHARD_ENTRIES: usize = 4096;

const MIB: u64 = 1024 * 1024;

/// Spool capacity policy (reference §5.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SpoolPolicy {
    /// Per-attempt quota; also the truncation fact's `maximumBytes`.
    pub maximum_attempt_bytes: u64,
    /// Free space that must remain after a full attempt.
    pub minimum_free_bytes: u64,
    /// Largest single write the capture accepts.
    pub maximum_write_chunk_bytes: u64,
}

impl SpoolPolicy {
    /// Edge hosts: 4 MiB per attempt, 32 MiB reserve, 1 MiB chunks.
    pub const EDGE: Self = Self {
        maximum_attempt_bytes: 4 * MIB,
        minimum_free_bytes: 32 * MIB,
        maximum_write_chunk_bytes: MIB,
    };
    /// Nodes: 64 MiB per attempt, 256 MiB reserve, 1 MiB chunks.
    pub const NODE: Self = Self {
        maximum_attempt_bytes: 64 * MIB,
        minimum_free_bytes: 256 * MIB,
        maximum_write_chunk_bytes: MIB,
    };

    /// A custom policy: attempt 64 KiB..=1 GiB, reserve ≤ 1 TiB, chunk 1..=1 MiB.
    ///
    /// # Errors
    /// [`SpoolError::InvalidPolicy`] naming the bound.
    pub fn custom(
        maximum_attempt_bytes: u64,
        minimum_free_bytes: u64,
        maximum_write_chunk_bytes: u64,
    ) -> Result<Self, SpoolError> {
        if !(MIN_LOG_QUOTA_BYTES..=MAX_LOG_QUOTA_BYTES).contains(&maximum_attempt_bytes) {
            return Err(SpoolError::InvalidPolicy {
                rule: "maximumAttemptBytes must be within 64 KiB..=1 GiB",
            });
        }
        if minimum_free_bytes > MAX_RESERVE_BYTES {
            return Err(SpoolError::InvalidPolicy {
                rule: "minimumFreeBytes must be at most 1 TiB",
            });
        }
        if !(1..=MAX_WRITE_CHUNK_BYTES).contains(&maximum_write_chunk_bytes) {
            return Err(SpoolError::InvalidPolicy {
                rule: "maximumWriteChunkBytes must be within 1..=1 MiB",
            });
        }
        Ok(Self {
            maximum_attempt_bytes,
            minimum_free_bytes,
            maximum_write_chunk_bytes,
        })
    }

    /// Bytes that must be free before an attempt is admitted.
    #[must_use]
    pub fn required_free_bytes(&self) -> u64 {
        self.minimum_free_bytes
            .saturating_add(self.maximum_attempt_bytes)
    }
}

/// A spool failure.
#[derive(Debug, thiserror::Error)]
pub enum SpoolError {
    /// Unsafe storage, a corrupt fact, a failed call, or a fatal fsync failure.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// Not enough free space for a full attempt plus the reserve; nothing was created.
    #[error(
        "log spool capacity unavailable at {path}: {available_bytes} bytes free, \
         {required_bytes} required (capacity_unavailable)"
    )]
    CapacityUnavailable {
        /// The root whose file system was measured.
        path: PathBuf,
        /// Free bytes found.
        available_bytes: u64,
        /// Reserve + per-attempt quota.
        required_bytes: u64,
    },
    /// The root, the spool directory, the shard or the log does not exist.
    #[error("{path} does not exist")]
    NotFound {
        /// The missing path.
        path: PathBuf,
    },
    /// The truncation fact already exists (facts are immutable); it was left untouched.
    #[error("{path} already exists")]
    AlreadyExists {
        /// The fact.
        path: PathBuf,
    },
    /// A policy or quota outside its bounds.
    #[error("invalid log spool policy: {rule}")]
    InvalidPolicy {
        /// The bound.
        rule: &'static str,
    },
    /// The truncation fact does not belong to this log or policy.
    #[error("truncation fact {path} does not match: {field} differs")]
    FactMismatch {
        /// The fact.
        path: PathBuf,
        /// The field that differs.
        field: &'static str,
    },
}

impl SpoolError {
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
            Self::CapacityUnavailable { .. }
            | Self::NotFound { .. }
            | Self::AlreadyExists { .. }
            | Self::InvalidPolicy { .. }
            | Self::FactMismatch { .. } => None,
        }
    }
}

fn log_rules(max_size: u64) -> FileRules {
    FileRules {
        max_size,
        exact_mode: Some(layout::FILE_MODE),
        same_inode: true,
    }
}

fn check_quota(quota_bytes: u64) -> Result<(), SpoolError> {
    if (MIN_LOG_QUOTA_BYTES..=MAX_LOG_QUOTA_BYTES).contains(&quota_bytes) {
        Ok(())
    } else {
        Err(SpoolError::InvalidPolicy {
            rule: "the log quota must be within 64 KiB..=1 GiB",
        })
    }
}

fn open_existing_root(fs: &dyn FileSystem, root: &Path) -> Result<Dir, SpoolError> {
    fsio::open_root(fs, root, false).map_err(|e| match e {
        StorageError::Io { errno, path, .. } if errno == Errno::NOENT => {
            SpoolError::NotFound { path }
        }
        other => SpoolError::Storage(other),
    })
}

/// Opens `<root>/logs/<shard>` without creating anything.
fn open_shard(fs: &dyn FileSystem, root: &Path, log_id: &LogArtifactId) -> Result<Dir, SpoolError> {
    let root_dir = open_existing_root(fs, root)?;
    let paths = layout::Paths::new(root);
    let logs = fsio::open_subdir(fs, &root_dir, layout::LOGS_DIR, false)?
        .ok_or_else(|| SpoolError::NotFound { path: paths.logs() })?;
    fsio::open_subdir(fs, &logs, layout::log_shard(log_id), false)?.ok_or_else(|| {
        SpoolError::NotFound {
            path: paths.logs().join(layout::log_shard(log_id)),
        }
    })
}

/// Admits and creates the log file of `log_id` (see the module docs).
///
/// # Errors
/// [`SpoolError::CapacityUnavailable`] (nothing created), [`SpoolError::NotFound`] for a missing
/// root, unsafe storage, or a failed call.
pub fn allocate(
    root: &Path,
    log_id: &LogArtifactId,
    policy: SpoolPolicy,
) -> Result<(), SpoolError> {
    allocate_with(&RealFs, root, log_id, policy)
}

/// [`allocate`] through a given seam.
///
/// # Errors
/// See [`allocate`].
pub fn allocate_with(
    fs: &dyn FileSystem,
    root: &Path,
    log_id: &LogArtifactId,
    policy: SpoolPolicy,
) -> Result<(), SpoolError> {
    check_quota(policy.maximum_attempt_bytes)?;
    let root_dir = open_existing_root(fs, root)?;
    let space = fs
        .fstatvfs(root_dir.fd())
        .map_err(|errno| StorageError::Io {
            op: "fstatvfs",
            path: root.to_path_buf(),
            errno,
        })?;
    let required_bytes = policy.required_free_bytes();
    if space.available_bytes < required_bytes {
        return Err(SpoolError::CapacityUnavailable {
            path: root.to_path_buf(),
            available_bytes: space.available_bytes,
            required_bytes,
        });
    }
    let logs = fsio::open_subdir(fs, &root_dir, layout::LOGS_DIR, true)?.ok_or_else(|| {
        SpoolError::NotFound {
            path: root_dir.child(layout::LOGS_DIR),
        }
    })?;
    let shard_name = layout::log_shard(log_id);
    let shard =
        fsio::open_subdir(fs, &logs, shard_name, true)?.ok_or_else(|| SpoolError::NotFound {
            path: logs.child(shard_name),
        })?;
    let name = layout::log_file_name(log_id);
    let path = shard.child(&name);
    let create =
        OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    match fs.openat(shard.fd(), &name, create, layout::FILE_MODE) {
        Ok(fd) => {
            // The umask can only clear bits; make it exactly 0600, then make the entry durable.
            fs.fchmod(fd.as_fd(), layout::FILE_MODE)
                .map_err(|errno| StorageError::Io {
                    op: "fchmod",
                    path: path.clone(),
                    errno,
                })?;
            drop(fd);
            fsio::sync_dir(fs, &shard)?;
            Ok(())
        }
        Err(Errno::EXIST) => {
            // A replayed offer: verify what is there and keep it (never truncate).
            fsio::open_verified(
                fs,
                &shard,
                &name,
                OFlags::WRONLY,
                log_rules(policy.maximum_attempt_bytes),
            )?
            .map(|_| ())
            .ok_or(SpoolError::NotFound { path })
        }
        Err(Errno::LOOP) => Err(StorageError::UnsafeStorage {
            path,
            rule: Rule::Symlink,
        }
        .into()),
        Err(errno) => Err(StorageError::Io {
            op: "openat",
            path,
            errno,
        }
        .into()),
    }
}

/// The supervisor's verified capture file.
#[derive(Debug)]
pub struct CaptureFile {
    /// Opened `O_WRONLY|O_APPEND|O_CLOEXEC`, verified; `O_NONBLOCK` already cleared.
    pub file: std::fs::File,
    /// Bytes already in the file.
    pub length_bytes: u64,
    /// `quota - length`: bytes the capture may still append.
    pub remaining_quota_bytes: u64,
    /// The file's path.
    pub path: PathBuf,
}

/// Verified open for append of the log of `log_id` (see the module docs). Creates nothing.
///
/// # Errors
/// [`SpoolError::NotFound`], [`SpoolError::InvalidPolicy`] for a quota outside 64 KiB..=1 GiB,
/// unsafe storage (including a file already above the quota), or a failed call.
pub fn open_for_capture(
    root: &Path,
    log_id: &LogArtifactId,
    quota_bytes: u64,
) -> Result<CaptureFile, SpoolError> {
    open_for_capture_with(&RealFs, root, log_id, quota_bytes)
}

/// [`open_for_capture`] through a given seam.
///
/// # Errors
/// See [`open_for_capture`].
pub fn open_for_capture_with(
    fs: &dyn FileSystem,
    root: &Path,
    log_id: &LogArtifactId,
    quota_bytes: u64,
) -> Result<CaptureFile, SpoolError> {
    check_quota(quota_bytes)?;
    let shard = open_shard(fs, root, log_id)?;
    let name = layout::log_file_name(log_id);
    let path = shard.child(&name);
    let flags = OFlags::WRONLY | OFlags::APPEND;
    let Some((fd, meta)) = fsio::open_verified(fs, &shard, &name, flags, log_rules(quota_bytes))?
    else {
        return Err(SpoolError::NotFound { path });
    };
    fsio::clear_nonblock(fs, fd.as_fd(), &path)?;
    Ok(CaptureFile {
        file: std::fs::File::from(fd),
        length_bytes: meta.size,
        remaining_quota_bytes: quota_bytes - meta.size,
        path,
    })
}

/// Takes `flock(LOCK_EX|LOCK_NB)` on the capture file's open description and returns a
/// duplicate descriptor (close-on-exec) that keeps it: the supervisor keeps that descriptor
/// until it exits, so the lock outlives the capture and the receipt's publication. See
/// [`capture_liveness`].
///
/// # Errors
/// The lock is held elsewhere (another supervisor of the same log), or a failed call.
pub fn hold_for_capture(capture: &CaptureFile) -> Result<std::fs::File, SpoolError> {
    let held = capture.file.try_clone().map_err(|e| StorageError::Io {
        op: "dup",
        path: capture.path.clone(),
        errno: Errno::from_io_error(&e).unwrap_or(Errno::IO),
    })?;
    rustix::fs::flock(&held, rustix::fs::FlockOperation::NonBlockingLockExclusive).map_err(
        |errno| StorageError::Io {
            op: "flock",
            path: capture.path.clone(),
            errno,
        },
    )?;
    Ok(held)
}

/// Whether a supervisor still holds the log of `log_id` ([`hold_for_capture`]): the verified
/// read-only open of [`open_reader`], then `flock(LOCK_SH|LOCK_NB)`, released at once. A fact
/// for the core, which decides what it means: held ⇒ `Alive`; free ⇒ `Gone`; no log, unsafe
/// storage or any other failure ⇒ `Unknown` (nothing is concluded from what cannot be read).
#[must_use]
pub fn capture_liveness(
    root: &Path,
    log_id: &LogArtifactId,
    policy: SpoolPolicy,
) -> ql_worker_core::io::Liveness {
    use ql_worker_core::io::Liveness;
    let fs = RealFs;
    let Ok(shard) = open_shard(&fs, root, log_id) else {
        return Liveness::Unknown;
    };
    let name = layout::log_file_name(log_id);
    let rules = log_rules(policy.maximum_attempt_bytes);
    let Ok(Some((fd, _))) = fsio::open_verified(&fs, &shard, &name, OFlags::RDONLY, rules) else {
        return Liveness::Unknown;
    };
    match rustix::fs::flock(&fd, rustix::fs::FlockOperation::NonBlockingLockShared) {
        // Closing the descriptor releases it.
        Ok(()) => Liveness::Gone,
        Err(Errno::WOULDBLOCK) => Liveness::Alive,
        Err(_) => Liveness::Unknown,
    }
}

/// Publishes the immutable truncation fact of `fact.log_artifact_id` next to its log (temp +
/// fsync + link no-replace + dir fsync).
///
/// # Errors
/// [`SpoolError::AlreadyExists`] (left untouched), [`SpoolError::NotFound`] when the log's shard
/// is missing, unsafe storage, or a failed call; [`SpoolError::is_fatal`] for an fsync failure.
pub fn publish_truncation_fact(root: &Path, fact: &TruncationFact) -> Result<(), SpoolError> {
    publish_truncation_fact_with(&RealFs, root, fact)
}

/// [`publish_truncation_fact`] through a given seam.
///
/// # Errors
/// See [`publish_truncation_fact`].
pub fn publish_truncation_fact_with(
    fs: &dyn FileSystem,
    root: &Path,
    fact: &TruncationFact,
) -> Result<(), SpoolError> {
    let shard = open_shard(fs, root, &fact.log_artifact_id)?;
    let name = layout::fact_file_name(&fact.log_artifact_id);
    let bytes = envelope::encode(fact).map_err(|source| StorageError::Unencodable {
        path: shard.child(&name),
        source,
    })?;
    fsio::publish_new(fs, &shard, &name, &bytes).map_err(|e| match e {
        StorageError::AlreadyExists { path } => SpoolError::AlreadyExists { path },
        other => SpoolError::Storage(other),
    })
}

/// Length and SHA-256 of the bytes a [`LogReader`] delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogDigest {
    /// Bytes delivered.
    pub byte_length: u64,
    /// SHA-256 of exactly those bytes.
    pub sha256: Sha256Digest,
}

/// Streams a log in ≤ 64 KiB chunks, hashing as it goes. It delivers exactly the size the file
/// had when it was opened (the upload length); a file that shrinks meanwhile is an error.
#[derive(Debug)]
pub struct LogReader<F: FileSystem = RealFs> {
    fs: F,
    fd: OwnedFd,
    path: PathBuf,
    length_bytes: u64,
    delivered_bytes: u64,
    hasher: sha2::Sha256,
    /// From the authenticated truncation fact: `Some(quota_reached)`, or `None` when no fact
    /// was published (truncation unknown, wire `null`).
    pub truncation: Option<bool>,
    /// The authenticated fact itself, for the caller's run/attempt comparison.
    pub fact: Option<TruncationFact>,
}

impl<F: FileSystem> LogReader<F> {
    /// The size at open: the number of bytes the reader will deliver.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.length_bytes
    }

    /// Whether the log is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.length_bytes == 0
    }

    /// The log's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Length and SHA-256 of the bytes delivered so far; after reading to EOF, of the whole log
    /// as it was at open. Compare `byte_length` with [`Self::len`] before trusting it.
    #[must_use]
    pub fn finish(self) -> LogDigest {
        let out = self.hasher.finalize();
        let mut bytes = [0u8; 32];
        bytes.copy_from_slice(out.as_slice());
        LogDigest {
            byte_length: self.delivered_bytes,
            sha256: Sha256Digest::from_bytes(bytes),
        }
    }
}

impl<F: FileSystem> io::Read for LogReader<F> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let remaining = self.length_bytes - self.delivered_bytes;
        let want = usize::try_from(remaining)
            .unwrap_or(usize::MAX)
            .min(buf.len())
            .min(READ_CHUNK_BYTES);
        if want == 0 {
            return Ok(0);
        }
        let n = self
            .fs
            .read(self.fd.as_fd(), &mut buf[..want])
            .map_err(io::Error::from)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!(
                    "{} shrank while being read: {} of {} bytes",
                    self.path.display(),
                    self.delivered_bytes,
                    self.length_bytes
                ),
            ));
        }
        self.hasher.update(&buf[..n]);
        self.delivered_bytes += n as u64;
        Ok(n)
    }
}

/// Opens the log of `log_id` for upload: verified like [`open_for_capture`] (mode exactly 0600,
/// size ≤ the policy quota), and its truncation fact read and authenticated (regular, owned,
/// one link, ≤ 4 KiB, envelope checksum, same log id, `maximumBytes` = the policy quota).
/// A missing fact gives `truncation: None`; a present but bad one is an error.
///
/// # Errors
/// [`SpoolError::NotFound`], [`SpoolError::FactMismatch`], unsafe storage, a corrupt fact, or a
/// failed call.
pub fn open_reader(
    root: &Path,
    log_id: &LogArtifactId,
    policy: SpoolPolicy,
) -> Result<LogReader, SpoolError> {
    open_reader_with(RealFs, root, log_id, policy)
}

/// [`open_reader`] through a given seam.
///
/// # Errors
/// See [`open_reader`].
pub fn open_reader_with<F: FileSystem>(
    fs: F,
    root: &Path,
    log_id: &LogArtifactId,
    policy: SpoolPolicy,
) -> Result<LogReader<F>, SpoolError> {
    let shard = open_shard(&fs, root, log_id)?;
    let name = layout::log_file_name(log_id);
    let path = shard.child(&name);
    let rules = log_rules(policy.maximum_attempt_bytes);
    let Some((fd, meta)) = fsio::open_verified(&fs, &shard, &name, OFlags::RDONLY, rules)? else {
        return Err(SpoolError::NotFound { path });
    };
    let fact = read_fact(&fs, &shard, log_id, policy)?;
    Ok(LogReader {
        fs,
        fd,
        path,
        length_bytes: meta.size,
        delivered_bytes: 0,
        hasher: sha2::Sha256::new(),
        truncation: fact.as_ref().map(|f| f.quota_reached),
        fact,
    })
}

fn read_fact(
    fs: &dyn FileSystem,
    shard: &Dir,
    log_id: &LogArtifactId,
    policy: SpoolPolicy,
) -> Result<Option<TruncationFact>, SpoolError> {
    let name = layout::fact_file_name(log_id);
    let path = shard.child(&name);
    let Some(bytes) = fsio::read_checked(fs, shard, &name, MAX_FACT_BYTES)? else {
        return Ok(None);
    };
    let fact: TruncationFact =
        envelope::decode(&bytes).map_err(|source| StorageError::Corrupt {
            path: path.clone(),
            source,
        })?;
    if fact.log_artifact_id != *log_id {
        return Err(SpoolError::FactMismatch {
            path,
            field: "logArtifactId",
        });
    }
    if fact.maximum_bytes != policy.maximum_attempt_bytes {
        return Err(SpoolError::FactMismatch {
            path,
            field: "maximumBytes",
        });
    }
    Ok(Some(fact))
}

/// Removes the log of `log_id`, its truncation fact and stale temps of the fact, then fsyncs the
/// shard. Only retention calls this, and only for a settled Run past its keep period. Returns
/// whether anything was removed; a missing shard or file is not an error.
///
/// # Errors
/// Unsafe storage (a symlinked shard is never followed), a failed call, or a fatal fsync error.
pub fn remove(root: &Path, log_id: &LogArtifactId) -> Result<bool, SpoolError> {
    remove_with(&RealFs, root, log_id)
}

/// [`remove`] through a given seam.
///
/// # Errors
/// See [`remove`].
pub fn remove_with(
    fs: &dyn FileSystem,
    root: &Path,
    log_id: &LogArtifactId,
) -> Result<bool, SpoolError> {
    let shard = match open_shard(fs, root, log_id) {
        Ok(shard) => shard,
        Err(SpoolError::NotFound { .. }) => return Ok(false),
        Err(e) => return Err(e),
    };
    let fact_name = layout::fact_file_name(log_id);
    let log_name = layout::log_file_name(log_id);
    let mut removed = false;
    for name in [&fact_name, &log_name] {
        match fs.unlink(shard.fd(), name) {
            Ok(()) => removed = true,
            Err(Errno::NOENT) => {}
            Err(errno) => {
                return Err(StorageError::Io {
                    op: "unlinkat",
                    path: shard.child(name),
                    errno,
                }
                .into());
            }
        }
    }
    let entries = fsio::scan_dir(fs, &shard, MAX_SHARD_ENTRIES)?;
    let swept = fsio::sweep_temps(fs, &shard, &entries, |target| target == fact_name)?;
    if removed && swept == 0 {
        fsio::sync_dir(fs, &shard)?;
    }
    Ok(removed)
}
