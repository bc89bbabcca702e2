//! Request paths: `/api/v3/worker-ingress/workers/{workerId}/sessions/{sessionId}/{operation}`
//! (reference §2.1). Worker and Session identity travel only in the path, never in bodies.

use alloc::string::String;

use crate::ids::{SessionId, WorkerId};

/// The fixed path prefix.
pub const PREFIX: &str = "/api/v3/worker-ingress/workers/";

/// Declares [`Operation`] once from `Variant = "segment"` pairs: the enum, `ALL` and `as_str`.
macro_rules! operations {
    ($($(#[$doc:meta])* $variant:ident = $text:literal,)*) => {
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
        }
    };
}

operations! {
    /// `artifacts` (streamed upload).
    Artifacts = "artifacts",
    /// `attestations` (control plane only; the Worker never calls it).
    Attestations = "attestations",
    /// `completion`.
    Completion = "completion",
    /// `heartbeat`.
    Heartbeat = "heartbeat",
    /// `lease-control`.
    LeaseControl = "lease-control",
    /// `offers`.
    Offers = "offers",
    /// `register`.
    Register = "register",
    /// `running`.
    Running = "running",
    /// `secrets`.
    Secrets = "secrets",
    /// `start-failure`.
    StartFailure = "start-failure",
    /// `starting`.
    Starting = "starting",
    /// `transition`.
    Transition = "transition",
}

impl Operation {
    /// The Worker client's request body cap for this operation (4 KiB default; opt-ins:
    /// secrets 64 KiB, completion 16 KiB, lease-control 8 KiB, register 20 KiB; artifacts
    /// `64 MiB + 4 KiB + 4`). `None` for `attestations`.
    #[must_use]
    pub const fn request_cap(self) -> Option<usize> {
        match self {
            Self::Artifacts => Some(super::artifact::MAX_REQUEST_BYTES),
            Self::Attestations => None,
            Self::Secrets => Some(super::secrets::MAX_REQUEST_BYTES),
            Self::Completion => Some(super::completion::MAX_REQUEST_BYTES),
            Self::LeaseControl => Some(super::lease_control::MAX_REQUEST_BYTES),
            Self::Register => Some(super::session::MAX_REGISTER_REQUEST_BYTES),
            Self::Heartbeat
            | Self::Offers
            | Self::Running
            | Self::StartFailure
            | Self::Starting
            | Self::Transition => Some(super::DEFAULT_REQUEST_CAP),
        }
    }

    /// The response cap of this operation (`None` for `attestations`).
    #[must_use]
    pub const fn response_cap(self) -> Option<usize> {
        match self {
            Self::Artifacts => Some(super::artifact::MAX_RESPONSE_BYTES),
            Self::Attestations => None,
            Self::Completion => Some(super::completion::MAX_RESPONSE_BYTES),
            Self::Heartbeat | Self::Register | Self::Transition => {
                Some(super::session::MAX_RESPONSE_BYTES)
            }
            Self::LeaseControl => Some(super::lease_control::MAX_RESPONSE_BYTES),
            Self::Offers => Some(super::offer::MAX_RESPONSE_BYTES),
            Self::Running | Self::StartFailure | Self::Starting => {
                Some(super::activation::MAX_RESPONSE_BYTES)
            }
            Self::Secrets => Some(super::secrets::MAX_RESPONSE_BYTES),
        }
    }
}

/// Builds the request path (ids are validated by their types, so no escaping is needed).
#[must_use]
pub fn path(worker_id: &WorkerId, session_id: &SessionId, operation: Operation) -> String {
    alloc::format!(
        "{PREFIX}{worker_id}/sessions/{session_id}/{}",
        operation.as_str()
    )
}
