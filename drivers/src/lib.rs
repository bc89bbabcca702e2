//! ql-worker drivers: file authority, supervisor, HTTPS client and the blocking loop.
#![forbid(unsafe_code)]

pub mod calls;
pub mod certificate;
pub mod cli;
pub mod config;
pub mod containment;
#[cfg(feature = "demo")]
pub mod demo;
pub mod events;
pub mod fsio;
pub mod host;
pub mod https;
pub mod journal;
pub mod layout;
pub mod lock;
pub mod metrics;
pub mod notify;
pub mod os;
pub mod receipts;
pub mod retention;
pub mod runtime;
pub mod session_store;
pub mod spool;
pub mod supervisor;
pub mod telemetry;
#[cfg(feature = "test-hooks")]
pub mod test_hooks;
