//! Fuzz target `machine_finish_path`: the bytes are an op sequence (read by
//! `ql_worker_sim::fuzzing::bytes::Bytes`) driving the real Worker through the fuzz host of
//! `ql_worker_sim::fuzzing::machine`, which panics on any broken invariant (also replayed on
//! stable by `core/tests/fuzz_corpus.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ql_worker_sim::fuzzing::machine::machine_finish_path(data);
});
