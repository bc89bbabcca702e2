//! Fuzzing support beyond the wire parsers (`crate::fuzzing::wire`): the entry points shared by
//! the cargo-fuzz targets (`fuzz/fuzz_targets/*.rs`) and the stable corpus replay test
//! (`core/tests/fuzz_corpus.rs`). Not part of the API.
//!
//! * [`decoders`]: the four envelope kinds (raw and below the checksum) and receipt
//!   authentication.
//! * [`machine`]: the whole [`Worker`](ql_worker_core::worker::Worker) driven by a fuzzed op sequence
//!   through a fuzz host ([`host`]) that answers every action, injects faults and crashes, and
//!   checks the safety invariants after every step.
//!
//! Op sequences are decoded from raw bytes by [`bytes::Bytes`], a reader that never fails
//! (zero past the end), so the core needs no `arbitrary` dependency and the stable replay test
//! runs the very same code (see `docs/fuzzing.md`).

pub mod bytes;
pub mod decoders;
pub mod host;
pub mod machine;
pub mod plane;
pub mod samples;
pub mod wire;
