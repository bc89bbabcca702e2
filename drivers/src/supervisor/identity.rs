//! Durable process identity (reference §5.3): boot id, pid, process group and start time in
//! clock ticks, read from `/proc`, and its wire form, the `ql3lp1.` executor handle.
//!
//! The handle is `ql3lp1.` + base64url (no padding) of the canonical JSON
//! `{"v":1,"h":<handleId>,"b":<bootId>,"p":<pid>,"g":<pgid>,"s":"<startTicks>"}`, at most 512
//! bytes. Parsing is strict: the decoded JSON must re-encode to exactly the same bytes, so key
//! order, whitespace, escapes and number forms are all pinned.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ql_worker_core::ids::{AttemptId, ExecutorHandle};
use serde::{Deserialize, Serialize};

const ESRCH: i32 = 3;

/// Prefix of every handle this crate writes and accepts.
pub const HANDLE_PREFIX: &str = "ql3lp1.";
/// Largest handle, in bytes (`executorHandle` ≤ 512).
pub const MAX_HANDLE_BYTES: usize = 512;
/// Largest handle id, in bytes.
pub const MAX_HANDLE_ID_BYTES: usize = 255;

/// Where the kernel's process information is mounted. Production uses `/proc`; tests point the
/// identity reader at a fabricated tree to prove failure paths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcRoot(PathBuf);

impl ProcRoot {
    /// The real `/proc`.
    #[must_use]
    pub fn system() -> Self {
        Self(PathBuf::from("/proc"))
    }

    /// Another directory laid out like `/proc` (tests).
    #[must_use]
    pub fn at(path: impl Into<PathBuf>) -> Self {
        Self(path.into())
    }

    /// The directory.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.0
    }

    fn boot_id_path(&self) -> PathBuf {
        self.0.join("sys/kernel/random/boot_id")
    }

    fn stat_path(&self, pid: u32) -> PathBuf {
        self.0.join(pid.to_string()).join("stat")
    }
}

impl Default for ProcRoot {
    fn default() -> Self {
        Self::system()
    }
}

/// The identity of one process, stable for its lifetime and unique across PID reuse and
/// reboots.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessIdentity {
    /// `/proc/sys/kernel/random/boot_id`, `[A-Za-z0-9-]{1,64}`.
    pub boot_id: String,
    /// Process id, ≥ 1.
    pub pid: u32,
    /// Process group id, ≥ 1.
    pub pgid: u32,
    /// Start time in clock ticks since boot (field 22 of `/proc/<pid>/stat`), 1–32 decimal
    /// digits, ≥ 1, kept as text.
    pub start_ticks: String,
}

/// What `/proc/<pid>/stat` says, after the last `)`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct StatLine {
    state: char,
    pgid: u32,
    start_ticks: String,
}

/// Why identity could not be read.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The boot id is unreadable or malformed.
    #[error("boot id unavailable: {0}")]
    BootId(&'static str),
    /// `/proc/<pid>/stat` is missing.
    #[error("process {pid} has no /proc entry")]
    NoProcess {
        /// The pid asked for.
        pid: u32,
    },
    /// `/proc/<pid>/stat` is unreadable or malformed.
    #[error("process {pid} stat unusable: {what}")]
    Stat {
        /// The pid asked for.
        pid: u32,
        /// What is wrong.
        what: &'static str,
    },
}

fn read_boot_id(proc_root: &ProcRoot) -> Result<String, IdentityError> {
    let text = fs::read_to_string(proc_root.boot_id_path())
        .map_err(|_| IdentityError::BootId("unreadable"))?;
    let id = text.trim();
    if is_boot_id(id) {
        Ok(id.to_owned())
    } else {
        Err(IdentityError::BootId("malformed"))
    }
}

fn is_boot_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
}

fn is_start_ticks(text: &str) -> bool {
    (1..=32).contains(&text.len())
        && text.bytes().all(|b| b.is_ascii_digit())
        && text.bytes().any(|b| b != b'0')
        && !text.starts_with('0')
}

fn read_stat(proc_root: &ProcRoot, pid: u32) -> Result<StatLine, IdentityError> {
    let text = match fs::read_to_string(proc_root.stat_path(pid)) {
        Ok(text) => text,
        // ENOENT: no such process. ESRCH: it was reaped between open and read.
        Err(e) if e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(ESRCH) => {
            return Err(IdentityError::NoProcess { pid });
        }
        Err(_) => {
            return Err(IdentityError::Stat {
                pid,
                what: "unreadable",
            });
        }
    };
    parse_stat(&text, pid)
}

fn parse_stat(text: &str, pid: u32) -> Result<StatLine, IdentityError> {
    let bad = |what| IdentityError::Stat { pid, what };
    let (head, tail) = text.rsplit_once(')').ok_or(bad("no command field"))?;
    let (pid_text, _) = head.split_once(" (").ok_or(bad("no pid field"))?;
    if pid_text.parse::<u32>().ok() != Some(pid) {
        return Err(bad("pid differs"));
    }
    let fields: Vec<&str> = tail.split_ascii_whitespace().collect();
    let state = fields
        .first()
        .and_then(|s| {
            let mut chars = s.chars();
            let c = chars.next()?;
            chars.next().is_none().then_some(c)
        })
        .ok_or(bad("no state"))?;
    let pgid = fields
        .get(2)
        .and_then(|s| s.parse::<u32>().ok())
        .filter(|g| *g >= 1)
        .ok_or(bad("no process group"))?;
    let start_ticks = fields
        .get(19)
        .filter(|s| is_start_ticks(s))
        .ok_or(bad("no start time"))?;
    Ok(StatLine {
        state,
        pgid,
        start_ticks: (*start_ticks).to_owned(),
    })
}

/// Reads the identity of a live (or zombie, not yet reaped) process.
///
/// # Errors
/// [`IdentityError`] when the boot id or the stat line cannot be read or parsed.
pub fn capture(proc_root: &ProcRoot, pid: u32) -> Result<ProcessIdentity, IdentityError> {
    let boot_id = read_boot_id(proc_root)?;
    let stat = read_stat(proc_root, pid)?;
    Ok(ProcessIdentity {
        boot_id,
        pid,
        pgid: stat.pgid,
        start_ticks: stat.start_ticks,
    })
}

/// The result of comparing a durable identity with the live system (reference §5.3 inspect).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Inspection {
    /// The exact process is alive.
    Running,
    /// Another boot, no such process, another process under the pid, or a zombie.
    NotRunning,
    /// The system could not be read; nothing may be concluded.
    Unknown(InspectUnknown),
}

/// Why an inspection is inconclusive.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InspectUnknown {
    /// The boot id could not be read.
    ProviderUnavailable,
    /// `/proc/<pid>/stat` exists but could not be read or parsed.
    StatUnreadable,
}

/// Compares `identity` with the live system.
#[must_use]
pub fn inspect(proc_root: &ProcRoot, identity: &ProcessIdentity) -> Inspection {
    let Ok(boot_id) = read_boot_id(proc_root) else {
        return Inspection::Unknown(InspectUnknown::ProviderUnavailable);
    };
    if boot_id != identity.boot_id {
        return Inspection::NotRunning;
    }
    match read_stat(proc_root, identity.pid) {
        Err(IdentityError::NoProcess { .. }) => Inspection::NotRunning,
        Err(IdentityError::BootId(_) | IdentityError::Stat { .. }) => {
            Inspection::Unknown(InspectUnknown::StatUnreadable)
        }
        Ok(stat) => {
            if stat.pgid != identity.pgid
                || stat.start_ticks != identity.start_ticks
                || matches!(stat.state, 'Z' | 'X' | 'x')
            {
                Inspection::NotRunning
            } else {
                Inspection::Running
            }
        }
    }
}

/// A parsed `ql3lp1.` handle.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DurableHandle {
    /// Opaque handle id (the supervisor uses the attempt id), 1–255 bytes, no control characters.
    pub handle_id: String,
    /// The process.
    pub identity: ProcessIdentity,
}

/// The JSON body, in the pinned key order.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HandleJson {
    v: u8,
    h: String,
    b: String,
    p: u32,
    g: u32,
    s: String,
}

/// Why a handle is not acceptable.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HandleError {
    /// Not `ql3lp1.` + canonical base64url + canonical JSON with valid fields, or too long.
    #[error("executor handle is not a canonical ql3lp1 handle")]
    Malformed,
    /// A canonical handle, but of another attempt.
    #[error("executor handle names another attempt")]
    OtherAttempt,
}

impl DurableHandle {
    /// Encodes the handle.
    ///
    /// # Errors
    /// [`HandleError::Malformed`] when a field breaks its rule or the result exceeds 512 bytes.
    pub fn encode(&self) -> Result<ExecutorHandle, HandleError> {
        self.check()?;
        let json = HandleJson {
            v: 1,
            h: self.handle_id.clone(),
            b: self.identity.boot_id.clone(),
            p: self.identity.pid,
            g: self.identity.pgid,
            s: self.identity.start_ticks.clone(),
        };
        let bytes = serde_json::to_vec(&json).map_err(|_| HandleError::Malformed)?;
        let text = format!("{HANDLE_PREFIX}{}", URL_SAFE_NO_PAD.encode(bytes));
        if text.len() > MAX_HANDLE_BYTES {
            return Err(HandleError::Malformed);
        }
        ExecutorHandle::new(text).map_err(|_| HandleError::Malformed)
    }

    /// The one rule for a handle the Worker takes from a supervisor, whether from its launch
    /// report or from the file it published next to the receipt: a canonical handle of exactly
    /// `attempt_id` (the supervisor uses the attempt id as the handle id).
    ///
    /// # Errors
    /// [`HandleError::Malformed`] for anything but a canonical handle;
    /// [`HandleError::OtherAttempt`] for one of another attempt.
    pub fn of_attempt(text: &str, attempt_id: &AttemptId) -> Result<ExecutorHandle, HandleError> {
        let handle = Self::parse(text)?;
        if handle.handle_id != attempt_id.as_str() {
            return Err(HandleError::OtherAttempt);
        }
        // Canonical: re-encodes to exactly `text`.
        handle.encode()
    }

    /// Parses a handle strictly.
    ///
    /// # Errors
    /// [`HandleError::Malformed`] for anything but a canonical handle this module would write.
    pub fn parse(text: &str) -> Result<Self, HandleError> {
        if text.len() > MAX_HANDLE_BYTES {
            return Err(HandleError::Malformed);
        }
        let body = text
            .strip_prefix(HANDLE_PREFIX)
            .ok_or(HandleError::Malformed)?;
        let bytes = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| HandleError::Malformed)?;
        let json: HandleJson =
            serde_json::from_slice(&bytes).map_err(|_| HandleError::Malformed)?;
        if json.v != 1 {
            return Err(HandleError::Malformed);
        }
        let handle = Self {
            handle_id: json.h,
            identity: ProcessIdentity {
                boot_id: json.b,
                pid: json.p,
                pgid: json.g,
                start_ticks: json.s,
            },
        };
        handle.check()?;
        // Canonical form only: the same value must re-encode to the same text.
        if handle.encode()?.as_str() != text {
            return Err(HandleError::Malformed);
        }
        Ok(handle)
    }

    fn check(&self) -> Result<(), HandleError> {
        let id = &self.identity;
        let ok = (1..=MAX_HANDLE_ID_BYTES).contains(&self.handle_id.len())
            && !self.handle_id.chars().any(char::is_control)
            && is_boot_id(&id.boot_id)
            && id.pid >= 1
            && i32::try_from(id.pid).is_ok()
            && id.pgid >= 1
            && i32::try_from(id.pgid).is_ok()
            && is_start_ticks(&id.start_ticks);
        if ok {
            Ok(())
        } else {
            Err(HandleError::Malformed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> DurableHandle {
        DurableHandle {
            handle_id: "attempt-1".into(),
            identity: ProcessIdentity {
                boot_id: "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0".into(),
                pid: 4242,
                pgid: 4242,
                start_ticks: "123456".into(),
            },
        }
    }

    #[test]
    fn handle_round_trips_and_has_the_reference_json() {
        let handle = sample().encode().unwrap();
        assert!(handle.as_str().starts_with("ql3lp1."));
        let json = URL_SAFE_NO_PAD.decode(&handle.as_str()[7..]).unwrap();
        assert_eq!(
            std::str::from_utf8(&json).unwrap(),
            r#"{"v":1,"h":"attempt-1","b":"0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0","p":4242,"g":4242,"s":"123456"}"#
        );
        assert_eq!(DurableHandle::parse(handle.as_str()).unwrap(), sample());
    }

    #[test]
    fn a_supervisors_handle_is_taken_only_for_its_own_attempt() {
        let attempt = |id: &str| AttemptId::new(id).unwrap();
        let mut handle = sample();
        handle.handle_id = String::from("att_1");
        let text = handle.encode().unwrap();
        assert_eq!(
            DurableHandle::of_attempt(text.as_str(), &attempt("att_1")),
            Ok(text.clone())
        );
        assert_eq!(
            DurableHandle::of_attempt(text.as_str(), &attempt("att_2")),
            Err(HandleError::OtherAttempt)
        );
        assert_eq!(
            DurableHandle::of_attempt(&format!("{}=", text.as_str()), &attempt("att_1")),
            Err(HandleError::Malformed)
        );
    }

    #[test]
    fn handle_parse_is_strict() {
        let enc = |json: &str| format!("ql3lp1.{}", URL_SAFE_NO_PAD.encode(json));
        let good = r#"{"v":1,"h":"x","b":"b","p":1,"g":1,"s":"1"}"#;
        assert!(DurableHandle::parse(&enc(good)).is_ok());
        for bad in [
            r#"{"v":2,"h":"x","b":"b","p":1,"g":1,"s":"1"}"#,
            r#"{"h":"x","v":1,"b":"b","p":1,"g":1,"s":"1"}"#,
            r#"{"v":1,"h":"x","b":"b","p":1,"g":1,"s":"1","z":0}"#,
            r#"{"v":1,"h":"x","b":"b","p":1,"g":1,"s":1}"#,
            r#"{"v":1,"h":"x","b":"b","p":0,"g":1,"s":"1"}"#,
            r#"{"v":1,"h":"x","b":"b c","p":1,"g":1,"s":"1"}"#,
            r#"{"v":1,"h":"x","b":"b","p":1,"g":1,"s":"01"}"#,
            r#"{"v":1,"h":"","b":"b","p":1,"g":1,"s":"1"}"#,
            r#"{"v":1, "h":"x","b":"b","p":1,"g":1,"s":"1"}"#,
        ] {
            assert!(DurableHandle::parse(&enc(bad)).is_err(), "{bad}");
        }
        assert!(DurableHandle::parse("ql3lp2.e30").is_err());
        assert!(DurableHandle::parse(&format!("{}=", enc(good))).is_err());
        assert!(DurableHandle::parse(&"ql3lp1.A".repeat(80)).is_err());
    }

    #[test]
    fn stat_parsing_takes_fields_after_the_last_parenthesis() {
        let line = "77 (a) b) (c) S 1 77 77 0 -1 4194560 1 0 0 0 0 0 0 0 20 0 1 0 98765 1 2 3\n";
        let stat = parse_stat(line, 77).unwrap();
        assert_eq!(stat.state, 'S');
        assert_eq!(stat.pgid, 77);
        assert_eq!(stat.start_ticks, "98765");
        assert!(parse_stat(line, 78).is_err());
        assert!(parse_stat("77 (x) S 1", 77).is_err());
    }

    #[test]
    fn own_identity_is_running_and_a_forged_one_is_not() {
        let me = std::process::id();
        let proc_root = ProcRoot::system();
        let identity = capture(&proc_root, me).unwrap();
        assert_eq!(inspect(&proc_root, &identity), Inspection::Running);
        let mut other_ticks = identity.clone();
        other_ticks.start_ticks = "1".into();
        assert_eq!(inspect(&proc_root, &other_ticks), Inspection::NotRunning);
        let mut other_boot = identity;
        other_boot.boot_id = "another-boot".into();
        assert_eq!(inspect(&proc_root, &other_boot), Inspection::NotRunning);
        let missing = ProcRoot::at("/nonexistent-proc-root");
        assert!(matches!(
            capture(&missing, me),
            Err(IdentityError::BootId(_))
        ));
    }
}
