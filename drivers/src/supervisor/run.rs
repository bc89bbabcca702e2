//! The supervisor process body (`ql-worker __supervise`).
//!
//! Order:
//! 1. read the image frame from stdin (the Worker's verified image, `SCM_RIGHTS`);
//! 2. become a child subreaper; refuse if any inheritable descriptor beyond 0–2 is open (the
//!    user would inherit it); start the *held* process: this image in [`super::HOLD_ARG`] mode,
//!    in its own process group, stdout+stderr into the capture pipe, stdin a socket to the
//!    supervisor; it knows nothing of any Run until released. A spare supervisor waits here, so
//!    both process starts are off the launch's path. Then read the plan frame (wiped buffer),
//!    point stdin at `/dev/null` and validate the plan;
//! 3. re-read the inbox record and cross the spawn barrier (exact match or no spawn); re-decide
//!    the execution policy;
//! 4. open the allocated log spool file for capture (verified by the file authority);
//! 5. create the Run's directory (`[run_as]`) and cgroup, and move the held process into that
//!    cgroup; start the capture thread;
//! 7. capture the held process's durable identity (failure: stop the group, report unknown);
//!    publish its handle next to the receipt (`receipts/<aa>/<attemptId>.handle`, 0600, no
//!    fsync: the Worker stops the Run by it when a crash fell between the spawn and `started`;
//!    issue 16), and only then release the held process with the command, environment, identity
//!    and limits ([`Release`]): it sets no new privileges, capabilities and resource limits on
//!    itself and executes the user command (exec, so the identity stays the same). A failed
//!    publication, limit or exec: the user command never ran (killed, reaped, handle withdrawn,
//!    report rejected);
//! 8. report once on stdout, then point stdout at `/dev/null`;
//! 9. pump the log (masking Secret values if asked), wait for the user process, kill and reap
//!    leftover descendants (`cgroup.kill` too), log the cgroup's OOM and pids counters, remove
//!    the Run's cgroup and directory;
//! 10. sync the log, publish the truncation fact (only after a complete capture);
//! 11. publish the receipt; exit with the user's exit code.
//!
//! Every step before the release ends in `Rejected` (the held process never executed the user
//! command, and is killed and reaped). After it, the outcome is `Started` or `Unknown`, and the
//! supervisor always carries on to the receipt.

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
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::authority;
use super::capture::{self, CaptureTally, FailingSink};
use super::frame;
use super::identity::{self, DurableHandle, ProcRoot};
use super::mask::Masker;
use super::plan::{EnvVar, IMAGE_MAGIC, MAX_PLAN_BYTES, PLAN_MAGIC, Plan};
use super::reap::{self, Exit};
use super::report::{RejectReason, Report, UnknownReason};
use super::unix_millis_now;
use crate::containment::cgroup::{Events, RunCgroup};
use crate::containment::limits;
use crate::containment::runs::{self, RunDir};
use crate::containment::settings::RlimitKind;

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
    // The held process is started before any plan exists (a spare supervisor waits with it):
    // its start-up, the loader and Rust's set-up of this image, is then off the launch's path.
    let (held, image) = match read_image().and_then(|image| spawn_held(&image).map(|h| (h, image)))
    {
        Ok(started) => started,
        Err(reason) => {
            reporter.send(&Report::Rejected(reason));
            return NO_SPAWN_EXIT;
        }
    };
    let mut plan = match read_plan() {
        Ok(plan) => plan,
        Err(reason) => {
            drop(held);
            reporter.send(&Report::Rejected(reason));
            return NO_SPAWN_EXIT;
        }
    };
    // A held process that died while a spare waited (killed, out of memory) would fail this
    // launch for nothing of the Run's: it is reaped and another started from the same image.
    let held = if reap::exited_within(held.pid, Duration::ZERO) {
        drop(held);
        match spawn_held(&image) {
            Ok(held) => held,
            Err(reason) => {
                reporter.send(&Report::Rejected(reason));
                return NO_SPAWN_EXIT;
            }
        }
    } else {
        held
    };
    drop(image);
    let code = match prepare(&mut plan, held) {
        Err(reason) => {
            reporter.send(&Report::Rejected(reason));
            NO_SPAWN_EXIT
        }
        Ok(spawned) => finish(&mut plan, spawned, &mut reporter).map_or(NO_SPAWN_EXIT, i32::from),
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

/// Reads the image frame the Worker sends first: no body, and with it the verified image
/// (`SCM_RIGHTS`, close-on-exec) from which the held process is executed. Anything else: the
/// plan channel is not the Worker's.
fn read_image() -> Result<File, RejectReason> {
    let mut buffer = [0u8; frame::HEADER_BYTES];
    let mut image: Option<OwnedFd> = None;
    let mut extra = false;
    fill(&mut buffer, &mut |into| {
        receive(into, &mut image, &mut extra)
    })
    .ok_or(RejectReason::PlanNotReceived)?;
    match image {
        Some(image)
            if !extra && frame::decode::<()>(IMAGE_MAGIC, &buffer, buffer.len()).is_ok() =>
        {
            Ok(File::from(image))
        }
        _ => Err(RejectReason::PlanNotReceived),
    }
}

/// Fills `into` with `read`. `None`: end of file or an error (other than `EINTR`) first.
fn fill(
    into: &mut [u8],
    read: &mut impl FnMut(&mut [u8]) -> rustix::io::Result<usize>,
) -> Option<()> {
    let mut filled = 0usize;
    while filled < into.len() {
        match read(&mut into[filled..]) {
            Ok(0) => return None,
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => return None,
        }
    }
    Some(())
}

/// Reads one whole frame of `magic` (at most `max` bytes) with `read` into a wiped buffer of
/// exactly the announced size: the header first, then the rest. (A buffer of the maximum size
/// is faulted in page by page when it is wiped: about 0.2 ms of the launch's path, measured.)
/// `None`: end of file, an error or a bad header before a whole frame.
fn read_frame(
    magic: [u8; 4],
    max: usize,
    mut read: impl FnMut(&mut [u8]) -> rustix::io::Result<usize>,
) -> Option<Zeroizing<Vec<u8>>> {
    let mut header = [0u8; frame::HEADER_BYTES];
    fill(&mut header, &mut read)?;
    let total = frame::announced_len(magic, &header, max).ok()??;
    let mut buffer = Zeroizing::new(vec![0u8; total]);
    buffer[..frame::HEADER_BYTES].copy_from_slice(&header);
    fill(&mut buffer[frame::HEADER_BYTES..], &mut read)?;
    Some(buffer)
}

/// Reads exactly one plan frame from stdin into a wiped buffer, directly from the descriptor
/// (std's buffered `Stdin` would keep an unwiped copy), then points stdin at `/dev/null`. A
/// descriptor sent with the plan: not delivered as the Worker delivers it.
fn read_plan() -> Result<Plan, RejectReason> {
    let mut stray: Option<OwnedFd> = None;
    let mut extra = false;
    let buffer = read_frame(PLAN_MAGIC, MAX_PLAN_BYTES, |into| {
        receive(into, &mut stray, &mut extra)
    });
    let _ = redirect_to_null(|null| rustix::stdio::dup2_stdin(null));
    let buffer = match buffer {
        Some(buffer) if stray.is_none() && !extra => buffer,
        _ => return Err(RejectReason::PlanNotReceived),
    };
    let plan = Plan::decode(&buffer).map_err(|_| RejectReason::PlanNotReceived)?;
    drop(buffer);
    plan.validate().map_err(RejectReason::PlanInvalid)?;
    // `startedAtMs` is not compared with this host's wall clock, which may have been stepped
    // back since the Worker read it (see `RejectReason::StartTimeInFuture`).
    Ok(plan)
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

/// The held process, not yet released: killed (its whole group) and reaped when dropped armed,
/// which every refusal does. Once [`finish`] takes it over, the receipt path reaps it.
struct Held {
    pid: Pid,
    /// Our end of its stdin: the release frame goes there; an exec failure comes back as an
    /// answer, success as end of file. Closed, it exits without running anything.
    release: Option<UnixStream>,
    /// The read end of its stdout and stderr, until the capture thread takes it.
    output: Option<io::PipeReader>,
    armed: bool,
}

impl Drop for Held {
    fn drop(&mut self) {
        if self.armed {
            drop(self.release.take());
            let _ = kill_process_group(self.pid, Signal::KILL);
            let _ = reap::reap_exact(self.pid);
        }
    }
}

/// What exists once the Run is prepared: the held process, the capture running.
struct Spawned {
    held: Held,
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

/// Step 2: the held process, before any plan: this image in [`super::HOLD_ARG`] mode, executed
/// from the descriptor the Worker sent (close-on-exec: only the path `/proc/self/fd/N` reaches
/// the child, resolved by the kernel in its execve), in its own process group, with an empty
/// environment, stdin a socket to us, stdout and stderr the capture pipe. It knows nothing of
/// the Run until [`publish_and_release`] sends it the command; it runs as we do until then.
fn spawn_held(image: &File) -> Result<Held, RejectReason> {
    set_child_subreaper(Some(getpid())).map_err(|_| RejectReason::SubreaperUnavailable)?;
    match super::inheritable_descriptors() {
        Ok(fds) if fds.is_empty() => {}
        Ok(fds) => return Err(RejectReason::InheritedDescriptor(fds[0])),
        // Cannot prove the table is clean.
        Err(_) => return Err(RejectReason::InheritedDescriptor(u32::MAX)),
    }
    let (output, writer) = io::pipe().map_err(|_| RejectReason::PipeUnavailable)?;
    let (release, held) = UnixStream::pair().map_err(|_| RejectReason::PipeUnavailable)?;
    let stderr = writer
        .try_clone()
        .map_err(|_| RejectReason::PipeUnavailable)?;
    let spawned = Command::new(format!("/proc/self/fd/{}", image.as_raw_fd()))
        .arg0("ql-worker")
        .arg(super::HOLD_ARG)
        .env_clear()
        .process_group(0)
        .stdin(Stdio::from(OwnedFd::from(held)))
        .stdout(Stdio::from(writer))
        .stderr(Stdio::from(stderr))
        .spawn();
    let child = spawned.map_err(|e| RejectReason::SpawnFailed { errno: errno(&e) })?;
    // INVARIANT: a spawned child has a positive pid.
    let pid = Pid::from_child(&child);
    drop(child); // We reap with waitid/waitpid ourselves; dropping a Child never waits or kills.
    Ok(Held {
        pid,
        release: Some(release),
        output: Some(output),
        armed: true,
    })
}

/// Steps 3–6. Every error is proof that the user command never ran (the held process is killed
/// and reaped with it).
fn prepare(plan: &mut Plan, mut held: Held) -> Result<Spawned, RejectReason> {
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
        let admitted = RunCgroup::create(cgroup, plan.offer_id.as_str()).and_then(|cgroup| {
            // A cgroup that exists is removed with the Run, admitted or not.
            let admitted = cgroup.admit(held.pid);
            made.cgroup = Some(cgroup);
            admitted
        });
        if let Err(e) = admitted {
            drop(held);
            made.remove(plan);
            return Err(RejectReason::CgroupUnavailable { errno: errno(&e) });
        }
    }
    let (sender, receiver) = mpsc::channel();
    let fail_writes = plan.seams.fail_log_writes;
    let Some(output) = held.output.take() else {
        drop(held);
        made.remove(plan);
        return Err(RejectReason::PipeUnavailable);
    };
    let pump = thread::Builder::new().spawn(move || {
        let mut masker = masker;
        let outcome = if fail_writes {
            (capture::pump(output, FailingSink, remaining), None)
        } else {
            let mut log = log;
            let tally = capture::pump_masked(output, &mut log, remaining, masker.as_mut());
            (tally, Some(log))
        };
        let _ = sender.send(outcome);
    });
    if pump.is_err() {
        drop(held);
        made.remove(plan);
        return Err(RejectReason::PipeUnavailable);
    }
    Ok(Spawned {
        held,
        alive,
        capture: receiver,
        made,
    })
}

/// What the held process executes once released, and what it sets on itself first: no new
/// privileges (if asked), no inheritable or ambient capabilities, the resource limits; the Run's
/// uid and gid (std clears the supplementary groups, as the Worker checked it may), working
/// directory and exactly the Run's environment. A frame on its stdin socket, wiped after use.
#[derive(Serialize, Deserialize)]
struct Release {
    program: String,
    args: Vec<String>,
    environment: Vec<EnvVar>,
    working_directory: Option<String>,
    identity: Option<(u32, u32)>,
    no_new_privileges: bool,
    rlimits: Vec<(RlimitKind, u64)>,
}

/// Magic of the release frame (supervisor → held process).
const RELEASE_MAGIC: [u8; 4] = *b"QLSX";
/// The held process's answer when it could not execute the user command: a stage byte and the
/// errno (little-endian). End of file instead: the exec closed the answer (close-on-exec).
const ANSWER_BYTES: usize = 5;
/// Stage byte of an answer: setting the limits on itself failed.
const ANSWER_LIMITS: u8 = 1;
/// Stage byte of an answer: the exec failed.
const ANSWER_EXEC: u8 = 0;

impl Release {
    fn of(plan: &Plan, run_dir: Option<&RunDir>) -> Self {
        let (program, args) = match &plan.command {
            ExecCommand::Argv { file, args } => (file.clone(), args.clone()),
            ExecCommand::Shell {
                command: text,
                shell,
            } => (
                shell.clone().unwrap_or_else(|| String::from("/bin/sh")),
                vec![String::from("-c"), text.clone()],
            ),
        };
        let mut environment = plan.environment.clone();
        let mut working_directory = plan.working_directory.clone();
        if let Some(run) = run_dir {
            if working_directory.is_none() {
                working_directory = Some(run.path.to_string_lossy().into_owned());
            }
            if !environment.iter().any(|v| v.name == "TMPDIR") {
                environment.push(EnvVar::new("TMPDIR", run.tmp().to_string_lossy()));
            }
        }
        Self {
            program,
            args,
            environment,
            working_directory,
            identity: run_dir.map(|run| (run.uid, run.gid)),
            no_new_privileges: plan.containment.no_new_privileges,
            rlimits: plan.containment.rlimits.clone(),
        }
    }

    /// Sets the limits on the calling (held) process.
    fn restrict(&self) -> io::Result<()> {
        if self.no_new_privileges {
            limits::no_new_privileges()?;
        }
        // Always: a Worker holding ambient capabilities must not pass them to any user command.
        limits::drop_inheritable_capabilities()?;
        limits::apply(&self.rlimits)
    }

    fn command(&self) -> Command {
        let mut command = Command::new(&self.program);
        command.args(&self.args).env_clear();
        for var in &self.environment {
            command.env(&var.name, var.value.expose());
        }
        if let Some(dir) = &self.working_directory {
            command.current_dir(dir);
        }
        if let Some((uid, gid)) = self.identity {
            // std sets the gid, clears the supplementary groups (setgroups(0): the Worker
            // checked it holds CAP_SETGID) and sets the uid, before exec.
            command.uid(uid).gid(gid);
        }
        command
    }
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

/// Step 7: publishes `handle` durably, then releases the held process with what it executes,
/// and learns whether the user command was executed. An error: it never ran.
fn publish_and_release(
    plan: &mut Plan,
    handle: &str,
    run_dir: Option<&RunDir>,
    mut release: UnixStream,
) -> Result<(), RejectReason> {
    authority::publish_handle(Path::new(&plan.state_root), &plan.attempt_id, handle)
        .map_err(|_| RejectReason::HandleUnpublished)?;
    let frame = frame::encode(RELEASE_MAGIC, &Release::of(plan, run_dir), MAX_PLAN_BYTES);
    // Our copy of the environment (Secret values) goes now: nothing after the release needs it.
    plan.environment.clear();
    let Ok(frame) = frame else {
        return Err(RejectReason::SpawnFailed { errno: 0 });
    };
    if let Err(e) = release.write_all(&frame) {
        // The held process is gone (or cannot hear): it never executed the user command.
        return Err(RejectReason::SpawnFailed { errno: errno(&e) });
    }
    drop(frame);
    let mut answer = Vec::with_capacity(ANSWER_BYTES);
    // End of file: the exec closed the held process's copy (close-on-exec). A read error leaves
    // the exec unknown: the process exists and carries the published identity either way.
    let _ = (&release)
        .take(ANSWER_BYTES as u64)
        .read_to_end(&mut answer);
    match answer.as_slice() {
        [stage, a, b, c, d] => {
            let errno = i32::from_le_bytes([*a, *b, *c, *d]);
            Err(if *stage == ANSWER_LIMITS {
                RejectReason::LimitsUnavailable { errno }
            } else {
                RejectReason::SpawnFailed { errno }
            })
        }
        _ => Ok(()),
    }
}

/// Steps 7–11, after the Run is prepared. Returns the supervisor's exit code, or `None` when
/// the user command never ran (reported rejected).
fn finish(plan: &mut Plan, spawned: Spawned, reporter: &mut Reporter) -> Option<u8> {
    let Spawned {
        mut held,
        alive,
        capture,
        made,
    } = spawned;
    // From here on every path reaps the held process itself.
    held.armed = false;
    let user = held.pid;
    let release = held.release.take();
    let report = match (identify(plan, user), release) {
        (Err(reason), _) => {
            // The process may be running: stop its whole group, and say unknown.
            let _ = kill_process_group(user, Signal::TERM);
            if !reap::exited_within(user, IDENTITY_FAILURE_GRACE) {
                let _ = kill_process_group(user, Signal::KILL);
            }
            Report::Unknown(reason)
        }
        (Ok(handle), release) => {
            let released = release.map_or(Err(RejectReason::PipeUnavailable), |release| {
                publish_and_release(plan, &handle, made.run_dir.as_ref(), release)
            });
            match released {
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
            }
        }
    };
    plan.environment.clear();
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

/// The held process ([`super::HOLD_ARG`]), started before the supervisor has a plan. Waits for
/// the release frame on stdin (sent once the handle is published), points stdin at `/dev/null`,
/// sets the Run's limits on itself and executes the user command (exec, so its identity stays
/// the one published). A failure goes back to the supervisor as a stage and an errno; end of
/// file before a whole frame (the supervisor refused the plan, or is gone): nothing runs.
pub(crate) fn hold() -> i32 {
    let stdin = rustix::stdio::stdin();
    let Some(buffer) = read_frame(RELEASE_MAGIC, MAX_PLAN_BYTES, |into| {
        rustix::io::read(stdin, into)
    }) else {
        return NO_SPAWN_EXIT;
    };
    let Ok(release) = frame::decode::<Release>(RELEASE_MAGIC, &buffer, MAX_PLAN_BYTES) else {
        return NO_SPAWN_EXIT;
    };
    drop(buffer);
    // A close-on-exec copy answers a failure; a successful exec closes it (end of file).
    let Ok(answer) = rustix::io::fcntl_dupfd_cloexec(stdin, 3) else {
        return NO_SPAWN_EXIT;
    };
    if redirect_to_null(|null| rustix::stdio::dup2_stdin(null)).is_err() {
        return NO_SPAWN_EXIT;
    }
    // Built before the limits are set: as little as possible is allocated under them.
    let mut command = release.command();
    let (stage, error) = match release.restrict() {
        Err(e) => (ANSWER_LIMITS, e),
        Ok(()) => (ANSWER_EXEC, command.exec()),
    };
    let code = error.raw_os_error().unwrap_or(0).to_le_bytes();
    let bytes = [stage, code[0], code[1], code[2], code[3]];
    let _ = write_all_fd(rustix::fd::AsFd::as_fd(&answer), &bytes);
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
