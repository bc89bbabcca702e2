//! Transport errors, split by who is to blame.
//!
//! Every variant's `Display` names the rule that was broken. No variant carries the
//! authorization value, key material or request body bytes; the only remote text ever kept
//! is a snake_case error `code` of at most [`ERROR_CODE_MAX_CHARS`] characters.

use std::io;

use rustls::{AlertDescription, CertificateError};

use super::material::MaterialError;
use super::origin::OriginError;

/// Longest `code` kept from a non-200 response body.
pub const ERROR_CODE_MAX_CHARS: usize = 64;

/// Who is at fault for a [`TransportError`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Blame {
    /// Our configuration or our caller's input (origin, material, caps, request shape, the
    /// artifact reader). Retrying the same call cannot help.
    Local,
    /// The TLS handshake or session failed: wrong peer, wrong version, wrong certificate.
    Tls,
    /// Connecting, a timeout, or the connection broke. Retrying later may help.
    Connection,
    /// The control plane answered, but not with an acceptable response.
    Remote,
}

/// Why a TLS handshake or session failed, classified from the `rustls::Error` (or the alert
/// the peer sent) that ureq reports.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TlsFailure {
    /// The server's certificate does not chain to a configured trust anchor.
    #[error("server certificate is not issued by a configured trust anchor")]
    UnknownIssuer,
    /// The server's certificate is not valid for the origin's host.
    #[error("server certificate is not valid for the origin host")]
    HostnameMismatch,
    /// The server's certificate is expired.
    #[error("server certificate has expired")]
    Expired,
    /// The server's certificate is not valid yet.
    #[error("server certificate is not valid yet")]
    NotYetValid,
    /// Some other problem with the server's certificate.
    #[error("server certificate was refused: {reason}")]
    BadServerCertificate {
        /// rustls's reason.
        reason: String,
    },
    /// The server does not speak TLS 1.3 (the only version offered).
    #[error("server does not support TLS 1.3")]
    ProtocolVersion,
    /// The server rejected our client certificate (it sent a certificate alert). A rejection
    /// can also surface as a reset or broken pipe, see [`TransportError::ConnectionClosed`].
    #[error("server rejected the client certificate ({alert})")]
    ClientCertificateRejected {
        /// The TLS alert the server sent.
        alert: String,
    },
    /// The peer sent bytes that are not TLS (for example a plaintext HTTP server).
    #[error("peer did not speak TLS ({reason})")]
    NotTls {
        /// rustls's reason.
        reason: String,
    },
    /// Any other TLS failure.
    #[error("TLS failed: {reason}")]
    Other {
        /// rustls's reason.
        reason: String,
    },
}

/// Where the TLS material or options were refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The request timeout is outside the allowed range.
    #[error("request timeout must be {min_ms}..={max_ms} ms, got {got_ms} ms")]
    Timeout {
        /// Requested value.
        got_ms: u128,
        /// Lower bound.
        min_ms: u64,
        /// Upper bound.
        max_ms: u64,
    },
    /// A request body cap is outside the allowed range.
    #[error("request body cap must be 1..={max} bytes, got {got}")]
    RequestCap {
        /// Requested value.
        got: usize,
        /// Upper bound.
        max: usize,
    },
    /// A response body cap is outside the allowed range.
    #[error("response body cap must be 2..={max} bytes, got {got}")]
    ResponseCap {
        /// Requested value.
        got: usize,
        /// Upper bound.
        max: usize,
    },
}

/// Everything that can go wrong with one HTTPS call.
///
/// Variants are grouped by [`Blame`]; [`TransportError::blame`] says which group a value is
/// in. `Debug` is derived but safe: no variant holds secrets or body bytes.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    // ---- Local: our configuration or our caller's input. ----
    /// The configured origin is invalid.
    #[error("invalid origin: {0}")]
    Origin(#[from] OriginError),
    /// The TLS material is invalid.
    #[error("invalid TLS material: {0}")]
    Material(#[from] MaterialError),
    /// A client option is out of range.
    #[error("invalid client option: {0}")]
    Config(#[from] ConfigError),
    /// The request path is not an absolute path of safe characters.
    #[error(
        "request path must start with / and hold only [A-Za-z0-9._~:@!$&'()*+,;=/-], \
         no empty, . or .. segments, at most {max} bytes"
    )]
    InvalidPath {
        /// The limit.
        max: usize,
    },
    /// The authorization value is not a single-line visible-ASCII header value.
    #[error("authorization must be 1..={max} bytes of visible ASCII or spaces, not padded")]
    InvalidAuthorization {
        /// The limit.
        max: usize,
    },
    /// The JSON request body is larger than the call's cap.
    #[error("request body must be at most {cap} bytes, got {len}")]
    RequestTooLarge {
        /// Body length.
        len: usize,
        /// The cap in force.
        cap: usize,
    },
    /// The artifact header is outside 2..=4096 bytes.
    #[error("artifact header must be {min}..={max} bytes, got {len}")]
    ArtifactHeaderLength {
        /// Header length.
        len: usize,
        /// Lower bound.
        min: usize,
        /// Upper bound.
        max: usize,
    },
    /// The declared artifact content is larger than 64 MiB.
    #[error("artifact content must be at most {max} bytes, got {len}")]
    ArtifactTooLarge {
        /// Declared content length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// The artifact reader ended before the declared length.
    #[error("artifact content reader ended after {read} of {declared} declared bytes")]
    ArtifactShort {
        /// Declared content length.
        declared: u64,
        /// Bytes the reader produced.
        read: u64,
    },
    /// The artifact reader had more bytes than declared.
    #[error("artifact content reader has more than the {declared} declared bytes")]
    ArtifactOverlong {
        /// Declared content length.
        declared: u64,
    },
    /// The artifact reader failed.
    #[error("artifact content reader failed after {read} bytes ({kind})")]
    ArtifactRead {
        /// Bytes read before the failure.
        read: u64,
        /// The I/O error kind.
        kind: io::ErrorKind,
    },

    /// The HTTP client refused the request as built. Validation runs first, so this means
    /// a bug or an unexpected ureq behaviour; ureq's message names the rule, never values.
    #[error("HTTP client refused the request ({reason})")]
    ClientSetup {
        /// ureq's message.
        reason: String,
    },

    // ---- TLS. ----
    /// The TLS handshake or session failed.
    #[error("TLS: {0}")]
    Tls(TlsFailure),

    // ---- Connection. ----
    /// The host name could not be resolved.
    #[error("the origin host could not be resolved")]
    HostNotFound,
    /// The TCP connection could not be made.
    #[error("could not connect to the origin ({kind})")]
    Connect {
        /// The I/O error kind.
        kind: io::ErrorKind,
    },
    /// A timeout expired.
    #[error("request timed out ({phase})")]
    Timeout {
        /// Which budget expired, as ureq names it (`global`, `per read`, `connect`, ...).
        phase: String,
    },
    /// The peer closed or reset the connection. During a TLS 1.3 handshake this is also how
    /// a server's rejection of our client certificate can look (it closes after its alert).
    #[error("connection closed or reset by the peer ({kind})")]
    ConnectionClosed {
        /// The I/O error kind.
        kind: io::ErrorKind,
    },
    /// Another I/O failure on the connection.
    #[error("connection I/O failed ({kind})")]
    Io {
        /// The I/O error kind.
        kind: io::ErrorKind,
    },

    // ---- Remote: the control plane's response. ----
    /// The status was not 200. `code` is the snake_case `code` of a `{"code":"…"}` body read
    /// within 1 KiB, if there was one; no other body text is kept. Redirects are reported
    /// here too: they are never followed.
    #[error("response status must be 200, got {status}{}", code_suffix(.code))]
    Status {
        /// The HTTP status.
        status: u16,
        /// The error code from the body, if any.
        code: Option<String>,
    },
    /// The response `content-type` is missing or not `application/json`.
    #[error("response content-type must start with application/json")]
    ContentType,
    /// The response has a `content-encoding` other than `identity`.
    #[error("response content-encoding must be absent or identity")]
    ContentEncoding,
    /// The response `content-length` is not a single decimal number.
    #[error("response content-length must be a decimal number")]
    ContentLengthInvalid,
    /// The response body (declared or streamed) exceeds the call's cap.
    #[error("response body must be at most {cap} bytes")]
    ResponseTooLarge {
        /// The cap in force.
        cap: usize,
    },
    /// The response body is shorter than 2 bytes.
    #[error("response body must be at least 2 bytes, got {len}")]
    ResponseTooShort {
        /// Body length.
        len: usize,
    },
    /// The response is not valid HTTP/1.1 (garbage, bad framing, oversized headers).
    #[error("response is not valid HTTP/1.1 ({reason})")]
    MalformedResponse {
        /// What was wrong, as the HTTP parser names it.
        reason: String,
    },
}

fn code_suffix(code: &Option<String>) -> String {
    match code {
        Some(code) => format!(" (code {code})"),
        None => String::new(),
    }
}

impl TransportError {
    /// Which side is at fault.
    pub fn blame(&self) -> Blame {
        match self {
            Self::Origin(_)
            | Self::Material(_)
            | Self::Config(_)
            | Self::InvalidPath { .. }
            | Self::InvalidAuthorization { .. }
            | Self::RequestTooLarge { .. }
            | Self::ArtifactHeaderLength { .. }
            | Self::ArtifactTooLarge { .. }
            | Self::ArtifactShort { .. }
            | Self::ArtifactOverlong { .. }
            | Self::ArtifactRead { .. }
            | Self::ClientSetup { .. } => Blame::Local,
            Self::Tls(_) => Blame::Tls,
            Self::HostNotFound
            | Self::Connect { .. }
            | Self::Timeout { .. }
            | Self::ConnectionClosed { .. }
            | Self::Io { .. } => Blame::Connection,
            Self::Status { .. }
            | Self::ContentType
            | Self::ContentEncoding
            | Self::ContentLengthInvalid
            | Self::ResponseTooLarge { .. }
            | Self::ResponseTooShort { .. }
            | Self::MalformedResponse { .. } => Blame::Remote,
        }
    }

    /// Maps a ureq error. `response_cap` is the cap of the body being read, if any.
    pub(crate) fn from_ureq(err: ureq::Error, response_cap: Option<usize>) -> Self {
        use ureq::Error as U;
        match err {
            U::Io(io) => Self::from_io(&io),
            U::Rustls(tls) => Self::Tls(classify_rustls(&tls)),
            U::Timeout(t) => Self::Timeout {
                phase: t.to_string(),
            },
            U::HostNotFound => Self::HostNotFound,
            U::ConnectionFailed => Self::Connect {
                kind: io::ErrorKind::ConnectionRefused,
            },
            U::BodyExceedsLimit(limit) => Self::ResponseTooLarge {
                cap: response_cap.unwrap_or(usize::try_from(limit).unwrap_or(usize::MAX)),
            },
            U::Protocol(p) => Self::MalformedResponse {
                reason: p.to_string(),
            },
            U::LargeResponseHeader(_, _) => Self::MalformedResponse {
                reason: "response header too large".into(),
            },
            U::BodyStalled => Self::Timeout {
                phase: "body stalled".into(),
            },
            U::RequireHttpsOnly(_) | U::TlsRequired => Self::Origin(OriginError::NotHttps {
                scheme: "http".into(),
            }),
            // Everything else is a local misuse of ureq that validation should have caught
            // (bad URI, bad header, redirect settings). Only ureq's message is kept: these
            // messages name the rule, never header values or bodies.
            other => Self::ClientSetup {
                reason: other.to_string(),
            },
        }
    }

    /// Maps an I/O error, looking inside for a `rustls::Error` or a wrapped ureq error.
    pub(crate) fn from_io(io: &io::Error) -> Self {
        if let Some(inner) = io.get_ref() {
            if let Some(tls) = inner.downcast_ref::<rustls::Error>() {
                return Self::Tls(classify_rustls(tls));
            }
            if let Some(ureq_err) = inner.downcast_ref::<ureq::Error>() {
                return match ureq_err {
                    ureq::Error::Timeout(t) => Self::Timeout {
                        phase: t.to_string(),
                    },
                    ureq::Error::Rustls(tls) => Self::Tls(classify_rustls(tls)),
                    _ => Self::Io { kind: io.kind() },
                };
            }
        }
        match io.kind() {
            io::ErrorKind::ConnectionRefused => Self::Connect { kind: io.kind() },
            io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::UnexpectedEof => Self::ConnectionClosed { kind: io.kind() },
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => Self::Timeout {
                phase: "socket".into(),
            },
            kind => Self::Io { kind },
        }
    }
}

/// Classifies a rustls error into the few cases an operator can act on.
pub(crate) fn classify_rustls(err: &rustls::Error) -> TlsFailure {
    use rustls::Error as E;
    match err {
        E::InvalidCertificate(cert) => match cert {
            CertificateError::UnknownIssuer => TlsFailure::UnknownIssuer,
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                TlsFailure::HostnameMismatch
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                TlsFailure::Expired
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                TlsFailure::NotYetValid
            }
            other => TlsFailure::BadServerCertificate {
                reason: format!("{other:?}"),
            },
        },
        E::AlertReceived(AlertDescription::ProtocolVersion)
        | E::PeerIncompatible(
            rustls::PeerIncompatible::ServerTlsVersionIsDisabledByOurConfig
            | rustls::PeerIncompatible::ServerDoesNotSupportTls12Or13
            | rustls::PeerIncompatible::SupportedVersionsExtensionRequired,
        ) => TlsFailure::ProtocolVersion,
        E::AlertReceived(
            alert @ (AlertDescription::BadCertificate
            | AlertDescription::UnsupportedCertificate
            | AlertDescription::CertificateRevoked
            | AlertDescription::CertificateExpired
            | AlertDescription::CertificateUnknown
            | AlertDescription::UnknownCA
            | AlertDescription::AccessDenied
            | AlertDescription::CertificateRequired),
        ) => TlsFailure::ClientCertificateRejected {
            alert: format!("{alert:?}"),
        },
        E::InvalidMessage(m) => TlsFailure::NotTls {
            reason: format!("{m:?}"),
        },
        other => TlsFailure::Other {
            reason: other.to_string(),
        },
    }
}
