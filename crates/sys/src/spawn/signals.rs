//! Signals in the child: every disposition back to the default first
//! thing, and the mask (full since before clone, see
//! [`spawn`](super::spawn)) cleared last before exec.

use super::ChildStep;
use super::raw::sc;
use super::step::ErrPipe;

/// Default dispositions for every signal (SIG_IGN survives execve, e.g. the
/// broker's ignored SIGPIPE). An all-zero kernel sigaction is SIG_DFL.
///
/// # Safety
/// Child only: in the broker it would drop every handler of the process.
pub(super) unsafe fn reset_dispositions() {
    let dfl = [0u64; 4];
    for sig in 1..=64 {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: rt_sigaction reads the 32 bytes of `dfl` (a kernel
        // sigaction: SIG_DFL, no flags, empty mask), on this stack, and
        // writes nothing (no old action); 8 is the kernel's sigset size.
        unsafe { sc!(libc::SYS_rt_sigaction, sig, dfl.as_ptr(), 0usize, 8usize) };
    }
}

/// Unblock every signal; the mask survives execve.
///
/// # Safety
/// Child only: the broker's mask is its own.
pub(super) unsafe fn unblock_all(err: ErrPipe) {
    let empty = 0u64;
    // SAFETY: rt_sigprocmask reads the 8-byte empty set `empty`, on this
    // stack, and writes nothing (no old set).
    let r = unsafe {
        sc!(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &empty as *const u64,
            0usize,
            8usize
        )
    };
    err.check(ChildStep::SignalMask, r);
}
