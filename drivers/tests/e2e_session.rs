//! The Session coordinator with the real binary (issue 18, Deliver 4 and 6).
//!
//! * a heartbeat answered 401 (or 403, as a gateway in front of the control plane answers)
//!   pauses admission (no Pull goes out), keeps the Session and resumes on the next
//!   authenticated exchange; a Run then goes through;
//! * a heartbeat answered 409 (the Session fenced) registers the Session again, same id, and
//!   work goes on;
//! * two Workers with one worker id: the fences repeat, and one of them halts (exit 5) naming
//!   the cause instead of fighting for ever;
//! * `[capabilities]` reach the control plane in the canonical capabilities JSON.

mod e2e_common;

use std::time::Duration;

use e2e_common::{KillOnDrop, World, events_named, sigterm, wait_event, wait_exit};
use ql_worker_core::record::State;
use ql_worker_core::wire::error::ErrorCode;
use ql_worker_tests::control_plane::{Fault, RevisionBuilder, RunSpec};

const SETTLE: Duration = Duration::from_secs(30);
const JSON: &[&str] = &["--log-format", "json"];

fn session_path(world: &World, session: &str, operation: &str) -> String {
    format!(
        "/api/v3/worker-ingress/workers/{}/sessions/{session}/{operation}",
        world.cp.worker_id()
    )
}

#[test]
fn a_heartbeat_401_pauses_admission_keeps_the_session_and_recovers() {
    refused_heartbeats_pause_admission(
        &Fault::Refuse(ErrorCode::WorkerAuthenticationRequired),
        401,
        "worker_authentication_required",
    );
}

#[test]
fn a_heartbeat_403_from_a_gateway_pauses_admission_keeps_the_session_and_recovers() {
    refused_heartbeats_pause_admission(&Fault::Forbidden, 403, "forbidden");
}

/// Three heartbeats in a row refused with `fault` (`status`, `code`): admission pauses, no
/// Pull goes out, the Session is kept, and the next answered heartbeat lifts the pause.
fn refused_heartbeats_pause_admission(fault: &Fault, status: u16, code: &str) {
    let world = World::with_limits(100, "heartbeat_interval_ms = 1000\n");
    let log = world.dir.path().join("worker.log");
    let mut worker = KillOnDrop(world.spawn_with_args(JSON, &[], &log));
    let registered = wait_event(&log, "session.registered", SETTLE, |_| true);
    wait_event(&log, "reconciliation.done", SETTLE, |_| true);
    let session = registered["session"].as_str().unwrap().to_owned();
    let generation = world.cp.session(world.cp.worker_id()).unwrap().generation;
    let heartbeat = session_path(&world, &session, "heartbeat");
    // Three heartbeats in a row are refused as if the credential had been revoked.
    for _ in 0..3 {
        world.cp.inject_for(&heartbeat, fault.clone());
    }
    let paused = wait_event(&log, "admission.paused", SETTLE, |_| true);
    assert_eq!(paused["status"], status, "{paused}");
    assert_eq!(paused["code"], code, "{paused}");
    // A Run queued while admission is paused waits for the pause to lift.
    let quick = RevisionBuilder::shell("true").build().unwrap();
    let run = world.cp.enqueue_run(RunSpec::numbered(1, quick)).unwrap();
    wait_event(&log, "admission.resumed", SETTLE, |_| true);
    world.wait_for("the Run completed", SETTLE, |w| {
        w.state_of(&run) == Some(State::CompletionAcknowledged)
    });
    assert!(
        worker.try_wait().unwrap().is_none(),
        "the Worker kept running"
    );

    // What the control plane saw: three refused heartbeats, then an answered one; no Pull in
    // between (admission paused), and the same Session all along.
    let records = world.cp.http_records();
    let first_refused = records
        .iter()
        .position(|r| r.path == heartbeat && r.response_status == Some(status))
        .expect("a refused heartbeat");
    let resumed = records[first_refused..]
        .iter()
        .position(|r| r.response_status == Some(200))
        .map(|i| i + first_refused)
        .expect("an answered call after the refusals");
    let refused = records[first_refused..resumed]
        .iter()
        .filter(|r| r.response_status == Some(status))
        .count();
    assert_eq!(refused, 3, "every refused heartbeat was retried");
    assert!(
        records[first_refused..resumed]
            .iter()
            .all(|r| !r.path.ends_with("/offers")),
        "no Pull while admission was paused"
    );
    let now = world.cp.session(world.cp.worker_id()).unwrap();
    assert_eq!(now.session_id.as_str(), session, "the Session was kept");
    assert_eq!(now.generation, generation);
    assert!(events_named(&log, "session.fenced").is_empty());
    sigterm(&worker);
    assert_eq!(wait_exit(&mut worker, SETTLE).code(), Some(0));
}

#[test]
fn a_fenced_heartbeat_registers_the_session_again_and_work_goes_on() {
    let world = World::with_limits(100, "heartbeat_interval_ms = 1000\n");
    let log = world.dir.path().join("worker.log");
    let mut worker = KillOnDrop(world.spawn_with_args(JSON, &[], &log));
    let registered = wait_event(&log, "session.registered", SETTLE, |_| true);
    let session = registered["session"].as_str().unwrap().to_owned();
    // The next heartbeat is applied but answered 409: the Worker's view of the version is now
    // stale, as after a lost answer.
    world.cp.inject_for(
        &session_path(&world, &session, "heartbeat"),
        Fault::WrongStatus(409),
    );
    let fenced = wait_event(&log, "session.fenced", SETTLE, |_| true);
    assert_eq!(fenced["attempt"], 1, "{fenced}");
    wait_event(&log, "session.rejoined", SETTLE, |_| true);
    let quick = RevisionBuilder::shell("true").build().unwrap();
    let run = world.cp.enqueue_run(RunSpec::numbered(1, quick)).unwrap();
    world.wait_for("the Run completed", SETTLE, |w| {
        w.state_of(&run) == Some(State::CompletionAcknowledged)
    });
    assert_eq!(
        world
            .cp
            .session(world.cp.worker_id())
            .unwrap()
            .session_id
            .as_str(),
        session,
        "registered again with the same Session id"
    );
    assert_eq!(events_named(&log, "session.registered").len(), 2);
    sigterm(&worker);
    assert_eq!(wait_exit(&mut worker, SETTLE).code(), Some(0));
}

#[test]
fn two_workers_with_one_worker_id_do_not_fight_for_ever() {
    let world = World::with_limits(100, "heartbeat_interval_ms = 1000\n");
    // A second Worker: same worker id and credential, its own state root (so its own Session
    // id), a copy of the configuration.
    let second_config = world.dir.path().join("second.toml");
    let text = std::fs::read_to_string(&world.config_path).unwrap();
    let root = world.root().display().to_string();
    let second_root = world.dir.path().join("second-state").display().to_string();
    std::fs::write(&second_config, text.replace(&root, &second_root)).unwrap();
    std::fs::set_permissions(
        &second_config,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let first_log = world.dir.path().join("first.log");
    let second_log = world.dir.path().join("second.log");
    let mut first = KillOnDrop(world.spawn_with_args(JSON, &[], &first_log));
    wait_event(&first_log, "reconciliation.done", SETTLE, |_| true);
    let file = std::fs::File::create(&second_log).unwrap();
    let mut second = KillOnDrop(
        std::process::Command::new(e2e_common::PRODUCTION_BINARY)
            .args(JSON)
            .args(["run", "--config"])
            .arg(&second_config)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::from(file))
            .spawn()
            .unwrap(),
    );
    // One of them halts within a few heartbeats.
    let start = std::time::Instant::now();
    let (halted_log, status) = loop {
        if let Some(status) = first.try_wait().unwrap() {
            break (first_log.clone(), status);
        }
        if let Some(status) = second.try_wait().unwrap() {
            break (second_log.clone(), status);
        }
        assert!(
            start.elapsed() < SETTLE,
            "neither Worker halted:\n{}\n---\n{}",
            std::fs::read_to_string(&first_log).unwrap_or_default(),
            std::fs::read_to_string(&second_log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(5));
    let stopped = &events_named(&halted_log, "worker.stopped")[0];
    let message = stopped["message"].as_str().unwrap();
    assert!(
        message.contains("another Worker uses it") || message.contains("fences in a row"),
        "{stopped}"
    );
    assert!(!events_named(&halted_log, "session.fenced").is_empty());
}

#[test]
fn configured_capabilities_reach_the_control_plane_canonically() {
    let mut world = World::new();
    world.append_config(
        "\n[capabilities]\noperating_system = \"linux\"\nlabels = { zone = \"eu-1\", \
         \"example.com/rack\" = \"r7\" }\nruntimes = [{ name = \"python\", version = \"3.11.7\" }, \
         { name = \"node\", version = \"20.20.2\" }]\nfeatures = [\"gpu-less\", \"docker\"]\n\
         memory_bytes = 8589934592\ndisk_bytes = 107374182400\n",
    );
    let log = world.dir.path().join("worker.log");
    let mut worker = KillOnDrop(world.spawn_with_args(JSON, &[], &log));
    wait_event(&log, "session.registered", SETTLE, |_| true);
    let session = world.cp.session(world.cp.worker_id()).unwrap();
    let json: serde_json::Value = serde_json::from_str(&session.capabilities_json).unwrap();
    assert_eq!(json["operatingSystem"], "linux");
    assert_eq!(json["labels"]["zone"], "eu-1");
    assert_eq!(json["labels"]["example.com/rack"], "r7");
    assert_eq!(json["runtimes"][0]["name"], "node", "sorted: {json}");
    assert_eq!(json["runtimes"][1]["version"], "3.11.7");
    assert_eq!(json["features"], serde_json::json!(["docker", "gpu-less"]));
    assert_eq!(json["capacity"]["memoryBytes"], 8_589_934_592u64);
    assert_eq!(json["capacity"]["diskBytes"], 107_374_182_400u64);
    // The control plane accepted it as canonical (it re-derives the JSON and the hash).
    assert_eq!(
        session.capabilities.canonical_json().unwrap(),
        session.capabilities_json
    );
    sigterm(&worker);
    assert_eq!(wait_exit(&mut worker, SETTLE).code(), Some(0));
}
