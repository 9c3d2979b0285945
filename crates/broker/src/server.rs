//! Long-lived sandboxes: an MCP server's, started by the broker like every
//! other sandbox (admission, the tenant's host ids, volumes, credentials,
//! egress audit), for the gateway to speak to over its stdio.

use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cordon_audit::{AuditRecord, Auditor};
use cordon_policy::policy::ToolPolicy;
use cordon_runtime::{Context, EgressSink, Outcome, Placement, RunError, SandboxHandle, Use};

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
        let lease = self.lease.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(l) = lease
            && let Err(e) = l.revoke("the server's sandbox was stopped")
        {
            eprintln!("cordon: {e}");
        }
    }

    /// The matcher of the live tokens of the server's credential session,
    /// for the output gate: empty once it is stopped, or without secrets.
    pub fn live_tokens(&self) -> cordon_gate::LiveTokens {
        let lease = self.lease.lock().unwrap_or_else(|p| p.into_inner());
        let live = lease.as_ref().map(|l| l.live_tokens()).unwrap_or_default();
        cordon_gate::LiveTokens::new(
            live.iter()
                .map(|(name, token, ph)| (name.as_str(), token.as_str(), ph.as_str())),
        )
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
        let admitted = self.registry.admit(policy, Use::Serve)?;
        let host_ids = self.tenant_ids(policy, &who.tenant)?;
        // Volumes after the host ids: their roots belong to the sandbox's uid.
        let volumes = self
            .volumes
            .prepare(&admitted.spec, host_ids, &who.tenant, &who.session)?;
        let lease = self.mint(policy, &who.session)?;
        let credentials = match &lease {
            Some(l) => l.credentials()?,
            None => Default::default(),
        };
        let ctx = Context {
            session: who.session.clone(),
            tenant: who.tenant.clone(),
            on_egress: server_egress(self.audit.clone(), policy, observe),
            credentials,
            placement: Placement {
                host_ids,
                volumes,
                lifetime: Some(lifetime),
            },
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

/// Where a server's egress attempts go: each its own audit record, then to
/// `observe`. The connection has closed when its event comes: a record that
/// cannot be written is counted and said (`cordon doctor`, the next call's
/// warnings), and the server goes on.
fn server_egress(
    audit: Arc<Auditor>,
    policy: &ToolPolicy,
    observe: Option<EgressObserver>,
) -> EgressSink {
    let tool = policy.name.clone();
    let profile = profile_name(policy.profile);
    Arc::new(move |e| {
        // Not dropped: the auditor says it on stderr (`cordon serve`'s
        // error line), counts it and keeps it for the next call's warnings.
        let _said = audit.record_after(&egress_record(&tool, profile, "mcp", "mcp-server", &e));
        if let Some(o) = &observe {
            o(&e);
        }
    })
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

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_audit::{AuditLog, FileSink, Rotation};

    fn event() -> EgressEvent {
        EgressEvent {
            tool: "srv".into(),
            session: "mcp-http-1-0".into(),
            name: "evil.test".into(),
            port: 443,
            address: None,
            door: cordon_egress::Door::Proxy,
            decision: Decision::Refused,
            reason: "not in the allowlist of srv".into(),
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 1,
            time: String::new(),
            injected: Vec::new(),
            exfiltration: None,
            reflected: Vec::new(),
        }
    }

    fn policy() -> ToolPolicy {
        let m = "version: 1\ntools:\n  srv:\n    profile: P1\n    description: d\n    mcp:\n      command: [/bin/true]\n";
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cordon.yaml");
        std::fs::write(&path, m).unwrap();
        cordon_policy::load(&path).unwrap().policy.tools["srv"].clone()
    }

    #[test]
    fn a_servers_egress_is_recorded_or_its_loss_counted_and_said() {
        let dir = tempfile::tempdir().unwrap();
        let p = policy();
        let seen = Arc::new(Mutex::new(0));
        let s = seen.clone();
        let observe: EgressObserver = Arc::new(move |_| *s.lock().unwrap() += 1);
        // Positive control: a writable log gets the record.
        let path = dir.path().join("audit.jsonl");
        let ok = Arc::new(Auditor::new(
            AuditLog::new().with_sink(FileSink::open(&path, Rotation::default()).unwrap()),
            false,
        ));
        server_egress(ok, &p, Some(observe.clone()))(event());
        let log = std::fs::read_to_string(&path).unwrap();
        let rec: serde_json::Value = serde_json::from_str(log.trim()).unwrap();
        assert_eq!(rec["runtime"], "mcp");
        assert_eq!(rec["caller"], "mcp-server");
        assert_eq!(rec["status"], "denied");
        assert_eq!(rec["egress"][0]["name"], "evil.test");
        // A log that cannot be written: counted, and said to the next call.
        let counted = dir.path().join("unwritten.jsonl");
        let full = Arc::new(
            Auditor::new(
                AuditLog::new()
                    .with_sink(FileSink::open("/dev/full", Rotation::default()).unwrap()),
                false,
            )
            .with_unwritten_file(counted.clone()),
        );
        server_egress(full.clone(), &p, Some(observe))(event());
        let u = cordon_audit::read_unwritten(&counted).unwrap();
        assert_eq!(u.count, 1);
        assert_eq!(u.last.as_ref().unwrap().what, "egress");
        assert_eq!(u.last.as_ref().unwrap().tool, "srv");
        let w = full.take_warnings();
        assert!(
            w.len() == 1 && w[0].contains("the audit record of egress (srv, session mcp-http-1-0)"),
            "{w:?}"
        );
        // The gateway's own log sees every event either way.
        assert_eq!(*seen.lock().unwrap(), 2);
    }
}
