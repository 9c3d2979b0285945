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
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

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
    /// Moving into cgroup number N (a write of `0` to its `tasks` or
    /// `cgroup.procs` file).
    CgroupJoin(u32),
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
            ChildStep::CgroupJoin(i) => 0x7000_0000 | (i & 0xff_ffff),
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
            7 => return ChildStep::CgroupJoin(low),
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
    /// Bind `src` on `target` (recursively), then make it and its submounts
    /// read-only with `flags` added (e.g. `MS_NOSUID | MS_NODEV`) through a
    /// recursive `mount_setattr`, which keeps every flag already set (locked
    /// flags in a user namespace cannot be cleared). Before Linux 5.12: a
    /// bind remount that keeps those flags, for the top mount only.
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
    /// cgroup files, opened by the parent for writing (v1 `tasks`; a v2
    /// `cgroup.procs` only where the child cannot be born in its v2
    /// cgroup): the child moves itself into each by writing `0`, first
    /// thing after clone. Moving the calling thread alone does not take
    /// the kernel's global threadgroup lock (whose first writer after a
    /// quiet spell waits for an RCU grace period, several milliseconds),
    /// which a write of a pid to `cgroup.procs` does. The child is
    /// single-threaded, so the thread is the whole process. The kernel
    /// checks the opener's credentials, so the child's own do not matter.
    pub join_cgroups: Vec<RawFd>,
    /// Join this network namespace instead of creating one: the calling
    /// thread enters it for the `clone3` (so the child is born in it) and
    /// returns to its own right after. `namespaces` must not contain
    /// `CLONE_NEWNET` then.
    pub join_net: Option<RawFd>,
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

const LANDLOCK_RULE_PATH_BENEATH: usize = 1;
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const MOUNT_ATTR_NODEV: u64 = 0x4;
const MOUNT_ATTR_NOEXEC: u64 = 0x8;

/// Size of the child's own stack when it shares the broker's memory.
const CHILD_STACK: usize = 256 << 10;
const PAGE: usize = 4096;

/// Raw system calls that never touch `errno`.
///
/// With `CLONE_VM` the child shares the broker's memory, including the
/// calling thread's TLS, so glibc's `syscall()` (which stores errno there)
/// would overwrite the broker thread's errno. These return `-errno`.
mod raw {
    /// `syscall(nr, a..f)`, returning the raw kernel result.
    ///
    /// # Safety
    /// The arguments must be valid for the system call `nr`.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub unsafe fn syscall6(
        nr: libc::c_long,
        a: usize,
        b: usize,
        c: usize,
        d: usize,
        e: usize,
        f: usize,
    ) -> isize {
        let ret: isize;
        // SAFETY: the x86_64 syscall instruction with the kernel's calling
        // convention; rcx and r11 are clobbered by the instruction. The
        // caller vouches for the arguments.
        unsafe {
            core::arch::asm!(
                "syscall",
                inlateout("rax") nr as isize => ret,
                in("rdi") a,
                in("rsi") b,
                in("rdx") c,
                in("r10") d,
                in("r8") e,
                in("r9") f,
                lateout("rcx") _,
                lateout("r11") _,
                options(nostack),
            );
        }
        ret
    }

    /// Elsewhere the child is a fork-like copy (no shared memory), so
    /// glibc's wrapper and its errno are fine.
    ///
    /// # Safety
    /// The arguments must be valid for the system call `nr`.
    #[cfg(not(target_arch = "x86_64"))]
    #[inline(always)]
    pub unsafe fn syscall6(
        nr: libc::c_long,
        a: usize,
        b: usize,
        c: usize,
        d: usize,
        e: usize,
        f: usize,
    ) -> isize {
        // SAFETY: as above.
        let r = unsafe { libc::syscall(nr, a, b, c, d, e, f) };
        if r < 0 {
            -(nix::errno::Errno::last_raw() as isize)
        } else {
            r as isize
        }
    }
}

/// `sc!(NR, args...)`: a raw system call with up to six arguments, each
/// cast to `usize`; evaluates to the raw result (`-errno` on failure).
macro_rules! sc {
    ($nr:expr) => { raw::syscall6($nr, 0, 0, 0, 0, 0, 0) };
    ($nr:expr, $a:expr) => { raw::syscall6($nr, $a as usize, 0, 0, 0, 0, 0) };
    ($nr:expr, $a:expr, $b:expr) => { raw::syscall6($nr, $a as usize, $b as usize, 0, 0, 0, 0) };
    ($nr:expr, $a:expr, $b:expr, $c:expr) => { raw::syscall6($nr, $a as usize, $b as usize, $c as usize, 0, 0, 0) };
    ($nr:expr, $a:expr, $b:expr, $c:expr, $d:expr) => {
        raw::syscall6($nr, $a as usize, $b as usize, $c as usize, $d as usize, 0, 0)
    };
    ($nr:expr, $a:expr, $b:expr, $c:expr, $d:expr, $e:expr) => {
        raw::syscall6($nr, $a as usize, $b as usize, $c as usize, $d as usize, $e as usize, 0)
    };
    ($nr:expr, $a:expr, $b:expr, $c:expr, $d:expr, $e:expr, $f:expr) => {
        raw::syscall6($nr, $a as usize, $b as usize, $c as usize, $d as usize, $e as usize, $f as usize)
    };
}

/// Raw result to `Result` (errno on failure).
#[inline(always)]
fn ck(r: isize) -> Result<usize, i32> {
    if r < 0 {
        Err((-r) as i32)
    } else {
        Ok(r as usize)
    }
}

/// Pointer arrays for execve and seccomp, built in the parent.
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

/// The child's stack (only with `CLONE_VM`): a private mapping with a
/// guard page at the bottom.
struct Stack {
    base: *mut libc::c_void,
    len: usize,
}

impl Stack {
    fn new() -> Result<Stack, Errno> {
        let len = CHILD_STACK + PAGE;
        // SAFETY: anonymous private mapping; checked for MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(Errno::last());
        }
        let stack = Stack { base, len };
        // SAFETY: the first page of the mapping we just made.
        if unsafe { libc::mprotect(base, PAGE, libc::PROT_NONE) } < 0 {
            return Err(Errno::last());
        }
        Ok(stack)
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `new`; the child that
        // used it has exec'd or been reaped (see `Child`'s drop order).
        unsafe {
            libc::munmap(self.base, self.len);
        }
    }
}

/// What the child reads while it sets itself up. Boxed so its address is
/// stable; owned by [`Child`], which outlives the child's setup.
struct Shared {
    plan: ChildPlan,
    arrays: ExecArrays,
    /// The broker's `PR_GET_DUMPABLE`, restored by a `CLONE_VM` child after
    /// its uid change (which marks the shared memory non-dumpable).
    dumpable: usize,
    vm: bool,
}

/// A started child.
///
/// The child may read the plan (and, with `CLONE_VM`, runs on memory of
/// this process) until it execs. So a `Child` that is dropped before it was
/// reaped first kills and reaps it, and only then frees the plan and stack.
pub struct Child {
    pid: libc::pid_t,
    pidfd: OwnedFd,
    reaped: bool,
    // Dropped after the reap in `drop` (fields drop after the body).
    shared: Box<Shared>,
    _stack: Option<Stack>,
}

impl std::fmt::Debug for Child {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Child")
            .field("pid", &self.pid)
            .field("reaped", &self.reaped)
            .field("clone_vm", &self.shared.vm)
            .finish()
    }
}

impl Child {
    /// pid in the caller's pid namespace.
    pub fn pid(&self) -> libc::pid_t {
        self.pid
    }

    /// The pidfd (readable when the child exits).
    pub fn pidfd(&self) -> BorrowedFd<'_> {
        self.pidfd.as_fd()
    }

    /// The plan the child runs.
    pub fn plan(&self) -> &ChildPlan {
        &self.shared.plan
    }

    /// Whether the child shares the broker's memory until exec.
    pub fn clone_vm(&self) -> bool {
        self.shared.vm
    }

    /// SIGKILL (through the pidfd: no pid reuse race). Killing the init of
    /// a pid namespace kills every process in it.
    pub fn kill(&self) -> Result<(), Errno> {
        if self.reaped {
            return Ok(());
        }
        crate::io::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL)
    }

    /// Reap if it has exited (`block` false), or wait for it.
    pub fn wait(&mut self, block: bool) -> Result<Option<crate::io::ExitStatus>, Errno> {
        if self.reaped {
            return Err(Errno::ECHILD);
        }
        let r = crate::io::wait_pidfd(self.pidfd.as_fd(), block)?;
        if r.is_some() {
            self.reaped = true;
        }
        Ok(r)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = crate::io::pidfd_send_signal(self.pidfd.as_fd(), libc::SIGKILL);
            let _ = crate::io::wait_pidfd(self.pidfd.as_fd(), true);
        }
    }
}

/// Whether children share the broker's memory until exec (x86_64; the
/// rest of the architectures use a fork-like clone).
pub const CLONE_VM: bool = cfg!(target_arch = "x86_64");

/// `clone3` with `CLONE_VM` and a new stack: the child calls
/// `entry(arg)` on that stack and never returns.
///
/// # Safety
/// `args` must describe a valid clone3 call whose stack is a mapping that
/// stays alive until the child execs or dies; `entry` must never return.
#[cfg(target_arch = "x86_64")]
unsafe fn clone3_vm(
    args: *mut libc::clone_args,
    entry: unsafe extern "C" fn(*const Shared) -> !,
    arg: *const Shared,
) -> isize {
    let ret: isize;
    // SAFETY: see the function contract. In the child the kernel has set
    // rsp to the new stack; r12/r13 survive the syscall, so the child calls
    // entry(arg) with a fresh frame chain and never comes back here.
    unsafe {
        core::arch::asm!(
            "syscall",
            "test rax, rax",
            "jnz 2f",
            "xor ebp, ebp",
            "mov rdi, r12",
            "call r13",
            "ud2",
            "2:",
            inlateout("rax") libc::SYS_clone3 as isize => ret,
            in("rdi") args,
            in("rsi") std::mem::size_of::<libc::clone_args>(),
            in("r12") arg,
            in("r13") entry,
            lateout("rcx") _,
            lateout("r11") _,
            options(nostack),
        );
    }
    ret
}

/// The child's entry on its own stack.
///
/// # Safety
/// Only called by `clone3_vm` in the new child with a pointer to a live
/// `Shared`.
#[cfg(target_arch = "x86_64")]
unsafe extern "C" fn child_entry(shared: *const Shared) -> ! {
    // SAFETY: the parent keeps `Shared` alive until the child has exec'd or
    // been reaped (see `Child`).
    unsafe {
        let s = &*shared;
        child_main(s)
    }
}

/// Start the child described by `plan`.
///
/// On success the child is waiting on `plan.sync_read` for one byte; the
/// caller writes its uid/gid maps, moves it into cgroups and then writes the
/// byte. The caller keeps the write end open until the child has been
/// reaped: the child checks it after setting its parent-death signal.
///
/// On x86_64 the child is created with `CLONE_VM` on its own stack, like
/// `posix_spawn`: no copy of the broker's page tables and no copy-on-write
/// faults afterwards, so the cost does not grow with the broker's memory.
/// The child then only makes raw system calls (no errno) and writes only to
/// its own stack.
pub fn spawn(plan: ChildPlan) -> Result<Child, Errno> {
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
    // SAFETY: PR_GET_DUMPABLE takes no pointers.
    let dumpable = unsafe { libc::prctl(libc::PR_GET_DUMPABLE, 0, 0, 0, 0) }.max(0) as usize;
    let cgroup_fd = plan.cgroup_fd;
    let namespaces = plan.namespaces;
    let join_net = plan.join_net;
    if join_net.is_some() && namespaces & libc::CLONE_NEWNET as u64 != 0 {
        return Err(Errno::EINVAL);
    }
    // The calling thread enters the pooled network namespace for the clone
    // and leaves it right after (network namespaces are per thread).
    let net_return = match join_net {
        Some(fd) => {
            let own = open_thread_netns()?;
            // SAFETY: setns with a namespace descriptor the caller owns;
            // it changes only this thread's network namespace.
            if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
                return Err(Errno::last());
            }
            Some(NetReturn(own))
        }
        None => None,
    };
    let shared = Box::new(Shared {
        plan,
        arrays,
        dumpable,
        vm: CLONE_VM,
    });
    let stack = if CLONE_VM { Some(Stack::new()?) } else { None };

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
    let mut flags = namespaces | libc::CLONE_PIDFD as u64;
    let mut cgroup = 0u64;
    if let Some(fd) = cgroup_fd {
        flags |= CLONE_INTO_CGROUP;
        cgroup = u64::try_from(fd).map_err(|_| Errno::EBADF)?;
    }
    // SAFETY: clone_args is plain data; zeroed is a valid value.
    let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
    args.pidfd = (&mut pidfd as *mut libc::c_int) as u64;
    args.exit_signal = libc::SIGCHLD as u64;
    args.cgroup = cgroup;
    let shared_ptr: *const Shared = &*shared;
    let rc: isize;
    #[cfg(target_arch = "x86_64")]
    {
        let st = stack.as_ref().ok_or(Errno::EINVAL)?;
        args.flags = flags | libc::CLONE_VM as u64;
        args.stack = st.base as u64;
        args.stack_size = st.len as u64;
        // SAFETY: the stack mapping and `shared` are owned by the `Child`
        // returned below, which reaps the child before freeing them.
        rc = unsafe { clone3_vm(&mut args, child_entry, shared_ptr) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        args.flags = flags;
        // SAFETY: the child only runs child_main (see `clone3_fork`).
        let r = unsafe { clone3_fork(&mut args) };
        if r == 0 {
            // SAFETY: we are the freshly cloned child.
            unsafe { child_main(&*shared_ptr) }
        }
        rc = if r < 0 {
            -(Errno::last_raw() as isize)
        } else {
            r as isize
        };
    }
    drop(net_return);
    // SAFETY: restores the mask saved above.
    unsafe {
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
    }
    if rc < 0 {
        return Err(Errno::from_raw((-rc) as i32));
    }
    let pid = libc::pid_t::try_from(rc).map_err(|_| Errno::EOVERFLOW)?;
    if pidfd < 0 {
        return Err(Errno::EBADF);
    }
    // SAFETY: the kernel returned `pidfd` as a new descriptor owned by nobody
    // else in this process.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    Ok(Child {
        pid,
        pidfd,
        reaped: false,
        shared,
        _stack: stack,
    })
}

/// This thread's own network namespace, to return to on drop.
struct NetReturn(OwnedFd);

impl Drop for NetReturn {
    fn drop(&mut self) {
        // SAFETY: setns with the descriptor of this thread's own network
        // namespace, opened before the thread left it.
        if unsafe { libc::setns(self.0.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
            // Invariant: a thread that could leave its namespace can return
            // to it. If it cannot, this broker thread would go on inside a
            // sandbox's network namespace: stop the process instead.
            eprintln!(
                "cordon: cannot return to the broker's network namespace: {}",
                Errno::last()
            );
            std::process::abort();
        }
    }
}

fn open_thread_netns() -> Result<OwnedFd, Errno> {
    let path = c"/proc/thread-self/ns/net";
    // SAFETY: open with a valid NUL-terminated path; the result is checked.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDONLY | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(Errno::last());
    }
    // SAFETY: `fd` was just returned by open and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A new, empty network namespace (only a loopback device, down), kept
/// alive by the returned descriptor. Made on a short-lived thread, so the
/// caller's own thread never leaves its namespace.
pub fn new_net_namespace() -> Result<OwnedFd, Errno> {
    start_net_namespace(false)?.join().map_err(|_| Errno::EIO)?
}

/// [`new_net_namespace`] without waiting: the namespace is made on its own
/// thread (about a millisecond of kernel work) while the caller goes on.
///
/// With `elsewhere`, the thread is moved off the caller's CPU before it
/// first runs, when another CPU is allowed. A new thread is queued on its
/// creator's CPU and, measured on 6.18, waits there until the creator
/// blocks (~0.9 ms) even while another CPU idles, which would leave nothing
/// overlapped. Setting its affinity from here moves it while it is still
/// only queued, and wakes the other CPU for it; the caller does not give
/// up its own CPU.
pub fn start_net_namespace(
    elsewhere: bool,
) -> Result<std::thread::JoinHandle<Result<OwnedFd, Errno>>, Errno> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    // The thread does not exit before the caller is done with its handle:
    // glibc addresses the thread by its kernel tid, which is 0 (meaning the
    // caller) or another task's once the thread is gone.
    let released = Arc::new(AtomicBool::new(false));
    let held = Arc::clone(&released);
    let handle = std::thread::Builder::new()
        .name("cordon-netns".into())
        .stack_size(64 * 1024)
        .spawn(move || {
            // SAFETY: unshare of the network namespace affects only this
            // thread, which exits right after.
            let made = if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                Err(Errno::last())
            } else {
                open_thread_netns()
            };
            while !held.load(Ordering::Acquire) {
                std::thread::park();
            }
            made
        })
        .map_err(|_| Errno::EAGAIN)?;
    if elsewhere {
        use std::os::unix::thread::JoinHandleExt;
        away_from_caller(handle.as_pthread_t());
    }
    released.store(true, Ordering::Release);
    handle.thread().unpark();
    Ok(handle)
}

/// Restrict `thread` to the caller's allowed CPUs other than the one the
/// caller runs on, if any remain (a hint only: failures are ignored).
fn away_from_caller(thread: libc::pthread_t) {
    // SAFETY: sched_getcpu takes no arguments.
    let cpu = unsafe { libc::sched_getcpu() };
    let Ok(cpu) = usize::try_from(cpu) else {
        return;
    };
    // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: `set` is a valid cpu_set_t of `size` bytes for the kernel to
    // fill; 0 is the calling thread.
    if unsafe { libc::sched_getaffinity(0, size, &mut set) } != 0 {
        return;
    }
    // SAFETY: CPU_ISSET/CPU_CLR/CPU_COUNT only read or write `set`, with
    // `cpu` checked against the set's capacity first; `thread` is alive
    // (it waits for the caller's release before it exits).
    unsafe {
        if cpu >= 8 * size || !libc::CPU_ISSET(cpu, &set) {
            return;
        }
        libc::CPU_CLR(cpu, &mut set);
        if libc::CPU_COUNT(&set) == 0 {
            return;
        }
        libc::pthread_setaffinity_np(thread, size, &set);
    }
}

/// `clone3` without `CLONE_VM` or a new stack: like fork, the child returns
/// here (0) on a copy-on-write copy of the caller's stack.
///
/// # Safety
/// `args` must not ask for shared memory or a stack. In the child, only
/// async-signal-safe work may follow (the broker is multi-threaded).
unsafe fn clone3_fork(args: &mut libc::clone_args) -> libc::c_long {
    // SAFETY: see the function contract; `args` is a valid clone_args of
    // the size passed.
    unsafe {
        libc::syscall(
            libc::SYS_clone3,
            args as *mut libc::clone_args,
            std::mem::size_of::<libc::clone_args>(),
        )
    }
}

/// Whether a child born with `CLONE_INTO_CGROUP` into the cgroup behind
/// `cgroup_fd` survives its birth. On the kernels measured (6.18) the fork
/// path kills such a child at once when the `cgroup.kill` count of the
/// caller's cgroup differs from the target's: a broker living in a cgroup
/// that was once killed through `cgroup.kill` would see every sandbox
/// killed at birth. The child of this test only exits.
pub fn born_into_cgroup_survives(cgroup_fd: BorrowedFd<'_>) -> Result<bool, Errno> {
    // SAFETY: clone_args is plain data; all-zero is a valid start.
    let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
    args.flags = CLONE_INTO_CGROUP;
    args.exit_signal = libc::SIGCHLD as u64;
    args.cgroup = cgroup_fd.as_raw_fd() as u64;
    // SAFETY: the child only calls exit_group (see `clone3_fork`).
    let pid = unsafe { clone3_fork(&mut args) };
    if pid == 0 {
        // SAFETY: the child ends here without running anything else.
        unsafe {
            libc::syscall(libc::SYS_exit_group, 0);
        }
    }
    if pid < 0 {
        return Err(Errno::last());
    }
    let mut status: libc::c_int = 0;
    loop {
        // SAFETY: waits for the child just created; `status` is ours.
        let r = unsafe { libc::waitpid(pid as libc::pid_t, &mut status, 0) };
        if r >= 0 {
            break;
        }
        if Errno::last() != Errno::EINTR {
            return Err(Errno::last());
        }
    }
    Ok(!(libc::WIFSIGNALED(status) && libc::WTERMSIG(status) == libc::SIGKILL))
}

fn zeroed_sigset() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; all-zero is the empty set.
    unsafe { std::mem::zeroed() }
}

/// Write the failure to the error pipe and exit. Never returns. Meant for
/// the cloned child only (it exits the calling process).
#[inline(never)]
fn fail(err_fd: RawFd, step: ChildStep, errno: i32) -> ! {
    let code = step.code().to_ne_bytes();
    let e = errno.to_ne_bytes();
    let buf = [code[0], code[1], code[2], code[3], e[0], e[1], e[2], e[3]];
    // SAFETY: writes 8 bytes from a stack buffer, then exits this process
    // (exit_group of the child only: it is not a thread of the broker).
    unsafe {
        sc!(libc::SYS_write, err_fd, buf.as_ptr(), buf.len());
        exit(127)
    }
}

/// `exit_group(code)`.
///
/// # Safety
/// Child only.
unsafe fn exit(code: i32) -> ! {
    loop {
        // SAFETY: exit_group never returns.
        unsafe {
            sc!(libc::SYS_exit_group, code);
        }
    }
}

macro_rules! check {
    ($err:expr, $step:expr, $rc:expr) => {
        if let Err(e) = ck($rc) {
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
    // SAFETY: valid C string / null pointers for mount(2).
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
                Err(libc::ENOSYS) => remount_keep(target, libc::MS_RDONLY | *flags)?,
                Err(e) => return Err(e),
            }
        }
        Op::Remount { target, flags } => remount_keep(target, *flags)?,
        Op::Mkdir { path, mode } => {
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
                match ck(unsafe { sc!(libc::SYS_write, fd, rest.as_ptr(), rest.len()) }) {
                    Ok(n) => off += n,
                    Err(libc::EINTR) => {}
                    Err(e) => {
                        unsafe { sc!(libc::SYS_close, fd) };
                        return Err(e);
                    }
                }
            }
            unsafe { sc!(libc::SYS_close, fd) };
        }
        Op::Symlink { target, link } => {
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
            ck(unsafe { sc!(libc::SYS_chdir, new_root.as_ptr()) })?;
            ck(unsafe { sc!(libc::SYS_pivot_root, dot.as_ptr(), dot.as_ptr()) })?;
            ck(unsafe { sc!(libc::SYS_umount2, dot.as_ptr(), libc::MNT_DETACH) })?;
            ck(unsafe { sc!(libc::SYS_chdir, c"/".as_ptr()) })?;
        }
        Op::Chdir { path } => {
            ck(unsafe { sc!(libc::SYS_chdir, path.as_ptr()) })?;
        }
        Op::Hostname { name } => {
            let bytes = name.as_bytes();
            ck(unsafe { sc!(libc::SYS_sethostname, bytes.as_ptr(), bytes.len()) })?;
        }
    }
    Ok(())
}

/// Read one byte from `fd`, retrying EINTR; false on EOF or error.
///
/// # Safety
/// Child only.
unsafe fn read_byte(fd: RawFd) -> bool {
    let mut b = [0u8; 1];
    loop {
        // SAFETY: reads one byte into a stack buffer.
        match ck(unsafe { sc!(libc::SYS_read, fd, b.as_mut_ptr(), 1usize) }) {
            Ok(1) => return true,
            Err(libc::EINTR) => {}
            _ => return false,
        }
    }
}

/// The child side. Never returns: it either execs or exits.
///
/// # Safety
/// Must only be called in the child right after clone. Only raw system
/// calls (no errno) on memory owned by `s` or on this stack happen here; no
/// allocation, no locks, no panics, no writes to the broker's memory.
unsafe fn child_main(s: &Shared) -> ! {
    let plan = &s.plan;
    let arrays = &s.arrays;
    // SAFETY (whole function): see the function contract. Every pointer
    // passed below points into `s` or into this stack frame.
    unsafe {
        // 1. Default dispositions for every signal (SIG_IGN survives execve,
        //    e.g. the broker's ignored SIGPIPE). The mask stays full until
        //    right before execve. An all-zero kernel sigaction is SIG_DFL.
        let dfl = [0u64; 4];
        for sig in 1..=64 {
            if sig == libc::SIGKILL || sig == libc::SIGSTOP {
                continue;
            }
            sc!(libc::SYS_rt_sigaction, sig, dfl.as_ptr(), 0usize, 8usize);
        }

        // 1b. Join the cgroups (see `ChildPlan::join_cgroups`) before
        //     anything is allocated.
        for (i, &fd) in plan.join_cgroups.iter().enumerate() {
            let r = sc!(libc::SYS_write, fd, b"0".as_ptr(), 1usize);
            check!(plan.err_write, ChildStep::CgroupJoin(i as u32), r);
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
            let r = sc!(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, 10);
            check!(err_fd, ChildStep::Fds, r);
            if let Some(slot) = high.get_mut(i) {
                *slot = r as RawFd;
            }
        }
        let mut next_free: u32 = 0;
        for (target, &fd) in high.iter().enumerate() {
            if fd < 0 {
                continue;
            }
            let flags = if target == 4 { libc::O_CLOEXEC } else { 0 };
            check!(
                err_fd,
                ChildStep::Fds,
                sc!(libc::SYS_dup3, fd, target, flags)
            );
            if target == 4 {
                err_fd = 4;
            }
            next_free = target as u32 + 1;
        }
        if ck(sc!(libc::SYS_close_range, next_free, u32::MAX, 0)).is_err() {
            // close_range appeared in 5.9; close one by one otherwise.
            for fd in next_free..4096 {
                sc!(libc::SYS_close, fd);
            }
        }
        let has_doors = plan.doors_sock.is_some();

        // 3. Wait for the parent: maps written, cgroups joined. EOF: the
        //    parent went away or gave up; nothing to report to.
        if !read_byte(3) {
            exit(126);
        }

        // 4. Cgroup namespace rooted at the cgroups we are in now.
        if plan.cgroup_ns {
            check!(
                err_fd,
                ChildStep::CgroupNs,
                sc!(libc::SYS_unshare, libc::CLONE_NEWCGROUP)
            );
        }

        // 5. Identity.
        if plan.clear_groups {
            check!(
                err_fd,
                ChildStep::Groups,
                sc!(libc::SYS_setgroups, 0usize, 0usize)
            );
        }
        check!(
            err_fd,
            ChildStep::Gid,
            sc!(libc::SYS_setresgid, plan.gid, plan.gid, plan.gid)
        );
        check!(
            err_fd,
            ChildStep::Uid,
            sc!(libc::SYS_setresuid, plan.uid, plan.uid, plan.uid)
        );
        if s.vm {
            // The uid change marked the memory we share with the broker
            // non-dumpable; give the broker its setting back.
            sc!(libc::SYS_prctl, libc::PR_SET_DUMPABLE, s.dumpable, 0, 0, 0);
        }

        // 6. Die with the broker. Set after the uid change, which clears it;
        //    then make sure the parent did not die before it was set.
        check!(
            err_fd,
            ChildStep::DeathSignal,
            sc!(
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
        let n = sc!(libc::SYS_poll, &mut pfd as *mut libc::pollfd, 1usize, 0);
        if n > 0 && (pfd.revents & libc::POLLHUP) != 0 {
            exit(126);
        }
        sc!(libc::SYS_close, 3);

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
                sc!(
                    libc::SYS_prlimit64,
                    0,
                    res,
                    &lim as *const libc::rlimit64,
                    0usize
                )
            );
        }

        // 10. New session, no controlling terminal.
        check!(err_fd, ChildStep::Setsid, sc!(libc::SYS_setsid));

        // 11. no_new_privs (needed by Landlock and by seccomp without
        //     CAP_SYS_ADMIN).
        check!(
            err_fd,
            ChildStep::NoNewPrivs,
            sc!(libc::SYS_prctl, libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        );

        // 12. Landlock.
        if let Some(ll) = &plan.landlock {
            let attr = LandlockRulesetAttr {
                handled_access_fs: ll.handled_fs,
                handled_access_net: ll.handled_net,
                scoped: ll.scoped,
            };
            let size = ll.attr_size.min(std::mem::size_of::<LandlockRulesetAttr>());
            let rs = sc!(
                libc::SYS_landlock_create_ruleset,
                &attr as *const LandlockRulesetAttr,
                size,
                0u32
            );
            check!(err_fd, ChildStep::LandlockCreate, rs);
            for (i, (path, access)) in ll.rules.iter().enumerate() {
                let fd = sc!(
                    libc::SYS_openat,
                    libc::AT_FDCWD,
                    path.as_ptr(),
                    libc::O_PATH | libc::O_CLOEXEC,
                    0
                );
                check!(err_fd, ChildStep::LandlockRule(i as u32), fd);
                let rule = LandlockPathBeneathAttr {
                    allowed_access: *access,
                    parent_fd: fd as i32,
                };
                let r = sc!(
                    libc::SYS_landlock_add_rule,
                    rs,
                    LANDLOCK_RULE_PATH_BENEATH,
                    &rule as *const LandlockPathBeneathAttr,
                    0u32
                );
                check!(err_fd, ChildStep::LandlockRule(i as u32), r);
                sc!(libc::SYS_close, fd);
            }
            check!(
                err_fd,
                ChildStep::LandlockRestrict,
                sc!(libc::SYS_landlock_restrict_self, rs, 0u32)
            );
            sc!(libc::SYS_close, rs);
        }

        // 13. Capabilities: bounding set, ambient, then all three sets.
        for cap in 0..=plan.cap_last {
            match ck(sc!(libc::SYS_prctl, libc::PR_CAPBSET_DROP, cap, 0, 0, 0)) {
                Ok(_) | Err(libc::EINVAL) => {}
                Err(e) => fail(err_fd, ChildStep::Capabilities, e),
            }
        }
        check!(
            err_fd,
            ChildStep::Capabilities,
            sc!(
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
            sc!(libc::SYS_capset, header.as_mut_ptr(), data.as_ptr())
        );

        // 14. seccomp, last before exec.
        for (i, prog) in arrays.fprogs.iter().enumerate() {
            check!(
                err_fd,
                ChildStep::Seccomp(i as u32),
                sc!(
                    libc::SYS_seccomp,
                    libc::SECCOMP_SET_MODE_FILTER,
                    0,
                    prog as *const libc::sock_fprog
                )
            );
        }

        // 15. Unblock signals (the mask survives execve) and exec.
        let empty = 0u64;
        check!(
            err_fd,
            ChildStep::SignalMask,
            sc!(
                libc::SYS_rt_sigprocmask,
                libc::SIG_SETMASK,
                &empty as *const u64,
                0usize,
                8usize
            )
        );
        let mut saved = libc::ENOENT;
        for path in &plan.exec_paths {
            let r = sc!(
                libc::SYS_execve,
                path.as_ptr(),
                arrays.argv.as_ptr(),
                arrays.envp.as_ptr()
            );
            match ck(r) {
                Err(libc::ENOENT) | Err(libc::ENOTDIR) => {}
                Err(libc::EACCES) => saved = libc::EACCES,
                Err(e) => fail(err_fd, ChildStep::Exec, e),
                Ok(_) => {}
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
        let s = sc!(
            libc::SYS_socket,
            libc::AF_INET,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            0
        );
        check!(err_fd, ChildStep::DoorsLoopback, s);
        let mut ifr: libc::ifreq = std::mem::zeroed();
        for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo\0".iter()) {
            *dst = *src as libc::c_char;
        }
        ifr.ifr_ifru.ifru_flags = (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        check!(
            err_fd,
            ChildStep::DoorsLoopback,
            sc!(
                libc::SYS_ioctl,
                s,
                libc::SIOCSIFFLAGS,
                &ifr as *const libc::ifreq
            )
        );
        sc!(libc::SYS_close, s);

        // Addresses on lo via rtnetlink.
        if !doors.addr_messages.is_empty() {
            let nl = sc!(
                libc::SYS_socket,
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE
            );
            check!(err_fd, ChildStep::DoorsAddress(0), nl);
            for (i, msg) in doors.addr_messages.iter().enumerate() {
                let step = ChildStep::DoorsAddress(i as u32);
                let mut sa: libc::sockaddr_nl = std::mem::zeroed();
                sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
                let n = sc!(
                    libc::SYS_sendto,
                    nl,
                    msg.as_ptr(),
                    msg.len(),
                    0,
                    &sa as *const libc::sockaddr_nl,
                    std::mem::size_of::<libc::sockaddr_nl>()
                );
                check!(err_fd, step, n);
                // The ack: struct nlmsghdr followed by struct nlmsgerr whose
                // first field is the (negative) errno, 0 for success.
                let mut buf = [0u8; 512];
                let n = sc!(
                    libc::SYS_recvfrom,
                    nl,
                    buf.as_mut_ptr(),
                    buf.len(),
                    0,
                    0usize,
                    0usize
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
            sc!(libc::SYS_close, nl);
        }

        // Sockets, sent one per message to the parent over fd 5.
        let one: libc::c_int = 1;
        let one_ptr = &one as *const libc::c_int;
        let int_len = std::mem::size_of::<libc::c_int>();
        for (i, (domain, ty, addr)) in doors.sockets.iter().enumerate() {
            let step = ChildStep::DoorsSocket(i as u32);
            let fd = sc!(libc::SYS_socket, *domain, *ty | libc::SOCK_CLOEXEC, 0);
            check!(err_fd, step, fd);
            sc!(
                libc::SYS_setsockopt,
                fd,
                libc::SOL_SOCKET,
                libc::SO_REUSEADDR,
                one_ptr,
                int_len
            );
            if *domain == libc::AF_INET6 {
                sc!(
                    libc::SYS_setsockopt,
                    fd,
                    libc::IPPROTO_IPV6,
                    libc::IPV6_V6ONLY,
                    one_ptr,
                    int_len
                );
            }
            // IP_FREEBIND: bind to addresses of a local range (e.g.
            // 198.18.0.0/15 on lo) without the exact address configured.
            sc!(
                libc::SYS_setsockopt,
                fd,
                libc::IPPROTO_IP,
                libc::IP_FREEBIND,
                one_ptr,
                int_len
            );
            check!(
                err_fd,
                step,
                sc!(libc::SYS_bind, fd, addr.as_ptr(), addr.len())
            );
            if *ty == libc::SOCK_STREAM {
                check!(err_fd, step, sc!(libc::SYS_listen, fd, 128));
            }
            if let Err(e) = ck(send_fd(5, fd as RawFd)) {
                fail(err_fd, ChildStep::DoorsSend, e);
            }
            sc!(libc::SYS_close, fd);
        }
        // Wait until the parent has handed the sockets over.
        if !read_byte(5) {
            exit(126);
        }
        sc!(libc::SYS_close, 5);
    }
}

/// Send one descriptor with a one-byte payload over a unix socket.
///
/// # Safety
/// Raw sendmsg on stack buffers; child-safe (no allocation, no errno).
unsafe fn send_fd(sock: RawFd, fd: RawFd) -> isize {
    // SAFETY: all pointers refer to this stack frame; CMSG_* compute
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
            return -(libc::EINVAL as isize);
        }
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(cmsg).cast::<RawFd>(), fd);
        sc!(
            libc::SYS_sendmsg,
            sock,
            &msg as *const libc::msghdr,
            libc::MSG_NOSIGNAL
        )
    }
}

/// Receive one descriptor sent by the child. `Ok(None)` at end of stream.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_steps_survive_the_error_pipe() {
        let steps = [
            ChildStep::Fds,
            ChildStep::Sync,
            ChildStep::CgroupNs,
            ChildStep::Exec,
            ChildStep::DoorsSend,
            ChildStep::Op(7),
            ChildStep::Rlimit(3),
            ChildStep::LandlockRule(2),
            ChildStep::Seccomp(1),
            ChildStep::DoorsAddress(4),
            ChildStep::DoorsSocket(5),
            ChildStep::CgroupJoin(2),
        ];
        for step in steps {
            assert_eq!(ChildStep::from_code(step.code()), step);
        }
        assert_eq!(ChildStep::from_code(0x0999), ChildStep::Unknown(0x0999));
    }

    fn own_affinity() -> Vec<usize> {
        // SAFETY: plain data; the kernel fills `set` for this thread.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut set) }, 0);
        (0..8 * size)
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect()
    }

    fn netns_inode(fd: libc::c_int) -> u64 {
        // SAFETY: plain data; fstat fills it for a live descriptor.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
        st.st_ino
    }

    #[test]
    fn a_namespace_made_elsewhere_moves_only_its_own_thread() {
        // The thread is moved off the caller's CPU by tid; the caller must
        // keep every CPU it had, whether the thread succeeds (root) or
        // fails at once (unprivileged: unshare is refused).
        let before = own_affinity();
        let own = open_thread_netns().unwrap();
        for _ in 0..50 {
            let made = start_net_namespace(true).unwrap().join().unwrap();
            assert_eq!(own_affinity(), before, "the caller's CPUs changed");
            match made {
                Ok(fd) => assert_ne!(
                    netns_inode(fd.as_raw_fd()),
                    netns_inode(own.as_raw_fd()),
                    "not a new namespace"
                ),
                Err(e) => assert_eq!(e, Errno::EPERM, "unexpected failure"),
            }
        }
    }
}
