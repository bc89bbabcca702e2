//! The `ql-worker` command line: `init`, `run`, `drain`, `inbox`, `recover`, `demo`.
//!
//! Exit codes (also in `--help` and `docs/operations.md`):
//! 0 success · 1 the output could not be written (stdout closed or full) · 2 usage or
//! configuration error · 3 state root unusable (unsafe storage, not a state root, another
//! owner, a write that failed) · 4 stopped with unsettled records (drain budget, second signal) ·
//! 5 halted on a fact it cannot continue from (see the message) · 6 `recover` found
//! `recovery_required` records · 7 `demo`: a Run did not end as expected.
//!
//! Nothing here panics on a failing stdout or stderr: output is written once, checked, and a
//! failure is exit 1 with a message on stderr.

use std::fmt::Write as _;
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
/// Exit: the output could not be written (stdout closed or full).
pub const EXIT_OUTPUT: u8 = 1;
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

/// The exit codes every build has (`--help` adds what this build carries).
macro_rules! exit_codes {
    () => {
        "\
Exit codes:
  0  success (for `run`: drained, every record settled, Session offline)
  1  the output could not be written (stdout closed or full); the message says what was done
  2  usage or configuration error (the message names the file, field or variable, and the rule)
  3  state root unusable: unsafe storage (symlink, mode, owner, foreign entry), not a state
     root, another owner or a lost owner lock, or a write to it that failed (ENOSPC, EIO)
  4  stopped with unsettled records (a second signal, or a drain that left records it could not
     settle: recovery evidence, never launched); they resume at the next start
  5  halted on a fact it cannot continue from (fsync failed, the Session fenced again and again or
     replaced by another Worker, TLS or credential failures past control_plane.give_up_after_ms)
  6  `recover`: recovery_required records are present (the Worker takes no new work)"
    };
}

/// `--help`'s closing text: the exit codes, and what this build carries.
#[cfg(feature = "demo")]
const AFTER_HELP: &str = concat!(
    exit_codes!(),
    "\n  7  `demo`: a Run did not end as expected"
);
#[cfg(not(feature = "demo"))]
const AFTER_HELP: &str = concat!(
    exit_codes!(),
    "\n\nThis build has no `demo` verb: it was built without the `demo` feature (no embedded \
     control plane, no server code), as edge builds are."
);

/// ql-worker: the Qinglong 3 remote Worker runtime.
///
/// Pulls task Runs from a Qinglong control plane over mutual-TLS 1.3, runs each under its own
/// supervisor, uploads the log, then reports completion. A Run is never executed twice because
/// of a crash; a start failure is reported only with proof that nothing started; Secret values
/// never touch the disk, and the completion capability is on disk only in the supervisor's
/// receipt until the Worker has authenticated it and removed the receipt.
#[derive(Debug, Parser)]
#[command(name = "ql-worker", version, after_help = AFTER_HELP)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
    /// The event log's rendering on stderr: `text` (one readable line per event) or `json`
    /// (one JSON object per line). `run` and `demo`.
    #[arg(long, global = true, value_enum, value_name = "FORMAT")]
    log_format: Option<crate::events::Format>,
    /// The least level of the event log (default `info`; `demo`: `warn`). `debug` adds the
    /// pending-claim steps and other crates' records.
    #[arg(long, global = true, value_enum, value_name = "LEVEL")]
    log_level: Option<crate::events::LevelArg>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Create the private state root (0700 directories, owner lock) and check its permissions.
    ///
    /// Refuses a root that is a symlink, not owned by this user, readable by group/other, or
    /// holding anything the Worker does not write (it never adopts a directory of other files).
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
    /// The first SIGTERM/SIGINT (or `ql-worker drain`) drains: no new work; when the drain
    /// budget ends, the Runs still running are stopped and completed; then the Session goes
    /// offline. A second signal stops at once; unsettled records resume at the next start.
    /// SIGHUP reloads the TLS material and trust anchors. Events go to stderr (see
    /// --log-format); with NOTIFY_SOCKET set it speaks systemd's Type=notify.
    Run {
        /// The TOML configuration (see docs/ql-worker.example.toml).
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
    },
    /// Ask the running Worker of a state root to drain (writes `<root>/drain`).
    ///
    /// Equivalent to sending SIGTERM to the Worker process. Only a state root (one `init`
    /// made) is written to; nothing at `<root>/drain` is ever followed or truncated.
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
        /// Print JSON (one object with `recoveryRequired` and `dormant` lists).
        #[arg(long, conflicts_with = "archive")]
        json: bool,
    },
    /// Run sample Runs end to end against an embedded loopback mTLS control plane.
    #[cfg(feature = "demo")]
    Demo(crate::demo::DemoArgs),
    /// Not in this build: says so (exit 2) instead of "unrecognized subcommand".
    #[cfg(not(feature = "demo"))]
    #[command(hide = true, disable_help_flag = true)]
    Demo {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
        args: Vec<std::ffi::OsString>,
    },
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
    /// The root, or a usage/configuration error (exit 2) naming where the bad value came from.
    fn resolve(&self) -> Result<PathBuf, ExitCode> {
        let (root, source) = match (&self.root, &self.config) {
            (Some(root), _) => (root.clone(), String::from("--root")),
            (None, Some(config)) => match Config::load(config, &ProcessEnvironment) {
                // `Config::load` has checked the root path already.
                Ok(c) => return Ok(c.root),
                Err(e) => return Err(fail(EXIT_CONFIG, e)),
            },
            (None, None) => match std::env::var_os(crate::config::ENV_ROOT) {
                Some(value) if value.is_empty() => {
                    return Err(fail(
                        EXIT_CONFIG,
                        format!(
                            "{} (environment) is set but empty: give an absolute path (or use \
                             --root DIR or --config FILE)",
                            crate::config::ENV_ROOT
                        ),
                    ));
                }
                Some(value) => (
                    PathBuf::from(value),
                    format!("{} (environment)", crate::config::ENV_ROOT),
                ),
                None => {
                    return Err(fail(
                        EXIT_CONFIG,
                        format!(
                            "give --root DIR or --config FILE (or set {})",
                            crate::config::ENV_ROOT
                        ),
                    ));
                }
            },
        };
        checked_root(&root, &source)?;
        Ok(root)
    }
}

/// A root path that breaks the path rules is a usage error (exit 2), before anything is opened.
fn checked_root(root: &Path, source: &str) -> Result<(), ExitCode> {
    crate::layout::check_root_path(root).map_err(|e| {
        fail(
            EXIT_CONFIG,
            format!("{source} {}: {}", root.display(), e.rule()),
        )
    })
}

fn fail(code: u8, message: impl std::fmt::Display) -> ExitCode {
    let _ = writeln!(std::io::stderr().lock(), "ql-worker: {message}");
    ExitCode::from(code)
}

/// Writes `text` to stdout in one go and flushes it. A failure (closed pipe, full disk) is exit 1
/// with a message that says what `done` already happened, never a panic.
fn emit(text: &str, done: Option<&str>, code: u8) -> ExitCode {
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        Ok(()) => ExitCode::from(code),
        Err(e) => {
            let done = done.map_or_else(String::new, |d| format!("{d}, but "));
            fail(
                EXIT_OUTPUT,
                format!("{done}the output could not be written to stdout: {e}"),
            )
        }
    }
}

/// The whole binary: the hidden supervisor mode, then the command line. Both `ql-worker` and
/// the test-only `ql-worker-test-hooks` are this function.
#[must_use]
pub fn binary_main() -> ExitCode {
    // Hidden supervisor mode: the Worker runs its own image as `ql-worker __supervise` and sends
    // the plan over stdin (never argv). See `crate::supervisor`.
    if std::env::args_os().nth(1).as_deref() == Some(crate::supervisor::SUPERVISE_ARG.as_ref()) {
        crate::supervisor::main();
    }
    // The held user process: executes the user command once its supervisor released it.
    if std::env::args_os().nth(1).as_deref() == Some(crate::supervisor::HOLD_ARG.as_ref()) {
        crate::supervisor::hold_main();
    }
    // Descriptors inherited from whoever started us (a shell, cargo's jobserver) must never
    // reach a supervisor or a user process: mark them close-on-exec before anything else runs.
    close_fds::set_fds_cloexec_threadsafe(3, &[]);
    main()
}

/// Parses the command line and runs the command.
#[must_use]
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return parse_failure(&e),
    };
    let format = cli.log_format.unwrap_or_default();
    let level = cli.log_level;
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
        Command::Run { config } => {
            crate::events::init(format, level.unwrap_or_default().filter());
            run(&config)
        }
        Command::Drain(root) => match root.resolve() {
            Ok(root) => drain(&root),
            Err(code) => code,
        },
        Command::Inbox { command } => inbox(command),
        Command::Recover {
            root,
            archive,
            json,
        } => match root.resolve() {
            Ok(root) => match archive {
                Some(offer_id) => archive_record(&root, &offer_id),
                None => recover(&root, json),
            },
            Err(code) => code,
        },
        #[cfg(feature = "demo")]
        Command::Demo(args) => {
            let level = level.unwrap_or(crate::events::LevelArg::Warn);
            crate::events::init(format, level.filter());
            crate::demo::main(&args)
        }
        #[cfg(not(feature = "demo"))]
        Command::Demo { .. } => fail(
            EXIT_CONFIG,
            "this build has no `demo`: it was built without the `demo` feature (edge and \
             minimal hosts carry no control-plane server code); a default build \
             (`cargo build --release -p ql-worker`) has it",
        ),
    }
}

/// `--help` and `--version` go to stdout (exit 0, or 1 when stdout fails); every other parse
/// error to stderr with exit 2.
fn parse_failure(e: &clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let text = e.render().to_string();
    match e.kind() {
        ErrorKind::DisplayHelp | ErrorKind::DisplayVersion => emit(&text, None, EXIT_OK),
        _ => {
            let _ = std::io::stderr().lock().write_all(text.as_bytes());
            ExitCode::from(EXIT_CONFIG)
        }
    }
}

fn init(root: &Path) -> ExitCode {
    if let Err(code) = checked_root(root, "--root") {
        return code;
    }
    match Journal::open(root, ql_worker_core::listing::Capacity::DEFAULT) {
        Ok(journal) => {
            let text = format!(
                "state root ready: {} (0700, owner lock {})\n",
                root.display(),
                journal.owner_lock().path().display()
            );
            emit(&text, Some("the state root is ready"), EXIT_OK)
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
            let mut text = String::new();
            if let Some(run_as) = &prepared.plan.run_as {
                text.push_str(&format!(
                    "runs area ready: {} (0711); Runs run as {}\n",
                    run_as.runs_dir, run_as.identity
                ));
            }
            if let Some(cgroup) = &prepared.plan.cgroup {
                text.push_str(&format!(
                    "delegated cgroup: {} (one run-<offerId> child per Run)\n",
                    cgroup.parent
                ));
            }
            for warning in &prepared.warnings {
                let _ = writeln!(std::io::stderr().lock(), "ql-worker: warning: {warning}");
            }
            emit(
                &text,
                Some("the state root and containment are ready"),
                EXIT_OK,
            )
        }
        Err((field, rule)) => fail(EXIT_CONFIG, format!("{}: {field}: {rule}", path.display())),
    }
}

fn drain(root: &Path) -> ExitCode {
    match crate::runtime::request_drain(root) {
        Ok((path, existed)) => {
            let text = if existed {
                format!("drain already requested: {}\n", path.display())
            } else {
                format!("drain requested: {}\n", path.display())
            };
            emit(&text, Some("the drain was requested"), EXIT_OK)
        }
        Err(e) => fail(EXIT_STORAGE, state_root_error(root, &e)),
    }
}

/// A journal error as an operator reads it: a missing root says so.
fn state_root_error(root: &Path, e: &crate::journal::JournalError) -> String {
    match e {
        crate::journal::JournalError::NotFound { path } if path == root => format!(
            "no state root at {}: no such directory (create one with `ql-worker init --root {}`)",
            root.display(),
            root.display()
        ),
        other => other.to_string(),
    }
}

/// `run` refused to start: the `worker.refused` event (so `--log-format json` stays one JSON
/// object per line), naming the file, field and rule.
fn refuse(code: u8, message: impl std::fmt::Display) -> ExitCode {
    crate::events::Event::error("worker.refused")
        .number("exit_code", u64::from(code))
        .emit(&message);
    ExitCode::from(code)
}

fn run(config: &Path) -> ExitCode {
    let config = match Config::load(config, &ProcessEnvironment) {
        Ok(config) => config,
        Err(e) => return refuse(EXIT_CONFIG, e),
    };
    let signals = match Signals::install() {
        Ok(signals) => signals,
        Err(e) => return refuse(EXIT_HALTED, format!("cannot install signal handlers: {e}")),
    };
    let mut runner = match Runner::start(&config, signals) {
        Ok(runner) => runner,
        Err(e) if e.is_storage() => return refuse(EXIT_STORAGE, e),
        Err(e @ crate::runtime::StartError::Image(_)) => return refuse(EXIT_HALTED, e),
        Err(e) => return refuse(EXIT_CONFIG, e),
    };
    for warning in runner.containment_warnings() {
        crate::events::Event::warn("containment.warning")
            .text("warning", warning)
            .emit(warning);
    }
    crate::events::Event::info("worker.started")
        .text("worker", &config.worker_id)
        .text("root", config.root.display())
        .text("profile", config.profile)
        .text("version", env!("CARGO_PKG_VERSION"))
        .maybe("metrics_listen", runner.metrics_address())
        .emit(format_args!(
            "{} running on {} ({} profile)",
            config.worker_id,
            config.root.display(),
            config.profile
        ));
    exit_of(runner.run())
}

/// The exit code of a finished run, with its message on stderr (a `worker.stopped` event).
#[must_use]
pub fn exit_of(exit: RunExit) -> ExitCode {
    let (code, how, message) = match exit {
        RunExit::Drained => (
            EXIT_OK,
            "drained",
            String::from("drained; every record settled; Session offline"),
        ),
        RunExit::Unsettled => (
            EXIT_UNSETTLED,
            "unsettled",
            String::from(
                "drained, but records remain that this Worker could not settle (recovery \
                 evidence, or records that never launched; `ql-worker recover` lists them); \
                 they resume at the next start",
            ),
        ),
        RunExit::NotRegistered => (
            EXIT_OK,
            "not_registered",
            String::from(
                "drained before the Session was ever registered (the control plane was not \
                 reached): this run started nothing; records of an earlier run, if any, are \
                 reconciled at the next start",
            ),
        ),
        RunExit::Interrupted => (
            EXIT_UNSETTLED,
            "interrupted",
            String::from("stopped by a second signal; unsettled records resume at the next start"),
        ),
        RunExit::Halted(reason) => (EXIT_HALTED, "halted", format!("halted: {reason}")),
        RunExit::Fatal(detail) => (EXIT_HALTED, "halted", format!("halted: {detail}")),
        RunExit::Unusable(detail) => (EXIT_STORAGE, "unusable", format!("stopped: {detail}")),
    };
    let event = if code == EXIT_OK {
        crate::events::Event::info("worker.stopped")
    } else {
        crate::events::Event::error("worker.stopped")
    };
    event
        .text("how", how)
        .number("exit_code", u64::from(code))
        .emit(&message);
    if !log::log_enabled!(target: crate::events::TARGET, log::Level::Error) {
        let _ = writeln!(std::io::stderr().lock(), "ql-worker: {message}");
    }
    ExitCode::from(code)
}

fn open_view(root: &Path) -> Result<InboxView, ExitCode> {
    match InboxView::open(root) {
        Ok(Some(view)) => Ok(view),
        Ok(None) => Err(fail(
            EXIT_STORAGE,
            format!(
                "{}: no inbox here (no offers/ directory; run `ql-worker init`)",
                root.display()
            ),
        )),
        Err(e) => Err(fail(EXIT_STORAGE, state_root_error(root, &e))),
    }
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
                Err(code) => return code,
            };
            let Ok(limit) = PageLimit::new(limit) else {
                return fail(EXIT_CONFIG, "--limit must be within 1..=64");
            };
            let after = match after.map(OfferId::new).transpose() {
                Ok(after) => after,
                Err(_) => {
                    return fail(
                        EXIT_CONFIG,
                        format!("--after: offer id must be {}", OfferId::RULE),
                    );
                }
            };
            list(&root, after.as_ref(), limit, json)
        }
        InboxCommand::Show { root, offer_id } => {
            let root = match root.resolve() {
                Ok(root) => root,
                Err(code) => return code,
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
        Ok(view) => view,
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
    // The pending claim is part of the inbox: a corrupt or unsafe one stops the Worker (exit 3),
    // so it is reported here too, after the records.
    let claim = view.read_claim();
    let mut out = String::new();
    if json {
        let rows: Vec<serde_json::Value> = records.iter().map(summary_json).collect();
        let claim_json = match &claim {
            Ok(None) => serde_json::Value::Null,
            Ok(Some(c)) => serde_json::json!({
                "state": "present",
                "offerId": c.offer_id.as_str(),
                "attemptCount": c.attempt_count,
                "nextAttemptAtMs": c.next_attempt_at_ms.get(),
            }),
            Err(e) => serde_json::json!({ "state": "unreadable", "error": e.to_string() }),
        };
        let value = serde_json::json!({
            "records": rows,
            "nextAfter": page.next_after.as_ref().map(OfferId::as_str),
            "pendingClaim": claim_json,
        });
        out.push_str(&serde_json::to_string_pretty(&value).unwrap_or_default());
        out.push('\n');
    } else {
        let rows: Vec<[String; 4]> = records
            .iter()
            .map(|r| {
                let state = match r.recovery() {
                    Some(reason) => format!("{}({reason})", r.state),
                    None => r.state.to_string(),
                };
                [
                    r.offer.offer_id.to_string(),
                    state,
                    r.offer.candidate.run_id.to_string(),
                    r.offer.candidate.attempt_id.to_string(),
                ]
            })
            .collect();
        out.push_str(&table(&["OFFER", "STATE", "RUN", "ATTEMPT"], &rows));
        if let Some(next) = &page.next_after {
            let _ = writeln!(out, "more: --after {next}");
        }
        if let Ok(Some(c)) = &claim {
            let _ = writeln!(
                out,
                "pending claim: offer {} ({} attempt(s), next at {} ms)",
                c.offer_id,
                c.attempt_count,
                c.next_attempt_at_ms.get()
            );
        }
    }
    match claim {
        Ok(_) => emit(&out, None, EXIT_OK),
        Err(e) => {
            let code = emit(&out, None, EXIT_STORAGE);
            if code == ExitCode::from(EXIT_OUTPUT) {
                return code;
            }
            fail(
                EXIT_STORAGE,
                format!(
                    "pending claim unreadable: {e} (the Worker refuses this root until it is repaired)"
                ),
            )
        }
    }
}

/// Left-aligned columns as wide as their widest cell, two spaces apart; no trailing spaces.
fn table<const N: usize>(header: &[&str; N], rows: &[[String; N]]) -> String {
    let mut widths = header.map(|h| h.chars().count());
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: [&str; N]| {
        let mut text = String::new();
        for (i, (cell, width)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == N {
                text.push_str(cell);
            } else {
                let _ = write!(text, "{cell:<width$}  ");
            }
        }
        out.push_str(text.trim_end());
        out.push('\n');
    };
    line(*header);
    for row in rows {
        line(std::array::from_fn(|i| row[i].as_str()));
    }
    out
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
        Ok(view) => view,
        Err(code) => return code,
    };
    match view.read(offer_id) {
        Ok(Some(record)) => {
            let mut text = serde_json::to_string_pretty(&record_json(&record)).unwrap_or_default();
            text.push('\n');
            emit(&text, None, EXIT_OK)
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
            "the lease expired locally and the process was stopped conclusively, or the Run's \
             supervisor and process ended without a receipt that can authenticate (none, or a \
             garbled or forged file in its place, kept as evidence) and the Worker stopped \
             renewing its lease. Nothing runs locally; the control plane decides the Run's \
             outcome (its lease lapses there); archive the record after review."
        }
        RecoveryReason::LeaseLostLocalExecutionUnverified => {
            "the lease expired locally and stopping the process could NOT be verified: check the \
             host for the process group of the handle and stop it by hand before archiving."
        }
    }
}

/// What `recover` found for a record's receipt. A receipt that cannot be read is reported as
/// such, never as absent: the advice depends on it.
enum ReceiptState {
    Present,
    Absent,
    Unreadable(String),
}

impl ReceiptState {
    fn of(root: &Path, attempt_id: &ql_worker_core::ids::AttemptId) -> Self {
        match crate::receipts::read(root, attempt_id) {
            Ok(Some(_)) => Self::Present,
            Ok(None) => Self::Absent,
            Err(e) => Self::Unreadable(e.to_string()),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            Self::Present => "present",
            Self::Absent => "absent",
            Self::Unreadable(_) => "unreadable",
        }
    }

    /// What the receipt changes about the advice for `reason`.
    fn advice(&self, reason: RecoveryReason) -> String {
        match (self, reason) {
            (Self::Unreadable(_), _) => String::from(
                "the receipt cannot be read (see the error): it may be the proof that the process \
                 ran and how it exited. Inspect and repair that path (never delete the receipt); \
                 until it reads, the Worker cannot complete the Run from it.",
            ),
            (Self::Present, RecoveryReason::LaunchOutcomeUnknown) => String::from(
                "the receipt is there: the process ran and exited. A running Worker completes \
                 the Run from it by itself (receipt first, log uploaded, then completion); start \
                 the Worker if it is stopped.",
            ),
            (Self::Present | Self::Absent, reason) => advice(reason).to_string(),
        }
    }
}

fn recover(root: &Path, json: bool) -> ExitCode {
    let view = match open_view(root) {
        Ok(view) => view,
        Err(code) => return code,
    };
    let paths = crate::layout::Paths::new(root);
    let now = crate::os::now();
    let mut recovery = Vec::new();
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
                let receipt = ReceiptState::of(root, &record.offer.candidate.attempt_id);
                recovery.push((record, reason, receipt));
            } else if record.is_dormant(now) {
                dormant.push(record);
            }
        }
        match page.next_after {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let claim = view.read_claim().err().map(|e| e.to_string());
    const CLAIM_ADVICE: &str = "the Worker stops at once on this root (exit 3) until the pending \
        claim reads: inspect it (it names an offer the control plane may have claimed for this \
        Worker); if it is damaged, move it out of the root with the Worker stopped: the next \
        Pull starts a new claim, and a claimed offer is redelivered when its lease is reaped.";
    const DORMANT_ADVICE: &str = "nothing ran and it can never start; the control plane \
        reclaims the Run when it reaps the lease. It takes no slot and does not hold a drain, \
        but it counts against the inbox capacity: archive it (`--archive`, Worker stopped).";
    let code = if claim.is_some() {
        EXIT_STORAGE
    } else if recovery.is_empty() {
        EXIT_OK
    } else {
        EXIT_RECOVERY
    };
    let mut out = String::new();
    if json {
        let recovery_rows: Vec<serde_json::Value> = recovery
            .iter()
            .map(|(record, reason, receipt)| {
                let attempt = &record.offer.candidate.attempt_id;
                serde_json::json!({
                    "offerId": record.offer.offer_id.as_str(),
                    "runId": record.offer.candidate.run_id.as_str(),
                    "attemptId": attempt.as_str(),
                    "reason": reason.as_str(),
                    "executorHandle": record.executor_handle.as_ref().map(|h| h.as_str()),
                    "receipt": {
                        "state": receipt.name(),
                        "path": paths.receipt(attempt).display().to_string(),
                        "error": match receipt {
                            ReceiptState::Unreadable(e) => Some(e.as_str()),
                            ReceiptState::Present | ReceiptState::Absent => None,
                        },
                    },
                    "advice": receipt.advice(*reason),
                })
            })
            .collect();
        let dormant_rows: Vec<serde_json::Value> = dormant
            .iter()
            .map(|record| {
                serde_json::json!({
                    "offerId": record.offer.offer_id.as_str(),
                    "runId": record.offer.candidate.run_id.as_str(),
                    "attemptId": record.offer.candidate.attempt_id.as_str(),
                    "state": record.state.as_str(),
                    "leaseExpiresAtMs": record.offer.lease.expires_at_ms.get(),
                    "advice": DORMANT_ADVICE,
                })
            })
            .collect();
        let value = serde_json::json!({
            "failClosed": !recovery.is_empty(),
            "recoveryRequired": recovery_rows,
            "dormant": dormant_rows,
            "pendingClaim": claim.as_ref().map(|error| serde_json::json!({
                "state": "unreadable",
                "path": root.join(crate::layout::PENDING_CLAIM_FILE).display().to_string(),
                "error": error,
                "advice": CLAIM_ADVICE,
            })),
        });
        out.push_str(&serde_json::to_string_pretty(&value).unwrap_or_default());
        out.push('\n');
        return emit(&out, None, code);
    }
    for (record, reason, receipt) in &recovery {
        let attempt = &record.offer.candidate.attempt_id;
        let _ = writeln!(
            out,
            "{} run={} attempt={} reason={reason}",
            record.offer.offer_id, record.offer.candidate.run_id, attempt
        );
        if let Some(handle) = &record.executor_handle {
            let _ = writeln!(out, "  executor handle: {handle}");
        }
        let receipt_path = paths.receipt(attempt);
        match receipt {
            ReceiptState::Unreadable(e) => {
                let _ = writeln!(out, "  receipt: unreadable: {e}");
            }
            ReceiptState::Present | ReceiptState::Absent => {
                let _ = writeln!(
                    out,
                    "  receipt: {} ({})",
                    receipt.name(),
                    receipt_path.display()
                );
            }
        }
        let _ = writeln!(out, "  what to do: {}", receipt.advice(*reason));
    }
    for record in &dormant {
        let _ = writeln!(
            out,
            "{} run={} attempt={} dormant: {} with its lease expired at {} ms",
            record.offer.offer_id,
            record.offer.candidate.run_id,
            record.offer.candidate.attempt_id,
            record.state,
            record.offer.lease.expires_at_ms.get(),
        );
        let _ = writeln!(out, "  what to do: {DORMANT_ADVICE}");
    }
    if !dormant.is_empty() {
        let _ = writeln!(out, "{} dormant record(s)", dormant.len());
    }
    if let Some(error) = &claim {
        let _ = writeln!(out, "pending claim: unreadable: {error}");
        let _ = writeln!(out, "  what to do: {CLAIM_ADVICE}");
    }
    if recovery.is_empty() {
        out.push_str("no recovery_required records: the Worker is not fail-closed\n");
    } else {
        let _ = writeln!(
            out,
            "{} recovery_required record(s): the Worker takes no new work while they remain. \
             After review, `ql-worker recover --archive OFFER_ID` (Worker stopped) moves one out.",
            recovery.len()
        );
    }
    emit(&out, None, code)
}

fn archive_record(root: &Path, offer_id: &str) -> ExitCode {
    let Ok(offer_id) = OfferId::new(offer_id) else {
        return fail(
            EXIT_CONFIG,
            format!("--archive: offer id must be {}", OfferId::RULE),
        );
    };
    match crate::journal::archive_record(root, &offer_id, crate::os::now()) {
        Ok(path) => emit(
            &format!("archived {offer_id} to {}\n", path.display()),
            Some("the record was archived"),
            EXIT_OK,
        ),
        Err(e) if e.is_refusal() => fail(EXIT_CONFIG, e),
        Err(e) => fail(EXIT_STORAGE, state_root_error(root, &e)),
    }
}

/// Whether a state is settled (for the demo and status output).
#[must_use]
pub fn settled(state: State) -> bool {
    state.is_terminal()
}
