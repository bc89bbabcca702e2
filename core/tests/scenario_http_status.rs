//! How a non-200 answer is read, through the public Worker: an overloaded or throttling control
//! plane (408, 429, 5xx) is retried like a lost connection, never taken as a refusal; any other
//! 4xx (except 401, 403 and 409, which have their own rules) is the control plane's definite
//! refusal. The Session's register shows both: a refused register halts the Worker, an
//! unanswered one is tried again. (Kills the two `http_fault` arm deletions of
//! `core/src/ops.rs`, now in `core/src/worker.rs`; docs/mutation.md.)

use ql_worker_core::io::{HttpFailure, Outcome};
use ql_worker_sim::testkit::sim::Sim;
use ql_worker_sim::testkit::world::World;

/// Answers the Worker's first register with `status`, then lets it run on; returns its
/// commands and notes from the start.
fn register_answered(status: u16) -> Vec<String> {
    let mut sim = Sim::scenario(World::one_offer(1));
    sim.tick();
    let first = sim.act().map(|act| sim.world.summary(act));
    assert_eq!(first.as_deref(), Some("post register"));
    sim.deliver(Outcome::Http(HttpFailure::Status {
        status,
        code: Some(String::from("internal_error")),
    }));
    sim.run(3);
    sim.take_trail()
}

#[test]
fn an_overloaded_or_throttling_control_plane_is_retried_never_taken_as_a_refusal() {
    for status in [408, 429, 500, 502, 503, 504] {
        let trail = register_answered(status);
        assert!(
            !trail.iter().any(|l| l.starts_with("halted")),
            "{status}: {trail:#?}"
        );
        assert!(
            trail.iter().filter(|l| *l == "post register").count() >= 2,
            "{status}: registered again: {trail:#?}"
        );
    }
}

#[test]
fn any_other_client_error_is_a_definite_refusal_and_halts_the_register() {
    for status in [400, 404, 410, 422] {
        let trail = register_answered(status);
        assert!(
            trail.iter().any(|l| l.starts_with("halted")),
            "{status}: {trail:#?}"
        );
        assert_eq!(
            trail.iter().filter(|l| *l == "post register").count(),
            1,
            "{status}: never registered again: {trail:#?}"
        );
    }
}
