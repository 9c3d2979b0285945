//! The tool's root as a read-only block image for the guest's
//! `/dev/vda`.
//!
//! Built from an unpacked root directory (cordon's image store unpacks OCI
//! images into one) with `mkfs.erofs`, or `mkfs.ext4 -d` where erofs-utils
//! is missing. An image is named by the digest of its inputs (the tree's
//! paths, types, modes, owners, contents and link targets, the file system
//! kind and this builder's format version), so a changed root gives a new
//! image and an unchanged one is built once. Beside each image a small
//! record keeps the sha256 of the image file itself; [`BlockImage::open`]
//! checks it before the image is handed to a VMM, so a corrupted or
//! swapped image file is refused, never booted.
//!
//! Store layout: `<store>/<digest>.img` and `<store>/<digest>.json`.

use std::fs;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

/// Bumped whenever the way an image is built changes.
const FORMAT: &str = "cordon-vm-image/1";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FsKind {
    Erofs,
    Ext4,
}

#[derive(Debug, Error)]
pub enum ImageError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0} not found (install erofs-utils or e2fsprogs: scripts/setup.sh)")]
    MissingTool(&'static str),
    #[error("{tool} failed ({status}): {stderr}")]
    Tool {
        tool: &'static str,
        status: std::process::ExitStatus,
        stderr: String,
    },
    #[error("block image {path} is corrupt: sha256 {actual}, recorded {expected}")]
    Corrupt {
        path: PathBuf,
        expected: String,
        actual: String,
    },
    #[error("no block image {0} in the store")]
    Missing(String),
    #[error("image record {path}: {message}")]
    Record { path: PathBuf, message: String },
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> ImageError + '_ {
    move |source| ImageError::Io {
        path: path.to_owned(),
        source,
    }
}

/// What the store keeps beside an image.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    kind: FsKind,
    sha256: String,
    size: u64,
}

/// A block image whose content was checked against its record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockImage {
    /// The digest of the inputs: the image's name in the store.
    pub digest: String,
    pub path: PathBuf,
    pub kind: FsKind,
    /// sha256 of the image file.
    pub sha256: String,
}

/// `name` in `PATH`, or in the sbin directories a non-login root shell may
/// leave out.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// The sha256 of a sparse file's content, hex: every data extent's
/// offset, length and bytes, in order (holes, which read as zeros, are
/// named by where the data is, not read). A snapshot of a mostly idle
/// guest's memory is a few percent data; changing any byte, or writing
/// into a hole, changes the digest. Falls back to reading every byte
/// where the file system cannot tell holes from data.
pub fn sha256_sparse(path: &Path) -> Result<String, ImageError> {
    use rustix::fs::SeekFrom;
    let mut f = fs::File::open(path).map_err(io(path))?;
    let len = f.metadata().map_err(io(path))?.len();
    let mut h = Sha256::new();
    h.update(b"cordon sparse sha256 v1\0");
    h.update(len.to_le_bytes());
    let mut buf = vec![0u8; 1 << 20];
    let mut pos = 0u64;
    while pos < len {
        let data = match rustix::fs::seek(&f, SeekFrom::Data(pos)) {
            Ok(d) => d,
            Err(rustix::io::Errno::NXIO) => break,
            Err(rustix::io::Errno::INVAL | rustix::io::Errno::OPNOTSUPP) => {
                return sha256_file(path);
            }
            Err(e) => return Err(io(path)(e.into())),
        };
        let hole = rustix::fs::seek(&f, SeekFrom::Hole(data))
            .map_err(|e| io(path)(e.into()))?
            .min(len);
        h.update(data.to_le_bytes());
        h.update((hole - data).to_le_bytes());
        f.seek(std::io::SeekFrom::Start(data)).map_err(io(path))?;
        let mut left = hole - data;
        while left > 0 {
            let want = usize::try_from(left.min(buf.len() as u64)).unwrap_or(buf.len());
            let n = f.read(&mut buf[..want]).map_err(io(path))?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            left -= n as u64;
        }
        pos = hole;
    }
    Ok(hex::encode(h.finalize()))
}

/// A file as it was when it was verified: its identity, size and times.
/// A file written, truncated, replaced or renamed over since differs in
/// one of them (a write updates the modification and change times, a
/// replacement has another inode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// Change time, nanoseconds since the epoch.
    pub ctime_ns: i128,
}

impl FileId {
    pub fn of(m: &fs::Metadata) -> FileId {
        FileId {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            ctime_ns: i128::from(m.ctime()) * 1_000_000_000 + i128::from(m.ctime_nsec()),
        }
    }

    /// `path`'s, following symbolic links.
    pub fn path(path: &Path) -> Option<FileId> {
        fs::metadata(path).ok().map(|m| FileId::of(&m))
    }
}

/// The sha256 of a file's content, hex.
pub fn sha256_file(path: &Path) -> Result<String, ImageError> {
    let mut f = fs::File::open(path).map_err(io(path))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io(path))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
}

/// Totals gathered while hashing a tree (they size an ext4 image).
#[derive(Default)]
struct TreeStats {
    bytes: u64,
    entries: u64,
}

fn hash_tree(
    root: &Path,
    rel: &Path,
    h: &mut Sha256,
    stats: &mut TreeStats,
) -> Result<(), ImageError> {
    let dir = root.join(rel);
    let mut entries: Vec<_> = fs::read_dir(&dir)
        .map_err(io(&dir))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()
        .map_err(io(&dir))?;
    entries.sort();
    for name in entries {
        let rel = rel.join(&name);
        let path = root.join(&rel);
        let md = fs::symlink_metadata(&path).map_err(io(&path))?;
        let ft = md.file_type();
        stats.entries += 1;
        h.update(rel.as_os_str().as_encoded_bytes());
        h.update([0]);
        h.update(format!("{:o} {} {}\0", md.mode(), md.uid(), md.gid()).as_bytes());
        if ft.is_dir() {
            h.update(b"d\0");
            hash_tree(root, &rel, h, stats)?;
            h.update(b"end\0");
        } else if ft.is_symlink() {
            let target = fs::read_link(&path).map_err(io(&path))?;
            h.update(b"l\0");
            h.update(target.as_os_str().as_encoded_bytes());
            h.update([0]);
        } else if ft.is_file() {
            stats.bytes += md.len();
            h.update(format!("f {}\0", md.len()).as_bytes());
            h.update(sha256_file(&path)?.as_bytes());
        } else if ft.is_block_device() || ft.is_char_device() {
            h.update(format!("dev {}\0", md.rdev()).as_bytes());
        } else {
            h.update(b"other\0");
        }
    }
    Ok(())
}

/// The input digest of `rootfs` built as `kind`.
pub fn input_digest(rootfs: &Path, kind: FsKind) -> Result<String, ImageError> {
    Ok(digest_and_stats(rootfs, kind)?.0)
}

fn digest_and_stats(rootfs: &Path, kind: FsKind) -> Result<(String, TreeStats), ImageError> {
    let mut h = Sha256::new();
    h.update(FORMAT.as_bytes());
    h.update([0]);
    h.update(format!("{kind:?}\0").as_bytes());
    let md = fs::symlink_metadata(rootfs).map_err(io(rootfs))?;
    h.update(format!("{:o} {} {}\0", md.mode(), md.uid(), md.gid()).as_bytes());
    let mut stats = TreeStats::default();
    hash_tree(rootfs, Path::new(""), &mut h, &mut stats)?;
    Ok((hex::encode(h.finalize()), stats))
}

/// The file system kind [`build`] uses by default: EROFS where
/// `mkfs.erofs` is installed, else ext4.
pub fn default_kind() -> FsKind {
    if find_tool("mkfs.erofs").is_some() {
        FsKind::Erofs
    } else {
        FsKind::Ext4
    }
}

fn run_tool(tool: &'static str, args: &[&std::ffi::OsStr]) -> Result<(), ImageError> {
    let bin = find_tool(tool).ok_or(ImageError::MissingTool(tool))?;
    let out = Command::new(&bin).args(args).output().map_err(io(&bin))?;
    if !out.status.success() {
        return Err(ImageError::Tool {
            tool,
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(())
}

/// Builds (or finds already built) the block image of `rootfs` in `store`,
/// and returns it verified.
pub fn build(rootfs: &Path, store: &Path, kind: FsKind) -> Result<BlockImage, ImageError> {
    fs::create_dir_all(store).map_err(io(store))?;
    let (digest, stats) = digest_and_stats(rootfs, kind)?;
    match BlockImage::open(store, &digest) {
        Ok(img) => return Ok(img),
        Err(ImageError::Missing(_)) => {}
        Err(e) => return Err(e),
    }
    let img = store.join(format!("{digest}.img"));
    let tmp = store.join(format!("{digest}.img.tmp-{}", std::process::id()));
    let _ = fs::remove_file(&tmp);
    let built = match kind {
        FsKind::Erofs => run_tool(
            "mkfs.erofs",
            &[
                "--quiet".as_ref(),
                "-T0".as_ref(),
                "-U00000000-0000-0000-0000-000000000000".as_ref(),
                tmp.as_os_str(),
                rootfs.as_os_str(),
            ],
        ),
        FsKind::Ext4 => {
            // Room for the data, the inodes and ext4's own metadata.
            let mib = (stats.bytes + stats.entries * 4096) * 5 / 4 / (1 << 20) + 16;
            let inodes = (stats.entries * 2 + 256).to_string();
            let size = format!("{mib}M");
            run_tool(
                "mkfs.ext4",
                &[
                    "-q".as_ref(),
                    "-F".as_ref(),
                    "-b4096".as_ref(),
                    "-O^has_journal".as_ref(),
                    "-N".as_ref(),
                    inodes.as_ref(),
                    "-E".as_ref(),
                    "root_owner=0:0,hash_seed=00000000-0000-0000-0000-000000000000".as_ref(),
                    "-U".as_ref(),
                    "clear".as_ref(),
                    "-d".as_ref(),
                    rootfs.as_os_str(),
                    tmp.as_os_str(),
                    size.as_ref(),
                ],
            )
        }
    };
    if let Err(e) = built {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    let sha256 = sha256_file(&tmp)?;
    let size = fs::metadata(&tmp).map_err(io(&tmp))?.len();
    fs::File::open(&tmp)
        .and_then(|f| f.sync_all())
        .map_err(io(&tmp))?;
    let record = Record { kind, sha256, size };
    let rec_path = store.join(format!("{digest}.json"));
    let rec_tmp = store.join(format!("{digest}.json.tmp-{}", std::process::id()));
    let text = serde_json::to_vec(&record).map_err(|e| ImageError::Record {
        path: rec_path.clone(),
        message: e.to_string(),
    })?;
    let mut f = fs::File::create(&rec_tmp).map_err(io(&rec_tmp))?;
    f.write_all(&text)
        .and_then(|()| f.sync_all())
        .map_err(io(&rec_tmp))?;
    // The image first: a record never names an image that is not there.
    fs::rename(&tmp, &img).map_err(io(&img))?;
    fs::rename(&rec_tmp, &rec_path).map_err(io(&rec_path))?;
    BlockImage::open(store, &digest)
}

impl BlockImage {
    /// The image `digest` from `store`, after checking its sha256 against
    /// its record.
    pub fn open(store: &Path, digest: &str) -> Result<BlockImage, ImageError> {
        let img = BlockImage::open_unverified(store, digest)?;
        img.verify()?;
        Ok(img)
    }

    /// The image `digest` from `store` as its record describes it, not
    /// read yet: the caller calls [`BlockImage::verify`] (or checks the
    /// sha256 its own way) before handing it to a VMM.
    pub fn open_unverified(store: &Path, digest: &str) -> Result<BlockImage, ImageError> {
        let path = store.join(format!("{digest}.img"));
        let rec_path = store.join(format!("{digest}.json"));
        let text = match fs::read(&rec_path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ImageError::Missing(digest.to_owned()));
            }
            Err(e) => return Err(io(&rec_path)(e)),
        };
        let record: Record = serde_json::from_slice(&text).map_err(|e| ImageError::Record {
            path: rec_path.clone(),
            message: e.to_string(),
        })?;
        let img = BlockImage {
            digest: digest.to_owned(),
            path,
            kind: record.kind,
            sha256: record.sha256,
        };
        Ok(img)
    }

    /// Checks the image file against its recorded sha256 again (call right
    /// before handing it to a VMM).
    pub fn verify(&self) -> Result<(), ImageError> {
        let actual = match sha256_file(&self.path) {
            Ok(a) => a,
            Err(ImageError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
                return Err(ImageError::Missing(self.digest.clone()));
            }
            Err(e) => return Err(e),
        };
        if actual != self.sha256 {
            return Err(ImageError::Corrupt {
                path: self.path.clone(),
                expected: self.sha256.clone(),
                actual,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(root: &Path) {
        fs::create_dir_all(root.join("bin")).unwrap();
        fs::write(root.join("bin/tool"), b"#!/bin/sh\necho hi\n").unwrap();
        std::os::unix::fs::symlink("tool", root.join("bin/alias")).unwrap();
    }

    #[test]
    fn the_digest_follows_contents_links_and_modes() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path().join("root");
        tree(&r);
        let a = input_digest(&r, FsKind::Erofs).unwrap();
        assert_eq!(a, input_digest(&r, FsKind::Erofs).unwrap());
        assert_ne!(a, input_digest(&r, FsKind::Ext4).unwrap());
        fs::write(r.join("bin/tool"), b"#!/bin/sh\necho ho\n").unwrap();
        let b = input_digest(&r, FsKind::Erofs).unwrap();
        assert_ne!(a, b);
        fs::remove_file(r.join("bin/alias")).unwrap();
        std::os::unix::fs::symlink("other", r.join("bin/alias")).unwrap();
        assert_ne!(b, input_digest(&r, FsKind::Erofs).unwrap());
    }

    fn build_verify_corrupt(kind: FsKind) {
        let d = tempfile::tempdir().unwrap();
        let r = d.path().join("root");
        tree(&r);
        let store = d.path().join("store");
        let img = build(&r, &store, kind).unwrap();
        assert_eq!(img.kind, kind);
        assert_eq!(img.digest, input_digest(&r, kind).unwrap());
        // Built once: a second build finds it.
        assert_eq!(build(&r, &store, kind).unwrap(), img);
        // One flipped byte is refused, by open and by verify.
        let mut bytes = fs::read(&img.path).unwrap();
        let at = bytes.len() / 2;
        bytes[at] ^= 0xff;
        fs::write(&img.path, &bytes).unwrap();
        assert!(matches!(img.verify(), Err(ImageError::Corrupt { .. })));
        assert!(matches!(
            BlockImage::open(&store, &img.digest),
            Err(ImageError::Corrupt { .. })
        ));
        assert!(matches!(
            build(&r, &store, kind),
            Err(ImageError::Corrupt { .. })
        ));
    }

    #[test]
    fn erofs_images_are_built_once_and_refused_when_corrupt() {
        assert!(
            find_tool("mkfs.erofs").is_some(),
            "mkfs.erofs missing: run scripts/setup.sh (erofs-utils)"
        );
        build_verify_corrupt(FsKind::Erofs);
    }

    #[test]
    fn ext4_images_are_built_once_and_refused_when_corrupt() {
        assert!(
            find_tool("mkfs.ext4").is_some(),
            "mkfs.ext4 missing: run scripts/setup.sh (e2fsprogs)"
        );
        build_verify_corrupt(FsKind::Ext4);
    }
}
