//! Startup reconciliation of 1,024 records: the Worker's storage path (open the journal with
//! its owner lock, directory checks and temp sweep; then keyset pages of `ListInbox` and a
//! `read_record` of every listed record with every file check, the envelope's SHA-256 and the
//! postcard decode: what `Host` performs for the core's reconcile pass) against raw
//! `std::fs::read_dir` + `std::fs::read` of the same 1,024 files. The page cache is warm for
//! both; the sides alternate round by round.

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;
use std::time::{Duration, Instant};

use ql_worker::journal::Journal;
use ql_worker_core::envelope;
use ql_worker_core::ids::OfferId;
use ql_worker_core::listing::{Capacity, PageLimit};
use ql_worker_core::record::InboxRecord;
use ql_worker_core::time::UnixMillis;
use ql_worker_sim::testkit;

use crate::table::{Table, dur, median};
use crate::world::scratch;

pub(crate) const RECORDS: u32 = 1024;
const ROUNDS: usize = 9;
/// The node profile's startup page.
pub(crate) const NODE_PAGE: u64 = 16;

/// Writes 1,024 records (`make(n)` for n in 1..=1,024) straight into `offers/` (0600, as the
/// journal would) of a journal it creates at `root`; returns the envelope size of one.
pub(crate) fn populate(root: &Path, make: impl Fn(u32) -> InboxRecord) -> usize {
    drop(Journal::open(root, Capacity::new(1024).expect("capacity")).expect("journal"));
    let offers = root.join(ql_worker::layout::OFFERS_DIR);
    let mut size = 0;
    for n in 1..=RECORDS {
        let record = make(n);
        let bytes = envelope::encode(&record).expect("encode");
        size = bytes.len();
        let name = ql_worker::layout::record_file_name(&record.offer.offer_id);
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(offers.join(name))
            .expect("record file");
        file.write_all(&bytes).expect("write");
    }
    size
}

/// The journal's path with pages of `page`; returns the time and checks the count.
pub(crate) fn ours(root: &Path, page: u64) -> Duration {
    let start = Instant::now();
    let journal = Journal::open(root, Capacity::new(1024).expect("capacity")).expect("journal");
    let limit = PageLimit::new(page).expect("page");
    let mut after: Option<OfferId> = None;
    let mut read = 0;
    loop {
        let page = journal.list(after.as_ref(), limit).expect("list");
        for id in &page.offer_ids {
            let record = journal.read_record(id).expect("read").expect("present");
            std::hint::black_box(&record);
            read += 1;
        }
        match page.next_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let elapsed = start.elapsed();
    assert_eq!(read, RECORDS, "every record read");
    elapsed
}

/// The parts of the journal path, apart: the open, one directory scan (a 64-record page of
/// ids) and the 1,024 `read_record`s alone.
fn parts(root: &Path) -> (Duration, Duration, Duration) {
    let start = Instant::now();
    let journal = Journal::open(root, Capacity::new(1024).expect("capacity")).expect("journal");
    let open = start.elapsed();
    let limit = PageLimit::new(64).expect("page");
    let start = Instant::now();
    std::hint::black_box(journal.list(None, limit).expect("list"));
    let scan = start.elapsed();
    let ids: Vec<OfferId> = (1..=RECORDS).map(testkit::offer_id).collect();
    let start = Instant::now();
    for id in &ids {
        std::hint::black_box(journal.read_record(id).expect("read").expect("present"));
    }
    (open, scan, start.elapsed())
}

fn raw(root: &Path) -> Duration {
    let start = Instant::now();
    let mut read = 0;
    for entry in fs::read_dir(root.join(ql_worker::layout::OFFERS_DIR)).expect("read_dir") {
        let bytes = fs::read(entry.expect("entry").path()).expect("read");
        std::hint::black_box(&bytes);
        read += 1;
    }
    let elapsed = start.elapsed();
    assert_eq!(read, RECORDS, "every file read");
    elapsed
}

pub(crate) fn measure(table: &mut Table) {
    let dir = scratch("ql-bench-reconcile-");
    let root = dir.path().join("state");
    let size = populate(&root, |n| {
        InboxRecord::accepted(testkit::offer(n), UnixMillis::new(100).expect("t"))
    });
    // Warm-up (page cache, dentries).
    ours(&root, 64);
    raw(&root);
    let (mut node, mut wide, mut base) = (Vec::new(), Vec::new(), Vec::new());
    let (mut opens, mut scans, mut reads) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        if round % 2 == 0 {
            node.push(ours(&root, NODE_PAGE));
            wide.push(ours(&root, 64));
            base.push(raw(&root));
        } else {
            base.push(raw(&root));
            wide.push(ours(&root, 64));
            node.push(ours(&root, NODE_PAGE));
        }
        let (open, scan, read) = parts(&root);
        opens.push(open);
        scans.push(scan);
        reads.push(read);
    }
    let (node, wide, base) = (median(&node), median(&wide), median(&base));
    table.push(
        "startup reconciliation, 1,024 records: journal open + ListInbox pages + read_record",
        format!("{} (pages of {NODE_PAGE})", dur(node)),
        format!("{} (read_dir + fs::read)", dur(base)),
        Some(node.as_secs_f64() / base.as_secs_f64()),
        format!(
            "{size}-byte accepted records, page cache warm, median of {ROUNDS}; pages of 64: {} (ratio {:.2}). Apart: the journal open {}, one ListInbox page {}, the 1,024 read_record calls {} ({} each). Every page rescans the directory (keyset paging over a sorted scan), so pages of 16 cost 64 scans; the real Worker asks for each next page at once, without a tick wait (see the restart rows)",
            dur(wide),
            wide.as_secs_f64() / base.as_secs_f64(),
            dur(median(&opens)),
            dur(median(&scans)),
            dur(median(&reads)),
            dur(median(&reads) / RECORDS),
        ),
    );
}
