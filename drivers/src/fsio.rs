//! The file seam and the one durable publication recipe.
//!
//! Every file operation of the storage modules goes through [`FileSystem`], a small object-safe
//! trait with one method per system call. [`RealFs`] implements it with rustix; `FaultFs` (in the
//! test crate `ql-worker-sim`, never in this one) wraps any implementation, counts calls (and
//! fsyncs) and fails the Nth call with a chosen errno, once or from then on, so tests can walk a
//! failure through every step of a write (CONVENTIONS C14, redb's countdown backend).
//!
//! On top of the seam sit the only functions that write or read a durable envelope:
//! [`publish_new`], [`replace`], [`remove`] and [`read_checked`], plus the verified directory
//! and file openers every module uses ([`open_root`], [`open_subdir`], [`open_verified`]).
//!
//! # Media assumptions
//!
//! The recipe is correct under these assumptions, which we state the way redb does rather than
//! pretend they are checked:
//!
//! 1. The state root is on a local POSIX file system (ext4, xfs, btrfs, tmpfs for tests); NFS and
//!    other shared roots are out of scope (reference §3.3, ADR-0021 §4).
//! 2. `fsync(file)` returning success means the file's data and size are on stable storage;
//!    `fsync(dir)` returning success means the directory's entries (a rename, link or unlink in
//!    it) are on stable storage. Drives that acknowledge a cache flush they did not do break
//!    every durable store, this one included.
//! 3. `rename(2)` (and `renameat2(RENAME_NOREPLACE)`) within one directory is atomic: after a
//!    crash the name refers to the old inode or the new one, never to a mix; a crash before the
//!    directory fsync may keep either.
//! 4. A failed `fsync` may have dropped dirty pages silently (Linux marks them clean on error,
//!    the "fsyncgate" behaviour of 2018), so a retry that succeeds proves nothing. An fsync error
//!    is therefore [`StorageError::FsyncFailed`], which callers treat as fatal: stop, restart,
//!    and let recovery read what is really on disk. It is never retried here.
//! 5. Writes are not atomic on their own: a crash may leave a temp file with any prefix of its
//!    bytes, or a zero-length one. Temp files therefore never carry a record's name, and a
//!    record is only ever a name that was linked or renamed to a fully written, fsynced inode.
//!    The envelope's length and SHA-256 catch the remaining case: media that corrupts bytes.
//! 6. The root and everything in it belongs to one user (the effective uid) and is not writable
//!    by anyone else, which [`open_root`], [`open_subdir`] and [`open_verified`] check on every
//!    open. Operations are relative to directory fds opened with `O_NOFOLLOW`, so a path swapped
//!    after the open cannot redirect them.
//!
//! # The recipe
//!
//! * publish (first publication, [`publish_new`]): temp `O_WRONLY|O_CREAT|O_EXCL|O_NOFOLLOW|
//!   O_CLOEXEC` 0600 in the target's directory → write → `fsync(temp)` →
//!   `renameat2(temp, target, RENAME_NOREPLACE)` (fallback where the file system does not
//!   support the flag: `linkat(temp, target)` + `unlinkat(temp)`) → `fsync(dir)`. An existing
//!   target is [`StorageError::AlreadyExists`] and leaves it untouched.
//! * publish within this boot only ([`publish_new_unsynced`]): the same steps without either
//!   fsync, for a file whose meaning ends with the boot (the published handle: docs/supervisor.md).
//! * replace ([`replace`]): temp → write → `fsync(temp)` → `renameat(temp, target)` →
//!   `fsync(dir)`. The caller checks its CAS under the owner lock before calling.
//! * remove ([`remove`]): `unlinkat(target)` → `fsync(dir)`.
//! * read ([`read_checked`]): `openat(O_RDONLY|O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC)` → `fstat`:
//!   regular file, owned by the effective uid, `mode & 0o077 == 0`, one link, size within the
//!   bound → read exactly that size → the caller decodes with the core codec.
//!
//! Any failure before the rename removes the temp (best effort; a leftover temp is never read as
//! a record and is swept when the owner reopens the journal).

use std::ffi::OsStr;
use std::fmt;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, FlockOperation, Mode, OFlags, RenameFlags};
use rustix::io::Errno;
use zeroize::Zeroizing;

use crate::layout;

/// What `fstat` says about a file, reduced to what the checks need.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Meta {
    /// File type.
    pub kind: Kind,
    /// Permission bits (`st_mode & 0o7777`).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Hard links.
    pub nlink: u64,
    /// Size in bytes.
    pub size: u64,
    /// Device.
    pub dev: u64,
    /// Inode.
    pub ino: u64,
    /// Last modification (`st_mtime`), Unix milliseconds (0 before 1970).
    pub mtime_ms: u64,
    /// Last inode change (`st_ctime`: a rename sets it), Unix milliseconds (0 before 1970).
    pub ctime_ms: u64,
}

/// File types, as far as the checks care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Regular file.
    Regular,
    /// Directory.
    Directory,
    /// Symbolic link.
    Symlink,
    /// FIFO, socket, device or unknown.
    Other,
}

impl Kind {
    fn from_file_type(ty: FileType) -> Self {
        match ty {
            FileType::RegularFile => Self::Regular,
            FileType::Directory => Self::Directory,
            FileType::Symlink => Self::Symlink,
            FileType::Fifo
            | FileType::Socket
            | FileType::CharacterDevice
            | FileType::BlockDevice
            | FileType::Unknown => Self::Other,
        }
    }
}

/// One directory entry (without `.` and `..`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Raw name bytes.
    pub name: Vec<u8>,
    /// Type from `d_type`, `None` when the file system did not say.
    pub kind: Option<Kind>,
}

/// Free space of a file system.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Space {
    /// Bytes available to an unprivileged user (`f_bavail * f_frsize`).
    pub available_bytes: u64,
}

/// The seam: one method per system call the storage modules make. Object safe; every module
/// takes `&dyn FileSystem`.
pub trait FileSystem: fmt::Debug + Send + Sync {
    /// `open(path)` (only used for the root).
    ///
    /// # Errors
    /// The errno.
    fn open(&self, path: &Path, flags: OFlags, mode: u32) -> Result<OwnedFd, Errno>;
    /// `mkdir(path)` (only used for the root).
    ///
    /// # Errors
    /// The errno.
    fn mkdir(&self, path: &Path, mode: u32) -> Result<(), Errno>;
    /// `openat(dir, name)`.
    ///
    /// # Errors
    /// The errno.
    fn openat(
        &self,
        dir: BorrowedFd<'_>,
        name: &str,
        flags: OFlags,
        mode: u32,
    ) -> Result<OwnedFd, Errno>;
    /// `mkdirat(dir, name)`.
    ///
    /// # Errors
    /// The errno.
    fn mkdirat(&self, dir: BorrowedFd<'_>, name: &str, mode: u32) -> Result<(), Errno>;
    /// `fstat(fd)`.
    ///
    /// # Errors
    /// The errno.
    fn fstat(&self, fd: BorrowedFd<'_>) -> Result<Meta, Errno>;
    /// `fstatat(dir, name, AT_SYMLINK_NOFOLLOW)`.
    ///
    /// # Errors
    /// The errno.
    fn stat_nofollow(&self, dir: BorrowedFd<'_>, name: &str) -> Result<Meta, Errno>;
    /// `fstatvfs(fd)`.
    ///
    /// # Errors
    /// The errno.
    fn fstatvfs(&self, fd: BorrowedFd<'_>) -> Result<Space, Errno>;
    /// `fchmod(fd, mode)`.
    ///
    /// # Errors
    /// The errno.
    fn fchmod(&self, fd: BorrowedFd<'_>, mode: u32) -> Result<(), Errno>;
    /// `fcntl(F_SETFL)` to clear `O_NONBLOCK` (used after a verified open).
    ///
    /// # Errors
    /// The errno.
    fn clear_nonblock(&self, fd: BorrowedFd<'_>) -> Result<(), Errno>;
    /// `read(fd, buf)`; retries `EINTR`.
    ///
    /// # Errors
    /// The errno.
    fn read(&self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno>;
    /// `write(fd, buf)`; retries `EINTR`.
    ///
    /// # Errors
    /// The errno.
    fn write(&self, fd: BorrowedFd<'_>, buf: &[u8]) -> Result<usize, Errno>;
    /// `fsync(fd)`.
    ///
    /// # Errors
    /// The errno.
    fn fsync(&self, fd: BorrowedFd<'_>) -> Result<(), Errno>;
    /// `renameat(old_dir, old, new_dir, new)`.
    ///
    /// # Errors
    /// The errno.
    fn rename(
        &self,
        old_dir: BorrowedFd<'_>,
        old: &str,
        new_dir: BorrowedFd<'_>,
        new: &str,
    ) -> Result<(), Errno>;
    /// `renameat2(old_dir, old, new_dir, new, RENAME_NOREPLACE)`.
    ///
    /// # Errors
    /// The errno (`EEXIST` for an existing target; `EINVAL` where unsupported).
    fn rename_noreplace(
        &self,
        old_dir: BorrowedFd<'_>,
        old: &str,
        new_dir: BorrowedFd<'_>,
        new: &str,
    ) -> Result<(), Errno>;
    /// `linkat(old_dir, old, new_dir, new, 0)` (does not follow a symlink).
    ///
    /// # Errors
    /// The errno.
    fn link(
        &self,
        old_dir: BorrowedFd<'_>,
        old: &str,
        new_dir: BorrowedFd<'_>,
        new: &str,
    ) -> Result<(), Errno>;
    /// `unlinkat(dir, name, 0)`.
    ///
    /// # Errors
    /// The errno.
    fn unlink(&self, dir: BorrowedFd<'_>, name: &str) -> Result<(), Errno>;
    /// Reads the entries of `dir` (without `.` and `..`), at most `max + 1` of them so the
    /// caller can tell "too many" without reading a hostile directory to its end.
    ///
    /// # Errors
    /// The errno.
    fn read_dir(&self, dir: BorrowedFd<'_>, max: usize) -> Result<Vec<Entry>, Errno>;
    /// `flock(fd, LOCK_EX|LOCK_NB)`.
    ///
    /// # Errors
    /// The errno (`EWOULDBLOCK` when another open file description holds it).
    fn lock_exclusive(&self, fd: BorrowedFd<'_>) -> Result<(), Errno>;
    /// Fills `buf` from the OS RNG (`getrandom`).
    ///
    /// # Errors
    /// The errno.
    fn random(&self, buf: &mut [u8]) -> Result<(), Errno>;
}

/// Forwards every [`FileSystem`] call through a pointer type (`&T`, `Arc<T>`).
macro_rules! forward_file_system {
    ($($pointer:ty),+) => {$(
        impl<T: FileSystem + ?Sized> FileSystem for $pointer {
            fn open(&self, path: &Path, flags: OFlags, mode: u32) -> Result<OwnedFd, Errno> {
                (**self).open(path, flags, mode)
            }
            fn mkdir(&self, path: &Path, mode: u32) -> Result<(), Errno> {
                (**self).mkdir(path, mode)
            }
            fn openat(
                &self,
                dir: BorrowedFd<'_>,
                name: &str,
                flags: OFlags,
                mode: u32,
            ) -> Result<OwnedFd, Errno> {
                (**self).openat(dir, name, flags, mode)
            }
            fn mkdirat(&self, dir: BorrowedFd<'_>, name: &str, mode: u32) -> Result<(), Errno> {
                (**self).mkdirat(dir, name, mode)
            }
            fn fstat(&self, fd: BorrowedFd<'_>) -> Result<Meta, Errno> {
                (**self).fstat(fd)
            }
            fn stat_nofollow(&self, dir: BorrowedFd<'_>, name: &str) -> Result<Meta, Errno> {
                (**self).stat_nofollow(dir, name)
            }
            fn fstatvfs(&self, fd: BorrowedFd<'_>) -> Result<Space, Errno> {
                (**self).fstatvfs(fd)
            }
            fn fchmod(&self, fd: BorrowedFd<'_>, mode: u32) -> Result<(), Errno> {
                (**self).fchmod(fd, mode)
            }
            fn clear_nonblock(&self, fd: BorrowedFd<'_>) -> Result<(), Errno> {
                (**self).clear_nonblock(fd)
            }
            fn read(&self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
                (**self).read(fd, buf)
            }
            fn write(&self, fd: BorrowedFd<'_>, buf: &[u8]) -> Result<usize, Errno> {
                (**self).write(fd, buf)
            }
            fn fsync(&self, fd: BorrowedFd<'_>) -> Result<(), Errno> {
                (**self).fsync(fd)
            }
            fn rename(
                &self,
                old_dir: BorrowedFd<'_>,
                old: &str,
                new_dir: BorrowedFd<'_>,
                new: &str,
            ) -> Result<(), Errno> {
                (**self).rename(old_dir, old, new_dir, new)
            }
            fn rename_noreplace(
                &self,
                old_dir: BorrowedFd<'_>,
                old: &str,
                new_dir: BorrowedFd<'_>,
                new: &str,
            ) -> Result<(), Errno> {
                (**self).rename_noreplace(old_dir, old, new_dir, new)
            }
            fn link(
                &self,
                old_dir: BorrowedFd<'_>,
                old: &str,
                new_dir: BorrowedFd<'_>,
                new: &str,
            ) -> Result<(), Errno> {
                (**self).link(old_dir, old, new_dir, new)
            }
            fn unlink(&self, dir: BorrowedFd<'_>, name: &str) -> Result<(), Errno> {
                (**self).unlink(dir, name)
            }
            fn read_dir(&self, dir: BorrowedFd<'_>, max: usize) -> Result<Vec<Entry>, Errno> {
                (**self).read_dir(dir, max)
            }
            fn lock_exclusive(&self, fd: BorrowedFd<'_>) -> Result<(), Errno> {
                (**self).lock_exclusive(fd)
            }
            fn random(&self, buf: &mut [u8]) -> Result<(), Errno> {
                (**self).random(buf)
            }
        }
    )+};
}

forward_file_system!(&T, std::sync::Arc<T>);

/// The real file system, through rustix.
#[derive(Clone, Copy, Debug, Default)]
pub struct RealFs;

fn meta(st: &rustix::fs::Stat) -> Meta {
    #[allow(clippy::useless_conversion, reason = "st_nlink is u32 on some targets")]
    let nlink = u64::from(st.st_nlink);
    #[allow(clippy::useless_conversion, reason = "st_dev/st_ino differ by target")]
    let (dev, ino) = (u64::from(st.st_dev), u64::from(st.st_ino));
    Meta {
        kind: Kind::from_file_type(FileType::from_raw_mode(st.st_mode)),
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        nlink,
        size: u64::try_from(st.st_size).unwrap_or(u64::MAX),
        dev,
        ino,
        mtime_ms: unix_ms(st.st_mtime, st.st_mtime_nsec),
        ctime_ms: unix_ms(st.st_ctime, st.st_ctime_nsec),
    }
}

/// Seconds and nanoseconds of a stat time (their types differ by target) as Unix
/// milliseconds (0 before 1970).
fn unix_ms(secs: impl TryInto<i64>, nanos: impl TryInto<i64>) -> u64 {
    let secs: i64 = secs.try_into().unwrap_or(0);
    let nanos: i64 = nanos.try_into().unwrap_or(0);
    u64::try_from(secs.saturating_mul(1000).saturating_add(nanos / 1_000_000)).unwrap_or(0)
}

fn retry<T>(mut op: impl FnMut() -> Result<T, Errno>) -> Result<T, Errno> {
    // Bounded: a signal storm is not a reason to spin forever.
    let mut tries = 0u32;
    loop {
        match op() {
            Err(Errno::INTR) if tries < 1000 => tries += 1,
            other => return other,
        }
    }
}

impl FileSystem for RealFs {
    fn open(&self, path: &Path, flags: OFlags, mode: u32) -> Result<OwnedFd, Errno> {
        retry(|| rustix::fs::open(path, flags, Mode::from_raw_mode(mode)))
    }
    fn mkdir(&self, path: &Path, mode: u32) -> Result<(), Errno> {
        rustix::fs::mkdir(path, Mode::from_raw_mode(mode))
    }
    fn openat(
        &self,
        dir: BorrowedFd<'_>,
        name: &str,
        flags: OFlags,
        mode: u32,
    ) -> Result<OwnedFd, Errno> {
        retry(|| rustix::fs::openat(dir, name, flags, Mode::from_raw_mode(mode)))
    }
    fn mkdirat(&self, dir: BorrowedFd<'_>, name: &str, mode: u32) -> Result<(), Errno> {
        rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(mode))
    }
    fn fstat(&self, fd: BorrowedFd<'_>) -> Result<Meta, Errno> {
        rustix::fs::fstat(fd).map(|st| meta(&st))
    }
    fn stat_nofollow(&self, dir: BorrowedFd<'_>, name: &str) -> Result<Meta, Errno> {
        rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).map(|st| meta(&st))
    }
    fn fstatvfs(&self, fd: BorrowedFd<'_>) -> Result<Space, Errno> {
        let vfs = rustix::fs::fstatvfs(fd)?;
        Ok(Space {
            available_bytes: vfs.f_bavail.saturating_mul(vfs.f_frsize),
        })
    }
    fn fchmod(&self, fd: BorrowedFd<'_>, mode: u32) -> Result<(), Errno> {
        rustix::fs::fchmod(fd, Mode::from_raw_mode(mode))
    }
    fn clear_nonblock(&self, fd: BorrowedFd<'_>) -> Result<(), Errno> {
        let flags = rustix::fs::fcntl_getfl(fd)?;
        rustix::fs::fcntl_setfl(fd, flags - OFlags::NONBLOCK)
    }
    fn read(&self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
        retry(|| rustix::io::read(fd, &mut *buf))
    }
    fn write(&self, fd: BorrowedFd<'_>, buf: &[u8]) -> Result<usize, Errno> {
        retry(|| rustix::io::write(fd, buf))
    }
    fn fsync(&self, fd: BorrowedFd<'_>) -> Result<(), Errno> {
        let started = std::time::Instant::now();
        let result = rustix::fs::fsync(fd);
        crate::metrics::FSYNC.observe(started.elapsed());
        result
    }
    fn rename(
        &self,
        old_dir: BorrowedFd<'_>,
        old: &str,
        new_dir: BorrowedFd<'_>,
        new: &str,
    ) -> Result<(), Errno> {
        rustix::fs::renameat(old_dir, old, new_dir, new)
    }
    fn rename_noreplace(
        &self,
        old_dir: BorrowedFd<'_>,
        old: &str,
        new_dir: BorrowedFd<'_>,
        new: &str,
    ) -> Result<(), Errno> {
        rustix::fs::renameat_with(old_dir, old, new_dir, new, RenameFlags::NOREPLACE)
    }
    fn link(
        &self,
        old_dir: BorrowedFd<'_>,
        old: &str,
        new_dir: BorrowedFd<'_>,
        new: &str,
    ) -> Result<(), Errno> {
        rustix::fs::linkat(old_dir, old, new_dir, new, AtFlags::empty())
    }
    fn unlink(&self, dir: BorrowedFd<'_>, name: &str) -> Result<(), Errno> {
        rustix::fs::unlinkat(dir, name, AtFlags::empty())
    }
    fn read_dir(&self, dir: BorrowedFd<'_>, max: usize) -> Result<Vec<Entry>, Errno> {
        let mut reader = rustix::fs::Dir::read_from(dir)?;
        let mut out = Vec::new();
        while let Some(entry) = reader.read() {
            let entry = entry?;
            let name = entry.file_name().to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            let kind = match entry.file_type() {
                FileType::Unknown => None,
                other => Some(Kind::from_file_type(other)),
            };
            out.push(Entry {
                name: name.to_vec(),
                kind,
            });
            if out.len() > max {
                break;
            }
        }
        Ok(out)
    }
    fn lock_exclusive(&self, fd: BorrowedFd<'_>) -> Result<(), Errno> {
        rustix::fs::flock(fd, FlockOperation::NonBlockingLockExclusive)
    }
    fn random(&self, buf: &mut [u8]) -> Result<(), Errno> {
        crate::os::fill_random(buf)
    }
}

/// A rule of the state root that something on disk breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rule {
    /// The configured root path is refused before use.
    RootPath(layout::RootPathError),
    /// A symbolic link where a real file or directory must be.
    Symlink,
    /// Something other than a directory where a directory must be.
    NotDirectory,
    /// Something other than a regular file where one must be (directory, FIFO, socket, device).
    NotRegular,
    /// Not owned by the effective uid.
    Owner {
        /// The effective uid.
        expected: u32,
        /// The owner found.
        found: u32,
    },
    /// Group or other permission bits set (or, for log files, not exactly 0600).
    Mode {
        /// The permission bits found.
        found: u32,
    },
    /// More than one hard link.
    LinkCount {
        /// Links found.
        found: u64,
    },
    /// Larger than allowed.
    TooLarge {
        /// Bytes found.
        size: u64,
        /// The bound.
        max: u64,
    },
    /// A name in a directory we own that is none of ours.
    ForeignEntry,
    /// More entries than the directory may ever hold.
    TooManyEntries {
        /// The bound.
        max: usize,
    },
    /// The path and the open fd name different inodes (swapped between the checks).
    InodeChanged,
    /// The file name and the content disagree (e.g. a record renamed to another offer's name).
    NameMismatch,
    /// A file changed size while being read.
    ChangedWhileReading,
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::RootPath(e) => f.write_str(e.rule()),
            Self::Symlink => f.write_str("must not be a symbolic link"),
            Self::NotDirectory => f.write_str("must be a real directory"),
            Self::NotRegular => f.write_str("must be a regular file"),
            Self::Owner { expected, found } => {
                write!(
                    f,
                    "must be owned by uid {expected}, is owned by uid {found}"
                )
            }
            Self::Mode { found } => write!(
                f,
                "must have no group/other permission bits (directories 0700, files 0600, log \
                 files exactly 0600), has {found:04o}"
            ),
            Self::LinkCount { found } => write!(f, "must have exactly one link, has {found}"),
            Self::TooLarge { size, max } => {
                write!(f, "must be at most {max} bytes, is {size}")
            }
            Self::ForeignEntry => f.write_str(
                "is not an entry this storage writes (fail closed: remove or inspect it)",
            ),
            Self::TooManyEntries { max } => write!(f, "must hold at most {max} entries"),
            Self::InodeChanged => f.write_str("path and open file must be the same inode"),
            Self::NameMismatch => f.write_str("file name must match the id in its content"),
            Self::ChangedWhileReading => f.write_str("must not change size while being read"),
        }
    }
}

/// A storage failure. Every variant names the path; none carries file content.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// Something on disk breaks a rule of the state root. Nothing was changed.
    #[error("unsafe storage at {path}: {rule}")]
    UnsafeStorage {
        /// The offending path.
        path: PathBuf,
        /// The rule it breaks.
        rule: Rule,
    },
    /// `fsync` failed. **Fatal**: the durable state is unknown; stop and let recovery read the
    /// disk. Never retried.
    #[error("fsync failed on {path}: {errno} (fatal: durability unknown, never retried)")]
    FsyncFailed {
        /// The file or directory whose fsync failed.
        path: PathBuf,
        /// The errno.
        errno: Errno,
    },
    /// The first publication found the target already present; it was left untouched.
    #[error("{path} already exists")]
    AlreadyExists {
        /// The target.
        path: PathBuf,
    },
    /// A file's bytes are not a valid envelope of the expected kind (corrupt, truncated,
    /// tampered, or a value that breaks its own rules).
    #[error("corrupt file {path}: {source}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What the codec found.
        source: ql_worker_core::envelope::EnvelopeError,
    },
    /// A value could not be encoded (invalid or too large); nothing was written.
    #[error("refusing to write {path}: {source}")]
    Unencodable {
        /// The target.
        path: PathBuf,
        /// What the codec found.
        source: ql_worker_core::envelope::EnvelopeError,
    },
    /// Any other failed system call. Nothing durable changed unless the operation documents
    /// otherwise.
    #[error("{op} failed on {path}: {errno}")]
    Io {
        /// The system call.
        op: &'static str,
        /// The path it was about.
        path: PathBuf,
        /// The errno.
        errno: Errno,
    },
}

impl StorageError {
    /// Whether the caller must stop (an fsync failed: durability unknown).
    #[must_use]
    pub fn is_fatal(&self) -> bool {
        matches!(self, Self::FsyncFailed { .. })
    }

    /// The unsafe-storage rule, if that is what this is.
    #[must_use]
    pub fn unsafe_rule(&self) -> Option<Rule> {
        match self {
            Self::UnsafeStorage { rule, .. } => Some(*rule),
            Self::FsyncFailed { .. }
            | Self::AlreadyExists { .. }
            | Self::Corrupt { .. }
            | Self::Unencodable { .. }
            | Self::Io { .. } => None,
        }
    }

    fn unsafe_at(path: &Path, rule: Rule) -> Self {
        Self::UnsafeStorage {
            path: path.to_path_buf(),
            rule,
        }
    }

    fn io(op: &'static str, path: &Path, errno: Errno) -> Self {
        Self::Io {
            op,
            path: path.to_path_buf(),
            errno,
        }
    }
}

/// An opened, verified directory: its path (for messages) and fd (for every operation in it).
#[derive(Debug)]
pub struct Dir {
    path: PathBuf,
    fd: OwnedFd,
}

impl Dir {
    /// The path it was opened as.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The fd.
    #[must_use]
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// `<dir>/<name>`, for messages.
    #[must_use]
    pub fn child(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }
}

/// The effective uid, the owner everything must have.
#[must_use]
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Maps an errno from an `O_NOFOLLOW` open to the rule it reveals, if any.
fn open_rule(errno: Errno) -> Option<Rule> {
    match errno {
        Errno::LOOP => Some(Rule::Symlink),
        Errno::ISDIR => Some(Rule::NotRegular),
        // ENXIO: a socket (or a FIFO opened for writing without a reader); EOPNOTSUPP: a socket.
        Errno::NXIO | Errno::OPNOTSUPP | Errno::NODEV => Some(Rule::NotRegular),
        _ => None,
    }
}

fn check_dir(path: &Path, meta: &Meta) -> Result<(), StorageError> {
    if meta.kind != Kind::Directory {
        return Err(StorageError::unsafe_at(path, Rule::NotDirectory));
    }
    let uid = euid();
    if meta.uid != uid {
        return Err(StorageError::unsafe_at(
            path,
            Rule::Owner {
                expected: uid,
                found: meta.uid,
            },
        ));
    }
    if meta.mode & layout::GROUP_OTHER_BITS != 0 {
        return Err(StorageError::unsafe_at(
            path,
            Rule::Mode { found: meta.mode },
        ));
    }
    Ok(())
}

/// Opens and verifies the state root: the path is checked ([`layout::check_root_path`]), the
/// last component is opened with `O_NOFOLLOW|O_DIRECTORY`, and the directory must be owned by the
/// effective uid with no group/other bits. With `create`, a missing root is created 0700 (its
/// parent must exist) and its parent is fsynced.
///
/// # Errors
/// [`StorageError::UnsafeStorage`] naming the rule, or the failed call.
pub fn open_root(fs: &dyn FileSystem, root: &Path, create: bool) -> Result<Dir, StorageError> {
    layout::check_root_path(root).map_err(|e| StorageError::unsafe_at(root, Rule::RootPath(e)))?;
    let fd = match fs.open(root, DIR_FLAGS, 0) {
        Ok(fd) => fd,
        Err(Errno::NOENT) if create => {
            create_root(fs, root)?;
            fs.open(root, DIR_FLAGS, 0)
                .map_err(|e| root_open_error(fs, root, e))?
        }
        Err(e) => return Err(root_open_error(fs, root, e)),
    };
    let meta = fs
        .fstat(fd.as_fd())
        .map_err(|e| StorageError::io("fstat", root, e))?;
    check_dir(root, &meta)?;
    Ok(Dir {
        path: root.to_path_buf(),
        fd,
    })
}

fn create_root(fs: &dyn FileSystem, root: &Path) -> Result<(), StorageError> {
    match fs.mkdir(root, layout::DIR_MODE) {
        Ok(()) => {}
        Err(Errno::EXIST) => return Ok(()),
        Err(e) => return Err(StorageError::io("mkdir", root, e)),
    }
    // The umask can only clear bits; force exactly 0700 and make the new entry durable.
    let fd = fs
        .open(root, DIR_FLAGS, 0)
        .map_err(|e| root_open_error(fs, root, e))?;
    fs.fchmod(fd.as_fd(), layout::DIR_MODE)
        .map_err(|e| StorageError::io("fchmod", root, e))?;
    if let Some(parent) = root.parent() {
        let parent_fd = fs
            .open(
                parent,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                0,
            )
            .map_err(|e| StorageError::io("open", parent, e))?;
        fsync_dir(fs, parent, parent_fd.as_fd())?;
    }
    Ok(())
}

/// Maps a failed `O_DIRECTORY|O_NOFOLLOW` open to its rule. Linux reports a symlink there as
/// `ENOTDIR` (the link itself is not a directory), so the entry is looked at with `lstat` to name
/// the right rule.
fn dir_open_error(
    fs: &dyn FileSystem,
    parent: BorrowedFd<'_>,
    name: &str,
    path: &Path,
    errno: Errno,
) -> StorageError {
    match errno {
        Errno::NOTDIR | Errno::LOOP => match fs.stat_nofollow(parent, name) {
            Ok(meta) if meta.kind == Kind::Symlink => StorageError::unsafe_at(path, Rule::Symlink),
            Ok(_) => StorageError::unsafe_at(path, Rule::NotDirectory),
            Err(e) => StorageError::io("fstatat", path, e),
        },
        _ => StorageError::io("open", path, errno),
    }
}

fn root_open_error(fs: &dyn FileSystem, root: &Path, errno: Errno) -> StorageError {
    // `check_root_path` proved the root is absolute UTF-8, so the dirfd is ignored.
    match root.to_str() {
        Some(text) => dir_open_error(fs, rustix::fs::CWD, text, root, errno),
        None => StorageError::io("open", root, errno),
    }
}

/// Opens and verifies `<parent>/<name>` as a directory (same rules as the root). With `create`,
/// a missing one is created 0700 and `parent` is fsynced; without, a missing one is `Ok(None)`.
///
/// # Errors
/// [`StorageError::UnsafeStorage`] naming the rule, or the failed call.
pub fn open_subdir(
    fs: &dyn FileSystem,
    parent: &Dir,
    name: &str,
    create: bool,
) -> Result<Option<Dir>, StorageError> {
    let path = parent.child(name);
    let fd = match fs.openat(parent.fd(), name, DIR_FLAGS, 0) {
        Ok(fd) => fd,
        Err(Errno::NOENT) if create => {
            match fs.mkdirat(parent.fd(), name, layout::DIR_MODE) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(StorageError::io("mkdirat", &path, e)),
            }
            let fd = fs
                .openat(parent.fd(), name, DIR_FLAGS, 0)
                .map_err(|e| dir_open_error(fs, parent.fd(), name, &path, e))?;
            let meta = fs
                .fstat(fd.as_fd())
                .map_err(|e| StorageError::io("fstat", &path, e))?;
            // Verify before touching: a racing creator may have put something else there.
            check_dir(&path, &meta)?;
            if meta.mode != layout::DIR_MODE {
                fs.fchmod(fd.as_fd(), layout::DIR_MODE)
                    .map_err(|e| StorageError::io("fchmod", &path, e))?;
            }
            fsync_dir(fs, parent.path(), parent.fd())?;
            fd
        }
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(dir_open_error(fs, parent.fd(), name, &path, e)),
    };
    let meta = fs
        .fstat(fd.as_fd())
        .map_err(|e| StorageError::io("fstat", &path, e))?;
    check_dir(&path, &meta)?;
    Ok(Some(Dir { path, fd }))
}

/// What [`open_verified`] requires of a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileRules {
    /// Largest size allowed.
    pub max_size: u64,
    /// `Some(mode)`: the permission bits must be exactly this (log files: 0600). `None`: only
    /// `mode & 0o077 == 0`.
    pub exact_mode: Option<u32>,
    /// Also `fstatat(dir, name, NOFOLLOW)` and require the same dev/inode as the fd.
    pub same_inode: bool,
}

/// Opens `<dir>/<name>` with `flags | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC` and checks it: a
/// regular file, owned by the effective uid, no group/other bits (or exactly `exact_mode`), one
/// link, size ≤ `max_size`, and optionally the same inode as the path. `O_NONBLOCK` keeps a FIFO
/// planted at the name from blocking the open; it has no effect on the regular file the checks
/// prove, and a caller that hands the fd to another program clears it ([`clear_nonblock`]). A
/// missing file is `Ok(None)`.
///
/// # Errors
/// [`StorageError::UnsafeStorage`] naming the rule, or the failed call.
pub fn open_verified(
    fs: &dyn FileSystem,
    dir: &Dir,
    name: &str,
    flags: OFlags,
    rules: FileRules,
) -> Result<Option<(OwnedFd, Meta)>, StorageError> {
    let path = dir.child(name);
    let flags = flags | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC;
    let fd = match fs.openat(dir.fd(), name, flags, 0) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => {
            return Err(match open_rule(e) {
                Some(rule) => StorageError::unsafe_at(&path, rule),
                None => StorageError::io("openat", &path, e),
            });
        }
    };
    let meta = fs
        .fstat(fd.as_fd())
        .map_err(|e| StorageError::io("fstat", &path, e))?;
    check_file(&path, &meta, rules)?;
    if rules.same_inode {
        let by_path = fs
            .stat_nofollow(dir.fd(), name)
            .map_err(|e| StorageError::io("fstatat", &path, e))?;
        if (by_path.dev, by_path.ino) != (meta.dev, meta.ino) {
            return Err(StorageError::unsafe_at(&path, Rule::InodeChanged));
        }
    }
    Ok(Some((fd, meta)))
}

/// Clears the `O_NONBLOCK` that [`open_verified`] opened with, for an fd that leaves our hands
/// (the capture file becomes a user process's stdout).
///
/// # Errors
/// The failed `fcntl`.
pub fn clear_nonblock(
    fs: &dyn FileSystem,
    fd: BorrowedFd<'_>,
    path: &Path,
) -> Result<(), StorageError> {
    fs.clear_nonblock(fd)
        .map_err(|e| StorageError::io("fcntl", path, e))
}

/// The file checks of [`open_verified`], on a `fstat` result.
///
/// # Errors
/// [`StorageError::UnsafeStorage`] naming the first rule broken.
pub fn check_file(path: &Path, meta: &Meta, rules: FileRules) -> Result<(), StorageError> {
    let fail = |rule| Err(StorageError::unsafe_at(path, rule));
    match meta.kind {
        Kind::Regular => {}
        Kind::Symlink => return fail(Rule::Symlink),
        Kind::Directory | Kind::Other => return fail(Rule::NotRegular),
    }
    let uid = euid();
    if meta.uid != uid {
        return fail(Rule::Owner {
            expected: uid,
            found: meta.uid,
        });
    }
    let mode_ok = match rules.exact_mode {
        Some(mode) => meta.mode == mode,
        None => meta.mode & layout::GROUP_OTHER_BITS == 0,
    };
    if !mode_ok {
        return fail(Rule::Mode { found: meta.mode });
    }
    if meta.nlink != 1 {
        return fail(Rule::LinkCount { found: meta.nlink });
    }
    if meta.size > rules.max_size {
        return fail(Rule::TooLarge {
            size: meta.size,
            max: rules.max_size,
        });
    }
    Ok(())
}

/// Reads `<dir>/<name>` after the checks of [`open_verified`] (mode `& 0o077 == 0`, size ≤
/// `max`): exactly the `fstat` size, and nothing after it. The buffer is wiped on drop (records
/// hold lease tokens, receipts the completion capability). A missing file is `Ok(None)`.
///
/// # Errors
/// [`StorageError::UnsafeStorage`] or the failed call.
pub fn read_checked(
    fs: &dyn FileSystem,
    dir: &Dir,
    name: &str,
    max: usize,
) -> Result<Option<Zeroizing<Vec<u8>>>, StorageError> {
    let rules = FileRules {
        max_size: u64::try_from(max).unwrap_or(u64::MAX),
        exact_mode: None,
        same_inode: false,
    };
    let Some((fd, meta)) = open_verified(fs, dir, name, OFlags::RDONLY, rules)? else {
        return Ok(None);
    };
    let path = dir.child(name);
    let size = usize::try_from(meta.size).unwrap_or(usize::MAX).min(max);
    // One extra byte: a file that grew since fstat is noticed instead of silently cut.
    let mut buf = Zeroizing::new(vec![0u8; size + 1]);
    let mut filled = 0;
    loop {
        let n = fs
            .read(fd.as_fd(), &mut buf[filled..])
            .map_err(|e| StorageError::io("read", &path, e))?;
        if n == 0 {
            break;
        }
        filled += n;
        if filled > size {
            return Err(StorageError::unsafe_at(&path, Rule::ChangedWhileReading));
        }
    }
    if filled != size {
        return Err(StorageError::unsafe_at(&path, Rule::ChangedWhileReading));
    }
    buf.truncate(size);
    Ok(Some(buf))
}

fn fsync_dir(fs: &dyn FileSystem, path: &Path, fd: BorrowedFd<'_>) -> Result<(), StorageError> {
    fs.fsync(fd).map_err(|errno| StorageError::FsyncFailed {
        path: path.to_path_buf(),
        errno,
    })
}

/// Writes `bytes` to a fresh temp file next to `target` in `dir` and fsyncs it. Returns the
/// temp's name. On failure the temp is removed (best effort).
fn write_temp(
    fs: &dyn FileSystem,
    dir: &Dir,
    target: &str,
    bytes: &[u8],
    sync: Durability,
) -> Result<String, StorageError> {
    let mut random = [0u8; layout::TEMP_RANDOM_HEX / 2];
    fs.random(&mut random)
        .map_err(|e| StorageError::io("getrandom", &dir.child(target), e))?;
    let temp = layout::temp_file_name(target, &random);
    let temp_path = dir.child(&temp);
    let flags = OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = fs
        .openat(dir.fd(), &temp, flags, layout::FILE_MODE)
        .map_err(|e| StorageError::io("openat", &temp_path, e))?;
    let written = write_all(fs, fd.as_fd(), bytes)
        .map_err(|e| StorageError::io("write", &temp_path, e))
        .and_then(|()| match sync {
            Durability::Durable => {
                fs.fsync(fd.as_fd())
                    .map_err(|errno| StorageError::FsyncFailed {
                        path: temp_path.clone(),
                        errno,
                    })
            }
            Durability::ThisBoot => Ok(()),
        });
    drop(fd);
    match written {
        Ok(()) => Ok(temp),
        Err(e) => {
            let _ = fs.unlink(dir.fd(), &temp);
            Err(e)
        }
    }
}

fn write_all(fs: &dyn FileSystem, fd: BorrowedFd<'_>, mut bytes: &[u8]) -> Result<(), Errno> {
    while !bytes.is_empty() {
        match fs.write(fd, bytes)? {
            0 => return Err(Errno::IO),
            n => bytes = &bytes[n..],
        }
    }
    Ok(())
}

/// First publication of `<dir>/<target>` (see the module docs for the steps and the media
/// assumptions). An existing target is [`StorageError::AlreadyExists`] and stays untouched.
///
/// # Errors
/// [`StorageError::AlreadyExists`], [`StorageError::FsyncFailed`] (fatal), or the failed call;
/// in every error case the target was not created — except a failed final directory fsync,
/// after which it may or may not survive a crash (hence fatal), and, in the link fallback only,
/// a failed `unlinkat(temp)` after the link: the target then exists with two links, which every
/// read refuses (`Rule::LinkCount`) until the owner's next open sweeps the temp.
pub fn publish_new(
    fs: &dyn FileSystem,
    dir: &Dir,
    target: &str,
    bytes: &[u8],
) -> Result<(), StorageError> {
    publish_new_as(fs, dir, target, bytes, Durability::Durable)
}

/// [`publish_new`] without either fsync: the target appears at once to every process of this
/// boot (the page cache), whole or not at all (the rename), but a power loss or kernel crash
/// may lose it, or leave it empty or short. Only for a file that means nothing after a reboot
/// and whose reader treats a missing or garbled one as absent.
///
/// # Errors
/// [`StorageError::AlreadyExists`] or the failed call; the target was not created.
pub fn publish_new_unsynced(
    fs: &dyn FileSystem,
    dir: &Dir,
    target: &str,
    bytes: &[u8],
) -> Result<(), StorageError> {
    publish_new_as(fs, dir, target, bytes, Durability::ThisBoot)
}

/// Whether a publication is made durable.
#[derive(Clone, Copy)]
enum Durability {
    /// fsync of the temp and of the directory.
    Durable,
    /// No fsync: visible within this boot only.
    ThisBoot,
}

fn publish_new_as(
    fs: &dyn FileSystem,
    dir: &Dir,
    target: &str,
    bytes: &[u8],
    sync: Durability,
) -> Result<(), StorageError> {
    let target_path = dir.child(target);
    let temp = write_temp(fs, dir, target, bytes, sync)?;
    let linked = match fs.rename_noreplace(dir.fd(), &temp, dir.fd(), target) {
        Ok(()) => Ok(()),
        // The file system does not support RENAME_NOREPLACE: link + unlink, as the reference.
        Err(Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
            match fs.link(dir.fd(), &temp, dir.fd(), target) {
                Ok(()) => fs
                    .unlink(dir.fd(), &temp)
                    .map_err(|e| StorageError::io("unlinkat", &dir.child(&temp), e)),
                Err(e) => Err(link_error(&target_path, e)),
            }
        }
        Err(e) => Err(link_error(&target_path, e)),
    };
    if let Err(e) = linked {
        let _ = fs.unlink(dir.fd(), &temp);
        return Err(e);
    }
    match sync {
        Durability::Durable => fsync_dir(fs, dir.path(), dir.fd()),
        Durability::ThisBoot => Ok(()),
    }
}

fn link_error(path: &Path, errno: Errno) -> StorageError {
    if errno == Errno::EXIST {
        StorageError::AlreadyExists {
            path: path.to_path_buf(),
        }
    } else {
        StorageError::io("renameat2", path, errno)
    }
}

/// Atomic replacement of `<dir>/<target>` (see the module docs). The caller has checked its CAS
/// under the owner lock.
///
/// # Errors
/// [`StorageError::FsyncFailed`] (fatal) or the failed call. Before the rename the old content
/// stays in place; after it, only a failed directory fsync can be returned.
pub fn replace(
    fs: &dyn FileSystem,
    dir: &Dir,
    target: &str,
    bytes: &[u8],
) -> Result<(), StorageError> {
    let temp = write_temp(fs, dir, target, bytes, Durability::Durable)?;
    if let Err(e) = fs.rename(dir.fd(), &temp, dir.fd(), target) {
        let _ = fs.unlink(dir.fd(), &temp);
        return Err(StorageError::io("renameat", &dir.child(target), e));
    }
    fsync_dir(fs, dir.path(), dir.fd())
}

/// Removes `<dir>/<target>` and fsyncs `dir`. Returns whether it existed.
///
/// # Errors
/// [`StorageError::FsyncFailed`] (fatal) or the failed call.
pub fn remove(fs: &dyn FileSystem, dir: &Dir, target: &str) -> Result<bool, StorageError> {
    let removed = unlink(fs, dir, target)?;
    if removed {
        fsync_dir(fs, dir.path(), dir.fd())?;
    }
    Ok(removed)
}

/// Unlinks `target` in `dir` without syncing the directory: for a batch whose caller syncs the
/// directory once at the end ([`sync_dir`]). `false` when it did not exist.
///
/// # Errors
/// A failed `unlinkat` other than `ENOENT`.
pub fn unlink(fs: &dyn FileSystem, dir: &Dir, target: &str) -> Result<bool, StorageError> {
    match fs.unlink(dir.fd(), target) {
        Ok(()) => Ok(true),
        Err(Errno::NOENT) => Ok(false),
        Err(e) => Err(StorageError::io("unlinkat", &dir.child(target), e)),
    }
}

/// Fsyncs a directory, mapping failure to [`StorageError::FsyncFailed`].
///
/// # Errors
/// [`StorageError::FsyncFailed`] (fatal).
pub fn sync_dir(fs: &dyn FileSystem, dir: &Dir) -> Result<(), StorageError> {
    fsync_dir(fs, dir.path(), dir.fd())
}

/// One entry of a scanned directory, with its type resolved.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scanned {
    /// The name (always UTF-8; other names are foreign).
    pub name: String,
    /// Its type, never following a symlink.
    pub kind: Kind,
}

/// Lists `dir`, at most `max` entries (more is [`Rule::TooManyEntries`]); a non-UTF-8 name is a
/// [`Rule::ForeignEntry`]. Types missing from `d_type` are resolved with `fstatat(NOFOLLOW)`.
///
/// # Errors
/// [`StorageError::UnsafeStorage`] or the failed call.
pub fn scan_dir(fs: &dyn FileSystem, dir: &Dir, max: usize) -> Result<Vec<Scanned>, StorageError> {
    let entries = fs
        .read_dir(dir.fd(), max)
        .map_err(|e| StorageError::io("getdents", dir.path(), e))?;
    if entries.len() > max {
        return Err(StorageError::unsafe_at(
            dir.path(),
            Rule::TooManyEntries { max },
        ));
    }
    let mut out = Vec::with_capacity(entries.len());
    for entry in entries {
        let Ok(name) = std::str::from_utf8(&entry.name) else {
            let shown = dir.path().join(OsStr::from_bytes(&entry.name));
            return Err(StorageError::unsafe_at(&shown, Rule::ForeignEntry));
        };
        let kind = match entry.kind {
            Some(kind) => kind,
            None => {
                fs.stat_nofollow(dir.fd(), name)
                    .map_err(|e| StorageError::io("fstatat", &dir.child(name), e))?
                    .kind
            }
        };
        out.push(Scanned {
            name: name.to_owned(),
            kind,
        });
    }
    Ok(out)
}

/// Removes stale temp files of our own pattern (`.<target>.<32 hex>.tmp`) whose target
/// satisfies `ours`, then fsyncs `dir` if anything was removed. Only for directories whose
/// writers are all gone (the owner holds the lock, or the attempt is settled).
///
/// # Errors
/// [`StorageError::FsyncFailed`] (fatal) or the failed call.
pub fn sweep_temps(
    fs: &dyn FileSystem,
    dir: &Dir,
    entries: &[Scanned],
    ours: impl Fn(&str) -> bool,
) -> Result<usize, StorageError> {
    let mut removed = 0;
    for entry in entries {
        if entry.kind == Kind::Regular && layout::temp_target(&entry.name).is_some_and(&ours) {
            match fs.unlink(dir.fd(), &entry.name) {
                Ok(()) => removed += 1,
                Err(Errno::NOENT) => {}
                Err(e) => return Err(StorageError::io("unlinkat", &dir.child(&entry.name), e)),
            }
        }
    }
    if removed > 0 {
        fsync_dir(fs, dir.path(), dir.fd())?;
    }
    Ok(removed)
}
