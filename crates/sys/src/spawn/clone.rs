//! Parent side of the start: [`spawn`] prepares what the child reads,
//! clones it (`clone3`, with `CLONE_VM` on its own stack on x86_64, fork-like
//! elsewhere) and hands back the [`Child`] that owns all of it until the
//! child is reaped.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use nix::errno::Errno;

use super::exec::Exec;
use super::netns;
use super::plan::ChildPlan;
use super::program::Shared;
use super::seccomp::Seccomp;

/// `CLONE_INTO_CGROUP` (libc's constant has the wrong width).
const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Size of the child's own stack when it shares the broker's memory.
const CHILD_STACK: usize = 256 << 10;
const PAGE: usize = 4096;

/// Whether children share the broker's memory until exec (x86_64; the
/// rest of the architectures use a fork-like clone).
pub const CLONE_VM: bool = cfg!(target_arch = "x86_64");

/// The child's stack (only with `CLONE_VM`): a private mapping with a
/// guard page at the bottom.
struct Stack {
    base: *mut libc::c_void,
    len: usize,
}

impl Stack {
    fn new() -> Result<Stack, Errno> {
        let len = CHILD_STACK + PAGE;
        // SAFETY: an anonymous private mapping at an address of the
        // kernel's choosing: no existing memory is affected. Checked for
        // MAP_FAILED.
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
        // SAFETY: the first page of the mapping we just made, which nothing
        // refers to yet.
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
    // SAFETY: the parent keeps `Shared` alive and unchanged until the child
    // has exec'd or been reaped (see `Child`), so the pointer is valid for
    // a shared borrow for as long as the child runs this code.
    let s = unsafe { &*shared };
    // SAFETY: this is the freshly cloned child, which is what `run` asks.
    unsafe { s.run() }
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
    let seccomp = Seccomp::prepare(&plan.seccomp)?;
    let exec = Exec::prepare(&plan.argv, &plan.envp);
    // SAFETY: PR_GET_DUMPABLE takes no pointers and only reads this
    // process's setting.
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
        Some(fd) => Some(netns::enter(fd)?),
        None => None,
    };
    let shared = Box::new(Shared {
        plan,
        exec,
        seccomp,
        dumpable,
        vm: CLONE_VM,
    });
    let stack = if CLONE_VM { Some(Stack::new()?) } else { None };

    // Block every signal around clone so that no handler of the broker runs
    // in the child before it has reset them; the child unblocks right
    // before execve, the parent right after clone.
    let mut old: libc::sigset_t = zeroed_sigset();
    let mut all: libc::sigset_t = zeroed_sigset();
    // SAFETY: sigfillset writes only into `all`, a sigset_t we own.
    unsafe { libc::sigfillset(&mut all) };
    // SAFETY: pthread_sigmask reads `all` and writes `old`, both ours; it
    // changes only this thread's mask, restored below.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old) };

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
        // returned below, which reaps the child before freeing them;
        // `child_entry` never returns.
        rc = unsafe { clone3_vm(&mut args, child_entry, shared_ptr) };
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        args.flags = flags;
        // SAFETY: no CLONE_VM and no stack in `args`; the child only runs
        // the program (see `clone3_fork`).
        let r = unsafe { clone3_fork(&mut args) };
        if r == 0 {
            // SAFETY: the child's copy of `shared`, which nothing changes.
            let s = unsafe { &*shared_ptr };
            // SAFETY: we are the freshly cloned child.
            unsafe { s.run() }
        }
        rc = if r < 0 {
            -(Errno::last_raw() as isize)
        } else {
            r as isize
        };
    }
    drop(net_return);
    // SAFETY: restores the mask saved above; reads only `old`.
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
    // SAFETY: no CLONE_VM and no stack in `args`; the child only calls
    // exit_group (see `clone3_fork`).
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
