//! The streamable HTTP transport of the gateway: one [`Session`] per MCP
//! session, at [`HTTP_PATH`], in plain HTTP or TLS ([`tls_config`]).
//!
//! In front of the MCP endpoint: the [`Authenticator`] (its principal goes
//! into the request's extensions), then the session-owner check: a request
//! naming an `Mcp-Session-Id` is refused (`403`) unless its principal is
//! the one that opened that session. When the authenticator has protected
//! resource metadata (RFC 9728) it is served, without authentication, at
//! `/.well-known/oauth-protected-resource` and its path-suffixed form
//! `/.well-known/oauth-protected-resource/mcp`.

use std::net::SocketAddr;
use std::path::Path;
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
    /// Serve HTTPS with this configuration ([`tls_config`]) instead of
    /// plain HTTP.
    pub tls: Option<Arc<rustls::ServerConfig>>,
}

impl std::fmt::Debug for HttpOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpOptions")
            .field("extra_allowed_hosts", &self.extra_allowed_hosts)
            .field("authenticator", &self.authenticator.is_some())
            .field("idle_timeout", &self.idle_timeout)
            .field("tls", &self.tls.is_some())
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
    let ids = Arc::new(crate::session_ids::IdSessions { inner: manager });
    let service: StreamableHttpService<Session, crate::session_ids::IdSessions> =
        StreamableHttpService::new(move || Ok(g.http_session()), ids, config);
    let auth = opts.authenticator.clone();
    let broker = gw.broker.clone();
    let owners = sessions.clone();
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
    let router = router
        .merge(mcp)
        .layer(axum::middleware::from_fn(session_delete_ok));
    if let Some(tls) = opts.tls {
        return serve_tls(listener, router, tls, shutdown).await;
    }
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { shutdown.cancelled_owned().await })
        .await
        .map_err(|e| GatewayError::Io {
            what: "HTTP server".into(),
            source: e,
        })
}

/// How long a client may take to finish its TLS handshake.
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// [`serve_http`]'s loop for HTTPS: each connection's TLS handshake, then
/// HTTP/1.1 on it, until `shutdown`.
async fn serve_tls(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    tls: Arc<rustls::ServerConfig>,
    shutdown: CancellationToken,
) -> Result<(), GatewayError> {
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let (tcp, _peer) = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors and the like: go on after a pause
                    // rather than spin.
                    tracing::warn!("HTTPS accept: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let svc = hyper_util::service::TowerToHyperService::new(router.clone());
        let stop = shutdown.clone();
        tokio::spawn(async move {
            let stream =
                match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!("TLS handshake: {e}");
                        return;
                    }
                    Err(_) => return,
                };
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
                .with_upgrades();
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => {
                    if let Err(e) = r {
                        tracing::debug!("HTTPS connection: {e}");
                    }
                }
                _ = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
    }
}

/// The TLS configuration of a certificate chain and its private key (PEM
/// files). The key file may not be readable by group or others.
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, GatewayError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use std::os::unix::fs::MetadataExt;
    let bad = |what: &Path, m: String| GatewayError::Transport(format!("{}: {m}", what.display()));
    let md = std::fs::metadata(key).map_err(|e| bad(key, format!("cannot be inspected: {e}")))?;
    if md.mode() & 0o077 != 0 {
        return Err(bad(
            key,
            format!(
                "the TLS key is readable or writable by group or others (mode {:04o}): `chmod 600 {}`",
                md.mode() & 0o7777,
                key.display()
            ),
        ));
    }
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| bad(cert, format!("cannot be read as PEM: {e}")))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad(cert, format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(bad(cert, "holds no certificate".into()));
    }
    let k = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| bad(key, format!("not a PEM private key: {e}")))?;
    crate::client::install_crypto_provider();
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| GatewayError::Transport(format!("TLS: {e}")))?
    .with_no_client_auth()
    .with_single_cert(certs, k)
    .map_err(|e| {
        GatewayError::Transport(format!(
            "{} and {}: not a usable certificate and key: {e}",
            cert.display(),
            key.display()
        ))
    })?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
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
