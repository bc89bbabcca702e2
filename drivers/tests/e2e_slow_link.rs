//! Issue 16, item 7, third bullet: the real binary on a slow uplink. The Worker (node profile,
//! defaults: Session lease 30 s, heartbeat every 10 s, lease control every 5 s at most, request
//! timeout 15 s) reaches the loopback plane through a proxy that carries the Worker → plane
//! direction at 64 KiB/s in total (one 512 kbit/s uplink shared by every connection); the plane
//! → Worker direction is not throttled. Four Runs each print 4 MiB (about 64 s of uplink each,
//! 256 s together) while a fifth one sleeps across the uploads. Every Run must succeed exactly
//! once; the sleeping Run's lease must be renewed throughout (no gap between its renewals, as
//! the plane saw them, above lease / 3 + the request timeout, and at least one renewal per
//! lease / 3 of its life); no gap between the Session's heartbeats above the heartbeat interval
//! + the request timeout; no Session fence; the Worker drains with exit 0.
//!
//! The defect it catches: a Worker whose one loop sits in a log upload for a minute renews
//! nothing meanwhile, so the sleeping Run's lease and the Session lease both lapse.
//!
//! The scenario and its reading of the plane's records live in `e2e_common::slow_link`, shared
//! with the `slowlink` row of the whole-Worker benchmark; its knobs: `QL_SLOWLINK_RATE`
//! (Worker → plane bytes per second, default 65536), `QL_SLOWLINK_RUNS` (printing Runs, default
//! 4), `QL_SLOWLINK_LOG_BYTES` (bytes each prints, default 4 MiB), `QL_SLOWLINK_SLEEP_S` (the
//! sleeping Run's seconds; default: the time the uploads need on the link + 10 s, at least
//! 30 s), `QL_SLOWLINK_LOG=<file>` (keep a copy of the Worker's event log there).
#![forbid(unsafe_code)]

mod e2e_common;

use e2e_common::slow_link::{self, Params};
use e2e_common::worker_bin;

#[test]
fn a_slow_uplink_starves_neither_lease_renewals_nor_the_session() {
    let params = Params::from_env();
    let outcome = slow_link::run(params, &worker_bin());
    println!("{}", outcome.summary());
    let failures = outcome.failures();
    if !failures.is_empty() {
        println!(
            "slow-link: the plane's answers (Pulls left out):\n{}",
            outcome.timeline()
        );
    }
    assert!(
        failures.is_empty(),
        "slow-link: {} bound(s) broken at {} B/s:\n- {}\nthe Worker's notable events (last \
         80):\n{}",
        failures.len(),
        params.rate,
        failures.join("\n- "),
        outcome.notable
    );
}
