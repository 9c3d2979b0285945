//! Intercepted HTTP: one connection served as HTTP/1.1 or h2 to the tool,
//! each request checked (its authority must be the destination), its
//! secrets substituted, its body scanned, and sent on the door's own
//! connection to the upstream; an upgrade (WebSocket) runs on with the
//! tool's bytes scanned (a WebSocket's frames unmasked, and no extension
//! offered upstream: a compressed frame could not be scanned).

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::{Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use super::body::ScanBody;
use super::close_event;
use super::report::{Dest, Refusal, exfil, stopped};
use super::stream::{Speaks, scanned_splice};
use super::substitute::apply;
use super::tls;
use crate::engine::{Engine, OpenError};
use crate::event::{Decision, clean, started};
use crate::http::{ReqBody, RespBody, strip_hop_by_hop, text};
use crate::interception::Interception;
use crate::io::{Meter, Metered};
use crate::name::{Host, normalize_host};

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<ReqBody>),
    H2(hyper::client::conn::http2::SendRequest<ReqBody>),
}

impl Sender {
    fn is_closed(&self) -> bool {
        match self {
            Sender::H1(s) => s.is_closed(),
            Sender::H2(s) => s.is_closed(),
        }
    }
}

/// One intercepted connection's shared state.
struct Conn {
    engine: Arc<Engine>,
    icpt: Arc<Interception>,
    dest: Dest,
    tls: bool,
    /// The tool negotiated h2 with the door.
    h2: bool,
    meter: Arc<Meter>,
    upstream: tokio::sync::Mutex<Option<Sender>>,
    /// The first upstream connection, until the first request takes it.
    first: Mutex<Option<TcpStream>>,
    tasks: mpsc::UnboundedSender<Task>,
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn run_http<S>(
    engine: Arc<Engine>,
    icpt: Arc<Interception>,
    dest: Dest,
    client: S,
    upstream: TcpStream,
    tls: bool,
    h2: bool,
    meter: Arc<Meter>,
    t0: (Instant, String),
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let idle = engine.policy.idle_timeout;
    let (task_tx, mut task_rx) = mpsc::unbounded_channel::<Task>();
    let conn = Arc::new(Conn {
        engine: engine.clone(),
        icpt,
        dest: dest.clone(),
        tls,
        h2,
        meter: meter.clone(),
        upstream: tokio::sync::Mutex::new(None),
        first: Mutex::new(Some(upstream)),
        tasks: task_tx,
    });
    let client_meter = Meter::new();
    let io = TokioIo::new(Metered::new(client, client_meter.clone()));
    let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
        let c = conn.clone();
        async move { Ok::<_, Infallible>(c.handle(req).await) }
    });
    let served: Pin<Box<dyn Future<Output = ()> + Send>> = if h2 {
        Box::pin(async move {
            let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .serve_connection(io, svc)
                .await;
        })
    } else {
        Box::pin(async move {
            let _ = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(idle)
                .serve_connection(io, svc)
                .with_upgrades()
                .await;
        })
    };
    tokio::pin!(served);
    let mut tasks: JoinSet<()> = JoinSet::new();
    let mut note = None;
    loop {
        tokio::select! {
            () = &mut served => break,
            Some(t) = task_rx.recv() => { tasks.spawn(t); }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            () = client_meter.idle(idle) => {
                note = Some(format!("closed after {} s idle", idle.as_secs()));
                break;
            }
        }
    }
    while let Ok(t) = task_rx.try_recv() {
        tasks.spawn(t);
    }
    // Upgraded streams (WebSocket) run on; upstream drivers end with their
    // senders.
    loop {
        tokio::select! {
            r = tasks.join_next() => if r.is_none() { break },
            Some(t) = task_rx.recv() => { tasks.spawn(t); }
        }
    }
    close_event(&engine, &dest, &meter, note, t0);
}

impl Conn {
    fn default_port(&self) -> u16 {
        if self.tls { 443 } else { 80 }
    }

    /// The request's authority must be this connection's destination.
    fn check_authority(&self, req: &Request<Incoming>) -> Result<String, Refusal> {
        let auth = req
            .uri()
            .authority()
            .map(|a| a.as_str().to_string())
            .or_else(|| {
                req.headers()
                    .get(header::HOST)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string)
            });
        let Some(auth) = auth else {
            return Ok(format!("{}:{}", self.dest.label, self.dest.port));
        };
        let parsed: Option<(Host, u16)> = auth
            .parse::<hyper::http::uri::Authority>()
            .ok()
            .and_then(|a| {
                let port = a.port_u16().unwrap_or(self.default_port());
                normalize_host(a.host()).ok().map(|h| (h, port))
            });
        match parsed {
            Some((h, p)) if h == self.dest.host && p == self.dest.port => Ok(auth),
            _ => Err(Refusal::Other {
                status: StatusCode::MISDIRECTED_REQUEST,
                why: format!(
                    "a request for {} on a connection to {}:{}",
                    clean(&auth),
                    self.dest.label,
                    self.dest.port
                ),
            }),
        }
    }

    async fn handle(self: Arc<Self>, mut req: Request<Incoming>) -> Response<RespBody> {
        let t0 = started();
        let engine = &self.engine;
        let authority = match self.check_authority(&req) {
            Ok(a) => a,
            Err(r) => return r.respond(engine, &self.dest, &t0),
        };
        let upgrade = !self.h2 && req.headers().contains_key(header::UPGRADE);
        let mut websocket = upgrade && is_websocket(req.headers());
        if websocket {
            // permessage-deflate (or any extension) would change the frames
            // the door must read: never offered, so never negotiated.
            req.headers_mut().remove(header::SEC_WEBSOCKET_EXTENSIONS);
        }
        let client_upgrade = if upgrade {
            Some(hyper::upgrade::on(&mut req))
        } else {
            None
        };
        let (mut parts, body) = req.into_parts();
        let injected = match apply(&self.icpt, &self.dest.host, self.dest.port, &mut parts) {
            Ok(i) => i,
            Err(r) => return r.respond(engine, &self.dest, &t0),
        };
        strip_hop_by_hop_but_upgrade(&mut parts.headers, upgrade);
        super::response::ask_identity(
            &self.icpt,
            &self.dest.host,
            self.dest.port,
            &mut parts.headers,
        );
        let (body, hit) = match ScanBody::read(body, self.icpt.needles().clone()).await {
            Ok(ok) => ok,
            Err(s) => {
                return exfil(&s, "the request body", &self.icpt).respond(engine, &self.dest, &t0);
            }
        };
        let path = clean(parts.uri.path());
        let mut sender = match self.sender().await {
            Ok(s) => s,
            Err(why) => return self.failed(why, Vec::new(), &t0),
        };
        let result = match self.send(&mut sender, parts, body, &authority).await {
            Ok(r) => r,
            Err(r) => return r.respond(engine, &self.dest, &t0),
        };
        self.give_back(sender).await;
        let found = hit.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(s) = found {
            return exfil(&s, "the request body", &self.icpt).respond(engine, &self.dest, &t0);
        }
        let resp = match result {
            Ok(r) => r,
            Err(e) => return self.failed(e.to_string(), injected, &t0),
        };
        if !injected.is_empty() {
            let reason = format!(
                "{}; substituted the token of {} on a request to {}:{}{path}",
                self.dest.allowed_why,
                injected.join(", "),
                self.dest.label,
                self.dest.port
            );
            self.dest
                .event(engine, Decision::Allowed, reason, injected, None, &t0);
        }
        // Tokens coming back are replaced (headers here, the body as it
        // streams); an encoded response of a bound endpoint is refused.
        let mut resp = match super::response::guard(engine, &self.icpt, &self.dest, resp, &t0) {
            Ok(r) => r,
            Err(r) => return r.respond(engine, &self.dest, &t0),
        };
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS
            && let Some(client_up) = client_upgrade
        {
            websocket |= is_websocket(resp.headers());
            if websocket
                && resp
                    .headers()
                    .contains_key(header::SEC_WEBSOCKET_EXTENSIONS)
            {
                return Refusal::Other {
                    status: StatusCode::BAD_GATEWAY,
                    why: "the upstream answered the WebSocket upgrade with an extension none was offered (Sec-WebSocket-Extensions): its frames could not be scanned".into(),
                }
                .respond(engine, &self.dest, &t0);
            }
            let speaks = if websocket {
                Speaks::WebSocket
            } else {
                Speaks::Bytes
            };
            self.upgraded(client_up, hyper::upgrade::on(&mut resp), speaks);
            return resp;
        }
        let (mut parts, body) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        Response::from_parts(parts, body)
    }

    /// The upstream could not be reached or failed the request: reported
    /// (allowed by the policy, with the secrets substituted) and answered
    /// with 502.
    fn failed(
        &self,
        why: String,
        injected: Vec<String>,
        t0: &(Instant, String),
    ) -> Response<RespBody> {
        let msg = format!(
            "egress to {}:{} failed: {why}",
            self.dest.label, self.dest.port
        );
        self.dest.event(
            &self.engine,
            Decision::Allowed,
            msg.clone(),
            injected,
            None,
            t0,
        );
        text(StatusCode::BAD_GATEWAY, &msg)
    }

    /// Send the request on `sender`, its target in the form the upstream's
    /// protocol wants (origin form and `Host` for HTTP/1.1, absolute for h2).
    async fn send(
        &self,
        sender: &mut Sender,
        mut parts: hyper::http::request::Parts,
        body: ReqBody,
        authority: &str,
    ) -> Result<Result<Response<Incoming>, hyper::Error>, Refusal> {
        let pq = parts
            .uri
            .path_and_query()
            .map(|p| p.as_str().to_string())
            .unwrap_or_else(|| "/".into());
        match sender {
            Sender::H1(s) => {
                parts.version = Version::HTTP_11;
                parts.uri = pq.parse().unwrap_or_else(|_| Uri::from_static("/"));
                if !parts.headers.contains_key(header::HOST)
                    && let Ok(v) = HeaderValue::from_str(authority)
                {
                    parts.headers.insert(header::HOST, v);
                }
                Ok(s.send_request(Request::from_parts(parts, body)).await)
            }
            Sender::H2(s) => {
                parts.version = Version::HTTP_2;
                let scheme = if self.tls { "https" } else { "http" };
                let abs = format!("{scheme}://{}:{}{pq}", self.dest.label, self.dest.port);
                parts.uri = abs.parse().map_err(|_| Refusal::Other {
                    status: StatusCode::BAD_REQUEST,
                    why: "the request target is not valid".into(),
                })?;
                parts.headers.remove(header::HOST);
                Ok(s.send_request(Request::from_parts(parts, body)).await)
            }
        }
    }

    /// An upgraded (WebSocket) stream: spliced on as a connection task,
    /// the tool's bytes scanned as it `speaks`; a placeholder, or a frame
    /// that cannot be scanned, ends it, refused.
    fn upgraded(
        self: &Arc<Self>,
        client_up: hyper::upgrade::OnUpgrade,
        up: hyper::upgrade::OnUpgrade,
        speaks: Speaks,
    ) {
        let needles = self.icpt.needles().clone();
        let c = self.clone();
        let idle = self.engine.policy.idle_timeout;
        let task = async move {
            let (Ok(cu), Ok(uu)) = (client_up.await, up.await) else {
                return;
            };
            let meter = Meter::new();
            let hit = scanned_splice(
                TokioIo::new(cu),
                Metered::new(TokioIo::new(uu), meter.clone()),
                needles,
                speaks,
                meter,
                idle,
            )
            .await;
            if let Some(stop) = hit {
                let t0 = started();
                let place = match speaks {
                    Speaks::WebSocket => "a WebSocket message",
                    Speaks::Bytes => "the upgraded stream",
                };
                let _ = stopped(stop, place, &c.icpt).respond(&c.engine, &c.dest, &t0);
            }
        };
        let _ = self.tasks.send(Box::pin(task));
    }

    async fn give_back(&self, s: Sender) {
        if let Sender::H1(_) = &s {
            let mut g = self.upstream.lock().await;
            if g.is_none() && !s.is_closed() {
                *g = Some(s);
            }
        }
    }

    /// A sender to the upstream: the open one, or a new connection.
    async fn sender(&self) -> Result<Sender, String> {
        {
            let mut g = self.upstream.lock().await;
            match g.as_mut() {
                Some(Sender::H2(s)) if !s.is_closed() => return Ok(Sender::H2(s.clone())),
                Some(Sender::H1(s)) if !s.is_closed() => {
                    if s.ready().await.is_ok()
                        && let Some(s) = g.take()
                    {
                        return Ok(s);
                    }
                    *g = None;
                }
                _ => *g = None,
            }
        }
        let first = self.first.lock().unwrap_or_else(|e| e.into_inner()).take();
        let tcp = match first {
            Some(t) => t,
            None => match self.engine.open(&self.dest.host, self.dest.port).await {
                Ok((t, _)) => t,
                Err(OpenError::Refused { why, .. }) | Err(OpenError::Failed { why, .. }) => {
                    return Err(why);
                }
            },
        };
        let tcp = Metered::new(tcp, self.meter.clone());
        let s = if self.tls {
            let (tls, h2) =
                tls::connect(&self.engine, &self.icpt, &self.dest, tcp, self.h2).await?;
            self.handshake(TokioIo::new(tls), h2).await?
        } else {
            self.handshake(TokioIo::new(tcp), false).await?
        };
        if let Sender::H2(h) = &s {
            *self.upstream.lock().await = Some(Sender::H2(h.clone()));
        }
        Ok(s)
    }

    async fn handshake<I>(&self, io: I, h2: bool) -> Result<Sender, String>
    where
        I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    {
        if h2 {
            let (s, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                .timer(TokioTimer::new())
                .handshake::<_, ReqBody>(io)
                .await
                .map_err(|e| format!("upstream HTTP/2: {e}"))?;
            let _ = self.tasks.send(Box::pin(async move {
                let _ = conn.await;
            }));
            Ok(Sender::H2(s))
        } else {
            let (s, conn) = hyper::client::conn::http1::Builder::new()
                .handshake::<_, ReqBody>(io)
                .await
                .map_err(|e| format!("upstream HTTP/1.1: {e}"))?;
            let _ = self.tasks.send(Box::pin(async move {
                let _ = conn.with_upgrades().await;
            }));
            Ok(Sender::H1(s))
        }
    }
}

/// `Upgrade` names `websocket` (any case, among other protocols).
fn is_websocket(h: &hyper::HeaderMap) -> bool {
    h.get_all(header::UPGRADE)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .flat_map(|v| v.split(',').map(str::to_string).collect::<Vec<_>>())
        .any(|p| {
            p.trim()
                .split('/')
                .next()
                .is_some_and(|n| n.eq_ignore_ascii_case("websocket"))
        })
}

/// Drop hop-by-hop headers, but keep `Connection` and `Upgrade` on a
/// request asking to upgrade: the upstream must see them.
fn strip_hop_by_hop_but_upgrade(headers: &mut hyper::HeaderMap, upgrade: bool) {
    let kept = if upgrade {
        (
            headers.get(header::CONNECTION).cloned(),
            headers.get(header::UPGRADE).cloned(),
        )
    } else {
        (None, None)
    };
    strip_hop_by_hop(headers);
    if let (Some(c), Some(u)) = kept {
        headers.insert(header::CONNECTION, c);
        headers.insert(header::UPGRADE, u);
    }
}
