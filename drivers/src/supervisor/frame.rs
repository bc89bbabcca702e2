//! The two small framed messages between the Worker and its supervisor: the launch plan (Worker
//! → supervisor, on the supervisor's stdin) and the launch report (supervisor → Worker, on the
//! supervisor's stdout).
//!
//! ```text
//! offset size field
//!      0    4 magic ("QLSP" plan, "QLSR" report)
//!      4    1 version (1)
//!      5    3 reserved, zero
//!      8    4 body length, big-endian
//!     12    n postcard body
//! ```
//!
//! A pipe needs no checksum, but a reader must know when it has the whole message: the length
//! prefix lets the supervisor refuse a plan that was cut short (the Worker died mid-write), so a
//! partial plan can never start anything.

use serde::Serialize;
use serde::de::DeserializeOwned;
use zeroize::Zeroizing;

/// Frame header size.
pub(crate) const HEADER_BYTES: usize = 12;
/// Frame version.
const VERSION: u8 = 1;

/// Why bytes are not a complete frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameError {
    /// Fewer bytes than the header announces.
    #[error("frame is incomplete")]
    Incomplete,
    /// Wrong magic, version or reserved bytes, or an oversized length.
    #[error("frame header is invalid")]
    Header,
    /// The body is not a postcard value of the expected type, or has trailing bytes.
    #[error("frame body is malformed")]
    Body,
    /// The value does not fit the bound.
    #[error("frame value does not fit its bound")]
    TooLarge,
}

/// Encodes `value` into a frame of at most `max_bytes`, in a buffer reserved up front (no
/// reallocation leaves stray copies) and wiped on drop.
pub(crate) fn encode<T: Serialize>(
    magic: [u8; 4],
    value: &T,
    max_bytes: usize,
) -> Result<Zeroizing<Vec<u8>>, FrameError> {
    let mut buffer = Zeroizing::new(vec![0u8; max_bytes]);
    let body_len = postcard::to_slice(value, &mut buffer[HEADER_BYTES..])
        .map_err(|_| FrameError::TooLarge)?
        .len();
    let declared = u32::try_from(body_len).map_err(|_| FrameError::TooLarge)?;
    buffer[0..4].copy_from_slice(&magic);
    buffer[4] = VERSION;
    buffer[5..8].copy_from_slice(&[0, 0, 0]);
    buffer[8..12].copy_from_slice(&declared.to_be_bytes());
    buffer.truncate(HEADER_BYTES + body_len);
    Ok(buffer)
}

/// The total frame length announced by a header, once at least [`HEADER_BYTES`] are present.
pub(crate) fn announced_len(
    magic: [u8; 4],
    bytes: &[u8],
    max_bytes: usize,
) -> Result<Option<usize>, FrameError> {
    let Some(header) = bytes.get(..HEADER_BYTES) else {
        return Ok(None);
    };
    if header[0..4] != magic || header[4] != VERSION || header[5..8] != [0, 0, 0] {
        return Err(FrameError::Header);
    }
    let declared = u32::from_be_bytes([header[8], header[9], header[10], header[11]]);
    let total = usize::try_from(declared)
        .ok()
        .and_then(|n| n.checked_add(HEADER_BYTES))
        .filter(|n| *n <= max_bytes)
        .ok_or(FrameError::Header)?;
    Ok(Some(total))
}

/// Decodes exactly one frame occupying all of `bytes`.
pub(crate) fn decode<T: DeserializeOwned>(
    magic: [u8; 4],
    bytes: &[u8],
    max_bytes: usize,
) -> Result<T, FrameError> {
    let total = announced_len(magic, bytes, max_bytes)?.ok_or(FrameError::Incomplete)?;
    match bytes.len().cmp(&total) {
        std::cmp::Ordering::Less => return Err(FrameError::Incomplete),
        std::cmp::Ordering::Greater => return Err(FrameError::Body),
        std::cmp::Ordering::Equal => {}
    }
    let (value, rest) =
        postcard::take_from_bytes::<T>(&bytes[HEADER_BYTES..]).map_err(|_| FrameError::Body)?;
    if !rest.is_empty() {
        return Err(FrameError::Body);
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_reject_damage() {
        let frame = encode(*b"TEST", &(7u32, String::from("x")), 64).unwrap();
        assert_eq!(announced_len(*b"TEST", &frame, 64), Ok(Some(frame.len())));
        let value: (u32, String) = decode(*b"TEST", &frame, 64).unwrap();
        assert_eq!(value, (7, "x".into()));
        assert_eq!(
            decode::<(u32, String)>(*b"TEST", &frame[..frame.len() - 1], 64),
            Err(FrameError::Incomplete)
        );
        assert_eq!(
            decode::<(u32, String)>(*b"OTHR", &frame, 64),
            Err(FrameError::Header)
        );
        let mut longer = frame.to_vec();
        longer.push(0);
        assert_eq!(
            decode::<(u32, String)>(*b"TEST", &longer, 64),
            Err(FrameError::Body)
        );
        assert_eq!(
            encode(*b"TEST", &"y".repeat(100), 64).map(|_| ()),
            Err(FrameError::TooLarge)
        );
    }
}
