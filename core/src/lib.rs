//! ql-worker-core: the pure, deterministic, sans-IO heart of the ql-worker remote Worker.
//!
//! Nothing in this crate touches a file, a socket, a process, a clock or a random number
//! generator: facts come in as inputs, decisions go out as commands.
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

extern crate alloc;

pub mod claim;
pub mod envelope;
pub mod error;
pub mod ids;
pub mod js;
pub mod listing;
pub mod offer;
pub mod receipt;
pub mod record;
pub mod revision;
#[doc(hidden)]
pub mod testkit;
pub mod time;
pub mod truncation;
pub mod wire;
