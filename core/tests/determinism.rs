//! CONVENTIONS C5: the core is deterministic.
//!
//! 1. The same inputs twice give byte-identical command streams: every command's canonical
//!    rendering ([`act::canonical`]: records and claims as their exact envelope bytes, request
//!    bodies verbatim, the launch plan field by field) is compared byte for byte — for one rich
//!    scripted Run and for random drives (proptest).
//! 2. Different entropy changes only the entropy-derived fields: the offer id (and the log id
//!    derived from it), the lease token (and its digest), the completion capability (and its
//!    digest) and the backoff time. Masking exactly those fields makes the two streams
//!    byte-identical again.

use std::collections::BTreeMap;

use proptest::prelude::*;
use ql_worker_core::capability::Capability;
use ql_worker_core::envelope;
use ql_worker_core::ids::{CapabilityDigest, LeaseToken, LogArtifactId, OfferId, Sha256Digest};
use ql_worker_core::io::Action;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::wire::route::Operation;
use ql_worker_sim::testkit::act;
use ql_worker_sim::testkit::explore::model_config;
use ql_worker_sim::testkit::sim::{On, Sim, Status};
use ql_worker_sim::testkit::world::{Answer, Event, Menu, OfferTemplate, ReceiptKind, World};
use ql_worker_sim::testkit::{self};

fn ms(v: u64) -> UnixMillis {
    UnixMillis::new(v).unwrap()
}

/// One Run with a bit of everything: a failed Pull and its backoff, a Secret binding, a crash
/// right after the spawn (restart in `launching` ⇒ recovery, fail-closed), a lease renewal of
/// the recovered record, the process exit, receipt-first completion from recovery and receipt
/// cleanup.
fn rich_run(seed: u64) -> Sim {
    let world = World::new(
        seed,
        vec![OfferTemplate::with_revision(1, testkit::secret_revision())],
    );
    let mut sim = Sim::new(model_config(), world, ms(1_000)).recording();
    sim.on(On::Post(Operation::Offers), Answer::Unavailable);
    sim.on(On::Kind("spawn"), Answer::CrashAfter);
    sim.run(7);
    sim.event(Event::Exit {
        index: 0,
        code: 0,
        receipt: ReceiptKind::Genuine,
    });
    sim.run(4);
    sim
}

fn stream(sim: &Sim) -> Vec<Vec<u8>> {
    sim.stream.iter().flatten().map(act::canonical).collect()
}

#[test]
fn the_same_inputs_give_byte_identical_command_streams() {
    let first = rich_run(7);
    let second = rich_run(7);
    assert_eq!(stream(&first), stream(&second));
    assert_eq!(first.trail, second.trail);
    // The run did what it claims to, so the comparison covers those commands.
    let trail = first.commands().join("\n");
    for needle in [
        "post secrets o1",
        "spawn o1",
        "crash",
        "persist-record o1 r3 recovery_required",
        "upload-log o1",
        "post lease-control o1",
        "completion_acknowledged",
        "remove-receipt attempt-1",
    ] {
        assert!(trail.contains(needle), "{needle} missing from:\n{trail}");
    }
    assert!(stream(&first).len() > 40);
}

/// Replaces every entropy-derived value by a placeholder numbered in order of appearance.
#[derive(Default)]
struct Masks {
    offers: BTreeMap<String, usize>,
    tokens: BTreeMap<String, usize>,
    digests: BTreeMap<String, usize>,
    logs: BTreeMap<String, usize>,
}

fn number(table: &mut BTreeMap<String, usize>, value: &str) -> usize {
    let next = table.len() + 1;
    *table.entry(value.to_string()).or_insert(next)
}

impl Masks {
    fn offer(&mut self, id: &OfferId) -> OfferId {
        OfferId::new(format!(
            "masked-offer-{}",
            number(&mut self.offers, id.as_str())
        ))
        .unwrap()
    }

    fn token(&mut self, token: &LeaseToken) -> LeaseToken {
        let n = number(&mut self.tokens, token.expose());
        LeaseToken::new(format!("masked_lease_token_{n:020}")).unwrap()
    }

    fn digest(&mut self, digest: &CapabilityDigest) -> CapabilityDigest {
        let n = number(&mut self.digests, &digest.expose().to_hex());
        CapabilityDigest::new(Sha256Digest::of(format!("capability-{n}").as_bytes()))
    }

    fn log(&mut self, log: &LogArtifactId) -> LogArtifactId {
        let n = number(&mut self.logs, log.as_str());
        LogArtifactId::new(format!("wlog-{n:030x}")).unwrap()
    }

    /// Text substitution for JSON bodies, with every value registered so far.
    fn text(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut text = String::from_utf8(bytes.to_vec()).unwrap();
        for (table, prefix) in [
            (&self.offers, "masked-offer-"),
            (&self.tokens, "masked-token-"),
            (&self.digests, "masked-digest-"),
            (&self.logs, "masked-log-"),
        ] {
            for (value, n) in table {
                text = text.replace(value.as_str(), &format!("{prefix}{n}"));
            }
        }
        text.into_bytes()
    }

    fn action(&mut self, action: &Action) -> Vec<u8> {
        let mut action = action.clone();
        match &mut action {
            Action::ListInbox { after, .. } => *after = after.as_ref().map(|a| self.offer(a)),
            Action::ReadRecord { offer_id } | Action::ClearClaim { offer_id, .. } => {
                *offer_id = self.offer(offer_id);
            }
            Action::PersistRecord { record, .. } => {
                let offer = &mut record.offer;
                offer.offer_id = self.offer(&offer.offer_id);
                offer.lease_token = self.token(&offer.lease_token);
                offer.lease.lease_token_digest = offer.lease_token.digest();
                record.log_artifact_id = record.log_artifact_id.as_ref().map(|l| self.log(l));
                record.completion_receipt_token_digest = record
                    .completion_receipt_token_digest
                    .as_ref()
                    .map(|d| self.digest(d));
            }
            Action::PersistClaim { claim, .. } => {
                claim.offer_id = self.offer(&claim.offer_id);
                claim.lease_token = self.token(&claim.lease_token);
                // The backoff time is drawn from entropy (full jitter).
                claim.next_attempt_at_ms = claim.updated_at_ms;
            }
            Action::AllocateLog { log_artifact_id }
            | Action::InspectLog { log_artifact_id }
            | Action::InspectSupervision {
                log_artifact_id, ..
            } => {
                *log_artifact_id = self.log(log_artifact_id);
            }
            Action::Post(call) => *call.body = self.text(&call.body),
            Action::UploadLog {
                header,
                log_artifact_id,
                ..
            } => {
                *log_artifact_id = self.log(log_artifact_id);
                **header = self.text(header);
            }
            Action::Spawn(plan) => {
                plan.offer_id = self.offer(&plan.offer_id);
                plan.log_artifact_id = self.log(&plan.log_artifact_id);
                let digest = plan.capability.digest();
                let n = number(&mut self.digests, &digest.expose().to_hex());
                plan.capability = Capability::from_bytes([u8::try_from(n).unwrap(); 32]);
            }
            // A new Session id is drawn from entropy (UUIDv7 random bits).
            Action::PersistSession { session_id } => {
                *session_id =
                    ql_worker_core::ids::SessionId::new("00000000-0000-7000-8000-000000000000")
                        .unwrap();
            }
            Action::ReadClaim
            | Action::ReadReceipt { .. }
            | Action::RemoveReceipt { .. }
            | Action::ReadPublishedHandle { .. }
            | Action::Stop { .. }
            | Action::DrawEntropy => {}
        }
        act::canonical(&action)
    }
}

fn actions(seed: u64) -> Vec<Action> {
    rich_run(seed).stream.take().unwrap()
}

#[test]
fn different_entropy_changes_only_the_entropy_derived_fields() {
    let (a, b) = (actions(7), actions(8));
    assert_eq!(a.len(), b.len(), "the same commands, in the same order");
    let differing = a
        .iter()
        .zip(&b)
        .filter(|(x, y)| act::canonical(x) != act::canonical(y))
        .count();
    assert!(
        differing > 10,
        "entropy must reach the stream ({differing} differ)"
    );
    let (mut ma, mut mb) = (Masks::default(), Masks::default());
    for (index, (x, y)) in a.iter().zip(&b).enumerate() {
        let (x, y) = (ma.action(x), mb.action(y));
        assert!(
            x == y,
            "command {index} differs beyond the entropy-derived fields:\n{}\n{}",
            String::from_utf8_lossy(&x),
            String::from_utf8_lossy(&y)
        );
    }
    // Every masked class really occurred.
    assert_eq!(ma.offers.len(), mb.offers.len());
    assert!(!ma.offers.is_empty() && !ma.tokens.is_empty() && !ma.digests.is_empty());
    // And the envelope bytes of records really are compared (not only the summaries).
    assert!(a.iter().any(
        |action| matches!(action, Action::PersistRecord { record, .. }
        if envelope::encode(&**record).is_ok())
    ));
}

/// Drives a Worker with `choices` (an index into the options at every step) and returns the
/// canonical command stream.
fn drive(seed: u64, choices: &[u8]) -> Vec<Vec<u8>> {
    let world = World::new(
        seed,
        vec![
            OfferTemplate::sample(1),
            OfferTemplate::with_revision(2, testkit::secret_revision()),
        ],
    );
    let mut sim = Sim::new(model_config(), world, ms(1_000)).recording();
    let menu = Menu::everything();
    for choice in choices {
        let choice = usize::from(*choice);
        let events = sim.world.events(&menu);
        if !events.is_empty() && choice % 7 == 0 {
            sim.event(events[choice % events.len()]);
            continue;
        }
        match sim.status.clone() {
            Status::Busy => {
                let (_, act) = sim.pending.clone().unwrap();
                let options = sim.world.options(&act, &menu);
                // Mostly healthy answers, so the drive gets somewhere.
                let answer = if choice % 3 == 0 {
                    options[choice % options.len()]
                } else {
                    Answer::Ok
                };
                sim.answer(answer);
            }
            Status::Idle(wake) => {
                let jump = if choice % 11 == 0 { 31_000 } else { 0 };
                sim.advance_to(wake.unwrap_or(sim.now).saturating_add(jump));
                sim.tick();
            }
            Status::Halted(_) => sim.crash(),
            Status::Stopped(_) => break,
        }
    }
    stream(&sim)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn any_drive_twice_gives_byte_identical_command_streams(
        seed in any::<u64>(),
        choices in proptest::collection::vec(any::<u8>(), 50..400),
    ) {
        let first = drive(seed, &choices);
        let second = drive(seed, &choices);
        prop_assert!(!first.is_empty());
        prop_assert_eq!(first, second);
    }
}
