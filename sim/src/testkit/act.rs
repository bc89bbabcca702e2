//! What the testkit reads off a driver [`Action`]: its kind, whether it is a control-plane call,
//! the operation of a POST, and its canonical bytes.
//!
//! The simulated host keeps the commands it answers as the [`Action`]s the Worker emitted
//! (clonable under the `sim-hooks` feature), so that a simulation state (world, Worker,
//! outstanding commands) can be copied. [`canonical`] is the byte-exact rendering the
//! determinism tests compare and the fingerprints hash (records and claims as their envelope
//! bytes, request bodies verbatim, the launch plan field by field);
//! [`World::summary`](crate::testkit::world::World::summary) is the one-line form the scenario
//! tests assert.

use ql_worker_core::envelope;
use ql_worker_core::ids::Sha256Digest;
use ql_worker_core::io::{Action, HttpCall, LaunchPlan};
use ql_worker_core::wire::route::Operation;

/// The operation of a POST, from its route path's last segment.
///
/// # Panics
/// If the path does not end in a known operation (the core only builds routes of known
/// operations).
#[must_use]
pub fn operation(call: &HttpCall) -> Operation {
    let segment = call.path.rsplit('/').next().unwrap_or("");
    // INVARIANT: the core only builds routes of known operations.
    ql_worker_tests::server_wire::operation_of_segment(segment).expect("known route")
}

/// A POST's operation and call; `None` for any other command.
#[must_use]
pub fn post(action: &Action) -> Option<(Operation, &HttpCall)> {
    match action {
        Action::Post(call) => Some((operation(call), call)),
        _ => None,
    }
}

/// Whether `action` is a POST to `op`.
#[must_use]
pub fn is_post(action: &Action, op: Operation) -> bool {
    post(action).is_some_and(|(o, _)| o == op)
}

/// Whether `action` is a control-plane call (a POST or a log upload): the driver sends those
/// from its call threads, concurrently; everything else it performs on its loop at once.
#[must_use]
pub fn is_call(action: &Action) -> bool {
    matches!(action, Action::Post(_) | Action::UploadLog { .. })
}

/// The kind of command, as one word.
#[must_use]
pub fn kind(action: &Action) -> &'static str {
    match action {
        Action::ListInbox { .. } => "list-inbox",
        Action::ReadRecord { .. } => "read-record",
        Action::PersistRecord { .. } => "persist-record",
        Action::ReadClaim => "read-claim",
        Action::PersistClaim { .. } => "persist-claim",
        Action::ClearClaim { .. } => "clear-claim",
        Action::ReadReceipt { .. } => "read-receipt",
        Action::RemoveReceipt { .. } => "remove-receipt",
        Action::AllocateLog { .. } => "allocate-log",
        Action::InspectLog { .. } => "inspect-log",
        Action::Post(_) => "post",
        Action::UploadLog { .. } => "upload-log",
        Action::Spawn(_) => "spawn",
        Action::Stop { .. } => "stop",
        Action::InspectSupervision { .. } => "inspect-supervision",
        Action::ReadPublishedHandle { .. } => "read-published-handle",
        Action::DrawEntropy => "draw-entropy",
        Action::PersistSession { .. } => "persist-session",
    }
}

/// The canonical bytes of a command: equal iff the commands are equal, records and claims
/// included byte for byte as their envelope encoding (CONVENTIONS C5).
#[must_use]
pub fn canonical(action: &Action) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(kind(action).as_bytes());
    out.push(b' ');
    let text = match action {
        Action::ListInbox { after, limit } => format!("{after:?} {}", limit.get()),
        Action::ReadRecord { offer_id } => format!("{offer_id}"),
        Action::PersistRecord { expected, record } => {
            out.extend_from_slice(&encoded(&**record));
            format!(" {expected:?}")
        }
        Action::ReadClaim | Action::DrawEntropy => String::new(),
        Action::PersistClaim { expected, claim } => {
            out.extend_from_slice(&encoded(&**claim));
            format!(" {expected:?}")
        }
        Action::ClearClaim { offer_id, revision } => format!("{offer_id} {revision}"),
        Action::ReadReceipt { attempt_id }
        | Action::RemoveReceipt { attempt_id }
        | Action::ReadPublishedHandle { attempt_id } => {
            format!("{attempt_id}")
        }
        Action::AllocateLog { log_artifact_id } | Action::InspectLog { log_artifact_id } => {
            format!("{log_artifact_id}")
        }
        Action::Post(call) => {
            out.extend_from_slice(call.path.as_bytes());
            out.push(b' ');
            out.extend_from_slice(&call.body);
            String::new()
        }
        Action::UploadLog {
            path,
            log_artifact_id,
            header,
            byte_length,
            ..
        } => {
            out.extend_from_slice(header);
            format!(" {path} {log_artifact_id} {byte_length}")
        }
        Action::Spawn(plan) => spawn_text(plan),
        Action::Stop { handle } => format!("{handle}"),
        Action::InspectSupervision {
            log_artifact_id,
            handle,
        } => format!("{log_artifact_id} {handle}"),
        Action::PersistSession { session_id } => format!("{session_id}"),
    };
    out.extend_from_slice(text.as_bytes());
    out
}

fn encoded<T: envelope::Durable>(value: &T) -> Vec<u8> {
    match envelope::encode(value) {
        Ok(bytes) => bytes.to_vec(),
        Err(e) => format!("<unencodable: {e:?}>").into_bytes(),
    }
}

fn spawn_text(plan: &LaunchPlan) -> String {
    let mut text = format!(
        "{} {} {} {} {:?} {:?} {:?} {} {} {}",
        plan.offer_id,
        plan.run_id,
        plan.attempt_id,
        plan.executor_started_at,
        plan.command,
        plan.working_directory,
        plan.timeout,
        plan.log_artifact_id,
        plan.callback_sequence,
        Sha256Digest::from_bytes(*plan.capability.expose()).to_hex(),
    );
    for (name, value) in &plan.environment {
        text.push_str(&format!(" {name}={}", value.as_str()));
    }
    text
}
