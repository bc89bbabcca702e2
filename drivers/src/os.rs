//! The readings of the outside world that the core never makes itself: the wall clock, the
//! monotonic clock and the OS random number generator. Each is read here and only here (CONVENTIONS C4, C5), so a
//! reviewer can audit them in one place and a test can see every use.
//!
//! Bounded waits (grace periods, report timeouts) use `std::time::Instant`, a monotonic timer
//! that never reaches the core or the disk.

use std::time::{SystemTime, UNIX_EPOCH};

use ql_worker_core::capability::{ENTROPY_BYTES, Entropy};
use ql_worker_core::time::{MonoMillis, Now, UnixMillis};
use rustix::io::Errno;
use zeroize::Zeroize as _;

/// The wall clock in Unix milliseconds. A clock before the epoch reads as the epoch; one past
/// 2^53 ms (year 287 396) saturates.
#[must_use]
pub fn now() -> UnixMillis {
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    UnixMillis::new(millis).unwrap_or(
        UnixMillis::new(ql_worker_core::ids::MAX_SAFE_INTEGER).unwrap_or(UnixMillis::ZERO),
    )
}

/// The monotonic clock in milliseconds: `CLOCK_BOOTTIME`, which never steps when the wall
/// clock is set and, unlike `CLOCK_MONOTONIC` (and `std::time::Instant`), keeps counting while
/// the host is suspended, so a lease that ran out during a suspend is seen to have run out.
/// Its origin is the boot: only differences mean anything.
#[must_use]
pub fn mono() -> MonoMillis {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    let secs = u64::try_from(t.tv_sec).unwrap_or(0);
    let millis = u64::try_from(t.tv_nsec).unwrap_or(0) / 1_000_000;
    MonoMillis::new(secs.saturating_mul(1_000).saturating_add(millis))
}

/// Both clocks, read together, for one input to the core.
#[must_use]
pub fn clock() -> Now {
    Now::new(now(), mono())
}

/// Fills `buf` from the kernel CSPRNG (`getrandom(2)`), retrying on `EINTR` and short reads.
///
/// # Errors
/// The errno of a failed `getrandom`.
pub fn fill_random(buf: &mut [u8]) -> Result<(), Errno> {
    let mut filled = 0;
    let mut spins = 0u32;
    while filled < buf.len() {
        spins += 1;
        if spins > 1_000 {
            return Err(Errno::IO);
        }
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(Errno::INTR) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Fresh entropy for the core.
///
/// # Errors
/// The errno of a failed `getrandom`.
pub fn entropy() -> Result<Entropy, Errno> {
    let mut bytes = [0u8; ENTROPY_BYTES];
    fill_random(&mut bytes)?;
    let entropy = Entropy::new(bytes);
    bytes.zeroize();
    Ok(entropy)
}
