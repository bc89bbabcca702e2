//! [`Act`]: a clonable, canonical copy of one driver [`Action`].
//!
//! The simulated host keeps the command it is answering as an `Act` so that a simulation state
//! (world, Worker, pending command) can be copied and compared. [`Act::canonical`] is the
//! byte-exact rendering the determinism tests compare (records and claims as their envelope
//! bytes, request bodies verbatim, the launch plan field by field); [`Act::summary`] is the
//! one-line form the scenario tests assert.

use std::fmt;

use ql_worker_core::barrier::Barrier;
use ql_worker_core::claim::PendingClaim;
use ql_worker_core::envelope;
use ql_worker_core::ids::{
    AttemptId, CallbackSequence, CapabilityDigest, ExecutorHandle, LogArtifactId, OfferId,
    Revision, RunId, SessionId, Sha256Digest,
};
use ql_worker_core::io::Action;
use ql_worker_core::record::InboxRecord;
use ql_worker_core::revision::ExecCommand;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::route::Operation;

/// The launch plan as the simulated supervisor receives it. It holds the raw capability (the
/// real supervisor holds it in memory too, and writes it only into the receipt).
#[derive(Clone, PartialEq, Eq)]
pub struct SpawnPlan {
    /// Offer.
    pub offer_id: OfferId,
    /// Run.
    pub run_id: RunId,
    /// Attempt.
    pub attempt_id: AttemptId,
    /// Durable pre-spawn time.
    pub executor_started_at: UnixMillis,
    /// What to run.
    pub command: ExecCommand,
    /// The exact environment (Secret values included).
    pub environment: Vec<(String, String)>,
    /// Working directory.
    pub working_directory: Option<String>,
    /// Timeout and deadline.
    pub timeout: Option<(u64, UnixMillis)>,
    /// Log artifact.
    pub log_artifact_id: LogArtifactId,
    /// Callback sequence.
    pub callback_sequence: CallbackSequence,
    /// The raw 32-byte completion capability.
    pub capability: [u8; 32],
}

impl fmt::Debug for SpawnPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpawnPlan")
            .field("offer_id", &self.offer_id)
            .field("attempt_id", &self.attempt_id)
            .field("executor_started_at", &self.executor_started_at)
            .field("capability", &"[redacted]")
            .finish_non_exhaustive()
    }
}

impl SpawnPlan {
    /// SHA-256 of the raw capability (what the `launching` record must carry).
    #[must_use]
    pub fn digest(&self) -> Sha256Digest {
        Sha256Digest::of(&self.capability)
    }

    /// What the durable `launching` record must hold for this plan to spawn (core's one rule,
    /// [`Barrier::check`], which the real supervisor runs too).
    #[must_use]
    pub fn barrier(&self) -> Barrier<'_> {
        Barrier {
            offer_id: &self.offer_id,
            run_id: &self.run_id,
            attempt_id: &self.attempt_id,
            callback_sequence: self.callback_sequence,
            token_digest: CapabilityDigest::new(self.digest()),
            log_artifact_id: &self.log_artifact_id,
            executor_started_at: self.executor_started_at,
        }
    }
}

/// One command, copied out of the [`Action`] the Worker emitted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Act {
    /// [`Action::ListInbox`].
    ListInbox {
        /// Cursor.
        after: Option<OfferId>,
        /// Page size.
        limit: usize,
    },
    /// [`Action::ReadRecord`].
    ReadRecord {
        /// Offer.
        offer_id: OfferId,
    },
    /// [`Action::PersistRecord`].
    PersistRecord {
        /// Expected stored revision (`None`: first publication).
        expected: Option<Revision>,
        /// The record.
        record: Box<InboxRecord>,
    },
    /// [`Action::ReadClaim`].
    ReadClaim,
    /// [`Action::PersistClaim`].
    PersistClaim {
        /// Expected stored revision (`None`: first publication).
        expected: Option<Revision>,
        /// The claim.
        claim: Box<PendingClaim>,
    },
    /// [`Action::ClearClaim`].
    ClearClaim {
        /// Offer of the claim.
        offer_id: OfferId,
        /// Revision of the claim.
        revision: Revision,
    },
    /// [`Action::ReadReceipt`].
    ReadReceipt {
        /// Attempt.
        attempt_id: AttemptId,
    },
    /// [`Action::RemoveReceipt`].
    RemoveReceipt {
        /// Attempt.
        attempt_id: AttemptId,
    },
    /// [`Action::AllocateLog`].
    AllocateLog {
        /// Log.
        log_artifact_id: LogArtifactId,
    },
    /// [`Action::InspectLog`].
    InspectLog {
        /// Log.
        log_artifact_id: LogArtifactId,
    },
    /// [`Action::Post`].
    Post {
        /// The route's operation.
        operation: Operation,
        /// The route path.
        path: String,
        /// The exact body.
        body: Vec<u8>,
    },
    /// [`Action::UploadLog`].
    UploadLog {
        /// Route path.
        path: String,
        /// Log.
        log_artifact_id: LogArtifactId,
        /// The JSON header.
        header: Vec<u8>,
        /// Bytes to stream.
        byte_length: u64,
    },
    /// [`Action::Spawn`].
    Spawn(Box<SpawnPlan>),
    /// [`Action::Stop`].
    Stop {
        /// Durable handle.
        handle: ExecutorHandle,
    },
    /// [`Action::InspectSupervision`].
    InspectSupervision {
        /// The Run's log.
        log_artifact_id: LogArtifactId,
        /// Durable handle of the user process.
        handle: ExecutorHandle,
    },
    /// [`Action::ReadPublishedHandle`].
    ReadPublishedHandle {
        /// Attempt.
        attempt_id: AttemptId,
    },
    /// [`Action::DrawEntropy`].
    DrawEntropy,
    /// [`Action::PersistSession`].
    PersistSession {
        /// The new Session id.
        session_id: SessionId,
    },
}

impl Act {
    /// Copies an action (the action itself is dropped, wiping what it held).
    #[must_use]
    pub fn from_action(action: Action) -> Self {
        match action {
            Action::ListInbox { after, limit } => Self::ListInbox {
                after,
                limit: limit.get(),
            },
            Action::ReadRecord { offer_id } => Self::ReadRecord { offer_id },
            Action::PersistRecord { expected, record } => Self::PersistRecord { expected, record },
            Action::ReadClaim => Self::ReadClaim,
            Action::PersistClaim { expected, claim } => Self::PersistClaim { expected, claim },
            Action::ClearClaim { offer_id, revision } => Self::ClearClaim { offer_id, revision },
            Action::ReadReceipt { attempt_id } => Self::ReadReceipt { attempt_id },
            Action::RemoveReceipt { attempt_id } => Self::RemoveReceipt { attempt_id },
            Action::AllocateLog { log_artifact_id } => Self::AllocateLog { log_artifact_id },
            Action::InspectLog { log_artifact_id } => Self::InspectLog { log_artifact_id },
            Action::Post(call) => {
                let segment = call.path.rsplit('/').next().unwrap_or("");
                Self::Post {
                    // INVARIANT: the core only builds routes of known operations.
                    operation: Operation::from_segment(segment).expect("known route"),
                    path: call.path,
                    body: call.body.to_vec(),
                }
            }
            Action::UploadLog {
                path,
                log_artifact_id,
                header,
                byte_length,
                ..
            } => Self::UploadLog {
                path,
                log_artifact_id,
                header: header.to_vec(),
                byte_length,
            },
            Action::Spawn(plan) => Self::Spawn(Box::new(SpawnPlan {
                offer_id: plan.offer_id.clone(),
                run_id: plan.run_id.clone(),
                attempt_id: plan.attempt_id.clone(),
                executor_started_at: plan.executor_started_at,
                command: plan.command.clone(),
                environment: plan
                    .environment
                    .iter()
                    .map(|(n, v)| (n.clone(), String::from(v.as_str())))
                    .collect(),
                working_directory: plan.working_directory.clone(),
                timeout: plan.timeout,
                log_artifact_id: plan.log_artifact_id.clone(),
                callback_sequence: plan.callback_sequence,
                capability: *plan.capability.expose(),
            })),
            Action::Stop { handle } => Self::Stop { handle },
            Action::InspectSupervision {
                log_artifact_id,
                handle,
            } => Self::InspectSupervision {
                log_artifact_id,
                handle,
            },
            Action::ReadPublishedHandle { attempt_id } => Self::ReadPublishedHandle { attempt_id },
            Action::DrawEntropy => Self::DrawEntropy,
            Action::PersistSession { session_id } => Self::PersistSession { session_id },
        }
    }

    /// Whether this is a control-plane call (a POST or a log upload): the driver sends those
    /// from its call threads, concurrently; everything else it performs on its loop at once.
    #[must_use]
    pub fn is_call(&self) -> bool {
        matches!(self, Self::Post { .. } | Self::UploadLog { .. })
    }

    /// The kind of command, as one word.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ListInbox { .. } => "list-inbox",
            Self::ReadRecord { .. } => "read-record",
            Self::PersistRecord { .. } => "persist-record",
            Self::ReadClaim => "read-claim",
            Self::PersistClaim { .. } => "persist-claim",
            Self::ClearClaim { .. } => "clear-claim",
            Self::ReadReceipt { .. } => "read-receipt",
            Self::RemoveReceipt { .. } => "remove-receipt",
            Self::AllocateLog { .. } => "allocate-log",
            Self::InspectLog { .. } => "inspect-log",
            Self::Post { .. } => "post",
            Self::UploadLog { .. } => "upload-log",
            Self::Spawn(_) => "spawn",
            Self::Stop { .. } => "stop",
            Self::InspectSupervision { .. } => "inspect-supervision",
            Self::ReadPublishedHandle { .. } => "read-published-handle",
            Self::DrawEntropy => "draw-entropy",
            Self::PersistSession { .. } => "persist-session",
        }
    }

    /// The canonical bytes of this command: equal iff the commands are equal, records and
    /// claims included byte for byte as their envelope encoding (CONVENTIONS C5).
    #[must_use]
    pub fn canonical(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(self.kind().as_bytes());
        out.push(b' ');
        let text = match self {
            Self::ListInbox { after, limit } => format!("{after:?} {limit}"),
            Self::ReadRecord { offer_id } => format!("{offer_id}"),
            Self::PersistRecord { expected, record } => {
                out.extend_from_slice(&encoded(&**record));
                format!(" {expected:?}")
            }
            Self::ReadClaim | Self::DrawEntropy => String::new(),
            Self::PersistClaim { expected, claim } => {
                out.extend_from_slice(&encoded(&**claim));
                format!(" {expected:?}")
            }
            Self::ClearClaim { offer_id, revision } => format!("{offer_id} {revision}"),
            Self::ReadReceipt { attempt_id }
            | Self::RemoveReceipt { attempt_id }
            | Self::ReadPublishedHandle { attempt_id } => {
                format!("{attempt_id}")
            }
            Self::AllocateLog { log_artifact_id } | Self::InspectLog { log_artifact_id } => {
                format!("{log_artifact_id}")
            }
            Self::Post { path, body, .. } => {
                out.extend_from_slice(path.as_bytes());
                out.push(b' ');
                out.extend_from_slice(body);
                String::new()
            }
            Self::UploadLog {
                path,
                log_artifact_id,
                header,
                byte_length,
            } => {
                out.extend_from_slice(header);
                format!(" {path} {log_artifact_id} {byte_length}")
            }
            Self::Spawn(plan) => spawn_text(plan),
            Self::Stop { handle } => format!("{handle}"),
            Self::InspectSupervision {
                log_artifact_id,
                handle,
            } => format!("{log_artifact_id} {handle}"),
            Self::PersistSession { session_id } => format!("{session_id}"),
        };
        out.extend_from_slice(text.as_bytes());
        out
    }
}

fn encoded<T: envelope::Durable>(value: &T) -> Vec<u8> {
    match envelope::encode(value) {
        Ok(bytes) => bytes.to_vec(),
        Err(e) => format!("<unencodable: {e:?}>").into_bytes(),
    }
}

fn spawn_text(plan: &SpawnPlan) -> String {
    let mut text = format!(
        "{} {} {} {} {:?} {:?} {:?} {} {} {}",
        plan.offer_id,
        plan.run_id,
        plan.attempt_id,
        plan.executor_started_at,
        plan.command,
        plan.working_directory,
        plan.timeout,
        plan.log_artifact_id,
        plan.callback_sequence,
        Sha256Digest::from_bytes(plan.capability).to_hex(),
    );
    for (name, value) in &plan.environment {
        text.push_str(&format!(" {name}={value}"));
    }
    text
}
