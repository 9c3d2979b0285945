//! The child as a process: the parent's go-ahead and the parent-death
//! signal (both on the go-ahead pipe, fd 3), a new session, and
//! `no_new_privs`.

use super::ChildStep;
use super::raw::{exit, read_byte, sc};
use super::step::ErrPipe;

/// Wait for the parent's go-ahead byte on fd 3; false on EOF (the parent
/// went away or gave up).
///
/// # Safety
/// Child only, after its descriptors are in place.
pub(super) unsafe fn wait_for_go_ahead() -> bool {
    // SAFETY: child only (the function contract).
    unsafe { read_byte(3) }
}

/// `prctl(PR_SET_PDEATHSIG, SIGKILL)`: die with the broker. Set after the
/// uid change, which clears it; then make sure the parent did not die
/// before it was set (the go-ahead pipe, fd 3, hung up), and close fd 3.
#[derive(Debug, Clone, Copy)]
pub(super) struct DeathSignal;

impl DeathSignal {
    /// A failure is [`ChildStep::DeathSignal`]; a parent already gone
    /// exits quietly (nothing to report to).
    ///
    /// # Safety
    /// Child only: it closes fd 3.
    pub(super) unsafe fn install(self, err: ErrPipe) {
        // SAFETY: prctl(PR_SET_PDEATHSIG) takes only integers; it changes
        // only this process.
        let r = unsafe {
            sc!(
                libc::SYS_prctl,
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL,
                0,
                0,
                0
            )
        };
        err.check(ChildStep::DeathSignal, r);
        let mut pfd = libc::pollfd {
            fd: 3,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: poll reads and writes the one pollfd `pfd`, on this stack.
        let n = unsafe { sc!(libc::SYS_poll, &mut pfd as *mut libc::pollfd, 1usize, 0) };
        if n > 0 && (pfd.revents & libc::POLLHUP) != 0 {
            // SAFETY: child only (the function contract).
            unsafe { exit(126) }
        }
        // SAFETY: close takes no pointers; fd 3 is the child's, used no more.
        unsafe { sc!(libc::SYS_close, 3) };
    }
}

/// `setsid`: a new session, no controlling terminal.
#[derive(Debug, Clone, Copy)]
pub(super) struct NewSession;

impl NewSession {
    /// A failure is [`ChildStep::Setsid`].
    ///
    /// # Safety
    /// Child only.
    pub(super) unsafe fn install(self, err: ErrPipe) {
        // SAFETY: setsid takes no arguments; it changes only this process.
        let r = unsafe { sc!(libc::SYS_setsid) };
        err.check(ChildStep::Setsid, r);
    }
}

/// `prctl(PR_SET_NO_NEW_PRIVS, 1)`, needed by Landlock and by seccomp
/// without `CAP_SYS_ADMIN`.
#[derive(Debug, Clone, Copy)]
pub(super) struct NoNewPrivs;

impl NoNewPrivs {
    /// A failure is [`ChildStep::NoNewPrivs`].
    ///
    /// # Safety
    /// Child only: it would bind the broker for good.
    pub(super) unsafe fn install(self, err: ErrPipe) {
        // SAFETY: prctl(PR_SET_NO_NEW_PRIVS) takes only integers; it
        // changes only this process.
        let r = unsafe { sc!(libc::SYS_prctl, libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
        err.check(ChildStep::NoNewPrivs, r);
    }
}
