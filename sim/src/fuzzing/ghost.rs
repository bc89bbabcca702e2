//! What the fuzz host knows that the Worker must not (or cannot) see, and the safety
//! invariants checked against it. Every check panics with the invariant's name on violation.

use std::collections::{BTreeMap, BTreeSet};

use ql_worker_core::barrier::Barrier;
use ql_worker_core::ids::{AttemptId, OfferId, RunId, Sha256Digest};
use ql_worker_core::io::LaunchPlan;
use ql_worker_core::record::{InboxRecord, RecoveryReason, State};
use ql_worker_core::worker::HaltReason;

use super::samples;

/// What became of the one spawn an offer may get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SpawnFate {
    /// The command was emitted but never answered (crash): a process may exist.
    Emitted,
    /// The supervisor reported a process.
    Started,
    /// The supervisor proved that no process was started.
    Rejected,
    /// The outcome is unknown to the Worker (a process may exist).
    Unknown,
}

/// Which halts the last answer licenses: the Worker may halt only for a fact the host caused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct License {
    /// A write that may or may not have landed.
    pub uncertain: bool,
    /// A must-land write (a launch outcome) that failed cleanly.
    pub unrecorded: bool,
    /// The store refused a write.
    pub conflict: bool,
    /// Unsafe storage.
    pub unsafe_storage: bool,
    /// A Session exchange answered with anything but a valid answer.
    pub session: bool,
}

impl License {
    /// Whether `reason` is licensed.
    #[must_use]
    pub fn allows(self, reason: &HaltReason) -> bool {
        match reason {
            HaltReason::StoreUncertain => self.uncertain,
            HaltReason::LaunchOutcomeUnrecorded => self.unrecorded,
            HaltReason::StoreConflict => self.conflict,
            HaltReason::UnsafeStorage => self.unsafe_storage,
            HaltReason::SessionFenced { .. } | HaltReason::RegisterRejected { .. } => self.session,
        }
    }
}

/// The host's private knowledge.
#[derive(Debug, Default)]
pub struct Ghost {
    /// The spawn of each offer (at most one, ever).
    pub spawns: BTreeMap<OfferId, SpawnFate>,
    /// The offer whose spawn carried each Attempt (at most one spawn per Attempt, ever).
    pub attempt_spawns: BTreeMap<AttemptId, OfferId>,
    /// The offer whose spawn carried each Run. This plane never gives a Run a second Attempt,
    /// so at most one spawn per Run, ever.
    pub run_spawns: BTreeMap<RunId, OfferId>,
    /// Every capability candidate: the first 32 bytes of every entropy draw (and the preloaded
    /// capabilities), with their SHA-256.
    pub candidates: Vec<([u8; 32], Sha256Digest)>,
    /// The text forms (base64url, hex) of the capabilities in use: a candidate whose digest a
    /// record carries, or one a spawn plan carried.
    pub capabilities: Vec<[String; 2]>,
    /// The raw bytes of [`Self::capabilities`].
    pub raw_capabilities: Vec<[u8; 32]>,
    /// Secret values handed out by the control plane.
    pub secret_values: Vec<String>,
    /// Log uploads answered valid in this incarnation: byte length and SHA-256 per offer.
    pub uploaded: BTreeMap<OfferId, (u64, Sha256Digest)>,
    /// Whether the last receipt served for an attempt (in this incarnation) was genuine.
    pub genuine: BTreeMap<AttemptId, bool>,
    /// Executor handles the supervisor issued.
    pub handles: BTreeSet<String>,
    /// A drain was requested in this incarnation.
    pub drain_requested: bool,
    /// The Worker was fail-closed when the current tick began and has not lifted it since (a
    /// `launch_outcome_unknown` Run completed from its receipt lifts it at once; a Pull may be
    /// planned from then on, e.g. for the slot that completion freed).
    pub latched_at_tick: bool,
    /// Startup reconciliation listed every page (a reconciliation page answered validly with
    /// no next cursor) in this incarnation.
    pub reconciled: bool,
    /// Per offer, the recovery reasons something the seed injected leads to (SPEC §5, §8;
    /// reference §4.2, §4.6): `launch_outcome_unknown` after a crash, halt, stop or fault while
    /// the record was durably `launching` (or a preloaded `launching` record);
    /// `control_plane_already_running` after the control plane answered `already_running`;
    /// `control_plane_terminal` after it said the Run is terminal; `lease_lost_local_execution_stopped`
    /// after the host said a Run's supervisor and process are gone without a receipt.
    /// `lease_lost_*` is also licensed by its own trigger, checked when written: the durable
    /// lease has expired locally.
    pub recovery_causes: BTreeMap<OfferId, BTreeSet<RecoveryReason>>,
    /// The state the Worker last proposed for each offer's record, in this simulation.
    pub written: BTreeMap<OfferId, State>,
    /// The exit code of the last completion the Worker reported per offer.
    pub completion_exit: BTreeMap<OfferId, u64>,
}

impl Ghost {
    /// Forgets what an incarnation knew (a crash or restart).
    pub fn restart(&mut self) {
        self.uploaded.clear();
        self.genuine.clear();
        self.drain_requested = false;
        self.latched_at_tick = false;
        self.reconciled = false;
    }

    /// Pull rules: never after a drain request, never while fail-closed, never before startup
    /// reconciliation has seen the whole inbox.
    pub fn check_pull(&self, latched: bool) {
        assert!(
            !self.drain_requested,
            "INVARIANT drain: a Pull began after the drain was requested"
        );
        assert!(
            !self.latched_at_tick,
            "INVARIANT fail-closed: a Pull planned while the Worker is fail-closed"
        );
        assert!(
            !latched,
            "INVARIANT fail-closed: a Pull began after supervision latched fail-closed in the \
             same tick (reference lifecycle test 6.7 #4)"
        );
        assert!(
            self.reconciled,
            "INVARIANT reconcile-first: a Pull before startup reconciliation listed the whole \
             inbox"
        );
    }

    /// Spawn rules: at most one spawn per offer, per Attempt and per Run across crashes, only
    /// from a durable `launching` record whose barrier fields are the plan's.
    pub fn check_spawn(&mut self, plan: &LaunchPlan, stored: Option<&InboxRecord>) {
        let offer = &plan.offer_id;
        assert!(
            !self.spawns.contains_key(offer),
            "INVARIANT at-most-one-spawn: a second spawn for {offer}"
        );
        if let Some(first) = self.attempt_spawns.get(&plan.attempt_id) {
            panic!(
                "INVARIANT at-most-once-attempt: a second spawn of Attempt {} (offers {first} \
                 and {offer})",
                plan.attempt_id
            );
        }
        if let Some(first) = self.run_spawns.get(&plan.run_id) {
            panic!(
                "INVARIANT at-most-once-run: a second spawn of Run {} (offers {first} and \
                 {offer}) without a new Attempt from the control plane",
                plan.run_id
            );
        }
        let Some(record) = stored else {
            panic!("INVARIANT spawn-barrier: spawn for {offer} without a durable record");
        };
        if let Err(field) = Barrier::of(plan).check(record) {
            panic!(
                "INVARIANT spawn-barrier: spawn for {offer} against a durable record that differs: {field}"
            );
        }
        assert!(
            !self.drain_requested,
            "INVARIANT drain: a spawn after the drain was requested"
        );
        self.spawns.insert(offer.clone(), SpawnFate::Emitted);
        self.attempt_spawns
            .insert(plan.attempt_id.clone(), offer.clone());
        self.run_spawns.insert(plan.run_id.clone(), offer.clone());
        self.capability(*plan.capability.expose());
    }

    /// `start-failure` only with proof that no process was started.
    pub fn check_start_failure(&self, offer: &OfferId) {
        let fate = self.spawns.get(offer);
        assert!(
            matches!(fate, None | Some(SpawnFate::Rejected)),
            "INVARIANT start-failure-proof: start-failure for {offer} after spawn fate {fate:?}"
        );
    }

    /// Remembers a candidate capability (an entropy draw).
    pub fn candidate(&mut self, bytes: [u8; 32]) {
        self.candidates.push((bytes, Sha256Digest::of(&bytes)));
    }

    /// Marks `bytes` as a capability in use.
    pub fn capability(&mut self, bytes: [u8; 32]) {
        if !self.raw_capabilities.contains(&bytes) {
            self.raw_capabilities.push(bytes);
            let hex = Sha256Digest::from_bytes(bytes).to_hex();
            self.capabilities.push([samples::base64url(&bytes), hex]);
        }
    }

    /// Marks the candidate whose SHA-256 is `digest` as a capability in use.
    pub fn capability_of(&mut self, digest: &Sha256Digest) {
        let found = self
            .candidates
            .iter()
            .find(|(_, d)| d == digest)
            .map(|(b, _)| *b);
        if let Some(bytes) = found {
            self.capability(bytes);
        }
    }

    /// No capability in use (raw, base64url or hex) and no Secret value in `bytes` (an
    /// envelope or a request body).
    pub fn check_no_secret(&self, what: &str, bytes: &[u8]) {
        for (raw, [b64, hex]) in self.raw_capabilities.iter().zip(&self.capabilities) {
            let found = contains(bytes, raw)
                || contains(bytes, b64.as_bytes())
                || contains(bytes, hex.as_bytes());
            assert!(
                !found,
                "INVARIANT no-capability-at-rest: {what} holds a capability"
            );
        }
        for value in &self.secret_values {
            assert!(
                !contains(bytes, value.as_bytes()),
                "INVARIANT no-secret-at-rest: {what} holds a Secret value"
            );
        }
    }

    /// Licenses `reason` for `offer` (a fault or answer that leads there happened).
    pub fn cause(&mut self, offer: &OfferId, reason: RecoveryReason) {
        self.recovery_causes
            .entry(offer.clone())
            .or_default()
            .insert(reason);
    }

    /// A `recovery_required` record only for a cause the seed injected: a licensed reason
    /// ([`Self::recovery_causes`]), or a lease-loss reason once the durable lease has expired at
    /// `now`.
    /// `slack`: how long before the control plane's expiry the Worker's local deadline of this
    /// lease falls (the call that granted it was on its way that long; `Host::lease_slack`).
    pub fn check_recovery(
        &self,
        record: &InboxRecord,
        now: ql_worker_core::time::UnixMillis,
        slack: u64,
    ) {
        let expired = record.offer.lease.expires_at_ms.get().saturating_sub(slack) <= now.get();
        let Some(reason) = record.recovery_reason else {
            return;
        };
        let offer = &record.offer.offer_id;
        let licensed = match reason {
            RecoveryReason::LeaseLostLocalExecutionUnverified => {
                expired
                    || self
                        .recovery_causes
                        .get(offer)
                        .is_some_and(|causes| causes.contains(&reason))
            }
            // Also licensed without expiry once the host said the supervisor and the process
            // are gone with no receipt (issue 16).
            RecoveryReason::LeaseLostLocalExecutionStopped => {
                expired
                    || self
                        .recovery_causes
                        .get(offer)
                        .is_some_and(|causes| causes.contains(&reason))
            }
            RecoveryReason::LaunchOutcomeUnknown
            | RecoveryReason::ControlPlaneAlreadyRunning
            | RecoveryReason::ControlPlaneTerminal => self
                .recovery_causes
                .get(offer)
                .is_some_and(|causes| causes.contains(&reason)),
        };
        assert!(
            licensed,
            "INVARIANT recovery-licensed: {offer} recovery_required({reason}) without an injected \
             fault that leads there (causes seen: {:?}; lease expires {}, now {now})",
            self.recovery_causes.get(offer),
            record.offer.lease.expires_at_ms
        );
    }

    /// State rules of one durable record against the ghost.
    pub fn check_record(&self, record: &InboxRecord) {
        let offer = &record.offer.offer_id;
        let fate = self.spawns.get(offer).copied();
        match record.state {
            State::StartFailed | State::StartFailureAcknowledged => assert!(
                matches!(fate, None | Some(SpawnFate::Rejected)),
                "INVARIANT start-failure-proof: {offer} is {} after spawn fate {fate:?}",
                record.state
            ),
            State::Started | State::RunningAcknowledged => assert_eq!(
                fate,
                Some(SpawnFate::Started),
                "INVARIANT started-needs-spawn: {offer} is {} after spawn fate {fate:?}",
                record.state
            ),
            State::RecoveryRequired
                if record.recovery_reason == Some(RecoveryReason::LaunchOutcomeUnknown) => {}
            State::Accepted
            | State::StartingAcknowledged
            | State::Launching
            | State::CompletionAcknowledged
            | State::RecoveryRequired => {}
        }
    }
}

/// Whether `needle` occurs in `haystack` (first-byte filter before each comparison).
#[must_use]
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    let Some(first) = needle.first() else {
        return false;
    };
    haystack
        .windows(needle.len())
        .any(|w| w[0] == *first && w == needle)
}
