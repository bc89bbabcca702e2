//! The containment tables of the configuration file (`[run_as]`, `[run_limits]`, `[cgroup]`,
//! `[policy]`, `[capture]`) and their validation. `crate::config` deserializes the tables into
//! the `*File` structs here and calls [`Containment::from_file`]; every rule lives in this file.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::policy::Policy;

/// `[run_as]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunAsFile {
    user: Option<String>,
    group: Option<String>,
    uid_range: Option<[u64; 2]>,
    runs_dir: Option<PathBuf>,
}

/// `[run_limits]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunLimitsFile {
    no_new_privileges: Option<bool>,
    nofile: Option<u64>,
    nproc: Option<u64>,
    core: Option<u64>,
    fsize: Option<u64>,
    #[serde(rename = "as")]
    address_space: Option<u64>,
}

/// `[cgroup]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CgroupFile {
    required: Option<bool>,
    memory_max: Option<u64>,
    pids_max: Option<u64>,
    cpu_max: Option<String>,
}

/// `[policy]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyFile {
    executables: Option<Vec<String>>,
    shells: Option<Vec<String>>,
    shell: Option<bool>,
    working_directories: Option<Vec<String>>,
}

/// `[capture]` as written.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureFile {
    mask_secrets: Option<bool>,
}

/// The five tables, as `crate::config` read them.
#[derive(Clone, Debug, Default)]
pub struct ContainmentFile<'a> {
    /// `[run_as]`, if present.
    pub run_as: Option<&'a RunAsFile>,
    /// `[run_limits]`.
    pub run_limits: Option<&'a RunLimitsFile>,
    /// `[cgroup]`.
    pub cgroup: Option<&'a CgroupFile>,
    /// `[policy]`.
    pub policy: Option<&'a PolicyFile>,
    /// `[capture]`.
    pub capture: Option<&'a CaptureFile>,
}

/// A user or group as configured: a name to look up, or a number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    /// Looked up in `/etc/passwd` or `/etc/group`.
    Name(String),
    /// Used as is.
    Id(u32),
}

impl Principal {
    fn parse(text: &str) -> Option<Self> {
        if text.is_empty() || text.len() > 64 {
            return None;
        }
        if text.bytes().all(|b| b.is_ascii_digit()) {
            return text.parse().ok().map(Self::Id);
        }
        let valid = text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
            && !text.starts_with('-');
        valid.then(|| Self::Name(text.to_owned()))
    }
}

/// Whose identity the user command runs under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RunUser {
    /// One user for every Run.
    User(Principal),
    /// One uid of `first..first + count` per live Run.
    Range {
        /// First uid.
        first: u32,
        /// How many uids.
        count: u32,
    },
}

/// `[run_as]`, validated (names are resolved at start-up, see `containment::identity`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunAs {
    /// The user (or uid range).
    pub user: RunUser,
    /// The group; default: the user's primary group (a range: the uid's own number).
    pub group: Option<Principal>,
    /// The runs area: one directory per Run, owned by the run user.
    pub runs_dir: PathBuf,
}

/// One resource limit the supervisor sets (soft = hard) on itself before it spawns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum RlimitKind {
    /// `RLIMIT_NOFILE`.
    Nofile,
    /// `RLIMIT_NPROC` (counted per real uid: every process of the run user).
    Nproc,
    /// `RLIMIT_CORE`.
    Core,
    /// `RLIMIT_FSIZE`.
    Fsize,
    /// `RLIMIT_AS`.
    AddressSpace,
}

impl RlimitKind {
    /// The configuration key.
    #[must_use]
    pub const fn key(self) -> &'static str {
        match self {
            Self::Nofile => "nofile",
            Self::Nproc => "nproc",
            Self::Core => "core",
            Self::Fsize => "fsize",
            Self::AddressSpace => "as",
        }
    }
}

/// `cpu.max`: a quota in microseconds per period (`None` = `max`, unlimited).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuMax {
    /// Microseconds of CPU per period, or unlimited.
    pub quota_us: Option<u64>,
    /// The period, microseconds.
    pub period_us: u64,
}

impl CpuMax {
    /// Parses `"<quota> <period>"` or `"max <period>"` (the kernel's own spelling).
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        let mut parts = text.split(' ');
        let (quota, period, rest) = (parts.next()?, parts.next()?, parts.next());
        if rest.is_some() {
            return None;
        }
        let period_us: u64 = period.parse().ok()?;
        if !(1_000..=1_000_000).contains(&period_us) {
            return None;
        }
        let quota_us = if quota == "max" {
            None
        } else {
            let q: u64 = quota.parse().ok()?;
            if !(1_000..=1_000_000_000).contains(&q) {
                return None;
            }
            Some(q)
        };
        Some(Self {
            quota_us,
            period_us,
        })
    }

    /// The text written to `cpu.max`.
    #[must_use]
    pub fn to_file(self) -> String {
        match self.quota_us {
            Some(q) => format!("{q} {}", self.period_us),
            None => format!("max {}", self.period_us),
        }
    }
}

/// `[cgroup]`, validated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CgroupSettings {
    /// Refuse to start without a delegated cgroup (default: warn and rely on rlimits).
    pub required: bool,
    /// `memory.max`, bytes.
    pub memory_max: Option<u64>,
    /// `pids.max`.
    pub pids_max: Option<u64>,
    /// `cpu.max`.
    pub cpu_max: Option<CpuMax>,
}

impl CgroupSettings {
    /// Whether any cgroup limit is configured (cgroups are used only then).
    #[must_use]
    pub fn any(&self) -> bool {
        self.memory_max.is_some() || self.pids_max.is_some() || self.cpu_max.is_some()
    }

    /// The controllers the configured limits need, in `cgroup.subtree_control` spelling.
    #[must_use]
    pub fn controllers(&self) -> Vec<&'static str> {
        let mut c = Vec::new();
        if self.cpu_max.is_some() {
            c.push("cpu");
        }
        if self.memory_max.is_some() {
            c.push("memory");
        }
        if self.pids_max.is_some() {
            c.push("pids");
        }
        c
    }
}

/// Every containment setting, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Containment {
    /// `[run_as]`; `None`: Runs share the Worker's identity.
    pub run_as: Option<RunAs>,
    /// `PR_SET_NO_NEW_PRIVS` for the user command (default on).
    pub no_new_privileges: bool,
    /// Resource limits (soft = hard), sorted by kind. `core = 0` unless configured.
    pub rlimits: Vec<(RlimitKind, u64)>,
    /// cgroup v2 limits.
    pub cgroup: CgroupSettings,
    /// The execution policy.
    pub policy: Policy,
    /// Replace the Run's Secret values by `***` in its captured log (default off: byte-exact).
    pub mask_secrets: bool,
}

impl Default for Containment {
    fn default() -> Self {
        Self {
            run_as: None,
            no_new_privileges: true,
            rlimits: vec![(RlimitKind::Core, 0)],
            cgroup: CgroupSettings::default(),
            policy: Policy::default(),
            mask_secrets: false,
        }
    }
}

/// A rule broken: the field (dotted) and the rule.
pub type FieldError = (&'static str, String);

fn range(field: &'static str, value: u64, min: u64, max: u64) -> Result<u64, FieldError> {
    if (min..=max).contains(&value) {
        Ok(value)
    } else {
        Err((
            field,
            format!("must be within {min}..={max}, found {value}"),
        ))
    }
}

/// `<root>-runs`, the default runs area.
#[must_use]
pub fn default_runs_dir(root: &Path) -> PathBuf {
    let mut name = root.file_name().unwrap_or_default().to_os_string();
    name.push("-runs");
    root.with_file_name(name)
}

impl Containment {
    /// Validates the tables. `root` is the state root (the runs area must be outside it).
    ///
    /// # Errors
    /// The field and the rule.
    pub fn from_file(file: &ContainmentFile<'_>, root: &Path) -> Result<Self, FieldError> {
        let run_as = file.run_as.map(|r| run_as(r, root)).transpose()?;
        let limits = file.run_limits.cloned().unwrap_or_default();
        let mut rlimits = vec![(RlimitKind::Core, limits.core.unwrap_or(0))];
        if let Some(v) = limits.nofile {
            rlimits.push((
                RlimitKind::Nofile,
                range("run_limits.nofile", v, 32, 1 << 20)?,
            ));
        }
        if let Some(v) = limits.nproc {
            rlimits.push((
                RlimitKind::Nproc,
                range("run_limits.nproc", v, 1, 4_194_304)?,
            ));
        }
        if let Some(v) = limits.fsize {
            // The log is not written under it: the supervisor, which writes the log, never
            // changes its own limits; only the held process sets them on itself.
            rlimits.push((
                RlimitKind::Fsize,
                range("run_limits.fsize", v, 0, u64::MAX >> 1)?,
            ));
        }
        if let Some(v) = limits.address_space {
            rlimits.push((
                RlimitKind::AddressSpace,
                range("run_limits.as", v, 64 << 20, u64::MAX >> 1)?,
            ));
        }
        rlimits.sort_unstable();
        let cg = file.cgroup.cloned().unwrap_or_default();
        let cgroup = CgroupSettings {
            required: cg.required.unwrap_or(false),
            memory_max: cg
                .memory_max
                .map(|v| range("cgroup.memory_max", v, 4 << 20, u64::MAX >> 1))
                .transpose()?,
            pids_max: cg
                .pids_max
                .map(|v| range("cgroup.pids_max", v, 2, 4_194_304))
                .transpose()?,
            cpu_max: cg
                .cpu_max
                .map(|text| {
                    CpuMax::parse(&text).ok_or((
                        "cgroup.cpu_max",
                        format!(
                            "must be \"<quota µs> <period µs>\" or \"max <period µs>\" (quota \
                             1000..=1000000000, period 1000..=1000000), found {text:?}"
                        ),
                    ))
                })
                .transpose()?,
        };
        if cgroup.required && !cgroup.any() {
            return Err((
                "cgroup.required",
                String::from("needs at least one of memory_max, pids_max, cpu_max"),
            ));
        }
        let pf = file.policy.cloned().unwrap_or_default();
        let policy = Policy {
            executables: pf.executables,
            shells: pf.shells,
            shell: pf.shell.unwrap_or(true),
            working_directories: pf.working_directories,
        };
        policy.validate()?;
        Ok(Self {
            run_as,
            no_new_privileges: limits.no_new_privileges.unwrap_or(true),
            rlimits,
            cgroup,
            policy,
            mask_secrets: file.capture.and_then(|c| c.mask_secrets).unwrap_or(false),
        })
    }
}

fn run_as(file: &RunAsFile, root: &Path) -> Result<RunAs, FieldError> {
    let user = match (&file.user, file.uid_range) {
        (Some(_), Some(_)) => {
            return Err((
                "run_as.uid_range",
                String::from("give either run_as.user or run_as.uid_range, not both"),
            ));
        }
        (None, None) => {
            return Err((
                "run_as.user",
                String::from("[run_as] needs user (a name or uid) or uid_range = [first, last]"),
            ));
        }
        (Some(user), None) => RunUser::User(Principal::parse(user).ok_or((
            "run_as.user",
            format!("must be a user name ([A-Za-z0-9_.-], not starting with '-') or a uid, found {user:?}"),
        ))?),
        (None, Some([first, last])) => {
            let ok = first >= 1 && last >= first && last - first < 65_536 && last < u64::from(u32::MAX) - 1;
            if !ok {
                return Err((
                    "run_as.uid_range",
                    format!(
                        "must be [first, last] with 1 <= first <= last < 4294967294 and at most \
                         65536 uids, found [{first}, {last}]"
                    ),
                ));
            }
            // INVARIANT: checked just above to fit u32.
            RunUser::Range {
                first: u32::try_from(first).unwrap_or(u32::MAX),
                count: u32::try_from(last - first + 1).unwrap_or(1),
            }
        }
    };
    let group = file
        .group
        .as_deref()
        .map(|g| {
            Principal::parse(g).ok_or((
                "run_as.group",
                format!("must be a group name or a gid, found {g:?}"),
            ))
        })
        .transpose()?;
    let runs_dir = file
        .runs_dir
        .clone()
        .unwrap_or_else(|| default_runs_dir(root));
    let text = runs_dir.to_str().unwrap_or("");
    if !super::policy::is_normal_absolute(text) {
        return Err((
            "run_as.runs_dir",
            format!(
                "must be an absolute path without '.', '..' or '//', found {}",
                runs_dir.display()
            ),
        ));
    }
    if runs_dir.starts_with(root) || root.starts_with(&runs_dir) {
        return Err((
            "run_as.runs_dir",
            format!(
                "must be outside the state root {} (and not contain it): the run user must \
                 never reach the Worker's own files",
                root.display()
            ),
        ));
    }
    Ok(RunAs {
        user,
        group,
        runs_dir,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Containment, FieldError> {
        #[derive(Deserialize)]
        struct Tables {
            run_as: Option<RunAsFile>,
            run_limits: Option<RunLimitsFile>,
            cgroup: Option<CgroupFile>,
            policy: Option<PolicyFile>,
            capture: Option<CaptureFile>,
        }
        let t: Tables = toml::from_str(text).unwrap();
        Containment::from_file(
            &ContainmentFile {
                run_as: t.run_as.as_ref(),
                run_limits: t.run_limits.as_ref(),
                cgroup: t.cgroup.as_ref(),
                policy: t.policy.as_ref(),
                capture: t.capture.as_ref(),
            },
            Path::new("/var/lib/ql-worker"),
        )
    }

    #[test]
    fn defaults_are_core_zero_no_new_privileges_and_nothing_else() {
        let c = parse("").unwrap();
        assert_eq!(c, Containment::default());
        assert_eq!(c.rlimits, vec![(RlimitKind::Core, 0)]);
        assert!(c.no_new_privileges && !c.mask_secrets && c.run_as.is_none());
    }

    #[test]
    fn a_full_configuration_is_read() {
        let c = parse(
            "[run_as]\nuser = \"ql-run\"\ngroup = \"1234\"\n[run_limits]\nnofile = 1024\n\
             nproc = 64\nfsize = 8388608\nas = 536870912\n[cgroup]\nrequired = true\n\
             memory_max = 268435456\npids_max = 128\ncpu_max = \"50000 100000\"\n[policy]\n\
             shell = false\nexecutables = [\"/usr/bin/python3\"]\n[capture]\nmask_secrets = true\n",
        )
        .unwrap();
        let run_as = c.run_as.unwrap();
        assert_eq!(run_as.user, RunUser::User(Principal::Name("ql-run".into())));
        assert_eq!(run_as.group, Some(Principal::Id(1234)));
        assert_eq!(run_as.runs_dir, Path::new("/var/lib/ql-worker-runs"));
        assert_eq!(
            c.rlimits,
            vec![
                (RlimitKind::Nofile, 1024),
                (RlimitKind::Nproc, 64),
                (RlimitKind::Core, 0),
                (RlimitKind::Fsize, 8 << 20),
                (RlimitKind::AddressSpace, 512 << 20),
            ]
        );
        assert_eq!(c.cgroup.controllers(), vec!["cpu", "memory", "pids"]);
        assert_eq!(c.cgroup.cpu_max.unwrap().to_file(), "50000 100000");
        assert!(!c.policy.shell && c.mask_secrets);
    }

    #[test]
    fn every_rule_names_its_field() {
        let field = |text: &str| parse(text).unwrap_err().0;
        assert_eq!(field("[run_as]\n"), "run_as.user");
        assert_eq!(
            field("[run_as]\nuser = \"a\"\nuid_range = [100000, 100009]\n"),
            "run_as.uid_range"
        );
        assert_eq!(field("[run_as]\nuid_range = [0, 10]\n"), "run_as.uid_range");
        assert_eq!(field("[run_as]\nuid_range = [10, 9]\n"), "run_as.uid_range");
        assert_eq!(field("[run_as]\nuser = \"-x\"\n"), "run_as.user");
        assert_eq!(
            field("[run_as]\nuser = \"a\"\ngroup = \"a b\"\n"),
            "run_as.group"
        );
        assert_eq!(
            field("[run_as]\nuser = \"a\"\nruns_dir = \"/var/lib/ql-worker/runs\"\n"),
            "run_as.runs_dir"
        );
        assert_eq!(
            field("[run_as]\nuser = \"a\"\nruns_dir = \"/var/lib\"\n"),
            "run_as.runs_dir"
        );
        assert_eq!(
            field("[run_as]\nuser = \"a\"\nruns_dir = \"runs\"\n"),
            "run_as.runs_dir"
        );
        assert_eq!(field("[run_limits]\nnofile = 3\n"), "run_limits.nofile");
        assert_eq!(
            field("[run_limits]\nfsize = 9223372036854775808\n"),
            "run_limits.fsize"
        );
        assert_eq!(field("[run_limits]\nas = 1024\n"), "run_limits.as");
        assert_eq!(field("[cgroup]\npids_max = 1\n"), "cgroup.pids_max");
        assert_eq!(field("[cgroup]\nmemory_max = 1\n"), "cgroup.memory_max");
        assert_eq!(field("[cgroup]\ncpu_max = \"50%\"\n"), "cgroup.cpu_max");
        assert_eq!(field("[cgroup]\nrequired = true\n"), "cgroup.required");
        assert_eq!(
            field("[policy]\nshells = [\"/bin/zsh\"]\n"),
            "policy.shells"
        );
        let range = parse("[run_as]\nuid_range = [200000, 200999]\n").unwrap();
        assert_eq!(
            range.run_as.unwrap().user,
            RunUser::Range {
                first: 200_000,
                count: 1000
            }
        );
        assert_eq!(CpuMax::parse("max 100000").unwrap().to_file(), "max 100000");
        assert_eq!(CpuMax::parse("1 100000"), None);
    }
}
