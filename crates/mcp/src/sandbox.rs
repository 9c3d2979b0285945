//! Long-lived MCP servers inside their sandbox.
//!
//! [`ServerSandbox`] is the one seam between the gateway and the sandbox
//! that hosts a third-party server: start a server from its resolved policy
//! and get back a byte stream (the server's stdio) and a handle to stop it.
//! [`JailSandbox`] implements it with the native P1/P2 jail.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cordon_jail::{Jail, Status, Stdin};
use cordon_policy::policy::{Exec, ToolPolicy};
use tokio::io::{AsyncRead, AsyncWrite};

/// A started server: its stdio as one byte stream, and its handle.
pub struct ServerProcess {
    pub reader: Box<dyn AsyncRead + Send + Unpin>,
    pub writer: Box<dyn AsyncWrite + Send + Unpin>,
    pub handle: Arc<dyn ServerHandle>,
}

/// Control of one running sandboxed server.
pub trait ServerHandle: Send + Sync + std::fmt::Debug {
    /// Kill the sandbox (every process in it). Idempotent.
    fn kill(&self);
    /// `Some(how it ended)` once the sandbox is gone: the sandbox's reason
    /// (exit status, signal, limit) and the tail of the server's stderr. The
    /// text is the server's own and untrusted: gate it before showing it.
    fn exited(&self) -> Option<String>;
}

/// Starts MCP servers in a sandbox.
pub trait ServerSandbox: Send + Sync {
    /// Start the server `argv` under `policy` (its limits, network, mounts,
    /// environment, seccomp). The server speaks MCP on its stdin/stdout.
    fn start(&self, policy: &ToolPolicy, argv: &[String]) -> Result<ServerProcess, String>;
}

/// [`ServerSandbox`] over the native jail: the server runs in fresh
/// namespaces with the policy's limits, and its stdin and stdout are one end
/// of a socket pair (the jail hands the socket in as stdin; a `/bin/sh`
/// prologue inside the sandbox points stdout at it, then execs the server).
///
/// The policy's `wall_seconds` bounds each call, not the server's life: the
/// sandbox itself lives at most `max_lifetime` (the session's end or a
/// restart stops it sooner).
pub struct JailSandbox {
    jail: Arc<Jail>,
    max_lifetime: Duration,
    audit: Option<Arc<cordon_audit::AuditLog>>,
}

impl JailSandbox {
    pub fn new(jail: Arc<Jail>, max_lifetime: Duration) -> JailSandbox {
        JailSandbox {
            jail,
            max_lifetime,
            audit: None,
        }
    }

    /// Write one audit record per egress attempt of a server (its
    /// connections are not tied to one call, so each gets its own record).
    pub fn with_audit(mut self, audit: Arc<cordon_audit::AuditLog>) -> JailSandbox {
        self.audit = Some(audit);
        self
    }
}

/// The argv that runs `server` with stdout on the stdin socket.
pub fn stdio_wrapper(server: &[String]) -> Vec<String> {
    let mut argv = vec![
        "/bin/sh".to_string(),
        "-c".to_string(),
        "exec \"$@\" >&0".to_string(),
        "cordon-mcp-server".to_string(),
    ];
    argv.extend(server.iter().cloned());
    argv
}

#[derive(Debug)]
struct JailHandle {
    tool: String,
    /// Inode of the sandbox's end of the socket pair: how its processes are
    /// found in /proc.
    inode: u64,
    done: Mutex<Option<String>>,
}

impl ServerHandle for JailHandle {
    fn kill(&self) {
        if self.exited().is_some() {
            return;
        }
        for pid in holders(self.inode) {
            // The sandbox's first process is pid 1 of its pid namespace:
            // killing it kills every process in the sandbox.
            if let Err(e) = cordon_sys::io::kill_pid(pid) {
                tracing::debug!(tool = %self.tool, pid, "kill: {e:?}");
            }
        }
    }

    fn exited(&self) -> Option<String> {
        self.done.lock().ok().and_then(|d| d.clone())
    }
}

/// Pids of processes in a child pid namespace whose stdin is the socket
/// with this inode (never this process).
fn holders(inode: u64) -> Vec<i32> {
    let me = std::process::id() as i32;
    let want = format!("socket:[{inode}]");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return vec![];
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(link) = std::fs::read_link(format!("/proc/{pid}/fd/0")) else {
            continue;
        };
        if link.as_os_str() != want.as_str() {
            continue;
        }
        // Only processes of a sandbox: their NSpid line has more than one
        // entry (a pid in each nested namespace).
        let nested = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("NSpid:"))
                    .map(|l| l.split_whitespace().count() > 2)
            })
            .unwrap_or(false);
        if nested {
            out.push(pid);
        }
    }
    out
}

fn socket_inode(fd: &impl AsRawFd) -> Result<u64, String> {
    std::fs::metadata(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map(|m| m.ino())
        .map_err(|e| format!("stat the server's socket: {e}"))
}

impl ServerSandbox for JailSandbox {
    fn start(&self, policy: &ToolPolicy, argv: &[String]) -> Result<ServerProcess, String> {
        let mut p = policy.clone();
        p.exec = Exec::Command {
            argv: stdio_wrapper(argv),
        };
        let (mut spec, egress) = cordon_broker::jail_spec(&p)?;
        // The doors are served on the gateway's runtime, from the thread
        // that runs the sandbox (never one of the runtime's workers).
        let rt = match &egress {
            None => None,
            Some(_) => Some(tokio::runtime::Handle::try_current().map_err(|e| {
                format!(
                    "{}: the server has egress, and its doors need the gateway's async runtime: {e}",
                    policy.name
                )
            })?),
        };
        spec.limits.wall = self.max_lifetime;
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()
            .map_err(|e| format!("{}: socket pair for the server: {e}", policy.name))?;
        let inode = socket_inode(&theirs)?;
        let handle = Arc::new(JailHandle {
            tool: policy.name.clone(),
            inode,
            done: Mutex::new(None),
        });
        let jail = self.jail.clone();
        let audit = self.audit.clone();
        let profile = cordon_broker::profile_name(policy.profile);
        let h = handle.clone();
        let stdin: OwnedFd = theirs.into();
        std::thread::Builder::new()
            .name(format!("mcp-{}", policy.name))
            .spawn(move || {
                let ran = match (egress, rt) {
                    (Some(ep), Some(rt)) => {
                        let tool = spec.tool.clone();
                        cordon_broker::run_with_doors(
                            &jail,
                            &rt,
                            "serve",
                            &spec,
                            ep,
                            Stdin::Fd(stdin),
                            move |e| log_egress(&tool, profile, audit.as_deref(), &e),
                        )
                    }
                    _ => jail.run(&spec, Stdin::Fd(stdin)),
                };
                let report = match ran {
                    Ok(o) => {
                        let mut r = match o.status {
                            Status::Ok => format!("{}: the server exited (status 0)", spec.tool),
                            _ => o.reason.clone(),
                        };
                        let tail = tail(&o.stderr, 2048);
                        if !tail.trim().is_empty() {
                            r.push_str("; stderr: ");
                            r.push_str(tail.trim());
                        }
                        r
                    }
                    Err(e) => e.to_string(),
                };
                if let Ok(mut d) = h.done.lock() {
                    *d = Some(report);
                }
            })
            .map_err(|e| format!("{}: start the server thread: {e}", policy.name))?;
        ours.set_nonblocking(true)
            .map_err(|e| format!("{}: server socket: {e}", policy.name))?;
        let stream = tokio::net::UnixStream::from_std(ours)
            .map_err(|e| format!("{}: server socket: {e}", policy.name))?;
        let (r, w) = stream.into_split();
        Ok(ServerProcess {
            reader: Box::new(r),
            writer: Box::new(w),
            handle,
        })
    }
}

/// One egress attempt of a long-lived server. A server's connections are
/// not tied to one call, so each gets an audit record of its own (and a
/// diagnostic log line).
fn log_egress(
    tool: &str,
    profile: &str,
    audit: Option<&cordon_audit::AuditLog>,
    e: &cordon_broker::EgressEvent,
) {
    if let Some(log) = audit {
        let mut r = cordon_audit::AuditRecord::new(tool, profile);
        r.runtime = "mcp".into();
        r.session = e.session.clone();
        r.caller = "mcp-server".into();
        r.duration_ms = e.duration_ms;
        r.egress.push(cordon_broker::audit_event(e));
        if e.decision == cordon_broker::Decision::Refused {
            r.status = cordon_audit::Status::Denied;
            r.reason = Some(e.reason.clone());
        }
        if let Err(err) = log.record(&r) {
            tracing::warn!(tool, "audit record of an egress attempt not written: {err}");
        }
    }
    let target = format!("{}:{}", e.name, e.port);
    match e.decision {
        cordon_broker::Decision::Allowed => tracing::info!(
            tool,
            target = %target,
            bytes_up = e.bytes_up,
            bytes_down = e.bytes_down,
            "egress allowed: {}",
            e.reason
        ),
        cordon_broker::Decision::Refused => {
            tracing::warn!(tool, target = %target, "egress refused: {}", e.reason)
        }
    }
}

fn tail(bytes: &[u8], max: usize) -> String {
    let start = bytes.len().saturating_sub(max);
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}
