//! Entry points shared by the cargo-fuzz targets (`fuzz/fuzz_targets/*.rs`) and the stable
//! corpus replay test (`core/tests/wire_fuzz_corpus.rs`). Each takes arbitrary bytes, must never
//! panic, and returns whether the input was accepted. Requests are fixed fixtures that match the
//! reference examples, so the seed corpora (made from those examples) exercise the accept paths.
#![allow(missing_docs)]

use ql_worker_core::ids::{
    AttemptId, CallbackSequence, CapabilityDigest, ExecutorHandle, LeaseGeneration, LeaseToken,
    LeaseVersion, LogArtifactId, OfferId, ProjectId, RunId, SessionId, Sha256Digest, TaskId,
    TaskRevision, WorkerGeneration, WorkerId,
};
use ql_worker_core::offer::OfferWorker;
use ql_worker_core::revision::SecretRef;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::Fence;
use ql_worker_core::wire::activation::{ActivationRequest, ActivationResponse, RunningAck};
use ql_worker_core::wire::artifact::{ArtifactReceipt, ArtifactUpload};
use ql_worker_core::wire::completion::{
    CompletionArtifact, CompletionRequest, CompletionResponse, CompletionResult,
};
use ql_worker_core::wire::error::parse_error_body;
use ql_worker_core::wire::lease_control::{LeaseControlRequest, LeaseControlResponse};
use ql_worker_core::wire::offer::{OfferResponse, admit_offer};
use ql_worker_core::wire::secrets::{SecretsRequest, SecretsResponse};
use ql_worker_core::wire::session::{
    HeartbeatRequest, SessionResponse, SessionStatus, TransitionRequest,
};

/// Worker of the fixtures (reference examples).
pub const WORKER_ID: &str = "edge-1";
/// Session of the fixtures.
pub const SESSION_ID: &str = "018f0000-0000-7000-8000-000000000001";
/// Offer id of the offer fixtures (reference §2.2).
pub const OFFER_ID: &str = "3b1f6c2e-6a52-4f0e-9a51-2f7f0e2d9c11";
/// Lease token of the offer fixtures.
pub const OFFER_LEASE_TOKEN: &str = "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc";
/// Lease token of the post-offer fixtures (reference §2.3–2.9).
pub const LEASE_TOKEN: &str = "worker_generated_lease_capability_0000000000000001";
/// Log id of the artifact/completion fixtures.
pub const LOG_ID: &str = "wlog-aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
/// SHA-256 of the bytes the artifact fixture "sent".
pub const SENT_SHA256: &str = "6e3f0dc9a5ef0b3b7d1f3d4c7a1c2c8e2f06d10b0b8e0f1e2d3c4b5a69788796";

fn ok<T>(value: Option<T>) -> T {
    // INVARIANT: fixture constants satisfy their rules (covered by the corpus test).
    value.unwrap_or_else(|| unreachable!("fuzz fixture constant is valid"))
}

/// The claim the offer fixtures belong to.
#[must_use]
pub fn claim() -> (OfferId, OfferWorker, LeaseToken) {
    (
        ok(OfferId::new(OFFER_ID).ok()),
        OfferWorker {
            worker_id: ok(WorkerId::new(WORKER_ID).ok()),
            session_id: ok(SessionId::new(SESSION_ID).ok()),
            generation: ok(WorkerGeneration::new(2).ok()),
        },
        ok(LeaseToken::new(OFFER_LEASE_TOKEN).ok()),
    )
}

/// The execution fence of the post-offer fixtures.
#[must_use]
pub fn fence() -> Fence {
    Fence {
        worker_generation: ok(WorkerGeneration::new(2).ok()),
        project_id: ok(ProjectId::new("project-1").ok()),
        run_id: ok(RunId::new("run-1").ok()),
        attempt_id: ok(AttemptId::new("attempt-1").ok()),
        offer_id: ok(OfferId::new("offer-1").ok()),
        lease_generation: ok(LeaseGeneration::new(3).ok()),
        lease_token: ok(LeaseToken::new(LEASE_TOKEN).ok()),
        expected_lease_version: ok(LeaseVersion::new(4).ok()),
    }
}

/// The starting request of the fixtures.
#[must_use]
pub fn starting_request() -> ActivationRequest {
    ActivationRequest {
        fence: fence(),
        op: ql_worker_core::wire::activation::ActivationOp::Starting,
    }
}

/// The running request of the fixtures.
#[must_use]
pub fn running_request() -> ActivationRequest {
    ActivationRequest {
        fence: fence(),
        op: ql_worker_core::wire::activation::ActivationOp::Running(RunningAck {
            executor_handle: ok(ExecutorHandle::new("ql3lp1.eyJ2IjoxfQ").ok()),
            log_artifact_id: None,
            callback_sequence: ok(CallbackSequence::new(1).ok()),
            callback_token_digest: CapabilityDigest::new(Sha256Digest::of(&[7u8; 32])),
        }),
    }
}

/// A secret reference of `project-1` named `name`.
#[must_use]
pub fn secret_ref(name: &str) -> SecretRef {
    let text = ok(SecretRef::create("project-1", name, None).ok());
    ok(SecretRef::new(&text).ok())
}

/// The secrets request of the fixtures (one reference, `API_TOKEN`).
#[must_use]
pub fn secrets_request() -> SecretsRequest {
    SecretsRequest {
        fence: fence(),
        task_id: ok(TaskId::new("task-1").ok()),
        task_revision: ok(TaskRevision::new(
            "qltd:v1:1:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
        )
        .ok()),
        execution_digest: ok(Sha256Digest::from_hex(&"b".repeat(64)).ok()),
        secret_refs: std::vec![secret_ref("API_TOKEN")],
        environment_bundle_refs: Vec::new(),
    }
}

/// The artifact upload of the fixtures (17 bytes, not truncated).
#[must_use]
pub fn artifact_upload() -> ArtifactUpload {
    ArtifactUpload {
        fence: fence(),
        log_artifact_id: ok(LogArtifactId::new(LOG_ID).ok()),
        byte_length: 17,
        truncated: Some(false),
    }
}

/// The completion request of the fixtures.
#[must_use]
pub fn completion_request() -> CompletionRequest {
    CompletionRequest {
        fence: fence(),
        callback_sequence: ok(CallbackSequence::new(1).ok()),
        callback_token_digest: CapabilityDigest::new(Sha256Digest::of(&[7u8; 32])),
        result: CompletionResult::from_exit(
            ok(UnixMillis::new(100).ok()),
            ok(UnixMillis::new(200).ok()),
            0,
        ),
        artifact: CompletionArtifact {
            log_artifact_id: ok(LogArtifactId::new(LOG_ID).ok()),
            byte_length: 17,
            sha256: ok(Sha256Digest::from_hex(SENT_SHA256).ok()),
            truncated: Some(false),
        },
    }
}

/// The heartbeat request of the fixtures (generation 2, version 3).
#[must_use]
pub fn heartbeat_request() -> HeartbeatRequest {
    HeartbeatRequest {
        generation: ok(WorkerGeneration::new(2).ok()),
        expected_version: 3,
        available_slots: 1,
        lease_duration_ms: 30_000,
    }
}

/// The transition request of the fixtures (to draining).
#[must_use]
pub fn transition_request() -> TransitionRequest {
    TransitionRequest {
        generation: ok(WorkerGeneration::new(2).ok()),
        expected_version: 3,
        status: SessionStatus::Draining,
    }
}

/// `wire_offer_response`.
#[must_use]
pub fn offer_response(data: &[u8]) -> bool {
    OfferResponse::parse(data).is_ok()
}

/// `wire_offer_admission`: parse, then admit for the fixture claim; an admitted offer must
/// validate and re-serialize to a response that parses to the same offer.
#[must_use]
pub fn offer_admission(data: &[u8]) -> bool {
    let Ok(OfferResponse::Offered { offer, .. }) = OfferResponse::parse(data) else {
        return false;
    };
    let (offer_id, worker, token) = claim();
    match admit_offer(&offer, &offer_id, &worker, &token) {
        Ok(admitted) => {
            assert!(admitted.validate().is_ok(), "admitted offer must validate");
            assert_eq!(admitted.lease_token, token);
            true
        }
        Err(_) => false,
    }
}

/// `wire_activation_response` (bound to the starting and the running request).
#[must_use]
pub fn activation_response(data: &[u8]) -> bool {
    let a = ActivationResponse::parse(data, &starting_request()).is_ok();
    let b = ActivationResponse::parse(data, &running_request()).is_ok();
    a || b
}

/// `wire_secrets_response`.
#[must_use]
pub fn secrets_response(data: &[u8]) -> bool {
    SecretsResponse::parse(data, &secrets_request()).is_ok()
}

/// `wire_artifact_response`: the upload receipt, and the frame preamble parser.
#[must_use]
pub fn artifact_response(data: &[u8]) -> bool {
    let sent = ok(Sha256Digest::from_hex(SENT_SHA256).ok());
    let receipt = ArtifactReceipt::parse(data, &artifact_upload(), &sent).is_ok();
    let frame = ql_worker_tests::server_wire::parse_artifact_preamble(data, None).is_ok();
    receipt || frame
}

/// `wire_completion_response`.
#[must_use]
pub fn completion_response(data: &[u8]) -> bool {
    CompletionResponse::parse(data, &completion_request()).is_ok()
}

/// `wire_lease_control_response`.
#[must_use]
pub fn lease_control_response(data: &[u8]) -> bool {
    let request = LeaseControlRequest { fence: fence() };
    LeaseControlResponse::parse(data, &request).is_ok()
}

/// `wire_session_responses`: register, heartbeat, transition, and the error body.
#[must_use]
pub fn session_responses(data: &[u8]) -> bool {
    let worker = ok(WorkerId::new(WORKER_ID).ok());
    let session = ok(SessionId::new(SESSION_ID).ok());
    let r = SessionResponse::parse_register(data, &worker, &session).is_ok();
    let h = SessionResponse::parse_heartbeat(data, &worker, &session, &heartbeat_request()).is_ok();
    let t =
        SessionResponse::parse_transition(data, &worker, &session, &transition_request()).is_ok();
    let e = parse_error_body(data).is_ok();
    r || h || t || e
}
