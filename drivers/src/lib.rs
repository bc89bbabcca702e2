//! ql-worker drivers: file authority, supervisor, HTTPS client and the blocking loop.
#![forbid(unsafe_code)]

pub mod config;
pub mod fsio;
pub mod https;
pub mod journal;
pub mod layout;
pub mod lock;
pub mod receipts;
pub mod retention;
pub mod spool;
pub mod supervisor;
