//! The immutable execution revision pinned by an offer (reference §2.2,
//! `clusterExecutionRevision.ts`): what to run, with which environment, where.
//!
//! This module holds the data shapes. Normalization, the canonical JSON and the bit-exact
//! content digest are added by the wire-contract work.

use alloc::string::String;
use alloc::vec::Vec;

use serde::{Deserialize, Serialize};

use crate::ids::{ProjectId, Sha256Digest, TaskId, TaskRevision};
use crate::time::UnixMillis;

/// The pinned execution revision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecutionRevision {
    /// Owning project.
    pub project_id: ProjectId,
    /// Task.
    pub task_id: TaskId,
    /// `qltd:v1:<sourceRevision>:<sourceContentDigest>`.
    pub task_revision: TaskRevision,
    /// Source revision number, 1..=2^31-1.
    pub source_revision: u64,
    /// Digest of the task source.
    pub source_content_digest: Sha256Digest,
    /// The command to run.
    pub command: ExecCommand,
    /// Environment bindings, in normalized (`localeCompare`) order.
    pub environment: Vec<EnvBinding>,
    /// Optional environment bundle secret reference.
    pub environment_bundle_ref: Option<String>,
    /// Optional absolute working directory.
    pub working_directory: Option<String>,
    /// Optional timeout; the control plane owns the deadline.
    pub timeout_ms: Option<u64>,
    /// Optional placement (kept as its canonical JSON text until typed by the wire work).
    pub placement: Option<String>,
    /// Creation time (excluded from the digest).
    pub created_at_ms: UnixMillis,
    /// `sha256_hex("qinglong.cluster-task-execution-revision.v1\0" || JSON(normalized))`.
    pub content_digest: Sha256Digest,
}

/// The command of a revision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExecCommand {
    /// `{"kind":"argv","file":<absolute>,"args":[…]}`.
    Argv {
        /// Absolute executable path.
        file: String,
        /// Arguments.
        args: Vec<String>,
    },
    /// `{"kind":"shell","command":…[,"shell":"/bin/sh"|"/bin/bash"]}`.
    Shell {
        /// Shell command text.
        command: String,
        /// Optional shell path.
        shell: Option<String>,
    },
}

/// One environment binding of a revision.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnvBinding {
    /// `^[A-Za-z_][A-Za-z0-9_]{0,127}$`, not starting with `QL3_`.
    pub name: String,
    /// Public value or secret reference.
    pub value: EnvValue,
}

/// The value side of an [`EnvBinding`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum EnvValue {
    /// A public value, copied byte for byte into the child's environment.
    Public(String),
    /// A `qlsecret:v1:` reference resolved through the `secrets` endpoint, in memory only.
    Secret(String),
}
