//! The framed artifact request body (wire reference §2.7), produced as a stream.
//!
//! Layout: 4-byte big-endian header length `N` (2..=4096), `N` bytes of JSON header, then
//! exactly the declared number of content bytes. The content is pulled from the caller's
//! reader in chunks of at most [`STREAM_CHUNK_BYTES`], hashed as it passes, and never held
//! whole in memory.
//!
//! Length enforcement is done so the server never receives a complete body that is wrong:
//! a reader that ends early fails before the last byte would have gone out, and the read
//! that would deliver the final declared bytes first probes the reader for one more byte;
//! if there is one, those final bytes are withheld and the request fails. Either way the
//! server sees a truncated body, which it must reject, never a committed wrong artifact.

use std::io::{self, Read};

use sha2::{Digest, Sha256};
use zeroize::Zeroizing;

/// Largest chunk pulled from the content reader per read (the spool's chunk size).
pub const STREAM_CHUNK_BYTES: usize = 64 * 1024;

/// Why the content stream stopped, recorded so the caller gets a typed error rather than
/// ureq's wrapped I/O error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StreamFailure {
    Short { read: u64 },
    Overlong,
    Read { read: u64, kind: io::ErrorKind },
}

/// A `Read` over prefix + header + content with exact-length enforcement.
pub(crate) struct FramedBody<'a> {
    /// Length prefix and header, already framed (at most 4 + 4096 bytes). The header carries
    /// the lease token: wiped on drop, as the command's own copy is.
    head: Zeroizing<Vec<u8>>,
    head_pos: usize,
    content: &'a mut dyn Read,
    declared: u64,
    remaining: u64,
    hasher: Sha256,
    failure: Option<StreamFailure>,
}

impl std::fmt::Debug for FramedBody<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FramedBody")
            .field("head_len", &self.head.len())
            .field("declared", &self.declared)
            .field("remaining", &self.remaining)
            .field("failure", &self.failure)
            .finish_non_exhaustive()
    }
}

impl<'a> FramedBody<'a> {
    /// `header` must already be length-checked by the caller.
    pub(crate) fn new(header: &[u8], content: &'a mut dyn Read, content_len: u64) -> Self {
        let header_len = u32::try_from(header.len())
            // INVARIANT: the caller checked 2 <= header.len() <= 4096.
            .expect("artifact header length fits u32");
        let mut head = Zeroizing::new(Vec::with_capacity(4 + header.len()));
        head.extend_from_slice(&header_len.to_be_bytes());
        head.extend_from_slice(header);
        Self {
            head,
            head_pos: 0,
            content,
            declared: content_len,
            remaining: content_len,
            hasher: Sha256::new(),
            failure: None,
        }
    }

    /// Total body length: prefix + header + content.
    pub(crate) fn total_len(&self) -> u64 {
        self.head.len() as u64 + self.declared
    }

    /// The recorded failure, if the stream was cut short.
    pub(crate) fn failure(&self) -> Option<StreamFailure> {
        self.failure
    }

    /// Content bytes handed out so far.
    pub(crate) fn content_sent(&self) -> u64 {
        self.declared - self.remaining
    }

    /// Whether every declared byte was handed out and the reader proved to be at its end.
    pub(crate) fn is_complete(&self) -> bool {
        self.head_pos == self.head.len() && self.remaining == 0 && self.failure.is_none()
    }

    /// The SHA-256 of the content handed out.
    pub(crate) fn finish(self) -> [u8; 32] {
        self.hasher.finalize().into()
    }

    fn fail(&mut self, failure: StreamFailure) -> io::Error {
        self.failure = Some(failure);
        io::Error::other("artifact content stream stopped")
    }

    /// Called before the final bytes of the body are released: an overlong reader must
    /// never produce a complete (and so committable) body.
    fn ensure_reader_exhausted(&mut self) -> io::Result<()> {
        let mut probe = [0_u8; 1];
        match self.read_content(&mut probe) {
            Ok(0) => Ok(()),
            Ok(_) => Err(self.fail(StreamFailure::Overlong)),
            Err(e) => {
                let read = self.content_sent();
                Err(self.fail(StreamFailure::Read {
                    read,
                    kind: e.kind(),
                }))
            }
        }
    }

    /// Reads from the content reader, retrying on `Interrupted`.
    fn read_content(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.content.read(buf) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }
}

impl Read for FramedBody<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(_failure) = self.failure {
            return Err(io::Error::other("artifact content stream stopped"));
        }
        if buf.is_empty() {
            return Ok(0);
        }
        if self.head_pos < self.head.len() {
            let n = (self.head.len() - self.head_pos).min(buf.len());
            if self.declared == 0 && self.head_pos + n == self.head.len() {
                // No content: the header's last bytes complete the body, so probe first.
                self.ensure_reader_exhausted()?;
            }
            buf[..n].copy_from_slice(&self.head[self.head_pos..self.head_pos + n]);
            self.head_pos += n;
            return Ok(n);
        }
        if self.remaining == 0 {
            return Ok(0);
        }
        let want = usize::try_from(self.remaining)
            .unwrap_or(usize::MAX)
            .min(buf.len())
            .min(STREAM_CHUNK_BYTES);
        let n = match self.read_content(&mut buf[..want]) {
            Ok(n) => n,
            Err(e) => {
                let read = self.content_sent();
                return Err(self.fail(StreamFailure::Read {
                    read,
                    kind: e.kind(),
                }));
            }
        };
        if n == 0 {
            let read = self.content_sent();
            return Err(self.fail(StreamFailure::Short { read }));
        }
        if n as u64 == self.remaining {
            // These are the last declared bytes: prove the reader is at its end first.
            self.ensure_reader_exhausted()?;
        }
        self.hasher.update(&buf[..n]);
        self.remaining -= n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(body: &mut FramedBody<'_>) -> io::Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut buf = [0_u8; 7];
        loop {
            let n = body.read(&mut buf)?;
            if n == 0 {
                return Ok(out);
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    #[test]
    fn frames_prefix_header_and_exact_content() {
        let mut content: &[u8] = b"hello world";
        let mut body = FramedBody::new(b"{}", &mut content, 11);
        assert_eq!(body.total_len(), 4 + 2 + 11);
        let out = drain(&mut body).unwrap();
        assert_eq!(&out[..4], &[0, 0, 0, 2]);
        assert_eq!(&out[4..6], b"{}");
        assert_eq!(&out[6..], b"hello world");
        assert!(body.is_complete());
        let digest = body.finish();
        assert_eq!(digest.as_slice(), Sha256::digest(b"hello world").as_slice());
    }

    #[test]
    fn short_reader_fails_before_the_body_is_complete() {
        let mut content: &[u8] = b"abc";
        let mut body = FramedBody::new(b"{}", &mut content, 4);
        assert!(drain(&mut body).is_err());
        assert_eq!(body.failure(), Some(StreamFailure::Short { read: 3 }));
        assert!(!body.is_complete());
    }

    #[test]
    fn overlong_reader_withholds_the_final_bytes() {
        let mut content: &[u8] = b"abcdef";
        let mut body = FramedBody::new(b"{}", &mut content, 5);
        let mut got = Vec::new();
        let mut buf = [0_u8; 64];
        while let Ok(n) = body.read(&mut buf) {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(body.failure(), Some(StreamFailure::Overlong));
        assert!(
            got.len() < 4 + 2 + 5,
            "a complete body must never be released"
        );
    }

    #[test]
    fn overlong_reader_with_zero_declared_bytes_is_refused() {
        let mut content: &[u8] = b"x";
        let mut body = FramedBody::new(b"{}", &mut content, 0);
        assert!(drain(&mut body).is_err());
        assert_eq!(body.failure(), Some(StreamFailure::Overlong));
    }

    #[test]
    fn empty_content_is_complete_after_the_header() {
        let mut content: &[u8] = b"";
        let mut body = FramedBody::new(b"{}", &mut content, 0);
        assert_eq!(drain(&mut body).unwrap().len(), 6);
        assert!(body.is_complete());
    }
}
