//! Control-plane ingress (reference §6.11, `CC/workerIngressPipeline.test.cjs`), one test per
//! scenario title, against the pure model with bodies built by the core's request builders.

use std::io::{self, Read};

use ql_worker_core::ids::{LeaseVersion, ProjectId, RunId, WorkerGeneration, WorkerId};
use ql_worker_core::offer::{DeliveryKind, Offer};
use ql_worker_core::wire::activation::{ActivationRequest, ActivationStatus};
use ql_worker_core::wire::error::ErrorCode;
use ql_worker_core::wire::lease_control::{LeaseControlRequest, LeaseControlResponse};
use ql_worker_core::wire::route::Operation;
use ql_worker_core::wire::secrets::{SecretsRequest, SecretsResponse};
use ql_worker_core::wire::session::{SessionResponse, SessionStatus};
use ql_worker_tests::control_plane::harness::{
    ModelHarness, WorkerIdentity, artifact_body, capability, completion, heartbeat_body,
    lease_token, register_body, running_ack, session_id, transition_body, upload,
};
use ql_worker_tests::control_plane::{
    AuditOutcome, CpHead, CpRequest, CpResponse, RevisionBuilder, RunSpec, ServiceFault,
};
use ql_worker_tests::server_wire::ToJsonFor as _;

const GEN1: WorkerGeneration = WorkerGeneration::FIRST;

/// A body that must never be read.
#[derive(Default)]
struct Untouchable {
    reads: usize,
}

impl Read for Untouchable {
    fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
        self.reads += 1;
        Err(io::Error::other("the body must not be read"))
    }
}

fn json(body: &[u8]) -> serde_json::Value {
    serde_json::from_slice(body).expect("JSON")
}

fn keys(body: &[u8]) -> Vec<String> {
    let mut keys: Vec<String> = json(body)
        .as_object()
        .expect("object")
        .keys()
        .cloned()
        .collect();
    keys.sort();
    keys
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    String::from_utf8_lossy(haystack).contains(needle)
}

fn setup_with_secrets() -> (ModelHarness, Offer) {
    let mut h = ModelHarness::new();
    h.register(2);
    let project = ProjectId::new("project-1").unwrap();
    let a = h.cp.set_secret(&project, "zeta", "value-z").unwrap();
    let b = h.cp.set_secret(&project, "alpha", "value-a").unwrap();
    let revision = RevisionBuilder::argv("/bin/true", Vec::<String>::new())
        .secret_env("A_FIRST", &a)
        .secret_env("B_SECOND", &b)
        .build()
        .unwrap();
    h.cp.enqueue_run(h.at(), RunSpec::numbered(1, revision))
        .unwrap();
    let offer = h.claim(GEN1, 1).unwrap();
    h.activate_ok(&ActivationRequest::starting(&offer));
    (h, offer)
}

fn setup_running() -> (ModelHarness, Offer) {
    let mut h = ModelHarness::new();
    h.register(2);
    let revision = RevisionBuilder::argv("/bin/true", Vec::<String>::new())
        .build()
        .unwrap();
    h.cp.enqueue_run(h.at(), RunSpec::numbered(1, revision))
        .unwrap();
    let offer = h.claim(GEN1, 1).unwrap();
    h.activate_ok(&ActivationRequest::starting(&offer));
    h.activate_ok(&ActivationRequest::running(
        &offer,
        running_ack(&offer, 1, true),
    ));
    (h, offer)
}

/// Registers a second Worker `edge-2` with its own credential and returns its identity.
fn second_worker(h: &mut ModelHarness) -> WorkerIdentity {
    let other = WorkerIdentity::new(&WorkerId::new("edge-2").unwrap()).with_session(session_id(7));
    h.cp.add_credential(&other.credential, other.worker_id.clone());
    let r = h.cp.handle(
        h.at(),
        &CpRequest::json(
            other.path(Operation::Register),
            &other.authorization(),
            register_body(1),
        ),
    );
    assert_eq!(r.status, 200);
    other
}

#[test]
fn authenticates_and_durably_audits_before_accepting_a_heartbeat_body() {
    let mut h = ModelHarness::new();
    h.register(1);
    let audits = h.cp.audit().len();
    let r = h.post(Operation::Heartbeat, &heartbeat_body(GEN1, 0, 1));
    assert_eq!(r.status, 200);
    let record = h.cp.session(&h.worker.worker_id).unwrap().clone();
    let expected = SessionResponse {
        worker_id: record.worker_id.clone(),
        session_id: record.session_id.clone(),
        generation: GEN1,
        version: 1,
        status: SessionStatus::Online,
        lease_expires_at_ms: record.lease_expires_at,
        replaced_session: None,
    }
    .to_json(ql_worker_core::wire::session::HEARTBEAT_SCHEMA);
    assert_eq!(r.body, expected);
    let audit = &h.cp.audit()[audits];
    assert_eq!(audit.outcome, AuditOutcome::Allowed);
    assert_eq!(audit.operation, Operation::Heartbeat);
    assert_eq!(audit.worker_id.as_ref(), Some(&h.worker.worker_id));
    assert_eq!(audit.credential_id.as_deref(), Some("worker-primary"));

    // The audit is written before the body is looked at: a malformed body still leaves an
    // `allowed` record, and only then is refused.
    let r = h.post(Operation::Heartbeat, b"{\"schema\":1}");
    assert_eq!(r.code(), Some(ErrorCode::InvalidWorkerRequest));
    assert_eq!(h.cp.audit().last().unwrap().outcome, AuditOutcome::Allowed);
    assert!(h.cp.audit().last().unwrap().seq < h.cp.last_request().unwrap().seq);
}

#[test]
fn uses_exact_versioned_register_and_transition_contracts() {
    let mut h = ModelHarness::new();
    let r = h.post(Operation::Register, &register_body(1));
    assert_eq!(r.status, 200);
    assert_eq!(
        json(&r.body)["schema"],
        "qinglong/worker-session-register@v1"
    );
    assert_eq!(json(&r.body)["replacedSession"], false);
    let mut text = String::from_utf8(register_body(1)).unwrap();
    text = text.replace("worker-session-register@v1", "worker-session-register@v2");
    let r = h.post(Operation::Register, text.as_bytes());
    assert_eq!(r.code(), Some(ErrorCode::InvalidWorkerRequest));
    let widened =
        String::from_utf8(register_body(1))
            .unwrap()
            .replacen('{', "{\"workerId\":\"edge-1\",", 1);
    let r = h.post(Operation::Register, widened.as_bytes());
    assert_eq!(r.code(), Some(ErrorCode::InvalidWorkerRequest));

    let r = h.post(
        Operation::Transition,
        &transition_body(GEN1, 0, SessionStatus::Draining),
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        json(&r.body)["schema"],
        "qinglong/worker-session-transition@v1"
    );
    assert_eq!(json(&r.body)["status"], "draining");
    let online = br#"{"schema":"qinglong/worker-session-transition@v1","generation":1,"expectedVersion":1,"status":"online"}"#;
    let r = h.post(Operation::Transition, online);
    assert_eq!(r.code(), Some(ErrorCode::InvalidWorkerRequest));
}

#[test]
fn rejects_unversioned_worker_capabilities_before_repository_registration() {
    let mut h = ModelHarness::new();
    let register = |json: &str| {
        let hash = ql_worker_tests::control_plane::harness::digest(json.as_bytes()).to_hex();
        serde_json::json!({
            "schema": "qinglong/worker-session-register@v1",
            "capabilitiesJson": json,
            "capabilitiesHash": hash,
            "maxConcurrentRuns": 1,
            "availableSlots": 1,
            "leaseDurationMs": 30000,
        })
        .to_string()
    };
    let before = h.cp.state().clone();
    for capabilities in [
        "{}",
        r#"{"architecture":"amd64","executors":["remote-worker"],"protocolVersion":"1.0","supportTier":"tier1"}"#,
        r#"{"executors":["remote-worker"],"architecture":"amd64","protocolVersion":"1.0.0","supportTier":"tier1"}"#,
        r#"{"architecture":"amd64","executors":["remote-worker"],"protocolVersion":"1.0.0","supportTier":"candidate"}"#,
    ] {
        let r = h.post(Operation::Register, register(capabilities).as_bytes());
        assert_eq!(
            r.code(),
            Some(ErrorCode::InvalidWorkerRequest),
            "{capabilities}"
        );
    }
    assert_eq!(h.cp.state(), &before, "nothing registered");
    let good = r#"{"architecture":"amd64","executors":["remote-worker"],"protocolVersion":"1.0.0","supportTier":"tier1"}"#;
    assert_eq!(
        h.post(Operation::Register, register(good).as_bytes())
            .status,
        200
    );
}

#[test]
fn binds_the_credential_worker_to_the_path_and_rejects_before_body_access() {
    let mut h = ModelHarness::new();
    h.register(1);
    let audits = h.cp.audit().len();
    let other_path =
        WorkerIdentity::new(&WorkerId::new("other-worker").unwrap()).path(Operation::Heartbeat);
    let mut body = Untouchable::default();
    let head = CpHead {
        path: other_path,
        authorization: Some(h.worker.authorization()),
        content_type: Some("application/json".to_owned()),
        content_length: 100,
    };
    let r = h.cp.handle_stream(h.at(), &head, &mut body);
    assert_eq!(r.status, 401);
    assert_eq!(r.code(), Some(ErrorCode::WorkerAuthenticationRequired));
    assert_eq!(body.reads, 0);
    assert_eq!(h.cp.last_request().unwrap().body_bytes_read, 0);
    assert_eq!(
        h.cp.audit()[audits].outcome,
        AuditOutcome::AuthenticationRejected
    );

    // No header, a forged secret, a revoked credential: 401, body untouched.
    let forged = WorkerIdentity::new(&WorkerId::new("somebody").unwrap());
    let own_path = h.worker.path(Operation::Heartbeat);
    for authorization in [None, Some(forged.authorization())] {
        let head = CpHead {
            path: own_path.clone(),
            authorization,
            ..head.clone()
        };
        let mut body = Untouchable::default();
        assert_eq!(h.cp.handle_stream(h.at(), &head, &mut body).status, 401);
        assert_eq!(body.reads, 0);
    }
    assert!(h.cp.revoke_credential("worker-primary"));
    let r = h.post(Operation::Heartbeat, &heartbeat_body(GEN1, 0, 1));
    assert_eq!(r.status, 401);
}

#[test]
fn forwards_the_complete_execution_fence_and_maps_stale_attestations_to_conflict() {
    let (mut h, offer) = setup_running();
    let attestation = |sequence: u64, lease_version: u64, generation: u64| {
        serde_json::json!({
            "attestationId": format!("att-{sequence}-{lease_version}-{generation}"),
            "runId": "run-1",
            "attemptId": "attempt-1",
            "sequence": sequence,
            "state": "running",
            "workerGeneration": generation,
            "leaseTokenDigest": lease_token(1).digest().expose().to_hex(),
            "leaseGeneration": 1,
            "leaseVersion": lease_version,
            "offerId": offer.offer_id.as_str(),
            "callbackSequence": 1,
            "executorHandle": "ql3lp1.test-1",
            "journalRevision": 4,
        })
        .to_string()
    };
    let r = h.post(Operation::Attestations, attestation(1, 0, 1).as_bytes());
    assert_eq!(r.status, 201);
    assert_eq!(json(&r.body)["replay"], false);
    let r = h.post(Operation::Attestations, attestation(1, 0, 1).as_bytes());
    assert_eq!(r.status, 200);
    assert_eq!(json(&r.body)["replay"], true);
    for stale in [
        attestation(2, 5, 1),
        attestation(2, 0, 2),
        attestation(1, 0, 1).replace("\"journalRevision\":4", "\"journalRevision\":5"),
    ] {
        let r = h.post(Operation::Attestations, stale.as_bytes());
        assert_eq!(r.status, 409, "{stale}");
        assert_eq!(r.code(), Some(ErrorCode::WorkerAttestationFenced));
    }
    let widened = attestation(3, 0, 1).replacen('{', "{\"workerId\":\"edge-1\",", 1);
    let r = h.post(Operation::Attestations, widened.as_bytes());
    assert_eq!(r.code(), Some(ErrorCode::InvalidWorkerRequest));
}

#[test]
fn fails_closed_when_authentication_or_durable_audit_is_unavailable() {
    let mut h = ModelHarness::new();
    h.register(1);
    let before = h.cp.state().clone();
    for (fault, code) in [
        (
            ServiceFault::AuthenticationUnavailable,
            ErrorCode::WorkerAuthenticationUnavailable,
        ),
        (
            ServiceFault::AuditUnavailable,
            ErrorCode::WorkerAuditUnavailable,
        ),
    ] {
        h.cp.inject_service_fault(Some(Operation::Heartbeat), fault);
        let head = CpRequest::json(
            h.worker.path(Operation::Heartbeat),
            &h.worker.authorization(),
            heartbeat_body(GEN1, 0, 1),
        )
        .head();
        let mut body = Untouchable::default();
        let r = h.cp.handle_stream(h.at(), &head, &mut body);
        assert_eq!((r.status, r.code()), (503, Some(code)));
        assert_eq!(body.reads, 0);
    }
    assert_eq!(h.cp.state(), &before);
    assert_eq!(
        h.post(Operation::Heartbeat, &heartbeat_body(GEN1, 0, 1))
            .status,
        200
    );
}

#[test]
fn binds_pull_based_offer_claims_to_the_authenticated_session_without_echoing_the_lease_token() {
    let mut h = ModelHarness::new();
    h.register(1);
    let revision = RevisionBuilder::argv("/bin/true", Vec::<String>::new())
        .build()
        .unwrap();
    h.cp.enqueue_run(h.at(), RunSpec::numbered(1, revision))
        .unwrap();
    let r = h.pull(GEN1, 1);
    assert_eq!(r.status, 200);
    let token = lease_token(1);
    assert!(!contains(&r.body, token.expose()));
    assert!(!contains(&r.body, &token.digest().expose().to_hex()));
    let v = json(&r.body);
    assert_eq!(
        v["offer"]["worker"]["sessionId"],
        h.worker.session_id.as_str()
    );
    assert_eq!(v["offer"]["worker"]["workerId"], "edge-1");
    let lease =
        h.cp.run(&RunId::new("run-1").unwrap())
            .unwrap()
            .lease
            .clone()
            .unwrap();
    assert_eq!(lease.session_id, h.worker.session_id);
    assert_eq!(lease.token_digest, token.digest());
    // A claim for a generation the Session does not have gets nothing.
    let r = h.pull(WorkerGeneration::new(2).unwrap(), 2);
    assert_eq!(json(&r.body)["reason"], "worker_unavailable");
}

#[test]
fn maps_an_internally_malformed_offer_projection_to_unavailable_not_a_client_error() {
    let mut h = ModelHarness::new();
    h.register(1);
    let revision = RevisionBuilder::argv("/bin/true", Vec::<String>::new())
        .build()
        .unwrap();
    h.cp.enqueue_run(h.at(), RunSpec::numbered(1, revision))
        .unwrap();
    h.cp.inject_service_fault(
        Some(Operation::Offers),
        ServiceFault::MalformedOfferProjection,
    );
    let r = h.pull(GEN1, 1);
    assert_eq!(
        (r.status, r.code()),
        (503, Some(ErrorCode::WorkerIngressUnavailable))
    );
    // The claim committed; the Worker's retry with the same claim recovers it.
    let offer = h.claim(GEN1, 1).unwrap();
    assert_eq!(offer.delivery_kind, DeliveryKind::LeaseRecovery);
}

#[test]
fn binds_activation_acks_to_the_authenticated_worker_and_never_echoes_capabilities() {
    let (mut h, offer) = setup_running();
    let token = lease_token(1);
    let digest = capability(1).digest().expose().to_hex();
    for request in [
        ActivationRequest::starting(&offer),
        ActivationRequest::running(&offer, running_ack(&offer, 1, true)),
        ActivationRequest::start_failure(&offer),
    ] {
        let r = h.activate(&request);
        assert_eq!(r.status, 200);
        assert_eq!(json(&r.body)["schema"], "qinglong/remote-run-activation@v1");
        assert!(!contains(&r.body, token.expose()));
        assert!(!contains(&r.body, &digest));
    }
    // The same fence from another authenticated Worker is fenced.
    let other = second_worker(&mut h);
    let body = ActivationRequest::starting(&offer).to_body().unwrap();
    let r = h.cp.handle(
        h.at(),
        &CpRequest::json(
            other.path(Operation::Starting),
            &other.authorization(),
            body.to_vec(),
        ),
    );
    assert_eq!(r.code(), Some(ErrorCode::WorkerActivationFenced));
}

#[test]
fn maps_stale_activation_authority_to_conflict() {
    let mut h = ModelHarness::new();
    h.register(1);
    let revision = RevisionBuilder::argv("/bin/true", Vec::<String>::new())
        .build()
        .unwrap();
    h.cp.enqueue_run(h.at(), RunSpec::numbered(1, revision))
        .unwrap();
    let offer = h.claim(GEN1, 1).unwrap();
    let mut stale = offer.clone();
    stale.lease.version = LeaseVersion::new(4).unwrap();
    let before = h.cp.state().clone();
    let r = h.activate(&ActivationRequest::starting(&stale));
    assert_eq!(
        (r.status, r.code()),
        (409, Some(ErrorCode::WorkerActivationFenced))
    );
    assert_eq!(r.body, br#"{"code":"worker_activation_fenced"}"#.to_vec());
    assert_eq!(h.cp.state(), &before);
}

#[test]
fn maps_activation_storage_failures_to_unavailable() {
    let mut h = ModelHarness::new();
    h.register(1);
    let revision = RevisionBuilder::argv("/bin/true", Vec::<String>::new())
        .build()
        .unwrap();
    h.cp.enqueue_run(h.at(), RunSpec::numbered(1, revision))
        .unwrap();
    let offer = h.claim(GEN1, 1).unwrap();
    let before = h.cp.state().clone();
    h.cp.inject_service_fault(Some(Operation::Starting), ServiceFault::StorageUnavailable);
    let r = h.activate(&ActivationRequest::starting(&offer));
    assert_eq!(
        (r.status, r.code()),
        (503, Some(ErrorCode::WorkerIngressUnavailable))
    );
    assert_eq!(h.cp.state(), &before);
    let r = h.activate_ok(&ActivationRequest::starting(&offer));
    assert_eq!(r.status, ActivationStatus::Applied);
}

#[test]
fn binds_one_secret_batch_to_path_identity_and_never_echoes_capabilities() {
    let (mut h, offer) = setup_with_secrets();
    let request = SecretsRequest::from_offer(&offer).unwrap().unwrap();
    let r = h.post(Operation::Secrets, &request.to_body().unwrap());
    assert_eq!(r.status, 200);
    let parsed = SecretsResponse::parse(&r.body, &request).unwrap();
    let values: Vec<&str> = parsed.values.iter().map(|v| v.value.expose()).collect();
    assert_eq!(values, ["value-z", "value-a"], "request order");
    assert!(!contains(&r.body, lease_token(1).expose()));
    // The same batch from another Session of the same Worker is fenced.
    let session_two = h.worker.with_session(session_id(2));
    let r = h.cp.handle(
        h.at(),
        &CpRequest::json(
            session_two.path(Operation::Secrets),
            &session_two.authorization(),
            request.to_body().unwrap().to_vec(),
        ),
    );
    assert_eq!(r.code(), Some(ErrorCode::WorkerSecretDeliveryFenced));
}

#[test]
fn maps_stale_secret_delivery_authority_to_conflict_before_any_response() {
    let (mut h, offer) = setup_with_secrets();
    let mut stale = offer.clone();
    stale.lease.version = LeaseVersion::new(3).unwrap();
    let request = SecretsRequest::from_offer(&stale).unwrap().unwrap();
    let r = h.post(Operation::Secrets, &request.to_body().unwrap());
    assert_eq!(
        (r.status, r.code()),
        (409, Some(ErrorCode::WorkerSecretDeliveryFenced))
    );
    assert!(!contains(&r.body, "value-"));
    let mut drifted = SecretsRequest::from_offer(&offer).unwrap().unwrap();
    drifted.execution_digest = ql_worker_tests::control_plane::harness::digest(b"other");
    let r = h.post(Operation::Secrets, &drifted.to_body().unwrap());
    assert_eq!(r.code(), Some(ErrorCode::WorkerSecretDeliveryFenced));
    assert!(!contains(&r.body, "value-"));
}

#[test]
fn rejects_a_secret_service_response_whose_authority_drifts() {
    let (mut h, offer) = setup_with_secrets();
    h.cp.inject_service_fault(Some(Operation::Secrets), ServiceFault::SecretAuthorityDrift);
    let request = SecretsRequest::from_offer(&offer).unwrap().unwrap();
    let r = h.post(Operation::Secrets, &request.to_body().unwrap());
    assert_eq!(
        (r.status, r.code()),
        (503, Some(ErrorCode::WorkerIngressUnavailable))
    );
    assert!(!contains(&r.body, "value-"));
}

#[test]
fn authenticates_and_audits_before_exposing_one_bounded_artifact_stream() {
    let (mut h, offer) = setup_running();
    let path = h.worker.path(Operation::Artifacts);
    let head = |authorization: Option<String>, content_type: &str, len: u64| CpHead {
        path: path.clone(),
        authorization,
        content_type: Some(content_type.to_owned()),
        content_length: len,
    };
    let artifact_type = "application/vnd.qinglong.worker-artifact";
    let cases = [
        (
            head(None, artifact_type, 64),
            ErrorCode::WorkerAuthenticationRequired,
        ),
        (
            head(Some(h.worker.authorization()), "application/json", 64),
            ErrorCode::UnsupportedContentType,
        ),
        (
            head(
                Some(h.worker.authorization()),
                artifact_type,
                64 * 1024 * 1024 + 4 * 1024 + 5,
            ),
            ErrorCode::RequestTooLarge,
        ),
        (
            head(Some(h.worker.authorization()), artifact_type, 5),
            ErrorCode::InvalidWorkerRequest,
        ),
    ];
    for (head, code) in cases {
        let mut body = Untouchable::default();
        let r = h.cp.handle_stream(h.at(), &head, &mut body);
        assert_eq!(r.code(), Some(code));
        assert_eq!(body.reads, 0, "{code:?}");
    }
    // An authenticated upload is audited as allowed, then streamed.
    let content = b"worker-log";
    let up = upload(&offer, content, Some(false));
    let r = h.post_artifact(artifact_body(&up, content));
    assert_eq!(r.status, 200);
    assert_eq!(
        json(&r.body)["schema"],
        "qinglong/remote-worker-artifact-upload@v1"
    );
    let audit = h.cp.audit().last().unwrap();
    assert_eq!(
        (audit.operation, audit.outcome),
        (Operation::Artifacts, AuditOutcome::Allowed)
    );
    assert_eq!(
        h.cp.last_request().unwrap().body_bytes_read,
        artifact_body(&up, content).len() as u64
    );
}

#[test]
fn binds_completion_json_to_path_identity_and_maps_stale_authority() {
    let (mut h, offer) = setup_running();
    let content = b"done";
    let up = upload(&offer, content, Some(false));
    assert_eq!(h.post_artifact(artifact_body(&up, content)).status, 200);
    let req = completion(&offer, &up, content, 1, 0, h.at(), h.at());
    let body = req.to_body().unwrap();
    assert!(!contains(&body, "workerId") && !contains(&body, "workerSessionId"));
    // Another Session's path: fenced.
    let session_two = h.worker.with_session(session_id(2));
    let r = h.cp.handle(
        h.at(),
        &CpRequest::json(
            session_two.path(Operation::Completion),
            &session_two.authorization(),
            body.to_vec(),
        ),
    );
    assert_eq!(r.code(), Some(ErrorCode::WorkerCompletionFenced));
    // Identity duplicated in the body: a shape error.
    let widened =
        String::from_utf8(body.to_vec())
            .unwrap()
            .replacen('{', "{\"workerId\":\"edge-1\",", 1);
    assert_eq!(
        h.post(Operation::Completion, widened.as_bytes()).code(),
        Some(ErrorCode::InvalidWorkerRequest)
    );
    let mut stale = req.clone();
    stale.fence.expected_lease_version = LeaseVersion::new(2).unwrap();
    assert_eq!(
        h.complete(&stale).code(),
        Some(ErrorCode::WorkerCompletionFenced)
    );
    let r = h.complete(&req);
    assert_eq!(json(&r.body)["status"], "applied");
}

#[test]
fn binds_lease_control_to_path_authority_and_returns_a_capability_free_response() {
    let (mut h, offer) = setup_running();
    h.cp.cancel_run(h.at(), &RunId::new("run-1").unwrap())
        .unwrap();
    let r = h.lease_control(&offer);
    assert_eq!(r.status, 200);
    assert_eq!(
        keys(&r.body),
        [
            "attemptId",
            "expiresAtMs",
            "leaseGeneration",
            "leaseVersion",
            "offerId",
            "projectId",
            "renewedAtMs",
            "runId",
            "schema",
            "status",
            "stop",
            "terminalStatus"
        ]
    );
    assert!(!contains(&r.body, lease_token(1).expose()));
    let parsed =
        LeaseControlResponse::parse(&r.body, &LeaseControlRequest::from_offer(&offer)).unwrap();
    assert!(
        matches!(parsed, LeaseControlResponse::StopRequested(l, _) if l.lease_version.get() == 1)
    );
    assert_eq!(json(&r.body)["terminalStatus"], serde_json::Value::Null);
    // The same fence on another Session's path: fenced.
    let session_two = h.worker.with_session(session_id(2));
    let body = LeaseControlRequest::from_offer(&offer).to_body().unwrap();
    let r = h.cp.handle(
        h.at(),
        &CpRequest::json(
            session_two.path(Operation::LeaseControl),
            &session_two.authorization(),
            body.to_vec(),
        ),
    );
    assert_eq!(r.code(), Some(ErrorCode::WorkerLeaseControlFenced));
}

#[test]
fn maps_fenced_and_unavailable_lease_control_without_leaking_authority() {
    let (mut h, offer) = setup_running();
    let mut stale = offer.clone();
    stale.lease.version = LeaseVersion::new(4).unwrap();
    let r: CpResponse = h.lease_control(&stale);
    assert_eq!(r.status, 409);
    assert_eq!(
        r.body,
        br#"{"code":"worker_lease_control_fenced"}"#.to_vec()
    );
    let before = h.cp.state().clone();
    h.cp.inject_service_fault(
        Some(Operation::LeaseControl),
        ServiceFault::StorageUnavailable,
    );
    let r = h.lease_control(&offer);
    assert_eq!(r.status, 503);
    assert_eq!(r.body, br#"{"code":"worker_ingress_unavailable"}"#.to_vec());
    assert_eq!(h.cp.state(), &before);
}

#[test]
fn routes_outside_the_template_are_not_found_before_authentication() {
    let mut h = ModelHarness::new();
    let good = h.worker.path(Operation::Heartbeat);
    let audits = h.cp.audit().len();
    for path in [
        format!("{good}?x=1"),
        good.replace("heartbeat", "unknown"),
        good.replace(h.worker.session_id.as_str(), "not-a-uuid"),
        "/api/v3/other".to_owned(),
    ] {
        let r = h.cp.handle(
            h.at(),
            &CpRequest::json(path.clone(), &h.worker.authorization(), b"{}".to_vec()),
        );
        assert_eq!(
            (r.status, r.code()),
            (404, Some(ErrorCode::WorkerRouteNotFound)),
            "{path}"
        );
    }
    assert_eq!(
        h.cp.audit().len(),
        audits,
        "no audit before a route matched"
    );
}
