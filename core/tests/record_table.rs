//! The 9×9 edge table, checked against a literal copy of the reference table
//! (`reference/qinglong-wire-and-behaviour.md` §3.6). Adding an edge means editing both the code
//! and this copy (CONVENTIONS C7).

use ql_worker_core::record::{State, edge_allowed};

/// `from` → allowed `to` states, copied from the reference table as wire names.
const REFERENCE_TABLE: [(&str, &[&str]); 9] = [
    (
        "accepted",
        &["accepted", "starting_acknowledged", "recovery_required"],
    ),
    (
        "starting_acknowledged",
        &[
            "starting_acknowledged",
            "launching",
            "start_failed",
            "recovery_required",
        ],
    ),
    (
        "launching",
        &[
            "launching",
            "started",
            "start_failed",
            "completion_acknowledged",
            "recovery_required",
        ],
    ),
    (
        "started",
        &[
            "started",
            "running_acknowledged",
            "completion_acknowledged",
            "recovery_required",
        ],
    ),
    (
        "running_acknowledged",
        &[
            "running_acknowledged",
            "completion_acknowledged",
            "recovery_required",
        ],
    ),
    (
        "start_failed",
        &[
            "start_failed",
            "start_failure_acknowledged",
            "recovery_required",
        ],
    ),
    (
        "start_failure_acknowledged",
        &["start_failure_acknowledged"],
    ),
    ("completion_acknowledged", &["completion_acknowledged"]),
    (
        "recovery_required",
        &["recovery_required", "completion_acknowledged"],
    ),
];

#[test]
fn all_81_state_pairs_match_the_reference_table() {
    let mut allowed = 0;
    for from in State::ALL {
        let row = REFERENCE_TABLE
            .iter()
            .find(|(name, _)| *name == from.as_str())
            .unwrap_or_else(|| panic!("{from} missing from the reference table"));
        for to in State::ALL {
            let expected = row.1.contains(&to.as_str());
            assert_eq!(edge_allowed(from, to), expected, "{from} -> {to}");
            allowed += usize::from(expected);
        }
    }
    assert_eq!(allowed, 26, "the reference table has 26 allowed edges");
}

#[test]
fn the_reference_table_names_exactly_the_nine_states_in_order() {
    let names: Vec<&str> = REFERENCE_TABLE.iter().map(|(name, _)| *name).collect();
    let ours: Vec<&str> = State::ALL.iter().map(|s| s.as_str()).collect();
    assert_eq!(names, ours);
}

#[test]
fn every_state_has_its_self_edge_and_terminal_states_only_that() {
    for state in State::ALL {
        assert!(edge_allowed(state, state), "{state}");
        if state.is_terminal() {
            let exits = State::ALL
                .iter()
                .filter(|to| **to != state && edge_allowed(state, **to));
            assert_eq!(exits.count(), 0, "{state}");
        }
    }
}
