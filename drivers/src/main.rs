#![forbid(unsafe_code)]

use std::process::ExitCode;

fn main() -> ExitCode {
    // Hidden supervisor mode: the Worker runs its own image as `ql-worker __supervise` and sends
    // the plan over stdin (never argv). See `ql_worker::supervisor`.
    if std::env::args_os().nth(1).as_deref() == Some(ql_worker::supervisor::SUPERVISE_ARG.as_ref())
    {
        ql_worker::supervisor::main();
    }
    // Descriptors inherited from whoever started us (a shell, cargo's jobserver) must never
    // reach a supervisor or a user process: mark them close-on-exec before anything else runs.
    close_fds::set_fds_cloexec_threadsafe(3, &[]);
    ql_worker::cli::main()
}
