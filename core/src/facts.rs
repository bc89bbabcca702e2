//! Typed facts about the Worker's protocol decisions, for the driver's event log and metrics
//! (issue 18).
//!
//! The core decides; the driver reports. Everything the driver can see for itself (the commands
//! it performs, the outcomes it reports, the records it persists) it derives itself. What only
//! the core knows — what a finished operation concluded, why admission paused, that the drain
//! budget ended — the core hands out here as values, never as text or I/O.
//!
//! Reporting is off by default ([`crate::worker::Worker::report_facts`] turns it on), so the
//! model checker, the simulation and the fuzzers keep a Worker without a queue. The queue is
//! bounded: a driver that does not poll loses the oldest facts, never the machine's behaviour
//! (facts are write-only for the machine: no decision reads them back).

use alloc::string::String;

use crate::ids::OfferId;
use crate::processor::ProcessResult;
use crate::pull::PullResult;
use crate::session::SessionResult;
use crate::supervision::SupervisionResult;

/// Most facts kept between two polls; older ones are dropped (and counted).
pub(crate) const MAX_QUEUED_FACTS: usize = 1024;

/// One fact.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fact {
    /// A Session exchange (register, heartbeat, transition) concluded.
    Session(SessionResult),
    /// A Pull concluded.
    Pull(PullResult),
    /// Processing one offer (the start path) concluded.
    Process {
        /// The offer.
        offer_id: OfferId,
        /// What it concluded.
        result: ProcessResult,
    },
    /// A supervision pass (completion first, then lease control) concluded.
    Supervise {
        /// The offer.
        offer_id: OfferId,
        /// What it concluded.
        result: SupervisionResult,
    },
    /// The control plane refused the credentials (401/403): no Pull and no slots offered until
    /// the next authenticated exchange; the Session, the Runs and their leases are kept.
    AdmissionPaused {
        /// The HTTP status.
        status: u16,
        /// The error code of the answer, if any.
        code: Option<String>,
    },
    /// An exchange was answered (the control plane authenticated the Worker again): admission
    /// resumes.
    AdmissionResumed,
    /// The control plane fenced this Session (409 on a Session exchange, or an answer that
    /// breaks its version CAS): the Worker registers it again, pausing admission meanwhile.
    Rejoining {
        /// What fenced it.
        detail: String,
        /// Fences in a row without a good heartbeat in between (1 for the first).
        attempt: u8,
        /// The fence follows an uncertain heartbeat or transition (one that may have
        /// committed): expected, and not counted in `attempt`.
        after_uncertain: bool,
    },
    /// A register got no usable answer (issue 17): retried after `retry_in_ms`.
    RegisterRetry {
        /// Registers in a row that got no usable answer (1 for the first).
        attempt: u32,
        /// Why.
        fault: crate::worker::CallFault,
        /// The backoff before the next register.
        retry_in_ms: u64,
    },
    /// The re-registration after a fence succeeded: admission resumes.
    Rejoined,
    /// A drain began.
    DrainBegun {
        /// Records that hold the drain (in flight) when it began.
        in_flight: usize,
    },
    /// The drain budget ended with records in flight: their Runs are stopped by identity and
    /// completed through the normal path, then the Session goes offline.
    DrainBudgetEnded {
        /// Records still in flight.
        in_flight: usize,
    },
}
