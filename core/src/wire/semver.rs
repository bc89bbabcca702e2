//! A conservative subset of node-semver's grammar (the reference validates placement ranges
//! with `semver.validRange` and capability versions with `semver.valid`).
//!
//! Everything accepted here is also accepted by node-semver (non-loose); some spellings that
//! node-semver tolerates (a `v` or `=` prefix on versions, whitespace after an operator, `~>`,
//! empty `||` alternatives, numbers above 999,999,999) are refused. A refused range makes the
//! Worker refuse the revision, which fails closed. See `docs/wire.md`.

/// Largest numeric identifier accepted (node-semver overflows near `2^53`; we stop far below).
const MAX_NUMBER_DIGITS: usize = 9;

fn numeric(part: &str) -> bool {
    let b = part.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_NUMBER_DIGITS
        && b.iter().all(u8::is_ascii_digit)
        && (b.len() == 1 || b[0] != b'0')
}

fn prerelease_id(part: &str) -> bool {
    if numeric(part) {
        return true;
    }
    let b = part.as_bytes();
    !b.is_empty()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        && b.iter().any(|c| c.is_ascii_alphabetic() || *c == b'-')
}

fn build_id(part: &str) -> bool {
    !part.is_empty() && part.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-')
}

/// `MAJOR.MINOR.PATCH[-pre][+build]`, all three numeric.
fn full_version(text: &str) -> bool {
    let (core_and_pre, build) = match text.split_once('+') {
        Some((head, build)) => (head, Some(build)),
        None => (text, None),
    };
    let (core, pre) = match core_and_pre.split_once('-') {
        Some((head, pre)) => (head, Some(pre)),
        None => (core_and_pre, None),
    };
    let mut parts = core.split('.');
    let ok_core = (0..3).all(|_| parts.next().is_some_and(numeric)) && parts.next().is_none();
    ok_core
        && pre.is_none_or(|p| p.split('.').all(prerelease_id))
        && build.is_none_or(|b| b.split('.').all(build_id))
}

/// A strict SemVer 2.0.0 version (node-semver `valid` accepts it unchanged).
#[must_use]
pub(crate) fn is_version(text: &str) -> bool {
    (1..=64).contains(&text.len()) && full_version(text)
}

fn wildcard(part: &str) -> bool {
    matches!(part, "x" | "X" | "*")
}

/// `N`, `N.N`, `N.N.N[-pre][+build]`, with `x`/`X`/`*` wildcards in place of numbers.
fn partial(text: &str) -> bool {
    if full_version(text) {
        return true;
    }
    let parts: alloc::vec::Vec<&str> = text.split('.').collect();
    (1..=3).contains(&parts.len()) && parts.iter().all(|p| numeric(p) || wildcard(p))
}

fn simple(token: &str) -> bool {
    let rest = ["<=", ">=", "<", ">", "=", "~", "^"]
        .iter()
        .find_map(|op| token.strip_prefix(op))
        .unwrap_or(token);
    partial(rest)
}

fn comparator_set(set: &str) -> bool {
    let tokens: alloc::vec::Vec<&str> = set.split(' ').collect();
    if tokens.len() == 3 && tokens[1] == "-" {
        return partial(tokens[0]) && partial(tokens[2]);
    }
    tokens.iter().all(|t| simple(t))
}

/// A range in the supported subset of node-semver `validRange`.
#[must_use]
pub(crate) fn is_range(text: &str) -> bool {
    (1..=128).contains(&text.len()) && text.split(" || ").all(comparator_set)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges() {
        for ok in [
            ">=1.0.0 <2.0.0",
            "^1.2.3",
            "~1.0",
            "1.x",
            "*",
            "1.0.0 - 2.0.0",
            ">=1.0.0-alpha.1 || ^2.0.0",
            "=1.0.0",
            "<=3.4.5+build.7",
            ">1",
        ] {
            assert!(is_range(ok), "{ok}");
        }
        for bad in [
            "", " 1", "v1.0.0", ">= 1", "1.0.0 ||", "01.0.0", "1.2.3.4", "~>1", "a",
        ] {
            assert!(!is_range(bad), "{bad}");
        }
        assert!(is_version("1.0.0-rc.1+b.2") && !is_version("1.0") && !is_version("1.0.0-01"));
    }
}
