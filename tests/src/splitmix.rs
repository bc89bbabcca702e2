//! SplitMix64: the one small, seedable, dependency-free random stream of the test crates (the
//! simulation's seeds, the pinned request bodies, the crash campaign's schedule, the
//! hostile-network proxy). Its sequence is fixed: the pinned request bodies depend on it.

use std::time::Duration;

/// A SplitMix64 stream.
#[derive(Clone, Debug)]
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`0` for `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A value in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }

    /// A duration of `lo..=hi` milliseconds.
    pub fn range_ms(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(self.range(lo, hi))
    }

    /// True with `percent` % chance.
    pub fn percent(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// The top byte of the next value.
    pub fn byte(&mut self) -> u8 {
        u8::try_from(self.next_u64() >> 56).unwrap_or(0)
    }

    /// One of `items`, uniformly.
    ///
    /// # Panics
    /// If `items` is empty.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[usize::try_from(self.below(items.len() as u64)).unwrap_or(0)]
    }

    /// An index into `weights`, proportionally.
    pub fn weighted(&mut self, weights: &[u64]) -> usize {
        let mut r = self.below(weights.iter().sum());
        for (i, w) in weights.iter().enumerate() {
            if r < *w {
                return i;
            }
            r -= w;
        }
        weights.len() - 1
    }

    /// The next value as 16 lowercase hex digits.
    pub fn hex(&mut self) -> String {
        format!("{:016x}", self.next_u64())
    }
}
