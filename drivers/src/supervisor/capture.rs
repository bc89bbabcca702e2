//! Log capture: copy the user's merged stdout+stderr byte for byte into the spool file until the
//! quota is used, count and drop the rest, and keep draining after a write failure so the user
//! process never blocks or dies of `SIGPIPE` because of us.

use std::io::{self, Read, Write};

use zeroize::Zeroizing;

use super::mask::Masker;

/// Read block size.
pub const CAPTURE_BLOCK_BYTES: usize = 64 * 1024;

/// What a capture saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CaptureTally {
    /// Bytes written to the spool file.
    pub written: u64,
    /// Bytes read beyond the quota and dropped.
    pub dropped: u64,
    /// A write or read failed: the log is incomplete and no truncation fact may be published.
    pub failed: bool,
}

impl CaptureTally {
    /// Whether at least one byte overflowed the quota.
    #[must_use]
    pub fn quota_reached(&self) -> bool {
        self.dropped > 0
    }
}

/// Copies `source` into `sink` until end of file. At most `remaining` bytes are written; later
/// bytes are counted in [`CaptureTally::dropped`]. After a sink failure the rest of the stream is
/// read and discarded (and still counted). A read failure other than `EINTR` ends the capture as
/// failed.
pub fn pump<R: Read, W: Write>(source: R, sink: W, remaining: u64) -> CaptureTally {
    pump_masked(source, sink, remaining, None)
}

/// [`pump`], with every Secret value of `masker` replaced by `***` before it reaches `sink`
/// (the quota counts the masked bytes, which are what the log holds and what is uploaded).
/// Every buffer that held unmasked output is wiped.
pub fn pump_masked<R: Read, W: Write>(
    mut source: R,
    mut sink: W,
    remaining: u64,
    mut masker: Option<&mut Masker>,
) -> CaptureTally {
    let mut tally = CaptureTally::default();
    let mut left = remaining;
    let mut block = Zeroizing::new(vec![0u8; CAPTURE_BLOCK_BYTES]);
    let mut masked = Zeroizing::new(Vec::with_capacity(CAPTURE_BLOCK_BYTES * 2));
    let mut eof = false;
    while !eof {
        let n = match source.read(&mut block) {
            Ok(0) => {
                eof = true;
                0
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => {
                tally.failed = true;
                eof = true;
                0
            }
        };
        let out: &[u8] = match masker.as_deref_mut() {
            None => &block[..n],
            Some(masker) => {
                masked.clear();
                masker.feed(&block[..n], &mut masked);
                if eof {
                    masker.finish(&mut masked);
                }
                &masked
            }
        };
        let n = out.len();
        let take = usize::try_from(left).map_or(n, |left| left.min(n));
        if take > 0 && !tally.failed {
            if sink.write_all(&out[..take]).is_ok() {
                tally.written += take as u64;
            } else {
                tally.failed = true;
            }
        }
        left -= take as u64;
        tally.dropped += (n - take) as u64;
    }
    tally
}

/// A sink that fails every write, as a full disk would (test seam).
#[derive(Debug)]
pub(crate) struct FailingSink;

impl Write for FailingSink {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::Error::from_raw_os_error(28)) // ENOSPC
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(input: &[u8], remaining: u64) -> (Vec<u8>, CaptureTally) {
        let mut out = Vec::new();
        let tally = pump(input, &mut out, remaining);
        (out, tally)
    }

    #[test]
    fn pump_is_byte_exact_up_to_the_quota() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let (out, t) = run(&data, 131_072);
        assert_eq!(out, data[..131_072]);
        assert_eq!((t.written, t.dropped, t.failed), (131_072, 68_928, false));
        let (out, t) = run(&data[..10], 10);
        assert_eq!((out.len(), t.quota_reached()), (10, false));
        let (out, t) = run(&data[..11], 10);
        assert_eq!((out.len(), t.dropped), (10, 1));
        let (out, t) = run(b"", 0);
        assert_eq!((out.len(), t.quota_reached()), (0, false));
        let (out, t) = run(b"x", 0);
        assert_eq!((out.len(), t.dropped), (0, 1));
    }

    /// A reader that hands out its bytes in the given chunk sizes (pipe reads of any length).
    struct Chunked<'a>(&'a [u8], Vec<usize>);

    impl Read for Chunked<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let want = if self.1.is_empty() {
                self.0.len()
            } else {
                self.1.remove(0)
            };
            let n = want.min(buf.len()).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn masked_capture_replaces_values_split_across_reads_and_counts_masked_bytes() {
        let input = b"token=hunter2!\nagain hunter2";
        for split in 1..input.len() {
            let mut masker = Masker::new([b"hunter2".as_slice()], CAPTURE_BLOCK_BYTES);
            let mut out = Vec::new();
            let t = pump_masked(
                Chunked(input, vec![split, 3]),
                &mut out,
                1 << 20,
                Some(&mut masker),
            );
            assert_eq!(out, b"token=***!\nagain ***", "split at {split}");
            assert_eq!((t.written, t.dropped), (out.len() as u64, 0));
        }
        let mut masker = Masker::new([b"hunter2".as_slice()], CAPTURE_BLOCK_BYTES);
        let mut out = Vec::new();
        let t = pump_masked(&input[..], &mut out, 8, Some(&mut masker));
        assert_eq!(out, b"token=**", "the quota applies to the masked bytes");
        assert_eq!(t.dropped, 20 - 8);
    }

    #[test]
    fn pump_keeps_draining_after_a_sink_failure() {
        let data = vec![1u8; 300_000];
        let t = pump(&data[..], FailingSink, 100_000);
        assert!(t.failed);
        assert_eq!(t.written, 0);
        assert_eq!(t.dropped, 200_000);
    }
}
