//! The content-addressed image store.
//!
//! Layout of the store directory (every directory mode 0700):
//!
//! - `blobs/sha256/HEX`: blobs (indexes, manifests, configs, layers) by
//!   digest. A blob is written to a temporary name (`.tmp-*`) beside its
//!   final one, verified against its digest and size while it is written,
//!   fsync'd, then renamed.
//! - `images/HEX.json`: one record per pinned digest (the digest an image was
//!   named by: an index or a manifest): the names it was pulled or loaded as,
//!   the platform manifest, the config and the layers. A record is written
//!   (atomically) only once every blob it names is in the store and the
//!   image is unpacked (every layer's diff_id checked, every entry applied),
//!   so a record is a complete image that unpacks.
//! - `rootfs/HEX/`: the unpacked tree of the platform manifest `HEX`, in
//!   `rootfs/HEX/root`, with the completion marker `rootfs/HEX/complete`,
//!   unpacked when the image is pulled or imported (again at first use if
//!   it was removed since).
//!   A tree is unpacked in `rootfs/.tmp-HEX/`, the marker written last, then
//!   renamed into place; a tree without the marker is never used and is
//!   removed by the next unpack of that image.
//! - `locks/`: per-image lock files, so two concurrent pulls or unpacks of
//!   one image do the work once; `lock`: the store lock, shared by pulls,
//!   imports and unpacks, exclusive for [`Store::gc`].
//!
//! A writer killed at any point leaves no record of an incomplete image,
//! no unverified blob under a digest's name and no tree with a marker, only
//! temporary names: the next pull of the image reuses the verified blobs
//! and fetches the rest, removing the temporary files no live writer holds
//! (each writer holds an `flock` on its own), and the next unpack removes
//! the partial tree; [`Store::gc`] removes every temporary name.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

use crate::digest::{Digest, Verifier, VerifyError, VerifyingReader};
use crate::manifest::{self, ImageConfig, ManifestError, Parsed, Platform};
use crate::unpack::{self, Budget, Caps, Compression, UnpackError};

/// The largest index or manifest accepted (the distribution spec's usual cap).
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// The largest image config accepted.
pub const MAX_CONFIG_BYTES: u64 = 16 << 20;
/// How deep indexes may nest.
const MAX_INDEX_DEPTH: usize = 4;
/// An empty temporary file whose lock nobody holds is removed once it is
/// this old (a younger one may belong to a writer between creating and
/// locking it; a writer writes only once it holds the lock).
const STALE_AFTER: Duration = Duration::from_secs(10);
const TMP_PREFIX: &str = ".tmp-";
const MARKER: &str = "complete";

/// Errors of the store and of the sources that write into it.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A file-system operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, and to which path.
        what: String,
        /// The error.
        source: io::Error,
    },
    /// A blob did not match its digest or size.
    #[error(transparent)]
    Verify(#[from] VerifyError),
    /// An index, manifest or config that is refused.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The unpacker refused a layer.
    #[error("layer {index} ({digest}): {source}")]
    Unpack {
        /// The layer's position, bottom first from 0.
        index: usize,
        /// The layer blob.
        digest: Digest,
        /// The unpacker's error.
        source: UnpackError,
    },
    /// A layer whose uncompressed content does not match the config.
    #[error(
        "layer {index} ({digest}): its uncompressed content has digest sha256:{actual}, but the image config's rootfs.diff_ids says {expected}"
    )]
    DiffId {
        /// The layer's position, bottom first from 0.
        index: usize,
        /// The layer blob.
        digest: Digest,
        /// The config's diff_id.
        expected: Digest,
        /// What the layer unpacked to.
        actual: String,
    },
    /// No such image in the store.
    #[error("image {0} is not in the store")]
    NotFound(String),
    /// A source (registry, layout, archive) failed.
    #[error("{0}")]
    Source(String),
}

pub(crate) fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> StoreError {
    let what = what.into();
    move |source| match VerifyError::from_io(&source) {
        Some(v) => StoreError::Verify(v.clone()),
        None => StoreError::Io { what, source },
    }
}

/// A layer as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RecordLayer {
    /// The blob.
    pub digest: Digest,
    /// Its size.
    pub size: u64,
    /// Its media type as the manifest gives it.
    pub media_type: String,
}

/// A complete image in the store.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRecord {
    /// The names it was pulled or loaded as (`registry/repository`, or the
    /// name an archive gave it).
    pub names: Vec<String>,
    /// The pinned digest: what the image is named by (an index or a manifest).
    pub digest: Digest,
    /// The platform manifest (equal to `digest` unless that is an index).
    pub manifest: Digest,
    /// The image config.
    pub config: Digest,
    /// The layers, bottom first.
    pub layers: Vec<RecordLayer>,
}

impl ImageRecord {
    /// `NAME@DIGEST` for each name (`DIGEST` alone when it has none).
    pub fn references(&self) -> Vec<String> {
        if self.names.is_empty() {
            return vec![self.digest.to_string()];
        }
        self.names
            .iter()
            .map(|n| format!("{n}@{}", self.digest))
            .collect()
    }

    /// The total size of the layers, compressed.
    pub fn layers_size(&self) -> u64 {
        self.layers.iter().map(|l| l.size).sum()
    }
}

/// A record, with its config and where it is unpacked.
#[derive(Clone, Debug)]
pub struct Inspect {
    /// The record.
    pub record: ImageRecord,
    /// The parsed config.
    pub config: ImageConfig,
    /// The complete rootfs, if unpacked.
    pub rootfs: Option<PathBuf>,
}

/// Progress of a pull or import.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Layers in the store so far.
    pub layers_done: usize,
    /// Layers of the image.
    pub layers_total: usize,
    /// Layer bytes in the store so far.
    pub bytes_done: u64,
    /// Layer bytes of the image.
    pub bytes_total: u64,
}

/// The result of a pull or an import of one image.
#[derive(Clone, Debug)]
pub struct Ingested {
    /// The complete record.
    pub record: ImageRecord,
    /// Whether any blob was fetched (false: the image was complete already).
    pub fetched: bool,
}

/// The result of [`Store::unpack`].
#[derive(Clone, Debug)]
pub struct Unpacked {
    /// The complete rootfs.
    pub path: PathBuf,
    /// Whether this call unpacked it (false: it was unpacked already).
    pub fresh: bool,
}

/// What [`Store::gc`] removed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Blobs removed.
    pub blobs: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Unpacked trees removed (unreferenced or incomplete).
    pub rootfs: usize,
    /// Temporary files and trees removed.
    pub temporary: usize,
}

/// What a source is asked for.
#[derive(Clone, Debug)]
pub(crate) struct Want {
    pub digest: Digest,
    /// Known from the referring descriptor; `None` for the pinned top level.
    pub size: Option<u64>,
    /// Whether it is a manifest or index (fetched from a registry's
    /// manifests endpoint) rather than a config or layer.
    pub is_manifest: bool,
}

/// A source of blobs for [`Store::ingest`].
pub(crate) trait Fetcher {
    /// Write the blob into `out`, which verifies it (a verification failure
    /// is an `io::Error` that [`VerifyError::from_io`] recovers).
    fn fetch(&mut self, want: &Want, out: &mut dyn Write) -> Result<(), StoreError>;
}

/// The content-addressed store (see the module docs).
#[derive(Clone, Debug)]
pub struct Store {
    dir: PathBuf,
    /// Caps on one image's unpacked size and entries.
    caps: Caps,
}

/// A held lock; released when dropped.
#[derive(Debug)]
pub struct Lock(#[allow(dead_code)] Flock<File>);

fn lock_file(path: &Path, arg: FlockArg) -> Result<Lock, StoreError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(path)
        .map_err(io_err(format!("open lock {}", path.display())))?;
    let mut file = file;
    loop {
        match Flock::lock(file, arg) {
            Ok(l) => return Ok(Lock(l)),
            Err((f, nix::errno::Errno::EINTR)) => file = f,
            Err((_, e)) => {
                return Err(StoreError::Io {
                    what: format!("lock {}", path.display()),
                    source: e.into(),
                });
            }
        }
    }
}

/// Try to take an exclusive lock on an existing file without waiting.
fn try_lock(path: &Path) -> Option<Flock<File>> {
    let file = File::open(path).ok()?;
    Flock::lock(file, FlockArg::LockExclusiveNonblock).ok()
}

/// The unpack caps: [`Caps::default`] (8 GiB and 1,000,000 entries per
/// image), or `CORDON_UNPACK_MAX_BYTES` / `CORDON_UNPACK_MAX_ENTRIES`.
fn caps_from_env() -> Result<Caps, StoreError> {
    let mut caps = Caps::default();
    for (var, slot) in [
        ("CORDON_UNPACK_MAX_BYTES", &mut caps.max_bytes),
        ("CORDON_UNPACK_MAX_ENTRIES", &mut caps.max_entries),
    ] {
        if let Some(v) = std::env::var_os(var) {
            *slot = v
                .to_str()
                .and_then(|s| s.parse().ok())
                .filter(|n| *n > 0)
                .ok_or_else(|| StoreError::Source(format!("{var}: not a positive integer")))?;
        }
    }
    Ok(caps)
}

impl Store {
    /// The same store with other unpack caps.
    pub fn with_caps(mut self, caps: Caps) -> Store {
        self.caps = caps;
        self
    }
}

fn mkdir_private(path: &Path) -> Result<(), StoreError> {
    match fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let meta = fs::metadata(path).map_err(io_err(format!("stat {}", path.display())))?;
            if !meta.is_dir() {
                return Err(StoreError::Io {
                    what: format!("{} is not a directory", path.display()),
                    source: io::Error::from(io::ErrorKind::AlreadyExists),
                });
            }
            Ok(())
        }
        Err(e) => Err(io_err(format!("create {}", path.display()))(e)),
    }
}

fn fsync_dir(path: &Path) -> Result<(), StoreError> {
    File::open(path)
        .and_then(|d| d.sync_all())
        .map_err(io_err(format!("fsync {}", path.display())))
}

fn unique_suffix() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!(
        "{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Remove a tree that may hold directories without write permission.
pub(crate) fn remove_tree(path: &Path) -> io::Result<()> {
    match fs::remove_dir_all(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(_) => {
            make_writable(path);
            match fs::remove_dir_all(path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                other => other,
            }
        }
    }
}

fn make_writable(path: &Path) {
    let Ok(meta) = fs::symlink_metadata(path) else {
        return;
    };
    if !meta.is_dir() {
        return;
    }
    let mode = meta.permissions().mode();
    if mode & 0o700 != 0o700 {
        let _ = fs::set_permissions(path, fs::Permissions::from_mode(mode | 0o700));
    }
    if let Ok(entries) = fs::read_dir(path) {
        for e in entries.flatten() {
            make_writable(&e.path());
        }
    }
}

/// What a [`BlobWriter`] checks.
enum Check {
    /// Digest and size known: fails as soon as the size is exceeded.
    Exact(Verifier),
    /// Digest known, size not: at most `max` bytes.
    Digest {
        digest: Digest,
        hasher: Sha256,
        seen: u64,
        max: u64,
    },
    /// Neither: named by what it hashes to.
    Unnamed { hasher: Sha256, seen: u64 },
}

/// A blob being written into the store under a temporary name, verified as
/// it is written; [`BlobWriter::commit`] renames it into place, dropping it
/// removes it.
pub struct BlobWriter<'a> {
    store: &'a Store,
    tmp: PathBuf,
    file: Option<Flock<File>>,
    check: Option<Check>,
}

impl BlobWriter<'_> {
    /// Bytes written so far.
    pub fn written(&self) -> u64 {
        match &self.check {
            Some(Check::Exact(v)) => v.seen(),
            Some(Check::Digest { seen, .. } | Check::Unnamed { seen, .. }) => *seen,
            None => 0,
        }
    }

    fn account(&mut self, bytes: &[u8]) -> Result<(), VerifyError> {
        match &mut self.check {
            Some(Check::Exact(v)) => v.update(bytes)?,
            Some(Check::Digest {
                digest,
                hasher,
                seen,
                max,
            }) => {
                *seen += bytes.len() as u64;
                if *seen > *max {
                    return Err(VerifyError::TooLong {
                        digest: *digest,
                        expected: *max,
                    });
                }
                hasher.update(bytes);
            }
            Some(Check::Unnamed { hasher, seen }) => {
                *seen += bytes.len() as u64;
                hasher.update(bytes);
            }
            None => {}
        }
        Ok(())
    }

    /// Verify what was written, make it durable and move it to its name.
    pub fn commit(mut self) -> Result<(Digest, PathBuf), StoreError> {
        let digest = match self.check.take() {
            Some(Check::Exact(v)) => {
                let d = v.expected();
                v.finish()?;
                d
            }
            Some(Check::Digest {
                digest,
                hasher,
                seen: _,
                max: _,
            }) => {
                let actual = Digest::from_bytes(hasher.finalize().into());
                if actual != digest {
                    return Err(VerifyError::WrongDigest {
                        expected: digest,
                        actual,
                    }
                    .into());
                }
                digest
            }
            Some(Check::Unnamed { hasher, .. }) => Digest::from_bytes(hasher.finalize().into()),
            None => return Err(StoreError::Source("blob writer used twice".into())),
        };
        let file = self
            .file
            .take()
            .ok_or_else(|| StoreError::Source("blob writer used twice".into()))?;
        file.sync_all()
            .map_err(io_err(format!("fsync {}", self.tmp.display())))?;
        let path = self.store.blob_path(&digest);
        fs::rename(&self.tmp, &path).map_err(io_err(format!(
            "rename {} to {}",
            self.tmp.display(),
            path.display()
        )))?;
        drop(file);
        fsync_dir(&self.store.blobs_dir())?;
        Ok((digest, path))
    }
}

impl Write for BlobWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.account(buf).map_err(VerifyError::into_io)?;
        let file = self
            .file
            .as_mut()
            .ok_or_else(|| io::Error::other("blob writer already committed"))?;
        file.write_all(buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.file.as_mut() {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

impl Drop for BlobWriter<'_> {
    fn drop(&mut self) {
        if self.file.take().is_some() {
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// A writer that reports how much has gone through it.
struct Reporting<'a, 'b> {
    inner: &'a mut BlobWriter<'b>,
    on_bytes: &'a mut dyn FnMut(u64),
}

impl Write for Reporting<'_, '_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        (self.on_bytes)(self.inner.written());
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[derive(Serialize, Deserialize)]
struct Marker {
    manifest: Digest,
    diff_ids: Vec<Digest>,
}

impl Store {
    /// Open the store at `dir`, creating it as needed (0700 but for the
    /// store itself and `rootfs/`, 0711: see below).
    pub fn open(dir: impl Into<PathBuf>) -> Result<Store, StoreError> {
        let store = Store {
            dir: dir.into(),
            caps: caps_from_env()?,
        };
        if let Some(parent) = store.dir.parent()
            && !parent.as_os_str().is_empty()
        {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(io_err(format!("create {}", parent.display())))?;
        }
        mkdir_private(&store.dir)?;
        for sub in ["blobs", "blobs/sha256", "images", "rootfs", "locks"] {
            mkdir_private(&store.dir.join(sub))?;
        }
        // A sandbox runs as another uid than the broker (65534 when the
        // broker is root) and must reach its image's tree: the store and
        // `rootfs/` are traversable by others (0711), never listable; every
        // other part stays 0700.
        for d in [store.dir.clone(), store.rootfs_dir()] {
            fs::set_permissions(&d, fs::Permissions::from_mode(0o711))
                .map_err(io_err(format!("chmod 0711 {}", d.display())))?;
        }
        Ok(store)
    }

    /// Where the store is by default: `$CORDON_STORE` when set; else
    /// `/var/lib/cordon` when running as root; else `$XDG_DATA_HOME/cordon`,
    /// or `~/.local/share/cordon` when that is unset.
    /// (See `cordon_dirs`.)
    pub fn default_dir() -> Result<PathBuf, StoreError> {
        cordon_dirs::Dirs::current().images().map_err(|_| {
            StoreError::Source("no image store: set CORDON_STORE, XDG_DATA_HOME or HOME".into())
        })
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn blobs_dir(&self) -> PathBuf {
        self.dir.join("blobs/sha256")
    }

    fn images_dir(&self) -> PathBuf {
        self.dir.join("images")
    }

    fn rootfs_dir(&self) -> PathBuf {
        self.dir.join("rootfs")
    }

    /// Where the blob `digest` is (whether or not it is there).
    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.blobs_dir().join(digest.hex())
    }

    /// Whether the blob is in the store with the given size.
    pub fn has_blob(&self, digest: &Digest, size: u64) -> bool {
        fs::metadata(self.blob_path(digest)).is_ok_and(|m| m.is_file() && m.len() == size)
    }

    /// Take the store lock, shared (pulls, imports, unpacks) or exclusive (gc).
    pub fn lock(&self, exclusive: bool) -> Result<Lock, StoreError> {
        let arg = if exclusive {
            FlockArg::LockExclusive
        } else {
            FlockArg::LockShared
        };
        lock_file(&self.dir.join("lock"), arg)
    }

    fn lock_image(&self, what: &str, digest: &Digest) -> Result<Lock, StoreError> {
        lock_file(
            &self
                .dir
                .join("locks")
                .join(format!("{what}-{}.lock", digest.hex())),
            FlockArg::LockExclusive,
        )
    }

    /// Start writing a blob of known digest and size.
    pub fn blob_writer(&self, digest: &Digest, size: u64) -> Result<BlobWriter<'_>, StoreError> {
        self.new_writer(
            &format!("{}-", digest.hex()),
            Check::Exact(Verifier::new(*digest, size)),
        )
    }

    /// Start writing a blob of known digest, unknown size (at most `max`).
    pub(crate) fn blob_writer_capped(
        &self,
        digest: &Digest,
        max: u64,
    ) -> Result<BlobWriter<'_>, StoreError> {
        self.new_writer(
            &format!("{}-", digest.hex()),
            Check::Digest {
                digest: *digest,
                hasher: Sha256::new(),
                seen: 0,
                max,
            },
        )
    }

    /// Start writing a blob named by what it hashes to.
    pub(crate) fn blob_writer_unnamed(&self) -> Result<BlobWriter<'_>, StoreError> {
        self.new_writer(
            "unnamed-",
            Check::Unnamed {
                hasher: Sha256::new(),
                seen: 0,
            },
        )
    }

    fn new_writer(&self, stem: &str, check: Check) -> Result<BlobWriter<'_>, StoreError> {
        let tmp = self
            .blobs_dir()
            .join(format!("{TMP_PREFIX}{stem}{}", unique_suffix()));
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(io_err(format!("create {}", tmp.display())))?;
        let file = Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| {
            StoreError::Io {
                what: format!("lock {}", tmp.display()),
                source: e.into(),
            }
        })?;
        Ok(BlobWriter {
            store: self,
            tmp,
            file: Some(file),
            check: Some(check),
        })
    }

    /// Write a blob of known digest and size from `reader`, verifying it.
    /// A caller that writes blobs for an image it has not recorded yet
    /// holds the shared store lock ([`Store::lock`]) until it has, so
    /// [`Store::gc`] cannot take them.
    pub fn write_blob(
        &self,
        digest: &Digest,
        size: u64,
        mut reader: impl Read,
    ) -> Result<PathBuf, StoreError> {
        let mut w = self.blob_writer(digest, size)?;
        io::copy(&mut reader, &mut w).map_err(io_err(format!("write blob {digest}")))?;
        Ok(w.commit()?.1)
    }

    /// A reader of a stored blob that verifies it again as it is read.
    pub fn open_blob(
        &self,
        digest: &Digest,
        size: u64,
    ) -> Result<VerifyingReader<File>, StoreError> {
        let path = self.blob_path(digest);
        let f = File::open(&path).map_err(io_err(format!("open blob {}", path.display())))?;
        Ok(VerifyingReader::new(f, *digest, size))
    }

    /// Read a small stored blob whole (at most `max` bytes), verified.
    pub fn read_blob(&self, digest: &Digest, max: u64) -> Result<Vec<u8>, StoreError> {
        let path = self.blob_path(digest);
        let f = File::open(&path).map_err(io_err(format!("open blob {}", path.display())))?;
        let size = f
            .metadata()
            .map_err(io_err(format!("stat {}", path.display())))?
            .len();
        if size > max {
            return Err(StoreError::Source(format!(
                "blob {digest} is {size} bytes, more than the {max} allowed for it"
            )));
        }
        let mut out = Vec::new();
        VerifyingReader::new(f, *digest, size)
            .read_to_end(&mut out)
            .map_err(io_err(format!("read blob {digest}")))?;
        Ok(out)
    }

    /// Make sure `want` is in the store (fetching it if needed); for a
    /// manifest or config, return its verified bytes.
    fn ensure(
        &self,
        fetcher: &mut dyn Fetcher,
        want: &Want,
        max: u64,
        fetched: &mut bool,
    ) -> Result<Vec<u8>, StoreError> {
        let present = match want.size {
            Some(size) => self.has_blob(&want.digest, size),
            None => self.blob_path(&want.digest).is_file(),
        };
        if present {
            match self.read_blob(&want.digest, max) {
                Ok(bytes) => return Ok(bytes),
                // A damaged blob is fetched again.
                Err(StoreError::Verify(_)) => {
                    let _ = fs::remove_file(self.blob_path(&want.digest));
                }
                Err(e) => return Err(e),
            }
        }
        if let Some(size) = want.size
            && size > max
        {
            return Err(StoreError::Source(format!(
                "{} is {size} bytes, more than the {max} allowed for it",
                want.digest
            )));
        }
        let mut w = match want.size {
            Some(size) => self.blob_writer(&want.digest, size)?,
            None => self.blob_writer_capped(&want.digest, max)?,
        };
        fetcher.fetch(want, &mut w)?;
        w.commit()?;
        *fetched = true;
        self.read_blob(&want.digest, max)
    }

    /// Bring the image pinned by `pinned` into the store from `fetcher`:
    /// the pinned blob, the platform manifest it resolves to, the config and
    /// every layer, each verified; then unpack it (every layer decompressed,
    /// its diff_id checked, every entry applied by the unpacker); then write
    /// its record (adding `name`). An image that is refused (a blob that
    /// does not verify, a manifest or config refused, a layer or an entry
    /// the unpacker refuses, a diff_id that does not match) leaves nothing
    /// in the store: no record, no tree, and none of its blobs that no other
    /// record uses. A source that fails on the way (a registry unreachable,
    /// a blob missing from a layout) leaves the blobs verified so far for
    /// the next attempt to reuse.
    pub(crate) fn ingest(
        &self,
        fetcher: &mut dyn Fetcher,
        pinned: &Digest,
        pinned_size: Option<u64>,
        name: Option<&str>,
        progress: &mut dyn FnMut(&Progress),
    ) -> Result<Ingested, StoreError> {
        let _store = self.lock(false)?;
        let _image = self.lock_image("pull", pinned)?;
        if let Some(mut record) = self.read_record(pinned)?
            && self.is_complete(&record)
        {
            // A record whose tree is gone (or that was written before
            // imports unpacked) is verified again, here.
            if let Err(e) = self.unpack_record(&record) {
                if refuses(&e) {
                    self.discard(pinned, &record_blobs(&record));
                }
                return Err(e);
            }
            if let Some(n) = name
                && !record.names.iter().any(|x| x == n)
            {
                record.names.push(n.to_string());
                self.write_record(&record)?;
            }
            let total = record.layers_size();
            progress(&Progress {
                layers_done: record.layers.len(),
                layers_total: record.layers.len(),
                bytes_done: total,
                bytes_total: total,
            });
            return Ok(Ingested {
                record,
                fetched: false,
            });
        }
        self.clean_stale_temporaries();
        let mut blobs = Vec::new();
        let result = self.ingest_new(fetcher, pinned, pinned_size, name, progress, &mut blobs);
        if let Err(e) = &result
            && refuses(e)
        {
            self.discard(pinned, &blobs);
        }
        result
    }

    /// [`Store::ingest`] of an image not complete in the store; `blobs`
    /// gets the digest of each blob of the image as it is learnt.
    fn ingest_new(
        &self,
        fetcher: &mut dyn Fetcher,
        pinned: &Digest,
        pinned_size: Option<u64>,
        name: Option<&str>,
        progress: &mut dyn FnMut(&Progress),
        blobs: &mut Vec<Digest>,
    ) -> Result<Ingested, StoreError> {
        let mut fetched = false;
        let mut want = Want {
            digest: *pinned,
            size: pinned_size,
            is_manifest: true,
        };
        let platform = Platform::host();
        let mut depth = 0;
        let manifest = loop {
            blobs.push(want.digest);
            let bytes = self.ensure(fetcher, &want, MAX_MANIFEST_BYTES, &mut fetched)?;
            match manifest::parse(&bytes)? {
                Parsed::Manifest(m) => break m,
                Parsed::Index(ix) => {
                    depth += 1;
                    if depth > MAX_INDEX_DEPTH {
                        return Err(StoreError::Source(format!(
                            "image {pinned}: indexes nested more than {MAX_INDEX_DEPTH} deep"
                        )));
                    }
                    let entry = ix.resolve(&platform)?;
                    want = Want {
                        digest: entry.blob.digest,
                        size: Some(entry.blob.size),
                        is_manifest: true,
                    };
                }
            }
        };
        let manifest_digest = want.digest;
        blobs.push(manifest.config.digest);
        blobs.extend(manifest.layers.iter().map(|l| l.blob.digest));
        let config_bytes = self.ensure(
            fetcher,
            &Want {
                digest: manifest.config.digest,
                size: Some(manifest.config.size),
                is_manifest: false,
            },
            MAX_CONFIG_BYTES,
            &mut fetched,
        )?;
        let config = manifest::parse_config(&config_bytes)?;
        check_config(&config, manifest.layers.len())?;
        let mut p = Progress {
            layers_done: 0,
            layers_total: manifest.layers.len(),
            bytes_done: 0,
            bytes_total: manifest.layers.iter().map(|l| l.blob.size).sum(),
        };
        progress(&p);
        for layer in &manifest.layers {
            let (digest, size) = (layer.blob.digest, layer.blob.size);
            if !self.has_blob(&digest, size) {
                let base = p;
                let mut on_bytes = |n: u64| {
                    progress(&Progress {
                        bytes_done: base.bytes_done + n,
                        ..base
                    })
                };
                let mut w = self.blob_writer(&digest, size)?;
                fetcher.fetch(
                    &Want {
                        digest,
                        size: Some(size),
                        is_manifest: false,
                    },
                    &mut Reporting {
                        inner: &mut w,
                        on_bytes: &mut on_bytes,
                    },
                )?;
                w.commit()?;
                fetched = true;
            }
            p.layers_done += 1;
            p.bytes_done += size;
            progress(&p);
        }
        let mut names = self
            .read_record(pinned)
            .ok()
            .flatten()
            .map(|r| r.names)
            .unwrap_or_default();
        if let Some(n) = name
            && !names.iter().any(|x| x == n)
        {
            names.push(n.to_string());
        }
        let record = ImageRecord {
            names,
            digest: *pinned,
            manifest: manifest_digest,
            config: manifest.config.digest,
            layers: manifest
                .layers
                .iter()
                .map(|l| RecordLayer {
                    digest: l.blob.digest,
                    size: l.blob.size,
                    media_type: l.blob.media_type.clone(),
                })
                .collect(),
        };
        // Verified whole before it is recorded: what could never be
        // unpacked never enters the store.
        self.unpack_record(&record)?;
        self.write_record(&record)?;
        Ok(Ingested { record, fetched })
    }

    /// Remove what a refused image left: the record of `pinned`, and each
    /// of `blobs` (and of the blobs `pinned` leads to) that no other record
    /// uses. Its tree was never completed (the unpacker removes its partial
    /// one).
    fn discard(&self, pinned: &Digest, blobs: &[Digest]) {
        let mut gone: BTreeSet<Digest> = blobs.iter().copied().collect();
        self.mark(pinned, 0, &mut gone, &mut BTreeSet::new());
        let _ = fs::remove_file(self.record_path(pinned));
        let _ = fsync_dir(&self.images_dir());
        self.remove_unused(&gone);
    }

    /// Remove each of `blobs` that no record (nor an index it pins) uses.
    /// The caller holds the shared store lock.
    pub(crate) fn remove_unused(&self, blobs: &BTreeSet<Digest>) {
        let mut used = BTreeSet::new();
        let mut manifests = BTreeSet::new();
        for r in self.ls().unwrap_or_default() {
            used.extend([r.digest, r.manifest, r.config]);
            used.extend(r.layers.iter().map(|l| l.digest));
            self.mark(&r.digest, 0, &mut used, &mut manifests);
        }
        for d in blobs.difference(&used) {
            let _ = fs::remove_file(self.blob_path(d));
        }
        let _ = fsync_dir(&self.blobs_dir());
    }

    fn record_path(&self, digest: &Digest) -> PathBuf {
        self.images_dir().join(format!("{}.json", digest.hex()))
    }

    fn read_record(&self, digest: &Digest) -> Result<Option<ImageRecord>, StoreError> {
        let path = self.record_path(digest);
        match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| StoreError::Source(format!("image record {}: {e}", path.display()))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(format!("read {}", path.display()))(e)),
        }
    }

    fn write_record(&self, record: &ImageRecord) -> Result<(), StoreError> {
        let bytes = serde_json::to_vec_pretty(record)
            .map_err(|e| StoreError::Source(format!("encode image record: {e}")))?;
        write_atomic(
            &self.images_dir(),
            &format!("{}.json", record.digest.hex()),
            &bytes,
        )
    }

    /// Whether every blob the record names is in the store.
    fn is_complete(&self, r: &ImageRecord) -> bool {
        self.blob_path(&r.digest).is_file()
            && self.blob_path(&r.manifest).is_file()
            && self.blob_path(&r.config).is_file()
            && r.layers.iter().all(|l| self.has_blob(&l.digest, l.size))
    }

    /// Every image record.
    pub fn ls(&self) -> Result<Vec<ImageRecord>, StoreError> {
        let dir = self.images_dir();
        let mut out = Vec::new();
        for entry in fs::read_dir(&dir).map_err(io_err(format!("read {}", dir.display())))? {
            let entry = entry.map_err(io_err(format!("read {}", dir.display())))?;
            let name = entry.file_name();
            let Some(hex) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            let Ok(digest) = Digest::from_hex(hex) else {
                continue;
            };
            if let Some(r) = self.read_record(&digest)? {
                out.push(r);
            }
        }
        out.sort_by(|a, b| a.names.cmp(&b.names).then(a.digest.cmp(&b.digest)));
        Ok(out)
    }

    /// The record of the image pinned by `digest`, or whose platform
    /// manifest is `digest`.
    pub fn find(&self, digest: &Digest) -> Result<Option<ImageRecord>, StoreError> {
        if let Some(r) = self.read_record(digest)? {
            return Ok(Some(r));
        }
        Ok(self.ls()?.into_iter().find(|r| r.manifest == *digest))
    }

    /// The record, config and rootfs (if unpacked) of an image.
    pub fn inspect(&self, digest: &Digest) -> Result<Inspect, StoreError> {
        let record = self
            .find(digest)?
            .ok_or_else(|| StoreError::NotFound(digest.to_string()))?;
        let config = manifest::parse_config(&self.read_blob(&record.config, MAX_CONFIG_BYTES)?)?;
        let rootfs = self
            .complete_rootfs(&record.manifest)
            .then(|| self.rootfs_path(&record.manifest));
        Ok(Inspect {
            record,
            config,
            rootfs,
        })
    }

    /// Remove the records of the image pinned by `digest` (or whose platform
    /// manifest it is); returns how many were removed. The blobs and the
    /// rootfs stay until [`Store::gc`].
    pub fn rm(&self, digest: &Digest) -> Result<usize, StoreError> {
        let _store = self.lock(false)?;
        let mut removed = 0;
        for r in self.ls()? {
            if r.digest == *digest || r.manifest == *digest {
                let _image = self.lock_image("pull", &r.digest)?;
                let path = self.record_path(&r.digest);
                fs::remove_file(&path).map_err(io_err(format!("remove {}", path.display())))?;
                removed += 1;
            }
        }
        if removed > 0 {
            fsync_dir(&self.images_dir())?;
        }
        Ok(removed)
    }

    /// Remove every blob and rootfs that no record references, nor any image
    /// in `keep` (pinned or platform manifest digests, e.g. those a cordon
    /// manifest names), and every temporary file and incomplete tree. Waits
    /// for running pulls, imports and unpacks to finish.
    pub fn gc(&self, keep: &[Digest]) -> Result<GcReport, StoreError> {
        let _store = self.lock(true)?;
        let mut report = GcReport::default();
        let mut blobs = BTreeSet::new();
        let mut manifests = BTreeSet::new();
        let records = self.ls()?;
        let mut roots: Vec<Digest> = keep.to_vec();
        for r in &records {
            roots.push(r.digest);
            manifests.insert(r.manifest);
            blobs.extend([r.digest, r.manifest, r.config]);
            blobs.extend(r.layers.iter().map(|l| l.digest));
        }
        for root in roots {
            self.mark(&root, 0, &mut blobs, &mut manifests);
        }
        let dir = self.blobs_dir();
        for entry in fs::read_dir(&dir).map_err(io_err(format!("read {}", dir.display())))? {
            let entry = entry.map_err(io_err(format!("read {}", dir.display())))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let path = entry.path();
            if name.starts_with(TMP_PREFIX) {
                if fs::remove_file(&path).is_ok() {
                    report.temporary += 1;
                }
                continue;
            }
            let Ok(d) = Digest::from_hex(&name) else {
                continue;
            };
            if !blobs.contains(&d) {
                let len = entry.metadata().map_or(0, |m| m.len());
                fs::remove_file(&path).map_err(io_err(format!("remove {}", path.display())))?;
                report.blobs += 1;
                report.bytes += len;
            }
        }
        let dir = self.rootfs_dir();
        for entry in fs::read_dir(&dir).map_err(io_err(format!("read {}", dir.display())))? {
            let entry = entry.map_err(io_err(format!("read {}", dir.display())))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let path = entry.path();
            let keep_it = Digest::from_hex(&name)
                .is_ok_and(|d| manifests.contains(&d) && self.complete_rootfs(&d));
            if keep_it {
                continue;
            }
            remove_tree(&path).map_err(io_err(format!("remove {}", path.display())))?;
            if name.starts_with(TMP_PREFIX) {
                report.temporary += 1;
            } else {
                report.rootfs += 1;
            }
        }
        let dir = self.images_dir();
        for entry in fs::read_dir(&dir).map_err(io_err(format!("read {}", dir.display())))? {
            let entry = entry.map_err(io_err(format!("read {}", dir.display())))?;
            if entry.file_name().to_string_lossy().starts_with(TMP_PREFIX)
                && fs::remove_file(entry.path()).is_ok()
            {
                report.temporary += 1;
            }
        }
        // Lock files are only opened under the shared store lock, which this
        // holds exclusively: none is in use.
        let dir = self.dir.join("locks");
        if let Ok(entries) = fs::read_dir(&dir) {
            for entry in entries.flatten() {
                let _ = fs::remove_file(entry.path());
            }
        }
        fsync_dir(&self.blobs_dir())?;
        Ok(report)
    }

    /// Mark the blobs reachable from `digest` (an index or manifest) as kept.
    fn mark(
        &self,
        digest: &Digest,
        depth: usize,
        blobs: &mut BTreeSet<Digest>,
        manifests: &mut BTreeSet<Digest>,
    ) {
        blobs.insert(*digest);
        if depth > MAX_INDEX_DEPTH {
            return;
        }
        let Ok(bytes) = self.read_blob(digest, MAX_MANIFEST_BYTES) else {
            return;
        };
        match manifest::parse(&bytes) {
            Ok(Parsed::Index(ix)) => {
                for e in &ix.manifests {
                    self.mark(&e.blob.digest, depth + 1, blobs, manifests);
                }
            }
            Ok(Parsed::Manifest(m)) => {
                manifests.insert(*digest);
                blobs.insert(m.config.digest);
                blobs.extend(m.layers.iter().map(|l| l.blob.digest));
            }
            Err(_) => {}
        }
    }

    /// Remove temporary blob and record files that no live writer holds
    /// (every writer holds an exclusive `flock` on its temporary file).
    fn clean_stale_temporaries(&self) -> usize {
        let mut n = 0;
        for dir in [self.blobs_dir(), self.images_dir()] {
            let Ok(entries) = fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries.flatten() {
                if !entry.file_name().to_string_lossy().starts_with(TMP_PREFIX) {
                    continue;
                }
                let path = entry.path();
                let Some(_held) = try_lock(&path) else {
                    continue;
                };
                let Ok(meta) = fs::symlink_metadata(&path) else {
                    continue;
                };
                let old = meta
                    .modified()
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_some_and(|age| age >= STALE_AFTER);
                if (meta.len() > 0 || old) && fs::remove_file(&path).is_ok() {
                    n += 1;
                }
            }
        }
        n
    }

    fn rootfs_path(&self, manifest: &Digest) -> PathBuf {
        self.rootfs_dir().join(manifest.hex()).join("root")
    }

    fn complete_rootfs(&self, manifest: &Digest) -> bool {
        let marker = self.rootfs_dir().join(manifest.hex()).join(MARKER);
        fs::read(marker)
            .ok()
            .and_then(|b| serde_json::from_slice::<Marker>(&b).ok())
            .is_some_and(|m| m.manifest == *manifest)
            && self.rootfs_path(manifest).is_dir()
    }

    /// The complete rootfs of the image (by pinned or platform manifest
    /// digest), unpacking it first if needed.
    pub fn unpacked(&self, digest: &Digest) -> Result<PathBuf, StoreError> {
        self.unpack(digest).map(|u| u.path)
    }

    /// As [`Store::unpacked`], telling whether this call did the unpacking.
    ///
    /// Each layer is read from the store through a verifying reader and
    /// applied in order with the unpacker; each layer's uncompressed digest
    /// must match the config's `rootfs.diff_ids`. Any failure removes the
    /// partial tree. Concurrent calls for one image unpack it once.
    ///
    /// A pull or import unpacks the image before recording it, so an image
    /// in the store is unpacked already unless its tree was removed since
    /// (by hand), or it was recorded by a cordon that did not unpack at
    /// import.
    pub fn unpack(&self, digest: &Digest) -> Result<Unpacked, StoreError> {
        let _store = self.lock(false)?;
        let record = self
            .find(digest)?
            .ok_or_else(|| StoreError::NotFound(digest.to_string()))?;
        self.unpack_record(&record)
    }

    /// Unpack the image of `record` (which need not be written yet); the
    /// caller holds the shared store lock.
    fn unpack_record(&self, record: &ImageRecord) -> Result<Unpacked, StoreError> {
        let m = record.manifest;
        if self.complete_rootfs(&m) {
            return Ok(Unpacked {
                path: self.rootfs_path(&m),
                fresh: false,
            });
        }
        let _image = self.lock_image("unpack", &m)?;
        if self.complete_rootfs(&m) {
            return Ok(Unpacked {
                path: self.rootfs_path(&m),
                fresh: false,
            });
        }
        let final_dir = self.rootfs_dir().join(m.hex());
        let tmp = self.rootfs_dir().join(format!("{TMP_PREFIX}{}", m.hex()));
        for stale in [&final_dir, &tmp] {
            remove_tree(stale).map_err(io_err(format!("remove {}", stale.display())))?;
        }
        let result = self.unpack_into(record, &tmp);
        if let Err(e) = result {
            let _ = remove_tree(&tmp);
            return Err(e);
        }
        fs::rename(&tmp, &final_dir).map_err(|e| {
            let _ = remove_tree(&tmp);
            io_err(format!(
                "rename {} to {}",
                tmp.display(),
                final_dir.display()
            ))(e)
        })?;
        fsync_dir(&self.rootfs_dir())?;
        Ok(Unpacked {
            path: self.rootfs_path(&m),
            fresh: true,
        })
    }

    fn unpack_into(&self, record: &ImageRecord, tmp: &Path) -> Result<(), StoreError> {
        mkdir_private(tmp)?;
        fs::set_permissions(tmp, fs::Permissions::from_mode(0o711))
            .map_err(io_err(format!("chmod 0711 {}", tmp.display())))?;
        let root = tmp.join("root");
        fs::DirBuilder::new()
            .mode(0o755)
            .create(&root)
            .map_err(io_err(format!("create {}", root.display())))?;
        let manifest =
            manifest::parse_manifest(&self.read_blob(&record.manifest, MAX_MANIFEST_BYTES)?)?;
        let config =
            manifest::parse_config(&self.read_blob(&manifest.config.digest, MAX_CONFIG_BYTES)?)?;
        check_config(&config, manifest.layers.len())?;
        let mut budget = Budget::new(self.caps);
        for (index, (layer, expected)) in manifest.layers.iter().zip(&config.diff_ids).enumerate() {
            let digest = layer.blob.digest;
            let unpack_err = |source| StoreError::Unpack {
                index,
                digest,
                source,
            };
            let compression =
                Compression::from_media_type(layer.oci_media_type).map_err(unpack_err)?;
            let mut reader = self.open_blob(&digest, layer.blob.size)?;
            let applied = unpack::apply_layer(&root, &mut reader, compression, &mut budget);
            // The blob must verify to its end whatever the unpacker read of it.
            if let Err(e) = io::copy(&mut reader, &mut io::sink()) {
                let e = io_err(format!("read layer {digest}"))(e);
                if matches!(e, StoreError::Verify(_)) {
                    // Damaged in the store: the next pull fetches it again.
                    let _ = fs::remove_file(self.blob_path(&digest));
                }
                return Err(e);
            }
            let actual = applied.map_err(unpack_err)?;
            let actual = actual
                .strip_prefix("sha256:")
                .unwrap_or(&actual)
                .to_string();
            if actual != expected.hex() {
                return Err(StoreError::DiffId {
                    index,
                    digest,
                    expected: *expected,
                    actual,
                });
            }
        }
        nix::unistd::syncfs(File::open(tmp).map_err(io_err(format!("open {}", tmp.display())))?)
            .map_err(|e| StoreError::Io {
                what: format!("syncfs {}", tmp.display()),
                source: e.into(),
            })?;
        let marker = serde_json::to_vec(&Marker {
            manifest: record.manifest,
            diff_ids: config.diff_ids.clone(),
        })
        .map_err(|e| StoreError::Source(format!("encode marker: {e}")))?;
        write_atomic(tmp, MARKER, &marker)
    }
}

/// Whether `e` refuses the image itself (rather than a source failing on
/// the way, or the store's disk): then nothing of it is kept.
fn refuses(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Verify(_)
            | StoreError::Manifest(_)
            | StoreError::Unpack { .. }
            | StoreError::DiffId { .. }
    )
}

/// Every blob a record names.
fn record_blobs(r: &ImageRecord) -> Vec<Digest> {
    let mut out = vec![r.digest, r.manifest, r.config];
    out.extend(r.layers.iter().map(|l| l.digest));
    out
}

/// The checks on a config that both ingest and unpack make.
fn check_config(config: &ImageConfig, layers: usize) -> Result<(), StoreError> {
    if config.os != "linux" {
        return Err(ManifestError::BadConfig(format!(
            "the image is for os `{}`, not linux",
            config.os
        ))
        .into());
    }
    if config.diff_ids.len() != layers {
        return Err(ManifestError::BadConfig(format!(
            "the manifest has {layers} layers but rootfs.diff_ids lists {}",
            config.diff_ids.len()
        ))
        .into());
    }
    Ok(())
}

/// Write `dir/name` atomically: a temporary name in `dir`, fsync, rename,
/// fsync of `dir`.
fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
    let tmp = dir.join(format!("{TMP_PREFIX}{name}-{}", unique_suffix()));
    let result = (|| {
        let f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)?;
        let mut f =
            Flock::lock(f, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| io::Error::from(e))?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, dir.join(name))
    })();
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(io_err(format!("write {}", dir.join(name).display()))(e));
    }
    fsync_dir(dir)
}
