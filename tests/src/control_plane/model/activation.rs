//! `starting`, `running`, `start-failure` (reference §2.3–2.5, ADR-0013/0118): the activation
//! state machine of the Attempt and the three snapshot shapes.
//!
//! ```text
//!            starting            running              start-failure
//! claimed ──────────► starting ──────────► running
//!    │                   │
//!    └──── start-failure ┴──► failed | cancelled | timed_out   (lease completed, version +1)
//! ```
//!
//! Replays answer `already_starting`, `already_running` (exact same handle, log id, sequence and
//! digest only) or `already_terminal`; anything else is 409 `worker_activation_fenced`.

use ql_worker_core::ids::LeaseVersion;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::activation::{
    ActivationResponse, ActivationSnapshot, ActivationStatus, AttemptStatus, RunStatus,
    SnapshotShape,
};
use ql_worker_core::wire::error::ErrorCode;
use ql_worker_core::wire::lease_control::StopReason;

use super::{ControlPlane, CpResponse, Ctx, Handled};
use crate::control_plane::requests::{self, ExecFence, Reject, RunningFacts};
use crate::control_plane::state::{LeaseRecord, LeaseState, RunEventKind, RunRecord};
use crate::server_wire::ToJson as _;

/// The error code a start failure records.
pub const START_FAILED_ERROR_CODE: &str = "EXECUTOR_START_FAILED";

fn fenced(reason: &'static str) -> Reject {
    Reject::new(ErrorCode::WorkerActivationFenced, reason)
}

/// What the fence allows for this Attempt.
enum Phase {
    /// `claimed`, `starting` or `running` with a live lease at the expected version.
    Live(AttemptStatus),
    /// `failed`, `cancelled` or `timed_out`, fenced with the version before or after the closing
    /// bump.
    Terminal,
}

/// The status a terminal transition takes when a cancel intent exists (ADR-0118: the intent wins).
pub(crate) fn intended_terminal(run: &RunRecord, otherwise: AttemptStatus) -> AttemptStatus {
    match run.cancel_intent {
        Some(intent) if intent.reason == StopReason::Timeout => AttemptStatus::TimedOut,
        Some(_) => AttemptStatus::Cancelled,
        None => otherwise,
    }
}

/// The Run status matching a terminal Attempt status.
pub(crate) fn run_status_of(status: AttemptStatus) -> RunStatus {
    match status {
        AttemptStatus::Succeeded => RunStatus::Succeeded,
        AttemptStatus::Failed => RunStatus::Failed,
        AttemptStatus::Cancelled => RunStatus::Cancelled,
        AttemptStatus::TimedOut => RunStatus::TimedOut,
        AttemptStatus::Lost => RunStatus::Lost,
        AttemptStatus::Claimed | AttemptStatus::Starting => RunStatus::Dispatching,
        AttemptStatus::Running => RunStatus::Running,
    }
}

fn phase(
    now: UnixMillis,
    run: &RunRecord,
    lease: &LeaseRecord,
    expected: LeaseVersion,
) -> Result<Phase, Reject> {
    match run.attempt_status {
        Some(
            status @ (AttemptStatus::Claimed | AttemptStatus::Starting | AttemptStatus::Running),
        ) => {
            ControlPlane::check_live_lease(now, lease, expected).map_err(fenced)?;
            Ok(Phase::Live(status))
        }
        Some(AttemptStatus::Failed | AttemptStatus::Cancelled | AttemptStatus::TimedOut) => {
            let before_close = lease.state == LeaseState::Completed
                && expected.get().checked_add(1) == Some(lease.version.get());
            if lease.version == expected || before_close {
                Ok(Phase::Terminal)
            } else {
                Err(fenced("version mismatch"))
            }
        }
        Some(AttemptStatus::Succeeded | AttemptStatus::Lost) | None => {
            Err(fenced("state mismatch"))
        }
    }
}

/// The snapshot of `run` in `shape`.
pub(crate) fn snapshot(run: &RunRecord, shape: SnapshotShape) -> ActivationSnapshot {
    let lease_version = run.lease_version().unwrap_or(LeaseVersion::FIRST);
    let lease_generation = run.lease.as_ref().map_or(1, |l| l.lease_generation.get());
    let attempt_status = run.attempt_status.unwrap_or(AttemptStatus::Claimed);
    let mut s = ActivationSnapshot {
        run_id: run.run_id.clone(),
        attempt_id: run.attempt_id.clone(),
        run_status: run.run_status,
        attempt_status,
        lease_version,
        lease_generation,
        callback_sequence: run.callback_sequence,
        deadline_at_ms: run.deadline_at,
        started_at_ms: None,
        finished_at_ms: None,
        executor_handle: None,
        log_artifact_id: None,
        error_code: None,
    };
    match shape {
        SnapshotShape::Starting => {
            s.run_status = RunStatus::Dispatching;
            s.attempt_status = AttemptStatus::Starting;
        }
        SnapshotShape::Running => {
            s.started_at_ms = run.started_at;
            s.executor_handle = run.executor_handle.clone();
            s.log_artifact_id = run.log_artifact_id.clone();
        }
        SnapshotShape::Terminal => {
            s.finished_at_ms = run.finished_at;
            s.error_code = run.error_code.clone();
        }
    }
    s
}

fn answer(run: &RunRecord, status: ActivationStatus, shape: SnapshotShape) -> CpResponse {
    let body = ActivationResponse {
        status,
        snapshot: snapshot(run, shape),
        shape,
    }
    .to_json();
    CpResponse::ok(body)
}

impl ControlPlane {
    fn activation_target(
        &self,
        ctx: &Ctx<'_>,
        fence: &ExecFence,
    ) -> Result<(RunRecord, Phase), Reject> {
        let (run, lease) = self.check_identity(ctx, fence).map_err(fenced)?;
        let phase = phase(ctx.now, run, lease, fence.expected_lease_version)?;
        Ok((run.clone(), phase))
    }

    /// `starting`: `claimed → starting`, and `deadline_at = now + timeoutMs` when the revision
    /// has a timeout. Never bumps the lease version.
    pub(super) fn starting(&mut self, ctx: &Ctx<'_>, body: &[u8]) -> Handled {
        let fence = requests::activation(body)?;
        ctx.storage()?;
        let (run, phase) = self.activation_target(ctx, &fence)?;
        match phase {
            Phase::Live(AttemptStatus::Claimed) => {
                let now = ctx.now;
                let record = self.run_mut(&run.run_id);
                record.attempt_status = Some(AttemptStatus::Starting);
                record.deadline_at = record.revision.timeout_ms.map(|t| now.saturating_add(t));
                self.event(&run.run_id, now, RunEventKind::AttemptStarting);
                let run = &self.state.runs[&run.run_id];
                Ok((
                    answer(run, ActivationStatus::Applied, SnapshotShape::Starting),
                    "applied",
                ))
            }
            Phase::Live(AttemptStatus::Starting) => Ok((
                answer(
                    &run,
                    ActivationStatus::AlreadyStarting,
                    SnapshotShape::Starting,
                ),
                "already_starting",
            )),
            Phase::Live(_) => Ok((
                answer(
                    &run,
                    ActivationStatus::AlreadyRunning,
                    SnapshotShape::Running,
                ),
                "already_running",
            )),
            Phase::Terminal => Ok((
                answer(
                    &run,
                    ActivationStatus::AlreadyTerminal,
                    SnapshotShape::Terminal,
                ),
                "already_terminal",
            )),
        }
    }

    /// `running`: `starting → running` with the executor handle, log id, callback sequence
    /// (the starting snapshot's + 1) and callback token digest; an exact replay is
    /// `already_running`, a different handle is 409.
    pub(super) fn running(&mut self, ctx: &Ctx<'_>, body: &[u8]) -> Handled {
        let (fence, facts) = requests::running(body)?;
        ctx.storage()?;
        let (run, phase) = self.activation_target(ctx, &fence)?;
        match phase {
            Phase::Live(AttemptStatus::Starting) => {
                if facts.callback_sequence.get() != run.callback_sequence + 1 {
                    return Err(fenced("callback sequence"));
                }
                let now = ctx.now;
                let record = self.run_mut(&run.run_id);
                record.attempt_status = Some(AttemptStatus::Running);
                record.run_status = RunStatus::Running;
                record.started_at = Some(now);
                record.executor_handle = Some(facts.executor_handle);
                record.log_artifact_id = facts.log_artifact_id;
                record.callback_sequence = facts.callback_sequence.get();
                record.callback_token_digest = Some(facts.callback_token_digest);
                self.event(&run.run_id, now, RunEventKind::AttemptRunning);
                self.event(&run.run_id, now, RunEventKind::RunRunning);
                let run = &self.state.runs[&run.run_id];
                Ok((
                    answer(run, ActivationStatus::Applied, SnapshotShape::Running),
                    "applied",
                ))
            }
            Phase::Live(AttemptStatus::Running) => {
                if !exact_running_replay(&run, &facts) {
                    return Err(fenced("running replay differs"));
                }
                Ok((
                    answer(
                        &run,
                        ActivationStatus::AlreadyRunning,
                        SnapshotShape::Running,
                    ),
                    "already_running",
                ))
            }
            Phase::Live(_) => Err(fenced("not starting")),
            Phase::Terminal => Ok((
                answer(
                    &run,
                    ActivationStatus::AlreadyTerminal,
                    SnapshotShape::Terminal,
                ),
                "already_terminal",
            )),
        }
    }

    /// `start-failure`: from `claimed` or `starting`, the Attempt and Run become `failed` with
    /// `EXECUTOR_START_FAILED` (or follow a cancel intent), the lease is completed at version +1;
    /// `running` answers `already_running`; terminal answers `already_terminal`.
    pub(super) fn start_failure(&mut self, ctx: &Ctx<'_>, body: &[u8]) -> Handled {
        let fence = requests::activation(body)?;
        ctx.storage()?;
        let (run, phase) = self.activation_target(ctx, &fence)?;
        match phase {
            Phase::Live(AttemptStatus::Claimed | AttemptStatus::Starting) => {
                let now = ctx.now;
                let status = intended_terminal(&run, AttemptStatus::Failed);
                self.close_attempt(&run.run_id, now, status, START_FAILED_ERROR_CODE)?;
                let run = &self.state.runs[&run.run_id];
                Ok((
                    answer(run, ActivationStatus::Applied, SnapshotShape::Terminal),
                    "applied",
                ))
            }
            Phase::Live(_) => Ok((
                answer(
                    &run,
                    ActivationStatus::AlreadyRunning,
                    SnapshotShape::Running,
                ),
                "already_running",
            )),
            Phase::Terminal => Ok((
                answer(
                    &run,
                    ActivationStatus::AlreadyTerminal,
                    SnapshotShape::Terminal,
                ),
                "already_terminal",
            )),
        }
    }

    /// Makes the Attempt and Run terminal with `status`, completes the lease at version +1 and
    /// writes the two terminal events.
    pub(crate) fn close_attempt(
        &mut self,
        run_id: &ql_worker_core::ids::RunId,
        now: UnixMillis,
        status: AttemptStatus,
        error_code: &str,
    ) -> Result<(), Reject> {
        let record = self.run_mut(run_id);
        let lease = record.lease.as_mut().ok_or(fenced("not claimed"))?;
        lease.version = lease
            .version
            .next()
            .map_err(|_| Reject::new(ErrorCode::WorkerIngressUnavailable, "version overflow"))?;
        lease.state = LeaseState::Completed;
        lease.updated_at = now;
        record.attempt_status = Some(status);
        record.run_status = run_status_of(status);
        record.finished_at = Some(now);
        record.error_code = (status != AttemptStatus::Succeeded).then(|| error_code.to_owned());
        self.event(run_id, now, RunEventKind::AttemptFinished { status });
        self.event(
            run_id,
            now,
            RunEventKind::RunFinished {
                status: run_status_of(status),
            },
        );
        Ok(())
    }

    pub(crate) fn run_mut(&mut self, run_id: &ql_worker_core::ids::RunId) -> &mut RunRecord {
        // INVARIANT: only called for a Run the fence check just found.
        self.state
            .runs
            .get_mut(run_id)
            .unwrap_or_else(|| unreachable!("run checked"))
    }
}

fn exact_running_replay(run: &RunRecord, facts: &RunningFacts) -> bool {
    run.executor_handle.as_ref() == Some(&facts.executor_handle)
        && run.log_artifact_id == facts.log_artifact_id
        && run.callback_sequence == facts.callback_sequence.get()
        && run.callback_token_digest == Some(facts.callback_token_digest)
}
