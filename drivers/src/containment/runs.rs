//! The runs area of `[run_as]`: a directory outside the state root, owned by the Worker's uid
//! with mode `0711` (the run user may traverse it but not list or change it), holding one
//! directory per live Run:
//!
//! ```text
//! <runs_dir>/                  0711, owned by the Worker's uid
//!   <offerId>/                 0700, owned by the Run's uid:gid — the default working directory
//!     tmp/                     0700, owned by the Run's uid:gid — TMPDIR
//! ```
//!
//! The supervisor creates a Run's directory after its spawn barrier and removes it once the user
//! process and every descendant are gone, before it publishes the receipt. The Worker's
//! housekeeping removes what a killed supervisor left behind ([`sweep`]). With a `uid_range`,
//! the supervisor allocates the Run's uid under an `flock` of the runs area: a uid is free when
//! no entry of the area is owned by it and no process runs with it.

use std::fs;
use std::os::fd::{AsFd as _, OwnedFd};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use rustix::fs::{FlockOperation, Mode, OFlags};
use rustix::io::Errno;

use super::identity::RunIdentity;

/// Mode of the runs area.
pub const AREA_MODE: u32 = 0o711;
/// Mode of a Run's directory and of its `tmp`.
pub const RUN_DIR_MODE: u32 = 0o700;
/// The Run's `TMPDIR`, inside its directory.
pub const TMP_DIR: &str = "tmp";

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Creates the runs area if it is missing (`0711`) and checks it: a directory (not a symlink),
/// owned by this uid, mode exactly `0711`; every directory above it owned by root or this uid and
/// not writable by group or other unless sticky (so nobody else can swap it).
///
/// # Errors
/// A message naming the path and the rule.
pub fn prepare_area(runs_dir: &Path) -> Result<(), String> {
    let show = runs_dir.display();
    let mut ancestor = runs_dir.parent();
    while let Some(dir) = ancestor {
        let meta = fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let writable_by_others = meta.mode() & 0o022 != 0 && meta.mode() & 0o1000 == 0;
        if (meta.uid() != 0 && meta.uid() != euid()) || writable_by_others {
            return Err(format!(
                "{}: every directory above the runs area must be owned by root or uid {} and \
                 not writable by group or other (unless sticky), found uid {} mode {:04o}",
                dir.display(),
                euid(),
                meta.uid(),
                meta.mode() & 0o7777
            ));
        }
        ancestor = dir.parent();
    }
    let fd = match rustix::fs::open(runs_dir, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => {
            rustix::fs::mkdir(runs_dir, Mode::from_raw_mode(AREA_MODE))
                .map_err(|e| format!("{show}: cannot create the runs area: {e}"))?;
            let fd = rustix::fs::open(runs_dir, DIR_FLAGS, Mode::empty())
                .map_err(|e| format!("{show}: {e}"))?;
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(AREA_MODE))
                .map_err(|e| format!("{show}: {e}"))?;
            fd
        }
        Err(Errno::NOTDIR | Errno::LOOP) => {
            return Err(format!(
                "{show}: the runs area must be a directory, not a symlink"
            ));
        }
        Err(e) => return Err(format!("{show}: {e}")),
    };
    check_area(&fd).map_err(|rule| format!("{show}: {rule}"))
}

fn check_area(fd: &OwnedFd) -> Result<(), String> {
    let st = rustix::fs::fstat(fd).map_err(|e| e.to_string())?;
    let mode = st.st_mode & 0o7777;
    if st.st_uid != euid() || mode != AREA_MODE {
        return Err(format!(
            "the runs area must be owned by uid {} with mode 0711, found uid {} mode {mode:04o}",
            euid(),
            st.st_uid
        ));
    }
    Ok(())
}

/// A Run's directory, created by the supervisor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunDir {
    /// `<runs_dir>/<offerId>`.
    pub path: PathBuf,
    /// The Run's uid.
    pub uid: u32,
    /// The Run's gid.
    pub gid: u32,
}

impl RunDir {
    /// `TMPDIR`.
    #[must_use]
    pub fn tmp(&self) -> PathBuf {
        self.path.join(TMP_DIR)
    }
}

/// uids in use by a process (real, effective, saved or filesystem), from `/proc/*/status`.
fn uids_in_use(proc_root: &Path) -> Vec<u32> {
    let mut uids = Vec::new();
    let Ok(entries) = fs::read_dir(proc_root) else {
        return uids;
    };
    for entry in entries.flatten() {
        if !entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let Ok(status) = fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        if let Some(line) = status.lines().find_map(|l| l.strip_prefix("Uid:")) {
            uids.extend(
                line.split_ascii_whitespace()
                    .filter_map(|u| u.parse::<u32>().ok()),
            );
        }
    }
    uids
}

/// Creates `<runs_dir>/<name>` and its `tmp` for one Run, owned by the Run's identity
/// (allocating a uid from a range under an `flock` of the area). Returns the directory.
///
/// # Errors
/// Any failure: the caller refuses the launch (no user process exists yet).
pub fn create_run_dir(runs_dir: &Path, name: &str, identity: RunIdentity) -> Result<RunDir, Errno> {
    let area = rustix::fs::open(runs_dir, DIR_FLAGS, Mode::empty())?;
    check_area(&area).map_err(|_| Errno::PERM)?;
    let (uid, gid) = match identity {
        RunIdentity::Fixed { uid, gid } => (uid, gid),
        RunIdentity::Range { first, count, gid } => {
            rustix::fs::flock(&area, FlockOperation::LockExclusive)?;
            let mut taken = uids_in_use(Path::new("/proc"));
            for entry in fs::read_dir(runs_dir).map_err(|_| Errno::IO)?.flatten() {
                if let Ok(meta) = entry.path().symlink_metadata() {
                    taken.push(meta.uid());
                }
            }
            // Start at a point derived from the name, so uids are not reused in lockstep.
            let start = name
                .bytes()
                .fold(0u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
            let uid = (0..count)
                .map(|i| first + (start.wrapping_add(i) % count))
                .find(|uid| !taken.contains(uid))
                .ok_or(Errno::AGAIN)?;
            (uid, gid.unwrap_or(uid))
        }
    };
    // An existing entry is never touched (it is another Run's, or a leftover): refuse.
    rustix::fs::mkdirat(&area, name, Mode::from_raw_mode(RUN_DIR_MODE))?;
    let made = own(&area, name, uid, gid).and_then(|dir| {
        rustix::fs::mkdirat(&dir, TMP_DIR, Mode::from_raw_mode(RUN_DIR_MODE))?;
        own(&dir, TMP_DIR, uid, gid)
    });
    // The lock (if any) ends with the descriptor.
    drop(area);
    if let Err(e) = made {
        let _ = fs::remove_dir_all(runs_dir.join(name));
        return Err(e);
    }
    Ok(RunDir {
        path: runs_dir.join(name),
        uid,
        gid,
    })
}

/// Opens the directory we just made (never following a link) and gives it to the Run: mode
/// first, while it is still ours (changing the mode of another's file would need
/// `CAP_FOWNER`), then the owner.
fn own(parent: &OwnedFd, name: &str, uid: u32, gid: u32) -> Result<OwnedFd, Errno> {
    let dir = rustix::fs::openat(parent.as_fd(), name, DIR_FLAGS, Mode::empty())?;
    rustix::fs::fchmod(&dir, Mode::from_raw_mode(RUN_DIR_MODE))?;
    rustix::fs::fchown(
        &dir,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
    )?;
    Ok(dir)
}

/// Removes a Run's directory and everything in it (std's `remove_dir_all` never follows a
/// symlink the Run left behind; the area itself is not writable by the run user, so the entry
/// cannot be swapped).
///
/// # Errors
/// The I/O error.
pub fn remove_run_dir(run_dir: &RunDir) -> std::io::Result<()> {
    match fs::remove_dir_all(&run_dir.path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

/// Removes the Run directories of `runs_dir` that `keep` does not claim (their Run is settled or
/// gone: a supervisor killed before it could clean up). Returns how many were removed.
pub fn sweep(runs_dir: &Path, keep: impl Fn(&str) -> bool) -> usize {
    let Ok(entries) = fs::read_dir(runs_dir) else {
        return 0;
    };
    let mut removed = 0;
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if keep(&name) {
            continue;
        }
        let is_dir = entry.path().symlink_metadata().is_ok_and(|m| m.is_dir());
        let gone = if is_dir {
            fs::remove_dir_all(entry.path())
        } else {
            fs::remove_file(entry.path())
        };
        if gone.is_ok() {
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn area() -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o711)).unwrap();
        let runs = dir.path().join("runs");
        (dir, runs)
    }

    #[test]
    fn the_area_is_created_0711_and_a_wrong_one_is_refused() {
        let (_dir, runs) = area();
        prepare_area(&runs).unwrap();
        let meta = fs::metadata(&runs).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o711);
        prepare_area(&runs).unwrap();
        fs::set_permissions(&runs, fs::Permissions::from_mode(0o755)).unwrap();
        let err = prepare_area(&runs).unwrap_err();
        assert!(err.contains("mode 0711"), "{err}");
        fs::remove_dir(&runs).unwrap();
        std::os::unix::fs::symlink("/tmp", &runs).unwrap();
        let err = prepare_area(&runs).unwrap_err();
        assert!(err.contains("not a symlink"), "{err}");
    }

    #[test]
    fn an_ancestor_writable_by_others_is_refused() {
        let (dir, _) = area();
        let open = dir.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let err = prepare_area(&open.join("runs")).unwrap_err();
        assert!(err.contains("not writable by group or other"), "{err}");
    }

    #[test]
    fn run_dirs_are_owned_by_the_run_and_uids_of_a_range_are_not_shared() {
        if euid() != 0 {
            return; // chown needs root; CI runs as root.
        }
        let (_dir, runs) = area();
        prepare_area(&runs).unwrap();
        let fixed = create_run_dir(
            &runs,
            "offer-a",
            RunIdentity::Fixed {
                uid: 65534,
                gid: 65534,
            },
        )
        .unwrap();
        let meta = fs::metadata(fixed.tmp()).unwrap();
        assert_eq!(
            (meta.uid(), meta.gid(), meta.mode() & 0o7777),
            (65534, 65534, 0o700)
        );
        assert_eq!(
            create_run_dir(
                &runs,
                "offer-a",
                RunIdentity::Fixed {
                    uid: 65534,
                    gid: 65534
                }
            ),
            Err(Errno::EXIST)
        );
        let range = RunIdentity::Range {
            first: 3_900_000,
            count: 2,
            gid: None,
        };
        let one = create_run_dir(&runs, "offer-b", range).unwrap();
        let two = create_run_dir(&runs, "offer-c", range).unwrap();
        assert_ne!(one.uid, two.uid);
        assert_eq!(one.gid, one.uid);
        assert_eq!(
            create_run_dir(&runs, "offer-d", range),
            Err(Errno::AGAIN),
            "range exhausted"
        );
        remove_run_dir(&one).unwrap();
        assert!(!one.path.exists());
        let three = create_run_dir(&runs, "offer-d", range).unwrap();
        assert_eq!(three.uid, one.uid, "a freed uid is reused");
        let removed = sweep(&runs, |name| name == "offer-a");
        assert_eq!(removed, 2);
        assert!(fixed.path.exists() && !two.path.exists() && !three.path.exists());
    }
}
