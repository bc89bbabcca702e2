//! Domain newtypes: every identifier, counter and digest of the protocol has its own type, and
//! every constructor validates (parse, don't validate). Rules follow the reference wire contract
//! (`reference/qinglong-wire-and-behaviour.md` §2, §3.4, §3.5, §5.1 and §7).
//!
//! Capabilities ([`LeaseToken`], a [`SecretString`]) and digests of capabilities
//! ([`CapabilityDigest`]) print as `[redacted]` in `Debug`, and serialize redacted in
//! human-readable formats (JSON); only compact binary formats (the postcard inbox record, which
//! legitimately stores the lease token) carry the real value. Code that must send the value over
//! the wire calls `expose()` explicitly.

use alloc::string::String;
use core::fmt;

use crate::error::IdError;
use crate::secret::SecretString;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Largest integer JavaScript represents exactly (`Number.MAX_SAFE_INTEGER`, 2^53 - 1).
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;
/// Largest value of the reference's 32-bit signed counters (2^31 - 1).
pub const MAX_INT32: u64 = (1 << 31) - 1;

/// Length of a string as JavaScript counts it (`String.prototype.length`: UTF-16 code units).
#[must_use]
pub(crate) fn js_length(value: &str) -> usize {
    value.encode_utf16().count()
}

/// True when `value` contains a C0 control character or DEL (`/[\u0000-\u001f\u007f]/`).
#[must_use]
fn has_control_char(value: &str) -> bool {
    value.chars().any(|c| c <= '\u{1f}' || c == '\u{7f}')
}

fn is_lower_hex(value: &str) -> bool {
    value
        .bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// 1..=max bytes, the first one `first`, every one `first` or in `more`.
pub(crate) fn is_token(value: &str, max: usize, first: fn(&u8) -> bool, more: &[u8]) -> bool {
    let bytes = value.as_bytes();
    (1..=max).contains(&bytes.len())
        && first(&bytes[0])
        && bytes.iter().all(|b| first(b) || more.contains(b))
}

/// `^[A-Za-z0-9][A-Za-z0-9._:-]{0,max-1}$`
pub(crate) fn is_token_id(value: &str, max: usize) -> bool {
    is_token(value, max, u8::is_ascii_alphanumeric, b"._:-")
}

/// 1..=max JavaScript characters, no control characters.
pub(crate) fn bounded_text(value: &str, max: usize) -> bool {
    (1..=max).contains(&js_length(value)) && !has_control_char(value)
}

/// 1..=max UTF-8 bytes, no control characters.
pub(crate) fn bounded_bytes(value: &str, max: usize) -> bool {
    (1..=max).contains(&value.len()) && !has_control_char(value)
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $label:literal, $rule:literal, $check:expr) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
        #[serde(transparent)]
        pub struct $name(String);

        impl $name {
            /// The validation rule, as stated in errors and docs.
            pub const RULE: &'static str = $rule;

            /// Validates and wraps `value`.
            ///
            /// # Errors
            /// [`IdError`] naming the type and the rule when `value` breaks the rule.
            pub fn new(value: impl Into<String>) -> Result<Self, IdError> {
                let value = value.into();
                let check: fn(&str) -> bool = $check;
                if check(&value) {
                    Ok(Self(value))
                } else {
                    Err(IdError { kind: $label, rule: $rule })
                }
            }

            /// The validated text.
            #[must_use]
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let value = String::deserialize(deserializer)?;
                Self::new(value).map_err(serde::de::Error::custom)
            }
        }
    };
}

pub(crate) use string_id;

string_id!(
    /// Worker-generated offer id; also the inbox file name, so limited to a file-name-safe set.
    OfferId,
    "offer id",
    "1-128 characters from [A-Za-z0-9._:-]",
    |v| (1..=128).contains(&v.len())
        && v.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
        && v != "."
        && v != ".."
);
string_id!(
    /// Run id. Activation bodies bound it to 36 characters and the receipt path uses the receipt
    /// id rule, so the strictest of the reference's rules is enforced at admission.
    RunId,
    "run id",
    "^[A-Za-z0-9][A-Za-z0-9._:-]{0,35}$",
    |v| is_token_id(v, 36)
);
string_id!(
    /// Attempt id; names the receipt file, so it follows the receipt id rule.
    AttemptId,
    "attempt id",
    "^[A-Za-z0-9][A-Za-z0-9._:-]{0,35}$",
    |v| is_token_id(v, 36)
);
string_id!(
    /// Project id.
    ProjectId,
    "project id",
    "1-128 characters, no control characters",
    |v| bounded_text(v, 128)
);
string_id!(
    /// Task id.
    TaskId,
    "task id",
    "1-128 characters, no control characters",
    |v| bounded_text(v, 128)
);
string_id!(
    /// Worker id, carried only by the request path.
    WorkerId,
    "worker id",
    "^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$",
    |v| is_token_id(v, 128)
);
string_id!(
    /// Worker Session id: a lowercase UUIDv7.
    SessionId,
    "session id",
    "lowercase UUIDv7 ^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$",
    is_uuid_v7
);
string_id!(
    /// Task revision: `qltd:v1:<sourceRevision>:<64 lowercase hex>`.
    TaskRevision,
    "task revision",
    "qltd:v1:<1..2^31-1>:<64 lowercase hex>",
    |v| revision_parts(v).is_some()
);
string_id!(
    /// Log artifact id: `wlog-` + 30 lowercase hex (derived, see `derive_log_artifact_id`).
    LogArtifactId,
    "log artifact id",
    "^wlog-[a-f0-9]{30}$",
    |v| v.len() == 35 && v.starts_with("wlog-") && is_lower_hex(&v[5..])
);
string_id!(
    /// Durable executor handle (reference: `ql3lp1.` + base64url JSON); opaque to the core.
    ExecutorHandle,
    "executor handle",
    "1-512 bytes, no control characters",
    |v| bounded_bytes(v, 512)
);

fn is_uuid_v7(v: &str) -> bool {
    let b = v.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            14 => *c == b'7',
            19 => matches!(c, b'8' | b'9' | b'a' | b'b'),
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(c),
        })
}

/// `qltd:v1:<n>:<64 lowercase hex>` with `n` a canonical `1..=2^31-1`: `n` and the digest.
fn revision_parts(v: &str) -> Option<(u64, &str)> {
    let (number, digest) = v.strip_prefix("qltd:v1:")?.split_once(':')?;
    let number = parse_canonical_decimal(number).filter(|n| (1..=MAX_INT32).contains(n))?;
    (digest.len() == 64 && is_lower_hex(digest)).then_some((number, digest))
}

/// Parses a canonical decimal (no sign, no leading zero unless "0", at most 16 digits).
#[must_use]
pub(crate) fn parse_canonical_decimal(text: &str) -> Option<u64> {
    let bytes = text.as_bytes();
    if bytes.is_empty() || bytes.len() > 16 || (bytes.len() > 1 && bytes[0] == b'0') {
        return None;
    }
    bytes.iter().try_fold(0u64, |acc, b| {
        b.is_ascii_digit().then(|| acc * 10 + u64::from(b - b'0'))
    })
}

impl TaskRevision {
    /// The `sourceRevision` and `sourceContentDigest` this task revision names.
    #[must_use]
    pub fn parts(&self) -> (u64, &str) {
        // INVARIANT: the constructor proved the shape, so the fallback is never taken.
        revision_parts(&self.0).unwrap_or((0, ""))
    }
}

crate::secret::secret_token!(
    /// The Worker-generated Run lease capability `[A-Za-z0-9_-]{32,128}` (reference: base64url of
    /// 32 CSPRNG bytes): a validated [`SecretString`] (wiped on drop, redacted in `Debug` and
    /// human-readable serialization, compared in constant time).
    LeaseToken,
    IdError,
    IdError {
        kind: "lease token",
        rule: LeaseToken::RULE,
    }
);

impl LeaseToken {
    /// The validation rule.
    pub const RULE: &'static str = "^[A-Za-z0-9_-]{32,128}$";

    /// `sha256_hex(utf8(token))`, as the control plane stores it.
    #[must_use]
    pub fn digest(&self) -> CapabilityDigest {
        CapabilityDigest(Sha256Digest::of(self.expose().as_bytes()))
    }
}

/// A SHA-256 digest of public content, rendered as 64 lowercase hex characters.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Sha256Digest([u8; 32]);

impl Sha256Digest {
    /// The validation rule of the hex form.
    pub const RULE: &'static str = "^[a-f0-9]{64}$";

    /// Wraps raw digest bytes.
    #[must_use]
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// SHA-256 of `data`.
    #[must_use]
    pub fn of(data: &[u8]) -> Self {
        use sha2::Digest as _;
        Self(sha2::Sha256::digest(data).into())
    }

    /// Parses 64 lowercase hex characters.
    ///
    /// # Errors
    /// [`IdError`] for any other text (uppercase hex is rejected, as in the reference).
    pub fn from_hex(text: &str) -> Result<Self, IdError> {
        let err = IdError {
            kind: "sha-256 digest",
            rule: Self::RULE,
        };
        if text.len() != 64 || !is_lower_hex(text) {
            return Err(err);
        }
        let mut out = [0u8; 32];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = u8::from_str_radix(&text[2 * i..2 * i + 2], 16).map_err(|_| err)?;
        }
        Ok(Self(out))
    }

    /// The raw bytes.
    #[must_use]
    pub const fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }

    /// The lowercase hex form.
    #[must_use]
    pub fn to_hex(&self) -> String {
        alloc::string::ToString::to_string(self)
    }
}

impl fmt::Debug for Sha256Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sha256Digest({self})")
    }
}

impl fmt::Display for Sha256Digest {
    /// The lowercase hex form.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
    }
}

impl Serialize for Sha256Digest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        if serializer.is_human_readable() {
            serializer.serialize_str(&self.to_hex())
        } else {
            self.0.serialize(serializer)
        }
    }
}

impl<'de> Deserialize<'de> for Sha256Digest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        if deserializer.is_human_readable() {
            let text = String::deserialize(deserializer)?;
            Self::from_hex(&text).map_err(serde::de::Error::custom)
        } else {
            <[u8; 32]>::deserialize(deserializer).map(Self)
        }
    }
}

/// The SHA-256 of a capability (lease token digest, completion capability digest). Equal in
/// shape to [`Sha256Digest`], but redacted in `Debug` and in human-readable serialization, and
/// compared in constant time.
#[derive(Clone, Copy, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct CapabilityDigest(#[serde(serialize_with = "crate::secret::redacted")] Sha256Digest);

impl CapabilityDigest {
    /// Wraps a digest that authenticates a capability.
    #[must_use]
    pub const fn new(digest: Sha256Digest) -> Self {
        Self(digest)
    }

    /// The digest, for the wire and for constant-time comparison.
    #[must_use]
    pub const fn expose(&self) -> &Sha256Digest {
        &self.0
    }
}

impl PartialEq for CapabilityDigest {
    fn eq(&self, other: &Self) -> bool {
        use subtle::ConstantTimeEq as _;
        self.0.as_bytes().ct_eq(other.0.as_bytes()).into()
    }
}

impl fmt::Debug for CapabilityDigest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CapabilityDigest([redacted])")
    }
}

macro_rules! counter {
    ($(#[$doc:meta])* $name:ident, $label:literal, $min:expr, $max:expr, $rule:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
        #[serde(transparent)]
        pub struct $name(u64);

        impl $name {
            /// Smallest valid value.
            pub(crate) const MIN: u64 = $min;
            /// Largest valid value.
            pub const MAX: u64 = $max;
            /// The validation rule.
            pub const RULE: &'static str = $rule;
            /// The smallest value, as a typed constant.
            pub const FIRST: Self = Self($min);

            /// Validates and wraps `value`.
            ///
            /// # Errors
            /// [`IdError`] when `value` is outside the range.
            pub const fn new(value: u64) -> Result<Self, IdError> {
                if value >= Self::MIN && value <= Self::MAX {
                    Ok(Self(value))
                } else {
                    Err(IdError { kind: $label, rule: $rule })
                }
            }

            /// The number.
            #[must_use]
            pub const fn get(self) -> u64 {
                self.0
            }

            /// The next value.
            ///
            /// # Errors
            /// [`IdError`] on overflow of the range; never wraps.
            pub const fn next(self) -> Result<Self, IdError> {
                Self::new(self.0 + 1)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "{}", self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let value = u64::deserialize(deserializer)?;
                Self::new(value).map_err(serde::de::Error::custom)
            }
        }
    };
}

pub(crate) use counter;

counter!(
    /// Inbox / claim record revision: 0 at creation, exactly +1 per durable update.
    Revision,
    "revision",
    0,
    MAX_SAFE_INTEGER,
    "0..=2^53-1"
);
counter!(
    /// Run lease version; moves only forward (renewal and completion bump it).
    LeaseVersion,
    "lease version",
    0,
    MAX_INT32,
    "0..=2^31-1"
);
counter!(
    /// Run lease generation.
    LeaseGeneration,
    "lease generation",
    1,
    MAX_INT32,
    "1..=2^31-1"
);
counter!(
    /// Worker Session generation.
    WorkerGeneration,
    "worker generation",
    1,
    MAX_INT32,
    "1..=2^31-1"
);
counter!(
    /// Completion callback sequence (activation snapshot sequence + 1).
    CallbackSequence,
    "callback sequence",
    1,
    MAX_INT32,
    "1..=2^31-1"
);

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;
    use alloc::string::ToString;

    #[test]
    fn offer_id_accepts_uuid_and_rejects_path_characters() {
        assert!(OfferId::new("3b1f6c2e-6a52-4f0e-9a51-2f7f0e2d9c11").is_ok());
        for bad in ["", "a/b", "a b", "..", ".", "é", &"x".repeat(129)] {
            assert!(OfferId::new(bad).is_err(), "{bad:?}");
        }
        assert!(OfferId::new("x".repeat(128)).is_ok());
    }

    #[test]
    fn run_and_attempt_ids_follow_the_receipt_rule() {
        assert!(RunId::new("run-1").is_ok());
        assert!(AttemptId::new("a".repeat(36)).is_ok());
        for bad in ["", "-run", "run/1", &"a".repeat(37), "run\n"] {
            assert!(RunId::new(bad).is_err(), "{bad:?}");
            assert!(AttemptId::new(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn project_id_counts_javascript_length_and_rejects_controls() {
        assert!(ProjectId::new("project-1").is_ok());
        assert!(ProjectId::new("é".repeat(128)).is_ok());
        assert!(
            ProjectId::new("😀".repeat(65)).is_err(),
            "each emoji is two UTF-16 units"
        );
        assert!(ProjectId::new("a\u{7f}").is_err());
        assert!(TaskId::new("").is_err());
    }

    #[test]
    fn session_id_is_lowercase_uuid_v7() {
        assert!(SessionId::new("018f0000-0000-7000-8000-000000000001").is_ok());
        assert!(SessionId::new("018f0000-0000-4000-8000-000000000001").is_err());
        assert!(SessionId::new("018F0000-0000-7000-8000-000000000001").is_err());
        assert!(SessionId::new("018f0000-0000-7000-c000-000000000001").is_err());
    }

    #[test]
    fn lease_token_is_redacted_and_bounded() {
        let token = LeaseToken::new("BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc").unwrap();
        assert_eq!(format!("{token:?}"), "LeaseToken([redacted])");
        assert!(LeaseToken::new("short").is_err());
        assert!(LeaseToken::new("a".repeat(129)).is_err());
        assert!(LeaseToken::new("a+".repeat(20)).is_err());
        let err = LeaseToken::new("secret secret secret secret secret").unwrap_err();
        assert!(!err.to_string().contains("secret secret"));
        assert_eq!(serde_json::to_string(&token).unwrap(), "\"[redacted]\"");
    }

    #[test]
    fn lease_token_digest_is_sha256_of_utf8() {
        let token = LeaseToken::new("worker_generated_lease_capability_0000000000000001").unwrap();
        let expected = Sha256Digest::of(token.expose().as_bytes());
        assert_eq!(token.digest().expose(), &expected);
        assert_eq!(
            format!("{:?}", token.digest()),
            "CapabilityDigest([redacted])"
        );
    }

    #[test]
    fn digest_hex_round_trips_and_rejects_uppercase() {
        let d = Sha256Digest::of(b"abc");
        assert_eq!(
            d.to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(Sha256Digest::from_hex(&d.to_hex()).unwrap(), d);
        assert!(Sha256Digest::from_hex(&d.to_hex().to_uppercase()).is_err());
        assert!(Sha256Digest::from_hex("ab").is_err());
    }

    #[test]
    fn task_revision_parts() {
        let text = format!("qltd:v1:7:{}", "a".repeat(64));
        let rev = TaskRevision::new(text).unwrap();
        assert_eq!(rev.parts(), (7, "a".repeat(64).as_str()));
        assert!(TaskRevision::new(format!("qltd:v1:07:{}", "a".repeat(64))).is_err());
        assert!(TaskRevision::new(format!("qltd:v1:0:{}", "a".repeat(64))).is_err());
        assert!(TaskRevision::new(format!("qltd:v1:2147483648:{}", "a".repeat(64))).is_err());
    }

    #[test]
    fn log_artifact_id_shape() {
        assert!(LogArtifactId::new("wlog-0123456789abcdef0123456789abcd").is_ok());
        assert!(LogArtifactId::new("wlog-0123456789ABCDEF0123456789abcd").is_err());
        assert!(LogArtifactId::new("local-0123456789abcdef0123456789abc").is_err());
    }

    #[test]
    fn counters_never_wrap() {
        assert!(LeaseVersion::new(MAX_INT32).unwrap().next().is_err());
        assert!(LeaseGeneration::new(0).is_err());
        assert!(CallbackSequence::new(0).is_err());
        assert_eq!(Revision::new(0).unwrap().next().unwrap().get(), 1);
        assert!(Revision::new(MAX_SAFE_INTEGER).unwrap().next().is_err());
    }
}
