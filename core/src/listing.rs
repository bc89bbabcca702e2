//! Pure listing and capacity rules of the inbox (reference §3.8–§3.9; SPEC §4).

use alloc::vec::Vec;

use crate::ids::OfferId;

/// Records per page: default 16, `1..=64` (reference `listOffers`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PageLimit(u8);

impl PageLimit {
    /// Largest page.
    pub const MAX: u8 = 64;
    /// Default page.
    pub const DEFAULT: Self = Self(16);

    /// Validates a page size.
    ///
    /// # Errors
    /// [`LimitError`] outside `1..=64`.
    pub fn new(limit: u64) -> Result<Self, LimitError> {
        u8::try_from(limit)
            .ok()
            .filter(|l| (1..=Self::MAX).contains(l))
            .map(Self)
            .ok_or(LimitError {
                what: "page limit",
                rule: "1..=64",
            })
    }

    /// The number of records.
    #[must_use]
    pub fn get(self) -> usize {
        usize::from(self.0)
    }
}

impl Default for PageLimit {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Inbox capacity: default 64, hard maximum 1024 (reference §3.9).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Capacity(u16);

impl Capacity {
    /// Hard maximum (`MAX_WORKER_REMOTE_OFFER_INBOX_ENTRIES`).
    pub const MAX: u16 = 1024;
    /// Default (`DEFAULT_WORKER_REMOTE_OFFER_INBOX_ENTRIES`).
    pub const DEFAULT: Self = Self(64);

    /// Validates a capacity.
    ///
    /// # Errors
    /// [`LimitError`] outside `1..=1024`.
    pub fn new(entries: u64) -> Result<Self, LimitError> {
        u16::try_from(entries)
            .ok()
            .filter(|e| (1..=Self::MAX).contains(e))
            .map(Self)
            .ok_or(LimitError {
                what: "inbox capacity",
                rule: "1..=1024",
            })
    }

    /// The number of records allowed.
    #[must_use]
    pub fn get(self) -> usize {
        usize::from(self.0)
    }

    /// Whether one more record fits beside `current` records. Every record counts, settled ones
    /// included; retention is what frees space.
    #[must_use]
    pub fn admits_one_more(self, current: usize) -> bool {
        current < self.get()
    }
}

impl Default for Capacity {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// A configured bound outside its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{what} must be within {rule}")]
pub struct LimitError {
    /// What was configured.
    pub what: &'static str,
    /// Its allowed range.
    pub rule: &'static str,
}

/// One page of offer ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Page {
    /// Ids strictly after the cursor, ascending, at most the limit.
    pub offer_ids: Vec<OfferId>,
    /// The cursor for the next page: the last returned id, only if more ids follow it.
    pub next_after: Option<OfferId>,
}

/// Keyset pagination over the set of offer ids: ascending (byte order, which equals JavaScript's
/// string order for the ASCII ids allowed), strictly after `after`, at most `limit`; the next
/// cursor only when more remain. The input may be in any order (e.g. directory order).
#[must_use]
pub fn page(mut all: Vec<OfferId>, after: Option<&OfferId>, limit: PageLimit) -> Page {
    all.sort_unstable();
    all.dedup();
    let start = after.map_or(0, |cursor| all.partition_point(|id| id <= cursor));
    let rest = all.len().saturating_sub(start);
    let take = rest.min(limit.get());
    let offer_ids: Vec<OfferId> = all.drain(start..start + take).collect();
    let next_after = offer_ids.last().filter(|_| rest > take).cloned();
    Page {
        offer_ids,
        next_after,
    }
}
