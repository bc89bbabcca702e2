//! Server semantics of the reference control plane model (reference §2.2–2.10), driven with the
//! core's own request builders and response parsers, and a manual clock.

use ql_worker_core::ids::{LeaseVersion, RunId, WorkerGeneration};
use ql_worker_core::offer::{DeliveryKind, Offer};
use ql_worker_core::revision::{Placement, PlacementRequired};
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::activation::{
    ActivationRequest, ActivationStatus, AttemptStatus, RunStatus, SnapshotShape,
};
use ql_worker_core::wire::artifact::{ArtifactReceipt, UploadStatus};
use ql_worker_core::wire::completion::{CompletionResponse, CompletionStatus};
use ql_worker_core::wire::error::ErrorCode;
use ql_worker_core::wire::lease_control::{
    LeaseControlRequest, LeaseControlResponse, StopReason, TerminalStatus,
};
use ql_worker_core::wire::offer::{IdleReason, OfferResponse};
use ql_worker_core::wire::route::Operation;
use ql_worker_core::wire::secrets::{SecretsRequest, SecretsResponse};
use ql_worker_core::wire::session::{SessionResponse, SessionStatus};
use ql_worker_tests::control_plane::harness::{
    self, ModelHarness, artifact_body, capability, completion, heartbeat_body, lease_token,
    offer_id, running_ack, session_id, transition_body, upload,
};
use ql_worker_tests::control_plane::{
    CancelOutcome, CpResponse, LeaseState, RevisionBuilder, RunEventKind, RunSpec,
};

const GEN1: WorkerGeneration = WorkerGeneration::FIRST;

fn ms(v: u64) -> UnixMillis {
    UnixMillis::new(v).unwrap()
}

fn run_id(n: u32) -> RunId {
    RunId::new(format!("run-{n}")).unwrap()
}

fn code(r: &CpResponse) -> Option<ErrorCode> {
    r.code()
}

/// A harness with a registered Worker (`max_runs` slots) and Runs 1..=`runs` enqueued
/// (`/bin/true`, 5 s timeout).
fn setup(max_runs: u64, runs: u32) -> ModelHarness {
    let mut h = ModelHarness::new();
    h.register(max_runs);
    for n in 1..=runs {
        let revision = RevisionBuilder::argv("/bin/true", Vec::<String>::new())
            .timeout_ms(5_000)
            .build()
            .unwrap();
        h.cp.enqueue_run(h.at(), RunSpec::numbered(n, revision))
            .unwrap();
    }
    h
}

/// Claims with claim `n` and acknowledges starting.
fn started(h: &mut ModelHarness, n: u32) -> Offer {
    let offer = h.claim(GEN1, n).expect("an offer");
    let r = h.activate_ok(&ActivationRequest::starting(&offer));
    assert_eq!(r.status, ActivationStatus::Applied);
    offer
}

/// Claims, starts and acknowledges running.
fn running(h: &mut ModelHarness, n: u32) -> Offer {
    let offer = started(h, n);
    let r = h.activate_ok(&ActivationRequest::running(
        &offer,
        running_ack(&offer, n, true),
    ));
    assert_eq!(r.status, ActivationStatus::Applied);
    offer
}

fn upload_log(h: &mut ModelHarness, offer: &Offer, content: &[u8]) -> CpResponse {
    let up = upload(offer, content, Some(false));
    h.post_artifact(artifact_body(&up, content))
}

#[test]
fn one_run_walks_claim_starting_secrets_running_renewal_upload_completion() {
    let mut h = ModelHarness::new();
    h.register(2);
    let project = ql_worker_core::ids::ProjectId::new("project-1").unwrap();
    let secret = h.cp.set_secret(&project, "token", "s3cr3t").unwrap();
    let revision = RevisionBuilder::shell("echo hello")
        .public_env("GREETING", "hi")
        .secret_env("TOKEN", &secret)
        .timeout_ms(60_000)
        .build()
        .unwrap();
    h.cp.enqueue_run(h.at(), RunSpec::numbered(1, revision))
        .unwrap();

    let offer = h.claim(GEN1, 1).expect("offered");
    assert_eq!(offer.delivery_kind, DeliveryKind::NewClaim);
    assert_eq!(offer.lease.version, LeaseVersion::FIRST);
    assert_eq!(offer.lease.expires_at_ms, ms(h.now + 30_000));

    let starting = h.activate_ok(&ActivationRequest::starting(&offer));
    assert_eq!(starting.shape, SnapshotShape::Starting);
    assert_eq!(starting.snapshot.deadline_at_ms, Some(ms(h.now + 60_000)));
    assert_eq!(starting.snapshot.callback_sequence, 0);

    let secrets = SecretsRequest::from_offer(&offer).unwrap().unwrap();
    let r = h.post(Operation::Secrets, &secrets.to_body().unwrap());
    assert_eq!(r.status, 200);
    let values = SecretsResponse::parse(&r.body, &secrets).unwrap();
    assert_eq!(values.values[0].value.expose(), "s3cr3t");

    h.advance(100);
    let ack = running_ack(&offer, 1, true);
    let running = h.activate_ok(&ActivationRequest::running(&offer, ack));
    assert_eq!(running.shape, SnapshotShape::Running);
    assert_eq!(running.snapshot.started_at_ms, Some(h.at()));

    h.advance(1_000);
    let r = h.lease_control(&offer);
    let renewed = LeaseControlResponse::parse(&r.body, &LeaseControlRequest::from_offer(&offer));
    let LeaseControlResponse::Renewed(lease) = renewed.unwrap() else {
        panic!("renewed expected");
    };
    assert_eq!(lease.lease_version.get(), 1);
    assert_eq!(lease.expires_at_ms, ms(h.now + 30_000));
    let mut offer = offer;
    offer.lease.version = lease.lease_version;

    let content = b"hello\n";
    let up = upload(&offer, content, Some(false));
    let r = h.post_artifact(artifact_body(&up, content));
    let receipt = ArtifactReceipt::parse(&r.body, &up, &harness::digest(content)).unwrap();
    assert_eq!(receipt.status, UploadStatus::Stored);

    let req = completion(&offer, &up, content, 1, 0, ms(h.now - 1_000), h.at());
    let r = h.complete(&req);
    let done = CompletionResponse::parse(&r.body, &req).unwrap();
    assert_eq!(done.status, CompletionStatus::Applied);

    let run = h.cp.run(&run_id(1)).unwrap();
    assert_eq!(run.run_status, RunStatus::Succeeded);
    assert_eq!(run.attempt_status, Some(AttemptStatus::Succeeded));
    let lease = run.lease.as_ref().unwrap();
    assert_eq!(
        (lease.state, lease.version.get()),
        (LeaseState::Completed, 2)
    );
    let kinds: Vec<&RunEventKind> = run.events.iter().map(|e| &e.kind).collect();
    assert!(matches!(kinds[0], RunEventKind::Queued));
    assert!(matches!(kinds[1], RunEventKind::Claimed { .. }));
    assert!(matches!(
        kinds.last(),
        Some(RunEventKind::RunFinished { .. })
    ));
    let artifacts = h.cp.artifacts_of(&run_id(1));
    assert_eq!(artifacts.len(), 1);
    assert_eq!(artifacts[0].1.sha256, harness::digest(content));
    assert_eq!(artifacts[0].1.head, content.to_vec());

    // Lease control after completion sees the terminal projection.
    let r = h.lease_control(&offer);
    let parsed = LeaseControlResponse::parse(&r.body, &LeaseControlRequest::from_offer(&offer));
    assert_eq!(
        parsed.unwrap(),
        LeaseControlResponse::Terminal(TerminalStatus::Succeeded)
    );
}

#[test]
fn register_keeps_the_generation_for_the_same_session_and_replaces_for_a_new_one() {
    let mut h = setup(1, 1);
    let first = h.cp.session(&h.worker.worker_id).unwrap().clone();
    assert_eq!((first.generation, first.version), (GEN1, 0));
    let again = h.register(1);
    assert_eq!(
        (again.generation, again.version, again.replaced_session),
        (GEN1, 1, Some(false))
    );
    let offer = h.claim(GEN1, 1).unwrap();

    // A new Session replaces the old one: generation 2, the old lease is fenced.
    let old = h.worker.clone();
    h.worker = h.worker.with_session(session_id(2));
    let replaced = h.register(1);
    assert_eq!(replaced.generation.get(), 2);
    assert_eq!(replaced.version, 0);
    assert_eq!(replaced.replaced_session, Some(true));
    h.worker = old;
    let r = h.activate(&ActivationRequest::starting(&offer));
    assert_eq!(code(&r), Some(ErrorCode::WorkerActivationFenced));
    let r = h.pull(GEN1, 1);
    assert_eq!(code(&r), Some(ErrorCode::WorkerOfferFenced));
}

#[test]
fn heartbeat_and_transition_are_version_fenced_and_draining_stops_offers() {
    let mut h = setup(1, 1);
    let wid = h.worker.worker_id.clone();
    let sid = h.worker.session_id.clone();
    let r = h.post(Operation::Heartbeat, &heartbeat_body(GEN1, 7, 1));
    assert_eq!(code(&r), Some(ErrorCode::WorkerSessionFenced));
    h.advance(10_000);
    let r = h.post(Operation::Heartbeat, &heartbeat_body(GEN1, 0, 1));
    let hb = SessionResponse::parse_heartbeat(
        &r.body,
        &wid,
        &sid,
        &ql_worker_core::wire::session::HeartbeatRequest {
            generation: GEN1,
            expected_version: 0,
            available_slots: 1,
            lease_duration_ms: 30_000,
        },
    )
    .unwrap();
    assert_eq!(hb.version, 1);
    assert_eq!(hb.lease_expires_at_ms, ms(h.now + 30_000));

    let r = h.post(
        Operation::Transition,
        &transition_body(GEN1, 1, SessionStatus::Draining),
    );
    assert_eq!(r.status, 200);
    let r = h.pull(GEN1, 1);
    let parsed = OfferResponse::parse(&r.body).unwrap();
    assert!(matches!(
        parsed,
        OfferResponse::Idle {
            reason: IdleReason::WorkerUnavailable,
            ..
        }
    ));
    let r = h.post(
        Operation::Transition,
        &transition_body(GEN1, 2, SessionStatus::Offline),
    );
    assert_eq!(r.status, 200);
    let r = h.post(Operation::Heartbeat, &heartbeat_body(GEN1, 3, 0));
    assert_eq!(code(&r), Some(ErrorCode::WorkerSessionFenced));

    // An expired Session lease refuses the heartbeat; registering again recovers.
    let mut h = setup(1, 0);
    h.advance(30_000);
    let r = h.post(Operation::Heartbeat, &heartbeat_body(GEN1, 0, 1));
    assert_eq!(code(&r), Some(ErrorCode::WorkerSessionFenced));
    assert_eq!(h.register(1).generation, GEN1);
}

#[test]
fn offers_replay_the_same_claim_as_lease_recovery_and_fence_a_different_token() {
    let mut h = setup(2, 1);
    let r = h.pull(GEN1, 9);
    assert_eq!(r.status, 200);
    let first = h.cp.state().clone();
    h.advance(500);
    let replay = h.claim(GEN1, 9).unwrap();
    assert_eq!(replay.delivery_kind, DeliveryKind::LeaseRecovery);
    assert_eq!(h.cp.state(), &first, "a replay changes nothing");

    // Same offer id, another token: fenced.
    let body = ql_worker_core::wire::offer::OfferRequest {
        worker_generation: GEN1,
        offer_id: offer_id(9),
        lease_token: lease_token(10),
    }
    .to_body()
    .unwrap();
    let r = h.post(Operation::Offers, &body);
    assert_eq!(code(&r), Some(ErrorCode::WorkerOfferFenced));

    // After the lease expired the replay is fenced too.
    h.advance(30_000);
    let r = h.pull(GEN1, 9);
    assert_eq!(code(&r), Some(ErrorCode::WorkerOfferFenced));
}

#[test]
fn offers_report_idle_reasons_capacity_priority_and_placement() {
    let mut h = setup(1, 0);
    let r = h.pull(GEN1, 1);
    let OfferResponse::Idle { reason, stats, .. } = OfferResponse::parse(&r.body).unwrap() else {
        panic!("idle");
    };
    assert_eq!(reason, IdleReason::NoCandidates);
    assert_eq!(stats.pages, 1);

    // A placement nobody matches.
    let arm = RevisionBuilder::argv("/bin/true", Vec::<String>::new())
        .placement(Placement {
            required: Some(PlacementRequired {
                architectures: Some(vec![ql_worker_core::revision::Architecture::S390x]),
                ..PlacementRequired::default()
            }),
            preferred: None,
        })
        .build()
        .unwrap();
    h.cp.enqueue_run(h.at(), RunSpec::numbered(1, arm)).unwrap();
    let r = h.pull(GEN1, 2);
    let OfferResponse::Idle { reason, stats, .. } = OfferResponse::parse(&r.body).unwrap() else {
        panic!("idle");
    };
    assert_eq!(reason, IdleReason::NoMatch);
    assert_eq!((stats.candidates, stats.placement_mismatches), (1, 1));

    // Priority first, then FIFO; the second claim exceeds the one slot.
    let plain = || {
        RevisionBuilder::argv("/bin/true", Vec::<String>::new())
            .build()
            .unwrap()
    };
    h.cp.enqueue_run(h.at(), RunSpec::numbered(2, plain()))
        .unwrap();
    let mut urgent = RunSpec::numbered(3, plain());
    urgent.priority = 5;
    h.cp.enqueue_run(h.at(), urgent).unwrap();
    let offer = h.claim(GEN1, 3).unwrap();
    assert_eq!(offer.candidate.run_id, run_id(3));
    let r = h.pull(GEN1, 4);
    let OfferResponse::Idle { reason, .. } = OfferResponse::parse(&r.body).unwrap() else {
        panic!("idle");
    };
    assert_eq!(reason, IdleReason::WorkerUnavailable);
}

#[test]
fn offers_stop_at_the_scan_budget() {
    let config = ql_worker_tests::control_plane::CpConfig {
        offer_page_size: 1,
        offer_max_pages: 2,
        ..Default::default()
    };
    let mut h = ModelHarness::with_config(config);
    h.register(1);
    let never = || {
        RevisionBuilder::argv("/bin/true", Vec::<String>::new())
            .placement(Placement {
                required: Some(PlacementRequired {
                    features: Some(vec!["gpu-magic".to_owned()]),
                    ..PlacementRequired::default()
                }),
                preferred: None,
            })
            .build()
            .unwrap()
    };
    for n in 1..=3 {
        h.cp.enqueue_run(h.at(), RunSpec::numbered(n, never()))
            .unwrap();
    }
    let r = h.pull(GEN1, 1);
    let OfferResponse::Idle {
        reason,
        stats,
        truncated,
    } = OfferResponse::parse(&r.body).unwrap()
    else {
        panic!("idle");
    };
    assert_eq!(reason, IdleReason::ScanBudgetExhausted);
    assert!(truncated);
    assert_eq!((stats.pages, stats.candidates), (2, 2));
}

#[test]
fn activation_walks_the_state_machine_with_exact_replays_and_fences() {
    let mut h = setup(1, 1);
    let offer = h.claim(GEN1, 1).unwrap();
    let starting = ActivationRequest::starting(&offer);
    // Running before starting is fenced.
    let r = h.activate(&ActivationRequest::running(
        &offer,
        running_ack(&offer, 1, true),
    ));
    assert_eq!(code(&r), Some(ErrorCode::WorkerActivationFenced));
    assert_eq!(h.activate_ok(&starting).status, ActivationStatus::Applied);
    assert_eq!(
        h.activate_ok(&starting).status,
        ActivationStatus::AlreadyStarting
    );

    let ack = running_ack(&offer, 1, true);
    let running = ActivationRequest::running(&offer, ack.clone());
    assert_eq!(h.activate_ok(&running).status, ActivationStatus::Applied);
    assert_eq!(
        h.activate_ok(&running).status,
        ActivationStatus::AlreadyRunning
    );
    let other = ActivationRequest::running(&offer, running_ack(&offer, 2, true));
    assert_eq!(
        code(&h.activate(&other)),
        Some(ErrorCode::WorkerActivationFenced)
    );
    let r = h.activate_ok(&starting);
    assert_eq!(
        (r.status, r.shape),
        (ActivationStatus::AlreadyRunning, SnapshotShape::Running)
    );
    let r = h.activate_ok(&ActivationRequest::start_failure(&offer));
    assert_eq!(r.status, ActivationStatus::AlreadyRunning);

    // Stale version and wrong token are fenced.
    let mut stale = offer.clone();
    stale.lease.version = LeaseVersion::new(3).unwrap();
    let r = h.activate(&ActivationRequest::starting(&stale));
    assert_eq!(code(&r), Some(ErrorCode::WorkerActivationFenced));
    let mut forged = offer.clone();
    forged.lease_token = lease_token(77);
    let r = h.activate(&ActivationRequest::starting(&forged));
    assert_eq!(code(&r), Some(ErrorCode::WorkerActivationFenced));
}

#[test]
fn start_failure_is_terminal_with_lease_version_plus_one_and_replays_as_already_terminal() {
    let mut h = setup(1, 2);
    let offer = started(&mut h, 1);
    let failure = ActivationRequest::start_failure(&offer);
    let r = h.activate_ok(&failure);
    assert_eq!(
        (r.status, r.shape),
        (ActivationStatus::Applied, SnapshotShape::Terminal)
    );
    assert_eq!(r.snapshot.lease_version.get(), 1);
    assert_eq!(
        r.snapshot.error_code.as_deref(),
        Some("EXECUTOR_START_FAILED")
    );
    assert_eq!(r.snapshot.run_status, RunStatus::Failed);
    let r = h.activate_ok(&failure);
    assert_eq!(r.status, ActivationStatus::AlreadyTerminal);
    let r = h.activate_ok(&ActivationRequest::starting(&offer));
    assert_eq!(r.status, ActivationStatus::AlreadyTerminal);

    // A cancel intent wins the terminal status.
    let offer = started(&mut h, 2);
    assert_eq!(
        h.cp.cancel_run(h.at(), &run_id(2)).unwrap(),
        CancelOutcome::StopRequested
    );
    let r = h.activate_ok(&ActivationRequest::start_failure(&offer));
    assert_eq!(r.snapshot.attempt_status, AttemptStatus::Cancelled);
}

#[test]
fn artifacts_are_put_if_absent_with_the_fence_checked_before_content() {
    let mut h = setup(1, 1);
    let offer = running(&mut h, 1);
    let content = b"log line\n";
    let r = upload_log(&mut h, &offer, content);
    assert_eq!(r.status, 200);
    let r = upload_log(&mut h, &offer, content);
    let up = upload(&offer, content, Some(false));
    let receipt = ArtifactReceipt::parse(&r.body, &up, &harness::digest(content)).unwrap();
    assert_eq!(receipt.status, UploadStatus::AlreadyStored);
    // Same key, other bytes: refused.
    let r = upload_log(&mut h, &offer, b"log linX\n");
    assert_eq!(code(&r), Some(ErrorCode::WorkerCompletionFenced));

    // A forged token is refused after the header, before any content byte is read.
    let mut forged = offer.clone();
    forged.lease_token = lease_token(55);
    let big = vec![7_u8; 100_000];
    let up = upload(&forged, &big, None);
    let preamble_len = up.preamble().unwrap().len() as u64;
    let before = h.cp.state().clone();
    let r = h.post_artifact(artifact_body(&up, &big));
    assert_eq!(code(&r), Some(ErrorCode::WorkerCompletionFenced));
    assert_eq!(h.cp.last_request().unwrap().body_bytes_read, preamble_len);
    assert_eq!(h.cp.state(), &before);

    // Framing that disagrees with content-length is a 400.
    let mut body = artifact_body(&upload(&offer, b"abc", None), b"abc");
    body.push(b'!');
    let r = h.post_artifact(body);
    assert_eq!(code(&r), Some(ErrorCode::InvalidWorkerRequest));
}

#[test]
fn completion_requires_the_stored_artifact_and_replays_exactly() {
    let mut h = setup(1, 1);
    let offer = running(&mut h, 1);
    let content = b"out";
    let up = upload(&offer, content, Some(false));
    let req = completion(&offer, &up, content, 1, 3, ms(h.now - 10), h.at());
    assert_eq!(
        code(&h.complete(&req)),
        Some(ErrorCode::WorkerCompletionFenced)
    );
    assert_eq!(upload_log(&mut h, &offer, content).status, 200);

    let mut wrong_digest = req.clone();
    wrong_digest.artifact.sha256 = harness::digest(b"other");
    assert_eq!(
        code(&h.complete(&wrong_digest)),
        Some(ErrorCode::WorkerCompletionFenced)
    );
    let mut wrong_truncation = req.clone();
    wrong_truncation.artifact.truncated = Some(true);
    assert_eq!(
        code(&h.complete(&wrong_truncation)),
        Some(ErrorCode::WorkerIngressUnavailable)
    );
    let mut future = req.clone();
    future.result.finished_at_ms = ms(h.now + 5 * 60_000 + 1);
    assert_eq!(
        code(&h.complete(&future)),
        Some(ErrorCode::WorkerCompletionFenced)
    );

    let r = h.complete(&req);
    assert_eq!(
        CompletionResponse::parse(&r.body, &req).unwrap().status,
        CompletionStatus::Applied
    );
    let run = h.cp.run(&run_id(1)).unwrap();
    assert_eq!(run.attempt_status, Some(AttemptStatus::Failed));
    assert_eq!(run.error_code.as_deref(), Some("EXIT_CODE_3"));

    let r = h.complete(&req);
    assert_eq!(
        CompletionResponse::parse(&r.body, &req).unwrap().status,
        CompletionStatus::AlreadyCompleted
    );
    let mut drift = req.clone();
    drift.result = ql_worker_core::wire::completion::CompletionResult::from_exit(
        req.result.started_at_ms,
        req.result.finished_at_ms,
        4,
    );
    assert_eq!(
        code(&h.complete(&drift)),
        Some(ErrorCode::WorkerCompletionFenced)
    );

    // The Worker replays its whole upload-then-complete sequence after a lost answer.
    let r = upload_log(&mut h, &offer, content);
    let receipt = ArtifactReceipt::parse(&r.body, &up, &harness::digest(content)).unwrap();
    assert_eq!(receipt.status, UploadStatus::AlreadyStored);
}

#[test]
fn completion_from_the_launching_crash_window_needs_no_running_ack() {
    let mut h = setup(1, 1);
    let offer = started(&mut h, 1);
    let content = b"";
    let up = upload(&offer, content, None);
    assert_eq!(h.post_artifact(artifact_body(&up, content)).status, 200);
    let req = completion(&offer, &up, content, 1, 0, h.at(), h.at());
    let r = h.complete(&req);
    assert_eq!(
        CompletionResponse::parse(&r.body, &req).unwrap().status,
        CompletionStatus::Applied
    );
    let run = h.cp.run(&run_id(1)).unwrap();
    assert_eq!(run.run_status, RunStatus::Succeeded);
    assert_eq!(
        run.callback_token_digest,
        Some(*capability(1).digest().expose())
    );
}

#[test]
fn lease_control_renews_writes_timeout_intents_and_cancel_wins_the_final_status() {
    let mut h = setup(1, 2);
    let mut offer = running(&mut h, 1);
    // Stale version: fenced.
    let mut stale = offer.clone();
    stale.lease.version = LeaseVersion::new(5).unwrap();
    assert_eq!(
        code(&h.lease_control(&stale)),
        Some(ErrorCode::WorkerLeaseControlFenced)
    );
    // Past the 5 s deadline: a timeout intent is written and a stop requested.
    h.advance(6_000);
    let r = h.lease_control(&offer);
    let parsed =
        LeaseControlResponse::parse(&r.body, &LeaseControlRequest::from_offer(&offer)).unwrap();
    let LeaseControlResponse::StopRequested(lease, stop) = parsed else {
        panic!("stop expected, got {parsed:?}");
    };
    assert_eq!(stop.reason, StopReason::Timeout);
    assert_eq!(stop.requested_at_ms, h.at());
    offer.lease.version = lease.lease_version;
    let run = h.cp.run(&run_id(1)).unwrap();
    assert!(run.events.iter().any(|e| matches!(
        e.kind,
        RunEventKind::CancelRequested {
            reason: StopReason::Timeout
        }
    )));
    // The process exits 0 after the stop, but the intent decides: timed_out.
    let content = b"partial";
    assert_eq!(upload_log(&mut h, &offer, content).status, 200);
    let up = upload(&offer, content, Some(false));
    let req = completion(&offer, &up, content, 1, 0, ms(h.now - 6_000), h.at());
    assert_eq!(h.complete(&req).status, 200);
    assert_eq!(
        h.cp.run(&run_id(1)).unwrap().attempt_status,
        Some(AttemptStatus::TimedOut)
    );

    // A user cancel is delivered at the next renewal.
    let offer = running(&mut h, 2);
    h.cp.cancel_run(h.at(), &run_id(2)).unwrap();
    let r = h.lease_control(&offer);
    let parsed =
        LeaseControlResponse::parse(&r.body, &LeaseControlRequest::from_offer(&offer)).unwrap();
    assert!(matches!(
        parsed,
        LeaseControlResponse::StopRequested(_, s) if s.reason == StopReason::User
    ));
    // An expired lease is fenced.
    h.advance(31_000);
    let mut next = offer.clone();
    next.lease.version = LeaseVersion::new(1).unwrap();
    assert_eq!(
        code(&h.lease_control(&next)),
        Some(ErrorCode::WorkerLeaseControlFenced)
    );
}

#[test]
fn reaping_expired_leases_marks_the_attempt_lost() {
    let mut h = setup(1, 1);
    let offer = running(&mut h, 1);
    assert!(h.cp.reap_expired_leases(h.at()).is_empty());
    h.advance(30_000);
    assert_eq!(h.cp.reap_expired_leases(h.at()), vec![run_id(1)]);
    let run = h.cp.run(&run_id(1)).unwrap();
    assert_eq!(run.run_status, RunStatus::Lost);
    assert_eq!(run.lease.as_ref().unwrap().state, LeaseState::Expired);
    let r = h.lease_control(&offer);
    let parsed =
        LeaseControlResponse::parse(&r.body, &LeaseControlRequest::from_offer(&offer)).unwrap();
    assert_eq!(parsed, LeaseControlResponse::Terminal(TerminalStatus::Lost));
}

#[test]
fn cancelling_a_queued_run_removes_it_from_the_queue() {
    let mut h = setup(1, 1);
    assert_eq!(
        h.cp.cancel_run(h.at(), &run_id(1)).unwrap(),
        CancelOutcome::CancelledInQueue
    );
    let r = h.pull(GEN1, 1);
    assert!(matches!(
        OfferResponse::parse(&r.body).unwrap(),
        OfferResponse::Idle {
            reason: IdleReason::NoCandidates,
            ..
        }
    ));
    assert_eq!(
        h.cp.cancel_run(h.at(), &run_id(1)).unwrap(),
        CancelOutcome::AlreadyTerminal
    );
}

#[test]
fn the_model_is_deterministic_and_time_never_goes_back() {
    let script = |h: &mut ModelHarness| -> Vec<CpResponse> {
        let mut out = Vec::new();
        let offer = h.claim(GEN1, 1).unwrap();
        out.push(h.activate(&ActivationRequest::starting(&offer)));
        h.advance(10);
        out.push(h.activate(&ActivationRequest::running(
            &offer,
            running_ack(&offer, 1, false),
        )));
        out.push(h.lease_control(&offer));
        out
    };
    let mut a = setup(1, 1);
    let mut b = setup(1, 1);
    assert_eq!(script(&mut a), script(&mut b));
    assert_eq!(a.cp.state(), b.cp.state());
    // An older `now` is clamped to the latest seen.
    let latest = a.cp.now();
    a.now -= 500_000;
    a.pull(GEN1, 2);
    assert_eq!(a.cp.now(), latest);
}
