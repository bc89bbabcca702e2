//! Behaviours fixed after the model check, the fuzzers and the crash campaign found them; each
//! test pins one, by the command sequence the core issues against the simulated host.

use ql_worker_core::record::{RecoveryReason, State};
use ql_worker_core::testkit::sim::{On, Sim, Status};
use ql_worker_core::testkit::world::{Answer, World};
use ql_worker_core::wire::route::Operation;
use ql_worker_core::worker::{HaltReason, Phase};

fn processed(world: World, script: &[(On, Answer)]) -> Sim {
    let mut sim = Sim::scenario(world);
    sim.run(2);
    for (on, answer) in script {
        sim.on(*on, *answer);
    }
    sim.run(1);
    sim
}

/// A startup reconciliation page that cannot be read is listed again; it is never mistaken for
/// an empty last page (which would skip the restart rules and pull at once). Found by the fuzzer
/// (`pull-before-reconciled`).
#[test]
fn a_failed_reconciliation_page_is_listed_again_before_any_pull() {
    let mut sim = Sim::scenario(World::one_offer(1));
    sim.run(1); // register
    sim.on(On::Kind("list-inbox"), Answer::Unchanged);
    sim.run(1); // the reconciliation page fails
    assert_eq!(
        sim.worker.phase(),
        Phase::Reconciling,
        "{:#?}",
        sim.commands()
    );
    assert!(!sim.commands().iter().any(|c| c == "read-claim"));
    sim.run(2); // listed again, then active
    assert_eq!(sim.worker.phase(), Phase::Active, "{:#?}", sim.commands());
}

/// `already_terminal` on the running ACK: the exact process group is stopped before the
/// evidence is recorded (as lease control's `terminal` does). Found by the model check's review.
#[test]
fn already_terminal_on_the_running_ack_stops_the_process_first() {
    let sim = processed(
        World::one_offer(1),
        &[(On::Post(Operation::Running), Answer::AlreadyTerminal)],
    );
    let commands = sim.commands();
    let ack = commands
        .iter()
        .position(|c| c == "post running o1")
        .unwrap();
    assert_eq!(
        commands[ack + 1..ack + 3],
        [
            "stop o1".to_string(),
            "persist-record o1 r4 recovery_required".to_string()
        ],
        "{commands:#?}"
    );
    let record = sim
        .world
        .disk
        .record(sim.world.plane.runs.keys().next().unwrap())
        .unwrap();
    assert_eq!(
        record.recovery_reason,
        Some(RecoveryReason::ControlPlaneTerminal)
    );
}

/// After `Rejected`, the `start_failed` write must land: left in `launching`, the record would
/// be supervised as if a process existed and the proof of no spawn lost. A clean failure of the
/// write halts; the next start reconciles from disk.
#[test]
fn a_rejected_spawn_whose_start_failed_write_fails_halts() {
    let sim = processed(
        World::one_offer(1),
        &[
            (On::Kind("spawn"), Answer::Rejected),
            (On::Persist(State::StartFailed), Answer::Unchanged),
        ],
    );
    assert!(
        matches!(
            sim.status,
            Status::Halted(HaltReason::LaunchOutcomeUnrecorded)
        ),
        "{:?}",
        sim.status
    );
    assert!(sim.world.supervisor.processes.is_empty(), "nothing spawned");
}
