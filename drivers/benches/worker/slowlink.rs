//! The slow-link row (issue 16, item 8): the end-to-end slow-link scenario
//! (`drivers/tests/e2e_common/slow_link.rs`, shared with the test `e2e_slow_link`) run with this
//! run's copy of the binary, reported instead of asserted. The real Worker (node profile
//! defaults, Session lease 30 s) reaches the loopback plane through a proxy that carries the
//! Worker → plane direction at 64 KiB/s in total; four Runs print 4 MiB each while a fifth
//! sleeps. The row: the largest gap between the Session's successful heartbeats as the plane saw
//! them against the bound heartbeat interval + request timeout; in the note the fewest lease
//! renewals per Run lease (the sleeping Run's against the required 3), the Runs lost, the
//! Session fences, and the time from the Worker's spawn to the last printing Run's completion
//! against the time the bytes the uplink carried until then need at its rate (both measured in
//! the same run). Knobs: `QL_SLOWLINK_RATE`, `QL_SLOWLINK_RUNS`, `QL_SLOWLINK_LOG_BYTES`,
//! `QL_SLOWLINK_SLEEP_S` (as the test's).

use std::path::Path;

use crate::e2e_common::slow_link::{self, Params};
use crate::table::Table;

fn secs(ms: u64) -> String {
    format!("{:.1} s", ms as f64 / 1e3)
}

pub(crate) fn measure(exe: &Path, table: &mut Table) {
    let params = Params::from_env();
    let outcome = slow_link::run(params, exe);
    eprintln!("{}", outcome.summary());
    let failures = outcome.failures();
    for failure in &failures {
        eprintln!("  bound broken: {failure}");
    }
    let bound = outcome.heartbeat_bound_ms();
    let sleeper = outcome.sleeper();
    let logs = params.printers * params.log_bytes;
    let wall = match (outcome.printed_after_ms(), outcome.carried_when_printed) {
        (Some(printed), Some(carried)) => {
            let ideal_ms = carried.saturating_mul(1000) / params.rate;
            format!(
                "spawn → last printing Run completed {} against {} of uplink for the {carried} B \
                 carried until then (ratio {:.2})",
                secs(printed),
                secs(ideal_ms),
                printed as f64 / ideal_ms.max(1) as f64
            )
        }
        _ => String::from("spawn → last printing Run completed: n/a (one did not complete)"),
    };
    let wall = format!(
        "{wall}; uplink carried {} B in all for {logs} B of logs",
        outcome.bytes
    );
    table.push(
        format!(
            "slow link: max Session heartbeat gap as the plane saw it (node profile defaults, \
             Session lease 30 s; {} Runs × {} B + 1 sleep Run; Worker → plane {} B/s)",
            params.printers, params.log_bytes, params.rate
        ),
        secs(outcome.heartbeat_gap),
        format!(
            "{} (heartbeat {} + request timeout {})",
            secs(bound),
            secs(outcome.heartbeat_interval_ms),
            secs(outcome.timeout_ms)
        ),
        Some(outcome.heartbeat_gap as f64 / bound as f64),
        format!(
            "min renewals per Run per lease {} (sleeping Run: {:.1} per {} of its {}, required \
             3); Runs lost {} of {}; Session fences {}; {wall}; bounds broken {}",
            outcome
                .min_per_lease()
                .map_or_else(|| String::from("n/a"), |r| format!("{r:.1}")),
            sleeper.trace.per_lease(outcome.run_lease_ms),
            secs(outcome.run_lease_ms),
            secs(sleeper.trace.duration()),
            outcome.lost(),
            outcome.runs.len(),
            outcome.session_fences,
            failures.len()
        ),
    );
}
