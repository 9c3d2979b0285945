//! `mcp:` tools: a third-party MCP server (the Python fixture in
//! crates/mcp/tests/fixtures) run inside its sandbox behind `cordon serve`,
//! driven by the rmcp client.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cordon_mcp::rmcp;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, ErrorCode, NumberOrString, ProgressNotificationParam,
    ProgressToken, RequestMetaObject,
};
use rmcp::service::{NotificationContext, RoleClient, RunningService};
use rmcp::{ClientHandler, ServiceExt};
use serde_json::{Value, json};

/// A manifest with the fixture server as tool `fx`, mounted at `mount`
/// (a path unique to the test, so its processes can be found in /proc).
fn manifest(dir: &Path, mount: &str, extra_args: &str, lifetime: &str) -> PathBuf {
    let m = format!(
        r#"version: 1
tools:
  fx:
    profile: P2
    description: The fixture MCP server.
    network: none
    lifetime: {lifetime}
    limits: {{wall_seconds: 2, memory: 256M, tasks: 16}}
    mounts: ["{fixtures}:{mount}"]
    mcp:
      command: ["/usr/bin/python3", "{mount}/fixture_server.py"{extra_args}]
      tools:
        allow: [echo, crash, hang, slow, image, probe, fail]
        rename: {{echo: fx__say}}
        descriptions: {{echo: "Echo the text back."}}
"#,
        fixtures = fixtures().display()
    );
    let p = dir.join("cordon.yaml");
    std::fs::write(&p, m).unwrap();
    p
}

/// Records the progress notifications it receives.
#[derive(Clone, Default)]
struct Progress(Arc<Mutex<Vec<f64>>>);

impl ClientHandler for Progress {
    async fn on_progress(
        &self,
        params: ProgressNotificationParam,
        _context: NotificationContext<RoleClient>,
    ) {
        self.0.lock().unwrap().push(params.progress);
    }
}

type Client = RunningService<RoleClient, Progress>;

async fn stdio_client(manifest: &Path, audit: &Path) -> (Client, Progress) {
    let p = Progress::default();
    let c = Serve::manifest(env!("CARGO_BIN_EXE_cordon"), manifest, audit)
        .stdio(p.clone(), Stdio::inherit())
        .await;
    (c, p)
}

/// The body of a wrapped text result (between the markers).
fn body(r: &CallToolResult) -> String {
    let t = text_of(r);
    assert!(t.starts_with("<untrusted-output "), "{t}");
    let mut lines: Vec<&str> = t.lines().collect();
    lines.remove(0);
    lines.pop();
    lines.join("\n")
}

/// Pids of processes whose command line mentions `needle`.
fn procs_with(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(c) = std::fs::read(format!("/proc/{pid}/cmdline"))
            && String::from_utf8_lossy(&c).contains(needle)
        {
            out.push(pid);
        }
    }
    out
}

async fn wait_gone(needle: &str) -> bool {
    for _ in 0..100 {
        if procs_with(needle).is_empty() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_tools_are_prefixed_filtered_renamed_and_sandboxed() {
    let dir = tempdir();
    let audit = dir.0.join("audit.jsonl");
    let (c, _) = stdio_client(&manifest(&dir.0, "/fx-list", "", "session"), &audit).await;

    let tools = c.peer().list_all_tools().await.unwrap();
    let mut names: Vec<_> = tools.iter().map(|t| t.name.to_string()).collect();
    names.sort();
    // `secret` is not in `allow`; `echo` is exposed as `say`.
    assert_eq!(
        names,
        [
            "fx__crash",
            "fx__fail",
            "fx__hang",
            "fx__image",
            "fx__probe",
            "fx__say",
            "fx__slow"
        ]
    );
    let say = tools.iter().find(|t| t.name == "fx__say").unwrap();
    assert_eq!(say.description.as_deref(), Some("Echo the text back."));
    let meta = say.meta.as_ref().unwrap();
    assert_eq!(meta.get("cordon/server_tool"), Some(&json!("echo")));
    assert_eq!(meta.get("cordon/description_pinned"), Some(&json!(true)));

    let r = call(&c, "fx__say", json!({"text": "hello from the agent"}))
        .await
        .unwrap();
    assert_eq!(body(&r), "hello from the agent");
    let m = r.meta.as_ref().unwrap();
    assert_eq!(m.get("cordon/trust"), Some(&json!("untrusted")));
    assert_eq!(m.get("cordon/tool"), Some(&json!("fx__say")));
    assert_eq!(m.get("cordon/profile"), Some(&json!("P2")));

    // The server's view from inside: pid 1 of its own namespace, not root,
    // no network, none of the host's files or environment.
    let r = call(&c, "fx__probe", json!({})).await.unwrap();
    let facts: Value = serde_json::from_str(&body(&r)).unwrap();
    assert_eq!(facts["pid"], 1, "{facts}");
    assert_eq!(facts["uid"], 1000, "{facts}");
    // `network: none`: seccomp refuses the IP socket itself (EPERM), not a
    // connection that an empty namespace would refuse.
    assert_eq!(facts["network"], "refused: PermissionError", "{facts}");
    assert_eq!(facts["work_visible"], false, "{facts}");
    assert_eq!(facts["root_visible"], false, "{facts}");
    assert_eq!(
        facts["env_keys"],
        // Only the policy's environment: the server is the sandbox's first
        // process, with no shell before it to add PWD.
        json!(["HOME", "LANG", "PATH"]),
        "{facts}"
    );

    // Arguments are checked against the server's schema before they leave.
    let e = mcp_error(call(&c, "fx__say", json!({"text": 1})).await.unwrap_err());
    assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
    assert!(e.message.contains("at /text"), "{}", e.message);
    // Not allowed, and not a tool at all: both unknown.
    for t in ["fx__secret", "fx__echo"] {
        let e = mcp_error(call(&c, t, json!({})).await.unwrap_err());
        assert_eq!(e.code, ErrorCode::INVALID_PARAMS, "{t}");
        assert!(e.message.starts_with("unknown tool"), "{}", e.message);
    }

    // Images pass the gate's media-type check and stay images.
    let r = call(&c, "fx__image", json!({})).await.unwrap();
    let img = r
        .content
        .iter()
        .find_map(|b| b.as_image())
        .expect("image block");
    assert_eq!(img.mime_type, "image/png");
    // An isError result from the server stays one, gated.
    let r = call(&c, "fx__fail", json!({})).await.unwrap();
    assert_eq!(r.is_error, Some(true));
    assert!(text_of(&r).contains("error=\"true\""));
    assert!(text_of(&r).contains("the widget is broken"));

    c.cancel().await.unwrap();
    let recs: Vec<Value> = std::fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let say: Vec<&Value> = recs.iter().filter(|r| r["tool"] == "fx__say").collect();
    assert_eq!(say.len(), 2, "{recs:?}");
    assert_eq!(say[0]["status"], "ok");
    assert_eq!(say[0]["runtime"], "mcp");
    assert_eq!(say[1]["status"], "denied");
    assert!(
        say[0]["session"]
            .as_str()
            .unwrap()
            .starts_with("mcp-stdio-"),
        "{:?}",
        say[0]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_description_is_refused() {
    let dir = tempdir();
    let m = manifest(&dir.0, "/fx-poison", r#", "--poison""#, "session");
    let (c, _) = stdio_client(&m, &dir.0.join("audit.jsonl")).await;
    let tools = c.peer().list_all_tools().await.unwrap();
    let names: Vec<_> = tools.iter().map(|t| t.name.to_string()).collect();
    assert!(!names.contains(&"fx__say".to_string()), "{names:?}");
    // The unpinned tools are still there (positive control).
    assert!(names.contains(&"fx__probe".to_string()), "{names:?}");
    let e = mcp_error(call(&c, "fx__say", json!({"text": "x"})).await.unwrap_err());
    assert_eq!(e.code, ErrorCode::INVALID_REQUEST);
    assert_eq!(e.data.unwrap()["cordon/status"], "description_changed");
    assert!(
        e.message
            .contains("differently from the description pinned"),
        "{}",
        e.message
    );
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_or_hung_server_is_a_typed_error_and_the_next_call_restarts_it() {
    let dir = tempdir();
    let (c, _) = stdio_client(
        &manifest(&dir.0, "/fx-crash", "", "session"),
        &dir.0.join("audit.jsonl"),
    )
    .await;
    let first = call(&c, "fx__probe", json!({})).await.unwrap();
    assert_eq!(first.is_error, Some(false));

    let e = mcp_error(call(&c, "fx__crash", json!({})).await.unwrap_err());
    assert_eq!(e.code, ErrorCode::INTERNAL_ERROR);
    assert_eq!(e.data.as_ref().unwrap()["cordon/status"], "server_failed");
    assert!(e.message.starts_with("fx__crash: "), "{}", e.message);
    assert!(e.message.contains("exit 3"), "{}", e.message);
    assert!(
        e.message.contains("fixture: crashing on purpose"),
        "{}",
        e.message
    );
    let r = call(&c, "fx__say", json!({"text": "after the crash"}))
        .await
        .unwrap();
    assert_eq!(body(&r), "after the crash");

    let e = mcp_error(call(&c, "fx__hang", json!({})).await.unwrap_err());
    assert_eq!(
        e.message,
        "fx__hang: timed out after 2s; the server was stopped and the next call starts a new one"
    );
    let data = e.data.unwrap();
    assert_eq!(data["cordon/status"], "limit_hit");
    assert_eq!(data["limit"], "wall_seconds");
    // The hung sandbox is gone and a new one answers.
    let r = call(&c, "fx__say", json!({"text": "after the hang"}))
        .await
        .unwrap();
    assert_eq!(body(&r), "after the hang");
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_notifications_reach_the_agent() {
    let dir = tempdir();
    let (c, progress) = stdio_client(
        &manifest(&dir.0, "/fx-progress", "", "session"),
        &dir.0.join("audit.jsonl"),
    )
    .await;
    let mut p = CallToolRequestParams::new("fx__slow");
    p.arguments = json!({"steps": 3}).as_object().cloned();
    p.meta = Some(RequestMetaObject::with_progress_token(ProgressToken(
        NumberOrString::String("agent-token-1".into()),
    )));
    let r = c.peer().call_tool(p).await.unwrap();
    assert_eq!(body(&r), "done after 3 steps");
    // Notifications may trail the result by a moment.
    for _ in 0..40 {
        if progress.0.lock().unwrap().len() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(*progress.0.lock().unwrap(), vec![1.0, 2.0, 3.0]);
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifetime_call_gives_each_call_a_fresh_sandbox() {
    let dir = tempdir();
    let mount = "/fx-per-call";
    let (c, _) = stdio_client(
        &manifest(&dir.0, mount, "", "call"),
        &dir.0.join("audit.jsonl"),
    )
    .await;
    let r = call(&c, "fx__say", json!({"text": "one"})).await.unwrap();
    assert_eq!(body(&r), "one");
    assert!(
        wait_gone(mount).await,
        "the per-call sandbox outlived its call"
    );
    let r = call(&c, "fx__say", json!({"text": "two"})).await.unwrap();
    assert_eq!(body(&r), "two");
    c.cancel().await.unwrap();
}

/// Over HTTP, each MCP session has its own sandbox, stopped when the
/// session ends while cordon keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_http_session_end_stops_its_sandbox() {
    let dir = tempdir();
    let mount = "/fx-http-session";
    let m = manifest(&dir.0, mount, "", "session");
    let child =
        Serve::manifest(env!("CARGO_BIN_EXE_cordon"), &m, &dir.0.join("audit.jsonl")).http();
    let url = child.url.clone();

    let a = ().serve(cordon_mcp::http_client(&url)).await.unwrap();
    let b = ().serve(cordon_mcp::http_client(&url)).await.unwrap();
    let mut pa = CallToolRequestParams::new("fx__say");
    pa.arguments = json!({"text": "a"}).as_object().cloned();
    assert_eq!(
        a.peer().call_tool(pa.clone()).await.unwrap().is_error,
        Some(false)
    );
    assert_eq!(b.peer().call_tool(pa).await.unwrap().is_error, Some(false));
    // Positive control: two sessions, two sandboxes running.
    let running = procs_with(mount);
    assert_eq!(running.len(), 2, "{running:?}");
    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
    assert!(wait_gone(mount).await, "a sandbox outlived its session");
    drop(child);
}

/// A minimal MCP server with one tool, `get`, that fetches a URL through
/// the proxy its environment names (urllib honours `http_proxy`).
const FETCH_SERVER: &str = r#"import json, sys, urllib.request, urllib.error

def send(m):
    sys.stdout.write(json.dumps(m) + "\n")
    sys.stdout.flush()

TOOLS = [{"name": "get", "description": "GET a URL.",
          "inputSchema": {"type": "object", "properties": {"url": {"type": "string"}},
                          "required": ["url"]}}]

for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    msg = json.loads(line)
    req_id, method, params = msg.get("id"), msg.get("method"), msg.get("params") or {}
    if req_id is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": req_id, "result": {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "fetch-fixture", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": req_id, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        url = (params.get("arguments") or {}).get("url", "")
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                text, err = r.read().decode(), False
        except urllib.error.HTTPError as e:
            text, err = "HTTP %d: %s" % (e.code, e.read().decode(errors="replace")), True
        except Exception as e:
            text, err = "fetch failed: %r" % (e,), True
        send({"jsonrpc": "2.0", "id": req_id, "result": {
            "content": [{"type": "text", "text": text}], "isError": err}})
    else:
        send({"jsonrpc": "2.0", "id": req_id,
              "error": {"code": -32601, "message": "method not found: %s" % method}})
"#;

/// A loopback HTTP upstream that answers every request with `body` and
/// counts the requests it saw.
fn upstream(body: &'static str) -> (u16, Arc<Mutex<Vec<String>>>) {
    let (addr, seen) = cordon_testkit::loopback::request_lines(move |_| body.to_string());
    (addr.port(), seen)
}

/// An `mcp:` server with `egress` runs with the egress doors for its whole
/// life: the allowlisted name (pinned to a loopback upstream) is reached,
/// any other destination is refused by the doors with the reason, and the
/// refused requests never reach an upstream. Only loopback is used: the
/// names are pinned with `resolve` or refused before any lookup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_with_egress_reaches_only_its_allowlist() {
    let dir = tempdir();
    let (port, seen) = upstream("hello from the allowed upstream");
    let (other, other_seen) = upstream("this upstream is not allowed");
    std::fs::write(dir.0.join("fetch_server.py"), FETCH_SERVER).unwrap();
    let mount = "/fx-egress";
    let m = format!(
        r#"version: 1
tools:
  web:
    profile: P2
    description: A fetch server with one allowed destination.
    lifetime: session
    limits: {{wall_seconds: 10, memory: 256M, tasks: 16}}
    egress: ["api.test:{port}"]
    resolve: {{api.test: 127.0.0.1}}
    allow_cidrs: [127.0.0.1/32]
    mounts: ["{src}:{mount}"]
    mcp:
      command: ["/usr/bin/python3", "{mount}/fetch_server.py"]
"#,
        src = dir.0.display()
    );
    let mp = dir.0.join("cordon.yaml");
    std::fs::write(&mp, m).unwrap();
    let (c, _) = stdio_client(&mp, &dir.0.join("audit.jsonl")).await;

    let names: Vec<_> = c
        .peer()
        .list_all_tools()
        .await
        .unwrap()
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    assert_eq!(names, ["web__get"]);

    // Positive control: the allowlisted name reaches the upstream.
    let url = format!("http://api.test:{port}/hello");
    let r = call(&c, "web__get", json!({"url": url})).await.unwrap();
    assert_ne!(r.is_error, Some(true), "{}", text_of(&r));
    assert_eq!(body(&r), "hello from the allowed upstream");
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        ["GET /hello HTTP/1.1".to_string()]
    );

    // A name outside the allowlist: refused by the doors, before any lookup.
    let url = format!("http://evil.test:{port}/steal");
    let r = call(&c, "web__get", json!({"url": url})).await.unwrap();
    let t = text_of(&r);
    assert_eq!(r.is_error, Some(true), "{t}");
    assert!(
        t.contains(&format!(
            "HTTP 403: egress to evil.test:{port} refused: not in the allowlist of web"
        )),
        "{t}"
    );

    // A loopback address of another upstream, not in the allowlist.
    let url = format!("http://127.0.0.1:{other}/steal");
    let r = call(&c, "web__get", json!({"url": url})).await.unwrap();
    let t = text_of(&r);
    assert_eq!(r.is_error, Some(true), "{t}");
    assert!(
        t.contains(&format!(
            "HTTP 403: egress to 127.0.0.1:{other} refused: IP literal 127.0.0.1 is not in the allowlist of web"
        )),
        "{t}"
    );

    // Neither refusal reached an upstream.
    assert_eq!(seen.lock().unwrap().len(), 1);
    assert!(other_seen.lock().unwrap().is_empty());

    // The doors live as long as the server: a later call still gets through.
    let url = format!("http://api.test:{port}/again");
    let r = call(&c, "web__get", json!({"url": url})).await.unwrap();
    assert_eq!(body(&r), "hello from the allowed upstream");

    c.cancel().await.unwrap();
    assert!(wait_gone(mount).await, "the server outlived its session");

    // Each of the server's egress attempts has its own audit record.
    let log = std::fs::read_to_string(dir.0.join("audit.jsonl")).unwrap();
    let egress: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["caller"] == "mcp-server")
        .collect();
    assert!(
        egress.iter().any(|r| r["status"] == "denied"
            && r["egress"][0]["name"] == "evil.test"
            && r["egress"][0]["decision"] == "deny"),
        "{log}"
    );
    assert!(
        egress
            .iter()
            .any(|r| r["egress"][0]["name"] == "api.test" && r["egress"][0]["decision"] == "allow"),
        "{log}"
    );
}

/// Sockets open in process `pid`.
fn sockets_of(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .map(|l| l.to_string_lossy().starts_with("socket:"))
                        .unwrap_or(false)
                })
                .count()
        })
        .unwrap_or(0)
}

/// Poll until `pid` holds `want` sockets; the count it ended with.
async fn wait_sockets(pid: i32, want: usize) -> usize {
    let mut n = sockets_of(pid);
    for _ in 0..100 {
        if n == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        n = sockets_of(pid);
    }
    n
}

/// The count of sockets in `pid` once it has not changed for ten samples
/// in a row (a stopped sandbox's teardown finishes after its processes are
/// gone).
async fn settled_sockets(pid: i32) -> usize {
    let mut n = sockets_of(pid);
    let mut same = 0;
    for _ in 0..200 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let m = sockets_of(pid);
        if m == n {
            same += 1;
            if same == 10 {
                break;
            }
        } else {
            (n, same) = (m, 0);
        }
    }
    n
}

/// The doors of a server live exactly as long as its sandbox: while a
/// per-call server is fetching, the gateway holds its door sockets; once
/// the call's sandbox is gone, the gateway is back to the sockets it held
/// before, call after call (no door, listener or connection leaks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_servers_doors_close_when_its_sandbox_stops() {
    use std::io::{Read, Write};
    let dir = tempdir();
    let (port, seen) = upstream("quick");
    // An upstream that answers only when told to: the call is held open.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let held_port = held.local_addr().unwrap().port();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (arrived, arrival) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Ok((mut conn, _)) = held.accept() {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let _ = arrived.send(());
            let _ = released.recv();
            let _ = conn.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nheld",
            );
        }
    });
    std::fs::write(dir.0.join("fetch_server.py"), FETCH_SERVER).unwrap();
    let mount = "/fx-egress-doors";
    let m = format!(
        r#"version: 1
tools:
  web:
    profile: P2
    description: A per-call fetch server.
    lifetime: call
    limits: {{wall_seconds: 20, memory: 256M, tasks: 16}}
    egress: ["api.test:{port}", "slow.test:{held_port}"]
    resolve: {{api.test: 127.0.0.1, slow.test: 127.0.0.1}}
    allow_cidrs: [127.0.0.1/32]
    mounts: ["{src}:{mount}"]
    mcp:
      command: ["/usr/bin/python3", "{mount}/fetch_server.py"]
"#,
        src = dir.0.display()
    );
    let mp = dir.0.join("cordon.yaml");
    std::fs::write(&mp, m).unwrap();
    let (c, _) = stdio_client(&mp, &dir.0.join("audit.jsonl")).await;
    let serve = procs_with(mp.to_str().unwrap());
    assert_eq!(serve.len(), 1, "{serve:?}");
    let serve = serve[0];

    let get = |u: String| {
        let peer = c.peer().clone();
        async move {
            let mut p = CallToolRequestParams::new("web__get");
            p.arguments = json!({"url": u}).as_object().cloned();
            peer.call_tool(p).await
        }
    };
    let quick = format!("http://api.test:{port}/q");
    let r = get(quick.clone()).await.unwrap();
    assert_eq!(body(&r), "quick");
    assert!(
        wait_gone(mount).await,
        "the per-call sandbox outlived its call"
    );
    let baseline = settled_sockets(serve).await;

    // Positive control: during a held call the gateway holds more sockets
    // (the server's stdio and its doors).
    let pending = tokio::spawn(get(format!("http://slow.test:{held_port}/h")));
    tokio::task::spawn_blocking(move || arrival.recv_timeout(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("the held upstream was reached");
    let during = sockets_of(serve);
    assert!(during > baseline, "{during} <= {baseline}");
    release.send(()).unwrap();
    let r = pending.await.unwrap().unwrap();
    assert_eq!(body(&r), "held");
    assert!(
        wait_gone(mount).await,
        "the per-call sandbox outlived its call"
    );
    assert_eq!(wait_sockets(serve, baseline).await, baseline);

    // And again, call after call.
    for _ in 0..3 {
        let r = get(quick.clone()).await.unwrap();
        assert_eq!(body(&r), "quick");
    }
    assert!(
        wait_gone(mount).await,
        "a per-call sandbox outlived its call"
    );
    assert_eq!(wait_sockets(serve, baseline).await, baseline);
    assert_eq!(seen.lock().unwrap().len(), 4);
    c.cancel().await.unwrap();
}
