#![forbid(unsafe_code)]

fn main() {
    // Hidden supervisor mode: the Worker runs its own image as `ql-worker __supervise` and sends
    // the plan over stdin (never argv). See `ql_worker::supervisor`.
    if std::env::args_os().nth(1).as_deref() == Some(ql_worker::supervisor::SUPERVISE_ARG.as_ref())
    {
        ql_worker::supervisor::main();
    }
    println!("ql-worker");
}
