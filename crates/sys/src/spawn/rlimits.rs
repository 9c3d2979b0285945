//! Resource limits, child side: `prlimit64` on the child itself, one
//! `(resource, soft, hard)` after the other.

use std::fmt;

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

/// A resource number (`RLIMIT_*`), shown by its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Resource(pub(super) u32);

impl fmt::Display for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self.0 {
            libc::RLIMIT_CPU => "RLIMIT_CPU",
            libc::RLIMIT_FSIZE => "RLIMIT_FSIZE",
            libc::RLIMIT_DATA => "RLIMIT_DATA",
            libc::RLIMIT_STACK => "RLIMIT_STACK",
            libc::RLIMIT_CORE => "RLIMIT_CORE",
            libc::RLIMIT_RSS => "RLIMIT_RSS",
            libc::RLIMIT_NPROC => "RLIMIT_NPROC",
            libc::RLIMIT_NOFILE => "RLIMIT_NOFILE",
            libc::RLIMIT_MEMLOCK => "RLIMIT_MEMLOCK",
            libc::RLIMIT_AS => "RLIMIT_AS",
            libc::RLIMIT_LOCKS => "RLIMIT_LOCKS",
            libc::RLIMIT_SIGPENDING => "RLIMIT_SIGPENDING",
            libc::RLIMIT_MSGQUEUE => "RLIMIT_MSGQUEUE",
            libc::RLIMIT_NICE => "RLIMIT_NICE",
            libc::RLIMIT_RTPRIO => "RLIMIT_RTPRIO",
            libc::RLIMIT_RTTIME => "RLIMIT_RTTIME",
            other => return write!(f, "resource {other}"),
        };
        f.write_str(name)
    }
}
