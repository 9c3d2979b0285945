//! The doors as a sandboxed tool sees them: a thread in a fresh network namespace holds the
//! door sockets (as the jail will create them) and runs real curl and python3; the broker
//! serves the doors from tokio worker threads in the host namespace. Upstreams are loopback
//! servers of this test: an HTTP server and a DNS server that counts queries.
//!
//! Needs root (network namespaces); each test fails otherwise (see `skip_or_fail`).

mod common;

use std::net::IpAddr;
use std::sync::Arc;

use common::*;
use cordon_egress::{
    Decision, Door, DoorContext, DoorHandle, DoorPlan, EgressEvent, EgressPolicy, EventSink, plan,
    serve,
};

const TOOL: &str = "jira_search";
const ALLOWED: &str = "api.allowed.test";
/// Names the test DNS upstream answers with non-public addresses (rebinding).
const REBIND: [(&str, &str, &str); 5] = [
    (
        "rebind.allowed.test",
        "10.0.0.1",
        "a private address (RFC 1918)",
    ),
    (
        "meta.allowed.test",
        "169.254.169.254",
        "a link-local address (169.254/16 includes cloud metadata)",
    ),
    ("loop.allowed.test", "127.0.0.2", "a loopback address"),
    (
        "v6meta.allowed.test",
        "::ffff:169.254.169.254",
        "a link-local address (169.254/16 includes cloud metadata)",
    ),
    (
        "nat64.allowed.test",
        "64:ff9b::a9fe:a9fe",
        "a link-local address (169.254/16 includes cloud metadata)",
    ),
];

/// Allowed names the test DNS upstream answers with public addresses. Only DNS answers are
/// checked for them: nothing may connect to these addresses from here.
const ANSWERED: [(&str, &str, &str); 3] = [
    ("public.allowed.test", "93.184.216.34", "public"),
    ("also.allowed.test", "93.184.216.34", "public, shared"),
    ("v6only.allowed.test", "2606:4700::1111", "IPv6 only"),
];

struct Rig {
    rt: tokio::runtime::Runtime,
    ns: Netns,
    up: Upstream,
    other: Upstream,
    dns: DnsUpstream,
    plan: DoorPlan,
    handle: Option<DoorHandle>,
    rx: tokio::sync::mpsc::UnboundedReceiver<EgressEvent>,
}

struct Curl {
    code: i32,
    body: String,
    http: String,
    stderr: String,
}

impl Rig {
    fn new(tune: impl FnOnce(&mut EgressPolicy)) -> Option<Rig> {
        Rig::with_local(true, tune)
    }

    /// `local: false`: the doors get no way to add addresses to the sandbox's `lo`, so the DNS
    /// door answers from the door range.
    fn with_local(local: bool, tune: impl FnOnce(&mut EgressPolicy)) -> Option<Rig> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (up, other, dns) = rt.block_on(async {
            let table = REBIND
                .iter()
                .chain(ANSWERED.iter())
                .map(|(n, a, _)| (*n, a.parse::<IpAddr>().unwrap()))
                .collect();
            (
                Upstream::start("127.0.0.1:0").await,
                Upstream::start("127.0.0.1:0").await,
                DnsUpstream::start(table).await,
            )
        });
        let p = up.port();
        let mut entries = vec![format!("{ALLOWED}:{p}")];
        entries.extend(
            REBIND
                .iter()
                .chain(ANSWERED.iter())
                .map(|(n, _, _)| format!("{n}:{p}")),
        );
        let mut policy = EgressPolicy::allowlist(TOOL, entries).unwrap();
        policy
            .resolve
            .insert(ALLOWED.into(), "127.0.0.1".parse().unwrap());
        policy.allow_cidrs.push("127.0.0.1/32".parse().unwrap());
        policy.upstream_dns = Some(dns.addr);
        tune(&mut policy);
        let plan = plan(&policy);
        let cidrs: Vec<String> = plan.local_cidrs.iter().map(|c| c.to_string()).collect();
        let ns = match Netns::new(&cidrs) {
            Ok(ns) => ns,
            Err(why) => {
                skip_or_fail(&this_test(), &why);
                return None;
            }
        };
        let doors = if local {
            ns.doors(&plan)
        } else {
            ns.doors_without_local(&plan)
        };
        let (sink, rx) = EventSink::channel();
        let ctx = DoorContext {
            tool: TOOL.into(),
            session: "session-1".into(),
        };
        let handle = rt
            .block_on(serve(Arc::new(policy), ctx, doors, sink))
            .unwrap();
        Some(Rig {
            rt,
            ns,
            up,
            other,
            dns,
            plan,
            handle: Some(handle),
            rx,
        })
    }

    fn p(&self) -> u16 {
        self.up.port()
    }

    fn curl(&self, via_proxy: bool, args: &[&str]) -> Curl {
        let env = if via_proxy {
            self.plan.env.clone()
        } else {
            Vec::new()
        };
        let mut argv = vec!["curl", "-sS", "--max-time", "20", "-w", "\n%{http_code}"];
        argv.extend_from_slice(args);
        let out = self.ns.exec(&env, &argv);
        let (stdout, stderr) = text(&out);
        let (body, http) = match stdout.rsplit_once('\n') {
            // Bodies end with a newline; drop it so comparisons read naturally.
            Some((b, h)) => (b.strip_suffix('\n').unwrap_or(b).to_string(), h.to_string()),
            None => (String::new(), stdout.clone()),
        };
        Curl {
            code: out.status.code().unwrap_or(-1),
            body,
            http,
            stderr,
        }
    }

    /// Nothing may be pending before an attempt (a late event would be one too many).
    fn quiet(&mut self) {
        let stray = drain(&mut self.rx);
        assert!(stray.is_empty(), "unexpected events: {stray:#?}");
    }

    /// Wait for `n` non-DNS events, then take whatever else is queued; returns
    /// (connection events, DNS events).
    fn settle(&mut self, n: usize) -> (Vec<EgressEvent>, Vec<EgressEvent>) {
        let mut all = if n > 0 {
            self.rt
                .block_on(wait_events(&mut self.rx, n, |e| e.door != Door::Dns))
        } else {
            Vec::new()
        };
        all.extend(drain(&mut self.rx));
        let (dns, conn): (Vec<_>, Vec<_>) = all.into_iter().partition(|e| e.door == Door::Dns);
        assert_eq!(conn.len(), n, "connection events: {conn:#?}");
        (conn, dns)
    }

    /// Exactly one connection event, no DNS event.
    fn one(&mut self) -> EgressEvent {
        let (mut conn, dns) = self.settle(1);
        assert!(dns.is_empty(), "unexpected DNS events: {dns:#?}");
        conn.remove(0)
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            self.rt.block_on(h.shutdown());
        }
    }
}

fn refused(e: &EgressEvent, door: Door, name: &str, port: u16, reason: &str) {
    assert_eq!(e.door, door, "{e:#?}");
    assert_eq!(e.decision, Decision::Refused, "{e:#?}");
    assert_eq!(e.name, name, "{e:#?}");
    assert_eq!(e.port, port, "{e:#?}");
    assert_eq!(e.reason, reason, "{e:#?}");
    assert_eq!(e.tool, TOOL);
    assert_eq!(e.session, "session-1");
    assert_eq!((e.bytes_up, e.bytes_down), (0, 0), "{e:#?}");
}

fn allowed(e: &EgressEvent, door: Door, name: &str, port: u16) {
    assert_eq!(e.door, door, "{e:#?}");
    assert_eq!(e.decision, Decision::Allowed, "{e:#?}");
    assert_eq!(e.name, name, "{e:#?}");
    assert_eq!(e.port, port, "{e:#?}");
    assert_eq!(e.address, Some("127.0.0.1".parse().unwrap()), "{e:#?}");
    assert!(e.bytes_up > 0 && e.bytes_down > 0, "{e:#?}");
    assert!(
        e.reason.starts_with("matches ") || e.reason.starts_with("public web"),
        "{e:#?}"
    );
}

fn not_listed(host: &str, port: u16) -> String {
    format!("egress to {host}:{port} refused: not in the allowlist of {TOOL}")
}

#[test]
fn proxy_door_with_curl() {
    let Some(mut r) = Rig::new(|_| {}) else {
        return;
    };
    let p = r.p();
    let o = r.other.port();

    // Positive control: plain HTTP, absolute-form, rewritten to origin form.
    r.quiet();
    let c = r.curl(
        true,
        &[
            "-H",
            "Proxy-Connection: keep-alive",
            "-H",
            "Connection: X-Hop",
            "-H",
            "X-Hop: secret",
            "-H",
            "X-Kept: yes",
            &format!("http://{ALLOWED}:{p}/plain?q=1"),
        ],
    );
    assert_eq!((c.code, c.http.as_str()), (0, "200"), "{}", c.stderr);
    assert_eq!(c.body, "upstream ok: GET /plain?q=1 HTTP/1.1");
    let head = r.up.heads().pop().unwrap();
    let lower = head.to_ascii_lowercase();
    assert!(head.starts_with("GET /plain?q=1 HTTP/1.1\r\n"), "{head}");
    assert!(
        lower.contains(&format!("\r\nhost: {ALLOWED}:{p}\r\n")),
        "{head}"
    );
    assert!(lower.contains("\r\nx-kept: yes\r\n"), "{head}");
    for hop in ["proxy-connection", "x-hop", "keep-alive:"] {
        assert!(!lower.contains(hop), "{hop} must be dropped: {head}");
    }
    let e = r.one();
    allowed(&e, Door::Proxy, ALLOWED, p);
    let json = serde_json::to_value(&e).unwrap();
    assert_eq!(json["door"], "proxy");
    assert_eq!(json["decision"], "allowed");

    // Positive control: CONNECT (curl --proxytunnel), plain HTTP inside the tunnel.
    let c = r.curl(true, &["-p", &format!("http://{ALLOWED}:{p}/tunnel")]);
    assert_eq!((c.code, c.http.as_str()), (0, "200"), "{}", c.stderr);
    assert_eq!(c.body, "upstream ok: GET /tunnel HTTP/1.1");
    allowed(&r.one(), Door::Proxy, ALLOWED, p);
    let served = r.up.heads().len();

    // Refusals, plain HTTP: 403 with the one-line reason, same text in the event.
    let cases: Vec<(String, String, u16, String)> = vec![
        (
            format!("http://evil.example:{p}/"),
            "evil.example".into(),
            p,
            not_listed("evil.example", p),
        ),
        (
            format!("http://EVIL.Example.:{p}/"),
            "evil.example".into(),
            p,
            not_listed("evil.example", p),
        ),
        (
            format!("http://{ALLOWED}:{o}/"),
            ALLOWED.into(),
            o,
            not_listed(ALLOWED, o),
        ),
        (
            format!("http://localhost:{p}/"),
            "localhost".into(),
            p,
            not_listed("localhost", p),
        ),
        (
            format!("http://127.0.0.1:{p}/"),
            "127.0.0.1".into(),
            p,
            format!(
                "egress to 127.0.0.1:{p} refused: IP literal 127.0.0.1 is not in the allowlist of {TOOL}"
            ),
        ),
        (
            format!("http://[::1]:{p}/"),
            "[::1]".into(),
            p,
            format!(
                "egress to [::1]:{p} refused: IP literal [::1] is not in the allowlist of {TOOL}"
            ),
        ),
        (
            "http://169.254.169.254/latest/meta-data/".into(),
            "169.254.169.254".into(),
            80,
            format!(
                "egress to 169.254.169.254:80 refused: IP literal 169.254.169.254 is not in the allowlist of {TOOL}"
            ),
        ),
        (
            "http://10.0.0.1/".into(),
            "10.0.0.1".into(),
            80,
            format!(
                "egress to 10.0.0.1:80 refused: IP literal 10.0.0.1 is not in the allowlist of {TOOL}"
            ),
        ),
        (
            "http://192.168.1.1/".into(),
            "192.168.1.1".into(),
            80,
            format!(
                "egress to 192.168.1.1:80 refused: IP literal 192.168.1.1 is not in the allowlist of {TOOL}"
            ),
        ),
        (
            "http://93.184.216.34/".into(),
            "93.184.216.34".into(),
            80,
            format!(
                "egress to 93.184.216.34:80 refused: IP literal 93.184.216.34 is not in the allowlist of {TOOL}"
            ),
        ),
    ];
    for (url, name, port, reason) in &cases {
        r.quiet();
        let c = r.curl(true, &[url]);
        assert_eq!((c.code, c.http.as_str()), (0, "403"), "{url}: {}", c.stderr);
        assert_eq!(&c.body, reason, "{url}");
        refused(&r.one(), Door::Proxy, name, *port, reason);
    }

    // Refusals, CONNECT: curl reports the 403 to the CONNECT.
    for (url, name, port, reason) in &cases {
        let c = r.curl(true, &["-p", url]);
        assert_eq!(c.code, 56, "{url}: {}", c.stderr);
        assert!(
            c.stderr.contains("CONNECT tunnel failed, response 403"),
            "{}",
            c.stderr
        );
        refused(&r.one(), Door::Proxy, name, *port, reason);
    }

    // Rebinding: allowed names whose DNS answer is not public. The broker resolves through
    // the test's DNS upstream and refuses before connecting.
    for (n, addr, class) in REBIND {
        let reason = format!(
            "egress to {n}:{p} refused: {n} resolves to {addr}, {class}, not in allow_cidrs"
        );
        let c = r.curl(true, &[&format!("http://{n}:{p}/")]);
        assert_eq!((c.code, c.http.as_str()), (0, "403"), "{n}: {}", c.stderr);
        assert_eq!(c.body, reason);
        let e = r.one();
        refused(&e, Door::Proxy, n, p, &reason);
        assert_eq!(e.address, Some(addr.parse().unwrap()));
        let c = r.curl(true, &["-p", &format!("http://{n}:{p}/")]);
        assert_eq!(c.code, 56, "{}", c.stderr);
        refused(&r.one(), Door::Proxy, n, p, &reason);
    }

    // Nothing refused reached the upstream.
    assert_eq!(r.up.heads().len(), served);
    assert!(r.other.heads().is_empty());
    // The broker asked its DNS upstream about the rebinding names (positive control) and
    // about nothing else: no denied name was ever resolved.
    for (n, _, _) in REBIND {
        assert!(r.dns.count(n) >= 1, "{n} was never resolved");
    }
    let rebind_queries: usize = REBIND.iter().map(|(n, _, _)| r.dns.count(n)).sum();
    assert_eq!(r.dns.total(), rebind_queries, "{:?}", r.dns.queries);
    r.quiet();
}

#[test]
fn proxy_door_refuses_metadata_in_every_encoding() {
    let Some(mut r) = Rig::new(|_| {}) else {
        return;
    };
    let proxy = r.plan.proxy.unwrap().port().to_string();
    let encodings = [
        ("169.254.169.254", "IP literal 169.254.169.254 is not"),
        (
            "2852039166",
            "2852039166 is an IP literal (169.254.169.254) and is not",
        ),
        (
            "0251.0376.0251.0376",
            "0251.0376.0251.0376 is an IP literal (169.254.169.254) and is not",
        ),
        (
            "0xa9fea9fe",
            "0xa9fea9fe is an IP literal (169.254.169.254) and is not",
        ),
        (
            "0xA9.0xFE.0xA9.0xFE",
            "0xA9.0xFE.0xA9.0xFE is an IP literal (169.254.169.254) and is not",
        ),
        (
            "169.254.43518",
            "169.254.43518 is an IP literal (169.254.169.254) and is not",
        ),
        (
            "169.16689662",
            "169.16689662 is an IP literal (169.254.169.254) and is not",
        ),
        (
            "169.254.169.254.",
            "169.254.169.254. is an IP literal (169.254.169.254) and is not",
        ),
        (
            "[::ffff:169.254.169.254]",
            "IP literal [::ffff:169.254.169.254] is not",
        ),
        (
            "[::ffff:a9fe:a9fe]",
            "[::ffff:a9fe:a9fe] is an IP literal (::ffff:169.254.169.254) and is not",
        ),
        (
            "[64:ff9b::a9fe:a9fe]",
            "IP literal [64:ff9b::a9fe:a9fe] is not",
        ),
    ];
    let mut requests = Vec::new();
    for (enc, _) in &encodings {
        requests.push(format!(
            "GET http://{enc}/latest/meta-data/ HTTP/1.1\r\nHost: {enc}\r\n\r\n"
        ));
        requests.push(format!(
            "CONNECT {enc}:80 HTTP/1.1\r\nHost: {enc}:80\r\n\r\n"
        ));
    }
    // Positive control on the same path: an allowed request gets through.
    let p = r.p();
    requests.push(format!(
        "GET http://{ALLOWED}:{p}/raw HTTP/1.1\r\nHost: {ALLOWED}:{p}\r\nConnection: close\r\n\r\n"
    ));
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/raw_proxy.py");
    let out = r.ns.exec(
        &[],
        &[
            "/usr/bin/python3",
            script,
            &proxy,
            &serde_json::to_string(&requests).unwrap(),
        ],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let results: Vec<serde_json::Value> = serde_json::from_str(&stdout).unwrap();
    assert_eq!(results.len(), requests.len());
    let (conn, dns) = r.settle(requests.len());
    assert!(dns.is_empty());
    for (i, (enc, why)) in encodings.iter().enumerate() {
        for k in 0..2 {
            let res = &results[2 * i + k];
            let reason = format!("egress to {enc}:80 refused: {why} in the allowlist of {TOOL}");
            assert_eq!(res["status"], "HTTP/1.1 403 Forbidden", "{enc}: {res}");
            assert_eq!(res["body"], format!("{reason}\n"), "{enc}");
            let e = conn.iter().filter(|e| e.reason == reason).count();
            assert_eq!(e, 2, "{enc}: {conn:#?}");
        }
    }
    let last = results.last().unwrap();
    assert_eq!(last["status"], "HTTP/1.1 200 OK");
    assert_eq!(last["body"], "upstream ok: GET /raw HTTP/1.1\n");
    assert_eq!(r.up.heads().len(), 1);
    assert_eq!(r.dns.total(), 0);
}

#[test]
fn transparent_door_with_curl_noproxy() {
    let Some(mut r) = Rig::new(|_| {}) else {
        return;
    };
    let p = r.p();
    let o = r.other.port();

    // Positive control: the tool ignores the proxy; its own lookup goes to the DNS door, which
    // answers the real (here: pinned) address; the tool dials it, the transparent listener
    // maps it back to the name (the HTTP Host names it too).
    r.quiet();
    let c = r.curl(
        false,
        &["--noproxy", "*", &format!("http://{ALLOWED}:{p}/direct")],
    );
    assert_eq!((c.code, c.http.as_str()), (0, "200"), "{}", c.stderr);
    assert_eq!(c.body, "upstream ok: GET /direct HTTP/1.1");
    let (conn, dns) = r.settle(1);
    allowed(&conn[0], Door::Transparent, ALLOWED, p);
    assert!(!dns.is_empty());
    let a = dns
        .iter()
        .find(|e| e.reason.starts_with(&format!("A {ALLOWED} -> 127.0.0.1; ")))
        .unwrap_or_else(|| panic!("no A answer: {dns:#?}"));
    assert_eq!(a.decision, Decision::Allowed);
    assert_eq!(a.address, Some("127.0.0.1".parse().unwrap()));
    for e in &dns {
        assert_eq!(e.name, ALLOWED);
        assert_eq!(e.decision, Decision::Allowed);
    }
    // Same again with the proxy variables set but bypassed, and with them simply unset.
    let c = r.curl(
        true,
        &["--noproxy", "*", &format!("http://{ALLOWED}:{p}/again")],
    );
    assert_eq!((c.code, c.http.as_str()), (0, "200"), "{}", c.stderr);
    allowed(&r.settle(1).0[0], Door::Transparent, ALLOWED, p);
    let served = r.up.heads().len();

    // An unlisted name does not resolve: NXDOMAIN from the DNS door, one refused event per query.
    for args in [vec!["--noproxy", "*"], vec![]] {
        let url = format!("http://evil.example:{p}/");
        let mut a: Vec<&str> = args.clone();
        a.push(&url);
        let c = r.curl(false, &a);
        assert_eq!(c.code, 6, "{}", c.stderr);
        assert!(
            c.stderr.contains("Could not resolve host: evil.example"),
            "{}",
            c.stderr
        );
        let (conn, dns) = r.settle(0);
        assert!(conn.is_empty());
        assert!(!dns.is_empty());
        for e in &dns {
            assert_eq!(e.door, Door::Dns);
            assert_eq!(e.decision, Decision::Refused);
            assert_eq!(e.name, "evil.example");
            assert!(
                e.reason.starts_with("dns query ")
                    && e.reason
                        .ends_with(" evil.example refused: not in the allowlist of jira_search"),
                "{e:#?}"
            );
        }
    }

    // The allowed name on another port: nothing listens there inside the sandbox
    // (curl -v names the errno).
    let c = r.curl(
        false,
        &["--noproxy", "*", "-v", &format!("http://{ALLOWED}:{o}/")],
    );
    assert_eq!(c.code, 7, "{}", c.stderr);
    assert!(
        c.stderr
            .contains(&format!("port {o} failed: Connection refused")),
        "{}",
        c.stderr
    );
    let (conn, _dns) = r.settle(0);
    assert!(conn.is_empty());

    // The answered address, but the request names another host: refused (the Host header must
    // be a name the address was answered for).
    for (host, named) in [
        ("127.0.0.1", "127.0.0.1"),
        ("localhost", "localhost"),
        ("0x7f000001", "127.0.0.1"),
    ] {
        let c = r.curl(false, &["--noproxy", "*", &format!("http://{host}:{p}/")]);
        assert!(
            c.code == 52 || c.code == 56,
            "{host}: {} {}",
            c.code,
            c.stderr
        );
        let (conn, _) = r.settle(1);
        refused(
            &conn[0],
            Door::Transparent,
            ALLOWED,
            p,
            &format!(
                "egress to {ALLOWED}:{p} refused: HTTP request names {named}, but 127.0.0.1 was answered for {ALLOWED}"
            ),
        );
    }
    let c = r.curl(
        false,
        &[
            "--noproxy",
            "*",
            "-H",
            "Host: evil.example",
            &format!("http://{ALLOWED}:{p}/"),
        ],
    );
    assert!(c.code == 52 || c.code == 56, "{} {}", c.code, c.stderr);
    let (conn, _) = r.settle(1);
    refused(
        &conn[0],
        Door::Transparent,
        ALLOWED,
        p,
        &format!(
            "egress to {ALLOWED}:{p} refused: HTTP request names evil.example, but 127.0.0.1 was answered for {ALLOWED}"
        ),
    );
    // A loopback address the DNS door never answered lands on the transparent listener (all
    // of 127/8 is local) and is refused; everything else has no route at all.
    let c = r.curl(
        false,
        &["--noproxy", "*", &format!("http://127.0.0.2:{p}/")],
    );
    assert!(c.code == 52 || c.code == 56, "{} {}", c.code, c.stderr);
    let (conn, _) = r.settle(1);
    refused(
        &conn[0],
        Door::Transparent,
        "127.0.0.2",
        p,
        &format!(
            "egress to 127.0.0.2:{p} refused: 127.0.0.2 is not an address the DNS door handed out to {TOOL}"
        ),
    );
    for url in [
        "http://169.254.169.254/latest/meta-data/",
        "http://2852039166/",
        "http://0251.0376.0251.0376/",
        "http://0xa9fea9fe/",
        "http://169.254.43518/",
        "http://[::ffff:169.254.169.254]/",
        "http://10.0.0.1/",
        "http://172.16.0.1/",
        "http://192.168.0.1/",
        "http://100.64.0.1/",
        "http://93.184.216.34/",
        "http://[2606:4700::1111]/",
    ] {
        let c = r.curl(
            false,
            &["--noproxy", "*", "--connect-timeout", "5", "-v", url],
        );
        assert_eq!(c.code, 7, "{url}: {}", c.stderr);
        // ENETUNREACH, not a refusal or a timeout: there is no route at all.
        assert!(
            c.stderr.contains("Immediate connect fail for ")
                && c.stderr.contains(": Network is unreachable"),
            "{url}: {}",
            c.stderr
        );
        let (conn, _) = r.settle(0);
        assert!(conn.is_empty());
    }

    // Rebinding through the transparent door: the name is allowed, but the DNS door's own
    // lookup finds a non-public address, so it answers NXDOMAIN and nothing is dialled.
    for (n, addr, class) in REBIND {
        let c = r.curl(false, &["--noproxy", "*", &format!("http://{n}:{p}/")]);
        assert_eq!(c.code, 6, "{n}: {}", c.stderr);
        let (conn, dns) = r.settle(0);
        assert!(conn.is_empty(), "{conn:#?}");
        let reason =
            format!("dns query A {n} refused: {n} resolves to {addr}, {class}, not in allow_cidrs");
        let a = dns
            .iter()
            .find(|e| e.reason.starts_with("dns query A "))
            .unwrap_or_else(|| panic!("{n}: no A event: {dns:#?}"));
        assert_eq!(a.reason, reason);
        assert_eq!(a.decision, Decision::Refused);
        assert_eq!(a.address, Some(addr.parse().unwrap()));
    }
    assert_eq!(r.up.heads().len(), served);
    assert!(r.other.heads().is_empty());
    // No query for a denied name reached the upstream resolver.
    assert_eq!(r.dns.count("evil.example"), 0);
    let rebind_queries: usize = REBIND.iter().map(|(n, _, _)| r.dns.count(n)).sum();
    assert!(rebind_queries >= REBIND.len());
    assert_eq!(r.dns.total(), rebind_queries, "{:?}", r.dns.queries);
    r.quiet();
}

#[test]
fn python_tool_through_both_doors() {
    let Some(mut r) = Rig::new(|_| {}) else {
        return;
    };
    let p = r.p();
    let o = r.other.port();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/client.py");
    let out = r.ns.exec(
        &r.plan.env,
        &[
            "/usr/bin/python3",
            script,
            ALLOWED,
            &p.to_string(),
            &o.to_string(),
        ],
    );
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["env_allowed"]["status"], 200, "{v:#}");
    assert_eq!(
        v["env_allowed"]["body"],
        "upstream ok: GET /py-env HTTP/1.1\n"
    );
    assert_eq!(v["env_unlisted"]["status"], 403, "{v:#}");
    assert_eq!(
        v["env_unlisted"]["body"],
        format!("{}\n", not_listed("evil.example", p))
    );
    assert_eq!(v["env_other_port"]["status"], 403, "{v:#}");
    assert_eq!(
        v["env_other_port"]["body"],
        format!("{}\n", not_listed(ALLOWED, o))
    );
    assert_eq!(v["direct_allowed"]["status"], 200, "{v:#}");
    assert_eq!(
        v["direct_allowed"]["body"],
        "upstream ok: GET /py-direct HTTP/1.1\n"
    );
    assert_eq!(v["tunnel_allowed"]["status"], 200, "{v:#}");
    assert_eq!(
        v["tunnel_allowed"]["body"],
        "upstream ok: GET /py-tunnel HTTP/1.1\n"
    );
    assert_eq!(v["tunnel_metadata"]["error"], "OSError", "{v:#}");
    assert!(
        v["tunnel_metadata"]["detail"]
            .as_str()
            .unwrap()
            .contains("403"),
        "{v:#}"
    );
    assert_eq!(v["raw_metadata"]["errno"], "ENETUNREACH", "{v:#}");
    assert_eq!(v["raw_private"]["errno"], "ENETUNREACH", "{v:#}");
    assert_eq!(v["raw_public"]["errno"], "ENETUNREACH", "{v:#}");
    assert_eq!(v["raw_udp"]["errno"], "ENETUNREACH", "{v:#}");
    assert_eq!(v["resolve_unlisted"]["gaierror"], -2, "{v:#}"); // EAI_NONAME

    // Events: allowed env (proxy), unlisted (proxy), other port (proxy), direct
    // (transparent), tunnel (proxy), tunnel to metadata (proxy).
    let (conn, dns) = r.settle(6);
    let count = |door: Door, decision: Decision| {
        conn.iter()
            .filter(|e| e.door == door && e.decision == decision)
            .count()
    };
    assert_eq!(count(Door::Proxy, Decision::Allowed), 2, "{conn:#?}");
    assert_eq!(count(Door::Proxy, Decision::Refused), 3, "{conn:#?}");
    assert_eq!(count(Door::Transparent, Decision::Allowed), 1, "{conn:#?}");
    assert!(conn.iter().any(|e| e.reason
        == format!("egress to 169.254.169.254:80 refused: IP literal 169.254.169.254 is not in the allowlist of {TOOL}")));
    assert!(
        dns.iter()
            .any(|e| e.name == "exfil-secret-data.evil.example" && e.decision == Decision::Refused),
        "{dns:#?}"
    );
    assert_eq!(r.dns.total(), 0, "no query may reach the upstream resolver");
    r.quiet();
}

#[test]
fn dns_door_answers_only_allowed_names_and_never_forwards() {
    use hickory_resolver::proto::op::{Message, ResponseCode};
    use hickory_resolver::proto::rr::{Name, RData, RecordType};

    let Some(mut r) = Rig::new(|_| {}) else {
        return;
    };
    let ask = |r: &Rig, name: &str, t: RecordType| -> Message {
        let mut q = Message::query();
        q.metadata.recursion_desired = true;
        q.add_query(hickory_resolver::proto::op::Query::query(
            Name::from_ascii(name).unwrap(),
            t,
        ));
        let bytes = q.to_vec().unwrap();
        let reply = r.ns.run(move || {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
                .unwrap();
            s.send_to(&bytes, "127.0.0.1:53").unwrap();
            let mut buf = vec![0u8; 4096];
            let n = s.recv(&mut buf).unwrap();
            buf.truncate(n);
            buf
        });
        Message::from_vec(&reply).unwrap()
    };
    let a_of = |m: &Message| -> Vec<IpAddr> {
        m.answers
            .iter()
            .filter_map(|rec| match &rec.data {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                _ => None,
            })
            .collect()
    };

    r.quiet();
    // The pinned address of an allowed name, as it is.
    let m = ask(&r, "api.allowed.test.", RecordType::A);
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    let first = a_of(&m);
    assert_eq!(first, vec!["127.0.0.1".parse::<IpAddr>().unwrap()]);
    let (_, dns) = r.settle(0);
    assert_eq!(dns.len(), 1, "one event per query: {dns:#?}");
    assert_eq!(dns[0].address, Some(first[0]));
    assert!(
        dns[0]
            .reason
            .starts_with("A api.allowed.test -> 127.0.0.1; matches "),
        "{dns:#?}"
    );
    // Case-insensitive.
    assert_eq!(a_of(&ask(&r, "API.Allowed.Test.", RecordType::A)), first);
    assert_eq!(r.settle(0).1.len(), 1);
    // A name the broker resolves: the public address it found (the answer an SSRF guard
    // accepts), shared by two names.
    let public: IpAddr = "93.184.216.34".parse().unwrap();
    assert_eq!(
        a_of(&ask(&r, "public.allowed.test.", RecordType::A)),
        vec![public]
    );
    assert_eq!(
        a_of(&ask(&r, "also.allowed.test.", RecordType::A)),
        vec![public]
    );
    let (_, dns) = r.settle(0);
    assert_eq!(dns.len(), 2, "{dns:#?}");
    assert!(dns.iter().all(|e| e.address == Some(public)));
    // A name with only an IPv6 address: a door address (the doors are IPv4 only).
    let v6only = a_of(&ask(&r, "v6only.allowed.test.", RecordType::A));
    assert_eq!(v6only.len(), 1);
    assert!(
        matches!(v6only[0], IpAddr::V4(a) if cordon_egress::DOOR_RANGE.contains(&a)),
        "{v6only:?}"
    );
    let (_, dns) = r.settle(0);
    assert!(
        dns[0]
            .reason
            .contains("(door address: no IPv4 address); matches "),
        "{dns:#?}"
    );
    // An allowed name whose address vetting refuses: NXDOMAIN, one refused event.
    let m = ask(&r, "rebind.allowed.test.", RecordType::A);
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    assert!(m.answers.is_empty());
    let (_, dns) = r.settle(0);
    assert_eq!(dns.len(), 1);
    assert_eq!(dns[0].decision, Decision::Refused);
    assert_eq!(
        dns[0].reason,
        "dns query A rebind.allowed.test refused: rebind.allowed.test resolves to 10.0.0.1, a private address (RFC 1918), not in allow_cidrs"
    );
    // AAAA and TXT of an allowed name: NOERROR, no data.
    for t in [RecordType::AAAA, RecordType::TXT] {
        let m = ask(&r, "api.allowed.test.", t);
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert!(m.answers.is_empty());
        let (_, dns) = r.settle(0);
        assert_eq!(dns.len(), 1);
        assert_eq!(dns[0].decision, Decision::Allowed);
        assert_eq!(dns[0].address, None);
    }
    // Everything else: NXDOMAIN, one refused event each.
    for (name, why) in [
        (
            "evil.example.",
            "evil.example refused: not in the allowlist of jira_search",
        ),
        (
            "secret-payload.evil.example.",
            "secret-payload.evil.example refused: not in the allowlist of jira_search",
        ),
        (
            "allowed.test.",
            "allowed.test refused: not in the allowlist of jira_search",
        ),
        (
            "169.254.169.254.",
            "169.254.169.254 refused: an IP literal is not a name",
        ),
        (
            "localhost.",
            "localhost refused: not in the allowlist of jira_search",
        ),
    ] {
        for t in [RecordType::A, RecordType::AAAA] {
            let m = ask(&r, name, t);
            assert_eq!(m.metadata.response_code, ResponseCode::NXDomain, "{name}");
            assert!(m.answers.is_empty());
            let (_, dns) = r.settle(0);
            assert_eq!(dns.len(), 1, "{dns:#?}");
            assert_eq!(dns[0].decision, Decision::Refused);
            assert_eq!(dns[0].reason, format!("dns query {t} {why}"));
        }
    }
    // The DNS door forwarded nothing: the upstream saw only the broker's own lookups of the
    // allowed names it was asked about (the pinned one not even that).
    let own: usize = [
        "public.allowed.test",
        "also.allowed.test",
        "v6only.allowed.test",
        "rebind.allowed.test",
    ]
    .iter()
    .map(|n| r.dns.count(n))
    .sum();
    assert!(own >= 4);
    assert_eq!(r.dns.total(), own, "{:?}", r.dns.queries);
    assert_eq!(r.dns.count("api.allowed.test"), 0);
}

#[test]
fn connection_limit_refuses_with_an_event() {
    let Some(mut r) = Rig::new(|p| p.max_connections = 2) else {
        return;
    };
    let p = r.p();
    let proxy = r.plan.proxy.unwrap();
    // Two idle clients hold both slots.
    let held = r.ns.run(move || {
        (0..2)
            .map(|_| std::net::TcpStream::connect(proxy).unwrap())
            .collect::<Vec<_>>()
    });
    // The slots are taken when the broker accepts; wait until a third is refused.
    let limit = format!("connection limit of 2 reached for {TOOL}");
    let mut c = r.curl(true, &[&format!("http://{ALLOWED}:{p}/limited")]);
    let mut tries = 0;
    while c.http != "503" && tries < 50 {
        // Accept of the held sockets is still in flight: the attempt went through.
        assert_eq!(c.http, "200");
        let _ = r.settle(1);
        std::thread::sleep(std::time::Duration::from_millis(100));
        c = r.curl(true, &[&format!("http://{ALLOWED}:{p}/limited")]);
        tries += 1;
    }
    assert_eq!(c.http, "503", "{}", c.stderr);
    let reason = format!("egress to {ALLOWED}:{p} refused: {limit}");
    assert_eq!(c.body, reason);
    refused(&r.one(), Door::Proxy, ALLOWED, p, &reason);
    // The transparent door counts against the same limit.
    let c = r.curl(
        false,
        &["--noproxy", "*", &format!("http://{ALLOWED}:{p}/limited")],
    );
    assert!(c.code == 52 || c.code == 56, "{} {}", c.code, c.stderr);
    let (conn, _) = r.settle(1);
    refused(&conn[0], Door::Transparent, ALLOWED, p, &reason);
    // Positive control: release the slots and the same request goes through.
    drop(held);
    let mut ok = false;
    for _ in 0..50 {
        let c = r.curl(true, &[&format!("http://{ALLOWED}:{p}/limited")]);
        let _ = r.settle(1);
        if c.http == "200" {
            ok = true;
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(ok, "slots were never released");
}

#[test]
fn proxy_mode_allows_public_web_ports_only() {
    // Proxy mode: any public name on 80/443. The test's "public web" is a pinned name on a
    // loopback upstream bound to port 80 (allow_cidrs admits exactly that address).
    let web = std::net::Ipv4Addr::new(127, 0, 0, 80);
    let probe = std::net::TcpListener::bind((web, 80));
    let Ok(probe) = probe else {
        skip_or_fail(
            "proxy_mode_allows_public_web_ports_only",
            &format!("cannot bind {web}:80 for the proxy-mode upstream"),
        );
        return;
    };
    drop(probe);
    let Some(mut r) = Rig::new(|p| {
        p.allow.clear();
        p.any_public_web = true;
        p.resolve.insert("web.example".into(), web.into());
        p.allow_cidrs.push(ipnet::IpNet::from(IpAddr::V4(web)));
    }) else {
        return;
    };
    let up = r.rt.block_on(Upstream::start(&format!("{web}:80")));
    assert_eq!(r.plan.tcp.len(), 3);
    r.quiet();
    let c = r.curl(true, &["http://web.example/hello"]);
    assert_eq!((c.code, c.http.as_str()), (0, "200"), "{}", c.stderr);
    let e = r.one();
    assert_eq!(
        (e.door, e.decision, e.port),
        (Door::Proxy, Decision::Allowed, 80)
    );
    assert!(e.reason.starts_with("public web"));
    let c = r.curl(false, &["--noproxy", "*", "http://web.example/direct"]);
    assert_eq!((c.code, c.http.as_str()), (0, "200"), "{}", c.stderr);
    let (conn, _) = r.settle(1);
    assert_eq!(
        (conn[0].door, conn[0].decision),
        (Door::Transparent, Decision::Allowed)
    );
    assert_eq!(up.heads().len(), 2);

    // Other ports, loopback names, IP literals and rebinding names: refused.
    let cases = [
        (
            "http://web.example:8080/".to_string(),
            format!("egress to web.example:8080 refused: port 8080 is not open for {TOOL} (proxy mode allows ports 80 and 443)"),
        ),
        (
            "http://localhost/".to_string(),
            "egress to localhost:80 refused: localhost is a loopback name".to_string(),
        ),
        (
            "http://169.254.169.254/".to_string(),
            format!("egress to 169.254.169.254:80 refused: IP literal 169.254.169.254 is not in the allowlist of {TOOL}"),
        ),
        (
            "http://rebind.allowed.test/".to_string(),
            "egress to rebind.allowed.test:80 refused: rebind.allowed.test resolves to 10.0.0.1, a private address (RFC 1918), not in allow_cidrs".to_string(),
        ),
    ];
    for (url, reason) in cases {
        let c = r.curl(true, &[&url]);
        assert_eq!(c.http, "403", "{url}");
        assert_eq!(c.body, reason);
        assert_eq!(r.one().reason, reason);
    }
    assert_eq!(up.heads().len(), 2);
}

#[test]
fn shutdown_closes_every_door() {
    let Some(mut r) = Rig::new(|_| {}) else {
        return;
    };
    let proxy = r.plan.proxy.unwrap();
    let p = r.p();
    let c = r.curl(true, &[&format!("http://{ALLOWED}:{p}/before")]);
    assert_eq!(c.http, "200");
    let _ = r.one();
    let h = r.handle.take().unwrap();
    r.rt.block_on(h.shutdown());
    let err =
        r.ns.run(move || std::net::TcpStream::connect(proxy).unwrap_err().kind());
    assert_eq!(err, std::io::ErrorKind::ConnectionRefused);
}

/// A loopback HTTPS upstream (python, self-signed certificate for the allowed name), killed
/// on drop.
struct TlsUpstream {
    child: std::process::Child,
    port: u16,
    ca: std::path::PathBuf,
    dir: std::path::PathBuf,
}

impl TlsUpstream {
    /// `Err(reason)` when openssl or python3 cannot provide it.
    fn start() -> Result<TlsUpstream, String> {
        use std::io::BufRead;
        let dir = std::env::temp_dir().join(format!(
            "cordon-egress-tls-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let (key, ca) = (dir.join("key.pem"), dir.join("cert.pem"));
        let out = std::process::Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            ])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&ca)
            .args([
                "-subj",
                &format!("/CN={ALLOWED}"),
                "-addext",
                &format!("subjectAltName=DNS:{ALLOWED}"),
            ])
            .output()
            .map_err(|e| format!("openssl: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "openssl req: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/py/tls_server.py");
        let mut child = std::process::Command::new("/usr/bin/python3")
            .arg(script)
            .arg(&ca)
            .arg(&key)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("/usr/bin/python3: {e}"))?;
        let mut line = String::new();
        if let Some(out) = child.stdout.take() {
            let _ = std::io::BufReader::new(out).read_line(&mut line);
        }
        let Ok(port) = line.trim().parse() else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{script} printed no port: {line:?}"));
        };
        Ok(TlsUpstream {
            child,
            port,
            ca,
            dir,
        })
    }
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn https_through_connect_and_the_transparent_door() {
    let tls = match TlsUpstream::start() {
        Ok(tls) => tls,
        Err(why) => {
            skip_or_fail(
                "https_through_connect_and_the_transparent_door",
                &format!("cannot start the HTTPS upstream: {why}"),
            );
            return;
        }
    };
    let t = tls.port;
    let Some(mut r) = Rig::new(|p| {
        p.allow
            .push(cordon_egress::HostPort::parse(&format!("{ALLOWED}:{t}")).unwrap());
    }) else {
        return;
    };
    let ca = tls.ca.to_string_lossy().to_string();
    r.quiet();
    // Through the proxy door: CONNECT, then TLS end to end; the certificate is verified
    // against the allowed name, so the tunnel reached the real upstream.
    let c = r.curl(
        true,
        &[
            "--cacert",
            &ca,
            &format!("https://{ALLOWED}:{t}/via-connect"),
        ],
    );
    assert_eq!((c.code, c.http.as_str()), (0, "200"), "{}", c.stderr);
    assert_eq!(c.body, "tls ok: /via-connect");
    allowed(&r.one(), Door::Proxy, ALLOWED, t);
    // Ignoring the proxy: the transparent door, same TLS session shape.
    let c = r.curl(
        false,
        &[
            "--noproxy",
            "*",
            "--cacert",
            &ca,
            &format!("https://{ALLOWED}:{t}/via-door"),
        ],
    );
    assert_eq!((c.code, c.http.as_str()), (0, "200"), "{}", c.stderr);
    assert_eq!(c.body, "tls ok: /via-door");
    allowed(&r.settle(1).0[0], Door::Transparent, ALLOWED, t);
    // An unlisted name on the same port: refused at CONNECT, and unresolvable directly.
    let c = r.curl(
        true,
        &["--cacert", &ca, &format!("https://evil.example:{t}/")],
    );
    assert_eq!(c.code, 56, "{}", c.stderr);
    refused(
        &r.one(),
        Door::Proxy,
        "evil.example",
        t,
        &not_listed("evil.example", t),
    );
    let c = r.curl(
        false,
        &["--noproxy", "*", &format!("https://evil.example:{t}/")],
    );
    assert_eq!(c.code, 6, "{}", c.stderr);
    let (conn, dns) = r.settle(0);
    assert!(conn.is_empty() && !dns.is_empty());
    // The allowed name's answered address, but a ClientHello naming another host (the tool
    // dials the address it got for the allowed name): refused, nothing reaches the upstream.
    for (sni, shown) in [("evil.example", "evil.example"), ("localhost", "localhost")] {
        let c = r.curl(
            false,
            &[
                "--noproxy",
                "*",
                "--cacert",
                &ca,
                "--connect-to",
                &format!("{sni}:{t}:{ALLOWED}:{t}"),
                &format!("https://{sni}:{t}/"),
            ],
        );
        assert_eq!(c.code, 35, "{sni}: {}", c.stderr);
        let (conn, _) = r.settle(1);
        refused(
            &conn[0],
            Door::Transparent,
            ALLOWED,
            t,
            &format!(
                "egress to {ALLOWED}:{t} refused: TLS ClientHello names {shown}, but 127.0.0.1 was answered for {ALLOWED}"
            ),
        );
    }
    // Without a server name (an IP literal in the URL): refused too.
    let c = r.curl(
        false,
        &["--noproxy", "*", "-k", &format!("https://127.0.0.1:{t}/")],
    );
    assert_eq!(c.code, 35, "{}", c.stderr);
    let (conn, _) = r.settle(1);
    refused(
        &conn[0],
        Door::Transparent,
        ALLOWED,
        t,
        &format!(
            "egress to {ALLOWED}:{t} refused: TLS ClientHello without a name, to 127.0.0.1 (answered for {ALLOWED})"
        ),
    );
    assert_eq!(r.dns.total(), 0);
}

/// Two allowed names answered with the same address: the HTTP `Host` decides; a connection
/// that names neither is allowed while only one name was answered there, refused once two were.
#[test]
fn shared_address_is_decided_by_the_name_presented() {
    const SECOND: &str = "second.allowed.test";
    let Some(mut r) = Rig::new(|p| {
        let port = p.allow[0].port;
        p.allow
            .push(cordon_egress::HostPort::parse(&format!("{SECOND}:{port}")).unwrap());
        p.resolve
            .insert(SECOND.into(), "127.0.0.1".parse().unwrap());
    }) else {
        return;
    };
    let p = r.p();
    let raw = |r: &Rig| -> String {
        r.ns.run(move || {
            use std::io::{Read, Write};
            let mut s = std::net::TcpStream::connect(("127.0.0.1", p)).unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
                .unwrap();
            s.write_all(b"hello\r\nconnection: close\r\n\r\n").unwrap();
            let mut out = String::new();
            let _ = s.read_to_string(&mut out);
            out
        })
    };
    r.quiet();
    let c = r.curl(
        false,
        &["--noproxy", "*", &format!("http://{ALLOWED}:{p}/one")],
    );
    assert_eq!((c.code, c.http.as_str()), (0, "200"), "{}", c.stderr);
    allowed(&r.settle(1).0[0], Door::Transparent, ALLOWED, p);
    // Positive control: one name answered for the address, a connection naming nothing goes to
    // it.
    let got = raw(&r);
    assert!(got.contains("upstream ok: hello"), "{got:?}");
    allowed(&r.settle(1).0[0], Door::Transparent, ALLOWED, p);
    // The second name, same address: its Host decides.
    let c = r.curl(
        false,
        &["--noproxy", "*", &format!("http://{SECOND}:{p}/two")],
    );
    assert_eq!((c.code, c.http.as_str()), (0, "200"), "{}", c.stderr);
    allowed(&r.settle(1).0[0], Door::Transparent, SECOND, p);
    let c = r.curl(
        false,
        &["--noproxy", "*", &format!("http://{ALLOWED}:{p}/three")],
    );
    assert_eq!((c.code, c.http.as_str()), (0, "200"), "{}", c.stderr);
    allowed(&r.settle(1).0[0], Door::Transparent, ALLOWED, p);
    // Now ambiguous without a name: refused.
    let got = raw(&r);
    assert_eq!(got, "");
    let (conn, _) = r.settle(1);
    refused(
        &conn[0],
        Door::Transparent,
        &format!("{ALLOWED} or {SECOND}"),
        p,
        &format!(
            "egress to {ALLOWED} or {SECOND}:{p} refused: 127.0.0.1 was answered for {ALLOWED} or {SECOND}, and the connection names none of them (no TLS server name, no HTTP Host)"
        ),
    );
    // A request head that arrives in pieces is read to its Host before anything is decided.
    let got = r.ns.run(move || {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", p)).unwrap();
        s.set_nodelay(true).unwrap();
        s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
            .unwrap();
        for piece in [
            "GET /pieces HTTP/1.1\r\n".to_string(),
            format!("Host: {SECOND}:{p}\r\n"),
            "Connection: close\r\n\r\n".to_string(),
        ] {
            s.write_all(piece.as_bytes()).unwrap();
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    });
    assert!(got.contains("upstream ok: GET /pieces"), "{got:?}");
    allowed(&r.settle(1).0[0], Door::Transparent, SECOND, p);
    let heads = r.up.heads();
    assert_eq!(heads.len(), 5, "{heads:#?}");
    assert!(
        heads[0].contains("/one") && heads[2].contains("/two"),
        "{heads:#?}"
    );
}

/// The metadata address is never answered, even when `allow_cidrs` would let the broker
/// connect to it; a neighbour in 169.254/16 that `allow_cidrs` names is (positive control).
#[test]
fn dns_door_never_answers_the_metadata_address() {
    use hickory_resolver::proto::op::{Message, Query, ResponseCode};
    use hickory_resolver::proto::rr::{Name, RData, RecordType};
    let Some(mut r) = Rig::new(|p| {
        let port = p.allow[0].port;
        p.allow_cidrs.push("169.254.0.0/16".parse().unwrap());
        p.allow
            .push(cordon_egress::HostPort::parse(&format!("near.allowed.test:{port}")).unwrap());
        p.resolve
            .insert("near.allowed.test".into(), "169.254.10.10".parse().unwrap());
    }) else {
        return;
    };
    let ask = |r: &Rig, name: &str| -> Message {
        let mut q = Message::query();
        q.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
        let bytes = q.to_vec().unwrap();
        let reply = r.ns.run(move || {
            let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            s.set_read_timeout(Some(std::time::Duration::from_secs(20)))
                .unwrap();
            s.send_to(&bytes, "127.0.0.1:53").unwrap();
            let mut buf = vec![0u8; 4096];
            let n = s.recv(&mut buf).unwrap();
            buf.truncate(n);
            buf
        });
        Message::from_vec(&reply).unwrap()
    };
    r.quiet();
    let m = ask(&r, "near.allowed.test.");
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    let got: Vec<String> = m
        .answers
        .iter()
        .filter_map(|a| match &a.data {
            RData::A(a) => Some(a.0.to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(got, ["169.254.10.10"]);
    r.settle(0);
    let m = ask(&r, "meta.allowed.test.");
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    assert!(m.answers.is_empty());
    let (_, dns) = r.settle(0);
    assert_eq!(dns.len(), 1, "{dns:#?}");
    assert_eq!(dns[0].decision, Decision::Refused);
    assert_eq!(
        dns[0].reason,
        "dns query A meta.allowed.test refused: meta.allowed.test resolves to 169.254.169.254, the cloud metadata address, which the DNS door never answers"
    );
    // And it has no route in the sandbox.
    let c = r.curl(
        false,
        &[
            "--noproxy",
            "*",
            "--connect-timeout",
            "5",
            "-v",
            "http://169.254.169.254/",
        ],
    );
    assert_eq!(c.code, 7, "{}", c.stderr);
    assert!(c.stderr.contains("Network is unreachable"), "{}", c.stderr);
}

/// Doors served without a way to add local addresses: the DNS door answers from the door
/// range, and the transparent door maps that address back to the name (and resolves it).
#[test]
fn without_local_addresses_the_door_range_is_answered() {
    let Some(mut r) = Rig::with_local(false, |_| {}) else {
        return;
    };
    let p = r.p();
    r.quiet();
    let c = r.curl(
        false,
        &["--noproxy", "*", &format!("http://{ALLOWED}:{p}/range")],
    );
    assert_eq!((c.code, c.http.as_str()), (0, "200"), "{}", c.stderr);
    assert_eq!(c.body, "upstream ok: GET /range HTTP/1.1");
    let (conn, dns) = r.settle(1);
    allowed(&conn[0], Door::Transparent, ALLOWED, p);
    let a = dns
        .iter()
        .find(|e| {
            e.reason
                .starts_with(&format!("A {ALLOWED} -> 198.18.0.1 (door address); "))
        })
        .unwrap_or_else(|| panic!("no door-range answer: {dns:#?}"));
    assert_eq!(a.address, Some("198.18.0.1".parse().unwrap()));
    // The pinned address itself was never answered here: dialled directly, it is refused.
    let c = r.curl(
        false,
        &["--noproxy", "*", &format!("http://127.0.0.1:{p}/")],
    );
    assert!(c.code == 52 || c.code == 56, "{} {}", c.code, c.stderr);
    let (conn, _) = r.settle(1);
    refused(
        &conn[0],
        Door::Transparent,
        "127.0.0.1",
        p,
        &format!(
            "egress to 127.0.0.1:{p} refused: 127.0.0.1 is not an address the DNS door handed out to {TOOL}"
        ),
    );
}
