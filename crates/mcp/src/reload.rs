//! A reloaded manifest applied to a gateway while it serves (`cordon
//! serve`, SIGHUP). The caller decides what may be applied (the diff, the
//! probes); this applies the command tools a reload adds, changes or
//! removes, all at once or not at all: each added or changed tool is
//! admitted and its arguments compiled first, and only when every one is
//! the set of command tools is swapped. Tools left unchanged keep their
//! admitted sandbox; sessions, `mcp:` servers and warm pools are not
//! touched.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use cordon_broker::{Broker, Use};
use cordon_policy::policy::{PolicySet, ToolPolicy};

use crate::args::ArgMapper;
use crate::command::{CommandTool, command_tool};
use crate::names;

/// The command tools of a gateway, swapped whole by a reload.
pub(crate) type Commands = Arc<RwLock<Arc<BTreeMap<String, Arc<CommandTool>>>>>;

/// The command tools served now.
pub(crate) fn current(c: &Commands) -> Arc<BTreeMap<String, Arc<CommandTool>>> {
    c.read().map(|m| m.clone()).unwrap_or_default()
}

/// Applies a reload to one gateway ([`crate::Gateway::reloader`]).
pub struct Reloader {
    pub(crate) broker: Arc<Broker>,
    pub(crate) names: Arc<names::NameClaims>,
    pub(crate) commands: Commands,
    pub(crate) metrics: Arc<crate::metrics::Metrics>,
    pub(crate) service: Arc<crate::service::Service>,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader").finish_non_exhaustive()
    }
}

impl Reloader {
    /// Whether `tool` is a command tool served now.
    pub fn serves_command(&self, tool: &str) -> bool {
        current(&self.commands).contains_key(tool)
    }

    /// Admit `tool` of `new` as a command tool, without serving it: why
    /// not, when it cannot be.
    pub fn admit(&self, p: &ToolPolicy) -> Result<(), String> {
        self.build(p).map(|_| ())
    }

    fn build(&self, p: &ToolPolicy) -> Result<CommandTool, String> {
        if Use::of(p) != Use::Call {
            return Err(format!("{}: not a command tool", p.name));
        }
        let admitted = self.broker.admit(p, Use::Call).map_err(|e| e.to_string())?;
        let args = ArgMapper::new(p)?;
        Ok(CommandTool {
            policy: Arc::new(p.clone()),
            admitted,
            args,
            tool: command_tool(p),
        })
    }

    /// Serve the command tools of `new` named in `serve` (added or
    /// changed) and stop serving those in `remove`; the others are kept
    /// as they are. All or nothing: `Err` (nothing changed) when one of
    /// `serve` cannot be admitted, its arguments do not compile, or its
    /// name belongs to another tool.
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
        for t in &built {
            let name = &t.policy.name;
            if let Some(other) = self.names.owner(names::Space::Tools, name)
                && other != names::Owner::Command(name.clone())
            {
                return Err(format!("exposed name `{name}` belongs to {other}"));
            }
        }
        for t in &built {
            let name = &t.policy.name;
            let _ = self.names.claim(
                names::Space::Tools,
                name,
                names::Owner::Command(name.clone()),
            );
        }
        let Ok(mut commands) = self.commands.write() else {
            return Err("the gateway's command tools are unreadable (a thread panicked)".into());
        };
        let mut next: BTreeMap<String, Arc<CommandTool>> = (**commands).clone();
        for name in remove {
            next.remove(name);
            self.service.remove(name);
        }
        self.metrics
            .add_tools(built.iter().map(|t| t.policy.name.clone()));
        for t in built {
            let name = t.policy.name.clone();
            let profile = cordon_broker::profile_name(t.policy.profile);
            self.service.serve(&name, profile);
            next.insert(name, Arc::new(t));
        }
        *commands = Arc::new(next);
        drop(commands);
        if !serve.is_empty() || !remove.is_empty() {
            self.service.tools_changed();
        }
        Ok(())
    }
}
