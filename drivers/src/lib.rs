//! ql-worker drivers: file authority, supervisor, HTTPS client and the blocking loop.
#![forbid(unsafe_code)]

pub mod supervisor;
