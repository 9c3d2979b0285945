//! cordon-probes: conformance probes that prove a sandbox profile holds.
//!
//! A profile is a claim, and claims rot. The [`agent`] runs inside a
//! sandbox and asks the kernel, directly, for what the sandbox should
//! refuse; the harness runs it through a [`Sandbox`], judges each answer
//! ([`run_suite`]) and writes a [`Report`]. A probe that succeeds is a
//! vulnerability; a probe that did not run is an error, never a pass.
#![forbid(unsafe_code)]

pub mod agent;
pub use cordon_jail::libs as elf;
pub mod report;
pub mod runtime;
pub mod sandbox;
pub mod suite;
pub mod wasm;
pub mod wire;

pub use report::{Category, Format, ProbeResult, Report, Verdict};
pub use runtime::RuntimeSandbox;
pub use sandbox::{
    Capture, LimitKind, NoSandbox, PrefixSandbox, ProbeRun, RunResult, RunStatus, Sandbox,
    SandboxError,
};
pub use suite::{CATALOGUE, Filter, Limits, ProbeInfo, Profile, Targets, run_suite};
pub use wasm::{WasmTarget, run_wasm_suite};
