//! Long-lived MCP servers inside their sandbox.
//!
//! [`ServerSandbox`] is the gateway's side of the runtime seam: start a
//! server from its resolved policy and get back a byte stream (the server's
//! stdio) and a handle to stop it. [`RuntimeServers`] implements it over
//! the runtime registry: the policy is admitted for [`Use::Serve`] (the
//! same refusals as every other path) and the chosen runtime spawns it.

use std::sync::Arc;
use std::time::Duration;

use cordon_policy::policy::{Exec, ToolPolicy};
use cordon_runtime::{Context, Registry, SandboxHandle, Status, Use};
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

/// [`ServerSandbox`] over the runtime registry.
///
/// The policy's `wall_seconds` bounds each call, not the server's life: the
/// sandbox itself lives at most `max_lifetime` (the session's end or a
/// restart stops it sooner).
pub struct RuntimeServers {
    registry: Registry,
    max_lifetime: Duration,
    audit: Option<Arc<cordon_audit::AuditLog>>,
    credentials: Option<Arc<cordon_broker::CredentialBroker>>,
    /// Host uids per tenant (`None`: every server maps to the shared one).
    tenant_uids: Option<cordon_broker::tenant_uids::Availability>,
    /// Session workspaces and per-tenant states (`None`: a server that
    /// declares either is refused).
    volumes: Option<Arc<cordon_runtime::Volumes>>,
}

impl RuntimeServers {
    pub fn new(registry: Registry, max_lifetime: Duration) -> RuntimeServers {
        RuntimeServers {
            registry,
            max_lifetime,
            audit: None,
            credentials: None,
            tenant_uids: None,
            volumes: None,
        }
    }

    /// Run each tenant's servers under its own host uid where `uids` is
    /// in force.
    pub fn with_tenant_uids(
        mut self,
        uids: cordon_broker::tenant_uids::Availability,
    ) -> RuntimeServers {
        self.tenant_uids = Some(uids);
        self
    }

    /// Mount each server's workspace and state from `volumes` (the
    /// broker's, so that a session's command tools and servers share its
    /// workspace).
    pub fn with_volumes(mut self, volumes: Arc<cordon_runtime::Volumes>) -> RuntimeServers {
        self.volumes = Some(volumes);
        self
    }

    /// Mint each server's secrets through `broker` (without one, a server
    /// that declares secrets is refused at admission).
    pub fn with_credentials(
        mut self,
        broker: Arc<cordon_broker::CredentialBroker>,
    ) -> RuntimeServers {
        self.credentials = Some(broker);
        self
    }

    /// Write one audit record per egress attempt of a server (its
    /// connections are not tied to one call, so each gets its own record).
    pub fn with_audit(mut self, audit: Arc<cordon_audit::AuditLog>) -> RuntimeServers {
        self.audit = Some(audit);
        self
    }
}

#[derive(Debug)]
struct Handle {
    tool: String,
    inner: Arc<dyn SandboxHandle>,
    /// The server's credentials: revoked once the sandbox is stopped (and
    /// when the handle is dropped).
    lease: std::sync::Mutex<Option<cordon_secrets::Lease>>,
}

impl ServerHandle for Handle {
    fn kill(&self) {
        self.inner.kill();
        let lease = self.lease.lock().ok().and_then(|mut l| l.take());
        if let Some(l) = lease {
            l.revoke("the server's sandbox was stopped");
        }
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
}

impl ServerSandbox for RuntimeServers {
    fn start(
        &self,
        who: &cordon_broker::Caller,
        policy: &ToolPolicy,
        argv: &[String],
    ) -> Result<ServerProcess, String> {
        let session = who.session.as_str();
        let mut p = policy.clone();
        if let Exec::Mcp { command, .. } = &mut p.exec
            && !argv.is_empty()
        {
            *command = Some(argv.to_vec());
        }
        let mut admitted = self.registry.admit(&p, Use::Serve)?;
        admitted.spec.limits.wall = self.max_lifetime;
        if let Some(u) = &self.tenant_uids {
            admitted.spec.host_ids = u.ids_for(policy, &who.tenant)?;
        }
        // Volumes after the host ids: their roots belong to the sandbox's uid.
        if let Some(v) = &self.volumes {
            admitted.spec.volumes = v.prepare(&admitted.spec, &who.tenant, session)?;
        }
        let tool = policy.name.clone();
        let profile = cordon_broker::profile_name(policy.profile);
        let audit = self.audit.clone();
        let t = tool.clone();
        let lease = match (&self.credentials, policy.secrets.is_empty()) {
            (_, true) => None,
            (Some(cb), false) => Some(cb.mint(&p, session)?),
            (None, false) => {
                return Err(format!(
                    "{tool}: declares secrets, but no credential broker is configured; refusing rather than running without them"
                ));
            }
        };
        let credentials = match &lease {
            Some(l) => l.credentials()?,
            None => Default::default(),
        };
        let ctx = Context {
            session: session.to_string(),
            tenant: who.tenant.clone(),
            on_egress: Arc::new(move |e| log_egress(&t, profile, audit.as_deref(), &e)),
            credentials,
        };
        let spawned = admitted.spawn(&ctx).map_err(|e| e.to_string())?;
        drop(ctx);
        spawned
            .stream
            .set_nonblocking(true)
            .map_err(|e| format!("{tool}: server socket: {e}"))?;
        let stream = tokio::net::UnixStream::from_std(spawned.stream)
            .map_err(|e| format!("{tool}: server socket: {e}"))?;
        let (r, w) = stream.into_split();
        Ok(ServerProcess {
            reader: Box::new(r),
            writer: Box::new(w),
            handle: Arc::new(Handle {
                tool,
                inner: spawned.handle,
                lease: std::sync::Mutex::new(lease),
            }),
            warnings: admitted.warnings,
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
        if let Some(secret) = &e.exfiltration {
            r.reason = Some(format!(
                "exfiltration attempt (secret {secret}): {}",
                e.reason
            ));
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
