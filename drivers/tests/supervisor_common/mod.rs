//! Shared fixtures for the supervisor tests: a private state root with a `launching` record,
//! launches that match it, the real `ql-worker` binary as the supervisor image, and bounded
//! waits.
#![allow(dead_code, unreachable_pub)]

use std::fs;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ql_worker::journal::Journal;
use ql_worker::layout::Paths;
use ql_worker::spool::{self, SpoolPolicy};
use ql_worker::supervisor::{
    Capability, EnvVar, Executor as _, ExecutorOutcome, Launch, SupervisorExecutor, SupervisorImage,
};
use ql_worker_core::envelope;
use ql_worker_core::ids::{CallbackSequence, LogArtifactId, Revision};
use ql_worker_core::listing::Capacity;
use ql_worker_core::receipt::Receipt;
use ql_worker_core::record::{InboxRecord, State};
use ql_worker_core::revision::ExecCommand;
use ql_worker_core::time::UnixMillis;
use ql_worker_core::truncation::TruncationFact;
use ql_worker_sim::testkit;
use tempfile::TempDir;

#[path = "../bin_under_test/mod.rs"]
pub mod bin_under_test;
pub use bin_under_test::worker_bin;

/// Generous upper bound for anything the tests wait for.
pub const WAIT: Duration = Duration::from_secs(20);
/// Set in a test's own clean re-execution.
const CLEAN_ENV: &str = "QL_SUPERVISOR_TEST_CLEAN";

/// Closes every descriptor above 2 (bash handles multi-digit descriptors), then execs.
pub const CLOSE_STRAYS_AND_EXEC: &str = r#"for fd in /proc/$$/fd/*; do n=${fd##*/}; if [ "$n" -gt 2 ]; then eval "exec $n>&-" 2>/dev/null; fi; done; exec "$@""#;

/// Runs `body` in a process whose descriptor table holds nothing inheritable beyond 0–2.
///
/// The supervisor refuses to spawn while it holds an inheritable descriptor the user would
/// inherit, and a test harness often inherits some from its own parent (this repository's CI and
/// tool shells do). Without `unsafe` no Rust process can close descriptors it does not own, so a
/// test that needs a clean table re-executes itself through bash, which can.
pub fn in_clean_process(test: &str, body: impl FnOnce()) {
    if std::env::var_os(CLEAN_ENV).is_some()
        || ql_worker::supervisor::inheritable_descriptors().is_ok_and(|fds| fds.is_empty())
    {
        body();
        return;
    }
    let exe = std::env::current_exe().expect("test binary path");
    let output = Command::new("/bin/bash")
        .arg("-c")
        .arg(CLOSE_STRAYS_AND_EXEC)
        .arg("bash")
        .arg(exe)
        .args(["--exact", test, "--nocapture", "--test-threads=1", "-q"])
        .env(CLEAN_ENV, "1")
        .output()
        .expect("run bash");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "{test} failed in its clean re-execution:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Now, in Unix milliseconds.
pub fn now_ms() -> UnixMillis {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after epoch")
        .as_millis();
    UnixMillis::new(u64::try_from(ms).expect("millis fit")).expect("safe integer")
}

/// Polls `probe` every 10 ms until it returns `Some` or `limit` passes.
pub fn wait_for<T>(limit: Duration, mut probe: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = probe() {
            return Some(value);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(Duration::from_millis(10));
    }
}

/// `/proc/<pid>/environ` of a process the supervisor reported `Started`. The spawn returns once
/// the child's `execve` passed its point of no return, but the kernel sets the new image's
/// environment bounds a little later; a read in between sees an empty environment (seen under
/// heavy load). Retried while empty, bounded (2 s); the caller asserts on the result.
pub fn started_environ(pid: u32) -> Vec<u8> {
    wait_for(Duration::from_secs(2), || {
        let environ = fs::read(format!("/proc/{pid}/environ")).unwrap();
        (!environ.is_empty()).then_some(environ)
    })
    .unwrap_or_default()
}

/// Whether `/proc/<pid>` exists and is not a zombie.
pub fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, tail)| tail.split_ascii_whitespace().next())
            .is_some_and(|state| !matches!(state, "Z" | "X" | "x"))
    })
}

/// Whether `/proc/<pid>` exists at all (zombies included).
pub fn exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// One private state root with one offer in `launching`.
pub struct Fixture {
    pub dir: TempDir,
    pub root: PathBuf,
    pub record: InboxRecord,
    pub capability: [u8; 32],
    pub quota: u64,
}

/// The deterministic capability of fixture `n` (test data only).
pub fn capability_bytes(n: u32) -> [u8; 32] {
    let mut bytes = [0u8; 32];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = (n as u8)
            .wrapping_mul(31)
            .wrapping_add(i as u8)
            .wrapping_mul(7)
            ^ 0xa5;
    }
    bytes
}

/// The log id of fixture `n`.
pub fn log_id(n: u32) -> LogArtifactId {
    LogArtifactId::new(format!("wlog-{n:030x}")).expect("log id")
}

impl Fixture {
    /// A fresh 0700 temp dir holding a state root whose offer `n` is in `launching`.
    pub fn new(n: u32) -> Self {
        Self::with_offer(n, testkit::offer(n))
    }

    /// As [`Fixture::new`], for `offer` (its Run and Attempt must be `run-<n>`/`attempt-<n>`).
    pub fn with_offer(n: u32, offer: ql_worker_core::offer::Offer) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("ql-supervisor-")
            .tempdir()
            .expect("temp dir");
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o700)).expect("chmod");
        let root = dir.path().join("state");
        let capability = capability_bytes(n);
        let started = UnixMillis::new(now_ms().get() - 5).expect("start");
        let mut journal = Journal::open(&root, Capacity::DEFAULT).expect("journal");
        let accepted = InboxRecord::accepted(offer, UnixMillis::new(100).unwrap());
        journal.publish_record(&accepted).expect("publish");
        let mut ack = accepted.clone();
        ack.revision = Revision::new(1).unwrap();
        ack.state = State::StartingAcknowledged;
        ack.updated_at_ms = UnixMillis::new(200).unwrap();
        journal
            .replace_record(&ack.offer.offer_id.clone(), &ack, Revision::new(0).unwrap())
            .expect("starting_acknowledged");
        let mut launching = ack.clone();
        launching.revision = Revision::new(2).unwrap();
        launching.state = State::Launching;
        launching.updated_at_ms = started;
        launching.executor_started_at_ms = Some(started);
        launching.log_artifact_id = Some(log_id(n));
        launching.completion_receipt_callback_sequence = Some(CallbackSequence::new(3).unwrap());
        launching.completion_receipt_token_digest =
            Some(Capability::from_bytes(capability).digest());
        journal
            .replace_record(
                &launching.offer.offer_id.clone(),
                &launching,
                Revision::new(1).unwrap(),
            )
            .expect("launching");
        drop(journal);
        // The Worker's materializer allocates the log before `launching`; the supervisor only
        // opens it.
        let policy = SpoolPolicy::custom(64 * 1024, 0, 1024 * 1024).expect("policy");
        spool::allocate(&root, &log_id(n), policy).expect("allocate log");
        Self {
            dir,
            root,
            record: launching,
            capability,
            quota: 64 * 1024,
        }
    }

    /// Re-opens the fixture's root for a stand-in process (record already written).
    pub fn paths(&self) -> Paths {
        Paths::new(&self.root)
    }

    /// A launch that matches the record exactly.
    pub fn launch(&self, command: ExecCommand, environment: Vec<EnvVar>) -> Launch {
        launch_for(
            &self.record,
            self.capability,
            self.quota,
            command,
            environment,
        )
    }

    /// An executor on the real binary.
    pub fn executor(&self) -> SupervisorExecutor {
        let image = SupervisorImage::open(&worker_bin()).expect("image");
        SupervisorExecutor::new(image, &self.root).with_report_timeout(WAIT)
    }

    /// Starts `command` with `environment` through a fresh executor.
    pub fn start(&self, command: ExecCommand, environment: Vec<EnvVar>) -> ExecutorOutcome {
        self.executor().start(self.launch(command, environment))
    }

    /// The receipt, once published.
    pub fn receipt(&self) -> Option<Receipt> {
        let bytes = fs::read(
            self.paths()
                .receipt(&self.record.offer.candidate.attempt_id),
        )
        .ok()?;
        Some(envelope::decode::<Receipt>(&bytes).expect("receipt decodes"))
    }

    /// Waits (bounded) for the receipt.
    pub fn wait_receipt(&self) -> Receipt {
        wait_for(WAIT, || self.receipt()).expect("receipt published within the bound")
    }

    /// The log bytes.
    pub fn log(&self) -> Vec<u8> {
        fs::read(self.log_path()).unwrap_or_default()
    }

    /// The log path.
    pub fn log_path(&self) -> PathBuf {
        self.paths()
            .log(self.record.log_artifact_id.as_ref().unwrap())
    }

    /// The truncation fact, if published.
    pub fn fact(&self) -> Option<TruncationFact> {
        let path = self
            .paths()
            .fact(self.record.log_artifact_id.as_ref().unwrap());
        let bytes = fs::read(path).ok()?;
        Some(envelope::decode::<TruncationFact>(&bytes).expect("fact decodes"))
    }

    /// A scratch path in the temp dir (outside the state root).
    pub fn scratch(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The user pid named by a `Started` outcome.
    pub fn user_pid(outcome: &ExecutorOutcome) -> u32 {
        let ExecutorOutcome::Started { handle, .. } = outcome else {
            panic!("expected Started, got {outcome:?}");
        };
        ql_worker::supervisor::DurableHandle::parse(handle.as_str())
            .expect("handle parses")
            .identity
            .pid
    }
}

/// A launch for `record`.
pub fn launch_for(
    record: &InboxRecord,
    capability: [u8; 32],
    quota: u64,
    command: ExecCommand,
    environment: Vec<EnvVar>,
) -> Launch {
    Launch {
        offer_id: record.offer.offer_id.clone(),
        run_id: record.offer.candidate.run_id.clone(),
        attempt_id: record.offer.candidate.attempt_id.clone(),
        executor_started_at: record.executor_started_at_ms.expect("started at"),
        command,
        environment,
        working_directory: None,
        timeout_ms: None,
        execution_deadline_at: None,
        log_artifact_id: record.log_artifact_id.clone().expect("log id"),
        log_quota_bytes: quota,
        callback_sequence: record
            .completion_receipt_callback_sequence
            .expect("sequence"),
        capability: Capability::from_bytes(capability),
    }
}

/// `/bin/sh -c <script>`.
pub fn sh(script: &str) -> ExecCommand {
    ExecCommand::Shell {
        command: script.to_owned(),
        shell: None,
    }
}

/// An argv command.
pub fn argv(file: &str, args: &[&str]) -> ExecCommand {
    ExecCommand::Argv {
        file: file.to_owned(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
    }
}

/// Authenticates a receipt the way the completion coordinator does: canonical base64url of
/// exactly 32 bytes whose SHA-256 equals the record's digest, and exact Run, Attempt, sequence
/// and start time.
pub fn authenticate(receipt: &Receipt, record: &InboxRecord) {
    use base64::Engine as _;
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(receipt.token.expose())
        .expect("canonical base64url");
    let raw: [u8; 32] = raw.try_into().expect("exactly 32 bytes");
    assert!(
        record.completion_receipt_token_digest == Some(Capability::from_bytes(raw).digest()),
        "receipt token must authenticate against the durable digest"
    );
    assert_eq!(receipt.run_id, record.offer.candidate.run_id);
    assert_eq!(receipt.attempt_id, record.offer.candidate.attempt_id);
    assert_eq!(
        Some(receipt.callback_sequence),
        record.completion_receipt_callback_sequence
    );
    assert_eq!(Some(receipt.started_at_ms), record.executor_started_at_ms);
    assert!(receipt.finished_at_ms >= receipt.started_at_ms);
    assert!(receipt.finished_at_ms <= now_ms());
}
