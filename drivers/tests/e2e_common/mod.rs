//! Shared harness of the end-to-end tests: the real `ql-worker` binary as a child process
//! (`ql-worker run --config …`), the loopback reference control plane in this process (TLS 1.3,
//! mutual authentication, freshly generated certificates), a private state root.
#![allow(dead_code, unreachable_pub)]

#[path = "../bin_under_test/mod.rs"]
pub mod bin_under_test;
pub mod evidence;
pub mod process;
pub mod proxy;
pub mod slow_link;

pub use bin_under_test::{hooked_worker_bin, worker_bin};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use ql_worker::config::Config;
use ql_worker::journal::InboxView;
use ql_worker_core::ids::{OfferId, RunId};
use ql_worker_core::listing::PageLimit;
use ql_worker_core::record::{InboxRecord, State};
use ql_worker_tests::control_plane::{ReferenceControlPlane, ReferenceOptions};

/// The production binary.
pub const PRODUCTION_BINARY: &str = env!("CARGO_BIN_EXE_ql-worker");
/// The same binary with the test-only hooks (built only in test builds).
pub const HOOKED_BINARY: &str = env!("CARGO_BIN_EXE_ql-worker-test-hooks");

/// One world: a control plane, a state root, a configuration.
pub struct World {
    pub cp: ReferenceControlPlane,
    pub dir: tempfile::TempDir,
    pub config_path: PathBuf,
    pub config: Config,
}

impl World {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cp = ReferenceControlPlane::start(ReferenceOptions::default()).unwrap();
        let config = ql_worker::demo::write_config(&cp, dir.path(), 100).unwrap();
        let config_path = dir.path().join("ql-worker.toml");
        Self {
            cp,
            dir,
            config_path,
            config,
        }
    }

    /// As [`World::new`] with cadence `cadence_ms` and extra `key = value` lines appended to the
    /// configuration's `[limits]` section (the last section `write_config` writes), reloaded
    /// through the normal path.
    pub fn with_limits(cadence_ms: u64, extra_limits: &str) -> Self {
        Self::with_options(ReferenceOptions::default(), cadence_ms, extra_limits)
    }

    /// As [`World::with_limits`] with a control plane started with `options`.
    pub fn with_options(options: ReferenceOptions, cadence_ms: u64, extra_limits: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cp = ReferenceControlPlane::start(options).unwrap();
        ql_worker::demo::write_config(&cp, dir.path(), cadence_ms).unwrap();
        let config_path = dir.path().join("ql-worker.toml");
        let mut text = std::fs::read_to_string(&config_path).unwrap();
        let limits = text.rfind("[limits]").expect("a [limits] section");
        assert!(
            !text[limits + 1..].contains('['),
            "[limits] is the last section"
        );
        text.push_str(extra_limits);
        std::fs::write(&config_path, text).unwrap();
        let config = Config::load(&config_path, &ql_worker::config::ProcessEnvironment).unwrap();
        Self {
            cp,
            dir,
            config_path,
            config,
        }
    }

    /// A world whose Worker runs the **edge** profile with its defaults: only the state root,
    /// the control plane's settings and `extra` (`key = value` lines, appended at the end of
    /// the file, so a `[section]` header in it opens that section) are written.
    pub fn edge(extra: &str) -> Self {
        Self::profile("edge", ReferenceOptions::default(), extra)
    }

    /// As [`World::edge`] for the **node** profile, with a control plane started with
    /// `options`.
    pub fn node(options: ReferenceOptions, extra: &str) -> Self {
        Self::profile("node", options, extra)
    }

    fn profile(profile: &str, options: ReferenceOptions, extra: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let cp = ReferenceControlPlane::start(options).unwrap();
        let s = cp.worker_settings();
        let root = dir.path().join("state");
        let text = format!(
            "profile = \"{profile}\"\nworker_id = \"{}\"\nroot = \"{}\"\n\n[control_plane]\n\
             origin = \"{}\"\ntrust_anchors = [\"{}\"]\nclient_certificate = \"{}\"\n\
             client_key = \"{}\"\ncredential_file = \"{}\"\n{extra}",
            s.worker_id,
            root.display(),
            s.origin,
            s.ca_cert.display(),
            s.client_cert.display(),
            s.client_key.display(),
            s.credential_file.display(),
        );
        let config_path = dir.path().join("ql-worker.toml");
        std::fs::write(&config_path, text).unwrap();
        let config = Config::load(&config_path, &ql_worker::config::ProcessEnvironment).unwrap();
        Self {
            cp,
            dir,
            config_path,
            config,
        }
    }

    pub fn root(&self) -> &Path {
        &self.config.root
    }

    /// Starts `ql-worker run` with extra environment variables.
    pub fn spawn_worker(&self, env: &[(&str, &str)]) -> Child {
        self.spawn_binary(&worker_bin(), env)
    }

    /// Starts `ql-worker-test-hooks run` (the same Worker with the crash-test hooks installed
    /// from the environment) with extra environment variables.
    pub fn spawn_hooked_worker(&self, env: &[(&str, &str)]) -> Child {
        self.spawn_binary(&hooked_worker_bin(), env)
    }

    fn spawn_binary(&self, binary: &Path, env: &[(&str, &str)]) -> Child {
        let mut command = Command::new(binary);
        command
            .arg("run")
            .arg("--config")
            .arg(&self.config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        for (k, v) in env {
            command.env(k, v);
        }
        command.spawn().unwrap()
    }

    /// Starts `ql-worker run` with extra environment variables, its stderr appended to `log`.
    pub fn spawn_worker_logged(&self, env: &[(&str, &str)], log: &Path) -> Child {
        self.spawn_binary_logged(&worker_bin(), env, log)
    }

    /// As [`World::spawn_hooked_worker`], its stderr appended to `log`.
    pub fn spawn_hooked_worker_logged(&self, env: &[(&str, &str)], log: &Path) -> Child {
        self.spawn_binary_logged(&hooked_worker_bin(), env, log)
    }

    fn spawn_binary_logged(&self, binary: &Path, env: &[(&str, &str)], log: &Path) -> Child {
        self.spawn_logged(binary, &[], env, log)
    }

    /// Starts `ql-worker <extra args> run --config …` (the binary under test) with extra
    /// environment variables, its stderr (the event log) appended to `log`.
    pub fn spawn_with_args(&self, args: &[&str], env: &[(&str, &str)], log: &Path) -> Child {
        self.spawn_logged(&worker_bin(), args, env, log)
    }

    /// Starts `<binary> <args> run --config …` with extra environment variables, its stderr
    /// (the event log) appended to `log`.
    pub fn spawn_logged(
        &self,
        binary: &Path,
        args: &[&str],
        env: &[(&str, &str)],
        log: &Path,
    ) -> Child {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap();
        let mut command = Command::new(binary);
        command
            .args(args)
            .arg("run")
            .arg("--config")
            .arg(&self.config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(file));
        for (k, v) in env {
            command.env(k, v);
        }
        command.spawn().unwrap()
    }

    /// Replaces `find` by `replace` in the configuration file (which must contain it) and
    /// reloads it through the normal path.
    pub fn edit_config(&mut self, find: &str, replace: &str) {
        let text = std::fs::read_to_string(&self.config_path).unwrap();
        assert!(text.contains(find), "the configuration holds {find:?}");
        std::fs::write(&self.config_path, text.replace(find, replace)).unwrap();
        self.config =
            Config::load(&self.config_path, &ql_worker::config::ProcessEnvironment).unwrap();
    }

    /// Appends `text` (whole sections) to the configuration file and reloads it.
    pub fn append_config(&mut self, text: &str) {
        let mut old = std::fs::read_to_string(&self.config_path).unwrap();
        old.push_str(text);
        std::fs::write(&self.config_path, old).unwrap();
        self.config =
            Config::load(&self.config_path, &ql_worker::config::ProcessEnvironment).unwrap();
    }

    /// Records an operator archived (`ql-worker recover --archive`), by Run.
    pub fn archived_records(&self) -> BTreeMap<RunId, InboxRecord> {
        let mut out = BTreeMap::new();
        let Ok(entries) = std::fs::read_dir(self.root().join(ql_worker::journal::ARCHIVE_DIR))
        else {
            return out;
        };
        for entry in entries.flatten() {
            let bytes = std::fs::read(entry.path()).unwrap();
            let record: InboxRecord = ql_worker_core::envelope::decode(&bytes).unwrap();
            out.insert(record.offer.candidate.run_id.clone(), record);
        }
        out
    }

    /// Every record of the inbox, by Run.
    pub fn records(&self) -> BTreeMap<RunId, InboxRecord> {
        let mut out = BTreeMap::new();
        if !self.root().exists() {
            return out;
        }
        let view = match InboxView::open(self.root()) {
            Ok(Some(view)) => view,
            Ok(None) => return out,
            // The Worker creates the root, then its owner lock: a look in between sees no
            // state root yet.
            Err(ql_worker::journal::JournalError::NotStateRoot { .. }) => return out,
            Err(e) => panic!("{e}"),
        };
        let mut after: Option<OfferId> = None;
        loop {
            let page = view
                .list(after.as_ref(), PageLimit::new(64).unwrap())
                .unwrap();
            for id in &page.offer_ids {
                if let Some(record) = read_settling(&view, id) {
                    out.insert(record.offer.candidate.run_id.clone(), record);
                }
            }
            match page.next_after {
                Some(next) => after = Some(next),
                None => return out,
            }
        }
    }

    pub fn state_of(&self, run: &RunId) -> Option<State> {
        self.records().get(run).map(|r| r.state)
    }

    /// Waits (bounded) until `done` holds.
    pub fn wait_for(&self, what: &str, timeout: Duration, mut done: impl FnMut(&Self) -> bool) {
        let start = Instant::now();
        while !done(self) {
            assert!(
                start.elapsed() < timeout,
                "timed out after {timeout:?} waiting for {what}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The first bytes the control plane stored of each log uploaded for `run`, in key order.
    pub fn artifact_heads(&self, run: &RunId) -> Vec<Vec<u8>> {
        self.cp.with_model(|m| {
            m.artifacts_of(run)
                .into_iter()
                .map(|(_, a)| a.head.clone())
                .collect()
        })
    }

    /// Whether the control plane applied a completion for `run`.
    pub fn completed_at_cp(&self, run: &RunId) -> bool {
        self.cp.run(run).is_some_and(|r| r.completion.is_some())
    }

    /// Enqueues Run number `n` at the control plane: `script` in the shell.
    pub fn enqueue_shell(&self, n: u32, script: &str) -> RunId {
        let revision = ql_worker_tests::control_plane::RevisionBuilder::shell(script)
            .build()
            .unwrap();
        self.cp
            .enqueue_run(ql_worker_tests::control_plane::RunSpec::numbered(
                n, revision,
            ))
            .unwrap()
    }
}

/// Reads one record while the Worker may replace it: a read that opened the old inode just as
/// a rename replaced it sees no link left (`LinkCount { found: 0 }`) and is retried.
pub fn read_settling(view: &InboxView, id: &OfferId) -> Option<InboxRecord> {
    let mut tries = 0;
    loop {
        match view.read(id) {
            Ok(record) => return record,
            Err(e)
                if tries < 20
                    && e.unsafe_rule() == Some(ql_worker::fsio::Rule::LinkCount { found: 0 }) =>
            {
                tries += 1;
            }
            Err(e) => panic!("{id}: {e}"),
        }
    }
}

/// A child that is SIGKILLed and reaped when dropped, so a failing test leaves no Worker
/// running behind it (supervisors are independent and end with their commands).
pub struct KillOnDrop(pub Child);

impl std::ops::Deref for KillOnDrop {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        kill9(&mut self.0);
    }
}

/// `ql-worker init --root <root>`, which must succeed.
pub fn init_root(root: &Path) {
    let out = Command::new(worker_bin())
        .args(["init", "--root"])
        .arg(root)
        .output()
        .unwrap();
    assert!(out.status.success(), "init {}: {out:?}", root.display());
}

/// SIGKILL and reap.
pub fn kill9(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// SIGTERM (drain); a second one stops at once.
pub fn sigterm(child: &Child) {
    let pid = rustix::process::Pid::from_child(child);
    let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
}

/// Waits (bounded) for the Worker to exit.
pub fn wait_exit(child: &mut Child, timeout: Duration) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if start.elapsed() > timeout {
            kill9(child);
            panic!("the Worker did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The number in environment variable `name`, or `default` when it is unset or not a number
/// (the e2e tests' knobs).
pub fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Lines in a marker file (0 when absent).
pub fn marker_lines(path: &Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

/// Calls `visit` with the path and bytes of every regular file under `dir` (symlinks are not
/// followed; unreadable entries are skipped).
pub fn each_file(dir: &Path, mut visit: impl FnMut(&Path, &[u8])) {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            if meta.is_dir() {
                stack.push(path);
            } else if meta.is_file() {
                visit(&path, &std::fs::read(&path).unwrap_or_default());
            }
        }
    }
}

/// The JSON events of an event log written with `--log-format json` (every line must be one
/// JSON object: anything else fails the test).
pub fn events(log: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not one JSON object per line ({e}): {line}"));
            assert!(value.is_object(), "{line}");
            value
        })
        .collect()
}

/// The events named `name`.
pub fn events_named(log: &Path, name: &str) -> Vec<serde_json::Value> {
    events(log)
        .into_iter()
        .filter(|e| e["event"] == name)
        .collect()
}

/// Waits (bounded) for an event named `name` for which `matches` holds; returns it.
pub fn wait_event(
    log: &Path,
    name: &str,
    timeout: Duration,
    matches: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let start = Instant::now();
    loop {
        if let Some(event) = events_named(log, name).into_iter().find(|e| matches(e)) {
            return event;
        }
        assert!(
            start.elapsed() < timeout,
            "no {name} event within {timeout:?}; the log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends `signal` to the child.
pub fn signal(child: &Child, signal: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_child(child);
    let _ = rustix::process::kill_process(pid, signal);
}

/// Every regular file under `dir` whose bytes contain `needle`.
pub fn files_containing(dir: &Path, needle: &[u8]) -> Vec<PathBuf> {
    let mut hits = Vec::new();
    each_file(dir, |path, bytes| {
        if bytes.windows(needle.len()).any(|w| w == needle) {
            hits.push(path.to_path_buf());
        }
    });
    hits
}

/// A small tmpfs mounted at `mount` (created), unmounted on drop; `None` (with a line saying
/// the test was skipped) where mounting is not allowed. For the ENOSPC classes.
pub fn small_tmpfs(mount: &Path, size: &str) -> Option<Unmount> {
    std::fs::create_dir(mount).unwrap();
    let mounted = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size},mode=0700"),
            "tmpfs",
        ])
        .arg(mount)
        .output();
    if !mounted.as_ref().is_ok_and(|o| o.status.success()) {
        println!(
            "skipped: cannot mount a small tmpfs here ({mounted:?}); the ENOSPC class needs \
             CAP_SYS_ADMIN (CI runs as root)"
        );
        return None;
    }
    Some(Unmount(mount.to_owned()))
}

/// Unmounts its path when dropped.
pub struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// Fills the file system of `file`'s directory to the last byte with `file`.
pub fn fill(file: &Path) {
    let mut out = std::fs::File::create(file).unwrap();
    let block = vec![0u8; 4096];
    while std::io::Write::write_all(&mut out, &block).is_ok() {}
    while std::io::Write::write_all(&mut out, &[0]).is_ok() {}
}
