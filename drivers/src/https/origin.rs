//! The configured control-plane origin: `https://host[:port][/]`, nothing else.
//!
//! The rules are the reference client's (wire reference §2.1): scheme `https`, no userinfo,
//! path empty or `/`, no query, no fragment. The host is a DNS name or an IP literal (IPv4
//! dotted quad or bracketed IPv6). Anything the rules do not name is rejected rather than
//! normalised, so the origin the operator wrote is the origin the Worker talks to.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use rustls::pki_types::ServerName;

/// Longest origin string accepted, in bytes. Far above any real `https://host:port/`.
pub const ORIGIN_MAX_BYTES: usize = 512;

/// Longest DNS name accepted (RFC 1035).
const DNS_NAME_MAX_BYTES: usize = 253;

/// Longest DNS label accepted (RFC 1035).
const DNS_LABEL_MAX_BYTES: usize = 63;

/// Port used when the origin names none.
const HTTPS_DEFAULT_PORT: u16 = 443;

/// A validated `https:` origin.
///
/// Construct it with [`Origin::parse`]. The host is kept in canonical form (DNS names in
/// lowercase, IP literals parsed), so two spellings of the same origin compare equal.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    host: Host,
    port: u16,
}

/// The host part of an [`Origin`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    /// A DNS name, lowercase, without a trailing dot. SNI carries it.
    Dns(String),
    /// An IPv4 literal. No SNI is sent (RFC 6066 §3 forbids IP literals in SNI).
    Ipv4(Ipv4Addr),
    /// An IPv6 literal, written in brackets in the origin. No SNI is sent.
    Ipv6(Ipv6Addr),
}

/// Which origin rule a configured string broke.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OriginError {
    /// The string is longer than [`ORIGIN_MAX_BYTES`].
    #[error("origin must be at most {max} bytes, got {len}")]
    TooLong {
        /// Length of the rejected string in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// No `scheme://` prefix could be found.
    #[error("origin must have the form https://host[:port][/]")]
    Malformed,
    /// The scheme is not `https` (for example `http`).
    #[error("origin scheme must be https, found `{scheme}`")]
    NotHttps {
        /// The scheme found, lowercased and cut to 16 characters.
        scheme: String,
    },
    /// The authority contains `user[:password]@`.
    #[error("origin must not contain userinfo (user@ or user:password@)")]
    Userinfo,
    /// The path is something other than empty or `/`.
    #[error("origin path must be empty or /")]
    Path,
    /// A `?query` is present.
    #[error("origin must not contain a query")]
    Query,
    /// A `#fragment` is present.
    #[error("origin must not contain a fragment")]
    Fragment,
    /// The host is empty.
    #[error("origin host must not be empty")]
    EmptyHost,
    /// The host is neither a valid DNS name, an IPv4 dotted quad nor a bracketed IPv6 literal.
    #[error("origin host must be a DNS name, an IPv4 address or a bracketed IPv6 address")]
    InvalidHost,
    /// The port is not a decimal number in 1..=65535.
    #[error("origin port must be a decimal number in 1..=65535")]
    InvalidPort,
}

impl Origin {
    /// Parses and validates a configured origin string.
    ///
    /// Accepted: `https://control.example`, `https://control.example:8443/`,
    /// `https://127.0.0.1:9000`, `https://[::1]:9000/`. The scheme and DNS names are
    /// case-insensitive and kept lowercase.
    pub fn parse(input: &str) -> Result<Self, OriginError> {
        if input.len() > ORIGIN_MAX_BYTES {
            return Err(OriginError::TooLong {
                len: input.len(),
                max: ORIGIN_MAX_BYTES,
            });
        }
        let (scheme, rest) = input.split_once("://").ok_or(OriginError::Malformed)?;
        if scheme.is_empty()
            || !scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'+')
        {
            return Err(OriginError::Malformed);
        }
        if !scheme.eq_ignore_ascii_case("https") {
            let mut scheme = scheme.to_ascii_lowercase();
            scheme.truncate(16);
            return Err(OriginError::NotHttps { scheme });
        }
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        check_tail(tail)?;
        if authority.contains('@') {
            return Err(OriginError::Userinfo);
        }
        let (host, port) = split_host_port(authority)?;
        Ok(Self { host, port })
    }

    /// The host, in canonical form.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The port (443 when the origin names none).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether the TLS ClientHello carries SNI for this origin: only for DNS names.
    ///
    /// rustls decides this from the [`ServerName`] variant: it sends `server_name` for
    /// `ServerName::DnsName` and never for `ServerName::IpAddress`. ureq builds the
    /// `ServerName` from the same host string, so this is what goes on the wire (the
    /// transport tests check it from the server side).
    pub fn sends_sni(&self) -> bool {
        matches!(self.host, Host::Dns(_))
    }

    /// The name the server certificate is verified against.
    pub fn server_name(&self) -> ServerName<'static> {
        match &self.host {
            Host::Dns(name) => ServerName::try_from(name.clone())
                // INVARIANT: `parse` accepted the name only after this same conversion succeeded.
                .expect("validated DNS name"),
            Host::Ipv4(ip) => ServerName::from(std::net::IpAddr::V4(*ip)),
            Host::Ipv6(ip) => ServerName::from(std::net::IpAddr::V6(*ip)),
        }
    }

    /// The absolute URL of `path` (which must start with `/`) on this origin.
    pub(crate) fn url(&self, path: &str) -> String {
        format!("{self}{path}")
    }
}

impl fmt::Display for Origin {
    /// Writes `https://host:port`, the port always explicit, IPv6 in brackets.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.host {
            Host::Dns(name) => write!(f, "https://{name}:{}", self.port),
            Host::Ipv4(ip) => write!(f, "https://{ip}:{}", self.port),
            Host::Ipv6(ip) => write!(f, "https://[{ip}]:{}", self.port),
        }
    }
}

/// Checks what follows the authority: nothing, or exactly `/`.
fn check_tail(tail: &str) -> Result<(), OriginError> {
    let path_end = tail.find(['?', '#']).unwrap_or(tail.len());
    let (path, after) = tail.split_at(path_end);
    if after.starts_with('?') {
        return Err(OriginError::Query);
    }
    if after.starts_with('#') {
        return Err(OriginError::Fragment);
    }
    if !(path.is_empty() || path == "/") {
        return Err(OriginError::Path);
    }
    Ok(())
}

fn split_host_port(authority: &str) -> Result<(Host, u16), OriginError> {
    if authority.is_empty() {
        return Err(OriginError::EmptyHost);
    }
    if let Some(bracketed) = authority.strip_prefix('[') {
        let (literal, after) = bracketed.split_once(']').ok_or(OriginError::InvalidHost)?;
        // Zone identifiers (`%25eth0`) and anything that is not a plain IPv6 literal fail here.
        let ip: Ipv6Addr = literal.parse().map_err(|_| OriginError::InvalidHost)?;
        let port = match after {
            "" => HTTPS_DEFAULT_PORT,
            _ => parse_port(after.strip_prefix(':').ok_or(OriginError::InvalidHost)?)?,
        };
        return Ok((Host::Ipv6(ip), port));
    }
    let (host, port) = match authority.split_once(':') {
        Some((host, port)) => (host, parse_port(port)?),
        None => (authority, HTTPS_DEFAULT_PORT),
    };
    if host.is_empty() {
        return Err(OriginError::EmptyHost);
    }
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        return Ok((Host::Ipv4(ip), port));
    }
    let name = host.to_ascii_lowercase();
    if !is_dns_name(&name) || ServerName::try_from(name.clone()).is_err() {
        return Err(OriginError::InvalidHost);
    }
    Ok((Host::Dns(name), port))
}

fn parse_port(text: &str) -> Result<u16, OriginError> {
    if text.is_empty() || text.len() > 5 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(OriginError::InvalidPort);
    }
    match text.parse::<u16>() {
        Ok(0) | Err(_) => Err(OriginError::InvalidPort),
        Ok(port) => Ok(port),
    }
}

/// A lowercase LDH host name (RFC 1123). The last label may not be all digits: a string
/// such as `127.1` or `1.2.3.256` is an IPv4 spelling that other URL parsers would read as
/// an address, and accepting it as a name would make the origin ambiguous.
fn is_dns_name(name: &str) -> bool {
    if name.is_empty() || name.len() > DNS_NAME_MAX_BYTES {
        return false;
    }
    let labels_ok = name.split('.').all(|label| {
        !label.is_empty()
            && label.len() <= DNS_LABEL_MAX_BYTES
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    });
    let last_label_numeric = name
        .rsplit('.')
        .next()
        .is_some_and(|last| last.bytes().all(|b| b.is_ascii_digit()));
    labels_ok && !last_label_numeric
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_dns_ipv4_ipv6_with_and_without_port() {
        let o = Origin::parse("https://Control.Example").unwrap();
        assert_eq!(o.host(), &Host::Dns("control.example".into()));
        assert_eq!(o.port(), 443);
        assert!(o.sends_sni());
        assert_eq!(o.to_string(), "https://control.example:443");

        let o = Origin::parse("HTTPS://127.0.0.1:9000/").unwrap();
        assert_eq!(o.host(), &Host::Ipv4(Ipv4Addr::LOCALHOST));
        assert_eq!(o.port(), 9000);
        assert!(!o.sends_sni());
        assert!(matches!(o.server_name(), ServerName::IpAddress(_)));

        let o = Origin::parse("https://[::1]:8443").unwrap();
        assert_eq!(o.host(), &Host::Ipv6(Ipv6Addr::LOCALHOST));
        assert_eq!(o.url("/x"), "https://[::1]:8443/x");
        assert!(!o.sends_sni());

        let o = Origin::parse("https://localhost:1/").unwrap();
        assert!(matches!(o.server_name(), ServerName::DnsName(_)));
    }

    #[test]
    fn rejects_each_broken_rule_with_its_own_error() {
        let cases: &[(&str, OriginError)] = &[
            (
                "http://127.0.0.1",
                OriginError::NotHttps {
                    scheme: "http".into(),
                },
            ),
            (
                "ftp://example.com",
                OriginError::NotHttps {
                    scheme: "ftp".into(),
                },
            ),
            ("example.com", OriginError::Malformed),
            ("://example.com", OriginError::Malformed),
            ("https://user@example.com", OriginError::Userinfo),
            ("https://user:pw@example.com/", OriginError::Userinfo),
            ("https://example.com/api", OriginError::Path),
            ("https://example.com//", OriginError::Path),
            ("https://example.com?x=1", OriginError::Query),
            ("https://example.com/?", OriginError::Query),
            ("https://example.com#f", OriginError::Fragment),
            ("https://example.com/#", OriginError::Fragment),
            ("https://", OriginError::EmptyHost),
            ("https://:443", OriginError::EmptyHost),
            ("https://exa_mple.com", OriginError::InvalidHost),
            ("https://-bad.example", OriginError::InvalidHost),
            ("https://a..b", OriginError::InvalidHost),
            ("https://example.com.", OriginError::InvalidHost),
            ("https://127.1", OriginError::InvalidHost),
            ("https://1.2.3.256", OriginError::InvalidHost),
            ("https://[::1", OriginError::InvalidHost),
            ("https://[fe80::1%25eth0]", OriginError::InvalidHost),
            ("https://[::1]x", OriginError::InvalidHost),
            ("https://::1", OriginError::InvalidPort),
            ("https://example.com:", OriginError::InvalidPort),
            ("https://example.com:0", OriginError::InvalidPort),
            ("https://example.com:65536", OriginError::InvalidPort),
            ("https://example.com:+1", OriginError::InvalidPort),
            ("https://example.com:000443", OriginError::InvalidPort),
            ("https://h\u{e9}.example", OriginError::InvalidHost),
            ("https://exa mple.com", OriginError::InvalidHost),
        ];
        for (input, expected) in cases {
            assert_eq!(
                Origin::parse(input).as_ref(),
                Err(expected),
                "input {input:?}"
            );
        }
        let long = format!("https://{}.example", "a".repeat(ORIGIN_MAX_BYTES));
        assert!(matches!(
            Origin::parse(&long),
            Err(OriginError::TooLong { .. })
        ));
    }
}
