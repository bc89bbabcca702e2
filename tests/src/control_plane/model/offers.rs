//! `offers` (reference §2.2, `remoteWorkerDispatcher.ts`): lease recovery for a known offer id,
//! otherwise a bounded candidate scan with placement and an atomic claim.

use ql_worker_core::ids::{LeaseGeneration, LeaseVersion, OfferId, RunId};
use ql_worker_core::offer::{Candidate, DeliveryKind, ExecutorType, OfferWorker};
use ql_worker_core::revision::Placement;
use ql_worker_core::wire::activation::{AttemptStatus, RunStatus};
use ql_worker_core::wire::error::ErrorCode;
use ql_worker_core::wire::offer::{
    IdleReason, OfferResponse, OfferStats, OfferedLease, OfferedOffer,
};
use ql_worker_core::wire::session::Capabilities;

use super::{ControlPlane, CpResponse, Ctx, Handled, ServiceFault};
use crate::control_plane::requests::{self, ClaimRequest, Reject};
use crate::control_plane::state::{LeaseRecord, LeaseState, RunEventKind, RunRecord};
use crate::server_wire::ToJson as _;

fn fenced(reason: &'static str) -> Reject {
    Reject::new(ErrorCode::WorkerOfferFenced, reason)
}

fn idle(reason: IdleReason, stats: OfferStats, truncated: bool) -> Handled {
    let body = OfferResponse::Idle {
        reason,
        stats,
        truncated,
    }
    .to_json();
    Ok((CpResponse::ok(body), reason.as_str()))
}

impl ControlPlane {
    /// `offers`: an offer id that already names a lease is a replay, answered with
    /// `lease_recovery` if everything still matches (leased, unexpired, same Worker, Session,
    /// generation and token) and 409 `worker_offer_fenced` otherwise. A new offer id scans the
    /// queue and claims the first candidate whose placement matches.
    pub(super) fn offers(&mut self, ctx: &Ctx<'_>, body: &[u8]) -> Handled {
        let request = requests::claim(body)?;
        ctx.storage()?;
        if let Some(run_id) = self.run_by_offer(&request.offer_id) {
            return self.recover(ctx, &request, &run_id);
        }
        self.scan_and_claim(ctx, &request)
    }

    fn run_by_offer(&self, offer_id: &OfferId) -> Option<RunId> {
        self.state
            .runs
            .values()
            .find(|r| r.lease.as_ref().is_some_and(|l| &l.offer_id == offer_id))
            .map(|r| r.run_id.clone())
    }

    fn recover(&mut self, ctx: &Ctx<'_>, request: &ClaimRequest, run_id: &RunId) -> Handled {
        let run = self.state.runs.get(run_id).ok_or(fenced("missing"))?;
        let lease = run.lease.as_ref().ok_or(fenced("missing"))?;
        let current =
            self.session_current(&lease.worker_id, &lease.session_id, lease.worker_generation);
        let matches = lease.state == LeaseState::Leased
            && lease.expires_at > ctx.now
            && current
            && &lease.worker_id == ctx.worker_id()
            && &lease.session_id == ctx.session_id()
            && lease.worker_generation == request.worker_generation
            && lease.token_digest == request.lease_token.digest();
        if !matches {
            return Err(fenced("offer replay does not match its lease"));
        }
        let offer = project(
            run,
            lease,
            &request.offer_id,
            DeliveryKind::LeaseRecovery,
            0,
        );
        if ctx.fault == Some(ServiceFault::MalformedOfferProjection) {
            return Err(Reject::new(
                ErrorCode::WorkerIngressUnavailable,
                "malformed offer projection",
            ));
        }
        let body = OfferResponse::Offered {
            offer: Box::new(offer),
            stats: OfferStats::default(),
            truncated: false,
        }
        .to_json();
        Ok((CpResponse::ok(body), "lease_recovery"))
    }

    /// Queued Runs in offer order: priority descending, then queue time, Attempt creation,
    /// enqueue order.
    fn candidates(&self) -> Vec<RunId> {
        let mut queued: Vec<&RunRecord> = self
            .state
            .runs
            .values()
            .filter(|r| r.run_status == RunStatus::Queued && r.attempt_status.is_none())
            .collect();
        queued.sort_by(|a, b| {
            b.priority
                .cmp(&a.priority)
                .then(a.queued_at.cmp(&b.queued_at))
                .then(a.attempt_created_at.cmp(&b.attempt_created_at))
                .then(a.enqueue_seq.cmp(&b.enqueue_seq))
        });
        queued.into_iter().map(|r| r.run_id.clone()).collect()
    }

    /// Live leases held by this Worker's current generation.
    fn live_leases(&self, ctx: &Ctx<'_>, request: &ClaimRequest) -> u64 {
        self.state
            .runs
            .values()
            .filter(|r| {
                r.is_live()
                    && r.lease.as_ref().is_some_and(|l| {
                        &l.worker_id == ctx.worker_id()
                            && l.worker_generation == request.worker_generation
                            && l.state == LeaseState::Leased
                    })
            })
            .count() as u64
    }

    fn scan_and_claim(&mut self, ctx: &Ctx<'_>, request: &ClaimRequest) -> Handled {
        let config = self.config.clone();
        let candidates = self.candidates();
        let mut stats = OfferStats::default();
        let mut saw_candidate = false;
        let mut last_truncated = false;
        let page_size = config.offer_page_size.max(1);
        for page_index in 0..config.offer_max_pages.max(1) {
            let start = page_index * page_size;
            let page: Vec<RunId> = candidates
                .iter()
                .skip(start)
                .take(page_size)
                .cloned()
                .collect();
            let truncated = candidates.len() > start + page_size;
            stats.pages += 1;
            last_truncated = truncated;
            let Some(session) = self.state.sessions.get(ctx.worker_id()) else {
                return idle(IdleReason::WorkerUnavailable, stats, false);
            };
            let usable = &session.session_id == ctx.session_id()
                && session.generation == request.worker_generation
                && session.accepts_work(ctx.now);
            if !usable {
                return idle(IdleReason::WorkerUnavailable, stats, false);
            }
            let capabilities = session.capabilities.clone();
            let max_runs = session.max_concurrent_runs;
            for run_id in &page {
                saw_candidate = true;
                stats.candidates += 1;
                let run = &self.state.runs[run_id];
                let Some(score) = placement_score(&capabilities, run.revision.placement.as_ref())
                else {
                    stats.placement_mismatches += 1;
                    continue;
                };
                if stats.claim_attempts >= config.offer_max_claims {
                    return idle(IdleReason::ClaimBudgetExhausted, stats, true);
                }
                stats.claim_attempts += 1;
                if self.live_leases(ctx, request) >= max_runs {
                    return idle(IdleReason::WorkerUnavailable, stats, false);
                }
                return self.claim(ctx, request, run_id, score, stats, truncated);
            }
            if !truncated || page.is_empty() {
                break;
            }
        }
        if last_truncated {
            return idle(IdleReason::ScanBudgetExhausted, stats, true);
        }
        if !saw_candidate {
            return idle(IdleReason::NoCandidates, stats, false);
        }
        // Every candidate that matched was claimed above (the model has no claim races), so
        // reaching here means none matched.
        idle(IdleReason::NoMatch, stats, false)
    }

    fn claim(
        &mut self,
        ctx: &Ctx<'_>,
        request: &ClaimRequest,
        run_id: &RunId,
        score: u64,
        stats: OfferStats,
        truncated: bool,
    ) -> Handled {
        let now = ctx.now;
        let lease = LeaseRecord {
            offer_id: request.offer_id.clone(),
            worker_id: ctx.worker_id().clone(),
            session_id: ctx.session_id().clone(),
            worker_generation: request.worker_generation,
            token_digest: request.lease_token.digest(),
            state: LeaseState::Leased,
            version: LeaseVersion::FIRST,
            lease_generation: LeaseGeneration::FIRST,
            acquired_at: now,
            renewed_at: now,
            expires_at: now.saturating_add(self.config.run_lease_ms),
            updated_at: now,
        };
        let run = self
            .state
            .runs
            .get_mut(run_id)
            .ok_or(fenced("candidate vanished"))?;
        run.lease = Some(lease);
        run.attempt_status = Some(AttemptStatus::Claimed);
        run.run_status = RunStatus::Dispatching;
        self.event(
            run_id,
            now,
            RunEventKind::Claimed {
                offer_id: request.offer_id.clone(),
            },
        );
        // The claim is committed; a broken projection is the server's problem (503), and the
        // Worker's retry with the same claim recovers the lease.
        if ctx.fault == Some(ServiceFault::MalformedOfferProjection) {
            return Err(Reject::new(
                ErrorCode::WorkerIngressUnavailable,
                "malformed offer projection",
            ));
        }
        let run = &self.state.runs[run_id];
        let lease = run.lease.as_ref().ok_or(fenced("missing"))?;
        let offer = project(run, lease, &request.offer_id, DeliveryKind::NewClaim, score);
        let body = OfferResponse::Offered {
            offer: Box::new(offer),
            stats,
            truncated,
        }
        .to_json();
        Ok((CpResponse::ok(body), "new_claim"))
    }
}

/// The offer as the response carries it (no token, no token digest).
fn project(
    run: &RunRecord,
    lease: &LeaseRecord,
    offer_id: &OfferId,
    delivery_kind: DeliveryKind,
    placement_score: u64,
) -> OfferedOffer {
    let revision = &run.revision;
    OfferedOffer {
        offer_id: offer_id.clone(),
        delivery_kind,
        execution_digest: revision.content_digest,
        candidate: Candidate {
            run_id: run.run_id.clone(),
            attempt_id: run.attempt_id.clone(),
            project_id: revision.project_id.clone(),
            task_id: revision.task_id.clone(),
            task_revision: revision.task_revision.clone(),
            priority: run.priority,
            queued_at_ms: run.queued_at,
            attempt_created_at_ms: run.attempt_created_at,
            attempt_number: run.attempt_number,
            executor_type: ExecutorType::RemoteWorker,
        },
        worker: OfferWorker {
            worker_id: lease.worker_id.clone(),
            session_id: lease.session_id.clone(),
            generation: lease.worker_generation,
        },
        lease: OfferedLease {
            version: lease.version,
            lease_generation: lease.lease_generation,
            acquired_at_ms: lease.acquired_at,
            renewed_at_ms: lease.renewed_at,
            expires_at_ms: lease.expires_at,
            updated_at_ms: lease.updated_at,
        },
        execution_revision: revision.clone(),
        placement_score,
    }
}

/// A simplified `evaluateRemoteWorkerPlacement`: `Some(score)` when every hard requirement the
/// model knows holds (executors, architectures, support tiers, operating systems, labels,
/// features, runtimes by name, memory, disk, GPU vendor), `None` otherwise. A protocol version
/// range or a runtime version range is not evaluated and never matches. The score is the sum of
/// the weights of the preferences whose labels all match.
pub(crate) fn placement_score(caps: &Capabilities, placement: Option<&Placement>) -> Option<u64> {
    let Some(placement) = placement else {
        return Some(0);
    };
    let labels = caps.labels.as_deref().unwrap_or_default();
    let has_label =
        |key: &str, value: &str| labels.iter().any(|l| l.key == key && l.value == value);
    if let Some(req) = &placement.required {
        let all = |list: &Option<Vec<String>>, have: &[String]| {
            list.as_ref()
                .is_none_or(|l| l.iter().all(|x| have.contains(x)))
        };
        let capacity = caps.capacity.as_ref();
        let ok = all(&req.executors, &caps.executors)
            && req
                .architectures
                .as_ref()
                .is_none_or(|a| a.contains(&caps.architecture))
            && req
                .support_tiers
                .as_ref()
                .is_none_or(|t| t.contains(&caps.support_tier))
            && req.operating_systems.as_ref().is_none_or(|os| {
                caps.operating_system
                    .as_ref()
                    .is_some_and(|mine| os.contains(mine))
            })
            && req
                .labels
                .as_ref()
                .is_none_or(|ls| ls.iter().all(|l| has_label(&l.key, &l.value)))
            && all(&req.features, caps.features.as_deref().unwrap_or_default())
            && req.runtimes.as_ref().is_none_or(|rs| {
                rs.iter().all(|r| {
                    r.version_range.is_none()
                        && caps
                            .runtimes
                            .as_ref()
                            .is_some_and(|mine| mine.iter().any(|m| m.name == r.name))
                })
            })
            && req.protocol_version_range.is_none()
            && req.min_memory_bytes.is_none_or(|min| {
                capacity
                    .and_then(|c| c.memory_bytes)
                    .is_some_and(|m| m >= min)
            })
            && req.min_disk_bytes.is_none_or(|min| {
                capacity
                    .and_then(|c| c.disk_bytes)
                    .is_some_and(|d| d >= min)
            })
            && req.gpu_vendor.as_ref().is_none_or(|vendor| {
                capacity
                    .and_then(|c| c.gpu.as_ref())
                    .is_some_and(|gpus| gpus.iter().any(|g| &g.vendor == vendor))
            });
        if !ok {
            return None;
        }
    }
    let score = placement
        .preferred
        .iter()
        .flatten()
        .filter(|p| p.labels.iter().all(|l| has_label(&l.key, &l.value)))
        .map(|p| p.weight)
        .sum();
    Some(score)
}
