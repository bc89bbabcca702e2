//! `completion` (reference §2.8, ADR-0117): the stored artifact must exist with the same digest;
//! one transaction makes the Attempt and Run terminal and completes the lease at version +1; an
//! exact replay is `already_completed`, any drift 409, another terminal outcome
//! `already_terminal`.

use ql_worker_core::ids::LogArtifactId;
use ql_worker_core::wire::activation::AttemptStatus;
use ql_worker_core::wire::completion::{CompletionResponse, CompletionStatus, Outcome};
use ql_worker_core::wire::error::ErrorCode;

use super::activation::intended_terminal;
use super::{ControlPlane, CpResponse, Ctx, Handled};
use crate::control_plane::requests::{self, CompletionRequest, Reject};
use crate::control_plane::state::{ArtifactKey, CompletionFacts, RunRecord};
use crate::server_wire::ToJson as _;

fn fenced(reason: &'static str) -> Reject {
    Reject::new(ErrorCode::WorkerCompletionFenced, reason)
}

fn answer(request: &CompletionRequest, status: CompletionStatus) -> CpResponse {
    let body = CompletionResponse {
        status,
        run_id: request.fence.run_id.clone(),
        attempt_id: request.fence.attempt_id.clone(),
        callback_sequence: request.callback_sequence,
    }
    .to_json();
    CpResponse::ok(body)
}

fn facts_of(request: &CompletionRequest) -> CompletionFacts {
    CompletionFacts {
        expected_lease_version: request.fence.expected_lease_version,
        callback_sequence: request.callback_sequence,
        callback_token_digest: request.callback_token_digest,
        result: request.result,
        artifact: request.artifact.clone(),
    }
}

/// The error code of a terminal status reached through completion.
fn error_code(status: AttemptStatus, exit_code: u8) -> String {
    match status {
        AttemptStatus::Cancelled => "CANCELLED".to_owned(),
        AttemptStatus::TimedOut => "TIMED_OUT".to_owned(),
        _ => format!("EXIT_CODE_{exit_code}"),
    }
}

impl ControlPlane {
    /// `completion`. Order: identity fence → stored artifact (missing 409, length or truncation
    /// differing 503, digest differing 409) → replay rules → live start (`starting` or
    /// `running`), Session current, lease version and expiry, callback authority,
    /// `finishedAtMs ≤ now + 5 min` → apply, the cancel intent winning the final status.
    pub(super) fn completion(&mut self, ctx: &Ctx<'_>, body: &[u8]) -> Handled {
        let request = requests::completion(body)?;
        ctx.storage()?;
        let (run, _) = self.check_identity(ctx, &request.fence).map_err(fenced)?;
        let run = run.clone();
        self.check_stored_artifact(&run, &request)?;
        if let Some(applied) = &run.completion {
            let exact = applied == &facts_of(&request)
                && run
                    .lease_version()
                    .is_some_and(|v| v.get() == request.fence.expected_lease_version.get() + 1);
            if !exact {
                return Err(fenced("replay mismatch"));
            }
            return Ok((
                answer(&request, CompletionStatus::AlreadyCompleted),
                "already_completed",
            ));
        }
        if run.is_terminal() {
            return Ok((
                answer(&request, CompletionStatus::AlreadyTerminal),
                "already_terminal",
            ));
        }
        self.check_live_completion(ctx, &run, &request)?;
        let now = ctx.now;
        let natural = match request.result.outcome {
            Outcome::Succeeded => AttemptStatus::Succeeded,
            Outcome::Failed => AttemptStatus::Failed,
        };
        let status = intended_terminal(&run, natural);
        let code = error_code(status, request.result.exit_code);
        self.close_attempt(&run.run_id, now, status, &code)?;
        let record = self.run_mut(&run.run_id);
        record.finished_at = Some(request.result.finished_at_ms);
        record.callback_sequence = request.callback_sequence.get();
        record.callback_token_digest = Some(request.callback_token_digest);
        record.completion = Some(facts_of(&request));
        Ok((answer(&request, CompletionStatus::Applied), "applied"))
    }

    fn check_stored_artifact(
        &self,
        run: &RunRecord,
        request: &CompletionRequest,
    ) -> Result<(), Reject> {
        let a = &request.artifact;
        let stored = LogArtifactId::new(a.log_artifact_id.clone())
            .ok()
            .and_then(|log_artifact_id| {
                self.state.artifacts.get(&ArtifactKey {
                    project_id: run.project_id.clone(),
                    run_id: run.run_id.clone(),
                    attempt_id: run.attempt_id.clone(),
                    log_artifact_id,
                })
            })
            .ok_or(fenced("artifact missing"))?;
        if stored.byte_length != a.byte_length || stored.truncated != a.truncated {
            return Err(Reject::new(
                ErrorCode::WorkerIngressUnavailable,
                "stored artifact receipt differs",
            ));
        }
        if stored.sha256 != a.sha256 {
            return Err(fenced("artifact digest differs"));
        }
        Ok(())
    }

    fn check_live_completion(
        &self,
        ctx: &Ctx<'_>,
        run: &RunRecord,
        request: &CompletionRequest,
    ) -> Result<(), Reject> {
        let lease = run.lease.as_ref().ok_or(fenced("not claimed"))?;
        match run.attempt_status {
            Some(AttemptStatus::Running) => {
                let authority = run.callback_sequence == request.callback_sequence.get()
                    && run.callback_token_digest == Some(request.callback_token_digest);
                if !authority {
                    return Err(fenced("callback authority mismatch"));
                }
            }
            Some(AttemptStatus::Starting) => {
                // The crash window between spawn and the running ACK: the Worker completes from
                // its durable `launching` record with the sequence it would have sent.
                if request.callback_sequence.get() != run.callback_sequence + 1 {
                    return Err(fenced("callback sequence"));
                }
            }
            _ => return Err(fenced("state mismatch")),
        }
        Self::check_live_lease(ctx.now, lease, request.fence.expected_lease_version)
            .map_err(fenced)?;
        let latest = ctx.now.saturating_add(self.config.completion_clock_skew_ms);
        if request.result.finished_at_ms > latest {
            return Err(fenced("finishedAtMs in the future"));
        }
        Ok(())
    }
}
