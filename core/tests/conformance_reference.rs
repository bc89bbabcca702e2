//! Wire conformance against data produced by the reference's own contract code
//! (`tests/fixtures/conformance/`, copied from `reference/conformance/`; see each file's
//! `about`). No Node is needed: every verdict, normalized form and digest the reference computed
//! is compared with ours, and each test prints one line of counts.

use ql_worker_core::ids::Sha256Digest;
use ql_worker_core::revision::{ExecutionRevision, RevisionError};
use ql_worker_core::wire::activation::ActivationResponse;
use ql_worker_core::wire::artifact::ArtifactReceipt;
use ql_worker_core::wire::completion::CompletionResponse;
use ql_worker_core::wire::lease_control::{LeaseControlRequest, LeaseControlResponse};
use ql_worker_core::wire::offer::{OfferResponse, admit_offer};
use ql_worker_core::wire::secrets::SecretsResponse;
use ql_worker_core::wire::semver::valid_range;
use ql_worker_core::wire::session::{
    HEARTBEAT_SCHEMA, REGISTER_SCHEMA, SessionResponse, TRANSITION_SCHEMA,
};
use ql_worker_core::wire::{WireError, activation};
use ql_worker_sim::fuzzing::wire as fx;
use ql_worker_tests::server_wire::{ToJson as _, ToJsonFor as _};
use serde_json::{Value, json};

const SEMVER_RANGES: &str = include_str!("../../tests/fixtures/conformance/semver-ranges.json");
const REVISION_EDGES: &str = include_str!("../../tests/fixtures/conformance/revision-edges.json");
const RESPONSES: &str = include_str!("../../tests/fixtures/conformance/reference-responses.json");

fn cases(text: &str) -> Value {
    let root: Value = serde_json::from_str(text).expect("fixture is JSON");
    assert!(root["about"].is_string(), "fixture has its about");
    root["cases"].clone()
}

fn report(file: &str, total: usize, accepted: usize, differences: &[String]) {
    report_line(&format!(
        "conformance/{file}: {total} cases ({accepted} accepted, {} rejected by the reference), \
         {} differences",
        total - accepted,
        differences.len()
    ));
    assert!(
        differences.is_empty(),
        "{file}: {} differences:\n{}",
        differences.len(),
        differences.join("\n")
    );
}

/// The revision of `semver-ranges.json`'s `about`, with `placement` and `contentDigest`.
fn range_revision(field: &str, range: &str, digest: &str) -> String {
    let placement = match field {
        "protocolVersionRange" => json!({"required": {"protocolVersionRange": range}}),
        "runtimes.versionRange" => {
            json!({"required": {"runtimes": [{"name": "node", "versionRange": range}]}})
        }
        other => panic!("unknown field {other}"),
    };
    json!({
        "projectId": "p",
        "taskId": "t",
        "taskRevision": format!("qltd:v1:1:{}", "a".repeat(64)),
        "sourceRevision": 1,
        "sourceContentDigest": "a".repeat(64),
        "executorType": "remote_worker",
        "planSchema": "qinglong/command-execution@v1",
        "command": {"kind": "argv", "file": "/bin/true", "args": []},
        "environment": [],
        "createdAtMs": 1,
        "placement": placement,
        "contentDigest": digest,
    })
    .to_string()
}

#[test]
fn conformance_semver_ranges_match_the_reference() {
    let cases = cases(SEMVER_RANGES);
    let cases = cases.as_array().expect("cases");
    let mut differences = Vec::new();
    let mut accepted = 0;
    for case in cases {
        let field = case["field"].as_str().unwrap();
        let text = case["text"].as_str().unwrap();
        let accepts = case["referenceAccepts"].as_bool().unwrap();
        accepted += usize::from(accepts);
        let name = format!("{field} {text:?}");
        // node-semver's own normalization, whatever the reference's caller decides.
        let normalized = valid_range(text);
        if normalized.as_deref() != case["referenceValidRange"].as_str() {
            differences.push(format!(
                "{name}: validRange {:?}, ours {normalized:?}",
                case["referenceValidRange"]
            ));
        }
        let digest = case["digest"]
            .as_str()
            .unwrap_or(&"0".repeat(64))
            .to_owned();
        let parsed = ExecutionRevision::parse_json(range_revision(field, text, &digest).as_bytes());
        match (accepts, parsed) {
            (true, Ok(revision)) => {
                if revision.compute_digest().map(|d| d.to_hex()).as_deref() != Ok(digest.as_str()) {
                    differences.push(format!("{name}: digest differs"));
                }
            }
            (false, Err(RevisionError::Field { field: f, .. }))
                if f.starts_with("placement.required.") => {}
            (true, Err(e)) => differences.push(format!("{name}: reference keeps it, we: {e}")),
            (false, Ok(_)) => differences.push(format!("{name}: reference refuses it, we keep it")),
            (false, Err(e)) => differences.push(format!("{name}: refused for another rule: {e}")),
        }
    }
    assert!(cases.len() >= 180);
    report("semver-ranges.json", cases.len(), accepted, &differences);
}

/// The reference's `offer: argv, no placement key` response carrying `text` (the wire form of
/// `revision`) in place of its own revision, with the candidate and digest to match, parsed as
/// an offer.
fn offered(text: &str, revision: &ExecutionRevision) -> Result<ExecutionRevision, WireError> {
    let responses = cases(RESPONSES);
    let body = responses["offer: argv, no placement key"]["body"]
        .as_str()
        .unwrap();
    let start = body.find("\"executionRevision\":").unwrap() + "\"executionRevision\":".len();
    let end = body.find(",\"placementScore\"").unwrap();
    let quoted = |s: &str| serde_json::to_string(s).unwrap();
    let candidate =
        "\"projectId\":\"project-1\",\"taskId\":\"task-1\",\"taskRevision\":\"qltd:v1:1:";
    let old: Value = serde_json::from_str(body).unwrap();
    let old_digest = old["offer"]["executionDigest"].as_str().unwrap();
    let body = format!("{}{text}{}", &body[..start], &body[end..])
        .replacen(
            &format!("\"executionDigest\":\"{old_digest}\""),
            &format!(
                "\"executionDigest\":\"{}\"",
                revision.content_digest.to_hex()
            ),
            1,
        )
        .replacen(
            &format!("{candidate}{}\"", "a".repeat(64)),
            &format!(
                "\"projectId\":{},\"taskId\":{},\"taskRevision\":{}",
                quoted(revision.project_id.as_str()),
                quoted(revision.task_id.as_str()),
                quoted(revision.task_revision.as_str())
            ),
            1,
        );
    match OfferResponse::parse(body.as_bytes())? {
        OfferResponse::Offered { offer, .. } => Ok(offer.execution_revision),
        OfferResponse::Idle { .. } => panic!("an offered body"),
    }
}

#[test]
fn conformance_revision_edges_match_the_reference() {
    let cases = cases(REVISION_EDGES);
    let cases = cases.as_array().expect("cases");
    let mut differences = Vec::new();
    let mut accepted = 0;
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let input = case["input"].as_str().unwrap();
        let accepts = case["referenceAccepts"].as_bool().unwrap();
        accepted += usize::from(accepts);
        match (accepts, ExecutionRevision::parse_json(input.as_bytes())) {
            (true, Ok(revision)) => {
                let ours = String::from_utf8(revision.to_json()).unwrap();
                let theirs = case["referenceNormalized"].as_str().unwrap();
                if ours != theirs {
                    differences.push(format!(
                        "{name}: normalized form differs\n  ref  {theirs}\n  ours {ours}"
                    ));
                }
                let digest = case["digest"].as_str().unwrap();
                if revision.compute_digest().map(|d| d.to_hex()).as_deref() != Ok(digest)
                    || revision.content_digest.to_hex() != digest
                {
                    differences.push(format!("{name}: digest differs"));
                }
                if let Err(e) = revision.validate() {
                    differences.push(format!("{name}: stored form does not validate: {e}"));
                }
                // The same revision inside the reference's own offer body parses the same way.
                match offered(input, &revision) {
                    Ok(inside) if inside == revision => {}
                    Ok(_) => differences.push(format!("{name}: differs inside an offer")),
                    Err(e) => differences.push(format!("{name}: refused inside an offer: {e}")),
                }
                // The inbox keeps it in postcard; it must come back exactly.
                let stored = postcard::to_allocvec(&revision).unwrap();
                if postcard::from_bytes::<ExecutionRevision>(&stored).ok() != Some(revision) {
                    differences.push(format!("{name}: postcard round trip differs"));
                }
            }
            (false, Err(RevisionError::DigestMismatch)) => differences.push(format!(
                "{name}: refused only for its digest (a rule was not applied)"
            )),
            (false, Err(_)) => {}
            (true, Err(e)) => differences.push(format!("{name}: reference keeps it, we: {e}")),
            (false, Ok(_)) => differences.push(format!(
                "{name}: reference refuses it ({}), we keep it",
                case["referenceError"]
            )),
        }
    }
    assert!(cases.len() >= 70);
    report("revision-edges.json", cases.len(), accepted, &differences);
}

/// Parses one reference response with the request the fixtures were built for, and returns our
/// re-serialization (`None` where only parsing is compared).
fn replay(kind: &str, body: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let err = |e: WireError| e.to_string();
    let worker = ql_worker_core::ids::WorkerId::new(fx::WORKER_ID).unwrap();
    let session = ql_worker_core::ids::SessionId::new(fx::SESSION_ID).unwrap();
    match kind {
        "offer" => {
            let parsed = OfferResponse::parse(body).map_err(err)?;
            if let OfferResponse::Offered { offer, .. } = &parsed {
                let revision = &offer.execution_revision;
                if revision.compute_digest() != Ok(offer.execution_digest) {
                    return Err(String::from("execution digest differs"));
                }
                let (offer_id, claim_worker, token) = fx::claim();
                let admitted = admit_offer(offer, &offer_id, &claim_worker, &token)
                    .map_err(|e| e.to_string())?;
                admitted.validate().map_err(|e| e.to_string())?;
            }
            Ok(Some(parsed.to_json()))
        }
        "starting" | "startFailure" => {
            let mut request = fx::starting_request();
            if kind == "startFailure" {
                request.op = activation::ActivationOp::StartFailure;
            }
            let parsed = ActivationResponse::parse(body, &request).map_err(err)?;
            Ok(Some(parsed.to_json()))
        }
        "running" => {
            let parsed = ActivationResponse::parse(body, &fx::running_request()).map_err(err)?;
            Ok(Some(parsed.to_json()))
        }
        "artifact" => {
            let sent = Sha256Digest::from_hex(fx::SENT_SHA256).unwrap();
            let upload = fx::artifact_upload();
            let parsed = ArtifactReceipt::parse(body, &upload, &sent).map_err(err)?;
            Ok(Some(parsed.to_json(&upload)))
        }
        "completion" => {
            let parsed = CompletionResponse::parse(body, &fx::completion_request()).map_err(err)?;
            Ok(Some(parsed.to_json()))
        }
        "leaseControl" => {
            let request = LeaseControlRequest { fence: fx::fence() };
            let parsed = LeaseControlResponse::parse(body, &request).map_err(err)?;
            Ok(Some(parsed.to_json(&request)))
        }
        "secrets" => {
            let request = fx::secrets_request();
            let parsed = SecretsResponse::parse(body, &request).map_err(err)?;
            Ok(Some(parsed.to_json(&request).to_vec()))
        }
        "register" => {
            let parsed = SessionResponse::parse_register(body, &worker, &session).map_err(err)?;
            Ok(Some(parsed.to_json(REGISTER_SCHEMA)))
        }
        "heartbeat" => {
            let mut request = fx::heartbeat_request();
            request.expected_version = 3;
            let parsed =
                SessionResponse::parse_heartbeat(body, &worker, &session, &request).map_err(err)?;
            Ok(Some(parsed.to_json(HEARTBEAT_SCHEMA)))
        }
        "transition" => {
            let parsed = SessionResponse::parse_transition(
                body,
                &worker,
                &session,
                &fx::transition_request(),
            )
            .map_err(err)?;
            Ok(Some(parsed.to_json(TRANSITION_SCHEMA)))
        }
        other => Err(format!("unknown kind {other}")),
    }
}

#[test]
fn conformance_reference_responses_parse_and_round_trip() {
    let cases = cases(RESPONSES);
    let cases = cases.as_object().expect("cases by name");
    let mut differences = Vec::new();
    let mut kinds = std::collections::BTreeSet::new();
    for (name, case) in cases {
        let kind = case["kind"].as_str().unwrap();
        kinds.insert(kind.to_owned());
        let body = case["body"].as_str().unwrap();
        match replay(kind, body.as_bytes()) {
            Ok(Some(ours)) if ours != body.as_bytes() => differences.push(format!(
                "{name}: re-serialized differently\n  ref  {body}\n  ours {}",
                String::from_utf8_lossy(&ours)
            )),
            Ok(_) => {}
            Err(e) => differences.push(format!("{name}: refused: {e}")),
        }
    }
    assert!(cases.len() >= 40);
    assert_eq!(
        kinds.len(),
        11,
        "every Worker-facing response kind: {kinds:?}"
    );
    report(
        "reference-responses.json",
        cases.len(),
        cases.len(),
        &differences,
    );
}

/// One line on the test's real stdout, so it shows in a normal `cargo test` run (the harness
/// captures `println!` of passing tests).
fn report_line(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}
