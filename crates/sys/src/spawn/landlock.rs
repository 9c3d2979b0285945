//! Landlock, child side: the ruleset the parent worked out for this
//! kernel's ABI created, one path-beneath rule added per path (opened
//! `O_PATH` inside the new root), then enforced on the child.

use super::ChildStep;
use super::plan::LandlockPlan;
use super::raw::sc;
use super::step::ErrPipe;

/// `struct landlock_ruleset_attr` (ABI 6 layout).
#[repr(C)]
struct LandlockRulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

/// `struct landlock_path_beneath_attr` (packed in the uapi header).
#[repr(C, packed)]
struct LandlockPathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

const LANDLOCK_RULE_PATH_BENEATH: usize = 1;

/// The plan's Landlock ruleset.
#[derive(Debug, Clone, Copy)]
pub(super) struct Landlock<'a> {
    plan: &'a LandlockPlan,
}

impl<'a> Landlock<'a> {
    pub(super) fn of(plan: &'a LandlockPlan) -> Self {
        Landlock { plan }
    }

    /// Failures are [`ChildStep::LandlockCreate`],
    /// [`ChildStep::LandlockRule`] (with the rule's index) and
    /// [`ChildStep::LandlockRestrict`].
    ///
    /// # Safety
    /// Child only, after `no_new_privs`.
    pub(super) unsafe fn install(self, err: ErrPipe) {
        let ll = self.plan;
        let attr = LandlockRulesetAttr {
            handled_access_fs: ll.handled_fs,
            handled_access_net: ll.handled_net,
            scoped: ll.scoped,
        };
        let size = ll.attr_size.min(std::mem::size_of::<LandlockRulesetAttr>());
        // SAFETY: landlock_create_ruleset reads the first `size` bytes of
        // `attr`, on this stack (never more than its size); the descriptor
        // it returns is new and ours.
        let rs = unsafe {
            sc!(
                libc::SYS_landlock_create_ruleset,
                &attr as *const LandlockRulesetAttr,
                size,
                0u32
            )
        };
        err.check(ChildStep::LandlockCreate, rs);
        for (i, (path, access)) in ll.rules.iter().enumerate() {
            // SAFETY: openat reads the C string `path`, built by the
            // parent; the descriptor it returns is new and ours.
            let fd = unsafe {
                sc!(
                    libc::SYS_openat,
                    libc::AT_FDCWD,
                    path.as_ptr(),
                    libc::O_PATH | libc::O_CLOEXEC,
                    0
                )
            };
            err.check(ChildStep::LandlockRule(i as u32), fd);
            let rule = LandlockPathBeneathAttr {
                allowed_access: *access,
                parent_fd: fd as i32,
            };
            // SAFETY: landlock_add_rule reads the packed path-beneath
            // attribute `rule`, on this stack.
            let r = unsafe {
                sc!(
                    libc::SYS_landlock_add_rule,
                    rs,
                    LANDLOCK_RULE_PATH_BENEATH,
                    &rule as *const LandlockPathBeneathAttr,
                    0u32
                )
            };
            err.check(ChildStep::LandlockRule(i as u32), r);
            // SAFETY: closes `fd`, opened above and used no more.
            unsafe { sc!(libc::SYS_close, fd) };
        }
        // SAFETY: landlock_restrict_self takes no pointers; it restricts
        // only this process.
        let r = unsafe { sc!(libc::SYS_landlock_restrict_self, rs, 0u32) };
        err.check(ChildStep::LandlockRestrict, r);
        // SAFETY: closes `rs`, created above and used no more.
        unsafe { sc!(libc::SYS_close, rs) };
    }
}
