//! The reference's contract scenarios (reference §6.9, `RC/*.test.cjs`), one test per title, plus
//! the strictness rules the serde layer needs help with.

mod wire_support;

use ql_worker_core::ids::{LeaseToken, OfferId, SessionId, WorkerGeneration, WorkerId};
use ql_worker_core::wire::WireError;
use ql_worker_core::wire::activation::{ActivationResponse, SnapshotShape};
use ql_worker_core::wire::artifact::{ArtifactReceipt, MAX_ARTIFACT_BYTES};
use ql_worker_core::wire::completion::{CompletionResponse, Outcome};
use ql_worker_core::wire::lease_control::{LeaseControlRequest, LeaseControlResponse};
use ql_worker_core::wire::offer::{AdmissionError, OfferResponse, admit_offer};
use ql_worker_core::wire::secrets::SecretsResponse;
use ql_worker_core::wire::session::SessionResponse;
use ql_worker_sim::fuzzing::wire as fx;
use ql_worker_tests::server_wire::{ToJson as _, ToJsonFor as _, parse_artifact_preamble};
use serde_json::{Value, json};
use wire_support::{example, mutate, pad_to, prepend_member};

fn offered() -> Box<ql_worker_core::wire::offer::OfferedOffer> {
    match OfferResponse::parse(&example("offer_offered")).unwrap() {
        OfferResponse::Offered { offer, .. } => offer,
        OfferResponse::Idle { .. } => panic!("offered"),
    }
}

/// A JSON shape error; inside the execution revision it is the revision's own verdict.
fn is_shape_error(error: &WireError) -> bool {
    matches!(
        error,
        WireError::Json { .. }
            | WireError::Revision(ql_worker_core::revision::RevisionError::Json(_))
    )
}

fn sent() -> ql_worker_core::ids::Sha256Digest {
    ql_worker_core::ids::Sha256Digest::from_hex(fx::SENT_SHA256).unwrap()
}

// ---- RC/remoteOfferDelivery.test.cjs --------------------------------------------------------

#[test]
fn wire_offer_round_trips_an_authenticated_offer_without_serializing_the_lease_capability() {
    let bytes = example("offer_offered");
    let (offer_id, worker, token) = fx::claim();
    let offer = admit_offer(&offered(), &offer_id, &worker, &token).unwrap();
    let reserialized = OfferResponse::parse(&bytes).unwrap().to_json();
    assert_eq!(reserialized, bytes);
    let text = String::from_utf8(reserialized).unwrap();
    assert!(
        !text.contains(token.expose()),
        "the response never carries the token"
    );
    assert!(!text.contains(&offer.lease.lease_token_digest.expose().to_hex()));
    assert!(
        !format!("{offer:?}").contains(token.expose()),
        "Debug is redacted"
    );
}

#[test]
fn wire_offer_rejects_target_drift_unknown_fields_and_oversized_responses() {
    let offer = offered();
    let (offer_id, worker, token) = fx::claim();
    let other_offer = OfferId::new("another-offer").unwrap();
    assert!(matches!(
        admit_offer(&offer, &other_offer, &worker, &token),
        Err(AdmissionError::ClaimMismatch {
            path: "offer.offerId",
            ..
        })
    ));
    let mut drifted = worker.clone();
    drifted.generation = WorkerGeneration::new(3).unwrap();
    assert!(matches!(
        admit_offer(&offer, &offer_id, &drifted, &token),
        Err(AdmissionError::ClaimMismatch {
            path: "offer.worker.generation",
            ..
        })
    ));
    drifted = worker.clone();
    drifted.session_id = SessionId::new("018f0000-0000-7000-8000-000000000002").unwrap();
    assert!(admit_offer(&offer, &offer_id, &drifted, &token).is_err());
    drifted = worker.clone();
    drifted.worker_id = WorkerId::new("edge-2").unwrap();
    assert!(admit_offer(&offer, &offer_id, &drifted, &token).is_err());
    // A different token still admits (it is the claim's), but its digest is what the lease holds.
    let other_token = LeaseToken::new("C".repeat(43)).unwrap();
    let admitted = admit_offer(&offer, &offer_id, &worker, &other_token).unwrap();
    assert_eq!(admitted.lease.lease_token_digest, other_token.digest());

    let base = example("offer_offered");
    for (label, edit) in [
        (
            "top",
            Box::new(|v: &mut Value| {
                v["extra"] = json!(1);
            }) as Box<dyn Fn(&mut Value)>,
        ),
        (
            "offer",
            Box::new(|v: &mut Value| {
                v["offer"]["workerId"] = json!("edge-1");
            }),
        ),
        (
            "candidate",
            Box::new(|v: &mut Value| {
                v["offer"]["candidate"]["stepRunId"] = json!("s");
            }),
        ),
        (
            "worker",
            Box::new(|v: &mut Value| {
                v["offer"]["worker"]["status"] = json!("online");
            }),
        ),
        (
            "lease",
            Box::new(|v: &mut Value| {
                v["offer"]["lease"]["leaseToken"] = json!(fx::OFFER_LEASE_TOKEN);
            }),
        ),
        (
            "lease digest",
            Box::new(|v: &mut Value| {
                v["offer"]["lease"]["leaseTokenDigest"] = json!("a".repeat(64));
            }),
        ),
        (
            "revision",
            Box::new(|v: &mut Value| {
                v["offer"]["executionRevision"]["x"] = json!(1);
            }),
        ),
        (
            "command",
            Box::new(|v: &mut Value| {
                v["offer"]["executionRevision"]["command"]["env"] = json!([]);
            }),
        ),
        (
            "stats",
            Box::new(|v: &mut Value| {
                v["stats"]["scanned"] = json!(0);
            }),
        ),
    ] {
        let err = OfferResponse::parse(&mutate(&base, edit)).unwrap_err();
        assert!(is_shape_error(&err), "{label}: {err}");
    }
    let binding = mutate(&base, |v| {
        v["offer"]["executionRevision"]["environment"][0]["secretRef"] = json!("x");
    });
    assert!(
        OfferResponse::parse(&binding).is_err(),
        "public binding with a secretRef"
    );
    let oversized = pad_to(&base, 128 * 1024 + 1);
    assert!(matches!(
        OfferResponse::parse(&oversized),
        Err(WireError::Size {
            len: 131_073,
            cap: 131_072,
            ..
        })
    ));
    assert!(
        OfferResponse::parse(&pad_to(&base, 128 * 1024)).is_ok(),
        "exactly at the cap"
    );
    assert!(matches!(
        OfferResponse::parse(b"{"),
        Err(WireError::Size { .. })
    ));
}

#[test]
fn wire_offer_validates_bounded_idle_responses_with_the_same_versioned_schema() {
    let base = example("offer_idle");
    assert!(OfferResponse::parse(&base).is_ok());
    let schema = mutate(&base, |v| {
        v["schema"] = json!("qinglong/remote-execution-offer@v2")
    });
    assert!(matches!(
        OfferResponse::parse(&schema),
        Err(WireError::Field { path: "schema", .. })
    ));
    let reason = mutate(&base, |v| v["reason"] = json!("sleeping"));
    assert!(OfferResponse::parse(&reason).is_err());
    for (key, value, path) in [
        ("pages", 17, "stats.pages"),
        ("candidates", 1025, "stats.candidates"),
        ("plansUnavailable", 1, "stats.plansUnavailable"),
        ("placementMismatches", 1, "stats.placementMismatches"),
        ("claimAttempts", 65, "stats.claimAttempts"),
        ("claimRaces", 1, "stats.claimRaces"),
    ] {
        let bytes = mutate(&base, |v| v["stats"][key] = json!(value));
        assert_eq!(
            OfferResponse::parse(&bytes).unwrap_err(),
            WireError::Field {
                path,
                rule: match path {
                    "stats.pages" => "<= 16",
                    "stats.candidates" => "<= 1024",
                    "stats.plansUnavailable" | "stats.placementMismatches" => "<= stats.candidates",
                    "stats.claimAttempts" => "<= 64",
                    _ => "<= stats.claimAttempts",
                }
            },
            "{key}"
        );
    }
    let with_offer = mutate(&base, |v| v["offer"] = json!({}));
    assert!(
        OfferResponse::parse(&with_offer).is_err(),
        "idle is exactly 5 keys"
    );
    let truncated = mutate(&base, |v| v["truncated"] = json!(null));
    assert!(OfferResponse::parse(&truncated).is_err());
    let negative = mutate(&base, |v| v["stats"]["pages"] = json!(-1));
    assert!(OfferResponse::parse(&negative).is_err());
    let float = String::from_utf8(base.clone())
        .unwrap()
        .replace("\"pages\":1", "\"pages\":1.0");
    assert!(
        OfferResponse::parse(float.as_bytes()).is_err(),
        "integers only"
    );
}

#[test]
fn wire_offer_rejects_drifted_revision_authority() {
    let base = example("offer_offered");
    let digest = mutate(&base, |v| {
        v["offer"]["executionDigest"] = json!("c".repeat(64))
    });
    assert!(matches!(
        OfferResponse::parse(&digest),
        Err(WireError::Mismatch {
            path: "offer.executionDigest",
            ..
        })
    ));
    let task = mutate(&base, |v| {
        v["offer"]["candidate"]["taskId"] = json!("task-2")
    });
    assert!(matches!(
        OfferResponse::parse(&task),
        Err(WireError::Mismatch {
            path: "offer.executionRevision",
            ..
        })
    ));
    let content = mutate(&base, |v| {
        v["offer"]["executionRevision"]["timeoutMs"] = json!(5001)
    });
    assert!(matches!(
        OfferResponse::parse(&content),
        Err(WireError::Revision(
            ql_worker_core::revision::RevisionError::DigestMismatch
        ))
    ));
    let lease = mutate(&base, |v| v["offer"]["lease"]["expiresAtMs"] = json!(20));
    assert!(matches!(
        OfferResponse::parse(&lease),
        Err(WireError::Field {
            path: "offer.lease.expiresAtMs",
            ..
        })
    ));
    let executor = mutate(&base, |v| {
        v["offer"]["candidate"]["executorType"] = json!("local_process")
    });
    assert!(OfferResponse::parse(&executor).is_err());
    let null_placement = mutate(&base, |v| {
        v["offer"]["executionRevision"]["placement"] = json!(null)
    });
    assert!(
        OfferResponse::parse(&null_placement).is_err(),
        "optional keys may not be null"
    );
    let status = mutate(&base, |v| v["status"] = json!("leased"));
    assert!(OfferResponse::parse(&status).is_err());
}

// ---- RC/remoteRunActivationDelivery.test.cjs -----------------------------------------------

#[test]
fn wire_activation_round_trips_one_exact_versioned_activation_response() {
    let bytes = example("activation_starting");
    let parsed = ActivationResponse::parse(&bytes, &fx::starting_request()).unwrap();
    assert_eq!(parsed.shape, SnapshotShape::Starting);
    assert_eq!(
        parsed.snapshot.deadline_at_ms.map(|d| d.get()),
        Some(35_000)
    );
    assert_eq!(parsed.to_json(), bytes);
}

#[test]
fn wire_activation_rejects_schema_drift_unknown_fields_and_incomplete_terminal_snapshots() {
    let request = fx::starting_request();
    let base = example("activation_starting");
    let schema = mutate(&base, |v| {
        v["schema"] = json!("qinglong/remote-run-activation@v2")
    });
    assert!(ActivationResponse::parse(&schema, &request).is_err());
    let unknown = mutate(&base, |v| v["snapshot"]["workerId"] = json!("edge-1"));
    assert!(is_shape_error(
        &ActivationResponse::parse(&unknown, &request).unwrap_err()
    ));
    let event = mutate(&base, |v| v["eventId"] = json!("e"));
    assert!(ActivationResponse::parse(&event, &request).is_err());
    let terminal = example("activation_terminal");
    for key in ["finishedAtMs", "errorCode"] {
        let incomplete = mutate(&terminal, |v| {
            v["snapshot"].as_object_mut().unwrap().remove(key);
        });
        assert_eq!(
            ActivationResponse::parse(&incomplete, &request).unwrap_err(),
            WireError::Field {
                path: "snapshot",
                rule: "one of the starting, running or terminal shapes"
            },
            "{key}"
        );
    }
    let mixed = mutate(&terminal, |v| {
        v["snapshot"]["attemptStatus"] = json!("cancelled")
    });
    assert!(
        ActivationResponse::parse(&mixed, &request).is_err(),
        "run/attempt status must agree"
    );
    let missing = mutate(&base, |v| {
        v["snapshot"]
            .as_object_mut()
            .unwrap()
            .remove("callbackSequence");
    });
    assert!(is_shape_error(
        &ActivationResponse::parse(&missing, &request).unwrap_err()
    ));
}

#[test]
fn wire_activation_bounds_response_bytes_status_values_and_optional_diagnostic_fields() {
    let request = fx::starting_request();
    let base = example("activation_starting");
    assert!(matches!(
        ActivationResponse::parse(&pad_to(&base, 16 * 1024 + 1), &request),
        Err(WireError::Size { .. })
    ));
    assert!(ActivationResponse::parse(&pad_to(&base, 16 * 1024), &request).is_ok());
    let deadline = mutate(&base, |v| v["snapshot"]["deadlineAtMs"] = json!(-1));
    assert!(ActivationResponse::parse(&deadline, &request).is_err());
    let status = mutate(&base, |v| v["status"] = json!("already_running"));
    assert_eq!(
        ActivationResponse::parse(&status, &request).unwrap_err(),
        WireError::Field {
            path: "status",
            rule: "consistent with the snapshot shape"
        }
    );
    let unknown_status = mutate(&base, |v| v["status"] = json!("started"));
    assert!(ActivationResponse::parse(&unknown_status, &request).is_err());
    let running = example("activation_running");
    let long = mutate(&running, |v| {
        v["snapshot"]["executorHandle"] = json!("h".repeat(513))
    });
    assert!(matches!(
        ActivationResponse::parse(&long, &fx::running_request()),
        Err(WireError::Field {
            path: "snapshot.executorHandle",
            ..
        })
    ));
    let code = mutate(&example("activation_terminal"), |v| {
        v["snapshot"]["errorCode"] = json!("e".repeat(129))
    });
    assert!(ActivationResponse::parse(&code, &request).is_err());
    let sequence = mutate(&base, |v| {
        v["snapshot"]["callbackSequence"] = json!(2_147_483_648u64)
    });
    assert!(ActivationResponse::parse(&sequence, &request).is_err());
}

#[test]
fn wire_activation_rejects_a_response_whose_run_authority_does_not_match_the_request() {
    let request = fx::starting_request();
    let base = example("activation_starting");
    for (key, value, path) in [
        ("runId", json!("run-2"), "snapshot.runId"),
        ("attemptId", json!("attempt-2"), "snapshot.attemptId"),
        ("leaseGeneration", json!(4), "snapshot.leaseGeneration"),
    ] {
        let bytes = mutate(&base, |v| v["snapshot"][key] = value);
        assert!(
            matches!(ActivationResponse::parse(&bytes, &request), Err(WireError::Mismatch { path: p, .. }) if p == path),
            "{key}"
        );
    }
}

// ---- RC/remoteWorkerCompletion.test.cjs ----------------------------------------------------

#[test]
fn wire_completion_frames_one_exact_artifact_header_without_duplicating_path_identity() {
    let upload = fx::artifact_upload();
    let preamble = upload.preamble().unwrap();
    let header = upload.header_json().unwrap();
    assert_eq!(
        &preamble[..4],
        &u32::try_from(header.len()).unwrap().to_be_bytes()
    );
    assert_eq!(&preamble[4..], &header[..]);
    let text = std::str::from_utf8(&header).unwrap();
    assert!(
        !text.contains("workerId")
            && !text.contains("workerSessionId")
            && !text.contains("sessionId")
    );
    // The whole request: the preamble, then the log's 17 bytes.
    let content_length = (4 + header.len() + 17) as u64;
    assert_eq!(content_length, preamble.len() as u64 + upload.byte_length);
    let (parsed, offset) = parse_artifact_preamble(&preamble, Some(content_length)).unwrap();
    assert_eq!((parsed, offset), (upload.clone(), preamble.len()));
    assert!(parse_artifact_preamble(&preamble, Some(content_length + 1)).is_err());
    let mut short = preamble.to_vec();
    short[3] = 1;
    assert!(
        parse_artifact_preamble(&short, None).is_err(),
        "header length below 2"
    );
    short[2] = 0x10;
    short[3] = 0x01;
    assert!(
        parse_artifact_preamble(&short, None).is_err(),
        "header length above 4096"
    );
}

#[test]
fn wire_completion_round_trips_immutable_artifact_receipts_and_nullable_truncation() {
    let mut upload = fx::artifact_upload();
    upload.truncated = None;
    let header = String::from_utf8(upload.header_json().unwrap().to_vec()).unwrap();
    assert!(header.ends_with("\"truncated\":null}"));
    let bytes = mutate(&example("artifact_response"), |v| {
        v["truncated"] = json!(null)
    });
    let receipt = ArtifactReceipt::parse(&bytes, &upload, &sent()).unwrap();
    let again = ArtifactReceipt::parse(&receipt.to_json(&upload), &upload, &sent()).unwrap();
    assert_eq!(again, receipt);
    // The receipt must repeat exactly what was sent: nullable truncation is not "false".
    assert!(ArtifactReceipt::parse(&example("artifact_response"), &upload, &sent()).is_err());
    let missing = mutate(&bytes, |v| {
        v.as_object_mut().unwrap().remove("truncated");
    });
    assert!(
        is_shape_error(&ArtifactReceipt::parse(&missing, &upload, &sent()).unwrap_err()),
        "truncated must be present, even null"
    );
}

#[test]
fn wire_completion_round_trips_an_exact_path_bound_completion_request_and_response() {
    let request = fx::completion_request();
    let body = String::from_utf8(request.to_body().unwrap().to_vec()).unwrap();
    assert_eq!(body.as_bytes(), example("completion_request"));
    assert!(!body.contains("workerId") && !body.contains("callbackToken\""));
    let response = CompletionResponse::parse(&example("completion_response"), &request).unwrap();
    assert_eq!(response.to_json(), example("completion_response"));
}

#[test]
fn wire_completion_rejects_widened_wire_shapes_and_invalid_path_authority() {
    let request = fx::completion_request();
    let base = example("completion_response");
    for edit in [
        Box::new(|v: &mut Value| {
            v["workerId"] = json!("edge-1");
        }) as Box<dyn Fn(&mut Value)>,
        Box::new(|v: &mut Value| {
            v["callbackToken"] = json!("x");
        }),
        Box::new(|v: &mut Value| {
            v.as_object_mut().unwrap().remove("status");
        }),
    ] {
        assert!(is_shape_error(
            &CompletionResponse::parse(&mutate(&base, edit), &request).unwrap_err()
        ));
    }
    for (key, value) in [
        ("runId", json!("run-2")),
        ("attemptId", json!("attempt-2")),
        ("callbackSequence", json!(2)),
    ] {
        let bytes = mutate(&base, |v| v[key] = value);
        assert!(
            matches!(
                CompletionResponse::parse(&bytes, &request),
                Err(WireError::Mismatch { .. })
            ),
            "{key}"
        );
    }
    let upload = fx::artifact_upload();
    for (key, value) in [
        ("projectId", json!("project-2")),
        (
            "logArtifactId",
            json!("wlog-bbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"),
        ),
        ("byteLength", json!(18)),
        ("sha256", json!("c".repeat(64))),
    ] {
        let bytes = mutate(&example("artifact_response"), |v| v[key] = value);
        assert!(
            matches!(
                ArtifactReceipt::parse(&bytes, &upload, &sent()),
                Err(WireError::Mismatch { .. })
            ),
            "{key}"
        );
    }
    let status = mutate(&example("artifact_response"), |v| {
        v["status"] = json!("pending")
    });
    assert!(ArtifactReceipt::parse(&status, &upload, &sent()).is_err());
}

#[test]
fn wire_completion_rejects_inconsistent_completion_evidence_and_oversized_artifacts() {
    let mut request = fx::completion_request();
    request.result.exit_code = 1;
    assert!(matches!(
        request.to_body(),
        Err(WireError::Request {
            path: "result.outcome",
            ..
        })
    ));
    request.result.outcome = Outcome::Failed;
    assert!(request.to_body().is_ok());
    request.result.finished_at_ms = ql_worker_core::time::UnixMillis::new(99).unwrap();
    assert!(matches!(
        request.to_body(),
        Err(WireError::Request {
            path: "result.finishedAtMs",
            ..
        })
    ));
    let mut request = fx::completion_request();
    request.artifact.byte_length = MAX_ARTIFACT_BYTES + 1;
    assert!(request.to_body().is_err());
    let mut upload = fx::artifact_upload();
    upload.byte_length = MAX_ARTIFACT_BYTES + 1;
    assert!(upload.preamble().is_err());
    upload.byte_length = MAX_ARTIFACT_BYTES;
    assert!(upload.preamble().is_ok());
}

#[test]
fn wire_completion_bounds_artifact_and_completion_response_envelopes() {
    let request = fx::completion_request();
    let base = example("completion_response");
    assert!(matches!(
        CompletionResponse::parse(&pad_to(&base, 4097), &request),
        Err(WireError::Size { .. })
    ));
    assert!(CompletionResponse::parse(&pad_to(&base, 4096), &request).is_ok());
    let artifact = example("artifact_response");
    assert!(matches!(
        ArtifactReceipt::parse(&pad_to(&artifact, 4097), &fx::artifact_upload(), &sent()),
        Err(WireError::Size { .. })
    ));
    let sequence = mutate(&base, |v| v["callbackSequence"] = json!(0));
    assert!(CompletionResponse::parse(&sequence, &request).is_err());
}

// ---- RC/remoteWorkerLeaseControl.test.cjs --------------------------------------------------

#[test]
fn wire_lease_control_round_trips_one_path_bound_lease_control_request() {
    let body = LeaseControlRequest { fence: fx::fence() }
        .to_body()
        .unwrap();
    assert_eq!(&body[..], &example("lease_control_request")[..]);
    let text = std::str::from_utf8(&body).unwrap();
    assert!(!text.contains("workerId") && !text.contains("workerSessionId"));
}

#[test]
fn wire_lease_control_round_trips_renewed_stop_and_terminal_responses() {
    let request = LeaseControlRequest { fence: fx::fence() };
    for name in [
        "lease_control_renewed",
        "lease_control_stop",
        "lease_control_terminal",
    ] {
        let bytes = example(name);
        assert_eq!(
            LeaseControlResponse::parse(&bytes, &request)
                .unwrap()
                .to_json(&request),
            bytes,
            "{name}"
        );
    }
}

#[test]
fn wire_lease_control_rejects_widened_or_internally_inconsistent_control_envelopes() {
    let request = LeaseControlRequest { fence: fx::fence() };
    let renewed = example("lease_control_renewed");
    let terminal = example("lease_control_terminal");
    let stop = example("lease_control_stop");
    let bad: Vec<(&str, Vec<u8>)> = vec![
        (
            "widened",
            mutate(&renewed, |v| v["leaseToken"] = json!(fx::LEASE_TOKEN)),
        ),
        (
            "missing null key",
            mutate(&renewed, |v| {
                v.as_object_mut().unwrap().remove("stop");
            }),
        ),
        (
            "missing terminalStatus",
            mutate(&renewed, |v| {
                v.as_object_mut().unwrap().remove("terminalStatus");
            }),
        ),
        (
            "renewed with stop",
            mutate(&renewed, |v| {
                v["stop"] = json!({"reason":"user","requestedAtMs":1})
            }),
        ),
        (
            "renewed with terminal",
            mutate(&renewed, |v| v["terminalStatus"] = json!("failed")),
        ),
        (
            "renewed without version",
            mutate(&renewed, |v| v["leaseVersion"] = json!(null)),
        ),
        (
            "expiry not after renewal",
            mutate(&renewed, |v| v["expiresAtMs"] = json!(20000)),
        ),
        (
            "terminal with version",
            mutate(&terminal, |v| v["leaseVersion"] = json!(5)),
        ),
        (
            "terminal without status",
            mutate(&terminal, |v| v["terminalStatus"] = json!(null)),
        ),
        (
            "stop without stop",
            mutate(&stop, |v| v["stop"] = json!(null)),
        ),
        (
            "stop widened",
            mutate(&stop, |v| v["stop"]["by"] = json!("user")),
        ),
        (
            "stop reason",
            mutate(&stop, |v| v["stop"]["reason"] = json!("boredom")),
        ),
        (
            "schema",
            mutate(&renewed, |v| {
                v["schema"] = json!("qinglong/remote-worker-lease-control@v2")
            }),
        ),
    ];
    for (label, bytes) in bad {
        assert!(
            LeaseControlResponse::parse(&bytes, &request).is_err(),
            "{label}"
        );
    }
}

#[test]
fn wire_lease_control_rejects_response_identity_or_lease_version_drift() {
    let request = LeaseControlRequest { fence: fx::fence() };
    let renewed = example("lease_control_renewed");
    let version = mutate(&renewed, |v| v["leaseVersion"] = json!(6));
    assert_eq!(
        LeaseControlResponse::parse(&version, &request).unwrap_err(),
        WireError::Mismatch {
            path: "leaseVersion",
            must_equal: "the request's expectedLeaseVersion + 1"
        }
    );
    let same = mutate(&renewed, |v| v["leaseVersion"] = json!(4));
    assert!(LeaseControlResponse::parse(&same, &request).is_err());
    for (key, value) in [
        ("runId", json!("run-2")),
        ("projectId", json!("project-2")),
        ("attemptId", json!("attempt-2")),
        ("offerId", json!("offer-2")),
        ("leaseGeneration", json!(4)),
    ] {
        let bytes = mutate(&renewed, |v| v[key] = value);
        assert!(
            matches!(
                LeaseControlResponse::parse(&bytes, &request),
                Err(WireError::Mismatch { .. })
            ),
            "{key}"
        );
    }
}

// ---- strictness the serde layer needs help with ---------------------------------------------

#[test]
fn wire_duplicate_keys_are_rejected_at_every_level() {
    let request = fx::completion_request();
    let dup = prepend_member(&example("completion_response"), "\"status\":\"applied\"");
    assert!(is_shape_error(
        &CompletionResponse::parse(&dup, &request).unwrap_err()
    ));
    let dup_tag = prepend_member(&example("offer_idle"), "\"status\":\"idle\"");
    assert!(
        OfferResponse::parse(&dup_tag).is_err(),
        "duplicate internally-tagged status"
    );
    let dup_schema = prepend_member(
        &example("offer_offered"),
        "\"schema\":\"qinglong/remote-execution-offer@v1\"",
    );
    assert!(
        OfferResponse::parse(&dup_schema).is_err(),
        "duplicate key in a tagged variant"
    );
    // Labels are a JSON object read as a map: duplicates must be refused explicitly.
    let offered = String::from_utf8(example("offer_offered")).unwrap();
    let labels = offered.replace(
        "\"executors\":[\"remote-worker\"]",
        "\"executors\":[\"remote-worker\"],\"labels\":{\"zone\":\"a\",\"zone\":\"b\"}",
    );
    assert_ne!(labels, offered);
    let err = OfferResponse::parse(labels.as_bytes()).unwrap_err();
    assert!(err.to_string().contains("duplicate object key"), "{err}");
}

#[test]
fn wire_nullable_and_optional_keys_keep_their_presence_rules() {
    let request = fx::running_request();
    let body = String::from_utf8(request.to_body().unwrap().to_vec()).unwrap();
    assert!(
        body.contains("\"logArtifactId\":null"),
        "the running body always sends the key"
    );
    let base = example("activation_starting");
    let null_deadline = mutate(&base, |v| v["snapshot"]["deadlineAtMs"] = json!(null));
    assert!(
        ActivationResponse::parse(&null_deadline, &fx::starting_request()).is_err(),
        "optional, not nullable"
    );
    let absent_deadline = mutate(&base, |v| {
        v["snapshot"]
            .as_object_mut()
            .unwrap()
            .remove("deadlineAtMs");
    });
    assert!(ActivationResponse::parse(&absent_deadline, &fx::starting_request()).is_ok());
}

#[test]
fn wire_json_errors_never_echo_values() {
    let request = fx::secrets_request();
    let secret = "TOPSECRET-VALUE-123";
    let bad = mutate(&example("secrets_response"), |v| {
        v["values"][0]["value"] = json!(secret);
        v["values"][0]["secretRef"] = json!(1);
    });
    let err = SecretsResponse::parse(&bad, &request)
        .unwrap_err()
        .to_string();
    assert!(!err.contains(secret), "{err}");
    let typed = mutate(&example("offer_idle"), |v| {
        v["reason"] = json!(format!("{secret}\""))
    });
    let err = OfferResponse::parse(&typed).unwrap_err().to_string();
    assert!(!err.contains("TOPSECRET"), "{err}");
    let token = mutate(&example("offer_idle"), |v| {
        v["truncated"] = json!(fx::LEASE_TOKEN)
    });
    let err = OfferResponse::parse(&token).unwrap_err().to_string();
    assert!(!err.contains(fx::LEASE_TOKEN), "{err}");
}

#[test]
fn wire_secrets_values_map_one_to_one_in_request_order() {
    let request = fx::secrets_request();
    let base = example("secrets_response");
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "extra value",
            mutate(&base, |v| {
                let item = v["values"][0].clone();
                v["values"].as_array_mut().unwrap().push(item);
            }),
        ),
        ("no value", mutate(&base, |v| v["values"] = json!([]))),
        (
            "wrong ref",
            mutate(&base, |v| {
                v["values"][0]["secretRef"] = json!(fx::secret_ref("OTHER").as_str())
            }),
        ),
        (
            "NUL",
            mutate(&base, |v| v["values"][0]["value"] = json!("a\u{0}b")),
        ),
        (
            "too long",
            mutate(&base, |v| {
                v["values"][0]["value"] = json!("v".repeat(16 * 1024 + 1))
            }),
        ),
        (
            "bundle for none",
            mutate(&base, |v| {
                v["environmentBundles"] = json!([{"secretRef":"x","value":"y"}])
            }),
        ),
        (
            "widened item",
            mutate(&base, |v| v["values"][0]["version"] = json!(1)),
        ),
        ("run drift", mutate(&base, |v| v["runId"] = json!("run-2"))),
        (
            "digest drift",
            mutate(&base, |v| v["executionDigest"] = json!("c".repeat(64))),
        ),
        (
            "offer drift",
            mutate(&base, |v| v["offerId"] = json!("offer-2")),
        ),
    ];
    for (label, bytes) in cases {
        assert!(SecretsResponse::parse(&bytes, &request).is_err(), "{label}");
    }
    let exact = mutate(&base, |v| {
        v["values"][0]["value"] = json!("v".repeat(16 * 1024))
    });
    assert!(
        SecretsResponse::parse(&exact, &request).is_ok(),
        "16 KiB exactly"
    );
    assert!(matches!(
        SecretsResponse::parse(&pad_to(&base, 256 * 1024 + 1), &request),
        Err(WireError::Size { .. })
    ));
}

#[test]
fn wire_session_responses_are_bound_to_path_and_request() {
    let worker = WorkerId::new(fx::WORKER_ID).unwrap();
    let session = SessionId::new(fx::SESSION_ID).unwrap();
    let hb = example("heartbeat_response");
    let request = fx::heartbeat_request();
    for (label, bytes) in [
        ("version", mutate(&hb, |v| v["version"] = json!(5))),
        ("offline", mutate(&hb, |v| v["status"] = json!("offline"))),
        ("worker", mutate(&hb, |v| v["workerId"] = json!("edge-2"))),
        (
            "session",
            mutate(&hb, |v| {
                v["sessionId"] = json!("018f0000-0000-7000-8000-000000000002")
            }),
        ),
        ("generation", mutate(&hb, |v| v["generation"] = json!(3))),
        (
            "widened",
            mutate(&hb, |v| v["replacedSession"] = json!(false)),
        ),
        (
            "schema",
            mutate(&hb, |v| {
                v["schema"] = json!("qinglong/worker-session-register@v1")
            }),
        ),
    ] {
        assert!(
            SessionResponse::parse_heartbeat(&bytes, &worker, &session, &request).is_err(),
            "{label}"
        );
    }
    let tr = mutate(&example("transition_response"), |v| {
        v["status"] = json!("offline")
    });
    assert!(
        SessionResponse::parse_transition(&tr, &worker, &session, &fx::transition_request())
            .is_err()
    );
    let rg = mutate(&example("register_response"), |v| {
        v.as_object_mut().unwrap().remove("replacedSession");
    });
    assert!(SessionResponse::parse_register(&rg, &worker, &session).is_err());
}

#[test]
fn wire_trailing_data_bom_and_lone_surrogates_are_rejected() {
    let request = fx::completion_request();
    let mut trailing = example("completion_response");
    trailing.extend_from_slice(b" {}");
    assert!(CompletionResponse::parse(&trailing, &request).is_err());
    let mut bom = "\u{feff}".as_bytes().to_vec();
    bom.extend_from_slice(&example("completion_response"));
    assert!(CompletionResponse::parse(&bom, &request).is_err());
    let surrogate = String::from_utf8(example("offer_idle"))
        .unwrap()
        .replace("no_candidates", "\\ud800");
    assert!(OfferResponse::parse(surrogate.as_bytes()).is_err());
    let invalid_utf8 = [b"{\"code\":\"".as_slice(), &[0xff, 0xfe], b"\"}"].concat();
    assert!(ql_worker_core::wire::error::parse_error_body(&invalid_utf8).is_err());
}

/// Every response field bound to its request fails with the field's path and the exact rule it
/// must equal (`WireError::Mismatch`), as the operator reads it in the error message.
#[test]
fn wire_every_request_binding_names_its_path_and_rule() {
    fn bound<T: std::fmt::Debug>(result: Result<T, WireError>) -> (&'static str, String) {
        match result.unwrap_err() {
            WireError::Mismatch { path, must_equal } => (path, must_equal.to_owned()),
            other => panic!("not a binding error: {other:?}"),
        }
    }
    let activation = fx::starting_request();
    let starting = example("activation_starting");
    for (key, value, path, rule) in [
        ("runId", json!("run-2"), "snapshot.runId", "runId"),
        (
            "attemptId",
            json!("attempt-2"),
            "snapshot.attemptId",
            "attemptId",
        ),
        (
            "leaseGeneration",
            json!(4),
            "snapshot.leaseGeneration",
            "leaseGeneration",
        ),
    ] {
        let bytes = mutate(&starting, |v| v["snapshot"][key] = value);
        assert_eq!(
            bound(ActivationResponse::parse(&bytes, &activation)),
            (path, format!("the request's {rule}")),
            "activation {key}"
        );
    }
    let completion = fx::completion_request();
    let applied = example("completion_response");
    for (key, value) in [
        ("runId", json!("run-2")),
        ("attemptId", json!("attempt-2")),
        ("callbackSequence", json!(2)),
    ] {
        let bytes = mutate(&applied, |v| v[key] = value);
        assert_eq!(
            bound(CompletionResponse::parse(&bytes, &completion)),
            (key, format!("the request's {key}")),
            "completion {key}"
        );
    }
    let lease = LeaseControlRequest { fence: fx::fence() };
    let renewed = example("lease_control_renewed");
    for (key, value) in [
        ("projectId", json!("project-2")),
        ("runId", json!("run-2")),
        ("attemptId", json!("attempt-2")),
        ("offerId", json!("offer-2")),
        ("leaseGeneration", json!(4)),
    ] {
        let bytes = mutate(&renewed, |v| v[key] = value);
        assert_eq!(
            bound(LeaseControlResponse::parse(&bytes, &lease)),
            (key, format!("the request's {key}")),
            "lease control {key}"
        );
    }
    let secrets = fx::secrets_request();
    let resolved = example("secrets_response");
    for (key, value) in [
        ("runId", json!("run-2")),
        ("attemptId", json!("attempt-2")),
        ("offerId", json!("offer-2")),
        ("executionDigest", json!("c".repeat(64))),
    ] {
        let bytes = mutate(&resolved, |v| v[key] = value);
        assert_eq!(
            bound(SecretsResponse::parse(&bytes, &secrets)),
            (key, format!("the request's {key}")),
            "secrets {key}"
        );
    }
    let worker = WorkerId::new(fx::WORKER_ID).unwrap();
    let session = SessionId::new(fx::SESSION_ID).unwrap();
    let heartbeat = example("heartbeat_response");
    for (key, value, rule) in [
        ("generation", json!(3), "the request's generation"),
        ("version", json!(5), "the request's expectedVersion + 1"),
    ] {
        let bytes = mutate(&heartbeat, |v| v[key] = value);
        assert_eq!(
            bound(SessionResponse::parse_heartbeat(
                &bytes,
                &worker,
                &session,
                &fx::heartbeat_request()
            )),
            (key, rule.to_owned()),
            "heartbeat {key}"
        );
    }
    let transition = mutate(&example("transition_response"), |v| {
        v["generation"] = json!(3)
    });
    assert_eq!(
        bound(SessionResponse::parse_transition(
            &transition,
            &worker,
            &session,
            &fx::transition_request()
        )),
        ("generation", "the request's generation".to_owned())
    );
}
