//! `ql-worker demo`: the real Worker end to end against the embedded loopback reference control
//! plane — real files under a fresh private state root, real supervisor and user processes,
//! real TLS 1.3 with mutual authentication and freshly generated certificates.
//!
//! Five sample Runs: a success, a non-zero exit, one with a Secret environment value, one whose
//! log exceeds the quota, and one the control plane times out. Each Run's lifecycle is printed
//! as it happens; a final table shows what the control plane stored. Exit 0 only if every Run
//! ended as expected.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ql_worker_core::ids::{ProjectId, RunId};
use ql_worker_core::record::State;
use ql_worker_core::wire::activation::RunStatus;
use ql_worker_tests::control_plane::{
    ReferenceControlPlane, ReferenceOptions, RevisionBuilder, RunSpec,
};

use crate::cli::{EXIT_DEMO_FAILED, EXIT_OK};
use crate::config::{Config, ProcessEnvironment};
use crate::host::Event;
use crate::runtime::{RunExit, Runner, Signals};

/// Log quota of the demo Worker (the smallest the launcher accepts), so one Run overflows it.
pub const DEMO_LOG_QUOTA: u64 = 64 * 1024;
const SECRET_VALUE: &str = "s3cr3t-demo-value-7f3a";

/// Options of `ql-worker demo`.
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
    /// Keep the state root, certificates and configuration in this new directory (default: a
    /// temporary directory removed at the end).
    #[arg(long, value_name = "DIR")]
    pub keep: Option<PathBuf>,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 60)]
    pub timeout_secs: u64,
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
         log_reserve_bytes = 0\ndrain_budget_ms = 20000\n",
        s.worker_id,
        root.display(),
        s.origin,
        s.ca_cert.display(),
        s.client_cert.display(),
        s.client_key.display(),
        s.credential_file.display(),
    );
    let path = dir.join("ql-worker.toml");
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
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
                println!("  {run:<8} {}{reason}", record.state);
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

/// Runs the demo.
#[must_use]
pub fn main(args: &DemoArgs) -> ExitCode {
    match run(args) {
        Ok(true) => ExitCode::from(EXIT_OK),
        Ok(false) => ExitCode::from(EXIT_DEMO_FAILED),
        Err(e) => {
            eprintln!("ql-worker demo: {e}");
            ExitCode::from(EXIT_DEMO_FAILED)
        }
    }
}

fn run(args: &DemoArgs) -> Result<bool, String> {
    let temp;
    let dir = match &args.keep {
        Some(dir) => {
            std::fs::create_dir(dir)
                .map_err(|e| format!("--keep {}: {e} (give a new directory)", dir.display()))?;
            dir.clone()
        }
        None => {
            temp = tempfile::tempdir().map_err(|e| e.to_string())?;
            temp.path().to_path_buf()
        }
    };
    println!(
        "ql-worker demo: loopback control plane with fresh certificates (TLS 1.3, mutual auth)"
    );
    let cp = ReferenceControlPlane::start(ReferenceOptions::default())
        .map_err(|e| format!("control plane: {e}"))?;
    let config = write_config(&cp, &dir, 200)?;
    println!(
        "  control plane {} · state root {}",
        cp.origin(),
        config.root.display()
    );
    let expected = enqueue_samples(&cp)?;
    for e in &expected {
        println!("  queued {:<8} {}", e.run_id, e.name);
    }
    let signals = Signals::default();
    let lifecycles: Lifecycles = Arc::default();
    let mut runner = Runner::start(&config, signals.clone()).map_err(|e| e.to_string())?;
    runner.observe(lifecycle_observer(
        Arc::clone(&lifecycles),
        expected.len(),
        signals.clone(),
        true,
    ));
    println!("lifecycles, as they happen:");
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
    let ok = report(&cp, &expected, &lifecycles, &config)?;
    let drained = matches!(exit, RunExit::Drained);
    println!("worker: {exit:?} after {:.1} s", elapsed.as_secs_f64());
    if let Some(keep) = &args.keep {
        println!(
            "kept: {} (try `ql-worker inbox list --root {}`)",
            keep.display(),
            config.root.display()
        );
    }
    Ok(ok && drained)
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
    println!("\nlifecycles:");
    for e in expected {
        let chain: Vec<&str> = map
            .get(&e.run_id)
            .map(|s| s.iter().map(|st| st.as_str()).collect())
            .unwrap_or_default();
        println!("  {:<8} {}", e.run_id, chain.join(" → "));
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
    print!("{table}");
    println!(
        "\n{}",
        if all_ok {
            "every Run ended as expected"
        } else {
            "some Run did NOT end as expected"
        }
    );
    Ok(all_ok)
}
