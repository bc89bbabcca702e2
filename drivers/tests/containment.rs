//! Containment with real processes and a real second user (CI runs as root): a Run under
//! `[run_as]` cannot read the client key, the credential, another Run's record or receipt, nor
//! write the inbox (EACCES each time); runs as its own uid and gid with no supplementary group,
//! no capability and no new privileges; gets its own directory and TMPDIR, removed afterwards;
//! each Run of a uid range has its own uid; a fork bomb is contained by `nproc`, a memory hog
//! by `as`; a policy refusal is a start failure with zero spawns; Secret values split across
//! pipe reads are masked.

mod supervisor_common;

use std::fs;
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::Duration;

use ql_worker::containment::{
    ContainmentPlan, Policy, PolicyRule, RlimitKind, RunAsPlan, RunIdentity, runs,
};
use ql_worker::supervisor::{EnvVar, Executor as _, ExecutorOutcome, RejectReason};
use ql_worker_core::receipt::{RECEIPT_SCHEMA_VERSION, Receipt, ReceiptToken};
use ql_worker_sim::testkit;
use supervisor_common::{Fixture, alive, argv, in_clean_process, now_ms, sh, wait_for};

/// `nobody`, present on every Debian-like host.
const NOBODY: u32 = 65534;

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// A fixture whose temp dir the run user can traverse (0711), so every EACCES below comes from
/// the protected file or directory itself, not from an unreachable ancestor.
fn fixture(n: u32) -> Fixture {
    let fx = Fixture::new(n);
    fs::set_permissions(fx.dir.path(), fs::Permissions::from_mode(0o711)).unwrap();
    fx
}

/// A runs area in the fixture's temp dir.
fn runs_area(fx: &Fixture) -> PathBuf {
    let runs = fx.scratch("runs");
    runs::prepare_area(&runs).unwrap();
    runs
}

fn run_as(runs: &Path, identity: RunIdentity) -> ContainmentPlan {
    ContainmentPlan {
        run_as: Some(RunAsPlan {
            identity,
            runs_dir: runs.to_str().unwrap().to_owned(),
        }),
        ..ContainmentPlan::default()
    }
}

fn nobody() -> RunIdentity {
    RunIdentity::Fixed {
        uid: NOBODY,
        gid: NOBODY,
    }
}

fn log_text(fx: &Fixture) -> String {
    String::from_utf8_lossy(&fx.log()).into_owned()
}

/// The Worker's own secrets, as an operator installs them: 0600 files owned by the Worker, in a
/// directory anyone may traverse, next to a public certificate the run user may read.
fn worker_secrets(fx: &Fixture) -> (PathBuf, PathBuf, PathBuf) {
    let etc = fx.scratch("etc");
    fs::create_dir(&etc).unwrap();
    fs::set_permissions(&etc, fs::Permissions::from_mode(0o755)).unwrap();
    let key = etc.join("client.key");
    let credential = etc.join("credential");
    let cert = etc.join("client.pem");
    for (path, mode, text) in [
        (
            &key,
            0o600,
            "-----BEGIN PRIVATE KEY-----\nsecret-key-bytes\n",
        ),
        (&credential, 0o600, "ql3w_cred_secret-credential-bytes\n"),
        (&cert, 0o644, "-----BEGIN CERTIFICATE-----\npublic\n"),
    ] {
        fs::write(path, text).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }
    (key, credential, cert)
}

/// Publishes a second Run's record and receipt in the fixture's state root.
fn another_runs_files(fx: &Fixture) -> (PathBuf, PathBuf) {
    let mut journal =
        ql_worker::journal::Journal::open(&fx.root, ql_worker_core::listing::Capacity::DEFAULT)
            .unwrap();
    let other = ql_worker_core::record::InboxRecord::accepted(
        testkit::offer(2),
        ql_worker_core::time::UnixMillis::new(100).unwrap(),
    );
    journal.publish_record(&other).unwrap();
    drop(journal);
    let receipt = Receipt {
        schema_version: RECEIPT_SCHEMA_VERSION,
        run_id: other.offer.candidate.run_id.clone(),
        attempt_id: other.offer.candidate.attempt_id.clone(),
        callback_sequence: ql_worker_core::ids::CallbackSequence::new(1).unwrap(),
        token: ReceiptToken::new("A".repeat(43)).unwrap(),
        started_at_ms: now_ms(),
        finished_at_ms: now_ms(),
        exit_code: 0,
    };
    ql_worker::receipts::publish(&fx.root, &receipt).unwrap();
    let paths = fx.paths();
    (
        paths.record(&other.offer.offer_id),
        paths.receipt(&other.offer.candidate.attempt_id),
    )
}

#[test]
fn a_run_under_run_as_gets_eacces_for_the_key_credential_records_receipts_and_the_inbox() {
    if !is_root() {
        eprintln!("SKIPPED: needs root to switch to a second user (CI runs as root)");
        return;
    }
    in_clean_process(
        "a_run_under_run_as_gets_eacces_for_the_key_credential_records_receipts_and_the_inbox",
        || {
            let fx = fixture(1);
            let runs = runs_area(&fx);
            let (key, credential, cert) = worker_secrets(&fx);
            let (record, receipt) = another_runs_files(&fx);
            let offers = fx.paths().offers();
            let own_record = fx.paths().record(&fx.record.offer.offer_id);
            let script = format!(
                r#"try() {{ if out=$(cat "$2" 2>&1 >/dev/null); then echo "READ $1"; else echo "DENIED $1: $out"; fi; }}
try cert {cert}; try key {key}; try credential {credential}; try record {record}; try receipt {receipt}; try own-record {own}; try log {log}
if (echo forged > {offers}/offer-999999.rec) 2>/dev/null; then echo "WROTE inbox"; else echo "DENIED inbox: $( (echo forged > {offers}/offer-999999.rec) 2>&1)"; fi
if ls {root} >/dev/null 2>&1; then echo "LISTED root"; else echo "DENIED root: $(ls {root} 2>&1)"; fi
if out=$(kill -0 $PPID 2>&1); then echo "SIGNALLED supervisor"; else echo "DENIED supervisor: $out"; fi
echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"
grep -E '^(NoNewPrivs|CapEff|CapPrm|CapAmb|CapInh):' /proc/self/status | tr -s '\t' ' '
echo "cwd=$(pwd) tmpdir=$TMPDIR core=$(ulimit -c)"
touch "$TMPDIR/scratch" && echo "tmp writable""#,
                cert = cert.display(),
                key = key.display(),
                credential = credential.display(),
                record = record.display(),
                receipt = receipt.display(),
                own = own_record.display(),
                log = fx.log_path().display(),
                offers = offers.display(),
                root = fx.root.display(),
            );
            // Control: without [run_as] the same command reads everything (what the Worker's
            // start-up warning says).
            let shared = fixture(3);
            another_runs_files(&shared);
            let shared_script =
                script.replace(fx.root.to_str().unwrap(), shared.root.to_str().unwrap());
            let started = shared.start(sh(&shared_script), vec![]);
            assert!(
                matches!(started, ExecutorOutcome::Started { .. }),
                "{started:?}"
            );
            shared.wait_receipt();
            let shared_log = log_text(&shared);
            for what in ["cert", "key", "credential", "record", "receipt"] {
                assert!(
                    shared_log.contains(&format!("READ {what}\n")),
                    "{shared_log}"
                );
            }
            assert!(shared_log.contains("SIGNALLED supervisor"), "{shared_log}");
            assert!(shared_log.contains("WROTE inbox"), "{shared_log}");
            assert!(
                shared_log.contains("NoNewPrivs: 1"),
                "no new privileges by default: {shared_log}"
            );
            assert!(
                shared_log.contains("core=0"),
                "core = 0 by default: {shared_log}"
            );
            let mut executor = fx.executor().with_containment(run_as(&runs, nobody()));
            let outcome = executor.start(fx.launch(sh(&script), vec![]));
            assert!(
                matches!(outcome, ExecutorOutcome::Started { .. }),
                "{outcome:?}"
            );
            let done = fx.wait_receipt();
            let log = log_text(&fx);
            assert_eq!(done.exit_code, 0, "{log}");
            assert!(
                log.contains("READ cert"),
                "traversal works, so denials are real: {log}"
            );
            for what in [
                "key",
                "credential",
                "record",
                "receipt",
                "own-record",
                "log",
                "inbox",
                "root",
            ] {
                let line = log
                    .lines()
                    .find(|l| l.starts_with(&format!("DENIED {what}:")))
                    .unwrap_or_else(|| panic!("{what} was not denied: {log}"));
                assert!(
                    line.contains("Permission denied"),
                    "EACCES for {what}: {line}"
                );
            }
            assert!(!log.contains("secret-key-bytes") && !log.contains("secret-credential"));
            assert!(
                log.contains("DENIED supervisor") && log.contains("Operation not permitted"),
                "the Run cannot signal its supervisor: {log}"
            );
            assert!(!offers.join("offer-999999.rec").exists());
            assert!(
                log.contains(&format!("uid={NOBODY} gid={NOBODY} groups={NOBODY}\n")),
                "own uid and gid, no supplementary group: {log}"
            );
            assert!(log.contains("NoNewPrivs: 1"), "{log}");
            for set in ["CapEff", "CapPrm", "CapAmb", "CapInh"] {
                assert!(
                    log.contains(&format!("{set}: 0000000000000000")),
                    "no {set}: {log}"
                );
            }
            let run_dir = runs.join(fx.record.offer.offer_id.as_str());
            assert!(
                log.contains(&format!(
                    "cwd={} tmpdir={}/tmp core=0",
                    run_dir.display(),
                    run_dir.display()
                )),
                "{log}"
            );
            assert!(log.contains("tmp writable"), "{log}");
            assert!(
                !run_dir.exists(),
                "the Run's directory is removed once it is settled"
            );
            assert_eq!(fs::read_dir(&runs).unwrap().count(), 0);
        },
    );
}

#[test]
fn each_run_of_a_uid_range_has_its_own_uid_and_cannot_reach_another_runs_process_or_directory() {
    if !is_root() {
        eprintln!("SKIPPED: needs root (CI runs as root)");
        return;
    }
    in_clean_process(
        "each_run_of_a_uid_range_has_its_own_uid_and_cannot_reach_another_runs_process_or_directory",
        || {
            let a = fixture(1);
            let b = fixture(2);
            let runs = runs_area(&a);
            let range = RunIdentity::Range {
                first: 3_800_000,
                count: 8,
                gid: None,
            };
            let plan = run_as(&runs, range);
            let first = a.executor().with_containment(plan.clone()).start(a.launch(
                sh("echo mine > own-file; sleep 3; echo done"),
                vec![EnvVar::new("A_SECRET", "value-of-run-a")],
            ));
            let a_pid = Fixture::user_pid(&first);
            let a_dir = runs.join(a.record.offer.offer_id.as_str());
            let a_uid = fs::metadata(&a_dir).unwrap().uid();
            assert!((3_800_000..3_800_008).contains(&a_uid));
            let script = format!(
                r#"echo "uid=$(id -u)"
if out=$(cat /proc/{a_pid}/environ 2>&1 >/dev/null); then echo "READ environ"; else echo "DENIED environ: $out"; fi
if out=$(ls {a_dir} 2>&1); then echo "LISTED dir"; else echo "DENIED dir: $out"; fi
if out=$(kill -0 {a_pid} 2>&1); then echo "SIGNALLED"; else echo "DENIED signal: $out"; fi"#,
                a_dir = a_dir.display()
            );
            let second = b
                .executor()
                .with_containment(plan)
                .start(b.launch(sh(&script), vec![]));
            assert!(
                matches!(second, ExecutorOutcome::Started { .. }),
                "{second:?}"
            );
            let receipt = b.wait_receipt();
            let log = log_text(&b);
            assert_eq!(receipt.exit_code, 0, "{log}");
            let b_uid: u32 = log
                .lines()
                .find_map(|l| l.strip_prefix("uid="))
                .and_then(|u| u.parse().ok())
                .unwrap();
            assert_ne!(b_uid, a_uid, "each live Run has its own uid: {log}");
            assert!((3_800_000..3_800_008).contains(&b_uid));
            for what in ["environ", "dir"] {
                let line = log
                    .lines()
                    .find(|l| l.starts_with(&format!("DENIED {what}:")))
                    .unwrap_or_else(|| panic!("{what} reached: {log}"));
                assert!(line.contains("Permission denied"), "{line}");
            }
            assert!(log.contains("DENIED signal"), "{log}");
            assert!(alive(a_pid), "run A was not disturbed");
            let done = a.wait_receipt();
            assert_eq!(done.exit_code, 0);
            assert_eq!(log_text(&a), "done\n");
            assert!(!a_dir.exists());
        },
    );
}

/// Every live process whose real uid is in `range`.
fn processes_of(range: std::ops::Range<u32>) -> usize {
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            fs::read_to_string(e.path().join("status")).is_ok_and(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Uid:"))
                    .and_then(|l| l.split_ascii_whitespace().next()?.parse::<u32>().ok())
                    .is_some_and(|uid| range.contains(&uid))
            })
        })
        .count()
}

#[test]
fn a_fork_bomb_is_contained_by_nproc_and_the_run_is_still_reported() {
    if !is_root() {
        eprintln!("SKIPPED: RLIMIT_NPROC does not bind root; needs root to switch users");
        return;
    }
    in_clean_process(
        "a_fork_bomb_is_contained_by_nproc_and_the_run_is_still_reported",
        || {
            let fx = fixture(1);
            let runs = runs_area(&fx);
            let mut plan = run_as(
                &runs,
                RunIdentity::Range {
                    first: 3_810_000,
                    count: 1,
                    gid: None,
                },
            );
            plan.rlimits.push((RlimitKind::Nproc, 24));
            // Bounded even if nothing contained it (2^9 processes at most), so a broken test
            // cannot take the host down.
            // In a subshell: dash exits when one of its own forks fails, and the Run's own shell
            // must reach its end to report a deterministic exit code.
            let bomb = "b() { if [ $1 -gt 0 ]; then b $(($1-1)) & b $(($1-1)) & wait; else sleep 2; fi; }; (b 8); echo bomb over";
            let outcome = fx
                .executor()
                .with_containment(plan)
                .start(fx.launch(sh(bomb), vec![]));
            assert!(
                matches!(outcome, ExecutorOutcome::Started { .. }),
                "{outcome:?}"
            );
            let mut most = 0;
            let receipt = wait_for(Duration::from_secs(60), || {
                most = most.max(processes_of(3_810_000..3_810_001));
                fx.receipt()
            })
            .expect("receipt");
            let log = log_text(&fx);
            assert!(most <= 24, "at most nproc processes at once, saw {most}");
            assert!(
                log.contains("Cannot fork") || log.contains("Resource temporarily unavailable"),
                "forks were refused: {log}"
            );
            assert_eq!(receipt.exit_code, 0, "the Run ends and is reported: {log}");
            assert!(
                log.contains("bomb over\n"),
                "the Run's own shell reached its end: {log}"
            );
            assert_eq!(
                processes_of(3_810_000..3_810_001),
                0,
                "nothing of the Run remains"
            );
        },
    );
}

#[test]
fn a_memory_hog_is_contained_by_the_address_space_limit() {
    in_clean_process(
        "a_memory_hog_is_contained_by_the_address_space_limit",
        || {
            let hog = argv(
                "/bin/dd",
                &["if=/dev/zero", "of=/dev/null", "bs=512M", "count=1"],
            );
            // Control: without the limit the same command succeeds.
            let free = Fixture::new(1);
            let started = free.start(hog.clone(), vec![]);
            assert!(
                matches!(started, ExecutorOutcome::Started { .. }),
                "{started:?}"
            );
            assert_eq!(free.wait_receipt().exit_code, 0, "{}", log_text(&free));
            let fx = Fixture::new(2);
            let mut plan = ContainmentPlan::default();
            plan.rlimits.push((RlimitKind::AddressSpace, 256 << 20));
            let outcome = fx
                .executor()
                .with_containment(plan)
                .start(fx.launch(hog, vec![]));
            assert!(
                matches!(outcome, ExecutorOutcome::Started { .. }),
                "{outcome:?}"
            );
            let receipt = fx.wait_receipt();
            let log = log_text(&fx);
            assert_ne!(receipt.exit_code, 0, "{log}");
            assert!(log.contains("memory exhausted"), "{log}");
        },
    );
}

#[test]
fn a_policy_refusal_is_a_start_failure_with_zero_spawns_in_the_worker_and_in_the_supervisor() {
    in_clean_process(
        "a_policy_refusal_is_a_start_failure_with_zero_spawns_in_the_worker_and_in_the_supervisor",
        || {
            let policy = Policy {
                shell: false,
                executables: Some(vec!["/bin/true".into()]),
                ..Policy::default()
            };
            let plan = ContainmentPlan {
                policy,
                ..ContainmentPlan::default()
            };
            for (n, worker_check) in [(1, true), (2, false)] {
                let fx = Fixture::new(n);
                let marker = fx.scratch("spawned");
                let mut executor = fx.executor().with_containment(plan.clone());
                if !worker_check {
                    executor = executor.without_worker_policy_check();
                }
                let outcome =
                    executor.start(fx.launch(sh(&format!("touch {}", marker.display())), vec![]));
                assert_eq!(
                    outcome,
                    ExecutorOutcome::Rejected {
                        reason: RejectReason::PolicyRefused(PolicyRule::ShellRefused)
                    }
                );
                if worker_check {
                    assert!(
                        executor.supervisor_pids().is_empty(),
                        "the Worker refused before any supervisor existed"
                    );
                } else {
                    assert_eq!(executor.supervisor_pids().len(), 1);
                    let exited = wait_for(Duration::from_secs(10), || {
                        (executor.reap_exited() == 0).then_some(())
                    });
                    assert!(exited.is_some(), "the supervisor exits after refusing");
                }
                assert!(!marker.exists(), "zero spawns");
                assert!(fx.receipt().is_none() && fx.log().is_empty());
                let argv_refused = Fixture::new(n + 10);
                let outcome = argv_refused
                    .executor()
                    .with_containment(plan.clone())
                    .start(argv_refused.launch(argv("/bin/echo", &["x"]), vec![]));
                assert_eq!(
                    outcome,
                    ExecutorOutcome::Rejected {
                        reason: RejectReason::PolicyRefused(PolicyRule::ExecutableNotListed)
                    }
                );
            }
            let allowed = Fixture::new(30);
            let outcome = allowed
                .executor()
                .with_containment(plan)
                .start(allowed.launch(argv("/bin/true", &[]), vec![]));
            assert!(
                matches!(outcome, ExecutorOutcome::Started { .. }),
                "{outcome:?}"
            );
            assert_eq!(allowed.wait_receipt().exit_code, 0);
        },
    );
}

/// A fixture whose revision binds `SECRET_VALUE` to a Secret reference.
fn secret_fixture(n: u32) -> Fixture {
    let offer = testkit::offer_for(
        n,
        testkit::offer_id(n),
        testkit::lease_token(n),
        testkit::secret_revision(),
        ql_worker_core::time::UnixMillis::new(20).unwrap(),
        30_000,
    );
    Fixture::with_offer(n, offer)
}

#[test]
fn secret_values_split_across_pipe_reads_are_masked_only_when_asked() {
    in_clean_process(
        "secret_values_split_across_pipe_reads_are_masked_only_when_asked",
        || {
            let secret = "pa55-w0rd-for-the-db";
            // Two writes 300 ms apart: the supervisor's reads see the value in two pieces.
            let script = r#"printf '%s' "${SECRET_VALUE%-for-the-db}"; sleep 0.3; printf '%s|%s\n' "-for-the-db" "$PUBLIC_VALUE $SECRET_VALUE""#;
            let env = || {
                vec![
                    EnvVar::new("PUBLIC_VALUE", "visible"),
                    EnvVar::new("SECRET_VALUE", secret),
                ]
            };
            let exact = secret_fixture(1);
            let started = exact.start(sh(script), env());
            assert!(
                matches!(started, ExecutorOutcome::Started { .. }),
                "{started:?}"
            );
            exact.wait_receipt();
            assert_eq!(
                log_text(&exact),
                format!("{secret}|visible {secret}\n"),
                "off by default: byte-exact"
            );
            let masked = secret_fixture(2);
            let plan = ContainmentPlan {
                mask_secrets: true,
                ..ContainmentPlan::default()
            };
            let outcome = masked
                .executor()
                .with_containment(plan)
                .start(masked.launch(sh(script), env()));
            assert!(
                matches!(outcome, ExecutorOutcome::Started { .. }),
                "{outcome:?}"
            );
            masked.wait_receipt();
            assert_eq!(
                log_text(&masked),
                "***|visible ***\n",
                "the split value and the whole one are masked; the public value is not"
            );
            let fact = masked.fact().expect("fact");
            assert!(!fact.quota_reached);
        },
    );
}

/// Set in the test's own re-execution as a non-root Worker holding only capabilities.
const CAPS_ENV: &str = "QL_CONTAINMENT_CAPS_TEST";
/// The capabilities a non-root Worker needs for `[run_as]`.
const CAPS: &str = "+setuid,+setgid,+chown,+kill,+dac_override";

#[test]
fn a_non_root_worker_with_only_ambient_capabilities_passes_none_to_the_run() {
    let name = "a_non_root_worker_with_only_ambient_capabilities_passes_none_to_the_run";
    if std::env::var_os(CAPS_ENV).is_none() {
        if !is_root() || !Path::new("/usr/bin/setpriv").exists() {
            eprintln!(
                "SKIPPED: needs root and setpriv(1) to start a non-root Worker with capabilities"
            );
            return;
        }
        // Re-execute this test as uid 3820000 holding the five capabilities as ambient ones
        // (what systemd's AmbientCapabilities= gives), with a clean descriptor table.
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new("/usr/bin/setpriv")
            .args([
                "--reuid=3820000",
                "--regid=3820000",
                "--clear-groups",
                &format!("--inh-caps={CAPS}"),
                &format!("--ambient-caps={CAPS}"),
                "/bin/bash",
                "-c",
                supervisor_common::CLOSE_STRAYS_AND_EXEC,
                "bash",
            ])
            .arg(exe)
            .args(["--exact", name, "--nocapture", "--test-threads=1", "-q"])
            .env(CAPS_ENV, "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        return;
    }
    assert_eq!(rustix::process::geteuid().as_raw(), 3_820_000);
    assert!(ql_worker::containment::identity::missing_capabilities().is_empty());
    in_clean_process(name, || {
        let fx = fixture(1);
        let runs = runs_area(&fx);
        let script = "echo \"uid=$(id -u)\"; grep -E '^(CapEff|CapPrm|CapAmb|CapInh):' /proc/self/status | tr -s '\\t' ' '";
        let outcome = fx
            .executor()
            .with_containment(run_as(&runs, nobody()))
            .start(fx.launch(sh(script), vec![]));
        assert!(
            matches!(outcome, ExecutorOutcome::Started { .. }),
            "{outcome:?}"
        );
        let receipt = fx.wait_receipt();
        let log = log_text(&fx);
        assert_eq!(receipt.exit_code, 0, "{log}");
        assert!(log.starts_with(&format!("uid={NOBODY}\n")), "{log}");
        for set in ["CapEff", "CapPrm", "CapAmb", "CapInh"] {
            assert!(
                log.contains(&format!("{set}: 0000000000000000")),
                "no {set} passed on: {log}"
            );
        }
        assert!(
            !runs.join(fx.record.offer.offer_id.as_str()).exists(),
            "CAP_DAC_OVERRIDE let the supervisor remove the Run's directory"
        );
    });
}
