//! Caps at the gateway's door: a tool's `max_concurrent` (a call beyond it
//! waits up to `queue_seconds`, then is refused as busy), each principal's
//! calls per minute and sessions open at once, and the bound on live
//! sandboxes of all sessions together (`gateway:` in the manifest). Every
//! refusal is an MCP error whose `data` says `cordon/status` and which cap
//! (`limit`), so its audit record names both.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cordon_policy::PolicySet;
use cordon_policy::gateway::GatewayPolicy;
use rmcp::ErrorData;
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::render::{Refusal, refusal};

/// Which principal a cap counts for: its tenant and subject.
type Key = (String, String);

fn key(p: &cordon_auth::Principal) -> Key {
    (p.tenant.clone(), p.subject.clone())
}

#[derive(Default)]
struct Use {
    sessions: u32,
    /// When each call of the last minute was let through.
    calls: VecDeque<Instant>,
}

/// The caps of one gateway, shared by its sessions.
pub(crate) struct Caps {
    policy: GatewayPolicy,
    /// Per tool (command tool or `mcp:` server): slots and the wait.
    tools: HashMap<String, (Arc<Semaphore>, Duration)>,
    sandboxes: Option<Arc<Semaphore>>,
    principals: Mutex<HashMap<Key, Use>>,
}

/// A principal's open session: counted until dropped.
pub(crate) struct SessionSlot {
    caps: Arc<Caps>,
    key: Key,
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        if let Ok(mut p) = self.caps.principals.lock()
            && let Some(u) = p.get_mut(&self.key)
        {
            u.sessions = u.sessions.saturating_sub(1);
            if u.sessions == 0 && u.calls.is_empty() {
                p.remove(&self.key);
            }
        }
    }
}

impl Caps {
    pub(crate) fn new(set: &PolicySet) -> Caps {
        Caps {
            policy: set.gateway.clone(),
            tools: set
                .tools
                .iter()
                .filter_map(|(n, t)| {
                    t.concurrency.map(|c| {
                        (
                            n.clone(),
                            (
                                Arc::new(Semaphore::new(c.max_concurrent as usize)),
                                Duration::from_secs(c.queue_seconds),
                            ),
                        )
                    })
                })
                .collect(),
            sandboxes: set
                .gateway
                .max_sandboxes
                .map(|n| Arc::new(Semaphore::new(n.min(Semaphore::MAX_PERMITS as u64) as usize))),
            principals: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn policy(&self) -> &GatewayPolicy {
        &self.policy
    }

    /// The bound on live sandboxes, shared with the servers' sandbox.
    pub(crate) fn sandboxes(&self) -> Option<Arc<Semaphore>> {
        self.sandboxes.clone()
    }

    /// A slot of `tool` (the manifest's name): at once, or once one frees
    /// within its `queue_seconds`; else a `busy` refusal. `None`: the tool
    /// has no cap.
    pub(crate) async fn tool_slot(
        &self,
        tool: &str,
        called: &str,
    ) -> Result<Option<OwnedSemaphorePermit>, ErrorData> {
        let Some((sem, wait)) = self.tools.get(tool) else {
            return Ok(None);
        };
        match tokio::time::timeout(*wait, sem.clone().acquire_owned()).await {
            Ok(Ok(p)) => Ok(Some(p)),
            _ => Err(refusal(
                Refusal::Busy,
                format!(
                    "{called}: busy: `{tool}` already runs its `max_concurrent` calls and none ended within {}s (`queue_seconds`); try again later",
                    wait.as_secs()
                ),
                json!({"tool": called, "limit": "max_concurrent"}),
            )),
        }
    }

    /// A live sandbox for one command call (`None`: no bound), or a
    /// `busy` refusal when every one is taken.
    pub(crate) fn sandbox_slot(
        &self,
        called: &str,
    ) -> Result<Option<OwnedSemaphorePermit>, ErrorData> {
        let Some(sem) = &self.sandboxes else {
            return Ok(None);
        };
        sem.clone()
            .try_acquire_owned()
            .map(Some)
            .map_err(|_| sandboxes_full(called))
    }

    /// Count one call of `p` against its `calls_per_minute`, or refuse it
    /// (`rate_limited`, not counted).
    pub(crate) fn admit_call(
        &self,
        p: &cordon_auth::Principal,
        called: &str,
    ) -> Result<(), ErrorData> {
        let Some(max) = self.policy.per_principal.calls_per_minute else {
            return Ok(());
        };
        let now = Instant::now();
        let mut all = self
            .principals
            .lock()
            .map_err(|_| ErrorData::internal_error("the caps' lock is poisoned", None))?;
        let u = all.entry(key(p)).or_default();
        while u
            .calls
            .front()
            .is_some_and(|t| now.duration_since(*t) >= Duration::from_secs(60))
        {
            u.calls.pop_front();
        }
        if u.calls.len() >= max as usize {
            return Err(refusal(
                Refusal::RateLimited,
                format!(
                    "{called}: rate limited: {} made {max} calls in the last minute (`per_principal.calls_per_minute`); try again later",
                    p.subject
                ),
                json!({"tool": called, "limit": "calls_per_minute", "principal": p.subject}),
            ));
        }
        u.calls.push_back(now);
        Ok(())
    }

    /// Open a session of `p`, or refuse it when `p` has its
    /// `per_principal.sessions` open already.
    pub(crate) fn open_session(
        self: &Arc<Self>,
        p: &cordon_auth::Principal,
    ) -> Result<SessionSlot, ErrorData> {
        let mut all = self
            .principals
            .lock()
            .map_err(|_| ErrorData::internal_error("the caps' lock is poisoned", None))?;
        let u = all.entry(key(p)).or_default();
        if let Some(max) = self.policy.per_principal.sessions
            && u.sessions >= max
        {
            return Err(refusal(
                Refusal::TooManySessions,
                format!(
                    "{} has {max} sessions open already (`per_principal.sessions`); end one first",
                    p.subject
                ),
                json!({"limit": "sessions", "principal": p.subject}),
            ));
        }
        u.sessions += 1;
        Ok(SessionSlot {
            caps: self.clone(),
            key: key(p),
        })
    }
}

/// The refusal of a sandbox beyond `max_sandboxes`.
pub(crate) fn sandboxes_full(called: &str) -> ErrorData {
    refusal(
        Refusal::Busy,
        format!(
            "{called}: busy: every live sandbox the gateway allows is taken (`gateway: {{max_sandboxes}}`); try again later"
        ),
        json!({"tool": called, "limit": "max_sandboxes"}),
    )
}

/// What [`CappedServers`] answers when every sandbox is taken (the
/// connection turns it into [`sandboxes_full`]).
pub(crate) const SANDBOXES_FULL: &str = "cordon: every sandbox of max_sandboxes is taken";

/// A [`ServerSandbox`](crate::ServerSandbox) whose servers each hold one
/// of the gateway's live sandboxes until they are stopped.
pub(crate) struct CappedServers {
    pub(crate) inner: Arc<dyn crate::ServerSandbox>,
    pub(crate) slots: Arc<Semaphore>,
}

impl crate::ServerSandbox for CappedServers {
    fn start(
        &self,
        who: &cordon_broker::Caller,
        policy: &cordon_policy::ToolPolicy,
        argv: &[String],
    ) -> Result<crate::ServerProcess, String> {
        let permit = self
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| SANDBOXES_FULL.to_string())?;
        let mut p = self.inner.start(who, policy, argv)?;
        p.handle = Arc::new(CappedHandle {
            inner: p.handle,
            permit: Mutex::new(Some(permit)),
        });
        Ok(p)
    }
}

#[derive(Debug)]
struct CappedHandle {
    inner: Arc<dyn crate::ServerHandle>,
    permit: Mutex<Option<OwnedSemaphorePermit>>,
}

impl crate::ServerHandle for CappedHandle {
    fn kill(&self) {
        self.inner.kill();
        if let Ok(mut p) = self.permit.lock() {
            p.take();
        }
    }

    fn exited(&self) -> Option<String> {
        let e = self.inner.exited();
        if e.is_some()
            && let Ok(mut p) = self.permit.lock()
        {
            p.take();
        }
        e
    }

    fn live_tokens(&self) -> cordon_gate::LiveTokens {
        self.inner.live_tokens()
    }
}
