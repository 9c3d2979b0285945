//! cordon-broker: the call path: resolved policy -> sandbox -> output gate ->
//! audit record. `cordon run`, `cordon exec` and `cordon serve` all call
//! [`Broker::call`], and the MCP gateway starts its servers' sandboxes with
//! [`Broker::start_server`]; nothing else launches a tool. Every audit
//! record goes through the broker's one [`Auditor`].
#![forbid(unsafe_code)]

mod pool_audit;
mod server;
pub mod tenant_uids;

pub use pool_audit::POOL_CALLER;
pub use server::{EgressObserver, ServerControl, StartedServer, egress_record};

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

pub use cordon_egress::{Decision, EgressEvent, EgressPolicy};

pub use cordon_audit::Auditor;
use cordon_audit::{
    AuditLog, AuditRecord, FileSink, GateSummary, Payload, Rotation, StderrSink, Timings,
};
use cordon_gate::{Gate, GatePolicy, Gated, LabelStyle, LiveTokens, StripPolicy, ToolMeta};
use cordon_policy::policy::{Profile, ToolPolicy};
use cordon_runtime::pool::Pool;
pub use cordon_runtime::{
    Admitted, Context, Mechanism, MechanismState, Outcome, Placement, Registry, RunError,
    SandboxHandle, SandboxSpec, State, Status, Use, Volumes,
};
pub use cordon_secrets::CredentialBroker;

/// Exit statuses of `cordon run`/`exec`, one per failure class (README).
pub mod exit {
    /// The tool ran and succeeded; the output passed the gate.
    pub const OK: u8 = 0;
    /// The tool exited non-zero or was killed by a signal.
    pub const TOOL_FAILED: u8 = 10;
    /// The tool ran past its wall-clock limit and was killed.
    pub const TIMED_OUT: u8 = 11;
    /// The tool exceeded its memory limit (OOM kill).
    pub const MEMORY_LIMIT: u8 = 12;
    /// The tool hit its task (process/thread) limit.
    pub const TASK_LIMIT: u8 = 13;
    /// The tool's output went over its cap.
    pub const OUTPUT_CAP: u8 = 14;
    /// The output gate refused the result (schema, type, encoding).
    pub const GATE_REFUSED: u8 = 15;
    /// The sandbox could not be set up; nothing ran.
    pub const SETUP_FAILED: u8 = 20;
    /// The policy refuses to run this tool here.
    pub const REFUSED: u8 = 21;
    /// The call's audit record could not be written; its result is withheld.
    pub const AUDIT_FAILED: u8 = 22;
}

/// Warm pools by (tenant, tool).
type Pools = std::collections::HashMap<(String, String), Arc<Pool>>;

/// Long-lived: the runtimes, the credential broker and the audit log.
pub struct Broker {
    registry: Registry,
    /// The one writer of every record (calls, egress, credential events,
    /// session ends, refusals).
    audit: Arc<Auditor>,
    /// Mints each call's secrets (`None`: tools with secrets are refused).
    credentials: Option<Arc<CredentialBroker>>,
    audit_warning: Option<String>,
    /// Compiled gates (JSON schemas compile once), keyed by their policy.
    gates: Mutex<std::collections::HashMap<String, Arc<Gate>>>,
    /// Warm pools of `lifetime: pool` tools, by tenant and tool (a pooled
    /// sandbox is never handed to another tenant); `None`: this broker
    /// keeps none (one-shot).
    pools: Option<Mutex<Pools>>,
    /// Whether each tenant's sandboxes get host uids of their own.
    tenant_uids: tenant_uids::Availability,
    /// Session workspaces and per-tenant states.
    volumes: Arc<Volumes>,
    /// Every call is its own session: its workspace goes when it returns.
    one_shot: bool,
    pub session: String,
    pub caller: String,
}

/// Who a call is for: the agent session, its client, the session's
/// principal and tenant. Everything made for a call (pooled sandboxes,
/// minted credentials) is its tenant's.
#[derive(Debug, Clone)]
pub struct Caller {
    pub session: String,
    /// The client, e.g. `cli`, `mcp:<client name>`.
    pub client: String,
    /// The authenticated principal (`None`: not known, e.g. `cordon run`).
    pub principal: Option<String>,
    pub tenant: String,
    /// The call's place in a distributed trace, recorded with it.
    pub trace: Option<cordon_audit::TraceContext>,
}

impl Caller {
    /// A caller of the default tenant without a principal.
    pub fn new(session: &str, client: &str) -> Caller {
        Caller {
            session: session.to_string(),
            client: client.to_string(),
            principal: None,
            tenant: cordon_runtime::DEFAULT_TENANT.to_string(),
            trace: None,
        }
    }
}

/// Why a call did not produce a gated result.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    /// The policy cannot be enforced here; nothing ran.
    #[error("{0}")]
    Refused(String),
    /// The sandbox could not be set up, or its result cannot be trusted.
    #[error("{0}")]
    Setup(String),
    /// The call ran but its audit record could not be written: the result
    /// is withheld (fail-closed audit).
    #[error("{0}")]
    Audit(String),
}

impl CallError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CallError::Refused(_) => exit::REFUSED,
            CallError::Setup(_) => exit::SETUP_FAILED,
            CallError::Audit(_) => exit::AUDIT_FAILED,
        }
    }
}

impl From<RunError> for CallError {
    fn from(e: RunError) -> CallError {
        match e {
            RunError::Refused(m) => CallError::Refused(m),
            RunError::Setup(m) => CallError::Setup(m),
        }
    }
}

/// One finished call: what the sandbox reported and, when it succeeded,
/// the gated output.
pub struct CallResult {
    pub outcome: Outcome,
    /// Every egress attempt, allowed or refused.
    pub egress: Vec<EgressEvent>,
    /// `Some` when the tool succeeded and the output passed the gate.
    pub gated: Option<Result<Gated, cordon_gate::GateRefusal>>,
}

impl CallResult {
    pub fn exit_code(&self) -> u8 {
        status_exit_code(self.outcome.status, &self.gated)
    }
}

fn status_exit_code(s: Status, gated: &Option<Result<Gated, cordon_gate::GateRefusal>>) -> u8 {
    match s {
        Status::Ok => match gated {
            Some(Err(_)) => exit::GATE_REFUSED,
            _ => exit::OK,
        },
        Status::Exited | Status::Killed => exit::TOOL_FAILED,
        Status::TimedOut => exit::TIMED_OUT,
        Status::MemoryLimit => exit::MEMORY_LIMIT,
        Status::TaskLimit => exit::TASK_LIMIT,
        Status::OutputCap => exit::OUTPUT_CAP,
    }
}

/// The limit a status names, for audit records.
pub fn limit_hit(s: Status) -> Option<&'static str> {
    match s {
        Status::TimedOut => Some("wall_seconds"),
        Status::MemoryLimit => Some("memory"),
        Status::TaskLimit => Some("tasks"),
        Status::OutputCap => Some("output_bytes"),
        _ => None,
    }
}

/// Where the audit log goes: `$CORDON_AUDIT`, else
/// /var/log/cordon/audit.jsonl as root, else `cordon/audit.jsonl` in
/// `$XDG_STATE_HOME` or `~/.local/state` (see `cordon_dirs`). `Err`: no
/// safe place (never a fixed path under /tmp), saying what to set.
pub fn default_audit_path() -> Result<PathBuf, String> {
    cordon_dirs::Dirs::current()
        .audit_log()
        .map_err(|e| e.to_string())
}

/// Where the audit records that could not be written are counted (read by
/// `cordon doctor`): `audit-unwritten.jsonl` in the state directory (see
/// `cordon_dirs`). `Err`: no safe place (never a fixed path under /tmp).
pub fn default_unwritten_path() -> Result<PathBuf, String> {
    cordon_dirs::Dirs::current()
        .state()
        .map(|d| d.join("audit-unwritten.jsonl"))
        .map_err(|e| e.to_string())
}

/// The one audit writer of a process: the log at `path` (see
/// [`open_audit`]), fail-open or not, counting the records it cannot write
/// in `unwritten` (default [`default_unwritten_path`]).
pub fn open_auditor(
    path: Option<PathBuf>,
    fail_open: bool,
    unwritten: Option<PathBuf>,
) -> Result<(Auditor, Option<String>), String> {
    let (log, warning) = open_audit(path, fail_open)?;
    let mut auditor = Auditor::new(log, fail_open);
    // Without a state directory the lost records are still said on stderr
    // and in the next call's warnings; only the count for doctor is absent.
    if let Ok(file) = unwritten.map_or_else(default_unwritten_path, Ok) {
        auditor = auditor.with_unwritten_file(file);
    }
    Ok((auditor, warning))
}

/// The audit log at `path` (default [`default_audit_path`]; `-` for
/// stderr). A log that cannot be opened is an error, unless `fail_open`:
/// then records go to stderr, with a warning.
pub fn open_audit(
    path: Option<PathBuf>,
    fail_open: bool,
) -> Result<(AuditLog, Option<String>), String> {
    let path = match path.map_or_else(default_audit_path, Ok) {
        Ok(p) => p,
        Err(e) if fail_open => {
            return Ok((
                AuditLog::new().with_sink(StderrSink),
                Some(format!(
                    "{e}; --audit-fail-open: audit records go to stderr"
                )),
            ));
        }
        Err(e) => return Err(format!("{e}; refusing to run tools unaudited")),
    };
    if path.as_os_str() == "-" {
        return Ok((AuditLog::new().with_sink(StderrSink), None));
    }
    match FileSink::open(&path, Rotation::default()) {
        Ok(s) => Ok((AuditLog::new().with_sink(s), None)),
        Err(e) if fail_open => Ok((
            AuditLog::new().with_sink(StderrSink),
            Some(format!(
                "audit log {} cannot be opened ({e}); --audit-fail-open: audit records go to stderr",
                path.display()
            )),
        )),
        Err(e) => Err(format!(
            "audit log {} cannot be opened ({e}); refusing to run tools unaudited (give --audit PATH, or --audit-fail-open to go on without it)",
            path.display()
        )),
    }
}

/// How a broker is made.
#[derive(Debug, Clone, Default)]
pub struct BrokerOptions {
    /// The audit log (default [`default_audit_path`]; `-`: stderr).
    pub audit: Option<PathBuf>,
    /// A record that cannot be written does not fail the call (announced).
    pub audit_fail_open: bool,
    /// The native runtime's options.
    pub native: cordon_runtime::native::Options,
    /// The credential broker (`None`: tools that declare secrets are
    /// refused).
    pub credentials: Option<Arc<CredentialBroker>>,
    /// A broker that makes one call and exits: no warm pools (`lifetime:
    /// pool` tools cold-start; a pool's sandboxes would start for nothing).
    pub one_shot: bool,
    /// Host uids per tenant (`None`: [`tenant_uids::TenantUids::discover`]).
    pub tenant_uids: Option<tenant_uids::Availability>,
    /// Where the egress doors resolve names (the CLI's reading of
    /// `CORDON_UPSTREAM_DNS`; default the host's resolver).
    pub upstream_dns: cordon_runtime::spec::UpstreamDns,
    /// Where audit records that could not be written are counted (`None`:
    /// [`default_unwritten_path`]).
    pub audit_unwritten: Option<PathBuf>,
}

impl BrokerOptions {
    /// For a process that makes one call (`cordon run`/`exec`): cgroup
    /// slots shared between such processes.
    pub fn one_shot(audit: Option<PathBuf>, audit_fail_open: bool) -> BrokerOptions {
        BrokerOptions {
            audit,
            audit_fail_open,
            native: cordon_runtime::native::Options::one_shot(),
            credentials: None,
            one_shot: true,
            tenant_uids: None,
            upstream_dns: Default::default(),
            audit_unwritten: None,
        }
    }
}

impl Broker {
    /// A broker with this build's runtimes for this host.
    pub fn new(opts: BrokerOptions) -> Result<Broker, String> {
        let registry =
            Registry::for_host(opts.native.clone()).with_upstream_dns(opts.upstream_dns.clone());
        Broker::with_registry(registry, &opts)
    }

    /// A broker over an existing registry (shared with a gateway or the
    /// probes).
    pub fn with_registry(registry: Registry, opts: &BrokerOptions) -> Result<Broker, String> {
        let (audit, audit_warning) = open_auditor(
            opts.audit.clone(),
            opts.audit_fail_open,
            opts.audit_unwritten.clone(),
        )?;
        let audit = Arc::new(audit);
        let mut registry = registry;
        if let Some(cb) = &opts.credentials {
            registry = registry.with_credentials(cb.clone());
            let log = audit.clone();
            cb.on_event(Arc::new(move |e| credential_event(&log, e)));
        }
        let mut audit_warning = audit_warning;
        if opts.audit_fail_open && audit_warning.is_none() {
            audit_warning = Some(
                "--audit-fail-open: a call whose audit record cannot be written still returns its result"
                    .into(),
            );
        }
        let volumes = Volumes::at_default_dirs(registry.sandbox_owner());
        Ok(Broker {
            registry,
            audit,
            credentials: opts.credentials.clone(),
            audit_warning,
            gates: Mutex::new(std::collections::HashMap::new()),
            pools: (!opts.one_shot).then(|| Mutex::new(std::collections::HashMap::new())),
            tenant_uids: opts
                .tenant_uids
                .clone()
                .unwrap_or_else(tenant_uids::TenantUids::discover),
            volumes,
            one_shot: opts.one_shot,
            session: format!("cli-{}", std::process::id()),
            caller: "cli".into(),
        })
    }

    /// The warm pool of a `lifetime: pool` tool (made on its first call),
    /// `None` for other tools or a one-shot broker, `Err` (the call
    /// cold-starts, saying why) when its sandbox cannot be pooled.
    fn pool_for(
        &self,
        policy: &ToolPolicy,
        tenant: &str,
        host_ids: Option<(u32, u32)>,
        admitted: &Admitted,
    ) -> Option<Result<Arc<Pool>, String>> {
        let settings = policy.pool?;
        let pools = self.pools.as_ref()?;
        let mut pools = pools.lock().unwrap_or_else(|p| p.into_inner());
        let key = (tenant.to_string(), policy.name.clone());
        if let Some(p) = pools.get(&key) {
            return Some(Ok(p.clone()));
        }
        // One status file per tenant's pool of the tool.
        use sha2::Digest as _;
        let tenant_key = hex::encode(sha2::Sha256::digest(tenant.as_bytes()));
        let made = Pool::observed(
            admitted.runtime.clone(),
            admitted.spec.clone(),
            host_ids,
            cordon_runtime::pool::Settings {
                size: settings.size as usize,
                refill: settings.refill,
            },
            cordon_runtime::pool::status_dir(),
            &format!("{}.{}", policy.name, &tenant_key[..12]),
            // Sandboxes that did not start or ended idle are audited.
            Some(pool_audit::observer(self.audit.clone(), policy, tenant)),
        );
        Some(match made {
            Ok(p) => {
                pools.insert(key, p.clone());
                Ok(p)
            }
            Err(e) => Err(format!("{e}; cold start")),
        })
    }

    /// Keep workspaces and states in `volumes` instead of the default
    /// directories.
    pub fn with_volumes(mut self, volumes: Arc<Volumes>) -> Broker {
        self.volumes = volumes;
        self
    }

    /// Session workspaces and per-tenant states (shared with the MCP
    /// server sandboxes of a gateway).
    pub fn volumes(&self) -> &Arc<Volumes> {
        &self.volumes
    }

    /// `who`'s session has ended: its workspace is destroyed, now or
    /// after `retain` (the longest its tools declare).
    pub fn end_session(&self, who: &Caller, retain: std::time::Duration) {
        self.volumes.end_session(&who.tenant, &who.session, retain);
    }

    /// The runtimes.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// The credential broker, when one is configured.
    pub fn credentials(&self) -> Option<&Arc<CredentialBroker>> {
        self.credentials.as_ref()
    }

    /// The one audit writer.
    pub fn auditor(&self) -> &Arc<Auditor> {
        &self.audit
    }

    /// The agent session of [`Broker::call`] (`cli-PID` for `cordon run`).
    pub fn session(&self) -> &str {
        &self.session
    }

    /// Mint `policy`'s secrets for one session (`Ok(None)`: it declares
    /// none). The lease revokes them when dropped.
    pub fn mint(
        &self,
        policy: &ToolPolicy,
        session: &str,
    ) -> Result<Option<cordon_secrets::Lease>, String> {
        if policy.secrets.is_empty() {
            return Ok(None);
        }
        // Whether they can be minted here is admission's decision
        // (`Registry::admit`); a registry given a credential broker that
        // this broker was not given still mints nothing.
        let cb = self.credentials.as_ref().ok_or_else(|| {
            format!(
                "{}: admitted with secrets, but this broker has no credential broker to mint them",
                policy.name
            )
        })?;
        cb.mint(policy, session).map(Some)
    }

    /// Admit `policy` for `use_` here, or say why not.
    pub fn admit(&self, policy: &ToolPolicy, use_: Use) -> Result<Admitted, String> {
        self.registry.admit(policy, use_)
    }

    /// Write an audit record for something that did not go through
    /// [`Broker::call`] (a refusal before the broker, a call forwarded to a
    /// sandboxed MCP server, a server's session). `Err` when it could not
    /// be written and the audit log is fail-closed: the caller must then
    /// withhold what the record was about.
    pub fn record(&self, rec: &AuditRecord) -> Result<(), CallError> {
        self.audit.record(rec).map_err(|e| {
            CallError::Audit(format!(
                "{}: the audit record could not be written ({e}); the result is withheld",
                rec.tool
            ))
        })
    }

    /// Write the record of something already done (a session's end, a
    /// refusal already answered, an egress connection closed): one that
    /// cannot be written is counted for `cordon doctor` and said in the
    /// next call's warnings ([`Auditor::record_after`]).
    pub fn record_after(&self, rec: &AuditRecord) {
        // Not dropped: the auditor says it on stderr, counts it (`cordon
        // doctor`, `cordon run`'s exit status) and keeps it for the next
        // call's warnings; the error itself adds nothing to that.
        let _said = self.audit.record_after(rec);
    }

    /// Warnings of audit records not written since the last call (each
    /// given once).
    pub fn audit_warnings(&self) -> Vec<String> {
        self.audit.take_warnings()
    }

    /// Warnings a person should see once: audit trouble, and runtimes that
    /// cannot start here. (What each tool's sandbox lacks is in its
    /// admission's warnings, and so in every call's.)
    pub fn warnings(&self) -> Vec<String> {
        let mut w: Vec<String> = self.audit_warning.iter().cloned().collect();
        for (k, why) in self.registry.unavailable() {
            w.push(format!(
                "runtime {} cannot start here: {why}",
                cordon_runtime::kind_name(*k)
            ));
        }
        w
    }

    /// Whether each tenant's sandboxes run under host uids of their own
    /// here, or why not.
    pub fn tenant_uids(&self) -> &tenant_uids::Availability {
        &self.tenant_uids
    }

    /// The host uid and gid of `tenant` for a sandbox of `policy`: `None`
    /// where tenants share one (no range, an unprivileged broker, a runtime
    /// other than native, P0); `Err` when the range has none left.
    pub fn tenant_ids(
        &self,
        policy: &ToolPolicy,
        tenant: &str,
    ) -> Result<Option<(u32, u32)>, String> {
        self.tenant_uids.ids_for(policy, tenant)
    }

    /// Why a sandbox of `policy` runs under the shared host uid.
    fn shared_uid_reason(&self, policy: &ToolPolicy) -> Option<String> {
        if policy.profile == cordon_policy::policy::Profile::P0 {
            return None;
        }
        Some(match &self.tenant_uids {
            tenant_uids::Availability::Off(why) => why.clone(),
            tenant_uids::Availability::InForce(_) => format!(
                "runtime {} does not map tenants to uids of their own",
                cordon_runtime::kind_name(policy.runtime)
            ),
        })
    }

    /// Run one call of `policy` with `input` on stdin.
    pub fn call(&self, policy: &ToolPolicy, input: Vec<u8>) -> Result<CallResult, CallError> {
        let who = Caller::new(&self.session, &self.caller);
        self.call_as(&who, policy, input)
    }

    /// [`Broker::call`] on behalf of another agent session and caller (one
    /// broker serves every session of `cordon serve`); the audit record
    /// names them.
    pub fn call_as(
        &self,
        who: &Caller,
        policy: &ToolPolicy,
        input: Vec<u8>,
    ) -> Result<CallResult, CallError> {
        let admitted = self.registry.admit(policy, Use::Call);
        self.call_admitted(who, policy, admitted, input)
    }

    /// [`Broker::call_as`] with the admission already made (a gateway
    /// admits each tool once); a refused admission is audited as such.
    pub fn call_admitted(
        &self,
        who: &Caller,
        policy: &ToolPolicy,
        admitted: Result<Admitted, String>,
        input: Vec<u8>,
    ) -> Result<CallResult, CallError> {
        self.call_admitted_since(who, policy, admitted, input, Instant::now())
    }

    /// [`Broker::call_admitted`] of a call that arrived at `since` (its
    /// admission began there: a gateway's own checks come first); the
    /// record's `duration_ms` and `timings` count from then.
    pub fn call_admitted_since(
        &self,
        who: &Caller,
        policy: &ToolPolicy,
        admitted: Result<Admitted, String>,
        input: Vec<u8>,
        since: Instant,
    ) -> Result<CallResult, CallError> {
        let started = since;
        let mut rec = AuditRecord::new(&policy.name, profile_name(policy.profile));
        rec.runtime = cordon_runtime::kind_name(policy.runtime).to_string();
        rec.session = who.session.clone();
        rec.caller = who.client.clone();
        rec.principal = who.principal.clone();
        rec.tenant = Some(who.tenant.clone());
        rec.trace = who.trace.clone();
        rec.input = Payload::of(&input, false);
        let mut clock = Phases::since(since);
        let result = self.call_inner(who, policy, admitted, input, &mut rec, &mut clock);
        rec.timings = Some(clock.timings).filter(|t| !t.is_empty());
        if self.one_shot {
            self.volumes
                .end_session(&who.tenant, &who.session, std::time::Duration::ZERO);
        }
        rec.duration_ms = started.elapsed().as_millis() as u64;
        self.record(&rec)?;
        result
    }

    fn call_inner(
        &self,
        who: &Caller,
        policy: &ToolPolicy,
        admitted: Result<Admitted, String>,
        input: Vec<u8>,
        rec: &mut AuditRecord,
        clock: &mut Phases,
    ) -> Result<CallResult, CallError> {
        let refuse = |rec: &mut AuditRecord, clock: &mut Phases, msg: String| {
            clock.admitted();
            rec.status = cordon_audit::Status::Refused;
            rec.reason = Some(msg.clone());
            Err(CallError::Refused(msg))
        };
        let admitted = match admitted {
            Ok(a) => a,
            Err(msg) => return refuse(rec, clock, msg),
        };
        // The tenant's own host uid, where this host has a range for them.
        let host_ids = match self.tenant_ids(policy, &who.tenant) {
            Ok(Some(ids)) => {
                rec.tenant_uid = Some(ids.0);
                Some(ids)
            }
            Ok(None) => {
                rec.shared_uid = self.shared_uid_reason(policy);
                None
            }
            Err(msg) => return refuse(rec, clock, msg),
        };
        // Volumes after the host ids: their roots belong to the sandbox's uid.
        let volumes =
            match self
                .volumes
                .prepare(&admitted.spec, host_ids, &who.tenant, &who.session)
            {
                Ok(v) => v,
                Err(msg) => return refuse(rec, clock, msg),
            };
        let gate = match self.gate(policy) {
            Ok(g) => g,
            Err(msg) => return refuse(rec, clock, msg),
        };
        // A call of a command tool is its own credential session: minted
        // now, revoked once the sandbox is gone.
        let lease = match self.mint(policy, &who.session) {
            Ok(l) => l,
            Err(msg) => {
                rec.status = cordon_audit::Status::Error;
                rec.reason = Some(msg.clone());
                return Err(CallError::Setup(msg));
            }
        };
        let credentials = match lease.as_ref().map(|l| l.credentials()).transpose() {
            Ok(c) => c.unwrap_or_default(),
            Err(msg) => {
                rec.status = cordon_audit::Status::Error;
                rec.reason = Some(msg.clone());
                return Err(CallError::Setup(msg));
            }
        };
        // The live tokens as minted, for the output gate (with those of
        // any re-mint during the call, taken below before the revocation).
        let mut live = lease.as_ref().map(|l| l.live_tokens()).unwrap_or_default();
        let events = Arc::new(Mutex::new(Vec::new()));
        let ev = events.clone();
        let ctx = Context {
            session: who.session.clone(),
            tenant: who.tenant.clone(),
            on_egress: Arc::new(move |e| {
                if let Ok(mut v) = ev.lock() {
                    v.push(e);
                }
            }),
            credentials,
            placement: Placement {
                host_ids,
                volumes,
                lifetime: None,
            },
        };
        // A call with credentials cold-starts: a pooled sandbox was made
        // before this session's secrets were minted.
        let pool = match &lease {
            Some(_) => None,
            None => self.pool_for(policy, &who.tenant, host_ids, &admitted),
        };
        clock.admitted();
        let ran = match pool {
            Some(Ok(pool)) => admitted
                .run_from_pool(&pool, input, &ctx)
                .map(|(o, taken)| {
                    // The hand-over: which pooled sandbox ran the call.
                    if let Some(t) = taken {
                        rec.pool = Some(cordon_audit::PoolEvent {
                            event: "handed_over".into(),
                            sandbox: t.sandbox,
                            pooled: true,
                            waited_ms: t.waited_ms,
                        });
                    }
                    o
                }),
            Some(Err(why)) => admitted.run(input, &ctx).map(|mut o| {
                o.warnings.push(why);
                o
            }),
            None => admitted.run(input, &ctx),
        };
        clock.ran(ran.as_ref().ok().map(|o| (o.duration, o.setup)));
        let full_volumes = Volumes::full(&ctx.placement.volumes);
        drop(ctx);
        // What the call itself says, whatever its outcome: exfiltration
        // attempts, tokens that came back, records of its credentials that
        // could not be written.
        let mut call_warnings = Vec::new();
        if let Some(l) = &lease {
            live.extend(l.live_tokens());
        }
        let tokens = LiveTokens::new(
            live.iter()
                .map(|(name, token, ph)| (name.as_str(), token.as_str(), ph.as_str())),
        );
        drop(live);
        if let Some(l) = lease
            && let Err(e) = l.revoke("the call ended")
        {
            call_warnings.push(e);
        }
        let egress_events = events
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default();
        rec.egress = egress_events.iter().map(audit_event).collect();
        call_warnings.extend(egress_warnings(&egress_events));
        rec.warnings = admitted.warnings.clone();
        rec.warnings.extend(call_warnings.iter().cloned());
        let mut outcome = match ran {
            Ok(o) => o,
            Err(e) => {
                rec.status = match e {
                    RunError::Refused(_) => cordon_audit::Status::Refused,
                    RunError::Setup(_) => cordon_audit::Status::Error,
                };
                rec.reason = Some(e.to_string());
                return Err(e.into());
            }
        };
        // The tool's stderr goes to the audit record and, through the
        // gate's error path, to the caller: no live token in it either.
        if let Some((clean, names)) = tokens.replace(&outcome.stderr) {
            outcome.stderr = clean;
            call_warnings.push(format!(
                "the live token of secret {} was in the tool's stderr: replaced by its placeholder",
                names.join(", ")
            ));
        }
        // Records of what was already done that could not be written are
        // said to the next call.
        outcome.warnings.extend(self.audit.take_warnings());
        // Kept on a successful call too: the record's warnings are the
        // outcome's from here on.
        outcome.warnings.extend(call_warnings);
        rec.exit_code = outcome.exit_code;
        rec.signal = outcome.signal;
        rec.output = Payload::of(&outcome.stdout, false);
        rec.set_stderr(&outcome.stderr);
        rec.warnings = outcome.warnings.clone();
        rec.warnings.extend(full_volumes);
        rec.status = match outcome.status {
            Status::Ok => cordon_audit::Status::Ok,
            Status::Exited if outcome.signal.is_some() => cordon_audit::Status::Killed,
            Status::Exited => cordon_audit::Status::ToolError,
            Status::Killed => cordon_audit::Status::Killed,
            _ => cordon_audit::Status::LimitHit,
        };
        if outcome.status != Status::Ok {
            rec.reason = Some(outcome.reason.clone());
        }
        if let Some(limit) = limit_hit(outcome.status) {
            rec.limits_hit.push(limit.into());
        }
        // A tool that failed still said something: gate it the same way
        // (a limit kill's partial output is dropped).
        let gated = matches!(outcome.status, Status::Ok | Status::Exited).then(|| {
            let meta = ToolMeta::new(&policy.name, profile_name(policy.profile));
            let gating = Instant::now();
            let g = gate.check_scanned(&meta, &outcome.stdout, &tokens);
            clock.timings.gate_us = Some(Timings::us(gating.elapsed()));
            match &g {
                Ok(ok) => {
                    rec.gate = Some(GateSummary::from(&ok.envelope));
                    rec.warnings.extend(ok.envelope.secret_warnings());
                }
                Err(refusal) => {
                    rec.gate = Some(GateSummary::refused(
                        gate.policy().kind,
                        outcome.stdout.len() as u64,
                        refusal,
                    ));
                    if outcome.status == Status::Ok {
                        rec.status = cordon_audit::Status::Refused;
                        rec.reason = Some(format!("{}: {refusal}", policy.name));
                    }
                }
            }
            g
        });
        Ok(CallResult {
            outcome,
            egress: egress_events,
            gated,
        })
    }

    /// The compiled gate for a tool, compiled on its first call only.
    fn gate(&self, policy: &ToolPolicy) -> Result<Arc<Gate>, String> {
        let key = serde_json::json!([
            policy.name,
            policy.output,
            policy.output_schema,
            policy.limits.map(|l| l.output_bytes)
        ])
        .to_string();
        if let Some(g) = self.gates.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(g);
        }
        let g = Arc::new(gate_for(policy)?);
        if let Ok(mut m) = self.gates.lock() {
            if m.len() > 256 {
                m.clear();
            }
            m.insert(key, g.clone());
        }
        Ok(g)
    }
}

/// The phases of one call as it goes ([`Timings`]): admission from the
/// call's arrival until a sandbox is asked for, then the sandbox's start
/// and run (split where the runtime says when its program was released).
struct Phases {
    mark: Instant,
    timings: Timings,
}

impl Phases {
    fn since(mark: Instant) -> Phases {
        Phases {
            mark,
            timings: Timings::default(),
        }
    }

    /// The admission ends: a sandbox is asked for now (or the call is
    /// refused).
    fn admitted(&mut self) {
        self.timings.admission_us = Some(Timings::us(self.mark.elapsed()));
        self.mark = Instant::now();
    }

    /// The sandbox ran: `outcome`'s wall time and setup, when it ran.
    /// Everything before its program was released (the runtime's own
    /// preparation, the sandbox made or taken from a pool) is the start;
    /// the rest the run. Without a setup time the whole is the run.
    fn ran(&mut self, outcome: Option<(std::time::Duration, Option<std::time::Duration>)>) {
        let total = self.mark.elapsed();
        let Some((duration, setup)) = outcome else {
            return;
        };
        match setup {
            Some(setup) => {
                let run = duration.saturating_sub(setup).min(total);
                self.timings.start_us = Some(Timings::us(total - run));
                self.timings.run_us = Some(Timings::us(run));
            }
            None => self.timings.run_us = Some(Timings::us(total)),
        }
    }
}

/// Write the record of a credential event. A mint is recorded before its
/// token is handed out: `Err` (the mint is revoked and its session refused)
/// when the record cannot be written and the log is fail-closed. Every other
/// event (a re-mint, a revocation, a failure) is already done: a record that
/// cannot be written is counted and said ([`Auditor::record_after`]) and
/// `Err` all the same, fail-open or not, so that the lease returns it from
/// its revocation (the call's warnings, `cordon run`'s exit status, an
/// error line of `cordon serve`) and a failed mint says it in its refusal.
fn credential_event(log: &Auditor, e: &cordon_secrets::Event) -> Result<(), String> {
    let rec = credential_record(e);
    if e.kind != cordon_secrets::EventKind::Minted {
        return log.record_after(&rec).map_err(|err| err.to_string());
    }
    log.record(&rec).map_err(|err| {
        eprintln!(
            "cordon: the audit record of a credential {} was not written: {err}",
            e.kind.as_str()
        );
        err.to_string()
    })
}

/// The audit record of a credential event: whose (tool, session), which
/// secret, provider, scope, ttl and expiry; never the token.
pub fn credential_record(e: &cordon_secrets::Event) -> AuditRecord {
    let mut r = AuditRecord::new(&e.tool, "");
    r.runtime = "credentials".into();
    r.session = e.session.clone();
    r.caller = "credential-broker".into();
    r.status = match e.kind {
        cordon_secrets::EventKind::MintFailed | cordon_secrets::EventKind::RevokeFailed => {
            cordon_audit::Status::Error
        }
        _ => cordon_audit::Status::Ok,
    };
    r.reason = e.reason.clone();
    r.credential = Some(cordon_audit::CredentialEvent {
        event: e.kind.as_str().into(),
        secret: e.secret.clone(),
        provider: e.provider.clone(),
        scope: e.scope.clone(),
        ttl_seconds: e.ttl_seconds,
        audience: e.audience.clone(),
        deliver: match e.deliver {
            cordon_policy::policy::Deliver::Proxy => "proxy".into(),
            cordon_policy::policy::Deliver::Env => "env".into(),
        },
        expires_at: e.expires_at.and_then(|t| {
            time::OffsetDateTime::from(t)
                .format(&time::format_description::well_known::Rfc3339)
                .ok()
        }),
    });
    r
}

/// The warnings a call's egress events give: each exfiltration attempt
/// refused and each token that came back in a response (secret names and
/// destinations, never values).
pub fn egress_warnings(events: &[EgressEvent]) -> Vec<String> {
    let mut out = Vec::new();
    for e in events {
        if let Some(secret) = &e.exfiltration {
            out.push(format!(
                "exfiltration attempt refused: the placeholder of secret {secret} sent to {}:{}",
                e.name, e.port
            ));
        }
        if !e.reflected.is_empty() {
            out.push(format!(
                "the token of {} came back in a response of {}:{}: replaced by its placeholder",
                e.reflected.join(", "),
                e.name,
                e.port
            ));
        }
    }
    out
}

pub fn audit_event(e: &EgressEvent) -> cordon_audit::EgressEvent {
    cordon_audit::EgressEvent {
        name: e.name.clone(),
        port: e.port,
        address: e.address,
        decision: match e.decision {
            cordon_egress::Decision::Allowed => cordon_audit::Decision::Allow,
            cordon_egress::Decision::Refused => cordon_audit::Decision::Deny,
        },
        reason: Some(e.reason.clone()),
        bytes_up: e.bytes_up,
        bytes_down: e.bytes_down,
        duration_ms: e.duration_ms,
        injected: e.injected.clone(),
        exfiltration: e.exfiltration.clone(),
        reflected: e.reflected.clone(),
    }
}

pub fn profile_name(p: Profile) -> &'static str {
    match p {
        Profile::P0 => "P0",
        Profile::P1 => "P1",
        Profile::P2 => "P2",
        Profile::P3 => "P3",
    }
}

/// The gate for a tool, from its resolved policy.
pub fn gate_for(policy: &ToolPolicy) -> Result<Gate, String> {
    let o = &policy.output;
    let gp = GatePolicy {
        kind: match o.kind {
            cordon_policy::policy::OutputKind::Text => cordon_gate::OutputKind::Text,
            cordon_policy::policy::OutputKind::Json => cordon_gate::OutputKind::Json,
            cordon_policy::policy::OutputKind::Binary => cordon_gate::OutputKind::Binary,
        },
        media_type: o.media_type.clone(),
        schema: policy.output_schema.clone(),
        max_bytes: policy
            .limits
            .map(|l| l.output_bytes)
            .unwrap_or(cordon_gate::DEFAULT_MAX_BYTES),
        on_overflow: match o.on_overflow {
            cordon_policy::policy::Overflow::Fail => cordon_gate::Overflow::Fail,
            cordon_policy::policy::Overflow::Truncate => cordon_gate::Overflow::Truncate,
        },
        strip: StripPolicy {
            control: o.strip.control,
            ansi: o.strip.ansi,
            bidi: o.strip.bidi,
            zero_width: o.strip.zero_width,
            tags: o.strip.tags,
            html: o.strip_html,
            markdown: o.strip_markdown,
        },
        invalid_utf8: match o.invalid_utf8 {
            cordon_policy::policy::InvalidUtf8::Replace => cordon_gate::Utf8Policy::Replace,
            cordon_policy::policy::InvalidUtf8::Reject => cordon_gate::Utf8Policy::Reject,
        },
        label: match o.label {
            cordon_policy::policy::Label::Wrapped => LabelStyle::Wrapped,
            cordon_policy::policy::Label::Envelope => LabelStyle::Envelope,
            cordon_policy::policy::Label::None => LabelStyle::None,
        },
        block_secrets: o.block_secrets,
    };
    Gate::new(gp).map_err(|e| format!("{}: {e}", policy.name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(decision: Decision) -> EgressEvent {
        EgressEvent {
            tool: "jira_search".into(),
            session: "s".into(),
            name: "jira.example".into(),
            port: 443,
            address: None,
            door: cordon_egress::Door::Proxy,
            decision,
            reason: "r".into(),
            bytes_up: 1,
            bytes_down: 2,
            duration_ms: 3,
            time: String::new(),
            injected: Vec::new(),
            exfiltration: None,
            reflected: Vec::new(),
        }
    }

    fn credential(kind: cordon_secrets::EventKind) -> cordon_secrets::Event {
        cordon_secrets::Event {
            kind,
            tool: "jira_search".into(),
            session: "s1".into(),
            secret: "JIRA_TOKEN".into(),
            provider: "mint".into(),
            scope: "read".into(),
            ttl_seconds: 60,
            audience: None,
            deliver: cordon_policy::policy::Deliver::Proxy,
            expires_at: None,
            reason: Some("the call ended".into()),
        }
    }

    fn full(fail_open: bool, counted: &std::path::Path) -> Auditor {
        Auditor::new(
            AuditLog::new().with_sink(FileSink::open("/dev/full", Rotation::default()).unwrap()),
            fail_open,
        )
        .with_unwritten_file(counted.to_path_buf())
    }

    #[test]
    fn credential_events_are_recorded_or_their_loss_fails_the_mint_or_is_counted() {
        use cordon_secrets::EventKind;
        let dir = tempfile::tempdir().unwrap();
        // Positive control: every kind is written to a writable log.
        let path = dir.path().join("audit.jsonl");
        let ok = Auditor::new(
            AuditLog::new().with_sink(FileSink::open(&path, Rotation::default()).unwrap()),
            false,
        );
        for k in [EventKind::Minted, EventKind::Reminted, EventKind::Revoked] {
            credential_event(&ok, &credential(k)).unwrap();
        }
        let log = std::fs::read_to_string(&path).unwrap();
        assert_eq!(log.lines().count(), 3, "{log}");
        assert!(log.contains(r#""event":"remint""#) && log.contains(r#""event":"revoke""#));
        // A mint not recorded is refused (fail-closed) ...
        let counted = dir.path().join("unwritten.jsonl");
        let closed = full(false, &counted);
        let e = credential_event(&closed, &credential(EventKind::Minted)).unwrap_err();
        assert!(e.contains("/dev/full"), "{e}");
        // ... and goes on fail-open, counted.
        credential_event(&full(true, &counted), &credential(EventKind::Minted)).unwrap();
        assert_eq!(cordon_audit::read_unwritten(&counted).unwrap().count, 2);
        // A re-mint, a revocation or a failure is done: counted, said to
        // the next call and returned (the lease gives it back from its
        // revocation), fail-open or not; never dropped.
        for k in [
            EventKind::Reminted,
            EventKind::Revoked,
            EventKind::RevokeFailed,
        ] {
            let e = credential_event(&closed, &credential(k)).unwrap_err();
            assert!(e.contains("/dev/full"), "{e}");
        }
        let e = credential_event(&full(true, &counted), &credential(EventKind::MintFailed))
            .unwrap_err();
        assert!(e.contains("/dev/full"), "{e}");
        let u = cordon_audit::read_unwritten(&counted).unwrap();
        assert_eq!(u.count, 6);
        assert_eq!(u.last.unwrap().what, "credential mint_failed");
        let w = closed.take_warnings();
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(
            w[0].contains("credential remint (jira_search, session s1)"),
            "{w:?}"
        );
        assert!(
            w[1].contains("credential revoke (jira_search, session s1)"),
            "{w:?}"
        );
    }

    /// A lease whose revocation record cannot be written says so: its
    /// `revoke` returns it (the call's warnings, `cordon run`'s exit
    /// status). The audit log is a FIFO whose reader takes the mint's
    /// record and goes away, so the next write fails (EPIPE).
    #[test]
    fn a_revocation_whose_record_cannot_be_written_is_returned_by_the_lease() {
        let dir = tempfile::tempdir().unwrap();
        let providers = dir.path().join("providers.yaml");
        std::fs::write(
            &providers,
            "default: dev\nproviders:\n  dev:\n    type: static\n    env: HOME\n",
        )
        .unwrap();
        std::fs::set_permissions(
            &providers,
            std::os::unix::fs::PermissionsExt::from_mode(0o600),
        )
        .unwrap();
        let cb = Arc::new(
            cordon_secrets::CredentialBroker::new(
                cordon_secrets::config::load(&providers).unwrap(),
            )
            .unwrap(),
        );
        let policy = cordon_policy::load_str(
            std::path::Path::new("m.yaml"),
            "tools:\n  api:\n    profile: P2\n    command: [/bin/true]\n    egress: [\"api.example:443\"]\n    secrets: [{name: T, scope: read, ttl: 60}]\n",
        )
        .unwrap()
        .policy
        .tools["api"]
        .clone();
        let broker = |audit: &std::path::Path| {
            Broker::with_registry(
                Registry::empty(),
                &BrokerOptions {
                    audit: Some(audit.to_path_buf()),
                    audit_unwritten: Some(dir.path().join("unwritten.jsonl")),
                    credentials: Some(cb.clone()),
                    tenant_uids: Some(tenant_uids::Availability::Off("test".into())),
                    ..Default::default()
                },
            )
            .unwrap()
        };
        // Positive control: a writable log takes both records.
        let file = dir.path().join("audit.jsonl");
        let b = broker(&file);
        b.mint(&policy, "s0")
            .unwrap()
            .unwrap()
            .revoke("done")
            .unwrap();
        let log = std::fs::read_to_string(&file).unwrap();
        assert!(log.contains(r#""event":"mint""#), "{log}");
        assert!(log.contains(r#""event":"revoke_not_offered""#), "{log}");
        drop(b);
        // The FIFO: its reader takes the mint's record, then closes.
        let fifo = dir.path().join("audit.fifo");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        let f = fifo.clone();
        let reader = std::thread::spawn(move || {
            use std::io::BufRead;
            let mut r = std::io::BufReader::new(std::fs::File::open(f).unwrap());
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            line
        });
        let b = broker(&fifo);
        let lease = b.mint(&policy, "s1").unwrap().unwrap();
        assert!(reader.join().unwrap().contains(r#""event":"mint""#));
        let e = lease.revoke("the call ended").unwrap_err();
        assert!(
            e.contains("the audit record of the credential revoke_not_offered of secret T (api, session s1) was not written"),
            "{e}"
        );
        assert!(e.contains("Broken pipe"), "{e}");
    }

    #[test]
    fn a_record_after_the_fact_not_written_is_said_to_the_next_call() {
        let dir = tempfile::tempdir().unwrap();
        let counted = dir.path().join("state/audit-unwritten.jsonl");
        let b = Broker::with_registry(
            Registry::empty(),
            &BrokerOptions {
                audit: Some("/dev/full".into()),
                audit_unwritten: Some(counted.clone()),
                tenant_uids: Some(tenant_uids::Availability::Off("test".into())),
                ..Default::default()
            },
        )
        .unwrap();
        let mut rec = AuditRecord::new("(session)", "");
        rec.session = "mcp-http-1-0".into();
        rec.status = cordon_audit::Status::SessionEnded;
        b.record_after(&rec);
        let w = b.audit_warnings();
        assert!(
            w.len() == 1 && w[0].contains("session end ((session), session mcp-http-1-0)"),
            "{w:?}"
        );
        assert!(b.audit_warnings().is_empty());
        assert_eq!(cordon_audit::read_unwritten(&counted).unwrap().count, 1);
        // A call's own record is not written: the call fails (status 22).
        let e = b.record(&AuditRecord::new("t", "P1")).unwrap_err();
        assert_eq!(e.exit_code(), exit::AUDIT_FAILED);
    }

    /// The warnings a call keeps from its egress: an exfiltration attempt
    /// and a token that came back, named; an ordinary event says nothing.
    #[test]
    fn egress_warnings_name_exfiltration_and_reflected_tokens() {
        assert!(egress_warnings(&[event(Decision::Allowed)]).is_empty());
        let mut refused = event(Decision::Refused);
        refused.exfiltration = Some("JIRA_TOKEN".into());
        let mut back = event(Decision::Allowed);
        back.reflected = vec!["JIRA_TOKEN".into()];
        let w = egress_warnings(&[refused, back]);
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(
            w[0].starts_with(
                "exfiltration attempt refused: the placeholder of secret JIRA_TOKEN sent to "
            ),
            "{w:?}"
        );
        assert!(
            w[1].starts_with("the token of JIRA_TOKEN came back in a response of "),
            "{w:?}"
        );
    }

    #[test]
    fn audit_records_name_injected_secrets_and_exfiltration_attempts() {
        // Positive control: a plain event has neither.
        let a = audit_event(&event(Decision::Allowed));
        assert!(a.injected.is_empty() && a.exfiltration.is_none());
        let mut used = event(Decision::Allowed);
        used.injected = vec!["JIRA_TOKEN".into()];
        assert_eq!(audit_event(&used).injected, ["JIRA_TOKEN"]);
        let mut refused = event(Decision::Refused);
        refused.exfiltration = Some("JIRA_TOKEN".into());
        let a = audit_event(&refused);
        assert_eq!(a.decision, cordon_audit::Decision::Deny);
        assert_eq!(a.exfiltration.as_deref(), Some("JIRA_TOKEN"));
        let json = serde_json::to_string(&a).unwrap();
        assert!(json.contains(r#""exfiltration":"JIRA_TOKEN""#), "{json}");
    }
}
