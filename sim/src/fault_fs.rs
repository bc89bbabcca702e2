//! The fault-injecting file seam: a [`FileSystem`] that counts calls and fails the Nth (the
//! `fault-fs` feature of this crate, which the drivers' tests and benches enable).

use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::OFlags;
use rustix::io::Errno;

use ql_worker::fsio::{Entry, FileSystem, Meta, RealFs, Space};

/// When [`FaultFs`] fails calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FaultPlan {
    /// The 1-based call number that fails first.
    pub nth: u64,
    /// The errno returned.
    pub errno: Errno,
    /// Whether every later call fails too (a dead disk) or only the Nth (a transient fault).
    pub sticky: bool,
}

/// A seam wrapper that counts calls and fails the Nth with a chosen errno. With no plan it only
/// counts, which the benchmark uses to report fsyncs per update.
///
/// A test and benchmark tool: it keeps a trace of every call name until the next
/// [`FaultFs::arm`], so it is not meant for long-lived production use.
///
/// The injected failure happens *instead of* the call, so nothing reached the disk for it. (A
/// real EIO from fsync may have written some pages; that case is covered by the rule that an
/// fsync error is fatal and by the crash test, which kills at arbitrary points.)
///
/// It lives in this test crate, never in the `ql-worker` binary; the production crate keeps only
/// the seam ([`FileSystem`]).
#[derive(Debug)]
pub struct FaultFs<F: FileSystem = RealFs> {
    inner: F,
    plan: Mutex<Option<FaultPlan>>,
    calls: AtomicU64,
    fsyncs: AtomicU64,
    trace: Mutex<Vec<&'static str>>,
}

impl<F: FileSystem> FaultFs<F> {
    /// Wraps `inner`, counting only.
    pub fn new(inner: F) -> Self {
        Self {
            inner,
            plan: Mutex::new(None),
            calls: AtomicU64::new(0),
            fsyncs: AtomicU64::new(0),
            trace: Mutex::new(Vec::new()),
        }
    }

    /// Sets (or clears) the fault plan and restarts the call count at zero.
    pub fn arm(&self, plan: Option<FaultPlan>) {
        *self
            .plan
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = plan;
        self.calls.store(0, Ordering::SeqCst);
        self.fsyncs.store(0, Ordering::SeqCst);
        self.trace
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clear();
    }

    /// Calls made since the last [`Self::arm`].
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }

    /// fsync calls made since the last [`Self::arm`].
    pub fn fsyncs(&self) -> u64 {
        self.fsyncs.load(Ordering::SeqCst)
    }

    /// The names of the calls made since the last [`Self::arm`], in order.
    pub fn trace(&self) -> Vec<&'static str> {
        self.trace
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    fn gate(&self, op: &'static str) -> Result<(), Errno> {
        let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if op == "fsync" {
            self.fsyncs.fetch_add(1, Ordering::SeqCst);
        }
        self.trace
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(op);
        let plan = *self
            .plan
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match plan {
            Some(p) if n == p.nth || (p.sticky && n > p.nth) => Err(p.errno),
            Some(_) | None => Ok(()),
        }
    }
}

impl<F: FileSystem> FileSystem for FaultFs<F> {
    fn open(&self, path: &Path, flags: OFlags, mode: u32) -> Result<OwnedFd, Errno> {
        self.gate("open")?;
        self.inner.open(path, flags, mode)
    }
    fn mkdir(&self, path: &Path, mode: u32) -> Result<(), Errno> {
        self.gate("mkdir")?;
        self.inner.mkdir(path, mode)
    }
    fn openat(
        &self,
        dir: BorrowedFd<'_>,
        name: &str,
        flags: OFlags,
        mode: u32,
    ) -> Result<OwnedFd, Errno> {
        self.gate("openat")?;
        self.inner.openat(dir, name, flags, mode)
    }
    fn mkdirat(&self, dir: BorrowedFd<'_>, name: &str, mode: u32) -> Result<(), Errno> {
        self.gate("mkdirat")?;
        self.inner.mkdirat(dir, name, mode)
    }
    fn fstat(&self, fd: BorrowedFd<'_>) -> Result<Meta, Errno> {
        self.gate("fstat")?;
        self.inner.fstat(fd)
    }
    fn stat_nofollow(&self, dir: BorrowedFd<'_>, name: &str) -> Result<Meta, Errno> {
        self.gate("statat")?;
        self.inner.stat_nofollow(dir, name)
    }
    fn fstatvfs(&self, fd: BorrowedFd<'_>) -> Result<Space, Errno> {
        self.gate("fstatvfs")?;
        self.inner.fstatvfs(fd)
    }
    fn fchmod(&self, fd: BorrowedFd<'_>, mode: u32) -> Result<(), Errno> {
        self.gate("fchmod")?;
        self.inner.fchmod(fd, mode)
    }
    fn clear_nonblock(&self, fd: BorrowedFd<'_>) -> Result<(), Errno> {
        self.gate("fcntl")?;
        self.inner.clear_nonblock(fd)
    }
    fn read(&self, fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
        self.gate("read")?;
        self.inner.read(fd, buf)
    }
    fn write(&self, fd: BorrowedFd<'_>, buf: &[u8]) -> Result<usize, Errno> {
        self.gate("write")?;
        self.inner.write(fd, buf)
    }
    fn fsync(&self, fd: BorrowedFd<'_>) -> Result<(), Errno> {
        self.gate("fsync")?;
        self.inner.fsync(fd)
    }
    fn rename(
        &self,
        old_dir: BorrowedFd<'_>,
        old: &str,
        new_dir: BorrowedFd<'_>,
        new: &str,
    ) -> Result<(), Errno> {
        self.gate("renameat")?;
        self.inner.rename(old_dir, old, new_dir, new)
    }
    fn rename_noreplace(
        &self,
        old_dir: BorrowedFd<'_>,
        old: &str,
        new_dir: BorrowedFd<'_>,
        new: &str,
    ) -> Result<(), Errno> {
        self.gate("renameat2")?;
        self.inner.rename_noreplace(old_dir, old, new_dir, new)
    }
    fn link(
        &self,
        old_dir: BorrowedFd<'_>,
        old: &str,
        new_dir: BorrowedFd<'_>,
        new: &str,
    ) -> Result<(), Errno> {
        self.gate("linkat")?;
        self.inner.link(old_dir, old, new_dir, new)
    }
    fn unlink(&self, dir: BorrowedFd<'_>, name: &str) -> Result<(), Errno> {
        self.gate("unlinkat")?;
        self.inner.unlink(dir, name)
    }
    fn read_dir(&self, dir: BorrowedFd<'_>, max: usize) -> Result<Vec<Entry>, Errno> {
        self.gate("getdents")?;
        self.inner.read_dir(dir, max)
    }
    fn lock_exclusive(&self, fd: BorrowedFd<'_>) -> Result<(), Errno> {
        self.gate("flock")?;
        self.inner.lock_exclusive(fd)
    }
    fn random(&self, buf: &mut [u8]) -> Result<(), Errno> {
        self.gate("getrandom")?;
        self.inner.random(buf)
    }
}
