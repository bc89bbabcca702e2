//! Durable replace-updates per second of the journal, against a baseline of raw
//! write + fsync + rename + directory fsync of the same size, measured in the same run.
//!
//! Run: `cargo bench -p ql-worker --bench journal` (`QL_BENCH_UPDATES=n` per side per round,
//! default 100, 10 rounds). The two sides alternate round by round so drift in the disk's
//! behaviour hits both. The fsync count per update is counted through the seam. A second run on
//! tmpfs, where fsync is nearly free, shows the journal's own CPU cost that the disk hides.

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ql_worker::fsio::RealFs;
use ql_worker::journal::Journal;
use ql_worker_core::envelope;
use ql_worker_core::listing::Capacity;
use ql_worker_core::record::InboxRecord;
use ql_worker_core::time::UnixMillis;
use ql_worker_sim::fault_fs::FaultFs;
use ql_worker_sim::testkit;

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

struct Measured {
    size: usize,
    updates: u32,
    ours_rate: f64,
    base_rate: f64,
    /// Per-round ratios, sorted.
    round_ratios: Vec<f64>,
}

/// Both sides in private directories under `base`, alternating round by round.
fn measure(base: &Path, updates: u32) -> Measured {
    let sandbox = tempfile::Builder::new()
        .prefix("ql-bench-")
        .tempdir_in(base)
        .unwrap();
    fs::set_permissions(sandbox.path(), fs::Permissions::from_mode(0o700)).unwrap();
    let raw_dir = sandbox.path().join("raw");
    private_dir(&raw_dir);
    let mut journal = Journal::open(&sandbox.path().join("root"), Capacity::DEFAULT).unwrap();
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
    Measured {
        size,
        updates: updates * ROUNDS,
        ours_rate: total / ours_time.as_secs_f64(),
        base_rate: total / base_time.as_secs_f64(),
        round_ratios,
    }
}

/// fsyncs and system calls per update, counted through the seam.
fn counted_per_update(base: &Path) -> (f64, f64) {
    const COUNTED: u32 = 20;
    let sandbox = tempfile::Builder::new()
        .prefix("ql-bench-")
        .tempdir_in(base)
        .unwrap();
    fs::set_permissions(sandbox.path(), fs::Permissions::from_mode(0o700)).unwrap();
    let seam = Arc::new(FaultFs::new(RealFs));
    let mut journal = Journal::open_with(
        Arc::clone(&seam),
        &sandbox.path().join("root"),
        Capacity::DEFAULT,
    )
    .unwrap();
    let mut record = accepted();
    journal.publish_record(&record).unwrap();
    seam.arm(None);
    for _ in 0..COUNTED {
        let next = touched(&record);
        journal
            .replace_record(&record.offer.offer_id, &next, record.revision)
            .unwrap();
        record = next;
    }
    let per = |n: u64| n as f64 / f64::from(COUNTED);
    (per(seam.fsyncs()), per(seam.calls()))
}

fn main() {
    let updates: u32 = std::env::var("QL_BENCH_UPDATES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let disk = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let (fsyncs, calls) = counted_per_update(disk);
    let mut rows = vec![("disk (target dir)", measure(disk, updates))];
    // tmpfs makes fsync nearly free, which exposes the journal's own cost (read-back, checks,
    // encode, SHA-256, getrandom) that the disk hides.
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        rows.push(("tmpfs (/dev/shm)", measure(shm, updates * 20)));
    }
    println!(
        "journal durable replace-updates ({}-byte envelope; fsyncs per update: journal {fsyncs:.1} \
         counted at the seam, baseline 2.0; system calls per update: journal {calls:.1}, \
         baseline 6)",
        rows[0].1.size
    );
    println!(
        "| medium | updates per side | journal updates/s | baseline updates/s | ratio | \
         per-round ratio min / median / max |"
    );
    println!("|---|---|---|---|---|---|");
    for (medium, m) in &rows {
        let r = &m.round_ratios;
        println!(
            "| {medium} | {} | {:.1} | {:.1} | {:.3} | {:.3} / {:.3} / {:.3} |",
            m.updates,
            m.ours_rate,
            m.base_rate,
            m.ours_rate / m.base_rate,
            r[0],
            r[r.len() / 2],
            r[r.len() - 1]
        );
    }
}
