//! What cordon's test suites share, so that each harness is written once:
//!
//! - [`scratch`]: the one place every test keeps its temporary files,
//!   right wherever the checkout lives;
//! - [`skip`]: fail, or skip when `CORDON_TEST_ALLOW_SKIP=1`, when this
//!   machine lacks what a test needs;
//! - [`is_root`] and [`euid`];
//! - [`reexec`]: a test body re-run in a copy of its own test binary, as
//!   root and as uid 65534;
//! - [`image`]: tiny busybox image roots;
//! - [`vm`]: the static microVM guest init, and a scan for leftovers;
//! - `serve` (feature `mcp`): `cordon serve` started and an rmcp client
//!   connected to it, over stdio or HTTP, or the gateway served in-process;
//! - `upstream` (feature `upstream`): recording HTTP(S) upstreams on
//!   loopback with a test CA, for the credential-injection tests.
//!
//! A dev-dependency only: every helper panics with context instead of
//! returning errors.
#![allow(clippy::missing_panics_doc)]

pub mod image;
pub mod loopback;
pub mod reexec;
pub mod scratch;
#[cfg(feature = "mcp")]
pub mod serve;
pub mod skip;
#[cfg(feature = "upstream")]
pub mod upstream;
pub mod vm;
pub mod wasm;

pub use scratch::{Scratch, scratch};
pub use skip::{skip_or_fail, this_test};

/// The effective uid of this process.
pub fn euid() -> u32 {
    let s = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let line = s
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .expect("a Uid: line in /proc/self/status");
    line.split_whitespace()
        .nth(2)
        .and_then(|u| u.parse().ok())
        .expect("the effective uid in /proc/self/status")
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    euid() == 0
}
