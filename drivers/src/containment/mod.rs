//! Containment of each Run (SPEC §10; docs/security.md): its own identity (`[run_as]`), no new
//! privileges, resource limits (`[run_limits]`), cgroup v2 limits (`[cgroup]`), a local
//! execution policy (`[policy]`) and Secret masking in captured logs (`[capture]`).
//!
//! * [`settings`]: the configuration tables and their rules.
//! * [`prepare`]: what the Worker does at start-up (resolve the identity, check its privileges,
//!   create the runs area, find a delegated cgroup) and the [`ContainmentPlan`] it hands to every
//!   supervisor inside the launch plan.
//! * [`policy`], [`limits`], [`runs`], [`cgroup`]: what the supervisor enforces, all before the
//!   user process exists (a failure there is a proven no-spawn).

pub mod cgroup;
pub mod identity;
pub mod limits;
pub mod policy;
pub mod runs;
pub mod settings;

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use cgroup::CgroupPlan;
pub use identity::RunIdentity;
pub use policy::{Policy, PolicyRule};
pub use settings::{Containment, RlimitKind};

/// The run identity and runs area, as the supervisor receives them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunAsPlan {
    /// uid/gid (or the range to allocate from).
    pub identity: RunIdentity,
    /// The runs area (absolute).
    pub runs_dir: String,
}

/// Everything the supervisor enforces for one Run; part of the launch plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainmentPlan {
    /// `None`: the user command runs as the supervisor (the Worker's identity).
    pub run_as: Option<RunAsPlan>,
    /// `PR_SET_NO_NEW_PRIVS` before the spawn.
    pub no_new_privileges: bool,
    /// Limits set (soft = hard) before the spawn.
    pub rlimits: Vec<(RlimitKind, u64)>,
    /// The Run's cgroup, if a delegated cgroup is in use.
    pub cgroup: Option<CgroupPlan>,
    /// The execution policy.
    pub policy: Policy,
    /// Replace the Run's Secret values by `***` in its log.
    pub mask_secrets: bool,
}

impl Default for ContainmentPlan {
    /// The containment of a Worker without any containment configuration.
    fn default() -> Self {
        Self::unresolved(&Containment::default())
    }
}

impl ContainmentPlan {
    /// The plan for `settings` without `[run_as]` or a cgroup (which need [`prepare`]).
    #[must_use]
    pub fn unresolved(settings: &Containment) -> Self {
        Self {
            run_as: None,
            no_new_privileges: settings.no_new_privileges,
            rlimits: settings.rlimits.clone(),
            cgroup: None,
            policy: settings.policy.clone(),
            mask_secrets: settings.mask_secrets,
        }
    }

    /// The execution policy for one launch (the Run's own directory counts as allowed when
    /// `[run_as]` gives it one).
    ///
    /// # Errors
    /// The [`PolicyRule`] that refuses it.
    pub fn check_policy(
        &self,
        command: &ql_worker_core::revision::ExecCommand,
        working_directory: Option<&str>,
    ) -> Result<(), PolicyRule> {
        self.policy
            .check(command, working_directory, self.run_as.is_some())
    }

    /// Checks the plan's own shape (the supervisor re-checks what it received).
    ///
    /// # Errors
    /// When a path is not absolute, a limit appears twice or the policy is malformed.
    pub fn validate(&self) -> Result<(), &'static str> {
        let absolute = |p: &str| p.starts_with('/') && p.len() <= 4096 && !p.contains('\0');
        if let Some(run_as) = &self.run_as
            && !policy::is_normal_absolute(&run_as.runs_dir)
        {
            return Err("runs_dir");
        }
        if let Some(cg) = &self.cgroup
            && !absolute(&cg.parent)
        {
            return Err("cgroup");
        }
        let mut kinds: Vec<RlimitKind> = self.rlimits.iter().map(|(k, _)| *k).collect();
        kinds.sort_unstable();
        if kinds.windows(2).any(|w| w[0] == w[1]) {
            return Err("rlimits");
        }
        self.policy.validate().map_err(|_| "policy")
    }
}

/// What [`prepare`] found: the plan for supervisors, and warnings for the operator.
#[derive(Clone, Debug)]
pub struct Prepared {
    /// The plan every supervisor receives.
    pub plan: ContainmentPlan,
    /// Things the operator should know (printed by `init` and `run`).
    pub warnings: Vec<String>,
}

/// The warning of a Worker without `[run_as]`.
#[must_use]
pub fn shared_identity_warning(uid: u32) -> String {
    format!(
        "Runs share the Worker's identity (uid {uid}): a Run's command can read the client key, \
         the credential and other Runs' records. Configure [run_as] (docs/security.md)"
    )
}

/// Prepares containment at Worker start-up: resolves `[run_as]` (against `/etc`), checks the
/// Worker may switch to it, creates and checks the runs area, and looks for a delegated cgroup
/// when cgroup limits are configured. May move the Worker into its cgroup's `worker` leaf.
///
/// # Errors
/// The field and the rule (the Worker must not start).
pub fn prepare(settings: &Containment) -> Result<Prepared, (&'static str, String)> {
    prepare_with(settings, Path::new("/etc"), Path::new("/proc/self"))
}

/// [`prepare`] with the `/etc` and `/proc/self` to read (tests).
///
/// # Errors
/// The field and the rule.
pub fn prepare_with(
    settings: &Containment,
    etc: &Path,
    proc_self: &Path,
) -> Result<Prepared, (&'static str, String)> {
    let mut plan = ContainmentPlan::unresolved(settings);
    let mut warnings = Vec::new();
    let uid = rustix::process::geteuid().as_raw();
    match &settings.run_as {
        None => warnings.push(shared_identity_warning(uid)),
        Some(run_as) => {
            let identity = identity::resolve(run_as, etc, uid)?;
            let missing = identity::missing_capabilities();
            if !missing.is_empty() {
                return Err((
                    "run_as",
                    format!(
                        "the Worker must run as root or hold {} to run commands under another \
                         identity; missing: {}",
                        identity::REQUIRED_CAPABILITIES
                            .iter()
                            .map(|(_, n)| *n)
                            .collect::<Vec<_>>()
                            .join(", "),
                        missing.join(", ")
                    ),
                ));
            }
            runs::prepare_area(&run_as.runs_dir).map_err(|e| ("run_as.runs_dir", e))?;
            plan.run_as = Some(RunAsPlan {
                identity,
                runs_dir: path_text(&run_as.runs_dir),
            });
        }
    }
    if settings.cgroup.any() {
        match cgroup::detect(proc_self, &settings.cgroup) {
            Ok(cg) => plan.cgroup = Some(cg),
            Err(why) if settings.cgroup.required => {
                return Err((
                    "cgroup.required",
                    format!("no delegated cgroup v2 is usable: {why}"),
                ));
            }
            Err(why) => warnings.push(format!(
                "cgroup limits are configured but not applied: {why}. Runs are limited by \
                 [run_limits] only (set cgroup.required = true to refuse to start instead)"
            )),
        }
    }
    Ok(Prepared { plan, warnings })
}

fn path_text(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

/// The runs area of a plan, if any.
#[must_use]
pub fn runs_dir(plan: &ContainmentPlan) -> Option<PathBuf> {
    plan.run_as.as_ref().map(|r| PathBuf::from(&r.runs_dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_run_as_the_worker_is_warned_and_nothing_is_resolved() {
        let prepared = prepare(&Containment::default()).unwrap();
        assert_eq!(prepared.plan, ContainmentPlan::default());
        assert_eq!(prepared.warnings.len(), 1);
        assert!(prepared.warnings[0].contains("Runs share the Worker's identity"));
    }

    #[test]
    fn required_cgroups_refuse_to_start_where_none_is_delegated() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("cgroup"), "4:memory:/x\n").unwrap();
        let mut settings = Containment::default();
        settings.cgroup.pids_max = Some(64);
        let prepared = prepare_with(&settings, Path::new("/etc"), dir.path()).unwrap();
        assert!(prepared.plan.cgroup.is_none());
        assert!(
            prepared.warnings.iter().any(|w| w.contains("not applied")),
            "{:?}",
            prepared.warnings
        );
        settings.cgroup.required = true;
        let (field, rule) = prepare_with(&settings, Path::new("/etc"), dir.path()).unwrap_err();
        assert_eq!(field, "cgroup.required");
        assert!(rule.contains("no 0:: line"), "{rule}");
    }
}
