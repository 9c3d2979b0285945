//! Interception: for a sandbox with secrets delivered by the proxy, the
//! doors read its HTTP (terminating TLS with the session CA), substitute a
//! token for its placeholder only where the secret is bound, and refuse the
//! placeholder anywhere else as an exfiltration attempt.
//!
//! One intercepted connection: the first bytes from the tool decide what it
//! speaks. A TLS ClientHello is answered with a leaf of the session CA for
//! the destination (the SNI, when given, must name it), and the door opens
//! its own verified TLS connection to the real upstream (ALPN `h2` offered
//! upstream only when the tool negotiated it); an HTTP request line is read
//! as plain HTTP/1.1; anything else (or an upstream that speaks first) is a
//! byte stream, tunnelled with the tool's bytes scanned. Each request's
//! authority must be the connection's destination; its target, headers and
//! body are scanned (see [`crate::scan`]); a WebSocket (or other HTTP/1.1)
//! upgrade is passed on and its tool-side bytes scanned too.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use base64::Engine as _;
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::{Body as _, Bytes, Frame, Incoming, SizeHint};
use hyper::header::{self, HeaderName, HeaderValue};
use hyper::{Request, Response, StatusCode, Uri, Version};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::task::JoinSet;

use crate::ca::{SessionCa, UpstreamTrust};
use crate::engine::{Engine, OpenError, clean, refusal};
use crate::event::{Decision, Door};
use crate::inject::{Injection, Injections, Placement};
use crate::io::{Meter, Metered};
use crate::name::{Host, normalize_host};
use crate::scan::{Needles, Scanner};

pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// Request bodies sent upstream by an intercepting door.
pub(crate) type ReqBody = BoxBody<Bytes, BoxError>;
/// Responses given to the tool.
pub(crate) type RespBody = BoxBody<Bytes, hyper::Error>;
type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// What the doors of one sandbox need to intercept: its injections, the
/// session CA whose certificate the sandbox trusts, and the roots the real
/// upstreams are verified against.
#[derive(Clone)]
pub struct Interception {
    injections: Injections,
    bound: Vec<Host>,
    ca: Arc<SessionCa>,
    trust: UpstreamTrust,
    needles: Arc<Needles>,
    /// Extra upstream CA certificates (PEM) per bound `(host, port)`.
    extra_ca: HashMap<(Host, u16), String>,
}

impl std::fmt::Debug for Interception {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interception")
            .field("injections", &self.injections)
            .field("trust", &self.trust)
            .finish_non_exhaustive()
    }
}

impl Interception {
    /// Interception for `injections`, terminating TLS with `ca` and
    /// verifying upstreams against `trust` (plus each binding's
    /// `upstream_ca`, read now). Fails on a binding whose host is not a
    /// valid host name or whose CA file cannot be read.
    pub fn new(
        injections: Injections,
        ca: Arc<SessionCa>,
        trust: UpstreamTrust,
    ) -> Result<Interception, String> {
        let mut bound = Vec::new();
        let mut extra_ca: HashMap<(Host, u16), String> = HashMap::new();
        for inj in injections.iter() {
            let b = &inj.binding;
            let host = normalize_host(&b.host).map_err(|e| {
                format!(
                    "secret {}: bound host `{}`: {e}",
                    inj.secret,
                    clean(&b.host)
                )
            })?;
            if let Some(path) = &b.upstream_ca {
                let pem = std::fs::read_to_string(path).map_err(|e| {
                    format!(
                        "secret {}: upstream CA file {}: {e}",
                        inj.secret,
                        path.display()
                    )
                })?;
                crate::ca::parse_pem_certs(&pem).map_err(|e| {
                    format!(
                        "secret {}: upstream CA file {}: {e}",
                        inj.secret,
                        path.display()
                    )
                })?;
                extra_ca
                    .entry((host.clone(), b.port))
                    .or_default()
                    .push_str(&pem);
            }
            bound.push(host);
        }
        let needles = Arc::new(Needles::new(
            injections
                .iter()
                .map(|i| (i.secret.as_str(), i.placeholder.as_str())),
        ));
        Ok(Interception {
            injections,
            bound,
            ca,
            trust,
            needles,
            extra_ca,
        })
    }

    /// The session CA.
    pub fn ca(&self) -> &Arc<SessionCa> {
        &self.ca
    }

    pub(crate) fn needles(&self) -> &Arc<Needles> {
        &self.needles
    }
}

/// A destination the check allowed and the door connected to.
#[derive(Clone)]
pub(crate) struct Dest {
    pub(crate) host: Host,
    pub(crate) port: u16,
    pub(crate) label: String,
    pub(crate) allowed_why: String,
    pub(crate) addr: IpAddr,
    pub(crate) door: Door,
}

impl Dest {
    pub(crate) fn event(
        &self,
        engine: &Engine,
        decision: Decision,
        reason: String,
        injected: Vec<String>,
        exfiltration: Option<String>,
        t0: &(Instant, String),
    ) {
        let mut e = engine.event(
            self.door,
            &self.label,
            self.port,
            Some(self.addr),
            decision,
            reason,
            (0, 0),
            t0.clone(),
        );
        e.injected = injected;
        e.exfiltration = exfiltration;
        engine.events.emit(e);
    }
}

pub(crate) fn text(status: StatusCode, msg: &str) -> Response<RespBody> {
    let mut r = Response::new(
        Full::new(Bytes::from(format!("{msg}\n")))
            .map_err(|never| match never {})
            .boxed(),
    );
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r
}

/// Why a request is not forwarded.
pub(crate) enum Refusal {
    /// A placeholder where its secret is not bound.
    Exfiltration { secret: String, why: String },
    /// Anything else (no token, a misdirected request).
    Other { status: StatusCode, why: String },
}

impl Refusal {
    /// Report it and answer the tool.
    pub(crate) fn respond(
        self,
        engine: &Engine,
        dest: &Dest,
        t0: &(Instant, String),
    ) -> Response<RespBody> {
        let (status, why, exfil) = match self {
            Refusal::Exfiltration { secret, why } => (StatusCode::FORBIDDEN, why, Some(secret)),
            Refusal::Other { status, why } => (status, why, None),
        };
        let msg = refusal(&dest.label, dest.port, &why);
        dest.event(
            engine,
            Decision::Refused,
            msg.clone(),
            Vec::new(),
            exfil,
            t0,
        );
        text(status, &msg)
    }
}

pub(crate) fn exfil(inj_secret: &str, place: &str, icpt: &Interception) -> Refusal {
    let bound = icpt
        .injections
        .iter()
        .find(|i| i.secret == inj_secret)
        .map(binding_text)
        .unwrap_or_default();
    Refusal::Exfiltration {
        secret: inj_secret.to_string(),
        why: format!(
            "the placeholder of secret {inj_secret} is in {place}, but {inj_secret} is bound to {bound}: refused as an exfiltration attempt"
        ),
    }
}

fn binding_text(i: &Injection) -> String {
    let b = &i.binding;
    let place = match &b.placement {
        Placement::Header { name, .. } => format!("header {name}"),
        Placement::Basic { username } => format!("Basic auth as {username}"),
        Placement::Query { param } => format!("query parameter {param}"),
    };
    format!(
        "{}:{}{} ({place})",
        b.host,
        b.port,
        b.path_prefix.as_deref().unwrap_or("")
    )
}

/// Does `path` (a request path, no query) fall under `prefix`? A path with
/// dot segments or an encoded dot or slash never does.
fn path_under(path: &str, prefix: Option<&str>) -> bool {
    let Some(prefix) = prefix else {
        return true;
    };
    let lower = path.to_ascii_lowercase();
    if lower.contains("%2e")
        || lower.contains("%2f")
        || lower.contains("%5c")
        || path.contains('\\')
    {
        return false;
    }
    if path.split('/').any(|s| s == "." || s == "..") {
        return false;
    }
    match path.strip_prefix(prefix) {
        Some(rest) => prefix.ends_with('/') || rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

fn percent_decode(s: &str) -> Vec<u8> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%'
            && i + 2 < b.len()
            && let (Some(h), Some(l)) = (
                (b[i + 1] as char).to_digit(16),
                (b[i + 2] as char).to_digit(16),
            )
        {
            out.push((h * 16 + l) as u8);
            i += 3;
            continue;
        }
        if b[i] == b'+' {
            out.push(b' ');
        } else {
            out.push(b[i]);
        }
        i += 1;
    }
    out
}

fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Substitute the tokens of the secrets bound to this request (`dest`,
/// `path`) in their placement, then refuse the request if any placeholder
/// is left in its target or headers. Returns the secrets substituted.
pub(crate) fn apply(
    icpt: &Interception,
    dest_host: &Host,
    dest_port: u16,
    parts: &mut hyper::http::request::Parts,
) -> Result<Vec<String>, Refusal> {
    let mut injected = Vec::new();
    let path = parts.uri.path().to_string();
    for (inj, host) in icpt.injections.iter().zip(icpt.bound.iter()) {
        let b = &inj.binding;
        if host != dest_host || b.port != dest_port || !path_under(&path, b.path_prefix.as_deref())
        {
            continue;
        }
        let token = || {
            inj.source.current().map_err(|e| Refusal::Other {
                status: StatusCode::FORBIDDEN,
                why: format!(
                    "no token for secret {} ({}); the request is not sent",
                    inj.secret,
                    clean(&e)
                ),
            })
        };
        match &b.placement {
            Placement::Header { name, template } => {
                let Ok(hn) = HeaderName::from_bytes(name.as_bytes()) else {
                    continue;
                };
                let want = template.replace("{token}", &inj.placeholder);
                let values: Vec<HeaderValue> = parts.headers.get_all(&hn).iter().cloned().collect();
                if !values.iter().any(|v| v.as_bytes() == want.as_bytes()) {
                    continue;
                }
                let tok = token()?;
                parts.headers.remove(&hn);
                for v in values {
                    if v.as_bytes() == want.as_bytes() {
                        let real = zeroize::Zeroizing::new(template.replace("{token}", &tok));
                        let mut hv = HeaderValue::from_str(&real).map_err(|_| Refusal::Other {
                            status: StatusCode::BAD_GATEWAY,
                            why: format!(
                                "the token of secret {} is not a valid header value",
                                inj.secret
                            ),
                        })?;
                        hv.set_sensitive(true);
                        parts.headers.append(hn.clone(), hv);
                    } else {
                        parts.headers.append(hn.clone(), v);
                    }
                }
                injected.push(inj.secret.clone());
            }
            Placement::Basic { username } => {
                let Some(v) = parts.headers.get(header::AUTHORIZATION) else {
                    continue;
                };
                let Some(enc) = v.to_str().ok().and_then(|s| {
                    s.strip_prefix("Basic ")
                        .or_else(|| s.strip_prefix("basic "))
                }) else {
                    continue;
                };
                let Ok(dec) = base64::engine::general_purpose::STANDARD.decode(enc.trim()) else {
                    continue;
                };
                let want = format!("{username}:{}", inj.placeholder);
                if dec != want.as_bytes() {
                    continue;
                }
                let tok = token()?;
                let real = zeroize::Zeroizing::new(format!("{username}:{}", tok.as_str()));
                let b64 = zeroize::Zeroizing::new(format!(
                    "Basic {}",
                    base64::engine::general_purpose::STANDARD.encode(real.as_bytes())
                ));
                let mut hv = HeaderValue::from_str(&b64).map_err(|_| Refusal::Other {
                    status: StatusCode::BAD_GATEWAY,
                    why: format!(
                        "the token of secret {} is not a valid header value",
                        inj.secret
                    ),
                })?;
                hv.set_sensitive(true);
                parts.headers.insert(header::AUTHORIZATION, hv);
                injected.push(inj.secret.clone());
            }
            Placement::Query { param } => {
                let Some(q) = parts.uri.query() else {
                    continue;
                };
                let mut hit = false;
                let pairs: Vec<(String, Option<String>)> = q
                    .split('&')
                    .map(|kv| match kv.split_once('=') {
                        Some((k, v)) => (k.to_string(), Some(v.to_string())),
                        None => (kv.to_string(), None),
                    })
                    .collect();
                if !pairs.iter().any(|(k, v)| {
                    percent_decode(k) == param.as_bytes()
                        && v.as_deref()
                            .is_some_and(|v| percent_decode(v) == inj.placeholder.as_bytes())
                }) {
                    continue;
                }
                let tok = token()?;
                let enc = zeroize::Zeroizing::new(percent_encode(&tok));
                let mut nq = zeroize::Zeroizing::new(String::with_capacity(q.len() + enc.len()));
                for (i, (k, v)) in pairs.iter().enumerate() {
                    if i > 0 {
                        nq.push('&');
                    }
                    nq.push_str(k);
                    if let Some(v) = v {
                        nq.push('=');
                        if percent_decode(k) == param.as_bytes()
                            && percent_decode(v) == inj.placeholder.as_bytes()
                        {
                            nq.push_str(&enc);
                            hit = true;
                        } else {
                            nq.push_str(v);
                        }
                    }
                }
                let pq = zeroize::Zeroizing::new(format!("{}?{}", parts.uri.path(), nq.as_str()));
                let mut up = parts.uri.clone().into_parts();
                up.path_and_query = Some(pq.parse().map_err(|_| Refusal::Other {
                    status: StatusCode::BAD_GATEWAY,
                    why: format!(
                        "the token of secret {} does not fit in a request target",
                        inj.secret
                    ),
                })?);
                parts.uri = Uri::from_parts(up).map_err(|_| Refusal::Other {
                    status: StatusCode::BAD_GATEWAY,
                    why: format!(
                        "the token of secret {} does not fit in a request target",
                        inj.secret
                    ),
                })?;
                if hit {
                    injected.push(inj.secret.clone());
                }
            }
        }
    }
    // Whatever placeholder is left is somewhere it is not bound.
    let needles = icpt.needles();
    if let Some(s) = needles.find(parts.uri.to_string().as_bytes()) {
        return Err(exfil(&s, "the request target", icpt));
    }
    for (k, v) in parts.headers.iter() {
        if let Some(s) = needles
            .find(k.as_str().as_bytes())
            .or_else(|| needles.find(v.as_bytes()))
        {
            return Err(exfil(&s, &format!("header {}", k.as_str()), icpt));
        }
    }
    Ok(injected)
}

/// Most of a request body read and scanned before the request is sent:
/// a placeholder within it refuses the request before anything reaches the
/// upstream. The rest of a longer body is scanned as it streams, and a
/// placeholder there fails the body (the upstream never gets the rest).
pub(crate) const PRESCAN_BYTES: usize = 1 << 20;

/// A request body scanned on its way upstream: first what was read ahead
/// (already scanned), then the rest, scanned frame by frame; a placeholder
/// fails the body and is recorded in `hit`.
pub(crate) struct ScanBody {
    ahead: std::collections::VecDeque<Frame<Bytes>>,
    inner: Option<Incoming>,
    scanner: Scanner,
    hit: Arc<Mutex<Option<String>>>,
}

/// A scanned body, or the secret whose placeholder it holds.
pub(crate) type Scanned = Result<(ReqBody, Arc<Mutex<Option<String>>>), String>;

impl ScanBody {
    /// Read up to [`PRESCAN_BYTES`] of `inner`, scanning; then the body to
    /// send (the rest scanned as it streams).
    pub(crate) async fn read(mut inner: Incoming, needles: Arc<Needles>) -> Scanned {
        let mut scanner = Scanner::new(needles);
        let mut ahead = std::collections::VecDeque::new();
        let mut total = 0usize;
        let mut done = inner.is_end_stream();
        while !done && total < PRESCAN_BYTES {
            match inner.frame().await {
                Some(Ok(frame)) => {
                    if let Some(d) = frame.data_ref() {
                        total += d.len();
                        if let Some(s) = scanner.feed(d) {
                            return Err(s);
                        }
                    }
                    ahead.push_back(frame);
                }
                // The tool's body failed: forward what there is; the
                // upstream sees a short body.
                Some(Err(_)) | None => done = true,
            }
        }
        if done && let Some(s) = scanner.finish() {
            return Err(s);
        }
        let hit = Arc::new(Mutex::new(None));
        let b = ScanBody {
            ahead,
            inner: if done { None } else { Some(inner) },
            scanner,
            hit: hit.clone(),
        };
        Ok((b.boxed(), hit))
    }

    fn found(&self, s: String) -> BoxError {
        let msg = format!("placeholder of secret {s} in the request body");
        *self.hit.lock().unwrap_or_else(|e| e.into_inner()) = Some(s);
        msg.into()
    }
}

impl hyper::body::Body for ScanBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if let Some(f) = self.ahead.pop_front() {
            return Poll::Ready(Some(Ok(f)));
        }
        let Some(inner) = self.inner.as_mut() else {
            return Poll::Ready(None);
        };
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref()
                    && let Some(s) = self.scanner.feed(d)
                {
                    return Poll::Ready(Some(Err(self.found(s))));
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(Box::new(e)))),
            Poll::Ready(None) => {
                self.inner = None;
                match self.scanner.finish() {
                    Some(s) => Poll::Ready(Some(Err(self.found(s)))),
                    None => Poll::Ready(None),
                }
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ahead.is_empty() && self.inner.as_ref().is_none_or(|i| i.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let ahead: u64 = self
            .ahead
            .iter()
            .filter_map(|f| f.data_ref().map(|d| d.len() as u64))
            .sum();
        match &self.inner {
            None => SizeHint::with_exact(ahead),
            Some(i) => {
                let h = i.size_hint();
                let mut out = SizeHint::new();
                out.set_lower(h.lower() + ahead);
                if let Some(u) = h.upper() {
                    out.set_upper(u + ahead);
                }
                out
            }
        }
    }
}

/// A body as sent upstream: scanned when interception is on.
pub(crate) fn plain_body(b: Incoming) -> ReqBody {
    b.map_err(|e| Box::new(e) as BoxError).boxed()
}

/// Bytes already read from a stream, then the stream.
pub(crate) struct Prefixed<S> {
    pre: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    pub(crate) fn new(pre: Vec<u8>, inner: S) -> Self {
        Prefixed { pre, pos: 0, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pos < self.pre.len() {
            let n = (self.pre.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.pre[start..start + n]);
            self.pos += n;
            if self.pos == self.pre.len() {
                self.pre = Vec::new();
                self.pos = 0;
            }
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Tunnel `client` and `upstream` with the tool's bytes scanned: a
/// placeholder ends the tunnel before it is forwarded. Returns the secret
/// found, or `None` when the tunnel ended otherwise.
pub(crate) async fn scanned_splice<A, B>(
    client: A,
    upstream: B,
    needles: Arc<Needles>,
    meter: Arc<Meter>,
    idle: std::time::Duration,
) -> Option<String>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut ur, mut uw) = tokio::io::split(upstream);
    let mut scanner = Scanner::new(needles);
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match cr.read(&mut buf).await {
                Ok(0) | Err(_) => {
                    let _ = uw.shutdown().await;
                    return None;
                }
                Ok(n) => n,
            };
            if let Some(s) = scanner.feed(&buf[..n]) {
                return Some(s);
            }
            if uw.write_all(&buf[..n]).await.is_err() {
                return None;
            }
        }
    };
    let down = async {
        let _ = tokio::io::copy(&mut ur, &mut cw).await;
        let _ = cw.shutdown().await;
    };
    tokio::pin!(up);
    tokio::pin!(down);
    let (mut up_done, mut down_done) = (false, false);
    loop {
        tokio::select! {
            r = &mut up, if !up_done => {
                up_done = true;
                if r.is_some() {
                    return r;
                }
            }
            () = &mut down, if !down_done => { down_done = true; }
            () = meter.idle(idle) => return None,
        }
        if up_done && down_done {
            return None;
        }
    }
}

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

/// Serve one allowed connection of a sandbox with interception on (see the
/// module docs). `upstream` is the vetted connection to `dest`.
pub(crate) async fn serve<C>(
    engine: Arc<Engine>,
    icpt: Arc<Interception>,
    dest: Dest,
    mut client: C,
    upstream: TcpStream,
    t0: (Instant, String),
) where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let idle = engine.policy.idle_timeout;
    let meter = Meter::new();
    let mut first = vec![0u8; 16 * 1024];
    let n = tokio::select! {
        r = client.read(&mut first) => r.unwrap_or(0),
        _ = upstream.readable() => usize::MAX,
        () = tokio::time::sleep(idle) => 0,
    };
    if n == 0 {
        close_event(&engine, &dest, &meter, None, t0);
        return;
    }
    let (tls, http) = if n == usize::MAX {
        (false, false)
    } else {
        first.truncate(n);
        (first[0] == 0x16, first[0].is_ascii_uppercase())
    };
    if n == usize::MAX {
        first.clear();
    }
    if !tls && !http {
        // Neither TLS nor HTTP: a byte stream, scanned.
        let up = Metered::new(upstream, meter.clone());
        let hit = scanned_splice(
            Prefixed::new(first, client),
            up,
            icpt.needles().clone(),
            meter.clone(),
            idle,
        )
        .await;
        match hit {
            Some(s) => {
                let r = exfil(&s, "the tunnelled bytes", &icpt);
                let _ = r.respond(&engine, &dest, &t0);
            }
            None => close_event(&engine, &dest, &meter, None, t0),
        }
        return;
    }
    let client = Prefixed::new(first, client);
    if tls {
        let leaf_name = match &dest.host {
            Host::Name(n) => n.clone(),
            Host::Ip(ip) => ip.to_string(),
        };
        let cfg = match icpt.ca.server_config(&leaf_name, true) {
            Ok(c) => c,
            Err(e) => {
                close_event(
                    &engine,
                    &dest,
                    &meter,
                    Some(format!("TLS not intercepted: {e}")),
                    t0,
                );
                return;
            }
        };
        let accepted = tokio::time::timeout(
            engine.policy.connect_timeout,
            tokio_rustls::TlsAcceptor::from(cfg).accept(client),
        )
        .await;
        let stream = match accepted {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                close_event(
                    &engine,
                    &dest,
                    &meter,
                    Some(format!(
                        "the tool's TLS handshake with the door failed (does it trust the session CA?): {e}"
                    )),
                    t0,
                );
                return;
            }
            Err(_) => {
                close_event(
                    &engine,
                    &dest,
                    &meter,
                    Some("the tool's TLS handshake with the door timed out".into()),
                    t0,
                );
                return;
            }
        };
        let (sni, h2) = {
            let (_, c) = stream.get_ref();
            (
                c.server_name().map(str::to_string),
                c.alpn_protocol() == Some(b"h2"),
            )
        };
        if let Some(sni) = &sni {
            let same = normalize_host(sni).is_ok_and(|h| h == dest.host);
            if !same {
                let why = format!(
                    "the TLS server name {} is not the destination of this connection",
                    clean(sni)
                );
                let msg = refusal(&dest.label, dest.port, &why);
                dest.event(&engine, Decision::Refused, msg, Vec::new(), None, &t0);
                return;
            }
        }
        run_http(engine, icpt, dest, stream, upstream, true, h2, meter, t0).await;
    } else {
        run_http(
            engine, icpt, dest, client, upstream, false, false, meter, t0,
        )
        .await;
    }
}

fn close_event(
    engine: &Engine,
    dest: &Dest,
    meter: &Meter,
    note: Option<String>,
    t0: (Instant, String),
) {
    let reason = match note {
        Some(n) => format!("{}; {n}", dest.allowed_why),
        None => dest.allowed_why.clone(),
    };
    let e = engine.event(
        dest.door,
        &dest.label,
        dest.port,
        Some(dest.addr),
        Decision::Allowed,
        reason,
        (meter.written_bytes(), meter.read_bytes()),
        t0,
    );
    engine.events.emit(e);
}

#[allow(clippy::too_many_arguments)]
async fn run_http<S>(
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
        let t0 = crate::engine::started();
        let engine = &self.engine;
        let authority = match self.check_authority(&req) {
            Ok(a) => a,
            Err(r) => return r.respond(engine, &self.dest, &t0),
        };
        let upgrade = !self.h2 && req.headers().contains_key(header::UPGRADE);
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
        let upgrade_headers = if upgrade {
            (
                parts.headers.get(header::CONNECTION).cloned(),
                parts.headers.get(header::UPGRADE).cloned(),
            )
        } else {
            (None, None)
        };
        crate::proxy::strip_hop_by_hop(&mut parts.headers);
        if let (Some(c), Some(u)) = upgrade_headers {
            parts.headers.insert(header::CONNECTION, c);
            parts.headers.insert(header::UPGRADE, u);
        }
        let (body, hit) = match ScanBody::read(body, self.icpt.needles().clone()).await {
            Ok(ok) => ok,
            Err(s) => {
                return exfil(&s, "the request body", &self.icpt).respond(engine, &self.dest, &t0);
            }
        };
        let path = clean(parts.uri.path());
        let mut sender = match self.sender().await {
            Ok(s) => s,
            Err(why) => {
                let msg = format!(
                    "egress to {}:{} failed: {why}",
                    self.dest.label, self.dest.port
                );
                self.dest.event(
                    engine,
                    Decision::Allowed,
                    msg.clone(),
                    Vec::new(),
                    None,
                    &t0,
                );
                return text(StatusCode::BAD_GATEWAY, &msg);
            }
        };
        let result = match &mut sender {
            Sender::H1(s) => {
                parts.version = Version::HTTP_11;
                let pq = parts
                    .uri
                    .path_and_query()
                    .map(|p| p.as_str().to_string())
                    .unwrap_or_else(|| "/".into());
                parts.uri = pq.parse().unwrap_or_else(|_| Uri::from_static("/"));
                if !parts.headers.contains_key(header::HOST)
                    && let Ok(v) = HeaderValue::from_str(&authority)
                {
                    parts.headers.insert(header::HOST, v);
                }
                let r = s.send_request(Request::from_parts(parts, body)).await;
                // Hand the sender back for the next request.
                r
            }
            Sender::H2(s) => {
                parts.version = Version::HTTP_2;
                let scheme = if self.tls { "https" } else { "http" };
                let pq = parts
                    .uri
                    .path_and_query()
                    .map(|p| p.as_str().to_string())
                    .unwrap_or_else(|| "/".into());
                let abs = format!("{scheme}://{}:{}{pq}", self.dest.label, self.dest.port);
                parts.uri = match abs.parse() {
                    Ok(u) => u,
                    Err(_) => {
                        return Refusal::Other {
                            status: StatusCode::BAD_REQUEST,
                            why: "the request target is not valid".into(),
                        }
                        .respond(engine, &self.dest, &t0);
                    }
                };
                parts.headers.remove(header::HOST);
                s.send_request(Request::from_parts(parts, body)).await
            }
        };
        self.give_back(sender).await;
        let found = hit.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(s) = found {
            return exfil(&s, "the request body", &self.icpt).respond(engine, &self.dest, &t0);
        }
        let mut resp = match result {
            Ok(r) => r,
            Err(e) => {
                let msg = format!(
                    "egress to {}:{} failed: {e}",
                    self.dest.label, self.dest.port
                );
                self.dest
                    .event(engine, Decision::Allowed, msg.clone(), injected, None, &t0);
                return text(StatusCode::BAD_GATEWAY, &msg);
            }
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
        if resp.status() == StatusCode::SWITCHING_PROTOCOLS
            && let Some(client_up) = client_upgrade
        {
            let up = hyper::upgrade::on(&mut resp);
            let needles = self.icpt.needles().clone();
            let c = self.clone();
            let idle = engine.policy.idle_timeout;
            let task = async move {
                let (Ok(cu), Ok(uu)) = (client_up.await, up.await) else {
                    return;
                };
                let meter = Meter::new();
                let hit = scanned_splice(
                    TokioIo::new(cu),
                    Metered::new(TokioIo::new(uu), meter.clone()),
                    needles,
                    meter,
                    idle,
                )
                .await;
                if let Some(s) = hit {
                    let t0 = crate::engine::started();
                    let _ = exfil(&s, "the upgraded (WebSocket) stream", &c.icpt)
                        .respond(&c.engine, &c.dest, &t0);
                }
            };
            let _ = self.tasks.send(Box::pin(task));
            let (parts, body) = resp.into_parts();
            return Response::from_parts(parts, body.boxed());
        }
        let (mut parts, body) = resp.into_parts();
        crate::proxy::strip_hop_by_hop(&mut parts.headers);
        Response::from_parts(parts, body.boxed())
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
            let extra = self
                .icpt
                .extra_ca
                .get(&(self.dest.host.clone(), self.dest.port))
                .map(String::as_str);
            let alpn: &[&[u8]] = if self.h2 {
                &[b"h2", b"http/1.1"]
            } else {
                &[b"http/1.1"]
            };
            let cfg = self.icpt.trust.client_config(extra, alpn)?;
            let name = match &self.dest.host {
                Host::Name(n) => ServerName::try_from(n.clone())
                    .map_err(|e| format!("TLS server name {n}: {e}"))?,
                Host::Ip(ip) => ServerName::IpAddress((*ip).into()),
            };
            let tls = tokio::time::timeout(
                self.engine.policy.connect_timeout,
                tokio_rustls::TlsConnector::from(cfg).connect(name, tcp),
            )
            .await
            .map_err(|_| "the upstream TLS handshake timed out".to_string())?
            .map_err(|e| format!("upstream TLS: {e}"))?;
            let h2 = tls.get_ref().1.alpn_protocol() == Some(b"h2");
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_prefix_is_segment_wise_and_refuses_dot_segments() {
        assert!(path_under("/rest/api", Some("/rest")));
        assert!(path_under("/rest", Some("/rest")));
        assert!(path_under("/rest/", Some("/rest/")));
        assert!(!path_under("/restore", Some("/rest")));
        assert!(!path_under("/rest/../admin", Some("/rest")));
        assert!(!path_under("/rest/%2e%2e/admin", Some("/rest")));
        assert!(!path_under("/rest%2Fadmin", Some("/rest")));
        assert!(!path_under("/other", Some("/rest")));
        assert!(path_under("/anything", None));
    }

    #[test]
    fn percent_round_trip() {
        assert_eq!(percent_decode("a%20b+c"), b"a b c");
        assert_eq!(percent_encode("a b/c"), "a%20b%2Fc");
    }
}
