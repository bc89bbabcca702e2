//! JavaScript-compatibility primitives for the wire contract.
//!
//! The control plane is a Node.js program. Three of its behaviours reach our bytes and digests:
//!
//! * `JSON.stringify` of JavaScript strings that hold lone surrogates (`JsStringJson`; serde_json
//!   writes everything else exactly as `JSON.stringify`), and the length of a string once so
//!   written (`json_string_len`, for the environment bundle's encoded bound); the hand-written
//!   JSON writer of the loopback control plane lives in that crate
//!   (`ql_worker_tests::json_writer`);
//! * `String.prototype.localeCompare` with the default locale and options (ICU root collation,
//!   tertiary strength, punctuation not ignorable) used to order environment names, placement
//!   labels and runtime names ([`locale_compare`]);
//! * `Array.prototype.sort` without a comparator, which orders by UTF-16 code units
//!   ([`code_unit_cmp`]), and the property order of plain objects, which lists array-index keys
//!   first in numeric order (`array_index`).
//!
//! `locale_compare` supports exactly the characters the reference's patterns admit where it sorts
//! with `localeCompare`: `[A-Za-z0-9._/+-]`. Any other character is refused with a
//! [`CollationError`] rather than guessed at. The ordering was derived from, and is tested
//! against, vectors produced by Node's own `localeCompare` (`tests/fixtures/revision-digest`).

use alloc::vec::Vec;
use core::cmp::Ordering;
use core::fmt;

/// A character outside the set [`locale_compare`] can order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "cannot order {character:?} like JavaScript localeCompare: only [A-Za-z0-9._/+-] is supported"
)]
pub struct CollationError {
    /// The offending character (names and label keys are never secret).
    pub character: char,
}

/// Primary collation rank of a supported character under ICU root collation (case folded), and
/// whether it carries the uppercase tertiary weight.
///
/// Root order of the supported punctuation is `_ - . / +`, then the digits, then the letters
/// (case-insensitive at the primary level; lowercase before uppercase at the tertiary level).
fn rank(c: char) -> Result<(u8, bool), CollationError> {
    let b = u8::try_from(u32::from(c)).map_err(|_| CollationError { character: c })?;
    match b {
        b'_' => Ok((0, false)),
        b'-' => Ok((1, false)),
        b'.' => Ok((2, false)),
        b'/' => Ok((3, false)),
        b'+' => Ok((4, false)),
        b'0'..=b'9' => Ok((5 + (b - b'0'), false)),
        b'a'..=b'z' => Ok((15 + (b - b'a'), false)),
        b'A'..=b'Z' => Ok((15 + (b - b'A'), true)),
        _ => Err(CollationError { character: c }),
    }
}

/// `a.localeCompare(b)` under Node's default (ICU root) collation, for strings over
/// `[A-Za-z0-9._/+-]`.
///
/// ICU compares the primary weights of the whole strings first (letters case-insensitively, a
/// proper prefix first); only when they are all equal does it compare tertiary weights (case),
/// left to right, lowercase first. Strings over this set that are tertiary-equal are identical.
///
/// # Errors
/// [`CollationError`] when either string holds a character outside the supported set.
pub fn locale_compare(a: &str, b: &str) -> Result<Ordering, CollationError> {
    let ra = a.chars().map(rank).collect::<Result<Vec<_>, _>>()?;
    let rb = b.chars().map(rank).collect::<Result<Vec<_>, _>>()?;
    let primary = ra.iter().map(|r| r.0).cmp(rb.iter().map(|r| r.0));
    if primary != Ordering::Equal {
        return Ok(primary);
    }
    Ok(ra.iter().map(|r| r.1).cmp(rb.iter().map(|r| r.1)))
}

/// `Array.prototype.sort()` order without a comparator: UTF-16 code units.
#[must_use]
pub fn code_unit_cmp(a: &str, b: &str) -> Ordering {
    a.encode_utf16().cmp(b.encode_utf16())
}

/// The value of `key` when it is an array index (a canonical decimal `0..=2^32-2`). Plain
/// JavaScript objects enumerate such keys first, in ascending numeric order, before all other
/// keys in insertion order, whatever order they were inserted in; `JSON.stringify` follows that
/// order.
fn array_index(key: &str) -> Option<u64> {
    crate::ids::parse_canonical_decimal(key).filter(|value| *value <= 4_294_967_294)
}

/// The order in which a plain JavaScript object built by inserting `keys` in the given order
/// enumerates them: array indices ascending first, then the rest in insertion order.
/// Returns the permutation as indices into `keys`.
#[must_use]
pub(crate) fn object_key_order(keys: &[&str]) -> Vec<usize> {
    let index = |i: &usize| array_index(keys[*i]);
    let mut indices: Vec<usize> = (0..keys.len()).filter(|i| index(i).is_some()).collect();
    indices.sort_by_key(index);
    indices.extend((0..keys.len()).filter(|i| index(i).is_none()));
    indices
}

/// A JavaScript string value that may hold lone UTF-16 surrogates (`"x\ud800y"`), which a Rust
/// `str` cannot. Stored as WTF-8: UTF-8 where an unpaired surrogate is the 3-byte encoding of its
/// code point (`ED A0 80` for U+D800); a surrogate pair is always stored as the 4-byte encoding of
/// its character.
///
/// `JSON.stringify` writes a lone surrogate back as its escape (`\ud800`), so the execution
/// revision's digest needs it kept exactly (`JsStringJson`); Node hands the same string
/// to the operating system with each lone surrogate replaced by U+FFFD
/// (`JsString::to_utf8_lossy`), and `Buffer.byteLength` counts it as 3 bytes, like its WTF-8
/// form (`JsString::byte_len`).
///
/// Serialized as a string when it is well-formed, else as its WTF-8 bytes for binary formats
/// (postcard writes both identically) and as the lossy string for human-readable ones (display
/// only). Deserialized from a string or from bytes, which must be WTF-8: serde_json decodes an
/// escaped lone surrogate into WTF-8 when bytes are asked for.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JsString(Vec<u8>);

/// Bytes that are not WTF-8 (invalid UTF-8, or a surrogate pair in split form).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("a string of UTF-8 and lone UTF-16 surrogates only")]
pub struct NotWtf8;

/// One code point of WTF-8 at `i`: `(code point, length)`.
fn wtf8_at(bytes: &[u8], i: usize) -> Option<(u32, usize)> {
    let b0 = *bytes.get(i)?;
    let cont = |k: usize| -> Option<u32> {
        let b = *bytes.get(i + k)?;
        (b & 0xc0 == 0x80).then_some(u32::from(b & 0x3f))
    };
    match b0 {
        0x00..=0x7f => Some((u32::from(b0), 1)),
        0xc2..=0xdf => Some(((u32::from(b0 & 0x1f) << 6) | cont(1)?, 2)),
        0xe0..=0xef => {
            let c = (u32::from(b0 & 0x0f) << 12) | (cont(1)? << 6) | cont(2)?;
            (c >= 0x800).then_some((c, 3))
        }
        0xf0..=0xf4 => {
            let c = (u32::from(b0 & 0x07) << 18) | (cont(1)? << 12) | (cont(2)? << 6) | cont(3)?;
            (0x1_0000..=0x10_ffff).contains(&c).then_some((c, 4))
        }
        _ => None,
    }
}

impl JsString {
    /// Checks `bytes` as WTF-8.
    ///
    /// # Errors
    /// [`NotWtf8`] for invalid UTF-8 other than lone surrogates, or a high surrogate directly
    /// followed by a low one (that pair is one character and must be encoded as such).
    pub(crate) fn from_wtf8(bytes: Vec<u8>) -> Result<Self, NotWtf8> {
        let mut i = 0;
        let mut high_before = false;
        while i < bytes.len() {
            let (c, n) = wtf8_at(&bytes, i).ok_or(NotWtf8)?;
            if high_before && (0xdc00..=0xdfff).contains(&c) {
                return Err(NotWtf8);
            }
            high_before = (0xd800..=0xdbff).contains(&c);
            i += n;
        }
        Ok(Self(bytes))
    }

    /// The text, when it holds no lone surrogate.
    #[must_use]
    pub fn as_str(&self) -> Option<&str> {
        core::str::from_utf8(&self.0).ok()
    }

    /// `Buffer.byteLength(value, 'utf8')`: UTF-8 bytes, 3 for each lone surrogate.
    #[must_use]
    pub(crate) fn byte_len(&self) -> usize {
        self.0.len()
    }

    /// Whether it holds a NUL character.
    #[must_use]
    pub(crate) fn contains_nul(&self) -> bool {
        self.0.contains(&0)
    }

    /// The string as Node passes it to the operating system (environment, arguments): each lone
    /// surrogate replaced by U+FFFD.
    #[must_use]
    pub(crate) fn to_utf8_lossy(&self) -> alloc::borrow::Cow<'_, str> {
        if let Some(text) = self.as_str() {
            return alloc::borrow::Cow::Borrowed(text);
        }
        let mut out = alloc::string::String::with_capacity(self.0.len());
        let mut i = 0;
        while let Some((c, n)) = wtf8_at(&self.0, i) {
            out.push(char::from_u32(c).unwrap_or(char::REPLACEMENT_CHARACTER));
            i += n;
        }
        alloc::borrow::Cow::Owned(out)
    }
}

impl From<&str> for JsString {
    fn from(value: &str) -> Self {
        Self(value.as_bytes().to_vec())
    }
}

impl From<alloc::string::String> for JsString {
    fn from(value: alloc::string::String) -> Self {
        Self(value.into_bytes())
    }
}

impl fmt::Debug for JsString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.as_str() {
            Some(text) => write!(f, "JsString({text:?})"),
            None => {
                f.write_str("JsString(\"")?;
                let mut i = 0;
                while let Some((c, n)) = wtf8_at(&self.0, i) {
                    match char::from_u32(c) {
                        Some(ch) => write!(f, "{}", ch.escape_debug())?,
                        None => write!(f, "\\u{{{c:x}}}")?,
                    }
                    i += n;
                }
                f.write_str("\")")
            }
        }
    }
}

impl serde::Serialize for JsString {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.as_str() {
            Some(text) => serializer.serialize_str(text),
            None if serializer.is_human_readable() => {
                serializer.serialize_str(&self.to_utf8_lossy())
            }
            None => serializer.serialize_bytes(&self.0),
        }
    }
}

impl<'de> serde::Deserialize<'de> for JsString {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct JsStringVisitor;
        impl serde::de::Visitor<'_> for JsStringVisitor {
            type Value = JsString;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<JsString, E> {
                Ok(JsString::from(v))
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<JsString, E> {
                JsString::from_wtf8(v.to_vec()).map_err(E::custom)
            }
        }
        deserializer.deserialize_bytes(JsStringVisitor)
    }
}

/// A [`JsString`] as `JSON.stringify` writes it, for serde_json: a well-formed value as a string
/// (serde_json escapes exactly as `JSON.stringify` does), one with lone surrogates as a raw JSON
/// string in which each is its lowercase `\udxxx` escape (serde_json writes raw values only; any
/// other serializer refuses them).
pub(crate) struct JsStringJson<'a>(pub(crate) &'a JsString);

impl serde::Serialize for JsStringJson<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use core::fmt::Write as _;
        if let Some(text) = self.0.as_str() {
            return serializer.serialize_str(text);
        }
        let bytes = &self.0.0;
        let mut out = alloc::string::String::from("\"");
        let push_run = |out: &mut alloc::string::String, run: &[u8]| {
            // INVARIANT: WTF-8 between two surrogates is UTF-8, and a str always serializes.
            let run =
                core::str::from_utf8(run).expect("invariant: WTF-8 between surrogates is UTF-8");
            let quoted = serde_json::to_string(run).expect("invariant: a str serializes");
            out.push_str(&quoted[1..quoted.len() - 1]);
        };
        let (mut start, mut i) = (0, 0);
        while let Some((c, n)) = wtf8_at(bytes, i) {
            if (0xd800..=0xdfff).contains(&c) {
                push_run(&mut out, &bytes[start..i]);
                write!(out, "\\u{c:04x}").expect("invariant: writing to a String cannot fail");
                start = i + n;
            }
            i += n;
        }
        push_run(&mut out, &bytes[start..]);
        out.push('"');
        serde_json::value::RawValue::from_string(out)
            .map_err(serde::ser::Error::custom)?
            .serialize(serializer)
    }
}

/// Length of `value` once written as a JSON string literal the way `JSON.stringify` (and
/// serde_json) writes it: `"` and `\` escaped, `\b \f \n \r \t` in short form, other C0
/// controls as `\u00xx`, everything else verbatim. Counted, never written: the environment
/// bundle bound measures Secret values with it, and no copy of them may be left unwiped.
#[must_use]
pub fn json_string_len(value: &str) -> usize {
    2 + value
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | 0x08 | 0x0c | b'\n' | b'\r' | b'\t' => 2,
            0x00..=0x1f => 6,
            _ => 1,
        })
        .sum::<usize>()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_string_len_counts_what_serde_json_writes() {
        for text in [
            "",
            "a\"b\\c\u{8}\u{c}\n\r\t\u{1}\u{1f}\u{7f}\u{2028}é😀",
            "a\"\u{1}",
        ] {
            assert_eq!(
                json_string_len(text),
                serde_json::to_string(text).unwrap().len()
            );
        }
    }

    #[test]
    fn js_strings_keep_lone_surrogates_for_json_and_replace_them_for_the_os() {
        // serde_json decodes `"x\ud800y\udc00"` into these WTF-8 bytes when asked for bytes.
        let lone = JsString::from_wtf8(b"x\xed\xa0\x80y\xed\xb0\x80".to_vec()).unwrap();
        assert!(lone.as_str().is_none());
        assert_eq!(
            lone.byte_len(),
            8,
            "Buffer.byteLength counts 3 per lone surrogate"
        );
        let json = serde_json::to_string(&JsStringJson(&lone)).unwrap();
        assert_eq!(json, r#""x\ud800y\udc00""#);
        let mixed = JsString::from_wtf8(b"\"\xed\xb0\x80\n\xed\xa0\x80".to_vec()).unwrap();
        assert_eq!(
            serde_json::to_string(&JsStringJson(&mixed)).unwrap(),
            r#""\"\udc00\n\ud800""#
        );
        assert_eq!(lone.to_utf8_lossy(), "x\u{fffd}y\u{fffd}");
        assert_eq!(
            alloc::format!("{lone:?}"),
            r#"JsString("x\u{d800}y\u{dc00}")"#
        );
        // A split surrogate pair and invalid UTF-8 are not WTF-8.
        assert_eq!(
            JsString::from_wtf8(b"\xed\xa0\x80\xed\xb0\x80".to_vec()),
            Err(NotWtf8)
        );
        assert_eq!(JsString::from_wtf8(b"\xff".to_vec()), Err(NotWtf8));
        assert_eq!(JsString::from_wtf8(b"\xc0\x80".to_vec()), Err(NotWtf8));
        let plain = JsString::from("a\"\u{1}é");
        assert_eq!(
            serde_json::to_string(&JsStringJson(&plain)).unwrap(),
            serde_json::to_string("a\"\u{1}é").unwrap()
        );
        // Postcard writes a well-formed value exactly like a `String`, and reads either back.
        let bytes = postcard::to_allocvec(&plain).unwrap();
        assert_eq!(bytes, postcard::to_allocvec("a\"\u{1}é").unwrap());
        assert_eq!(postcard::from_bytes::<JsString>(&bytes).unwrap(), plain);
        let bytes = postcard::to_allocvec(&lone).unwrap();
        assert_eq!(postcard::from_bytes::<JsString>(&bytes).unwrap(), lone);
        let escaped: JsString = serde_json::from_str(r#""x\ud800y\udc00""#).unwrap();
        assert_eq!(escaped, lone);
        let paired: JsString = serde_json::from_str(r#""\ud83d\ude00""#).unwrap();
        assert_eq!(paired.as_str(), Some("😀"));
    }

    #[test]
    fn collation_orders_case_after_primary() {
        assert_eq!(locale_compare("aB", "Ab"), Ok(Ordering::Less));
        assert_eq!(locale_compare("a_b", "ab"), Ok(Ordering::Less));
        assert_eq!(locale_compare("Z", "a1"), Ok(Ordering::Greater));
        assert_eq!(locale_compare("A", "a"), Ok(Ordering::Greater));
        assert!(locale_compare("a:b", "a").is_err());
    }

    #[test]
    fn array_index_keys_come_first() {
        assert!(array_index("0").is_some() && array_index("4294967294").is_some());
        assert!(
            array_index("4294967295").is_none()
                && array_index("01").is_none()
                && array_index("").is_none()
        );
        assert_eq!(object_key_order(&["b", "10", "a", "9"]), [3, 1, 0, 2]);
    }
}
