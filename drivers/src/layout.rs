//! Every path rule of the state root, in one place (docs/storage.md has the picture).
//!
//! ```text
//! <root>/                                      0700, absolute, owned by the effective uid
//!   .owner.lock                                0600, flock(LOCK_EX|LOCK_NB) held for life
//!   pending-claim                              0600, claim envelope
//!   .pending-claim.<32 hex>.tmp                transient
//!   session                                    0600, worker id and Session id
//!   .session.<32 hex>.tmp                      transient
//!   drain                                      0600, empty: a drain request (`ql-worker drain`)
//!   archive/                                   0700, records an operator archived
//!   offers/                                    0700
//!     <offerId>.rec                            0600, inbox record envelope
//!     .<offerId>.rec.<32 hex>.tmp              transient
//!   receipts/                                  0700
//!     <attemptId[0..2]>/                       0700
//!       <attemptId>.rcpt                       0600, receipt envelope
//!       <attemptId>.handle                     0600, the user process's durable handle, published
//!                                              by the supervisor before the user command runs
//!     .quarantine/<attemptId[0..2]>/<attemptId>.rcpt
//!   logs/                                      0700
//!     <logId[5..7]>/                           0700
//!       <logId>.log                            0600, log spool
//!       .<logId>.fact                          0600, truncation fact envelope
//! ```
//!
//! Temp files are `.<target>.<32 hex>.tmp` in the target's own directory, so a link or rename
//! never crosses directories. The 32 hex digits come from the OS RNG.
//!
//! Nothing else may be in the root: any other name, or one of these names of the wrong type (a
//! symlink, a directory where a file belongs), fails closed (`journal::check_root_entries`).
//!
//! Names are built only from validated ids (`OfferId`, `AttemptId`, `LogArtifactId`), whose
//! constructors already restrict them to `[A-Za-z0-9._:-]` and forbid `.` and `..`, so no name
//! built here can contain a `/` or escape its directory.

use std::path::{Component, Path, PathBuf};

use ql_worker_core::ids::{AttemptId, LogArtifactId, OfferId};

/// The owner lock file in the root.
pub const LOCK_FILE: &str = ".owner.lock";
/// The pending claim in the root.
pub const PENDING_CLAIM_FILE: &str = "pending-claim";
/// The Session file in the root.
pub const SESSION_FILE: &str = "session";
/// The drain request file in the root.
pub const DRAIN_FILE: &str = "drain";
/// The directory of archived records in the root.
pub const ARCHIVE_DIR: &str = "archive";
/// The inbox directory in the root.
pub const OFFERS_DIR: &str = "offers";
/// Suffix of an inbox record file.
pub const RECORD_SUFFIX: &str = ".rec";
/// The receipt directory in the root.
pub const RECEIPTS_DIR: &str = "receipts";
/// The quarantine directory inside the receipt directory.
pub const QUARANTINE_DIR: &str = ".quarantine";
/// Suffix of a receipt file.
pub const RECEIPT_SUFFIX: &str = ".rcpt";
/// Suffix of a published handle file (next to the receipt).
pub const HANDLE_SUFFIX: &str = ".handle";
/// The log spool directory in the root.
pub const LOGS_DIR: &str = "logs";
/// Suffix of a log spool file.
pub const LOG_SUFFIX: &str = ".log";
/// Suffix of a truncation fact file (`.<logId>.fact`).
pub const FACT_SUFFIX: &str = ".fact";
/// Suffix of a temp file.
pub const TEMP_SUFFIX: &str = ".tmp";
/// Hex digits of randomness in a temp name.
pub const TEMP_RANDOM_HEX: usize = 32;
/// Longest root path accepted (reference §3.1).
pub const MAX_ROOT_PATH_BYTES: usize = 4096;
/// Mode of every directory we create.
pub const DIR_MODE: u32 = 0o700;
/// Mode of every file we create.
pub const FILE_MODE: u32 = 0o600;
/// Permission bits that must be clear on everything in the root.
pub const GROUP_OTHER_BITS: u32 = 0o077;

/// Why a root path is refused before anything is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RootPathError {
    /// Not absolute.
    NotAbsolute,
    /// Longer than [`MAX_ROOT_PATH_BYTES`].
    TooLong,
    /// Contains NUL, CR or LF, or is not UTF-8.
    BadCharacters,
    /// Contains a `.` or `..` component, or is `/` itself.
    NotNormal,
}

impl RootPathError {
    /// The rule, for messages.
    #[must_use]
    pub const fn rule(self) -> &'static str {
        match self {
            Self::NotAbsolute => "the state root must be an absolute path",
            Self::TooLong => "the state root must be at most 4096 bytes",
            Self::BadCharacters => "the state root must be UTF-8 without NUL, CR or LF",
            Self::NotNormal => "the state root must have no '.' or '..' component and not be '/'",
        }
    }
}

/// Checks the configured root path (reference §3.1: absolute, ≤ 4096, no NUL/CR/LF), plus: no
/// `.`/`..` component, so the path names what it says.
///
/// # Errors
/// The first [`RootPathError`].
pub fn check_root_path(root: &Path) -> Result<(), RootPathError> {
    let Some(text) = root.to_str() else {
        return Err(RootPathError::BadCharacters);
    };
    if !root.is_absolute() {
        return Err(RootPathError::NotAbsolute);
    }
    if text.len() > MAX_ROOT_PATH_BYTES {
        return Err(RootPathError::TooLong);
    }
    if text.bytes().any(|b| matches!(b, 0 | b'\r' | b'\n')) {
        return Err(RootPathError::BadCharacters);
    }
    let normal = root
        .components()
        .skip(1)
        .all(|c| matches!(c, Component::Normal(_)));
    // `Path::components` silently drops interior `.`; look at the text too.
    let dotted = text.split('/').any(|part| part == "." || part == "..");
    if !normal || dotted || root.parent().is_none() {
        return Err(RootPathError::NotNormal);
    }
    Ok(())
}

/// `<offerId>.rec`
#[must_use]
pub fn record_file_name(offer_id: &OfferId) -> String {
    format!("{}{RECORD_SUFFIX}", offer_id.as_str())
}

/// The offer id named by a record file name, or `None` when the name is not `<offerId>.rec`.
#[must_use]
pub fn parse_record_file_name(name: &str) -> Option<OfferId> {
    let stem = name.strip_suffix(RECORD_SUFFIX)?;
    OfferId::new(stem).ok()
}

/// The receipt shard: the first two characters of the attempt id (one for a one-character id,
/// like the reference's `attemptId.slice(0, 2)`). Attempt ids are ASCII, so this is a char
/// boundary, and they start with an alphanumeric, so a shard never starts with a dot.
#[must_use]
pub fn receipt_shard(attempt_id: &AttemptId) -> &str {
    let id = attempt_id.as_str();
    &id[..id.len().min(2)]
}

/// `<attemptId>.handle`: the durable handle the supervisor publishes before the user command
/// runs (issue 16).
#[must_use]
pub fn handle_file_name(attempt_id: &AttemptId) -> String {
    format!("{}{HANDLE_SUFFIX}", attempt_id.as_str())
}

/// `<attemptId>.rcpt`
#[must_use]
pub fn receipt_file_name(attempt_id: &AttemptId) -> String {
    format!("{}{RECEIPT_SUFFIX}", attempt_id.as_str())
}

/// The log shard: characters 5..7 of the log id (the first two hex digits after `wlog-`).
#[must_use]
pub fn log_shard(log_id: &LogArtifactId) -> &str {
    // INVARIANT: a LogArtifactId is `wlog-` + 30 lowercase hex, so 5..7 is in bounds.
    &log_id.as_str()[5..7]
}

/// `<logId>.log`
#[must_use]
pub fn log_file_name(log_id: &LogArtifactId) -> String {
    format!("{}{LOG_SUFFIX}", log_id.as_str())
}

/// `.<logId>.fact`
#[must_use]
pub fn fact_file_name(log_id: &LogArtifactId) -> String {
    format!(".{}{FACT_SUFFIX}", log_id.as_str())
}

/// `.<target>.<32 hex>.tmp`
#[must_use]
pub fn temp_file_name(target: &str, random: &[u8; TEMP_RANDOM_HEX / 2]) -> String {
    let mut name = String::with_capacity(target.len() + TEMP_RANDOM_HEX + 6);
    name.push('.');
    name.push_str(target);
    name.push('.');
    for byte in random {
        name.push(char::from(HEX[usize::from(byte >> 4)]));
        name.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    name.push_str(TEMP_SUFFIX);
    name
}

const HEX: &[u8; 16] = b"0123456789abcdef";

/// The target of a temp file name of our own pattern (`.<target>.<32 lowercase hex>.tmp`), or
/// `None` for any other name. Only such names are ever removed as stale temps.
#[must_use]
pub fn temp_target(name: &str) -> Option<&str> {
    let inner = name.strip_prefix('.')?.strip_suffix(TEMP_SUFFIX)?;
    let (target, random) = inner.rsplit_once('.')?;
    let hex = random.len() == TEMP_RANDOM_HEX
        && random
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    (hex && !target.is_empty()).then_some(target)
}

/// Root-relative paths, for error messages and for callers that want to show where things are.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Paths {
    root: PathBuf,
}

impl Paths {
    /// Paths under `root`.
    #[must_use]
    pub fn new(root: &Path) -> Self {
        Self {
            root: root.to_path_buf(),
        }
    }

    /// The root.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `<root>/.owner.lock`
    #[must_use]
    pub fn lock(&self) -> PathBuf {
        self.root.join(LOCK_FILE)
    }

    /// `<root>/pending-claim`
    #[must_use]
    pub fn pending_claim(&self) -> PathBuf {
        self.root.join(PENDING_CLAIM_FILE)
    }

    /// `<root>/offers`
    #[must_use]
    pub fn offers(&self) -> PathBuf {
        self.root.join(OFFERS_DIR)
    }

    /// `<root>/offers/<offerId>.rec`
    #[must_use]
    pub fn record(&self, offer_id: &OfferId) -> PathBuf {
        self.offers().join(record_file_name(offer_id))
    }

    /// `<root>/receipts`
    #[must_use]
    pub fn receipts(&self) -> PathBuf {
        self.root.join(RECEIPTS_DIR)
    }

    /// `<root>/receipts/<aa>/<attemptId>.rcpt`
    #[must_use]
    pub fn receipt(&self, attempt_id: &AttemptId) -> PathBuf {
        self.receipts()
            .join(receipt_shard(attempt_id))
            .join(receipt_file_name(attempt_id))
    }

    /// `<root>/receipts/<aa>/<attemptId>.handle`
    #[must_use]
    pub fn published_handle(&self, attempt_id: &AttemptId) -> PathBuf {
        self.receipts()
            .join(receipt_shard(attempt_id))
            .join(handle_file_name(attempt_id))
    }

    /// `<root>/receipts/.quarantine/<aa>/<attemptId>.rcpt`
    #[must_use]
    pub fn quarantined_receipt(&self, attempt_id: &AttemptId) -> PathBuf {
        self.receipts()
            .join(QUARANTINE_DIR)
            .join(receipt_shard(attempt_id))
            .join(receipt_file_name(attempt_id))
    }

    /// `<root>/logs`
    #[must_use]
    pub fn logs(&self) -> PathBuf {
        self.root.join(LOGS_DIR)
    }

    /// `<root>/logs/<shard>/<logId>.log`
    #[must_use]
    pub fn log(&self, log_id: &LogArtifactId) -> PathBuf {
        self.logs()
            .join(log_shard(log_id))
            .join(log_file_name(log_id))
    }

    /// `<root>/logs/<shard>/.<logId>.fact`
    #[must_use]
    pub fn fact(&self, log_id: &LogArtifactId) -> PathBuf {
        self.logs()
            .join(log_shard(log_id))
            .join(fact_file_name(log_id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_path_rules() {
        assert_eq!(check_root_path(Path::new("/var/lib/ql")), Ok(()));
        assert_eq!(
            check_root_path(Path::new("var/lib")),
            Err(RootPathError::NotAbsolute)
        );
        assert_eq!(
            check_root_path(Path::new("/var/../etc")),
            Err(RootPathError::NotNormal)
        );
        assert_eq!(
            check_root_path(Path::new("/var/./lib")),
            Err(RootPathError::NotNormal)
        );
        assert_eq!(
            check_root_path(Path::new("/")),
            Err(RootPathError::NotNormal)
        );
        assert_eq!(
            check_root_path(Path::new("/a\nb")),
            Err(RootPathError::BadCharacters)
        );
        let long = format!("/{}", "a".repeat(MAX_ROOT_PATH_BYTES));
        assert_eq!(
            check_root_path(Path::new(&long)),
            Err(RootPathError::TooLong)
        );
    }

    #[test]
    fn temp_names_round_trip_and_foreign_names_are_not_temps() {
        let name = temp_file_name("offer-1.rec", &[0xab; 16]);
        assert_eq!(name, format!(".offer-1.rec.{}.tmp", "ab".repeat(16)));
        assert_eq!(temp_target(&name), Some("offer-1.rec"));
        for foreign in [
            "offer-1.rec",
            ".offer-1.rec.tmp",
            &format!(".offer-1.rec.{}.tmp", "AB".repeat(16)),
            &format!(".offer-1.rec.{}.tmp", "a".repeat(31)),
            &format!("..{}.tmp", "a".repeat(32)),
        ] {
            assert_eq!(temp_target(foreign), None, "{foreign}");
        }
    }

    #[test]
    fn record_names_parse_only_valid_offer_ids() {
        let id = OfferId::new("offer-000001").unwrap();
        assert_eq!(parse_record_file_name(&record_file_name(&id)), Some(id));
        assert_eq!(parse_record_file_name("offer-1.json"), None);
        assert_eq!(parse_record_file_name(".rec"), None);
        assert_eq!(parse_record_file_name("...rec"), None);
    }

    #[test]
    fn shards() {
        let log = LogArtifactId::new("wlog-0123456789abcdef0123456789abcd").unwrap();
        assert_eq!(log_shard(&log), "01");
        assert_eq!(
            Paths::new(Path::new("/r")).fact(&log),
            Path::new("/r/logs/01/.wlog-0123456789abcdef0123456789abcd.fact")
        );
        assert_eq!(receipt_shard(&AttemptId::new("a").unwrap()), "a");
        assert_eq!(receipt_shard(&AttemptId::new("attempt-1").unwrap()), "at");
    }
}
