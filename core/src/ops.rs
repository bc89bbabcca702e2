//! Dispatch of the Worker's operations, and the small helpers they share.
//!
//! An operation is a state machine that consumes one [`Outcome`] at a time and answers with the
//! next [`Action`] ([`Step::Wait`]), its result ([`Step::Done`]) or a halt. The Worker runs one
//! operation per lane at a time (`worker::Lane`); each operation module owns its states and
//! transitions.

use alloc::boxed::Box;
use alloc::string::String;
use alloc::vec::Vec;

#[cfg(feature = "sim-hooks")]
use crate::fingerprint::Fingerprint;
use crate::ids::OfferId;
use crate::io::{Action, HttpFailure, Outcome};
use crate::processor::{ProcessOp, ProcessResult};
use crate::pull::{PullOp, PullResult};
use crate::record::{InboxRecord, State, check_transition};
use crate::session::{SessionOp, SessionResult};
use crate::supervision::{SupervisionOp, SupervisionResult};
use crate::time::UnixMillis;
use crate::wire::WireError;
use crate::worker::{Ctx, HaltReason, ListPurpose, Step, Work, read_failure};

/// The operation in progress. `Clone` exists only for `Worker::fork` (the model checker branches
/// a Worker between two commands; `sim-hooks` feature).
#[cfg_attr(feature = "sim-hooks", derive(Clone))]
#[derive(Debug)]
pub(crate) enum Running {
    Session(SessionOp),
    List(ListPurpose),
    Pull(PullOp),
    Process(ProcessOp),
    Supervise(SupervisionOp),
}

/// A finished operation's result.
#[derive(Debug)]
pub(crate) enum Finished {
    Session(SessionResult),
    Listed(ListResult),
    Pull(PullResult),
    /// The Worker's decisions come from the records it observed; the result itself is kept for
    /// `Debug` traces (the model checker's and the simulation's).
    Process {
        offer_id: OfferId,
        result: ProcessResult,
    },
    Supervise {
        offer_id: OfferId,
        result: SupervisionResult,
    },
}

impl Finished {
    /// The fact this result reports to the driver (none for a listed page: the driver saw it).
    pub(crate) fn fact(&self) -> Option<crate::facts::Fact> {
        use crate::facts::Fact;
        match self {
            Self::Session(result) => Some(Fact::Session(result.clone())),
            Self::Listed(_) => None,
            Self::Pull(result) => Some(Fact::Pull(result.clone())),
            Self::Process { offer_id, result } => Some(Fact::Process {
                offer_id: offer_id.clone(),
                result: result.clone(),
            }),
            Self::Supervise { offer_id, result } => Some(Fact::Supervise {
                offer_id: offer_id.clone(),
                result: result.clone(),
            }),
        }
    }
}

/// How one supervision pass runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Pass {
    /// The lease was renewed less than the pacing interval ago.
    pub(crate) paced: bool,
    /// The drain budget ended: stop the Run by identity (once), then complete it as usual.
    pub(crate) drain_stop: bool,
    /// The highest lease version the control plane may hold for this Run because renewals
    /// whose answers were lost may have committed (issue 17; `Worker::lease_may_hold`).
    pub(crate) may_hold: Option<crate::ids::LeaseVersion>,
    /// The Pull's pending claim had a backoff, and this process waited it out on the
    /// monotonic clock: its persisted wall-clock time is not compared again.
    pub(crate) backoff_served: bool,
}

/// One listed page.
#[derive(Debug)]
pub(crate) struct ListResult {
    pub(crate) purpose: ListPurpose,
    pub(crate) records: Vec<InboxRecord>,
    pub(crate) next_after: Option<OfferId>,
    /// The page could not be read (a transient storage failure): nothing was learned, and the
    /// same page must be listed again — never mistaken for an empty last page.
    pub(crate) failed: bool,
}

impl Running {
    /// Whether the record write this operation awaits stores a lease the control plane granted
    /// in answer to one of its own calls (the Worker then times that lease from when the
    /// operation began; see `worker::LeaseClock`).
    pub(crate) fn grants_lease(&self) -> bool {
        match self {
            Self::Pull(op) => op.grants_lease(),
            Self::Supervise(op) => op.grants_lease(),
            Self::Process(op) => op.grants_lease(),
            Self::Session(_) | Self::List(_) => false,
        }
    }

    /// The offer whose launch this operation's next command begins or continues before the
    /// spawn barrier ([`ProcessOp::launching`]), if any.
    pub(crate) fn launching(&self) -> Option<&OfferId> {
        match self {
            Self::Process(op) if op.launching() => Some(op.offer_id()),
            Self::Session(_)
            | Self::List(_)
            | Self::Pull(_)
            | Self::Process(_)
            | Self::Supervise(_) => None,
        }
    }

    /// Starts the operation for one unit of work.
    pub(crate) fn begin(
        ctx: &Ctx<'_>,
        work: Work,
        available_slots: u64,
        pass: Pass,
    ) -> Step<Self, Finished> {
        match work {
            Work::Register => SessionOp::register(ctx, available_slots, false)
                .map(Self::Session, Finished::Session),
            Work::Rejoin => SessionOp::register(ctx, available_slots, true)
                .map(Self::Session, Finished::Session),
            Work::Heartbeat => {
                SessionOp::heartbeat(ctx, available_slots).map(Self::Session, Finished::Session)
            }
            Work::Transition(status) => {
                SessionOp::transition(ctx, status).map(Self::Session, Finished::Session)
            }
            Work::RenewSession => SessionOp::renew().map(Self::Session, Finished::Session),
            Work::ListPage { purpose, after } => {
                let limit = match purpose {
                    ListPurpose::Reconcile => ctx.config.startup_page,
                    ListPurpose::Supervise => ctx.config.supervision_page,
                };
                Step::Wait(Self::List(purpose), Action::ListInbox { after, limit })
            }
            Work::Pull => PullOp::begin(ctx, pass.backoff_served).map(Self::Pull, Finished::Pull),
            Work::Process(offer_id) => {
                let id = offer_id.clone();
                ProcessOp::begin(offer_id).map(Self::Process, move |result| Finished::Process {
                    offer_id: id,
                    result,
                })
            }
            Work::Supervise(offer_id) => {
                let id = offer_id.clone();
                let paced = pass.paced.then_some(ctx.config.lease_control_interval_ms);
                SupervisionOp::begin(offer_id, paced, pass.drain_stop, pass.may_hold).map(
                    Self::Supervise,
                    move |result| Finished::Supervise {
                        offer_id: id,
                        result,
                    },
                )
            }
            Work::Renew(offer_id) => {
                let id = offer_id.clone();
                let paced = pass.paced.then_some(ctx.config.lease_control_interval_ms);
                SupervisionOp::renew(offer_id, paced, pass.may_hold).map(
                    Self::Supervise,
                    move |result| Finished::Supervise {
                        offer_id: id,
                        result,
                    },
                )
            }
        }
    }

    /// Writes a canonical rendering of this operation's state (model checking).
    #[cfg(feature = "sim-hooks")]
    pub(crate) fn fingerprint(&self, fp: &mut Fingerprint<'_>) {
        match self {
            Self::Session(op) => {
                fp.tag("session");
                fp.debug(op);
            }
            Self::List(purpose) => {
                fp.tag("list");
                fp.debug(purpose);
            }
            Self::Pull(op) => op.fingerprint(fp),
            Self::Process(op) => op.fingerprint(fp),
            Self::Supervise(op) => op.fingerprint(fp),
        }
    }

    /// Feeds the outcome of this operation's outstanding action.
    pub(crate) fn resume(self, ctx: &Ctx<'_>, outcome: Outcome) -> Step<Self, Finished> {
        match self {
            Self::Session(op) => op
                .resume(ctx, outcome)
                .map(Self::Session, Finished::Session),
            Self::List(purpose) => list_resume(purpose, outcome),
            Self::Pull(op) => op.resume(ctx, outcome).map(Self::Pull, Finished::Pull),
            Self::Process(op) => {
                let id = op.offer_id().clone();
                op.resume(ctx, outcome)
                    .map(Self::Process, move |result| Finished::Process {
                        offer_id: id,
                        result,
                    })
            }
            Self::Supervise(op) => {
                let id = op.offer_id().clone();
                op.resume(ctx, outcome)
                    .map(Self::Supervise, move |result| Finished::Supervise {
                        offer_id: id,
                        result,
                    })
            }
        }
    }
}

fn list_resume(purpose: ListPurpose, outcome: Outcome) -> Step<Running, Finished> {
    match outcome {
        Outcome::InboxListed {
            records,
            next_after,
        } => Step::Done(Finished::Listed(ListResult {
            purpose,
            records,
            next_after,
            failed: false,
        })),
        Outcome::Store(failure) => read_failure(failure, || {
            Step::Done(Finished::Listed(ListResult {
                purpose,
                records: Vec::new(),
                next_after: None,
                failed: true,
            }))
        }),
        other => unexpected(&other),
    }
}

/// An outcome of the action's kind that this state does not expect. The Worker refuses an
/// outcome of another kind before any operation sees it
/// ([`crate::io::InputError::OutcomeMismatch`]), so this is a core bug: halt rather than guess.
pub(crate) fn unexpected<S, R>(outcome: &Outcome) -> Step<S, R> {
    Step::Halt(HaltReason::UnexpectedOutcome {
        detail: alloc::format!("{outcome:?}"),
    })
}

/// The next revision of `stored` in `state`, `updatedAtMs = max(now, stored.updatedAtMs)`, with
/// `edit` applied (reference §4.2: every replace is a revision CAS).
pub(crate) fn next_record(
    stored: &InboxRecord,
    state: State,
    now: UnixMillis,
    edit: impl FnOnce(&mut InboxRecord),
) -> InboxRecord {
    let mut next = stored.clone();
    // INVARIANT: revisions stay far below 2^53 (one per durable step of a bounded lifecycle).
    next.revision = stored.revision.next().unwrap_or(stored.revision);
    next.state = state;
    next.updated_at_ms = now.max(stored.updated_at_ms);
    edit(&mut next);
    next
}

/// The replace action for `proposed`, after checking the transition here too (pair assertion:
/// the core never proposes a write the journal would refuse).
pub(crate) fn persist(stored: &InboxRecord, proposed: InboxRecord) -> Action {
    let check = check_transition(stored, &proposed, stored.revision);
    assert!(
        check.is_ok(),
        "core proposed an invalid transition: {check:?}"
    );
    Action::PersistRecord {
        expected: Some(stored.revision),
        record: Box::new(proposed),
    }
}

/// How a control-plane call failed, from the core's point of view.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CallFault {
    /// No answer, and the request cannot have taken effect (no connection, 5xx, 408, 429):
    /// retry later.
    Unavailable,
    /// The request may have taken effect, but no usable answer came back (issue 17): the
    /// connection was lost after sending, the answer was not the contract's JSON, or its status
    /// was neither 200 nor an error. Retried like [`CallFault::Unavailable`]; an operation whose
    /// retry is fenced by a version the lost call advanced reasons about it (lease control,
    /// completion, the Session).
    Uncertain(Uncertainty),
    /// 409: the control plane fenced the request (stale Session, lease or version).
    Fenced {
        /// The error code.
        code: Option<String>,
    },
    /// Another 4xx status (400, 401, 403, 404, 413, 415): a configuration or contract problem on
    /// one side, or refused credentials.
    Rejected {
        /// HTTP status.
        status: u16,
        /// The error code.
        code: Option<String>,
    },
    /// A 200 response of the contract's JSON shape that breaks a rule or drifts from its
    /// request: the control plane said something definite, and it is wrong.
    Invalid(WireError),
}

/// Why a call's outcome is uncertain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Uncertainty {
    /// The connection closed, reset or timed out after the request may have been sent, or the
    /// response broke the transport rules.
    Transport,
    /// A status that is neither 200 nor an error status (a 201, a redirect).
    Status(u16),
    /// A 200 whose body is not the contract's JSON (not JSON, a key added or missing, outside
    /// its size bounds).
    Garbled(WireError),
}

impl core::fmt::Display for Uncertainty {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Transport => f.write_str("the answer was lost (connection or transport)"),
            Self::Status(status) => write!(f, "the answer had status {status}, not 200"),
            Self::Garbled(e) => write!(f, "the answer is not the contract's JSON: {e}"),
        }
    }
}

/// Classifies a JSON call's outcome: the 200 body, or the fault.
pub(crate) fn response(outcome: Outcome) -> Result<Result<Vec<u8>, CallFault>, Outcome> {
    match outcome {
        Outcome::Responded(body) => Ok(Ok(body)),
        Outcome::Http(failure) => Ok(Err(http_fault(failure))),
        other => Err(other),
    }
}

/// Classifies an HTTP failure.
pub(crate) fn http_fault(failure: HttpFailure) -> CallFault {
    match failure {
        HttpFailure::Unavailable => CallFault::Unavailable,
        HttpFailure::Uncertain => CallFault::Uncertain(Uncertainty::Transport),
        HttpFailure::Status { status: 409, code } => CallFault::Fenced { code },
        HttpFailure::Status { status, code } => match status {
            408 | 429 | 500.. => CallFault::Unavailable,
            400..=499 => CallFault::Rejected { status, code },
            _ => CallFault::Uncertain(Uncertainty::Status(status)),
        },
    }
}

/// Classifies a 200 body that failed to parse: a body that is not the contract's JSON at all
/// (not JSON, a key added or missing, outside its size bounds) is an uncertain outcome
/// (`Ok`); a body of the right shape whose values break a rule or drift from the request is the
/// control plane's definite, wrong answer (`Err`, unchanged).
pub(crate) fn garbled(error: WireError) -> Result<Uncertainty, WireError> {
    match error {
        WireError::Size { .. } | WireError::Json { .. } => Ok(Uncertainty::Garbled(error)),
        other => Err(other),
    }
}
