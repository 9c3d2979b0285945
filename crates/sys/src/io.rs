//! Parent-side descriptor and process helpers: pipes, poll, non-blocking
//! reads and writes, pidfds, and a few kernel feature probes.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;

fn cvt(rc: libc::c_long) -> Result<libc::c_long, Errno> {
    if rc < 0 { Err(Errno::last()) } else { Ok(rc) }
}

fn owned(rc: libc::c_long) -> Result<OwnedFd, Errno> {
    let fd = RawFd::try_from(cvt(rc)?).map_err(|_| Errno::EOVERFLOW)?;
    // SAFETY: the kernel just returned `fd` as a new descriptor that nothing
    // else in this process owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A close-on-exec pipe: (read end, write end).
pub fn pipe() -> Result<(OwnedFd, OwnedFd), Errno> {
    let mut fds = [-1 as libc::c_int; 2];
    // SAFETY: pipe2 writes two descriptors into `fds`.
    let rc = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) };
    if rc < 0 {
        return Err(Errno::last());
    }
    let [r, w] = fds;
    // SAFETY: pipe2 just returned `r` as a new descriptor owned by nobody
    // else.
    let r = unsafe { OwnedFd::from_raw_fd(r) };
    // SAFETY: likewise for `w`.
    let w = unsafe { OwnedFd::from_raw_fd(w) };
    Ok((r, w))
}

/// A close-on-exec `AF_UNIX` `SOCK_SEQPACKET` socket pair.
pub fn seqpacket_pair() -> Result<(OwnedFd, OwnedFd), Errno> {
    let mut fds = [-1 as libc::c_int; 2];
    // SAFETY: socketpair writes two descriptors into `fds`.
    let rc = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if rc < 0 {
        return Err(Errno::last());
    }
    let [a, b] = fds;
    // SAFETY: socketpair just returned `a` as a new descriptor owned by
    // nobody else.
    let a = unsafe { OwnedFd::from_raw_fd(a) };
    // SAFETY: likewise for `b`.
    let b = unsafe { OwnedFd::from_raw_fd(b) };
    Ok((a, b))
}

/// Set or clear `O_NONBLOCK`.
pub fn set_nonblocking(fd: BorrowedFd<'_>, on: bool) -> Result<(), Errno> {
    // SAFETY: fcntl on a descriptor the caller borrows.
    let flags = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) } as libc::c_long)?;
    let flags = flags as libc::c_int;
    let new = if on {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    if new != flags {
        // SAFETY: fcntl(F_SETFL) takes an int, on a descriptor the caller
        // borrows.
        cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, new) } as libc::c_long)?;
    }
    Ok(())
}

/// Grow a pipe's buffer (`F_SETPIPE_SZ`); returns the new size.
pub fn set_pipe_size(fd: BorrowedFd<'_>, size: usize) -> Result<usize, Errno> {
    let size = libc::c_int::try_from(size).map_err(|_| Errno::EINVAL)?;
    // SAFETY: fcntl on a descriptor the caller borrows.
    let rc = cvt(unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETPIPE_SZ, size) } as libc::c_long)?;
    Ok(rc as usize)
}

/// `read(2)` once. `Ok(0)` is end of file.
pub fn read(fd: BorrowedFd<'_>, buf: &mut [u8]) -> Result<usize, Errno> {
    // SAFETY: reads into a buffer the caller lends us, at most its length.
    let n = unsafe { libc::read(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(Errno::last())
    } else {
        Ok(n as usize)
    }
}

/// `write(2)` once.
pub fn write(fd: BorrowedFd<'_>, buf: &[u8]) -> Result<usize, Errno> {
    // SAFETY: writes from a buffer the caller lends us, at most its length.
    let n = unsafe { libc::write(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(Errno::last())
    } else {
        Ok(n as usize)
    }
}

/// One entry for [`poll`].
pub type PollFd = libc::pollfd;

/// `poll(2)`; `timeout_ms` < 0 waits forever. EINTR is returned as is.
pub fn poll(fds: &mut [PollFd], timeout_ms: i32) -> Result<usize, Errno> {
    // SAFETY: the kernel reads and writes `fds.len()` entries of `fds`.
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if n < 0 {
        Err(Errno::last())
    } else {
        Ok(n as usize)
    }
}

/// `pidfd_send_signal(2)`.
pub fn pidfd_send_signal(pidfd: BorrowedFd<'_>, sig: i32) -> Result<(), Errno> {
    // SAFETY: plain syscall on a borrowed pidfd, no pointers (info = NULL).
    cvt(unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            sig,
            std::ptr::null::<libc::siginfo_t>(),
            0u32,
        )
    })?;
    Ok(())
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExitStatus {
    /// `exit(code)`.
    Exited(i32),
    /// Killed by this signal.
    Signaled(i32),
}

/// Reap the process behind `pidfd` (`waitid(P_PIDFD, WEXITED)`). With
/// `block` false, `Ok(None)` means it is still running.
pub fn wait_pidfd(pidfd: BorrowedFd<'_>, block: bool) -> Result<Option<ExitStatus>, Errno> {
    let mut flags = libc::WEXITED;
    if !block {
        flags |= libc::WNOHANG;
    }
    loop {
        // SAFETY: siginfo_t is plain data; zeroed is valid. waitid writes it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: waitid with a valid out pointer and a borrowed pidfd.
        let rc = unsafe {
            libc::waitid(
                libc::P_PIDFD,
                pidfd.as_raw_fd() as libc::id_t,
                &mut info,
                flags,
            )
        };
        if rc < 0 {
            let e = Errno::last();
            if e == Errno::EINTR {
                continue;
            }
            return Err(e);
        }
        // SAFETY: after a successful waitid the pid field is set (0 with
        // WNOHANG means no state change).
        let pid = unsafe { info.si_pid() };
        if pid == 0 {
            return Ok(None);
        }
        // SAFETY: waitid reported a child, so the status field is set.
        let status = unsafe { info.si_status() };
        return Ok(Some(match info.si_code {
            libc::CLD_EXITED => ExitStatus::Exited(status),
            _ => ExitStatus::Signaled(status),
        }));
    }
}

/// Landlock ABI version of the running kernel; 0 when Landlock is missing
/// or disabled.
pub fn landlock_abi() -> i32 {
    // LANDLOCK_CREATE_RULESET_VERSION = 1 << 0.
    // SAFETY: with a NULL attr and size 0 the call only returns the version.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            1u32,
        )
    };
    if v < 0 { 0 } else { v as i32 }
}

/// Whether the kernel has seccomp (`PR_GET_SECCOMP` answers; it fails
/// with EINVAL only without CONFIG_SECCOMP), the fact `/proc/self/status`
/// shows as its `Seccomp:` line, without generating that file.
pub fn seccomp_available() -> bool {
    // SAFETY: PR_GET_SECCOMP takes no further arguments and only reads the
    // calling thread's mode.
    unsafe { libc::prctl(libc::PR_GET_SECCOMP, 0, 0, 0, 0) >= 0 }
}

/// Whether the kernel has `mount_setattr(2)` (Linux 5.12+). Asked with
/// arguments it must refuse (an invalid descriptor, no path, unknown flags,
/// a zero-sized attribute): a kernel that has it answers EINVAL or EBADF
/// without looking at anything, one without it ENOSYS. Any answer but
/// ENOSYS counts as present, as for the sandbox's read-only binds, which
/// fall back to a bind remount on ENOSYS only.
pub fn mount_setattr_available() -> bool {
    // SAFETY: the path and attribute pointers are NULL and the size is 0;
    // the kernel rejects the flags (and the size) before it reads either,
    // and nothing is changed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            -1 as libc::c_int,
            std::ptr::null::<libc::c_char>(),
            libc::c_uint::MAX,
            std::ptr::null::<libc::c_void>(),
            0usize,
        )
    };
    !(rc < 0 && Errno::last() == Errno::ENOSYS)
}

/// Whether the kernel has `close_range(2)` (Linux 5.9+). Asked for the
/// empty range from `u32::MAX` down to 0, which a kernel that has it
/// refuses with EINVAL (first above last) without closing anything; one
/// without it answers ENOSYS. Any answer but ENOSYS counts as present.
pub fn close_range_available() -> bool {
    // SAFETY: integer arguments only; with first > last no descriptor is
    // closed.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_close_range,
            libc::c_uint::MAX,
            0 as libc::c_uint,
            0 as libc::c_uint,
        )
    };
    !(rc < 0 && Errno::last() == Errno::ENOSYS)
}

/// Read a small kernel file (procfs, cgroupfs) through `fd`: reads of up
/// to 4 KiB until end of file, without the size probes a `File` makes
/// (statx and lseek) for files that report size 0 anyway.
pub fn read_small(fd: OwnedFd) -> std::io::Result<String> {
    let mut f = std::fs::File::from(fd);
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match std::io::Read::read(&mut f, &mut buf) {
            Ok(0) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    String::from_utf8(out).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// Effective uid of the calling process.
pub fn geteuid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::geteuid() }
}

/// Effective gid of the calling process.
pub fn getegid() -> u32 {
    // SAFETY: no arguments, cannot fail.
    unsafe { libc::getegid() }
}

/// The hard limit of resource `res` (`RLIMIT_*`) of the calling process:
/// `None` when it is unlimited or cannot be read.
pub fn hard_rlimit(res: u32) -> Option<u64> {
    let mut lim = libc::rlimit64 {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit64 on this process (pid 0) sets nothing (null new
    // limit) and writes the current one into `lim`, on this stack.
    let r = unsafe {
        libc::prlimit64(
            0,
            res as libc::__rlimit_resource_t,
            std::ptr::null(),
            &mut lim,
        )
    };
    (r == 0 && lim.rlim_max != libc::RLIM64_INFINITY).then_some(lim.rlim_max)
}

/// The value of extended attribute `name` of `path` (following symlinks),
/// at most 64 bytes; `None` when it is not set or cannot be read.
pub fn get_xattr(path: &std::path::Path, name: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let p = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let n = std::ffi::CString::new(name).ok()?;
    let mut buf = [0u8; 64];
    // SAFETY: both names are NUL-terminated strings that outlive the call;
    // getxattr writes at most `buf.len()` bytes into `buf`.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    let len = usize::try_from(r).ok()?;
    buf.get(..len).map(<[u8]>::to_vec)
}

/// `uname -r`.
pub fn kernel_release() -> String {
    // SAFETY: utsname is plain data; uname fills it.
    let mut u: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: valid out pointer.
    if unsafe { libc::uname(&mut u) } < 0 {
        return String::new();
    }
    let bytes: Vec<u8> = u
        .release
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Open a directory as an `O_PATH`-less read-only directory descriptor
/// (what `CLONE_INTO_CGROUP` wants).
pub fn open_dir(path: &std::path::Path) -> Result<OwnedFd, Errno> {
    open_directory(path, libc::O_RDONLY)
}

/// An `O_PATH` descriptor of a directory, for [`open_at`]: opening files
/// relative to it skips walking the directory's path again.
pub fn open_path_dir(path: &std::path::Path) -> Result<OwnedFd, Errno> {
    open_directory(path, libc::O_PATH)
}

fn open_directory(path: &std::path::Path, mode: libc::c_int) -> Result<OwnedFd, Errno> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    // SAFETY: valid C string; the result is a new descriptor.
    owned(
        unsafe { libc::open(c.as_ptr(), mode | libc::O_DIRECTORY | libc::O_CLOEXEC) }
            as libc::c_long,
    )
}

/// Open `name` (a single path component) in `dir` for reading or writing.
pub fn open_at(dir: BorrowedFd<'_>, name: &str, write: bool) -> Result<OwnedFd, Errno> {
    let c = std::ffi::CString::new(name).map_err(|_| Errno::EINVAL)?;
    let flags = libc::O_CLOEXEC
        | libc::O_NOFOLLOW
        | if write {
            libc::O_WRONLY | libc::O_TRUNC
        } else {
            libc::O_RDONLY
        };
    // SAFETY: `dir` is a live descriptor and `c` a valid C string; the
    // result is a new descriptor.
    owned(unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags) } as libc::c_long)
}

/// Whether a process with this pid exists (`kill(pid, 0)`; EPERM counts as
/// existing).
pub fn pid_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks existence and permission.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || Errno::last() == Errno::EPERM
}

/// SIGKILL a process by pid (for cleaning leftovers of a dead broker).
///
/// Only one process: 0 and negative pids (the caller's process group,
/// every process, a group) are refused with EINVAL. A cgroup's
/// `cgroup.procs` read from another pid namespace lists each process not
/// visible there as 0; killing that would kill the caller's own group.
pub fn kill_pid(pid: i32) -> Result<(), Errno> {
    if pid <= 0 {
        return Err(Errno::EINVAL);
    }
    // SAFETY: plain kill(2) of one process (pid > 0).
    if unsafe { libc::kill(pid, libc::SIGKILL) } < 0 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// `pidfd_open(2)`: a descriptor naming this one process for as long as
/// it is held, whatever later takes its pid number.
pub fn pidfd_open(pid: i32) -> Result<OwnedFd, Errno> {
    if pid <= 0 {
        return Err(Errno::EINVAL);
    }
    // SAFETY: plain syscall with integer arguments; on success it returns
    // a new descriptor, which `owned` takes.
    owned(unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0u32) })
}

/// SIGKILL the process `pid` if `belongs` accepts its `/proc/PID/cgroup`
/// (a leftover listed in a cgroup's `cgroup.procs`). The process is pinned
/// by a pidfd before its cgroup is read and signalled through it, so a
/// pid freed and taken by another process after the listing is never
/// signalled (pid numbers wrap, at 32768 on some hosts). `Ok(false)`: not
/// one of `belongs`'s. Without pidfds (before Linux 5.3), a plain kill.
pub fn kill_pid_if(pid: i32, belongs: impl Fn(&str) -> bool) -> Result<bool, Errno> {
    let fd = match pidfd_open(pid) {
        Ok(fd) => fd,
        Err(Errno::ENOSYS) => return kill_pid(pid).map(|()| true),
        Err(e) => return Err(e),
    };
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).map_err(|e| {
        e.raw_os_error()
            .map(Errno::from_raw)
            .unwrap_or(Errno::ESRCH)
    })?;
    if !belongs(&text) {
        return Ok(false);
    }
    pidfd_send_signal(std::os::fd::AsFd::as_fd(&fd), libc::SIGKILL)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    /// A process is killed only when its cgroup is the one asked for.
    #[test]
    fn kill_pid_if_asks_the_process_its_cgroup_first() {
        let mut c = std::process::Command::new("/bin/sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = i32::try_from(c.id()).unwrap();
        assert_eq!(super::kill_pid_if(pid, |_| false), Ok(false));
        assert!(super::pid_alive(pid), "killed although not its cgroup");
        let mine = std::fs::read_to_string("/proc/self/cgroup").unwrap();
        assert_eq!(super::kill_pid_if(pid, |t| t == mine), Ok(true));
        let st = c.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&st),
            Some(libc::SIGKILL)
        );
        assert_eq!(super::kill_pid_if(0, |_| true), Err(super::Errno::EINVAL));
    }

    /// Pid 0 is this process's group (the test runner's): refused, never
    /// signalled.
    #[test]
    fn kill_pid_never_signals_a_group() {
        assert_eq!(super::kill_pid(0), Err(super::Errno::EINVAL));
    }

    use super::*;

    /// `(major, minor)` of the running kernel.
    fn kernel() -> (u32, u32) {
        let r = kernel_release();
        let mut it = r.split(|c: char| !c.is_ascii_digit());
        let major = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        let minor = it.next().and_then(|s| s.parse().ok()).unwrap_or(0);
        (major, minor)
    }

    #[test]
    fn feature_probes_match_the_kernel_version() {
        let k = kernel();
        if k >= (5, 12) {
            assert!(mount_setattr_available(), "kernel {k:?}");
        }
        if k >= (5, 9) {
            assert!(close_range_available(), "kernel {k:?}");
        }
    }

    #[test]
    fn close_range_probe_closes_nothing() {
        let (r, w) = pipe().unwrap();
        let _ = close_range_available();
        // Both ends are still open: a write reaches the read end.
        assert_eq!(write(w.as_fd(), b"x"), Ok(1));
        let mut b = [0u8; 1];
        assert_eq!(read(r.as_fd(), &mut b), Ok(1));
    }
}

/// Lower the calling thread's scheduling priority to `nice` (0..=19;
/// Linux keeps a nice value per thread, and processes and threads it
/// starts inherit it). Only ever lowered: an unprivileged thread cannot
/// raise it back.
pub fn nice_this_thread(nice: i32) -> Result<(), Errno> {
    // SAFETY: gettid takes no argument and cannot fail.
    let tid = unsafe { libc::gettid() };
    // SAFETY: setpriority reads its three integer arguments only; the
    // thread id is this thread's own.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice.clamp(0, 19)) };
    if r == -1 {
        return Err(Errno::last());
    }
    Ok(())
}

/// The calling thread's nice value (`/proc/thread-self/stat`, field 19).
pub fn thread_nice() -> Option<i32> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // The command name (field 2) is in parentheses and may hold spaces.
    let after = &stat[stat.rfind(')')? + 2..];
    after.split(' ').nth(16)?.parse().ok()
}

#[cfg(test)]
mod nice_tests {
    #[test]
    fn a_thread_lowers_its_own_priority_and_no_other() {
        let before = super::thread_nice().unwrap();
        let inside = std::thread::spawn(|| {
            super::nice_this_thread(10).unwrap();
            let mine = super::thread_nice().unwrap();
            // What it starts inherits it.
            let child = std::thread::spawn(super::thread_nice).join().unwrap();
            (mine, child)
        })
        .join()
        .unwrap();
        assert_eq!(inside, (10.max(before), Some(10.max(before))));
        assert_eq!(super::thread_nice(), Some(before), "the caller untouched");
    }
}
