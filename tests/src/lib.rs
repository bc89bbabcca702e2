//! Test support for ql-worker: the loopback reference control plane and the simulation.
#![forbid(unsafe_code)]
