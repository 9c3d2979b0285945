//! The filesystem program, child side: the plan's [`Step`]s (mounts, bind
//! mounts made read-only, directories, files, symlinks, `pivot_root`,
//! `chdir`, the hostname) in order.

use std::ffi::{CStr, CString};

use super::ChildStep;
use super::plan::{ChildPlan, Op, Step};
use super::raw::{ck, sc};
use super::step::ErrPipe;

/// `struct mount_attr` for `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;

/// The kernel's `struct statfs` on 64-bit architectures (glibc's type hides
/// `f_flags`).
#[repr(C)]
struct KStatfs {
    f_type: libc::c_long,
    f_bsize: libc::c_long,
    f_blocks: u64,
    f_bfree: u64,
    f_bavail: u64,
    f_files: u64,
    f_ffree: u64,
    f_fsid: [i32; 2],
    f_namelen: libc::c_long,
    f_frsize: libc::c_long,
    f_flags: libc::c_long,
    f_spare: [libc::c_long; 4],
}

/// The plan's filesystem program.
#[derive(Debug, Clone, Copy)]
pub(super) struct Mounts<'a> {
    steps: &'a [Step],
}

impl<'a> Mounts<'a> {
    pub(super) fn of(plan: &'a ChildPlan) -> Self {
        Mounts { steps: &plan.steps }
    }

    /// Run every step in order; a step marked `skip_if_missing` that fails
    /// with ENOENT is skipped. A failure is [`ChildStep::Op`] with the
    /// step's index.
    ///
    /// # Safety
    /// Child only: in the broker these would change its own mounts.
    pub(super) unsafe fn install(self, err: ErrPipe) {
        for (i, step) in self.steps.iter().enumerate() {
            if let Err(e) = run_op(&step.op)
                && !(step.skip_if_missing && e == libc::ENOENT)
            {
                err.fail(ChildStep::Op(i as u32), e);
            }
        }
    }
}

fn ptr_or_null(s: &Option<CString>) -> *const libc::c_char {
    match s {
        Some(s) => s.as_ptr(),
        None => std::ptr::null(),
    }
}

/// `statfs` flags (`ST_*`) to the `MS_*` flags a remount must keep.
fn locked_flags(path: &CStr) -> Result<libc::c_ulong, i32> {
    // SAFETY: KStatfs is plain data; all-zero is valid.
    let mut st: KStatfs = unsafe { std::mem::zeroed() };
    // SAFETY: statfs reads the C string `path` and writes `st`, which has
    // the kernel's layout and size.
    ck(unsafe { sc!(libc::SYS_statfs, path.as_ptr(), &mut st as *mut KStatfs) })?;
    let f = st.f_flags as libc::c_ulong;
    let mut out = 0;
    for (st_flag, ms_flag) in [
        (libc::ST_RDONLY, libc::MS_RDONLY),
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ] {
        if f & st_flag != 0 {
            out |= ms_flag;
        }
    }
    Ok(out)
}

/// Bind-remount `target` adding `flags`, keeping the flags it has.
fn remount_keep(target: &CStr, flags: libc::c_ulong) -> Result<(), i32> {
    let keep = locked_flags(target)?;
    // SAFETY: mount(2) reads the C string `target`; source, type and data
    // are null.
    ck(unsafe {
        sc!(
            libc::SYS_mount,
            std::ptr::null::<libc::c_char>(),
            target.as_ptr(),
            std::ptr::null::<libc::c_char>(),
            libc::MS_REMOUNT | libc::MS_BIND | flags | keep,
            std::ptr::null::<libc::c_void>()
        )
    })?;
    Ok(())
}

/// Make the mount on `target` and its submounts read-only with `flags`
/// added (`MS_NOSUID` and the like) through a recursive `mount_setattr`,
/// which only adds attributes: flags the kernel locked (a host nosuid, say)
/// stay. A kernel without it (before 5.12) gets a bind remount that keeps
/// them, for the top mount only.
fn set_read_only(target: &CStr, flags: libc::c_ulong) -> Result<(), i32> {
    let mut set = MOUNT_ATTR_RDONLY;
    if flags & libc::MS_NOSUID != 0 {
        set |= MOUNT_ATTR_NOSUID;
    }
    if flags & libc::MS_NODEV != 0 {
        set |= MOUNT_ATTR_NODEV;
    }
    if flags & libc::MS_NOEXEC != 0 {
        set |= MOUNT_ATTR_NOEXEC;
    }
    let attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: mount_setattr reads the C string `target` and the
    // `MountAttr` `attr` on this stack, of the size passed.
    let r = unsafe {
        sc!(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::AT_RECURSIVE | libc::AT_SYMLINK_NOFOLLOW,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>()
        )
    };
    // mount_setattr only adds attributes, so flags the kernel locked
    // (a host nosuid, say) stay. A kernel without it (before 5.12)
    // gets a bind remount that keeps them, for the top mount only.
    match ck(r) {
        Ok(_) => {}
        Err(libc::ENOSYS) => remount_keep(target, libc::MS_RDONLY | flags)?,
        Err(e) => return Err(e),
    }
    Ok(())
}

/// One operation. The pointers every system call here gets are C strings
/// and buffers owned by `op`, which the parent built before clone and which
/// live for the whole child, or null.
fn run_op(op: &Op) -> Result<(), i32> {
    match op {
        Op::Mount {
            src,
            target,
            fstype,
            flags,
            data,
        } => {
            // SAFETY: mount(2) reads the C strings owned by `op`, and
            // nothing where a pointer is null.
            ck(unsafe {
                sc!(
                    libc::SYS_mount,
                    ptr_or_null(src),
                    target.as_ptr(),
                    ptr_or_null(fstype),
                    *flags,
                    ptr_or_null(data)
                )
            })?;
        }
        Op::BindReadOnly { src, target, flags } => {
            // SAFETY: mount(2) reads the C strings `src` and `target`; type
            // and data are null.
            ck(unsafe {
                sc!(
                    libc::SYS_mount,
                    src.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null::<libc::c_char>(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null::<libc::c_void>()
                )
            })?;
            set_read_only(target, *flags)?;
        }
        Op::AttachTree { slot, target, .. } => {
            // SAFETY: move_mount reads the empty C string literal and the C
            // string `target`; the descriptor is the child's copy of the
            // tree, placed there by `Fds::install`.
            ck(unsafe {
                sc!(
                    libc::SYS_move_mount,
                    super::plan::FIRST_TREE_FD + *slot,
                    c"".as_ptr(),
                    libc::AT_FDCWD,
                    target.as_ptr(),
                    0x4u32
                )
            })?;
        }
        Op::SetReadOnly { target, flags } => set_read_only(target, *flags)?,
        Op::Remount { target, flags } => remount_keep(target, *flags)?,
        Op::Mkdir { path, mode } => {
            // SAFETY: mkdirat reads the C string `path`.
            match ck(unsafe { sc!(libc::SYS_mkdirat, libc::AT_FDCWD, path.as_ptr(), *mode) }) {
                Ok(_) | Err(libc::EEXIST) => {}
                Err(e) => return Err(e),
            }
        }
        Op::WriteFile {
            path,
            mode,
            contents,
        } => {
            // SAFETY: openat reads the C string `path`; the descriptor it
            // returns is new and the child's own.
            let fd = ck(unsafe {
                sc!(
                    libc::SYS_openat,
                    libc::AT_FDCWD,
                    path.as_ptr(),
                    libc::O_WRONLY
                        | libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_CLOEXEC
                        | libc::O_NOFOLLOW,
                    *mode
                )
            })?;
            let mut off = 0usize;
            while off < contents.len() {
                let rest = contents.get(off..).unwrap_or(&[]);
                // SAFETY: write(2) reads at most `rest.len()` bytes of
                // `rest`, part of `contents`.
                match ck(unsafe { sc!(libc::SYS_write, fd, rest.as_ptr(), rest.len()) }) {
                    Ok(n) => off += n,
                    Err(libc::EINTR) => {}
                    Err(e) => {
                        // SAFETY: closes `fd`, opened above and used no more.
                        unsafe { sc!(libc::SYS_close, fd) };
                        return Err(e);
                    }
                }
            }
            // SAFETY: closes `fd`, opened above and used no more.
            unsafe { sc!(libc::SYS_close, fd) };
        }
        Op::Symlink { target, link } => {
            // SAFETY: symlinkat reads the C strings `target` and `link`.
            ck(unsafe {
                sc!(
                    libc::SYS_symlinkat,
                    target.as_ptr(),
                    libc::AT_FDCWD,
                    link.as_ptr()
                )
            })?;
        }
        Op::PivotRoot { new_root } => {
            let dot = c".";
            // SAFETY: chdir reads the C string `new_root`.
            ck(unsafe { sc!(libc::SYS_chdir, new_root.as_ptr()) })?;
            // SAFETY: pivot_root reads the static C string ".", twice.
            ck(unsafe { sc!(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) })?;
            // SAFETY: umount2 reads the static C string ".".
            ck(unsafe { sc!(libc::SYS_umount2, dot.as_ptr(), libc::MNT_DETACH) })?;
            // SAFETY: chdir reads the static C string "/".
            ck(unsafe { sc!(libc::SYS_chdir, c"/".as_ptr()) })?;
        }
        Op::Chroot { path } => {
            // SAFETY: chroot reads the C string `path`.
            ck(unsafe { sc!(libc::SYS_chroot, path.as_ptr()) })?;
            // SAFETY: chdir reads the static C string "/".
            ck(unsafe { sc!(libc::SYS_chdir, c"/".as_ptr()) })?;
        }
        Op::Chdir { path } => {
            // SAFETY: chdir reads the C string `path`.
            ck(unsafe { sc!(libc::SYS_chdir, path.as_ptr()) })?;
        }
        Op::Hostname { name } => {
            let bytes = name.as_bytes();
            // SAFETY: sethostname reads `bytes.len()` bytes of `bytes`.
            ck(unsafe { sc!(libc::SYS_sethostname, bytes.as_ptr(), bytes.len()) })?;
        }
    }
    Ok(())
}
