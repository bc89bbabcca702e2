//! Control-plane calls off the loop thread (issue 16): the core's `Post` and `UploadLog`
//! commands run on a bounded set of blocking threads (`max_concurrent_runs + 2`; ureq is
//! blocking, no async runtime is needed), and their outcomes come back to the loop through one
//! channel. A call's timeout holds only its own thread, so one slow call (a log upload over a
//! slow uplink, a control plane that answers late) never stalls the Session's heartbeat or
//! another Run's lease renewal. Storage effects stay on the loop thread.
//!
//! Each finished call writes one byte to a socket pair whose read end the loop polls beside the
//! supervisors' pidfds, so the loop wakes the moment an outcome arrives.
//!
//! A call carries everything it needs ([`NetCall`]: a [`Caller`] handle on the shared
//! connection pool, the credential file's path, the spool's root); what it observed for
//! telemetry comes back as [`Note`]s that the loop applies ([`crate::host::Host::absorb`]), so
//! the metrics and the event log are only ever written from the loop.

use std::collections::VecDeque;
use std::io::{Read as _, Write as _};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex};

use ql_worker_core::ids::{LogArtifactId, Sha256Digest};
use ql_worker_core::io::{HttpCall, HttpFailure, OpId, Outcome};
use zeroize::Zeroizing;

use crate::host::{authorization, http_failure, spool_failure};
use crate::https::{Caller, JsonCaps, TransportError};
use crate::spool::{self, SpoolPolicy};

/// One network command of the core, with what performing it needs.
pub struct NetCall {
    pub(crate) request: Request,
    pub(crate) caller: Caller,
    pub(crate) credential_file: PathBuf,
    pub(crate) root: PathBuf,
    pub(crate) spool: SpoolPolicy,
}

/// The two kinds of network command.
pub(crate) enum Request {
    Post(HttpCall),
    Upload {
        path: String,
        log_artifact_id: LogArtifactId,
        header: Zeroizing<Vec<u8>>,
        byte_length: u64,
        response_cap: usize,
    },
}

impl std::fmt::Debug for NetCall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetCall")
            .field("path", &self.path())
            .finish_non_exhaustive()
    }
}

/// What a finished call observed, for the loop's telemetry (never a value: paths, ids, rules).
#[derive(Debug)]
pub enum Note {
    /// The control plane answered.
    Answered(String),
    /// The call failed at this wall-clock time.
    Failed {
        /// The route.
        path: String,
        /// How.
        error: TransportError,
        /// When (monotonic ms, `os::mono`).
        at_ms: u64,
    },
    /// The credential file could not be used.
    CredentialUnreadable {
        /// The route.
        path: String,
        /// The rule it breaks.
        problem: String,
        /// When (monotonic ms, `os::mono`).
        at_ms: u64,
    },
    /// The log's spool file could not be read for its upload.
    SpoolFault {
        /// What was being done.
        what: String,
        /// The error.
        error: String,
    },
    /// A log was uploaded.
    Uploaded {
        /// Log id.
        log_artifact_id: LogArtifactId,
        /// Bytes sent.
        bytes: u64,
        /// How long the transfer took.
        seconds: f64,
        /// SHA-256 of what was sent.
        sha256: Sha256Digest,
    },
}

/// A finished call: the core's outcome and what telemetry should record.
#[derive(Debug)]
pub struct NetDone {
    /// The fact for the core.
    pub outcome: Outcome,
    /// For the loop's telemetry.
    pub notes: Vec<Note>,
}

impl NetCall {
    /// The route this call goes to.
    #[must_use]
    pub fn path(&self) -> &str {
        match &self.request {
            Request::Post(call) => &call.path,
            Request::Upload { path, .. } => path,
        }
    }

    /// Whether the call keeps a Session or a lease alive: it goes ahead of transfers and
    /// offers when every thread is busy.
    #[must_use]
    pub fn urgent(&self) -> bool {
        let path = self.path();
        ["/heartbeat", "/register", "/transition", "/lease-control"]
            .iter()
            .any(|op| path.ends_with(op))
    }

    /// Performs the call (blocking; on a call thread or, in tests, inline).
    #[must_use]
    pub fn perform(self) -> NetDone {
        let mut notes = Vec::new();
        let outcome = match &self.request {
            Request::Post(call) => self.post(call, &mut notes),
            Request::Upload {
                path,
                log_artifact_id,
                header,
                byte_length,
                response_cap,
            } => self.upload(
                path,
                log_artifact_id,
                header,
                *byte_length,
                *response_cap,
                &mut notes,
            ),
        };
        NetDone { outcome, notes }
    }

    fn authorization(&self, path: &str, notes: &mut Vec<Note>) -> Option<Zeroizing<String>> {
        match authorization(&self.credential_file) {
            Ok(auth) => Some(auth),
            Err(problem) => {
                notes.push(Note::CredentialUnreadable {
                    path: path.to_owned(),
                    problem,
                    at_ms: crate::os::mono().get(),
                });
                None
            }
        }
    }

    fn failed(path: &str, error: TransportError, notes: &mut Vec<Note>) -> Outcome {
        let failure = http_failure(&error);
        notes.push(Note::Failed {
            path: path.to_owned(),
            error,
            at_ms: crate::os::mono().get(),
        });
        Outcome::Http(failure)
    }

    fn post(&self, call: &HttpCall, notes: &mut Vec<Note>) -> Outcome {
        let caps = JsonCaps::default()
            .request_cap(call.request_cap)
            .and_then(|c| c.response_cap(call.response_cap));
        let Ok(caps) = caps else {
            return Outcome::Http(HttpFailure::Unavailable);
        };
        let Some(auth) = self.authorization(&call.path, notes) else {
            return Outcome::Http(HttpFailure::Unavailable);
        };
        match self.caller.post_json(&call.path, &auth, &call.body, caps) {
            Ok(body) => {
                notes.push(Note::Answered(call.path.clone()));
                Outcome::Responded(body)
            }
            Err(e) => Self::failed(&call.path, e, notes),
        }
    }

    fn upload(
        &self,
        path: &str,
        log_artifact_id: &LogArtifactId,
        header: &[u8],
        byte_length: u64,
        response_cap: usize,
        notes: &mut Vec<Note>,
    ) -> Outcome {
        let mut reader = match spool::open_reader(&self.root, log_artifact_id, self.spool) {
            Ok(reader) => reader,
            Err(e) => {
                notes.push(Note::SpoolFault {
                    what: format!("reading log {log_artifact_id} for its upload"),
                    error: e.to_string(),
                });
                return spool_failure(&e);
            }
        };
        if reader.len() != byte_length {
            return Outcome::LogUnavailable;
        }
        let Some(auth) = self.authorization(path, notes) else {
            return Outcome::Http(HttpFailure::Unavailable);
        };
        let started = std::time::Instant::now();
        match self
            .caller
            .post_artifact(path, &auth, header, &mut reader, byte_length, response_cap)
        {
            Ok((body, report)) => {
                let sha256 = Sha256Digest::from_bytes(report.sha256);
                notes.push(Note::Answered(path.to_owned()));
                notes.push(Note::Uploaded {
                    log_artifact_id: log_artifact_id.clone(),
                    bytes: report.bytes_sent,
                    seconds: started.elapsed().as_secs_f64(),
                    sha256,
                });
                Outcome::Uploaded {
                    body,
                    sent_bytes: report.bytes_sent,
                    sent_sha256: sha256,
                }
            }
            Err(e) => Self::failed(path, e, notes),
        }
    }
}

/// The jobs waiting for a thread: urgent calls first, then the rest in order.
struct Queue {
    jobs: VecDeque<(OpId, NetCall)>,
    closed: bool,
}

/// The call threads.
pub struct Calls {
    queue: Arc<(Mutex<Queue>, Condvar)>,
    done: Receiver<(OpId, NetDone)>,
    /// Finished calls taken off the channel, oldest first.
    ready: VecDeque<(OpId, NetDone)>,
    wake: UnixStream,
    /// The writing end every wake-up goes through (the call threads', a [`Waker`]'s).
    signal: Arc<UnixStream>,
    in_flight: usize,
}

/// Wakes the loop from another thread (the signal watcher's: a drain or stop request is acted on
/// at once rather than at the end of the loop's sleep slice).
#[derive(Clone, Debug)]
pub struct Waker(Arc<UnixStream>);

impl Waker {
    /// Wakes the loop (a full socket buffer already holds a wake-up: nothing is lost).
    pub fn wake(&self) {
        let _ = (&*self.0).write(&[1]);
    }
}

impl std::fmt::Debug for Calls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Calls")
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

impl Calls {
    /// Starts `threads` call threads (at least one).
    ///
    /// # Errors
    /// When the wake-up socket pair or a thread cannot be created.
    pub fn start(threads: usize) -> std::io::Result<Self> {
        let (wake, signal) = UnixStream::pair()?;
        wake.set_nonblocking(true)?;
        signal.set_nonblocking(true)?;
        let queue = Arc::new((
            Mutex::new(Queue {
                jobs: VecDeque::new(),
                closed: false,
            }),
            Condvar::new(),
        ));
        let (sender, done) = channel();
        // One descriptor for every thread's wake-up (a `&UnixStream` writes).
        let signal = Arc::new(signal);
        for n in 0..threads.max(1) {
            let queue = Arc::clone(&queue);
            let sender: Sender<(OpId, NetDone)> = sender.clone();
            let signal = Arc::clone(&signal);
            std::thread::Builder::new()
                .name(format!("ql-call-{n}"))
                .spawn(move || serve(&queue, &sender, &signal))?;
        }
        Ok(Self {
            queue,
            done,
            ready: VecDeque::new(),
            wake,
            signal,
            in_flight: 0,
        })
    }

    /// Hands a call to the threads.
    pub fn submit(&mut self, id: OpId, call: NetCall) {
        let (lock, ready) = &*self.queue;
        let mut queue = lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if call.urgent() {
            // Behind the other urgent calls, ahead of transfers and offers.
            let at = queue
                .jobs
                .iter()
                .position(|(_, c)| !c.urgent())
                .unwrap_or(queue.jobs.len());
            queue.jobs.insert(at, (id, call));
        } else {
            queue.jobs.push_back((id, call));
        }
        self.in_flight += 1;
        ready.notify_one();
    }

    /// Calls submitted and not yet taken back.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Whether a finished call is waiting (never blocks).
    pub fn has_done(&mut self) -> bool {
        while let Ok(done) = self.done.try_recv() {
            self.ready.push_back(done);
        }
        !self.ready.is_empty()
    }

    /// The oldest finished call, if one is waiting (never blocks).
    pub fn try_take(&mut self) -> Option<(OpId, NetDone)> {
        self.has_done();
        let done = self.ready.pop_front()?;
        self.in_flight = self.in_flight.saturating_sub(1);
        Some(done)
    }

    /// The descriptor that becomes readable when a call finishes (for the loop's poll).
    #[must_use]
    pub fn wake_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd as _;
        self.wake.as_fd()
    }

    /// A handle that wakes the loop from another thread.
    #[must_use]
    pub fn waker(&self) -> Waker {
        Waker(Arc::clone(&self.signal))
    }

    /// Empties the wake-up socket (after a poll said it is readable).
    pub fn clear_wake(&self) {
        let mut sink = [0u8; 64];
        while matches!((&self.wake).read(&mut sink), Ok(n) if n > 0) {}
    }
}

impl Drop for Calls {
    /// Lets the threads end once their call returns (a call in flight is abandoned, as a
    /// crash would; its thread ends within the request timeout or with the process).
    fn drop(&mut self) {
        let (lock, ready) = &*self.queue;
        let mut queue = lock
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        queue.closed = true;
        queue.jobs.clear();
        ready.notify_all();
    }
}

/// One call thread: takes jobs until the pool closes.
fn serve(
    queue: &Arc<(Mutex<Queue>, Condvar)>,
    done: &Sender<(OpId, NetDone)>,
    mut signal: &UnixStream,
) {
    let (lock, ready) = &**queue;
    loop {
        let job = {
            let mut queue = lock
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            loop {
                if queue.closed {
                    return;
                }
                if let Some(job) = queue.jobs.pop_front() {
                    break job;
                }
                queue = ready
                    .wait(queue)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
        };
        let (id, call) = job;
        let finished = call.perform();
        if done.send((id, finished)).is_err() {
            return;
        }
        // A full socket buffer already holds a wake-up: nothing is lost.
        let _ = signal.write(&[1]);
    }
}

#[cfg(test)]
mod tests {
    use rustix::event::{PollFd, PollFlags, poll};

    use super::Calls;
    use crate::runtime::Signals;

    fn readable(calls: &Calls) -> bool {
        let mut fds = [PollFd::new(&calls.wake, PollFlags::IN)];
        poll(&mut fds, Some(&rustix::event::Timespec::default())).is_ok_and(|n| n == 1)
    }

    /// A drain or stop request wakes the loop through the same socket a finished call does, so
    /// it is acted on at once rather than at the end of a sleep slice.
    #[test]
    fn a_signal_request_wakes_the_loop() {
        let calls = Calls::start(1).unwrap();
        let signals = Signals::default();
        signals.raise();
        assert!(!readable(&calls), "no waker set yet: nothing to wake");
        signals.set_waker(calls.waker());
        signals.raise();
        assert!(readable(&calls), "the request wrote a wake-up");
        calls.clear_wake();
        assert!(!readable(&calls), "cleared");
        assert_eq!(signals.seen(), 2);
    }
}
