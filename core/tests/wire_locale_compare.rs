//! `localeCompare` vectors made by Node (`tests/fixtures/revision-digest/locale-compare.json`).

use std::cmp::Ordering;

use ql_worker_core::js::{code_unit_cmp, locale_compare};
use serde_json::Value;

const PAIRS: &str = include_str!("../../tests/fixtures/revision-digest/locale-compare.json");

#[test]
fn wire_locale_compare_matches_node_for_every_vector() {
    let root: Value = serde_json::from_str(PAIRS).unwrap();
    let pairs = root["pairs"].as_array().unwrap();
    assert!(pairs.len() >= 2000, "at least 2,000 comparisons");
    for pair in pairs {
        let a = pair[0].as_str().unwrap();
        let b = pair[1].as_str().unwrap();
        let expected = match pair[2].as_i64().unwrap() {
            -1 => Ordering::Less,
            0 => Ordering::Equal,
            _ => Ordering::Greater,
        };
        assert_eq!(locale_compare(a, b), Ok(expected), "{a:?} vs {b:?}");
        assert_eq!(
            locale_compare(b, a),
            Ok(expected.reverse()),
            "{b:?} vs {a:?}"
        );
    }
}

#[test]
fn wire_locale_compare_refuses_characters_it_cannot_order() {
    for bad in ["a:b", "é", "a b", "a\u{0}", "a~"] {
        let err = locale_compare(bad, "a").unwrap_err();
        assert!(err.to_string().contains("localeCompare"), "{err}");
    }
}

#[test]
fn wire_default_sort_is_utf16_code_unit_order() {
    // U+FF5E sorts before U+1F600 in UTF-8 byte order but after it in UTF-16 code units.
    assert_eq!(code_unit_cmp("\u{ff5e}", "\u{1f600}"), Ordering::Greater);
    assert_eq!(code_unit_cmp("B", "a"), Ordering::Less);
}
