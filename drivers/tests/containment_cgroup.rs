//! cgroup v2 containment against the real kernel.
//!
//! A delegated cgroup needs the controllers bound to the cgroup2 hierarchy. On a cgroup v1/v2
//! hybrid host (such as the one CI runs on) `pids` and `cpu` sit on v1 hierarchies; a v1
//! hierarchy without child cgroups can be unmounted, which releases its controller to cgroup2.
//! The [`Lab`] does exactly that (as root, under a host-wide lock), makes a test cgroup `D`
//! under the cgroup2 root with the controller enabled, and undoes everything when dropped:
//! kills and removes its cgroups, disables the controllers again and re-mounts the v1
//! hierarchies with their original options. Where a controller cannot be had (not root, a v1
//! hierarchy in use, `memory` bound to a busy v1 hierarchy), the test that needs it says
//! `SKIPPED` with the reason on stderr.

mod supervisor_common;

use std::fs;
use std::io::Read as _;
use std::os::fd::AsFd as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use ql_worker::containment::CgroupPlan;
use ql_worker::containment::cgroup::{cgroup2_mount, unified_path};
use ql_worker::supervisor::{Executor as _, ExecutorOutcome};
use supervisor_common::{Fixture, in_clean_process, sh, wait_for, worker_bin};

/// A v1 hierarchy the lab unmounted, to re-mount when done.
struct Unbound {
    point: PathBuf,
    options: String,
}

/// A test cgroup `D` with the controllers the lab could bind to cgroup2.
struct Lab {
    mount: PathBuf,
    parent: PathBuf,
    controllers: Vec<&'static str>,
    unbound: Vec<Unbound>,
    _lock: fs::File,
}

fn write(path: &Path, text: &str) -> std::io::Result<()> {
    fs::OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, text.as_bytes()))
}

fn root_controllers(mount: &Path) -> String {
    fs::read_to_string(mount.join("cgroup.controllers")).unwrap_or_default()
}

impl Lab {
    /// Sets up `D` with as many of `wanted` as can be had; `Err` says why none could.
    fn new(wanted: &[&'static str]) -> Result<Self, String> {
        if !rustix::process::geteuid().is_root() {
            return Err(String::from("needs root"));
        }
        let lock = fs::File::create("/run/ql-worker-cgroup-lab.lock").map_err(|e| e.to_string())?;
        rustix::fs::flock(lock.as_fd(), rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| e.to_string())?;
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").map_err(|e| e.to_string())?;
        let mount = cgroup2_mount(&mountinfo).ok_or("no cgroup2 mount")?;
        let mut unbound = Vec::new();
        for controller in wanted {
            if root_controllers(&mount)
                .split_whitespace()
                .any(|c| c == *controller)
            {
                continue;
            }
            // A v1 mount of exactly this controller, without child cgroups.
            let v1 = mountinfo.lines().find_map(|line| {
                let (left, right) = line.split_once(" - ")?;
                let mut r = right.split(' ');
                let (fstype, _source, opts) = (r.next()?, r.next()?, r.next()?);
                let point = left.split(' ').nth(4)?;
                (fstype == "cgroup" && opts.split(',').any(|o| o == *controller))
                    .then(|| (PathBuf::from(point), opts.to_owned()))
            });
            let Some((point, options)) = v1 else { continue };
            let busy = fs::read_dir(&point)
                .map(|d| d.flatten().any(|e| e.path().is_dir()))
                .unwrap_or(true);
            if busy {
                continue;
            }
            let status = Command::new("umount").arg(&point).status();
            if !status.is_ok_and(|s| s.success()) {
                continue;
            }
            unbound.push(Unbound { point, options });
            let bound = wait_for(Duration::from_secs(5), || {
                root_controllers(&mount)
                    .split_whitespace()
                    .any(|c| c == *controller)
                    .then_some(())
            });
            if bound.is_none() {
                eprintln!("{controller}: unmounted its v1 hierarchy but cgroup2 does not list it");
            }
        }
        let available = root_controllers(&mount);
        let controllers: Vec<&'static str> = wanted
            .iter()
            .copied()
            .filter(|c| available.split_whitespace().any(|a| a == *c))
            .collect();
        let mut lab = Self {
            parent: mount.join(format!("ql-worker-test-{}", std::process::id())),
            mount,
            controllers,
            unbound,
            _lock: lock,
        };
        if lab.controllers.is_empty() {
            return Err(format!(
                "none of {wanted:?} can be bound to cgroup2 here (root controllers: \"{}\")",
                available.trim()
            ));
        }
        let enable: Vec<String> = lab.controllers.iter().map(|c| format!("+{c}")).collect();
        write(&lab.mount.join("cgroup.subtree_control"), &enable.join(" "))
            .map_err(|e| format!("enable {enable:?} at the cgroup2 root: {e}"))?;
        fs::create_dir(&lab.parent).map_err(|e| e.to_string())?;
        lab.controllers.sort_unstable();
        Ok(lab)
    }

    /// What the Worker's detection does in `D` once no process is left in it: enable the
    /// controllers for its children.
    fn enable_children(&self) {
        let enable: Vec<String> = self.controllers.iter().map(|c| format!("+{c}")).collect();
        write(
            &self.parent.join("cgroup.subtree_control"),
            &enable.join(" "),
        )
        .unwrap();
    }

    fn has(&self, controller: &str) -> bool {
        self.controllers.contains(&controller)
    }

    fn plan(&self) -> CgroupPlan {
        CgroupPlan {
            parent: self.parent.to_str().unwrap().to_owned(),
            memory_max: None,
            pids_max: None,
            cpu_max: None,
        }
    }
}

fn remove_tree(dir: &Path) {
    if let Ok(entries) = fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.path().is_dir() {
                remove_tree(&entry.path());
            }
        }
    }
    let _ = write(&dir.join("cgroup.kill"), "1");
    for _ in 0..200 {
        if fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        remove_tree(&self.parent);
        let disable: Vec<String> = self.controllers.iter().map(|c| format!("-{c}")).collect();
        let _ = write(
            &self.mount.join("cgroup.subtree_control"),
            &disable.join(" "),
        );
        for v1 in self.unbound.drain(..) {
            // The kernel releases a controller from cgroup2 asynchronously: retry (bounded).
            let ok = wait_for(Duration::from_secs(10), || {
                Command::new("mount")
                    .args(["-t", "cgroup", "-o"])
                    .arg(&v1.options)
                    .arg("cgroup")
                    .arg(&v1.point)
                    .stderr(std::process::Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
                    .then_some(())
            })
            .is_some();
            if !ok {
                eprintln!(
                    "!! could not re-mount {} ({}): run `mount -t cgroup -o {} cgroup {}`",
                    v1.point.display(),
                    v1.options,
                    v1.options,
                    v1.point.display()
                );
            }
        }
    }
}

fn lab_or_skip(wanted: &[&'static str]) -> Option<Lab> {
    match Lab::new(wanted) {
        Ok(lab) => Some(lab),
        Err(why) => {
            eprintln!("SKIPPED: {why}");
            None
        }
    }
}

fn read_to_string(file: &mut fs::File) -> String {
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    text
}

#[test]
fn a_fork_bomb_is_contained_by_pids_max_reported_and_its_cgroup_removed() {
    in_clean_process(
        "a_fork_bomb_is_contained_by_pids_max_reported_and_its_cgroup_removed",
        || {
            let Some(lab) = lab_or_skip(&["pids", "cpu"]) else {
                return;
            };
            assert!(lab.has("pids"), "pids is what this test needs");
            lab.enable_children();
            let fx = Fixture::new(1);
            let plan = ql_worker::containment::ContainmentPlan {
                cgroup: Some(CgroupPlan {
                    pids_max: Some(16),
                    cpu_max: lab
                        .has("cpu")
                        .then(|| ql_worker::containment::settings::CpuMax::parse("50000 100000"))
                        .flatten(),
                    ..lab.plan()
                }),
                ..Default::default()
            };
            let diag_path = fx.scratch("supervisor.stderr");
            let diag = fs::File::create(&diag_path).unwrap();
            let run_cgroup = lab.parent.join(format!("run-{}", fx.record.offer.offer_id));
            // Bounded even without containment (2^9 processes), so a failure cannot hurt the host.
            let bomb = format!(
                "cat /proc/self/cgroup; cat {}$(sed -n 's/^0:://p' /proc/self/cgroup)/cpu.max 2>/dev/null; \
                 setsid sleep 100 & echo escaped $!; \
                 b() {{ if [ $1 -gt 0 ]; then b $(($1-1)) & b $(($1-1)) & wait; else sleep 2; fi; }}; (b 8); \
                 echo bomb over",
                lab.mount.display()
            );
            let outcome = fx
                .executor()
                .with_containment(plan)
                .with_supervisor_stderr(diag)
                .start(fx.launch(sh(&bomb), vec![]));
            assert!(
                matches!(outcome, ExecutorOutcome::Started { .. }),
                "{outcome:?}"
            );
            let mut most = 0u64;
            let receipt = wait_for(Duration::from_secs(60), || {
                let current = fs::read_to_string(run_cgroup.join("pids.current"))
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
                    .unwrap_or(0);
                most = most.max(current);
                fx.receipt()
            })
            .expect("receipt");
            let log = String::from_utf8_lossy(&fx.log()).into_owned();
            assert!(
                log.contains(&format!(
                    "\n0::/{}/run-{}\n",
                    lab.parent.file_name().unwrap().to_str().unwrap(),
                    fx.record.offer.offer_id
                )) || log.starts_with(&format!(
                    "0::/{}/run-{}\n",
                    lab.parent.file_name().unwrap().to_str().unwrap(),
                    fx.record.offer.offer_id
                )),
                "the user command runs in the Run's cgroup, born there: {log}"
            );
            if lab.has("cpu") {
                assert!(log.contains("50000 100000\n"), "cpu.max written: {log}");
            }
            // Sampled: an upper bound only (that the limit was hit, the refused forks show).
            assert!(most <= 16, "pids.current peaked at {most}");
            assert!(
                log.contains("Cannot fork") || log.contains("Resource temporarily unavailable"),
                "{log}"
            );
            assert_eq!(receipt.exit_code, 0, "{log}");
            assert!(
                log.contains("bomb over\n"),
                "the Run's own shell reached its end: {log}"
            );
            let escaped: u32 = log
                .lines()
                .find_map(|l| l.strip_prefix("escaped "))
                .and_then(|p| p.parse().ok())
                .expect("the escapee's pid");
            assert!(
                !supervisor_common::alive(escaped),
                "an escaped descendant is stopped"
            );
            assert!(!run_cgroup.exists(), "the Run's cgroup is removed");
            let diag = read_to_string(&mut fs::File::open(&diag_path).unwrap());
            assert!(
                diag.contains("pids.max reached:") && diag.contains("fork(s) refused"),
                "the supervisor logs it: {diag:?}"
            );
        },
    );
}

#[test]
fn a_memory_hog_is_oom_killed_under_memory_max_reported_as_its_signal_and_logged() {
    in_clean_process(
        "a_memory_hog_is_oom_killed_under_memory_max_reported_as_its_signal_and_logged",
        || {
            // On a v1/v2 hybrid whose memory hierarchy is in use (CI's), this cannot run.
            let Some(lab) = lab_or_skip(&["memory"]) else {
                return;
            };
            lab.enable_children();
            let fx = Fixture::new(1);
            let plan = ql_worker::containment::ContainmentPlan {
                cgroup: Some(CgroupPlan {
                    memory_max: Some(64 << 20),
                    ..lab.plan()
                }),
                ..Default::default()
            };
            let diag_path = fx.scratch("supervisor.stderr");
            let diag = fs::File::create(&diag_path).unwrap();
            let hog = supervisor_common::argv(
                "/bin/dd",
                &["if=/dev/zero", "of=/dev/null", "bs=512M", "count=1"],
            );
            let outcome = fx
                .executor()
                .with_containment(plan)
                .with_supervisor_stderr(diag)
                .start(fx.launch(hog, vec![]));
            assert!(
                matches!(outcome, ExecutorOutcome::Started { .. }),
                "{outcome:?}"
            );
            let receipt = fx.wait_receipt();
            assert_eq!(receipt.exit_code, 128 + 9, "OOM-killed: SIGKILL");
            let diag = read_to_string(&mut fs::File::open(&diag_path).unwrap());
            assert!(diag.contains("memory.max reached"), "{diag:?}");
            assert!(
                !lab.parent
                    .join(format!("run-{}", fx.record.offer.offer_id))
                    .exists()
            );
        },
    );
}

fn init(config: &Path) -> std::process::Output {
    Command::new(worker_bin())
        .args(["init", "--config"])
        .arg(config)
        .output()
        .unwrap()
}

fn init_config(dir: &Path, cgroup: &str) -> PathBuf {
    let config = dir.join("ql-worker.toml");
    fs::write(
        &config,
        format!(
            "profile = \"edge\"\nworker_id = \"edge-1\"\nroot = \"{}\"\n[control_plane]\n\
             origin = \"https://127.0.0.1:1\"\ntrust_anchors = [\"/etc/ca.pem\"]\n\
             client_certificate = \"/etc/c.pem\"\nclient_key = \"/etc/c.key\"\n\
             credential_file = \"/etc/cred\"\n[cgroup]\n{cgroup}",
            dir.join("state").display()
        ),
    )
    .unwrap();
    config
}

#[test]
fn the_worker_detects_a_delegated_cgroup_moves_itself_into_a_leaf_and_enables_controllers() {
    let Some(lab) = lab_or_skip(&["pids"]) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = init_config(dir.path(), "required = true\npids_max = 32\n");
    // Start the real binary inside D, as systemd would start it in a Delegate=yes unit.
    let out = Command::new("/bin/sh")
        .arg("-c")
        .arg(format!(
            "echo $$ > {}/cgroup.procs && exec {} init --config {}",
            lab.parent.display(),
            worker_bin().display(),
            config.display()
        ))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("delegated cgroup: {}", lab.parent.display())),
        "{stdout}"
    );
    let subtree = fs::read_to_string(lab.parent.join("cgroup.subtree_control")).unwrap();
    assert!(subtree.contains("pids"), "{subtree}");
    assert!(lab.parent.join("worker").is_dir(), "the Worker's leaf");
}

#[test]
fn without_a_delegated_cgroup_required_refuses_to_start_and_auto_warns() {
    // Under the lab's lock, so no lab binds a controller meanwhile.
    let lock = fs::File::create("/run/ql-worker-cgroup-lab.lock").unwrap();
    rustix::fs::flock(lock.as_fd(), rustix::fs::FlockOperation::LockExclusive).unwrap();
    let own = fs::read_to_string("/proc/self/cgroup").unwrap();
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    if let (Some(path), Some(mount)) = (unified_path(&own), cgroup2_mount(&mountinfo)) {
        let here = mount.join(path.trim_start_matches('/'));
        let controllers = fs::read_to_string(here.join("cgroup.controllers")).unwrap_or_default();
        if controllers.split_whitespace().any(|c| c == "pids") {
            eprintln!("SKIPPED: this process's own cgroup offers pids ({controllers:?})");
            return;
        }
    }
    let dir = tempfile::tempdir().unwrap();
    let config = init_config(dir.path(), "required = true\npids_max = 32\n");
    let out = init(&config);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("cgroup.required: no delegated cgroup v2 is usable"),
        "{stderr}"
    );
    let config = init_config(dir.path(), "pids_max = 32\n");
    let out = init(&config);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: cgroup limits are configured but not applied"),
        "{stderr}"
    );
    assert!(
        stderr.contains("warning: Runs share the Worker's identity"),
        "{stderr}"
    );
}
