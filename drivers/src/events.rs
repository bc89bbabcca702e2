//! The event log (issue 18): structured, leveled events on stderr, through the `log` facade.
//!
//! Every event has a stable name (the `event` field, listed in [`EVENTS`] and documented in
//! `docs/operations.md`), a level, a one-line message for people and typed fields for machines.
//! Two renderings, chosen with `--log-format` (journald takes either):
//!
//! * `text` (the default): `ql-worker: warning: <message> [event=<name> key=value …]`;
//! * `json`: one JSON object per line, `{"time":…,"level":…,"event":…,"message":…,<fields>}`.
//!
//! `--log-level` (`error`, `warn`, `info`, `debug`, `trace`) drops what is below it. Records of
//! other crates (rustls logs through the same facade) are shown only at `debug` and below, as
//! event `library`.
//!
//! **Nothing secret is ever a field or in a message**: no Secret value, capability, lease token
//! or credential reaches an [`Event`]. Values come from typed ids, paths, counters and error
//! texts that are themselves secret-free (every error type of the driver keeps that rule); the
//! secret scan (`drivers/tests/secret_scan.rs`, the crash campaign) reads the event log to prove
//! it.

use std::fmt::{self, Write as _};
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};

use log::kv::{Key, Value, VisitSource};
use log::{Level, LevelFilter, Log, Metadata, Record};

/// The target of every event of this crate.
pub const TARGET: &str = "ql_worker::event";

/// The variable through which the Worker hands its log format to its supervisors (their
/// environment is otherwise empty).
pub const ENV_LOG_FORMAT: &str = "QL_WORKER_LOG_FORMAT";

/// The rendering of the event log.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One readable line per event.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

impl Format {
    /// The name, as `--log-format` spells it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Text => "text",
            Self::Json => "json",
        }
    }

    /// Parses a name.
    #[must_use]
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "text" => Some(Self::Text),
            "json" => Some(Self::Json),
            _ => None,
        }
    }
}

/// `--log-level`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LevelArg {
    /// Errors only.
    Error,
    /// Warnings and errors.
    Warn,
    /// Everything an operator should see (the default).
    #[default]
    Info,
    /// Every record transition and call, and other crates' records.
    Debug,
    /// Everything.
    Trace,
}

impl LevelArg {
    /// As the facade's filter.
    #[must_use]
    pub fn filter(self) -> LevelFilter {
        match self {
            Self::Error => LevelFilter::Error,
            Self::Warn => LevelFilter::Warn,
            Self::Info => LevelFilter::Info,
            Self::Debug => LevelFilter::Debug,
            Self::Trace => LevelFilter::Trace,
        }
    }
}

/// Every event name, its level and what it means (the schema; `docs/operations.md` has the same
/// table, and a test keeps the two equal).
pub const EVENTS: &[(&str, Level, &str)] = &[
    (
        "worker.started",
        Level::Info,
        "the Worker runs: id, root, profile",
    ),
    (
        "worker.refused",
        Level::Error,
        "`run` did not start: the file, field or setting and the rule; exit code",
    ),
    (
        "worker.stopped",
        Level::Info,
        "the Worker ends: how, exit code",
    ),
    (
        "containment.warning",
        Level::Warn,
        "what containment does not apply",
    ),
    (
        "signal.ignored",
        Level::Warn,
        "SIGUSR1 or SIGUSR2 was received and ignored",
    ),
    (
        "session.registered",
        Level::Info,
        "the Session is registered: generation, version, status",
    ),
    (
        "session.transitioned",
        Level::Info,
        "the Session moved to draining or offline",
    ),
    (
        "session.transition_failed",
        Level::Warn,
        "the transition to draining or offline got no usable answer",
    ),
    (
        "session.fenced",
        Level::Warn,
        "the Session was fenced; the Worker registers it again",
    ),
    (
        "session.register_failed",
        Level::Warn,
        "a register got no usable answer (or an answer that breaks the contract); it is retried after a growing backoff, never a halt",
    ),
    (
        "session.retiring",
        Level::Warn,
        "the Session is draining or offline at start (an earlier drain did not finish): its live Runs finish under it, then a new Session replaces it",
    ),
    (
        "session.renewed",
        Level::Info,
        "a new Session id replaces a draining or offline one: new work flows",
    ),
    (
        "session.rejoined",
        Level::Info,
        "registered again after a fence: admission resumes",
    ),
    (
        "admission.paused",
        Level::Warn,
        "credentials refused (401/403): no new work until the next authenticated exchange",
    ),
    (
        "admission.resumed",
        Level::Info,
        "an exchange was authenticated again: new work is taken",
    ),
    (
        "reconciliation.done",
        Level::Info,
        "startup reconciliation finished: the Worker is ready",
    ),
    (
        "call.failed",
        Level::Warn,
        "a control-plane call failed: operation, class, status, code, cause",
    ),
    (
        "call.invalid_answer",
        Level::Warn,
        "a control-plane answer broke the wire contract",
    ),
    (
        "credential.unreadable",
        Level::Error,
        "the credential file cannot be used: file and rule",
    ),
    (
        "record.transition",
        Level::Info,
        "an inbox record changed state: offer, Run, Attempt, from, to",
    ),
    (
        "claim.persisted",
        Level::Debug,
        "a pending claim is durable before its Pull is sent",
    ),
    (
        "claim.cleared",
        Level::Debug,
        "the pending claim was cleared",
    ),
    (
        "offer.refused",
        Level::Warn,
        "an offer was refused for good: its claim was cleared, nothing stored or run; offer, reason",
    ),
    (
        "pull.failed",
        Level::Warn,
        "a Pull failed; it is retried after a backoff",
    ),
    (
        "pull.claim_fenced",
        Level::Warn,
        "the control plane fenced the replay of the pending claim (409 worker_offer_fenced); the claim was cleared and the next Pull makes a fresh one",
    ),
    (
        "start.failed",
        Level::Warn,
        "a launch was refused before anything started (a proven start failure)",
    ),
    (
        "start.uncertain",
        Level::Warn,
        "a start-path call may have taken effect but got no usable answer; the record is unchanged and the call retried",
    ),
    (
        "start.fenced",
        Level::Warn,
        "a record cannot start in this Session (another Session's, or this one is draining or its lease ran out); nothing changed; once per record",
    ),
    (
        "start.expired",
        Level::Warn,
        "a record's lease expired before it started: it is dormant; once per record",
    ),
    (
        "launch.unknown",
        Level::Error,
        "a launch outcome is unknown: recovery evidence",
    ),
    (
        "recovery.required",
        Level::Error,
        "a record became recovery_required: reason and the operator's next step",
    ),
    (
        "renewal.failed",
        Level::Warn,
        "a lease renewal got no usable answer or was refused",
    ),
    (
        "renewal.uncertain",
        Level::Warn,
        "a lease renewal may have committed but its answer is unusable; asked again, and a fence then is retried one lease version on",
    ),
    (
        "renewal.fenced",
        Level::Warn,
        "the control plane fenced a lease renewal (409)",
    ),
    (
        "run.published_handle_invalid",
        Level::Warn,
        "the handle a supervisor published before its user command ran is unsafe or garbled: a \
         Run whose record has no handle cannot be stopped by identity",
    ),
    (
        "run.stop_requested",
        Level::Info,
        "the control plane asked to stop a Run; it was stopped",
    ),
    (
        "run.supervisor_gone",
        Level::Warn,
        "a Run's supervisor and user process are gone without a receipt: its lease is no longer \
         renewed and recovery evidence is recorded",
    ),
    (
        "upload.done",
        Level::Info,
        "a Run's log was uploaded: bytes, seconds",
    ),
    (
        "completion.failed",
        Level::Warn,
        "a completion pass did not finish; it is retried",
    ),
    (
        "storage.fault",
        Level::Error,
        "a file of the state root is unsafe or a write failed: path and rule",
    ),
    (
        "inbox.full",
        Level::Warn,
        "the inbox has no room: no offer is taken until retention frees a place",
    ),
    (
        "inbox.room",
        Level::Info,
        "the inbox has room again: offers are taken",
    ),
    (
        "retention.removed",
        Level::Info,
        "retention removed settled records and logs",
    ),
    (
        "retention.failed",
        Level::Warn,
        "a retention sweep failed; settled records and logs are kept",
    ),
    (
        "retention.resumed",
        Level::Info,
        "retention sweeps succeed again",
    ),
    (
        "drain.begun",
        Level::Info,
        "a drain began: records in flight",
    ),
    (
        "drain.progress",
        Level::Info,
        "records still in flight during a drain",
    ),
    (
        "drain.budget_ended",
        Level::Warn,
        "the drain budget ended: the Runs in flight are stopped and completed",
    ),
    (
        "drain.run_stopped",
        Level::Warn,
        "a Run was stopped because the drain budget ended",
    ),
    (
        "tls.reloaded",
        Level::Info,
        "SIGHUP: the TLS material and trust anchors were reloaded",
    ),
    (
        "tls.reload_failed",
        Level::Error,
        "SIGHUP: the new TLS material was refused; the old stays in use",
    ),
    (
        "certificate.expiring",
        Level::Warn,
        "the client certificate expires within the warning window",
    ),
    (
        "certificate.invalid",
        Level::Error,
        "the daily check found the client certificate expired: renew it and send SIGHUP",
    ),
    (
        "control_plane.unreachable",
        Level::Error,
        "TLS or credential failures persisted past the bound: the Worker halts",
    ),
    (
        "metrics.write_failed",
        Level::Warn,
        "the metrics file could not be written",
    ),
    (
        "supervisor.diagnostic",
        Level::Warn,
        "a supervisor's own report (OOM kill, fork limit, leftovers)",
    ),
    (
        "library",
        Level::Debug,
        "a record of another crate (rustls), at debug and below",
    ),
];

static FORMAT: AtomicU8 = AtomicU8::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// Events written, by level (error, warn, info, debug, trace), for the metrics.
static WRITTEN: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];

struct Logger;

static LOGGER: Logger = Logger;

/// Installs the event log on stderr (once per process; later calls change the format and the
/// level only).
pub fn init(format: Format, level: LevelFilter) {
    FORMAT.store(u8::from(format == Format::Json), Ordering::SeqCst);
    if !INSTALLED.swap(true, Ordering::SeqCst) {
        // Only fails when another logger is installed, which this binary never does.
        let _ = log::set_logger(&LOGGER);
    }
    log::set_max_level(level);
}

/// The format in force.
#[must_use]
pub fn format() -> Format {
    if FORMAT.load(Ordering::SeqCst) == 1 {
        Format::Json
    } else {
        Format::Text
    }
}

/// Events written so far at `level`.
#[must_use]
pub fn written(level: Level) -> u64 {
    WRITTEN[level as usize - 1].load(Ordering::Relaxed)
}

impl Log for Logger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.level() <= log::max_level()
            && (metadata.target().starts_with("ql_worker") || metadata.level() >= Level::Debug)
    }

    fn log(&self, record: &Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        let line = render(format(), crate::os::now().get(), record);
        WRITTEN[record.level() as usize - 1].fetch_add(1, Ordering::Relaxed);
        // One write per line; a closed or full stderr is never a reason to stop.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }

    fn flush(&self) {}
}

/// A field's value, typed for JSON.
#[derive(Debug)]
enum Field {
    Text(String),
    Unsigned(u64),
    Signed(i64),
    Flag(bool),
}

struct Collect {
    event: Option<String>,
    fields: Vec<(String, Field)>,
}

impl<'kvs> VisitSource<'kvs> for Collect {
    fn visit_pair(&mut self, key: Key<'kvs>, value: Value<'kvs>) -> Result<(), log::kv::Error> {
        let field = if let Some(v) = value.to_u64() {
            Field::Unsigned(v)
        } else if let Some(v) = value.to_i64() {
            Field::Signed(v)
        } else if let Some(v) = value.to_bool() {
            Field::Flag(v)
        } else if let Some(v) = value.to_borrowed_str() {
            Field::Text(v.to_owned())
        } else {
            Field::Text(value.to_string())
        };
        if key.as_str() == "event"
            && let Field::Text(name) = &field
        {
            self.event = Some(name.clone());
            return Ok(());
        }
        self.fields.push((key.as_str().to_owned(), field));
        Ok(())
    }
}

fn level_name(level: Level) -> &'static str {
    match level {
        Level::Error => "error",
        Level::Warn => "warn",
        Level::Info => "info",
        Level::Debug => "debug",
        Level::Trace => "trace",
    }
}

/// Renders one record as one line (with its newline).
#[must_use]
pub fn render(format: Format, now_ms: u64, record: &Record<'_>) -> String {
    let mut collect = Collect {
        event: None,
        fields: Vec::new(),
    };
    let _ = record.key_values().visit(&mut collect);
    let ours = record.target().starts_with("ql_worker");
    let event = collect.event.unwrap_or_else(|| {
        if ours {
            String::from("worker.message")
        } else {
            collect.fields.push((
                String::from("target"),
                Field::Text(record.target().to_owned()),
            ));
            String::from("library")
        }
    });
    let message = one_line(&record.args().to_string());
    let mut line = String::with_capacity(128);
    match format {
        Format::Text => {
            line.push_str("ql-worker: ");
            match record.level() {
                Level::Error => line.push_str("error: "),
                Level::Warn => line.push_str("warning: "),
                Level::Info => {}
                Level::Debug => line.push_str("debug: "),
                Level::Trace => line.push_str("trace: "),
            }
            line.push_str(&message);
            let _ = write!(line, " [event={event}");
            for (key, value) in &collect.fields {
                let _ = write!(line, " {key}=");
                push_field(&mut line, value, push_text_value);
            }
            line.push(']');
        }
        Format::Json => {
            line.push_str("{\"time\":");
            push_json_string(&mut line, &rfc3339_millis(now_ms));
            line.push_str(",\"level\":");
            push_json_string(&mut line, level_name(record.level()));
            line.push_str(",\"event\":");
            push_json_string(&mut line, &event);
            line.push_str(",\"message\":");
            push_json_string(&mut line, &message);
            for (key, value) in &collect.fields {
                line.push(',');
                push_json_string(&mut line, key);
                line.push(':');
                push_field(&mut line, value, push_json_string);
            }
            line.push('}');
        }
    }
    line.push('\n');
    line
}

/// A message on one line: line breaks and other control characters become spaces.
fn one_line(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// One field's value: text through `text` (quoted as the format needs), numbers and flags as
/// they are.
fn push_field(out: &mut String, value: &Field, text: fn(&mut String, &str)) {
    match value {
        Field::Text(t) => text(out, t),
        Field::Unsigned(v) => {
            let _ = write!(out, "{v}");
        }
        Field::Signed(v) => {
            let _ = write!(out, "{v}");
        }
        Field::Flag(v) => {
            let _ = write!(out, "{v}");
        }
    }
}

fn push_json_string(out: &mut String, text: &str) {
    out.push_str(&serde_json::to_string(text).unwrap_or_else(|_| String::from("\"\"")));
}

/// `value`, or `"value"` (JSON-escaped) when it holds a space, a quote, `=` or `]`.
fn push_text_value(out: &mut String, text: &str) {
    let plain = !text.is_empty()
        && !text
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '=' | ']' | '['));
    if plain {
        out.push_str(text);
    } else {
        push_json_string(out, text);
    }
}

/// `2006-01-02T15:04:05.000Z` of Unix milliseconds (proleptic Gregorian, UTC).
#[must_use]
pub fn rfc3339_millis(ms: u64) -> String {
    let secs = ms / 1000;
    let millis = ms % 1000;
    match time::OffsetDateTime::from_unix_timestamp(i64::try_from(secs).unwrap_or(i64::MAX)) {
        Ok(t) => format!(
            "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{millis:03}Z",
            t.year(),
            u8::from(t.month()),
            t.day(),
            t.hour(),
            t.minute(),
            t.second()
        ),
        Err(_) => format!("{ms}ms"),
    }
}

/// One event being built: its name, level and fields. [`Event::emit`] writes it.
#[derive(Debug)]
#[must_use]
pub struct Event {
    name: &'static str,
    level: Level,
    fields: Vec<(&'static str, Field)>,
}

impl Event {
    /// An event `name` at `level`.
    pub fn new(level: Level, name: &'static str) -> Self {
        debug_assert!(
            EVENTS.iter().any(|(n, _, _)| *n == name),
            "undocumented event {name}"
        );
        Self {
            name,
            level,
            fields: Vec::new(),
        }
    }

    /// An error event.
    pub fn error(name: &'static str) -> Self {
        Self::new(Level::Error, name)
    }

    /// A warning event.
    pub fn warn(name: &'static str) -> Self {
        Self::new(Level::Warn, name)
    }

    /// An informational event.
    pub fn info(name: &'static str) -> Self {
        Self::new(Level::Info, name)
    }

    /// A debug event.
    pub fn debug(name: &'static str) -> Self {
        Self::new(Level::Debug, name)
    }

    /// A text field.
    pub fn text(mut self, key: &'static str, value: impl fmt::Display) -> Self {
        if self.wanted() {
            self.fields.push((key, Field::Text(value.to_string())));
        }
        self
    }

    /// A text field, when present.
    pub fn maybe(self, key: &'static str, value: Option<impl fmt::Display>) -> Self {
        match value {
            Some(value) => self.text(key, value),
            None => self,
        }
    }

    /// A number field.
    pub fn number(mut self, key: &'static str, value: u64) -> Self {
        self.fields.push((key, Field::Unsigned(value)));
        self
    }

    /// A signed number field.
    pub fn signed(mut self, key: &'static str, value: i64) -> Self {
        self.fields.push((key, Field::Signed(value)));
        self
    }

    /// A boolean field.
    pub fn flag(mut self, key: &'static str, value: bool) -> Self {
        self.fields.push((key, Field::Flag(value)));
        self
    }

    fn wanted(&self) -> bool {
        self.level <= log::max_level()
    }

    /// Writes the event with its message.
    pub fn emit(self, message: impl fmt::Display) {
        if !self.wanted() {
            return;
        }
        let mut pairs: Vec<(&str, Value<'_>)> = Vec::with_capacity(self.fields.len() + 1);
        pairs.push(("event", Value::from(self.name)));
        for (key, field) in &self.fields {
            pairs.push((
                key,
                match field {
                    Field::Text(text) => Value::from(text.as_str()),
                    Field::Unsigned(v) => Value::from(*v),
                    Field::Signed(v) => Value::from(*v),
                    Field::Flag(v) => Value::from(*v),
                },
            ));
        }
        let kvs = pairs.as_slice();
        log::logger().log(
            &Record::builder()
                .level(self.level)
                .target(TARGET)
                .key_values(&kvs)
                .args(format_args!("{message}"))
                .build(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record_line(format: Format, fields: &[(&str, Value<'_>)]) -> String {
        let kvs = fields;
        render(
            format,
            86_400_123,
            &Record::builder()
                .level(Level::Warn)
                .target(TARGET)
                .key_values(&kvs)
                .args(format_args!("heartbeat failed:\nTLS"))
                .build(),
        )
    }

    #[test]
    fn text_lines_carry_the_message_then_the_event_and_fields() {
        let line = record_line(
            Format::Text,
            &[
                ("event", Value::from("call.failed")),
                ("operation", Value::from("heartbeat")),
                ("status", Value::from(401u64)),
                ("cause", Value::from("a b")),
            ],
        );
        assert_eq!(
            line,
            "ql-worker: warning: heartbeat failed: TLS [event=call.failed operation=heartbeat \
             status=401 cause=\"a b\"]\n"
        );
    }

    #[test]
    fn json_lines_are_one_object_with_typed_fields() {
        let line = record_line(
            Format::Json,
            &[
                ("event", Value::from("call.failed")),
                ("status", Value::from(401u64)),
                ("paused", Value::from(true)),
                ("code", Value::from("worker_authentication_required")),
            ],
        );
        assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
        let value: serde_json::Value = serde_json::from_str(line.trim_end()).unwrap();
        assert_eq!(value["time"], "1970-01-02T00:00:00.123Z");
        assert_eq!(value["level"], "warn");
        assert_eq!(value["event"], "call.failed");
        assert_eq!(value["message"], "heartbeat failed: TLS");
        assert_eq!(value["status"], 401);
        assert_eq!(value["paused"], true);
        assert_eq!(value["code"], "worker_authentication_required");
    }

    #[test]
    fn event_names_are_unique_and_dotted_snake_case() {
        let mut names: Vec<&str> = EVENTS.iter().map(|(n, _, _)| *n).collect();
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "duplicate event names");
        for name in names {
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_lowercase() || b == b'.' || b == b'_'),
                "{name}"
            );
        }
    }
}
