//! A whole Worker driven through one Run by a small scripted driver: register, reconcile, pull,
//! start path, supervision, upload-before-completion, receipt cleanup. The driver answers every
//! command the way a cooperative control plane and a healthy host would; the assertions check
//! the command order the core chose.

use std::collections::BTreeMap;

use base64::Engine as _;
use ql_worker_core::capability::{ENTROPY_BYTES, Entropy};
use ql_worker_core::claim::PendingClaim;
use ql_worker_core::ids::{
    AttemptId, CallbackSequence, LeaseGeneration, LeaseVersion, OfferId, Sha256Digest,
};
use ql_worker_core::io::{Action, Input, Outcome, ReceiptRead, SpawnOutcome};
use ql_worker_core::offer::DeliveryKind;
use ql_worker_core::receipt::{Receipt, ReceiptToken};
use ql_worker_core::record::{InboxRecord, State};
use ql_worker_core::revision::Architecture;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::activation::{
    ActivationResponse, ActivationSnapshot, ActivationStatus, AttemptStatus, RunStatus,
    SnapshotShape,
};
use ql_worker_core::wire::completion::{CompletionResponse, CompletionStatus};
use ql_worker_core::wire::lease_control::{LeaseControlResponse, RenewedLease};
use ql_worker_core::wire::offer::{OfferResponse, OfferStats, OfferedLease, OfferedOffer};
use ql_worker_core::wire::session::{Capabilities, SessionResponse, SessionStatus};
use ql_worker_core::worker::{Output, Worker, WorkerConfig};
use ql_worker_sim::testkit;
use ql_worker_tests::server_wire::{ToJson as _, ToJsonFor as _};

fn ms(v: u64) -> UnixMillis {
    UnixMillis::new(v).unwrap()
}

#[derive(Default)]
struct Host {
    records: BTreeMap<OfferId, InboxRecord>,
    claim: Option<PendingClaim>,
    receipts: BTreeMap<AttemptId, Receipt>,
    offered: bool,
    log: Vec<String>,
    entropy_counter: u8,
    spawned: Option<(UnixMillis, String)>,
    session_version: u64,
}

impl Host {
    fn perform(&mut self, now: UnixMillis, action: Action) -> Outcome {
        match action {
            Action::ListInbox { .. } => {
                self.log.push("list".into());
                Outcome::InboxListed {
                    records: self.records.values().cloned().collect(),
                    next_after: None,
                }
            }
            Action::ReadRecord { offer_id } => {
                Outcome::RecordRead(self.records.get(&offer_id).cloned().map(Box::new))
            }
            Action::PersistRecord { expected, record } => {
                let stored = self.records.get(&record.offer.offer_id);
                match (expected, stored) {
                    (None, None) => {}
                    (Some(rev), Some(s)) => {
                        ql_worker_core::record::check_transition(s, &record, rev).unwrap();
                    }
                    other => panic!("bad persist {other:?}"),
                }
                self.log.push(format!("persist:{}", record.state));
                self.records.insert(record.offer.offer_id.clone(), *record);
                Outcome::Persisted
            }
            Action::ReadClaim => Outcome::ClaimRead(self.claim.clone().map(Box::new)),
            Action::PersistClaim { claim, .. } => {
                self.log.push(format!("claim:{}", claim.revision));
                self.claim = Some(*claim);
                Outcome::Persisted
            }
            Action::ClearClaim { .. } => {
                self.log.push("clear-claim".into());
                self.claim = None;
                Outcome::Persisted
            }
            Action::ReadReceipt { attempt_id } => Outcome::ReceiptRead(
                self.receipts
                    .get(&attempt_id)
                    .cloned()
                    .map_or(ReceiptRead::Absent, ReceiptRead::Present),
            ),
            Action::RemoveReceipt { attempt_id } => {
                self.log.push("remove-receipt".into());
                Outcome::ReceiptRemoved {
                    existed: self.receipts.remove(&attempt_id).is_some(),
                }
            }
            Action::AllocateLog { .. } => Outcome::LogAllocated,
            Action::InspectLog { .. } => Outcome::LogInspected {
                byte_length: 5,
                truncated: Some(false),
            },
            Action::DrawEntropy => {
                self.entropy_counter += 1;
                Outcome::EntropyDrawn(Entropy::new([self.entropy_counter; ENTROPY_BYTES]))
            }
            Action::Spawn(plan) => {
                self.log.push("spawn".into());
                let token = base64::engine::general_purpose::URL_SAFE_NO_PAD
                    .encode(plan.capability.expose());
                self.receipts.insert(
                    plan.attempt_id.clone(),
                    Receipt {
                        schema_version: 1,
                        run_id: plan.run_id.clone(),
                        attempt_id: plan.attempt_id.clone(),
                        callback_sequence: plan.callback_sequence,
                        token: ReceiptToken::new(token).unwrap(),
                        started_at_ms: plan.executor_started_at,
                        finished_at_ms: plan.executor_started_at,
                        exit_code: 0,
                    },
                );
                let handle = "ql3lp1.test-handle".to_string();
                self.spawned = Some((plan.executor_started_at, handle.clone()));
                Outcome::Spawned(SpawnOutcome::Started {
                    handle,
                    started_at: plan.executor_started_at,
                })
            }
            Action::Stop { .. } => panic!("no stop expected"),
            // The process runs until its receipt appears.
            Action::InspectSupervision { .. } => Outcome::SupervisionInspected {
                supervisor: ql_worker_core::io::Liveness::Alive,
                process: ql_worker_core::io::Liveness::Alive,
            },
            Action::ReadPublishedHandle { .. } => panic!("every record has its handle"),
            Action::PersistSession { .. } => panic!("the Session is online: no new one expected"),
            Action::UploadLog { header, .. } => {
                self.log.push("upload".into());
                let sent = Sha256Digest::of(b"hello");
                let upload = ql_worker_tests::server_wire::parse_artifact_preamble(
                    &[
                        &(u32::try_from(header.len()).unwrap().to_be_bytes())[..],
                        &header[..],
                    ]
                    .concat(),
                    None,
                )
                .unwrap()
                .0;
                let receipt = ql_worker_core::wire::artifact::ArtifactReceipt {
                    status: ql_worker_core::wire::artifact::UploadStatus::Stored,
                    sha256: sent,
                };
                Outcome::Uploaded {
                    body: receipt.to_json(&upload),
                    sent_bytes: 5,
                    sent_sha256: sent,
                }
            }
            Action::Post(call) => self.post(now, &call.path, &call.body),
        }
    }

    fn post(&mut self, now: UnixMillis, path: &str, body: &[u8]) -> Outcome {
        let op = path.rsplit('/').next().unwrap().to_string();
        self.log.push(format!("post:{op}"));
        let json: serde_json::Value = serde_json::from_slice(body).unwrap();
        let worker = testkit::worker();
        let session = |schema: &str, version: u64| {
            SessionResponse {
                worker_id: worker.worker_id.clone(),
                session_id: worker.session_id.clone(),
                generation: worker.generation,
                version,
                status: SessionStatus::Online,
                lease_expires_at_ms: now.saturating_add(30_000),
                replaced_session: (schema.contains("register")).then_some(false),
            }
            .to_json(schema)
        };
        let body = match op.as_str() {
            "register" => {
                self.session_version = 1;
                session("qinglong/worker-session-register@v1", 1)
            }
            "heartbeat" => {
                self.session_version += 1;
                session("qinglong/worker-session-heartbeat@v1", self.session_version)
            }
            "offers" => {
                let stats = OfferStats::default();
                if self.offered {
                    OfferResponse::Idle {
                        reason: ql_worker_core::wire::offer::IdleReason::NoCandidates,
                        stats,
                        truncated: false,
                    }
                    .to_json()
                } else {
                    self.offered = true;
                    let offer = testkit::offer(1);
                    OfferResponse::Offered {
                        offer: Box::new(OfferedOffer {
                            offer_id: OfferId::new(json["offerId"].as_str().unwrap()).unwrap(),
                            delivery_kind: DeliveryKind::NewClaim,
                            execution_digest: offer.execution_digest,
                            candidate: offer.candidate.clone(),
                            worker: worker.clone(),
                            lease: OfferedLease {
                                version: LeaseVersion::FIRST,
                                lease_generation: LeaseGeneration::new(1).unwrap(),
                                acquired_at_ms: now,
                                renewed_at_ms: now,
                                expires_at_ms: now.saturating_add(30_000),
                                updated_at_ms: now,
                            },
                            execution_revision: offer.execution_revision.clone(),
                            placement_score: 0,
                        }),
                        stats,
                        truncated: false,
                    }
                    .to_json()
                }
            }
            "starting" | "running" => {
                let running = op == "running";
                let (handle, started) = match (&self.spawned, running) {
                    (Some((at, h)), true) => (Some(h.clone()), Some(*at)),
                    _ => (None, None),
                };
                ActivationResponse {
                    status: ActivationStatus::Applied,
                    snapshot: ActivationSnapshot {
                        run_id: ql_worker_core::ids::RunId::new(json["runId"].as_str().unwrap())
                            .unwrap(),
                        attempt_id: AttemptId::new(json["attemptId"].as_str().unwrap()).unwrap(),
                        run_status: if running {
                            RunStatus::Running
                        } else {
                            RunStatus::Dispatching
                        },
                        attempt_status: if running {
                            AttemptStatus::Running
                        } else {
                            AttemptStatus::Starting
                        },
                        lease_version: LeaseVersion::FIRST,
                        lease_generation: 1,
                        callback_sequence: if running { 1 } else { 0 },
                        deadline_at_ms: Some(now.saturating_add(5000)),
                        started_at_ms: started,
                        finished_at_ms: None,
                        executor_handle: handle
                            .map(|h| ql_worker_core::ids::ExecutorHandle::new(h).unwrap()),
                        log_artifact_id: json["logArtifactId"].as_str().map(str::to_string),
                        error_code: None,
                    },
                    shape: if running {
                        SnapshotShape::Running
                    } else {
                        SnapshotShape::Starting
                    },
                }
                .to_json()
            }
            "completion" => CompletionResponse {
                status: CompletionStatus::Applied,
                run_id: ql_worker_core::ids::RunId::new(json["runId"].as_str().unwrap()).unwrap(),
                attempt_id: AttemptId::new(json["attemptId"].as_str().unwrap()).unwrap(),
                callback_sequence: CallbackSequence::new(
                    json["callbackSequence"].as_u64().unwrap(),
                )
                .unwrap(),
            }
            .to_json(),
            "lease-control" => {
                let request = ql_worker_core::wire::lease_control::LeaseControlRequest {
                    fence: ql_worker_core::wire::Fence::from_offer(
                        &self.records.values().next().unwrap().offer,
                    ),
                };
                let v = json["expectedLeaseVersion"].as_u64().unwrap();
                LeaseControlResponse::Renewed(RenewedLease {
                    lease_version: LeaseVersion::new(v + 1).unwrap(),
                    renewed_at_ms: now,
                    expires_at_ms: now.saturating_add(30_000),
                })
                .to_json(&request)
            }
            other => panic!("unexpected post {other}"),
        };
        Outcome::Responded(body)
    }
}

fn config() -> WorkerConfig {
    let worker = testkit::worker();
    WorkerConfig::node(
        worker.worker_id,
        worker.session_id,
        Capabilities::for_architecture(Architecture::Amd64),
    )
}

/// Runs the worker until it is idle, answering every command.
/// Both clock readings at `now` (this driver's monotonic clock reads the same numbers).
fn at(now: UnixMillis) -> ql_worker_core::time::Now {
    ql_worker_core::time::Now::new(now, ql_worker_core::time::MonoMillis::new(now.get()))
}

fn drain(worker: &mut Worker, host: &mut Host, now: UnixMillis) -> Option<UnixMillis> {
    for _ in 0..1000 {
        match worker.poll_output() {
            Output::Command(command) => {
                let outcome = host.perform(now, command.action);
                worker
                    .handle(
                        at(now),
                        Input::Outcome {
                            id: command.id,
                            outcome,
                        },
                    )
                    .unwrap();
            }
            Output::Idle { wake_at } => return wake_at.map(|w| ms(w.get())),
            other => panic!("unexpected output {other:?}"),
        }
    }
    panic!("no idle after 1000 commands");
}

#[test]
fn one_run_from_pull_to_completion_in_the_required_order() {
    let mut host = Host::default();
    let mut now = ms(1_000);
    let mut worker = Worker::new(config(), at(now));
    for _ in 0..6 {
        worker.handle(at(now), Input::Tick).unwrap();
        let wake = drain(&mut worker, &mut host, now).unwrap();
        now = wake.max(now.saturating_add(1));
    }
    let log = host.log.join(" ");
    let states: Vec<&str> = host
        .log
        .iter()
        .filter_map(|l| l.strip_prefix("persist:"))
        .collect();
    assert_eq!(
        states,
        [
            "accepted",
            "starting_acknowledged",
            "launching",
            "started",
            "running_acknowledged",
            "completion_acknowledged"
        ],
        "{log}"
    );
    let index = |needle: &str| {
        host.log
            .iter()
            .position(|l| l == needle)
            .unwrap_or_else(|| panic!("{needle} in {log}"))
    };
    assert!(
        index("claim:0") < index("post:offers"),
        "claim durable before the request: {log}"
    );
    assert!(index("persist:accepted") < index("clear-claim"), "{log}");
    assert!(
        index("persist:launching") < index("spawn"),
        "barrier before spawn: {log}"
    );
    assert!(
        index("upload") < index("post:completion"),
        "upload before completion: {log}"
    );
    assert!(
        index("persist:completion_acknowledged") < index("remove-receipt"),
        "{log}"
    );
    assert!(host.receipts.is_empty());
    assert!(host.claim.is_none());
    let record = host.records.values().next().unwrap();
    assert_eq!(record.state, State::CompletionAcknowledged);
    assert!(worker.fail_closed().is_none());
    println!("{log}");
}

/// The two profiles are the reference's production defaults (reference §7: cadence edge 2 000 /
/// node 500 ms, startup page 4 / 16, supervision page 4 / 32, journal entries 64 / 256, drain
/// 60 / 300 s) and this Worker's own (2 / 16 concurrent Runs, Session lease 30 s, heartbeat
/// 10 s, backoff base 1 s, lease control every 5 s); the node profile differs from the edge
/// profile in exactly the reference's five fields and the concurrency.
#[test]
fn the_profiles_are_the_production_defaults() {
    let worker = testkit::worker();
    let caps = Capabilities::for_architecture(Architecture::Amd64);
    let edge = WorkerConfig::edge(
        worker.worker_id.clone(),
        worker.session_id.clone(),
        caps.clone(),
    );
    let node = WorkerConfig::node(worker.worker_id, worker.session_id, caps);
    let fields = |c: &WorkerConfig| {
        (
            c.cadence_ms,
            c.startup_page.get(),
            c.supervision_page.get(),
            c.capacity.get(),
            c.max_concurrent_runs,
            c.drain_budget_ms,
            (
                c.session_lease_ms,
                c.heartbeat_interval_ms,
                c.backoff_base_ms,
                c.lease_control_interval_ms,
            ),
        )
    };
    let shared = (30_000, 10_000, 1_000, 5_000);
    assert_eq!(fields(&edge), (2_000, 4, 4, 64, 2, 60_000, shared));
    assert_eq!(fields(&node), (500, 16, 32, 256, 16, 300_000, shared));
    assert_eq!(node.capabilities, edge.capabilities);
}

/// A Session is usable strictly before its local lease deadline, not at it: at the deadline
/// the control plane may already have expired it (the deadline counts from the sending of the
/// exchange that granted it).
#[test]
fn a_session_is_unusable_from_its_lease_deadline_on() {
    use ql_worker_core::time::MonoMillis;
    use ql_worker_core::worker::SessionView;
    let view = SessionView {
        worker: testkit::worker(),
        version: 1,
        status: SessionStatus::Online,
        lease_expires_at: ms(40_000),
        lease_deadline: MonoMillis::new(30_000),
    };
    assert!(view.usable(MonoMillis::new(29_999)));
    assert!(!view.usable(MonoMillis::new(30_000)));
    let offline = SessionView {
        status: SessionStatus::Offline,
        ..view
    };
    assert!(!offline.usable(MonoMillis::new(0)));
}
