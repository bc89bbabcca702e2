//! The model checker's state fingerprints (`sim-hooks` feature only; not for production).
//!
//! The operation states derive `Hash` under this feature, for the model checker's state
//! deduplication (`ql-worker-sim`); this module gives `Hash` to the values they hold that have
//! none: durable values (records, claims, offers) through their exact postcard encoding, because
//! their `Debug` redacts the lease token and capability digests; requests, receipts, faults,
//! outcomes and Session exchanges through their `Debug` rendering (redacted as printed); the
//! completion capability through its digest. Never persisted, never printed.

use core::fmt::{self, Write as _};
use core::hash::{Hash, Hasher};

use serde::Serialize;

use crate::capability::Capability;

/// Writes `value`'s `Debug` rendering into `hasher`.
pub(crate) fn debug(hasher: &mut dyn Hasher, value: &dyn fmt::Debug) {
    let _ = write!(HashWrite(&mut *hasher), "{value:?}");
    hasher.write_u8(0xfe);
}

/// Writes a durable value's exact postcard encoding into `hasher`.
fn durable(hasher: &mut dyn Hasher, value: &impl Serialize) {
    if postcard::serialize_with_flavor(value, HashFlavor(&mut *hasher)).is_err() {
        hasher.write(b"unserializable");
    }
    hasher.write_u8(0xfd);
}

/// `Hash` through `$how` ([`debug`] or [`durable`]) for each type.
macro_rules! hash_by {
    ($how:ident, $($type:ty),+ $(,)?) => {$(
        impl Hash for $type {
            fn hash<H: Hasher>(&self, state: &mut H) {
                $how(state, self);
            }
        }
    )+};
}

hash_by!(
    durable,
    crate::record::InboxRecord,
    crate::claim::PendingClaim,
    crate::offer::Offer,
);
hash_by!(
    debug,
    crate::wire::activation::ActivationRequest,
    crate::wire::secrets::SecretsRequest,
    crate::wire::lease_control::LeaseControlRequest,
    crate::wire::completion::CompletionRequest,
    crate::wire::artifact::ArtifactUpload,
    crate::wire::WireError,
    crate::receipt::AuthenticatedReceipt,
    crate::completion::CompletionOutcome,
    crate::processor::ProcessResult,
    crate::supervision::SupervisionResult,
    crate::io::StopOutcome,
    crate::pull::PullFault,
    crate::session::SessionOp,
    crate::worker::ListPurpose,
);

impl Hash for Capability {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.digest().expose().hash(state);
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
