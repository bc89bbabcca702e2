//! Whole-Worker benchmarks (issue 10, item 5): one command, one table of ratios, every
//! baseline measured in the same run.
//!
//! ```sh
//! cargo bench -p ql-worker --bench worker
//! ```
//!
//! Rows: fsyncs per success lifecycle (Worker, supervisor) and per idle Pull against the
//! documented minimum (`fsyncs`); lifecycle latency of `/bin/true` Runs against the physical
//! floor, whole (enqueue → receipt removed) and split at the claim (enqueue → claimed against
//! the floor's pre-claim part, claimed → receipt removed against the rest), all three from the
//! same lifecycles (`latency`); the 64 MiB upload's peak RSS and throughput against `sha256sum`
//! (`upload`); startup reconciliation of 1,024 records against raw reads (`reconcile`); restart
//! → first Pull of the real Worker with 1,024 settled records in the inbox, with the default
//! high water and with one that keeps 1,023, against the reconciliation's storage work on the
//! same files (`restart`); peak RSS of the Worker and each supervisor with 1 and 256 sleeping
//! Runs, and steady-state fsyncs per second (`concurrency`); quick-Run throughput on the edge
//! and node profiles' defaults against the serial floor (`throughput`); release binary size
//! (`size`); the slow-link scenario of the end-to-end test `e2e_slow_link` (real Worker, a
//! 64 KiB/s Worker → plane uplink, 4 Runs printing 4 MiB and one sleeping): the largest Session
//! heartbeat gap against its bound, renewals, Runs lost, fences, and the time to the last
//! upload against the uplink time of the bytes carried (`slowlink`, knobs `QL_SLOWLINK_*`).
//!
//! `QL_BENCH_ONLY=fsync,latency,throughput,upload,reconcile,restart,rss,size,slowlink` runs a
//! subset
//! (`latency` prints its three rows, `restart` its two); `QL_BENCH_RUNS` sets the timed
//! lifecycles (default 20); `QL_BENCH_RESTART_ROUNDS` the restarts of each restart row (default
//! 5); `QL_BENCH_VERBOSE=1` prints each traced lifecycle by file. See `docs/performance.md`
//! ("Whole-Worker benchmarks") for the method of each row.

mod concurrency;
// The end-to-end tests' harness, for the slow-link scenario and its throttling proxy (one home,
// shared with `e2e_slow_link`).
#[path = "../../tests/e2e_common/mod.rs"]
mod e2e_common;
mod fsyncs;
mod latency;
mod machine;
mod procfs;
mod reconcile;
mod restart;
mod size;
mod slowlink;
mod table;
mod throughput;
mod upload;
mod world;

use std::path::{Path, PathBuf};

use table::Table;

/// Copies the binary under test into a private directory, so that the processes this run
/// starts can be recognised by `/proc/<pid>/exe` and a rebuild meanwhile changes nothing.
fn private_binary(dir: &Path) -> PathBuf {
    let exe = dir.join("ql-worker");
    std::fs::copy(env!("CARGO_BIN_EXE_ql-worker"), &exe).expect("copy the binary");
    exe
}

/// Kills whatever still runs this run's copy of the binary when the benchmark ends, a panic
/// included (a failed phase may leave supervisors and their sleeping Runs behind).
struct Leftovers(PathBuf);

impl Drop for Leftovers {
    fn drop(&mut self) {
        world::kill_leftovers(&self.0);
    }
}

/// The number in the environment variable `name`, `default` when it is unset or not a number,
/// held within `min..=max`.
pub(crate) fn env_number<T: std::str::FromStr + Ord>(name: &str, default: T, min: T, max: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
        .clamp(min, max)
}

fn selected(name: &str) -> bool {
    std::env::var("QL_BENCH_ONLY").map_or(true, |only| only.split(',').any(|o| o.trim() == name))
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some(upload::CHILD_ARG) {
        upload::child(&args[2..]);
        return;
    }
    if !args.iter().any(|a| a == "--bench") {
        println!(
            "whole-Worker benchmarks: run them with `cargo bench -p ql-worker --bench worker`"
        );
        return;
    }
    println!("# ql-worker whole-Worker benchmarks");
    for line in machine::describe() {
        println!("{line}");
    }
    let bin_dir = world::scratch("ql-bench-bin-");
    let exe = private_binary(bin_dir.path());
    // Dropped before `bin_dir`, while `/proc/<pid>/exe` still names the copy.
    let _leftovers = Leftovers(exe.clone());
    let mut table = Table::default();

    // fsyncs per lifecycle; the latency floor does the same number.
    let mut lifecycle_fsyncs = fsyncs::DOCUMENTED_MINIMUM;
    if selected("fsync") {
        eprintln!("fsyncs per success lifecycle (strace -f of the real binary)…");
        if fsyncs::strace_available() {
            let counted = fsyncs::count(&exe);
            lifecycle_fsyncs = fsyncs::report(&counted, &mut table);
        } else {
            table.skipped("fsyncs per success lifecycle", "strace is not installed");
        }
    }
    if selected("latency") {
        eprintln!("lifecycle latency against the physical floor…");
        let measured = latency::measure(&exe, lifecycle_fsyncs);
        latency::report(
            &measured,
            world::Tunables::SEQUENTIAL.cadence_ms,
            &mut table,
        );
    }
    if selected("throughput") {
        eprintln!("quick-Run throughput, edge and node profile defaults…");
        throughput::measure(&exe, lifecycle_fsyncs, &mut table);
    }
    if selected("upload") {
        eprintln!("64 MiB upload against sha256sum…");
        upload::measure(&mut table);
    }
    if selected("reconcile") {
        eprintln!("startup reconciliation of 1,024 records…");
        reconcile::measure(&mut table);
    }
    if selected("restart") {
        eprintln!("restart → first Pull with 1,024 settled records…");
        restart::measure(&exe, &mut table);
    }
    if selected("rss") {
        eprintln!("peak RSS with 1 and with 256 concurrent sleeping Runs…");
        concurrency::measure(&exe, &mut table);
    }
    if selected("slowlink") {
        eprintln!(
            "slow link: printing Runs and one sleeping through a throttled uplink (QL_SLOWLINK_*)…"
        );
        slowlink::measure(&exe, &mut table);
    }
    if selected("size") {
        eprintln!("release binary size (two cargo builds)…");
        size::measure(&mut table, bin_dir.path());
    }
    println!();
    table.print();
}
