//! Every message of the core's derived (`thiserror`) error types, pinned word for word: operators
//! read them in logs and `ql-worker` output, so a change of wording is a change of interface.
//! The expected texts are what the hand-written `Display` impls printed before the derive
//! replaced them (commit e5c0bc8; for `RevisionError`, `TransitionError`, `RemovalRefused`,
//! `ArchiveRefusal` and `JsonError`, commit 307ad23).

use ql_worker_core::claim::ClaimError;
use ql_worker_core::envelope::{ContentError, EnvelopeError, Kind};
use ql_worker_core::error::IdError;
use ql_worker_core::ids::Revision;
use ql_worker_core::js::{CollationError, NotWtf8};
use ql_worker_core::listing::LimitError;
use ql_worker_core::offer::OfferError;
use ql_worker_core::receipt::{ReceiptError, ReceiptShapeError};
use ql_worker_core::record::{OptionalField, Presence, RecordError, State, TransitionError};
use ql_worker_core::retention::{ArchiveRefusal, RemovalRefused};
use ql_worker_core::revision::RevisionError;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::truncation::FactError;
use ql_worker_core::wire::auth::AuthError;
use ql_worker_core::wire::offer::AdmissionError;
use ql_worker_core::wire::secrets::BundleError;
use ql_worker_core::wire::{JsonCategory, JsonError, WireError};

fn json_error() -> JsonError {
    JsonError {
        line: 1,
        column: 7,
        category: JsonCategory::Data,
        detail: "missing field".into(),
    }
}

#[test]
fn every_derived_error_message_is_unchanged() {
    let offer = OfferError::Mismatch {
        field: "executionDigest",
        must_equal: "executionRevision.contentDigest",
    };
    let wire = WireError::Field {
        path: "status",
        rule: "\"idle\" or \"offered\"",
    };
    let admission = AdmissionError::ClaimMismatch {
        path: "offer.offerId",
        must_equal: "the pending claim's offer id",
    };
    let record = RecordError::FieldPresence {
        state: State::Started,
        field: OptionalField::ExecutorHandle,
        expected: Presence::Required,
    };
    let cases: Vec<(String, &str)> = vec![
        (
            IdError {
                kind: "run id",
                rule: "^[A-Za-z0-9][A-Za-z0-9._:-]{0,35}$",
            }
            .to_string(),
            "invalid run id: must be ^[A-Za-z0-9][A-Za-z0-9._:-]{0,35}$",
        ),
        (
            OfferError::Bound {
                field: "lease.expiresAtMs",
                rule: "> lease.renewedAtMs",
            }
            .to_string(),
            "offer field lease.expiresAtMs must be > lease.renewedAtMs",
        ),
        (
            offer.to_string(),
            "offer field executionDigest must equal executionRevision.contentDigest",
        ),
        (
            FactError::SchemaVersion.to_string(),
            "truncation fact schemaVersion must be 1",
        ),
        (
            FactError::Quota.to_string(),
            "truncation fact maximumBytes must be within 64 KiB..=1 GiB",
        ),
        (
            ClaimError::Invalid {
                field: "leaseToken",
                rule: "a lease token",
            }
            .to_string(),
            "pending claim leaseToken must be a lease token",
        ),
        (
            ClaimError::Conflict.to_string(),
            "a different pending claim already exists",
        ),
        (
            ClaimError::RevisionConflict {
                expected: Revision::new(3).unwrap(),
                found: Revision::new(4).unwrap(),
            }
            .to_string(),
            "pending claim revision conflict: expected 3, stored 4 (or the claim identity differs)",
        ),
        (
            LimitError {
                what: "page limit",
                rule: "1..=1024",
            }
            .to_string(),
            "page limit must be within 1..=1024",
        ),
        (
            ReceiptShapeError::SchemaVersion.to_string(),
            "receipt schemaVersion must be 1",
        ),
        (
            ReceiptShapeError::Token.to_string(),
            "receipt token must match [A-Za-z0-9_-]{32,128}",
        ),
        (
            ReceiptShapeError::FinishedBeforeStarted.to_string(),
            "receipt finishedAtMs must be >= startedAtMs",
        ),
        (
            ReceiptError::TokenEncoding.to_string(),
            "receipt token is not canonical base64url of exactly 32 bytes",
        ),
        (
            ReceiptError::TokenDigest.to_string(),
            "receipt token does not match the persisted digest",
        ),
        (
            ReceiptError::Identity { field: "runId" }.to_string(),
            "receipt runId differs from the inbox record",
        ),
        (
            ReceiptError::StartTime.to_string(),
            "receipt startedAtMs differs from executorStartedAtMs",
        ),
        (
            ReceiptError::FinishedInFuture.to_string(),
            "receipt finishedAtMs is in the future",
        ),
        (
            ReceiptError::RecordWithoutBarrier.to_string(),
            "the inbox record has no launch barrier to authenticate against",
        ),
        (
            RecordError::SchemaVersion { found: 2 }.to_string(),
            "record schemaVersion must be 1, found 2",
        ),
        (
            RecordError::UpdatedBeforeAccepted.to_string(),
            "record updatedAtMs is before acceptedAtMs",
        ),
        (
            record.to_string(),
            "record field executorHandle must be present in state started",
        ),
        (
            RecordError::FieldPresence {
                state: State::Accepted,
                field: OptionalField::CompletionReceipt,
                expected: Presence::Absent,
            }
            .to_string(),
            "record field completionReceiptCallbackSequence/TokenDigest must be absent in state \
             accepted",
        ),
        (
            RecordError::FieldPresence {
                state: State::RecoveryRequired,
                field: OptionalField::LogArtifactId,
                expected: Presence::Optional,
            }
            .to_string(),
            "record field logArtifactId must be optional in state recovery_required",
        ),
        (
            RecordError::HandleWithoutStartTime.to_string(),
            "record executorHandle requires executorStartedAtMs",
        ),
        (
            RecordError::CompletionReceiptHalfPresent.to_string(),
            "record completionReceiptCallbackSequence and TokenDigest must be both present or \
             both absent",
        ),
        (
            RecordError::Offer(offer).to_string(),
            "record offer is invalid: offer field executionDigest must equal \
             executionRevision.contentDigest",
        ),
        (
            ContentError::Record(record).to_string(),
            "record field executorHandle must be present in state started",
        ),
        (
            ContentError::Claim(ClaimError::Conflict).to_string(),
            "a different pending claim already exists",
        ),
        (
            ContentError::Receipt(ReceiptShapeError::Token).to_string(),
            "receipt token must match [A-Za-z0-9_-]{32,128}",
        ),
        (
            ContentError::Fact(FactError::Quota).to_string(),
            "truncation fact maximumBytes must be within 64 KiB..=1 GiB",
        ),
        (
            EnvelopeError::TooLarge { len: 9, max: 8 }.to_string(),
            "envelope is 9 bytes, above 8",
        ),
        (
            EnvelopeError::TooShort { len: 3 }.to_string(),
            "envelope is 3 bytes, below the header size",
        ),
        (
            EnvelopeError::BadMagic.to_string(),
            "not a ql-worker envelope (bad magic)",
        ),
        (
            EnvelopeError::WrongKind {
                expected: Kind::PendingClaim,
                found: 1,
            }
            .to_string(),
            "envelope kind 1 is not a pending claim",
        ),
        (
            EnvelopeError::UnknownVersion { found: 9 }.to_string(),
            "unknown envelope format version 9",
        ),
        (
            EnvelopeError::ReservedNotZero.to_string(),
            "envelope reserved bytes are not zero",
        ),
        (
            EnvelopeError::LengthMismatch {
                declared: 10,
                actual: 4,
            }
            .to_string(),
            "envelope declares 10 body bytes but holds 4",
        ),
        (
            EnvelopeError::ChecksumMismatch.to_string(),
            "envelope body fails its SHA-256 checksum",
        ),
        (
            EnvelopeError::BodyMalformed.to_string(),
            "envelope body is not a valid postcard value",
        ),
        (
            EnvelopeError::TrailingBytes { count: 2 }.to_string(),
            "envelope body has 2 trailing bytes",
        ),
        (
            EnvelopeError::Invalid(ContentError::Fact(FactError::SchemaVersion)).to_string(),
            "envelope content is invalid: truncation fact schemaVersion must be 1",
        ),
        (
            EnvelopeError::Unencodable.to_string(),
            "value cannot be encoded",
        ),
        (
            CollationError { character: 'é' }.to_string(),
            "cannot order 'é' like JavaScript localeCompare: only [A-Za-z0-9._/+-] is supported",
        ),
        (
            NotWtf8.to_string(),
            "a string of UTF-8 and lone UTF-16 surrogates only",
        ),
        (
            admission.to_string(),
            "offered offer.offerId must equal the pending claim's offer id",
        ),
        (
            AdmissionError::Offer(offer).to_string(),
            "offered offer rejected: offer field executionDigest must equal \
             executionRevision.contentDigest",
        ),
        (
            AuthError::Scheme.to_string(),
            "authorization must be `Worker ql3w_<credentialId>_<secret>`",
        ),
        (
            AuthError::CredentialId.to_string(),
            "credential id must match [A-Za-z0-9][A-Za-z0-9._:-]{0,63}",
        ),
        (
            AuthError::Secret.to_string(),
            "credential secret must be canonical base64url of exactly 32 bytes",
        ),
        (
            BundleError::Size { len: 1 }.to_string(),
            "environment bundle of 1 bytes is outside 2..=98304 bytes",
        ),
        (
            BundleError::Json(json_error()).to_string(),
            "environment bundle JSON rejected: shape error at line 1 column 7: missing field",
        ),
        (
            BundleError::Field {
                path: "schema",
                rule: "qinglong/environment-bundle@v1",
            }
            .to_string(),
            "environment bundle field schema must be qinglong/environment-bundle@v1",
        ),
        (
            WireError::Size {
                endpoint: "offers",
                len: 1,
                cap: 131_072,
            }
            .to_string(),
            "offers response of 1 bytes is outside 2..=131072 bytes",
        ),
        (
            WireError::Json {
                endpoint: "secrets",
                error: json_error(),
            }
            .to_string(),
            "secrets JSON rejected: shape error at line 1 column 7: missing field",
        ),
        (
            wire.to_string(),
            "response field status must be \"idle\" or \"offered\"",
        ),
        (
            WireError::Mismatch {
                path: "runId",
                must_equal: "the request's runId",
            }
            .to_string(),
            "response field runId must equal the request's runId",
        ),
        (
            WireError::Revision(RevisionError::DigestMismatch).to_string(),
            "offer executionRevision rejected: execution revision contentDigest does not match \
             its content",
        ),
        (
            WireError::Request {
                path: "secretRefs",
                rule: "unique",
            }
            .to_string(),
            "request field secretRefs must be unique",
        ),
        (
            WireError::RequestTooLarge {
                endpoint: "completion",
                cap: 16_384,
            }
            .to_string(),
            "completion request exceeds its 16384 byte cap",
        ),
        (
            RevisionError::Field {
                field: "env[0].name",
                rule: "an environment name",
            }
            .to_string(),
            "execution revision field env[0].name must be an environment name",
        ),
        (
            RevisionError::NotNormalized { field: "env" }.to_string(),
            "execution revision field env is not in normalized form",
        ),
        (
            RevisionError::DigestMismatch.to_string(),
            "execution revision contentDigest does not match its content",
        ),
        (
            RevisionError::Json(json_error()).to_string(),
            "execution revision JSON rejected: shape error at line 1 column 7: missing field",
        ),
        (
            TransitionError::StaleRevision {
                expected: Revision::new(3).unwrap(),
                found: Revision::new(4).unwrap(),
            }
            .to_string(),
            "stale revision: expected 3, stored 4",
        ),
        (
            TransitionError::RevisionNotNext {
                required: Some(Revision::new(4).unwrap()),
                proposed: Revision::new(6).unwrap(),
            }
            .to_string(),
            "proposed revision 6 must be 4",
        ),
        (
            TransitionError::RevisionNotNext {
                required: None,
                proposed: Revision::new(7).unwrap(),
            }
            .to_string(),
            "proposed revision 7: the revision space is exhausted",
        ),
        (
            TransitionError::InvalidProposed(RecordError::UpdatedBeforeAccepted).to_string(),
            "proposed record is invalid: record updatedAtMs is before acceptedAtMs",
        ),
        (
            TransitionError::InvalidStored(RecordError::SchemaVersion { found: 2 }).to_string(),
            "stored record is invalid: record schemaVersion must be 1, found 2",
        ),
        (
            TransitionError::AuthorityChanged { field: "runId" }.to_string(),
            "offer authority must not change: runId differs",
        ),
        (
            TransitionError::AcceptedAtChanged.to_string(),
            "acceptedAtMs must never change",
        ),
        (
            TransitionError::UpdatedAtRegressed {
                stored: UnixMillis::new(20).unwrap(),
                proposed: UnixMillis::new(10).unwrap(),
            }
            .to_string(),
            "updatedAtMs must not decrease: stored 20, proposed 10",
        ),
        (
            TransitionError::LeaseVersionRegressed {
                stored: 5,
                proposed: 4,
            }
            .to_string(),
            "lease version must not decrease: stored 5, proposed 4",
        ),
        (
            TransitionError::LeaseChangedAtSameVersion.to_string(),
            "the lease must be identical while its version is unchanged",
        ),
        (
            TransitionError::IllegalEdge {
                from: State::CompletionAcknowledged,
                to: State::Started,
            }
            .to_string(),
            "illegal transition completion_acknowledged -> started",
        ),
        (
            TransitionError::WriteOnceChanged {
                field: OptionalField::CompletionReceipt,
            }
            .to_string(),
            "write-once field completionReceiptCallbackSequence/TokenDigest must keep its value",
        ),
        (
            RemovalRefused::StaleRevision {
                expected: Revision::new(3).unwrap(),
                found: Revision::new(4).unwrap(),
            }
            .to_string(),
            "stale revision: expected 3, stored 4",
        ),
        (
            RemovalRefused::NotSettled(State::Started).to_string(),
            "state started is not settled",
        ),
        (
            ArchiveRefusal::NotReviewable(State::Launching).to_string(),
            "the record is launching: only a recovery_required record or a dormant one \
             (accepted, starting_acknowledged or start_failed with its lease expired) can be \
             archived; settled records are removed by retention",
        ),
        (
            JsonError {
                line: 2,
                column: 1,
                category: JsonCategory::Syntax,
                detail: "expected value".into(),
            }
            .to_string(),
            "syntax error at line 2 column 1: expected value",
        ),
        (
            json_error().to_string(),
            "shape error at line 1 column 7: missing field",
        ),
        (
            JsonError {
                line: 1,
                column: 3,
                category: JsonCategory::Eof,
                detail: "EOF while parsing an object".into(),
            }
            .to_string(),
            "truncated error at line 1 column 3: EOF while parsing an object",
        ),
        (
            JsonError {
                line: 1,
                column: 1,
                category: JsonCategory::Io,
                detail: String::new(),
            }
            .to_string(),
            "io error at line 1 column 1: ",
        ),
    ];
    let differences: Vec<String> = cases
        .iter()
        .filter(|(ours, expected)| ours != expected)
        .map(|(ours, expected)| format!("expected {expected:?}\n     got {ours:?}"))
        .collect();
    assert!(differences.is_empty(), "{}", differences.join("\n"));
    // Every one is a `core::error::Error`, usable with `?` into a boxed error.
    let boxed: Box<dyn std::error::Error> = Box::new(EnvelopeError::BadMagic);
    assert_eq!(boxed.to_string(), "not a ql-worker envelope (bad magic)");
}
