//! `artifacts` (reference §2.7, `remoteWorkerCompletionService.ts`): one framed, streamed log
//! upload into an immutable, digest-authenticated, put-if-absent store.

use std::io::Read;

use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::activation::AttemptStatus;
use ql_worker_core::wire::artifact::{
    ArtifactReceipt, ArtifactUpload, MAX_HEADER_BYTES, MAX_REQUEST_BYTES, MIN_HEADER_BYTES,
    UploadStatus,
};
use ql_worker_core::wire::error::ErrorCode;

use sha2::{Digest, Sha256};

use super::{ControlPlane, CountingReader, CpResponse, Ctx, Handled};
use crate::control_plane::requests::Reject;
use crate::control_plane::state::{ArtifactKey, StoredArtifact};
use crate::server_wire::ToJsonFor as _;

/// Smallest body the service accepts (reference: `contentLength < 6` is invalid).
const MIN_BODY_BYTES: u64 = 6;

/// Read chunk while hashing content.
const CHUNK_BYTES: usize = 64 * 1024;

fn fenced(reason: &'static str) -> Reject {
    Reject::new(ErrorCode::WorkerCompletionFenced, reason)
}

fn short() -> Reject {
    Reject::new(
        ErrorCode::ContentLengthMismatch,
        "body ended before content-length",
    )
}

/// Whether an upload may create a new artifact or only replay an existing one.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// The Attempt is `starting` or `running` with a live lease at the expected version.
    Fresh,
    /// The completion referring to this log was applied with this fence: only an exact replay of
    /// the stored artifact is accepted (`already_stored`), so a Worker that lost the completion
    /// answer can replay its whole upload-then-complete sequence.
    ReplayOnly,
}

/// An upload whose frame was parsed and whose fence was authorized: what storing it needs once
/// its content has streamed.
pub(super) struct Authorized {
    upload: ArtifactUpload,
    mode: Mode,
}

impl Authorized {
    /// Content bytes the frame declares.
    pub(super) fn byte_length(&self) -> u64 {
        self.upload.byte_length
    }
}

/// Streamed content: its length, SHA-256 and first bytes.
pub(super) type Content = (u64, ql_worker_core::ids::Sha256Digest, Vec<u8>);

impl ControlPlane {
    /// `artifacts`, admission half: reads the 4-byte prefix and the header, parses and checks the
    /// frame against `content-length`, and authorizes the fence **before** any content byte is
    /// consumed. The content then streams through [`stream_content`] (which needs no model) and
    /// [`Self::store_artifact`] finishes.
    pub(super) fn admit_artifact(
        &self,
        ctx: &Ctx<'_>,
        content_length: u64,
        body: &mut CountingReader<'_>,
    ) -> Result<Authorized, Reject> {
        if content_length < MIN_BODY_BYTES {
            return Err(Reject::invalid("artifact envelope too short"));
        }
        if content_length > MAX_REQUEST_BYTES as u64 {
            return Err(Reject::new(ErrorCode::RequestTooLarge, "artifact body cap"));
        }
        let mut preamble = vec![0_u8; 4];
        body.read_exact(&mut preamble).map_err(|_| short())?;
        let header_len = u32::from_be_bytes([preamble[0], preamble[1], preamble[2], preamble[3]]);
        let header_len = header_len as usize;
        if !(MIN_HEADER_BYTES..=MAX_HEADER_BYTES).contains(&header_len) {
            return Err(Reject::invalid("artifact header length"));
        }
        preamble.resize(4 + header_len, 0);
        body.read_exact(&mut preamble[4..]).map_err(|_| short())?;
        let (upload, _) =
            crate::server_wire::parse_artifact_preamble(&preamble, Some(content_length))
                .map_err(|_| Reject::invalid("artifact header"))?;
        ctx.storage()?;
        let mode = self.authorize_upload(ctx, &upload)?;
        Ok(Authorized { upload, mode })
    }

    /// `artifacts`, storing half, after the content streamed. Put-if-absent: the same key with
    /// the same length, digest and truncation fact is `already_stored`; anything else under that
    /// key is 409. The fence is not checked again: like the reference, an upload authorized from
    /// its header stays valid if the Run's lease is renewed while the content streams.
    pub(super) fn store_artifact(
        &mut self,
        now: UnixMillis,
        authorized: &Authorized,
        content: Content,
    ) -> Handled {
        let Authorized { upload, mode } = authorized;
        let (byte_length, sha256, head) = content;
        let key = ArtifactKey {
            project_id: upload.fence.project_id.clone(),
            run_id: upload.fence.run_id.clone(),
            attempt_id: upload.fence.attempt_id.clone(),
            log_artifact_id: upload.log_artifact_id.clone(),
        };
        let status = match self.state.artifacts.get(&key) {
            Some(stored) => {
                let same = stored.byte_length == byte_length
                    && stored.sha256 == sha256
                    && stored.truncated == upload.truncated;
                if !same {
                    return Err(fenced("artifact replay differs"));
                }
                UploadStatus::AlreadyStored
            }
            None if *mode == Mode::ReplayOnly => return Err(fenced("attempt is terminal")),
            None => {
                self.state.artifacts.insert(
                    key,
                    StoredArtifact {
                        byte_length,
                        sha256,
                        truncated: upload.truncated,
                        stored_at: now,
                        head,
                    },
                );
                UploadStatus::Stored
            }
        };
        let body = ArtifactReceipt { status, sha256 }.to_json(upload);
        let reason = match status {
            UploadStatus::Stored => "stored",
            UploadStatus::AlreadyStored => "already_stored",
        };
        Ok((CpResponse::ok(body), reason))
    }

    fn authorize_upload(&self, ctx: &Ctx<'_>, upload: &ArtifactUpload) -> Result<Mode, Reject> {
        let fence = crate::control_plane::requests::ExecFence {
            project_id: Some(upload.fence.project_id.clone()),
            run_id: upload.fence.run_id.clone(),
            attempt_id: upload.fence.attempt_id.clone(),
            worker_generation: upload.fence.worker_generation,
            offer_id: upload.fence.offer_id.clone(),
            lease_generation: upload.fence.lease_generation,
            lease_token: upload.fence.lease_token.clone(),
            expected_lease_version: upload.fence.expected_lease_version,
        };
        let (run, lease) = self.check_identity(ctx, &fence).map_err(fenced)?;
        if run
            .log_artifact_id
            .as_deref()
            .is_some_and(|id| id != upload.log_artifact_id.as_str())
        {
            return Err(fenced("log id differs from the running ACK"));
        }
        match run.attempt_status {
            Some(AttemptStatus::Starting | AttemptStatus::Running) => {
                Self::check_live_lease(ctx.now, lease, fence.expected_lease_version)
                    .map_err(fenced)?;
                Ok(Mode::Fresh)
            }
            _ => {
                let replay = run.completion.as_ref().is_some_and(|c| {
                    c.expected_lease_version == fence.expected_lease_version
                        && c.artifact.log_artifact_id == upload.log_artifact_id.as_str()
                });
                if replay {
                    Ok(Mode::ReplayOnly)
                } else {
                    Err(fenced("state mismatch"))
                }
            }
        }
    }
}

/// Reads exactly `len` content bytes, hashing them and keeping the first
/// `keep` (the model's `artifact_head_bytes`). Needs no model: the server runs it without the
/// model's lock.
pub(super) fn stream_content(
    body: &mut CountingReader<'_>,
    len: u64,
    keep: usize,
) -> Result<Content, Reject> {
    let mut hasher = Sha256::new();
    let mut head = Vec::new();
    let mut buf = vec![0_u8; CHUNK_BYTES];
    let mut total = 0_u64;
    while total < len {
        let want = buf
            .len()
            .min(usize::try_from(len - total).unwrap_or(usize::MAX));
        let n = match body.read(&mut buf[..want]) {
            Ok(0) => return Err(short()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => return Err(short()),
        };
        hasher.update(&buf[..n]);
        let room = keep.saturating_sub(head.len()).min(n);
        head.extend_from_slice(&buf[..room]);
        total += n as u64;
    }
    let digest = ql_worker_core::ids::Sha256Digest::from_bytes(hasher.finalize().into());
    Ok((total, digest, head))
}
