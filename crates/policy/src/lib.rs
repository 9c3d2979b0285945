//! cordon-policy: the manifest, the profile rules enforced at load, and the
//! resolved per-tool policy that every runtime consumes.
//!
//! Data flows one way: [`manifest`] (as written) -> [`resolve`] (rules and
//! defaults) -> [`policy`] (plain values) -> runtimes. [`diff`] compares two
//! resolved sets and marks each change that weakens isolation.
#![forbid(unsafe_code)]

pub mod access;
pub mod diff;
pub mod error;
pub mod gateway;
pub mod manifest;
pub mod policy;
pub mod resolve;
pub mod units;

pub use error::{Diagnostic, ManifestError};
pub use policy::{PolicySet, ToolPolicy};
pub use resolve::{Loaded, load, load_str};

/// The manifest's JSON Schema, generated from the types.
pub fn json_schema() -> serde_json::Value {
    serde_json::to_value(schemars::schema_for!(manifest::Manifest)).unwrap_or_default()
}
