//! Crash test: a child process runs replace cycles on one record and is SIGKILLed at random
//! moments, at least 200 times. After each kill the parent checks, before and after reopening:
//!
//! * the record decodes (never torn) and is exactly the record of its revision;
//! * its revision is the last one the child reported as completed, or the next one (the child
//!   reports after `replace_record` returned, so a kill between the rename and the report leaves
//!   the next revision);
//! * nothing but the record and temp files of our own pattern is in `offers/`, a temp is never
//!   read as a record, and reopening the journal sweeps the temps and lists exactly one record;
//! * the kernel released the owner lock with the dead child (the parent reopens at once).
//!
//! The child role: this same test binary, re-invoked with `--exact crash_child_replace_loop
//! --ignored` and the root in `QL_CRASH_CHILD_ROOT`. The child test is `#[ignore]`d so a normal
//! run never executes it on its own.

mod storage_support;

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use ql_worker::journal::{self, Journal};
use ql_worker_core::ids::Revision;
use ql_worker_core::listing::{Capacity, PageLimit};
use ql_worker_core::record::InboxRecord;
use ql_worker_sim::testkit;
use storage_support::*;

const CHILD_ENV: &str = "QL_CRASH_CHILD_ROOT";
const KILLS: u32 = 220;
/// Bound on the child's loop, in case the parent dies without killing it.
const CHILD_MAX_CYCLES: u64 = 200_000;

/// The record at revision `r`: `r` self-transitions of the accepted record, each one
/// millisecond later (what [`touched`] produces).
fn record_at_revision(r: u64) -> InboxRecord {
    let mut record = accepted(1);
    record.revision = Revision::new(r).unwrap();
    record.updated_at_ms = record.accepted_at_ms.saturating_add(r);
    record
}

#[test]
#[ignore = "child role of crash_kill_during_replace_cycles; run by that test with QL_CRASH_CHILD_ROOT"]
fn crash_child_replace_loop() {
    let root = std::env::var_os(CHILD_ENV).expect("run by the crash test with QL_CRASH_CHILD_ROOT");
    let mut journal = Journal::open(Path::new(&root), Capacity::DEFAULT).unwrap();
    let id = testkit::offer_id(1);
    let mut stored = journal.read_record(&id).unwrap().unwrap();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    // A leading newline keeps our lines apart from libtest's "test ... " prefix.
    writeln!(out, "\nready {}", stored.revision.get()).unwrap();
    out.flush().unwrap();
    for _ in 0..CHILD_MAX_CYCLES {
        let next = touched(&stored);
        journal.replace_record(&id, &next, stored.revision).unwrap();
        stored = next;
        // One write(2) per line: a pipe write under PIPE_BUF is atomic, so a line is either
        // reported whole or not at all.
        writeln!(out, "rev {}", stored.revision.get()).unwrap();
        out.flush().unwrap();
    }
}

/// Kills the child if the parent panics, so no child outlives the test.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// xorshift64*: the kill schedule only needs to be varied, and reproducible from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn seed() -> u64 {
    if let Some(seed) = std::env::var("QL_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return seed;
    }
    let mut bytes = [0u8; 8];
    rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty()).unwrap();
    u64::from_le_bytes(bytes) | 1
}

/// Parses the child's stdout: the revision it started from and the last completed one.
fn parse_report(lines: &[String]) -> (Option<u64>, Option<u64>) {
    let mut ready = None;
    let mut last = None;
    for line in lines {
        if let Some(n) = line.strip_prefix("ready ") {
            ready = Some(n.trim().parse().unwrap());
        } else if let Some(n) = line.strip_prefix("rev ") {
            last = Some(n.trim().parse().unwrap());
        }
    }
    (ready, last)
}

#[derive(Debug, Default)]
struct Stats {
    kills: u32,
    kills_before_ready: u32,
    temps_left: u32,
    next_revision_survived: u32,
    total_revisions: u64,
}

#[test]
fn crash_kill_during_replace_cycles_keeps_the_last_or_next_revision() {
    let seed = seed();
    eprintln!("crash test seed={seed} (QL_CRASH_SEED={seed} replays the schedule)");
    let mut rng = Rng(seed);
    let sb = sandbox();
    let id = testkit::offer_id(1);
    {
        let mut journal = Journal::open(&sb.root, Capacity::DEFAULT).unwrap();
        journal.publish_record(&record_at_revision(0)).unwrap();
    }
    let exe = std::env::current_exe().unwrap();
    let mut stored = 0u64;
    let mut stats = Stats::default();
    for kill in 0..KILLS {
        let context = format!("seed={seed} kill #{kill}");
        let child = Command::new(&exe)
            .args([
                "crash_child_replace_loop",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, &sb.root)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut child = KillOnDrop(child);
        let mut reader = BufReader::new(child.0.stdout.take().unwrap());
        let mut lines = Vec::new();
        // One kill in eight lands anywhere from the start (also inside Journal::open and its temp
        // sweep); the others land within the replace cycles.
        if rng.below(8) == 0 {
            stats.kills_before_ready += 1;
            std::thread::sleep(Duration::from_micros(rng.below(30_000)));
        } else {
            let mut line = String::new();
            for _ in 0..100 {
                line.clear();
                if reader.read_line(&mut line).unwrap() == 0 {
                    break;
                }
                let done = line.starts_with("ready ");
                lines.push(line.clone());
                if done {
                    break;
                }
            }
            assert!(
                lines.iter().any(|l| l.starts_with("ready ")),
                "{context}: child never got ready: {lines:?}"
            );
            // Mostly within the first few cycles (every step of one replace), sometimes later.
            let span = if rng.below(4) == 0 { 60_000 } else { 15_000 };
            std::thread::sleep(Duration::from_micros(rng.below(span)));
        }
        child.0.kill().unwrap();
        child.0.wait().unwrap();
        stats.kills += 1;
        // The rest of the pipe: complete lines only (a line without '\n' was never reported).
        let mut rest = String::new();
        for _ in 0..CHILD_MAX_CYCLES {
            rest.clear();
            if reader.read_line(&mut rest).unwrap() == 0 || !rest.ends_with('\n') {
                break;
            }
            lines.push(rest.clone());
        }
        let (ready, last) = parse_report(&lines);
        if let Some(ready) = ready {
            assert_eq!(
                ready, stored,
                "{context}: the child starts from the stored revision"
            );
        }
        let last = last.unwrap_or(stored);

        // Before any sweep: only the record and temps of our pattern; the record is whole.
        let offers = sb.root.join("offers");
        for entry in std::fs::read_dir(&offers).unwrap() {
            let name = entry.unwrap().file_name().to_string_lossy().into_owned();
            if name != "offer-000001.rec" {
                let target = ql_worker::layout::temp_target(&name);
                assert_eq!(target, Some("offer-000001.rec"), "{context}: stray {name}");
                stats.temps_left += 1;
            }
        }
        let record = journal::read_record_unlocked(&sb.root, &id)
            .unwrap_or_else(|e| panic!("{context}: record unreadable after kill: {e}"));
        let revision = record.revision.get();
        assert!(
            revision == last || revision == last + 1,
            "{context}: stored revision {revision}, last completed {last}"
        );
        assert_eq!(
            record,
            record_at_revision(revision),
            "{context}: content of revision {revision}"
        );
        stats.next_revision_survived += u32::from(revision == last + 1);
        stats.total_revisions += revision - stored;
        stored = revision;

        // A restart: the lock is free at once, temps are swept, exactly one record is listed.
        let journal = Journal::open(&sb.root, Capacity::DEFAULT)
            .unwrap_or_else(|e| panic!("{context}: reopen after kill: {e}"));
        assert!(
            temps_in(&offers).is_empty(),
            "{context}: temps swept on open"
        );
        let page = journal.list(None, PageLimit::DEFAULT).unwrap();
        assert_eq!(page.offer_ids, vec![id.clone()], "{context}: listing");
        assert_eq!(journal.read_record(&id).unwrap(), Some(record));
    }
    eprintln!("crash test: {stats:?}");
    assert!(stats.kills >= 200);
    assert!(
        stats.total_revisions > 0,
        "the child completed replace cycles between kills"
    );
}
