//! Issue 17: one lost or garbled answer never costs a Run or the Session. Each scenario puts one
//! uncertain outcome (the control plane committed, the answer was lost; or a 200 that is not the
//! contract's JSON; or a status that is neither 200 nor an error) on one operation, against the
//! simulated host whose control plane fences stale lease and Session versions as the
//! reference's does, and asserts the exact commands and what the Worker concluded.

use ql_worker_core::facts::Fact;
use ql_worker_core::io::{Action, HttpFailure, Outcome};
use ql_worker_core::processor::ProcessResult;
use ql_worker_core::record::State;
use ql_worker_core::wire::route::Operation;
use ql_worker_core::worker::StopReason;
use ql_worker_sim::testkit::act;
use ql_worker_sim::testkit::sim::{On, Sim, Status};
use ql_worker_sim::testkit::world::{
    Answer, Event, OfferTemplate, ProcessState, ReceiptKind, World,
};
use ql_worker_sim::testkit::{self};

/// The `expectedLeaseVersion` of every POST to `operation`, in order.
fn expected_versions(sim: &Sim, operation: Operation) -> Vec<u64> {
    sim.stream
        .iter()
        .flatten()
        .filter_map(|a| match a {
            Action::Post(call) if act::operation(call) == operation => {
                let v: serde_json::Value = serde_json::from_slice(&call.body).unwrap();
                v["expectedLeaseVersion"].as_u64()
            }
            Action::UploadLog { header, .. } if operation == Operation::Artifacts => {
                let v: serde_json::Value = serde_json::from_slice(header).unwrap();
                v["expectedLeaseVersion"].as_u64()
            }
            _ => None,
        })
        .collect()
}

fn count(sim: &Sim, line: &str) -> usize {
    sim.commands().iter().filter(|l| *l == line).count()
}

fn assert_running(sim: &Sim) {
    assert!(
        matches!(sim.status, Status::Idle(_) | Status::Busy),
        "the Worker must keep running: {:?}\n{:#?}",
        sim.status,
        sim.commands()
    );
    sim.assert_no_violations();
}

/// A renewal the control plane committed but whose answer was lost leaves the plane at v + 1.
/// The next pass asks at v, is fenced, asks once more at v + 1, and persists the lease the
/// control plane then renews (v + 2). The Run keeps its lease and is never stopped.
#[test]
fn a_renewal_whose_answer_was_lost_is_caught_up_one_version_on() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.on(On::Post(Operation::LeaseControl), Answer::LostAfterCommit);
    sim.run(1);
    assert_eq!(
        sim.first_record().offer.lease.version.get(),
        0,
        "nothing durable"
    );
    sim.run(1);
    assert_eq!(
        expected_versions(&sim, Operation::LeaseControl),
        vec![0, 0, 1],
        "{:#?}",
        sim.commands()
    );
    let record = sim.first_record();
    assert_eq!(record.state, State::RunningAcknowledged);
    assert_eq!(record.offer.lease.version.get(), 2);
    assert!(
        sim.world
            .supervisor
            .processes
            .iter()
            .any(|p| p.state == ProcessState::Running)
    );
    assert_eq!(count(&sim, "stop o1"), 0);
    assert_running(&sim);
}

/// The same after a garbled answer (a 200 that is not the contract's JSON) and after an answer
/// with a status that is neither 200 nor an error (201, 302): each may have renewed the lease.
#[test]
fn a_garbled_or_odd_status_renewal_answer_is_uncertain_and_caught_up() {
    let odds: [fn() -> Outcome; 5] = [
        || Outcome::Responded(b"not json".to_vec()),
        || Outcome::Responded(b"{\"schema\":\"qinglong/remote-worker-lease-control@v1\"}".to_vec()),
        || {
            Outcome::Http(HttpFailure::Status {
                status: 201,
                code: None,
            })
        },
        || {
            Outcome::Http(HttpFailure::Status {
                status: 302,
                code: None,
            })
        },
        || Outcome::Http(HttpFailure::Uncertain),
    ];
    for odd in odds {
        let mut sim = Sim::holding(State::RunningAcknowledged);
        sim.advance_to(sim.now.saturating_add(1));
        sim.tick();
        // Answer until the lease-control call, commit it at the control plane, then hand the
        // Worker the odd outcome instead of the answer.
        loop {
            let Some((_, action)) = sim.pending.clone() else {
                panic!("no lease-control call: {:#?}", sim.commands());
            };
            if act::is_post(&action, Operation::LeaseControl) {
                let _ = sim.world.perform(sim.now, &action, Answer::Ok);
                sim.deliver(odd());
                break;
            }
            sim.answer(Answer::Ok);
        }
        sim.settle();
        sim.run(1);
        assert_eq!(
            expected_versions(&sim, Operation::LeaseControl),
            vec![0, 0, 1],
            "{:?}: {:#?}",
            odd(),
            sim.commands()
        );
        assert_eq!(
            sim.first_record().offer.lease.version.get(),
            2,
            "{:?}",
            odd()
        );
        assert_running(&sim);
    }
}

/// Only a second fence (at v + 1 too) leaves the lease to its local expiry: nothing is
/// persisted, nothing stopped, and the next pass asks again.
#[test]
fn a_second_fence_is_not_retried_again_in_the_same_pass() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.on(On::Post(Operation::LeaseControl), Answer::Fenced);
    sim.on(On::Post(Operation::LeaseControl), Answer::Fenced);
    sim.run(1);
    assert_eq!(expected_versions(&sim, Operation::LeaseControl), vec![0, 1]);
    assert_eq!(sim.first_record().offer.lease.version.get(), 0);
    assert_eq!(count(&sim, "stop o1"), 0);
    sim.run(1);
    assert_eq!(
        expected_versions(&sim, Operation::LeaseControl),
        vec![0, 1, 0]
    );
    assert_eq!(sim.first_record().offer.lease.version.get(), 1);
    assert_running(&sim);
}

/// A Run whose renewal the control plane committed (its lease at 1) but whose answer was lost
/// (the record says 0), and whose process then exited with a genuine receipt.
fn exited_after_a_lost_renewal() -> Sim {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.on(On::Post(Operation::LeaseControl), Answer::LostAfterCommit);
    sim.run(1);
    sim.event(Event::Exit {
        index: 0,
        code: 0,
        receipt: ReceiptKind::Genuine,
    });
    sim
}

/// A renewal the control plane committed but whose answer was lost leaves its lease at 1 while
/// the record says 0. The completion pass's upload at 0 is fenced (the reference authorizes the
/// fence before it takes the content); it is sent once more at 1, and the completion names 1.
#[test]
fn a_completion_after_a_lost_renewal_uploads_and_completes_one_version_on() {
    let mut sim = exited_after_a_lost_renewal();
    sim.run(1);
    assert_eq!(
        expected_versions(&sim, Operation::Artifacts),
        vec![0, 1],
        "{:#?}",
        sim.commands()
    );
    assert_eq!(expected_versions(&sim, Operation::Completion), vec![1]);
    assert_eq!(sim.first_record().state, State::CompletionAcknowledged);
    assert_running(&sim);
}

/// Found by the hostile-network test once lanes ran renewals beside uploads: the completion
/// commits one version past the persisted lease (after a lost renewal) and its answer is lost.
/// The control plane has completed the Run under that version and takes only an exact replay
/// under it, upload included. The next pass's upload at 0 is fenced and replayed at 1
/// (`already_stored`), and the completion names 1 (`already_completed`): the Run is
/// acknowledged. Before, the fenced upload ended the pass, lease control answered `terminal`,
/// the replay was fenced the same way, and the Run went `recovery_required(control_plane_terminal)`
/// with the Worker taking no more work.
#[test]
fn a_completion_committed_one_version_on_is_replayed_under_that_version() {
    let mut sim = exited_after_a_lost_renewal();
    sim.on(On::Post(Operation::Completion), Answer::LostAfterCommit);
    sim.run(2);
    assert_eq!(
        expected_versions(&sim, Operation::Artifacts),
        vec![0, 1, 0, 1],
        "{:#?}",
        sim.commands()
    );
    assert_eq!(
        expected_versions(&sim, Operation::Completion),
        vec![1, 1],
        "{:#?}",
        sim.commands()
    );
    assert_eq!(sim.first_record().state, State::CompletionAcknowledged);
    assert_eq!(count(&sim, "stop o1"), 0);
    assert_eq!(
        sim.world
            .plane
            .runs
            .values()
            .filter(|r| r.completion.is_some())
            .count(),
        1
    );
    assert_running(&sim);
}

/// A heartbeat the control plane applied but whose answer was lost leaves the Session one
/// version on: the next heartbeat is fenced (the simulated plane checks the version as the
/// reference does), and the Worker registers the Session again (the reference's resume) without
/// counting the fence. Five such cycles in a row — more than the fences that make a Worker give
/// up on a contested worker id — and the Worker still runs and still takes work.
#[test]
fn uncertain_heartbeats_never_halt_the_worker() {
    let mut sim = Sim::scenario(World::new(1, vec![OfferTemplate::sample(1)]));
    sim.run(2);
    for cycle in 0..5 {
        sim.on(On::Post(Operation::Heartbeat), Answer::LostAfterCommit);
        // Until the lost heartbeat, its fenced successor and the register again went out.
        for _ in 0..40 {
            sim.run(1);
            if count(&sim, "post register") == cycle + 2 {
                break;
            }
        }
        assert_eq!(
            count(&sim, "post register"),
            cycle + 2,
            "cycle {cycle}: {:#?}",
            sim.commands()
        );
        assert_running(&sim);
    }
    // Work goes on: the next Pull admits the queued offer and starts it.
    for _ in 0..10 {
        sim.run(1);
    }
    assert!(
        sim.commands().iter().any(|l| l == "spawn o1"),
        "{:#?}",
        sim.commands()
    );
    assert_running(&sim);
}

/// Plain fences (no uncertain outcome before them) still count: a contested worker id makes the
/// Worker halt after the fences repeat (unchanged behaviour, the contrast to the above).
#[test]
fn plain_fences_in_a_row_still_halt() {
    let mut sim = Sim::scenario(World::new(1, Vec::new()));
    sim.run(2);
    for _ in 0..4 {
        sim.on(On::Post(Operation::Heartbeat), Answer::Fenced);
    }
    for _ in 0..80 {
        sim.run(1);
        if matches!(sim.status, Status::Halted(_)) {
            break;
        }
    }
    assert!(
        matches!(sim.status, Status::Halted(_)),
        "{:?}: {:#?}",
        sim.status,
        sim.commands()
    );
}

/// A register without a usable answer — lost after the control plane applied it, a 302, a
/// 201, a 200 that is not the contract's JSON, a 503 — is retried after a growing backoff, never
/// a halt; the next usable answer registers the Session and work begins.
#[test]
fn a_register_without_a_usable_answer_backs_off_and_never_halts() {
    let odd: [fn() -> Outcome; 5] = [
        || Outcome::Http(HttpFailure::Uncertain),
        || {
            Outcome::Http(HttpFailure::Status {
                status: 302,
                code: None,
            })
        },
        || {
            Outcome::Http(HttpFailure::Status {
                status: 201,
                code: None,
            })
        },
        || Outcome::Responded(b"<html>".to_vec()),
        || {
            Outcome::Http(HttpFailure::Status {
                status: 503,
                code: Some(String::from("worker_ingress_unavailable")),
            })
        },
    ];
    let mut sim = Sim::scenario(World::new(1, Vec::new()));
    let mut sent_at = Vec::new();
    for outcome in &odd {
        // Tick (without answering anything) until the register goes out.
        for _ in 0..200 {
            if sim.pending.is_some() {
                break;
            }
            if let Status::Idle(Some(wake)) = sim.status {
                sim.advance_to(wake);
            }
            sim.tick();
        }
        let registering = sim
            .act()
            .is_some_and(|a| act::is_post(a, Operation::Register));
        assert!(registering, "a register is outstanding: {:?}", sim.pending);
        sent_at.push(sim.now.get());
        sim.deliver(outcome());
        assert_running(&sim);
    }
    let gaps: Vec<u64> = sent_at.windows(2).map(|w| w[1] - w[0]).collect();
    let base = sim.config.backoff_base_ms;
    for (i, gap) in gaps.iter().enumerate() {
        let backoff = base << i;
        assert!(
            *gap >= backoff,
            "register {} went out {gap} ms after the previous one, before its backoff of {backoff} ms: {sent_at:?}",
            i + 2
        );
    }
    // The backoff after the fifth failure is 16 base periods; then the register is answered.
    for _ in 0..40 {
        sim.run(1);
        if sim.commands().iter().any(|l| l == "list-inbox") {
            break;
        }
    }
    assert!(matches!(sim.status, Status::Idle(_)));
    assert!(
        sim.commands().iter().any(|l| l == "list-inbox"),
        "{:#?}",
        sim.commands()
    );
}

/// The Secret batch is a read: an answer lost after the control plane saw it, a 200 that is not
/// the contract's JSON, a 302 and a 201 are retried at the next pass (within the offer's lease),
/// never a start failure; the Run then starts with its Secret value.
#[test]
fn an_unusable_secrets_answer_is_retried_never_a_start_failure() {
    for answer in [
        Answer::LostAfterCommit,
        Answer::Invalid,
        Answer::Unavailable,
    ] {
        let world = World::new(
            1,
            vec![OfferTemplate::with_revision(1, testkit::secret_revision())],
        );
        let mut sim = Sim::scenario(world);
        sim.run(2);
        sim.on(On::Post(Operation::Secrets), answer);
        for _ in 0..6 {
            sim.run(1);
        }
        let commands = sim.commands();
        assert_eq!(
            commands.iter().filter(|l| *l == "post secrets o1").count(),
            2,
            "{answer:?}: {commands:#?}"
        );
        assert!(commands.iter().any(|l| l == "spawn o1"), "{answer:?}");
        assert!(
            !commands.iter().any(|l| l.contains("start-failure")),
            "{answer:?}"
        );
        assert_running(&sim);
    }
    for status in [302, 201] {
        let world = World::new(
            1,
            vec![OfferTemplate::with_revision(1, testkit::secret_revision())],
        );
        let mut sim = Sim::scenario(world);
        sim.run(2);
        sim.advance_to(sim.now.saturating_add(1));
        sim.tick();
        loop {
            let Some((_, action)) = sim.pending.clone() else {
                panic!("no Secrets call: {:#?}", sim.commands());
            };
            if act::is_post(&action, Operation::Secrets) {
                sim.deliver(Outcome::Http(HttpFailure::Status { status, code: None }));
                break;
            }
            sim.answer(Answer::Ok);
        }
        sim.settle();
        for _ in 0..6 {
            sim.run(1);
        }
        let commands = sim.commands();
        assert!(commands.iter().any(|l| l == "spawn o1"), "{status}");
        assert!(
            !commands.iter().any(|l| l.contains("start-failure")),
            "{status}: {commands:#?}"
        );
    }
}

/// A definite refusal of the Secret batch (a fence: the ref does not exist, the digest drifted)
/// is final: a proven start failure, zero spawns.
#[test]
fn a_fenced_secrets_answer_is_a_start_failure() {
    let world = World::new(
        1,
        vec![OfferTemplate::with_revision(1, testkit::secret_revision())],
    );
    let mut sim = Sim::scenario(world);
    sim.run(2);
    sim.on(On::Post(Operation::Secrets), Answer::Fenced);
    for _ in 0..4 {
        sim.run(1);
    }
    let commands = sim.commands();
    assert!(commands.iter().any(|l| l == "post start-failure o1"));
    assert!(!commands.iter().any(|l| l == "spawn o1"));
}

/// A transition to draining the control plane applied unanswered: the next heartbeat is fenced,
/// the Session is registered again (still draining at the control plane), and the drain ends
/// cleanly.
#[test]
fn an_uncertain_transition_still_drains_cleanly() {
    let mut sim = Sim::scenario(World::new(1, Vec::new()));
    sim.run(3);
    sim.on(On::Post(Operation::Transition), Answer::LostAfterCommit);
    sim.request_drain();
    for _ in 0..40 {
        sim.settle();
        if matches!(sim.status, Status::Stopped(_) | Status::Halted(_)) {
            break;
        }
        sim.run(1);
    }
    assert_eq!(
        sim.status,
        Status::Stopped(StopReason::Drained),
        "{:#?}",
        sim.commands()
    );
}

/// The completion was applied but its answer lost; the lease-control call then answers
/// `terminal` (the Run completed — by us) and the completion replay's answer is lost too. That
/// is no proof that the control plane settled the Run otherwise: the pass ends without recovery
/// evidence, and the next one completes the Run (`already_completed`). Found by the
/// hostile-network test (`drivers/tests/e2e_hostile_network.rs`).
#[test]
fn a_lost_completion_replay_answer_is_not_a_control_plane_terminal() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.event(Event::Exit {
        index: 0,
        code: 0,
        receipt: ReceiptKind::Genuine,
    });
    sim.on(On::Post(Operation::Completion), Answer::LostAfterCommit);
    sim.on(On::Post(Operation::Completion), Answer::LostAfterCommit);
    sim.run(1);
    let commands = sim.commands();
    assert_eq!(
        commands
            .iter()
            .filter(|l| *l == "post completion o1")
            .count(),
        2,
        "the completion and its replay after `terminal`: {commands:#?}"
    );
    assert!(commands.iter().any(|l| l == "post lease-control o1"));
    assert_eq!(sim.first_record().state, State::RunningAcknowledged);
    assert_eq!(count(&sim, "stop o1"), 0);
    sim.run(1);
    assert_eq!(sim.first_record().state, State::CompletionAcknowledged);
    assert_running(&sim);
}

/// Two renewals in a row whose answers were lost (the second one the catch-up retry itself)
/// leave the control plane two versions on: the Worker remembers the highest version it may
/// hold and, fenced, asks at each version up to it; the lease is renewed and persisted there.
/// Found by the hostile-network test with 30 Runs (one try at v + 1 was not enough).
#[test]
fn consecutive_lost_renewals_are_caught_up_to_the_highest_version_they_may_have_left() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.on(On::Post(Operation::LeaseControl), Answer::LostAfterCommit);
    sim.run(1);
    // The next pass: fenced at 0, the catch-up at 1 is lost too (the plane is at 2 now).
    sim.on(On::Post(Operation::LeaseControl), Answer::Fenced);
    sim.on(On::Post(Operation::LeaseControl), Answer::LostAfterCommit);
    sim.run(1);
    assert_eq!(sim.first_record().offer.lease.version.get(), 0);
    sim.run(1);
    assert_eq!(
        expected_versions(&sim, Operation::LeaseControl),
        vec![0, 0, 1, 0, 1, 2],
        "{:#?}",
        sim.commands()
    );
    let record = sim.first_record();
    assert_eq!(record.state, State::RunningAcknowledged);
    assert_eq!(record.offer.lease.version.get(), 3);
    assert_eq!(count(&sim, "stop o1"), 0);
    assert_running(&sim);
}

/// A completion replay refused for the Worker's credentials (401, 403) says nothing about who
/// settled the Run: an operator fixes the credentials, and the Run's completion must not be
/// lost meanwhile. The Run is neither stopped nor recorded `recovery_required`; the next pass
/// asks again and, with the credentials back, the replay is acknowledged.
#[test]
fn a_completion_replay_refused_for_credentials_is_asked_again() {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.event(Event::Exit {
        index: 0,
        code: 0,
        receipt: ReceiptKind::Genuine,
    });
    // The first completion commits, its answer is lost; lease control then says `terminal`,
    // and the replay is refused with 401.
    sim.tick();
    let mut completions = 0;
    for _ in 0..100 {
        let Some(action) = sim.act() else { break };
        let completion = act::is_post(action, Operation::Completion);
        match (completion, completions) {
            (true, 0) => sim.answer(Answer::LostAfterCommit),
            (true, _) => sim.deliver(Outcome::Http(HttpFailure::Status {
                status: 401,
                code: None,
            })),
            (false, _) => sim.answer(Answer::Ok),
        }
        completions += usize::from(completion);
    }
    assert_eq!(completions, 2, "{:#?}", sim.commands());
    assert_eq!(sim.first_record().state, State::RunningAcknowledged);
    assert_eq!(count(&sim, "stop o1"), 0, "{:#?}", sim.commands());
    sim.run(1);
    assert_eq!(sim.first_record().state, State::CompletionAcknowledged);
    assert_eq!(count(&sim, "stop o1"), 0);
    assert_running(&sim);
}

/// o1 exits; `on` (its completion or its upload) is fenced twice. The first pass sends it at the
/// persisted version and once more one version on, and no more: the `(artifacts, completion)`
/// versions it sent are `first`. The lease is then renewed (version 1 on the record), and the
/// next pass completes under it, its `on` at version 1.
fn fenced_twice(on: On, operation: Operation, first: (&[u64], &[u64])) {
    let mut sim = Sim::holding(State::RunningAcknowledged);
    sim.event(Event::Exit {
        index: 0,
        code: 0,
        receipt: ReceiptKind::Genuine,
    });
    sim.on(on, Answer::Fenced);
    sim.on(on, Answer::Fenced);
    sim.run(1);
    let sent = (
        expected_versions(&sim, Operation::Artifacts),
        expected_versions(&sim, Operation::Completion),
    );
    assert_eq!(
        (sent.0.as_slice(), sent.1.as_slice()),
        first,
        "{:#?}",
        sim.commands()
    );
    assert_eq!(sim.first_record().state, State::RunningAcknowledged);
    sim.run(1);
    assert_eq!(
        expected_versions(&sim, operation),
        vec![0, 1, 1],
        "{:#?}",
        sim.commands()
    );
    assert_eq!(sim.first_record().state, State::CompletionAcknowledged);
    assert_eq!(sim.first_record().offer.lease.version.get(), 1);
    assert_running(&sim);
}

/// A completion fenced at the persisted lease version (a renewal may have committed without its
/// answer reaching the disk) is sent once more, one version on, in the same pass, and only
/// once: fenced there too, the pass ends, and the next pass completes under the renewed lease.
#[test]
fn a_fenced_completion_is_retried_once_one_version_on() {
    fenced_twice(
        On::Post(Operation::Completion),
        Operation::Completion,
        (&[0], &[0, 1]),
    );
}

/// An upload fenced at the persisted version is sent once more one version on; fenced there
/// too, it is not sent again in that pass, and no completion goes out without a stored log; the
/// next pass uploads and completes under the renewed lease.
#[test]
fn an_upload_fenced_after_its_catch_up_ends_the_pass() {
    fenced_twice(On::Kind("upload-log"), Operation::Artifacts, (&[0, 1], &[]));
}

/// After a lost renewal the upload is caught up one version on, and the completion names that
/// version. Fenced there, it is not sent a third time at yet another version: the catch-up is
/// spent for this pass.
#[test]
fn a_completion_fenced_after_its_upload_caught_up_is_not_retried_again() {
    let mut sim = exited_after_a_lost_renewal();
    sim.on(On::Post(Operation::Completion), Answer::Fenced);
    sim.run(1);
    assert_eq!(expected_versions(&sim, Operation::Artifacts), vec![0, 1]);
    assert_eq!(
        expected_versions(&sim, Operation::Completion),
        vec![1],
        "{:#?}",
        sim.commands()
    );
    assert_eq!(sim.first_record().state, State::RunningAcknowledged);
    assert_eq!(count(&sim, "stop o1"), 0);
    assert_running(&sim);
}

/// A garbled `offers` answer (a 200 that is not the contract's JSON) may hide an offer the
/// control plane made under this claim: the claim is kept for its retry, never cleared as
/// refused for good, and the retry (after its backoff) gets the offer, which runs.
#[test]
fn a_garbled_offers_answer_keeps_its_claim_for_the_retry() {
    let mut sim = Sim::scenario(World::one_offer(1));
    sim.on(On::Post(Operation::Offers), Answer::Invalid);
    for _ in 0..6 {
        if !sim.commands().iter().any(|l| l == "post offers") {
            sim.run(1);
        }
    }
    let commands = sim.commands();
    let posted = commands
        .iter()
        .position(|l| l == "post offers")
        .unwrap_or_else(|| panic!("no Pull: {commands:#?}"));
    assert!(
        !commands[posted..]
            .iter()
            .any(|l| l.starts_with("clear-claim")),
        "{commands:#?}"
    );
    let (claim, _) = sim.world.disk.claim.clone().expect("the claim is kept");
    assert_eq!(claim.attempt_count, 1);
    for _ in 0..10 {
        if sim.world.disk.records.is_empty() {
            let at = sim.now.saturating_add(5_000);
            sim.advance_to(at);
            sim.run(1);
        }
    }
    assert_eq!(
        sim.world.disk.records.keys().next(),
        Some(&claim.offer_id),
        "the retry of the same claim got the offer: {:#?}",
        sim.commands()
    );
    sim.assert_no_violations();
}

/// The first `offers` answer is lost after the control plane leased o1 to the claim (at
/// 1 000 ms, for 30 s); the claim's first retry gets no answer (the control plane never sees
/// it); the next retry, sent while that lease still runs, is a replay the plane recovers
/// (reference §2.2: the lease still `leased`, unexpired, same Session and token): it gets o1
/// with the lease the first attempt obtained. That retry did not obtain it: the Worker keeps no
/// local deadline for it and judges it by the wall clock against its expiry. The record write
/// is slow, answered only once that lease has run out, so the Worker starts nothing (no
/// starting ACK, no spawn; the record stays `accepted`). Timed from the retry's sending instead,
/// the lease would seem to have most of 30 s left and the Run would start without one. (A retry
/// sent after the lease ran out is fenced and its claim cleared:
/// `scenario_inbox_pull::a_replay_fenced_by_the_control_plane_clears_the_claim_and_the_next_pull_claims_afresh`.)
#[test]
fn a_retried_claims_offer_whose_lease_ran_out_before_the_retry_is_not_started() {
    let mut sim = Sim::scenario(World::one_offer(1));
    sim.on(On::Post(Operation::Offers), Answer::LostAfterCommit);
    for _ in 0..6 {
        if sim.world.plane.runs.is_empty() {
            sim.run(1);
        }
    }
    let lease = sim
        .world
        .plane
        .runs
        .values()
        .next()
        .unwrap_or_else(|| panic!("no claim reached the plane: {:#?}", sim.commands()))
        .offer
        .lease
        .clone();
    assert!(sim.world.disk.records.is_empty(), "{:#?}", sim.commands());
    let sent = count(&sim, "post offers");
    sim.on(On::Post(Operation::Offers), Answer::Unavailable);
    for _ in 0..20 {
        if count(&sim, "post offers") == sent {
            sim.run(1);
        }
    }
    assert_eq!(
        count(&sim, "post offers"),
        sent + 1,
        "{:#?}",
        sim.commands()
    );
    let (claim, _) = sim.world.disk.claim.clone().expect("the claim is kept");
    assert!(claim.attempt_count > 1, "{claim:?}");
    sim.take_trail();
    sim.worker.report_facts();
    sim.answer_until(|a| act::is_post(a, Operation::Offers));
    assert!(sim.now < lease.expires_at_ms, "{:#?}", sim.commands());
    sim.answer(Answer::Ok);
    sim.answer_until(|a| matches!(a, Action::PersistRecord { .. }));
    assert!(sim.now < lease.expires_at_ms, "{:#?}", sim.commands());
    sim.advance_to(lease.expires_at_ms.saturating_add(1));
    sim.settle();
    sim.run(2);
    let commands = sim.commands();
    assert!(
        commands
            .iter()
            .any(|l| l == "persist-record o1 r0 accepted"),
        "{commands:#?}"
    );
    assert!(
        !commands
            .iter()
            .any(|l| l == "post starting o1" || l == "spawn o1"),
        "{commands:#?}"
    );
    let processed: Vec<ProcessResult> = std::iter::from_fn(|| sim.worker.poll_fact())
        .filter_map(|f| match f {
            Fact::Process { result, .. } => Some(result),
            _ => None,
        })
        .collect();
    assert_eq!(
        processed.first(),
        Some(&ProcessResult::OfferExpired),
        "{commands:#?}"
    );
    let record = sim
        .world
        .disk
        .record(&claim.offer_id)
        .unwrap_or_else(|| panic!("the retry got o1: {commands:#?}"))
        .clone();
    assert_eq!(record.state, State::Accepted);
    assert_eq!(
        record.offer.lease, lease,
        "the lease the first attempt obtained"
    );
    assert!(!sim.worker.times_lease(&claim.offer_id));
    sim.assert_no_violations();
}
