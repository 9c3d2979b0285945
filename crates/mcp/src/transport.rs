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
pub fn run(
    gw: Gateway,
    transport: Transport,
    on_ready: impl FnOnce(&str),
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
