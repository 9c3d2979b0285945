//! Long-lived MCP servers inside their sandbox.
//!
//! [`ServerSandbox`] is the gateway's side of the runtime seam: start a
//! server from its resolved policy and get back a byte stream (the server's
//! stdio) and a handle to stop it. [`RuntimeServers`] implements it by
//! asking the broker ([`Broker::start_server`]): the policy is admitted
//! for `Use::Serve` (the same refusals as every other path), set up as
//! every other sandbox is, and the chosen runtime spawns it.

use std::sync::Arc;
use std::time::Duration;

use cordon_broker::{Broker, Status};
use cordon_policy::policy::{Exec, ToolPolicy};
use tokio::io::{AsyncRead, AsyncWrite};

/// A started server: its stdio as one byte stream, and its handle.
pub struct ServerProcess {
    pub reader: Box<dyn AsyncRead + Send + Unpin>,
    pub writer: Box<dyn AsyncWrite + Send + Unpin>,
    pub handle: Arc<dyn ServerHandle>,
    /// Every mechanism of its sandbox that is not fully enforced here.
    pub warnings: Vec<String>,
}

/// Control of one running sandboxed server.
pub trait ServerHandle: Send + Sync + std::fmt::Debug {
    /// Kill the sandbox (every process in it). Idempotent.
    fn kill(&self);
    /// `Some(how it ended)` once the sandbox is gone: the sandbox's reason
    /// (exit status, signal, limit) and the tail of the server's stderr. The
    /// text is the server's own and untrusted: gate it before showing it.
    fn exited(&self) -> Option<String>;
    /// The live tokens of the server's credential session, for the output
    /// gate (none once it is stopped, or without secrets).
    ///
    /// No default: a handle that wraps another must pass this through.
    fn live_tokens(&self) -> cordon_gate::LiveTokens;
    /// The egress its sandbox was refused ([`crate::refusals`]), when the
    /// runtime reports it. No default, for the same reason.
    fn refusals(&self) -> Option<&crate::refusals::Refusals>;
}

/// Starts MCP servers in a sandbox.
pub trait ServerSandbox: Send + Sync {
    /// Start the server `argv` under `policy` (its limits, network, mounts,
    /// environment, seccomp, workspace and state) for the session, tenant and principal of `who`; an empty
    /// `argv` runs the image's entrypoint. The server speaks MCP on its
    /// stdin/stdout. Its secrets are minted for `who`'s session as the sandbox
    /// starts and revoked when it is stopped.
    fn start(
        &self,
        who: &cordon_broker::Caller,
        policy: &ToolPolicy,
        argv: &[String],
    ) -> Result<ServerProcess, String>;
}

/// [`ServerSandbox`] over the broker: each server's sandbox is started by
/// [`Broker::start_server`], like every other sandbox (admission,
/// credentials, tenant host ids, volumes, egress audit).
///
/// The policy's `wall_seconds` bounds each call, not the server's life: the
/// sandbox itself lives at most `max_lifetime` (the session's end or a
/// restart stops it sooner).
pub struct RuntimeServers {
    broker: Arc<Broker>,
    max_lifetime: Duration,
}

impl RuntimeServers {
    pub fn new(broker: Arc<Broker>, max_lifetime: Duration) -> RuntimeServers {
        RuntimeServers {
            broker,
            max_lifetime,
        }
    }
}

#[derive(Debug)]
struct Handle {
    tool: String,
    inner: Arc<cordon_broker::ServerControl>,
    refused: Arc<crate::refusals::Refusals>,
}

impl ServerHandle for Handle {
    fn kill(&self) {
        self.inner.stop();
    }

    fn exited(&self) -> Option<String> {
        let r = self.inner.outcome()?;
        Some(match r {
            Ok(o) => {
                let mut r = match o.status {
                    Status::Ok => format!("{}: the server exited (status 0)", self.tool),
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
        })
    }

    fn live_tokens(&self) -> cordon_gate::LiveTokens {
        self.inner.live_tokens()
    }

    fn refusals(&self) -> Option<&crate::refusals::Refusals> {
        Some(&self.refused)
    }
}

impl ServerSandbox for RuntimeServers {
    fn start(
        &self,
        who: &cordon_broker::Caller,
        policy: &ToolPolicy,
        argv: &[String],
    ) -> Result<ServerProcess, String> {
        let mut p = policy.clone();
        if let Exec::Mcp { command, .. } = &mut p.exec
            && !argv.is_empty()
        {
            *command = Some(argv.to_vec());
        }
        let tool = policy.name.clone();
        let t = tool.clone();
        let refused = Arc::new(crate::refusals::Refusals::default());
        let r = refused.clone();
        let started = self.broker.start_server(
            who,
            &p,
            self.max_lifetime,
            Some(Arc::new(move |e| {
                log_egress(&t, e);
                if e.decision == cordon_broker::Decision::Refused {
                    r.push(&format!("{}:{}", e.name, e.port), &e.reason);
                }
            })),
        )?;
        started
            .stream
            .set_nonblocking(true)
            .map_err(|e| format!("{tool}: server socket: {e}"))?;
        let stream = tokio::net::UnixStream::from_std(started.stream)
            .map_err(|e| format!("{tool}: server socket: {e}"))?;
        let (r, w) = stream.into_split();
        Ok(ServerProcess {
            reader: Box::new(r),
            writer: Box::new(w),
            handle: Arc::new(Handle {
                tool,
                inner: started.control,
                refused,
            }),
            warnings: started.warnings,
        })
    }
}

/// One egress attempt of a long-lived server, in the gateway's diagnostic
/// log (its audit record is the broker's).
fn log_egress(tool: &str, e: &cordon_broker::EgressEvent) {
    let target = format!("{}:{}", e.name, e.port);
    match e.decision {
        cordon_broker::Decision::Allowed => tracing::info!(
            tool,
            target = %target,
            bytes_up = e.bytes_up,
            bytes_down = e.bytes_down,
            injected = ?e.injected,
            "egress allowed: {}",
            e.reason
        ),
        cordon_broker::Decision::Refused => match &e.exfiltration {
            Some(secret) => tracing::warn!(
                tool,
                target = %target,
                secret = %secret,
                "egress refused as an exfiltration attempt: {}",
                e.reason
            ),
            None => tracing::warn!(tool, target = %target, "egress refused: {}", e.reason),
        },
    }
}

fn tail(bytes: &[u8], max: usize) -> String {
    let start = bytes.len().saturating_sub(max);
    String::from_utf8_lossy(&bytes[start..]).into_owned()
}
