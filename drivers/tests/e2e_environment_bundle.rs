//! Environment bundles end to end, with the real binary against the loopback reference control
//! plane: the revision's `environmentBundleRef` goes out in the `secrets` request, the plane
//! serves the bundle, and the child gets the revision's bindings plus the bundle's entries —
//! values in memory only, none of them anywhere under the state root. A bundle whose name is also
//! a binding's is refused before any spawn: a start failure, nothing ran.

mod e2e_common;

use std::time::Duration;

use e2e_common::{KillOnDrop, World, each_file};
use ql_worker_core::ids::ProjectId;
use ql_worker_core::record::State;
use ql_worker_tests::control_plane::{RevisionBuilder, RunSpec};

const SETTLE: Duration = Duration::from_secs(60);
const SECRET: &str = "sekret-token-6f1d2c";
const BUNDLE_Z: &str = "bundle-zed-8a41be";
const BUNDLE_A: &str = "bundle-alpha-3c9e07";

#[test]
fn a_bundle_is_expanded_in_memory_and_a_colliding_one_is_a_start_failure() {
    let world = World::new();
    let project = ProjectId::new("project-1").unwrap();
    let token = world.cp.set_secret(&project, "TOKEN", SECRET).unwrap();
    let bundle = world
        .cp
        .set_environment_bundle(
            &project,
            "app-env",
            3,
            &[("ZED", BUNDLE_Z), ("ALPHA", BUNDLE_A)],
        )
        .unwrap();
    let marker = world.dir.path().join("marker");
    let names = world.dir.path().join("names");
    let command = format!(
        "printf '%s|%s|%s|%s' \"$PUB\" \"$TOKEN\" \"$ALPHA\" \"$ZED\" > {}; \
         env | cut -d= -f1 | sort > {}",
        marker.display(),
        names.display()
    );
    let good = RevisionBuilder::shell(&command)
        .public_env("PUB", "visible")
        .secret_env("TOKEN", &token)
        .environment_bundle(&bundle)
        .build()
        .unwrap();
    let good_run = world.cp.enqueue_run(RunSpec::numbered(1, good)).unwrap();

    let colliding_bundle = world
        .cp
        .set_environment_bundle(&project, "clash-env", 1, &[("PUB", "from-the-bundle")])
        .unwrap();
    let never = world.dir.path().join("never");
    let clash = RevisionBuilder::shell(&format!("touch {}", never.display()))
        .public_env("PUB", "visible")
        .environment_bundle(&colliding_bundle)
        .source_revision(2)
        .build()
        .unwrap();
    let clash_run = world.cp.enqueue_run(RunSpec::numbered(2, clash)).unwrap();

    let _worker = KillOnDrop(world.spawn_worker(&[]));
    world.wait_for("both Runs settled", SETTLE, |w| {
        w.state_of(&good_run) == Some(State::CompletionAcknowledged)
            && w.state_of(&clash_run) == Some(State::StartFailureAcknowledged)
    });

    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        format!("visible|{SECRET}|{BUNDLE_A}|{BUNDLE_Z}"),
        "bindings and bundle entries reach the child"
    );
    let seen: Vec<String> = std::fs::read_to_string(&names)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    for name in ["ALPHA", "PUB", "TOKEN", "ZED"] {
        assert!(seen.iter().any(|n| n == name), "{name} in {seen:?}");
    }
    let clash_at_cp = world.cp.run(&clash_run).unwrap();
    assert_eq!(
        clash_at_cp.error_code.as_deref(),
        Some("EXECUTOR_START_FAILED")
    );
    assert!(!never.exists(), "the colliding bundle's command never ran");
    // Secret and bundle values never touch the Worker's disk.
    each_file(world.root(), |path, bytes| {
        for value in [SECRET, BUNDLE_A, BUNDLE_Z, "from-the-bundle"] {
            assert!(
                !bytes.windows(value.len()).any(|w| w == value.as_bytes()),
                "{value} found in {}",
                path.display()
            );
        }
    });
}

/// With `capture.mask_secrets`, a bundle's values are masked like Secret values: the bundle
/// arrives through the `secrets` endpoint, so every entry that is not a public binding of the
/// revision is secret. Public values stay readable.
#[test]
fn masking_covers_the_bundles_values_and_leaves_public_values() {
    let world = World::with_limits(100, "\n[capture]\nmask_secrets = true\n");
    let project = ProjectId::new("project-1").unwrap();
    let bundle = world
        .cp
        .set_environment_bundle(&project, "app-env", 1, &[("ALPHA", BUNDLE_A)])
        .unwrap();
    let revision = RevisionBuilder::shell("echo \"$PUB $ALPHA\"")
        .public_env("PUB", "visible")
        .environment_bundle(&bundle)
        .build()
        .unwrap();
    let run = world
        .cp
        .enqueue_run(RunSpec::numbered(1, revision))
        .unwrap();
    let _worker = KillOnDrop(world.spawn_worker(&[]));
    world.wait_for("the Run settled", SETTLE, |w| {
        w.state_of(&run) == Some(State::CompletionAcknowledged)
    });
    let heads = world.artifact_heads(&run);
    assert_eq!(
        heads,
        vec![b"visible ***\n".to_vec()],
        "the bundle value is masked"
    );
}
