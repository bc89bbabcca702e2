//! Client TLS material: certificate chain, private key and trust anchors, loaded from PEM
//! files and validated before ureq ever sees them.
//!
//! Why the validation is done here and not left to ureq (see `reference/rust-dependencies.md`
//! §4.3): ureq 3.5 silently drops trust anchors it cannot parse (every handshake then fails
//! with "unknown issuer", far from the cause) and panics on a certificate/key pair rustls
//! refuses. So every anchor goes through [`RootCertStore::add`], and the pair goes through a
//! real rustls [`ClientConfig`] built with the same TLS 1.3-only provider the agent uses.

use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use rustls::pki_types::pem::{PemObject, SectionKind};
use rustls::pki_types::{
    CertificateDer, PrivateKeyDer, PrivatePkcs1KeyDer, PrivatePkcs8KeyDer, PrivateSec1KeyDer,
};
use rustls::{ClientConfig, RootCertStore};
use sha2::{Digest, Sha256};
use zeroize::{Zeroize, Zeroizing};

use super::tls13_provider;
use crate::config::{self, FileClass, FileProblem};

/// Largest PEM file accepted, in bytes (wire reference §7: TLS material ≤ 1 MiB per item).
pub const MATERIAL_FILE_MAX_BYTES: u64 = 1024 * 1024;

/// Most trust anchors accepted (wire reference §2.1: 1–8 trust anchors).
pub const TRUST_ANCHORS_MAX: usize = 8;

/// Most certificates accepted in the client chain. A leaf plus a few intermediates is normal.
pub const CLIENT_CHAIN_MAX: usize = 8;

/// Domain separator of the material fingerprint, so it can never collide with another hash.
const FINGERPRINT_DOMAIN: &[u8] = b"ql-worker/tls-material-fingerprint/v1\0";

/// Where the material lives on disk. Reloading reads the same paths again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsMaterialPaths {
    /// PEM file with the client certificate chain, leaf first.
    pub cert_chain: PathBuf,
    /// PEM file with exactly one private key (PKCS#8, PKCS#1 or SEC1), unencrypted.
    pub private_key: PathBuf,
    /// PEM files with the trust anchors (CA certificates) for the server certificate; the
    /// files together hold 1 to [`TRUST_ANCHORS_MAX`] certificates.
    pub trust_anchors: Vec<PathBuf>,
}

/// Which file a [`MaterialError`] is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaterialFile {
    /// The client certificate chain.
    CertChain,
    /// The client private key.
    PrivateKey,
    /// A trust-anchor file (index into [`TlsMaterialPaths::trust_anchors`]).
    TrustAnchors(usize),
}

impl fmt::Display for MaterialFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::CertChain => f.write_str("client certificate chain file"),
            Self::PrivateKey => f.write_str("private key file"),
            Self::TrustAnchors(i) => write!(f, "trust anchor file #{i}"),
        }
    }
}

/// Why TLS material was refused. Never carries key bytes or file contents.
///
/// `Display` names the file by its role ("trust anchor file #0"); callers that know the path
/// and the configuration field print [`MaterialError::file`] their way and
/// [`MaterialError::rule`] after it.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MaterialError {
    /// The file could not be opened or read.
    #[error("{file} could not be read ({kind})")]
    Read {
        /// Which file.
        file: MaterialFile,
        /// The I/O error kind.
        kind: std::io::ErrorKind,
    },
    /// The path is not a regular file (a directory, FIFO or device would be refused here).
    #[error("{file} must be a regular file")]
    NotRegularFile {
        /// Which file.
        file: MaterialFile,
    },
    /// The file is a symbolic link, or has an owner or permission bits its rule forbids
    /// ([`crate::config::FileClass`]).
    #[error("{file} {rule}")]
    Unsafe {
        /// Which file.
        file: MaterialFile,
        /// The rule it breaks.
        rule: String,
    },
    /// The file is larger than [`MATERIAL_FILE_MAX_BYTES`].
    #[error("{file} must be at most {max} bytes")]
    TooLarge {
        /// Which file.
        file: MaterialFile,
        /// The limit.
        max: u64,
    },
    /// The file is not valid PEM.
    #[error("{file} is not valid PEM (a -----BEGIN ...----- section could not be decoded)")]
    Pem {
        /// Which file.
        file: MaterialFile,
    },
    /// The file holds a PEM section of the wrong kind (a private key among certificates, a
    /// certificate where the key belongs).
    #[error("{file} holds a {found} section; it must hold {expected}")]
    WrongSection {
        /// Which file.
        file: MaterialFile,
        /// The kind found.
        found: &'static str,
        /// What belongs there.
        expected: &'static str,
    },
    /// The certificate chain file holds no certificate.
    #[error("client certificate chain file must hold at least one certificate")]
    NoCertificate,
    /// The certificate chain holds more than [`CLIENT_CHAIN_MAX`] certificates.
    #[error("client certificate chain must hold at most {max} certificates, got {count}")]
    ChainTooLong {
        /// Certificates found.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// The key file holds no private key.
    #[error("private key file must hold exactly one private key, found none")]
    NoPrivateKey,
    /// The key file holds more than one private key.
    #[error("private key file must hold exactly one private key, found several")]
    MultiplePrivateKeys,
    /// No trust-anchor file was configured.
    #[error("at least one trust anchor file must be configured")]
    NoTrustAnchorFiles,
    /// The trust-anchor files together hold fewer than 1 or more than [`TRUST_ANCHORS_MAX`]
    /// certificates.
    #[error("trust anchor files must hold 1..={max} certificates, got {count}")]
    TrustAnchorCount {
        /// Certificates found.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// rustls refused a trust anchor (not a parsable CA certificate).
    #[error("trust anchor #{index} (in {file}) was refused: {reason}")]
    TrustAnchorRejected {
        /// Position among all anchors, in file order.
        index: usize,
        /// The file it came from.
        file: MaterialFile,
        /// Why, in words (never a debug dump of the library's error).
        reason: String,
    },
    /// rustls refused the certificate/key pair (mismatch, unsupported key type, bad encoding).
    #[error("client certificate and private key were refused together: {reason}")]
    ClientCertificateRejected {
        /// Why, in words (it names the rule, never key material).
        reason: String,
    },
}

impl MaterialError {
    /// The file this error is about, when it is about one file.
    #[must_use]
    pub fn file(&self) -> Option<MaterialFile> {
        match self {
            Self::Read { file, .. }
            | Self::NotRegularFile { file }
            | Self::Unsafe { file, .. }
            | Self::TooLarge { file, .. }
            | Self::Pem { file }
            | Self::WrongSection { file, .. }
            | Self::TrustAnchorRejected { file, .. } => Some(*file),
            Self::NoCertificate | Self::ChainTooLong { .. } => Some(MaterialFile::CertChain),
            Self::NoPrivateKey | Self::MultiplePrivateKeys => Some(MaterialFile::PrivateKey),
            Self::ClientCertificateRejected { .. }
            | Self::NoTrustAnchorFiles
            | Self::TrustAnchorCount { .. } => None,
        }
    }

    /// The rule broken, without the file's role (to follow a caller's own name for the file).
    #[must_use]
    pub fn rule(&self) -> String {
        match self {
            Self::Read { kind, .. } => format!("could not be read ({kind})"),
            Self::NotRegularFile { .. } => String::from("must be a regular file"),
            Self::Unsafe { rule, .. } => rule.clone(),
            Self::TooLarge { max, .. } => format!("must be at most {max} bytes"),
            Self::Pem { .. } => String::from(
                "is not valid PEM (a -----BEGIN ...----- section could not be decoded)",
            ),
            Self::WrongSection {
                found, expected, ..
            } => format!("holds a {found} section; it must hold {expected}"),
            Self::NoCertificate => String::from("must hold at least one certificate"),
            Self::ChainTooLong { count, max } => {
                format!("must hold at most {max} certificates, holds {count}")
            }
            Self::NoPrivateKey => String::from("must hold exactly one private key, holds none"),
            Self::MultiplePrivateKeys => {
                String::from("must hold exactly one private key, holds several")
            }
            Self::NoTrustAnchorFiles => String::from("must list at least one file"),
            Self::TrustAnchorCount { count, max } => format!(
                "must hold 1..={max} CA certificates in all (the files together), hold {count}"
            ),
            Self::TrustAnchorRejected { reason, .. } => {
                format!("holds a certificate that cannot be a trust anchor: {reason}")
            }
            Self::ClientCertificateRejected { reason } => reason.clone(),
        }
    }
}

fn file_error(file: MaterialFile, problem: FileProblem) -> MaterialError {
    match problem {
        FileProblem::Io(e) => MaterialError::Read {
            file,
            kind: e.kind(),
        },
        FileProblem::NotRegular => MaterialError::NotRegularFile { file },
        FileProblem::TooLarge { max } => MaterialError::TooLarge { file, max },
        other @ (FileProblem::Symlink | FileProblem::Owner { .. } | FileProblem::Mode { .. }) => {
            MaterialError::Unsafe {
                file,
                rule: other.to_string(),
            }
        }
    }
}

/// A PEM section kind in words.
fn section_name(kind: SectionKind) -> &'static str {
    match kind {
        SectionKind::Certificate => "CERTIFICATE",
        SectionKind::PublicKey => "PUBLIC KEY",
        SectionKind::RsaPrivateKey => "RSA PRIVATE KEY (a private key)",
        SectionKind::PrivateKey => "PRIVATE KEY (a private key)",
        SectionKind::EcPrivateKey => "EC PRIVATE KEY (a private key)",
        SectionKind::Crl => "X509 CRL",
        SectionKind::Csr => "CERTIFICATE REQUEST",
        SectionKind::EchConfigList => "ECHCONFIG",
        _ => "non-certificate",
    }
}

/// A rustls refusal in words. rustls prints some of its errors with `Debug` formatting
/// (`Other(OtherError(UnsupportedCertVersion))`); operators get a sentence instead.
fn describe_rustls(error: &rustls::Error) -> String {
    use rustls::{CertificateError, Error, InconsistentKeys};
    match error {
        Error::InvalidCertificate(cert) => match cert {
            CertificateError::BadEncoding => {
                String::from("it is not a well-formed X.509 certificate")
            }
            CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                String::from("the certificate has expired")
            }
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                String::from("the certificate is not valid yet")
            }
            CertificateError::BadSignature => {
                String::from("the certificate's signature is invalid")
            }
            CertificateError::UnsupportedSignatureAlgorithmContext { .. }
            | CertificateError::UnsupportedSignatureAlgorithmForPublicKeyContext { .. } => {
                String::from("the certificate uses an unsupported signature algorithm")
            }
            CertificateError::Other(other) => describe_webpki(other.0.as_ref()),
            _ => sentence(&format!("{cert:?}")),
        },
        Error::InconsistentKeys(InconsistentKeys::KeyMismatch) => {
            String::from("the private key does not belong to the client certificate")
        }
        Error::InconsistentKeys(_) => String::from(
            "the private key's public half cannot be compared with the certificate (unsupported key type)",
        ),
        Error::General(text) => text.clone(),
        Error::Other(other) => describe_webpki(other.0.as_ref()),
        _ => sentence(&format!("{error:?}")),
    }
}

fn describe_webpki(error: &(dyn std::error::Error + Send + Sync + 'static)) -> String {
    match error.downcast_ref::<webpki::Error>() {
        Some(webpki::Error::UnsupportedCertVersion) => {
            String::from("it is an X.509 v1 or v2 certificate; it must be an X.509 v3 certificate")
        }
        Some(
            webpki::Error::BadDer | webpki::Error::BadDerTime | webpki::Error::TrailingData(_),
        ) => String::from("it is not a well-formed X.509 certificate (bad DER)"),
        Some(
            webpki::Error::UnsupportedSignatureAlgorithmContext(_)
            | webpki::Error::UnsupportedSignatureAlgorithmForPublicKeyContext(_),
        ) => String::from("the certificate uses an unsupported signature algorithm"),
        Some(webpki::Error::CaUsedAsEndEntity) => String::from(
            "it is a CA certificate; the client certificate must be an end-entity certificate",
        ),
        Some(other) => sentence(&format!("{other:?}")),
        None => sentence(&error.to_string()),
    }
}

/// `UnsupportedCertVersion` → `unsupported cert version`: a library's variant name as words,
/// for errors this module has no sentence for (never a nested debug dump).
fn sentence(debug: &str) -> String {
    let name: String = debug
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric())
        .collect();
    let mut out = String::new();
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push(' ');
        }
        out.push(c.to_ascii_lowercase());
    }
    if out.is_empty() {
        String::from("refused by the TLS library")
    } else {
        format!("refused by the TLS library ({out})")
    }
}

/// The kind of the private key, as its PEM label says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum KeyKind {
    Pkcs1,
    Pkcs8,
    Sec1,
}

/// Validated client TLS material.
///
/// Holds the certificate chain and trust anchors (public) and the private key, whose bytes
/// live in a [`Zeroizing`] buffer that is wiped when the material is dropped. `Debug` shows
/// paths, counts and the fingerprint, never the key.
///
/// The key inevitably also exists inside rustls, ring and ureq once an agent is built from
/// it; those copies are outside this type's control and are not zeroized by those crates.
pub struct TlsMaterial {
    paths: TlsMaterialPaths,
    chain: Vec<CertificateDer<'static>>,
    key_der: Zeroizing<Vec<u8>>,
    key_kind: KeyKind,
    anchors: Vec<CertificateDer<'static>>,
    fingerprint: [u8; 32],
}

impl TlsMaterial {
    /// Reads and validates the material from `paths`.
    pub fn load(paths: &TlsMaterialPaths) -> Result<Self, MaterialError> {
        let chain_pem = read_bounded(
            &paths.cert_chain,
            MaterialFile::CertChain,
            FileClass::Public,
        )?;
        let chain = certificates(&chain_pem, MaterialFile::CertChain)?;
        drop(chain_pem);
        if chain.is_empty() {
            return Err(MaterialError::NoCertificate);
        }
        if chain.len() > CLIENT_CHAIN_MAX {
            return Err(MaterialError::ChainTooLong {
                count: chain.len(),
                max: CLIENT_CHAIN_MAX,
            });
        }

        let key_pem = read_bounded(
            &paths.private_key,
            MaterialFile::PrivateKey,
            FileClass::Secret,
        )?;
        let (key_der, key_kind) = private_key(&key_pem)?;
        drop(key_pem);

        if paths.trust_anchors.is_empty() {
            return Err(MaterialError::NoTrustAnchorFiles);
        }
        let mut anchors = Vec::new();
        let mut anchor_files = Vec::new();
        for (i, path) in paths.trust_anchors.iter().enumerate() {
            let file = MaterialFile::TrustAnchors(i);
            let pem = read_bounded(path, file, FileClass::Public)?;
            let certs = certificates(&pem, file)?;
            anchor_files.extend(std::iter::repeat_n(file, certs.len()));
            anchors.extend(certs);
            if anchors.len() > TRUST_ANCHORS_MAX {
                break;
            }
        }
        if anchors.is_empty() || anchors.len() > TRUST_ANCHORS_MAX {
            return Err(MaterialError::TrustAnchorCount {
                count: anchors.len(),
                max: TRUST_ANCHORS_MAX,
            });
        }

        let material = Self {
            paths: paths.clone(),
            fingerprint: fingerprint(&chain, &key_der, &anchors),
            chain,
            key_der,
            key_kind,
            anchors,
        };
        material.validate_with_rustls().map_err(|e| match e {
            MaterialError::TrustAnchorRejected { index, reason, .. } => {
                MaterialError::TrustAnchorRejected {
                    index,
                    file: anchor_files
                        .get(index)
                        .copied()
                        .unwrap_or(MaterialFile::TrustAnchors(0)),
                    reason,
                }
            }
            other => other,
        })?;
        Ok(material)
    }

    /// Reads the same files again and validates them, returning new material.
    pub fn reload(&self) -> Result<Self, MaterialError> {
        Self::load(&self.paths)
    }

    /// The paths this material was read from.
    pub fn paths(&self) -> &TlsMaterialPaths {
        &self.paths
    }

    /// SHA-256 over the domain tag, then the length-prefixed (u64 big-endian) DER of every
    /// chain certificate, the private key and every trust anchor, each group preceded by its
    /// count. Material that differs in any byte that matters gets a different fingerprint;
    /// PEM whitespace or comments do not change it.
    pub fn fingerprint(&self) -> [u8; 32] {
        self.fingerprint
    }

    /// The DER of the client certificate chain's leaf (the Worker's own certificate).
    pub fn leaf_der(&self) -> &[u8] {
        self.chain.first().map_or(&[], |c| c.as_ref())
    }

    /// Number of certificates in the client chain.
    pub fn chain_len(&self) -> usize {
        self.chain.len()
    }

    /// Number of trust anchors.
    pub fn trust_anchor_count(&self) -> usize {
        self.anchors.len()
    }

    /// The trust anchors as a rustls root store; each was accepted by `RootCertStore::add`.
    pub(crate) fn root_store(&self) -> Result<RootCertStore, MaterialError> {
        let mut roots = RootCertStore::empty();
        for (index, anchor) in self.anchors.iter().enumerate() {
            roots
                .add(anchor.clone())
                .map_err(|e| MaterialError::TrustAnchorRejected {
                    index,
                    file: MaterialFile::TrustAnchors(0),
                    reason: describe_rustls(&e),
                })?;
        }
        Ok(roots)
    }

    /// Builds the same rustls client configuration ureq will build (TLS 1.3-only provider,
    /// these roots, this client certificate), so that anything rustls refuses becomes an
    /// error here instead of a panic inside ureq.
    fn validate_with_rustls(&self) -> Result<(), MaterialError> {
        let roots = self.root_store()?;
        let builder = ClientConfig::builder_with_provider(tls13_provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(|e| MaterialError::ClientCertificateRejected {
                reason: describe_rustls(&e),
            })?
            .with_root_certificates(roots);
        // rustls takes the key by value and does not wipe it when it drops its copy; this
        // copy is the price of pre-validation and is released straight after the call.
        let key = self.rustls_key();
        builder
            .with_client_auth_cert(self.chain.clone(), key)
            .map_err(|e| MaterialError::ClientCertificateRejected {
                reason: describe_rustls(&e),
            })?;
        Ok(())
    }

    fn rustls_key(&self) -> PrivateKeyDer<'static> {
        let der = self.key_der.to_vec();
        match self.key_kind {
            KeyKind::Pkcs1 => PrivateKeyDer::Pkcs1(PrivatePkcs1KeyDer::from(der)),
            KeyKind::Pkcs8 => PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(der)),
            KeyKind::Sec1 => PrivateKeyDer::Sec1(PrivateSec1KeyDer::from(der)),
        }
    }

    /// ureq's view of the client certificate and key.
    ///
    /// ureq 3.5 does not export its key-kind enum, so the key is handed over as a freshly
    /// encoded single-key PEM held in a zeroizing buffer; ureq decodes it into its own copy.
    pub(crate) fn ureq_client_cert(&self) -> Result<ureq::tls::ClientCert, MaterialError> {
        let label = match self.key_kind {
            KeyKind::Pkcs1 => "RSA PRIVATE KEY",
            KeyKind::Pkcs8 => "PRIVATE KEY",
            KeyKind::Sec1 => "EC PRIVATE KEY",
        };
        let b64_len = self.key_der.len().div_ceil(3) * 4;
        let mut pem = Zeroizing::new(String::with_capacity(
            b64_len * 65 / 64 + 2 * label.len() + 64,
        ));
        let mut b64 = Zeroizing::new(String::with_capacity(b64_len));
        base64::engine::general_purpose::STANDARD.encode_string(self.key_der.as_slice(), &mut b64);
        pem.push_str("-----BEGIN ");
        pem.push_str(label);
        pem.push_str("-----\n");
        for line in b64.as_bytes().chunks(64) {
            // INVARIANT: base64 output is ASCII, so every 64-byte slice is valid UTF-8.
            pem.push_str(std::str::from_utf8(line).expect("base64 is ASCII"));
            pem.push('\n');
        }
        pem.push_str("-----END ");
        pem.push_str(label);
        pem.push_str("-----\n");
        let key = ureq::tls::PrivateKey::from_pem(pem.as_bytes()).map_err(|_| {
            MaterialError::ClientCertificateRejected {
                reason: "the private key could not be handed to the HTTP client".into(),
            }
        })?;
        let chain: Vec<ureq::tls::Certificate<'static>> = self
            .chain
            .iter()
            .map(|c| ureq::tls::Certificate::from_der(c.as_ref()).to_owned())
            .collect();
        Ok(ureq::tls::ClientCert::new_with_certs(&chain, key))
    }

    /// ureq's view of the trust anchors (each already accepted by `RootCertStore::add`).
    pub(crate) fn ureq_root_certs(&self) -> ureq::tls::RootCerts {
        let certs: Vec<ureq::tls::Certificate<'static>> = self
            .anchors
            .iter()
            .map(|c| ureq::tls::Certificate::from_der(c.as_ref()).to_owned())
            .collect();
        ureq::tls::RootCerts::new_with_certs(&certs)
    }
}

impl fmt::Debug for TlsMaterial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsMaterial")
            .field("paths", &self.paths)
            .field("chain_len", &self.chain.len())
            .field("private_key", &"<redacted>")
            .field("trust_anchors", &self.anchors.len())
            .field("fingerprint", &hex(&self.fingerprint))
            .finish()
    }
}

/// Reads at most [`MATERIAL_FILE_MAX_BYTES`] from a file that passes `class`'s rules
/// ([`config::open_checked`]: not a symlink, regular, owner, mode) into a zeroizing buffer.
fn read_bounded(
    path: &Path,
    file: MaterialFile,
    class: FileClass,
) -> Result<Zeroizing<Vec<u8>>, MaterialError> {
    config::read_checked(path, class, MATERIAL_FILE_MAX_BYTES).map_err(|p| file_error(file, p))
}

/// Every `CERTIFICATE` section of a PEM buffer; other sections are refused.
fn certificates(
    pem: &[u8],
    file: MaterialFile,
) -> Result<Vec<CertificateDer<'static>>, MaterialError> {
    let mut certs = Vec::new();
    for item in <(SectionKind, Vec<u8>)>::pem_slice_iter(pem) {
        let (kind, mut der) = item.map_err(|_| MaterialError::Pem { file })?;
        match kind {
            SectionKind::Certificate => certs.push(CertificateDer::from(der)),
            other => {
                // A key pasted into a certificate file must not linger in memory either.
                der.zeroize();
                return Err(MaterialError::WrongSection {
                    file,
                    found: section_name(other),
                    expected: "only CERTIFICATE sections",
                });
            }
        }
        if certs.len() > CLIENT_CHAIN_MAX.max(TRUST_ANCHORS_MAX) {
            break;
        }
    }
    Ok(certs)
}

/// Exactly one private key from a PEM buffer, DER in a zeroizing buffer.
fn private_key(pem: &[u8]) -> Result<(Zeroizing<Vec<u8>>, KeyKind), MaterialError> {
    let file = MaterialFile::PrivateKey;
    let mut found: Option<(Zeroizing<Vec<u8>>, KeyKind)> = None;
    for item in <(SectionKind, Vec<u8>)>::pem_slice_iter(pem) {
        let (kind, der) = item.map_err(|_| MaterialError::Pem { file })?;
        let der = Zeroizing::new(der);
        let kind = match kind {
            SectionKind::PrivateKey => KeyKind::Pkcs8,
            SectionKind::RsaPrivateKey => KeyKind::Pkcs1,
            SectionKind::EcPrivateKey => KeyKind::Sec1,
            other => {
                return Err(MaterialError::WrongSection {
                    file,
                    found: section_name(other),
                    expected: "exactly one private key (PRIVATE KEY, RSA PRIVATE KEY or EC \
                               PRIVATE KEY)",
                });
            }
        };
        if found.is_some() {
            return Err(MaterialError::MultiplePrivateKeys);
        }
        found = Some((der, kind));
    }
    found.ok_or(MaterialError::NoPrivateKey)
}

fn fingerprint(
    chain: &[CertificateDer<'static>],
    key_der: &[u8],
    anchors: &[CertificateDer<'static>],
) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(FINGERPRINT_DOMAIN);
    h.update((chain.len() as u64).to_be_bytes());
    for cert in chain {
        h.update((cert.len() as u64).to_be_bytes());
        h.update(cert.as_ref());
    }
    h.update((key_der.len() as u64).to_be_bytes());
    h.update(key_der);
    h.update((anchors.len() as u64).to_be_bytes());
    for anchor in anchors {
        h.update((anchor.len() as u64).to_be_bytes());
        h.update(anchor.as_ref());
    }
    h.finalize().into()
}

/// Lowercase hex of a byte string.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            // INVARIANT: writing to a String cannot fail.
            write!(s, "{b:02x}").expect("write to String");
            s
        })
}
