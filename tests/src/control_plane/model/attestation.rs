//! `attestations` (reference §2.11): a control-plane-only route the Worker never calls. The model
//! checks the complete execution fence carried by the body against the live Attempt and answers
//! 201 (created) or 200 (exact replay); a stale fence is 409 `worker_attestation_fenced`.

use crate::json_writer::JsonWriter;
use ql_worker_core::ids::CapabilityDigest;
use ql_worker_core::wire::activation::AttemptStatus;
use ql_worker_core::wire::error::ErrorCode;

use super::{ControlPlane, CpResponse, Ctx, Handled};
use crate::control_plane::requests::{self, AttestationRequest, AttestationState, Reject};
use crate::control_plane::state::{AttestationRecord, LeaseState};

fn fenced(reason: &'static str) -> Reject {
    Reject::new(ErrorCode::WorkerAttestationFenced, reason)
}

/// Every fence fact of the body, in one comparable string (no capability: only its digest).
fn fence_text(r: &AttestationRequest) -> String {
    format!(
        "{}|{}|{}|{}|{}|{}|{}|{}|{}",
        r.worker_generation.get(),
        r.lease_token_digest.to_hex(),
        r.lease_generation.get(),
        r.lease_version.get(),
        r.offer_id.as_str(),
        r.callback_sequence.get(),
        r.executor_handle.as_str(),
        r.journal_revision,
        r.state.as_str(),
    )
}

fn answer(record: &AttestationRecord, id: &str, replay: bool) -> CpResponse {
    let mut w = JsonWriter::with_cap(4096);
    w.begin_object()
        .field_str("attestationId", id)
        .field_uint("sequence", record.sequence)
        .field_str("state", record.state.as_str())
        .field_uint("receivedAtMs", record.received_at.get())
        .key("replay")
        .bool(replay)
        .end_object();
    let body = w.finish().map(|b| b.to_vec()).unwrap_or_default();
    CpResponse::with_status(if replay { 200 } else { 201 }, body)
}

impl ControlPlane {
    /// `attestations`: exact replay of a known id ⇒ 200 `replay: true`; a new id must match the
    /// Attempt's current lease (offer, generations, token digest, version), its callback sequence
    /// and executor handle, come from the current Session, carry a sequence above every earlier
    /// one, and claim `running` only while the Attempt runs ⇒ 201.
    pub(super) fn attestations(&mut self, ctx: &Ctx<'_>, body: &[u8]) -> Handled {
        let request = requests::attestation(body)?;
        ctx.storage()?;
        let fence = fence_text(&request);
        if let Some(existing) = self.state.attestations.get(&request.attestation_id) {
            let same = &existing.worker_id == ctx.worker_id()
                && &existing.session_id == ctx.session_id()
                && existing.run_id == request.run_id
                && existing.attempt_id == request.attempt_id
                && existing.sequence == request.sequence
                && existing.fence == fence;
            if !same {
                return Err(fenced("attestation replay differs"));
            }
            return Ok((answer(existing, &request.attestation_id, true), "replay"));
        }
        let run = self
            .state
            .runs
            .get(&request.run_id)
            .ok_or(fenced("missing"))?;
        let lease = run.lease.as_ref().ok_or(fenced("not claimed"))?;
        let authority = run.attempt_id == request.attempt_id
            && lease.state == LeaseState::Leased
            && lease.offer_id == request.offer_id
            && &lease.worker_id == ctx.worker_id()
            && &lease.session_id == ctx.session_id()
            && lease.worker_generation == request.worker_generation
            && lease.lease_generation == request.lease_generation
            && lease.version == request.lease_version
            && lease.token_digest == CapabilityDigest::new(request.lease_token_digest)
            && run.callback_sequence == request.callback_sequence.get()
            && run.executor_handle.as_ref() == Some(&request.executor_handle)
            && self.session_current(ctx.worker_id(), ctx.session_id(), request.worker_generation);
        if !authority {
            return Err(fenced("authority mismatch"));
        }
        let state_ok = match request.state {
            AttestationState::Running => run.attempt_status == Some(AttemptStatus::Running),
            AttestationState::Stopped => run.is_live(),
        };
        if !state_ok {
            return Err(fenced("state mismatch"));
        }
        let newer = self
            .state
            .attestations
            .values()
            .filter(|a| a.run_id == request.run_id && a.attempt_id == request.attempt_id)
            .all(|a| a.sequence < request.sequence);
        if !newer {
            return Err(fenced("sequence not increasing"));
        }
        let record = AttestationRecord {
            worker_id: ctx.worker_id().clone(),
            session_id: ctx.session_id().clone(),
            run_id: request.run_id.clone(),
            attempt_id: request.attempt_id.clone(),
            sequence: request.sequence,
            state: request.state,
            fence,
            received_at: ctx.now,
        };
        let response = answer(&record, &request.attestation_id, false);
        self.state
            .attestations
            .insert(request.attestation_id.clone(), record);
        Ok((response, "created"))
    }
}
