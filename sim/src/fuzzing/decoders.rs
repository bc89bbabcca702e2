//! Decoder targets: the four durable envelope kinds and receipt authentication.
//!
//! Each envelope entry point feeds the bytes as many as three ways:
//! 1. as a whole envelope to [`envelope::decode`] (framing, checksum, body, validation);
//! 2. as a **body** re-sealed with a correct header (magic, kind, version, length, SHA-256:
//!    [`frame`]), so the postcard parser and the value's own validation are reached — a raw
//!    fuzzer almost never gets past the checksum;
//! 3. when the bytes are an envelope of the kind whose framing or checksum fails (a mutated
//!    envelope), the bytes after its header re-sealed the same way, so a mutation of an
//!    envelope's body reaches the body decoder too.
//!
//! None may panic. Whatever decodes must round-trip: [`envelope::encode`] of the value
//! decodes to the same value, and so does its bare postcard body; a re-sealed body may only
//! fail in the body (never in the framing). [`layers`] reports where each way ended, so the
//! replay test can count how many inputs reached the body decoder ([`Tally`]).

use std::fmt::{self, Debug};

use ql_worker_core::claim::PendingClaim;
use ql_worker_core::envelope::{self, Durable, EnvelopeError, FORMAT_VERSION, HEADER_BYTES, MAGIC};
use ql_worker_core::ids::{CallbackSequence, CapabilityDigest, Sha256Digest};
use ql_worker_core::receipt::{Receipt, ReceiptToken, authenticate};
use ql_worker_core::record::{InboxRecord, RecoveryReason, State};
use ql_worker_core::time::UnixMillis;
use ql_worker_core::truncation::TruncationFact;

use super::bytes::Bytes;
use super::samples;

/// Frames `body` (cut to the kind's bound) with a correct header for `T`.
#[must_use]
pub fn frame<T: Durable>(body: &[u8]) -> Vec<u8> {
    let body = &body[..body.len().min(T::MAX_BYTES - HEADER_BYTES)];
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.extend_from_slice(&MAGIC);
    out.push(T::KIND.byte());
    out.push(FORMAT_VERSION);
    out.extend_from_slice(&[0, 0]);
    // INVARIANT: the body was cut to the kind's bound (≤ 160 KiB), far below 2^32.
    let len = u32::try_from(body.len()).unwrap_or(u32::MAX);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(Sha256Digest::of(body).as_bytes());
    out.extend_from_slice(body);
    out
}

/// Where one decode ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Stage {
    /// Rejected by the envelope layer (size, header, declared length or checksum): the body
    /// decoder was not reached.
    Envelope,
    /// Rejected by the body decoder: not a postcard value of the kind's type.
    Postcard,
    /// Rejected by the body decoder: bytes follow the postcard value.
    Trailing,
    /// Rejected by the body decoder: the value breaks its own rules (`Durable::check`).
    Validation,
    /// Accepted, and round-tripped.
    Accepted,
}

impl Stage {
    fn of<T>(result: &Result<T, EnvelopeError>) -> Self {
        match result {
            Ok(_) => Self::Accepted,
            Err(EnvelopeError::BodyMalformed) => Self::Postcard,
            Err(EnvelopeError::TrailingBytes { .. }) => Self::Trailing,
            Err(EnvelopeError::Invalid(_)) => Self::Validation,
            Err(_) => Self::Envelope,
        }
    }

    /// Whether the body decoder was reached (the framing and checksum passed).
    #[must_use]
    pub const fn reached_body(self) -> bool {
        !matches!(self, Self::Envelope)
    }
}

/// Where one input ended, each way it was fed (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layers {
    /// 1: the bytes as a whole envelope.
    pub raw: Stage,
    /// 2: the bytes as a body, re-sealed.
    pub as_body: Stage,
    /// 3: the body of a mutated envelope of the kind, re-sealed (`None` when the bytes do not
    /// start with the magic and kind, are shorter than a header, or open as they are).
    pub envelope_body: Option<Stage>,
}

impl Layers {
    /// Whether any way accepted the bytes.
    #[must_use]
    pub fn accepted(&self) -> bool {
        self.raw == Stage::Accepted
            || self.as_body == Stage::Accepted
            || self.envelope_body == Some(Stage::Accepted)
    }

    /// The re-sealed decodes (2, and 3 when it ran).
    pub fn resealed(&self) -> impl Iterator<Item = Stage> {
        core::iter::once(self.as_body).chain(self.envelope_body)
    }
}

/// Counts of [`Layers`] over many inputs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Inputs.
    pub inputs: usize,
    /// Inputs whose raw bytes passed the envelope layer.
    pub raw_reached_body: usize,
    /// Inputs whose raw bytes were rejected at the envelope layer.
    pub raw_rejected_by_envelope: usize,
    /// Re-sealed decodes (ways 2 and 3).
    pub resealed: usize,
    /// Re-sealed decodes that reached the body decoder.
    pub resealed_reached_body: usize,
    /// … of which accepted.
    pub accepted: usize,
    /// … of which rejected as not postcard.
    pub postcard: usize,
    /// … of which rejected for trailing bytes.
    pub trailing: usize,
    /// … of which rejected by the value's validation.
    pub validation: usize,
}

impl Tally {
    /// Adds one input.
    pub fn add(&mut self, layers: &Layers) {
        self.inputs += 1;
        if layers.raw.reached_body() {
            self.raw_reached_body += 1;
        } else {
            self.raw_rejected_by_envelope += 1;
        }
        for stage in layers.resealed() {
            self.resealed += 1;
            if stage.reached_body() {
                self.resealed_reached_body += 1;
            }
            match stage {
                Stage::Envelope => {}
                Stage::Postcard => self.postcard += 1,
                Stage::Trailing => self.trailing += 1,
                Stage::Validation => self.validation += 1,
                Stage::Accepted => self.accepted += 1,
            }
        }
    }

    /// Re-sealed decodes rejected by the body decoder.
    #[must_use]
    pub const fn rejected_by_body(&self) -> usize {
        self.postcard + self.trailing + self.validation
    }
}

impl fmt::Display for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} inputs, {} re-sealed reached the body decoder ({} accepted, {} rejected by it: \
             {} not postcard, {} trailing bytes, {} validation) of {} re-sealed; as sent, {} \
             passed the checksum and {} were rejected at the envelope layer",
            self.inputs,
            self.resealed_reached_body,
            self.accepted,
            self.rejected_by_body(),
            self.postcard,
            self.trailing,
            self.validation,
            self.resealed,
            self.raw_reached_body,
            self.raw_rejected_by_envelope,
        )
    }
}

/// The round-trip property of a decoded value.
fn round_trip<T: Durable + PartialEq + Debug>(value: &T) {
    let encoded =
        envelope::encode(value).unwrap_or_else(|e| panic!("a decoded value must re-encode: {e}"));
    let again: T = envelope::decode(&encoded)
        .unwrap_or_else(|e| panic!("a re-encoded value must decode: {e}"));
    assert_eq!(&again, value, "envelope round trip changed the value");
    let body =
        envelope::open::<T>(&encoded).unwrap_or_else(|e| panic!("a fresh envelope must open: {e}"));
    let (bare, rest) = postcard::take_from_bytes::<T>(body)
        .unwrap_or_else(|e| panic!("a fresh body must parse: {e}"));
    assert!(rest.is_empty(), "a fresh body has no trailing bytes");
    assert_eq!(&bare, value, "postcard round trip changed the value");
    let reencoded =
        envelope::encode(&bare).unwrap_or_else(|e| panic!("a decoded value must re-encode: {e}"));
    assert_eq!(*reencoded, *encoded, "encoding is not deterministic");
}

/// Decodes `body` re-sealed for `T`: it may fail only in the body.
fn resealed<T: Durable + PartialEq + Debug>(body: &[u8]) -> Stage {
    let result = envelope::decode::<T>(&frame::<T>(body));
    let stage = Stage::of(&result);
    match &result {
        Ok(value) => round_trip(value),
        Err(e) if stage == Stage::Envelope => {
            panic!("a re-sealed body failed in the framing: {e}")
        }
        Err(_) => {}
    }
    stage
}

/// Every way for kind `T` (see the module docs).
#[must_use]
pub fn layers<T: Durable + PartialEq + Debug>(data: &[u8]) -> Layers {
    let raw = envelope::decode::<T>(data);
    if let Ok(value) = &raw {
        round_trip(value);
    }
    let raw = Stage::of(&raw);
    let as_body = resealed::<T>(data);
    let envelope_body = match data.split_at_checked(HEADER_BYTES) {
        Some((header, body))
            if raw == Stage::Envelope && header[0..4] == MAGIC && header[4] == T::KIND.byte() =>
        {
            Some(resealed::<T>(body))
        }
        _ => None,
    };
    Layers {
        raw,
        as_body,
        envelope_body,
    }
}

/// [`layers`] of one kind.
pub type LayersOf = fn(&[u8]) -> Layers;

/// The envelope targets by name, with [`layers`] of their kind.
pub const ENVELOPE_LAYERS: [(&str, LayersOf); 4] = [
    ("envelope_inbox_record", layers::<InboxRecord>),
    ("envelope_pending_claim", layers::<PendingClaim>),
    ("envelope_receipt", layers::<Receipt>),
    ("envelope_truncation_fact", layers::<TruncationFact>),
];

/// `envelope_inbox_record`.
#[must_use]
pub fn envelope_inbox_record(data: &[u8]) -> bool {
    layers::<InboxRecord>(data).accepted()
}

/// `envelope_pending_claim`.
#[must_use]
pub fn envelope_pending_claim(data: &[u8]) -> bool {
    layers::<PendingClaim>(data).accepted()
}

/// `envelope_receipt`.
#[must_use]
pub fn envelope_receipt(data: &[u8]) -> bool {
    layers::<Receipt>(data).accepted()
}

/// `envelope_truncation_fact`.
#[must_use]
pub fn envelope_truncation_fact(data: &[u8]) -> bool {
    layers::<TruncationFact>(data).accepted()
}

/// How the fuzzed receipt token is made.
fn token(r: &mut Bytes<'_>, genuine: &[u8; 32]) -> String {
    match r.below(4) {
        // The genuine token (the empty input authenticates).
        0 => samples::base64url(genuine),
        // The genuine bytes with one byte changed.
        1 => {
            let mut bytes = *genuine;
            let at = usize::from(r.below(32));
            bytes[at] ^= r.u8() | 1;
            samples::base64url(&bytes)
        }
        // The genuine text with one character replaced (non-canonical tails, wrong alphabet).
        2 => {
            let mut text = samples::base64url(genuine).into_bytes();
            let at = usize::from(r.below(43));
            text[at] = r.u8() & 0x7f;
            String::from_utf8_lossy(&text).into_owned()
        }
        // Arbitrary text.
        _ => String::from_utf8_lossy(r.slice(160)).into_owned(),
    }
}

/// `receipt_authenticate`: a sample record with fuzzed barrier fields, a fuzzed receipt and a
/// fuzzed `now` against [`authenticate`]. Never panics; an accepted receipt's token is
/// canonical base64url of 32 bytes whose SHA-256 is the record's digest, with matching identity
/// and times; the genuine receipt with matching fields is always accepted. Returns whether it
/// authenticated.
#[must_use]
pub fn receipt_authenticate(data: &[u8]) -> bool {
    let mut r = Bytes::new(data);
    let n = u32::from(r.below(4)) + 1;
    // `launching` first, so the empty input is the genuine case.
    let state = State::ALL[(usize::from(r.below(9)) + 2) % 9];
    let reason = RecoveryReason::ALL[usize::from(r.below(5))];
    let at = samples::ms(u64::from(r.u16()));
    let extras = samples::Extras {
        barrier: !r.flag(),
        handle: r.flag(),
    };
    // The revision is left unsealed: authentication never looks at it, and sealing costs more
    // than everything else here.
    let offer = samples::offer_with(
        n,
        samples::offer_id(n),
        samples::worker(),
        samples::lease_token(n),
        samples::unsealed_revision(false, true),
        (0, samples::ms(20), samples::ms(1 << 40)),
    );
    let mut record = samples::record(offer, n, state, reason, at, extras);
    let genuine = samples::capability(n);
    if r.flag() {
        record.completion_receipt_token_digest =
            Some(CapabilityDigest::new(Sha256Digest::of(r.slice(40))));
    }
    let mut receipt = samples::receipt_for(&record, &genuine, at, r.u8());
    let text = token(&mut r, &genuine);
    let exact_token = text == samples::base64url(&genuine);
    let Ok(parsed) = ReceiptToken::new(text) else {
        return false;
    };
    receipt.token = parsed;
    let tweak = r.u8();
    if tweak & 1 != 0 {
        receipt.callback_sequence =
            CallbackSequence::new(u64::from(r.u16()).max(1)).unwrap_or(receipt.callback_sequence);
    }
    if tweak & 2 != 0 {
        receipt.started_at_ms = samples::ms(u64::from(r.u16()));
    }
    if tweak & 4 != 0 {
        let (run, attempt, _) = samples::ids(n + 1);
        receipt.run_id = run;
        if tweak & 8 != 0 {
            receipt.attempt_id = attempt;
        }
    }
    receipt.finished_at_ms = samples::ms(receipt.started_at_ms.get() + u64::from(r.u16()));
    let now = samples::ms(u64::from(r.u32()));
    check_authentication(&receipt, &record, now, exact_token)
}

fn check_authentication(
    receipt: &Receipt,
    record: &InboxRecord,
    now: UnixMillis,
    exact_token: bool,
) -> bool {
    let result = authenticate(receipt, record, now);
    let identity = receipt.run_id == record.offer.candidate.run_id
        && receipt.attempt_id == record.offer.candidate.attempt_id
        && Some(receipt.callback_sequence) == record.completion_receipt_callback_sequence
        && Some(receipt.started_at_ms) == record.executor_started_at_ms
        && receipt.finished_at_ms <= now.max(receipt.started_at_ms);
    let Ok(accepted) = result else {
        let genuine_digest = record.completion_receipt_token_digest
            == Some(CapabilityDigest::new(Sha256Digest::of(
                &samples::capability(receipt_number(record)),
            )));
        assert!(
            !(exact_token && identity && genuine_digest),
            "the genuine receipt was refused: {result:?}"
        );
        return false;
    };
    assert!(
        identity,
        "a receipt with another identity or time authenticated"
    );
    use base64::Engine as _;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(receipt.token.expose())
        .unwrap_or_else(|_| panic!("an accepted token must be base64url"));
    assert_eq!(bytes.len(), 32, "an accepted token holds exactly 32 bytes");
    assert_eq!(
        samples::base64url(&bytes),
        receipt.token.expose(),
        "an accepted token must be canonical"
    );
    let digest = CapabilityDigest::new(Sha256Digest::of(&bytes));
    assert_eq!(
        Some(digest),
        record.completion_receipt_token_digest,
        "an accepted token must hash to the record's digest"
    );
    assert_eq!(accepted.callback_sequence, receipt.callback_sequence);
    assert_eq!(accepted.finished_at_ms, receipt.finished_at_ms);
    true
}

/// The sample number of a sample record (its run id is `run-<n>`).
fn receipt_number(record: &InboxRecord) -> u32 {
    record
        .offer
        .candidate
        .run_id
        .as_str()
        .strip_prefix("run-")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}
