//! cgroups, child side: joining the cgroups whose files the parent opened
//! (first thing after clone), and the cgroup namespace rooted where the
//! child then is (after the go-ahead).

use std::os::fd::RawFd;

use super::ChildStep;
use super::plan::ChildPlan;
use super::raw::sc;
use super::step::ErrPipe;

/// Move the child into each cgroup by writing `0` to its `tasks` or
/// `cgroup.procs` file (see [`ChildPlan::join_cgroups`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct CgroupJoin<'a> {
    files: &'a [RawFd],
}

impl<'a> CgroupJoin<'a> {
    pub(super) fn of(plan: &'a ChildPlan) -> Self {
        CgroupJoin {
            files: &plan.join_cgroups,
        }
    }

    /// Write `0` to each file in turn; a failure is
    /// [`ChildStep::CgroupJoin`] with the file's index.
    ///
    /// # Safety
    /// Child only: in the broker it would move the calling thread.
    pub(super) unsafe fn install(self, err: ErrPipe) {
        for (i, &fd) in self.files.iter().enumerate() {
            // SAFETY: write(2) reads the one byte of a static string.
            let r = unsafe { sc!(libc::SYS_write, fd, b"0".as_ptr(), 1usize) };
            err.check(ChildStep::CgroupJoin(i as u32), r);
        }
    }
}

/// `unshare(CLONE_NEWCGROUP)`: a cgroup namespace rooted at the cgroups
/// the child is in.
#[derive(Debug, Clone, Copy)]
pub(super) struct CgroupNamespace;

impl CgroupNamespace {
    /// A failure is [`ChildStep::CgroupNs`].
    ///
    /// # Safety
    /// Child only: in the broker it would change the calling thread's
    /// cgroup namespace.
    pub(super) unsafe fn install(self, err: ErrPipe) {
        // SAFETY: unshare takes no pointers; it changes only this process.
        let r = unsafe { sc!(libc::SYS_unshare, libc::CLONE_NEWCGROUP) };
        err.check(ChildStep::CgroupNs, r);
    }
}
