//! The one type for text that must not leak: Secret values, environment values that may be
//! Secrets, and the two capabilities that travel as text (the Run lease token,
//! [`crate::ids::LeaseToken`]; the completion capability in a receipt,
//! [`crate::receipt::ReceiptToken`], both validated wrappers of [`SecretString`]).
//!
//! A [`SecretString`] is wiped on drop (and so is every clone), prints `[redacted]` in `Debug`,
//! has no `Display`, compares in constant time, and serializes redacted in human-readable formats
//! (JSON): only compact binary formats (the postcard inbox record, which legitimately stores the
//! lease token; the receipt envelope; the supervisor's plan frame) carry the value. Code that
//! must send or use the value calls [`SecretString::expose`], explicitly.

use alloc::string::String;
use core::fmt;

use serde::{Deserialize, Serialize, Serializer};
use zeroize::Zeroizing;

/// Text that may be a Secret or a capability. See the module documentation.
#[derive(Clone, Default, Deserialize)]
#[serde(from = "String")]
pub struct SecretString(Zeroizing<String>);

impl SecretString {
    /// Takes ownership of `value` (its buffer is the one wiped on drop).
    #[must_use]
    pub fn new(value: String) -> Self {
        Self(Zeroizing::new(value))
    }

    /// Whether the text has the shape of a capability token, `[A-Za-z0-9_-]{32,128}` (the lease
    /// token and the receipt token share it).
    #[must_use]
    pub fn is_token(&self) -> bool {
        let text = self.expose();
        (32..=128).contains(&text.len())
            && text
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    }

    /// The plaintext, for the few places that must send, store or hand it on.
    #[must_use]
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl From<String> for SecretString {
    fn from(value: String) -> Self {
        Self::new(value)
    }
}

impl PartialEq for SecretString {
    /// Constant time in the contents (the length is not secret).
    fn eq(&self, other: &Self) -> bool {
        use subtle::ConstantTimeEq as _;
        self.0.as_bytes().ct_eq(other.0.as_bytes()).into()
    }
}

impl Eq for SecretString {}

impl fmt::Debug for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl Serialize for SecretString {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        redacted(self.expose(), serializer)
    }
}

/// Serializes `value` in compact binary formats and `[redacted]` in human-readable ones (JSON):
/// the serialization of every secret ([`SecretString`], [`crate::ids::CapabilityDigest`]).
pub(crate) fn redacted<S: Serializer>(
    value: &(impl Serialize + ?Sized),
    serializer: S,
) -> Result<S::Ok, S::Error> {
    if serializer.is_human_readable() {
        serializer.serialize_str("[redacted]")
    } else {
        value.serialize(serializer)
    }
}

/// A capability that travels as text: a [`SecretString`] of the token shape
/// ([`SecretString::is_token`]), refused with `$invalid` otherwise. Derives `Debug` (which prints
/// `Name([redacted])`) and serde through the wrapped [`SecretString`].
macro_rules! secret_token {
    ($(#[$doc:meta])* $name:ident, $error:ty, $invalid:expr) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, Debug, serde::Serialize, serde::Deserialize)]
        #[serde(try_from = "SecretString")]
        pub struct $name(SecretString);

        impl $name {
            /// Validates and wraps `value`.
            ///
            /// # Errors
            #[doc = concat!("[`", stringify!($error), "`]; the value is wiped, never echoed.")]
            pub fn new(value: impl Into<String>) -> Result<Self, $error> {
                Self::try_from(SecretString::new(value.into()))
            }

            /// The plaintext capability, for the few places that must send, store or check it.
            #[must_use]
            pub fn expose(&self) -> &str {
                self.0.expose()
            }
        }

        impl TryFrom<SecretString> for $name {
            type Error = $error;

            fn try_from(value: SecretString) -> Result<Self, $error> {
                if value.is_token() {
                    Ok(Self(value))
                } else {
                    Err($invalid)
                }
            }
        }
    };
}

pub(crate) use secret_token;

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::format;

    #[test]
    fn redacted_in_debug_and_json_but_exact_in_postcard() {
        let secret = SecretString::new(String::from("hunter2"));
        assert_eq!(format!("{secret:?}"), "[redacted]");
        assert_eq!(serde_json::to_string(&secret).unwrap(), "\"[redacted]\"");
        let bytes = postcard::to_allocvec(&secret).unwrap();
        assert_eq!(&bytes[1..], b"hunter2");
        let back: SecretString = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, secret);
        let parsed: SecretString = serde_json::from_str("\"hunter2\"").unwrap();
        assert_eq!(parsed.expose(), "hunter2");
    }

    #[test]
    fn equality_is_by_content() {
        let a = SecretString::new(String::from("abc"));
        assert_eq!(a, a.clone());
        assert_ne!(a, SecretString::new(String::from("abd")));
        assert_ne!(a, SecretString::new(String::from("abcd")));
    }

    #[test]
    fn token_shape_is_the_capability_alphabet_of_32_to_128_characters() {
        let token = |text: String| SecretString::new(text).is_token();
        assert!(token("A".repeat(32)));
        assert!(token("a_-9".repeat(32)));
        assert!(!token("A".repeat(31)));
        assert!(!token("A".repeat(129)));
        assert!(!token(format!("{}+", "A".repeat(40))));
        assert!(!token(format!("{}=", "A".repeat(42))));
    }
}
