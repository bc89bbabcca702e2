//! ql-worker-core: the pure, deterministic, sans-IO heart of the ql-worker remote Worker.
//!
//! Nothing in this crate touches a file, a socket, a process, a clock or a random number
//! generator: facts come in as inputs, decisions go out as commands.
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

extern crate alloc;

/// A fieldless enum spelled on the wire by its serde names, which `as_str` and `Display` also
/// give: each variant's doc starts with its spelling (more doc lines may follow it). `ALL` lists
/// the variants in declaration order.
macro_rules! wire_enum {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $text:literal,)* }) => {
        $(#[$doc])*
        #[derive(
            Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash,
            serde::Serialize, serde::Deserialize,
        )]
        pub enum $name {
            $(
                #[doc = concat!("`", $text, "`.")]
                $(#[$vdoc])*
                #[serde(rename = $text)]
                $variant,
            )*
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: [Self; [$($text),*].len()] = [$(Self::$variant),*];

            /// The wire spelling.
            #[must_use]
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $text,)*
                }
            }
        }

        impl core::fmt::Display for $name {
            fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

pub mod barrier;
pub mod capability;
pub mod claim;
pub mod completion;
pub mod envelope;
pub mod error;
pub mod facts;
#[cfg(feature = "sim-hooks")]
mod fingerprint;
pub mod ids;
pub mod io;
pub mod js;
pub mod listing;
pub mod offer;
pub mod processor;
pub mod pull;
pub mod receipt;
pub mod record;
pub mod retention;
pub mod revision;
pub mod secret;
pub mod session;
pub mod supervision;
pub mod time;
pub mod truncation;
pub mod wire;
pub mod worker;
