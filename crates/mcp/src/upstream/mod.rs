//! `mcp:` tools: a third-party MCP server run inside its sandbox, its tools
//! exposed under the manifest tool's name as a prefix (`<tool>__<name>`)
//! or under the server's own names (`expose: as-is`), filtered by `allow`,
//! renamed by `rename` (a full name), each name claimed for this server
//! alone ([`crate::names`]), and refused when a description differs from
//! the one pinned in `descriptions`. One sandbox per agent
//! session (`lifetime: session`) or per call (`lifetime: call`); a server
//! that crashes or hangs gives a typed error and the next call starts a new
//! one.
//!
//! - [`connection`]: starting the server through the [`ServerSandbox`]
//!   seam, the rmcp client, restarts and lifetime;
//! - [`tools`]: listing, `allow`/`rename`, pinned descriptions, calls;
//! - [`resources`]: resources and resource templates, reads, subscriptions;
//! - [`prompts`]: prompts and completions;
//! - [`gate`]: the one path by which anything the server produces reaches
//!   the agent (the output gate, labels, the summary `_meta`).

mod connection;
mod gate;
mod prompts;
mod resources;
mod tools;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cordon_policy::policy::{Exec, Expose, ToolPolicy};
use rmcp::ErrorData;
use rmcp::model::{Prompt, Resource, ResourceTemplate};
use serde_json::json;

use crate::logging::LogLevel;
use crate::names::NameClaims;
pub(crate) use crate::offers::{KnownOffers, Offers};
use crate::render::{self, Refusal};
use crate::sandbox::ServerSandbox;
pub(crate) use connection::{Bound, Launched, launch};
use connection::{Live, ProgressRoutes, Subscriptions};
pub(crate) use resources::Exposure;
use tools::Exposed;

#[derive(Default)]
struct State {
    live: Option<Live>,
    tools: Option<Vec<Exposed>>,
    /// The server's own tools as the cache gave them, while `tools` comes
    /// from the cache (no start yet): its first start compares.
    cached: Option<Vec<rmcp::model::Tool>>,
    generation: u64,
    /// What the server listed last (after the manifest's allowlists):
    /// the only resources, templates and prompts an agent may reach.
    resources: Option<Vec<Resource>>,
    templates: Option<Vec<(ResourceTemplate, crate::uri::Template)>>,
    prompts: Option<Vec<Prompt>>,
}

/// One `mcp:` tool of the manifest within one agent session.
pub(crate) struct Upstream {
    policy: Arc<ToolPolicy>,
    /// The agent session this server runs for (its credentials are this
    /// session's; audit records name it).
    session: String,
    /// The session's principal (its tenant owns the server's sandbox).
    principal: crate::caller::Who,
    argv: Vec<String>,
    expose: Expose,
    /// The gateway's record of which server owns each exposed name.
    names: Arc<NameClaims>,
    allow: Option<Vec<String>>,
    rename: BTreeMap<String, String>,
    pins: BTreeMap<String, String>,
    sandbox: Arc<dyn ServerSandbox>,
    routes: Arc<ProgressRoutes>,
    subscriptions: Arc<Mutex<Subscriptions>>,
    state: tokio::sync::Mutex<State>,
    wall: Duration,
    /// How long a start (initialize and the first tools/list) may take.
    startup: Duration,
    /// Why the last start in this session failed (cleared by a start that
    /// succeeds).
    start_failure: Mutex<Option<ErrorData>>,
    resource_allow: Option<Vec<String>>,
    prompt_allow: Option<Vec<String>>,
    offers: KnownOffers,
    log_level: LogLevel,
    /// The server said its tools changed since they were listed.
    tools_stale: Arc<std::sync::atomic::AtomicBool>,
    /// The listings servers last gave.
    cache: crate::cache::ListingCache,
    /// What the server's requests to the client need.
    asks: Arc<connection::Asks>,
    /// Every mechanism of the running sandbox that is not fully enforced
    /// here (from its last start).
    warnings: Mutex<Vec<String>>,
    /// The gateway's warm pools (a server with `warm: N` takes a ready one
    /// at its first start in the session).
    warm: Option<Arc<crate::warm::WarmPools>>,
}

/// The command line of an `mcp:` server (empty: its image's entrypoint).
pub(crate) fn server_argv(policy: &ToolPolicy) -> Result<Vec<String>, String> {
    let Exec::Mcp { command, image, .. } = &policy.exec else {
        return Err(format!("{}: not an MCP server tool", policy.name));
    };
    // An image server without a command runs the image's entrypoint,
    // which admission reads from the image (an empty argv here).
    match (command, image) {
        (Some(c), _) if !c.is_empty() => Ok(c.clone()),
        (_, Some(_)) => Ok(Vec::new()),
        _ => Err(format!(
            "{}: the `mcp` block gives no command to start the server",
            policy.name
        )),
    }
}

/// A message of the server through the gate's error path.
pub(crate) fn gate_server_message(policy: &ToolPolicy, msg: &str) -> String {
    gate::server_message(policy, msg)
}

impl Upstream {
    /// An error when the policy is not an `mcp:` tool with a command or an
    /// image.
    pub fn new(
        policy: Arc<ToolPolicy>,
        sandbox: Arc<dyn ServerSandbox>,
        session: &str,
        names: Arc<NameClaims>,
    ) -> Result<Upstream, String> {
        let Exec::Mcp {
            expose,
            startup_seconds,
            allow,
            rename,
            descriptions,
            resources,
            prompts,
            ..
        } = &policy.exec
        else {
            return Err(format!("{}: not an MCP server tool", policy.name));
        };
        let argv = server_argv(&policy)?;
        let wall = policy.require_limits()?.wall;
        Ok(Upstream {
            session: session.to_string(),
            principal: crate::caller::Who::default(),
            argv,
            expose: *expose,
            names,
            allow: allow.clone(),
            rename: rename.clone(),
            pins: descriptions.clone(),
            sandbox,
            routes: Arc::new(ProgressRoutes::default()),
            subscriptions: Arc::default(),
            state: tokio::sync::Mutex::new(State::default()),
            wall,
            startup: Duration::from_secs(*startup_seconds),
            start_failure: Mutex::new(None),
            resource_allow: resources.clone(),
            prompt_allow: prompts.clone(),
            offers: KnownOffers::default(),
            log_level: LogLevel::default(),
            tools_stale: Arc::default(),
            cache: Default::default(),
            asks: Arc::new(connection::Asks {
                policy: policy.clone(),
                audit: None,
            }),
            warnings: Mutex::new(Vec::new()),
            warm: None,
            policy,
        })
    }

    /// Every mechanism of the server's sandbox that is not fully enforced
    /// here, as known from its last start: for each call's result and
    /// audit record.
    pub fn warnings(&self) -> Vec<String> {
        self.warnings.lock().map(|w| w.clone()).unwrap_or_default()
    }

    /// Share the gateway's record of what this server offers.
    pub fn with_offers(mut self, offers: KnownOffers) -> Upstream {
        self.offers = offers;
        self
    }

    /// Answer listings from (and keep them in) this cache.
    pub fn with_cache(mut self, cache: crate::cache::ListingCache) -> Upstream {
        self.cache = cache;
        self
    }

    /// Audit the server's requests to the client in `broker`'s log, under
    /// `session`.
    pub fn with_audit(mut self, broker: Arc<cordon_broker::Broker>, session: &str) -> Upstream {
        self.asks = Arc::new(connection::Asks {
            policy: self.policy.clone(),
            audit: Some((broker, session.to_owned(), self.principal.clone())),
        });
        self
    }

    /// Share the session's principal. Call before [`Upstream::with_audit`].
    pub fn with_principal(mut self, who: crate::caller::Who) -> Upstream {
        self.principal = who;
        if let Some((b, s, _)) = &self.asks.audit {
            self.asks = Arc::new(connection::Asks {
                policy: self.policy.clone(),
                audit: Some((b.clone(), s.clone(), self.principal.clone())),
            });
        }
        self
    }

    /// Take servers from the gateway's warm pools.
    pub fn with_warm(mut self, pools: Arc<crate::warm::WarmPools>) -> Upstream {
        self.warm = Some(pools);
        self
    }

    /// Share the session's logging level.
    pub fn with_log_level(mut self, level: LogLevel) -> Upstream {
        self.log_level = level;
        self
    }

    pub fn name(&self) -> &str {
        &self.policy.name
    }

    /// The tenant of the session this server is for (the default one
    /// until the session's principal is known).
    pub fn tenant(&self) -> String {
        self.principal
            .get()
            .map(|p| p.tenant.clone())
            .unwrap_or_else(|| cordon_auth::DEFAULT_TENANT.to_string())
    }

    /// Whether `name` is in this server's prefixed form (`<tool>__...`).
    pub fn prefixes(&self, name: &str) -> bool {
        self.expose == Expose::Prefixed
            && name
                .strip_prefix(self.policy.name.as_str())
                .is_some_and(|r| r.starts_with(cordon_policy::policy::NAME_SEPARATOR))
    }

    /// Whether `name` could be one of this server's exposed names: in its
    /// prefixed form, or any name for a server exposed as-is.
    pub fn might_own(&self, name: &str) -> bool {
        self.expose != Expose::Prefixed || self.prefixes(name)
    }

    /// Whether a grant's name `pattern` could match one of this server's
    /// exposed tool or prompt names, known without its listing: its
    /// renamed names, its prefixed form (any name, exposed as-is).
    pub fn may_expose_match(&self, pattern: &str) -> bool {
        if self.expose != Expose::Prefixed
            || self
                .rename
                .values()
                .any(|r| cordon_policy::access::glob_matches(pattern, r))
        {
            return true;
        }
        let prefix = format!(
            "{}{}",
            self.policy.name,
            cordon_policy::policy::NAME_SEPARATOR
        );
        match pattern.split_once('*') {
            None => pattern.starts_with(&prefix),
            Some((first, _)) => first.starts_with(&prefix) || prefix.starts_with(first),
        }
    }

    pub fn profile(&self) -> &'static str {
        cordon_broker::profile_name(self.policy.profile)
    }

    fn refuse_unoffered(&self, what: &str) -> ErrorData {
        render::refusal(
            Refusal::NotOffered,
            format!("{}: the server offers no {what}", self.policy.name),
            json!({"tool": self.policy.name}),
        )
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.shutdown();
    }
}
