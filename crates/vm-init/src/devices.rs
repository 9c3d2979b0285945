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
};

/// The nodes QEMU gets (`kvm` only with KVM).
pub const NODES: [&str; 4] = ["null", "zero", "random", "urandom"];

/// Replaces `/dev` in this mount namespace by the nodes QEMU needs, built
/// in `scratch` (a directory of the sandbox's own).
pub fn confine(scratch: &Path, kvm: bool) -> Result<(), String> {
    let err = |what: &str, e: rustix::io::Errno| format!("QEMU's /dev: {what}: {e}");
    mount_change(
        "/",
        MountPropagationFlags::PRIVATE | MountPropagationFlags::REC,
    )
    .map_err(|e| err("make the mounts private", e))?;
    fs::create_dir_all(scratch).map_err(|e| format!("QEMU's /dev: {}: {e}", scratch.display()))?;
    mount(
        "tmpfs",
        scratch,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        c"mode=0755,size=64k",
    )
    .map_err(|e| err("tmpfs", e))?;
    let kvm_node: &[&str] = if kvm { &["kvm"] } else { &[] };
    for n in NODES.iter().chain(kvm_node) {
        let dst = scratch.join(n);
        fs::File::create(&dst).map_err(|e| format!("QEMU's /dev: {}: {e}", dst.display()))?;
        mount_bind(Path::new("/dev").join(n), &dst).map_err(|e| err(n, e))?;
    }
    mount_bind_recursive(scratch, "/dev").map_err(|e| err("bind over /dev", e))?;
    Ok(())
}
