//! cordon's exit statuses, one per failure class. Documented in the README.
#![allow(dead_code)] // the full table, documented in one place

pub use cordon_broker::exit::*;

/// `check` found an invalid manifest, `diff` found a weakening change,
/// `probe` found an escape.
pub const FINDING: u8 = 1;
/// Bad usage, unreadable or invalid manifest, unknown tool.
pub const USAGE: u8 = 2;
