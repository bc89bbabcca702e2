//! The Executor port (reference §4.3–§4.4) and its real implementation, which launches the
//! supervisor from the Worker's verified image.

use std::fmt;
use std::fs::File;
use std::io::{self, Write as _};
use std::os::fd::{AsFd, AsRawFd as _, BorrowedFd, OwnedFd};
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ql_worker_core::ids::{
    AttemptId, CallbackSequence, ExecutorHandle, LogArtifactId, OfferId, RunId,
};
use ql_worker_core::io::{LaunchPlan, SpawnOutcome};
use ql_worker_core::revision::ExecCommand;
use ql_worker_core::time::UnixMillis;
use rustix::event::{PollFd, PollFlags, Timespec, poll};
use zeroize::Zeroizing;

use super::SUPERVISE_ARG;
use super::frame;
use super::identity::{DurableHandle, ProcRoot};
use super::plan::{Capability, EnvVar, IMAGE_MAGIC, Plan, Seams, SecretString};
use super::report::{MAX_REPORT_BYTES, REPORT_MAGIC, RejectReason, Report, UnknownReason};
use crate::containment::ContainmentPlan;

/// Everything needed to start one Attempt (reference §4.3 `launch`). The capability and the
/// environment are wiped when the launch is dropped, on every path.
pub struct Launch {
    /// Offer.
    pub offer_id: OfferId,
    /// Run.
    pub run_id: RunId,
    /// Attempt.
    pub attempt_id: AttemptId,
    /// The durable pre-spawn timestamp persisted in `launching`.
    pub executor_started_at: UnixMillis,
    /// What to run.
    pub command: ExecCommand,
    /// The materialized environment, exactly (nothing is inherited).
    pub environment: Vec<EnvVar>,
    /// Absolute working directory, if the revision has one.
    pub working_directory: Option<String>,
    /// The revision's timeout, present only with [`Launch::execution_deadline_at`].
    pub timeout_ms: Option<u64>,
    /// The durable deadline from the starting ACK, present only with `timeout_ms`.
    pub execution_deadline_at: Option<UnixMillis>,
    /// The log artifact persisted in `launching`.
    pub log_artifact_id: LogArtifactId,
    /// Per-attempt log quota (edge 4 MiB, node 64 MiB).
    pub log_quota_bytes: u64,
    /// The callback sequence persisted in `launching`.
    pub callback_sequence: CallbackSequence,
    /// The raw 32-byte completion capability whose digest is persisted in `launching`.
    pub capability: Capability,
}

impl fmt::Debug for Launch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Launch")
            .field("offer_id", &self.offer_id)
            .field("run_id", &self.run_id)
            .field("attempt_id", &self.attempt_id)
            .field("executor_started_at", &self.executor_started_at)
            .field("command", &self.command)
            .field("environment", &self.environment)
            .field("working_directory", &self.working_directory)
            .field("timeout_ms", &self.timeout_ms)
            .field("execution_deadline_at", &self.execution_deadline_at)
            .field("log_artifact_id", &self.log_artifact_id)
            .field("log_quota_bytes", &self.log_quota_bytes)
            .field("callback_sequence", &self.callback_sequence)
            .field("capability", &"[redacted]")
            .finish()
    }
}

impl Launch {
    /// The launch for the core's `Action::Spawn` plan, with the driver's per-attempt log quota
    /// (the spool policy's `maximum_attempt_bytes`). Secret values move without a copy.
    #[must_use]
    pub fn from_core(plan: LaunchPlan, log_quota_bytes: u64) -> Self {
        let LaunchPlan {
            offer_id,
            run_id,
            attempt_id,
            executor_started_at,
            command,
            environment,
            working_directory,
            timeout,
            log_artifact_id,
            callback_sequence,
            capability,
        } = plan;
        let environment = environment
            .into_iter()
            .map(|(name, mut value)| EnvVar {
                name,
                value: SecretString::new(std::mem::take(&mut *value)),
            })
            .collect();
        Self {
            offer_id,
            run_id,
            attempt_id,
            executor_started_at,
            command,
            environment,
            working_directory,
            timeout_ms: timeout.map(|(ms, _)| ms),
            execution_deadline_at: timeout.map(|(_, at)| at),
            log_artifact_id,
            log_quota_bytes,
            callback_sequence,
            capability,
        }
    }
}

/// The outcome of [`Executor::start`], exactly one of three (reference §4.3).
#[must_use]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ExecutorOutcome {
    /// The user process exists; persist `started` with this handle.
    Started {
        /// Durable `ql3lp1.` handle.
        handle: ExecutorHandle,
        /// Equal to the launch's `executor_started_at`.
        started_at: UnixMillis,
    },
    /// Proof that no user process was started: persist `start_failed`.
    Rejected {
        /// Why.
        reason: RejectReason,
    },
    /// A user process may exist: `recovery_required(launch_outcome_unknown)`, never `failStart`.
    Unknown {
        /// Why.
        reason: UnknownReason,
    },
}

impl From<ExecutorOutcome> for SpawnOutcome {
    /// The core's input: the reasons stay in the driver (for diagnostics); the core needs only
    /// the three-way answer.
    fn from(outcome: ExecutorOutcome) -> Self {
        match outcome {
            ExecutorOutcome::Started { handle, started_at } => Self::Started {
                handle: handle.as_str().to_owned(),
                started_at,
            },
            ExecutorOutcome::Rejected { .. } => Self::Rejected,
            ExecutorOutcome::Unknown { .. } => Self::Unknown,
        }
    }
}

/// The Executor port.
pub trait Executor {
    /// Starts one Attempt. Ownership of the launch (and its capability) transfers; it is wiped
    /// whatever happens.
    fn start(&mut self, launch: Launch) -> ExecutorOutcome;
}

/// The Worker's own executable, opened once at start-up. The supervisor is executed from this
/// descriptor (`/proc/self/fd/N`), so replacing the file on disk afterwards cannot change what
/// supervises.
#[derive(Debug)]
pub struct SupervisorImage {
    file: File,
}

impl SupervisorImage {
    /// Opens `/proc/self/exe` (`O_RDONLY|O_CLOEXEC`). Call once, at start-up.
    ///
    /// # Errors
    /// When the image cannot be opened or is not an executable regular file.
    pub fn current_exe() -> io::Result<Self> {
        Self::open(Path::new("/proc/self/exe"))
    }

    /// Opens another `ql-worker` image (tests and benchmarks, whose own executable is the test
    /// harness).
    ///
    /// # Errors
    /// When the image cannot be opened or is not an executable regular file.
    pub fn open(path: &Path) -> io::Result<Self> {
        // std opens with O_CLOEXEC: the descriptor never leaks into any child.
        let file = File::open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "supervisor image is not an executable regular file",
            ));
        }
        Ok(Self { file })
    }

    /// The path that executes this exact open file. The kernel resolves it in `execve` before
    /// close-on-exec applies.
    fn exec_path(&self) -> String {
        format!("/proc/self/fd/{}", self.file.as_raw_fd())
    }
}

/// The real Executor: validates the launch, starts a supervisor process from the verified
/// image, sends it the plan (and the image, `SCM_RIGHTS`) over its stdin socket, and maps its
/// one report to an outcome. The supervisor outlives the Worker; the Worker only reaps it if it
/// is still around.
#[derive(Debug)]
pub struct SupervisorExecutor {
    image: SupervisorImage,
    state_root: PathBuf,
    report_timeout: Duration,
    seams: Seams,
    containment: ContainmentPlan,
    worker_policy_check: bool,
    supervisor_stderr: Option<File>,
    /// Live supervisors: the offer, the child, its pidfd and when it was launched (the pidfd is
    /// readable once it exits; `None` where the kernel has no `pidfd_open`, before Linux 5.3).
    supervisors: Vec<(OfferId, Child, Option<OwnedFd>, Instant)>,
    /// Offers whose supervisor was reaped since the last [`SupervisorExecutor::take_exited`].
    exited: Vec<OfferId>,
    /// A supervisor started ahead of need, waiting for a plan on its stdin socket (the Worker's
    /// end is kept with it; [`SupervisorExecutor::prepare_spare`]). Ends at end of file without
    /// reporting.
    spare: Option<(Child, UnixStream)>,
}

/// `SO_SNDBUF` asked for the Worker's end of a supervisor's plan socket (the kernel doubles it).
const PLAN_SEND_BUFFER: usize = 32 * 1024;

/// How long the Worker waits for the supervisor's launch report by default.
pub const DEFAULT_REPORT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long after a launch no spare supervisor is started while that Run's supervisor runs.
pub const SPARE_AFTER_LAUNCH: Duration = Duration::from_secs(1);
/// How long a retired spare supervisor may take to exit before it is killed.
const SPARE_RETIRE_GRACE: Duration = Duration::from_secs(1);

impl Drop for SupervisorExecutor {
    fn drop(&mut self) {
        self.retire_spare();
    }
}

impl SupervisorExecutor {
    /// An executor for the file authority rooted at `state_root`.
    #[must_use]
    pub fn new(image: SupervisorImage, state_root: impl Into<PathBuf>) -> Self {
        Self {
            image,
            state_root: state_root.into(),
            report_timeout: DEFAULT_REPORT_TIMEOUT,
            seams: Seams::default(),
            containment: ContainmentPlan::default(),
            worker_policy_check: true,
            supervisor_stderr: None,
            supervisors: Vec::new(),
            exited: Vec::new(),
            spare: None,
        }
    }

    /// Starts a supervisor ahead of need, if none is waiting: the next launch hands it the plan
    /// instead of starting one, which takes the supervisor's process start (fork, exec, loader;
    /// about 0.5–1 ms) off the launch's critical path. The runtime calls this when its loop is
    /// idle with no call in flight. The spare is the same image, arguments and environment a
    /// launch would start; it knows nothing until it reads a plan, and at end of file on its
    /// stdin (the Worker exited, or [`SupervisorExecutor::retire_spare`]) it exits with
    /// [`super::run::NO_SPAWN_EXIT`] having done nothing. A failure to start one is not an
    /// error here: the launch then starts its own, as without a spare.
    ///
    /// Not while a supervisor launched less than [`SPARE_AFTER_LAUNCH`] ago still runs: a short
    /// Run is then likely to end soon, and the Worker's completion of it (reap, upload,
    /// completion) would wait behind the start of the spare on a small host.
    pub fn prepare_spare(&mut self) {
        if self
            .supervisors
            .iter()
            .any(|(_, _, _, launched)| launched.elapsed() < SPARE_AFTER_LAUNCH)
        {
            return;
        }
        if let Some((spare, _)) = &mut self.spare {
            if matches!(spare.try_wait(), Ok(None)) {
                return;
            }
            self.spare = None;
        }
        self.spare = self.spawn_supervisor().ok();
    }

    /// Ends the spare supervisor, if any (a drain; the Worker's exit): closes its stdin socket,
    /// so it exits having done nothing, and reaps it (killed after a bounded wait).
    pub fn retire_spare(&mut self) {
        let Some((mut spare, socket)) = self.spare.take() else {
            return;
        };
        drop(socket);
        let deadline = Instant::now() + SPARE_RETIRE_GRACE;
        while matches!(spare.try_wait(), Ok(None)) {
            if Instant::now() >= deadline {
                let _ = spare.kill();
                let _ = spare.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The spare supervisor's pid, if one is waiting.
    #[must_use]
    pub fn spare_pid(&self) -> Option<u32> {
        self.spare.as_ref().map(|(spare, _)| spare.id())
    }

    /// The spare supervisor if it is still waiting, else a new one.
    fn take_or_spawn_supervisor(&mut self) -> Result<(Child, UnixStream), SpawnError> {
        if let Some((mut spare, socket)) = self.spare.take()
            && matches!(spare.try_wait(), Ok(None))
        {
            return Ok((spare, socket));
        }
        self.spawn_supervisor()
    }

    /// Test seam: the supervisors' diagnostics go to `file` instead of the Worker's stderr.
    #[doc(hidden)]
    #[must_use]
    pub fn with_supervisor_stderr(mut self, file: File) -> Self {
        self.supervisor_stderr = Some(file);
        self
    }

    /// Sets what every supervisor enforces (from `containment::prepare`).
    #[must_use]
    pub fn with_containment(mut self, containment: ContainmentPlan) -> Self {
        self.containment = containment;
        self
    }

    /// The containment every supervisor receives.
    #[must_use]
    pub fn containment(&self) -> &ContainmentPlan {
        &self.containment
    }

    /// Test seam: skip the Worker's own policy check, so the supervisor's re-check is what
    /// refuses (proves the supervisor enforces the policy by itself).
    #[doc(hidden)]
    #[must_use]
    pub fn without_worker_policy_check(mut self) -> Self {
        self.worker_policy_check = false;
        self
    }

    /// Sets how long to wait for the launch report before answering `Unknown`.
    #[must_use]
    pub fn with_report_timeout(mut self, timeout: Duration) -> Self {
        self.report_timeout = timeout;
        self
    }

    /// Test seam: the supervisor reads identities from another `/proc`-like tree.
    #[doc(hidden)]
    #[must_use]
    pub fn with_identity_proc_root(mut self, proc_root: &ProcRoot) -> Self {
        self.seams.proc_root = Some(proc_root.path().to_string_lossy().into_owned());
        self
    }

    /// Test seam: the supervisor fails every log write.
    #[doc(hidden)]
    #[must_use]
    pub fn with_failing_log_writes(mut self) -> Self {
        self.seams.fail_log_writes = true;
        self
    }

    /// Reaps supervisors that have exited; returns how many are still running. The Worker calls
    /// this from its loop so finished supervisors do not linger as zombies.
    pub fn reap_exited(&mut self) -> usize {
        let exited = &mut self.exited;
        self.supervisors.retain_mut(|(offer_id, child, _, _)| {
            let gone = matches!(child.try_wait(), Ok(Some(_)) | Err(_));
            if gone {
                exited.push(offer_id.clone());
            }
            !gone
        });
        self.supervisors.len()
    }

    /// Waits at most `timeout` for a live supervisor to exit: returns as soon as one has (its
    /// pidfd turns readable), so the Worker runs that Run's completion at once instead of at
    /// its next poll; also as soon as `also` turns readable (the call threads' wake-up, see
    /// [`crate::calls`]). Without any descriptor it just sleeps `timeout`. Whether one may have
    /// exited or `also` is readable (reap and look to know).
    pub fn wait_exit(&self, timeout: Duration, also: Option<BorrowedFd<'_>>) -> bool {
        let mut fds: Vec<PollFd<'_>> = self
            .supervisors
            .iter()
            .filter_map(|(_, _, pidfd, _)| pidfd.as_ref())
            .map(|fd| PollFd::new(fd, PollFlags::IN))
            .collect();
        if let Some(fd) = &also {
            fds.push(PollFd::new(fd, PollFlags::IN));
        }
        if fds.is_empty() {
            std::thread::sleep(timeout);
            return false;
        }
        let wait = Timespec {
            tv_sec: i64::try_from(timeout.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(timeout.subsec_nanos()),
        };
        // EINTR (a signal) or any failure: the caller checks signals and reaps anyway.
        poll(&mut fds, Some(&wait)).map_or(true, |ready| ready > 0)
    }

    /// The offers whose supervisor exited (was reaped) since the last call, in reaping order.
    /// A supervisor exits once its user process has ended and its receipt is published (or it
    /// failed), so the Worker can run that record's completion pass at once.
    pub fn take_exited(&mut self) -> Vec<OfferId> {
        std::mem::take(&mut self.exited)
    }

    /// The supervisors started by this executor that have not been reaped yet (pids).
    #[must_use]
    pub fn supervisor_pids(&self) -> Vec<u32> {
        self.supervisors
            .iter()
            .map(|(_, child, _, _)| child.id())
            .collect()
    }

    fn plan(&self, launch: Launch) -> Result<Plan, RejectReason> {
        if launch.timeout_ms.is_some() != launch.execution_deadline_at.is_some() {
            return Err(RejectReason::TimeoutWithoutDeadline);
        }
        let Some(state_root) = self.state_root.to_str() else {
            return Err(RejectReason::PlanInvalid(super::plan::PlanError::StateRoot));
        };
        // The execution policy, decided before any supervisor (let alone a user process) exists.
        if self.worker_policy_check {
            self.containment
                .check_policy(&launch.command, launch.working_directory.as_deref())
                .map_err(RejectReason::PolicyRefused)?;
        }
        let plan = Plan {
            state_root: state_root.to_owned(),
            offer_id: launch.offer_id,
            run_id: launch.run_id,
            attempt_id: launch.attempt_id,
            callback_sequence: launch.callback_sequence,
            capability: launch.capability,
            log_artifact_id: launch.log_artifact_id,
            log_quota_bytes: launch.log_quota_bytes,
            started_at_ms: launch.executor_started_at,
            command: launch.command,
            environment: launch.environment,
            working_directory: launch.working_directory,
            containment: self.containment.clone(),
            seams: self.seams.clone(),
        };
        plan.validate().map_err(RejectReason::PlanInvalid)?;
        Ok(plan)
    }

    /// Spawns a supervisor; its stdin is a Unix socket (the Worker's end is returned) over
    /// which [`deliver`] sends the plan and, with it, the image itself (`SCM_RIGHTS`).
    fn spawn_supervisor(&self) -> Result<(Child, UnixStream), SpawnError> {
        let (ours, theirs) = UnixStream::pair().map_err(SpawnError::Spawn)?;
        // No more in flight than a pipe holds (the kernel doubles the 32 KiB asked): a plan
        // larger than that reaches only a supervisor that reads it, so a complete write still
        // tells a reading supervisor from an image that exited without reading.
        rustix::net::sockopt::set_socket_send_buffer_size(&ours, PLAN_SEND_BUFFER)
            .map_err(|e| SpawnError::Spawn(e.into()))?;
        let child = Command::new(self.image.exec_path())
            .arg0("ql-worker")
            .arg(SUPERVISE_ARG)
            .env_clear()
            .env(
                crate::events::ENV_LOG_FORMAT,
                crate::events::format().as_str(),
            )
            // Its own process group: a terminal or group signal aimed at the Worker does not
            // reach the supervisor, which must outlive the Worker.
            .process_group(0)
            .stdin(Stdio::from(OwnedFd::from(theirs)))
            .stdout(Stdio::piped())
            // The supervisor's diagnostics (a cgroup OOM kill, a Run directory it could not
            // remove) go where the Worker's own go: the service's journal.
            .stderr(match &self.supervisor_stderr {
                Some(file) => Stdio::from(file.try_clone().map_err(SpawnError::Spawn)?),
                None => Stdio::inherit(),
            })
            .spawn()
            .map_err(SpawnError::Spawn)?;
        // The image goes first, before any plan: the supervisor starts its held process from it
        // at once, so a spare has it ready (its start-up is then off the launch's path).
        let image = match frame::encode(IMAGE_MAGIC, &(), frame::HEADER_BYTES) {
            Ok(frame) => send_with(&ours, &frame, self.image.file.as_fd()),
            Err(_) => false,
        };
        if !image {
            // It did not read it (it exited, or is not a supervisor): it cannot have a plan.
            let mut child = child;
            let _ = child.kill();
            let _ = child.wait();
            return Err(SpawnError::ImageNotSent);
        }
        Ok((child, ours))
    }
}

impl Executor for SupervisorExecutor {
    fn start(&mut self, launch: Launch) -> ExecutorOutcome {
        self.reap_exited();
        let started_at = launch.executor_started_at;
        let offer_id = launch.offer_id.clone();
        let attempt_id = launch.attempt_id.clone();
        let plan = match self.plan(launch) {
            Ok(plan) => plan,
            Err(reason) => return ExecutorOutcome::Rejected { reason },
        };
        let frame = match plan.encode() {
            Ok(frame) => frame,
            Err(_) => {
                return ExecutorOutcome::Rejected {
                    reason: RejectReason::PlanNotReceived,
                };
            }
        };
        drop(plan);
        let (mut child, plan_socket) = match self.take_or_spawn_supervisor() {
            Ok(spawned) => spawned,
            Err(SpawnError::Spawn(e)) => {
                return ExecutorOutcome::Rejected {
                    reason: RejectReason::SupervisorSpawnFailed {
                        errno: e.raw_os_error().unwrap_or(0),
                    },
                };
            }
            Err(SpawnError::ImageNotSent) => {
                return ExecutorOutcome::Rejected {
                    reason: RejectReason::PlanNotReceived,
                };
            }
        };
        let delivered = deliver(plan_socket, frame);
        let stdout = child.stdout.take();
        let pidfd = rustix::process::Pid::from_raw(i32::try_from(child.id()).unwrap_or(0))
            .and_then(|pid| {
                rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok()
            });
        self.supervisors
            .push((offer_id, child, pidfd, Instant::now()));
        if !delivered {
            // The supervisor acts only on a complete plan frame; an incomplete write proves it
            // never had one.
            return ExecutorOutcome::Rejected {
                reason: RejectReason::PlanNotReceived,
            };
        }
        let Some(stdout) = stdout else {
            return ExecutorOutcome::Unknown {
                reason: UnknownReason::ReportUnreadable,
            };
        };
        match read_report(&stdout, self.report_timeout) {
            Err(reason) => ExecutorOutcome::Unknown { reason },
            Ok(Report::Rejected(reason)) => ExecutorOutcome::Rejected { reason },
            Ok(Report::Unknown(reason)) => ExecutorOutcome::Unknown { reason },
            Ok(Report::Started {
                handle,
                started_at_ms,
            }) => {
                if started_at_ms != started_at.get() {
                    return ExecutorOutcome::Unknown {
                        reason: UnknownReason::StartTimeMismatch,
                    };
                }
                match DurableHandle::of_attempt(&handle, &attempt_id) {
                    Ok(handle) => ExecutorOutcome::Started { handle, started_at },
                    Err(_) => ExecutorOutcome::Unknown {
                        reason: UnknownReason::HandleInvalid,
                    },
                }
            }
        }
    }
}

/// Why no supervisor could be given a plan.
enum SpawnError {
    /// The image could not be executed (or its plan socket not made).
    Spawn(io::Error),
    /// It was executed but did not take the image frame: it never had, and never will have, a
    /// plan.
    ImageNotSent,
}

/// Writes the whole plan frame and closes the socket. The frame is wiped on drop.
fn deliver(mut socket: UnixStream, frame: Zeroizing<Vec<u8>>) -> bool {
    let ok = socket.write_all(&frame).is_ok();
    drop(socket);
    drop(frame);
    ok
}

/// Writes `bytes` with `fd` attached to the first of them (`SCM_RIGHTS`): the verified image,
/// from which the supervisor executes its held process, never from a path it would have to
/// resolve itself (under qemu-user its `/proc/self/exe` is a path the emulator opens; see
/// docs/supervisor.md).
fn send_with(socket: &UnixStream, bytes: &[u8], fd: BorrowedFd<'_>) -> bool {
    use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags, sendmsg};
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    let fds = [fd];
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return false;
    }
    let sent = loop {
        match sendmsg(
            socket,
            &[io::IoSlice::new(bytes)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Ok(n) => break Some(n),
            Err(rustix::io::Errno::INTR) => {}
            Err(_) => break None,
        }
    };
    sent.is_some_and(|n| n > 0 && (&mut &*socket).write_all(&bytes[n..]).is_ok())
}

/// Reads one report frame, waiting at most `timeout` in all.
fn read_report<Fd: AsFd>(stdout: &Fd, timeout: Duration) -> Result<Report, UnknownReason> {
    let deadline = Instant::now() + timeout;
    let mut buffer = [0u8; MAX_REPORT_BYTES];
    let mut filled = 0usize;
    loop {
        match frame::announced_len(REPORT_MAGIC, &buffer[..filled], MAX_REPORT_BYTES) {
            Err(_) => return Err(UnknownReason::ReportGarbled),
            Ok(Some(total)) if filled >= total => {
                return Report::decode(&buffer[..total]).map_err(|_| UnknownReason::ReportGarbled);
            }
            Ok(_) => {}
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(UnknownReason::ReportTimedOut);
        }
        let wait = Timespec {
            tv_sec: i64::try_from(left.as_secs()).unwrap_or(i64::MAX),
            tv_nsec: i64::from(left.subsec_nanos()),
        };
        let mut fds = [PollFd::new(stdout, PollFlags::IN)];
        match poll(&mut fds, Some(&wait)) {
            Ok(0) => return Err(UnknownReason::ReportTimedOut),
            Ok(_) => {}
            Err(rustix::io::Errno::INTR) => continue,
            Err(_) => return Err(UnknownReason::ReportUnreadable),
        }
        match rustix::io::read(stdout, &mut buffer[filled..]) {
            Ok(0) if filled == 0 => return Err(UnknownReason::ReportMissing),
            Ok(0) => return Err(UnknownReason::ReportGarbled),
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR | rustix::io::Errno::AGAIN) => {}
            Err(_) => return Err(UnknownReason::ReportUnreadable),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    fn report_from(bytes: &[u8], close: bool) -> Result<Report, UnknownReason> {
        let (reader, mut writer) = io::pipe().unwrap();
        writer.write_all(bytes).unwrap();
        let keep = if close {
            drop(writer);
            None
        } else {
            Some(writer)
        };
        let result = read_report(&reader, Duration::from_millis(100));
        drop(keep);
        result
    }

    #[test]
    fn launch_from_the_core_plan_keeps_every_field() {
        use ql_worker_core::ids::OfferId;
        let plan = LaunchPlan {
            offer_id: OfferId::new("offer-1").unwrap(),
            run_id: RunId::new("run-1").unwrap(),
            attempt_id: AttemptId::new("attempt-1").unwrap(),
            executor_started_at: UnixMillis::new(5).unwrap(),
            command: ExecCommand::Argv {
                file: "/bin/true".into(),
                args: vec![],
            },
            environment: vec![("SECRET".into(), Zeroizing::new("value".into()))],
            working_directory: Some("/tmp".into()),
            timeout: Some((5000, UnixMillis::new(9).unwrap())),
            log_artifact_id: LogArtifactId::new("wlog-0123456789abcdef0123456789abcd").unwrap(),
            callback_sequence: CallbackSequence::new(2).unwrap(),
            capability: Capability::from_bytes([3; 32]),
        };
        let launch = Launch::from_core(plan, 4 * 1024 * 1024);
        assert_eq!(launch.environment, vec![EnvVar::new("SECRET", "value")]);
        assert_eq!(launch.timeout_ms, Some(5000));
        assert_eq!(
            launch.execution_deadline_at,
            Some(UnixMillis::new(9).unwrap())
        );
        assert_eq!(launch.log_quota_bytes, 4 * 1024 * 1024);
        assert_eq!(launch.capability.expose(), &[3; 32]);
        let debug = format!("{launch:?}");
        assert!(
            !debug.contains("value\"") && debug.contains("[redacted]"),
            "{debug}"
        );
        assert_eq!(
            SpawnOutcome::from(ExecutorOutcome::Rejected {
                reason: RejectReason::LogUnavailable
            }),
            SpawnOutcome::Rejected
        );
    }

    #[test]
    fn report_reading_maps_every_failure_to_unknown() {
        let started = Report::Started {
            handle: "ql3lp1.x".into(),
            started_at_ms: 9,
        };
        let frame = started.encode().unwrap();
        assert_eq!(report_from(&frame, true), Ok(started.clone()));
        assert_eq!(report_from(&frame, false), Ok(started), "no EOF needed");
        assert_eq!(report_from(b"", true), Err(UnknownReason::ReportMissing));
        assert_eq!(
            report_from(b"garbage-garbage", true),
            Err(UnknownReason::ReportGarbled)
        );
        assert_eq!(
            report_from(&frame[..5], true),
            Err(UnknownReason::ReportGarbled)
        );
        assert_eq!(
            report_from(&frame[..5], false),
            Err(UnknownReason::ReportTimedOut)
        );
        assert_eq!(report_from(b"", false), Err(UnknownReason::ReportTimedOut));
    }
}
