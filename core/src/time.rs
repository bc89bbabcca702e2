//! Time as data. The core never reads a clock: wall-clock milliseconds arrive inside inputs as
//! [`UnixMillis`] and deadlines are compared against them (CONVENTIONS C4).

use core::fmt;

use serde::{Deserialize, Deserializer, Serialize};

use crate::error::IdError;
use crate::ids::MAX_SAFE_INTEGER;

crate::ids::counter!(
    /// Milliseconds since the Unix epoch, `0..=2^53-1` (a JavaScript safe integer, as on the
    /// wire).
    #[derive(Default)]
    UnixMillis,
    "unix milliseconds",
    0,
    MAX_SAFE_INTEGER,
    "0..=2^53-1 milliseconds"
);

impl UnixMillis {
    /// The epoch.
    pub const ZERO: Self = Self::FIRST;

    /// `self + millis`, saturating at `2^53-1`.
    #[must_use]
    pub const fn saturating_add(self, millis: u64) -> Self {
        let sum = self.0.saturating_add(millis);
        Self(if sum > MAX_SAFE_INTEGER {
            MAX_SAFE_INTEGER
        } else {
            sum
        })
    }

    /// `self - earlier`, or zero when `earlier` is later.
    #[must_use]
    pub const fn saturating_since(self, earlier: Self) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// Milliseconds on the driver's monotonic clock: a clock that never steps (on Linux the
/// driver reads `CLOCK_BOOTTIME`, which also counts suspended time). Its origin is arbitrary,
/// so only differences between two readings of one process mean anything; it is never
/// persisted and never sent. Every interval the Worker keeps (tick cadence, heartbeat, lease
/// pacing, backoffs, drain budget, the local deadlines of leases) runs on it, so that a
/// wall-clock step (an operator's `date -s`, NTP correcting a host that booted in 1970)
/// neither stalls nor hurries any of them (issue 16, item 5).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MonoMillis(u64);

impl MonoMillis {
    /// The clock's origin.
    pub const ZERO: Self = Self(0);

    /// Wraps a reading.
    #[must_use]
    pub const fn new(millis: u64) -> Self {
        Self(millis)
    }

    /// The reading in milliseconds.
    #[must_use]
    pub const fn get(self) -> u64 {
        self.0
    }

    /// `self + millis`, saturating.
    #[must_use]
    pub const fn saturating_add(self, millis: u64) -> Self {
        Self(self.0.saturating_add(millis))
    }

    /// `self - earlier`, or zero when `earlier` is later.
    #[must_use]
    pub const fn saturating_since(self, earlier: Self) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Display for MonoMillis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "mono {}", self.0)
    }
}

/// The driver's two clock readings, taken together for one input: wall time for what goes on
/// the wire and into records and for comparisons with the control plane's times, monotonic
/// time for every interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Now {
    /// Wall-clock time (may step either way).
    pub wall: UnixMillis,
    /// Monotonic time (never steps).
    pub mono: MonoMillis,
}

impl Now {
    /// Both readings.
    #[must_use]
    pub const fn new(wall: UnixMillis, mono: MonoMillis) -> Self {
        Self { wall, mono }
    }
}
