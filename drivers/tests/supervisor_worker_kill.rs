//! What survives what: the supervisor outlives a SIGKILLed Worker and still publishes an
//! authenticating receipt; and the capability and Secret values never reach a file other than the
//! receipt, nor any process's argv or (beyond the user's own materialized Secrets) environment.

mod supervisor_common;

use std::fs;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::thread;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ql_worker::supervisor::{
    EnvVar, Executor as _, ExecutorOutcome, SupervisorExecutor, SupervisorImage,
};
use supervisor_common::{
    CLOSE_STRAYS_AND_EXEC, Fixture, WAIT, alive, authenticate, capability_bytes, in_clean_process,
    launch_for, sh, started_environ, wait_for, worker_bin,
};

const STANDIN_ROOT: &str = "QL_STANDIN_WORKER_ROOT";
const STANDIN_N: &str = "QL_STANDIN_WORKER_N";
const STANDIN_SCRIPT: &str = "QL_STANDIN_WORKER_SCRIPT";

/// A stand-in Worker: when started by `supervisor_survives_worker_kill_...` it launches one
/// Attempt through the real executor, prints the outcome, and waits to be killed. Run on its own
/// it does nothing.
#[test]
fn standin_worker_for_worker_kill() {
    let (Some(root), Some(n), Some(script)) = (
        std::env::var_os(STANDIN_ROOT),
        std::env::var(STANDIN_N).ok(),
        std::env::var(STANDIN_SCRIPT).ok(),
    ) else {
        return;
    };
    let n: u32 = n.parse().unwrap();
    let root = Path::new(&root);
    let record =
        ql_worker::journal::read_record_unlocked(root, &ql_worker_sim::testkit::offer_id(n))
            .unwrap();
    let image = SupervisorImage::open(&worker_bin()).unwrap();
    let mut executor = SupervisorExecutor::new(image, root).with_report_timeout(WAIT);
    let launch = launch_for(&record, capability_bytes(n), 64 * 1024, sh(&script), vec![]);
    let outcome = executor.start(launch);
    let line = match &outcome {
        ExecutorOutcome::Started { handle, .. } => format!("STARTED {}\n", handle.as_str()),
        other => format!("OTHER {other:?}\n"),
    };
    let mut out = std::io::stdout().lock();
    out.write_all(line.as_bytes()).unwrap();
    out.flush().unwrap();
    drop(out);
    thread::sleep(WAIT * 3);
}

#[test]
fn supervisor_survives_worker_kill_and_the_receipt_still_authenticates() {
    let fx = Fixture::new(60);
    let exe = std::env::current_exe().unwrap();
    let mut worker = Command::new("/bin/bash")
        .arg("-c")
        .arg(CLOSE_STRAYS_AND_EXEC)
        .arg("bash")
        .arg(exe)
        .args([
            "--exact",
            "standin_worker_for_worker_kill",
            "--nocapture",
            "-q",
        ])
        .env(STANDIN_ROOT, &fx.root)
        .env(STANDIN_N, "60")
        .env(STANDIN_SCRIPT, "sleep 1; echo survived the worker; exit 5")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = worker.stdout.take().unwrap();
    let (sender, receiver) = mpsc::channel();
    thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("STARTED ") || line.starts_with("OTHER ") {
                let _ = sender.send(line);
                return;
            }
        }
    });
    let line = receiver
        .recv_timeout(WAIT)
        .expect("stand-in Worker reports");
    // Kill the Worker right after the Started report.
    worker.kill().unwrap();
    worker.wait().unwrap();
    let handle = line
        .strip_prefix("STARTED ")
        .unwrap_or_else(|| panic!("{line}"));
    let identity = ql_worker::supervisor::DurableHandle::parse(handle)
        .unwrap()
        .identity;
    let stat = fs::read_to_string(format!("/proc/{}/stat", identity.pid)).unwrap();
    let supervisor: u32 = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!(alive(supervisor), "the supervisor outlives the Worker");
    let sup_stat = fs::read_to_string(format!("/proc/{supervisor}/stat")).unwrap();
    let sup_pgid = sup_stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .nth(2)
        .unwrap();
    assert_eq!(
        sup_pgid,
        supervisor.to_string(),
        "the supervisor leads its own group"
    );
    let receipt = fx.wait_receipt();
    authenticate(&receipt, &fx.record);
    assert_eq!(receipt.exit_code, 5);
    assert_eq!(fx.log(), b"survived the worker\n");
    assert!(!fx.fact().unwrap().quota_reached);
    assert!(wait_for(WAIT, || (!alive(supervisor)).then_some(())).is_some());
}

/// Every regular file under `dir`, recursively.
fn files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let kind = entry.file_type().unwrap();
        if kind.is_dir() {
            files(&entry.path(), out);
        } else if kind.is_file() {
            out.push(entry.path());
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn capability_and_secrets_appear_in_no_file_environ_or_cmdline_but_the_receipt() {
    in_clean_process(
        "capability_and_secrets_appear_in_no_file_environ_or_cmdline_but_the_receipt",
        || {
            let fx = Fixture::new(61);
            let secret = b"Secret-Value-61-do-not-persist".to_vec();
            let token = URL_SAFE_NO_PAD.encode(capability_bytes(61)).into_bytes();
            let raw = capability_bytes(61).to_vec();
            let gate = fx.scratch("gate");
            let mut executor = fx.executor();
            let outcome = executor.start(fx.launch(
                sh(&format!(
                    "echo user output; while [ ! -e {} ]; do sleep 0.02; done",
                    gate.display()
                )),
                vec![
                    EnvVar::new("API_SECRET", String::from_utf8(secret.clone()).unwrap()),
                    EnvVar::new("PUBLIC_VALUE", "visible"),
                ],
            ));
            let user = Fixture::user_pid(&outcome);
            let supervisor = executor.supervisor_pids()[0];
            // The user's environment holds its materialized Secret (by design) and never the
            // capability; no argv holds either; the supervisor's environment holds only the event-log
            // format.
            let user_environ = started_environ(user);
            assert!(contains(&user_environ, &secret));
            for pid in [user, supervisor] {
                let environ = fs::read(format!("/proc/{pid}/environ")).unwrap();
                let cmdline = fs::read(format!("/proc/{pid}/cmdline")).unwrap();
                for needle in [&token, &raw] {
                    assert!(
                        !contains(&environ, needle),
                        "capability in environ of {pid}"
                    );
                    assert!(
                        !contains(&cmdline, needle),
                        "capability in cmdline of {pid}"
                    );
                }
                assert!(!contains(&cmdline, &secret), "secret in cmdline of {pid}");
            }
            let environ = fs::read(format!("/proc/{supervisor}/environ")).unwrap();
            assert!(
                environ == b"QL_WORKER_LOG_FORMAT=text\0"
                    || environ == b"QL_WORKER_LOG_FORMAT=json\0",
                "only the event-log format: {}",
                String::from_utf8_lossy(&environ)
            );
            fs::write(&gate, b"").unwrap();
            let receipt = fx.wait_receipt();
            authenticate(&receipt, &fx.record);
            // Files: the capability only in the receipt (as its base64url token), Secrets in
            // none, and no temp file left behind.
            let mut all = Vec::new();
            files(fx.dir.path(), &mut all);
            let receipt_path = fx.paths().receipt(&fx.record.offer.candidate.attempt_id);
            assert!(all.contains(&receipt_path));
            for path in &all {
                let bytes = fs::read(path).unwrap();
                assert!(!contains(&bytes, &secret), "secret in {}", path.display());
                assert!(
                    !contains(&bytes, &raw),
                    "raw capability in {}",
                    path.display()
                );
                assert_eq!(
                    contains(&bytes, &token),
                    *path == receipt_path,
                    "capability token in {}",
                    path.display()
                );
                assert!(
                    !path.to_string_lossy().ends_with(".tmp"),
                    "{}",
                    path.display()
                );
            }
            assert_eq!(fx.log(), b"user output\n");
        },
    );
}
