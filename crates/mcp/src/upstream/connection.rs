//! The connection to one sandboxed server: started through the
//! [`ServerSandbox`](crate::sandbox::ServerSandbox) seam, spoken to with
//! the rmcp client (which forwards the server's notifications to the
//! agent), restarted after a crash or a hang, and stopped at the end of its
//! lifetime (the session, or each call for `lifetime: call`).

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cordon_policy::policy::Lifetime;
use rmcp::model::{
    ClientCapabilities, Implementation, InitializeRequestParams, ProgressNotificationParam,
    ProgressToken, ProtocolVersion,
};
use rmcp::service::{NotificationContext, RunningService};
use rmcp::{ClientHandler, ErrorData, Peer, RoleClient, RoleServer, ServiceError, ServiceExt};
use serde_json::json;

use super::{Offers, State, Upstream, gate};
use crate::render::{self, Refusal};
use crate::sandbox::ServerHandle;

/// Routes progress notifications of upstream calls to the agent that made
/// the call (the downstream progress token is passed upstream as is).
#[derive(Default)]
pub(crate) struct ProgressRoutes {
    pub(super) routes: Mutex<HashMap<ProgressToken, (Peer<RoleServer>, ProgressToken)>>,
    /// Progress notifications being forwarded right now.
    pub(super) in_flight: AtomicUsize,
}

/// Resource subscriptions of one agent session to one server: the URIs,
/// and the agent to tell when the server says one changed.
#[derive(Default)]
pub(crate) struct Subscriptions {
    pub(super) agent: Option<Peer<RoleServer>>,
    pub(super) uris: BTreeSet<String>,
}

/// The client side of the connection to a sandboxed server.
#[derive(Clone)]
pub(crate) struct Forwarder {
    pub(super) server: String,
    /// The server's policy (what cordon declares to it at `initialize`).
    pub(super) policy: Arc<cordon_policy::policy::ToolPolicy>,
    /// The session it serves: set as it starts for a session, or when a
    /// warm pool hands it to one. Until then (a warm server waiting) its
    /// notifications are dropped and its requests to the client refused.
    pub(super) bound: Arc<std::sync::OnceLock<Bound>>,
}

/// What a server's connection passes on to its session.
pub(crate) struct Bound {
    pub(super) routes: Arc<ProgressRoutes>,
    pub(super) subscriptions: Arc<Mutex<Subscriptions>>,
    pub(super) log_level: crate::logging::LogLevel,
    /// Set when the server says its tools changed: the next listing asks
    /// it again.
    pub(super) tools_stale: Arc<std::sync::atomic::AtomicBool>,
    /// The server's policy (`allow_sampling`, `allow_elicitation`, the
    /// gate) and where its requests to the client are audited.
    pub(super) asks: Arc<Asks>,
}

/// What the server's requests to the client (sampling, elicitation) need.
pub(crate) struct Asks {
    pub(super) policy: Arc<cordon_policy::policy::ToolPolicy>,
    /// The broker whose log records the server's requests, the session
    /// and its principal.
    pub(super) audit: Option<(Arc<cordon_broker::Broker>, String, crate::caller::Who)>,
}

/// Whether the manifest lets the server ask the client to sample, and
/// to elicit.
fn allowed(policy: &cordon_policy::policy::ToolPolicy) -> (bool, bool) {
    match &policy.exec {
        cordon_policy::policy::Exec::Mcp {
            allow_sampling,
            allow_elicitation,
            ..
        } => (*allow_sampling, *allow_elicitation),
        _ => (false, false),
    }
}

impl Asks {
    fn allowed(&self) -> (bool, bool) {
        allowed(&self.policy)
    }

    /// The request with every string through the gate's stripping (it is
    /// the server's text, headed for a model or a person), each cut to the
    /// tool's `output_bytes`.
    fn gated<T: serde::Serialize + serde::de::DeserializeOwned>(
        &self,
        params: T,
    ) -> Result<T, ErrorData> {
        let max = self
            .policy
            .limits
            .map(|l| l.output_bytes as usize)
            .unwrap_or(1 << 20);
        let v = gate::strip_json(
            serde_json::to_value(params)
                .map_err(|e| ErrorData::internal_error(e.to_string(), None))?,
            max,
        );
        serde_json::from_value(v).map_err(|e| ErrorData::internal_error(e.to_string(), None))
    }

    /// The refusal of a request the manifest does not allow: -32601, as
    /// for a capability the client did not declare (cordon declares it to
    /// the server only when allowed).
    fn refused(&self, method: &str, key: &str) -> ErrorData {
        ErrorData::new(
            rmcp::model::ErrorCode::METHOD_NOT_FOUND,
            format!(
                "{method} refused: the manifest does not let server `{}` ask the client (`mcp: {{{key}: true}}`)",
                self.policy.name
            ),
            Some(json!({"cordon/status": "policy_refused", "tool": self.policy.name})),
        )
    }

    /// Audit one request of the server to the client. `Err` (the answer
    /// is then withheld from the server) when its record could not be
    /// written and the audit log is fail-closed.
    fn record<T: serde::Serialize>(
        &self,
        method: &str,
        params: &serde_json::Value,
        outcome: &Result<T, ErrorData>,
    ) -> Result<(), ErrorData> {
        let Some((broker, session, who)) = &self.audit else {
            return Ok(());
        };
        let input =
            serde_json::to_vec(&json!({"method": method, "params": params})).unwrap_or_default();
        let out = outcome
            .as_ref()
            .map(|r| (serde_json::to_string(r).unwrap_or_default(), false));
        let audit = crate::audit::CallAudit::with_input(
            &self.policy.name,
            cordon_broker::profile_name(self.policy.profile),
            "mcp",
            input,
        );
        let who = crate::caller::caller_of(session, "mcp-server", who);
        audit.finish_with(broker, &who, out).inspect_err(|e| {
            tracing::warn!(tool = %self.policy.name, "audit record of {method} not written: {}", e.message);
        })
    }
}

impl Forwarder {
    fn agent(&self) -> Option<Peer<RoleServer>> {
        self.bound
            .get()?
            .subscriptions
            .lock()
            .ok()
            .and_then(|s| s.agent.clone())
    }

    /// The session's side of the connection; `Err` for a warm server not
    /// handed to a session yet.
    fn asks(&self, method: &str) -> Result<&Arc<Asks>, ErrorData> {
        self.bound.get().map(|b| &b.asks).ok_or_else(|| {
            ErrorData::internal_error(
                format!("{method}: the server is not serving a session yet"),
                None,
            )
        })
    }
}

/// The longest string of a server's log message passed on.
const LOG_MAX_CHARS: usize = 4096;

impl ClientHandler for Forwarder {
    /// A server's log message reaches the agent when its level passes the
    /// one the client set, its text stripped by the gate, labelled with
    /// the server (`logger: <tool>` or `<tool>/<logger>`) and untrusted.
    #[allow(deprecated)]
    async fn on_logging_message(
        &self,
        params: rmcp::model::LoggingMessageNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let Some(b) = self.bound.get() else {
            return;
        };
        if !crate::logging::level_passes(&b.log_level, params.level) {
            return;
        }
        let Some(peer) = self.agent() else {
            return;
        };
        let mut p = rmcp::model::LoggingMessageNotificationParam::new(
            params.level,
            gate::strip_json(params.data, LOG_MAX_CHARS),
        );
        p.logger = Some(match params.logger {
            Some(l) => format!(
                "{}/{}",
                self.server,
                gate::strip_text(&l).chars().take(64).collect::<String>()
            ),
            None => self.server.clone(),
        });
        let mut meta = rmcp::model::MetaObject::default();
        meta.insert("cordon/server".into(), json!(self.server));
        meta.insert("cordon/trust".into(), json!("untrusted"));
        p.meta = Some(rmcp::model::NotificationMetaObject(meta));
        let _ = peer.notify_logging_message(p).await;
    }

    /// The server's tools changed: the next listing asks it again (and
    /// applies allow, rename, the names' owners and the pins again), and
    /// the agent is told to list.
    async fn on_tool_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Some(b) = self.bound.get() {
            b.tools_stale
                .store(true, std::sync::atomic::Ordering::SeqCst);
        }
        if let Some(peer) = self.agent() {
            let _ = peer.notify_tool_list_changed().await;
        }
    }

    /// The agent re-lists through cordon, which asks the server again.
    async fn on_resource_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Some(peer) = self.agent() {
            let _ = peer.notify_resource_list_changed().await;
        }
    }

    async fn on_prompt_list_changed(&self, _context: NotificationContext<RoleClient>) {
        if let Some(peer) = self.agent() {
            let _ = peer.notify_prompt_list_changed().await;
        }
    }

    /// Only updates of URIs the agent subscribed to are passed on (a
    /// server cannot flood the agent with others).
    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let Some(b) = self.bound.get() else {
            return;
        };
        let agent = b.subscriptions.lock().ok().and_then(|s| {
            s.uris
                .contains(&params.uri)
                .then(|| s.agent.clone())
                .flatten()
        });
        if let Some(peer) = agent {
            let _ = peer
                .notify_resource_updated(rmcp::model::ResourceUpdatedNotificationParam::new(
                    params.uri,
                ))
                .await;
        }
    }

    async fn on_progress(
        &self,
        mut params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        let Some(b) = self.bound.get() else {
            return;
        };
        let route = b
            .routes
            .routes
            .lock()
            .ok()
            .and_then(|r| r.get(&params.progress_token).cloned());
        if let Some((peer, token)) = route {
            use std::sync::atomic::Ordering;
            b.routes.in_flight.fetch_add(1, Ordering::SeqCst);
            params.progress_token = token;
            // The message is the server's text: strip it like any output.
            params.message = params.message.map(|m| gate::strip_text(&m));
            let _ = peer.notify_progress(params).await;
            b.routes.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// `sampling/createMessage`: forwarded to the agent's client only when
    /// the manifest allows it, its text gated; audited either way.
    #[allow(deprecated)]
    async fn create_message(
        &self,
        params: rmcp::model::CreateMessageRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::CreateMessageResult, ErrorData> {
        const METHOD: &str = "sampling/createMessage";
        let raw = serde_json::to_value(&params).unwrap_or_default();
        let asks = self.asks(METHOD)?;
        let r = async {
            if !asks.allowed().0 {
                return Err(asks.refused(METHOD, "allow_sampling"));
            }
            let agent = self.agent().ok_or_else(|| {
                ErrorData::internal_error(format!("{METHOD}: no client to ask"), None)
            })?;
            let params = asks.gated(params)?;
            agent.create_message(params).await.map_err(client_error)
        }
        .await;
        asks.record(METHOD, &raw, &r)?;
        r
    }

    /// `elicitation/create`: likewise.
    async fn create_elicitation(
        &self,
        request: rmcp::model::ElicitRequestParams,
        _context: rmcp::service::RequestContext<RoleClient>,
    ) -> Result<rmcp::model::ElicitResult, ErrorData> {
        const METHOD: &str = "elicitation/create";
        let raw = serde_json::to_value(&request).unwrap_or_default();
        let asks = self.asks(METHOD)?;
        let r = async {
            if !asks.allowed().1 {
                return Err(asks.refused(METHOD, "allow_elicitation"));
            }
            let agent = self.agent().ok_or_else(|| {
                ErrorData::internal_error(format!("{METHOD}: no client to ask"), None)
            })?;
            let request = asks.gated(request)?;
            agent
                .create_elicitation(request)
                .await
                .map_err(client_error)
        }
        .await;
        asks.record(METHOD, &raw, &r)?;
        r
    }

    fn get_info(&self) -> InitializeRequestParams {
        let mut caps = ClientCapabilities::default();
        let (sampling, elicitation) = allowed(&self.policy);
        if sampling {
            caps.sampling = Some(Default::default());
        }
        if elicitation {
            caps.elicitation = Some(Default::default());
        }
        let mut info = InitializeRequestParams::new(
            caps,
            Implementation::new("cordon", env!("CARGO_PKG_VERSION")),
        );
        // Third-party servers speak the initialize handshake.
        info.protocol_version = ProtocolVersion::LATEST_WITH_INITIALIZE;
        info
    }
}

/// The agent's client's answer to a request forwarded to it, as the error
/// passed back to the server.
fn client_error(e: ServiceError) -> ErrorData {
    match e {
        ServiceError::McpError(e) => e,
        other => ErrorData::internal_error(format!("the client did not answer: {other}"), None),
    }
}

/// The running server of one generation; dropping it kills the sandbox.
pub(super) struct Live {
    generation: u64,
    service: RunningService<RoleClient, Forwarder>,
    handle: Arc<dyn ServerHandle>,
}

impl Drop for Live {
    fn drop(&mut self) {
        self.handle.kill();
    }
}

/// A connection to use for one call.
pub(super) struct Conn {
    pub(super) generation: u64,
    pub(super) peer: Peer<RoleClient>,
    pub(super) handle: Arc<dyn ServerHandle>,
}

impl Upstream {
    /// The agent to pass the server's notifications to.
    pub fn set_agent(&self, agent: &Peer<RoleServer>) {
        if let Ok(mut s) = self.subscriptions.lock() {
            s.agent = Some(agent.clone());
        }
    }

    /// What the server offers, if it has been started once by any session.
    pub fn known_offers(&self) -> Option<Offers> {
        self.offers.lock().ok().and_then(|o| *o)
    }

    /// What the server offers, starting it to find out if no session has.
    pub async fn offers(&self) -> Result<Offers, ErrorData> {
        if let Some(o) = self.known_offers() {
            return Ok(o);
        }
        let conn = self.conn().await?;
        self.after_call(conn.generation).await;
        Ok(self.known_offers().unwrap_or_default())
    }

    /// This session's side of a server's connection.
    pub(super) fn bound(&self) -> Bound {
        Bound {
            routes: self.routes.clone(),
            subscriptions: self.subscriptions.clone(),
            log_level: self.log_level.clone(),
            tools_stale: self.tools_stale.clone(),
            asks: self.asks.clone(),
        }
    }

    /// A server started for this session now.
    async fn launch_cold(&self) -> Result<Launched, ErrorData> {
        let name = &self.policy.name;
        let bound = Arc::new(std::sync::OnceLock::new());
        let _ = bound.set(self.bound());
        let who = crate::caller::caller_of(&self.session, "mcp", &self.principal);
        match launch(
            self.sandbox.as_ref(),
            &who,
            &self.policy,
            &self.argv,
            self.startup,
            bound,
        )
        .await
        {
            Ok(l) => Ok(l),
            Err(LaunchError::Sandbox(e)) => Err(crate::caps::server_refused(&e, name)
                .unwrap_or_else(|| {
                    render::refusal(Refusal::SandboxFailed, e, json!({"tool": name}))
                })),
            Err(LaunchError::Failed(what, handle)) => {
                let why = self.exit_report(&handle).await;
                Err(self.failed(name, format!("{what}{why}")))
            }
            Err(LaunchError::TimedOut(during)) => Err(self.start_timed_out(during)),
        }
    }

    /// Start the server in its sandbox and list its tools, or take one a
    /// warm pool has ready.
    async fn start(&self, st: &mut State) -> Result<Conn, ErrorData> {
        let name = &self.policy.name;
        let warm = match &self.warm {
            Some(pools) => {
                let who = crate::caller::caller_of(&self.session, "mcp", &self.principal);
                pools.take(&self.policy, &who, self.bound()).map_err(|e| {
                    crate::caps::server_refused(&e, name).unwrap_or_else(|| {
                        render::refusal(Refusal::SandboxFailed, e, json!({"tool": name}))
                    })
                })?
            }
            None => None,
        };
        let Launched {
            service,
            handle,
            tools,
            warnings,
        } = match warm {
            Some(l) => l,
            None => self.launch_cold().await?,
        };
        if let Ok(mut w) = self.warnings.lock() {
            w.clone_from(&warnings);
        }
        for w in &warnings {
            tracing::warn!(tool = %name, "{w}");
        }
        let exposed = self.expose(tools.clone());
        if let Some(info) = service.peer().peer_info() {
            let c = &info.capabilities;
            let o = Offers {
                resources: c.resources.is_some(),
                prompts: c.prompts.is_some(),
                completions: c.completions.is_some(),
                subscribe: c.resources.as_ref().and_then(|r| r.subscribe) == Some(true),
                resources_list_changed: c.resources.as_ref().and_then(|r| r.list_changed)
                    == Some(true),
                prompts_list_changed: c.prompts.as_ref().and_then(|p| p.list_changed) == Some(true),
            };
            if let Ok(mut known) = self.offers.lock() {
                *known = Some(o);
            }
        }
        self.keep_listing(&tools);
        // Listed from the cache before: a listing that differs is handled
        // like `list_changed` (the agent is told to list again).
        if let Some(cached) = st.cached.take()
            && serde_json::to_value(&cached).ok() != serde_json::to_value(&tools).ok()
            && let Some(peer) = self.subscriptions.lock().ok().and_then(|s| s.agent.clone())
        {
            tokio::spawn(async move {
                let _ = peer.notify_tool_list_changed().await;
            });
        }
        st.resources = None;
        st.templates = None;
        st.prompts = None;
        st.generation += 1;
        let conn = Conn {
            generation: st.generation,
            peer: service.peer().clone(),
            handle: handle.clone(),
        };
        st.tools = Some(exposed);
        st.live = Some(Live {
            generation: st.generation,
            service,
            handle,
        });
        Ok(conn)
    }

    /// Keep the server's own listing (and what it offers) in the cache.
    pub(super) fn keep_listing(&self, tools: &[rmcp::model::Tool]) {
        if let Some(offers) = self.known_offers() {
            self.cache.put(
                &self.policy,
                &self.tenant(),
                &crate::cache::Listing {
                    tools: tools.to_vec(),
                    offers,
                },
            );
        }
    }

    /// The server did not initialize and list its tools within its
    /// start-up deadline.
    fn start_timed_out(&self, during: &str) -> ErrorData {
        let name = &self.policy.name;
        render::refusal(
            Refusal::LimitHit,
            format!(
                "{name}: the server did not start within {} (it was still at {during}; `mcp: {{startup_seconds: N}}` gives it longer); it was stopped",
                cordon_sandbox::units::format_duration(self.startup)
            ),
            json!({"tool": name, "limit": "startup_seconds"}),
        )
    }

    /// Why the server's last start in this session failed, if it did.
    pub fn start_failure(&self) -> Option<ErrorData> {
        self.start_failure.lock().ok().and_then(|f| f.clone())
    }

    /// A failure of the server as an MCP error; `msg` (which can carry the
    /// server's stderr) goes through the gate's error path.
    pub(super) fn failed(&self, tool: &str, msg: String) -> ErrorData {
        let text = gate::server_message(&self.policy, &msg);
        render::refusal(
            Refusal::ServerFailed,
            format!("{tool}: {text}"),
            json!({"tool": tool, "server": self.policy.name}),
        )
    }

    /// How the sandbox ended, once it has (waits up to 2 s for the reaper).
    pub(super) async fn exit_report(&self, handle: &Arc<dyn ServerHandle>) -> String {
        for _ in 0..40 {
            if let Some(r) = handle.exited() {
                return format!("; {r}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        String::new()
    }

    /// A live connection, starting the server if there is none.
    pub(super) async fn conn(&self) -> Result<Conn, ErrorData> {
        let mut st = self.state.lock().await;
        if let Some(l) = &st.live {
            if l.handle.exited().is_none() && !l.service.is_closed() {
                return Ok(Conn {
                    generation: l.generation,
                    peer: l.service.peer().clone(),
                    handle: l.handle.clone(),
                });
            }
            st.live = None;
        }
        let started = self.start(&mut st).await;
        if let Ok(mut f) = self.start_failure.lock() {
            *f = started.as_ref().err().cloned();
        }
        started
    }

    /// Drop the connection of this generation (killing its sandbox).
    pub(super) async fn reset(&self, generation: u64) {
        let mut st = self.state.lock().await;
        if st.live.as_ref().is_some_and(|l| l.generation == generation) {
            st.live = None;
        }
    }

    /// Stop the server now (session end).
    pub fn shutdown(&self) {
        if let Ok(mut st) = self.state.try_lock() {
            st.live = None;
        } else {
            // A call holds the lock: the Live is dropped (and killed) with
            // the session's last reference.
        }
    }

    pub(super) async fn after_call(&self, generation: u64) {
        if self.policy.lifetime == Lifetime::Call {
            self.reset(generation).await;
        }
    }

    /// One request on a live connection (starting the server if needed),
    /// bounded by `wall_seconds` and cancelled when the agent cancels.
    /// The live tokens of the running server's credential session (none
    /// when it is not running).
    pub(super) async fn live_tokens(&self) -> cordon_gate::LiveTokens {
        let st = self.state.lock().await;
        match &st.live {
            Some(l) => l.handle.live_tokens(),
            None => cordon_gate::LiveTokens::default(),
        }
    }

    pub(super) async fn timed<T, F>(
        &self,
        what: &str,
        ct: Option<&tokio_util::sync::CancellationToken>,
        f: impl FnOnce(Peer<RoleClient>) -> F,
    ) -> Result<T, ErrorData>
    where
        F: std::future::Future<Output = Result<T, ServiceError>>,
    {
        let name = self.policy.name.as_str();
        let conn = self.conn().await?;
        let never = tokio_util::sync::CancellationToken::new();
        let ct = ct.unwrap_or(&never);
        // Dropping the request future (timeout, cancellation) sends
        // `notifications/cancelled` to the server.
        let r = tokio::select! {
            r = tokio::time::timeout(self.wall, f(conn.peer.clone())) => Some(r),
            _ = ct.cancelled() => None,
        };
        match r {
            None => {
                self.after_call(conn.generation).await;
                Err(render::refusal(
                    Refusal::ServerFailed,
                    format!("{name}: {what} cancelled by the client"),
                    json!({"tool": name}),
                ))
            }
            Some(Err(_)) => {
                conn.handle.kill();
                self.reset(conn.generation).await;
                Err(render::refusal(
                    Refusal::LimitHit,
                    format!(
                        "{name}: {what} timed out after {}; the server was stopped and the next request starts a new one",
                        cordon_sandbox::units::format_duration(self.wall)
                    ),
                    json!({"tool": name, "limit": "wall_seconds"}),
                ))
            }
            Some(Ok(Ok(v))) => {
                self.after_call(conn.generation).await;
                Ok(v)
            }
            Some(Ok(Err(ServiceError::McpError(e)))) => {
                self.after_call(conn.generation).await;
                let text = gate::server_message(&self.policy, &e.message);
                Err(ErrorData::new(
                    e.code,
                    format!("{name}: the server refused {what}: {text}"),
                    Some(json!({"cordon/status": "server_error", "tool": name})),
                ))
            }
            Some(Ok(Err(e))) => {
                conn.handle.kill();
                let why = self.exit_report(&conn.handle).await;
                self.reset(conn.generation).await;
                Err(self.failed(
                    name,
                    format!(
                        "the server failed during {what} ({e}){why}; the next request starts a new one"
                    ),
                ))
            }
        }
    }
}

/// A server started and listed: its connection, its sandbox, its own
/// tools (before allow, rename and the pins) and its sandbox's warnings.
pub(crate) struct Launched {
    pub(crate) service: RunningService<RoleClient, Forwarder>,
    pub(crate) handle: Arc<dyn ServerHandle>,
    pub(crate) tools: Vec<rmcp::model::Tool>,
    pub(crate) warnings: Vec<String>,
}

impl Launched {
    /// Whether the server still runs and its connection is open.
    pub(crate) fn alive(&self) -> bool {
        self.handle.exited().is_none() && !self.service.is_closed()
    }
}

/// Why a server did not start.
pub(crate) enum LaunchError {
    /// Its sandbox was not started (the text says why).
    Sandbox(String),
    /// It started and failed (`initialize` or `tools/list`); it was stopped.
    Failed(String, Arc<dyn ServerHandle>),
    /// It did not answer within its start-up deadline (still at this
    /// step); it was stopped.
    TimedOut(&'static str),
}

impl std::fmt::Display for LaunchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LaunchError::Sandbox(e) | LaunchError::Failed(e, _) => f.write_str(e),
            LaunchError::TimedOut(during) => write!(
                f,
                "the server did not start within its start-up deadline (it was still at {during}); it was stopped"
            ),
        }
    }
}

/// Start `policy`'s server for `who` through `sandbox`, initialize it and
/// list its tools, within `startup`. Its connection passes what the server
/// sends on to the session `bound` holds (nothing before it is set).
pub(crate) async fn launch(
    sandbox: &dyn crate::sandbox::ServerSandbox,
    who: &cordon_broker::Caller,
    policy: &Arc<cordon_policy::policy::ToolPolicy>,
    argv: &[String],
    startup: Duration,
    bound: Arc<std::sync::OnceLock<Bound>>,
) -> Result<Launched, LaunchError> {
    let proc = sandbox
        .start(who, policy, argv)
        .map_err(LaunchError::Sandbox)?;
    let handle = proc.handle.clone();
    let fwd = Forwarder {
        server: policy.name.clone(),
        policy: policy.clone(),
        bound,
    };
    // One deadline for the whole start: initialize and the first
    // tools/list.
    let deadline = tokio::time::Instant::now() + startup;
    let started = tokio::time::timeout_at(deadline, fwd.serve((proc.reader, proc.writer))).await;
    let service = match started {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            handle.kill();
            return Err(LaunchError::Failed(
                format!("the server did not initialize ({e})"),
                handle,
            ));
        }
        Err(_) => {
            handle.kill();
            return Err(LaunchError::TimedOut("initialize"));
        }
    };
    let listed = tokio::time::timeout_at(deadline, service.peer().list_all_tools()).await;
    let tools = match listed {
        Ok(Ok(t)) => t,
        Ok(Err(e)) => {
            handle.kill();
            return Err(LaunchError::Failed(
                format!("tools/list failed ({e})"),
                handle,
            ));
        }
        Err(_) => {
            handle.kill();
            return Err(LaunchError::TimedOut("tools/list"));
        }
    };
    Ok(Launched {
        service,
        handle,
        tools,
        warnings: proc.warnings,
    })
}
