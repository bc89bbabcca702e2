//! Builders for sealed execution revisions (reference §2.2): argv or shell commands, public and
//! Secret environment bindings, a timeout, a working directory, a placement. The revision is
//! normalized and its content digest computed with [`Seal::seal`], so it is exactly
//! what the Worker re-validates when the offer arrives.

use std::fmt;

use ql_worker_core::ids::{ProjectId, Sha256Digest, TaskId, TaskRevision};
use ql_worker_core::revision::{
    EnvBinding, EnvName, EnvValue, ExecCommand, ExecutionRevision, Placement, RevisionError,
    SecretRef,
};
use ql_worker_core::time::UnixMillis;

use super::model::sha256;

/// Sealing a revision, as the control plane does before offering it.
pub trait Seal: Sized {
    /// Normalizes and sets `content_digest` to the digest of the normalized content.
    ///
    /// # Errors
    /// [`RevisionError`] naming the first broken rule.
    fn seal(self) -> Result<Self, RevisionError>;
}

impl Seal for ExecutionRevision {
    fn seal(self) -> Result<Self, RevisionError> {
        let mut normalized = self.normalize()?;
        normalized.content_digest = normalized.compute_digest()?;
        Ok(normalized)
    }
}

/// Why a revision could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RevisionBuildError {
    /// An id, name or time is invalid.
    Field(&'static str),
    /// Normalization refused the revision.
    Revision(String),
}

impl fmt::Display for RevisionBuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Field(field) => write!(f, "invalid {field}"),
            Self::Revision(e) => write!(f, "revision refused: {e}"),
        }
    }
}

impl std::error::Error for RevisionBuildError {}

#[derive(Clone, Debug)]
enum EnvSpec {
    Public(String),
    Secret(SecretRef),
}

/// A fluent execution-revision builder. Defaults: project `project-1`, task `task-1`, source
/// revision 1, no environment, no timeout, created at 1 ms.
#[derive(Clone, Debug)]
pub struct RevisionBuilder {
    project_id: String,
    task_id: String,
    source_revision: u64,
    command: ExecCommand,
    environment: Vec<(String, EnvSpec)>,
    environment_bundle_ref: Option<SecretRef>,
    working_directory: Option<String>,
    timeout_ms: Option<u64>,
    placement: Option<Placement>,
    created_at_ms: u64,
}

impl RevisionBuilder {
    fn with_command(command: ExecCommand) -> Self {
        Self {
            project_id: "project-1".to_owned(),
            task_id: "task-1".to_owned(),
            source_revision: 1,
            command,
            environment: Vec::new(),
            environment_bundle_ref: None,
            working_directory: None,
            timeout_ms: None,
            placement: None,
            created_at_ms: 1,
        }
    }

    /// `{"kind":"argv","file":…,"args":[…]}` (the file must be absolute).
    pub fn argv<I, S>(file: &str, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_command(ExecCommand::Argv {
            file: file.to_owned(),
            args: args.into_iter().map(Into::into).collect(),
        })
    }

    /// `{"kind":"shell","command":…}` (the Worker's default shell).
    pub fn shell(command: &str) -> Self {
        Self::with_command(ExecCommand::Shell {
            command: command.to_owned(),
            shell: None,
        })
    }

    /// `{"kind":"shell","command":…,"shell":"/bin/sh"|"/bin/bash"}`.
    pub fn shell_with(shell: &str, command: &str) -> Self {
        Self::with_command(ExecCommand::Shell {
            command: command.to_owned(),
            shell: Some(shell.to_owned()),
        })
    }

    /// The owning project (also the project of every Secret reference).
    #[must_use]
    pub fn project(mut self, project_id: &str) -> Self {
        project_id.clone_into(&mut self.project_id);
        self
    }

    /// The task.
    #[must_use]
    pub fn task(mut self, task_id: &str) -> Self {
        task_id.clone_into(&mut self.task_id);
        self
    }

    /// The source revision number (1..=2^31-1).
    #[must_use]
    pub fn source_revision(mut self, n: u64) -> Self {
        self.source_revision = n;
        self
    }

    /// A public binding `name=value`.
    #[must_use]
    pub fn public_env(mut self, name: &str, value: &str) -> Self {
        self.environment
            .push((name.to_owned(), EnvSpec::Public(value.to_owned())));
        self
    }

    /// A Secret binding `name` resolved through the `secrets` endpoint from `reference` (see
    /// [`super::ControlPlane::set_secret`]).
    #[must_use]
    pub fn secret_env(mut self, name: &str, reference: &SecretRef) -> Self {
        self.environment
            .push((name.to_owned(), EnvSpec::Secret(reference.clone())));
        self
    }

    /// An environment bundle reference (versioned, same project).
    #[must_use]
    pub fn environment_bundle(mut self, reference: &SecretRef) -> Self {
        self.environment_bundle_ref = Some(reference.clone());
        self
    }

    /// `timeoutMs` (the control plane sets the deadline at the starting ACK).
    #[must_use]
    pub fn timeout_ms(mut self, ms: u64) -> Self {
        self.timeout_ms = Some(ms);
        self
    }

    /// An absolute working directory.
    #[must_use]
    pub fn working_directory(mut self, dir: &str) -> Self {
        self.working_directory = Some(dir.to_owned());
        self
    }

    /// A placement (normalized when sealed).
    #[must_use]
    pub fn placement(mut self, placement: Placement) -> Self {
        self.placement = Some(placement);
        self
    }

    /// `createdAtMs` (excluded from the digest).
    #[must_use]
    pub fn created_at_ms(mut self, ms: u64) -> Self {
        self.created_at_ms = ms;
        self
    }

    /// Normalizes and seals the revision. The source content digest is the SHA-256 of the
    /// command's `Debug` form, so different commands get different task revisions.
    pub fn build(self) -> Result<ExecutionRevision, RevisionBuildError> {
        let source_digest = sha256(format!("{:?}", self.command).as_bytes());
        let task_revision = format!(
            "qltd:v1:{}:{}",
            self.source_revision,
            source_digest.to_hex()
        );
        let mut environment = Vec::with_capacity(self.environment.len());
        for (name, spec) in self.environment {
            environment.push(EnvBinding {
                name: EnvName::new(name).map_err(|_| RevisionBuildError::Field("env name"))?,
                value: match spec {
                    EnvSpec::Public(value) => EnvValue::Public(value.into()),
                    EnvSpec::Secret(reference) => EnvValue::Secret(reference),
                },
            });
        }
        let revision = ExecutionRevision {
            project_id: ProjectId::new(self.project_id)
                .map_err(|_| RevisionBuildError::Field("projectId"))?,
            task_id: TaskId::new(self.task_id).map_err(|_| RevisionBuildError::Field("taskId"))?,
            task_revision: TaskRevision::new(task_revision)
                .map_err(|_| RevisionBuildError::Field("sourceRevision"))?,
            source_revision: self.source_revision,
            source_content_digest: source_digest,
            command: self.command,
            environment,
            environment_bundle_ref: self.environment_bundle_ref,
            working_directory: self.working_directory,
            timeout_ms: self.timeout_ms,
            placement: self.placement,
            created_at_ms: UnixMillis::new(self.created_at_ms)
                .map_err(|_| RevisionBuildError::Field("createdAtMs"))?,
            content_digest: Sha256Digest::from_bytes([0; 32]),
        };
        revision
            .seal()
            .map_err(|e| RevisionBuildError::Revision(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_revisions_validate_and_differ_by_command() {
        let a = RevisionBuilder::argv("/bin/echo", ["hello"])
            .public_env("GREETING", "hi")
            .timeout_ms(5_000)
            .build()
            .unwrap();
        a.validate().unwrap();
        let b = RevisionBuilder::shell("echo hello").build().unwrap();
        b.validate().unwrap();
        assert_ne!(a.content_digest, b.content_digest);
        assert_ne!(a.task_revision, b.task_revision);
        assert!(
            RevisionBuilder::argv("relative", Vec::<String>::new())
                .build()
                .is_err()
        );
        assert!(
            RevisionBuilder::shell("true")
                .public_env("QL3_RESERVED", "x")
                .build()
                .is_err()
        );
    }
}
