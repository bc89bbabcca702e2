//! Behaviours fixed after the model check, the fuzzers and the crash campaign found them; each
//! test pins one, by the command sequence the core issues against the simulated host.

use ql_worker_core::io::Action;
use ql_worker_core::record::{RecoveryReason, State};
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::route::Operation;
use ql_worker_core::worker::{HaltReason, Phase};
use ql_worker_sim::testkit;
use ql_worker_sim::testkit::act;
use ql_worker_sim::testkit::sim::{On, Sim, Status};
use ql_worker_sim::testkit::world::{Answer, OfferTemplate, World};

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

fn ticks_with(trail: &[String], command: &str) -> Vec<u64> {
    let mut tick = 0;
    let mut at = Vec::new();
    for line in trail {
        if let Some(ms) = line.strip_prefix("tick ") {
            tick = ms.parse().unwrap();
        } else if line == command {
            at.push(tick);
        }
    }
    at
}

/// Lease control is paced per Run (`lease_control_interval_ms`): renewing on every tick made
/// the window in which a lost renewal answer strands a Run (reliability finding 5) as wide as
/// it can be. With a 5 s interval and the edge cadence of 2 s, two calls for the same Run are
/// at least 5 s apart; with 0 (the reference's behaviour) every pass calls.
#[test]
fn lease_control_is_paced_per_run() {
    let run = |interval: u64| {
        let mut world = World::new(1, Vec::new());
        world.seed(1, testkit::record(1, State::RunningAcknowledged), true);
        let mut config = testkit::explore::model_config();
        config.lease_control_interval_ms = interval;
        let start = UnixMillis::new(1_000).unwrap();
        let mut sim = Sim::new(config, world, start).recording();
        sim.run(12);
        let trail = sim.take_trail();
        (
            ticks_with(&trail, "post lease-control o1"),
            ticks_with(&trail, "list-inbox").len(),
        )
    };
    let (paced, passes) = run(5_000);
    assert!(paced.len() >= 3, "{paced:?}");
    assert!(
        paced.windows(2).all(|w| w[1] - w[0] >= 5_000),
        "calls closer than the interval: {paced:?}"
    );
    assert!(paced.len() < passes, "{paced:?} in {passes} passes");
    let (every, passes) = run(0);
    assert_eq!(
        every.len() + 1,
        passes,
        "one call per supervision pass: {every:?}"
    );
}

/// Settled records do not slow supervision down: a page that held fewer live Runs than a
/// page's worth goes on to the next page in the same tick, so a live Run behind eight settled
/// records (pages of 4) is supervised on every tick, not every third. Found by the crash
/// campaign (reliability finding 7).
#[test]
fn a_live_run_behind_settled_records_is_supervised_every_tick() {
    let mut world = World::new(1, Vec::new());
    for n in 1..=8 {
        world.seed(n, testkit::record(n, State::CompletionAcknowledged), false);
    }
    world.seed(9, testkit::record(9, State::RunningAcknowledged), true);
    let mut sim = Sim::scenario(world);
    sim.run(6);
    sim.take_trail();
    sim.run(3);
    let trail = sim.take_trail();
    let ticks = trail.iter().filter(|l| l.starts_with("tick ")).count();
    let calls = ticks_with(&trail, "post lease-control o9");
    assert_eq!(ticks, 3);
    assert_eq!(calls.len(), ticks, "{trail:#?}");
}

/// The start path renews its lease between its calls (issue 16, item 7): a Run whose calls
/// before running take most of the request timeout each would otherwise spend its lease before
/// its first supervision renewal. A record found at restart carries a lease this process did
/// not obtain: it is renewed before the starting ACK, and the ACK names the renewed version.
/// With an interval of 0 (renew at every supervision tick) the start path renews nothing.
#[test]
fn the_start_path_renews_a_lease_it_did_not_obtain_before_its_first_call() {
    let run = |interval: u64| {
        let mut world = World::new(1, Vec::new());
        world.seed(1, testkit::record(1, State::Accepted), false);
        let mut config = testkit::explore::model_config();
        config.lease_control_interval_ms = interval;
        let start = UnixMillis::new(1_000).unwrap();
        let mut sim = Sim::new(config, world, start).recording();
        sim.run(6);
        let trail = sim.take_trail();
        let at = |command: &str| trail.iter().position(|line| line == command);
        (
            at("post lease-control o1"),
            at("post starting o1"),
            trail
                .iter()
                .filter(|l| *l == "post lease-control o1")
                .count(),
            trail,
        )
    };
    let (renewal, starting, _, trail) = run(5_000);
    let (Some(renewal), Some(starting)) = (renewal, starting) else {
        panic!("no renewal or no starting ACK: {trail:#?}");
    };
    assert!(renewal < starting, "{trail:#?}");
    // The activation answers name the plane's lease version, which the Worker checks against
    // its record: the path went on with the renewed one.
    assert!(trail.iter().any(|l| l == "post running o1"), "{trail:#?}");
    let (renewal, starting, _, trail) = run(0);
    assert!(starting.is_some(), "{trail:#?}");
    assert!(
        renewal.is_none_or(|r| Some(r) > starting),
        "interval 0 renewed in the start path: {trail:#?}"
    );
}

/// A `launching` record found at a restart whose reconciliation read failed (a transient read
/// error) is still sent to `recovery_required(launch_outcome_unknown)` at a later pass: it is
/// never supervised as if a process were known to exist. Before, only the reconciliation
/// processed `launching` records, so after that one failed read its lease was renewed at every
/// pass for ever and the restart rule never applied (found by the walks over the model checks'
/// world, `docs/simulation.md`).
#[test]
fn a_launching_record_whose_reconciliation_read_failed_is_recovered_at_a_later_pass() {
    let mut world = World::new(1, Vec::new());
    world.seed(1, testkit::record(1, State::Launching), false);
    let mut sim = Sim::scenario(world);
    sim.on(On::Kind("read-record"), Answer::Unchanged);
    sim.run(4);
    let record = sim.first_record();
    assert_eq!(
        record.state,
        State::RecoveryRequired,
        "{:#?}",
        sim.commands()
    );
    assert_eq!(
        record.recovery_reason,
        Some(RecoveryReason::LaunchOutcomeUnknown)
    );
    sim.assert_no_violations();
}

/// A Secrets answer that comes after the offer's lease ran out does not lead to a spawn: the
/// target check (Session and lease) runs again right before the spawn barrier, so the record
/// stays `starting_acknowledged` (dormant) and no process starts. Before, the Worker launched on
/// a lease the control plane may already have handed out again (found by the walks over the
/// model checks' world: `at-most-once-run`).
#[test]
fn a_secrets_answer_after_the_lease_ran_out_launches_nothing() {
    let world = World::new(
        1,
        vec![OfferTemplate::with_revision(1, testkit::secret_revision())],
    );
    let mut sim = Sim::scenario(world);
    sim.answer_until(
        |a| matches!(a, Action::Post(call) if act::operation(call) == Operation::Secrets),
    );
    let expires = sim.first_record().offer.lease.expires_at_ms;
    sim.advance_to(expires.saturating_add(1));
    sim.answer(Answer::Ok);
    sim.settle();
    let trail = sim.commands();
    assert!(!trail.iter().any(|l| l.starts_with("spawn")), "{trail:#?}");
    assert!(!trail.iter().any(|l| l.contains("launching")), "{trail:#?}");
    assert_eq!(sim.first_record().state, State::StartingAcknowledged);
    sim.assert_no_violations();
}
