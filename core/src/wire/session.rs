//! Worker Session `register`, `heartbeat` and `transition` (reference §2.10, schemas
//! `qinglong/worker-session-{register,heartbeat,transition}@v1`) and the canonical capabilities
//! JSON and hash the register body carries.

use alloc::string::String;
use alloc::vec::Vec;

use serde::{Deserialize, Serialize};

use super::{Schema, WireError, bind, body, ensure, exact, id, parse_json, require, semver};
use crate::ids::{MAX_SAFE_INTEGER, SessionId, Sha256Digest, WorkerGeneration, WorkerId};
use crate::js;
use crate::revision::{
    Architecture, Label, LabelsJson, SupportTier, bounded_text, capability_name, label_key,
    object_order, sort_locale, unique_by,
};
use crate::time::UnixMillis;

/// Register schema id.
pub const REGISTER_SCHEMA: &str = "qinglong/worker-session-register@v1";
/// Heartbeat schema id.
pub const HEARTBEAT_SCHEMA: &str = "qinglong/worker-session-heartbeat@v1";
/// Transition schema id.
pub const TRANSITION_SCHEMA: &str = "qinglong/worker-session-transition@v1";
/// `MAX_WORKER_SESSION_REGISTER_REQUEST_BYTES` (an explicit opt-in above 4 KiB).
pub(crate) const MAX_REGISTER_REQUEST_BYTES: usize = 20 * 1024;
/// `MAX_WORKER_SESSION_REQUEST_BYTES` (heartbeat, transition).
pub const MAX_REQUEST_BYTES: usize = 4 * 1024;
/// `MAX_WORKER_SESSION_RESPONSE_BYTES`.
pub const MAX_RESPONSE_BYTES: usize = 4 * 1024;
/// `MAX_WORKER_CAPABILITIES_BYTES`: the canonical capabilities JSON.
pub const MAX_CAPABILITIES_BYTES: usize = 16 * 1024;
/// `MAX_WORKER_CONCURRENT_RUNS`.
pub const MAX_CONCURRENT_RUNS: u64 = 1024;
/// Session lease bounds, ms.
pub const MIN_LEASE_DURATION_MS: u64 = 5_000;
/// Session lease bounds, ms.
pub const MAX_LEASE_DURATION_MS: u64 = 600_000;
/// The protocol version this Worker speaks.
pub const PROTOCOL_VERSION: &str = "1.0.0";

/// A runtime the Worker offers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct RuntimeCapability {
    /// `^[a-z0-9][a-z0-9._+-]*$`, ≤ 64.
    pub name: String,
    /// Strict semver.
    pub version: String,
}

/// A GPU the Worker offers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GpuCapability {
    /// Vendor, capability name ≤ 64.
    pub vendor: String,
    /// Model, 1..=128 characters.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Memory, bytes ≥ 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}

/// Capacity facts; serialize as the canonical `capacity` object (absent facts omitted).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CapacityCapability {
    /// 1..=4096.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_cores: Option<u64>,
    /// Bytes ≥ 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    /// Bytes ≥ 1.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    /// ≤ 8 GPUs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu: Option<Vec<GpuCapability>>,
}

/// The Worker's capabilities (reference `normalizeRemoteWorkerCapabilities`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Architecture.
    pub architecture: Architecture,
    /// 1..=16 executor names (e.g. `remote-worker`).
    pub executors: Vec<String>,
    /// Strict semver (this Worker: [`PROTOCOL_VERSION`]).
    pub protocol_version: String,
    /// Must be the architecture's tier.
    pub support_tier: SupportTier,
    /// Capability name ≤ 32.
    pub operating_system: Option<String>,
    /// ≤ 32 runtimes, unique names.
    pub runtimes: Option<Vec<RuntimeCapability>>,
    /// ≤ 32 labels.
    pub labels: Option<Vec<Label>>,
    /// Capacity.
    pub capacity: Option<CapacityCapability>,
    /// ≤ 32 feature names.
    pub features: Option<Vec<String>>,
}

fn sorted_names(list: &[String], path: &'static str, max: usize) -> Result<Vec<String>, WireError> {
    require(list.len() <= max, path, "within its item budget")?;
    require(
        list.iter().all(|n| capability_name(n, 64)),
        path,
        "capability names",
    )?;
    require(unique_by(list, |n| n), path, "free of duplicates")?;
    let mut out = list.to_vec();
    out.sort_by(|a, b| js::code_unit_cmp(a, b));
    Ok(out)
}

fn positive(value: Option<u64>, max: u64, path: &'static str) -> Result<(), WireError> {
    let ok = value.is_none_or(|v| (1..=max).contains(&v));
    require(ok, path, "a positive safe integer")
}

impl Capabilities {
    /// The capabilities of this Worker: `executors = ["remote-worker"]`, protocol
    /// [`PROTOCOL_VERSION`], the architecture's support tier.
    #[must_use]
    pub fn for_architecture(architecture: Architecture) -> Self {
        Self {
            architecture,
            executors: alloc::vec![String::from(crate::revision::REMOTE_WORKER_EXECUTOR)],
            protocol_version: String::from(PROTOCOL_VERSION),
            support_tier: architecture.support_tier(),
            operating_system: None,
            runtimes: None,
            labels: None,
            capacity: None,
            features: None,
        }
    }

    /// Validates, normalizes and serializes (`JSON.stringify` of the normalized object).
    ///
    /// # Errors
    /// [`WireError::Request`] naming the broken rule.
    pub fn canonical_json(&self) -> Result<String, WireError> {
        require(!self.executors.is_empty(), "executors", "non-empty")?;
        let executors = sorted_names(&self.executors, "executors", 16)?;
        require(
            semver::is_version(&self.protocol_version),
            "protocolVersion",
            "strict semver",
        )?;
        require(
            self.architecture.support_tier() == self.support_tier,
            "supportTier",
            "the architecture's support tier",
        )?;
        if let Some(os) = &self.operating_system {
            require(
                capability_name(os, 32),
                "operatingSystem",
                "a capability name <= 32",
            )?;
        }
        let view = CapabilitiesJson {
            architecture: self.architecture,
            executors,
            protocol_version: &self.protocol_version,
            support_tier: self.support_tier,
            operating_system: self.operating_system.as_deref(),
            runtimes: self.runtimes.as_deref().map(sorted_runtimes).transpose()?,
            labels: self.labels.as_deref().map(sorted_labels).transpose()?,
            capacity: self.capacity.as_ref().map(checked_capacity).transpose()?,
            features: self
                .features
                .as_deref()
                .map(|f| sorted_names(f, "features", 32))
                .transpose()?,
        };
        let bytes = body(&view, "capabilities", MAX_CAPABILITIES_BYTES)?;
        // INVARIANT: serde_json writes UTF-8.
        Ok(String::from_utf8(bytes).expect("invariant: serde_json writes UTF-8"))
    }
}

/// The canonical capabilities object (`JSON.stringify` of the normalized capabilities).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CapabilitiesJson<'a> {
    architecture: Architecture,
    executors: Vec<String>,
    protocol_version: &'a str,
    support_tier: SupportTier,
    #[serde(skip_serializing_if = "Option::is_none")]
    operating_system: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    runtimes: Option<Vec<RuntimeCapability>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    labels: Option<LabelsJson<Vec<Label>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    capacity: Option<&'a CapacityCapability>,
    #[serde(skip_serializing_if = "Option::is_none")]
    features: Option<Vec<String>>,
}

fn sorted_runtimes(runtimes: &[RuntimeCapability]) -> Result<Vec<RuntimeCapability>, WireError> {
    require(runtimes.len() <= 32, "runtimes", "at most 32")?;
    for r in runtimes {
        require(
            capability_name(&r.name, 64),
            "runtimes.name",
            "a capability name",
        )?;
        require(
            semver::is_version(&r.version),
            "runtimes.version",
            "strict semver",
        )?;
    }
    require(unique_by(runtimes, |r| &r.name), "runtimes", "unique names")?;
    let mut sorted = runtimes.to_vec();
    sort_locale(&mut sorted, |r| r.name.as_str());
    Ok(sorted)
}

fn sorted_labels(labels: &[Label]) -> Result<LabelsJson<Vec<Label>>, WireError> {
    require(labels.len() <= 32, "labels", "at most 32")?;
    let mut sorted = labels.to_vec();
    for l in &sorted {
        require(
            label_key(&l.key),
            "labels",
            "keys ^[A-Za-z0-9][A-Za-z0-9._/-]*$",
        )?;
        require(
            bounded_text(&l.value, 256),
            "labels",
            "values of 1..=256 characters",
        )?;
    }
    require(unique_by(labels, |l| &l.key), "labels", "unique keys")?;
    sort_locale(&mut sorted, |l| l.key.as_str());
    Ok(LabelsJson(object_order(&sorted)))
}

fn checked_capacity(c: &CapacityCapability) -> Result<&CapacityCapability, WireError> {
    positive(c.cpu_cores, 4096, "capacity.cpuCores")?;
    positive(c.memory_bytes, MAX_SAFE_INTEGER, "capacity.memoryBytes")?;
    positive(c.disk_bytes, MAX_SAFE_INTEGER, "capacity.diskBytes")?;
    if let Some(gpus) = &c.gpu {
        require(gpus.len() <= 8, "capacity.gpu", "at most 8")?;
        for g in gpus {
            require(
                capability_name(&g.vendor, 64),
                "capacity.gpu.vendor",
                "a capability name",
            )?;
            require(
                g.model.as_deref().is_none_or(|m| bounded_text(m, 128)),
                "capacity.gpu.model",
                "1..=128 characters",
            )?;
            positive(g.memory_bytes, MAX_SAFE_INTEGER, "capacity.gpu.memoryBytes")?;
        }
    }
    Ok(c)
}

fn lease_duration(ms: u64) -> Result<(), WireError> {
    let bounds = MIN_LEASE_DURATION_MS..=MAX_LEASE_DURATION_MS;
    require(bounds.contains(&ms), "leaseDurationMs", "5000..=600000")
}

fn expected_version(version: u64) -> Result<(), WireError> {
    require(version <= MAX_SAFE_INTEGER, "expectedVersion", "0..=2^53-1")
}

/// The `register` request; serializes as its body without the schema.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RegisterRequest {
    /// Canonical capabilities JSON.
    pub capabilities_json: String,
    /// `sha256_hex(capabilitiesJson)`.
    pub capabilities_hash: Sha256Digest,
    /// 1..=1024.
    pub max_concurrent_runs: u64,
    /// 0..=max_concurrent_runs.
    pub available_slots: u64,
    /// 5,000..=600,000 ms.
    pub lease_duration_ms: u64,
}

impl RegisterRequest {
    /// Builds the request from capabilities (canonical JSON and hash computed here).
    ///
    /// # Errors
    /// [`WireError::Request`] for invalid capabilities or bounds.
    pub fn new(
        capabilities: &Capabilities,
        max_concurrent_runs: u64,
        available_slots: u64,
        lease_duration_ms: u64,
    ) -> Result<Self, WireError> {
        let capabilities_json = capabilities.canonical_json()?;
        require(
            (1..=MAX_CONCURRENT_RUNS).contains(&max_concurrent_runs),
            "maxConcurrentRuns",
            "1..=1024",
        )?;
        require(
            available_slots <= max_concurrent_runs,
            "availableSlots",
            "<= maxConcurrentRuns",
        )?;
        lease_duration(lease_duration_ms)?;
        Ok(Self {
            capabilities_hash: Sha256Digest::of(capabilities_json.as_bytes()),
            capabilities_json,
            max_concurrent_runs,
            available_slots,
            lease_duration_ms,
        })
    }

    /// The request body (≤ 20 KiB).
    ///
    /// # Errors
    /// [`WireError::RequestTooLarge`] above 20 KiB.
    pub fn to_body(&self) -> Result<Vec<u8>, WireError> {
        let view = Schema::new(REGISTER_SCHEMA, self);
        body(&view, "register", MAX_REGISTER_REQUEST_BYTES)
    }
}

/// The `heartbeat` request; serializes as its body without the schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HeartbeatRequest {
    /// Session generation.
    pub generation: WorkerGeneration,
    /// Session version held.
    pub expected_version: u64,
    /// 0..=1024.
    pub available_slots: u64,
    /// 5,000..=600,000 ms.
    pub lease_duration_ms: u64,
}

impl HeartbeatRequest {
    /// The request body (≤ 4 KiB).
    ///
    /// # Errors
    /// [`WireError::Request`] for out-of-bounds values.
    pub fn to_body(&self) -> Result<Vec<u8>, WireError> {
        expected_version(self.expected_version)?;
        require(
            self.available_slots <= MAX_CONCURRENT_RUNS,
            "availableSlots",
            "0..=1024",
        )?;
        lease_duration(self.lease_duration_ms)?;
        let view = Schema::new(HEARTBEAT_SCHEMA, self);
        body(&view, "heartbeat", MAX_REQUEST_BYTES)
    }
}

wire_enum! {
    /// A Session status on the wire.
    SessionStatus {
        Draining = "draining",
        Offline = "offline",
        Online = "online",
    }
}

/// The `transition` request; serializes as its body without the schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TransitionRequest {
    /// Session generation.
    pub generation: WorkerGeneration,
    /// Session version held.
    pub expected_version: u64,
    /// `draining` or `offline` (never `online`).
    pub status: SessionStatus,
}

impl TransitionRequest {
    /// The request body (≤ 4 KiB).
    ///
    /// # Errors
    /// [`WireError::Request`] for `online` or an out-of-bounds version.
    pub fn to_body(&self) -> Result<Vec<u8>, WireError> {
        require(
            self.status != SessionStatus::Online,
            "status",
            "draining or offline",
        )?;
        expected_version(self.expected_version)?;
        let view = Schema::new(TRANSITION_SCHEMA, self);
        body(&view, "transition", MAX_REQUEST_BYTES)
    }
}

/// The Session projection every Session response carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionResponse {
    /// Worker (equals the path's).
    pub worker_id: WorkerId,
    /// Session (equals the path's).
    pub session_id: SessionId,
    /// Generation.
    pub generation: WorkerGeneration,
    /// Session version.
    pub version: u64,
    /// Status.
    pub status: SessionStatus,
    /// Session lease expiry.
    pub lease_expires_at_ms: UnixMillis,
    /// `register` only: whether an older Session was replaced.
    pub replaced_session: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ProjectionWire {
    schema: String,
    worker_id: String,
    session_id: String,
    generation: u64,
    version: u64,
    status: SessionStatus,
    lease_expires_at_ms: u64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RegisterWire {
    schema: String,
    worker_id: String,
    session_id: String,
    generation: u64,
    version: u64,
    status: SessionStatus,
    lease_expires_at_ms: u64,
    replaced_session: bool,
}

fn projection(
    wire: ProjectionWire,
    schema: &'static str,
    worker_id: &WorkerId,
    session_id: &SessionId,
    replaced_session: Option<bool>,
) -> Result<SessionResponse, WireError> {
    exact(&wire.schema, schema, "schema")?;
    ensure(wire.version <= MAX_SAFE_INTEGER, "version", "0..=2^53-1")?;
    let response = SessionResponse {
        worker_id: id(WorkerId::new(wire.worker_id), "workerId")?,
        session_id: id(SessionId::new(wire.session_id), "sessionId")?,
        generation: id(WorkerGeneration::new(wire.generation), "generation")?,
        version: wire.version,
        status: wire.status,
        lease_expires_at_ms: id(
            UnixMillis::new(wire.lease_expires_at_ms),
            "leaseExpiresAtMs",
        )?,
        replaced_session,
    };
    bind_to_request! {
        "the path's":
        response.worker_id == *worker_id => "workerId";
        response.session_id == *session_id => "sessionId";
    }
    Ok(response)
}

impl SessionResponse {
    /// Parses a `register` response and binds it to the path.
    ///
    /// # Errors
    /// [`WireError`] naming the first violation.
    pub fn parse_register(
        bytes: &[u8],
        worker_id: &WorkerId,
        session_id: &SessionId,
    ) -> Result<Self, WireError> {
        let w: RegisterWire = parse_json("register", bytes, MAX_RESPONSE_BYTES)?;
        let replaced = Some(w.replaced_session);
        let wire = ProjectionWire {
            schema: w.schema,
            worker_id: w.worker_id,
            session_id: w.session_id,
            generation: w.generation,
            version: w.version,
            status: w.status,
            lease_expires_at_ms: w.lease_expires_at_ms,
        };
        projection(wire, REGISTER_SCHEMA, worker_id, session_id, replaced)
    }

    /// Parses a `heartbeat` response: bound to the path and request generation,
    /// `version == expectedVersion + 1`, status not `offline`.
    ///
    /// # Errors
    /// [`WireError`] naming the first violation.
    pub fn parse_heartbeat(
        bytes: &[u8],
        worker_id: &WorkerId,
        session_id: &SessionId,
        request: &HeartbeatRequest,
    ) -> Result<Self, WireError> {
        let wire: ProjectionWire = parse_json("heartbeat", bytes, MAX_RESPONSE_BYTES)?;
        let r = projection(wire, HEARTBEAT_SCHEMA, worker_id, session_id, None)?;
        bind_to_request! {
            r.generation == request.generation => "generation";
            r.version == request.expected_version + 1 => "version" as "expectedVersion + 1";
        }
        ensure(
            r.status != SessionStatus::Offline,
            "status",
            "online or draining",
        )?;
        Ok(r)
    }

    /// Parses a `transition` response: bound to the path and request generation, status equal
    /// to the requested one.
    ///
    /// # Errors
    /// [`WireError`] naming the first violation.
    pub fn parse_transition(
        bytes: &[u8],
        worker_id: &WorkerId,
        session_id: &SessionId,
        request: &TransitionRequest,
    ) -> Result<Self, WireError> {
        let wire: ProjectionWire = parse_json("transition", bytes, MAX_RESPONSE_BYTES)?;
        let r = projection(wire, TRANSITION_SCHEMA, worker_id, session_id, None)?;
        bind_to_request! {
            r.generation == request.generation => "generation";
        }
        bind(r.status == request.status, "status", "the requested status")?;
        Ok(r)
    }
}
