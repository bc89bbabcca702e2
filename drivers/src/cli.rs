//! The `ql-worker` command line: `init`, `run`, `drain`, `inbox`, `recover`, `demo`.
//!
//! Exit codes (also in `--help` and `docs/operations.md`):
//! 0 success · 2 usage or configuration error · 3 state root unusable (unsafe storage, another
//! owner) · 4 stopped with unsettled records (drain budget, second signal) · 5 halted on a fact
//! it cannot continue from (see the message) · 6 `recover` found `recovery_required` records ·
//! 7 `demo`: a Run did not end as expected.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use ql_worker_core::ids::OfferId;
use ql_worker_core::listing::PageLimit;
use ql_worker_core::record::{InboxRecord, RecoveryReason, State};

use crate::config::{Config, ProcessEnvironment};
use crate::journal::{InboxView, Journal};
use crate::runtime::{RunExit, Runner, Signals};

/// Exit: success.
pub const EXIT_OK: u8 = 0;
/// Exit: usage or configuration error.
pub const EXIT_CONFIG: u8 = 2;
/// Exit: the state root is unusable.
pub const EXIT_STORAGE: u8 = 3;
/// Exit: stopped with unsettled records.
pub const EXIT_UNSETTLED: u8 = 4;
/// Exit: halted.
pub const EXIT_HALTED: u8 = 5;
/// Exit: recovery evidence present.
pub const EXIT_RECOVERY: u8 = 6;
/// Exit: the demo failed.
pub const EXIT_DEMO_FAILED: u8 = 7;

const EXIT_CODES: &str = "\
Exit codes:
  0  success (for `run`: drained, every record settled, Session offline)
  2  usage or configuration error (the message names the file, field and rule)
  3  state root unusable: unsafe storage (symlink, mode, owner, foreign entry) or another owner
  4  stopped with unsettled records (drain budget ended, or a second signal); they resume at the next start
  5  halted on a fact it cannot continue from (fsync failed, Session fenced, credentials rejected...)
  6  `recover`: recovery_required records are present (the Worker takes no new work)
  7  `demo`: a Run did not end as expected";

/// ql-worker: the Qinglong 3 remote Worker runtime.
///
/// Pulls task Runs from a Qinglong control plane over mutual-TLS 1.3, runs each under its own
/// supervisor, uploads the log, then reports completion. A Run is never executed twice because
/// of a crash; a start failure is reported only with proof that nothing started; the completion
/// capability and Secret values never touch the disk.
#[derive(Debug, Parser)]
#[command(name = "ql-worker", version, after_help = EXIT_CODES)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the private state root (0700 directories, owner lock) and check its permissions.
    ///
    /// Refuses a root that is a symlink, not owned by this user, or readable by group/other.
    /// With `--config`, also prepares containment: resolves `[run_as]`, checks the Worker may
    /// switch to it, creates the runs area, finds a delegated cgroup. Without `[run_as]` it warns
    /// that Runs share the Worker's identity.
    Init {
        /// Absolute path of the state root (inbox, receipts, log spool).
        #[arg(long, value_name = "DIR", required_unless_present = "config")]
        root: Option<PathBuf>,
        /// The Worker's configuration (its `root`, and its containment tables).
        #[arg(long, value_name = "FILE", conflicts_with = "root")]
        config: Option<PathBuf>,
    },
    /// Run the Worker: register the Session, reconcile the inbox, then supervise and pull.
    ///
    /// The first SIGTERM/SIGINT (or `ql-worker drain`) drains: no new work, every record is
    /// settled or the drain budget ends, then the Session goes offline. A second signal stops at
    /// once; unsettled records resume at the next start.
    Run {
        /// The TOML configuration (see docs/ql-worker.example.toml).
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Ask the running Worker of a state root to drain (writes `<root>/drain`).
    ///
    /// Equivalent to sending SIGTERM to the Worker process.
    Drain(#[command(flatten)] RootArgs),
    /// Inspect the inbox (read-only; works while a Worker runs). Capabilities are redacted.
    Inbox {
        #[command(subcommand)]
        command: InboxCommand,
    },
    /// List recovery_required records with their reason and what an operator can do, and
    /// dormant records (nothing ran, lease expired: they can never start).
    ///
    /// Read-only. `--archive OFFER_ID` moves one reviewed recovery_required or dormant record
    /// out of the inbox (the Worker must be stopped): archiving the last recovery_required
    /// record lifts fail-closed; archiving a dormant one frees its inbox capacity.
    Recover {
        #[command(flatten)]
        root: RootArgs,
        /// Move this reviewed recovery_required or dormant record to `<root>/archive/` (Worker
        /// stopped).
        #[arg(long, value_name = "OFFER_ID")]
        archive: Option<String>,
    },
    /// Run sample Runs end to end against an embedded loopback mTLS control plane.
    #[cfg(feature = "demo")]
    Demo(crate::demo::DemoArgs),
}

#[derive(Debug, Subcommand)]
enum InboxCommand {
    /// One page of records: offer id, state, Run, Attempt (ascending offer id).
    List {
        #[command(flatten)]
        root: RootArgs,
        /// Keyset cursor: list records strictly after this offer id.
        #[arg(long, value_name = "OFFER_ID")]
        after: Option<String>,
        /// Page size, 1..=64.
        #[arg(long, default_value_t = 16)]
        limit: u64,
        /// Print JSON (one object with `records` and `nextAfter`).
        #[arg(long)]
        json: bool,
    },
    /// One record as JSON, lease token and capability digests redacted.
    Show {
        #[command(flatten)]
        root: RootArgs,
        /// The offer id.
        offer_id: String,
    },
}

/// Where the state root is: from a config file or given directly.
#[derive(Debug, Args)]
struct RootArgs {
    /// The Worker's configuration (its `root` is used).
    #[arg(long, value_name = "FILE", conflicts_with = "root")]
    config: Option<PathBuf>,
    /// The state root directly.
    #[arg(long, value_name = "DIR")]
    root: Option<PathBuf>,
}

impl RootArgs {
    fn resolve(&self) -> Result<PathBuf, String> {
        match (&self.root, &self.config) {
            (Some(root), _) => Ok(root.clone()),
            (None, Some(config)) => Config::load(config, &ProcessEnvironment)
                .map(|c| c.root)
                .map_err(|e| e.to_string()),
            (None, None) => std::env::var("QL_WORKER_ROOT")
                .map(PathBuf::from)
                .map_err(|_| {
                    String::from("give --root DIR or --config FILE (or set QL_WORKER_ROOT)")
                }),
        }
    }
}

fn fail(code: u8, message: impl std::fmt::Display) -> ExitCode {
    let _ = writeln!(std::io::stderr(), "ql-worker: {message}");
    ExitCode::from(code)
}

/// Parses the command line and runs the command.
#[must_use]
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Init { root, config } => match (root, config) {
            (_, Some(config)) => init_with_config(&config),
            (Some(root), None) => {
                let code = init(&root);
                eprintln!(
                    "ql-worker: warning: {} (`init --config FILE` checks [run_as])",
                    crate::containment::shared_identity_warning(crate::fsio::euid())
                );
                code
            }
            (None, None) => fail(EXIT_CONFIG, "give --root DIR or --config FILE"),
        },
        Command::Run { config } => run(&config),
        Command::Drain(root) => match root.resolve() {
            Ok(root) => match crate::runtime::request_drain(&root) {
                Ok(()) => {
                    println!(
                        "drain requested: {}",
                        root.join(crate::runtime::DRAIN_FILE).display()
                    );
                    ExitCode::from(EXIT_OK)
                }
                Err(e) => fail(EXIT_STORAGE, format!("{}: {e}", root.display())),
            },
            Err(e) => fail(EXIT_CONFIG, e),
        },
        Command::Inbox { command } => inbox(command),
        Command::Recover { root, archive } => match root.resolve() {
            Ok(root) => recover(&root, archive.as_deref()),
            Err(e) => fail(EXIT_CONFIG, e),
        },
        #[cfg(feature = "demo")]
        Command::Demo(args) => crate::demo::main(&args),
    }
}

fn init(root: &Path) -> ExitCode {
    match Journal::open(root, ql_worker_core::listing::Capacity::DEFAULT) {
        Ok(journal) => {
            println!(
                "state root ready: {} (0700, owner lock {})",
                root.display(),
                journal.owner_lock().path().display()
            );
            ExitCode::from(EXIT_OK)
        }
        Err(e) => fail(EXIT_STORAGE, e),
    }
}

/// `init --config`: the state root, then containment (issue 20).
fn init_with_config(path: &Path) -> ExitCode {
    let config = match Config::load(path, &ProcessEnvironment) {
        Ok(config) => config,
        Err(e) => return fail(EXIT_CONFIG, e),
    };
    let code = init(&config.root);
    if code != ExitCode::from(EXIT_OK) {
        return code;
    }
    match crate::containment::prepare(&config.containment) {
        Ok(prepared) => {
            if let Some(run_as) = &prepared.plan.run_as {
                println!(
                    "runs area ready: {} (0711); Runs run as {:?}",
                    run_as.runs_dir, run_as.identity
                );
            }
            if let Some(cgroup) = &prepared.plan.cgroup {
                println!(
                    "delegated cgroup: {} (one run-<offerId> child per Run)",
                    cgroup.parent
                );
            }
            for warning in &prepared.warnings {
                eprintln!("ql-worker: warning: {warning}");
            }
            ExitCode::from(EXIT_OK)
        }
        Err((field, rule)) => fail(EXIT_CONFIG, format!("{}: {field}: {rule}", path.display())),
    }
}

fn run(config: &Path) -> ExitCode {
    let config = match Config::load(config, &ProcessEnvironment) {
        Ok(config) => config,
        Err(e) => return fail(EXIT_CONFIG, e),
    };
    let signals = match Signals::install() {
        Ok(signals) => signals,
        Err(e) => return fail(EXIT_HALTED, format!("cannot install signal handlers: {e}")),
    };
    let mut runner = match Runner::start(&config, signals) {
        Ok(runner) => runner,
        Err(crate::runtime::StartError::Journal(e)) => return fail(EXIT_STORAGE, e),
        Err(e) => return fail(EXIT_CONFIG, e),
    };
    for warning in runner.containment_warnings() {
        eprintln!("ql-worker: warning: {warning}");
    }
    eprintln!(
        "ql-worker: {} running on {} ({:?} profile)",
        config.worker_id,
        config.root.display(),
        config.profile
    );
    exit_of(runner.run())
}

/// The exit code of a finished run, with its message on stderr.
#[must_use]
pub fn exit_of(exit: RunExit) -> ExitCode {
    match exit {
        RunExit::Drained => {
            eprintln!("ql-worker: drained; every record settled; Session offline");
            ExitCode::from(EXIT_OK)
        }
        RunExit::DrainBudgetExhausted => fail(
            EXIT_UNSETTLED,
            "drain budget ended with unsettled records; they resume at the next start",
        ),
        RunExit::Interrupted => fail(
            EXIT_UNSETTLED,
            "stopped by a second signal; unsettled records resume at the next start",
        ),
        RunExit::Halted(reason) => fail(EXIT_HALTED, format!("halted: {reason}")),
        RunExit::Fatal(detail) => fail(EXIT_HALTED, format!("halted: {detail}")),
    }
}

fn open_view(root: &Path) -> Result<Option<InboxView>, ExitCode> {
    InboxView::open(root).map_err(|e| fail(EXIT_STORAGE, e))
}

fn inbox(command: InboxCommand) -> ExitCode {
    match command {
        InboxCommand::List {
            root,
            after,
            limit,
            json,
        } => {
            let root = match root.resolve() {
                Ok(root) => root,
                Err(e) => return fail(EXIT_CONFIG, e),
            };
            let Ok(limit) = PageLimit::new(limit) else {
                return fail(EXIT_CONFIG, "--limit must be within 1..=64");
            };
            let after = match after.map(OfferId::new).transpose() {
                Ok(after) => after,
                Err(e) => return fail(EXIT_CONFIG, format!("--after: {e}")),
            };
            list(&root, after.as_ref(), limit, json)
        }
        InboxCommand::Show { root, offer_id } => {
            let root = match root.resolve() {
                Ok(root) => root,
                Err(e) => return fail(EXIT_CONFIG, e),
            };
            let Ok(offer_id) = OfferId::new(offer_id) else {
                return fail(EXIT_CONFIG, format!("offer id must be {}", OfferId::RULE));
            };
            show(&root, &offer_id)
        }
    }
}

fn list(root: &Path, after: Option<&OfferId>, limit: PageLimit, json: bool) -> ExitCode {
    let view = match open_view(root) {
        Ok(Some(view)) => view,
        Ok(None) => {
            return fail(
                EXIT_STORAGE,
                format!("{}: no inbox here (run `ql-worker init`)", root.display()),
            );
        }
        Err(code) => return code,
    };
    let page = match view.list(after, limit) {
        Ok(page) => page,
        Err(e) => return fail(EXIT_STORAGE, e),
    };
    let mut records = Vec::new();
    for id in &page.offer_ids {
        match view.read(id) {
            Ok(Some(record)) => records.push(record),
            Ok(None) => {}
            Err(e) => return fail(EXIT_STORAGE, e),
        }
    }
    if json {
        let rows: Vec<serde_json::Value> = records.iter().map(summary_json).collect();
        let out = serde_json::json!({ "records": rows, "nextAfter": page.next_after.as_ref().map(OfferId::as_str) });
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else {
        println!(
            "{:<40} {:<28} {:<24} {:<24}",
            "OFFER", "STATE", "RUN", "ATTEMPT"
        );
        for r in &records {
            let state = match r.recovery() {
                Some(reason) => format!("{}({reason})", r.state),
                None => r.state.to_string(),
            };
            println!(
                "{:<40} {:<28} {:<24} {:<24}",
                r.offer.offer_id, state, r.offer.candidate.run_id, r.offer.candidate.attempt_id
            );
        }
        if let Some(next) = &page.next_after {
            println!("more: --after {next}");
        }
    }
    ExitCode::from(EXIT_OK)
}

fn summary_json(record: &InboxRecord) -> serde_json::Value {
    serde_json::json!({
        "offerId": record.offer.offer_id.as_str(),
        "state": record.state.as_str(),
        "recoveryReason": record.recovery_reason.map(RecoveryReason::as_str),
        "runId": record.offer.candidate.run_id.as_str(),
        "attemptId": record.offer.candidate.attempt_id.as_str(),
        "revision": record.revision.get(),
        "updatedAtMs": record.updated_at_ms.get(),
    })
}

/// A record as JSON for operators: the reference's field names, the execution revision in its
/// wire form, the lease token and capability digests redacted.
#[must_use]
pub fn record_json(record: &InboxRecord) -> serde_json::Value {
    let mut value = serde_json::to_value(record).unwrap_or(serde_json::Value::Null);
    if let Some(offer) = value.get_mut("offer") {
        let revision: serde_json::Value =
            serde_json::from_slice(&record.offer.execution_revision.to_json())
                .unwrap_or(serde_json::Value::Null);
        offer["executionRevision"] = revision;
    }
    value
}

fn show(root: &Path, offer_id: &OfferId) -> ExitCode {
    let view = match open_view(root) {
        Ok(Some(view)) => view,
        Ok(None) => return fail(EXIT_STORAGE, format!("{}: no inbox here", root.display())),
        Err(code) => return code,
    };
    match view.read(offer_id) {
        Ok(Some(record)) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&record_json(&record)).unwrap_or_default()
            );
            ExitCode::from(EXIT_OK)
        }
        Ok(None) => fail(
            EXIT_CONFIG,
            format!("no record {offer_id} in {}", root.display()),
        ),
        Err(e) => fail(EXIT_STORAGE, e),
    }
}

/// What an operator can do about each recovery reason.
#[must_use]
pub fn advice(reason: RecoveryReason) -> &'static str {
    match reason {
        RecoveryReason::LaunchOutcomeUnknown => {
            "a process may have started. If its receipt appears, the Worker completes the Run by \
             itself (receipt first, log uploaded, then completion). Otherwise check the host for \
             the process group of the handle and the control plane's view of the Run; never \
             restart it from here."
        }
        RecoveryReason::ControlPlaneAlreadyRunning => {
            "the control plane believes this Attempt is running, but this Worker holds no proof \
             that it started it. Check the control plane; the lease expiry settles the Run there."
        }
        RecoveryReason::ControlPlaneTerminal => {
            "the control plane settled the Run; the local process was stopped. Nothing runs \
             locally; archive the record after review."
        }
        RecoveryReason::LeaseLostLocalExecutionStopped => {
            "the lease expired locally and the process was stopped conclusively. The control \
             plane decides the Run's outcome; archive the record after review."
        }
        RecoveryReason::LeaseLostLocalExecutionUnverified => {
            "the lease expired locally and stopping the process could NOT be verified: check the \
             host for the process group of the handle and stop it by hand before archiving."
        }
    }
}

fn recover(root: &Path, archive: Option<&str>) -> ExitCode {
    if let Some(offer_id) = archive {
        return archive_record(root, offer_id);
    }
    let view = match open_view(root) {
        Ok(Some(view)) => view,
        Ok(None) => return fail(EXIT_STORAGE, format!("{}: no inbox here", root.display())),
        Err(code) => return code,
    };
    let now = crate::os::now();
    let mut found = 0;
    let mut dormant = Vec::new();
    let mut after: Option<OfferId> = None;
    loop {
        let page = match view.list(after.as_ref(), PageLimit::new(64).unwrap_or_default()) {
            Ok(page) => page,
            Err(e) => return fail(EXIT_STORAGE, e),
        };
        for id in &page.offer_ids {
            let record = match view.read(id) {
                Ok(Some(record)) => record,
                Ok(None) => continue,
                Err(e) => return fail(EXIT_STORAGE, e),
            };
            if let Some(reason) = record.recovery() {
                found += 1;
                let receipt = crate::receipts::read(root, &record.offer.candidate.attempt_id)
                    .ok()
                    .flatten()
                    .is_some();
                println!(
                    "{} run={} attempt={} reason={reason}",
                    record.offer.offer_id,
                    record.offer.candidate.run_id,
                    record.offer.candidate.attempt_id
                );
                if let Some(handle) = &record.executor_handle {
                    println!("  executor handle: {handle}");
                }
                println!("  receipt present: {receipt}");
                println!("  what to do: {}", advice(reason));
            } else if record.is_dormant(now) {
                dormant.push(record);
            }
        }
        match page.next_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    for record in &dormant {
        println!(
            "{} run={} attempt={} dormant: {} with its lease expired at {} ms",
            record.offer.offer_id,
            record.offer.candidate.run_id,
            record.offer.candidate.attempt_id,
            record.state,
            record.offer.lease.expires_at_ms.get(),
        );
        println!(
            "  what to do: nothing ran and it can never start; the control plane reclaims the \
             Run when it reaps the lease. It takes no slot and does not hold a drain, but it \
             counts against the inbox capacity: archive it (`--archive`, Worker stopped)."
        );
    }
    if !dormant.is_empty() {
        println!("{} dormant record(s)", dormant.len());
    }
    if found == 0 {
        println!("no recovery_required records: the Worker is not fail-closed");
        ExitCode::from(EXIT_OK)
    } else {
        println!(
            "{found} recovery_required record(s): the Worker takes no new work while they remain. \
             After review, `ql-worker recover --archive OFFER_ID` (Worker stopped) moves one out."
        );
        ExitCode::from(EXIT_RECOVERY)
    }
}

fn archive_record(root: &Path, offer_id: &str) -> ExitCode {
    let Ok(offer_id) = OfferId::new(offer_id) else {
        return fail(EXIT_CONFIG, format!("offer id must be {}", OfferId::RULE));
    };
    match crate::journal::archive_record(root, &offer_id, crate::os::now()) {
        Ok(path) => {
            println!("archived {offer_id} to {}", path.display());
            ExitCode::from(EXIT_OK)
        }
        Err(e) => fail(EXIT_STORAGE, e),
    }
}

/// Whether a state is settled (for the demo and status output).
#[must_use]
pub fn settled(state: State) -> bool {
    state.is_terminal()
}
