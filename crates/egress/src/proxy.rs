//! The proxy door: HTTP/1.1 CONNECT and absolute-form requests, checked against the allowlist
//! before any lookup, resolved and vetted by the broker, forwarded with the request line in
//! origin form and hop-by-hop headers dropped.

use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::header::{self, HeaderValue};
use hyper::http::uri::Authority;
use hyper::{Method, Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::task::JoinSet;

use crate::engine::{Engine, OpenError};
use crate::event::{Decision, Door, clean, refusal, started};
use crate::http::{ReqBody, RespBody as Body, empty, plain_body, strip_hop_by_hop, text};
use crate::intercept::{self, Dest, ScanBody};
use crate::interception::Interception;
use crate::io::{Meter, Metered, tunnel_upgraded};
use crate::name::{Host, normalize_host};

type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Serve one client connection on the proxy door. Holds `permit` (a connection slot) until the
/// connection and everything it opened are closed.
pub(crate) async fn serve_conn<S>(engine: Arc<Engine>, stream: S, permit: OwnedSemaphorePermit)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let _permit = permit;
    let idle = engine.policy.idle_timeout;
    let client_meter = Meter::new();
    let io = TokioIo::new(Metered::new(stream, client_meter.clone()));
    let (task_tx, mut task_rx) = mpsc::unbounded_channel::<Task>();
    let svc_engine = engine.clone();
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let engine = svc_engine.clone();
        let tasks = task_tx.clone();
        async move { Ok::<_, Infallible>(handle(engine, req, tasks).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(idle)
        .serve_connection(io, service)
        .with_upgrades();
    tokio::pin!(conn);
    let mut tasks: JoinSet<()> = JoinSet::new();
    loop {
        tokio::select! {
            _ = &mut conn => break,
            Some(t) = task_rx.recv() => { tasks.spawn(t); }
            Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
            () = client_meter.idle(idle), if tasks.is_empty() => break,
        }
    }
    while let Ok(t) = task_rx.try_recv() {
        tasks.spawn(t);
    }
    while tasks.join_next().await.is_some() {}
}

/// Host and port of a request target, checked: `Err(response)` when refused (event emitted).
struct Target {
    host: Host,
    port: u16,
    /// What to show in messages and events.
    label: String,
    allowed_why: String,
}

fn resolve_target(
    engine: &Engine,
    auth: &Authority,
    default_port: Option<u16>,
    t0: &(Instant, String),
) -> Result<Target, Box<Response<Body>>> {
    let raw_host = auth.host();
    let port = auth.port_u16().or(default_port);
    let refuse = |label: &str, port: u16, why: String| {
        let msg = refusal(label, port, &why);
        engine.emit(
            Door::Proxy,
            &clean(label),
            port,
            None,
            Decision::Refused,
            msg.clone(),
            (0, 0),
            t0.clone(),
        );
        Box::new(text(StatusCode::FORBIDDEN, &msg))
    };
    let Some(port) = port else {
        return Err(refuse(
            raw_host,
            0,
            "CONNECT needs an explicit port (host:port)".into(),
        ));
    };
    if auth.as_str().contains('@') {
        return Err(refuse(
            raw_host,
            port,
            "userinfo (`user@`) is not allowed in a proxy request".into(),
        ));
    }
    let host = match normalize_host(raw_host) {
        Ok(h) => h,
        Err(e) => return Err(refuse(raw_host, port, format!("invalid host: {e}"))),
    };
    let label = match &host {
        Host::Name(n) => n.clone(),
        Host::Ip(_) => clean(raw_host),
    };
    match engine.check(&host, raw_host, port) {
        Ok(allowed_why) => Ok(Target {
            host,
            port,
            label,
            allowed_why,
        }),
        Err(why) => Err(refuse(&label, port, why)),
    }
}

/// Open the upstream for a checked target; `Err(response)` on refusal or failure (event
/// emitted).
async fn open_target(
    engine: &Engine,
    t: &Target,
    t0: &(Instant, String),
) -> Result<(TcpStream, IpAddr), Box<Response<Body>>> {
    match engine.open(&t.host, t.port).await {
        Ok(ok) => Ok(ok),
        Err(OpenError::Refused { why, address }) => {
            let msg = refusal(&t.label, t.port, &why);
            engine.emit(
                Door::Proxy,
                &t.label,
                t.port,
                Some(address),
                Decision::Refused,
                msg.clone(),
                (0, 0),
                t0.clone(),
            );
            Err(Box::new(text(StatusCode::FORBIDDEN, &msg)))
        }
        Err(OpenError::Failed { why, address }) => {
            let msg = format!("egress to {}:{} failed: {why}", t.label, t.port);
            engine.emit(
                Door::Proxy,
                &t.label,
                t.port,
                address,
                Decision::Allowed,
                msg.clone(),
                (0, 0),
                t0.clone(),
            );
            Err(Box::new(text(StatusCode::BAD_GATEWAY, &msg)))
        }
    }
}

async fn handle(
    engine: Arc<Engine>,
    req: Request<Incoming>,
    tasks: mpsc::UnboundedSender<Task>,
) -> Response<Body> {
    let t0 = started();
    if req.method() == Method::CONNECT {
        return connect(engine, req, tasks, t0).await;
    }
    let uri = req.uri().clone();
    match (uri.scheme_str(), uri.authority()) {
        (Some("http"), Some(auth)) => forward(engine, req, auth.clone(), tasks, t0).await,
        (Some(scheme), Some(auth)) => {
            let why = format!(
                "scheme `{}` is not forwarded by the proxy door; use CONNECT",
                clean(scheme)
            );
            let port = auth.port_u16().unwrap_or(0);
            let msg = refusal(auth.host(), port, &why);
            engine.emit(
                Door::Proxy,
                &clean(auth.host()),
                port,
                None,
                Decision::Refused,
                msg.clone(),
                (0, 0),
                t0,
            );
            text(StatusCode::BAD_REQUEST, &msg)
        }
        _ => {
            let msg = format!(
                "egress refused: `{} {}` is not a proxy request (use CONNECT host:port or an absolute http:// URI)",
                req.method(),
                clean(&uri.to_string())
            );
            engine.emit(
                Door::Proxy,
                "",
                0,
                None,
                Decision::Refused,
                msg.clone(),
                (0, 0),
                t0,
            );
            text(StatusCode::BAD_REQUEST, &msg)
        }
    }
}

async fn connect(
    engine: Arc<Engine>,
    req: Request<Incoming>,
    tasks: mpsc::UnboundedSender<Task>,
    t0: (Instant, String),
) -> Response<Body> {
    let Some(auth) = req.uri().authority().cloned() else {
        let msg = "egress refused: CONNECT needs host:port".to_string();
        engine.emit(
            Door::Proxy,
            "",
            0,
            None,
            Decision::Refused,
            msg.clone(),
            (0, 0),
            t0,
        );
        return text(StatusCode::BAD_REQUEST, &msg);
    };
    let t = match resolve_target(&engine, &auth, None, &t0) {
        Ok(t) => t,
        Err(resp) => return *resp,
    };
    let (upstream, addr) = match open_target(&engine, &t, &t0).await {
        Ok(ok) => ok,
        Err(resp) => return *resp,
    };
    let idle = engine.policy.idle_timeout;
    if let Some(icpt) = engine.interception(&t.host, t.port) {
        let dest = Dest {
            host: t.host.clone(),
            port: t.port,
            label: t.label.clone(),
            allowed_why: t.allowed_why.clone(),
            addr,
            door: Door::Proxy,
        };
        let e = engine.clone();
        let tunnel = async move {
            match hyper::upgrade::on(req).await {
                Ok(upgraded) => {
                    intercept::serve(e, icpt, dest, TokioIo::new(upgraded), upstream, t0).await
                }
                Err(err) => {
                    let msg = format!(
                        "{}; the client connection was not handed over: {err}",
                        dest.allowed_why
                    );
                    e.emit(
                        Door::Proxy,
                        &dest.label,
                        dest.port,
                        Some(addr),
                        Decision::Allowed,
                        msg,
                        (0, 0),
                        t0,
                    );
                }
            }
        };
        if tasks.send(Box::pin(tunnel)).is_err() {
            return text(
                StatusCode::SERVICE_UNAVAILABLE,
                "egress door is shutting down",
            );
        }
        let mut r = Response::new(empty());
        *r.status_mut() = StatusCode::OK;
        return r;
    }
    let tunnel = async move {
        let meter = Meter::new();
        let note = match hyper::upgrade::on(req).await {
            Ok(upgraded) => tunnel_upgraded(upgraded, upstream, meter.clone(), idle).await,
            Err(e) => Some(format!("the client connection was not handed over: {e}")),
        };
        let reason = match note {
            Some(n) => format!("{}; {n}", t.allowed_why),
            None => t.allowed_why.clone(),
        };
        engine.emit(
            Door::Proxy,
            &t.label,
            t.port,
            Some(addr),
            Decision::Allowed,
            reason,
            (meter.written_bytes(), meter.read_bytes()),
            t0,
        );
    };
    if tasks.send(Box::pin(tunnel)).is_err() {
        return text(
            StatusCode::SERVICE_UNAVAILABLE,
            "egress door is shutting down",
        );
    }
    let mut r = Response::new(empty());
    *r.status_mut() = StatusCode::OK;
    r
}

/// Forward one absolute-form `http://` request: checked, opened, prepared, sent, and the
/// upstream's response relayed.
async fn forward(
    engine: Arc<Engine>,
    req: Request<Incoming>,
    auth: Authority,
    tasks: mpsc::UnboundedSender<Task>,
    t0: (Instant, String),
) -> Response<Body> {
    let t = match resolve_target(&engine, &auth, Some(80), &t0) {
        Ok(t) => t,
        Err(resp) => return *resp,
    };
    let (upstream, addr) = match open_target(&engine, &t, &t0).await {
        Ok(ok) => ok,
        Err(resp) => return *resp,
    };
    let dest = t.into_dest(addr);
    let icpt = engine.interception(&dest.host, dest.port);
    let (upstream_req, inspected) =
        match prepare(&engine, req, &auth, &dest, icpt.as_deref(), &t0).await {
            Ok(ok) => ok,
            Err(resp) => return resp,
        };
    let result =
        match send_upstream(&engine, upstream, &dest, upstream_req, &tasks, t0.clone()).await {
            Ok(result) => result,
            Err(resp) => return resp,
        };
    if let Some(i) = &icpt {
        if let Some(resp) = inspected.verdict(&engine, i, &dest, result.is_ok(), &t0) {
            return resp;
        }
        // Tokens coming back are replaced; an encoded response of a bound
        // endpoint is refused.
        return match result {
            Ok(resp) => match intercept::guard(&engine, i, &dest, resp, &t0) {
                Ok(resp) => {
                    let (mut parts, body) = resp.into_parts();
                    strip_hop_by_hop(&mut parts.headers);
                    Response::from_parts(parts, body)
                }
                Err(r) => r.respond(&engine, &dest, &t0),
            },
            Err(e) => relay(Err(e), &dest),
        };
    }
    relay(result, &dest)
}

impl Target {
    /// The destination as the proxy door reports it, once opened at `addr`.
    fn into_dest(self, addr: IpAddr) -> Dest {
        Dest {
            host: self.host,
            port: self.port,
            label: self.label,
            allowed_why: self.allowed_why,
            addr,
            door: Door::Proxy,
        }
    }
}

/// What interception learned of a request on its way upstream.
struct Inspected {
    /// Where a placeholder found in the streamed rest of the body is recorded (interception
    /// only).
    hit: Option<Arc<Mutex<Option<String>>>>,
    /// The secrets whose tokens were substituted.
    injected: Vec<String>,
    /// The request's path, as events show it.
    path: String,
}

/// The request in origin form over HTTP/1.1, interception's substitutions applied, hop-by-hop
/// headers dropped and its body scanned; `Err(response)` on refusal (event emitted).
async fn prepare(
    engine: &Engine,
    req: Request<Incoming>,
    auth: &Authority,
    dest: &Dest,
    icpt: Option<&Interception>,
    t0: &(Instant, String),
) -> Result<(Request<ReqBody>, Inspected), Response<Body>> {
    let (mut parts, body) = req.into_parts();
    let origin = parts
        .uri
        .path_and_query()
        .map(|pq| pq.as_str())
        .unwrap_or("/");
    parts.uri = match origin.parse::<Uri>() {
        Ok(u) => u,
        Err(_) => Uri::from_static("/"),
    };
    parts.version = Version::HTTP_11;
    let mut injected = Vec::new();
    if let Some(i) = icpt {
        match intercept::apply(i, &dest.host, dest.port, &mut parts) {
            Ok(v) => injected = v,
            Err(r) => return Err(r.respond(engine, dest, t0)),
        }
    }
    strip_hop_by_hop(&mut parts.headers);
    if let Some(i) = icpt {
        intercept::ask_identity(i, &dest.host, dest.port, &mut parts.headers);
    }
    if let Ok(v) = HeaderValue::from_str(auth.as_str()) {
        parts.headers.insert(header::HOST, v);
    }
    let (body, hit) = match icpt {
        Some(i) => match ScanBody::read(body, i.needles().clone()).await {
            Ok((b, h)) => (b, Some(h)),
            Err(s) => {
                return Err(intercept::exfil(&s, "the request body", i).respond(engine, dest, t0));
            }
        },
        None => (plain_body(body), None),
    };
    let path = clean(parts.uri.path());
    let inspected = Inspected {
        hit,
        injected,
        path,
    };
    Ok((Request::from_parts(parts, body), inspected))
}

/// Send the request on a new HTTP/1.1 connection over `upstream`, driven (and reported when
/// done) by tasks of the client connection; `Err(response)` when the handshake fails (event
/// emitted) or the door is shutting down.
async fn send_upstream(
    engine: &Arc<Engine>,
    upstream: TcpStream,
    dest: &Dest,
    upstream_req: Request<ReqBody>,
    tasks: &mpsc::UnboundedSender<Task>,
    t0: (Instant, String),
) -> Result<hyper::Result<Response<Incoming>>, Response<Body>> {
    let addr = dest.addr;
    let meter = Meter::new();
    let io = TokioIo::new(Metered::new(upstream, meter.clone()));
    let idle = engine.policy.idle_timeout;
    let (mut sender, conn) = match hyper::client::conn::http1::Builder::new()
        .handshake::<_, ReqBody>(io)
        .await
    {
        Ok(ok) => ok,
        Err(e) => {
            let msg = format!("egress to {}:{} failed: {e}", dest.label, dest.port);
            engine.emit(
                Door::Proxy,
                &dest.label,
                dest.port,
                Some(addr),
                Decision::Allowed,
                msg.clone(),
                (0, 0),
                t0,
            );
            return Err(text(StatusCode::BAD_GATEWAY, &msg));
        }
    };
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<Option<String>>();
    let driver_meter = meter.clone();
    let driver = async move {
        let note = tokio::select! {
            r = conn => r.err().map(|e| format!("upstream connection error: {e}")),
            () = driver_meter.idle(idle) => Some(format!("closed after {} s idle", idle.as_secs())),
        };
        let _ = done_tx.send(note);
    };
    if tasks.send(Box::pin(driver)).is_err() {
        return Err(text(
            StatusCode::SERVICE_UNAVAILABLE,
            "egress door is shutting down",
        ));
    }
    let result = sender.send_request(upstream_req).await;
    drop(sender);
    // Report when the upstream connection is done (response body delivered or failed).
    let report_engine = engine.clone();
    let label = dest.label.clone();
    let port = dest.port;
    let allowed_why = dest.allowed_why.clone();
    let report_meter = meter.clone();
    let report = async move {
        let note = done_rx.await.ok().flatten();
        let reason = match note {
            Some(n) => format!("{allowed_why}; {n}"),
            None => allowed_why,
        };
        report_engine.emit(
            Door::Proxy,
            &label,
            port,
            Some(addr),
            Decision::Allowed,
            reason,
            (report_meter.written_bytes(), report_meter.read_bytes()),
            t0,
        );
    };
    // If the door is shutting down the report is lost with the connection; nothing to do.
    let _ = tasks.send(Box::pin(report));
    Ok(result)
}

impl Inspected {
    /// After an intercepted request went: a placeholder in the streamed rest of its body
    /// refuses the response (`Some`); otherwise a substitution made is reported.
    fn verdict(
        self,
        engine: &Engine,
        icpt: &Interception,
        dest: &Dest,
        sent: bool,
        t0: &(Instant, String),
    ) -> Option<Response<Body>> {
        let hit = self.hit?;
        let found = hit.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(s) = found {
            return Some(intercept::exfil(&s, "the request body", icpt).respond(engine, dest, t0));
        }
        if !self.injected.is_empty() && sent {
            let reason = format!(
                "{}; substituted the token of {} on a request to {}:{}{}",
                dest.allowed_why,
                self.injected.join(", "),
                dest.label,
                dest.port,
                self.path
            );
            dest.event(engine, Decision::Allowed, reason, self.injected, None, t0);
        }
        None
    }
}

/// The upstream's response with hop-by-hop headers dropped, or a 502 when it failed.
fn relay(result: hyper::Result<Response<Incoming>>, dest: &Dest) -> Response<Body> {
    match result {
        Ok(resp) => {
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, body.boxed())
        }
        Err(e) => text(
            StatusCode::BAD_GATEWAY,
            &format!("egress to {}:{} failed: {e}", dest.label, dest.port),
        ),
    }
}
