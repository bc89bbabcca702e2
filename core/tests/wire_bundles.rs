//! Environment bundles (`qinglong/environment-bundle@v1`, the value the `secrets` endpoint
//! returns for a revision's `environmentBundleRef`): every rule of the reference's
//! `parseEnvironmentBundle`, and no value in `Debug` or errors.

use ql_worker_core::wire::secrets::{BundleError, EnvironmentBundle, SecretValue};
use serde_json::{Value, json};

fn bundle(entries: Value) -> SecretValue {
    SecretValue::new(
        json!({"schema": "qinglong/environment-bundle@v1", "entries": entries}).to_string(),
    )
}

fn entries(n: usize, value_len: usize) -> Value {
    Value::Array(
        (0..n)
            .map(|i| json!({"name": format!("V{i:03}"), "value": "x".repeat(value_len)}))
            .collect(),
    )
}

fn refused(text: SecretValue) -> BundleError {
    EnvironmentBundle::parse(&text).unwrap_err()
}

#[test]
fn wire_bundle_entries_come_back_sorted_by_name_with_values_redacted() {
    let parsed = EnvironmentBundle::parse(&bundle(json!([
        {"name": "b", "value": "secret-b"},
        {"name": "A", "value": "secret-a"},
        {"name": "_z", "value": ""},
    ])))
    .unwrap();
    let names: Vec<&str> = parsed.entries.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["A", "_z", "b"],
        "code-unit order, as the reference's `<`"
    );
    assert_eq!(parsed.entries[0].1.expose(), "secret-a");
    let debug = format!("{parsed:?}");
    assert!(
        !debug.contains("secret-a") && debug.contains("redacted"),
        "{debug}"
    );
}

#[test]
fn wire_bundle_rules_are_the_references() {
    let ok = |v: SecretValue| EnvironmentBundle::parse(&v).is_ok();
    assert!(ok(bundle(entries(256, 1))) && ok(bundle(entries(1, 16 * 1024))));
    // 4 × (4-byte name + 16 KiB - 4) = 64 KiB exactly.
    assert!(ok(bundle(entries(4, 16 * 1024 - 4))));
    let cases: Vec<(&str, SecretValue)> = vec![
        ("no entries", bundle(json!([]))),
        ("257 entries", bundle(entries(257, 1))),
        ("value above 16 KiB", bundle(entries(1, 16 * 1024 + 1))),
        ("above 64 KiB in all", bundle(entries(4, 16 * 1024 - 3))),
        ("duplicate name", bundle(json!([{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]))),
        ("QL3_ name", bundle(json!([{"name": "QL3_X", "value": "1"}]))),
        ("bad name", bundle(json!([{"name": "1A", "value": "1"}]))),
        ("NUL", bundle(json!([{"name": "A", "value": "a\u{0}b"}]))),
        ("number value", bundle(json!([{"name": "A", "value": 1}]))),
        ("extra entry key", bundle(json!([{"name": "A", "value": "1", "kind": "x"}]))),
        (
            "schema",
            SecretValue::new(json!({"schema": "qinglong/environment-bundle@v2", "entries": [{"name": "A", "value": "1"}]}).to_string()),
        ),
        (
            "extra key",
            SecretValue::new(json!({"schema": "qinglong/environment-bundle@v1", "entries": [{"name": "A", "value": "1"}], "x": 1}).to_string()),
        ),
        (
            "duplicate key",
            SecretValue::new(String::from(
                r#"{"schema":"qinglong/environment-bundle@v1","entries":[{"name":"A","value":"1","value":"2"}]}"#,
            )),
        ),
        ("not JSON", SecretValue::new(String::from("A=1"))),
        ("empty", SecretValue::new(String::new())),
        ("above 96 KiB", SecretValue::new(format!("{}{}", " ".repeat(96 * 1024), bundle(entries(1, 1)).expose()))),
    ];
    for (label, text) in cases {
        let e = refused(text);
        let shown = e.to_string();
        assert!(
            !shown.contains("xxxx") && !shown.contains("a\u{0}b"),
            "{label}: {shown}"
        );
    }
}
