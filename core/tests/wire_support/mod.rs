//! Shared helpers of the `wire_*` integration tests: the reference §2 examples made by Node
//! (`tests/fixtures/wire/examples.json`) and JSON mutation helpers.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;

use serde_json::Value;

const EXAMPLES: &str = include_str!("../../../tests/fixtures/wire/examples.json");

/// Every example by name, as the exact JSON text Node wrote.
pub fn examples() -> BTreeMap<String, String> {
    let root: Value = serde_json::from_str(EXAMPLES).unwrap();
    root["examples"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect()
}

/// One example's bytes.
pub fn example(name: &str) -> Vec<u8> {
    examples()
        .remove(name)
        .unwrap_or_else(|| panic!("no example {name}"))
        .into_bytes()
}

/// Parses `bytes`, applies `edit` to the JSON value, re-serializes.
pub fn mutate(bytes: &[u8], edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut value: Value = serde_json::from_slice(bytes).unwrap();
    edit(&mut value);
    serde_json::to_vec(&value).unwrap()
}

/// Inserts `"key":value` right after the opening brace of the top-level object (so duplicate
/// keys can be produced, which a `Value` cannot hold).
pub fn prepend_member(bytes: &[u8], member: &str) -> Vec<u8> {
    assert_eq!(bytes[0], b'{');
    let mut out = b"{".to_vec();
    out.extend_from_slice(member.as_bytes());
    out.push(b',');
    out.extend_from_slice(&bytes[1..]);
    out
}

/// Pads a JSON object with a long unknown-free whitespace run up to `len` bytes.
pub fn pad_to(bytes: &[u8], len: usize) -> Vec<u8> {
    let mut out = bytes.to_vec();
    out.resize(len, b' ');
    out
}
