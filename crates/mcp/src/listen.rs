//! The HTTP listener of the gateway: it accepts connections, makes the TLS
//! handshake when TLS is on, and serves HTTP/1.1 on each, within
//! [`ConnLimits`]:
//!
//! - the head of every request (request line and headers) must have
//!   arrived within `header_timeout` of the connection being ready for it
//!   (accepted, its handshake done, or its previous answer sent), or the
//!   connection is closed; a client trickling one header line at a time
//!   is cut at the same bound as one sending nothing;
//! - a request's body must have arrived within `body_timeout` of its head;
//!   a body still incomplete then fails the request, and the connection is
//!   closed;
//! - at most `max_pending` connections may be open that have not yet had a
//!   request authenticated (or, without authentication, a request head
//!   read); a connection accepted beyond that is closed at once. A
//!   connection stops counting when the authenticator accepts one of its
//!   requests ([`Pending::release`]).
//!
//! The TLS handshake must be done within [`TLS_HANDSHAKE_TIMEOUT`].

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http_body::{Body, Frame, SizeHint};
use hyper::body::{Bytes, Incoming};
use hyper::service::Service;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

use crate::gateway::GatewayError;

/// `header_timeout` when not given.
pub const DEFAULT_HEADER_TIMEOUT: Duration = Duration::from_secs(30);
/// `body_timeout` when not given.
pub const DEFAULT_BODY_TIMEOUT: Duration = Duration::from_secs(30);
/// `max_pending` when not given.
pub const DEFAULT_MAX_PENDING: usize = 128;
/// How long a client may take to finish its TLS handshake.
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client may take to send a request, and how many connections
/// may wait to be authenticated (see the module's text).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnLimits {
    pub header_timeout: Duration,
    pub body_timeout: Duration,
    pub max_pending: usize,
}

impl Default for ConnLimits {
    fn default() -> ConnLimits {
        ConnLimits {
            header_timeout: DEFAULT_HEADER_TIMEOUT,
            body_timeout: DEFAULT_BODY_TIMEOUT,
            max_pending: DEFAULT_MAX_PENDING,
        }
    }
}

/// A connection's place among those not yet authenticated, in each of its
/// requests' extensions; given back by [`Pending::release`].
#[derive(Clone)]
pub struct Pending(Arc<Mutex<Option<OwnedSemaphorePermit>>>);

impl Pending {
    /// One of the connection's requests is authenticated: it no longer
    /// counts against `max_pending`.
    pub fn release(&self) {
        let permit = match self.0.lock() {
            Ok(mut g) => g.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        drop(permit);
    }
}

/// Serve `router` on `listener` (HTTPS with `tls`) within `limits`, until
/// `shutdown`; then each connection is shut down gracefully and this
/// returns once all have ended.
pub(crate) async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    tls: Option<Arc<rustls::ServerConfig>>,
    limits: ConnLimits,
    shutdown: CancellationToken,
) -> Result<(), GatewayError> {
    let acceptor = tls.map(tokio_rustls::TlsAcceptor::from);
    let pending = Arc::new(Semaphore::new(
        limits.max_pending.clamp(1, Semaphore::MAX_PERMITS),
    ));
    let mut last_warned: Option<Instant> = None;
    // Each connection's task holds a sender: once all are dropped, every
    // connection has ended.
    let (alive, mut all_ended) = tokio::sync::mpsc::channel::<()>(1);
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => {
                // Let the connections finish gracefully (in-flight answers
                // are sent, idle ones closed), as they are told to.
                drop(alive);
                let _ = all_ended.recv().await;
                return Ok(());
            }
            accepted = listener.accept() => match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of descriptors and the like: go on after a pause
                    // rather than spin.
                    tracing::warn!("HTTP accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        // Answers are written in pieces (headers, then body frames): with
        // Nagle's algorithm a piece after the first waits for the client's
        // delayed ACK, about 40 ms on every call.
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY on a connection from {peer}: {e}");
        }
        let Ok(permit) = pending.clone().try_acquire_owned() else {
            // Said at most once a minute: a flood must not flood the log.
            if last_warned.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
                last_warned = Some(Instant::now());
                eprintln!(
                    "cordon: warning: closed a connection from {peer}: {} connections have no authenticated request yet (--max-pending-connections); said at most once a minute",
                    limits.max_pending
                );
            }
            drop(tcp);
            continue;
        };
        let svc = ConnService {
            router: router.clone(),
            pending: Pending(Arc::new(Mutex::new(Some(permit)))),
            body_timeout: limits.body_timeout,
        };
        let acceptor = acceptor.clone();
        let stop = shutdown.clone();
        let alive = alive.clone();
        tokio::spawn(async move {
            let _alive = alive;
            match acceptor {
                None => serve_conn(tcp, svc, limits, stop).await,
                Some(acceptor) => {
                    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(s)) => serve_conn(s, svc, limits, stop).await,
                        Ok(Err(e)) => tracing::debug!("TLS handshake: {e}"),
                        Err(_) => tracing::debug!("TLS handshake: timed out"),
                    }
                }
            }
        });
    }
}

/// HTTP/1.1 on one connection, with the header timeout, until it ends or
/// `stop` (then gracefully).
async fn serve_conn<S>(stream: S, svc: ConnService, limits: ConnLimits, stop: CancellationToken)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_timeout);
    let conn = builder
        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc)
        .with_upgrades();
    tokio::pin!(conn);
    tokio::select! {
        r = conn.as_mut() => {
            if let Err(e) = r {
                tracing::debug!("HTTP connection: {e}");
            }
        }
        _ = stop.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = conn.await;
        }
    }
}

/// The router as one connection's service: each request carries the
/// connection's [`Pending`] and its body the body timeout.
#[derive(Clone)]
struct ConnService {
    router: axum::Router,
    pending: Pending,
    body_timeout: Duration,
}

impl Service<hyper::Request<Incoming>> for ConnService {
    type Response = axum::response::Response;
    type Error = Infallible;
    type Future = hyper_util::service::TowerToHyperServiceFuture<
        axum::Router,
        hyper::Request<axum::body::Body>,
    >;

    fn call(&self, req: hyper::Request<Incoming>) -> Self::Future {
        let timeout = self.body_timeout;
        let mut req = req.map(|b| {
            if b.is_end_stream() {
                axum::body::Body::new(b)
            } else {
                axum::body::Body::new(BodyDeadline::new(b, timeout))
            }
        });
        req.extensions_mut().insert(self.pending.clone());
        hyper_util::service::TowerToHyperService::new(self.router.clone()).call(req)
    }
}

/// A request body that fails when it has not all arrived by its deadline.
struct BodyDeadline {
    inner: Incoming,
    deadline: Pin<Box<tokio::time::Sleep>>,
    timeout: Duration,
    done: bool,
}

impl BodyDeadline {
    fn new(inner: Incoming, timeout: Duration) -> BodyDeadline {
        BodyDeadline {
            inner,
            deadline: Box::pin(tokio::time::sleep(timeout)),
            timeout,
            done: false,
        }
    }
}

impl Body for BodyDeadline {
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if let Poll::Ready(r) = Pin::new(&mut this.inner).poll_frame(cx) {
            if r.is_none() {
                this.done = true;
            }
            return Poll::Ready(r.map(|f| f.map_err(axum::BoxError::from)));
        }
        if this.deadline.as_mut().poll(cx).is_ready() {
            this.done = true;
            return Poll::Ready(Some(Err(format!(
                "the request body did not all arrive within {} s",
                this.timeout.as_secs()
            )
            .into())));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
