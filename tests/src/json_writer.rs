//! The hand-written, `JSON.stringify`-exact JSON writer of the loopback control plane's response
//! serializers ([`server_wire`](crate::server_wire), the attestation model).
//!
//! The Worker's core never writes JSON this way (its requests are serde_json, whose string
//! escaping equals `JSON.stringify`'s); the writer lives here, with its only users, so the
//! audited core carries no code it does not run. It writes keys in the order the caller states,
//! which is how the reference's response bodies are laid out.

// The length of a string once written (the writer reserves before it writes, so a capability
// never passes through a second buffer): core's count, held against serde_json's output there.
use ql_worker_core::js::json_string_len;
use std::fmt;

use zeroize::Zeroizing;

const HEX: &[u8; 16] = b"0123456789abcdef";

/// Appends `value` as a JSON string literal exactly as `JSON.stringify` writes it: `"` and `\`
/// escaped, `\b \f \n \r \t` in short form, other C0 controls as `\u00xx` (lowercase hex), and
/// everything else (DEL, U+2028, U+2029, non-ASCII) verbatim. A Rust `str` cannot hold a lone
/// surrogate, the only other case `JSON.stringify` escapes.
pub fn write_json_string(out: &mut Vec<u8>, value: &str) {
    out.push(b'"');
    let bytes = value.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: Option<&[u8]> = match b {
            b'"' => Some(b"\\\""),
            b'\\' => Some(b"\\\\"),
            0x08 => Some(b"\\b"),
            0x0c => Some(b"\\f"),
            b'\n' => Some(b"\\n"),
            b'\r' => Some(b"\\r"),
            b'\t' => Some(b"\\t"),
            0x00..=0x1f => None,
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        match escape {
            Some(short) => out.extend_from_slice(short),
            None => {
                out.extend_from_slice(b"\\u00");
                out.push(HEX[usize::from(b >> 4)]);
                out.push(HEX[usize::from(b & 0xf)]);
            }
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// Appends an integer the way `JSON.stringify` formats a safe integer (plain decimal, `-` for
/// negatives, no exponent: every integer the wire carries is within `±(2^53-1)`).
pub fn write_json_int(out: &mut Vec<u8>, value: i64) {
    if value < 0 {
        out.push(b'-');
    }
    write_json_uint(out, value.unsigned_abs());
}

/// Appends a non-negative integer as `JSON.stringify` formats it.
pub fn write_json_uint(out: &mut Vec<u8>, value: u64) {
    let mut digits = [0u8; 20];
    let mut n = value;
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + u8::try_from(n % 10).unwrap_or(0);
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// The writer refused to grow past its byte cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CapExceeded {
    /// The cap, in bytes.
    pub cap: usize,
}

impl fmt::Display for CapExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "serialized JSON exceeds its {} byte cap", self.cap)
    }
}

impl std::error::Error for CapExceeded {}

/// A bounded, `JSON.stringify`-exact writer for objects whose key order the caller states.
///
/// The buffer is allocated once with the full cap and never reallocates, so a capability
/// written into it (the lease token) exists in exactly one allocation, which is wiped when the
/// returned [`Zeroizing`] buffer drops.
#[derive(Debug)]
pub struct JsonWriter {
    out: Zeroizing<Vec<u8>>,
    cap: usize,
    /// One flag per open container: has it received a member yet?
    stack: Vec<bool>,
    /// A key was just written; the next value needs no comma.
    after_key: bool,
    overflow: bool,
}

impl JsonWriter {
    /// A writer that refuses to produce more than `cap` bytes.
    #[must_use]
    pub fn with_cap(cap: usize) -> Self {
        Self {
            out: Zeroizing::new(Vec::with_capacity(cap)),
            cap,
            stack: Vec::new(),
            after_key: false,
            overflow: false,
        }
    }

    fn reserve(&mut self, n: usize) -> bool {
        if self.overflow || self.out.len() + n > self.cap {
            self.overflow = true;
            false
        } else {
            true
        }
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.reserve(bytes.len()) {
            self.out.extend_from_slice(bytes);
        }
    }

    fn before_value(&mut self) {
        if self.after_key {
            self.after_key = false;
            return;
        }
        if let Some(has_member) = self.stack.last_mut() {
            let comma = *has_member;
            *has_member = true;
            if comma {
                self.push(b",");
            }
        }
    }

    /// Opens an object.
    pub fn begin_object(&mut self) -> &mut Self {
        self.before_value();
        self.push(b"{");
        self.stack.push(false);
        self
    }

    /// Closes the innermost object.
    pub fn end_object(&mut self) -> &mut Self {
        self.stack.pop();
        self.push(b"}");
        self
    }

    /// Opens an array.
    pub fn begin_array(&mut self) -> &mut Self {
        self.before_value();
        self.push(b"[");
        self.stack.push(false);
        self
    }

    /// Closes the innermost array.
    pub fn end_array(&mut self) -> &mut Self {
        self.stack.pop();
        self.push(b"]");
        self
    }

    /// Writes an object key (the next call writes its value).
    pub fn key(&mut self, key: &str) -> &mut Self {
        self.before_value();
        self.string_raw(key);
        self.push(b":");
        self.after_key = true;
        self
    }

    fn string_raw(&mut self, value: &str) {
        if self.reserve(json_string_len(value)) {
            write_json_string(&mut self.out, value);
        }
    }

    /// Writes a string value.
    pub fn string(&mut self, value: &str) -> &mut Self {
        self.before_value();
        self.string_raw(value);
        self
    }

    /// Writes `json`, a complete JSON value, as the next value.
    pub fn raw(&mut self, json: &[u8]) -> &mut Self {
        self.before_value();
        self.push(json);
        self
    }

    /// Writes a non-negative integer value.
    pub fn uint(&mut self, value: u64) -> &mut Self {
        self.before_value();
        let mut tmp = Vec::with_capacity(20);
        write_json_uint(&mut tmp, value);
        self.push(&tmp);
        self
    }

    /// Writes an integer value.
    pub fn int(&mut self, value: i64) -> &mut Self {
        self.before_value();
        let mut tmp = Vec::with_capacity(21);
        write_json_int(&mut tmp, value);
        self.push(&tmp);
        self
    }

    /// Writes `true` or `false`.
    pub fn bool(&mut self, value: bool) -> &mut Self {
        self.before_value();
        self.push(if value { b"true" } else { b"false" });
        self
    }

    /// Writes `null`.
    pub fn null(&mut self) -> &mut Self {
        self.before_value();
        self.push(b"null");
        self
    }

    /// `key` then the string `value`.
    pub fn field_str(&mut self, key: &str, value: &str) -> &mut Self {
        self.key(key).string(value)
    }

    /// `key` then the integer `value`.
    pub fn field_uint(&mut self, key: &str, value: u64) -> &mut Self {
        self.key(key).uint(value)
    }

    /// `key` then the boolean `value` or `null`.
    pub fn field_opt_bool(&mut self, key: &str, value: Option<bool>) -> &mut Self {
        self.key(key);
        match value {
            Some(v) => self.bool(v),
            None => self.null(),
        }
    }

    /// The bytes written so far.
    ///
    /// # Errors
    /// [`CapExceeded`] when any write would have gone past the cap.
    pub fn finish(self) -> Result<Zeroizing<Vec<u8>>, CapExceeded> {
        if self.overflow {
            Err(CapExceeded { cap: self.cap })
        } else {
            Ok(self.out)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn string_escaping_matches_json_stringify_rules() {
        let mut out = Vec::new();
        write_json_string(
            &mut out,
            "a\"b\\c\u{8}\u{c}\n\r\t\u{1}\u{1f}\u{7f}\u{2028}é😀",
        );
        let text = String::from_utf8(out).unwrap();
        assert_eq!(
            text,
            "\"a\\\"b\\\\c\\b\\f\\n\\r\\t\\u0001\\u001f\u{7f}\u{2028}é😀\""
        );
        assert_eq!(json_string_len("a\"\u{1}"), text_len("a\"\u{1}"));
    }

    fn text_len(s: &str) -> usize {
        let mut out = Vec::new();
        write_json_string(&mut out, s);
        out.len()
    }

    #[test]
    fn integers_are_plain_decimal() {
        let mut out = Vec::new();
        write_json_int(&mut out, -9_007_199_254_740_991);
        out.push(b' ');
        write_json_uint(&mut out, 0);
        assert_eq!(out, b"-9007199254740991 0");
    }

    #[test]
    fn writer_never_exceeds_cap() {
        let mut w = JsonWriter::with_cap(8);
        w.begin_object().field_str("k", "value").end_object();
        assert_eq!(w.finish().unwrap_err(), CapExceeded { cap: 8 });
        assert_eq!(
            CapExceeded { cap: 4096 }.to_string(),
            "serialized JSON exceeds its 4096 byte cap"
        );
        let mut w = JsonWriter::with_cap(64);
        w.begin_object()
            .field_str("a", "x")
            .key("b")
            .begin_array()
            .uint(1)
            .int(-2)
            .end_array()
            .field_opt_bool("c", None)
            .end_object();
        assert_eq!(&**w.finish().unwrap(), br#"{"a":"x","b":[1,-2],"c":null}"#);
    }
}
