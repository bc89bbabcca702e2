//! The owner lock: `flock(LOCK_EX|LOCK_NB)` on `<root>/.owner.lock`, held for the process's life.
//!
//! # Why this replaces the reference's refreshed lock directory
//!
//! The reference (`proper-lockfile`) creates a lock *directory* and refreshes its mtime on a
//! timer; another process treats the lock as stale when the mtime is older than 30 s, and the
//! owner must notice "compromise" (a late refresh, a replaced mtime) and stop. That design has
//! to guess: a paused or overloaded owner (SIGSTOP, swap storm, a VM freeze longer than the
//! stale time) loses its lock while still running, and a dead owner blocks a restart for up to
//! 30 s. It also needs a timer in the runtime, which this project does not have (SPEC §3).
//!
//! `flock` is held by the kernel on the open file description: it is released exactly when the
//! last fd for it is closed, which includes the owner's death by any signal, and never while the
//! owner lives. There is nothing to refresh, nothing stale to guess, no compromise state. The
//! lock file is opened `O_CLOEXEC`, so a spawned supervisor does not inherit the lock and a
//! dead Worker's lock is released even while its supervisors still run (the restarted Worker
//! recovers them from their records). Local file systems only; NFS is out of scope, as in the
//! reference (ADR-0021 §4).
//!
//! The lock file itself is verified like every file in the root (regular, owner, mode, one
//! link); its content is unused.

use std::os::fd::{AsFd as _, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::OFlags;
use rustix::io::Errno;

use crate::fsio::{self, Dir, FileRules, FileSystem, StorageError};
use crate::layout;

/// The held owner lock. Dropping it (or the process dying) releases it.
#[derive(Debug)]
pub struct OwnerLock {
    fd: OwnedFd,
    path: PathBuf,
}

impl OwnerLock {
    /// The lock file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checks that `<root>/.owner.lock` still names the inode this lock holds. `flock` locks the
    /// inode, not the name: once the file is deleted or replaced, another process creates and
    /// locks a new one and becomes a second owner, so a mismatch means stop.
    ///
    /// # Errors
    /// [`LockError::Lost`], or a failed call.
    pub fn verify(&self, fs: &dyn FileSystem, root: &Dir) -> Result<(), LockError> {
        let held = fs
            .fstat(self.fd.as_fd())
            .map_err(|errno| StorageError::Io {
                op: "fstat",
                path: self.path.clone(),
                errno,
            })?;
        match fs.stat_nofollow(root.fd(), layout::LOCK_FILE) {
            Ok(named) if (named.dev, named.ino) == (held.dev, held.ino) => Ok(()),
            Ok(_) => Err(LockError::Lost {
                path: self.path.clone(),
                what: "was replaced",
            }),
            Err(Errno::NOENT) => Err(LockError::Lost {
                path: self.path.clone(),
                what: "was deleted",
            }),
            Err(errno) => Err(StorageError::Io {
                op: "fstatat",
                path: self.path.clone(),
                errno,
            }
            .into()),
        }
    }
}

/// Why the lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process (or another `Journal` in this one) owns the root.
    #[error(
        "state root already owned: {path} is locked by another live ql-worker process (flock); \
         only one owner per root"
    )]
    AlreadyOwned {
        /// The lock file.
        path: PathBuf,
    },
    /// The lock file does not exist and was not to be created (not a state root).
    #[error("{path} does not exist: not a ql-worker state root")]
    Missing {
        /// The lock file.
        path: PathBuf,
    },
    /// The lock file's path no longer names the locked inode ([`OwnerLock::verify`]).
    #[error("owner lock lost: {path} {what} since it was locked")]
    Lost {
        /// The lock file.
        path: PathBuf,
        /// `was deleted` or `was replaced`.
        what: &'static str,
    },
    /// The lock file is unsafe or could not be opened.
    #[error(transparent)]
    Storage(#[from] StorageError),
}

/// Opens (with `create`, creating 0600 if missing) and verifies `<root>/.owner.lock`, then takes
/// `flock(LOCK_EX|LOCK_NB)` on it. Fails at once if another owner holds it.
///
/// # Errors
/// [`LockError::AlreadyOwned`], [`LockError::Missing`] (without `create`), or an unsafe/failed
/// lock file.
pub fn acquire(fs: &dyn FileSystem, root: &Dir, create: bool) -> Result<OwnerLock, LockError> {
    let path = root.child(layout::LOCK_FILE);
    let flags = OFlags::RDWR | OFlags::CREATE;
    let created = if create {
        fs.openat(
            root.fd(),
            layout::LOCK_FILE,
            flags | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            layout::FILE_MODE,
        )
    } else {
        Err(Errno::EXIST)
    };
    match created {
        // Created by us: make it durable so an operator sees it; content stays empty.
        Ok(fd) => {
            drop(fd);
            fsio::sync_dir(fs, root)?;
        }
        Err(Errno::EXIST) => {}
        Err(e) => {
            return Err(StorageError::Io {
                op: "openat",
                path,
                errno: e,
            }
            .into());
        }
    }
    let rules = FileRules {
        max_size: 0,
        exact_mode: None,
        same_inode: true,
    };
    let Some((fd, _)) = fsio::open_verified(fs, root, layout::LOCK_FILE, OFlags::RDWR, rules)?
    else {
        if !create {
            return Err(LockError::Missing { path });
        }
        return Err(StorageError::Io {
            op: "openat",
            path,
            errno: Errno::NOENT,
        }
        .into());
    };
    match fs.lock_exclusive(fd.as_fd()) {
        Ok(()) => Ok(OwnerLock { fd, path }),
        Err(Errno::WOULDBLOCK) => Err(LockError::AlreadyOwned { path }),
        Err(e) => Err(StorageError::Io {
            op: "flock",
            path,
            errno: e,
        }
        .into()),
    }
}
