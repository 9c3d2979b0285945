//! `mcp:` tools: a third-party MCP server run inside its sandbox, its tools
//! exposed under the manifest tool's name as a prefix (`<tool>.<name>`),
//! filtered by `allow`, renamed by `rename`, and refused when a description
//! differs from the one pinned in `descriptions`. One sandbox per agent
//! session (`lifetime: session`) or per call (`lifetime: call`); a server
//! that crashes or hangs gives a typed error and the next call starts a new
//! one.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine as _;
use cordon_gate::{Gate, GatePolicy, Gated, OutputKind, ToolMeta};
use cordon_policy::policy::{Exec, Lifetime, ToolPolicy};
use rmcp::model::{
    CallToolRequest, CancelledNotification, CancelledNotificationParam, ClientRequest, ServerResult,
};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ContentBlock, Implementation,
    InitializeRequestParams, JsonObject, ProgressNotificationParam, ProgressToken, Prompt,
    ProtocolVersion, Resource, ResourceContents, ResourceTemplate, Tool,
};
use rmcp::service::{NotificationContext, PeerRequestOptions, RequestContext, RunningService};
use rmcp::{ClientHandler, ErrorData, Peer, RoleClient, RoleServer, ServiceError, ServiceExt};
use serde_json::{Value, json};

use crate::render::{self, Refusal};
use crate::sandbox::{ServerHandle, ServerSandbox};

/// Routes progress notifications of upstream calls to the agent that made
/// the call (the downstream progress token is passed upstream as is).
#[derive(Default)]
pub(crate) struct ProgressRoutes {
    routes: Mutex<HashMap<ProgressToken, (Peer<RoleServer>, ProgressToken)>>,
    /// Progress notifications being forwarded right now.
    in_flight: std::sync::atomic::AtomicUsize,
}

/// Resource subscriptions of one agent session to one server: the URIs,
/// and the agent to tell when the server says one changed.
#[derive(Default)]
pub(crate) struct Subscriptions {
    agent: Option<Peer<RoleServer>>,
    uris: std::collections::BTreeSet<String>,
}

/// The client side of the connection to a sandboxed server.
#[derive(Clone)]
struct Forwarder {
    routes: Arc<ProgressRoutes>,
    subscriptions: Arc<Mutex<Subscriptions>>,
}

impl Forwarder {
    fn agent(&self) -> Option<Peer<RoleServer>> {
        self.subscriptions.lock().ok().and_then(|s| s.agent.clone())
    }
}

impl ClientHandler for Forwarder {
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
        let agent = self.subscriptions.lock().ok().and_then(|s| {
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
        let route = self
            .routes
            .routes
            .lock()
            .ok()
            .and_then(|r| r.get(&params.progress_token).cloned());
        if let Some((peer, token)) = route {
            use std::sync::atomic::Ordering;
            self.routes.in_flight.fetch_add(1, Ordering::SeqCst);
            params.progress_token = token;
            // The message is the server's text: strip it like any output.
            params.message = params.message.map(|m| strip_text(&m));
            let _ = peer.notify_progress(params).await;
            self.routes.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
    }

    fn get_info(&self) -> InitializeRequestParams {
        let mut info = InitializeRequestParams::new(
            ClientCapabilities::default(),
            Implementation::new("cordon", env!("CARGO_PKG_VERSION")),
        );
        // Third-party servers speak the initialize handshake.
        info.protocol_version = ProtocolVersion::LATEST_WITH_INITIALIZE;
        info
    }
}

/// One server tool as the agent sees it.
#[derive(Debug, Clone)]
pub(crate) struct Exposed {
    /// `<tool>.<exposed name>`.
    pub name: String,
    /// The name the server knows it by.
    pub server_name: String,
    /// What `tools/list` shows (renamed, description stripped).
    pub tool: Tool,
    /// Set when the tool is refused (its description differs from the pin).
    pub refused: Option<String>,
}

struct Live {
    generation: u64,
    service: RunningService<RoleClient, Forwarder>,
    handle: Arc<dyn ServerHandle>,
}

impl Drop for Live {
    fn drop(&mut self) {
        self.handle.kill();
    }
}

#[derive(Default)]
struct State {
    live: Option<Live>,
    tools: Option<Vec<Exposed>>,
    generation: u64,
    /// What the server listed last (after the manifest's allowlists):
    /// the only resources, templates and prompts an agent may reach.
    resources: Option<Vec<Resource>>,
    templates: Option<Vec<(ResourceTemplate, crate::resources::Template)>>,
    prompts: Option<Vec<Prompt>>,
}

/// What a server offers besides tools, learnt from its `initialize`
/// answer and shared by the sessions of one gateway (the capabilities are
/// advertised before any session has started the server).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Offers {
    pub resources: bool,
    pub prompts: bool,
    pub completions: bool,
    pub subscribe: bool,
    /// The server sends `list_changed` for resources / prompts.
    pub resources_list_changed: bool,
    pub prompts_list_changed: bool,
}

/// The gateway's record of each server's [`Offers`] (`None`: not started yet).
pub(crate) type KnownOffers = Arc<Mutex<Option<Offers>>>;

/// One `mcp:` tool of the manifest within one agent session.
pub(crate) struct Upstream {
    policy: Arc<ToolPolicy>,
    argv: Vec<String>,
    allow: Option<Vec<String>>,
    rename: BTreeMap<String, String>,
    pins: BTreeMap<String, String>,
    sandbox: Arc<dyn ServerSandbox>,
    routes: Arc<ProgressRoutes>,
    subscriptions: Arc<Mutex<Subscriptions>>,
    state: tokio::sync::Mutex<State>,
    wall: Duration,
    resource_allow: Option<Vec<String>>,
    prompt_allow: Option<Vec<String>>,
    offers: KnownOffers,
}

/// A connection to use for one call.
struct Conn {
    generation: u64,
    peer: Peer<RoleClient>,
    handle: Arc<dyn ServerHandle>,
}

impl Upstream {
    /// `None` when the policy is not an `mcp:` tool with a command.
    pub fn new(
        policy: Arc<ToolPolicy>,
        sandbox: Arc<dyn ServerSandbox>,
    ) -> Result<Upstream, String> {
        let Exec::Mcp {
            command,
            image,
            allow,
            rename,
            descriptions,
            resources,
            prompts,
        } = &policy.exec
        else {
            return Err(format!("{}: not an MCP server tool", policy.name));
        };
        let argv = match (command, image) {
            (Some(c), _) if !c.is_empty() => c.clone(),
            (_, Some(i)) => {
                return Err(format!(
                    "{}: MCP server image {i} needs an OCI runtime, which this build does not have",
                    policy.name
                ));
            }
            _ => {
                return Err(format!(
                    "{}: the `mcp` block gives no command to start the server",
                    policy.name
                ));
            }
        };
        let wall = Duration::from_secs(policy.require_limits()?.wall_seconds);
        Ok(Upstream {
            argv,
            allow: allow.clone(),
            rename: rename.clone(),
            pins: descriptions.clone(),
            sandbox,
            routes: Arc::new(ProgressRoutes::default()),
            subscriptions: Arc::default(),
            state: tokio::sync::Mutex::new(State::default()),
            wall,
            resource_allow: resources.clone(),
            prompt_allow: prompts.clone(),
            offers: KnownOffers::default(),
            policy,
        })
    }

    /// Share the gateway's record of what this server offers.
    pub fn with_offers(mut self, offers: KnownOffers) -> Upstream {
        self.offers = offers;
        self
    }

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

    pub fn name(&self) -> &str {
        &self.policy.name
    }

    pub fn profile(&self) -> &'static str {
        cordon_broker::profile_name(self.policy.profile)
    }

    /// Start the server in its sandbox and list its tools.
    async fn start(&self, st: &mut State) -> Result<Conn, ErrorData> {
        let name = &self.policy.name;
        let proc = self
            .sandbox
            .start(&self.policy, &self.argv)
            .map_err(|e| render::refusal(Refusal::SandboxFailed, e, json!({"tool": name})))?;
        let handle = proc.handle.clone();
        let fwd = Forwarder {
            routes: self.routes.clone(),
            subscriptions: self.subscriptions.clone(),
        };
        let started = tokio::time::timeout(self.wall, fwd.serve((proc.reader, proc.writer))).await;
        let service = match started {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                handle.kill();
                let why = self.exit_report(&handle).await;
                return Err(self.failed(name, format!("the server did not initialize ({e}){why}")));
            }
            Err(_) => {
                handle.kill();
                return Err(render::refusal(
                    Refusal::LimitHit,
                    format!(
                        "{name}: the server did not initialize within {}; it was stopped",
                        cordon_jail::format_duration(self.wall)
                    ),
                    json!({"tool": name, "limit": "wall_seconds"}),
                ));
            }
        };
        let listed = tokio::time::timeout(self.wall, service.peer().list_all_tools()).await;
        let tools = match listed {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => {
                handle.kill();
                let why = self.exit_report(&handle).await;
                return Err(self.failed(name, format!("tools/list failed ({e}){why}")));
            }
            Err(_) => {
                handle.kill();
                return Err(render::refusal(
                    Refusal::LimitHit,
                    format!(
                        "{name}: tools/list timed out after {}; the server was stopped",
                        cordon_jail::format_duration(self.wall)
                    ),
                    json!({"tool": name, "limit": "wall_seconds"}),
                ));
            }
        };
        let exposed = self.expose(tools);
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

    /// allow, rename, pins; descriptions of unpinned tools pass the gate's
    /// stripping (invisible and bidi characters, escapes).
    fn expose(&self, tools: Vec<Tool>) -> Vec<Exposed> {
        let mut out = Vec::new();
        for t in tools {
            let server_name = t.name.to_string();
            if let Some(allow) = &self.allow
                && !allow.iter().any(|a| a == &server_name)
            {
                continue;
            }
            let exposed = self.rename.get(&server_name).unwrap_or(&server_name);
            let full = format!("{}.{}", self.policy.name, exposed);
            let desc = t.description.as_deref().unwrap_or("").to_owned();
            let refused = match self.pins.get(&server_name) {
                Some(pin) if pin.trim() != desc.trim() => Some(format!(
                    "{full}: the server describes `{server_name}` differently from the description pinned in the manifest; the tool is refused (a changed description can carry instructions to the model)"
                )),
                _ => None,
            };
            if let Some(r) = &refused {
                eprintln!("cordon: warning: {r}");
            }
            let clean = if self.pins.contains_key(&server_name) {
                desc
            } else {
                strip_text(&desc)
            };
            let mut tool = t.clone();
            tool.name = full.clone().into();
            tool.description = Some(clean.into());
            let mut meta = rmcp::model::MetaObject::default();
            meta.insert("cordon/profile".into(), json!(self.profile()));
            meta.insert("cordon/server".into(), json!(self.policy.name));
            meta.insert("cordon/server_tool".into(), json!(server_name));
            meta.insert(
                "cordon/description_pinned".into(),
                json!(self.pins.contains_key(&server_name)),
            );
            tool.meta = Some(meta);
            out.push(Exposed {
                name: full,
                server_name,
                tool,
                refused,
            });
        }
        out
    }

    fn failed(&self, tool: &str, msg: String) -> ErrorData {
        let meta = ToolMeta::new(&self.policy.name, self.profile());
        let text = cordon_gate::gate_error(&meta, msg.as_bytes())
            .content
            .to_text();
        render::refusal(
            Refusal::ServerFailed,
            format!("{tool}: {text}"),
            json!({"tool": tool, "server": self.policy.name}),
        )
    }

    /// How the sandbox ended, once it has (waits up to 2 s for the reaper).
    async fn exit_report(&self, handle: &Arc<dyn ServerHandle>) -> String {
        for _ in 0..40 {
            if let Some(r) = handle.exited() {
                return format!("; {r}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        String::new()
    }

    /// A live connection, starting the server if there is none.
    async fn conn(&self) -> Result<Conn, ErrorData> {
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
        self.start(&mut st).await
    }

    /// Drop the connection of this generation (killing its sandbox).
    async fn reset(&self, generation: u64) {
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

    /// The exposed tools, starting the server to list them if needed.
    pub async fn tools(&self) -> Result<Vec<Exposed>, ErrorData> {
        {
            let st = self.state.lock().await;
            if let Some(t) = &st.tools {
                return Ok(t.clone());
            }
        }
        let conn = self.conn().await?;
        let tools = self.state.lock().await.tools.clone().unwrap_or_default();
        if self.policy.lifetime == Lifetime::Call {
            self.reset(conn.generation).await;
        }
        Ok(tools)
    }

    /// The exposed tool names of the last listing, if there was one.
    pub fn listed_tool_names(&self) -> Option<Vec<String>> {
        let st = self.state.try_lock().ok()?;
        st.tools.as_ref().map(|t| {
            t.iter()
                .filter(|e| e.refused.is_none())
                .map(|e| e.name.clone())
                .collect()
        })
    }

    /// Whether `name` belongs to this server (`<tool>.` prefix).
    pub fn owns(&self, name: &str) -> bool {
        name.strip_prefix(self.policy.name.as_str())
            .is_some_and(|rest| rest.starts_with('.'))
    }

    /// Forward one call.
    pub async fn call(
        &self,
        name: &str,
        args: Option<JsonObject>,
        ctx: &RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let tools = self.tools().await?;
        let Some(exposed) = tools.iter().find(|e| e.name == name) else {
            return Err(render::refusal(
                Refusal::UnknownTool,
                format!(
                    "unknown tool `{name}`; server {} exposes: {}",
                    self.policy.name,
                    tools
                        .iter()
                        .filter(|e| e.refused.is_none())
                        .map(|e| e.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
                json!({"tool": name}),
            ));
        };
        if let Some(r) = &exposed.refused {
            return Err(render::refusal(
                Refusal::DescriptionChanged,
                r.clone(),
                json!({"tool": name}),
            ));
        }
        check_args(name, &exposed.tool, args.as_ref())?;
        let conn = self.conn().await?;
        // The server may have been restarted with other tools: look again.
        let current = self.state.lock().await.tools.clone().unwrap_or_default();
        match current.iter().find(|e| e.name == name) {
            Some(e) if e.refused.is_none() => {}
            Some(e) => {
                return Err(render::refusal(
                    Refusal::DescriptionChanged,
                    e.refused.clone().unwrap_or_default(),
                    json!({"tool": name}),
                ));
            }
            None => {
                return Err(render::refusal(
                    Refusal::UnknownTool,
                    format!("unknown tool `{name}`: the restarted server no longer has it"),
                    json!({"tool": name}),
                ));
            }
        }
        let mut params = CallToolRequestParams::new(exposed.server_name.clone());
        params.arguments = args;
        let request = ClientRequest::CallToolRequest(CallToolRequest::new(params));
        let handle = match conn
            .peer
            .send_request_with_option(request, PeerRequestOptions::with_timeout(self.wall))
            .await
        {
            Ok(h) => h,
            Err(e) => {
                conn.handle.kill();
                let why = self.exit_report(&conn.handle).await;
                self.reset(conn.generation).await;
                return Err(self.failed(
                    name,
                    format!("the server is gone ({e}){why}; the next call starts a new one"),
                ));
            }
        };
        // rmcp gives each upstream request its own progress token: route
        // that token's notifications to this agent under the agent's token.
        let upstream_token = handle.progress_token.clone();
        let (request_id, upstream_peer) = (handle.id.clone(), handle.peer.clone());
        let mut routed = false;
        if let Some(t) = ctx.meta.get_progress_token()
            && let Ok(mut r) = self.routes.routes.lock()
        {
            r.insert(upstream_token.clone(), (ctx.peer.clone(), t));
            routed = true;
        }
        let outcome = tokio::select! {
            r = handle.await_response() => Some(r),
            _ = ctx.ct.cancelled() => None,
        };
        if routed {
            // rmcp hands each notification to its own task but resolves the
            // response directly: progress the server sent before its result
            // may still be on its way. Let it reach the agent before the
            // result does.
            use std::sync::atomic::Ordering;
            for _ in 0..100 {
                for _ in 0..8 {
                    tokio::task::yield_now().await;
                }
                if self.routes.in_flight.load(Ordering::SeqCst) == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
        if let Ok(mut r) = self.routes.routes.lock() {
            r.remove(&upstream_token);
        }
        let result = match outcome {
            None => {
                let note = CancelledNotification::new(CancelledNotificationParam::new(
                    Some(request_id),
                    Some("cancelled by the agent".into()),
                ));
                let _ = upstream_peer.send_notification(note.into()).await;
                self.after_call(conn.generation).await;
                return Err(render::refusal(
                    Refusal::ServerFailed,
                    format!("{name}: cancelled by the client"),
                    json!({"tool": name}),
                ));
            }
            Some(Err(ServiceError::Timeout { .. })) => {
                conn.handle.kill();
                self.reset(conn.generation).await;
                return Err(render::refusal(
                    Refusal::LimitHit,
                    format!(
                        "{name}: timed out after {}; the server was stopped and the next call starts a new one",
                        cordon_jail::format_duration(self.wall)
                    ),
                    json!({"tool": name, "limit": "wall_seconds"}),
                ));
            }
            Some(Err(ServiceError::McpError(e))) => {
                // The server's own error text is untrusted: gate it.
                let meta = ToolMeta::new(&self.policy.name, self.profile());
                let text = cordon_gate::gate_error(&meta, e.message.as_bytes())
                    .content
                    .to_text();
                self.after_call(conn.generation).await;
                return Err(ErrorData::new(
                    e.code,
                    format!("{name}: the server refused the call: {text}"),
                    Some(json!({"cordon/status": "server_error", "tool": name})),
                ));
            }
            Some(Err(e)) => {
                conn.handle.kill();
                let why = self.exit_report(&conn.handle).await;
                self.reset(conn.generation).await;
                return Err(self.failed(
                    name,
                    format!(
                    "the server failed during the call ({e}){why}; the next call starts a new one"
                ),
                ));
            }
            Some(Ok(ServerResult::CallToolResult(r))) => r,
            Some(Ok(other)) => {
                self.after_call(conn.generation).await;
                return Err(self.failed(
                    name,
                    format!(
                        "the server answered tools/call with another kind of result ({})",
                        result_kind(&other)
                    ),
                ));
            }
        };
        self.after_call(conn.generation).await;
        self.gate(name, result)
    }

    async fn after_call(&self, generation: u64) {
        if self.policy.lifetime == Lifetime::Call {
            self.reset(generation).await;
        }
    }

    /// Pass an upstream result through the gate: all text (text blocks,
    /// text resources, resource links) as one wrapped text, images and audio
    /// checked against their declared media type, blobs likewise.
    fn gate(&self, name: &str, r: CallToolResult) -> Result<CallToolResult, ErrorData> {
        let base = cordon_broker::gate_for(&self.policy).map_err(|e| {
            render::refusal(Refusal::PolicyRefused, e, json!({"tool": self.policy.name}))
        })?;
        let base = base.policy().clone();
        let meta = ToolMeta::new(name, self.profile());
        let mut texts: Vec<String> = Vec::new();
        let mut binaries: Vec<ContentBlock> = Vec::new();
        let refuse = |msg: String| {
            render::refusal(
                Refusal::GateRefused,
                format!("{name}: {msg}"),
                json!({"tool": name}),
            )
        };
        let check_binary = |mime: &str, data: &str| -> Result<String, ErrorData> {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(data.as_bytes())
                .map_err(|e| {
                    refuse(format!(
                        "output refused: {mime} content is not base64 ({e})"
                    ))
                })?;
            let gate = Gate::new(GatePolicy {
                kind: OutputKind::Binary,
                media_type: Some(mime.to_owned()),
                schema: None,
                ..base.clone()
            })
            .map_err(|e| refuse(e.to_string()))?;
            gate.check(&meta, &bytes)
                .map_err(|e| refuse(e.to_string()))?;
            Ok(base64::engine::general_purpose::STANDARD.encode(&bytes))
        };
        for block in &r.content {
            match block {
                ContentBlock::Text(t) => texts.push(t.text.clone()),
                ContentBlock::Image(i) => {
                    let data = check_binary(&i.mime_type, &i.data)?;
                    binaries.push(ContentBlock::image(data, i.mime_type.clone()));
                }
                ContentBlock::Audio(a) => {
                    let data = check_binary(&a.mime_type, &a.data)?;
                    binaries.push(ContentBlock::audio(data, a.mime_type.clone()));
                }
                ContentBlock::Resource(res) => match &res.resource {
                    ResourceContents::TextResourceContents { uri, text, .. } => {
                        texts.push(format!("[resource {uri}]\n{text}"));
                    }
                    ResourceContents::BlobResourceContents {
                        uri,
                        mime_type,
                        blob,
                        ..
                    } => {
                        let mime = mime_type.clone().unwrap_or_default();
                        let data = check_binary(&mime, blob)?;
                        binaries.push(ContentBlock::resource(
                            ResourceContents::BlobResourceContents {
                                uri: uri.clone(),
                                mime_type: mime_type.clone(),
                                blob: data,
                                meta: None,
                            },
                        ));
                    }
                    _ => texts.push("[resource content dropped]".into()),
                },
                ContentBlock::ResourceLink(l) => {
                    texts.push(format!("[resource link {} {}]", l.uri, l.name));
                }
                other => texts.push(format!("[{} content dropped]", other.kind_name())),
            }
        }
        let joined = texts.join("\n");
        if r.is_error == Some(true) {
            let mut out = render::tool_error(name, self.profile(), joined.as_bytes());
            out.content.extend(binaries);
            return Ok(out);
        }
        let text_gate = Gate::new(GatePolicy {
            kind: OutputKind::Text,
            media_type: None,
            schema: None,
            ..base.clone()
        })
        .map_err(|e| refuse(e.to_string()))?;
        let g = text_gate
            .check(&meta, joined.as_bytes())
            .map_err(|e| refuse(e.to_string()))?;
        let mut out = CallToolResult::success(vec![]).with_meta(Some(render::meta_of(&g)));
        if !joined.is_empty() || binaries.is_empty() {
            out.content.push(ContentBlock::text(g.render_wrapped()));
        }
        out.content.extend(binaries);
        if let Some(sc) = r.structured_content {
            let json_gate = Gate::new(GatePolicy {
                kind: OutputKind::Json,
                media_type: None,
                schema: None,
                ..base
            })
            .map_err(|e| refuse(e.to_string()))?;
            let bytes = serde_json::to_vec(&sc).unwrap_or_default();
            let gj = json_gate
                .check(&meta, &bytes)
                .map_err(|e| refuse(e.to_string()))?;
            if let cordon_gate::Content::Json(v) = gj.content {
                out.structured_content = Some(v);
            }
        }
        Ok(out)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// Check arguments against the server's declared input schema before the
/// call leaves cordon.
fn check_args(name: &str, tool: &Tool, args: Option<&JsonObject>) -> Result<(), ErrorData> {
    let schema = Value::Object((*tool.input_schema).clone());
    let Ok(v) = jsonschema::options()
        .with_pattern_options(jsonschema::PatternOptions::regex())
        .build(&schema)
    else {
        // A schema cordon cannot compile is left to the server to enforce.
        return Ok(());
    };
    let instance = Value::Object(args.cloned().unwrap_or_default());
    let mut errors = v.iter_errors(&instance);
    if let Some(first) = errors.next() {
        let path = first.instance_path().as_str().to_owned();
        let path = if path.is_empty() { "/".into() } else { path };
        let detail: String = first.to_string().chars().take(200).collect();
        return Err(render::refusal(
            Refusal::InvalidArguments,
            format!(
                "{name}: arguments refused by the server's input schema at {path}: {detail} (keyword `{}`)",
                first.kind().keyword()
            ),
            json!({"tool": name, "path": path}),
        ));
    }
    Ok(())
}

fn result_kind(r: &ServerResult) -> String {
    serde_json::to_value(r)
        .ok()
        .and_then(|v| {
            v.as_object()
                .map(|o| o.keys().cloned().collect::<Vec<_>>().join(","))
        })
        .unwrap_or_default()
}

/// Text through the gate's default stripping (no wrapper).
fn strip_text(s: &str) -> String {
    match Gate::new(GatePolicy::default()) {
        Ok(g) => match g.check(&ToolMeta::new("", ""), s.as_bytes()) {
            Ok(x) => x.content.to_text(),
            Err(_) => String::new(),
        },
        Err(_) => String::new(),
    }
}

trait KindName {
    fn kind_name(&self) -> &'static str;
}

impl KindName for ContentBlock {
    fn kind_name(&self) -> &'static str {
        match self {
            ContentBlock::Text(_) => "text",
            ContentBlock::Image(_) => "image",
            ContentBlock::Audio(_) => "audio",
            ContentBlock::Resource(_) => "resource",
            ContentBlock::ResourceLink(_) => "resource_link",
            _ => "unknown",
        }
    }
}

/// Where a URI stands with one server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Exposure {
    /// The server listed this URI.
    Listed,
    /// The URI matches this listed URI template.
    Template(String),
}

/// Resources, resource templates, prompts and completions.
impl Upstream {
    fn refuse_unoffered(&self, what: &str) -> ErrorData {
        render::refusal(
            Refusal::NotOffered,
            format!("{}: the server offers no {what}", self.policy.name),
            json!({"tool": self.policy.name}),
        )
    }

    /// One request on a live connection (starting the server if needed),
    /// bounded by `wall_seconds` and cancelled when the agent cancels.
    async fn timed<T, F>(
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
                        cordon_jail::format_duration(self.wall)
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
                let meta = ToolMeta::new(name, self.profile());
                let text = cordon_gate::gate_error(&meta, e.message.as_bytes())
                    .content
                    .to_text();
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

    fn listed_meta(&self) -> rmcp::model::MetaObject {
        let mut meta = rmcp::model::MetaObject::default();
        meta.insert("cordon/server".into(), json!(self.policy.name));
        meta.insert("cordon/profile".into(), json!(self.profile()));
        meta.insert("cordon/trust".into(), json!("untrusted"));
        meta
    }

    /// `resources/list`, filtered by the manifest's `resources` allowlist;
    /// names and descriptions stripped. Empty when the server offers none.
    pub async fn list_resources(
        &self,
        ct: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<Vec<Resource>, ErrorData> {
        if !self.offers().await?.resources {
            return Ok(vec![]);
        }
        let all = self
            .timed("resources/list", ct, |p| async move {
                p.list_all_resources().await
            })
            .await?;
        let allow = self.resource_allow.as_ref();
        let out: Vec<Resource> = all
            .into_iter()
            .filter(|r| allow.is_none_or(|a| a.contains(&r.uri)))
            .map(|mut r| {
                r.name = strip_text(&r.name);
                r.title = r.title.map(|t| strip_text(&t));
                r.description = r.description.map(|d| strip_text(&d));
                r.meta = Some(self.listed_meta());
                r
            })
            .collect();
        self.state.lock().await.resources = Some(out.clone());
        Ok(out)
    }

    /// `resources/templates/list`, filtered and stripped likewise. A
    /// template cordon cannot parse is left out (nothing could be routed
    /// to it).
    pub async fn list_templates(
        &self,
        ct: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<Vec<ResourceTemplate>, ErrorData> {
        if !self.offers().await?.resources {
            return Ok(vec![]);
        }
        let all = self
            .timed("resources/templates/list", ct, |p| async move {
                p.list_all_resource_templates().await
            })
            .await?;
        let allow = self.resource_allow.as_ref();
        let mut out = Vec::new();
        for mut t in all {
            if allow.is_some_and(|a| !a.contains(&t.uri_template)) {
                continue;
            }
            let compiled = match crate::resources::Template::new(&t.uri_template) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("cordon: warning: {}: not listed: {e}", self.policy.name);
                    continue;
                }
            };
            t.name = strip_text(&t.name);
            t.title = t.title.map(|x| strip_text(&x));
            t.description = t.description.map(|d| strip_text(&d));
            t.meta = Some(self.listed_meta());
            out.push((t, compiled));
        }
        let listed = out.iter().map(|(t, _)| t.clone()).collect();
        self.state.lock().await.templates = Some(out);
        Ok(listed)
    }

    fn exposure_in(st: &State, uri: &str) -> Option<Exposure> {
        if st
            .resources
            .as_ref()
            .is_some_and(|r| r.iter().any(|r| r.uri == uri))
        {
            return Some(Exposure::Listed);
        }
        st.templates.as_ref().and_then(|ts| {
            ts.iter()
                .find(|(_, c)| c.matches(uri))
                .map(|(t, _)| Exposure::Template(t.uri_template.clone()))
        })
    }

    /// Whether this server exposed `uri`: listed it, or listed a template
    /// it matches. Lists again when the last listing does not have it.
    pub async fn exposure(
        &self,
        uri: &str,
        ct: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<Option<Exposure>, ErrorData> {
        if !self.offers().await?.resources {
            return Ok(None);
        }
        if let Some(e) = Self::exposure_in(&*self.state.lock().await, uri) {
            return Ok(Some(e));
        }
        self.list_resources(ct).await?;
        self.list_templates(ct).await?;
        Ok(Self::exposure_in(&*self.state.lock().await, uri))
    }

    /// `resources/read` of a URI this server exposed; the contents gated.
    pub async fn read(
        &self,
        uri: &str,
        ct: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<rmcp::model::ReadResourceResult, ErrorData> {
        if !self.offers().await?.resources {
            return Err(self.refuse_unoffered("resources"));
        }
        if self.exposure(uri, ct).await?.is_none() {
            return Err(render::refusal(
                Refusal::UnknownResource,
                format!(
                    "{}: the server did not list `{uri}` nor a URI template it matches; cordon reads only what resources/list or resources/templates/list exposed",
                    self.policy.name
                ),
                json!({"tool": self.policy.name, "uri": uri}),
            ));
        }
        let params = rmcp::model::ReadResourceRequestParams::new(uri);
        let r = self
            .timed("resources/read", ct, |p| async move {
                p.read_resource_once(params).await
            })
            .await?;
        match r {
            rmcp::model::ReadResourceResponse::Complete(r) => self.gate_read(uri, r),
            _ => Err(self.failed(
                &self.policy.name,
                format!("resources/read of `{uri}`: the server asked the client for input, which cordon does not forward"),
            )),
        }
    }

    /// `resources/subscribe` (`on: true`) or `resources/unsubscribe` of a
    /// URI this server exposed. Updates the server sends for it reach
    /// `agent` as `notifications/resources/updated`. A restarted server
    /// has forgotten its subscriptions. (The servers cordon runs speak the
    /// protocol revisions that still have these requests.)
    #[allow(deprecated)]
    pub async fn subscribe(
        &self,
        uri: &str,
        on: bool,
        agent: Peer<RoleServer>,
        ct: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<(), ErrorData> {
        let offers = self.offers().await?;
        if !offers.subscribe {
            return Err(self.refuse_unoffered("resource subscriptions"));
        }
        if self.exposure(uri, ct).await?.is_none() {
            return Err(render::refusal(
                Refusal::UnknownResource,
                format!(
                    "{}: the server did not list `{uri}` nor a URI template it matches",
                    self.policy.name
                ),
                json!({"tool": self.policy.name, "uri": uri}),
            ));
        }
        if let Ok(mut s) = self.subscriptions.lock() {
            s.agent = Some(agent);
            if on {
                s.uris.insert(uri.to_owned());
            } else {
                s.uris.remove(uri);
            }
        }
        let params = rmcp::model::SubscribeRequestParams::new(uri);
        if on {
            self.timed("resources/subscribe", ct, |p| async move {
                p.subscribe(params).await
            })
            .await
        } else {
            let params = rmcp::model::UnsubscribeRequestParams::new(params.uri);
            self.timed("resources/unsubscribe", ct, |p| async move {
                p.unsubscribe(params).await
            })
            .await
        }
    }

    /// `prompts/list`: the allowed prompts, named `<tool>.<prompt>`, their
    /// descriptions stripped.
    pub async fn list_prompts(
        &self,
        ct: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<Vec<Prompt>, ErrorData> {
        if !self.offers().await?.prompts {
            return Ok(vec![]);
        }
        let all = self
            .timed(
                "prompts/list",
                ct,
                |p| async move { p.list_all_prompts().await },
            )
            .await?;
        let allow = self.prompt_allow.as_ref();
        let listed: Vec<Prompt> = all
            .into_iter()
            .filter(|p| allow.is_none_or(|a| a.contains(&p.name)))
            .collect();
        self.state.lock().await.prompts = Some(listed.clone());
        Ok(listed
            .into_iter()
            .map(|mut p| {
                let mut meta = self.listed_meta();
                meta.insert("cordon/server_prompt".into(), json!(p.name));
                p.name = format!("{}.{}", self.policy.name, p.name);
                p.title = p.title.map(|t| strip_text(&t));
                p.description = p.description.map(|d| strip_text(&d));
                if let Some(args) = &mut p.arguments {
                    for a in args {
                        a.title = a.title.take().map(|t| strip_text(&t));
                        a.description = a.description.take().map(|d| strip_text(&d));
                    }
                }
                p.meta = Some(meta);
                p
            })
            .collect())
    }

    /// `prompts/get` of `<tool>.<prompt>`; the messages gated.
    pub async fn get_prompt(
        &self,
        name: &str,
        args: Option<JsonObject>,
        ct: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<rmcp::model::GetPromptResult, ErrorData> {
        if !self.offers().await?.prompts {
            return Err(self.refuse_unoffered("prompts"));
        }
        let server_name = name
            .strip_prefix(self.policy.name.as_str())
            .and_then(|r| r.strip_prefix('.'))
            .unwrap_or(name)
            .to_owned();
        let known = |st: &State| {
            st.prompts
                .as_ref()
                .is_some_and(|p| p.iter().any(|p| p.name == server_name))
        };
        if !known(&*self.state.lock().await) {
            let listed = self.list_prompts(ct).await?;
            if !known(&*self.state.lock().await) {
                return Err(render::refusal(
                    Refusal::UnknownPrompt,
                    format!(
                        "unknown prompt `{name}`; server {} exposes: {}",
                        self.policy.name,
                        listed
                            .iter()
                            .map(|p| p.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                    json!({"prompt": name}),
                ));
            }
        }
        let mut params = rmcp::model::GetPromptRequestParams::new(server_name);
        params.arguments = args;
        let r = self
            .timed("prompts/get", ct, |p| async move {
                p.get_prompt_once(params).await
            })
            .await?;
        match r {
            rmcp::model::GetPromptResponse::Complete(r) => self.gate_prompt(name, r),
            _ => Err(self.failed(
                name,
                "prompts/get: the server asked the client for input, which cordon does not forward"
                    .into(),
            )),
        }
    }

    /// `completion/complete` for a prompt (`server_prompt` is the server's
    /// name) or a URI template of this server; the values stripped.
    pub async fn complete(
        &self,
        mut params: rmcp::model::CompleteRequestParams,
        server_prompt: Option<String>,
        ct: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<rmcp::model::CompleteResult, ErrorData> {
        if !self.offers().await?.completions {
            return Ok(rmcp::model::CompleteResult::default());
        }
        if let (Some(p), rmcp::model::Reference::Prompt(r)) = (server_prompt, &mut params.r#ref) {
            // Only a prompt the listing exposed (the manifest's allowlist).
            let known = |st: &State| {
                st.prompts
                    .as_ref()
                    .is_some_and(|ps| ps.iter().any(|x| x.name == p))
            };
            if !known(&*self.state.lock().await) {
                self.list_prompts(ct).await?;
                if !known(&*self.state.lock().await) {
                    return Err(render::refusal(
                        Refusal::UnknownPrompt,
                        format!("unknown prompt `{}`", r.name),
                        json!({"prompt": r.name}),
                    ));
                }
            }
            r.name = p;
        }
        params.meta = None;
        let mut r = self
            .timed("completion/complete", ct, |p| async move {
                p.complete(params).await
            })
            .await?;
        r.completion.values = r
            .completion
            .values
            .iter()
            .map(|v| strip_text(v))
            .take(100)
            .collect();
        r.meta = None;
        Ok(r)
    }

    /// The tool's gate policy with this byte budget.
    fn gate_policy(&self, kind: OutputKind, left: u64) -> Result<GatePolicy, ErrorData> {
        let base = cordon_broker::gate_for(&self.policy).map_err(|e| {
            render::refusal(Refusal::PolicyRefused, e, json!({"tool": self.policy.name}))
        })?;
        Ok(GatePolicy {
            kind,
            media_type: None,
            schema: None,
            max_bytes: left,
            ..base.policy().clone()
        })
    }

    fn max_bytes(&self) -> Result<u64, ErrorData> {
        cordon_broker::gate_for(&self.policy)
            .map(|g| g.policy().max_bytes)
            .map_err(|e| {
                render::refusal(Refusal::PolicyRefused, e, json!({"tool": self.policy.name}))
            })
    }

    /// Text through the text gate within `left` bytes (`None`: no room
    /// is left for another part; the caller drops it).
    fn gate_text(
        &self,
        label: &str,
        text: &str,
        left: &mut u64,
    ) -> Result<Option<Gated>, ErrorData> {
        if *left < cordon_gate::MIN_MAX_BYTES {
            return Ok(None);
        }
        let gate = Gate::new(self.gate_policy(OutputKind::Text, *left)?)
            .map_err(|e| gate_refused(label, e.to_string()))?;
        let g = gate
            .check(&ToolMeta::new(label, self.profile()), text.as_bytes())
            .map_err(|e| gate_refused(label, e.to_string()))?;
        *left = left.saturating_sub(g.envelope.bytes_out);
        Ok(Some(g))
    }

    /// Base64 content through the binary gate (magic bytes against the
    /// declared media type) within `left` bytes: the bytes re-encoded.
    fn gate_blob(
        &self,
        label: &str,
        mime: Option<&str>,
        b64: &str,
        left: &mut u64,
    ) -> Result<(String, Gated), ErrorData> {
        let mime = mime.unwrap_or("application/octet-stream");
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(b64.as_bytes())
            .map_err(|e| gate_refused(label, format!("{mime} content is not base64 ({e})")))?;
        if bytes.len() as u64 > *left {
            return Err(gate_refused(
                label,
                format!(
                    "{mime} content of {} bytes is past what is left of the tool's output cap ({} bytes)",
                    bytes.len(),
                    *left
                ),
            ));
        }
        let gate = Gate::new(GatePolicy {
            media_type: Some(mime.to_owned()),
            ..self.gate_policy(OutputKind::Binary, (*left).max(cordon_gate::MIN_MAX_BYTES))?
        })
        .map_err(|e| gate_refused(label, e.to_string()))?;
        let g = gate
            .check(&ToolMeta::new(label, self.profile()), &bytes)
            .map_err(|e| gate_refused(label, e.to_string()))?;
        *left = left.saturating_sub(g.envelope.bytes_out);
        Ok((base64::engine::general_purpose::STANDARD.encode(&bytes), g))
    }

    /// Resource contents through the gate: text as the wrapped untrusted
    /// rendering, blobs checked; each content's `_meta` is its envelope,
    /// the result's `_meta` the whole read's. The tool's size cap bounds
    /// the read as a whole: text past it is cut, parts past it dropped.
    fn gate_read(
        &self,
        uri: &str,
        r: rmcp::model::ReadResourceResult,
    ) -> Result<rmcp::model::ReadResourceResult, ErrorData> {
        let label = self.policy.name.clone();
        let mut left = self.max_bytes()?;
        let mut gated = Vec::new();
        let mut contents = Vec::new();
        let mut dropped = 0;
        for c in r.contents {
            match c {
                ResourceContents::TextResourceContents {
                    uri,
                    mime_type,
                    text,
                    ..
                } => {
                    let Some(g) = self.gate_text(&label, &text, &mut left)? else {
                        dropped += 1;
                        continue;
                    };
                    contents.push(ResourceContents::TextResourceContents {
                        uri,
                        mime_type,
                        text: g.render_wrapped(),
                        meta: Some(render::meta_of(&g)),
                    });
                    gated.push(g);
                }
                ResourceContents::BlobResourceContents {
                    uri,
                    mime_type,
                    blob,
                    ..
                } => {
                    let (blob, g) =
                        self.gate_blob(&label, mime_type.as_deref(), &blob, &mut left)?;
                    contents.push(ResourceContents::BlobResourceContents {
                        uri,
                        mime_type,
                        blob,
                        meta: Some(render::meta_of(&g)),
                    });
                    gated.push(g);
                }
                _ => {
                    return Err(gate_refused(
                        &label,
                        format!("resources/read of `{uri}`: a content of an unknown kind"),
                    ));
                }
            }
        }
        let mut out = rmcp::model::ReadResourceResult::new(contents);
        out.meta = Some(self.summary_meta(&label, &gated, dropped)?);
        Ok(out)
    }

    /// One prompt message's content through the gate (`None`: no room
    /// left under the cap).
    fn gate_block(
        &self,
        name: &str,
        block: ContentBlock,
        left: &mut u64,
        gated: &mut Vec<Gated>,
    ) -> Result<Option<ContentBlock>, ErrorData> {
        let text = |t: &str, left: &mut u64, gated: &mut Vec<Gated>| {
            Ok::<_, ErrorData>(self.gate_text(name, t, left)?.map(|g| {
                let c = ContentBlock::text(g.render_wrapped());
                gated.push(g);
                c
            }))
        };
        Ok(match block {
            ContentBlock::Text(t) => text(&t.text, left, gated)?,
            ContentBlock::Image(i) => {
                let (data, g) = self.gate_blob(name, Some(&i.mime_type), &i.data, left)?;
                gated.push(g);
                Some(ContentBlock::image(data, i.mime_type.clone()))
            }
            ContentBlock::Audio(a) => {
                let (data, g) = self.gate_blob(name, Some(&a.mime_type), &a.data, left)?;
                gated.push(g);
                Some(ContentBlock::audio(data, a.mime_type.clone()))
            }
            ContentBlock::Resource(res) => match res.resource {
                ResourceContents::TextResourceContents {
                    uri,
                    mime_type,
                    text,
                    ..
                } => self.gate_text(name, &text, left)?.map(|g| {
                    let c = ContentBlock::resource(ResourceContents::TextResourceContents {
                        uri,
                        mime_type,
                        text: g.render_wrapped(),
                        meta: Some(render::meta_of(&g)),
                    });
                    gated.push(g);
                    c
                }),
                ResourceContents::BlobResourceContents {
                    uri,
                    mime_type,
                    blob,
                    ..
                } => {
                    let (blob, g) = self.gate_blob(name, mime_type.as_deref(), &blob, left)?;
                    let c = ContentBlock::resource(ResourceContents::BlobResourceContents {
                        uri,
                        mime_type,
                        blob,
                        meta: Some(render::meta_of(&g)),
                    });
                    gated.push(g);
                    Some(c)
                }
                _ => text("[resource content dropped]", left, gated)?,
            },
            ContentBlock::ResourceLink(l) => text(
                &format!("[resource link {} {}]", l.uri, l.name),
                left,
                gated,
            )?,
            other => text(
                &format!("[{} content dropped]", other.kind_name()),
                left,
                gated,
            )?,
        })
    }

    /// Prompt messages through the gate, like a tool result: text as the
    /// wrapped untrusted rendering, images, audio and blobs checked.
    fn gate_prompt(
        &self,
        name: &str,
        r: rmcp::model::GetPromptResult,
    ) -> Result<rmcp::model::GetPromptResult, ErrorData> {
        use rmcp::model::PromptMessage;
        let mut left = self.max_bytes()?;
        let mut gated = Vec::new();
        let mut messages = Vec::new();
        let mut dropped = 0;
        for m in r.messages {
            match self.gate_block(name, m.content, &mut left, &mut gated)? {
                Some(c) => messages.push(PromptMessage::new(m.role, c)),
                None => dropped += 1,
            }
        }
        let mut out = rmcp::model::GetPromptResult::new(messages);
        out.description = r.description.map(|d| strip_text(&d));
        out.meta = Some(self.summary_meta(name, &gated, dropped)?);
        Ok(out)
    }

    /// The `_meta` of a whole read or prompt: the gate's envelope with the
    /// byte counts of all its parts; truncated when a part was cut or
    /// dropped under the cap.
    fn summary_meta(
        &self,
        label: &str,
        gated: &[Gated],
        dropped: usize,
    ) -> Result<rmcp::model::MetaObject, ErrorData> {
        let empty;
        let first = match gated.first() {
            Some(g) => g,
            None => {
                let mut room = cordon_gate::MIN_MAX_BYTES;
                empty = self
                    .gate_text(label, "", &mut room)?
                    .ok_or_else(|| gate_refused(label, "no envelope for an empty result".into()))?;
                &empty
            }
        };
        let mut meta = render::meta_of(first);
        let sum = |f: fn(&Gated) -> u64| gated.iter().map(f).sum::<u64>();
        meta.insert(
            "cordon/bytes_in".into(),
            json!(sum(|g| g.envelope.bytes_in)),
        );
        meta.insert(
            "cordon/bytes_out".into(),
            json!(sum(|g| g.envelope.bytes_out)),
        );
        meta.insert(
            "cordon/truncated".into(),
            json!(dropped > 0 || gated.iter().any(|g| g.envelope.truncated)),
        );
        meta.insert("cordon/parts".into(), json!(gated.len()));
        if dropped > 0 {
            meta.insert("cordon/parts_dropped".into(), json!(dropped));
        }
        Ok(meta)
    }
}

fn gate_refused(label: &str, msg: String) -> ErrorData {
    render::refusal(
        Refusal::GateRefused,
        format!("{label}: output refused: {msg}"),
        json!({"tool": label}),
    )
}
