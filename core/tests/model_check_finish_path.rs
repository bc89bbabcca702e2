//! Issue 5, item 5: the exhaustive, bounded model check of the finish path and supervision (the
//! start-path harness extended). See `docs/model-check.md`.
//!
//! Run: `cargo test -p ql-worker-core --release --test model_check_finish_path -- --nocapture`.

use ql_worker_core::record::State;
use ql_worker_sim::testkit::explore::{
    CatchPanics, Model, Report, concurrency, explore, finish_path,
};
use ql_worker_sim::testkit::world::Mutation;

#[test]
fn model_check_finish_path() {
    let mut model = finish_path();
    if cfg!(debug_assertions) {
        // An unoptimized build explores a smaller slice (one fault per path); the bounds of
        // record are those of `cargo test --release`.
        model.bounds.faults = 1;
    }
    let report = explore(&model, &CatchPanics);
    report_line(&report.line(&model));
    report.print_found();
    assert_eq!(report.violations, 0, "the finish path broke an invariant");
    assert!(!report.truncated, "the state cap cut the exploration short");
    assert!(
        report.states >= 10_000,
        "only {} distinct states",
        report.states
    );
    for state in [
        "launching",
        "started",
        "running_acknowledged",
        "completion_acknowledged",
        "recovery_required(launch_outcome_unknown)",
        "recovery_required(control_plane_terminal)",
        "recovery_required(lease_lost_local_execution_stopped)",
        "recovery_required(lease_lost_local_execution_unverified)",
    ] {
        assert!(
            report.coverage.contains_key(state),
            "the model never reached {state}: {:?}",
            report.coverage
        );
    }
}

/// Issue 16, item 7: the lifecycle with two commands outstanding at once, their outcomes in
/// either order (`explore::concurrency`).
#[test]
fn model_check_concurrency() {
    let mut model = concurrency();
    if cfg!(debug_assertions) {
        model.bounds.crashes = 0;
    }
    let report = explore(&model, &CatchPanics);
    report_line(&report.line(&model));
    report.print_found();
    assert_eq!(
        report.violations, 0,
        "concurrent outcomes broke an invariant"
    );
    assert!(!report.truncated, "the state cap cut the exploration short");
    assert!(
        report.out_of_order >= 1_000,
        "only {} answers out of issue order: the model explores no concurrency",
        report.out_of_order
    );
    for state in [
        "running_acknowledged",
        "completion_acknowledged",
        "recovery_required(lease_lost_local_execution_stopped)",
    ] {
        assert!(
            report.coverage.contains_key(state),
            "the model never reached {state}: {:?}",
            report.coverage
        );
    }
}

fn mutated(mutation: Mutation) -> Report {
    let mut model: Model = finish_path();
    model.bounds.faults = 1;
    model.bounds.drains = 0;
    for root in &mut model.roots {
        root.world.mutation = Some(mutation);
    }
    explore(&model, &CatchPanics)
}

/// The checker can fail: a host that acknowledges `completion_acknowledged` without storing it
/// lets the Worker remove the receipt of a record that is not durably acknowledged.
#[test]
fn model_check_finish_path_catches_a_host_that_drops_the_acknowledgement() {
    let report = mutated(Mutation::DropWrites(State::CompletionAcknowledged));
    report.print_found();
    let found = report
        .found
        .iter()
        .find(|f| f.invariant == "receipt-removed-after-acknowledged")
        .expect("receipt-removed-after-acknowledged reported");
    assert!(
        found
            .trace
            .last()
            .is_some_and(|s| s.starts_with("remove-receipt"))
    );
}

/// The checker can fail: a host that drops lease-only writes lets the Worker stop a process on
/// `stop_requested` while the new lease is not durable.
#[test]
fn model_check_finish_path_catches_a_host_that_drops_the_new_lease() {
    let report = mutated(Mutation::DropLeaseWrites);
    report.print_found();
    assert!(
        report
            .found
            .iter()
            .any(|f| f.invariant == "stop-after-durable-lease")
    );
}

/// Prints a result line even while libtest captures test output, so `.ci/run` shows it: a
/// direct write to the process's stdout, which the capture does not intercept.
fn report_line(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout().lock(), "{line}");
}
