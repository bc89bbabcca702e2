//! Metrics (issue 18): a small registry of the Worker's counters, gauges and histograms,
//! rendered in the Prometheus text exposition format (version 0.0.4).
//!
//! No socket is opened by default: the text is written atomically to `[metrics] textfile`
//! (the node_exporter textfile collector convention: a temporary file in the same directory,
//! then a rename onto a name ending in `.prom`), every `[metrics] interval_ms`. An optional
//! listener (`[metrics] listen`, loopback TCP or a Unix socket) serves the same text over HTTP.
//!
//! Every name, label and value is the Worker's own: ids never appear as labels (they would grow
//! the series without bound), and nothing secret is ever a label or a value.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Upper bounds of the fsync latency buckets, in seconds.
pub const FSYNC_BUCKETS: [f64; 12] = [
    0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
];

/// The fsync latency histogram, fed by every `fsync(2)` of the file authority
/// ([`crate::fsio`]), wherever it happens.
pub static FSYNC: Histogram = Histogram::new();

/// A fixed-bucket histogram of durations (lock-free; buckets of [`FSYNC_BUCKETS`]).
#[derive(Debug)]
pub struct Histogram {
    buckets: [AtomicU64; FSYNC_BUCKETS.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    /// An empty histogram.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            buckets: [const { AtomicU64::new(0) }; FSYNC_BUCKETS.len()],
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }

    /// Records one observation.
    pub fn observe(&self, elapsed: Duration) {
        let seconds = elapsed.as_secs_f64();
        for (bucket, bound) in self.buckets.iter().zip(FSYNC_BUCKETS) {
            if seconds <= bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let ns = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Observations so far.
    #[must_use]
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        header(out, name, "histogram", help);
        for (bucket, bound) in self.buckets.iter().zip(FSYNC_BUCKETS) {
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"{bound}\"}} {}",
                bucket.load(Ordering::Relaxed)
            );
        }
        let count = self.count();
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let sum = self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        let _ = writeln!(out, "{name}_sum {sum}");
        let _ = writeln!(out, "{name}_count {count}");
    }
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

/// What the Worker counts. Labels are small closed sets (states, operations, classes).
#[derive(Debug, Default)]
pub struct Registry {
    /// Runs that ended, by outcome (`completed`, `start_failed`, `recovery_required`).
    pub runs: BTreeMap<&'static str, u64>,
    /// Control-plane calls, by operation and result class.
    pub calls: BTreeMap<(String, &'static str), u64>,
    /// 200 answers that broke the wire contract, by operation.
    pub invalid_answers: BTreeMap<&'static str, u64>,
    /// Lease renewals, by result (`renewed`, `stop_requested`, `unavailable`, `refused`,
    /// `fenced`, `invalid`).
    pub renewals: BTreeMap<&'static str, u64>,
    /// Records of the inbox by state, as last seen.
    pub records: BTreeMap<&'static str, u64>,
    /// The Session's status (`registering`, `online`, `draining`, `offline`).
    pub session_status: &'static str,
    /// Admission paused (credentials refused, or registering again after a fence).
    pub admission_paused: bool,
    /// Wall time of the last good heartbeat or register, ms.
    pub last_heartbeat_ms: Option<u64>,
    /// Logs uploaded.
    pub uploads: u64,
    /// Bytes of logs uploaded.
    pub upload_bytes: u64,
    /// Seconds spent uploading logs.
    pub upload_seconds: f64,
    /// The client certificate's notAfter, Unix ms.
    pub certificate_not_after_ms: Option<u64>,
    /// The client certificate expires within the warning window.
    pub certificate_expiring: bool,
    /// SIGHUP reloads, by result (`reloaded`, `unchanged`, `failed`).
    pub tls_reloads: BTreeMap<&'static str, u64>,
    /// A drain is in progress.
    pub draining: bool,
    /// Records that hold the drain.
    pub in_flight: u64,
    /// Records whose last start attempt found them not startable here (another Session's, or
    /// their lease expired) and that have not changed since: dormant, or soon to be.
    pub unstartable: u64,
    /// Removed by retention: records and logs.
    pub retention_records_removed: u64,
    /// Logs removed by retention.
    pub retention_logs_removed: u64,
    /// Facts the core dropped because the driver polled too late.
    pub facts_dropped: u64,
    /// Offers refused for good (their claim cleared, nothing stored or run).
    pub offers_refused: u64,
    /// The inbox's capacity (records).
    pub inbox_capacity: u64,
    /// The inbox had no room at the last Pull decision.
    pub inbox_full: bool,
    /// Pulls held back because the inbox had no room.
    pub pull_deferrals: u64,
    /// Start of this run, Unix ms.
    pub started_ms: u64,
}

/// The shared registry (the loop updates it; a listener thread renders it).
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    inner: Arc<Mutex<Registry>>,
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// A label value escaped for the exposition format.
fn label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

impl Metrics {
    /// An empty registry started at `now_ms`.
    #[must_use]
    pub fn new(now_ms: u64) -> Self {
        let metrics = Self::default();
        metrics.update(|r| {
            r.started_ms = now_ms;
            r.session_status = "registering";
        });
        metrics
    }

    /// Changes the registry.
    pub fn update<R>(&self, f: impl FnOnce(&mut Registry) -> R) -> R {
        f(&mut self.inner.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The exposition text at `now_ms`.
    #[must_use]
    pub fn render(&self, now_ms: u64) -> String {
        let r = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = String::with_capacity(4096);
        let p = "ql_worker";
        header(
            &mut out,
            &format!("{p}_build_info"),
            "gauge",
            "The running ql-worker (always 1).",
        );
        let _ = writeln!(
            out,
            "{p}_build_info{{version=\"{}\"}} 1",
            label(env!("CARGO_PKG_VERSION"))
        );
        header(
            &mut out,
            &format!("{p}_start_time_seconds"),
            "gauge",
            "When this run of the Worker started, Unix seconds.",
        );
        let _ = writeln!(
            out,
            "{p}_start_time_seconds {}",
            r.started_ms as f64 / 1000.0
        );

        header(
            &mut out,
            &format!("{p}_runs_total"),
            "counter",
            "Runs that ended in this run of the Worker, by outcome.",
        );
        for outcome in ["completed", "start_failed", "recovery_required"] {
            let _ = writeln!(
                out,
                "{p}_runs_total{{outcome=\"{outcome}\"}} {}",
                r.runs.get(outcome).copied().unwrap_or(0)
            );
        }

        header(
            &mut out,
            &format!("{p}_calls_total"),
            "counter",
            "Control-plane calls, by operation and result class.",
        );
        for ((operation, result), n) in &r.calls {
            let _ = writeln!(
                out,
                "{p}_calls_total{{operation=\"{}\",result=\"{result}\"}} {n}",
                label(operation)
            );
        }
        header(
            &mut out,
            &format!("{p}_invalid_answers_total"),
            "counter",
            "200 answers that broke the wire contract, by operation.",
        );
        for (operation, n) in &r.invalid_answers {
            let _ = writeln!(
                out,
                "{p}_invalid_answers_total{{operation=\"{operation}\"}} {n}"
            );
        }

        header(
            &mut out,
            &format!("{p}_lease_renewals_total"),
            "counter",
            "Lease-control calls of running Runs, by result.",
        );
        for result in [
            "renewed",
            "stop_requested",
            "unavailable",
            "refused",
            "fenced",
            "invalid",
        ] {
            let _ = writeln!(
                out,
                "{p}_lease_renewals_total{{result=\"{result}\"}} {}",
                r.renewals.get(result).copied().unwrap_or(0)
            );
        }

        header(
            &mut out,
            &format!("{p}_records"),
            "gauge",
            "Inbox records by state, as the Worker last saw them.",
        );
        for state in ql_worker_core::record::State::ALL {
            let name = state.as_str();
            let _ = writeln!(
                out,
                "{p}_records{{state=\"{name}\"}} {}",
                r.records.get(name).copied().unwrap_or(0)
            );
        }

        header(
            &mut out,
            &format!("{p}_session_status"),
            "gauge",
            "The Session's status (1 for the current one).",
        );
        for status in ["registering", "online", "draining", "offline"] {
            let _ = writeln!(
                out,
                "{p}_session_status{{status=\"{status}\"}} {}",
                u8::from(r.session_status == status)
            );
        }
        header(
            &mut out,
            &format!("{p}_admission_paused"),
            "gauge",
            "1 while no new work is taken (credentials refused, or registering again after a \
             fence).",
        );
        let _ = writeln!(out, "{p}_admission_paused {}", u8::from(r.admission_paused));
        header(
            &mut out,
            &format!("{p}_seconds_since_last_heartbeat"),
            "gauge",
            "Seconds since the last good heartbeat or register (since start when none yet).",
        );
        let since = now_ms.saturating_sub(r.last_heartbeat_ms.unwrap_or(r.started_ms));
        let _ = writeln!(
            out,
            "{p}_seconds_since_last_heartbeat {}",
            since as f64 / 1000.0
        );

        FSYNC.render(
            &mut out,
            &format!("{p}_fsync_seconds"),
            "Latency of fsync(2) calls of the state root.",
        );

        header(
            &mut out,
            &format!("{p}_uploads_total"),
            "counter",
            "Logs uploaded.",
        );
        let _ = writeln!(out, "{p}_uploads_total {}", r.uploads);
        header(
            &mut out,
            &format!("{p}_upload_bytes_total"),
            "counter",
            "Bytes of logs uploaded.",
        );
        let _ = writeln!(out, "{p}_upload_bytes_total {}", r.upload_bytes);
        header(
            &mut out,
            &format!("{p}_upload_seconds_total"),
            "counter",
            "Seconds spent uploading logs.",
        );
        let _ = writeln!(out, "{p}_upload_seconds_total {}", r.upload_seconds);

        header(
            &mut out,
            &format!("{p}_client_certificate_not_after_seconds"),
            "gauge",
            "When the client certificate expires, Unix seconds.",
        );
        if let Some(ms) = r.certificate_not_after_ms {
            let _ = writeln!(
                out,
                "{p}_client_certificate_not_after_seconds {}",
                ms as f64 / 1000.0
            );
        }
        header(
            &mut out,
            &format!("{p}_client_certificate_expiring"),
            "gauge",
            "1 when the client certificate expires within the warning window.",
        );
        let _ = writeln!(
            out,
            "{p}_client_certificate_expiring {}",
            u8::from(r.certificate_expiring)
        );
        header(
            &mut out,
            &format!("{p}_tls_reloads_total"),
            "counter",
            "SIGHUP reloads of the TLS material, by result.",
        );
        for result in ["reloaded", "unchanged", "failed"] {
            let _ = writeln!(
                out,
                "{p}_tls_reloads_total{{result=\"{result}\"}} {}",
                r.tls_reloads.get(result).copied().unwrap_or(0)
            );
        }

        header(
            &mut out,
            &format!("{p}_draining"),
            "gauge",
            "1 while a drain is in progress.",
        );
        let _ = writeln!(out, "{p}_draining {}", u8::from(r.draining));
        header(
            &mut out,
            &format!("{p}_in_flight_records"),
            "gauge",
            "Records that hold a drain (a Run that may still run or settle).",
        );
        let _ = writeln!(out, "{p}_in_flight_records {}", r.in_flight);
        header(
            &mut out,
            &format!("{p}_unstartable_records"),
            "gauge",
            "Records found not startable here (start.fenced, start.expired) and unchanged since: \
             dormant once their lease expired; archive them with `ql-worker recover`.",
        );
        let _ = writeln!(out, "{p}_unstartable_records {}", r.unstartable);
        header(
            &mut out,
            &format!("{p}_retention_removed_total"),
            "counter",
            "What retention removed, by kind.",
        );
        let _ = writeln!(
            out,
            "{p}_retention_removed_total{{kind=\"record\"}} {}",
            r.retention_records_removed
        );
        let _ = writeln!(
            out,
            "{p}_retention_removed_total{{kind=\"log\"}} {}",
            r.retention_logs_removed
        );
        header(
            &mut out,
            &format!("{p}_events_total"),
            "counter",
            "Events written to the event log, by level.",
        );
        for level in [
            log::Level::Error,
            log::Level::Warn,
            log::Level::Info,
            log::Level::Debug,
        ] {
            let _ = writeln!(
                out,
                "{p}_events_total{{level=\"{}\"}} {}",
                level.as_str().to_ascii_lowercase(),
                crate::events::written(level)
            );
        }
        header(
            &mut out,
            &format!("{p}_facts_dropped_total"),
            "counter",
            "Facts of the core the driver read too late (the event log missed them).",
        );
        let _ = writeln!(out, "{p}_facts_dropped_total {}", r.facts_dropped);
        header(
            &mut out,
            &format!("{p}_offers_refused_total"),
            "counter",
            "Offers refused for good: their claim cleared, nothing stored or run.",
        );
        let _ = writeln!(out, "{p}_offers_refused_total {}", r.offers_refused);
        header(
            &mut out,
            &format!("{p}_inbox_capacity"),
            "gauge",
            "Records the inbox holds at most.",
        );
        let _ = writeln!(out, "{p}_inbox_capacity {}", r.inbox_capacity);
        header(
            &mut out,
            &format!("{p}_inbox_full"),
            "gauge",
            "1 while the inbox has no room: no offer is taken until retention frees a place.",
        );
        let _ = writeln!(out, "{p}_inbox_full {}", u8::from(r.inbox_full));
        header(
            &mut out,
            &format!("{p}_pull_deferrals_total"),
            "counter",
            "Pulls held back because the inbox had no room.",
        );
        let _ = writeln!(out, "{p}_pull_deferrals_total {}", r.pull_deferrals);
        out
    }
}

/// Writes `text` to `path` atomically: a temporary file beside it (`.<name>.tmp`, which the
/// textfile collector ignores), mode 0644, then a rename. Never follows a symbolic link at the
/// temporary name.
///
/// # Errors
/// The failed call.
pub fn write_textfile(path: &Path, text: &str) -> io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    let mut temp_name = std::ffi::OsString::from(".");
    temp_name.push(name);
    temp_name.push(".tmp");
    let temp = path.with_file_name(temp_name);
    let result = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .custom_flags(rustix::fs::OFlags::NOFOLLOW.bits() as i32)
            .open(&temp)?;
        // The mode whatever the umask: the collector runs as another user.
        rustix::fs::fchmod(&file, rustix::fs::Mode::from_raw_mode(0o644))?;
        file.write_all(text.as_bytes())?;
        drop(file);
        std::fs::rename(&temp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
    result
}

/// Where the optional listener serves the metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// A loopback TCP address.
    Tcp(std::net::SocketAddr),
    /// A Unix socket path (created 0660, removed when the Worker ends).
    Unix(PathBuf),
}

impl Listen {
    /// Parses `127.0.0.1:9464`, `[::1]:9464` or `unix:/run/ql-worker/metrics.sock`.
    ///
    /// # Errors
    /// The rule broken.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some(path) = text.strip_prefix("unix:") {
            let path = PathBuf::from(path);
            if !path.is_absolute() {
                return Err(String::from(
                    "a Unix socket must be an absolute path (unix:/run/ql-worker/metrics.sock)",
                ));
            }
            return Ok(Self::Unix(path));
        }
        let addr: std::net::SocketAddr = text.parse().map_err(|_| {
            String::from(
                "must be a loopback address and port (127.0.0.1:9464, [::1]:9464) or \
                 unix:/absolute/path",
            )
        })?;
        if !addr.ip().is_loopback() {
            return Err(String::from(
                "must be a loopback address (127.0.0.0/8 or ::1): the metrics are served \
                 without TLS or authentication",
            ));
        }
        Ok(Self::Tcp(addr))
    }
}

/// The running listener; dropping it stops the thread and removes a Unix socket.
#[derive(Debug)]
pub struct Listener {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    unix_path: Option<PathBuf>,
    /// Where it listens (the bound address for TCP).
    pub address: String,
}

/// Largest request head read.
const MAX_REQUEST_BYTES: usize = 8 * 1024;

enum Socket {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

impl Listener {
    /// Binds and serves `GET /metrics` (HTTP/1.0, one connection at a time, bounded reads,
    /// answers the current text of `metrics`).
    ///
    /// # Errors
    /// The bind failed.
    pub fn start(listen: &Listen, metrics: Metrics) -> io::Result<Self> {
        let (socket, address, unix_path) = match listen {
            Listen::Tcp(addr) => {
                let l = std::net::TcpListener::bind(addr)?;
                l.set_nonblocking(true)?;
                let address = l.local_addr()?.to_string();
                (Socket::Tcp(l), address, None)
            }
            Listen::Unix(path) => {
                // A stale socket of a previous run (never anything else) is replaced.
                if let Ok(meta) = std::fs::symlink_metadata(path)
                    && std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type())
                {
                    std::fs::remove_file(path)?;
                }
                let l = std::os::unix::net::UnixListener::bind(path)?;
                std::fs::set_permissions(
                    path,
                    std::os::unix::fs::PermissionsExt::from_mode(0o660),
                )?;
                l.set_nonblocking(true)?;
                (
                    Socket::Unix(l),
                    format!("unix:{}", path.display()),
                    Some(path.clone()),
                )
            }
        };
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name(String::from("metrics"))
            .spawn(move || serve(&socket, &metrics, &flag))?;
        Ok(Self {
            stop,
            thread: Some(thread),
            unix_path,
            address,
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        if let Some(path) = &self.unix_path {
            let _ = std::fs::remove_file(path);
        }
    }
}

fn serve(socket: &Socket, metrics: &Metrics, stop: &std::sync::atomic::AtomicBool) {
    while !stop.load(Ordering::SeqCst) {
        let accepted: io::Result<Box<dyn ReadWrite>> = match socket {
            Socket::Tcp(l) => l.accept().map(|(s, _)| Box::new(s) as Box<dyn ReadWrite>),
            Socket::Unix(l) => l.accept().map(|(s, _)| Box::new(s) as Box<dyn ReadWrite>),
        };
        match accepted {
            Ok(mut stream) => {
                let _ = answer(stream.as_mut(), metrics);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

trait ReadWrite: io::Read + io::Write {
    fn prepare(&self) -> io::Result<()>;
}

impl ReadWrite for std::net::TcpStream {
    fn prepare(&self) -> io::Result<()> {
        self.set_nonblocking(false)?;
        self.set_read_timeout(Some(Duration::from_secs(2)))?;
        self.set_write_timeout(Some(Duration::from_secs(2)))
    }
}

impl ReadWrite for std::os::unix::net::UnixStream {
    fn prepare(&self) -> io::Result<()> {
        self.set_nonblocking(false)?;
        self.set_read_timeout(Some(Duration::from_secs(2)))?;
        self.set_write_timeout(Some(Duration::from_secs(2)))
    }
}

fn answer(stream: &mut dyn ReadWrite, metrics: &Metrics) -> io::Result<()> {
    stream.prepare()?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 512];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
        if head.len() > MAX_REQUEST_BYTES {
            return stream.write_all(
                b"HTTP/1.0 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n",
            );
        }
    }
    let line = head.split(|b| *b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, target) = (parts.next(), parts.next());
    let (status, body) = match (method, target) {
        (Some("GET"), Some("/metrics")) => (
            "200 OK",
            metrics.render(crate::os::now().get()).into_bytes(),
        ),
        (Some("GET"), Some(_)) => ("404 Not Found", b"only /metrics\n".to_vec()),
        _ => ("405 Method Not Allowed", b"GET /metrics only\n".to_vec()),
    };
    let mut response = format!(
        "HTTP/1.0 {status}\r\ncontent-type: text/plain; version=0.0.4; charset=utf-8\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    response.extend_from_slice(&body);
    stream.write_all(&response)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped() {
        assert_eq!(label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    #[test]
    fn the_listener_accepts_only_loopback_or_a_unix_path() {
        assert!(matches!(
            Listen::parse("127.0.0.1:9464"),
            Ok(Listen::Tcp(_))
        ));
        assert!(matches!(Listen::parse("[::1]:9464"), Ok(Listen::Tcp(_))));
        assert!(Listen::parse("0.0.0.0:9464").is_err());
        assert!(Listen::parse("10.0.0.1:9464").is_err());
        assert!(Listen::parse("unix:relative").is_err());
        assert!(matches!(
            Listen::parse("unix:/run/m.sock"),
            Ok(Listen::Unix(_))
        ));
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new();
        h.observe(Duration::from_micros(700));
        h.observe(Duration::from_millis(30));
        let mut out = String::new();
        h.render(&mut out, "x", "help");
        assert!(out.contains("x_bucket{le=\"0.0005\"} 0\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.001\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"0.05\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{le=\"+Inf\"} 2\n"), "{out}");
        assert!(out.contains("x_count 2\n"), "{out}");
    }
}
