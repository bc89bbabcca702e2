//! Fuzzing support beyond the wire parsers (`crate::fuzzing::wire`): the entry points shared by
//! the cargo-fuzz targets (`fuzz/fuzz_targets/*.rs`) and the stable corpus replay test
//! (`core/tests/fuzz_corpus.rs`). Not part of the API.
//!
//! * [`decoders`]: the four envelope kinds (raw and below the checksum) and receipt
//!   authentication.
//! * The machine target `machine_walk` walks the one simulated world
//!   ([`crate::testkit::explore::walk::fuzz`]).
//!
//! Op sequences are decoded from raw bytes by [`bytes::Bytes`], a reader that never fails
//! (zero past the end), so the core needs no `arbitrary` dependency and the stable replay test
//! runs the very same code (see `docs/fuzzing.md`).

pub mod bytes;
pub mod decoders;
pub mod samples;
pub mod wire;
