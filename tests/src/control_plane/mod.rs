//! The loopback reference control plane (issue 8, items 3–4).
//!
//! Two layers:
//!
//! - [`model`]: [`ControlPlane`], a pure and deterministic model of the control plane's Worker
//!   ingress (reference §2): authentication, routes and the error mapping of §2.1, Sessions, the
//!   Run queue and offers, activation, Secrets, the artifact store, completion and lease control.
//!   No sockets, threads, clock or randomness: `now` is an argument, so a simulation can drive it.
//! - [`server`]: [`ReferenceControlPlane`], the model behind the loopback TLS 1.3 mTLS
//!   [`HttpsServer`](crate::https_server::HttpsServer), with transport fault injection and a
//!   small, stable API for tests and the `ql-worker demo`.
//!
//! [`revisions`] builds sealed execution revisions; [`requests`] holds the strict request
//! parsers; [`state`] the inspectable records. See `docs/control-plane.md`.

pub mod harness;
pub mod model;
pub mod requests;
pub mod revisions;
pub mod server;
pub mod state;

pub use model::{
    ArtifactTicket, AuditOutcome, AuditRecord, CancelOutcome, ControlPlane, CpConfig, CpError,
    CpHead, CpRequest, CpResponse, RequestLogEntry, RunSpec, ServiceFault, StreamedContent,
};
pub use revisions::{RevisionBuildError, RevisionBuilder};
pub use server::{Fault, ReferenceControlPlane, ReferenceOptions, WorkerSettings};

pub use state::{
    ArtifactKey, CpState, LeaseRecord, LeaseState, RunEvent, RunEventKind, RunRecord,
    SessionRecord, StoredArtifact,
};
