//! A tiny reader over fuzz bytes that never fails: every read past the end yields zero, so any
//! byte string (including the empty one) is a complete, valid op sequence. Zero is always the
//! "cooperative" choice, which makes short inputs drive the happy path.

/// Reads fixed-width values from the front of a byte slice.
#[derive(Debug)]
pub struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bytes<'a> {
    /// A reader at the start of `data`.
    #[must_use]
    pub const fn new(data: &'a [u8]) -> Self {
        Self { data, pos: 0 }
    }

    /// True when every byte was consumed.
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// One byte, or 0 past the end.
    pub fn u8(&mut self) -> u8 {
        let value = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos = self.pos.saturating_add(1);
        value
    }

    /// Two bytes, little-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// Four bytes, little-endian.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    /// Eight bytes, little-endian.
    pub fn u64(&mut self) -> u64 {
        (u64::from(self.u32())) | (u64::from(self.u32()) << 32)
    }

    /// A value in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u8) -> u8 {
        if n == 0 { 0 } else { self.u8() % n }
    }

    /// A flag, false past the end.
    pub fn flag(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    /// A length byte (at most `max`) followed by that many bytes (fewer at the end).
    pub fn slice(&mut self, max: usize) -> &'a [u8] {
        let wanted = usize::from(self.u8()).min(max);
        let start = self.pos.min(self.data.len());
        let end = start.saturating_add(wanted).min(self.data.len());
        self.pos = start.saturating_add(wanted);
        &self.data[start..end]
    }

    /// Everything not read yet.
    pub fn rest(&mut self) -> &'a [u8] {
        let start = self.pos.min(self.data.len());
        self.pos = self.data.len();
        &self.data[start..]
    }
}

#[cfg(test)]
mod tests {
    use super::Bytes;

    #[test]
    fn reads_past_the_end_are_zero() {
        let mut r = Bytes::new(&[1, 2, 3]);
        assert_eq!(r.u16(), 0x0201);
        assert_eq!(r.u16(), 3);
        assert!(r.is_empty());
        assert_eq!(r.u64(), 0);
        assert_eq!(r.slice(10), &[] as &[u8]);
        assert_eq!(r.below(0), 0);
    }

    #[test]
    fn slices_are_bounded() {
        let mut r = Bytes::new(&[200, 1, 2, 3]);
        assert_eq!(r.slice(2), &[1, 2]);
        assert_eq!(r.u8(), 3);
        let mut r = Bytes::new(&[9, 1]);
        assert_eq!(r.slice(64), &[1]);
        assert!(r.is_empty());
    }
}
