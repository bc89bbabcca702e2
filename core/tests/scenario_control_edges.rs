//! The edges of the lease-control supervisor (`core/src/control.rs`) that the other scenarios
//! do not reach, found by mutation testing (`docs/mutation.md`): the pacing boundary, a renewal
//! dated before the persisted lease, the renewal inside the start path (a record without a
//! handle, a terminal answer left to the start path), the stop outcome of a Run without a
//! handle, and a record that moves between the listing and the re-read. Driven through the
//! whole Worker against the simulated host; the exact commands are asserted.

use ql_worker_core::facts::Fact;
use ql_worker_core::io::StopOutcome;
use ql_worker_core::record::{RecoveryReason, State};
use ql_worker_core::supervision::SupervisionResult;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::route::Operation;
use ql_worker_sim::testkit::sim::{On, Sim};
use ql_worker_sim::testkit::world::{Answer, World};
use ql_worker_sim::testkit::{self};

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

/// Answers the Worker's commands until the trail ends with `suffix` (that last command still
/// outstanding): lease control `terminal`, everything else healthily.
fn answer_until(sim: &mut Sim, suffix: &[&str]) {
    for _ in 0..100 {
        let trail = sim.commands();
        if trail.len() >= suffix.len() && trail[trail.len() - suffix.len()..] == lines(suffix)[..] {
            return;
        }
        let terminal = sim
            .act()
            .is_some_and(|act| On::Post(Operation::LeaseControl).matches(act));
        sim.answer(if terminal {
            Answer::Terminal
        } else {
            Answer::Ok
        });
    }
    panic!("never reached {suffix:?}: {:#?}", sim.commands());
}

/// Pacing skips the call only while *more* than three intervals of lease remain: with a 9 s
/// interval and the lease renewed at 1 000 ms for 30 s, the pass at 3 999 ms (27 001 ms left)
/// is paced, the pass at 4 000 ms (exactly 27 000 ms left) renews.
#[test]
fn pacing_renews_once_no_more_than_three_intervals_of_lease_remain() {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, State::RunningAcknowledged), true);
    let mut config = testkit::explore::model_config();
    config.lease_control_interval_ms = 9_000;
    let mut sim = Sim::new(config, world, ms(1_000)).recording();
    sim.run(3);
    assert_eq!(
        sim.take_trail().last().map(String::as_str),
        Some("persist-record o1 r5 running_acknowledged")
    );
    let pass_at = |at: u64| {
        let mut sim = sim.fork().recording();
        sim.advance_to(ms(at));
        sim.tick();
        sim.settle();
        sim.commands()
    };
    assert_eq!(
        pass_at(3_999),
        lines(&[
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "read-record o1",
        ])
    );
    assert_eq!(
        pass_at(4_000),
        lines(&[
            "list-inbox",
            "read-record o1",
            "read-receipt attempt-1",
            "read-record o1",
            "inspect-supervision o1",
            "post lease-control o1",
            "persist-record o1 r6 running_acknowledged",
        ])
    );
}

/// A renewal must not be dated before the persisted lease's last update, even when it is after
/// the persisted renewal: the answer is refused and nothing is written.
#[test]
fn a_renewal_dated_before_the_persisted_lease_update_is_not_persisted() {
    let mut world = World::new(1, Vec::new());
    let mut record = testkit::record(1, State::RunningAcknowledged);
    // Renewed at 20 ms, updated at 1 500 ms; the control plane renews at 1 000 ms.
    record.offer.lease.updated_at_ms = ms(1_500);
    world.seed(1, record, true);
    let mut sim = Sim::scenario(world);
    sim.worker.report_facts();
    sim.run(3);
    assert_eq!(after(&sim, "post lease-control o1"), Vec::<String>::new());
    assert_eq!(sim.first_record().offer.lease.version.get(), 0);
    let invalid = std::iter::from_fn(|| sim.worker.poll_fact()).any(|fact| {
        matches!(
            fact,
            Fact::Supervise {
                result: SupervisionResult::LeaseResponseInvalid(_),
                ..
            }
        )
    });
    assert!(invalid);
}

/// The start path of a record found at restart renews its lease before the starting ACK
/// (interval 5 s); the control plane answers as `answer` says.
fn start_path_renewal(answer: Answer) -> Sim {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, State::Accepted), false);
    let mut config = testkit::explore::model_config();
    config.lease_control_interval_ms = 5_000;
    let mut sim = Sim::new(config, world, ms(1_000)).recording();
    sim.on(On::Post(Operation::LeaseControl), answer);
    sim.run(3);
    sim
}

/// `stop_requested` for a renewal in the start path (an `accepted` record: no handle, no
/// process): the renewed lease is persisted and nothing is stopped; no published handle is
/// looked for (only a `launching` or `launch_outcome_unknown` record may have a process without
/// a handle). The start path goes on with the renewed lease.
#[test]
fn a_stop_request_before_the_spawn_stops_nothing_and_reads_no_published_handle() {
    let sim = start_path_renewal(Answer::StopRequested);
    assert_eq!(
        after(&sim, "post lease-control o1")[..3],
        lines(&[
            "persist-record o1 r1 accepted",
            "read-record o1",
            "post starting o1",
        ])[..]
    );
    let trail = sim.commands();
    assert!(
        !trail
            .iter()
            .any(|l| l.starts_with("read-published-handle") || l.starts_with("stop ")),
        "{trail:#?}"
    );
}

/// `terminal` for a renewal in the start path: the renewal leaves the Run to the start path
/// (which reads the record again and learns the outcome from its own call), it neither stops
/// nor records anything itself.
#[test]
fn a_terminal_answer_to_a_start_path_renewal_is_left_to_the_start_path() {
    let sim = start_path_renewal(Answer::Terminal);
    assert_eq!(
        after(&sim, "post lease-control o1")[..2],
        lines(&["read-record o1", "post starting o1"])[..]
    );
}

/// The handle-less Run (`launch_outcome_unknown`, nothing published) asked to stop: the stop
/// is reported unknown (a process may exist), not as already exited.
#[test]
fn a_stop_without_any_handle_for_a_run_that_may_have_a_process_is_unknown() {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, State::Launching), true);
    let mut sim = Sim::scenario(world);
    sim.run(2);
    let record = sim.first_record();
    assert_eq!(
        record.recovery_reason,
        Some(RecoveryReason::LaunchOutcomeUnknown)
    );
    assert_eq!(record.executor_handle, None);
    sim.take_trail();
    sim.worker.report_facts();
    sim.on(On::Post(Operation::LeaseControl), Answer::StopRequested);
    sim.run(1);
    assert_eq!(
        after(&sim, "post lease-control o1"),
        lines(&[
            "persist-record o1 r4 recovery_required",
            "read-published-handle attempt-1",
        ])
    );
    let results: Vec<SupervisionResult> = std::iter::from_fn(|| sim.worker.poll_fact())
        .filter_map(|fact| match fact {
            Fact::Supervise { result, .. } => Some(result),
            _ => None,
        })
        .collect();
    assert_eq!(
        results,
        vec![SupervisionResult::StopRequested(StopOutcome::Unknown)]
    );
}

/// Lease control answers `terminal` for a record that left the completion states between the
/// listing and the re-read (here: `recovery_required(control_plane_terminal)`, written by
/// another pass): there is no completion to replay, the process is stopped at once and the
/// evidence already on the record is kept.
#[test]
fn a_terminal_answer_for_a_record_past_completion_stops_without_a_replay() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.on(On::Post(Operation::LeaseControl), Answer::Terminal);
    sim.advance_to(ms(3_000));
    sim.tick();
    answer_until(&mut sim, &["list-inbox", "read-record o1"]);
    let mut moved = sim.first_record();
    moved.revision = moved.revision.next().unwrap();
    moved.state = State::RecoveryRequired;
    moved.recovery_reason = Some(RecoveryReason::ControlPlaneTerminal);
    sim.world.disk.put(moved);
    sim.settle();
    assert_eq!(after(&sim, "post lease-control o1"), lines(&["stop o1"]));
    assert_eq!(
        sim.first_record().recovery_reason,
        Some(RecoveryReason::ControlPlaneTerminal)
    );
}

/// Lease control answers `terminal`, the completion replay finds no receipt, and the record
/// read again before the stop is settled by then (`completion_acknowledged`, written by
/// another pass): nothing is stopped.
#[test]
fn a_record_settled_before_the_stop_after_a_terminal_answer_is_not_stopped() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.advance_to(ms(3_000));
    sim.tick();
    answer_until(
        &mut sim,
        &[
            "post lease-control o1",
            "read-record o1",
            "read-receipt attempt-1",
            "read-record o1",
        ],
    );
    let mut settled = sim.first_record();
    settled.revision = settled.revision.next().unwrap();
    settled.state = State::CompletionAcknowledged;
    settled.completion_acknowledged_at_ms = Some(settled.updated_at_ms);
    sim.world.disk.put(settled);
    sim.settle();
    assert_eq!(
        after(&sim, "post lease-control o1"),
        lines(&["read-record o1", "read-receipt attempt-1", "read-record o1"])
    );
}

/// The lease of an `accepted` record runs out while the start path renews it (between the
/// renewal's listing and its re-read): no process can exist before the spawn, so the stop is
/// conclusive and the record says `lease_lost_local_execution_stopped`, not `…_unverified`.
#[test]
fn a_lease_that_runs_out_before_the_spawn_is_recorded_as_conclusively_stopped() {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, State::Accepted), false);
    let mut config = testkit::explore::model_config();
    config.lease_control_interval_ms = 5_000;
    let mut sim = Sim::new(config, world, ms(1_000)).recording();
    sim.run(1);
    sim.tick();
    answer_until(
        &mut sim,
        &["list-inbox", "read-record o1", "read-record o1"],
    );
    // The seeded lease expires at 30 020 ms.
    sim.advance_to(ms(30_020));
    sim.settle();
    assert_eq!(
        after(&sim, "list-inbox")[..3],
        lines(&[
            "read-record o1",
            "read-record o1",
            "persist-record o1 r1 recovery_required",
        ])[..]
    );
    let record = sim.first_record();
    assert_eq!(record.state, State::RecoveryRequired);
    assert_eq!(
        record.recovery_reason,
        Some(RecoveryReason::LeaseLostLocalExecutionStopped)
    );
    // The recording write granted no lease: the Worker keeps no local deadline for it (one
    // computed from that write would call the lost lease live for another 30 s).
    assert!(!sim.worker.times_lease(&record.offer.offer_id));
}

/// A Worker in the middle of a supervision pass renders (`Debug`, what a driver logs on a
/// halt) which offer the pass is for.
#[test]
fn a_supervision_pass_in_flight_renders_its_offer() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.advance_to(ms(3_000));
    sim.tick();
    answer_until(&mut sim, &["list-inbox", "read-record o1"]);
    let rendered = format!("{:?}", sim.worker);
    assert!(
        rendered.contains(r#"SupervisionOp { offer_id: OfferId("offer-000001"), .. }"#),
        "{rendered}"
    );
}
