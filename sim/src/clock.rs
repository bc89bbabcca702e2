//! The simulated host's two clocks (issue 16, item 5): the true time (the control plane's
//! clock, which the simulations advance), the host's wall clock (the true time off by a skew
//! that clock-step faults change), and the monotonic clock (the true time plus a fixed shift,
//! never stepped). The shift keeps the monotonic readings far from the wall readings, so that a
//! Worker confusing the two cannot pass unnoticed.

use ql_worker_core::time::{MonoMillis, Now, UnixMillis};

/// The monotonic clock's origin, relative to the true time.
const MONO_SHIFT: u64 = 1 << 40;

/// The host's wall clock at true time `now`, off by `skew` (at least the epoch).
#[must_use]
pub fn wall(now: UnixMillis, skew: i64) -> UnixMillis {
    let wall = i128::from(now.get()) + i128::from(skew);
    let millis = u64::try_from(wall.max(0)).unwrap_or(0);
    UnixMillis::new(millis).unwrap_or(UnixMillis::ZERO)
}

/// The Worker's two readings at true time `now` with the wall clock off by `skew`.
#[must_use]
pub fn reading(now: UnixMillis, skew: i64) -> Now {
    Now::new(wall(now, skew), MonoMillis::new(now.get() + MONO_SHIFT))
}

/// The true time a monotonic reading stands for.
#[must_use]
pub fn true_time(mono: MonoMillis) -> UnixMillis {
    UnixMillis::new(mono.get().saturating_sub(MONO_SHIFT)).unwrap_or(UnixMillis::ZERO)
}

/// One hour, the size of the clock steps the simulations inject.
pub const HOUR_MS: i64 = 3_600_000;
