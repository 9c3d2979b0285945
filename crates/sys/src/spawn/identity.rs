//! Identity, child side: supplementary groups cleared (where the parent
//! left `setgroups` allowed), then gid and uid inside the user namespace.

use super::ChildStep;
use super::plan::ChildPlan;
use super::raw::sc;
use super::step::ErrPipe;

/// The child's ids inside its user namespace.
#[derive(Debug, Clone, Copy)]
pub(super) struct Identity {
    clear_groups: bool,
    uid: u32,
    gid: u32,
    /// The broker's `PR_GET_DUMPABLE` to restore after the uid change, for
    /// a child that shares the broker's memory.
    dumpable: Option<usize>,
}

impl Identity {
    /// The ids `plan` asks for; `dumpable`: the broker's
    /// `PR_GET_DUMPABLE` for a child that shares its memory.
    pub(super) fn of(plan: &ChildPlan, dumpable: Option<usize>) -> Self {
        Identity {
            clear_groups: plan.clear_groups,
            uid: plan.uid,
            gid: plan.gid,
            dumpable,
        }
    }

    /// `setgroups(0, NULL)`, `setresgid`, `setresuid` as raw system calls
    /// (glibc's wrappers would signal the broker's other threads, which
    /// the child does not have). Failures are [`ChildStep::Groups`],
    /// [`ChildStep::Gid`] and [`ChildStep::Uid`].
    ///
    /// # Safety
    /// Child only.
    pub(super) unsafe fn install(self, err: ErrPipe) {
        if self.clear_groups {
            // SAFETY: setgroups with size 0 reads no list; it changes only
            // this thread, the whole child.
            let r = unsafe { sc!(libc::SYS_setgroups, 0usize, 0usize) };
            err.check(ChildStep::Groups, r);
        }
        // SAFETY: setresgid takes only integers; it changes only this
        // thread, the whole child.
        let r = unsafe { sc!(libc::SYS_setresgid, self.gid, self.gid, self.gid) };
        err.check(ChildStep::Gid, r);
        // SAFETY: setresuid takes only integers; it changes only this
        // thread, the whole child.
        let r = unsafe { sc!(libc::SYS_setresuid, self.uid, self.uid, self.uid) };
        err.check(ChildStep::Uid, r);
        if let Some(dumpable) = self.dumpable {
            // The uid change marked the memory we share with the broker
            // non-dumpable; give the broker its setting back.
            // SAFETY: prctl(PR_SET_DUMPABLE) takes only integers.
            unsafe { sc!(libc::SYS_prctl, libc::PR_SET_DUMPABLE, dumpable, 0, 0, 0) };
        }
    }
}
