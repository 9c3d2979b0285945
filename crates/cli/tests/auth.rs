//! `cordon serve --http --auth`: bearer-token authentication against a real
//! OAuth 2 authorization server on loopback (oauth2-mock-server, installed
//! by scripts/setup.sh; tests/fixtures/auth-server.mjs), with real MCP
//! clients (rmcp, the Python SDK). Every refusal is checked for its status
//! and its `WWW-Authenticate`; each is paired with a token that passes.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{Kill, Serve, TempDir, tempdir, text_of};
use cordon_mcp::rmcp;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

const MANIFEST: &str = common::WORD_COUNT;

fn npm_dir() -> PathBuf {
    std::env::var_os("CORDON_E2E_NPM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/cordon-e2e/npm"))
}

/// The authorization server.
struct Idp {
    _child: Kill,
    port: u16,
}

impl Idp {
    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn post(&self, path: &str, body: &Value) -> String {
        let (status, _, body) = raw(
            &format!("127.0.0.1:{}", self.port),
            "POST",
            path,
            &[("Content-Type", "application/json")],
            &body.to_string(),
        );
        assert_eq!(status, 200, "{path}: {body}");
        body
    }

    /// A JWT of the issuer with `claims` merged into the mock's defaults
    /// (`iss`, `iat`, `exp`, `nbf`).
    fn jwt(&self, claims: Value) -> String {
        self.post("/test/jwt", &json!({"claims": claims}))
    }

    fn jwt_with(&self, claims: Value, expires_in: i64, rogue: bool) -> String {
        self.post(
            "/test/jwt",
            &json!({"claims": claims, "expires_in": expires_in, "rogue": rogue}),
        )
    }

    fn opaque(&self, claims: Value) -> String {
        self.post("/test/opaque", &json!({"claims": claims}))
    }
}

fn start_idp() -> Option<Idp> {
    let npm = npm_dir();
    if !npm
        .join("node_modules/oauth2-mock-server/package.json")
        .is_file()
    {
        common::skip_or_fail(
            &common::this_test(),
            &format!(
                "oauth2-mock-server is not installed under {} (scripts/setup.sh)",
                npm.display()
            ),
        );
        return None;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/auth-server.mjs");
    let mut child = match Command::new("node")
        .arg(&script)
        .arg(&npm)
        .stdout(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            common::skip_or_fail(
                &common::this_test(),
                &format!("node cannot be started: {e}"),
            );
            return None;
        }
    };
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let port = line
        .trim()
        .strip_prefix("port ")
        .unwrap_or_else(|| panic!("auth server said {line:?}"))
        .parse()
        .unwrap();
    Some(Idp {
        _child: Kill(child),
        port,
    })
}

/// One HTTP/1.1 request on a fresh connection: status, head, body.
fn raw(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n{body}", body.len()));
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = Vec::new();
    let mut buf = [0u8; 8192];
    // Read to the end; an event stream (which stays open) up to its first
    // complete JSON-RPC message.
    loop {
        let n = s.read(&mut buf).unwrap_or(0);
        if n == 0 {
            break;
        }
        resp.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&resp);
        if let Some(i) = text.find("\r\n\r\n")
            && text[..i].to_ascii_lowercase().contains("text/event-stream")
            && text[i..]
                .split("\"jsonrpc\"")
                .nth(1)
                .is_some_and(|rest| rest.contains("\n\n"))
        {
            break;
        }
    }
    let text = String::from_utf8_lossy(&resp).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_string(), body.to_string())
}

fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

const INIT: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;

/// `POST /mcp` initialize with `authorization` (if any).
fn init(addr: &str, authorization: Option<&str>) -> (u16, String, String) {
    let mut h = vec![
        ("Content-Type", "application/json"),
        ("Accept", "application/json, text/event-stream"),
    ];
    if let Some(a) = authorization {
        h.push(("Authorization", a));
    }
    raw(addr, "POST", "/mcp", &h, INIT)
}

/// A running `cordon serve`.
struct Served {
    _child: cordon_testkit::serve::Http,
    url: String,
    addr: String,
    stderr: Vec<String>,
}

fn write_private(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// `cordon serve --http 127.0.0.1:0 --auth AUTH extra...`, waiting for it
/// to listen.
fn serve(dir: &TempDir, auth: &Path, extra: &[&str]) -> Served {
    let m = dir.path().join("cordon.yaml");
    std::fs::write(&m, MANIFEST).unwrap();
    let audit = dir.path().join("audit.jsonl");
    let child = Serve::manifest(env!("CARGO_BIN_EXE_cordon"), &m, &audit)
        .arg("--auth")
        .arg(auth)
        .args(extra)
        .http();
    Served {
        url: child.url.clone(),
        addr: child.addr(),
        stderr: child.stderr.clone(),
        _child: child,
    }
}

/// The authentication file for `idp` with resource `resource`.
fn jwt_auth(dir: &TempDir, idp: &Idp, resource: &str, extra: &str) -> PathBuf {
    let p = dir.path().join("auth.yaml");
    write_private(
        &p,
        &format!(
            "resource: {resource}\nissuer: {}\ntenant_claim: tenant\ngroups_claim: groups\nscopes: [mcp]\n{extra}",
            idp.url()
        ),
        0o644,
    );
    p
}

fn b64url(b: &[u8]) -> String {
    use std::fmt::Write;
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in b.chunks(3) {
        let n = chunk.iter().fold(0u32, |a, &x| (a << 8) | x as u32) << (8 * (3 - chunk.len()));
        for i in 0..=chunk.len() {
            out.write_char(ABC[((n >> (18 - 6 * i)) & 63) as usize] as char)
                .unwrap();
        }
    }
    out
}

fn b64url_decode(s: &str) -> Vec<u8> {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut bits = 0u32;
    let mut n = 0;
    let mut out = Vec::new();
    for c in s.bytes() {
        let v = ABC.iter().position(|&x| x == c).unwrap() as u32;
        bits = (bits << 6) | v;
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
        }
    }
    out
}

/// rmcp over streamable HTTP with a bearer token.
async fn rmcp_client(
    url: &str,
    token: &str,
    http: reqwest::Client,
) -> Result<rmcp::service::RunningService<rmcp::RoleClient, ()>, String> {
    let cfg = StreamableHttpClientTransportConfig::with_uri(url.to_owned()).auth_header(token);
    let t = rmcp::transport::StreamableHttpClientTransport::with_client(http, cfg);
    ().serve(t).await.map_err(|e| format!("{e:?}"))
}

async fn word_count(c: &rmcp::service::RunningService<rmcp::RoleClient, ()>) -> String {
    let mut p = CallToolRequestParams::new("word_count".to_owned());
    p.arguments = Some(json!({"text": "a b\nc\n"}).as_object().unwrap().clone());
    text_of(&c.peer().call_tool(p).await.expect("word_count"))
}

fn plain_http() -> reqwest::Client {
    cordon_mcp::install_crypto_provider();
    reqwest::Client::builder().no_proxy().build().unwrap()
}

const RESOURCE: &str = "http://127.0.0.1/mcp";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_bearer_tokens_are_checked_and_a_good_one_calls_a_tool() {
    let Some(idp) = start_idp() else { return };
    let dir = tempdir();
    let auth = jwt_auth(&dir, &idp, RESOURCE, "");
    let s = serve(&dir, &auth, &[]);
    assert!(
        s.stderr
            .iter()
            .any(|l| l
                .contains("authentication: bearer tokens for http://127.0.0.1/mcp: JWT (issuer")),
        "{:#?}",
        s.stderr
    );
    let meta_url = "http://127.0.0.1/.well-known/oauth-protected-resource/mcp";
    let challenge_meta = format!("resource_metadata=\"{meta_url}\"");
    let good = json!({"sub": "ann", "aud": RESOURCE, "tenant": "t1", "groups": ["dev"], "scope": "mcp", "azp": "agent-1"});

    // The metadata document, at both well-known paths, without a token.
    for path in [
        "/.well-known/oauth-protected-resource/mcp",
        "/.well-known/oauth-protected-resource",
    ] {
        let (st, _, body) = raw(&s.addr, "GET", path, &[], "");
        assert_eq!(st, 200, "{path}");
        let m: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(m["resource"], RESOURCE);
        assert_eq!(m["authorization_servers"], json!([idp.url()]));
        assert_eq!(m["scopes_supported"], json!(["mcp"]));
    }

    // No token: 401 with the metadata URL and no error code.
    let (st, head, _) = init(&s.addr, None);
    assert_eq!(st, 401, "{head}");
    assert_eq!(
        header(&head, "www-authenticate"),
        Some(format!("Bearer {challenge_meta}").as_str())
    );
    let refused = |auth: String, why: &str| {
        let (st, head, _) = init(&s.addr, Some(&auth));
        assert_eq!(st, 401, "{why}: {head}");
        let h = header(&head, "www-authenticate")
            .unwrap_or_default()
            .to_string();
        assert!(
            h.starts_with("Bearer error=\"invalid_token\"") && h.contains(&challenge_meta),
            "{why}: {h}"
        );
        assert!(h.contains(why), "{why}: {h}");
    };
    let bearer = |t: &str| format!("Bearer {t}");
    // Positive control on the raw path: the same request with a good token.
    let (st, head, _) = init(&s.addr, Some(&bearer(&idp.jwt(good.clone()))));
    assert_eq!(st, 200, "{head}");
    // Expired (well past the leeway).
    refused(bearer(&idp.jwt_with(good.clone(), -600, false)), "expired");
    // Another audience.
    let mut other = good.clone();
    other["aud"] = json!("https://other.example/mcp");
    refused(bearer(&idp.jwt(other)), "not for this resource");
    // A tampered payload under the original signature.
    let t = idp.jwt(good.clone());
    let parts: Vec<&str> = t.split('.').collect();
    let mut payload: Value = serde_json::from_slice(&b64url_decode(parts[1])).unwrap();
    payload["sub"] = json!("root");
    let forged = format!(
        "{}.{}.{}",
        parts[0],
        b64url(payload.to_string().as_bytes()),
        parts[2]
    );
    refused(bearer(&forged), "signature does not verify");
    // A flipped signature.
    let mut sig = b64url_decode(parts[2]);
    sig[0] ^= 1;
    refused(
        bearer(&format!("{}.{}.{}", parts[0], parts[1], b64url(&sig))),
        "signature does not verify",
    );
    // Signed by a key the issuer does not publish.
    refused(bearer(&idp.jwt_with(good.clone(), 300, true)), "no key");
    // alg none, and HS256 keyed with the issuer's public key material.
    let none = format!("{}.{}.", b64url(br#"{"alg":"none","typ":"JWT"}"#), parts[1]);
    refused(bearer(&none), "not a signed JWT");
    let header_kid: Value = serde_json::from_slice(&b64url_decode(parts[0])).unwrap();
    let hs = format!(
        "{}.{}.{}",
        b64url(
            json!({"alg": "HS256", "kid": header_kid["kid"]})
                .to_string()
                .as_bytes()
        ),
        parts[1],
        parts[2]
    );
    refused(bearer(&hs), "HS256 is refused");
    // No tenant claim while one is configured.
    let mut no_tenant = good.clone();
    no_tenant.as_object_mut().unwrap().remove("tenant");
    refused(bearer(&idp.jwt(no_tenant)), "no tenant claim");
    // A tenant no workspace or state directory could be named after is
    // refused here, once, by the volumes' own rule.
    for bad in [".hidden", "-", "-rf"] {
        let mut t = good.clone();
        t["tenant"] = json!(bad);
        refused(
            bearer(&idp.jwt(t)),
            &format!("the token's tenant `{bad}` cannot name a directory"),
        );
    }
    // Missing scope: 403 insufficient_scope.
    let mut no_scope = good.clone();
    no_scope["scope"] = json!("other");
    let (st, head, _) = init(&s.addr, Some(&bearer(&idp.jwt(no_scope))));
    assert_eq!(st, 403, "{head}");
    let h = header(&head, "www-authenticate").unwrap();
    assert!(
        h.starts_with("Bearer error=\"insufficient_scope\", scope=\"mcp\"")
            && h.contains(&challenge_meta),
        "{h}"
    );

    // The rmcp client with a good token lists and calls the P1 tool; the
    // audit record carries its principal and tenant.
    let c = rmcp_client(&s.url, &idp.jwt(good.clone()), plain_http())
        .await
        .unwrap();
    let tools = c.peer().list_all_tools().await.unwrap();
    assert!(tools.iter().any(|t| t.name == "word_count"));
    let out = word_count(&c).await;
    assert!(
        out.contains("2 3 6")
            || out
                .split_whitespace()
                .collect::<Vec<_>>()
                .windows(3)
                .any(|w| w == ["2", "3", "6"]),
        "{out}"
    );
    c.cancel().await.unwrap();
    let recs = common::audit_records(&dir.path().join("audit.jsonl"));
    let rec = recs
        .iter()
        .find(|r| r["tool"] == "word_count")
        .unwrap_or_else(|| panic!("no word_count record: {recs:#?}"));
    assert_eq!(rec["principal"], "ann", "{rec}");
    assert_eq!(rec["tenant"], "t1", "{rec}");
    // And without a token, the rmcp client cannot initialize.
    assert!(rmcp_client(&s.url, "", plain_http()).await.is_err());

    // The Python SDK with a token.
    python_client(&s.url, &idp.jwt(good));
}

/// The official Python SDK lists and calls word_count with `token`.
fn python_client(url: &str, token: &str) {
    let script = r#"
import asyncio, sys
try:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client, create_mcp_http_client
except ImportError as e:
    print(f"MISSING {e}"); sys.exit(2)
async def main(url, token):
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {token}"})
    async with http:
        async with streamable_http_client(url, http_client=http) as streams:
            async with ClientSession(streams[0], streams[1]) as s:
                await s.initialize()
                tools = [t.name for t in (await s.list_tools()).tools]
                assert "word_count" in tools, tools
                r = await s.call_tool("word_count", {"text": "a b\nc\n"})
                text = "".join(c.text for c in r.content if hasattr(c, "text"))
                assert "2" in text and "6" in text, text
                print("OK")
asyncio.run(main(sys.argv[1], sys.argv[2]))
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(url)
        .arg(token)
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.code() == Some(2) && stdout.contains("MISSING") {
        common::skip_or_fail(
            &common::this_test(),
            &format!("the Python mcp SDK: {stdout}"),
        );
        return;
    }
    assert!(
        out.status.success() && stdout.contains("OK"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A session opened by one principal is refused to another (403), and
/// stays usable by its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_principals_token_cannot_use_a_session() {
    let Some(idp) = start_idp() else { return };
    let dir = tempdir();
    let auth = jwt_auth(&dir, &idp, RESOURCE, "");
    let s = serve(&dir, &auth, &[]);
    let claims = |sub: &str, tenant: &str| json!({"sub": sub, "aud": RESOURCE, "tenant": tenant, "scope": "mcp"});
    let ann = format!("Bearer {}", idp.jwt(claims("ann", "t1")));
    let bob = format!("Bearer {}", idp.jwt(claims("bob", "t2")));
    let ann_other_tenant = format!("Bearer {}", idp.jwt(claims("ann", "t2")));
    let (st, head, _) = init(&s.addr, Some(&ann));
    assert_eq!(st, 200, "{head}");
    let sid = header(&head, "mcp-session-id").unwrap().to_string();
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let notified = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let post = |auth: &str, body: &str| {
        raw(
            &s.addr,
            "POST",
            "/mcp",
            &[
                ("Content-Type", "application/json"),
                ("Accept", "application/json, text/event-stream"),
                ("Mcp-Session-Id", &sid),
                ("MCP-Protocol-Version", "2025-06-18"),
                ("Authorization", auth),
            ],
            body,
        )
    };
    let (st, head, _) = post(&ann, notified);
    assert_eq!(st, 202, "{head}");
    for other in [&bob, &ann_other_tenant] {
        let (st, head, body) = post(other, list);
        assert_eq!(st, 403, "{head}");
        assert!(body.contains("another principal"), "{body}");
        assert!(!body.contains("word_count"), "{body}");
    }
    // The owner still lists its tools in that session.
    let (st, head, body) = post(&ann, list);
    assert_eq!(st, 200, "{head}");
    assert!(body.contains("word_count"), "{body}");
    // A made-up session id is not found.
    let (st, _, _) = raw(
        &s.addr,
        "POST",
        "/mcp",
        &[
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
            ("Mcp-Session-Id", "nope"),
            ("Authorization", &ann),
        ],
        list,
    );
    assert_eq!(st, 404);
}

/// Static tokens from a file: a good one calls; a wrong one is refused; a
/// file readable by others stops `cordon serve` before it listens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_tokens_good_wrong_and_too_open() {
    let dir = tempdir();
    let tokens = dir.path().join("tokens");
    let add = |name: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
            .args(["token", "add", name, "--tenant", "build", "--file"])
            .arg(&tokens)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    };
    let t = add("ci");
    assert!(!std::fs::read_to_string(&tokens).unwrap().contains(&t));
    let auth = dir.path().join("auth.yaml");
    write_private(
        &auth,
        &format!(
            "resource: {RESOURCE}\nstatic_tokens: {}\n",
            tokens.display()
        ),
        0o600,
    );
    let s = serve(&dir, &auth, &[]);
    let (st, head, _) = init(&s.addr, Some(&format!("Bearer {t}")));
    assert_eq!(st, 200, "{head}");
    let mut wrong = t.clone();
    let last = wrong.pop().unwrap();
    wrong.push(if last == 'A' { 'B' } else { 'A' });
    let (st, head, _) = init(&s.addr, Some(&format!("Bearer {wrong}")));
    assert_eq!(st, 401, "{head}");
    assert!(
        header(&head, "www-authenticate")
            .unwrap()
            .contains("invalid_token")
    );
    let c = rmcp_client(&s.url, &t, plain_http()).await.unwrap();
    assert!(word_count(&c).await.contains('6'));
    c.cancel().await.unwrap();
    drop(s);

    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o640)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["serve", "--http", "127.0.0.1:0", "--no-probe", "-m"])
        .arg(dir.path().join("cordon.yaml"))
        .arg("--auth")
        .arg(&auth)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("mode 0640") && err.contains(&tokens.display().to_string()),
        "{err}"
    );
    // The authentication file itself, writable by others: refused too.
    std::fs::set_permissions(&tokens, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(&auth, std::fs::Permissions::from_mode(0o666)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["serve", "--http", "127.0.0.1:0", "--no-probe", "-m"])
        .arg(dir.path().join("cordon.yaml"))
        .arg("--auth")
        .arg(&auth)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("writable by group or others"),
        "{err}"
    );
}

/// Opaque tokens through RFC 7662 introspection at the authorization server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn introspected_tokens() {
    let Some(idp) = start_idp() else { return };
    let dir = tempdir();
    let secret = dir.path().join("introspect.secret");
    write_private(&secret, "introspect-secret\n", 0o600);
    let auth = dir.path().join("auth.yaml");
    write_private(
        &auth,
        &format!(
            "resource: {RESOURCE}\nauthorization_servers: [{}]\nintrospection:\n  endpoint: {}/introspect\n  client_id: cordon-rs\n  client_secret_file: {}\ntenant_claim: tenant\n",
            idp.url(),
            idp.url(),
            secret.display()
        ),
        0o600,
    );
    let s = serve(&dir, &auth, &[]);
    let good =
        idp.opaque(json!({"sub": "svc", "aud": RESOURCE, "tenant": "t9", "client_id": "c9"}));
    let (st, head, _) = init(&s.addr, Some(&format!("Bearer {good}")));
    assert_eq!(st, 200, "{head}");
    let c = rmcp_client(&s.url, &good, plain_http()).await.unwrap();
    assert!(word_count(&c).await.contains('6'));
    c.cancel().await.unwrap();
    for (token, why) in [
        ("0123456789abcdef".to_string(), "not active"),
        (
            idp.opaque(json!({"sub": "svc", "aud": "https://other.example", "tenant": "t9"})),
            "not for this resource",
        ),
        (
            idp.opaque(json!({"sub": "svc", "aud": RESOURCE, "tenant": "t9", "exp": 1000})),
            "expired",
        ),
    ] {
        let (st, head, _) = init(&s.addr, Some(&format!("Bearer {token}")));
        assert_eq!(st, 401, "{why}: {head}");
        let h = header(&head, "www-authenticate").unwrap();
        assert!(h.contains("invalid_token") && h.contains(why), "{why}: {h}");
    }
    let recs = common::audit_records(&dir.path().join("audit.jsonl"));
    assert!(
        recs.iter()
            .any(|r| r["principal"] == "svc" && r["tenant"] == "t9"),
        "{recs:#?}"
    );
}

/// HTTPS on loopback with a certificate made here: a client that trusts
/// it calls a tool; plain HTTP to the TLS port gets no MCP answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_on_loopback() {
    let dir = tempdir();
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    write_private(&cert, &ck.cert.pem(), 0o644);
    write_private(&key, &ck.signing_key.serialize_pem(), 0o600);
    let tokens = dir.path().join("tokens");
    let t = cordon_auth::static_tokens::add(&tokens, "ci", None, &[]).unwrap();
    let auth = dir.path().join("auth.yaml");
    write_private(
        &auth,
        &format!(
            "resource: https://127.0.0.1/mcp\nstatic_tokens: {}\n",
            tokens.display()
        ),
        0o600,
    );
    let s = serve(
        &dir,
        &auth,
        &[
            "--tls-cert",
            cert.to_str().unwrap(),
            "--tls-key",
            key.to_str().unwrap(),
        ],
    );
    assert!(s.url.starts_with("https://127.0.0.1:"), "{}", s.url);
    assert!(
        s.stderr.iter().any(|l| l.contains("TLS: on")),
        "{:#?}",
        s.stderr
    );
    cordon_mcp::install_crypto_provider();
    let trusting = reqwest::Client::builder()
        .no_proxy()
        .tls_certs_only([reqwest::Certificate::from_pem(ck.cert.pem().as_bytes()).unwrap()])
        .build()
        .unwrap();
    let c = rmcp_client(&s.url, &t, trusting.clone()).await.unwrap();
    assert!(word_count(&c).await.contains('6'));
    c.cancel().await.unwrap();
    // The metadata over HTTPS.
    let meta = trusting
        .get(format!(
            "https://{}/.well-known/oauth-protected-resource/mcp",
            s.addr
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(meta.status(), 200);
    // A client that does not trust the certificate cannot connect, and
    // plain HTTP on the port is not served.
    let untrusting = reqwest::Client::builder().no_proxy().build().unwrap();
    assert!(rmcp_client(&s.url, &t, untrusting).await.is_err());
    let (st, _, _) = init(&s.addr, Some(&format!("Bearer {t}")));
    assert_eq!(st, 0, "plain HTTP got an HTTP answer");
}

/// The issuer becomes unreachable: its keys, past their cache lifetime, are
/// used for at most `jwks_max_stale_seconds` more; after that every token
/// is refused as uncheckable (503), not accepted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_an_unreachable_issuer_are_used_only_within_the_staleness_bound() {
    let Some(idp) = start_idp() else { return };
    let dir = tempdir();
    let auth = jwt_auth(
        &dir,
        &idp,
        RESOURCE,
        "jwks_cache_seconds: 1\njwks_max_stale_seconds: 20\njwks_refetch_floor_seconds: 0\n",
    );
    let s = serve(&dir, &auth, &[]);
    let token = format!(
        "Bearer {}",
        idp.jwt(json!({"sub": "ann", "aud": RESOURCE, "tenant": "t1", "scope": "mcp"}))
    );
    let (st, head, _) = init(&s.addr, Some(&token));
    assert_eq!(st, 200, "{head}");
    // The issuer goes away; the keys were last fetched before this.
    drop(idp);
    let down = std::time::Instant::now();
    // Past the keys' 1 s lifetime, within the 20 s after it: a fetch is
    // tried, fails, and the cached keys still verify.
    std::thread::sleep(std::time::Duration::from_secs(2));
    let (st, head, _) = init(&s.addr, Some(&token));
    assert_eq!(st, 200, "within the bound: {head}");
    // Past 1 + 20 s: refused as uncheckable, with no principal.
    let bound = std::time::Duration::from_secs(1 + 20 + 2);
    std::thread::sleep(bound.saturating_sub(down.elapsed()));
    let (st, head, body) = init(&s.addr, Some(&token));
    assert_eq!(st, 503, "past the bound: {head}");
    assert_eq!(body, "the token cannot be checked now", "{head}");
    assert_eq!(
        header(&head, "www-authenticate"),
        Some(
            "Bearer resource_metadata=\"http://127.0.0.1/.well-known/oauth-protected-resource/mcp\""
        )
    );
    assert!(header(&head, "mcp-session-id").is_none(), "{head}");
}

/// With an issuer configured, an introspection answer that names no `iss`
/// is refused; one naming the issuer passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn introspection_answers_without_the_issuer_are_refused() {
    let Some(idp) = start_idp() else { return };
    let dir = tempdir();
    let secret = dir.path().join("introspect.secret");
    write_private(&secret, "introspect-secret\n", 0o600);
    let auth = dir.path().join("auth.yaml");
    write_private(
        &auth,
        &format!(
            "resource: {RESOURCE}\nissuer: {}\nintrospection:\n  endpoint: {}/introspect\n  client_id: cordon-rs\n  client_secret_file: {}\n",
            idp.url(),
            idp.url(),
            secret.display()
        ),
        0o600,
    );
    let s = serve(&dir, &auth, &[]);
    let with_iss = idp.opaque(json!({"sub": "svc", "aud": RESOURCE, "iss": idp.url()}));
    let (st, head, _) = init(&s.addr, Some(&format!("Bearer {with_iss}")));
    assert_eq!(st, 200, "{head}");
    let without = idp.opaque(json!({"sub": "svc", "aud": RESOURCE}));
    let (st, head, _) = init(&s.addr, Some(&format!("Bearer {without}")));
    assert_eq!(st, 401, "{head}");
    let h = header(&head, "www-authenticate").unwrap();
    assert!(
        h.contains("invalid_token") && h.contains("the introspection answer names no issuer"),
        "{h}"
    );
    let other = idp.opaque(json!({"sub": "svc", "aud": RESOURCE, "iss": "https://evil.example"}));
    let (st, head, _) = init(&s.addr, Some(&format!("Bearer {other}")));
    assert_eq!(st, 401, "{head}");
    assert!(
        header(&head, "www-authenticate")
            .unwrap()
            .contains("not issued by"),
        "{head}"
    );
}

/// `cordon serve --tls-key`: the key is refused when group or others may
/// read it, or when neither this user nor root owns it; owned by this user
/// with mode 0600 it is served.
#[test]
fn a_tls_key_of_another_owner_or_too_open_is_refused() {
    let dir = tempdir();
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    write_private(&cert, &ck.cert.pem(), 0o644);
    write_private(&key, &ck.signing_key.serialize_pem(), 0o640);
    let m = dir.path().join("cordon.yaml");
    std::fs::write(&m, MANIFEST).unwrap();
    let start = || {
        let child = Command::new(env!("CARGO_BIN_EXE_cordon"))
            .args(["serve", "--http", "127.0.0.1:0", "--no-probe", "-m"])
            .arg(&m)
            .arg("--tls-cert")
            .arg(&cert)
            .arg("--tls-key")
            .arg(&key)
            .env("CORDON_AUDIT", dir.path().join("audit.jsonl"))
            .env("CORDON_STATE_DIR", dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // A server that starts (the key taken) is stopped and said to
        // have started, rather than waited for.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut child = Kill(child);
        let status = loop {
            if let Some(st) = child.0.try_wait().unwrap() {
                break Some(st);
            }
            if std::time::Instant::now() > deadline {
                let _ = child.0.kill();
                break None;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        };
        let mut err = String::new();
        child
            .0
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (status.is_some_and(|s| s.success()) || status.is_none(), err)
    };
    let shown = key.display().to_string();
    let (served, err) = start();
    assert!(!served, "{err}");
    assert!(
        err.contains(&format!(
            "{shown}: the TLS key is readable or writable by group or others (mode 0640)"
        )),
        "{err}"
    );
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let me = std::fs::metadata(dir.path()).map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.uid()
    });
    match std::os::unix::fs::chown(&key, Some(65534), None) {
        Ok(()) => {
            let (served, err) = start();
            assert!(!served, "{err}");
            assert!(
                err.contains(&format!(
                    "{shown}: the TLS key is owned by uid 65534, neither this user"
                )),
                "{err}"
            );
            std::os::unix::fs::chown(&key, Some(*me.as_ref().unwrap()), None).unwrap();
        }
        Err(e) => common::skip_or_fail(
            &common::this_test(),
            &format!("the key cannot be given to uid 65534 (not root?): {e}"),
        ),
    }
    // Positive control: owned by this user, mode 0600: served over TLS.
    let s = Serve::manifest(
        env!("CARGO_BIN_EXE_cordon"),
        &m,
        &dir.path().join("audit.jsonl"),
    )
    .arg("--no-probe")
    .arg("--tls-cert")
    .arg(&cert)
    .arg("--tls-key")
    .arg(&key)
    .http();
    assert!(s.url.starts_with("https://127.0.0.1:"), "{}", s.url);
}

/// What a raw connection saw before the server closed it, or `None` when it
/// was still open at `deadline`. `send` is called every second (a header
/// line at a time, or nothing) while it waits.
fn closed_within(
    mut c: std::net::TcpStream,
    deadline: std::time::Duration,
    mut send: impl FnMut(&mut std::net::TcpStream, u32),
) -> Option<String> {
    let start = std::time::Instant::now();
    c.set_read_timeout(Some(std::time::Duration::from_secs(1)))
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let mut tick = 0;
    while start.elapsed() < deadline {
        match c.read(&mut buf) {
            Ok(0) => return Some(String::from_utf8_lossy(&got).into_owned()),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                tick += 1;
                send(&mut c, tick);
            }
            Err(_) => return Some(String::from_utf8_lossy(&got).into_owned()),
        }
    }
    None
}

/// A static-token setup for the connection tests: the auth file and a token.
fn static_auth(dir: &TempDir) -> (PathBuf, String) {
    let tokens = dir.path().join("tokens");
    let t = cordon_auth::static_tokens::add(&tokens, "ci", None, &[]).unwrap();
    let auth = dir.path().join("auth.yaml");
    write_private(
        &auth,
        &format!(
            "resource: {RESOURCE}\nstatic_tokens: {}\n",
            tokens.display()
        ),
        0o600,
    );
    (auth, t)
}

/// What a slow client sends on each tick of [`closed_within`].
type Sender = Box<dyn FnMut(&mut std::net::TcpStream, u32) + Send>;

/// Connections that send nothing, half a request, a header line every
/// second, or half a body are closed by the header and body timeouts; a
/// whole request is still answered.
#[test]
fn half_sent_requests_are_closed_by_the_timeouts() {
    let dir = tempdir();
    let (auth, t) = static_auth(&dir);
    let s = serve(
        &dir,
        &auth,
        &["--header-timeout", "3", "--body-timeout", "3"],
    );
    let generous = std::time::Duration::from_secs(60);
    let connect = || std::net::TcpStream::connect(&s.addr).unwrap();
    let bearer = format!("Bearer {t}");
    let cases: Vec<(&str, Sender)> = vec![
        ("nothing sent", Box::new(|_, _| {})),
        (
            "half a request head",
            Box::new(|c, tick| {
                if tick == 1 {
                    let _ = c.write_all(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n");
                }
            }),
        ),
        (
            "a header line every second",
            Box::new(|c, tick| {
                let _ = if tick == 1 {
                    c.write_all(b"POST /mcp HTTP/1.1\r\n")
                } else {
                    c.write_all(format!("X-Slow-{tick}: {tick}\r\n").as_bytes())
                };
            }),
        ),
        (
            "half a body, with a good token",
            Box::new(move |c, tick| {
                if tick == 1 {
                    let _ = c.write_all(
                        format!(
                            "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: {bearer}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{}",
                            INIT.len() + 100,
                            INIT
                        )
                        .as_bytes(),
                    );
                }
            }),
        ),
        (
            "idle after a refused request",
            Box::new(|c, tick| {
                if tick == 1 {
                    let _ = c.write_all(
                        b"GET /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n",
                    );
                }
            }),
        ),
    ];
    let waits: Vec<_> = cases
        .into_iter()
        .map(|(what, send)| {
            let c = connect();
            (
                what,
                std::thread::spawn(move || closed_within(c, generous, send)),
            )
        })
        .collect();
    for (what, w) in waits {
        let seen = w.join().unwrap();
        let Some(seen) = seen else {
            panic!("{what}: the connection was still open after {generous:?}");
        };
        match what {
            "idle after a refused request" => {
                assert!(seen.starts_with("HTTP/1.1 401"), "{what}: {seen}")
            }
            "half a body, with a good token" => {}
            _ => assert!(seen.is_empty(), "{what}: {seen}"),
        }
    }
    // Positive control: a whole request is answered.
    let (st, head, _) = init(&s.addr, Some(&format!("Bearer {t}")));
    assert_eq!(st, 200, "{head}");
}

/// The head of a response read from `c` (after sending `req`).
fn response_head(c: &mut std::net::TcpStream, req: &str) -> String {
    c.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    c.write_all(req.as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// At most `--max-pending-connections` connections may wait without an
/// authenticated request; one beyond is closed unanswered, and a
/// connection whose request was authenticated no longer counts.
#[test]
fn connections_beyond_the_pending_bound_are_closed() {
    let dir = tempdir();
    let (auth, t) = static_auth(&dir);
    let s = serve(
        &dir,
        &auth,
        &["--max-pending-connections", "2", "--header-timeout", "600"],
    );
    let connect = || std::net::TcpStream::connect(&s.addr).unwrap();
    let request = format!(
        "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {t}\r\nContent-Type: application/json\r\nAccept: application/json, text/event-stream\r\nContent-Length: {}\r\n\r\n{INIT}",
        INIT.len()
    );
    // One idle connection, and one whose request is authenticated and
    // which stays open: only the first counts, so a third is served.
    let idle = connect();
    let mut authed = connect();
    let head = response_head(&mut authed, &request);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let head = response_head(&mut connect(), &request);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    // A second idle one: two are pending, so the next is closed
    // unanswered, whatever it sends.
    let idle2 = connect();
    std::thread::sleep(std::time::Duration::from_millis(500));
    let head = response_head(&mut connect(), &request);
    assert_eq!(head, "", "a connection beyond the bound was answered");
    // Once the idle ones are gone, connections are served again.
    drop((idle, idle2));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let head = response_head(&mut connect(), &request);
        if head.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "still refused after the idle connections closed: {head:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    drop(authed);
}
