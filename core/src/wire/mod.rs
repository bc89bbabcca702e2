//! Wire contracts with the control plane (reference §2), byte-compatible with Qinglong's
//! TypeScript reference.
//!
//! * **Requests** are built from domain values and written by serde_json, from the request
//!   types' own `#[derive(Serialize)]` or from private views where the key order differs from
//!   theirs; field order is the reference's key order, within its byte caps. Bodies that
//!   carry the lease token come back as [`Zeroizing`] buffers, the only allocation that ever
//!   held the token (`sealed_body`): the caller sends, then drops.
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
use alloc::vec::Vec;

use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use crate::ids::{
    AttemptId, CapabilityDigest, LeaseGeneration, LeaseToken, LeaseVersion, OfferId, ProjectId,
    RunId, WorkerGeneration,
};

/// Binds a response to the request that produced it, row by row in order: each
/// `ok => path;` (or `ok => path as what;`) fails with [`WireError::Mismatch`] at `path`, which
/// must equal "the request's `path`" (or `what`). A leading `"the upload's":` (or another
/// owner) names what the fields must equal instead of the request.
macro_rules! bind_to_request {
    (@rule $whose:literal $path:literal) => { concat!($whose, " ", $path) };
    (@rule $whose:literal $path:literal $what:literal) => { concat!($whose, " ", $what) };
    ($whose:literal: $($ok:expr => $path:literal $(as $what:literal)?;)+) => {
        $($crate::wire::bind($ok, $path, bind_to_request!(@rule $whose $path $($what)?))?;)+
    };
    ($($ok:expr => $path:literal $(as $what:literal)?;)+) => {
        bind_to_request!("the request's": $($ok => $path $(as $what)?;)+)
    };
}

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
pub(crate) const DEFAULT_REQUEST_CAP: usize = 4 * 1024;

/// A JSON text the serde layer refused (syntax, type, unknown/missing/duplicate key), with the
/// position. `detail` is serde's message cut before the first quoted string literal (and reduced
/// to "unknown variant" for enum values), so a value is never echoed; key names may appear.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{} error at line {line} column {column}: {detail}", match .category {
    JsonCategory::Syntax => "syntax",
    JsonCategory::Data => "shape",
    JsonCategory::Eof => "truncated",
    JsonCategory::Io => "io",
})]
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

/// The class of a [`JsonError`]: serde_json's own (`Syntax`, `Data` (wrong shape), `Eof`
/// (truncated), `Io` (cannot happen for in-memory parsing)).
pub use serde_json::error::Category as JsonCategory;

impl JsonError {
    /// Parses `bytes` as the exact shape `T` (no byte cap), refusing first a body that is not
    /// UTF-8 as a whole. Every string is checked by serde anyway; this also covers the strings
    /// read as JavaScript strings ([`JsString`]), whose WTF-8 may only hold surrogates that came
    /// from `\u` escapes. Node would decode invalid bytes to U+FFFD.
    ///
    /// [`JsString`]: crate::js::JsString
    pub(crate) fn parse<'de, T: Deserialize<'de>>(bytes: &'de [u8]) -> Result<T, Self> {
        if let Err(error) = core::str::from_utf8(bytes) {
            let valid = &bytes[..error.valid_up_to()];
            return Err(Self {
                line: 1 + valid.iter().filter(|b| **b == b'\n').count(),
                column: 1 + valid.iter().rev().take_while(|b| **b != b'\n').count(),
                category: JsonCategory::Syntax,
                detail: String::from("invalid UTF-8"),
            });
        }
        serde_json::from_slice(bytes).map_err(|error| {
            use alloc::string::ToString as _;
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
                category: error.classify(),
                detail: String::from(detail[..end].trim_end()),
            }
        })
    }
}

/// A wire contract violation. Blame: the control plane for responses, the caller for requests
/// ([`WireError::Request`], [`WireError::RequestTooLarge`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The response size is outside `2..=cap` bytes; checked before parsing.
    #[error("{endpoint} response of {len} bytes is outside 2..={cap} bytes")]
    Size {
        /// Which response.
        endpoint: &'static str,
        /// Its length.
        len: usize,
        /// The cap.
        cap: usize,
    },
    /// The body is not JSON of the exact shape.
    #[error("{endpoint} JSON rejected: {error}")]
    Json {
        /// Which body.
        endpoint: &'static str,
        /// Where and why.
        error: JsonError,
    },
    /// A field breaks its bound, enum or pattern.
    #[error("response field {path} must be {rule}")]
    Field {
        /// Field path, as named on the wire.
        path: &'static str,
        /// The rule.
        rule: &'static str,
    },
    /// A field is not bound to the request (or claim, or Session) that produced the response.
    #[error("response field {path} must equal {must_equal}")]
    Mismatch {
        /// Field path of the response.
        path: &'static str,
        /// What it must equal.
        must_equal: &'static str,
    },
    /// The execution revision is invalid or its digest does not match.
    #[error("offer executionRevision rejected: {0}")]
    Revision(#[from] crate::revision::RevisionError),
    /// A request cannot be built from these values.
    #[error("request field {path} must be {rule}")]
    Request {
        /// Field path of the request.
        path: &'static str,
        /// The rule.
        rule: &'static str,
    },
    /// A request would exceed its byte cap.
    #[error("{endpoint} request exceeds its {cap} byte cap")]
    RequestTooLarge {
        /// Which request.
        endpoint: &'static str,
        /// The cap.
        cap: usize,
    },
}

/// Checks the byte cap, then parses the exact shape `T` (also the server's reader of the
/// artifact frame header in the loopback control plane).
///
/// # Errors
/// [`WireError::Size`] outside `2..=cap` bytes, [`WireError::Json`] for another shape.
pub fn parse_json<'de, T: Deserialize<'de>>(
    endpoint: &'static str,
    bytes: &'de [u8],
    cap: usize,
) -> Result<T, WireError> {
    if !(2..=cap).contains(&bytes.len()) {
        return Err(WireError::Size {
            endpoint,
            len: bytes.len(),
            cap,
        });
    }
    JsonError::parse(bytes).map_err(|error| WireError::Json { endpoint, error })
}

pub(crate) fn field(path: &'static str, rule: &'static str) -> WireError {
    WireError::Field { path, rule }
}

pub(crate) fn ensure(ok: bool, path: &'static str, rule: &'static str) -> Result<(), WireError> {
    if ok { Ok(()) } else { Err(field(path, rule)) }
}

/// A request-side rule: [`WireError::Request`] unless `ok`.
pub(crate) fn require(ok: bool, path: &'static str, rule: &'static str) -> Result<(), WireError> {
    ok.then_some(()).ok_or(WireError::Request { path, rule })
}

pub(crate) fn bind(
    ok: bool,
    path: &'static str,
    must_equal: &'static str,
) -> Result<(), WireError> {
    ok.then_some(())
        .ok_or(WireError::Mismatch { path, must_equal })
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

/// A request body written by serde_json: compact, keys in the order of the view's fields,
/// strings escaped exactly as `JSON.stringify` escapes them (`core/tests/wire_json_escaping.rs`
/// proves it on Node's vectors).
pub(crate) fn body<T: Serialize>(
    view: &T,
    endpoint: &'static str,
    cap: usize,
) -> Result<Vec<u8>, WireError> {
    // INVARIANT: request views hold only strings, integers, booleans, options, sequences and
    // string-keyed maps, which serde_json always serializes.
    let bytes =
        serde_json::to_vec(view).expect("invariant: a request view always serializes to JSON");
    if bytes.len() > cap {
        return Err(WireError::RequestTooLarge { endpoint, cap });
    }
    Ok(bytes)
}

/// As [`body`], for a view whose `leaseToken` is written by [`token_slot`]. serde_json writes the
/// placeholder; the token is then copied over it in the finished buffer, so no allocation
/// serde_json grew out of ever held the token, and the one that does is wiped on drop.
pub(crate) fn sealed_body<T: Serialize>(
    view: &T,
    token: &LeaseToken,
    endpoint: &'static str,
    cap: usize,
) -> Result<Zeroizing<Vec<u8>>, WireError> {
    const KEY: &[u8] = b"\"leaseToken\":\"";
    let mut out = Zeroizing::new(body(view, endpoint, cap)?);
    let token = token.expose().as_bytes();
    // A string's content never holds an unescaped `"`, so this is the `leaseToken` key itself.
    let at = out
        .windows(KEY.len())
        .position(|w| w == KEY)
        .expect("invariant: a sealed request view has a leaseToken key")
        + KEY.len();
    let slot = &mut out[at..=at + token.len()];
    assert!(
        slot[..token.len()].iter().all(|&b| b == b'0') && slot[token.len()] == b'"',
        "the leaseToken value is the token_slot placeholder"
    );
    slot[..token.len()].copy_from_slice(token);
    Ok(out)
}

/// Serializes a lease token as a placeholder of its length (ASCII `0`s; the token is
/// `[A-Za-z0-9_-]`, which JSON never escapes) that [`sealed_body`] overwrites.
pub(crate) fn token_slot<S: serde::Serializer>(
    token: &LeaseToken,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(&"0".repeat(token.expose().len()))
}

/// Serializes a capability digest as its hex, for the request bodies that carry one
/// (`callbackTokenDigest`); [`CapabilityDigest`]'s own `Serialize` redacts it in JSON.
pub(crate) fn exposed_digest<S: serde::Serializer>(
    digest: &CapabilityDigest,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    digest.expose().serialize(serializer)
}

/// `{"schema": …}` followed by the keys of `body`, for the bodies whose schema id comes first.
#[derive(Serialize)]
pub(crate) struct Schema<'a, T> {
    schema: &'static str,
    #[serde(flatten)]
    body: &'a T,
}

impl<'a, T> Schema<'a, T> {
    pub(crate) const fn new(schema: &'static str, body: &'a T) -> Self {
        Self { schema, body }
    }
}

/// The execution fence every post-offer request carries: the Worker generation, the Run lease
/// authority and the lease version the Worker holds. Built from the inbox's [`Offer`].
/// Serializes as the 8 execution fence keys of artifact, completion and lease-control bodies,
/// with the lease token as a placeholder only the request writer fills in.
///
/// [`Offer`]: crate::offer::Offer
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Fence {
    /// Session generation (`workerGeneration`).
    pub worker_generation: WorkerGeneration,
    /// Project (`projectId`).
    pub project_id: ProjectId,
    /// Run (`runId`).
    pub run_id: RunId,
    /// Attempt (`attemptId`).
    pub attempt_id: AttemptId,
    /// Offer (`offerId`).
    pub offer_id: OfferId,
    /// Lease generation (`leaseGeneration`).
    pub lease_generation: LeaseGeneration,
    /// The lease capability (`leaseToken`); redacted in `Debug`.
    #[serde(serialize_with = "token_slot")]
    pub lease_token: LeaseToken,
    /// The lease version persisted in the inbox (`expectedLeaseVersion`).
    pub expected_lease_version: LeaseVersion,
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

    /// The same fence one lease version on: how a request fenced after a lost answer (a renewal
    /// or completion that may have committed) is asked once more. `None` past the largest
    /// version.
    pub(crate) fn one_version_on(&self) -> Option<Self> {
        let mut next = self.clone();
        next.expected_lease_version = self.expected_lease_version.next().ok()?;
        Some(next)
    }
}
