//! Safe layer unpacking (see the crate docs).
//!
//! STAND-IN: this file only fixes the interface the store calls
//! (`apply_layer`, `Compression`, `Caps`, `Budget`, `UnpackError`) so the
//! store can be built and tested. It extracts plain directories and regular
//! files and nothing else, and does not resolve paths inside the rootfs: it
//! is not the safe unpacker and is replaced by it.

use std::fs;
use std::io::{self, Read};
use std::path::{Component, Path};

use sha2::{Digest as _, Sha256};

/// A layer's compression, from its media type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    /// Plain tar.
    None,
    /// tar+gzip.
    Gzip,
    /// tar+zstd.
    Zstd,
}

/// Why a layer could not be applied.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UnpackError(String);

impl Compression {
    /// The compression of a layer media type (OCI or Docker).
    pub fn from_media_type(media_type: &str) -> Result<Compression, UnpackError> {
        match media_type {
            "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.docker.image.rootfs.diff.tar" => Ok(Compression::None),
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip" => Ok(Compression::Gzip),
            "application/vnd.oci.image.layer.v1.tar+zstd"
            | "application/vnd.docker.image.rootfs.diff.tar.zstd" => Ok(Compression::Zstd),
            other => Err(UnpackError(format!(
                "layer media type `{other}` is not supported"
            ))),
        }
    }
}

/// Caps on what one image may unpack to.
#[derive(Clone, Debug)]
pub struct Caps {
    /// Total uncompressed bytes.
    pub max_bytes: u64,
    /// Total entries.
    pub max_entries: u64,
}

impl Default for Caps {
    fn default() -> Caps {
        Caps {
            max_bytes: 8 << 30,
            max_entries: 1 << 20,
        }
    }
}

/// What is left of the caps while the layers of one image are applied.
#[derive(Debug)]
pub struct Budget {
    caps: Caps,
    bytes: u64,
    entries: u64,
}

impl Budget {
    /// A full budget.
    pub fn new(caps: Caps) -> Budget {
        Budget {
            caps,
            bytes: 0,
            entries: 0,
        }
    }
}

struct Hashing<R> {
    inner: R,
    hasher: Sha256,
}

impl<R: Read> Read for Hashing<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

fn err(what: &str, e: impl std::fmt::Display) -> UnpackError {
    UnpackError(format!("{what}: {e}"))
}

/// Apply one layer to `rootfs`; returns the hex sha256 of the uncompressed
/// tar (the layer's diff_id).
pub fn apply_layer(
    rootfs: &Path,
    layer: impl Read,
    compression: Compression,
    budget: &mut Budget,
) -> Result<String, UnpackError> {
    let decompressed: Box<dyn Read + '_> = match compression {
        Compression::None => Box::new(layer),
        Compression::Gzip => Box::new(flate2::read::GzDecoder::new(layer)),
        Compression::Zstd => return Err(UnpackError("zstd layers: not in this stand-in".into())),
    };
    let mut hashing = Hashing {
        inner: decompressed,
        hasher: Sha256::new(),
    };
    {
        let mut archive = tar::Archive::new(&mut hashing);
        for entry in archive.entries().map_err(|e| err("layer", e))? {
            let mut entry = entry.map_err(|e| err("layer entry", e))?;
            budget.entries += 1;
            budget.bytes += entry.size();
            if budget.entries > budget.caps.max_entries || budget.bytes > budget.caps.max_bytes {
                return Err(UnpackError("image exceeds the unpack caps".into()));
            }
            let path = entry.path().map_err(|e| err("entry name", e))?.into_owned();
            let mut rel = std::path::PathBuf::new();
            for c in path.components() {
                match c {
                    Component::Normal(n) => rel.push(n),
                    Component::CurDir => {}
                    _ => return Err(err("entry name", path.display())),
                }
            }
            if rel.as_os_str().is_empty() {
                continue;
            }
            let target = rootfs.join(&rel);
            match entry.header().entry_type() {
                tar::EntryType::Directory => {
                    fs::create_dir_all(&target).map_err(|e| err("mkdir", e))?;
                }
                tar::EntryType::Regular => {
                    if let Some(parent) = target.parent() {
                        fs::create_dir_all(parent).map_err(|e| err("mkdir", e))?;
                    }
                    let _ = fs::remove_file(&target);
                    let mut f = fs::File::create(&target).map_err(|e| err("create", e))?;
                    io::copy(&mut entry, &mut f).map_err(|e| err("write", e))?;
                }
                _ => {}
            }
        }
    }
    io::copy(&mut hashing, &mut io::sink()).map_err(|e| err("layer", e))?;
    Ok(hex::encode(hashing.hasher.finalize()))
}
