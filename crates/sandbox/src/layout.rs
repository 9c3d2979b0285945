//! The root every runtime lays out, written once: which of the host's
//! directories a host root binds, what its `/etc` holds, which entries of
//! an image root appear at `/`, which top-level directories are always the
//! sandbox's own, and whose the process is inside. The native jail renders
//! it as mount steps, the OCI bundle writer as `config.json` mounts.
//!
//! A host root ([`crate::Root::HostBinds`]): [`USR`] and the host's
//! [`SYSTEM_DIRS`] as it has them ([`SystemDir`]: a directory bound
//! read-only, or the symlink made again), an `/etc` of [`etc_files`] with
//! the host's [`HOST_ETC`] entries bound read-only into it. An image root
//! ([`crate::Root::Image`]): [`image_entries`]. Either way [`OWN_DIRS`]
//! are the sandbox's own, never the host's or the image's.

use std::ffi::{OsStr, OsString};
use std::fmt;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use serde::Serialize;

/// uid and gid of the sandbox's process when the spec names none.
pub const DEFAULT_USER: (u32, u32) = (1000, 1000);

/// Names at the top of the root that are always the sandbox's own (a
/// minimal `/dev`, a fresh `/proc`, a tmpfs `/tmp`): never an image's
/// entry, never replaced by a bind.
pub const OWN_DIRS: [&str; 3] = ["dev", "proc", "tmp"];

/// Whether `name`, a top-level entry of the root, is one of [`OWN_DIRS`].
pub fn is_own_dir(name: &OsStr) -> bool {
    OWN_DIRS.iter().any(|d| name.as_bytes() == d.as_bytes())
}

/// Whether the absolute path `dst` is under one of [`OWN_DIRS`] (or is
/// one): its first component is.
pub fn under_own_dir(dst: &Path) -> bool {
    matches!(dst.components().nth(1), Some(Component::Normal(top)) if is_own_dir(top))
}

/// The host directory every host root binds read-only first.
pub const USR: &str = "/usr";

/// The host's top-level system directories a host root has besides
/// [`USR`], each as the host has it (see [`SystemDir`]); missing ones are
/// left out.
pub const SYSTEM_DIRS: [&str; 6] = ["/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"];

/// A top-level system directory as the host has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SystemDir {
    /// `/bin`, `/lib`, ...
    pub path: PathBuf,
    /// `Some(target)` when it is a symlink (merged /usr), `None` for a
    /// directory.
    pub symlink: Option<PathBuf>,
}

/// The files of a host root's written `/etc`, by name, for a process of
/// `uid` and `gid`.
pub fn etc_files(uid: u32, gid: u32) -> Vec<(&'static str, String)> {
    vec![
        (
            "passwd",
            format!(
                "root:x:0:0:root:/root:/usr/sbin/nologin\n\
                 sandbox:x:{uid}:{gid}:sandbox:/tmp:/usr/sbin/nologin\n\
                 nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
            ),
        ),
        (
            "group",
            format!("root:x:0:\nsandbox:x:{gid}:\nnogroup:x:65534:\n"),
        ),
        (
            "nsswitch.conf",
            "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n\
             protocols: files\nservices: files\n"
                .to_string(),
        ),
        ("hosts", "127.0.0.1 localhost\n::1 localhost\n".to_string()),
        ("hostname", "cordon\n".to_string()),
    ]
}

/// An entry of the host's `/etc` that a host root binds read-only into
/// its written `/etc`, when the host has it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostEtc {
    /// The name under `/etc`.
    pub name: &'static str,
    /// A directory; a regular file otherwise.
    pub dir: bool,
}

impl HostEtc {
    /// Its path on the host (and in the sandbox).
    pub fn path(&self) -> PathBuf {
        Path::new("/etc").join(self.name)
    }

    /// Whether the host has it, of its kind.
    pub fn on_host(&self) -> bool {
        let p = self.path();
        if self.dir { p.is_dir() } else { p.is_file() }
    }
}

/// The host's `/etc` entries every host root binds: the loader cache and
/// the alternatives symlinks (both harmless, needed by dynamic binaries
/// and Debian's `/usr/bin/awk`-style links).
pub const HOST_ETC: [HostEtc; 2] = [
    HostEtc {
        name: "ld.so.cache",
        dir: false,
    },
    HostEtc {
        name: "alternatives",
        dir: true,
    },
];

/// The host's trust store, bound as well by a runtime that writes no
/// trust bundle of its own into the sandbox's `/etc` (the OCI bundle); the
/// native jail keeps `/etc/ssl` its own (see its `trust_bundle`).
pub const HOST_TRUST_STORE: HostEtc = HostEtc {
    name: "ssl",
    dir: true,
};

/// A top-level entry of an image's rootfs as the root shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageEntry {
    /// Its name at `/`.
    pub name: OsString,
    /// What it is.
    pub kind: ImageEntryKind,
}

/// What a top-level image entry is (never followed on the host).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageEntryKind {
    /// A directory, bound read-only.
    Dir,
    /// A regular file, bound read-only.
    File,
    /// A symlink, made again with this target.
    Symlink(PathBuf),
}

impl ImageEntry {
    /// Its path on the host, under `rootfs`.
    pub fn src(&self, rootfs: &Path) -> PathBuf {
        rootfs.join(&self.name)
    }
}

/// Why an image root could not be read.
#[derive(Debug)]
pub enum ImageError {
    /// The rootfs is not an absolute path.
    NotAbsolute(PathBuf),
    /// Reading it failed: the operation (`read`, `stat`, `readlink`), the
    /// path, and the error.
    Io(&'static str, PathBuf, std::io::Error),
}

impl fmt::Display for ImageError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageError::NotAbsolute(p) => {
                write!(f, "image root {} is not an absolute path", p.display())
            }
            ImageError::Io(op, p, e) => write!(f, "{op} {}: {e}", p.display()),
        }
    }
}

impl std::error::Error for ImageError {}

/// The entries of the image root `rootfs` that appear at `/`, by name:
/// its directories, regular files and symlinks, less [`OWN_DIRS`] (device
/// nodes, FIFOs and sockets of the image are left out).
pub fn image_entries(rootfs: &Path) -> Result<Vec<ImageEntry>, ImageError> {
    if !rootfs.is_absolute() {
        return Err(ImageError::NotAbsolute(rootfs.to_path_buf()));
    }
    let read = |e| ImageError::Io("read", rootfs.to_path_buf(), e);
    let mut out = Vec::new();
    for e in std::fs::read_dir(rootfs).map_err(read)? {
        let e = e.map_err(read)?;
        let name = e.file_name();
        if is_own_dir(&name) {
            continue;
        }
        // The entry itself, never what a symlink points to.
        let ty = e
            .file_type()
            .map_err(|err| ImageError::Io("stat", rootfs.join(&name), err))?;
        let kind = if ty.is_symlink() {
            let src = rootfs.join(&name);
            let to =
                std::fs::read_link(&src).map_err(|err| ImageError::Io("readlink", src, err))?;
            ImageEntryKind::Symlink(to)
        } else if ty.is_dir() {
            ImageEntryKind::Dir
        } else if ty.is_file() {
            ImageEntryKind::File
        } else {
            continue;
        };
        out.push(ImageEntry { name, kind });
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_dirs() {
        assert!(is_own_dir(OsStr::new("proc")));
        assert!(!is_own_dir(OsStr::new("etc")));
        assert!(under_own_dir(Path::new("/tmp/x")));
        assert!(under_own_dir(Path::new("/dev")));
        assert!(!under_own_dir(Path::new("/data/tmp")));
        assert!(!under_own_dir(Path::new("/")));
    }

    #[test]
    fn image_entries_skip_own_dirs_and_keep_symlinks() {
        let d = std::env::temp_dir().join(format!("cordon-layout-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(d.join("usr")).unwrap();
        std::fs::create_dir_all(d.join("proc")).unwrap();
        std::fs::write(d.join("tmp"), b"").unwrap();
        std::fs::write(d.join("file"), b"x").unwrap();
        std::os::unix::fs::symlink("usr/bin", d.join("bin")).unwrap();
        let e = image_entries(&d).unwrap();
        std::fs::remove_dir_all(&d).unwrap();
        assert_eq!(
            e,
            vec![
                ImageEntry {
                    name: "bin".into(),
                    kind: ImageEntryKind::Symlink("usr/bin".into())
                },
                ImageEntry {
                    name: "file".into(),
                    kind: ImageEntryKind::File
                },
                ImageEntry {
                    name: "usr".into(),
                    kind: ImageEntryKind::Dir
                },
            ]
        );
        assert!(matches!(
            image_entries(Path::new("relative")),
            Err(ImageError::NotAbsolute(_))
        ));
    }
}
