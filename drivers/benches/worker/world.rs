//! One world: the loopback reference control plane (TLS 1.3, mutual authentication, fresh
//! certificates) in this process, a private state root on the disk under `target/tmp`, a
//! configuration, and the real `ql-worker run` as a child process.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use ql_worker::config::{Config, ProcessEnvironment};
use ql_worker::journal::InboxView;
use ql_worker_core::ids::{AttemptId, OfferId, RunId};
use ql_worker_core::listing::PageLimit;
use ql_worker_core::record::InboxRecord;
use ql_worker_core::wire::route::Operation;
use ql_worker_tests::control_plane::{
    ReferenceControlPlane, ReferenceOptions, RevisionBuilder, RunEventKind, RunSpec,
};

use crate::procfs;

/// The Worker's tunables for one world.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Tunables {
    pub(crate) cadence_ms: u64,
    pub(crate) max_concurrent_runs: u16,
    pub(crate) inbox_capacity: u32,
}

impl Tunables {
    /// One Run at a time at the fastest cadence the configuration allows (100 ms), so tick
    /// waits stay small and no Pull interleaves with a lifecycle (a Worker with no free slot
    /// does not Pull).
    pub(crate) const SEQUENTIAL: Self = Self {
        cadence_ms: 100,
        max_concurrent_runs: 1,
        inbox_capacity: 256,
    };
}

/// A fresh directory on the same disk as `target/` (never tmpfs, so fsyncs cost what they cost).
pub(crate) fn scratch(prefix: &str) -> tempfile::TempDir {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR"));
    std::fs::create_dir_all(base).expect("target tmp dir");
    tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(base)
        .expect("scratch dir")
}

/// Waits (bounded) until `done` holds; false on timeout.
pub(crate) fn wait_until(
    timeout: Duration,
    poll: Duration,
    mut done: impl FnMut() -> bool,
) -> bool {
    let start = Instant::now();
    loop {
        if done() {
            return true;
        }
        if start.elapsed() > timeout {
            return false;
        }
        std::thread::sleep(poll);
    }
}

/// What one look at a Run found (see [`World::progress`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Progress {
    /// The control plane handed the offer to the Worker: its model holds the Run's `Claimed`
    /// event (recorded while it answers the Pull that claimed it).
    pub(crate) claimed: bool,
    /// [`World::settled`].
    pub(crate) settled: bool,
}

/// A Run this world enqueued.
#[derive(Clone, Debug)]
pub(crate) struct Queued {
    pub(crate) run_id: RunId,
    pub(crate) attempt_id: AttemptId,
}

pub(crate) struct World {
    pub(crate) cp: ReferenceControlPlane,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) config_path: PathBuf,
    pub(crate) config: Config,
    next_run: u32,
}

impl World {
    pub(crate) fn new(tunables: Tunables) -> Self {
        Self::with_config(
            "node",
            &format!(
                "timeout_ms = 10000\n\n[limits]\ncadence_ms = {}\nmax_concurrent_runs = {}\n\
                 inbox_capacity = {}\nsession_lease_ms = 30000\nlog_quota_bytes = 65536\n\
                 log_reserve_bytes = 0\ndrain_budget_ms = 60000\n",
                tunables.cadence_ms, tunables.max_concurrent_runs, tunables.inbox_capacity,
            ),
        )
    }

    /// A world whose Worker runs `profile` ("edge" or "node") with all its defaults: only the
    /// state root, the control plane's settings and, when given, `max_concurrent_runs` are
    /// written.
    pub(crate) fn with_profile(profile: &str, max_concurrent_runs: Option<u16>) -> Self {
        let limits = max_concurrent_runs.map_or_else(String::new, |n| {
            format!("\n[limits]\nmax_concurrent_runs = {n}\n")
        });
        Self::with_config(profile, &limits)
    }

    /// A world with a fresh control plane and state root; `tail` gives what follows the
    /// `[control_plane]` section's connection settings (more of that section, then others).
    pub(crate) fn with_config(profile: &str, tail: &str) -> Self {
        let dir = scratch("ql-bench-worker-");
        let cp = ReferenceControlPlane::start(ReferenceOptions::default()).expect("control plane");
        let s = cp.worker_settings();
        let root = dir.path().join("state");
        let text = format!(
            "profile = \"{profile}\"\nworker_id = \"{}\"\nroot = \"{}\"\n\n[control_plane]\n\
             origin = \"{}\"\ntrust_anchors = [\"{}\"]\nclient_certificate = \"{}\"\n\
             client_key = \"{}\"\ncredential_file = \"{}\"\n{}",
            s.worker_id,
            root.display(),
            s.origin,
            s.ca_cert.display(),
            s.client_cert.display(),
            s.client_key.display(),
            s.credential_file.display(),
            tail,
        );
        let config_path = dir.path().join("ql-worker.toml");
        std::fs::write(&config_path, text).expect("config");
        let config = Config::load(&config_path, &ProcessEnvironment).expect("valid config");
        Self {
            cp,
            dir,
            config_path,
            config,
            next_run: 0,
        }
    }

    pub(crate) fn root(&self) -> &Path {
        &self.config.root
    }

    /// Enqueues one Run of `builder`'s revision.
    pub(crate) fn enqueue(&mut self, builder: RevisionBuilder) -> Queued {
        self.next_run += 1;
        let spec = RunSpec::numbered(self.next_run, builder.build().expect("revision"));
        let attempt_id = spec.attempt_id.clone();
        let run_id = self.cp.enqueue_run(spec).expect("enqueue");
        Queued { run_id, attempt_id }
    }

    /// A `/bin/true` Run.
    pub(crate) fn enqueue_true(&mut self) -> Queued {
        self.enqueue(RevisionBuilder::argv("/bin/true", Vec::<String>::new()))
    }

    /// The lifecycle is over: the control plane applied the completion and the Worker removed
    /// the receipt (its last step, after `completion_acknowledged` is durable).
    pub(crate) fn settled(&self, run: &Queued) -> bool {
        self.progress(run).settled
    }

    /// Where `run` is, from one look at the control plane's model and the receipt file.
    pub(crate) fn progress(&self, run: &Queued) -> Progress {
        let record = self.cp.run(&run.run_id);
        let claimed = record.as_ref().is_some_and(|r| {
            r.events
                .iter()
                .any(|e| matches!(e.kind, RunEventKind::Claimed { .. }))
        });
        let settled = record.is_some_and(|r| r.completion.is_some())
            && !ql_worker::layout::Paths::new(self.root())
                .receipt(&run.attempt_id)
                .exists();
        Progress { claimed, settled }
    }

    /// Whether the Worker has registered and pulled at least once.
    pub(crate) fn pulled_once(&self) -> bool {
        self.cp.with_model(|m| {
            m.request_log()
                .any(|e| e.operation == Some(Operation::Offers))
        })
    }

    /// Every record of the inbox (read-only view, every file check).
    pub(crate) fn records(&self) -> Vec<InboxRecord> {
        let mut out = Vec::new();
        let Ok(Some(view)) = InboxView::open(self.root()) else {
            return out;
        };
        let mut after: Option<OfferId> = None;
        loop {
            let Ok(page) = view.list(after.as_ref(), PageLimit::new(64).expect("page")) else {
                return out;
            };
            for id in &page.offer_ids {
                if let Ok(Some(record)) = view.read(id) {
                    out.push(record);
                }
            }
            match page.next_after {
                Some(next) => after = Some(next),
                None => return out,
            }
        }
    }

    /// Starts `ql-worker run --config …`, optionally under a wrapper (`strace …`).
    pub(crate) fn spawn(&self, exe: &Path, wrapper: &[OsString]) -> WorkerProcess {
        let mut command = match wrapper.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(exe);
                c
            }
            None => Command::new(exe),
        };
        command
            .arg("run")
            .arg("--config")
            .arg(&self.config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = command.spawn().expect("spawn the Worker");
        let wrapped = !wrapper.is_empty();
        let direct = child.id();
        let mut process = WorkerProcess {
            child,
            root: self.root().to_path_buf(),
            worker_pid: direct,
            exe: exe.to_path_buf(),
        };
        if wrapped {
            // The Worker is the wrapper's child once it has executed our binary.
            let found = wait_until(Duration::from_secs(30), Duration::from_millis(5), || {
                procfs::children_of(direct)
                    .into_iter()
                    .find(|pid| procfs::runs_exe(*pid, exe))
                    .map(|pid| process.worker_pid = pid)
                    .is_some()
            });
            assert!(found, "the wrapped Worker never started");
        }
        process
    }

    /// Waits (bounded) until the Worker registered and pulled.
    pub(crate) fn wait_ready(&self, process: &mut WorkerProcess) {
        let ready = wait_until(Duration::from_secs(60), Duration::from_millis(10), || {
            self.pulled_once() || !process.alive()
        });
        assert!(
            ready && process.alive(),
            "the Worker did not register and pull"
        );
    }
}

/// The Worker child process. Dropping it without a drain kills it (and nothing else: the
/// supervisors it started belong to their Runs).
pub(crate) struct WorkerProcess {
    child: Child,
    root: PathBuf,
    pub(crate) worker_pid: u32,
    exe: PathBuf,
}

impl WorkerProcess {
    pub(crate) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Asks for a drain (`<root>/drain`, as `ql-worker drain` does) and waits (bounded) for the
    /// exit; kills it when the bound passes.
    pub(crate) fn drain(mut self, timeout: Duration) -> Option<ExitStatus> {
        let _ = ql_worker::runtime::request_drain(&self.root);
        let start = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if start.elapsed() > timeout {
                self.kill();
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(&mut self) {
        if self.worker_pid != self.child.id()
            && procfs::runs_exe(self.worker_pid, &self.exe)
            && let Some(pid) = rustix::process::Pid::from_raw(self.worker_pid as i32)
        {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        if self.alive() {
            self.kill();
        }
    }
}

/// Safety net: SIGKILL every process still running this run's private binary (a Worker or a
/// supervisor this benchmark started), after its children (the Runs' user processes).
pub(crate) fn kill_leftovers(exe: &Path) {
    let kill = |pid: u32| {
        if let Some(pid) = rustix::process::Pid::from_raw(pid as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::KILL);
        }
    };
    for pid in procfs::running_exe(exe) {
        for child in procfs::children_of(pid) {
            if !procfs::runs_exe(child, exe) {
                kill(child);
            }
        }
        kill(pid);
    }
}
