//! The receipt store on real files: publish once, read with the path/content attempt check,
//! remove with a directory fsync, quarantine without replacing.

mod storage_support;

use std::fs;
use std::os::unix::fs::MetadataExt as _;

use ql_worker::fsio::RealFs;
use ql_worker::receipts::{self, ReceiptStoreError};
use ql_worker_core::ids::AttemptId;
use ql_worker_sim::fault_fs::FaultFs;
use storage_support::*;

fn root_dir() -> Sandbox {
    let sb = sandbox();
    fs::create_dir(&sb.root).unwrap();
    fs::set_permissions(
        &sb.root,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    sb
}

fn attempt(n: u32) -> AttemptId {
    AttemptId::new(format!("attempt-{n}")).unwrap()
}

#[test]
fn receipt_publishes_once_0600_in_a_0700_shard_and_reads_back() {
    let sb = root_dir();
    let published = receipts::publish(&sb.root, &receipt(1)).unwrap();
    assert_eq!(published.path, sb.root.join("receipts/at/attempt-1.rcpt"));
    let meta = fs::metadata(&published.path).unwrap();
    assert_eq!((meta.mode() & 0o7777, meta.nlink()), (0o600, 1));
    let shard = fs::metadata(sb.root.join("receipts/at")).unwrap();
    assert_eq!(shard.mode() & 0o7777, 0o700);
    assert_eq!(
        receipts::read(&sb.root, &attempt(1)).unwrap(),
        Some(receipt(1))
    );
    let err = unchanged(sb.dir.path(), || {
        receipts::publish(&sb.root, &receipt(1)).unwrap_err()
    });
    assert!(
        matches!(err, ReceiptStoreError::AlreadyExists { .. }),
        "{err:?}"
    );
    assert!(temps_in(&sb.root.join("receipts/at")).is_empty());
}

#[test]
fn receipt_file_never_contains_the_token_in_the_clear_outside_its_envelope_body() {
    // The token is stored (it must be, until completion): but only inside the receipt file,
    // and no other file under the root carries it.
    let sb = root_dir();
    receipts::publish(&sb.root, &receipt(1)).unwrap();
    let token = receipt(1).token.expose().as_bytes().to_vec();
    for (path, node) in snapshot(&sb.root) {
        if node.kind == "file" && !path.ends_with("attempt-1.rcpt") {
            let bytes = fs::read(&path).unwrap();
            assert!(
                !bytes.windows(token.len()).any(|w| w == token),
                "{}",
                path.display()
            );
        }
    }
}

#[test]
fn read_of_a_missing_receipt_is_none_and_creates_nothing() {
    let sb = root_dir();
    let got = unchanged(sb.dir.path(), || {
        receipts::read(&sb.root, &attempt(1)).unwrap()
    });
    assert_eq!(got, None);
}

/// The published handle costs no fsync once its shard exists (docs/supervisor.md: it means
/// nothing after a reboot); creating the shard is fsynced, as for a receipt.
#[test]
fn published_handle_is_written_without_fsync_once_the_shard_exists() {
    let sb = root_dir();
    let seam = FaultFs::new(RealFs);
    receipts::publish_handle_with(&seam, &sb.root, &attempt(1), "ql3lp1.a").unwrap();
    let creating = seam.fsyncs();
    assert!(
        creating >= 1,
        "the new shard is fsynced: {:?}",
        seam.trace()
    );
    let seam = FaultFs::new(RealFs);
    receipts::publish_handle_with(&seam, &sb.root, &attempt(2), "ql3lp1.b").unwrap();
    assert_eq!(seam.fsyncs(), 0, "{:?}", seam.trace());
    assert_eq!(
        receipts::read_handle(&sb.root, &attempt(2)).unwrap(),
        Some(b"ql3lp1.b".to_vec())
    );
    assert!(temps_in(&sb.root.join("receipts/at")).is_empty());
}

#[test]
fn remove_unlinks_and_fsyncs_the_shard_and_reports_absence() {
    let sb = root_dir();
    receipts::publish(&sb.root, &receipt(1)).unwrap();
    let stale = sb.root.join(format!(
        "receipts/at/.attempt-1.rcpt.{}.tmp",
        "9e".repeat(16)
    ));
    fs::write(&stale, b"").unwrap();
    let seam = FaultFs::new(RealFs);
    assert!(receipts::remove_with(&seam, &sb.root, &attempt(1)).unwrap());
    assert!(seam.fsyncs() >= 1, "{:?}", seam.trace());
    assert!(!sb.root.join("receipts/at/attempt-1.rcpt").exists());
    assert!(!stale.exists(), "stale temp of the settled receipt swept");
    assert!(!receipts::remove(&sb.root, &attempt(1)).unwrap());
}

#[test]
fn quarantine_moves_the_receipt_and_never_replaces_an_occupied_slot() {
    let sb = root_dir();
    receipts::publish(&sb.root, &receipt(1)).unwrap();
    let original = fs::read(sb.root.join("receipts/at/attempt-1.rcpt")).unwrap();
    assert!(receipts::quarantine(&sb.root, &attempt(1)).unwrap());
    let slot = sb.root.join("receipts/.quarantine/at/attempt-1.rcpt");
    assert_eq!(fs::read(&slot).unwrap(), original);
    assert!(!sb.root.join("receipts/at/attempt-1.rcpt").exists());
    assert_eq!(
        fs::metadata(sb.root.join("receipts/.quarantine"))
            .unwrap()
            .mode()
            & 0o7777,
        0o700
    );
    assert!(
        !receipts::quarantine(&sb.root, &attempt(1)).unwrap(),
        "nothing left to move"
    );
    receipts::publish(&sb.root, &receipt(1)).unwrap();
    let err = unchanged(sb.dir.path(), || {
        receipts::quarantine(&sb.root, &attempt(1)).unwrap_err()
    });
    assert!(
        matches!(err, ReceiptStoreError::QuarantineOccupied { .. }),
        "{err:?}"
    );
}

#[test]
fn a_corrupt_receipt_can_be_quarantined_for_inspection() {
    let sb = root_dir();
    receipts::publish(&sb.root, &receipt(1)).unwrap();
    let path = sb.root.join("receipts/at/attempt-1.rcpt");
    let mut bytes = fs::read(&path).unwrap();
    bytes[60] ^= 1;
    fs::write(&path, &bytes).unwrap();
    assert!(receipts::read(&sb.root, &attempt(1)).is_err());
    assert!(receipts::quarantine(&sb.root, &attempt(1)).unwrap());
    assert_eq!(
        fs::read(sb.root.join("receipts/.quarantine/at/attempt-1.rcpt")).unwrap(),
        bytes
    );
    assert_eq!(receipts::read(&sb.root, &attempt(1)).unwrap(), None);
}

/// Issue 16: the handle a supervisor publishes before its user command runs lives next to the
/// receipt, 0600 in the 0700 shard, is published once (never replaced), reads back byte for
/// byte, and goes with the receipt (`remove`) or by itself (`remove_handle`).
#[test]
fn published_handle_is_private_published_once_and_removed_with_the_receipt() {
    let sb = root_dir();
    let text = "ql3lp1.example-handle";
    let path = receipts::publish_handle(&sb.root, &attempt(1), text).unwrap();
    assert_eq!(path, sb.root.join("receipts/at/attempt-1.handle"));
    let meta = fs::metadata(&path).unwrap();
    assert_eq!((meta.mode() & 0o7777, meta.nlink()), (0o600, 1));
    assert_eq!(
        receipts::read_handle(&sb.root, &attempt(1)).unwrap(),
        Some(text.as_bytes().to_vec())
    );
    let err = receipts::publish_handle(&sb.root, &attempt(1), "ql3lp1.other").unwrap_err();
    assert!(
        matches!(err, ReceiptStoreError::AlreadyExists { .. }),
        "{err:?}"
    );
    assert_eq!(receipts::read_handle(&sb.root, &attempt(2)).unwrap(), None);

    // With the receipt.
    receipts::publish(&sb.root, &receipt(1)).unwrap();
    assert!(receipts::remove(&sb.root, &attempt(1)).unwrap());
    assert!(!path.exists());
    assert_eq!(receipts::read_handle(&sb.root, &attempt(1)).unwrap(), None);

    // By itself (a supervisor whose user command never ran).
    receipts::publish_handle(&sb.root, &attempt(1), text).unwrap();
    assert!(receipts::remove_handle(&sb.root, &attempt(1)).unwrap());
    assert!(!receipts::remove_handle(&sb.root, &attempt(1)).unwrap());
    assert!(temps_in(&sb.root.join("receipts/at")).is_empty());

    // A group- or world-readable file is refused, never used.
    receipts::publish_handle(&sb.root, &attempt(1), text).unwrap();
    fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    assert!(receipts::read_handle(&sb.root, &attempt(1)).is_err());
}
