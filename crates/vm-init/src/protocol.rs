//! What the host and the guest init say to each other on the control port:
//! one JSON object per line, in each direction.
//!
//! 1. The init, once it has mounted the tool's root and opened its ports,
//!    writes [`GuestMessage::Ready`].
//! 2. The host writes one [`Task`] (a template guest is snapshotted between
//!    1 and 2, and every restored copy gets its own task, so fresh entropy
//!    and the clock travel with it).
//! 3. The init writes one final [`GuestMessage`]: `exited`, `signaled` or
//!    `error`, and powers the guest off.

use serde::{Deserialize, Serialize};

/// The virtio-serial port names (`/sys/class/virtio-ports/*/name`).
pub const PORT_CONTROL: &str = "cordon.ctl";
pub const PORT_STDIN: &str = "cordon.stdin";
pub const PORT_STDOUT: &str = "cordon.stdout";
pub const PORT_STDERR: &str = "cordon.stderr";
/// The network channel: TCP streams from the guest's loopback to the
/// host's, multiplexed (`crate::mux`). Always present, used only by a task
/// with [`Task::net`] ports.
pub const PORT_NET: &str = "cordon.net";

/// Bytes of host entropy a task carries.
pub const ENTROPY_BYTES: usize = 64;

/// One task for one guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// The program and its arguments; a program without `/` is looked up
    /// in the `PATH` of `env`.
    pub argv: Vec<String>,
    /// The tool's whole environment.
    #[serde(default)]
    pub env: Vec<(String, String)>,
    /// Working directory inside the tool's root.
    #[serde(default = "default_cwd")]
    pub cwd: String,
    pub uid: u32,
    pub gid: u32,
    #[serde(default)]
    pub limits: Limits,
    /// Fresh bytes from the host's generator, hex: the guest mixes them in
    /// and reseeds before the tool starts.
    pub entropy: String,
    /// The host's wall clock, nanoseconds since the epoch.
    pub time_ns: u64,
    /// Loopback ports the init listens on in the guest, each connection
    /// carried over the network channel to the same port on the host's
    /// loopback (cordon's egress proxy door). Empty: no network at all.
    #[serde(default)]
    pub net: Vec<u16>,
}

fn default_cwd() -> String {
    "/".to_owned()
}

/// Limits the init applies inside the guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Size of the tool's `/tmp` tmpfs.
    pub tmp_mib: u64,
    /// `memory.max` of the task's cgroup (RLIMIT_AS when the guest kernel
    /// has no cgroup v2 memory controller).
    pub memory_mib: Option<u64>,
    /// `pids.max` of the task's cgroup (RLIMIT_NPROC without cgroup v2).
    pub pids: Option<u64>,
    /// RLIMIT_NOFILE.
    pub nofile: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            tmp_mib: 64,
            memory_mib: None,
            pids: None,
            nofile: 1024,
        }
    }
}

/// How the init bounded the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitKind {
    /// A cgroup v2 in the guest (memory.max, pids.max).
    Cgroup,
    /// Resource limits only (RLIMIT_AS, RLIMIT_NPROC).
    Rlimit,
}

/// A line the init writes on the control port.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "status", rename_all = "snake_case", deny_unknown_fields)]
pub enum GuestMessage {
    /// Waiting for its task; the guest's uptime in milliseconds.
    Ready { uptime_ms: u64 },
    /// The tool exited with `code`.
    Exited { code: i32, limits: LimitKind },
    /// The tool was killed by `signal`; `oom` when the guest's OOM killer
    /// did it (the task cgroup's `oom_kill` count went up).
    Signaled {
        signal: i32,
        oom: bool,
        limits: LimitKind,
    },
    /// The init could not run the task: which step, and why.
    Error { stage: String, message: String },
}

impl GuestMessage {
    /// The message as one line, newline included.
    pub fn to_line(&self) -> String {
        let mut s = serde_json::to_string(self).unwrap_or_else(|e| {
            format!(r#"{{"status":"error","stage":"encode","message":"{e}"}}"#)
        });
        s.push('\n');
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_one_tagged_line() {
        let m = GuestMessage::Exited {
            code: 3,
            limits: LimitKind::Cgroup,
        };
        let line = m.to_line();
        assert_eq!(
            line,
            "{\"status\":\"exited\",\"code\":3,\"limits\":\"cgroup\"}\n"
        );
        let back: GuestMessage = serde_json::from_str(line.trim_end()).unwrap();
        assert_eq!(back, m);
    }

    #[test]
    fn a_task_takes_defaults_and_refuses_unknown_fields() {
        let t: Task = serde_json::from_str(
            r#"{"argv":["/bin/true"],"uid":0,"gid":0,"entropy":"00","time_ns":1}"#,
        )
        .unwrap();
        assert_eq!(t.cwd, "/");
        assert_eq!(t.limits, Limits::default());
        assert!(t.net.is_empty());
        assert!(
            serde_json::from_str::<Task>(
                r#"{"argv":["/bin/true"],"uid":0,"gid":0,"entropy":"00","time_ns":1,"x":1}"#
            )
            .is_err()
        );
    }
}
