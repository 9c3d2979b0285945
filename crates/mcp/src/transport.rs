//! Running the gateway: one session on stdio, or streamable HTTP, until the
//! client goes away or a signal arrives.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rmcp::ServiceExt;
use tokio_util::sync::CancellationToken;

use crate::gateway::{Gateway, GatewayError};
use crate::http::{HTTP_PATH, HttpOptions, bind, serve_http};

/// Serve one session over stdin/stdout until the client closes it.
pub async fn serve_stdio(gw: Arc<Gateway>) -> Result<(), GatewayError> {
    gw.start_warm();
    let served = serve_stdio_session(&gw).await;
    gw.stop_warm();
    served
}

async fn serve_stdio_session(gw: &Arc<Gateway>) -> Result<(), GatewayError> {
    let session = gw.session("stdio");
    gw.metrics.count_sessions_with(Arc::new(|| 1));
    let _ = session.set_principal(cordon_auth::Principal::local(cordon_sys::io::geteuid()));
    let running = session
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| GatewayError::Transport(e.to_string()))?;
    running
        .waiting()
        .await
        .map_err(|e| GatewayError::Transport(e.to_string()))?;
    Ok(())
}

/// Which transport [`run`] serves.
#[derive(Debug, Clone)]
pub enum Transport {
    /// One session on stdin/stdout.
    Stdio,
    /// Streamable HTTP on this address.
    Http { addr: SocketAddr, opts: HttpOptions },
}

/// Serve `gw` on `transport` until the client goes away (stdio) or SIGINT
/// / SIGTERM arrives; then every session's sandboxes are stopped.
/// `on_ready` gets a line for a person once the gateway listens (for HTTP,
/// the URL with the bound port).
///
/// `metrics_addr`: also serve the metrics ([`crate::metrics`]), without
/// authentication, on this address (the caller decides which addresses
/// that may be).
pub fn run(
    gw: Gateway,
    transport: Transport,
    metrics_addr: Option<SocketAddr>,
    mut on_ready: impl FnMut(&str),
) -> Result<(), GatewayError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| GatewayError::Io {
            what: "start the async runtime".into(),
            source: e,
        })?;
    let gw = Arc::new(gw);
    let result = rt.block_on(async move {
        let stop = CancellationToken::new();
        let s = stop.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            s.cancel();
        });
        if let Some(addr) = metrics_addr {
            let listener = bind(addr).await?;
            let bound = listener.local_addr().map_err(|e| GatewayError::Io {
                what: "local address".into(),
                source: e,
            })?;
            on_ready(&format!(
                "serving metrics on http://{bound}{}",
                crate::metrics::METRICS_PATH
            ));
            tokio::spawn(serve_metrics(gw.metrics.clone(), listener, stop.clone()));
        }
        match transport {
            Transport::Stdio => {
                on_ready("serving MCP on stdio");
                tokio::select! {
                    r = serve_stdio(gw) => r,
                    _ = stop.cancelled() => Ok(()),
                }
            }
            Transport::Http { addr, opts } => {
                let listener = bind(addr).await?;
                let bound = listener.local_addr().map_err(|e| GatewayError::Io {
                    what: "local address".into(),
                    source: e,
                })?;
                let scheme = if opts.tls.is_some() { "https" } else { "http" };
                on_ready(&format!("serving MCP on {scheme}://{bound}{HTTP_PATH}"));
                serve_http(gw, listener, opts, stop).await
            }
        }
    });
    // Sessions still running (a stdio call in flight) are dropped here,
    // which stops their sandboxes.
    rt.shutdown_timeout(Duration::from_secs(2));
    result
}

/// Serve `GET /metrics` on `listener` until `stop`.
async fn serve_metrics(
    metrics: Arc<crate::metrics::Metrics>,
    listener: tokio::net::TcpListener,
    stop: CancellationToken,
) {
    let router = crate::metrics::router(metrics)
        // No authentication here: a connection that sent a request no
        // longer counts as waiting for one (a scraper's keep-alive).
        .layer(axum::middleware::from_fn(
            |req: axum::extract::Request, next: axum::middleware::Next| async move {
                if let Some(p) = req.extensions().get::<crate::listen::Pending>() {
                    p.release();
                }
                next.run(req).await
            },
        ));
    if let Err(e) = crate::listen::serve(
        listener,
        router,
        None,
        crate::listen::ConnLimits::default(),
        stop,
    )
    .await
    {
        tracing::warn!("the metrics listener stopped: {e}");
        eprintln!("cordon: warning: the metrics listener stopped: {e}");
    }
}

/// Wait for SIGTERM or SIGINT (forever when they cannot be caught).
async fn wait_for_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => std::future::pending::<()>().await,
    }
}
