//! Reference §6.2 (`WR/executionInboxProcessor.test.cjs`): the Processor's start path across
//! the spawn barrier, driven through the whole Worker against the simulated host. Each test is
//! named after the reference scenario and asserts the exact commands.

use ql_worker_core::capability::Capability;
use ql_worker_core::ids::{LogArtifactId, Sha256Digest};
use ql_worker_core::io::{Action, LaunchPlan, Outcome, SpawnOutcome};
use ql_worker_core::record::{InboxRecord, RecoveryReason, State};
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::activation::{
    ActivationResponse, ActivationSnapshot, ActivationStatus, AttemptStatus, RunStatus,
    SnapshotShape,
};
use ql_worker_core::wire::route::Operation;
use ql_worker_sim::testkit::act;
use ql_worker_sim::testkit::sim::{On, Sim};
use ql_worker_sim::testkit::world::check::CapabilityForms;
use ql_worker_sim::testkit::world::{Answer, OfferTemplate, SpawnPlan, World};
use ql_worker_sim::testkit::{self};
use ql_worker_tests::server_wire::ToJson as _;

fn ms(v: u64) -> UnixMillis {
    UnixMillis::new(v).unwrap()
}

fn lines(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_string()).collect()
}

/// The commands from the first one equal to `from` to the end.
fn from(trail: &[String], first: &str) -> Vec<String> {
    let start = trail
        .iter()
        .position(|l| l == first)
        .unwrap_or_else(|| panic!("{first} not in {trail:#?}"));
    trail[start..].to_vec()
}

/// Registered, reconciled, and the first active tick run: the offer is pulled and processed.
fn processed(world: World, script: &[(On, Answer)]) -> Sim {
    let mut sim = Sim::scenario(world);
    sim.run(2);
    for (on, answer) in script {
        sim.on(*on, *answer);
    }
    sim.run(1);
    sim
}

/// The launch plans the Worker issued, in order.
fn launch_plans(sim: &Sim) -> Vec<LaunchPlan> {
    sim.stream
        .iter()
        .flatten()
        .filter_map(|a| match a {
            Action::Spawn(plan) => Some((**plan).clone()),
            _ => None,
        })
        .collect()
}

/// The same plans as the simulated supervisor receives them.
fn spawn_plans(sim: &Sim) -> Vec<SpawnPlan> {
    launch_plans(sim).iter().map(SpawnPlan::of).collect()
}

fn written(sim: &Sim, state: State) -> InboxRecord {
    sim.stream
        .iter()
        .flatten()
        .find_map(|a| match a {
            Action::PersistRecord { record, .. } if record.state == state => {
                Some((**record).clone())
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no {state} write"))
}

fn body(sim: &Sim, operation: Operation) -> serde_json::Value {
    sim.stream
        .iter()
        .flatten()
        .find_map(|a| match act::post(a) {
            Some((op, call)) if op == operation => {
                Some(serde_json::from_slice(&call.body).unwrap())
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("no {operation:?} request"))
}

const START: [&str; 11] = [
    "clear-claim r0",
    "read-record o1",
    "post starting o1",
    "persist-record o1 r1 starting_acknowledged",
    "draw-entropy",
    "allocate-log o1",
    "persist-record o1 r2 launching",
    "spawn o1",
    "persist-record o1 r3 started",
    "post running o1",
    "persist-record o1 r4 running_acknowledged",
];

/// Every ACK and the spawn barrier land in the one inbox record: starting_acknowledged,
/// launching, started, running_acknowledged. The running ACK carries callback sequence 1 and
/// the lowercase hex SHA-256 of the capability handed to the supervisor; no record holds the
/// capability itself (the `no-capability-at-rest` check of every write). One straight start calls
/// `starting` once (its answer already carries the launch authority); a restart from
/// `starting_acknowledged` replays it, as the reference's second call does. Wiping the
/// capability buffer is a type property (`Capability` and `LaunchPlan` zeroize on drop).
#[test]
fn persists_every_ack_and_spawn_barrier_in_the_one_delivery_inbox() {
    let sim = processed(World::one_offer(1), &[]);
    assert_eq!(from(&sim.commands(), "clear-claim r0"), lines(&START));
    let plan = &spawn_plans(&sim)[0];
    let digest = Capability::from_bytes(plan.capability).digest();
    let running = body(&sim, Operation::Running);
    assert_eq!(running["callbackSequence"], 1);
    assert_eq!(running["callbackTokenDigest"], digest.expose().to_hex());
    let launching = written(&sim, State::Launching);
    assert_eq!(launching.completion_receipt_token_digest, Some(digest));
    sim.assert_no_violations();

    // Crash after starting_acknowledged is durable: the restart replays `starting`.
    let mut sim = processed(
        World::one_offer(1),
        &[(On::Persist(State::StartingAcknowledged), Answer::CrashAfter)],
    );
    sim.run(3);
    let trail = sim.commands();
    assert_eq!(trail.iter().filter(|l| *l == "post starting o1").count(), 2);
    assert_eq!(
        from(&trail, "crash"),
        lines(&[
            "crash",
            "post register",
            "list-inbox",
            "read-record o1",
            "post starting o1",
            "draw-entropy",
            "allocate-log o1",
            "persist-record o1 r2 launching",
            "spawn o1",
            "persist-record o1 r3 started",
            "post running o1",
            "persist-record o1 r4 running_acknowledged",
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "read-record o1",
            "inspect-supervision o1",
            "post lease-control o1",
            "persist-record o1 r5 running_acknowledged",
        ])
    );
}

/// A revision with `timeoutMs` hands the Executor the timeout and the durable deadline the
/// starting ACK fixed (`deadlineAtMs` = 1 000 + 5 000).
#[test]
fn passes_timeout_to_the_executor_only_with_durable_starting_deadline_authority() {
    let sim = processed(World::one_offer(1), &[]);
    let plan = &spawn_plans(&sim)[0];
    assert_eq!(plan.timeout, Some((5_000, ms(6_000))));
    // Without `timeoutMs`, neither reaches the Executor.
    let untimed = World::new(
        1,
        vec![OfferTemplate::with_revision(1, testkit::untimed_revision())],
    );
    let sim = processed(untimed, &[]);
    assert_eq!(spawn_plans(&sim)[0].timeout, None);
}

fn starting_without_deadline(sim: &Sim) -> Outcome {
    let run = sim.world.plane.runs.values().next().unwrap();
    let response = ActivationResponse {
        status: ActivationStatus::Applied,
        snapshot: ActivationSnapshot {
            run_id: run.offer.candidate.run_id.clone(),
            attempt_id: run.offer.candidate.attempt_id.clone(),
            run_status: RunStatus::Dispatching,
            attempt_status: AttemptStatus::Starting,
            lease_version: run.offer.lease.version,
            lease_generation: run.offer.lease.lease_generation.get(),
            callback_sequence: 0,
            deadline_at_ms: None,
            started_at_ms: None,
            finished_at_ms: None,
            executor_handle: None,
            log_artifact_id: None,
            error_code: None,
        },
        shape: SnapshotShape::Starting,
    };
    Outcome::Responded(response.to_json())
}

/// A revision with `timeoutMs` whose starting ACK carries no durable deadline fails closed:
/// nothing is persisted, no capability drawn, nothing spawned (the record stays `accepted`).
#[test]
fn fails_closed_before_spawn_when_timeout_revision_lacks_durable_deadline_authority() {
    let mut sim = Sim::scenario(World::one_offer(1));
    sim.run(2);
    sim.tick();
    while sim
        .act()
        .is_some_and(|a| !act::is_post(a, Operation::Starting))
    {
        sim.answer(Answer::Ok);
    }
    let outcome = starting_without_deadline(&sim);
    sim.deliver(outcome);
    sim.settle();
    let trail = from(&sim.commands(), "post starting o1");
    assert_eq!(trail, lines(&["post starting o1"]));
    assert!(spawn_plans(&sim).is_empty());
    let id = sim.world.plane.runs.keys().next().unwrap();
    assert_eq!(sim.world.disk.record(id).unwrap().state, State::Accepted);
}

/// An executor outcome that proves nothing (`Unknown`) leads to
/// `recovery_required(launch_outcome_unknown)` and never to `start-failure`, however long the
/// Worker runs.
#[test]
fn treats_an_ambiguous_executor_error_as_recovery_never_start_failure() {
    let mut sim = processed(
        World::one_offer(1),
        &[(On::Kind("spawn"), Answer::UnknownSpawned)],
    );
    sim.run(4);
    let trail = sim.commands();
    assert_eq!(
        from(&trail, "spawn o1")[..2],
        lines(&["spawn o1", "persist-record o1 r3 recovery_required"])[..]
    );
    assert_eq!(
        written(&sim, State::RecoveryRequired).recovery_reason,
        Some(RecoveryReason::LaunchOutcomeUnknown)
    );
    assert!(!trail.iter().any(|l| l.starts_with("post start-failure")));
    assert!(sim.worker.fail_closed().is_some());
}

/// Only the supervisor's `Rejected` (proof that nothing was spawned) becomes `start_failed`,
/// reported with `start-failure`, then `start_failure_acknowledged`.
#[test]
fn reports_only_an_explicit_no_spawn_rejection_as_start_failure() {
    let sim = processed(
        World::one_offer(1),
        &[(On::Kind("spawn"), Answer::Rejected)],
    );
    assert_eq!(
        from(&sim.commands(), "spawn o1")[..4],
        lines(&[
            "spawn o1",
            "persist-record o1 r3 start_failed",
            "post start-failure o1",
            "persist-record o1 r4 start_failure_acknowledged",
        ])[..]
    );
    assert!(sim.world.supervisor.processes.is_empty());
}

/// The output (the log spool) is admitted before the barrier, but handed to the supervisor —
/// the spawn — only once `launching` is durable; at the spawn the durable record is `launching`
/// (checked by the world's `spawn-barrier` invariant).
#[test]
fn takes_output_only_after_the_durable_launching_barrier() {
    let sim = processed(World::one_offer(1), &[]);
    assert_eq!(
        from(&sim.commands(), "allocate-log o1")[..3],
        lines(&[
            "allocate-log o1",
            "persist-record o1 r2 launching",
            "spawn o1"
        ])[..]
    );
    let plan = &spawn_plans(&sim)[0];
    assert_eq!(
        Some(&plan.log_artifact_id),
        written(&sim, State::Launching).log_artifact_id.as_ref()
    );
    assert!(sim.world.violations.is_empty());
}

/// When the output cannot be handed off (the spool refuses the log), the start fails before
/// the barrier: `start_failed`, `start-failure`, `start_failure_acknowledged`, zero spawns. The
/// supervisor's own check of the handed-off file identity (drift ⇒ `Rejected`, zero spawns) is
/// tested with the driver: `drivers/tests/supervisor_launch.rs`
/// (`missing_log_spool_is_rejected_before_spawn`,
/// `does_not_spawn_when_the_durable_worker_barrier_rejects_authority`).
#[test]
fn fails_without_spawning_when_the_handed_off_output_identity_drifts() {
    let sim = processed(
        World::one_offer(1),
        &[(On::Kind("allocate-log"), Answer::Unavailable)],
    );
    assert_eq!(
        from(&sim.commands(), "allocate-log o1")[..4],
        lines(&[
            "allocate-log o1",
            "persist-record o1 r2 start_failed",
            "post start-failure o1",
            "persist-record o1 r3 start_failure_acknowledged",
        ])[..]
    );
    assert!(spawn_plans(&sim).is_empty());
}

/// The restart rule does not wait for a Session that is not draining: a `launching` record that
/// startup reconciliation could not read, and that a supervision pass reaches only once a drain
/// has begun, still becomes `recovery_required(launch_outcome_unknown)`. Before, a draining
/// Session refused every Processor step of a new claim, so the record stayed `launching`, its
/// lease was renewed at every pass and the drain waited for it until its budget ended (found by
/// the walks from a preloaded inbox).
#[test]
fn a_launching_record_is_recovered_while_the_session_drains() {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, State::Launching), true);
    let mut sim = Sim::scenario(world);
    sim.on(On::Kind("read-record"), Answer::Unchanged);
    sim.run(1);
    assert_eq!(sim.first_record().state, State::Launching);
    sim.request_drain();
    sim.run(3);
    let trail = sim.commands();
    assert!(
        trail.contains(&"post transition".to_string()),
        "the Session drains: {trail:#?}"
    );
    let record = sim.first_record();
    assert_eq!(record.state, State::RecoveryRequired, "{trail:#?}");
    assert_eq!(
        record.recovery_reason,
        Some(RecoveryReason::LaunchOutcomeUnknown)
    );
    sim.assert_no_violations();
}

/// A `launching` record seen at restart is never spawned again: no starting ACK, no entropy,
/// no Secrets, no spool, no spawn — only `recovery_required(launch_outcome_unknown)`, and the
/// Worker fails closed (no Pull).
#[test]
fn never_respawns_a_restart_visible_launching_record() {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, State::Launching), true);
    let mut sim = Sim::scenario(world);
    sim.run(4);
    assert_eq!(
        sim.commands(),
        lines(&[
            "post register",
            "list-inbox",
            "read-record o1",
            "persist-record o1 r3 recovery_required",
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "read-record o1",
            "read-published-handle attempt-1",
            "post lease-control o1",
            "persist-record o1 r4 recovery_required",
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "read-record o1",
            "read-published-handle attempt-1",
            "post lease-control o1",
            "persist-record o1 r5 recovery_required",
        ])
    );
    assert_eq!(
        sim.world.supervisor.processes.len(),
        1,
        "still the one process"
    );
}

/// The plan handed to the supervisor carries exactly the durable barrier (start time, log id,
/// callback sequence, capability digest); the supervisor re-reads the record and refuses any
/// drift with zero spawns — the simulated supervisor here, the real one in
/// `drivers/tests/supervisor_launch.rs`
/// (`does_not_spawn_when_the_durable_worker_barrier_rejects_authority`,
/// `barrier_rejects_a_record_that_is_no_longer_launching_or_is_missing`).
#[test]
fn revalidates_the_exact_durable_log_and_callback_barrier_before_posix_spawn() {
    let mut sim = processed(
        World::one_offer(1),
        &[(On::Kind("spawn"), Answer::CrashBefore)],
    );
    let launch = launch_plans(&sim).remove(0);
    let plan = SpawnPlan::of(&launch);
    let launching = written(&sim, State::Launching);
    assert_eq!(
        Some(plan.executor_started_at),
        launching.executor_started_at_ms
    );
    assert_eq!(
        Some(&plan.log_artifact_id),
        launching.log_artifact_id.as_ref()
    );
    assert_eq!(
        Some(plan.callback_sequence),
        launching.completion_receipt_callback_sequence
    );
    assert_eq!(
        Some(plan.digest()),
        launching
            .completion_receipt_token_digest
            .map(|d| *d.expose())
    );
    let mut drifted_log = launch.clone();
    drifted_log.log_artifact_id = LogArtifactId::new(format!("wlog-{}", "0".repeat(30))).unwrap();
    let mut drifted_digest = launch.clone();
    drifted_digest.capability =
        Capability::from_bytes(*Sha256Digest::of(b"another capability").as_bytes());
    for drifted in [drifted_log, drifted_digest] {
        let outcome = sim
            .world
            .perform(sim.now, &Action::Spawn(Box::new(drifted)), Answer::Ok);
        assert!(matches!(outcome, Outcome::Spawned(SpawnOutcome::Rejected)));
        assert_eq!(
            sim.world.violations.pop().unwrap().invariant,
            "spawn-barrier"
        );
    }
    assert!(sim.world.supervisor.processes.is_empty());
}

/// The environment is checked exactly against the revision before the barrier: public values
/// come from the revision itself, and Secret values that do not match the request (here a
/// Secrets answer of the contract's shape for another execution digest) fail the start before
/// `launching`: `start_failed`, `start-failure`, `start_failure_acknowledged`, zero spawns.
#[test]
fn reports_failure_before_the_spawn_barrier_when_materialized_public_data_drifts() {
    let world = World::new(
        1,
        vec![OfferTemplate::with_revision(1, testkit::secret_revision())],
    );
    let sim = processed(world, &[(On::Post(Operation::Secrets), Answer::Drifted)]);
    assert_eq!(
        from(&sim.commands(), "post starting o1")[..7],
        lines(&[
            "post starting o1",
            "persist-record o1 r1 starting_acknowledged",
            "draw-entropy",
            "post secrets o1",
            "persist-record o1 r2 start_failed",
            "post start-failure o1",
            "persist-record o1 r3 start_failure_acknowledged",
        ])[..]
    );
    assert!(spawn_plans(&sim).is_empty());
    // With a healthy answer, the Secret value reaches the plan next to the public one.
    let world = World::new(
        1,
        vec![OfferTemplate::with_revision(1, testkit::secret_revision())],
    );
    let sim = processed(world, &[]);
    let env = &spawn_plans(&sim)[0].environment;
    assert_eq!(
        env,
        &vec![
            ("PUBLIC_VALUE".to_string(), "visible".to_string()),
            ("SECRET_VALUE".to_string(), "sim-secret-value".to_string()),
        ]
    );
}

/// What the driver may log of a launch plan and of an outcome (`{:?}`) names the launch and the
/// environment's names, never a Secret value or the capability in any form; a response body
/// shows only its length; a command id reads `op#N`.
#[test]
fn a_launch_plan_and_a_response_body_show_no_secret_in_debug() {
    let world = World::new(
        1,
        vec![OfferTemplate::with_revision(1, testkit::secret_revision())],
    );
    let sim = processed(world, &[]);
    let plan = launch_plans(&sim).pop().expect("a launch plan");
    let secret = "sim-secret-value";
    assert!(plan.environment.iter().any(|(_, v)| v.as_str() == secret));
    let text = format!("{plan:?}");
    for shown in [
        "LaunchPlan",
        plan.offer_id.as_str(),
        plan.attempt_id.as_str(),
        "SECRET_VALUE",
        "PUBLIC_VALUE",
        "capability: \"[redacted]\"",
    ] {
        assert!(text.contains(shown), "{shown} in {text}");
    }
    assert!(!text.contains(secret), "{text}");
    let forms = CapabilityForms::of(*plan.capability.expose());
    assert!(!forms.found_in(text.as_bytes()), "{text}");
    let body = format!("{{\"values\":[{{\"value\":\"{secret}\"}}]}}");
    let outcome = format!("{:?}", Outcome::Responded(body.clone().into_bytes()));
    assert_eq!(outcome, format!("Responded({} bytes)", body.len()));
    assert_eq!(ql_worker_core::io::OpId(7).to_string(), "op#7");
}
