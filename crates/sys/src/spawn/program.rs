//! The child's program: what it reads ([`Shared`]) and the ordered steps it
//! runs between `clone` and `execve` ([`Shared::run`]).
//!
//! Each step is one mechanism's `install`, on a small value: prepared in
//! the parent and kept in [`Shared`] (the seccomp programs, the exec
//! arrays), or a view of the plan built on the child's stack, which copies
//! a few words and allocates nothing. A step that fails reports itself over
//! the error pipe and exits, so `run` reads as the list of what happens, in
//! order.

use super::capabilities::Capabilities;
use super::cgroup::{CgroupJoin, CgroupNamespace};
use super::doors::Doors;
use super::exec::Exec;
use super::fds::Fds;
use super::identity::Identity;
use super::landlock::Landlock;
use super::mounts::Mounts;
use super::plan::ChildPlan;
use super::process;
use super::raw::exit;
use super::rlimits::Rlimits;
use super::seccomp::Seccomp;
use super::signals;
use super::step::ErrPipe;

/// What the child reads while it sets itself up: the plan and what the
/// parent derived from it. Boxed so its address is stable; owned by
/// [`Child`](super::Child), which outlives the child's setup.
pub(super) struct Shared {
    pub(super) plan: ChildPlan,
    /// argv and envp as the pointer arrays `execve` takes.
    pub(super) exec: Exec,
    /// The seccomp filters as the `sock_fprog`s `seccomp` takes.
    pub(super) seccomp: Seccomp,
    /// The broker's `PR_GET_DUMPABLE`, restored by a `CLONE_VM` child after
    /// its uid change (which marks the shared memory non-dumpable).
    pub(super) dumpable: usize,
    /// Whether the child shares the broker's memory ([`CLONE_VM`](super::CLONE_VM)).
    pub(super) vm: bool,
}

impl Shared {
    /// The child side. Never returns: it either execs or exits.
    ///
    /// # Safety
    /// Must only be called in the child right after clone. Only raw system
    /// calls (no errno) on memory owned by `self` or on the child's stack
    /// happen here; no allocation, no locks, no panics, no writes to the
    /// broker's memory.
    pub(super) unsafe fn run(&self) -> ! {
        let plan = &self.plan;
        // Every step below is an unsafe fn whose contract is "child only";
        // `run`'s own contract makes that hold, and the values the steps
        // get borrow from `self`, which stays alive and unchanged until the
        // child execs or is reaped.

        // 1. Default dispositions for every signal. The mask stays full
        //    until right before execve.
        // SAFETY: child only (see above).
        unsafe { signals::reset_dispositions() };

        // 1b. Join the cgroups (see `ChildPlan::join_cgroups`) before
        //     anything is allocated.
        let err = ErrPipe(plan.err_write);
        // SAFETY: child only; the files are the parent's open descriptors.
        unsafe { CgroupJoin::of(plan).install(err) };

        // 2. Descriptors: stdio and the control descriptors to 0..=5, the
        //    rest closed. The error pipe is fd 4 from here on.
        // SAFETY: child only: the broker's other descriptors it closes are
        // the child's copies, which nothing in the child uses.
        let err = unsafe { Fds::of(plan).install(err) };
        let has_doors = plan.doors_sock.is_some();

        // 3. Wait for the parent: maps written, cgroups joined. EOF: the
        //    parent went away or gave up; nothing to report to.
        // SAFETY: child only; fd 3 is the go-ahead pipe since step 2.
        if !unsafe { process::wait_for_go_ahead() } {
            // SAFETY: child only.
            unsafe { exit(126) }
        }

        // 4. Cgroup namespace rooted at the cgroups we are in now.
        if plan.cgroup_ns {
            // SAFETY: child only.
            unsafe { CgroupNamespace.install(err) };
        }

        // 5. Identity.
        // SAFETY: child only.
        unsafe { Identity::of(&self.plan, self.vm.then_some(self.dumpable)).install(err) };

        // 6. Die with the broker.
        // SAFETY: child only; fd 3 is still the go-ahead pipe.
        unsafe { process::DeathSignal.install(err) };

        // 7. The filesystem program.
        // SAFETY: child only.
        unsafe { Mounts::of(plan).install(err) };

        // 8. Network doors.
        if let Some(doors) = &plan.doors
            && has_doors
        {
            // SAFETY: child only; fd 5 is the doors socket since step 2.
            unsafe { Doors::of(doors).install(err) };
        }

        // 9. Resource limits.
        // SAFETY: child only.
        unsafe { Rlimits::of(plan).install(err) };

        // 10. New session, no controlling terminal.
        // SAFETY: child only.
        unsafe { process::NewSession.install(err) };

        // 11. no_new_privs (needed by Landlock and by seccomp without
        //     CAP_SYS_ADMIN).
        // SAFETY: child only.
        unsafe { process::NoNewPrivs.install(err) };

        // 12. Landlock.
        if let Some(ll) = &plan.landlock {
            // SAFETY: child only.
            unsafe { Landlock::of(ll).install(err) };
        }

        // 13. Capabilities: bounding set, ambient, then all three sets.
        //     A supervisor that builds its own sandbox keeps them (see
        //     `ChildPlan::keep_capabilities`).
        if !plan.keep_capabilities {
            // SAFETY: child only.
            unsafe { Capabilities::of(plan).install(err) };
        }

        // 14. seccomp, last before exec.
        // SAFETY: child only; the filters point into `plan.seccomp`.
        unsafe { self.seccomp.install(err) };

        // 15. Unblock signals (the mask survives execve) and exec.
        // SAFETY: child only.
        unsafe { signals::unblock_all(err) };
        // SAFETY: child only; the pointer arrays point into `plan.argv`
        // and `plan.envp`.
        unsafe { self.exec.install(&plan.exec_paths, err) }
    }
}
