//! The supervisor process body (`ql-worker __supervise`).
//!
//! Order:
//! 1. read the plan frame from stdin (wiped buffer), then point stdin at `/dev/null`;
//! 2. validate the plan; become a child subreaper;
//! 3. re-read the inbox record and cross the spawn barrier (exact match or no spawn); re-decide
//!    the execution policy;
//! 4. open the allocated log spool file for capture (verified by the file authority);
//! 5. refuse if any inheritable descriptor beyond 0–2 is open (the user would inherit it);
//!    create the Run's directory (`[run_as]`) and cgroup; start the capture thread; set no new
//!    privileges, capabilities and resource limits on itself; enter the Run's cgroup;
//! 6. spawn the user process in its own process group, stdout+stderr into a pipe (under the
//!    Run's uid and gid), *held*: it is this image in [`super::HOLD_ARG`] mode, which waits for
//!    one byte on its stdin (a socket to the supervisor) before it executes the user command;
//!    leave the cgroup, restore its own limits;
//! 7. capture the user process's durable identity (failure: stop the group, report unknown);
//!    publish its handle durably next to the receipt (`receipts/<aa>/<attemptId>.handle`, 0600,
//!    fsync of file and directory: the Worker stops the Run by it when a crash fell between the
//!    spawn and `started`; issue 16), and only then release the held process, which executes
//!    the user command (exec, so the identity stays the same). A failed publication or exec:
//!    the user command never ran (killed, reaped, handle withdrawn, report rejected);
//! 8. report once on stdout, then point stdout at `/dev/null`;
//! 9. pump the log (masking Secret values if asked), wait for the user process, kill and reap
//!    leftover descendants (`cgroup.kill` too), log the cgroup's OOM and pids counters, remove
//!    the Run's cgroup and directory;
//! 10. sync the log, publish the truncation fact (only after a complete capture);
//! 11. publish the receipt; exit with the user's exit code.
//!
//! Every step before 6 ends in `Rejected` (no user process exists). After 6, the outcome is
//! `Started` or `Unknown`, and the supervisor always carries on to the receipt.

use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::os::fd::{AsRawFd as _, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use ql_worker_core::receipt::{RECEIPT_SCHEMA_VERSION, Receipt, ReceiptToken};
use ql_worker_core::record::InboxRecord;
use ql_worker_core::revision::{EnvValue, ExecCommand};
use ql_worker_core::truncation::{FACT_SCHEMA_VERSION, TruncationFact};
use rustix::process::{Pid, Signal, getpid, kill_process_group, set_child_subreaper};
use zeroize::Zeroizing;

use super::authority;
use super::capture::{self, CaptureTally, FailingSink};
use super::frame;
use super::identity::{self, DurableHandle, ProcRoot};
use super::mask::Masker;
use super::plan::{MAX_PLAN_BYTES, PLAN_MAGIC, Plan};
use super::reap::{self, Exit};
use super::report::{RejectReason, Report, UnknownReason};
use super::unix_millis_now;
use crate::containment::cgroup::{Events, RunCgroup};
use crate::containment::limits;
use crate::containment::runs::{self, RunDir};

/// Exit code of a supervisor that started nothing (the reference wrapper's invalid-input code).
pub const NO_SPAWN_EXIT: i32 = 125;
/// TERM grace before KILL when identity capture fails (reference: 1 000 ms).
const IDENTITY_FAILURE_GRACE: Duration = Duration::from_millis(1000);
/// How long descendants may take to die once the user process has exited.
const DESCENDANT_GRACE: Duration = Duration::from_secs(10);
/// How long the capture may take to reach end of file once no descendant is left.
const CAPTURE_DRAIN_GRACE: Duration = Duration::from_secs(5);
/// How long the Run's cgroup may take to empty once its processes were killed.
const CGROUP_REMOVE_GRACE: Duration = Duration::from_secs(5);

/// Runs the supervisor and returns its exit code.
pub(crate) fn supervise() -> i32 {
    let mut reporter = Reporter { sent: false };
    let (plan, image) = match read_plan() {
        Ok(received) => received,
        Err(reason) => {
            reporter.send(&Report::Rejected(reason));
            return NO_SPAWN_EXIT;
        }
    };
    let mut plan = plan;
    let code = match prepare_and_spawn(&mut plan, image) {
        Err(reason) => {
            reporter.send(&Report::Rejected(reason));
            NO_SPAWN_EXIT
        }
        Ok(spawned) => finish(&plan, spawned, &mut reporter).map_or(NO_SPAWN_EXIT, i32::from),
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
/// (std's buffered `Stdin` would keep an unwiped copy), with the image the Worker sent along
/// (`SCM_RIGHTS`, close-on-exec), then points stdin at `/dev/null`. No image: the plan was not
/// delivered as the Worker delivers it.
fn read_plan() -> Result<(Plan, File), RejectReason> {
    let mut buffer = Zeroizing::new(vec![0u8; MAX_PLAN_BYTES]);
    let mut filled = 0usize;
    let mut image: Option<OwnedFd> = None;
    let mut extra = false;
    let complete = loop {
        match frame::announced_len(PLAN_MAGIC, &buffer[..filled], MAX_PLAN_BYTES) {
            Err(_) => break false,
            Ok(Some(total)) if filled >= total => break filled == total,
            Ok(_) => {}
        }
        match receive(&mut buffer[filled..], &mut image, &mut extra) {
            Ok(0) => break false,
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => break false,
        }
    };
    let _ = redirect_to_null(|null| rustix::stdio::dup2_stdin(null));
    let image = match image {
        Some(image) if complete && !extra => File::from(image),
        _ => return Err(RejectReason::PlanNotReceived),
    };
    let plan = Plan::decode(&buffer[..filled]).map_err(|_| RejectReason::PlanNotReceived)?;
    drop(buffer);
    plan.validate().map_err(RejectReason::PlanInvalid)?;
    // `startedAtMs` is not compared with this host's wall clock, which may have been stepped
    // back since the Worker read it (see `RejectReason::StartTimeInFuture`).
    Ok((plan, image))
}

/// One `recvmsg` on stdin into `into`; a descriptor that came with the bytes is kept in
/// `image` (the first; any other is closed and sets `extra`), close-on-exec.
fn receive(
    into: &mut [u8],
    image: &mut Option<OwnedFd>,
    extra: &mut bool,
) -> rustix::io::Result<usize> {
    use rustix::net::{RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, recvmsg};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(2))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let received = recvmsg(
        rustix::stdio::stdin(),
        &mut [io::IoSliceMut::new(into)],
        &mut control,
        RecvFlags::CMSG_CLOEXEC,
    )?;
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(fds) = message {
            for fd in fds {
                // Close-on-exec whatever the emulator made of MSG_CMSG_CLOEXEC.
                let _ = rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC);
                if image.is_none() {
                    *image = Some(fd);
                } else {
                    *extra = true;
                }
            }
        }
    }
    if received.flags.contains(rustix::net::ReturnFlags::CTRUNC) {
        *extra = true;
    }
    Ok(received.bytes)
}

/// What exists once the user process is spawned.
struct Spawned {
    user: Pid,
    /// The supervisor's end of the held process's stdin: one byte releases it to execute the
    /// user command; an exec failure comes back as its errno, success as end of file.
    release: UnixStream,
    /// The lock on the log that tells the Worker this supervisor lives; released at exit.
    alive: File,
    capture: mpsc::Receiver<(CaptureTally, Option<File>)>,
    made: Made,
}

/// What the supervisor made for the Run before the spawn: removed on a refusal, and once the
/// Run's processes are gone otherwise.
#[derive(Default)]
struct Made {
    run_dir: Option<RunDir>,
    cgroup: Option<RunCgroup>,
}

impl Made {
    /// Removes the cgroup (once empty) and the Run's directory; reports what it could not.
    fn remove(self, plan: &Plan) {
        if let Some(cgroup) = self.cgroup {
            let path = cgroup.path().to_path_buf();
            if let Err(e) = cgroup.remove(Instant::now() + CGROUP_REMOVE_GRACE) {
                diag(
                    plan,
                    &format!("cgroup {} could not be removed: {e}", path.display()),
                );
            }
        }
        if let Some(dir) = self.run_dir
            && let Err(e) = runs::remove_run_dir(&dir)
        {
            diag(
                plan,
                &format!(
                    "Run directory {} could not be removed: {e}",
                    dir.path.display()
                ),
            );
        }
    }
}

/// One diagnostic event on the supervisor's stderr (the Worker's: the service's journal), in
/// the Worker's event-log format. Never a value: offer and attempt ids, paths and counters only.
fn diag(plan: &Plan, message: &str) {
    crate::events::Event::warn("supervisor.diagnostic")
        .text("offer", &plan.offer_id)
        .text("attempt", &plan.attempt_id)
        .emit(format_args!(
            "supervisor: offer {} attempt {}: {message}",
            plan.offer_id, plan.attempt_id
        ));
}

fn proc_root(plan: &Plan) -> ProcRoot {
    plan.seams
        .proc_root
        .as_ref()
        .map_or_else(ProcRoot::system, ProcRoot::at)
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// The Run's Secret values: every environment entry that is not a public binding of the
/// durable revision — the values bound to a Secret reference and the entries of an environment
/// bundle (delivered by the `secrets` endpoint, so secret too). Public values are never masked.
fn masker_for(plan: &Plan, record: &InboxRecord) -> Option<Masker> {
    if !plan.containment.mask_secrets {
        return None;
    }
    let public_names: Vec<&str> = record
        .offer
        .execution_revision
        .environment
        .iter()
        .filter(|b| !matches!(b.value, EnvValue::Secret(_)))
        .map(|b| b.name.as_str())
        .collect();
    let values = plan
        .environment
        .iter()
        .filter(|v| !public_names.contains(&v.name.as_str()))
        .map(|v| v.value.expose().as_bytes());
    Some(Masker::new(values, capture::CAPTURE_BLOCK_BYTES))
}

/// Steps 2–6. Every error is proof that no user process exists.
fn prepare_and_spawn(plan: &mut Plan, image: File) -> Result<Spawned, RejectReason> {
    set_child_subreaper(Some(getpid())).map_err(|_| RejectReason::SubreaperUnavailable)?;
    let root = Path::new(&plan.state_root);
    let record = authority::read_record(root, &plan.offer_id)
        .map_err(|_| RejectReason::BarrierUnreadable)?;
    plan.barrier()
        .check(&record)
        .map_err(RejectReason::BarrierDrift)?;
    // The execution policy, re-decided where the barrier is re-checked.
    plan.containment
        .check_policy(&plan.command, plan.working_directory.as_deref())
        .map_err(RejectReason::PolicyRefused)?;
    let masker = masker_for(plan, &record);
    drop(record);
    let capture = authority::open_capture(root, &plan.log_artifact_id, plan.log_quota_bytes)
        .map_err(|_| RejectReason::LogUnavailable)?;
    // Held until this process exits, after the receipt: while it is held, the Worker knows a
    // supervisor of this Run lives and a receipt may still come (issue 16).
    let alive = authority::hold_capture(&capture).map_err(|_| RejectReason::LogUnavailable)?;
    let (log, remaining) = (capture.file, capture.remaining_quota_bytes);
    match super::inheritable_descriptors() {
        Ok(fds) if fds.is_empty() => {}
        Ok(fds) => return Err(RejectReason::InheritedDescriptor(fds[0])),
        // Cannot prove the table is clean.
        Err(_) => return Err(RejectReason::InheritedDescriptor(u32::MAX)),
    }
    let (reader, writer) = io::pipe().map_err(|_| RejectReason::PipeUnavailable)?;
    // The held process runs the image the Worker sent with the plan (close-on-exec: only the
    // path `/proc/self/fd/N` reaches the child, resolved by the kernel in its execve).
    let (release, held) = UnixStream::pair().map_err(|_| RejectReason::PipeUnavailable)?;
    let stderr = writer
        .try_clone()
        .map_err(|_| RejectReason::PipeUnavailable)?;
    let mut made = Made::default();
    if let Some(run_as) = &plan.containment.run_as {
        let dir = runs::create_run_dir(
            Path::new(&run_as.runs_dir),
            plan.offer_id.as_str(),
            run_as.identity,
        )
        .map_err(|e| RejectReason::RunDirectoryUnavailable {
            errno: e.raw_os_error(),
        })?;
        made.run_dir = Some(dir);
    }
    if let Some(cgroup) = &plan.containment.cgroup {
        match RunCgroup::create(cgroup, plan.offer_id.as_str()) {
            Ok(cgroup) => made.cgroup = Some(cgroup),
            Err(e) => {
                made.remove(plan);
                return Err(RejectReason::CgroupUnavailable { errno: errno(&e) });
            }
        }
    }
    // The capture thread exists before the limits are set: a thread counts as a process for
    // RLIMIT_NPROC, and the user process must not be able to starve the supervisor.
    let (sender, receiver) = mpsc::channel();
    let fail_writes = plan.seams.fail_log_writes;
    let pump = thread::Builder::new().spawn(move || {
        let mut masker = masker;
        let outcome = if fail_writes {
            (capture::pump(reader, FailingSink, remaining), None)
        } else {
            let mut log = log;
            let tally = capture::pump_masked(reader, &mut log, remaining, masker.as_mut());
            (tally, Some(log))
        };
        let _ = sender.send(outcome);
    });
    if pump.is_err() {
        made.remove(plan);
        return Err(RejectReason::PipeUnavailable);
    }
    let mut command = user_command(plan, made.run_dir.as_ref(), &image);
    command
        .stdin(Stdio::from(OwnedFd::from(held)))
        .stdout(Stdio::from(writer))
        .stderr(Stdio::from(stderr));
    // Set on ourselves, inherited by the child (no pre_exec): no new privileges, no
    // inheritable capabilities, the resource limits; then the Run's cgroup.
    let limits = match restrict_self(plan) {
        Ok(limits) => limits,
        Err(e) => {
            drop(command);
            made.remove(plan);
            return Err(RejectReason::LimitsUnavailable { errno: errno(&e) });
        }
    };
    let home = match made.cgroup.as_ref().map(RunCgroup::enter).transpose() {
        Ok(home) => home,
        Err(e) => {
            limits::restore(limits);
            drop(command);
            made.remove(plan);
            return Err(RejectReason::CgroupUnavailable { errno: errno(&e) });
        }
    };
    let spawned = command.spawn();
    // Drop the Command now: it holds our copies of the pipe's write end (the capture would never
    // see end of file) and its own copy of the environment. Our copy of the environment (Secret
    // values) is wiped now too: nothing after the spawn needs it.
    drop(command);
    drop(image);
    plan.environment.clear();
    if let Some(home) = &home
        && let Err(e) = RunCgroup::leave(home)
    {
        diag(
            plan,
            &format!(
                "could not move the supervisor back to {} ({e}): it stays in the Run's cgroup",
                home.display()
            ),
        );
    }
    limits::restore(limits);
    let child = match spawned {
        Ok(child) => child,
        Err(e) => {
            made.remove(plan);
            return Err(RejectReason::SpawnFailed { errno: errno(&e) });
        }
    };
    // INVARIANT: a spawned child has a positive pid.
    let user = Pid::from_child(&child);
    drop(child); // We reap with waitid/waitpid ourselves; dropping a Child never waits or kills.
    Ok(Spawned {
        user,
        release,
        alive,
        capture: receiver,
        made,
    })
}

/// No new privileges, no inheritable or ambient capabilities, and the
/// resource limits, on the supervisor itself. Returns the previous limits to restore.
fn restrict_self(plan: &Plan) -> io::Result<limits::Saved> {
    if plan.containment.no_new_privileges {
        limits::no_new_privileges()?;
    }
    // Always: a Worker holding ambient capabilities must not pass them to any user command.
    limits::drop_inheritable_capabilities()?;
    limits::apply(&plan.containment.rlimits)
}

/// The held process: this image in [`super::HOLD_ARG`] mode, with the user's program and
/// arguments after it (it executes them once released; see [`hold`]).
fn user_command(plan: &Plan, run_dir: Option<&RunDir>, image: &File) -> Command {
    let mut command = Command::new(format!("/proc/self/fd/{}", image.as_raw_fd()));
    command.arg0("ql-worker").arg(super::HOLD_ARG);
    match &plan.command {
        ExecCommand::Argv { file, args } => {
            command.arg(file).args(args);
        }
        ExecCommand::Shell {
            command: text,
            shell,
        } => {
            command
                .arg(shell.as_deref().unwrap_or("/bin/sh"))
                .arg("-c")
                .arg(text);
        }
    }
    command.env_clear();
    for var in &plan.environment {
        command.env(&var.name, var.value.expose());
    }
    if let Some(dir) = &plan.working_directory {
        command.current_dir(dir);
    }
    if let Some(run) = run_dir {
        // std sets the gid, clears the supplementary groups (setgroups(0): the Worker checked
        // it holds CAP_SETGID) and sets the uid in the child, before exec.
        command.uid(run.uid).gid(run.gid);
        if plan.working_directory.is_none() {
            command.current_dir(&run.path);
        }
        if !plan.environment.iter().any(|v| v.name == "TMPDIR") {
            command.env("TMPDIR", run.tmp());
        }
    }
    command.process_group(0);
    command
}

/// Step 7: the durable identity of the held process, as a `ql3lp1.` handle.
fn identify(plan: &Plan, user: Pid) -> Result<String, UnknownReason> {
    let proc_root = proc_root(plan);
    let user_pid = user.as_raw_pid().unsigned_abs();
    let identity = identity::capture(&proc_root, user_pid)
        .ok()
        .filter(|identity| identity.pgid == user_pid)
        .ok_or(UnknownReason::IdentityCaptureFailed)?;
    let handle = DurableHandle {
        handle_id: plan.attempt_id.as_str().to_owned(),
        identity,
    };
    match handle.encode() {
        Ok(handle) => Ok(handle.as_str().to_owned()),
        Err(_) => Err(UnknownReason::HandleUnencodable),
    }
}

/// Step 7: publishes `handle` durably, then releases the held process and learns whether the
/// user command was executed. An error: it never ran.
fn publish_and_release(
    plan: &Plan,
    handle: &str,
    mut release: UnixStream,
) -> Result<(), RejectReason> {
    authority::publish_handle(Path::new(&plan.state_root), &plan.attempt_id, handle)
        .map_err(|_| RejectReason::HandleUnpublished)?;
    if let Err(e) = release.write_all(&[1]) {
        // The held process is gone (or cannot hear): it never executed the user command.
        return Err(RejectReason::SpawnFailed { errno: errno(&e) });
    }
    let mut answer = Vec::with_capacity(4);
    // End of file: the exec closed the held process's copy (close-on-exec). A read error leaves
    // the exec unknown: the process exists and carries the published identity either way.
    let _ = (&release).take(4).read_to_end(&mut answer);
    match <[u8; 4]>::try_from(answer.as_slice()) {
        Ok(bytes) => Err(RejectReason::SpawnFailed {
            errno: i32::from_le_bytes(bytes),
        }),
        Err(_) => Ok(()),
    }
}

/// Steps 7–11, after the held process exists. Returns the supervisor's exit code, or `None`
/// when the user command never ran (reported rejected).
fn finish(plan: &Plan, spawned: Spawned, reporter: &mut Reporter) -> Option<u8> {
    let Spawned {
        user,
        release,
        alive,
        capture,
        made,
    } = spawned;
    let report = match identify(plan, user) {
        Err(reason) => {
            // The process may be running: stop its whole group, and say unknown.
            let _ = kill_process_group(user, Signal::TERM);
            if !reap::exited_within(user, IDENTITY_FAILURE_GRACE) {
                let _ = kill_process_group(user, Signal::KILL);
            }
            Report::Unknown(reason)
        }
        Ok(handle) => match publish_and_release(plan, &handle, release) {
            Ok(()) => Report::Started {
                handle,
                started_at_ms: plan.started_at_ms.get(),
            },
            Err(reason) => {
                // The user command never ran: the held process goes, and so does its handle.
                let _ = kill_process_group(user, Signal::KILL);
                let _ = reap::wait_for_user(user);
                authority::withdraw_handle(Path::new(&plan.state_root), &plan.attempt_id);
                made.remove(plan);
                reporter.send(&Report::Rejected(reason));
                drop(alive);
                return None;
            }
        },
    };
    reporter.send(&report);

    let exit = match reap::wait_for_user(user) {
        Ok(exit) => exit,
        // Cannot happen for our own child; record a failure code rather than invent success.
        Err(_) => Exit::Code(u8::MAX),
    };
    if let Some(cgroup) = &made.cgroup {
        // Everything left in the Run's cgroup, at once (the subreaper below gets the rest).
        cgroup.kill();
    }
    let descendants_gone =
        reap::kill_descendants(Path::new("/proc"), Instant::now() + DESCENDANT_GRACE);
    if let Some(cgroup) = &made.cgroup {
        report_events(plan, cgroup.events(), exit);
    }
    let wait = if descendants_gone {
        CAPTURE_DRAIN_GRACE
    } else {
        Duration::from_millis(100)
    };
    if let Ok((tally, log)) = capture.recv_timeout(wait) {
        publish_fact(plan, tally, log);
    }
    // The Run's directory and cgroup go before the receipt: a completed Run leaves neither.
    made.remove(plan);
    let code = exit.receipt_code();
    publish_receipt(plan, code);
    // Only now may the Worker conclude, from a free lock and no receipt, that none will come.
    drop(alive);
    Some(code)
}

/// The held process ([`super::HOLD_ARG`]): already in the Run's process group, cgroup,
/// directory, identity and environment. Waits for the supervisor's byte on stdin (the handle is
/// durable then), points stdin at `/dev/null` and executes the user command (argv after the
/// mode word). An exec failure goes back to the supervisor as its errno.
pub(crate) fn hold() -> i32 {
    let stdin = rustix::stdio::stdin();
    let mut byte = [0u8; 1];
    loop {
        match rustix::io::read(stdin, &mut byte) {
            Ok(1) => break,
            Err(rustix::io::Errno::INTR) => {}
            // The supervisor is gone before it released us: nothing runs.
            Ok(_) | Err(_) => return NO_SPAWN_EXIT,
        }
    }
    // A close-on-exec copy answers an exec failure; a successful exec closes it (end of file).
    let Ok(answer) = rustix::io::fcntl_dupfd_cloexec(stdin, 3) else {
        return NO_SPAWN_EXIT;
    };
    if redirect_to_null(|null| rustix::stdio::dup2_stdin(null)).is_err() {
        return NO_SPAWN_EXIT;
    }
    let mut argv = std::env::args_os().skip(2);
    let Some(program) = argv.next() else {
        return NO_SPAWN_EXIT;
    };
    let error = Command::new(program).args(argv).exec();
    let code = error.raw_os_error().unwrap_or(0);
    let _ = write_all_fd(rustix::fd::AsFd::as_fd(&answer), &code.to_le_bytes());
    127
}

/// Logs what the kernel counted in the Run's cgroup.
fn report_events(plan: &Plan, events: Events, exit: Exit) {
    if events.oom_kills > 0 {
        diag(
            plan,
            &format!(
                "memory.max reached: the kernel OOM-killed {} process(es) of the Run \
                 (memory.events oom_kill); the user process ended with receipt code {}",
                events.oom_kills,
                exit.receipt_code()
            ),
        );
    }
    if events.pids_max_hits > 0 {
        diag(
            plan,
            &format!(
                "pids.max reached: {} fork(s) refused (pids.events max)",
                events.pids_max_hits
            ),
        );
    }
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
        token: ReceiptToken::of(&plan.capability),
        started_at_ms: plan.started_at_ms,
        finished_at_ms: finished_at,
        exit_code,
    };
    let _ = authority::publish_receipt(Path::new(&plan.state_root), &receipt);
}
