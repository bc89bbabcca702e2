//! `check_transition` and `validate`, rule by rule: the happy path, stale and skipped revisions,
//! authority and lease changes, write-once fields, per-state presence and corrupt stored records.

use ql_worker_core::ids::{
    CallbackSequence, CapabilityDigest, ExecutorHandle, LeaseVersion, LogArtifactId, Revision,
    Sha256Digest,
};
use ql_worker_core::offer::OfferError;
use ql_worker_core::record::{
    InboxRecord, OptionalField, Presence, RecordError, RecoveryReason, State, TransitionError,
    ValidRecord, check_transition,
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

#[test]
fn a_tampered_revision_is_caught_once_by_validation_and_then_by_comparison() {
    let r0 = accepted();
    let tampered = with_tampered_revision(&r0);
    // From outside (a decode, a new ValidRecord): re-normalized and re-digested.
    assert!(matches!(
        ValidRecord::new(tampered.clone()),
        Err(RecordError::Offer(OfferError::Bound {
            field: "executionRevision",
            ..
        }))
    ));
    assert!(matches!(
        check(
            &tampered,
            &step(&tampered, State::StartingAcknowledged, |_| {})
        ),
        Err(TransitionError::InvalidStored(RecordError::Offer(_)))
    ));
    // As a successor of a valid record: compared with the validated revision, not digested.
    let proposed = with_tampered_revision(&step(&r0, State::StartingAcknowledged, |_| {}));
    let changed = Err(TransitionError::AuthorityChanged {
        field: "executionRevision",
    });
    assert_eq!(check(&r0, &proposed), changed);
    let valid = ValidRecord::new(r0.clone()).unwrap();
    assert_eq!(valid.advance(proposed, r0.revision).map(|_| ()), changed);
}

#[test]
fn a_valid_record_walks_the_happy_path_with_the_verdicts_of_check_transition() {
    let r0 = accepted();
    let r1 = step(&r0, State::StartingAcknowledged, |_| {});
    let r2 = launching(&r1);
    let r3 = step(&r2, State::Started, |r| {
        r.executor_handle = Some(ExecutorHandle::new("ql3lp1.handle").unwrap());
    });
    let mut valid = ValidRecord::new(r0.clone()).unwrap();
    for next in [&r1, &r2, &r3] {
        let stored = valid.clone();
        valid = stored.advance(next.clone(), stored.revision).unwrap();
        assert_eq!(&*valid, next);
    }
    // Refusals are the same as check_transition's, for the same reasons.
    let back = step(&r3, State::Launching, |_| {});
    let refused = valid.advance(back.clone(), r3.revision).map(|_| ());
    assert!(refused.is_err());
    assert_eq!(refused, check(&r3, &back));
    let at_r1 = ValidRecord::new(r1.clone()).unwrap();
    let to_accepted = step(&r1, State::Accepted, |_| {});
    assert_eq!(
        at_r1.advance(to_accepted, r1.revision).map(|_| ()),
        Err(TransitionError::IllegalEdge {
            from: State::StartingAcknowledged,
            to: State::Accepted
        })
    );
    assert!(matches!(
        valid.advance(step(&r3, State::Started, |_| {}), r2.revision),
        Err(TransitionError::StaleRevision { .. })
    ));
    assert_eq!(valid.into_inner(), r3);
}

#[test]
fn either_half_of_the_completion_receipt_counts_as_set() {
    let r2 = launching(&step(&accepted(), State::StartingAcknowledged, |_| {}));
    let mut sequence_only = r2.clone();
    sequence_only.completion_receipt_token_digest = None;
    let mut digest_only = r2.clone();
    digest_only.completion_receipt_callback_sequence = None;
    for half in [&sequence_only, &digest_only] {
        assert!(half.has(OptionalField::CompletionReceipt));
        assert_eq!(
            half.validate(),
            Err(RecordError::CompletionReceiptHalfPresent)
        );
    }
    assert!(!accepted().has(OptionalField::CompletionReceipt));
}

#[test]
fn names_are_the_reference_wire_names() {
    use std::string::ToString;
    let reasons = [
        "launch_outcome_unknown",
        "control_plane_already_running",
        "control_plane_terminal",
        "lease_lost_local_execution_stopped",
        "lease_lost_local_execution_unverified",
    ];
    for (reason, name) in RecoveryReason::ALL.into_iter().zip(reasons) {
        assert_eq!(reason.as_str(), name);
        assert_eq!(reason.to_string(), name);
        assert_eq!(
            serde_json::to_string(&reason).unwrap(),
            format!("\"{name}\"")
        );
    }
    let fields = [
        "executorHandle",
        "executorStartedAtMs",
        "logArtifactId",
        "completionReceiptCallbackSequence/TokenDigest",
        "completionAcknowledgedAtMs",
        "recoveryReason",
    ];
    for (field, name) in OptionalField::ALL.into_iter().zip(fields) {
        assert_eq!(field.as_str(), name);
    }
}

#[test]
fn only_the_states_before_the_spawn_barrier_can_be_dormant() {
    // docs/state-machine.md: nothing was spawned in these three states.
    let pre_barrier = [
        State::Accepted,
        State::StartingAcknowledged,
        State::StartFailed,
    ];
    for state in State::ALL {
        assert_eq!(
            state.is_pre_barrier(),
            pre_barrier.contains(&state),
            "{state}"
        );
    }
    let r0 = accepted();
    let expiry = r0.offer.lease.expires_at_ms;
    let before = ms(expiry.get() - 1);
    // The lease is live while `now < expiresAtMs`: dormant from the expiry on, not before.
    assert!(!r0.is_dormant(before));
    assert!(r0.is_dormant(expiry));
    let r1 = step(&r0, State::StartingAcknowledged, |_| {});
    let failed = step(&r1, State::StartFailed, |_| {});
    assert!(failed.is_dormant(expiry) && !failed.is_dormant(before));
    let spawning = launching(&r1);
    assert!(!spawning.is_dormant(expiry));
    assert!(!spawning.is_dormant(ms(expiry.get() + 1)));
}

#[test]
fn record_errors_render_the_rule_and_the_field() {
    use std::string::ToString;
    let presence = |expected| RecordError::FieldPresence {
        state: State::Launching,
        field: OptionalField::ExecutorStartedAtMs,
        expected,
    };
    let cases = [
        (
            RecordError::SchemaVersion { found: 2 },
            "record schemaVersion must be 1, found 2",
        ),
        (
            RecordError::UpdatedBeforeAccepted,
            "record updatedAtMs is before acceptedAtMs",
        ),
        (
            presence(Presence::Required),
            "record field executorStartedAtMs must be present in state launching",
        ),
        (
            presence(Presence::Absent),
            "record field executorStartedAtMs must be absent in state launching",
        ),
        (
            presence(Presence::Optional),
            "record field executorStartedAtMs must be optional in state launching",
        ),
        (
            RecordError::HandleWithoutStartTime,
            "record executorHandle requires executorStartedAtMs",
        ),
        (
            RecordError::CompletionReceiptHalfPresent,
            "record completionReceiptCallbackSequence and TokenDigest must be both present \
             or both absent",
        ),
    ];
    for (error, text) in cases {
        assert_eq!(error.to_string(), text);
    }
    let e = TransitionError::WriteOnceChanged {
        field: OptionalField::LogArtifactId,
    };
    assert_eq!(
        e.to_string(),
        "write-once field logArtifactId must keep its value"
    );
}

/// A record whose revision was changed without re-sealing: its own `contentDigest` and the
/// offer's `executionDigest` still agree, so only re-digesting (or comparing with a
/// validated revision) can tell.
fn with_tampered_revision(record: &InboxRecord) -> InboxRecord {
    let mut tampered = record.clone();
    tampered.offer.execution_revision.working_directory = Some("/tmp".into());
    tampered
}
