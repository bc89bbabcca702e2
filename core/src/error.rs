//! Shared error types. Each error says who is at fault and carries what a caller needs to act
//! (CONVENTIONS C9). `Display` is hand-written to keep the core's dependency list short.

use core::fmt;

/// A value broke the validation rule of a domain newtype. Never carries the value itself: some
/// values are capabilities.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IdError {
    /// Which kind of value, e.g. `"run id"`.
    pub kind: &'static str,
    /// The rule it broke.
    pub rule: &'static str,
}

impl fmt::Display for IdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {}: must be {}", self.kind, self.rule)
    }
}

impl core::error::Error for IdError {}
