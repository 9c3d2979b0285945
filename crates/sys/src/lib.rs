//! cordon-sys: every raw system call cordon makes, and so every `unsafe`
//! block in the project, lives in this crate. Each block carries a
//! `// SAFETY:` comment. Other crates are `#![forbid(unsafe_code)]`.
pub mod io;
pub mod probe;
pub mod spawn;

pub use nix::errno::Errno;
