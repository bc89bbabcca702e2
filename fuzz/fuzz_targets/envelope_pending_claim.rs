//! Fuzz target `envelope_pending_claim`: arbitrary bytes into the shared entry point
//! `ql_worker_sim::fuzzing::decoders::envelope_pending_claim` (also replayed on stable by
//! `core/tests/fuzz_corpus.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ql_worker_sim::fuzzing::decoders::envelope_pending_claim(data);
});
