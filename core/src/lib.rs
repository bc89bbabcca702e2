//! ql-worker-core: the pure, deterministic, sans-IO heart of the ql-worker remote Worker.
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

extern crate alloc;
