//! The completion receipt (reference §5.5; ADR-0116 §3): written by the supervisor when the
//! user process exits, read and authenticated by the completion coordinator. It is the only file
//! that ever holds the completion capability (as canonical base64url), and only until the
//! completion is durably acknowledged.

use alloc::string::String;

use serde::{Deserialize, Serialize};

use crate::capability::Capability;
use crate::ids::{AttemptId, CallbackSequence, RunId};
use crate::secret::SecretString;
use crate::time::UnixMillis;

/// Largest receipt envelope (`MAX_COMPLETION_RECEIPT_BYTES`).
pub const MAX_RECEIPT_BYTES: usize = 4 * 1024;
/// Schema version of the receipt body.
pub const RECEIPT_SCHEMA_VERSION: u8 = 1;

crate::secret::secret_token!(
    /// The base64url text of the completion capability as written in a receipt,
    /// `[A-Za-z0-9_-]{32,128}`: a validated [`SecretString`] (wiped on drop, redacted in `Debug`
    /// and human-readable output, compared in constant time; its canonical decoding is checked at
    /// authentication).
    ReceiptToken,
    ReceiptShapeError,
    ReceiptShapeError::Token
);

impl ReceiptToken {
    /// The receipt form of `capability`: canonical base64url of its 32 bytes (43 characters).
    #[must_use]
    pub fn of(capability: &Capability) -> Self {
        let mut text = capability.to_base64url();
        Self::new(core::mem::take(&mut *text))
            .expect("invariant: 32 bytes encode to 43 base64url characters, a valid receipt token")
    }
}

/// The receipt: the reference's eight fields.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Receipt {
    /// Always [`RECEIPT_SCHEMA_VERSION`].
    pub schema_version: u8,
    /// Run.
    pub run_id: RunId,
    /// Attempt (also the file name).
    pub attempt_id: AttemptId,
    /// Callback sequence from the `launching` record.
    pub callback_sequence: CallbackSequence,
    /// base64url of the 32-byte completion capability.
    pub token: ReceiptToken,
    /// `executorStartedAtMs` of the record.
    pub started_at_ms: UnixMillis,
    /// When the user process ended, `>= started_at_ms`.
    pub finished_at_ms: UnixMillis,
    /// Exit code, or 128 + signal number.
    pub exit_code: u8,
}

/// A receipt that breaks its own shape rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptShapeError {
    /// `schemaVersion` is not 1.
    #[error("receipt schemaVersion must be 1")]
    SchemaVersion,
    /// The token is not `[A-Za-z0-9_-]{32,128}`.
    #[error("receipt token must match [A-Za-z0-9_-]{{32,128}}")]
    Token,
    /// `finishedAtMs < startedAtMs`.
    #[error("receipt finishedAtMs must be >= startedAtMs")]
    FinishedBeforeStarted,
}

impl Receipt {
    /// Shape rules (authentication against the record is separate).
    ///
    /// # Errors
    /// The first [`ReceiptShapeError`].
    pub fn validate(&self) -> Result<(), ReceiptShapeError> {
        if self.schema_version != RECEIPT_SCHEMA_VERSION {
            return Err(ReceiptShapeError::SchemaVersion);
        }
        if self.finished_at_ms < self.started_at_ms {
            return Err(ReceiptShapeError::FinishedBeforeStarted);
        }
        Ok(())
    }
}

/// Why a receipt does not authenticate against its inbox record (reference §4.5 step 4). The
/// receipt is kept as evidence; nothing is uploaded or completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReceiptError {
    /// The token is not canonical base64url of exactly 32 bytes.
    #[error("receipt token is not canonical base64url of exactly 32 bytes")]
    TokenEncoding,
    /// SHA-256 of the token bytes differs from the persisted digest.
    #[error("receipt token does not match the persisted digest")]
    TokenDigest,
    /// Run, Attempt or callback sequence differ from the record.
    #[error("receipt {field} differs from the inbox record")]
    Identity {
        /// Which field.
        field: &'static str,
    },
    /// `startedAtMs` differs from the record's `executorStartedAtMs`.
    #[error("receipt startedAtMs differs from executorStartedAtMs")]
    StartTime,
    /// `finishedAtMs` is after both `now` and `startedAtMs`.
    #[error("receipt finishedAtMs is in the future")]
    FinishedInFuture,
    /// The record has no barrier fields to authenticate against.
    #[error("the inbox record has no launch barrier to authenticate against")]
    RecordWithoutBarrier,
}

/// The facts of an authenticated receipt (the token is gone: only its proof remains).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AuthenticatedReceipt {
    /// Callback sequence.
    pub callback_sequence: CallbackSequence,
    /// Start (equals `executorStartedAtMs`).
    pub started_at_ms: UnixMillis,
    /// End.
    pub finished_at_ms: UnixMillis,
    /// Exit code (128 + signal for a signalled process).
    pub exit_code: u8,
}

/// Authenticates `receipt` against the inbox record's barrier fields (ADR-0116 §3; reference
/// §4.5 step 4), in SPEC §7's order: the token canonical base64url of exactly 32 bytes whose
/// SHA-256 equals the persisted digest, compared in constant time; exact run, attempt and
/// callback sequence; `startedAtMs == executorStartedAtMs`; `finishedAtMs <= max(now,
/// startedAtMs)`. The decoded bytes are wiped.
///
/// # Errors
/// The first [`ReceiptError`].
pub fn authenticate(
    receipt: &Receipt,
    record: &crate::record::InboxRecord,
    now: UnixMillis,
) -> Result<AuthenticatedReceipt, ReceiptError> {
    let (Some(sequence), Some(digest), Some(started)) = (
        record.completion_receipt_callback_sequence,
        record.completion_receipt_token_digest,
        record.executor_started_at_ms,
    ) else {
        return Err(ReceiptError::RecordWithoutBarrier);
    };
    // The token first (SPEC §7's order): a receipt that can never authenticate says so whatever
    // this host's clock reads, so supervision can tell it from one "finished in the future"
    // that passes once a clock stepped back catches up.
    let bytes = crate::capability::decode_base64url_32(receipt.token.expose())
        .ok_or(ReceiptError::TokenEncoding)?;
    let presented = crate::ids::CapabilityDigest::new(crate::ids::Sha256Digest::of(&bytes[..]));
    if presented != digest {
        return Err(ReceiptError::TokenDigest);
    }
    let candidate = &record.offer.candidate;
    for (same, field) in [
        (receipt.run_id == candidate.run_id, "runId"),
        (receipt.attempt_id == candidate.attempt_id, "attemptId"),
        (receipt.callback_sequence == sequence, "callbackSequence"),
    ] {
        if !same {
            return Err(ReceiptError::Identity { field });
        }
    }
    if receipt.started_at_ms != started {
        return Err(ReceiptError::StartTime);
    }
    // The reference requires `finishedAtMs <= now`. The supervisor writes the later of its
    // clock and `startedAtMs`, so a Run started before the host's clock was stepped back and
    // ended after it has `finishedAtMs == startedAtMs`, ahead of the clock: it is accepted, or
    // its completion would wait until the clock had caught up (issue 16, item 5).
    if receipt.finished_at_ms > now.max(started) {
        return Err(ReceiptError::FinishedInFuture);
    }
    Ok(AuthenticatedReceipt {
        callback_sequence: sequence,
        started_at_ms: receipt.started_at_ms,
        finished_at_ms: receipt.finished_at_ms,
        exit_code: receipt.exit_code,
    })
}

#[cfg(test)]
mod tests {
    use alloc::format;

    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    use super::*;

    #[test]
    fn the_token_of_a_capability_is_its_canonical_base64url() {
        let token = ReceiptToken::of(&Capability::from_bytes([0xff; 32]));
        assert_eq!(token.expose().len(), 43);
        assert_eq!(URL_SAFE_NO_PAD.decode(token.expose()).unwrap(), [0xff; 32]);
        assert_eq!(format!("{token:?}"), "ReceiptToken([redacted])");
        assert_eq!(serde_json::to_string(&token).unwrap(), "\"[redacted]\"");
    }

    #[test]
    fn a_token_of_another_shape_is_refused_without_its_value() {
        for bad in ["short", &"A".repeat(129), &format!("{}+", "A".repeat(42))] {
            assert_eq!(ReceiptToken::new(bad), Err(ReceiptShapeError::Token));
        }
        let text = "A".repeat(43);
        let bytes = postcard::to_allocvec(&ReceiptToken::new(text.as_str()).unwrap()).unwrap();
        let back: ReceiptToken = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back.expose(), text);
        let bad = postcard::to_allocvec("short").unwrap();
        assert!(postcard::from_bytes::<ReceiptToken>(&bad).is_err());
    }
}
