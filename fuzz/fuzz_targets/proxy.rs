//! Fuzz the proxy door's request parsing with interception on: any bytes from the tool on one
//! connection (CONNECT or absolute-form requests, then HTTP/1.1, TLS or anything on an
//! intercepted tunnel). `$PORT` in the input stands for the upstream's port.
//!
//! Three secrets are bound to `api.example:$PORT` (a header, a query parameter under `/q`,
//! Basic auth), pinned to a loopback upstream that answers every request with a copy of it
//! (its `Authorization` header in a response header, the whole request in a chunked body cut
//! into pieces of the size the request's `x-chunk` header asks for). So whenever the door put
//! a token in a request, the response carries it back, in the header, the body and the
//! encodings the request chose. The door never panics, and unless the tool itself sent a
//! token, no form of any token (as it is, percent-encoded, base64 at any alignment) reaches
//! the tool.
#![no_main]

use std::net::{IpAddr, Ipv4Addr};
use std::sync::{Arc, LazyLock};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
use cordon_egress::harness::Harness;
use cordon_egress::{
    Binding, EgressPolicy, EventSink, HostPort, Injection, Injections, Interception, Placement,
    SessionCa, TokenSource, UpstreamTrust,
};
use libfuzzer_sys::fuzz_target;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;
use zeroize::Zeroizing;

const TOKENS: [(&str, &str, &str); 3] = [
    (
        "HDR",
        "Tk7HdrSecretValue9Q2w",
        "cordon-ph-hdr-aaaaaaaaaaaaaaaa",
    ),
    (
        "QRY",
        "Tk7QrySecretValue8R3e",
        "cordon-ph-qry-bbbbbbbbbbbbbbbb",
    ),
    (
        "BAS",
        "Tk7BasSecretValue7S4r",
        "cordon-ph-bas-cccccccccccccccc",
    ),
];

#[derive(Debug)]
struct Fixed(&'static str);

impl TokenSource for Fixed {
    fn current(&self) -> Result<Zeroizing<String>, String> {
        Ok(Zeroizing::new(self.0.to_string()))
    }
}

struct World {
    rt: Runtime,
    h: Harness,
    port: u16,
    /// Every form of every token looked for in what the tool gets.
    forms: Vec<Vec<u8>>,
}

/// The upstream: each request copied back (see the module docs), then the connection closed.
async fn echo(mut s: tokio::net::TcpStream) {
    let mut req = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(e) = req.windows(4).position(|w| w == b"\r\n\r\n") {
            break e + 4;
        }
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => req.extend_from_slice(&buf[..n]),
        }
        if req.len() > 1 << 20 {
            return;
        }
    };
    let head = String::from_utf8_lossy(&req[..head_end]).into_owned();
    let header = |name: &str| {
        head.split("\r\n").skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    };
    let len: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
        .min(1 << 16);
    while req.len() < head_end + len {
        match s.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => req.extend_from_slice(&buf[..n]),
        }
    }
    let chunk: usize = header("x-chunk")
        .and_then(|v| v.parse().ok())
        .unwrap_or(usize::MAX)
        .clamp(1, 1 << 16);
    let auth = header("authorization").unwrap_or_default();
    let mut out = format!(
        "HTTP/1.1 200 OK\r\nx-echo: {auth}\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n"
    )
    .into_bytes();
    for c in req.chunks(chunk) {
        out.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
        out.extend_from_slice(c);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"0\r\n\r\n");
    let _ = s.write_all(&out).await;
    let _ = s.shutdown().await;
}

/// The forms of `token` that must never reach the tool.
fn forms(token: &str) -> Vec<Vec<u8>> {
    let mut v = vec![
        token.as_bytes().to_vec(),
        token
            .bytes()
            .map(|b| format!("%{b:02X}"))
            .collect::<String>()
            .into_bytes(),
        token
            .bytes()
            .map(|b| format!("%{b:02x}"))
            .collect::<String>()
            .into_bytes(),
    ];
    for k in 0..3 {
        let data = [vec![0u8; k], token.as_bytes().to_vec()].concat();
        for e in [STANDARD_NO_PAD, URL_SAFE_NO_PAD] {
            let s = e.encode(&data).into_bytes();
            // The characters that carry only token bits.
            let skip = (8 * k).div_ceil(6);
            v.push(s[skip..s.len() - 1].to_vec());
        }
    }
    v
}

static W: LazyLock<World> = LazyLock::new(|| {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("runtime");
    let (h, port) = rt.block_on(async {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = l.local_addr().expect("addr").port();
        tokio::spawn(async move {
            while let Ok((s, _)) = l.accept().await {
                tokio::spawn(echo(s));
            }
        });
        let entry = format!("api.example:{port}");
        let mut policy =
            EgressPolicy::allowlist("fuzz", [entry.as_str(), "other.example:443"]).expect("policy");
        policy
            .resolve
            .insert("api.example".into(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        policy
            .resolve
            .insert("other.example".into(), IpAddr::V4(Ipv4Addr::LOCALHOST));
        policy
            .allow_cidrs
            .push("127.0.0.1/32".parse().expect("cidr"));
        policy
            .passthrough
            .push(HostPort::parse("other.example:443").expect("passthrough"));
        let bind = |path: Option<&str>, placement: Placement| Binding {
            host: "api.example".into(),
            port,
            path_prefix: path.map(str::to_string),
            placement,
            upstream_ca: None,
        };
        let placements = [
            bind(
                None,
                Placement::Header {
                    name: "authorization".into(),
                    template: "Bearer {token}".into(),
                },
            ),
            bind(
                Some("/q"),
                Placement::Query {
                    param: "key".into(),
                },
            ),
            bind(
                None,
                Placement::Basic {
                    username: "bot".into(),
                },
            ),
        ];
        let injections = TOKENS
            .iter()
            .zip(placements)
            .map(|((secret, token, ph), binding)| Injection {
                secret: secret.to_string(),
                placeholder: ph.to_string(),
                binding,
                source: Arc::new(Fixed(token)),
            })
            .collect();
        let ca = Arc::new(SessionCa::new("fuzz").expect("session CA"));
        let trust = UpstreamTrust::from_pem(ca.cert_pem()).expect("trust");
        let icpt = Interception::new(Injections::new(injections), ca, trust).expect("interception");
        let h = Harness::new(Arc::new(policy), EventSink::discard(), Some(icpt)).expect("harness");
        (h, port)
    });
    let forms = TOKENS.iter().flat_map(|(_, t, _)| forms(t)).collect();
    World { rt, h, port, forms }
});

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

fuzz_target!(|data: &[u8]| {
    let w = &*W;
    let mut input = Vec::with_capacity(data.len() + 8);
    let port = w.port.to_string();
    let mut i = 0;
    while i < data.len() {
        if data[i..].starts_with(b"$PORT") {
            input.extend_from_slice(port.as_bytes());
            i += 5;
        } else {
            input.push(data[i]);
            i += 1;
        }
    }
    let out = w.rt.block_on(w.h.proxy(&input));
    for f in &w.forms {
        if !contains(&input, f) {
            assert!(
                !contains(&out, f),
                "a token form {:?} reached the tool:\n{}",
                String::from_utf8_lossy(f),
                String::from_utf8_lossy(&out)
            );
        }
    }
});
