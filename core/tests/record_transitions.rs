//! `check_transition` and `validate`, rule by rule: the happy path, stale and skipped revisions,
//! authority and lease changes, write-once fields, per-state presence and corrupt stored records.

use ql_worker_core::ids::{
    CallbackSequence, CapabilityDigest, ExecutorHandle, LeaseVersion, LogArtifactId, Revision,
    Sha256Digest,
};
use ql_worker_core::record::{
    InboxRecord, OptionalField, Presence, RecordError, RecoveryReason, State, TransitionError,
    check_transition,
};
use ql_worker_core::time::UnixMillis;
use ql_worker_sim::testkit;

fn ms(v: u64) -> UnixMillis {
    UnixMillis::new(v).unwrap()
}

fn accepted() -> InboxRecord {
    InboxRecord::accepted(testkit::offer(1), ms(100))
}

/// `record` advanced to `state` at revision + 1, with `edit` applied.
fn step(record: &InboxRecord, state: State, edit: impl FnOnce(&mut InboxRecord)) -> InboxRecord {
    let mut next = record.clone();
    next.revision = record.revision.next().unwrap();
    next.state = state;
    next.updated_at_ms = record.updated_at_ms.saturating_add(1);
    edit(&mut next);
    next
}

fn launching(record: &InboxRecord) -> InboxRecord {
    step(record, State::Launching, |r| {
        r.executor_started_at_ms = Some(ms(102));
        r.log_artifact_id =
            Some(LogArtifactId::new("wlog-0123456789abcdef0123456789abcd").unwrap());
        r.completion_receipt_callback_sequence = Some(CallbackSequence::new(1).unwrap());
        r.completion_receipt_token_digest =
            Some(CapabilityDigest::new(Sha256Digest::of(b"capability")));
    })
}

fn check(stored: &InboxRecord, proposed: &InboxRecord) -> Result<(), TransitionError> {
    check_transition(stored, proposed, stored.revision)
}

#[test]
fn the_happy_path_walks_every_acknowledgement_to_revision_five() {
    let r0 = accepted();
    let r1 = step(&r0, State::StartingAcknowledged, |_| {});
    let r2 = launching(&r1);
    let r3 = step(&r2, State::Started, |r| {
        r.executor_handle = Some(ExecutorHandle::new("ql3lp1.handle").unwrap());
    });
    let r4 = step(&r3, State::RunningAcknowledged, |_| {});
    let r5 = step(&r4, State::CompletionAcknowledged, |r| {
        r.completion_acknowledged_at_ms = Some(ms(200));
    });
    for (a, b) in [(&r0, &r1), (&r1, &r2), (&r2, &r3), (&r3, &r4), (&r4, &r5)] {
        assert_eq!(check(a, b), Ok(()), "{} -> {}", a.state, b.state);
    }
    assert_eq!(r5.revision.get(), 5);
}

#[test]
fn stale_expected_revision_is_rejected_with_both_revisions() {
    let r0 = accepted();
    let r1 = step(&r0, State::StartingAcknowledged, |_| {});
    let err = check_transition(&r1, &step(&r1, State::Launching, |_| {}), Revision::FIRST);
    assert_eq!(
        err,
        Err(TransitionError::StaleRevision {
            expected: Revision::FIRST,
            found: r1.revision
        })
    );
}

#[test]
fn revision_must_be_exactly_expected_plus_one() {
    let r0 = accepted();
    let mut skip = step(&r0, State::StartingAcknowledged, |_| {});
    skip.revision = Revision::new(2).unwrap();
    assert_eq!(
        check(&r0, &skip),
        Err(TransitionError::RevisionNotNext {
            required: Some(Revision::new(1).unwrap()),
            proposed: Revision::new(2).unwrap()
        })
    );
    let mut same = skip.clone();
    same.revision = Revision::FIRST;
    assert!(matches!(
        check(&r0, &same),
        Err(TransitionError::RevisionNotNext { .. })
    ));
}

#[test]
fn offer_authority_changes_name_the_field() {
    let r0 = accepted();
    let mut other_token = step(&r0, State::Accepted, |_| {});
    other_token.offer.lease_token = testkit::lease_token(9);
    other_token.offer.lease.lease_token_digest = other_token.offer.lease_token.digest();
    assert_eq!(
        check(&r0, &other_token),
        Err(TransitionError::AuthorityChanged {
            field: "lease.leaseTokenDigest"
        })
    );
    let mut other_kind = step(&r0, State::Accepted, |_| {});
    other_kind.offer.delivery_kind = ql_worker_core::offer::DeliveryKind::LeaseRecovery;
    assert_eq!(
        check(&r0, &other_kind),
        Err(TransitionError::AuthorityChanged {
            field: "deliveryKind"
        })
    );
    let mut other_priority = step(&r0, State::Accepted, |_| {});
    other_priority.offer.candidate.priority = 7;
    assert_eq!(
        check(&r0, &other_priority),
        Err(TransitionError::AuthorityChanged { field: "candidate" })
    );
}

#[test]
fn accepted_at_is_fixed_and_updated_at_never_goes_back() {
    let r0 = accepted();
    let moved = step(&r0, State::Accepted, |r| {
        r.accepted_at_ms = ms(50);
        r.updated_at_ms = ms(100);
    });
    assert_eq!(check(&r0, &moved), Err(TransitionError::AcceptedAtChanged));
    let r1 = step(&r0, State::StartingAcknowledged, |r| {
        r.updated_at_ms = ms(150)
    });
    let back = step(&r1, State::Launching, |r| r.updated_at_ms = ms(149));
    let back = launching(&back);
    let back = InboxRecord {
        revision: r1.revision.next().unwrap(),
        updated_at_ms: ms(149),
        ..back
    };
    assert_eq!(
        check(&r1, &back),
        Err(TransitionError::UpdatedAtRegressed {
            stored: ms(150),
            proposed: ms(149)
        })
    );
}

#[test]
fn lease_version_only_moves_forward_and_is_identical_at_the_same_version() {
    let r0 = accepted();
    let mut renewed = step(&r0, State::Accepted, |_| {});
    renewed.offer.lease.version = LeaseVersion::new(1).unwrap();
    renewed.offer.lease.renewed_at_ms = ms(40);
    renewed.offer.lease.expires_at_ms = ms(70_000);
    assert_eq!(check(&r0, &renewed), Ok(()));
    let mut back = step(&renewed, State::Accepted, |_| {});
    back.offer.lease = r0.offer.lease.clone();
    assert_eq!(
        check(&renewed, &back),
        Err(TransitionError::LeaseVersionRegressed {
            stored: 1,
            proposed: 0
        })
    );
    let mut drift = step(&r0, State::Accepted, |_| {});
    drift.offer.lease.expires_at_ms = ms(99_999);
    assert_eq!(
        check(&r0, &drift),
        Err(TransitionError::LeaseChangedAtSameVersion)
    );
}

#[test]
fn edges_outside_the_table_are_illegal() {
    let r0 = accepted();
    let skip = launching(&r0);
    assert_eq!(
        check(&r0, &skip),
        Err(TransitionError::IllegalEdge {
            from: State::Accepted,
            to: State::Launching
        })
    );
}

#[test]
fn terminal_states_never_leave() {
    let r1 = step(&accepted(), State::StartingAcknowledged, |_| {});
    let failed = step(&r1, State::StartFailed, |_| {});
    let acked = step(&failed, State::StartFailureAcknowledged, |_| {});
    assert_eq!(check(&failed, &acked), Ok(()));
    let out = step(&acked, State::RecoveryRequired, |r| {
        r.recovery_reason = Some(RecoveryReason::ControlPlaneTerminal);
    });
    assert_eq!(
        check(&acked, &out),
        Err(TransitionError::IllegalEdge {
            from: State::StartFailureAcknowledged,
            to: State::RecoveryRequired
        })
    );
    assert!(State::CompletionAcknowledged.is_terminal());
    assert!(!State::RecoveryRequired.is_terminal());
}

#[test]
fn write_once_fields_keep_their_value() {
    let r2 = launching(&step(&accepted(), State::StartingAcknowledged, |_| {}));
    let moved = step(&r2, State::Launching, |r| {
        r.executor_started_at_ms = Some(ms(103))
    });
    assert_eq!(
        check(&r2, &moved),
        Err(TransitionError::WriteOnceChanged {
            field: OptionalField::ExecutorStartedAtMs
        })
    );
    let recovery = step(&r2, State::RecoveryRequired, |r| {
        r.recovery_reason = Some(RecoveryReason::LaunchOutcomeUnknown);
    });
    assert_eq!(check(&r2, &recovery), Ok(()));
    let other_reason = step(&recovery, State::RecoveryRequired, |r| {
        r.recovery_reason = Some(RecoveryReason::ControlPlaneTerminal);
    });
    assert_eq!(
        check(&recovery, &other_reason),
        Err(TransitionError::WriteOnceChanged {
            field: OptionalField::RecoveryReason
        })
    );
}

#[test]
fn recovery_reason_is_dropped_only_on_completion_from_recovery() {
    let r2 = launching(&step(&accepted(), State::StartingAcknowledged, |_| {}));
    let recovery = step(&r2, State::RecoveryRequired, |r| {
        r.recovery_reason = Some(RecoveryReason::LaunchOutcomeUnknown);
    });
    let completed = step(&recovery, State::CompletionAcknowledged, |r| {
        r.recovery_reason = None;
        r.completion_acknowledged_at_ms = Some(ms(300));
    });
    assert_eq!(check(&recovery, &completed), Ok(()));
    assert_eq!(completed.recovery(), None);
    assert_eq!(
        recovery.recovery(),
        Some(RecoveryReason::LaunchOutcomeUnknown)
    );
}

#[test]
fn per_state_presence_is_enforced_on_the_proposed_record() {
    let r1 = step(&accepted(), State::StartingAcknowledged, |_| {});
    let bare = step(&r1, State::Launching, |_| {});
    assert_eq!(
        check(&r1, &bare),
        Err(TransitionError::InvalidProposed(
            RecordError::FieldPresence {
                state: State::Launching,
                field: OptionalField::ExecutorStartedAtMs,
                expected: Presence::Required,
            }
        ))
    );
    let half = step(&launching(&r1), State::Launching, |r| {
        r.completion_receipt_token_digest = None
    });
    assert_eq!(
        half.validate(),
        Err(RecordError::CompletionReceiptHalfPresent)
    );
    let mut handle_only = accepted();
    handle_only.state = State::RecoveryRequired;
    handle_only.recovery_reason = Some(RecoveryReason::LaunchOutcomeUnknown);
    handle_only.executor_handle = Some(ExecutorHandle::new("h").unwrap());
    assert_eq!(
        handle_only.validate(),
        Err(RecordError::HandleWithoutStartTime)
    );
}

#[test]
fn a_corrupt_stored_record_fails_closed() {
    let mut stored = accepted();
    stored.schema_version = 2;
    let proposed = step(&stored, State::StartingAcknowledged, |r| {
        r.schema_version = 1
    });
    assert_eq!(
        check(&stored, &proposed),
        Err(TransitionError::InvalidStored(RecordError::SchemaVersion {
            found: 2
        }))
    );
    let mut before = accepted();
    before.updated_at_ms = ms(99);
    assert_eq!(before.validate(), Err(RecordError::UpdatedBeforeAccepted));
}

#[test]
fn an_inconsistent_offer_is_an_invalid_record() {
    let mut r = accepted();
    r.offer.lease.run_id = ql_worker_core::ids::RunId::new("run-2").unwrap();
    assert!(matches!(r.validate(), Err(RecordError::Offer(_))));
}

#[test]
fn errors_render_the_rule() {
    let e = TransitionError::IllegalEdge {
        from: State::Accepted,
        to: State::Started,
    };
    assert_eq!(e.to_string(), "illegal transition accepted -> started");
    let e = TransitionError::StaleRevision {
        expected: Revision::FIRST,
        found: Revision::new(3).unwrap(),
    };
    assert_eq!(e.to_string(), "stale revision: expected 0, stored 3");
}
