//! `ql-worker demo`: the real Worker end to end against the embedded loopback reference control
//! plane — real files under a fresh private state root, real supervisor and user processes,
//! real TLS 1.3 with mutual authentication and freshly generated certificates.
//!
//! Five sample Runs: a success, a non-zero exit, one with a Secret environment value, one whose
//! log exceeds the quota, and one the control plane times out. Each Run's lifecycle is printed
//! as it happens; a final table shows what the control plane stored. Exit 0 only if every Run
//! ended as expected.
//!
//! Everything the demo creates lives in one directory: a temporary one (0700), removed when the
//! demo ends however it ends, or the new `--keep` directory (0700, files 0600, whatever the
//! umask): `pki/` (the CA, the client and server certificates and keys, the credential),
//! `ql-worker.toml` and the state root `state/`. SIGINT, SIGTERM and SIGHUP are caught from the
//! start: the first drains (no new Run; every running one settles or the drain budget ends), a
//! second stops at once; either way the user processes still running are stopped and their
//! supervisors waited for before the directory is removed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ql_worker_core::ids::{ProjectId, RunId};
use ql_worker_core::record::State;
use ql_worker_core::wire::activation::RunStatus;
use ql_worker_tests::control_plane::{
    ReferenceControlPlane, ReferenceOptions, RevisionBuilder, RunSpec,
};
use ql_worker_tests::pki::TestPki;

use crate::cli::{EXIT_DEMO_FAILED, EXIT_OK, EXIT_OUTPUT};
use crate::config::{Config, ProcessEnvironment};
use crate::host::Event;
use crate::runtime::{RunExit, Runner, Signals};

/// Log quota of the demo Worker (the smallest the launcher accepts), so one Run overflows it.
pub const DEMO_LOG_QUOTA: u64 = 64 * 1024;
const SECRET_VALUE: &str = "s3cr3t-demo-value-7f3a";

/// Options of `ql-worker demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Keep everything in this new directory (created 0700; files 0600): `pki/` (CA, client and
    /// server certificates and keys, credential), `ql-worker.toml` and the state root `state/`.
    /// Default: a temporary directory removed at the end, however the demo ends.
    #[arg(long, value_name = "DIR")]
    pub keep: Option<PathBuf>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout_secs: u64,
    /// Add a sixth sample that runs this many seconds (1..=600), to try a drain while it runs:
    /// Ctrl-C waits for it (within the drain budget of 20 s), a second Ctrl-C stops it.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..=600))]
    pub hold_secs: Option<u64>,
}

/// What one sample Run must end as.
#[derive(Clone, Debug)]
pub struct Expected {
    /// Name shown in the output.
    pub name: &'static str,
    /// Run id at the control plane.
    pub run_id: RunId,
    /// Final Run status at the control plane.
    pub status: RunStatus,
    /// Exit code reported by the Worker.
    pub exit_code: u8,
    /// Truncation reported with the log.
    pub truncated: Option<bool>,
}

/// Writes the Worker's configuration for `cp` into `dir` and loads it through the normal path.
///
/// # Errors
/// I/O or configuration errors, as text.
pub fn write_config(
    cp: &ReferenceControlPlane,
    dir: &Path,
    cadence_ms: u64,
) -> Result<Config, String> {
    let s = cp.worker_settings();
    let root = dir.join("state");
    let text = format!(
        "profile = \"node\"\nworker_id = \"{}\"\nroot = \"{}\"\n\n[control_plane]\norigin = \"{}\"\n\
         trust_anchors = [\"{}\"]\nclient_certificate = \"{}\"\nclient_key = \"{}\"\n\
         credential_file = \"{}\"\ntimeout_ms = 5000\n\n[limits]\ncadence_ms = {cadence_ms}\n\
         max_concurrent_runs = 8\nsession_lease_ms = 30000\nlog_quota_bytes = {DEMO_LOG_QUOTA}\n\
         log_reserve_bytes = 0\ndrain_budget_ms = 20000\nlease_control_interval_ms = 300\n",
        s.worker_id,
        root.display(),
        s.origin,
        s.ca_cert.display(),
        s.client_cert.display(),
        s.client_key.display(),
        s.credential_file.display(),
    );
    let path = dir.join("ql-worker.toml");
    // 0600 whatever the umask: the Worker refuses a configuration file others could write.
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut file| file.write_all(text.as_bytes()))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    Config::load(&path, &ProcessEnvironment).map_err(|e| e.to_string())
}

/// Enqueues the five sample Runs.
///
/// # Errors
/// A revision or queue error, as text.
pub fn enqueue_samples(cp: &ReferenceControlPlane) -> Result<Vec<Expected>, String> {
    let project = ProjectId::new("project-1").map_err(|e| e.to_string())?;
    let secret = cp
        .set_secret(&project, "DEMO_TOKEN", SECRET_VALUE)
        .map_err(|e| e.to_string())?;
    let samples = [
        (
            "success",
            RevisionBuilder::shell("echo hello from ql-worker"),
            RunStatus::Succeeded,
            0,
            Some(false),
        ),
        (
            "exit 3",
            RevisionBuilder::shell("echo about to fail >&2; exit 3"),
            RunStatus::Failed,
            3,
            Some(false),
        ),
        (
            "secret env",
            RevisionBuilder::shell(
                "test -n \"$DEMO_TOKEN\" && echo \"the secret has ${#DEMO_TOKEN} characters\"",
            )
            .secret_env("DEMO_TOKEN", &secret),
            RunStatus::Succeeded,
            0,
            Some(false),
        ),
        (
            "log over quota",
            RevisionBuilder::shell("head -c 200000 /dev/zero | tr '\\0' x"),
            RunStatus::Succeeded,
            0,
            Some(true),
        ),
        (
            "timeout",
            RevisionBuilder::shell("sleep 30").timeout_ms(1_500),
            RunStatus::TimedOut,
            143,
            Some(false),
        ),
    ];
    let mut expected = Vec::new();
    for (n, (name, builder, status, exit_code, truncated)) in samples.into_iter().enumerate() {
        let revision = builder.build().map_err(|e| e.to_string())?;
        let spec = RunSpec::numbered(u32::try_from(n + 1).unwrap_or(0), revision);
        let run_id = cp.enqueue_run(spec).map_err(|e| e.to_string())?;
        expected.push(Expected {
            name,
            run_id,
            status,
            exit_code,
            truncated,
        });
    }
    Ok(expected)
}

/// Enqueues the `--hold-secs` sample: a Run that sleeps `secs` seconds, numbered `n`.
///
/// # Errors
/// A revision or queue error, as text.
pub fn enqueue_hold(cp: &ReferenceControlPlane, secs: u64, n: usize) -> Result<Expected, String> {
    let revision = RevisionBuilder::shell(&format!("echo holding for {secs} s; sleep {secs}"))
        .build()
        .map_err(|e| e.to_string())?;
    let spec = RunSpec::numbered(u32::try_from(n).unwrap_or(0), revision);
    let run_id = cp.enqueue_run(spec).map_err(|e| e.to_string())?;
    Ok(Expected {
        name: "hold",
        run_id,
        status: RunStatus::Succeeded,
        exit_code: 0,
        truncated: Some(false),
    })
}

/// Lifecycles as they happen: Run id → states persisted so far.
pub type Lifecycles = Arc<Mutex<BTreeMap<RunId, Vec<State>>>>;

/// An observer that records (and optionally prints) each Run's states, and raises `signals`
/// once `total` Runs are settled (so the Worker drains and stops).
pub fn lifecycle_observer(
    lifecycles: Lifecycles,
    total: usize,
    signals: Signals,
    print: bool,
) -> Box<dyn FnMut(&Event<'_>)> {
    Box::new(move |event| {
        let Event::Persisted(record) = event else {
            return;
        };
        let Ok(mut map) = lifecycles.lock() else {
            return;
        };
        let run = record.offer.candidate.run_id.clone();
        let states = map.entry(run.clone()).or_default();
        if states.last() != Some(&record.state) {
            states.push(record.state);
            if print {
                let reason = record
                    .recovery()
                    .map(|r| format!("({r})"))
                    .unwrap_or_default();
                say(&format!("  {:<8} {}{reason}", run.as_str(), record.state));
            }
        }
        let settled = map
            .values()
            .filter(|s| s.last().is_some_and(|st| st.is_terminal()))
            .count();
        if settled == total && signals.seen() == 0 {
            signals.raise();
        }
    })
}

/// Set once a write to stdout failed; the demo goes on (it still cleans up) and exits 1.
static STDOUT_FAILED: AtomicBool = AtomicBool::new(false);

/// One line on stdout; a failure is remembered, never a panic.
fn say(line: &str) {
    let mut out = std::io::stdout().lock();
    if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
        STDOUT_FAILED.store(true, Ordering::SeqCst);
    }
}

/// Runs the demo.
#[must_use]
pub fn main(args: &DemoArgs) -> ExitCode {
    let result = run(args);
    let failed_output = STDOUT_FAILED.load(Ordering::SeqCst);
    match result {
        Err(e) => {
            let _ = writeln!(std::io::stderr().lock(), "ql-worker demo: {e}");
            ExitCode::from(EXIT_DEMO_FAILED)
        }
        Ok(_) if failed_output => {
            let _ = writeln!(
                std::io::stderr().lock(),
                "ql-worker demo: the output could not be written to stdout (the demo ran and \
                 cleaned up)"
            );
            ExitCode::from(EXIT_OUTPUT)
        }
        Ok(true) => ExitCode::from(EXIT_OK),
        Ok(false) => ExitCode::from(EXIT_DEMO_FAILED),
    }
}

/// The demo's directory: a new `--keep` directory (0700 whatever the umask) or a temporary one,
/// removed when this value drops.
enum DemoDir {
    Kept(PathBuf),
    Temporary(tempfile::TempDir),
}

impl DemoDir {
    fn create(keep: Option<&Path>) -> Result<Self, String> {
        match keep {
            Some(dir) => {
                std::fs::DirBuilder::new()
                    .mode(0o700)
                    .create(dir)
                    .and_then(|()| {
                        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                    })
                    .map_err(|e| {
                        format!(
                            "--keep {}: {e} (give a directory that does not exist yet)",
                            dir.display()
                        )
                    })?;
                Ok(Self::Kept(dir.to_path_buf()))
            }
            None => tempfile::Builder::new()
                .prefix("ql-worker-demo-")
                .tempdir()
                .map(Self::Temporary)
                .map_err(|e| format!("temporary directory: {e}")),
        }
    }

    fn path(&self) -> &Path {
        match self {
            Self::Kept(dir) => dir,
            Self::Temporary(temp) => temp.path(),
        }
    }
}

fn run(args: &DemoArgs) -> Result<bool, String> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
    // Before anything is created: no signal can kill the demo and leave its files behind.
    let signals = Signals::install_with(&[SIGINT, SIGTERM, SIGHUP], &[SIGUSR1, SIGUSR2])
        .map_err(|e| format!("cannot install signal handlers: {e}"))?;
    let dir = DemoDir::create(args.keep.as_deref())?;
    let outcome = run_in(args, dir.path(), &signals);
    if let DemoDir::Kept(keep) = &dir {
        say(&format!(
            "kept: {} (pki/, ql-worker.toml, state/; try `ql-worker inbox list --root {}`)",
            keep.display(),
            keep.join("state").display()
        ));
    }
    drop(dir);
    outcome
}

fn run_in(args: &DemoArgs, dir: &Path, signals: &Signals) -> Result<bool, String> {
    say("ql-worker demo: loopback control plane with fresh certificates (TLS 1.3, mutual auth)");
    let pki = TestPki::generate(&dir.join("pki")).map_err(|e| format!("certificates: {e}"))?;
    let cp = ReferenceControlPlane::start_with_pki(pki, ReferenceOptions::default())
        .map_err(|e| format!("control plane: {e}"))?;
    let config = write_config(&cp, dir, 200)?;
    say(&format!(
        "  control plane {} · state root {}",
        cp.origin(),
        config.root.display()
    ));
    let mut expected = enqueue_samples(&cp)?;
    if let Some(secs) = args.hold_secs {
        expected.push(enqueue_hold(&cp, secs, expected.len() + 1)?);
    }
    for e in &expected {
        say(&format!("  queued {:<8} {}", e.run_id.as_str(), e.name));
    }
    let lifecycles: Lifecycles = Arc::default();
    let mut runner = Runner::start(&config, signals.clone()).map_err(|e| e.to_string())?;
    runner.observe(lifecycle_observer(
        Arc::clone(&lifecycles),
        expected.len(),
        signals.clone(),
        true,
    ));
    say("lifecycles, as they happen (Ctrl-C drains; a second Ctrl-C stops at once):");
    let started = Instant::now();
    let deadline = Duration::from_secs(args.timeout_secs);
    let watchdog = signals.clone();
    std::thread::spawn(move || {
        std::thread::sleep(deadline);
        watchdog.raise();
        watchdog.raise();
    });
    let exit = runner.run();
    let elapsed = started.elapsed();
    let left = stop_user_processes(&mut runner, Duration::from_secs(10));
    if left > 0 {
        say(&format!(
            "  {left} supervisor(s) did not exit within 10 s after their user processes were \
             stopped"
        ));
    }
    let ok = report(&cp, &expected, &lifecycles, &config)?;
    let drained = matches!(exit, RunExit::Drained);
    let how = match &exit {
        RunExit::Drained => String::from("drained"),
        RunExit::Unsettled => String::from("drained with records left unsettled"),
        RunExit::NotRegistered => String::from("drained before the Session was registered"),
        RunExit::Interrupted => String::from("stopped by a second signal (or the timeout)"),
        RunExit::Halted(reason) => format!("halted: {reason}"),
        RunExit::Fatal(detail) | RunExit::Unusable(detail) => format!("stopped: {detail}"),
    };
    say(&format!(
        "worker: {how} after {:.1} s",
        elapsed.as_secs_f64()
    ));
    Ok(ok && drained)
}

/// Stops what this demo's supervisors still run (after a second signal, the timeout or an
/// ended drain budget) and waits for the supervisors to exit, so nothing outlives the demo or
/// writes into its directory after it is removed. Each user command runs in its own process
/// group as a supervisor's child: that group gets SIGTERM, then SIGKILL after a second.
/// Returns how many supervisors were still running at `wait`.
fn stop_user_processes(runner: &mut Runner, wait: Duration) -> usize {
    use rustix::process::{Pid, Signal, kill_process_group};
    let start = Instant::now();
    loop {
        let supervisors = runner.supervisors();
        if supervisors.is_empty() {
            return 0;
        }
        if start.elapsed() >= wait {
            return supervisors.len();
        }
        let signal = if start.elapsed() < Duration::from_secs(1) {
            Signal::TERM
        } else {
            Signal::KILL
        };
        for group in children_of(&supervisors) {
            if let Some(pgid) = i32::try_from(group).ok().and_then(Pid::from_raw) {
                let _ = kill_process_group(pgid, signal);
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pids whose parent is one of `parents` (from `/proc/<pid>/stat`).
fn children_of(parents: &[u32]) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut children = Vec::new();
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`; comm may hold spaces and parentheses.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        if ppid.is_some_and(|p| parents.contains(&p)) {
            children.push(pid);
        }
    }
    children
}

/// Prints the lifecycles and the final table; true when every Run ended as expected.
///
/// # Errors
/// Never in practice (formatting), as text.
pub fn report(
    cp: &ReferenceControlPlane,
    expected: &[Expected],
    lifecycles: &Lifecycles,
    config: &Config,
) -> Result<bool, String> {
    let map = lifecycles
        .lock()
        .map_err(|_| String::from("lifecycle lock poisoned"))?
        .clone();
    say("\nlifecycles:");
    for e in expected {
        let chain: Vec<&str> = map
            .get(&e.run_id)
            .map(|s| s.iter().map(|st| st.as_str()).collect())
            .unwrap_or_default();
        say(&format!("  {:<8} {}", e.run_id.as_str(), chain.join(" → ")));
    }
    let mut table = String::new();
    let _ = writeln!(
        table,
        "\n{:<8} {:<15} {:<24} {:<10} {:>5} {:>9} {:<14} {:<9} OK",
        "RUN", "SAMPLE", "WORKER STATE", "CP STATUS", "EXIT", "LOG BYTES", "SHA-256", "TRUNC"
    );
    let mut all_ok = true;
    for e in expected {
        let state = map.get(&e.run_id).and_then(|s| s.last().copied());
        let run = cp.run(&e.run_id);
        let completion = run.as_ref().and_then(|r| r.completion.clone());
        let status = run.as_ref().map(|r| r.run_status);
        let exit = completion.as_ref().map(|c| c.result.exit_code);
        let artifact = completion.as_ref().map(|c| c.artifact.clone());
        let bytes = artifact.as_ref().map(|a| a.byte_length);
        let sha = artifact
            .as_ref()
            .map(|a| a.sha256.to_hex()[..12].to_string())
            .unwrap_or_else(|| String::from("-"));
        let truncated = artifact.as_ref().map(|a| a.truncated);
        let secret_leaked = cp.with_model(|m| {
            m.artifacts_of(&e.run_id).iter().any(|(_, a)| {
                a.head
                    .windows(SECRET_VALUE.len())
                    .any(|w| w == SECRET_VALUE.as_bytes())
            })
        });
        let ok = state == Some(State::CompletionAcknowledged)
            && status == Some(e.status)
            && exit == Some(e.exit_code)
            && truncated == Some(e.truncated)
            && (e.truncated != Some(true)
                || bytes == Some(config.limits.spool.maximum_attempt_bytes))
            && !secret_leaked;
        all_ok &= ok;
        let _ = writeln!(
            table,
            "{:<8} {:<15} {:<24} {:<10} {:>5} {:>9} {:<14} {:<9} {}",
            e.run_id.as_str(),
            e.name,
            state.map_or("-", State::as_str),
            status.map_or("-", |s| s.as_str()),
            exit.map_or_else(|| String::from("-"), |c| c.to_string()),
            bytes.map_or_else(|| String::from("-"), |b| b.to_string()),
            sha,
            truncated.map_or("-", |t| t.map_or("unknown", |t| if t {
                "true"
            } else {
                "false"
            })),
            if ok { "yes" } else { "NO" },
        );
    }
    say(table.trim_end_matches('\n'));
    say(&format!(
        "\n{}",
        if all_ok {
            "every Run ended as expected"
        } else {
            "some Run did NOT end as expected"
        }
    ));
    Ok(all_ok)
}
