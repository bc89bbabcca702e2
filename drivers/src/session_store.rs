//! The Worker Session id, kept in `<root>/session` across restarts.
//!
//! Inbox records are bound to the Session that claimed them (worker id, session id,
//! generation). A Worker that restarts after a crash must register the **same** Session id, or
//! every record it holds would be fenced. The file is created on the first start, replaced by a
//! new id only after a completed drain (the Session went offline), and holds no secret.

use std::path::Path;

use ql_worker_core::ids::{SessionId, WorkerId};

use crate::fsio::{self, RealFs, StorageError};

/// File name in the state root.
pub use crate::layout::SESSION_FILE;
const HEADER: &str = "ql-worker-session v1";
const MAX_BYTES: usize = 512;

/// The persisted Session identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredSession {
    /// Worker id the Session was created for.
    pub worker_id: WorkerId,
    /// Session id.
    pub session_id: SessionId,
}

/// Why the session file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SessionStoreError {
    /// The file system refused.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The file does not hold a session of this format.
    #[error("{path}: not a ql-worker session file ({rule})")]
    Malformed {
        /// The file.
        path: String,
        /// What is wrong.
        rule: &'static str,
    },
    /// The file belongs to another worker id.
    #[error("{path}: belongs to worker {found}, not {expected}: one state root per worker id")]
    OtherWorker {
        /// The file.
        path: String,
        /// Configured worker id.
        expected: String,
        /// Stored worker id.
        found: String,
    },
    /// The OS RNG failed.
    #[error("getrandom failed: {0}")]
    Entropy(rustix::io::Errno),
}

fn render(session: &StoredSession) -> String {
    format!(
        "{HEADER}\nworker_id={}\nsession_id={}\n",
        session.worker_id, session.session_id
    )
}

fn parse(path: &str, text: &str) -> Result<StoredSession, SessionStoreError> {
    let malformed = |rule| SessionStoreError::Malformed {
        path: path.to_string(),
        rule,
    };
    let mut lines = text.lines();
    if lines.next() != Some(HEADER) {
        return Err(malformed("first line must be the format header"));
    }
    let worker = lines
        .next()
        .and_then(|l| l.strip_prefix("worker_id="))
        .ok_or(malformed("worker_id line"))?;
    let session = lines
        .next()
        .and_then(|l| l.strip_prefix("session_id="))
        .ok_or(malformed("session_id line"))?;
    if lines.next().is_some() {
        return Err(malformed("no lines after session_id"));
    }
    Ok(StoredSession {
        worker_id: WorkerId::new(worker).map_err(|_| malformed("worker_id rule"))?,
        session_id: SessionId::new(session)
            .map_err(|_| malformed("session_id must be a lowercase UUIDv7"))?,
    })
}

/// A fresh lowercase UUIDv7: 48-bit Unix milliseconds, version 7, 74 random bits, variant 10.
///
/// # Errors
/// [`SessionStoreError::Entropy`] when the OS RNG fails.
pub fn new_session_id() -> Result<SessionId, SessionStoreError> {
    let mut bytes = [0u8; 16];
    crate::os::fill_random(&mut bytes).map_err(SessionStoreError::Entropy)?;
    let millis = crate::os::now().get();
    bytes[..6].copy_from_slice(&millis.to_be_bytes()[2..]);
    bytes[6] = (bytes[6] & 0x0f) | 0x70;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    let text = format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    );
    SessionId::new(text).map_err(|_| SessionStoreError::Malformed {
        path: String::from("(generated)"),
        rule: "UUIDv7",
    })
}

/// The stored Session of `worker_id`, or a new one written durably now.
///
/// # Errors
/// [`SessionStoreError`]: storage refused, a malformed file, or a file of another worker.
pub fn load_or_create(
    root: &Path,
    worker_id: &WorkerId,
) -> Result<StoredSession, SessionStoreError> {
    let fs = RealFs;
    let dir = fsio::open_root(&fs, root, true)?;
    let path = dir.child(SESSION_FILE).display().to_string();
    if let Some(bytes) = fsio::read_checked(&fs, &dir, SESSION_FILE, MAX_BYTES)? {
        let text = std::str::from_utf8(&bytes).map_err(|_| SessionStoreError::Malformed {
            path: path.clone(),
            rule: "UTF-8",
        })?;
        let stored = parse(&path, text)?;
        if stored.worker_id != *worker_id {
            return Err(SessionStoreError::OtherWorker {
                path,
                expected: worker_id.to_string(),
                found: stored.worker_id.to_string(),
            });
        }
        return Ok(stored);
    }
    let stored = StoredSession {
        worker_id: worker_id.clone(),
        session_id: new_session_id()?,
    };
    fsio::publish_new(&fs, &dir, SESSION_FILE, render(&stored).as_bytes())?;
    Ok(stored)
}

/// Replaces the stored Session id with `session_id` (same worker id), durably: temp, fsync,
/// rename, directory fsync. The core asks for this once, before it registers a new Session in
/// place of one the control plane holds draining or offline ([`Action::PersistSession`]).
///
/// [`Action::PersistSession`]: ql_worker_core::io::Action::PersistSession
///
/// # Errors
/// [`SessionStoreError`]: storage refused, or the stored file is missing, malformed or belongs
/// to another worker (nothing is written then).
pub fn replace(root: &Path, session_id: &SessionId) -> Result<StoredSession, SessionStoreError> {
    let fs = RealFs;
    let dir = fsio::open_root(&fs, root, false)?;
    let path = dir.child(SESSION_FILE).display().to_string();
    let Some(bytes) = fsio::read_checked(&fs, &dir, SESSION_FILE, MAX_BYTES)? else {
        return Err(SessionStoreError::Malformed {
            path,
            rule: "the session file is missing: only a stored Session can be replaced",
        });
    };
    let text = std::str::from_utf8(&bytes).map_err(|_| SessionStoreError::Malformed {
        path: path.clone(),
        rule: "UTF-8",
    })?;
    let stored = StoredSession {
        worker_id: parse(&path, text)?.worker_id,
        session_id: session_id.clone(),
    };
    fsio::replace(&fs, &dir, SESSION_FILE, render(&stored).as_bytes())?;
    Ok(stored)
}

/// Forgets the Session after a completed drain, so the next start registers a new one.
///
/// # Errors
/// [`SessionStoreError::Storage`].
pub fn forget(root: &Path) -> Result<bool, SessionStoreError> {
    let fs = RealFs;
    let dir = fsio::open_root(&fs, root, false)?;
    Ok(fsio::remove(&fs, &dir, SESSION_FILE)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_generated_session_id_is_a_uuid_v7() {
        let id = new_session_id().unwrap();
        assert_eq!(id.as_str().len(), 36);
        assert_eq!(&id.as_str()[14..15], "7");
        assert_ne!(new_session_id().unwrap(), id);
    }

    #[test]
    fn the_file_format_round_trips_and_rejects_drift() {
        let stored = StoredSession {
            worker_id: WorkerId::new("edge-1").unwrap(),
            session_id: SessionId::new("018f0000-0000-7000-8000-000000000001").unwrap(),
        };
        assert_eq!(parse("s", &render(&stored)).unwrap(), stored);
        assert!(parse("s", "junk").is_err());
        assert!(parse("s", &format!("{}extra\n", render(&stored))).is_err());
    }
}
