//! `ql-worker-test-hooks`: the `ql-worker` binary plus the crash-test hooks, for the tests in
//! `drivers/tests/` only. It exists only when the `test-hooks` feature is on (test and bench
//! builds); see `docs/operations.md`, "Test-only hooks".
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::process::ExitCode;

fn main() -> ExitCode {
    if let Err(e) = ql_worker::test_hooks::install_from_env() {
        let _ = writeln!(std::io::stderr(), "ql-worker: {e}");
        return ExitCode::from(ql_worker::cli::EXIT_CONFIG);
    }
    ql_worker::cli::binary_main()
}
