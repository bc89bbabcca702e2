//! The offer journal: inbox records (`<root>/offers/<offerId>.rec`) and the pending claim
//! (`<root>/pending-claim`), under the owner lock.
//!
//! The driver makes no protocol decision here: every CAS rule is a core function
//! ([`ValidRecord::advance`], [`claim::check_create`], [`claim::check_replace`],
//! [`claim::check_clear`]) called on the record read under the lock; this module only does the
//! I/O around it, through the one recipe of [`crate::fsio`].
//!
//! Mutations take `&mut self`, so one `Journal` serializes them (the reference's promise queue);
//! the owner lock serializes processes. Reads take `&self`. The supervisor, which does not own
//! the root, reads with [`read_record_unlocked`].

use std::path::{Path, PathBuf};

use ql_worker_core::claim::{self, ClaimCreate, ClaimError, PendingClaim};
use ql_worker_core::envelope::{self, MAX_ENVELOPE_BYTES};
use ql_worker_core::ids::{OfferId, Revision};
use ql_worker_core::listing::{self, Capacity, Page, PageLimit};
use ql_worker_core::record::{InboxRecord, State, TransitionError, ValidRecord};
use ql_worker_core::retention::{self, ArchiveRefusal, RemovalRefused};
use ql_worker_core::time::UnixMillis;

use crate::fsio::{self, Dir, FileRules, FileSystem, Kind, RealFs, Rule, Scanned, StorageError};
use crate::layout::{self, DRAIN_FILE, SESSION_FILE};
use crate::lock::{self, LockError, OwnerLock};

/// Most entries the offers directory may hold: the hard capacity, plus room for temps.
pub const MAX_OFFERS_DIR_ENTRIES: usize = 2 * Capacity::MAX as usize + 64;
/// Most entries read from the root directory when sweeping its temps.
pub const MAX_ROOT_DIR_ENTRIES: usize = 4096;

/// A journal failure. Every variant names the path; none carries a lease token.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// Another live process owns the root (flock held).
    #[error(
        "state root already owned: {path} is locked by another live ql-worker process (flock); \
         only one owner per root"
    )]
    AlreadyOwned {
        /// The lock file.
        path: PathBuf,
    },
    /// Unsafe storage, a corrupt file, a failed call, or a fatal fsync failure.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The inbox holds `capacity` records; settled ones count until retention removes them.
    #[error("inbox at {path} is full: {capacity} records (capacity_exhausted)")]
    CapacityExhausted {
        /// The offers directory.
        path: PathBuf,
        /// The configured capacity.
        capacity: usize,
    },
    /// The record or claim does not exist.
    #[error("{path} does not exist")]
    NotFound {
        /// The file.
        path: PathBuf,
    },
    /// A first publication found the file already there (reference `offer_conflict` when the
    /// caller did not expect it); nothing was written.
    #[error("{path} already exists")]
    AlreadyExists {
        /// The file.
        path: PathBuf,
    },
    /// The core rejected the record update; nothing was written.
    #[error("record update refused for {path}: {source}")]
    Transition {
        /// The record.
        path: PathBuf,
        /// The core's reason.
        source: TransitionError,
    },
    /// The core rejected the claim operation; nothing was written.
    #[error("pending claim operation refused for {path}: {source}")]
    Claim {
        /// The claim file.
        path: PathBuf,
        /// The core's reason.
        source: ClaimError,
    },
    /// Retention asked to remove a record that is not settled; nothing was removed.
    #[error("refusing to remove {path}: state {state} is not settled")]
    NotSettled {
        /// The record.
        path: PathBuf,
        /// Its state.
        state: State,
    },
    /// The caller passed a value that cannot be stored as asked; nothing was written.
    #[error("refusing to write {path}: {rule}")]
    Refused {
        /// The target.
        path: PathBuf,
        /// Why.
        rule: &'static str,
    },
    /// An operator asked for something this record's state does not allow; nothing changed.
    #[error("refusing {action} {path}: {rule}")]
    NotAllowed {
        /// What was asked.
        action: &'static str,
        /// The record.
        path: PathBuf,
        /// The rule.
        rule: &'static str,
    },
    /// An operator asked to archive a record the core's archive rule does not allow
    /// ([`ql_worker_core::retention::archivable`]); nothing changed.
    #[error("refusing to archive {path}: {refusal}")]
    NotArchivable {
        /// The record.
        path: PathBuf,
        /// The core's reason.
        refusal: ArchiveRefusal,
    },
    /// The path is not a state root (no owner lock): nothing was created or written.
    #[error(
        "{path} is not a ql-worker state root (it has no {lock}); create one with \
         `ql-worker init --root {path}`"
    )]
    NotStateRoot {
        /// The directory.
        path: PathBuf,
        /// The owner lock's name.
        lock: &'static str,
    },
    /// The owner lock's path no longer names the file this process locked.
    #[error(
        "owner lock lost: {path} {what} since this Worker locked it, so the lock no longer keeps \
         another ql-worker process off this state root; stopping at once. Make sure no other \
         Worker runs on it, then start again"
    )]
    OwnerLockLost {
        /// The lock file.
        path: PathBuf,
        /// `was deleted` or `was replaced`.
        what: &'static str,
    },
}

impl JournalError {
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
            Self::AlreadyOwned { .. }
            | Self::CapacityExhausted { .. }
            | Self::NotFound { .. }
            | Self::AlreadyExists { .. }
            | Self::Transition { .. }
            | Self::Claim { .. }
            | Self::NotSettled { .. }
            | Self::Refused { .. }
            | Self::NotAllowed { .. }
            | Self::NotArchivable { .. }
            | Self::NotStateRoot { .. }
            | Self::OwnerLockLost { .. } => None,
        }
    }

    /// Whether an operator's request was refused by a rule (a usage error), not by storage.
    #[must_use]
    pub fn is_refusal(&self) -> bool {
        matches!(self, Self::NotAllowed { .. } | Self::NotArchivable { .. })
    }
}

impl From<LockError> for JournalError {
    fn from(e: LockError) -> Self {
        match e {
            LockError::AlreadyOwned { path } => Self::AlreadyOwned { path },
            LockError::Missing { path } => Self::NotStateRoot {
                path: path.parent().map(Path::to_path_buf).unwrap_or(path),
                lock: layout::LOCK_FILE,
            },
            LockError::Lost { path, what } => Self::OwnerLockLost { path, what },
            LockError::Storage(e) => Self::Storage(e),
        }
    }
}

/// Checks every entry of the root against the layout (`docs/storage.md`): a name this storage
/// never writes, or a known name of the wrong type (a symlink, a directory where a file belongs),
/// fails closed. Reads only.
///
/// # Errors
/// [`StorageError::UnsafeStorage`] naming the entry and the rule, or the failed call.
pub fn check_root_entries(fs: &dyn FileSystem, root: &Dir) -> Result<Vec<Scanned>, StorageError> {
    let entries = fsio::scan_dir(fs, root, MAX_ROOT_DIR_ENTRIES)?;
    check_entries(root, &entries)?;
    Ok(entries)
}

fn check_entries(root: &Dir, entries: &[Scanned]) -> Result<(), StorageError> {
    for entry in entries {
        let name = entry.name.as_str();
        let want_dir = matches!(
            name,
            layout::OFFERS_DIR | layout::RECEIPTS_DIR | layout::LOGS_DIR | ARCHIVE_DIR
        );
        let want_file = matches!(
            name,
            layout::LOCK_FILE | layout::PENDING_CLAIM_FILE | SESSION_FILE | DRAIN_FILE
        ) || layout::temp_target(name)
            .is_some_and(|t| t == layout::PENDING_CLAIM_FILE || t == SESSION_FILE);
        let rule = match entry.kind {
            Kind::Directory if want_dir => continue,
            Kind::Regular if want_file => continue,
            Kind::Symlink if want_dir || want_file => Rule::Symlink,
            _ if want_dir => Rule::NotDirectory,
            _ if want_file => Rule::NotRegular,
            _ => Rule::ForeignEntry,
        };
        return Err(StorageError::UnsafeStorage {
            path: root.child(name),
            rule,
        });
    }
    Ok(())
}

/// Opens an existing state root for an operator command: the root verified (never created),
/// every entry checked ([`check_root_entries`]) and the owner lock file present and verified.
///
/// # Errors
/// [`JournalError::NotFound`] (no such directory), [`JournalError::NotStateRoot`], unsafe
/// storage, or a failed call.
pub fn open_state_root(fs: &dyn FileSystem, root: &Path) -> Result<Dir, JournalError> {
    let dir = fsio::open_root(fs, root, false).map_err(|e| match e {
        StorageError::Io { errno, .. } if errno == rustix::io::Errno::NOENT => {
            JournalError::NotFound {
                path: root.to_path_buf(),
            }
        }
        other => JournalError::Storage(other),
    })?;
    let entries = fsio::scan_dir(fs, &dir, MAX_ROOT_DIR_ENTRIES)?;
    // A directory without the owner lock is not a state root, whatever else it holds (the
    // likelier mistake is a mistyped path than a tampered root).
    if !entries.iter().any(|e| e.name == layout::LOCK_FILE) {
        return Err(JournalError::NotStateRoot {
            path: root.to_path_buf(),
            lock: layout::LOCK_FILE,
        });
    }
    check_entries(&dir, &entries)?;
    let rules = FileRules {
        max_size: 0,
        exact_mode: None,
        same_inode: true,
    };
    fsio::open_verified(
        fs,
        &dir,
        layout::LOCK_FILE,
        rustix::fs::OFlags::RDONLY,
        rules,
    )?;
    Ok(dir)
}

/// Writes the drain request `<root>/drain` (`ql-worker drain`): the root must be a state root
/// ([`open_state_root`]); the file is created `O_CREAT|O_EXCL|O_NOFOLLOW` 0600 in the root's
/// descriptor, never truncated or followed; an existing request (a regular file of ours) is
/// left as it is. Returns the file's path and whether it was already there.
///
/// # Errors
/// As [`open_state_root`], an unsafe existing entry, or a failed call (an fsync failure is
/// [`StorageError::FsyncFailed`]).
pub fn request_drain(root: &Path) -> Result<(PathBuf, bool), JournalError> {
    let fs = RealFs;
    let dir = open_state_root(&fs, root)?;
    let path = dir.child(DRAIN_FILE);
    let flags = rustix::fs::OFlags::WRONLY
        | rustix::fs::OFlags::CREATE
        | rustix::fs::OFlags::EXCL
        | rustix::fs::OFlags::NOFOLLOW
        | rustix::fs::OFlags::CLOEXEC;
    match fs.openat(dir.fd(), DRAIN_FILE, flags, layout::FILE_MODE) {
        Ok(fd) => {
            // The umask can only clear bits; the mode is exactly 0600 already.
            drop(fd);
            fsio::sync_dir(&fs, &dir)?;
            Ok((path, false))
        }
        Err(rustix::io::Errno::EXIST) => {
            let rules = FileRules {
                max_size: 0,
                exact_mode: None,
                same_inode: true,
            };
            fsio::open_verified(&fs, &dir, DRAIN_FILE, rustix::fs::OFlags::RDONLY, rules)?;
            Ok((path, true))
        }
        Err(errno) => Err(StorageError::Io {
            op: "openat",
            path,
            errno,
        }
        .into()),
    }
}

/// The owned offer journal.
#[derive(Debug)]
pub struct Journal<F: FileSystem = RealFs> {
    fs: F,
    root: Dir,
    offers: Dir,
    capacity: Capacity,
    lock: OwnerLock,
}

impl Journal<RealFs> {
    /// Opens the journal at `root` with the real file system (see [`Journal::open_with`]).
    ///
    /// # Errors
    /// See [`Journal::open_with`].
    pub fn open(root: &Path, capacity: Capacity) -> Result<Self, JournalError> {
        Self::open_with(RealFs, root, capacity)
    }
}

impl<F: FileSystem> Journal<F> {
    /// Opens the journal: verifies (creating 0700 when missing) the root, checks that the root
    /// holds nothing foreign ([`check_root_entries`]; fail closed, before anything is created),
    /// takes the owner lock (a second owner fails at once with [`JournalError::AlreadyOwned`]),
    /// verifies (creating) `offers/`, checks that `offers/` holds nothing foreign, and only then
    /// removes stale temp files of our own name pattern left by a crash.
    ///
    /// # Errors
    /// [`JournalError::AlreadyOwned`], unsafe storage, or a failed call.
    pub fn open_with(fs: F, root: &Path, capacity: Capacity) -> Result<Self, JournalError> {
        Self::open_inner(fs, root, capacity, true)
    }

    /// As [`Journal::open_with`] for a state root that must already exist (an operator command
    /// such as `recover --archive`): nothing is created, not the root, not the owner lock file,
    /// not `offers/`.
    ///
    /// # Errors
    /// [`JournalError::NotFound`] (no such directory, or no `offers/`),
    /// [`JournalError::NotStateRoot`], [`JournalError::AlreadyOwned`], unsafe storage, or a
    /// failed call.
    pub fn open_existing_with(
        fs: F,
        root: &Path,
        capacity: Capacity,
    ) -> Result<Self, JournalError> {
        Self::open_inner(fs, root, capacity, false)
    }

    fn open_inner(
        fs: F,
        root_path: &Path,
        capacity: Capacity,
        create: bool,
    ) -> Result<Self, JournalError> {
        // Nothing foreign in the root, checked before anything is created in it.
        let root = if create {
            let root = fsio::open_root(&fs, root_path, true)?;
            check_root_entries(&fs, &root)?;
            root
        } else {
            open_state_root(&fs, root_path)?
        };
        let lock = lock::acquire(&fs, &root, create)?;
        let Some(offers) = open_offers(&fs, &root, create)? else {
            return Err(JournalError::NotFound {
                path: root.child(layout::OFFERS_DIR),
            });
        };
        let entries = scan_offers(&fs, &offers)?;
        fsio::sweep_temps(&fs, &offers, &entries.entries, |target| {
            layout::parse_record_file_name(target).is_some()
        })?;
        let root_entries = check_root_entries(&fs, &root)?;
        fsio::sweep_temps(&fs, &root, &root_entries, |target| {
            target == layout::PENDING_CLAIM_FILE || target == SESSION_FILE
        })?;
        Ok(Self {
            fs,
            root,
            offers,
            capacity,
            lock,
        })
    }

    /// The root.
    #[must_use]
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// The configured capacity.
    #[must_use]
    pub fn capacity(&self) -> Capacity {
        self.capacity
    }

    /// The held owner lock.
    #[must_use]
    pub fn owner_lock(&self) -> &OwnerLock {
        &self.lock
    }

    /// Re-checks the owner lock: `<root>/.owner.lock` must still name the inode this process
    /// locked. A lock file deleted or replaced by hand no longer keeps a second owner out
    /// (`flock` is on the inode), so the caller must stop.
    ///
    /// # Errors
    /// [`JournalError::OwnerLockLost`], or a failed call.
    pub fn check_owner_lock(&self) -> Result<(), JournalError> {
        Ok(self.lock.verify(&self.fs, &self.root)?)
    }

    /// Whether `<root>/drain` asks for a drain: a regular file of ours (checked without
    /// following a link). Anything else at that name is unsafe storage.
    ///
    /// # Errors
    /// [`StorageError::UnsafeStorage`] for a symlink, directory or foreign file there, or a
    /// failed call.
    pub fn drain_requested(&self) -> Result<bool, JournalError> {
        let path = self.root.child(DRAIN_FILE);
        let meta = match self.fs.stat_nofollow(self.root.fd(), DRAIN_FILE) {
            Ok(meta) => meta,
            Err(rustix::io::Errno::NOENT) => return Ok(false),
            Err(errno) => {
                return Err(StorageError::Io {
                    op: "fstatat",
                    path,
                    errno,
                }
                .into());
            }
        };
        let rules = FileRules {
            max_size: 0,
            exact_mode: None,
            same_inode: false,
        };
        fsio::check_file(&path, &meta, rules)?;
        Ok(true)
    }

    /// Removes the drain request (`unlinkat` in the root, never following a link); whether
    /// there was one.
    ///
    /// # Errors
    /// A failed call ([`StorageError::FsyncFailed`] is fatal).
    pub fn clear_drain_request(&mut self) -> Result<bool, JournalError> {
        Ok(fsio::remove(&self.fs, &self.root, DRAIN_FILE)?)
    }

    /// The seam, for tests and the benchmark.
    #[must_use]
    pub fn fs(&self) -> &F {
        &self.fs
    }

    /// Reads one record with the full checks (`None` when absent).
    ///
    /// # Errors
    /// Unsafe storage, a corrupt record, or a failed call.
    pub fn read_record(&self, offer_id: &OfferId) -> Result<Option<InboxRecord>, JournalError> {
        read_record_in(&self.fs, &self.offers, offer_id)
    }

    /// First publication of a record at revision 0: fails with
    /// [`JournalError::AlreadyExists`] when the offer already has a record and with
    /// [`JournalError::CapacityExhausted`] when the inbox is full (every record counts).
    ///
    /// # Errors
    /// As above, unsafe storage (including a foreign entry in `offers/`), or a failed call;
    /// [`JournalError::is_fatal`] for an fsync failure.
    pub fn publish_record(&mut self, record: &InboxRecord) -> Result<(), JournalError> {
        let offer_id = &record.offer.offer_id;
        let name = layout::record_file_name(offer_id);
        let path = self.offers.child(&name);
        if record.revision != Revision::FIRST {
            return Err(JournalError::Refused {
                path,
                rule: "a first publication must be revision 0",
            });
        }
        let ids = scan_offers(&self.fs, &self.offers)?.ids;
        if ids.contains(offer_id) {
            return Err(JournalError::AlreadyExists { path });
        }
        if !self.capacity.admits_one_more(ids.len()) {
            return Err(JournalError::CapacityExhausted {
                path: self.offers.path().to_path_buf(),
                capacity: self.capacity.get(),
            });
        }
        let bytes = envelope::encode(record).map_err(|source| StorageError::Unencodable {
            path: path.clone(),
            source,
        })?;
        fsio::publish_new(&self.fs, &self.offers, &name, &bytes).map_err(|e| match e {
            StorageError::AlreadyExists { path } => JournalError::AlreadyExists { path },
            other => JournalError::Storage(other),
        })
    }

    /// Replaces a record: reads the stored one under the owner lock, asks the core
    /// ([`ValidRecord::advance`], the rules of `check_transition`) whether `stored → proposed`
    /// at `expected_revision` is allowed, and only then writes (temp → fsync → rename → dir
    /// fsync).
    ///
    /// # Errors
    /// [`JournalError::NotFound`], [`JournalError::Transition`] (nothing written), unsafe
    /// storage, a corrupt stored record, or a failed call; [`JournalError::is_fatal`] for an
    /// fsync failure.
    pub fn replace_record(
        &mut self,
        offer_id: &OfferId,
        proposed: &InboxRecord,
        expected_revision: Revision,
    ) -> Result<(), JournalError> {
        let name = layout::record_file_name(offer_id);
        let path = self.offers.child(&name);
        if proposed.offer.offer_id != *offer_id {
            return Err(JournalError::Refused {
                path,
                rule: "the proposed record must carry the offer id it replaces",
            });
        }
        let Some(stored) = read_valid_record_in(&self.fs, &self.offers, offer_id)? else {
            return Err(JournalError::NotFound { path });
        };
        // The stored record was validated once, when decoded; the proposed one is its checked
        // successor (same revision, byte for byte), so neither is digested again.
        let next = stored
            .advance(proposed.clone(), expected_revision)
            .map_err(|source| JournalError::Transition {
                path: path.clone(),
                source,
            })?;
        let bytes = envelope::encode_record(&next).map_err(|source| StorageError::Unencodable {
            path: path.clone(),
            source,
        })?;
        fsio::replace(&self.fs, &self.offers, &name, &bytes)?;
        Ok(())
    }

    /// Removes a settled record (`completion_acknowledged`, `start_failure_acknowledged`) at
    /// `expected_revision`; used by retention. The core's [`retention::check_removal`] decides on
    /// the record read under the lock: a stale revision or a live record is never removed.
    ///
    /// # Errors
    /// [`JournalError::NotSettled`], [`JournalError::Transition`] for a stale revision,
    /// [`JournalError::NotFound`], unsafe storage, or a failed call.
    pub fn remove_settled_record(
        &mut self,
        offer_id: &OfferId,
        expected_revision: Revision,
    ) -> Result<(), JournalError> {
        let mut removed = Vec::with_capacity(1);
        self.remove_settled_records(&[(offer_id.clone(), expected_revision)], &mut removed)
    }

    /// [`Journal::remove_settled_record`] for a batch, with one fsync of `offers/` at the end
    /// instead of one per record (a first retention sweep may remove hundreds: on a slow disk
    /// that was seconds before the first Pull). Nothing depends on a removal being durable
    /// before the next: a removal a crash undoes leaves a settled record, which the next sweep
    /// removes again. Each removed id is pushed to `removed` as it goes; on an error, what was
    /// unlinked before it is still synced (and stays removed).
    ///
    /// # Errors
    /// The first error of [`Journal::remove_settled_record`]'s kinds; a failed directory fsync
    /// (fatal) takes precedence.
    pub fn remove_settled_records(
        &mut self,
        batch: &[(OfferId, Revision)],
        removed: &mut Vec<OfferId>,
    ) -> Result<(), JournalError> {
        let first = removed.len();
        let mut outcome = Ok(());
        for (offer_id, expected_revision) in batch {
            match self.unlink_settled_record(offer_id, *expected_revision) {
                Ok(()) => removed.push(offer_id.clone()),
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        if removed.len() > first {
            fsio::sync_dir(&self.fs, &self.offers)?;
        }
        outcome
    }

    /// One record of [`Journal::remove_settled_records`]: checked under the lock, its published
    /// handle removed (synced), the record unlinked (not synced).
    fn unlink_settled_record(
        &mut self,
        offer_id: &OfferId,
        expected_revision: Revision,
    ) -> Result<(), JournalError> {
        let name = layout::record_file_name(offer_id);
        let path = self.offers.child(&name);
        let Some(stored) = read_record_in(&self.fs, &self.offers, offer_id)? else {
            return Err(JournalError::NotFound { path });
        };
        retention::check_removal(&stored, expected_revision).map_err(|refused| match refused {
            RemovalRefused::StaleRevision { expected, found } => JournalError::Transition {
                path,
                source: TransitionError::StaleRevision { expected, found },
            },
            RemovalRefused::NotSettled(state) => JournalError::NotSettled { path, state },
        })?;
        // The handle its supervisor published (issue 16) goes first, durably: a crash in
        // between leaves the record, and the next sweep removes both.
        let attempt = &stored.offer.candidate.attempt_id;
        crate::receipts::remove_handle_with(&self.fs, self.root.path(), attempt).map_err(|e| {
            match e {
                crate::receipts::ReceiptStoreError::Storage(e) => JournalError::Storage(e),
                crate::receipts::ReceiptStoreError::AlreadyExists { .. }
                | crate::receipts::ReceiptStoreError::AttemptMismatch { .. }
                | crate::receipts::ReceiptStoreError::QuarantineOccupied { .. }
                | crate::receipts::ReceiptStoreError::NotFound { .. } => JournalError::Refused {
                    path: layout::Paths::new(self.root.path()).published_handle(attempt),
                    rule: "the attempt's published handle could not be removed",
                },
            }
        })?;
        fsio::unlink(&self.fs, &self.offers, &name)?;
        Ok(())
    }

    /// One keyset page of offer ids: ascending, strictly after `after`, at most `limit` (≤ 64),
    /// with the next cursor only when more remain. Any foreign entry in `offers/` fails closed.
    ///
    /// # Errors
    /// Unsafe storage or a failed call.
    pub fn list(&self, after: Option<&OfferId>, limit: PageLimit) -> Result<Page, JournalError> {
        let ids = scan_offers(&self.fs, &self.offers)?.ids;
        Ok(listing::page(ids, after, limit))
    }

    /// How many records the inbox holds (settled ones included).
    ///
    /// # Errors
    /// Unsafe storage or a failed call.
    pub fn len(&self) -> Result<usize, JournalError> {
        Ok(scan_offers(&self.fs, &self.offers)?.ids.len())
    }

    /// Whether the inbox is empty.
    ///
    /// # Errors
    /// Unsafe storage or a failed call.
    pub fn is_empty(&self) -> Result<bool, JournalError> {
        Ok(self.len()? == 0)
    }

    /// Reads the pending claim (`None` when there is none).
    ///
    /// # Errors
    /// Unsafe storage, a corrupt claim, or a failed call.
    pub fn read_claim(&self) -> Result<Option<PendingClaim>, JournalError> {
        read_claim_in(&self.fs, &self.root)
    }

    /// Creates the pending claim after [`claim::check_create`]: idempotent for an identical
    /// claim ([`ClaimCreate::AlreadyExists`], nothing written), a conflict for another one.
    ///
    /// # Errors
    /// [`JournalError::Claim`] (nothing written), unsafe storage, or a failed call.
    pub fn create_claim(&mut self, proposed: &PendingClaim) -> Result<ClaimCreate, JournalError> {
        let path = self.root.child(layout::PENDING_CLAIM_FILE);
        let existing = read_claim_in(&self.fs, &self.root)?;
        let outcome = claim::check_create(existing.as_ref(), proposed).map_err(|source| {
            JournalError::Claim {
                path: path.clone(),
                source,
            }
        })?;
        match outcome {
            ClaimCreate::AlreadyExists => Ok(outcome),
            ClaimCreate::Publish => {
                let bytes =
                    envelope::encode(proposed).map_err(|source| StorageError::Unencodable {
                        path: path.clone(),
                        source,
                    })?;
                fsio::publish_new(&self.fs, &self.root, layout::PENDING_CLAIM_FILE, &bytes)
                    .map_err(|e| match e {
                        StorageError::AlreadyExists { path } => JournalError::Claim {
                            path,
                            source: ClaimError::Conflict,
                        },
                        other => JournalError::Storage(other),
                    })?;
                Ok(outcome)
            }
        }
    }

    /// Replaces the pending claim after [`claim::check_replace`] on the stored one.
    ///
    /// # Errors
    /// [`JournalError::NotFound`], [`JournalError::Claim`] (nothing written), unsafe storage, or
    /// a failed call.
    pub fn replace_claim(
        &mut self,
        proposed: &PendingClaim,
        expected_revision: Revision,
    ) -> Result<(), JournalError> {
        let path = self.root.child(layout::PENDING_CLAIM_FILE);
        let Some(stored) = read_claim_in(&self.fs, &self.root)? else {
            return Err(JournalError::NotFound { path });
        };
        claim::check_replace(&stored, proposed, expected_revision).map_err(|source| {
            JournalError::Claim {
                path: path.clone(),
                source,
            }
        })?;
        let bytes = envelope::encode(proposed).map_err(|source| StorageError::Unencodable {
            path: path.clone(),
            source,
        })?;
        fsio::replace(&self.fs, &self.root, layout::PENDING_CLAIM_FILE, &bytes)?;
        Ok(())
    }

    /// Clears the pending claim after [`claim::check_clear`] (unlink → dir fsync).
    ///
    /// # Errors
    /// [`JournalError::NotFound`], [`JournalError::Claim`] (nothing removed), unsafe storage, or
    /// a failed call.
    pub fn clear_claim(
        &mut self,
        offer_id: &OfferId,
        revision: Revision,
    ) -> Result<(), JournalError> {
        let path = self.root.child(layout::PENDING_CLAIM_FILE);
        let Some(stored) = read_claim_in(&self.fs, &self.root)? else {
            return Err(JournalError::NotFound { path });
        };
        claim::check_clear(&stored, offer_id, revision)
            .map_err(|source| JournalError::Claim { path, source })?;
        fsio::remove(&self.fs, &self.root, layout::PENDING_CLAIM_FILE)?;
        Ok(())
    }
}

/// A read-only view of an inbox for operators (`ql-worker inbox`, `ql-worker recover`): the
/// same file checks as the journal, no owner lock (reads never need it), no writes, no temp
/// sweeping. Works while a Worker owns the root.
#[derive(Debug)]
pub struct InboxView {
    root: Dir,
    offers: Dir,
}

impl InboxView {
    /// Opens the state root `root` read-only ([`open_state_root`]); `Ok(None)` when it has no
    /// `offers/` directory yet.
    ///
    /// # Errors
    /// [`JournalError::NotFound`] (no such directory), [`JournalError::NotStateRoot`], unsafe
    /// storage (symlinks, modes, owners, foreign entries, in the root too) or a failed call.
    pub fn open(root: &Path) -> Result<Option<Self>, JournalError> {
        let root = open_state_root(&RealFs, root)?;
        let offers = open_offers(&RealFs, &root, false)?;
        Ok(offers.map(|offers| Self { root, offers }))
    }

    /// The pending claim, if any (read-only; a corrupt or unsafe one is an error naming the
    /// file and the rule).
    ///
    /// # Errors
    /// Unsafe storage, a corrupt claim, or a failed call.
    pub fn read_claim(&self) -> Result<Option<PendingClaim>, JournalError> {
        read_claim_in(&RealFs, &self.root)
    }

    /// One keyset page of offer ids.
    ///
    /// # Errors
    /// Unsafe storage or a failed call.
    pub fn list(&self, after: Option<&OfferId>, limit: PageLimit) -> Result<Page, JournalError> {
        let ids = scan_offers(&RealFs, &self.offers)?.ids;
        Ok(listing::page(ids, after, limit))
    }

    /// One record.
    ///
    /// # Errors
    /// Unsafe storage, a corrupt record, or a failed call.
    pub fn read(&self, offer_id: &OfferId) -> Result<Option<InboxRecord>, JournalError> {
        read_record_lockless(&RealFs, &self.offers, offer_id)
    }
}

/// Reads one record with the full checks and **no lock**: the supervisor uses it for its spawn
/// barrier while the Worker holds the lock. Safe against a concurrent replace: a rename swaps
/// whole inodes, so the read sees the old record or the new one. Nothing is created.
///
/// # Errors
/// [`JournalError::NotFound`] when the root, `offers/` or the record is missing; unsafe storage,
/// a corrupt record, or a failed call.
pub fn read_record_unlocked(root: &Path, offer_id: &OfferId) -> Result<InboxRecord, JournalError> {
    read_record_unlocked_with(&RealFs, root, offer_id)
}

/// [`read_record_unlocked`] through a given seam.
///
/// # Errors
/// See [`read_record_unlocked`].
pub fn read_record_unlocked_with(
    fs: &dyn FileSystem,
    root: &Path,
    offer_id: &OfferId,
) -> Result<InboxRecord, JournalError> {
    let paths = layout::Paths::new(root);
    let root_dir = fsio::open_root(fs, root, false).map_err(|e| match e {
        StorageError::Io { errno, .. } if errno == rustix::io::Errno::NOENT => {
            JournalError::NotFound {
                path: root.to_path_buf(),
            }
        }
        other => JournalError::Storage(other),
    })?;
    let Some(offers) = open_offers(fs, &root_dir, false)? else {
        return Err(JournalError::NotFound {
            path: paths.offers(),
        });
    };
    read_record_lockless(fs, &offers, offer_id)?.ok_or_else(|| JournalError::NotFound {
        path: paths.record(offer_id),
    })
}

/// Opens that found no link left before a lockless read gives up (each is a fresh open).
const UNLINKED_RETRIES: usize = 16;

/// [`read_record_in`] for a reader without the owner lock. The owner's replace renames a new
/// inode over the name; a reader that opened the old one just before sees `nlink == 0` at its
/// `fstat`. That is not unsafe storage but a lost race, so it opens the name again (bounded:
/// every retry means the owner wrote in between, and the owner writes each record rarely).
fn read_record_lockless(
    fs: &dyn FileSystem,
    offers: &Dir,
    offer_id: &OfferId,
) -> Result<Option<InboxRecord>, JournalError> {
    let mut tries = 0;
    loop {
        match read_record_in(fs, offers, offer_id) {
            Err(JournalError::Storage(StorageError::UnsafeStorage {
                rule: Rule::LinkCount { found: 0 },
                ..
            })) if tries < UNLINKED_RETRIES => tries += 1,
            other => return other,
        }
    }
}

fn open_offers(fs: &dyn FileSystem, root: &Dir, create: bool) -> Result<Option<Dir>, StorageError> {
    fsio::open_subdir(fs, root, layout::OFFERS_DIR, create)
}

fn read_record_in(
    fs: &dyn FileSystem,
    offers: &Dir,
    offer_id: &OfferId,
) -> Result<Option<InboxRecord>, JournalError> {
    Ok(read_valid_record_in(fs, offers, offer_id)?.map(ValidRecord::into_inner))
}

/// One record, decoded with every check (its revision validated this once).
fn read_valid_record_in(
    fs: &dyn FileSystem,
    offers: &Dir,
    offer_id: &OfferId,
) -> Result<Option<ValidRecord>, JournalError> {
    let name = layout::record_file_name(offer_id);
    let Some(bytes) = fsio::read_checked(fs, offers, &name, MAX_ENVELOPE_BYTES)? else {
        return Ok(None);
    };
    let path = offers.child(&name);
    let record = envelope::decode_record(&bytes).map_err(|source| StorageError::Corrupt {
        path: path.clone(),
        source,
    })?;
    if record.offer.offer_id != *offer_id {
        return Err(StorageError::UnsafeStorage {
            path,
            rule: Rule::NameMismatch,
        }
        .into());
    }
    Ok(Some(record))
}

fn read_claim_in(fs: &dyn FileSystem, root: &Dir) -> Result<Option<PendingClaim>, JournalError> {
    let name = layout::PENDING_CLAIM_FILE;
    let Some(bytes) = fsio::read_checked(fs, root, name, MAX_ENVELOPE_BYTES)? else {
        return Ok(None);
    };
    let claim = envelope::decode(&bytes).map_err(|source| StorageError::Corrupt {
        path: root.child(name),
        source,
    })?;
    Ok(Some(claim))
}

struct OffersScan {
    ids: Vec<OfferId>,
    entries: Vec<Scanned>,
}

/// Lists `offers/` and fails closed on anything that is neither a record (`<offerId>.rec`, a
/// regular file) nor a temp of ours for a record (`.<offerId>.rec.<32 hex>.tmp`, regular).
fn scan_offers(fs: &dyn FileSystem, offers: &Dir) -> Result<OffersScan, StorageError> {
    let entries = fsio::scan_dir(fs, offers, MAX_OFFERS_DIR_ENTRIES)?;
    let mut ids = Vec::with_capacity(entries.len());
    for entry in &entries {
        let unsafe_entry = |rule| StorageError::UnsafeStorage {
            path: offers.child(&entry.name),
            rule,
        };
        let is_temp = layout::temp_target(&entry.name)
            .is_some_and(|target| layout::parse_record_file_name(target).is_some());
        let record = layout::parse_record_file_name(&entry.name);
        match (entry.kind, record, is_temp) {
            (Kind::Regular, Some(id), _) => ids.push(id),
            (Kind::Regular, None, true) => {}
            (Kind::Symlink, Some(_), _) => return Err(unsafe_entry(Rule::Symlink)),
            (Kind::Directory | Kind::Other, Some(_), _) => {
                return Err(unsafe_entry(Rule::NotRegular));
            }
            (Kind::Regular | Kind::Directory | Kind::Symlink | Kind::Other, None, _) => {
                return Err(unsafe_entry(Rule::ForeignEntry));
            }
        }
    }
    Ok(OffersScan { ids, entries })
}

/// Directory (in the state root) that keeps records an operator archived.
pub use crate::layout::ARCHIVE_DIR;

/// Moves one reviewed record out of the inbox into `<root>/archive/` (`ql-worker recover
/// --archive`): a `recovery_required` record, or a dormant one (before the spawn barrier with
/// its lease expired at `now`: nothing ran and nothing can start); the rule is the core's
/// [`retention::archivable`]. Takes the owner lock, so the Worker must be
/// stopped; refuses any other record. The attempt's receipt goes first (it holds the completion
/// capability, and no completion follows an archive: a crash after it leaves the record in the
/// inbox, to be archived again), then the rename, then an fsync of both directories. Retention
/// removes the archived record `max_settled_age_ms` after this, and its log `log_keep_ms`
/// after the log was last written.
///
/// # Errors
/// [`JournalError`]: another owner, no such record, a record in another state, an occupied
/// archive slot, or storage.
pub fn archive_record(
    root: &Path,
    offer_id: &OfferId,
    now: UnixMillis,
) -> Result<PathBuf, JournalError> {
    let journal = Journal::open_existing_with(
        RealFs,
        root,
        Capacity::new(u64::from(Capacity::MAX)).unwrap_or_default(),
    )?;
    let name = layout::record_file_name(offer_id);
    let path = journal.offers.child(&name);
    let Some(record) = journal.read_record(offer_id)? else {
        return Err(JournalError::NotAllowed {
            action: "to archive",
            path,
            rule: "there is no such record in the inbox",
        });
    };
    retention::archivable(&record, now)
        .map_err(|refusal| JournalError::NotArchivable { path, refusal })?;
    let fs = &journal.fs;
    let archive = fsio::open_subdir(fs, &journal.root, ARCHIVE_DIR, true)?.ok_or_else(|| {
        StorageError::Io {
            op: "mkdirat",
            path: journal.root.child(ARCHIVE_DIR),
            errno: rustix::io::Errno::NOENT,
        }
    })?;
    let target = archive.child(&name);
    match fs.stat_nofollow(archive.fd(), &name) {
        Err(rustix::io::Errno::NOENT) => {}
        Ok(_) => return Err(JournalError::AlreadyExists { path: target }),
        Err(errno) => {
            return Err(StorageError::Io {
                op: "fstatat",
                path: target,
                errno,
            }
            .into());
        }
    }
    let attempt = &record.offer.candidate.attempt_id;
    crate::receipts::remove_with(fs, root, attempt).map_err(|e| match e {
        crate::receipts::ReceiptStoreError::Storage(e) => JournalError::Storage(e),
        crate::receipts::ReceiptStoreError::AlreadyExists { .. }
        | crate::receipts::ReceiptStoreError::AttemptMismatch { .. }
        | crate::receipts::ReceiptStoreError::QuarantineOccupied { .. }
        | crate::receipts::ReceiptStoreError::NotFound { .. } => JournalError::Refused {
            path: layout::Paths::new(root).receipt(attempt),
            rule: "the attempt's receipt could not be removed: inspect it before archiving",
        },
    })?;
    fs.rename_noreplace(journal.offers.fd(), &name, archive.fd(), &name)
        .map_err(|errno| StorageError::Io {
            op: "renameat",
            path: target.clone(),
            errno,
        })?;
    fsio::sync_dir(fs, &archive)?;
    fsio::sync_dir(fs, &journal.offers)?;
    Ok(target)
}
