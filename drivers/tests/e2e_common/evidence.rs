//! Evidence helpers of the crash campaign and the secret scan (issue 10, items 2 and 4):
//!
//! - [`snapshot_processes`]: the Worker, its supervisors (`ql-worker __supervise`, found by
//!   executable and argv even after the Worker that started them was killed) and every
//!   descendant of a supervisor (the user's processes), with their `cmdline` and `environ`;
//! - [`harvest_receipts`]: the receipts present right now, with the capability they hold
//!   (base64url) — the only place a black-box test can learn a capability from;
//! - [`Needles`] and [`scan_tree`]: a one-pass multi-needle search over every regular file
//!   under a directory (every Secret value and capability at once, in linear time);
//! - [`run_cli`]: `ql-worker <args>` as a child, for the operator's `recover` commands.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine as _;
use ql_worker_core::ids::AttemptId;

/// What a process is to the Worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// `ql-worker run`.
    Worker,
    /// `ql-worker __supervise`.
    Supervisor,
    /// A descendant of a supervisor: the user command (and whatever it forked).
    User,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Worker => "worker",
            Self::Supervisor => "supervisor",
            Self::User => "user",
        }
    }
}

/// One process as seen under `/proc` at one moment.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ProcSnapshot {
    pub role: Role,
    pub pid: u32,
    /// NUL-separated argv.
    pub cmdline: Vec<u8>,
    /// NUL-separated `NAME=value` entries.
    pub environ: Vec<u8>,
}

impl ProcSnapshot {
    /// The value of environment variable `name`, if set.
    pub fn env(&self, name: &str) -> Option<&[u8]> {
        let prefix = format!("{name}=");
        self.environ
            .split(|b| *b == 0)
            .find_map(|entry| entry.strip_prefix(prefix.as_bytes()))
    }
}

struct ProcEntry {
    pid: u32,
    ppid: u32,
    cmdline: Vec<u8>,
}

fn ppid_of(stat: &str) -> Option<u32> {
    // `pid (comm) state ppid …`; comm may contain anything, so split after the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(1)?.parse().ok()
}

fn list_processes() -> Vec<ProcEntry> {
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        let Some(ppid) = ppid_of(&stat) else {
            continue;
        };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        out.push(ProcEntry { pid, ppid, cmdline });
    }
    out
}

fn is_supervisor(entry: &ProcEntry, binary: &Path) -> bool {
    let mut args = entry.cmdline.split(|b| *b == 0);
    let _argv0 = args.next();
    if args.next() != Some(ql_worker::supervisor::SUPERVISE_ARG.as_bytes()) {
        return false;
    }
    // Ours, not another checkout's: the executable is this build's binary (a rebuilt file
    // reads as "<path> (deleted)").
    std::fs::read_link(format!("/proc/{}/exe", entry.pid)).is_ok_and(|exe| {
        exe.as_os_str()
            .as_encoded_bytes()
            .starts_with(binary.as_os_str().as_encoded_bytes())
    })
}

/// The Worker `worker` (if given), every supervisor executed from `binary`, and every
/// descendant of those supervisors, with their argv and environment. A process that exits
/// while being read is skipped; nothing here fails.
pub fn snapshot_processes(worker: Option<u32>, binary: &Path) -> Vec<ProcSnapshot> {
    let all = list_processes();
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for e in &all {
        children.entry(e.ppid).or_default().push(e.pid);
    }
    let mut roles: BTreeMap<u32, Role> = BTreeMap::new();
    if let Some(pid) = worker {
        roles.insert(pid, Role::Worker);
    }
    let supervisors: Vec<u32> = all
        .iter()
        .filter(|e| is_supervisor(e, binary))
        .map(|e| e.pid)
        .collect();
    let mut stack = Vec::new();
    for pid in &supervisors {
        roles.insert(*pid, Role::Supervisor);
        stack.extend(children.get(pid).into_iter().flatten().copied());
    }
    while let Some(pid) = stack.pop() {
        if roles.insert(pid, Role::User).is_none() {
            stack.extend(children.get(&pid).into_iter().flatten().copied());
        }
    }
    let cmdlines: HashMap<u32, &Vec<u8>> = all.iter().map(|e| (e.pid, &e.cmdline)).collect();
    let mut out = Vec::new();
    for (pid, role) in roles {
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let cmdline = match cmdlines.get(&pid) {
            Some(c) => (*c).clone(),
            None => std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default(),
        };
        out.push(ProcSnapshot {
            role,
            pid,
            cmdline,
            environ,
        });
    }
    out
}

/// Every receipt present under `root` right now: attempt id and the capability it holds
/// (base64url text), read with the Worker's own checked reader. Receipts that vanish or are
/// half-written while being read are skipped (the next call sees them or they are gone).
pub fn harvest_receipts(root: &Path) -> Vec<(AttemptId, String)> {
    let mut out = Vec::new();
    let Ok(shards) = std::fs::read_dir(root.join(ql_worker::layout::RECEIPTS_DIR)) else {
        return out;
    };
    for shard in shards.flatten() {
        let Ok(files) = std::fs::read_dir(shard.path()) else {
            continue;
        };
        for file in files.flatten() {
            let name = file.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with('.') {
                continue;
            }
            let Some(attempt) = name
                .strip_suffix(ql_worker::layout::RECEIPT_SUFFIX)
                .and_then(|a| AttemptId::new(a).ok())
            else {
                continue;
            };
            if let Ok(Some(receipt)) = ql_worker::receipts::read(root, &attempt) {
                out.push((attempt, receipt.token.expose().to_owned()));
            }
        }
    }
    out
}

/// The 32 raw capability bytes behind a receipt's base64url text.
pub fn capability_bytes(token: &str) -> Vec<u8> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .expect("a receipt token is canonical base64url")
}

/// A set of byte strings (each ≥ 8 bytes) searched for in one pass: every position's first 8
/// bytes are looked up in a hash index, candidates compared in full.
#[derive(Clone, Debug, Default)]
pub struct Needles {
    items: Vec<(String, Vec<u8>)>,
    index: HashMap<[u8; 8], Vec<usize>>,
}

impl Needles {
    pub fn add(&mut self, label: impl Into<String>, bytes: &[u8]) {
        assert!(bytes.len() >= 8, "needles are at least 8 bytes");
        let mut key = [0u8; 8];
        key.copy_from_slice(&bytes[..8]);
        self.index.entry(key).or_default().push(self.items.len());
        self.items.push((label.into(), bytes.to_vec()));
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    pub fn label(&self, i: usize) -> &str {
        &self.items[i].0
    }

    /// Indices of the needles found in `hay`.
    pub fn find(&self, hay: &[u8]) -> BTreeSet<usize> {
        let mut found = BTreeSet::new();
        if hay.len() < 8 {
            return found;
        }
        for at in 0..=hay.len() - 8 {
            let mut key = [0u8; 8];
            key.copy_from_slice(&hay[at..at + 8]);
            if let Some(candidates) = self.index.get(&key) {
                for &i in candidates {
                    if hay[at..].starts_with(&self.items[i].1) {
                        found.insert(i);
                    }
                }
            }
        }
        found
    }
}

/// What [`scan_tree`] looked at and found.
#[derive(Debug, Default)]
pub struct TreeScan {
    pub files: usize,
    pub bytes: u64,
    /// (file, needle index)
    pub hits: Vec<(PathBuf, usize)>,
}

/// Every regular file under `dir` (symlinks are not followed), searched for every needle.
pub fn scan_tree(dir: &Path, needles: &Needles) -> TreeScan {
    let mut scan = TreeScan::default();
    super::each_file(dir, |path, bytes| {
        scan.files += 1;
        scan.bytes += bytes.len() as u64;
        for i in needles.find(bytes) {
            scan.hits.push((path.to_path_buf(), i));
        }
    });
    scan
}

/// `ql-worker <args>`: exit code and stdout.
pub fn run_cli(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(super::worker_bin())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run ql-worker");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}
