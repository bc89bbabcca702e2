//! The cadence phase on [`World`] (issue 16, item 7): control-plane calls take time.
//!
//! A fresh world whose control plane offers 2 to 5 Runs (the sample revision without a
//! timeout, 30 s leases) to a Worker of the edge or the node profile with 1 to 4 slots. The
//! Runs' processes run for 1 s to 2 min and print up to 4 MiB. Every answer is the healthy one
//! ([`Answer::Ok`]); what the seed decides is time:
//! * a call's request crosses the Worker → plane uplink at the seed's rate (32 KiB/s to
//!   loopback speed), which the calls sending at the same time share equally, as TCP shares a
//!   bottleneck: a transfer takes time proportional to its bytes;
//! * the control plane then takes a delay of its own before it applies the call, and answers at
//!   once; calls are answered in the order they finish, several outstanding at once;
//! * the driver performs storage, spawn, stop and entropy at once, before any other outcome;
//! * a user process ends at its own time, and its exit wakes the Worker
//!   ([`Input::ProcessExited`], as the driver's pidfd does).
//!
//! A **timely** seed's control plane answers within the request timeout (its delays stay under
//! `delay_max`, at most the timeout less a second for the transfer). The phase then holds the
//! Worker to its cadence, measured on the control plane's clock at every event:
//! * `heartbeat-cadence`: the Session's exchanges (register, heartbeat) are applied at most
//!   `heartbeat_interval + request timeout` apart;
//! * `renewal-cadence`: the lease of a Run whose process is running is granted or renewed at
//!   most `lease_control_interval + delay_max + 1 s` apart (1 s for the request's transfer).
//!   The Worker sends a renewal `lease_control_interval` after the sending of the last one the
//!   plane answered, or at that answer if it came later, and wakes for it (`worker::Timer`);
//!   the plane applies it once its request is across and its delay is over. With `delay_max`
//!   ≤ 2 s (three of the four timely classes) the bound is at most `lease / 3`; with a plane
//!   that takes up to 14 s it is 20 s, inside the 30 s lease;
//! * `cadence-no-run-lost`: every Run of the phase ends `completion_acknowledged` with exit 0
//!   (no Run lost to lease expiry, no fenced Session, no halt).
//!
//! A **slow** seed's control plane takes up to twice the lease for one call in eight. A call not
//! answered within the request timeout is reported uncertain (the driver's timeout) and may
//! still be applied later. The cadence checks are off; the world's safety checks stay, and every
//! Run must settle (`cadence-liveness`).
//!
//! Every command still goes through the world's checkers; their violations and the phase's own
//! land in [`World::violations`].

use std::collections::BTreeMap;

use serde_json::Value;

use crate::testkit::act;
use crate::testkit::explore::walk::RunOutcomes;
use crate::testkit::sim::{Sim, Status};
use crate::testkit::world::{Answer, Event, OfferTemplate, ProcessState, ReceiptKind, World};
use ql_worker_core::ids::OfferId;
use ql_worker_core::io::{Action, HttpFailure, Input, OpId, Outcome};
use ql_worker_core::record::{RecoveryReason, State};
use ql_worker_core::revision::Architecture;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::route::Operation;
use ql_worker_core::wire::session::Capabilities;
use ql_worker_core::worker::WorkerConfig;
use ql_worker_tests::splitmix::SplitMix64;

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
/// one: twice the plane's 30 s lease.
const DELAYS: [u64; 5] = [20, 500, 2_000, REQUEST_TIMEOUT_MS - 1_000, 60_000];

/// Log sizes a Run of the phase prints: a line, 256 KiB, 1 MiB, the edge quota (4 MiB).
const LOGS: [u64; 4] = [40, 256 * 1024, 1024 * 1024, 4 * 1024 * 1024];

/// Simulated time the phase may take before it counts as stuck.
const PHASE_LIMIT_MS: u64 = 2 * 3_600_000;

/// Commands the driver lets be outstanding at once here: never the limit (the Worker's lanes
/// are).
const WINDOW: usize = 64;

/// A deliberately lying Worker, for the simulation's self-test (`tests/tests/simulation.rs`,
/// `checkers_can_fail`): each lie must make a cadence check report a violation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lie {
    /// The link carries one call at a time, each waiting for the one before it to be answered,
    /// as a Worker with one loop and one call at a time would.
    SerialCalls,
    /// A lease renewal of a Run not yet running never reaches the control plane (answered as a
    /// refused connection), as for a Worker that renews only running Runs.
    NoStartPathRenewal,
}

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
    /// Replays of a claim the control plane fenced (409 `worker_offer_fenced`: the claim's
    /// lease expired while the Worker waited on a slow plane); none in a timely phase.
    pub fenced: u32,
    /// Halts of the Worker (each checked licensed; none in a timely phase).
    pub halts: u32,
    /// Simulated time the phase took.
    pub elapsed_ms: u64,
}

/// One cadence phase: its figures, the violations the world's checkers and the phase's own
/// found (empty when it held), and the trail when recorded.
#[derive(Debug)]
pub struct Cadence {
    /// The figures.
    pub stats: CadenceStats,
    /// How the phase's Runs ended, from the durable records.
    pub ended: RunOutcomes,
    /// Broken invariants, `"<name>: <detail>"`, the first one first.
    pub violations: Vec<String>,
    /// One line per command and driver event, when asked for.
    pub trail: Vec<String>,
}

/// One call on its way.
struct Flight {
    id: OpId,
    action: Action,
    /// Request bytes still to send, in thousandths of a byte (a rate in bytes per second times
    /// milliseconds).
    left: u64,
    /// When the request was across (`None` while it is sent).
    arrived: Option<UnixMillis>,
    /// The control plane's delay before it applies the call.
    delay: u64,
    /// Whether the Worker still waits for the answer (false once it timed out).
    waiting: bool,
    /// An upload's: the Run's lease version at the control plane when the header arrived
    /// (taken as when the call boarded): the fence is authorized then (reference §2.7).
    header_version: Option<u64>,
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
        Some(ms(arrived.saturating_add(at)))
    }
}

struct Phase {
    sim: Sim,
    rng: SplitMix64,
    stats: CadenceStats,
    flights: Vec<Flight>,
    /// Process exits to come: when, the process's index, its log's length.
    exits: Vec<(UnixMillis, usize, u64)>,
    /// Processes already given an exit.
    scheduled: usize,
    /// When the plane last applied a Session exchange.
    last_session: UnixMillis,
    /// When the plane last granted or renewed each offer's lease.
    last_grant: BTreeMap<OfferId, UnixMillis>,
    /// When the plane applied each offer's running ACK: its renewals are checked from then on.
    running_at: BTreeMap<OfferId, UnixMillis>,
    /// The self-test's lie, if any ([`Lie::SerialCalls`], [`Lie::NoStartPathRenewal`]).
    lie: Option<Lie>,
}

fn ms(at: u64) -> UnixMillis {
    UnixMillis::new(at).unwrap_or(UnixMillis::ZERO)
}

/// Runs the cadence phase of `seed` (see the module documentation), with the self-test's `lie`
/// if any; `record` keeps the trail.
#[must_use]
pub fn run(seed: u64, lie: Option<Lie>, record: bool) -> Cadence {
    let mut rng = SplitMix64(seed);
    let rate = *rng.pick(&RATES);
    let delay_max = *rng.pick(&DELAYS);
    let runs = 2 + u32::try_from(rng.below(4)).unwrap_or(0);
    let worker = crate::testkit::worker();
    let capabilities = Capabilities::for_architecture(Architecture::Amd64);
    let mut config = if rng.below(2) == 0 {
        WorkerConfig::node(worker.worker_id, worker.session_id, capabilities)
    } else {
        WorkerConfig::edge(worker.worker_id, worker.session_id, capabilities)
    };
    config.max_concurrent_runs = 1 + u16::try_from(rng.below(4)).unwrap_or(0);
    let templates = (1..=runs)
        .map(|n| OfferTemplate::with_revision(n, crate::testkit::untimed_revision()))
        .collect();
    let start = ms(1_000);
    let mut sim = Sim::new(config.clone(), World::new(seed, templates), start);
    sim.window = WINDOW;
    if record {
        sim = sim.recording();
    }
    let mut phase = Phase {
        sim,
        rng,
        stats: CadenceStats {
            timely: delay_max < REQUEST_TIMEOUT_MS,
            rate,
            delay_max,
            runs,
            heartbeat_bound: config.heartbeat_interval_ms + REQUEST_TIMEOUT_MS,
            renewal_bound: config.lease_control_interval_ms + delay_max + 1_000,
            ..CadenceStats::default()
        },
        flights: Vec::new(),
        exits: Vec::new(),
        scheduled: 0,
        last_session: start,
        last_grant: BTreeMap::new(),
        running_at: BTreeMap::new(),
        lie,
    };
    phase.sim.note(format!(
        "cadence phase: {runs} Runs, uplink {rate} B/s, plane delay up to {delay_max} ms, {} \
         slots, heartbeat {} ms, lease control {} ms",
        config.max_concurrent_runs, config.heartbeat_interval_ms, config.lease_control_interval_ms
    ));
    phase.sim.tick();
    phase.drive(start);
    phase.finish(start)
}

impl Phase {
    fn violation(&mut self, invariant: &'static str, detail: String) {
        self.sim.world.violation(invariant, detail);
    }

    /// Moves the phase until every Run settled or an invariant broke.
    fn drive(&mut self, start: UnixMillis) {
        while self.sim.world.violations.is_empty() && !self.done() {
            if self.sim.now.saturating_since(start) > PHASE_LIMIT_MS {
                let detail = format!(
                    "the phase's Runs not settled after {PHASE_LIMIT_MS} ms: records {:?}",
                    self.records()
                        .iter()
                        .map(|r| (r.offer.offer_id.to_string(), r.state, r.recovery_reason))
                        .collect::<Vec<_>>()
                );
                self.violation("cadence-liveness", detail);
                return;
            }
            match self.sim.status.clone() {
                Status::Halted(reason) => {
                    self.stats.halts += 1;
                    if self.stats.timely {
                        self.violation(
                            "cadence-no-run-lost",
                            format!("the Worker halted ({reason}) with a timely plane"),
                        );
                        return;
                    }
                    self.flights.clear();
                    self.sim.crash();
                    self.sim.tick();
                    continue;
                }
                Status::Stopped(reason) => {
                    self.violation(
                        "stop-only-drained",
                        format!("stopped ({reason:?}) without a drain"),
                    );
                    return;
                }
                Status::Busy | Status::Idle(_) => {}
            }
            let local = self.sim.outstanding().position(|a| !act::is_call(a));
            if let Some(index) = local {
                self.local(index);
                continue;
            }
            self.board();
            if self.fire() {
                continue;
            }
            let wake = match self.sim.status {
                Status::Idle(wake) => wake,
                _ => self.sim.waiting.flatten(),
            };
            if wake.is_some_and(|w| w <= self.sim.now) {
                self.sim.tick();
                continue;
            }
            let next = [wake, self.next_transfer()]
                .into_iter()
                .chain(self.flights.iter().map(Flight::due))
                .chain(self.exits.iter().map(|e| Some(e.0)))
                .flatten()
                .min();
            let Some(next) = next else {
                self.violation(
                    "cadence-liveness",
                    String::from("idle with nothing to wait for"),
                );
                return;
            };
            let next = next.max(self.sim.now);
            self.send(next.saturating_since(self.sim.now));
            self.sim.advance_to(next);
            self.check_cadence();
        }
    }

    /// The driver performs the local command at `index` at once; a spawned process gets its
    /// run time and its log.
    fn local(&mut self, index: usize) {
        self.sim.choose(index);
        self.sim.answer(Answer::Ok);
        let processes = self.sim.world.supervisor.processes.len();
        while self.scheduled < processes {
            let runs = self.rng.range(1_000, 120_000);
            let log = *self.rng.pick(&LOGS);
            let at = ms(self.sim.now.get() + runs);
            self.exits.push((at, self.scheduled, log));
            self.scheduled += 1;
        }
    }

    /// Calls the Worker issued since the last look board the link.
    fn board(&mut self) {
        let new: Vec<(OpId, Action)> = (self.sim.pending.iter().chain(&self.sim.held))
            .filter(|(id, _)| !self.flights.iter().any(|f| f.id == *id))
            .cloned()
            .collect();
        for (id, action) in new {
            let bytes = match &action {
                Action::Post(call) => u64::try_from(call.body.len()).unwrap_or(u64::MAX),
                Action::UploadLog {
                    header,
                    byte_length,
                    ..
                } => u64::try_from(header.len())
                    .unwrap_or(u64::MAX)
                    .saturating_add(*byte_length),
                _ => 0,
            };
            // A slow plane is slow now and then: one call in eight takes up to twice the lease,
            // the others up to 2 s.
            let delay = if !self.stats.timely && self.rng.below(8) != 0 {
                self.rng.below(2_000 + 1)
            } else {
                self.rng.below(self.stats.delay_max + 1)
            };
            let header_version = match &action {
                Action::UploadLog { header, .. } => {
                    let header: Value = serde_json::from_slice(header).unwrap_or(Value::Null);
                    let offer = header["offerId"]
                        .as_str()
                        .and_then(|o| OfferId::new(o).ok());
                    let run = offer.and_then(|o| self.sim.world.plane.runs.get(&o));
                    run.map(|run| run.offer.lease.version.get())
                }
                _ => None,
            };
            self.flights.push(Flight {
                id,
                action,
                left: bytes.saturating_add(FRAMING).saturating_mul(1_000),
                arrived: None,
                delay,
                waiting: true,
                header_version,
            });
        }
        let outstanding = u32::try_from(self.flights.len()).unwrap_or(u32::MAX);
        self.stats.max_outstanding = self.stats.max_outstanding.max(outstanding);
    }

    /// One thing due now: a request across, a timeout, the plane applying and answering a
    /// call, a process exit. `false` when nothing is due.
    fn fire(&mut self) -> bool {
        let now = self.sim.now;
        for flight in &mut self.flights {
            if flight.arrived.is_none() && flight.left == 0 {
                flight.arrived = Some(now);
            }
        }
        if let Some(index) = self.flights.iter().position(|f| f.due() == Some(now)) {
            let flight = &mut self.flights[index];
            let id = flight.id;
            if flight.waiting && flight.delay > REQUEST_TIMEOUT_MS {
                // The driver's request timeout: the plane may still apply it.
                flight.waiting = false;
                self.stats.timeouts += 1;
                self.sim.note(format!("{id} timed out"));
                if self.pick(id) {
                    self.sim.world.launch_uncertain();
                    self.sim.deliver(Outcome::Http(HttpFailure::Uncertain));
                }
                return true;
            }
            let flight = self.flights.remove(index);
            self.apply(flight);
            return true;
        }
        if let Some(index) = self.exits.iter().position(|e| e.0 <= now) {
            let (_, process, log) = self.exits.remove(index);
            self.exit(process, log);
            return true;
        }
        false
    }

    /// Makes the outstanding command `id` the pending one; `false` when it is not outstanding
    /// (then nothing changes).
    fn pick(&mut self, id: OpId) -> bool {
        let index = (self.sim.pending.iter().chain(&self.sim.held)).position(|(i, _)| *i == id);
        if let Some(index) = index {
            self.sim.choose(index);
        }
        index.is_some()
    }

    /// The control plane applies `flight` now and answers it (unless the Worker gave up on it);
    /// notes the Session exchanges and the lease grants it made.
    fn apply(&mut self, flight: Flight) {
        let (operation, offer) = match &flight.action {
            Action::Post(call) => {
                let body: Value = serde_json::from_slice(&call.body).unwrap_or(Value::Null);
                let offer = body["offerId"].as_str().and_then(|o| OfferId::new(o).ok());
                (Some(act::operation(call)), offer)
            }
            _ => (None, None),
        };
        let refused = self.lie == Some(Lie::NoStartPathRenewal)
            && operation == Some(Operation::LeaseControl)
            && !offer
                .as_ref()
                .is_some_and(|o| self.running_at.contains_key(o));
        let answer = if refused {
            Answer::Unavailable
        } else {
            Answer::Ok
        };
        self.sim.world.header_lease_version = flight.header_version;
        let response = if flight.waiting {
            if !self.pick(flight.id) {
                return;
            }
            self.sim.answer(answer);
            self.sim.last_response.take()
        } else {
            // Its answer is lost: the Worker gave up on it at the timeout. No lease slack is
            // noted for it (the Worker times no lease from a call it gave up on).
            self.sim.world.worker_clock.sent_at = None;
            let now = self.sim.now;
            match self.sim.world.perform_late(now, &flight.action) {
                Outcome::Responded(bytes) => Some(bytes.to_vec()),
                _ => None,
            }
        };
        self.sim.note(format!(
            "{} applied{}, {}",
            flight.id,
            if flight.waiting {
                ""
            } else {
                " late (its answer lost)"
            },
            if response.is_some() {
                "responded"
            } else {
                "no response"
            }
        ));
        let Some(bytes) = response else {
            return;
        };
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        let now = self.sim.now;
        match operation {
            Some(Operation::Register | Operation::Heartbeat) => self.last_session = now,
            Some(Operation::Running) => {
                if let Some(offer) = offer {
                    self.running_at.entry(offer).or_insert(now);
                }
            }
            Some(Operation::Offers | Operation::LeaseControl) => {
                let granted = [&value["leaseVersion"], &value["offer"]["lease"]["version"]]
                    .into_iter()
                    .any(Value::is_u64);
                let offer = offer.or_else(|| {
                    value["offer"]["offerId"]
                        .as_str()
                        .and_then(|o| OfferId::new(o).ok())
                });
                if let (true, Some(offer)) = (granted, offer) {
                    self.last_grant.insert(offer, now);
                }
            }
            _ => {}
        }
    }

    /// Process `index` exits (code 0, a genuine receipt) after printing `log` bytes.
    fn exit(&mut self, index: usize, log: u64) {
        let world = &mut self.sim.world;
        let Some(process) = world.supervisor.processes.get(index) else {
            return;
        };
        if process.state != ProcessState::Running {
            return;
        }
        let offer_id = process.offer_id.clone();
        let id = process.log_artifact_id.clone();
        if let Some(spool) = world.disk.logs.get_mut(&id) {
            // The supervisor's own line follows; the whole stays within `log` bytes.
            let printed = usize::try_from(log.saturating_sub(64)).unwrap_or(0);
            spool.content.resize(spool.content.len() + printed, b'x');
        }
        self.sim
            .note(format!("process of {offer_id} exits, log {log} B"));
        self.sim.event(Event::Exit {
            index,
            code: 0,
            receipt: ReceiptKind::Genuine,
        });
        self.sim.notify(Input::ProcessExited { offer_id });
    }

    /// The records of the phase's Runs.
    fn records(&self) -> Vec<ql_worker_core::record::InboxRecord> {
        let disk = &self.sim.world.disk;
        disk.records.values().map(|(r, _)| r.clone()).collect()
    }

    /// Every Run was offered (or the Worker latched fail-closed) and has settled, its receipt
    /// removed, its process gone, nothing outstanding.
    fn done(&self) -> bool {
        let world = &self.sim.world;
        let records = self.records();
        let settled = |r: &ql_worker_core::record::InboxRecord| {
            // A `recovery_required` record keeps its receipt for the operator; a dormant one
            // (before the spawn barrier, its lease expired) never runs.
            r.state == State::RecoveryRequired
                || r.is_dormant(self.sim.now)
                || (r.state.is_terminal()
                    && !world
                        .disk
                        .receipts
                        .contains_key(&r.offer.candidate.attempt_id))
        };
        let fail_closed = crate::testkit::world::check::fail_closed_by(records.iter()).is_some();
        // A Run the Worker never stored, its lease expired and no claim naming it: the plane
        // fences every replay of its offer id (reference §2.2) and its reaper takes the Run
        // back; this plane re-delivers nothing, so it is settled, as the plane's loss.
        let claimed = world.disk.claim.as_ref().map(|(c, _)| &c.offer_id);
        let dropped = (world.plane.runs.iter())
            .filter(|(id, run)| {
                world.disk.record(id).is_none()
                    && run.offer.lease.expires_at_ms <= self.sim.now
                    && claimed != Some(*id)
            })
            .count();
        let offered = world.plane.templates.is_empty()
            && records.len() + dropped == usize::try_from(self.stats.runs).unwrap_or(0);
        (offered || fail_closed)
            && records.iter().all(settled)
            && (world.supervisor.processes.iter()).all(|p| p.state != ProcessState::Running)
            && matches!(self.sim.status, Status::Idle(_))
    }

    /// The figures, and the closing check: with a timely plane every Run was offered and
    /// succeeded.
    fn finish(mut self, start: UnixMillis) -> Cadence {
        let records = self.records();
        let exit = |offer: &OfferId| {
            (self.sim.world.supervisor.of_offer(offer)).find_map(|p| match p.state {
                ProcessState::Exited(code) => Some(code),
                ProcessState::Running => None,
            })
        };
        let succeeded = (records.iter())
            .filter(|r| {
                r.state == State::CompletionAcknowledged && exit(&r.offer.offer_id) == Some(0)
            })
            .count();
        let lost = (records.iter())
            .filter(|r| {
                matches!(
                    r.recovery_reason,
                    Some(
                        RecoveryReason::LeaseLostLocalExecutionStopped
                            | RecoveryReason::LeaseLostLocalExecutionUnverified
                    )
                )
            })
            .count();
        self.stats.succeeded = u32::try_from(succeeded).unwrap_or(u32::MAX);
        self.stats.lease_lost = u32::try_from(lost).unwrap_or(u32::MAX);
        self.stats.elapsed_ms = self.sim.now.saturating_since(start);
        self.stats.fenced = self.sim.world.plane.fenced_replays;
        let offered = u32::try_from(records.len()).unwrap_or(u32::MAX);
        let runs = self.stats.runs;
        if self.sim.world.violations.is_empty()
            && self.stats.timely
            && (self.stats.succeeded != runs || offered != runs)
        {
            let detail = format!(
                "{} of {runs} Runs succeeded ({offered} offered, {lost} lost their lease) with a \
                 timely plane: {:?}",
                self.stats.succeeded,
                records
                    .iter()
                    .map(|r| (r.offer.offer_id.to_string(), r.state, r.recovery_reason))
                    .collect::<Vec<_>>()
            );
            self.violation("cadence-no-run-lost", detail);
        }
        let stats = self.stats;
        self.sim.note(format!("cadence phase: {stats:?}"));
        let violations = (self.sim.world.violations.iter())
            .map(|v| format!("{}: {}", v.invariant, v.detail))
            .collect();
        Cadence {
            stats,
            ended: crate::testkit::explore::walk::ended(&self.sim),
            violations,
            trail: self.sim.take_trail(),
        }
    }

    /// The cadence checks (timely seeds), at every event.
    fn check_cadence(&mut self) {
        let now = self.sim.now;
        let gap = now.saturating_since(self.last_session);
        self.stats.max_heartbeat_gap = self.stats.max_heartbeat_gap.max(gap);
        let mut late = None;
        for process in (self.sim.world.supervisor.processes.iter())
            .filter(|p| p.state == ProcessState::Running)
        {
            let offer = &process.offer_id;
            if let (Some(last), Some(running)) =
                (self.last_grant.get(offer), self.running_at.get(offer))
            {
                // From the running ACK on (the start path's renewals are checked by their
                // outcome: `cadence-no-run-lost`).
                let gap = now.saturating_since((*last).max(*running));
                self.stats.max_renewal_gap = self.stats.max_renewal_gap.max(gap);
                if gap > self.stats.renewal_bound && late.is_none() {
                    late = Some((offer.clone(), gap));
                }
            }
        }
        if !self.stats.timely {
            return;
        }
        if let Some((offer, gap)) = late {
            let bound = self.stats.renewal_bound;
            self.violation(
                "renewal-cadence",
                format!(
                    "the lease of running {offer} was not renewed for {gap} ms (bound {bound} ms)"
                ),
            );
        }
        if gap > self.stats.heartbeat_bound {
            let bound = self.stats.heartbeat_bound;
            self.violation(
                "heartbeat-cadence",
                format!("no Session exchange applied for {gap} ms (bound {bound} ms)"),
            );
        }
    }

    /// The requests being sent: all that are not across yet, or (the self-test's
    /// [`Lie::SerialCalls`]) only the oldest call, while no other call is waiting for its answer.
    fn sending(&self) -> Vec<usize> {
        let serial = self.lie == Some(Lie::SerialCalls);
        let first = self.flights.first().filter(|f| f.arrived.is_none());
        (self.flights.iter().enumerate())
            .filter(|(i, f)| f.arrived.is_none() && (!serial || (*i == 0 && first.is_some())))
            .map(|(i, _)| i)
            .collect()
    }

    /// When the first request still being sent will be across, at the rate shared equally.
    fn next_transfer(&self) -> Option<UnixMillis> {
        let sending = self.sending();
        let count = u64::try_from(sending.len()).unwrap_or(1);
        let least = sending.iter().map(|i| self.flights[*i].left).min()?;
        let ms_left = (least.saturating_mul(count))
            .div_ceil(self.stats.rate)
            .max(1);
        Some(ms(self.sim.now.get().saturating_add(ms_left)))
    }

    /// `elapsed` milliseconds of the uplink, shared equally by the requests being sent.
    fn send(&mut self, elapsed: u64) {
        let sending = self.sending();
        let Some(share) = (self.stats.rate.saturating_mul(elapsed))
            .checked_div(u64::try_from(sending.len()).unwrap_or(1))
        else {
            return;
        };
        for i in sending {
            self.flights[i].left = self.flights[i].left.saturating_sub(share);
        }
    }
}
