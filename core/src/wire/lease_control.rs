//! `POST …/lease-control` (reference §2.9, schema `qinglong/remote-worker-lease-control@v1`):
//! lease renewal and stop poll.

use alloc::string::String;
use alloc::vec::Vec;

use serde::Deserialize;
use zeroize::Zeroizing;

use super::de::nullable;
use super::{Fence, Schema, WireError, bind, ensure, exact, field, id, parse_json, sealed_body};
use crate::ids::LeaseVersion;
use crate::offer::Offer;
use crate::time::UnixMillis;

/// Schema id (request and response).
pub const SCHEMA: &str = "qinglong/remote-worker-lease-control@v1";
/// `MAX_REMOTE_WORKER_LEASE_CONTROL_REQUEST_BYTES` (an explicit opt-in above 4 KiB).
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// `MAX_REMOTE_WORKER_LEASE_CONTROL_RESPONSE_BYTES`.
pub const MAX_RESPONSE_BYTES: usize = 4 * 1024;

/// The lease-control request: the execution fence only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseControlRequest {
    /// The execution fence; `expected_lease_version` is the version held.
    pub fence: Fence,
}

impl LeaseControlRequest {
    /// The request for `offer` at its current lease version.
    #[must_use]
    pub fn from_offer(offer: &Offer) -> Self {
        Self {
            fence: Fence::from_offer(offer),
        }
    }

    /// The request body (≤ 8 KiB); carries the lease token, so it is wiped on drop.
    ///
    /// # Errors
    /// [`WireError::RequestTooLarge`] (cannot happen with valid ids).
    pub fn to_body(&self) -> Result<Zeroizing<Vec<u8>>, WireError> {
        let view = Schema::new(SCHEMA, &self.fence);
        sealed_body(
            &view,
            &self.fence.lease_token,
            "lease-control",
            MAX_REQUEST_BYTES,
        )
    }
}

wire_enum! {
    /// Why the control plane asks the Worker to stop.
    StopReason {
        Policy = "policy",
        Reconcile = "reconcile",
        Shutdown = "shutdown",
        Timeout = "timeout",
        User = "user",
    }
}

wire_enum! {
    /// Terminal status of the Attempt at the control plane.
    TerminalStatus {
        Cancelled = "cancelled",
        Failed = "failed",
        Lost = "lost",
        Succeeded = "succeeded",
        TimedOut = "timed_out",
    }
}

/// The renewed lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RenewedLease {
    /// New version: exactly the request's `expectedLeaseVersion + 1`.
    pub lease_version: LeaseVersion,
    /// Renewal time.
    pub renewed_at_ms: UnixMillis,
    /// New expiry (> renewal).
    pub expires_at_ms: UnixMillis,
}

/// The stop request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StopRequest {
    /// Why.
    pub reason: StopReason,
    /// When it was requested.
    pub requested_at_ms: UnixMillis,
}

/// A parsed lease-control response, bound to the request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseControlResponse {
    /// Lease renewed; keep running.
    Renewed(RenewedLease),
    /// Lease renewed, and the control plane asks the Worker to stop the process.
    StopRequested(RenewedLease, StopRequest),
    /// The Attempt is terminal at the control plane.
    Terminal(TerminalStatus),
}

#[derive(Deserialize)]
#[serde(rename_all = "snake_case")]
enum Status {
    Renewed,
    StopRequested,
    Terminal,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ResponseWire {
    schema: String,
    status: Status,
    project_id: String,
    run_id: String,
    attempt_id: String,
    offer_id: String,
    lease_generation: u64,
    #[serde(deserialize_with = "nullable")]
    lease_version: Option<u64>,
    #[serde(deserialize_with = "nullable")]
    renewed_at_ms: Option<u64>,
    #[serde(deserialize_with = "nullable")]
    expires_at_ms: Option<u64>,
    #[serde(deserialize_with = "nullable")]
    stop: Option<StopRequest>,
    #[serde(deserialize_with = "nullable")]
    terminal_status: Option<TerminalStatus>,
}

fn renewed(wire: &ResponseWire, request: &LeaseControlRequest) -> Result<RenewedLease, WireError> {
    let (Some(version), Some(renewed), Some(expires)) =
        (wire.lease_version, wire.renewed_at_ms, wire.expires_at_ms)
    else {
        return Err(field(
            "leaseVersion",
            "present with renewedAtMs and expiresAtMs when not terminal",
        ));
    };
    ensure(
        wire.terminal_status.is_none(),
        "terminalStatus",
        "null unless terminal",
    )?;
    let lease = RenewedLease {
        lease_version: id(LeaseVersion::new(version), "leaseVersion")?,
        renewed_at_ms: id(UnixMillis::new(renewed), "renewedAtMs")?,
        expires_at_ms: id(UnixMillis::new(expires), "expiresAtMs")?,
    };
    ensure(version >= 1, "leaseVersion", "1..=2^31-1")?;
    ensure(
        lease.expires_at_ms > lease.renewed_at_ms,
        "expiresAtMs",
        "> renewedAtMs",
    )?;
    bind(
        version == request.fence.expected_lease_version.get() + 1,
        "leaseVersion",
        "the request's expectedLeaseVersion + 1",
    )?;
    Ok(lease)
}

impl LeaseControlResponse {
    /// Parses strictly (4 KiB cap first; all 12 keys present, `null` where absent) and binds
    /// `projectId, runId, attemptId, offerId, leaseGeneration` to the request and, unless
    /// terminal, `leaseVersion == expectedLeaseVersion + 1`.
    ///
    /// # Errors
    /// [`WireError`] naming the first violation.
    pub fn parse(bytes: &[u8], request: &LeaseControlRequest) -> Result<Self, WireError> {
        let wire: ResponseWire = parse_json("lease-control", bytes, MAX_RESPONSE_BYTES)?;
        exact(&wire.schema, SCHEMA, "schema")?;
        let f = &request.fence;
        bind_to_request! {
            wire.project_id == f.project_id.as_str() => "projectId";
            wire.run_id == f.run_id.as_str() => "runId";
            wire.attempt_id == f.attempt_id.as_str() => "attemptId";
            wire.offer_id == f.offer_id.as_str() => "offerId";
            wire.lease_generation == f.lease_generation.get() => "leaseGeneration";
        }
        match wire.status {
            Status::Terminal => {
                ensure(
                    wire.lease_version.is_none()
                        && wire.renewed_at_ms.is_none()
                        && wire.expires_at_ms.is_none()
                        && wire.stop.is_none(),
                    "status",
                    "terminal with leaseVersion, renewedAtMs, expiresAtMs and stop all null",
                )?;
                let status = wire
                    .terminal_status
                    .ok_or(field("terminalStatus", "present when terminal"))?;
                Ok(Self::Terminal(status))
            }
            Status::Renewed => {
                let lease = renewed(&wire, request)?;
                ensure(wire.stop.is_none(), "stop", "null when renewed")?;
                Ok(Self::Renewed(lease))
            }
            Status::StopRequested => {
                let lease = renewed(&wire, request)?;
                let stop = wire
                    .stop
                    .ok_or(field("stop", "present when stop_requested"))?;
                Ok(Self::StopRequested(lease, stop))
            }
        }
    }
}
