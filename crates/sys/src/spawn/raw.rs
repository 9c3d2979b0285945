//! Raw system calls that never touch `errno`, and the child's few
//! primitives built on them.
//!
//! With `CLONE_VM` the child shares the broker's memory, including the
//! calling thread's TLS, so glibc's `syscall()` (which stores errno there)
//! would overwrite the broker thread's errno. These return `-errno`.

use std::os::fd::RawFd;

/// `syscall(nr, a..f)`, returning the raw kernel result.
///
/// # Safety
/// The arguments must be valid for the system call `nr`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(super) unsafe fn syscall6(
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
pub(super) unsafe fn syscall6(
    nr: libc::c_long,
    a: usize,
    b: usize,
    c: usize,
    d: usize,
    e: usize,
    f: usize,
) -> isize {
    // SAFETY: glibc's syscall(2) passes the arguments on unchanged; the
    // caller vouches for them.
    let r = unsafe { libc::syscall(nr, a, b, c, d, e, f) };
    if r < 0 {
        -(nix::errno::Errno::last_raw() as isize)
    } else {
        r as isize
    }
}

/// `sc!(NR, args...)`: a raw system call with up to six arguments, each
/// cast to `usize`; evaluates to the raw result (`-errno` on failure).
/// Expands to a call of the unsafe [`syscall6`].
macro_rules! sc {
    ($nr:expr) => { $crate::spawn::raw::syscall6($nr, 0, 0, 0, 0, 0, 0) };
    ($nr:expr, $a:expr) => { $crate::spawn::raw::syscall6($nr, $a as usize, 0, 0, 0, 0, 0) };
    ($nr:expr, $a:expr, $b:expr) => {
        $crate::spawn::raw::syscall6($nr, $a as usize, $b as usize, 0, 0, 0, 0)
    };
    ($nr:expr, $a:expr, $b:expr, $c:expr) => {
        $crate::spawn::raw::syscall6($nr, $a as usize, $b as usize, $c as usize, 0, 0, 0)
    };
    ($nr:expr, $a:expr, $b:expr, $c:expr, $d:expr) => {
        $crate::spawn::raw::syscall6($nr, $a as usize, $b as usize, $c as usize, $d as usize, 0, 0)
    };
    ($nr:expr, $a:expr, $b:expr, $c:expr, $d:expr, $e:expr) => {
        $crate::spawn::raw::syscall6(
            $nr, $a as usize, $b as usize, $c as usize, $d as usize, $e as usize, 0,
        )
    };
    ($nr:expr, $a:expr, $b:expr, $c:expr, $d:expr, $e:expr, $f:expr) => {
        $crate::spawn::raw::syscall6(
            $nr, $a as usize, $b as usize, $c as usize, $d as usize, $e as usize, $f as usize,
        )
    };
}
pub(super) use sc;

/// Raw result to `Result` (errno on failure).
#[inline(always)]
pub(super) fn ck(r: isize) -> Result<usize, i32> {
    if r < 0 {
        Err((-r) as i32)
    } else {
        Ok(r as usize)
    }
}

/// `exit_group(code)`.
///
/// # Safety
/// Child only.
pub(super) unsafe fn exit(code: i32) -> ! {
    loop {
        // SAFETY: exit_group takes no pointers and never returns; the
        // caller vouches that this is the child, not the broker.
        unsafe { sc!(libc::SYS_exit_group, code) };
    }
}

/// Read one byte from `fd`, retrying EINTR; false on EOF or error.
///
/// # Safety
/// Child only.
pub(super) unsafe fn read_byte(fd: RawFd) -> bool {
    let mut b = [0u8; 1];
    loop {
        // SAFETY: read(2) writes at most one byte, into `b` on this stack.
        match ck(unsafe { sc!(libc::SYS_read, fd, b.as_mut_ptr(), 1usize) }) {
            Ok(1) => return true,
            Err(libc::EINTR) => {}
            _ => return false,
        }
    }
}
