//! The Worker's HTTPS transport against the loopback reference server: real TLS 1.3 with
//! generated certificates, real sockets on loopback, no mocks. Every server stops when
//! dropped; every loop is bounded.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ql_worker::https::{
    Blame, HttpsClient, JsonCaps, MaterialError, MaterialFile, Origin, OriginError, RequestTimeout,
    TlsFailure, TlsMaterial, TlsMaterialPaths, TransportError,
};
use ql_worker_tests::https_server::{
    ArtifactSinkHandler, ClientAuth, EchoHandler, Fault, Handler, HttpsServer, RequestRecord,
    ServerMode, ServerOptions, ServerTls,
};
use ql_worker_tests::pki::{CertKeyFiles, TestPki};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use sha2::{Digest, Sha256};
use tempfile::TempDir;

/// A syntactically real Worker credential (`Worker ql3w_<id>_<43 base64url chars>`).
const AUTH: &str = "Worker ql3w_worker_primary_S3cr3tS3cr3tS3cr3tS3cr3tS3cr3tS3cr3tS3c";
/// The secret part alone, searched for in every `Debug` and `Display` output.
const AUTH_SECRET: &str = "S3cr3tS3cr3tS3cr3tS3cr3tS3cr3tS3cr3tS3c";
const PATH: &str = "/api/v3/worker-ingress/workers/worker-1/sessions/s/heartbeat";
const ARTIFACT_PATH: &str = "/api/v3/worker-ingress/workers/worker-1/sessions/s/artifacts";

struct Pki {
    _tmp: TempDir,
    pki: TestPki,
}

fn pki() -> Pki {
    let tmp = tempfile::tempdir().expect("tempdir");
    let pki = TestPki::generate(&tmp.path().join("pki")).expect("generate PKI");
    Pki { _tmp: tmp, pki }
}

fn server_tls(p: &TestPki, server: &CertKeyFiles) -> ServerTls {
    ServerTls::from_pem_files(&server.cert, &server.key, &[&p.ca.cert]).expect("server TLS")
}

fn start(p: &TestPki, options: ServerOptions, handler: Arc<dyn Handler>) -> HttpsServer {
    HttpsServer::start(options, &server_tls(p, &p.server), handler).expect("start server")
}

fn start_with_cert(p: &TestPki, server: &CertKeyFiles) -> HttpsServer {
    HttpsServer::start(
        ServerOptions::default(),
        &server_tls(p, server),
        Arc::new(EchoHandler),
    )
    .expect("start server")
}

fn paths(client: &CertKeyFiles, anchors: &[&Path]) -> TlsMaterialPaths {
    TlsMaterialPaths {
        cert_chain: client.cert.clone(),
        private_key: client.key.clone(),
        trust_anchors: anchors.iter().map(|p| p.to_path_buf()).collect(),
    }
}

fn client_with(
    origin: &str,
    client: &CertKeyFiles,
    anchors: &[&Path],
    timeout_ms: u64,
) -> HttpsClient {
    let material = TlsMaterial::load(&paths(client, anchors)).expect("material");
    HttpsClient::new(
        Origin::parse(origin).expect("origin"),
        material,
        RequestTimeout::from_millis(timeout_ms).expect("timeout"),
    )
    .expect("client")
}

fn client(p: &TestPki, origin: &str) -> HttpsClient {
    client_with(origin, &p.client, &[&p.ca.cert], 5_000)
}

fn post(c: &HttpsClient, body: &[u8]) -> Result<Vec<u8>, TransportError> {
    c.post_json(PATH, AUTH, body, JsonCaps::default())
}

/// Waits (bounded) until the server has recorded `n` requests.
fn wait_records(server: &HttpsServer, n: usize) -> Vec<RequestRecord> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let records = server.records();
        if records.len() >= n || Instant::now() > deadline {
            return records;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits (bounded) until the server has recorded `n` handshake failures.
fn wait_handshake_failures(server: &HttpsServer, n: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let failures = server.handshake_failures();
        if failures.len() >= n || Instant::now() > deadline {
            return failures;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Deterministic pseudo-random bytes (xorshift), so content is not trivially compressible.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// ------------------------------------------------------------------------------------------
// The happy path.
// ------------------------------------------------------------------------------------------

#[test]
fn mtls_post_json_over_tls13_sends_exact_headers_and_body() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    let c = client(&p.pki, &server.origin());
    let body = br#"{"schema":"qinglong/worker-session-heartbeat@v1","seq":1}"#;

    let response = post(&c, body).expect("post");
    assert_eq!(response, body, "the echo handler returns the body");

    let records = server.records();
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r.tls.version, Some(rustls::ProtocolVersion::TLSv1_3));
    assert!(r.tls.client_cert_presented, "client certificate presented");
    assert_eq!(r.tls.sni, None, "no SNI for an IP literal");
    assert_eq!(r.method, "POST");
    assert_eq!(r.path, PATH);
    let names: Vec<&str> = r.headers.iter().map(|(n, _)| n.as_str()).collect();
    let mut sorted = names.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        [
            "accept",
            "authorization",
            "content-length",
            "content-type",
            "host"
        ],
        "exactly these headers, got {names:?}"
    );
    assert_eq!(r.header("accept"), Some("application/json"));
    assert_eq!(r.header("authorization"), Some(AUTH));
    assert_eq!(r.header("content-type"), Some("application/json"));
    assert_eq!(
        r.header("content-length"),
        Some(body.len().to_string().as_str())
    );
    assert_eq!(r.header("host"), Some(server.addr().to_string().as_str()));
    assert_eq!(r.body, body);
    assert!(r.body_complete);
    assert_eq!(r.body_sha256.as_slice(), Sha256::digest(body).as_slice());
}

#[test]
fn sni_is_sent_for_dns_names_only() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    post(&client(&p.pki, &server.origin_for_host("localhost")), b"{}").expect("localhost");
    post(&client(&p.pki, &server.origin()), b"{}").expect("127.0.0.1");
    let records = server.records();
    assert_eq!(records[0].tls.sni.as_deref(), Some("localhost"));
    assert_eq!(records[1].tls.sni, None);

    let v6 = start(
        &p.pki,
        ServerOptions {
            bind: "[::1]:0".parse().unwrap(),
            ..ServerOptions::default()
        },
        Arc::new(EchoHandler),
    );
    assert!(v6.origin().starts_with("https://[::1]:"));
    post(&client(&p.pki, &v6.origin()), b"{}").expect("[::1]");
    let r = &v6.records()[0];
    assert_eq!(r.tls.sni, None, "no SNI for an IPv6 literal");
    assert_eq!(r.tls.version, Some(rustls::ProtocolVersion::TLSv1_3));
    assert!(matches!(
        Origin::parse(&v6.origin()).unwrap().server_name(),
        ServerName::IpAddress(_)
    ));
}

#[test]
fn keep_alive_reuses_exactly_one_connection() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    let c = client(&p.pki, &server.origin());
    for i in 0..3 {
        post(&c, format!("{{\"n\":{i}}}").as_bytes()).expect("post");
    }
    let records = server.records();
    assert_eq!(records.len(), 3);
    assert!(
        records
            .iter()
            .all(|r| r.connection_id == records[0].connection_id)
    );
    assert_eq!(
        records.iter().map(|r| r.sequence).collect::<Vec<_>>(),
        [1, 2, 3]
    );
    assert_eq!(server.connections_accepted(), 1);
    let s = c.settings();
    assert_eq!(s.max_idle_connections, 1);
    assert_eq!(s.max_idle_connections_per_host, 1);
}

// ------------------------------------------------------------------------------------------
// Wrong peers, wrong versions, plaintext.
// ------------------------------------------------------------------------------------------

#[test]
fn tls12_only_server_is_refused_as_protocol_version() {
    let p = pki();
    let server = start(
        &p.pki,
        ServerOptions {
            mode: ServerMode::Tls12Only,
            ..ServerOptions::default()
        },
        Arc::new(EchoHandler),
    );
    let err = post(&client(&p.pki, &server.origin()), b"{}").unwrap_err();
    assert!(
        matches!(err, TransportError::Tls(TlsFailure::ProtocolVersion)),
        "{err:?}"
    );
    assert_eq!(err.blame(), Blame::Tls);
    assert!(server.records().is_empty());
    assert_eq!(wait_handshake_failures(&server, 1).len(), 1);
}

#[test]
fn unknown_ca_server_certificate_is_refused() {
    let p = pki();
    // The server presents a certificate from a CA the client does not trust.
    let server = start_with_cert(&p.pki, &p.pki.other_server);
    let err = post(&client(&p.pki, &server.origin()), b"{}").unwrap_err();
    assert!(
        matches!(err, TransportError::Tls(TlsFailure::UnknownIssuer)),
        "{err:?}"
    );
    assert!(server.records().is_empty());
}

#[test]
fn wrong_ca_trust_anchor_refuses_the_good_server() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    // The client trusts only the unrelated CA.
    let c = client_with(
        &server.origin(),
        &p.pki.client,
        &[&p.pki.other_ca.cert],
        5_000,
    );
    let err = post(&c, b"{}").unwrap_err();
    assert!(
        matches!(err, TransportError::Tls(TlsFailure::UnknownIssuer)),
        "{err:?}"
    );
}

#[test]
fn mtls_client_cert_from_wrong_ca_is_refused_by_the_server() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    let c = client_with(
        &server.origin(),
        &p.pki.other_client,
        &[&p.pki.ca.cert],
        5_000,
    );
    let err = post(&c, b"{}").unwrap_err();
    // TLS 1.3: the client finishes its side first; the rejection arrives as the server's
    // alert or as a closed connection, depending on timing. Both are accepted here.
    assert!(
        matches!(
            err,
            TransportError::Tls(TlsFailure::ClientCertificateRejected { .. })
                | TransportError::ConnectionClosed { .. }
        ),
        "{err:?}"
    );
    let failures = wait_handshake_failures(&server, 1);
    assert!(
        failures.iter().any(|f| f.contains("UnknownIssuer")),
        "{failures:?}"
    );
    assert!(server.records().is_empty(), "no request was served");
}

/// A raw rustls client, for what `HttpsClient` refuses to do (no client certificate) and
/// for requests it would never send (chunked, no content-length).
fn raw_exchange(
    p: &TestPki,
    server: &HttpsServer,
    with_client_cert: bool,
    request: &[u8],
) -> io::Result<Vec<u8>> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(&p.ca.cert).unwrap())
        .unwrap();
    let builder = rustls::ClientConfig::builder_with_provider(ql_worker::https::tls13_provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_root_certificates(roots);
    let config = if with_client_cert {
        let chain = CertificateDer::pem_file_iter(&p.client.cert)
            .unwrap()
            .collect::<Result<Vec<_>, _>>()
            .unwrap();
        let key = PrivateKeyDer::from_pem_file(&p.client.key).unwrap();
        builder.with_client_auth_cert(chain, key).unwrap()
    } else {
        builder.with_no_client_auth()
    };
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let tcp = TcpStream::connect(server.addr())?;
    tcp.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut tls = rustls::StreamOwned::new(conn, tcp);
    tls.write_all(request)?;
    tls.flush()?;
    let mut response = Vec::new();
    match tls.read_to_end(&mut response) {
        Ok(_) => Ok(response),
        Err(e) if !response.is_empty() => {
            let _ = e;
            Ok(response)
        }
        Err(e) => Err(e),
    }
}

const RAW_POST: &[u8] = b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n\
content-length: 2\r\nconnection: close\r\n\r\n{}";

#[test]
fn mtls_client_without_certificate_is_refused_when_required() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    let result = raw_exchange(&p.pki, &server, false, RAW_POST);
    assert!(
        result.is_err(),
        "no response without a client certificate: {result:?}"
    );
    let failures = wait_handshake_failures(&server, 1);
    assert!(
        failures.iter().any(|f| f.contains("certificate")),
        "{failures:?}"
    );
    assert!(server.records().is_empty());

    // Control: the same client is served when the certificate is optional, so the refusal
    // above came from the required-certificate policy.
    let optional = start(
        &p.pki,
        ServerOptions {
            client_auth: ClientAuth::Optional,
            ..ServerOptions::default()
        },
        Arc::new(EchoHandler),
    );
    let response = raw_exchange(&p.pki, &optional, false, RAW_POST).expect("served");
    assert!(response.starts_with(b"HTTP/1.1 200 OK\r\n"));
    let r = &optional.records()[0];
    assert!(!r.tls.client_cert_presented);

    // And with client auth off entirely, our client still connects (it offers its
    // certificate only when asked).
    let off = start(
        &p.pki,
        ServerOptions {
            client_auth: ClientAuth::Off,
            ..ServerOptions::default()
        },
        Arc::new(EchoHandler),
    );
    post(&client(&p.pki, &off.origin()), b"{}").expect("no client auth requested");
    assert!(!off.records()[0].tls.client_cert_presented);
}

#[test]
fn plaintext_http_origin_is_refused_with_no_tcp_connection() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let origin = format!("http://{}", listener.local_addr().unwrap());
    assert_eq!(
        Origin::parse(&origin),
        Err(OriginError::NotHttps {
            scheme: "http".into()
        })
    );
    // Nothing can be built from an http: origin, so nothing connected.
    match listener.accept() {
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
        other => panic!("unexpected connection: {other:?}"),
    }
    // The agent itself refuses http: too (defence in depth).
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    assert!(client(&p.pki, &server.origin()).settings().https_only);
}

#[test]
fn https_origin_to_plaintext_server_is_refused_as_not_tls() {
    let p = pki();
    let server = start(
        &p.pki,
        ServerOptions {
            mode: ServerMode::Plaintext,
            ..ServerOptions::default()
        },
        Arc::new(EchoHandler),
    );
    let started = Instant::now();
    let err = post(&client(&p.pki, &server.origin()), b"{}").unwrap_err();
    assert!(
        matches!(err, TransportError::Tls(TlsFailure::NotTls { .. })),
        "{err:?}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "refused promptly"
    );
    assert!(server.records().is_empty());
}

#[test]
fn hostname_mismatch_server_certificate_is_refused() {
    let p = pki();
    let server = start_with_cert(&p.pki, &p.pki.wrong_host_server);
    for origin in [server.origin(), server.origin_for_host("localhost")] {
        let err = post(&client(&p.pki, &origin), b"{}").unwrap_err();
        assert!(
            matches!(err, TransportError::Tls(TlsFailure::HostnameMismatch)),
            "{origin}: {err:?}"
        );
    }
}

#[test]
fn expired_server_certificate_is_refused() {
    let p = pki();
    let server = start_with_cert(&p.pki, &p.pki.expired_server);
    let err = post(&client(&p.pki, &server.origin()), b"{}").unwrap_err();
    assert!(
        matches!(err, TransportError::Tls(TlsFailure::Expired)),
        "{err:?}"
    );
}

// ------------------------------------------------------------------------------------------
// Response rules.
// ------------------------------------------------------------------------------------------

#[test]
fn redirect_302_is_a_typed_status_error_and_not_followed() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    server.inject(Fault::Redirect {
        status: 302,
        location: format!("{}/elsewhere", server.origin()),
    });
    let c = client(&p.pki, &server.origin());
    let err = post(&c, b"{}").unwrap_err();
    assert!(
        matches!(
            err,
            TransportError::Status {
                status: 302,
                code: None
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.blame(), Blame::Remote);
    let records = wait_records(&server, 1);
    assert_eq!(records.len(), 1, "the redirect was not followed");
    assert_eq!(records[0].path, PATH);
    assert_eq!(c.settings().max_redirects, 0);
}

#[test]
fn non_200_with_code_body_is_status_with_only_the_code() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    let c = client(&p.pki, &server.origin());

    server.inject(Fault::Status {
        status: 409,
        code: Some("worker_offer_fenced".into()),
    });
    let err = post(&c, b"{}").unwrap_err();
    match &err {
        TransportError::Status { status, code } => {
            assert_eq!(*status, 409);
            assert_eq!(code.as_deref(), Some("worker_offer_fenced"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        err.to_string(),
        "response status must be 200, got 409 (code worker_offer_fenced)"
    );

    server.inject(Fault::Status {
        status: 401,
        code: None,
    });
    assert!(matches!(
        post(&c, b"{}").unwrap_err(),
        TransportError::Status {
            status: 401,
            code: None
        }
    ));

    // Only a snake_case code is kept; other body text never is.
    server.inject(Fault::RawBytes(
        b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
content-length: 42\r\n\r\n{\"code\":\"Not Snake\",\"detail\":\"leak-me!\"}"
            .to_vec(),
    ));
    let err = post(&c, b"{}").unwrap_err();
    assert!(
        matches!(
            &err,
            TransportError::Status {
                status: 503,
                code: None
            }
        ),
        "{err:?}"
    );
    assert!(!format!("{err:?}{err}").contains("leak-me"));
}

#[test]
fn gzip_content_encoding_is_rejected() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    let c = client(&p.pki, &server.origin());
    server.inject(Fault::ContentEncoding("gzip".into()));
    let err = post(&c, b"{}").unwrap_err();
    assert!(matches!(err, TransportError::ContentEncoding), "{err:?}");
    server.inject(Fault::ContentEncoding("identity".into()));
    post(&c, b"{}").expect("identity is accepted");
}

#[test]
fn wrong_content_type_is_rejected() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    let c = client(&p.pki, &server.origin());
    for ct in ["text/html", "application/jsonp", "application/x-json"] {
        server.inject(Fault::ContentType(ct.into()));
        let err = post(&c, b"{}").unwrap_err();
        assert!(matches!(err, TransportError::ContentType), "{ct}: {err:?}");
    }
    server.inject(Fault::ContentType("application/json".into()));
    post(&c, b"{}").expect("bare application/json is accepted");
}

#[test]
fn oversize_response_256k_accepted_256k_plus_1_rejected() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    let c = client(&p.pki, &server.origin());
    let cap = 256 * 1024;
    server.inject(Fault::OversizeBody(cap));
    assert_eq!(post(&c, b"{}").expect("exactly the cap").len(), cap);
    server.inject(Fault::OversizeBody(cap + 1));
    let err = post(&c, b"{}").unwrap_err();
    assert!(
        matches!(err, TransportError::ResponseTooLarge { cap: 262_144 }),
        "{err:?}"
    );
    // A smaller per-call cap is enforced the same way.
    let small = JsonCaps::default().response_cap(4096).unwrap();
    server.inject(Fault::OversizeBody(4097));
    let err = c.post_json(PATH, AUTH, b"{}", small).unwrap_err();
    assert!(
        matches!(err, TransportError::ResponseTooLarge { cap: 4096 }),
        "{err:?}"
    );
}

#[test]
fn oversize_content_length_over_cap_is_rejected_before_reading() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    let c = client(&p.pki, &server.origin());
    server.inject(Fault::DeclaredLength(256 * 1024 + 1));
    let err = post(&c, b"{}").unwrap_err();
    assert!(
        matches!(err, TransportError::ResponseTooLarge { .. }),
        "{err:?}"
    );
}

#[test]
fn oversize_body_without_content_length_is_cut_while_reading() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    let c = client(&p.pki, &server.origin());
    // A close-delimited body (no content-length): only the streaming limit can stop it.
    let mut raw =
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: close\r\n\r\n".to_vec();
    raw.extend(std::iter::repeat_n(b' ', 300 * 1024));
    server.inject(Fault::RawBytes(raw));
    let small = JsonCaps::default().response_cap(1024).unwrap();
    let err = c.post_json(PATH, AUTH, b"{}", small).unwrap_err();
    assert!(
        matches!(err, TransportError::ResponseTooLarge { cap: 1024 }),
        "{err:?}"
    );
}

#[test]
fn response_shorter_than_2_bytes_is_rejected() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    server.inject(Fault::RawBytes(
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 1\r\n\r\n1".to_vec(),
    ));
    let err = post(&client(&p.pki, &server.origin()), b"{}").unwrap_err();
    assert!(
        matches!(err, TransportError::ResponseTooShort { len: 1 }),
        "{err:?}"
    );
}

#[test]
fn slow_response_times_out_within_a_bounded_time() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    let c = client_with(&server.origin(), &p.pki.client, &[&p.pki.ca.cert], 1_000);
    // The server would answer after 30 s (its sleep is cut short when it is dropped).
    server.inject(Fault::Delay(Duration::from_secs(30)));
    let started = Instant::now();
    let err = post(&c, b"{}").unwrap_err();
    let elapsed = started.elapsed();
    assert!(matches!(err, TransportError::Timeout { .. }), "{err:?}");
    assert_eq!(err.blame(), Blame::Connection);
    assert!(
        elapsed < Duration::from_secs(10),
        "timed out after {elapsed:?}"
    );
}

#[test]
fn garbage_response_is_a_malformed_response_error() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    server.inject(Fault::garbage());
    let err = post(&client(&p.pki, &server.origin()), b"{}").unwrap_err();
    assert!(
        matches!(err, TransportError::MalformedResponse { .. }),
        "{err:?}"
    );
    assert_eq!(err.blame(), Blame::Remote);
}

#[test]
fn dropped_connections_before_and_after_the_body_are_connection_errors() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    let c = client(&p.pki, &server.origin());

    server.inject(Fault::DropBeforeBody);
    let err = post(&c, b"{\"a\":1}").unwrap_err();
    assert!(
        matches!(err, TransportError::ConnectionClosed { .. }),
        "{err:?}"
    );
    assert_eq!(err.blame(), Blame::Connection);

    // Commit, then lose the response: the server has the whole body, the client an error.
    server.inject(Fault::DropAfterBody);
    let err = post(&c, b"{\"a\":2}").unwrap_err();
    assert!(
        matches!(err, TransportError::ConnectionClosed { .. }),
        "{err:?}"
    );
    let records = wait_records(&server, 2);
    assert_eq!(records[0].body_len, 0, "the body was never read");
    assert!(!records[0].body_complete);
    assert_eq!(records[0].response_status, None);
    assert!(records[1].body_complete);
    assert_eq!(records[1].body, b"{\"a\":2}");
    assert_eq!(records[1].response_status, None);

    // The client recovers on a fresh connection.
    post(&c, b"{}").expect("next call works");
}

// ------------------------------------------------------------------------------------------
// Request caps and local rules.
// ------------------------------------------------------------------------------------------

#[test]
fn request_cap_is_4k_by_default_and_5k_needs_the_64k_opt_in() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    let c = client(&p.pki, &server.origin());
    let five_k = {
        let mut b = b"{\"pad\":\"".to_vec();
        b.resize(5 * 1024 - 2, b'x');
        b.extend_from_slice(b"\"}");
        b
    };
    let err = post(&c, &five_k).unwrap_err();
    assert!(
        matches!(
            err,
            TransportError::RequestTooLarge {
                len: 5120,
                cap: 4096
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.blame(), Blame::Local);
    assert!(server.records().is_empty(), "nothing was sent");

    let opt_in = JsonCaps::with_request_cap(64 * 1024).unwrap();
    let echoed = c.post_json(PATH, AUTH, &five_k, opt_in).expect("opt-in");
    assert_eq!(echoed, five_k);
    assert!(JsonCaps::with_request_cap(64 * 1024 + 1).is_err());
    let records = server.records();
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].header("content-length"), Some("5120"));
    assert_eq!(records[0].header("transfer-encoding"), None);
}

#[test]
fn invalid_path_and_authorization_are_refused_before_any_connection() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    let c = client(&p.pki, &server.origin());
    for path in ["relative", "/a?b=1", "/a#f", "/a/../b", "/a b"] {
        let err = c
            .post_json(path, AUTH, b"{}", JsonCaps::default())
            .unwrap_err();
        assert!(
            matches!(err, TransportError::InvalidPath { .. }),
            "{path}: {err:?}"
        );
    }
    let err = c
        .post_json(
            PATH,
            "Worker x\r\nx-injected: 1",
            b"{}",
            JsonCaps::default(),
        )
        .unwrap_err();
    assert!(
        matches!(err, TransportError::InvalidAuthorization { .. }),
        "{err:?}"
    );
    assert_eq!(server.connections_accepted(), 0);
}

#[test]
fn https_proxy_env_is_ignored_by_the_agent_config() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    let s = client(&p.pki, &server.origin()).settings();
    assert!(!s.proxy_configured);
    assert!(s.https_only);
    assert!(!s.http_status_as_error);
    assert!(s.tls13_only);
}

#[test]
fn https_proxy_env_set_to_a_bogus_proxy_is_ignored_in_a_child_process() {
    let exe = std::env::current_exe().unwrap();
    let output = std::process::Command::new(exe)
        .args([
            "--exact",
            "child_with_bogus_proxy_env_posts_directly",
            "--ignored",
            "--test-threads=1",
        ])
        .env("HTTPS_PROXY", "http://127.0.0.1:9")
        .env("https_proxy", "http://127.0.0.1:9")
        .env("ALL_PROXY", "http://127.0.0.1:9")
        .env("all_proxy", "http://127.0.0.1:9")
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("1 passed"), "the child test ran:\n{stdout}");
}

#[test]
#[ignore = "run by https_proxy_env_set_to_a_bogus_proxy_is_ignored_in_a_child_process"]
fn child_with_bogus_proxy_env_posts_directly() {
    assert_eq!(
        std::env::var("HTTPS_PROXY").as_deref(),
        Ok("http://127.0.0.1:9"),
        "run only from the parent test"
    );
    // Control: ureq's default configuration does pick the variable up.
    assert!(ureq::config::Config::builder().build().proxy().is_some());
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    let c = client(&p.pki, &server.origin());
    assert!(!c.settings().proxy_configured);
    post(&c, b"{}").expect("direct connection despite HTTPS_PROXY");
    assert_eq!(server.records().len(), 1);
}

// ------------------------------------------------------------------------------------------
// Artifact streaming.
// ------------------------------------------------------------------------------------------

fn artifact_server(p: &TestPki) -> HttpsServer {
    start(p, ServerOptions::default(), Arc::new(ArtifactSinkHandler))
}

const ARTIFACT_HEADER: &[u8] =
    br#"{"schema":"qinglong/remote-worker-artifact-upload@v1","byteLength":0}"#;

#[test]
fn artifact_stream_sends_exact_framed_bytes_not_chunked_and_sha256_matches() {
    let p = pki();
    let server = artifact_server(&p.pki);
    let c = client(&p.pki, &server.origin());
    let content = pattern(1024 * 1024 + 123, 7);
    let mut reader: &[u8] = &content;

    let (response, report) = c
        .post_artifact(
            ARTIFACT_PATH,
            AUTH,
            ARTIFACT_HEADER,
            &mut reader,
            content.len() as u64,
            4096,
        )
        .expect("upload");

    let content_sha = Sha256::digest(&content);
    assert_eq!(report.bytes_sent, content.len() as u64);
    assert_eq!(report.sha256.as_slice(), content_sha.as_slice());
    let response = String::from_utf8(response).unwrap();
    assert!(
        response.contains(&format!("\"sha256\":\"{}\"", report.sha256_hex())),
        "server and client digests agree: {response}"
    );
    assert!(response.contains(&format!("\"byteLength\":{}", content.len())));

    let mut framed = (ARTIFACT_HEADER.len() as u32).to_be_bytes().to_vec();
    framed.extend_from_slice(ARTIFACT_HEADER);
    framed.extend_from_slice(&content);
    let r = &server.records()[0];
    assert_eq!(
        r.header("content-type"),
        Some("application/vnd.qinglong.worker-artifact")
    );
    assert_eq!(
        r.header("content-length"),
        Some(framed.len().to_string().as_str())
    );
    assert_eq!(r.header("transfer-encoding"), None, "not chunked");
    assert_eq!(r.header("authorization"), Some(AUTH));
    assert_eq!(r.header("accept"), Some("application/json"));
    assert_eq!(r.content_length, framed.len() as u64);
    assert_eq!(r.body_len, framed.len() as u64);
    assert!(r.body_complete);
    assert_eq!(
        hex(&r.body_sha256),
        hex(&Sha256::digest(&framed)),
        "exact framed bytes"
    );
    assert_eq!(r.body[..r.body.len()], framed[..r.body.len()]);
    assert_eq!(r.tls.version, Some(rustls::ProtocolVersion::TLSv1_3));
}

/// A reader that hands out at most `step` bytes per call, to exercise partial reads.
struct Trickle<'a> {
    data: &'a [u8],
    step: usize,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = buf.len().min(self.step).min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

#[test]
fn artifact_stream_of_empty_and_trickled_content_is_exact() {
    let p = pki();
    let server = artifact_server(&p.pki);
    let c = client(&p.pki, &server.origin());
    let mut empty: &[u8] = b"";
    let (_, report) = c
        .post_artifact(ARTIFACT_PATH, AUTH, ARTIFACT_HEADER, &mut empty, 0, 4096)
        .expect("empty artifact");
    assert_eq!(report.bytes_sent, 0);
    assert_eq!(report.sha256.as_slice(), Sha256::digest(b"").as_slice());

    let content = pattern(200_003, 9);
    let mut trickle = Trickle {
        data: &content,
        step: 777,
    };
    let (_, report) = c
        .post_artifact(
            ARTIFACT_PATH,
            AUTH,
            ARTIFACT_HEADER,
            &mut trickle,
            content.len() as u64,
            4096,
        )
        .expect("trickled artifact");
    assert_eq!(
        report.sha256.as_slice(),
        Sha256::digest(&content).as_slice()
    );
    let records = server.records();
    assert_eq!(records.len(), 2);
    assert!(records.iter().all(|r| r.body_complete));
}

#[test]
fn artifact_short_reader_is_rejected_and_the_server_never_gets_a_complete_body() {
    let p = pki();
    let server = artifact_server(&p.pki);
    let c = client(&p.pki, &server.origin());
    let content = pattern(100_000, 3);
    let mut reader: &[u8] = &content;
    let err = c
        .post_artifact(
            ARTIFACT_PATH,
            AUTH,
            ARTIFACT_HEADER,
            &mut reader,
            100_001,
            4096,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            TransportError::ArtifactShort {
                declared: 100_001,
                read: 100_000
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.blame(), Blame::Local);
    let records = wait_records(&server, 1);
    assert!(records.iter().all(|r| !r.body_complete), "{records:?}");
}

#[test]
fn artifact_overlong_reader_is_rejected_and_the_server_never_gets_a_complete_body() {
    let p = pki();
    let server = artifact_server(&p.pki);
    let c = client(&p.pki, &server.origin());
    let content = pattern(100_000, 4);
    let mut reader: &[u8] = &content;
    let err = c
        .post_artifact(
            ARTIFACT_PATH,
            AUTH,
            ARTIFACT_HEADER,
            &mut reader,
            99_999,
            4096,
        )
        .unwrap_err();
    assert!(
        matches!(err, TransportError::ArtifactOverlong { declared: 99_999 }),
        "{err:?}"
    );
    let records = wait_records(&server, 1);
    assert!(records.iter().all(|r| !r.body_complete), "{records:?}");
}

#[test]
fn artifact_header_and_size_limits_are_local_errors() {
    let p = pki();
    let server = artifact_server(&p.pki);
    let c = client(&p.pki, &server.origin());
    let mut empty: &[u8] = b"";
    let err = c
        .post_artifact(ARTIFACT_PATH, AUTH, b"{", &mut empty, 0, 4096)
        .unwrap_err();
    assert!(
        matches!(err, TransportError::ArtifactHeaderLength { len: 1, .. }),
        "{err:?}"
    );
    let big_header = vec![b' '; 4097];
    let err = c
        .post_artifact(ARTIFACT_PATH, AUTH, &big_header, &mut empty, 0, 4096)
        .unwrap_err();
    assert!(
        matches!(err, TransportError::ArtifactHeaderLength { len: 4097, .. }),
        "{err:?}"
    );
    let err = c
        .post_artifact(
            ARTIFACT_PATH,
            AUTH,
            b"{}",
            &mut empty,
            64 * 1024 * 1024 + 1,
            4096,
        )
        .unwrap_err();
    assert!(
        matches!(err, TransportError::ArtifactTooLarge { .. }),
        "{err:?}"
    );
    let err = c
        .post_artifact(ARTIFACT_PATH, AUTH, b"{}", &mut empty, 0, 256 * 1024 + 1)
        .unwrap_err();
    assert!(matches!(err, TransportError::Config(_)), "{err:?}");
    assert_eq!(server.connections_accepted(), 0);
}

// ------------------------------------------------------------------------------------------
// Material, reload and redaction.
// ------------------------------------------------------------------------------------------

fn copy_into(dir: &Path, name: &str, from: &Path) -> PathBuf {
    let to = dir.join(name);
    std::fs::copy(from, &to).unwrap();
    to
}

#[test]
fn material_reload_rebuilds_the_agent_only_when_the_fingerprint_changes() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    let dir = tempfile::tempdir().unwrap();
    let material_paths = TlsMaterialPaths {
        cert_chain: copy_into(dir.path(), "chain.pem", &p.pki.client.cert),
        private_key: copy_into(dir.path(), "key.pem", &p.pki.client.key),
        trust_anchors: vec![copy_into(dir.path(), "anchors.pem", &p.pki.ca.cert)],
    };
    let material = TlsMaterial::load(&material_paths).unwrap();
    let first = material.fingerprint();
    let mut c = HttpsClient::new(
        Origin::parse(&server.origin()).unwrap(),
        material,
        RequestTimeout::default(),
    )
    .unwrap();
    post(&c, b"{}").unwrap();

    assert!(!c.reload_material().unwrap(), "same files: agent kept");
    post(&c, b"{}").unwrap();

    // Add the unrelated CA to the anchors: still valid, new fingerprint.
    let mut anchors = std::fs::read(&p.pki.ca.cert).unwrap();
    anchors.extend(std::fs::read(&p.pki.other_ca.cert).unwrap());
    std::fs::write(&material_paths.trust_anchors[0], anchors).unwrap();
    assert!(c.reload_material().unwrap(), "changed files: agent rebuilt");
    assert_ne!(c.material_fingerprint(), first);
    post(&c, b"{}").unwrap();

    let records = server.records();
    assert_eq!(records.len(), 3);
    assert_eq!(records[0].connection_id, records[1].connection_id);
    assert_ne!(
        records[1].connection_id, records[2].connection_id,
        "new pool after rotation"
    );

    // A broken reload keeps the working material.
    std::fs::write(&material_paths.private_key, b"not a key").unwrap();
    assert!(matches!(
        c.reload_material(),
        Err(TransportError::Material(MaterialError::NoPrivateKey))
    ));
    post(&c, b"{}").expect("old material still in use");
}

#[test]
fn material_errors_are_typed_and_never_panic() {
    let p = pki();
    let pk = &p.pki;
    let dir = tempfile::tempdir().unwrap();
    let load = |chain: &Path, key: &Path, anchors: &[&Path]| {
        TlsMaterial::load(&TlsMaterialPaths {
            cert_chain: chain.to_path_buf(),
            private_key: key.to_path_buf(),
            trust_anchors: anchors.iter().map(|a| a.to_path_buf()).collect(),
        })
    };

    // Certificate and key that do not belong together: refused, not a ureq panic.
    let err = load(&pk.client.cert, &pk.server.key, &[&pk.ca.cert]).unwrap_err();
    assert!(
        matches!(err, MaterialError::ClientCertificateRejected { .. }),
        "{err:?}"
    );

    // A CA that is not a parsable certificate is an error, never silently dropped.
    let bad_ca = dir.path().join("bad-ca.pem");
    std::fs::write(
        &bad_ca,
        "-----BEGIN CERTIFICATE-----\nAAAAAAAAAAAAAAAA\n-----END CERTIFICATE-----\n",
    )
    .unwrap();
    let err = load(&pk.client.cert, &pk.client.key, &[&bad_ca]).unwrap_err();
    assert!(
        matches!(err, MaterialError::TrustAnchorRejected { index: 0, .. }),
        "{err:?}"
    );

    // Anchor count 1..=8.
    let nine: Vec<&Path> = std::iter::repeat_n(pk.ca.cert.as_path(), 9).collect();
    let err = load(&pk.client.cert, &pk.client.key, &nine).unwrap_err();
    assert!(
        matches!(err, MaterialError::TrustAnchorCount { count: 9, max: 8 }),
        "{err:?}"
    );
    let err = load(&pk.client.cert, &pk.client.key, &[]).unwrap_err();
    assert_eq!(err, MaterialError::NoTrustAnchorFiles);
    let eight: Vec<&Path> = std::iter::repeat_n(pk.ca.cert.as_path(), 8).collect();
    assert!(load(&pk.client.cert, &pk.client.key, &eight).is_ok());

    // Files above 1 MiB (a key file is private: 0600).
    let private = |path: &Path| {
        std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
    };
    let big = dir.path().join("big.pem");
    std::fs::write(&big, vec![b'\n'; 1024 * 1024 + 1]).unwrap();
    private(&big);
    let err = load(&pk.client.cert, &big, &[&pk.ca.cert]).unwrap_err();
    assert!(matches!(err, MaterialError::TooLarge { .. }), "{err:?}");

    // Two keys in one file.
    let two_keys = dir.path().join("two-keys.pem");
    let mut both = std::fs::read(&pk.client.key).unwrap();
    both.extend(std::fs::read(&pk.server.key).unwrap());
    std::fs::write(&two_keys, both).unwrap();
    private(&two_keys);
    let err = load(&pk.client.cert, &two_keys, &[&pk.ca.cert]).unwrap_err();
    assert_eq!(err, MaterialError::MultiplePrivateKeys);

    // A key file others can read, a certificate file others can write.
    std::fs::set_permissions(
        &two_keys,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();
    let err = load(&pk.client.cert, &two_keys, &[&pk.ca.cert]).unwrap_err();
    assert!(
        matches!(
            err,
            MaterialError::Unsafe {
                file: MaterialFile::PrivateKey,
                ..
            }
        ),
        "{err:?}"
    );
    let writable_ca = dir.path().join("writable-ca.pem");
    std::fs::copy(&pk.ca.cert, &writable_ca).unwrap();
    std::fs::set_permissions(
        &writable_ca,
        std::os::unix::fs::PermissionsExt::from_mode(0o666),
    )
    .unwrap();
    let err = load(&pk.client.cert, &pk.client.key, &[&writable_ca]).unwrap_err();
    assert!(
        matches!(
            err,
            MaterialError::Unsafe {
                file: MaterialFile::TrustAnchors(0),
                ..
            }
        ),
        "{err:?}"
    );

    // A key where certificates belong (named, never echoed), a missing file, a directory.
    let err = load(&pk.client.key, &pk.client.key, &[&pk.ca.cert]).unwrap_err();
    assert!(
        matches!(
            err,
            MaterialError::WrongSection {
                file: MaterialFile::CertChain,
                ..
            }
        ),
        "{err:?}"
    );
    let err = load(
        &dir.path().join("missing.pem"),
        &pk.client.key,
        &[&pk.ca.cert],
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            MaterialError::Read {
                kind: io::ErrorKind::NotFound,
                ..
            }
        ),
        "{err:?}"
    );
    let err = load(dir.path(), &pk.client.key, &[&pk.ca.cert]).unwrap_err();
    assert!(
        matches!(err, MaterialError::NotRegularFile { .. }),
        "{err:?}"
    );
    assert_eq!(
        load(&pk.client.cert, &pk.client.key, &[&pk.ca.cert])
            .unwrap()
            .trust_anchor_count(),
        1
    );
}

#[test]
fn credential_private_key_and_body_never_appear_in_debug_or_display() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    let c = client(&p.pki, &server.origin());
    let key_pem = std::fs::read_to_string(&p.pki.client.key).unwrap();
    // Every base64 line of the key PEM (the DER is all in there).
    let key_lines: Vec<&str> = key_pem
        .lines()
        .filter(|l| !l.starts_with("-----"))
        .collect();
    assert!(!key_lines.is_empty());
    let body_marker = "BODY-MARKER-5f1c";
    let body = format!("{{\"m\":\"{body_marker}\"}}");

    let mut outputs = vec![format!("{c:?}")];
    outputs.push(format!(
        "{:?}",
        TlsMaterial::load(&paths(&p.pki.client, &[&p.pki.ca.cert])).unwrap()
    ));
    let mut errors = Vec::new();
    server.inject(Fault::Status {
        status: 409,
        code: Some("worker_offer_fenced".into()),
    });
    errors.push(post(&c, body.as_bytes()).unwrap_err());
    server.inject(Fault::garbage());
    errors.push(post(&c, body.as_bytes()).unwrap_err());
    server.inject(Fault::DropAfterBody);
    errors.push(post(&c, body.as_bytes()).unwrap_err());
    errors.push(
        c.post_json(PATH, AUTH, body.repeat(200).as_bytes(), JsonCaps::default())
            .unwrap_err(),
    );
    errors.push(
        c.post_json(
            PATH,
            &format!("{AUTH}\n"),
            body.as_bytes(),
            JsonCaps::default(),
        )
        .unwrap_err(),
    );
    let mut short: &[u8] = body.as_bytes();
    errors.push(
        c.post_artifact(ARTIFACT_PATH, AUTH, b"{}", &mut short, 10_000, 4096)
            .unwrap_err(),
    );
    let bad = client_with(
        &server.origin(),
        &p.pki.client,
        &[&p.pki.other_ca.cert],
        5_000,
    );
    errors.push(post(&bad, body.as_bytes()).unwrap_err());
    errors.push(TransportError::from(
        TlsMaterial::load(&paths(
            &CertKeyFiles {
                cert: p.pki.client.cert.clone(),
                key: p.pki.server.key.clone(),
            },
            &[&p.pki.ca.cert],
        ))
        .unwrap_err(),
    ));
    for e in &errors {
        outputs.push(format!("{e:?}"));
        outputs.push(format!("{e}"));
    }
    for out in &outputs {
        assert!(!out.contains(AUTH_SECRET), "credential leaked: {out}");
        assert!(!out.contains(body_marker), "body leaked: {out}");
        for line in &key_lines {
            assert!(!out.contains(line), "key material leaked: {out}");
        }
    }
}

// ------------------------------------------------------------------------------------------
// The reference server's own transport rules and lifecycle.
// ------------------------------------------------------------------------------------------

#[test]
fn https_server_refuses_chunked_and_missing_content_length_with_code_bodies() {
    let p = pki();
    let server = start(&p.pki, ServerOptions::default(), Arc::new(EchoHandler));
    let chunked =
        b"POST /x HTTP/1.1\r\nhost: t\r\ntransfer-encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n";
    let missing = b"POST /x HTTP/1.1\r\nhost: t\r\n\r\n";
    let gzip =
        b"POST /x HTTP/1.1\r\nhost: t\r\ncontent-length: 2\r\ncontent-encoding: gzip\r\n\r\n{}";
    for (request, status, code) in [
        (&chunked[..], "400", "invalid_content_length"),
        (&missing[..], "400", "invalid_content_length"),
        (&gzip[..], "415", "unsupported_content_encoding"),
    ] {
        let response = raw_exchange(&p.pki, &server, true, request).expect("response");
        let text = String::from_utf8_lossy(&response);
        assert!(text.starts_with(&format!("HTTP/1.1 {status} ")), "{text}");
        assert!(text.contains("content-type: application/json; charset=utf-8\r\n"));
        assert!(text.contains("cache-control: no-store\r\n"));
        assert!(text.contains("x-content-type-options: nosniff\r\n"));
        assert!(
            text.ends_with(&format!("{{\"code\":\"{code}\"}}")),
            "{text}"
        );
    }
    assert!(server.records().is_empty(), "refused before the handler");
}

#[test]
fn https_server_stops_by_itself_when_dropped_even_with_an_idle_keep_alive_connection() {
    let p = pki();
    let server = start(
        &p.pki,
        ServerOptions {
            read_timeout: Duration::from_secs(60),
            ..ServerOptions::default()
        },
        Arc::new(EchoHandler),
    );
    let addr = server.addr();
    let c = client(&p.pki, &server.origin());
    post(&c, b"{}").unwrap();
    // The client's pool now holds an idle connection the server is blocked reading.
    let started = Instant::now();
    drop(server);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "stopped in {:?}",
        started.elapsed()
    );
    assert!(
        TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_err(),
        "listener closed"
    );
    assert!(post(&c, b"{}").is_err());
}
