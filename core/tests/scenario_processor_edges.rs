//! The edges of the Processor's start path (`core/src/processor.rs`) that the other scenarios
//! do not reach, found by mutation testing (`docs/mutation.md`): the exact environment's bounds
//! (binding and bundle bytes, the variable count, bundle names), the lease version a
//! start-failure answer may carry, an `applied` start-failure answer of the running shape, the
//! renewal before the Secrets fetch, a drain that begins while the starting ACK is in flight,
//! the target check of a draining Session, a clean write failure before the barrier, and what
//! the Worker reports and renders. Driven through the whole Worker against the simulated host;
//! where the simulated control plane has no such answer (a Secret or bundle value of a chosen
//! size, a snapshot of a chosen lease version), the test hands the Worker the response itself.

use ql_worker_core::facts::Fact;
use ql_worker_core::ids::{ExecutorHandle, LeaseVersion, SessionId};
use ql_worker_core::io::{Action, Input, Outcome};
use ql_worker_core::js::JsString;
use ql_worker_core::offer::DeliveryKind;
use ql_worker_core::processor::ProcessResult;
use ql_worker_core::record::{InboxRecord, RecoveryReason, State};
use ql_worker_core::revision::{EnvBinding, EnvName, EnvValue, ExecutionRevision, SecretRef};
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::activation::{
    ActivationResponse, ActivationSnapshot, ActivationStatus, AttemptStatus, RunStatus,
    SnapshotShape,
};
use ql_worker_core::wire::route::Operation;
use ql_worker_core::wire::secrets::{
    BUNDLE_SCHEMA, ResolvedSecret, SecretValue, SecretsRequest, SecretsResponse,
};
use ql_worker_sim::testkit::sim::{On, Sim, Status};
use ql_worker_sim::testkit::world::{Answer, OfferTemplate, SpawnPlan, World};
use ql_worker_sim::testkit::{self};
use ql_worker_tests::control_plane::revisions::Seal as _;
use ql_worker_tests::server_wire::{ToJson as _, ToJsonFor as _};

fn ms(v: u64) -> UnixMillis {
    UnixMillis::new(v).unwrap()
}

fn lines(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_string()).collect()
}

/// The commands after the first `command` of the trail.
fn after(sim: &Sim, command: &str) -> Vec<String> {
    let trail = sim.commands();
    let at = trail
        .iter()
        .position(|l| l == command)
        .unwrap_or_else(|| panic!("no {command}: {trail:#?}"));
    trail[at + 1..].to_vec()
}

/// Answers the Worker's commands healthily (and ticks it when it is idle) until the trail
/// ends with `suffix`, that last command still outstanding.
fn step_until(sim: &mut Sim, suffix: &[&str]) {
    step_until_with(sim, suffix, |_| Answer::Ok);
}

/// [`step_until`], answering each command as `answer` says.
fn step_until_with(sim: &mut Sim, suffix: &[&str], answer: impl Fn(&Action) -> Answer) {
    for _ in 0..200 {
        let trail = sim.commands();
        let outstanding = sim.act().is_some();
        if outstanding
            && trail.len() >= suffix.len()
            && trail[trail.len() - suffix.len()..] == lines(suffix)[..]
        {
            return;
        }
        if let Some(act) = sim.act() {
            sim.answer(answer(act));
        } else {
            if let Status::Idle(Some(wake)) = sim.status {
                sim.advance_to(wake);
            }
            sim.tick();
        }
    }
    panic!("never reached {suffix:?}: {:#?}", sim.commands());
}

/// Every `Process` result the Worker reported so far (facts on), in order.
fn process_results(sim: &mut Sim) -> Vec<ProcessResult> {
    std::iter::from_fn(|| sim.worker.poll_fact())
        .filter_map(|fact| match fact {
            Fact::Process { result, .. } => Some(result),
            _ => None,
        })
        .collect()
}

fn spawn_plans(sim: &Sim) -> Vec<SpawnPlan> {
    sim.stream
        .iter()
        .flatten()
        .filter_map(|a| match a {
            Action::Spawn(plan) => Some(SpawnPlan::of(plan)),
            _ => None,
        })
        .collect()
}

/// A reference to secret `name` of `project-1` (pinned to `version`, if any).
fn secret_ref(name: &str, version: Option<u64>) -> SecretRef {
    SecretRef::new(SecretRef::create("project-1", name, version).unwrap()).unwrap()
}

/// The sample revision with exactly these bindings and this bundle reference, sealed.
fn revision_with(bindings: Vec<(&str, EnvValue)>, bundle: Option<SecretRef>) -> ExecutionRevision {
    let mut revision = testkit::revision();
    revision.environment = bindings
        .into_iter()
        .map(|(name, value)| EnvBinding {
            name: EnvName::new(name).unwrap(),
            value,
        })
        .collect();
    revision.environment_bundle_ref = bundle;
    revision.seal().unwrap()
}

fn public(value: String) -> EnvValue {
    EnvValue::Public(JsString::from(value))
}

/// The text of an environment bundle with these entries, in this order.
fn bundle_text(entries: &[(String, String)]) -> String {
    let entries: Vec<String> = entries
        .iter()
        .map(|(name, value)| format!(r#"{{"name":"{name}","value":"{value}"}}"#))
        .collect();
    format!(
        r#"{{"schema":"{BUNDLE_SCHEMA}","entries":[{}]}}"#,
        entries.join(",")
    )
}

/// o1 of `revision` claimed and started up to its Secrets fetch; the control plane answers it
/// with `values` (one per requested reference, in order) and `bundle` (for the bundle
/// reference, if any); then the Worker settles.
fn started_with_secrets(
    revision: ExecutionRevision,
    values: &[String],
    bundle: Option<String>,
) -> Sim {
    let world = World::new(1, vec![OfferTemplate::with_revision(1, revision)]);
    let mut sim = Sim::scenario(world);
    sim.run(2);
    sim.tick();
    step_until(&mut sim, &["post secrets o1"]);
    let offer = &sim.world.plane.runs.values().next().unwrap().offer;
    let request = SecretsRequest::from_offer(offer).unwrap().unwrap();
    let resolve = |references: &[SecretRef], values: Vec<String>| -> Vec<ResolvedSecret> {
        assert_eq!(references.len(), values.len());
        references
            .iter()
            .zip(values)
            .map(|(reference, value)| ResolvedSecret {
                secret_ref: reference.clone(),
                value: SecretValue::new(value),
            })
            .collect()
    };
    let response = SecretsResponse {
        values: resolve(&request.secret_refs, values.to_vec()),
        environment_bundles: resolve(
            &request.environment_bundle_refs,
            bundle.into_iter().collect(),
        ),
    };
    let body = response.to_json(&request).to_vec();
    sim.deliver(Outcome::Responded(body));
    sim.settle();
    sim
}

/// The commands from the Secrets fetch on, when the start went through: the spawn and the
/// running ACK.
const LAUNCHED: [&str; 6] = [
    "allocate-log o1",
    "persist-record o1 r2 launching",
    "spawn o1",
    "persist-record o1 r3 started",
    "post running o1",
    "persist-record o1 r4 running_acknowledged",
];

/// The commands from the Secrets fetch on, when the environment was refused: `start_failed`
/// before the barrier (no log, no `launching`, no spawn), reported.
const REFUSED: [&str; 3] = [
    "persist-record o1 r2 start_failed",
    "post start-failure o1",
    "persist-record o1 r3 start_failure_acknowledged",
];

fn assert_launched(sim: &Sim) {
    let trail = after(sim, "post secrets o1");
    assert_eq!(trail[..6], lines(&LAUNCHED)[..], "{trail:#?}");
    assert_eq!(spawn_plans(sim).len(), 1);
}

fn assert_refused(sim: &Sim) {
    let trail = after(sim, "post secrets o1");
    assert_eq!(trail[..3], lines(&REFUSED)[..], "{trail:#?}");
    assert!(spawn_plans(sim).is_empty());
}

/// A binding's public value of `len` bytes.
fn filler(c: char, len: usize) -> String {
    std::iter::repeat_n(c, len).collect()
}

/// The bindings' names and values, Secrets resolved, may take 64 KiB (65 536 bytes) and no
/// more (the reference's materializer `4abf125`): the revision's own 64 KiB budget counts a
/// Secret's reference, not its value, so only the materialized size can tell. `A` (1 + 49 150
/// bytes) and `S` (1 + 16 384, the largest Secret value) make exactly 65 536: launched.
#[test]
fn bindings_of_exactly_64_kib_once_resolved_launch() {
    let revision = revision_with(
        vec![
            ("A", public(filler('a', 49_150))),
            ("S", EnvValue::Secret(secret_ref("big", None))),
        ],
        None,
    );
    let sim = started_with_secrets(revision, &[filler('s', 16_384)], None);
    assert_launched(&sim);
    let env = &spawn_plans(&sim)[0].environment;
    let bytes: usize = env.iter().map(|(n, v)| n.len() + v.len()).sum();
    assert_eq!(bytes, 65_536);
}

/// One byte more than 64 KiB of resolved bindings (`A` one byte longer) refuses the start
/// before the barrier: `start_failed`, reported, nothing spawned.
#[test]
fn bindings_one_byte_above_64_kib_once_resolved_fail_the_start() {
    let revision = revision_with(
        vec![
            ("A", public(filler('a', 49_151))),
            ("S", EnvValue::Secret(secret_ref("big", None))),
        ],
        None,
    );
    let sim = started_with_secrets(revision, &[filler('s', 16_384)], None);
    assert_refused(&sim);
}

fn bundle_revision(bindings: Vec<(&str, EnvValue)>) -> ExecutionRevision {
    revision_with(bindings, Some(secret_ref("env-bundle", Some(1))))
}

/// The environment bundle's entries reach the child after the revision's bindings, in the
/// bundle's normalized order (by name), whatever order the bundle text lists them in.
#[test]
fn bundle_entries_follow_the_bindings_in_name_order() {
    let revision = bundle_revision(vec![("PUBLIC_VALUE", public("visible".into()))]);
    let bundle = bundle_text(&[
        ("Z_LAST".into(), "1".into()),
        ("A_FIRST".into(), "2".into()),
    ]);
    let sim = started_with_secrets(revision, &[], Some(bundle));
    assert_launched(&sim);
    assert_eq!(
        spawn_plans(&sim)[0].environment,
        vec![
            ("PUBLIC_VALUE".to_string(), "visible".to_string()),
            ("A_FIRST".to_string(), "2".to_string()),
            ("Z_LAST".to_string(), "1".to_string()),
        ]
    );
}

/// A bundle entry named as one of the revision's bindings refuses the start (a bundle never
/// overrides a binding): `start_failed` before the barrier.
#[test]
fn a_bundle_entry_named_as_a_binding_fails_the_start() {
    let revision = bundle_revision(vec![("PUBLIC_VALUE", public("visible".into()))]);
    let bundle = bundle_text(&[("PUBLIC_VALUE".into(), "other".into())]);
    let sim = started_with_secrets(revision, &[], Some(bundle));
    assert_refused(&sim);
}

/// Bindings and bundle entries together may take 64 KiB and no more: `A` (1 + 32 767 bytes)
/// and the entries `B`, `C` (1 + 16 383 each) make exactly 65 536 bytes: launched, with all
/// three variables.
#[test]
fn bindings_and_bundle_of_exactly_64_kib_launch() {
    let revision = bundle_revision(vec![("A", public(filler('a', 32_767)))]);
    let bundle = bundle_text(&[
        ("B".into(), filler('b', 16_383)),
        ("C".into(), filler('c', 16_383)),
    ]);
    let sim = started_with_secrets(revision, &[], Some(bundle));
    assert_launched(&sim);
    let env = &spawn_plans(&sim)[0].environment;
    let bytes: usize = env.iter().map(|(n, v)| n.len() + v.len()).sum();
    assert_eq!((env.len(), bytes), (3, 65_536));
}

/// One byte more (`A` one byte longer) refuses the start before the barrier.
#[test]
fn bindings_and_bundle_one_byte_above_64_kib_fail_the_start() {
    let revision = bundle_revision(vec![("A", public(filler('a', 32_768)))]);
    let bundle = bundle_text(&[
        ("B".into(), filler('b', 16_383)),
        ("C".into(), filler('c', 16_383)),
    ]);
    let sim = started_with_secrets(revision, &[], Some(bundle));
    assert_refused(&sim);
}

/// `count` bundle entries `B000`, `B001`, … of value `v`.
fn numbered_entries(count: usize) -> Vec<(String, String)> {
    (0..count)
        .map(|i| (format!("B{i:03}"), String::from("v")))
        .collect()
}

/// The child gets at most 256 variables, bindings and bundle entries together: one binding and
/// 255 entries launch; one binding and 256 entries (each part within its own bound) refuse the
/// start before the barrier.
#[test]
fn at_most_256_variables_reach_the_child() {
    let revision = || bundle_revision(vec![("A", public("a".into()))]);
    let sim = started_with_secrets(revision(), &[], Some(bundle_text(&numbered_entries(255))));
    assert_launched(&sim);
    assert_eq!(spawn_plans(&sim)[0].environment.len(), 256);
    let sim = started_with_secrets(revision(), &[], Some(bundle_text(&numbered_entries(256))));
    assert_refused(&sim);
}

/// A `start_failed` record found at restart (lease version 0), its start-failure answered
/// `applied` with a snapshot of `shape` at lease version `version`; returns the simulation
/// settled and the results the Worker reported.
fn start_failure_answered(version: u64, shape: SnapshotShape) -> (Sim, Vec<ProcessResult>) {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, State::StartFailed), false);
    let mut sim = Sim::scenario(world);
    sim.worker.report_facts();
    sim.tick();
    step_until(&mut sim, &["post start-failure o1"]);
    let offer = sim.first_record().offer;
    let running = shape == SnapshotShape::Running;
    let terminal = shape == SnapshotShape::Terminal;
    let response = ActivationResponse {
        status: ActivationStatus::Applied,
        snapshot: ActivationSnapshot {
            run_id: offer.candidate.run_id.clone(),
            attempt_id: offer.candidate.attempt_id.clone(),
            run_status: if running {
                RunStatus::Running
            } else {
                RunStatus::Failed
            },
            attempt_status: if running {
                AttemptStatus::Running
            } else {
                AttemptStatus::Failed
            },
            lease_version: LeaseVersion::new(version).unwrap(),
            lease_generation: offer.lease.lease_generation.get(),
            callback_sequence: 0,
            deadline_at_ms: None,
            started_at_ms: running.then(|| ms(900)),
            finished_at_ms: terminal.then(|| ms(1_000)),
            executor_handle: running.then(|| ExecutorHandle::new("ql3lp1.elsewhere").unwrap()),
            log_artifact_id: None,
            error_code: terminal.then(|| String::from("start_failed")),
        },
        shape,
    };
    sim.deliver(Outcome::Responded(response.to_json()));
    sim.settle();
    let results = process_results(&mut sim);
    (sim, results)
}

/// The start-failure answer's snapshot may carry a lease version at most one above the
/// record's: at exactly the record's version + 1 the failure is acknowledged and persisted.
#[test]
fn a_start_failure_snapshot_one_lease_version_ahead_is_acknowledged() {
    let (sim, results) = start_failure_answered(1, SnapshotShape::Terminal);
    assert_eq!(
        after(&sim, "post start-failure o1"),
        lines(&["persist-record o1 r3 start_failure_acknowledged"])
    );
    assert_eq!(results, vec![ProcessResult::StartFailed]);
}

/// Two versions ahead breaks the contract: refused (`ActivationInvalid`), nothing written, the
/// record stays `start_failed`.
#[test]
fn a_start_failure_snapshot_two_lease_versions_ahead_is_refused() {
    let (sim, results) = start_failure_answered(2, SnapshotShape::Terminal);
    assert_eq!(after(&sim, "post start-failure o1"), Vec::<String>::new());
    assert_eq!(
        results,
        vec![ProcessResult::ActivationInvalid(String::from(
            "start-failure snapshot lease version above 1"
        ))]
    );
    assert_eq!(sim.first_record().state, State::StartFailed);
}

/// An `applied` start-failure answer whose snapshot is of the running shape (the Run runs
/// elsewhere) is recovery evidence, as `already_running` is: `recovery_required
/// (control_plane_already_running)`, never `start_failure_acknowledged`.
#[test]
fn an_applied_start_failure_answer_of_the_running_shape_requires_recovery() {
    let (sim, results) = start_failure_answered(0, SnapshotShape::Running);
    assert_eq!(
        after(&sim, "post start-failure o1"),
        lines(&["persist-record o1 r3 recovery_required"])
    );
    assert_eq!(
        results,
        vec![ProcessResult::RecoveryRequired(
            RecoveryReason::ControlPlaneAlreadyRunning
        )]
    );
}

/// The start path reports how the running ACK ended: `Running` when this pass's ACK was
/// applied; `AlreadyRunning` when the control plane already held the Run running (the ACK
/// replayed after a crash lost the `running_acknowledged` write).
#[test]
fn a_replayed_running_ack_reports_already_running() {
    let mut sim = Sim::scenario(World::one_offer(1));
    sim.worker.report_facts();
    sim.run(3);
    assert_eq!(process_results(&mut sim), vec![ProcessResult::Running]);

    let mut sim = Sim::scenario(World::one_offer(1));
    sim.run(2);
    sim.on(On::Persist(State::RunningAcknowledged), Answer::CrashBefore);
    sim.run(1);
    assert_eq!(sim.first_record().state, State::Started);
    sim.worker.report_facts();
    sim.run(2);
    assert_eq!(
        after(&sim, "crash")[..5],
        lines(&[
            "post register",
            "list-inbox",
            "read-record o1",
            "post running o1",
            "persist-record o1 r4 running_acknowledged",
        ])[..]
    );
    assert_eq!(
        process_results(&mut sim),
        vec![ProcessResult::AlreadyRunning]
    );
}

/// A drain requested while the starting ACK is in flight: the ACK's answer is persisted and
/// the capability drawn, but the launch does not go on past that (the log allocation, the
/// first command of the launch staged after the drain began, is withdrawn: a drain begins no
/// launch): the record stays `starting_acknowledged`, nothing is spawned, and the pass ends
/// `Deferred`.
#[test]
fn a_drain_begun_during_the_starting_ack_stops_the_launch_before_the_log() {
    let mut sim = Sim::scenario(World::one_offer(1));
    sim.run(2);
    sim.worker.report_facts();
    sim.tick();
    step_until(&mut sim, &["post starting o1"]);
    sim.worker
        .handle(sim.clock(), Input::DrainRequested)
        .unwrap();
    sim.poll();
    sim.settle();
    let trail = after(&sim, "post starting o1");
    assert_eq!(
        trail[..2],
        lines(&["persist-record o1 r1 starting_acknowledged", "draw-entropy"])[..],
        "{trail:#?}"
    );
    assert!(
        !trail
            .iter()
            .any(|l| l == "allocate-log o1" || l == "spawn o1"),
        "{trail:#?}"
    );
    assert_eq!(sim.first_record().state, State::StartingAcknowledged);
    assert!(
        process_results(&mut sim).contains(&ProcessResult::Deferred),
        "the pass ends deferred"
    );
}

/// A `starting_acknowledged` record found at restart while the Worker is fail-closed (recovery
/// evidence on o2), with lease control every 5 s: its start path ends `Deferred` before
/// anything, not even a renewal of its lease goes out for it (the renewal belongs to a launch
/// that may not begin).
#[test]
fn a_fail_closed_worker_renews_no_lease_for_a_start_it_defers() {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, State::StartingAcknowledged), false);
    world.seed(2, testkit::record(2, State::RecoveryRequired), false);
    let mut config = testkit::explore::model_config();
    config.lease_control_interval_ms = 5_000;
    let mut sim = Sim::new(config, world, ms(1_000)).recording();
    sim.worker.report_facts();
    sim.run(3);
    let trail = sim.commands();
    assert!(trail.iter().any(|l| l == "read-record o1"), "{trail:#?}");
    assert!(
        !trail
            .iter()
            .any(|l| l == "post lease-control o1" || l == "post starting o1"),
        "{trail:#?}"
    );
    assert!(process_results(&mut sim).contains(&ProcessResult::Deferred));
}

/// A recording simulation of the model configuration with lease control every 5 s, holding
/// o1 (of `revision`) `accepted` as found at restart: no lease clock of this process.
fn accepted_at_restart(revision: ExecutionRevision) -> Sim {
    let offer = testkit::offer_for(
        1,
        testkit::offer_id(1),
        testkit::lease_token(1),
        revision,
        ms(20),
        30_000,
    );
    let mut world = World::new(1, Vec::new());
    world.seed(1, InboxRecord::accepted(offer, ms(100)), false);
    let mut config = testkit::explore::model_config();
    config.lease_control_interval_ms = 5_000;
    Sim::new(config, world, ms(1_000)).recording()
}

/// A start path whose lease was not obtained by this process renews it before each of its
/// calls that has not had a renewal at that state yet: here the renewal before the starting
/// ACK gets no answer (`Unavailable`), so none obtained a lease and the Secrets fetch is
/// preceded by a renewal of its own, after which the record is read again and the fetch goes
/// out at once (no second starting ACK, no second capability).
#[test]
fn the_secrets_fetch_renews_the_lease_first_when_due() {
    let mut sim = accepted_at_restart(testkit::secret_revision());
    sim.on(On::Post(Operation::LeaseControl), Answer::Unavailable);
    sim.run(2);
    assert_eq!(
        after(&sim, "draw-entropy")[..6],
        lines(&[
            "read-record o1",
            "post lease-control o1",
            "persist-record o1 r2 starting_acknowledged",
            "read-record o1",
            "post secrets o1",
            "allocate-log o1",
        ])[..]
    );
    let trail = sim.commands();
    assert_eq!(
        trail.iter().filter(|l| *l == "post starting o1").count(),
        1,
        "{trail:#?}"
    );
}

/// The renewal before the Secrets fetch finds the lease run out (between its read of the
/// record and its re-read), and records `recovery_required`: the start path, reading the record
/// again, ends there, no Secrets fetch goes out for it.
#[test]
fn a_record_moved_on_during_the_secrets_renewal_gets_no_secrets_fetch() {
    let mut sim = accepted_at_restart(testkit::secret_revision());
    sim.worker.report_facts();
    let lease_control = On::Post(Operation::LeaseControl);
    step_until_with(&mut sim, &["draw-entropy", "read-record o1"], |act| {
        if lease_control.matches(act) {
            Answer::Unavailable
        } else {
            Answer::Ok
        }
    });
    // The seeded lease expires at 30 020 ms.
    sim.advance_to(ms(30_020));
    sim.settle();
    let trail = after(&sim, "draw-entropy");
    assert_eq!(
        trail,
        lines(&[
            "read-record o1",
            "persist-record o1 r2 recovery_required",
            "read-record o1",
        ]),
        "{trail:#?}"
    );
    assert!(!trail.iter().any(|l| l == "post secrets o1"), "{trail:#?}");
    assert_eq!(
        sim.first_record().recovery_reason,
        Some(RecoveryReason::LeaseLostLocalExecutionStopped)
    );
}

/// A clean failure of a write before the barrier (`starting_acknowledged` not stored,
/// `Store(Unchanged)`) proves that no process can exist: the pass ends `StorageUnchanged` and
/// the Worker goes on (no halt); the next pass replays the starting ACK and launches.
#[test]
fn a_clean_write_failure_before_the_barrier_is_retried_not_halted() {
    let mut sim = Sim::scenario(World::one_offer(1));
    sim.run(2);
    sim.worker.report_facts();
    sim.on(On::Persist(State::StartingAcknowledged), Answer::Unchanged);
    sim.run(1);
    assert!(!matches!(sim.status, Status::Halted(_)), "{:?}", sim.status);
    assert_eq!(
        process_results(&mut sim),
        vec![ProcessResult::StorageUnchanged]
    );
    sim.run(2);
    assert!(!matches!(sim.status, Status::Halted(_)), "{:?}", sim.status);
    assert_eq!(sim.first_record().state, State::RunningAcknowledged);
    assert_eq!(spawn_plans(&sim).len(), 1);
}

/// A Worker in the middle of a start path renders (`Debug`, what a driver logs on a halt)
/// which offer it is for.
#[test]
fn a_start_path_in_flight_renders_its_offer() {
    let mut sim = Sim::scenario(World::one_offer(1));
    sim.run(2);
    sim.tick();
    step_until(&mut sim, &["post starting o1"]);
    let rendered = format!("{:?}", sim.worker);
    let offer_id = sim.first_record().offer.offer_id;
    assert!(
        rendered.contains(&format!("ProcessOp {{ offer_id: {offer_id:?}, .. }}")),
        "{rendered}"
    );
}

/// A Worker draining, its Session `draining` at the control plane, holding o1 `started` (the
/// running ACK got no answer before the drain) with o1's delivery of `kind`: the supervision
/// pass after the transition takes o1's start path again.
fn started_while_draining(kind: DeliveryKind) -> Sim {
    let mut record = testkit::record(1, State::Started);
    record.offer.delivery_kind = kind;
    let mut world = World::new(1, Vec::new());
    world.seed(1, record, true);
    let mut sim = Sim::scenario(world);
    sim.on(On::Post(Operation::Running), Answer::Unavailable);
    sim.run(2);
    assert_eq!(sim.first_record().state, State::Started);
    sim.worker.report_facts();
    sim.request_drain();
    sim.settle();
    sim.take_trail();
    sim.run(1);
    sim
}

/// Reference §4.2 step 2: a Session draining takes no new claim further: the start path of a
/// `new_claim` offer is fenced (`TargetFenced`), its running ACK not sent.
#[test]
fn a_draining_session_fences_the_start_path_of_a_new_claim() {
    let mut sim = started_while_draining(DeliveryKind::NewClaim);
    let trail = sim.commands();
    assert!(trail.iter().any(|l| l == "read-record o1"), "{trail:#?}");
    assert!(!trail.iter().any(|l| l == "post running o1"), "{trail:#?}");
    assert!(process_results(&mut sim).contains(&ProcessResult::TargetFenced));
}

/// … but the replay of an existing lease (`lease_recovery`) is not a new claim: its start path
/// goes on in the draining Session, and the running ACK is sent and persisted.
#[test]
fn a_draining_session_still_acknowledges_a_lease_recovery() {
    let mut sim = started_while_draining(DeliveryKind::LeaseRecovery);
    let trail = sim.commands();
    assert!(
        trail.windows(2).any(|w| w
            == lines(&[
                "post running o1",
                "persist-record o1 r4 running_acknowledged"
            ])),
        "{trail:#?}"
    );
    assert!(process_results(&mut sim).contains(&ProcessResult::Running));
}

/// A record of another Session of this Worker (an earlier registration's, found at restart) is
/// not this Session's to start, however usable this Session is: the start path is fenced
/// (`TargetFenced`), no starting ACK goes out.
#[test]
fn a_record_of_another_session_is_fenced_before_any_call() {
    let other = SessionId::new("018f0000-0000-7000-8000-000000000009").unwrap();
    let mut record = testkit::record(1, State::Accepted);
    record.offer.worker.session_id = other.clone();
    record.offer.lease.worker_session_id = other;
    let mut world = World::new(1, Vec::new());
    world.seed(1, record, false);
    let mut sim = Sim::scenario(world);
    sim.worker.report_facts();
    sim.run(2);
    let trail = sim.commands();
    assert!(trail.iter().any(|l| l == "read-record o1"), "{trail:#?}");
    assert!(!trail.iter().any(|l| l == "post starting o1"), "{trail:#?}");
    assert!(process_results(&mut sim).contains(&ProcessResult::TargetFenced));
}
