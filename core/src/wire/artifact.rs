//! `POST …/artifacts` (reference §2.7, schema `qinglong/remote-worker-artifact-upload@v1`): one
//! framed, streamed log upload — a 4-byte big-endian header length `N` (`2..=4096`), `N` bytes of
//! JSON header, then exactly `byteLength` raw log bytes; `content-length = 4 + N + byteLength`.
//! Also the derived log artifact id (reference §5.4).

use alloc::string::String;
use alloc::vec::Vec;

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::{Fence, Schema, WireError, bind, ensure, exact, id, parse_json, require, sealed_body};
use crate::ids::{AttemptId, LogArtifactId, OfferId, ProjectId, RunId, Sha256Digest};

/// Schema id (header and response).
pub const SCHEMA: &str = "qinglong/remote-worker-artifact-upload@v1";
/// Request media type.
pub const CONTENT_TYPE: &str = "application/vnd.qinglong.worker-artifact";
/// `MAX_REMOTE_WORKER_ARTIFACT_BYTES`: largest log content.
pub const MAX_ARTIFACT_BYTES: u64 = 64 * 1024 * 1024;
/// `MAX_REMOTE_WORKER_ARTIFACT_HEADER_BYTES`.
pub const MAX_HEADER_BYTES: usize = 4 * 1024;
/// Smallest header.
pub const MIN_HEADER_BYTES: usize = 2;
/// `MAX_REMOTE_WORKER_ARTIFACT_RESPONSE_BYTES`.
pub const MAX_RESPONSE_BYTES: usize = 4 * 1024;
/// Largest request body: `64 MiB + 4 KiB + 4`.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024 * 1024 + 4 * 1024 + 4;

/// The log artifact id of an offer: `"wlog-"` + the first 30 hex characters of
/// `SHA-256("qinglong/worker-log-artifact@v1" \0 projectId \0 runId \0 attemptId \0 offerId)`.
/// Stable for a replayed offer.
#[must_use]
pub fn derive_log_artifact_id(
    project_id: &ProjectId,
    run_id: &RunId,
    attempt_id: &AttemptId,
    offer_id: &OfferId,
) -> LogArtifactId {
    let mut data = b"qinglong/worker-log-artifact@v1".to_vec();
    for part in [
        project_id.as_str(),
        run_id.as_str(),
        attempt_id.as_str(),
        offer_id.as_str(),
    ] {
        data.push(0);
        data.extend_from_slice(part.as_bytes());
    }
    let hex = Sha256Digest::of(&data).to_hex();
    // INVARIANT: "wlog-" + 30 lowercase hex always satisfies the LogArtifactId rule.
    LogArtifactId::new(alloc::format!("wlog-{}", &hex[..30]))
        .unwrap_or_else(|_| unreachable!("derived log id is well-formed"))
}

/// The upload header (the JSON inside the frame); serializes as its keys after the schema, with
/// the lease token as the placeholder [`Self::header_json`] fills in.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ArtifactUpload {
    /// The execution fence.
    #[serde(flatten)]
    pub fence: Fence,
    /// The log id.
    pub log_artifact_id: LogArtifactId,
    /// Exact number of content bytes that follow, `0..=64 MiB`.
    pub byte_length: u64,
    /// Whether the log was truncated; `None` = unknown (sent as `null`).
    pub truncated: Option<bool>,
}

impl ArtifactUpload {
    /// The header JSON; carries the lease token, so it is wiped on drop.
    ///
    /// # Errors
    /// [`WireError::Request`] above 64 MiB of content, [`WireError::RequestTooLarge`] for a
    /// header above 4 KiB.
    pub fn header_json(&self) -> Result<Zeroizing<Vec<u8>>, WireError> {
        require(
            self.byte_length <= MAX_ARTIFACT_BYTES,
            "byteLength",
            "0..=64 MiB",
        )?;
        sealed_body(
            &Schema::new(SCHEMA, self),
            &self.fence.lease_token,
            "artifacts",
            MAX_HEADER_BYTES,
        )
    }

    /// The frame preamble: 4-byte big-endian header length, then the header. The caller streams
    /// exactly `byte_length` content bytes after it.
    ///
    /// # Errors
    /// As [`Self::header_json`].
    pub fn preamble(&self) -> Result<Zeroizing<Vec<u8>>, WireError> {
        let header = self.header_json()?;
        let mut out = Zeroizing::new(Vec::with_capacity(4 + header.len()));
        let len = u32::try_from(header.len()).unwrap_or(u32::MAX);
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&header);
        Ok(out)
    }
}

/// Upload outcome.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UploadStatus {
    /// `already_stored` (exact replay of the same identity and digest).
    AlreadyStored,
    /// `stored`.
    Stored,
}

/// The upload receipt, bound to the upload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ArtifactReceipt {
    /// Outcome.
    pub status: UploadStatus,
    /// SHA-256 of the stored content (equals the Worker's streaming digest).
    pub sha256: Sha256Digest,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ReceiptWire {
    schema: String,
    status: UploadStatus,
    project_id: String,
    run_id: String,
    attempt_id: String,
    log_artifact_id: String,
    byte_length: u64,
    sha256: String,
    #[serde(deserialize_with = "super::de::nullable")]
    truncated: Option<bool>,
}

impl ArtifactReceipt {
    /// Parses strictly (4 KiB cap first) and binds to the upload: `projectId, runId, attemptId,
    /// logArtifactId, byteLength, truncated` equal what was sent, and `sha256` equals `sent`, the
    /// Worker's own streaming digest of the bytes it sent.
    ///
    /// # Errors
    /// [`WireError`] naming the first violation.
    pub fn parse(
        bytes: &[u8],
        upload: &ArtifactUpload,
        sent: &Sha256Digest,
    ) -> Result<Self, WireError> {
        let wire: ReceiptWire = parse_json("artifacts", bytes, MAX_RESPONSE_BYTES)?;
        exact(&wire.schema, SCHEMA, "schema")?;
        ensure(
            wire.byte_length <= MAX_ARTIFACT_BYTES,
            "byteLength",
            "0..=64 MiB",
        )?;
        let sha256 = id(Sha256Digest::from_hex(&wire.sha256), "sha256")?;
        let f = &upload.fence;
        bind_to_request! {
            "the upload's":
            wire.project_id == f.project_id.as_str() => "projectId";
            wire.run_id == f.run_id.as_str() => "runId";
            wire.attempt_id == f.attempt_id.as_str() => "attemptId";
            wire.log_artifact_id == upload.log_artifact_id.as_str() => "logArtifactId";
            wire.byte_length == upload.byte_length => "byteLength";
            wire.truncated == upload.truncated => "truncated";
        }
        bind(sha256 == *sent, "sha256", "the SHA-256 of the bytes sent")?;
        Ok(Self {
            status: wire.status,
            sha256,
        })
    }
}
