//! fsyncs per success lifecycle, counted at the system-call level with `strace -f` on the real
//! binary: every `fsync`/`fdatasync`/`sync_file_range`/`syncfs`/`sync`/`msync` of the Worker,
//! its supervisors and the user process, attributed by process (exec image) and by file.
//!
//! Why strace and not the `FaultFs` seam: the Runner's stores (journal, receipts, spool,
//! session) are built on `RealFs` inside the binary, and the supervisor is another process that
//! the seam cannot reach. strace counts every sync call of every process, seam or not, without
//! changing the product. Only counts come from the traced run; its timings are never used.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::table::Table;
use crate::world::{Tunables, World, wait_until};

/// The documented minimum of one success lifecycle when the shard directories exist (see
/// `docs/performance.md`): Worker 17, supervisor 5.
pub(crate) const WORKER_MINIMUM: u64 = 17;
pub(crate) const SUPERVISOR_MINIMUM: u64 = 5;
pub(crate) const DOCUMENTED_MINIMUM: u64 = WORKER_MINIMUM + SUPERVISOR_MINIMUM;
/// fsyncs of an idle Pull in the reference protocol: claim published (temp + root), cleared
/// (unlink + root).
pub(crate) const IDLE_PULL_MINIMUM: u64 = 3;

/// Lifecycles counted (after one warm-up lifecycle, which also creates the receipt shard).
const COUNTED: usize = 4;

const SYNC_CALLS: [&str; 6] = [
    "fsync",
    "fdatasync",
    "sync_file_range",
    "syncfs",
    "sync",
    "msync",
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Role {
    Worker,
    Supervisor,
    User,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Self::Worker => "worker",
            Self::Supervisor => "supervisor",
            Self::User => "user",
        }
    }
}

/// The counts of one lifecycle.
#[derive(Clone, Debug, Default)]
pub(crate) struct Lifecycle {
    pub(crate) worker: u64,
    pub(crate) supervisor: u64,
    pub(crate) user: u64,
    /// `role: what` → count.
    pub(crate) by_file: BTreeMap<String, u64>,
}

impl Lifecycle {
    pub(crate) fn total(&self) -> u64 {
        self.worker + self.supervisor + self.user
    }
}

/// The directory fsyncs that only happen when a shard directory is created (the parent of the
/// new shard is synced): they add to the minimum for that lifecycle.
fn new_shards(l: &Lifecycle) -> u64 {
    ["worker: fsync logs/ dir", "supervisor: fsync receipts/ dir"]
        .iter()
        .map(|k| l.by_file.get(*k).copied().unwrap_or(0))
        .sum()
}

/// Record writes beyond the six states of a success lifecycle: lease renewals persisted when a
/// supervision tick found the Run still running (2 fsyncs each).
fn renewals(l: &Lifecycle) -> u64 {
    l.by_file
        .get("worker: fsync offers/ temp of *.rec")
        .copied()
        .unwrap_or(6)
        .saturating_sub(6)
}

/// The documented minimum of the Worker for this lifecycle's shape.
fn worker_minimum(l: &Lifecycle) -> u64 {
    WORKER_MINIMUM + new_shards(l) + 2 * renewals(l)
}

fn range(v: &[u64]) -> String {
    let min = v.iter().min().copied().unwrap_or(0);
    let max = v.iter().max().copied().unwrap_or(0);
    if min == max {
        format!("{min}")
    } else {
        format!("{min}–{max}")
    }
}

/// Adds the rows; returns the median total fsyncs per lifecycle (for the latency floor).
pub(crate) fn report(c: &Counted, table: &mut Table) -> u64 {
    let n = c.lifecycles.len();
    let worker: Vec<u64> = c.lifecycles.iter().map(|l| l.worker).collect();
    let supervisor: Vec<u64> = c.lifecycles.iter().map(|l| l.supervisor).collect();
    let user: Vec<u64> = c.lifecycles.iter().map(|l| l.user).collect();
    let shards: Vec<u64> = c.lifecycles.iter().map(new_shards).collect();
    let renewed: Vec<u64> = c.lifecycles.iter().map(renewals).collect();
    let worker_min: Vec<u64> = c.lifecycles.iter().map(worker_minimum).collect();
    let sum = |v: &[u64]| v.iter().sum::<u64>() as f64;
    table.push(
        "fsyncs per success lifecycle: Worker",
        range(&worker),
        format!("{} (documented minimum)", range(&worker_min)),
        Some(sum(&worker) / sum(&worker_min)),
        format!(
            "strace -f of the real binary, {n} lifecycles of /bin/true. 6 record writes × 2 (temp, dir), claim 2 + clear 1, log allocation 1 (+1 when its shard dir is new: {} of {n} here), receipt removal 1; +2 per lease renewal persisted while the Run ran ({} here)",
            shards.iter().filter(|s| **s > 0).count(),
            renewed.iter().sum::<u64>()
        ),
    );
    table.push(
        "fsyncs per success lifecycle: each supervisor",
        range(&supervisor),
        format!("{SUPERVISOR_MINIMUM} (documented minimum)"),
        Some(sum(&supervisor) / (SUPERVISOR_MINIMUM as f64 * n as f64)),
        format!(
            "log 1, truncation fact 2, receipt 2; the user process (/bin/true) did {}",
            range(&user)
        ),
    );
    if c.idle_pulls > 0 {
        let per = c.idle_fsyncs as f64 / c.idle_pulls as f64;
        table.push(
            "fsyncs per idle Pull (no Run offered)",
            format!("{per:.2}"),
            format!("{IDLE_PULL_MINIMUM} (reference protocol)"),
            Some(per / IDLE_PULL_MINIMUM as f64),
            format!(
                "{} idle Pulls between the lifecycles: the pending claim is published before and cleared after every Pull; an idle Worker does {:.0} fsyncs/s at the node cadence (500 ms), {:.1}/s at the edge cadence (2 s)",
                c.idle_pulls,
                per * 2.0,
                per * 0.5
            ),
        );
    }
    let mut totals: Vec<u64> = c.lifecycles.iter().map(Lifecycle::total).collect();
    totals.sort_unstable();
    totals
        .get(totals.len() / 2)
        .copied()
        .unwrap_or(DOCUMENTED_MINIMUM)
}

pub(crate) struct Counted {
    pub(crate) lifecycles: Vec<Lifecycle>,
    /// Idle Pulls seen between lifecycles, and the sync calls they made.
    pub(crate) idle_pulls: u64,
    pub(crate) idle_fsyncs: u64,
}

pub(crate) fn strace_available() -> bool {
    Command::new("strace")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs `COUNTED + 1` `/bin/true` Runs one after the other through the real binary under
/// strace; returns the counts of the last `COUNTED`.
pub(crate) fn count(exe: &Path) -> Counted {
    let mut world = World::new(Tunables::SEQUENTIAL);
    let trace = world.dir.path().join("strace.txt");
    let wrapper: Vec<OsString> = [
        "strace",
        "-f",
        "-qq",
        "-y",
        "-s",
        "64",
        "-e",
        "trace=fsync,fdatasync,sync_file_range,syncfs,sync,msync,execve,clone,clone3,fork,vfork",
        "-o",
    ]
    .iter()
    .map(OsString::from)
    .chain([trace.clone().into_os_string()])
    .collect();
    let mut worker = world.spawn(exe, &wrapper);
    world.wait_ready(&mut worker);
    for _ in 0..=COUNTED {
        let run = world.enqueue_true();
        let done = wait_until(Duration::from_secs(120), Duration::from_millis(5), || {
            world.settled(&run)
        });
        assert!(done, "a traced /bin/true Run did not settle");
        // A few idle Pulls between lifecycles.
        std::thread::sleep(Duration::from_millis(350));
    }
    let status = worker.drain(Duration::from_secs(60));
    assert!(
        status.is_some_and(|s| s.success()),
        "the traced Worker did not drain cleanly: {status:?}"
    );
    let text = std::fs::read_to_string(&trace).expect("strace output");
    let counted = attribute(&text, world.root(), 1);
    assert_eq!(
        counted.lifecycles.len(),
        COUNTED,
        "every traced lifecycle found"
    );
    if std::env::var_os("QL_BENCH_VERBOSE").is_some() {
        let _ = std::fs::copy(&trace, "/tmp/ql-bench-strace.txt");
        for (i, l) in counted.lifecycles.iter().enumerate() {
            eprintln!("  lifecycle {i}: {l:?}");
        }
    }
    counted
}

struct Line<'a> {
    pid: u32,
    call: &'a str,
    rest: &'a str,
}

fn parse(line: &str) -> Option<Line<'_>> {
    let (pid, rest) = line.trim_start().split_once(' ')?;
    let pid = pid.parse().ok()?;
    let rest = rest.trim_start();
    let call = if let Some(resumed) = rest.strip_prefix("<... ") {
        resumed.split(' ').next()?
    } else {
        rest.split('(').next()?
    };
    Some(Line { pid, call, rest })
}

/// The return value of a finished call (`… = 123`).
fn returned(rest: &str) -> Option<i64> {
    let (_, tail) = rest.rsplit_once(") = ")?;
    tail.split_whitespace().next()?.parse().ok()
}

/// The path strace `-y` prints for the first descriptor argument (`fsync(7</a/b>)`).
fn fd_path(rest: &str) -> Option<&str> {
    let start = rest.find('<')? + 1;
    let end = start + rest[start..].find('>')?;
    Some(&rest[start..end])
}

/// What a synced file is, with ids and random temp names folded.
fn what(path: &str, root: &Path) -> String {
    let root = root.to_string_lossy();
    let Some(rel) = path.strip_prefix(root.as_ref()) else {
        return String::from("outside the state root");
    };
    let rel = rel.trim_start_matches('/');
    if rel.is_empty() {
        return String::from("root dir");
    }
    let parts: Vec<&str> = rel.split('/').collect();
    let last = parts[parts.len() - 1];
    let kind = |name: &str| {
        let target = name.trim_start_matches('.');
        if target.ends_with(".tmp") {
            let inner = target.trim_end_matches(".tmp");
            let target = inner.rsplit_once('.').map_or(inner, |(t, _)| t);
            format!("temp of {}", suffix(target))
        } else {
            suffix(target)
        }
    };
    match parts.as_slice() {
        [dir] if matches!(*dir, "offers" | "receipts" | "logs") => format!("{dir}/ dir"),
        [_] => kind(last),
        ["offers", _] => format!("offers/ {}", kind(last)),
        ["receipts" | "logs", _] => format!("{}/<shard> dir", parts[0]),
        [top, _, _] => format!("{top}/<shard>/ {}", kind(last)),
        _ => rel.to_owned(),
    }
}

fn suffix(name: &str) -> String {
    for s in [".rec", ".rcpt", ".log", ".fact"] {
        if name.ends_with(s) {
            return format!("*{s}");
        }
    }
    name.to_owned()
}

fn classify_exec(rest: &str) -> Role {
    if rest.contains("\"__supervise\"") {
        Role::Supervisor
    } else if rest.contains("\"run\"") && rest.contains("\"--config\"") {
        Role::Worker
    } else {
        Role::User
    }
}

/// One sync call.
struct Sync<'a> {
    role: Role,
    call: &'a str,
    path: &'a str,
    what: String,
}

/// The offer id of a record temp file (`offers/.<offerId>.rec.<hex>.tmp`).
fn record_offer(path: &str) -> Option<&str> {
    let name = path.rsplit('/').next()?;
    let inner = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    inner.rsplit_once(".rec.").map(|(offer, _)| offer)
}

/// Attributes every sync call to its process role and file, and cuts the trace into
/// lifecycles: from the pending claim written for the Pull that brought the offer (the last
/// claim before the offer's first record write) to the Worker's receipt removal (its directory
/// fsync in `receipts/<shard>`), inclusive. With one slot the Worker does not Pull while a Run
/// is in flight, so nothing else happens in between. What happens between lifecycles is idle
/// Pulls (claim written, Pull, claim cleared).
fn attribute(text: &str, root: &Path, skip: usize) -> Counted {
    let lines: Vec<Line<'_>> = text.lines().filter_map(parse).collect();
    let mut parent: BTreeMap<u32, u32> = BTreeMap::new();
    let mut image: BTreeMap<u32, Role> = BTreeMap::new();
    for l in &lines {
        if l.call == "execve" && !l.rest.starts_with("<...") {
            image.insert(l.pid, classify_exec(l.rest));
        }
        if matches!(l.call, "clone" | "clone3" | "fork" | "vfork")
            && let Some(child) = returned(l.rest).and_then(|r| u32::try_from(r).ok())
            && child > 0
        {
            parent.insert(child, l.pid);
        }
    }
    let role_of = |pid: u32| {
        let mut p = pid;
        for _ in 0..64 {
            if let Some(role) = image.get(&p) {
                return *role;
            }
            match parent.get(&p) {
                Some(up) => p = *up,
                None => break,
            }
        }
        Role::Worker
    };
    let syncs: Vec<Sync<'_>> = lines
        .iter()
        .filter(|l| SYNC_CALLS.contains(&l.call) && !l.rest.starts_with("<..."))
        .map(|l| {
            let path = fd_path(l.rest).unwrap_or("");
            Sync {
                role: role_of(l.pid),
                call: l.call,
                path,
                what: what(path, root),
            }
        })
        .collect();
    let is_claim = |s: &Sync<'_>| s.role == Role::Worker && s.what == "temp of pending-claim";
    // Lifecycle bounds, in sync-call indices.
    let mut bounds: Vec<(usize, usize)> = Vec::new();
    let mut seen: Vec<&str> = Vec::new();
    let mut last_claim: Option<usize> = None;
    let mut i = 0;
    while i < syncs.len() {
        let s = &syncs[i];
        if is_claim(s) {
            last_claim = Some(i);
        }
        let fresh = (s.role == Role::Worker)
            .then(|| record_offer(s.path))
            .flatten()
            .filter(|offer| !seen.contains(offer));
        if let Some(offer) = fresh {
            seen.push(offer);
            let start = last_claim.unwrap_or(i);
            let end = (i..syncs.len()).find(|j| {
                syncs[*j].role == Role::Worker && syncs[*j].what == "receipts/<shard> dir"
            });
            let Some(end) = end else { break };
            bounds.push((start, end));
            i = end;
        }
        i += 1;
    }
    let mut lifecycles = Vec::new();
    for (start, end) in bounds.iter().skip(skip) {
        let mut l = Lifecycle::default();
        for s in &syncs[*start..=*end] {
            match s.role {
                Role::Worker => l.worker += 1,
                Role::Supervisor => l.supervisor += 1,
                Role::User => l.user += 1,
            }
            *l.by_file
                .entry(format!("{}: {} {}", s.role.name(), s.call, s.what))
                .or_default() += 1;
        }
        lifecycles.push(l);
    }
    // Between two lifecycles: idle Pulls only.
    let (mut idle_pulls, mut idle_fsyncs) = (0, 0);
    for pair in bounds.windows(2) {
        for s in &syncs[pair[0].1 + 1..pair[1].0] {
            idle_fsyncs += 1;
            if is_claim(s) {
                idle_pulls += 1;
            }
        }
    }
    Counted {
        lifecycles,
        idle_pulls,
        idle_fsyncs,
    }
}
