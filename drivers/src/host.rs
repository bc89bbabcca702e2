//! The effects of one Worker: performs each [`Action`] of the core and reports the fact as an
//! [`Outcome`]. It makes no protocol decision: every `if` below is about mapping an I/O result
//! to the fact the core asked for.
//!
//! Fatal facts (an fsync that failed, so durability is unknown) of the journal become
//! [`StoreFailure::Uncertain`] and the core halts; fatal facts of the other stores end the
//! Worker here ([`HostError::Fatal`]) — never retried.

use std::fmt;
use std::path::{Path, PathBuf};

use ql_worker_core::io::{
    Action, HttpFailure, LaunchPlan, Outcome, ReceiptRead, SpawnOutcome, StoreFailure,
};
use ql_worker_core::wire::auth::{AuthError, WorkerCredential};
use zeroize::{Zeroize as _, Zeroizing};

use crate::calls::{NetCall, NetDone, Note, Request};
use crate::config::FileClass;
use crate::containment::Policy;
use crate::https::{HttpsClient, TransportError};
use crate::journal::{Journal, JournalError};
use crate::receipts::{self, ReceiptStoreError};
use crate::spool::{self, SpoolError, SpoolPolicy};
use crate::supervisor::{Executor, ExecutorOutcome, Launch, RejectReason, StopController};
use crate::telemetry::Telemetry;

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

/// Reads the `ql3w_…` credential file (not a symlink, regular, owned by this user, 0600 or
/// stricter) and returns the `Authorization` header value. The file is re-read on every call,
/// so a rotated credential is picked up; every buffer that held the secret is wiped.
///
/// # Errors
/// A message naming the file and the rule (never the file's content).
pub fn authorization(path: &Path) -> Result<Zeroizing<String>, String> {
    authorization_rule(path).map_err(|rule| format!("credential file {}: {rule}", path.display()))
}

/// [`authorization`], with an error that is only the rule (the caller names the file).
///
/// # Errors
/// The rule the file breaks.
pub fn authorization_rule(path: &Path) -> Result<Zeroizing<String>, String> {
    const FORM: &str = "one line ql3w_<credentialId>_<43 base64url characters>";
    let bytes = crate::config::read_checked(path, FileClass::Secret, MAX_CREDENTIAL_BYTES)
        .map_err(|problem| problem.to_string())?;
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| format!("must hold {FORM} (it is not UTF-8 text)"))?;
    // One line, with or without its line ending; nothing else (no second line, no spaces).
    let line = text
        .strip_suffix("\r\n")
        .or_else(|| text.strip_suffix('\n'))
        .unwrap_or(text);
    if line.is_empty() {
        return Err(format!("must hold {FORM} (it is empty)"));
    }
    let lines = line.split('\n').count();
    if lines > 1 {
        return Err(format!("must hold {FORM} (it holds {lines} lines)"));
    }
    if line.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "must hold {FORM} (it holds a space or control character)"
        ));
    }
    if !line.starts_with("ql3w_") {
        return Err(format!("must hold {FORM} (it does not start with ql3w_)"));
    }
    let mut header = Zeroizing::new(String::from("Worker "));
    header.push_str(line);
    let credential = WorkerCredential::parse_header(&header).map_err(|e| {
        let why = match e {
            AuthError::Scheme => "it is not of that form",
            AuthError::CredentialId => {
                "the credential id must be 1 to 64 characters from A-Z a-z 0-9 . _ : - starting \
                 with a letter or digit"
            }
            AuthError::Secret => {
                "the secret must be 43 characters of canonical base64url (32 bytes)"
            }
        };
        format!("must hold {FORM} ({why})")
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
    /// The core reported something that went wrong without stopping it (e.g. an offer refused
    /// for good); the runtime also prints it to stderr.
    Notice(&'a ql_worker_core::worker::Notice),
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
    #[cfg(feature = "test-hooks")]
    stall_after: Option<StallPoint>,
    leftovers: Leftovers,
    telemetry: Telemetry,
    /// Receipts removed and claims cleared so far (`retention::SweepKey::released`).
    released: u64,
}

/// Where supervisors make things per Run that a killed supervisor could leave behind (issue 20).
#[derive(Clone, Debug, Default)]
pub struct Leftovers {
    /// The `[run_as]` runs area.
    pub runs_dir: Option<PathBuf>,
    /// The delegated cgroup whose `run-<offerId>` children are the Runs'.
    pub cgroup_parent: Option<PathBuf>,
}

/// Where the crash-test hook `QL_WORKER_FAULT_STALL_AFTER` stops the Worker answering (test
/// builds only: [`crate::test_hooks`]).
#[cfg(feature = "test-hooks")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StallPoint {
    /// After the first record persisted in this state.
    Persisted(ql_worker_core::record::State),
    /// After the first spawn the supervisor reported `started`, before the outcome reaches the
    /// core: the user process runs while its record is still `launching`.
    Spawned,
}

#[cfg(feature = "test-hooks")]
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
#[cfg(feature = "test-hooks")]
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
            #[cfg(feature = "test-hooks")]
            stall_after: None,
            leftovers: Leftovers::default(),
            telemetry: Telemetry::new(crate::metrics::Metrics::new(crate::os::now().get())),
            released: 0,
        }
    }

    /// What the effects observe, as events and metrics.
    pub fn telemetry_mut(&mut self) -> &mut Telemetry {
        &mut self.telemetry
    }

    /// The HTTPS client (for SIGHUP reloads).
    pub fn client_mut(&mut self) -> &mut HttpsClient {
        &mut self.client
    }

    /// A journal failure as the core's fact, reported as a storage fault on the way.
    fn journal_fault(&mut self, what: &dyn fmt::Display, error: &JournalError) -> StoreFailure {
        let failure = journal_failure(error);
        let halting = !matches!(
            failure,
            StoreFailure::Unchanged | StoreFailure::CapacityExhausted
        );
        self.telemetry
            .storage_fault(&what.to_string(), error, halting);
        failure
    }

    /// Where [`Host::sweep_runs`] looks for what killed supervisors left.
    pub fn set_leftovers(&mut self, leftovers: Leftovers) {
        self.leftovers = leftovers;
    }

    /// Removes Run directories and (empty) Run cgroups whose Run is settled or no longer in the
    /// inbox: a supervisor removes its own before the receipt, so these are a killed
    /// supervisor's. Returns how many were removed.
    pub fn sweep_runs(&mut self) -> usize {
        let journal = &self.journal;
        // Kept: anything not named by an offer id (not ours), a record not settled, and a
        // record that cannot be read (never remove what might still be in use).
        let live = |name: &str| {
            ql_worker_core::ids::OfferId::new(name).map_or(true, |id| {
                journal
                    .read_record(&id)
                    .map_or(true, |r| r.is_some_and(|r| !r.state.is_terminal()))
            })
        };
        let mut removed = 0;
        if let Some(runs) = &self.leftovers.runs_dir {
            removed += crate::containment::runs::sweep(runs, live);
        }
        if let Some(parent) = &self.leftovers.cgroup_parent {
            removed += crate::containment::cgroup::sweep(parent, live);
        }
        removed
    }

    /// Receipts removed and claims cleared so far: each may make a settled record removable
    /// without changing the inbox's counts (`retention::SweepKey::released`).
    #[must_use]
    pub fn released(&self) -> u64 {
        self.released
    }

    /// Crash-test hook: at `point`, never answer again (the Worker hangs there until it is
    /// killed). See "Test-only hooks" in `docs/operations.md`; test builds only.
    #[cfg(feature = "test-hooks")]
    pub fn stall_after(&mut self, point: Option<StallPoint>) {
        self.stall_after = point;
    }

    /// Installs an observer of persisted records, uploads and core notices.
    pub fn observe(&mut self, observer: Box<dyn FnMut(&Event<'_>)>) {
        self.observer = observer;
    }

    /// Passes `event` to the observer.
    pub fn notify(&mut self, event: &Event<'_>) {
        (self.observer)(event);
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
                Ok(record) => {
                    if let Some(record) = &record {
                        self.telemetry.record_seen(record);
                    }
                    Outcome::RecordRead(record.map(Box::new))
                }
                Err(e) => Outcome::Store(
                    self.journal_fault(&format_args!("reading record {offer_id}"), &e),
                ),
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
                        self.telemetry.record_persisted(&record);
                        (self.observer)(&Event::Persisted(&record));
                        #[cfg(feature = "test-hooks")]
                        if self.stall_after == Some(StallPoint::Persisted(record.state)) {
                            stall_forever();
                        }
                        Outcome::Persisted
                    }
                    Err(e) => Outcome::Store(self.journal_fault(
                        &format_args!(
                            "writing record {} ({})",
                            record.offer.offer_id, record.state
                        ),
                        &e,
                    )),
                }
            }
            Action::ReadClaim => match self.journal.read_claim() {
                Ok(claim) => Outcome::ClaimRead(claim.map(Box::new)),
                Err(e) => Outcome::Store(self.journal_fault(&"reading the pending claim", &e)),
            },
            Action::PersistClaim { expected, claim } => {
                let result = match expected {
                    None => self.journal.create_claim(&claim).map(|_| ()),
                    Some(revision) => self.journal.replace_claim(&claim, revision),
                };
                match result {
                    Ok(()) => {
                        self.telemetry.claim_persisted(&claim.offer_id);
                        Outcome::Persisted
                    }
                    Err(e) => Outcome::Store(self.journal_fault(&"writing the pending claim", &e)),
                }
            }
            Action::ClearClaim { offer_id, revision } => {
                match self.journal.clear_claim(&offer_id, revision) {
                    Ok(()) => {
                        self.telemetry.claim_cleared(&offer_id);
                        self.released += 1;
                        Outcome::Persisted
                    }
                    Err(e) => Outcome::Store(self.journal_fault(&"clearing the pending claim", &e)),
                }
            }
            Action::ReadReceipt { attempt_id } => match receipts::read(&self.root, &attempt_id) {
                Ok(Some(receipt)) => Outcome::ReceiptRead(ReceiptRead::Present(receipt)),
                Ok(None) => Outcome::ReceiptRead(ReceiptRead::Absent),
                Err(e) => {
                    self.telemetry.storage_fault(
                        &format!("reading the receipt of attempt {attempt_id}"),
                        &e,
                        false,
                    );
                    Outcome::ReceiptRead(receipt_failure(&e))
                }
            },
            Action::RemoveReceipt { attempt_id } => match receipts::remove(&self.root, &attempt_id)
            {
                Ok(existed) => {
                    self.released += u64::from(existed);
                    Outcome::ReceiptRemoved { existed }
                }
                Err(e) => {
                    let what = format!("removing the receipt of attempt {attempt_id}");
                    self.telemetry.storage_fault(&what, &e, e.is_fatal());
                    if e.is_fatal() {
                        return Err(HostError::Fatal(e.to_string()));
                    }
                    Outcome::Store(StoreFailure::Unchanged)
                }
            },
            Action::AllocateLog { log_artifact_id } => {
                match spool::allocate(&self.root, &log_artifact_id, self.spool) {
                    Ok(()) => Outcome::LogAllocated,
                    Err(e) => {
                        let what = format!("allocating log {log_artifact_id}");
                        self.telemetry.storage_fault(&what, &e, e.is_fatal());
                        if e.is_fatal() {
                            return Err(HostError::Fatal(e.to_string()));
                        }
                        Outcome::LogUnavailable
                    }
                }
            }
            Action::InspectLog { log_artifact_id } => {
                match spool::open_reader(&self.root, &log_artifact_id, self.spool) {
                    Ok(reader) => Outcome::LogInspected {
                        byte_length: reader.len(),
                        truncated: reader.truncation,
                    },
                    Err(e) => {
                        if !matches!(e, SpoolError::NotFound { .. }) {
                            let what = format!("reading log {log_artifact_id}");
                            self.telemetry.storage_fault(&what, &e, false);
                        }
                        spool_failure(&e)
                    }
                }
            }
            action @ (Action::Post(_) | Action::UploadLog { .. }) => match self.network(action) {
                Ok(call) => {
                    let done = call.perform();
                    self.absorb(done)
                }
                Err(action) => unreachable!("a network action: {action:?}"),
            },
            Action::Spawn(plan) => {
                let quota = self.spool.maximum_attempt_bytes;
                let context = SpawnContext::of(&plan);
                let launch = Launch::from_core(*plan, quota);
                let outcome = self.executor.start(launch);
                context.log(&outcome);
                let outcome: SpawnOutcome = outcome.into();
                #[cfg(feature = "test-hooks")]
                if self.stall_after == Some(StallPoint::Spawned)
                    && matches!(outcome, SpawnOutcome::Started { .. })
                {
                    stall_forever();
                }
                Outcome::Spawned(outcome)
            }
            Action::Stop { handle } => Outcome::Stopped(self.stopper.stop(handle.as_str()).into()),
            Action::InspectSupervision {
                log_artifact_id,
                handle,
            } => Outcome::SupervisionInspected {
                supervisor: spool::capture_liveness(&self.root, &log_artifact_id, self.spool),
                process: self.stopper.liveness(handle.as_str()),
            },
            Action::ReadPublishedHandle { attempt_id } => {
                Outcome::PublishedHandle(read_published_handle(&self.root, &attempt_id))
            }
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

    /// The network command `action` as a call another thread can perform, or `action` back
    /// when it is a storage or process effect (performed on the loop: [`Host::perform`]).
    ///
    /// # Errors
    /// `action` itself when it is not a network command.
    #[allow(clippy::result_large_err)]
    pub fn network(&self, action: Action) -> Result<NetCall, Action> {
        let request = match action {
            Action::Post(call) => Request::Post(call),
            Action::UploadLog {
                path,
                log_artifact_id,
                header,
                byte_length,
                response_cap,
            } => Request::Upload {
                path,
                log_artifact_id,
                header,
                byte_length,
                response_cap,
            },
            other => return Err(other),
        };
        Ok(NetCall {
            request,
            caller: self.client.caller(),
            credential_file: self.credential_file.clone(),
            root: self.root.clone(),
            spool: self.spool,
        })
    }

    /// Records what a finished call observed (metrics, events, the observer) and returns its
    /// outcome for the core.
    pub fn absorb(&mut self, done: NetDone) -> Outcome {
        for note in done.notes {
            match note {
                Note::Answered(path) => self.telemetry.call_answered(&path),
                Note::Failed { path, error, at_ms } => {
                    self.telemetry.call_failed(&path, &error, at_ms);
                }
                Note::CredentialUnreadable {
                    path,
                    problem,
                    at_ms,
                } => self.telemetry.credential_unreadable(&path, &problem, at_ms),
                Note::SpoolFault { what, error } => {
                    self.telemetry.storage_fault(&what, &error, false);
                }
                Note::Uploaded {
                    log_artifact_id,
                    bytes,
                    seconds,
                    sha256,
                } => {
                    self.telemetry.uploaded(&log_artifact_id, bytes, seconds);
                    (self.observer)(&Event::Uploaded {
                        log_artifact_id: &log_artifact_id,
                        bytes,
                        sha256: &sha256,
                    });
                }
            }
        }
        done.outcome
    }

    fn list(
        &mut self,
        after: Option<&ql_worker_core::ids::OfferId>,
        limit: ql_worker_core::listing::PageLimit,
    ) -> Outcome {
        let page = match self.journal.list(after, limit) {
            Ok(page) => page,
            Err(e) => return Outcome::Store(self.journal_fault(&"listing the inbox", &e)),
        };
        let mut records = Vec::with_capacity(page.offer_ids.len());
        for offer_id in &page.offer_ids {
            match self.journal.read_record(offer_id) {
                Ok(Some(record)) => {
                    self.telemetry.record_seen(&record);
                    records.push(record);
                }
                // A listed record vanished: only this process writes the inbox, so the store is
                // not behaving as a single-owner store.
                Ok(None) => {
                    let path = crate::layout::Paths::new(&self.root).record(offer_id);
                    self.telemetry.storage_fault(
                        "listing the inbox",
                        &format_args!(
                            "unsafe storage at {}: a listed record vanished (another process \
                             writes the inbox)",
                            path.display()
                        ),
                        true,
                    );
                    return Outcome::Store(StoreFailure::Unsafe);
                }
                Err(e) => {
                    return Outcome::Store(
                        self.journal_fault(&format_args!("reading record {offer_id}"), &e),
                    );
                }
            }
        }
        Outcome::InboxListed {
            records,
            next_after: page.next_after,
        }
    }
}

/// What a failed launch's log line names (never a value: ids, paths and the rule).
struct SpawnContext {
    line: String,
    offer_id: ql_worker_core::ids::OfferId,
    run_id: ql_worker_core::ids::RunId,
    attempt_id: ql_worker_core::ids::AttemptId,
    command: ql_worker_core::revision::ExecCommand,
    working_directory: Option<String>,
}

impl SpawnContext {
    fn of(plan: &LaunchPlan) -> Self {
        let command = match &plan.command {
            // The shell command's text is not needed to name a rule; keep only its shell.
            ql_worker_core::revision::ExecCommand::Shell { shell, .. } => {
                ql_worker_core::revision::ExecCommand::Shell {
                    command: String::new(),
                    shell: shell.clone(),
                }
            }
            argv => argv.clone(),
        };
        Self {
            line: format!(
                "offer {} (run {}, attempt {})",
                plan.offer_id, plan.run_id, plan.attempt_id
            ),
            offer_id: plan.offer_id.clone(),
            run_id: plan.run_id.clone(),
            attempt_id: plan.attempt_id.clone(),
            command,
            working_directory: plan.working_directory.clone(),
        }
    }

    /// One event for a launch that did not start (`Rejected`: a start failure is reported;
    /// `Unknown`: recovery evidence).
    fn log(&self, outcome: &ExecutorOutcome) {
        use crate::events::Event;
        match outcome {
            ExecutorOutcome::Started { .. } => {}
            ExecutorOutcome::Rejected {
                reason: RejectReason::PolicyRefused(rule),
            } => {
                let subject =
                    Policy::subject(*rule, &self.command, self.working_directory.as_deref());
                Event::warn("start.failed")
                    .text("offer", &self.offer_id)
                    .text("run", &self.run_id)
                    .text("attempt", &self.attempt_id)
                    .text(
                        "cause",
                        format_args!("refused by the execution policy: {rule}"),
                    )
                    .emit(format_args!(
                        "{}: start failed, no user process started: refused by the execution \
                         policy: {rule} ({subject})",
                        self.line
                    ));
            }
            ExecutorOutcome::Rejected { reason } => {
                Event::warn("start.failed")
                    .text("offer", &self.offer_id)
                    .text("run", &self.run_id)
                    .text("attempt", &self.attempt_id)
                    .text("cause", reason)
                    .emit(format_args!(
                        "{}: start failed, no user process started: {reason}",
                        self.line
                    ));
            }
            ExecutorOutcome::Unknown { reason } => {
                Event::error("launch.unknown")
                    .text("offer", &self.offer_id)
                    .text("run", &self.run_id)
                    .text("attempt", &self.attempt_id)
                    .text("cause", reason)
                    .emit(format_args!(
                        "{}: launch outcome unknown (recovery evidence): {reason}",
                        self.line
                    ));
            }
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
        JournalError::NotStateRoot { .. } | JournalError::OwnerLockLost { .. } => {
            StoreFailure::Unsafe
        }
        JournalError::Storage(_)
        | JournalError::NotAllowed { .. }
        | JournalError::NotArchivable { .. }
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

pub(crate) fn spool_failure(error: &SpoolError) -> Outcome {
    match error {
        SpoolError::NotFound { .. } => Outcome::LogMissing,
        SpoolError::Storage(_)
        | SpoolError::CapacityUnavailable { .. }
        | SpoolError::AlreadyExists { .. }
        | SpoolError::InvalidPolicy { .. }
        | SpoolError::FactMismatch { .. } => Outcome::LogUnavailable,
    }
}

/// Transport errors as the core's HTTP facts: only the status, the error code and whether the
/// request may have reached the control plane cross over (issue 17). A failure before any byte of
/// the request can have left (our own refusal, name resolution, connecting, the TLS handshake)
/// is [`HttpFailure::Unavailable`]; a connection lost or timed out later, or a response the
/// transport rules refuse, is [`HttpFailure::Uncertain`]: the control plane may have applied
/// the request.
#[must_use]
pub fn http_failure(error: &TransportError) -> HttpFailure {
    use crate::https::Blame;
    match error {
        TransportError::Status { status, code } => HttpFailure::Status {
            status: *status,
            code: code.clone(),
        },
        TransportError::Timeout { phase } if matches!(phase.as_str(), "resolve" | "connect") => {
            HttpFailure::Unavailable
        }
        other => match other.blame() {
            Blame::Local | Blame::Tls => HttpFailure::Unavailable,
            Blame::Connection
                if matches!(
                    other,
                    TransportError::HostNotFound | TransportError::Connect { .. }
                ) =>
            {
                HttpFailure::Unavailable
            }
            Blame::Connection | Blame::Remote => HttpFailure::Uncertain,
        },
    }
}

/// Converts a core launch plan for the executor (the quota comes from the spool policy).
#[must_use]
pub fn launch(plan: LaunchPlan, spool: SpoolPolicy) -> Launch {
    Launch::from_core(plan, spool.maximum_attempt_bytes)
}

/// The handle the supervisor of `attempt_id` published before its user command ran (issue 16),
/// validated by the rule a launch report's handle is ([`crate::supervisor::DurableHandle::of_attempt`]). Missing:
/// `None`; unsafe, unreadable or garbled: `None` and the event `run.published_handle_invalid`.
fn read_published_handle(
    root: &Path,
    attempt_id: &ql_worker_core::ids::AttemptId,
) -> Option<ql_worker_core::ids::ExecutorHandle> {
    let invalid = |why: &dyn fmt::Display| {
        crate::events::Event::warn("run.published_handle_invalid")
            .text("attempt", attempt_id)
            .text("cause", why)
            .emit(format_args!(
                "attempt {attempt_id}: the handle its supervisor published cannot be used ({why}); \
                 the Run cannot be stopped by identity"
            ));
        None
    };
    let bytes = match receipts::read_handle(root, attempt_id) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => return None,
        Err(e) => return invalid(&e),
    };
    let Ok(text) = String::from_utf8(bytes) else {
        return invalid(&"not UTF-8");
    };
    match crate::supervisor::DurableHandle::of_attempt(&text, attempt_id) {
        Ok(handle) => Some(handle),
        Err(e) => invalid(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::https::TlsFailure;
    use std::io::ErrorKind;

    /// What can have reached the control plane is uncertain; what cannot is unavailable; a status
    /// crosses over as it is (issue 17).
    #[test]
    fn transport_errors_are_unsent_or_uncertain() {
        let timeout = |phase: &str| TransportError::Timeout {
            phase: phase.to_owned(),
        };
        let unsent = [
            TransportError::HostNotFound,
            TransportError::Connect {
                kind: ErrorKind::ConnectionRefused,
            },
            TransportError::Tls(TlsFailure::UnknownIssuer),
            TransportError::RequestTooLarge { len: 9, cap: 8 },
            timeout("resolve"),
            timeout("connect"),
        ];
        for error in unsent {
            let text = error.to_string();
            assert_eq!(http_failure(&error), HttpFailure::Unavailable, "{text}");
        }
        let uncertain = [
            timeout("send body"),
            timeout("receive response"),
            timeout("global"),
            TransportError::ConnectionClosed {
                kind: ErrorKind::ConnectionReset,
            },
            TransportError::Io {
                kind: ErrorKind::BrokenPipe,
            },
            TransportError::ContentType,
            TransportError::ResponseTooShort { len: 1 },
            TransportError::MalformedResponse {
                reason: String::from("bad status line"),
            },
        ];
        for error in uncertain {
            let text = error.to_string();
            assert_eq!(http_failure(&error), HttpFailure::Uncertain, "{text}");
        }
        assert_eq!(
            http_failure(&TransportError::Status {
                status: 302,
                code: None
            }),
            HttpFailure::Status {
                status: 302,
                code: None
            }
        );
    }
}
