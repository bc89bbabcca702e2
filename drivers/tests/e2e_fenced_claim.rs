//! A replay of the pending claim that the control plane fences is cleared at once (docs/wire.md,
//! deliberate difference 12; docs/reliability.md, "Finding (fixed, stop 48)"), with the real
//! binary against the loopback reference control plane, whose leases last 5 s (the shortest the
//! reference allows).
//!
//! The Worker's first `offers` call claims Run 1, but the plane's answers to that claim's calls
//! are lost (applied, then the connection closes without an answer) until the lease the plane
//! holds for its offer id has expired; then answers flow again. The next replay is answered 409
//! `worker_offer_fenced`: the Worker logs `pull.claim_fenced` naming that offer id, never sends
//! it again, and its very next `offers` call is a fresh claim, which gets Run 2 (queued behind
//! Run 1 from the start); Run 2 runs exactly once and completes. Run 1 never runs: the loopback
//! plane has one Attempt per Run and does not re-offer a Run whose lease expired (its reaper
//! makes it `lost`; docs/control-plane.md, "What it simplifies").
//!
//! Before the fix the Worker kept the fenced claim through its 16 attempts with full-jitter
//! backoff up to 60 s: its `offers` call after the 409 replays the same offer id. The test
//! rejects that from the sequence of calls, not from a duration.

mod e2e_common;

use std::time::{Duration, Instant};

use e2e_common::{KillOnDrop, World, events_named, marker_lines};
use ql_worker_core::record::State;
use ql_worker_core::wire::error::ErrorCode;
use ql_worker_core::wire::route::Operation;
use ql_worker_tests::control_plane::{CpConfig, Fault, ReferenceControlPlane, ReferenceOptions};

const JSON: &[&str] = &["--log-format", "json"];
/// The plane's Run lease (reference bounds 5 000..600 000 ms).
const LEASE_MS: u64 = 5_000;
/// More dropped answers than the claim can ask for (16 attempts), in case the client resends;
/// the rest are cleared once the lease has expired.
const DROPS: usize = 64;
/// Bound of each wait for something that takes a few seconds when all is well.
const SETTLE: Duration = Duration::from_secs(30);
/// Bound of the wait, once answers flow again, for Run 2 to complete or for a replay of the
/// fenced claim after its 409 (the old behaviour: its next replay comes within one backoff of
/// at most 32 s, given the attempts 5 s of lost answers leave room for).
const AFTER_FENCE: Duration = Duration::from_secs(90);

/// One `offers` call as the transport saw it.
#[derive(Debug)]
struct Call {
    offer: String,
    /// `None`: the answer was dropped.
    status: Option<u16>,
}

fn offers_calls(world: &World) -> Vec<Call> {
    world
        .cp
        .http_records()
        .iter()
        .filter(|r| r.path.ends_with("/offers"))
        .map(|r| {
            let body: serde_json::Value =
                serde_json::from_slice(&r.body).expect("a JSON Pull body");
            Call {
                offer: body["offerId"].as_str().expect("offerId").to_owned(),
                status: r.response_status,
            }
        })
        .collect()
}

/// The index of the first call that got an answer.
fn first_answered(calls: &[Call]) -> Option<usize> {
    calls.iter().position(|c| c.status.is_some())
}

#[test]
fn a_fenced_replay_clears_the_claim_and_the_next_offers_call_claims_afresh() {
    let options = ReferenceOptions {
        model: CpConfig {
            run_lease_ms: LEASE_MS,
            ..CpConfig::default()
        },
        ..ReferenceOptions::default()
    };
    let world = World::with_options(options, 100, "");
    let markers = [1, 2].map(|n| world.dir.path().join(format!("marker-{n}")));
    let [run_1, run_2] = [1, 2].map(|n| {
        let marker = markers[n as usize - 1].display();
        world.enqueue_shell(n, &format!("echo ran >> '{marker}'"))
    });
    for _ in 0..DROPS {
        world
            .cp
            .inject_for_operation(Operation::Offers, Fault::CommitThenDrop);
    }
    let log = world.dir.path().join("worker.log");
    let _worker = KillOnDrop(world.spawn_with_args(JSON, &[], &log));

    // The first `offers` call claims Run 1; its answer, and those of the replays, are lost.
    world.wait_for("the claim of Run 1", SETTLE, |w| {
        w.cp.run(&run_1).is_some_and(|r| r.lease.is_some())
    });
    let lease = world.cp.run(&run_1).and_then(|r| r.lease).unwrap();
    let fenced = lease.offer_id.as_str().to_owned();
    world.wait_for(
        "the plane's clock past the lease's expiry",
        Duration::from_millis(LEASE_MS) + SETTLE,
        |_| ReferenceControlPlane::now() > lease.expires_at,
    );
    // Every request from now on is past the expiry: a replay of the claim can only be fenced.
    world.cp.clear_faults();
    println!("lease of {fenced} expired; answers flow again");

    // Until Run 2 completes, or the fenced claim is replayed after its first answer.
    let start = Instant::now();
    loop {
        let calls = offers_calls(&world);
        let replayed = first_answered(&calls)
            .is_some_and(|i| calls[i + 1..].iter().any(|c| c.offer == fenced));
        if replayed || world.state_of(&run_2) == Some(State::CompletionAcknowledged) {
            break;
        }
        assert!(
            start.elapsed() < AFTER_FENCE,
            "neither Run 2 completed nor was the fenced claim replayed within {AFTER_FENCE:?} \
             of the lease's expiry; offers calls {calls:?}; log:\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let calls = offers_calls(&world);
    println!("offers calls: {calls:?}");
    // What the model answered to each `offers` call, in the same order (the Worker makes one
    // call at a time). Read after the calls: the model logs a call before the transport records
    // it, so a Pull under way may be in the log only, after the calls read.
    let mut answers: Vec<(u16, Option<ErrorCode>, &str)> = world.cp.with_model(|m| {
        m.request_log()
            .filter(|e| e.operation == Some(Operation::Offers))
            .map(|e| (e.status, e.code, e.reason))
            .collect()
    });
    assert!(answers.len() >= calls.len(), "{answers:?} {calls:?}");
    answers.truncate(calls.len());
    let i = first_answered(&calls).expect("an answered offers call");
    assert!(
        i >= 1 && calls[..i].iter().all(|c| c.offer == fenced),
        "every call before the first answer is Run 1's claim or its replay: {calls:?}"
    );
    assert_eq!(
        answers[0].2, "new_claim",
        "the first call claimed Run 1: {answers:?}"
    );
    assert_eq!(
        (calls[i].offer.as_str(), calls[i].status),
        (fenced.as_str(), Some(409)),
        "the first answered call is a replay of the claim, fenced: {calls:?}"
    );
    assert_eq!(
        answers[i].1,
        Some(ErrorCode::WorkerOfferFenced),
        "{answers:?}"
    );
    // The fix: the fenced claim is never sent again, and the very next call is a fresh claim.
    assert!(
        calls[i + 1..].iter().all(|c| c.offer != fenced),
        "the fenced claim {fenced} was replayed after its 409 (the claim was kept): {calls:?}"
    );
    let fresh = calls.get(i + 1).expect("an offers call after the 409");
    let run_2_offer = world
        .cp
        .run(&run_2)
        .and_then(|r| r.lease)
        .map(|l| l.offer_id.as_str().to_owned())
        .expect("Run 2 was leased");
    assert_eq!(
        (fresh.offer.as_str(), fresh.status, answers[i + 1].2),
        (run_2_offer.as_str(), Some(200), "new_claim"),
        "the call right after the 409 claimed Run 2 afresh: {calls:?} {answers:?}"
    );
    assert_eq!(
        answers.iter().filter(|a| a.2 == "new_claim").count(),
        2,
        "two claims in all (Run 1, then Run 2): {answers:?}"
    );

    let fenced_events = events_named(&log, "pull.claim_fenced");
    assert_eq!(
        fenced_events.len(),
        1,
        "one pull.claim_fenced event: {fenced_events:?}"
    );
    println!("{}", fenced_events[0]);
    assert_eq!(fenced_events[0]["offer"], fenced.as_str());
    assert_eq!(fenced_events[0]["level"], "warn", "{}", fenced_events[0]);

    world.wait_for("Run 2 completed", SETTLE, |w| {
        w.state_of(&run_2) == Some(State::CompletionAcknowledged)
    });
    assert!(world.completed_at_cp(&run_2));
    assert_eq!(marker_lines(&markers[1]), 1, "Run 2 ran exactly once");
    assert_eq!(marker_lines(&markers[0]), 0, "Run 1 never ran");
    assert!(
        world.state_of(&run_1).is_none(),
        "nothing of Run 1 reached the inbox"
    );
    // What it costs: Run 1 waits at the plane for its reaper (here: lost, see the header).
    let reaped = world
        .cp
        .with_model(|m| m.reap_expired_leases(ReferenceControlPlane::now()));
    assert_eq!(reaped, vec![run_1]);
}
