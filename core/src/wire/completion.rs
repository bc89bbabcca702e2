//! `POST …/completion` (reference §2.8, schema `qinglong/remote-worker-completion@v1`).
//! No plaintext callback token ever crosses the wire: only its digest.

use alloc::string::String;
use alloc::vec::Vec;

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::{Fence, Schema, WireError, exact, id, parse_json, require, sealed_body};
use crate::ids::{
    AttemptId, CallbackSequence, CapabilityDigest, LogArtifactId, RunId, Sha256Digest,
};
use crate::time::UnixMillis;

/// Schema id (request and response).
pub const SCHEMA: &str = "qinglong/remote-worker-completion@v1";
/// `MAX_REMOTE_WORKER_COMPLETION_REQUEST_BYTES` (an explicit opt-in above 4 KiB).
pub const MAX_REQUEST_BYTES: usize = 16 * 1024;
/// `MAX_REMOTE_WORKER_COMPLETION_RESPONSE_BYTES`.
pub const MAX_RESPONSE_BYTES: usize = 4 * 1024;

/// How the process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// `succeeded` (exit code 0).
    Succeeded,
    /// `failed` (exit code 1..=255).
    Failed,
}

/// The execution result; serializes as the request's `result` object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CompletionResult {
    /// Outcome; `Succeeded` iff `exit_code == 0`.
    pub outcome: Outcome,
    /// Durable start time.
    pub started_at_ms: UnixMillis,
    /// Finish time (≥ start).
    pub finished_at_ms: UnixMillis,
    /// Exit code 0..=255.
    pub exit_code: u8,
}

impl CompletionResult {
    /// The result for an exit code; the outcome follows from it.
    #[must_use]
    pub fn from_exit(started_at_ms: UnixMillis, finished_at_ms: UnixMillis, exit_code: u8) -> Self {
        Self {
            outcome: if exit_code == 0 {
                Outcome::Succeeded
            } else {
                Outcome::Failed
            },
            started_at_ms,
            finished_at_ms,
            exit_code,
        }
    }
}

/// The uploaded log the completion refers to; serializes as the request's `artifact` object.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CompletionArtifact {
    /// The log id.
    pub log_artifact_id: LogArtifactId,
    /// Its length, `0..=64 MiB`.
    pub byte_length: u64,
    /// SHA-256 of its content.
    pub sha256: Sha256Digest,
    /// Truncation fact; `None` = unknown (`null`).
    pub truncated: Option<bool>,
}

/// The completion request. Serializes as its body without the schema, with the lease token as
/// the placeholder [`Self::to_body`] fills in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CompletionRequest {
    /// The execution fence.
    #[serde(flatten)]
    pub fence: Fence,
    /// Callback sequence of the running ACK.
    pub callback_sequence: CallbackSequence,
    /// SHA-256 of the raw 32-byte completion capability; sent as is.
    #[serde(serialize_with = "super::exposed_digest")]
    pub callback_token_digest: CapabilityDigest,
    /// The result.
    pub result: CompletionResult,
    /// The artifact.
    pub artifact: CompletionArtifact,
}

impl CompletionRequest {
    /// The request body (≤ 16 KiB); carries the lease token, so it is wiped on drop.
    ///
    /// # Errors
    /// [`WireError::Request`] for an inconsistent result or oversized artifact.
    pub fn to_body(&self) -> Result<Zeroizing<Vec<u8>>, WireError> {
        let r = &self.result;
        let a = &self.artifact;
        require(
            r.finished_at_ms >= r.started_at_ms,
            "result.finishedAtMs",
            ">= result.startedAtMs",
        )?;
        require(
            (r.outcome == Outcome::Succeeded) == (r.exit_code == 0),
            "result.outcome",
            "succeeded iff exitCode is 0",
        )?;
        require(
            a.byte_length <= super::artifact::MAX_ARTIFACT_BYTES,
            "artifact.byteLength",
            "0..=64 MiB",
        )?;
        sealed_body(
            &Schema::new(SCHEMA, self),
            &self.fence.lease_token,
            "completion",
            MAX_REQUEST_BYTES,
        )
    }
}

wire_enum! {
    /// Completion outcome at the control plane.
    CompletionStatus {
        /// Exact replay.
        AlreadyCompleted = "already_completed",
        /// Another terminal outcome won.
        AlreadyTerminal = "already_terminal",
        Applied = "applied",
    }
}

/// A parsed completion response, bound to the request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompletionResponse {
    /// Outcome.
    pub status: CompletionStatus,
    /// Run (equals the request's).
    pub run_id: RunId,
    /// Attempt (equals the request's).
    pub attempt_id: AttemptId,
    /// Sequence (equals the request's).
    pub callback_sequence: CallbackSequence,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ResponseWire {
    schema: String,
    status: CompletionStatus,
    run_id: String,
    attempt_id: String,
    callback_sequence: u64,
}

impl CompletionResponse {
    /// Parses strictly (4 KiB cap first) and binds `runId, attemptId, callbackSequence` to the
    /// request.
    ///
    /// # Errors
    /// [`WireError`] naming the first violation.
    pub fn parse(bytes: &[u8], request: &CompletionRequest) -> Result<Self, WireError> {
        let wire: ResponseWire = parse_json("completion", bytes, MAX_RESPONSE_BYTES)?;
        exact(&wire.schema, SCHEMA, "schema")?;
        let response = Self {
            status: wire.status,
            run_id: id(RunId::new(wire.run_id), "runId")?,
            attempt_id: id(AttemptId::new(wire.attempt_id), "attemptId")?,
            callback_sequence: id(
                CallbackSequence::new(wire.callback_sequence),
                "callbackSequence",
            )?,
        };
        bind_to_request! {
            response.run_id == request.fence.run_id => "runId";
            response.attempt_id == request.fence.attempt_id => "attemptId";
            response.callback_sequence == request.callback_sequence => "callbackSequence";
        }
        Ok(response)
    }
}
