//! cordon-image: OCI images, always named by digest.
//!
//! - [`unpack`]: applying image layers to a rootfs without ever touching
//!   anything outside it (every path resolved inside the rootfs, never by
//!   string joining; whiteouts; hard links; devices dropped; setuid and
//!   setgid cleared; caps on size and entries).
#![forbid(unsafe_code)]

pub mod unpack;
