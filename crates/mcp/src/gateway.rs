//! The gateway: the tools of one `cordon serve` (command tools admitted
//! once, `mcp:` servers), the exposed names each claims, and the options
//! and errors of the whole.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use cordon_broker::{Broker, Use};
use cordon_policy::policy::{Exec, PolicySet, ToolPolicy};

use crate::command::CommandTool;
use crate::sandbox::{RuntimeServers, ServerSandbox};
use crate::{cache, caps, names, upstream};

/// The server sandbox of a gateway: servers started by `broker`, each for
/// at most the options' `max_server_lifetime`.
pub fn servers_for(broker: &Arc<Broker>, opts: &GatewayOptions) -> RuntimeServers {
    RuntimeServers::new(broker.clone(), opts.max_server_lifetime)
}

/// Why the gateway could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("{0}")]
    Manifest(String),
    #[error("{0}")]
    Sandbox(String),
    #[error("{0}")]
    Tool(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("MCP transport: {0}")]
    Transport(String),
}

/// Options of a [`Gateway`].
#[derive(Debug, Clone)]
pub struct GatewayOptions {
    /// Audit log (`None`: the broker's default; `-` for stderr).
    pub audit: Option<PathBuf>,
    /// A record that cannot be written does not fail the call (announced).
    pub audit_fail_open: bool,
    /// Longest life of one sandboxed MCP server (a session ending or a
    /// restart stops it sooner).
    pub max_server_lifetime: Duration,
}

impl Default for GatewayOptions {
    fn default() -> GatewayOptions {
        GatewayOptions {
            audit: None,
            audit_fail_open: false,
            max_server_lifetime: Duration::from_secs(8 * 3600),
        }
    }
}

/// Everything shared by the sessions of one `cordon serve`: the tools, the
/// broker (jail, audit log) and the sandbox for MCP servers.
pub struct Gateway {
    pub(crate) broker: Arc<Broker>,
    /// The command tools, swapped whole by a reload ([`crate::reload`]).
    pub(crate) commands: crate::reload::Commands,
    /// Each `mcp:` tool and what its server offers once known, swapped
    /// whole by a reload ([`crate::reload`]).
    pub(crate) servers: crate::reload::Servers,
    /// The servers of every live session (a reload replaces those of the
    /// tools it changes).
    pub(crate) live: crate::reload::LiveSessions,
    pub(crate) sandbox: Arc<dyn ServerSandbox>,
    /// Which tool or server each exposed name belongs to.
    pub(crate) names: Arc<names::NameClaims>,
    /// The listings servers last gave (disabled unless set).
    pub(crate) cache: cache::ListingCache,
    /// The manifest's grants (`None`: every caller may use everything).
    pub(crate) access: Option<Arc<cordon_policy::access::Access>>,
    pub(crate) warnings: Vec<String>,
    pub(crate) seq: AtomicU64,
    /// `max_concurrent`, `max_sandboxes`, per-principal and per-tenant caps.
    pub(crate) caps: Arc<caps::Caps>,
    /// Counted from the broker's audit records ([`crate::metrics`]).
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    /// Servers started ahead of their sessions (`mcp: {warm: N}`).
    pub(crate) warm: Arc<crate::warm::WarmPools>,
    /// Which tools are in service ([`crate::service`]).
    pub(crate) service: Arc<crate::service::Service>,
    /// The last refusals and calls per minute, for the console
    /// ([`crate::console`]).
    pub(crate) recent: Arc<crate::console::Recent>,
    /// Spans of every call, exported over OTLP ([`crate::traces`]).
    pub(crate) traces: Option<Arc<crate::traces::Traces>>,
    /// Whether the metrics and the console are kept (`/metrics` and
    /// `/console` are not served when they are not).
    pub(crate) observed: bool,
}

impl Gateway {
    /// Fill the default tenant's warm pools in the background (each
    /// server with `mcp: {warm: N}`); other tenants' pools fill at their
    /// first session. Within a tokio runtime.
    pub(crate) fn start_warm(&self) {
        self.warm.fill(cordon_auth::DEFAULT_TENANT);
    }

    /// Stop every warm server still waiting; start no more.
    pub(crate) fn stop_warm(&self) {
        self.warm.close();
    }

    /// Load a manifest and set up the broker and the jail for MCP servers.
    pub fn from_manifest(path: &Path, opts: &GatewayOptions) -> Result<Gateway, GatewayError> {
        let loaded =
            cordon_policy::load(path).map_err(|e| GatewayError::Manifest(e.to_string()))?;
        let bopts = cordon_broker::BrokerOptions {
            audit: opts.audit.clone(),
            audit_fail_open: opts.audit_fail_open,
            ..Default::default()
        };
        let broker = Arc::new(Broker::new(bopts.clone()).map_err(GatewayError::Sandbox)?);
        let sandbox = Arc::new(servers_for(&broker, opts));
        Gateway::new(&loaded.policy, broker, sandbox)
    }

    /// A gateway over these tools. Each is admitted once, here: a tool
    /// cordon cannot run here (an image without an OCI runtime, P0, a
    /// required mechanism missing, a program that does not exist...) is not
    /// served, with a warning saying why. A command tool whose input schema
    /// does not compile is an error.
    pub fn new(
        policy: &PolicySet,
        broker: impl Into<Arc<Broker>>,
        sandbox: Arc<dyn ServerSandbox>,
    ) -> Result<Gateway, GatewayError> {
        let broker: Arc<Broker> = broker.into();
        let caps = Arc::new(caps::Caps::new(policy));
        // A warm pool's waiting sandboxes are not counted.
        let uncapped = sandbox.clone();
        // Each server started holds one of the live sandboxes.
        let sandbox: Arc<dyn ServerSandbox> = if caps.counts_sandboxes() {
            Arc::new(caps::CappedServers {
                inner: sandbox,
                caps: caps.clone(),
            })
        } else {
            sandbox
        };
        let metrics = Arc::new(crate::metrics::Metrics::new(policy.tools.keys().cloned()));
        broker.auditor().observe(metrics.clone());
        let recent = Arc::new(crate::console::Recent::new());
        broker.auditor().observe(recent.clone());
        // Each server started is a live sandbox until it is stopped.
        let sandbox: Arc<dyn ServerSandbox> = Arc::new(crate::metrics::MeteredServers {
            inner: sandbox,
            metrics: metrics.clone(),
        });
        let mut warnings = broker.warnings();
        let mut commands = BTreeMap::new();
        let mut servers = Vec::new();
        let names = Arc::new(names::NameClaims::default());
        for (name, p) in &policy.tools {
            let use_ = Use::of(p);
            let admitted = match broker.admit(p, use_) {
                Ok(a) => a,
                Err(why) => {
                    warnings.push(format!("not served: {why}"));
                    continue;
                }
            };
            for w in &admitted.warnings {
                warnings.push(format!("{name}: {w}"));
            }
            match use_ {
                Use::Call => {
                    let tool = CommandTool::new(p, admitted).map_err(GatewayError::Tool)?;
                    claim_static(
                        &names,
                        names::Space::Tools,
                        name,
                        names::Owner::Command(name.clone()),
                    )?;
                    commands.insert(name.clone(), Arc::new(tool));
                }
                Use::Serve => {
                    let p = Arc::new(p.clone());
                    match upstream::Upstream::new(p.clone(), sandbox.clone(), "", names.clone()) {
                        Ok(_) => {
                            claim_server_names(&names, &p)?;
                            servers.push((p, upstream::KnownOffers::default()))
                        }
                        Err(why) => warnings.push(format!("not served: {why}")),
                    }
                }
            }
        }
        let warm = crate::warm::WarmPools::new(
            uncapped,
            caps.clone(),
            broker.clone(),
            servers.iter().map(|(p, _)| p.clone()).collect(),
        );
        let profiles = commands
            .values()
            .map(|c| &c.policy)
            .chain(servers.iter().map(|(p, _)| p))
            .map(|p| {
                (
                    p.name.clone(),
                    cordon_broker::profile_name(p.profile).to_string(),
                )
            })
            .collect();
        let service = Arc::new(crate::service::Service::new(
            profiles,
            broker.clone(),
            metrics.clone(),
            warm.clone(),
        ));
        Ok(Gateway {
            recent,
            service,
            warm,
            broker,
            commands: Arc::new(std::sync::RwLock::new(Arc::new(commands))),
            servers: Arc::new(std::sync::RwLock::new(Arc::new(servers))),
            live: Default::default(),
            sandbox,
            names,
            cache: cache::ListingCache::default(),
            access: policy.access.clone().map(Arc::new),
            warnings,
            seq: AtomicU64::new(0),
            caps,
            metrics,
            traces: None,
            observed: true,
        })
    }

    /// Export the spans of every call ([`crate::traces`]).
    pub fn with_traces(self, traces: Arc<crate::traces::Traces>) -> Gateway {
        self.broker.auditor().observe(traces.clone());
        Gateway {
            traces: Some(traces),
            ..self
        }
    }

    /// Keep no metrics and no console: nothing counts the audit records
    /// but the log itself, and `/metrics` and `/console` are not served.
    /// Before [`Gateway::with_traces`].
    pub fn without_metrics(self) -> Gateway {
        self.broker.auditor().stop_observing();
        Gateway {
            observed: false,
            ..self
        }
    }

    /// Where the spans of calls go, if anywhere.
    pub(crate) fn traces(&self) -> Option<&Arc<crate::traces::Traces>> {
        self.traces.as_ref()
    }

    /// Whether `/metrics` and `/console` are served.
    pub fn observed(&self) -> bool {
        self.observed
    }

    /// The command tools served now (a reload may swap them).
    pub(crate) fn commands(&self) -> Arc<BTreeMap<String, Arc<CommandTool>>> {
        crate::reload::current(&self.commands)
    }

    /// What applies a reloaded manifest's command tools to this gateway
    /// while it serves ([`crate::reload`]).
    pub fn reloader(&self) -> crate::reload::Reloader {
        crate::reload::Reloader {
            broker: self.broker.clone(),
            names: self.names.clone(),
            commands: self.commands.clone(),
            servers: self.servers.clone(),
            live: self.live.clone(),
            making: self.making(),
            metrics: self.metrics.clone(),
            service: self.service.clone(),
        }
    }

    /// The `mcp:` servers served now, each with what it offers once known.
    pub(crate) fn servers(&self) -> Arc<Vec<(Arc<ToolPolicy>, upstream::KnownOffers)>> {
        crate::reload::servers_now(&self.servers)
    }

    /// What makes a session's server of an `mcp:` tool.
    pub(crate) fn making(&self) -> crate::reload::Making {
        crate::reload::Making {
            sandbox: self.sandbox.clone(),
            names: self.names.clone(),
            cache: self.cache.clone(),
            broker: self.broker.clone(),
            warm: self.warm.clone(),
        }
    }

    /// Which tools are in service, shared with whatever proves them
    /// while the gateway serves ([`crate::service`]).
    pub fn service(&self) -> &Arc<crate::service::Service> {
        &self.service
    }

    /// The gateway's metrics ([`crate::metrics`]).
    pub fn metrics(&self) -> &Arc<crate::metrics::Metrics> {
        &self.metrics
    }

    /// Keep each server's listing in `dir` (see [`default_listing_dir`]),
    /// and answer `initialize` and `tools/list` from it until the server
    /// is needed: then it starts, and a listing that changed is handled
    /// like `list_changed`. `None`: every listing starts the server.
    pub fn with_listing_cache(mut self, dir: Option<PathBuf>) -> Gateway {
        self.cache = cache::ListingCache::new(dir);
        for (p, offers) in self.servers().iter() {
            // Only what each server offers is read here (shared by every
            // tenant); tool listings are read per tenant when listed.
            if let Some(l) = self.cache.get(p, cordon_auth::DEFAULT_TENANT)
                && let Ok(mut o) = offers.lock()
                && o.is_none()
            {
                *o = Some(l.offers);
            }
        }
        self
    }

    /// Warnings a person should see once (tools not served, weakened mechanisms).
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Names of the command tools and MCP servers served.
    pub fn tool_names(&self) -> Vec<String> {
        self.commands()
            .keys()
            .cloned()
            .chain(self.servers().iter().map(|(p, _)| p.name.clone()))
            .collect()
    }
}

/// Claim a name the manifest fixes (its load refused any given twice).
fn claim_static(
    names: &names::NameClaims,
    space: names::Space,
    name: &str,
    owner: names::Owner,
) -> Result<(), GatewayError> {
    names.claim(space, name, owner.clone()).map_err(|other| {
        GatewayError::Manifest(format!(
            "exposed name `{name}` is given twice: {other} and {owner}"
        ))
    })
}

/// Claim the names an `mcp:` tool's manifest entry fixes.
fn claim_server_names(names: &names::NameClaims, p: &ToolPolicy) -> Result<(), GatewayError> {
    for (space, name, owner) in server_names(p) {
        claim_static(names, space, &name, owner)?;
    }
    Ok(())
}

/// The names an `mcp:` tool's manifest entry fixes: `rename` targets,
/// `allow` entries and `prompts` entries in their exposed form.
pub(crate) fn server_names(p: &ToolPolicy) -> Vec<(names::Space, String, names::Owner)> {
    let Exec::Mcp {
        expose,
        allow,
        rename,
        prompts,
        ..
    } = &p.exec
    else {
        return Vec::new();
    };
    let owner = || names::Owner::Server(p.name.clone());
    let exposed = |n: &String| {
        allow
            .as_ref()
            .is_none_or(|a| a.contains(n))
            .then(|| cordon_policy::policy::exposed_tool_name(&p.name, *expose, rename, n))
    };
    let mut out = Vec::new();
    for n in rename.keys().chain(allow.iter().flatten()) {
        if let Some(full) = exposed(n) {
            out.push((names::Space::Tools, full, owner()));
        }
    }
    for n in prompts.iter().flatten() {
        let full = cordon_policy::policy::exposed_prompt_name(&p.name, *expose, n);
        out.push((names::Space::Prompts, full, owner()));
    }
    out
}
