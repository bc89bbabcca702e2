//! Test-only hooks stay out of production (issue 19, item 10).
//!
//! The crash-test stall hook exists only with the `test-hooks` feature, which only this package's
//! own dev-dependency turns on, and only the `ql-worker-test-hooks` binary (required-features =
//! ["test-hooks"]) installs it; the rest of the test machinery (`FaultFs`, the simulated world,
//! the explorer's `sim-hooks` in core) is in `ql-worker-sim`, a dev-dependency only. So:
//! * cargo's feature resolution for a build without dev-dependencies (`cargo build -p
//!   ql-worker`, `cargo install`) has no `test-hooks`, and the hooked binary is not a target of
//!   such a build;
//! * `cargo tree -p ql-worker -e normal` lists no `ql-worker-sim` and no `sim-hooks`;
//! * the `ql-worker` binary ignores `QL_WORKER_FAULT_STALL_AFTER` even in this test build, where
//!   its library *is* compiled with the feature; the hooked binary obeys it (the control).

mod e2e_common;

use std::process::Command;
use std::time::Duration;

use e2e_common::{KillOnDrop, World, marker_lines, sigterm, wait_exit};
use ql_worker::test_hooks::STALL_HOOK_ENV;
use ql_worker_core::record::State;
use ql_worker_tests::control_plane::{RevisionBuilder, RunSpec};

fn cargo(args: &[&str]) -> String {
    let cargo = option_env!("CARGO").unwrap_or("cargo");
    let out = Command::new(cargo)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cargo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The features cargo resolves for the `ql-worker` package, with or without dev-dependencies.
fn resolved_features(with_dev: bool, extra: &[&str]) -> String {
    let mut args = vec![
        "tree",
        "-p",
        "ql-worker",
        "--depth",
        "0",
        "--prefix",
        "none",
        "-f",
        "{p} [{f}]",
        "--locked",
        "--offline",
    ];
    if !with_dev {
        args.extend(["-e", "no-dev"]);
    }
    args.extend(extra);
    let out = cargo(&args);
    out.lines()
        .find(|l| l.starts_with("ql-worker v"))
        .unwrap_or_else(|| panic!("no ql-worker line in {out}"))
        .to_string()
}

/// `cargo tree -p ql-worker -e <edges>` with each package's features.
fn dependency_tree(edges: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "tree",
        "-p",
        "ql-worker",
        "-e",
        edges,
        "--prefix",
        "none",
        "-f",
        "{p} [{f}]",
        "--locked",
        "--offline",
    ];
    args.extend(extra);
    cargo(&args)
}

#[test]
fn a_production_build_resolves_without_the_test_hooks_feature() {
    let production = resolved_features(false, &[]);
    assert!(
        production.ends_with("[default,demo]"),
        "cargo build -p ql-worker: {production}"
    );
    let minimal = resolved_features(false, &["--no-default-features"]);
    assert!(minimal.ends_with("[]"), "--no-default-features: {minimal}");
    // The control: the same query with dev-dependencies (what `cargo test` builds) has it.
    let test = resolved_features(true, &[]);
    assert!(test.contains("test-hooks"), "cargo test: {test}");

    // The test machinery (`ql-worker-sim`, the only crate that turns on core's `sim-hooks`) is
    // not in the production dependency tree, with or without the default features; the control:
    // the tree with dev-dependencies has it.
    for extra in [&[][..], &["--no-default-features"][..]] {
        let tree = dependency_tree("normal", extra);
        assert!(tree.contains("ql-worker-core v"), "{tree}");
        assert!(
            !tree.contains("ql-worker-sim"),
            "cargo tree {extra:?}: {tree}"
        );
        assert!(!tree.contains("sim-hooks"), "cargo tree {extra:?}: {tree}");
    }
    assert!(dependency_tree("normal,dev", &[]).contains("ql-worker-sim v"));

    // Only the hooked binary requires the feature; the production binary requires nothing.
    let metadata: serde_json::Value = serde_json::from_str(&cargo(&[
        "metadata",
        "--format-version",
        "1",
        "--no-deps",
        "--locked",
        "--offline",
    ]))
    .unwrap();
    let package = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "ql-worker")
        .unwrap();
    let bins: Vec<(String, serde_json::Value)> = package["targets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["kind"].as_array().unwrap().iter().any(|k| k == "bin"))
        .map(|t| {
            (
                t["name"].as_str().unwrap().to_string(),
                t.get("required-features")
                    .cloned()
                    .unwrap_or(serde_json::Value::Null),
            )
        })
        .collect();
    assert_eq!(
        bins,
        vec![
            (String::from("ql-worker"), serde_json::Value::Null),
            (
                String::from("ql-worker-test-hooks"),
                serde_json::json!(["test-hooks"])
            ),
        ],
        "binary targets and their required features"
    );
}

#[test]
fn the_production_binary_ignores_the_stall_hook_that_the_hooked_binary_obeys() {
    let world = World::new();
    let marker = world.dir.path().join("marker");
    let revision = RevisionBuilder::shell(&format!("echo ran >> {}", marker.display()))
        .build()
        .unwrap();
    let run = world
        .cp
        .enqueue_run(RunSpec::numbered(1, revision))
        .unwrap();

    // The control: the hooked binary stalls right after `accepted` is durable.
    let hooked = KillOnDrop(world.spawn_hooked_worker(&[(STALL_HOOK_ENV, "accepted")]));
    world.wait_for("accepted", Duration::from_secs(60), |w| {
        w.state_of(&run) == Some(State::Accepted)
    });
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(world.state_of(&run), Some(State::Accepted), "it stalled");
    drop(hooked); // SIGKILL

    // The production binary, with the same variable, runs the Run to the end.
    let mut worker = KillOnDrop(world.spawn_worker(&[(STALL_HOOK_ENV, "accepted")]));
    world.wait_for("completion_acknowledged", Duration::from_secs(60), |w| {
        w.state_of(&run) == Some(State::CompletionAcknowledged)
    });
    sigterm(&worker);
    assert_eq!(
        wait_exit(&mut worker, Duration::from_secs(30)).code(),
        Some(0)
    );
    assert_eq!(marker_lines(&marker), 1);

    // A value the hooked binary refuses means nothing to the production binary.
    let hooked = Command::new(e2e_common::HOOKED_BINARY)
        .args(["inbox", "list", "--root"])
        .arg(world.root())
        .env(STALL_HOOK_ENV, "no-such-point")
        .output()
        .unwrap();
    assert_eq!(hooked.status.code(), Some(2), "{hooked:?}");
    assert!(
        String::from_utf8_lossy(&hooked.stderr).contains(STALL_HOOK_ENV),
        "{hooked:?}"
    );
    let production = Command::new(e2e_common::PRODUCTION_BINARY)
        .args(["inbox", "list", "--root"])
        .arg(world.root())
        .env(STALL_HOOK_ENV, "no-such-point")
        .output()
        .unwrap();
    assert_eq!(production.status.code(), Some(0), "{production:?}");
    assert!(!String::from_utf8_lossy(&production.stderr).contains(STALL_HOOK_ENV));
}
