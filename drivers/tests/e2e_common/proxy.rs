//! Loopback TCP proxies between the real binary and the loopback plane (the plane knows nothing
//! of them; TLS 1.3 and mTLS run end to end through them).
//!
//! - [`Proxy`]: the skeleton: a loopback listener, one accept thread, a handler per connection
//!   that starts its own pump threads through [`Link::spawn`]. Dropping it stops the accept
//!   loop, shuts every relayed socket down (so blocked pumps return) and joins every thread:
//!   nothing outlives it.
//! - [`Uplink`]: one shared link of a fixed byte rate (a token bucket in its virtual-time form,
//!   GCRA): every connection's bytes of one direction queue on it in arrival order, so N
//!   connections share the rate instead of getting it each.
//! - [`Throttled`]: a [`Proxy`] whose Worker → plane direction crosses one [`Uplink`] (a slow
//!   uplink, as from a small site), the plane → Worker direction unthrottled. Its listener
//!   clamps the MSS to Ethernet's and keeps a small receive buffer: on loopback (MSS 64 KiB)
//!   the Worker's socket would otherwise grow its send buffer to megabytes that the kernel
//!   accepts at once (a minute of a 64 KiB/s link), so that the Worker would wait for an
//!   answer while most of its request still sits in its own kernel, which no real link does.
//!
//! Std and `socket2` (a dev-dependency) only, so that a bench can include this file with
//! `#[path]`.
#![forbid(unsafe_code)]
#![allow(dead_code, unreachable_pub)]

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the accept loop sleeps when no connection is waiting.
const ACCEPT_POLL: Duration = Duration::from_millis(5);
/// The longest a pump sleeps before it looks at the stop flag again.
const STOP_POLL: Duration = Duration::from_millis(50);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One relayed connection as the handler gets it: the Worker's side, the plane's side, the
/// proxy's stop flag, and the pump threads it starts.
pub struct Link {
    /// The Worker's side (accepted).
    pub client: TcpStream,
    /// The plane's side (connected).
    pub server: TcpStream,
    /// Set when the proxy is dropped: a pump that sleeps must look at it.
    pub stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl Link {
    /// Both directions, each end its own handle: `[(from the Worker, to the plane), (from the
    /// plane, to the Worker)]`.
    pub fn directions(&self) -> std::io::Result<[(TcpStream, TcpStream); 2]> {
        Ok([
            (self.client.try_clone()?, self.server.try_clone()?),
            (self.server.try_clone()?, self.client.try_clone()?),
        ])
    }

    /// Starts one pump thread of this connection; the proxy joins it when dropped.
    pub fn spawn(&mut self, pump: impl FnOnce() + Send + 'static) {
        self.threads.push(std::thread::spawn(pump));
    }
}

/// A connection the proxy still holds: its two sockets (to shut down at drop) and its pumps.
struct Held {
    sockets: [TcpStream; 2],
    threads: Vec<JoinHandle<()>>,
}

/// A loopback TCP proxy to `upstream`; see the module documentation.
pub struct Proxy {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    held: Arc<Mutex<Vec<Held>>>,
}

impl Proxy {
    /// Listens on a fresh loopback port; `handle` gets every accepted connection (with its
    /// plane side connected) on the accept thread, and starts its pumps with [`Link::spawn`].
    pub fn start(upstream: SocketAddr, handle: impl FnMut(&mut Link) + Send + 'static) -> Self {
        Self::start_on(TcpListener::bind("127.0.0.1:0").unwrap(), upstream, handle)
    }

    /// As [`Proxy::start`] on a listener of the caller's (bound to loopback).
    pub fn start_on(
        listener: TcpListener,
        upstream: SocketAddr,
        mut handle: impl FnMut(&mut Link) + Send + 'static,
    ) -> Self {
        assert!(listener.local_addr().unwrap().ip().is_loopback());
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let held: Arc<Mutex<Vec<Held>>> = Arc::default();
        let accept = {
            let (stop, held) = (Arc::clone(&stop), Arc::clone(&held));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    // Connections whose pumps have all ended are let go (their sockets close).
                    lock(&held).retain(|h| h.threads.iter().any(|t| !t.is_finished()));
                    let Ok((client, _)) = listener.accept() else {
                        std::thread::sleep(ACCEPT_POLL);
                        continue;
                    };
                    let Ok(server) = TcpStream::connect(upstream) else {
                        continue;
                    };
                    let (Ok(()), Ok(c), Ok(s)) = (
                        client.set_nonblocking(false),
                        client.try_clone(),
                        server.try_clone(),
                    ) else {
                        continue;
                    };
                    let mut link = Link {
                        client,
                        server,
                        stop: Arc::clone(&stop),
                        threads: Vec::new(),
                    };
                    handle(&mut link);
                    lock(&held).push(Held {
                        sockets: [c, s],
                        threads: link.threads,
                    });
                }
            })
        };
        Self {
            addr,
            stop,
            accept: Some(accept),
            held,
        }
    }

    /// Where the Worker connects.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        let held = std::mem::take(&mut *lock(&self.held));
        for h in &held {
            for socket in &h.sockets {
                let _ = socket.shutdown(Shutdown::Both);
            }
        }
        for h in held {
            for thread in h.threads {
                let _ = thread.join();
            }
        }
    }
}

/// Copies `from` to `to` until end of stream or an error, then shuts `to`'s write side (the
/// peer sees the end). `carry` is called with each burst before it is written; it returns false
/// to stop. Returns the bytes written.
pub fn pump(
    mut from: TcpStream,
    mut to: TcpStream,
    buf_len: usize,
    mut carry: impl FnMut(usize) -> bool,
) -> u64 {
    let mut buf = vec![0u8; buf_len];
    let mut written = 0u64;
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if !carry(n) || to.write_all(&buf[..n]).is_err() {
            break;
        }
        written += n as u64;
    }
    let _ = to.shutdown(Shutdown::Write);
    written
}

/// One link of `rate` bytes per second shared by every connection that crosses it: a token
/// bucket of depth `burst` bytes in its virtual-time form (GCRA). A burst is let through when
/// the link has carried every byte queued before it; bursts queue in arrival order.
pub struct Uplink {
    rate: u64,
    burst: u64,
    /// When the link has carried every byte reserved so far (the theoretical arrival time).
    free_at: Mutex<Instant>,
    carried: AtomicU64,
}

impl Uplink {
    /// A link of `rate` bytes per second (at least 1) letting `burst` bytes through at once.
    pub fn new(rate: u64, burst: u64) -> Self {
        Self {
            rate: rate.max(1),
            burst,
            free_at: Mutex::new(Instant::now()),
            carried: AtomicU64::new(0),
        }
    }

    fn time_of(&self, bytes: u64) -> Duration {
        Duration::from_nanos(
            u64::try_from(u128::from(bytes) * 1_000_000_000 / u128::from(self.rate))
                .unwrap_or(u64::MAX),
        )
    }

    /// Blocks until the link has carried `n` more bytes after everything queued before them;
    /// false (without waiting further) once `stop` is set.
    pub fn carry(&self, n: usize, stop: &AtomicBool) -> bool {
        let n = n as u64;
        let due = {
            let mut free_at = lock(&self.free_at);
            let start = (*free_at).max(Instant::now());
            *free_at = start + self.time_of(n);
            // The bucket's depth: a burst may leave that much ahead of the link's clock.
            (*free_at).checked_sub(self.time_of(self.burst.min(n)))
        };
        if let Some(due) = due {
            loop {
                if stop.load(Ordering::Relaxed) {
                    return false;
                }
                let left = due.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                std::thread::sleep(left.min(STOP_POLL));
            }
        }
        self.carried.fetch_add(n, Ordering::Relaxed);
        true
    }

    /// Bytes carried so far.
    pub fn carried(&self) -> u64 {
        self.carried.load(Ordering::Relaxed)
    }

    /// The rate, bytes per second.
    pub fn rate(&self) -> u64 {
        self.rate
    }
}

/// A loopback proxy whose Worker → plane direction crosses one shared [`Uplink`]; the plane →
/// Worker direction is unthrottled.
pub struct Throttled {
    uplink: Arc<Uplink>,
    connections: Arc<AtomicU64>,
    downlink: Arc<AtomicU64>,
    proxy: Proxy,
}

impl Throttled {
    /// Bytes read from the Worker at once (and the bucket's depth): small, so that a short
    /// request waits behind at most one such burst per busy connection.
    pub const BURST: usize = 4 * 1024;

    /// The MSS the listener announces (Ethernet's), instead of loopback's 64 KiB.
    pub const MSS: u32 = 1460;
    /// The receive buffer of the accepted sockets (the kernel doubles it).
    pub const RECEIVE_BUFFER: usize = 4 * 1024;

    /// A loopback listener whose connections behave like a link's: MSS [`Self::MSS`], receive
    /// buffer [`Self::RECEIVE_BUFFER`] (both inherited by the accepted sockets and announced in
    /// the handshake, so they are set before `listen`).
    fn link_listener() -> TcpListener {
        use socket2::{Domain, Socket, Type};
        let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        socket.set_tcp_mss(Self::MSS).unwrap();
        socket.set_recv_buffer_size(Self::RECEIVE_BUFFER).unwrap();
        let loopback: SocketAddr = "127.0.0.1:0".parse().unwrap();
        socket.bind(&loopback.into()).unwrap();
        socket.listen(64).unwrap();
        socket.into()
    }

    /// Starts a proxy to `upstream` whose Worker → plane direction carries `rate` bytes per
    /// second in total.
    pub fn start(upstream: SocketAddr, rate: u64) -> Self {
        let uplink = Arc::new(Uplink::new(rate, Self::BURST as u64));
        let connections = Arc::new(AtomicU64::new(0));
        let downlink = Arc::new(AtomicU64::new(0));
        let proxy = {
            let (uplink, connections, downlink) = (
                Arc::clone(&uplink),
                Arc::clone(&connections),
                Arc::clone(&downlink),
            );
            Proxy::start_on(Self::link_listener(), upstream, move |link| {
                connections.fetch_add(1, Ordering::Relaxed);
                let Ok([(c_read, s_write), (s_read, c_write)]) = link.directions() else {
                    return;
                };
                let (uplink, stop) = (Arc::clone(&uplink), Arc::clone(&link.stop));
                link.spawn(move || {
                    pump(c_read, s_write, Self::BURST, |n| uplink.carry(n, &stop));
                });
                let downlink = Arc::clone(&downlink);
                link.spawn(move || {
                    let n = pump(s_read, c_write, 32 * 1024, |_| true);
                    downlink.fetch_add(n, Ordering::Relaxed);
                });
            })
        };
        Self {
            uplink,
            connections,
            downlink,
            proxy,
        }
    }

    /// Where the Worker connects.
    pub fn addr(&self) -> SocketAddr {
        self.proxy.addr()
    }

    /// The shared Worker → plane link.
    pub fn uplink(&self) -> &Uplink {
        &self.uplink
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> u64 {
        self.connections.load(Ordering::Relaxed)
    }

    /// Plane → Worker bytes of the connections that have ended.
    pub fn downlink_bytes(&self) -> u64 {
        self.downlink.load(Ordering::Relaxed)
    }
}
