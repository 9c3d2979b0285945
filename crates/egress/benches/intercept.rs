//! TLS interception with token injection against a direct HTTPS request to
//! the same loopback upstream, in one run: one keep-alive connection each,
//! HTTP/1.1, many small GETs; per-request latency after the first request
//! (which pays the handshakes: the tool's with the door and the door's with
//! the upstream), p50 and p90, plus the first request's latency.
//!
//! The proxy door runs on a host loopback address (`run_proxy_with`); the
//! client speaks CONNECT, then TLS trusting only the session CA, and sends
//! the placeholder that the door replaces. No root needed.
//!
//! `cargo bench -p cordon-egress --bench intercept` (env
//! INTERCEPT_BENCH_N: requests per mode, default 2000).

use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cordon_egress::{
    Binding, DoorContext, EgressPolicy, EventSink, Injection, Injections, Interception, Placement,
    SessionCa, TokenSource, UpstreamTrust, run_proxy_with,
};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zeroize::Zeroizing;

const PH: &str = "cordon-ph-BenchPlaceholder0123456789";
const TOKEN: &str = "bench-real-token-abcdef0123456789";

struct Fixed;
impl TokenSource for Fixed {
    fn current(&self) -> Result<Zeroizing<String>, String> {
        Ok(Zeroizing::new(TOKEN.to_string()))
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn pki() -> (String, rustls::ServerConfig) {
    let ca_key = rcgen::KeyPair::generate().expect("key");
    let mut ca = rcgen::CertificateParams::default();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = rcgen::CertifiedIssuer::self_signed(ca, ca_key).expect("ca");
    let key = rcgen::KeyPair::generate().expect("key");
    let leaf = rcgen::CertificateParams::new(vec!["api.test".to_string()])
        .expect("params")
        .signed_by(&key, &ca)
        .expect("leaf");
    let cfg = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(
            vec![leaf.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .expect("cert");
    (ca.pem(), cfg)
}

async fn upstream(cfg: rustls::ServerConfig) -> u16 {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = l.local_addr().expect("addr").port();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(cfg));
    tokio::spawn(async move {
        loop {
            let Ok((s, _)) = l.accept().await else {
                continue;
            };
            let _ = s.set_nodelay(true);
            let a = acceptor.clone();
            tokio::spawn(async move {
                let Ok(t) = a.accept(s).await else { return };
                let svc = hyper::service::service_fn(|r: Request<Incoming>| async move {
                    let ok = r
                        .headers()
                        .get("authorization")
                        .is_some_and(|v| v.as_bytes() == format!("Bearer {TOKEN}").as_bytes());
                    let body = if ok { "ok\n" } else { "no token\n" };
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(body))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(t), svc)
                    .await;
            });
        }
    });
    port
}

fn client_cfg(pem: &str) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()) {
        roots.add(c.expect("pem")).expect("root");
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(cfg)
}

/// Latencies (µs) of `n` GETs on one connection; the first one separately.
async fn run(
    to: SocketAddr,
    connect: Option<&str>,
    roots: &str,
    auth: &str,
    host: &str,
    n: usize,
) -> (f64, Vec<f64>) {
    let t_first = Instant::now();
    let mut s = tokio::net::TcpStream::connect(to).await.expect("connect");
    s.set_nodelay(true).ok();
    if let Some(target) = connect {
        s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
            .await
            .expect("write");
        let mut head = Vec::new();
        let mut b = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            assert_eq!(s.read(&mut b).await.expect("read"), 1);
            head.push(b[0]);
        }
        assert!(head.starts_with(b"HTTP/1.1 200"), "CONNECT refused");
    }
    let name = rustls::pki_types::ServerName::try_from("api.test").expect("name");
    let tls = tokio_rustls::TlsConnector::from(client_cfg(roots))
        .connect(name, s)
        .await
        .expect("TLS");
    let (mut send, conn) =
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(tls))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let one = async |send: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>| {
        let req = Request::get("/small")
            .header("host", host)
            .header("authorization", auth)
            .body(Empty::new())
            .expect("request");
        send.ready().await.expect("connection ready");
        let resp = send.send_request(req).await.expect("request");
        let body = resp.into_body().collect().await.expect("body").to_bytes();
        assert_eq!(&body[..], b"ok\n", "the upstream did not get the token");
    };
    one(&mut send).await;
    let first = t_first.elapsed().as_secs_f64() * 1e6;
    let mut lat = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        one(&mut send).await;
        lat.push(t.elapsed().as_secs_f64() * 1e6);
    }
    lat.sort_by(|a, b| a.total_cmp(b));
    (first, lat)
}

fn pct(v: &[f64], p: f64) -> f64 {
    v[((v.len() as f64 - 1.0) * p) as usize]
}

fn main() {
    let n: usize = std::env::var("INTERCEPT_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let (ca_pem, cfg) = pki();
        let port = upstream(cfg).await;
        let mut policy =
            EgressPolicy::allowlist("bench", [format!("api.test:{port}")]).expect("policy");
        policy
            .resolve
            .insert("api.test".into(), IpAddr::from([127, 0, 0, 1]));
        policy
            .allow_cidrs
            .push("127.0.0.1/32".parse().expect("cidr"));
        policy.upstream_dns = Some("127.0.0.1:9".parse().expect("addr"));
        let session_ca = Arc::new(SessionCa::new("bench").expect("session CA"));
        let session_pem = session_ca.cert_pem().to_string();
        let icpt = Interception::new(
            Injections::new(vec![Injection {
                secret: "BENCH_TOKEN".into(),
                placeholder: PH.into(),
                binding: Binding {
                    host: "api.test".into(),
                    port,
                    path_prefix: None,
                    placement: Placement::Header {
                        name: "Authorization".into(),
                        template: "Bearer {token}".into(),
                    },
                    upstream_ca: None,
                },
                source: Arc::new(Fixed),
            }]),
            session_ca,
            UpstreamTrust::from_pem(&ca_pem).expect("trust"),
        )
        .expect("interception");
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let proxy = l.local_addr().expect("addr");
        drop(l);
        let ctx = DoorContext {
            tool: "bench".into(),
            session: "bench".into(),
        };
        tokio::spawn(run_proxy_with(
            proxy,
            Arc::new(policy),
            ctx,
            EventSink::discard(),
            Some(icpt),
        ));
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(proxy).await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let direct_to: SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
        let target = format!("api.test:{port}");
        // Warm-up of both paths, then alternate measured rounds.
        let _ = run(
            direct_to,
            None,
            &ca_pem,
            &format!("Bearer {TOKEN}"),
            &target,
            200,
        )
        .await;
        let _ = run(
            proxy,
            Some(&target),
            &session_pem,
            &format!("Bearer {PH}"),
            &target,
            200,
        )
        .await;
        let mut d_all = Vec::new();
        let mut i_all = Vec::new();
        let mut firsts = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let (f, d) = run(
                direct_to,
                None,
                &ca_pem,
                &format!("Bearer {TOKEN}"),
                &target,
                n,
            )
            .await;
            firsts.0.push(f);
            d_all.extend(d);
            let (f, i) = run(
                proxy,
                Some(&target),
                &session_pem,
                &format!("Bearer {PH}"),
                &target,
                n,
            )
            .await;
            firsts.1.push(f);
            i_all.extend(i);
        }
        d_all.sort_by(|a, b| a.total_cmp(b));
        i_all.sort_by(|a, b| a.total_cmp(b));
        firsts.0.sort_by(|a, b| a.total_cmp(b));
        firsts.1.sort_by(|a, b| a.total_cmp(b));
        println!(
            "intercept bench: {} requests per mode on one keep-alive connection (3 rounds)",
            3 * n
        );
        println!(
            "  direct HTTPS:       p50 {:8.1} us  p90 {:8.1} us  first request {:8.1} us",
            pct(&d_all, 0.5),
            pct(&d_all, 0.9),
            firsts.0[1]
        );
        println!(
            "  intercepted+inject: p50 {:8.1} us  p90 {:8.1} us  first request {:8.1} us",
            pct(&i_all, 0.5),
            pct(&i_all, 0.9),
            firsts.1[1]
        );
        println!(
            "  added p50: {:.1} us (target <= 1000 us)",
            pct(&i_all, 0.5) - pct(&d_all, 0.5)
        );
    });
}
