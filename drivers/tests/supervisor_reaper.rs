//! Subreaper rule: descendants that leave the user's process group or lose their parent are
//! re-parented to the supervisor (not PID 1), and are killed and reaped when the user process
//! exits or is stopped.

mod supervisor_common;

use std::fs;
use std::path::Path;

use ql_worker::supervisor::ExecutorOutcome;
use ql_worker::supervisor::{StopController, StopOutcome, StopSignal};
use ql_worker_core::ids::ExecutorHandle;
use supervisor_common::{
    Fixture, WAIT, alive, authenticate, exists, in_clean_process, sh, wait_for,
};

fn stat_fields(pid: u32) -> Vec<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat.rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

fn read_pid(path: &Path) -> u32 {
    fs::read_to_string(path).unwrap().trim().parse().unwrap()
}

/// Starts a user script that leaves four `sleep 300` descendants behind: one in its group, one
/// in a new session, one orphaned in its group, one orphaned in a new session. Returns the user
/// pid, the supervisor pid and the four descendant pids once all are running.
fn start_escapees(fx: &Fixture, gate: &Path) -> (ExecutorOutcome, u32, u32, [u32; 4]) {
    let p = |i| fx.scratch(&format!("p{i}"));
    let script = format!(
        "sleep 300 & echo $! > {p1}; \
         setsid sleep 300 & echo $! > {p2}; \
         ( sleep 300 & echo $! > {p3} ); \
         ( setsid sleep 300 & echo $! > {p4} ); \
         while [ ! -e {gate} ]; do sleep 0.02; done; exit 0",
        p1 = p(1).display(),
        p2 = p(2).display(),
        p3 = p(3).display(),
        p4 = p(4).display(),
        gate = gate.display(),
    );
    let outcome = fx.start(sh(&script), vec![]);
    let user = Fixture::user_pid(&outcome);
    let supervisor: u32 = stat_fields(user)[1].parse().unwrap();
    let pids = wait_for(WAIT, || {
        let all: Vec<u32> = (1..=4)
            .map(|i| fs::read_to_string(p(i)).ok()?.trim().parse().ok())
            .collect::<Option<_>>()?;
        // Wait until each has exec'd sleep in its final session.
        all.iter()
            .all(|pid| {
                fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c == "sleep\n")
            })
            .then(|| [all[0], all[1], all[2], all[3]])
    })
    .expect("descendants running");
    assert_eq!(read_pid(&p(1)), pids[0]);
    (outcome, user, supervisor, pids)
}

#[test]
fn subreaper_kills_and_reaps_descendants_that_escape_the_group() {
    in_clean_process(
        "subreaper_kills_and_reaps_descendants_that_escape_the_group",
        || {
            let fx = Fixture::new(40);
            let gate = fx.scratch("gate");
            let (_, user, supervisor, pids) = start_escapees(&fx, &gate);
            let [in_group, new_session, orphan, orphan_new_session] = pids;
            // Group membership: two stay in the user's group, two escaped it.
            assert_eq!(stat_fields(in_group)[2], user.to_string());
            assert_eq!(stat_fields(orphan)[2], user.to_string());
            assert_ne!(stat_fields(new_session)[2], user.to_string());
            assert_ne!(stat_fields(orphan_new_session)[2], user.to_string());
            // Orphans were re-parented to the supervisor (the subreaper), not PID 1.
            assert_eq!(stat_fields(orphan)[1], supervisor.to_string());
            assert_eq!(stat_fields(orphan_new_session)[1], supervisor.to_string());
            fs::write(&gate, b"").unwrap();
            let receipt = fx.wait_receipt();
            authenticate(&receipt, &fx.record);
            assert_eq!(receipt.exit_code, 0);
            // Every descendant was killed and reaped by the supervisor: not even a zombie is
            // left for PID 1.
            for pid in pids {
                assert!(
                    wait_for(WAIT, || (!exists(pid)).then_some(())).is_some(),
                    "descendant {pid} must be gone"
                );
            }
            assert!(wait_for(WAIT, || (!alive(supervisor)).then_some(())).is_some());
        },
    );
}

#[test]
fn stop_reaches_escaped_descendants_through_the_subreaper() {
    in_clean_process(
        "stop_reaches_escaped_descendants_through_the_subreaper",
        || {
            let fx = Fixture::new(41);
            let gate = fx.scratch("gate-never");
            let (outcome, user, _, pids) = start_escapees(&fx, &gate);
            let ExecutorOutcome::Started { handle, .. } = &outcome else {
                unreachable!()
            };
            let handle: &ExecutorHandle = handle;
            assert_eq!(
                StopController::default().stop(handle.as_str()),
                StopOutcome::Stopped(StopSignal::Term)
            );
            let receipt = fx.wait_receipt();
            authenticate(&receipt, &fx.record);
            assert_eq!(receipt.exit_code, 128 + 15);
            assert!(!alive(user));
            for pid in pids {
                assert!(
                    wait_for(WAIT, || (!exists(pid)).then_some(())).is_some(),
                    "escaped descendant {pid} must be gone after the stop"
                );
            }
        },
    );
}
