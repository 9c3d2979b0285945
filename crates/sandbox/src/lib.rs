//! cordon-sandbox: the one description of a sandbox, shared by the policy
//! that lowers into it, the native jail and every runtime that builds it:
//! its limits ([`Limits`], with the P1 defaults [`Limits::P1`]), its
//! system-call filter ([`Seccomp`]), its root ([`Root`]) and binds
//! ([`Bind`], [`Mount`]), and what came of it ([`Outcome`], [`Status`],
//! [`LandlockStatus`]); the root's layout, which each runtime renders
//! ([`layout`]); byte sizes and durations as messages write them
//! ([`units`]); where a program named without a `/` is looked for
//! ([`exec`]).

pub mod exec;
pub mod layout;
pub mod units;

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Resource limits of a whole sandbox. Serialized as the resolved policy
/// shows them (`wall_seconds`, `memory_bytes`...).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Wall clock; the whole sandbox is killed after it (one call; for a
    /// spawned sandbox, its whole life).
    #[serde(rename = "wall_seconds", with = "units::seconds")]
    pub wall: Duration,
    /// Memory, no swap (cgroup; the native jail without a memory cgroup
    /// falls back to RLIMIT_DATA per process and a far looser RLIMIT_AS).
    pub memory_bytes: u64,
    /// The tool's own processes and threads (pids.max; RLIMIT_NPROC in the
    /// sandbox's user namespace without cgroups; under gVisor the Sentry's
    /// RLIMIT_NPROC, the host pids.max a backstop for gVisor's threads).
    pub tasks: u64,
    /// CPU quota in percent of one core (100 = one core); `None`: no quota.
    pub cpu_percent: Option<u32>,
    /// Output cap: a call's whole stdout, over which the sandbox is killed
    /// ([`Status::OutputCap`]). For a spawned sandbox it is the cap of
    /// each result (the gate's).
    pub output_bytes: u64,
    /// Stderr kept; the rest is drained and counted.
    pub stderr_bytes: u64,
    /// Open descriptors (RLIMIT_NOFILE).
    pub nofile: u64,
    /// Size of the writable `/tmp` (and RLIMIT_FSIZE).
    pub disk_bytes: u64,
}

impl Limits {
    /// The P1 defaults: the policy's for a P1 tool, the jail's and a bare
    /// spec's.
    pub const P1: Limits = Limits {
        wall: Duration::from_secs(20),
        memory_bytes: 512 << 20,
        tasks: 32,
        cpu_percent: Some(100),
        output_bytes: 2_000_000,
        stderr_bytes: 64 << 10,
        nofile: 256,
        disk_bytes: 64 << 20,
    };
}

impl Default for Limits {
    /// [`Limits::P1`].
    fn default() -> Limits {
        Limits::P1
    }
}

/// The system-call filter.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum Seccomp {
    /// Default allow, with cordon's deny table.
    #[default]
    DenyList,
    /// Default deny (EPERM): the base set plus these system calls.
    AllowList {
        /// System calls allowed beyond the base set, by name.
        extra: Vec<String>,
    },
}

/// What the sandbox's `/` is made of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Root {
    /// Read-only binds of the host's system directories (`/usr`, and
    /// `/bin`, `/lib`... as the host has them) on an empty tmpfs, with a
    /// written `/etc` and the sandbox's own `/dev`, `/proc` and `/tmp`.
    #[default]
    HostBinds,
    /// An unpacked image, read-only: every top-level entry of `rootfs`
    /// (an absolute host path the sandbox's host uid can search) appears
    /// at `/` (directories and files bound recursively, nosuid and nodev;
    /// symlinks made again, never followed on the host), with the
    /// sandbox's own `/proc`, `/dev` and `/tmp` whether the image has them
    /// or not, and nothing of the host's but the spec's binds. The image's
    /// own `/etc` is used as it is; nothing is written into the directory.
    /// A bind destination through a symlink of the image is refused.
    Image {
        /// The unpacked root file system on the host.
        rootfs: PathBuf,
        /// The image's manifest digest (`sha256:HEX`), for messages and
        /// audit records (empty when unknown).
        digest: String,
    },
}

/// A bind of a host path into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    /// Host path (file or directory).
    pub src: PathBuf,
    /// Absolute path inside the sandbox.
    pub dst: PathBuf,
}

/// A bind of a host path that says whether it is writable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Mount {
    /// Host path.
    pub src: PathBuf,
    /// Absolute path inside the sandbox.
    pub dst: PathBuf,
    /// Read-write; read-only otherwise.
    pub writable: bool,
}

impl Mount {
    /// Its source and destination.
    pub fn bind(&self) -> Bind {
        Bind {
            src: self.src.clone(),
            dst: self.dst.clone(),
        }
    }
}

/// How a call (or a spawned sandbox) ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// Exit code 0.
    Ok,
    /// Non-zero exit, or a signal not caused by a limit.
    Exited,
    /// Killed at the wall-clock limit.
    TimedOut,
    /// Killed at the memory limit.
    MemoryLimit,
    /// Hit the task limit and failed.
    TaskLimit,
    /// Killed for writing more than its output cap.
    OutputCap,
    /// Killed by the broker (a spawned sandbox that was stopped).
    Killed,
}

/// Landlock as applied to a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LandlockStatus {
    /// Every right we handle is known to the kernel.
    FullyEnforced,
    /// The kernel's ABI is older: some rights are not enforced.
    PartiallyEnforced,
    /// The kernel has no Landlock.
    NotEnforced,
    /// The spec turned Landlock off, or the runtime does not apply it
    /// (a supervisor confines what it runs itself).
    Disabled,
}

/// The result of a sandbox that ran (setup failures are errors).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// How it ended.
    pub status: Status,
    /// Exit code, when it exited.
    pub exit_code: Option<i32>,
    /// Signal, when it was killed.
    pub signal: Option<i32>,
    /// Wall time from the start of setup to reaping.
    pub duration: Duration,
    /// Wall time from the start of setup until the sandbox was made and
    /// its program released to run, where the runtime measures it (the
    /// rest of `duration` is the program running).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub setup: Option<Duration>,
    /// Peak memory of the sandbox, where it is measured (its cgroup).
    pub peak_memory_bytes: Option<u64>,
    /// Stdout of a call (at most its cap); empty for a spawned sandbox.
    pub stdout: Vec<u8>,
    /// Bytes the sandbox wrote to stdout (more than the cap on
    /// [`Status::OutputCap`]).
    pub output_bytes: u64,
    /// Stderr, capped at `stderr_bytes`.
    pub stderr: Vec<u8>,
    /// Total stderr bytes seen (stored or drained).
    pub stderr_total: u64,
    /// Human text, e.g. `pdf_to_text: timed out after 20s`.
    pub reason: String,
    /// Weakened guarantees, as sentences: the sandbox's own for this call
    /// (missing cgroups, an older Landlock) and, once admitted, every
    /// mechanism the runtime does not fully enforce here.
    pub warnings: Vec<String>,
    /// Landlock as applied to this sandbox.
    pub landlock: LandlockStatus,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_serialize_as_the_policy_shows_them() {
        let v = serde_json::to_value(Limits::P1).unwrap();
        assert_eq!(
            v,
            serde_json::json!({
                "wall_seconds": 20,
                "memory_bytes": 512 << 20,
                "tasks": 32,
                "cpu_percent": 100,
                "output_bytes": 2_000_000,
                "stderr_bytes": 64 << 10,
                "nofile": 256,
                "disk_bytes": 64 << 20,
            })
        );
        let back: Limits = serde_json::from_value(v).unwrap();
        assert_eq!(back, Limits::P1);
        let mut short = Limits::P1;
        short.wall = Duration::from_millis(300);
        let v = serde_json::to_value(short).unwrap();
        assert_eq!(v["wall_seconds"], 0.3);
        let back: Limits = serde_json::from_value(v).unwrap();
        assert_eq!(back, short);
    }

    #[test]
    fn seccomp_serializes_with_its_mode() {
        assert_eq!(
            serde_json::to_value(Seccomp::DenyList).unwrap(),
            serde_json::json!({"mode": "deny_list"})
        );
        assert_eq!(
            serde_json::to_value(Seccomp::AllowList {
                extra: vec!["ptrace".into()]
            })
            .unwrap(),
            serde_json::json!({"mode": "allow_list", "extra": ["ptrace"]})
        );
    }
}
