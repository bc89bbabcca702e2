//! Serde helpers for strict JSON shapes.
//!
//! serde's derived struct visitors already reject unknown keys (`deny_unknown_fields`) and
//! duplicate keys. Two leniencies remain and are closed here:
//!
//! * an `Option<T>` field accepts both absence and `null`. Optional keys the reference omits when
//!   absent must not be `null` ([`present`], with `#[serde(default)]`); keys the reference always
//!   sends, `null` when empty, must not be absent ([`nullable`], without `default`).
//! * a JSON object read into a map keeps the last duplicate; [`Pairs`] rejects duplicates and
//!   keeps the input order.

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

use serde::de::{Deserialize, Deserializer, Error as _, MapAccess, Visitor};

/// An optional key that, when present, must hold a `T` (never `null`). Use with
/// `#[serde(default, deserialize_with = "present")]`.
pub(crate) fn present<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(deserializer).map(Some)
}

/// A required key whose value may be `null`. Use with `#[serde(deserialize_with = "nullable")]`
/// and no `default`, so a missing key is an error.
pub(crate) fn nullable<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(deserializer)
}

/// A JSON object of string values, in input order, with duplicate keys rejected.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pairs(pub(crate) Vec<(String, String)>);

impl<'de> Deserialize<'de> for Pairs {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct PairsVisitor;
        impl<'de> Visitor<'de> for PairsVisitor {
            type Value = Pairs;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object of strings")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Pairs, A::Error> {
                let mut out: Vec<(String, String)> = Vec::new();
                while let Some((key, value)) = map.next_entry::<String, String>()? {
                    if out.iter().any(|(k, _)| *k == key) {
                        return Err(A::Error::custom("duplicate object key"));
                    }
                    if out.len() >= 1024 {
                        return Err(A::Error::custom("too many object keys"));
                    }
                    out.push((key, value));
                }
                Ok(Pairs(out))
            }
        }
        deserializer.deserialize_map(PairsVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    struct Plain {
        #[allow(dead_code)]
        a: Option<u64>,
    }

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    struct Strict {
        #[serde(deserialize_with = "nullable")]
        a: Option<u64>,
        #[serde(default, deserialize_with = "present")]
        b: Option<u64>,
    }

    #[test]
    fn plain_option_accepts_absence_which_is_why_nullable_exists() {
        assert!(serde_json::from_str::<Plain>("{}").is_ok());
        assert!(
            serde_json::from_str::<Strict>("{}").is_err(),
            "nullable key missing"
        );
        let s: Strict = serde_json::from_str(r#"{"a":null}"#).unwrap();
        assert_eq!((s.a, s.b), (None, None));
        assert!(
            serde_json::from_str::<Strict>(r#"{"a":1,"b":null}"#).is_err(),
            "present"
        );
        let s: Strict = serde_json::from_str(r#"{"a":1,"b":2}"#).unwrap();
        assert_eq!((s.a, s.b), (Some(1), Some(2)));
    }

    #[test]
    fn derived_struct_visitor_rejects_duplicate_fields() {
        let err = serde_json::from_str::<Strict>(r#"{"a":1,"a":2}"#).unwrap_err();
        assert!(alloc::string::ToString::to_string(&err).contains("duplicate field"));
        let err = serde_json::from_str::<Pairs>(r#"{"k":"1","k":"2"}"#).unwrap_err();
        assert!(alloc::string::ToString::to_string(&err).contains("duplicate object key"));
        let pairs: Pairs = serde_json::from_str(r#"{"b":"1","a":"2"}"#).unwrap();
        assert_eq!(pairs.0[0].0, "b", "input order kept");
    }
}
