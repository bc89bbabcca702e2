//! Shared setup of the HTTPS control-plane tests: the reference control plane on loopback mTLS
//! and the Worker's real HTTPS client configured from its `WorkerSettings`.

#![allow(dead_code)]

use std::io::Read;
use std::time::Duration;

use ql_worker::https::{
    HttpsClient, JsonCaps, Origin, RequestTimeout, StreamReport, TlsMaterial, TlsMaterialPaths,
    TransportError,
};
use ql_worker_core::ids::{Sha256Digest, WorkerGeneration, WorkerId};
use ql_worker_core::offer::{Offer, OfferWorker};
use ql_worker_core::wire::activation::{ActivationRequest, ActivationResponse};
use ql_worker_core::wire::artifact::{ArtifactReceipt, ArtifactUpload};
use ql_worker_core::wire::offer::OfferRequest;
use ql_worker_core::wire::route::Operation;
use ql_worker_tests::control_plane::harness::{
    WorkerIdentity, lease_token, offer_id, parse_and_admit, register_body, session_id,
};
use ql_worker_tests::control_plane::{
    ReferenceControlPlane, ReferenceOptions, RevisionBuilder, RunSpec,
};

pub(crate) const GEN1: WorkerGeneration = WorkerGeneration::FIRST;

/// The control plane, the Worker's client and identity.
pub(crate) struct Env {
    pub(crate) cp: ReferenceControlPlane,
    pub(crate) client: HttpsClient,
    pub(crate) worker: WorkerIdentity,
    pub(crate) auth: String,
}

/// Starts the reference control plane for Worker `edge-1` and a client with a 5 s timeout.
pub(crate) fn env() -> Env {
    env_with_timeout(5_000)
}

pub(crate) fn env_with_timeout(timeout_ms: u64) -> Env {
    let options = ReferenceOptions {
        worker_id: WorkerId::new("edge-1").unwrap(),
        ..ReferenceOptions::default()
    };
    let cp = ReferenceControlPlane::start(options).expect("start the reference control plane");
    let client = client_for(&cp, timeout_ms);
    let token = std::fs::read_to_string(&cp.worker_settings().credential_file).unwrap();
    let auth = format!("Worker {}", token.trim_end());
    assert_eq!(auth, cp.credential().header_value().as_str());
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

pub(crate) fn client_for(cp: &ReferenceControlPlane, timeout_ms: u64) -> HttpsClient {
    let s = cp.worker_settings();
    let material = TlsMaterial::load(&TlsMaterialPaths {
        cert_chain: s.client_cert.clone(),
        private_key: s.client_key.clone(),
        trust_anchors: vec![s.ca_cert.clone()],
    })
    .expect("client TLS material");
    HttpsClient::new(
        Origin::parse(&s.origin).expect("origin"),
        material,
        RequestTimeout::from_millis(timeout_ms).expect("timeout"),
    )
    .expect("client")
}

/// The Worker's caps for `operation`.
pub(crate) fn caps(operation: Operation) -> JsonCaps {
    JsonCaps::default()
        .request_cap(operation.request_cap().unwrap())
        .unwrap()
        .response_cap(operation.response_cap().unwrap())
        .unwrap()
}

impl Env {
    pub(crate) fn post(
        &self,
        operation: Operation,
        body: &[u8],
    ) -> Result<Vec<u8>, TransportError> {
        self.client.post_json(
            &self.worker.path(operation),
            &self.auth,
            body,
            caps(operation),
        )
    }

    pub(crate) fn register(&self) {
        self.post(Operation::Register, &register_body(2))
            .expect("register");
    }

    /// Enqueues Run `n` running `/bin/true` with a timeout.
    pub(crate) fn enqueue(&self, n: u32) {
        let revision = RevisionBuilder::argv("/bin/true", Vec::<String>::new())
            .timeout_ms(60_000)
            .build()
            .unwrap();
        self.cp.enqueue_run(RunSpec::numbered(n, revision)).unwrap();
    }

    pub(crate) fn pull_body(n: u32) -> Vec<u8> {
        OfferRequest {
            worker_generation: GEN1,
            offer_id: offer_id(n),
            lease_token: lease_token(n),
        }
        .to_body()
        .unwrap()
        .to_vec()
    }

    /// Pulls with claim `n` and admits the offer like the Worker.
    pub(crate) fn claim(&self, n: u32) -> Offer {
        let body = self
            .post(Operation::Offers, &Self::pull_body(n))
            .expect("offers");
        let worker = OfferWorker {
            worker_id: self.worker.worker_id.clone(),
            session_id: self.worker.session_id.clone(),
            generation: GEN1,
        };
        parse_and_admit(&body, &offer_id(n), &worker, &lease_token(n))
            .expect("admission")
            .expect("an offer")
    }

    pub(crate) fn activate(&self, request: &ActivationRequest) -> ActivationResponse {
        let body = self
            .post(request.operation(), &request.to_body().unwrap())
            .expect("activation");
        ActivationResponse::parse(&body, request).expect("activation response")
    }

    /// Streams `content` as the artifact of `upload`.
    pub(crate) fn upload(
        &self,
        upload: &ArtifactUpload,
        content: &mut dyn Read,
        len: u64,
    ) -> Result<(Vec<u8>, StreamReport), TransportError> {
        self.client.post_artifact(
            &self.worker.path(Operation::Artifacts),
            &self.auth,
            &upload.header_json().unwrap(),
            content,
            len,
            4 * 1024,
        )
    }

    pub(crate) fn upload_ok(&self, upload: &ArtifactUpload, content: &[u8]) -> ArtifactReceipt {
        let (body, report) = self
            .upload(upload, &mut &content[..], content.len() as u64)
            .expect("upload");
        ArtifactReceipt::parse(&body, upload, &Sha256Digest::from_bytes(report.sha256))
            .expect("receipt")
    }
}

/// Deterministic pseudo-random bytes (xorshift).
pub(crate) fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// A reader that yields at most `step` bytes per call.
pub(crate) struct Trickle<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.step.min(buf.len()).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// Upper bound for anything the tests wait for.
pub(crate) const GENEROUS: Duration = Duration::from_secs(20);
