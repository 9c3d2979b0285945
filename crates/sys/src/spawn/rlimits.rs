//! Resource limits, child side: `prlimit64` on the child itself, one
//! `(resource, soft, hard)` after the other.

use super::ChildStep;
use super::plan::ChildPlan;
use super::raw::sc;
use super::step::ErrPipe;

/// The plan's resource limits.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rlimits<'a> {
    limits: &'a [(u32, u64, u64)],
}

impl<'a> Rlimits<'a> {
    pub(super) fn of(plan: &'a ChildPlan) -> Self {
        Rlimits {
            limits: &plan.rlimits,
        }
    }

    /// A failure is [`ChildStep::Rlimit`] with the resource number.
    ///
    /// # Safety
    /// Child only.
    pub(super) unsafe fn install(self, err: ErrPipe) {
        for &(res, soft, hard) in self.limits {
            let lim = libc::rlimit64 {
                rlim_cur: soft,
                rlim_max: hard,
            };
            // SAFETY: prlimit64 on this process (pid 0) reads the rlimit64
            // `lim`, on this stack, and writes nothing (no old limit).
            let r = unsafe {
                sc!(
                    libc::SYS_prlimit64,
                    0,
                    res,
                    &lim as *const libc::rlimit64,
                    0usize
                )
            };
            err.check(ChildStep::Rlimit(res), r);
        }
    }
}
