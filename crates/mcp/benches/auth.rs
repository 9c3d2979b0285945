//! What bearer-token authentication costs `cordon serve --http`, measured
//! in one run over HTTP on loopback: the same gateway served twice, once
//! without authentication and once checking RS256 JWTs issued by a real
//! authorization server (oauth2-mock-server on loopback, as installed by
//! scripts/setup.sh; crates/cli/tests/fixtures/auth-server.mjs).
//!
//!     cargo bench -p cordon-mcp --bench auth [-- --calls N --sessions N]
//!
//! Rows:
//! - `word_count`: the example manifest's P1 tool alone, a call (a fresh jail per call) over streamable HTTP,
//!   p50 and p99, the two servers measured in alternating rounds;
//! - `sessions`: sessions per second, each initialize + tools/list + close;
//! - `validation alone`: the validator on one token, in process (the JWT
//!   check's own cost, keys cached).

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cordon_mcp::rmcp;
use cordon_mcp::{Gateway, GatewayOptions, HttpOptions};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const RESOURCE: &str = "http://127.0.0.1/mcp";

/// The example manifest's word_count, alone (no `mcp:` server to start per
/// session).
const MANIFEST: &str = r#"version: 1
tools:
  word_count:
    profile: P1
    description: Count lines, words and bytes of a text.
    command: ["/usr/bin/wc"]
    limits: {wall_seconds: 5, memory: 64M, tasks: 4, output_bytes: 4K}
    network: none
    input: {stdin: text}
    input_schema:
      type: object
      properties: {text: {type: string}}
      required: [text]
"#;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn arg(name: &str, default: usize) -> usize {
    std::env::args()
        .skip_while(|a| a != name)
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(default)
}

fn pct(v: &mut [Duration], p: usize) -> Duration {
    v.sort();
    v[((v.len() * p) / 100).min(v.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

/// The authorization server: the child and its port.
fn start_idp() -> (std::process::Child, u16) {
    let npm = std::env::var_os("CORDON_E2E_NPM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/cordon-e2e/npm"));
    let mut child = Command::new("node")
        .arg(repo().join("crates/cli/tests/fixtures/auth-server.mjs"))
        .arg(&npm)
        .stdout(Stdio::piped())
        .spawn()
        .expect("node (and oauth2-mock-server from scripts/setup.sh) are needed");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("the auth server's port");
    let port = line
        .trim()
        .strip_prefix("port ")
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("auth server said {line:?}"));
    (child, port)
}

/// A JWT for the resource from the authorization server.
fn mint(port: u16) -> String {
    let body = json!({"claims": {"sub": "bench", "aud": RESOURCE, "azp": "bench-client"}, "expires_in": 3600})
        .to_string();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(
        s,
        "POST /test/jwt HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut out = String::new();
    s.read_to_string(&mut out).expect("read");
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    // Chunked or not: the token is the one line with two dots.
    body.lines()
        .find(|l| l.matches('.').count() == 2)
        .expect("a JWT")
        .trim()
        .to_string()
}

async fn serve(gw: Arc<Gateway>, opts: HttpOptions, stop: CancellationToken) -> String {
    let l = cordon_mcp::bind("127.0.0.1:0".parse().expect("addr"))
        .await
        .expect("bind");
    let url = format!("http://{}/mcp", l.local_addr().expect("addr"));
    tokio::spawn(async move { cordon_mcp::serve_http(gw, l, opts, stop).await });
    url
}

async fn client(url: &str, token: Option<&str>) -> RunningService<RoleClient, ()> {
    cordon_mcp::install_crypto_provider();
    let mut cfg = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    if let Some(t) = token {
        cfg = cfg.auth_header(t);
    }
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .expect("client");
    let t = rmcp::transport::StreamableHttpClientTransport::with_client(http, cfg);
    ().serve(t).await.expect("initialize")
}

async fn calls(c: &RunningService<RoleClient, ()>, n: usize, out: &mut Vec<Duration>) {
    let mut p = CallToolRequestParams::new("word_count".to_owned());
    p.arguments = json!({"text": "a b\nc\n"}).as_object().cloned();
    for _ in 0..n {
        let t = Instant::now();
        let r = c.peer().call_tool(p.clone()).await.expect("call");
        out.push(t.elapsed());
        assert_eq!(r.is_error, Some(false), "{r:?}");
    }
}

async fn sessions(url: &str, token: Option<&str>, n: usize) -> f64 {
    let t = Instant::now();
    for _ in 0..n {
        let c = client(url, token).await;
        c.peer().list_all_tools().await.expect("tools/list");
        let _ = c.cancel().await;
    }
    n as f64 / t.elapsed().as_secs_f64()
}

fn main() {
    let n_calls = arg("--calls", 300);
    let n_sessions = arg("--sessions", 100);
    let rounds = 6;
    let (mut idp, port) = start_idp();
    let token = mint(port);
    let dir = tempfile::tempdir().expect("tempdir");
    let opts = GatewayOptions {
        audit: Some(dir.path().join("audit.jsonl")),
        ..GatewayOptions::default()
    };
    let cfg = cordon_auth::AuthConfig::parse(
        Path::new("bench-auth.yaml"),
        &format!("resource: {RESOURCE}\nissuer: http://127.0.0.1:{port}\n"),
    )
    .expect("auth config");
    let validator = Arc::new(cordon_auth::Validator::from_config(&cfg).expect("validator"));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let manifest = dir.path().join("bench.yaml");
        std::fs::write(&manifest, MANIFEST).expect("write the manifest");
        let gw = Arc::new(Gateway::from_manifest(&manifest, &opts).expect("gateway"));
        let stop = CancellationToken::new();
        let plain = serve(gw.clone(), HttpOptions::default(), stop.clone()).await;
        let authed = serve(
            gw,
            HttpOptions {
                authenticator: Some(Arc::new(cordon_mcp::bearer::BearerAuthenticator::new(
                    validator.clone(),
                ))),
                ..HttpOptions::default()
            },
            stop.clone(),
        )
        .await;

        // The validator alone (keys fetched by the first call).
        let bearer = format!("Bearer {token}");
        validator.authenticate(Some(&bearer)).await.expect("the token checks");
        let k = 2000;
        let t = Instant::now();
        for _ in 0..k {
            validator.authenticate(Some(&bearer)).await.expect("the token checks");
        }
        let one = t.elapsed() / k;

        let a = client(&plain, None).await;
        let b = client(&authed, Some(&token)).await;
        let (mut la, mut lb) = (Vec::new(), Vec::new());
        calls(&a, 10, &mut Vec::new()).await;
        calls(&b, 10, &mut Vec::new()).await;
        for _ in 0..rounds {
            calls(&a, n_calls / rounds, &mut la).await;
            calls(&b, n_calls / rounds, &mut lb).await;
        }
        let _ = a.cancel().await;
        let _ = b.cancel().await;
        let (mut sa, mut sb) = (0.0, 0.0);
        for _ in 0..2 {
            sa += sessions(&plain, None, n_sessions / 2).await;
            sb += sessions(&authed, Some(&token), n_sessions / 2).await;
        }
        let (sa, sb) = (sa / 2.0, sb / 2.0);
        stop.cancel();

        let (a50, a99) = (pct(&mut la, 50), pct(&mut la, 99));
        let (b50, b99) = (pct(&mut lb, 50), pct(&mut lb, 99));
        let r = |x: Duration, y: Duration| (y.as_secs_f64() / x.as_secs_f64() - 1.0) * 100.0;
        println!("| over HTTP on loopback | no authentication | JWT (RS256) | added |");
        println!("|---|---|---|---|");
        println!(
            "| word_count (P1) p50, n={} | {} | {} | {:+.1}% |",
            la.len(),
            ms(a50),
            ms(b50),
            r(a50, b50)
        );
        println!(
            "| word_count (P1) p99 | {} | {} | {:+.1}% |",
            ms(a99),
            ms(b99),
            r(a99, b99)
        );
        println!(
            "| sessions per second (initialize, tools/list, close), n={n_sessions} | {sa:.1} | {sb:.1} | {:+.1}% |",
            (sb / sa - 1.0) * 100.0
        );
        println!(
            "\nJWT validation alone (RS256, keys cached): {:.1} µs per request.",
            one.as_secs_f64() * 1e6
        );
    });
    let _ = idp.kill();
    let _ = idp.wait();
}
