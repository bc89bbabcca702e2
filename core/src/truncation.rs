//! The immutable log truncation fact (reference §5.2, §5.4), published by the supervisor after
//! capture. A missing fact means truncation is **unknown** (wire `null`), never "not truncated".

use serde::{Deserialize, Serialize};

use crate::ids::{AttemptId, LogArtifactId, RunId};
use crate::time::UnixMillis;

/// Largest fact envelope.
pub const MAX_FACT_BYTES: usize = 4 * 1024;
/// Schema version of the fact body.
pub const FACT_SCHEMA_VERSION: u8 = 1;
/// Smallest per-attempt log quota the launcher accepts (64 KiB).
pub const MIN_LOG_QUOTA_BYTES: u64 = 64 * 1024;
/// Largest per-attempt log quota (1 GiB).
pub const MAX_LOG_QUOTA_BYTES: u64 = 1024 * 1024 * 1024;

/// The truncation fact: the reference's seven fields.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TruncationFact {
    /// Always [`FACT_SCHEMA_VERSION`].
    pub schema_version: u8,
    /// Run.
    pub run_id: RunId,
    /// Attempt.
    pub attempt_id: AttemptId,
    /// Log artifact.
    pub log_artifact_id: LogArtifactId,
    /// The quota in force.
    pub maximum_bytes: u64,
    /// True iff at least one byte was dropped.
    pub quota_reached: bool,
    /// When capture ended.
    pub observed_at_ms: UnixMillis,
}

/// A fact that breaks its own shape rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FactError {
    /// `schemaVersion` is not 1.
    #[error("truncation fact schemaVersion must be 1")]
    SchemaVersion,
    /// `maximumBytes` outside 64 KiB..=1 GiB.
    #[error("truncation fact maximumBytes must be within 64 KiB..=1 GiB")]
    Quota,
}

impl TruncationFact {
    /// Shape rules.
    ///
    /// # Errors
    /// The first [`FactError`].
    pub fn validate(&self) -> Result<(), FactError> {
        if self.schema_version != FACT_SCHEMA_VERSION {
            return Err(FactError::SchemaVersion);
        }
        if !(MIN_LOG_QUOTA_BYTES..=MAX_LOG_QUOTA_BYTES).contains(&self.maximum_bytes) {
            return Err(FactError::Quota);
        }
        Ok(())
    }
}
