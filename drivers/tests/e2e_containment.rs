//! Containment through the real `ql-worker run` against the loopback mTLS control plane: a
//! policy refusal is a start failure (`EXECUTOR_START_FAILED`) with zero spawns, logged with the
//! rule; masked Secret values are what is uploaded (the control plane checks the digest of the
//! masked bytes); `[run_as]` reaches the user command; without `[run_as]` the Worker warns.

mod e2e_common;

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::time::Duration;

use e2e_common::{KillOnDrop, World, files_containing, sigterm, wait_exit};
use ql_worker_core::ids::ProjectId;
use ql_worker_core::record::State;
use ql_worker_tests::control_plane::{RevisionBuilder, RunSpec};

const WAIT: Duration = Duration::from_secs(60);

fn enqueue(world: &World, n: u32, builder: RevisionBuilder) -> ql_worker_core::ids::RunId {
    let revision = builder.build().unwrap();
    world
        .cp
        .enqueue_run(RunSpec::numbered(n, revision))
        .unwrap()
}

fn settled(world: &World, run: &ql_worker_core::ids::RunId) -> bool {
    world.state_of(run).is_some_and(State::is_terminal)
}

#[test]
fn a_policy_refusal_is_a_start_failure_with_zero_spawns_logged_with_its_rule() {
    let world = World::with_limits(100, "\n[policy]\nshell = false\n");
    let marker = world.dir.path().join("spawned");
    let refused = enqueue(
        &world,
        1,
        RevisionBuilder::shell(&format!("touch {}", marker.display())),
    );
    let allowed = enqueue(&world, 2, RevisionBuilder::argv("/bin/echo", ["allowed"]));
    let log = world.dir.path().join("worker.log");
    let mut worker = KillOnDrop(world.spawn_worker_logged(&[], &log));
    world.wait_for("both Runs settled", WAIT, |w| {
        settled(w, &refused) && settled(w, &allowed)
    });
    sigterm(&worker);
    assert_eq!(wait_exit(&mut worker, WAIT).code(), Some(0));
    assert_eq!(
        world.state_of(&refused),
        Some(State::StartFailureAcknowledged)
    );
    let cp_run = world.cp.run(&refused).unwrap();
    assert_eq!(cp_run.error_code.as_deref(), Some("EXECUTOR_START_FAILED"));
    assert!(!marker.exists(), "zero spawns");
    assert_eq!(
        world.state_of(&allowed),
        Some(State::CompletionAcknowledged)
    );
    let stderr = fs::read_to_string(&log).unwrap();
    assert!(
        stderr.contains(
            "start failed, no user process started: refused by the execution policy: \
             policy.shell = false refuses shell commands (shell /bin/sh)"
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains("warning: Runs share the Worker's identity"),
        "{stderr}"
    );
}

#[test]
fn masked_secret_values_are_what_is_uploaded_and_nowhere_on_disk() {
    let world = World::with_limits(100, "\n[capture]\nmask_secrets = true\n");
    let secret_value = "tok-3f9a-very-secret-17";
    let project = ProjectId::new("project-1").unwrap();
    let reference = world
        .cp
        .set_secret(&project, "API_TOKEN", secret_value)
        .unwrap();
    let run = enqueue(
        &world,
        1,
        RevisionBuilder::shell(
            "printf '%s' \"${API_TOKEN%-very-secret-17}\"; sleep 0.3; echo \"-very-secret-17 and $API_TOKEN\"",
        )
        .secret_env("API_TOKEN", &reference),
    );
    let mut worker = KillOnDrop(world.spawn_worker(&[]));
    world.wait_for("the Run settled", WAIT, |w| settled(w, &run));
    sigterm(&worker);
    assert_eq!(wait_exit(&mut worker, WAIT).code(), Some(0));
    assert_eq!(world.state_of(&run), Some(State::CompletionAcknowledged));
    let artifacts = world.cp.with_model(|m| {
        m.artifacts_of(&run)
            .into_iter()
            .map(|(_, a)| a.clone())
            .collect::<Vec<_>>()
    });
    assert_eq!(artifacts.len(), 1);
    let expected = b"*** and ***\n";
    assert_eq!(
        artifacts[0].head, expected,
        "the masked bytes were uploaded"
    );
    assert_eq!(artifacts[0].byte_length, expected.len() as u64);
    assert_eq!(
        artifacts[0].sha256,
        ql_worker_core::ids::Sha256Digest::of(expected),
        "the digest covers the masked bytes"
    );
    assert!(
        files_containing(world.dir.path(), secret_value.as_bytes()).is_empty(),
        "no Secret value on disk"
    );
}

#[test]
fn run_as_reaches_the_user_command_through_the_real_worker() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("SKIPPED: needs root to switch users (CI runs as root)");
        return;
    }
    let world = World::with_limits(100, "");
    // The run user must be able to traverse to its runs area; the state root stays 0700.
    fs::set_permissions(world.dir.path(), fs::Permissions::from_mode(0o711)).unwrap();
    let runs = world.dir.path().join("runs");
    let mut text = fs::read_to_string(&world.config_path).unwrap();
    text.push_str(&format!(
        "\n[run_as]\nuser = \"nobody\"\nruns_dir = \"{}\"\n[run_limits]\nnproc = 64\n",
        runs.display()
    ));
    fs::write(&world.config_path, text).unwrap();
    let settings = world.cp.worker_settings();
    let key = settings.client_key.display().to_string();
    let run = enqueue(
        &world,
        1,
        RevisionBuilder::shell(&format!(
            "echo \"uid=$(id -u) cwd=$(pwd)\"; cat {key} 2>&1 >/dev/null | sed 's/^.*: //'"
        )),
    );
    // What a killed supervisor would leave behind (no record: swept), and an entry that is not
    // a Run's (kept).
    fs::create_dir(&runs).unwrap();
    fs::set_permissions(&runs, fs::Permissions::from_mode(0o711)).unwrap();
    fs::create_dir(runs.join("offer-leftover")).unwrap();
    fs::create_dir(runs.join("not a run")).unwrap();
    let log = world.dir.path().join("worker.log");
    let mut worker = KillOnDrop(world.spawn_worker_logged(&[], &log));
    world.wait_for("the Run settled", WAIT, |w| settled(w, &run));
    world.wait_for("the leftover swept", WAIT, |_| {
        !runs.join("offer-leftover").exists()
    });
    sigterm(&worker);
    assert_eq!(wait_exit(&mut worker, WAIT).code(), Some(0));
    assert_eq!(world.state_of(&run), Some(State::CompletionAcknowledged));
    assert!(runs.join("not a run").exists(), "not a Run's: kept");
    let head = world.cp.with_model(|m| {
        m.artifacts_of(&run)
            .into_iter()
            .map(|(_, a)| String::from_utf8_lossy(&a.head).into_owned())
            .collect::<String>()
    });
    let offer = world.records()[&run].offer.offer_id.clone();
    assert!(
        head.starts_with(&format!(
            "uid=65534 cwd={}\n",
            runs.join(offer.as_str()).display()
        )),
        "{head}"
    );
    assert!(head.contains("Permission denied"), "{head}");
    assert!(!runs.join(offer.as_str()).exists(), "removed once settled");
    let stderr = fs::read_to_string(&log).unwrap();
    assert!(
        !stderr.contains("Runs share the Worker's identity"),
        "{stderr}"
    );
}

#[test]
fn init_warns_that_runs_share_the_workers_identity_without_run_as() {
    let dir = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(e2e_common::worker_bin())
        .args(["init", "--root"])
        .arg(dir.path().join("state"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("warning: Runs share the Worker's identity")
            && stderr.contains("init --config FILE"),
        "{stderr}"
    );
}
