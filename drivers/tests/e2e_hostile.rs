//! The running Worker (the real binary) under hostile local conditions (issue 19, items 2, 7
//! and 9): a deleted or replaced owner lock stops it at once (exit 3) instead of letting a
//! second owner in unnoticed; something other than a regular file at `<root>/drain` is refused
//! at start and stops a running Worker; retention failures are reported, not swallowed;
//! SIGHUP reloads the TLS material (reported), SIGUSR1 and SIGUSR2 are reported and ignored; an
//! unusable session file is exit 3, also when writing it fails with ENOSPC.

mod e2e_common;

use std::fs;
use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use e2e_common::{KillOnDrop, PRODUCTION_BINARY, World, init_root, sigterm, wait_exit};
use ql_worker_core::record::State;
use ql_worker_tests::control_plane::{RevisionBuilder, RunSpec};

const SETTLE: Duration = Duration::from_secs(60);

/// The worker's stderr so far (it is appended to `log`).
fn log_text(log: &Path) -> String {
    fs::read_to_string(log).unwrap_or_default()
}

fn registered(world: &World) {
    world.wait_for("the Session registered", SETTLE, |w| {
        w.cp.session(w.cp.worker_id()).is_some()
    });
}

/// `ql-worker run --config <config>`, which must exit by itself within 20 s.
fn run_briefly(config: &Path) -> (Option<i32>, String) {
    let mut child = Command::new(PRODUCTION_BINARY)
        .args(["run", "--config"])
        .arg(config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let code = exit_code(&mut child, Duration::from_secs(20));
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    (code, stderr)
}

/// Waits (bounded) for the worker to exit and returns its code.
fn exit_code(worker: &mut Child, within: Duration) -> Option<i32> {
    wait_exit(worker, within).code()
}

#[test]
fn a_deleted_or_replaced_owner_lock_stops_the_worker_at_once() {
    for replace in [false, true] {
        let world = World::new();
        let log = world.dir.path().join("stderr.log");
        let mut worker = KillOnDrop(world.spawn_worker_logged(&[], &log));
        registered(&world);
        let lock = world.root().join(".owner.lock");
        if replace {
            let fresh = world.root().join("fresh-lock");
            fs::write(&fresh, b"").unwrap();
            fs::set_permissions(&fresh, fs::Permissions::from_mode(0o600)).unwrap();
            fs::rename(&fresh, &lock).unwrap();
        } else {
            fs::remove_file(&lock).unwrap();
        }
        // Bounded: it is checked at every turn of the loop (at least every 100 ms).
        let code = exit_code(&mut worker, Duration::from_secs(10));
        let text = log_text(&log);
        assert_eq!(code, Some(3), "replace={replace}: {text}");
        let what = if replace {
            "was replaced"
        } else {
            "was deleted"
        };
        assert!(
            text.contains("owner lock lost")
                && text.contains(&lock.display().to_string())
                && text.contains(what),
            "replace={replace}: {text}"
        );
        // The root is usable again by a single owner.
        if replace {
            fs::remove_file(&lock).unwrap();
        }
        let mut next = KillOnDrop(world.spawn_worker(&[]));
        std::thread::sleep(Duration::from_millis(500));
        sigterm(&next);
        assert_eq!(exit_code(&mut next, Duration::from_secs(30)), Some(0));
    }
}

#[test]
fn something_other_than_a_regular_file_at_drain_is_refused_at_start_and_stops_a_running_worker() {
    // At start: refused before anything changes, instead of draining at once for ever.
    let world = World::new();
    init_root(world.root());
    let drain = world.root().join("drain");
    fs::create_dir(&drain).unwrap();
    let log = world.dir.path().join("stderr.log");
    let mut worker = KillOnDrop(world.spawn_worker_logged(&[], &log));
    assert_eq!(exit_code(&mut worker, Duration::from_secs(20)), Some(3));
    let text = log_text(&log);
    assert!(
        text.contains(&drain.display().to_string()) && text.contains("must be a regular file"),
        "{text}"
    );
    assert!(drain.is_dir(), "left for the operator to inspect");
    fs::remove_dir(&drain).unwrap();

    // While running: a symlink planted at the name stops the Worker (exit 3).
    let log = world.dir.path().join("stderr-2.log");
    let mut worker = KillOnDrop(world.spawn_worker_logged(&[], &log));
    registered(&world);
    std::os::unix::fs::symlink("/etc/passwd", &drain).unwrap();
    assert_eq!(exit_code(&mut worker, Duration::from_secs(10)), Some(3));
    let text = log_text(&log);
    assert!(
        text.contains(&drain.display().to_string()) && text.contains("symbolic link"),
        "{text}"
    );
    assert!(
        fs::symlink_metadata(&drain)
            .unwrap()
            .file_type()
            .is_symlink(),
        "never followed or removed"
    );
}

#[test]
fn a_failing_retention_sweep_is_reported_and_the_worker_keeps_running() {
    let world = World::new();
    let text = fs::read_to_string(&world.config_path).unwrap();
    fs::write(
        &world.config_path,
        format!("{text}\n[retention]\nlog_keep_ms = 0\nmax_settled_age_ms = 0\n"),
    )
    .unwrap();
    let revision = RevisionBuilder::shell("echo hello").build().unwrap();
    let run = world
        .cp
        .enqueue_run(RunSpec::numbered(1, revision))
        .unwrap();
    let mut worker = KillOnDrop(world.spawn_worker(&[]));
    world.wait_for("completion_acknowledged", SETTLE, |w| {
        w.state_of(&run) == Some(State::CompletionAcknowledged)
    });
    sigterm(&worker);
    assert_eq!(exit_code(&mut worker, Duration::from_secs(30)), Some(0));

    // The settled Run's log shard becomes a symlink to a look-alike directory: the next sweep
    // must neither follow it nor fail silently.
    let record = world.records().remove(&run).unwrap();
    let log_id = record.log_artifact_id.unwrap();
    let shard = world.root().join("logs").join(&log_id.as_str()[5..7]);
    let elsewhere = world.dir.path().join("elsewhere");
    fs::rename(&shard, &elsewhere).unwrap();
    std::os::unix::fs::symlink(&elsewhere, &shard).unwrap();
    let inside: Vec<_> = fs::read_dir(&elsewhere)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(!inside.is_empty());

    let log = world.dir.path().join("stderr.log");
    let mut worker = KillOnDrop(world.spawn_worker_logged(&[], &log));
    let start = Instant::now();
    while !log_text(&log).contains("retention failed") && start.elapsed() < Duration::from_secs(20)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let text = log_text(&log);
    assert!(
        text.contains("retention failed")
            && text.contains(&shard.display().to_string())
            && text.contains("symbolic link"),
        "{text}"
    );
    assert!(
        worker.try_wait().unwrap().is_none(),
        "it keeps running: {text}"
    );
    for path in &inside {
        assert!(
            path.exists(),
            "{} was removed through the link",
            path.display()
        );
    }
    sigterm(&worker);
    assert_eq!(exit_code(&mut worker, Duration::from_secs(30)), Some(0));

    // A symlinked logs/ itself makes the root unusable: refused at start (exit 3).
    fs::remove_file(&shard).unwrap();
    let logs = world.root().join("logs");
    let moved = world.dir.path().join("logs-moved");
    fs::rename(&logs, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &logs).unwrap();
    let log = world.dir.path().join("stderr-3.log");
    let mut worker = KillOnDrop(world.spawn_worker_logged(&[], &log));
    assert_eq!(exit_code(&mut worker, Duration::from_secs(20)), Some(3));
    assert!(
        log_text(&log).contains(&logs.display().to_string()),
        "{}",
        log_text(&log)
    );
}

#[test]
fn sighup_and_sigusr_signals_are_reported_and_do_not_kill_the_worker() {
    let world = World::new();
    let log = world.dir.path().join("stderr.log");
    let mut worker = KillOnDrop(world.spawn_worker_logged(&[], &log));
    registered(&world);
    let pid = rustix::process::Pid::from_child(&worker);
    use rustix::process::Signal;
    for signal in [Signal::HUP, Signal::USR1, Signal::USR2] {
        rustix::process::kill_process(pid, signal).unwrap();
    }
    let start = Instant::now();
    let heard =
        |text: &str| text.matches("ignored").count() >= 2 && text.contains("event=tls.reloaded");
    while !heard(&log_text(&log)) && start.elapsed() < Duration::from_secs(5) {
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(300));
    let text = log_text(&log);
    assert!(
        worker.try_wait().unwrap().is_none(),
        "still running: {text}"
    );
    for name in ["SIGUSR1", "SIGUSR2"] {
        assert!(
            text.contains(&format!("received {name}: ignored")),
            "{text}"
        );
    }
    // SIGHUP reloads the TLS material (issue 18); with the files unchanged it says so.
    assert!(
        text.contains("SIGHUP: the TLS material and trust anchors are unchanged"),
        "{text}"
    );
    assert!(
        world.cp.session(world.cp.worker_id()).is_some(),
        "the Session is still there"
    );
    sigterm(&worker);
    assert_eq!(exit_code(&mut worker, Duration::from_secs(30)), Some(0));
}

/// `run` on a root whose `session` file is unusable: exit 3 (state root unusable), the file
/// left as it was.
#[test]
fn an_unusable_session_file_is_exit_3() {
    let world = World::new();
    init_root(world.root());
    let session = world.root().join("session");
    type Plant = Box<dyn Fn(&Path)>;
    let other_worker = "ql-worker-session v1\nworker_id=someone-else\nsession_id=018f0000-0000-7000-8000-000000000001\n";
    let classes: Vec<(&str, Plant, &str)> = vec![
        (
            "readable by others",
            Box::new(move |p| {
                fs::write(p, other_worker).unwrap();
                fs::set_permissions(p, fs::Permissions::from_mode(0o644)).unwrap();
            }),
            "group/other permission bits",
        ),
        (
            "oversized",
            Box::new(|p| {
                fs::write(p, vec![b'x'; 4096]).unwrap();
                fs::set_permissions(p, fs::Permissions::from_mode(0o600)).unwrap();
            }),
            "must be at most 512 bytes",
        ),
        (
            "a symlink",
            Box::new(|p| std::os::unix::fs::symlink("/etc/hostname", p).unwrap()),
            "symbolic link",
        ),
        (
            "another worker's",
            Box::new(move |p| {
                fs::write(p, other_worker).unwrap();
                fs::set_permissions(p, fs::Permissions::from_mode(0o600)).unwrap();
            }),
            "belongs to worker someone-else",
        ),
        (
            "garbage",
            Box::new(|p| {
                fs::write(p, b"hello").unwrap();
                fs::set_permissions(p, fs::Permissions::from_mode(0o600)).unwrap();
            }),
            "not a ql-worker session file",
        ),
    ];
    for (class, plant, says) in classes {
        let _ = fs::remove_file(&session);
        plant(&session);
        let before = fs::symlink_metadata(&session).unwrap();
        let (code, stderr) = run_briefly(&world.config_path);
        assert_eq!(code, Some(3), "{class}: {stderr}");
        assert!(stderr.contains(says), "{class}: {stderr}");
        let after = fs::symlink_metadata(&session).unwrap();
        assert_eq!(
            (before.len(), before.permissions().mode()),
            (after.len(), after.permissions().mode()),
            "{class}: left as it was"
        );
    }
}

/// Writing the session file fails with ENOSPC on a full file system: exit 3, not 2.
#[test]
fn a_session_write_that_fails_with_enospc_is_exit_3() {
    let world = World::new();
    let mount = world.dir.path().join("small");
    let Some(_unmount) = e2e_common::small_tmpfs(&mount, "256k") else {
        return;
    };
    let root = mount.join("state");
    init_root(&root);
    // Fill the file system to the last byte.
    e2e_common::fill(&mount.join("filler"));
    let text = fs::read_to_string(&world.config_path).unwrap();
    let config = world.dir.path().join("full.toml");
    fs::write(
        &config,
        text.replace(
            &format!("root = \"{}\"", world.root().display()),
            &format!("root = \"{}\"", root.display()),
        ),
    )
    .unwrap();
    fs::set_permissions(&config, fs::Permissions::from_mode(0o600)).unwrap();
    let (code, stderr) = run_briefly(&config);
    assert_eq!(code, Some(3), "{stderr}");
    assert!(
        stderr.contains("No space left on device") && stderr.contains("session"),
        "{stderr}"
    );
    assert!(!root.join("session").exists());
}
