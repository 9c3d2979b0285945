//! What the caller hands to [`spawn`](super::spawn): the [`ChildPlan`] and
//! the types it is made of, all built (and so allocated) before `clone`.

use std::ffi::CString;
use std::os::fd::RawFd;

/// How many [`Op::AttachTree`] steps one plan may have.
pub const MAX_TREES: u32 = 64;

/// The child's descriptor of the tree in slot 0 (after stdio and the
/// control descriptors, 0..=5).
pub const FIRST_TREE_FD: u32 = 6;

/// One filesystem or namespace operation of the child's setup program.
#[derive(Debug)]
pub enum Op {
    /// `mount(2)` exactly as given.
    Mount {
        /// Source, or none.
        src: Option<CString>,
        /// Mount point.
        target: CString,
        /// Filesystem type, or none (bind, remount, propagation changes).
        fstype: Option<CString>,
        /// `MS_*` flags.
        flags: libc::c_ulong,
        /// Filesystem options, or none.
        data: Option<CString>,
    },
    /// Bind `src` on `target` (recursively), then make it and its submounts
    /// read-only with `flags` added (e.g. `MS_NOSUID | MS_NODEV`) through a
    /// recursive `mount_setattr`, which keeps every flag already set (locked
    /// flags in a user namespace cannot be cleared). Before Linux 5.12: a
    /// bind remount that keeps those flags, for the top mount only.
    BindReadOnly {
        /// Host path.
        src: CString,
        /// Mount point in the new root.
        target: CString,
        /// `MS_*` flags to add besides `MS_RDONLY`.
        flags: libc::c_ulong,
    },
    /// Attach a detached mount tree the broker cloned
    /// ([`crate::mount::clone_tree`]) on `target` (`move_mount(2)`).
    /// Follow it with [`Op::SetReadOnly`] or [`Op::Remount`].
    AttachTree {
        /// The tree; the broker keeps it open until the child has run.
        tree: std::os::fd::OwnedFd,
        /// Its place among the plan's trees, `0..MAX_TREES`, in the order
        /// of the steps: the child finds it at descriptor
        /// `FIRST_TREE_FD + slot` (its other descriptors are closed before
        /// the filesystem program runs).
        slot: u32,
        /// Mount point in the new root.
        target: CString,
    },
    /// Make the mount on `target` and its submounts read-only with `flags`
    /// added, as [`Op::BindReadOnly`] does after its bind.
    SetReadOnly {
        /// Mount point.
        target: CString,
        /// `MS_*` flags to add besides `MS_RDONLY`.
        flags: libc::c_ulong,
    },
    /// Bind remount of an existing mount point with `flags` added, keeping
    /// the flags it already has.
    Remount {
        /// Mount point.
        target: CString,
        /// `MS_*` flags to add.
        flags: libc::c_ulong,
    },
    /// `mkdir(2)`; an existing directory is fine.
    Mkdir {
        /// Path.
        path: CString,
        /// Mode.
        mode: libc::mode_t,
    },
    /// Create a file (exclusive) and write `contents` to it.
    WriteFile {
        /// Path.
        path: CString,
        /// Mode.
        mode: libc::mode_t,
        /// Bytes.
        contents: Vec<u8>,
    },
    /// `symlink(target, link)`.
    Symlink {
        /// What the link points to.
        target: CString,
        /// Where the link is created.
        link: CString,
    },
    /// Make `new_root` the root: `chdir(new_root)`, `pivot_root(".", ".")`,
    /// detach the old root (`umount2(".", MNT_DETACH)`), `chdir("/")`.
    PivotRoot {
        /// A mount point.
        new_root: CString,
    },
    /// `chroot(2)` into `path`, then `chdir("/")`: for a root that cannot
    /// be pivoted away from (the initramfs of a guest, whose root is the
    /// kernel's rootfs).
    Chroot {
        /// The new root.
        path: CString,
    },
    /// `chdir(2)`.
    Chdir {
        /// Path.
        path: CString,
    },
    /// `sethostname(2)`.
    Hostname {
        /// Name.
        name: CString,
    },
}

/// One `op` with how to treat a missing path.
#[derive(Debug)]
pub struct Step {
    /// The operation.
    pub op: Op,
    /// Skip the step when it fails with ENOENT (e.g. a /proc file that this
    /// kernel does not have).
    pub skip_if_missing: bool,
}

/// Landlock ruleset, prepared in the parent.
#[derive(Debug)]
pub struct LandlockPlan {
    /// `handled_access_fs`.
    pub handled_fs: u64,
    /// `handled_access_net` (0 when the kernel's ABI is below 4).
    pub handled_net: u64,
    /// `scoped` (0 when the kernel's ABI is below 6).
    pub scoped: u64,
    /// Size of `struct landlock_ruleset_attr` to pass: 8, 16 or 24 bytes
    /// depending on which fields the kernel knows.
    pub attr_size: usize,
    /// Path-beneath rules: path (inside the new root) and allowed access.
    pub rules: Vec<(CString, u64)>,
}

/// Network doors, prepared in the parent (see the jail crate).
#[derive(Debug)]
pub struct DoorsPlan {
    /// Complete `RTM_NEWADDR` netlink messages, one per local address.
    pub addr_messages: Vec<Vec<u8>>,
    /// Sockets to create: (domain, type, sockaddr bytes). Stream sockets
    /// are put in listening state.
    pub sockets: Vec<(libc::c_int, libc::c_int, Vec<u8>)>,
    /// Also send a `NETLINK_ROUTE` socket of the namespace, after the
    /// others, so the parent can add addresses to `lo` later.
    pub route_socket: bool,
}

/// Everything the child needs, built before `clone`.
#[derive(Debug)]
pub struct ChildPlan {
    /// `CLONE_NEW*` flags for `clone3`.
    pub namespaces: u64,
    /// A cgroup v2 directory to start in (`CLONE_INTO_CGROUP`).
    pub cgroup_fd: Option<RawFd>,
    /// Descriptor that becomes the child's 0.
    pub stdin: RawFd,
    /// Descriptor that becomes the child's 1.
    pub stdout: RawFd,
    /// Descriptor that becomes the child's 2.
    pub stderr: RawFd,
    /// Read end of the go-ahead pipe.
    pub sync_read: RawFd,
    /// Write end of the error pipe.
    pub err_write: RawFd,
    /// A socket over which the child sends its door sockets.
    pub doors_sock: Option<RawFd>,
    /// `unshare(CLONE_NEWCGROUP)` after the go-ahead.
    pub cgroup_ns: bool,
    /// cgroup files, opened by the parent for writing (v1 `tasks`; a v2
    /// `cgroup.procs` only where the child cannot be born in its v2
    /// cgroup): the child moves itself into each by writing `0`, first
    /// thing after clone. Moving the calling thread alone does not take
    /// the kernel's global threadgroup lock (whose first writer after a
    /// quiet spell waits for an RCU grace period, several milliseconds),
    /// which a write of a pid to `cgroup.procs` does. The child is
    /// single-threaded, so the thread is the whole process. The kernel
    /// checks the opener's credentials, so the child's own do not matter.
    pub join_cgroups: Vec<RawFd>,
    /// Join this network namespace instead of creating one: the calling
    /// thread enters it for the `clone3` (so the child is born in it) and
    /// returns to its own right after. `namespaces` must not contain
    /// `CLONE_NEWNET` then.
    pub join_net: Option<RawFd>,
    /// Call `setgroups(0, NULL)` (only possible when the parent left
    /// `setgroups` allowed, i.e. a privileged parent).
    pub clear_groups: bool,
    /// uid inside the user namespace.
    pub uid: u32,
    /// gid inside the user namespace.
    pub gid: u32,
    /// The filesystem program.
    pub steps: Vec<Step>,
    /// Network doors, set up after the filesystem program.
    pub doors: Option<DoorsPlan>,
    /// `(resource, soft, hard)`.
    pub rlimits: Vec<(u32, u64, u64)>,
    /// Landlock, when the kernel has it and it is wanted.
    pub landlock: Option<LandlockPlan>,
    /// Highest capability number (`/proc/sys/kernel/cap_last_cap`).
    pub cap_last: u32,
    /// Keep the capabilities the child has in its namespaces instead of
    /// dropping every one: only for a supervisor that builds a sandbox of
    /// its own (an application kernel such as gVisor's `runsc`), never for
    /// a tool.
    pub keep_capabilities: bool,
    /// seccomp filters, installed in this order, last of all.
    pub seccomp: Vec<Vec<libc::sock_filter>>,
    /// Candidate paths for `execve`, tried in order.
    pub exec_paths: Vec<CString>,
    /// argv.
    pub argv: Vec<CString>,
    /// envp: zeroised when the plan is dropped (it may hold a token).
    pub envp: Vec<zeroize::Zeroizing<CString>>,
}
