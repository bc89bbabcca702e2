//! Issue 17 beyond the loopback plane's own faults: the real binary talks to the reference
//! control plane through a hostile TCP proxy on loopback that the plane knows nothing of. The
//! proxy cuts connections at seeded byte offsets of the plane's answers (mid-handshake,
//! mid-response after the plane applied the request, between two keep-alive exchanges) and
//! stalls some answers past the Worker's request timeout. Every Run must succeed exactly once,
//! the Worker must never halt, and it must drain with exit 0.
//!
//! `QL_HOSTILE_SEED=<n>` replays one seed (printed first); `QL_HOSTILE_RUNS` sets the number of
//! Runs (default 12).

mod e2e_common;

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use e2e_common::proxy::{Link, Proxy, pump};
use e2e_common::{KillOnDrop, World, env_number as number, marker_lines, sigterm, wait_exit};
use ql_worker_core::record::State;

const JSON: &[&str] = &["--log-format", "json"];
/// The Worker's request timeout (`control_plane.timeout_ms`); a stall is longer.
const REQUEST_TIMEOUT_MS: u64 = 2_000;
const STALL: Duration = Duration::from_millis(2_600);

/// The proxy's random stream.
use ql_worker_tests::splitmix::SplitMix64 as Rng;

/// What the proxy does to one burst of the plane's bytes (a TLS flight: the handshake, or the
/// records of one answer).
#[derive(Clone, Copy, Debug)]
enum Fate {
    /// Forward it.
    Pass,
    /// Forward this many of its bytes, then close both directions: the answer (to a request the
    /// plane has already applied) is lost, whole or half-way.
    Cut(usize),
    /// Hold it longer than the Worker's request timeout, then forward it (the Worker has given
    /// up on that exchange meanwhile).
    Stall,
}

#[derive(Default)]
struct Counts {
    connections: AtomicUsize,
    cuts: AtomicUsize,
    stalls: AtomicUsize,
}

/// The hostile proxy: loopback only, stops (and joins its threads) when dropped.
struct Hostile {
    counts: Arc<Counts>,
    proxy: Proxy,
}

impl Hostile {
    fn start(upstream: SocketAddr, seed: u64, hostile_for: Duration) -> Self {
        let counts = Arc::new(Counts::default());
        let proxy = {
            let counts = Arc::clone(&counts);
            let mut rng = Rng(seed);
            let started = Instant::now();
            Proxy::start(upstream, move |link| {
                counts.connections.fetch_add(1, Ordering::Relaxed);
                // Hostile for a while, then healed, so that every Run can settle.
                let hostile = started.elapsed() < hostile_for;
                let connection_seed = rng.next_u64();
                relay(link, hostile.then_some(connection_seed), &counts);
            })
        };
        Self { counts, proxy }
    }
}

/// Two pumps for one connection; with a seed, the plane → Worker one draws a [`Fate`] for every
/// burst it reads.
fn relay(link: &mut Link, seed: Option<u64>, counts: &Arc<Counts>) {
    let Ok([(c_read, s_write), (mut s_read, mut c_write)]) = link.directions() else {
        return;
    };
    link.spawn(move || {
        pump(c_read, s_write, 16 * 1024, |_| true);
    });
    let counts = Arc::clone(counts);
    link.spawn(move || {
        let mut rng = seed.map(Rng);
        let mut buf = [0u8; 32 * 1024];
        loop {
            let n = match s_read.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            let fate = match rng.as_mut().map(|r| r.below(100)) {
                Some(0..=9) => Fate::Cut(0),
                Some(10..=13) => Fate::Cut(n / 2),
                Some(14..=16) => Fate::Stall,
                _ => Fate::Pass,
            };
            match fate {
                Fate::Cut(keep) => {
                    let _ = c_write.write_all(&buf[..keep]);
                    counts.cuts.fetch_add(1, Ordering::Relaxed);
                    let _ = c_write.shutdown(Shutdown::Both);
                    let _ = s_read.shutdown(Shutdown::Both);
                    return;
                }
                Fate::Stall => {
                    counts.stalls.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(STALL);
                }
                Fate::Pass => {}
            }
            if c_write.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = c_write.shutdown(Shutdown::Both);
    });
}

/// The log lines worth reading after a failure (everything but the routine).
fn notable(log: &std::path::Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|l| {
            [
                "recovery",
                "renewal",
                "fenced",
                "uncertain",
                "lease",
                "halt",
                "stop",
                "transition",
            ]
            .iter()
            .any(|w| l.contains(w))
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_run_succeeds_once_through_a_hostile_network() {
    let seed = number(
        "QL_HOSTILE_SEED",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
    );
    let runs = number("QL_HOSTILE_RUNS", 12);
    println!("hostile network: seed {seed} (QL_HOSTILE_SEED={seed} replays it), {runs} Runs");

    let mut world = World::with_limits(100, "heartbeat_interval_ms = 1000\n");
    world.edit_config(
        "timeout_ms = 5000",
        &format!("timeout_ms = {REQUEST_TIMEOUT_MS}"),
    );
    let origin = world.cp.origin().to_owned();
    let upstream: SocketAddr = origin.trim_start_matches("https://").parse().unwrap();
    let proxy = Hostile::start(upstream, seed, Duration::from_secs(25));
    world.edit_config(&origin, &format!("https://{}", proxy.proxy.addr()));

    let mut markers = Vec::new();
    let mut run_ids = Vec::new();
    for n in 1..=u32::try_from(runs).unwrap() {
        let marker = world.dir.path().join(format!("marker-{n}"));
        // Some Runs hold their lease across several lease-control calls.
        let sleep = ["0", "0.3", "1.5"][n as usize % 3];
        let script = format!("echo ran >> '{}'; sleep {sleep}", marker.display());
        run_ids.push(world.enqueue_shell(n, &script));
        markers.push(marker);
    }
    let log = world.dir.path().join("worker.log");
    let mut worker = KillOnDrop(world.spawn_with_args(JSON, &[], &log));

    let deadline = Instant::now() + Duration::from_secs(150);
    // The whole log outlives the test's directory on a failure (the message shows only the
    // notable lines).
    let kept = std::env::temp_dir().join(format!("ql-hostile-{seed}.log"));
    loop {
        let done = run_ids
            .iter()
            .filter(|r| world.state_of(r) == Some(State::CompletionAcknowledged))
            .count();
        if let Some(status) = worker.0.try_wait().unwrap() {
            panic!(
                "the Worker exited ({status}) with {done}/{runs} Runs done; seed {seed}; log:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        if done == run_ids.len() {
            break;
        }
        if Instant::now() >= deadline {
            let _ = std::fs::copy(&log, &kept);
        }
        assert!(
            Instant::now() < deadline,
            "{done}/{runs} Runs done in 150 s; seed {seed}; whole log in {}; states {:?}; \
             notable events:\n{}",
            kept.display(),
            run_ids
                .iter()
                .map(|r| world.state_of(r))
                .collect::<Vec<_>>(),
            notable(&log)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let counts = &proxy.counts;
    println!(
        "hostile network: {} connections, {} cut, {} stalled",
        counts.connections.load(Ordering::Relaxed),
        counts.cuts.load(Ordering::Relaxed),
        counts.stalls.load(Ordering::Relaxed)
    );
    for (run, marker) in run_ids.iter().zip(&markers) {
        assert_eq!(marker_lines(marker), 1, "{run:?} ran once; seed {seed}");
        assert!(world.completed_at_cp(run), "{run:?}; seed {seed}");
    }
    assert!(
        counts.cuts.load(Ordering::Relaxed) > 0,
        "the proxy cut no connection: the test proved nothing (seed {seed})"
    );
    sigterm(&worker);
    let status = wait_exit(&mut worker, Duration::from_secs(60));
    assert_eq!(status.code(), Some(0), "drained with exit 0; seed {seed}");
    drop(proxy);
}
