//! Every request body the Worker writes is pinned byte for byte against
//! `tests/fixtures/wire/request-pins.json`: 440 requests, 40 of each of the 11 kinds, built from
//! a seeded generator whose free-text fields (`projectId`, `taskId`, `executorHandle`, secret
//! reference names, capability label values and GPU models) mix quotes, backslashes, `/`,
//! non-ASCII, astral characters, U+2028/U+2029, BOM and C1 controls. The fixture was captured
//! from the hand-written `JsonWriter` request writers (commit 8b03040) before they were replaced
//! by serde_json, so this test proves the replacement changed no byte. `wire_examples.rs` pins
//! the reference's own examples (Node-written); this pins the escaping-heavy inputs those
//! examples lack.

use std::collections::BTreeMap;

use ql_worker_core::ids::{
    AttemptId, CallbackSequence, CapabilityDigest, ExecutorHandle, LeaseGeneration, LeaseToken,
    LeaseVersion, LogArtifactId, OfferId, ProjectId, RunId, Sha256Digest, TaskId, TaskRevision,
    WorkerGeneration,
};
use ql_worker_core::revision::{Architecture, Label, SecretRef};
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::Fence;
use ql_worker_core::wire::activation::{ActivationOp, ActivationRequest, RunningAck};
use ql_worker_core::wire::artifact::ArtifactUpload;
use ql_worker_core::wire::completion::{CompletionArtifact, CompletionRequest, CompletionResult};
use ql_worker_core::wire::lease_control::LeaseControlRequest;
use ql_worker_core::wire::offer::OfferRequest;
use ql_worker_core::wire::secrets::SecretsRequest;
use ql_worker_core::wire::session::{
    Capabilities, CapacityCapability, GpuCapability, HeartbeatRequest, RegisterRequest,
    RuntimeCapability, SessionStatus, TransitionRequest,
};

const PINS: &str = include_str!("../../tests/fixtures/wire/request-pins.json");
const CASES_PER_KIND: usize = 40;

/// splitmix64: a fixed, dependency-free sequence.
use ql_worker_tests::splitmix::SplitMix64 as Rng;

/// Characters that JSON escaping treats differently, none a control character the id rules
/// refuse (C0 and DEL).
const TRICKY: &[char] = &[
    '"',
    '\\',
    '/',
    '\'',
    '<',
    '>',
    '&',
    ' ',
    'é',
    'ß',
    'Ω',
    '中',
    '文',
    '😀',
    '🚀',
    '\u{2028}',
    '\u{2029}',
    '\u{a0}',
    '\u{feff}',
    '\u{80}',
    '\u{85}',
    '\u{9f}',
    '\u{fffd}',
    '\u{ffff}',
    '\u{10ffff}',
    '\u{e000}',
    '\u{d7ff}',
    'ﬁ',
    '\u{301}',
];

fn text(rng: &mut Rng, max_units: usize) -> String {
    loop {
        let len = rng.range(1, max_units.min(40) as u64) as usize;
        let mut out = String::new();
        for _ in 0..len {
            if rng.percent(50) {
                out.push(*rng.pick(TRICKY));
            } else {
                out.push(*rng.pick(&['a', 'Z', '0', '9', '-', '_', '.', ':', 'x']));
            }
        }
        if out.encode_utf16().count() <= max_units {
            return out;
        }
    }
}

fn token_id(rng: &mut Rng, max: usize) -> String {
    const FIRST: &[u8] = b"AZaz09";
    const REST: &[u8] = b"AZaz09._:-";
    let len = if rng.percent(10) {
        max
    } else {
        rng.range(1, 12) as usize
    };
    let mut out = String::new();
    out.push(char::from(*rng.pick(FIRST)));
    while out.len() < len {
        out.push(char::from(*rng.pick(REST)));
    }
    out
}

fn hex(rng: &mut Rng, n: usize) -> String {
    (0..n)
        .map(|_| char::from(*rng.pick(b"0123456789abcdef")))
        .collect()
}

fn lease_token(rng: &mut Rng) -> LeaseToken {
    const SET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-";
    let len = *rng.pick(&[32u64, 43, 64, 128]);
    LeaseToken::new(
        (0..len)
            .map(|_| char::from(*rng.pick(SET)))
            .collect::<String>(),
    )
    .unwrap()
}

fn counter(rng: &mut Rng, lo: u64) -> u64 {
    let mid = rng.range(lo, 1000);
    *rng.pick(&[lo, lo + 1, mid, 2_147_483_647])
}

fn fence(rng: &mut Rng) -> Fence {
    Fence {
        worker_generation: WorkerGeneration::new(counter(rng, 1)).unwrap(),
        project_id: ProjectId::new(text(rng, 128)).unwrap(),
        run_id: RunId::new(token_id(rng, 36)).unwrap(),
        attempt_id: AttemptId::new(token_id(rng, 36)).unwrap(),
        offer_id: OfferId::new(token_id(rng, 128)).unwrap(),
        lease_generation: LeaseGeneration::new(counter(rng, 1)).unwrap(),
        lease_token: lease_token(rng),
        expected_lease_version: LeaseVersion::new(counter(rng, 0)).unwrap(),
    }
}

fn digest(rng: &mut Rng) -> Sha256Digest {
    Sha256Digest::from_hex(&hex(rng, 64)).unwrap()
}

fn log_id(rng: &mut Rng) -> LogArtifactId {
    LogArtifactId::new(format!("wlog-{}", hex(rng, 30))).unwrap()
}

fn truncated(rng: &mut Rng) -> Option<bool> {
    *rng.pick(&[None, Some(true), Some(false)])
}

fn secret_ref(rng: &mut Rng, project: &str, versioned: bool) -> SecretRef {
    loop {
        let version = (versioned || rng.percent(50)).then(|| counter(rng, 1));
        if let Ok(text) = SecretRef::create(project, &text(rng, 40), version) {
            return SecretRef::new(&text).unwrap();
        }
    }
}

fn activation(rng: &mut Rng, kind: u64) -> ActivationRequest {
    let fence = fence(rng);
    let op = match kind {
        0 => ActivationOp::Starting,
        1 => ActivationOp::StartFailure,
        _ => ActivationOp::Running(RunningAck {
            executor_handle: ExecutorHandle::new(text(rng, 200)).unwrap(),
            log_artifact_id: rng.percent(50).then(|| log_id(rng)),
            callback_sequence: CallbackSequence::new(counter(rng, 1)).unwrap(),
            callback_token_digest: CapabilityDigest::new(digest(rng)),
        }),
    };
    ActivationRequest { fence, op }
}

fn secrets(rng: &mut Rng) -> SecretsRequest {
    let fence = fence(rng);
    let project = fence.project_id.as_str().to_owned();
    let mut secret_refs = Vec::new();
    for _ in 0..rng.range(0, 6) {
        let r = secret_ref(rng, &project, false);
        if !secret_refs.contains(&r) {
            secret_refs.push(r);
        }
    }
    let mut environment_bundle_refs = Vec::new();
    if secret_refs.is_empty() || rng.percent(40) {
        let r = secret_ref(rng, &project, true);
        if !secret_refs.contains(&r) {
            environment_bundle_refs.push(r);
        }
    }
    let n = rng.range(1, 2_147_483_647);
    SecretsRequest {
        fence,
        task_id: TaskId::new(text(rng, 128)).unwrap(),
        task_revision: TaskRevision::new(format!("qltd:v1:{n}:{}", hex(rng, 64))).unwrap(),
        execution_digest: digest(rng),
        secret_refs,
        environment_bundle_refs,
    }
}

fn capability_name(rng: &mut Rng) -> String {
    const FIRST: &[u8] = b"abz09";
    const REST: &[u8] = b"abz09._+-";
    let mut out = String::new();
    out.push(char::from(*rng.pick(FIRST)));
    for _ in 0..rng.range(0, 8) {
        out.push(char::from(*rng.pick(REST)));
    }
    out
}

fn unique(rng: &mut Rng, n: u64, make: fn(&mut Rng) -> String) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for _ in 0..n {
        let item = make(rng);
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

fn label_key(rng: &mut Rng) -> String {
    match rng.below(4) {
        0 => rng.range(0, 20).to_string(),
        1 => rng.range(0, 4_294_967_300).to_string(),
        2 => format!("0{}", rng.range(0, 99)),
        _ => {
            let mut out = String::new();
            out.push(char::from(*rng.pick(b"aAzZ09")));
            for _ in 0..rng.range(0, 10) {
                out.push(char::from(*rng.pick(b"aAzZ09._/-")));
            }
            out
        }
    }
}

fn capabilities(rng: &mut Rng) -> Capabilities {
    let architecture = *rng.pick(&[
        Architecture::Amd64,
        Architecture::Arm64,
        Architecture::ArmV6,
        Architecture::ArmV7,
        Architecture::I386,
        Architecture::Ppc64le,
        Architecture::S390x,
    ]);
    let mut caps = Capabilities::for_architecture(architecture);
    if rng.percent(50) {
        let n = rng.range(0, 4);
        let mut executors = unique(rng, n, capability_name);
        executors.retain(|e| e != "remote-worker");
        executors.push("remote-worker".into());
        caps.executors = executors;
    }
    if rng.percent(50) {
        caps.operating_system = Some(capability_name(rng));
    }
    if rng.percent(50) {
        let n = rng.range(0, 5);
        caps.runtimes = Some(
            unique(rng, n, capability_name)
                .into_iter()
                .map(|name| RuntimeCapability {
                    name,
                    version: format!("{}.{}.{}", rng.below(30), rng.below(30), rng.below(30)),
                })
                .collect(),
        );
    }
    if rng.percent(70) {
        let mut labels: Vec<Label> = Vec::new();
        for _ in 0..rng.range(0, 12) {
            let key = label_key(rng);
            if labels.iter().all(|l| l.key != key) {
                labels.push(Label {
                    key,
                    value: text(rng, 256),
                });
            }
        }
        caps.labels = Some(labels);
    }
    if rng.percent(50) {
        let gpu = rng.percent(50).then(|| {
            (0..rng.range(0, 3))
                .map(|_| GpuCapability {
                    vendor: capability_name(rng),
                    model: rng.percent(50).then(|| text(rng, 128)),
                    memory_bytes: rng.percent(50).then(|| rng.range(1, 1 << 40)),
                })
                .collect()
        });
        caps.capacity = Some(CapacityCapability {
            cpu_cores: rng.percent(50).then(|| rng.range(1, 4096)),
            memory_bytes: rng.percent(50).then(|| rng.range(1, 9_007_199_254_740_991)),
            disk_bytes: rng.percent(50).then(|| rng.range(1, 1 << 45)),
            gpu,
        });
    }
    if rng.percent(50) {
        let n = rng.range(0, 5);
        caps.features = Some(unique(rng, n, capability_name));
    }
    caps
}

fn body(name: &str, result: Result<impl AsRef<[u8]>, impl std::fmt::Display>) -> String {
    let bytes = result.unwrap_or_else(|e| panic!("{name}: {e}"));
    String::from_utf8(bytes.as_ref().to_vec()).unwrap()
}

/// Every generated request, by case name, written by the code under test.
fn written() -> BTreeMap<String, String> {
    let mut rng = Rng(0x51ee_d15d);
    let mut out = BTreeMap::new();
    for i in 0..CASES_PER_KIND {
        let mut put = |kind: &str, text: String| {
            out.insert(format!("{kind}-{i:03}"), text);
        };
        let f = fence(&mut rng);
        let offer = OfferRequest {
            worker_generation: f.worker_generation,
            offer_id: f.offer_id.clone(),
            lease_token: f.lease_token.clone(),
        };
        put("offers", body("offers", offer.to_body()));
        for (kind, name) in [(0, "starting"), (1, "start-failure"), (2, "running")] {
            let request = activation(&mut rng, kind);
            put(name, body(name, request.to_body()));
        }
        put("secrets", body("secrets", secrets(&mut rng).to_body()));
        let upload = ArtifactUpload {
            fence: fence(&mut rng),
            log_artifact_id: log_id(&mut rng),
            byte_length: *rng.pick(&[0, 17, 64 * 1024 * 1024]),
            truncated: truncated(&mut rng),
        };
        put("artifacts", body("artifacts", upload.header_json()));
        let started = rng.range(0, 1 << 45);
        let exit_code = *rng.pick(&[0u8, 1, 255]);
        let completion = CompletionRequest {
            fence: fence(&mut rng),
            callback_sequence: CallbackSequence::new(counter(&mut rng, 1)).unwrap(),
            callback_token_digest: CapabilityDigest::new(digest(&mut rng)),
            result: CompletionResult::from_exit(
                UnixMillis::new(started).unwrap(),
                UnixMillis::new(started + rng.below(1000)).unwrap(),
                exit_code,
            ),
            artifact: CompletionArtifact {
                log_artifact_id: log_id(&mut rng),
                byte_length: rng.range(0, 64 * 1024 * 1024),
                sha256: digest(&mut rng),
                truncated: truncated(&mut rng),
            },
        };
        put("completion", body("completion", completion.to_body()));
        let control = LeaseControlRequest {
            fence: fence(&mut rng),
        };
        put("lease-control", body("lease-control", control.to_body()));
        let caps = capabilities(&mut rng);
        let max = rng.range(1, 1024);
        let register = RegisterRequest::new(&caps, max, rng.range(0, max), 30_000)
            .unwrap_or_else(|e| panic!("register {i}: {e}"));
        put("register", body("register", register.to_body()));
        let heartbeat = HeartbeatRequest {
            generation: WorkerGeneration::new(counter(&mut rng, 1)).unwrap(),
            expected_version: *rng.pick(&[0, 3, 9_007_199_254_740_991]),
            available_slots: rng.range(0, 1024),
            lease_duration_ms: rng.range(5_000, 600_000),
        };
        put("heartbeat", body("heartbeat", heartbeat.to_body()));
        let transition = TransitionRequest {
            generation: WorkerGeneration::new(counter(&mut rng, 1)).unwrap(),
            expected_version: rng.range(0, 9_007_199_254_740_991),
            status: *rng.pick(&[SessionStatus::Draining, SessionStatus::Offline]),
        };
        put("transition", body("transition", transition.to_body()));
    }
    out
}

#[test]
fn request_bodies_are_byte_identical_to_the_pinned_bodies() {
    let pinned: BTreeMap<String, String> = serde_json::from_str::<serde_json::Value>(PINS).unwrap()
        ["bodies"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect();
    let written = written();
    assert_eq!(written.len(), 11 * CASES_PER_KIND);
    assert_eq!(
        written.keys().collect::<Vec<_>>(),
        pinned.keys().collect::<Vec<_>>()
    );
    let mut differences = 0;
    for (name, body) in &written {
        if body != &pinned[name] {
            differences += 1;
            eprintln!("{name}:\n  pinned  {}\n  written {body}", pinned[name]);
        }
    }
    let escaped = written
        .values()
        .filter(|b| b.contains("\\\"") || b.contains('\u{2028}'))
        .count();
    println!(
        "request pins: {} bodies, {escaped} with escapes or U+2028, {differences} differences",
        written.len()
    );
    assert_eq!(differences, 0);
    assert!(
        escaped > written.len() / 4,
        "the generator must reach escaping"
    );
}

#[test]
fn the_lease_token_lands_in_its_own_key_whatever_the_free_text_holds() {
    let mut rng = Rng(7);
    let mut fence = fence(&mut rng);
    fence.lease_token = LeaseToken::new("t".repeat(32)).unwrap();
    let decoy = format!(
        "x\",\"leaseToken\":\"{}",
        "0".repeat(fence.lease_token.expose().len())
    );
    fence.project_id = ProjectId::new(decoy.clone()).unwrap();
    let token = fence.lease_token.expose().to_owned();
    for body in [
        LeaseControlRequest {
            fence: fence.clone(),
        }
        .to_body()
        .unwrap(),
        ArtifactUpload {
            fence: fence.clone(),
            log_artifact_id: log_id(&mut rng),
            byte_length: 1,
            truncated: None,
        }
        .header_json()
        .unwrap(),
    ] {
        let parsed: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(parsed["leaseToken"], token.as_str());
        assert_eq!(parsed["projectId"], decoy.as_str());
        assert_eq!(String::from_utf8_lossy(&body).matches(&token).count(), 1);
    }
    // The fence alone never serializes its token: only the request writer puts it in.
    let alone = serde_json::to_string(&fence).unwrap();
    assert!(!alone.contains(&token), "{alone}");
}
