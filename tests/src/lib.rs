//! Test support for ql-worker: the loopback reference control plane and the simulation.
#![forbid(unsafe_code)]

pub mod control_plane;
pub mod https_server;
pub mod json_writer;
pub mod pki;
pub mod server_wire;
pub mod splitmix;
