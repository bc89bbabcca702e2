//! cgroup v2 limits per Run, in a cgroup delegated to the Worker (systemd `Delegate=yes`).
//!
//! ```text
//! <D>/                         the delegated cgroup: memory/pids/cpu in cgroup.controllers,
//!   │                          enabled by the Worker in cgroup.subtree_control
//!   ├─ worker/                 the Worker and its supervisors (systemd DelegateSubgroup=worker,
//!   │                          or the Worker moves itself there at start-up)
//!   └─ run-<offerId>/          one per Run: memory.max, memory.swap.max = 0,
//!                              memory.oom.group = 1, pids.max, cpu.max
//! ```
//!
//! Detection ([`detect`], at Worker start-up): the Worker's own cgroup `W` (the `0::` line of
//! `/proc/self/cgroup`, under the `cgroup2` mount). If `W` is named `worker`, `D` is its parent;
//! otherwise `D = W` and the Worker moves itself into `D/worker` (the kernel forbids processes in
//! a cgroup that distributes controllers to children). `D` must list every controller the
//! configured limits need, and enabling them in `D/cgroup.subtree_control` must succeed.
//!
//! Per Run (the supervisor, before it spawns): create `D/run-<offerId>` and write its limits;
//! move itself into it, spawn (the child is born inside, before it runs user code), move itself
//! back. After the user process exits: `cgroup.kill` (kernels ≥ 5.14; the subreaper stops
//! escaped descendants either way), read `memory.events` / `pids.events`, remove the cgroup.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::settings::{CgroupSettings, CpuMax};

/// Name of the leaf the Worker and its supervisors live in.
pub const WORKER_LEAF: &str = "worker";
/// Prefix of a Run's cgroup.
pub const RUN_PREFIX: &str = "run-";

/// What the supervisor needs to give a Run its cgroup.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CgroupPlan {
    /// The delegated cgroup `D`.
    pub parent: String,
    /// `memory.max`.
    pub memory_max: Option<u64>,
    /// `pids.max`.
    pub pids_max: Option<u64>,
    /// `cpu.max`.
    pub cpu_max: Option<CpuMax>,
}

/// The `0::<path>` line of a `/proc/<pid>/cgroup` text.
#[must_use]
pub fn unified_path(proc_cgroup: &str) -> Option<&str> {
    proc_cgroup
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .filter(|p| p.starts_with('/'))
}

/// The mount point of the `cgroup2` file system whose root is the hierarchy's root, from a
/// `/proc/<pid>/mountinfo` text.
#[must_use]
pub fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let fstype = right.split(' ').next()?;
        let mut fields = left.split(' ');
        let root = fields.nth(3)?;
        let point = fields.next()?;
        (fstype == "cgroup2" && root == "/").then(|| PathBuf::from(unescape(point)))
    })
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(field: &str) -> String {
    let mut out = Vec::with_capacity(field.len());
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 4 <= bytes.len() {
            let code = std::str::from_utf8(&bytes[i + 1..i + 4])
                .ok()
                .and_then(|digits| u8::from_str_radix(digits, 8).ok());
            if let Some(code) = code {
                out.push(code);
                i += 4;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Why no delegated cgroup can be used (for the start-up warning or refusal).
pub type Unavailable = String;

/// Finds and prepares the delegated cgroup (see the module docs). `proc_self` is
/// `/proc/self` in production. May move the calling process into `D/worker`.
///
/// # Errors
/// Why no delegated cgroup with the needed controllers is available.
pub fn detect(proc_self: &Path, settings: &CgroupSettings) -> Result<CgroupPlan, Unavailable> {
    let needs = settings.controllers();
    let cgroup = fs::read_to_string(proc_self.join("cgroup"))
        .map_err(|e| format!("cannot read {}: {e}", proc_self.join("cgroup").display()))?;
    let own = unified_path(&cgroup)
        .ok_or_else(|| String::from("the Worker is in no cgroup v2 hierarchy (no 0:: line)"))?;
    let mountinfo = fs::read_to_string(proc_self.join("mountinfo"))
        .map_err(|e| format!("cannot read {}: {e}", proc_self.join("mountinfo").display()))?;
    let mount = cgroup2_mount(&mountinfo)
        .ok_or_else(|| String::from("no cgroup2 file system is mounted"))?;
    let own_dir = mount.join(own.trim_start_matches('/'));
    let in_leaf = own_dir.file_name().is_some_and(|n| n == WORKER_LEAF);
    let parent = if in_leaf {
        own_dir
            .parent()
            .map_or_else(|| own_dir.clone(), Path::to_path_buf)
    } else {
        own_dir.clone()
    };
    let available = fs::read_to_string(parent.join("cgroup.controllers"))
        .map_err(|e| format!("{}: cannot read cgroup.controllers: {e}", parent.display()))?;
    let missing: Vec<&str> = needs
        .iter()
        .copied()
        .filter(|c| !available.split_ascii_whitespace().any(|a| a == *c))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "{}: cgroup.controllers lacks {} (found \"{}\"): the cgroup is not delegated with \
             these controllers (systemd: Delegate=yes)",
            parent.display(),
            missing.join(", "),
            available.trim()
        ));
    }
    if !in_leaf {
        let leaf = parent.join(WORKER_LEAF);
        match fs::create_dir(&leaf) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("{}: cannot create: {e}", leaf.display())),
        }
        write(
            &leaf.join("cgroup.procs"),
            &rustix::process::getpid().as_raw_nonzero().to_string(),
        )
        .map_err(|e| format!("{}: cannot move the Worker into it: {e}", leaf.display()))?;
    }
    let enable: Vec<String> = needs.iter().map(|c| format!("+{c}")).collect();
    write(&parent.join("cgroup.subtree_control"), &enable.join(" ")).map_err(|e| {
        format!(
            "{}: cannot enable {} in cgroup.subtree_control: {e}",
            parent.display(),
            needs.join(", ")
        )
    })?;
    let Some(parent_text) = parent.to_str() else {
        return Err(String::from("the cgroup path is not UTF-8"));
    };
    Ok(CgroupPlan {
        parent: parent_text.to_owned(),
        memory_max: settings.memory_max,
        pids_max: settings.pids_max,
        cpu_max: settings.cpu_max,
    })
}

fn write(path: &Path, text: &str) -> io::Result<()> {
    // One write(2) per value: the kernel parses each write as a whole.
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| io::Write::write_all(&mut f, text.as_bytes()))
}

/// One Run's cgroup.
#[derive(Debug)]
pub struct RunCgroup {
    path: PathBuf,
}

/// What the kernel counted for a Run's cgroup.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Events {
    /// `memory.events` `oom_kill`: processes killed for `memory.max`.
    pub oom_kills: u64,
    /// `pids.events` `max`: forks refused for `pids.max`.
    pub pids_max_hits: u64,
}

/// The value of `key` in a flat-keyed cgroup file (`key value` lines).
#[must_use]
pub fn flat_value(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

impl RunCgroup {
    /// Creates `D/run-<name>` and writes its limits.
    ///
    /// # Errors
    /// Any failure (the cgroup is removed again; the caller refuses the launch).
    pub fn create(plan: &CgroupPlan, name: &str) -> io::Result<Self> {
        let path = Path::new(&plan.parent).join(format!("{RUN_PREFIX}{name}"));
        fs::create_dir(&path)?;
        let cgroup = Self { path };
        if let Err(e) = cgroup.limit(plan) {
            let _ = fs::remove_dir(&cgroup.path);
            return Err(e);
        }
        Ok(cgroup)
    }

    fn limit(&self, plan: &CgroupPlan) -> io::Result<()> {
        if let Some(max) = plan.memory_max {
            write(&self.path.join("memory.max"), &max.to_string())?;
            // Without swap the limit is a limit; one OOM kill ends the whole Run.
            let swap = self.path.join("memory.swap.max");
            if swap.exists() {
                write(&swap, "0")?;
            }
            write(&self.path.join("memory.oom.group"), "1")?;
        }
        if let Some(max) = plan.pids_max {
            write(&self.path.join("pids.max"), &max.to_string())?;
        }
        if let Some(cpu) = plan.cpu_max {
            write(&self.path.join("cpu.max"), &cpu.to_file())?;
        }
        Ok(())
    }

    /// The cgroup's directory.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves the Run's held process `pid` (the supervisor's child, not yet executing the user
    /// command) into the Run's cgroup.
    ///
    /// # Errors
    /// The move fails.
    pub fn admit(&self, pid: rustix::process::Pid) -> io::Result<()> {
        write(
            &self.path.join("cgroup.procs"),
            &pid.as_raw_nonzero().to_string(),
        )
    }

    /// Kills every process in the cgroup (`cgroup.kill`, where the kernel has it). Returns
    /// whether the file existed.
    pub fn kill(&self) -> bool {
        let file = self.path.join("cgroup.kill");
        file.exists() && write(&file, "1").is_ok()
    }

    /// The kernel's counters.
    #[must_use]
    pub fn events(&self) -> Events {
        let read = |name: &str, key: &str| {
            fs::read_to_string(self.path.join(name))
                .ok()
                .and_then(|t| flat_value(&t, key))
                .unwrap_or(0)
        };
        Events {
            oom_kills: read("memory.events", "oom_kill"),
            pids_max_hits: read("pids.events", "max"),
        }
    }

    /// Removes the cgroup once it is empty, retrying until `deadline`.
    ///
    /// # Errors
    /// The last `rmdir` error (`EBUSY`: something is still inside).
    pub fn remove(self, deadline: Instant) -> io::Result<()> {
        loop {
            match fs::remove_dir(&self.path) {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => thread::sleep(Duration::from_millis(10)),
            }
        }
    }
}

/// Removes the empty Run cgroups under `parent` that `keep` does not claim (left by a killed
/// supervisor). Returns how many were removed.
pub fn sweep(parent: &Path, keep: impl Fn(&str) -> bool) -> usize {
    let Ok(entries) = fs::read_dir(parent) else {
        return 0;
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_str()?.strip_prefix(RUN_PREFIX)?.to_owned();
            (!keep(&name) && fs::remove_dir(e.path()).is_ok()).then_some(())
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn proc_files_are_read_as_the_kernel_writes_them() {
        assert_eq!(
            unified_path("4:memory:/x\n0::/system.slice/ql-worker.service/worker\n"),
            Some("/system.slice/ql-worker.service/worker")
        );
        assert_eq!(unified_path("4:memory:/x\n"), None);
        assert_eq!(
            cgroup2_mount(MOUNTINFO),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(cgroup2_mount(&MOUNTINFO.replace("cgroup2", "cgroup")), None);
        assert_eq!(
            cgroup2_mount("1 2 0:3 / /a\\040b rw - cgroup2 cgroup2 rw\n"),
            Some(PathBuf::from("/a b"))
        );
        assert_eq!(
            cgroup2_mount("1 2 0:3 /sub /mnt rw - cgroup2 cgroup2 rw\n"),
            None,
            "a bind of a subtree is not the hierarchy's root"
        );
        let events = "low 0\nhigh 0\nmax 12\noom 3\noom_kill 2\noom_group_kill 1\n";
        assert_eq!(flat_value(events, "oom_kill"), Some(2));
        assert_eq!(flat_value(events, "max"), Some(12));
        assert_eq!(flat_value(events, "absent"), None);
    }

    /// A fabricated `/proc/self` and cgroup tree (plain files): the detection's paths and
    /// writes, not the kernel's semantics (those are in `drivers/tests/containment_cgroup.rs`).
    fn world(own: &str, controllers: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let mount = dir.path().join("cg");
        let proc_self = dir.path().join("proc");
        fs::create_dir_all(&proc_self).unwrap();
        let own_dir = mount.join(own.trim_start_matches('/'));
        fs::create_dir_all(&own_dir).unwrap();
        let delegated = if own_dir.ends_with(WORKER_LEAF) {
            own_dir.parent().unwrap().to_path_buf()
        } else {
            own_dir
        };
        fs::write(delegated.join("cgroup.controllers"), controllers).unwrap();
        fs::write(delegated.join("cgroup.subtree_control"), "").unwrap();
        fs::write(proc_self.join("cgroup"), format!("0::{own}\n")).unwrap();
        fs::write(
            proc_self.join("mountinfo"),
            format!("41 31 0:38 / {} rw - cgroup2 cgroup2 rw\n", mount.display()),
        )
        .unwrap();
        (dir, proc_self, delegated)
    }

    fn pids(max: u64) -> CgroupSettings {
        CgroupSettings {
            pids_max: Some(max),
            ..CgroupSettings::default()
        }
    }

    #[test]
    fn detection_uses_the_parent_of_a_worker_leaf_and_enables_the_needed_controllers() {
        let (_dir, proc_self, delegated) = world("/svc/worker", "cpu memory pids");
        let plan = detect(&proc_self, &pids(64)).unwrap();
        assert_eq!(Path::new(&plan.parent), delegated);
        assert_eq!(
            fs::read_to_string(delegated.join("cgroup.subtree_control")).unwrap(),
            "+pids"
        );
        assert_eq!(plan.pids_max, Some(64));
    }

    #[test]
    fn detection_moves_the_worker_into_a_leaf_of_its_own_cgroup() {
        let (_dir, proc_self, delegated) = world("/svc", "memory pids");
        // The kernel creates a new cgroup's interface files; the fabricated tree needs this one.
        fs::create_dir(delegated.join("worker")).unwrap();
        fs::write(delegated.join("worker/cgroup.procs"), "").unwrap();
        detect(&proc_self, &pids(64)).unwrap();
        let procs = fs::read_to_string(delegated.join("worker/cgroup.procs")).unwrap();
        assert_eq!(procs, std::process::id().to_string());
    }

    #[test]
    fn detection_names_the_missing_controller() {
        let (_dir, proc_self, _) = world("/svc/worker", "hugetlb");
        let err = detect(&proc_self, &pids(64)).unwrap_err();
        assert!(
            err.contains("lacks pids") && err.contains("Delegate=yes"),
            "{err}"
        );
        fs::write(proc_self.join("cgroup"), "4:memory:/x\n").unwrap();
        let err = detect(&proc_self, &pids(64)).unwrap_err();
        assert!(err.contains("no 0:: line"), "{err}");
    }
}
