//! Shared helpers of the `storage_*` integration tests: private temp roots, tree snapshots, and
//! sample records walked through real transitions.
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use ql_worker_core::ids::{
    AttemptId, CallbackSequence, CapabilityDigest, ExecutorHandle, LogArtifactId, RunId,
    Sha256Digest,
};
use ql_worker_core::receipt::{Receipt, ReceiptToken};
use ql_worker_core::record::{InboxRecord, RecoveryReason, State};
use ql_worker_core::time::UnixMillis;
use ql_worker_core::truncation::TruncationFact;
use ql_worker_sim::testkit;
use sha2::Digest as _;

pub fn ms(v: u64) -> UnixMillis {
    UnixMillis::new(v).unwrap()
}

/// A private (0700) temp directory and a not-yet-existing root inside it.
pub struct Sandbox {
    pub dir: tempfile::TempDir,
    pub root: PathBuf,
}

pub fn sandbox() -> Sandbox {
    let dir = tempfile::Builder::new()
        .prefix("ql-storage-")
        .tempdir()
        .unwrap();
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).unwrap();
    let root = dir.path().join("root");
    Sandbox { dir, root }
}

/// One node of a tree snapshot: everything a hostile-input test must leave unchanged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub kind: &'static str,
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u64,
    pub ino: u64,
    pub size: u64,
    /// SHA-256 of a regular file's content, or a symlink's target.
    pub content: String,
}

/// Every path under (and including) `top`, never following symlinks.
pub fn snapshot(top: &Path) -> BTreeMap<PathBuf, Node> {
    let mut out = BTreeMap::new();
    walk(top, &mut out);
    out
}

fn walk(path: &Path, out: &mut BTreeMap<PathBuf, Node>) {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return;
    };
    let ft = meta.file_type();
    let (kind, content) = if ft.is_symlink() {
        (
            "symlink",
            fs::read_link(path).unwrap().display().to_string(),
        )
    } else if ft.is_dir() {
        ("dir", String::new())
    } else if ft.is_file() {
        ("file", hex(&sha2::Sha256::digest(fs::read(path).unwrap())))
    } else {
        ("special", String::new())
    };
    out.insert(
        path.to_path_buf(),
        Node {
            kind,
            mode: meta.mode(),
            uid: meta.uid(),
            gid: meta.gid(),
            nlink: meta.nlink(),
            ino: meta.ino(),
            size: if ft.is_dir() { 0 } else { meta.size() },
            content,
        },
    );
    if ft.is_dir() {
        let mut names: Vec<_> = fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        names.sort();
        for child in names {
            walk(&child, out);
        }
    }
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn sha256(bytes: &[u8]) -> Sha256Digest {
    Sha256Digest::of(bytes)
}

/// Asserts that `op` changed nothing under `top` and returns its result.
pub fn unchanged<T>(top: &Path, op: impl FnOnce() -> T) -> T {
    let before = snapshot(top);
    let result = op();
    let after = snapshot(top);
    assert_eq!(before, after, "the tree under {} changed", top.display());
    result
}

/// The sample `accepted` record for offer `n` at revision 0.
pub fn accepted(n: u32) -> InboxRecord {
    InboxRecord::accepted(testkit::offer(n), ms(100))
}

/// `record` at revision + 1 in `state`, one millisecond later, with `edit` applied.
pub fn step(
    record: &InboxRecord,
    state: State,
    edit: impl FnOnce(&mut InboxRecord),
) -> InboxRecord {
    let mut next = record.clone();
    next.revision = record.revision.next().unwrap();
    next.state = state;
    next.updated_at_ms = record.updated_at_ms.saturating_add(1);
    edit(&mut next);
    next
}

/// A self-transition (lease-version-free update): revision + 1, one millisecond later.
pub fn touched(record: &InboxRecord) -> InboxRecord {
    step(record, record.state, |_| {})
}

pub fn log_id(n: u32) -> LogArtifactId {
    LogArtifactId::new(format!("wlog-{:030x}", u64::from(n) * 0x0101_0101 + 0xab00)).unwrap()
}

/// The chain accepted → starting_acknowledged → launching (with log `log_id(n)`), every record.
pub fn to_launching(n: u32) -> Vec<InboxRecord> {
    let r0 = accepted(n);
    let r1 = step(&r0, State::StartingAcknowledged, |_| {});
    let r2 = step(&r1, State::Launching, |r| {
        r.executor_started_at_ms = Some(r.updated_at_ms);
        r.log_artifact_id = Some(log_id(n));
        r.completion_receipt_callback_sequence = Some(CallbackSequence::new(1).unwrap());
        r.completion_receipt_token_digest =
            Some(CapabilityDigest::new(Sha256Digest::of(b"capability")));
    });
    vec![r0, r1, r2]
}

/// The full chain to `completion_acknowledged` at `ack_at`.
pub fn to_completed(n: u32, ack_at: u64) -> Vec<InboxRecord> {
    let mut chain = to_launching(n);
    let r3 = step(chain.last().unwrap(), State::Started, |r| {
        r.executor_handle = Some(ExecutorHandle::new("ql3lp1.sample-handle").unwrap());
    });
    let r4 = step(&r3, State::RunningAcknowledged, |_| {});
    let r5 = step(&r4, State::CompletionAcknowledged, |r| {
        r.updated_at_ms = ms(ack_at);
        r.completion_acknowledged_at_ms = Some(ms(ack_at));
    });
    chain.extend([r3, r4, r5]);
    chain
}

/// accepted → starting_acknowledged → start_failed → start_failure_acknowledged at `at`.
pub fn to_start_failure(n: u32, at: u64) -> Vec<InboxRecord> {
    let r0 = accepted(n);
    let r1 = step(&r0, State::StartingAcknowledged, |_| {});
    let r2 = step(&r1, State::StartFailed, |_| {});
    let r3 = step(&r2, State::StartFailureAcknowledged, |r| {
        r.updated_at_ms = ms(at)
    });
    vec![r0, r1, r2, r3]
}

/// accepted → recovery_required(launch_outcome_unknown).
pub fn to_recovery(n: u32) -> Vec<InboxRecord> {
    let r0 = accepted(n);
    let r1 = step(&r0, State::RecoveryRequired, |r| {
        r.recovery_reason = Some(RecoveryReason::LaunchOutcomeUnknown);
    });
    vec![r0, r1]
}

pub fn receipt(n: u32) -> Receipt {
    Receipt {
        schema_version: 1,
        run_id: RunId::new(format!("run-{n}")).unwrap(),
        attempt_id: AttemptId::new(format!("attempt-{n}")).unwrap(),
        callback_sequence: CallbackSequence::new(1).unwrap(),
        token: ReceiptToken::new("AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8").unwrap(),
        started_at_ms: ms(102),
        finished_at_ms: ms(200),
        exit_code: 0,
    }
}

pub fn fact(n: u32, maximum_bytes: u64, quota_reached: bool) -> TruncationFact {
    TruncationFact {
        schema_version: 1,
        run_id: RunId::new(format!("run-{n}")).unwrap(),
        attempt_id: AttemptId::new(format!("attempt-{n}")).unwrap(),
        log_artifact_id: log_id(n),
        maximum_bytes,
        quota_reached,
        observed_at_ms: ms(300),
    }
}

/// Files in `dir` whose name ends with `.tmp`.
pub fn temps_in(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .map(|rd| {
            rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".tmp"))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits (bounded, 10 s) until nobody holds the owner lock of `root`, after the test dropped
/// its `Journal`. Dropping closes the lock's descriptor, but a process that another test thread
/// is spawning holds a copy of every descriptor between its fork and its exec (`O_CLOEXEC`
/// closes it only at the exec), so for a moment the lock is still held and a `ql-worker`
/// command started now would rightly say the root is owned. The check reads `/proc/locks`, so
/// it holds no descriptor of its own that a fork could copy.
pub fn wait_lock_free(root: &Path) {
    let meta = fs::metadata(root.join(ql_worker::layout::LOCK_FILE)).unwrap();
    let dev = meta.dev();
    let id = format!(
        "{:02x}:{:02x}:{}",
        rustix::fs::major(dev),
        rustix::fs::minor(dev),
        meta.ino()
    );
    for _ in 0..1_000 {
        let locks = fs::read_to_string("/proc/locks").unwrap();
        if !locks
            .lines()
            .any(|l| l.contains("FLOCK") && l.split_whitespace().any(|f| f == id))
        {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    panic!(
        "the owner lock of {} is still held after 10 s",
        root.display()
    );
}
