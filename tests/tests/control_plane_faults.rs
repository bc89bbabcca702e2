//! Transport faults of the reference control plane against the Worker's real HTTPS client:
//! oversize, slow and garbage answers are typed client errors and change nothing in the model;
//! commit-then-drop leaves the command applied and the Worker's retry gets the replay answer.

mod control_plane_common;

use std::time::{Duration, Instant};

use control_plane_common::{Env, GENEROUS, caps, env, env_with_timeout};
use ql_worker::https::{Blame, TransportError};
use ql_worker_core::ids::{RunId, Sha256Digest};
use ql_worker_core::offer::{DeliveryKind, Offer};
use ql_worker_core::wire::WireError;
use ql_worker_core::wire::activation::{ActivationRequest, ActivationResponse, ActivationStatus};
use ql_worker_core::wire::artifact::{ArtifactReceipt, UploadStatus};
use ql_worker_core::wire::completion::{CompletionResponse, CompletionStatus};
use ql_worker_core::wire::lease_control::LeaseControlRequest;
use ql_worker_core::wire::offer::OfferResponse;
use ql_worker_core::wire::route::Operation;
use ql_worker_tests::control_plane::harness::{completion, running_ack, upload};
use ql_worker_tests::control_plane::{Fault, ReferenceControlPlane};

fn run_1() -> RunId {
    RunId::new("run-1").unwrap()
}

fn claimed(e: &Env) -> Offer {
    e.register();
    e.enqueue(1);
    e.claim(1)
}

fn running(e: &Env) -> Offer {
    let offer = claimed(e);
    e.activate(&ActivationRequest::starting(&offer));
    e.activate(&ActivationRequest::running(
        &offer,
        running_ack(&offer, 1, true),
    ));
    offer
}

fn starting_body(offer: &Offer) -> Vec<u8> {
    ActivationRequest::starting(offer)
        .to_body()
        .unwrap()
        .to_vec()
}

#[test]
fn oversize_responses_are_typed_errors_and_change_nothing() {
    let e = env();
    e.register();
    e.enqueue(1);
    let before = e.cp.state();
    e.cp.inject(Fault::Oversize(128 * 1024 + 1));
    let err = e.post(Operation::Offers, &Env::pull_body(1)).unwrap_err();
    assert!(matches!(err, TransportError::ResponseTooLarge { cap } if cap == 128 * 1024));
    assert_eq!(e.cp.state(), before);

    let offer = e.claim(1);
    assert_eq!(
        offer.delivery_kind,
        DeliveryKind::NewClaim,
        "the first claim is the real one"
    );
    let before = e.cp.state();
    e.cp.inject(Fault::Oversize(16 * 1024 + 1));
    let err = e
        .post(Operation::Starting, &starting_body(&offer))
        .unwrap_err();
    assert!(
        matches!(err, TransportError::ResponseTooLarge { .. }),
        "{err:?}"
    );
    assert_eq!(err.blame(), Blame::Remote);
    assert_eq!(e.cp.state(), before);
    let r = e.activate(&ActivationRequest::starting(&offer));
    assert_eq!(r.status, ActivationStatus::Applied);
}

#[test]
fn slow_responses_time_out_as_typed_errors_and_change_nothing() {
    let e = env_with_timeout(1_000);
    let offer = claimed(&e);
    let before = e.cp.state();
    e.cp.inject(Fault::Slow(Duration::from_secs(30)));
    let started = Instant::now();
    let err = e
        .post(Operation::Starting, &starting_body(&offer))
        .unwrap_err();
    assert!(matches!(err, TransportError::Timeout { .. }), "{err:?}");
    assert_eq!(err.blame(), Blame::Connection);
    assert!(started.elapsed() < GENEROUS);
    assert_eq!(e.cp.state(), before, "the model has not seen the request");
    // The retry goes through on a fresh connection and is the first application.
    let r = e.activate(&ActivationRequest::starting(&offer));
    assert_eq!(r.status, ActivationStatus::Applied);
    // Dropping the server abandons the held request: it is never applied.
}

#[test]
fn garbage_responses_are_typed_errors_and_change_nothing() {
    let e = env();
    e.register();
    e.enqueue(1);
    let before = e.cp.state();
    e.cp.inject(Fault::Garbage);
    let err = e.post(Operation::Offers, &Env::pull_body(1)).unwrap_err();
    assert_eq!(err.blame(), Blame::Remote, "{err:?}");
    assert!(
        matches!(err, TransportError::MalformedResponse { .. }),
        "{err:?}"
    );
    assert_eq!(e.cp.state(), before);
    assert_eq!(e.claim(1).delivery_kind, DeliveryKind::NewClaim);
}

#[test]
fn cleared_faults_are_never_taken() {
    let e = env();
    e.register();
    e.enqueue(1);
    for _ in 0..3 {
        e.cp.inject_for_operation(Operation::Offers, Fault::CommitThenDrop);
    }
    let err = e.post(Operation::Offers, &Env::pull_body(1)).unwrap_err();
    assert_eq!(
        err.blame(),
        Blame::Connection,
        "the first fault was taken: {err:?}"
    );
    e.cp.clear_faults();
    // The two faults left would have dropped both answers.
    for _ in 0..2 {
        assert_eq!(e.claim(1).delivery_kind, DeliveryKind::LeaseRecovery);
    }
}

#[test]
fn commit_then_drop_fails_the_call_and_the_retry_gets_the_replay_answer() {
    let e = env();
    e.register();
    e.enqueue(1);
    // offers: the claim commits; the retry of the same claim is a lease recovery.
    e.cp.inject(Fault::CommitThenDrop);
    let err = e.post(Operation::Offers, &Env::pull_body(1)).unwrap_err();
    assert_eq!(err.blame(), Blame::Connection, "{err:?}");
    assert!(
        e.cp.run(&run_1()).unwrap().lease.is_some(),
        "the claim committed"
    );
    let offer = e.claim(1);
    assert_eq!(offer.delivery_kind, DeliveryKind::LeaseRecovery);

    // starting ⇒ already_starting.
    e.cp.inject(Fault::CommitThenDrop);
    assert!(e.post(Operation::Starting, &starting_body(&offer)).is_err());
    let r = e.activate(&ActivationRequest::starting(&offer));
    assert_eq!(r.status, ActivationStatus::AlreadyStarting);

    // running ⇒ already_running.
    let running = ActivationRequest::running(&offer, running_ack(&offer, 1, true));
    e.cp.inject(Fault::CommitThenDrop);
    assert!(
        e.post(Operation::Running, &running.to_body().unwrap())
            .is_err()
    );
    assert_eq!(
        e.activate(&running).status,
        ActivationStatus::AlreadyRunning
    );

    // artifacts ⇒ already_stored.
    let content = b"the log";
    let up = upload(&offer, content, Some(false));
    e.cp.inject(Fault::CommitThenDrop);
    assert!(
        e.upload(&up, &mut &content[..], content.len() as u64)
            .is_err()
    );
    assert_eq!(e.cp.state().artifacts.len(), 1, "the artifact is stored");
    assert_eq!(
        e.upload_ok(&up, content).status,
        UploadStatus::AlreadyStored
    );

    // completion ⇒ already_completed, and the replayed upload is already_stored.
    let now = ReferenceControlPlane::now();
    let req = completion(&offer, &up, content, 1, 0, now, now);
    e.cp.inject(Fault::CommitThenDrop);
    assert!(
        e.post(Operation::Completion, &req.to_body().unwrap())
            .is_err()
    );
    assert!(e.cp.run(&run_1()).unwrap().completion.is_some());
    assert_eq!(
        e.upload_ok(&up, content).status,
        UploadStatus::AlreadyStored
    );
    let body = e
        .post(Operation::Completion, &req.to_body().unwrap())
        .unwrap();
    assert_eq!(
        CompletionResponse::parse(&body, &req).unwrap().status,
        CompletionStatus::AlreadyCompleted
    );
}

#[test]
fn commit_then_drop_of_start_failure_replays_as_already_terminal() {
    let e = env();
    let offer = claimed(&e);
    e.activate(&ActivationRequest::starting(&offer));
    let failure = ActivationRequest::start_failure(&offer);
    e.cp.inject(Fault::CommitThenDrop);
    assert!(
        e.post(Operation::StartFailure, &failure.to_body().unwrap())
            .is_err()
    );
    let r = e.activate(&failure);
    assert_eq!(r.status, ActivationStatus::AlreadyTerminal);
    assert_eq!(r.snapshot.lease_version.get(), 1);
}

#[test]
fn commit_then_drop_of_a_renewal_leaves_the_old_version_fenced() {
    // Lease control is not idempotent: the lost answer carried the only copy of the new version,
    // so the Worker's retry at the old version is fenced (it must recover from the conflict).
    let e = env();
    let offer = running(&e);
    let body = LeaseControlRequest::from_offer(&offer).to_body().unwrap();
    e.cp.inject(Fault::CommitThenDrop);
    assert!(e.post(Operation::LeaseControl, &body).is_err());
    assert_eq!(
        e.cp.run(&run_1()).unwrap().lease_version().unwrap().get(),
        1
    );
    let err = e.post(Operation::LeaseControl, &body).unwrap_err();
    assert!(
        matches!(&err, TransportError::Status { status: 409, code: Some(c) } if c == "worker_lease_control_fenced"),
        "{err:?}"
    );
}

#[test]
fn unavailable_503_changes_nothing_and_the_retry_applies() {
    let e = env();
    let offer = claimed(&e);
    let before = e.cp.state();
    e.cp.inject(Fault::Unavailable);
    let err = e
        .post(Operation::Starting, &starting_body(&offer))
        .unwrap_err();
    assert!(
        matches!(&err, TransportError::Status { status: 503, code: Some(c) } if c == "worker_ingress_unavailable"),
        "{err:?}"
    );
    assert_eq!(e.cp.state(), before);
    assert_eq!(
        e.activate(&ActivationRequest::starting(&offer)).status,
        ActivationStatus::Applied
    );
}

#[test]
fn redirects_are_refused_not_followed_and_change_nothing() {
    let e = env();
    let offer = claimed(&e);
    let before = e.cp.state();
    let requests = e.cp.http_records().len();
    e.cp.inject(Fault::Redirect);
    let err = e
        .post(Operation::Starting, &starting_body(&offer))
        .unwrap_err();
    assert!(
        matches!(err, TransportError::Status { status: 302, .. }),
        "{err:?}"
    );
    assert_eq!(e.cp.state(), before);
    let records = e.cp.wait_http_records(requests + 1, GENEROUS);
    assert_eq!(records.len(), requests + 1, "the redirect was not followed");
    assert!(records.iter().all(|r| r.path != "/redirected"));
}

#[test]
fn a_wrong_status_is_refused_although_the_command_was_applied() {
    let e = env();
    let offer = claimed(&e);
    e.cp.inject(Fault::WrongStatus(201));
    let err = e
        .post(Operation::Starting, &starting_body(&offer))
        .unwrap_err();
    assert!(
        matches!(err, TransportError::Status { status: 201, .. }),
        "{err:?}"
    );
    let r = e.activate(&ActivationRequest::starting(&offer));
    assert_eq!(r.status, ActivationStatus::AlreadyStarting);
}

#[test]
fn widened_json_is_refused_by_the_strict_parsers_although_the_command_was_applied() {
    let e = env();
    e.register();
    e.enqueue(1);
    e.cp.inject(Fault::WidenedJson);
    let body = e.post(Operation::Offers, &Env::pull_body(1)).unwrap();
    assert!(matches!(
        OfferResponse::parse(&body),
        Err(WireError::Json { .. })
    ));
    let offer = e.claim(1);
    assert_eq!(offer.delivery_kind, DeliveryKind::LeaseRecovery);

    let starting = ActivationRequest::starting(&offer);
    e.cp.inject(Fault::WidenedJson);
    let body = e
        .post(Operation::Starting, &starting.to_body().unwrap())
        .unwrap();
    assert!(matches!(
        ActivationResponse::parse(&body, &starting),
        Err(WireError::Json { .. })
    ));
    e.activate(&ActivationRequest::running(
        &offer,
        running_ack(&offer, 1, true),
    ));
    let content = b"abc";
    let up = upload(&offer, content, None);
    e.cp.inject(Fault::WidenedJson);
    let (body, report) = e.upload(&up, &mut &content[..], 3).unwrap();
    assert!(ArtifactReceipt::parse(&body, &up, &Sha256Digest::from_bytes(report.sha256)).is_err());
}

#[test]
fn faults_are_consumed_once_and_only_by_their_path() {
    let e = env();
    e.register();
    let heartbeat = e.worker.path(Operation::Heartbeat);
    e.cp.inject_for(&heartbeat, Fault::Unavailable);
    // Another path is not affected.
    e.enqueue(1);
    let answer = e.post(Operation::Offers, &Env::pull_body(1)).unwrap();
    assert!(OfferResponse::parse(&answer).is_ok());
    let body =
        ql_worker_tests::control_plane::harness::heartbeat_body(control_plane_common::GEN1, 0, 1);
    let err = e
        .client
        .post_json(&heartbeat, &e.auth, &body, caps(Operation::Heartbeat))
        .unwrap_err();
    assert!(matches!(err, TransportError::Status { status: 503, .. }));
    e.client
        .post_json(&heartbeat, &e.auth, &body, caps(Operation::Heartbeat))
        .expect("the fault was consumed");
}
