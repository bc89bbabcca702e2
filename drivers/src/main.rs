#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    // The production binary: no test hook is ever installed here, whatever features the library
    // was compiled with (`ql-worker-test-hooks` is the binary that installs them).
    ql_worker::cli::binary_main()
}
