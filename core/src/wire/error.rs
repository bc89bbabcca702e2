//! The control plane's error body `{"code":"<snake_case_code>"}` and its HTTP status mapping
//! (reference §2.1). The Worker client treats any status other than 200 as `response_rejected`
//! carrying only the status; [`IngressError::classify`] adds the code when a body is read.

use serde::Deserialize;

use super::{WireError, parse_json};

/// Error body cap (the same 4 KiB as the smallest response cap).
pub const MAX_ERROR_BODY_BYTES: usize = 4 * 1024;

macro_rules! codes {
    ($($variant:ident = $text:literal => $status:literal, $doc:literal;)*) => {
        /// Every error code the control plane sends, with its HTTP status.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum ErrorCode {
            $(#[doc = $doc] $variant,)*
        }

        impl ErrorCode {
            /// Every code.
            pub const ALL: &'static [Self] = &[$(Self::$variant,)*];

            /// The wire spelling.
            #[must_use]
            pub const fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text,)* }
            }

            /// The HTTP status the server sends with this code.
            #[must_use]
            pub const fn http_status(self) -> u16 {
                match self { $(Self::$variant => $status,)* }
            }

            /// Parses a wire spelling.
            #[must_use]
            pub fn from_wire(text: &str) -> Option<Self> {
                match text { $($text => Some(Self::$variant),)* _ => None }
            }
        }
    };
}

codes! {
    AdmissionCapacityExhausted = "admission_capacity_exhausted" => 503, "Server overload.";
    AdmissionDraining = "admission_draining" => 503, "Server draining.";
    ContentLengthMismatch = "content_length_mismatch" => 400,
        "Body length differs from content-length.";
    InternalError = "internal_error" => 500, "Server bug.";
    InvalidContentLength = "invalid_content_length" => 400, "Malformed content-length.";
    InvalidJson = "invalid_json" => 400, "Body is not JSON.";
    InvalidResponse = "invalid_response" => 500, "Server built an invalid response.";
    InvalidWorkerRequest = "invalid_worker_request" => 400, "Body shape or contract parse error.";
    MethodNotAllowed = "method_not_allowed" => 405, "Method outside DELETE/GET/PATCH/POST/PUT.";
    RequestTimeout = "request_timeout" => 504, "Server request timer fired.";
    RequestTooLarge = "request_too_large" => 413, "Body above the cap.";
    ResponseTooLarge = "response_too_large" => 500, "Server response above its cap.";
    UnsupportedContentEncoding = "unsupported_content_encoding" => 415, "Compressed body.";
    UnsupportedContentType = "unsupported_content_type" => 415, "Wrong media type.";
    WorkerActivationFenced = "worker_activation_fenced" => 409,
        "Starting/running/start-failure fence.";
    WorkerActivationUnavailable = "worker_activation_unavailable" => 503,
        "Activation service not wired.";
    WorkerArtifactUnavailable = "worker_artifact_unavailable" => 503, "Artifact service not wired.";
    WorkerAttestationFenced = "worker_attestation_fenced" => 409, "Attestation fence.";
    WorkerAuditUnavailable = "worker_audit_unavailable" => 503, "Audit write failed.";
    WorkerAuthenticationRequired = "worker_authentication_required" => 401,
        "No or invalid credential, or worker mismatch.";
    WorkerAuthenticationUnavailable = "worker_authentication_unavailable" => 503,
        "Authenticator failed.";
    WorkerCompletionFenced = "worker_completion_fenced" => 409, "Completion fence.";
    WorkerCompletionUnavailable = "worker_completion_unavailable" => 503,
        "Completion service not wired.";
    WorkerIngressUnavailable = "worker_ingress_unavailable" => 503,
        "Storage unavailable or malformed projection.";
    WorkerLeaseControlFenced = "worker_lease_control_fenced" => 409, "Lease-control fence.";
    WorkerLeaseControlUnavailable = "worker_lease_control_unavailable" => 503,
        "Lease-control service not wired.";
    WorkerOfferFenced = "worker_offer_fenced" => 409, "Offer replay fence.";
    WorkerOfferUnavailable = "worker_offer_unavailable" => 503, "Offer service not wired.";
    WorkerRouteNotFound = "worker_route_not_found" => 404,
        "Not POST, query present, or path mismatch.";
    WorkerSecretDeliveryFenced = "worker_secret_delivery_fenced" => 409, "Secret delivery fence.";
    WorkerSecretDeliveryUnavailable = "worker_secret_delivery_unavailable" => 503,
        "Secret service not wired.";
    WorkerSessionFenced = "worker_session_fenced" => 409, "Session conflict or fence.";
}

/// The class of a non-200 answer, by status, as the Worker acts on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorClass {
    /// 401/403: the credential was refused.
    CredentialRejected,
    /// 409: a fence (stale Session, lease, version, replay).
    Fenced,
    /// 400, 404, 405, 413, 415: the request was malformed (our bug).
    RequestRejected,
    /// 500, 503, 504 and anything else: retry later.
    Unavailable,
}

/// A non-200 answer: the status, and the code when a well-formed body was read.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "control plane answered {status}{}{}",
    .code.map_or("", |_| " "),
    .code.map_or("", ErrorCode::as_str)
)]
pub struct IngressError {
    /// HTTP status.
    pub status: u16,
    /// The `code`, if the body was read and known.
    pub code: Option<ErrorCode>,
}

impl IngressError {
    /// Classifies a non-200 status and (optionally) its body. A body that is not exactly
    /// `{"code":<known code>}` with that code's own status yields `code: None`.
    #[must_use]
    pub fn classify(status: u16, body: Option<&[u8]>) -> Self {
        let code = body
            .and_then(|b| parse_error_body(b).ok())
            .filter(|c| c.http_status() == status);
        Self { status, code }
    }

    /// What the Worker should do about it.
    #[must_use]
    pub const fn class(&self) -> ErrorClass {
        match self.status {
            401 | 403 => ErrorClass::CredentialRejected,
            409 => ErrorClass::Fenced,
            400 | 404 | 405 | 413 | 415 => ErrorClass::RequestRejected,
            _ => ErrorClass::Unavailable,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ErrorBodyWire {
    code: alloc::string::String,
}

/// Parses `{"code":"…"}` strictly.
///
/// # Errors
/// [`WireError`] for another shape or an unknown code.
pub fn parse_error_body(bytes: &[u8]) -> Result<ErrorCode, WireError> {
    let wire: ErrorBodyWire = parse_json("error", bytes, MAX_ERROR_BODY_BYTES)?;
    ErrorCode::from_wire(&wire.code).ok_or(WireError::Field {
        path: "code",
        rule: "a known error code",
    })
}
