//! The simulated disk: inbox, pending claim, receipts and log spool, with the journal's checks.

use std::collections::BTreeMap;
use std::hash::Hasher;

use super::{Answer, Mutation, World, check, hash_debug};
use ql_worker_core::claim::{ClaimCreate, PendingClaim};
use ql_worker_core::envelope;
use ql_worker_core::ids::{AttemptId, LogArtifactId, OfferId, Revision, SessionId};
use ql_worker_core::io::{Outcome, ReceiptRead, StoreFailure};
use ql_worker_core::receipt::Receipt;
use ql_worker_core::record::InboxRecord;

/// A receipt file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredReceipt {
    /// Its content.
    pub receipt: Receipt,
    /// Written honestly by the supervisor for the process's own capability.
    pub genuine: bool,
    /// The file is unreadable as a receipt (the store reports `Invalid`).
    pub malformed: bool,
}

/// One spool file.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Log {
    /// Content.
    pub content: Vec<u8>,
    /// Truncation fact (`None`: no fact, unknown).
    pub truncated: Option<bool>,
}

/// Durable state: what survives a Worker crash.
#[derive(Clone, Debug, Default)]
pub struct Disk {
    /// Inbox records, with their exact envelope bytes.
    pub records: BTreeMap<OfferId, (InboxRecord, Vec<u8>)>,
    /// The pending claim, with its envelope bytes.
    pub claim: Option<(PendingClaim, Vec<u8>)>,
    /// Receipts by attempt.
    pub receipts: BTreeMap<AttemptId, StoredReceipt>,
    /// The log spool.
    pub logs: BTreeMap<LogArtifactId, Log>,
    /// The durable handles supervisors published before their user command ran, by attempt
    /// (removed with the receipt).
    pub published: BTreeMap<AttemptId, String>,
    /// Inbox capacity.
    pub capacity: usize,
}

fn encode<T: envelope::Durable>(value: &T) -> Vec<u8> {
    // INVARIANT: records and claims the core proposes always fit their envelope.
    envelope::encode(value).expect("encodable").to_vec()
}

impl Disk {
    /// The stored record of `offer_id`.
    #[must_use]
    pub fn record(&self, offer_id: &OfferId) -> Option<&InboxRecord> {
        self.records.get(offer_id).map(|(r, _)| r)
    }

    /// The stored record of the offer whose attempt is `attempt_id`.
    #[must_use]
    pub fn record_of_attempt(&self, attempt_id: &AttemptId) -> Option<&InboxRecord> {
        self.records
            .values()
            .map(|(r, _)| r)
            .find(|r| r.offer.candidate.attempt_id == *attempt_id)
    }

    /// Stores `record` as if it had been written (for seeding a world).
    pub fn put(&mut self, record: InboxRecord) {
        let bytes = encode(&record);
        self.records
            .insert(record.offer.offer_id.clone(), (record, bytes));
    }

    /// Stores `claim` as if it had been written (for seeding a world).
    pub fn put_claim(&mut self, claim: PendingClaim) {
        let bytes = encode(&claim);
        self.claim = Some((claim, bytes));
    }

    pub(super) fn fingerprint(&self, hasher: &mut dyn Hasher) {
        for (_, bytes) in self.records.values() {
            hasher.write(bytes);
        }
        hasher.write_u8(0xf0);
        if let Some((_, bytes)) = &self.claim {
            hasher.write(bytes);
        }
        hasher.write_u8(0xf1);
        for (attempt, r) in &self.receipts {
            hash_debug(hasher, &(attempt, r.genuine, r.malformed));
            hasher.write(&encode(&r.receipt));
        }
        hash_debug(hasher, &self.logs);
        hash_debug(hasher, &self.published);
    }
}

/// The outcome of a write that the answer lets land, or not.
fn write_outcome(answer: Answer) -> (bool, Outcome) {
    match answer {
        Answer::Unchanged => (false, Outcome::Store(StoreFailure::Unchanged)),
        Answer::UncertainLanded => (true, Outcome::Store(StoreFailure::Uncertain)),
        Answer::UncertainLost => (false, Outcome::Store(StoreFailure::Uncertain)),
        _ => (true, Outcome::Persisted),
    }
}

impl World {
    pub(super) fn list(&self, after: Option<&OfferId>, limit: usize, answer: Answer) -> Outcome {
        if answer == Answer::Unchanged {
            return Outcome::Store(StoreFailure::Unchanged);
        }
        let mut ids = self
            .disk
            .records
            .keys()
            .filter(|id| after.is_none_or(|a| *id > a));
        let records: Vec<InboxRecord> = ids
            .by_ref()
            .take(limit)
            .filter_map(|id| self.disk.record(id).cloned())
            .collect();
        let more = ids.next().is_some();
        let next_after = more
            .then(|| records.last().map(|r| r.offer.offer_id.clone()))
            .flatten();
        Outcome::InboxListed {
            records,
            next_after,
        }
    }

    pub(super) fn read_record(&self, offer_id: &OfferId, answer: Answer) -> Outcome {
        if answer == Answer::Unchanged {
            return Outcome::Store(StoreFailure::Unchanged);
        }
        Outcome::RecordRead(self.disk.record(offer_id).cloned().map(Box::new))
    }

    pub(super) fn persist_record(
        &mut self,
        expected: Option<Revision>,
        record: &InboxRecord,
        answer: Answer,
    ) -> Outcome {
        let id = &record.offer.offer_id;
        let stored = self.disk.record(id);
        if expected.is_none()
            && stored.is_none()
            && self.disk.records.len() >= self.disk.capacity.max(1)
        {
            return Outcome::Store(StoreFailure::CapacityExhausted);
        }
        let verdict = check::record_write(expected, stored, record);
        if let Err(detail) = verdict {
            self.violation("persist-valid", detail);
            return Outcome::Store(StoreFailure::Conflict);
        }
        let (lands, outcome) = write_outcome(answer);
        let dropped = match self.mutation {
            Some(Mutation::DropWrites(state)) => record.state == state,
            Some(Mutation::DropLeaseWrites) => self.disk.record(id).is_some_and(|stored| {
                stored.state == record.state && stored.offer.lease != record.offer.lease
            }),
            Some(
                Mutation::StartedAsRecovery
                | Mutation::WrongRecoveryReason
                | Mutation::StoresEveryOffer
                | Mutation::DoubleSpawn
                | Mutation::SpawnsAttemptTwice
                | Mutation::SpawnsRunTwice
                | Mutation::DriftedPlan
                | Mutation::SpawnedButRejected
                | Mutation::UploadNotStored
                | Mutation::HungProcesses
                | Mutation::RemovalNotDone
                | Mutation::SessionStaysDraining,
            )
            | None => false,
        };
        if lands && !dropped {
            self.disk.put(record.clone());
        }
        outcome
    }

    pub(super) fn read_claim(&self, answer: Answer) -> Outcome {
        if answer == Answer::Unchanged {
            return Outcome::Store(StoreFailure::Unchanged);
        }
        Outcome::ClaimRead(self.disk.claim.as_ref().map(|(c, _)| Box::new(c.clone())))
    }

    pub(super) fn persist_claim(
        &mut self,
        expected: Option<Revision>,
        claim: &PendingClaim,
        answer: Answer,
    ) -> Outcome {
        let stored = self.disk.claim.as_ref().map(|(c, _)| c);
        // The Worker never creates a claim twice (World's stricter rule: an identical create is
        // idempotent for the journal, but the model's Worker has no reason to send one).
        let verdict = match check::claim_write(expected, stored, claim) {
            Ok(ClaimCreate::AlreadyExists) => Err(String::from("claim created twice")),
            Ok(ClaimCreate::Publish) => Ok(()),
            Err(e) => Err(e),
        };
        if let Err(detail) = verdict {
            self.violation("claim-cas", format!("claim: {detail}"));
            return Outcome::Store(StoreFailure::Conflict);
        }
        let (lands, outcome) = write_outcome(answer);
        if lands {
            self.disk.put_claim(claim.clone());
        }
        outcome
    }

    /// The stored Session id replaced (`<root>/session`).
    pub(super) fn persist_session(&mut self, session_id: &SessionId, answer: Answer) -> Outcome {
        let (lands, outcome) = write_outcome(answer);
        if lands {
            self.session_id = Some(session_id.clone());
        }
        outcome
    }

    pub(super) fn clear_claim(
        &mut self,
        offer_id: &OfferId,
        revision: Revision,
        answer: Answer,
    ) -> Outcome {
        let verdict =
            check::claim_clear(self.disk.claim.as_ref().map(|(c, _)| c), offer_id, revision);
        if let Err(detail) = verdict {
            self.violation("claim-cas", format!("claim {detail}"));
            return Outcome::Store(StoreFailure::Conflict);
        }
        let (lands, outcome) = write_outcome(answer);
        if lands {
            self.disk.claim = None;
        }
        outcome
    }

    pub(super) fn read_receipt(&self, attempt_id: &AttemptId, answer: Answer) -> Outcome {
        if answer == Answer::Unchanged {
            return Outcome::ReceiptRead(ReceiptRead::Unavailable);
        }
        Outcome::ReceiptRead(match self.disk.receipts.get(attempt_id) {
            None => ReceiptRead::Absent,
            Some(stored) if stored.malformed => ReceiptRead::Invalid,
            Some(stored) => ReceiptRead::Present(stored.receipt.clone()),
        })
    }

    pub(super) fn remove_receipt(&mut self, attempt_id: &AttemptId, answer: Answer) -> Outcome {
        if answer == Answer::Unchanged {
            return Outcome::Store(StoreFailure::Unchanged);
        }
        // The published handle goes with the receipt.
        self.disk.published.remove(attempt_id);
        Outcome::ReceiptRemoved {
            existed: self.disk.receipts.remove(attempt_id).is_some(),
        }
    }

    /// The handle the supervisor of `attempt_id` published, validated as the driver does;
    /// [`Answer::StopUnknown`]: the file is garbled (`None`).
    pub(super) fn read_published_handle(&self, attempt_id: &AttemptId, answer: Answer) -> Outcome {
        if answer == Answer::StopUnknown {
            return Outcome::PublishedHandle(None);
        }
        Outcome::PublishedHandle(
            self.disk
                .published
                .get(attempt_id)
                .and_then(|h| ql_worker_core::ids::ExecutorHandle::new(h.clone()).ok()),
        )
    }

    pub(super) fn allocate_log(&mut self, log: &LogArtifactId, answer: Answer) -> Outcome {
        if answer == Answer::Unavailable {
            return Outcome::LogUnavailable;
        }
        // Reopening appends: an existing spool file is never truncated.
        self.disk.logs.entry(log.clone()).or_insert_with(|| Log {
            content: Vec::new(),
            truncated: None,
        });
        Outcome::LogAllocated
    }

    pub(super) fn inspect_log(&self, log: &LogArtifactId, answer: Answer) -> Outcome {
        if answer == Answer::Unavailable {
            return Outcome::LogUnavailable;
        }
        match self.disk.logs.get(log) {
            Some(l) => Outcome::LogInspected {
                byte_length: l.content.len() as u64,
                truncated: l.truncated,
            },
            None => Outcome::LogMissing,
        }
    }
}
