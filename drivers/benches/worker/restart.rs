//! Restart → first Pull with 1,024 settled records in the inbox: the real `ql-worker run` on the
//! node profile starts over a state root that already holds 1,024 `completion_acknowledged`
//! records (no receipts, no pending claim), and the time runs from just before the process is
//! spawned to the first Pull (`offers`) the loopback control plane sees. Baseline, measured in
//! the same round on the same files: the storage work of the startup reconciliation alone, in
//! process (`reconcile::ours` with the node profile's startup page), page cache warm for both.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use ql_worker_core::record::{InboxRecord, State};
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::route::Operation;
use ql_worker_sim::testkit;
use ql_worker_tests::control_plane::ReferenceControlPlane;

use crate::reconcile::{self, NODE_PAGE, RECORDS};
use crate::table::{Table, dur, median};
use crate::world::{World, wait_until};

/// One configuration of the restart: the node profile with the largest inbox the configuration
/// accepts (1,024 records fit); every other tunable is the profile's default (cadence 500 ms,
/// startup page 16) unless `tail` sets it.
struct Variant {
    measure: &'static str,
    tail: &'static str,
    high_water: u64,
}

const VARIANTS: [Variant; 2] = [
    // The default high water (half the capacity): the first retention sweep removes the 512
    // oldest settled records before anything else.
    Variant {
        measure: "restart → first Pull, 1,024 settled records in the inbox (node profile, inbox_capacity = 1024, default high water 512; median)",
        tail: "\n[limits]\ninbox_capacity = 1024\n",
        high_water: 512,
    },
    // A high water that keeps all but one: the sweep removes one record (a place for the offer)
    // and the reconciliation reads the other 1,023.
    Variant {
        measure: "restart → first Pull, 1,024 settled records in the inbox (node profile, inbox_capacity = 1024, high water 1,023; median)",
        tail: "\n[limits]\ninbox_capacity = 1024\n\n[retention]\nhigh_water_records = 1023\n",
        high_water: 1023,
    },
];

/// How long before the start the records were settled (inside the default 7-day age limit and
/// the 24-hour log keep, so age alone removes nothing).
const SETTLED_AGO_MS: u64 = 3_600_000;

fn rounds() -> usize {
    crate::env_number("QL_BENCH_RESTART_ROUNDS", 5, 1, 25)
}

/// Record `n` as the happy path leaves it (`testkit::record`), settled `base + n` ms after the
/// epoch instead of at 105 ms.
fn settled(n: u32, base: u64) -> InboxRecord {
    let mut r = testkit::record(n, State::CompletionAcknowledged);
    let shift = |t: UnixMillis| t.saturating_add(base + u64::from(n));
    r.accepted_at_ms = shift(r.accepted_at_ms);
    r.updated_at_ms = shift(r.updated_at_ms);
    r.executor_started_at_ms = r.executor_started_at_ms.map(shift);
    r.completion_acknowledged_at_ms = r.completion_acknowledged_at_ms.map(shift);
    r
}

struct Round {
    first_pull: Duration,
    first_request: Duration,
    storage: Duration,
    left: usize,
    before: Vec<Operation>,
}

fn round(exe: &Path, variant: &Variant) -> (Round, usize) {
    let world = World::with_config("node", variant.tail);
    let base = ReferenceControlPlane::now()
        .get()
        .saturating_sub(SETTLED_AGO_MS);
    let size = reconcile::populate(world.root(), |n| settled(n, base));
    let storage = reconcile::ours(world.root(), NODE_PAGE);
    let start = Instant::now();
    let mut worker = world.spawn(exe, &[]);
    let (mut first_request, mut first_pull) = (None, None);
    let mut before = Vec::new();
    let pulled = wait_until(Duration::from_secs(300), Duration::from_millis(5), || {
        let now = Instant::now();
        let (any, ops) = world.cp.with_model(|m| {
            let any = m.request_log().next().is_some();
            let mut ops = Vec::new();
            for e in m.request_log() {
                if e.operation == Some(Operation::Offers) {
                    return (any, Some(ops));
                }
                ops.extend(e.operation);
            }
            (any, None)
        });
        if any && first_request.is_none() {
            first_request = Some(now - start);
        }
        if let Some(ops) = ops {
            first_pull = Some(now - start);
            before = ops;
            return true;
        }
        !worker.alive()
    });
    let first_pull = first_pull.unwrap_or_else(|| {
        panic!("no Pull after the restart (timed out: {})", !pulled);
    });
    let left = fs::read_dir(world.root().join(ql_worker::layout::OFFERS_DIR))
        .map(|d| d.count())
        .unwrap_or(0);
    drop(worker); // killed: nothing runs, and the next round starts from a fresh root
    let round = Round {
        first_pull,
        first_request: first_request.unwrap_or(first_pull),
        storage,
        left,
        before,
    };
    (round, size)
}

pub(crate) fn measure(exe: &Path, table: &mut Table) {
    let n = rounds();
    let mut measured: [Vec<Round>; 2] = Default::default();
    let mut size = 0;
    for i in 0..n {
        eprintln!("  restart {}/{n}…", i + 1);
        // The variants alternate which goes first.
        for k in [i % 2, 1 - i % 2] {
            let (r, s) = round(exe, &VARIANTS[k]);
            size = s;
            measured[k].push(r);
        }
    }
    for (variant, measured) in VARIANTS.iter().zip(&measured) {
        report(variant, measured, size, table);
    }
}

fn report(variant: &Variant, measured: &[Round], size: usize, table: &mut Table) {
    let n = measured.len();
    let pulls: Vec<Duration> = measured.iter().map(|r| r.first_pull).collect();
    let firsts: Vec<Duration> = measured.iter().map(|r| r.first_request).collect();
    let after_first: Vec<Duration> = measured
        .iter()
        .map(|r| r.first_pull.saturating_sub(r.first_request))
        .collect();
    let storage: Vec<Duration> = measured.iter().map(|r| r.storage).collect();
    let left: Vec<String> = measured.iter().map(|r| r.left.to_string()).collect();
    let mut ops: BTreeMap<&str, usize> = BTreeMap::new();
    for r in measured {
        for op in &r.before {
            *ops.entry(op.as_str()).or_default() += 1;
        }
    }
    let ops = ops
        .iter()
        .map(|(op, c)| format!("{op} {:.1}", *c as f64 / n as f64))
        .collect::<Vec<_>>()
        .join(", ");
    let (ours, base) = (median(&pulls), median(&storage));
    let (min, max) = (
        pulls.iter().min().copied().unwrap_or_default(),
        pulls.iter().max().copied().unwrap_or_default(),
    );
    table.push(
        variant.measure,
        format!("{} (min {}, max {})", dur(ours), dur(min), dur(max)),
        format!("{} (reconcile storage path, pages of {NODE_PAGE})", dur(base)),
        Some(ours.as_secs_f64() / base.as_secs_f64()),
        format!(
            "{n} restarts, each with a fresh control plane and root: {RECORDS} completion_acknowledged records of {size} bytes (settled an hour ago; no receipt, log or pending claim) written into offers/, then `ql-worker run` spawned; node profile, inbox_capacity = 1024, high water {}, other tunables the profile's (cadence 500 ms, startup page {NODE_PAGE}). Time from just before the spawn to the first offers request the control plane logged, polled every 5 ms: spawn → first request of any kind {}, then → first Pull {} (medians). Requests before the first Pull (per restart): {}. Records left in offers/ when the Pull was seen: {}. Baseline: Journal::open + ListInbox pages of {NODE_PAGE} + read_record of all {RECORDS} records on the same files, in process, just before the spawn. Target: ≤ 1 s (issue 16)",
            variant.high_water,
            dur(median(&firsts)),
            dur(median(&after_first)),
            if ops.is_empty() { String::from("none") } else { ops },
            left.join(", "),
        ),
    );
}
