//! The on-disk envelope: round trips for every kind, every framing error, and arbitrary bytes
//! never panic.

use proptest::prelude::*;
use ql_worker_core::claim::PendingClaim;
use ql_worker_core::envelope::{self, EnvelopeError, HEADER_BYTES, Kind, MAX_ENVELOPE_BYTES};
use ql_worker_core::ids::{AttemptId, CallbackSequence, LogArtifactId, RunId};
use ql_worker_core::receipt::{Receipt, ReceiptToken};
use ql_worker_core::record::InboxRecord;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::truncation::TruncationFact;
use ql_worker_sim::testkit;

fn ms(v: u64) -> UnixMillis {
    UnixMillis::new(v).unwrap()
}

fn record() -> InboxRecord {
    InboxRecord::accepted(testkit::offer(1), ms(100))
}

fn receipt() -> Receipt {
    Receipt {
        schema_version: 1,
        run_id: RunId::new("run-1").unwrap(),
        attempt_id: AttemptId::new("attempt-1").unwrap(),
        callback_sequence: CallbackSequence::new(1).unwrap(),
        token: ReceiptToken::new("B".repeat(43)).unwrap(),
        started_at_ms: ms(100),
        finished_at_ms: ms(200),
        exit_code: 0,
    }
}

fn fact() -> TruncationFact {
    TruncationFact {
        schema_version: 1,
        run_id: RunId::new("run-1").unwrap(),
        attempt_id: AttemptId::new("attempt-1").unwrap(),
        log_artifact_id: LogArtifactId::new("wlog-0123456789abcdef0123456789abcd").unwrap(),
        maximum_bytes: 4 * 1024 * 1024,
        quota_reached: false,
        observed_at_ms: ms(300),
    }
}

#[test]
fn every_kind_round_trips() {
    let r = record();
    assert_eq!(
        envelope::decode::<InboxRecord>(&envelope::encode(&r).unwrap()).unwrap(),
        r
    );
    let c = PendingClaim::new(
        &testkit::worker(),
        testkit::offer_id(1),
        testkit::lease_token(1),
        ms(5),
    );
    assert_eq!(
        envelope::decode::<PendingClaim>(&envelope::encode(&c).unwrap()).unwrap(),
        c
    );
    let rc = receipt();
    assert_eq!(
        envelope::decode::<Receipt>(&envelope::encode(&rc).unwrap()).unwrap(),
        rc
    );
    let f = fact();
    assert_eq!(
        envelope::decode::<TruncationFact>(&envelope::encode(&f).unwrap()).unwrap(),
        f
    );
}

#[test]
fn the_record_body_keeps_the_lease_token_but_json_redacts_it() {
    let r = record();
    let bytes = envelope::encode(&r).unwrap();
    let token = r.offer.lease_token.expose().as_bytes();
    assert!(
        bytes.windows(token.len()).any(|w| w == token),
        "the inbox is a capability store"
    );
    let json = serde_json::to_string(&r).unwrap();
    assert!(!json.contains(r.offer.lease_token.expose()));
    assert!(json.contains("[redacted]"));
}

#[test]
fn encoding_is_deterministic() {
    assert_eq!(
        *envelope::encode(&record()).unwrap(),
        *envelope::encode(&record()).unwrap()
    );
}

#[test]
fn framing_errors_are_typed() {
    let good = envelope::encode(&record()).unwrap().to_vec();
    let decode = |b: &[u8]| envelope::decode::<InboxRecord>(b).unwrap_err();
    assert_eq!(decode(&good[..10]), EnvelopeError::TooShort { len: 10 });
    let mut bad = good.clone();
    bad[0] = b'X';
    assert_eq!(decode(&bad), EnvelopeError::BadMagic);
    let mut bad = good.clone();
    bad[4] = Kind::CompletionReceipt.byte();
    assert_eq!(
        decode(&bad),
        EnvelopeError::WrongKind {
            expected: Kind::InboxRecord,
            found: 3
        }
    );
    let mut bad = good.clone();
    bad[5] = 2;
    assert_eq!(decode(&bad), EnvelopeError::UnknownVersion { found: 2 });
    let mut bad = good.clone();
    bad[7] = 1;
    assert_eq!(decode(&bad), EnvelopeError::ReservedNotZero);
    let truncated = &good[..good.len() - 1];
    assert!(matches!(
        decode(truncated),
        EnvelopeError::LengthMismatch { .. }
    ));
    let mut flipped = good.clone();
    let last = flipped.len() - 1;
    flipped[last] ^= 0x40;
    assert_eq!(decode(&flipped), EnvelopeError::ChecksumMismatch);
    let huge = vec![0u8; MAX_ENVELOPE_BYTES + 1];
    assert!(matches!(decode(&huge), EnvelopeError::TooLarge { .. }));
}

/// Re-frames `body` with a correct header so that only the body rules are exercised.
fn frame(kind: Kind, body: &[u8]) -> Vec<u8> {
    use sha2::Digest as _;
    let mut out = Vec::from(*b"QLWE");
    out.extend([kind.byte(), 1, 0, 0]);
    out.extend(u32::try_from(body.len()).unwrap().to_be_bytes());
    out.extend(sha2::Sha256::digest(body).as_slice());
    out.extend(body);
    assert_eq!(out.len(), HEADER_BYTES + body.len());
    out
}

#[test]
fn trailing_bytes_and_malformed_bodies_are_rejected() {
    let good = envelope::encode(&fact()).unwrap();
    let mut body = good[HEADER_BYTES..].to_vec();
    body.push(0);
    assert_eq!(
        envelope::decode::<TruncationFact>(&frame(Kind::TruncationFact, &body)).unwrap_err(),
        EnvelopeError::TrailingBytes { count: 1 }
    );
    assert_eq!(
        envelope::decode::<TruncationFact>(&frame(Kind::TruncationFact, &[1, 2])).unwrap_err(),
        EnvelopeError::BodyMalformed
    );
}

#[test]
fn invalid_content_is_neither_encoded_nor_decoded() {
    let mut r = record();
    r.schema_version = 9;
    assert!(matches!(
        envelope::encode(&r),
        Err(EnvelopeError::Invalid(_))
    ));
    let mut body = envelope::encode(&fact()).unwrap()[HEADER_BYTES..].to_vec();
    body[0] = 2; // schemaVersion
    assert!(matches!(
        envelope::decode::<TruncationFact>(&frame(Kind::TruncationFact, &body)),
        Err(EnvelopeError::Invalid(_))
    ));
}

#[test]
fn a_receipt_token_is_redacted_in_debug() {
    let text = format!("{:?}", receipt());
    assert!(!text.contains(&"B".repeat(43)));
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = envelope::decode::<InboxRecord>(&bytes);
        let _ = envelope::decode::<PendingClaim>(&bytes);
        let _ = envelope::decode::<Receipt>(&bytes);
        let _ = envelope::decode::<TruncationFact>(&bytes);
    }

    #[test]
    fn arbitrary_well_framed_bodies_never_panic(body in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = envelope::decode::<InboxRecord>(&frame(Kind::InboxRecord, &body));
        let _ = envelope::decode::<PendingClaim>(&frame(Kind::PendingClaim, &body));
        let _ = envelope::decode::<Receipt>(&frame(Kind::CompletionReceipt, &body));
        let _ = envelope::decode::<TruncationFact>(&frame(Kind::TruncationFact, &body));
    }

    #[test]
    fn any_single_bit_flip_of_a_record_is_detected(index in 0usize..4096, bit in 0u8..8) {
        let mut bytes = envelope::encode(&record()).unwrap().to_vec();
        let i = index % bytes.len();
        bytes[i] ^= 1 << bit;
        prop_assert!(envelope::decode::<InboxRecord>(&bytes).is_err());
    }
}

/// An envelope sealed around any body (what a tamperer who recomputes the checksum writes).
fn sealed(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER_BYTES + body.len());
    out.extend_from_slice(b"QLWE");
    out.extend_from_slice(&[kind, 1, 0, 0]);
    out.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes());
    out.extend_from_slice(ql_worker_core::ids::Sha256Digest::of(body).as_bytes());
    out.extend_from_slice(body);
    out
}

#[test]
fn a_decoded_record_is_validated_once_its_revision_digested_even_under_a_good_checksum() {
    let good = record();
    let valid = envelope::decode_record(&envelope::encode(&good).unwrap()).unwrap();
    assert_eq!(*valid, good);
    // The same bytes back: encoding a ValidRecord skips validation, not a single byte.
    assert_eq!(
        envelope::encode_record(&valid).unwrap(),
        envelope::encode(&good).unwrap()
    );
    let mut tampered = good.clone();
    tampered.offer.execution_revision.working_directory = Some(String::from("/tmp"));
    let bytes = sealed(1, &postcard::to_allocvec(&tampered).unwrap());
    assert!(
        envelope::open::<InboxRecord>(&bytes).is_ok(),
        "framing is fine"
    );
    for refused in [
        envelope::decode_record(&bytes).map(|_| ()),
        envelope::decode::<InboxRecord>(&bytes).map(|_| ()),
    ] {
        let Err(EnvelopeError::Invalid(e)) = refused else {
            panic!("tampered revision accepted: {refused:?}");
        };
        assert!(e.to_string().contains("executionRevision"), "{e}");
    }
}
