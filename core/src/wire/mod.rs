//! Wire contracts with the control plane (reference §2), byte-compatible with Qinglong's
//! TypeScript reference.
//!
//! * **Requests** are built from domain values and serialize to exactly the reference's keys, in
//!   its key order, within its byte caps. Bodies that carry the lease token come back as
//!   [`Zeroizing`](zeroize::Zeroizing) buffers allocated once: the caller sends, then drops.
//! * **Responses** are parsed strictly: the byte cap (and the 2-byte floor) is checked before
//!   parsing, every object has an exact key set (unknown, missing or duplicate key ⇒ error),
//!   optional keys may not be `null`, always-present keys may not be missing, numbers must be
//!   integers within the reference bounds, and every response is bound to the request that
//!   produced it.
//! * Errors are typed, name the field path and the rule, and never echo values.
//!
//! One module per endpoint family: [`offer`] (`offers` + offer admission), [`activation`]
//! (`starting`, `running`, `start-failure`), [`secrets`], [`artifact`] (`artifacts` framing and
//! the log id), [`completion`], [`lease_control`], [`session`] (`register`, `heartbeat`,
//! `transition`, capabilities), [`route`], [`auth`] and [`error`] (the `{"code":…}` body and
//! status mapping). See `docs/wire.md`.

use alloc::string::String;
use core::fmt;

use serde::Deserialize;

pub mod activation;
pub mod artifact;
pub mod auth;
pub mod completion;
pub(crate) mod de;
pub mod error;
pub mod lease_control;
pub mod offer;
pub mod route;
pub mod secrets;
pub mod semver;
pub mod session;

pub use artifact::derive_log_artifact_id;

/// Default request body cap of the Worker client (4 KiB).
pub const DEFAULT_REQUEST_CAP: usize = 4 * 1024;
/// Hard request body cap of the Worker client for JSON (64 KiB, opt-in per endpoint).
pub const HARD_REQUEST_CAP: usize = 64 * 1024;
/// Ceiling of any response cap (256 KiB).
pub const MAX_RESPONSE_CAP: usize = 256 * 1024;
/// Smallest response body accepted.
pub const MIN_RESPONSE_BYTES: usize = 2;

/// A JSON text the serde layer refused (syntax, type, unknown/missing/duplicate key), with the
/// position. `detail` is serde's message cut before the first quoted string literal (and reduced
/// to "unknown variant" for enum values), so a value is never echoed; key names may appear.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonError {
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// What kind of rejection.
    pub category: JsonCategory,
    /// serde's message, truncated before any quoted value, at most 160 bytes.
    pub detail: String,
}

/// The class of a [`JsonError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JsonCategory {
    /// Not JSON.
    Syntax,
    /// Valid JSON of the wrong shape (keys, types, bounds checked by serde).
    Data,
    /// Truncated input.
    Eof,
    /// I/O (cannot happen for in-memory parsing).
    Io,
}

impl JsonError {
    pub(crate) fn from_serde(error: &serde_json::Error) -> Self {
        use alloc::string::ToString as _;
        let category = match error.classify() {
            serde_json::error::Category::Syntax => JsonCategory::Syntax,
            serde_json::error::Category::Data => JsonCategory::Data,
            serde_json::error::Category::Eof => JsonCategory::Eof,
            serde_json::error::Category::Io => JsonCategory::Io,
        };
        let full = error.to_string();
        let mut detail: &str = full.split(" at line ").next().unwrap_or("");
        if let Some(quote) = detail.find('"') {
            detail = &detail[..quote];
        }
        // "unknown variant `<value>`, expected …" quotes the value itself.
        if detail.starts_with("unknown variant") {
            detail = "unknown variant";
        }
        let mut end = detail.len().min(160);
        while !detail.is_char_boundary(end) {
            end -= 1;
        }
        Self {
            line: error.line(),
            column: error.column(),
            category,
            detail: String::from(detail[..end].trim_end()),
        }
    }
}

impl JsonError {
    /// Refuses a body that is not UTF-8 as a whole. Every string is checked by serde anyway; this
    /// also covers the strings read as JavaScript strings ([`JsString`]), whose WTF-8 may only
    /// hold surrogates that came from `\u` escapes. Node would decode invalid bytes to U+FFFD.
    ///
    /// [`JsString`]: crate::js::JsString
    pub(crate) fn check_utf8(bytes: &[u8]) -> Result<(), Self> {
        let Err(error) = core::str::from_utf8(bytes) else {
            return Ok(());
        };
        let valid = &bytes[..error.valid_up_to()];
        let line = 1 + valid.iter().filter(|b| **b == b'\n').count();
        let column = 1 + valid.iter().rev().take_while(|b| **b != b'\n').count();
        Err(Self {
            line,
            column,
            category: JsonCategory::Syntax,
            detail: String::from("invalid UTF-8"),
        })
    }
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let category = match self.category {
            JsonCategory::Syntax => "syntax",
            JsonCategory::Data => "shape",
            JsonCategory::Eof => "truncated",
            JsonCategory::Io => "io",
        };
        write!(
            f,
            "{category} error at line {} column {}: {}",
            self.line, self.column, self.detail
        )
    }
}

/// A wire contract violation. Blame: the control plane for responses, the caller for requests
/// ([`WireError::Request`], [`WireError::RequestTooLarge`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WireError {
    /// The response size is outside `2..=cap` bytes; checked before parsing.
    Size {
        /// Which response.
        endpoint: &'static str,
        /// Its length.
        len: usize,
        /// The cap.
        cap: usize,
    },
    /// The body is not JSON of the exact shape.
    Json {
        /// Which body.
        endpoint: &'static str,
        /// Where and why.
        error: JsonError,
    },
    /// A field breaks its bound, enum or pattern.
    Field {
        /// Field path, as named on the wire.
        path: &'static str,
        /// The rule.
        rule: &'static str,
    },
    /// A field is not bound to the request (or claim, or Session) that produced the response.
    Mismatch {
        /// Field path of the response.
        path: &'static str,
        /// What it must equal.
        must_equal: &'static str,
    },
    /// The execution revision is invalid or its digest does not match.
    Revision(crate::revision::RevisionError),
    /// A request cannot be built from these values.
    Request {
        /// Field path of the request.
        path: &'static str,
        /// The rule.
        rule: &'static str,
    },
    /// A request would exceed its byte cap.
    RequestTooLarge {
        /// Which request.
        endpoint: &'static str,
        /// The cap.
        cap: usize,
    },
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Size { endpoint, len, cap } => write!(
                f,
                "{endpoint} response of {len} bytes is outside 2..={cap} bytes"
            ),
            Self::Json { endpoint, error } => write!(f, "{endpoint} JSON rejected: {error}"),
            Self::Field { path, rule } => write!(f, "response field {path} must be {rule}"),
            Self::Mismatch { path, must_equal } => {
                write!(f, "response field {path} must equal {must_equal}")
            }
            Self::Revision(error) => write!(f, "offer executionRevision rejected: {error}"),
            Self::Request { path, rule } => write!(f, "request field {path} must be {rule}"),
            Self::RequestTooLarge { endpoint, cap } => {
                write!(f, "{endpoint} request exceeds its {cap} byte cap")
            }
        }
    }
}

impl core::error::Error for WireError {}

impl From<crate::revision::RevisionError> for WireError {
    fn from(error: crate::revision::RevisionError) -> Self {
        Self::Revision(error)
    }
}

/// Checks the byte cap, then parses the exact shape `T`.
pub(crate) fn parse_json<'de, T: Deserialize<'de>>(
    endpoint: &'static str,
    bytes: &'de [u8],
    cap: usize,
) -> Result<T, WireError> {
    if bytes.len() < MIN_RESPONSE_BYTES || bytes.len() > cap {
        return Err(WireError::Size {
            endpoint,
            len: bytes.len(),
            cap,
        });
    }
    JsonError::check_utf8(bytes).map_err(|error| WireError::Json { endpoint, error })?;
    serde_json::from_slice(bytes).map_err(|e| WireError::Json {
        endpoint,
        error: JsonError::from_serde(&e),
    })
}

pub(crate) fn field(path: &'static str, rule: &'static str) -> WireError {
    WireError::Field { path, rule }
}

pub(crate) fn ensure(ok: bool, path: &'static str, rule: &'static str) -> Result<(), WireError> {
    if ok { Ok(()) } else { Err(field(path, rule)) }
}

pub(crate) fn bind(
    ok: bool,
    path: &'static str,
    must_equal: &'static str,
) -> Result<(), WireError> {
    if ok {
        Ok(())
    } else {
        Err(WireError::Mismatch { path, must_equal })
    }
}

/// Maps a newtype validation error to a field error.
pub(crate) fn id<T>(
    result: Result<T, crate::error::IdError>,
    path: &'static str,
) -> Result<T, WireError> {
    result.map_err(|e| field(path, e.rule))
}

/// Requires an exact constant (a schema id or a fixed string).
pub(crate) fn exact(
    value: &str,
    expected: &'static str,
    path: &'static str,
) -> Result<(), WireError> {
    ensure(value == expected, path, expected)
}

/// Finishes a request writer into its buffer, mapping overflow to [`WireError::RequestTooLarge`].
pub(crate) fn finish(
    w: crate::js::JsonWriter,
    endpoint: &'static str,
) -> Result<zeroize::Zeroizing<alloc::vec::Vec<u8>>, WireError> {
    w.finish().map_err(|e| WireError::RequestTooLarge {
        endpoint,
        cap: e.cap,
    })
}

/// The execution fence every post-offer request carries: the Worker generation, the Run lease
/// authority and the lease version the Worker holds. Built from the inbox's [`Offer`].
///
/// [`Offer`]: crate::offer::Offer
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    /// Session generation (`workerGeneration`).
    pub worker_generation: crate::ids::WorkerGeneration,
    /// Project (`projectId`).
    pub project_id: crate::ids::ProjectId,
    /// Run (`runId`).
    pub run_id: crate::ids::RunId,
    /// Attempt (`attemptId`).
    pub attempt_id: crate::ids::AttemptId,
    /// Offer (`offerId`).
    pub offer_id: crate::ids::OfferId,
    /// Lease generation (`leaseGeneration`).
    pub lease_generation: crate::ids::LeaseGeneration,
    /// The lease capability (`leaseToken`); redacted in `Debug`.
    pub lease_token: crate::ids::LeaseToken,
    /// The lease version persisted in the inbox (`expectedLeaseVersion`).
    pub expected_lease_version: crate::ids::LeaseVersion,
}

impl Fence {
    /// The fence of `offer` at its current lease version.
    #[must_use]
    pub fn from_offer(offer: &crate::offer::Offer) -> Self {
        Self {
            worker_generation: offer.worker.generation,
            project_id: offer.candidate.project_id.clone(),
            run_id: offer.candidate.run_id.clone(),
            attempt_id: offer.candidate.attempt_id.clone(),
            offer_id: offer.offer_id.clone(),
            lease_generation: offer.lease.lease_generation,
            lease_token: offer.lease_token.clone(),
            expected_lease_version: offer.lease.version,
        }
    }

    /// The 7 activation fence keys, in the reference order (no `projectId`, no schema).
    pub(crate) fn write_activation(&self, w: &mut crate::js::JsonWriter) {
        w.field_str("runId", self.run_id.as_str())
            .field_str("attemptId", self.attempt_id.as_str())
            .field_uint("workerGeneration", self.worker_generation.get())
            .field_str("offerId", self.offer_id.as_str())
            .field_uint("leaseGeneration", self.lease_generation.get())
            .field_str("leaseToken", self.lease_token.expose())
            .field_uint("expectedLeaseVersion", self.expected_lease_version.get());
    }

    /// The 8 execution fence keys of artifact, completion and lease-control bodies.
    pub(crate) fn write_execution(&self, w: &mut crate::js::JsonWriter) {
        w.field_uint("workerGeneration", self.worker_generation.get())
            .field_str("projectId", self.project_id.as_str())
            .field_str("runId", self.run_id.as_str())
            .field_str("attemptId", self.attempt_id.as_str())
            .field_str("offerId", self.offer_id.as_str())
            .field_uint("leaseGeneration", self.lease_generation.get())
            .field_str("leaseToken", self.lease_token.expose())
            .field_uint("expectedLeaseVersion", self.expected_lease_version.get());
    }
}
