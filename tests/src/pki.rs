//! A throwaway PKI for loopback tests, generated with rcgen into a private directory.
//!
//! Everything is written as PEM, files mode 0600 inside a directory forced to mode 0700.
//! The main CA issues the good server and client certificates plus two deliberately bad
//! server certificates (expired, wrong host name); an unrelated second CA issues a client
//! and a server certificate that nobody trusts.

use std::fs::{DirBuilder, OpenOptions, Permissions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// Host names and addresses the good server certificate is valid for.
pub const SERVER_NAMES: [&str; 3] = ["127.0.0.1", "::1", "localhost"];

/// The only name in the wrong-host server certificate.
pub const WRONG_HOST_NAME: &str = "wrong-host.invalid";

/// A certificate file and its private-key file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertKeyFiles {
    /// PEM certificate.
    pub cert: PathBuf,
    /// PEM PKCS#8 private key (mode 0600).
    pub key: PathBuf,
}

/// Paths of every file the generator wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TestPki {
    /// The private directory holding everything.
    pub dir: PathBuf,
    /// The trusted CA (trust anchor for both sides).
    pub ca: CertKeyFiles,
    /// Server certificate for `127.0.0.1`, `::1` and `localhost`, issued by `ca`.
    pub server: CertKeyFiles,
    /// Client certificate, issued by `ca`.
    pub client: CertKeyFiles,
    /// An unrelated CA nobody trusts.
    pub other_ca: CertKeyFiles,
    /// Client certificate issued by `other_ca`.
    pub other_client: CertKeyFiles,
    /// Server certificate for the loopback names, issued by `other_ca`.
    pub other_server: CertKeyFiles,
    /// Server certificate for the loopback names, issued by `ca`, expired in 2001.
    pub expired_server: CertKeyFiles,
    /// Server certificate issued by `ca` for [`WRONG_HOST_NAME`] only.
    pub wrong_host_server: CertKeyFiles,
    /// A second client certificate for `worker-1`, issued by `ca` (a rotation).
    pub client_rotated: CertKeyFiles,
    /// A client certificate issued by `ca` that expires 5 days after it was generated.
    pub client_expiring: CertKeyFiles,
    /// A client certificate issued by `ca`, expired in 2001.
    pub client_expired: CertKeyFiles,
    /// A client certificate issued by `ca`, valid only from 30 days after it was generated.
    pub client_not_yet_valid: CertKeyFiles,
    /// A certificate issued by `ca` whose extended key usage is serverAuth only.
    pub client_server_auth: CertKeyFiles,
}

impl TestPki {
    /// Generates the whole PKI into `dir` (created if missing, then forced to mode 0700).
    /// Files are created exclusively: an existing file of the same name is an error.
    pub fn generate(dir: &Path) -> io::Result<Self> {
        DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        std::fs::set_permissions(dir, Permissions::from_mode(0o700))?;

        let ca = Ca::new("ql-worker test CA")?;
        let other = Ca::new("ql-worker unrelated CA")?;
        let loopback: Vec<String> = SERVER_NAMES.iter().map(|s| (*s).to_owned()).collect();

        let pki = Self {
            dir: dir.to_owned(),
            ca: ca.write(dir, "ca")?,
            server: ca.issue(dir, "server", Leaf::server(loopback.clone()))?,
            client: ca.issue(dir, "client", Leaf::client("worker-1"))?,
            other_ca: other.write(dir, "other-ca")?,
            other_client: other.issue(dir, "other-client", Leaf::client("intruder"))?,
            other_server: other.issue(dir, "other-server", Leaf::server(loopback.clone()))?,
            expired_server: ca.issue(dir, "expired-server", {
                let mut leaf = Leaf::server(loopback.clone());
                leaf.validity = Some(expired());
                leaf
            })?,
            wrong_host_server: ca.issue(
                dir,
                "wrong-host-server",
                Leaf::server(vec![WRONG_HOST_NAME.to_owned()]),
            )?,
            client_rotated: ca.issue(dir, "client-rotated", Leaf::client("worker-1"))?,
            client_expiring: ca.issue(dir, "client-expiring", {
                let mut leaf = Leaf::client("worker-1");
                let now = time::OffsetDateTime::now_utc();
                leaf.validity =
                    Some((now - time::Duration::days(1), now + time::Duration::days(5)));
                leaf
            })?,
            client_expired: ca.issue(dir, "client-expired", {
                let mut leaf = Leaf::client("worker-1");
                leaf.validity = Some(expired());
                leaf
            })?,
            client_not_yet_valid: ca.issue(dir, "client-not-yet-valid", {
                let mut leaf = Leaf::client("worker-1");
                let now = time::OffsetDateTime::now_utc();
                leaf.validity = Some((
                    now + time::Duration::days(30),
                    now + time::Duration::days(400),
                ));
                leaf
            })?,
            client_server_auth: ca.issue(dir, "client-server-auth", {
                let mut leaf = Leaf::client("worker-1");
                leaf.usage = ExtendedKeyUsagePurpose::ServerAuth;
                leaf
            })?,
        };
        Ok(pki)
    }
}

struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

struct Leaf {
    names: Vec<String>,
    common_name: String,
    usage: ExtendedKeyUsagePurpose,
    /// `notBefore`, `notAfter` (rcgen's defaults when absent).
    validity: Option<(time::OffsetDateTime, time::OffsetDateTime)>,
}

/// 2000-01-01 to 2001-01-01.
fn expired() -> (time::OffsetDateTime, time::OffsetDateTime) {
    (
        rcgen::date_time_ymd(2000, 1, 1),
        rcgen::date_time_ymd(2001, 1, 1),
    )
}

impl Leaf {
    fn server(names: Vec<String>) -> Self {
        Self {
            common_name: names[0].clone(),
            names,
            usage: ExtendedKeyUsagePurpose::ServerAuth,
            validity: None,
        }
    }

    fn client(common_name: &str) -> Self {
        Self {
            names: vec![format!("{common_name}.worker.invalid")],
            common_name: common_name.to_owned(),
            usage: ExtendedKeyUsagePurpose::ClientAuth,
            validity: None,
        }
    }
}

impl Ca {
    fn new(common_name: &str) -> io::Result<Self> {
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(rcgen_err)?;
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().map_err(rcgen_err)?;
        let issuer = CertifiedIssuer::self_signed(params, key).map_err(rcgen_err)?;
        Ok(Self { issuer })
    }

    fn write(&self, dir: &Path, stem: &str) -> io::Result<CertKeyFiles> {
        write_pair(
            dir,
            stem,
            &self.issuer.pem(),
            &self.issuer.key().serialize_pem(),
        )
    }

    fn issue(&self, dir: &Path, stem: &str, leaf: Leaf) -> io::Result<CertKeyFiles> {
        let mut params = CertificateParams::new(leaf.names).map_err(rcgen_err)?;
        params
            .distinguished_name
            .push(DnType::CommonName, leaf.common_name);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![leaf.usage];
        params.use_authority_key_identifier_extension = true;
        if let Some((not_before, not_after)) = leaf.validity {
            params.not_before = not_before;
            params.not_after = not_after;
        }
        let key = KeyPair::generate().map_err(rcgen_err)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(rcgen_err)?;
        write_pair(dir, stem, &cert.pem(), &key.serialize_pem())
    }
}

fn write_pair(dir: &Path, stem: &str, cert_pem: &str, key_pem: &str) -> io::Result<CertKeyFiles> {
    let files = CertKeyFiles {
        cert: dir.join(format!("{stem}.pem")),
        key: dir.join(format!("{stem}-key.pem")),
    };
    write_private(&files.cert, cert_pem.as_bytes())?;
    write_private(&files.key, key_pem.as_bytes())?;
    Ok(files)
}

/// Creates `path` exclusively with mode 0600 and writes `bytes`.
pub fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

fn rcgen_err(e: rcgen::Error) -> io::Error {
    io::Error::other(format!("certificate generation failed: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn generates_private_files_in_a_private_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("pki");
        let pki = TestPki::generate(&dir).unwrap();
        assert_eq!(std::fs::metadata(&dir).unwrap().mode() & 0o777, 0o700);
        let mut count = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let meta = entry.unwrap().metadata().unwrap();
            assert_eq!(meta.mode() & 0o777, 0o600);
            count += 1;
        }
        assert_eq!(count, 26, "13 certificates and their keys");
        let server = std::fs::read_to_string(&pki.server.cert).unwrap();
        assert!(server.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(
            TestPki::generate(&dir).is_err(),
            "files are created exclusively"
        );
    }
}
