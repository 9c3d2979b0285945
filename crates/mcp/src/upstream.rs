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
use cordon_gate::{Gate, GatePolicy, OutputKind, ToolMeta};
use cordon_policy::policy::{Exec, Lifetime, ToolPolicy};
use rmcp::model::{
    CallToolRequest, CancelledNotification, CancelledNotificationParam, ClientRequest, ServerResult,
};
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ClientCapabilities, ContentBlock, Implementation,
    InitializeRequestParams, JsonObject, ProgressNotificationParam, ProgressToken, ProtocolVersion,
    ResourceContents, Tool,
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

/// The client side of the connection to a sandboxed server.
#[derive(Clone)]
struct Forwarder {
    routes: Arc<ProgressRoutes>,
}

impl ClientHandler for Forwarder {
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
}

/// One `mcp:` tool of the manifest within one agent session.
pub(crate) struct Upstream {
    policy: Arc<ToolPolicy>,
    argv: Vec<String>,
    allow: Option<Vec<String>>,
    rename: BTreeMap<String, String>,
    pins: BTreeMap<String, String>,
    sandbox: Arc<dyn ServerSandbox>,
    routes: Arc<ProgressRoutes>,
    state: tokio::sync::Mutex<State>,
    wall: Duration,
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
            state: tokio::sync::Mutex::new(State::default()),
            wall,
            policy,
        })
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
