//! Peak RSS of the Worker and of each supervisor with 1 and with 256 concurrent sleeping Runs:
//! the real binary (`ql-worker run`, node profile, 256 concurrent Runs, inbox capacity 512)
//! against the loopback reference control plane, Runs of `/bin/sleep 600`. Measured once every
//! Run is `running_acknowledged` (VmHWM is the peak since the process started, ramp-up
//! included). Clean-up goes through the product: the Runs are cancelled at the control plane,
//! the Worker stops each process group, completes every Run, then drains and exits.

use std::time::Duration;

use ql_worker_core::record::State;
use ql_worker_tests::control_plane::RevisionBuilder;

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
    let ramp_started = std::time::Instant::now();
    while runs.len() < MANY {
        runs.push(sleeping(&mut world));
    }
    settle_running(&world, &mut worker, MANY, Duration::from_secs(600));
    let ramp = ramp_started.elapsed();
    let many = Sample::take(pid);
    eprintln!("  256 running after {ramp:?}; cancelling and draining…");
    let cleanup_started = std::time::Instant::now();

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
}
