//! Reference §6.1 (`WR/remoteOfferDelivery.test.cjs`): the inbox and the Pull coordinator,
//! driven through the whole Worker against the simulated host (`testkit::world`). Each test is
//! named after the reference scenario and asserts the exact commands the core issues.

use ql_worker_core::claim::PendingClaim;
use ql_worker_core::ids::{OfferId, Revision, WorkerGeneration};
use ql_worker_core::io::{Action, Outcome, StoreFailure};
use ql_worker_core::listing::PageLimit;
use ql_worker_core::record::{InboxRecord, State};
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::offer::{OfferResponse, OfferStats, OfferedLease, OfferedOffer};
use ql_worker_core::wire::route::Operation;
use ql_worker_sim::testkit::act;
use ql_worker_sim::testkit::sim::{On, Sim};
use ql_worker_sim::testkit::world::{Answer, CpStatus, OfferTemplate, World};
use ql_worker_sim::testkit::{self};
use ql_worker_tests::server_wire::ToJson as _;

fn ms(v: u64) -> UnixMillis {
    UnixMillis::new(v).unwrap()
}

fn lines(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_string()).collect()
}

/// The trail with the inbox check of a claim whose offer the world does not know yet (the
/// Pull reads the inbox for the claim's own, entropy-made offer id before retrying it) named
/// `read-record (claim)`.
fn normalized(trail: &[String]) -> Vec<String> {
    trail
        .iter()
        .map(|l| match l.strip_prefix("read-record ") {
            Some(id) if id.len() == 36 && id.matches('-').count() == 4 => {
                "read-record (claim)".to_string()
            }
            _ => l.clone(),
        })
        .collect()
}

/// Asserts that `expected` appears in `trail` as one contiguous run of commands.
fn assert_run(trail: &[String], expected: &[&str]) {
    let expected = lines(expected);
    let trail = normalized(trail);
    assert!(
        trail
            .windows(expected.len())
            .any(|w| w == expected.as_slice()),
        "expected the run {expected:#?}\nin the trail {trail:#?}"
    );
}

/// The first Pull of a started Worker whose offer is refused for good: the claim is cleared
/// right after the answer, nothing stored, no backoff.
const REFUSED_AT_THE_FIRST_PULL: &[&str] = &[
    "tick 1000",
    "list-inbox",
    "read-claim",
    "draw-entropy",
    "persist-claim r0",
    "post offers",
    "clear-claim r0",
];

/// Registers and reconciles an empty inbox: the next tick is the first active one.
fn started(world: World) -> Sim {
    let mut sim = Sim::scenario(world);
    sim.run(2);
    assert_eq!(
        sim.take_trail(),
        lines(&["tick 1000", "post register", "tick 1000", "list-inbox"])
    );
    sim
}

/// A started Worker whose first Pull was lost in transport: the claim kept, backed off by the
/// longest first jitter (999 ms, the second entropy draw all `0xff`).
fn after_one_failed_pull() -> Sim {
    let mut sim = started(World::one_offer(1));
    sim.on(On::Post(Operation::Offers), Answer::Unavailable);
    sim.on(On::Kind("draw-entropy"), Answer::Ok);
    sim.on(On::Kind("draw-entropy"), Answer::EntropyVariant);
    sim.run(1);
    sim
}

fn claim(sim: &Sim) -> Option<PendingClaim> {
    sim.world.disk.claim.as_ref().map(|(c, _)| c.clone())
}

fn the_offer(sim: &Sim) -> OfferId {
    sim.world.plane.runs.keys().next().unwrap().clone()
}

fn first_write(sim: &Sim) -> (Option<Revision>, InboxRecord) {
    let stream = sim.stream.as_ref().unwrap();
    match stream
        .iter()
        .find(|a| matches!(a, Action::PersistRecord { .. }))
    {
        Some(Action::PersistRecord { expected, record }) => (*expected, (**record).clone()),
        _ => panic!("no record written"),
    }
}

/// The claim is durable (first publication) before the request and names the offer id and token
/// the stored record carries; the offer is published as `accepted` at revision 0; a second
/// delivery of the stored offer is a replay that writes nothing. The files' modes (0600 records
/// and claim, 0700 root) and the temp + fsync + link/rename recipe belong to the driver's file
/// authority: `drivers/tests/storage_journal.rs`
/// (`publishing_an_existing_record_is_already_exists_and_changes_nothing`,
/// `pending_claim_create_is_idempotent_then_replace_and_clear_follow_the_core_rules`),
/// `drivers/tests/storage_hostile.rs` (`mode_0644_record_log_receipt_and_claim_are_refused`,
/// `mode_0755_root_offers_and_shard_directories_are_refused`) and
/// `drivers/tests/storage_faults.rs`.
#[test]
fn persists_the_claim_intent_and_accepted_capability_in_private_atomic_files() {
    let mut sim = started(World::one_offer(1));
    sim.run(1);
    assert_eq!(
        &sim.commands()[..8],
        lines(&[
            "list-inbox",
            "read-claim",
            "draw-entropy",
            "persist-claim r0",
            "post offers",
            "read-record o1",
            "persist-record o1 r0 accepted",
            "clear-claim r0",
        ])
        .as_slice()
    );
    let stream = sim.stream.clone().unwrap();
    let Some(Action::PersistClaim { expected, claim }) = stream
        .iter()
        .find(|a| matches!(a, Action::PersistClaim { .. }))
    else {
        panic!("no claim written");
    };
    assert_eq!(*expected, None, "the claim is a first publication");
    assert_eq!(
        claim.attempt_count, 1,
        "created with its first attempt counted"
    );
    let (expected, record) = first_write(&sim);
    assert_eq!(expected, None, "the offer is a first publication");
    assert_eq!(
        (record.revision, record.state),
        (Revision::FIRST, State::Accepted)
    );
    assert_eq!(claim.offer_id, record.offer.offer_id);
    assert_eq!(claim.lease_token, record.offer.lease_token);

    // Crash after storing the offer, before clearing the claim: the restarted Worker finds the
    // claim's offer already in the inbox and clears the stale claim instead of replaying it (a
    // replay is fenced once the Run's lease moves on, and its backoff would block every Pull;
    // found by the crash campaign). The stored record is kept as it is (no write). The
    // reference replays the claim and keeps the stored record, which this also did before.
    // Two slots, so the Pull runs while o1 does.
    let mut replay = Sim::new(testkit::config(), World::one_offer(1), ms(1_000)).recording();
    replay.run(2);
    replay.on(On::Persist(State::Accepted), Answer::CrashAfter);
    replay.run(1);
    replay.take_trail();
    replay.run(3);
    let trail = replay.commands();
    assert_run(
        &trail,
        &[
            "read-claim",
            "read-record o1",
            "clear-claim r0",
            "draw-entropy",
        ],
    );
    assert_eq!(
        trail.iter().filter(|l| l.contains("r0 accepted")).count(),
        0
    );
    assert!(replay.world.disk.claim.is_none());
    assert!(
        replay.world.violations.is_empty(),
        "{:?}",
        replay.world.violations
    );
}

/// One record per offer walks accepted → starting_acknowledged → launching → started →
/// running_acknowledged at revisions 0..=4, each write a CAS on the previous revision. The
/// journal (here the simulated one, with the same `check_transition`) refuses a regression and a
/// revision skip, changing nothing.
#[test]
fn uses_one_revision_fenced_inbox_record_through_ack_and_spawn_barriers() {
    let mut sim = started(World::one_offer(1));
    sim.run(1);
    let writes: Vec<(Option<Revision>, Revision, State)> = sim
        .stream
        .as_ref()
        .unwrap()
        .iter()
        .filter_map(|a| match a {
            Action::PersistRecord { expected, record } => {
                Some((*expected, record.revision, record.state))
            }
            _ => None,
        })
        .collect();
    let rev = |n| Revision::new(n).unwrap();
    assert_eq!(
        writes,
        vec![
            (None, rev(0), State::Accepted),
            (Some(rev(0)), rev(1), State::StartingAcknowledged),
            (Some(rev(1)), rev(2), State::Launching),
            (Some(rev(2)), rev(3), State::Started),
            (Some(rev(3)), rev(4), State::RunningAcknowledged),
        ]
    );
    let stored = sim.world.disk.record(&the_offer(&sim)).unwrap().clone();
    assert_eq!(stored.revision, rev(4));

    // Regression running_acknowledged → started: refused (invalid transition).
    let mut regression = stored.clone();
    regression.revision = rev(5);
    regression.state = State::Started;
    let action = Action::PersistRecord {
        expected: Some(rev(4)),
        record: Box::new(regression),
    };
    let outcome = sim.world.perform(sim.now, &action, Answer::Ok);
    assert!(matches!(outcome, Outcome::Store(StoreFailure::Conflict)));
    assert!(
        sim.world.violations[0]
            .detail
            .contains("illegal transition"),
        "{:?}",
        sim.world.violations
    );

    // Revision skip 4 → 6: refused (revision conflict).
    let mut skip = stored.clone();
    skip.revision = rev(6);
    let action = Action::PersistRecord {
        expected: Some(rev(4)),
        record: Box::new(skip),
    };
    let outcome = sim.world.perform(sim.now, &action, Answer::Ok);
    assert!(matches!(outcome, Outcome::Store(StoreFailure::Conflict)));
    assert!(sim.world.violations[1].detail.contains("must be 5"));
    assert_eq!(
        sim.world.disk.record(&the_offer(&sim)),
        Some(&stored),
        "nothing changed"
    );
}

/// Startup reconciliation lists the inbox in keyset pages of the configured size, following the
/// cursor until the last page (which has none); a page size above 64 is a configuration error.
#[test]
fn lists_the_single_execution_inbox_authority_with_a_stable_bounded_cursor() {
    let mut world = World::new(1, Vec::new());
    for n in 1..=3 {
        world.seed(
            n,
            testkit::record(n, State::StartFailureAcknowledged),
            false,
        );
    }
    let mut sim = Sim::scenario(world);
    sim.config.startup_page = PageLimit::new(2).unwrap();
    sim.crash(); // Apply the configuration: a fresh Worker.
    sim.take_trail();
    sim.run(4);
    assert_eq!(
        sim.commands(),
        lines(&[
            "post register",
            "list-inbox",
            "list-inbox after o2",
            "list-inbox",
            "read-claim",
            "draw-entropy",
            "persist-claim r0",
            "post offers",
            "clear-claim r0",
        ])
    );
    let page = sim.world.perform(
        sim.now,
        &Action::ListInbox {
            after: None,
            limit: PageLimit::new(2).unwrap(),
        },
        Answer::Ok,
    );
    let Outcome::InboxListed {
        records,
        next_after,
    } = page
    else {
        panic!("a page");
    };
    let ids: Vec<&str> = records.iter().map(|r| r.offer.offer_id.as_str()).collect();
    assert_eq!(ids, ["offer-000001", "offer-000002"]);
    assert_eq!(
        next_after.as_ref().map(OfferId::as_str),
        Some("offer-000002")
    );
    assert!(PageLimit::new(65).is_err());
    assert!(PageLimit::new(64).is_ok());
}

/// A failed Pull keeps its claim and backs off (full jitter below the 1 s base for the first
/// attempt; here the longest: 999 ms). Before the backoff ends a Pull sends nothing; after a
/// restart the retry reuses the same offer id and token, is accepted, and the claim is cleared.
#[test]
fn keeps_one_stable_claim_through_transport_loss_bounded_backoff_and_restart() {
    let mut sim = after_one_failed_pull();
    assert_eq!(
        sim.take_trail(),
        lines(&[
            "tick 1000",
            "list-inbox",
            "read-claim",
            "draw-entropy",
            "persist-claim r0",
            "post offers",
            "draw-entropy",
            "persist-claim r1",
        ])
    );
    let first = claim(&sim).unwrap();
    assert_eq!(first.attempt_count, 1);
    assert_eq!(
        first.next_attempt_at_ms,
        ms(1_000 + 999),
        "now + floor(r · 1000)"
    );
    // Restart inside the backoff window: the Pull reads the claim and sends nothing.
    sim.advance_to(ms(1_500));
    sim.crash();
    sim.run(3);
    assert_eq!(
        sim.take_trail(),
        lines(&[
            "crash",
            "tick 1500",
            "post register",
            "tick 1500",
            "list-inbox",
            "tick 1500",
            "list-inbox",
            "read-claim",
        ])
    );
    // After the backoff: the same claim (offer id, token) is retried and accepted.
    sim.run(1);
    let trail = normalized(&sim.take_trail());
    assert_eq!(
        &trail[..9],
        lines(&[
            "tick 3500",
            "list-inbox",
            "read-claim",
            "read-record (claim)",
            "persist-claim r2",
            "post offers",
            "read-record o1",
            "persist-record o1 r0 accepted",
            "clear-claim r2",
        ])
        .as_slice()
    );
    let record = sim.world.disk.record(&the_offer(&sim)).unwrap();
    assert_eq!(record.offer.offer_id, first.offer_id);
    assert_eq!(record.offer.lease_token, first.lease_token);
    assert!(sim.world.disk.claim.is_none());
}

/// A replay the control plane fences (409 `worker_offer_fenced`: the lease it held for the
/// claim's offer id expired or moved on while the answers were lost) can never be admitted, and
/// the claim's offer is not in the inbox (checked just before): the claim is cleared at once, with
/// no backoff, and the next Pull claims afresh. The reference keeps such a claim through its 16
/// attempts with backoff up to 60 s, taking no work for minutes (`docs/reliability.md`, "A
/// hostile network"). Any other 409 keeps the claim and backs off as before.
#[test]
fn a_replay_fenced_by_the_control_plane_clears_the_claim_and_the_next_pull_claims_afresh() {
    use ql_worker_core::io::HttpFailure;
    let fence = |code: Option<&str>| {
        Outcome::Http(HttpFailure::Status {
            status: 409,
            code: code.map(String::from),
        })
    };
    let replay_until_post = |sim: &mut Sim| sim.answer_until(|a| act::kind(a) == "post");
    let mut sim = after_one_failed_pull();
    let first = claim(&sim).unwrap();
    sim.take_trail();

    // A 409 without a code, then another fence code (the Session's): the claim is kept and
    // backed off each time.
    for (code, revision) in [(None, 2), (Some("worker_session_fenced"), 4)] {
        replay_until_post(&mut sim);
        sim.deliver(fence(code));
        sim.settle();
        let trail = normalized(&sim.take_trail());
        let (attempt, backoff) = (
            format!("persist-claim r{revision}"),
            format!("persist-claim r{}", revision + 1),
        );
        assert_eq!(
            trail[trail.len() - 6..],
            lines(&[
                "read-claim",
                "read-record (claim)",
                &attempt,
                "post offers",
                "draw-entropy",
                &backoff,
            ]),
            "{code:?}"
        );
        assert_eq!(claim(&sim).unwrap().offer_id, first.offer_id, "kept");
    }

    // `worker_offer_fenced`: cleared at once, no entropy drawn for a backoff.
    replay_until_post(&mut sim);
    sim.deliver(fence(Some("worker_offer_fenced")));
    sim.settle();
    let trail = normalized(&sim.take_trail());
    assert_eq!(
        trail[trail.len() - 5..],
        lines(&[
            "read-claim",
            "read-record (claim)",
            "persist-claim r6",
            "post offers",
            "clear-claim r6",
        ])
    );
    assert!(claim(&sim).is_none() && sim.world.disk.records.is_empty());

    // The next Pull makes a fresh claim and admits the Run.
    sim.run(1);
    let trail = normalized(&sim.take_trail());
    assert_eq!(
        trail.iter().filter(|l| *l == "post offers").count(),
        1,
        "one Pull after the fenced one: {trail:#?}"
    );
    let record = sim.world.disk.record(&the_offer(&sim)).unwrap();
    assert_ne!(record.offer.offer_id, first.offer_id, "a fresh claim");
    sim.assert_no_violations();
}

/// A started Worker whose first four `offers` calls of its claim get `answers`, each backoff
/// the longest jitter (the entropy draws after the claim's identity all `0xff`).
fn failing_claim(answers: [Answer; 4]) -> Sim {
    let mut sim = started(World::one_offer(1));
    for answer in answers {
        sim.on(On::Post(Operation::Offers), answer);
    }
    sim.on(On::Kind("draw-entropy"), Answer::Ok);
    for _ in answers {
        sim.on(On::Kind("draw-entropy"), Answer::EntropyVariant);
    }
    sim
}

/// The time of a trail's `tick` line.
fn tick_of(line: &str) -> Option<u64> {
    line.strip_prefix("tick ").map(|t| t.parse().unwrap())
}

/// Runs until the claim's offer is stored; the trail since the last taken (normalized) and the
/// time of the tick that replayed the claim, after a Session exchange was answered.
fn replayed_after_a_heartbeat(sim: &mut Sim) -> (Vec<String>, u64) {
    for _ in 0..100 {
        if !sim.world.disk.records.is_empty() {
            break;
        }
        sim.run(1);
    }
    let trail = normalized(&sim.take_trail());
    let replay = trail.iter().position(|l| l == "post offers");
    let heartbeat = trail.iter().position(|l| l == "post heartbeat");
    let (Some(replay), Some(heartbeat)) = (replay, heartbeat) else {
        panic!("no replay or no Session answer: {trail:#?}");
    };
    assert!(
        heartbeat < replay,
        "a Session answer came first: {trail:#?}"
    );
    let at = trail[..replay]
        .iter()
        .rev()
        .find_map(|l| tick_of(l))
        .unwrap();
    (trail, at)
}

/// An `offers` answer lost after the control plane leased a Run (an uncertain outcome) leaves
/// a claim that may hold that lease, and the claim's backoff (full jitter, up to 60 s) may
/// outlast it (30 s by default). The next Session answer shows the plane reachable again: the
/// claim is replayed at the next tick, before its backoff ends, and recovers the Run
/// (`lease_recovery`, the same offer id). Transport failures that cannot have taken effect
/// before it were waited out in full.
#[test]
fn a_claim_that_may_hold_a_lease_is_replayed_once_the_session_answers_again() {
    let mut sim = failing_claim([
        Answer::Unavailable,
        Answer::Unavailable,
        Answer::Unavailable,
        Answer::LostAfterCommit,
    ]);
    // Three failures that cannot have taken effect, then the lost answer: 4 attempts.
    let mut rounds = 0;
    while claim(&sim).is_none_or(|c| c.attempt_count < 4 || sim.world.plane.runs.is_empty()) {
        sim.run(1);
        rounds += 1;
        assert!(rounds < 50, "{:#?}", sim.take_trail());
    }
    let kept = claim(&sim).unwrap();
    let backoff_ends = kept.next_attempt_at_ms;
    let trail = sim.take_trail();
    let lost_at = trail.iter().rev().find_map(|l| tick_of(l)).unwrap();
    assert!(
        backoff_ends > ms(lost_at + 7_000),
        "the longest jitter of the 4th attempt (< 8 s): {backoff_ends} after tick {lost_at}"
    );
    assert!(sim.world.disk.records.is_empty());

    let (trail, replayed_at) = replayed_after_a_heartbeat(&mut sim);
    assert!(
        ms(replayed_at) < backoff_ends,
        "replayed at {replayed_at}, before the backoff's end {backoff_ends}: {trail:#?}"
    );
    let record = sim.world.disk.record(&kept.offer_id).unwrap();
    assert_eq!(
        record.offer.lease_token, kept.lease_token,
        "the leased Run, recovered"
    );
    assert_eq!(trail.iter().filter(|l| *l == "post offers").count(), 1);
    sim.assert_no_violations();
}

/// A claim whose failures cannot have taken effect (no connection: nothing was leased) waits its
/// backoff out even when a Session exchange is answered meanwhile: only an uncertain outcome
/// lets a Session answer cut the backoff short
/// (`a_claim_that_may_hold_a_lease_is_replayed_once_the_session_answers_again`).
#[test]
fn a_claim_whose_failures_took_no_effect_waits_its_backoff_out() {
    let mut sim = failing_claim([Answer::Unavailable; 4]);
    let mut rounds = 0;
    while claim(&sim).is_none_or(|c| c.attempt_count < 4 || c.next_attempt_at_ms <= sim.now) {
        sim.run(1);
        rounds += 1;
        assert!(rounds < 50, "{:#?}", sim.take_trail());
    }
    let backoff_ends = claim(&sim).unwrap().next_attempt_at_ms;
    sim.take_trail();
    let (trail, replayed_at) = replayed_after_a_heartbeat(&mut sim);
    assert!(
        ms(replayed_at) >= backoff_ends,
        "replayed at {replayed_at}, not before the backoff's end {backoff_ends}: {trail:#?}"
    );
    sim.assert_no_violations();
}

/// A claim's backoff is waited out on the monotonic clock where the Pull persisted it: a wall
/// clock stepped an hour back meanwhile does not make the retry compare the persisted
/// wall-clock end (now an hour away) and wait again.
#[test]
fn a_claims_backoff_is_waited_out_on_the_monotonic_clock_across_a_wall_clock_step_back() {
    let mut sim = after_one_failed_pull();
    let kept = claim(&sim).unwrap();
    assert!(kept.next_attempt_at_ms > sim.now, "a backoff persisted");
    let stepped_at = sim.now;
    sim.step_wall_clock(-3_600_000);
    let mut rounds = 0;
    while sim.world.disk.records.is_empty() {
        sim.run(1);
        rounds += 1;
        assert!(rounds < 20, "{:#?}", sim.take_trail());
    }
    let replayed = sim.world.disk.record(&kept.offer_id).unwrap();
    assert_eq!(
        replayed.offer.lease_token, kept.lease_token,
        "the claim's replay"
    );
    assert!(
        sim.now <= stepped_at.saturating_add(3_000),
        "stored {} ms after the step (backoff < 1 s, ticks every 2 s)",
        sim.now.get() - stepped_at.get()
    );
    sim.assert_no_violations();
}

fn offered(offer_id: OfferId, generation: WorkerGeneration) -> Outcome {
    let offer = testkit::offer(1);
    let mut worker = testkit::worker();
    worker.generation = generation;
    let response = OfferResponse::Offered {
        offer: Box::new(OfferedOffer {
            offer_id,
            delivery_kind: offer.delivery_kind,
            execution_digest: offer.execution_digest,
            candidate: offer.candidate.clone(),
            worker,
            lease: OfferedLease {
                version: offer.lease.version,
                lease_generation: offer.lease.lease_generation,
                acquired_at_ms: ms(1_000),
                renewed_at_ms: ms(1_000),
                expires_at_ms: ms(31_000),
                updated_at_ms: ms(1_000),
            },
            execution_revision: offer.execution_revision.clone(),
            placement_score: 0,
        }),
        stats: OfferStats::default(),
        truncated: false,
    };
    Outcome::Responded(response.to_json())
}

/// The offer is durable before the claim is cleared (record write, then clear); an offer for
/// another offer id than the claim's (target drift) is refused: nothing is stored, the claim is
/// kept with a backoff.
#[test]
fn writes_the_inbox_before_clearing_the_pending_claim_and_rejects_target_drift() {
    let mut sim = started(World::one_offer(1));
    sim.run(1);
    assert_run(
        &sim.take_trail(),
        &[
            "post offers",
            "read-record o1",
            "persist-record o1 r0 accepted",
            "clear-claim r0",
        ],
    );

    let mut drift = started(World::one_offer(1));
    drift.tick();
    while drift.act().is_some_and(|a| act::kind(a) != "post") {
        drift.answer(Answer::Ok);
    }
    let generation = testkit::worker().generation;
    drift.deliver(offered(OfferId::new("another-offer").unwrap(), generation));
    drift.settle();
    assert_eq!(
        drift.take_trail(),
        lines(&[
            "tick 1000",
            "list-inbox",
            "read-claim",
            "draw-entropy",
            "persist-claim r0",
            "post offers",
            "draw-entropy",
            "persist-claim r1",
        ])
    );
    assert!(drift.world.disk.records.is_empty());
    assert_eq!(claim(&drift).unwrap().revision, Revision::new(1).unwrap());
}

/// An offer bound to another Session generation than the claim's (the Session changed while the
/// request was in flight) is not admitted: nothing is stored and the claim is kept, backing off.
/// Deliberate difference: a *stored* claim of another Session is cleared at the next Pull
/// (it can never be admitted), where the reference fails with `claim_conflict` forever.
#[test]
fn retains_the_old_claim_without_accepting_when_the_current_session_changes() {
    let mut sim = started(World::one_offer(1));
    sim.tick();
    while sim.act().is_some_and(|a| act::kind(a) != "post") {
        sim.answer(Answer::Ok);
    }
    let kept = claim(&sim).unwrap();
    sim.deliver(offered(
        kept.offer_id.clone(),
        WorkerGeneration::new(3).unwrap(),
    ));
    sim.settle();
    assert_eq!(
        &sim.take_trail()[5..],
        lines(&["post offers", "draw-entropy", "persist-claim r1"]).as_slice()
    );
    assert!(sim.world.disk.records.is_empty(), "nothing accepted");
    let after = claim(&sim).unwrap();
    assert_eq!(
        (&after.offer_id, &after.lease_token),
        (&kept.offer_id, &kept.lease_token)
    );

    // A stored claim of an older Session generation is cleared, then a fresh claim is made.
    let mut world = World::one_offer(1);
    let mut old = testkit::worker();
    old.generation = WorkerGeneration::new(1).unwrap();
    world.disk.put_claim(PendingClaim::new(
        &old,
        testkit::offer_id(9),
        testkit::lease_token(9),
        ms(500),
    ));
    let mut sim = started(world);
    sim.run(1);
    assert_eq!(
        &sim.take_trail()[..6],
        lines(&[
            "tick 1000",
            "list-inbox",
            "read-claim",
            "clear-claim r0",
            "draw-entropy",
            "persist-claim r0",
        ])
        .as_slice()
    );
}

/// The claimed offer with `edit` applied to its JSON (the digest is left as it was).
fn offered_edited(offer_id: OfferId, edit: impl FnOnce(&mut serde_json::Value)) -> Outcome {
    let Outcome::Responded(body) = offered(offer_id, testkit::worker().generation) else {
        unreachable!()
    };
    let mut value: serde_json::Value = serde_json::from_slice(&body).unwrap();
    edit(&mut value);
    Outcome::Responded(serde_json::to_vec(&value).unwrap())
}

/// An offer refused for a reason its claim cannot change (here a revision field this Worker does
/// not know, as a newer control plane might send) is refused at once: the claim is cleared after
/// the first verdict (no backoff, nothing stored), a notice names the offer and the rule, and the
/// very next Pull makes a fresh claim and admits the good offer behind it. The reference keeps
/// such a claim through 16 attempts with backoff, pulling nothing else meanwhile.
#[test]
fn refuses_a_deterministically_bad_offer_at_once_and_admits_the_next_good_one_at_the_next_pull() {
    let mut sim = started(World::one_offer(1));
    sim.tick();
    while sim.act().is_some_and(|a| act::kind(a) != "post") {
        sim.answer(Answer::Ok);
    }
    let bad = claim(&sim).unwrap();
    sim.deliver(offered_edited(bad.offer_id.clone(), |v| {
        v["offer"]["executionRevision"]["retryPolicy"] = serde_json::json!({"attempts": 3});
    }));
    sim.settle();
    assert_eq!(
        sim.take_trail(),
        lines(REFUSED_AT_THE_FIRST_PULL),
        "the claim is cleared after the first verdict, without a backoff"
    );
    assert!(claim(&sim).is_none() && sim.world.disk.records.is_empty());
    let notices: Vec<_> = sim.worker.drain_notices().collect();
    match notices.as_slice() {
        [ql_worker_core::worker::Notice::OfferRefused { offer_id, reason }] => {
            assert_eq!(offer_id, &bad.offer_id);
            let text = format!("{}", notices[0]);
            assert!(text.contains("unknown field") && text.contains(bad.offer_id.as_str()));
            assert!(ql_worker_core::pull::refused_for_good(reason));
        }
        other => panic!("one refusal notice expected: {other:?}"),
    }
    assert_eq!(sim.worker.drain_notices().count(), 0, "drained");

    // The next Pull (the next tick, at the cadence) claims afresh and admits the good offer.
    sim.run(1);
    let trail = sim.take_trail();
    assert_run(
        &trail,
        &[
            "read-claim",
            "draw-entropy",
            "persist-claim r0",
            "post offers",
            "read-record o1",
            "persist-record o1 r0 accepted",
            "clear-claim r0",
        ],
    );
    assert_eq!(
        trail.iter().filter(|l| *l == "post offers").count(),
        1,
        "one Pull after the refused one: {trail:#?}"
    );
    let record = sim.world.disk.record(&the_offer(&sim)).unwrap();
    assert_ne!(record.offer.offer_id, bad.offer_id, "a fresh claim");
    sim.assert_no_violations();
}

/// Refused for good: verdicts on what the control plane pins for the Run. Kept and retried with
/// a backoff: everything that may change between two answers for the same claim.
#[test]
fn only_verdicts_on_the_pinned_revision_and_candidate_clear_the_claim() {
    use ql_worker_core::pull::refused_for_good;
    use ql_worker_core::wire::offer::OfferResponse;
    let id = testkit::offer_id(1);
    let verdict = |edit: fn(&mut serde_json::Value)| {
        let Outcome::Responded(body) = offered_edited(id.clone(), edit) else {
            unreachable!()
        };
        OfferResponse::parse(&body).unwrap_err()
    };
    for (label, edit) in [
        (
            "bad range",
            (|v: &mut serde_json::Value| {
                v["offer"]["executionRevision"]["placement"] =
                    serde_json::json!({"required": {"protocolVersionRange": "latest"}});
            }) as fn(&mut serde_json::Value),
        ),
        ("digest drift", |v| {
            v["offer"]["executionRevision"]["command"]["args"] = serde_json::json!(["drift"]);
        }),
        ("task revision", |v| {
            v["offer"]["executionRevision"]["sourceRevision"] = serde_json::json!(2);
        }),
        ("execution digest", |v| {
            v["offer"]["executionDigest"] = serde_json::json!("0".repeat(64));
        }),
        ("candidate id", |v| {
            v["offer"]["candidate"]["runId"] = serde_json::json!("");
        }),
    ] {
        let e = verdict(edit);
        assert!(refused_for_good(&e), "{label}: {e}");
    }
    for (label, edit) in [
        (
            "lease timing",
            (|v: &mut serde_json::Value| {
                v["offer"]["lease"]["expiresAtMs"] = serde_json::json!(1);
            }) as fn(&mut serde_json::Value),
        ),
        ("stats", |v| {
            v["stats"]["pages"] = serde_json::json!(17);
        }),
        ("envelope key", |v| {
            v["extra"] = serde_json::json!(1);
        }),
        ("schema", |v| {
            v["schema"] = serde_json::json!("qinglong/remote-execution-offer@v2");
        }),
    ] {
        let e = verdict(edit);
        assert!(!refused_for_good(&e), "{label}: {e}");
    }
}

/// The claim's offer id is a version-4, variant-1 UUID made from the first 16 drawn bytes,
/// whatever they are: all zero and all one bytes give exactly these ids. (Kills the `&`/`|`
/// mutants of `uuid_v4`; the `|` → `^` ones are equivalent: the masked byte never has the bit
/// that is set. docs/mutation.md.)
#[test]
fn the_claims_offer_id_is_a_version_4_uuid_of_the_drawn_bytes() {
    for (byte, expected) in [
        (0x00, "00000000-0000-4000-8000-000000000000"),
        (0xff, "ffffffff-ffff-4fff-bfff-ffffffffffff"),
    ] {
        let mut sim = started(World::one_offer(1));
        sim.tick();
        let mut seen = Vec::new();
        while let Some(action) = sim.act() {
            seen.push(act::kind(action));
            if act::kind(action) == "draw-entropy" {
                break;
            }
            assert!(seen.len() < 10, "no draw came: {seen:?}");
            sim.answer(Answer::Ok);
        }
        sim.deliver(Outcome::EntropyDrawn(
            ql_worker_core::capability::Entropy::new([byte; 64]),
        ));
        match sim.act() {
            Some(Action::PersistClaim { claim, .. }) => {
                assert_eq!(claim.offer_id.as_str(), expected);
            }
            other => panic!("expected the claim's publication, got {other:?}"),
        }
    }
}

/// Each retry of a claim counts one more attempt, and its backoff ceiling doubles: the second
/// failed attempt backs off up to 2 × the 1 s base (here the longest jitter: 1999 ms). (Kills
/// the `+=` → `*=` mutant of the attempt count and the `<<` → `>>` mutant of the backoff
/// ceiling; docs/mutation.md.)
#[test]
fn a_retried_claim_counts_its_attempts_and_doubles_its_backoff_ceiling() {
    let mut sim = started(World::one_offer(1));
    sim.on(On::Post(Operation::Offers), Answer::Unavailable);
    sim.on(On::Post(Operation::Offers), Answer::Unavailable);
    sim.on(On::Kind("draw-entropy"), Answer::Ok);
    sim.on(On::Kind("draw-entropy"), Answer::EntropyVariant);
    sim.on(On::Kind("draw-entropy"), Answer::EntropyVariant);
    sim.run(1);
    let first = claim(&sim).expect("the claim is kept");
    assert_eq!(first.attempt_count, 1);
    assert_eq!(first.next_attempt_at_ms, ms(1_000 + 999));
    sim.advance_to(ms(5_000));
    sim.run(1);
    let second = claim(&sim).expect("the claim is kept");
    assert_eq!(second.offer_id, first.offer_id, "the same claim");
    assert_eq!(second.attempt_count, 2, "one more attempt");
    let at = second.updated_at_ms.get();
    assert_eq!(
        second.next_attempt_at_ms,
        ms(at + 1_999),
        "floor(r · min(60 s, 1000 · 2^(2 - 1)))"
    );
}

/// The notices the driver has not taken are bounded: past 64 the oldest is dropped, so a
/// driver that never takes them keeps the 64 newest, in order (`worker::MAX_NOTICES`).
#[test]
fn notices_not_taken_keep_the_newest_sixty_four() {
    let mut sim = started(World::new(1, Vec::new()));
    let mut refused = Vec::new();
    for _ in 0..66 {
        for _ in 0..50 {
            match sim.act() {
                Some(action) if act::is_post(action, Operation::Offers) => break,
                Some(_) => sim.answer(Answer::Ok),
                None => {
                    if let testkit::sim::Status::Idle(Some(wake)) = sim.status {
                        sim.advance_to(wake);
                    }
                    sim.tick();
                }
            }
        }
        let bad = claim(&sim).expect("a Pull is outstanding");
        refused.push(bad.offer_id.clone());
        sim.deliver(offered_edited(bad.offer_id, |v| {
            v["offer"]["executionRevision"]["retryPolicy"] = serde_json::json!({"attempts": 3});
        }));
        sim.settle();
    }
    let kept: Vec<OfferId> = sim
        .worker
        .drain_notices()
        .map(|notice| match notice {
            ql_worker_core::worker::Notice::OfferRefused { offer_id, .. } => offer_id,
        })
        .collect();
    assert_eq!(kept, refused[2..]);
}

/// A Pull that failed before it could compare the claim's persisted backoff (its read of the
/// claim failed, nothing changed) has waited nothing out: the next Pull still honours that
/// backoff and sends nothing before it ends.
#[test]
fn a_pull_that_failed_to_read_the_claim_still_honours_its_persisted_backoff() {
    let mut sim = after_one_failed_pull();
    // As an earlier incarnation left it after six failed attempts: the next one at 30 s.
    let (stored, _) = sim.world.disk.claim.as_mut().unwrap();
    stored.attempt_count = 6;
    stored.next_attempt_at_ms = ms(30_000);
    // A restart inside the backoff window; its first Pull cannot read the claim.
    sim.advance_to(ms(1_200));
    sim.crash();
    sim.run(2);
    sim.take_trail();
    sim.on(On::Kind("read-claim"), Answer::Unchanged);
    sim.run(1);
    assert_eq!(
        sim.take_trail(),
        lines(&["tick 1200", "list-inbox", "read-claim"])
    );
    // Still inside the backoff window: the next Pull reads the claim and sends nothing.
    sim.run(1);
    assert_eq!(
        sim.take_trail(),
        lines(&["tick 3200", "list-inbox", "read-claim"]),
        "the persisted backoff (until 30 s) holds the retry"
    );
    assert_eq!(claim(&sim).unwrap().attempt_count, 6, "no attempt spent");
}

/// An offer whose pinned execution digest is not its revision's is refused for good: the claim
/// is cleared, nothing is stored (the world's `refused-offer-stored` check), the control plane
/// keeps its lease until it expires by itself, and the next Pull takes the next Run.
#[test]
fn an_offer_pinned_to_another_digest_is_refused_and_stores_nothing() {
    let world = World::new(1, vec![OfferTemplate::refused(1), OfferTemplate::sample(2)]);
    let mut sim = started(world);
    sim.run(1);
    assert_eq!(sim.take_trail(), lines(REFUSED_AT_THE_FIRST_PULL));
    assert!(sim.world.disk.records.is_empty(), "nothing stored");
    assert!(claim(&sim).is_none(), "the claim is cleared");
    let refused = sim.world.plane.runs.values().next().unwrap();
    assert_eq!(
        refused.status,
        CpStatus::Leased,
        "its lease expires by itself"
    );
    assert_eq!(sim.world.plane.refusable_delivered, 1);
    sim.run(1);
    let record = sim.first_record();
    assert_eq!(record.offer.candidate.run_id.as_str(), "run-2");
    sim.assert_no_violations();
}
