//! Fuzz target `wire_completion_response`: arbitrary bytes into the shared entry point
//! `ql_worker_sim::fuzzing::wire::completion_response` (also replayed on stable by
//! `core/tests/wire_fuzz_corpus.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ql_worker_sim::fuzzing::wire::completion_response(data);
});
