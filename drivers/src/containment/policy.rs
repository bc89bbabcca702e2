//! The local execution policy (`[policy]`): a defence should the control plane be compromised.
//! Allowlists of argv executables (absolute paths, exact match), shells and working-directory
//! prefixes, and `shell = false` to refuse shell commands.
//!
//! The rule is decided twice, both times before any user process can exist: by the Worker
//! before it starts a supervisor, and by the supervisor right after its spawn barrier re-check.
//! A refusal is therefore a proven no-spawn (`Rejected` → `start_failed` → `failStart`,
//! `EXECUTOR_START_FAILED`).

use std::path::{Component, Path};

use ql_worker_core::revision::ExecCommand;
use serde::{Deserialize, Serialize};

/// Most entries in one allowlist.
pub const MAX_POLICY_ENTRIES: usize = 64;
/// Most bytes of all allowlist entries together (the policy travels in the launch plan).
pub const MAX_POLICY_BYTES: usize = 16 * 1024;
/// The shells the launcher accepts at all.
pub const KNOWN_SHELLS: [&str; 2] = ["/bin/sh", "/bin/bash"];

/// The validated policy. `None` for a list means "not restricted".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Policy {
    /// Argv files that may be executed (exact absolute paths).
    pub executables: Option<Vec<String>>,
    /// Shells shell commands may use (`/bin/sh`, `/bin/bash`).
    pub shells: Option<Vec<String>>,
    /// Whether shell commands are accepted at all.
    pub shell: bool,
    /// Directories a working directory must be (or be under), component-wise.
    pub working_directories: Option<Vec<String>>,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            executables: None,
            shells: None,
            shell: true,
            working_directories: None,
        }
    }
}

/// The rule that refused a launch. A fixed vocabulary (it travels in the launch report).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum PolicyRule {
    /// `policy.shell = false` and the revision is a shell command.
    #[error("policy.shell = false refuses shell commands")]
    ShellRefused,
    /// The shell is not in `policy.shells`.
    #[error("policy.shells does not list the command's shell")]
    ShellNotListed,
    /// The argv file is not in `policy.executables`.
    #[error("policy.executables does not list the argv file")]
    ExecutableNotListed,
    /// The working directory is not under any of `policy.working_directories`.
    #[error("policy.working_directories does not contain the working directory")]
    WorkingDirectoryNotListed,
    /// The working directory has a `.` or `..` component, so a prefix proves nothing.
    #[error(
        "the working directory must have no '.' or '..' component under policy.working_directories"
    )]
    WorkingDirectoryNotNormal,
    /// `policy.working_directories` is set and the revision names none (it would inherit the
    /// Worker's own directory).
    #[error("policy.working_directories is set and the revision names no working directory")]
    WorkingDirectoryAbsent,
}

/// Whether `path` is absolute with only normal components (no `.`, `..`, empty or trailing
/// slash tricks: the text must equal its normalized form).
#[must_use]
pub fn is_normal_absolute(path: &str) -> bool {
    if !path.starts_with('/') || path == "/" || path.ends_with('/') || path.contains("//") {
        return false;
    }
    Path::new(path)
        .components()
        .skip(1)
        .all(|c| matches!(c, Component::Normal(_)))
        && !path.split('/').any(|part| part == "." || part == "..")
}

/// Whether `dir` is `prefix` or under it, component-wise (`/srv/a` is not under `/srv/ab`).
fn under(dir: &str, prefix: &str) -> bool {
    dir == prefix
        || dir
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/'))
}

impl Policy {
    /// Checks one launch. `default_dir` is whether the supervisor gives the Run its own
    /// directory when the revision names none (the `[run_as]` runs area), which the policy
    /// always allows.
    ///
    /// # Errors
    /// The first [`PolicyRule`] broken.
    pub fn check(
        &self,
        command: &ExecCommand,
        working_directory: Option<&str>,
        default_dir: bool,
    ) -> Result<(), PolicyRule> {
        match command {
            ExecCommand::Shell { shell, .. } => {
                if !self.shell {
                    return Err(PolicyRule::ShellRefused);
                }
                let shell = shell.as_deref().unwrap_or(KNOWN_SHELLS[0]);
                if let Some(allowed) = &self.shells
                    && !allowed.iter().any(|s| s == shell)
                {
                    return Err(PolicyRule::ShellNotListed);
                }
            }
            ExecCommand::Argv { file, .. } => {
                if let Some(allowed) = &self.executables
                    && !allowed.iter().any(|e| e == file)
                {
                    return Err(PolicyRule::ExecutableNotListed);
                }
            }
        }
        if let Some(prefixes) = &self.working_directories {
            match working_directory {
                None if default_dir => {}
                None => return Err(PolicyRule::WorkingDirectoryAbsent),
                Some(dir) if !is_normal_absolute(dir) => {
                    return Err(PolicyRule::WorkingDirectoryNotNormal);
                }
                Some(dir) => {
                    if !prefixes.iter().any(|p| under(dir, p)) {
                        return Err(PolicyRule::WorkingDirectoryNotListed);
                    }
                }
            }
        }
        Ok(())
    }

    /// Checks the policy's own shape (bounds, absolute normal paths, known shells).
    ///
    /// # Errors
    /// The field and the rule.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        let mut total = 0usize;
        for (field, list) in [
            ("policy.executables", &self.executables),
            ("policy.shells", &self.shells),
            ("policy.working_directories", &self.working_directories),
        ] {
            let Some(list) = list else { continue };
            if list.len() > MAX_POLICY_ENTRIES {
                return Err((
                    field,
                    format!("must list at most {MAX_POLICY_ENTRIES} entries"),
                ));
            }
            for entry in list {
                total += entry.len();
                if !is_normal_absolute(entry) || entry.len() > 4096 || entry.contains('\0') {
                    return Err((
                        field,
                        format!(
                            "entries must be absolute paths without '.', '..', '//' or a trailing \
                             '/', found {entry:?}"
                        ),
                    ));
                }
            }
        }
        if total > MAX_POLICY_BYTES {
            return Err((
                "policy",
                format!("all entries together must be at most {MAX_POLICY_BYTES} bytes"),
            ));
        }
        if let Some(shells) = &self.shells
            && let Some(bad) = shells.iter().find(|s| !KNOWN_SHELLS.contains(&s.as_str()))
        {
            return Err((
                "policy.shells",
                format!("entries must be /bin/sh or /bin/bash, found {bad:?}"),
            ));
        }
        Ok(())
    }

    /// What the rule looked at, for the Worker's log line (the revision is not secret; the shell
    /// command text is never logged, only its shell).
    #[must_use]
    pub fn subject(
        rule: PolicyRule,
        command: &ExecCommand,
        working_directory: Option<&str>,
    ) -> String {
        match (rule, command) {
            (
                PolicyRule::ShellRefused | PolicyRule::ShellNotListed,
                ExecCommand::Shell { shell, .. },
            ) => {
                format!("shell {}", shell.as_deref().unwrap_or(KNOWN_SHELLS[0]))
            }
            (PolicyRule::ExecutableNotListed, ExecCommand::Argv { file, .. }) => {
                format!("argv file {file}")
            }
            _ => match working_directory {
                Some(dir) => format!("working directory {dir}"),
                None => String::from("no working directory"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn argv(file: &str) -> ExecCommand {
        ExecCommand::Argv {
            file: file.into(),
            args: vec![],
        }
    }

    fn shell(shell: Option<&str>) -> ExecCommand {
        ExecCommand::Shell {
            command: "echo hi".into(),
            shell: shell.map(Into::into),
        }
    }

    #[test]
    fn the_default_policy_allows_everything_the_launcher_accepts() {
        let p = Policy::default();
        assert_eq!(p.check(&argv("/usr/bin/env"), None, false), Ok(()));
        assert_eq!(p.check(&shell(None), Some("/x/../etc"), false), Ok(()));
        assert_eq!(p.validate(), Ok(()));
    }

    #[test]
    fn each_rule_refuses_what_it_names_and_nothing_else() {
        let p = Policy {
            executables: Some(vec!["/usr/bin/python3".into()]),
            shells: Some(vec!["/bin/bash".into()]),
            shell: true,
            working_directories: Some(vec!["/srv/tasks".into()]),
        };
        let wd = Some("/srv/tasks/job");
        assert_eq!(p.check(&argv("/usr/bin/python3"), wd, false), Ok(()));
        assert_eq!(
            p.check(&argv("/usr/bin/python"), wd, false),
            Err(PolicyRule::ExecutableNotListed)
        );
        assert_eq!(
            p.check(&argv("/usr/bin/../bin/python3"), wd, false),
            Err(PolicyRule::ExecutableNotListed),
            "exact match only"
        );
        assert_eq!(p.check(&shell(Some("/bin/bash")), wd, false), Ok(()));
        assert_eq!(
            p.check(&shell(None), wd, false),
            Err(PolicyRule::ShellNotListed),
            "no shell means /bin/sh"
        );
        let no_shell = Policy {
            shell: false,
            ..p.clone()
        };
        assert_eq!(
            no_shell.check(&shell(Some("/bin/bash")), wd, false),
            Err(PolicyRule::ShellRefused)
        );
        assert_eq!(
            p.check(&argv("/usr/bin/python3"), Some("/srv/tasks"), false),
            Ok(())
        );
        assert_eq!(
            p.check(&argv("/usr/bin/python3"), Some("/srv/tasksevil"), false),
            Err(PolicyRule::WorkingDirectoryNotListed)
        );
        assert_eq!(
            p.check(
                &argv("/usr/bin/python3"),
                Some("/srv/tasks/../../etc"),
                false
            ),
            Err(PolicyRule::WorkingDirectoryNotNormal)
        );
        assert_eq!(
            p.check(&argv("/usr/bin/python3"), None, false),
            Err(PolicyRule::WorkingDirectoryAbsent)
        );
        assert_eq!(
            p.check(&argv("/usr/bin/python3"), None, true),
            Ok(()),
            "the Run's own directory in the runs area is always allowed"
        );
    }

    #[test]
    fn the_policy_shape_is_validated() {
        let bad = |p: Policy| p.validate().unwrap_err().0;
        assert_eq!(
            bad(Policy {
                executables: Some(vec!["python3".into()]),
                ..Policy::default()
            }),
            "policy.executables"
        );
        assert_eq!(
            bad(Policy {
                working_directories: Some(vec!["/srv/".into()]),
                ..Policy::default()
            }),
            "policy.working_directories"
        );
        assert_eq!(
            bad(Policy {
                shells: Some(vec!["/bin/zsh".into()]),
                ..Policy::default()
            }),
            "policy.shells"
        );
        assert_eq!(
            bad(Policy {
                executables: Some(vec!["/bin/x".into(); MAX_POLICY_ENTRIES + 1]),
                ..Policy::default()
            }),
            "policy.executables"
        );
        assert!(is_normal_absolute("/a/b"));
        for no in ["/", "a", "/a/", "/a//b", "/a/./b", "/a/../b"] {
            assert!(!is_normal_absolute(no), "{no}");
        }
    }
}
