//! ql-worker-sim: the test machinery of ql-worker, kept out of the audited core.
//!
//! * [`testkit`]: sample values, the simulated host and the model-check explorer.
//! * [`fuzzing`]: the entry points of the cargo-fuzz targets and of their stable replay tests.
//! * `fault_fs` (feature `fault-fs`): `FaultFs`, the fault-injecting file seam of the drivers'
//!   tests and benches.
//!
//! A dev-dependency of the workspace's tests, benches and fuzz targets; never a dependency of
//! the `ql-worker` binary (`cargo tree -p ql-worker -e normal` does not list it). It is the only
//! crate that enables core's `sim-hooks` feature.
#![forbid(unsafe_code)]

pub mod clock;
#[cfg(feature = "fault-fs")]
pub mod fault_fs;
pub mod fuzzing;
pub mod testkit;
