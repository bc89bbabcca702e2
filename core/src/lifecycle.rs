//! The lifecycle tick (reference §4.7): what one tick plans, and how finished operations feed
//! the next. Every decision here is a pure function of the Worker's memory and `now`.
//!
//! One tick, in order:
//! 1. `Registering`: register the Session (retried every tick until it answers).
//! 2. `Reconciling`: one page of the inbox per tick, before any Pull: recovery evidence latches
//!    fail-closed; `accepted`, `starting_acknowledged`, `launching`, `started` and `start_failed`
//!    records go to the Processor (restart rules of reference §4.8).
//! 3. `Active` / `Draining`: heartbeat when due; supervise one page (cursor kept across ticks) —
//!    completion first, then lease control; then, only when active, not fail-closed, the
//!    Session usable, a slot free and no backoff pending: one Pull, whose admitted offer is
//!    processed at once. Draining stops once every known record is settled, or when the drain
//!    budget ends.
//!
//! Fail-closed (recovery evidence seen): no Pull and no new launch (`accepted` and
//! `starting_acknowledged` records wait); supervision, receipt-first completion, running-ACK
//! replays and start-failure replays continue, because none of them can start a process.

use alloc::vec::Vec;

use crate::facts::Fact;
use crate::ids::OfferId;
use crate::ops::CallFault;
use crate::ops::{Finished, ListResult};
use crate::pull::PullResult;
use crate::record::{InboxRecord, RecoveryReason, State};
use crate::session::{Exchange, SessionResult};
use crate::supervision::SupervisionResult;
use crate::time::MonoMillis;
use crate::worker::{
    Drain, HaltReason, ListPurpose, SessionStatus, Stage, StopReason, Timer, Work, Worker,
};

/// Why the Worker does not Pull now ([`Worker::pull_blocker`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PullBlocker {
    /// Not in the active phase (registering, reconciling, draining, finished).
    NotActive,
    /// Recovery evidence is present.
    FailClosed,
    /// Admission is paused: the credentials were refused, or the Session is being registered
    /// again after a fence.
    AdmissionPaused,
    /// No usable, online Session.
    Session,
    /// The inbox has no room for one more record.
    InboxFull,
    /// Every Run slot is taken.
    Slots,
    /// A Pull backoff is pending.
    Backoff,
}

impl Worker {
    /// Plans a tick when its time has come. A spurious early wake-up is a no-op. Operations
    /// still in flight do not hold a tick back: its periodic work (the heartbeat first, then a
    /// supervision page and a Pull) joins the queue unless the same work is already queued or
    /// in progress, and each starts as soon as its lane is free (see `worker::Lane`).
    pub(crate) fn on_tick(&mut self) {
        if self.due(&Timer::DrainBudget) {
            self.timers.remove(&Timer::DrainBudget);
            // ADR-0121: ownership is kept until every record is settled. The Runs still in
            // flight are stopped by identity and completed through the normal path; records
            // that cannot settle any more no longer hold the drain (`holds_drain`).
            self.drain = Drain::BudgetEnded;
            let in_flight = self.in_flight();
            self.fact(|| Fact::DrainBudgetEnded { in_flight });
            match self.stage {
                Stage::Draining => {}
                // Never registered: nothing of this incarnation runs.
                Stage::Registering => return self.stop(StopReason::NotRegistered),
                // Reconciliation never finished (reads kept failing).
                Stage::Reconciling | Stage::Active | Stage::Finished(_) => {
                    return self.stop(StopReason::Unsettled);
                }
            }
            self.tick_now();
        }
        self.plan_timers();
        if !self.due(&Timer::Tick) {
            return;
        }
        let next = self.mono.saturating_add(self.config.cadence_ms);
        self.timers.insert(Timer::Tick, next);
        match self.stage {
            Stage::Registering if self.register_backing_off() => {}
            Stage::Registering => {
                if !self.planned(&Work::Register) {
                    self.queue.push_back(Work::Register);
                }
            }
            Stage::Reconciling => {
                if !self.listing(ListPurpose::Reconcile) {
                    self.queue.push_back(Work::ListPage {
                        purpose: ListPurpose::Reconcile,
                        after: self.reconcile_cursor.clone(),
                    });
                }
            }
            Stage::Active | Stage::Draining => self.plan_active_tick(),
            Stage::Finished(_) => {}
        }
    }

    /// A start-path pass ended: a renewal of its whose answer was lost may have moved the
    /// control plane's lease version (the next pass catches up to it: `lease_may_hold`).
    fn on_processed(&mut self, offer_id: OfferId, result: &crate::processor::ProcessResult) {
        if let crate::processor::ProcessResult::RenewalUncertain { attempted, .. } = result
            && let Ok(next) = attempted.next()
        {
            let held = self.lease_may_hold.entry(offer_id.clone()).or_insert(next);
            *held = (*held).max(next);
        }
        self.rearm_after_start(offer_id);
    }

    /// A Run that got past its start path: its lease's renewal timer may have come while it was
    /// starting (and was dropped then); it is set again, from the sending of the call that
    /// obtained the lease.
    fn rearm_after_start(&mut self, offer_id: OfferId) {
        let running = matches!(
            self.known.get(&offer_id),
            Some(State::Started | State::RunningAcknowledged)
        );
        if let (true, Some(began)) = (running, self.leases.get(&offer_id).map(|c| c.began)) {
            self.arm_renewal(&offer_id, began);
        }
    }

    /// Plans the work of every timer that has come (see [`Timer`]), without waiting for the
    /// tick: a heartbeat, a running Run's renewal (through its supervision pass, which renews
    /// beside an upload in progress). Each fires once; a heartbeat that cannot go out yet
    /// (registering, reconciling, registering again after a fence) is set again a cadence
    /// later. The drain budget and the tick are `on_tick`'s; a backoff is a gate.
    fn plan_timers(&mut self) {
        let due: Vec<Timer> = self
            .timers
            .iter()
            .filter(|(timer, at)| self.mono >= **at && timer.plans_work())
            .map(|(timer, _)| timer.clone())
            .collect();
        let active = matches!(self.stage, Stage::Active | Stage::Draining) && !self.rejoin;
        for timer in due {
            self.timers.remove(&timer);
            match timer {
                Timer::Heartbeat if !active => {
                    let again = self.mono.saturating_add(self.config.cadence_ms);
                    self.timers.insert(Timer::Heartbeat, again);
                }
                Timer::Heartbeat => {
                    if self.session.is_some() && !self.planned(&Work::Heartbeat) {
                        self.queue.push_front(Work::Heartbeat);
                    }
                }
                Timer::Renewal(offer_id) => {
                    let running = matches!(
                        self.known.get(&offer_id),
                        Some(State::Started | State::RunningAcknowledged)
                    );
                    // Queued even while a pass of this offer is in progress: if that pass
                    // goes on to upload the log, the renewal starts beside the upload at once
                    // (`Worker::next_startable`) rather than at the next supervision page.
                    let work = Work::Supervise(offer_id.clone());
                    if active
                        && running
                        && !self.queue.contains(&work)
                        && !self.planned(&Work::Renew(offer_id))
                    {
                        self.queue.push_back(work);
                    }
                }
                Timer::Tick | Timer::DrainBudget | Timer::RegisterBackoff | Timer::PullBackoff => {}
            }
        }
    }

    /// The active tick: after a fence, the register again (first, ahead of anything still
    /// queued; the heartbeat is [`Timer::Heartbeat`]'s), the receipts whose removal failed, one
    /// supervision page, then a Pull or the Session renewal. Nothing already queued is queued
    /// twice.
    fn plan_active_tick(&mut self) {
        // Fenced: register again before anything else talks to the control plane (after the
        // backoff of a register that got no usable answer).
        if self.rejoin && !self.register_backing_off() && !self.planned(&Work::Rejoin) {
            self.queue.push_front(Work::Rejoin);
        }
        // A receipt whose removal failed holds the capability: retry every tick until it is gone.
        let cleanup: Vec<Work> = self
            .pending_cleanup
            .iter()
            .map(|offer_id| Work::Supervise(offer_id.clone()))
            .filter(|work| !self.planned(work))
            .collect();
        self.queue.extend(cleanup);
        if !self.listing(ListPurpose::Supervise) {
            self.queue.push_back(Work::ListPage {
                purpose: ListPurpose::Supervise,
                after: self.supervision_cursor.clone(),
            });
        }
        if self.renewal_due() {
            self.queue.push_back(Work::RenewSession);
        } else {
            self.pull_again(false);
        }
    }

    /// Whether a page is queued or being listed for `purpose`.
    fn listing(&self, purpose: ListPurpose) -> bool {
        let listing = |w: &Work| matches!(w, Work::ListPage { purpose: p, .. } if *p == purpose);
        self.queue.iter().any(listing) || self.lanes.values().any(|s| listing(&s.work))
    }

    /// A register got no usable answer and its backoff has not passed.
    fn register_backing_off(&self) -> bool {
        self.pending(&Timer::RegisterBackoff)
    }

    /// Why the Worker does not Pull now, if it does not: not active, fail-closed, admission
    /// paused, no usable online Session, no room in the inbox, no free slot, or a backoff
    /// pending. The order is the order of the checks; [`PullBlocker::InboxFull`] comes before
    /// the slots so that a full inbox is reported whatever the Runs do.
    pub(crate) fn pull_blocker(&self) -> Option<PullBlocker> {
        let online = self
            .session
            .as_ref()
            .is_some_and(|s| s.usable(self.mono) && s.status == SessionStatus::Online);
        if self.stage != Stage::Active {
            Some(PullBlocker::NotActive)
        } else if self.fail_closed.is_some() {
            Some(PullBlocker::FailClosed)
        } else if self.admission_paused() {
            Some(PullBlocker::AdmissionPaused)
        } else if !online {
            Some(PullBlocker::Session)
        } else if self.inbox_room() == 0 {
            Some(PullBlocker::InboxFull)
        } else if self.active_count() >= usize::from(self.config.max_concurrent_runs) {
            Some(PullBlocker::Slots)
        } else if self.pending(&Timer::PullBackoff) {
            Some(PullBlocker::Backoff)
        } else {
            None
        }
    }

    /// Whether a Pull may go out now: active, not fail-closed, admission not paused, the Session
    /// usable and online, a
    /// place free in the inbox, a slot free and no backoff. Records what the decision saw of
    /// the inbox: whether it was full, and one more deferral when that held the Pull back.
    pub(crate) fn decide_pull(&mut self) -> bool {
        let blocker = self.pull_blocker();
        if blocker != Some(PullBlocker::NotActive) {
            self.inbox.full = blocker == Some(PullBlocker::InboxFull);
            if self.inbox.full {
                self.inbox.full_deferrals = self.inbox.full_deferrals.saturating_add(1);
            }
        }
        blocker.is_none()
    }

    /// Places left in the inbox: the capacity less every record the Worker knows of, settled
    /// ones included (they leave only when retention reports them removed).
    pub(crate) fn inbox_room(&self) -> usize {
        self.config.capacity.get().saturating_sub(self.known.len())
    }

    /// Whether a start that found its Session draining or offline (a previous incarnation's
    /// unfinished drain) may now replace it: active, no drain of its own, and no Run of that
    /// Session live any more (an offline Session serves none). Until then its Runs finish under
    /// it: a new Session fences every lease of the old one at the control plane.
    fn renewal_due(&self) -> bool {
        self.renewal_ready() && !self.planned(&Work::RenewSession)
    }

    /// [`Self::renewal_due`] without the queue: checked again when the renewal starts (work
    /// queued before it, such as a launch of a `lease_recovery` record, may have started a Run
    /// of the old Session meanwhile).
    pub(crate) fn renewal_ready(&self) -> bool {
        let offline = self
            .session
            .as_ref()
            .is_some_and(|s| s.status == SessionStatus::Offline);
        self.retiring
            && self.stage == Stage::Active
            && self.drain == Drain::NotRequested
            && (offline || !self.holds_live_runs())
    }

    /// Records that may hold a process, or be completed from a receipt: past the spawn barrier
    /// and not settled.
    fn holds_live_runs(&self) -> bool {
        self.known.values().any(|s| {
            matches!(
                s,
                State::Launching | State::Started | State::RunningAcknowledged
            )
        }) || self
            .evidence
            .values()
            .any(|r| *r == RecoveryReason::LaunchOutcomeUnknown)
    }

    /// Whether a launch (starting ACK and spawn) may begin now.
    pub(crate) fn may_launch(&self) -> bool {
        self.fail_closed.is_none() && self.drain == Drain::NotRequested
    }

    /// Slots offered to the control plane: the free Run slots, but never more than the inbox
    /// can still store (less one place for a pending claim, which may still bring a record).
    pub(crate) fn available_slots(&self) -> u64 {
        if self.drain != Drain::NotRequested
            || self.fail_closed.is_some()
            || self.admission_paused()
        {
            return 0;
        }
        let max = usize::from(self.config.max_concurrent_runs);
        let room = self
            .inbox_room()
            .saturating_sub(usize::from(self.claim_pending));
        u64::try_from(max.saturating_sub(self.active_count()).min(room)).unwrap_or(0)
    }

    /// Queues a Pull right away (a burst, or a slot freed between ticks) when one may go out and
    /// none is queued. The control plane offers nothing to a Session whose last heartbeat (or
    /// register) reported no free slot: then a heartbeat that reports the slots goes first.
    fn pull_again(&mut self, at_front: bool) {
        if self.planned(&Work::Pull) || !self.decide_pull() {
            return;
        }
        let stale = self.reported_slots == Some(0) && !self.planned(&Work::Heartbeat);
        if at_front {
            self.queue.push_front(Work::Pull);
            if stale {
                self.queue.push_front(Work::Heartbeat);
            }
        } else {
            if stale {
                self.queue.push_back(Work::Heartbeat);
            }
            self.queue.push_back(Work::Pull);
        }
    }

    /// Applies a finished operation and queues what follows from it.
    pub(crate) fn on_finished(&mut self, finished: Finished, call_sent: MonoMillis) {
        if self.facts.is_some()
            && let Some(fact) = finished.fact()
        {
            self.fact(|| fact);
        }
        match finished {
            Finished::Session(result) => self.on_session(result, call_sent),
            Finished::Listed(result) => self.on_listed(result),
            Finished::Pull(result) => self.on_pull(result),
            // Recovery evidence an operation wrote was observed with its durable write.
            Finished::Process { offer_id, result } => self.on_processed(offer_id, &result),
            Finished::Supervise { offer_id, result } => {
                use crate::completion::{Cleanup, CompletionOutcome};
                let pending = matches!(
                    result,
                    SupervisionResult::Completed(
                        CompletionOutcome::Acknowledged(Cleanup::Pending)
                            | CompletionOutcome::AlreadyCompleted(Cleanup::Pending)
                    )
                );
                match &result {
                    SupervisionResult::Uncertain { attempted, .. } => {
                        if let Ok(next) = attempted.next() {
                            let held = self.lease_may_hold.entry(offer_id.clone()).or_insert(next);
                            *held = (*held).max(next);
                        }
                    }
                    SupervisionResult::Renewed | SupervisionResult::StopRequested(_) => {
                        // Paced from the renewal's sending: the next one is due
                        // `lease_control_interval` after it, however long the answer took (a
                        // slow control plane must not stretch the time between two renewals
                        // past the lease); the Worker wakes for it (`Timer::Renewal`, set
                        // when the renewed lease was written).
                        self.last_renewal.insert(offer_id.clone(), call_sent);
                        self.lease_may_hold.remove(&offer_id);
                    }
                    SupervisionResult::DrainStopped(_) => {
                        self.drain_stopped.insert(offer_id.clone());
                    }
                    SupervisionResult::Paced
                    | SupervisionResult::SessionUnavailable
                    | SupervisionResult::Unavailable
                    | SupervisionResult::Refused(_)
                    | SupervisionResult::LeaseResponseInvalid(_)
                    | SupervisionResult::StorageUnchanged
                    | SupervisionResult::Pending(_) => {}
                    SupervisionResult::NotFound
                    | SupervisionResult::Completed(_)
                    | SupervisionResult::Settled
                    | SupervisionResult::CompletionTerminal(_)
                    | SupervisionResult::LeaseExpired(_)
                    | SupervisionResult::Terminal(_)
                    | SupervisionResult::Recovered(..)
                    | SupervisionResult::SupervisorGone => {
                        self.last_renewal.remove(&offer_id);
                        self.timers.remove(&Timer::Renewal(offer_id.clone()));
                        self.lease_may_hold.remove(&offer_id);
                    }
                }
                // A pending cleanup ends only with a pass that reached it (completed) or a
                // record that is gone; a pass that ended before (a failed read, then `Settled`)
                // keeps it pending (whole-Worker simulation, seed 1913).
                if pending {
                    self.pending_cleanup.insert(offer_id);
                } else if matches!(
                    result,
                    SupervisionResult::Completed(_) | SupervisionResult::NotFound
                ) {
                    self.pending_cleanup.remove(&offer_id);
                }
                // A completion frees a slot: offered to the next Pull at once rather than at the
                // next tick (or, for a retiring Session, its last Run lets the new one in).
                if matches!(
                    result,
                    SupervisionResult::Completed(CompletionOutcome::Acknowledged(_))
                ) {
                    if self.renewal_due() {
                        self.queue.push_back(Work::RenewSession);
                    } else {
                        self.pull_again(false);
                    }
                }
            }
        }
        self.maybe_finish_drain();
    }

    fn on_session(&mut self, result: SessionResult, call_sent: MonoMillis) {
        let result_kind = match &result {
            SessionResult::Registered(_) => Kind::Registered,
            SessionResult::Heartbeat(_) => Kind::Heartbeat,
            _ => Kind::Other,
        };
        match result {
            SessionResult::Registered(view) | SessionResult::Heartbeat(view) => {
                self.reported_slots = self.reporting_slots.take();
                self.session_uncertain = false;
                if matches!(result_kind, Kind::Registered) {
                    self.register_failures = 0;
                    self.timers.remove(&Timer::RegisterBackoff);
                }
                if matches!(result_kind, Kind::Heartbeat) {
                    self.fences = 0;
                }
                if matches!(result_kind, Kind::Registered) && self.rejoin {
                    self.rejoin = false;
                    self.fact(|| Fact::Rejoined);
                    if self.stage == Stage::Draining {
                        // The new registration is online: announce the drain again, and let
                        // the final transition be queued anew.
                        self.transition_offline_queued = false;
                        self.queue
                            .push_back(Work::Transition(SessionStatus::Draining));
                    }
                }
                if self.stage == Stage::Registering {
                    // Draining or offline although this start asked for no drain: a previous
                    // incarnation stopped during its drain. See `renewal_due`.
                    self.retiring =
                        view.status != SessionStatus::Online && self.drain == Drain::NotRequested;
                }
                self.session = Some(view);
                // Paced from the exchange's sending, as renewals are: with a control plane
                // that takes long to answer, pacing from the answer would let the Session's
                // local deadline (the sending plus the lease) pass before the next answer.
                let heartbeat = call_sent.saturating_add(self.config.heartbeat_interval_ms);
                self.timers.insert(Timer::Heartbeat, heartbeat);
                if self.stage == Stage::Registering {
                    self.stage = Stage::Reconciling;
                    self.tick_now();
                }
            }
            SessionResult::Transitioned(view) => {
                self.session_uncertain = false;
                let offline = view.status == SessionStatus::Offline;
                self.session = Some(view);
                if offline {
                    self.stop(self.drain_end());
                }
            }
            SessionResult::Renewed(session_id) => {
                // The new id is durable: register it (then reconcile, then work). Everything
                // queued was planned for the old Session.
                self.config.session_id = session_id;
                self.session = None;
                self.reported_slots = None;
                self.retiring = false;
                self.stage = Stage::Registering;
                self.reconcile_cursor = None;
                self.queue.clear();
                self.tick_now();
                self.timers.remove(&Timer::Heartbeat);
            }
            SessionResult::Unanswered { exchange, fault } => self.on_unanswered(exchange, fault),
            SessionResult::Fenced(detail) => self.on_fenced(detail),
            SessionResult::Rejected(detail) => self.halt(HaltReason::RegisterRejected { detail }),
        }
    }

    /// A Session exchange got no usable answer: retried; the Session lease decides what stays
    /// usable.
    fn on_unanswered(&mut self, exchange: Exchange, fault: CallFault) {
        // An uncertain heartbeat or transition may have moved the Session's version at the
        // control plane: the fence that then answers the next exchange is expected (see
        // `on_fenced`). The next tick tries again.
        if !matches!(exchange, Exchange::Register) {
            let next_tick = self.tick_at();
            self.timers.insert(Timer::Heartbeat, next_tick);
        }
        if matches!(fault, CallFault::Uncertain(_))
            && matches!(exchange, Exchange::Heartbeat | Exchange::Transition(_))
        {
            self.session_uncertain = true;
        }
        match exchange {
            Exchange::Register => {
                self.register_failures = self.register_failures.saturating_add(1);
                let delay = register_backoff(self.config.backoff_base_ms, self.register_failures);
                let retry_at = self.mono.saturating_add(delay);
                self.timers.insert(Timer::RegisterBackoff, retry_at);
                let attempt = self.register_failures;
                self.fact(|| Fact::RegisterRetry {
                    attempt,
                    fault,
                    retry_in_ms: delay,
                });
            }
            Exchange::Heartbeat | Exchange::Transition(SessionStatus::Draining) => {}
            // Nothing is in flight (the final transition is queued only then): the
            // drain is done; the Session's lease expires at the control plane.
            Exchange::Transition(SessionStatus::Offline | SessionStatus::Online) => {
                self.stop(self.drain_end());
            }
        }
    }

    /// The Session was fenced: register it again (the reference's resume).
    fn on_fenced(&mut self, detail: alloc::string::String) {
        if !self.rejoin {
            // A fence right after an uncertain exchange is what a committed, unanswered
            // exchange leaves (the control plane holds version + 1): register again
            // (the reference's resume) without counting it against the Worker.
            let expected = core::mem::take(&mut self.session_uncertain);
            if !expected {
                self.fences = self.fences.saturating_add(1);
            }
            if self.fences > MAX_FENCES_IN_A_ROW {
                self.halt(HaltReason::SessionFenced {
                    detail: alloc::format!(
                        "{detail} ({} fences in a row, each after registering again)",
                        self.fences
                    ),
                });
                return;
            }
            let attempt = self.fences.max(1);
            self.rejoin = true;
            self.tick_now();
            self.fact(|| Fact::Rejoining {
                detail,
                attempt,
                after_uncertain: expected,
            });
        }
    }

    fn on_listed(&mut self, result: ListResult) {
        if result.failed {
            // Nothing was learned: keep the phase and the cursor; the next tick lists the same
            // page again (startup reconciliation never completes on a failed read).
            return;
        }
        for record in &result.records {
            self.observe(record);
        }
        match result.purpose {
            ListPurpose::Reconcile => {
                let work = reconcile_work(&result.records);
                // A settled completion's receipt may still be on disk (a crash before its
                // removal): its cleanup pass is retried every tick until one reaches the
                // receipt, like a failed removal's (a pass cut short by a failed read would
                // otherwise leave the capability on disk for good; simulation seed 5581).
                for r in &result.records {
                    if r.state == State::CompletionAcknowledged {
                        self.pending_cleanup.insert(r.offer.offer_id.clone());
                    }
                }
                for item in work {
                    if !self.queue.contains(&item) {
                        self.queue.push_back(item);
                    }
                }
                self.reconcile_cursor = result.next_after.clone();
                if result.next_after.is_none() {
                    if self.drain != Drain::NotRequested {
                        self.stage = Stage::Draining;
                        self.queue
                            .push_back(Work::Transition(SessionStatus::Draining));
                    } else {
                        self.stage = Stage::Active;
                    }
                }
                // The next page (or the first active tick) follows at once.
                self.tick_now();
            }
            ListPurpose::Supervise => {
                let active = result
                    .records
                    .iter()
                    .filter(|r| !r.state.is_terminal())
                    .count();
                let mut work = supervision_work(&result.records);
                // Settled records fill pages without needing supervision: when a page held fewer
                // active records than a page's worth, the next page follows in the same tick, so
                // the time between two visits of a live Run does not grow with settled records
                // (found by the crash campaign). Bounded: the cursor ends at the inbox's end.
                if active < self.config.supervision_page.get()
                    && let Some(after) = result.next_after.clone()
                {
                    work.push(Work::ListPage {
                        purpose: ListPurpose::Supervise,
                        after: Some(after),
                    });
                }
                // Supervision runs before the Pull queued behind it in this tick; what is queued
                // already is not queued twice (an offer's pass may outlast a tick).
                for item in work.into_iter().rev() {
                    if !self.queue.contains(&item) {
                        self.queue.push_front(item);
                    }
                }
                self.supervision_cursor = result.next_after;
            }
        }
    }

    fn on_pull(&mut self, result: PullResult) {
        match result {
            PullResult::Admitted { offer_id, .. } => {
                self.timers.remove(&Timer::PullBackoff);
                self.claim_pending = false;
                self.claim_backoff_served = false;
                // The offer is processed first, then the next Pull goes out at once while slots
                // and room remain (re-checked when it starts); an idle answer ends the burst.
                self.pull_again(true);
                self.queue.push_front(Work::Process(offer_id));
            }
            PullResult::Idle => {
                self.timers.remove(&Timer::PullBackoff);
                self.claim_pending = false;
                self.claim_backoff_served = false;
            }
            // The claim is gone: the next tick pulls afresh, with no backoff.
            PullResult::Refused { offer_id, reason } => {
                self.timers.remove(&Timer::PullBackoff);
                self.claim_pending = false;
                self.claim_backoff_served = false;
                self.notify(crate::worker::Notice::OfferRefused { offer_id, reason });
            }
            // The claim's backoff is waited out here, on the monotonic clock; the next Pull
            // does not compare its persisted wall-clock time again (`Pass::backoff_served`).
            PullResult::Backoff { retry_in_ms } => {
                let retry_at = self.mono.saturating_add(retry_in_ms);
                self.timers.insert(Timer::PullBackoff, retry_at);
                self.claim_pending = true;
                self.claim_backoff_served = true;
            }
            PullResult::Failed { retry_in_ms, fault } => {
                let retry_at = self.mono.saturating_add(retry_in_ms);
                self.timers.insert(Timer::PullBackoff, retry_at);
                self.claim_pending = fault != crate::pull::PullFault::BudgetExhausted;
                self.claim_backoff_served = self.claim_pending;
            }
            PullResult::SessionUnavailable => {}
        }
    }

    /// How a finished drain ends: every record settled, or some left for the next start.
    fn drain_end(&self) -> StopReason {
        if self.active_count() == 0 {
            StopReason::Drained
        } else {
            StopReason::Unsettled
        }
    }

    fn maybe_finish_drain(&mut self) {
        let settled = self.in_flight() == 0;
        if self.stage == Stage::Draining
            && settled
            && self.queue.is_empty()
            && self.lanes.is_empty()
            && !self.transition_offline_queued
        {
            self.transition_offline_queued = true;
            self.queue
                .push_back(Work::Transition(SessionStatus::Offline));
        }
    }
}

/// Fences of the Session in a row (each followed by registering again without a good heartbeat
/// in between) before the Worker halts.
const MAX_FENCES_IN_A_ROW: u8 = 3;

/// The wait before registering again after `failures` registers in a row got no usable answer:
/// `min(60 s, base · 2^(failures − 1))`, the Pull backoff's ceiling without its jitter (a
/// register is one per Worker, not one per claim, and the core draws no entropy for it).
pub(crate) fn register_backoff(base_ms: u64, failures: u32) -> u64 {
    let exponent = failures.saturating_sub(1).min(20);
    base_ms
        .saturating_mul(1u64 << exponent)
        .min(crate::pull::MAX_BACKOFF_MS)
}

/// Which Session result `on_session` handles.
#[derive(Clone, Copy)]
enum Kind {
    Registered,
    Heartbeat,
    Other,
}

/// Startup reconciliation (reference §4.7 step 2, §4.8): which records go to the Processor.
///
/// A `completion_acknowledged` record also gets one completion pass, which only removes its
/// receipt: a crash between the durable acknowledgement and the removal would otherwise leave
/// the receipt, and the capability it holds, on disk for good (settled records are never
/// supervised again).
fn reconcile_work(records: &[InboxRecord]) -> Vec<Work> {
    let mut work = Vec::new();
    for r in records {
        let id = r.offer.offer_id.clone();
        match r.state {
            State::Accepted
            | State::StartingAcknowledged
            | State::Launching
            | State::Started
            | State::StartFailed => work.push(Work::Process(id)),
            State::CompletionAcknowledged => work.push(Work::Supervise(id)),
            State::RunningAcknowledged
            | State::StartFailureAcknowledged
            | State::RecoveryRequired => {}
        }
    }
    work
}

/// Supervision of one page: completion first, then lease control, for every record that may
/// have a live process; running-ACK and start-failure replays; retries of unfinished starts.
fn supervision_work(records: &[InboxRecord]) -> Vec<Work> {
    let mut work = Vec::new();
    for r in records {
        let id = r.offer.offer_id.clone();
        match r.state {
            State::Accepted | State::StartingAcknowledged | State::StartFailed => {
                work.push(Work::Process(id));
            }
            State::Started => {
                work.push(Work::Process(id.clone()));
                work.push(Work::Supervise(id));
            }
            State::Launching | State::RunningAcknowledged => work.push(Work::Supervise(id)),
            State::RecoveryRequired => {
                if r.recovery_reason == Some(RecoveryReason::LaunchOutcomeUnknown) {
                    work.push(Work::Supervise(id));
                }
            }
            State::StartFailureAcknowledged | State::CompletionAcknowledged => {}
        }
    }
    work
}
