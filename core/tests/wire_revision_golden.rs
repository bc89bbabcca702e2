//! Golden vectors made by Node (`tests/fixtures/revision-digest/generate.mjs`): our parser,
//! normalization, canonical JSON and digest must match Node's byte for byte.

use ql_worker_core::ids::Sha256Digest;
use ql_worker_core::revision::{ExecCommand, ExecutionRevision, RevisionError};
use ql_worker_tests::control_plane::revisions::Seal as _;
use serde_json::Value;

const VECTORS: &str = include_str!("../../tests/fixtures/revision-digest/vectors.json");

fn cases() -> Vec<Value> {
    let root: Value = serde_json::from_str(VECTORS).expect("fixture is JSON");
    root["cases"].as_array().expect("cases array").clone()
}

fn text<'a>(case: &'a Value, key: &str) -> &'a str {
    case[key].as_str().expect("string field")
}

#[test]
fn wire_revision_golden_vectors_match_node_byte_for_byte() {
    let cases = cases();
    assert!(cases.len() >= 200, "at least 200 golden cases");
    for case in &cases {
        let name = text(case, "name");
        let revision = ExecutionRevision::parse_json(text(case, "input").as_bytes())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            String::from_utf8(revision.canonical_json().unwrap()).unwrap(),
            text(case, "canonical"),
            "{name}: canonical JSON"
        );
        assert_eq!(
            String::from_utf8(revision.to_json()).unwrap(),
            text(case, "full"),
            "{name}: full JSON"
        );
        assert_eq!(
            revision.compute_digest().unwrap().to_hex(),
            text(case, "digest"),
            "{name}"
        );
        assert_eq!(
            revision.content_digest.to_hex(),
            text(case, "digest"),
            "{name}"
        );
        revision
            .validate()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}

#[test]
fn wire_revision_golden_full_form_reparses_to_the_same_revision() {
    for case in cases() {
        let first = ExecutionRevision::parse_json(text(&case, "input").as_bytes()).unwrap();
        let second = ExecutionRevision::parse_json(text(&case, "full").as_bytes()).unwrap();
        assert_eq!(first, second, "{}", text(&case, "name"));
        let bytes = postcard::to_allocvec(&first).unwrap();
        let back: ExecutionRevision = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, first, "postcard round trip");
    }
}

#[test]
fn wire_revision_with_a_drifted_digest_is_rejected() {
    for case in cases().iter().take(40) {
        let mut value: Value = serde_json::from_str(text(case, "input")).unwrap();
        let digest = value["contentDigest"].as_str().unwrap().to_owned();
        let flipped = if digest.starts_with('0') { "1" } else { "0" };
        value["contentDigest"] = Value::String(format!("{flipped}{}", &digest[1..]));
        let err = ExecutionRevision::parse_json(value.to_string().as_bytes()).unwrap_err();
        assert_eq!(err, RevisionError::DigestMismatch, "{}", text(case, "name"));
    }
}

#[test]
fn wire_revision_stored_form_must_stay_normalized_and_sealed() {
    let case = cases()
        .into_iter()
        .find(|c| {
            let v: Value = serde_json::from_str(text(c, "input")).unwrap();
            v["environment"].as_array().unwrap().len() >= 3
        })
        .expect("a case with several bindings");
    let revision = ExecutionRevision::parse_json(text(&case, "input").as_bytes()).unwrap();
    let mut reordered = revision.clone();
    reordered.environment.reverse();
    assert_eq!(
        reordered.validate(),
        Err(RevisionError::NotNormalized {
            field: "environment"
        })
    );
    let mut tampered = revision.clone();
    tampered.created_at_ms = ql_worker_core::time::UnixMillis::new(7).unwrap();
    assert_eq!(
        tampered.validate(),
        Ok(()),
        "createdAtMs is outside the digest"
    );
    tampered.content_digest = Sha256Digest::of(b"other");
    assert_eq!(tampered.validate(), Err(RevisionError::DigestMismatch));
}

#[test]
fn wire_revision_beyond_the_plan_budget_has_no_digest_not_an_empty_preimage() {
    let case = cases().into_iter().next().expect("a golden case");
    let mut big = ExecutionRevision::parse_json(text(&case, "input").as_bytes()).unwrap();
    big.command = ExecCommand::Argv {
        file: String::from("/bin/true"),
        args: vec!["a".repeat(16 * 1024); 7],
    };
    let over = RevisionError::Field {
        field: "executionRevision",
        rule: "<= 96 KiB serialized",
    };
    assert_eq!(big.canonical_json(), Err(over.clone()));
    assert_eq!(big.compute_digest(), Err(over));
    // Normalization refuses it before any digest (its command alone breaks the 64 KiB rule).
    assert!(big.clone().seal().is_err());
    assert!(big.validate().is_err());
}
