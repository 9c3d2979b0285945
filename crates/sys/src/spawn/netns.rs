//! Network namespaces, parent side: new empty ones made on a short-lived
//! thread (for the jail's pool), and the calling thread's visit to a
//! pooled one for the length of a `clone3` ([`enter`]).

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;

/// This thread's own network namespace, to return to on drop.
pub(super) struct NetReturn(OwnedFd);

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

/// Move the calling thread into the network namespace behind `fd` (which
/// the caller owns) until the returned value is dropped.
pub(super) fn enter(fd: RawFd) -> Result<NetReturn, Errno> {
    let own = open_thread_netns()?;
    // SAFETY: setns with a namespace descriptor the caller owns; it
    // changes only this thread's network namespace.
    if unsafe { libc::setns(fd, libc::CLONE_NEWNET) } != 0 {
        return Err(Errno::last());
    }
    Ok(NetReturn(own))
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
    if cpu >= 8 * size {
        return;
    }
    // SAFETY: CPU_ISSET only reads `set`, at bit `cpu`, which is within
    // the set's capacity (checked above).
    if !unsafe { libc::CPU_ISSET(cpu, &set) } {
        return;
    }
    // SAFETY: CPU_CLR only writes `set`, at bit `cpu`, which is within the
    // set's capacity (checked above).
    unsafe { libc::CPU_CLR(cpu, &mut set) };
    // SAFETY: CPU_COUNT only reads `set`.
    if unsafe { libc::CPU_COUNT(&set) } == 0 {
        return;
    }
    // SAFETY: `thread` is alive (it waits for the caller's release before
    // it exits); the call only reads the `size` bytes of `set`.
    unsafe { libc::pthread_setaffinity_np(thread, size, &set) };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn own_affinity() -> Vec<usize> {
        // SAFETY: cpu_set_t is plain data; all-zero is the empty set.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        let size = std::mem::size_of::<libc::cpu_set_t>();
        // SAFETY: the kernel fills `set`, `size` bytes, for this thread.
        assert_eq!(unsafe { libc::sched_getaffinity(0, size, &mut set) }, 0);
        (0..8 * size)
            // SAFETY: reads bit `c` of `set`, within its capacity.
            .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
            .collect()
    }

    fn netns_inode(fd: libc::c_int) -> u64 {
        // SAFETY: libc::stat is plain data; all-zero is valid.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fstat fills `st` for a live descriptor.
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
