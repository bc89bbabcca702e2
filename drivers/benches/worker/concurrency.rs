//! Peak RSS of the Worker and of each supervisor with 1 and with 256 concurrent sleeping Runs:
//! the real binary (`ql-worker run`, node profile, 256 concurrent Runs, inbox capacity 512)
//! against the loopback reference control plane, Runs of `/bin/sleep 600`. Measured once every
//! Run is `running_acknowledged` (VmHWM is the peak since the process started, ramp-up
//! included). Clean-up goes through the product: the Runs are cancelled at the control plane,
//! the Worker stops each process group, completes every Run, then drains and exits.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ql_worker_core::record::State;
use ql_worker_tests::control_plane::{ReferenceControlPlane, RevisionBuilder};

use crate::procfs::{pss_kib, status_kib, supervisors_of};
use crate::table::{Table, mib_from_kib};
use crate::world::{Queued, Tunables, WorkerProcess, World, kill_leftovers, wait_until};

const MANY: usize = 256;

struct Sample {
    worker_rss: u64,
    worker_hwm: u64,
    /// (VmRSS, VmHWM) of each supervisor.
    supervisors: Vec<(u64, u64)>,
    /// PSS of the Worker and every supervisor together.
    total_pss: u64,
}

impl Sample {
    fn take(worker: u32) -> Self {
        let pids = supervisors_of(worker);
        let supervisors = pids
            .iter()
            .filter_map(|pid| Some((status_kib(*pid, "VmRSS:")?, status_kib(*pid, "VmHWM:")?)))
            .collect();
        let total_pss = std::iter::once(worker)
            .chain(pids)
            .filter_map(pss_kib)
            .sum();
        Self {
            worker_rss: status_kib(worker, "VmRSS:").unwrap_or(0),
            worker_hwm: status_kib(worker, "VmHWM:").unwrap_or(0),
            supervisors,
            total_pss,
        }
    }

    fn supervisor_max_hwm(&self) -> u64 {
        self.supervisors.iter().map(|s| s.1).max().unwrap_or(0)
    }

    fn supervisor_median_hwm(&self) -> u64 {
        let mut v: Vec<u64> = self.supervisors.iter().map(|s| s.1).collect();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    }
}

/// Steady-state activity of the Worker over a few seconds: fsync calls per second (strace -c
/// attached to the running Worker), and the control plane's requests per second by operation.
struct Activity {
    fsyncs_per_s: Option<f64>,
    requests_per_s: BTreeMap<&'static str, f64>,
}

const WINDOW: Duration = Duration::from_secs(5);

fn activity(world: &World, pid: u32, label: &str) -> Activity {
    let out = world.dir.path().join(format!("strace-c-{label}.txt"));
    let from = ReferenceControlPlane::now().get();
    let tracer = Command::new("strace")
        .args(["-c", "-f", "-e", "trace=fsync,fdatasync", "-o"])
        .arg(&out)
        .arg("-p")
        .arg(pid.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    let started = Instant::now();
    std::thread::sleep(WINDOW);
    let to = ReferenceControlPlane::now().get();
    let mut fsyncs_per_s = None;
    if let Ok(mut tracer) = tracer {
        if let Some(p) = rustix::process::Pid::from_raw(tracer.id() as i32) {
            let _ = rustix::process::kill_process(p, rustix::process::Signal::INT);
        }
        let secs = started.elapsed().as_secs_f64();
        let exited = wait_until(Duration::from_secs(20), Duration::from_millis(20), || {
            matches!(tracer.try_wait(), Ok(Some(_)))
        });
        if !exited {
            let _ = tracer.kill();
            let _ = tracer.wait();
        }
        let calls: u64 = std::fs::read_to_string(&out)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.ends_with(" fsync") || l.ends_with(" fdatasync"))
            .filter_map(|l| l.split_whitespace().nth(3)?.parse::<u64>().ok())
            .sum();
        if exited {
            fsyncs_per_s = Some(calls as f64 / secs);
        }
    }
    let secs = (to - from) as f64 / 1000.0;
    let mut requests_per_s = BTreeMap::new();
    world.cp.with_model(|m| {
        for e in m
            .request_log()
            .filter(|e| e.at.get() >= from && e.at.get() <= to)
        {
            if let Some(op) = e.operation {
                *requests_per_s.entry(op.as_str()).or_insert(0.0) += 1.0 / secs;
            }
        }
    });
    Activity {
        fsyncs_per_s,
        requests_per_s,
    }
}

fn rates(a: &Activity) -> String {
    a.requests_per_s
        .iter()
        .map(|(op, r)| format!("{op} {r:.1}/s"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn running(world: &World) -> usize {
    world
        .records()
        .iter()
        .filter(|r| r.state == State::RunningAcknowledged)
        .count()
}

fn sleeping(world: &mut World) -> Queued {
    world.enqueue(RevisionBuilder::argv("/bin/sleep", ["600"]))
}

/// Waits until `n` Runs are running (bounded), then lets a few supervision ticks pass.
fn settle_running(world: &World, worker: &mut WorkerProcess, n: usize, timeout: Duration) {
    let ok = wait_until(timeout, Duration::from_millis(250), || {
        running(world) >= n || !worker.alive()
    });
    assert!(
        ok && worker.alive(),
        "{n} Runs did not reach running_acknowledged"
    );
    std::thread::sleep(Duration::from_secs(1));
}

pub(crate) fn measure(exe: &std::path::Path, table: &mut Table) {
    let tunables = Tunables {
        cadence_ms: 100,
        max_concurrent_runs: 256,
        inbox_capacity: 512,
    };
    let mut world = World::new(tunables);
    let mut worker = world.spawn(exe, &[]);
    world.wait_ready(&mut worker);
    let pid = worker.worker_pid;

    let mut runs = vec![sleeping(&mut world)];
    settle_running(&world, &mut worker, 1, Duration::from_secs(60));
    let one = Sample::take(pid);
    let quiet = activity(&world, pid, "one");
    let ramp_started = Instant::now();
    while runs.len() < MANY {
        runs.push(sleeping(&mut world));
    }
    settle_running(&world, &mut worker, MANY, Duration::from_secs(600));
    let ramp = ramp_started.elapsed();
    let many = Sample::take(pid);
    let busy = activity(&world, pid, "many");
    eprintln!("  256 running after {ramp:?}; cancelling and draining…");
    let cleanup_started = Instant::now();

    // Clean-up through the product: cancel, let the Worker stop and complete every Run, drain.
    for run in &runs {
        let _ = world.cp.cancel_run(&run.run_id);
    }
    let completed = wait_until(Duration::from_secs(300), Duration::from_millis(250), || {
        runs.iter().all(|r| world.settled(r))
    });
    let status = worker.drain(Duration::from_secs(120));
    let clean = completed && status.is_some_and(|s| s.success());
    eprintln!("  clean-up took {:?}", cleanup_started.elapsed());
    if !clean {
        kill_leftovers(exe);
    }

    assert_eq!(one.supervisors.len(), 1, "one supervisor with one Run");
    assert_eq!(many.supervisors.len(), MANY, "one supervisor per Run");
    table.push(
        "Worker peak RSS (VmHWM), 256 vs 1 sleeping Runs",
        mib_from_kib(many.worker_hwm),
        format!("{} (1 Run)", mib_from_kib(one.worker_hwm)),
        Some(many.worker_hwm as f64 / one.worker_hwm.max(1) as f64),
        format!(
            "real binary, node profile, max_concurrent_runs 256, Runs of /bin/sleep 600, all running_acknowledged; VmRSS then {} vs {}",
            mib_from_kib(many.worker_rss),
            mib_from_kib(one.worker_rss)
        ),
    );
    table.push(
        "supervisor peak RSS (VmHWM, largest), 256 vs 1 sleeping Runs",
        mib_from_kib(many.supervisor_max_hwm()),
        format!("{} (1 Run)", mib_from_kib(one.supervisor_max_hwm())),
        Some(many.supervisor_max_hwm() as f64 / one.supervisor_max_hwm().max(1) as f64),
        format!(
            "median of the 256: {}. PSS (shared pages divided among the processes) of the Worker + all supervisors: {} with 256, {} with 1, {} per extra Run. Ramp to 256 running: {:.0} s. Clean-up {}",
            mib_from_kib(many.supervisor_median_hwm()),
            mib_from_kib(many.total_pss),
            mib_from_kib(one.total_pss),
            mib_from_kib(
                many.total_pss.saturating_sub(one.total_pss) / (MANY as u64 - 1)
            ),
            ramp.as_secs_f64(),
            if clean {
                "through the product: cancelled, stopped, completed, drained"
            } else {
                "FAILED: leftovers killed"
            }
        ),
    );
    if let (Some(q), Some(b)) = (quiet.fsyncs_per_s, busy.fsyncs_per_s) {
        table.push(
            "Worker fsyncs per second in steady state, 256 vs 1 sleeping Runs",
            format!("{b:.0}/s"),
            format!("{q:.0}/s (1 Run)"),
            Some(b / q.max(0.001)),
            format!(
                "strace -c attached for {}s, cadence 100 ms. Requests with 256: {}; with 1: {}. Every supervision of a running Run is a lease-control round trip whose renewed lease is persisted (2 fsyncs) before anything else; every Pull writes and clears the pending claim (3)",
                WINDOW.as_secs(),
                rates(&busy),
                rates(&quiet)
            ),
        );
    }
}
