//! The simulation's cadence phase (issue 16, item 7): control-plane calls take time.
//!
//! After the liveness phase has settled every Run, the Worker restarts and the control plane
//! offers it 2 to 5 new Runs that run for 1 s to 2 min and print up to 4 MiB. From then on:
//! * a call's request crosses the Worker → plane uplink at the seed's rate (32 KiB/s to
//!   loopback speed), which the calls sending at the same time share equally, as TCP shares a
//!   bottleneck: a transfer takes time proportional to its bytes;
//! * the control plane then takes a delay of its own before it applies the call, and answers at
//!   once; calls are answered in the order they finish, several outstanding at once;
//! * a user process ends at its own time, and its exit wakes the Worker
//!   ([`Input::ProcessExited`], as the driver's pidfd does).
//!
//! A **timely** seed's control plane answers within the request timeout (its delays stay under
//! `delay_max`, at most the timeout less a second for the transfer). The checker then holds the
//! Worker to its cadence, measured on the control plane's clock at every event:
//! * `heartbeat-cadence`: the Session's exchanges (register, heartbeat) are applied at most
//!   `heartbeat_interval + request timeout` apart;
//! * `renewal-cadence`: the lease of a Run whose process is running is granted or renewed at
//!   most `lease_control_interval + delay_max + 1 s` apart (1 s for the request's transfer).
//!   The Worker sends a renewal `lease_control_interval` after the sending of the last one the
//!   plane answered, or at that answer if it came later, and wakes for it (`worker::Timer`);
//!   the plane applies it once its request is across and its delay is over. With `delay_max`
//!   ≤ 2 s (three of the four timely classes) the bound is at most `lease / 3` (8 s of 10 s);
//!   with a plane that takes up to 14 s it is 20 s, inside the 30 s lease;
//! * `cadence-no-run-lost`: every Run of the phase ends `completion_acknowledged` with exit 0
//!   (no Run lost to lease expiry, no fenced Session, no halt).
//!
//! A **slow** seed's control plane takes up to twice the lease. A call not answered within the
//! request timeout is reported uncertain (the driver's timeout) and may still be applied later.
//! The cadence checks are off; the safety checks stay, and every Run must settle.

use std::collections::BTreeMap;

use serde_json::Value;

use ql_worker_core::ids::OfferId;
use ql_worker_core::io::{Action, Command, HttpFailure, Input, Outcome};
use ql_worker_core::record::{RecoveryReason, State};
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::route::Operation;
use ql_worker_core::worker::Output;
use ql_worker_tests::server_wire::parse_route;
use ql_worker_tests::splitmix::SplitMix64;

use super::super::bytes::Bytes;
use super::super::host::{Answer, Mode};
use super::super::plane::{self, OfferPolicy};
use super::super::samples;
use super::Sim;
use crate::testkit::world::Lie;

/// The driver's request timeout (`request_timeout_ms`, default 15 s): how long the Worker waits
/// for an answer once its request is across.
pub const REQUEST_TIMEOUT_MS: u64 = 15_000;

/// Bytes of HTTP and TLS framing per request, beside its body.
const FRAMING: u64 = 400;

/// Uplink rates, bytes per second: 32 KiB/s, 64 KiB/s, 512 KiB/s, 10 Mbit/s, 100 Mbit/s and
/// loopback speed.
const RATES: [u64; 6] = [
    32 * 1024,
    64 * 1024,
    512 * 1024,
    1_250_000,
    12_500_000,
    1_000_000_000,
];

/// The timely classes of the control plane's delay (the longest delay of a seed), then the slow
/// one: twice the simulated plane's 30 s lease.
const DELAYS: [u64; 5] = [20, 500, 2_000, REQUEST_TIMEOUT_MS - 1_000, 60_000];

/// Log sizes a Run of the phase prints: a line, 256 KiB, 1 MiB, the edge quota (4 MiB).
const LOGS: [u64; 4] = [40, 256 * 1024, 1024 * 1024, 4 * 1024 * 1024];

/// Simulated time the phase may take before it counts as stuck.
const PHASE_LIMIT_MS: u64 = 2 * 3_600_000;

/// What the cadence phase of one seed did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CadenceStats {
    /// The seed's plane answered within the request timeout (the cadence checks were on).
    pub timely: bool,
    /// The uplink rate, bytes per second.
    pub rate: u64,
    /// The plane's longest delay.
    pub delay_max: u64,
    /// Runs of the phase.
    pub runs: u32,
    /// Of them, `completion_acknowledged` with exit 0.
    pub succeeded: u32,
    /// The longest gap between two Session exchanges the plane applied.
    pub max_heartbeat_gap: u64,
    /// Its bound (`heartbeat_interval + request timeout`).
    pub heartbeat_bound: u64,
    /// The longest time a running Run's lease went without a renewal the plane applied.
    pub max_renewal_gap: u64,
    /// Its bound (see the module documentation).
    pub renewal_bound: u64,
    /// Calls outstanding at once, at most.
    pub max_outstanding: u32,
    /// Calls the Worker gave up on at the request timeout (slow seeds).
    pub timeouts: u32,
    /// Runs that lost their lease (`recovery_required(lease_lost_*)`): none in a timely
    /// phase (`cadence-no-run-lost`); a slow plane may take longer than the lease to answer.
    pub lease_lost: u32,
    /// Simulated time the phase took.
    pub elapsed_ms: u64,
    /// The restarted Worker was fail-closed (a Run the earlier phases left for an operator),
    /// so it takes no work: the phase ended there.
    pub fail_closed: bool,
}

/// One call on its way.
struct Flight {
    command: Command,
    /// Request bytes still to send, in thousandths of a byte (a rate in bytes per second times
    /// milliseconds).
    left: u64,
    /// When the request was across (`None` while it is sent).
    arrived: Option<UnixMillis>,
    /// The control plane's delay before it applies the call.
    delay: u64,
    /// Whether the Worker still waits for the answer (false once it timed out).
    waiting: bool,
}

impl Flight {
    /// When this flight next does something, once its request is across.
    fn due(&self) -> Option<UnixMillis> {
        let arrived = self.arrived?.get();
        let at = if self.waiting {
            self.delay.min(REQUEST_TIMEOUT_MS)
        } else {
            self.delay
        };
        Some(samples::ms(arrived.saturating_add(at)))
    }
}

struct Phase {
    rng: SplitMix64,
    stats: CadenceStats,
    flights: Vec<Flight>,
    /// Process exits to come: when, the process, its log's length.
    exits: Vec<(UnixMillis, usize, u64)>,
    /// When the plane last applied a Session exchange.
    last_session: UnixMillis,
    /// When the plane last granted or renewed each offer's lease.
    last_grant: BTreeMap<OfferId, UnixMillis>,
    /// When the plane applied each offer's running ACK: its renewals are checked from then on.
    running_at: BTreeMap<OfferId, UnixMillis>,
    /// The first sample number of the phase's Runs.
    first_run: u32,
    /// The self-test's [`Lie::SerialCalls`].
    serial: bool,
}

impl Sim<'_> {
    /// The cadence phase (see the module documentation), driven by `seed`.
    pub(super) fn cadence(&mut self, seed: u64) {
        let mut rng = SplitMix64(seed);
        let rate = *rng.pick(&RATES);
        let delay_max = *rng.pick(&DELAYS);
        let runs = 2 + u32::try_from(rng.below(4)).unwrap_or(0);
        self.note(format_args!(
            "cadence phase: {runs} Runs, uplink {rate} B/s, plane delay up to {delay_max} ms"
        ));
        self.faults.duplicates = false;
        self.host.plane_timeout = false;
        self.host.plane.reoffers = false;
        self.host.plane.fence_replaced_sessions = true;
        self.host.plane.policy = OfferPolicy::Always;
        let first_run = self.host.plane.next_run;
        self.host.plane.max_runs = first_run + runs - 1;
        // A wall clock the earlier phases left ahead of the control plane's (a step back after
        // running ahead returns only to the highest time it showed: `Sim::settle`) is set right
        // by letting that much time pass first. Ahead by δ within the Session lease, the Worker
        // reads a Session lease δ shorter than granted (it trusts the plane's expiry against its
        // own clock below what it asked, as it must), and this phase measures the cadence of a
        // slow link, not of a skewed clock: clock steps are the earlier phases' faults and
        // `e2e_clock_step`'s.
        if let Ok(ahead) = u64::try_from(self.host.wall_skew)
            && ahead > 0
        {
            self.host.now = samples::ms(self.host.now.get().saturating_add(ahead));
            self.host.wall_skew = 0;
        }
        self.archive();
        let _ = self.restart();
        let start = self.host.now;

        let mut phase = Phase {
            rng,
            stats: CadenceStats {
                timely: delay_max < REQUEST_TIMEOUT_MS,
                rate,
                delay_max,
                runs,
                heartbeat_bound: self.config.heartbeat_interval_ms + REQUEST_TIMEOUT_MS,
                renewal_bound: self.config.lease_control_interval_ms + delay_max + 1_000,
                ..CadenceStats::default()
            },
            flights: Vec::new(),
            exits: Vec::new(),
            last_session: start,
            last_grant: BTreeMap::new(),
            running_at: BTreeMap::new(),
            first_run,
            serial: self.host.lie == Some(Lie::SerialCalls),
        };
        while !self.cadence_done(&phase) {
            assert!(
                self.host.now.saturating_since(start) <= PHASE_LIMIT_MS,
                "INVARIANT cadence-liveness: the phase's Runs not settled after {PHASE_LIMIT_MS} \
                 ms: {}; offered {} of {runs}; records {:?}; live processes {}",
                self.unsettled().join("; "),
                self.host.plane.next_run - first_run,
                self.phase_records(&phase)
                    .iter()
                    .map(|r| (r.state, r.recovery_reason))
                    .collect::<Vec<_>>(),
                self.host.processes.iter().filter(|p| p.alive).count()
            );
            if self.worker.fail_closed().is_some() && self.host.plane.next_run == first_run {
                self.note(format_args!(
                    "cadence phase: the Worker is fail-closed; no new work"
                ));
                phase.stats.fail_closed = true;
                self.summary.cadence = Some(phase.stats);
                return;
            }
            match self.worker.poll_output() {
                Output::Command(command) => self.issue(&mut phase, command),
                Output::Idle { wake_at } => {
                    let wake = wake_at.map(crate::clock::true_time);
                    if wake.is_some_and(|w| w <= self.host.now) {
                        self.tick();
                        continue;
                    }
                    let next = [wake, next_transfer(&phase, self.host.now)]
                        .into_iter()
                        .chain(phase.flights.iter().map(Flight::due))
                        .chain(phase.exits.iter().map(|e| Some(e.0)))
                        .flatten()
                        .min();
                    let Some(next) = next else {
                        panic!("INVARIANT cadence-liveness: idle with nothing to wait for");
                    };
                    let next = next.max(self.host.now);
                    send(&mut phase, next.saturating_since(self.host.now));
                    self.host.now = next;
                    self.check_cadence(&mut phase);
                    self.fire(&mut phase);
                }
                Output::Stopped(reason) => {
                    panic!("INVARIANT stop-only-drained: stopped ({reason:?}) without a drain")
                }
                Output::Halted(reason) => {
                    self.check_halt(&reason);
                    assert!(
                        !phase.stats.timely,
                        "INVARIANT cadence-no-run-lost: halted ({reason}) with a timely plane"
                    );
                    self.summary.halts += 1;
                    let _ = self.restart();
                    phase.flights.clear();
                }
            }
            self.host.check_state();
        }
        phase.stats.elapsed_ms = self.host.now.saturating_since(start);
        phase.stats.succeeded = u32::try_from(
            self.phase_records(&phase)
                .iter()
                .filter(|r| {
                    r.state == State::CompletionAcknowledged
                        && self.host.ghost.completion_exit.get(&r.offer.offer_id) == Some(&0)
                })
                .count(),
        )
        .unwrap_or(0);
        phase.stats.lease_lost = u32::try_from(
            self.phase_records(&phase)
                .iter()
                .filter(|r| {
                    matches!(
                        r.recovery_reason,
                        Some(
                            RecoveryReason::LeaseLostLocalExecutionStopped
                                | RecoveryReason::LeaseLostLocalExecutionUnverified
                        )
                    )
                })
                .count(),
        )
        .unwrap_or(0);
        // With a timely plane every Run is offered and succeeds: none lost to lease expiry in
        // its start path (renewed between its calls) or while it runs and uploads, none to a
        // fenced Session, none left behind by a halt.
        let offered = u32::try_from(self.phase_records(&phase).len()).unwrap_or(0);
        assert!(
            !phase.stats.timely || (phase.stats.succeeded == offered && offered == runs),
            "INVARIANT cadence-no-run-lost: {} of {runs} Runs succeeded ({offered} offered, {} \
             lost their lease) with a timely plane: {:?}",
            phase.stats.succeeded,
            phase.stats.lease_lost,
            self.phase_records(&phase)
                .iter()
                .map(|r| (r.offer.offer_id.to_string(), r.state, r.recovery_reason))
                .collect::<Vec<_>>()
        );
        self.note(format_args!("cadence phase: {:?}", phase.stats));
        self.summary.cadence = Some(phase.stats);
    }

    /// The operator's archive (`ql-worker recover --archive`) of every `recovery_required`
    /// record the earlier phases left, with its receipt, once the operator has settled its Run
    /// with the control plane: a Worker fail-closed by one of them takes work again once it is
    /// gone.
    fn archive(&mut self) {
        for record in self.host.all_records() {
            if record.state != State::RecoveryRequired {
                continue;
            }
            self.host.records.remove(&record.offer.offer_id);
            self.host
                .receipts
                .remove(&record.offer.candidate.attempt_id);
            // The operator settled the Run with the control plane too: it is not offered again
            // (the archive removed the only record that would refuse a second start).
            if let Some(offered) = self.host.plane.offers.get_mut(&record.offer.offer_id) {
                offered.superseded = true;
            }
            self.note(format_args!("operator archived {}", record.offer.offer_id));
            self.removed.push(record);
        }
    }

    fn tick(&mut self) {
        self.host.ghost.latched_at_tick = self.worker.fail_closed().is_some();
        let result = self.worker.handle(self.host.clock(), Input::Tick);
        assert!(result.is_ok(), "INVARIANT input-accepted: tick: {result:?}");
    }

    /// The records of the phase's Runs.
    fn phase_records(&self, phase: &Phase) -> Vec<ql_worker_core::record::InboxRecord> {
        let offers: Vec<&OfferId> = self
            .host
            .plane
            .offers
            .iter()
            .filter(|(_, o)| o.n >= phase.first_run)
            .map(|(id, _)| id)
            .collect();
        self.host
            .all_records()
            .into_iter()
            .filter(|r| offers.contains(&&r.offer.offer_id))
            .collect()
    }

    /// Every Run of the phase was offered (or the Worker latched fail-closed) and has
    /// settled, its receipt removed, its process gone.
    fn cadence_done(&self, phase: &Phase) -> bool {
        let records = self.phase_records(phase);
        let settled = |r: &ql_worker_core::record::InboxRecord| {
            // A `recovery_required` record keeps its receipt for the operator; a dormant one
            // (before the spawn barrier, its lease expired) never runs.
            r.state == State::RecoveryRequired
                || r.is_dormant(self.host.now)
                || (r.state.is_terminal()
                    && !self
                        .host
                        .receipts
                        .contains_key(&r.offer.candidate.attempt_id))
        };
        // A Worker that latched fail-closed (a slow seed's lost lease) takes no more work:
        // its Runs settled, the phase ends there (an operator's turn).
        let offered = self.host.plane.next_run > self.host.plane.max_runs
            && records.len() == usize::try_from(phase.stats.runs).unwrap_or(0);
        (offered || self.worker.fail_closed().is_some())
            && records.iter().all(settled)
            && self.host.processes.iter().all(|p| !p.alive)
    }

    /// The Worker emitted `command`: a control-plane call leaves on the link; anything else the
    /// host performs at once (a spawned process gets its run time and its log).
    fn issue(&mut self, phase: &mut Phase, command: Command) {
        let bytes = match &command.action {
            Action::Post(call) => u64::try_from(call.body.len()).unwrap_or(u64::MAX),
            Action::UploadLog {
                header,
                byte_length,
                ..
            } => u64::try_from(header.len())
                .unwrap_or(u64::MAX)
                .saturating_add(*byte_length),
            _ => {
                let before = self.host.processes.len();
                // Valid, and a spawned process keeps running (the host's second byte).
                self.command(command, &mut Bytes::new(&[0, 1]));
                if self.host.processes.len() > before {
                    let runs = phase.rng.range(1_000, 120_000);
                    let log = *phase.rng.pick(&LOGS);
                    let at = samples::ms(self.host.now.get() + runs);
                    phase.exits.push((at, self.host.processes.len() - 1, log));
                }
                return;
            }
        };
        self.count(&command);
        // A slow plane is slow now and then: one call in eight takes up to twice the lease,
        // the others up to 2 s.
        let delay = if !phase.stats.timely && phase.rng.below(8) != 0 {
            phase.rng.below(2_000 + 1)
        } else {
            phase.rng.below(phase.stats.delay_max + 1)
        };
        phase.flights.push(Flight {
            command,
            left: bytes.saturating_add(FRAMING).saturating_mul(1_000),
            arrived: None,
            delay,
            waiting: true,
        });
        let outstanding = u32::try_from(phase.flights.len()).unwrap_or(u32::MAX);
        phase.stats.max_outstanding = phase.stats.max_outstanding.max(outstanding);
    }

    /// Everything due now: requests across, the plane's applications and answers, the
    /// Worker's timeouts, process exits.
    fn fire(&mut self, phase: &mut Phase) {
        let now = self.host.now;
        for flight in &mut phase.flights {
            if flight.arrived.is_none() && flight.left == 0 {
                flight.arrived = Some(now);
            }
        }
        while let Some(index) = phase.flights.iter().position(|f| f.due() == Some(now)) {
            let flight = &mut phase.flights[index];
            if flight.waiting && flight.delay > REQUEST_TIMEOUT_MS {
                // The driver's request timeout: the plane may still apply it.
                flight.waiting = false;
                let id = flight.command.id;
                phase.stats.timeouts += 1;
                self.note(format_args!("{id} timed out"));
                self.host.launch_uncertain();
                self.deliver(
                    id,
                    Answer::unlicensed(Outcome::Http(HttpFailure::Uncertain)),
                );
                continue;
            }
            let flight = phase.flights.remove(index);
            let id = flight.command.id;
            let answer = self.apply(phase, flight.command);
            if flight.waiting {
                self.deliver(id, answer);
            } else {
                self.note(format_args!("{id} applied late; its answer is lost"));
            }
        }
        while let Some(index) = phase.exits.iter().position(|e| e.0 <= now) {
            let (_, process, log) = phase.exits.remove(index);
            let offer_id = self.host.processes[process]
                .launching
                .offer
                .offer_id
                .clone();
            self.note(format_args!("process of {offer_id} exits, log {log} B"));
            self.host.exit_logged(process, 0, true, log);
            if self.worker.phase() != ql_worker_core::worker::Phase::Finished {
                let result = self
                    .worker
                    .handle(self.host.clock(), Input::ProcessExited { offer_id });
                assert!(result.is_ok(), "INVARIANT input-accepted: exit: {result:?}");
            }
        }
    }

    /// The control plane applies the call `command` now; notes the Session exchanges and the
    /// lease grants it made.
    fn apply(&mut self, phase: &mut Phase, command: Command) -> Answer {
        let (operation, offer) = match &command.action {
            Action::Post(call) => {
                let body: Value = serde_json::from_slice(&call.body).unwrap_or(Value::Null);
                (
                    parse_route(&call.path).ok().map(|r| r.operation),
                    OfferId::new(plane::text(&body, "offerId")).ok(),
                )
            }
            _ => (None, None),
        };
        // The plane's variation byte: offers without a timeout (bit 2), everything else the
        // cooperative answer.
        let v = if operation == Some(Operation::Offers) {
            4
        } else {
            0
        };
        self.host.call_sent_at = self.sent_at.remove(&command.id);
        if self.host.lie == Some(Lie::NoStartPathRenewal)
            && operation == Some(Operation::LeaseControl)
            && !offer
                .as_ref()
                .is_some_and(|offer| phase.running_at.contains_key(offer))
        {
            self.note(format_args!("{} refused (the lie)", command.id));
            return Answer::unlicensed(Outcome::Http(HttpFailure::Unavailable));
        }
        let answer = self
            .host
            .perform(command.action, Mode::Valid, &mut Bytes::new(&[v]));
        self.note(format_args!(
            "{} applied -> {:?}",
            command.id, answer.outcome
        ));
        if let Outcome::Responded(bytes) = &answer.outcome {
            let value: Value = serde_json::from_slice(bytes).unwrap_or(Value::Null);
            let now = self.host.now;
            match operation {
                Some(Operation::Register | Operation::Heartbeat) => phase.last_session = now,
                Some(Operation::Running) => {
                    if let Some(offer) = offer {
                        phase.running_at.entry(offer).or_insert(now);
                    }
                }
                Some(Operation::Offers | Operation::LeaseControl) => {
                    let granted = [&value["leaseVersion"], &value["offer"]["lease"]["version"]]
                        .into_iter()
                        .any(Value::is_u64);
                    if let (true, Some(offer)) = (granted, offer) {
                        phase.last_grant.insert(offer, now);
                    }
                }
                _ => {}
            }
        }
        answer
    }

    /// Hands `answer` to the Worker (unless it halted meanwhile).
    fn deliver(&mut self, id: ql_worker_core::io::OpId, answer: Answer) {
        if self.worker.phase() == ql_worker_core::worker::Phase::Finished {
            return;
        }
        self.license = answer.license;
        let input = Input::Outcome {
            id,
            outcome: answer.outcome,
        };
        let result = self.worker.handle(self.host.clock(), input);
        assert!(
            result.is_ok(),
            "INVARIANT input-accepted: handle refused a well-formed outcome: {result:?}"
        );
        if self.worker.fail_closed().is_none() {
            self.host.ghost.latched_at_tick = false;
        }
    }

    /// The cadence checks (timely seeds), at every event.
    fn check_cadence(&self, phase: &mut Phase) {
        let now = self.host.now;
        let stats = &mut phase.stats;
        let gap = now.saturating_since(phase.last_session);
        stats.max_heartbeat_gap = stats.max_heartbeat_gap.max(gap);
        for process in self.host.processes.iter().filter(|p| p.alive) {
            let offer = &process.launching.offer.offer_id;
            if let (Some(last), Some(running)) =
                (phase.last_grant.get(offer), phase.running_at.get(offer))
            {
                // From the running ACK on (the start path's renewals are checked by their
                // outcome: `cadence-no-run-lost`).
                let gap = now.saturating_since((*last).max(*running));
                stats.max_renewal_gap = stats.max_renewal_gap.max(gap);
                assert!(
                    !stats.timely || gap <= stats.renewal_bound,
                    "INVARIANT renewal-cadence: the lease of running {offer} was not renewed \
                     for {gap} ms (bound {} ms)",
                    stats.renewal_bound
                );
            }
        }
        assert!(
            !stats.timely || stats.max_heartbeat_gap <= stats.heartbeat_bound,
            "INVARIANT heartbeat-cadence: no Session exchange applied for {gap} ms (bound {} ms)",
            stats.heartbeat_bound
        );
    }
}

/// The requests being sent: all that are not across yet, or (the self-test's
/// [`Lie::SerialCalls`]) only the oldest call, while no other call is waiting for its answer.
fn sending(phase: &Phase) -> impl Iterator<Item = usize> + Clone + '_ {
    let serial = phase.serial;
    let first = phase.flights.first().filter(|f| f.arrived.is_none());
    phase
        .flights
        .iter()
        .enumerate()
        .filter(move |(i, f)| f.arrived.is_none() && (!serial || (*i == 0 && first.is_some())))
        .map(|(i, _)| i)
}

/// When the first request still being sent will be across, at the rate shared equally.
fn next_transfer(phase: &Phase, now: UnixMillis) -> Option<UnixMillis> {
    let sending = sending(phase).map(|i| &phase.flights[i]);
    let count = u64::try_from(sending.clone().count()).unwrap_or(1);
    let least = sending.map(|f| f.left).min()?;
    let ms = (least.saturating_mul(count))
        .div_ceil(phase.stats.rate)
        .max(1);
    Some(samples::ms(now.get().saturating_add(ms)))
}

/// `ms` milliseconds of the uplink, shared equally by the requests being sent.
fn send(phase: &mut Phase, ms: u64) {
    let sending: Vec<usize> = sending(phase).collect();
    let count = sending.len();
    let Some(share) = phase
        .stats
        .rate
        .saturating_mul(ms)
        .checked_div(u64::try_from(count).unwrap_or(1))
    else {
        return;
    };
    for i in sending {
        phase.flights[i].left = phase.flights[i].left.saturating_sub(share);
    }
}
