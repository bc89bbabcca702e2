//! The launch plan: everything the supervisor needs, sent by the Worker over the supervisor's
//! stdin socket (never argv, never the environment) and wiped from every buffer that held it.
//!
//! Validation follows the reference launcher (§5.1) and is run twice: by the Worker before it
//! spawns anything, and by the supervisor on the decoded plan.

use std::fmt;

use ql_worker_core::barrier::Barrier;
use ql_worker_core::ids::{AttemptId, CallbackSequence, LogArtifactId, OfferId, RunId};
use ql_worker_core::revision::ExecCommand;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::truncation::{MAX_LOG_QUOTA_BYTES, MIN_LOG_QUOTA_BYTES};
use serde::{Deserialize, Serialize};
use zeroize::Zeroizing;

use super::frame::{self, FrameError};
use crate::containment::ContainmentPlan;

/// Magic of a plan frame.
pub(crate) const PLAN_MAGIC: [u8; 4] = *b"QLSP";
/// Magic of the image frame: no body, the Worker's verified image with it (`SCM_RIGHTS`), sent
/// as soon as the supervisor is started, before any plan.
pub(crate) const IMAGE_MAGIC: [u8; 4] = *b"QLSI";
/// Largest plan frame: command and environment are 64 KiB each at most, paths 4 KiB each.
pub const MAX_PLAN_BYTES: usize = 192 * 1024;

/// Largest number of environment entries.
pub const MAX_ENV_ENTRIES: usize = 256;
/// Largest environment value, in bytes.
pub const MAX_ENV_VALUE_BYTES: usize = 16 * 1024;
/// Largest environment, names and values together.
pub const MAX_ENV_TOTAL_BYTES: usize = 64 * 1024;
/// Largest number of argv arguments.
pub const MAX_ARGS: usize = 256;
/// Largest single argument.
pub const MAX_ARG_BYTES: usize = 16 * 1024;
/// Largest command (argv file and arguments together, or the shell command).
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;
/// Largest path.
pub const MAX_PATH_BYTES: usize = 4096;

/// The completion capability: the core's type (wiped on drop, no `Debug`, no `Clone`).
pub use ql_worker_core::capability::Capability;

/// Serializes the capability's raw bytes, into the (wiped) plan frame only.
mod capability_bytes {
    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use zeroize::Zeroize;

    use super::Capability;

    pub(super) fn serialize<S: Serializer>(c: &Capability, s: S) -> Result<S::Ok, S::Error> {
        c.expose().serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Capability, D::Error> {
        let mut bytes = <[u8; 32]>::deserialize(d)?;
        let capability = Capability::from_bytes(bytes);
        bytes.zeroize();
        Ok(capability)
    }
}

/// Text that may be a Secret value: the core's one secret-string type (wiped on drop, redacted
/// in `Debug`, compared in constant time; carried raw only in the postcard plan frame).
pub use ql_worker_core::secret::SecretString;

/// One materialized environment entry (public value or resolved Secret; both are treated as
/// secret in memory).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvVar {
    /// `^[A-Za-z_][A-Za-z0-9_]{0,127}$`.
    pub name: String,
    /// Non-empty, ≤ 16 KiB, no NUL.
    pub value: SecretString,
}

impl EnvVar {
    /// Convenience constructor.
    #[must_use]
    pub fn new(name: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            value: SecretString::new(value.into()),
        }
    }
}

/// Test seams carried by the plan. Production plans leave both at their defaults.
#[doc(hidden)]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seams {
    /// Read process identity from this directory instead of `/proc` (identity-failure tests).
    pub proc_root: Option<String>,
    /// Fail every log write, as a full disk would (capture-failure tests).
    pub fail_log_writes: bool,
}

/// The plan.
#[derive(Serialize, Deserialize)]
pub struct Plan {
    /// The state root of the file authority (inbox, receipts, logs).
    pub state_root: String,
    /// Offer.
    pub offer_id: OfferId,
    /// Run.
    pub run_id: RunId,
    /// Attempt.
    pub attempt_id: AttemptId,
    /// `completionReceiptCallbackSequence` of the `launching` record.
    pub callback_sequence: CallbackSequence,
    /// The raw completion capability.
    #[serde(with = "capability_bytes")]
    pub capability: Capability,
    /// Log artifact.
    pub log_artifact_id: LogArtifactId,
    /// Per-attempt log quota, 64 KiB ..= 1 GiB.
    pub log_quota_bytes: u64,
    /// `executorStartedAtMs` of the `launching` record.
    pub started_at_ms: UnixMillis,
    /// What to run.
    pub command: ExecCommand,
    /// Exactly the child's environment.
    pub environment: Vec<EnvVar>,
    /// Absolute working directory; absent means the supervisor's (the Worker's) own.
    pub working_directory: Option<String>,
    /// What the supervisor enforces: identity, limits, cgroup, policy, masking.
    pub containment: ContainmentPlan,
    /// Test seams.
    #[doc(hidden)]
    pub seams: Seams,
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plan")
            .field("state_root", &self.state_root)
            .field("offer_id", &self.offer_id)
            .field("run_id", &self.run_id)
            .field("attempt_id", &self.attempt_id)
            .field("callback_sequence", &self.callback_sequence)
            .field("capability", &"[redacted]")
            .field("log_artifact_id", &self.log_artifact_id)
            .field("log_quota_bytes", &self.log_quota_bytes)
            .field("started_at_ms", &self.started_at_ms)
            .field("command", &self.command)
            .field("environment", &self.environment)
            .field("working_directory", &self.working_directory)
            .field("containment", &self.containment)
            .field("seams", &self.seams)
            .finish()
    }
}

/// A plan rule that is broken. Never carries a value (values may be Secrets).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum PlanError {
    /// The state root is not an absolute path of at most 4096 bytes without NUL.
    #[error("state root must be an absolute path")]
    StateRoot,
    /// The log quota is outside 64 KiB ..= 1 GiB.
    #[error("log quota must be within 64 KiB..=1 GiB")]
    Quota,
    /// The argv file is not absolute, or has a NUL, or is too long.
    #[error("argv file must be an absolute path without NUL")]
    ArgvFile,
    /// Too many or too long arguments, or a NUL.
    #[error("argv must have at most 256 arguments of at most 16 KiB without NUL, 64 KiB in all")]
    Args,
    /// The shell command is empty, too long or has a NUL.
    #[error("shell command must be 1 byte..64 KiB without NUL")]
    ShellCommand,
    /// The shell is not `/bin/sh` or `/bin/bash`.
    #[error("shell must be /bin/sh or /bin/bash")]
    Shell,
    /// Too many entries or too many bytes.
    #[error("environment must have at most 256 entries and 64 KiB")]
    EnvSize,
    /// A name breaks `^[A-Za-z_][A-Za-z0-9_]{0,127}$`.
    #[error("environment names must match ^[A-Za-z_][A-Za-z0-9_]{{0,127}}$")]
    EnvName,
    /// A name appears twice.
    #[error("environment names must be unique")]
    EnvDuplicate,
    /// A value is empty, longer than 16 KiB or has a NUL.
    #[error("environment values must be 1 byte..16 KiB without NUL")]
    EnvValue,
    /// The working directory is not absolute, is `/`, is too long or has a NUL.
    #[error("working directory must be an absolute path other than /")]
    WorkingDirectory,
    /// A test seam path is not absolute.
    #[error("proc root must be an absolute path")]
    ProcRoot,
    /// The containment plan is malformed (a path, a duplicate limit, the policy).
    #[error("containment plan is malformed")]
    Containment,
}

fn is_absolute_path(path: &str) -> bool {
    path.starts_with('/') && path.len() <= MAX_PATH_BYTES && !path.contains('\0')
}

fn is_env_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=128).contains(&bytes.len())
        && (bytes[0].is_ascii_alphabetic() || bytes[0] == b'_')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || *b == b'_')
}

/// Checks a command against the launcher's rules.
///
/// # Errors
/// The first [`PlanError`].
pub fn validate_command(command: &ExecCommand) -> Result<(), PlanError> {
    match command {
        ExecCommand::Argv { file, args } => {
            if !is_absolute_path(file) {
                return Err(PlanError::ArgvFile);
            }
            let total = args.iter().map(String::len).sum::<usize>() + file.len();
            if args.len() > MAX_ARGS
                || total > MAX_COMMAND_BYTES
                || args
                    .iter()
                    .any(|a| a.len() > MAX_ARG_BYTES || a.contains('\0'))
            {
                return Err(PlanError::Args);
            }
        }
        ExecCommand::Shell { command, shell } => {
            if command.is_empty() || command.len() > MAX_COMMAND_BYTES || command.contains('\0') {
                return Err(PlanError::ShellCommand);
            }
            if !matches!(shell.as_deref(), None | Some("/bin/sh" | "/bin/bash")) {
                return Err(PlanError::Shell);
            }
        }
    }
    Ok(())
}

/// Checks an environment against the launcher's rules.
///
/// # Errors
/// The first [`PlanError`].
pub fn validate_environment(environment: &[EnvVar]) -> Result<(), PlanError> {
    if environment.len() > MAX_ENV_ENTRIES {
        return Err(PlanError::EnvSize);
    }
    let mut total = 0usize;
    let mut names: Vec<&str> = Vec::with_capacity(environment.len());
    for var in environment {
        if !is_env_name(&var.name) {
            return Err(PlanError::EnvName);
        }
        let value = var.value.expose();
        if value.is_empty() || value.len() > MAX_ENV_VALUE_BYTES || value.contains('\0') {
            return Err(PlanError::EnvValue);
        }
        total += var.name.len() + value.len();
        names.push(&var.name);
    }
    if total > MAX_ENV_TOTAL_BYTES {
        return Err(PlanError::EnvSize);
    }
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        return Err(PlanError::EnvDuplicate);
    }
    Ok(())
}

/// Checks an optional working directory.
///
/// # Errors
/// [`PlanError::WorkingDirectory`].
pub fn validate_working_directory(dir: Option<&str>) -> Result<(), PlanError> {
    match dir {
        None => Ok(()),
        Some(dir) if is_absolute_path(dir) && dir != "/" => Ok(()),
        Some(_) => Err(PlanError::WorkingDirectory),
    }
}

impl Plan {
    /// What this plan requires of the durable `launching` record: the core's spawn barrier
    /// ([`Barrier::check`]), which the supervisor crosses on the record it re-reads.
    #[must_use]
    pub fn barrier(&self) -> Barrier<'_> {
        Barrier {
            offer_id: &self.offer_id,
            run_id: &self.run_id,
            attempt_id: &self.attempt_id,
            callback_sequence: self.callback_sequence,
            token_digest: self.capability.digest(),
            log_artifact_id: &self.log_artifact_id,
            executor_started_at: self.started_at_ms,
        }
    }

    /// All plan rules.
    ///
    /// # Errors
    /// The first [`PlanError`].
    pub fn validate(&self) -> Result<(), PlanError> {
        if !is_absolute_path(&self.state_root) {
            return Err(PlanError::StateRoot);
        }
        if !(MIN_LOG_QUOTA_BYTES..=MAX_LOG_QUOTA_BYTES).contains(&self.log_quota_bytes) {
            return Err(PlanError::Quota);
        }
        validate_command(&self.command)?;
        validate_environment(&self.environment)?;
        validate_working_directory(self.working_directory.as_deref())?;
        if let Some(root) = &self.seams.proc_root
            && !is_absolute_path(root)
        {
            return Err(PlanError::ProcRoot);
        }
        self.containment
            .validate()
            .map_err(|_| PlanError::Containment)?;
        Ok(())
    }

    /// Encodes the plan into a frame held in a wiped buffer.
    ///
    /// # Errors
    /// When the plan does not fit [`MAX_PLAN_BYTES`].
    pub(crate) fn encode(&self) -> Result<Zeroizing<Vec<u8>>, FrameError> {
        frame::encode(PLAN_MAGIC, self, MAX_PLAN_BYTES)
    }

    /// Decodes a complete plan frame.
    ///
    /// # Errors
    /// When `bytes` is not exactly one valid plan frame.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, FrameError> {
        frame::decode(PLAN_MAGIC, bytes, MAX_PLAN_BYTES)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample() -> Plan {
        Plan {
            state_root: "/var/lib/ql-worker".into(),
            offer_id: OfferId::new("offer-1").unwrap(),
            run_id: RunId::new("run-1").unwrap(),
            attempt_id: AttemptId::new("attempt-1").unwrap(),
            callback_sequence: CallbackSequence::new(1).unwrap(),
            capability: Capability::from_bytes([7; 32]),
            log_artifact_id: LogArtifactId::new("wlog-0123456789abcdef0123456789abcd").unwrap(),
            log_quota_bytes: 64 * 1024,
            started_at_ms: UnixMillis::new(1_000).unwrap(),
            command: ExecCommand::Argv {
                file: "/bin/true".into(),
                args: vec![],
            },
            environment: vec![EnvVar::new("SECRET", "s3cr3t-value")],
            working_directory: None,
            containment: ContainmentPlan::default(),
            seams: Seams::default(),
        }
    }

    #[test]
    fn plan_round_trips_and_debug_is_redacted() {
        let plan = sample();
        plan.validate().unwrap();
        let frame = plan.encode().unwrap();
        let back = Plan::decode(&frame).unwrap();
        assert_eq!(back.capability.expose(), &[7; 32]);
        assert_eq!(back.environment, plan.environment);
        let debug = format!("{plan:?}");
        assert!(!debug.contains("s3cr3t"), "{debug}");
        assert!(debug.contains("capability: \"[redacted]\""), "{debug}");
    }

    #[test]
    fn the_largest_valid_plan_with_the_largest_containment_fits_the_frame() {
        use crate::containment::{CgroupPlan, Policy, RunAsPlan, RunIdentity};
        let path = |c: char| format!("/{}", c.to_string().repeat(MAX_PATH_BYTES - 1));
        let mut plan = sample();
        plan.state_root = path('s');
        plan.working_directory = Some(path('w'));
        plan.seams.proc_root = Some(path('p'));
        plan.command = ExecCommand::Shell {
            command: "x".repeat(MAX_COMMAND_BYTES),
            shell: Some("/bin/bash".into()),
        };
        // 256 entries, 64 KiB of names and values in all.
        let value = "v".repeat(MAX_ENV_TOTAL_BYTES / MAX_ENV_ENTRIES - 8);
        plan.environment = (0..MAX_ENV_ENTRIES)
            .map(|i| EnvVar::new(format!("NAME_{i:03}"), value.clone()))
            .collect();
        let entry = |i: usize| format!("/p/{i:03}/{}", "e".repeat(80));
        let list = || Some((0..64).map(entry).collect::<Vec<_>>());
        plan.containment.policy = Policy {
            executables: list(),
            shells: Some(vec!["/bin/sh".into(), "/bin/bash".into()]),
            shell: true,
            working_directories: Some((0..64).map(|i| entry(i + 100)).collect()),
        };
        plan.containment.run_as = Some(RunAsPlan {
            identity: RunIdentity::Range {
                first: 1,
                count: 65_536,
                gid: Some(7),
            },
            runs_dir: path('r'),
        });
        plan.containment.cgroup = Some(CgroupPlan {
            parent: path('c'),
            memory_max: Some(u64::MAX >> 1),
            pids_max: Some(4_194_304),
            cpu_max: None,
        });
        plan.validate().unwrap();
        let frame = plan.encode().expect("fits");
        assert!(frame.len() <= MAX_PLAN_BYTES);
        assert_eq!(Plan::decode(&frame).unwrap().containment, plan.containment);
    }

    #[test]
    fn plan_rules_follow_the_reference_launcher() {
        let check = |f: &dyn Fn(&mut Plan)| {
            let mut plan = sample();
            f(&mut plan);
            plan.validate()
        };
        assert_eq!(
            check(&|p| p.log_quota_bytes = 64 * 1024 - 1),
            Err(PlanError::Quota)
        );
        assert_eq!(
            check(&|p| p.state_root = "relative".into()),
            Err(PlanError::StateRoot)
        );
        assert_eq!(
            check(&|p| p.command = ExecCommand::Argv {
                file: "true".into(),
                args: vec![]
            }),
            Err(PlanError::ArgvFile)
        );
        assert_eq!(
            check(&|p| p.command = ExecCommand::Argv {
                file: "/bin/true".into(),
                args: vec!["a".into(); 257]
            }),
            Err(PlanError::Args)
        );
        assert_eq!(
            check(&|p| p.command = ExecCommand::Shell {
                command: "echo".into(),
                shell: Some("/bin/zsh".into())
            }),
            Err(PlanError::Shell)
        );
        assert_eq!(
            check(&|p| p.environment.push(EnvVar::new("SECRET", "x"))),
            Err(PlanError::EnvDuplicate)
        );
        assert_eq!(
            check(&|p| p.environment.push(EnvVar::new("1X", "x"))),
            Err(PlanError::EnvName)
        );
        assert_eq!(
            check(&|p| p.environment.push(EnvVar::new("EMPTY", ""))),
            Err(PlanError::EnvValue)
        );
        assert_eq!(
            check(&|p| p.working_directory = Some("/".into())),
            Err(PlanError::WorkingDirectory)
        );
    }
}
