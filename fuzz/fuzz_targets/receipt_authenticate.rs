//! Fuzz target `receipt_authenticate`: arbitrary bytes into the shared entry point
//! `ql_worker_sim::fuzzing::decoders::receipt_authenticate` (also replayed on stable by
//! `core/tests/fuzz_corpus.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ql_worker_sim::fuzzing::decoders::receipt_authenticate(data);
});
