//! Run identity: resolving `[run_as]` to numbers (local `/etc/passwd` and `/etc/group`; NSS
//! sources such as LDAP are not consulted: give numbers for those), and checking that the Worker
//! holds the privileges to switch to it.

use std::fs;
use std::path::Path;

use rustix::thread::CapabilitySet;
use serde::{Deserialize, Serialize};

use super::settings::{Principal, RunAs, RunUser};

/// The identity the supervisor gives the user command (std's `CommandExt::uid`/`gid`; with a
/// uid set, std also clears the supplementary groups).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunIdentity {
    /// Every Run under this uid and gid.
    Fixed {
        /// uid.
        uid: u32,
        /// gid.
        gid: u32,
    },
    /// One free uid of `first..first + count` per live Run, allocated by the supervisor.
    Range {
        /// First uid.
        first: u32,
        /// Number of uids.
        count: u32,
        /// The gid; `None`: the allocated uid's own number.
        gid: Option<u32>,
    },
}

impl std::fmt::Display for RunIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Fixed { uid, gid } => write!(f, "uid {uid}, gid {gid}"),
            Self::Range { first, count, gid } => {
                let last = first.saturating_add(count.saturating_sub(1));
                write!(f, "one uid of {first}..={last} per live Run, ")?;
                match gid {
                    Some(gid) => write!(f, "gid {gid}"),
                    None => f.write_str("gid = the uid"),
                }
            }
        }
    }
}

/// The capabilities a Worker needs to run commands under another identity: switch uid and gid
/// (and clear supplementary groups), give the Run its directory, signal the Run's processes,
/// and remove the Run's directory afterwards.
pub const REQUIRED_CAPABILITIES: [(CapabilitySet, &str); 5] = [
    (CapabilitySet::SETUID, "CAP_SETUID"),
    (CapabilitySet::SETGID, "CAP_SETGID"),
    (CapabilitySet::CHOWN, "CAP_CHOWN"),
    (CapabilitySet::KILL, "CAP_KILL"),
    (CapabilitySet::DAC_OVERRIDE, "CAP_DAC_OVERRIDE"),
];

/// The capabilities of [`REQUIRED_CAPABILITIES`] missing from this process's effective set.
#[must_use]
pub fn missing_capabilities() -> Vec<&'static str> {
    let effective = rustix::thread::capabilities(None)
        .map(|c| c.effective)
        .unwrap_or(CapabilitySet::empty());
    REQUIRED_CAPABILITIES
        .iter()
        .filter(|(cap, _)| !effective.contains(*cap))
        .map(|(_, name)| *name)
        .collect()
}

/// One `name:x:id:...` line of a passwd or group file: (name, id, primary gid for passwd).
fn entries(text: &str) -> impl Iterator<Item = (&str, u32, Option<u32>)> {
    text.lines().filter_map(|line| {
        let mut f = line.split(':');
        let name = f.next()?;
        let _password = f.next()?;
        let id = f.next()?.parse().ok()?;
        let gid = f.next().and_then(|g| g.parse().ok());
        Some((name, id, gid))
    })
}

/// Resolves `[run_as]` against the passwd and group files under `etc` (`/etc` in production).
/// `worker_uid` is the Worker's own uid, which the run identity must differ from.
///
/// # Errors
/// The field and the rule.
pub fn resolve(
    run_as: &RunAs,
    etc: &Path,
    worker_uid: u32,
) -> Result<RunIdentity, (&'static str, String)> {
    let read = |name: &str| fs::read_to_string(etc.join(name)).unwrap_or_default();
    let passwd = read("passwd");
    let group = read("group");
    let gid = match &run_as.group {
        None => None,
        Some(Principal::Id(gid)) => Some(*gid),
        Some(Principal::Name(name)) => Some(
            entries(&group)
                .find(|(n, _, _)| n == name)
                .map(|(_, gid, _)| gid)
                .ok_or((
                    "run_as.group",
                    format!("no group {name:?} in {}", etc.join("group").display()),
                ))?,
        ),
    };
    if gid == Some(0) {
        return Err(("run_as.group", String::from("must not be gid 0 (root)")));
    }
    match &run_as.user {
        RunUser::User(principal) => {
            let (uid, primary) = match principal {
                Principal::Id(uid) => (
                    *uid,
                    entries(&passwd)
                        .find(|(_, u, _)| u == uid)
                        .and_then(|(_, _, g)| g),
                ),
                Principal::Name(name) => entries(&passwd)
                    .find(|(n, _, _)| n == name)
                    .map(|(_, uid, g)| (uid, g))
                    .ok_or((
                        "run_as.user",
                        format!("no user {name:?} in {}", etc.join("passwd").display()),
                    ))?,
            };
            if uid == 0 {
                return Err(("run_as.user", String::from("must not be uid 0 (root)")));
            }
            if uid == worker_uid {
                return Err((
                    "run_as.user",
                    format!("must differ from the Worker's own uid {worker_uid}"),
                ));
            }
            let gid = gid.or(primary).ok_or((
                "run_as.group",
                format!(
                    "uid {uid} has no passwd entry to take a primary group from: set run_as.group"
                ),
            ))?;
            if gid == 0 {
                return Err((
                    "run_as.group",
                    String::from("the user's primary group is gid 0 (root): set run_as.group"),
                ));
            }
            Ok(RunIdentity::Fixed { uid, gid })
        }
        RunUser::Range { first, count } => {
            let last = first.saturating_add(count - 1);
            let inside = |uid: u32| (*first..=last).contains(&uid);
            if inside(worker_uid) {
                return Err((
                    "run_as.uid_range",
                    format!("must not contain the Worker's own uid {worker_uid}"),
                ));
            }
            if let Some((name, uid, _)) = entries(&passwd).find(|(_, uid, _)| inside(*uid)) {
                return Err((
                    "run_as.uid_range",
                    format!(
                        "must not contain the uid of an existing user ({name}, uid {uid}): each \
                         Run's uid must be its alone"
                    ),
                ));
            }
            Ok(RunIdentity::Range {
                first: *first,
                count: *count,
                gid,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;

    fn etc() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::write(
            dir.path().join("passwd"),
            "root:x:0:0:root:/root:/bin/sh\nql-run:x:990:991::/nonexistent:/usr/sbin/nologin\n\
             rooty:x:995:0::/:/bin/false\nbroken line\n",
        )
        .unwrap();
        fs::write(
            dir.path().join("group"),
            "root:x:0:\nql-run:x:991:\ntasks:x:2000:\n",
        )
        .unwrap();
        dir
    }

    fn run_as(user: RunUser, group: Option<Principal>) -> RunAs {
        RunAs {
            user,
            group,
            runs_dir: PathBuf::from("/var/lib/runs"),
        }
    }

    #[test]
    fn names_and_numbers_resolve_with_the_primary_group_by_default() {
        let etc = etc();
        let name = |n: &str| Principal::Name(n.into());
        assert_eq!(
            resolve(&run_as(RunUser::User(name("ql-run")), None), etc.path(), 0),
            Ok(RunIdentity::Fixed { uid: 990, gid: 991 })
        );
        assert_eq!(
            resolve(
                &run_as(RunUser::User(Principal::Id(990)), Some(name("tasks"))),
                etc.path(),
                0
            ),
            Ok(RunIdentity::Fixed {
                uid: 990,
                gid: 2000
            })
        );
        assert_eq!(
            resolve(
                &run_as(
                    RunUser::User(Principal::Id(4242)),
                    Some(Principal::Id(4242))
                ),
                etc.path(),
                0
            ),
            Ok(RunIdentity::Fixed {
                uid: 4242,
                gid: 4242
            })
        );
        assert_eq!(
            resolve(
                &run_as(
                    RunUser::Range {
                        first: 300_000,
                        count: 10
                    },
                    None
                ),
                etc.path(),
                0
            ),
            Ok(RunIdentity::Range {
                first: 300_000,
                count: 10,
                gid: None
            })
        );
    }

    #[test]
    fn root_the_worker_itself_and_unknown_names_are_refused() {
        let etc = etc();
        let name = |n: &str| Principal::Name(n.into());
        let field = |r: RunAs, worker: u32| resolve(&r, etc.path(), worker).unwrap_err().0;
        assert_eq!(
            field(run_as(RunUser::User(name("root")), None), 1),
            "run_as.user"
        );
        assert_eq!(
            field(run_as(RunUser::User(name("nobody-here")), None), 0),
            "run_as.user"
        );
        assert_eq!(
            field(run_as(RunUser::User(name("ql-run")), None), 990),
            "run_as.user"
        );
        assert_eq!(
            field(run_as(RunUser::User(name("rooty")), None), 0),
            "run_as.group"
        );
        assert_eq!(
            field(run_as(RunUser::User(name("ql-run")), Some(name("root"))), 0),
            "run_as.group"
        );
        assert_eq!(
            field(run_as(RunUser::User(Principal::Id(4242)), None), 0),
            "run_as.group",
            "a uid without a passwd entry needs an explicit group"
        );
        assert_eq!(
            field(
                run_as(
                    RunUser::Range {
                        first: 900,
                        count: 100
                    },
                    None
                ),
                0
            ),
            "run_as.uid_range",
            "the range holds ql-run's uid"
        );
        assert_eq!(
            field(
                run_as(
                    RunUser::Range {
                        first: 1,
                        count: 10
                    },
                    None
                ),
                5
            ),
            "run_as.uid_range"
        );
    }
}
