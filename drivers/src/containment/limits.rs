//! What the held process sets on itself right before it executes the user command (no
//! `pre_exec`, no `unsafe`: it is still our own image then): no new privileges, no inheritable
//! or ambient capabilities, and the resource limits (soft = hard, so the user cannot raise them).
//! The supervisor's own limits are never touched.

use std::io;

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
use rustix::thread::{CapabilitySet, capabilities, set_capabilities};

use super::settings::RlimitKind;

fn resource(kind: RlimitKind) -> Resource {
    match kind {
        RlimitKind::Nofile => Resource::Nofile,
        RlimitKind::Nproc => Resource::Nproc,
        RlimitKind::Core => Resource::Core,
        RlimitKind::Fsize => Resource::Fsize,
        RlimitKind::AddressSpace => Resource::As,
    }
}

/// Sets each limit as soft and hard limit, never above the hard limit already in force (a
/// limit can only be lowered without `CAP_SYS_RESOURCE`).
///
/// # Errors
/// A failed `setrlimit` (the process then never executes the user command).
pub fn apply(limits: &[(RlimitKind, u64)]) -> io::Result<()> {
    for &(kind, value) in limits {
        let resource = resource(kind);
        setrlimit(resource, lowered(&getrlimit(resource), value))?;
    }
    Ok(())
}

/// `value` as soft and hard limit, never above the hard limit in force.
fn lowered(before: &Rlimit, value: u64) -> Rlimit {
    let value = before.maximum.map_or(value, |max| max.min(value));
    Rlimit {
        current: Some(value),
        maximum: Some(value),
    }
}

/// `PR_SET_NO_NEW_PRIVS`: neither the held process nor anything it executes can gain privileges
/// through `execve` (setuid/setgid bits and file capabilities are ignored). Irreversible.
///
/// # Errors
/// The failed `prctl`.
pub fn no_new_privileges() -> io::Result<()> {
    rustix::thread::set_no_new_privs(true).map_err(Into::into)
}

/// Empties the calling process's inheritable and ambient capability sets, keeping its effective and
/// permitted ones. A Worker that holds its capabilities as ambient ones (systemd
/// `AmbientCapabilities=`) would otherwise pass them on through `execve` to a user command
/// whose uid changed between two non-root uids.
///
/// # Errors
/// The failed `capget`/`capset`/`prctl`.
pub fn drop_inheritable_capabilities() -> io::Result<()> {
    rustix::thread::clear_ambient_capability_set()?;
    let mut sets = capabilities(None)?;
    if !sets.inheritable.is_empty() {
        sets.inheritable = CapabilitySet::empty();
        set_capabilities(None, sets)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_limit_is_soft_and_hard_and_never_above_the_hard_limit_in_force() {
        let unlimited = Rlimit {
            current: Some(10),
            maximum: None,
        };
        let capped = Rlimit {
            current: Some(10),
            maximum: Some(100),
        };
        let both = |v| Rlimit {
            current: Some(v),
            maximum: Some(v),
        };
        assert_eq!(lowered(&unlimited, 1 << 40), both(1 << 40));
        assert_eq!(lowered(&capped, 1 << 40), both(100));
        assert_eq!(lowered(&capped, 0), both(0));
    }
}
