//! Session lifetime and caps at the door of the HTTP gateway, with real
//! MCP clients (rmcp, the Python SDK) on loopback and principals from a
//! test authenticator (a header names the caller):
//!
//! - a burst above a tool's `max_concurrent` gets exactly the busy refusals
//!   beyond its queue bound, and a call under the cap then succeeds;
//! - a principal's `calls_per_minute` and `sessions` and the gateway's
//!   `max_sandboxes` hold, each refusal typed and audited with the
//!   principal;
//! - calls in flight per principal and per tenant hold, and one tenant
//!   holding long calls leaves another tenant served; a tenant at its fair
//!   share of `max_sandboxes` leaves the rest to another that wants them;
//! - stateless HTTP requests count against a principal's `sessions`, and
//!   a session's `GET` SSE streams are capped;
//! - an idle session is ended (audited so), and a later request with its id
//!   is answered `404` saying it expired;
//! - clients that go away mid-call (an rmcp client dropped, a Python client
//!   killed with SIGKILL) leave no sandbox and no process behind, checked by
//!   a scan of /proc.
//!
//! The tests of this file run one at a time: the process scan counts every
//! descendant of the test process.

use cordon_testkit::skip;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cordon_mcp::http::{Authenticated, Authenticator};
use cordon_mcp::rmcp;
use cordon_mcp::{Gateway, GatewayOptions, HttpOptions};
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, JsonObject};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The caller is whoever the `x-test-principal` header names
/// (`subject@tenant`, or a subject of the default tenant).
struct HeaderAuth;

impl Authenticator for HeaderAuth {
    fn authenticate<'a>(
        &'a self,
        parts: &'a axum::http::request::Parts,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Authenticated> + Send + 'a>> {
        Box::pin(async move {
            let mut p = cordon_auth::Principal::unauthenticated();
            if let Some(who) = parts
                .headers
                .get("x-test-principal")
                .and_then(|v| v.to_str().ok())
            {
                match who.split_once('@') {
                    Some((subject, tenant)) => {
                        p.subject = subject.to_string();
                        p.tenant = tenant.to_string();
                    }
                    None => p.subject = who.to_string(),
                }
            }
            Ok(p)
        })
    }
}

struct Served {
    url: String,
    audit: PathBuf,
    _gateway: cordon_testkit::serve::Gateway,
    _dir: cordon_testkit::Scratch,
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .canonicalize()
        .expect("fixtures dir")
}

/// Serve `manifest` over HTTP on loopback (every tool of it must be served
/// here: a tool this host cannot run fails the test unless skipping is
/// allowed, then `None`).
async fn serve(test: &str, manifest: &str) -> Option<Served> {
    let dir = cordon_testkit::scratch();
    let path = dir.path().join("cordon.yaml");
    std::fs::write(&path, manifest).unwrap();
    let audit = dir.path().join("audit.jsonl");
    let opts = GatewayOptions {
        audit: Some(audit.clone()),
        ..GatewayOptions::default()
    };
    let gw = Gateway::from_manifest(&path, &opts).unwrap_or_else(|e| panic!("{e}"));
    let loaded = cordon_policy::load(&path).unwrap();
    let served = gw.tool_names();
    if served.len() != loaded.policy.tools.len() {
        skip::skip_or_fail(
            test,
            &format!(
                "not every tool is served here: {:?}",
                gw.warnings().to_vec()
            ),
        );
        return None;
    }
    let http = HttpOptions {
        authenticator: Some(Arc::new(HeaderAuth)),
        ..HttpOptions::default()
    };
    let gateway = cordon_testkit::serve::gateway(gw, http).await;
    Some(Served {
        url: gateway.url.clone(),
        audit,
        _gateway: gateway,
        _dir: dir,
    })
}

type Client = RunningService<RoleClient, ()>;

/// An rmcp client over HTTP as `who`.
async fn client(url: &str, who: &str) -> Result<Client, String> {
    cordon_mcp::install_crypto_provider();
    let mut headers = HashMap::new();
    headers.insert(
        reqwest::header::HeaderName::from_static("x-test-principal"),
        reqwest::header::HeaderValue::from_str(who).unwrap(),
    );
    let mut config = StreamableHttpClientTransportConfig::with_uri(url.to_owned());
    config.custom_headers = headers;
    config.reinit_on_expired_session = false;
    let t = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    ().serve(t).await.map_err(|e| e.to_string())
}

async fn call(c: &Client, tool: &str) -> Result<rmcp::model::CallToolResult, ServiceError> {
    let mut p = CallToolRequestParams::new(tool.to_owned());
    p.arguments = Some(JsonObject::new());
    c.peer().call_tool(p).await
}

fn status_of(e: &ServiceError) -> String {
    match e {
        ServiceError::McpError(e) => e
            .data
            .as_ref()
            .and_then(|d| d.get("cordon/status"))
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        other => format!("not an MCP error: {other:?}"),
    }
}

fn records(audit: &Path) -> Vec<Value> {
    std::fs::read_to_string(audit)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// Poll (up to 60 s) until `f` holds.
async fn eventually(mut f: impl FnMut() -> bool) -> bool {
    for _ in 0..600 {
        if f() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    f()
}

/// Every process descended from this one, with its command line.
fn descendants() -> Vec<(i32, String)> {
    let me = std::process::id() as i32;
    let mut parent = HashMap::new();
    let mut cmd = HashMap::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // `pid (comm) state ppid ...`: comm may hold spaces.
        let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        parent.insert(pid, ppid);
        let c = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        cmd.insert(pid, String::from_utf8_lossy(&c).replace('\0', " "));
    }
    let mut out = Vec::new();
    for (&pid, _) in parent.iter() {
        let mut p = pid;
        let mut hops = 0;
        while let Some(&pp) = parent.get(&p) {
            if pp == me {
                out.push((pid, cmd.get(&pid).cloned().unwrap_or_default()));
                break;
            }
            p = pp;
            hops += 1;
            if hops > 64 {
                break;
            }
        }
    }
    out
}

fn with_marker(marker: &str) -> Vec<(i32, String)> {
    descendants()
        .into_iter()
        .filter(|(_, c)| c.contains(marker))
        .collect()
}

const SLOW: &str = r#"
  slow:
    profile: P1
    description: Sleep six seconds.
    command: [/bin/sleep, "6"]
    limits: {wall_seconds: 60}
    max_concurrent: 2
    queue_seconds: 1
  quick:
    profile: P1
    description: Say hi.
    command: [/bin/echo, hi]
"#;

fn caps_manifest() -> String {
    format!(
        "version: 1\ngateway:\n  per_principal: {{calls_per_minute: 5, sessions: 2}}\ntools:{SLOW}"
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_above_max_concurrent_gets_exactly_the_busy_refusals() {
    let _one = SERIAL.lock().await;
    let test = "a_burst_above_max_concurrent_gets_exactly_the_busy_refusals";
    let Some(s) = serve(test, &caps_manifest()).await else {
        return;
    };
    // Five sessions of five principals (no rate or session cap in play),
    // each calling `slow` at once: two run, three wait their second and
    // are refused (a call takes six).
    let mut clients = Vec::new();
    for i in 0..5 {
        clients.push(Arc::new(
            client(&s.url, &format!("burst-{i}")).await.unwrap(),
        ));
    }
    let mut set = tokio::task::JoinSet::new();
    for c in &clients {
        let c = c.clone();
        set.spawn(async move { call(&c, "slow").await });
    }
    let (mut ok, mut busy, mut other) = (0, 0, Vec::new());
    while let Some(r) = set.join_next().await {
        match r.unwrap() {
            Ok(r) if r.is_error != Some(true) => ok += 1,
            Ok(r) => other.push(format!("{r:?}")),
            Err(e) if status_of(&e) == "busy" => busy += 1,
            Err(e) => other.push(format!("{e:?}")),
        }
    }
    assert_eq!((ok, busy), (2, 3), "other outcomes: {other:?}");
    assert!(other.is_empty(), "{other:?}");
    // Positive control: under the cap, a call runs.
    let r = call(&clients[0], "slow")
        .await
        .expect("a call under the cap");
    assert_ne!(r.is_error, Some(true), "{r:?}");
    let busy_records: Vec<Value> = records(&s.audit)
        .into_iter()
        .filter(|r| r["status"] == "busy")
        .collect();
    assert_eq!(busy_records.len(), 3, "{busy_records:#?}");
    for r in &busy_records {
        assert_eq!(r["tool"], "slow");
        assert_eq!(r["limits_hit"], json!(["max_concurrent"]), "{r}");
        assert!(
            r["principal"]
                .as_str()
                .is_some_and(|p| p.starts_with("burst-")),
            "{r}"
        );
    }
    for c in clients {
        if let Ok(c) = Arc::try_unwrap(c) {
            let _ = c.cancel().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_principals_rate_and_sessions_hold() {
    let _one = SERIAL.lock().await;
    let test = "a_principals_rate_and_sessions_hold";
    let Some(s) = serve(test, &caps_manifest()).await else {
        return;
    };
    // Rate: five calls a minute; the sixth is refused, typed and audited.
    let a = client(&s.url, "rater").await.unwrap();
    for _ in 0..5 {
        let r = call(&a, "quick").await.expect("a call within the rate");
        assert_ne!(r.is_error, Some(true), "{r:?}");
    }
    let e = call(&a, "quick").await.unwrap_err();
    assert_eq!(status_of(&e), "rate_limited", "{e:?}");
    // Another principal is not held by it.
    let b = client(&s.url, "other").await.unwrap();
    call(&b, "quick").await.expect("another principal's call");
    let recs = records(&s.audit);
    let limited: Vec<&Value> = recs
        .iter()
        .filter(|r| r["status"] == "busy" && r["limits_hit"] == json!(["calls_per_minute"]))
        .collect();
    assert_eq!(limited.len(), 1, "{recs:#?}");
    assert_eq!(limited[0]["principal"], "rater");

    // Sessions: two at once; the third is refused at initialize.
    let s1 = client(&s.url, "sess").await.expect("first session");
    let s2 = client(&s.url, "sess").await.expect("second session");
    let third = client(&s.url, "sess").await;
    let Err(err) = third else {
        panic!("a third session of `sess` was accepted");
    };
    assert!(err.contains("sessions open already"), "{err}");
    assert!(
        records(&s.audit).iter().any(|r| r["status"] == "busy"
            && r["limits_hit"] == json!(["sessions"])
            && r["principal"] == "sess"),
        "no audited session refusal"
    );
    // Positive control: once one ends, a new one opens.
    s1.cancel().await.unwrap();
    let mut again = None;
    for _ in 0..100 {
        if let Ok(c) = client(&s.url, "sess").await {
            again = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let again = again.expect("a session after one ended");
    call(&again, "quick")
        .await
        .expect("a call of the new session");
    for c in [again, s2, a, b] {
        let _ = c.cancel().await;
    }
}

/// A raw streamable HTTP request: the status, the session id it names and
/// the body.
async fn post(url: &str, session: Option<&str>, body: Value) -> (u16, Option<String>, String) {
    cordon_mcp::install_crypto_provider();
    let mut r = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("x-test-principal", "idler")
        .body(body.to_string());
    if let Some(s) = session {
        r = r
            .header("mcp-session-id", s)
            .header("mcp-protocol-version", "2025-06-18");
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    let id = resp
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    (status, id, resp.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_session_is_ended_audited_and_then_said_expired() {
    let _one = SERIAL.lock().await;
    let test = "an_idle_session_is_ended_audited_and_then_said_expired";
    let m = format!("version: 1\ngateway: {{idle_timeout: 2s}}\ntools:{SLOW}");
    let Some(s) = serve(test, &m).await else {
        return;
    };
    let (status, id, body) = post(
        &s.url,
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "idle-test", "version": "1"}}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let id = id.expect("a session id");
    let (status, _, body) = post(
        &s.url,
        Some(&id),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "quick", "arguments": {}}});
    // Positive control: the live session answers.
    let (status, _, body) = post(&s.url, Some(&id), call.clone()).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("hi"), "{body}");
    // Then nothing for its idle timeout: the session is ended.
    let ended = eventually(|| {
        records(&s.audit)
            .iter()
            .any(|r| r["status"] == "session_ended" && r["principal"] == "idler")
    })
    .await;
    assert!(ended, "no session_ended record: {:#?}", records(&s.audit));
    let rec = records(&s.audit)
        .into_iter()
        .find(|r| r["status"] == "session_ended")
        .unwrap();
    let reason = rec["reason"].as_str().unwrap_or("");
    assert!(
        reason.contains("idle") && reason.contains("idle_timeout"),
        "{reason}"
    );
    let (status, _, body) = post(&s.url, Some(&id), call.clone()).await;
    assert_eq!(status, 404, "{body}");
    assert!(
        body.contains("session expired") && body.contains("idle"),
        "{body}"
    );
    // An id that never existed gets rmcp's plain 404.
    let (status, _, body) = post(&s.url, Some("no-such-session"), call).await;
    assert_eq!(status, 404, "{body}");
    assert!(!body.contains("expired"), "{body}");
}

fn fixture_manifest(marker: &str) -> String {
    format!(
        r#"version: 1
gateway: {{disconnect_grace: 1s}}
tools:
  fx:
    profile: P2
    description: The fixture MCP server.
    network: none
    limits: {{wall_seconds: 600, memory: 256M, tasks: 16}}
    mounts: ["{fixtures}:{marker}"]
    mcp:
      command: ["/usr/bin/python3", "{marker}/fixture_server.py"]
      tools:
        allow: [echo, hang]
"#,
        fixtures = fixtures().display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_rmcp_client_dropped_mid_call_leaves_nothing_behind() {
    let _one = SERIAL.lock().await;
    let test = "an_rmcp_client_dropped_mid_call_leaves_nothing_behind";
    let marker = format!("/srv/caps-rmcp-{}", std::process::id());
    let Some(s) = serve(test, &fixture_manifest(&marker)).await else {
        return;
    };
    assert!(
        eventually(|| descendants().is_empty()).await,
        "{:?}",
        descendants()
    );
    let c = client(&s.url, "dropper").await.unwrap();
    // Positive control: the server runs, in its sandbox, as our descendant.
    let r = c
        .peer()
        .call_tool({
            let mut p = CallToolRequestParams::new("fx__echo");
            p.arguments = json!({"text": "x"}).as_object().cloned();
            p
        })
        .await
        .expect("fx__echo");
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert!(!with_marker(&marker).is_empty(), "{:?}", descendants());
    let c = Arc::new(c);
    let c2 = c.clone();
    let hung = tokio::spawn(async move { call(&c2, "fx__hang").await });
    tokio::time::sleep(Duration::from_millis(500)).await;
    hung.abort();
    drop(c);
    let gone = eventually(|| descendants().is_empty()).await;
    assert!(gone, "left behind: {:?}", descendants());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn max_sandboxes_holds_for_servers_and_calls() {
    let _one = SERIAL.lock().await;
    let test = "max_sandboxes_holds_for_servers_and_calls";
    let marker = format!("/srv/caps-max-{}", std::process::id());
    let m = fixture_manifest(&marker).replace(
        "gateway: {disconnect_grace: 1s}",
        "gateway: {max_sandboxes: 1}",
    ) + "  quick:\n    profile: P1\n    command: [/bin/echo, hi]\n";
    let Some(s) = serve(test, &m).await else {
        return;
    };
    let echo = |c: &Client| {
        let mut p = CallToolRequestParams::new("fx__echo");
        p.arguments = json!({"text": "x"}).as_object().cloned();
        let peer = c.peer().clone();
        async move { peer.call_tool(p).await }
    };
    // Session a's server takes the one sandbox.
    let a = client(&s.url, "holder").await.unwrap();
    let r = echo(&a).await.expect("the first server starts");
    assert_ne!(r.is_error, Some(true), "{r:?}");
    // Session b can start neither its server nor a command call.
    let b = client(&s.url, "waiter").await.unwrap();
    let e = echo(&b).await.unwrap_err();
    assert_eq!(status_of(&e), "busy", "{e:?}");
    let e = call(&b, "quick").await.unwrap_err();
    assert_eq!(status_of(&e), "busy", "{e:?}");
    let recs = records(&s.audit);
    let refused: Vec<&Value> = recs
        .iter()
        .filter(|r| r["status"] == "busy" && r["limits_hit"] == json!(["max_sandboxes"]))
        .collect();
    assert_eq!(refused.len(), 2, "{recs:#?}");
    assert!(
        refused.iter().all(|r| r["principal"] == "waiter"),
        "{refused:#?}"
    );
    // Once a's session ends (its server stopped), b's server starts.
    a.cancel().await.unwrap();
    let mut ok = false;
    for _ in 0..300 {
        if let Ok(r) = echo(&b).await {
            ok = r.is_error != Some(true);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(ok, "b's server never started: {:#?}", records(&s.audit));
    b.cancel().await.unwrap();
}

const PY_CLIENT: &str = r#"
import asyncio, sys
import httpx2
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

async def main(url):
    http = httpx2.AsyncClient(headers={"x-test-principal": "killed"}, timeout=None)
    async with streamable_http_client(url, http_client=http) as streams:
        async with ClientSession(streams[0], streams[1]) as s:
            await s.initialize()
            r = await s.call_tool("fx__echo", {"text": "x"})
            print("echoed", flush=True)
            await s.call_tool("fx__hang", {})

asyncio.run(main(sys.argv[1]))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_python_client_killed_mid_call_leaves_nothing_behind() {
    let _one = SERIAL.lock().await;
    let test = "a_python_client_killed_mid_call_leaves_nothing_behind";
    match std::process::Command::new("python3")
        .args(["-c", "import mcp, httpx2"])
        .output()
    {
        Ok(o) if o.status.success() => {}
        _ => {
            skip::skip_or_fail(test, "python3 with the `mcp` package (scripts/setup.sh)");
            return;
        }
    }
    let marker = format!("/srv/caps-py-{}", std::process::id());
    let Some(s) = serve(test, &fixture_manifest(&marker)).await else {
        return;
    };
    let dir = cordon_testkit::scratch();
    let script = dir.path().join("client.py");
    std::fs::write(&script, PY_CLIENT).unwrap();
    let mut py = tokio::process::Command::new("python3")
        .arg(&script)
        .arg(&s.url)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let py_pid = py.id().unwrap() as i32;
    use tokio::io::AsyncBufReadExt;
    let mut out = tokio::io::BufReader::new(py.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), out.next_line())
        .await
        .expect("the Python client did not call fx__echo in time")
        .unwrap();
    assert_eq!(line.as_deref(), Some("echoed"));
    // Positive control: the server's sandbox runs while the call hangs.
    let running = eventually(|| !with_marker(&marker).is_empty()).await;
    assert!(running, "{:?}", descendants());
    tokio::time::sleep(Duration::from_millis(500)).await;
    py.start_kill().unwrap();
    py.wait().await.unwrap();
    let gone = eventually(|| descendants().iter().all(|(pid, _)| *pid == py_pid)).await;
    assert!(gone, "left behind: {:?}", descendants());
    let ended = eventually(|| {
        records(&s.audit)
            .iter()
            .any(|r| r["status"] == "session_ended" && r["principal"] == "killed")
    })
    .await;
    assert!(ended, "{:#?}", records(&s.audit));
    let rec = records(&s.audit)
        .into_iter()
        .find(|r| r["status"] == "session_ended")
        .unwrap();
    assert!(
        rec["reason"]
            .as_str()
            .is_some_and(|r| r.contains("client is gone")),
        "{rec}"
    );
}

/// The busy refusals in the audit log for `limit`.
fn refused_for(audit: &Path, limit: &str) -> Vec<Value> {
    records(audit)
        .into_iter()
        .filter(|r| r["status"] == "busy" && r["limits_hit"] == json!([limit]))
        .collect()
}

const NAP: &str = r#"
  nap:
    profile: P1
    description: Sleep six seconds.
    command: [/bin/sleep, "6"]
    limits: {wall_seconds: 60}
  quick:
    profile: P1
    description: Say hi.
    command: [/bin/echo, hi]
"#;

/// How many calls of `nap` run now.
fn naps() -> usize {
    descendants()
        .iter()
        .filter(|(_, c)| c.trim_end() == "/bin/sleep 6")
        .count()
}

/// Call `tool` as each of `who` at once; the outcomes in order: `ok`, or
/// the refusal's `limit`.
async fn at_once(url: &str, who: &[&str], tool: &'static str) -> Vec<String> {
    let mut clients = Vec::new();
    for w in who {
        clients.push(Arc::new(client(url, w).await.unwrap()));
    }
    let mut set = tokio::task::JoinSet::new();
    for (i, c) in clients.iter().enumerate() {
        let c = c.clone();
        set.spawn(async move { (i, call(&c, tool).await) });
    }
    let mut out = vec![String::new(); who.len()];
    while let Some(r) = set.join_next().await {
        let (i, r) = r.unwrap();
        out[i] = match r {
            Ok(r) if r.is_error != Some(true) => "ok".into(),
            Ok(r) => format!("{r:?}"),
            Err(ServiceError::McpError(e)) => e
                .data
                .as_ref()
                .and_then(|d| d.get("limit"))
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| format!("{e:?}")),
            Err(e) => format!("{e:?}"),
        };
    }
    for c in clients {
        if let Ok(c) = Arc::try_unwrap(c) {
            let _ = c.cancel().await;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_holding_long_calls_leaves_another_tenant_served() {
    let _one = SERIAL.lock().await;
    let test = "a_tenant_holding_long_calls_leaves_another_tenant_served";
    let m = format!(
        "version: 1\ngateway:\n  max_sandboxes: 3\n  per_principal: {{calls_in_flight: 1}}\n  per_tenant: {{calls_in_flight: 2}}\ntools:{NAP}"
    );
    let Some(s) = serve(test, &m).await else {
        return;
    };
    // One principal, two long calls at once: one runs, one is refused.
    let mut out = at_once(&s.url, &["a1@t1", "a1@t1"], "nap").await;
    out.sort();
    assert_eq!(out, ["ok", "per_principal.calls_in_flight"]);
    // Three principals of tenant t1, one long call each: two run (the
    // tenant's cap), one is refused; meanwhile tenant t2 is served (all
    // three would have held every sandbox of `max_sandboxes`).
    let url = s.url.clone();
    let t1 = tokio::spawn(async move { at_once(&url, &["a1@t1", "a2@t1", "a3@t1"], "nap").await });
    // Once two of them run (their `sleep` processes are ours).
    assert!(eventually(|| naps() == 2).await, "{:?}", descendants());
    let b = client(&s.url, "b@t2").await.unwrap();
    let r = call(&b, "quick").await.expect("tenant t2's call is served");
    assert_ne!(r.is_error, Some(true), "{r:?}");
    let mut out = t1.await.unwrap();
    out.sort();
    assert_eq!(out, ["ok", "ok", "per_tenant.calls_in_flight"]);
    let mine = refused_for(&s.audit, "per_principal.calls_in_flight");
    assert_eq!(mine.len(), 1, "{:#?}", records(&s.audit));
    assert_eq!(mine[0]["principal"], "a1");
    assert_eq!(mine[0]["tenant"], "t1");
    assert!(
        mine[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("`a1` has 1 calls in flight already")),
        "{}",
        mine[0]
    );
    let ours = refused_for(&s.audit, "per_tenant.calls_in_flight");
    assert_eq!(ours.len(), 1, "{:#?}", records(&s.audit));
    assert_eq!(ours[0]["tenant"], "t1");
    assert!(
        ours[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("tenant `t1` has 2 calls in flight already")),
        "{}",
        ours[0]
    );
    let _ = b.cancel().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_at_its_fair_share_leaves_sandboxes_to_another() {
    let _one = SERIAL.lock().await;
    let test = "a_tenant_at_its_fair_share_leaves_sandboxes_to_another";
    let marker = format!("/srv/caps-fair-{}", std::process::id());
    let m = fixture_manifest(&marker).replace(
        "gateway: {disconnect_grace: 1s}",
        "gateway: {max_sandboxes: 3}",
    ) + "  quick:\n    profile: P1\n    command: [/bin/echo, hi]\n";
    let Some(s) = serve(test, &m).await else {
        return;
    };
    let echo = |c: &Client| {
        let mut p = CallToolRequestParams::new("fx__echo");
        p.arguments = json!({"text": "x"}).as_object().cloned();
        let peer = c.peer().clone();
        async move { peer.call_tool(p).await }
    };
    // Alone, tenant t1 may take every sandbox: three sessions, three
    // servers; tenant t2 then finds none.
    let mut held = Vec::new();
    for _ in 0..3 {
        let c = client(&s.url, "a@t1").await.unwrap();
        let r = echo(&c).await.expect("a lone tenant's server starts");
        assert_ne!(r.is_error, Some(true), "{r:?}");
        held.push(c);
    }
    let b = client(&s.url, "b@t2").await.unwrap();
    let e = call(&b, "quick").await.unwrap_err();
    assert_eq!(status_of(&e), "busy", "{e:?}");
    assert_eq!(refused_for(&s.audit, "max_sandboxes").len(), 1);
    // t1's sessions end; t2 is served once their sandboxes are gone.
    for c in held.drain(..) {
        c.cancel().await.unwrap();
    }
    let mut served = false;
    for _ in 0..300 {
        if matches!(call(&b, "quick").await, Ok(r) if r.is_error != Some(true)) {
            served = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(served, "{:#?}", records(&s.audit));
    // With t2 wanting sandboxes, t1 takes what t2 does not lack of its
    // share (3 / 2 tenants = 1): two servers, not the third.
    let mut outcomes = Vec::new();
    for _ in 0..3 {
        let c = client(&s.url, "a@t1").await.unwrap();
        outcomes.push(match echo(&c).await {
            Ok(r) if r.is_error != Some(true) => "ok".to_string(),
            Ok(r) => format!("{r:?}"),
            Err(ServiceError::McpError(e)) => e
                .data
                .as_ref()
                .and_then(|d| d.get("limit"))
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
            Err(e) => format!("{e:?}"),
        });
        held.push(c);
    }
    assert_eq!(
        outcomes,
        ["ok", "ok", "fair_share"],
        "{:#?}",
        records(&s.audit)
    );
    let r = call(&b, "quick").await.expect("t2 keeps its share");
    assert_ne!(r.is_error, Some(true), "{r:?}");
    let fair = refused_for(&s.audit, "fair_share");
    assert_eq!(fair.len(), 1, "{fair:#?}");
    assert_eq!(fair[0]["principal"], "a");
    assert_eq!(fair[0]["tenant"], "t1");
    assert!(
        fair[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains("its fair share while 2 tenants want them")),
        "{}",
        fair[0]
    );
    for c in held {
        let _ = c.cancel().await;
    }
    let _ = b.cancel().await;
}

/// A stateless (protocol 2026-07-28) `tools/call` of `tool` as `who`: the
/// status and body.
async fn stateless_call(url: &str, who: &str, tool: &str) -> (u16, String) {
    cordon_mcp::install_crypto_provider();
    let body = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
    "name": tool, "arguments": {},
    "_meta": {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
    }}});
    let resp = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", "tools/call")
        .header("mcp-name", tool)
        .header("x-test-principal", who)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap_or_default())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stateless_requests_count_against_a_principals_sessions() {
    let _one = SERIAL.lock().await;
    let test = "stateless_requests_count_against_a_principals_sessions";
    let m = format!("version: 1\ngateway:\n  per_principal: {{sessions: 1}}\ntools:{NAP}");
    let Some(s) = serve(test, &m).await else {
        return;
    };
    // Positive control: one stateless call runs.
    let (status, body) = stateless_call(&s.url, "st@t1", "quick").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("hi") && !body.contains("\"error\""), "{body}");
    // Two at once: each is a session while it runs; the second is refused.
    let url = s.url.clone();
    let first = tokio::spawn(async move { stateless_call(&url, "st@t1", "nap").await });
    assert!(eventually(|| naps() == 1).await, "{:?}", descendants());
    let (_, second) = stateless_call(&s.url, "st@t1", "quick").await;
    assert!(
        second.contains("too_many_sessions")
            && second.contains("over stateless HTTP each request in flight is a session"),
        "{second}"
    );
    // Another principal is not held by it.
    let (_, other) = stateless_call(&s.url, "other@t1", "quick").await;
    assert!(
        other.contains("hi") && !other.contains("\"error\""),
        "{other}"
    );
    let (status, body) = first.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(!body.contains("\"error\""), "{body}");
    let refused: Vec<Value> = refused_for(&s.audit, "sessions");
    assert_eq!(refused.len(), 1, "{:#?}", records(&s.audit));
    assert_eq!(refused[0]["principal"], "st");
    // Once it ended, the next runs.
    let (_, again) = stateless_call(&s.url, "st@t1", "quick").await;
    assert!(
        again.contains("hi") && !again.contains("\"error\""),
        "{again}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_sessions_sse_streams_are_capped() {
    let _one = SERIAL.lock().await;
    let test = "a_sessions_sse_streams_are_capped";
    let m = format!("version: 1\ngateway: {{disconnect_grace: 1s}}\ntools:{SLOW}");
    let Some(s) = serve(test, &m).await else {
        return;
    };
    let (status, id, body) = post(
        &s.url,
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "sse-test", "version": "1"}}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let id = id.expect("a session id");
    let (status, _, body) = post(
        &s.url,
        Some(&id),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    assert_eq!(status, 202, "{body}");
    let get = || {
        reqwest::Client::new()
            .get(&s.url)
            .header("accept", "text/event-stream")
            .header("mcp-session-id", &id)
            .header("mcp-protocol-version", "2025-06-18")
            .header("x-test-principal", "idler")
            .send()
    };
    let mut open = Vec::new();
    for _ in 0..4 {
        let r = get().await.unwrap();
        assert_eq!(r.status().as_u16(), 200, "a stream within the cap");
        open.push(r);
    }
    let extra = get().await.unwrap();
    assert_eq!(extra.status().as_u16(), 429);
    let body = extra.text().await.unwrap();
    assert!(
        body.contains("has 4 SSE streams (GET) open already") && body.contains("sse_streams"),
        "{body}"
    );
    let refused = refused_for(&s.audit, "sse_streams");
    assert_eq!(refused.len(), 1, "{:#?}", records(&s.audit));
    assert_eq!(refused[0]["principal"], "idler");
    // Positive control: once one is closed (and the gateway noticed), a
    // new one opens.
    drop(open.pop());
    let mut reopened = false;
    for _ in 0..300 {
        let r = get().await.unwrap();
        if r.status().as_u16() == 200 {
            open.push(r);
            reopened = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(reopened, "no stream opened after one was closed");
}
