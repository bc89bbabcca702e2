//! The simulated supervisor: spawns (after re-verifying the durable barrier), stops, and
//! processes that exit and leave a receipt. Processes survive Worker crashes.

use std::hash::Hasher;

use base64::Engine as _;

use super::disk::{Log, StoredReceipt};
use super::{Answer, World, hash_debug};
use ql_worker_core::barrier::Barrier;
use ql_worker_core::ids::{
    AttemptId, CallbackSequence, CapabilityDigest, ExecutorHandle, LogArtifactId, OfferId, RunId,
    Sha256Digest,
};
use ql_worker_core::io::{LaunchPlan, Liveness, Outcome, SpawnOutcome, StopOutcome};
use ql_worker_core::receipt::{RECEIPT_SCHEMA_VERSION, Receipt, ReceiptToken};
use ql_worker_core::record::RecoveryReason;
use ql_worker_core::revision::ExecCommand;
use ql_worker_core::time::UnixMillis;

/// A launch plan as the simulated supervisor receives it: built from the [`LaunchPlan`] of a
/// spawn command ([`SpawnPlan::of`]), with the raw capability (the real supervisor holds it in
/// memory too, and writes it only into the receipt) and the environment's values in plain text.
#[derive(Clone, PartialEq, Eq)]
pub struct SpawnPlan {
    /// Offer.
    pub offer_id: OfferId,
    /// Run.
    pub run_id: RunId,
    /// Attempt.
    pub attempt_id: AttemptId,
    /// Durable pre-spawn time.
    pub executor_started_at: UnixMillis,
    /// What to run.
    pub command: ExecCommand,
    /// The exact environment (Secret values included).
    pub environment: Vec<(String, String)>,
    /// Working directory.
    pub working_directory: Option<String>,
    /// Timeout and deadline.
    pub timeout: Option<(u64, UnixMillis)>,
    /// Log artifact.
    pub log_artifact_id: LogArtifactId,
    /// Callback sequence.
    pub callback_sequence: CallbackSequence,
    /// The raw 32-byte completion capability.
    pub capability: [u8; 32],
}

impl std::fmt::Debug for SpawnPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SpawnPlan")
            .field("offer_id", &self.offer_id)
            .field("attempt_id", &self.attempt_id)
            .field("executor_started_at", &self.executor_started_at)
            .field("capability", &"[redacted]")
            .finish_non_exhaustive()
    }
}

impl SpawnPlan {
    /// What the supervisor receives for `plan`.
    #[must_use]
    pub fn of(plan: &LaunchPlan) -> Self {
        Self {
            offer_id: plan.offer_id.clone(),
            run_id: plan.run_id.clone(),
            attempt_id: plan.attempt_id.clone(),
            executor_started_at: plan.executor_started_at,
            command: plan.command.clone(),
            environment: plan
                .environment
                .iter()
                .map(|(n, v)| (n.clone(), String::from(v.as_str())))
                .collect(),
            working_directory: plan.working_directory.clone(),
            timeout: plan.timeout,
            log_artifact_id: plan.log_artifact_id.clone(),
            callback_sequence: plan.callback_sequence,
            capability: *plan.capability.expose(),
        }
    }

    /// SHA-256 of the raw capability (what the `launching` record must carry).
    #[must_use]
    pub fn digest(&self) -> Sha256Digest {
        Sha256Digest::of(&self.capability)
    }

    /// What the durable `launching` record must hold for this plan to spawn (core's one rule,
    /// [`Barrier::check`], which the real supervisor runs too).
    #[must_use]
    pub fn barrier(&self) -> Barrier<'_> {
        Barrier {
            offer_id: &self.offer_id,
            run_id: &self.run_id,
            attempt_id: &self.attempt_id,
            callback_sequence: self.callback_sequence,
            token_digest: CapabilityDigest::new(self.digest()),
            log_artifact_id: &self.log_artifact_id,
            executor_started_at: self.executor_started_at,
        }
    }
}

/// What a process leaves behind when it exits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ReceiptKind {
    /// The supervisor's honest receipt (the capability from the launch plan).
    Genuine,
    /// A well-formed receipt whose token is not the capability.
    Forged,
    /// A file the receipt store cannot read as a receipt.
    Malformed,
    /// No receipt at all.
    Missing,
}

/// Whether a process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProcessState {
    /// Running.
    Running,
    /// Exited with a code.
    Exited(u8),
}

/// One user process under the supervisor.
#[derive(Clone, PartialEq, Eq)]
pub struct Process {
    /// Offer.
    pub offer_id: OfferId,
    /// Run.
    pub run_id: RunId,
    /// Attempt.
    pub attempt_id: AttemptId,
    /// Durable handle (as reported; may be unusable for [`Answer::BadHandle`]).
    pub handle: String,
    /// Start time from the plan.
    pub started_at: UnixMillis,
    /// Callback sequence from the plan.
    pub sequence: CallbackSequence,
    /// The raw capability from the plan.
    pub capability: [u8; 32],
    /// Log it writes to.
    pub log_artifact_id: LogArtifactId,
    /// Running or exited.
    pub state: ProcessState,
}

impl std::fmt::Debug for Process {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Process")
            .field("offer_id", &self.offer_id)
            .field("handle", &self.handle)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// The process table.
#[derive(Clone, Debug, Default)]
pub struct Supervisor {
    /// Every process ever spawned, in spawn order.
    pub processes: Vec<Process>,
}

impl Supervisor {
    /// The process with this durable handle.
    #[must_use]
    pub fn by_handle(&self, handle: &str) -> Option<&Process> {
        self.processes.iter().find(|p| p.handle == handle)
    }

    /// Processes of `offer_id`.
    pub fn of_offer<'a>(&'a self, offer_id: &'a OfferId) -> impl Iterator<Item = &'a Process> {
        self.processes
            .iter()
            .filter(move |p| p.offer_id == *offer_id)
    }

    pub(super) fn fingerprint(&self, hasher: &mut dyn Hasher) {
        for p in &self.processes {
            hash_debug(hasher, p);
            hasher.write(&p.capability);
            hash_debug(hasher, &(p.started_at, p.sequence));
        }
    }
}

fn receipt_token(bytes: &[u8; 32]) -> ReceiptToken {
    let text = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
    // INVARIANT: 43 base64url characters satisfy the token rule.
    ReceiptToken::new(text).expect("receipt token")
}

impl World {
    /// The barrier check the real supervisor runs before spawning: the durable record is
    /// `launching` and matches the plan exactly.
    fn barrier_holds(&self, plan: &SpawnPlan) -> bool {
        self.disk
            .record(&plan.offer_id)
            .is_some_and(|r| plan.barrier().check(r).is_ok())
    }

    pub(super) fn spawn(&mut self, plan: &LaunchPlan, answer: Answer) -> Outcome {
        let plan = &SpawnPlan::of(plan);
        // The real supervisor re-reads the inbox and refuses a drifted barrier: zero spawns.
        let barrier = self.barrier_holds(plan);
        let answer = if barrier { answer } else { Answer::Rejected };
        let entry = self
            .evidence
            .spawns
            .entry(plan.offer_id.clone())
            .or_insert((0, Answer::Ok));
        entry.0 += 1;
        entry.1 = answer;
        if !barrier {
            return Outcome::Spawned(SpawnOutcome::Rejected);
        }
        let exists = matches!(
            answer,
            Answer::Ok | Answer::BadHandle | Answer::UnknownSpawned
        );
        let handle = format!(
            "ql3lp1.sim.{}.{}",
            plan.attempt_id,
            self.supervisor.processes.len()
        );
        if exists {
            // Published durably before the user command runs (issue 16).
            self.disk
                .published
                .insert(plan.attempt_id.clone(), handle.clone());
            self.supervisor.processes.push(Process {
                offer_id: plan.offer_id.clone(),
                run_id: plan.run_id.clone(),
                attempt_id: plan.attempt_id.clone(),
                handle: handle.clone(),
                started_at: plan.executor_started_at,
                sequence: plan.callback_sequence,
                capability: plan.capability,
                log_artifact_id: plan.log_artifact_id.clone(),
                state: ProcessState::Running,
            });
        }
        Outcome::Spawned(match answer {
            Answer::Ok if self.mutation == Some(super::Mutation::SpawnedButRejected) => {
                SpawnOutcome::Rejected
            }
            Answer::Ok => SpawnOutcome::Started {
                handle,
                started_at: plan.executor_started_at,
            },
            Answer::BadHandle => SpawnOutcome::Started {
                handle: String::new(),
                started_at: plan.executor_started_at,
            },
            Answer::Rejected => SpawnOutcome::Rejected,
            _ => SpawnOutcome::Unknown,
        })
    }

    /// Whether the supervisor and the process of `handle` exist. In this world they end
    /// together: a process exits and its supervisor publishes the receipt (or, for
    /// [`ReceiptKind::Missing`], dies without one) in the same step. [`Answer::StopUnknown`]:
    /// nothing can be concluded.
    pub(super) fn inspect_supervision(
        &mut self,
        handle: &ExecutorHandle,
        answer: Answer,
    ) -> Outcome {
        let process = self.supervisor.by_handle(handle.as_str());
        let process = process.map(|p| (p.state, p.offer_id.clone(), p.attempt_id.clone()));
        let liveness = match process {
            _ if answer == Answer::StopUnknown => Liveness::Unknown,
            None => Liveness::Unknown,
            Some((ProcessState::Running, ..)) => Liveness::Alive,
            Some((ProcessState::Exited(_), offer, attempt)) => {
                // Gone with no receipt that could complete the Run: the Worker may record it
                // lost (issue 16).
                let receipt = self.disk.receipts.get(&attempt);
                if !receipt.is_some_and(|r| r.genuine && !r.malformed) {
                    self.cause(&offer, RecoveryReason::LeaseLostLocalExecutionStopped);
                }
                Liveness::Gone
            }
        };
        Outcome::SupervisionInspected {
            supervisor: liveness,
            process: liveness,
        }
    }

    pub(super) fn stop(
        &mut self,
        now: UnixMillis,
        handle: &ExecutorHandle,
        answer: Answer,
    ) -> Outcome {
        let index = self
            .supervisor
            .processes
            .iter()
            .position(|p| p.handle == handle.as_str());
        let Some(index) = index else {
            return Outcome::Stopped(StopOutcome::Unknown);
        };
        if answer == Answer::StopUnknown {
            return Outcome::Stopped(StopOutcome::Unknown);
        }
        match self.supervisor.processes[index].state {
            ProcessState::Exited(_) => Outcome::Stopped(StopOutcome::AlreadyExited),
            ProcessState::Running => {
                // SIGTERM: the supervisor survives and writes the receipt with 128 + 15.
                self.exit(now, index, 143, ReceiptKind::Genuine);
                Outcome::Stopped(StopOutcome::Stopped)
            }
        }
    }

    /// Process `index` exits with `code`: its output lands in the spool with a truncation
    /// fact, and the supervisor publishes a receipt of `kind` (never over an existing one).
    pub(super) fn exit(&mut self, now: UnixMillis, index: usize, code: u8, kind: ReceiptKind) {
        let Some(p) = self.supervisor.processes.get_mut(index) else {
            return;
        };
        if p.state != ProcessState::Running {
            return;
        }
        p.state = ProcessState::Exited(code);
        let p = p.clone();
        let log = self
            .disk
            .logs
            .entry(p.log_artifact_id.clone())
            .or_insert(Log {
                content: Vec::new(),
                truncated: None,
            });
        log.content
            .extend_from_slice(format!("output of {}\n", p.attempt_id).as_bytes());
        log.truncated = Some(false);
        let token = match kind {
            ReceiptKind::Genuine | ReceiptKind::Malformed => receipt_token(&p.capability),
            ReceiptKind::Forged => receipt_token(Sha256Digest::of(&p.capability).as_bytes()),
            ReceiptKind::Missing => return,
        };
        if self.disk.receipts.contains_key(&p.attempt_id) {
            return;
        }
        let receipt = Receipt {
            schema_version: RECEIPT_SCHEMA_VERSION,
            run_id: p.run_id.clone(),
            attempt_id: p.attempt_id.clone(),
            callback_sequence: p.sequence,
            token,
            started_at_ms: p.started_at,
            finished_at_ms: now.max(p.started_at),
            exit_code: code,
        };
        self.disk.receipts.insert(
            p.attempt_id.clone(),
            StoredReceipt {
                receipt,
                genuine: kind == ReceiptKind::Genuine,
                malformed: kind == ReceiptKind::Malformed,
            },
        );
    }
}
