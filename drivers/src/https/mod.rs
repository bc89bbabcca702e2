//! The Worker's HTTPS transport: TLS 1.3-only mutual TLS over ureq + rustls.
//!
//! This module moves bytes; it knows nothing about the endpoints' JSON. It enforces the
//! transport rules of wire reference §2.1 and the artifact framing of §2.7:
//!
//! - [`Origin`]: `https:` only, no userinfo, path empty or `/`, no query or fragment.
//! - [`TlsMaterial`]: client chain, private key and 1–8 trust anchors from PEM files of at
//!   most 1 MiB each, validated with rustls before ureq sees them; key bytes zeroized.
//! - [`HttpsClient`]: one agent, TLS 1.3 only, no proxy, no redirects, no compression, one
//!   kept-alive connection, [`HttpsClient::post_json`] and [`HttpsClient::post_artifact`].
//! - [`TransportError`]: typed, split by [`Blame`], and free of secrets and body bytes.

mod artifact;
mod client;
mod error;
mod material;
mod origin;

use std::sync::Arc;

use rustls::crypto::CryptoProvider;

pub use artifact::STREAM_CHUNK_BYTES;
pub use client::{
    AUTHORIZATION_MAX_BYTES, AgentSettings, Caller, ERROR_BODY_READ_MAX_BYTES, HttpsClient,
    JSON_REQUEST_DEFAULT_MAX_BYTES, JSON_REQUEST_HARD_MAX_BYTES, JsonCaps, PATH_MAX_BYTES,
    RESPONSE_MAX_BYTES_CEILING, RequestTimeout, StreamReport,
};
pub use error::{Blame, ConfigError, ERROR_CODE_MAX_CHARS, TlsFailure, TransportError};
pub use material::{
    CLIENT_CHAIN_MAX, MATERIAL_FILE_MAX_BYTES, MaterialError, MaterialFile, TRUST_ANCHORS_MAX,
    TlsMaterial, TlsMaterialPaths,
};
pub use origin::{Host, ORIGIN_MAX_BYTES, Origin, OriginError};

/// The ring provider with every TLS 1.2 cipher suite removed.
///
/// ureq always asks rustls for all protocol versions; with only TLS 1.3 suites in the
/// provider, rustls offers and accepts TLS 1.3 alone (reference/rust-dependencies.md §4.3).
pub fn tls13_provider() -> Arc<CryptoProvider> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider
        .cipher_suites
        .retain(|suite| matches!(suite, rustls::SupportedCipherSuite::Tls13(_)));
    Arc::new(provider)
}
