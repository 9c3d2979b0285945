//! Credential injection through the proxy door on a host address: a loopback
//! HTTPS upstream (certificate from a test CA) and a plain HTTP one record
//! what arrives; the door terminates TLS with a session CA, substitutes the
//! token only where its secret is bound and refuses the placeholder anywhere
//! else. curl is the client (HTTP/1.1 and HTTP/2).

mod common;

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use cordon_egress::{
    Binding, Decision, DoorContext, EgressEvent, EgressPolicy, EventSink, HostPort, Injection,
    Injections, Interception, Placement, SessionCa, TokenSource, UpstreamTrust, run_proxy_with,
};
use cordon_testkit::upstream::{Log, Seen, test_pki, upstream};
use zeroize::Zeroizing;

const TOOL: &str = "jira_search";
const PH: &str = "cordon-ph-Q7m2Xw9kLp3vZ8rT4nB6yH1s";
const TOKEN: &str = "real-token-9f8e7d6c5b4a3921";
const PH_PLAIN: &str = "cordon-ph-Pl41nHttpK3y0000aaaa";
const TOKEN_PLAIN: &str = "real-plain-token-1122334455";
const PH_BASIC: &str = "cordon-ph-B4s1cPw00000zzzzyyyy";
const TOKEN_BASIC: &str = "real-basic-token-6677889900";
const PH_QUERY: &str = "cordon-ph-Qu3ryK3y11111xxxxwwww";
const TOKEN_QUERY: &str = "real/query+token=42";
const PH_BROKEN: &str = "cordon-ph-Br0k3n22222vvvvuuuu";

struct Fixed(Result<&'static str, &'static str>);

impl TokenSource for Fixed {
    fn current(&self) -> Result<Zeroizing<String>, String> {
        self.0
            .map(|t| Zeroizing::new(t.to_string()))
            .map_err(|e| e.to_string())
    }
}

struct Rig {
    _rt: tokio::runtime::Runtime,
    proxy: SocketAddr,
    tls_port: u16,
    plain_port: u16,
    log: Log,
    rx: tokio::sync::mpsc::UnboundedReceiver<EgressEvent>,
    dir: cordon_testkit::Scratch,
    upstream_ca: std::path::PathBuf,
}

fn injection(
    secret: &str,
    ph: &str,
    port: u16,
    prefix: Option<&str>,
    placement: Placement,
    tok: Result<&'static str, &'static str>,
) -> Injection {
    Injection {
        secret: secret.into(),
        placeholder: ph.into(),
        binding: Binding {
            host: "api.test".into(),
            port,
            path_prefix: prefix.map(str::to_string),
            placement,
            upstream_ca: None,
        },
        source: Arc::new(Fixed(tok)),
    }
}

fn rig() -> Rig {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let log: Log = Arc::default();
    let (ca_pem, cfg) = test_pki(&["api.test", "other.test", "pass.test"]);
    let tls_port = rt.block_on(upstream(Some(cfg), log.clone()));
    let plain_port = rt.block_on(upstream(None, log.clone()));
    let mut policy = EgressPolicy::allowlist(
        TOOL,
        [
            format!("api.test:{tls_port}"),
            format!("other.test:{tls_port}"),
            format!("pass.test:{tls_port}"),
            format!("api.test:{plain_port}"),
            format!("other.test:{plain_port}"),
        ],
    )
    .unwrap();
    for n in ["api.test", "other.test", "pass.test"] {
        policy
            .resolve
            .insert(n.into(), IpAddr::from([127, 0, 0, 1]));
    }
    policy.allow_cidrs.push("127.0.0.1/32".parse().unwrap());
    policy.upstream_dns = Some("127.0.0.1:9".parse().unwrap());
    policy
        .passthrough
        .push(HostPort::parse(&format!("pass.test:{tls_port}")).unwrap());
    let injections = Injections::new(vec![
        injection(
            "API_TOKEN",
            PH,
            tls_port,
            Some("/rest"),
            Placement::Header {
                name: "Authorization".into(),
                template: "Bearer {token}".into(),
            },
            Ok(TOKEN),
        ),
        injection(
            "PLAIN_KEY",
            PH_PLAIN,
            plain_port,
            None,
            Placement::Header {
                name: "X-Api-Key".into(),
                template: "{token}".into(),
            },
            Ok(TOKEN_PLAIN),
        ),
        injection(
            "BASIC_PW",
            PH_BASIC,
            tls_port,
            Some("/basic"),
            Placement::Basic {
                username: "bot".into(),
            },
            Ok(TOKEN_BASIC),
        ),
        injection(
            "QUERY_KEY",
            PH_QUERY,
            tls_port,
            Some("/q"),
            Placement::Query {
                param: "key".into(),
            },
            Ok(TOKEN_QUERY),
        ),
        injection(
            "BROKEN",
            PH_BROKEN,
            tls_port,
            Some("/broken"),
            Placement::Header {
                name: "Authorization".into(),
                template: "Bearer {token}".into(),
            },
            Err("revoked at session end"),
        ),
    ]);
    let session_ca = Arc::new(SessionCa::new("jira_search test").unwrap());
    let dir = cordon_testkit::scratch();
    let ca_file = dir.path().join("session-ca.pem");
    std::fs::write(&ca_file, session_ca.cert_pem()).unwrap();
    let upstream_ca = dir.path().join("upstream-ca.pem");
    std::fs::write(&upstream_ca, &ca_pem).unwrap();
    let icpt = Interception::new(
        injections,
        session_ca,
        UpstreamTrust::from_pem(&ca_pem).unwrap(),
    )
    .unwrap();
    let (sink, rx) = EventSink::channel();
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let proxy = l.local_addr().unwrap();
    drop(l);
    let ctx = DoorContext {
        tool: TOOL.into(),
        session: "s1".into(),
    };
    rt.spawn(run_proxy_with(
        proxy,
        Arc::new(policy),
        ctx,
        sink,
        Some(icpt),
    ));
    for _ in 0..200 {
        if std::net::TcpStream::connect(proxy).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut r = Rig {
        _rt: rt,
        proxy,
        tls_port,
        plain_port,
        log,
        rx,
        dir,
        upstream_ca,
    };
    std::thread::sleep(Duration::from_millis(50));
    drain(&mut r.rx);
    r
}

impl Rig {
    fn ca(&self) -> String {
        self.dir.path().join("session-ca.pem").display().to_string()
    }

    /// curl through the proxy door: (exit code, HTTP status, body).
    fn curl(&self, args: &[&str]) -> (i32, String, String) {
        if std::process::Command::new("curl")
            .arg("--version")
            .output()
            .is_err()
        {
            skip_or_fail(
                &this_test(),
                "curl is not installed (scripts/setup.sh installs it)",
            );
        }
        let out = std::process::Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "20",
                "-x",
                &format!("http://{}", self.proxy),
            ])
            .args(["--cacert", &self.ca(), "-w", "\n%{http_code}"])
            .args(args)
            .env_remove("NO_PROXY")
            .env_remove("no_proxy")
            .env_remove("SSL_CERT_FILE")
            .output()
            .expect("curl");
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
        (
            out.status.code().unwrap_or(-1),
            code.to_string(),
            body.to_string(),
        )
    }

    fn seen(&self) -> Vec<Seen> {
        std::mem::take(&mut *self.log.lock().unwrap())
    }

    /// Events until the channel is quiet for a moment.
    fn events(&mut self) -> Vec<EgressEvent> {
        std::thread::sleep(Duration::from_millis(100));
        let mut v = Vec::new();
        while let Ok(e) = self.rx.try_recv() {
            v.push(e);
        }
        v
    }

    fn https(&self, path: &str) -> String {
        format!("https://api.test:{}{path}", self.tls_port)
    }
}

fn no_secret_values(s: &str) {
    for t in [TOKEN, TOKEN_PLAIN, TOKEN_BASIC, TOKEN_QUERY] {
        assert!(!s.contains(t), "a token value leaked: {s}");
    }
}

fn exfil_event(ev: &[EgressEvent], secret: &str) -> EgressEvent {
    let e = ev
        .iter()
        .find(|e| e.exfiltration.as_deref() == Some(secret))
        .unwrap_or_else(|| panic!("no exfiltration event for {secret}: {ev:#?}"))
        .clone();
    assert_eq!(e.decision, Decision::Refused);
    assert!(
        e.reason.contains("refused as an exfiltration attempt"),
        "{e:#?}"
    );
    e
}

#[test]
fn the_token_reaches_the_bound_endpoint_over_https_and_http() {
    let mut r = rig();
    let auth = format!("Authorization: Bearer {PH}");
    for v in ["--http1.1", "--http2"] {
        let (code, status, body) = r.curl(&[v, "-H", &auth, &r.https("/rest/api/2/search?jql=x")]);
        assert_eq!((code, status.as_str()), (0, "200"), "{body}");
        let seen = r.seen();
        assert_eq!(seen.len(), 1, "{seen:#?}");
        let want_version = if v == "--http2" {
            "HTTP/2.0"
        } else {
            "HTTP/1.1"
        };
        assert_eq!(seen[0].version, want_version);
        assert!(
            seen[0]
                .headers
                .contains(&format!("authorization: Bearer {TOKEN}\n")),
            "{seen:#?}"
        );
        assert!(!seen[0].all().contains(PH));
        let ev = r.events();
        let used: Vec<&EgressEvent> = ev.iter().filter(|e| !e.injected.is_empty()).collect();
        assert_eq!(used.len(), 1, "{ev:#?}");
        assert_eq!(used[0].injected, vec!["API_TOKEN".to_string()]);
        assert_eq!(used[0].decision, Decision::Allowed);
        for e in &ev {
            no_secret_values(&format!("{e:?}"));
            assert_eq!(e.exfiltration, None);
        }
    }
    // Plain HTTP (absolute-form through the proxy door).
    let (code, status, body) = r.curl(&[
        "-H",
        &format!("X-Api-Key: {PH_PLAIN}"),
        &format!("http://api.test:{}/v1/x", r.plain_port),
    ]);
    assert_eq!((code, status.as_str()), (0, "200"), "{body}");
    let seen = r.seen();
    assert!(
        seen[0]
            .headers
            .contains(&format!("x-api-key: {TOKEN_PLAIN}\n")),
        "{seen:#?}"
    );
    let ev = r.events();
    assert!(
        ev.iter()
            .any(|e| e.injected == vec!["PLAIN_KEY".to_string()]),
        "{ev:#?}"
    );
    // Basic auth with the bound user name, and a query parameter.
    let (code, status, _) = r.curl(&["-u", &format!("bot:{PH_BASIC}"), &r.https("/basic/me")]);
    assert_eq!((code, status.as_str()), (0, "200"));
    let seen = r.seen();
    use base64::Engine as _;
    let want = base64::engine::general_purpose::STANDARD.encode(format!("bot:{TOKEN_BASIC}"));
    assert!(
        seen[0]
            .headers
            .contains(&format!("authorization: Basic {want}\n")),
        "{seen:#?}"
    );
    let (code, status, _) = r.curl(&[&r.https(&format!("/q/items?a=1&key={PH_QUERY}&b=2"))]);
    assert_eq!((code, status.as_str()), (0, "200"));
    let seen = r.seen();
    assert!(
        seen[0].target.ends_with(&format!(
            "api.test:{}/q/items?a=1&key=real%2Fquery%2Btoken%3D42&b=2",
            r.tls_port
        )) || seen[0].target == "/q/items?a=1&key=real%2Fquery%2Btoken%3D42&b=2",
        "{seen:#?}"
    );
    let ev = r.events();
    assert!(
        ev.iter()
            .any(|e| e.injected == vec!["BASIC_PW".to_string()])
    );
    assert!(
        ev.iter()
            .any(|e| e.injected == vec!["QUERY_KEY".to_string()])
    );
}

#[test]
fn the_placeholder_anywhere_else_is_refused_as_exfiltration() {
    let mut r = rig();
    let auth = format!("Authorization: Bearer {PH}");
    let other = format!("https://other.test:{}/rest/x", r.tls_port);
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(format!("x{PH}"));
    let b64url = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("xy{PH}"));
    let json: String = PH.chars().map(|c| format!("\\u{:04x}", c as u32)).collect();
    let pct: String = PH.bytes().map(|b| format!("%{b:02x}")).collect();
    let cases: Vec<(&str, Vec<String>)> = vec![
        (
            "another allowed host",
            vec!["-H".into(), auth.clone(), other.clone()],
        ),
        (
            "a path outside the prefix",
            vec!["-H".into(), auth.clone(), r.https("/admin")],
        ),
        (
            "a dot segment",
            vec![
                "--path-as-is".into(),
                "-H".into(),
                auth.clone(),
                r.https("/rest/../admin"),
            ],
        ),
        (
            "another header",
            vec!["-H".into(), format!("X-Debug: {PH}"), r.https("/rest/x")],
        ),
        (
            "the body",
            vec!["--data".into(), format!("token={PH}"), r.https("/rest/x")],
        ),
        (
            "the body, base64",
            vec!["--data".into(), b64.clone(), r.https("/rest/x")],
        ),
        (
            "the body, base64url",
            vec!["--data".into(), b64url.clone(), r.https("/rest/x")],
        ),
        (
            "the body, JSON-escaped",
            vec![
                "--data".into(),
                format!("{{\"t\":\"{json}\"}}"),
                r.https("/rest/x"),
            ],
        ),
        (
            "the query, percent-encoded",
            vec![r.https(&format!("/rest/x?t={pct}"))],
        ),
        (
            "plain HTTP to another host",
            vec![
                "-H".into(),
                auth.clone(),
                format!("http://other.test:{}/", r.plain_port),
            ],
        ),
        (
            "the bound host over another port",
            vec![
                "-H".into(),
                auth.clone(),
                format!("http://api.test:{}/rest/x", r.plain_port),
            ],
        ),
        (
            "HTTP/2 to another host",
            vec!["--http2".into(), "-H".into(), auth.clone(), other.clone()],
        ),
    ];
    for (what, args) in &cases {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, status, body) = r.curl(&a);
        assert_eq!((code, status.as_str()), (0, "403"), "{what}: {body}");
        assert!(
            body.contains("refused as an exfiltration attempt"),
            "{what}: {body}"
        );
        let seen = r.seen();
        assert!(
            seen.iter()
                .all(|s| !s.all().contains(PH) && !s.all().contains(TOKEN)),
            "{what}: {seen:#?}"
        );
        let ev = r.events();
        let e = exfil_event(&ev, "API_TOKEN");
        for e in &ev {
            no_secret_values(&format!("{e:?}"));
            assert!(e.injected.is_empty(), "{what}: {e:#?}");
        }
        assert_eq!(
            e.name,
            if what.contains("another") && !what.contains("port") && !what.contains("header") {
                "other.test"
            } else {
                "api.test"
            },
            "{what}"
        );
    }
    // Basic auth with the placeholder as the password to the wrong host, or
    // as the wrong user.
    for (user, url) in [
        ("bot", format!("https://other.test:{}/basic/me", r.tls_port)),
        ("admin", r.https("/basic/me")),
    ] {
        let (code, status, body) = r.curl(&["-u", &format!("{user}:{PH_BASIC}"), &url]);
        assert_eq!((code, status.as_str()), (0, "403"), "{user} {url}: {body}");
        exfil_event(&r.events(), "BASIC_PW");
        assert!(r.seen().is_empty());
    }
    // Positive control on the same rig: the bound request passes.
    let (code, status, _) = r.curl(&["-H", &auth, &r.https("/rest/x")]);
    assert_eq!((code, status.as_str()), (0, "200"));
    assert!(r.seen()[0].headers.contains(TOKEN));
}

#[test]
fn a_body_split_across_writes_is_still_scanned() {
    let mut r = rig();
    // A chunked body through plain HTTP, one byte per write.
    let (proxy, plain_port) = (r.proxy, r.plain_port);
    let go = |payload: &str| -> String {
        let mut s = std::net::TcpStream::connect(proxy).unwrap();
        s.set_nodelay(true).unwrap();
        s.write_all(
            format!(
                "POST http://api.test:{}/up HTTP/1.1\r\nHost: api.test:{}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
                plain_port, plain_port
            )
            .as_bytes(),
        )
        .unwrap();
        for b in payload.bytes() {
            // The door may answer (403) and close before the body is done.
            if s.write_all(format!("1\r\n{}\r\n", b as char).as_bytes())
                .is_err()
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        let _ = s.write_all(b"0\r\n\r\n");
        let mut resp = String::new();
        let _ = s.read_to_string(&mut resp);
        resp
    };
    let resp = go("hello, nothing secret here");
    assert!(resp.starts_with("HTTP/1.1 200"), "positive control: {resp}");
    assert_eq!(r.seen().len(), 1);
    r.events();
    let resp = go(&format!("data={PH_PLAIN}&more"));
    assert!(resp.starts_with("HTTP/1.1 403"), "{resp}");
    exfil_event(&r.events(), "PLAIN_KEY");
    for s in r.seen() {
        assert!(!s.all().contains(PH_PLAIN), "{s:#?}");
    }
}

#[test]
fn a_token_source_error_refuses_the_request() {
    let mut r = rig();
    let (code, status, body) = r.curl(&[
        "-H",
        &format!("Authorization: Bearer {PH_BROKEN}"),
        &r.https("/broken/x"),
    ]);
    assert_eq!((code, status.as_str()), (0, "403"), "{body}");
    assert!(
        body.contains("no token for secret BROKEN (revoked at session end)"),
        "{body}"
    );
    assert!(
        r.seen().is_empty(),
        "nothing is sent, not even the placeholder"
    );
    let ev = r.events();
    assert!(
        ev.iter()
            .any(|e| e.decision == Decision::Refused && e.exfiltration.is_none()),
        "{ev:#?}"
    );
}

#[test]
fn passthrough_hosts_are_tunnelled_untouched() {
    let r = rig();
    // The session CA is not what pass.test presents: trusting only it fails,
    // trusting the upstream's own CA works (the TLS is end to end).
    let url = format!("https://pass.test:{}/rest/x", r.tls_port);
    let (code, _, _) = r.curl(&["-H", &format!("Authorization: Bearer {PH}"), &url]);
    assert_ne!(code, 0, "pass.test must not be intercepted");
    let out = std::process::Command::new("curl")
        .args([
            "-sS",
            "--max-time",
            "20",
            "-x",
            &format!("http://{}", r.proxy),
        ])
        .args(["--cacert", &r.upstream_ca.display().to_string()])
        .args(["-H", &format!("Authorization: Bearer {PH}"), &url])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen = r.seen();
    assert!(
        seen.iter()
            .any(|s| s.headers.contains(&format!("authorization: Bearer {PH}\n"))),
        "nothing substituted: {seen:#?}"
    );
    assert!(seen.iter().all(|s| !s.all().contains(TOKEN)));
    // Positive control: an intercepted host presents the session CA's leaf.
    let (code, status, _) = r.curl(&[
        "-H",
        &format!("Authorization: Bearer {PH}"),
        &r.https("/rest/x"),
    ]);
    assert_eq!((code, status.as_str()), (0, "200"));
}

/// A WebSocket client frame as every client sends it (RFC 6455 §5.2):
/// FIN, RSV bits, opcode, the payload masked with a random key.
fn ws_frame(fin: bool, rsv: u8, opcode: u8, payload: &[u8]) -> Vec<u8> {
    let mut key = [0u8; 4];
    std::fs::File::open("/dev/urandom")
        .unwrap()
        .read_exact(&mut key)
        .unwrap();
    let mut f = vec![if fin { 0x80 } else { 0 } | rsv | opcode];
    let n = payload.len();
    if n < 126 {
        f.push(0x80 | n as u8);
    } else {
        f.push(0x80 | 126);
        f.extend_from_slice(&(n as u16).to_be_bytes());
    }
    f.extend_from_slice(&key);
    f.extend(payload.iter().enumerate().map(|(i, b)| b ^ key[i % 4]));
    f
}

fn read_head(s: &mut std::net::TcpStream) -> String {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(
            s.read(&mut b).unwrap(),
            1,
            "{}",
            String::from_utf8_lossy(&head)
        );
        head.push(b[0]);
    }
    String::from_utf8_lossy(&head).to_string()
}

/// Through the proxy door to the plain upstream, a WebSocket upgrade of
/// `path` offering permessage-deflate: the stream and the 101's head.
fn ws_open(r: &Rig, path: &str) -> (std::net::TcpStream, String) {
    let mut s = std::net::TcpStream::connect(r.proxy).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let p = r.plain_port;
    s.write_all(format!("CONNECT api.test:{p} HTTP/1.1\r\nHost: api.test:{p}\r\n\r\n").as_bytes())
        .unwrap();
    assert!(read_head(&mut s).starts_with("HTTP/1.1 200"));
    // Plain HTTP inside the tunnel, with the bound key: the door reads it.
    s.write_all(
        format!(
            "GET {path} HTTP/1.1\r\nHost: api.test:{p}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\nX-Api-Key: {PH_PLAIN}\r\n\r\n"
        )
        .as_bytes(),
    )
    .unwrap();
    let head = read_head(&mut s);
    (s, head)
}

/// The events until one that `pred` holds for (at most 60 s).
fn wait_event(r: &mut Rig, pred: impl Fn(&EgressEvent) -> bool) -> Vec<EgressEvent> {
    let mut v = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        while let Ok(e) = r.rx.try_recv() {
            v.push(e);
        }
        if v.iter().any(&pred) || std::time::Instant::now() > deadline {
            return v;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_websocket_upgrade_passes_and_its_masked_frames_are_scanned() {
    let mut r = rig();
    let (mut s, head) = ws_open(&r, "/ws");
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        r.events()
            .iter()
            .any(|e| e.injected == vec!["PLAIN_KEY".to_string()])
    );
    let seen = r.seen();
    assert!(
        seen[0]
            .headers
            .contains(&format!("x-api-key: {TOKEN_PLAIN}\n")),
        "{seen:#?}"
    );
    // The compression offer never reached the upstream (the rest did).
    assert!(seen[0].headers.contains("sec-websocket-key: "), "{seen:#?}");
    assert!(
        !seen[0].headers.contains("sec-websocket-extensions"),
        "{seen:#?}"
    );
    // Positive control: masked frames pass both ways (the upstream echoes
    // the bytes), a ping between the fragments of a message included.
    let hello = [
        ws_frame(false, 0, 1, b"hel"),
        ws_frame(true, 0, 9, b"ping"),
        ws_frame(true, 0, 0, b"lo"),
    ]
    .concat();
    s.write_all(&hello).unwrap();
    let mut echo = vec![0u8; hello.len()];
    s.read_exact(&mut echo).unwrap();
    assert_eq!(echo, hello);
    // The placeholder in a message, masked, split across two fragments
    // written apart with a pong between: the stream ends before the
    // second fragment is forwarded.
    let msg = format!("{{\"key\": \"{PH_PLAIN}\"}}");
    let (a, z) = msg.split_at(17);
    let first = ws_frame(false, 0, 2, a.as_bytes());
    assert!(
        !String::from_utf8_lossy(&first).contains(&PH_PLAIN[..7]),
        "masked"
    );
    s.write_all(&first).unwrap();
    let mut echo = vec![0u8; first.len()];
    s.read_exact(&mut echo).unwrap();
    s.write_all(
        &[
            ws_frame(true, 0, 0xA, b""),
            ws_frame(true, 0, 0, z.as_bytes()),
        ]
        .concat(),
    )
    .unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "nothing more was echoed: {rest:?}");
    let ev = wait_event(&mut r, |e| e.exfiltration.is_some());
    let e = exfil_event(&ev, "PLAIN_KEY");
    assert!(e.reason.contains("is in a WebSocket message"), "{e:#?}");
}

#[test]
fn a_compressed_websocket_frame_is_refused() {
    let mut r = rig();
    let (mut s, head) = ws_open(&r, "/ws");
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    // Positive control: an uncompressed frame passes.
    let plain = ws_frame(true, 0, 1, b"plain");
    s.write_all(&plain).unwrap();
    let mut echo = vec![0u8; plain.len()];
    s.read_exact(&mut echo).unwrap();
    assert_eq!(echo, plain);
    // RSV1: permessage-deflate, whose payload cannot be scanned.
    s.write_all(&ws_frame(true, 0x40, 1, b"\xf2\x48\xcd\xc9\xc9\x07\x00"))
        .unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "nothing more was echoed: {rest:?}");
    let ev = wait_event(&mut r, |e| e.decision == Decision::Refused);
    let e = ev
        .iter()
        .find(|e| e.decision == Decision::Refused)
        .unwrap_or_else(|| panic!("no refusal: {ev:#?}"));
    assert!(
        e.reason.contains(
            "a compressed (permessage-deflate, RSV1) WebSocket frame, which cannot be scanned"
        ),
        "{e:#?}"
    );
    assert!(e.exfiltration.is_none(), "{e:#?}");
}

#[test]
fn an_upstream_that_negotiates_compression_anyway_is_refused() {
    let mut r = rig();
    // Positive control: /ws answers without an extension (above); this
    // upstream answers with permessage-deflate though none was offered.
    let (_s, head) = ws_open(&r, "/ws-deflate");
    assert!(head.starts_with("HTTP/1.1 502"), "{head}");
    let ev = wait_event(&mut r, |e| e.decision == Decision::Refused);
    assert!(
        ev.iter().any(|e| e.decision == Decision::Refused
            && e.reason
                .contains("answered the WebSocket upgrade with an extension")),
        "{ev:#?}"
    );
    let seen = r.seen();
    assert!(
        !seen[0].headers.contains("sec-websocket-extensions"),
        "{seen:#?}"
    );
}

#[test]
fn a_placeholder_in_a_name_is_never_looked_up() {
    let mut r = rig();
    // Positive control: the same request without it reaches the door's check
    // and is refused as not allowed (no exfiltration mark).
    let (code, status, body) = r.curl(&["http://nothing.test/"]);
    assert_eq!((code, status.as_str()), (0, "403"), "{body}");
    let ev = r.events();
    assert!(ev.iter().all(|e| e.exfiltration.is_none()), "{ev:#?}");
    let (a, b) = PH.split_at(20);
    for name in [format!("{PH}.other.test"), format!("{a}.{b}.other.test")] {
        let (code, status, body) = r.curl(&[&format!("http://{name}:{}/", r.plain_port)]);
        assert_eq!((code, status.as_str()), (0, "403"), "{body}");
        assert!(
            body.contains("refused as an exfiltration attempt"),
            "{body}"
        );
        exfil_event(&r.events(), "API_TOKEN");
    }
}

/// The token the door substituted must not come back: an endpoint that
/// reflects the request (headers in its body, chunked in 5-byte pieces, and
/// in a response header and an HTTP/2 trailer) gives the tool only the
/// placeholder, over HTTP/1.1 and HTTP/2, gzip-accepting client included.
#[test]
fn a_reflected_token_comes_back_as_the_placeholder() {
    let mut r = rig();
    let auth = format!("Authorization: Bearer {PH}");
    for v in ["--http1.1", "--http2"] {
        let (code, status, out) = r.curl(&[
            v,
            "-i",
            "-H",
            &auth,
            "-H",
            "Accept-Encoding: gzip, deflate",
            &r.https("/rest/echo?x=1"),
        ]);
        assert_eq!((code, status.as_str()), (0, "200"), "{out}");
        // Positive control: the upstream got the real token, asked for an
        // unencoded response, and echoed it back.
        let seen = r.seen();
        assert_eq!(seen.len(), 1, "{seen:#?}");
        assert!(
            seen[0]
                .headers
                .contains(&format!("authorization: Bearer {TOKEN}\n")),
            "{seen:#?}"
        );
        assert!(
            seen[0].headers.contains("accept-encoding: identity\n"),
            "{seen:#?}"
        );
        // The tool sees the placeholder where the upstream echoed the token.
        no_secret_values(&out);
        assert!(
            out.contains(&format!("authorization: Bearer {PH}\n")),
            "{v}: {out}"
        );
        assert!(
            out.to_ascii_lowercase().contains(&format!(
                "x-echo-authorization: bearer {}",
                PH.to_ascii_lowercase()
            )),
            "{v}: {out}"
        );
        let ev = r.events();
        let back: Vec<&EgressEvent> = ev.iter().filter(|e| !e.reflected.is_empty()).collect();
        assert!(
            back.iter()
                .all(|e| e.reflected == vec!["API_TOKEN".to_string()]
                    && e.decision == Decision::Allowed
                    && e.reason.contains("came back")),
            "{ev:#?}"
        );
        // Once for the header, once for the body.
        assert_eq!(back.len(), 2, "{ev:#?}");
        for e in &ev {
            no_secret_values(&format!("{e:?}"));
        }
    }
    // Basic auth reflected: the base64 of `bot:<token>` does not come back.
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(format!("bot:{TOKEN_BASIC}"));
    let (code, status, out) = r.curl(&["-u", &format!("bot:{PH_BASIC}"), &r.https("/basic/echo")]);
    assert_eq!((code, status.as_str()), (0, "200"), "{out}");
    assert!(r.seen()[0].headers.contains(&b64));
    assert!(!out.contains(&b64[2..b64.len() - 2]), "{out}");
    no_secret_values(&out);
    // Plain HTTP through the proxy door (absolute form).
    let (code, status, out) = r.curl(&[
        "-i",
        "-H",
        &format!("X-Api-Key: {PH_PLAIN}"),
        &format!("http://api.test:{}/v1/echo", r.plain_port),
    ]);
    assert_eq!((code, status.as_str()), (0, "200"), "{out}");
    assert!(r.seen()[0].headers.contains(TOKEN_PLAIN));
    no_secret_values(&out);
    assert!(out.contains(&format!("x-api-key: {PH_PLAIN}\n")), "{out}");
    let ev = r.events();
    assert!(
        ev.iter()
            .any(|e| e.reflected == vec!["PLAIN_KEY".to_string()]),
        "{ev:#?}"
    );
}

/// A bound endpoint's response that comes encoded anyway cannot be scanned:
/// refused with 502, never passed on.
#[test]
fn an_encoded_response_of_a_bound_endpoint_is_refused() {
    let mut r = rig();
    let auth = format!("Authorization: Bearer {PH}");
    // Positive control: the same endpoint without the claimed encoding.
    let (code, status, out) = r.curl(&["-H", &auth, &r.https("/rest/echo")]);
    assert_eq!((code, status.as_str()), (0, "200"), "{out}");
    r.seen();
    r.events();
    let (code, status, out) = r.curl(&["-H", &auth, &r.https("/rest/echo?gzip")]);
    assert_eq!((code, status.as_str()), (0, "502"), "{out}");
    assert!(
        out.contains("Content-Encoding: gzip") && out.contains("cannot be scanned"),
        "{out}"
    );
    no_secret_values(&out);
    assert_eq!(r.seen().len(), 1);
    let ev = r.events();
    assert!(
        ev.iter()
            .any(|e| e.decision == Decision::Refused && e.reason.contains("cannot be scanned")),
        "{ev:#?}"
    );
}
