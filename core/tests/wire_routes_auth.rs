//! Routes, the `Worker ql3w_…` authorization header, and the error code/status mapping.

use ql_worker_core::ids::{SessionId, WorkerId};
use ql_worker_core::wire::auth::{AuthError, WorkerCredential};
use ql_worker_core::wire::error::{ErrorClass, ErrorCode, IngressError};
use ql_worker_core::wire::route::{self, Operation};
use ql_worker_tests::server_wire::{ClientBody, client_body, error_body, parse_route};

fn ids() -> (WorkerId, SessionId) {
    (
        WorkerId::new("edge-1").unwrap(),
        SessionId::new("018f0000-0000-7000-8000-000000000001").unwrap(),
    )
}

#[test]
fn wire_route_paths_round_trip_for_every_operation() {
    let (worker, session) = ids();
    for op in Operation::ALL {
        let path = route::path(&worker, &session, op);
        assert_eq!(
            path,
            format!(
                "/api/v3/worker-ingress/workers/edge-1/sessions/018f0000-0000-7000-8000-000000000001/{}",
                op.as_str()
            )
        );
        let parsed = parse_route(&path).unwrap();
        assert_eq!(
            (parsed.worker_id, parsed.session_id, parsed.operation),
            (worker.clone(), session.clone(), op)
        );
        assert_eq!(op.request_cap().is_none(), op == Operation::Attestations);
    }
    assert_eq!(
        client_body(Operation::Artifacts),
        ClientBody::ArtifactStream
    );
    assert_eq!(client_body(Operation::Attestations), ClientBody::NotCalled);
    assert_eq!(Operation::Secrets.request_cap(), Some(64 * 1024));
    assert_eq!(Operation::Completion.request_cap(), Some(16 * 1024));
    assert_eq!(Operation::LeaseControl.request_cap(), Some(8 * 1024));
    assert_eq!(Operation::Register.request_cap(), Some(20 * 1024));
    assert_eq!(Operation::Starting.request_cap(), Some(4 * 1024));
    assert_eq!(
        Operation::Artifacts.request_cap(),
        Some(64 * 1024 * 1024 + 4 * 1024 + 4)
    );
    assert_eq!(Operation::Offers.response_cap(), Some(128 * 1024));
    assert_eq!(Operation::Secrets.response_cap(), Some(256 * 1024));
}

#[test]
fn wire_route_rejects_queries_and_confused_paths() {
    let base =
        "/api/v3/worker-ingress/workers/edge-1/sessions/018f0000-0000-7000-8000-000000000001";
    for bad in [
        format!("{base}/offers?x=1"),
        format!("{base}/offers#f"),
        format!("{base}/offers/"),
        format!("{base}/unknown"),
        format!("{base}/Offers"),
        base.to_string(),
        "/api/v3/worker-ingress/workers/-edge/sessions/018f0000-0000-7000-8000-000000000001/offers".into(),
        "/api/v3/worker-ingress/workers/edge-1/sessions/018f0000-0000-4000-8000-000000000001/offers".into(),
        "/api/v3/worker-ingress/workers/edge-1/session/018f0000-0000-7000-8000-000000000001/offers".into(),
        "/api/v2/worker-ingress/workers/edge-1/sessions/018f0000-0000-7000-8000-000000000001/offers".into(),
    ] {
        assert!(parse_route(&bad).is_err(), "{bad}");
    }
}

#[test]
fn wire_authorization_header_builds_and_validates() {
    let credential = WorkerCredential::new("worker.primary", [7u8; 32]).unwrap();
    let header = credential.header_value();
    assert_eq!(
        &*header,
        "Worker ql3w_worker.primary_BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc"
    );
    let parsed = WorkerCredential::parse_header(&header).unwrap();
    assert_eq!(parsed, credential, "the same id and secret");
    assert!(!format!("{parsed:?}").contains("BwcH"), "Debug is redacted");
    let secret = "BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc";
    for (bad, expected) in [
        (format!("Bearer ql3w_w_{secret}"), AuthError::Scheme),
        (format!("Worker ql3w_{secret}"), AuthError::Scheme),
        (format!("Worker ql3w_-w_{secret}"), AuthError::CredentialId),
        (
            format!("Worker ql3w_{}_{secret}", "w".repeat(65)),
            AuthError::CredentialId,
        ),
        (
            "Worker ql3w_w_BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwd".into(),
            AuthError::Secret,
        ),
        (
            "Worker ql3w_w_BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBw".into(),
            AuthError::Secret,
        ),
        (
            "Worker ql3w_w_BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwc=".into(),
            AuthError::Secret,
        ),
        (
            "Worker ql3w_w_BwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBwcHBw+c".into(),
            AuthError::Secret,
        ),
    ] {
        assert_eq!(
            WorkerCredential::parse_header(&bad).unwrap_err(),
            expected,
            "{bad}"
        );
    }
    // The credential id may contain `_` (the reference class `[A-Za-z0-9._:-]`, and its tests
    // use `worker_primary`): the secret is the last 43 characters.
    let primary = WorkerCredential::new("worker_primary", [7; 32]).unwrap();
    let header = primary.header_value();
    let parsed = WorkerCredential::parse_header(&header).unwrap();
    assert_eq!(parsed.credential_id(), "worker_primary");
    assert_eq!(parsed, primary, "the same id and secret");
    let underscore_secret = format!("Worker ql3w_w_{}", "_".repeat(42) + "w");
    let parsed = WorkerCredential::parse_header(&underscore_secret).unwrap();
    assert_eq!(parsed.credential_id(), "w", "the secret may contain `_`");
    assert_eq!(
        &*parsed.header_value(),
        underscore_secret.as_str(),
        "canonical"
    );
}

#[test]
fn wire_error_codes_map_to_reference_statuses_and_classes() {
    let expect = [
        (
            ErrorCode::WorkerRouteNotFound,
            404,
            ErrorClass::RequestRejected,
        ),
        (
            ErrorCode::WorkerAuthenticationRequired,
            401,
            ErrorClass::CredentialRejected,
        ),
        (
            ErrorCode::WorkerAuthenticationUnavailable,
            503,
            ErrorClass::Unavailable,
        ),
        (
            ErrorCode::WorkerAuditUnavailable,
            503,
            ErrorClass::Unavailable,
        ),
        (
            ErrorCode::InvalidWorkerRequest,
            400,
            ErrorClass::RequestRejected,
        ),
        (ErrorCode::WorkerSessionFenced, 409, ErrorClass::Fenced),
        (ErrorCode::WorkerOfferFenced, 409, ErrorClass::Fenced),
        (ErrorCode::WorkerActivationFenced, 409, ErrorClass::Fenced),
        (
            ErrorCode::WorkerSecretDeliveryFenced,
            409,
            ErrorClass::Fenced,
        ),
        (ErrorCode::WorkerCompletionFenced, 409, ErrorClass::Fenced),
        (ErrorCode::WorkerLeaseControlFenced, 409, ErrorClass::Fenced),
        (
            ErrorCode::WorkerIngressUnavailable,
            503,
            ErrorClass::Unavailable,
        ),
        (ErrorCode::RequestTooLarge, 413, ErrorClass::RequestRejected),
        (
            ErrorCode::UnsupportedContentEncoding,
            415,
            ErrorClass::RequestRejected,
        ),
        (
            ErrorCode::MethodNotAllowed,
            405,
            ErrorClass::RequestRejected,
        ),
        (ErrorCode::RequestTimeout, 504, ErrorClass::Unavailable),
        (ErrorCode::InternalError, 500, ErrorClass::Unavailable),
        (ErrorCode::AdmissionDraining, 503, ErrorClass::Unavailable),
    ];
    for (code, status, class) in expect {
        assert_eq!(code.http_status(), status, "{}", code.as_str());
        let err = IngressError::classify(status, Some(&error_body(code)));
        assert_eq!(err.code, Some(code));
        assert_eq!(err.class(), class);
    }
    // A code whose status disagrees, an unknown code, or a widened body carries no code.
    assert_eq!(
        IngressError::classify(500, Some(&error_body(ErrorCode::WorkerSessionFenced))).code,
        None
    );
    assert_eq!(
        IngressError::classify(409, Some(br#"{"code":"nope"}"#)).code,
        None
    );
    assert_eq!(
        IngressError::classify(409, Some(br#"{"code":"worker_session_fenced","x":1}"#)).code,
        None
    );
    assert_eq!(
        IngressError::classify(401, None).to_string(),
        "control plane answered 401"
    );
    let fenced = IngressError {
        status: 409,
        code: Some(ErrorCode::WorkerSessionFenced),
    };
    assert_eq!(
        fenced.to_string(),
        "control plane answered 409 worker_session_fenced"
    );
    for code in ErrorCode::ALL {
        assert_eq!(ErrorCode::from_wire(code.as_str()), Some(*code));
    }
}
