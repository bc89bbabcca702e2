//! systemd's notification protocol (`sd_notify(3)`, `Type=notify`), with std's `UnixDatagram`.
//!
//! `$NOTIFY_SOCKET` names a datagram socket: a path, or `@name` in the abstract namespace. Each
//! notification is one datagram of `KEY=value` lines. The Worker sends `READY=1` once startup
//! reconciliation is done, `STATUS=<one line>` when its summary changes, `WATCHDOG=1` from its
//! loop when `$WATCHDOG_USEC` is set (for this process: `$WATCHDOG_PID`, when set, must be its
//! pid), and `STOPPING=1` when a drain begins. Without `$NOTIFY_SOCKET` nothing is sent.
//!
//! The variables are read once, at start; they are never passed on (supervisors and user
//! commands get an environment built from nothing).

use std::io;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The environment variable naming the socket.
pub const ENV_SOCKET: &str = "NOTIFY_SOCKET";
/// The watchdog interval, µs.
pub const ENV_WATCHDOG_USEC: &str = "WATCHDOG_USEC";
/// The process the watchdog is for.
pub const ENV_WATCHDOG_PID: &str = "WATCHDOG_PID";

/// Where notifications go.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Address {
    Path(PathBuf),
    Abstract(Vec<u8>),
}

/// The notifier of one Worker run.
#[derive(Debug)]
pub struct Notifier {
    target: Option<(UnixDatagram, Address)>,
    watchdog: Option<Duration>,
    last_watchdog: Option<Instant>,
    status: String,
    ready: bool,
    stopping: bool,
}

impl Notifier {
    /// From the process environment (nothing is sent without `$NOTIFY_SOCKET`).
    #[must_use]
    pub fn from_env() -> Self {
        Self::from_vars(
            std::env::var_os(ENV_SOCKET).map(|v| v.into_encoded_bytes()),
            std::env::var(ENV_WATCHDOG_USEC).ok(),
            std::env::var(ENV_WATCHDOG_PID).ok(),
            std::process::id(),
        )
    }

    /// From the given variable values (tests).
    #[must_use]
    pub fn from_vars(
        socket: Option<Vec<u8>>,
        watchdog_usec: Option<String>,
        watchdog_pid: Option<String>,
        pid: u32,
    ) -> Self {
        let address = socket.and_then(|raw| match raw.split_first() {
            Some((b'@', name)) if !name.is_empty() => Some(Address::Abstract(name.to_vec())),
            Some((b'/', _)) => {
                use std::os::unix::ffi::OsStringExt as _;
                Some(Address::Path(PathBuf::from(std::ffi::OsString::from_vec(
                    raw,
                ))))
            }
            _ => None,
        });
        // Non-blocking: a service manager that does not read (a full queue) drops a
        // notification; it never stalls the Worker's loop.
        let target = address.and_then(|a| {
            UnixDatagram::unbound()
                .and_then(|s| s.set_nonblocking(true).map(|()| s))
                .ok()
                .map(|s| (s, a))
        });
        let for_us = watchdog_pid
            .as_deref()
            .is_none_or(|p| p.trim().parse::<u32>().ok() == Some(pid));
        let watchdog = watchdog_usec
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|usec| *usec > 0 && for_us)
            .map(Duration::from_micros);
        Self {
            target,
            watchdog,
            last_watchdog: None,
            status: String::new(),
            ready: false,
            stopping: false,
        }
    }

    /// Whether a socket was given.
    #[must_use]
    pub fn enabled(&self) -> bool {
        self.target.is_some()
    }

    /// The watchdog interval systemd asked for.
    #[must_use]
    pub fn watchdog(&self) -> Option<Duration> {
        self.watchdog
    }

    fn send(&self, message: &str) -> io::Result<()> {
        let Some((socket, address)) = &self.target else {
            return Ok(());
        };
        match address {
            Address::Path(path) => socket.send_to(message.as_bytes(), path).map(drop),
            Address::Abstract(name) => {
                use std::os::linux::net::SocketAddrExt as _;
                let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
                socket.send_to_addr(message.as_bytes(), &addr).map(drop)
            }
        }
    }

    /// `READY=1` (once) with the current status.
    pub fn ready(&mut self, status: &str) {
        if !self.ready {
            self.ready = true;
            self.status = status.to_owned();
            let _ = self.send(&format!("READY=1\nSTATUS={}", one_line(status)));
        }
    }

    /// `STATUS=` when the summary changed.
    pub fn status(&mut self, status: &str) {
        if self.status != status {
            self.status = status.to_owned();
            let _ = self.send(&format!("STATUS={}", one_line(status)));
        }
    }

    /// `STOPPING=1` (once) with the status.
    pub fn stopping(&mut self, status: &str) {
        if !self.stopping {
            self.stopping = true;
            self.status = status.to_owned();
            let _ = self.send(&format!("STOPPING=1\nSTATUS={}", one_line(status)));
        }
    }

    /// `WATCHDOG=1` when half the interval has passed since the last one (systemd's advice).
    pub fn watchdog_tick(&mut self) {
        let Some(interval) = self.watchdog else {
            return;
        };
        let due = self
            .last_watchdog
            .is_none_or(|at| at.elapsed() >= interval / 2);
        if due {
            self.last_watchdog = Some(Instant::now());
            let _ = self.send("WATCHDOG=1");
        }
    }
}

fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receive(socket: &UnixDatagram) -> String {
        let mut buf = [0u8; 512];
        let n = socket.recv(&mut buf).unwrap();
        String::from_utf8(buf[..n].to_vec()).unwrap()
    }

    #[test]
    fn notifications_reach_a_path_socket_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let server = UnixDatagram::bind(&path).unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut n = Notifier::from_vars(
            Some(path.as_os_str().as_encoded_bytes().to_vec()),
            Some(String::from("2000000")),
            None,
            1,
        );
        assert_eq!(n.watchdog(), Some(Duration::from_secs(2)));
        n.ready("ready: 0 records");
        n.ready("again");
        n.status("ready: 0 records");
        n.status("online\nline two");
        n.watchdog_tick();
        n.watchdog_tick();
        n.stopping("draining");
        assert_eq!(receive(&server), "READY=1\nSTATUS=ready: 0 records");
        assert_eq!(receive(&server), "STATUS=online line two");
        assert_eq!(receive(&server), "WATCHDOG=1");
        assert_eq!(receive(&server), "STOPPING=1\nSTATUS=draining");
        server.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 16];
        assert!(server.recv(&mut buf).is_err(), "nothing else was sent");
    }

    #[test]
    fn abstract_sockets_are_reached_and_other_pids_watchdogs_ignored() {
        use std::os::linux::net::SocketAddrExt as _;
        let name = format!("ql-worker-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let server = UnixDatagram::bind_addr(&addr).unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut n = Notifier::from_vars(
            Some(format!("@{name}").into_bytes()),
            Some(String::from("1000000")),
            Some(String::from("999999")),
            1,
        );
        assert_eq!(n.watchdog(), None, "the watchdog is for another process");
        n.ready("up");
        assert_eq!(receive(&server), "READY=1\nSTATUS=up");
    }

    #[test]
    fn a_service_manager_that_does_not_read_never_blocks_the_worker() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("full.sock");
        let _server = UnixDatagram::bind(&path).unwrap();
        let mut n = Notifier::from_vars(
            Some(path.as_os_str().as_encoded_bytes().to_vec()),
            None,
            None,
            1,
        );
        // Far more than the kernel queues (net.unix.max_dgram_qlen is 10 on some hosts).
        for i in 0..2_000 {
            n.status(&format!("status {i}"));
        }
    }

    #[test]
    fn without_a_socket_nothing_is_sent() {
        let mut n = Notifier::from_vars(None, None, None, 1);
        assert!(!n.enabled());
        n.ready("x");
        n.watchdog_tick();
    }
}
