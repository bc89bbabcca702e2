//! The completion coordinator (ADR-0116 §3, §5; reference §4.5; SPEC §7): authenticate the
//! receipt, upload the log, **then** report completion, **then** persist
//! `completion_acknowledged`, and only then remove the receipt.
//!
//! ```text
//! read record ─► completion_acknowledged? remove receipt (cleanup) ─► done
//!            ─► eligible? (launching | started | running_acknowledged |
//!                          recovery_required(launch_outcome_unknown); Session and lease live)
//!            ─► read receipt ─► authenticate ─► inspect log ─► upload (streamed, hashed)
//!            ─► completion ─► completion_acknowledged (durable) ─► remove receipt
//! ```
//!
//! Any failure leaves receipt, record and spool as they were so the whole sequence can be
//! replayed; the control plane deduplicates by id, digest and fence. This coordinator never
//! asks to delete a log.
//!
//! Each state takes the one kind of reply its action is answered with (`io::Reply`) and matches
//! every value of that kind: no wildcard arm (CONVENTIONS C7).
#![deny(clippy::wildcard_enum_match_arm)]

use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;

use zeroize::Zeroizing;

use crate::ids::{OfferId, Sha256Digest};
use crate::io::{Action, HttpCall, ReceiptRead, Reply, StoreFailure};
use crate::receipt::{AuthenticatedReceipt, ReceiptError, authenticate};
use crate::record::{InboxRecord, RecoveryReason, State};
use crate::wire::artifact::{self, ArtifactReceipt, ArtifactUpload};
use crate::wire::completion::{
    CompletionArtifact, CompletionRequest, CompletionResponse, CompletionResult, CompletionStatus,
};
use crate::wire::route::{Operation, path};
use crate::wire::{Fence, WireError};
use crate::worker::{CallFault, next_record, parse_fault, persist};
use crate::worker::{Ctx, Step, read_failure, write_failure};

/// How the receipt cleanup after a durable acknowledgement went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cleanup {
    /// Removed.
    Removed,
    /// It was already gone.
    AlreadyAbsent,
    /// Removal failed; retried on the next pass (the record is already settled).
    Pending,
}

/// What one completion pass concluded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompletionOutcome {
    /// No such record.
    NotFound,
    /// Was already acknowledged; the receipt cleanup ran.
    AlreadyCompleted(Cleanup),
    /// Completion applied and durably acknowledged now.
    Acknowledged(Cleanup),
    /// Not eligible now (state, Session or lease); nothing changed.
    Deferred,
    /// No receipt yet (the process is still running, or died without one).
    ReceiptMissing,
    /// The receipt store could not be read.
    ReceiptUnavailable,
    /// The receipt does not authenticate; kept as evidence, nothing uploaded.
    ReceiptInvalid(Option<ReceiptError>),
    /// No spool file for the log.
    ArtifactMissing,
    /// The spool refused.
    ArtifactUnavailable,
    /// The upload answer or the bytes sent do not match.
    ArtifactResponseInvalid(String),
    /// The completion answer does not match.
    CompletionResponseInvalid(String),
    /// The control plane settled the Run otherwise (`already_terminal`); the inbox is unchanged.
    ControlPlaneTerminal,
    /// A call got no usable answer (none, an uncertain one, or one that is not the contract's
    /// JSON): retried at the next pass.
    Unavailable,
    /// A call was refused.
    Refused(CallFault),
    /// A write failed cleanly.
    StorageUnchanged,
}

impl CompletionOutcome {
    /// What a failed call means for the completion: no usable answer (none, or not the
    /// contract's JSON) is lost, as a dropped one (issue 17), and retried at the next pass; an
    /// answer that breaks the contract is `invalid`; any other fault refuses the completion.
    pub(crate) fn failed(fault: CallFault, invalid: fn(String) -> Self) -> Self {
        match fault {
            CallFault::Unavailable | CallFault::Uncertain(_) => Self::Unavailable,
            CallFault::Invalid(e) => invalid(format!("{e}")),
            fault @ (CallFault::Fenced { .. } | CallFault::Rejected { .. }) => Self::Refused(fault),
        }
    }
}

#[derive(Clone)]
#[cfg_attr(feature = "sim-hooks", derive(Hash))]
enum CompletionState {
    Reading,
    Cleaning(bool),
    ReadingReceipt(Box<InboxRecord>),
    Inspecting(Box<InboxRecord>, AuthenticatedReceipt),
    Uploading(Box<InboxRecord>, AuthenticatedReceipt, ArtifactUpload),
    /// The log is stored; the record is read again: a renewal may have run beside the upload
    /// (`worker::Lane::Lease`) and moved the lease the completion must name.
    Refreshing(
        Box<InboxRecord>,
        AuthenticatedReceipt,
        ArtifactUpload,
        Sha256Digest,
    ),
    /// The completion call in flight; `caught_up`: this is the one retry at the persisted lease
    /// version + 1 after a fence (see [`crate::supervision`]).
    Completing(Box<InboxRecord>, CompletionRequest, bool),
    Acknowledging(Box<InboxRecord>),
}

/// One completion pass for one offer.
#[derive(Clone)]
#[cfg_attr(feature = "sim-hooks", derive(Hash))]
pub(crate) struct CompletionOp {
    offer_id: OfferId,
    state: CompletionState,
}

type CStep = Step<CompletionOp, CompletionOutcome>;

/// The record a `ReadRecord` returned, or how the operation ends without one: `not_found`, or
/// `unchanged` after a transient failure (unsafe storage halts).
// The step is returned at once by every caller; boxing it would only add an allocation.
#[allow(clippy::result_large_err)]
pub(crate) fn read_record<S, R>(
    read: Result<Option<Box<InboxRecord>>, StoreFailure>,
    not_found: R,
    unchanged: R,
) -> Result<Box<InboxRecord>, Step<S, R>> {
    match read {
        Ok(Some(record)) => Ok(record),
        Ok(None) => Err(Step::Done(not_found)),
        Err(failure) => Err(read_failure(failure, || Step::Done(unchanged))),
    }
}

/// The JSON POST of `body` to `operation`'s route, under that operation's caps (every
/// operation the Worker posts to has both).
pub(crate) fn post(ctx: &Ctx<'_>, operation: Operation, body: Zeroizing<Vec<u8>>) -> Action {
    Action::Post(HttpCall {
        path: path(&ctx.config.worker_id, &ctx.config.session_id, operation),
        body,
        request_cap: operation
            .request_cap()
            .expect("invariant: every operation the Worker posts to has a request cap"),
        response_cap: operation
            .response_cap()
            .expect("invariant: every operation the Worker posts to has a response cap"),
    })
}

/// A call's answer, parsed by `parse` (the body is wiped on drop), or its fault: the call
/// failed, answered a body that is not the contract's JSON (an uncertain outcome: issue 17), or
/// one of the contract's shape that breaks its rules ([`CallFault::Invalid`]; see
/// [`parse_fault`]).
pub(crate) fn answer<T>(
    reply: Reply,
    parse: impl FnOnce(&[u8]) -> Result<T, WireError>,
) -> Result<T, CallFault> {
    let body = Zeroizing::new(reply.call()?);
    parse(&body).map_err(parse_fault)
}

/// Completion is possible from these states, with the launch barrier fields present.
pub(crate) fn eligible_state(record: &InboxRecord) -> bool {
    match record.state {
        State::Launching | State::Started | State::RunningAcknowledged => true,
        State::RecoveryRequired => {
            record.recovery_reason == Some(RecoveryReason::LaunchOutcomeUnknown)
        }
        State::Accepted
        | State::StartingAcknowledged
        | State::StartFailed
        | State::StartFailureAcknowledged
        | State::CompletionAcknowledged => false,
    }
}

impl CompletionOp {
    /// A pass that reads the record first.
    pub(crate) fn begin(offer_id: OfferId) -> (Self, Action) {
        let action = Action::ReadRecord {
            offer_id: offer_id.clone(),
        };
        let state = CompletionState::Reading;
        (Self { offer_id, state }, action)
    }

    fn wait(self, state: CompletionState, action: Action) -> CStep {
        Step::Wait(Self { state, ..self }, action)
    }

    /// Reads the record, then goes on in `state`.
    fn reading(self, state: CompletionState) -> CStep {
        let offer_id = self.offer_id.clone();
        self.wait(state, Action::ReadRecord { offer_id })
    }

    pub(crate) fn resume(mut self, ctx: &Ctx<'_>, reply: Reply) -> CStep {
        match core::mem::replace(&mut self.state, CompletionState::Reading) {
            CompletionState::Reading => self.on_record(ctx, reply.record()),
            CompletionState::Cleaning(fresh) => {
                let cleanup = match reply.receipt_removal() {
                    Ok(true) => Cleanup::Removed,
                    Ok(false) => Cleanup::AlreadyAbsent,
                    Err(_) => Cleanup::Pending,
                };
                Step::Done(if fresh {
                    CompletionOutcome::Acknowledged(cleanup)
                } else {
                    CompletionOutcome::AlreadyCompleted(cleanup)
                })
            }
            CompletionState::ReadingReceipt(record) => {
                self.on_receipt(ctx, record, reply.receipt())
            }
            CompletionState::Inspecting(record, receipt) => {
                self.on_log(ctx, record, receipt, reply.log_inspection())
            }
            CompletionState::Uploading(record, receipt, upload) => {
                self.on_upload(ctx, record, receipt, upload, reply.upload())
            }
            CompletionState::Refreshing(record, receipt, upload, sha256) => {
                self.on_refreshed(ctx, &record, &receipt, &upload, sha256, reply.record())
            }
            CompletionState::Completing(record, request, caught_up) => {
                self.on_completion(ctx, record, &request, caught_up, reply)
            }
            CompletionState::Acknowledging(record) => match reply.durable() {
                Ok(()) => self.remove_receipt(&record, true),
                Err(failure) => {
                    write_failure(failure, || Step::Done(CompletionOutcome::StorageUnchanged))
                }
            },
        }
    }

    fn remove_receipt(self, record: &InboxRecord, fresh: bool) -> CStep {
        let attempt_id = record.offer.candidate.attempt_id.clone();
        let action = Action::RemoveReceipt { attempt_id };
        self.wait(CompletionState::Cleaning(fresh), action)
    }

    /// Steps 1–2: read, shortcut, eligibility.
    fn on_record(
        self,
        ctx: &Ctx<'_>,
        read: Result<Option<Box<InboxRecord>>, StoreFailure>,
    ) -> CStep {
        let record = match read_record(
            read,
            CompletionOutcome::NotFound,
            CompletionOutcome::StorageUnchanged,
        ) {
            Ok(record) => record,
            Err(step) => return step,
        };
        if record.state == State::CompletionAcknowledged {
            return self.remove_receipt(&record, false);
        }
        let session_ok = ctx.serves(&record.offer.worker);
        let barrier = record.executor_started_at_ms.is_some()
            && record.log_artifact_id.is_some()
            && record.completion_receipt_callback_sequence.is_some()
            && record.completion_receipt_token_digest.is_some();
        if !eligible_state(&record) || !session_ok || ctx.lease_expired(&record) || !barrier {
            return Step::Done(CompletionOutcome::Deferred);
        }
        let attempt_id = record.offer.candidate.attempt_id.clone();
        let action = Action::ReadReceipt { attempt_id };
        self.wait(CompletionState::ReadingReceipt(record), action)
    }

    /// Steps 3–4: read and authenticate the receipt.
    fn on_receipt(self, ctx: &Ctx<'_>, record: Box<InboxRecord>, read: ReceiptRead) -> CStep {
        let receipt = match read {
            ReceiptRead::Present(receipt) => receipt,
            ReceiptRead::Absent => return Step::Done(CompletionOutcome::ReceiptMissing),
            ReceiptRead::Invalid => return Step::Done(CompletionOutcome::ReceiptInvalid(None)),
            ReceiptRead::Unavailable => return Step::Done(CompletionOutcome::ReceiptUnavailable),
        };
        let authenticated = match authenticate(&receipt, &record, ctx.now) {
            Ok(authenticated) => authenticated,
            Err(error) => return Step::Done(CompletionOutcome::ReceiptInvalid(Some(error))),
        };
        drop(receipt);
        let Some(log_artifact_id) = record.log_artifact_id.clone() else {
            return Step::Done(CompletionOutcome::Deferred);
        };
        let action = Action::InspectLog { log_artifact_id };
        self.wait(CompletionState::Inspecting(record, authenticated), action)
    }

    /// Step 5–6: measure the log, then stream it.
    fn on_log(
        self,
        ctx: &Ctx<'_>,
        record: Box<InboxRecord>,
        receipt: AuthenticatedReceipt,
        spool: Result<(u64, Option<bool>), CompletionOutcome>,
    ) -> CStep {
        let (byte_length, truncated) = match spool {
            Ok(inspected) => inspected,
            Err(outcome) => return Step::Done(outcome),
        };
        // INVARIANT: `on_receipt` inspects only a record with a log artifact id.
        let log_artifact_id = record.log_artifact_id.clone().expect("invariant: a log id");
        let upload = ArtifactUpload {
            fence: Fence::from_offer(&record.offer),
            log_artifact_id,
            byte_length,
            truncated,
        };
        self.upload(ctx, record, receipt, upload)
    }

    /// Step 6: stream the log under `upload`'s fence.
    fn upload(
        self,
        ctx: &Ctx<'_>,
        record: Box<InboxRecord>,
        receipt: AuthenticatedReceipt,
        upload: ArtifactUpload,
    ) -> CStep {
        let log_artifact_id = upload.log_artifact_id.clone();
        let header = match upload.header_json() {
            Ok(header) => header,
            Err(e) => {
                return Step::Done(CompletionOutcome::ArtifactResponseInvalid(format!("{e}")));
            }
        };
        let action = Action::UploadLog {
            path: path(
                &ctx.config.worker_id,
                &ctx.config.session_id,
                Operation::Artifacts,
            ),
            log_artifact_id,
            header,
            byte_length: upload.byte_length,
            response_cap: artifact::MAX_RESPONSE_BYTES,
        };
        self.wait(CompletionState::Uploading(record, receipt, upload), action)
    }

    /// Step 6: verify the upload against what was actually sent, then read the record again.
    fn on_upload(
        self,
        ctx: &Ctx<'_>,
        record: Box<InboxRecord>,
        receipt: AuthenticatedReceipt,
        upload: ArtifactUpload,
        sent: Result<(Vec<u8>, u64, Sha256Digest), CompletionOutcome>,
    ) -> CStep {
        let (body, sent_bytes, sent_sha256) = match sent {
            Ok(sent) => sent,
            // Fenced at the persisted lease version: as the completion (step 8), once more one
            // version on. A renewal may have committed without its answer reaching the disk, or
            // a completion named that version and committed (the control plane then takes only
            // an exact replay of its upload).
            Err(CompletionOutcome::Refused(CallFault::Fenced { code }))
                if upload.fence.expected_lease_version == record.offer.lease.version =>
            {
                return match upload.fence.one_version_on() {
                    Some(fence) => {
                        let next = ArtifactUpload { fence, ..upload };
                        self.upload(ctx, record, receipt, next)
                    }
                    None => Step::Done(CompletionOutcome::Refused(CallFault::Fenced { code })),
                };
            }
            Err(outcome) => return Step::Done(outcome),
        };
        if sent_bytes != upload.byte_length {
            return Step::Done(CompletionOutcome::ArtifactResponseInvalid(format!(
                "sent {sent_bytes} bytes, declared {}",
                upload.byte_length
            )));
        }
        let stored = match ArtifactReceipt::parse(&body, &upload, &sent_sha256) {
            Ok(stored) => stored,
            Err(e) => {
                let invalid = CompletionOutcome::ArtifactResponseInvalid;
                return Step::Done(CompletionOutcome::failed(parse_fault(e), invalid));
            }
        };
        self.reading(CompletionState::Refreshing(
            record,
            receipt,
            upload,
            stored.sha256,
        ))
    }

    /// Step 7: report completion under the lease as it is now. A renewal beside the upload
    /// moves only the lease (and the revision); anything else that changed (the Run was
    /// stopped and recorded, another Attempt) defers to the next pass.
    fn on_refreshed(
        self,
        ctx: &Ctx<'_>,
        before: &InboxRecord,
        receipt: &AuthenticatedReceipt,
        upload: &ArtifactUpload,
        sha256: Sha256Digest,
        read: Result<Option<Box<InboxRecord>>, StoreFailure>,
    ) -> CStep {
        let record = match read_record(
            read,
            CompletionOutcome::NotFound,
            CompletionOutcome::StorageUnchanged,
        ) {
            Ok(record) => record,
            Err(step) => return step,
        };
        let moved = record.revision != before.revision;
        if moved
            && (record.state != before.state
                || record.offer.candidate != before.offer.candidate
                || ctx.lease_expired(&record))
        {
            return Step::Done(CompletionOutcome::Deferred);
        }
        let (Some(digest), Some(log_artifact_id)) = (
            record.completion_receipt_token_digest,
            record.log_artifact_id.clone(),
        ) else {
            return Step::Done(CompletionOutcome::Deferred);
        };
        // An upload caught up one version on (step 6) names the version the completion must
        // name too, unless a renewal beside it moved the record further.
        let mut fence = Fence::from_offer(&record.offer);
        let caught_up = upload.fence.expected_lease_version > fence.expected_lease_version;
        if caught_up {
            fence.expected_lease_version = upload.fence.expected_lease_version;
        }
        let request = CompletionRequest {
            fence,
            callback_sequence: receipt.callback_sequence,
            callback_token_digest: digest,
            result: CompletionResult::from_exit(
                receipt.started_at_ms,
                receipt.finished_at_ms,
                receipt.exit_code,
            ),
            artifact: CompletionArtifact {
                log_artifact_id,
                byte_length: upload.byte_length,
                sha256,
                truncated: upload.truncated,
            },
        };
        self.complete(ctx, record, request, caught_up)
    }

    /// Step 7: the completion call.
    fn complete(
        self,
        ctx: &Ctx<'_>,
        record: Box<InboxRecord>,
        request: CompletionRequest,
        caught_up: bool,
    ) -> CStep {
        let body = match request.to_body() {
            Ok(body) => body,
            Err(e) => {
                return Step::Done(CompletionOutcome::CompletionResponseInvalid(format!("{e}")));
            }
        };
        let action = post(ctx, Operation::Completion, body);
        self.wait(
            CompletionState::Completing(record, request, caught_up),
            action,
        )
    }

    /// Steps 8–9: terminal elsewhere, or durable acknowledgement.
    fn on_completion(
        self,
        ctx: &Ctx<'_>,
        record: Box<InboxRecord>,
        request: &CompletionRequest,
        caught_up: bool,
        reply: Reply,
    ) -> CStep {
        let answer = match answer(reply, |body| CompletionResponse::parse(body, request)) {
            Ok(answer) => answer,
            // Fenced at the persisted lease version: a renewal may have committed without its
            // answer reaching the disk (issue 17). Once more at the version it would have left;
            // an exact replay of a completion that did commit answers `already_completed` there
            // too (the control plane's lease is then at that version + 1).
            Err(CallFault::Fenced { code }) if !caught_up => {
                return match request.fence.one_version_on() {
                    Some(fence) => {
                        let next = CompletionRequest {
                            fence,
                            ..request.clone()
                        };
                        self.complete(ctx, record, next, true)
                    }
                    None => Step::Done(CompletionOutcome::Refused(CallFault::Fenced { code })),
                };
            }
            Err(fault) => {
                let invalid = CompletionOutcome::CompletionResponseInvalid;
                return Step::Done(CompletionOutcome::failed(fault, invalid));
            }
        };
        match answer.status {
            CompletionStatus::AlreadyTerminal => {
                Step::Done(CompletionOutcome::ControlPlaneTerminal)
            }
            CompletionStatus::Applied | CompletionStatus::AlreadyCompleted => {
                let now = ctx.now.max(record.updated_at_ms);
                let proposed = next_record(&record, State::CompletionAcknowledged, now, |r| {
                    r.recovery_reason = None;
                    r.completion_acknowledged_at_ms = Some(now);
                });
                let action = persist(&record, proposed.clone());
                self.wait(CompletionState::Acknowledging(Box::new(proposed)), action)
            }
        }
    }
}
