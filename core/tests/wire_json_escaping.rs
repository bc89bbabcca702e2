//! serde_json's compact writer, which writes every request body, escapes strings exactly as
//! Node's `JSON.stringify` does. The golden vectors (`tests/fixtures/wire/strings.json`, written
//! by `generate.mjs` with Node 20) hold every C0 control, DEL, the C1 controls, U+2028/U+2029
//! and their neighbours, `"`, `\`, `/`, and well-formed non-ASCII up to U+10FFFF, as code points
//! in and UTF-8 hex out: no JSON decoder stands between Node's bytes and ours.

use serde::ser::{SerializeMap, Serializer};

const STRINGS: &str = include_str!("../../tests/fixtures/wire/strings.json");

fn unhex(text: &str) -> Vec<u8> {
    assert!(text.len().is_multiple_of(2));
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

/// Each string and the bytes `JSON.stringify` wrote for it.
type Cases = Vec<(String, Vec<u8>)>;

/// The vectors: the cases, then the bytes of the array of all strings and of the object
/// `{"k<i><string>": <string>}` in insertion order.
fn vectors() -> (Cases, Vec<u8>, Vec<u8>) {
    let root: serde_json::Value = serde_json::from_str(STRINGS).unwrap();
    let strings = root["strings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| {
            let text: String = case["codePoints"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| char::from_u32(u32::try_from(c.as_u64().unwrap()).unwrap()).unwrap())
                .collect();
            (text, unhex(case["json"].as_str().unwrap()))
        })
        .collect();
    (
        strings,
        unhex(root["array"].as_str().unwrap()),
        unhex(root["object"].as_str().unwrap()),
    )
}

/// Serializes `(key, value)` pairs as one JSON object, in the given order.
struct Ordered<'a>(&'a [(String, &'a str)]);

impl serde::Serialize for Ordered<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.0.len()))?;
        for (k, v) in self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

#[test]
fn serde_json_escapes_every_string_as_json_stringify_does() {
    let (strings, array, object) = vectors();
    let mut differences = Vec::new();
    for (text, node) in &strings {
        let ours = serde_json::to_vec(text).unwrap();
        if &ours != node {
            differences.push(format!(
                "{text:?}: node {:?} serde_json {:?}",
                String::from_utf8_lossy(node),
                String::from_utf8_lossy(&ours)
            ));
        }
    }
    let texts: Vec<&str> = strings.iter().map(|(t, _)| t.as_str()).collect();
    let pairs: Vec<(String, &str)> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| (format!("k{i}{t}"), *t))
        .collect();
    let array_ok = serde_json::to_vec(&texts).unwrap() == array;
    let object_ok = serde_json::to_vec(&Ordered(&pairs)).unwrap() == object;
    println!(
        "json escaping: {} strings, {} differences, array {}, object {}",
        strings.len(),
        differences.len(),
        if array_ok { "identical" } else { "differs" },
        if object_ok { "identical" } else { "differs" },
    );
    assert!(differences.is_empty(), "{differences:#?}");
    assert!(array_ok && object_ok);
}

#[test]
fn the_vectors_cover_what_they_claim() {
    let (strings, _, _) = vectors();
    let single: Vec<u32> = strings
        .iter()
        .filter(|(t, _)| t.chars().count() == 1)
        .map(|(t, _)| u32::from(t.chars().next().unwrap()))
        .collect();
    for c in (0..=0xa0).chain([0x2028, 0x2029, 0xfeff, 0xffff, 0x1_f600, 0x10_ffff]) {
        assert!(single.contains(&c), "U+{c:04X} missing");
    }
    // Node escapes exactly the C0 controls, `"` and `\`; everything else is verbatim UTF-8.
    let escaped = strings
        .iter()
        .filter(|(t, node)| t.chars().count() == 1 && node.len() > t.len() + 2)
        .count();
    assert_eq!(escaped, 32 + 2);
}
