//! Session lifetime and caps at the door of the HTTP gateway, with real
//! MCP clients (rmcp, the Python SDK) on loopback and principals from a
//! test authenticator (a header names the caller):
//!
//! - a burst above a tool's `max_concurrent` gets exactly the busy refusals
//!   beyond its queue bound, and a call under the cap then succeeds;
//! - a principal's `calls_per_minute` and `sessions` and the gateway's
//!   `max_sandboxes` hold, each refusal typed and audited with the
//!   principal;
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

/// The caller is whoever the `x-test-principal` header names.
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
                p.subject = who.to_string();
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
