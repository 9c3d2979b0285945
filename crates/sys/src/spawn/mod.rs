//! Start one sandboxed process: clone with new namespaces, run a prepared
//! setup program in the child, execve.
//!
//! The broker is multi-threaded. Between `clone` and `execve` the child is a
//! copy of one thread of a multi-threaded process: another thread may have
//! held the allocator lock, glibc's thread bookkeeping is stale (so its
//! `setresuid` wrapper would try to signal threads that do not exist), and
//! nothing but raw system calls on memory that already exists is safe. So
//! the parent builds everything the child needs into a [`ChildPlan`] (C
//! strings, pointer arrays, BPF programs, file contents), and the child only
//! walks that plan with raw `syscall(2)`s, never allocating, never panicking
//! (no indexing, no unwrap), and never calling a glibc wrapper that takes a
//! lock.
//!
//! Failures in the child are reported over a close-on-exec pipe as
//! `(step code, errno)`; a successful `execve` closes the pipe, so the parent
//! reads either eight bytes (setup failed) or end-of-file (the tool runs).
//!
//! # Layout
//!
//! The parent side, and what both sides share:
//!
//! - `plan`: the public [`ChildPlan`] and the types it is made of ([`Op`],
//!   [`Step`], [`LandlockPlan`], [`DoorsPlan`]), built by the caller.
//! - `step`: the error pipe, both ends: [`ChildStep`] (each step's wire code
//!   and its `Display` name for error messages), the child's report and
//!   [`ChildFailure::decode`].
//! - `raw`: the errno-free raw system call (`sc!`) and the child's `exit`
//!   and one-byte read.
//! - `clone`: [`spawn`], which prepares what the child reads, blocks
//!   signals and clones it (with `CLONE_VM` on its own stack on x86_64,
//!   fork-like elsewhere), and the [`Child`] handle that owns the plan and
//!   stack until the child is reaped; [`born_into_cgroup_survives`].
//! - `netns`: new network namespaces made on their own thread
//!   ([`new_net_namespace`], [`start_net_namespace`]) and the calling
//!   thread's visit to a pooled one for the clone.
//! - `fdpass`: one descriptor over a unix socket: the child's `send_fd`,
//!   the parent's [`recv_fd`].
//! - `program`: what the child reads (`Shared`) and the ordered list of
//!   steps it runs (`Shared::run`), one mechanism's `install` each.
//!
//! The child side, one file per mechanism, in the order the program runs
//! them. Each is a small value (prepared in the parent, or a view of the
//! plan built on the child's stack: no allocation) with an unsafe,
//! child-only `install` that reports its own [`ChildStep`]s:
//!
//! - `signals`: default dispositions first, the mask cleared last.
//! - `cgroup`: joining the cgroups whose files the parent opened, and the
//!   cgroup namespace after the go-ahead.
//! - `fds`: stdio and the control descriptors to 0..=5, the rest closed.
//! - `process`: the go-ahead, the parent-death signal, `setsid`,
//!   `no_new_privs`.
//! - `identity`: groups, gid, uid (and the broker's dumpable flag back).
//! - `mounts`: the filesystem program ([`Op`]s).
//! - `doors`: `lo` up, local addresses, the door sockets sent to the parent.
//! - `rlimits`: resource limits.
//! - `landlock`: the Landlock ruleset.
//! - `capabilities`: every capability dropped.
//! - `seccomp`: the BPF filters.
//! - `exec`: `execve` of each candidate path.

mod capabilities;
mod cgroup;
mod clone;
mod doors;
mod exec;
mod fdpass;
mod fds;
mod identity;
mod landlock;
mod mounts;
mod netns;
mod plan;
mod process;
mod program;
mod raw;
mod rlimits;
mod seccomp;
mod signals;
mod step;

pub use clone::{CLONE_VM, Child, born_into_cgroup_survives, spawn};
pub use fdpass::recv_fd;
pub use netns::{new_net_namespace, start_net_namespace};
pub use plan::{ChildPlan, DoorsPlan, FIRST_TREE_FD, LandlockPlan, MAX_TREES, Op, Step};
pub use step::{ChildFailure, ChildStep};
