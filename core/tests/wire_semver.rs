//! `wire::semver::valid_range` against node-semver 7.7.4's own `validRange` output
//! (`tests/fixtures/semver-ranges/`, made by `generate.mjs` with Node): every text must give the
//! same verdict *and* the same normalized range, which pins down each rewrite step, not only the
//! yes/no answer.

use ql_worker_core::wire::semver::valid_range;
use serde_json::Value;

const VECTORS: &str = include_str!("../../tests/fixtures/semver-ranges/vectors.json");

#[test]
fn wire_semver_valid_range_matches_node_semver_on_every_vector() {
    let root: Value = serde_json::from_str(VECTORS).expect("fixture is JSON");
    assert_eq!(root["semver"], "7.7.4", "vectors of the pinned semver");
    let cases = root["cases"].as_array().expect("cases");
    let mut differences = Vec::new();
    let mut valid = 0usize;
    for case in cases {
        let text = case[0].as_str().expect("text");
        let expected = case[1].as_str();
        valid += usize::from(expected.is_some());
        let ours = valid_range(text);
        if ours.as_deref() != expected {
            differences.push(format!("{text:?}: node {expected:?}, ours {ours:?}"));
        }
    }
    report_line(&format!(
        "semver-ranges/vectors.json: {} texts ({valid} valid, {} invalid), {} differences",
        cases.len(),
        cases.len() - valid,
        differences.len()
    ));
    assert!(cases.len() >= 10_000, "thousands of vectors");
    assert!(
        differences.is_empty(),
        "{} differences, first 40:\n{}",
        differences.len(),
        differences[..differences.len().min(40)].join("\n")
    );
}

/// One line on the test's real stdout, so it shows in a normal `cargo test` run (the harness
/// captures `println!` of passing tests).
fn report_line(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}
