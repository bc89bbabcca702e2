//! Stop controller (reference §5.6, §6.10 `controller.test.cjs`) and PID reuse: a process group
//! is signalled only after its exact durable identity matches.

mod supervisor_common;

use std::fs;
use std::os::unix::process::CommandExt as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use ql_worker::supervisor::identity::{self, DurableHandle, ProcRoot};
use ql_worker::supervisor::{
    ExecutorOutcome, StopController, StopOutcome, StopSignal, StopUnknown,
};
use supervisor_common::{Fixture, WAIT, alive, authenticate, in_clean_process, sh, wait_for};

fn handle_of(outcome: &ExecutorOutcome) -> String {
    let ExecutorOutcome::Started { handle, .. } = outcome else {
        panic!("expected Started, got {outcome:?}");
    };
    handle.as_str().to_owned()
}

fn fast() -> StopController {
    StopController::default().with_timing(
        Duration::from_millis(300),
        Duration::from_millis(1000),
        Duration::from_millis(10),
    )
}

#[test]
fn stops_only_after_exact_durable_identity_inspection() {
    in_clean_process("stops_only_after_exact_durable_identity_inspection", || {
        let fx = Fixture::new(50);
        let outcome = fx.start(sh("exec sleep 300"), vec![]);
        let handle = handle_of(&outcome);
        let pid = Fixture::user_pid(&outcome);
        assert!(alive(pid));
        assert_eq!(
            StopController::default().stop(&handle),
            StopOutcome::Stopped(StopSignal::Term)
        );
        let receipt = fx.wait_receipt();
        authenticate(&receipt, &fx.record);
        assert_eq!(
            receipt.exit_code,
            128 + 15,
            "the supervisor survives and records TERM"
        );
        assert_eq!(
            StopController::default().stop(&handle),
            StopOutcome::AlreadyExited
        );
    });
}

#[test]
fn revalidates_identity_before_escalating_to_sigkill() {
    in_clean_process("revalidates_identity_before_escalating_to_sigkill", || {
        let fx = Fixture::new(51);
        // The whole group ignores TERM (an ignored disposition survives exec).
        let ready = fx.scratch("ready");
        let outcome = fx.start(
            sh(&format!(
                "trap '' TERM; touch {}; sleep 300",
                ready.display()
            )),
            vec![],
        );
        let handle = handle_of(&outcome);
        wait_for(WAIT, || ready.exists().then_some(())).expect("trap installed");
        assert_eq!(fast().stop(&handle), StopOutcome::Stopped(StopSignal::Kill));
        let receipt = fx.wait_receipt();
        authenticate(&receipt, &fx.record);
        assert_eq!(receipt.exit_code, 128 + 9);
    });
}

#[test]
fn does_not_escalate_after_identity_is_no_longer_running() {
    in_clean_process(
        "does_not_escalate_after_identity_is_no_longer_running",
        || {
            let fx = Fixture::new(52);
            // The shell exits 42 once TERM has ended its sleep: had KILL been sent, the receipt
            // would say 137.
            let ready = fx.scratch("ready");
            let outcome = fx.start(
                sh(&format!(
                    "trap 'exit 42' TERM; sleep 300 & touch {}; wait",
                    ready.display()
                )),
                vec![],
            );
            let handle = handle_of(&outcome);
            wait_for(WAIT, || ready.exists().then_some(())).expect("trap installed");
            assert_eq!(fast().stop(&handle), StopOutcome::Stopped(StopSignal::Term));
            assert_eq!(fx.wait_receipt().exit_code, 42);
        },
    );
}

#[test]
fn rejects_an_unparseable_handle_without_signaling() {
    for bad in ["", "pid:1", "ql3lp1.", "ql3lp1.!!!!", "ql3lp1.e30"] {
        assert_eq!(
            StopController::default().stop(bad),
            StopOutcome::Unknown(StopUnknown::InvalidHandle),
            "{bad:?}"
        );
    }
}

#[test]
fn maps_identity_provider_failure_to_unknown_without_signaling() {
    in_clean_process(
        "maps_identity_provider_failure_to_unknown_without_signaling",
        || {
            let fx = Fixture::new(53);
            let outcome = fx.start(sh("exec sleep 300"), vec![]);
            let handle = handle_of(&outcome);
            let pid = Fixture::user_pid(&outcome);
            let empty = fx.scratch("no-proc");
            fs::create_dir(&empty).unwrap();
            let blind = StopController::default().with_proc_root(ProcRoot::at(&empty));
            assert_eq!(
                blind.stop(&handle),
                StopOutcome::Unknown(StopUnknown::ProviderUnavailable)
            );
            std::thread::sleep(Duration::from_millis(100));
            assert!(
                alive(pid),
                "nothing may be signalled on an inconclusive inspection"
            );
            assert!(fx.receipt().is_none());
            assert_eq!(
                StopController::default().stop(&handle),
                StopOutcome::Stopped(StopSignal::Term)
            );
            assert_eq!(fx.wait_receipt().exit_code, 143);
        },
    );
}

#[test]
fn pid_reuse_forged_identity_is_never_signalled() {
    // A live process that is not ours to stop: same pid and group, but another start time or
    // boot (what a reused pid looks like).
    let mut target = Command::new("/bin/sleep")
        .arg("300")
        .process_group(0)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let pid = target.id();
    let real = identity::capture(&ProcRoot::system(), pid).unwrap();
    assert_eq!(real.pgid, pid);
    let forge = |f: &dyn Fn(&mut identity::ProcessIdentity)| {
        let mut identity = real.clone();
        f(&mut identity);
        DurableHandle {
            handle_id: "forged".into(),
            identity,
        }
        .encode()
        .unwrap()
    };
    let ticks: u64 = real.start_ticks.parse().unwrap();
    let forged = [
        forge(&|i| i.start_ticks = (ticks + 1).to_string()),
        forge(&|i| i.start_ticks = (ticks - 1).max(1).to_string()),
        forge(&|i| i.boot_id = "00000000-0000-0000-0000-000000000000".into()),
        forge(&|i| i.pgid += 1),
    ];
    for handle in &forged {
        assert_eq!(
            StopController::default().stop(handle.as_str()),
            StopOutcome::AlreadyExited,
            "a mismatched identity is treated as gone and never signalled"
        );
    }
    std::thread::sleep(Duration::from_millis(100));
    assert!(
        target.try_wait().unwrap().is_none(),
        "the process behind the reused pid must survive"
    );
    // The exact identity is stopped.
    let exact = DurableHandle {
        handle_id: "exact".into(),
        identity: real,
    }
    .encode()
    .unwrap();
    assert_eq!(
        StopController::default().stop(exact.as_str()),
        StopOutcome::Stopped(StopSignal::Term)
    );
    let status = target.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&status),
        Some(15)
    );
}
