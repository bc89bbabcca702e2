//! `lease-control` (reference §2.9, `remoteWorkerLeaseControlService.ts`): renewal (version +1,
//! 30 s), durable stop requests (user cancel intent, or a timeout intent written when the
//! deadline passed), and the terminal projection.

use ql_worker_core::wire::activation::AttemptStatus;
use ql_worker_core::wire::error::ErrorCode;
use ql_worker_core::wire::lease_control::{
    LeaseControlRequest, LeaseControlResponse, RenewedLease, StopReason, StopRequest,
    TerminalStatus,
};

use super::{ControlPlane, CpResponse, Ctx, Handled};
use crate::control_plane::requests::{self, Reject};
use crate::control_plane::state::{CancelIntent, RunEventKind};
use crate::server_wire::ToJsonFor as _;

fn fenced(reason: &'static str) -> Reject {
    Reject::new(ErrorCode::WorkerLeaseControlFenced, reason)
}

fn terminal_status(status: AttemptStatus) -> Option<TerminalStatus> {
    match status {
        AttemptStatus::Succeeded => Some(TerminalStatus::Succeeded),
        AttemptStatus::Failed => Some(TerminalStatus::Failed),
        AttemptStatus::Cancelled => Some(TerminalStatus::Cancelled),
        AttemptStatus::TimedOut => Some(TerminalStatus::TimedOut),
        AttemptStatus::Lost => Some(TerminalStatus::Lost),
        AttemptStatus::Claimed | AttemptStatus::Starting | AttemptStatus::Running => None,
    }
}

impl ControlPlane {
    /// `lease-control`. Terminal Attempt ⇒ `terminal`. Live Attempt: the lease must be at the
    /// expected version and unexpired; it is renewed (version +1, `now + 30 s`); then an existing
    /// cancel intent ⇒ `stop_requested` with its reason; else a passed deadline ⇒ a `timeout`
    /// intent is written and `stop_requested{reason:"timeout"}`; else `renewed`.
    pub(super) fn lease_control(&mut self, ctx: &Ctx<'_>, body: &[u8]) -> Handled {
        let fence = requests::lease_control(body)?;
        ctx.storage()?;
        let (run, lease) = self.check_identity(ctx, &fence).map_err(fenced)?;
        let project_id = run.project_id.clone();
        let core = LeaseControlRequest {
            fence: fence.to_core(&project_id),
        };
        let respond = |response: LeaseControlResponse| CpResponse::ok(response.to_json(&core));
        if let Some(status) = run.attempt_status.and_then(terminal_status) {
            if fence.expected_lease_version > lease.version {
                return Err(fenced("version ahead of the lease"));
            }
            return Ok((respond(LeaseControlResponse::Terminal(status)), "terminal"));
        }
        Self::check_live_lease(ctx.now, lease, fence.expected_lease_version).map_err(fenced)?;
        let now = ctx.now;
        let run_id = run.run_id.clone();
        let lease_ms = self.config.run_lease_ms;
        let record = self.run_mut(&run_id);
        let deadline_passed = record.deadline_at.is_some_and(|d| d <= now);
        let write_timeout = record.cancel_intent.is_none() && deadline_passed;
        if write_timeout {
            record.cancel_intent = Some(CancelIntent {
                reason: StopReason::Timeout,
                requested_at: now,
            });
        }
        let intent = record.cancel_intent;
        let lease = record.lease.as_mut().ok_or(fenced("not claimed"))?;
        lease.version = lease
            .version
            .next()
            .map_err(|_| Reject::new(ErrorCode::WorkerIngressUnavailable, "version overflow"))?;
        lease.renewed_at = now;
        lease.expires_at = now.saturating_add(lease_ms);
        lease.updated_at = now;
        let renewed = RenewedLease {
            lease_version: lease.version,
            renewed_at_ms: lease.renewed_at,
            expires_at_ms: lease.expires_at,
        };
        if write_timeout {
            self.event(
                &run_id,
                now,
                RunEventKind::CancelRequested {
                    reason: StopReason::Timeout,
                },
            );
        }
        self.event(
            &run_id,
            now,
            RunEventKind::LeaseRenewed {
                version: renewed.lease_version,
            },
        );
        match intent {
            Some(intent) => {
                let stop = StopRequest {
                    reason: intent.reason,
                    requested_at_ms: intent.requested_at,
                };
                Ok((
                    respond(LeaseControlResponse::StopRequested(renewed, stop)),
                    "stop_requested",
                ))
            }
            None => Ok((respond(LeaseControlResponse::Renewed(renewed)), "renewed")),
        }
    }
}
