//! `/proc` readings: memory counters, parents, command lines.

use std::path::Path;

/// A `/proc/<pid>/status` field in KiB (`VmRSS:`, `VmHWM:`), if the process still exists.
pub(crate) fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// The parent pid of `pid` (field 4 of `/proc/<pid>/stat`, after the parenthesised name).
pub(crate) fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    rest.split_whitespace().nth(1)?.parse().ok()
}

/// `argv` of `pid`.
pub(crate) fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|bytes| {
            bytes
                .split(|b| *b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Every live pid whose parent is `parent`.
pub(crate) fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out: Vec<u32> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
        .filter(|pid| parent_of(*pid) == Some(parent))
        .collect();
    out.sort_unstable();
    out
}

/// The supervisors (`ql-worker __supervise`) that are children of the Worker `worker`.
pub(crate) fn supervisors_of(worker: u32) -> Vec<u32> {
    children_of(worker)
        .into_iter()
        .filter(|pid| cmdline(*pid).iter().any(|a| a == "__supervise"))
        .collect()
}

/// Whether `pid` runs the executable at `exe`.
pub(crate) fn runs_exe(pid: u32, exe: &Path) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| p == exe)
}

/// Every live pid running the executable at `exe` (the bench's private copy of the binary, so
/// only processes this benchmark started match).
pub(crate) fn running_exe(exe: &Path) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
        .filter(|pid| runs_exe(*pid, exe))
        .collect()
}

/// Proportional set size in KiB (`/proc/<pid>/smaps_rollup`): resident pages, each shared page
/// divided among the processes that map it, so a sum over processes counts the image once.
pub(crate) fn pss_kib(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}
