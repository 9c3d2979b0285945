//! Long-lived sandboxes: an MCP server's, started by the broker like every
//! other sandbox (admission, the tenant's host ids, volumes, credentials,
//! egress audit), for the gateway to speak to over its stdio.

use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cordon_audit::AuditRecord;
use cordon_policy::policy::ToolPolicy;
use cordon_runtime::{Context, Outcome, RunError, SandboxHandle, Use};

use crate::{Broker, Caller, Decision, EgressEvent, audit_event, profile_name};

/// Sees each egress attempt of a server once it is audited (the gateway's
/// own diagnostic log).
pub type EgressObserver = Arc<dyn Fn(&EgressEvent) + Send + Sync>;

/// A server's sandbox, started by [`Broker::start_server`].
pub struct StartedServer {
    /// The broker's end of the server's stdio: what is written here is its
    /// stdin, what it writes to its stdout arrives here.
    pub stream: UnixStream,
    /// Stops the sandbox and ends its credential session.
    pub control: Arc<ServerControl>,
    /// Every mechanism of its sandbox that is not fully enforced here.
    pub warnings: Vec<String>,
}

/// Control of one running server sandbox.
#[derive(Debug)]
pub struct ServerControl {
    sandbox: Arc<dyn SandboxHandle>,
    /// The server's credentials: revoked once the sandbox is stopped (and
    /// when this is dropped).
    lease: Mutex<Option<cordon_secrets::Lease>>,
}

impl ServerControl {
    /// Kill the sandbox (every process in it) and revoke its credentials.
    /// Idempotent.
    pub fn stop(&self) {
        self.sandbox.kill();
        let lease = self.lease.lock().ok().and_then(|mut l| l.take());
        if let Some(l) = lease {
            l.revoke("the server's sandbox was stopped");
        }
    }

    /// How the sandbox ended, once it has: `None` while it runs.
    pub fn outcome(&self) -> Option<Result<Outcome, RunError>> {
        self.sandbox.outcome()
    }
}

impl Broker {
    /// Start `policy`'s server (its `exec`'s command, or the image's
    /// entrypoint) in a sandbox for `who`'s session: admitted for
    /// [`Use::Serve`], under the tenant's host ids, with the session's
    /// workspace and the tenant's state, its secrets minted for the session
    /// (revoked when it is stopped). The policy's `wall_seconds` bounds
    /// each call, not the server's life: the sandbox lives at most
    /// `lifetime`. Each egress attempt of the server gets an audit record
    /// of its own (its connections are not tied to one call), then goes to
    /// `observe`.
    pub fn start_server(
        &self,
        who: &Caller,
        policy: &ToolPolicy,
        lifetime: Duration,
        observe: Option<EgressObserver>,
    ) -> Result<StartedServer, String> {
        let mut admitted = self.registry.admit(policy, Use::Serve)?;
        admitted.spec.limits.wall = lifetime;
        admitted.spec.host_ids = self.tenant_ids(policy, &who.tenant)?;
        // Volumes after the host ids: their roots belong to the sandbox's uid.
        admitted.spec.volumes = self
            .volumes
            .prepare(&admitted.spec, &who.tenant, &who.session)?;
        let lease = self.mint(policy, &who.session)?;
        let credentials = match &lease {
            Some(l) => l.credentials()?,
            None => Default::default(),
        };
        let tool = policy.name.clone();
        let profile = profile_name(policy.profile);
        let audit = self.audit.clone();
        let ctx = Context {
            session: who.session.clone(),
            tenant: who.tenant.clone(),
            on_egress: Arc::new(move |e| {
                // The connection has closed: a record that cannot be
                // written is counted and said, the server goes on.
                let _ = audit.record_after(&egress_record(&tool, profile, "mcp", "mcp-server", &e));
                if let Some(o) = &observe {
                    o(&e);
                }
            }),
            credentials,
        };
        let spawned = admitted.spawn(&ctx).map_err(|e| e.to_string())?;
        Ok(StartedServer {
            stream: spawned.stream,
            control: Arc::new(ServerControl {
                sandbox: spawned.handle,
                lease: Mutex::new(lease),
            }),
            warnings: admitted.warnings,
        })
    }
}

/// The record of one egress attempt not tied to a call: a long-lived
/// server's (`runtime` `mcp`, `caller` `mcp-server`) or `cordon proxy`'s
/// (both `proxy`).
pub fn egress_record(
    tool: &str,
    profile: &str,
    runtime: &str,
    caller: &str,
    e: &EgressEvent,
) -> AuditRecord {
    let mut r = AuditRecord::new(tool, profile);
    r.runtime = runtime.into();
    r.session = e.session.clone();
    r.caller = caller.into();
    r.duration_ms = e.duration_ms;
    r.egress.push(audit_event(e));
    if e.decision == Decision::Refused {
        r.status = cordon_audit::Status::Denied;
        r.reason = Some(e.reason.clone());
    }
    if let Some(secret) = &e.exfiltration {
        r.reason = Some(format!(
            "exfiltration attempt (secret {secret}): {}",
            e.reason
        ));
    }
    r
}
