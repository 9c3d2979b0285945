//! Start one sandboxed process: clone with new namespaces, run a prepared
//! setup program in the child, execve.
//!
//! The broker is multi-threaded. Between `clone` and `execve` the child is a
//! copy of one thread of a multi-threaded process: another thread may have
//! held the allocator lock, glibc's thread bookkeeping is stale (so its
//! `setresuid` wrapper would try to signal threads that do not exist), and
//! nothing but raw system calls on memory that already exists is safe. So
//! the parent builds everything the child needs into a [`ChildPlan`] (C
//! strings, pointer arrays, BPF programs, file contents), and the child only
//! walks that plan with raw `syscall(2)`s, never allocating, never panicking
//! (no indexing, no unwrap), and never calling a glibc wrapper that takes a
//! lock.
//!
//! Failures in the child are reported over a close-on-exec pipe as
//! `(step code, errno)`; a successful `execve` closes the pipe, so the parent
//! reads either eight bytes (setup failed) or end-of-file (the tool runs).

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;

/// Where the child stopped, as reported over the error pipe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildStep {
    /// Moving the stdio and control descriptors into place.
    Fds,
    /// Waiting for the parent's go-ahead.
    Sync,
    /// `unshare(CLONE_NEWCGROUP)` after the parent moved us into cgroups.
    CgroupNs,
    /// `setgroups(0, NULL)`.
    Groups,
    /// `setresgid`.
    Gid,
    /// `setresuid`.
    Uid,
    /// `prctl(PR_SET_PDEATHSIG)`, or the parent died during setup.
    DeathSignal,
    /// One of the plan's [`Op`]s (its index).
    Op(u32),
    /// `setrlimit` (resource number).
    Rlimit(u32),
    /// `setsid`.
    Setsid,
    /// `prctl(PR_SET_NO_NEW_PRIVS)`.
    NoNewPrivs,
    /// Landlock ruleset creation, a rule (index), or `landlock_restrict_self`.
    LandlockCreate,
    /// Adding Landlock rule number N.
    LandlockRule(u32),
    /// `landlock_restrict_self`.
    LandlockRestrict,
    /// Dropping the capability bounding set, ambient or permitted sets.
    Capabilities,
    /// Installing seccomp filter number N.
    Seccomp(u32),
    /// Unblocking signals before exec.
    SignalMask,
    /// `execve` of every candidate path failed.
    Exec,
    /// Network doors: bringing `lo` up.
    DoorsLoopback,
    /// Network doors: adding local address N to `lo`.
    DoorsAddress(u32),
    /// Network doors: creating the listening socket N.
    DoorsSocket(u32),
    /// Network doors: sending the sockets to the parent.
    DoorsSend,
    /// A code this version does not know.
    Unknown(u32),
}

impl ChildStep {
    fn code(self) -> u32 {
        match self {
            ChildStep::Fds => 1,
            ChildStep::Sync => 2,
            ChildStep::CgroupNs => 3,
            ChildStep::Groups => 4,
            ChildStep::Gid => 5,
            ChildStep::Uid => 6,
            ChildStep::DeathSignal => 7,
            ChildStep::Setsid => 8,
            ChildStep::NoNewPrivs => 9,
            ChildStep::LandlockCreate => 10,
            ChildStep::LandlockRestrict => 11,
            ChildStep::Capabilities => 12,
            ChildStep::SignalMask => 13,
            ChildStep::Exec => 14,
            ChildStep::DoorsLoopback => 15,
            ChildStep::DoorsSend => 16,
            ChildStep::Op(i) => 0x1000_0000 | (i & 0xff_ffff),
            ChildStep::Rlimit(i) => 0x2000_0000 | (i & 0xff_ffff),
            ChildStep::LandlockRule(i) => 0x3000_0000 | (i & 0xff_ffff),
            ChildStep::Seccomp(i) => 0x4000_0000 | (i & 0xff_ffff),
            ChildStep::DoorsAddress(i) => 0x5000_0000 | (i & 0xff_ffff),
            ChildStep::DoorsSocket(i) => 0x6000_0000 | (i & 0xff_ffff),
            ChildStep::Unknown(c) => c,
        }
    }

    fn from_code(c: u32) -> ChildStep {
        let low = c & 0xff_ffff;
        match c >> 28 {
            1 => return ChildStep::Op(low),
            2 => return ChildStep::Rlimit(low),
            3 => return ChildStep::LandlockRule(low),
            4 => return ChildStep::Seccomp(low),
            5 => return ChildStep::DoorsAddress(low),
            6 => return ChildStep::DoorsSocket(low),
            _ => {}
        }
        match c {
            1 => ChildStep::Fds,
            2 => ChildStep::Sync,
            3 => ChildStep::CgroupNs,
            4 => ChildStep::Groups,
            5 => ChildStep::Gid,
            6 => ChildStep::Uid,
            7 => ChildStep::DeathSignal,
            8 => ChildStep::Setsid,
            9 => ChildStep::NoNewPrivs,
            10 => ChildStep::LandlockCreate,
            11 => ChildStep::LandlockRestrict,
            12 => ChildStep::Capabilities,
            13 => ChildStep::SignalMask,
            14 => ChildStep::Exec,
            15 => ChildStep::DoorsLoopback,
            16 => ChildStep::DoorsSend,
            other => ChildStep::Unknown(other),
        }
    }
}

/// A setup failure reported by the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildFailure {
    /// The step that failed.
    pub step: ChildStep,
    /// The errno the kernel returned.
    pub errno: Errno,
}

impl ChildFailure {
    /// Decode the eight bytes the child wrote to the error pipe.
    pub fn decode(buf: [u8; 8]) -> ChildFailure {
        let [a, b, c, d, e, f, g, h] = buf;
        ChildFailure {
            step: ChildStep::from_code(u32::from_ne_bytes([a, b, c, d])),
            errno: Errno::from_raw(i32::from_ne_bytes([e, f, g, h])),
        }
    }
}

/// One filesystem or namespace operation of the child's setup program.
#[derive(Debug)]
pub enum Op {
    /// `mount(2)` exactly as given.
    Mount {
        /// Source, or none.
        src: Option<CString>,
        /// Mount point.
        target: CString,
        /// Filesystem type, or none (bind, remount, propagation changes).
        fstype: Option<CString>,
        /// `MS_*` flags.
        flags: libc::c_ulong,
        /// Filesystem options, or none.
        data: Option<CString>,
    },
    /// Bind `src` on `target` (recursively), then make it read-only with
    /// `flags` added (e.g. `MS_NOSUID | MS_NODEV`): a bind remount that keeps
    /// every flag the kernel reports as already set (locked flags in a user
    /// namespace cannot be cleared), followed by a recursive
    /// `mount_setattr` so submounts are read-only too.
    BindReadOnly {
        /// Host path.
        src: CString,
        /// Mount point in the new root.
        target: CString,
        /// `MS_*` flags to add besides `MS_RDONLY`.
        flags: libc::c_ulong,
    },
    /// Bind remount of an existing mount point with `flags` added, keeping
    /// the flags it already has.
    Remount {
        /// Mount point.
        target: CString,
        /// `MS_*` flags to add.
        flags: libc::c_ulong,
    },
    /// `mkdir(2)`; an existing directory is fine.
    Mkdir {
        /// Path.
        path: CString,
        /// Mode.
        mode: libc::mode_t,
    },
    /// Create a file (exclusive) and write `contents` to it.
    WriteFile {
        /// Path.
        path: CString,
        /// Mode.
        mode: libc::mode_t,
        /// Bytes.
        contents: Vec<u8>,
    },
    /// `symlink(target, link)`.
    Symlink {
        /// What the link points to.
        target: CString,
        /// Where the link is created.
        link: CString,
    },
    /// Make `new_root` the root: `chdir(new_root)`, `pivot_root(".", ".")`,
    /// detach the old root (`umount2(".", MNT_DETACH)`), `chdir("/")`.
    PivotRoot {
        /// A mount point.
        new_root: CString,
    },
    /// `chdir(2)`.
    Chdir {
        /// Path.
        path: CString,
    },
    /// `sethostname(2)`.
    Hostname {
        /// Name.
        name: CString,
    },
}

/// One `op` with how to treat a missing path.
#[derive(Debug)]
pub struct Step {
    /// The operation.
    pub op: Op,
    /// Skip the step when it fails with ENOENT (e.g. a /proc file that this
    /// kernel does not have).
    pub skip_if_missing: bool,
}

/// Landlock ruleset, prepared in the parent.
#[derive(Debug)]
pub struct LandlockPlan {
    /// `handled_access_fs`.
    pub handled_fs: u64,
    /// `handled_access_net` (0 when the kernel's ABI is below 4).
    pub handled_net: u64,
    /// `scoped` (0 when the kernel's ABI is below 6).
    pub scoped: u64,
    /// Size of `struct landlock_ruleset_attr` to pass: 8, 16 or 24 bytes
    /// depending on which fields the kernel knows.
    pub attr_size: usize,
    /// Path-beneath rules: path (inside the new root) and allowed access.
    pub rules: Vec<(CString, u64)>,
}

/// Network doors, prepared in the parent (see the jail crate).
#[derive(Debug)]
pub struct DoorsPlan {
    /// Complete `RTM_NEWADDR` netlink messages, one per local address.
    pub addr_messages: Vec<Vec<u8>>,
    /// Sockets to create: (domain, type, sockaddr bytes). Stream sockets
    /// are put in listening state.
    pub sockets: Vec<(libc::c_int, libc::c_int, Vec<u8>)>,
}

/// Everything the child needs, built before `clone`.
#[derive(Debug)]
pub struct ChildPlan {
    /// `CLONE_NEW*` flags for `clone3`.
    pub namespaces: u64,
    /// A cgroup v2 directory to start in (`CLONE_INTO_CGROUP`).
    pub cgroup_fd: Option<RawFd>,
    /// Descriptor that becomes the child's 0.
    pub stdin: RawFd,
    /// Descriptor that becomes the child's 1.
    pub stdout: RawFd,
    /// Descriptor that becomes the child's 2.
    pub stderr: RawFd,
    /// Read end of the go-ahead pipe.
    pub sync_read: RawFd,
    /// Write end of the error pipe.
    pub err_write: RawFd,
    /// A socket over which the child sends its door sockets.
    pub doors_sock: Option<RawFd>,
    /// `unshare(CLONE_NEWCGROUP)` after the go-ahead.
    pub cgroup_ns: bool,
    /// Call `setgroups(0, NULL)` (only possible when the parent left
    /// `setgroups` allowed, i.e. a privileged parent).
    pub clear_groups: bool,
    /// uid inside the user namespace.
    pub uid: u32,
    /// gid inside the user namespace.
    pub gid: u32,
    /// The filesystem program.
    pub steps: Vec<Step>,
    /// Network doors, set up after the filesystem program.
    pub doors: Option<DoorsPlan>,
    /// `(resource, soft, hard)`.
    pub rlimits: Vec<(u32, u64, u64)>,
    /// Landlock, when the kernel has it and it is wanted.
    pub landlock: Option<LandlockPlan>,
    /// Highest capability number (`/proc/sys/kernel/cap_last_cap`).
    pub cap_last: u32,
    /// seccomp filters, installed in this order, last of all.
    pub seccomp: Vec<Vec<libc::sock_filter>>,
    /// Candidate paths for `execve`, tried in order.
    pub exec_paths: Vec<CString>,
    /// argv.
    pub argv: Vec<CString>,
    /// envp.
    pub envp: Vec<CString>,
}

/// A started child.
#[derive(Debug)]
pub struct Child {
    /// Its pid in the caller's pid namespace.
    pub pid: libc::pid_t,
    /// A pidfd for it.
    pub pidfd: OwnedFd,
}

/// `struct landlock_ruleset_attr` (ABI 6 layout).
#[repr(C)]
struct LandlockRulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

/// `struct landlock_path_beneath_attr` (packed in the uapi header).
#[repr(C, packed)]
struct LandlockPathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// `struct mount_attr` for `mount_setattr(2)`.
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// `CLONE_INTO_CGROUP` (libc's constant has the wrong width).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

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

const LANDLOCK_RULE_PATH_BENEATH: libc::c_long = 1;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;

/// Pointer arrays for execve, built in the parent.
struct ExecArrays {
    argv: Vec<*const libc::c_char>,
    envp: Vec<*const libc::c_char>,
    fprogs: Vec<libc::sock_fprog>,
}

fn null_terminated(strings: &[CString]) -> Vec<*const libc::c_char> {
    let mut v: Vec<*const libc::c_char> = strings.iter().map(|s| s.as_ptr()).collect();
    v.push(std::ptr::null());
    v
}

/// Start the child described by `plan`.
///
/// On success the child is waiting on `plan.sync_read` for one byte; the
/// caller writes its uid/gid maps, moves it into cgroups and then writes the
/// byte. The caller keeps the write end open until the child has been
/// reaped: the child checks it after setting its parent-death signal.
pub fn spawn(plan: &ChildPlan) -> Result<Child, Errno> {
    let mut fprogs = Vec::with_capacity(plan.seccomp.len());
    for prog in &plan.seccomp {
        let len = u16::try_from(prog.len()).map_err(|_| Errno::E2BIG)?;
        fprogs.push(libc::sock_fprog {
            len,
            filter: prog.as_ptr().cast_mut(),
        });
    }
    let arrays = ExecArrays {
        argv: null_terminated(&plan.argv),
        envp: null_terminated(&plan.envp),
        fprogs,
    };

    // Block every signal around clone so that no handler of the broker runs
    // in the child before it has reset them; the child unblocks right
    // before execve, the parent right after clone.
    let mut old: libc::sigset_t = zeroed_sigset();
    let mut all: libc::sigset_t = zeroed_sigset();
    // SAFETY: sigfillset/pthread_sigmask write into the sigset_t values we
    // own; both are plain libc calls with valid pointers.
    unsafe {
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
    }

    let mut pidfd: libc::c_int = -1;
    let mut flags = plan.namespaces | libc::CLONE_PIDFD as u64;
    let mut cgroup = 0u64;
    if let Some(fd) = plan.cgroup_fd {
        flags |= CLONE_INTO_CGROUP;
        cgroup = u64::try_from(fd).map_err(|_| Errno::EBADF)?;
    }
    // SAFETY: clone_args is plain data; zeroed is a valid value.
    let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
    args.flags = flags;
    args.pidfd = (&mut pidfd as *mut libc::c_int) as u64;
    args.exit_signal = libc::SIGCHLD as u64;
    args.cgroup = cgroup;
    // SAFETY: clone3 with stack 0 behaves like fork: the child continues on
    // a copy-on-write copy of this stack. The child branch below only runs
    // `child_main`, which never returns and only makes raw system calls on
    // memory that `plan` and `arrays` already own (see the module comment).
    let mut rc = unsafe {
        libc::syscall(
            libc::SYS_clone3,
            &mut args as *mut libc::clone_args,
            std::mem::size_of::<libc::clone_args>(),
        )
    };
    if rc < 0 && Errno::last() == Errno::ENOSYS && plan.cgroup_fd.is_none() {
        // Kernels before 5.3: clone(2) with CLONE_PIDFD stores the pidfd
        // through the parent_tid argument.
        // SAFETY: as above, fork-like clone without CLONE_VM.
        rc = unsafe {
            libc::syscall(
                libc::SYS_clone,
                (plan.namespaces | libc::CLONE_PIDFD as u64 | libc::SIGCHLD as u64)
                    as libc::c_ulong,
                0usize,
                &mut pidfd as *mut libc::c_int,
                0usize,
                0usize,
            )
        };
    }
    if rc == 0 {
        // SAFETY: we are the freshly cloned child; see child_main.
        unsafe { child_main(plan, &arrays) }
    }
    let err = Errno::last();
    // SAFETY: restores the mask saved above.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
    if rc < 0 {
        return Err(err);
    }
    let pid = libc::pid_t::try_from(rc).map_err(|_| Errno::EOVERFLOW)?;
    if pidfd < 0 {
        return Err(Errno::EBADF);
    }
    // SAFETY: the kernel returned `pidfd` as a new descriptor owned by nobody
    // else in this process.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok(Child { pid, pidfd })
}

fn zeroed_sigset() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; all-zero is the empty set.
    unsafe { std::mem::zeroed() }
}

/// Raw syscall returning -1/errno like libc; errno read through the libc
/// location (thread-local, already set up for this thread).
#[inline(always)]
fn errno() -> i32 {
    Errno::last_raw()
}

/// Write the failure to the error pipe and exit. Never returns. Meant for
/// the cloned child only (it `_exit`s the calling process).
#[inline(never)]
fn fail(err_fd: RawFd, step: ChildStep, errno: i32) -> ! {
    let code = step.code().to_ne_bytes();
    let e = errno.to_ne_bytes();
    let buf = [code[0], code[1], code[2], code[3], e[0], e[1], e[2], e[3]];
    // SAFETY: writes 8 bytes from a stack buffer; _exit never returns.
    unsafe {
        libc::write(err_fd, buf.as_ptr().cast(), buf.len());
        libc::_exit(127)
    }
}

macro_rules! check {
    ($err:expr, $step:expr, $rc:expr) => {
        if ($rc) < 0 {
            let e = errno();
            fail($err, $step, e)
        }
    };
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
    // SAFETY: path is a valid C string; st is a valid out pointer of the
    // kernel's layout.
    let rc = unsafe { libc::syscall(libc::SYS_statfs, path.as_ptr(), &mut st as *mut KStatfs) };
    if rc < 0 {
        return Err(errno());
    }
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
    // SAFETY: valid C strings / null pointers for mount(2).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount,
            std::ptr::null::<libc::c_char>(),
            target.as_ptr(),
            std::ptr::null::<libc::c_char>(),
            libc::MS_REMOUNT | libc::MS_BIND | flags | keep,
            std::ptr::null::<libc::c_void>(),
        )
    };
    if rc < 0 { Err(errno()) } else { Ok(()) }
}

fn run_op(op: &Op) -> Result<(), i32> {
    // SAFETY (for every block in this function): raw system calls whose
    // pointer arguments are C strings and buffers owned by `op`, which the
    // parent built before clone and which live for the whole child.
    match op {
        Op::Mount {
            src,
            target,
            fstype,
            flags,
            data,
        } => {
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_mount,
                    ptr_or_null(src),
                    target.as_ptr(),
                    ptr_or_null(fstype),
                    *flags,
                    ptr_or_null(data) as *const libc::c_void,
                )
            };
            if rc < 0 {
                return Err(errno());
            }
        }
        Op::BindReadOnly { src, target, flags } => {
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_mount,
                    src.as_ptr(),
                    target.as_ptr(),
                    std::ptr::null::<libc::c_char>(),
                    libc::MS_BIND | libc::MS_REC,
                    std::ptr::null::<libc::c_void>(),
                )
            };
            if rc < 0 {
                return Err(errno());
            }
            remount_keep(target, libc::MS_RDONLY | *flags)?;
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
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_mount_setattr,
                    libc::AT_FDCWD,
                    target.as_ptr(),
                    (libc::AT_RECURSIVE | libc::AT_SYMLINK_NOFOLLOW) as libc::c_uint,
                    &attr as *const MountAttr,
                    std::mem::size_of::<MountAttr>(),
                )
            };
            // The bind remount above already made the top mount read-only;
            // a kernel without mount_setattr (before 5.12) only misses the
            // recursive part for submounts.
            if rc < 0 && errno() != libc::ENOSYS {
                return Err(errno());
            }
        }
        Op::Remount { target, flags } => remount_keep(target, *flags)?,
        Op::Mkdir { path, mode } => {
            let rc =
                unsafe { libc::syscall(libc::SYS_mkdirat, libc::AT_FDCWD, path.as_ptr(), *mode) };
            if rc < 0 && errno() != libc::EEXIST {
                return Err(errno());
            }
        }
        Op::WriteFile {
            path,
            mode,
            contents,
        } => {
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_openat,
                    libc::AT_FDCWD,
                    path.as_ptr(),
                    libc::O_WRONLY
                        | libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_CLOEXEC
                        | libc::O_NOFOLLOW,
                    *mode,
                )
            };
            if fd < 0 {
                return Err(errno());
            }
            let fd = fd as libc::c_int;
            let mut off = 0usize;
            while off < contents.len() {
                let rest = contents.get(off..).unwrap_or(&[]);
                let n = unsafe { libc::syscall(libc::SYS_write, fd, rest.as_ptr(), rest.len()) };
                if n < 0 {
                    let e = errno();
                    if e == libc::EINTR {
                        continue;
                    }
                    unsafe { libc::syscall(libc::SYS_close, fd) };
                    return Err(e);
                }
                off += n as usize;
            }
            unsafe { libc::syscall(libc::SYS_close, fd) };
        }
        Op::Symlink { target, link } => {
            let rc = unsafe {
                libc::syscall(
                    libc::SYS_symlinkat,
                    target.as_ptr(),
                    libc::AT_FDCWD,
                    link.as_ptr(),
                )
            };
            if rc < 0 {
                return Err(errno());
            }
        }
        Op::PivotRoot { new_root } => {
            let dot = c".";
            if unsafe { libc::syscall(libc::SYS_chdir, new_root.as_ptr()) } < 0 {
                return Err(errno());
            }
            if unsafe { libc::syscall(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) } < 0 {
                return Err(errno());
            }
            if unsafe { libc::syscall(libc::SYS_umount2, dot.as_ptr(), libc::MNT_DETACH) } < 0 {
                return Err(errno());
            }
            if unsafe { libc::syscall(libc::SYS_chdir, c"/".as_ptr()) } < 0 {
                return Err(errno());
            }
        }
        Op::Chdir { path } => {
            if unsafe { libc::syscall(libc::SYS_chdir, path.as_ptr()) } < 0 {
                return Err(errno());
            }
        }
        Op::Hostname { name } => {
            let bytes = name.as_bytes();
            if unsafe { libc::syscall(libc::SYS_sethostname, bytes.as_ptr(), bytes.len()) } < 0 {
                return Err(errno());
            }
        }
    }
    Ok(())
}

/// The child side. Never returns: it either execs or `_exit`s.
///
/// # Safety
/// Must only be called in the child right after a fork-like clone. Only
/// raw system calls on memory owned by `plan`/`arrays` happen here; no
/// allocation, no locks, no panics.
unsafe fn child_main(plan: &ChildPlan, arrays: &ExecArrays) -> ! {
    // SAFETY (whole function): see the function contract. Every pointer
    // passed below points into `plan`/`arrays` or into this stack frame.
    unsafe {
        // 1. Default dispositions for every signal (SIG_IGN survives execve,
        //    e.g. the broker's ignored SIGPIPE). The mask stays full until
        //    right before execve.
        let dfl: libc::sigaction = std::mem::zeroed(); // sa_handler = SIG_DFL
        for sig in 1..=64 {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            libc::syscall(
                libc::SYS_rt_sigaction,
                sig,
                &dfl as *const libc::sigaction,
                std::ptr::null_mut::<libc::sigaction>(),
                8usize,
            );
        }

        // 2. Descriptors: move everything we keep above 10, then down to
        //    0..=5, then close the rest (the broker's other descriptors,
        //    including other sandboxes' pipes).
        let mut err_fd = plan.err_write;
        let srcs = [
            plan.stdin,
            plan.stdout,
            plan.stderr,
            plan.sync_read,
            plan.err_write,
            plan.doors_sock.unwrap_or(-1),
        ];
        let mut high = [-1 as RawFd; 6];
        for (i, &fd) in srcs.iter().enumerate() {
            if fd < 0 {
                continue;
            }
            let r = libc::syscall(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, 10);
            check!(err_fd, ChildStep::Fds, r);
            if let Some(slot) = high.get_mut(i) {
                *slot = r as RawFd;
            }
        }
        let mut next_free = 0;
        for (target, &fd) in high.iter().enumerate() {
            if fd < 0 {
                continue;
            }
            let flags = if target == 4 { libc::O_CLOEXEC } else { 0 };
            let r = libc::syscall(libc::SYS_dup3, fd, target as libc::c_int, flags);
            check!(err_fd, ChildStep::Fds, r);
            if target == 4 {
                err_fd = 4;
            }
            next_free = target as libc::c_uint + 1;
        }
        let r = libc::syscall(libc::SYS_close_range, next_free, libc::c_uint::MAX, 0);
        if r < 0 {
            // close_range appeared in 5.9; close one by one otherwise.
            for fd in next_free..4096 {
                libc::syscall(libc::SYS_close, fd);
            }
        }
        let has_doors = plan.doors_sock.is_some();

        // 3. Wait for the parent: maps written, cgroups joined.
        let mut go = [0u8; 1];
        loop {
            let n = libc::syscall(libc::SYS_read, 3, go.as_mut_ptr(), 1usize);
            if n == 1 {
                break;
            }
            if n < 0 && errno() == libc::EINTR {
                continue;
            }
            // The parent went away or gave up: nothing to report to.
            libc::_exit(126);
        }

        // 4. Cgroup namespace rooted at the cgroups we were just moved into.
        if plan.cgroup_ns {
            check!(
                err_fd,
                ChildStep::CgroupNs,
                libc::syscall(libc::SYS_unshare, libc::CLONE_NEWCGROUP)
            );
        }

        // 5. Identity. Raw calls: glibc's wrappers would try to signal the
        //    broker's other threads, which do not exist here.
        if plan.clear_groups {
            check!(
                err_fd,
                ChildStep::Groups,
                libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>())
            );
        }
        check!(
            err_fd,
            ChildStep::Gid,
            libc::syscall(libc::SYS_setresgid, plan.gid, plan.gid, plan.gid)
        );
        check!(
            err_fd,
            ChildStep::Uid,
            libc::syscall(libc::SYS_setresuid, plan.uid, plan.uid, plan.uid)
        );

        // 6. Die with the broker. Set after the uid change, which clears it;
        //    then make sure the parent did not die before it was set.
        check!(
            err_fd,
            ChildStep::DeathSignal,
            libc::syscall(
                libc::SYS_prctl,
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL,
                0,
                0,
                0
            )
        );
        let mut pfd = libc::pollfd {
            fd: 3,
            events: libc::POLLIN,
            revents: 0,
        };
        let n = libc::syscall(libc::SYS_poll, &mut pfd as *mut libc::pollfd, 1usize, 0);
        if n > 0 && (pfd.revents & libc::POLLHUP) != 0 {
            libc::_exit(126);
        }
        libc::syscall(libc::SYS_close, 3);

        // 7. The filesystem program.
        for (i, step) in plan.steps.iter().enumerate() {
            if let Err(e) = run_op(&step.op)
                && !(step.skip_if_missing && e == libc::ENOENT)
            {
                fail(err_fd, ChildStep::Op(i as u32), e);
            }
        }

        // 8. Network doors.
        if let Some(doors) = &plan.doors
            && has_doors
        {
            setup_doors(doors, err_fd);
        }

        // 9. Resource limits.
        for &(res, soft, hard) in &plan.rlimits {
            let lim = libc::rlimit64 {
                rlim_cur: soft,
                rlim_max: hard,
            };
            check!(
                err_fd,
                ChildStep::Rlimit(res),
                libc::syscall(
                    libc::SYS_prlimit64,
                    0,
                    res,
                    &lim as *const libc::rlimit64,
                    std::ptr::null_mut::<libc::rlimit64>()
                )
            );
        }

        // 10. New session, no controlling terminal.
        check!(err_fd, ChildStep::Setsid, libc::syscall(libc::SYS_setsid));

        // 11. no_new_privs (needed by Landlock and by seccomp without
        //     CAP_SYS_ADMIN).
        check!(
            err_fd,
            ChildStep::NoNewPrivs,
            libc::syscall(libc::SYS_prctl, libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        );

        // 12. Landlock.
        if let Some(ll) = &plan.landlock {
            let attr = LandlockRulesetAttr {
                handled_access_fs: ll.handled_fs,
                handled_access_net: ll.handled_net,
                scoped: ll.scoped,
            };
            let size = ll.attr_size.min(std::mem::size_of::<LandlockRulesetAttr>());
            let rs = libc::syscall(
                libc::SYS_landlock_create_ruleset,
                &attr as *const LandlockRulesetAttr,
                size,
                0u32,
            );
            check!(err_fd, ChildStep::LandlockCreate, rs);
            let rs = rs as libc::c_int;
            for (i, (path, access)) in ll.rules.iter().enumerate() {
                let fd = libc::syscall(
                    libc::SYS_openat,
                    libc::AT_FDCWD,
                    path.as_ptr(),
                    libc::O_PATH | libc::O_CLOEXEC,
                    0,
                );
                check!(err_fd, ChildStep::LandlockRule(i as u32), fd);
                let rule = LandlockPathBeneathAttr {
                    allowed_access: *access,
                    parent_fd: fd as i32,
                };
                let r = libc::syscall(
                    libc::SYS_landlock_add_rule,
                    rs,
                    LANDLOCK_RULE_PATH_BENEATH,
                    &rule as *const LandlockPathBeneathAttr,
                    0u32,
                );
                check!(err_fd, ChildStep::LandlockRule(i as u32), r);
                libc::syscall(libc::SYS_close, fd);
            }
            check!(
                err_fd,
                ChildStep::LandlockRestrict,
                libc::syscall(libc::SYS_landlock_restrict_self, rs, 0u32)
            );
            libc::syscall(libc::SYS_close, rs);
        }

        // 13. Capabilities: bounding set, ambient, then all three sets.
        for cap in 0..=plan.cap_last {
            let r = libc::syscall(libc::SYS_prctl, libc::PR_CAPBSET_DROP, cap, 0, 0, 0);
            if r < 0 && errno() != libc::EINVAL {
                fail(err_fd, ChildStep::Capabilities, errno());
            }
        }
        check!(
            err_fd,
            ChildStep::Capabilities,
            libc::syscall(
                libc::SYS_prctl,
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0
            )
        );
        // _LINUX_CAPABILITY_VERSION_3 with two zeroed data structs.
        let mut header: [u32; 2] = [0x2008_0522, 0];
        let data = [0u32; 6];
        check!(
            err_fd,
            ChildStep::Capabilities,
            libc::syscall(libc::SYS_capset, header.as_mut_ptr(), data.as_ptr())
        );

        // 14. seccomp, last before exec.
        for (i, prog) in arrays.fprogs.iter().enumerate() {
            check!(
                err_fd,
                ChildStep::Seccomp(i as u32),
                libc::syscall(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    0,
                    prog as *const libc::sock_fprog
                )
            );
        }

        // 15. Unblock signals (the mask survives execve) and exec.
        let empty: libc::sigset_t = std::mem::zeroed();
        check!(
            err_fd,
            ChildStep::SignalMask,
            libc::syscall(
                libc::SYS_rt_sigprocmask,
                libc::SIG_SETMASK,
                &empty as *const libc::sigset_t,
                std::ptr::null_mut::<libc::sigset_t>(),
                8usize
            )
        );
        let mut saved = libc::ENOENT;
        for path in &plan.exec_paths {
            libc::syscall(
                libc::SYS_execve,
                path.as_ptr(),
                arrays.argv.as_ptr(),
                arrays.envp.as_ptr(),
            );
            let e = errno();
            match e {
                libc::ENOENT | libc::ENOTDIR => {}
                libc::EACCES => saved = e,
                _ => fail(err_fd, ChildStep::Exec, e),
            }
        }
        fail(err_fd, ChildStep::Exec, saved)
    }
}

/// Child side of network doors: `lo` up, addresses, sockets, SCM_RIGHTS.
///
/// # Safety
/// Child context (see `child_main`).
unsafe fn setup_doors(doors: &DoorsPlan, err_fd: RawFd) {
    // SAFETY (whole function): raw syscalls on buffers owned by `doors` or
    // by this stack frame.
    unsafe {
        // lo up: SIOCSIFFLAGS with IFF_UP | IFF_RUNNING on an AF_INET
        // datagram socket (any family works for the ioctl).
        let s = libc::syscall(
            libc::SYS_socket,
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            0,
        );
        check!(err_fd, ChildStep::DoorsLoopback, s);
        let s = s as libc::c_int;
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0".iter()) {
            *dst = *src as libc::c_char;
        }
        ifr.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        check!(
            err_fd,
            ChildStep::DoorsLoopback,
            libc::syscall(
                libc::SYS_ioctl,
                s,
                libc::SIOCSIFFLAGS,
                &ifr as *const libc::ifreq
            )
        );
        libc::syscall(libc::SYS_close, s);

        // Addresses on lo via rtnetlink.
        if !doors.addr_messages.is_empty() {
            let nl = libc::syscall(
                libc::SYS_socket,
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            );
            check!(err_fd, ChildStep::DoorsAddress(0), nl);
            let nl = nl as libc::c_int;
            for (i, msg) in doors.addr_messages.iter().enumerate() {
                let step = ChildStep::DoorsAddress(i as u32);
                let mut sa: libc::sockaddr_nl = std::mem::zeroed();
                sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
                let n = libc::syscall(
                    libc::SYS_sendto,
                    nl,
                    msg.as_ptr(),
                    msg.len(),
                    0,
                    &sa as *const libc::sockaddr_nl,
                    std::mem::size_of::<libc::sockaddr_nl>(),
                );
                check!(err_fd, step, n);
                // The ack: struct nlmsghdr followed by struct nlmsgerr whose
                // first field is the (negative) errno, 0 for success.
                let mut buf = [0u8; 512];
                let n = libc::syscall(
                    libc::SYS_recvfrom,
                    nl,
                    buf.as_mut_ptr(),
                    buf.len(),
                    0,
                    0usize,
                    0usize,
                );
                check!(err_fd, step, n);
                if n >= 20 {
                    let ty = u16::from_ne_bytes([buf[4], buf[5]]);
                    let e = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
                    if ty == libc::NLMSG_ERROR as u16 && e != 0 {
                        fail(err_fd, step, -e);
                    }
                }
            }
            libc::syscall(libc::SYS_close, nl);
        }

        // Sockets, sent one per message to the parent over fd 5.
        for (i, (domain, ty, addr)) in doors.sockets.iter().enumerate() {
            let step = ChildStep::DoorsSocket(i as u32);
            let fd = libc::syscall(libc::SYS_socket, *domain, *ty | libc::SOCK_CLOEXEC, 0);
            check!(err_fd, step, fd);
            let fd = fd as libc::c_int;
            let one: libc::c_int = 1;
            libc::syscall(
                libc::SYS_setsockopt,
                fd,
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                &one as *const libc::c_int,
                std::mem::size_of::<libc::c_int>(),
            );
            if *domain == libc::AF_INET6 {
                libc::syscall(
                    libc::SYS_setsockopt,
                    fd,
                    libc::IPPROTO_IPV6,
                    libc::IPV6_V6ONLY,
                    &one as *const libc::c_int,
                    std::mem::size_of::<libc::c_int>(),
                );
            }
            // IP_FREEBIND / IPV6_FREEBIND: bind to addresses of a local
            // range (e.g. 198.18.0.0/15 on lo) without the exact address.
            libc::syscall(
                libc::SYS_setsockopt,
                fd,
                libc::IPPROTO_IP,
                libc::IP_FREEBIND,
                &one as *const libc::c_int,
                std::mem::size_of::<libc::c_int>(),
            );
            check!(
                err_fd,
                step,
                libc::syscall(libc::SYS_bind, fd, addr.as_ptr(), addr.len())
            );
            if *ty == libc::SOCK_STREAM {
                check!(err_fd, step, libc::syscall(libc::SYS_listen, fd, 128));
            }
            let r = send_fd(5, fd);
            if r < 0 {
                fail(err_fd, ChildStep::DoorsSend, errno());
            }
            libc::syscall(libc::SYS_close, fd);
        }
        // Wait until the parent has handed the sockets over.
        let mut go = [0u8; 1];
        loop {
            let n = libc::syscall(libc::SYS_read, 5, go.as_mut_ptr(), 1usize);
            if n == 1 {
                break;
            }
            if n < 0 && errno() == libc::EINTR {
                continue;
            }
            libc::_exit(126);
        }
        libc::syscall(libc::SYS_close, 5);
    }
}

/// Send one descriptor with a one-byte payload over a unix socket.
///
/// # Safety
/// Raw sendmsg on stack buffers; child-safe (no allocation).
unsafe fn send_fd(sock: RawFd, fd: RawFd) -> libc::c_long {
    // SAFETY: all pointers refer to this stack frame; CMSG_* macros compute
    // offsets within `cbuf`, sized for one int.
    unsafe {
        let mut byte = [b'd'; 1];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut cbuf = [0u64; 4]; // 32 bytes, aligned: CMSG_SPACE(4) = 24
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) as usize;
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() {
            return -1;
        }
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        libc::syscall(
            libc::SYS_sendmsg,
            sock,
            &msg as *const libc::msghdr,
            libc::MSG_NOSIGNAL,
        )
    }
}

/// Receive one descriptor sent by [`send_fd`]. `Ok(None)` at end of stream.
pub fn recv_fd(sock: &impl AsRawFd) -> Result<Option<OwnedFd>, Errno> {
    // SAFETY: all pointers refer to this stack frame; the received
    // descriptor is new and owned by nothing else in this process.
    unsafe {
        let mut byte = [0u8; 1];
        let mut iov = libc::iovec {
            iov_base: byte.as_mut_ptr().cast(),
            iov_len: 1,
        };
        let mut cbuf = [0u64; 4];
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&cbuf);
        let n = loop {
            let n = libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC);
            if n < 0 && Errno::last() == Errno::EINTR {
                continue;
            }
            break n;
        };
        if n < 0 {
            return Err(Errno::last());
        }
        if n == 0 {
            return Ok(None);
        }
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        if cmsg.is_null() || (*cmsg).cmsg_type != libc::SCM_RIGHTS {
            return Err(Errno::EPROTO);
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>());
        Ok(Some(OwnedFd::from_raw_fd(fd)))
    }
}
