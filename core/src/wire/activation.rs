//! `POST …/starting`, `…/running`, `…/start-failure` (reference §2.3–2.5) and the shared
//! activation response (schema `qinglong/remote-run-activation@v1`).
//!
//! Requests carry no schema field and no event id: exactly the 7 fence keys, plus
//! `executorHandle, logArtifactId (null when absent), callbackSequence, callbackTokenDigest` for
//! `running`.

use alloc::string::String;
use alloc::vec::Vec;

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::de::present;
use super::route::Operation;
use super::{Fence, WireError, ensure, exact, id, parse_json, sealed_body};
use crate::ids::{
    AttemptId, CallbackSequence, CapabilityDigest, ExecutorHandle, LeaseGeneration, LeaseToken,
    LeaseVersion, LogArtifactId, MAX_INT32, OfferId, RunId, WorkerGeneration,
};
use crate::offer::Offer;
use crate::revision::bounded_text;
use crate::time::UnixMillis;

/// Schema id of the activation response.
pub const SCHEMA: &str = "qinglong/remote-run-activation@v1";
/// `MAX_REMOTE_RUN_ACTIVATION_RESPONSE_BYTES`.
pub const MAX_RESPONSE_BYTES: usize = 16 * 1024;
/// Request cap (the 4 KiB default).
pub const MAX_REQUEST_BYTES: usize = super::DEFAULT_REQUEST_CAP;

/// The extra facts of the running ACK; serializes as the keys `running` adds to the fence.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunningAck {
    /// The durable executor handle.
    pub executor_handle: ExecutorHandle,
    /// The log artifact id; sent as `null` when absent.
    pub log_artifact_id: Option<LogArtifactId>,
    /// The completion callback sequence (1..=2^31-1).
    pub callback_sequence: CallbackSequence,
    /// SHA-256 of the raw 32-byte completion capability; sent as is.
    #[serde(serialize_with = "super::exposed_digest")]
    pub callback_token_digest: CapabilityDigest,
}

/// Which activation command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ActivationOp {
    /// `starting`.
    Starting,
    /// `running`.
    Running(RunningAck),
    /// `start-failure`.
    StartFailure,
}

/// An activation request: the fence and the command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActivationRequest {
    /// The execution fence.
    pub fence: Fence,
    /// The command.
    pub op: ActivationOp,
}

impl ActivationRequest {
    fn new(offer: &Offer, op: ActivationOp) -> Self {
        Self {
            fence: Fence::from_offer(offer),
            op,
        }
    }

    /// The starting ACK for `offer`.
    #[must_use]
    pub fn starting(offer: &Offer) -> Self {
        Self::new(offer, ActivationOp::Starting)
    }

    /// The running ACK for `offer`.
    #[must_use]
    pub fn running(offer: &Offer, ack: RunningAck) -> Self {
        Self::new(offer, ActivationOp::Running(ack))
    }

    /// The start-failure report for `offer`.
    #[must_use]
    pub fn start_failure(offer: &Offer) -> Self {
        Self::new(offer, ActivationOp::StartFailure)
    }

    /// The route operation of this request.
    #[must_use]
    pub fn operation(&self) -> Operation {
        match self.op {
            ActivationOp::Starting => Operation::Starting,
            ActivationOp::Running(_) => Operation::Running,
            ActivationOp::StartFailure => Operation::StartFailure,
        }
    }

    /// The request body; carries the lease token, so it is wiped on drop.
    ///
    /// # Errors
    /// [`WireError::RequestTooLarge`] above 4 KiB.
    pub fn to_body(&self) -> Result<Zeroizing<Vec<u8>>, WireError> {
        /// The 7 activation fence keys in the reference order (no `projectId`, no schema), then
        /// those of `running`.
        #[derive(Serialize)]
        #[serde(rename_all = "camelCase")]
        struct View<'a> {
            run_id: &'a RunId,
            attempt_id: &'a AttemptId,
            worker_generation: WorkerGeneration,
            offer_id: &'a OfferId,
            lease_generation: LeaseGeneration,
            #[serde(serialize_with = "super::token_slot")]
            lease_token: &'a LeaseToken,
            expected_lease_version: LeaseVersion,
            #[serde(flatten)]
            running: Option<&'a RunningAck>,
        }
        let running = match &self.op {
            ActivationOp::Running(ack) => Some(ack),
            ActivationOp::Starting | ActivationOp::StartFailure => None,
        };
        let f = &self.fence;
        let view = View {
            run_id: &f.run_id,
            attempt_id: &f.attempt_id,
            worker_generation: f.worker_generation,
            offer_id: &f.offer_id,
            lease_generation: f.lease_generation,
            lease_token: &f.lease_token,
            expected_lease_version: f.expected_lease_version,
            running,
        };
        let endpoint = self.operation().as_str();
        sealed_body(&view, &self.fence.lease_token, endpoint, MAX_REQUEST_BYTES)
    }
}

wire_enum! {
    /// The activation outcome.
    ActivationStatus {
        Applied = "applied",
        AlreadyRunning = "already_running",
        AlreadyStarting = "already_starting",
        AlreadyTerminal = "already_terminal",
    }
}

wire_enum! {
    /// Run status (`RC/src/run/run.ts`).
    RunStatus {
        Cancelled = "cancelled",
        Created = "created",
        Dispatching = "dispatching",
        Failed = "failed",
        Lost = "lost",
        Queued = "queued",
        RetryWait = "retry_wait",
        Running = "running",
        Succeeded = "succeeded",
        TimedOut = "timed_out",
        WaitingApproval = "waiting_approval",
    }
}

wire_enum! {
    /// Attempt status (`RC/src/run/run.ts`).
    AttemptStatus {
        Cancelled = "cancelled",
        Claimed = "claimed",
        Failed = "failed",
        Lost = "lost",
        Running = "running",
        Starting = "starting",
        Succeeded = "succeeded",
        TimedOut = "timed_out",
    }
}

/// Which of the three consistent snapshot shapes a snapshot has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SnapshotShape {
    /// `dispatching/starting`, no handle, start, finish or error.
    Starting,
    /// `running/running` with handle and start, no finish or error.
    Running,
    /// Equal terminal statuses (`failed|cancelled|timed_out`) with finish and error, no handle
    /// or start.
    Terminal,
}

/// The control plane's view of the Run and Attempt after an activation command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActivationSnapshot {
    /// Run (equals the request's).
    pub run_id: RunId,
    /// Attempt (equals the request's).
    pub attempt_id: AttemptId,
    /// Run status.
    pub run_status: RunStatus,
    /// Attempt status.
    pub attempt_status: AttemptStatus,
    /// Lease version.
    pub lease_version: LeaseVersion,
    /// Lease generation (equals the request's).
    pub lease_generation: u64,
    /// Callback sequence, `0..=2^31-1`.
    pub callback_sequence: u64,
    /// Durable deadline (present iff the revision has `timeoutMs`; checked by the processor).
    pub deadline_at_ms: Option<UnixMillis>,
    /// When the Attempt started running.
    pub started_at_ms: Option<UnixMillis>,
    /// When it finished.
    pub finished_at_ms: Option<UnixMillis>,
    /// The executor handle the control plane recorded.
    pub executor_handle: Option<ExecutorHandle>,
    /// The log id the control plane recorded (≤ 36, no control characters).
    pub log_artifact_id: Option<String>,
    /// The terminal error code (≤ 128, no control characters).
    pub error_code: Option<String>,
}

/// A parsed activation response, bound to its request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActivationResponse {
    /// Outcome.
    pub status: ActivationStatus,
    /// The snapshot.
    pub snapshot: ActivationSnapshot,
    /// Its shape (`already_*` statuses require the matching shape).
    pub shape: SnapshotShape,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ResponseWire {
    schema: String,
    status: ActivationStatus,
    snapshot: SnapshotWire,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SnapshotWire {
    run_id: String,
    attempt_id: String,
    run_status: RunStatus,
    attempt_status: AttemptStatus,
    lease_version: u64,
    lease_generation: u64,
    callback_sequence: u64,
    #[serde(default, deserialize_with = "present")]
    deadline_at_ms: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    started_at_ms: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    finished_at_ms: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    executor_handle: Option<String>,
    #[serde(default, deserialize_with = "present")]
    log_artifact_id: Option<String>,
    #[serde(default, deserialize_with = "present")]
    error_code: Option<String>,
}

fn time(value: Option<u64>, path: &'static str) -> Result<Option<UnixMillis>, WireError> {
    value.map(|v| id(UnixMillis::new(v), path)).transpose()
}

impl SnapshotWire {
    fn into_snapshot(self) -> Result<ActivationSnapshot, WireError> {
        ensure(
            self.lease_generation <= MAX_INT32,
            "snapshot.leaseGeneration",
            "0..=2^31-1",
        )?;
        ensure(
            self.callback_sequence <= MAX_INT32,
            "snapshot.callbackSequence",
            "0..=2^31-1",
        )?;
        ensure(
            self.log_artifact_id
                .as_deref()
                .is_none_or(|log| bounded_text(log, 36)),
            "snapshot.logArtifactId",
            "1..=36 characters",
        )?;
        ensure(
            self.error_code
                .as_deref()
                .is_none_or(|code| bounded_text(code, 128)),
            "snapshot.errorCode",
            "1..=128 characters",
        )?;
        Ok(ActivationSnapshot {
            run_id: id(RunId::new(self.run_id), "snapshot.runId")?,
            attempt_id: id(AttemptId::new(self.attempt_id), "snapshot.attemptId")?,
            run_status: self.run_status,
            attempt_status: self.attempt_status,
            lease_version: id(
                LeaseVersion::new(self.lease_version),
                "snapshot.leaseVersion",
            )?,
            lease_generation: self.lease_generation,
            callback_sequence: self.callback_sequence,
            deadline_at_ms: time(self.deadline_at_ms, "snapshot.deadlineAtMs")?,
            started_at_ms: time(self.started_at_ms, "snapshot.startedAtMs")?,
            finished_at_ms: time(self.finished_at_ms, "snapshot.finishedAtMs")?,
            executor_handle: self
                .executor_handle
                .map(|h| id(ExecutorHandle::new(h), "snapshot.executorHandle"))
                .transpose()?,
            log_artifact_id: self.log_artifact_id,
            error_code: self.error_code,
        })
    }
}

impl ActivationSnapshot {
    /// The consistent shape of this snapshot, if any.
    #[must_use]
    pub fn shape(&self) -> Option<SnapshotShape> {
        use AttemptStatus as A;
        use RunStatus as R;
        // (executor handle, started, finished, error code) present.
        let facts = (
            self.executor_handle.is_some(),
            self.started_at_ms.is_some(),
            self.finished_at_ms.is_some(),
            self.error_code.is_some(),
        );
        match (self.run_status, self.attempt_status, facts) {
            (R::Dispatching, A::Starting, (false, false, false, false)) => {
                Some(SnapshotShape::Starting)
            }
            (R::Running, A::Running, (true, true, false, false)) => Some(SnapshotShape::Running),
            (R::Failed, A::Failed, (false, false, true, true))
            | (R::Cancelled, A::Cancelled, (false, false, true, true))
            | (R::TimedOut, A::TimedOut, (false, false, true, true)) => {
                Some(SnapshotShape::Terminal)
            }
            _ => None,
        }
    }
}

impl ActivationResponse {
    /// Parses strictly (16 KiB cap first) and binds the snapshot to `request`: `runId`,
    /// `attemptId` and `leaseGeneration` must equal the request's; the snapshot must have one of
    /// the three consistent shapes and `already_starting|running|terminal` the matching one.
    ///
    /// # Errors
    /// [`WireError`] naming the first violation.
    pub fn parse(bytes: &[u8], request: &ActivationRequest) -> Result<Self, WireError> {
        let wire: ResponseWire = parse_json("activation", bytes, MAX_RESPONSE_BYTES)?;
        exact(&wire.schema, SCHEMA, "schema")?;
        let snapshot = wire.snapshot.into_snapshot()?;
        let shape = snapshot.shape().ok_or(WireError::Field {
            path: "snapshot",
            rule: "one of the starting, running or terminal shapes",
        })?;
        let agrees = match wire.status {
            ActivationStatus::Applied => true,
            ActivationStatus::AlreadyStarting => shape == SnapshotShape::Starting,
            ActivationStatus::AlreadyRunning => shape == SnapshotShape::Running,
            ActivationStatus::AlreadyTerminal => shape == SnapshotShape::Terminal,
        };
        ensure(agrees, "status", "consistent with the snapshot shape")?;
        let f = &request.fence;
        bind_to_request! {
            snapshot.run_id == f.run_id => "snapshot.runId" as "runId";
            snapshot.attempt_id == f.attempt_id => "snapshot.attemptId" as "attemptId";
            snapshot.lease_generation == f.lease_generation.get()
                => "snapshot.leaseGeneration" as "leaseGeneration";
        }
        Ok(Self {
            status: wire.status,
            snapshot,
            shape,
        })
    }
}
