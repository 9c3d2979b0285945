//! Descriptors, child side: stdio to 0, 1 and 2, the go-ahead pipe to 3,
//! the error pipe to 4 (close-on-exec), the doors socket to 5, every other
//! descriptor (the broker's, including other sandboxes' pipes) closed.

use std::os::fd::RawFd;

use super::ChildStep;
use super::plan::ChildPlan;
use super::raw::{ck, sc};
use super::step::ErrPipe;

/// The descriptors the child keeps, in the order of their final numbers
/// (0..=5); -1 where there is none.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fds {
    srcs: [RawFd; 6],
}

impl Fds {
    pub(super) fn of(plan: &ChildPlan) -> Self {
        Fds {
            srcs: [
                plan.stdin,
                plan.stdout,
                plan.stderr,
                plan.sync_read,
                plan.err_write,
                plan.doors_sock.unwrap_or(-1),
            ],
        }
    }

    /// Move everything we keep above 10, then down to 0..=5, then close
    /// the rest. Returns the error pipe's new place (fd 4). A failure is
    /// [`ChildStep::Fds`].
    ///
    /// # Safety
    /// Child only: it closes descriptors it does not own.
    pub(super) unsafe fn install(self, err: ErrPipe) -> ErrPipe {
        let mut err = err;
        let mut high = [-1 as RawFd; 6];
        for (i, &fd) in self.srcs.iter().enumerate() {
            if fd < 0 {
                continue;
            }
            // SAFETY: fcntl(F_DUPFD_CLOEXEC) takes no pointers; it only
            // adds a descriptor.
            let r = unsafe { sc!(libc::SYS_fcntl, fd, libc::F_DUPFD_CLOEXEC, 10) };
            let r = err.check(ChildStep::Fds, r);
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
            // SAFETY: dup3 takes no pointers; `target` (0..=5) is either
            // free or one of the broker's descriptors, which the child
            // does not use (its own are all above 10 now).
            let r = unsafe { sc!(libc::SYS_dup3, fd, target, flags) };
            err.check(ChildStep::Fds, r);
            if target == 4 {
                err = ErrPipe(4);
            }
            next_free = target as u32 + 1;
        }
        // SAFETY: close_range takes no pointers; it closes the child's
        // copies of descriptors it no longer uses.
        if ck(unsafe { sc!(libc::SYS_close_range, next_free, u32::MAX, 0) }).is_err() {
            // close_range appeared in 5.9; close one by one otherwise.
            for fd in next_free..4096 {
                // SAFETY: close takes no pointers; `fd` is free or the
                // child's copy of a descriptor it no longer uses.
                unsafe { sc!(libc::SYS_close, fd) };
            }
        }
        err
    }
}
