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

/// The disks' virtio serial numbers (`/sys/block/vd*/serial`): the guest
/// finds each by its own, whatever order the devices probe in.
pub const DISK_ROOT: &str = "cordon-root";
pub const DISK_CARRY: &str = "cordon-carry";
/// On the kernel command line when the guest has the carried disk.
pub const CARRY_ARG: &str = "cordon.carry=1";
/// Where the carried disk appears in the tool's root (read-only): the
/// paths of the files cordon carries in start with it.
pub const CARRY_MOUNT: &str = "/.cordon";

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
    /// Egress beyond the proxy door: the DNS door and the allowlist's
    /// `host:port` entries, as the native jail's doors give them.
    #[serde(default)]
    pub doors: Option<Doors>,
    /// seccomp filters the tool runs under, in install order, each
    /// instruction packed by [`pack_filter`] (the host builds them as the
    /// native jail does; the guest installs them last before `execve`).
    #[serde(default)]
    pub seccomp: Vec<Vec<u64>>,
    /// The trust bundle the tool's TLS clients use when credentials are
    /// substituted at the egress door (the host's roots plus the session
    /// CA): the init writes it into the tool's `/dev` and binds it over the
    /// image's own bundle files.
    #[serde(default)]
    pub trust: Option<Trust>,
}

impl Task {
    /// Whether the task has any network (the proxy door or the others).
    pub fn networked(&self) -> bool {
        !self.net.is_empty() || self.doors.is_some()
    }
}

/// The guest's side of the egress doors besides the proxy: what the
/// native jail sets up in a sandbox's own network namespace, with the
/// init's listeners standing for the doors and each connection carried to
/// the host over the network channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Doors {
    /// Networks made local on the guest's `lo` (the doors' reserved range,
    /// the allowlist's IPv4 literals): address and prefix length.
    pub local: Vec<(std::net::Ipv4Addr, u8)>,
    /// TCP ports the init listens on at `0.0.0.0` (the allowlist's ports):
    /// each connection goes to the host as the address the tool dialed.
    pub ports: Vec<u16>,
    /// The host's DNS door. The init answers DNS on `127.0.0.1:53` (UDP,
    /// and TCP) by carrying each query to it, and makes each IPv4 address
    /// of an answer local on `lo`, as the door does for a native sandbox.
    pub dns: Option<std::net::SocketAddr>,
}

/// A trust bundle for the tool's root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trust {
    /// The PEM bundle.
    pub pem: String,
    /// Where it is written: a file directly in `/dev` (the variables that
    /// name the trust bundle point there).
    pub path: String,
    /// The image's own bundle files it is bound over, read-only (regular
    /// files of the image, absolute).
    pub over: Vec<String>,
}

/// A BPF program as the task carries it: each instruction's code, jt, jf
/// and k in one `u64` (code in the top 16 bits, k in the low 32).
pub fn pack_filter(prog: &[libc::sock_filter]) -> Vec<u64> {
    prog.iter()
        .map(|i| {
            (u64::from(i.code) << 48)
                | (u64::from(i.jt) << 40)
                | (u64::from(i.jf) << 32)
                | u64::from(i.k)
        })
        .collect()
}

/// [`pack_filter`] undone.
pub fn unpack_filter(packed: &[u64]) -> Vec<libc::sock_filter> {
    packed
        .iter()
        .map(|&w| libc::sock_filter {
            code: (w >> 48) as u16,
            jt: (w >> 40) as u8,
            jf: (w >> 32) as u8,
            k: w as u32,
        })
        .collect()
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
    fn a_filter_survives_packing() {
        let prog = [
            libc::sock_filter {
                code: 0x20,
                jt: 0,
                jf: 0,
                k: 4,
            },
            libc::sock_filter {
                code: 0x15,
                jt: 1,
                jf: 255,
                k: 0xc000_003e,
            },
            libc::sock_filter {
                code: 0x06,
                jt: 0,
                jf: 0,
                k: 0x7fff_0000,
            },
        ];
        let back = unpack_filter(&pack_filter(&prog));
        assert_eq!(back.len(), prog.len());
        for (a, b) in prog.iter().zip(&back) {
            assert_eq!((a.code, a.jt, a.jf, a.k), (b.code, b.jt, b.jf, b.k));
        }
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
        assert!(t.seccomp.is_empty());
        assert!(t.trust.is_none());
        assert!(t.doors.is_none());
        assert!(
            serde_json::from_str::<Task>(
                r#"{"argv":["/bin/true"],"uid":0,"gid":0,"entropy":"00","time_ns":1,"x":1}"#
            )
            .is_err()
        );
    }
}
