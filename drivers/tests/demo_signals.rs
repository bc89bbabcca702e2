//! `ql-worker demo` under signals, a hostile umask and a failing stdout, with the real binary
//! (issue 19, item 6): the first SIGINT, SIGTERM or SIGHUP drains and the temporary directory
//! (state root, PKI with the CA key, client key and credential) is removed; a second signal
//! stops at once, and the user processes still running are stopped too; `--keep` keeps the
//! certificates its configuration names, every kept file 0600 and directory 0700 under umask 000.
#![cfg(feature = "demo")]

use std::io::{BufRead as _, BufReader};
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use rustix::process::{Pid, Signal, kill_process};

const BIN: &str = env!("CARGO_BIN_EXE_ql-worker");

/// A running demo whose stdout lines arrive on a channel.
struct Demo {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Demo {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .arg("demo")
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits (bounded) for a line containing `needle` (spaces collapsed) and returns it.
    fn wait_line(&mut self, needle: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        let collapsed = |l: &str| l.split_whitespace().collect::<Vec<_>>().join(" ");
        loop {
            if let Some(line) = self.seen.iter().find(|l| collapsed(l).contains(needle)) {
                return line.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => panic!("no line with {needle:?} in {:#?}", self.seen),
            }
        }
    }

    /// The demo's directory (the parent of the state root it prints).
    fn dir(&mut self) -> PathBuf {
        let line = self.wait_line("state root ");
        let root = line.rsplit("state root ").next().unwrap().trim();
        Path::new(root).parent().unwrap().to_path_buf()
    }

    fn signal(&self, signal: Signal) {
        kill_process(Pid::from_child(&self.child), signal).unwrap();
    }

    fn wait(&mut self) -> ExitStatus {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                // The rest of its output.
                while let Ok(line) = self.lines.recv_timeout(Duration::from_millis(200)) {
                    self.seen.push(line);
                }
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the demo did not exit: {:#?}",
                self.seen
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `(ppid, state)` of a live process.
fn stat(pid: u32) -> Option<(u32, char)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = text.rsplit_once(')')?.1;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((ppid, state))
}

/// Every descendant of `root` (supervisors and the user processes under them).
fn descendants(root: u32) -> Vec<u32> {
    let mut all: Vec<(u32, u32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok())
            && let Some((ppid, _)) = stat(pid)
        {
            all.push((pid, ppid));
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(all.iter().filter(|(_, p)| *p == parent).map(|(c, _)| *c));
        i += 1;
    }
    found.remove(0);
    found
}

/// Whether `pid` still runs (a zombie waiting for a reaper does not).
fn running(pid: u32) -> bool {
    stat(pid).is_some_and(|(_, state)| state != 'Z' && state != 'X')
}

fn first_signal_drains(signal: Signal) {
    let mut demo = Demo::start(&["--hold-secs", "2"]);
    let dir = demo.dir();
    assert!(dir.exists());
    assert!(
        dir.join("pki").join("ca-key.pem").exists(),
        "the CA key is there while it runs"
    );
    demo.wait_line("run-6 running_acknowledged");
    demo.signal(signal);
    let status = demo.wait();
    assert_eq!(status.code(), Some(0), "{signal:?}: {:#?}", demo.seen);
    assert!(
        demo.seen.iter().any(|l| l.contains("worker: drained")),
        "{signal:?}: {:#?}",
        demo.seen
    );
    assert!(
        !dir.exists(),
        "{signal:?}: the temporary directory (PKI, credential, state root) was removed"
    );
}

#[test]
fn the_first_sigint_sigterm_or_sighup_drains_the_demo_and_removes_its_directory() {
    for signal in [Signal::INT, Signal::TERM, Signal::HUP] {
        first_signal_drains(signal);
    }
}

#[test]
fn a_second_signal_stops_the_demo_and_the_user_processes_and_removes_everything() {
    let mut demo = Demo::start(&["--hold-secs", "120"]);
    let dir = demo.dir();
    demo.wait_line("run-6 running_acknowledged");
    let pid = demo.child.id();
    let under = descendants(pid);
    assert!(
        !under.is_empty(),
        "the hold sample's supervisor and user process run under the demo"
    );
    demo.signal(Signal::INT);
    std::thread::sleep(Duration::from_millis(300));
    demo.signal(Signal::INT);
    let status = demo.wait();
    assert_eq!(
        status.code(),
        Some(7),
        "interrupted: not every Run ended as expected: {:#?}",
        demo.seen
    );
    assert!(
        demo.seen
            .iter()
            .any(|l| l.contains("stopped by a second signal")),
        "{:#?}",
        demo.seen
    );
    assert!(!dir.exists(), "the temporary directory was removed");
    let left: Vec<u32> = under.into_iter().filter(|p| running(*p)).collect();
    assert!(
        left.is_empty(),
        "supervisors or user processes outlived the demo: {left:?}"
    );
}

#[test]
fn kept_files_are_private_under_umask_000_and_the_kept_config_names_kept_files() {
    let top = tempfile::tempdir().unwrap();
    let keep = top.path().join("kept");
    let status = Command::new("sh")
        .arg("-c")
        .arg("umask 000; exec \"$0\" demo --keep \"$1\" >/dev/null")
        .arg(BIN)
        .arg(&keep)
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let mut files = 0;
    let mut stack = vec![keep.clone()];
    while let Some(dir) = stack.pop() {
        let meta = std::fs::symlink_metadata(&dir).unwrap();
        assert_eq!(meta.mode() & 0o7777, 0o700, "{}", dir.display());
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let meta = std::fs::symlink_metadata(entry.path()).unwrap();
            if meta.is_dir() {
                stack.push(entry.path());
            } else {
                assert!(meta.is_file(), "{}", entry.path().display());
                assert_eq!(
                    meta.mode() & 0o7777,
                    0o600,
                    "{} under umask 000",
                    entry.path().display()
                );
                files += 1;
            }
        }
    }
    assert!(
        files > 10,
        "PKI, configuration and state root: {files} files"
    );
    // Every file the kept configuration names is kept.
    let config = std::fs::read_to_string(keep.join("ql-worker.toml")).unwrap();
    let named: Vec<&str> = config
        .lines()
        .filter(|l| {
            [
                "trust_anchors",
                "client_certificate",
                "client_key",
                "credential_file",
            ]
            .iter()
            .any(|k| l.starts_with(k))
        })
        .filter_map(|l| l.split('"').nth(1))
        .collect();
    assert_eq!(named.len(), 4, "{config}");
    for path in named {
        assert!(
            Path::new(path).starts_with(&keep) && Path::new(path).is_file(),
            "{path} is kept"
        );
    }
    let list = Command::new(BIN)
        .args(["inbox", "list", "--root"])
        .arg(keep.join("state"))
        .output()
        .unwrap();
    assert_eq!(list.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&list.stdout).lines().count(), 6);

    // An existing directory is refused and left alone.
    let again = Command::new(BIN)
        .args(["demo", "--keep"])
        .arg(&keep)
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(7));
    assert!(String::from_utf8_lossy(&again.stderr).contains("does not exist yet"));
}

#[test]
fn a_demo_whose_stdout_fails_still_runs_cleans_up_and_exits_1() {
    // Its own TMPDIR, so what the demo leaves behind (nothing) can be seen.
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .arg("demo")
        .env("TMPDIR", tmp.path())
        .stdout(std::fs::File::create("/dev/full").unwrap())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("could not be written to stdout"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().flatten().collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
}
