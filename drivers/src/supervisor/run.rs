//! The supervisor process body (`ql-worker __supervise`).
//!
//! Order:
//! 1. read the plan frame from stdin (wiped buffer), then point stdin at `/dev/null`;
//! 2. validate the plan; become a child subreaper;
//! 3. re-read the inbox record and cross the spawn barrier (exact match or no spawn);
//! 4. open the allocated log spool file for capture (verified by the file authority);
//! 5. refuse if any inheritable descriptor beyond 0–2 is open (the user would inherit it);
//! 6. spawn the user command in its own process group, stdout+stderr into a pipe;
//! 7. capture the user's durable identity (failure: stop the group, report unknown);
//! 8. report once on stdout, then point stdout at `/dev/null`;
//! 9. pump the log, wait for the user process, kill and reap leftover descendants;
//! 10. sync the log, publish the truncation fact (only after a complete capture);
//! 11. publish the receipt; exit with the user's exit code.
//!
//! Every step before 6 ends in `Rejected` (no user process exists). After 6, the outcome is
//! `Started` or `Unknown`, and the supervisor always carries on to the receipt.

use std::fs::File;
use std::io;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ql_worker_core::receipt::{RECEIPT_SCHEMA_VERSION, Receipt};
use ql_worker_core::revision::ExecCommand;
use ql_worker_core::truncation::{FACT_SCHEMA_VERSION, TruncationFact};
use rustix::process::{Pid, Signal, getpid, kill_process_group, set_child_subreaper};
use zeroize::Zeroizing;

use super::authority;
use super::barrier;
use super::capture::{self, CaptureTally, FailingSink};
use super::frame;
use super::identity::{self, DurableHandle, ProcRoot};
use super::plan::{MAX_PLAN_BYTES, PLAN_MAGIC, Plan};
use super::reap::{self, Exit};
use super::report::{RejectReason, Report, UnknownReason};
use super::unix_millis_now;

/// Exit code of a supervisor that started nothing (the reference wrapper's invalid-input code).
pub const NO_SPAWN_EXIT: i32 = 125;
/// TERM grace before KILL when identity capture fails (reference: 1 000 ms).
const IDENTITY_FAILURE_GRACE: Duration = Duration::from_millis(1000);
/// How long descendants may take to die once the user process has exited.
const DESCENDANT_GRACE: Duration = Duration::from_secs(10);
/// How long the capture may take to reach end of file once no descendant is left.
const CAPTURE_DRAIN_GRACE: Duration = Duration::from_secs(5);

/// Runs the supervisor and returns its exit code.
pub(crate) fn supervise() -> i32 {
    let mut reporter = Reporter { sent: false };
    let plan = match read_plan() {
        Ok(plan) => plan,
        Err(reason) => {
            reporter.send(&Report::Rejected(reason));
            return NO_SPAWN_EXIT;
        }
    };
    let mut plan = plan;
    let code = match prepare_and_spawn(&mut plan) {
        Err(reason) => {
            reporter.send(&Report::Rejected(reason));
            NO_SPAWN_EXIT
        }
        Ok(spawned) => i32::from(finish(&plan, spawned, &mut reporter)),
    };
    drop(plan);
    code
}

/// Sends the single launch report on stdout, then detaches stdout.
struct Reporter {
    sent: bool,
}

impl Reporter {
    fn send(&mut self, report: &Report) {
        if self.sent {
            return;
        }
        self.sent = true;
        if let Ok(frame) = report.encode() {
            // The Worker may be gone: EPIPE is ignored (Rust ignores SIGPIPE), we carry on.
            let _ = write_all_fd(rustix::stdio::stdout(), &frame);
        }
        let _ = redirect_to_null(|null| rustix::stdio::dup2_stdout(null));
    }
}

fn write_all_fd(fd: rustix::fd::BorrowedFd<'_>, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        match rustix::io::write(fd, bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

fn redirect_to_null(dup2: fn(&File) -> rustix::io::Result<()>) -> io::Result<()> {
    let null = File::options().read(true).write(true).open("/dev/null")?;
    dup2(&null)?;
    Ok(())
}

/// Reads exactly one plan frame from stdin into a wiped buffer, directly from the descriptor
/// (std's buffered `Stdin` would keep an unwiped copy), then points stdin at `/dev/null`.
fn read_plan() -> Result<Plan, RejectReason> {
    let mut buffer = Zeroizing::new(vec![0u8; MAX_PLAN_BYTES]);
    let mut filled = 0usize;
    let complete = loop {
        match frame::announced_len(PLAN_MAGIC, &buffer[..filled], MAX_PLAN_BYTES) {
            Err(_) => break false,
            Ok(Some(total)) if filled >= total => break filled == total,
            Ok(_) => {}
        }
        match rustix::io::read(rustix::stdio::stdin(), &mut buffer[filled..]) {
            Ok(0) => break false,
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => break false,
        }
    };
    let _ = redirect_to_null(|null| rustix::stdio::dup2_stdin(null));
    if !complete {
        return Err(RejectReason::PlanNotReceived);
    }
    let plan = Plan::decode(&buffer[..filled]).map_err(|_| RejectReason::PlanNotReceived)?;
    drop(buffer);
    plan.validate().map_err(RejectReason::PlanInvalid)?;
    if plan.started_at_ms > unix_millis_now() {
        return Err(RejectReason::StartTimeInFuture);
    }
    Ok(plan)
}

/// What exists once the user process is spawned.
struct Spawned {
    user: Pid,
    capture: mpsc::Receiver<(CaptureTally, Option<File>)>,
}

fn proc_root(plan: &Plan) -> ProcRoot {
    plan.seams
        .proc_root
        .as_ref()
        .map_or_else(ProcRoot::system, ProcRoot::at)
}

/// Steps 2–6. Every error is proof that no user process exists.
fn prepare_and_spawn(plan: &mut Plan) -> Result<Spawned, RejectReason> {
    set_child_subreaper(Some(getpid())).map_err(|_| RejectReason::SubreaperUnavailable)?;
    let root = Path::new(&plan.state_root);
    let record = authority::read_record(root, &plan.offer_id)
        .map_err(|_| RejectReason::BarrierUnreadable)?;
    barrier::check(&record, plan).map_err(RejectReason::BarrierDrift)?;
    drop(record);
    let capture = authority::open_capture(root, &plan.log_artifact_id, plan.log_quota_bytes)
        .map_err(|_| RejectReason::LogUnavailable)?;
    let (log, remaining) = (capture.file, capture.remaining_quota_bytes);
    match super::inheritable_descriptors() {
        Ok(fds) if fds.is_empty() => {}
        Ok(fds) => return Err(RejectReason::InheritedDescriptor(fds[0])),
        // Cannot prove the table is clean.
        Err(_) => return Err(RejectReason::InheritedDescriptor(u32::MAX)),
    }
    let (reader, writer) = io::pipe().map_err(|_| RejectReason::PipeUnavailable)?;
    let stderr = writer
        .try_clone()
        .map_err(|_| RejectReason::PipeUnavailable)?;
    let mut command = user_command(plan);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::from(writer))
        .stderr(Stdio::from(stderr));
    let spawned = command.spawn();
    // Drop the Command now: it holds our copies of the pipe's write end (the capture would never
    // see end of file) and its own copy of the environment. Our copy of the environment (Secret
    // values) is wiped now too: nothing after the spawn needs it.
    drop(command);
    plan.environment.clear();
    let child = spawned.map_err(|e| RejectReason::SpawnFailed {
        errno: e.raw_os_error().unwrap_or(0),
    })?;
    // INVARIANT: a spawned child has a positive pid.
    let user = Pid::from_child(&child);
    drop(child); // We reap with waitid/waitpid ourselves; dropping a Child never waits or kills.
    let (sender, receiver) = mpsc::channel();
    let fail_writes = plan.seams.fail_log_writes;
    thread::spawn(move || {
        let outcome = if fail_writes {
            (capture::pump(reader, FailingSink, remaining), None)
        } else {
            let mut log = log;
            let tally = capture::pump(reader, &mut log, remaining);
            (tally, Some(log))
        };
        let _ = sender.send(outcome);
    });
    Ok(Spawned {
        user,
        capture: receiver,
    })
}

fn user_command(plan: &Plan) -> Command {
    let mut command = match &plan.command {
        ExecCommand::Argv { file, args } => {
            let mut c = Command::new(file);
            c.args(args);
            c
        }
        ExecCommand::Shell { command, shell } => {
            let mut c = Command::new(shell.as_deref().unwrap_or("/bin/sh"));
            c.arg("-c").arg(command);
            c
        }
    };
    command.env_clear();
    for var in &plan.environment {
        command.env(&var.name, var.value.expose());
    }
    if let Some(dir) = &plan.working_directory {
        command.current_dir(dir);
    }
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    command
}

/// Steps 7–11, after the user process exists. Returns the supervisor's exit code.
fn finish(plan: &Plan, spawned: Spawned, reporter: &mut Reporter) -> u8 {
    let Spawned { user, capture } = spawned;
    let proc_root = proc_root(plan);
    let user_pid = user.as_raw_pid().unsigned_abs();
    let identity = identity::capture(&proc_root, user_pid)
        .ok()
        .filter(|identity| identity.pgid == user_pid);
    let report = match identity {
        None => {
            // The user process may already be running: stop its whole group, and say unknown.
            let _ = kill_process_group(user, Signal::TERM);
            if !reap::exited_within(user, IDENTITY_FAILURE_GRACE) {
                let _ = kill_process_group(user, Signal::KILL);
            }
            Report::Unknown(UnknownReason::IdentityCaptureFailed)
        }
        Some(identity) => {
            let handle = DurableHandle {
                handle_id: plan.attempt_id.as_str().to_owned(),
                identity,
            };
            match handle.encode() {
                Ok(handle) => Report::Started {
                    handle: handle.as_str().to_owned(),
                    started_at_ms: plan.started_at_ms.get(),
                },
                Err(_) => {
                    let _ = kill_process_group(user, Signal::KILL);
                    Report::Unknown(UnknownReason::HandleUnencodable)
                }
            }
        }
    };
    reporter.send(&report);

    let exit = match reap::wait_for_user(user) {
        Ok(exit) => exit,
        // Cannot happen for our own child; record a failure code rather than invent success.
        Err(_) => Exit::Code(u8::MAX),
    };
    let descendants_gone =
        reap::kill_descendants(Path::new("/proc"), Instant::now() + DESCENDANT_GRACE);
    let wait = if descendants_gone {
        CAPTURE_DRAIN_GRACE
    } else {
        Duration::from_millis(100)
    };
    if let Ok((tally, log)) = capture.recv_timeout(wait) {
        publish_fact(plan, tally, log);
    }
    let code = exit.receipt_code();
    publish_receipt(plan, code);
    code
}

/// Publishes the truncation fact, only for a complete capture whose bytes are durable.
fn publish_fact(plan: &Plan, tally: CaptureTally, log: Option<File>) {
    let Some(log) = log else { return };
    if tally.failed || log.sync_all().is_err() {
        return;
    }
    let fact = TruncationFact {
        schema_version: FACT_SCHEMA_VERSION,
        run_id: plan.run_id.clone(),
        attempt_id: plan.attempt_id.clone(),
        log_artifact_id: plan.log_artifact_id.clone(),
        maximum_bytes: plan.log_quota_bytes,
        quota_reached: tally.quota_reached(),
        observed_at_ms: unix_millis_now(),
    };
    let _ = authority::publish_fact(Path::new(&plan.state_root), &fact);
}

/// Publishes the receipt. Failures never change the exit code.
fn publish_receipt(plan: &Plan, exit_code: u8) {
    let finished_at = unix_millis_now().max(plan.started_at_ms);
    let receipt = Receipt {
        schema_version: RECEIPT_SCHEMA_VERSION,
        run_id: plan.run_id.clone(),
        attempt_id: plan.attempt_id.clone(),
        callback_sequence: plan.callback_sequence,
        token: super::plan::receipt_token(&plan.capability),
        started_at_ms: plan.started_at_ms,
        finished_at_ms: finished_at,
        exit_code,
    };
    let _ = authority::publish_receipt(Path::new(&plan.state_root), &receipt);
}
