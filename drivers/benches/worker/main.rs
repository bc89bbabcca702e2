//! Whole-Worker benchmarks (issue 10, item 5): one command, one table of ratios, every
//! baseline measured in the same run.
//!
//! ```sh
//! cargo bench -p ql-worker --bench worker
//! ```
//!
//! See `docs/performance.md` ("Whole-Worker benchmarks") for the method of each row.

mod concurrency;
mod fsyncs;
mod latency;
mod machine;
mod procfs;
mod reconcile;
mod size;
mod table;
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
    if selected("upload") {
        eprintln!("64 MiB upload against sha256sum…");
        upload::measure(&mut table);
    }
    if selected("reconcile") {
        eprintln!("startup reconciliation of 1,024 records…");
        reconcile::measure(&mut table);
    }
    if selected("rss") {
        eprintln!("peak RSS with 1 and with 256 concurrent sleeping Runs…");
        concurrency::measure(&exe, &mut table);
    }
    if selected("size") {
        eprintln!("release binary size (two cargo builds)…");
        size::measure(&mut table, bin_dir.path());
    }
    world::kill_leftovers(&exe);
    println!();
    table.print();
}
