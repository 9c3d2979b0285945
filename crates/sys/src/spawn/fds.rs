//! Descriptors, child side: stdio to 0, 1 and 2, the go-ahead pipe to 3,
//! the error pipe to 4 (close-on-exec), the doors socket to 5, the mount
//! trees of the filesystem program to 6.. (close-on-exec), every other
//! descriptor (the broker's, including other sandboxes' pipes) closed.

use std::os::fd::{AsRawFd, RawFd};

use super::ChildStep;
use super::plan::{ChildPlan, FIRST_TREE_FD, MAX_TREES, Op, Step};
use super::raw::{ck, sc};
use super::step::ErrPipe;

/// The descriptors the child keeps, in the order of their final numbers
/// (0..=5); -1 where there is none.
#[derive(Debug, Clone, Copy)]
pub(super) struct Fds<'a> {
    srcs: [RawFd; 6],
    /// The steps, for their mount trees ([`Op::AttachTree`]).
    steps: &'a [Step],
}

impl<'a> Fds<'a> {
    pub(super) fn of(plan: &'a ChildPlan) -> Self {
        Fds {
            steps: &plan.steps,
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
        // The mount trees, above 10 too (a tree's number may be one of
        // 0..=5), in the order of their slots.
        let mut trees = [-1 as RawFd; MAX_TREES as usize];
        let mut n_trees: u32 = 0;
        for step in self.steps {
            if let Op::AttachTree { tree, slot, .. } = &step.op
                && let Some(place) = trees.get_mut(*slot as usize)
            {
                // SAFETY: fcntl(F_DUPFD_CLOEXEC) takes no pointers; it only
                // adds a descriptor.
                let r =
                    unsafe { sc!(libc::SYS_fcntl, tree.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 10) };
                *place = err.check(ChildStep::Fds, r) as RawFd;
                n_trees = n_trees.max(*slot + 1);
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
        // The trees to FIRST_TREE_FD + slot, closed at exec.
        for (slot, &fd) in trees.iter().take(n_trees as usize).enumerate() {
            if fd < 0 {
                continue;
            }
            // SAFETY: dup3 takes no pointers; the target is above the
            // control descriptors and below the high copies.
            let r = unsafe {
                sc!(
                    libc::SYS_dup3,
                    fd,
                    FIRST_TREE_FD + slot as u32,
                    libc::O_CLOEXEC
                )
            };
            err.check(ChildStep::Fds, r);
        }
        if n_trees > 0 {
            close_from_to(next_free, FIRST_TREE_FD - 1);
            next_free = FIRST_TREE_FD + n_trees;
        }
        close_from_to(next_free, u32::MAX);
        err
    }
}

/// Close the child's descriptors `first..=last` (its copies of ones it no
/// longer uses).
fn close_from_to(first: u32, last: u32) {
    if first > last {
        return;
    }
    // SAFETY: close_range takes no pointers; it closes the child's
    // copies of descriptors it no longer uses.
    if ck(unsafe { sc!(libc::SYS_close_range, first, last, 0) }).is_err() {
        // close_range appeared in 5.9; close one by one otherwise.
        for fd in first..=last.min(4095) {
            // SAFETY: close takes no pointers; `fd` is free or the
            // child's copy of a descriptor it no longer uses.
            unsafe { sc!(libc::SYS_close, fd) };
        }
    }
}
