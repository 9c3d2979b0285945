//! Recording upstreams on loopback, for the credential-injection tests: an
//! HTTPS one (a leaf from a test CA) or a plain one, HTTP/1.1 and HTTP/2,
//! each request kept as it arrived; `/ws` answers an upgrade and echoes
//! (`/ws-deflate` the same, with permessage-deflate negotiated unasked);
//! `/echo` reflects the request (see [`echo`]).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};

/// One request as an upstream received it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    /// `HTTP/1.1`, `HTTP/2.0`.
    pub version: String,
    pub target: String,
    /// `name: value\n` each.
    pub headers: String,
    pub body: Vec<u8>,
}

impl Seen {
    /// Version, target, headers and body.
    pub fn all(&self) -> String {
        format!(
            "{} {}\n{}\n{}",
            self.version,
            self.target,
            self.headers,
            String::from_utf8_lossy(&self.body)
        )
    }

    /// `METHOD TARGET VERSION`, the headers and the body.
    pub fn line(&self) -> String {
        format!(
            "{} {} {}\n{}{}",
            self.method,
            self.target,
            self.version,
            self.headers,
            String::from_utf8_lossy(&self.body)
        )
    }
}

/// What the upstreams received, in order.
pub type Log = Arc<Mutex<Vec<Seen>>>;

fn headers(req: &Request<Incoming>) -> String {
    req.headers()
        .iter()
        .map(|(k, v)| format!("{k}: {}\n", String::from_utf8_lossy(v.as_bytes())))
        .collect()
}

type Out = BoxBody<Bytes, Infallible>;

fn full(b: impl Into<Bytes>) -> Out {
    Full::new(b.into()).boxed()
}

/// A body of the given frames, each its own poll (chunked on HTTP/1.1).
struct Pieces(VecDeque<Frame<Bytes>>);

impl hyper::body::Body for Pieces {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.0.pop_front().map(Ok))
    }
}

/// A path with `/echo`: the request's headers reflected in the body, sent in frames of
/// 5 bytes (chunked on HTTP/1.1, so every token is split across reads), its
/// `Authorization` in the response header `x-echo-authorization` and in a
/// trailer of the same name (HTTP/2 only: HTTP/1.1 clients did not ask for
/// trailers). With `gzip` in the query, the response claims
/// `Content-Encoding: gzip` whatever was asked.
fn echo(req: &Request<Incoming>) -> Response<Out> {
    let text = format!("echo {} {}\n{}", req.method(), req.uri(), headers(req));
    let mut frames: VecDeque<Frame<Bytes>> = text
        .into_bytes()
        .chunks(5)
        .map(|c| Frame::data(Bytes::copy_from_slice(c)))
        .collect();
    let auth = req.headers().get(hyper::header::AUTHORIZATION).cloned();
    if req.version() == hyper::Version::HTTP_2
        && let Some(a) = &auth
    {
        let mut t = hyper::HeaderMap::new();
        t.insert("x-echo-authorization", a.clone());
        frames.push_back(Frame::trailers(t));
    }
    let mut r = Response::new(Pieces(frames).boxed());
    if let Some(a) = auth {
        r.headers_mut().insert("x-echo-authorization", a);
    }
    if req.uri().query().is_some_and(|q| q.contains("gzip")) {
        r.headers_mut().insert(
            hyper::header::CONTENT_ENCODING,
            hyper::header::HeaderValue::from_static("gzip"),
        );
    }
    r
}

async fn record(mut req: Request<Incoming>, log: Log) -> Result<Response<Out>, Infallible> {
    let method = req.method().to_string();
    let version = format!("{:?}", req.version());
    let target = req.uri().to_string();
    if req.uri().path() == "/ws" || req.uri().path() == "/ws-deflate" {
        let deflate = req.uri().path() == "/ws-deflate";
        // An upgrade: 101, then echo every byte back.
        let headers = headers(&req);
        log.lock().unwrap_or_else(|e| e.into_inner()).push(Seen {
            method,
            version,
            target,
            headers,
            body: Vec::new(),
        });
        let on = hyper::upgrade::on(&mut req);
        tokio::spawn(async move {
            if let Ok(u) = on.await {
                let mut io = TokioIo::new(u);
                let mut buf = [0u8; 1024];
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                while let Ok(n) = io.read(&mut buf).await {
                    if n == 0 || io.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            }
        });
        let mut r = Response::new(full(Bytes::new()));
        *r.status_mut() = hyper::StatusCode::SWITCHING_PROTOCOLS;
        r.headers_mut().insert(
            hyper::header::CONNECTION,
            hyper::header::HeaderValue::from_static("upgrade"),
        );
        r.headers_mut().insert(
            hyper::header::UPGRADE,
            hyper::header::HeaderValue::from_static("websocket"),
        );
        if deflate {
            r.headers_mut().insert(
                hyper::header::SEC_WEBSOCKET_EXTENSIONS,
                hyper::header::HeaderValue::from_static("permessage-deflate"),
            );
        }
        return Ok(r);
    }
    let echoed = req.uri().path().contains("/echo").then(|| echo(&req));
    let headers = headers(&req);
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    log.lock().unwrap_or_else(|e| e.into_inner()).push(Seen {
        method,
        version: version.clone(),
        target: target.clone(),
        headers,
        body,
    });
    if let Some(r) = echoed {
        return Ok(r);
    }
    Ok(Response::new(full(format!(
        "upstream ok {version} {target}\n"
    ))))
}

/// A test CA (its PEM) and a server configuration with a leaf it signed
/// for `names`, offering HTTP/2 and HTTP/1.1.
pub fn test_pki(names: &[&str]) -> (String, rustls::ServerConfig) {
    let ca_key = rcgen::KeyPair::generate().expect("a CA key");
    let mut ca = rcgen::CertificateParams::default();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "cordon test upstream CA");
    let ca = rcgen::CertifiedIssuer::self_signed(ca, ca_key).expect("the test CA");
    let key = rcgen::KeyPair::generate().expect("a leaf key");
    let leaf =
        rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .expect("leaf names")
            .signed_by(&key, &ca)
            .expect("the leaf signed by the test CA");
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_no_client_auth()
    .with_single_cert(
        vec![leaf.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .expect("the leaf's server configuration");
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    (ca.pem(), cfg)
}

/// A recording upstream on a free loopback port (TLS with `tls`, plain
/// without), served on the current tokio runtime; its port.
pub async fn upstream(tls: Option<rustls::ServerConfig>, log: Log) -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let port = l.local_addr().expect("the bound address").port();
    let acceptor = tls.map(|c| tokio_rustls::TlsAcceptor::from(Arc::new(c)));
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else {
                continue;
            };
            let (log, acceptor) = (log.clone(), acceptor.clone());
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(move |r| record(r, log.clone()));
                let b = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                match acceptor {
                    Some(a) => {
                        if let Ok(t) = a.accept(s).await {
                            let _ = b.serve_connection_with_upgrades(TokioIo::new(t), svc).await;
                        }
                    }
                    None => {
                        let _ = b.serve_connection_with_upgrades(TokioIo::new(s), svc).await;
                    }
                }
            });
        }
    });
    port
}
