//! The Worker's configuration file (TOML) and its validation.
//!
//! Every error names the file, the field (or the environment variable) and the rule, and never
//! echoes a value that could be a secret. Paths may be overridden from the environment
//! (`QL_WORKER_ROOT`, `QL_WORKER_CREDENTIAL_FILE`, `QL_WORKER_CLIENT_CERTIFICATE`,
//! `QL_WORKER_CLIENT_KEY`), which is convenient for containers and systemd credentials; an error
//! about such a value names the variable, not the file.
//!
//! Files read from outside the state root are opened without following a symbolic link and
//! checked on the open descriptor ([`open_checked`]):
//! * [`FileClass::Secret`] (the credential, the private key): a regular file owned by the
//!   Worker's uid with no group or other permission bit (0600 or stricter);
//! * [`FileClass::Public`] (this configuration file, the client certificate, the trust
//!   anchors): a regular file owned by the Worker's uid or root, not writable by group or
//!   other. Whoever could write one of these could point the Worker at their own control plane.
//!
//! Secret files are re-read when needed, never cached in the config.

use std::fmt;
use std::fs;
use std::io::Read as _;
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, OFlags};
use rustix::io::Errno;

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

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Edge => "edge",
            Self::Node => "node",
        })
    }
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
    metrics: Option<MetricsFile>,
    capabilities: Option<CapabilitiesFile>,
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
    give_up_after_ms: Option<u64>,
    certificate_warning_days: Option<u64>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct MetricsFile {
    textfile: Option<PathBuf>,
    interval_ms: Option<u64>,
    listen: Option<String>,
}

#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct CapabilitiesFile {
    operating_system: Option<String>,
    labels: Option<std::collections::BTreeMap<String, String>>,
    runtimes: Option<Vec<RuntimeFile>>,
    features: Option<Vec<String>>,
    cpu_cores: Option<u64>,
    memory_bytes: Option<u64>,
    disk_bytes: Option<u64>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RuntimeFile {
    name: String,
    version: String,
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
    /// Metrics: the textfile and the optional listener.
    pub metrics: MetricsSettings,
    /// The capabilities announced at register (validated and normalizable).
    pub capabilities: ql_worker_core::wire::session::Capabilities,
    /// Containment of each Run (`[run_as]`, `[run_limits]`, `[cgroup]`, `[policy]`,
    /// `[capture]`; issue 20).
    pub containment: crate::containment::Containment,
    /// Which settings came from the environment instead of the file (for messages).
    pub overrides: Overrides,
}

/// The environment variables that override paths of the file.
pub const ENV_ROOT: &str = "QL_WORKER_ROOT";
/// Overrides `control_plane.credential_file`.
pub const ENV_CREDENTIAL_FILE: &str = "QL_WORKER_CREDENTIAL_FILE";
/// Overrides `control_plane.client_certificate`.
pub const ENV_CLIENT_CERTIFICATE: &str = "QL_WORKER_CLIENT_CERTIFICATE";
/// Overrides `control_plane.client_key`.
pub const ENV_CLIENT_KEY: &str = "QL_WORKER_CLIENT_KEY";

/// Which settings came from the environment.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `root` from [`ENV_ROOT`].
    pub root: bool,
    /// `control_plane.credential_file` from [`ENV_CREDENTIAL_FILE`].
    pub credential_file: bool,
    /// `control_plane.client_certificate` from [`ENV_CLIENT_CERTIFICATE`].
    pub client_certificate: bool,
    /// `control_plane.client_key` from [`ENV_CLIENT_KEY`].
    pub client_key: bool,
}

/// A setting of the configuration, for messages that must say where a value came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    /// `root`.
    Root,
    /// `control_plane.origin`.
    Origin,
    /// `control_plane.trust_anchors[i]`.
    TrustAnchor(usize),
    /// `control_plane.trust_anchors` as a whole.
    TrustAnchors,
    /// `control_plane.client_certificate`.
    ClientCertificate,
    /// `control_plane.client_key`.
    ClientKey,
    /// `control_plane.credential_file`.
    CredentialFile,
    /// `control_plane.timeout_ms`.
    Timeout,
}

impl Config {
    /// Where `setting` came from, for a message: `<file>: <field> (<path>)`, or
    /// `<VARIABLE> (<path>; environment, overrides <field> of <file>)`.
    #[must_use]
    pub fn blame(&self, setting: Setting) -> String {
        let cp = &self.control_plane;
        let (field, env, path): (String, Option<&str>, Option<&Path>) = match setting {
            Setting::Root => (
                "root".into(),
                self.overrides.root.then_some(ENV_ROOT),
                Some(&self.root),
            ),
            Setting::Origin => ("control_plane.origin".into(), None, None),
            Setting::TrustAnchor(i) => (
                format!("control_plane.trust_anchors[{i}]"),
                None,
                cp.trust_anchors.get(i).map(PathBuf::as_path),
            ),
            Setting::TrustAnchors => ("control_plane.trust_anchors".into(), None, None),
            Setting::ClientCertificate => (
                "control_plane.client_certificate".into(),
                self.overrides
                    .client_certificate
                    .then_some(ENV_CLIENT_CERTIFICATE),
                Some(&cp.client_certificate),
            ),
            Setting::ClientKey => (
                "control_plane.client_key".into(),
                self.overrides.client_key.then_some(ENV_CLIENT_KEY),
                Some(&cp.client_key),
            ),
            Setting::CredentialFile => (
                "control_plane.credential_file".into(),
                self.overrides
                    .credential_file
                    .then_some(ENV_CREDENTIAL_FILE),
                Some(&cp.credential_file),
            ),
            Setting::Timeout => ("control_plane.timeout_ms".into(), None, None),
        };
        let source = self.source.display();
        match (env, path) {
            (Some(var), Some(path)) => format!(
                "{var} ({}; environment, overrides {field} of {source})",
                path.display()
            ),
            (Some(var), None) => format!("{var} (environment, overrides {field} of {source})"),
            (None, Some(path)) => format!("{source}: {field} ({})", path.display()),
            (None, None) => format!("{source}: {field}"),
        }
    }
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
    /// How long TLS or credential failures may last, with no authenticated exchange in
    /// between, before the Worker halts (exit 5).
    pub give_up_after_ms: u64,
    /// The client certificate's warning window before it expires.
    pub certificate_warning_ms: u64,
}

/// `[metrics]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricsSettings {
    /// The node_exporter textfile (`*.prom`), written atomically.
    pub textfile: Option<PathBuf>,
    /// Refresh interval of the textfile.
    pub interval_ms: u64,
    /// The optional listener (loopback TCP or a Unix socket).
    pub listen: Option<crate::metrics::Listen>,
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

/// A configuration problem: the file, the field (or variable) and the rule.
#[derive(Debug)]
pub enum ConfigError {
    /// The file is unsafe or could not be read.
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        problem: FileProblem,
    },
    /// The TOML does not parse or has unknown or missing fields.
    Syntax {
        /// The file.
        path: PathBuf,
        /// Where and what, without the offending text: no value of the file is echoed (a
        /// credential pasted into it must not reach a log).
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
    /// An environment override breaks the rule of the field it overrides.
    Env {
        /// The variable.
        var: &'static str,
        /// The field it overrides.
        field: &'static str,
        /// The configuration file.
        path: PathBuf,
        /// The rule.
        rule: String,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File { path, problem } => {
                write!(f, "{}: configuration file {problem}", path.display())
            }
            Self::Syntax { path, message } => write!(f, "{}: {message}", path.display()),
            Self::Field { path, field, rule } => {
                write!(f, "{}: {field}: {rule}", path.display())
            }
            Self::Env {
                var,
                field,
                path,
                rule,
            } => write!(
                f,
                "{var} (environment, overrides {field} of {}): {rule}",
                path.display()
            ),
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
    /// The value, even when empty (an empty override is an error, never silently ignored).
    fn var(&self, name: &str) -> Option<String> {
        std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
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

fn absolute_rule(value: &Path) -> Option<String> {
    if value.as_os_str().is_empty() {
        Some(String::from(
            "must be an absolute path, found an empty value",
        ))
    } else if !value.is_absolute() {
        Some(format!(
            "must be an absolute path, found the relative path {}",
            value.display()
        ))
    } else {
        None
    }
}

fn absolute(path: &Path, name: &'static str, value: PathBuf) -> Result<PathBuf, ConfigError> {
    match absolute_rule(&value) {
        None => Ok(value),
        Some(rule) => Err(field(path, name, rule)),
    }
}

/// `value` from the environment variable `var` (absolute, or an error naming the variable),
/// else the file's value (absolute, or an error naming the field).
fn path_setting(
    path: &Path,
    env: &dyn Environment,
    var: &'static str,
    name: &'static str,
    file_value: &Path,
) -> Result<(PathBuf, bool), ConfigError> {
    match env.var(var) {
        Some(text) => {
            let value = PathBuf::from(text);
            match absolute_rule(&value) {
                None => Ok((value, true)),
                Some(rule) => Err(ConfigError::Env {
                    var,
                    field: name,
                    path: path.to_path_buf(),
                    rule,
                }),
            }
        }
        None => absolute(path, name, file_value.to_path_buf()).map(|v| (v, false)),
    }
}

/// The configuration field and the rule in words for a capabilities rule of the wire.
fn capability_rule(at: &'static str, rule: &'static str) -> (&'static str, String) {
    let name = match at {
        "operatingSystem" => "capabilities.operating_system",
        "labels" => "capabilities.labels",
        "runtimes" | "runtimes.name" | "runtimes.version" => "capabilities.runtimes",
        "features" => "capabilities.features",
        "capacity.cpuCores" => "capabilities.cpu_cores",
        "capacity.memoryBytes" => "capabilities.memory_bytes",
        "capacity.diskBytes" => "capabilities.disk_bytes",
        "architecture" | "supportTier" => "architecture",
        _ => "capabilities",
    };
    let words = match (at, rule) {
        ("operatingSystem", _) => String::from(
            "must be a capability name: 1 to 32 characters from a-z 0-9 . _ + - starting with a \
             letter or digit",
        ),
        ("runtimes.name", _) => String::from(
            "each runtime name must be 1 to 64 characters from a-z 0-9 . _ + - starting with a \
             letter or digit",
        ),
        ("runtimes.version", _) => {
            String::from("each runtime version must be a strict semantic version (1.2.3)")
        }
        ("features", "capability names") => String::from(
            "each feature must be 1 to 64 characters from a-z 0-9 . _ + - starting with a letter \
             or digit",
        ),
        (_, rule) => format!("must be {rule}"),
    };
    (name, words)
}

/// The rule of a worker id, in words, and where `value` breaks it (the value is not echoed).
fn worker_id_rule(value: &str) -> String {
    let rule = "must be 1 to 128 characters from A-Z a-z 0-9 . _ : - starting with a letter or \
                digit";
    let count = value.chars().count();
    if count == 0 {
        return format!("{rule}; it is empty");
    }
    if count > 128 {
        return format!("{rule}; it has {count} characters");
    }
    let bad = value.chars().enumerate().find(|&(i, c)| {
        let allowed = c.is_ascii_alphanumeric() || (i > 0 && matches!(c, '.' | '_' | ':' | '-'));
        !allowed
    });
    match bad {
        Some((i, c)) if c.is_ascii_graphic() => {
            format!("{rule}; character {} ('{c}') is not allowed there", i + 1)
        }
        Some((i, _)) => format!(
            "{rule}; character {} is not allowed there (a space, control or non-ASCII character)",
            i + 1
        ),
        None => String::from(rule),
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
        let file_error = |problem| ConfigError::File {
            path: path.to_path_buf(),
            problem,
        };
        let bytes = read_checked(path, FileClass::Public, MAX_CONFIG_BYTES).map_err(file_error)?;
        let text = std::str::from_utf8(&bytes).map_err(|e| ConfigError::Syntax {
            path: path.to_path_buf(),
            message: format!(
                "must be UTF-8 text; byte {} is not valid UTF-8",
                e.valid_up_to() + 1
            ),
        })?;
        Self::parse(path, text, env)
    }

    /// Validates configuration text as if read from `path`.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file, field and rule.
    pub fn parse(path: &Path, text: &str, env: &dyn Environment) -> Result<Self, ConfigError> {
        let file: FileConfig = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: path.to_path_buf(),
            message: syntax_message(text, &e),
        })?;
        let worker_id = WorkerId::new(file.worker_id.clone())
            .map_err(|_| field(path, "worker_id", worker_id_rule(&file.worker_id)))?;
        let (root, root_overridden) = path_setting(path, env, ENV_ROOT, "root", &file.root)?;
        if let Err(e) = crate::layout::check_root_path(&root) {
            return Err(if root_overridden {
                ConfigError::Env {
                    var: ENV_ROOT,
                    field: "root",
                    path: path.to_path_buf(),
                    rule: e.rule().to_string(),
                }
            } else {
                field(path, "root", e.rule())
            });
        }
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
        let (control_plane, mut overrides) = Self::control_plane(path, &file.control_plane, env)?;
        overrides.root = root_overridden;
        let limits = Self::limits(path, file.profile, &file.limits)?;
        // Retention removes settled records only while the inbox holds more than the mark: at
        // or above the capacity, a full inbox of settled records would free no place and the
        // Worker would take no work until they aged out (`max_settled_age_ms`).
        let capacity = u64::try_from(limits.inbox_capacity.get()).unwrap_or(64);
        let high_water = file.retention.high_water_records.unwrap_or(capacity / 2);
        if high_water >= capacity {
            return Err(field(
                path,
                "retention.high_water_records",
                format!(
                    "must be below limits.inbox_capacity ({capacity}): retention frees a place \
                     only while the inbox holds more records than this; found {high_water}"
                ),
            ));
        }
        let retention = Retention {
            high_water_records: high_water,
            max_settled_age_ms: file
                .retention
                .max_settled_age_ms
                .unwrap_or(7 * 24 * 3_600_000),
            log_keep_ms: file.retention.log_keep_ms.unwrap_or(24 * 3_600_000),
        };
        let metrics = Self::metrics(path, file.metrics.as_ref())?;
        let capabilities = Self::capabilities(path, architecture, file.capabilities.as_ref())?;
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
            metrics,
            capabilities,
            containment,
            overrides,
        })
    }

    fn metrics(path: &Path, file: Option<&MetricsFile>) -> Result<MetricsSettings, ConfigError> {
        let Some(file) = file else {
            return Ok(MetricsSettings {
                interval_ms: 10_000,
                ..MetricsSettings::default()
            });
        };
        let textfile = match &file.textfile {
            None => None,
            Some(p) => {
                let p = absolute(path, "metrics.textfile", p.clone())?;
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if !name.ends_with(".prom") || name.starts_with('.') {
                    return Err(field(
                        path,
                        "metrics.textfile",
                        "must name a file ending in .prom (the node_exporter textfile \
                         collector reads only those), not starting with a dot",
                    ));
                }
                match p.parent().map(fs::symlink_metadata) {
                    Some(Ok(meta)) if meta.is_dir() => {}
                    _ => {
                        return Err(field(
                            path,
                            "metrics.textfile",
                            format!(
                                "its directory {} must exist (the collector's directory)",
                                p.parent().unwrap_or(Path::new("/")).display()
                            ),
                        ));
                    }
                }
                Some(p)
            }
        };
        let interval_ms = within(
            path,
            "metrics.interval_ms",
            file.interval_ms.unwrap_or(10_000),
            1_000,
            3_600_000,
        )?;
        let listen = file
            .listen
            .as_deref()
            .map(crate::metrics::Listen::parse)
            .transpose()
            .map_err(|rule| field(path, "metrics.listen", rule))?;
        Ok(MetricsSettings {
            textfile,
            interval_ms,
            listen,
        })
    }

    /// `[capabilities]` into the announced capabilities, validated by the same rules as the
    /// register body (`capabilities.<field>` names what is wrong).
    fn capabilities(
        path: &Path,
        architecture: Architecture,
        file: Option<&CapabilitiesFile>,
    ) -> Result<ql_worker_core::wire::session::Capabilities, ConfigError> {
        use ql_worker_core::wire::session::{CapacityCapability, RuntimeCapability};
        let mut caps = ql_worker_core::wire::session::Capabilities::for_architecture(architecture);
        let empty = CapabilitiesFile::default();
        let file = file.unwrap_or(&empty);
        caps.operating_system = Some(
            file.operating_system
                .clone()
                .unwrap_or_else(|| String::from(std::env::consts::OS)),
        );
        caps.labels = file.labels.as_ref().map(|labels| {
            labels
                .iter()
                .map(|(key, value)| ql_worker_core::revision::Label {
                    key: key.clone(),
                    value: value.clone(),
                })
                .collect()
        });
        caps.runtimes = file.runtimes.as_ref().map(|list| {
            list.iter()
                .map(|r| RuntimeCapability {
                    name: r.name.clone(),
                    version: r.version.clone(),
                })
                .collect()
        });
        caps.features.clone_from(&file.features);
        if file.cpu_cores.is_some() || file.memory_bytes.is_some() || file.disk_bytes.is_some() {
            caps.capacity = Some(CapacityCapability {
                cpu_cores: file.cpu_cores,
                memory_bytes: file.memory_bytes,
                disk_bytes: file.disk_bytes,
                gpu: None,
            });
        }
        caps.canonical_json().map_err(|e| match e {
            ql_worker_core::wire::WireError::Request { path: at, rule } => {
                let (name, rule) = capability_rule(at, rule);
                field(path, name, rule)
            }
            other => field(path, "capabilities", other.to_string()),
        })?;
        Ok(caps)
    }

    fn control_plane(
        path: &Path,
        file: &ControlPlaneFile,
        env: &dyn Environment,
    ) -> Result<(ControlPlane, Overrides), ConfigError> {
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
        let (client_certificate, cert_env) = path_setting(
            path,
            env,
            ENV_CLIENT_CERTIFICATE,
            "control_plane.client_certificate",
            &file.client_certificate,
        )?;
        let (client_key, key_env) = path_setting(
            path,
            env,
            ENV_CLIENT_KEY,
            "control_plane.client_key",
            &file.client_key,
        )?;
        let (credential_file, credential_env) = path_setting(
            path,
            env,
            ENV_CREDENTIAL_FILE,
            "control_plane.credential_file",
            &file.credential_file,
        )?;
        let control_plane = ControlPlane {
            origin: file.origin.clone(),
            trust_anchors: anchors,
            client_certificate,
            client_key,
            credential_file,
            timeout_ms: within(
                path,
                "control_plane.timeout_ms",
                file.timeout_ms.unwrap_or(15_000),
                1_000,
                60_000,
            )?,
            give_up_after_ms: within(
                path,
                "control_plane.give_up_after_ms",
                file.give_up_after_ms.unwrap_or(600_000),
                5_000,
                86_400_000,
            )?,
            certificate_warning_ms: within(
                path,
                "control_plane.certificate_warning_days",
                file.certificate_warning_days.unwrap_or(14),
                0,
                365,
            )? * 86_400_000,
        };
        let overrides = Overrides {
            root: false,
            credential_file: credential_env,
            client_certificate: cert_env,
            client_key: key_env,
        };
        Ok((control_plane, overrides))
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
        let reserve = within(
            path,
            "limits.log_reserve_bytes",
            pick(file.log_reserve_bytes, 32 << 20, 256 << 20),
            0,
            crate::spool::MAX_RESERVE_BYTES,
        )?;
        // Both bounds were checked above, so this cannot fail; it is mapped all the same.
        let spool = SpoolPolicy::custom(quota, reserve, 1 << 20).map_err(|_| {
            field(
                path,
                "limits.log_quota_bytes",
                "must be within 65536..=67108864",
            )
        })?;
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

/// The rule set of a file read from outside the state root (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileClass {
    /// The credential and the private key: owned by the Worker's uid, mode 0600 or stricter.
    Secret,
    /// The configuration, the client certificate and the trust anchors: owned by the Worker's uid
    /// or root, not writable by group or other.
    Public,
}

/// What is wrong with a file read from outside the state root. Never holds its content.
#[derive(Debug)]
pub enum FileProblem {
    /// It could not be opened or read.
    Io(std::io::Error),
    /// The last path component is a symbolic link.
    Symlink,
    /// A directory, FIFO, socket or device.
    NotRegular,
    /// Owned by someone the rule does not allow.
    Owner {
        /// The class (which owners are allowed).
        class: FileClass,
        /// The Worker's effective uid.
        euid: u32,
        /// The owner found.
        found: u32,
    },
    /// Permission bits the rule does not allow.
    Mode {
        /// The class (which bits are allowed).
        class: FileClass,
        /// The permission bits found.
        found: u32,
    },
    /// Larger than the bound.
    TooLarge {
        /// The bound, in bytes.
        max: u64,
    },
}

impl fmt::Display for FileProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Io(e) => write!(f, "cannot be read: {}", io_text(e)),
            Self::Symlink => f.write_str(
                "must be a regular file, not a symbolic link (give the path of the file itself)",
            ),
            Self::NotRegular => {
                f.write_str("must be a regular file (not a directory, FIFO or device)")
            }
            Self::Owner {
                class: FileClass::Secret,
                euid,
                found,
            } => write!(
                f,
                "must be owned by uid {euid} (the Worker's user), is owned by uid {found}"
            ),
            Self::Owner {
                class: FileClass::Public,
                euid,
                found,
            } => write!(
                f,
                "must be owned by uid {euid} (the Worker's user) or root, is owned by uid {found}"
            ),
            Self::Mode {
                class: FileClass::Secret,
                found,
            } => write!(
                f,
                "must have mode 0600 or stricter (no group or other permission bits), has {found:04o}"
            ),
            Self::Mode {
                class: FileClass::Public,
                found,
            } => write!(
                f,
                "must not be writable by group or other (e.g. mode 0644), has {found:04o}"
            ),
            Self::TooLarge { max } => write!(f, "must be at most {max} bytes"),
        }
    }
}

/// An I/O error without Rust's `(os error N)` suffix.
fn io_text(e: &std::io::Error) -> String {
    let text = e.to_string();
    match text.find(" (os error") {
        Some(cut) => text[..cut].to_string(),
        None => text,
    }
}

/// Opens `path` without following a symbolic link (`O_NOFOLLOW|O_NONBLOCK|O_CLOEXEC`; a FIFO
/// cannot block the open) and checks the open descriptor against `class` and `max` bytes.
///
/// # Errors
/// The [`FileProblem`].
pub fn open_checked(path: &Path, class: FileClass, max: u64) -> Result<fs::File, FileProblem> {
    let flags =
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC | OFlags::NOCTTY;
    let fd = match rustix::fs::open(path, flags, rustix::fs::Mode::empty()) {
        Ok(fd) => fd,
        Err(Errno::LOOP) => return Err(FileProblem::Symlink),
        Err(Errno::NXIO | Errno::OPNOTSUPP | Errno::NODEV) => return Err(FileProblem::NotRegular),
        Err(e) => return Err(FileProblem::Io(e.into())),
    };
    let st = rustix::fs::fstat(fd.as_fd()).map_err(|e| FileProblem::Io(e.into()))?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(FileProblem::NotRegular);
    }
    let euid = rustix::process::geteuid().as_raw();
    let owner_ok = st.st_uid == euid || (class == FileClass::Public && st.st_uid == 0);
    if !owner_ok {
        return Err(FileProblem::Owner {
            class,
            euid,
            found: st.st_uid,
        });
    }
    let mode = st.st_mode & 0o7777;
    let forbidden = match class {
        FileClass::Secret => 0o077,
        FileClass::Public => 0o022,
    };
    if mode & forbidden != 0 {
        return Err(FileProblem::Mode { class, found: mode });
    }
    if u64::try_from(st.st_size).unwrap_or(u64::MAX) > max {
        return Err(FileProblem::TooLarge { max });
    }
    Ok(fs::File::from(fd))
}

/// [`open_checked`], then reads the whole file (at most `max` bytes, re-checked while reading)
/// into a buffer that is wiped when dropped.
///
/// # Errors
/// The [`FileProblem`].
pub fn read_checked(
    path: &Path,
    class: FileClass,
    max: u64,
) -> Result<zeroize::Zeroizing<Vec<u8>>, FileProblem> {
    let file = open_checked(path, class, max)?;
    // Sized up front so the buffer never reallocates (a reallocation would leave an unwiped
    // copy of the old contents behind).
    let capacity = usize::try_from(max.saturating_add(1)).unwrap_or(usize::MAX);
    let mut buf = zeroize::Zeroizing::new(Vec::with_capacity(capacity));
    file.take(max.saturating_add(1))
        .read_to_end(&mut buf)
        .map_err(FileProblem::Io)?;
    if buf.len() as u64 > max {
        return Err(FileProblem::TooLarge { max });
    }
    Ok(buf)
}

/// The TOML error as `line L, column C: <what>` without the source excerpt the parser would
/// show, and with every quoted value and every key that does not look like a field name
/// hidden: a credential pasted into the file must not be echoed to a log.
fn syntax_message(text: &str, error: &toml::de::Error) -> String {
    let at = error.span().map(|span| {
        let start = span.start.min(text.len());
        let before = text.get(..start).unwrap_or("");
        let line = before.matches('\n').count() + 1;
        let column = before
            .rsplit('\n')
            .next()
            .map_or(1, |l| l.chars().count() + 1);
        format!("line {line}, column {column}: ")
    });
    let message = error.message().trim_end_matches('\n');
    format!(
        "{}{}",
        at.unwrap_or_default(),
        redact_parser_message(message)
    )
}

/// Hides `"quoted values"` and `` `tokens` `` that are not plain field names in a parser message.
fn redact_parser_message(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(pos) = rest.find(['"', '`']) {
        out.push_str(&rest[..pos]);
        let quote = rest[pos..].chars().next().unwrap_or('"');
        let after = &rest[pos + 1..];
        let Some(end) = after.find(quote) else {
            out.push_str("(rest hidden)");
            return out;
        };
        let inner = &after[..end];
        let punctuation = inner.len() <= 3 && inner.chars().all(|c| c.is_ascii_punctuation());
        if quote == '`' && (looks_like_field_name(inner) || punctuation) {
            out.push('`');
            out.push_str(inner);
            out.push('`');
        } else if quote == '`' {
            out.push_str("(a name that is not a field, hidden)");
        } else {
            out.push_str("(value hidden)");
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    out
}

fn looks_like_field_name(token: &str) -> bool {
    let mut chars = token.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && token.len() <= 40
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.')
        && !token.starts_with("ql3w")
}

/// Checks that a secret-bearing file is a regular file (not a symbolic link), owned by this
/// user, with no group or other permission bits.
///
/// # Errors
/// A message naming the file and the rule.
pub fn check_secret_file(path: &Path, what: &str) -> Result<(), String> {
    open_checked(path, FileClass::Secret, u64::MAX)
        .map(drop)
        .map_err(|problem| format!("{what} {}: {problem}", path.display()))
}
