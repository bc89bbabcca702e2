//! Which `ql-worker` binary the real-binary tests run: this build's (the default), or the one
//! `QL_WORKER_BIN_UNDER_TEST` names (and `QL_WORKER_HOOKED_BIN_UNDER_TEST` for the test-hooks
//! build of the same code). The edge smoke (`tests/edge/smoke.sh`) points it at a
//! static cross build that the kernel hands to a qemu-user emulator through `binfmt_misc`, and
//! names that emulator in `QL_WORKER_EMULATOR`, so the same tests prove the emulated binary.
#![allow(dead_code, unreachable_pub)]

use std::path::{Path, PathBuf};

/// Names another `ql-worker` binary for the tests to run instead of this build's.
pub const BIN_UNDER_TEST_ENV: &str = "QL_WORKER_BIN_UNDER_TEST";
/// Names the matching `ql-worker-test-hooks` binary (the same code with the crash-test hooks),
/// which the restart tests need to stop the Worker in a chosen state.
pub const HOOKED_BIN_UNDER_TEST_ENV: &str = "QL_WORKER_HOOKED_BIN_UNDER_TEST";
/// Names the emulator (`binfmt_misc` interpreter) the binary under test runs under.
pub const EMULATOR_ENV: &str = "QL_WORKER_EMULATOR";

/// The `ql-worker` binary under test.
pub fn worker_bin() -> PathBuf {
    std::env::var_os(BIN_UNDER_TEST_ENV).map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_ql-worker")),
        PathBuf::from,
    )
}

/// The `ql-worker-test-hooks` binary under test.
pub fn hooked_worker_bin() -> PathBuf {
    std::env::var_os(HOOKED_BIN_UNDER_TEST_ENV).map_or_else(
        || PathBuf::from(env!("CARGO_BIN_EXE_ql-worker-test-hooks")),
        PathBuf::from,
    )
}

/// The emulator the binary under test runs under, if any.
pub fn emulator() -> Option<PathBuf> {
    std::env::var_os(EMULATOR_ENV).map(PathBuf::from)
}

/// What `/proc/<pid>/exe` of a process running the binary under test names: the binary itself
/// natively, the emulator under `binfmt_misc`.
pub fn expected_exe() -> PathBuf {
    emulator().unwrap_or_else(worker_bin)
}

/// As [`expected_exe`], for the test-hooks binary under test.
pub fn expected_hooked_exe() -> PathBuf {
    emulator().unwrap_or_else(hooked_worker_bin)
}

/// Checks `/proc/<supervisor>/cmdline`: natively exactly `ql-worker __supervise` (no plan data
/// on argv). Under a `binfmt_misc` emulator registered with the `P` (preserve argv\[0\]) flag the
/// kernel puts the interpreter and the executed path (`/proc/self/fd/N`, the Worker's image
/// descriptor) first; the rest must still be exactly `ql-worker __supervise`.
pub fn assert_supervisor_cmdline(cmdline: &[u8]) {
    let args: Vec<&[u8]> = cmdline
        .strip_suffix(b"\0")
        .unwrap_or(cmdline)
        .split(|b| *b == 0)
        .collect();
    let own: &[&[u8]] = &[b"ql-worker", b"__supervise"];
    match emulator() {
        None => assert_eq!(args, own, "{}", String::from_utf8_lossy(cmdline)),
        Some(emulator) => {
            let shown = String::from_utf8_lossy(cmdline);
            assert_eq!(args.len(), 4, "{shown}");
            assert_eq!(
                Path::new(std::str::from_utf8(args[0]).unwrap()),
                emulator,
                "{shown}"
            );
            assert!(args[1].starts_with(b"/proc/self/fd/"), "{shown}");
            assert_eq!(&args[2..], own, "{shown}");
        }
    }
}
