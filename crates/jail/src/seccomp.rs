//! The seccomp filters of the jail: every list lives in this file.
//!
//! Filters are compiled with `seccompiler` in the broker (never in the
//! child), cached per mode, and installed in the child as the last step
//! before `execve`.
//!
//! **Deny list mode: one filter**, [`deny_tree`]:
//!
//! 1. the architecture check (foreign arch, e.g. `int 0x80` i386 calls:
//!    `KILL_PROCESS`);
//! 2. the x32 guard (x86_64): a syscall number with the x32 bit
//!    (`nr >= 0x4000_0000`) gets `EPERM`. Without it a deny list keyed on
//!    x86_64 numbers is bypassable on kernels built with x32;
//! 3. a binary decision tree over the table below: about log2(n) + 4
//!    comparisons per syscall instead of a linear chain of n. The kernel
//!    also evaluates every filter for every syscall number when it is
//!    installed (its action cache), so a short path matters per call.
//!
//! The same decisions are compiled by `seccompiler` ([`deny_filter`], with
//! the x32/clone3 prologue spliced after its arch check); a unit test runs
//! both programs through a BPF interpreter for every syscall number and a
//! grid of argument values and requires identical answers.
//!
//! **Allow list mode: two filters**, the allow list (default `EPERM`,
//! `ALLOW` for [`ALLOW_BASE`] plus the tool's extra names) and the deny
//! filter above, so argument checks (clone flags, socket families, ioctl
//! requests) and the x32/clone3 prologue still apply. The kernel runs every
//! filter and keeps the most restrictive answer; for two `ERRNO` answers
//! the filter installed last wins, so the deny filter (with the `ENOSYS`
//! for clone3) is installed last.
//!
//! ## Deny list (default `ALLOW`, these return `EPERM`)
//!
//! | syscall(s) | condition | why |
//! |---|---|---|
//! | mount, umount2, pivot_root, fsopen, fsconfig, fsmount, fspick, move_mount, open_tree, mount_setattr | always | filesystem namespace changes (old and new mount API) |
//! | unshare, setns | always | new or foreign namespaces |
//! | clone | flags has any `CLONE_NEW*` bit | namespaces through clone |
//! | clone3 | always: `ENOSYS`, so libc falls back to clone(2) | flags are behind a pointer |
//! | ptrace, process_vm_readv, process_vm_writev, pidfd_getfd, kcmp | always | inspecting other processes |
//! | bpf, perf_event_open, userfaultfd | always | large kernel attack surface |
//! | io_uring_setup, io_uring_enter, io_uring_register | always | bypasses seccomp for its operations |
//! | keyctl, add_key, request_key | always | kernel keyrings are not namespaced |
//! | init_module, finit_module, delete_module, kexec_load, kexec_file_load, reboot | always | kernel |
//! | swapon, swapoff, acct, quotactl, quotactl_fd, syslog, vhangup | always | host administration |
//! | open_by_handle_at, name_to_handle_at | always | escapes a chroot/pivot (shocker) |
//! | settimeofday, clock_settime, clock_adjtime, adjtimex | always | host clock |
//! | iopl, ioperm, uselib, lookup_dcookie, nfsservctl, _sysctl, ustat, sysfs | always | legacy |
//! | fanotify_init, chroot | always | unneeded by tools |
//! | personality | persona not 0 (`PER_LINUX`) and not `0xffffffff` (query) | e.g. `ADDR_NO_RANDOMIZE` |
//! | socket, socketpair | family not `AF_UNIX` (with network doors: not `AF_UNIX`/`AF_INET`/`AF_INET6`) | no raw, netlink, packet, vsock... sockets |
//! | ioctl | request `TIOCSTI` or `TIOCLINUX` (low 32 bits) | terminal injection |
//!
//! ## Allow list base set ([`ALLOW_BASE`])
//!
//! What a parser written in C, Python or shell needs: file I/O and
//! metadata, memory management, signals, process creation and waiting
//! (clone only without namespace flags, enforced by the deny list), time,
//! pipes, polling, unix sockets, futexes and thread setup. Anything else
//! must be named in `Seccomp::AllowList { extra }`.

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch, sock_filter,
};

use crate::{JailError, Seccomp};

/// Syscalls that always return `EPERM`, whatever their arguments.
pub const DENY_ALWAYS: &[(&str, i64)] = &[
    ("mount", libc::SYS_mount),
    ("umount2", libc::SYS_umount2),
    ("pivot_root", libc::SYS_pivot_root),
    ("fsopen", libc::SYS_fsopen),
    ("fsconfig", libc::SYS_fsconfig),
    ("fsmount", libc::SYS_fsmount),
    ("fspick", libc::SYS_fspick),
    ("move_mount", libc::SYS_move_mount),
    ("open_tree", libc::SYS_open_tree),
    ("mount_setattr", libc::SYS_mount_setattr),
    ("unshare", libc::SYS_unshare),
    ("setns", libc::SYS_setns),
    ("ptrace", libc::SYS_ptrace),
    ("process_vm_readv", libc::SYS_process_vm_readv),
    ("process_vm_writev", libc::SYS_process_vm_writev),
    ("pidfd_getfd", libc::SYS_pidfd_getfd),
    ("kcmp", libc::SYS_kcmp),
    ("bpf", libc::SYS_bpf),
    ("perf_event_open", libc::SYS_perf_event_open),
    ("userfaultfd", libc::SYS_userfaultfd),
    ("io_uring_setup", libc::SYS_io_uring_setup),
    ("io_uring_enter", libc::SYS_io_uring_enter),
    ("io_uring_register", libc::SYS_io_uring_register),
    ("keyctl", libc::SYS_keyctl),
    ("add_key", libc::SYS_add_key),
    ("request_key", libc::SYS_request_key),
    ("init_module", libc::SYS_init_module),
    ("finit_module", libc::SYS_finit_module),
    ("delete_module", libc::SYS_delete_module),
    ("kexec_load", libc::SYS_kexec_load),
    ("kexec_file_load", libc::SYS_kexec_file_load),
    ("reboot", libc::SYS_reboot),
    ("swapon", libc::SYS_swapon),
    ("swapoff", libc::SYS_swapoff),
    ("acct", libc::SYS_acct),
    ("quotactl", libc::SYS_quotactl),
    ("quotactl_fd", libc::SYS_quotactl_fd),
    ("syslog", libc::SYS_syslog),
    ("vhangup", libc::SYS_vhangup),
    ("open_by_handle_at", libc::SYS_open_by_handle_at),
    ("name_to_handle_at", libc::SYS_name_to_handle_at),
    ("settimeofday", libc::SYS_settimeofday),
    ("clock_settime", libc::SYS_clock_settime),
    ("clock_adjtime", libc::SYS_clock_adjtime),
    ("adjtimex", libc::SYS_adjtimex),
    ("iopl", libc::SYS_iopl),
    ("ioperm", libc::SYS_ioperm),
    ("uselib", libc::SYS_uselib),
    ("lookup_dcookie", libc::SYS_lookup_dcookie),
    ("nfsservctl", libc::SYS_nfsservctl),
    ("_sysctl", libc::SYS__sysctl),
    ("ustat", libc::SYS_ustat),
    ("sysfs", libc::SYS_sysfs),
    ("fanotify_init", libc::SYS_fanotify_init),
    ("chroot", libc::SYS_chroot),
];

/// Namespace flags refused in `clone(2)`'s flags argument.
pub const CLONE_NAMESPACE_FLAGS: &[(&str, u64)] = &[
    ("CLONE_NEWNS", libc::CLONE_NEWNS as u64),
    ("CLONE_NEWUSER", libc::CLONE_NEWUSER as u64),
    ("CLONE_NEWPID", libc::CLONE_NEWPID as u64),
    ("CLONE_NEWNET", libc::CLONE_NEWNET as u64),
    ("CLONE_NEWIPC", libc::CLONE_NEWIPC as u64),
    ("CLONE_NEWUTS", libc::CLONE_NEWUTS as u64),
    ("CLONE_NEWCGROUP", libc::CLONE_NEWCGROUP as u64),
    ("CLONE_NEWTIME", 0x80),
];

/// The allow-list base set (see the module table).
pub const ALLOW_BASE: &[&str] = &[
    // file I/O and metadata
    "read",
    "write",
    "readv",
    "writev",
    "pread64",
    "pwrite64",
    "preadv",
    "pwritev",
    "preadv2",
    "pwritev2",
    "open",
    "openat",
    "openat2",
    "close",
    "close_range",
    "creat",
    "lseek",
    "stat",
    "fstat",
    "lstat",
    "newfstatat",
    "statx",
    "access",
    "faccessat",
    "faccessat2",
    "getdents",
    "getdents64",
    "getcwd",
    "chdir",
    "fchdir",
    "rename",
    "renameat",
    "renameat2",
    "mkdir",
    "mkdirat",
    "rmdir",
    "unlink",
    "unlinkat",
    "link",
    "linkat",
    "symlink",
    "symlinkat",
    "readlink",
    "readlinkat",
    "chmod",
    "fchmod",
    "fchmodat",
    "fchmodat2",
    "chown",
    "fchown",
    "lchown",
    "fchownat",
    "umask",
    "truncate",
    "ftruncate",
    "fsync",
    "fdatasync",
    "sync_file_range",
    "fallocate",
    "fadvise64",
    "flock",
    "fcntl",
    "dup",
    "dup2",
    "dup3",
    "pipe",
    "pipe2",
    "sendfile",
    "splice",
    "tee",
    "copy_file_range",
    "statfs",
    "fstatfs",
    "utime",
    "utimes",
    "utimensat",
    "futimesat",
    "getxattr",
    "lgetxattr",
    "fgetxattr",
    "listxattr",
    "llistxattr",
    "flistxattr",
    "ioctl",
    "memfd_create",
    "mknod",
    "mknodat",
    // memory
    "brk",
    "mmap",
    "munmap",
    "mprotect",
    "mremap",
    "madvise",
    "mincore",
    "msync",
    "mlock",
    "munlock",
    "membarrier",
    // signals
    "rt_sigaction",
    "rt_sigprocmask",
    "rt_sigreturn",
    "rt_sigsuspend",
    "rt_sigpending",
    "rt_sigtimedwait",
    "rt_sigqueueinfo",
    "sigaltstack",
    "kill",
    "tkill",
    "tgkill",
    "pause",
    "alarm",
    "restart_syscall",
    "signalfd4",
    // processes and threads
    "clone",
    "clone3",
    "fork",
    "vfork",
    "execve",
    "execveat",
    "exit",
    "exit_group",
    "wait4",
    "waitid",
    "getpid",
    "getppid",
    "gettid",
    "getpgrp",
    "getpgid",
    "setpgid",
    "getsid",
    "setsid",
    "set_tid_address",
    "set_robust_list",
    "get_robust_list",
    "futex",
    "futex_waitv",
    "rseq",
    "arch_prctl",
    "prctl",
    "sched_yield",
    "sched_getaffinity",
    "sched_setaffinity",
    "sched_getparam",
    "sched_getscheduler",
    "getpriority",
    "setpriority",
    "getrlimit",
    "setrlimit",
    "prlimit64",
    "getrusage",
    "times",
    "capget",
    "uname",
    "sysinfo",
    // identity
    "getuid",
    "geteuid",
    "getgid",
    "getegid",
    "getgroups",
    "getresuid",
    "getresgid",
    // time
    "clock_gettime",
    "clock_getres",
    "clock_nanosleep",
    "gettimeofday",
    "time",
    "nanosleep",
    "timer_create",
    "timer_settime",
    "timer_gettime",
    "timer_delete",
    "timerfd_create",
    "timerfd_settime",
    "timerfd_gettime",
    "getitimer",
    "setitimer",
    // polling and events
    "poll",
    "ppoll",
    "select",
    "pselect6",
    "epoll_create",
    "epoll_create1",
    "epoll_ctl",
    "epoll_wait",
    "epoll_pwait",
    "epoll_pwait2",
    "eventfd",
    "eventfd2",
    // sockets (families filtered by the deny list)
    "socket",
    "socketpair",
    "connect",
    "accept",
    "accept4",
    "bind",
    "listen",
    "sendto",
    "recvfrom",
    "sendmsg",
    "recvmsg",
    "sendmmsg",
    "recvmmsg",
    "shutdown",
    "getsockname",
    "getpeername",
    "setsockopt",
    "getsockopt",
    // misc
    "getrandom",
    "personality",
    "landlock_create_ruleset",
    "landlock_add_rule",
    "landlock_restrict_self",
    "seccomp",
];

/// Compiled filters for one configuration, in install order.
pub type Filters = Vec<Vec<libc::sock_filter>>;

fn arch() -> Result<TargetArch, JailError> {
    match std::env::consts::ARCH {
        "x86_64" => Ok(TargetArch::x86_64),
        "aarch64" => Ok(TargetArch::aarch64),
        "riscv64" => Ok(TargetArch::riscv64),
        other => Err(JailError::Seccomp(format!(
            "architecture {other} is not supported by seccompiler"
        ))),
    }
}

fn seccomp_err(what: &str, e: impl std::fmt::Display) -> JailError {
    JailError::Seccomp(format!("{what}: {e}"))
}

fn cond(
    index: u8,
    len: SeccompCmpArgLen,
    op: SeccompCmpOp,
    val: u64,
) -> Result<SeccompCondition, JailError> {
    SeccompCondition::new(index, len, op, val).map_err(|e| seccomp_err("condition", e))
}

fn rule(conds: Vec<SeccompCondition>) -> Result<SeccompRule, JailError> {
    SeccompRule::new(conds).map_err(|e| seccomp_err("rule", e))
}

fn to_libc(prog: BpfProgram) -> Vec<libc::sock_filter> {
    prog.into_iter()
        .map(|i: sock_filter| libc::sock_filter {
            code: i.code,
            jt: i.jt,
            jf: i.jf,
            k: i.k,
        })
        .collect()
}

/// The deny-list filter. `inet` allows AF_INET/AF_INET6 sockets (network
/// doors).
pub fn deny_filter(inet: bool) -> Result<Vec<libc::sock_filter>, JailError> {
    use SeccompCmpArgLen::{Dword, Qword};
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = BTreeMap::new();
    for &(_, nr) in DENY_ALWAYS {
        rules.insert(nr, vec![]);
    }
    // clone: refuse when any namespace bit is set (one rule per bit; rules
    // of a syscall are OR-ed).
    let mut clone_rules = Vec::new();
    for &(_, bit) in CLONE_NAMESPACE_FLAGS {
        clone_rules.push(rule(vec![cond(
            0,
            Qword,
            SeccompCmpOp::MaskedEq(bit),
            bit,
        )?])?);
    }
    rules.insert(libc::SYS_clone, clone_rules);
    // personality: only PER_LINUX (0) and the query 0xffffffff.
    rules.insert(
        libc::SYS_personality,
        vec![rule(vec![
            cond(0, Dword, SeccompCmpOp::Ne, 0)?,
            cond(0, Dword, SeccompCmpOp::Ne, 0xffff_ffff)?,
        ])?],
    );
    // socket / socketpair: family must be AF_UNIX (or INET/INET6 with doors).
    let mut families = vec![libc::AF_UNIX as u64];
    if inet {
        families.push(libc::AF_INET as u64);
        families.push(libc::AF_INET6 as u64);
    }
    for nr in [libc::SYS_socket, libc::SYS_socketpair] {
        let conds = families
            .iter()
            .map(|&f| cond(0, Dword, SeccompCmpOp::Ne, f))
            .collect::<Result<Vec<_>, _>>()?;
        rules.insert(nr, vec![rule(conds)?]);
    }
    // ioctl: TIOCSTI and TIOCLINUX (the kernel reads the request as a
    // 32-bit unsigned int, so compare the low 32 bits only).
    rules.insert(
        libc::SYS_ioctl,
        vec![
            rule(vec![cond(1, Dword, SeccompCmpOp::Eq, libc::TIOCSTI)?])?,
            rule(vec![cond(1, Dword, SeccompCmpOp::Eq, libc::TIOCLINUX)?])?,
        ],
    );
    let filter = SeccompFilter::new(
        rules,
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EPERM as u32),
        arch()?,
    )
    .map_err(|e| seccomp_err("deny list", e))?;
    let prog: BpfProgram = filter.try_into().map_err(|e| seccomp_err("deny list", e))?;
    Ok(to_libc(prog))
}

/// The allow-list filter: default EPERM; base set plus `extra` names.
pub fn allow_filter(extra: &[String]) -> Result<Vec<libc::sock_filter>, JailError> {
    let mut names: Vec<&str> = ALLOW_BASE.to_vec();
    for e in extra {
        if !e.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            return Err(JailError::Spec(format!(
                "seccomp allow list: bad syscall name {e:?}"
            )));
        }
        names.push(e.as_str());
    }
    names.sort_unstable();
    names.dedup();
    let filter: Vec<String> = names
        .iter()
        .map(|n| format!("{{\"syscall\":\"{n}\"}}"))
        .collect();
    let json = format!(
        "{{\"allow\":{{\"default_action\":{{\"errno\":{}}},\"filter_action\":\"allow\",\"filter\":[{}]}}}}",
        libc::EPERM,
        filter.join(",")
    );
    let mut map = seccompiler::compile_from_json(json.as_bytes(), arch()?).map_err(|e| {
        JailError::Spec(format!("seccomp allow list: {e} (extra names: {extra:?})"))
    })?;
    let prog = map
        .remove("allow")
        .ok_or_else(|| JailError::Seccomp("allow list did not compile".into()))?;
    Ok(to_libc(prog))
}

fn ld(k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jmp(op: u32, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter {
        code: (libc::BPF_JMP | op | libc::BPF_K) as u16,
        jt,
        jf,
        k,
    }
}

fn ret(k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k,
    }
}

const X32_BIT: u32 = 0x4000_0000;
const RET_EPERM: u32 = libc::SECCOMP_RET_ERRNO | libc::EPERM as u32;
const RET_ENOSYS: u32 = libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32;

/// The prologue spliced after the arch check: x32 bit -> EPERM (x86_64
/// only), clone3 -> ENOSYS, else fall through to the next instruction.
fn prologue() -> Vec<libc::sock_filter> {
    let x32 = std::env::consts::ARCH == "x86_64";
    let mut p = vec![ld(0)]; // A = nr (struct seccomp_data: nr at offset 0)
    if x32 {
        p.push(jmp(libc::BPF_JGE, X32_BIT, 2, 0)); // -> ret EPERM
    }
    p.push(jmp(
        libc::BPF_JEQ,
        libc::SYS_clone3 as u32,
        if x32 { 2 } else { 1 },
        0,
    ));
    p.push(libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JA) as u16,
        jt: 0,
        jf: 0,
        k: if x32 { 2 } else { 1 },
    });
    if x32 {
        p.push(ret(RET_EPERM));
    }
    p.push(ret(RET_ENOSYS));
    p
}

/// Splice the prologue into a seccompiler program right after its 3-insn
/// arch check; None if the program does not start that way.
fn splice(prog: Vec<libc::sock_filter>) -> Option<Vec<libc::sock_filter>> {
    let head = prog.get(..3)?;
    let arch_ok = head[0].code == (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16
        && head[0].k == 4
        && head[1].code == (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16
        && head[1].jt == 1
        && head[1].jf == 0
        && head[2].code == (libc::BPF_RET | libc::BPF_K) as u16;
    if !arch_ok {
        return None;
    }
    let mut out = Vec::with_capacity(prog.len() + 8);
    out.extend_from_slice(head);
    out.extend(prologue());
    out.extend_from_slice(&prog[3..]);
    Some(out)
}

/// What the deny tree does with one syscall number.
#[derive(Debug, Clone, Copy)]
enum Leaf {
    Eperm,
    Enosys,
    /// EPERM when any of these bits is set in the low word of arg 0.
    FlagsArg0(u32),
    /// ALLOW only when the low word of arg 0 is one of these.
    OnlyArg0(&'static [u32]),
    /// EPERM when the low word of arg 1 is one of these.
    DenyArg1(&'static [u32]),
}

const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const SOCK_UNIX: &[u32] = &[libc::AF_UNIX as u32];
const SOCK_INET: &[u32] = &[
    libc::AF_UNIX as u32,
    libc::AF_INET as u32,
    libc::AF_INET6 as u32,
];
const PERSONA_OK: &[u32] = &[0, 0xffff_ffff];
const IOCTL_DENY: &[u32] = &[libc::TIOCSTI as u32, libc::TIOCLINUX as u32];

/// Offset of the low 32 bits of argument `i` in `struct seccomp_data`.
fn arg_lo(i: u32) -> u32 {
    16 + 8 * i
}

fn leaf_code(leaf: Leaf) -> Vec<libc::sock_filter> {
    match leaf {
        Leaf::Eperm => vec![ret(RET_EPERM)],
        Leaf::Enosys => vec![ret(RET_ENOSYS)],
        Leaf::FlagsArg0(mask) => vec![
            ld(arg_lo(0)),
            jmp(libc::BPF_JSET, mask, 0, 1),
            ret(RET_EPERM),
            ret(ALLOW),
        ],
        Leaf::OnlyArg0(ok) => {
            let mut v = vec![ld(arg_lo(0))];
            let n = ok.len();
            for (i, &k) in ok.iter().enumerate() {
                // jt: to "ret ALLOW" after the remaining compares and the EPERM.
                v.push(jmp(libc::BPF_JEQ, k, (n - i) as u8, 0));
            }
            v.push(ret(RET_EPERM));
            v.push(ret(ALLOW));
            v
        }
        Leaf::DenyArg1(bad) => {
            let mut v = vec![ld(arg_lo(1))];
            let n = bad.len();
            for (i, &k) in bad.iter().enumerate() {
                v.push(jmp(libc::BPF_JEQ, k, (n - i) as u8, 0));
            }
            v.push(ret(ALLOW));
            v.push(ret(RET_EPERM));
            v
        }
    }
}

/// Syscall number -> leaf, sorted.
fn deny_table(inet: bool) -> Vec<(u32, Leaf)> {
    let ns_mask = CLONE_NAMESPACE_FLAGS.iter().fold(0u64, |m, (_, b)| m | b) as u32;
    let mut t: Vec<(u32, Leaf)> = DENY_ALWAYS
        .iter()
        .map(|&(_, nr)| (nr as u32, Leaf::Eperm))
        .collect();
    t.push((libc::SYS_clone3 as u32, Leaf::Enosys));
    t.push((libc::SYS_clone as u32, Leaf::FlagsArg0(ns_mask)));
    t.push((libc::SYS_personality as u32, Leaf::OnlyArg0(PERSONA_OK)));
    let fams = if inet { SOCK_INET } else { SOCK_UNIX };
    t.push((libc::SYS_socket as u32, Leaf::OnlyArg0(fams)));
    t.push((libc::SYS_socketpair as u32, Leaf::OnlyArg0(fams)));
    t.push((libc::SYS_ioctl as u32, Leaf::DenyArg1(IOCTL_DENY)));
    t.sort_by_key(|(nr, _)| *nr);
    t.dedup_by_key(|(nr, _)| *nr);
    t
}

/// Code for a sorted slice of the table; every path ends in a `ret`.
/// Large slices split on the middle number (`jge`, then a long `ja` to
/// the lower half), small ones are linear `jeq` chains: a lookup costs
/// about log2(n) + 4 comparisons instead of n.
fn tree_code(t: &[(u32, Leaf)]) -> Vec<libc::sock_filter> {
    if t.len() <= 4 {
        let mut v = Vec::new();
        for &(nr, leaf) in t {
            let code = leaf_code(leaf);
            v.push(jmp(libc::BPF_JEQ, nr, 0, code.len() as u8));
            v.extend(code);
        }
        v.push(ret(ALLOW));
        return v;
    }
    let mid = t.len() / 2;
    let (low, high) = t.split_at(mid);
    let high_code = tree_code(high);
    let low_code = tree_code(low);
    let mut v = Vec::with_capacity(high_code.len() + low_code.len() + 2);
    v.push(jmp(libc::BPF_JGE, high[0].0, 1, 0));
    v.push(libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JA) as u16,
        jt: 0,
        jf: 0,
        k: high_code.len() as u32,
    });
    v.extend(high_code);
    v.extend(low_code);
    v
}

/// The deny filter as installed: arch check, x32 guard, then a binary
/// decision tree over the deny table (same decisions as [`deny_filter`]
/// plus the prologue, which the tests check against seccompiler's
/// program for every syscall number; much shorter to evaluate, which also
/// matters to the kernel's per-filter action-cache preparation).
pub fn deny_tree(inet: bool) -> Vec<libc::sock_filter> {
    let audit_arch = match std::env::consts::ARCH {
        "x86_64" => 0xc000_003e,
        "aarch64" => 0xc000_00b7,
        _ => 0xc000_00f3, // riscv64
    };
    let mut v = vec![
        ld(4),
        jmp(libc::BPF_JEQ, audit_arch, 1, 0),
        ret(libc::SECCOMP_RET_KILL_PROCESS),
        ld(0),
    ];
    if std::env::consts::ARCH == "x86_64" {
        v.push(jmp(libc::BPF_JGE, X32_BIT, 0, 1));
        v.push(ret(RET_EPERM));
    }
    v.extend(tree_code(&deny_table(inet)));
    v
}

/// The deny decisions compiled by seccompiler, with the x32/clone3
/// prologue spliced after its arch check: the reference [`deny_tree`] is
/// tested against (and what the benchmark hands to bubblewrap).
pub fn reference_deny(inet: bool) -> Result<Vec<libc::sock_filter>, JailError> {
    splice(deny_filter(inet)?).ok_or_else(|| {
        JailError::Seccomp("seccompiler output does not start with the arch check".into())
    })
}

/// All filters for a mode, in install order.
pub fn filters(mode: &Seccomp, inet: bool) -> Result<Filters, JailError> {
    let mut out = Vec::new();
    if let Seccomp::AllowList { extra } = mode {
        out.push(allow_filter(extra)?);
    }
    out.push(deny_tree(inet));
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_mode_compiles() {
        // Deny list: one filter (prologue spliced in); allow list: two.
        assert_eq!(filters(&Seccomp::DenyList, false).unwrap().len(), 1);
        assert_eq!(
            filters(
                &Seccomp::AllowList {
                    extra: vec!["getpriority".into()]
                },
                true
            )
            .unwrap()
            .len(),
            2
        );
    }

    #[test]
    fn unknown_extra_name_is_refused() {
        let err = allow_filter(&["no_such_syscall".into()])
            .unwrap_err()
            .to_string();
        assert!(err.contains("no_such_syscall"), "{err}");
    }

    #[test]
    fn prologue_is_spliced_after_the_arch_check() {
        let deny = deny_filter(false).unwrap();
        let merged = splice(deny.clone()).expect("seccompiler output starts with the arch check");
        assert_eq!(merged.len(), deny.len() + prologue().len());
        assert_eq!(merged[3].k, 0, "loads the syscall number");
        assert_eq!(merged.last().unwrap().k, deny.last().unwrap().k);
    }

    /// A classic-BPF interpreter for the instructions we emit.
    fn eval(prog: &[libc::sock_filter], data: &[u8; 64]) -> u32 {
        let mut a: u32 = 0;
        let mut pc = 0usize;
        loop {
            let i = prog[pc];
            let class = u32::from(i.code) & 0x07;
            let op = u32::from(i.code) & 0xf0;
            match class {
                c if c == libc::BPF_LD => {
                    let k = i.k as usize;
                    a = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                    pc += 1;
                }
                c if c == libc::BPF_RET => return i.k,
                c if c == libc::BPF_ALU && op == libc::BPF_AND => {
                    a &= i.k;
                    pc += 1;
                }
                c if c == libc::BPF_JMP => {
                    let taken = match op {
                        o if o == libc::BPF_JA => {
                            pc += 1 + i.k as usize;
                            continue;
                        }
                        o if o == libc::BPF_JEQ => a == i.k,
                        o if o == libc::BPF_JGE => a >= i.k,
                        o if o == libc::BPF_JGT => a > i.k,
                        o if o == libc::BPF_JSET => a & i.k != 0,
                        o => panic!("jump op {o:#x}"),
                    };
                    pc += 1 + usize::from(if taken { i.jt } else { i.jf });
                }
                c => panic!("class {c:#x} at {pc}"),
            }
        }
    }

    fn data(arch: u32, nr: u32, args: [u64; 6]) -> [u8; 64] {
        let mut d = [0u8; 64];
        d[0..4].copy_from_slice(&nr.to_le_bytes());
        d[4..8].copy_from_slice(&arch.to_le_bytes());
        for (i, a) in args.iter().enumerate() {
            d[16 + 8 * i..24 + 8 * i].copy_from_slice(&a.to_le_bytes());
        }
        d
    }

    #[test]
    fn deny_tree_matches_seccompiler_for_every_syscall() {
        for inet in [false, true] {
            let reference = reference_deny(inet).unwrap();
            let tree = deny_tree(inet);
            assert!(
                tree.len() < reference.len() / 2,
                "{} vs {}",
                tree.len(),
                reference.len()
            );
            let arg_values: &[u64] = &[
                0,
                1,
                2,
                10,
                16,
                17,
                0xffff_ffff,
                0x0040_0000,
                libc::CLONE_NEWUSER as u64,
                libc::CLONE_NEWNET as u64 | 17,
                0x11, // SIGCHLD: a plain fork
                libc::TIOCSTI,
                libc::TIOCLINUX,
                0x5401, // TCGETS
            ];
            let mut checked = 0;
            for nr in (0u32..460).chain([0x4000_0027, 0x4000_0000 | 435]) {
                for &a0 in arg_values {
                    for &a1 in arg_values {
                        let d = data(0xc000_003e, nr, [a0, a1, 0, 0, 0, 0]);
                        assert_eq!(
                            eval(&tree, &d),
                            eval(&reference, &d),
                            "nr {nr} args {a0:#x} {a1:#x} inet {inet}"
                        );
                        checked += 1;
                    }
                }
            }
            assert!(checked > 90_000);
            // Foreign architecture (i386): killed by both.
            let d = data(0x4000_0003, 20, [0; 6]);
            assert_eq!(eval(&tree, &d), libc::SECCOMP_RET_KILL_PROCESS);
            assert_eq!(eval(&reference, &d), libc::SECCOMP_RET_KILL_PROCESS);
        }
    }

    #[test]
    fn deny_tree_spot_checks() {
        let t = deny_tree(false);
        let x = |nr: i64, a0: u64, a1: u64| {
            eval(&t, &data(0xc000_003e, nr as u32, [a0, a1, 0, 0, 0, 0]))
        };
        assert_eq!(x(libc::SYS_mount, 0, 0), RET_EPERM);
        assert_eq!(x(libc::SYS_clone3, 0, 0), RET_ENOSYS);
        assert_eq!(x(libc::SYS_clone, libc::CLONE_NEWUSER as u64, 0), RET_EPERM);
        assert_eq!(x(libc::SYS_clone, 0x11, 0), ALLOW);
        assert_eq!(x(libc::SYS_socket, libc::AF_INET as u64, 1), RET_EPERM);
        assert_eq!(x(libc::SYS_socket, libc::AF_UNIX as u64, 1), ALLOW);
        assert_eq!(x(libc::SYS_ioctl, 0, libc::TIOCSTI), RET_EPERM);
        assert_eq!(x(libc::SYS_ioctl, 0, 0x5401), ALLOW);
        assert_eq!(x(libc::SYS_read, 0, 0), ALLOW);
        assert_eq!(x(0x4000_0000 | libc::SYS_getpid, 0, 0), RET_EPERM);
    }

    #[test]
    fn base_names_all_resolve() {
        // compile_from_json fails on any unknown name, so this proves the
        // table is spelled right for this architecture.
        allow_filter(&[]).unwrap();
    }
}
