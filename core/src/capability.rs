//! Ephemeral secrets that live only in memory: the 32-byte completion capability and the
//! entropy the driver draws from the OS on the core's request (CONVENTIONS C5).
//!
//! Neither type implements `Debug`, `Serialize` or `Clone`: they cannot be logged, persisted or
//! copied by accident, and they are wiped on drop.

use alloc::string::String;

use base64::Engine as _;
use zeroize::{Zeroize, ZeroizeOnDrop};

use crate::ids::{CapabilityDigest, Sha256Digest};

/// Bytes of OS entropy delivered per request.
pub const ENTROPY_BYTES: usize = 64;

/// Entropy drawn by the driver (OS CSPRNG) or the simulation (seeded PRNG).
#[expect(
    missing_debug_implementations,
    reason = "entropy must never be printed"
)]
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct Entropy([u8; ENTROPY_BYTES]);

impl Entropy {
    /// Wraps drawn bytes (the caller's copy should be wiped).
    #[must_use]
    pub const fn new(bytes: [u8; ENTROPY_BYTES]) -> Self {
        Self(bytes)
    }

    /// The bytes.
    #[must_use]
    pub const fn bytes(&self) -> &[u8; ENTROPY_BYTES] {
        &self.0
    }

    /// A uniform value in `0..bound` (bound ≥ 1) from the first eight bytes, by rejection-free
    /// 128-bit multiplication (bias below 2^-64).
    pub(crate) fn below(&self, bound: u64) -> u64 {
        let mut first = [0u8; 8];
        first.copy_from_slice(&self.0[..8]);
        let x = u128::from(u64::from_le_bytes(first));
        u64::try_from((x * u128::from(bound.max(1))) >> 64).unwrap_or(0)
    }
}

/// The 32-byte completion capability (ADR-0111 §4). Only its SHA-256 is ever persisted or sent;
/// the raw bytes reach the supervisor through the launch plan and the receipt as base64url.
#[expect(
    missing_debug_implementations,
    reason = "the capability must never be printed"
)]
#[derive(Zeroize, ZeroizeOnDrop)]
pub struct Capability([u8; 32]);

impl Capability {
    /// Takes the capability from drawn entropy.
    #[must_use]
    pub(crate) fn from_entropy(entropy: &Entropy) -> Self {
        let mut bytes = [0u8; 32];
        bytes.copy_from_slice(&entropy.0[..32]);
        Self(bytes)
    }

    /// Wraps raw bytes (simulation and tests).
    #[must_use]
    pub const fn from_bytes(bytes: [u8; 32]) -> Self {
        Self(bytes)
    }

    /// The raw bytes, for the launch plan only.
    #[must_use]
    pub const fn expose(&self) -> &[u8; 32] {
        &self.0
    }

    /// Lowercase SHA-256 of the raw bytes, as persisted in `launching` and sent in `running`.
    #[must_use]
    pub fn digest(&self) -> CapabilityDigest {
        CapabilityDigest::new(Sha256Digest::of(&self.0))
    }

    /// The receipt form: canonical base64url without padding (43 characters).
    #[must_use]
    pub fn to_base64url(&self) -> zeroize::Zeroizing<String> {
        zeroize::Zeroizing::new(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(self.0))
    }
}

/// Canonical base64url (no padding, no other alphabet, zero trailing bits) of exactly 32 bytes
/// (43 characters): the bytes, wiped on drop.
pub(crate) fn decode_base64url_32(text: &str) -> Option<zeroize::Zeroizing<[u8; 32]>> {
    let mut out = zeroize::Zeroizing::new([0u8; 32]);
    let written = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode_slice(text, &mut *out);
    (text.len() == 43 && matches!(written, Ok(32))).then_some(out)
}

/// Only for `Worker::fork` (`sim-hooks` feature): the model checker branches a Worker with a
/// launch in flight, which duplicates the in-memory capability (never persisted).
#[cfg(feature = "sim-hooks")]
impl Clone for Capability {
    fn clone(&self) -> Self {
        Self(self.0)
    }
}
