//! Warm pools of `mcp:` servers (`mcp: {warm: N}`, `lifetime: session`
//! only): sandboxes whose server has already answered `initialize` and
//! `tools/list`, kept per tenant and tool, each handed to exactly one
//! session (its first start takes one) and stopped with that session,
//! never reused.
//!
//! - **Filled in the background**: the default tenant's pools when the
//!   gateway starts serving, another tenant's when one of its sessions
//!   first finds its pool empty (that session starts its server cold),
//!   each pool again after every hand-over, and a tool's pools when it
//!   returns to service or a reload changes it.
//! - **Checked before the hand-over**: a server whose sandbox has ended or
//!   whose connection closed while it waited is discarded (stopped, an
//!   audit record with `pool.event: discarded`), never handed out; the
//!   session takes the next one or starts one cold.
//! - **Bound at the hand-over**: until then the server's notifications
//!   are dropped and its requests to the client refused; from then on they
//!   are the session's. Each hand-over is an audit record of the session
//!   (`pool: {event: handed_over, sandbox, pooled: true, waited_ms}`).
//! - **Counted from the hand-over**: a waiting sandbox holds none of
//!   `max_sandboxes`; a handed-over one holds one like a server started
//!   for the session (refused the same way when the cap is full, and then
//!   kept in the pool).
//! - **Retried after a failed start**: a server that did not start (or
//!   whose warm-up failed) is audited (`pool.event: failed`) and its pool
//!   is refilled again in the background after a backoff (1 s, doubling
//!   to 60 s, back to 1 s once a server is ready), without waiting for a
//!   take; one retry at a time per pool, none once the gateway stops or
//!   while the tool is out of service.
//! - **Stopped with the gateway**: the sandboxes still waiting are killed
//!   when serving ends.
//!
//! A waiting server runs under the pool's own id (`mcp-warm-<pid>-<n>`),
//! not a session's: its egress records carry that id, and the hand-over
//! record ties it to the session.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use cordon_broker::{Broker, Caller};
use cordon_policy::policy::{Exec, ToolPolicy};

use crate::caps::Caps;
use crate::sandbox::ServerSandbox;
use crate::upstream::{Bound, Launched, launch, server_argv};

/// The warm servers of a pool waiting for a session, and those starting.
#[derive(Default)]
struct Pool {
    ready: VecDeque<Ready>,
    starting: usize,
    /// Handed to sessions so far.
    handed_out: u64,
    /// Starts that failed and servers discarded so far, and the last
    /// one's reason.
    failures: u64,
    last_failure: Option<String>,
    /// The wait before the next retry after a failed start (`None`: the
    /// first, [`RETRY_FIRST`]).
    backoff: Option<Duration>,
    /// A retry is scheduled.
    retrying: bool,
}

/// The first wait before a failed start is retried.
const RETRY_FIRST: Duration = Duration::from_secs(1);
/// The longest wait before a retry (the backoff doubles up to it).
const RETRY_MAX: Duration = Duration::from_secs(60);

/// Put `tenant`'s pool of `tool` on the pool status board (what `cordon
/// doctor` shows of a running `cordon serve`).
fn report(tool: &str, tenant: &str, size: usize, pool: &Pool) {
    cordon_runtime::pool_status::update("mcp", &format!("{tenant}/{tool}"), tool, tenant, |e| {
        e.size = size;
        e.ready = pool.ready.len();
        e.starting = pool.starting;
        e.handed_out = pool.handed_out;
        e.refill_failures = pool.failures;
        e.last_failure = pool.last_failure.clone();
    });
}

struct Ready {
    /// What it was started as (a reload can replace it).
    policy: Arc<ToolPolicy>,
    /// The id it runs under.
    id: String,
    launched: Launched,
    /// Where its connection passes what the server sends, once handed over.
    bound: Arc<OnceLock<Bound>>,
    /// When it became ready.
    since: Instant,
}

/// The caller of a warm pool's own records.
pub(crate) const CALLER: &str = "mcp-pool";

/// Numbers the warm servers of this process (their ids).
static SEQ: AtomicU64 = AtomicU64::new(0);

/// How many servers of `policy` are kept ready (0: not pooled).
pub(crate) fn warm_of(policy: &ToolPolicy) -> usize {
    match &policy.exec {
        Exec::Mcp { warm, .. } if policy.lifetime == cordon_policy::policy::Lifetime::Session => {
            *warm as usize
        }
        _ => 0,
    }
}

/// Make the manifest's warm-up call (`mcp: {warm_up:}`), if any, within
/// the tool's `wall_seconds`; its result is discarded. A server whose
/// warm-up fails (an error, an error result, no answer in time) is
/// stopped, never pooled.
async fn warm_up(policy: &ToolPolicy, l: Launched) -> Result<Launched, String> {
    let Exec::Mcp {
        warm_up: Some(call),
        ..
    } = &policy.exec
    else {
        return Ok(l);
    };
    let wall = policy
        .limits
        .map(|x| x.wall)
        .unwrap_or(Duration::from_secs(30));
    let mut p = rmcp::model::CallToolRequestParams::new(call.tool.clone());
    p.arguments = Some(call.arguments.clone());
    let failed = match tokio::time::timeout(wall, l.service.peer().call_tool(p)).await {
        Ok(Ok(r)) if r.is_error != Some(true) => None,
        Ok(Ok(_)) => Some("an error result".to_string()),
        Ok(Err(e)) => Some(e.to_string()),
        Err(_) => Some(format!(
            "no answer within {}",
            cordon_sandbox::units::format_duration(wall)
        )),
    };
    match failed {
        None => Ok(l),
        Some(why) => {
            l.handle.kill();
            let why = crate::upstream::gate_server_message(policy, &why);
            Err(format!(
                "its warm-up call `{}` failed ({why}); it was stopped",
                call.tool
            ))
        }
    }
}

/// The warm pools of one gateway.
pub(crate) struct WarmPools {
    /// Starts servers without holding a sandbox cap (a waiting sandbox is
    /// not counted).
    sandbox: Arc<dyn ServerSandbox>,
    caps: Arc<Caps>,
    broker: Arc<Broker>,
    /// The servers kept warm (replaced by a reload).
    servers: Mutex<Vec<Arc<ToolPolicy>>>,
    /// The runtime the pools fill in (from the first fill), for a
    /// reload's refill, which comes from another thread.
    runtime: OnceLock<tokio::runtime::Handle>,
    pools: Mutex<HashMap<(String, String), Pool>>,
    closed: AtomicBool,
    /// Tools out of service: none of their servers is kept or started.
    suspended: Mutex<std::collections::BTreeSet<String>>,
}

impl WarmPools {
    pub(crate) fn new(
        sandbox: Arc<dyn ServerSandbox>,
        caps: Arc<Caps>,
        broker: Arc<Broker>,
        servers: Vec<Arc<ToolPolicy>>,
    ) -> Arc<WarmPools> {
        Arc::new(WarmPools {
            sandbox,
            caps,
            broker,
            servers: Mutex::new(servers.into_iter().filter(|p| warm_of(p) > 0).collect()),
            runtime: OnceLock::new(),
            pools: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            suspended: Mutex::new(Default::default()),
        })
    }

    /// Fill every warm server's pool of `tenant` in the background (within
    /// a tokio runtime).
    pub(crate) fn fill(self: &Arc<Self>, tenant: &str) {
        if let Ok(h) = tokio::runtime::Handle::try_current() {
            let _ = self.runtime.set(h);
        }
        for p in self.kept() {
            self.refill(&p, tenant);
        }
    }

    /// The servers kept warm now.
    fn kept(&self) -> Vec<Arc<ToolPolicy>> {
        self.servers.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The policy of `tool` kept warm now, if it is.
    fn current(&self, tool: &str) -> Option<Arc<ToolPolicy>> {
        self.kept().into_iter().find(|p| p.name == tool)
    }

    /// Whether `policy` is still the one of its tool kept warm (a reload
    /// may have replaced it while a server of it started).
    fn is_current(&self, policy: &ToolPolicy) -> bool {
        self.current(&policy.name).is_some_and(|p| *p == *policy)
    }

    /// A reload changed, added or removed the tools in `changed`
    /// (`servers`: every server of the new manifest): the waiting servers
    /// of each are stopped (every tenant's) and the pools of those still
    /// kept warm refill with the new policy, in the gateway's runtime.
    pub(crate) fn replace(self: &Arc<Self>, servers: Vec<Arc<ToolPolicy>>, changed: &[String]) {
        if let Ok(mut s) = self.servers.lock() {
            *s = servers.into_iter().filter(|p| warm_of(p) > 0).collect();
        }
        let mut tenants = std::collections::BTreeSet::new();
        tenants.insert(cordon_auth::DEFAULT_TENANT.to_string());
        if let Ok(mut pools) = self.pools.lock() {
            pools.retain(|(tenant, tool), pool| {
                if !changed.contains(tool) {
                    return true;
                }
                for r in pool.ready.drain(..) {
                    r.launched.handle.kill();
                }
                tenants.insert(tenant.clone());
                cordon_runtime::pool_status::remove("mcp", &format!("{tenant}/{tool}"));
                // One still starting finds its policy replaced and stops.
                pool.starting > 0
            });
        }
        let Some(rt) = self.runtime.get() else {
            // Not filled yet: the pools fill when serving starts.
            return;
        };
        let _in = rt.enter();
        for p in self.kept().iter().filter(|p| changed.contains(&p.name)) {
            for t in &tenants {
                self.refill(p, t);
            }
        }
    }

    /// Start as many servers as `tenant`'s pool of `policy`'s tool lacks,
    /// of the tool's policy kept now (a retry may name one a reload
    /// replaced).
    fn refill(self: &Arc<Self>, policy: &Arc<ToolPolicy>, tenant: &str) {
        let Some(policy) = self.current(&policy.name) else {
            return;
        };
        let policy = &policy;
        let want = warm_of(policy);
        if want == 0 || self.closed.load(Ordering::SeqCst) || self.is_suspended(&policy.name) {
            return;
        }
        let missing = {
            let Ok(mut pools) = self.pools.lock() else {
                return;
            };
            let pool = pools
                .entry((tenant.to_string(), policy.name.clone()))
                .or_default();
            let missing = want.saturating_sub(pool.ready.len() + pool.starting);
            pool.starting += missing;
            report(&policy.name, tenant, want, pool);
            missing
        };
        for _ in 0..missing {
            let me = self.clone();
            let policy = policy.clone();
            let tenant = tenant.to_string();
            tokio::spawn(async move { me.start_one(policy, tenant).await });
        }
    }

    async fn start_one(self: Arc<Self>, policy: Arc<ToolPolicy>, tenant: String) {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let began = Instant::now();
        let id = format!("mcp-warm-{}-{n}", std::process::id());
        let who = Caller {
            session: id.clone(),
            client: CALLER.into(),
            principal: None,
            tenant: tenant.clone(),
            trace: None,
        };
        let bound = Arc::new(OnceLock::new());
        let startup = match &policy.exec {
            Exec::Mcp {
                startup_seconds, ..
            } => Duration::from_secs(*startup_seconds),
            _ => Duration::from_secs(cordon_policy::policy::DEFAULT_STARTUP_SECONDS),
        };
        let started = match server_argv(&policy) {
            Ok(argv) => launch(
                self.sandbox.as_ref(),
                &who,
                &policy,
                &argv,
                startup,
                bound.clone(),
            )
            .await
            .map_err(|e| e.to_string()),
            Err(e) => Err(e),
        };
        let started = match started {
            Ok(l) => warm_up(&policy, l).await,
            Err(e) => Err(e),
        };
        let Ok(mut pools) = self.pools.lock() else {
            return;
        };
        let pool = pools
            .entry((tenant.clone(), policy.name.clone()))
            .or_default();
        pool.starting = pool.starting.saturating_sub(1);
        match started {
            Ok(launched)
                if !self.closed.load(Ordering::SeqCst)
                    && !self.is_suspended(&policy.name)
                    && self.is_current(&policy) =>
            {
                tracing::info!(tool = %policy.name, tenant = %tenant, sandbox = %id, "warm server ready");
                pool.backoff = None;
                pool.ready.push_back(Ready {
                    policy: policy.clone(),
                    id: id.clone(),
                    launched,
                    bound,
                    since: Instant::now(),
                });
                let size = pool.ready.len();
                report(&policy.name, &tenant, warm_of(&policy), pool);
                drop(pools);
                self.record(
                    &policy,
                    &who,
                    &id,
                    "ready",
                    began.elapsed().as_millis() as u64,
                    Some(format!(
                        "warm sandbox {id} ready: its server answered initialize and tools/list; {size} of {} ready",
                        warm_of(&policy)
                    )),
                );
            }
            Ok(launched) => {
                report(&policy.name, &tenant, warm_of(&policy), pool);
                drop(pools);
                launched.handle.kill();
                if !self.is_current(&policy) {
                    // Replaced by a reload while it started: its place is
                    // taken by one of the new policy.
                    self.refill(&policy, &tenant);
                }
            }
            Err(why) => {
                pool.failures += 1;
                pool.last_failure = Some(why.clone());
                report(&policy.name, &tenant, warm_of(&policy), pool);
                let retry = (!pool.retrying).then(|| {
                    pool.retrying = true;
                    let wait = pool.backoff.unwrap_or(RETRY_FIRST);
                    pool.backoff = Some((wait * 2).min(RETRY_MAX));
                    wait
                });
                drop(pools);
                tracing::warn!(tool = %policy.name, tenant = %tenant, "a warm server did not start: {why}");
                self.record(&policy, &who, &id, "failed", 0, Some(why));
                if let Some(wait) = retry {
                    self.retry_after(wait, policy, tenant);
                }
            }
        }
    }

    /// Refill `tenant`'s pool of `policy` after `wait` (a start failed):
    /// not if the gateway stopped meanwhile (the task does not keep the
    /// pools alive).
    fn retry_after(self: &Arc<Self>, wait: Duration, policy: Arc<ToolPolicy>, tenant: String) {
        let pools = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep(wait).await;
            let Some(me) = pools.upgrade() else {
                return;
            };
            if let Ok(mut p) = me.pools.lock()
                && let Some(pool) = p.get_mut(&(tenant.clone(), policy.name.clone()))
            {
                pool.retrying = false;
            }
            tracing::info!(tool = %policy.name, tenant = %tenant, "retrying a warm server's start after {}", cordon_sandbox::units::format_duration(wait));
            me.refill(&policy, &tenant);
        });
    }

    /// A ready server of `policy` for `who`'s session, bound to it
    /// (`bound`), or `None` (the session starts one cold). Every take
    /// refills the pool. `Err`: a sandbox cap refused it (it stays in the
    /// pool).
    pub(crate) fn take(
        self: &Arc<Self>,
        policy: &Arc<ToolPolicy>,
        who: &Caller,
        bound: Bound,
    ) -> Result<Option<Launched>, String> {
        if warm_of(policy) == 0 {
            return Ok(None);
        }
        let key = (who.tenant.clone(), policy.name.clone());
        let taken = loop {
            let next = self.pools.lock().ok().and_then(|mut p| {
                let pool = p.get_mut(&key)?;
                let r = pool.ready.pop_front()?;
                report(&policy.name, &who.tenant, warm_of(policy), pool);
                Some(r)
            });
            let Some(r) = next else {
                break None;
            };
            let waited = r.since.elapsed().as_millis() as u64;
            if *r.policy != **policy {
                // Started before a reload replaced its tool: never handed
                // to a session of the new one.
                r.launched.handle.kill();
                continue;
            }
            if !r.launched.alive() {
                // Ended while it waited: never handed out.
                r.launched.handle.kill();
                let why = r
                    .launched
                    .handle
                    .exited()
                    .unwrap_or_else(|| "its connection closed".to_string());
                let why = crate::upstream::gate_server_message(policy, &why);
                if let Ok(mut p) = self.pools.lock() {
                    let pool = p.entry(key.clone()).or_default();
                    pool.failures += 1;
                    pool.last_failure = Some(format!(
                        "discarded: the server ended while it waited ({why})"
                    ));
                    report(&policy.name, &who.tenant, warm_of(policy), pool);
                }
                self.record(
                    policy,
                    who,
                    &r.id,
                    "discarded",
                    waited,
                    Some(format!(
                        "warm sandbox {} discarded: the server ended while it waited ({why})",
                        r.id
                    )),
                );
                continue;
            }
            let handle = match self.caps.hold(who, r.launched.handle.clone()) {
                Ok(h) => h,
                Err(e) => {
                    if let Ok(mut p) = self.pools.lock() {
                        let pool = p.entry(key.clone()).or_default();
                        pool.ready.push_front(r);
                        report(&policy.name, &who.tenant, warm_of(policy), pool);
                    }
                    return Err(e);
                }
            };
            let _ = r.bound.set(bound);
            if let Ok(mut p) = self.pools.lock() {
                let pool = p.entry(key.clone()).or_default();
                pool.handed_out += 1;
                report(&policy.name, &who.tenant, warm_of(policy), pool);
            }
            self.record(policy, who, &r.id, "handed_over", waited, None);
            break Some(Launched {
                handle,
                ..r.launched
            });
        };
        self.refill(policy, &who.tenant);
        Ok(taken)
    }

    /// The audit record of one pool event, under `who`'s session.
    fn record(
        &self,
        policy: &ToolPolicy,
        who: &Caller,
        sandbox: &str,
        event: &str,
        waited_ms: u64,
        why: Option<String>,
    ) {
        let mut rec = cordon_audit::AuditRecord::new(
            &policy.name,
            cordon_broker::profile_name(policy.profile),
        );
        rec.runtime = "mcp".into();
        rec.session = who.session.clone();
        rec.caller = CALLER.into();
        rec.principal = who.principal.clone();
        rec.tenant = Some(who.tenant.clone());
        rec.status = match event {
            "handed_over" | "ready" => cordon_audit::Status::Ok,
            _ => cordon_audit::Status::ToolError,
        };
        rec.reason = why;
        rec.pool = Some(cordon_audit::PoolEvent {
            event: event.to_string(),
            sandbox: sandbox.to_string(),
            pooled: true,
            waited_ms,
        });
        // Nothing waits on it: a record that cannot be written is counted
        // and said (`cordon doctor`, the next call's warnings).
        self.broker.record_after(&rec);
    }

    fn is_suspended(&self, tool: &str) -> bool {
        self.suspended.lock().map_or(true, |s| s.contains(tool))
    }

    /// `tool` is out of service: stop its waiting servers (every tenant's)
    /// and start none until [`WarmPools::resume`].
    pub(crate) fn suspend(&self, tool: &str) {
        if let Ok(mut s) = self.suspended.lock() {
            s.insert(tool.to_string());
        }
        if let Ok(mut pools) = self.pools.lock() {
            for ((tenant, t), pool) in pools.iter_mut() {
                if t == tool {
                    for r in pool.ready.drain(..) {
                        r.launched.handle.kill();
                    }
                    let size = self.current(t).map_or(0, |p| warm_of(&p));
                    report(t, tenant, size, pool);
                }
            }
        }
    }

    /// `tool` is back in service: its pools (the default tenant's and
    /// every tenant's that had one) fill again now, in the gateway's
    /// runtime (before serving started: when it starts).
    pub(crate) fn resume(self: &Arc<Self>, tool: &str) {
        let was = self
            .suspended
            .lock()
            .map(|mut s| s.remove(tool))
            .unwrap_or(false);
        if !was {
            return;
        }
        let (Some(rt), Some(p)) = (self.runtime.get(), self.current(tool)) else {
            return;
        };
        let mut tenants = std::collections::BTreeSet::new();
        tenants.insert(cordon_auth::DEFAULT_TENANT.to_string());
        if let Ok(pools) = self.pools.lock() {
            tenants.extend(
                pools
                    .keys()
                    .filter(|(_, t)| t == tool)
                    .map(|(tenant, _)| tenant.clone()),
            );
        }
        let _in = rt.enter();
        for t in &tenants {
            self.refill(&p, t);
        }
    }

    /// Stop every waiting server; start no more.
    pub(crate) fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        if let Ok(mut pools) = self.pools.lock() {
            for ((tenant, tool), pool) in pools.iter_mut() {
                for r in pool.ready.drain(..) {
                    r.launched.handle.kill();
                }
                cordon_runtime::pool_status::remove("mcp", &format!("{tenant}/{tool}"));
            }
        }
    }
}

impl Drop for WarmPools {
    fn drop(&mut self) {
        self.close();
    }
}
