//! A reloaded manifest applied to a gateway while it serves (`cordon
//! serve`, SIGHUP). The caller decides what may be applied (the diff, the
//! probes); this applies the tools a reload adds, changes or removes, all
//! at once or not at all: each added or changed tool is admitted (a
//! command tool's arguments compiled, a server's command line read) and
//! its names checked first, and only when every one is are the sets of
//! command tools and servers swapped.
//!
//! - Tools left unchanged keep their admitted sandbox, their sessions'
//!   servers and their warm pools.
//! - A changed or removed `mcp:` tool's server is stopped in every live
//!   session (a call in flight on it finishes first, then it is stopped);
//!   a changed or added one is started anew in each session at its next
//!   use, from the new policy. Its warm servers are stopped and its pools
//!   refilled with the new policy.
//! - The names a changed or removed tool claimed are given up, and the new
//!   ones claimed; a name another tool keeps refuses the reload.
//! - Sessions are told (`notifications/tools/list_changed`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, RwLock, Weak};

use cordon_broker::{Broker, Use};
use cordon_policy::policy::{PolicySet, ToolPolicy};

use crate::caller::Who;
use crate::command::CommandTool;
use crate::logging::LogLevel;
use crate::names;
use crate::sandbox::ServerSandbox;
use crate::upstream::{KnownOffers, Upstream};

/// The command tools of a gateway, swapped whole by a reload.
pub(crate) type Commands = Arc<RwLock<Arc<BTreeMap<String, Arc<CommandTool>>>>>;

/// The command tools served now.
pub(crate) fn current(c: &Commands) -> Arc<BTreeMap<String, Arc<CommandTool>>> {
    c.read().map(|m| m.clone()).unwrap_or_default()
}

/// The `mcp:` tools of a gateway (each with what its server offers once
/// known), swapped whole by a reload.
pub(crate) type Servers = Arc<RwLock<Arc<Vec<(Arc<ToolPolicy>, KnownOffers)>>>>;

/// The `mcp:` tools served now.
pub(crate) fn servers_now(s: &Servers) -> Arc<Vec<(Arc<ToolPolicy>, KnownOffers)>> {
    s.read().map(|m| m.clone()).unwrap_or_default()
}

/// The servers of every live session.
pub(crate) type LiveSessions = Arc<Mutex<Vec<Weak<SessionServers>>>>;

/// Count `s` among the live sessions (the dead ones are forgotten here).
pub(crate) fn register(live: &LiveSessions, s: &Arc<SessionServers>) {
    if let Ok(mut l) = live.lock() {
        l.retain(|w| w.strong_count() > 0);
        l.push(Arc::downgrade(s));
    }
}

/// `s` ended.
pub(crate) fn unregister(live: &LiveSessions, s: &Arc<SessionServers>) {
    if let Ok(mut l) = live.lock() {
        l.retain(|w| w.strong_count() > 0 && !std::ptr::eq(w.as_ptr(), Arc::as_ptr(s)));
    }
}

/// One session's servers, one per `mcp:` tool served, in the order of
/// the tools' names.
pub(crate) struct SessionServers {
    id: String,
    principal: Who,
    log_level: LogLevel,
    list: RwLock<Vec<Arc<Upstream>>>,
}

impl SessionServers {
    pub(crate) fn new(id: &str, principal: Who, log_level: LogLevel) -> SessionServers {
        SessionServers {
            id: id.to_string(),
            principal,
            log_level,
            list: RwLock::new(Vec::new()),
        }
    }

    /// Every server of the session.
    pub(crate) fn all(&self) -> Vec<Arc<Upstream>> {
        self.list.read().map(|l| l.clone()).unwrap_or_default()
    }

    /// Add a server of each of `servers` the session has none of.
    pub(crate) fn fill(&self, servers: &[(Arc<ToolPolicy>, KnownOffers)], making: &Making) {
        let Ok(mut l) = self.list.write() else {
            return;
        };
        for (p, offers) in servers {
            if l.iter().any(|u| u.name() == p.name) {
                continue;
            }
            if let Some(u) = making.upstream(p, offers, self) {
                l.push(u);
            }
        }
        l.sort_by(|a, b| a.name().cmp(b.name()));
    }

    /// Stop and forget the servers of `tools` (a call in flight on one
    /// finishes first; the server is stopped with its last reference).
    fn drop_servers(&self, tools: &[String]) {
        let Ok(mut l) = self.list.write() else {
            return;
        };
        l.retain(|u| {
            let keep = !tools.iter().any(|t| t == u.name());
            if !keep {
                u.shutdown();
            }
            keep
        });
    }
}

/// What makes a session's server of an `mcp:` tool (the gateway's
/// sandbox, names, listing cache, broker and warm pools).
#[derive(Clone)]
pub(crate) struct Making {
    pub(crate) sandbox: Arc<dyn ServerSandbox>,
    pub(crate) names: Arc<names::NameClaims>,
    pub(crate) cache: crate::cache::ListingCache,
    pub(crate) broker: Arc<Broker>,
    pub(crate) warm: Arc<crate::warm::WarmPools>,
}

impl Making {
    /// `s`'s server of `p` (not started: it starts at its first use).
    fn upstream(
        &self,
        p: &Arc<ToolPolicy>,
        offers: &KnownOffers,
        s: &SessionServers,
    ) -> Option<Arc<Upstream>> {
        let u = Upstream::new(p.clone(), self.sandbox.clone(), &s.id, self.names.clone()).ok()?;
        Some(Arc::new(
            u.with_offers(offers.clone())
                .with_log_level(s.log_level.clone())
                .with_cache(self.cache.clone())
                .with_audit(self.broker.clone(), &s.id)
                .with_principal(s.principal.clone())
                .with_warm(self.warm.clone()),
        ))
    }
}

/// Applies a reload to one gateway ([`crate::Gateway::reloader`]).
pub struct Reloader {
    pub(crate) broker: Arc<Broker>,
    pub(crate) names: Arc<names::NameClaims>,
    pub(crate) commands: Commands,
    pub(crate) servers: Servers,
    pub(crate) live: LiveSessions,
    pub(crate) making: Making,
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    pub(crate) service: Arc<crate::service::Service>,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader").finish_non_exhaustive()
    }
}

/// A tool of a reload, admitted and ready to serve.
enum Built {
    Command(Box<CommandTool>),
    Server(Arc<ToolPolicy>),
}

impl Built {
    fn policy(&self) -> &ToolPolicy {
        match self {
            Built::Command(c) => &c.policy,
            Built::Server(p) => p,
        }
    }
}

impl Reloader {
    /// Whether `tool` is served now (a command tool or an `mcp:` server).
    pub fn serves(&self, tool: &str) -> bool {
        current(&self.commands).contains_key(tool)
            || servers_now(&self.servers)
                .iter()
                .any(|(p, _)| p.name == tool)
    }

    /// Admit `tool` of `new`, without serving it: why not, when it cannot
    /// be.
    pub fn admit(&self, p: &ToolPolicy) -> Result<(), String> {
        self.build(p).map(|_| ())
    }

    fn build(&self, p: &ToolPolicy) -> Result<Built, String> {
        let use_ = Use::of(p);
        let admitted = self.broker.admit(p, use_).map_err(|e| e.to_string())?;
        match use_ {
            Use::Call => Ok(Built::Command(Box::new(CommandTool::new(p, admitted)?))),
            Use::Serve => {
                let p = Arc::new(p.clone());
                // What a session's server needs of the manifest (its
                // command line) is read here, as at the gateway's start.
                Upstream::new(
                    p.clone(),
                    self.making.sandbox.clone(),
                    "",
                    self.making.names.clone(),
                )?;
                Ok(Built::Server(p))
            }
        }
    }

    /// Serve the tools of `new` named in `serve` (added or changed) and
    /// stop serving those in `remove`; the others are kept as they are.
    /// All or nothing: `Err` (nothing changed) when one of `serve` cannot
    /// be admitted, its arguments do not compile, or one of its names
    /// belongs to another tool.
    pub fn apply(
        &self,
        new: &PolicySet,
        serve: &[String],
        remove: &[String],
    ) -> Result<(), String> {
        let mut built = Vec::new();
        for name in serve {
            let p = new
                .tools
                .get(name)
                .ok_or_else(|| format!("{name}: not in the new manifest"))?;
            built.push(self.build(p).map_err(|e| format!("{name}: {e}"))?);
        }
        // The names of every tool replaced or removed are given up, those
        // of the new ones claimed: all at once.
        let release: Vec<names::Owner> = serve
            .iter()
            .chain(remove)
            .flat_map(|n| {
                [
                    names::Owner::Command(n.clone()),
                    names::Owner::Server(n.clone()),
                ]
            })
            .collect();
        let claims: Vec<(names::Space, String, names::Owner)> = built
            .iter()
            .flat_map(|b| match b {
                Built::Command(c) => vec![(
                    names::Space::Tools,
                    c.policy.name.clone(),
                    names::Owner::Command(c.policy.name.clone()),
                )],
                Built::Server(p) => crate::gateway::server_names(p),
            })
            .collect();
        self.names
            .replace(&release, &claims)
            .map_err(|(name, other)| format!("exposed name `{name}` belongs to {other}"))?;
        let Ok(mut commands) = self.commands.write() else {
            return Err("the gateway's command tools are unreadable (a thread panicked)".into());
        };
        let Ok(mut servers) = self.servers.write() else {
            return Err("the gateway's MCP servers are unreadable (a thread panicked)".into());
        };
        let gone = |n: &str| serve.iter().chain(remove).any(|t| t == n);
        let mut next_commands: BTreeMap<String, Arc<CommandTool>> = (**commands).clone();
        next_commands.retain(|n, _| !gone(n));
        let mut next_servers: Vec<(Arc<ToolPolicy>, KnownOffers)> = servers
            .iter()
            .filter(|(p, _)| !gone(&p.name))
            .cloned()
            .collect();
        for name in remove {
            self.service.remove(name);
        }
        self.metrics
            .add_tools(built.iter().map(|b| b.policy().name.clone()));
        for b in built {
            let name = b.policy().name.clone();
            let profile = cordon_broker::profile_name(b.policy().profile);
            self.service.serve(&name, profile);
            match b {
                Built::Command(c) => {
                    next_commands.insert(name, Arc::new(*c));
                }
                Built::Server(p) => {
                    let offers = KnownOffers::default();
                    if let Some(l) = self.making.cache.get(&p, cordon_auth::DEFAULT_TENANT)
                        && let Ok(mut o) = offers.lock()
                    {
                        *o = Some(l.offers);
                    }
                    next_servers.push((p, offers));
                }
            }
        }
        next_servers.sort_by(|a, b| a.0.name.cmp(&b.0.name));
        let next_servers = Arc::new(next_servers);
        *commands = Arc::new(next_commands);
        *servers = next_servers.clone();
        drop(servers);
        drop(commands);
        // Each live session: the servers of the tools replaced or removed
        // stopped, the new ones added (started at their next use).
        let replaced: Vec<String> = serve.iter().chain(remove).cloned().collect();
        let sessions: Vec<Arc<SessionServers>> = self
            .live
            .lock()
            .map(|l| l.iter().filter_map(Weak::upgrade).collect())
            .unwrap_or_default();
        for s in &sessions {
            s.drop_servers(&replaced);
            s.fill(&next_servers, &self.making);
        }
        self.making.warm.replace(
            next_servers.iter().map(|(p, _)| p.clone()).collect(),
            &replaced,
        );
        if !serve.is_empty() || !remove.is_empty() {
            self.service.tools_changed();
        }
        Ok(())
    }
}
