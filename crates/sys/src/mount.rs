//! The broker's own mounts of the host's file system: a size-limited tmpfs
//! for a session workspace, and its lazy unmount (which drops what a tool
//! wrote there without walking it); and detached copies of a bind source's
//! mount tree ([`clone_tree`]) that a sandbox attaches where it binds it.

use std::ffi::CString;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;

fn c(p: &Path) -> Result<CString, Errno> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)
}

/// Mount a tmpfs on `target`, nosuid and nodev, with the options `data`
/// (e.g. `size=1048576,mode=0700,uid=65534,gid=65534`). Needs
/// CAP_SYS_ADMIN in the mount namespace's user namespace.
pub fn mount_tmpfs(target: &Path, data: &str) -> Result<(), Errno> {
    let target = c(target)?;
    let data = CString::new(data).map_err(|_| Errno::EINVAL)?;
    // SAFETY: mount(2) reads the NUL-terminated strings `target`, `data`
    // and the two literals, all alive for the call.
    let rc = unsafe {
        libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    Errno::result(rc).map(drop)
}

/// Change the options of the tmpfs mounted on `target` (e.g. a larger
/// `size=`), keeping nosuid and nodev.
pub fn remount_tmpfs(target: &Path, data: &str) -> Result<(), Errno> {
    let target = c(target)?;
    let data = CString::new(data).map_err(|_| Errno::EINVAL)?;
    // SAFETY: mount(2) reads the NUL-terminated strings `target` and
    // `data`; the source and type are null, which MS_REMOUNT allows.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            target.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_NOSUID | libc::MS_NODEV,
            data.as_ptr().cast(),
        )
    };
    Errno::result(rc).map(drop)
}

/// Detach the mount on `target` (`umount2(MNT_DETACH | UMOUNT_NOFOLLOW)`):
/// gone from the tree now, its file system freed once no sandbox holds
/// it. A symlink at `target` is not followed.
pub fn unmount_detach(target: &Path) -> Result<(), Errno> {
    let target = c(target)?;
    // SAFETY: umount2(2) reads the NUL-terminated string `target`.
    let rc = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH | libc::UMOUNT_NOFOLLOW) };
    Errno::result(rc).map(drop)
}

/// Bytes in all and bytes free (to an unprivileged writer) of the file
/// system mounted on `target`: `statvfs(2)` reads the superblock's
/// counters only, nothing written there.
pub fn space(target: &Path) -> Result<(u64, u64), Errno> {
    let target = c(target)?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: statvfs(2) reads the NUL-terminated `target` and writes one
    // `struct statvfs` into `st`, which is that large.
    let rc = unsafe { libc::statvfs(target.as_ptr(), st.as_mut_ptr()) };
    Errno::result(rc)?;
    // SAFETY: statvfs succeeded, so it filled `st` (zeroed before anyway).
    let st = unsafe { st.assume_init() };
    let frsize = st.f_frsize;
    Ok((
        st.f_blocks.saturating_mul(frsize),
        st.f_bavail.saturating_mul(frsize),
    ))
}

/// A detached copy of the mount tree at `src` (`open_tree(2)` with
/// `OPEN_TREE_CLONE | AT_RECURSIVE`, close-on-exec), looked up with this
/// process's credentials. A sandbox attaches it with `move_mount(2)`, so
/// the directories above `src` need not be searchable by the sandbox's
/// uid: only the tree's own permissions apply inside. Needs CAP_SYS_ADMIN
/// in this mount namespace's user namespace (EPERM otherwise) and Linux
/// 5.2 (ENOSYS before).
pub fn clone_tree(src: &Path) -> Result<OwnedFd, Errno> {
    let src = c(src)?;
    let flags = 1 /* OPEN_TREE_CLONE */ | libc::O_CLOEXEC as libc::c_uint | libc::AT_RECURSIVE as libc::c_uint;
    // SAFETY: open_tree reads the NUL-terminated string `src`, alive for
    // the call; it returns a new descriptor or -1.
    let rc = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, src.as_ptr(), flags) };
    if rc < 0 {
        return Err(Errno::last());
    }
    // SAFETY: `rc` is a descriptor open_tree just returned, owned by no
    // one else.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as i32) })
}
