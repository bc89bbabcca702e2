//! The on-disk codec: a postcard body inside a versioned, checksummed envelope (SPEC §3).
//!
//! ```text
//! offset size field
//!      0    4 magic "QLWE"
//!      4    1 kind (1 inbox record, 2 pending claim, 3 completion receipt, 4 truncation fact)
//!      5    1 format version (1)
//!      6    2 reserved, zero
//!      8    4 body length, big-endian
//!     12   32 SHA-256 of the body
//!     44    n postcard body
//! ```
//!
//! Decoding is strict: exact length, known kind and version, zero reserved bytes, checksum,
//! no trailing bytes after the postcard value, the kind's size bound (≤ 160 KiB), and the value's
//! own validation. Any byte string yields a value or a typed error, never a panic.

use alloc::vec::Vec;

use serde::Serialize;
use serde::de::DeserializeOwned;
use zeroize::Zeroizing;

use crate::claim::{ClaimError, PendingClaim};
use crate::ids::Sha256Digest;
use crate::receipt::{Receipt, ReceiptShapeError};
use crate::record::{InboxRecord, RecordError, ValidRecord};
use crate::truncation::{FactError, TruncationFact};

/// Envelope magic.
pub const MAGIC: [u8; 4] = *b"QLWE";
/// The only format version this build reads and writes.
pub const FORMAT_VERSION: u8 = 1;
/// Header size.
pub const HEADER_BYTES: usize = 44;
/// Largest envelope of any kind (`MAX_WORKER_REMOTE_OFFER_RECORD_BYTES`).
pub const MAX_ENVELOPE_BYTES: usize = 160 * 1024;

/// What an envelope holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Kind {
    /// An [`InboxRecord`].
    InboxRecord = 1,
    /// A [`PendingClaim`].
    PendingClaim = 2,
    /// A completion [`Receipt`].
    CompletionReceipt = 3,
    /// A log [`TruncationFact`].
    TruncationFact = 4,
}

impl Kind {
    /// The header byte.
    #[must_use]
    pub const fn byte(self) -> u8 {
        self as u8
    }

    /// Name for messages.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::InboxRecord => "inbox record",
            Self::PendingClaim => "pending claim",
            Self::CompletionReceipt => "completion receipt",
            Self::TruncationFact => "truncation fact",
        }
    }
}

/// A value that is stored in an envelope.
pub trait Durable: Serialize + DeserializeOwned {
    /// Its kind byte.
    const KIND: Kind;
    /// Its size bound, envelope included.
    const MAX_BYTES: usize;
    /// Its own validation, run before encoding and after decoding.
    ///
    /// # Errors
    /// The content rule broken.
    fn check(&self) -> Result<(), ContentError>;
}

/// A decoded value that breaks its own rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ContentError {
    /// Inbox record.
    #[error(transparent)]
    Record(RecordError),
    /// Pending claim.
    #[error(transparent)]
    Claim(ClaimError),
    /// Completion receipt.
    #[error(transparent)]
    Receipt(ReceiptShapeError),
    /// Truncation fact.
    #[error(transparent)]
    Fact(FactError),
}

/// Why bytes are not a valid envelope of the expected kind. Blame: the disk (corruption,
/// tampering, truncation) — or, for [`EnvelopeError::Unencodable`], the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnvelopeError {
    /// Larger than the kind's bound.
    #[error("envelope is {len} bytes, above {max}")]
    TooLarge {
        /// Bytes given.
        len: usize,
        /// The bound.
        max: usize,
    },
    /// Shorter than the header.
    #[error("envelope is {len} bytes, below the header size")]
    TooShort {
        /// Bytes given.
        len: usize,
    },
    /// Not our magic.
    #[error("not a ql-worker envelope (bad magic)")]
    BadMagic,
    /// Another kind of envelope.
    #[error("envelope kind {found} is not a {}", .expected.as_str())]
    WrongKind {
        /// Kind wanted.
        expected: Kind,
        /// Kind byte found.
        found: u8,
    },
    /// A format version this build does not know.
    #[error("unknown envelope format version {found}")]
    UnknownVersion {
        /// Version byte found.
        found: u8,
    },
    /// Reserved header bytes are not zero.
    #[error("envelope reserved bytes are not zero")]
    ReservedNotZero,
    /// The declared body length differs from the bytes present.
    #[error("envelope declares {declared} body bytes but holds {actual}")]
    LengthMismatch {
        /// Declared length.
        declared: u32,
        /// Bytes present after the header.
        actual: usize,
    },
    /// The body does not match its SHA-256.
    #[error("envelope body fails its SHA-256 checksum")]
    ChecksumMismatch,
    /// The body is not a postcard value of the kind's type.
    #[error("envelope body is not a valid postcard value")]
    BodyMalformed,
    /// Bytes follow the postcard value inside the body.
    #[error("envelope body has {count} trailing bytes")]
    TrailingBytes {
        /// How many.
        count: usize,
    },
    /// The value decoded but breaks its own rules.
    #[error("envelope content is invalid: {0}")]
    Invalid(ContentError),
    /// The value cannot be encoded (it is invalid or too large); nothing was produced.
    #[error("value cannot be encoded")]
    Unencodable,
}

/// Encodes `value` into a fresh envelope. The value is validated first: an invalid value is
/// never written. The buffer is reserved up front (no reallocation leaves stray copies) and is
/// wiped on drop, since receipts carry the completion capability.
///
/// # Errors
/// [`EnvelopeError::Invalid`] for an invalid value, [`EnvelopeError::TooLarge`] above the bound.
pub fn encode<T: Durable>(value: &T) -> Result<Zeroizing<Vec<u8>>, EnvelopeError> {
    value.check().map_err(EnvelopeError::Invalid)?;
    seal(T::KIND, T::MAX_BYTES, value)
}

/// Encodes a record already known valid ([`ValidRecord`]: nothing is validated again, its
/// revision is not re-digested), exactly as [`encode`] would.
///
/// # Errors
/// [`EnvelopeError::TooLarge`] above the bound.
pub fn encode_record(record: &ValidRecord) -> Result<Zeroizing<Vec<u8>>, EnvelopeError> {
    seal(InboxRecord::KIND, InboxRecord::MAX_BYTES, record)
}

/// Decodes an inbox record envelope with every check of [`decode`] (framing, checksum, body, and
/// the record's own rules with its revision re-normalized and digested: the one validation a
/// record read from disk gets) into a [`ValidRecord`].
///
/// # Errors
/// The first [`EnvelopeError`] found.
pub fn decode_record(bytes: &[u8]) -> Result<ValidRecord, EnvelopeError> {
    decode::<InboxRecord>(bytes).map(ValidRecord::validated)
}

fn seal<T: Serialize + ?Sized>(
    kind: Kind,
    max_bytes: usize,
    value: &T,
) -> Result<Zeroizing<Vec<u8>>, EnvelopeError> {
    let mut out = Zeroizing::new(Vec::with_capacity(max_bytes));
    out.resize(HEADER_BYTES, 0);
    let buffer = core::mem::take(&mut *out);
    let mut buffer = postcard::to_extend(value, buffer).map_err(|_| EnvelopeError::Unencodable)?;
    if buffer.len() > max_bytes {
        let len = buffer.len();
        zeroize::Zeroize::zeroize(&mut buffer);
        return Err(EnvelopeError::TooLarge {
            len,
            max: max_bytes,
        });
    }
    let body_len =
        u32::try_from(buffer.len() - HEADER_BYTES).map_err(|_| EnvelopeError::Unencodable)?;
    let digest = Sha256Digest::of(&buffer[HEADER_BYTES..]);
    buffer[0..4].copy_from_slice(&MAGIC);
    buffer[4] = kind.byte();
    buffer[5] = FORMAT_VERSION;
    // The reserved bytes 6..8 are still zero from the `resize` above.
    buffer[8..12].copy_from_slice(&body_len.to_be_bytes());
    buffer[12..44].copy_from_slice(digest.as_bytes());
    *out = buffer;
    Ok(out)
}

/// Decodes an envelope of `T`'s kind, strictly (see the module docs).
///
/// # Errors
/// The first [`EnvelopeError`] found.
pub fn decode<T: Durable>(bytes: &[u8]) -> Result<T, EnvelopeError> {
    let body = open::<T>(bytes)?;
    let (value, rest) =
        postcard::take_from_bytes::<T>(body).map_err(|_| EnvelopeError::BodyMalformed)?;
    if !rest.is_empty() {
        return Err(EnvelopeError::TrailingBytes { count: rest.len() });
    }
    value.check().map_err(EnvelopeError::Invalid)?;
    Ok(value)
}

/// Checks the envelope framing and checksum and returns the body, without decoding it.
///
/// # Errors
/// Any framing [`EnvelopeError`].
pub fn open<T: Durable>(bytes: &[u8]) -> Result<&[u8], EnvelopeError> {
    if bytes.len() > T::MAX_BYTES {
        return Err(EnvelopeError::TooLarge {
            len: bytes.len(),
            max: T::MAX_BYTES,
        });
    }
    let Some((header, body)) = bytes.split_at_checked(HEADER_BYTES) else {
        return Err(EnvelopeError::TooShort { len: bytes.len() });
    };
    if header[0..4] != MAGIC {
        return Err(EnvelopeError::BadMagic);
    }
    if header[4] != T::KIND.byte() {
        return Err(EnvelopeError::WrongKind {
            expected: T::KIND,
            found: header[4],
        });
    }
    if header[5] != FORMAT_VERSION {
        return Err(EnvelopeError::UnknownVersion { found: header[5] });
    }
    if header[6..8] != [0, 0] {
        return Err(EnvelopeError::ReservedNotZero);
    }
    let declared = u32::from_be_bytes([header[8], header[9], header[10], header[11]]);
    if usize::try_from(declared).ok() != Some(body.len()) {
        return Err(EnvelopeError::LengthMismatch {
            declared,
            actual: body.len(),
        });
    }
    use subtle::ConstantTimeEq as _;
    let digest = Sha256Digest::of(body);
    if !bool::from(digest.as_bytes().ct_eq(&header[12..44])) {
        return Err(EnvelopeError::ChecksumMismatch);
    }
    Ok(body)
}

/// The [`Durable`] implementations: type, kind, size bound, and the [`ContentError`] variant of
/// its own validation.
macro_rules! durable {
    ($($type:ident: $kind:ident, $max:expr, $error:ident;)*) => {$(
        impl Durable for $type {
            const KIND: Kind = Kind::$kind;
            const MAX_BYTES: usize = $max;
            fn check(&self) -> Result<(), ContentError> {
                self.validate().map_err(ContentError::$error)
            }
        }
    )*};
}

durable! {
    InboxRecord: InboxRecord, MAX_ENVELOPE_BYTES, Record;
    PendingClaim: PendingClaim, MAX_ENVELOPE_BYTES, Claim;
    Receipt: CompletionReceipt, crate::receipt::MAX_RECEIPT_BYTES, Receipt;
    TruncationFact: TruncationFact, crate::truncation::MAX_FACT_BYTES, Fact;
}
