//! The blocking HTTPS client: one ureq agent, TLS 1.3 only, mutual TLS, one kept-alive
//! connection, strict request and response rules (wire reference §2.1).

use std::fmt;
use std::io::Read;
use std::sync::Arc;
use std::time::Duration;

use rustls::crypto::CryptoProvider;
use ureq::config::AutoHeaderValue;
use ureq::tls::{TlsConfig, TlsProvider};

use super::artifact::{FramedBody, StreamFailure};
use super::error::{ConfigError, ERROR_CODE_MAX_CHARS, TransportError};
use super::material::{TlsMaterial, hex};
use super::origin::Origin;
use super::tls13_provider;
// The artifact stream's bounds and media type are the wire contract's (one home, in core).
use ql_worker_core::wire::artifact as wire_artifact;

/// Default JSON request body cap (wire reference §7, `MAX_REQUEST_BYTES`).
pub const JSON_REQUEST_DEFAULT_MAX_BYTES: usize = 4 * 1024;
/// Hard JSON request body cap an endpoint may opt in to (`HARD_MAX_REQUEST_BYTES`).
pub const JSON_REQUEST_HARD_MAX_BYTES: usize = 64 * 1024;
/// Ceiling of any response cap.
pub const RESPONSE_MAX_BYTES_CEILING: usize = 256 * 1024;
/// How much of a non-200 body is read to find its `{"code":"…"}`.
pub const ERROR_BODY_READ_MAX_BYTES: usize = 1024;
/// Longest request path accepted.
pub const PATH_MAX_BYTES: usize = 2048;
/// Longest authorization value accepted.
pub const AUTHORIZATION_MAX_BYTES: usize = 512;
/// Largest response header block accepted.
const RESPONSE_HEADER_MAX_BYTES: usize = 16 * 1024;
/// Slowest artifact upload rate the overall deadline allows for, in bytes per second: 4 KiB/s,
/// a 512 kbit/s uplink shared by 16 concurrent uploads (issue 16: uploads run beside each other
/// and beside the Runs' lease renewals, so a long transfer no longer costs a lease; 64 MiB may
/// take up to about 4.5 h). Idle stalls are caught sooner by the per-read and per-write
/// timeouts.
const ARTIFACT_MIN_RATE_BYTES_PER_S: u64 = 4 * 1024;

/// The request timeout: 15 s by default, 1..=60 s allowed (wire reference §7).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestTimeout(Duration);

impl RequestTimeout {
    /// Smallest allowed timeout in milliseconds.
    pub const MIN_MS: u64 = 1_000;
    /// Largest allowed timeout in milliseconds.
    pub const MAX_MS: u64 = 60_000;
    /// Default timeout in milliseconds.
    pub const DEFAULT_MS: u64 = 15_000;

    /// Validates a timeout.
    pub fn new(timeout: Duration) -> Result<Self, ConfigError> {
        if timeout < Duration::from_millis(Self::MIN_MS)
            || timeout > Duration::from_millis(Self::MAX_MS)
        {
            return Err(ConfigError::Timeout {
                got_ms: timeout.as_millis(),
                min_ms: Self::MIN_MS,
                max_ms: Self::MAX_MS,
            });
        }
        Ok(Self(timeout))
    }

    /// Validates a timeout given in milliseconds.
    pub fn from_millis(ms: u64) -> Result<Self, ConfigError> {
        Self::new(Duration::from_millis(ms))
    }

    /// The timeout.
    pub fn duration(self) -> Duration {
        self.0
    }
}

impl Default for RequestTimeout {
    fn default() -> Self {
        Self(Duration::from_millis(Self::DEFAULT_MS))
    }
}

/// Per-call body caps of a JSON POST.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct JsonCaps {
    request_max_bytes: usize,
    response_max_bytes: usize,
}

impl Default for JsonCaps {
    /// 4 KiB request, 256 KiB response.
    fn default() -> Self {
        Self {
            request_max_bytes: JSON_REQUEST_DEFAULT_MAX_BYTES,
            response_max_bytes: RESPONSE_MAX_BYTES_CEILING,
        }
    }
}

impl JsonCaps {
    /// Explicit opt-in to a larger request cap, up to the hard 64 KiB (the Secret batch
    /// endpoint needs this); the response cap stays at its default.
    pub fn with_request_cap(request_max_bytes: usize) -> Result<Self, ConfigError> {
        Self::default().request_cap(request_max_bytes)
    }

    /// Sets the request cap, 1..=64 KiB.
    pub fn request_cap(self, request_max_bytes: usize) -> Result<Self, ConfigError> {
        if request_max_bytes == 0 || request_max_bytes > JSON_REQUEST_HARD_MAX_BYTES {
            return Err(ConfigError::RequestCap {
                got: request_max_bytes,
                max: JSON_REQUEST_HARD_MAX_BYTES,
            });
        }
        Ok(Self {
            request_max_bytes,
            ..self
        })
    }

    /// Sets the response cap, 2..=256 KiB.
    pub fn response_cap(self, response_max_bytes: usize) -> Result<Self, ConfigError> {
        check_response_cap(response_max_bytes)?;
        Ok(Self {
            response_max_bytes,
            ..self
        })
    }

    /// The request cap in bytes.
    pub fn request_max_bytes(&self) -> usize {
        self.request_max_bytes
    }

    /// The response cap in bytes.
    pub fn response_max_bytes(&self) -> usize {
        self.response_max_bytes
    }
}

fn check_response_cap(cap: usize) -> Result<(), ConfigError> {
    if !(2..=RESPONSE_MAX_BYTES_CEILING).contains(&cap) {
        return Err(ConfigError::ResponseCap {
            got: cap,
            max: RESPONSE_MAX_BYTES_CEILING,
        });
    }
    Ok(())
}

/// What an artifact upload actually sent.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct StreamReport {
    /// Content bytes sent (the log bytes, excluding the 4-byte prefix and the header).
    pub bytes_sent: u64,
    /// SHA-256 of exactly those content bytes.
    pub sha256: [u8; 32],
}

impl fmt::Debug for StreamReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StreamReport")
            .field("bytes_sent", &self.bytes_sent)
            .field("sha256", &hex(&self.sha256))
            .finish()
    }
}

impl StreamReport {
    /// The digest as lowercase hex, as the control plane reports it.
    pub fn sha256_hex(&self) -> String {
        hex(&self.sha256)
    }
}

/// The agent settings that matter for security, read back from the live agent so tests
/// can check what is in force rather than what was intended.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AgentSettings {
    /// `http:` URLs are refused before any connection.
    pub https_only: bool,
    /// Redirects followed (0: a 3xx is returned as a response).
    pub max_redirects: u32,
    /// Whether ureq turns 4xx/5xx into errors (we read the status ourselves).
    pub http_status_as_error: bool,
    /// Whether a proxy is configured (from the environment or otherwise).
    pub proxy_configured: bool,
    /// Idle connections kept in the pool.
    pub max_idle_connections: usize,
    /// Idle connections kept per host.
    pub max_idle_connections_per_host: usize,
    /// Every cipher suite in the provider is a TLS 1.3 suite.
    pub tls13_only: bool,
    /// The request timeout.
    pub timeout: RequestTimeout,
}

/// The Worker's HTTPS client.
///
/// One agent with one kept-alive connection per call thread ([`HttpsClient::with_connections`]); calls are blocking. `Debug` shows the origin,
/// the timeout and the material fingerprint, never key material.
pub struct HttpsClient {
    origin: Origin,
    material: TlsMaterial,
    timeout: RequestTimeout,
    provider: Arc<CryptoProvider>,
    agent: ureq::Agent,
    /// Connections kept alive between calls (one per call thread; 1 by default).
    idle_connections: usize,
}

/// What one call needs, cheap to clone and `Send`: the origin, the timeout and the agent (a
/// handle on the client's connection pool; no key material is copied). The driver's call
/// threads each perform calls with one; a SIGHUP reload takes effect for calls made with a
/// caller taken afterwards.
#[derive(Clone)]
pub struct Caller {
    origin: Origin,
    timeout: RequestTimeout,
    agent: ureq::Agent,
}

impl fmt::Debug for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Caller")
            .field("origin", &self.origin.to_string())
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for HttpsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpsClient")
            .field("origin", &self.origin.to_string())
            .field("timeout", &self.timeout)
            .field("material", &self.material)
            .finish_non_exhaustive()
    }
}

impl HttpsClient {
    /// Builds the client and its agent. The material was validated when loaded.
    pub fn new(
        origin: Origin,
        material: TlsMaterial,
        timeout: RequestTimeout,
    ) -> Result<Self, TransportError> {
        let provider = tls13_provider();
        let agent = build_agent(&material, timeout, provider.clone(), 1)?;
        Ok(Self {
            origin,
            material,
            timeout,
            provider,
            agent,
            idle_connections: 1,
        })
    }

    /// Keeps up to `connections` connections alive between calls (at least one): one per
    /// thread that makes calls at the same time, so none of them pays a handshake per call.
    ///
    /// # Errors
    /// When the agent cannot be rebuilt.
    pub fn with_connections(mut self, connections: usize) -> Result<Self, TransportError> {
        self.idle_connections = connections.max(1);
        self.agent = build_agent(
            &self.material,
            self.timeout,
            self.provider.clone(),
            self.idle_connections,
        )?;
        Ok(self)
    }

    /// The origin every call goes to.
    pub fn origin(&self) -> &Origin {
        &self.origin
    }

    /// The material the current agent was built from.
    pub fn material(&self) -> &TlsMaterial {
        &self.material
    }

    /// The fingerprint of the material the current agent was built from.
    pub fn material_fingerprint(&self) -> [u8; 32] {
        self.material.fingerprint()
    }

    /// Installs new material. The agent (and with it the kept-alive connection) is rebuilt
    /// only if the fingerprint changed; returns whether it was.
    pub fn replace_material(&mut self, material: TlsMaterial) -> Result<bool, TransportError> {
        if material.fingerprint() == self.material.fingerprint() {
            return Ok(false);
        }
        self.agent = build_agent(
            &material,
            self.timeout,
            self.provider.clone(),
            self.idle_connections,
        )?;
        self.material = material;
        Ok(true)
    }

    /// Re-reads the material from its files (see [`Self::replace_material`]). On error the
    /// current material and agent stay in use.
    pub fn reload_material(&mut self) -> Result<bool, TransportError> {
        let material = self.material.reload()?;
        self.replace_material(material)
    }

    /// The security-relevant settings of the live agent.
    pub fn settings(&self) -> AgentSettings {
        let config = self.agent.config();
        AgentSettings {
            https_only: config.https_only(),
            max_redirects: config.max_redirects(),
            http_status_as_error: config.http_status_as_error(),
            proxy_configured: config.proxy().is_some(),
            max_idle_connections: config.max_idle_connections(),
            max_idle_connections_per_host: config.max_idle_connections_per_host(),
            tls13_only: self
                .provider
                .cipher_suites
                .iter()
                .all(|s| matches!(s, rustls::SupportedCipherSuite::Tls13(_))),
            timeout: self.timeout,
        }
    }

    /// A caller for one call on another thread (see [`Caller`]).
    pub fn caller(&self) -> Caller {
        Caller {
            origin: self.origin.clone(),
            timeout: self.timeout,
            agent: self.agent.clone(),
        }
    }

    /// POSTs a JSON body (see [`Caller::post_json`]).
    ///
    /// # Errors
    /// As [`Caller::post_json`].
    pub fn post_json(
        &self,
        path: &str,
        authorization: &str,
        body: &[u8],
        caps: JsonCaps,
    ) -> Result<Vec<u8>, TransportError> {
        self.caller().post_json(path, authorization, body, caps)
    }

    /// Streams one framed artifact (see [`Caller::post_artifact`]).
    ///
    /// # Errors
    /// As [`Caller::post_artifact`].
    pub fn post_artifact(
        &self,
        path: &str,
        authorization: &str,
        header_json: &[u8],
        content: &mut dyn Read,
        content_len: u64,
        response_cap: usize,
    ) -> Result<(Vec<u8>, StreamReport), TransportError> {
        self.caller().post_artifact(
            path,
            authorization,
            header_json,
            content,
            content_len,
            response_cap,
        )
    }
}

impl Caller {
    /// POSTs a JSON body and returns the JSON response body.
    ///
    /// Sends `accept: application/json`, `authorization`, `content-type: application/json`
    /// and an exact `content-length` (never chunked). Accepts only status 200 with a
    /// `content-type` starting `application/json`, no `content-encoding` other than
    /// `identity`, a `content-length` (if present) within the response cap, and a body of
    /// 2 bytes up to the cap, enforced while reading.
    pub fn post_json(
        &self,
        path: &str,
        authorization: &str,
        body: &[u8],
        caps: JsonCaps,
    ) -> Result<Vec<u8>, TransportError> {
        check_path(path)?;
        check_authorization(authorization)?;
        if body.len() > caps.request_max_bytes {
            return Err(TransportError::RequestTooLarge {
                len: body.len(),
                cap: caps.request_max_bytes,
            });
        }
        let result = self
            .agent
            .post(self.origin.url(path))
            .header("accept", "application/json")
            .header("authorization", authorization)
            .header("content-type", "application/json")
            .header("content-length", body.len().to_string())
            .send(body);
        let response = result.map_err(|e| TransportError::from_ureq(e, None))?;
        read_json_response(response, caps.response_max_bytes)
    }

    /// Streams one framed artifact (wire reference §2.7) and returns the JSON response body
    /// together with what was actually sent.
    ///
    /// The body is the 4-byte big-endian length of `header_json` (2..=4096 bytes), the
    /// header, then exactly `content_len` (≤ 64 MiB) bytes pulled from `content` in chunks of
    /// at most 64 KiB and hashed on the way. `content-length` is exact, so the body is never
    /// chunked. A reader that yields fewer or more bytes than declared fails the call with
    /// [`TransportError::ArtifactShort`] or [`TransportError::ArtifactOverlong`], and the
    /// server never receives a complete body.
    ///
    /// Timeouts: the request timeout applies to connecting, to each socket read and write
    /// (idle time), and to waiting for the response; the whole upload is additionally bounded
    /// by the timeout plus one second per 4 KiB of body.
    pub fn post_artifact(
        &self,
        path: &str,
        authorization: &str,
        header_json: &[u8],
        content: &mut dyn Read,
        content_len: u64,
        response_cap: usize,
    ) -> Result<(Vec<u8>, StreamReport), TransportError> {
        check_path(path)?;
        check_authorization(authorization)?;
        check_response_cap(response_cap)?;
        let header_bounds = wire_artifact::MIN_HEADER_BYTES..=wire_artifact::MAX_HEADER_BYTES;
        if !header_bounds.contains(&header_json.len()) {
            return Err(TransportError::ArtifactHeaderLength {
                len: header_json.len(),
                min: wire_artifact::MIN_HEADER_BYTES,
                max: wire_artifact::MAX_HEADER_BYTES,
            });
        }
        if content_len > wire_artifact::MAX_ARTIFACT_BYTES {
            return Err(TransportError::ArtifactTooLarge {
                len: content_len,
                max: wire_artifact::MAX_ARTIFACT_BYTES,
            });
        }
        let mut framed = FramedBody::new(header_json, content, content_len);
        let total = framed.total_len();
        debug_assert!(total <= wire_artifact::MAX_REQUEST_BYTES as u64);
        let t = self.timeout.duration();
        let overall = t + Duration::from_secs(total.div_ceil(ARTIFACT_MIN_RATE_BYTES_PER_S));
        let result = self
            .agent
            .post(self.origin.url(path))
            .config()
            .timeout_global(Some(overall))
            .timeout_per_read(Some(t))
            .timeout_per_write(Some(t))
            .timeout_connect(Some(t))
            .timeout_recv_response(Some(t))
            .timeout_recv_body(Some(t))
            .build()
            .header("accept", "application/json")
            .header("authorization", authorization)
            .header("content-type", wire_artifact::CONTENT_TYPE)
            // An explicit content-length makes ureq 3.5 send the reader body length-delimited:
            // `add_headers` (run.rs) skips its own body mode when the request already has one,
            // and ureq-proto (client/amended.rs) picks a sized writer for a user-provided
            // content-length, refusing more bytes than declared. The server-side test checks
            // there is no transfer-encoding on the wire.
            .header("content-length", total.to_string())
            .send(ureq::SendBody::from_reader(&mut framed));
        // A failure of the content reader is reported as such, whatever ureq made of it.
        if let Some(failure) = framed.failure() {
            return Err(match failure {
                StreamFailure::Short { read } => TransportError::ArtifactShort {
                    declared: content_len,
                    read,
                },
                StreamFailure::Overlong => TransportError::ArtifactOverlong {
                    declared: content_len,
                },
                StreamFailure::Read { read, kind } => TransportError::ArtifactRead { read, kind },
            });
        }
        let response = result.map_err(|e| TransportError::from_ureq(e, None))?;
        if !framed.is_complete() {
            // ureq returned a response without pulling the whole body: the server answered
            // early. Drop the response; the connection is not reused.
            let read = framed.content_sent();
            drop(response);
            return Err(TransportError::ArtifactShort {
                declared: content_len,
                read,
            });
        }
        let bytes_sent = framed.content_sent();
        let sha256 = framed.finish();
        let body = read_json_response(response, response_cap)?;
        Ok((body, StreamReport { bytes_sent, sha256 }))
    }
}

fn build_agent(
    material: &TlsMaterial,
    timeout: RequestTimeout,
    provider: Arc<CryptoProvider>,
    idle_connections: usize,
) -> Result<ureq::Agent, TransportError> {
    let tls = TlsConfig::builder()
        .provider(TlsProvider::Rustls)
        .root_certs(material.ureq_root_certs())
        .client_cert(Some(material.ureq_client_cert()?))
        .use_sni(true)
        .disable_verification(false)
        .unversioned_rustls_crypto_provider(provider)
        .build();
    let t = timeout.duration();
    let config = ureq::Agent::config_builder()
        .tls_config(tls)
        .https_only(true)
        .max_redirects(0)
        .proxy(None)
        .http_status_as_error(false)
        .save_redirect_history(false)
        .user_agent(AutoHeaderValue::None)
        .accept_encoding(AutoHeaderValue::None)
        .max_idle_connections(idle_connections)
        .max_idle_connections_per_host(idle_connections)
        .max_response_header_size(RESPONSE_HEADER_MAX_BYTES)
        .timeout_global(Some(t))
        .timeout_connect(Some(t))
        .timeout_per_read(Some(t))
        .timeout_per_write(Some(t))
        .build();
    Ok(ureq::Agent::with_parts(
        config,
        ureq::unversioned::transport::DefaultConnector::new(),
        LiteralFirst::default(),
    ))
}

/// ureq's resolver, except that an IP-literal origin is answered without a lookup.
///
/// ureq resolves the origin before every request, pooled connection or not, and with a timeout
/// configured its default resolver runs each lookup on a thread of its own: a thread spawned
/// and joined per call, even for `https://127.0.0.1:…`. An IP literal needs no lookup, so it
/// costs none here; a DNS name still goes through ureq's resolver and its timeout.
#[derive(Debug, Default)]
struct LiteralFirst(ureq::unversioned::resolver::DefaultResolver);

impl ureq::unversioned::resolver::Resolver for LiteralFirst {
    fn resolve(
        &self,
        uri: &ureq::http::Uri,
        config: &ureq::config::Config,
        timeout: ureq::unversioned::transport::NextTimeout,
    ) -> Result<ureq::unversioned::resolver::ResolvedSocketAddrs, ureq::Error> {
        if let Some(address) = literal_address(uri) {
            let mut addresses = self.empty();
            addresses.push(address);
            return Ok(addresses);
        }
        self.0.resolve(uri, config, timeout)
    }
}

/// The socket address of an `https` URI whose host is an IP literal (IPv6 in brackets).
fn literal_address(uri: &ureq::http::Uri) -> Option<std::net::SocketAddr> {
    if uri.scheme_str() != Some("https") {
        return None;
    }
    let host = uri.host()?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    let ip: std::net::IpAddr = host.parse().ok()?;
    Some(std::net::SocketAddr::new(ip, uri.port_u16().unwrap_or(443)))
}

/// Applies the response acceptance rules and reads the body within `cap`.
fn read_json_response(
    mut response: ureq::http::Response<ureq::Body>,
    cap: usize,
) -> Result<Vec<u8>, TransportError> {
    let status = response.status().as_u16();
    if status != 200 {
        let code = read_error_code(&mut response);
        return Err(TransportError::Status { status, code });
    }
    let headers = response.headers();
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .ok_or(TransportError::ContentType)?;
    if !is_json_media_type(content_type) {
        return Err(TransportError::ContentType);
    }
    let mut encodings = headers.get_all("content-encoding").iter();
    if let Some(encoding) = encodings.next() {
        let identity = encoding
            .to_str()
            .is_ok_and(|v| v.trim().eq_ignore_ascii_case("identity"));
        if !identity || encodings.next().is_some() {
            return Err(TransportError::ContentEncoding);
        }
    }
    let mut lengths = headers.get_all("content-length").iter();
    if let Some(length) = lengths.next() {
        if lengths.next().is_some() {
            return Err(TransportError::ContentLengthInvalid);
        }
        let text = length
            .to_str()
            .map_err(|_| TransportError::ContentLengthInvalid)?;
        if text.is_empty() || text.len() > 20 || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(TransportError::ContentLengthInvalid);
        }
        let declared: u64 = text
            .parse()
            .map_err(|_| TransportError::ContentLengthInvalid)?;
        if declared > cap as u64 {
            return Err(TransportError::ResponseTooLarge { cap });
        }
    }
    let body = response
        .body_mut()
        .with_config()
        .limit(cap as u64)
        .read_to_vec()
        .map_err(|e| TransportError::from_ureq(e, Some(cap)))?;
    if body.len() < 2 {
        return Err(TransportError::ResponseTooShort { len: body.len() });
    }
    Ok(body)
}

/// Reads at most 1 KiB of a non-200 body and keeps only a snake_case `code`, if present.
fn read_error_code(response: &mut ureq::http::Response<ureq::Body>) -> Option<String> {
    let is_json = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(is_json_media_type);
    if !is_json {
        return None;
    }
    let body = response
        .body_mut()
        .with_config()
        .limit(ERROR_BODY_READ_MAX_BYTES as u64)
        .read_to_vec()
        .ok()?;
    let value: serde_json::Value = serde_json::from_slice(&body).ok()?;
    let code = value.as_object()?.get("code")?.as_str()?;
    is_snake_case_code(code).then(|| code.to_owned())
}

/// `application/json`, optionally followed by parameters (`; charset=utf-8`).
fn is_json_media_type(value: &str) -> bool {
    const JSON: &str = "application/json";
    value
        .get(..JSON.len())
        .is_some_and(|p| p.eq_ignore_ascii_case(JSON))
        && matches!(
            value.as_bytes().get(JSON.len()),
            None | Some(b';' | b' ' | b'\t')
        )
}

/// `^[a-z][a-z0-9_]*$`, at most [`ERROR_CODE_MAX_CHARS`] characters.
fn is_snake_case_code(code: &str) -> bool {
    let mut bytes = code.bytes();
    code.len() <= ERROR_CODE_MAX_CHARS
        && bytes.next().is_some_and(|b| b.is_ascii_lowercase())
        && bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
}

/// An absolute path of RFC 3986 `pchar`s without percent-escapes, no empty, `.` or `..`
/// segments; never a query or fragment.
fn check_path(path: &str) -> Result<(), TransportError> {
    let err = TransportError::InvalidPath {
        max: PATH_MAX_BYTES,
    };
    let Some(rest) = path.strip_prefix('/') else {
        return Err(err);
    };
    if path.len() > PATH_MAX_BYTES || rest.is_empty() {
        return Err(err);
    }
    let chars_ok = rest
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~:@!$&'()*+,;=/".contains(&b));
    let segments_ok = rest
        .split('/')
        .all(|seg| !seg.is_empty() && seg != "." && seg != "..");
    if chars_ok && segments_ok {
        Ok(())
    } else {
        Err(err)
    }
}

/// A header value of visible ASCII and inner spaces, 1..=512 bytes.
fn check_authorization(value: &str) -> Result<(), TransportError> {
    let ok = !value.is_empty()
        && value.len() <= AUTHORIZATION_MAX_BYTES
        && value.bytes().all(|b| (0x20..=0x7e).contains(&b))
        && !value.starts_with(' ')
        && !value.ends_with(' ');
    if ok {
        Ok(())
    } else {
        Err(TransportError::InvalidAuthorization {
            max: AUTHORIZATION_MAX_BYTES,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_literal_origins_resolve_without_a_lookup_and_names_are_left_to_ureq() {
        let uri = |s: &str| s.parse::<ureq::http::Uri>().expect("uri");
        assert_eq!(
            literal_address(&uri("https://127.0.0.1:8443/api")),
            Some("127.0.0.1:8443".parse().expect("addr"))
        );
        assert_eq!(
            literal_address(&uri("https://[::1]/x")),
            Some("[::1]:443".parse().expect("addr"))
        );
        assert_eq!(literal_address(&uri("https://localhost:8443/")), None);
        assert_eq!(literal_address(&uri("https://plane.example/")), None);
        assert_eq!(literal_address(&uri("http://127.0.0.1/")), None);
    }

    #[test]
    fn timeout_bounds_are_1_to_60_seconds() {
        assert_eq!(
            RequestTimeout::default().duration(),
            Duration::from_secs(15)
        );
        assert!(RequestTimeout::from_millis(1_000).is_ok());
        assert!(RequestTimeout::from_millis(60_000).is_ok());
        assert!(matches!(
            RequestTimeout::from_millis(999),
            Err(ConfigError::Timeout { got_ms: 999, .. })
        ));
        assert!(RequestTimeout::from_millis(60_001).is_err());
        assert!(RequestTimeout::new(Duration::from_nanos(60_000_000_001)).is_err());
    }

    #[test]
    fn json_caps_default_4k_opt_in_up_to_64k() {
        let caps = JsonCaps::default();
        assert_eq!(caps.request_max_bytes(), 4096);
        assert_eq!(caps.response_max_bytes(), 256 * 1024);
        assert_eq!(
            JsonCaps::with_request_cap(65_536)
                .unwrap()
                .request_max_bytes(),
            65_536
        );
        assert!(JsonCaps::with_request_cap(65_537).is_err());
        assert!(JsonCaps::with_request_cap(0).is_err());
        assert!(caps.response_cap(256 * 1024 + 1).is_err());
        assert!(caps.response_cap(1).is_err());
        assert_eq!(caps.response_cap(4096).unwrap().response_max_bytes(), 4096);
    }

    #[test]
    fn paths_must_be_plain_absolute_paths() {
        assert!(check_path("/api/v3/worker-ingress/workers/w-1/sessions/s/offers").is_ok());
        for bad in [
            "", "/", "api", "/a?b", "/a#b", "/a//b", "/a/./b", "/a/../b", "/a/", "/a b", "/a%2e",
            "/\u{e9}",
        ] {
            assert!(check_path(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn authorization_must_be_one_visible_line() {
        assert!(check_authorization("Worker ql3w_id_secret").is_ok());
        for bad in ["", " x", "x ", "a\r\nb", "a\tb", "\u{e9}"] {
            assert!(check_authorization(bad).is_err(), "{bad:?}");
        }
        assert!(check_authorization(&"a".repeat(AUTHORIZATION_MAX_BYTES + 1)).is_err());
    }

    #[test]
    fn error_codes_are_snake_case_only() {
        assert!(is_snake_case_code("worker_offer_fenced"));
        assert!(is_snake_case_code("a1"));
        for bad in ["", "Worker", "1a", "a-b", "a b", "é"] {
            assert!(!is_snake_case_code(bad), "{bad:?}");
        }
        assert!(!is_snake_case_code(&"a".repeat(ERROR_CODE_MAX_CHARS + 1)));
    }
}
