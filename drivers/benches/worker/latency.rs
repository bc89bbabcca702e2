//! Lifecycle latency of `/bin/true` Runs through the real Worker against the loopback
//! reference control plane, against the physical floor measured in the same run: the same
//! number of fsyncs in the durable-write recipe on the same disk, one bare spawn-and-wait of
//! `/bin/true`, and the same number of HTTPS round trips on one kept-alive mTLS connection to
//! the same server. The two sides alternate run by run.
//!
//! The same lifecycles are split at the claim: enqueue → claimed (the Pull wait) against the
//! part of the floor that comes before the claim (the pending claim's durable write and the
//! Pull's round trip), and claimed → receipt removed against the rest of the floor. "Claimed" is
//! the first 1 ms poll of the loopback control plane's model that finds the Run's `Claimed`
//! event, which the plane records while it answers the Pull that hands the offer over; the
//! receipt's removal is found by the same poll, so both ends are on one clock.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{OpenOptionsExt as _, PermissionsExt as _};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use ql_worker::https::{
    HttpsClient, JsonCaps, Origin, RequestTimeout, TlsMaterial, TlsMaterialPaths,
};
use ql_worker_core::wire::route::Operation;
use ql_worker_tests::control_plane::RunEventKind;

use crate::table::{Table, dur, median, percentile};
use crate::world::{Tunables, World, wait_until};

/// fsyncs of a lifecycle that come before the claim: the pending claim published before the
/// Pull (temp file, root; docs/performance.md, the documented minimum).
const PRE_CLAIM_FSYNCS: u64 = 2;
/// Round trips of a lifecycle that come before the claim: the Pull that brings the offer (its
/// answer's way back is left to the claimed side's floor only as far as it is in the Worker's
/// measured time, so the post-claim floor is slightly low, never high).
const PRE_CLAIM_ROUND_TRIPS: usize = 1;

pub(crate) struct Measured {
    pub(crate) runs: usize,
    pub(crate) lifecycle: Vec<Duration>,
    pub(crate) pull_wait: Vec<Duration>,
    /// Enqueue → claimed, on the bench's clock (polled).
    pub(crate) to_claim: Vec<Duration>,
    /// Claimed → receipt removed, on the bench's clock (polled).
    pub(crate) after_claim: Vec<Duration>,
    pub(crate) floor: Vec<Duration>,
    /// The floor's part before the claim: [`PRE_CLAIM_FSYNCS`] + [`PRE_CLAIM_ROUND_TRIPS`].
    pub(crate) floor_to_claim: Vec<Duration>,
    /// The floor's part after the claim: the other fsyncs, the spawn, the other round trips.
    pub(crate) floor_after_claim: Vec<Duration>,
    /// Medians of the floor's parts: durable writes before / after the claim, spawn, round
    /// trips before / after the claim.
    pub(crate) floor_parts: [Duration; 5],
    pub(crate) round_trips: usize,
    pub(crate) requests: String,
    pub(crate) fsyncs: u64,
    pub(crate) record_bytes: usize,
}

fn runs() -> usize {
    crate::env_number("QL_BENCH_RUNS", 20, 3, 500)
}

/// The floor's pieces, on the same disk and the same server.
pub(crate) struct Floor {
    client: HttpsClient,
    authorization: String,
    path: String,
    body: Vec<u8>,
    dir: std::path::PathBuf,
    record: Vec<u8>,
}

impl Floor {
    /// A floor against `world`'s server, writing in a fresh directory of `world`'s scratch
    /// space (records of `record_bytes`).
    pub(crate) fn new(world: &World, record_bytes: usize) -> Self {
        let s = world.cp.worker_settings();
        let material = TlsMaterial::load(&TlsMaterialPaths {
            cert_chain: s.client_cert.clone(),
            private_key: s.client_key.clone(),
            trust_anchors: vec![s.ca_cert.clone()],
        })
        .expect("tls material");
        let client = HttpsClient::new(
            Origin::parse(&s.origin).expect("origin"),
            material,
            RequestTimeout::from_millis(10_000).expect("timeout"),
        )
        .expect("client");
        let dir = world.dir.path().join("floor");
        fs::create_dir_all(&dir).expect("floor dir");
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).expect("mode");
        Self {
            client,
            authorization: world.cp.credential().header_value().to_string(),
            path: format!("/api/v3/worker-ingress/workers/{}/bench-floor", s.worker_id),
            body: format!("{{\"pad\":\"{}\"}}", "x".repeat(500)).into_bytes(),
            dir,
            record: vec![0x5a; record_bytes],
        }
    }

    /// One whole lifecycle's floor: `fsyncs`, one spawn, `round_trips`.
    pub(crate) fn lifecycle(&self, fsyncs: u64, round_trips: usize) -> Duration {
        self.durable(fsyncs) + self.spawn() + self.round_trips(round_trips)
    }

    /// `fsyncs` in the durable recipe: ⌊fsyncs/2⌋ × (temp, write, fsync, rename, dir fsync),
    /// plus one (write, fsync) when odd.
    fn durable(&self, fsyncs: u64) -> Duration {
        let target = self.dir.join("record");
        let temp = self.dir.join(".record.tmp");
        let start = Instant::now();
        for _ in 0..fsyncs / 2 {
            let mut file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&temp)
                .expect("temp");
            file.write_all(&self.record).expect("write");
            file.sync_all().expect("fsync");
            drop(file);
            fs::rename(&temp, &target).expect("rename");
            File::open(&self.dir)
                .expect("dir")
                .sync_all()
                .expect("dir fsync");
        }
        if fsyncs % 2 == 1 {
            let mut file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(self.dir.join("single"))
                .expect("single");
            file.write_all(&self.record).expect("write");
            file.sync_all().expect("fsync");
        }
        start.elapsed()
    }

    fn spawn(&self) -> Duration {
        let start = Instant::now();
        let status = Command::new("/bin/true").status().expect("spawn /bin/true");
        assert!(status.success());
        start.elapsed()
    }

    fn round_trips(&self, n: usize) -> Duration {
        let start = Instant::now();
        for _ in 0..n {
            // An unrouted path: the server answers 404 with a small JSON error over the same
            // kept-alive connection; the model never changes.
            let _ = self.client.post_json(
                &self.path,
                &self.authorization,
                &self.body,
                JsonCaps::default(),
            );
        }
        start.elapsed()
    }
}

/// The operations of the requests the control plane logged in `[from_ms, to_ms]`.
fn requests_between(world: &World, from_ms: u64, to_ms: u64) -> Vec<Option<Operation>> {
    world.cp.with_model(|m| {
        m.request_log()
            .filter(|e| e.at.get() >= from_ms && e.at.get() <= to_ms)
            .filter(|e| !e.path.ends_with("/bench-floor"))
            .map(|e| e.operation)
            .collect()
    })
}

fn now_ms() -> u64 {
    ql_worker_tests::control_plane::ReferenceControlPlane::now().get()
}

/// Essential requests of one lifecycle: everything but heartbeats and Pulls after the first.
fn essential(ops: &[Option<Operation>]) -> usize {
    let pulls = ops
        .iter()
        .filter(|o| **o == Some(Operation::Offers))
        .count();
    let heartbeats = ops
        .iter()
        .filter(|o| **o == Some(Operation::Heartbeat))
        .count();
    ops.len() - heartbeats - pulls.saturating_sub(1)
}

pub(crate) fn measure(exe: &Path, fsyncs: u64) -> Measured {
    let runs = runs();
    let mut world = World::new(Tunables::SEQUENTIAL);
    let mut worker = world.spawn(exe, &[]);
    world.wait_ready(&mut worker);

    let mut floor = Floor::new(&world, 0);

    let mut lifecycle = Vec::new();
    let mut pull_wait = Vec::new();
    let mut to_claim = Vec::new();
    let mut after_claim = Vec::new();
    let mut floor_total = Vec::new();
    let mut floor_to_claim = Vec::new();
    let mut floor_after_claim = Vec::new();
    let mut parts: [Vec<Duration>; 5] = Default::default();
    // The floor in the pieces the split needs; together they are `Floor::lifecycle`'s recipe
    // (the pre-claim fsyncs are even, so the pairs and the odd single write are the same).
    let floor_parts = |floor: &Floor, n: usize| {
        [
            floor.durable(PRE_CLAIM_FSYNCS.min(fsyncs)),
            floor.durable(fsyncs.saturating_sub(PRE_CLAIM_FSYNCS)),
            floor.spawn(),
            floor.round_trips(PRE_CLAIM_ROUND_TRIPS.min(n)),
            floor.round_trips(n.saturating_sub(PRE_CLAIM_ROUND_TRIPS)),
        ]
    };
    let mut essentials = Vec::new();
    let mut by_op: BTreeMap<String, usize> = BTreeMap::new();
    // Enqueue at a random phase of the tick: right after a settle the next tick is always about
    // one cadence away, which would bias the Pull wait towards a full cadence.
    let mut phase: u64 = u64::from(std::process::id()) | 1;
    let cadence_ms = Tunables::SEQUENTIAL.cadence_ms;
    for round in 0..=runs {
        let measure_lifecycle = |world: &mut World, phase: &mut u64| {
            *phase ^= *phase << 13;
            *phase ^= *phase >> 7;
            *phase ^= *phase << 17;
            std::thread::sleep(Duration::from_millis(*phase % cadence_ms));
            let from = now_ms();
            let start = Instant::now();
            let run = world.enqueue_true();
            let (mut claimed_at, mut settled_at) = (None, None);
            let done = wait_until(Duration::from_secs(60), Duration::from_millis(1), || {
                let progress = world.progress(&run);
                let now = Instant::now();
                if progress.claimed && claimed_at.is_none() {
                    claimed_at = Some(now);
                }
                if progress.settled {
                    settled_at = Some(now);
                }
                progress.settled
            });
            assert!(done, "a /bin/true Run did not settle");
            let settled_at = settled_at.expect("settled");
            // A Run is claimed before it settles; a claim and the settlement found by the same
            // poll count the claim at that poll.
            let claimed_at = claimed_at.unwrap_or(settled_at);
            let elapsed = settled_at - start;
            let split = (claimed_at - start, settled_at - claimed_at);
            let ops = requests_between(world, from, now_ms());
            let record = world.cp.run(&run.run_id).expect("run");
            let at = |want: fn(&RunEventKind) -> bool| {
                record
                    .events
                    .iter()
                    .find(|e| want(&e.kind))
                    .map(|e| e.at.get())
            };
            // The wait for the Pull tick: enqueued → claimed, on the control plane's clock.
            let claimed = at(|k| matches!(k, RunEventKind::Claimed { .. }));
            let pull_wait =
                claimed.map(|c| Duration::from_millis(c.saturating_sub(record.queued_at.get())));
            (elapsed, split, ops, pull_wait)
        };
        let (elapsed, split, ops, server, pieces) = if round % 2 == 0 {
            let (e, c, o, s) = measure_lifecycle(&mut world, &mut phase);
            if floor.record.is_empty() {
                floor.record = vec![0x5a; largest_record(world.root())];
            }
            let p = floor_parts(&floor, essential(&o));
            (e, c, o, s, p)
        } else {
            let p = floor_parts(&floor, essentials.last().copied().unwrap_or(6));
            let (e, c, o, s) = measure_lifecycle(&mut world, &mut phase);
            (e, c, o, s, p)
        };
        if round == 0 {
            continue; // warm-up: page cache, TLS session, first shard directories
        }
        lifecycle.push(elapsed);
        to_claim.push(split.0);
        after_claim.push(split.1);
        if let Some(wait) = server {
            pull_wait.push(wait);
        }
        essentials.push(essential(&ops));
        for op in ops.iter().flatten() {
            *by_op.entry(op.as_str().to_owned()).or_default() += 1;
        }
        let [durable_pre, durable_post, spawn, trips_pre, trips_post] = pieces;
        floor_total.push(pieces.iter().sum());
        floor_to_claim.push(durable_pre + trips_pre);
        floor_after_claim.push(durable_post + spawn + trips_post);
        for (i, p) in pieces.iter().enumerate() {
            parts[i].push(*p);
        }
    }
    let status = worker.drain(Duration::from_secs(60));
    assert!(
        status.is_some_and(|s| s.success()),
        "the Worker did not drain cleanly: {status:?}"
    );
    essentials.sort_unstable();
    let requests = by_op
        .iter()
        .map(|(op, n)| format!("{op} {:.1}", *n as f64 / runs as f64))
        .collect::<Vec<_>>()
        .join(", ");
    Measured {
        runs,
        lifecycle,
        pull_wait,
        to_claim,
        after_claim,
        floor: floor_total,
        floor_to_claim,
        floor_after_claim,
        floor_parts: parts.map(|p| median(&p)),
        round_trips: essentials[essentials.len() / 2],
        requests,
        fsyncs,
        record_bytes: floor.record.len(),
    }
}

/// The size of the largest record in the inbox (the floor writes records of that size).
pub(crate) fn largest_record(root: &Path) -> usize {
    fs::read_dir(root.join("offers"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| usize::try_from(m.len()).unwrap_or(0))
                .max()
                .unwrap_or(1024)
        })
        .unwrap_or(1024)
}

/// One row of a timed measure against its floor: the median (p90) of `samples` against the
/// median of `floor`.
fn push_against_floor(
    table: &mut Table,
    measure: &str,
    samples: &[Duration],
    (floor, floor_name): (&[Duration], &str),
    note: String,
) {
    let (ours, base) = (median(samples), median(floor));
    table.push(
        measure,
        format!("{} (p90 {})", dur(ours), dur(percentile(samples, 90))),
        format!("{} ({floor_name})", dur(base)),
        Some(ours.as_secs_f64() / base.as_secs_f64()),
        note,
    );
}

pub(crate) fn report(m: &Measured, cadence_ms: u64, table: &mut Table) {
    let [durable_pre, durable_post, spawn, trips_pre, trips_post] = m.floor_parts;
    let pull_wait = if m.pull_wait.is_empty() {
        String::from("n/a")
    } else {
        dur(median(&m.pull_wait))
    };
    let post_fsyncs = m.fsyncs.saturating_sub(PRE_CLAIM_FSYNCS);
    let post_trips = m.round_trips.saturating_sub(PRE_CLAIM_ROUND_TRIPS);
    push_against_floor(
        table,
        "lifecycle latency of a `/bin/true` Run, enqueue → receipt removed (median)",
        &m.lifecycle,
        (&m.floor, "floor"),
        format!(
            "{} Runs, cadence {cadence_ms} ms, one slot. Floor = {} fsyncs as write+fsync+rename+dir fsync of a {}-byte record ({}) + bare spawn+wait of /bin/true ({}) + {} HTTPS round trips on one kept-alive mTLS connection ({}). Requests per lifecycle: {}. The rest is tick waits: enqueue → claimed {} (median, control-plane clock: the wait for the next Pull tick), and the completion is found by the next supervision tick; the supervisor's 5 fsyncs overlap the Worker's",
            m.runs,
            m.fsyncs,
            m.record_bytes,
            dur(durable_pre + durable_post),
            dur(spawn),
            m.round_trips,
            dur(trips_pre + trips_post),
            m.requests,
            pull_wait,
        ),
    );
    push_against_floor(
        table,
        "lifecycle latency, enqueue → claimed (the Pull wait, median)",
        &m.to_claim,
        (&m.floor_to_claim, "floor before the claim"),
        format!(
            "The same {} Runs, enqueued at a random phase of the {cadence_ms} ms tick. Claimed = the first 1 ms poll that finds the Run's Claimed event in the loopback plane's model (recorded while it answers the claiming Pull); on the plane's own clock the median is {pull_wait}. Floor before the claim = the pending claim's {} fsyncs ({}) + {} HTTPS round trip (the Pull, {})",
            m.runs,
            PRE_CLAIM_FSYNCS.min(m.fsyncs),
            dur(durable_pre),
            PRE_CLAIM_ROUND_TRIPS.min(m.round_trips),
            dur(trips_pre),
        ),
    );
    push_against_floor(
        table,
        "lifecycle latency, claimed → receipt removed (median)",
        &m.after_claim,
        (&m.floor_after_claim, "floor after the claim"),
        format!(
            "The same {} Runs; both ends found by the same 1 ms poll. Floor after the claim = the lifecycle's other {post_fsyncs} fsyncs ({}) + bare spawn+wait of /bin/true ({}) + {post_trips} HTTPS round trips ({}), all one after another (the supervisor's fsyncs included, though they may overlap the Worker's). Target: ≤ 1.5× (issue 16)",
            m.runs,
            dur(durable_post),
            dur(spawn),
            dur(trips_post),
        ),
    );
}
