//! The one blocking driver loop: it feeds the core facts from the effects, executes its
//! commands one at a time, and sleeps until the earliest `wake_at` the core reports (or an
//! operator signal). It mirrors the numbered loop in `ql_worker_core::worker`.
//!
//! Signals: the first `SIGTERM`/`SIGINT` (or a `<root>/drain` file, written by
//! `ql-worker drain`) asks the core to drain; a second signal stops at once, leaving every
//! record for the next start. `SIGHUP` reloads the TLS material and trust anchors. Supervisors
//! are independent processes and keep running.
//!
//! Around the core, the loop also keeps the operator informed (issue 18): the core's facts and
//! the effects' observations become events and metrics ([`crate::telemetry`]), the metrics file
//! is refreshed every `[metrics] interval_ms`, systemd hears `READY=1` once reconciliation is
//! done, `STATUS=`, `WATCHDOG=1` and `STOPPING=1` ([`crate::notify`]), and the client certificate
//! is checked daily ([`crate::certificate`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ql_worker_core::io::{Input, OpId};
use ql_worker_core::time::{MonoMillis, Now};
use ql_worker_core::worker::{HaltReason, Output, Phase, StopReason, Worker, WorkerConfig};

use crate::calls::Calls;
use crate::certificate::Leaf;
use crate::config::{Config, MetricsSettings};
use crate::events::Event;
use crate::host::Event as Observed;
use crate::host::{Host, HostError};
use crate::https::{
    HttpsClient, MaterialError, MaterialFile, Origin, RequestTimeout, TlsMaterial, TlsMaterialPaths,
};
use crate::journal::Journal;
use crate::retention::{self, RetentionPolicy, Scope};
use crate::session_store;
use crate::supervisor::{StopController, SupervisorExecutor, SupervisorImage};
use ql_worker_core::retention::SweepKey;

/// File whose presence in the state root asks the running Worker to drain.
pub use crate::layout::DRAIN_FILE;
/// Longest uninterrupted sleep, so the drain file is noticed promptly (signals, finished calls
/// and exiting supervisors wake the loop at once).
const SLEEP_SLICE: Duration = Duration::from_millis(100);
/// Interval of the full retention sweeps (logs and archive included); the inbox's own sweep runs
/// whenever it holds more than `high_water_records`.
const RETENTION_EVERY_MS: u64 = 60_000;
/// Interval of the client certificate's check while running.
const CERTIFICATE_CHECK_EVERY_MS: u64 = 86_400_000;

/// How a run of the Worker ended.
#[derive(Debug)]
pub enum RunExit {
    /// Drained: every record settled, the Session is offline (or left to expire when the
    /// control plane could not be reached for the last transition).
    Drained,
    /// The drain ended with records this Worker could not settle (recovery evidence, records
    /// that never launched); they stay for the next start.
    Unsettled,
    /// The drain came before the Session was ever registered: nothing was started by this run.
    NotRegistered,
    /// A second signal: stopped at once; records stay for the next start.
    Interrupted,
    /// The core halted on a fact it cannot continue from.
    Halted(HaltReason),
    /// The effects hit a fatal fault (durability unknown).
    Fatal(String),
    /// The state root stopped being usable while running (the owner lock was deleted or
    /// replaced, an unsafe entry at `<root>/drain`): stopped at once.
    Unusable(String),
}

/// A start-up failure. Every configuration check runs before anything is created or written,
/// so a [`StartError::ControlPlane`], [`StartError::Capabilities`] or [`StartError::Image`]
/// changed nothing on disk.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The journal could not be opened (unsafe storage, or another owner).
    #[error("{0}")]
    Journal(#[from] crate::journal::JournalError),
    /// The Session file is unusable.
    #[error("{0}")]
    Session(#[from] session_store::SessionStoreError),
    /// TLS material, origin, credential or client settings are invalid (the message names the
    /// file, the field or environment variable, and the rule).
    #[error("{0}")]
    ControlPlane(String),
    /// The supervisor image could not be opened.
    #[error("cannot open this executable for the supervisor: {0}")]
    Image(std::io::Error),
    /// The configured capabilities are invalid.
    #[error("capabilities: {0}")]
    Capabilities(String),
    /// Containment cannot be set up (`[run_as]`, the runs area, a required cgroup).
    #[error("{path}: {field}: {rule}")]
    Containment {
        /// The configuration file.
        path: String,
        /// The field, dotted.
        field: &'static str,
        /// The rule.
        rule: String,
    },
}

impl StartError {
    /// Whether the state root is what is wrong (exit 3), rather than the configuration (2).
    #[must_use]
    pub fn is_storage(&self) -> bool {
        matches!(self, Self::Journal(_) | Self::Session(_))
    }
}

/// Operator requests: signals counted by a watcher thread, and the drain file.
#[derive(Clone, Debug, Default)]
pub struct Signals {
    count: Arc<AtomicUsize>,
    reloads: Arc<AtomicUsize>,
    /// Wakes the running loop when a drain, stop or reload request arrives.
    waker: Arc<Mutex<Option<crate::calls::Waker>>>,
}

/// The name of a signal this module handles.
fn signal_name(signal: i32) -> &'static str {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
    match signal {
        SIGTERM => "SIGTERM",
        SIGINT => "SIGINT",
        SIGHUP => "SIGHUP",
        SIGUSR1 => "SIGUSR1",
        SIGUSR2 => "SIGUSR2",
        _ => "a signal",
    }
}

impl Signals {
    /// Counts `SIGTERM` and `SIGINT` from now on (the first drains, the second stops); counts
    /// `SIGHUP` as a reload request (TLS material and trust anchors); `SIGUSR1` and `SIGUSR2`
    /// are caught, reported and otherwise ignored, so none of them kills the Worker without a
    /// word.
    ///
    /// # Errors
    /// The OS refused to install the handlers.
    pub fn install() -> std::io::Result<Self> {
        use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM, SIGUSR1, SIGUSR2};
        Self::install_full(&[SIGTERM, SIGINT], &[SIGHUP], &[SIGUSR1, SIGUSR2])
    }

    /// Counts every signal of `counted`; reports and ignores every signal of `ignored`.
    ///
    /// # Errors
    /// The OS refused to install the handlers.
    pub fn install_with(counted: &[i32], ignored: &[i32]) -> std::io::Result<Self> {
        Self::install_full(counted, &[], ignored)
    }

    /// Counts `counted` (drain, then stop) and `reload` (reload requests) separately; reports
    /// and ignores `ignored`.
    ///
    /// # Errors
    /// The OS refused to install the handlers.
    pub fn install_full(counted: &[i32], reload: &[i32], ignored: &[i32]) -> std::io::Result<Self> {
        let count = Arc::new(AtomicUsize::new(0));
        let reloads = Arc::new(AtomicUsize::new(0));
        let mut signals = signal_hook::iterator::Signals::new(
            counted.iter().chain(reload).chain(ignored).copied(),
        )?;
        let seen = Arc::clone(&count);
        let reloaded = Arc::clone(&reloads);
        let waker: Arc<Mutex<Option<crate::calls::Waker>>> = Arc::default();
        let wakes = Arc::clone(&waker);
        let counted = counted.to_vec();
        let reload = reload.to_vec();
        let drain_names: Vec<&str> = counted.iter().map(|&s| signal_name(s)).collect();
        let hint = drain_names.join(" or ");
        std::thread::Builder::new()
            .name(String::from("signals"))
            .spawn(move || {
                for signal in signals.forever() {
                    if counted.contains(&signal) {
                        seen.fetch_add(1, Ordering::SeqCst);
                        wake(&wakes);
                    } else if reload.contains(&signal) {
                        reloaded.fetch_add(1, Ordering::SeqCst);
                        wake(&wakes);
                    } else {
                        Event::warn("signal.ignored")
                            .text("signal", signal_name(signal))
                            .emit(format_args!(
                                "received {}: ignored ({hint} drains; a second one stops at once)",
                                signal_name(signal)
                            ));
                    }
                }
            })?;
        Ok(Self {
            count,
            reloads,
            waker,
        })
    }

    /// From now on, every request also wakes the loop through `waker`.
    pub fn set_waker(&self, waker: crate::calls::Waker) {
        *self
            .waker
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(waker);
    }

    /// Signals seen so far.
    #[must_use]
    pub fn seen(&self) -> usize {
        self.count.load(Ordering::SeqCst)
    }

    /// Reload requests (SIGHUP) seen so far.
    #[must_use]
    pub fn reloads(&self) -> usize {
        self.reloads.load(Ordering::SeqCst)
    }

    /// Records one request (tests and the demo).
    pub fn raise(&self) {
        self.count.fetch_add(1, Ordering::SeqCst);
        wake(&self.waker);
    }
}

/// Wakes the loop, when one is running.
fn wake(waker: &Mutex<Option<crate::calls::Waker>>) {
    if let Some(waker) = waker
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .as_ref()
    {
        waker.wake();
    }
}

/// Everything one Worker run needs.
pub struct Runner {
    worker: Worker,
    host: Host<SupervisorExecutor>,
    /// The control-plane calls in flight on their threads (see [`crate::calls`]).
    calls: Calls,
    root: PathBuf,
    retention: RetentionPolicy,
    signals: Signals,
    drain_sent: bool,
    next_retention_at: MonoMillis,
    /// What the last sweep saw (see `retention::due`).
    last_swept: Option<SweepKey>,
    /// Whether the last "inbox full" event said full.
    reported_full: bool,
    /// The Session id and retiring state last reported (events on change).
    reported_session: (ql_worker_core::ids::SessionId, bool),
    containment_warnings: Vec<String>,
    /// The last retention failure reported (each distinct one is reported once).
    retention_failure: Option<String>,
    /// systemd notifications.
    notifier: crate::notify::Notifier,
    /// `[metrics]`.
    metrics: MetricsSettings,
    next_metrics_at: MonoMillis,
    /// The last metrics-file failure reported (each distinct one once).
    metrics_failure: Option<String>,
    /// The optional listener (kept alive with the run).
    listener: Option<crate::metrics::Listener>,
    /// SIGHUP requests handled so far.
    reloads_handled: usize,
    /// The client certificate's checks.
    certificate: CertificateWatch,
    /// `control_plane.give_up_after_ms`.
    give_up_after_ms: u64,
    /// Reconciliation finished (READY=1 sent).
    ready: bool,
}

/// The client certificate as last loaded, and when it is checked next.
#[derive(Debug)]
struct CertificateWatch {
    leaf: Option<Leaf>,
    window_ms: u64,
    next_check_at: MonoMillis,
    /// The path, for messages.
    path: PathBuf,
}

impl CertificateWatch {
    /// Checks the leaf now: a refusal is a message; a warning is an event and a metric.
    fn check(&mut self, now: Now, telemetry: &crate::telemetry::Telemetry) -> Option<String> {
        self.next_check_at = now.mono.saturating_add(CERTIFICATE_CHECK_EVERY_MS);
        let now = now.wall;
        let leaf = self.leaf.as_ref()?;
        telemetry.metrics().update(|r| {
            r.certificate_not_after_ms = u64::try_from(leaf.not_after_ms).ok();
        });
        match leaf.check(now.get(), self.window_ms) {
            Ok(expiring) => {
                telemetry
                    .metrics()
                    .update(|r| r.certificate_expiring = expiring.is_some());
                if let Some(expiring) = expiring {
                    Event::warn("certificate.expiring")
                        .text("file", self.path.display())
                        .signed("days_left", expiring.days_left)
                        .text(
                            "not_after",
                            crate::events::rfc3339_millis(
                                u64::try_from(expiring.not_after_ms).unwrap_or(0),
                            ),
                        )
                        .emit(format_args!("{}: {expiring}", self.path.display()));
                }
                None
            }
            Err(e) => Some(format!("{}: {e}", self.path.display())),
        }
    }
}

impl std::fmt::Debug for Runner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runner")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

/// The core configuration for `config` and a Session id.
///
/// # Errors
/// Capabilities that do not normalize.
pub fn worker_config(
    config: &Config,
    session_id: ql_worker_core::ids::SessionId,
) -> Result<WorkerConfig, StartError> {
    let capabilities = config.capabilities.clone();
    capabilities
        .canonical_json()
        .map_err(|e| StartError::Capabilities(e.to_string()))?;
    let l = &config.limits;
    Ok(WorkerConfig {
        worker_id: config.worker_id.clone(),
        session_id,
        cadence_ms: l.cadence_ms,
        startup_page: l.startup_page,
        supervision_page: l.supervision_page,
        capacity: l.inbox_capacity,
        max_concurrent_runs: l.max_concurrent_runs,
        session_lease_ms: l.session_lease_ms,
        heartbeat_interval_ms: l.heartbeat_interval_ms,
        backoff_base_ms: l.backoff_base_ms,
        drain_budget_ms: l.drain_budget_ms,
        lease_control_interval_ms: l.lease_control_interval_ms,
        capabilities,
    })
}

impl Runner {
    /// Opens the state root (taking the owner lock), the Session, the TLS client and the
    /// supervisor image.
    ///
    /// # Errors
    /// [`StartError`] naming what is wrong.
    pub fn start(config: &Config, signals: Signals) -> Result<Self, StartError> {
        let image = SupervisorImage::current_exe().map_err(StartError::Image)?;
        Self::start_with_image(config, signals, image)
    }

    /// As [`Runner::start`], with an explicit supervisor image (tests, the demo).
    ///
    /// # Errors
    /// [`StartError`] naming what is wrong.
    pub fn start_with_image(
        config: &Config,
        signals: Signals,
        image: SupervisorImage,
    ) -> Result<Self, StartError> {
        // Every configuration check first: nothing is created or written before the whole
        // configuration is known to be usable.
        // One call thread per Run slot, one for the Session and one for the Pull (issue 16),
        // each with its own kept-alive connection.
        let threads = usize::from(config.limits.max_concurrent_runs) + 2;
        let client = control_plane_client(config)?
            .with_connections(threads)
            .map_err(|e| StartError::ControlPlane(format!("control plane client: {e}")))?;
        let calls = Calls::start(threads).map_err(StartError::Image)?;
        // A signal wakes the loop at once, as a finished call or an exiting supervisor does.
        signals.set_waker(calls.waker());
        config
            .capabilities
            .canonical_json()
            .map_err(|e| StartError::Capabilities(e.to_string()))?;
        // The Worker's own certificate: not yet valid, expired or not for client authentication
        // ⇒ refused before anything is written.
        let now = crate::os::now();
        let leaf = Leaf::parse(client.material().leaf_der()).map_err(|e| {
            StartError::ControlPlane(format!(
                "{}: {e}",
                config.blame(crate::config::Setting::ClientCertificate)
            ))
        })?;
        leaf.check(now.get(), config.control_plane.certificate_warning_ms)
            .map_err(|e| {
                StartError::ControlPlane(format!(
                    "{}: {e}",
                    config.blame(crate::config::Setting::ClientCertificate)
                ))
            })?;
        let metrics = crate::metrics::Metrics::new(now.get());
        let listener = match &config.metrics.listen {
            Some(listen) => Some(
                crate::metrics::Listener::start(listen, metrics.clone()).map_err(|e| {
                    StartError::ControlPlane(format!(
                        "{}: metrics.listen: cannot listen there: {e}",
                        config.source.display()
                    ))
                })?,
            ),
            None => None,
        };
        // Containment (issue 20): identity, runs area, delegated cgroup. Its checks come before
        // the state root is touched; it creates only the runs area outside the root.
        let prepared =
            crate::containment::prepare(&config.containment).map_err(|(field, rule)| {
                StartError::Containment {
                    path: config.source.display().to_string(),
                    field,
                    rule,
                }
            })?;
        let leftovers = crate::host::Leftovers {
            runs_dir: crate::containment::runs_dir(&prepared.plan),
            cgroup_parent: prepared
                .plan
                .cgroup
                .as_ref()
                .map(|c| PathBuf::from(&c.parent)),
        };
        // Then the state root: owner lock, inbox, Session.
        let journal = Journal::open(&config.root, config.limits.inbox_capacity)?;
        let session = session_store::load_or_create(&config.root, &config.worker_id)?;
        let cp = &config.control_plane;
        let executor =
            SupervisorExecutor::new(image, config.root.clone()).with_containment(prepared.plan);
        #[cfg_attr(not(feature = "test-hooks"), allow(unused_mut))]
        let mut host = Host::new(
            journal,
            config.limits.spool,
            client,
            cp.credential_file.clone(),
            executor,
            StopController::default(),
        );
        #[cfg(feature = "test-hooks")]
        host.stall_after(crate::test_hooks::stall_point());
        host.set_leftovers(leftovers);
        let reported_session = (session.session_id.clone(), false);
        *host.telemetry_mut() = crate::telemetry::Telemetry::new(metrics);
        let mut worker = Worker::new(
            worker_config(config, session.session_id)?,
            Now::new(now, crate::os::mono()),
        );
        worker.report_facts();
        Ok(Self {
            worker,
            host,
            calls,
            root: config.root.clone(),
            retention: RetentionPolicy {
                high_water_records: usize::try_from(config.retention.high_water_records)
                    .unwrap_or(usize::MAX),
                max_settled_age_ms: Some(config.retention.max_settled_age_ms),
                log_keep_ms: config.retention.log_keep_ms,
            },
            signals,
            drain_sent: false,
            next_retention_at: MonoMillis::ZERO,
            last_swept: None,
            reported_full: false,
            reported_session,
            containment_warnings: prepared.warnings,
            retention_failure: None,
            notifier: crate::notify::Notifier::from_env(),
            metrics: config.metrics.clone(),
            next_metrics_at: MonoMillis::ZERO,
            metrics_failure: None,
            listener,
            reloads_handled: 0,
            certificate: CertificateWatch {
                leaf: Some(leaf),
                window_ms: config.control_plane.certificate_warning_ms,
                next_check_at: MonoMillis::ZERO,
                path: config.control_plane.client_certificate.clone(),
            },
            give_up_after_ms: config.control_plane.give_up_after_ms,
            ready: false,
        })
    }

    /// Where the metrics listener listens, when one was asked for.
    #[must_use]
    pub fn metrics_address(&self) -> Option<&str> {
        self.listener.as_ref().map(|l| l.address.as_str())
    }

    /// What the operator should know about containment (printed by `ql-worker run`).
    #[must_use]
    pub fn containment_warnings(&self) -> &[String] {
        &self.containment_warnings
    }

    /// Installs an observer of persisted records and uploads (the demo prints lifecycles).
    pub fn observe(&mut self, observer: Box<dyn FnMut(&Observed<'_>)>) {
        self.host.observe(observer);
    }

    /// The supervisors started by this run that have not exited yet (finished ones are reaped
    /// first), for the demo's clean-up.
    pub fn supervisors(&mut self) -> Vec<u32> {
        let executor = self.host.executor_mut();
        executor.reap_exited();
        executor.supervisor_pids()
    }

    /// The core machine (read-only), for status output.
    #[must_use]
    pub fn worker(&self) -> &Worker {
        &self.worker
    }

    /// Runs until the Worker drains, halts, or a second signal arrives.
    ///
    /// A drain request (`ql-worker drain`'s file) is addressed to this run of the Worker and ends
    /// with it, however it ends, so the next start takes work again. (After a crash the file is
    /// still there, and that start drains at once: the request was never answered.)
    pub fn run(&mut self) -> RunExit {
        let exit = self.run_until_exit();
        self.report_facts();
        if self.drain_sent
            && let Err(e) = self.host.journal_mut().clear_drain_request()
        {
            let text = format!("could not remove the drain request: {e}");
            self.host
                .telemetry_mut()
                .storage_fault("removing the drain request", &text, false);
        }
        self.refresh_metrics(crate::os::clock(), true);
        exit
    }

    /// Hands the core's facts to the telemetry, and follows the phase for systemd.
    fn report_facts(&mut self) {
        let now = crate::os::now().get();
        while let Some(fact) = self.worker.poll_fact() {
            if matches!(fact, ql_worker_core::facts::Fact::DrainBegun { .. }) {
                self.notifier.stopping(&self.status_line());
            }
            self.host.telemetry_mut().fact(&fact, now);
        }
        if !self.ready && matches!(self.worker.phase(), Phase::Active | Phase::Draining) {
            self.ready = true;
            let records = self.worker.known_records().len();
            Event::info("reconciliation.done")
                .number("records", records as u64)
                .emit(format_args!(
                    "startup reconciliation done ({records} record(s)): ready"
                ));
            let status = self.status_line();
            self.notifier.ready(&status);
        }
        if self.worker.phase() == Phase::Draining {
            let in_flight = self.worker.in_flight();
            self.host.telemetry_mut().drain_progress(in_flight);
        }
    }

    /// The one-line summary for systemd's `STATUS=`.
    fn status_line(&self) -> String {
        let phase = match self.worker.phase() {
            Phase::Registering => "registering the Session",
            Phase::Reconciling => "reconciling the inbox",
            Phase::Active if self.worker.admission_paused() => "online, admission paused",
            Phase::Active if self.worker.fail_closed().is_some() => {
                "online, fail-closed (recovery_required records: see `ql-worker recover`)"
            }
            Phase::Active => "online",
            Phase::Draining => "draining",
            Phase::Finished => "stopping",
        };
        let live = self
            .worker
            .known_records()
            .values()
            .filter(|s| !s.is_terminal())
            .count();
        format!("{phase}; {live} unsettled record(s)")
    }

    /// Writes the metrics file when due (or now, with `force`).
    fn refresh_metrics(&mut self, now: Now, force: bool) {
        if !force && now.mono < self.next_metrics_at {
            return;
        }
        self.next_metrics_at = now.mono.saturating_add(self.metrics.interval_ms);
        let now = now.wall;
        let in_flight = self.worker.in_flight() as u64;
        let paused = self.worker.admission_paused();
        let dropped = self.worker.facts_dropped();
        let telemetry = self.host.telemetry_mut();
        telemetry.metrics().update(|r| {
            r.in_flight = in_flight;
            r.admission_paused = paused;
            r.facts_dropped = dropped;
        });
        let Some(path) = &self.metrics.textfile else {
            return;
        };
        let text = telemetry.metrics().render(now.get());
        match crate::metrics::write_textfile(path, &text) {
            Ok(()) => self.metrics_failure = None,
            Err(e) => {
                let text = format!("{}: {e}", path.display());
                if self.metrics_failure.as_deref() != Some(text.as_str()) {
                    Event::warn("metrics.write_failed")
                        .text("file", path.display())
                        .text("error", &e)
                        .emit(format_args!(
                            "the metrics file could not be written (retried every {} ms): {text}",
                            self.metrics.interval_ms
                        ));
                    self.metrics_failure = Some(text);
                }
            }
        }
    }

    /// SIGHUP: reload the TLS material and trust anchors. New connections use them; a bad new
    /// file (unreadable, malformed, a key that does not match, an expired or not-for-client
    /// certificate) keeps the old material and says why.
    fn reload_tls(&mut self) {
        let clock = crate::os::clock();
        let now = clock.wall;
        let client = self.host.client_mut();
        let loaded = client.material().reload();
        let result = loaded.map_err(|e| e.to_string()).and_then(|material| {
            let leaf = Leaf::parse(material.leaf_der()).map_err(|e| e.to_string())?;
            leaf.check(now.get(), self.certificate.window_ms)
                .map_err(|e| e.to_string())?;
            Ok((material, leaf))
        });
        let outcome = match result {
            Ok((material, leaf)) => match client.replace_material(material) {
                Ok(changed) => {
                    self.certificate.leaf = Some(leaf);
                    Ok(changed)
                }
                Err(e) => Err(e.to_string()),
            },
            Err(e) => Err(e),
        };
        let telemetry = self.host.telemetry_mut();
        match outcome {
            Ok(changed) => {
                let result = if changed { "reloaded" } else { "unchanged" };
                telemetry
                    .metrics()
                    .update(|r| *r.tls_reloads.entry(result).or_default() += 1);
                Event::info("tls.reloaded")
                    .flag("changed", changed)
                    .emit(if changed {
                        "SIGHUP: new TLS material and trust anchors loaded; new connections use \
                         them"
                    } else {
                        "SIGHUP: the TLS material and trust anchors are unchanged"
                    });
                let telemetry = self.host.telemetry_mut();
                if let Some(refusal) = self.certificate.check(clock, telemetry) {
                    // Checked above; the clock cannot have passed notAfter since.
                    Event::error("tls.reload_failed").emit(refusal);
                }
            }
            Err(why) => {
                telemetry
                    .metrics()
                    .update(|r| *r.tls_reloads.entry("failed").or_default() += 1);
                Event::error("tls.reload_failed")
                    .text("cause", &why)
                    .emit(format_args!(
                        "SIGHUP: the new TLS material was refused, the old stays in use: {why}"
                    ));
            }
        }
    }

    fn run_until_exit(&mut self) -> RunExit {
        loop {
            if let Some(exit) = self.check_operator() {
                return exit;
            }
            self.report_facts();
            // Outcomes of calls that finished meanwhile go in first.
            if let Some((id, done)) = self.calls.try_take() {
                let outcome = self.host.absorb(done);
                if let Err(exit) = self.feed(id, outcome) {
                    return exit;
                }
                continue;
            }
            match self.worker.poll_output() {
                Output::Command(command) => {
                    self.notifier.watchdog_tick();
                    let id = command.id;
                    // A control-plane call goes to its thread; everything else (storage,
                    // spawn, stop, entropy) is performed here, in order.
                    let action = match self.host.network(command.action) {
                        Ok(call) => {
                            self.calls.submit(id, call);
                            continue;
                        }
                        Err(action) => action,
                    };
                    let outcome = match self.host.perform(action) {
                        Ok(outcome) => outcome,
                        Err(HostError::Fatal(detail)) => return RunExit::Fatal(detail),
                    };
                    if let Err(exit) = self.feed(id, outcome) {
                        return exit;
                    }
                }
                Output::Idle { wake_at } => {
                    match self.housekeeping() {
                        Err(exit) => return exit,
                        // A supervisor exited: its completion pass is queued; run it now.
                        Ok(true) => continue,
                        Ok(false) => {}
                    }
                    self.keep_spare();
                    if let Some(exit) = self.sleep_until(wake_at) {
                        return exit;
                    }
                    if self.calls.has_done() {
                        // A call finished: its outcome goes in at the top of the loop.
                        continue;
                    }
                    if self.worker.phase() == Phase::Finished {
                        // An operator input (a drain) ended the machine: its output says how.
                        continue;
                    }
                    if self.worker.handle(crate::os::clock(), Input::Tick).is_err() {
                        return RunExit::Fatal(String::from("core refused a tick"));
                    }
                }
                Output::Stopped(StopReason::Drained) => {
                    let _ = session_store::forget(&self.root);
                    return RunExit::Drained;
                }
                Output::Stopped(StopReason::Unsettled) => return RunExit::Unsettled,
                Output::Stopped(StopReason::NotRegistered) => return RunExit::NotRegistered,
                // The effects reported the path and the rule when they mapped the fault.
                Output::Halted(HaltReason::UnsafeStorage) => {
                    let detail = self.host.telemetry_mut().take_storage_fault();
                    return RunExit::Unusable(detail.unwrap_or_else(|| {
                        String::from("unsafe or corrupt storage (see the storage.fault event)")
                    }));
                }
                Output::Halted(HaltReason::StoreUncertain) => {
                    let detail = self.host.telemetry_mut().take_storage_fault();
                    return match detail {
                        Some(detail) => {
                            RunExit::Fatal(format!("{} ({detail})", HaltReason::StoreUncertain))
                        }
                        None => RunExit::Halted(HaltReason::StoreUncertain),
                    };
                }
                Output::Halted(reason) => return RunExit::Halted(reason),
            }
        }
    }

    /// Feeds one command's outcome to the core, then what it noticed; between two commands
    /// too, reaps supervisors and keeps the inbox's bound (a stream of quick Runs keeps the
    /// core busy, and their exits must not wait for it).
    fn feed(&mut self, id: OpId, outcome: ql_worker_core::io::Outcome) -> Result<(), RunExit> {
        let input = Input::Outcome { id, outcome };
        if let Err(e) = self.worker.handle(crate::os::clock(), input) {
            return Err(RunExit::Fatal(format!("core refused an outcome: {e}")));
        }
        self.report_notices();
        self.housekeeping().map(|_| ())
    }

    /// Turns the core's notices into events and metrics (never a value: ids, field paths and
    /// rules) and hands them to the observer.
    fn report_notices(&mut self) {
        let notices: Vec<_> = self.worker.drain_notices().collect();
        for notice in notices {
            match &notice {
                ql_worker_core::worker::Notice::OfferRefused { offer_id, reason } => {
                    self.host
                        .telemetry_mut()
                        .metrics()
                        .update(|r| r.offers_refused += 1);
                    Event::warn("offer.refused")
                        .text("offer", offer_id)
                        .text("reason", reason)
                        .emit(&notice);
                }
            }
            self.host.notify(&Observed::Notice(&notice));
        }
    }

    /// First request ⇒ drain; second ⇒ stop now. Also re-checks, at every turn of the loop,
    /// that the owner lock still holds the root and that `<root>/drain` is safe.
    fn check_operator(&mut self) -> Option<RunExit> {
        let journal = self.host.journal_mut();
        if let Err(e) = journal.check_owner_lock() {
            return Some(RunExit::Unusable(e.to_string()));
        }
        let file = match journal.drain_requested() {
            Ok(file) => file,
            Err(e) => return Some(RunExit::Unusable(e.to_string())),
        };
        let signals = self.signals.seen();
        if signals >= 2 {
            return Some(RunExit::Interrupted);
        }
        let reloads = self.signals.reloads();
        if reloads != self.reloads_handled {
            self.reloads_handled = reloads;
            self.reload_tls();
        }
        if (signals == 1 || file) && !self.drain_sent {
            self.drain_sent = true;
            if self
                .worker
                .handle(crate::os::clock(), Input::DrainRequested)
                .is_err()
            {
                return Some(RunExit::Fatal(String::from(
                    "core refused the drain request",
                )));
            }
        }
        None
    }

    /// Reaps finished supervisors and reports each to the core ([`Input::ProcessExited`]), so
    /// the Run's completion pass runs now rather than at the next tick. Whether any exited.
    fn reap(&mut self) -> Result<bool, RunExit> {
        let executor = self.host.executor_mut();
        executor.reap_exited();
        let exited = executor.take_exited();
        for offer_id in &exited {
            let input = Input::ProcessExited {
                offer_id: offer_id.clone(),
            };
            if self.worker.handle(crate::os::clock(), input).is_err() {
                return Err(RunExit::Fatal(String::from(
                    "core refused a supervisor exit",
                )));
            }
        }
        Ok(!exited.is_empty())
    }

    /// What decides whether the inbox's own sweep is due (`retention::due`).
    fn sweep_key(&self) -> SweepKey {
        let inbox = self.worker.inbox_status();
        SweepKey {
            records: inbox.records,
            settled: inbox.settled,
            released: self.host.released(),
        }
    }

    /// Between commands: reap finished supervisors; sweep retention when the inbox is above its
    /// high-water mark or the periodic sweep is due; report an inbox that became full or has
    /// room again. Whether a supervisor exited (work is queued).
    fn housekeeping(&mut self) -> Result<bool, RunExit> {
        let exited = self.reap()?;
        let clock = crate::os::clock();
        let now = clock.wall;
        // The certificate first, so the first metrics file already shows it.
        if clock.mono >= self.certificate.next_check_at {
            let telemetry = self.host.telemetry_mut();
            if let Some(refusal) = self.certificate.check(clock, telemetry) {
                // An expired certificate can only fail every handshake: say so clearly; the
                // bound below ends the run if nothing authenticates any more.
                Event::error("certificate.invalid")
                    .text("cause", &refusal)
                    .emit(format_args!(
                        "{refusal}; renew it and send SIGHUP (the control plane will refuse \
                         every handshake)"
                    ));
            }
        }
        self.refresh_metrics(clock, false);
        self.notifier.watchdog_tick();
        let status = self.status_line();
        if self.ready {
            self.notifier.status(&status);
        }
        if let Some(message) = self
            .host
            .telemetry_mut()
            .unreachable_for(clock.mono.get(), self.give_up_after_ms)
        {
            Event::error("control_plane.unreachable")
                .number("bound_ms", self.give_up_after_ms)
                .emit(&message);
            return Err(RunExit::Fatal(message));
        }
        let periodic = clock.mono >= self.next_retention_at;
        if ql_worker_core::retention::due(
            self.sweep_key(),
            self.last_swept,
            periodic,
            &self.retention,
        ) {
            if periodic {
                self.next_retention_at = clock.mono.saturating_add(RETENTION_EVERY_MS);
            }
            let scope = if periodic {
                Scope::Full
            } else {
                Scope::Records
            };
            match retention::sweep(self.host.journal_mut(), now, &self.retention, scope) {
                Ok(report) => {
                    self.host
                        .telemetry_mut()
                        .records_removed(&report.records_removed, report.logs_removed);
                    if self.retention_failure.take().is_some() {
                        Event::info("retention.resumed").emit("retention: sweeping again");
                    }
                    for offer_id in report.records_removed {
                        let input = Input::RecordRemoved { offer_id };
                        if self.worker.handle(crate::os::clock(), input).is_err() {
                            return Err(RunExit::Fatal(String::from(
                                "core refused a retention report",
                            )));
                        }
                    }
                }
                Err(e) if e.is_fatal() => return Err(RunExit::Fatal(format!("retention: {e}"))),
                Err(e) => {
                    let text = e.to_string();
                    if self.retention_failure.as_deref() != Some(text.as_str()) {
                        Event::warn("retention.failed")
                            .text("error", &text)
                            .emit(format_args!(
                                "retention failed (settled records and logs are kept; retried \
                                 every {} s): {text}",
                                RETENTION_EVERY_MS / 1000
                            ));
                        self.retention_failure = Some(text);
                    }
                }
            }
            if periodic {
                self.host.sweep_runs();
            }
            self.last_swept = Some(self.sweep_key());
        }
        self.report_inbox();
        self.report_session();
        Ok(exited)
    }

    /// Events for a Session found draining at start and for the new Session replacing it.
    fn report_session(&mut self) {
        let now = (self.worker.session_id().clone(), self.worker.retiring());
        if now == self.reported_session {
            return;
        }
        if now.1 {
            Event::warn("session.retiring")
                .text("session", &now.0)
                .emit(format_args!(
                    "Session {} is draining or offline at the control plane (an earlier drain \
                     did not finish); its live Runs finish under it, then a new Session replaces \
                     it and new work flows",
                    now.0
                ));
        } else if now.0 != self.reported_session.0 {
            let file = self.root.join(session_store::SESSION_FILE);
            Event::info("session.renewed")
                .text("session", &now.0)
                .text("previous", &self.reported_session.0)
                .emit(format_args!(
                    "new Session {} replaces {} (stored in {})",
                    now.0,
                    self.reported_session.0,
                    file.display()
                ));
        }
        self.reported_session = now;
    }

    /// The "inbox full" event: once when the Worker first holds a Pull back for want of room,
    /// once when room is back. The counter of held-back Pulls is the metric.
    fn report_inbox(&mut self) {
        let inbox = self.worker.inbox_status();
        let changed = inbox.full != self.reported_full;
        self.reported_full = inbox.full;
        self.host.telemetry_mut().inbox(&inbox, changed);
    }

    /// A supervisor ready for the next launch (`SupervisorExecutor::prepare_spare`), started
    /// only while nothing waits on this loop (no call in flight, so no answer is held up by
    /// the start) and the Worker takes work; retired once a drain began.
    fn keep_spare(&mut self) {
        let executor = self.host.executor_mut();
        if self.drain_sent {
            executor.retire_spare();
        } else if self.calls.in_flight() == 0 {
            executor.prepare_spare();
        }
    }

    fn sleep_until(&mut self, wake_at: Option<MonoMillis>) -> Option<RunExit> {
        loop {
            let now = crate::os::mono();
            if wake_at.is_some_and(|at| now >= at) {
                return None;
            }
            let left = wake_at.map_or(SLEEP_SLICE, |at| {
                Duration::from_millis(at.saturating_since(now))
            });
            // Wakes early when a supervisor exits (its pidfd) or a call finishes (the call
            // threads' wake-up), else sleeps one slice.
            let woke = self
                .host
                .executor_mut()
                .wait_exit(left.min(SLEEP_SLICE), Some(self.calls.wake_fd()));
            if woke {
                self.calls.clear_wake();
            }
            if self.calls.has_done() {
                return None;
            }
            self.notifier.watchdog_tick();
            let before = self.drain_sent;
            if let Some(exit) = self.check_operator() {
                return Some(exit);
            }
            if self.drain_sent != before {
                return None;
            }
            match self.reap() {
                Err(exit) => return Some(exit),
                Ok(true) => return None,
                Ok(false) => {}
            }
        }
    }
}

/// Checks every control-plane setting of `config` (origin, client certificate and key, trust
/// anchors, timeout, credential file) and builds the client. Reads files; writes nothing.
///
/// # Errors
/// [`StartError::ControlPlane`] naming the file, the field or environment variable, and the rule.
pub fn control_plane_client(config: &Config) -> Result<HttpsClient, StartError> {
    use crate::config::Setting;
    let cp = &config.control_plane;
    let blamed = |setting: Setting, rule: &dyn std::fmt::Display| {
        StartError::ControlPlane(format!("{}: {rule}", config.blame(setting)))
    };
    let origin = Origin::parse(&cp.origin).map_err(|e| blamed(Setting::Origin, &e))?;
    let paths = TlsMaterialPaths {
        cert_chain: cp.client_certificate.clone(),
        private_key: cp.client_key.clone(),
        trust_anchors: cp.trust_anchors.clone(),
    };
    let material = TlsMaterial::load(&paths).map_err(|e| {
        let setting = match e.file() {
            Some(MaterialFile::CertChain) => Setting::ClientCertificate,
            Some(MaterialFile::PrivateKey) => Setting::ClientKey,
            Some(MaterialFile::TrustAnchors(i)) => Setting::TrustAnchor(i),
            None if matches!(e, MaterialError::ClientCertificateRejected { .. }) => {
                Setting::ClientCertificate
            }
            None => Setting::TrustAnchors,
        };
        blamed(setting, &e.rule())
    })?;
    let timeout =
        RequestTimeout::from_millis(cp.timeout_ms).map_err(|e| blamed(Setting::Timeout, &e))?;
    let client = HttpsClient::new(origin, material, timeout)
        .map_err(|e| blamed(Setting::ClientCertificate, &e))?;
    crate::host::authorization_rule(&cp.credential_file)
        .map_err(|rule| blamed(Setting::CredentialFile, &rule))?;
    Ok(client)
}

/// Writes the drain request file in `root` (for `ql-worker drain`): see
/// [`crate::journal::request_drain`]. Returns its path and whether it was already there.
///
/// # Errors
/// Not a state root, unsafe storage, or a failed call.
pub fn request_drain(root: &Path) -> Result<(PathBuf, bool), crate::journal::JournalError> {
    crate::journal::request_drain(root)
}
