//! QEMU's whole file view: a root of its own, in the manner of
//! Firecracker's jailer.
//!
//! The host side runs as pid 1 of a mount namespace of its own (cordon's
//! supervisor made it). Before QEMU starts it builds a small tmpfs holding
//! only what QEMU opens, each bound read-only at its own path: the QEMU
//! binary, its loader and the directories of its libraries with
//! `/etc/ld.so.cache`, its firmware, the guest's kernel, initramfs and
//! disk image (the runtime lists them, [`crate::host::Job::qemu_root`]);
//! the sandbox's own directory (sockets, console, a template's RAM and
//! snapshot) bound writable; and `/dev` as [`crate::devices`] reduced it.
//! Then it pivots into that root and detaches the old one: neither the
//! helper nor QEMU can name a host path again (no `/etc`, `/home`, `/proc`,
//! `/sys`, no cordon store beyond the files bound).

use std::fs;
use std::path::{Path, PathBuf};

use rustix::mount::{
    MountFlags, UnmountFlags, mount_bind, mount_bind_recursive, mount_remount, unmount,
};

/// Where the old root is put while pivoting (removed at once).
const OLD: &str = ".old-root";

/// Builds the root at `root` (a directory of the sandbox's own) with `readonly` and `writable` bound at their own
/// paths and `/dev` bound whole, then pivots into it.
pub fn confine(root: &Path, readonly: &[PathBuf], writable: &[PathBuf]) -> Result<(), String> {
    let err = |what: &str, e: rustix::io::Errno| format!("QEMU's root: {what}: {e}");
    crate::devices::private_tmpfs(
        root,
        MountFlags::NOSUID | MountFlags::NODEV,
        c"mode=0755,size=1m",
    )
    .map_err(|e| format!("QEMU's root: {e}"))?;
    for src in writable {
        bind(root, src, false)?;
    }
    for src in readonly {
        bind(root, src, true)?;
    }
    let dev = root.join("dev");
    fs::create_dir_all(&dev).map_err(|e| format!("QEMU's root: {}: {e}", dev.display()))?;
    mount_bind_recursive("/dev", &dev).map_err(|e| err("bind /dev", e))?;
    let old = root.join(OLD);
    fs::create_dir_all(&old).map_err(|e| format!("QEMU's root: {}: {e}", old.display()))?;
    rustix::process::chdir(root).map_err(|e| err("chdir", e))?;
    rustix::process::pivot_root(".", OLD).map_err(|e| err("pivot_root", e))?;
    rustix::process::chdir("/").map_err(|e| err("chdir /", e))?;
    let old = Path::new("/").join(OLD);
    unmount(&old, UnmountFlags::DETACH).map_err(|e| err("detach the old root", e))?;
    fs::remove_dir(&old).map_err(|e| format!("QEMU's root: remove {}: {e}", old.display()))?;
    // Nothing new can be made in the root itself.
    mount_remount(
        "/",
        MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
        c"",
    )
    .map_err(|e| err("read-only", e))?;
    Ok(())
}

/// Binds `src` (a file or a directory, its symbolic links followed) at
/// the same path under `root`. Read-only (`readonly`): with the mounts
/// under it (a directory's), remounted read-only keeping the flags the
/// source's mount has (a user namespace may not clear them). Writable:
/// the directory alone, not the mounts under it (`root` itself may be one
/// of them); a mount under it QEMU needs is listed read-only after it.
fn bind(root: &Path, src: &Path, readonly: bool) -> Result<(), String> {
    let err = |what: &str, e: rustix::io::Errno| {
        format!("QEMU's root: bind {}: {what}: {e}", src.display())
    };
    let rel = src
        .strip_prefix("/")
        .map_err(|_| format!("QEMU's root: {} is not an absolute path", src.display()))?;
    let dst = root.join(rel);
    let meta = fs::metadata(src).map_err(|e| format!("QEMU's root: {}: {e}", src.display()))?;
    {
        use std::os::unix::fs::MetadataExt;
        // Already there through a directory bound before it.
        if fs::metadata(&dst).is_ok_and(|d| (d.dev(), d.ino()) == (meta.dev(), meta.ino())) {
            return Ok(());
        }
    }
    let made = if meta.is_dir() {
        fs::create_dir_all(&dst)
    } else {
        dst.parent()
            .map_or(Ok(()), fs::create_dir_all)
            .and_then(|()| {
                // An existing file (under a writable bind) is only a mount
                // point: never truncated.
                fs::OpenOptions::new()
                    .write(true)
                    .create(true)
                    .truncate(false)
                    .open(&dst)
                    .map(drop)
            })
    };
    made.map_err(|e| format!("QEMU's root: {}: {e}", dst.display()))?;
    if meta.is_dir() && readonly {
        mount_bind_recursive(src, &dst).map_err(|e| err("bind", e))?;
    } else {
        mount_bind(src, &dst).map_err(|e| err("bind", e))?;
    }
    if !readonly {
        return Ok(());
    }
    let had = rustix::fs::statvfs(src)
        .map_err(|e| err("statvfs", e))?
        .f_flag;
    let flags = crate::devices::readonly_remount(had);
    mount_remount(&dst, flags, c"").map_err(|e| err("read-only", e))?;
    Ok(())
}
