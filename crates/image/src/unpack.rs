//! Applying an image's layers to a rootfs without ever touching anything
//! outside it, and without producing a rootfs that is dangerous on the
//! host.
//!
//! [`apply_layer`] reads one layer (a tar stream, possibly compressed) and
//! applies its entries to a rootfs directory, in order; the layers of one
//! image are applied one after the other onto the same directory, sharing
//! one [`Budget`]. The `tar` crate only parses the stream: entries are
//! never written with its `unpack` functions, which have had path-escape
//! bugs (RUSTSEC-2021-0080, RUSTSEC-2026-0067).
//!
//! # Paths
//! - Entry names (and hard-link targets) are split into components. A
//!   leading `/` is ignored, as are empty and `.` components: an absolute
//!   name is relative to the rootfs. A name with a `..` component anywhere
//!   is refused, and so the layer.
//! - The directory an entry goes in is resolved inside the rootfs with
//!   `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`:
//!   a symlink on the way, absolute or relative, from this layer or an
//!   earlier one, or a chain of them, resolves as if the rootfs were `/`,
//!   so it can only lead somewhere inside it. Missing directories on the
//!   way are created (mode 0755); one that is a symlink to nothing, or a
//!   non-directory, refuses the entry. Paths are never joined as strings
//!   onto the rootfs's path.
//! - The last component is never followed: every operation on it is
//!   relative to its parent's descriptor with no-follow semantics.
//!
//! # Entries
//! - An entry replaces what is at its name (unlinked first; a directory
//!   with all it holds, removed by descriptor), except that a directory
//!   onto a directory keeps the existing one and sets its mode. A regular
//!   file is always a new inode (`O_CREAT | O_EXCL`), so nothing is ever
//!   written through an existing file, hard link or symlink.
//! - Hard links: the target must already be a non-directory in the rootfs
//!   (its name resolved like any entry's); a symlink there is linked
//!   itself, never followed.
//! - Symlink targets are stored as written; they are only ever resolved
//!   inside the rootfs (here) or inside the sandbox.
//! - Character and block devices are dropped (what the name held in lower
//!   layers is removed, as the node would have replaced it); FIFOs are
//!   created. PAX global headers are skipped; other entry types refuse the
//!   layer.
//! - An entry naming the rootfs itself (`.`, `/`) is skipped if it is a
//!   directory (the rootfs's own mode stays the caller's: create it 0755)
//!   and refused otherwise.
//!
//! # Whiteouts
//! - `DIR/.wh.NAME` removes NAME from DIR (resolved inside the rootfs);
//!   `DIR/.wh..wh..opq` removes everything DIR holds from lower layers.
//!   Both apply to lower layers only: what the same layer creates stays,
//!   wherever the marker is in the stream. Neither marker is ever created.
//! - AUFS metadata (`.wh..wh.plnk` and the like) is skipped; a whiteout of
//!   `.`, `..` or of nothing, or a directory on the way named `.wh.*`, is
//!   refused.
//!
//! # Modes, times, ownership
//! - Setuid and setgid bits are cleared everywhere. Files and FIFOs keep
//!   their permission bits (`& 0o777`); directories keep theirs and the
//!   sticky bit, and always have owner `rwx`, so the unpacker (and a later
//!   layer, and removal of the rootfs) can write into them without
//!   privilege.
//! - Modification (and access) times are set from the header; a
//!   directory's when its layer is done.
//! - Ownership is not applied and not recorded: every file belongs to the
//!   user running the unpacker. Extended attributes (file capabilities,
//!   ACLs, SELinux labels) are not applied.
//!
//! # Caps
//! [`Caps`] bound the whole image, across its layers: `max_bytes` caps the
//! uncompressed tar streams read (headers and padding included) and,
//! separately, the file content written (sparse files expand);
//! `max_entries` caps the number of entries (every entry counts: whiteouts,
//! directories, dropped devices). The tar metadata of one entry (long
//! names, PAX and sparse headers) is held to 1 MiB so it is never buffered
//! in bulk. A cap reached fails with [`UnpackError::Cap`], naming it.
//!
//! # Failure
//! Any error stops the layer where it is, leaving the rootfs partly
//! written but nothing outside it touched: the caller unpacks into a
//! temporary directory, renames it into place only when every layer
//! applied and every diff_id matched, and removes it otherwise.

mod path;
mod tree;

use std::cell::Cell;
use std::io::{self, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use cordon_sys::fsat;
use sha2::{Digest, Sha256};
use tar::EntryType;

use self::path::Marker;
use self::tree::{Fail, Tree};

/// The compression of a layer blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Zstd,
}

impl Compression {
    /// The compression of a layer of media type `mt`: the OCI layer types
    /// `application/vnd.oci.image.layer.v1.tar`, `…tar+gzip` and
    /// `…tar+zstd`, and Docker schema 2's
    /// `application/vnd.docker.image.rootfs.diff.tar` and `…tar.gzip`.
    /// Anything else is refused by name: foreign and non-distributable
    /// layers (their content is elsewhere), encrypted layers, and unknown
    /// types.
    pub fn from_media_type(mt: &str) -> Result<Compression, UnpackError> {
        let refuse = |why: &'static str| {
            Err(UnpackError::MediaType {
                media_type: mt.to_string(),
                why,
            })
        };
        match mt {
            "application/vnd.oci.image.layer.v1.tar"
            | "application/vnd.docker.image.rootfs.diff.tar" => Ok(Compression::None),
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip" => Ok(Compression::Gzip),
            "application/vnd.oci.image.layer.v1.tar+zstd" => Ok(Compression::Zstd),
            _ if mt.starts_with("application/vnd.oci.image.layer.nondistributable.") => {
                refuse("a non-distributable layer (its content is not in the image)")
            }
            _ if mt.starts_with("application/vnd.docker.image.rootfs.foreign.") => {
                refuse("a foreign layer (its content is not in the image)")
            }
            _ if mt.contains("+encrypted") => refuse("an encrypted layer"),
            _ => refuse(
                "not a layer media type cordon unpacks (OCI tar, tar+gzip, tar+zstd; Docker rootfs.diff.tar, tar.gzip)",
            ),
        }
    }
}

/// The default of [`Caps::max_bytes`]: 8 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 8 << 30;
/// The default of [`Caps::max_entries`]: one million.
pub const DEFAULT_MAX_ENTRIES: u64 = 1_000_000;

/// The most of one image that is unpacked (all its layers together).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Uncompressed bytes, counted twice over: the tar streams read, and
    /// the file content written. Default [`DEFAULT_MAX_BYTES`].
    pub max_bytes: u64,
    /// Tar entries of every kind. Default [`DEFAULT_MAX_ENTRIES`].
    pub max_entries: u64,
}

impl Default for Caps {
    fn default() -> Caps {
        Caps {
            max_bytes: DEFAULT_MAX_BYTES,
            max_entries: DEFAULT_MAX_ENTRIES,
        }
    }
}

/// Running totals across the layers of one image, held to its [`Caps`].
#[derive(Clone, Debug)]
pub struct Budget {
    caps: Caps,
    read: u64,
    written: u64,
    entries: u64,
}

impl Budget {
    pub fn new(caps: Caps) -> Budget {
        Budget {
            caps,
            read: 0,
            written: 0,
            entries: 0,
        }
    }

    pub fn caps(&self) -> Caps {
        self.caps
    }

    /// Uncompressed tar bytes read so far.
    pub fn bytes_read(&self) -> u64 {
        self.read
    }

    /// File content written so far.
    pub fn bytes_written(&self) -> u64 {
        self.written
    }

    /// Entries applied (or dropped) so far.
    pub fn entries(&self) -> u64 {
        self.entries
    }
}

/// The most tar metadata (long names, PAX and sparse headers) read for one
/// entry.
pub const MAX_ENTRY_METADATA: u64 = 1 << 20;

/// Why a layer was not (completely) applied.
#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// The layer's media type is not one that is unpacked.
    #[error("layer media type {media_type:?} refused: {why}")]
    MediaType {
        media_type: String,
        why: &'static str,
    },
    /// The rootfs directory could not be opened.
    #[error("cannot open the rootfs {}: {source}", path.display())]
    Rootfs {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// A cap of [`Caps`] was reached (`cap` is its name, `max_bytes` or
    /// `max_entries`); `path` is the entry being read, if any.
    #[error(
        "the image is over its {cap} cap ({limit}){}",
        match path { Some(p) => format!(" at entry {p:?}"), None => String::new() }
    )]
    Cap {
        cap: &'static str,
        limit: u64,
        path: Option<String>,
    },
    /// An entry that is not applied: hostile or unusable.
    #[error("entry {path:?} refused: {why}")]
    Refused { path: String, why: String },
    /// The tar metadata of one entry is over [`MAX_ENTRY_METADATA`].
    #[error(
        "the tar metadata (long names, PAX or sparse headers) of the entry {} is over {MAX_ENTRY_METADATA} bytes",
        match after { Some(p) => format!("after {p:?}"), None => "first in the layer".to_string() }
    )]
    Metadata { after: Option<String> },
    /// A file system call for an entry failed.
    #[error("entry {path:?}: {what}: {source}")]
    Io {
        path: String,
        what: &'static str,
        #[source]
        source: io::Error,
    },
    /// The layer could not be read: a compression or tar format error, or
    /// a truncated stream; `after` is the last entry read whole, if any.
    #[error(
        "reading the layer{}: {source}",
        match after { Some(p) => format!(" after entry {p:?}"), None => String::new() }
    )]
    Read {
        after: Option<String>,
        #[source]
        source: io::Error,
    },
}

/// Apply one layer (its compressed bytes) onto `rootfs` (a directory the
/// caller created, empty for the first layer); returns the sha256 hex of
/// the *uncompressed* tar stream (the layer's diff_id) computed while
/// reading. See the module docs for what is applied and how.
pub fn apply_layer(
    rootfs: &Path,
    layer: impl Read,
    compression: Compression,
    budget: &mut Budget,
) -> Result<String, UnpackError> {
    let root = fsat::open_root(rootfs).map_err(|e| UnpackError::Rootfs {
        path: rootfs.to_path_buf(),
        source: e.into(),
    })?;
    let decoder = match compression {
        Compression::None => Decoder::Plain(layer),
        Compression::Gzip => Decoder::Gzip(flate2::read::MultiGzDecoder::new(layer)),
        Compression::Zstd => {
            Decoder::Zstd(zstd::stream::read::Decoder::new(layer).map_err(|source| {
                UnpackError::Read {
                    after: None,
                    source,
                }
            })?)
        }
    };
    let meter = Rc::new(Meter {
        read: Cell::new(0),
        limit: budget.caps.max_bytes.saturating_sub(budget.read),
        meta_from: Cell::new(None),
        hit: Cell::new(None),
    });
    let tap = Tap {
        inner: decoder,
        hasher: Sha256::new(),
        meter: Rc::clone(&meter),
    };
    let mut archive = tar::Archive::new(tap);
    let mut tree = Tree::new(root);
    let result = apply(&mut archive, &mut tree, &meter, budget);
    let result = result.and_then(|last| {
        tree.finish()
            .map_err(|(p, f)| fail_error(f, &shown(&p), &meter, budget))?;
        // The rest of the stream (the end-of-archive blocks and any
        // padding) is part of the diff_id too.
        let mut tap = archive.into_inner();
        io::copy(&mut tap, &mut io::sink()).map_err(|e| stream_error(e, &meter, budget, last))?;
        Ok(hex::encode(tap.hasher.finalize()))
    });
    budget.read = budget.read.saturating_add(meter.read.get());
    result
}

/// Apply every entry; returns the name of the last one.
fn apply<R: Read>(
    archive: &mut tar::Archive<Tap<R>>,
    tree: &mut Tree,
    meter: &Meter,
    budget: &mut Budget,
) -> Result<Option<String>, UnpackError> {
    let mut entries = archive
        .entries()
        .map_err(|e| stream_error(e, meter, budget, None))?;
    let mut buf = vec![0u8; 128 * 1024];
    let mut last: Option<String> = None;
    loop {
        meter.meta_from.set(Some(meter.read.get()));
        let next = entries.next();
        meter.meta_from.set(None);
        let mut entry = match next {
            None => return Ok(last),
            Some(Ok(e)) => e,
            Some(Err(e)) => return Err(stream_error(e, meter, budget, last)),
        };
        let raw = entry.path_bytes().into_owned();
        let name = String::from_utf8_lossy(&raw).into_owned();
        budget.entries += 1;
        if budget.entries > budget.caps.max_entries {
            return Err(UnpackError::Cap {
                cap: "max_entries",
                limit: budget.caps.max_entries,
                path: Some(name),
            });
        }
        apply_entry(tree, &mut entry, &raw, budget, &mut buf)
            .map_err(|f| fail_error(f, &name, meter, budget))?;
        // Data the entry's kind does not use is read here, so that what the
        // next call reads is metadata only.
        io::copy(&mut entry, &mut io::sink())
            .map_err(|e| stream_error(e, meter, budget, Some(name.clone())))?;
        last = Some(name);
    }
}

/// What one entry is, once its name is known not to be a whiteout.
enum What {
    Dir,
    File,
    Symlink,
    Hardlink,
    Fifo,
    Device,
    Skip,
}

fn apply_entry<R: Read>(
    tree: &mut Tree,
    entry: &mut tar::Entry<'_, R>,
    raw: &[u8],
    budget: &mut Budget,
    buf: &mut [u8],
) -> Result<(), Fail> {
    let comps = path::split(raw).map_err(Fail::Refuse)?;
    match path::marker(&comps).map_err(Fail::Refuse)? {
        Marker::None => {}
        Marker::AufsMeta => return Ok(()),
        Marker::Opaque => return tree.opaque(&comps[..comps.len() - 1]),
        Marker::Whiteout(name) => return tree.whiteout(&comps[..comps.len() - 1], &name),
    }
    let header = entry.header();
    // The type byte as written: `\0` (old tar) with a trailing `/` is a
    // directory.
    let typeflag = header.as_bytes()[156];
    let what = match header.entry_type() {
        EntryType::Regular if typeflag == 0 && raw.ends_with(b"/") => What::Dir,
        EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => What::File,
        EntryType::Directory => What::Dir,
        EntryType::Symlink => What::Symlink,
        EntryType::Link => What::Hardlink,
        EntryType::Fifo => What::Fifo,
        EntryType::Char | EntryType::Block => What::Device,
        EntryType::XGlobalHeader => What::Skip,
        t => {
            return Err(Fail::Refuse(format!(
                "entry type {:?} ({:?}) is not unpacked",
                t,
                char::from(typeflag)
            )));
        }
    };
    if matches!(what, What::Skip) {
        return Ok(());
    }
    let mode = header
        .mode()
        .map_err(|e| Fail::Refuse(format!("unreadable mode field: {e}")))?;
    let mtime = tree::clamp_mtime(header.mtime().unwrap_or(0));
    let Some((name, parent)) = comps.split_last() else {
        return match what {
            What::Dir => Ok(()),
            _ => Err(Fail::Refuse("the entry names the rootfs itself".into())),
        };
    };
    match what {
        What::Dir => tree.dir(parent, name, (mode & 0o1777) | 0o700, mtime),
        What::File => {
            let size = entry.size();
            let mut f = tree.file(parent, name)?;
            let mut written = 0u64;
            loop {
                let n = match entry.read(buf) {
                    Ok(0) => break,
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(Fail::Stream(e)),
                };
                written += n as u64;
                budget.written = budget.written.saturating_add(n as u64);
                if budget.written > budget.caps.max_bytes {
                    return Err(Fail::Written);
                }
                f.write_all(&buf[..n])
                    .map_err(tree::sys_io("writing the file"))?;
            }
            if written != size {
                return Err(Fail::Stream(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("the layer ends {} bytes into the entry's {size}", written),
                )));
            }
            tree::finish_file(&f, mode & 0o777, mtime)
        }
        What::Symlink => {
            let target = entry
                .link_name_bytes()
                .ok_or_else(|| Fail::Refuse("a symlink without a target".into()))?
                .into_owned();
            tree.symlink(parent, name, &target, mtime)
        }
        What::Hardlink => {
            let target = entry
                .link_name_bytes()
                .ok_or_else(|| Fail::Refuse("a hard link without a target".into()))?;
            let target = path::split(&target)
                .map_err(|why| Fail::Refuse(format!("the hard link's target: {why}")))?;
            tree.hardlink(parent, name, &target)
        }
        What::Fifo => tree.fifo(parent, name, mode & 0o777, mtime),
        What::Device => tree.device(parent, name),
        What::Skip => Ok(()),
    }
}

fn shown(path: &[fsat::Name]) -> String {
    let parts: Vec<String> = path
        .iter()
        .map(|n| String::from_utf8_lossy(n.as_bytes()).into_owned())
        .collect();
    parts.join("/")
}

fn fail_error(f: Fail, path: &str, meter: &Meter, budget: &Budget) -> UnpackError {
    match f {
        Fail::Refuse(why) => UnpackError::Refused {
            path: path.to_string(),
            why,
        },
        Fail::Sys { what, source } => UnpackError::Io {
            path: path.to_string(),
            what,
            source,
        },
        Fail::Stream(e) => match meter.hit.get() {
            // A cap hit inside an entry's data names that entry.
            Some(Hit::Bytes) => cap_bytes(budget, Some(path.to_string())),
            Some(Hit::Metadata) => UnpackError::Metadata { after: None },
            None => UnpackError::Read {
                after: None,
                source: io::Error::new(e.kind(), format!("in entry {path:?}: {e}")),
            },
        },
        Fail::Written => cap_bytes(budget, Some(path.to_string())),
    }
}

fn cap_bytes(budget: &Budget, path: Option<String>) -> UnpackError {
    UnpackError::Cap {
        cap: "max_bytes",
        limit: budget.caps.max_bytes,
        path,
    }
}

/// A read error of the stream outside an entry's data (headers, the end),
/// after the entry `last`.
fn stream_error(e: io::Error, meter: &Meter, budget: &Budget, last: Option<String>) -> UnpackError {
    match meter.hit.get() {
        Some(Hit::Bytes) => cap_bytes(budget, None),
        Some(Hit::Metadata) => UnpackError::Metadata { after: last },
        None => UnpackError::Read {
            after: last,
            source: e,
        },
    }
}

/// The decompressed stream.
enum Decoder<R: Read> {
    Plain(R),
    Gzip(flate2::read::MultiGzDecoder<R>),
    Zstd(zstd::stream::read::Decoder<'static, BufReader<R>>),
}

impl<R: Read> Read for Decoder<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Decoder::Plain(r) => r.read(buf),
            Decoder::Gzip(r) => r.read(buf),
            Decoder::Zstd(r) => r.read(buf),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Hit {
    /// `max_bytes` of the uncompressed stream.
    Bytes,
    /// [`MAX_ENTRY_METADATA`] for one entry.
    Metadata,
}

/// Counts of the uncompressed stream, shared by [`Tap`] (inside the tar
/// reader) and the loop over entries.
struct Meter {
    read: Cell<u64>,
    /// The most this layer may read (what is left of `max_bytes`).
    limit: u64,
    /// While the tar reader looks for the next entry: the count when it
    /// began.
    meta_from: Cell<Option<u64>>,
    /// The cap that stopped the stream.
    hit: Cell<Option<Hit>>,
}

/// The uncompressed stream, hashed and counted as it is read; it fails
/// once a cap is passed.
struct Tap<R: Read> {
    inner: Decoder<R>,
    hasher: Sha256,
    meter: Rc<Meter>,
}

impl<R: Read> Read for Tap<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(hit) = self.meter.hit.get() {
            return Err(cap_io_error(hit));
        }
        let n = self.inner.read(buf)?;
        let total = self.meter.read.get().saturating_add(n as u64);
        self.meter.read.set(total);
        let hit = if total > self.meter.limit {
            Some(Hit::Bytes)
        } else if let Some(from) = self.meter.meta_from.get()
            && total - from > MAX_ENTRY_METADATA
        {
            Some(Hit::Metadata)
        } else {
            None
        };
        if let Some(hit) = hit {
            self.meter.hit.set(Some(hit));
            return Err(cap_io_error(hit));
        }
        self.hasher.update(&buf[..n]);
        Ok(n)
    }
}

fn cap_io_error(hit: Hit) -> io::Error {
    io::Error::other(match hit {
        Hit::Bytes => "the max_bytes cap is reached",
        Hit::Metadata => "an entry's tar metadata is over its cap",
    })
}
