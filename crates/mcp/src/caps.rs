//! Caps at the gateway's door (`gateway:` in the manifest), of three
//! kinds:
//!
//! - **rate**: a principal's calls per rolling minute;
//! - **concurrency**: a tool's `max_concurrent` (a call beyond it waits up
//!   to `queue_seconds`, then is refused as busy), a principal's sessions,
//!   the calls in flight and live sandboxes of each principal and of each
//!   tenant, and the live sandboxes of all sessions (`max_sandboxes`);
//! - **fair share** of `max_sandboxes` between tenants: while more than
//!   one tenant wants sandboxes (holds one, or asked for one in the last
//!   [`DEMAND_WINDOW`]), a tenant at or above its share (`max_sandboxes` /
//!   tenants wanting, at least 1) takes another only when the free ones
//!   outnumber what the other tenants still lack of their own shares.
//!
//! Every refusal is an MCP error whose `data` says `cordon/status` and
//! which cap (`limit`), so its audit record names both.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use cordon_policy::PolicySet;
use cordon_policy::gateway::GatewayPolicy;
use rmcp::ErrorData;
use serde_json::json;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::render::{Refusal, refusal};

/// How long a tenant that asked for a sandbox counts as wanting one (for
/// the fair share of `max_sandboxes`).
pub(crate) const DEMAND_WINDOW: Duration = Duration::from_secs(60);

/// Which principal a cap counts for: its tenant and subject.
type Key = (String, String);

fn key(p: &cordon_auth::Principal) -> Key {
    (p.tenant.clone(), p.subject.clone())
}

/// What one principal holds.
#[derive(Default)]
struct Use {
    sessions: u32,
    /// When each call of the last minute was let through.
    calls: VecDeque<Instant>,
    /// Tool calls in flight.
    in_flight: u32,
    /// Live sandboxes.
    sandboxes: u32,
}

impl Use {
    fn idle(&self) -> bool {
        self.sessions == 0 && self.calls.is_empty() && self.in_flight == 0 && self.sandboxes == 0
    }
}

/// What one tenant holds, all its principals together.
#[derive(Default)]
struct TenantUse {
    in_flight: u32,
    sandboxes: u32,
    /// When it last asked for a sandbox.
    asked: Option<Instant>,
}

impl TenantUse {
    fn wants(&self, now: Instant) -> bool {
        self.sandboxes > 0
            || self
                .asked
                .is_some_and(|t| now.duration_since(t) < DEMAND_WINDOW)
    }
}

#[derive(Default)]
struct Ledger {
    principals: HashMap<Key, Use>,
    tenants: HashMap<String, TenantUse>,
    /// Live sandboxes of all sessions.
    sandboxes: u64,
}

impl Ledger {
    /// Forget what `k` and its tenant no longer hold.
    fn forget_idle(&mut self, k: &Key) {
        if self.principals.get(k).is_some_and(Use::idle) {
            self.principals.remove(k);
        }
        let now = Instant::now();
        self.tenants.retain(|_, t| t.in_flight > 0 || t.wants(now));
    }
}

/// The caps of one gateway, shared by its sessions.
pub(crate) struct Caps {
    policy: GatewayPolicy,
    /// Per tool (command tool or `mcp:` server): slots and the wait.
    tools: HashMap<String, (Arc<Semaphore>, Duration)>,
    ledger: Mutex<Ledger>,
}

/// A principal's open session: counted until dropped.
pub(crate) struct SessionSlot {
    caps: Arc<Caps>,
    key: Key,
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        if let Ok(mut l) = self.caps.ledger.lock() {
            if let Some(u) = l.principals.get_mut(&self.key) {
                u.sessions = u.sessions.saturating_sub(1);
            }
            l.forget_idle(&self.key);
        }
    }
}

/// A call in flight of a principal (and its tenant): counted until dropped.
pub(crate) struct CallSlot {
    caps: Arc<Caps>,
    key: Key,
}

impl Drop for CallSlot {
    fn drop(&mut self) {
        if let Ok(mut l) = self.caps.ledger.lock() {
            if let Some(u) = l.principals.get_mut(&self.key) {
                u.in_flight = u.in_flight.saturating_sub(1);
            }
            if let Some(t) = l.tenants.get_mut(&self.key.0) {
                t.in_flight = t.in_flight.saturating_sub(1);
            }
            l.forget_idle(&self.key);
        }
    }
}

/// A live sandbox of a principal: counted (for it, its tenant and the
/// gateway) until dropped.
pub(crate) struct SandboxSlot {
    caps: Arc<Caps>,
    key: Key,
}

impl std::fmt::Debug for SandboxSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SandboxSlot({}/{})", self.key.0, self.key.1)
    }
}

impl Drop for SandboxSlot {
    fn drop(&mut self) {
        if let Ok(mut l) = self.caps.ledger.lock() {
            l.sandboxes = l.sandboxes.saturating_sub(1);
            if let Some(u) = l.principals.get_mut(&self.key) {
                u.sandboxes = u.sandboxes.saturating_sub(1);
            }
            if let Some(t) = l.tenants.get_mut(&self.key.0) {
                t.sandboxes = t.sandboxes.saturating_sub(1);
            }
            l.forget_idle(&self.key);
        }
    }
}

/// What a call holds until it ends.
pub(crate) struct Held {
    _call: CallSlot,
    _tool: Option<OwnedSemaphorePermit>,
    _sandbox: Option<SandboxSlot>,
}

/// Why a sandbox was refused: the cap (`limit`) and what is said.
pub(crate) struct SandboxRefused {
    limit: &'static str,
    why: String,
}

impl SandboxRefused {
    fn error(&self, called: &str) -> ErrorData {
        refusal(
            Refusal::Busy,
            format!("{called}: busy: {}; try again later", self.why),
            json!({"tool": called, "limit": self.limit}),
        )
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
            ledger: Mutex::new(Ledger::default()),
        }
    }

    pub(crate) fn policy(&self) -> &GatewayPolicy {
        &self.policy
    }

    fn ledger(&self) -> Result<MutexGuard<'_, Ledger>, ErrorData> {
        self.ledger
            .lock()
            .map_err(|_| ErrorData::internal_error("the caps' lock is poisoned", None))
    }

    /// Whether any cap counts sandboxes (then servers' are counted too).
    pub(crate) fn counts_sandboxes(&self) -> bool {
        let g = &self.policy;
        g.max_sandboxes.is_some()
            || g.per_principal.sandboxes.is_some()
            || g.per_tenant.sandboxes.is_some()
    }

    /// The caps a call of `p` passes at the door, in order: its rate, its
    /// and its tenant's calls in flight, a slot of `tool` (the manifest's
    /// name; waits up to its `queue_seconds`) and, for a command call
    /// (`sandbox`), a live sandbox. All are held until the call ends.
    pub(crate) async fn door(
        self: &Arc<Self>,
        p: &cordon_auth::Principal,
        tool: &str,
        called: &str,
        sandbox: bool,
    ) -> Result<Held, ErrorData> {
        self.admit_call(p, called)?;
        let call = self.call_slot(p, called)?;
        let tool = self.tool_slot(tool, called).await?;
        let sandbox = if sandbox && self.counts_sandboxes() {
            Some(
                self.take_sandbox(&p.tenant, &p.subject)
                    .map_err(|r| r.error(called))?,
            )
        } else {
            None
        };
        Ok(Held {
            _call: call,
            _tool: tool,
            _sandbox: sandbox,
        })
    }

    /// A slot of `tool` (the manifest's name): at once, or once one frees
    /// within its `queue_seconds`; else a `busy` refusal. `None`: the tool
    /// has no cap.
    async fn tool_slot(
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

    /// A call in flight of `p`, or a `busy` refusal at its or its tenant's
    /// `calls_in_flight`.
    fn call_slot(
        self: &Arc<Self>,
        p: &cordon_auth::Principal,
        called: &str,
    ) -> Result<CallSlot, ErrorData> {
        let mut l = self.ledger()?;
        let k = key(p);
        let mine = l.principals.get(&k).map_or(0, |u| u.in_flight);
        let ours = l.tenants.get(&p.tenant).map_or(0, |t| t.in_flight);
        let refused = |limit: &str, max: u32, whose: String| {
            refusal(
                Refusal::Busy,
                format!(
                    "{called}: busy: {whose} has {max} calls in flight already (`{limit}`); try again once one ends"
                ),
                json!({"tool": called, "limit": limit, "principal": p.subject, "tenant": p.tenant}),
            )
        };
        if let Some(max) = self.policy.per_principal.calls_in_flight
            && mine >= max
        {
            return Err(refused(
                "per_principal.calls_in_flight",
                max,
                format!("`{}`", p.subject),
            ));
        }
        if let Some(max) = self.policy.per_tenant.calls_in_flight
            && ours >= max
        {
            return Err(refused(
                "per_tenant.calls_in_flight",
                max,
                format!("tenant `{}`", p.tenant),
            ));
        }
        l.principals.entry(k.clone()).or_default().in_flight += 1;
        l.tenants.entry(p.tenant.clone()).or_default().in_flight += 1;
        Ok(CallSlot {
            caps: self.clone(),
            key: k,
        })
    }

    /// A live sandbox for `subject` of `tenant`: refused at the
    /// principal's or the tenant's `sandboxes`, at `max_sandboxes`, or
    /// beyond the tenant's fair share of it.
    pub(crate) fn take_sandbox(
        self: &Arc<Self>,
        tenant: &str,
        subject: &str,
    ) -> Result<SandboxSlot, SandboxRefused> {
        let mut l = self.ledger.lock().map_err(|_| SandboxRefused {
            limit: "max_sandboxes",
            why: "the caps' lock is poisoned".into(),
        })?;
        let k: Key = (tenant.to_string(), subject.to_string());
        let g = &self.policy;
        let mine = l.principals.get(&k).map_or(0, |u| u.sandboxes);
        if let Some(max) = g.per_principal.sandboxes
            && mine >= max
        {
            return Err(SandboxRefused {
                limit: "per_principal.sandboxes",
                why: format!(
                    "`{subject}` holds {max} live sandboxes already (`per_principal.sandboxes`)"
                ),
            });
        }
        let ours = l.tenants.get(tenant).map_or(0, |t| t.sandboxes);
        if let Some(max) = g.per_tenant.sandboxes
            && ours >= max
        {
            return Err(SandboxRefused {
                limit: "per_tenant.sandboxes",
                why: format!(
                    "tenant `{tenant}` holds {max} live sandboxes already (`per_tenant.sandboxes`)"
                ),
            });
        }
        let now = Instant::now();
        l.tenants.entry(tenant.to_string()).or_default().asked = Some(now);
        if let Some(max) = g.max_sandboxes {
            if l.sandboxes >= max {
                return Err(SandboxRefused {
                    limit: "max_sandboxes",
                    why: "every live sandbox the gateway allows is taken (`gateway: {max_sandboxes}`)"
                        .into(),
                });
            }
            let wanting: Vec<(&String, &TenantUse)> =
                l.tenants.iter().filter(|(_, t)| t.wants(now)).collect();
            if wanting.len() > 1 {
                let share = (max / wanting.len() as u64).max(1);
                // What the other tenants wanting sandboxes still lack of
                // their shares stays free for them.
                let owed: u64 = wanting
                    .iter()
                    .filter(|(t, _)| t.as_str() != tenant)
                    .map(|(_, u)| share.saturating_sub(u.sandboxes.into()))
                    .sum();
                let free = max - l.sandboxes;
                if u64::from(ours) >= share && free <= owed {
                    return Err(SandboxRefused {
                        limit: "fair_share",
                        why: format!(
                            "tenant `{tenant}` holds {ours} of the {max} live sandboxes (`max_sandboxes`), its fair share while {} tenants want them",
                            wanting.len()
                        ),
                    });
                }
            }
        }
        l.sandboxes += 1;
        l.principals.entry(k.clone()).or_default().sandboxes += 1;
        if let Some(t) = l.tenants.get_mut(tenant) {
            t.sandboxes += 1;
        }
        Ok(SandboxSlot {
            caps: self.clone(),
            key: k,
        })
    }

    /// Count one call of `p` against its `calls_per_minute`, or refuse it
    /// (`rate_limited`, not counted).
    fn admit_call(&self, p: &cordon_auth::Principal, called: &str) -> Result<(), ErrorData> {
        let Some(max) = self.policy.per_principal.calls_per_minute else {
            return Ok(());
        };
        let now = Instant::now();
        let mut all = self.ledger()?;
        let u = all.principals.entry(key(p)).or_default();
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
    /// `per_principal.sessions` open already (`stateless`: the session is
    /// one request of stateless HTTP, which the refusal says).
    pub(crate) fn open_session(
        self: &Arc<Self>,
        p: &cordon_auth::Principal,
        stateless: bool,
    ) -> Result<SessionSlot, ErrorData> {
        let mut all = self.ledger()?;
        let u = all.principals.entry(key(p)).or_default();
        if let Some(max) = self.policy.per_principal.sessions
            && u.sessions >= max
        {
            let what = if stateless {
                " (over stateless HTTP each request in flight is a session)"
            } else {
                ""
            };
            return Err(refusal(
                Refusal::TooManySessions,
                format!(
                    "{} has {max} sessions open already (`per_principal.sessions`){what}; end one first",
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

/// How [`CappedServers`] says a server's sandbox was refused (the
/// connection turns it back into the refusal: [`server_refused`]).
const SANDBOX_REFUSED: &str = "cordon: sandbox cap ";

/// The refusal of a server start that [`CappedServers`] refused, for the
/// tool called `called`; `None`: another failure.
pub(crate) fn server_refused(e: &str, called: &str) -> Option<ErrorData> {
    let (limit, why) = e.strip_prefix(SANDBOX_REFUSED)?.split_once(": ")?;
    let limit = [
        "max_sandboxes",
        "fair_share",
        "per_principal.sandboxes",
        "per_tenant.sandboxes",
    ]
    .into_iter()
    .find(|l| *l == limit)?;
    Some(
        SandboxRefused {
            limit,
            why: why.to_string(),
        }
        .error(called),
    )
}

/// A [`ServerSandbox`](crate::ServerSandbox) whose servers each hold one
/// live sandbox of their principal (and its tenant, and the gateway) until
/// they are stopped.
pub(crate) struct CappedServers {
    pub(crate) inner: Arc<dyn crate::ServerSandbox>,
    pub(crate) caps: Arc<Caps>,
}

impl crate::ServerSandbox for CappedServers {
    fn start(
        &self,
        who: &cordon_broker::Caller,
        policy: &cordon_policy::ToolPolicy,
        argv: &[String],
    ) -> Result<crate::ServerProcess, String> {
        let subject = who
            .principal
            .clone()
            .unwrap_or_else(|| cordon_auth::Principal::unauthenticated().subject);
        let slot = self
            .caps
            .take_sandbox(&who.tenant, &subject)
            .map_err(|r| format!("{SANDBOX_REFUSED}{}: {}", r.limit, r.why))?;
        let mut p = self.inner.start(who, policy, argv)?;
        p.handle = Arc::new(CappedHandle {
            inner: p.handle,
            permit: Mutex::new(Some(slot)),
        });
        Ok(p)
    }
}

impl Caps {
    /// Count the running server `handle` as a live sandbox of `who` (when
    /// a cap counts sandboxes), until it is killed or ends: a warm pool's
    /// server handed to a session. `Err` when a cap is full.
    pub(crate) fn hold(
        self: &Arc<Self>,
        who: &cordon_broker::Caller,
        handle: Arc<dyn crate::ServerHandle>,
    ) -> Result<Arc<dyn crate::ServerHandle>, String> {
        if !self.counts_sandboxes() {
            return Ok(handle);
        }
        let subject = who
            .principal
            .clone()
            .unwrap_or_else(|| cordon_auth::Principal::unauthenticated().subject);
        let slot = self
            .take_sandbox(&who.tenant, &subject)
            .map_err(|r| format!("{SANDBOX_REFUSED}{}: {}", r.limit, r.why))?;
        Ok(Arc::new(CappedHandle {
            inner: handle,
            permit: Mutex::new(Some(slot)),
        }))
    }
}

#[derive(Debug)]
struct CappedHandle {
    inner: Arc<dyn crate::ServerHandle>,
    permit: Mutex<Option<SandboxSlot>>,
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

    fn refusals(&self) -> Option<&crate::refusals::Refusals> {
        self.inner.refusals()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default)]
    struct Refused(crate::refusals::Refusals);

    impl crate::ServerHandle for Refused {
        fn kill(&self) {}
        fn exited(&self) -> Option<String> {
            None
        }
        fn live_tokens(&self) -> cordon_gate::LiveTokens {
            cordon_gate::LiveTokens::default()
        }
        fn refusals(&self) -> Option<&crate::refusals::Refusals> {
            Some(&self.0)
        }
    }

    /// A server held to the caps still tells its call the egress it was
    /// refused: the wrapper passes its sandbox's refusals through.
    #[test]
    fn a_capped_server_passes_its_refused_egress_through() {
        let inner = Refused::default();
        let mark = inner.0.mark();
        inner.0.push("169.254.169.254:80", "a link-local address");
        let capped = CappedHandle {
            inner: Arc::new(inner),
            permit: Mutex::new(None),
        };
        let seen = crate::ServerHandle::refusals(&capped)
            .map(|r| r.since(mark))
            .unwrap_or_default();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert!(seen[0].contains("169.254.169.254:80"), "{seen:?}");
    }

    fn caps(gateway: &str) -> Arc<Caps> {
        let m = format!(
            "version: 1\ngateway: {gateway}\ntools:\n  t:\n    profile: P1\n    command: [/bin/true]\n"
        );
        let l = cordon_policy::load_str(std::path::Path::new("m.yaml"), &m).unwrap();
        Arc::new(Caps::new(&l.policy))
    }

    #[test]
    fn a_tenant_keeps_its_fair_share_of_a_pool_another_filled() {
        let c = caps("{max_sandboxes: 20}");
        // Alone, tenant a takes the whole pool.
        let mut a: Vec<SandboxSlot> = (0..20)
            .map(|_| c.take_sandbox("a", "x").ok().unwrap())
            .collect();
        let r = c.take_sandbox("b", "y").err().unwrap();
        assert_eq!(r.limit, "max_sandboxes");
        // Half of a's end: b (wanting, refused) is owed its share of 10,
        // so a (at its share) gets none of them, b gets them all.
        a.truncate(10);
        let r = c.take_sandbox("a", "x").err().unwrap();
        assert_eq!(r.limit, "fair_share", "{}", r.why);
        assert!(r.why.contains("holds 10 of the 20"), "{}", r.why);
        let b: Vec<SandboxSlot> = (0..10)
            .map(|_| c.take_sandbox("b", "y").ok().unwrap())
            .collect();
        assert_eq!(
            c.take_sandbox("b", "y").err().unwrap().limit,
            "max_sandboxes"
        );
        // Below its share, a takes one as soon as one frees.
        a.truncate(9);
        drop(c.take_sandbox("a", "x").ok().unwrap());
        drop((a, b));
        let l = c.ledger.lock().unwrap();
        assert_eq!(l.sandboxes, 0);
        assert!(l.principals.is_empty());
    }

    #[test]
    fn a_tenant_beyond_its_share_takes_what_no_other_lacks() {
        let c = caps("{max_sandboxes: 10}");
        let b = c.take_sandbox("b", "y").ok().unwrap();
        // b holds 1 of its share of 5: 4 stay free for it.
        let a: Vec<SandboxSlot> = (0..5)
            .map(|_| c.take_sandbox("a", "x").ok().unwrap())
            .collect();
        assert_eq!(c.take_sandbox("a", "x").err().unwrap().limit, "fair_share");
        drop((a, b));
    }

    #[test]
    fn per_principal_and_per_tenant_sandboxes_hold() {
        let c = caps("{per_principal: {sandboxes: 1}, per_tenant: {sandboxes: 2}}");
        let one = c.take_sandbox("t", "p1").ok().unwrap();
        let r = c.take_sandbox("t", "p1").err().unwrap();
        assert_eq!(r.limit, "per_principal.sandboxes");
        let two = c.take_sandbox("t", "p2").ok().unwrap();
        let r = c.take_sandbox("t", "p3").err().unwrap();
        assert_eq!(r.limit, "per_tenant.sandboxes");
        // Another tenant is not held; an ended one frees its slot.
        drop(c.take_sandbox("u", "p1").ok().unwrap());
        drop(one);
        drop(c.take_sandbox("t", "p3").ok().unwrap());
        drop(two);
    }
}
