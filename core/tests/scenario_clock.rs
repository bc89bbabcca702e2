//! Issue 16, item 5: every interval runs on the monotonic clock, so a step of the host's wall
//! clock (an operator's `date -s`, NTP correcting a host that booted in 1970) neither stalls
//! the heartbeat, the Pull or the lease control nor declares a live lease lost. The control
//! plane keeps the true time; the simulated host's wall clock is stepped
//! ([`Sim::step_wall_clock`]) while its monotonic clock runs on.

use ql_worker_core::record::State;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::worker::Phase;
use ql_worker_sim::clock::HOUR_MS;
use ql_worker_sim::testkit::sim::Sim;
use ql_worker_sim::testkit::world::{Event, ReceiptKind, World};

fn ms(v: u64) -> UnixMillis {
    UnixMillis::new(v).unwrap()
}

fn count(commands: &[String], prefix: &str) -> usize {
    commands.iter().filter(|c| c.starts_with(prefix)).count()
}

/// Runs ticks at the Worker's wake-ups for `seconds` of true time; the commands meanwhile.
fn run_for(sim: &mut Sim, seconds: u64) -> Vec<String> {
    sim.take_trail();
    let until = sim.now.saturating_add(seconds * 1_000);
    let mut rounds = 0;
    while sim.now < until {
        sim.run(1);
        rounds += 1;
        assert!(rounds < 10_000, "time does not move: {:#?}", sim.commands());
    }
    sim.commands()
}

/// What a healthy Worker does in `seconds` on the model configuration (edge profile:
/// heartbeat every 10 s, lease control paced at 5 s with a 30 s lease, a Pull per 2 s tick
/// while a slot is free): at least one heartbeat per interval, and the Run's lease renewed
/// before a third of it has passed, every time.
fn assert_cadence(commands: &[String], seconds: u64, pulls: bool) {
    let heartbeats = count(commands, "post heartbeat");
    let renewals = count(commands, "post lease-control o1");
    assert!(
        heartbeats as u64 >= seconds / 10 - 1,
        "{heartbeats} heartbeats in {seconds} s: {commands:#?}"
    );
    assert!(
        renewals as u64 >= seconds / 15 - 1,
        "{renewals} renewals in {seconds} s: {commands:#?}"
    );
    if pulls {
        assert!(
            count(commands, "post offers") > 0,
            "no Pull in {seconds} s: {commands:#?}"
        );
    }
    assert!(
        !commands
            .iter()
            .any(|c| c.contains("recovery_required") || c == "stop o1"),
        "a live lease taken for lost: {commands:#?}"
    );
}

/// The Run completes through the normal path once its process exits.
fn completes(sim: &mut Sim) {
    sim.event(Event::Exit {
        index: 0,
        code: 0,
        receipt: ReceiptKind::Genuine,
    });
    run_for(sim, 10);
    assert_eq!(sim.first_record().state, State::CompletionAcknowledged);
    sim.assert_no_violations();
}

/// An hour ahead: without the monotonic clock the lease, renewed a moment ago, reads as
/// expired an hour ago (the Run would be stopped and sent to recovery).
#[test]
fn a_wall_clock_stepped_an_hour_ahead_loses_no_lease_and_keeps_every_cadence() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.run(1); // the lease is renewed here: timed from its call
    sim.step_wall_clock(HOUR_MS);
    let commands = run_for(&mut sim, 90);
    assert_cadence(&commands, 90, false);
    assert_eq!(sim.first_record().state, State::RunningAcknowledged);
    completes(&mut sim);
}

/// An hour back: without the monotonic clock the Worker's time stands still until the wall
/// clock has caught up (the core never lets time go back): no tick, no heartbeat, no renewal
/// for an hour, and the Session and the Run's lease lapse at the control plane.
#[test]
fn a_wall_clock_stepped_an_hour_back_stalls_no_heartbeat_renewal_or_pull() {
    let mut sim = Sim::scenario(World::one_offer(1));
    sim.run(6); // registered, reconciled, the offer pulled and started
    assert_eq!(sim.first_record().state, State::RunningAcknowledged);
    sim.step_wall_clock(-HOUR_MS);
    let commands = run_for(&mut sim, 90);
    assert_cadence(&commands, 90, false);
    completes(&mut sim);
    // The slot is free again: Pulls go on, an hour before the wall clock catches up.
    let commands = run_for(&mut sim, 10);
    assert!(count(&commands, "post offers") >= 2, "{commands:#?}");
}

/// An edge host that boots without a clock reads 1970 until NTP sets it, while the control
/// plane's leases say 2026: the Worker registers, takes and runs its Run, keeps its lease
/// across the jump of 56 years, and completes it.
#[test]
fn a_host_booted_in_1970_runs_its_run_across_the_ntp_jump() {
    let plane_now = ms(1_796_000_000_000);
    let booted = 5_000 - i64::try_from(plane_now.get()).unwrap();
    let mut sim = Sim::new(
        ql_worker_sim::testkit::explore::model_config(),
        World::one_offer(1),
        plane_now,
    )
    .recording();
    sim.wall_skew = booted;
    sim.worker = ql_worker_core::worker::Worker::new(sim.config.clone(), sim.clock());
    sim.run(6);
    assert_eq!(sim.worker.phase(), Phase::Active);
    let record = sim.first_record();
    assert_eq!(
        record.state,
        State::RunningAcknowledged,
        "{:#?}",
        sim.commands()
    );
    let commands = run_for(&mut sim, 40);
    assert_cadence(&commands, 40, false);
    sim.step_wall_clock(-booted); // NTP
    let commands = run_for(&mut sim, 40);
    assert_cadence(&commands, 40, false);
    completes(&mut sim);
}
