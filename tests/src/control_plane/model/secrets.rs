//! `secrets` (reference §2.6): one batch of Secret values for a `starting` Attempt, in request
//! order, bound to the offer's revision.

use ql_worker_core::revision::{EnvValue, SecretRef};
use ql_worker_core::wire::activation::AttemptStatus;
use ql_worker_core::wire::error::ErrorCode;
use ql_worker_core::wire::secrets::{ResolvedSecret, SecretValue, SecretsResponse};

use super::{ControlPlane, CpResponse, Ctx, Handled, ServiceFault};
use crate::control_plane::requests::{self, Reject};
use crate::server_wire::ToJsonFor as _;

fn fenced(reason: &'static str) -> Reject {
    Reject::new(ErrorCode::WorkerSecretDeliveryFenced, reason)
}

impl ControlPlane {
    /// `secrets`: the fence must be live at the expected version, the Attempt `starting`, the
    /// project, task, task revision and execution digest those of the Run's revision, and every
    /// reference one the revision names. Values come back in request order; a value the control
    /// plane does not have is 503 `worker_ingress_unavailable`.
    pub(super) fn secrets(&mut self, ctx: &Ctx<'_>, body: &[u8]) -> Handled {
        let request = requests::secrets(body)?;
        ctx.storage()?;
        let (run, lease) = self.check_identity(ctx, &request.fence).map_err(fenced)?;
        Self::check_live_lease(ctx.now, lease, request.fence.expected_lease_version)
            .map_err(fenced)?;
        if run.attempt_status != Some(AttemptStatus::Starting) {
            return Err(fenced("attempt is not starting"));
        }
        let revision = &run.revision;
        let bound = revision.task_id == request.task_id
            && revision.task_revision == request.task_revision
            && revision.content_digest == request.execution_digest;
        if !bound {
            return Err(fenced("revision mismatch"));
        }
        let named: Vec<&SecretRef> = revision
            .environment
            .iter()
            .filter_map(|b| match &b.value {
                EnvValue::Secret(r) => Some(r),
                EnvValue::Public(_) => None,
            })
            .collect();
        let secrets_named = request.secret_refs.iter().all(|r| named.contains(&r));
        let bundle_named = request
            .environment_bundle_refs
            .iter()
            .all(|r| revision.environment_bundle_ref.as_ref() == Some(r));
        if !secrets_named || !bundle_named {
            return Err(fenced("reference not in the revision"));
        }
        if ctx.fault == Some(ServiceFault::SecretAuthorityDrift) {
            return Err(Reject::new(
                ErrorCode::WorkerIngressUnavailable,
                "secret service answered for another Run",
            ));
        }
        let resolve = |list: &[SecretRef]| -> Result<Vec<ResolvedSecret>, Reject> {
            list.iter()
                .map(|r| {
                    self.secrets
                        .get(r.as_str())
                        .map(|v| ResolvedSecret {
                            secret_ref: r.clone(),
                            value: SecretValue::new(v.clone()),
                        })
                        .ok_or(Reject::new(
                            ErrorCode::WorkerIngressUnavailable,
                            "secret value unavailable",
                        ))
                })
                .collect()
        };
        let response = SecretsResponse {
            values: resolve(&request.secret_refs)?,
            environment_bundles: resolve(&request.environment_bundle_refs)?,
        };
        let body = response.to_json(&request.to_core(&run.project_id));
        Ok((CpResponse::ok(body.to_vec()), "delivered"))
    }
}
