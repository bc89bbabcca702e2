//! The demo's Runs as assertions, with the real `ql-worker run` binary as a child process
//! against the loopback mTLS reference control plane: a success, a non-zero exit, a Secret
//! environment value, a log over the quota and a control-plane timeout. Then a drain: SIGTERM,
//! every record settled, the Session offline, exit 0. No Secret value anywhere on disk.

mod e2e_common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use e2e_common::{World, files_containing, sigterm, wait_exit};
use ql_worker_core::record::State;

#[test]
fn demo_runs_end_as_expected_with_the_real_binary_and_drain_on_sigterm() {
    let world = World::new();
    let expected = ql_worker::demo::enqueue_samples(&world.cp).unwrap();
    let mut worker = world.spawn_worker(&[]);
    world.wait_for(
        "every sample Run settled in the inbox",
        Duration::from_secs(60),
        |w| {
            let records = w.records();
            expected.iter().all(|e| {
                records
                    .get(&e.run_id)
                    .is_some_and(|r| r.state.is_terminal())
            })
        },
    );
    sigterm(&worker);
    let status = wait_exit(&mut worker, Duration::from_secs(30));
    assert_eq!(status.code(), Some(0), "a drained Worker exits 0");

    // Compare with the demo's own expectations, fed from the records on disk.
    let lifecycles: ql_worker::demo::Lifecycles = Arc::new(Mutex::new(
        world
            .records()
            .into_iter()
            .map(|(run, r)| (run, vec![r.state]))
            .collect(),
    ));
    assert!(ql_worker::demo::report(&world.cp, &expected, &lifecycles, &world.config).unwrap());
    for record in world.records().values() {
        assert_eq!(record.state, State::CompletionAcknowledged);
    }
    let session = world.cp.session(world.cp.worker_id()).unwrap();
    assert_eq!(format!("{:?}", session.status).to_lowercase(), "offline");
    let receipts = world.root().join("receipts");
    assert!(
        files_containing(&receipts, b"").is_empty(),
        "no receipt left after durable completion"
    );
    assert!(
        files_containing(world.dir.path(), b"s3cr3t-demo-value-7f3a").is_empty(),
        "no Secret value on disk"
    );
    assert!(
        !world.root().join("session").exists(),
        "a drained Worker forgets its Session"
    );
}
