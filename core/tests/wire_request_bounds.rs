//! The invariants the core states when it `expect`s a request body (`processor.rs`
//! `activation_call`, `supervision.rs` lease control): with every id, the lease token and the
//! executor handle at the longest and most escaped their validating types allow, the bodies stay
//! below their caps. A panic there would need a type to admit a longer value.

use ql_worker_core::ids::{
    AttemptId, CallbackSequence, CapabilityDigest, ExecutorHandle, LeaseGeneration, LeaseToken,
    LeaseVersion, LogArtifactId, MAX_INT32, OfferId, ProjectId, RunId, Sha256Digest,
    WorkerGeneration,
};
use ql_worker_core::offer::Offer;
use ql_worker_core::wire::activation::{self, ActivationRequest, RunningAck};
use ql_worker_core::wire::lease_control::{self, LeaseControlRequest};
use ql_worker_sim::testkit;

/// Sample offer 1 with every fence value at its longest encoding.
fn longest_offer() -> Offer {
    let mut offer = testkit::offer(1);
    offer.offer_id = OfferId::new("o".repeat(128)).unwrap();
    // 128 JavaScript characters of three UTF-8 bytes each: the longest project id in bytes.
    offer.candidate.project_id = ProjectId::new("\u{20ac}".repeat(128)).unwrap();
    offer.candidate.run_id = RunId::new("r".repeat(36)).unwrap();
    offer.candidate.attempt_id = AttemptId::new("a".repeat(36)).unwrap();
    offer.lease_token = LeaseToken::new("t".repeat(128)).unwrap();
    offer.worker.generation = WorkerGeneration::new(MAX_INT32).unwrap();
    offer.lease.lease_generation = LeaseGeneration::new(MAX_INT32).unwrap();
    offer.lease.version = LeaseVersion::new(MAX_INT32).unwrap();
    offer
}

#[test]
fn activation_bodies_of_the_longest_values_stay_below_four_kib() {
    let offer = longest_offer();
    let ack = RunningAck {
        // 512 bytes that JSON escapes to two each.
        executor_handle: ExecutorHandle::new("\"".repeat(512)).unwrap(),
        log_artifact_id: Some(LogArtifactId::new(format!("wlog-{}", "f".repeat(30))).unwrap()),
        callback_sequence: CallbackSequence::new(MAX_INT32).unwrap(),
        callback_token_digest: CapabilityDigest::new(Sha256Digest::of(b"capability")),
    };
    for request in [
        ActivationRequest::starting(&offer),
        ActivationRequest::running(&offer, ack),
        ActivationRequest::start_failure(&offer),
    ] {
        let body = request.to_body().unwrap();
        assert!(
            body.len() <= 2 * 1024,
            "{:?}: {} bytes",
            request.operation(),
            body.len()
        );
        assert!(body.len() < activation::MAX_REQUEST_BYTES);
    }
}

#[test]
fn lease_control_bodies_of_the_longest_values_stay_below_eight_kib() {
    let body = LeaseControlRequest::from_offer(&longest_offer())
        .to_body()
        .unwrap();
    assert!(body.len() <= 1024, "{} bytes", body.len());
    assert!(body.len() < lease_control::MAX_REQUEST_BYTES);
}
