//! The `Authorization: Worker ql3w_<credentialId>_<secret>` header (reference §2.1,
//! `workerCredentialToken.ts`): credential id `[A-Za-z0-9][A-Za-z0-9._:-]{0,63}`, secret the
//! canonical base64url of exactly 32 bytes (43 characters).

use alloc::string::String;
use core::fmt;

use base64::Engine as _;
use zeroize::Zeroizing;

use crate::ids::is_token_id;

/// The header scheme and token prefix.
pub(crate) const PREFIX: &str = "Worker ql3w_";

/// Why a credential or header is refused. Never carries the secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// Not `Worker ql3w_…`.
    #[error("authorization must be `Worker ql3w_<credentialId>_<secret>`")]
    Scheme,
    /// The credential id breaks `[A-Za-z0-9][A-Za-z0-9._:-]{0,63}`.
    #[error("credential id must match [A-Za-z0-9][A-Za-z0-9._:-]{{0,63}}")]
    CredentialId,
    /// The secret is not canonical base64url of exactly 32 bytes.
    #[error("credential secret must be canonical base64url of exactly 32 bytes")]
    Secret,
}

/// A Worker credential: id plus 32 secret bytes (zeroized on drop, redacted in `Debug`).
#[derive(Clone, PartialEq, Eq)]
pub struct WorkerCredential {
    credential_id: String,
    secret: Zeroizing<[u8; 32]>,
}

impl fmt::Debug for WorkerCredential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkerCredential")
            .field("credential_id", &self.credential_id)
            .field("secret", &"[redacted]")
            .finish()
    }
}

impl WorkerCredential {
    /// A credential from its id and secret bytes.
    ///
    /// # Errors
    /// [`AuthError::CredentialId`] for an invalid id.
    pub fn new(credential_id: &str, secret: [u8; 32]) -> Result<Self, AuthError> {
        let secret = Zeroizing::new(secret);
        if !is_token_id(credential_id, 64) {
            return Err(AuthError::CredentialId);
        }
        Ok(Self {
            credential_id: String::from(credential_id),
            secret,
        })
    }

    /// The credential id.
    #[must_use]
    pub fn credential_id(&self) -> &str {
        &self.credential_id
    }

    /// The header value `Worker ql3w_<id>_<secret>`; wiped on drop.
    #[must_use]
    pub fn header_value(&self) -> Zeroizing<String> {
        let mut out = Zeroizing::new(String::with_capacity(PREFIX.len() + 64 + 1 + 43));
        out.push_str(PREFIX);
        out.push_str(&self.credential_id);
        out.push('_');
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode_string(*self.secret, &mut out);
        out
    }

    /// Parses and validates a header value exactly as the server does.
    ///
    /// # Errors
    /// [`AuthError`] naming the broken part.
    pub fn parse_header(value: &str) -> Result<Self, AuthError> {
        let rest = value.strip_prefix(PREFIX).ok_or(AuthError::Scheme)?;
        // The id may itself contain `_` (reference: `[A-Za-z0-9][A-Za-z0-9._:-]{0,63}`, e.g.
        // `worker_primary`), so the secret is the last 43 characters, after a `_`.
        match rest.len().checked_sub(44) {
            Some(split) if rest.is_char_boundary(split) && rest.as_bytes()[split] == b'_' => {
                // The id is checked first, then the secret decoded straight into the credential.
                let mut credential = Self::new(&rest[..split], [0; 32])?;
                credential.secret = crate::capability::decode_base64url_32(&rest[split + 1..])
                    .ok_or(AuthError::Secret)?;
                Ok(credential)
            }
            // `<id>_<something>` whose tail is not a 43-character secret, or no `_` at all.
            Some(_) | None if rest.contains('_') => Err(AuthError::Secret),
            Some(_) | None => Err(AuthError::Scheme),
        }
    }
}
