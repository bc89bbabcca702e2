//! The Worker Session exchanges (reference §2.10): register, heartbeat and transition.
//!
//! Each is one POST; the response is parsed against the request and becomes the Worker's
//! [`SessionView`]. Transport failures, 5xx, credential refusals (401/403, which also pause
//! admission: see `Worker::admission_paused`) and uncertain outcomes (issue 17: the exchange may
//! have taken effect but its answer was lost, timed out, came with a status other than 200 or
//! an error, or is not the contract's JSON) are not final: a heartbeat is retried at the next
//! tick, a register after a backoff; the Session lease then decides what stays usable. A 409 on
//! a heartbeat or transition (or an answer that breaks the version CAS) means the Session was
//! fenced — also what follows an uncertain heartbeat that did commit, since the control plane
//! then holds version + 1: the Worker registers it again with the same Session id (the
//! reference's resume: same generation, version + 1; `Fact::Rejoining`) and halts only if another
//! Session had replaced it meanwhile (two Workers with one worker id), or if the fences repeat
//! without an uncertain outcome to explain them. A register refused with 400, 404, 409, 413 or
//! 415 is final: the Worker halts.
//!
//! Each state takes the one kind of reply its action is answered with (`io::Reply`) and matches
//! every value of that kind: no wildcard arm (CONVENTIONS C7).
#![deny(clippy::wildcard_enum_match_arm)]

use alloc::format;
use alloc::string::String;
use alloc::vec::Vec;
use zeroize::Zeroizing;

use crate::completion::{answer, post};
use crate::ids::SessionId;
use crate::io::{Action, Reply};
use crate::offer::OfferWorker;
use crate::time::UnixMillis;
use crate::wire::WireError;
use crate::wire::route::Operation;
use crate::wire::session::{
    HeartbeatRequest, RegisterRequest, SessionResponse, SessionStatus, TransitionRequest,
};
use crate::worker::CallFault;
use crate::worker::{Ctx, SessionView, Step};

/// A step of a Session exchange.
type SStep = Step<SessionOp, SessionResult>;

/// A Session exchange in flight.
#[derive(Clone, Debug)]
pub(crate) enum SessionOp {
    /// A call to the control plane.
    Calling(SessionCall),
    /// A new Session id: entropy drawn for it, then the id persisted before it is registered.
    DrawingSessionId,
    PersistingSessionId(SessionId),
}

/// A Session call awaiting its answer.
#[derive(Clone, Debug)]
pub(crate) enum SessionCall {
    /// `rejoin`: registering again after a fence.
    Registering {
        rejoin: bool,
    },
    Heartbeating(HeartbeatRequest),
    Transitioning(TransitionRequest),
}

/// What a Session exchange concluded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SessionResult {
    /// Registered.
    Registered(SessionView),
    /// Heartbeat applied.
    Heartbeat(SessionView),
    /// Transition applied.
    Transitioned(SessionView),
    /// A new Session id is durable; the Worker registers it next.
    Renewed(SessionId),
    /// An exchange got no usable answer: no connection, 5xx, credentials refused (401/403), an
    /// uncertain outcome, or (register) an answer that breaks the contract. Nothing is final: a
    /// heartbeat is retried at the next tick, a register after a backoff.
    Unanswered {
        /// Which exchange.
        exchange: Exchange,
        /// Why.
        fault: CallFault,
    },
    /// 409 on a heartbeat or transition, or an answer that breaks its version CAS: this Session
    /// was fenced (register it again).
    Fenced(String),
    /// The register exchange was refused for good (400, 404, 409, 413, 415), or — registering
    /// again after a fence — the answer says another Session had replaced this one; or a
    /// heartbeat or transition was refused as malformed (400, 404, 413, 415); or a request could
    /// not be built.
    Rejected(String),
}

/// A Session exchange (`Display`: its name on the wire, e.g. `transition to draining`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exchange {
    /// `register` (first, or again after a fence), or the new Session id's durable write.
    Register,
    /// `heartbeat`.
    Heartbeat,
    /// `transition` to this status.
    Transition(SessionStatus),
}

/// The Session the response describes, with its local deadline on the monotonic clock: from
/// the sending of the register or heartbeat, the lease it asked for (`leaseDurationMs`), or
/// less when the control plane granted less. The answer carries only the plane's expiry, so
/// what it granted is read against this host's wall clock (`expiresAtMs - now`). That reading
/// is trusted only when it lies between zero and what was asked. Above it, the wall clock is
/// behind; at or below zero, it is ahead (a plane grants no lease that has already expired).
/// Either way the clock is off, and the lease asked for stands. A transition asks for no lease:
/// the deadline already known stays (none known: the same rule).
fn view(ctx: &Ctx<'_>, response: &SessionResponse, transition: bool) -> SessionView {
    let asked = ctx.config.session_lease_ms;
    let read = response.lease_expires_at_ms.saturating_since(ctx.now);
    let granted = Some(read)
        .filter(|r| (1..asked).contains(r))
        .unwrap_or(asked);
    let lease_deadline = match ctx.session {
        Some(known) if transition => known.lease_deadline,
        Some(_) | None => ctx.call_sent.saturating_add(granted),
    };
    SessionView {
        worker: OfferWorker {
            worker_id: response.worker_id.clone(),
            session_id: response.session_id.clone(),
            generation: response.generation,
        },
        version: response.version,
        status: response.status,
        lease_expires_at: response.lease_expires_at_ms,
        lease_deadline,
    }
}

impl SessionOp {
    /// `register` with the configured capabilities; `rejoin` after a fence (the answer must not
    /// say that another Session had replaced this one).
    pub(crate) fn register(ctx: &Ctx<'_>, available_slots: u64, rejoin: bool) -> SStep {
        let config = ctx.config;
        let max = u64::from(config.max_concurrent_runs);
        let request = RegisterRequest::new(
            &config.capabilities,
            max,
            available_slots.min(max),
            config.session_lease_ms,
        )
        .and_then(|r| r.to_body());
        SessionCall::Registering { rejoin }.send(ctx, Operation::Register, request)
    }

    /// `heartbeat` at the Session's current generation and version, offering `available_slots`
    /// (none while the Session is not online: the Worker's `start` sees to it).
    pub(crate) fn heartbeat(ctx: &Ctx<'_>, available_slots: u64) -> SStep {
        let Some(session) = ctx.session else {
            return unanswered(Exchange::Heartbeat);
        };
        let request = HeartbeatRequest {
            generation: session.worker.generation,
            expected_version: session.version,
            available_slots,
            lease_duration_ms: ctx.config.session_lease_ms,
        };
        let body = request.to_body();
        SessionCall::Heartbeating(request).send(ctx, Operation::Heartbeat, body)
    }

    /// `transition` to draining or offline.
    pub(crate) fn transition(ctx: &Ctx<'_>, status: SessionStatus) -> SStep {
        let Some(session) = ctx.session else {
            return unanswered(Exchange::Transition(status));
        };
        if session.status == status {
            return Step::Done(SessionResult::Transitioned(session.clone()));
        }
        let request = TransitionRequest {
            generation: session.worker.generation,
            expected_version: session.version,
            status,
        };
        let body = request.to_body();
        SessionCall::Transitioning(request).send(ctx, Operation::Transition, body)
    }

    /// A new Session id replaces the stored one (see [`Action::PersistSession`]).
    pub(crate) fn renew() -> SStep {
        Step::Wait(Self::DrawingSessionId, Action::DrawEntropy)
    }

    pub(crate) fn resume(self, ctx: &Ctx<'_>, reply: Reply) -> SStep {
        match self {
            Self::DrawingSessionId => {
                let session_id = session_id_v7(ctx.now, &reply.entropy().bytes()[..10])
                    .expect("invariant: the rendering is always a valid lowercase UUIDv7");
                let action = Action::PersistSession {
                    session_id: session_id.clone(),
                };
                Step::Wait(Self::PersistingSessionId(session_id), action)
            }
            Self::PersistingSessionId(id) => match reply.durable() {
                Ok(()) => Step::Done(SessionResult::Renewed(id)),
                // Nothing durable changed: the stored Session stays; retried at the next tick.
                Err(failure) => {
                    crate::worker::write_failure(failure, || unanswered(Exchange::Register))
                }
            },
            Self::Calling(call) => Step::Done(call.answered(ctx, reply)),
        }
    }
}

/// `exchange` could not go out, or nothing durable changed: retried at the next tick.
fn unanswered(exchange: Exchange) -> SStep {
    Step::Done(SessionResult::Unanswered {
        exchange,
        fault: CallFault::Unavailable,
    })
}

impl SessionCall {
    /// Posts this call's request `body` to its `operation`; a request that could not be built is
    /// refused for good.
    fn send(self, ctx: &Ctx<'_>, operation: Operation, body: Result<Vec<u8>, WireError>) -> SStep {
        match body {
            Ok(body) => {
                let action = post(ctx, operation, Zeroizing::new(body));
                Step::Wait(SessionOp::Calling(self), action)
            }
            Err(e) => {
                let name = operation.as_str();
                Step::Done(SessionResult::Rejected(format!("{name} request: {e}")))
            }
        }
    }

    fn answered(self, ctx: &Ctx<'_>, reply: Reply) -> SessionResult {
        let (worker_id, session_id) = (&ctx.config.worker_id, &ctx.config.session_id);
        let parsed = answer(reply, |body| match &self {
            Self::Registering { .. } => {
                SessionResponse::parse_register(body, worker_id, session_id)
            }
            Self::Heartbeating(r) => {
                SessionResponse::parse_heartbeat(body, worker_id, session_id, r)
            }
            Self::Transitioning(r) => {
                SessionResponse::parse_transition(body, worker_id, session_id, r)
            }
        });
        let parsed = match parsed {
            Ok(parsed) => parsed,
            Err(fault) => return self.fault_result(fault),
        };
        if matches!(self, Self::Registering { rejoin: true })
            && parsed.replaced_session == Some(true)
        {
            return SessionResult::Rejected(String::from(
                "registering again after a fence found that another Session of this worker id \
                 had replaced this one: another Worker uses it",
            ));
        }
        let view = view(ctx, &parsed, matches!(self, Self::Transitioning(_)));
        match self {
            Self::Heartbeating(_) => SessionResult::Heartbeat(view),
            Self::Transitioning(_) => SessionResult::Transitioned(view),
            Self::Registering { .. } => SessionResult::Registered(view),
        }
    }

    /// A failed exchange. Credentials refused (401/403) are not final: the Worker pauses
    /// admission and retries (see the module documentation); neither is an uncertain outcome.
    fn fault_result(&self, fault: CallFault) -> SessionResult {
        let described = |status: u16, code: Option<&str>| {
            format!("{status} {}", code.unwrap_or("without a code"))
        };
        let exchange = match self {
            Self::Heartbeating(_) => Exchange::Heartbeat,
            Self::Transitioning(request) => Exchange::Transition(request.status),
            Self::Registering { .. } => Exchange::Register,
        };
        match (self, fault) {
            (
                _,
                fault @ (CallFault::Unavailable
                | CallFault::Uncertain(_)
                | CallFault::Rejected {
                    status: 401 | 403, ..
                }),
            ) => SessionResult::Unanswered { exchange, fault },
            (Self::Registering { .. }, CallFault::Fenced { code }) => SessionResult::Rejected(
                format!("{exchange} answered {}", described(409, code.as_deref())),
            ),
            (Self::Heartbeating(_) | Self::Transitioning(_), CallFault::Fenced { code }) => {
                SessionResult::Fenced(described(409, code.as_deref()))
            }
            (_, CallFault::Rejected { status, code }) => SessionResult::Rejected(format!(
                "{exchange} answered {}",
                described(status, code.as_deref())
            )),
            // A register answer of the right shape that we cannot accept is retried after a
            // backoff (each one logged); a heartbeat or transition answer that breaks the CAS
            // means the Session moved under us.
            (Self::Registering { .. }, fault @ CallFault::Invalid(_)) => {
                SessionResult::Unanswered { exchange, fault }
            }
            (Self::Heartbeating(_) | Self::Transitioning(_), CallFault::Invalid(e)) => {
                SessionResult::Fenced(format!("invalid Session response: {e}"))
            }
        }
    }
}

impl core::fmt::Display for Exchange {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Register => f.write_str("register"),
            Self::Heartbeat => f.write_str("heartbeat"),
            Self::Transition(status) => write!(f, "transition to {}", status.as_str()),
        }
    }
}

/// A lowercase UUIDv7 (RFC 9562): the 48-bit Unix milliseconds of `now`, version 7, then 74 bits
/// of `random` (10 bytes, of which the version and variant nibbles take 6 bits), variant `10`.
/// `None` only if the rendering broke the Session id rule (it cannot).
fn session_id_v7(now: UnixMillis, random: &[u8]) -> Option<SessionId> {
    let mut bytes = [0u8; 16];
    bytes[..6].copy_from_slice(&now.get().to_be_bytes()[2..]);
    bytes[6..].copy_from_slice(random.get(..10)?);
    SessionId::new(crate::pull::uuid(bytes, 7)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_session_id_is_a_lowercase_uuid_v7_of_the_time_and_the_entropy() {
        let now = UnixMillis::new(0x0190_1234_5678).unwrap();
        let id = session_id_v7(now, &[0xff; 10]).unwrap();
        assert_eq!(id.as_str(), "01901234-5678-7fff-bfff-ffffffffffff");
        let id = session_id_v7(now, &[0; 10]).unwrap();
        assert_eq!(id.as_str(), "01901234-5678-7000-8000-000000000000");
        assert!(session_id_v7(now, &[0; 9]).is_none(), "too little entropy");
    }

    /// A register answer for the edge Worker, written out (reference §2.10).
    fn register_answer(replaced: bool) -> Reply {
        Reply(crate::io::Outcome::Responded(
            format!(
                "{{\"schema\":\"qinglong/worker-session-register@v1\",\"workerId\":\"edge-1\",\
                 \"sessionId\":\"018f0000-0000-7000-8000-000000000001\",\"generation\":2,\
                 \"version\":0,\"status\":\"online\",\"leaseExpiresAtMs\":50000,\
                 \"replacedSession\":{replaced}}}"
            )
            .into_bytes(),
        ))
    }

    fn registered(rejoin: bool, replaced: bool) -> SessionResult {
        let config = crate::worker::WorkerConfig::edge(
            crate::ids::WorkerId::new("edge-1").unwrap(),
            SessionId::new("018f0000-0000-7000-8000-000000000001").unwrap(),
            crate::wire::session::Capabilities::for_architecture(
                crate::revision::Architecture::Amd64,
            ),
        );
        let leases = alloc::collections::BTreeMap::new();
        let ctx = Ctx {
            config: &config,
            session: None,
            now: UnixMillis::new(1_000).unwrap(),
            mono: crate::time::MonoMillis::new(7),
            call_sent: crate::time::MonoMillis::new(7),
            leases: &leases,
            lease_may_hold: &alloc::collections::BTreeMap::new(),
            may_launch: true,
        };
        SessionCall::Registering { rejoin }.answered(&ctx, register_answer(replaced))
    }

    #[test]
    fn only_a_rejoin_answered_replaced_session_is_refused() {
        // Registering again after a fence, the answer says another Session replaced ours:
        // another Worker uses this worker id.
        assert!(matches!(
            registered(true, true),
            SessionResult::Rejected(m) if m.contains("another Worker uses it")
        ));
        // A rejoin nobody replaced, and a first register (replacing a stale Session of our own
        // is what a first register does), are registered.
        for (rejoin, replaced) in [(true, false), (false, true), (false, false)] {
            assert!(
                matches!(registered(rejoin, replaced), SessionResult::Registered(_)),
                "rejoin {rejoin}, replacedSession {replaced}"
            );
        }
    }

    /// Answers `call` with `reply`, for `config` and the Session the Worker holds.
    fn answer(
        config: &crate::worker::WorkerConfig,
        session: Option<&SessionView>,
        call: SessionCall,
        reply: Reply,
    ) -> SessionResult {
        let leases = alloc::collections::BTreeMap::new();
        let may_hold = alloc::collections::BTreeMap::new();
        let ctx = Ctx {
            config,
            session,
            now: UnixMillis::new(1_000).unwrap(),
            mono: crate::time::MonoMillis::new(7),
            call_sent: crate::time::MonoMillis::new(7),
            leases: &leases,
            lease_may_hold: &may_hold,
            may_launch: true,
        };
        call.answered(&ctx, reply)
    }

    fn edge_config() -> crate::worker::WorkerConfig {
        crate::worker::WorkerConfig::edge(
            crate::ids::WorkerId::new("edge-1").unwrap(),
            SessionId::new("018f0000-0000-7000-8000-000000000001").unwrap(),
            crate::wire::session::Capabilities::for_architecture(
                crate::revision::Architecture::Amd64,
            ),
        )
    }

    #[test]
    fn a_refused_exchange_is_named_in_its_rejection() {
        let refused = Reply(crate::io::Outcome::Http(crate::io::HttpFailure::Status {
            status: 400,
            code: Some(String::from("bad_request")),
        }));
        let call = SessionCall::Registering { rejoin: false };
        let result = answer(&edge_config(), None, call, refused);
        let expected = String::from("register answered 400 bad_request");
        assert_eq!(result, SessionResult::Rejected(expected));
    }

    #[test]
    fn a_transition_keeps_the_deadline_of_the_lease_already_held() {
        let config = edge_config();
        let known = SessionView {
            worker: OfferWorker {
                worker_id: config.worker_id.clone(),
                session_id: config.session_id.clone(),
                generation: crate::ids::WorkerGeneration::new(2).unwrap(),
            },
            version: 0,
            status: SessionStatus::Online,
            lease_expires_at: UnixMillis::new(50_000).unwrap(),
            lease_deadline: crate::time::MonoMillis::new(12_345),
        };
        let request = TransitionRequest {
            generation: known.worker.generation,
            expected_version: 0,
            status: SessionStatus::Draining,
        };
        let body = "{\"schema\":\"qinglong/worker-session-transition@v1\",\"workerId\":\"edge-1\",\
            \"sessionId\":\"018f0000-0000-7000-8000-000000000001\",\"generation\":2,\"version\":1,\
            \"status\":\"draining\",\"leaseExpiresAtMs\":50000}";
        let reply = Reply(crate::io::Outcome::Responded(body.as_bytes().to_vec()));
        let call = SessionCall::Transitioning(request);
        let result = answer(&config, Some(&known), call, reply);
        let SessionResult::Transitioned(view) = result else {
            panic!("a valid transition answer is applied: {result:?}");
        };
        // A transition asks for no lease: the deadline already known stays, whatever the
        // answer's expiry reads on this host's clock.
        assert_eq!(view.lease_deadline, known.lease_deadline);
        assert_eq!((view.version, view.status), (1, SessionStatus::Draining));
    }
}
