//! QEMU's `/dev`: only the device nodes it needs, in the manner of
//! Firecracker's jailer.
//!
//! The host side runs as pid 1 of a mount namespace of its own (cordon's
//! supervisor made it). Before QEMU starts, it makes that namespace's
//! mounts private (nothing it does reaches the host), builds a small
//! tmpfs with `null`, `zero`, `random` and `urandom` (and `kvm` when the
//! guest uses it) bound from the host's `/dev`, and binds that over
//! `/dev`: QEMU never sees the host's disks, terminals or other devices,
//! whatever its uid could open.

use std::fs;
use std::path::Path;

use rustix::mount::{
    MountFlags, MountPropagationFlags, mount, mount_bind, mount_bind_recursive, mount_change,
    mount_remount,
};

/// The nodes QEMU gets (`kvm` only with KVM).
pub const NODES: [&str; 4] = ["null", "zero", "random", "urandom"];

/// Replaces `/dev` in this mount namespace by the nodes QEMU needs, built
/// in `scratch` (a directory of the sandbox's own).
pub fn confine(scratch: &Path, kvm: bool) -> Result<(), String> {
    let err = |what: &str, e: rustix::io::Errno| format!("QEMU's /dev: {what}: {e}");
    private_tmpfs(
        scratch,
        MountFlags::NOSUID | MountFlags::NOEXEC,
        c"mode=0755,size=64k",
    )
    .map_err(|e| format!("QEMU's /dev: {e}"))?;
    let kvm_node: &[&str] = if kvm { &["kvm"] } else { &[] };
    for n in NODES.iter().chain(kvm_node) {
        let dst = scratch.join(n);
        fs::File::create(&dst).map_err(|e| format!("QEMU's /dev: {}: {e}", dst.display()))?;
        mount_bind(Path::new("/dev").join(n), &dst).map_err(|e| err(n, e))?;
    }
    mount_bind_recursive(scratch, "/dev").map_err(|e| err("bind over /dev", e))?;
    Ok(())
}

/// Makes this mount namespace's mounts private (nothing done here
/// reaches the host's), then mounts a tmpfs with `flags` and `data` at
/// `dir`, made first.
pub fn private_tmpfs(dir: &Path, flags: MountFlags, data: &std::ffi::CStr) -> Result<(), String> {
    mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(|e| format!("make the mounts private: {e}"))?;
    fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    mount("tmpfs", dir, "tmpfs", flags, data).map_err(|e| format!("tmpfs: {e}"))
}

/// Binds the file open as `file` (that very inode, whatever its path
/// names now) at `dst`, read-only, in this mount namespace (its mounts
/// made private first, so nothing reaches the host's).
pub fn bind_file_readonly(file: &fs::File, dst: &Path) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let err = |what: &str, e: rustix::io::Errno| format!("bind {}: {what}: {e}", dst.display());
    mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(|e| err("make the mounts private", e))?;
    fs::File::create(dst).map_err(|e| format!("create {}: {e}", dst.display()))?;
    let src = format!("/proc/self/fd/{}", file.as_raw_fd());
    mount_bind(src.as_str(), dst).map_err(|e| err("bind", e))?;
    let had = rustix::fs::fstatvfs(file)
        .map_err(|e| err("statvfs", e))?
        .f_flag;
    let flags = readonly_remount(had);
    mount_remount(dst, flags, c"").map_err(|e| err("read-only", e))?;
    Ok(())
}

/// The flags of a read-only bind remount over a mount whose flags are
/// `had`: read-only, nosuid and nodev added, and each flag the source's
/// mount has kept (a user namespace may not clear them).
pub fn readonly_remount(had: rustix::fs::StatVfsMountFlags) -> MountFlags {
    let mut flags = MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV;
    for (vfs, m) in [
        (rustix::fs::StatVfsMountFlags::NOEXEC, MountFlags::NOEXEC),
        (rustix::fs::StatVfsMountFlags::NOATIME, MountFlags::NOATIME),
        (
            rustix::fs::StatVfsMountFlags::NODIRATIME,
            MountFlags::NODIRATIME,
        ),
        (
            rustix::fs::StatVfsMountFlags::RELATIME,
            MountFlags::RELATIME,
        ),
    ] {
        if had.contains(vfs) {
            flags |= m;
        }
    }
    flags
}
