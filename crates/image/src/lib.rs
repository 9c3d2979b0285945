//! cordon-image: OCI images, always named by digest.
//!
//! - [`digest`]: `sha256:HEX` digests and a reader that verifies a blob's
//!   size and digest as it is read.
//! - [`reference`](mod@reference): `NAME@sha256:HEX` references (a tag alone is refused).
//! - [`manifest`]: OCI and Docker schema 2 indexes, manifests and configs;
//!   an index resolves to the host's platform.
//! - [`store`]: the content-addressed store: verified blobs, image records,
//!   unpacked rootfs trees, atomic writes and per-image locks. An image is
//!   unpacked when it is pulled or imported, before it is recorded.
//! - [`layout`]: importing OCI image layouts, OCI archives and `docker save`
//!   archives.
//! - [`registry`]: pulling from an OCI distribution registry.
//! - [`unpack`]: applying image layers to a rootfs without ever touching
//!   anything outside it (every path resolved inside the rootfs, never by
//!   string joining; whiteouts; hard links; devices dropped; setuid and
//!   setgid cleared; caps on size and entries).
#![forbid(unsafe_code)]

pub mod digest;
pub mod layout;
pub mod manifest;
pub mod reference;
pub mod registry;
pub mod store;
pub mod unpack;

pub use digest::Digest;
pub use reference::ImageRef;
pub use store::Store;
