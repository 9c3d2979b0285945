//! Capabilities, child side: every capability dropped from the bounding
//! set, the ambient set cleared, then the effective, permitted and
//! inheritable sets emptied.

use super::ChildStep;
use super::plan::ChildPlan;
use super::raw::{ck, sc};
use super::step::ErrPipe;

/// `_LINUX_CAPABILITY_VERSION_3`.
const CAPABILITY_VERSION_3: u32 = 0x2008_0522;

/// Every capability up to `last` (`/proc/sys/kernel/cap_last_cap`) dropped.
#[derive(Debug, Clone, Copy)]
pub(super) struct Capabilities {
    last: u32,
}

impl Capabilities {
    pub(super) fn of(plan: &ChildPlan) -> Self {
        Capabilities {
            last: plan.cap_last,
        }
    }

    /// A failure is [`ChildStep::Capabilities`]; a capability the kernel
    /// does not know (EINVAL from `PR_CAPBSET_DROP`) is skipped.
    ///
    /// # Safety
    /// Child only.
    pub(super) unsafe fn install(self, err: ErrPipe) {
        for cap in 0..=self.last {
            // SAFETY: prctl(PR_CAPBSET_DROP) takes only integers; it
            // changes only this process.
            match ck(unsafe { sc!(libc::SYS_prctl, libc::PR_CAPBSET_DROP, cap, 0, 0, 0) }) {
                Ok(_) | Err(libc::EINVAL) => {}
                Err(e) => err.fail(ChildStep::Capabilities, e),
            }
        }
        // SAFETY: prctl(PR_CAP_AMBIENT) takes only integers; it changes
        // only this process.
        let r = unsafe {
            sc!(
                libc::SYS_prctl,
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0
            )
        };
        err.check(ChildStep::Capabilities, r);
        // Version 3 with two zeroed data structs.
        let mut header: [u32; 2] = [CAPABILITY_VERSION_3, 0];
        let data = [0u32; 6];
        // SAFETY: capset reads (and may write the version into) the 8-byte
        // header `header` and reads the two 12-byte structs of `data`, all
        // on this stack.
        let r = unsafe { sc!(libc::SYS_capset, header.as_mut_ptr(), data.as_ptr()) };
        err.check(ChildStep::Capabilities, r);
    }
}
