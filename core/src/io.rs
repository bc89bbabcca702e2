//! The sans-IO boundary: what the core asks the driver to do ([`Command`]) and what the driver
//! reports back ([`Input`], [`Outcome`]).
//!
//! The driver takes commands from `Worker::poll_output`, performs each (network calls may run
//! concurrently, one per lane: see `crate::worker`), and feeds exactly one [`Input::Outcome`]
//! with the same [`OpId`] back for each, in any order. Every decision about protocol state is
//! made here, in the core; the driver performs effects and reports facts. Commands carry the
//! exact bytes to send (requests are built by [`crate::wire`]); outcomes carry the exact bytes
//! received (responses are parsed by the core against the request that produced them).

use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use zeroize::Zeroizing;

use crate::capability::{Capability, Entropy};
use crate::claim::PendingClaim;
use crate::completion::CompletionOutcome;
use crate::ids::{
    AttemptId, CallbackSequence, ExecutorHandle, LogArtifactId, OfferId, Revision, RunId,
    Sha256Digest,
};
use crate::listing::PageLimit;
use crate::receipt::Receipt;
use crate::record::InboxRecord;
use crate::revision::ExecCommand;
use crate::time::UnixMillis;
use crate::worker::{CallFault, http_fault};

/// Correlation id of a command, minted by the core from a counter (deterministic, never random).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct OpId(pub u64);

impl fmt::Display for OpId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "op#{}", self.0)
    }
}

/// A command for the driver, tagged with the id its outcome must echo.
#[derive(Debug)]
#[must_use]
pub struct Command {
    /// Echo this id in the [`Input::Outcome`].
    pub id: OpId,
    /// What to do.
    pub action: Action,
}

/// A JSON POST to one Worker-ingress route.
#[derive(Debug)]
#[cfg_attr(feature = "sim-hooks", derive(Clone))]
pub struct HttpCall {
    /// The full route path, e.g. `/api/v3/worker-ingress/workers/edge-1/sessions/…/starting`.
    pub path: String,
    /// The exact request body (wiped after sending: it may carry the lease token).
    pub body: Zeroizing<Vec<u8>>,
    /// The request cap of this endpoint (4 KiB unless the endpoint opts in, ≤ 64 KiB).
    pub request_cap: usize,
    /// The response cap for this endpoint.
    pub response_cap: usize,
}

/// Everything the supervisor needs to spawn one Run (reference §4.3 `launch`). Holds Secret
/// values and the completion capability: no `Debug` of values, wiped on drop. `Clone` exists
/// only for `Worker::fork` (`sim-hooks` feature): the model checker branches a Worker whose
/// launch plan is staged, which duplicates the in-memory capability (never persisted).
#[cfg_attr(feature = "sim-hooks", derive(Clone))]
pub struct LaunchPlan {
    /// Offer (the barrier re-reads its record).
    pub offer_id: OfferId,
    /// Run.
    pub run_id: RunId,
    /// Attempt.
    pub attempt_id: AttemptId,
    /// The durable pre-spawn time persisted in `launching`.
    pub executor_started_at: UnixMillis,
    /// What to run.
    pub command: ExecCommand,
    /// The exact environment, in revision order (Secret values included).
    pub environment: Vec<(String, Zeroizing<String>)>,
    /// Working directory, if the revision has one.
    pub working_directory: Option<String>,
    /// Timeout and the control plane's durable deadline, both or neither.
    pub timeout: Option<(u64, UnixMillis)>,
    /// Log artifact to capture into.
    pub log_artifact_id: LogArtifactId,
    /// Callback sequence persisted in `launching`.
    pub callback_sequence: CallbackSequence,
    /// The 32-byte completion capability (only its digest is durable).
    pub capability: Capability,
}

impl fmt::Debug for LaunchPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.environment.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("LaunchPlan")
            .field("offer_id", &self.offer_id)
            .field("run_id", &self.run_id)
            .field("attempt_id", &self.attempt_id)
            .field("executor_started_at", &self.executor_started_at)
            .field("environment_names", &names)
            .field("log_artifact_id", &self.log_artifact_id)
            .field("callback_sequence", &self.callback_sequence)
            .field("capability", &"[redacted]")
            .finish_non_exhaustive()
    }
}

/// What the driver must do. Each variant says which [`Outcome`] comes back.
#[derive(Debug)]
#[cfg_attr(feature = "sim-hooks", derive(Clone))]
pub enum Action {
    /// Read one page of inbox records (ascending offer id, strictly after `after`).
    /// ⇒ [`Outcome::InboxListed`] or [`Outcome::Store`].
    ListInbox {
        /// Keyset cursor.
        after: Option<OfferId>,
        /// Page size.
        limit: PageLimit,
    },
    /// Read one record. ⇒ [`Outcome::RecordRead`] or [`Outcome::Store`].
    ReadRecord {
        /// Which offer.
        offer_id: OfferId,
    },
    /// Publish (when `expected` is `None`) or replace (revision CAS against `expected`) one
    /// record, durably (temp + fsync + link/rename + directory fsync) before answering.
    /// ⇒ [`Outcome::Persisted`] or [`Outcome::Store`].
    PersistRecord {
        /// The revision the stored record must have; `None` for a first publication.
        expected: Option<Revision>,
        /// The complete new record.
        record: Box<InboxRecord>,
    },
    /// Read the pending claim. ⇒ [`Outcome::ClaimRead`] or [`Outcome::Store`].
    ReadClaim,
    /// Publish (`expected: None`) or replace the pending claim, durably.
    /// ⇒ [`Outcome::Persisted`] or [`Outcome::Store`].
    PersistClaim {
        /// The revision the stored claim must have; `None` for a first publication.
        expected: Option<Revision>,
        /// The complete claim.
        claim: Box<PendingClaim>,
    },
    /// Remove the pending claim if it still has this offer id and revision (unlink + directory
    /// fsync). ⇒ [`Outcome::Persisted`] or [`Outcome::Store`].
    ClearClaim {
        /// Offer id of the claim.
        offer_id: OfferId,
        /// Revision of the claim.
        revision: Revision,
    },
    /// Read the completion receipt of an attempt. ⇒ [`Outcome::ReceiptRead`].
    ReadReceipt {
        /// Attempt (the receipt's file name).
        attempt_id: AttemptId,
    },
    /// Remove the receipt (unlink + directory fsync). Only ever emitted after
    /// `completion_acknowledged` is durable. ⇒ [`Outcome::ReceiptRemoved`] or
    /// [`Outcome::Store`].
    RemoveReceipt {
        /// Attempt.
        attempt_id: AttemptId,
    },
    /// Admit and create the (empty) spool file of a log artifact.
    /// ⇒ [`Outcome::LogAllocated`] or [`Outcome::LogUnavailable`].
    AllocateLog {
        /// Log id.
        log_artifact_id: LogArtifactId,
    },
    /// Measure a spool file and read its truncation fact.
    /// ⇒ [`Outcome::LogInspected`], [`Outcome::LogMissing`] or [`Outcome::LogUnavailable`].
    InspectLog {
        /// Log id.
        log_artifact_id: LogArtifactId,
    },
    /// POST JSON. ⇒ [`Outcome::Responded`] or [`Outcome::Http`].
    Post(HttpCall),
    /// Stream the framed artifact: `header` (JSON) then exactly `byte_length` bytes of the spool
    /// file, hashing what is sent. ⇒ [`Outcome::Uploaded`], [`Outcome::Http`],
    /// [`Outcome::LogMissing`] or [`Outcome::LogUnavailable`].
    UploadLog {
        /// Route path of `artifacts`.
        path: String,
        /// Log to stream.
        log_artifact_id: LogArtifactId,
        /// The JSON header (carries the lease token; wiped after sending).
        header: Zeroizing<Vec<u8>>,
        /// Exact content length to stream.
        byte_length: u64,
        /// Response cap.
        response_cap: usize,
    },
    /// Spawn through the supervisor. The plan is consumed and wiped.
    /// ⇒ [`Outcome::Spawned`].
    Spawn(Box<LaunchPlan>),
    /// Stop the process group named by a durable handle (TERM, verify, KILL).
    /// ⇒ [`Outcome::Stopped`].
    Stop {
        /// Durable handle.
        handle: ExecutorHandle,
    },
    /// Observe, without signalling anything, whether the supervisor of a Run and its user
    /// process still exist: the supervisor by the lock it holds on the Run's log from before
    /// the spawn until after its receipt is published, the user process by its durable handle.
    /// ⇒ [`Outcome::SupervisionInspected`].
    InspectSupervision {
        /// The Run's log (its supervisor holds a lock on it while it lives).
        log_artifact_id: LogArtifactId,
        /// The durable handle of the user process.
        handle: ExecutorHandle,
    },
    /// Read the durable executor handle the supervisor of `attempt_id` published before its
    /// user command ran (issue 16): how a Run whose record has no handle (a crash fell between
    /// the spawn and `started`) is still stopped by identity. The driver validates the handle;
    /// a missing, unsafe or garbled file is `None`. ⇒ [`Outcome::PublishedHandle`].
    ReadPublishedHandle {
        /// The attempt (the published file's name).
        attempt_id: AttemptId,
    },
    /// Draw [`crate::capability::ENTROPY_BYTES`] bytes from the OS CSPRNG.
    /// ⇒ [`Outcome::EntropyDrawn`].
    DrawEntropy,
    /// Replace the stored Session id (`<root>/session`) with `session_id`, durably, before the
    /// Worker registers it. Emitted once, when the Session registered at start is draining or
    /// offline at the control plane and none of its Runs is live any more.
    /// ⇒ [`Outcome::Persisted`] or [`Outcome::Store`].
    PersistSession {
        /// The new Session id (a lowercase UUIDv7).
        session_id: crate::ids::SessionId,
    },
}

/// The one table of which outcomes answer which kind of action. Each kind names its
/// [`Answer`] variant, the actions it answers, its projection of a [`Reply`] and what each
/// outcome it takes gives. It defines [`Answer`], [`Action::answer`], [`Answer::reply`] (the
/// check) and the projections: an operation takes the kind its own action is answered with, and
/// the Worker hands it only a reply of that kind, so another kind in a projection is a core bug.
macro_rules! answers {
    ($($kind:ident: $actions:pat => $name:ident -> $ty:ty {
        $($pattern:pat => $value:expr,)+
    })*) => {
        /// The kind of [`Outcome`] that answers an [`Action`]. The Worker refuses an outcome of
        /// another kind with [`InputError::OutcomeMismatch`] before any operation sees it.
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub(crate) enum Answer {
            $($kind,)*
        }

        impl Action {
            /// The kind of outcome that answers this action (the `⇒` of each variant).
            pub(crate) fn answer(&self) -> Answer {
                use Action as A;
                match self {
                    $($actions => Answer::$kind,)*
                }
            }
        }

        impl Answer {
            /// `outcome` as a reply of this kind, or given back when it is of another kind.
            #[allow(unused_variables)]
            pub(crate) fn reply(self, outcome: Outcome) -> Result<Reply, Outcome> {
                use Outcome as O;
                let taken = match self {
                    $(Self::$kind => false $(|| matches!(&outcome, $pattern))+,)*
                };
                if taken { Ok(Reply(outcome)) } else { Err(outcome) }
            }
        }

        impl Reply {
            $(
                pub(crate) fn $name(self) -> $ty {
                    use Outcome as O;
                    match self.0 {
                        $($pattern => $value,)+
                        _ => mismatched(),
                    }
                }
            )*
        }
    };
}

fn mismatched() -> ! {
    panic!("invariant: an operation state takes the kind of reply its own action is answered with")
}

answers! {
    Listing: A::ListInbox { .. } => listing
        -> Result<(Vec<InboxRecord>, Option<OfferId>), StoreFailure> {
        O::InboxListed { records, next_after } => Ok((records, next_after)),
        O::Store(f) => Err(f),
    }
    Record: A::ReadRecord { .. } => record -> Result<Option<Box<InboxRecord>>, StoreFailure> {
        O::RecordRead(record) => Ok(record),
        O::Store(f) => Err(f),
    }
    Claim: A::ReadClaim => claim -> Result<Option<Box<PendingClaim>>, StoreFailure> {
        O::ClaimRead(claim) => Ok(claim),
        O::Store(f) => Err(f),
    }
    Durable: A::PersistRecord { .. } | A::PersistClaim { .. } | A::ClearClaim { .. }
        | A::PersistSession { .. } => durable -> Result<(), StoreFailure> {
        O::Persisted => Ok(()),
        O::Store(f) => Err(f),
    }
    Receipt: A::ReadReceipt { .. } => receipt -> ReceiptRead {
        O::ReceiptRead(read) => read,
    }
    // Whether a file was removed.
    ReceiptRemoval: A::RemoveReceipt { .. } => receipt_removal -> Result<bool, StoreFailure> {
        O::ReceiptRemoved { existed } => Ok(existed),
        O::Store(f) => Err(f),
    }
    // Whether the spool file is ready.
    LogAllocation: A::AllocateLog { .. } => log_allocation -> bool {
        O::LogAllocated => true,
        O::LogUnavailable => false,
    }
    // The log's length and truncation flag; a log missing or unavailable ends the completion.
    LogInspection: A::InspectLog { .. } => log_inspection
        -> Result<(u64, Option<bool>), CompletionOutcome> {
        O::LogInspected { byte_length, truncated } => Ok((byte_length, truncated)),
        O::LogMissing => Err(CompletionOutcome::ArtifactMissing),
        O::LogUnavailable => Err(CompletionOutcome::ArtifactUnavailable),
    }
    // A JSON call's 200 body, or its fault.
    Call: A::Post(_) => call -> Result<Vec<u8>, CallFault> {
        O::Responded(body) => Ok(body),
        O::Http(failure) => Err(http_fault(failure)),
    }
    // The response body, the bytes sent and their SHA-256; or the completion's end: the call
    // failed (an HTTP failure is never an invalid answer), or, as above, the log is missing or
    // unavailable.
    Upload: A::UploadLog { .. } => upload
        -> Result<(Vec<u8>, u64, Sha256Digest), CompletionOutcome> {
        O::Uploaded { body, sent_bytes, sent_sha256 } => Ok((body, sent_bytes, sent_sha256)),
        O::Http(failure) => Err(CompletionOutcome::failed(
            http_fault(failure),
            CompletionOutcome::ArtifactResponseInvalid,
        )),
        O::LogMissing => Err(CompletionOutcome::ArtifactMissing),
        O::LogUnavailable => Err(CompletionOutcome::ArtifactUnavailable),
    }
    Spawn: A::Spawn(_) => spawn -> SpawnOutcome {
        O::Spawned(spawned) => spawned,
    }
    Stop: A::Stop { .. } => stop -> StopOutcome {
        O::Stopped(stopped) => stopped,
    }
    // Whether the supervisor and the user process are alive.
    Supervision: A::InspectSupervision { .. } => supervision -> (Liveness, Liveness) {
        O::SupervisionInspected { supervisor, process } => (supervisor, process),
    }
    PublishedHandle: A::ReadPublishedHandle { .. } => published_handle -> Option<ExecutorHandle> {
        O::PublishedHandle(found) => found,
    }
    Entropy: A::DrawEntropy => entropy -> Entropy {
        O::EntropyDrawn(entropy) => entropy,
    }
}

/// An outcome of the kind its action is answered with ([`Answer::reply`] checked it): what an
/// operation's state receives. Each state takes it apart as that kind ([`Reply::durable`] and
/// its siblings), and matches every value of that kind.
pub(crate) struct Reply(pub(crate) Outcome);

/// What the supervisor reported for a spawn (reference §4.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SpawnOutcome {
    /// A user process exists. The handle is validated by the core.
    Started {
        /// Durable handle text.
        handle: String,
        /// The start time the supervisor used (must equal the persisted one).
        started_at: UnixMillis,
    },
    /// Proof that no user process was started.
    Rejected,
    /// Anything else: a process may exist.
    Unknown,
}

/// Result of a stop (reference §5.6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopOutcome {
    /// The exact process group was signalled and is gone.
    Stopped,
    /// The identity no longer matches a live process.
    AlreadyExited,
    /// Could not verify (identity unreadable, signal failed, still alive).
    Unknown,
}

/// Whether a process the Worker started still exists, as the driver observed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// It exists (or its lock is held).
    Alive,
    /// It is gone: its identity matches no live process (or its lock is free).
    Gone,
    /// Nothing can be concluded (unreadable, missing, unsafe).
    Unknown,
}

/// A storage operation that did not succeed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreFailure {
    /// Nothing changed on disk: the previous durable state stands (e.g. no space for the temp
    /// file). The core may continue knowing exactly what is stored.
    Unchanged,
    /// The write may or may not be durable (an fsync failed after the rename or link). Fatal:
    /// the core halts; the next start reconciles from disk.
    Uncertain,
    /// The store refused the CAS or the transition (nothing written). A concurrent writer or a
    /// core bug: fatal.
    Conflict,
    /// The inbox is at capacity (nothing written).
    CapacityExhausted,
    /// A read found an unsafe or corrupt file (fail closed).
    Unsafe,
}

/// An HTTP exchange that did not yield a 200 JSON body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HttpFailure {
    /// The request cannot have reached the control plane: no connection, TLS handshake refused,
    /// or refused locally before sending. Nothing can have taken effect.
    Unavailable,
    /// The request may have reached the control plane and taken effect, but no usable answer came
    /// back: the connection closed, reset or timed out after the request was (possibly) sent, or
    /// the response broke the transport rules (content type, encoding, length, size, HTTP
    /// framing). The core treats the call's effect as unknown (issue 17).
    Uncertain,
    /// A non-200 status, with the `{"code":…}` of the body when present.
    Status {
        /// HTTP status.
        status: u16,
        /// Error code.
        code: Option<String>,
    },
}

/// Result of reading a receipt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReceiptRead {
    /// A well-formed receipt (authentication is the core's job).
    Present(Receipt),
    /// No receipt file.
    Absent,
    /// The file exists but is unsafe or malformed (kept as evidence).
    Invalid,
    /// The store could not be read.
    Unavailable,
}

/// A fact reported by the driver.
pub enum Outcome {
    /// A page of records, ascending.
    InboxListed {
        /// The records.
        records: Vec<InboxRecord>,
        /// Cursor for the next page, if more remain.
        next_after: Option<OfferId>,
    },
    /// One record, or `None` if absent.
    RecordRead(Option<Box<InboxRecord>>),
    /// The claim, or `None` if absent.
    ClaimRead(Option<Box<PendingClaim>>),
    /// The write (record, claim or clear) is durable.
    Persisted,
    /// A storage operation failed.
    Store(StoreFailure),
    /// A receipt read.
    ReceiptRead(ReceiptRead),
    /// The receipt was removed (`existed: false` when it was already absent).
    ReceiptRemoved {
        /// Whether a file was removed.
        existed: bool,
    },
    /// The spool file exists and is empty or appendable.
    LogAllocated,
    /// Spool facts.
    LogInspected {
        /// Current size.
        byte_length: u64,
        /// From the authenticated truncation fact; `None` when the fact is missing (unknown).
        truncated: Option<bool>,
    },
    /// No spool file.
    LogMissing,
    /// The spool refused (capacity admission, unsafe file, I/O).
    LogUnavailable,
    /// A 200 response body.
    Responded(Vec<u8>),
    /// An HTTP failure.
    Http(HttpFailure),
    /// The artifact was streamed and answered 200.
    Uploaded {
        /// Response body.
        body: Vec<u8>,
        /// Bytes of content actually sent.
        sent_bytes: u64,
        /// SHA-256 of the content actually sent.
        sent_sha256: Sha256Digest,
    },
    /// The supervisor's launch report.
    Spawned(SpawnOutcome),
    /// The stop result.
    Stopped(StopOutcome),
    /// What [`Action::InspectSupervision`] observed.
    SupervisionInspected {
        /// The Run's supervisor.
        supervisor: Liveness,
        /// The Run's user process.
        process: Liveness,
    },
    /// What [`Action::ReadPublishedHandle`] found: the validated handle, or `None` (nothing
    /// published, or the file is unsafe or garbled).
    PublishedHandle(Option<ExecutorHandle>),
    /// Fresh entropy.
    EntropyDrawn(Entropy),
}

impl fmt::Debug for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::InboxListed {
                records,
                next_after,
            } => f
                .debug_struct("InboxListed")
                .field("records", &records.len())
                .field("next_after", next_after)
                .finish(),
            Self::RecordRead(r) => write!(f, "RecordRead({:?})", r.as_ref().map(|r| r.state)),
            Self::ClaimRead(c) => write!(f, "ClaimRead({:?})", c.as_ref().map(|c| c.revision)),
            Self::Persisted => f.write_str("Persisted"),
            Self::Store(e) => write!(f, "Store({e:?})"),
            Self::ReceiptRead(r) => write!(f, "ReceiptRead({r:?})"),
            Self::ReceiptRemoved { existed } => write!(f, "ReceiptRemoved({existed})"),
            Self::LogAllocated => f.write_str("LogAllocated"),
            Self::LogInspected {
                byte_length,
                truncated,
            } => {
                write!(f, "LogInspected({byte_length}, {truncated:?})")
            }
            Self::LogMissing => f.write_str("LogMissing"),
            Self::LogUnavailable => f.write_str("LogUnavailable"),
            Self::Responded(body) => write!(f, "Responded({} bytes)", body.len()),
            Self::Http(e) => write!(f, "Http({e:?})"),
            Self::Uploaded { sent_bytes, .. } => write!(f, "Uploaded({sent_bytes} bytes)"),
            Self::Spawned(s) => write!(f, "Spawned({s:?})"),
            Self::Stopped(s) => write!(f, "Stopped({s:?})"),
            Self::SupervisionInspected {
                supervisor,
                process,
            } => write!(f, "SupervisionInspected({supervisor:?}, {process:?})"),
            Self::PublishedHandle(h) => write!(f, "PublishedHandle({})", h.is_some()),
            Self::EntropyDrawn(_) => f.write_str("EntropyDrawn([redacted])"),
        }
    }
}

/// Something the driver reports to the core.
#[derive(Debug)]
pub enum Input {
    /// Time passed (the driver's wake-up); `now` is the argument of `handle`.
    Tick,
    /// The operator asked for a drain (SIGTERM or `ql-worker drain`).
    DrainRequested,
    /// The result of an outstanding command (the one with this id).
    Outcome {
        /// The command's id.
        id: OpId,
        /// What happened.
        outcome: Outcome,
    },
    /// A supervisor this Worker started has exited (its receipt, if any, is published): the
    /// core runs that record's completion pass now rather than at the next tick.
    ProcessExited {
        /// The offer whose supervisor exited.
        offer_id: OfferId,
    },
    /// Retention removed this settled record from the inbox (between commands): it no longer
    /// takes a place in the inbox's capacity.
    RecordRemoved {
        /// The removed record.
        offer_id: OfferId,
    },
}

/// An input the core refused. Nothing changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum InputError {
    /// No command with this id is outstanding (a driver bug: answered twice, or never sent).
    #[error("outcome for {id} but no command with that id is outstanding")]
    UnexpectedOutcome {
        /// The id given.
        id: OpId,
    },
    /// The outcome is not of a kind that answers the command with this id (a `Persisted` for a
    /// POST, say: a driver bug). The command stays outstanding.
    #[error("outcome for {id} is not of a kind that answers that command (it stays outstanding)")]
    OutcomeMismatch {
        /// The id given.
        id: OpId,
    },
    /// The machine has halted; only a restart helps.
    #[error("the worker has halted")]
    Halted,
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;

    /// One outcome of every variant, named.
    fn outcomes() -> Vec<(&'static str, Outcome)> {
        vec![
            (
                "listed",
                Outcome::InboxListed {
                    records: Vec::new(),
                    next_after: None,
                },
            ),
            ("record", Outcome::RecordRead(None)),
            ("claim", Outcome::ClaimRead(None)),
            ("persisted", Outcome::Persisted),
            ("store", Outcome::Store(StoreFailure::Unchanged)),
            ("receipt", Outcome::ReceiptRead(ReceiptRead::Absent)),
            ("removed", Outcome::ReceiptRemoved { existed: true }),
            ("allocated", Outcome::LogAllocated),
            (
                "inspected",
                Outcome::LogInspected {
                    byte_length: 3,
                    truncated: Some(false),
                },
            ),
            ("log-missing", Outcome::LogMissing),
            ("log-unavailable", Outcome::LogUnavailable),
            ("responded", Outcome::Responded(b"{}".to_vec())),
            ("http", Outcome::Http(HttpFailure::Unavailable)),
            (
                "uploaded",
                Outcome::Uploaded {
                    body: Vec::new(),
                    sent_bytes: 0,
                    sent_sha256: Sha256Digest::from_bytes([0; 32]),
                },
            ),
            ("spawned", Outcome::Spawned(SpawnOutcome::Rejected)),
            ("stopped", Outcome::Stopped(StopOutcome::Stopped)),
            (
                "inspected-supervision",
                Outcome::SupervisionInspected {
                    supervisor: Liveness::Gone,
                    process: Liveness::Alive,
                },
            ),
            ("published", Outcome::PublishedHandle(None)),
            (
                "entropy",
                Outcome::EntropyDrawn(Entropy::new([7; crate::capability::ENTROPY_BYTES])),
            ),
        ]
    }

    /// The `⇒` of each action's documentation, written out: which outcomes answer which kind.
    const TABLE: [(Answer, &[&str]); 15] = [
        (Answer::Listing, &["listed", "store"]),
        (Answer::Record, &["record", "store"]),
        (Answer::Claim, &["claim", "store"]),
        (Answer::Durable, &["persisted", "store"]),
        (Answer::Receipt, &["receipt"]),
        (Answer::ReceiptRemoval, &["removed", "store"]),
        (Answer::LogAllocation, &["allocated", "log-unavailable"]),
        (
            Answer::LogInspection,
            &["inspected", "log-missing", "log-unavailable"],
        ),
        (Answer::Call, &["responded", "http"]),
        (
            Answer::Upload,
            &["uploaded", "http", "log-missing", "log-unavailable"],
        ),
        (Answer::Spawn, &["spawned"]),
        (Answer::Stop, &["stopped"]),
        (Answer::Supervision, &["inspected-supervision"]),
        (Answer::PublishedHandle, &["published"]),
        (Answer::Entropy, &["entropy"]),
    ];

    #[test]
    fn each_kind_takes_exactly_the_outcomes_its_actions_document() {
        for (answer, accepted) in TABLE {
            for (name, outcome) in outcomes() {
                let taken = answer.reply(outcome).is_ok();
                assert_eq!(taken, accepted.contains(&name), "{answer:?} and {name}");
            }
        }
    }

    #[test]
    fn a_reply_keeps_the_values_of_its_outcome() {
        let reply = |answer: Answer, outcome| answer.reply(outcome).ok().unwrap();
        let store = Outcome::Store(StoreFailure::Conflict);
        assert_eq!(
            reply(Answer::Durable, store).durable(),
            Err(StoreFailure::Conflict)
        );
        assert_eq!(reply(Answer::Durable, Outcome::Persisted).durable(), Ok(()));
        let removed = Outcome::ReceiptRemoved { existed: false };
        assert_eq!(
            reply(Answer::ReceiptRemoval, removed).receipt_removal(),
            Ok(false)
        );
        assert!(!reply(Answer::LogAllocation, Outcome::LogUnavailable).log_allocation());
        assert!(reply(Answer::LogAllocation, Outcome::LogAllocated).log_allocation());
        let inspected = Outcome::LogInspected {
            byte_length: 9,
            truncated: None,
        };
        assert_eq!(
            reply(Answer::LogInspection, inspected).log_inspection(),
            Ok((9, None))
        );
        let body = Outcome::Responded(b"{\"a\":1}".to_vec());
        assert_eq!(reply(Answer::Call, body).call(), Ok(b"{\"a\":1}".to_vec()));
        let missing = reply(Answer::Upload, Outcome::LogMissing).upload();
        assert!(matches!(missing, Err(CompletionOutcome::ArtifactMissing)));
        let inspected = Outcome::SupervisionInspected {
            supervisor: Liveness::Unknown,
            process: Liveness::Gone,
        };
        assert_eq!(
            reply(Answer::Supervision, inspected).supervision(),
            (Liveness::Unknown, Liveness::Gone)
        );
    }

    #[test]
    #[should_panic(expected = "invariant")]
    fn a_state_that_takes_another_kind_than_its_action_is_a_core_bug() {
        let reply = Answer::Call.reply(Outcome::Http(HttpFailure::Uncertain));
        let _ = reply.ok().unwrap().durable();
    }
}
