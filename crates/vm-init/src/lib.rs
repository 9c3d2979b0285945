//! cordon's microVM guest and the host side that prepares and drives it.
//!
//! - `protocol`: the control port's messages (shared by both sides).
//! - `image`: the tool's read-only block image (EROFS, else ext4), named by
//!   a digest of its inputs and verified by sha256 before each use.
//! - `initramfs`: the guest's initramfs (the init and its kernel modules) as
//!   a `newc` cpio archive.
//! - `mux`, `relay`: the network channel (`cordon.net`): TCP streams
//!   multiplexed over one virtio-serial port, its framing and both ends.
//! - `dns`, `dns_relay`: the guest's DNS: an answer's A records, the
//!   DNS-over-TCP framing that carries each query, and the host's relay of
//!   those to the egress DNS door.
//! - `qemu`, `qmp`: QEMU `-M microvm` as the VMM: a cold boot, a template
//!   snapshot, a restore, one task per guest.
//!
//! - `host`: the host side of one sandbox as a process of its own
//!   (`cordon-vm-init host DIR`), which cordon's supervisor runs.
//!
//! The guest side is the `cordon-vm-init` binary (`src/main.rs`,
//! `src/guest.rs`).
#![forbid(unsafe_code)]

pub mod devices;
pub mod dns;
pub mod dns_relay;
pub mod holes;
pub mod host;
pub mod image;
pub mod initramfs;
pub mod mux;
pub mod protocol;
pub mod qemu;
pub mod qmp;
pub mod relay;
pub mod root;
