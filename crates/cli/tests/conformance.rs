//! `cordon serve`'s continuous conformance: a served tool is proved again
//! while it serves, taken out of service when a run does not hold, and
//! returned to service when a later run holds. The real binary, the real
//! jail and the real probes.

mod common;

use std::io::{Read as _, Write as _};
use std::path::Path;
use std::time::{Duration, Instant};

use cordon_mcp::rmcp;
use rmcp::ServiceExt;
use rmcp::service::{RoleClient, RunningService};
use serde_json::{Value, json};

use common::*;

type Client = RunningService<RoleClient, ()>;

/// A client that counts the `notifications/tools/list_changed` it is sent.
#[derive(Clone, Default)]
struct ListChanges(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl rmcp::ClientHandler for ListChanges {
    async fn on_tool_list_changed(&self, _context: rmcp::service::NotificationContext<RoleClient>) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl ListChanges {
    fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Wait (bounded) until `n` were sent; the count then.
    async fn until(&self, n: usize) -> usize {
        let begun = Instant::now();
        while self.count() < n && begun.elapsed() < DEADLINE {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.count()
    }
}

/// When the `lister` tool was last proved, from the metrics.
fn last_proved(addr: &str) -> String {
    let m = metrics(addr);
    m.lines()
        .find_map(|l| l.strip_prefix("cordon_tool_last_proved_timestamp_seconds{tool=\"lister\"} "))
        .unwrap_or_else(|| panic!("no last proof of lister: {m}"))
        .to_owned()
}

/// How long a change may take to be seen on a loaded machine. Polled, never
/// timed.
const DEADLINE: Duration = Duration::from_secs(300);

/// A tool that lists the host directory it mounts at
/// /run/containerd, where the `host_fs` probe looks for a container
/// runtime's socket.
fn manifest(dir: &Path, data: &Path) -> std::path::PathBuf {
    let m = dir.join("m.yaml");
    std::fs::write(
        &m,
        format!(
            r#"tools:
  lister:
    profile: P1
    description: List the shared directory.
    command: [/usr/bin/ls, /run/containerd]
    limits: {{wall_seconds: 5, memory: 64M, tasks: 4}}
    network: none
    mounts: ["{}:/run/containerd"]
"#,
            data.display()
        ),
    )
    .unwrap();
    m
}

/// `GET /metrics` on the gateway: the body.
fn metrics(addr: &str) -> String {
    page(addr, "/metrics")
}

/// The console's row of the `lister` tool.
fn console_row(addr: &str) -> String {
    let body = page(addr, "/console");
    let at = body
        .find("<tr class=\"tool\" data-tool=\"lister\">")
        .unwrap_or_else(|| panic!("no lister row: {body}"));
    let row = &body[at..];
    row[..row.find("</tr>").unwrap_or(row.len())].to_owned()
}

/// `GET path` on the gateway: the body.
fn page(addr: &str, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let resp = String::from_utf8_lossy(&resp).into_owned();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return body.to_owned();
    }
    let mut out = String::new();
    let mut body = body;
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || rest.len() < n {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// The audit records of the `lister` tool's service changes.
fn service_records(audit: &Path, event: &str) -> Vec<Value> {
    audit_records(audit)
        .into_iter()
        .filter(|r| r["tool"] == "lister" && r["service"]["event"] == event)
        .collect()
}

/// Swap the directory at `at` for `with`, keeping the old one at `aside`:
/// another inode at the same path.
fn swap(at: &Path, with: &Path, aside: &Path) {
    std::fs::rename(at, aside).unwrap();
    std::fs::rename(with, at).unwrap();
}

async fn listed(c: &Client) -> bool {
    c.peer()
        .list_all_tools()
        .await
        .unwrap()
        .iter()
        .any(|t| t.name == "lister")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_whose_mount_turns_leaky_is_taken_out_of_service_and_returns_when_fixed() {
    let d = tempdir();
    let data = d.path().join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(data.join("notes.txt"), "a shared file\n").unwrap();
    let m = manifest(d.path(), &data);
    let audit = d.path().join("audit.jsonl");
    let serve = Serve::manifest(env!("CARGO_BIN_EXE_cordon"), &m, &audit)
        .args(["--reprobe-every", "5s"])
        .http();
    assert!(
        serve
            .stderr
            .iter()
            .any(|l| l.contains("lister: held") && !l.contains("not proved")),
        "the clean tool is proved at start: {:#?}",
        serve.stderr
    );
    let c = ().serve(cordon_mcp::http_client(&serve.url)).await.unwrap();
    // A second session that counts the list changes it is told.
    let changes = ListChanges::default();
    let watcher = changes
        .clone()
        .serve(cordon_mcp::http_client(&serve.url))
        .await
        .unwrap();
    let offered = watcher
        .peer()
        .peer_info()
        .unwrap()
        .capabilities
        .tools
        .clone();
    assert_eq!(offered.and_then(|t| t.list_changed), Some(true));

    // Positive control: in service, listed, and a call lists the file.
    assert!(listed(&c).await);
    let r = call(&c, "lister", json!({})).await.unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert!(text_of(&r).contains("notes.txt"), "{r:?}");
    assert!(
        metrics(&serve.addr()).contains("cordon_tool_in_service{tool=\"lister\"} 1"),
        "{}",
        metrics(&serve.addr())
    );
    let row = console_row(&serve.addr());
    assert!(
        row.contains("<td class=\"state\"><span class=\"in\">in service</span></td>"),
        "{row}"
    );
    assert!(row.contains("<td class=\"proof\">held at "), "{row}");
    // A probe run that holds while nothing changed tells no session.
    let proved = last_proved(&serve.addr());
    let begun = Instant::now();
    while last_proved(&serve.addr()) == proved {
        assert!(
            begun.elapsed() < DEADLINE,
            "no probe run after {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(changes.count(), 0, "a list change while nothing changed");

    // The directory is swapped for one holding a container runtime's
    // socket (a bound Unix socket, as a runtime leaves it).
    let bait = d.path().join("bait");
    std::fs::create_dir(&bait).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(bait.join("containerd.sock")).unwrap();
    let clean = d.path().join("clean");
    swap(&data, &bait, &clean);

    // Within a tick the tool is out of service: its call is refused with
    // the typed error naming the probe and the time.
    let begun = Instant::now();
    let refused = loop {
        match call(&c, "lister", json!({})).await {
            Err(e) => break mcp_error(e),
            Ok(r) => assert!(
                begun.elapsed() < DEADLINE,
                "still served {DEADLINE:?} after the swap: {r:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let data_of = refused.data.clone().unwrap_or_default();
    assert_eq!(data_of["cordon/status"], "out_of_service", "{refused:?}");
    assert_eq!(data_of["tool"], "lister", "{refused:?}");
    assert!(
        data_of["probes"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p == "host_fs")),
        "{refused:?}"
    );
    assert!(
        data_of["failed_at"].as_str().is_some_and(|t| t.len() >= 20),
        "{refused:?}"
    );
    assert!(
        refused
            .message
            .contains("container runtime socket /run/containerd/containerd.sock is visible"),
        "{refused:?}"
    );
    // Left out of the listing; audited once; counted. (The record is
    // written just after the tool stops being served: polled.)
    assert!(!listed(&c).await, "an out-of-service tool is not listed");
    // The live sessions are told to list again.
    assert_eq!(changes.until(1).await, 1, "list_changed once it is out");
    let begun = Instant::now();
    let out = loop {
        let out = service_records(&audit, "out_of_service");
        if !out.is_empty() {
            break out;
        }
        assert!(begun.elapsed() < DEADLINE, "no out_of_service record");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(out.len(), 1, "{out:#?}");
    assert!(
        out[0]["service"]["probes"]
            .as_array()
            .is_some_and(|p| p.iter().any(|p| p == "host_fs")),
        "{out:#?}"
    );
    let refusals: Vec<Value> = audit_records(&audit)
        .into_iter()
        .filter(|r| r["tool"] == "lister" && r["status"] == "denied" && r["service"].is_null())
        .collect();
    assert!(
        refusals.iter().any(|r| r["reason"]
            .as_str()
            .is_some_and(|s| s.contains("is out of service"))),
        "the refused call is audited: {refusals:#?}"
    );
    assert!(
        metrics(&serve.addr()).contains("cordon_tool_in_service{tool=\"lister\"} 0"),
        "{}",
        metrics(&serve.addr())
    );
    // The console says so: out of service, the probe that did not hold,
    // and the refused call among the last refusals.
    let row = console_row(&serve.addr());
    assert!(
        row.contains("<span class=\"out\">out of service</span>: since ")
            && row.contains("host_fs"),
        "{row}"
    );
    assert!(
        row.contains("<td class=\"proof\">did not hold at "),
        "{row}"
    );
    let console = page(&serve.addr(), "/console");
    assert!(
        console.contains("<td class=\"tool\">lister</td><td class=\"kind\">denied</td><td class=\"why\">`lister` is out of service: "),
        "{console}"
    );

    // Fixed: the clean directory is back; a later run holds and the tool
    // returns to service.
    swap(&data, &clean, &d.path().join("leaky"));
    let begun = Instant::now();
    let r = loop {
        match call(&c, "lister", json!({})).await {
            Ok(r) => break r,
            Err(e) => {
                let e = mcp_error(e);
                assert_eq!(
                    e.data.as_ref().map(|d| d["cordon/status"].clone()),
                    Some(json!("out_of_service")),
                    "{e:?}"
                );
                assert!(
                    begun.elapsed() < DEADLINE,
                    "still out of service {DEADLINE:?} after the fix: {e:?}"
                );
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_ne!(r.is_error, Some(true), "{r:?}");
    assert!(text_of(&r).contains("notes.txt"), "{r:?}");
    assert!(listed(&c).await);
    assert_eq!(changes.until(2).await, 2, "list_changed once it is back");
    assert_eq!(service_records(&audit, "in_service").len(), 1);
    assert!(
        metrics(&serve.addr()).contains("cordon_tool_in_service{tool=\"lister\"} 1"),
        "{}",
        metrics(&serve.addr())
    );
    c.cancel().await.unwrap();
    watcher.cancel().await.unwrap();
}

/// `kill -SIG pid`.
fn signal(sig: &str, pid: u32) {
    let st = std::process::Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success(), "kill -{sig} {pid}");
}

fn counter(memory: &str, description: &str) -> String {
    format!(
        r#"tools:
  counter:
    profile: P1
    description: {description}
    command: [/usr/bin/wc]
    limits: {{wall_seconds: 5, memory: {memory}, tasks: 4}}
    network: none
    input: {{stdin: text}}
    input_schema:
      type: object
      properties: {{text: {{type: string}}}}
      required: [text]
"#
    )
}

/// Poll the audit log until a record of `event` (a reload's) is there.
async fn wait_for_reload(audit: &Path, event: &str, n: usize) -> Value {
    let begun = Instant::now();
    loop {
        let recs: Vec<Value> = audit_records(audit)
            .into_iter()
            .filter(|r| r["service"]["event"] == event)
            .collect();
        if recs.len() >= n {
            return recs[n - 1].clone();
        }
        assert!(
            begun.elapsed() < DEADLINE,
            "no `{event}` record {DEADLINE:?} after SIGHUP"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

async fn description(c: &Client) -> String {
    c.peer()
        .list_all_tools()
        .await
        .unwrap()
        .iter()
        .find(|t| t.name == "counter")
        .and_then(|t| t.description.clone())
        .map(|d| d.to_string())
        .unwrap_or_default()
}

async fn count(c: &Client) {
    let r = call(c, "counter", json!({"text": "a b c\n"}))
        .await
        .unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    let text = text_of(&r);
    assert!(
        text.lines()
            .nth(1)
            .is_some_and(|l| l.split_whitespace().collect::<Vec<_>>() == ["1", "3", "6"]),
        "{text}"
    );
}

/// SIGHUP reloads the manifest: a change that weakens isolation is refused
/// (the diff on stderr, audited) and the running tool stays as it was; a
/// harmless one (a limit lowered, a description changed) is proved and
/// applied without dropping the live HTTP session. SIGUSR1 proves the
/// served tools again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_refuses_a_weakening_reload_and_applies_a_harmless_one_keeping_sessions() {
    let d = tempdir();
    let m = d.path().join("m.yaml");
    std::fs::write(&m, counter("128M", "Count v1")).unwrap();
    let audit = d.path().join("audit.jsonl");
    let mut serve = Serve::manifest(env!("CARGO_BIN_EXE_cordon"), &m, &audit).http();
    let pid = serve.pid();
    let c = ().serve(cordon_mcp::http_client(&serve.url)).await.unwrap();
    let changes = ListChanges::default();
    let watcher = changes
        .clone()
        .serve(cordon_mcp::http_client(&serve.url))
        .await
        .unwrap();
    // Positive control.
    count(&c).await;
    assert_eq!(description(&c).await, "Count v1");

    // Weakening: a raised memory limit. Refused; the old tool still served.
    std::fs::write(&m, counter("256M", "Count v3")).unwrap();
    signal("HUP", pid);
    let refused = wait_for_reload(&audit, "reload_refused", 1).await;
    let reason = refused["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("weaken isolation")
            && reason.contains("WEAKENS  counter: limits.memory: 128M -> 256M"),
        "{refused:#}"
    );
    assert_eq!(refused["status"], "denied", "{refused:#}");
    count(&c).await;
    assert_eq!(
        description(&c).await,
        "Count v1",
        "the running tool is kept"
    );
    assert_eq!(changes.count(), 0, "a refused reload changes no listing");

    // Harmless: the limit lowered and the description changed. Applied,
    // on the same session.
    std::fs::write(&m, counter("64M", "Count v2")).unwrap();
    signal("HUP", pid);
    let applied = wait_for_reload(&audit, "reloaded", 1).await;
    assert_eq!(applied["status"], "ok", "{applied:#}");
    assert!(
        applied["reason"]
            .as_str()
            .is_some_and(|r| r.contains("counter: limits.memory: 128M -> 64M")),
        "{applied:#}"
    );
    assert_eq!(
        description(&c).await,
        "Count v2",
        "applied to the live session"
    );
    assert_eq!(changes.until(1).await, 1, "list_changed after the reload");
    count(&c).await;
    let sessions: std::collections::BTreeSet<String> = audit_records(&audit)
        .into_iter()
        .filter(|r| r["tool"] == "counter" && r["status"] == "ok" && r["service"].is_null())
        .filter_map(|r| r["session"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(sessions.len(), 1, "every call on one session: {sessions:?}");
    assert!(
        audit_records(&audit)
            .iter()
            .all(|r| r["status"] != "session_ended"),
        "no session ended"
    );

    // SIGUSR1: every served tool proved again now (the schedule is 6 h).
    let proofs = d.path().join("proofs.json");
    let proved_at = || -> u64 {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&proofs).unwrap_or_default())
            .unwrap_or_default();
        v["counter"]["proved_at"].as_u64().unwrap_or(0)
    };
    let before = proved_at();
    assert!(before > 0, "the reload's proof is cached");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    signal("USR1", pid);
    let begun = Instant::now();
    while proved_at() <= before {
        assert!(
            begun.elapsed() < DEADLINE,
            "no proof {DEADLINE:?} after SIGUSR1"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_eq!(changes.count(), 1, "a run that held changed no listing");
    c.cancel().await.unwrap();
    watcher.cancel().await.unwrap();
    let _ = serve.child.0.kill();
    let stderr = serve.rest().join().unwrap().join("\n");
    assert!(
        stderr.contains("cordon: reload: WEAKENS  counter: limits.memory: 128M -> 256M")
            && stderr.contains("reload refused, the running configuration is kept"),
        "the diff is said on stderr: {stderr}"
    );
    assert!(stderr.contains("counter: held (reload,"), "{stderr}");
    assert!(stderr.contains("counter: held (signal,"), "{stderr}");
}

/// With `--accept-weakening`, a weakening reload is not refused for that,
/// but a changed tool still serves only once its probes hold: a new mount
/// that shows a container runtime's socket fails `host_fs`, and the
/// reload is refused whole, the running tool kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_whose_changed_tool_does_not_hold_is_refused_whole() {
    let d = tempdir();
    let m = d.path().join("m.yaml");
    std::fs::write(&m, counter("128M", "Count v1")).unwrap();
    let audit = d.path().join("audit.jsonl");
    let serve = Serve::manifest(env!("CARGO_BIN_EXE_cordon"), &m, &audit)
        .arg("--accept-weakening")
        .http();
    let c = ().serve(cordon_mcp::http_client(&serve.url)).await.unwrap();
    count(&c).await;

    let bait = d.path().join("bait");
    std::fs::create_dir(&bait).unwrap();
    let _sock = std::os::unix::net::UnixListener::bind(bait.join("containerd.sock")).unwrap();
    let leaky = counter("128M", "Count v2").replace(
        "    network: none\n",
        &format!(
            "    network: none\n    mounts: [\"{}:/run/containerd\"]\n",
            bait.display()
        ),
    );
    std::fs::write(&m, leaky).unwrap();
    signal("HUP", serve.pid());
    let refused = wait_for_reload(&audit, "reload_refused", 1).await;
    let reason = refused["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("counter: its probes do not hold (host_fs)")
            && reason
                .contains("container runtime socket /run/containerd/containerd.sock is visible")
            && reason.contains("WEAKENS  counter: mounts"),
        "{refused:#}"
    );
    // The running tool is kept, in service.
    assert_eq!(description(&c).await, "Count v1");
    count(&c).await;

    // Positive control: the same reload without the leak is applied.
    std::fs::write(&m, counter("128M", "Count v2")).unwrap();
    signal("HUP", serve.pid());
    wait_for_reload(&audit, "reloaded", 1).await;
    assert_eq!(description(&c).await, "Count v2");
    count(&c).await;
    c.cancel().await.unwrap();
}

/// `counter` and two `mcp:` servers (the fixture): `fx` exposing `allow`
/// under `memory`, `fy` exposing `echo`, unchanged by every reload;
/// without `fx` when `allow` is `None`.
fn with_servers(allow: Option<&str>, memory: &str) -> String {
    let server = |name: &str, allow: &str, memory: &str| {
        format!(
            r#"  {name}:
    profile: P2
    description: The fixture MCP server.
    network: none
    limits: {{wall_seconds: 10, memory: {memory}, tasks: 16}}
    mounts: ["{fixtures}:/srv/fixtures"]
    mcp:
      command: ["/usr/bin/python3", "/srv/fixtures/fixture_server.py"]
      tools: {{allow: [{allow}]}}
"#,
            fixtures = fixtures().display()
        )
    };
    let mut m = counter("128M", "Count v1");
    if let Some(a) = allow {
        m.push_str(&server("fx", a, memory));
    }
    m.push_str(&server("fy", "echo, probe", "256M"));
    m
}

/// The instance the fixture server answering `tool` was started as.
async fn instance(c: &Client, tool: &str) -> String {
    let r = call(c, tool, json!({})).await.unwrap();
    assert_ne!(r.is_error, Some(true), "{r:?}");
    // The server's text, inside the gate's markers.
    let t = text_of(&r);
    let json = t
        .find('{')
        .zip(t.rfind('}'))
        .map(|(a, b)| &t[a..=b])
        .unwrap_or_else(|| panic!("no JSON in {t}"));
    let v: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {t}"));
    v["instance"].as_str().unwrap().to_owned()
}

async fn names(c: &Client) -> Vec<String> {
    let mut n: Vec<String> = c
        .peer()
        .list_all_tools()
        .await
        .unwrap()
        .iter()
        .map(|t| t.name.to_string())
        .collect();
    n.sort();
    n
}

/// A reload changes and removes `mcp:` servers while sessions live: the
/// changed server is stopped in the live session and started anew from
/// the new policy at its next call (its narrower `allow` listed), the
/// removed one is refused, and the unchanged server keeps running (the
/// same instance) as do the session and its command tool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_restarts_a_changed_mcp_server_and_keeps_the_unchanged_one_and_the_session() {
    let d = tempdir();
    let m = d.path().join("m.yaml");
    std::fs::write(&m, with_servers(Some("echo, probe"), "256M")).unwrap();
    let audit = d.path().join("audit.jsonl");
    let serve = Serve::manifest(env!("CARGO_BIN_EXE_cordon"), &m, &audit).http();
    let c = ().serve(cordon_mcp::http_client(&serve.url)).await.unwrap();
    let changes = ListChanges::default();
    let watcher = changes
        .clone()
        .serve(cordon_mcp::http_client(&serve.url))
        .await
        .unwrap();
    assert_eq!(
        names(&c).await,
        ["counter", "fx__echo", "fx__probe", "fy__echo", "fy__probe"]
    );
    let fx = instance(&c, "fx__probe").await;
    let fy = instance(&c, "fy__probe").await;
    // Positive control: a server lives for its session.
    assert_eq!(instance(&c, "fx__probe").await, fx);
    count(&c).await;

    // `fx` changed: `echo` no longer allowed, a lower memory limit.
    std::fs::write(&m, with_servers(Some("probe"), "192M")).unwrap();
    signal("HUP", serve.pid());
    let applied = wait_for_reload(&audit, "reloaded", 1).await;
    assert_eq!(applied["status"], "ok", "{applied:#}");
    assert_eq!(changes.until(1).await, 1, "list_changed after the reload");
    assert_eq!(
        names(&c).await,
        ["counter", "fx__probe", "fy__echo", "fy__probe"]
    );
    let e = mcp_error(
        call(&c, "fx__echo", json!({"text": "hi"}))
            .await
            .unwrap_err(),
    );
    assert!(
        e.message
            .contains("unknown tool `fx__echo`; server fx exposes: fx__probe"),
        "a tool the reload took out is refused: {e:?}"
    );
    let fx2 = instance(&c, "fx__probe").await;
    assert_ne!(fx2, fx, "the changed server was started anew");
    assert_eq!(
        instance(&c, "fy__probe").await,
        fy,
        "the unchanged server kept"
    );
    count(&c).await;

    // `fx` removed.
    std::fs::write(&m, with_servers(None, "192M")).unwrap();
    signal("HUP", serve.pid());
    wait_for_reload(&audit, "reloaded", 2).await;
    assert_eq!(changes.until(2).await, 2, "list_changed after the removal");
    assert_eq!(names(&c).await, ["counter", "fy__echo", "fy__probe"]);
    let e = mcp_error(call(&c, "fx__probe", json!({})).await.unwrap_err());
    assert!(
        e.message.contains("unknown tool `fx__probe`"),
        "a removed server's tool is refused: {e:?}"
    );
    assert_eq!(
        instance(&c, "fy__probe").await,
        fy,
        "the unchanged server kept"
    );
    count(&c).await;
    let sessions: std::collections::BTreeSet<String> = audit_records(&audit)
        .into_iter()
        .filter(|r| r["tool"] == "counter" && r["status"] == "ok" && r["service"].is_null())
        .filter_map(|r| r["session"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(sessions.len(), 1, "every call on one session: {sessions:?}");
    c.cancel().await.unwrap();
    watcher.cancel().await.unwrap();
}

/// `cordon` itself, its output.
fn cordon(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(args)
        .output()
        .unwrap()
}

/// Every run of a tool's probes while serving (here SIGUSR1's) keeps a
/// signed report that `cordon report verify` accepts with the key and
/// refuses with another key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_run_while_serving_keeps_a_signed_report() {
    let d = tempdir();
    let m = d.path().join("m.yaml");
    std::fs::write(&m, counter("128M", "Count v1")).unwrap();
    let audit = d.path().join("audit.jsonl");
    let key = d.path().join("k.pem");
    let other = d.path().join("other.pem");
    for k in [&key, &other] {
        let o = cordon(&["key", "init", "--key", k.to_str().unwrap()]);
        assert!(o.status.success(), "{o:?}");
    }
    let reports = d.path().join("reports");
    let serve = Serve::manifest(env!("CARGO_BIN_EXE_cordon"), &m, &audit)
        .arg("--reports")
        .arg(&reports)
        .arg("--report-key")
        .arg(&key)
        .http();
    let c = ().serve(cordon_mcp::http_client(&serve.url)).await.unwrap();
    count(&c).await;
    let kept = || -> Vec<std::path::PathBuf> {
        std::fs::read_dir(&reports)
            .map(|rd| rd.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    // Only the start's proof so far, which keeps none.
    assert!(kept().is_empty(), "{:?}", kept());
    signal("USR1", serve.pid());
    let begun = Instant::now();
    let file = loop {
        if let Some(f) = kept()
            .into_iter()
            .find(|f| f.to_string_lossy().ends_with("-signal.json"))
        {
            break f;
        }
        assert!(
            begun.elapsed() < DEADLINE,
            "no report {DEADLINE:?} after SIGUSR1"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        file.file_name()
            .unwrap()
            .to_string_lossy()
            .starts_with("counter-"),
        "{file:?}"
    );
    let f = file.to_str().unwrap();
    let o = cordon(&[
        "report",
        "verify",
        f,
        "--key",
        &format!("{}.pub", key.display()),
    ]);
    assert!(o.status.success(), "{o:?}");
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("tool counter (P1, native, policy sha256:"),
        "{out}"
    );
    assert!(out.contains("no probe escaped"), "{out}");
    let o = cordon(&[
        "report",
        "verify",
        f,
        "--key",
        &format!("{}.pub", other.display()),
    ]);
    assert_eq!(o.status.code(), Some(1), "another key refuses it: {o:?}");
    c.cancel().await.unwrap();
}
