//! `ql-worker recover` on a real state root: it lists `recovery_required` records with their
//! advice and dormant records (before the spawn barrier, lease expired), and `--archive` moves
//! exactly those two kinds out of the inbox, refusing any other record and changing nothing.

mod storage_support;

use std::path::Path;
use std::process::Command;

use ql_worker::journal::Journal;
use ql_worker_core::listing::Capacity;
use ql_worker_core::record::State;
use ql_worker_sim::testkit;
use storage_support::*;

fn cli(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_ql-worker"))
        .args(args)
        .env_clear()
        .output()
        .unwrap();
    (
        out.status.code().unwrap(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

fn record_file(root: &Path, dir: &str, n: u32) -> std::path::PathBuf {
    root.join(dir).join(format!("offer-{n:06}.rec"))
}

#[test]
fn recover_lists_recovery_and_dormant_records_and_archives_only_those() {
    let sb = sandbox();
    {
        let mut journal = Journal::open(&sb.root, Capacity::DEFAULT).unwrap();
        // Each record walks its path from `accepted` through the journal's transition checks.
        // The sample offers' leases expire at 30 020 ms after the epoch: long past.
        use State::*;
        let paths: [(u32, &[State]); 4] = [
            (1, &[Accepted]),
            (
                2,
                &[Accepted, StartingAcknowledged, Launching, RecoveryRequired],
            ),
            (
                3,
                &[
                    Accepted,
                    StartingAcknowledged,
                    Launching,
                    Started,
                    RunningAcknowledged,
                ],
            ),
            (4, &[Accepted, StartingAcknowledged, StartFailed]),
        ];
        for (n, states) in paths {
            let mut stored = testkit::record(n, states[0]);
            journal.publish_record(&stored).unwrap();
            for state in &states[1..] {
                let next = testkit::record(n, *state);
                journal
                    .replace_record(&next.offer.offer_id, &next, stored.revision)
                    .unwrap();
                stored = next;
            }
        }
    }
    wait_lock_free(&sb.root);
    let root = sb.root.to_str().unwrap();

    let (code, out, err) = cli(&["recover", "--root", root]);
    assert_eq!(code, 6, "recovery_required present: {out}{err}");
    assert!(
        out.contains("offer-000002 run=run-2 attempt=attempt-2 reason=launch_outcome_unknown"),
        "{out}"
    );
    assert!(
        out.contains("offer-000001 run=run-1 attempt=attempt-1 dormant: accepted"),
        "{out}"
    );
    assert!(
        out.contains("offer-000004 run=run-4 attempt=attempt-4 dormant: start_failed"),
        "{out}"
    );
    assert!(out.contains("2 dormant record(s)"), "{out}");
    assert!(
        !out.contains("offer-000003"),
        "a running record is neither: {out}"
    );

    // A running record is refused (a usage error: exit 2) and left in place.
    let before = snapshot(&sb.root);
    let (code, _, err) = cli(&["recover", "--root", root, "--archive", "offer-000003"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("dormant"), "the refusal names the rule: {err}");
    assert_eq!(snapshot(&sb.root), before, "a refusal changes nothing");

    for n in [1, 2, 4] {
        let id = format!("offer-{n:06}");
        let (code, out, err) = cli(&["recover", "--root", root, "--archive", &id]);
        assert_eq!(code, 0, "{out}{err}");
        assert!(!record_file(&sb.root, "offers", n).exists());
        assert!(record_file(&sb.root, "archive", n).exists());
    }
    let (code, out, _) = cli(&["recover", "--root", root]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("no recovery_required records"), "{out}");
    assert!(!out.contains("dormant"), "{out}");
    assert!(record_file(&sb.root, "offers", 3).exists());
}
