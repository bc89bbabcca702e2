//! The Worker's configuration file (TOML) and its validation.
//!
//! Every error names the file, the field and the rule. Paths may be overridden from the
//! environment (`QL_WORKER_ROOT`, `QL_WORKER_CREDENTIAL_FILE`, `QL_WORKER_CLIENT_CERTIFICATE`,
//! `QL_WORKER_CLIENT_KEY`), which is convenient for containers and systemd credentials. Secret
//! files (the credential and the private key) must be regular files owned by this user with mode
//! `0600` (no group or other bits); they are re-read when needed, never cached in the config.

use std::fmt;
use std::fs;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use ql_worker_core::ids::WorkerId;
use ql_worker_core::listing::{Capacity, PageLimit};
use ql_worker_core::revision::Architecture;
use serde::Deserialize;

use crate::spool::SpoolPolicy;

/// Largest configuration file read.
pub const MAX_CONFIG_BYTES: u64 = 64 * 1024;

/// The deployment profile: production defaults of reference §7.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Profile {
    /// Small hosts (routers): cadence 2 s, small pages, 64 records, 4 MiB logs, drain 60 s.
    Edge,
    /// Servers: cadence 500 ms, larger pages, 256 records, 64 MiB logs, drain 300 s.
    Node,
}

/// The file as written.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    profile: Profile,
    worker_id: String,
    root: PathBuf,
    architecture: Option<String>,
    control_plane: ControlPlaneFile,
    #[serde(default)]
    limits: LimitsFile,
    #[serde(default)]
    retention: RetentionFile,
    // ---- containment tables (issue 20): rules in `crate::containment::settings` ----
    run_as: Option<crate::containment::settings::RunAsFile>,
    run_limits: Option<crate::containment::settings::RunLimitsFile>,
    cgroup: Option<crate::containment::settings::CgroupFile>,
    policy: Option<crate::containment::settings::PolicyFile>,
    capture: Option<crate::containment::settings::CaptureFile>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ControlPlaneFile {
    origin: String,
    trust_anchors: Vec<PathBuf>,
    client_certificate: PathBuf,
    client_key: PathBuf,
    credential_file: PathBuf,
    timeout_ms: Option<u64>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct LimitsFile {
    cadence_ms: Option<u64>,
    startup_page: Option<u64>,
    supervision_page: Option<u64>,
    inbox_capacity: Option<u64>,
    max_concurrent_runs: Option<u64>,
    session_lease_ms: Option<u64>,
    heartbeat_interval_ms: Option<u64>,
    backoff_base_ms: Option<u64>,
    drain_budget_ms: Option<u64>,
    lease_control_interval_ms: Option<u64>,
    log_quota_bytes: Option<u64>,
    log_reserve_bytes: Option<u64>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RetentionFile {
    high_water_records: Option<u64>,
    max_settled_age_ms: Option<u64>,
    log_keep_ms: Option<u64>,
}

/// The validated configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where the file was read from (for messages).
    pub source: PathBuf,
    /// Profile.
    pub profile: Profile,
    /// This Worker's id.
    pub worker_id: WorkerId,
    /// The private state root (inbox, receipts, log spool).
    pub root: PathBuf,
    /// Architecture announced to the control plane.
    pub architecture: Architecture,
    /// Control-plane connection.
    pub control_plane: ControlPlane,
    /// Tunables.
    pub limits: Limits,
    /// Retention of settled records and their logs.
    pub retention: Retention,
    /// Containment of each Run (`[run_as]`, `[run_limits]`, `[cgroup]`, `[policy]`,
    /// `[capture]`; issue 20).
    pub containment: crate::containment::Containment,
}

/// Control-plane connection settings.
#[derive(Clone, Debug)]
pub struct ControlPlane {
    /// `https://host[:port]`.
    pub origin: String,
    /// 1–8 CA certificate files (PEM).
    pub trust_anchors: Vec<PathBuf>,
    /// Client certificate chain (PEM).
    pub client_certificate: PathBuf,
    /// Client private key (PEM, 0600).
    pub client_key: PathBuf,
    /// File holding `ql3w_<credentialId>_<secret>` (0600).
    pub credential_file: PathBuf,
    /// Request timeout.
    pub timeout_ms: u64,
}

/// Tunables, with the profile's defaults applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Tick interval (100..=60 000 ms).
    pub cadence_ms: u64,
    /// Startup reconciliation page (1..=64).
    pub startup_page: PageLimit,
    /// Supervision page (1..=64).
    pub supervision_page: PageLimit,
    /// Inbox capacity (1..=1024).
    pub inbox_capacity: Capacity,
    /// Concurrent Runs (1..=1024).
    pub max_concurrent_runs: u16,
    /// Session lease (5 000..=600 000 ms).
    pub session_lease_ms: u64,
    /// Heartbeat interval (1 000 ms..=lease / 2).
    pub heartbeat_interval_ms: u64,
    /// Pull backoff base (100..=60 000 ms).
    pub backoff_base_ms: u64,
    /// Drain budget (1 000..=600 000 ms).
    pub drain_budget_ms: u64,
    /// Least time between two lease-control calls for one Run (0..=60 000 ms; 0 = every tick).
    pub lease_control_interval_ms: u64,
    /// Log spool policy (quota per attempt and free-space reserve).
    pub spool: SpoolPolicy,
}

/// Retention tunables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    /// Settled records kept before the oldest are removed.
    pub high_water_records: u64,
    /// Settled records older than this are removed.
    pub max_settled_age_ms: u64,
    /// A settled Run's log is kept this long after settling.
    pub log_keep_ms: u64,
}

/// A configuration problem: the file, the field and the rule.
#[derive(Debug)]
pub enum ConfigError {
    /// The file could not be read.
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        error: std::io::Error,
    },
    /// The TOML does not parse or has unknown or missing fields.
    Syntax {
        /// The file.
        path: PathBuf,
        /// The parser's message (field names, no values of secret files).
        message: String,
    },
    /// A field breaks its rule.
    Field {
        /// The file.
        path: PathBuf,
        /// The field, dotted.
        field: &'static str,
        /// The rule.
        rule: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Read { path, error } => write!(f, "{}: cannot read: {error}", path.display()),
            Self::Syntax { path, message } => write!(f, "{}: {message}", path.display()),
            Self::Field { path, field, rule } => {
                write!(f, "{}: {field}: {rule}", path.display())
            }
        }
    }
}

impl std::error::Error for ConfigError {}

/// Where environment overrides come from (the process environment, or a map in tests).
pub trait Environment {
    /// The value of `name`, if set.
    fn var(&self, name: &str) -> Option<String>;
}

/// The process environment.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessEnvironment;

impl Environment for ProcessEnvironment {
    fn var(&self, name: &str) -> Option<String> {
        std::env::var(name).ok().filter(|v| !v.is_empty())
    }
}

fn field(path: &Path, field: &'static str, rule: impl Into<String>) -> ConfigError {
    ConfigError::Field {
        path: path.to_path_buf(),
        field,
        rule: rule.into(),
    }
}

fn within(
    path: &Path,
    name: &'static str,
    value: u64,
    min: u64,
    max: u64,
) -> Result<u64, ConfigError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err(field(
            path,
            name,
            format!("must be within {min}..={max}, found {value}"),
        ))
    }
}

fn absolute(path: &Path, name: &'static str, value: PathBuf) -> Result<PathBuf, ConfigError> {
    if value.is_absolute() {
        Ok(value)
    } else {
        Err(field(
            path,
            name,
            format!("must be an absolute path, found {}", value.display()),
        ))
    }
}

/// The architecture of this build, in the control plane's spelling.
#[must_use]
pub fn host_architecture() -> Option<Architecture> {
    match std::env::consts::ARCH {
        "x86_64" => Some(Architecture::Amd64),
        "x86" => Some(Architecture::I386),
        "aarch64" => Some(Architecture::Arm64),
        "arm" => Some(Architecture::ArmV7),
        "powerpc64" => Some(Architecture::Ppc64le),
        "s390x" => Some(Architecture::S390x),
        _ => None,
    }
}

impl Config {
    /// Reads and validates `path` with overrides from `env`.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file, field and rule.
    pub fn load(path: &Path, env: &dyn Environment) -> Result<Self, ConfigError> {
        let read_error = |error| ConfigError::Read {
            path: path.to_path_buf(),
            error,
        };
        let meta = fs::metadata(path).map_err(read_error)?;
        if !meta.is_file() || meta.len() > MAX_CONFIG_BYTES {
            return Err(field(
                path,
                "(file)",
                format!("must be a regular file of at most {MAX_CONFIG_BYTES} bytes"),
            ));
        }
        let text = fs::read_to_string(path).map_err(read_error)?;
        Self::parse(path, &text, env)
    }

    /// Validates configuration text as if read from `path`.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file, field and rule.
    pub fn parse(path: &Path, text: &str, env: &dyn Environment) -> Result<Self, ConfigError> {
        let file: FileConfig = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        let worker_id =
            WorkerId::new(file.worker_id.clone()).map_err(|e| field(path, "worker_id", e.rule))?;
        let root = env
            .var("QL_WORKER_ROOT")
            .map(PathBuf::from)
            .unwrap_or(file.root.clone());
        let root = absolute(path, "root", root)?;
        let architecture = match &file.architecture {
            None => host_architecture().ok_or_else(|| {
                field(
                    path,
                    "architecture",
                    "must be set: this build's architecture is not one the control plane knows",
                )
            })?,
            Some(text) => {
                serde_json::from_value(serde_json::Value::String(text.clone())).map_err(|_| {
                    field(
                        path,
                        "architecture",
                        "must be one of 386, amd64, arm/v6, arm/v7, arm64, ppc64le, s390x",
                    )
                })?
            }
        };
        let control_plane = Self::control_plane(path, &file.control_plane, env)?;
        let limits = Self::limits(path, file.profile, &file.limits)?;
        let retention = Retention {
            high_water_records: within(
                path,
                "retention.high_water_records",
                file.retention
                    .high_water_records
                    .unwrap_or(u64::try_from(limits.inbox_capacity.get()).unwrap_or(64) / 2),
                0,
                1024,
            )?,
            max_settled_age_ms: file
                .retention
                .max_settled_age_ms
                .unwrap_or(7 * 24 * 3_600_000),
            log_keep_ms: file.retention.log_keep_ms.unwrap_or(24 * 3_600_000),
        };
        // ---- containment (issue 20) ----
        let containment = crate::containment::Containment::from_file(
            &crate::containment::settings::ContainmentFile {
                run_as: file.run_as.as_ref(),
                run_limits: file.run_limits.as_ref(),
                cgroup: file.cgroup.as_ref(),
                policy: file.policy.as_ref(),
                capture: file.capture.as_ref(),
            },
            &root,
            limits.spool.maximum_attempt_bytes,
        )
        .map_err(|(name, rule)| field(path, name, rule))?;
        Ok(Self {
            source: path.to_path_buf(),
            profile: file.profile,
            worker_id,
            root,
            architecture,
            control_plane,
            limits,
            retention,
            containment,
        })
    }

    fn control_plane(
        path: &Path,
        file: &ControlPlaneFile,
        env: &dyn Environment,
    ) -> Result<ControlPlane, ConfigError> {
        let over =
            |name: &str, value: &PathBuf| env.var(name).map(PathBuf::from).unwrap_or(value.clone());
        if file.trust_anchors.is_empty() || file.trust_anchors.len() > 8 {
            return Err(field(
                path,
                "control_plane.trust_anchors",
                "must list 1 to 8 CA certificate files",
            ));
        }
        let mut anchors = Vec::new();
        for anchor in &file.trust_anchors {
            anchors.push(absolute(
                path,
                "control_plane.trust_anchors",
                anchor.clone(),
            )?);
        }
        Ok(ControlPlane {
            origin: file.origin.clone(),
            trust_anchors: anchors,
            client_certificate: absolute(
                path,
                "control_plane.client_certificate",
                over("QL_WORKER_CLIENT_CERTIFICATE", &file.client_certificate),
            )?,
            client_key: absolute(
                path,
                "control_plane.client_key",
                over("QL_WORKER_CLIENT_KEY", &file.client_key),
            )?,
            credential_file: absolute(
                path,
                "control_plane.credential_file",
                over("QL_WORKER_CREDENTIAL_FILE", &file.credential_file),
            )?,
            timeout_ms: within(
                path,
                "control_plane.timeout_ms",
                file.timeout_ms.unwrap_or(15_000),
                1_000,
                60_000,
            )?,
        })
    }

    fn limits(path: &Path, profile: Profile, file: &LimitsFile) -> Result<Limits, ConfigError> {
        let edge = profile == Profile::Edge;
        let pick = |value: Option<u64>, edge_default: u64, node_default: u64| {
            value.unwrap_or(if edge { edge_default } else { node_default })
        };
        let page = |name: &'static str, value: u64| {
            PageLimit::new(value).map_err(|e| {
                field(
                    path,
                    name,
                    format!("must be within {}, found {value}", e.rule),
                )
            })
        };
        let session_lease_ms = within(
            path,
            "limits.session_lease_ms",
            pick(file.session_lease_ms, 30_000, 30_000),
            5_000,
            600_000,
        )?;
        // The wire caps one artifact at 64 MiB, so a larger quota could never be uploaded.
        let quota = within(
            path,
            "limits.log_quota_bytes",
            pick(file.log_quota_bytes, 4 << 20, 64 << 20),
            64 << 10,
            64 << 20,
        )?;
        let reserve = pick(file.log_reserve_bytes, 32 << 20, 256 << 20);
        let spool = SpoolPolicy::custom(quota, reserve, 1 << 20)
            .map_err(|e| field(path, "limits.log_quota_bytes", e.to_string()))?;
        Ok(Limits {
            cadence_ms: within(
                path,
                "limits.cadence_ms",
                pick(file.cadence_ms, 2_000, 500),
                100,
                60_000,
            )?,
            startup_page: page("limits.startup_page", pick(file.startup_page, 4, 16))?,
            supervision_page: page(
                "limits.supervision_page",
                pick(file.supervision_page, 4, 32),
            )?,
            inbox_capacity: Capacity::new(pick(file.inbox_capacity, 64, 256)).map_err(|e| {
                field(
                    path,
                    "limits.inbox_capacity",
                    format!("must be within {}", e.rule),
                )
            })?,
            max_concurrent_runs: u16::try_from(within(
                path,
                "limits.max_concurrent_runs",
                pick(file.max_concurrent_runs, 2, 16),
                1,
                1024,
            )?)
            .unwrap_or(1024),
            session_lease_ms,
            heartbeat_interval_ms: within(
                path,
                "limits.heartbeat_interval_ms",
                pick(
                    file.heartbeat_interval_ms,
                    session_lease_ms / 3,
                    session_lease_ms / 3,
                ),
                1_000,
                session_lease_ms / 2,
            )?,
            backoff_base_ms: within(
                path,
                "limits.backoff_base_ms",
                pick(file.backoff_base_ms, 1_000, 1_000),
                100,
                60_000,
            )?,
            drain_budget_ms: within(
                path,
                "limits.drain_budget_ms",
                pick(file.drain_budget_ms, 60_000, 300_000),
                1_000,
                600_000,
            )?,
            lease_control_interval_ms: within(
                path,
                "limits.lease_control_interval_ms",
                pick(file.lease_control_interval_ms, 5_000, 5_000),
                0,
                60_000,
            )?,
            spool,
        })
    }
}

/// Checks that a secret-bearing file is a regular file, owned by this user, with no group or
/// other permission bits.
///
/// # Errors
/// A message naming the file and the rule.
pub fn check_secret_file(path: &Path, what: &str) -> Result<(), String> {
    let meta = fs::symlink_metadata(path).map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if !meta.file_type().is_file() {
        return Err(format!(
            "{what} {}: must be a regular file (not a symlink)",
            path.display()
        ));
    }
    let euid = rustix::process::geteuid().as_raw();
    if meta.uid() != euid {
        return Err(format!(
            "{what} {}: must be owned by uid {euid}, found {}",
            path.display(),
            meta.uid()
        ));
    }
    if meta.mode() & 0o077 != 0 {
        return Err(format!(
            "{what} {}: must have mode 0600 (no group/other bits), found {:04o}",
            path.display(),
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}
