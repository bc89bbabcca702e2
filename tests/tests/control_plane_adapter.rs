//! The HTTPS adapter's own contract, as the `ql-worker demo` uses it: a private generated PKI and
//! credential, Worker settings, sample Runs, and a server that stops when dropped.

mod control_plane_common;

use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use control_plane_common::client_for;
use ql_worker_core::ids::RunId;
use ql_worker_core::wire::route::Operation;
use ql_worker_tests::control_plane::harness::register_body;
use ql_worker_tests::control_plane::{
    ReferenceControlPlane, ReferenceOptions, RevisionBuilder, RunSpec,
};

fn mode(path: &std::path::Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn start_generates_a_private_pki_and_credential_and_stops_when_dropped() {
    let cp = ReferenceControlPlane::start(ReferenceOptions::default()).unwrap();
    let s = cp.worker_settings().clone();
    assert!(s.origin.starts_with("https://127.0.0.1:"));
    assert_eq!(s.worker_id.as_str(), "worker-1");
    assert_eq!(mode(cp.dir()), 0o700);
    for file in [
        &s.client_cert,
        &s.client_key,
        &s.ca_cert,
        &s.credential_file,
    ] {
        assert_eq!(mode(file), 0o600, "{}", file.display());
    }
    let token = std::fs::read_to_string(&s.credential_file).unwrap();
    assert!(token.starts_with("ql3w_worker-primary_") && !token.contains('\n'));
    assert_eq!(format!("Worker {token}"), *cp.credential().header_value());

    // Sample Runs, and a Worker registering with the settings alone.
    for (n, command) in [(1, "echo hello"), (2, "exit 3")] {
        let revision = RevisionBuilder::shell(command).build().unwrap();
        cp.enqueue_run(RunSpec::numbered(n, revision)).unwrap();
    }
    assert!(
        cp.enqueue_run(RunSpec::numbered(
            1,
            RevisionBuilder::shell("x").build().unwrap()
        ))
        .is_err()
    );
    let client = client_for(&cp, 5_000);
    let path = ql_worker_core::wire::route::path(
        &s.worker_id,
        &ql_worker_tests::control_plane::harness::session_id(1),
        Operation::Register,
    );
    client
        .post_json(
            &path,
            &format!("Worker {}", token.trim_end()),
            &register_body(1),
            control_plane_common::caps(Operation::Register),
        )
        .expect("register with the generated settings");
    assert!(cp.session(&s.worker_id).is_some());
    assert!(cp.run(&RunId::new("run-2").unwrap()).is_some());

    let addr = s.origin.trim_start_matches("https://").to_owned();
    let dir = cp.dir().to_owned();
    drop(cp);
    assert!(!dir.exists(), "the generated files are removed");
    assert!(
        TcpStream::connect_timeout(&addr.parse().unwrap(), Duration::from_secs(2)).is_err(),
        "the listener is closed"
    );
}
