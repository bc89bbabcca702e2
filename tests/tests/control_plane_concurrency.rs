//! The reference control plane does not serialize requests behind a streaming artifact upload:
//! an upload holds the model only while it is admitted (route, authentication, header, fence)
//! and while it is stored, not while its content streams. A lease renewal of the same Run that
//! commits during the stream does not invalidate the upload; the completion that follows names
//! the renewed lease version.

mod control_plane_common;

use std::io::Read;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use control_plane_common::{Env, GEN1, client_for, pattern};
use ql_worker_core::ids::{LeaseVersion, RunId, Sha256Digest, WorkerId};
use ql_worker_core::offer::Offer;
use ql_worker_core::wire::activation::{ActivationRequest, ActivationStatus};
use ql_worker_core::wire::artifact::{ArtifactReceipt, UploadStatus};
use ql_worker_core::wire::completion::{CompletionResponse, CompletionStatus};
use ql_worker_core::wire::lease_control::{LeaseControlRequest, LeaseControlResponse};
use ql_worker_core::wire::route::Operation;
use ql_worker_tests::control_plane::harness::{
    ModelHarness, WorkerIdentity, artifact_body, completion, running_ack, session_id, upload,
};
use ql_worker_tests::control_plane::{
    CpHead, CpRequest, ReferenceControlPlane, ReferenceOptions, RevisionBuilder, RunSpec,
};

/// How long the upload's content stays paused at most; below the server's socket read timeout
/// ([`READ_TIMEOUT`]), so the upload survives the pause even if nothing releases it. A plane
/// that holds its model during the stream answers the renewal only after this.
const PAUSE_CAP: Duration = Duration::from_secs(10);

/// The server's socket read timeout in this test.
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How fast a JSON request must be answered while the upload is paused.
const BOUND: Duration = Duration::from_secs(5);

/// As `control_plane_common::env`, with a socket read timeout above [`PAUSE_CAP`].
fn env_tolerating_pauses() -> Env {
    let mut options = ReferenceOptions {
        worker_id: WorkerId::new("edge-1").unwrap(),
        ..ReferenceOptions::default()
    };
    options.server.read_timeout = READ_TIMEOUT;
    let cp = ReferenceControlPlane::start(options).expect("start the reference control plane");
    let client = client_for(&cp, 5_000);
    let auth = cp.credential().header_value().as_str().to_owned();
    let worker = WorkerIdentity {
        worker_id: cp.worker_id().clone(),
        session_id: session_id(1),
        credential: cp.credential().clone(),
    };
    Env {
        cp,
        client,
        worker,
        auth,
    }
}

fn run_id(n: u32) -> RunId {
    RunId::new(format!("run-{n}")).unwrap()
}

fn with_version(offer: &Offer, version: u64) -> Offer {
    let mut next = offer.clone();
    next.lease.version = LeaseVersion::new(version).unwrap();
    next
}

/// Content that stops at `at` once: it signals `paused`, then waits for `resume` (at most
/// [`PAUSE_CAP`]) before yielding the rest.
struct PausingReader<'a> {
    data: &'a [u8],
    pos: usize,
    at: usize,
    paused: Option<mpsc::Sender<()>>,
    resume: mpsc::Receiver<()>,
}

impl Read for PausingReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.pos == self.at
            && let Some(paused) = self.paused.take()
        {
            let _ = paused.send(());
            let _ = self.resume.recv_timeout(PAUSE_CAP);
        }
        let end = if self.pos < self.at {
            self.at
        } else {
            self.data.len()
        };
        let n = buf.len().min(end - self.pos);
        buf[..n].copy_from_slice(&self.data[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

#[test]
fn a_lease_renewal_is_answered_while_an_upload_of_the_same_run_streams() {
    let e = env_tolerating_pauses();
    e.register();
    e.enqueue(1);
    let offer = e.claim(1);
    e.activate(&ActivationRequest::starting(&offer));
    e.activate(&ActivationRequest::running(
        &offer,
        running_ack(&offer, 1, true),
    ));
    let content = pattern(1024 * 1024, 11);
    let up = upload(&offer, &content, Some(false));
    let header = up.header_json().unwrap();
    let path = e.worker.path(Operation::Artifacts);
    // Each request on its own connection: the upload's client and the renewal's client.
    let uploader = client_for(&e.cp, 30_000);
    let renewer = client_for(&e.cp, 30_000);
    let (paused_tx, paused_rx) = mpsc::channel();
    let (resume_tx, resume_rx) = mpsc::channel();
    let upload_answer = std::thread::scope(|s| {
        let handle = s.spawn(|| {
            let mut reader = PausingReader {
                data: &content,
                pos: 0,
                at: content.len() / 2,
                paused: Some(paused_tx),
                resume: resume_rx,
            };
            uploader.post_artifact(
                &path,
                &e.auth,
                &header,
                &mut reader,
                content.len() as u64,
                4 * 1024,
            )
        });
        paused_rx
            .recv_timeout(Duration::from_secs(20))
            .expect("the upload reaches its pause");
        let started = Instant::now();
        // The server has admitted the upload (its audit record is written while admitting).
        let mut admitted = false;
        while !admitted && started.elapsed() < BOUND {
            admitted = e.cp.with_model(|m| {
                m.audit()
                    .iter()
                    .any(|a| a.operation == Operation::Artifacts)
            });
            if !admitted {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let lc = LeaseControlRequest::from_offer(&offer);
        let renewed = renewer.post_json(
            &e.worker.path(Operation::LeaseControl),
            &e.auth,
            &lc.to_body().unwrap(),
            control_plane_common::caps(Operation::LeaseControl),
        );
        let elapsed = started.elapsed();
        let in_flight = e.cp.with_model(|m| m.artifacts_of(&run_id(1)).is_empty());
        let _ = resume_tx.send(());
        let answer = handle.join().expect("upload thread");
        assert!(admitted, "the upload was admitted within {BOUND:?}");
        assert!(
            elapsed < BOUND,
            "lease control took {elapsed:?} while an upload streamed"
        );
        assert!(in_flight, "the upload was still streaming");
        let body = renewed.expect("lease control");
        let LeaseControlResponse::Renewed(lease) = LeaseControlResponse::parse(&body, &lc).unwrap()
        else {
            panic!("renewed");
        };
        assert_eq!(lease.lease_version.get(), 1);
        answer
    });
    let (body, report) = upload_answer.expect("upload");
    let receipt =
        ArtifactReceipt::parse(&body, &up, &Sha256Digest::from_bytes(report.sha256)).unwrap();
    assert_eq!(receipt.status, UploadStatus::Stored);
    let stored = e.cp.with_model(|m| m.artifacts_of(&run_id(1))[0].1.clone());
    assert_eq!(stored.byte_length, content.len() as u64);
    assert_eq!(stored.head, content[..64 * 1024].to_vec());
    // One log entry for the upload, with every body byte read.
    let entries = e.cp.with_model(|m| {
        m.request_log()
            .filter(|r| r.operation == Some(Operation::Artifacts))
            .cloned()
            .collect::<Vec<_>>()
    });
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].status, 200);
    assert_eq!(entries[0].reason, "stored");
    assert_eq!(
        entries[0].body_bytes_read,
        (up.preamble().unwrap().len() + content.len()) as u64
    );
    // The completion names the renewed lease version.
    let offer = with_version(&offer, 1);
    let now = ReferenceControlPlane::now();
    let req = completion(&offer, &up, &content, 1, 0, now, now);
    let body = e
        .post(Operation::Completion, &req.to_body().unwrap())
        .unwrap();
    assert_eq!(
        CompletionResponse::parse(&body, &req).unwrap().status,
        CompletionStatus::Applied
    );
}

/// The model's two-phase upload: a renewal between `begin_stream` and `finish_artifact` leaves
/// the upload accepted, and the request log holds one entry with every byte read.
#[test]
fn a_renewal_between_begin_and_finish_leaves_the_upload_stored() {
    let mut h = ModelHarness::new();
    h.register(1);
    let revision = RevisionBuilder::argv("/bin/true", Vec::<String>::new())
        .timeout_ms(60_000)
        .build()
        .unwrap();
    h.cp.enqueue_run(h.at(), RunSpec::numbered(1, revision))
        .unwrap();
    let offer = h.claim(GEN1, 1).expect("an offer");
    let r = h.activate_ok(&ActivationRequest::starting(&offer));
    assert_eq!(r.status, ActivationStatus::Applied);
    let r = h.activate_ok(&ActivationRequest::running(
        &offer,
        running_ack(&offer, 1, true),
    ));
    assert_eq!(r.status, ActivationStatus::Applied);

    let content = pattern(100_000, 3);
    let up = upload(&offer, &content, Some(false));
    let request = CpRequest::artifact(
        h.worker.path(Operation::Artifacts),
        &h.worker.authorization(),
        artifact_body(&up, &content),
    );
    let head: CpHead = request.head();
    let mut body: &[u8] = &request.body;
    let now = h.at();
    let ticket =
        h.cp.begin_stream(now, &head, &mut body)
            .expect("upload admitted");
    assert_eq!(body.len(), content.len(), "only the preamble was read");

    h.advance(1_000);
    let renewed = h.lease_control(&offer);
    assert_eq!(renewed.status, 200, "{renewed:?}");
    assert_eq!(
        h.cp.run(&run_id(1)).unwrap().lease_version().unwrap().get(),
        1
    );

    let streamed = ticket.stream_content(&mut body);
    h.advance(1_000);
    let now = h.at();
    let response = h.cp.finish_artifact(now, ticket, streamed);
    assert_eq!(response.status, 200, "{response:?}");
    let receipt = ArtifactReceipt::parse(
        &response.body,
        &up,
        &ql_worker_tests::control_plane::harness::digest(&content),
    )
    .unwrap();
    assert_eq!(receipt.status, UploadStatus::Stored);
    let last = h.cp.last_request().unwrap().clone();
    assert_eq!(last.operation, Some(Operation::Artifacts));
    assert_eq!(last.reason, "stored");
    assert_eq!(last.body_bytes_read, request.body.len() as u64);
    assert_eq!(h.cp.artifacts_of(&run_id(1)).len(), 1);

    // Through `handle`, at the renewed version: an exact replay is `already_stored`, a
    // differing one 409.
    let offer = with_version(&offer, 1);
    let replay = upload(&offer, &content, Some(false));
    let again = h.post_artifact(artifact_body(&replay, &content));
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(h.cp.last_request().unwrap().reason, "already_stored");
    let other = pattern(100_000, 4);
    let differing = upload(&offer, &other, Some(false));
    let refused = h.post_artifact(artifact_body(&differing, &other));
    assert_eq!(refused.status, 409, "{refused:?}");
    assert_eq!(
        h.cp.last_request().unwrap().reason,
        "artifact replay differs"
    );

    // The completion names the renewed lease version.
    let now = h.at();
    let req = completion(&offer, &up, &content, 1, 0, now, now);
    let answer = h.complete(&req);
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(
        CompletionResponse::parse(&answer.body, &req)
            .unwrap()
            .status,
        CompletionStatus::Applied
    );
}
