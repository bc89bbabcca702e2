//! `register`, `heartbeat`, `transition` (reference §2.10): the Worker Session record with its
//! generation, version CAS and Session lease.

use std::collections::BTreeMap;

use serde::Deserialize;

use ql_worker_core::ids::WorkerGeneration;
use ql_worker_core::revision::{Architecture, Label, SupportTier};
use ql_worker_core::wire::error::ErrorCode;
use ql_worker_core::wire::session::{
    Capabilities, CapacityCapability, GpuCapability, HEARTBEAT_SCHEMA, REGISTER_SCHEMA,
    RuntimeCapability, SessionResponse, SessionStatus, TRANSITION_SCHEMA,
};

use super::{ControlPlane, CpResponse, Ctx, Handled, sha256};
use crate::control_plane::requests::{self, Reject};
use crate::control_plane::state::SessionRecord;
use crate::server_wire::ToJsonFor as _;

fn fenced(reason: &'static str) -> Reject {
    Reject::new(ErrorCode::WorkerSessionFenced, reason)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CapabilitiesWire {
    architecture: Architecture,
    executors: Vec<String>,
    protocol_version: String,
    support_tier: SupportTier,
    operating_system: Option<String>,
    runtimes: Option<Vec<RuntimeWire>>,
    labels: Option<BTreeMap<String, String>>,
    capacity: Option<CapacityWire>,
    features: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuntimeWire {
    name: String,
    version: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct CapacityWire {
    cpu_cores: Option<u64>,
    memory_bytes: Option<u64>,
    disk_bytes: Option<u64>,
    gpu: Option<Vec<GpuWire>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct GpuWire {
    vendor: String,
    model: Option<String>,
    memory_bytes: Option<u64>,
}

/// Parses the capabilities snapshot and requires it to be exactly the canonical JSON of the
/// normalized capabilities (required `architecture, executors, protocolVersion, supportTier`),
/// with `capabilitiesHash = sha256_hex(capabilitiesJson)`.
pub(crate) fn parse_capabilities(json: &str, hash_hex: &str) -> Result<Capabilities, Reject> {
    let invalid = || Reject::invalid("capabilities");
    let w: CapabilitiesWire = serde_json::from_str(json).map_err(|_| invalid())?;
    let capabilities = Capabilities {
        architecture: w.architecture,
        executors: w.executors,
        protocol_version: w.protocol_version,
        support_tier: w.support_tier,
        operating_system: w.operating_system,
        runtimes: w.runtimes.map(|list| {
            list.into_iter()
                .map(|r| RuntimeCapability {
                    name: r.name,
                    version: r.version,
                })
                .collect()
        }),
        labels: w.labels.map(|map| {
            map.into_iter()
                .map(|(key, value)| Label { key, value })
                .collect()
        }),
        capacity: w.capacity.map(|c| CapacityCapability {
            cpu_cores: c.cpu_cores,
            memory_bytes: c.memory_bytes,
            disk_bytes: c.disk_bytes,
            gpu: c.gpu.map(|list| {
                list.into_iter()
                    .map(|g| GpuCapability {
                        vendor: g.vendor,
                        model: g.model,
                        memory_bytes: g.memory_bytes,
                    })
                    .collect()
            }),
        }),
        features: w.features,
    };
    let canonical = capabilities.canonical_json().map_err(|_| invalid())?;
    if canonical != json {
        return Err(Reject::invalid("capabilities are not canonical"));
    }
    if sha256(json.as_bytes()).to_hex() != hash_hex {
        return Err(Reject::invalid("capabilitiesHash"));
    }
    Ok(capabilities)
}

impl ControlPlane {
    /// `register`: the same Session id while not offline keeps its generation and its status
    /// (version +1, `replacedSession: false`; a `draining` Session stays `draining`, as the
    /// reference's control plane keeps it); a new Session id replaces the Worker's Session
    /// (generation +1, version 0, `online`, `replacedSession: true`, every lease of the old
    /// generation is fenced from now on); re-registering an offline Session starts a new
    /// generation too.
    pub(super) fn register(&mut self, ctx: &Ctx<'_>, body: &[u8]) -> Handled {
        let request = requests::register(body)?;
        let capabilities = parse_capabilities(
            &request.capabilities_json,
            &request.capabilities_hash.to_hex(),
        )?;
        ctx.storage()?;
        let now = ctx.now;
        let existing = self.state.sessions.get(ctx.worker_id());
        let (generation, version, registered_at, replaced, status, reason) = match existing {
            None => (
                WorkerGeneration::FIRST,
                0,
                now,
                false,
                SessionStatus::Online,
                "registered",
            ),
            Some(s) if &s.session_id == ctx.session_id() && s.status != SessionStatus::Offline => (
                s.generation,
                s.version + 1,
                s.registered_at,
                false,
                s.status,
                "re-registered",
            ),
            Some(s) => {
                let next = s
                    .generation
                    .next()
                    .map_err(|_| Reject::new(ErrorCode::WorkerSessionFenced, "generation"))?;
                let replaced = &s.session_id != ctx.session_id();
                (
                    next,
                    0,
                    now,
                    replaced,
                    SessionStatus::Online,
                    "new generation",
                )
            }
        };
        let record = SessionRecord {
            worker_id: ctx.worker_id().clone(),
            session_id: ctx.session_id().clone(),
            generation,
            version,
            status,
            capabilities_json: request.capabilities_json,
            capabilities,
            max_concurrent_runs: request.max_concurrent_runs,
            available_slots: if status == SessionStatus::Online {
                request.available_slots
            } else {
                0
            },
            lease_duration_ms: request.lease_duration_ms,
            registered_at,
            last_heartbeat_at: now,
            lease_expires_at: now.saturating_add(request.lease_duration_ms),
            updated_at: now,
        };
        let body = projection(&record, Some(replaced)).to_json(REGISTER_SCHEMA);
        self.state.sessions.insert(ctx.worker_id().clone(), record);
        Ok((CpResponse::ok(body), reason))
    }

    /// `heartbeat`: CAS on `expectedVersion` for the current Session and generation, refused
    /// offline or after the Session lease expired (the Worker registers again); version +1 and
    /// a new Session lease.
    pub(super) fn heartbeat(&mut self, ctx: &Ctx<'_>, body: &[u8]) -> Handled {
        let request = requests::heartbeat(body)?;
        ctx.storage()?;
        let now = ctx.now;
        let session = self.current_session(ctx, request.generation, request.expected_version)?;
        if session.lease_expires_at <= now {
            return Err(fenced("session lease expired"));
        }
        if request.available_slots > session.max_concurrent_runs {
            return Err(Reject::invalid("availableSlots above maxConcurrentRuns"));
        }
        let session = self.session_mut(ctx);
        session.version += 1;
        session.available_slots = if session.status == SessionStatus::Online {
            request.available_slots
        } else {
            0
        };
        session.lease_duration_ms = request.lease_duration_ms;
        session.lease_expires_at = now.saturating_add(request.lease_duration_ms);
        session.last_heartbeat_at = now;
        session.updated_at = now;
        let body = projection(session, None).to_json(HEARTBEAT_SCHEMA);
        Ok((CpResponse::ok(body), "heartbeat"))
    }

    /// `transition`: CAS on `expectedVersion`; `online|draining → draining`, `→ offline`;
    /// version +1, no free slots any more.
    pub(super) fn transition(&mut self, ctx: &Ctx<'_>, body: &[u8]) -> Handled {
        let request = requests::transition(body)?;
        ctx.storage()?;
        self.current_session(ctx, request.generation, request.expected_version)?;
        let now = ctx.now;
        let session = self.session_mut(ctx);
        session.version += 1;
        session.status = request.status;
        session.available_slots = 0;
        session.updated_at = now;
        let body = projection(session, None).to_json(TRANSITION_SCHEMA);
        Ok((CpResponse::ok(body), "transition"))
    }

    fn current_session(
        &self,
        ctx: &Ctx<'_>,
        generation: WorkerGeneration,
        expected_version: u64,
    ) -> Result<&SessionRecord, Reject> {
        let session = self
            .state
            .sessions
            .get(ctx.worker_id())
            .ok_or(fenced("missing"))?;
        if &session.session_id != ctx.session_id() {
            return Err(fenced("session mismatch"));
        }
        if session.generation != generation {
            return Err(fenced("generation mismatch"));
        }
        if session.status == SessionStatus::Offline {
            return Err(fenced("offline"));
        }
        if session.version != expected_version {
            return Err(fenced("version mismatch"));
        }
        Ok(session)
    }

    fn session_mut(&mut self, ctx: &Ctx<'_>) -> &mut SessionRecord {
        // INVARIANT: only called after `current_session` found the record.
        self.state
            .sessions
            .get_mut(ctx.worker_id())
            .unwrap_or_else(|| unreachable!("session checked"))
    }
}

fn projection(record: &SessionRecord, replaced: Option<bool>) -> SessionResponse {
    SessionResponse {
        worker_id: record.worker_id.clone(),
        session_id: record.session_id.clone(),
        generation: record.generation,
        version: record.version,
        status: record.status,
        lease_expires_at_ms: record.lease_expires_at,
        replaced_session: replaced,
    }
}
