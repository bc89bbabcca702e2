//! The model checker's state fingerprints (`sim-hooks` feature only; not for production).

use core::fmt::{self, Write as _};
use core::hash::Hasher;

use serde::Serialize;

use crate::record::InboxRecord;

/// A canonical rendering of in-memory state into a [`Hasher`], for the model checker's state
/// deduplication (`ql-worker-sim`). Durable values (records, claims, offers) are written as their
/// exact postcard bytes, because their `Debug` redacts the lease token and capability digests;
/// everything else through `Debug`. Never persisted, never printed.
pub(crate) struct Fingerprint<'a>(pub(crate) &'a mut dyn Hasher);

impl fmt::Debug for Fingerprint<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Fingerprint")
    }
}

impl Fingerprint<'_> {
    /// A field or variant name (separates what follows).
    pub(crate) fn tag(&mut self, tag: &str) {
        self.0.write(tag.as_bytes());
        self.0.write_u8(0xff);
    }

    /// Raw bytes.
    pub(crate) fn bytes(&mut self, bytes: &[u8]) {
        self.0.write_usize(bytes.len());
        self.0.write(bytes);
    }

    /// A value through its `Debug` rendering.
    pub(crate) fn debug(&mut self, value: &dyn fmt::Debug) {
        let _ = write!(HashWrite(&mut *self.0), "{value:?}");
        self.0.write_u8(0xfe);
    }

    /// A durable value through its exact postcard encoding.
    pub(crate) fn durable<T: Serialize + ?Sized>(&mut self, value: &T) {
        if postcard::serialize_with_flavor(value, HashFlavor(&mut *self.0)).is_err() {
            self.tag("unserializable");
        }
        self.0.write_u8(0xfd);
    }

    /// An inbox record.
    pub(crate) fn record(&mut self, record: &InboxRecord) {
        self.durable(record);
    }
}

struct HashWrite<'a>(&'a mut dyn Hasher);

impl fmt::Write for HashWrite<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0.write(s.as_bytes());
        Ok(())
    }
}

struct HashFlavor<'a>(&'a mut dyn Hasher);

impl postcard::ser_flavors::Flavor for HashFlavor<'_> {
    type Output = ();

    fn try_extend(&mut self, data: &[u8]) -> postcard::Result<()> {
        self.0.write(data);
        Ok(())
    }

    fn try_push(&mut self, data: u8) -> postcard::Result<()> {
        self.0.write_u8(data);
        Ok(())
    }

    fn finalize(self) -> postcard::Result<()> {
        Ok(())
    }
}
