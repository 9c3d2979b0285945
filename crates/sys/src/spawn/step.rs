//! The error pipe, both ends: which step of the child's program failed
//! ([`ChildStep`]), its code on the wire and its name in error messages, the
//! child's report ([`ErrPipe::fail`]) and the parent's decoding of it
//! ([`ChildFailure::decode`]).

use std::fmt;
use std::os::fd::RawFd;

use nix::errno::Errno;

use super::raw::{ck, exit, sc};

/// Where the child stopped, as reported over the error pipe.
///
/// Its `Display` is the step's name for error messages ("setresuid",
/// "install seccomp filter #1"); a caller that knows more (what setup step
/// `Op(3)` was, which address door socket 2 binds) can say more.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildStep {
    /// Moving the stdio and control descriptors into place.
    Fds,
    /// Waiting for the parent's go-ahead.
    Sync,
    /// `unshare(CLONE_NEWCGROUP)` after the parent moved us into cgroups.
    CgroupNs,
    /// `setgroups(0, NULL)`.
    Groups,
    /// `setresgid`.
    Gid,
    /// `setresuid`.
    Uid,
    /// `prctl(PR_SET_PDEATHSIG)`, or the parent died during setup.
    DeathSignal,
    /// One of the plan's [`Op`](super::Op)s (its index).
    Op(u32),
    /// `setrlimit` (resource number).
    Rlimit(u32),
    /// `setsid`.
    Setsid,
    /// `prctl(PR_SET_NO_NEW_PRIVS)`.
    NoNewPrivs,
    /// Landlock ruleset creation, a rule (index), or `landlock_restrict_self`.
    LandlockCreate,
    /// Adding Landlock rule number N.
    LandlockRule(u32),
    /// `landlock_restrict_self`.
    LandlockRestrict,
    /// Dropping the capability bounding set, ambient or permitted sets.
    Capabilities,
    /// Installing seccomp filter number N.
    Seccomp(u32),
    /// Unblocking signals before exec.
    SignalMask,
    /// `execve` of every candidate path failed.
    Exec,
    /// Network doors: bringing `lo` up.
    DoorsLoopback,
    /// Network doors: adding local address N to `lo`.
    DoorsAddress(u32),
    /// Network doors: creating the listening socket N.
    DoorsSocket(u32),
    /// Network doors: sending the sockets to the parent.
    DoorsSend,
    /// Moving into cgroup number N (a write of `0` to its `tasks` or
    /// `cgroup.procs` file).
    CgroupJoin(u32),
    /// A code this version does not know.
    Unknown(u32),
}

impl ChildStep {
    /// The step's code on the wire.
    pub(super) fn code(self) -> u32 {
        match self {
            ChildStep::Fds => 1,
            ChildStep::Sync => 2,
            ChildStep::CgroupNs => 3,
            ChildStep::Groups => 4,
            ChildStep::Gid => 5,
            ChildStep::Uid => 6,
            ChildStep::DeathSignal => 7,
            ChildStep::Setsid => 8,
            ChildStep::NoNewPrivs => 9,
            ChildStep::LandlockCreate => 10,
            ChildStep::LandlockRestrict => 11,
            ChildStep::Capabilities => 12,
            ChildStep::SignalMask => 13,
            ChildStep::Exec => 14,
            ChildStep::DoorsLoopback => 15,
            ChildStep::DoorsSend => 16,
            ChildStep::Op(i) => 0x1000_0000 | (i & 0xff_ffff),
            ChildStep::Rlimit(i) => 0x2000_0000 | (i & 0xff_ffff),
            ChildStep::LandlockRule(i) => 0x3000_0000 | (i & 0xff_ffff),
            ChildStep::Seccomp(i) => 0x4000_0000 | (i & 0xff_ffff),
            ChildStep::DoorsAddress(i) => 0x5000_0000 | (i & 0xff_ffff),
            ChildStep::DoorsSocket(i) => 0x6000_0000 | (i & 0xff_ffff),
            ChildStep::CgroupJoin(i) => 0x7000_0000 | (i & 0xff_ffff),
            ChildStep::Unknown(c) => c,
        }
    }

    /// The step behind a code read from the wire.
    fn from_code(c: u32) -> ChildStep {
        let low = c & 0xff_ffff;
        match c >> 28 {
            1 => return ChildStep::Op(low),
            2 => return ChildStep::Rlimit(low),
            3 => return ChildStep::LandlockRule(low),
            4 => return ChildStep::Seccomp(low),
            5 => return ChildStep::DoorsAddress(low),
            6 => return ChildStep::DoorsSocket(low),
            7 => return ChildStep::CgroupJoin(low),
            _ => {}
        }
        match c {
            1 => ChildStep::Fds,
            2 => ChildStep::Sync,
            3 => ChildStep::CgroupNs,
            4 => ChildStep::Groups,
            5 => ChildStep::Gid,
            6 => ChildStep::Uid,
            7 => ChildStep::DeathSignal,
            8 => ChildStep::Setsid,
            9 => ChildStep::NoNewPrivs,
            10 => ChildStep::LandlockCreate,
            11 => ChildStep::LandlockRestrict,
            12 => ChildStep::Capabilities,
            13 => ChildStep::SignalMask,
            14 => ChildStep::Exec,
            15 => ChildStep::DoorsLoopback,
            16 => ChildStep::DoorsSend,
            other => ChildStep::Unknown(other),
        }
    }
}

impl fmt::Display for ChildStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Grouped by the file whose `install` reports the step, in the
        // order the program runs them.
        match *self {
            // fds
            ChildStep::Fds => f.write_str("set up stdio descriptors"),
            // process
            ChildStep::Sync => f.write_str("wait for the broker"),
            ChildStep::DeathSignal => f.write_str("prctl PR_SET_PDEATHSIG"),
            ChildStep::Setsid => f.write_str("setsid"),
            ChildStep::NoNewPrivs => f.write_str("prctl PR_SET_NO_NEW_PRIVS"),
            // cgroup
            ChildStep::CgroupJoin(i) => write!(f, "join cgroup #{i}"),
            ChildStep::CgroupNs => f.write_str("unshare cgroup namespace"),
            // identity
            ChildStep::Groups => f.write_str("setgroups"),
            ChildStep::Gid => f.write_str("setresgid"),
            ChildStep::Uid => f.write_str("setresuid"),
            // mounts
            ChildStep::Op(i) => write!(f, "setup step {i}"),
            // doors
            ChildStep::DoorsLoopback => f.write_str("bring lo up"),
            ChildStep::DoorsAddress(i) => write!(f, "add address #{i} to lo"),
            ChildStep::DoorsSocket(i) => write!(f, "door socket #{i}"),
            ChildStep::DoorsSend => f.write_str("send door sockets to the broker"),
            // rlimits
            ChildStep::Rlimit(r) => write!(f, "setrlimit {}", Resource(r)),
            // landlock
            ChildStep::LandlockCreate => f.write_str("landlock_create_ruleset"),
            ChildStep::LandlockRule(i) => write!(f, "landlock_add_rule #{i}"),
            ChildStep::LandlockRestrict => f.write_str("landlock_restrict_self"),
            // capabilities
            ChildStep::Capabilities => f.write_str("drop capabilities"),
            // seccomp
            ChildStep::Seccomp(i) => write!(f, "install seccomp filter #{i}"),
            // signals
            ChildStep::SignalMask => f.write_str("unblock signals"),
            // exec
            ChildStep::Exec => f.write_str("execve"),
            ChildStep::Unknown(c) => write!(f, "unknown step {c:#x}"),
        }
    }
}

/// A setup failure reported by the child.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChildFailure {
    /// The step that failed.
    pub step: ChildStep,
    /// The errno the kernel returned.
    pub errno: Errno,
}

impl ChildFailure {
    /// Decode the eight bytes the child wrote to the error pipe.
    pub fn decode(buf: [u8; 8]) -> ChildFailure {
        let [a, b, c, d, e, f, g, h] = buf;
        ChildFailure {
            step: ChildStep::from_code(u32::from_ne_bytes([a, b, c, d])),
            errno: Errno::from_raw(i32::from_ne_bytes([e, f, g, h])),
        }
    }
}

/// The child's end of the error pipe: the plan's `err_write` until the
/// descriptors are moved, fd 4 after.
#[derive(Debug, Clone, Copy)]
pub(super) struct ErrPipe(pub(super) RawFd);

impl ErrPipe {
    /// Write `(step, errno)` to the error pipe and exit. Never returns.
    /// Meant for the cloned child only (it exits the calling process).
    #[inline(never)]
    pub(super) fn fail(self, step: ChildStep, errno: i32) -> ! {
        let code = step.code().to_ne_bytes();
        let e = errno.to_ne_bytes();
        let buf = [code[0], code[1], code[2], code[3], e[0], e[1], e[2], e[3]];
        // SAFETY: write(2) reads the 8 bytes of `buf`, on this stack; it
        // touches no other memory.
        unsafe { sc!(libc::SYS_write, self.0, buf.as_ptr(), buf.len()) };
        // SAFETY: exit_group of the child only: it is not a thread of the
        // broker, so nothing of the broker is cut short.
        unsafe { exit(127) }
    }

    /// `r`'s value, or [`fail`](Self::fail) with `step` and its errno.
    #[inline(always)]
    pub(super) fn check(self, step: ChildStep, r: isize) -> usize {
        match ck(r) {
            Ok(v) => v,
            Err(e) => self.fail(step, e),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn child_steps_survive_the_error_pipe() {
        let steps = [
            ChildStep::Fds,
            ChildStep::Sync,
            ChildStep::CgroupNs,
            ChildStep::Exec,
            ChildStep::DoorsSend,
            ChildStep::Op(7),
            ChildStep::Rlimit(3),
            ChildStep::LandlockRule(2),
            ChildStep::Seccomp(1),
            ChildStep::DoorsAddress(4),
            ChildStep::DoorsSocket(5),
            ChildStep::CgroupJoin(2),
        ];
        for step in steps {
            assert_eq!(ChildStep::from_code(step.code()), step);
        }
        assert_eq!(ChildStep::from_code(0x0999), ChildStep::Unknown(0x0999));
    }

    #[test]
    fn child_steps_have_names() {
        let named = [
            (ChildStep::Fds, "set up stdio descriptors"),
            (ChildStep::Sync, "wait for the broker"),
            (ChildStep::CgroupJoin(1), "join cgroup #1"),
            (ChildStep::CgroupNs, "unshare cgroup namespace"),
            (ChildStep::Groups, "setgroups"),
            (ChildStep::Gid, "setresgid"),
            (ChildStep::Uid, "setresuid"),
            (ChildStep::DeathSignal, "prctl PR_SET_PDEATHSIG"),
            (ChildStep::Op(3), "setup step 3"),
            (ChildStep::DoorsLoopback, "bring lo up"),
            (ChildStep::DoorsAddress(0), "add address #0 to lo"),
            (ChildStep::DoorsSocket(2), "door socket #2"),
            (ChildStep::DoorsSend, "send door sockets to the broker"),
            (
                ChildStep::Rlimit(libc::RLIMIT_NOFILE),
                "setrlimit RLIMIT_NOFILE",
            ),
            (ChildStep::Rlimit(99), "setrlimit resource 99"),
            (ChildStep::Setsid, "setsid"),
            (ChildStep::NoNewPrivs, "prctl PR_SET_NO_NEW_PRIVS"),
            (ChildStep::LandlockCreate, "landlock_create_ruleset"),
            (ChildStep::LandlockRule(4), "landlock_add_rule #4"),
            (ChildStep::LandlockRestrict, "landlock_restrict_self"),
            (ChildStep::Capabilities, "drop capabilities"),
            (ChildStep::Seccomp(1), "install seccomp filter #1"),
            (ChildStep::SignalMask, "unblock signals"),
            (ChildStep::Exec, "execve"),
            (ChildStep::Unknown(0x999), "unknown step 0x999"),
        ];
        for (step, name) in named {
            assert_eq!(step.to_string(), name);
        }
    }
}
