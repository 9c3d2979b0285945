//! cordon-sys: every raw system call cordon makes, and so every `unsafe`
//! block in the project, lives in this crate. Each block carries a
//! `// SAFETY:` comment and covers one unsafe operation (clippy's
//! `undocumented_unsafe_blocks` and `multiple_unsafe_ops_per_block`, denied
//! for this crate). Other crates are `#![forbid(unsafe_code)]`.
//!
//! - `entropy`: the random generator's ioctls (a restored guest's
//!   reseed).
//! - `fsat`: descriptor-relative file system calls that never leave a
//!   directory tree (the image unpacker's).
//! - `io`: parent-side descriptor and process helpers (pipes, poll,
//!   pidfds, small kernel files, feature probes).
//! - `mount`: the broker's own mounts (a workspace's size-limited tmpfs,
//!   its lazy unmount).
//! - `net`: the broker's network helpers (addresses added to a sandbox's
//!   `lo` over rtnetlink, `splice(2)` for the egress doors' tunnels).
//! - `probe`: the raw calls of the conformance probe agent.
//! - `spawn`: starting a sandboxed process; its module docs describe the
//!   files, parent side and child side.
//!
//! Its one companion, `cordon-sys-wasm` (`crates/sys/wasm`), holds the Wasm
//! runner's one unsafe call, apart so that nothing but the runner waits
//! for wasmtime to build.
#![deny(clippy::undocumented_unsafe_blocks)]
#![deny(clippy::multiple_unsafe_ops_per_block)]

pub mod entropy;
pub mod fsat;
pub mod io;
pub mod mount;
pub mod net;
pub mod probe;
pub mod spawn;

pub use nix::errno::Errno;
