//! cordon-runtime: the one seam between a resolved policy and whatever
//! builds its sandbox.
//!
//! A resolved [`ToolPolicy`] is lowered once into a neutral
//! [`SandboxSpec`] ([`spec::lower`]); a [`Registry`] picks the runtime for
//! the policy's `runtime` and use ([`Use::Call`] for one call,
//! [`Use::Serve`] for a long-lived MCP server), asks it which mechanisms it
//! enforces for that spec on this host and whether the host can start it at
//! all ([`Runtime::check`]), and holds the answer against the policy's
//! `require`/`accept` ([`mechanism::hold`]). That is [`Registry::admit`]:
//! the only place a refusal is decided. `cordon run`, `cordon serve`, the
//! gateway, `cordon probe`, `cordon check` and `cordon doctor` all ask it.
//!
//! Adding a runtime: one module implementing [`Runtime`] (check, run,
//! spawn, facts) and one line in [`Registry::for_host`].
#![forbid(unsafe_code)]

pub mod companion;
pub mod gvisor;
pub mod images;
pub mod mechanism;
pub mod microvm;
pub mod native;
pub mod oci;
pub mod outcome;
pub mod pool;
pub mod pool_status;
pub mod spec;
pub mod supervisor;
pub mod volume;
pub mod wasm;
pub mod wasm_worker;

use std::os::unix::net::UnixStream;
use std::sync::Arc;

pub use cordon_egress::{Decision, Door, EgressEvent, EgressPolicy};
pub use cordon_jail::preflight::Problem;
use cordon_policy::ToolPolicy;
use cordon_policy::policy::Runtime as RuntimeKind;
pub use mechanism::{Mechanism, MechanismState, State};
pub use outcome::{Outcome, RunError, Status};
use serde::Serialize;
pub use spec::{Limits, Mount, Network, Root, SandboxSpec, Seccomp, Use};
pub use volume::{Volume, Volumes};

/// Where a sandbox's egress attempts go.
pub type EgressSink = Arc<dyn Fn(EgressEvent) + Send + Sync>;

/// Who a sandbox runs for: carried into its egress events.
#[derive(Clone)]
pub struct Context {
    /// The agent session.
    pub session: String,
    /// The session's tenant: nothing made for this call is handed to
    /// another tenant.
    pub tenant: String,
    /// Every egress attempt, allowed or refused.
    pub on_egress: EgressSink,
    /// The session's credentials for this tool (empty: none).
    pub credentials: Credentials,
    /// Where this sandbox is placed for its tenant and session.
    pub placement: Placement,
}

/// What the broker decides for one call or server start, beyond the
/// admitted spec (which nothing changes after admission): whose host ids
/// the sandbox runs under, the directories made for its session, and how
/// long a server lives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placement {
    /// The host uid and gid of the call's tenant (a subordinate range's,
    /// see the broker's `tenant_uids`); `None`: the runtime's shared
    /// unprivileged identity (65534 for a root broker). The native runtime
    /// maps the sandbox to it when the broker is root; gVisor does not
    /// use it.
    pub host_ids: Option<(u32, u32)>,
    /// Read-write binds of the directories the broker made for the
    /// sandbox's declared workspace and state ([`Volumes::prepare`]).
    pub volumes: Vec<Volume>,
    /// The sandbox's whole life, when it is not the spec's wall clock: a
    /// server's, which bounds each call by the wall clock and lives across
    /// many.
    pub lifetime: Option<std::time::Duration>,
}

impl Placement {
    /// `spec`'s limits with this placement's lifetime as the wall clock.
    pub fn limits(&self, spec: &SandboxSpec) -> Limits {
        let mut l = spec.limits;
        if let Some(life) = self.lifetime {
            l.wall = life;
        }
        l
    }
}

/// The tenant of a [`Context`] made without one (`cordon run`, tests).
pub use cordon_config::DEFAULT_TENANT;

impl Context {
    /// A context whose egress events are dropped.
    pub fn discard(session: &str) -> Context {
        Context {
            session: session.to_string(),
            tenant: DEFAULT_TENANT.to_string(),
            on_egress: Arc::new(|_| {}),
            credentials: Credentials::default(),
            placement: Placement::default(),
        }
    }
}

/// A credential broker as admission sees it: whether a tool's secrets can
/// be minted here. Without one, a tool that declares secrets is refused.
pub trait Minting: Send + Sync {
    /// `Err(why)` when some secret of `tool` cannot be minted (its provider
    /// is unknown to the broker's provider file).
    fn can_mint(&self, tool: &ToolPolicy) -> Result<(), String>;
}

/// The credentials a session's credential broker minted for one tool.
#[derive(Clone, Default)]
pub struct Credentials {
    /// Variables added to the sandbox's environment: a placeholder for a
    /// secret delivered by the proxy, the token itself for `deliver: env`.
    /// Never printed.
    pub env: Vec<(String, zeroize::Zeroizing<String>)>,
    /// What the doors substitute for each placeholder, and where.
    pub injections: cordon_egress::Injections,
}

impl Credentials {
    /// No secret at all.
    pub fn is_empty(&self) -> bool {
        self.env.is_empty() && self.injections.is_empty()
    }
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("env", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .field("injections", &self.injections)
            .finish()
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("session", &self.session)
            .field("tenant", &self.tenant)
            .field("placement", &self.placement)
            .finish_non_exhaustive()
    }
}

/// A runtime's answer for one spec on this host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Check {
    /// How each mechanism holds for this spec.
    pub mechanisms: Vec<MechanismState>,
    /// Why it would not start here (a missing program, interpreter or
    /// mount source, an unsupported setting); empty: it would.
    pub problems: Vec<Problem>,
}

/// What a runtime can do on this host, for `cordon doctor`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Facts {
    /// The runtime's name.
    pub runtime: &'static str,
    /// How each mechanism holds for a sandbox without network, and with
    /// egress doors where that differs.
    pub mechanisms: Vec<MechanismState>,
    /// Things worth knowing (fallbacks taken, leftovers removed).
    pub notes: Vec<String>,
}

/// A long-lived sandbox: one byte stream (its stdin and stdout), and its
/// handle.
pub struct Spawned {
    /// The broker's end: what is written here is the sandbox's stdin, and
    /// what the sandbox writes to its stdout arrives here.
    pub stream: UnixStream,
    /// Kill and wait.
    pub handle: Arc<dyn SandboxHandle>,
}

/// Control of one spawned sandbox.
pub trait SandboxHandle: Send + Sync + std::fmt::Debug {
    /// Kill the sandbox, every process in it. Idempotent.
    fn kill(&self);
    /// How it ended, once it has: `None` while it runs.
    fn outcome(&self) -> Option<Result<Outcome, RunError>>;
    /// Block until it has ended.
    fn wait(&self) -> Result<Outcome, RunError>;
}

/// A sandbox builder: the native jail, gVisor, microVMs, Wasm.
pub trait Runtime: Send + Sync {
    /// Its name in messages, audit records and `cordon doctor`.
    fn name(&self) -> &'static str;
    /// The mechanisms this runtime enforces for `spec` on this host, and
    /// every reason the host could not start it. Runs nothing.
    fn check(&self, spec: &SandboxSpec) -> Check;
    /// One call: `input` on stdin, the output collected. Blocks until the
    /// sandbox is gone.
    fn run(&self, spec: &SandboxSpec, input: Vec<u8>, ctx: &Context) -> Result<Outcome, RunError>;
    /// A long-lived sandbox with one bidirectional byte stream.
    fn spawn(&self, spec: &SandboxSpec, ctx: &Context) -> Result<Spawned, RunError>;
    /// What it can do on this host.
    fn facts(&self) -> Facts;
    /// The jail it runs on, when it has one (so that runtimes on one host
    /// share cgroup slots).
    fn jail(&self) -> Option<Arc<cordon_jail::Jail>> {
        None
    }
    /// The JSON Schema of a call's arguments that the sandboxed program
    /// itself declares (a component's typed function), read when the tool
    /// is admitted; `Ok(None)`: it declares none. `Err`: why the tool
    /// cannot be admitted (e.g. no such function).
    fn input_schema(&self, _spec: &SandboxSpec) -> Result<Option<serde_json::Value>, String> {
        Ok(None)
    }
    /// Make now what `spec`'s first call would otherwise make before its
    /// tool starts (a microVM's template snapshot), so that a server's
    /// first call costs what every later one does. Runs no tool; a no-op
    /// where nothing is made ahead.
    fn prepare(&self, _spec: &SandboxSpec, _ctx: &Context) -> Result<(), RunError> {
        Ok(())
    }
}

/// A policy admitted to run: its spec, the runtime that builds it, and how
/// each mechanism holds.
#[derive(Clone)]
pub struct Admitted {
    /// The runtime.
    pub runtime: Arc<dyn Runtime>,
    /// The neutral specification.
    pub spec: SandboxSpec,
    /// How each mechanism holds here.
    pub mechanisms: Vec<MechanismState>,
    /// One sentence per mechanism that is not fully enforced (allowed,
    /// because not required or accepted): for every call's audit record,
    /// the client and `cordon doctor`.
    pub warnings: Vec<String>,
    /// The arguments' schema the program declares ([`Runtime::input_schema`]).
    pub input_schema: Option<serde_json::Value>,
}

impl std::fmt::Debug for Admitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admitted")
            .field("runtime", &self.runtime.name())
            .field("spec", &self.spec)
            .field("mechanisms", &self.mechanisms)
            .field("warnings", &self.warnings)
            .field("input_schema", &self.input_schema)
            .finish()
    }
}

impl Admitted {
    /// Run one call.
    pub fn run(&self, input: Vec<u8>, ctx: &Context) -> Result<Outcome, RunError> {
        let mut o = self.runtime.run(&self.spec, input, ctx)?;
        merge_warnings(&mut o.warnings, &self.warnings);
        Ok(o)
    }

    /// Run one call in a sandbox of `pool` (or a cold one when it is
    /// empty); a pool whose refill stopped says so in the warnings.
    pub fn run_pooled(
        &self,
        pool: &pool::Pool,
        input: Vec<u8>,
        ctx: &Context,
    ) -> Result<Outcome, RunError> {
        self.run_from_pool(pool, input, ctx).map(|(o, _)| o)
    }

    /// [`Admitted::run_pooled`], saying which pooled sandbox the task took
    /// (`None`: a cold start).
    pub fn run_from_pool(
        &self,
        pool: &pool::Pool,
        input: Vec<u8>,
        ctx: &Context,
    ) -> Result<(Outcome, Option<pool::Taken>), RunError> {
        let (mut o, taken) = pool.run_taking(input, ctx)?;
        if let Some(why) = pool.stopped() {
            o.warnings.push(why);
        }
        merge_warnings(&mut o.warnings, &self.warnings);
        Ok((o, taken))
    }

    /// Start a long-lived sandbox.
    pub fn spawn(&self, ctx: &Context) -> Result<Spawned, RunError> {
        self.runtime.spawn(&self.spec, ctx)
    }

    /// Make ahead what its first call would make ([`Runtime::prepare`]).
    pub fn prepare(&self, ctx: &Context) -> Result<(), RunError> {
        self.runtime.prepare(&self.spec, ctx)
    }
}

/// Put the admission's warnings first, each once.
fn merge_warnings(out: &mut Vec<String>, first: &[String]) {
    let mut all: Vec<String> = first.to_vec();
    for w in out.drain(..) {
        if !all.contains(&w) {
            all.push(w);
        }
    }
    *out = all;
}

/// The runtimes of this build, keyed by the policy's runtime and use.
#[derive(Clone)]
pub struct Registry {
    entries: Vec<(RuntimeKind, Use, Arc<dyn Runtime>)>,
    /// Where image references are resolved (`None`: image tools refused).
    images: Option<Arc<dyn images::Images>>,
    /// Why a runtime of this build could not start here, by kind.
    unavailable: Vec<(RuntimeKind, String)>,
    /// The credential broker (`None`: tools that declare secrets are
    /// refused).
    credentials: Option<Arc<dyn Minting>>,
    /// Where the egress doors resolve names.
    upstream_dns: spec::UpstreamDns,
}

impl Registry {
    /// No runtimes: everything is refused.
    pub fn empty() -> Registry {
        Registry {
            entries: Vec::new(),
            images: None,
            unavailable: Vec::new(),
            credentials: None,
            upstream_dns: spec::UpstreamDns::Host,
        }
    }

    /// Have the egress doors of the tools admitted resolve names through
    /// `dns` (the CLI's reading of `CORDON_UPSTREAM_DNS`).
    pub fn with_upstream_dns(mut self, dns: spec::UpstreamDns) -> Registry {
        self.upstream_dns = dns;
        self
    }

    /// Admit tools that declare secrets when `broker` can mint them.
    pub fn with_credentials(mut self, broker: Arc<dyn Minting>) -> Registry {
        self.credentials = Some(broker);
        self
    }

    /// The host uid and gid of the native runtime's sandboxes (the owner
    /// of the workspaces and states made for them).
    pub fn sandbox_owner(&self) -> (u32, u32) {
        self.entries
            .iter()
            .find_map(|(_, _, rt)| rt.jail())
            .map(|j| j.sandbox_host_ids())
            .unwrap_or_else(|| {
                if cordon_sys::io::geteuid() == 0 {
                    (65534, 65534)
                } else {
                    (cordon_sys::io::geteuid(), cordon_sys::io::getegid())
                }
            })
    }

    /// Whether a credential broker is configured.
    pub fn has_credentials(&self) -> bool {
        self.credentials.is_some()
    }

    /// Register `rt` for policies of `kind` used as `use_`.
    pub fn with(mut self, kind: RuntimeKind, use_: Use, rt: Arc<dyn Runtime>) -> Registry {
        self.entries.push((kind, use_, rt));
        self
    }

    /// Resolve image references through `images`.
    pub fn with_images(mut self, images: Arc<dyn images::Images>) -> Registry {
        self.images = Some(images);
        self
    }

    /// Every runtime this build has that can start on this host. A runtime
    /// that cannot is recorded with why, and its tools are refused with it.
    pub fn for_host(opts: native::Options) -> Registry {
        let mut r = Registry::empty().with_images(Arc::new(images::StoreImages::new(None)));
        match native::Native::new(opts) {
            Ok(n) => {
                let n: Arc<dyn Runtime> = Arc::new(n);
                r = r.with(RuntimeKind::Native, Use::Call, n.clone()).with(
                    RuntimeKind::Native,
                    Use::Serve,
                    n,
                );
            }
            Err(e) => r.unavailable.push((RuntimeKind::Native, e.to_string())),
        }
        r.with_gvisor().with_microvm().with_wasm()
    }

    /// The Wasm runtime, over the native runtime's jail; for calls only.
    fn with_wasm(self) -> Registry {
        self.with_child(
            RuntimeKind::Wasm,
            &[Use::Call],
            |j| wasm::Wasm::with_jail(wasm::Options::default(), j),
            || wasm::Wasm::new(wasm::Options::default(), Default::default()),
        )
    }

    /// A runtime that runs a kernel, VMM or runner as a child, over the
    /// native runtime's jail when there is one (their cgroup slots shared),
    /// registered for `uses`.
    fn with_child<R: Runtime + 'static>(
        mut self,
        kind: RuntimeKind,
        uses: &[Use],
        over: impl FnOnce(Arc<cordon_jail::Jail>) -> R,
        alone: impl FnOnce() -> Result<R, String>,
    ) -> Registry {
        let jail = self
            .entries
            .iter()
            .find(|(k, _, _)| *k == RuntimeKind::Native)
            .and_then(|(_, _, rt)| rt.jail());
        let made = match jail {
            Some(j) => Ok(over(j)),
            None => alone(),
        };
        match made {
            Ok(rt) => {
                let rt: Arc<dyn Runtime> = Arc::new(rt);
                for u in uses {
                    self = self.with(kind, *u, rt.clone());
                }
                self
            }
            Err(e) => {
                self.unavailable.push((kind, e));
                self
            }
        }
    }

    fn with_gvisor(self) -> Registry {
        self.with_child(
            RuntimeKind::Gvisor,
            &[Use::Call, Use::Serve],
            |j| gvisor::Gvisor::with_jail(gvisor::Options::default(), j),
            || gvisor::Gvisor::new(gvisor::Options::default(), Default::default()),
        )
    }

    fn with_microvm(self) -> Registry {
        self.with_child(
            RuntimeKind::Microvm,
            &[Use::Call, Use::Serve],
            |j| microvm::Microvm::with_jail(microvm::Options::default(), j),
            || microvm::Microvm::new(microvm::Options::default(), Default::default()),
        )
    }

    /// The runtime for `kind` and `use_`, if this build has one here.
    pub fn get(&self, kind: RuntimeKind, use_: Use) -> Result<Arc<dyn Runtime>, String> {
        if let Some((_, _, rt)) = self
            .entries
            .iter()
            .find(|(k, u, _)| *k == kind && *u == use_)
        {
            return Ok(rt.clone());
        }
        let name = kind_name(kind);
        if let Some((_, why)) = self.unavailable.iter().find(|(k, _)| *k == kind) {
            return Err(format!("runtime {name} cannot start on this host: {why}"));
        }
        Err(format!(
            "runtime {name} is not available in this build of cordon"
        ))
    }

    /// Every distinct runtime, with the kinds it serves (for `doctor`).
    pub fn runtimes(&self) -> Vec<Arc<dyn Runtime>> {
        let mut out: Vec<Arc<dyn Runtime>> = Vec::new();
        for (_, _, rt) in &self.entries {
            if !out.iter().any(|o| Arc::ptr_eq(o, rt)) {
                out.push(rt.clone());
            }
        }
        out
    }

    /// Why runtimes of this build cannot start here.
    pub fn unavailable(&self) -> &[(RuntimeKind, String)] {
        &self.unavailable
    }

    /// Admit `policy` for `use_` on this host, or refuse it with every
    /// reason: nothing this build or host cannot enforce ever runs weaker.
    pub fn admit(&self, policy: &ToolPolicy, use_: Use) -> Result<Admitted, String> {
        self.admit_each(policy, use_).map_err(|r| r.to_string())
    }

    /// [`Registry::admit`], with every reason the tool would not start
    /// here kept apart (for `cordon check`, which says each at its line).
    pub fn admit_each(&self, policy: &ToolPolicy, use_: Use) -> Result<Admitted, Refusal> {
        let one = |why: String| Refusal {
            tool: policy.name.clone(),
            why,
            problems: Vec::new(),
        };
        admit_secrets(policy, self.credentials.as_deref()).map_err(one)?;
        let spec = spec::lower(
            policy,
            use_,
            self.images.as_deref(),
            self.credentials.as_deref(),
            &self.upstream_dns,
        )
        .map_err(one)?;
        let runtime = self.get(policy.runtime, use_).map_err(|why| {
            one(format!(
                "{}: {why}; refusing to run the tool under a weaker boundary",
                policy.name
            ))
        })?;
        self.admit_spec_each(policy, runtime, spec)
    }

    /// [`Registry::admit`] for a spec already lowered (and perhaps changed,
    /// as the probes do) from `policy`.
    pub fn admit_spec(
        &self,
        policy: &ToolPolicy,
        runtime: Arc<dyn Runtime>,
        spec: SandboxSpec,
    ) -> Result<Admitted, String> {
        self.admit_spec_each(policy, runtime, spec)
            .map_err(|r| r.to_string())
    }

    /// [`Registry::admit_spec`], each reason apart (see [`Refusal`]).
    pub fn admit_spec_each(
        &self,
        policy: &ToolPolicy,
        runtime: Arc<dyn Runtime>,
        spec: SandboxSpec,
    ) -> Result<Admitted, Refusal> {
        let check = runtime.check(&spec);
        if !check.problems.is_empty() {
            return Err(Refusal {
                tool: policy.name.clone(),
                why: format!("{}: would not start on this host", policy.name),
                problems: check.problems,
            });
        }
        let warnings = mechanism::hold(
            &policy.name,
            runtime.name(),
            &policy.require,
            &policy.accept,
            &check.mechanisms,
        )
        .map_err(|why| Refusal {
            tool: policy.name.clone(),
            why,
            problems: Vec::new(),
        })?;
        let input_schema = runtime.input_schema(&spec).map_err(|why| Refusal {
            tool: policy.name.clone(),
            why,
            problems: Vec::new(),
        })?;
        Ok(Admitted {
            runtime,
            spec,
            mechanisms: check.mechanisms,
            warnings,
            input_schema,
        })
    }
}

/// Why admission refused a tool: `why`, and, when the host could not
/// start its sandbox, each reason found (a missing program, interpreter
/// or mount source...), each as the runtime says it (`{tool}: ...`).
/// Displayed as [`Registry::admit`]'s message: `why`, then `: ` and the
/// problems joined by `; `.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub tool: String,
    pub why: String,
    pub problems: Vec<Problem>,
}

impl Refusal {
    /// Each reason on its own, without the tool's name in front: the
    /// problems (each with the mount source it is about, if any), or
    /// `why` when there are none.
    pub fn reasons(&self) -> Vec<Problem> {
        let prefix = format!("{}: ", self.tool);
        if self.problems.is_empty() {
            return vec![
                self.why
                    .strip_prefix(&prefix)
                    .unwrap_or(&self.why)
                    .to_string()
                    .into(),
            ];
        }
        self.problems
            .iter()
            .map(|p| Problem {
                message: p.strip_prefix(&prefix).unwrap_or(p).to_string(),
                bind_source: p.bind_source.clone(),
            })
            .collect()
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.why)?;
        if !self.problems.is_empty() {
            write!(f, ": {}", self.problems.join("; "))?;
        }
        Ok(())
    }
}

/// Admission of `policy`'s secrets: refused without a credential broker
/// (`minting`), or when it cannot mint them. The one place this is
/// decided.
pub fn admit_secrets(policy: &ToolPolicy, minting: Option<&dyn Minting>) -> Result<(), String> {
    if policy.secrets.is_empty() {
        return Ok(());
    }
    match minting {
        None => Err(format!(
            "{}: declares secrets ({}), but no credential broker is configured; refusing rather than running without them. Write a provider file (docs/secrets.md) and give it with `--providers FILE` or $CORDON_PROVIDERS, or put it at /etc/cordon/providers.yaml",
            policy.name,
            policy
                .secrets
                .iter()
                .map(|s| s.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Some(m) => m.can_mint(policy),
    }
}

/// A runtime kind's manifest name.
pub fn kind_name(k: RuntimeKind) -> &'static str {
    match k {
        RuntimeKind::Native => "native",
        RuntimeKind::Gvisor => "gvisor",
        RuntimeKind::Microvm => "microvm",
        RuntimeKind::Wasm => "wasm",
    }
}
