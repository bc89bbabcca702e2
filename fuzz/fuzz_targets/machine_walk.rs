//! Fuzz target `machine_walk`: the bytes choose a walk through the model checks' world
//! (`ql_worker_sim::testkit::explore::walk`): every move the explorer could take, one per byte,
//! then a settling phase; it panics on any broken invariant or a walk that does not settle (also
//! walked from seeded inputs on stable by `core/tests/walks.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ql_worker_sim::testkit::explore::walk::fuzz(data);
});
