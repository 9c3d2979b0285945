//! cordon-probes: conformance probes that prove a sandbox profile holds.
//!
//! A profile is a claim, and claims rot. The [`agent`] runs inside a
//! sandbox and asks the kernel, directly, for what the sandbox should
//! refuse; the harness runs it through a [`Sandbox`], judges each answer
//! and writes a [`Report`]. A probe that succeeds is a vulnerability; a
//! probe that did not run is an error, never a pass.
#![forbid(unsafe_code)]

pub mod agent;
pub mod sandbox;
pub mod wire;
