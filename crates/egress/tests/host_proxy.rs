//! `cordon proxy --listen ADDR`: the proxy door on a host address (no namespace, no root),
//! plus the idle timeout and the door-plan check of `serve`.

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use cordon_egress::{
    Decision, Door, DoorContext, Doors, EgressError, EgressEvent, EgressPolicy, EventSink,
    run_proxy, serve,
};

const TOOL: &str = "browse";

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Host {
    rt: tokio::runtime::Runtime,
    up: Upstream,
    proxy: SocketAddr,
    rx: tokio::sync::mpsc::UnboundedReceiver<EgressEvent>,
}

fn start(tune: impl FnOnce(&mut EgressPolicy)) -> Host {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let up = rt.block_on(Upstream::start("127.0.0.1:0"));
    let mut policy =
        EgressPolicy::allowlist(TOOL, [format!("docs.example:{}", up.port())]).unwrap();
    policy
        .resolve
        .insert("docs.example".into(), IpAddr::from([127, 0, 0, 1]));
    policy.allow_cidrs.push("127.0.0.1/32".parse().unwrap());
    policy.upstream_dns = Some("127.0.0.1:9".parse().unwrap());
    tune(&mut policy);
    let (sink, rx) = EventSink::channel();
    let proxy: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let ctx = DoorContext {
        tool: TOOL.into(),
        session: "host".into(),
    };
    rt.spawn(run_proxy(proxy, Arc::new(policy), ctx, sink));
    // Wait until the listener is up (the spawn above binds it).
    for _ in 0..200 {
        if std::net::TcpStream::connect(proxy).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Host { rt, up, proxy, rx }
}

fn curl(proxy: SocketAddr, args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "--max-time", "20", "-x", &format!("http://{proxy}")])
        .args(args)
        .env_remove("NO_PROXY")
        .env_remove("no_proxy")
        .output()
        .expect("curl");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
    )
}

#[test]
fn run_proxy_checks_like_the_proxy_door() {
    let mut h = start(|_| {});
    let p = h.up.port();
    // Connection probes from start() were accepted and closed without a request: they are
    // attempts too, each refused as "not a proxy request"... or closed before any request, in
    // which case hyper saw no request at all. Drop whatever they produced.
    std::thread::sleep(Duration::from_millis(50));
    drain(&mut h.rx);

    let (code, body) = curl(h.proxy, &[&format!("http://docs.example:{p}/ok")]);
    assert_eq!(
        (code, body.as_str()),
        (0, "upstream ok: GET /ok HTTP/1.1\n")
    );
    let ev = h.rt.block_on(wait_events(&mut h.rx, 1, |_| true));
    assert_eq!(
        (ev[0].door, ev[0].decision, ev[0].name.as_str()),
        (Door::Proxy, Decision::Allowed, "docs.example")
    );
    let (code, body) = curl(h.proxy, &[&format!("http://docs.example:{}/", p + 1)]);
    assert_eq!(code, 0);
    let reason = format!(
        "egress to docs.example:{} refused: not in the allowlist of {TOOL}",
        p + 1
    );
    assert_eq!(body, format!("{reason}\n"));
    let ev = h.rt.block_on(wait_events(&mut h.rx, 1, |_| true));
    assert_eq!(ev[0].reason, reason);
    assert_eq!(ev[0].decision, Decision::Refused);

    // An origin-form request is not a proxy request.
    let mut s = std::net::TcpStream::connect(h.proxy).unwrap();
    s.write_all(b"GET /x HTTP/1.1\r\nHost: docs.example\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    assert!(resp.starts_with("HTTP/1.1 400 Bad Request"), "{resp}");
    assert!(resp.ends_with("egress refused: `GET /x` is not a proxy request (use CONNECT host:port or an absolute http:// URI)\n"), "{resp}");
    let ev = h.rt.block_on(wait_events(&mut h.rx, 1, |_| true));
    assert_eq!(ev[0].decision, Decision::Refused);
    // Userinfo in a CONNECT authority is refused before anything else.
    let mut s = std::net::TcpStream::connect(h.proxy).unwrap();
    s.write_all(format!("CONNECT user@docs.example:{p} HTTP/1.1\r\n\r\n").as_bytes())
        .unwrap();
    let mut buf = [0u8; 512];
    let n = s.read(&mut buf).unwrap();
    let resp = String::from_utf8_lossy(&buf[..n]).to_string();
    assert!(
        resp.starts_with("HTTP/1.1 403") || resp.starts_with("HTTP/1.1 400"),
        "{resp}"
    );
    assert_eq!(h.up.heads().len(), 1);
}

#[test]
fn idle_tunnel_is_closed_with_a_reason() {
    let mut h = start(|p| p.idle_timeout = Duration::from_secs(1));
    std::thread::sleep(Duration::from_millis(50));
    drain(&mut h.rx);
    let p = h.up.port();
    let mut s = std::net::TcpStream::connect(h.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(format!("CONNECT docs.example:{p} HTTP/1.1\r\n\r\n").as_bytes())
        .unwrap();
    let mut head = Vec::new();
    let mut b = [0u8; 256];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut b).unwrap();
        assert!(n > 0);
        head.extend_from_slice(&b[..n]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"));
    // Positive control: the tunnel carries a request.
    s.write_all(format!("GET /t HTTP/1.1\r\nHost: docs.example:{p}\r\n\r\n").as_bytes())
        .unwrap();
    let n = s.read(&mut b).unwrap();
    assert!(String::from_utf8_lossy(&b[..n]).contains("upstream ok: GET /t"));
    // Then silence: the door closes the tunnel (read returns 0, not a read timeout).
    let n = s.read(&mut b).expect("the door must close the idle tunnel");
    assert_eq!(n, 0);
    let ev = h.rt.block_on(wait_events(&mut h.rx, 1, |_| true));
    assert_eq!(ev[0].decision, Decision::Allowed);
    assert!(
        ev[0].reason.ends_with("; closed after 1 s idle"),
        "{:#?}",
        ev[0]
    );
    assert!(ev[0].bytes_up > 0 && ev[0].bytes_down > 0);
}

#[test]
fn serve_rejects_sockets_the_plan_did_not_ask_for() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut policy = EgressPolicy::allowlist(TOOL, ["docs.example:443"]).unwrap();
    policy.upstream_dns = Some("127.0.0.1:9".parse().unwrap());
    let stray = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = stray.local_addr().unwrap();
    let ctx = DoorContext {
        tool: TOOL.into(),
        session: "s".into(),
    };
    let r = rt.block_on(serve(
        Arc::new(policy.clone()),
        ctx.clone(),
        Doors {
            tcp: vec![stray],
            udp: vec![],
            local: None,
        },
        EventSink::discard(),
    ));
    match r {
        Err(EgressError::UnexpectedDoor { addr: a, .. }) => assert_eq!(a, addr),
        other => panic!("expected UnexpectedDoor, got {other:?}"),
    }
    // An invalid policy is refused before any socket is touched.
    policy.max_connections = 0;
    let r = rt.block_on(serve(
        Arc::new(policy),
        ctx,
        Doors::default(),
        EventSink::discard(),
    ));
    assert!(matches!(r, Err(EgressError::Policy(_))), "{r:?}");
}

#[test]
fn idle_keep_alive_client_is_closed() {
    let mut h = start(|p| p.idle_timeout = Duration::from_secs(1));
    std::thread::sleep(Duration::from_millis(50));
    drain(&mut h.rx);
    let p = h.up.port();
    let mut s = std::net::TcpStream::connect(h.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    // Two requests on one keep-alive connection: each is checked and reported on its own.
    for path in ["/a", "/b"] {
        s.write_all(
            format!("GET http://docs.example:{p}{path} HTTP/1.1\r\nHost: docs.example:{p}\r\n\r\n")
                .as_bytes(),
        )
        .unwrap();
        let mut b = [0u8; 1024];
        let n = s.read(&mut b).unwrap();
        let resp = String::from_utf8_lossy(&b[..n]).to_string();
        assert!(
            resp.contains(&format!("upstream ok: GET {path} HTTP/1.1")),
            "{resp}"
        );
    }
    let ev = h.rt.block_on(wait_events(&mut h.rx, 2, |e| {
        e.decision == Decision::Allowed
    }));
    assert_eq!(ev.len(), 2, "{ev:#?}");
    // Then silence: the door closes the client connection.
    let mut b = [0u8; 64];
    let n = s
        .read(&mut b)
        .expect("the door must close the idle connection");
    assert_eq!(n, 0);
}

#[test]
fn connect_timeout_gives_502_with_a_reason() {
    // A listener with backlog 1 that never accepts: once its queue is full, further SYNs are
    // dropped and a connect hangs, as to a blackholed host.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (blackhole, _fillers) = rt.block_on(async {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let l = sock.listen(1).unwrap();
        let addr = l.local_addr().unwrap();
        let mut fillers = Vec::new();
        for _ in 0..4 {
            let s = tokio::net::TcpSocket::new_v4().unwrap();
            if let Ok(Ok(c)) =
                tokio::time::timeout(Duration::from_millis(500), s.connect(addr)).await
            {
                fillers.push(c);
            }
        }
        (l, fillers)
    });
    let port = blackhole.local_addr().unwrap().port();
    let mut h = start(|p| {
        p.connect_timeout = Duration::from_secs(1);
        p.allow
            .push(cordon_egress::HostPort::parse(&format!("slow.example:{port}")).unwrap());
        p.resolve
            .insert("slow.example".into(), IpAddr::from([127, 0, 0, 1]));
    });
    std::thread::sleep(Duration::from_millis(50));
    drain(&mut h.rx);
    let (code, body) = curl(h.proxy, &[&format!("http://slow.example:{port}/")]);
    assert_eq!(code, 0);
    let reason = format!(
        "egress to slow.example:{port} failed: connect to 127.0.0.1:{port} timed out after 1000 ms"
    );
    assert_eq!(body, format!("{reason}\n"));
    let ev = h.rt.block_on(wait_events(&mut h.rx, 1, |_| true));
    assert_eq!(ev[0].reason, reason);
    assert_eq!(ev[0].decision, Decision::Allowed);
    // Positive control: the allowed upstream on the same host answers.
    let (code, body) = curl(h.proxy, &[&format!("http://docs.example:{}/", h.up.port())]);
    assert_eq!((code, body.as_str()), (0, "upstream ok: GET / HTTP/1.1\n"));
    drop(blackhole);
}
