//! An offer the Worker refuses for good does not hold up the next one, with the real binary
//! against the loopback reference control plane: the control plane serves Run 1 with a revision
//! whose content no longer matches its digest (a corrupt stored plan: every answer for that
//! claim carries the same bytes), and a good Run 2 behind it. The Worker clears Run 1's claim
//! after the first verdict, logs it, and the very next Pull gets Run 2.

mod e2e_common;

use std::time::Duration;

use e2e_common::{KillOnDrop, World};
use ql_worker_core::record::State;
use ql_worker_tests::control_plane::{Fault, RevisionBuilder, RunSpec};

const SETTLE: Duration = Duration::from_secs(30);

/// The offer id a Pull request body carries.
fn offer_id_of(body: &[u8]) -> String {
    let value: serde_json::Value = serde_json::from_slice(body).expect("a JSON Pull body");
    value["offerId"].as_str().expect("offerId").to_owned()
}

#[test]
fn a_refused_offer_delays_the_next_good_one_by_at_most_one_pull() {
    let world = World::new();
    let bad = RevisionBuilder::shell("echo refused-run").build().unwrap();
    let bad_run = world.cp.enqueue_run(RunSpec::numbered(1, bad)).unwrap();
    let good = RevisionBuilder::shell("true").build().unwrap();
    let good_run = world.cp.enqueue_run(RunSpec::numbered(2, good)).unwrap();
    // Every answer that carries Run 1's revision is altered the same way (each request takes one
    // rule; the others do not contain the text and pass unchanged).
    for _ in 0..2_000 {
        world.cp.inject(Fault::Rewrite {
            find: String::from("echo refused-run"),
            replace: String::from("echo tampered-run"),
        });
    }
    let log = world.dir.path().join("worker.log");
    let _worker = KillOnDrop(world.spawn_worker_logged(&[], &log));
    world.wait_for("Run 2 completed", SETTLE, |w| {
        w.state_of(&good_run) == Some(State::CompletionAcknowledged)
    });

    let pulls: Vec<String> = world
        .cp
        .http_records()
        .iter()
        .filter(|r| r.path.ends_with("/offers"))
        .map(|r| offer_id_of(&r.body))
        .collect();
    let good_offer = world
        .cp
        .run(&good_run)
        .and_then(|r| r.lease)
        .map(|l| l.offer_id.as_str().to_owned())
        .expect("Run 2 was leased");
    let refused = world
        .cp
        .run(&bad_run)
        .and_then(|r| r.lease)
        .map(|l| l.offer_id.as_str().to_owned())
        .expect("Run 1 was leased to the Worker");
    assert_eq!(pulls[0], refused, "the first Pull claimed Run 1");
    assert_eq!(
        pulls[1], good_offer,
        "the Pull right after the refused one claimed Run 2: {pulls:?}"
    );
    assert_eq!(
        pulls.iter().filter(|p| **p == refused).count(),
        1,
        "the refused claim was never retried: {pulls:?}"
    );
    assert!(
        world.state_of(&bad_run).is_none(),
        "nothing of Run 1 reached the inbox"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains("refused for good"))
        .unwrap_or_else(|| panic!("a refusal line in the Worker's log:\n{text}"));
    assert!(
        line.contains(&refused) && line.contains("contentDigest"),
        "the line names the offer and the rule: {line}"
    );
    assert!(
        line.contains("event=offer.refused") && line.contains(" warning: "),
        "the refusal is the offer.refused event of the event log, at warning: {line}"
    );
}
