//! Issue 4, item 5: the exhaustive, bounded model check of the start path (Pull coordinator and
//! Processor together). See `docs/model-check.md` for the world, the choices, the invariants and
//! the bounds.
//!
//! Run: `cargo test -p ql-worker-core --release --test model_check_start_path -- --nocapture`.

use ql_worker_core::record::State;
use ql_worker_sim::testkit::explore::{
    CatchPanics, Model, Report, explore, redelivery, start_path,
};
use ql_worker_sim::testkit::world::Mutation;

#[test]
fn model_check_start_path() {
    let mut model = start_path();
    if cfg!(debug_assertions) {
        // An unoptimized build explores a smaller slice (one fault per path); the bounds of
        // record are those of `cargo test --release`.
        model.bounds.faults = 1;
    }
    let report = explore(&model, &CatchPanics);
    report_line(&report.line(&model));
    report.print_found();
    assert_eq!(report.violations, 0, "the start path broke an invariant");
    assert!(!report.truncated, "the state cap cut the exploration short");
    assert!(
        report.states >= 10_000,
        "only {} distinct states",
        report.states
    );
    // The model must reach every start-path outcome, or it proves less than it claims.
    for state in [
        "accepted",
        "starting_acknowledged",
        "launching",
        "started",
        "running_acknowledged",
        "start_failed",
        "start_failure_acknowledged",
        "recovery_required(launch_outcome_unknown)",
        "recovery_required(control_plane_already_running)",
        "recovery_required(control_plane_terminal)",
    ] {
        assert!(
            report.coverage.contains_key(state),
            "the model never reached {state}: {:?}",
            report.coverage
        );
    }
}

/// Issue 15: the start path against a control plane that re-delivers an expired Run under a
/// new offer id (same Attempt, or a new one after declaring the first lost): at most one spawn
/// per offer, per Attempt and per Run (`at-most-once-attempt`, `at-most-once-run`).
#[test]
fn model_check_redelivery() {
    let mut model = redelivery();
    if cfg!(debug_assertions) {
        // As for the start path: an unoptimized build explores the one-fault slice.
        model.bounds.faults = 1;
    }
    let report = explore(&model, &CatchPanics);
    report_line(&report.line(&model));
    report.print_found();
    assert_eq!(report.violations, 0, "re-delivery broke an invariant");
    assert!(!report.truncated, "the state cap cut the exploration short");
    for key in [
        "plane:redelivered-same-attempt",
        "plane:redelivered-new-attempt",
        "running_acknowledged",
    ] {
        assert!(
            report.coverage.contains_key(key),
            "the model never reached {key}: {:?}",
            report.coverage
        );
    }
}

/// The checker can fail: on a host that acknowledges a write it dropped, the Worker's next
/// command breaks an invariant and the explorer reports it with a trace.
fn mutated(mutation: Mutation) -> Report {
    let mut model: Model = start_path();
    model.bounds.faults = 1;
    model.bounds.entropy = 0;
    for root in &mut model.roots {
        root.world.mutation = Some(mutation);
    }
    model.roots.truncate(1);
    explore(&model, &CatchPanics)
}

#[test]
fn model_check_start_path_catches_a_host_that_drops_the_launching_barrier() {
    let report = mutated(Mutation::DropWrites(State::Launching));
    report.print_found();
    assert!(report.violations > 0);
    let found = report
        .found
        .iter()
        .find(|f| f.invariant == "spawn-barrier")
        .expect("spawn-barrier reported");
    assert!(found.trace.last().is_some_and(|s| s.starts_with("spawn ")));
}

#[test]
fn model_check_start_path_catches_a_host_that_drops_the_started_record() {
    let report = mutated(Mutation::DropWrites(State::Started));
    report.print_found();
    assert!(
        report
            .found
            .iter()
            .any(|f| f.invariant == "running-ack-after-started")
    );
}

/// Prints a result line even while libtest captures test output, so `.ci/run` shows it: a
/// direct write to the process's stdout, which the capture does not intercept.
fn report_line(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}
