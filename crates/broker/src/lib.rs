//! cordon-broker: the call path: resolved policy -> sandbox -> output gate ->
//! audit record. `cordon run`, `cordon exec` and `cordon serve` all call
//! [`Broker::call`]; nothing else launches a tool.
#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

pub use cordon_egress::{Decision, EgressEvent, EgressPolicy};
use cordon_egress::{DoorContext, DoorHandle, Doors, EventSink};

use cordon_audit::{AuditLog, AuditRecord, FileSink, GateSummary, Payload, Rotation, StderrSink};
use cordon_gate::{Gate, GatePolicy, Gated, LabelStyle, StripPolicy, ToolMeta};
use cordon_jail::{
    Bind, DoorRequest, Jail, JailError, JailSpec, Limits, NetMode, Outcome, SeccompMode, Status,
    Stdin,
};
use cordon_policy::policy::{Exec, Network, Profile, Runtime, Seccomp, ToolPolicy};

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
}

/// Long-lived: the jail (root template, cgroup pool) and the audit log.
pub struct Broker {
    jail: Jail,
    audit: AuditLog,
    audit_warning: Option<String>,
    /// The runtime that serves egress doors, started on first use.
    net: OnceLock<tokio::runtime::Runtime>,
    /// Compiled gates (JSON schemas compile once), keyed by their policy.
    gates: Mutex<std::collections::HashMap<String, Arc<Gate>>>,
    pub session: String,
    pub caller: String,
}

/// Why a call did not produce a gated result.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Setup(#[from] JailError),
}

impl CallError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CallError::Refused(_) => exit::REFUSED,
            CallError::Setup(_) => exit::SETUP_FAILED,
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
        match self.outcome.status {
            Status::Ok => match &self.gated {
                Some(Err(_)) => exit::GATE_REFUSED,
                _ => exit::OK,
            },
            Status::Exited => exit::TOOL_FAILED,
            Status::TimedOut => exit::TIMED_OUT,
            Status::MemoryLimit => exit::MEMORY_LIMIT,
            Status::TaskLimit => exit::TASK_LIMIT,
            Status::OutputCap => exit::OUTPUT_CAP,
        }
    }
}

/// Where the audit log goes: `$CORDON_AUDIT`, else /var/log/cordon as
/// root, else `$XDG_STATE_HOME` or `~/.local/state`.
pub fn default_audit_path() -> PathBuf {
    if let Some(p) = std::env::var_os("CORDON_AUDIT") {
        return PathBuf::from(p);
    }
    if cordon_sys::io::geteuid() == 0 {
        return PathBuf::from("/var/log/cordon/audit.jsonl");
    }
    let state = std::env::var_os("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/state")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    state.join("cordon/audit.jsonl")
}

/// The audit log at `path` (default [`default_audit_path`]; `-` for
/// stderr), with a warning when it falls back to stderr.
pub fn open_audit(path: Option<PathBuf>) -> (AuditLog, Option<String>) {
    let path = path.unwrap_or_else(default_audit_path);
    if path.as_os_str() == "-" {
        return (AuditLog::new().with_sink(StderrSink), None);
    }
    match FileSink::open(&path, Rotation::default()) {
        Ok(s) => (AuditLog::new().with_sink(s), None),
        Err(e) => (
            AuditLog::new().with_sink(StderrSink),
            Some(format!(
                "audit log {} cannot be opened ({e}); audit records go to stderr",
                path.display()
            )),
        ),
    }
}

impl Broker {
    pub fn new(audit_path: Option<PathBuf>) -> Result<Broker, JailError> {
        Broker::with_jail(Jail::new()?, audit_path)
    }

    /// A broker for one call in a short-lived process (`cordon run`,
    /// `cordon exec`): its jail takes cgroup slots from the set shared
    /// between processes instead of making and removing its own.
    pub fn one_shot(audit_path: Option<PathBuf>) -> Result<Broker, JailError> {
        let jail = Jail::with_options(cordon_jail::JailOptions {
            share_cgroup_slots: true,
            ..Default::default()
        })?;
        Broker::with_jail(jail, audit_path)
    }

    fn with_jail(jail: Jail, audit_path: Option<PathBuf>) -> Result<Broker, JailError> {
        let (audit, audit_warning) = open_audit(audit_path);
        Ok(Broker {
            jail,
            audit,
            audit_warning,
            net: OnceLock::new(),
            gates: Mutex::new(std::collections::HashMap::new()),
            session: format!("cli-{}", std::process::id()),
            caller: "cli".into(),
        })
    }

    /// Write an audit record for a call that did not go through
    /// [`Broker::call`]: one refused before it reached the broker, or a call
    /// forwarded to a sandboxed MCP server.
    pub fn record(&self, rec: &AuditRecord) {
        if let Err(e) = self.audit.record(rec) {
            eprintln!("cordon: warning: audit record not written: {e}");
        }
    }

    /// Whether limits go through cgroups (false: the rlimit fallback).
    pub fn uses_cgroups(&self) -> bool {
        self.jail.uses_cgroups()
    }

    /// Warnings a person should see once: weakened mechanisms, audit trouble.
    pub fn warnings(&self) -> Vec<String> {
        let mut w: Vec<String> = self.audit_warning.iter().cloned().collect();
        if !self.jail.uses_cgroups() {
            w.push(
                "cgroups unavailable here: memory is capped by RLIMIT_AS and tasks by RLIMIT_NPROC only (see `cordon doctor`)"
                    .into(),
            );
        }
        w
    }

    /// Run one call of `policy` with `input` on stdin.
    pub fn call(&self, policy: &ToolPolicy, input: Vec<u8>) -> Result<CallResult, CallError> {
        self.call_as(&self.session, &self.caller, policy, input)
    }

    /// [`Broker::call`] on behalf of another agent session and caller (one
    /// broker serves every session of `cordon serve`); the audit record
    /// names them.
    pub fn call_as(
        &self,
        session: &str,
        caller: &str,
        policy: &ToolPolicy,
        input: Vec<u8>,
    ) -> Result<CallResult, CallError> {
        let started = Instant::now();
        let mut rec = AuditRecord::new(&policy.name, format!("{:?}", policy.profile));
        rec.runtime = format!("{:?}", policy.runtime).to_lowercase();
        rec.session = session.to_string();
        rec.caller = caller.to_string();
        rec.input = Payload::of(&input, false);
        let result = self.call_inner(policy, input, &mut rec);
        rec.duration_ms = started.elapsed().as_millis() as u64;
        if let Err(e) = self.audit.record(&rec) {
            eprintln!("cordon: warning: audit record not written: {e}");
        }
        result
    }

    fn call_inner(
        &self,
        policy: &ToolPolicy,
        input: Vec<u8>,
        rec: &mut AuditRecord,
    ) -> Result<CallResult, CallError> {
        let refuse = |rec: &mut AuditRecord, msg: String| {
            rec.status = cordon_audit::Status::Refused;
            rec.reason = Some(msg.clone());
            Err(CallError::Refused(msg))
        };
        let (spec, egress) = match jail_spec(policy) {
            Ok(s) => s,
            Err(msg) => return refuse(rec, msg),
        };
        let gate = match self.gate(policy) {
            Ok(g) => g,
            Err(msg) => return refuse(rec, msg),
        };
        let events = Arc::new(Mutex::new(Vec::new()));
        let ran = match egress {
            None => self.jail.run(&spec, Stdin::Bytes(input)),
            Some(ep) => self.run_with_egress(&spec, ep, input, events.clone()),
        };
        let egress_events = events
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default();
        rec.egress = egress_events.iter().map(audit_event).collect();
        let outcome = match ran {
            Ok(o) => o,
            Err(e) => {
                rec.status = cordon_audit::Status::Error;
                rec.reason = Some(e.to_string());
                return Err(CallError::Setup(e));
            }
        };
        rec.exit_code = outcome.exit_code;
        rec.signal = outcome.signal;
        rec.output = Payload::of(&outcome.stdout, false);
        rec.set_stderr(&outcome.stderr);
        rec.warnings = outcome.warnings.clone();
        rec.status = match outcome.status {
            Status::Ok => cordon_audit::Status::Ok,
            Status::Exited if outcome.signal.is_some() => cordon_audit::Status::Killed,
            Status::Exited => cordon_audit::Status::ToolError,
            _ => cordon_audit::Status::LimitHit,
        };
        if outcome.status != Status::Ok {
            rec.reason = Some(outcome.reason.clone());
        }
        if let Some(limit) = match outcome.status {
            Status::TimedOut => Some("wall_seconds"),
            Status::MemoryLimit => Some("memory"),
            Status::TaskLimit => Some("tasks"),
            Status::OutputCap => Some("output_bytes"),
            _ => None,
        } {
            rec.limits_hit.push(limit.into());
        }
        // A tool that failed still said something: gate it the same way
        // (a limit kill's partial output is dropped).
        let gated = matches!(outcome.status, Status::Ok | Status::Exited).then(|| {
            let meta = ToolMeta::new(&policy.name, profile_name(policy.profile));
            let g = gate.check(&meta, &outcome.stdout);
            match &g {
                Ok(ok) => rec.gate = Some(GateSummary::from(&ok.envelope)),
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

    /// Run a prepared spec in the jail, with `egress` doors served when
    /// given; returns the outcome and every egress attempt. No gate, no
    /// audit record: for the conformance probes, which judge the raw run.
    pub fn run_spec(
        &self,
        spec: &JailSpec,
        egress: Option<EgressPolicy>,
        input: Vec<u8>,
    ) -> Result<(Outcome, Vec<EgressEvent>), JailError> {
        let events = Arc::new(Mutex::new(Vec::new()));
        let out = match egress {
            None => self.jail.run(spec, Stdin::Bytes(input)),
            Some(ep) => self.run_with_egress(spec, ep, input, events.clone()),
        }?;
        let ev = events
            .lock()
            .map(|mut v| std::mem::take(&mut *v))
            .unwrap_or_default();
        Ok((out, ev))
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

    fn runtime(&self) -> Result<&tokio::runtime::Runtime, JailError> {
        if let Some(rt) = self.net.get() {
            return Ok(rt);
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cordon-egress")
            .enable_all()
            .build()
            .map_err(|e| JailError::Host(format!("start the egress runtime: {e}")))?;
        Ok(self.net.get_or_init(|| rt))
    }

    /// Run with the egress doors of `policy` served for the whole call.
    fn run_with_egress(
        &self,
        spec: &JailSpec,
        policy: EgressPolicy,
        input: Vec<u8>,
        events: Arc<Mutex<Vec<EgressEvent>>>,
    ) -> Result<Outcome, JailError> {
        let rt = self.runtime()?;
        run_with_doors(
            &self.jail,
            rt.handle(),
            &self.session,
            spec,
            policy,
            Stdin::Bytes(input),
            move |e| {
                if let Ok(mut v) = events.lock() {
                    v.push(e);
                }
            },
        )
    }
}

/// Run `spec` in `jail` with the egress doors of `policy` served on `rt` for
/// the sandbox's whole life; every egress attempt goes to `on_event`. The
/// doors are shut down once the sandbox is gone. Blocks the calling thread
/// (which must not be one of `rt`'s workers) until the sandbox ends: a
/// long-lived server runs it on its own thread.
pub fn run_with_doors(
    jail: &Jail,
    rt: &tokio::runtime::Handle,
    session: &str,
    spec: &JailSpec,
    policy: EgressPolicy,
    stdin: Stdin,
    on_event: impl Fn(EgressEvent) + Send + Sync + 'static,
) -> Result<Outcome, JailError> {
    let plan = cordon_egress::plan(&policy);
    let n_tcp = plan.tcp.len();
    let ctx = DoorContext {
        tool: spec.tool.clone(),
        session: session.to_string(),
    };
    let sink = EventSink::new(on_event);
    let handle: Mutex<Option<Result<DoorHandle, String>>> = Mutex::new(None);
    let policy = Arc::new(policy);
    let out = jail.run_with_doors(spec, stdin, |fds| {
        let mut doors = Doors::default();
        for (i, fd) in fds.into_iter().enumerate() {
            if i < n_tcp {
                doors.tcp.push(std::net::TcpListener::from(fd));
            } else {
                doors.udp.push(std::net::UdpSocket::from(fd));
            }
        }
        let served = rt
            .block_on(cordon_egress::serve(policy, ctx, doors, sink))
            .map_err(|e| e.to_string());
        if let Ok(mut h) = handle.lock() {
            *h = Some(served);
        }
    });
    let served = handle.lock().ok().and_then(|mut h| h.take());
    match served {
        Some(Ok(h)) => rt.block_on(h.shutdown()),
        Some(Err(e)) => {
            return Err(JailError::Host(format!("{}: egress doors: {e}", spec.tool)));
        }
        None => {}
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
    }
}

/// The egress policy of a tool's network setting (`None` for no network).
pub fn egress_policy(p: &ToolPolicy) -> Result<Option<EgressPolicy>, String> {
    egress_policy_for(&p.name, &p.network)
}

/// The egress policy of a network setting, refusals naming `name`.
pub fn egress_policy_for(name: &str, network: &Network) -> Result<Option<EgressPolicy>, String> {
    let (mut ep, resolve, cidrs) = match network {
        Network::None => return Ok(None),
        Network::Host => {
            return Err(format!("{name}: host network is never given to a sandbox"));
        }
        Network::Allowlist {
            allow,
            resolve,
            allow_cidrs,
        } => (
            EgressPolicy::allowlist(name, allow).map_err(|e| format!("{name}: {e}"))?,
            resolve,
            allow_cidrs,
        ),
        Network::Proxy {
            resolve,
            allow_cidrs,
        } => (EgressPolicy::public_web(name), resolve, allow_cidrs),
    };
    for (host, ip) in resolve {
        let ip = ip
            .parse()
            .map_err(|_| format!("{name}: resolve {host}: `{ip}` is not an IP address"))?;
        ep.resolve.insert(host.to_ascii_lowercase(), ip);
    }
    for c in cidrs {
        ep.allow_cidrs.push(
            c.parse::<ipnet::IpNet>()
                .map_err(|_| format!("{name}: allow_cidrs: `{c}` is not a CIDR"))?,
        );
    }
    if let Ok(ns) = std::env::var("CORDON_UPSTREAM_DNS") {
        ep.upstream_dns = Some(
            ns.parse()
                .map_err(|_| format!("CORDON_UPSTREAM_DNS={ns}: not an address:port"))?,
        );
    }
    ep.validate().map_err(|e| format!("{name}: {e}"))?;
    Ok(Some(ep))
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
    };
    Gate::new(gp).map_err(|e| format!("{}: {e}", policy.name))
}

/// The jail spec for a tool: the one place a resolved policy becomes a
/// native sandbox. Refuses what this runtime cannot enforce.
pub fn jail_spec(p: &ToolPolicy) -> Result<(JailSpec, Option<EgressPolicy>), String> {
    match p.runtime {
        Runtime::Native => {}
        other => {
            return Err(format!(
                "{}: runtime {} is not available in this build of cordon; refusing to run the tool under a weaker boundary",
                p.name,
                format!("{other:?}").to_lowercase()
            ));
        }
    }
    if p.profile == Profile::P0 {
        return Err(format!(
            "{}: profile P0 has no sandbox; cordon runs only sandboxed tools",
            p.name
        ));
    }
    let argv = match &p.exec {
        Exec::Command { argv } => argv.clone(),
        Exec::Image { reference, .. } => {
            return Err(format!(
                "{}: image {reference} needs an OCI runtime, which this build does not have",
                p.name
            ));
        }
        Exec::Mcp { .. } => {
            return Err(format!(
                "{}: an MCP server tool is called through `cordon serve`, not `cordon run`",
                p.name
            ));
        }
        Exec::Unspecified => {
            return Err(format!(
                "{}: the manifest gives nothing to run (no `command`, `image` or `mcp`)",
                p.name
            ));
        }
    };
    let egress = egress_policy(p)?;
    let mut env: Vec<(String, String)> =
        p.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let network = match &egress {
        None => NetMode::None,
        Some(ep) => {
            let plan = cordon_egress::plan(ep);
            env.retain(|(k, _)| !plan.env.iter().any(|(pk, _)| pk == k));
            env.extend(plan.env.iter().cloned());
            NetMode::Doors(DoorRequest {
                local_cidrs: plan
                    .local_cidrs
                    .iter()
                    .map(|n| (n.addr(), n.prefix_len()))
                    .collect(),
                tcp: plan.tcp.clone(),
                udp: plan.udp.clone(),
            })
        }
    };
    if !p.secrets.is_empty() {
        return Err(format!(
            "{}: declares secrets, but no credential broker is configured; refusing rather than running without them",
            p.name
        ));
    }
    let l = p.require_limits()?;
    let spec = JailSpec {
        tool: p.name.clone(),
        argv,
        env,
        binds: p
            .mounts
            .iter()
            .map(|m| Bind {
                src: m.src.clone().into(),
                dst: m.dst.clone().into(),
            })
            .collect(),
        limits: Limits {
            wall: std::time::Duration::from_secs(l.wall_seconds),
            memory_bytes: l.memory_bytes,
            tasks: l.tasks,
            cpu_percent: Some(l.cpu_percent),
            output_bytes: l.output_bytes,
            stderr_bytes: l.stderr_bytes,
            nofile: l.nofile,
            disk_bytes: l.disk_bytes,
        },
        network,
        seccomp: match &p.seccomp {
            Seccomp::DenyList => SeccompMode::DenyList,
            Seccomp::AllowList { extra } => SeccompMode::AllowList(extra.clone()),
        },
        landlock: true,
    };
    Ok((spec, egress))
}
