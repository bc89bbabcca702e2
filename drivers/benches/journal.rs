//! Durable replace-updates per second of the journal, against a baseline of raw
//! write + fsync + rename + directory fsync of the same size, measured in the same run.
//!
//! Run: `cargo bench -p ql-worker --bench journal` (`QL_BENCH_UPDATES=n` per side per round,
//! default 100, 10 rounds). The two sides alternate round by round so drift in the disk's
//! behaviour hits both. The fsync count per update is counted through the seam.

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ql_worker::fsio::{FaultFs, RealFs};
use ql_worker::journal::Journal;
use ql_worker_core::envelope;
use ql_worker_core::listing::Capacity;
use ql_worker_core::record::InboxRecord;
use ql_worker_core::testkit;
use ql_worker_core::time::UnixMillis;

const ROUNDS: u32 = 10;

fn accepted() -> InboxRecord {
    InboxRecord::accepted(testkit::offer(1), UnixMillis::new(100).unwrap())
}

fn touched(record: &InboxRecord) -> InboxRecord {
    let mut next = record.clone();
    next.revision = record.revision.next().unwrap();
    next.updated_at_ms = record.updated_at_ms.saturating_add(1);
    next
}

fn private_dir(path: &Path) {
    fs::create_dir(path).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o700)).unwrap();
}

/// `n` journal updates; returns the elapsed time.
fn ours(journal: &mut Journal, current: &mut InboxRecord, n: u32) -> Duration {
    let id = current.offer.offer_id.clone();
    let start = Instant::now();
    for _ in 0..n {
        let next = touched(current);
        journal
            .replace_record(&id, &next, current.revision)
            .unwrap();
        *current = next;
    }
    start.elapsed()
}

/// `n` raw updates of `bytes.len()` bytes: create temp, write, fsync, rename, fsync dir.
fn baseline(dir: &Path, bytes: &[u8], n: u32) -> Duration {
    let target = dir.join("record");
    let temp = dir.join(".record.tmp");
    let start = Instant::now();
    for _ in 0..n {
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&temp)
            .unwrap();
        file.write_all(bytes).unwrap();
        file.sync_all().unwrap();
        drop(file);
        fs::rename(&temp, &target).unwrap();
        File::open(dir).unwrap().sync_all().unwrap();
    }
    start.elapsed()
}

fn main() {
    // `cargo bench` passes `--bench`; a plain `cargo test --benches` passes nothing useful.
    let updates: u32 = std::env::var("QL_BENCH_UPDATES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let sandbox = tempfile::Builder::new()
        .prefix("ql-bench-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    fs::set_permissions(sandbox.path(), fs::Permissions::from_mode(0o700)).unwrap();
    let root = sandbox.path().join("root");
    let raw_dir = sandbox.path().join("raw");
    private_dir(&raw_dir);

    // fsyncs per update, counted through the seam on a separate root.
    let counted_root = sandbox.path().join("counted");
    let seam = Arc::new(FaultFs::new(RealFs));
    let mut counted =
        Journal::open_with(Arc::clone(&seam), &counted_root, Capacity::DEFAULT).unwrap();
    let mut record = accepted();
    counted.publish_record(&record).unwrap();
    seam.arm(None);
    const COUNTED: u64 = 20;
    for _ in 0..COUNTED {
        let next = touched(&record);
        counted
            .replace_record(&record.offer.offer_id, &next, record.revision)
            .unwrap();
        record = next;
    }
    let fsyncs_per_update = seam.fsyncs() as f64 / COUNTED as f64;
    let calls_per_update = seam.calls() as f64 / COUNTED as f64;
    drop(counted);

    let mut journal = Journal::open(&root, Capacity::DEFAULT).unwrap();
    let mut current = accepted();
    journal.publish_record(&current).unwrap();
    let size = envelope::encode(&current).unwrap().len();
    let bytes = vec![0x5au8; size];

    // Warm-up, not measured.
    ours(&mut journal, &mut current, 5);
    baseline(&raw_dir, &bytes, 5);
    let (mut ours_time, mut base_time) = (Duration::ZERO, Duration::ZERO);
    let mut round_ratios = Vec::new();
    for round in 0..ROUNDS {
        // Alternate which side goes first, so neither always meets a freshly flushed disk.
        let (o, b) = if round % 2 == 0 {
            let o = ours(&mut journal, &mut current, updates);
            (o, baseline(&raw_dir, &bytes, updates))
        } else {
            let b = baseline(&raw_dir, &bytes, updates);
            (ours(&mut journal, &mut current, updates), b)
        };
        round_ratios.push(b.as_secs_f64() / o.as_secs_f64());
        ours_time += o;
        base_time += b;
    }
    round_ratios.sort_by(f64::total_cmp);
    let total = f64::from(updates * ROUNDS);
    let ours_rate = total / ours_time.as_secs_f64();
    let base_rate = total / base_time.as_secs_f64();
    println!("journal durable replace-updates ({size}-byte envelope, {total} updates per side)");
    println!("| measure | value |");
    println!("|---|---|");
    println!("| updates/s, journal replace_record | {ours_rate:.1} |");
    println!("| updates/s, baseline write+fsync+rename+dir fsync | {base_rate:.1} |");
    println!(
        "| ratio journal / baseline | {:.3} |",
        ours_rate / base_rate
    );
    println!(
        "| per-round ratio, min .. median .. max | {:.3} .. {:.3} .. {:.3} |",
        round_ratios[0],
        round_ratios[round_ratios.len() / 2],
        round_ratios[round_ratios.len() - 1]
    );
    println!("| fsyncs per update (journal, counted at the seam) | {fsyncs_per_update:.1} |");
    println!("| fsyncs per update (baseline) | 2.0 |");
    println!("| system calls per update (journal, at the seam) | {calls_per_update:.1} |");
}
