//! The streamable HTTP transport of the gateway: one [`Session`] per MCP
//! session, at [`HTTP_PATH`], in plain HTTP or TLS
//! ([`crate::tls::tls_config`]).
//!
//! In front of the MCP endpoint: the [`Authenticator`] (its principal goes
//! into the request's extensions), then the session-owner check: a request
//! naming an `Mcp-Session-Id` is refused (`403`) unless its principal is
//! the one that opened that session. When the authenticator has protected
//! resource metadata (RFC 9728) it is served, without authentication, at
//! `/.well-known/oauth-protected-resource` and its path-suffixed form
//! `/.well-known/oauth-protected-resource/mcp`.
//!
//! The gateway's metrics ([`crate::metrics`]) are at `GET /metrics` and
//! its console ([`crate::console`]) at `GET /console`, behind the same
//! authentication as the MCP endpoint.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::gateway::{Gateway, GatewayError};
use crate::lifetime::Known;
use crate::session::Session;

/// What an [`Authenticator`] answers: the caller, or the response that
/// refuses the request (`401` with `WWW-Authenticate`, `403`).
pub type Authenticated = Result<cordon_auth::Principal, axum::response::Response>;

/// Establishes who sent an HTTP request to the MCP endpoint. The principal
/// it returns is put in the request's extensions, where the session takes
/// it from at `initialize`.
pub trait Authenticator: Send + Sync {
    fn authenticate<'a>(
        &'a self,
        parts: &'a axum::http::request::Parts,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Authenticated> + Send + 'a>>;

    /// The Protected Resource Metadata document (RFC 9728) to serve, if any.
    fn resource_metadata(&self) -> Option<serde_json::Value> {
        None
    }

    /// Which authentication this is, for a person (the start line).
    fn describe(&self) -> String {
        "custom authenticator".into()
    }
}

/// Options of the streamable HTTP transport.
#[derive(Clone, Default)]
pub struct HttpOptions {
    /// `Host` values accepted besides the loopback names (rmcp's
    /// DNS-rebinding check stays on).
    pub extra_allowed_hosts: Vec<String>,
    /// Who may call (`None`: every request is the unauthenticated
    /// principal).
    pub authenticator: Option<Arc<dyn Authenticator>>,
    /// The idle timeout of a session, instead of the manifest's
    /// `gateway: {idle_timeout}` (`cordon serve --idle-timeout`).
    pub idle_timeout: Option<std::time::Duration>,
    /// Serve HTTPS with this configuration ([`crate::tls::tls_config`]) instead of
    /// plain HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
    /// Header and body timeouts, and how many connections may wait to be
    /// authenticated ([`crate::listen`]).
    pub limits: crate::listen::ConnLimits,
}

impl std::fmt::Debug for HttpOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpOptions")
            .field("extra_allowed_hosts", &self.extra_allowed_hosts)
            .field("authenticator", &self.authenticator.is_some())
            .field("idle_timeout", &self.idle_timeout)
            .field("tls", &self.tls.is_some())
            .field("limits", &self.limits)
            .finish()
    }
}

/// The path the MCP endpoint is served on.
pub const HTTP_PATH: &str = "/mcp";

/// Serve streamable HTTP on `listener` (at [`HTTP_PATH`]) until `shutdown`
/// is cancelled, within `opts.limits` ([`crate::listen`]). Each MCP
/// session gets its own [`Session`]; a session idle
/// for its timeout, or whose client is gone, is ended (see
/// [`crate::lifetime`]).
pub async fn serve_http(
    gw: Arc<Gateway>,
    listener: tokio::net::TcpListener,
    opts: HttpOptions,
    shutdown: CancellationToken,
) -> Result<(), GatewayError> {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    use rmcp::transport::streamable_http_server::session::local::SessionConfig;
    use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
    let gp = gw.caps.policy();
    let idle = opts
        .idle_timeout
        .unwrap_or(std::time::Duration::from_secs(gp.idle_timeout_seconds));
    let grace = std::time::Duration::from_secs(gp.disconnect_grace_seconds);
    // cordon's reaper ends idle sessions (and not while a call is in
    // flight, which rmcp's own keep-alive would).
    let mut session_config = SessionConfig::default();
    session_config.keep_alive = None;
    let mut manager = LocalSessionManager::default();
    manager.session_config = session_config;
    let manager = Arc::new(manager);
    let sessions =
        crate::lifetime::HttpSessions::new(idle, grace, manager.clone(), gw.broker.clone());
    tokio::spawn(sessions.clone().reap(shutdown.child_token()));
    let mut config =
        StreamableHttpServerConfig::default().with_cancellation_token(shutdown.child_token());
    config.sse_keep_alive = Some(sessions.keep_alive());
    if !opts.extra_allowed_hosts.is_empty() {
        let mut hosts = config.allowed_hosts.clone();
        hosts.extend(opts.extra_allowed_hosts.iter().cloned());
        config = config.with_allowed_hosts(hosts);
    }
    let g = gw.clone();
    let ids = Arc::new(crate::session_ids::IdSessions { inner: manager });
    let service: StreamableHttpService<Session, crate::session_ids::IdSessions> =
        StreamableHttpService::new(move || Ok(g.http_session()), ids, config);
    let auth = opts.authenticator.clone();
    let broker = gw.broker.clone();
    let owners = sessions.clone();
    let live = sessions.clone();
    gw.metrics
        .count_sessions_with(Arc::new(move || live.live()));
    let metrics = gw.metrics.clone();
    let metrics_auth = opts.authenticator.clone();
    let console_auth = opts.authenticator.clone();
    // The console, behind the same authentication too.
    let console_route =
        crate::console::router(gw.clone()).layer(axum::middleware::from_fn(move |req, next| {
            authenticate(console_auth.clone(), req, next)
        }));
    // The metrics, behind the same authentication as the MCP endpoint.
    let metrics_route =
        crate::metrics::router(metrics).layer(axum::middleware::from_fn(move |req, next| {
            authenticate(metrics_auth.clone(), req, next)
        }));
    let mcp = axum::Router::new()
        .nest_service(HTTP_PATH, service)
        .layer(axum::middleware::from_fn(move |req, next| {
            crate::lifetime::track(sessions.clone(), req, next)
        }))
        .layer(axum::middleware::from_fn(move |req, next| {
            session_owner(owners.clone(), broker.clone(), req, next)
        }))
        .layer(axum::middleware::from_fn(move |req, next| {
            authenticate(auth.clone(), req, next)
        }));
    let mut router = axum::Router::new();
    if let Some(doc) = opts
        .authenticator
        .as_ref()
        .and_then(|a| a.resource_metadata())
    {
        let doc: Arc<str> = Arc::from(doc.to_string());
        for path in [
            crate::bearer::METADATA_PATH.to_string(),
            format!("{}{HTTP_PATH}", crate::bearer::METADATA_PATH),
        ] {
            let d = doc.clone();
            router = router.route(
                &path,
                axum::routing::get(move || {
                    let d = d.clone();
                    async move {
                        (
                            [(axum::http::header::CONTENT_TYPE, "application/json")],
                            d.to_string(),
                        )
                    }
                }),
            );
        }
    }
    let mut router = router.merge(mcp);
    if gw.observed() {
        router = router.merge(metrics_route).merge(console_route);
    } else {
        // Not served, and said why.
        for path in [crate::metrics::METRICS_PATH, crate::console::CONSOLE_PATH] {
            router = router.route(
                path,
                axum::routing::get(|| async {
                    (
                        axum::http::StatusCode::NOT_FOUND,
                        "not served: cordon serve runs with --no-metrics (no metrics, no console)\n",
                    )
                }),
            );
        }
    }
    let router = router.layer(axum::middleware::from_fn(session_delete_ok));
    gw.start_warm();
    let served = crate::listen::serve(listener, router, opts.tls, opts.limits, shutdown).await;
    gw.stop_warm();
    served
}

/// The same caller: subject, client, tenant and how it was established
/// (groups may change between two tokens of one caller).
fn same_caller(a: &cordon_auth::Principal, b: &cordon_auth::Principal) -> bool {
    a.subject == b.subject
        && a.client_id == b.client_id
        && a.tenant == b.tenant
        && a.method == b.method
}

const SESSION_HEADER: &str = "mcp-session-id";

/// A request naming a session is let through only when its principal
/// opened that session (the sessions' layer records it when the answer
/// that created it goes out, and keeps it while the session's end is
/// remembered); an id never handed out is `404`.
async fn session_owner(
    sessions: Arc<crate::lifetime::HttpSessions>,
    broker: Arc<cordon_broker::Broker>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    use axum::http::StatusCode;
    use axum::response::IntoResponse;
    let sid = req
        .headers()
        .get(SESSION_HEADER)
        .map(|v| v.to_str().map(str::to_string));
    let who = req
        .extensions()
        .get::<cordon_auth::Principal>()
        .cloned()
        .unwrap_or_else(cordon_auth::Principal::unauthenticated);
    match &sid {
        Some(Err(_)) => {
            return (
                StatusCode::BAD_REQUEST,
                "the Mcp-Session-Id is not visible ASCII",
            )
                .into_response();
        }
        Some(Ok(id)) => match sessions.known(id) {
            Known::Live(Some(owner)) | Known::Ended(Some(owner)) if same_caller(&owner, &who) => {}
            // Its end is said to whoever asks (nothing else of it is).
            Known::Ended(None) => {}
            Known::Live(Some(owner)) | Known::Ended(Some(owner)) => {
                tracing::warn!(
                    session = %id,
                    owner = %owner.subject,
                    caller = %who.subject,
                    "refused a request for another principal's session"
                );
                // Audited as the requester's: who tried, which session.
                let mut rec = cordon_audit::AuditRecord::new("", "");
                rec.runtime = "none".into();
                rec.session = id.clone();
                rec.caller = "mcp".into();
                rec.principal = Some(who.subject.clone());
                rec.tenant = Some(who.tenant.clone());
                rec.status = cordon_audit::Status::Denied;
                rec.reason = Some("a request for a session opened by another principal".into());
                // The refusal stands whatever becomes of its record; one
                // that cannot be written is counted and said (`cordon
                // doctor`, the next call's warnings).
                broker.record_after(&rec);
                return (
                    StatusCode::FORBIDDEN,
                    "this session was opened by another principal",
                )
                    .into_response();
            }
            Known::Live(None) | Known::Unknown => {
                return (StatusCode::NOT_FOUND, "no such session").into_response();
            }
        },
        None => {}
    }
    next.run(req).await
}

/// Put the request's principal in its extensions, or answer the
/// authenticator's refusal.
async fn authenticate(
    auth: Option<Arc<dyn Authenticator>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let (mut parts, body) = req.into_parts();
    let principal = match &auth {
        Some(a) => match a.authenticate(&parts).await {
            Ok(p) => p,
            Err(refused) => return refused,
        },
        None => cordon_auth::Principal::unauthenticated(),
    };
    // The connection is past authentication: it no longer counts against
    // the connections waiting for it.
    if let Some(p) = parts.extensions.get::<crate::listen::Pending>() {
        p.release();
    }
    parts.extensions.insert(principal);
    next.run(axum::extract::Request::from_parts(parts, body))
        .await
}

/// A session `DELETE` that rmcp accepted (`202`) is answered `200`: the
/// session is gone once the answer is sent, and clients (the Python SDK)
/// take only 200 or 204 as success.
async fn session_delete_ok(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    let delete = req.method() == axum::http::Method::DELETE;
    let mut resp = next.run(req).await;
    if delete && resp.status() == axum::http::StatusCode::ACCEPTED {
        *resp.status_mut() = axum::http::StatusCode::OK;
    }
    resp
}

/// Bind `addr` for [`serve_http`].
pub async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, GatewayError> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| GatewayError::Io {
            what: format!("bind {addr}"),
            source: e,
        })
}
