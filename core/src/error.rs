//! Shared error types. Each error says who is at fault and carries what a caller needs to act
//! (CONVENTIONS C9).

/// A value broke the validation rule of a domain newtype. Never carries the value itself: some
/// values are capabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind}: must be {rule}")]
pub struct IdError {
    /// Which kind of value, e.g. `"run id"`.
    pub kind: &'static str,
    /// The rule it broke.
    pub rule: &'static str,
}
