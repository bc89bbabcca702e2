//! The Pull coordinator (reference §4.1; ADR-0110): one stable pending claim, persisted
//! **before** the request is sent, reused with the same offer id and lease token across
//! failures and restarts until the offer is durably in the inbox or the control plane is idle.
//!
//! Steps of one Pull:
//! 1. read the claim; a claim of another Session can never be admitted, so it is cleared (the
//!    reference fails with `claim_conflict` forever instead); no claim ⇒ draw entropy for a
//!    fresh offer id (UUIDv4) and a 32-byte lease token;
//! 2. a claim whose `nextAttemptAtMs` is in the future ⇒ `Backoff` without a request; a claim
//!    whose offer is already in the inbox (a crash between storing the offer and clearing the
//!    claim) is cleared rather than replayed — a replay is fenced once the Run's lease moves on;
//! 3. after 16 attempts the claim is cleared (nothing of it reached the inbox) and the next Pull
//!    starts afresh;
//! 4. persist the attempt (revision + 1, attempt count + 1) — durable before sending;
//! 5. POST `offers`;
//! 6. idle ⇒ clear the claim; offered ⇒ admit against the claim and Session, store the offer
//!    (new: publish `accepted` at revision 0; replay: keep the stored record, or advance only
//!    its lease when the delivered version is newer) and **then** clear the claim;
//! 7. any failure ⇒ `nextAttemptAtMs = now + floor(r · min(60 s, base · 2^(attempts-1)))` with
//!    `r` from fresh entropy (full jitter), persisted, and the claim kept — except an offer
//!    refused for good ([`refused_for_good`]): its claim is cleared at once, the Pull ends with
//!    [`PullResult::Refused`], and the next Pull makes a fresh claim (the reference retries such
//!    an offer 16 times with backoff, pulling nothing else meanwhile); likewise a replay the
//!    control plane fences (409 `worker_offer_fenced`: [`PullResult::Fenced`]).
//!
//! While the inbox is full, the Worker sends no Pull, except a **claim-only** one when the
//! pending claim may name an offer already stored (at start, or after a Pull that did not clear
//! its claim): read the claim, read its offer's record, and clear the claim if the offer is
//! stored ([`PullResult::ClaimChecked`]). It writes no claim and sends nothing; it exists
//! because retention keeps a record while a claim names it, so a clear that failed just as the
//! inbox filled would otherwise keep the inbox full for good.
//!
//! Each state takes the one kind of reply its action is answered with (`io::Reply`) and matches
//! every value of that kind: no wildcard arm (CONVENTIONS C7).
#![deny(clippy::wildcard_enum_match_arm)]

use alloc::boxed::Box;
use alloc::format;
use alloc::string::String;

use base64::Engine as _;

use crate::capability::Entropy;
use crate::claim::{MAX_CLAIM_ATTEMPTS, PendingClaim};
use crate::completion::post;
use crate::ids::{LeaseToken, OfferId};
use crate::io::{Action, Reply, StoreFailure};
use crate::offer::Offer;
use crate::record::InboxRecord;
use crate::wire::WireError;
use crate::wire::error::ErrorCode;
use crate::wire::offer::{OfferRequest, OfferResponse, admit_offer};
use crate::wire::route::Operation;
use crate::worker::{CallFault, next_record, parse_fault, persist};
use crate::worker::{Ctx, Step, read_failure, register_backoff, write_failure};

/// Full-jitter ceiling (`MAX_WORKER_REMOTE_OFFER_BACKOFF_MS`).
pub(crate) const MAX_BACKOFF_MS: u64 = 60_000;

/// Why a Pull failed (the claim is kept and retried after a backoff).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PullFault {
    /// The request failed or was refused.
    Call(CallFault),
    /// The offered offer does not belong to the claim or Session, or is inconsistent.
    Admission(String),
    /// A stored record for this offer id has another authority.
    OfferConflict,
    /// The inbox is full.
    CapacityExhausted,
    /// A write failed cleanly (nothing changed).
    StorageUnchanged,
    /// The claim used its 16 attempts; it was cleared.
    BudgetExhausted,
}

/// What one Pull concluded.
#[derive(Clone, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "sim-hooks", derive(Hash))]
pub enum PullResult {
    /// The offer is durably in the inbox and the claim is cleared.
    Admitted {
        /// The offer.
        offer_id: OfferId,
        /// Whether it was already stored (a replay).
        replayed: bool,
    },
    /// The control plane had nothing; the claim is cleared.
    Idle,
    /// The offered offer was refused for a reason its claim cannot change (see
    /// [`refused_for_good`]). Nothing was stored, so nothing can run; the claim is cleared and
    /// the control plane's lease for it expires by itself.
    Refused {
        /// The cleared claim's offer id.
        offer_id: OfferId,
        /// Why (names the field and rule; never a value).
        reason: WireError,
    },
    /// The control plane fenced the claim's offer id (409 `worker_offer_fenced`: the lease it
    /// holds for that offer id expired, moved on or belongs to another Session). No retry of the
    /// claim can be admitted and its offer is not stored, so the claim is cleared and the next
    /// Pull makes a fresh one at once (the reference retries it 16 times with backoff).
    Fenced {
        /// The cleared claim's offer id.
        offer_id: OfferId,
    },
    /// The claim's next attempt is in the future; no request was sent.
    Backoff {
        /// How long until the claim may be retried (at most [`MAX_BACKOFF_MS`]).
        retry_in_ms: u64,
    },
    /// The Pull failed; the claim is kept (or cleared after its budget).
    Failed {
        /// Why.
        fault: PullFault,
        /// How long until the next Pull (0: the next tick).
        retry_in_ms: u64,
    },
    /// No usable Session.
    SessionUnavailable,
    /// A check of the pending claim alone, made while the inbox is full (nothing is pulled): a
    /// claim whose offer is already stored was cleared, so that retention may free that
    /// record's place.
    ClaimChecked {
        /// A claim remains whose offer is not stored (a Pull with room retries it).
        pending: bool,
    },
}

/// A step of a Pull.
type PullStep = Step<PullOp, PullResult>;

/// A Pull in flight.
#[derive(Clone, Debug)]
#[cfg_attr(feature = "sim-hooks", derive(Hash))]
pub(crate) enum PullOp {
    ReadingClaim {
        /// The pending claim's backoff was waited out in this process: its persisted
        /// wall-clock time is not compared again (`ClaimView::Pending::timed_here`).
        backoff_served: bool,
        /// The inbox is full: only a claim whose offer is already stored is settled.
        claim_only: bool,
    },
    ClearingForeign,
    DrawingIdentity,
    PersistingAttempt(Box<PendingClaim>),
    Requesting(Box<PendingClaim>),
    ReadingRecord(Box<PendingClaim>, Box<Offer>),
    StoringOffer {
        claim: Box<PendingClaim>,
        replayed: bool,
    },
    CheckingStored(Box<PendingClaim>),
    ClearingStale,
    /// The claim-only check: is the claim's offer stored?
    CheckingStoredOnly(Box<PendingClaim>),
    DrawingJitter(Box<PendingClaim>, PullFault),
    /// The last write of the Pull (a claim cleared, or its backoff persisted): once it is
    /// durable, the Pull ends with this result.
    Settling(PullResult),
}

impl PullOp {
    /// Whether the write awaited stores a lease granted in answer to a request of this very
    /// operation: the offer of a claim's first attempt (a retried claim may be answered with a
    /// lease the control plane granted to an earlier attempt, before this operation began).
    pub(crate) fn grants_lease(&self) -> bool {
        matches!(self, Self::StoringOffer { claim, .. } if claim.attempt_count == 1)
    }

    /// `claim_only`: the inbox is full; only a claim whose offer is already stored is settled
    /// (cleared), nothing is pulled.
    pub(crate) fn begin(ctx: &Ctx<'_>, backoff_served: bool, claim_only: bool) -> PullStep {
        match ctx.session {
            Some(s) if s.usable(ctx.mono) => {
                let state = Self::ReadingClaim {
                    backoff_served,
                    claim_only,
                };
                Step::Wait(state, Action::ReadClaim)
            }
            Some(_) | None => Step::Done(PullResult::SessionUnavailable),
        }
    }

    pub(crate) fn resume(self, ctx: &Ctx<'_>, reply: Reply) -> PullStep {
        match self {
            Self::ReadingClaim {
                backoff_served,
                claim_only: false,
            } => on_claim(ctx, backoff_served, reply.claim()),
            Self::ReadingClaim {
                claim_only: true, ..
            } => on_claim_only(reply.claim()),
            Self::ClearingForeign | Self::ClearingStale => after_write(reply, draw_identity),
            Self::DrawingIdentity => fresh_claim(ctx, &reply.entropy()),
            Self::PersistingAttempt(claim) => {
                let request = request(ctx, claim);
                after_write(reply, move || request)
            }
            Self::Requesting(claim) => on_response(ctx, claim, reply),
            Self::ReadingRecord(claim, offer) => on_stored(ctx, claim, *offer, reply.record()),
            Self::StoringOffer { claim, replayed } => match reply.durable() {
                Ok(()) => clear_claim(&claim, replayed),
                Err(StoreFailure::CapacityExhausted) => {
                    backoff(claim, PullFault::CapacityExhausted)
                }
                Err(failure) => {
                    write_failure(failure, || backoff(claim, PullFault::StorageUnchanged))
                }
            },
            Self::CheckingStored(claim) => on_stored_check(ctx, &claim, reply.record()),
            Self::CheckingStoredOnly(claim) => on_stored_only(&claim, reply.record()),
            Self::DrawingJitter(claim, fault) => {
                persist_backoff(ctx, &claim, &reply.entropy(), fault)
            }
            Self::Settling(result) => after_write(reply, || Step::Done(result)),
        }
    }
}

/// Continues after a write that must be durable; halts on anything but a clean write.
fn after_write(reply: Reply, next: impl FnOnce() -> PullStep) -> PullStep {
    match reply.durable() {
        Ok(()) => next(),
        // A claim write that failed cleanly leaves the previous claim (or none) in place: the
        // Pull ends and the next tick starts over from what is stored.
        Err(failure) => write_failure(failure, storage_unchanged),
    }
}

/// A storage operation failed cleanly: the Pull ends and the next tick starts over from what is
/// stored.
fn storage_unchanged() -> PullStep {
    Step::Done(PullResult::Failed {
        fault: PullFault::StorageUnchanged,
        retry_in_ms: 0,
    })
}

fn draw_identity() -> PullStep {
    Step::Wait(PullOp::DrawingIdentity, Action::DrawEntropy)
}

fn on_claim(
    ctx: &Ctx<'_>,
    backoff_served: bool,
    read: Result<Option<Box<PendingClaim>>, StoreFailure>,
) -> PullStep {
    let claim = match read {
        Ok(claim) => claim,
        Err(failure) => return read_failure(failure, storage_unchanged),
    };
    let Some(session) = ctx.session else {
        return Step::Done(PullResult::SessionUnavailable);
    };
    let Some(claim) = claim else {
        return draw_identity();
    };
    if claim.worker() != session.worker {
        return clear(&claim, PullOp::ClearingForeign);
    }
    // The persisted time of the next attempt is on the wall clock of whoever wrote it: it is
    // honoured once, and never for longer than a backoff can last (a wall clock stepped back
    // would otherwise hold every Pull until it caught up). A backoff this process has waited
    // out on the monotonic clock is not compared again.
    if !backoff_served && claim.next_attempt_at_ms > ctx.now {
        return Step::Done(PullResult::Backoff {
            retry_in_ms: claim
                .next_attempt_at_ms
                .saturating_since(ctx.now)
                .min(MAX_BACKOFF_MS),
        });
    }
    // A crash between storing the offer and clearing its claim leaves a claim whose offer is
    // already in the inbox: replaying it would only be fenced (the lease moved on) and would
    // block every Pull through its backoff. Check the inbox before retrying.
    read_record(claim.offer_id.clone(), PullOp::CheckingStored(claim))
}

/// The claim-only check (the inbox is full): no claim ⇒ done; a claim (of any Session) ⇒ is its
/// offer stored?
fn on_claim_only(read: Result<Option<Box<PendingClaim>>, StoreFailure>) -> PullStep {
    match read {
        Ok(None) => Step::Done(PullResult::ClaimChecked { pending: false }),
        Ok(Some(claim)) => read_record(claim.offer_id.clone(), PullOp::CheckingStoredOnly(claim)),
        Err(failure) => read_failure(failure, storage_unchanged),
    }
}

/// The claim-only check: a claim whose offer is stored is cleared (retention may then remove
/// its record); one whose offer is not stored stays for a Pull with room.
fn on_stored_only(
    claim: &PendingClaim,
    read: Result<Option<Box<InboxRecord>>, StoreFailure>,
) -> PullStep {
    match read {
        Ok(Some(_)) => settle(claim, PullResult::ClaimChecked { pending: false }),
        Ok(None) => Step::Done(PullResult::ClaimChecked { pending: true }),
        Err(failure) => read_failure(failure, storage_unchanged),
    }
}

/// The claim's offer is not stored yet: retry it (backoff and budget rules of reference §4.1).
fn on_stored_check(
    ctx: &Ctx<'_>,
    claim: &PendingClaim,
    read: Result<Option<Box<InboxRecord>>, StoreFailure>,
) -> PullStep {
    match read {
        Ok(None) => {}
        Ok(Some(_)) => return clear(claim, PullOp::ClearingStale),
        Err(failure) => return read_failure(failure, storage_unchanged),
    }
    if claim.attempt_count >= MAX_CLAIM_ATTEMPTS {
        let (fault, retry_in_ms) = (PullFault::BudgetExhausted, 0);
        return settle(claim, PullResult::Failed { fault, retry_in_ms });
    }
    let mut next = claim.clone();
    // INVARIANT: a claim lives for at most 16 attempts and their backoffs.
    next.revision = claim.revision.next().unwrap_or(claim.revision);
    next.attempt_count += 1;
    next.last_attempt_at_ms = Some(ctx.now.max(claim.updated_at_ms));
    next.updated_at_ms = ctx.now.max(claim.updated_at_ms);
    next.next_attempt_at_ms = next.updated_at_ms;
    let action = Action::PersistClaim {
        expected: Some(claim.revision),
        claim: Box::new(next.clone()),
    };
    Step::Wait(PullOp::PersistingAttempt(Box::new(next)), action)
}

/// A fresh claim from entropy, with its first attempt already counted (one write instead of the
/// reference's create-then-attempt pair; the claim is still durable before the request).
fn fresh_claim(ctx: &Ctx<'_>, entropy: &Entropy) -> PullStep {
    let Some(session) = ctx.session else {
        return Step::Done(PullResult::SessionUnavailable);
    };
    let bytes = entropy.bytes();
    let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&bytes[16..48]);
    let mut random = [0u8; 16];
    random.copy_from_slice(&bytes[..16]);
    let offer_id = OfferId::new(uuid(random, 4)).expect("invariant: a UUIDv4 is an offer id");
    let lease_token =
        LeaseToken::new(token).expect("invariant: 43 base64url characters are a lease token");
    let mut claim = PendingClaim::new(&session.worker, offer_id, lease_token, ctx.now);
    claim.attempt_count = 1;
    claim.last_attempt_at_ms = Some(ctx.now);
    let action = Action::PersistClaim {
        expected: None,
        claim: Box::new(claim.clone()),
    };
    Step::Wait(PullOp::PersistingAttempt(Box::new(claim)), action)
}

/// Formats 16 bytes as a lowercase UUID (8-4-4-4-12 hex digits) of `version` (RFC 9562: its
/// version nibble and the variant `10` overwrite 6 of the bits).
pub(crate) fn uuid(mut bytes: [u8; 16], version: u8) -> String {
    bytes[6] = (bytes[6] & 0x0f) | (version << 4);
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let dash = |i| if matches!(i, 4 | 6 | 8 | 10) { "-" } else { "" };
    bytes
        .iter()
        .enumerate()
        .map(|(i, byte)| format!("{}{byte:02x}", dash(i)))
        .collect()
}

fn request(ctx: &Ctx<'_>, claim: Box<PendingClaim>) -> PullStep {
    let body = OfferRequest {
        worker_generation: claim.worker_generation,
        offer_id: claim.offer_id.clone(),
        lease_token: claim.lease_token.clone(),
    }
    .to_body();
    match body {
        Ok(body) => {
            let action = post(ctx, Operation::Offers, body);
            Step::Wait(PullOp::Requesting(claim), action)
        }
        Err(e) => backoff(claim, PullFault::Call(CallFault::Invalid(e))),
    }
}

fn on_response(ctx: &Ctx<'_>, claim: Box<PendingClaim>, reply: Reply) -> PullStep {
    let body = match reply.call() {
        Ok(body) => body,
        // The control plane holds a lease for this offer id that a replay can no longer use: it
        // expired, moved on, or belongs to another Session. Retrying the claim only meets the
        // same fence; the offer is not stored (checked before the replay), so nothing runs.
        Err(CallFault::Fenced { code: Some(c) }) if c == ErrorCode::WorkerOfferFenced.as_str() => {
            let offer_id = claim.offer_id.clone();
            return settle(&claim, PullResult::Fenced { offer_id });
        }
        Err(fault) => return backoff(claim, PullFault::Call(fault)),
    };
    match OfferResponse::parse(&body) {
        Err(reason) if refused_for_good(&reason) => {
            let offer_id = claim.offer_id.clone();
            settle(&claim, PullResult::Refused { offer_id, reason })
        }
        // Not the contract's JSON: an uncertain outcome (the offer may have been granted; the
        // claim is kept for the retry), as for every other call; otherwise a broken contract.
        Err(e) => backoff(claim, PullFault::Call(parse_fault(e))),
        Ok(OfferResponse::Idle { .. }) => settle(&claim, PullResult::Idle),
        Ok(OfferResponse::Offered { offer, .. }) => {
            // Admission binds the offer to the claim *and* to the current Session: a Session
            // that changed meanwhile makes the offer unadmittable and keeps the claim.
            let worker = match ctx.session {
                Some(s) if s.worker == claim.worker() => claim.worker(),
                Some(_) | None => {
                    return backoff(
                        claim,
                        PullFault::Admission(String::from("the Session changed")),
                    );
                }
            };
            match admit_offer(&offer, &claim.offer_id, &worker, &claim.lease_token) {
                Ok(offer) => read_record(
                    offer.offer_id.clone(),
                    PullOp::ReadingRecord(claim, Box::new(offer)),
                ),
                Err(e) => backoff(claim, PullFault::Admission(format!("{e}"))),
            }
        }
    }
}

/// Whether an `offered` response refused with `error` would be refused again for the same
/// claim: the verdict is on what the control plane pins for the Run (the execution revision, its
/// digest, the candidate's identity), and a retry of this claim is answered by rebuilding the same
/// offer (reference §2.2, lease recovery). Anything else — transport, size, the envelope's
/// JSON, lease timings, scan stats, a claim or Session mismatch — may change, and keeps the claim.
#[must_use]
pub fn refused_for_good(error: &WireError) -> bool {
    match error {
        WireError::Revision(_) => true,
        WireError::Field { path, .. } => {
            path.starts_with("offer.candidate.") || *path == "offer.executionDigest"
        }
        WireError::Mismatch { path, .. } => {
            matches!(*path, "offer.executionDigest" | "offer.executionRevision")
        }
        WireError::Size { .. }
        | WireError::Json { .. }
        | WireError::Request { .. }
        | WireError::RequestTooLarge { .. } => false,
    }
}

fn on_stored(
    ctx: &Ctx<'_>,
    claim: Box<PendingClaim>,
    offer: Offer,
    read: Result<Option<Box<InboxRecord>>, StoreFailure>,
) -> PullStep {
    let stored = match read {
        Ok(Some(stored)) => stored,
        Ok(None) => {
            let action = Action::PersistRecord {
                expected: None,
                record: Box::new(InboxRecord::accepted(offer, ctx.now)),
            };
            return storing(claim, false, action);
        }
        Err(failure) => {
            return read_failure(failure, || backoff(claim, PullFault::StorageUnchanged));
        }
    };
    if stored.offer.authority_difference(&offer, false).is_some() {
        return backoff(claim, PullFault::OfferConflict);
    }
    if offer.lease.version > stored.offer.lease.version {
        // A newer lease for the same authority: advance only the lease; the stored delivery
        // kind and state stay (see docs/state-machine.md).
        let proposed = next_record(&stored, stored.state, ctx.now, |r| {
            r.offer.lease = offer.lease
        });
        return storing(claim, true, persist(&stored, proposed));
    }
    clear_claim(&claim, true)
}

/// Writes the admitted offer's record (`action`), then clears `claim`.
fn storing(claim: Box<PendingClaim>, replayed: bool, action: Action) -> PullStep {
    Step::Wait(PullOp::StoringOffer { claim, replayed }, action)
}

fn clear_claim(claim: &PendingClaim, replayed: bool) -> PullStep {
    let offer_id = claim.offer_id.clone();
    settle(claim, PullResult::Admitted { offer_id, replayed })
}

/// Clears `claim`, then ends the Pull with `result`.
fn settle(claim: &PendingClaim, result: PullResult) -> PullStep {
    clear(claim, PullOp::Settling(result))
}

/// Clears `claim` (its offer id and revision), then goes on as `op`.
fn clear(claim: &PendingClaim, op: PullOp) -> PullStep {
    let action = Action::ClearClaim {
        offer_id: claim.offer_id.clone(),
        revision: claim.revision,
    };
    Step::Wait(op, action)
}

/// Reads the record of `offer_id`, then goes on as `op`.
fn read_record(offer_id: OfferId, op: PullOp) -> PullStep {
    Step::Wait(op, Action::ReadRecord { offer_id })
}

fn backoff(claim: Box<PendingClaim>, fault: PullFault) -> PullStep {
    Step::Wait(PullOp::DrawingJitter(claim, fault), Action::DrawEntropy)
}

fn persist_backoff(
    ctx: &Ctx<'_>,
    claim: &PendingClaim,
    entropy: &Entropy,
    fault: PullFault,
) -> PullStep {
    let now = ctx.now.max(claim.updated_at_ms);
    // Full jitter: `floor(r · min(60 s, base · 2^(max(0, attempts - 1))))`.
    let ceiling = register_backoff(ctx.config.backoff_base_ms, claim.attempt_count.into());
    let retry_in_ms = entropy.below(ceiling);
    let mut next = claim.clone();
    // INVARIANT: as above (`on_stored_check`).
    next.revision = claim.revision.next().unwrap_or(claim.revision);
    next.updated_at_ms = now;
    next.next_attempt_at_ms = now.saturating_add(retry_in_ms);
    let action = Action::PersistClaim {
        expected: Some(claim.revision),
        claim: Box::new(next),
    };
    let result = PullResult::Failed { fault, retry_in_ms };
    Step::Wait(PullOp::Settling(result), action)
}
