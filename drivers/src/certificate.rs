//! The Worker's own leaf certificate (issue 18): checked at start, after every SIGHUP reload,
//! and daily while running.
//!
//! * not yet valid, or expired ⇒ refused, with a message naming the file and the dates (at start
//!   the Worker does not start; on reload the old material stays in use);
//! * an extended key usage extension without `clientAuth` (nor `anyExtendedKeyUsage`) ⇒ refused:
//!   the control plane would refuse the handshake. Without the extension the certificate may be
//!   used for any purpose (RFC 5280 §4.2.1.12);
//! * expiring within `[control_plane] certificate_warning_days` ⇒ a warning event and the
//!   `ql_worker_client_certificate_expiring` metric.
//!
//! rustls verifies chains; this module only reads two fields of one certificate.

use std::fmt;

use x509_parser::prelude::{FromDer, X509Certificate};

/// `id-kp-clientAuth`.
const CLIENT_AUTH: &str = "1.3.6.1.5.5.7.3.2";
/// `anyExtendedKeyUsage`.
const ANY_EKU: &str = "2.5.29.37.0";

/// What the leaf says about itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leaf {
    /// `notBefore`, Unix ms.
    pub not_before_ms: i64,
    /// `notAfter`, Unix ms.
    pub not_after_ms: i64,
    /// The extended key usages named, when the extension is present.
    pub extended_key_usage: Option<Vec<String>>,
    /// The subject, as text (for messages).
    pub subject: String,
}

/// Why the leaf is refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum LeafError {
    /// Not parsable as X.509 (rustls accepted it, so this is unexpected).
    #[error("the client certificate cannot be read as X.509: {0}")]
    Unreadable(String),
    /// Before `notBefore`.
    #[error("the client certificate ({subject}) is not valid yet: valid from {not_before}")]
    NotYetValid {
        /// Subject.
        subject: String,
        /// `notBefore`, RFC 3339.
        not_before: String,
    },
    /// After `notAfter`.
    #[error("the client certificate ({subject}) has expired: valid until {not_after}")]
    Expired {
        /// Subject.
        subject: String,
        /// `notAfter`, RFC 3339.
        not_after: String,
    },
    /// Its extended key usage does not allow client authentication.
    #[error(
        "the client certificate ({subject}) may not be used for TLS client authentication: its \
         extended key usage lists {usages} but not clientAuth (1.3.6.1.5.5.7.3.2)"
    )]
    NotForClientAuth {
        /// Subject.
        subject: String,
        /// The usages it names.
        usages: String,
    },
}

/// Within the warning window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Expiring {
    /// Subject.
    pub subject: String,
    /// `notAfter`, Unix ms.
    pub not_after_ms: i64,
    /// Whole days left.
    pub days_left: i64,
}

impl fmt::Display for Expiring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the client certificate ({}) expires in {} day(s), at {}: renew it and send SIGHUP",
            self.subject,
            self.days_left,
            rfc3339(self.not_after_ms)
        )
    }
}

fn rfc3339(ms: i64) -> String {
    crate::events::rfc3339_millis(u64::try_from(ms).unwrap_or(0))
}

impl Leaf {
    /// Reads the leaf from its DER.
    ///
    /// # Errors
    /// [`LeafError::Unreadable`].
    pub fn parse(der: &[u8]) -> Result<Self, LeafError> {
        let (_, cert) =
            X509Certificate::from_der(der).map_err(|e| LeafError::Unreadable(e.to_string()))?;
        let validity = cert.validity();
        let ms = |t: &x509_parser::time::ASN1Time| t.timestamp().saturating_mul(1000);
        let extended_key_usage = match cert.extended_key_usage() {
            Ok(Some(ext)) => {
                let eku = ext.value;
                let mut usages = Vec::new();
                if eku.any {
                    usages.push(String::from(ANY_EKU));
                }
                if eku.server_auth {
                    usages.push(String::from("1.3.6.1.5.5.7.3.1"));
                }
                if eku.client_auth {
                    usages.push(String::from(CLIENT_AUTH));
                }
                if eku.code_signing {
                    usages.push(String::from("1.3.6.1.5.5.7.3.3"));
                }
                if eku.email_protection {
                    usages.push(String::from("1.3.6.1.5.5.7.3.4"));
                }
                if eku.time_stamping {
                    usages.push(String::from("1.3.6.1.5.5.7.3.8"));
                }
                if eku.ocsp_signing {
                    usages.push(String::from("1.3.6.1.5.5.7.3.9"));
                }
                usages.extend(eku.other.iter().map(ToString::to_string));
                Some(usages)
            }
            Ok(None) => None,
            Err(e) => return Err(LeafError::Unreadable(e.to_string())),
        };
        Ok(Self {
            not_before_ms: ms(&validity.not_before),
            not_after_ms: ms(&validity.not_after),
            extended_key_usage,
            subject: cert.subject().to_string(),
        })
    }

    /// Checks the leaf at `now_ms` with a warning window of `window_ms`.
    ///
    /// # Errors
    /// The [`LeafError`] that refuses it.
    pub fn check(&self, now_ms: u64, window_ms: u64) -> Result<Option<Expiring>, LeafError> {
        let now = i64::try_from(now_ms).unwrap_or(i64::MAX);
        if now < self.not_before_ms {
            return Err(LeafError::NotYetValid {
                subject: self.subject.clone(),
                not_before: rfc3339(self.not_before_ms),
            });
        }
        if now > self.not_after_ms {
            return Err(LeafError::Expired {
                subject: self.subject.clone(),
                not_after: rfc3339(self.not_after_ms),
            });
        }
        if let Some(usages) = &self.extended_key_usage
            && !usages.iter().any(|u| u == CLIENT_AUTH || u == ANY_EKU)
        {
            return Err(LeafError::NotForClientAuth {
                subject: self.subject.clone(),
                usages: if usages.is_empty() {
                    String::from("nothing")
                } else {
                    usages.join(", ")
                },
            });
        }
        let left = self.not_after_ms.saturating_sub(now);
        let window = i64::try_from(window_ms).unwrap_or(i64::MAX);
        Ok((left <= window).then(|| Expiring {
            subject: self.subject.clone(),
            not_after_ms: self.not_after_ms,
            days_left: left / 86_400_000,
        }))
    }
}
