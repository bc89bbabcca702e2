//! The effects of one Worker: performs each [`Action`] of the core and reports the fact as an
//! [`Outcome`]. It makes no protocol decision: every `if` below is about mapping an I/O result
//! to the fact the core asked for.
//!
//! Fatal facts (an fsync that failed, so durability is unknown) of the journal become
//! [`StoreFailure::Uncertain`] and the core halts; fatal facts of the other stores end the
//! Worker here ([`HostError::Fatal`]) — never retried.

use std::fmt;
use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use ql_worker_core::io::{
    Action, HttpFailure, LaunchPlan, Outcome, ReceiptRead, SpawnOutcome, StoreFailure,
};
use ql_worker_core::wire::auth::WorkerCredential;
use zeroize::{Zeroize as _, Zeroizing};

use crate::config::check_secret_file;
use crate::https::{HttpsClient, JsonCaps, TransportError};
use crate::journal::{Journal, JournalError};
use crate::receipts::{self, ReceiptStoreError};
use crate::spool::{self, SpoolError, SpoolPolicy};
use crate::supervisor::{Executor, Launch, StopController};

/// Largest credential file read.
const MAX_CREDENTIAL_BYTES: u64 = 1024;

/// The effects could not continue.
#[derive(Debug)]
pub enum HostError {
    /// A durability fact is unknown (an fsync failed outside the journal): stop now.
    Fatal(String),
}

impl fmt::Display for HostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fatal(detail) => write!(f, "fatal storage fault: {detail}"),
        }
    }
}

impl std::error::Error for HostError {}

/// Reads the `ql3w_…` credential file (regular, owned, 0600) and returns the `Authorization`
/// header value. The file is re-read on every call, so a rotated credential is picked up; every
/// buffer that held the secret is wiped.
///
/// # Errors
/// A message naming the file and the rule.
pub fn authorization(path: &Path) -> Result<Zeroizing<String>, String> {
    check_secret_file(path, "credential file")?;
    let mut file =
        fs::File::open(path).map_err(|e| format!("credential file {}: {e}", path.display()))?;
    let mut text = Zeroizing::new(String::new());
    file.by_ref()
        .take(MAX_CREDENTIAL_BYTES + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("credential file {}: {e}", path.display()))?;
    if text.len() as u64 > MAX_CREDENTIAL_BYTES {
        return Err(format!(
            "credential file {}: larger than {MAX_CREDENTIAL_BYTES} bytes",
            path.display()
        ));
    }
    let mut header = Zeroizing::new(String::from("Worker "));
    header.push_str(text.trim());
    let credential = WorkerCredential::parse_header(&header).map_err(|e| {
        format!(
            "credential file {}: must hold ql3w_<credentialId>_<43 base64url characters>: {e}",
            path.display()
        )
    })?;
    header.zeroize();
    Ok(credential.header_value())
}

/// What the driver observed, for operators and the demo (never a secret).
#[derive(Debug)]
pub enum Event<'a> {
    /// A record is durable in this state.
    Persisted(&'a ql_worker_core::record::InboxRecord),
    /// A log was uploaded.
    Uploaded {
        /// Log id.
        log_artifact_id: &'a ql_worker_core::ids::LogArtifactId,
        /// Bytes sent.
        bytes: u64,
        /// SHA-256 of what was sent.
        sha256: &'a ql_worker_core::ids::Sha256Digest,
    },
}

/// The Worker's effects.
pub struct Host<E: Executor> {
    root: PathBuf,
    journal: Journal,
    spool: SpoolPolicy,
    client: HttpsClient,
    credential_file: PathBuf,
    executor: E,
    stopper: StopController,
    observer: Box<dyn FnMut(&Event<'_>)>,
    stall_after: Option<StallPoint>,
}

/// Where the crash-test hook `QL_WORKER_FAULT_STALL_AFTER` stops the Worker answering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StallPoint {
    /// After the first record persisted in this state.
    Persisted(ql_worker_core::record::State),
    /// After the first spawn the supervisor reported `started`, before the outcome reaches the
    /// core: the user process runs while its record is still `launching`.
    Spawned,
}

impl StallPoint {
    /// The hook's value for the spawn moment.
    pub const SPAWNED: &'static str = "spawned";

    /// Parses a hook value: a record state's name or [`Self::SPAWNED`].
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        if name == Self::SPAWNED {
            return Some(Self::Spawned);
        }
        ql_worker_core::record::State::ALL
            .into_iter()
            .find(|s| s.as_str() == name)
            .map(Self::Persisted)
    }
}

/// Never answers again (the crash-test hook's stall).
fn stall_forever() -> ! {
    loop {
        std::thread::sleep(std::time::Duration::from_secs(3600));
    }
}

impl<E: Executor> fmt::Debug for Host<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Host")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl<E: Executor> Host<E> {
    /// Assembles the effects. The journal must already hold the owner lock.
    pub fn new(
        journal: Journal,
        spool: SpoolPolicy,
        client: HttpsClient,
        credential_file: PathBuf,
        executor: E,
        stopper: StopController,
    ) -> Self {
        Self {
            root: journal.root().to_path_buf(),
            journal,
            spool,
            client,
            credential_file,
            executor,
            stopper,
            observer: Box::new(|_| {}),
            stall_after: None,
        }
    }

    /// Crash-test hook: at `point`, never answer again (the Worker hangs there until it is
    /// killed). See `QL_WORKER_FAULT_STALL_AFTER` in `docs/operations.md`; never set in
    /// production.
    pub fn stall_after(&mut self, point: Option<StallPoint>) {
        self.stall_after = point;
    }

    /// Installs an observer of persisted records and uploads.
    pub fn observe(&mut self, observer: Box<dyn FnMut(&Event<'_>)>) {
        self.observer = observer;
    }

    /// The journal (for retention sweeps between commands).
    pub fn journal_mut(&mut self) -> &mut Journal {
        &mut self.journal
    }

    /// The executor (to reap finished supervisors).
    pub fn executor_mut(&mut self) -> &mut E {
        &mut self.executor
    }

    /// Performs one action and reports its fact.
    ///
    /// # Errors
    /// [`HostError::Fatal`] when durability is unknown outside the journal.
    pub fn perform(&mut self, action: Action) -> Result<Outcome, HostError> {
        Ok(match action {
            Action::ListInbox { after, limit } => self.list(after.as_ref(), limit),
            Action::ReadRecord { offer_id } => match self.journal.read_record(&offer_id) {
                Ok(record) => Outcome::RecordRead(record.map(Box::new)),
                Err(e) => Outcome::Store(journal_failure(&e)),
            },
            Action::PersistRecord { expected, record } => {
                let result = match expected {
                    None => self.journal.publish_record(&record),
                    Some(revision) => {
                        self.journal
                            .replace_record(&record.offer.offer_id, &record, revision)
                    }
                };
                match result {
                    Ok(()) => {
                        (self.observer)(&Event::Persisted(&record));
                        if self.stall_after == Some(StallPoint::Persisted(record.state)) {
                            stall_forever();
                        }
                        Outcome::Persisted
                    }
                    Err(e) => Outcome::Store(journal_failure(&e)),
                }
            }
            Action::ReadClaim => match self.journal.read_claim() {
                Ok(claim) => Outcome::ClaimRead(claim.map(Box::new)),
                Err(e) => Outcome::Store(journal_failure(&e)),
            },
            Action::PersistClaim { expected, claim } => {
                let result = match expected {
                    None => self.journal.create_claim(&claim).map(|_| ()),
                    Some(revision) => self.journal.replace_claim(&claim, revision),
                };
                result.map_or_else(
                    |e| Outcome::Store(journal_failure(&e)),
                    |()| Outcome::Persisted,
                )
            }
            Action::ClearClaim { offer_id, revision } => {
                match self.journal.clear_claim(&offer_id, revision) {
                    Ok(()) => Outcome::Persisted,
                    Err(e) => Outcome::Store(journal_failure(&e)),
                }
            }
            Action::ReadReceipt { attempt_id } => match receipts::read(&self.root, &attempt_id) {
                Ok(Some(receipt)) => Outcome::ReceiptRead(ReceiptRead::Present(receipt)),
                Ok(None) => Outcome::ReceiptRead(ReceiptRead::Absent),
                Err(e) => Outcome::ReceiptRead(receipt_failure(&e)),
            },
            Action::RemoveReceipt { attempt_id } => match receipts::remove(&self.root, &attempt_id)
            {
                Ok(existed) => Outcome::ReceiptRemoved { existed },
                Err(e) if e.is_fatal() => return Err(HostError::Fatal(e.to_string())),
                Err(_) => Outcome::Store(StoreFailure::Unchanged),
            },
            Action::AllocateLog { log_artifact_id } => {
                match spool::allocate(&self.root, &log_artifact_id, self.spool) {
                    Ok(()) => Outcome::LogAllocated,
                    Err(e) if e.is_fatal() => return Err(HostError::Fatal(e.to_string())),
                    Err(_) => Outcome::LogUnavailable,
                }
            }
            Action::InspectLog { log_artifact_id } => {
                match spool::open_reader(&self.root, &log_artifact_id, self.spool) {
                    Ok(reader) => Outcome::LogInspected {
                        byte_length: reader.len(),
                        truncated: reader.truncation,
                    },
                    Err(e) => spool_failure(&e),
                }
            }
            Action::Post(call) => {
                let caps = JsonCaps::default()
                    .request_cap(call.request_cap)
                    .and_then(|c| c.response_cap(call.response_cap));
                let Ok(caps) = caps else {
                    return Ok(Outcome::Http(HttpFailure::Unavailable));
                };
                match authorization(&self.credential_file) {
                    Ok(auth) => match self.client.post_json(&call.path, &auth, &call.body, caps) {
                        Ok(body) => Outcome::Responded(body),
                        Err(e) => Outcome::Http(http_failure(e)),
                    },
                    Err(_) => Outcome::Http(HttpFailure::Unavailable),
                }
            }
            Action::UploadLog {
                path,
                log_artifact_id,
                header,
                byte_length,
                response_cap,
            } => self.upload(&path, &log_artifact_id, &header, byte_length, response_cap),
            Action::Spawn(plan) => {
                let quota = self.spool.maximum_attempt_bytes;
                let launch = Launch::from_core(*plan, quota);
                let outcome: SpawnOutcome = self.executor.start(launch).into();
                if self.stall_after == Some(StallPoint::Spawned)
                    && matches!(outcome, SpawnOutcome::Started { .. })
                {
                    stall_forever();
                }
                Outcome::Spawned(outcome)
            }
            Action::Stop { handle } => Outcome::Stopped(self.stopper.stop(handle.as_str()).into()),
            Action::DrawEntropy => match crate::os::entropy() {
                Ok(entropy) => Outcome::EntropyDrawn(entropy),
                Err(e) => return Err(HostError::Fatal(format!("getrandom: {e}"))),
            },
            Action::PersistSession { session_id } => {
                match crate::session_store::replace(&self.root, &session_id) {
                    Ok(_) => Outcome::Persisted,
                    // An fsync failed: whether the new id is durable is unknown (the core halts).
                    Err(crate::session_store::SessionStoreError::Storage(e)) if e.is_fatal() => {
                        Outcome::Store(StoreFailure::Uncertain)
                    }
                    Err(_) => Outcome::Store(StoreFailure::Unchanged),
                }
            }
        })
    }

    fn list(
        &mut self,
        after: Option<&ql_worker_core::ids::OfferId>,
        limit: ql_worker_core::listing::PageLimit,
    ) -> Outcome {
        let page = match self.journal.list(after, limit) {
            Ok(page) => page,
            Err(e) => return Outcome::Store(journal_failure(&e)),
        };
        let mut records = Vec::with_capacity(page.offer_ids.len());
        for offer_id in &page.offer_ids {
            match self.journal.read_record(offer_id) {
                Ok(Some(record)) => records.push(record),
                // A listed record vanished: only this process writes the inbox, so the store is
                // not behaving as a single-owner store.
                Ok(None) => return Outcome::Store(StoreFailure::Unsafe),
                Err(e) => return Outcome::Store(journal_failure(&e)),
            }
        }
        Outcome::InboxListed {
            records,
            next_after: page.next_after,
        }
    }

    fn upload(
        &mut self,
        path: &str,
        log_artifact_id: &ql_worker_core::ids::LogArtifactId,
        header: &[u8],
        byte_length: u64,
        response_cap: usize,
    ) -> Outcome {
        let mut reader = match spool::open_reader(&self.root, log_artifact_id, self.spool) {
            Ok(reader) => reader,
            Err(e) => return spool_failure(&e),
        };
        if reader.len() != byte_length {
            return Outcome::LogUnavailable;
        }
        let Ok(auth) = authorization(&self.credential_file) else {
            return Outcome::Http(HttpFailure::Unavailable);
        };
        match self
            .client
            .post_artifact(path, &auth, header, &mut reader, byte_length, response_cap)
        {
            Ok((body, report)) => {
                let sha256 = ql_worker_core::ids::Sha256Digest::from_bytes(report.sha256);
                (self.observer)(&Event::Uploaded {
                    log_artifact_id,
                    bytes: report.bytes_sent,
                    sha256: &sha256,
                });
                Outcome::Uploaded {
                    body,
                    sent_bytes: report.bytes_sent,
                    sent_sha256: sha256,
                }
            }
            Err(e) => Outcome::Http(http_failure(e)),
        }
    }
}

/// Journal errors as the core's storage facts.
#[must_use]
pub fn journal_failure(error: &JournalError) -> StoreFailure {
    if error.is_fatal() {
        return StoreFailure::Uncertain;
    }
    if error.unsafe_rule().is_some() {
        return StoreFailure::Unsafe;
    }
    match error {
        JournalError::CapacityExhausted { .. } => StoreFailure::CapacityExhausted,
        JournalError::Transition { .. }
        | JournalError::Claim { .. }
        | JournalError::AlreadyExists { .. }
        | JournalError::NotFound { .. }
        | JournalError::AlreadyOwned { .. } => StoreFailure::Conflict,
        JournalError::Storage(crate::fsio::StorageError::Corrupt { .. }) => StoreFailure::Unsafe,
        JournalError::Storage(_)
        | JournalError::NotSettled { .. }
        | JournalError::Refused { .. } => StoreFailure::Unchanged,
    }
}

fn receipt_failure(error: &ReceiptStoreError) -> ReceiptRead {
    match error {
        ReceiptStoreError::Storage(crate::fsio::StorageError::Io { .. }) => {
            ReceiptRead::Unavailable
        }
        ReceiptStoreError::Storage(_)
        | ReceiptStoreError::AttemptMismatch { .. }
        | ReceiptStoreError::AlreadyExists { .. }
        | ReceiptStoreError::QuarantineOccupied { .. }
        | ReceiptStoreError::NotFound { .. } => ReceiptRead::Invalid,
    }
}

fn spool_failure(error: &SpoolError) -> Outcome {
    match error {
        SpoolError::NotFound { .. } => Outcome::LogMissing,
        SpoolError::Storage(_)
        | SpoolError::CapacityUnavailable { .. }
        | SpoolError::AlreadyExists { .. }
        | SpoolError::InvalidPolicy { .. }
        | SpoolError::FactMismatch { .. } => Outcome::LogUnavailable,
    }
}

/// Transport errors as the core's HTTP facts: only the status and the error code cross over.
#[must_use]
pub fn http_failure(error: TransportError) -> HttpFailure {
    match error {
        TransportError::Status { status, code } => HttpFailure::Status { status, code },
        other => {
            drop(other);
            HttpFailure::Unavailable
        }
    }
}

/// Converts a core launch plan for the executor (the quota comes from the spool policy).
#[must_use]
pub fn launch(plan: LaunchPlan, spool: SpoolPolicy) -> Launch {
    Launch::from_core(plan, spool.maximum_attempt_bytes)
}
