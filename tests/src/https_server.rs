//! The transport half of the loopback reference control plane: a small blocking HTTPS/1.1
//! server for tests and benchmarks.
//!
//! - Listens on a loopback address only (ephemeral port by default).
//! - TLS via rustls: TLS 1.3 only with a **required** client certificate by default; test
//!   modes for a TLS 1.2-only server, a plaintext server, and optional or no client auth.
//! - HTTP/1.1 parsed with `httparse`: bounded head, `content-length` required, no chunked
//!   bodies, keep-alive with several requests per connection, read and write timeouts on
//!   every socket.
//! - The request body reaches the [`Handler`] as a bounded [`Read`], so a 64 MiB artifact
//!   streams through without being buffered.
//! - Faults are injected per request ([`HttpsServer::inject`]) and every request is recorded
//!   ([`HttpsServer::records`]).
//! - Dropping the server stops it: shutdown flag, live sockets shut down, accept loop woken,
//!   threads joined with a bounded wait.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ProtocolVersion, RootCertStore, ServerConfig, ServerConnection, StreamOwned};
use sha2::{Digest, Sha256};

/// Largest request body accepted by default: the artifact stream cap, 64 MiB + 4 KiB + 4.
pub const BODY_MAX_BYTES_DEFAULT: u64 = 64 * 1024 * 1024 + 4 * 1024 + 4;

/// Longest time [`Drop`] waits for the server's threads.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(10);

/// Granularity of interruptible sleeps (slow-response faults, shutdown polling).
const SLEEP_STEP: Duration = Duration::from_millis(10);

/// How the server speaks on the socket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServerMode {
    /// TLS 1.3 only (production shape).
    Tls13,
    /// TLS 1.2 only: a server the Worker must refuse.
    Tls12Only,
    /// No TLS at all: plain HTTP/1.1 on the socket.
    Plaintext,
}

/// Whether the server asks for a client certificate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClientAuth {
    /// A client certificate issued by a configured client CA is required (production).
    Required,
    /// A certificate is requested and verified if sent, but a client may send none.
    Optional,
    /// No certificate is requested.
    Off,
}

/// Server options. `Default` is the production shape on `127.0.0.1:0`.
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// Loopback address to bind (port 0 for an ephemeral port).
    pub bind: SocketAddr,
    /// Wire mode.
    pub mode: ServerMode,
    /// Client-certificate policy (ignored in plaintext mode).
    pub client_auth: ClientAuth,
    /// Connection worker threads (each serves one connection at a time).
    pub workers: usize,
    /// Read timeout on every socket (also the keep-alive idle timeout).
    pub read_timeout: Duration,
    /// Write timeout on every socket.
    pub write_timeout: Duration,
    /// Largest request head (request line + headers).
    pub max_head_bytes: usize,
    /// Most request headers.
    pub max_headers: usize,
    /// Largest request body.
    pub max_body_bytes: u64,
    /// Requests served on one connection before it is closed.
    pub max_requests_per_connection: usize,
    /// Body bytes kept in each [`RequestRecord`] (the rest is only counted and hashed).
    pub recorded_body_max_bytes: usize,
}

impl Default for ServerOptions {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            mode: ServerMode::Tls13,
            client_auth: ClientAuth::Required,
            // A Worker keeps one connection per call thread (`max_concurrent_runs + 2`), and a
            // connection holds its server thread while it streams or idles (up to
            // `read_timeout`): as many threads as the node profile's connections and more.
            workers: 32,
            read_timeout: Duration::from_secs(5),
            write_timeout: Duration::from_secs(5),
            max_head_bytes: 16 * 1024,
            max_headers: 64,
            max_body_bytes: BODY_MAX_BYTES_DEFAULT,
            max_requests_per_connection: 100,
            recorded_body_max_bytes: 64 * 1024,
        }
    }
}

/// Server certificate chain, key and the client CAs it trusts.
pub struct ServerTls {
    cert_chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    client_cas: Vec<CertificateDer<'static>>,
}

impl fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert_chain", &self.cert_chain.len())
            .field("client_cas", &self.client_cas.len())
            .finish_non_exhaustive()
    }
}

impl ServerTls {
    /// Loads PEM files: the server chain, its key, and the client CA certificates.
    pub fn from_pem_files(cert: &Path, key: &Path, client_cas: &[&Path]) -> io::Result<Self> {
        let pem_err = |e: rustls::pki_types::pem::Error| io::Error::other(e.to_string());
        let cert_chain = CertificateDer::pem_file_iter(cert)
            .map_err(pem_err)?
            .collect::<Result<Vec<_>, _>>()
            .map_err(pem_err)?;
        let key = PrivateKeyDer::from_pem_file(key).map_err(pem_err)?;
        let mut cas = Vec::new();
        for path in client_cas {
            for ca in CertificateDer::pem_file_iter(path).map_err(pem_err)? {
                cas.push(ca.map_err(pem_err)?);
            }
        }
        Ok(Self {
            cert_chain,
            key,
            client_cas: cas,
        })
    }

    fn config(&self, mode: ServerMode, auth: ClientAuth) -> io::Result<Arc<ServerConfig>> {
        let tls_err = |e: rustls::Error| io::Error::other(e.to_string());
        let mut provider = rustls::crypto::ring::default_provider();
        let version = match mode {
            ServerMode::Tls12Only => {
                provider
                    .cipher_suites
                    .retain(|s| matches!(s, rustls::SupportedCipherSuite::Tls12(_)));
                &rustls::version::TLS12
            }
            ServerMode::Tls13 | ServerMode::Plaintext => {
                provider
                    .cipher_suites
                    .retain(|s| matches!(s, rustls::SupportedCipherSuite::Tls13(_)));
                &rustls::version::TLS13
            }
        };
        let provider = Arc::new(provider);
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[version])
            .map_err(tls_err)?;
        let builder = match auth {
            ClientAuth::Off => builder.with_no_client_auth(),
            ClientAuth::Required | ClientAuth::Optional => {
                let mut roots = RootCertStore::empty();
                for ca in &self.client_cas {
                    roots.add(ca.clone()).map_err(tls_err)?;
                }
                let verifier =
                    WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider);
                let verifier = match auth {
                    ClientAuth::Optional => verifier.allow_unauthenticated(),
                    ClientAuth::Required | ClientAuth::Off => verifier,
                };
                let verifier = verifier
                    .build()
                    .map_err(|e| io::Error::other(e.to_string()))?;
                builder.with_client_cert_verifier(verifier)
            }
        };
        let config = builder
            .with_single_cert(self.cert_chain.clone(), self.key.clone_key())
            .map_err(tls_err)?;
        Ok(Arc::new(config))
    }
}

/// A fault applied to one request instead of (or on top of) the handler's response.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Close the connection right after reading the request head: no body read, handler not
    /// called, no response.
    DropBeforeBody,
    /// Let the handler run and consume the body (the request is committed), then close
    /// without a response.
    DropAfterBody,
    /// Sleep this long before writing the handler's response.
    Delay(Duration),
    /// Write these raw bytes instead of an HTTP response, then close. With
    /// [`Fault::garbage`] they are not HTTP at all; a hand-written response can test framing
    /// the server would never produce (no `content-length`, a 1-byte body, ...).
    RawBytes(Vec<u8>),
    /// Answer with this status and, if given, a `{"code":"…"}` error body.
    Status {
        /// HTTP status.
        status: u16,
        /// Error code for the body.
        code: Option<String>,
    },
    /// Answer with a redirect to `location`.
    Redirect {
        /// 301, 302, 303, 307 or 308.
        status: u16,
        /// The `location` header.
        location: String,
    },
    /// Answer 200 with the handler's body but this `content-type`.
    ContentType(String),
    /// Answer 200 with the handler's body and this `content-encoding`.
    ContentEncoding(String),
    /// Answer 200 `application/json` with a valid JSON body of exactly this many bytes
    /// (at least 12).
    OversizeBody(usize),
    /// Answer 200 `application/json` declaring this `content-length`, send a short body,
    /// then close.
    DeclaredLength(u64),
}

impl Fault {
    /// Bytes that are not an HTTP response.
    pub fn garbage() -> Self {
        Self::RawBytes(b"\x00\x01garbage \xff\xfe not http\r\n\r\n".to_vec())
    }
}

/// TLS facts about the connection a request came in on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsInfo {
    /// Negotiated protocol version (`None` in plaintext mode).
    pub version: Option<ProtocolVersion>,
    /// Whether the client presented a (verified) certificate.
    pub client_cert_presented: bool,
    /// SHA-256 of the client's end-entity certificate (DER), when it presented one.
    pub client_cert_sha256: Option<[u8; 32]>,
    /// The SNI host name the client sent, if any.
    pub sni: Option<String>,
}

/// One request as seen by a [`Handler`].
pub struct Request<'a> {
    /// Server-wide connection number, from 1.
    pub connection_id: u64,
    /// Request number on this connection, from 1.
    pub sequence: u64,
    /// TLS facts.
    pub tls: TlsInfo,
    /// Method, as sent.
    pub method: String,
    /// Request target, as sent (path and any query).
    pub path: String,
    /// Headers in order, names lowercased.
    pub headers: Vec<(String, String)>,
    /// The declared body length.
    pub content_length: u64,
    body: &'a mut (dyn Read + 'a),
}

impl fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("connection_id", &self.connection_id)
            .field("sequence", &self.sequence)
            .field("method", &self.method)
            .field("path", &self.path)
            .field("content_length", &self.content_length)
            .finish_non_exhaustive()
    }
}

impl Request<'_> {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Reads the whole body if it is at most `max` bytes.
    pub fn read_body(&mut self, max: usize) -> io::Result<Vec<u8>> {
        if self.content_length > max as u64 {
            return Err(io::Error::other("request body above the handler's cap"));
        }
        let mut body = Vec::with_capacity(self.content_length as usize);
        self.body.read_to_end(&mut body)?;
        Ok(body)
    }
}

impl Read for Request<'_> {
    /// Reads the body; ends after exactly `content_length` bytes.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.body.read(buf)
    }
}

/// A response to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// HTTP status.
    pub status: u16,
    /// Headers (the server adds `content-length`, `connection` and `x-request-id`).
    pub headers: Vec<(String, String)>,
    /// Body.
    pub body: Vec<u8>,
}

impl Response {
    /// 200 with a JSON body.
    pub fn json(body: impl Into<Vec<u8>>) -> Self {
        Self::with_json_headers(200, body.into())
    }

    /// An error `{"code":"…"}` with `cache-control: no-store`,
    /// `content-type: application/json; charset=utf-8`, `x-content-type-options: nosniff`.
    pub fn error(status: u16, code: &str) -> Self {
        debug_assert!(code.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'));
        Self::with_json_headers(status, format!("{{\"code\":\"{code}\"}}").into_bytes())
    }

    /// Adds a header.
    pub fn with_header(mut self, name: &str, value: &str) -> Self {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    fn with_json_headers(status: u16, body: Vec<u8>) -> Self {
        Self {
            status,
            headers: vec![
                (
                    "content-type".into(),
                    "application/json; charset=utf-8".into(),
                ),
                ("cache-control".into(), "no-store".into()),
                ("x-content-type-options".into(), "nosniff".into()),
            ],
            body,
        }
    }

    fn set_header(&mut self, name: &str, value: &str) {
        self.headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        self.headers.push((name.to_owned(), value.to_owned()));
    }
}

/// Control-plane semantics plugged into the transport.
pub trait Handler: Send + Sync + 'static {
    /// Answers one request. The body may be read partly or not at all; the server drains
    /// what is left (within the declared length) before the next request.
    fn handle(&self, req: &mut Request<'_>) -> Response;
}

/// What the server saw for one request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RequestRecord {
    /// Server-wide connection number.
    pub connection_id: u64,
    /// Request number on that connection.
    pub sequence: u64,
    /// TLS facts.
    pub tls: TlsInfo,
    /// Method.
    pub method: String,
    /// Request target.
    pub path: String,
    /// Headers in order, names lowercased.
    pub headers: Vec<(String, String)>,
    /// Declared `content-length`.
    pub content_length: u64,
    /// Body bytes received.
    pub body_len: u64,
    /// SHA-256 of the body bytes received.
    pub body_sha256: [u8; 32],
    /// Whether exactly `content_length` bytes arrived.
    pub body_complete: bool,
    /// The first [`ServerOptions::recorded_body_max_bytes`] body bytes.
    pub body: Vec<u8>,
    /// The fault applied, if any.
    pub fault: Option<Fault>,
    /// The status written, if a response was written.
    pub response_status: Option<u16>,
}

impl RequestRecord {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// Which request a queued fault is for.
enum Target {
    /// The next request, whatever its path.
    Any,
    /// The next request to exactly this path.
    Path(String),
    /// The next request whose path ends with this text.
    Suffix(String),
}

impl Target {
    fn matches(&self, path: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Path(p) => p == path,
            Self::Suffix(s) => path.ends_with(s.as_str()),
        }
    }
}

struct FaultRule {
    target: Target,
    fault: Fault,
}

struct Shared {
    options: ServerOptions,
    tls: Option<Arc<ServerConfig>>,
    handler: Arc<dyn Handler>,
    shutdown: AtomicBool,
    next_connection: AtomicU64,
    next_request_id: AtomicU64,
    faults: Mutex<VecDeque<FaultRule>>,
    records: Mutex<Vec<RequestRecord>>,
    handshake_failures: Mutex<Vec<String>>,
    live: Mutex<BTreeMap<u64, TcpStream>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A running loopback server. Dropping it stops it.
pub struct HttpsServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
    workers: Vec<JoinHandle<()>>,
}

impl fmt::Debug for HttpsServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpsServer")
            .field("addr", &self.addr)
            .field("mode", &self.shared.options.mode)
            .field("client_auth", &self.shared.options.client_auth)
            .finish_non_exhaustive()
    }
}

impl HttpsServer {
    /// Binds, spawns the accept loop and the workers, and returns at once.
    pub fn start(
        options: ServerOptions,
        tls: &ServerTls,
        handler: Arc<dyn Handler>,
    ) -> io::Result<Self> {
        if !options.bind.ip().is_loopback() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the test server binds loopback addresses only",
            ));
        }
        let workers = options.workers.clamp(1, 64);
        let tls_config = match options.mode {
            ServerMode::Plaintext => None,
            ServerMode::Tls13 | ServerMode::Tls12Only => {
                Some(tls.config(options.mode, options.client_auth)?)
            }
        };
        let listener = TcpListener::bind(options.bind)?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            options,
            tls: tls_config,
            handler,
            shutdown: AtomicBool::new(false),
            next_connection: AtomicU64::new(1),
            next_request_id: AtomicU64::new(1),
            faults: Mutex::new(VecDeque::new()),
            records: Mutex::new(Vec::new()),
            handshake_failures: Mutex::new(Vec::new()),
            live: Mutex::new(BTreeMap::new()),
        });
        let (tx, rx) = sync_channel::<(u64, TcpStream)>(workers * 2);
        let rx = Arc::new(Mutex::new(rx));
        let mut handles = Vec::with_capacity(workers);
        for i in 0..workers {
            let shared = shared.clone();
            let rx = rx.clone();
            handles.push(
                std::thread::Builder::new()
                    .name(format!("https-worker-{i}"))
                    .spawn(move || worker_loop(&shared, &rx))?,
            );
        }
        let accept_shared = shared.clone();
        let accept = std::thread::Builder::new()
            .name("https-accept".into())
            .spawn(move || accept_loop(&listener, &accept_shared, &tx))?;
        Ok(Self {
            addr,
            shared,
            accept: Some(accept),
            workers: handles,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:<port>` (or the bound IP, bracketed for IPv6).
    pub fn origin(&self) -> String {
        match self.addr {
            SocketAddr::V4(a) => format!("https://{}:{}", a.ip(), a.port()),
            SocketAddr::V6(a) => format!("https://[{}]:{}", a.ip(), a.port()),
        }
    }

    /// `https://<host>:<port>` for another name of the same loopback address.
    pub fn origin_for_host(&self, host: &str) -> String {
        format!("https://{host}:{}", self.addr.port())
    }

    /// Queues a fault for the next request, whatever its path.
    pub fn inject(&self, fault: Fault) {
        lock(&self.shared.faults).push_back(FaultRule {
            target: Target::Any,
            fault,
        });
    }

    /// Queues a fault for the next request whose path is exactly `path`.
    pub fn inject_for(&self, path: &str, fault: Fault) {
        lock(&self.shared.faults).push_back(FaultRule {
            target: Target::Path(path.to_owned()),
            fault,
        });
    }

    /// Queues a fault for the next request whose path ends with `suffix` (for example
    /// `/lease-control`, whatever the Worker and Session in front of it).
    pub fn inject_for_suffix(&self, suffix: &str, fault: Fault) {
        lock(&self.shared.faults).push_back(FaultRule {
            target: Target::Suffix(suffix.to_owned()),
            fault,
        });
    }

    /// Drops every queued fault no request has taken yet: later requests are answered
    /// normally. A request whose head has already arrived keeps the fault it took.
    pub fn clear_faults(&self) {
        lock(&self.shared.faults).clear();
    }

    /// Everything recorded so far, in completion order.
    pub fn records(&self) -> Vec<RequestRecord> {
        lock(&self.shared.records).clone()
    }

    /// Handshake failures as rustls described them.
    pub fn handshake_failures(&self) -> Vec<String> {
        lock(&self.shared.handshake_failures).clone()
    }

    /// TCP connections accepted so far.
    pub fn connections_accepted(&self) -> u64 {
        self.shared.next_connection.load(Ordering::SeqCst) - 1
    }
}

impl Drop for HttpsServer {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        for stream in lock(&self.shared.live).values() {
            let _ = stream.shutdown(Shutdown::Both);
        }
        // Wake the accept loop; it sees the flag and exits, dropping the work queue.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        let deadline = Instant::now() + SHUTDOWN_WAIT;
        let handles = self.accept.take().into_iter().chain(self.workers.drain(..));
        for handle in handles {
            while !handle.is_finished() && Instant::now() < deadline {
                std::thread::sleep(SLEEP_STEP);
            }
            if handle.is_finished() {
                let _ = handle.join();
            } else {
                eprintln!("https test server: a thread did not stop within {SHUTDOWN_WAIT:?}");
            }
        }
    }
}

fn accept_loop(listener: &TcpListener, shared: &Shared, tx: &SyncSender<(u64, TcpStream)>) {
    for stream in listener.incoming() {
        if shared.shutdown.load(Ordering::SeqCst) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let id = shared.next_connection.fetch_add(1, Ordering::SeqCst);
        if tx.send((id, stream)).is_err() {
            return;
        }
    }
}

fn worker_loop(shared: &Shared, rx: &Mutex<Receiver<(u64, TcpStream)>>) {
    loop {
        let job = lock(rx).recv();
        let Ok((id, tcp)) = job else { return };
        if let Ok(clone) = tcp.try_clone() {
            lock(&shared.live).insert(id, clone);
        }
        if !shared.shutdown.load(Ordering::SeqCst) {
            serve_connection(shared, id, tcp);
        }
        lock(&shared.live).remove(&id);
    }
}

/// The socket, with or without TLS.
enum Stream {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ServerConnection, TcpStream>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Self::Plain(s) => s.read(buf),
            Self::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Self::Plain(s) => s.write(buf),
            Self::Tls(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Self::Plain(s) => s.flush(),
            Self::Tls(s) => s.flush(),
        }
    }
}

impl Stream {
    fn close(mut self) {
        if let Self::Tls(s) = &mut self {
            s.conn.send_close_notify();
            let _ = s.flush();
        }
        let tcp = match &self {
            Self::Plain(s) => s,
            Self::Tls(s) => &s.sock,
        };
        let _ = tcp.shutdown(Shutdown::Write);
    }
}

/// A connection with its read buffer (bytes received but not yet consumed).
struct Conn {
    stream: Stream,
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl Conn {
    /// Reads the request head. `Ok(None)`: the peer closed cleanly before a new request.
    /// Bytes that cannot start an HTTP/1.1 request are refused as soon as they arrive (a
    /// TLS ClientHello sent to the plaintext server, for instance), not after a timeout.
    fn read_head(
        &mut self,
        max_bytes: usize,
        max_headers: usize,
    ) -> Result<Option<usize>, HeadError> {
        if self.buf.len() < max_bytes {
            self.buf.resize(max_bytes, 0);
        }
        loop {
            if self.start < self.end {
                let mut slots = vec![httparse::EMPTY_HEADER; max_headers];
                match httparse::Request::new(&mut slots).parse(&self.buf[self.start..self.end]) {
                    Ok(httparse::Status::Complete(n)) => return Ok(Some(n)),
                    Ok(httparse::Status::Partial) => {}
                    Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooManyHeaders),
                    Err(_) => return Err(HeadError::Malformed),
                }
            }
            if self.end - self.start >= max_bytes {
                return Err(HeadError::TooLarge);
            }
            if self.end == self.buf.len() {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            match self.stream.read(&mut self.buf[self.end..]) {
                Ok(0) if self.start == self.end => return Ok(None),
                Ok(0) => return Err(HeadError::Closed),
                Ok(n) => self.end += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return Err(HeadError::Closed),
            }
        }
    }
}

enum HeadError {
    Malformed,
    TooLarge,
    TooManyHeaders,
    Closed,
}

/// The request body as a bounded reader that counts, hashes and records what passes.
struct BodyReader<'c> {
    conn: &'c mut Conn,
    remaining: u64,
    received: u64,
    hasher: Sha256,
    recorded: Vec<u8>,
    record_max: usize,
}

impl Read for BodyReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 || buf.is_empty() {
            return Ok(0);
        }
        let want = buf
            .len()
            .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
        let n = if self.conn.start < self.conn.end {
            let n = want.min(self.conn.end - self.conn.start);
            buf[..n].copy_from_slice(&self.conn.buf[self.conn.start..self.conn.start + n]);
            self.conn.start += n;
            n
        } else {
            let n = self.conn.stream.read(&mut buf[..want])?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "request body ended before content-length",
                ));
            }
            n
        };
        self.hasher.update(&buf[..n]);
        let keep = n.min(self.record_max.saturating_sub(self.recorded.len()));
        self.recorded.extend_from_slice(&buf[..keep]);
        self.received += n as u64;
        self.remaining -= n as u64;
        Ok(n)
    }
}

impl BodyReader<'_> {
    /// Reads and discards what the handler left, so the next request starts in the right
    /// place. Returns whether the whole body arrived.
    fn drain(&mut self) -> bool {
        let mut scratch = vec![0_u8; 64 * 1024];
        while self.remaining > 0 {
            match self.read(&mut scratch) {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => return false,
            }
        }
        true
    }
}

struct Head {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    content_length: u64,
    close: bool,
}

/// Why a request head was refused at the transport level: status and error code.
struct Refusal(u16, &'static str);

fn parse_head(bytes: &[u8], options: &ServerOptions) -> Result<Head, Refusal> {
    let mut slots = vec![httparse::EMPTY_HEADER; options.max_headers];
    let mut req = httparse::Request::new(&mut slots);
    match req.parse(bytes) {
        Ok(httparse::Status::Complete(_)) => {}
        Err(httparse::Error::TooManyHeaders) => {
            return Err(Refusal(431, "request_header_fields_too_large"));
        }
        Ok(httparse::Status::Partial) | Err(_) => return Err(Refusal(400, "invalid_request")),
    }
    if req.version != Some(1) {
        return Err(Refusal(505, "http_version_not_supported"));
    }
    let method = req.method.unwrap_or_default().to_owned();
    let path = req.path.unwrap_or_default().to_owned();
    let mut headers = Vec::with_capacity(req.headers.len());
    for h in req.headers.iter() {
        let value = std::str::from_utf8(h.value).map_err(|_| Refusal(400, "invalid_request"))?;
        headers.push((h.name.to_ascii_lowercase(), value.to_owned()));
    }
    if header_values(&headers, "transfer-encoding")
        .next()
        .is_some()
    {
        return Err(Refusal(400, "invalid_content_length"));
    }
    let length = {
        let mut lengths = header_values(&headers, "content-length");
        match (lengths.next(), lengths.next()) {
            (Some(v), None) => v,
            _ => return Err(Refusal(400, "invalid_content_length")),
        }
    };
    if length.is_empty() || length.len() > 20 || !length.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Refusal(400, "invalid_content_length"));
    }
    let content_length: u64 = length
        .parse()
        .map_err(|_| Refusal(400, "invalid_content_length"))?;
    if content_length > options.max_body_bytes {
        return Err(Refusal(413, "request_too_large"));
    }
    for encoding in header_values(&headers, "content-encoding") {
        if !encoding.trim().eq_ignore_ascii_case("identity") {
            return Err(Refusal(415, "unsupported_content_encoding"));
        }
    }
    let close = header_values(&headers, "connection").any(|v| v.eq_ignore_ascii_case("close"));
    Ok(Head {
        method,
        path,
        headers,
        content_length,
        close,
    })
}

fn header_values<'a>(
    headers: &'a [(String, String)],
    name: &'static str,
) -> impl Iterator<Item = &'a String> + 'a {
    headers
        .iter()
        .filter(move |(n, _)| n == name)
        .map(|(_, v)| v)
}

fn serve_connection(shared: &Shared, connection_id: u64, tcp: TcpStream) {
    let options = &shared.options;
    if tcp.set_read_timeout(Some(options.read_timeout)).is_err()
        || tcp.set_write_timeout(Some(options.write_timeout)).is_err()
    {
        return;
    }
    let _ = tcp.set_nodelay(true);
    let (stream, tls) = match &shared.tls {
        None => (
            Stream::Plain(tcp),
            TlsInfo {
                version: None,
                client_cert_presented: false,
                client_cert_sha256: None,
                sni: None,
            },
        ),
        Some(config) => match handshake(config.clone(), tcp) {
            Ok(pair) => pair,
            Err(reason) => {
                lock(&shared.handshake_failures).push(reason);
                return;
            }
        },
    };
    let mut conn = Conn {
        stream,
        buf: Vec::new(),
        start: 0,
        end: 0,
    };
    for sequence in 1..=options.max_requests_per_connection as u64 {
        if shared.shutdown.load(Ordering::SeqCst) {
            break;
        }
        let head_len = match conn.read_head(options.max_head_bytes, options.max_headers) {
            Ok(Some(n)) => n,
            Ok(None) | Err(HeadError::Closed) => break,
            Err(HeadError::Malformed) => {
                refuse(shared, &mut conn, Refusal(400, "invalid_request"));
                break;
            }
            Err(HeadError::TooLarge | HeadError::TooManyHeaders) => {
                refuse(
                    shared,
                    &mut conn,
                    Refusal(431, "request_header_fields_too_large"),
                );
                break;
            }
        };
        let head_bytes = conn.buf[conn.start..conn.start + head_len].to_vec();
        conn.start += head_len;
        let head = match parse_head(&head_bytes, options) {
            Ok(head) => head,
            Err(refusal) => {
                refuse(shared, &mut conn, refusal);
                break;
            }
        };
        let keep_going = serve_request(shared, &mut conn, connection_id, sequence, &tls, head);
        if !keep_going {
            break;
        }
    }
    conn.stream.close();
}

fn handshake(config: Arc<ServerConfig>, mut tcp: TcpStream) -> Result<(Stream, TlsInfo), String> {
    let mut conn = ServerConnection::new(config).map_err(|e| e.to_string())?;
    while conn.is_handshaking() {
        conn.complete_io(&mut tcp).map_err(|e| {
            let reason = e
                .get_ref()
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
                .map_or_else(|| e.to_string(), |tls| tls.to_string());
            let _ = tcp.shutdown(Shutdown::Both);
            reason
        })?;
    }
    let tls = TlsInfo {
        version: conn.protocol_version(),
        client_cert_presented: conn.peer_certificates().is_some_and(|c| !c.is_empty()),
        client_cert_sha256: conn
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|leaf| Sha256::digest(leaf.as_ref()).into()),
        sni: conn.server_name().map(str::to_owned),
    };
    Ok((Stream::Tls(Box::new(StreamOwned::new(conn, tcp))), tls))
}

/// Serves one parsed request. Returns whether the connection may carry another.
fn serve_request(
    shared: &Shared,
    conn: &mut Conn,
    connection_id: u64,
    sequence: u64,
    tls: &TlsInfo,
    head: Head,
) -> bool {
    let options = &shared.options;
    let fault = take_fault(shared, &head.path);
    let mut record = RequestRecord {
        connection_id,
        sequence,
        tls: tls.clone(),
        method: head.method.clone(),
        path: head.path.clone(),
        headers: head.headers.clone(),
        content_length: head.content_length,
        body_len: 0,
        body_sha256: Sha256::digest(b"").into(),
        body_complete: head.content_length == 0,
        body: Vec::new(),
        fault: fault.clone(),
        response_status: None,
    };
    if fault == Some(Fault::DropBeforeBody) {
        lock(&shared.records).push(record);
        return false;
    }
    let mut body = BodyReader {
        conn: &mut *conn,
        remaining: head.content_length,
        received: 0,
        hasher: Sha256::new(),
        recorded: Vec::new(),
        record_max: options.recorded_body_max_bytes,
    };
    let mut request = Request {
        connection_id,
        sequence,
        tls: tls.clone(),
        method: head.method,
        path: head.path,
        headers: head.headers,
        content_length: head.content_length,
        body: &mut body,
    };
    let response = shared.handler.handle(&mut request);
    drop(request);
    let complete = body.drain();
    record.body_len = body.received;
    record.body_complete = complete;
    record.body = std::mem::take(&mut body.recorded);
    record.body_sha256 = std::mem::replace(&mut body.hasher, Sha256::new())
        .finalize()
        .into();
    drop(body);
    if !complete {
        lock(&shared.records).push(record);
        return false;
    }

    let mut close = head.close;
    let mut response = response;
    let mut raw: Option<Vec<u8>> = None;
    match fault {
        None | Some(Fault::DropBeforeBody) => {}
        Some(Fault::DropAfterBody) => {
            lock(&shared.records).push(record);
            return false;
        }
        Some(Fault::Delay(d)) => sleep_unless_shutdown(shared, d),
        Some(Fault::RawBytes(bytes)) => {
            raw = Some(bytes);
            close = true;
        }
        Some(Fault::Status { status, code }) => {
            response = match code {
                Some(code) => Response::error(status, &code),
                None => Response {
                    status,
                    headers: Vec::new(),
                    body: Vec::new(),
                },
            };
        }
        Some(Fault::Redirect { status, location }) => {
            response = Response {
                status,
                headers: vec![("location".into(), location)],
                body: Vec::new(),
            };
        }
        Some(Fault::ContentType(value)) => response.set_header("content-type", &value),
        Some(Fault::ContentEncoding(value)) => response.set_header("content-encoding", &value),
        Some(Fault::OversizeBody(len)) => response = Response::json(json_of_len(len)),
        Some(Fault::DeclaredLength(declared)) => {
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                 content-length: {declared}\r\nconnection: close\r\n\r\n{{\"short\":1}}"
            );
            raw = Some(head.into_bytes());
            close = true;
            record.response_status = Some(200);
        }
    }
    if raw.is_none() {
        record.response_status = Some(response.status);
    }
    // Recorded before the response goes out, so a client that has its response can rely on
    // the record being there.
    lock(&shared.records).push(record);
    let written = match raw {
        Some(bytes) => conn
            .stream
            .write_all(&bytes)
            .and_then(|()| conn.stream.flush()),
        None => write_response(shared, &mut conn.stream, &response, close),
    };
    written.is_ok() && !close
}

fn take_fault(shared: &Shared, path: &str) -> Option<Fault> {
    let mut faults = lock(&shared.faults);
    let index = faults.iter().position(|rule| rule.target.matches(path))?;
    faults.remove(index).map(|rule| rule.fault)
}

fn sleep_unless_shutdown(shared: &Shared, duration: Duration) {
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline && !shared.shutdown.load(Ordering::SeqCst) {
        std::thread::sleep(SLEEP_STEP.min(deadline.saturating_duration_since(Instant::now())));
    }
}

/// A valid JSON object of exactly `len` bytes (at least 12): `{"pad":"aaa…"}`.
fn json_of_len(len: usize) -> Vec<u8> {
    let fixed = br#"{"pad":""}"#.len();
    let pad = len.saturating_sub(fixed);
    let mut body = Vec::with_capacity(len.max(fixed));
    body.extend_from_slice(br#"{"pad":""#);
    body.resize(body.len() + pad, b'a');
    body.extend_from_slice(br#""}"#);
    body
}

fn refuse(shared: &Shared, conn: &mut Conn, refusal: Refusal) {
    let Refusal(status, code) = refusal;
    let _ = write_response(
        shared,
        &mut conn.stream,
        &Response::error(status, code),
        true,
    );
}

fn write_response(
    shared: &Shared,
    stream: &mut Stream,
    response: &Response,
    close: bool,
) -> io::Result<()> {
    let request_id = shared.next_request_id.fetch_add(1, Ordering::SeqCst);
    let mut out = Vec::with_capacity(256 + response.body.len());
    write!(
        out,
        "HTTP/1.1 {} {}\r\n",
        response.status,
        reason_phrase(response.status)
    )?;
    for (name, value) in &response.headers {
        write!(out, "{name}: {value}\r\n")?;
    }
    write!(
        out,
        "content-length: {}\r\nconnection: {}\r\nx-request-id: req-{request_id}\r\n\r\n",
        response.body.len(),
        if close { "close" } else { "keep-alive" }
    )?;
    out.extend_from_slice(&response.body);
    stream.write_all(&out)?;
    stream.flush()
}

fn reason_phrase(status: u16) -> &'static str {
    match status {
        200 => "OK",
        201 => "Created",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        405 => "Method Not Allowed",
        409 => "Conflict",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Status",
    }
}

/// Test handler: answers 200 with the request body itself (which should be JSON), or
/// `{"empty":true}` for an empty body. Bodies above 256 KiB get 413.
#[derive(Clone, Copy, Debug, Default)]
pub struct EchoHandler;

impl Handler for EchoHandler {
    fn handle(&self, req: &mut Request<'_>) -> Response {
        match req.read_body(256 * 1024) {
            Ok(body) if body.is_empty() => Response::json(&b"{\"empty\":true}"[..]),
            Ok(body) => Response::json(body),
            Err(_) => Response::error(413, "request_too_large"),
        }
    }
}

/// Test handler for artifact uploads: parses the frame (4-byte big-endian header length
/// `N`, 2..=4096, `N` header bytes, content) while streaming, hashes the content and stores
/// nothing. Answers `{"headerLength":N,"byteLength":L,"sha256":"<hex>"}`, or 400
/// `invalid_artifact_frame` if the frame is malformed.
#[derive(Clone, Copy, Debug, Default)]
pub struct ArtifactSinkHandler;

impl Handler for ArtifactSinkHandler {
    fn handle(&self, req: &mut Request<'_>) -> Response {
        match sink_artifact(req) {
            Ok((header_len, content_len, digest)) => Response::json(format!(
                "{{\"headerLength\":{header_len},\"byteLength\":{content_len},\"sha256\":\"{}\"}}",
                hex(&digest)
            )),
            Err(_) => Response::error(400, "invalid_artifact_frame"),
        }
    }
}

fn sink_artifact(req: &mut Request<'_>) -> io::Result<(u32, u64, [u8; 32])> {
    let mut prefix = [0_u8; 4];
    req.read_exact(&mut prefix)?;
    let header_len = u32::from_be_bytes(prefix);
    if !(2..=4096).contains(&header_len) {
        return Err(io::Error::other("artifact header length out of range"));
    }
    let mut header = vec![0_u8; header_len as usize];
    req.read_exact(&mut header)?;
    let mut hasher = Sha256::new();
    let mut content_len = 0_u64;
    let mut buf = vec![0_u8; 64 * 1024];
    loop {
        let n = req.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        content_len += n as u64;
    }
    if 4 + u64::from(header_len) + content_len != req.content_length {
        return Err(io::Error::other(
            "artifact frame shorter than content-length",
        ));
    }
    Ok((header_len, content_len, hasher.finalize().into()))
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
