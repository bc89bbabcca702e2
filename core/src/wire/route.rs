//! Request paths: `/api/v3/worker-ingress/workers/{workerId}/sessions/{sessionId}/{operation}`
//! (reference §2.1). Worker and Session identity travel only in the path, never in bodies.

use alloc::string::String;

use super::{
    DEFAULT_REQUEST_CAP, activation, artifact, completion, lease_control, offer, secrets, session,
};
use crate::ids::{SessionId, WorkerId};

/// The fixed path prefix.
pub const PREFIX: &str = "/api/v3/worker-ingress/workers/";

/// Declares [`Operation`] once from `Variant = "segment" => request cap, response cap;` rows:
/// the enum, `ALL`, `as_str`, `request_cap` and `response_cap`.
macro_rules! operations {
    ($(
        $(#[$doc:meta])* $variant:ident = $text:literal => $request:expr, $response:expr;
    )*) => {
        /// A server operation.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Operation {
            $($(#[$doc])* $variant,)*
        }

        impl Operation {
            /// Every server operation.
            pub const ALL: [Self; 12] = [$(Self::$variant,)*];

            /// The path segment.
            #[must_use]
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)*
                }
            }

            /// The Worker client's request body cap for this operation (4 KiB default; opt-ins:
            /// secrets 64 KiB, completion 16 KiB, lease-control 8 KiB, register 20 KiB; artifacts
            /// `64 MiB + 4 KiB + 4`). `None` for `attestations`.
            #[must_use]
            pub const fn request_cap(self) -> Option<usize> {
                match self {
                    $(Self::$variant => $request,)*
                }
            }

            /// The response cap of this operation (`None` for `attestations`).
            #[must_use]
            pub const fn response_cap(self) -> Option<usize> {
                match self {
                    $(Self::$variant => $response,)*
                }
            }
        }
    };
}

operations! {
    /// `artifacts` (streamed upload).
    Artifacts = "artifacts" =>
        Some(artifact::MAX_REQUEST_BYTES), Some(artifact::MAX_RESPONSE_BYTES);
    /// `attestations` (control plane only; the Worker never calls it).
    Attestations = "attestations" => None, None;
    /// `completion`.
    Completion = "completion" =>
        Some(completion::MAX_REQUEST_BYTES), Some(completion::MAX_RESPONSE_BYTES);
    /// `heartbeat`.
    Heartbeat = "heartbeat" => Some(DEFAULT_REQUEST_CAP), Some(session::MAX_RESPONSE_BYTES);
    /// `lease-control`.
    LeaseControl = "lease-control" =>
        Some(lease_control::MAX_REQUEST_BYTES), Some(lease_control::MAX_RESPONSE_BYTES);
    /// `offers`.
    Offers = "offers" => Some(DEFAULT_REQUEST_CAP), Some(offer::MAX_RESPONSE_BYTES);
    /// `register`.
    Register = "register" =>
        Some(session::MAX_REGISTER_REQUEST_BYTES), Some(session::MAX_RESPONSE_BYTES);
    /// `running`.
    Running = "running" => Some(DEFAULT_REQUEST_CAP), Some(activation::MAX_RESPONSE_BYTES);
    /// `secrets`.
    Secrets = "secrets" => Some(secrets::MAX_REQUEST_BYTES), Some(secrets::MAX_RESPONSE_BYTES);
    /// `start-failure`.
    StartFailure = "start-failure" =>
        Some(DEFAULT_REQUEST_CAP), Some(activation::MAX_RESPONSE_BYTES);
    /// `starting`.
    Starting = "starting" => Some(DEFAULT_REQUEST_CAP), Some(activation::MAX_RESPONSE_BYTES);
    /// `transition`.
    Transition = "transition" => Some(DEFAULT_REQUEST_CAP), Some(session::MAX_RESPONSE_BYTES);
}

/// Builds the request path (ids are validated by their types, so no escaping is needed).
#[must_use]
pub fn path(worker_id: &WorkerId, session_id: &SessionId, operation: Operation) -> String {
    alloc::format!(
        "{PREFIX}{worker_id}/sessions/{session_id}/{}",
        operation.as_str()
    )
}
