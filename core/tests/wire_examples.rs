//! Every reference §2 example round-trips: our requests built from the same values, and our
//! re-serialization of parsed responses, are byte-identical to the Node-written examples.

mod wire_support;

use ql_worker_core::ids::{AttemptId, LeaseToken, OfferId, ProjectId, RunId, WorkerGeneration};
use ql_worker_core::revision::{Architecture, Label};
use ql_worker_core::wire::activation::{
    ActivationRequest, ActivationResponse, ActivationStatus, SnapshotShape,
};
use ql_worker_core::wire::artifact::{ArtifactReceipt, UploadStatus};
use ql_worker_core::wire::completion::{CompletionResponse, CompletionStatus};
use ql_worker_core::wire::error::{ErrorCode, parse_error_body};
use ql_worker_core::wire::lease_control::{
    LeaseControlRequest, LeaseControlResponse, StopReason, TerminalStatus,
};
use ql_worker_core::wire::offer::{OfferRequest, OfferResponse, admit_offer};
use ql_worker_core::wire::secrets::SecretsResponse;
use ql_worker_core::wire::session::{
    Capabilities, HEARTBEAT_SCHEMA, REGISTER_SCHEMA, RegisterRequest, SessionResponse,
    TRANSITION_SCHEMA,
};
use ql_worker_core::wire::{Fence, derive_log_artifact_id};
use ql_worker_sim::fuzzing::wire as fx;
use ql_worker_tests::server_wire::{ToJson as _, ToJsonFor as _, error_body};
use wire_support::example;

fn text(bytes: &[u8]) -> &str {
    std::str::from_utf8(bytes).unwrap()
}

#[test]
fn wire_example_requests_are_byte_identical() {
    let offer = OfferRequest {
        worker_generation: WorkerGeneration::new(2).unwrap(),
        offer_id: OfferId::new(fx::OFFER_ID).unwrap(),
        lease_token: LeaseToken::new(fx::OFFER_LEASE_TOKEN).unwrap(),
    };
    assert_eq!(
        text(&offer.to_body().unwrap()),
        text(&example("offer_request"))
    );
    let starting = fx::starting_request();
    assert_eq!(
        text(&starting.to_body().unwrap()),
        text(&example("starting_request"))
    );
    let failure = ActivationRequest {
        fence: fx::fence(),
        op: ql_worker_core::wire::activation::ActivationOp::StartFailure,
    };
    assert_eq!(
        text(&failure.to_body().unwrap()),
        text(&example("start_failure_request"))
    );
    assert_eq!(
        text(&fx::running_request().to_body().unwrap()),
        text(&example("running_request"))
    );
    let mut with_log = fx::running_request();
    if let ql_worker_core::wire::activation::ActivationOp::Running(ack) = &mut with_log.op {
        ack.log_artifact_id = Some(
            ql_worker_core::ids::LogArtifactId::new("wlog-0123456789abcdef0123456789abcd").unwrap(),
        );
    }
    assert_eq!(
        text(&with_log.to_body().unwrap()),
        text(&example("running_request_with_log"))
    );
    assert_eq!(
        text(&fx::secrets_request().to_body().unwrap()),
        text(&example("secrets_request"))
    );
    assert_eq!(
        text(&fx::artifact_upload().header_json().unwrap()),
        text(&example("artifact_header"))
    );
    assert_eq!(
        text(&fx::completion_request().to_body().unwrap()),
        text(&example("completion_request"))
    );
    let control = LeaseControlRequest { fence: fx::fence() };
    assert_eq!(
        text(&control.to_body().unwrap()),
        text(&example("lease_control_request"))
    );
    assert_eq!(
        text(&fx::heartbeat_request().to_body().unwrap()),
        text(&example("heartbeat_request"))
    );
    assert_eq!(
        text(&fx::transition_request().to_body().unwrap()),
        text(&example("transition_request"))
    );
}

#[test]
fn wire_register_carries_canonical_capabilities_json_and_hash() {
    let mut caps = Capabilities::for_architecture(Architecture::Arm64);
    caps.labels = Some(
        [("zone", "eu"), ("10", "x"), ("Zone", "y"), ("9", "z")]
            .into_iter()
            .map(|(k, v)| Label {
                key: k.into(),
                value: v.into(),
            })
            .collect(),
    );
    let request = RegisterRequest::new(&caps, 2, 2, 30_000).unwrap();
    assert_eq!(
        text(&request.to_body().unwrap()),
        text(&example("register_request"))
    );
    let mut wrong = caps.clone();
    wrong.support_tier = ql_worker_core::revision::SupportTier::Candidate;
    assert!(
        RegisterRequest::new(&wrong, 2, 2, 30_000).is_err(),
        "tier must match architecture"
    );
    assert!(
        RegisterRequest::new(&caps, 2, 3, 30_000).is_err(),
        "slots above max"
    );
    assert!(
        RegisterRequest::new(&caps, 2, 2, 4_999).is_err(),
        "lease below 5 s"
    );
}

#[test]
fn wire_log_artifact_id_matches_node() {
    let id = derive_log_artifact_id(
        &ProjectId::new("project-1").unwrap(),
        &RunId::new("run-1").unwrap(),
        &AttemptId::new("attempt-1").unwrap(),
        &OfferId::new("offer-1").unwrap(),
    );
    assert_eq!(id.as_str(), text(&example("log_artifact_id")));
    assert_eq!(id.as_str().len(), 35);
}

#[test]
fn wire_offer_responses_round_trip() {
    for name in ["offer_idle", "offer_offered"] {
        let bytes = example(name);
        let parsed = OfferResponse::parse(&bytes).unwrap();
        assert_eq!(text(&parsed.to_json()), text(&bytes), "{name}");
    }
}

#[test]
fn wire_activation_responses_round_trip_with_their_shapes() {
    let cases = [
        (
            "activation_starting",
            fx::starting_request(),
            ActivationStatus::Applied,
            SnapshotShape::Starting,
        ),
        (
            "activation_running",
            fx::running_request(),
            ActivationStatus::AlreadyRunning,
            SnapshotShape::Running,
        ),
        (
            "activation_terminal",
            fx::starting_request(),
            ActivationStatus::Applied,
            SnapshotShape::Terminal,
        ),
    ];
    for (name, request, status, shape) in cases {
        let bytes = example(name);
        let parsed = ActivationResponse::parse(&bytes, &request).unwrap();
        assert_eq!((parsed.status, parsed.shape), (status, shape), "{name}");
        assert_eq!(text(&parsed.to_json()), text(&bytes), "{name}");
    }
}

#[test]
fn wire_secrets_response_round_trips_and_binds_values_in_order() {
    let request = fx::secrets_request();
    let bytes = example("secrets_response");
    let parsed = SecretsResponse::parse(&bytes, &request).unwrap();
    assert_eq!(parsed.values.len(), 1);
    assert_eq!(parsed.values[0].value.expose(), "resolved-value");
    assert_eq!(parsed.values[0].secret_ref, request.secret_refs[0]);
    assert_eq!(text(&parsed.to_json(&request)), text(&bytes));
    let debug = format!("{parsed:?}");
    assert!(
        !debug.contains("resolved-value") && debug.contains("redacted"),
        "{debug}"
    );
}

#[test]
fn wire_artifact_completion_lease_control_round_trip() {
    let upload = fx::artifact_upload();
    let sent = ql_worker_core::ids::Sha256Digest::from_hex(fx::SENT_SHA256).unwrap();
    let bytes = example("artifact_response");
    let receipt = ArtifactReceipt::parse(&bytes, &upload, &sent).unwrap();
    assert_eq!(receipt.status, UploadStatus::Stored);
    assert_eq!(text(&receipt.to_json(&upload)), text(&bytes));

    let request = fx::completion_request();
    let bytes = example("completion_response");
    let done = CompletionResponse::parse(&bytes, &request).unwrap();
    assert_eq!(done.status, CompletionStatus::Applied);
    assert_eq!(text(&done.to_json()), text(&bytes));

    let control = LeaseControlRequest { fence: fx::fence() };
    for name in [
        "lease_control_stop",
        "lease_control_renewed",
        "lease_control_terminal",
    ] {
        let bytes = example(name);
        let parsed = LeaseControlResponse::parse(&bytes, &control).unwrap();
        assert_eq!(text(&parsed.to_json(&control)), text(&bytes), "{name}");
    }
    match LeaseControlResponse::parse(&example("lease_control_stop"), &control).unwrap() {
        LeaseControlResponse::StopRequested(lease, stop) => {
            assert_eq!(lease.lease_version.get(), 5);
            assert_eq!(stop.reason, StopReason::Timeout);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        LeaseControlResponse::parse(&example("lease_control_terminal"), &control).unwrap(),
        LeaseControlResponse::Terminal(TerminalStatus::Cancelled)
    );
}

#[test]
fn wire_session_responses_round_trip() {
    let worker = ql_worker_core::ids::WorkerId::new(fx::WORKER_ID).unwrap();
    let session = ql_worker_core::ids::SessionId::new(fx::SESSION_ID).unwrap();
    let bytes = example("heartbeat_response");
    let hb = SessionResponse::parse_heartbeat(&bytes, &worker, &session, &fx::heartbeat_request())
        .unwrap();
    assert_eq!(text(&hb.to_json(HEARTBEAT_SCHEMA)), text(&bytes));
    let bytes = example("transition_response");
    let tr =
        SessionResponse::parse_transition(&bytes, &worker, &session, &fx::transition_request())
            .unwrap();
    assert_eq!(text(&tr.to_json(TRANSITION_SCHEMA)), text(&bytes));
    let bytes = example("register_response");
    let rg = SessionResponse::parse_register(&bytes, &worker, &session).unwrap();
    assert_eq!(rg.replaced_session, Some(false));
    assert_eq!(text(&rg.to_json(REGISTER_SCHEMA)), text(&bytes));
}

#[test]
fn wire_error_body_round_trips_for_every_code() {
    assert_eq!(
        parse_error_body(&example("error_body")).unwrap(),
        ErrorCode::WorkerSessionFenced
    );
    for code in ErrorCode::ALL {
        assert_eq!(parse_error_body(&error_body(*code)).unwrap(), *code);
    }
    assert_eq!(ErrorCode::ALL.len(), 32);
}

#[test]
fn wire_offer_admission_reconstructs_the_full_lease_from_the_claim() {
    let OfferResponse::Offered { offer, .. } =
        OfferResponse::parse(&example("offer_offered")).unwrap()
    else {
        panic!("offered");
    };
    let (offer_id, worker, token) = fx::claim();
    let admitted = admit_offer(&offer, &offer_id, &worker, &token).unwrap();
    assert_eq!(admitted.lease.lease_token_digest, token.digest());
    assert_eq!(admitted.lease.run_id, admitted.candidate.run_id);
    assert_eq!(admitted.lease.worker_session_id, worker.session_id);
    assert_eq!(
        admitted.lease.status,
        ql_worker_core::offer::LeaseStatus::Leased
    );
    admitted.validate().unwrap();
    // Requests built from the admitted offer carry its fence.
    let fence = Fence::from_offer(&admitted);
    assert_eq!(fence.expected_lease_version.get(), 0);
    assert_eq!(fence.lease_token, token);
    let starting = ActivationRequest::starting(&admitted).to_body().unwrap();
    assert!(text(&starting).contains(fx::OFFER_LEASE_TOKEN));
    let secrets = ql_worker_core::wire::secrets::SecretsRequest::from_offer(&admitted)
        .unwrap()
        .unwrap();
    assert_eq!(secrets.secret_refs.len(), 1);
    let postcard = postcard::to_allocvec(&admitted).unwrap();
    let back: ql_worker_core::offer::Offer = postcard::from_bytes(&postcard).unwrap();
    assert_eq!(back, admitted);
}
