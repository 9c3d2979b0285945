//! The streamable HTTP transport of the gateway: one [`Session`] per MCP
//! session, at [`HTTP_PATH`].

use std::net::SocketAddr;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::{Gateway, GatewayError, Session};

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
}

impl std::fmt::Debug for HttpOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpOptions")
            .field("extra_allowed_hosts", &self.extra_allowed_hosts)
            .field("authenticator", &self.authenticator.is_some())
            .field("idle_timeout", &self.idle_timeout)
            .finish()
    }
}

/// The path the MCP endpoint is served on.
pub const HTTP_PATH: &str = "/mcp";

/// Serve streamable HTTP on `listener` (at [`HTTP_PATH`]) until `shutdown`
/// is cancelled. Each MCP session gets its own [`Session`]; a session idle
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
    let service: StreamableHttpService<Session, LocalSessionManager> =
        StreamableHttpService::new(move || Ok(g.session("http")), manager, config);
    let auth = opts.authenticator.clone();
    let router = axum::Router::new()
        .nest_service(HTTP_PATH, service)
        .layer(axum::middleware::from_fn(move |req, next| {
            crate::lifetime::track(sessions.clone(), req, next)
        }))
        .layer(axum::middleware::from_fn(move |req, next| {
            authenticate(auth.clone(), req, next)
        }))
        .layer(axum::middleware::from_fn(session_delete_ok));
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled_owned().await })
        .await
        .map_err(|e| GatewayError::Io {
            what: "HTTP server".into(),
            source: e,
        })
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
