//! Grants and tenants over streamable HTTP, with two principals of two
//! tenants: what is not granted is invisible and refused (the granted
//! principal, as the positive control, sees and calls it); a session is
//! served only to the principal that opened it; a pooled sandbox made for
//! one tenant is never handed to another; the audit log is queried by
//! principal and tenant.
//!
//! The principal comes from a test authenticator through the gateway's
//! `Authenticator` seam (a header the product never accepts).

use cordon_testkit::skip;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cordon_auth::{Method, Principal};
use cordon_mcp::http::{Authenticated, Authenticator};
use cordon_mcp::rmcp;
use cordon_mcp::{Gateway, GatewayOptions, HttpOptions};
use rmcp::ServiceExt;
use rmcp::model::{
    CallToolRequestParams, CallToolResult, GetPromptRequestParams, JsonObject,
    ReadResourceRequestParams,
};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::{Value, json};

const HEADER: &str = "x-test-principal";

/// `subject;tenant;group,group` in [`HEADER`]; no header is refused.
struct TestHeader;

impl Authenticator for TestHeader {
    fn authenticate<'a>(
        &'a self,
        parts: &'a axum::http::request::Parts,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Authenticated> + Send + 'a>> {
        Box::pin(async move {
            let Some(v) = parts.headers.get(HEADER).and_then(|v| v.to_str().ok()) else {
                let mut r = axum::response::Response::new(axum::body::Body::empty());
                *r.status_mut() = axum::http::StatusCode::UNAUTHORIZED;
                return Err(r);
            };
            let mut f = v.split(';');
            let subject = f.next().unwrap_or_default().to_string();
            let tenant = f.next().unwrap_or_default().to_string();
            let groups = f
                .next()
                .unwrap_or_default()
                .split(',')
                .filter(|g| !g.is_empty())
                .map(str::to_string)
                .collect();
            Ok(Principal {
                subject,
                client_id: Some("test-client".into()),
                groups,
                tenant,
                method: Method::StaticToken,
            })
        })
    }
}

const ALICE: &str = "alice;acme;analysts";
const BOB: &str = "bob;globex;";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn manifest(dir: &Path) -> PathBuf {
    let m = format!(
        r#"tools:
  word_count:
    profile: P1
    command: ["/usr/bin/wc", "-w"]
    input: {{stdin: text}}
    input_schema: {{type: object, properties: {{text: {{type: string}}}}, required: [text]}}
  byte_count:
    profile: P1
    command: ["/usr/bin/wc", "-c"]
    input: {{stdin: text}}
    input_schema: {{type: object, properties: {{text: {{type: string}}}}, required: [text]}}
  started:
    profile: P1
    description: When this call's sandbox was started (clock ticks since boot).
    lifetime: pool
    pool: {{size: 1}}
    command: ["/bin/sh", "-c", "cut -d' ' -f22 /proc/$$/stat"]
  fx:
    profile: P2
    network: none
    limits: {{wall_seconds: 10, memory: 256M, tasks: 16}}
    mounts: ["{fixtures}:/fixture"]
    mcp:
      command: ["/usr/bin/python3", "/fixture/fixture_server.py", "--resources", "--prompts"]
access:
  grants:
    - group: analysts
      tenant: acme
      tools: [word_count, started, "fx__e*", "s*", fx__gone]
      prompts: ["fx__*"]
      resources: ["fx://note"]
    - tenant: globex
      tools: [byte_count, started]
"#,
        fixtures = fixtures().display()
    );
    let p = dir.join("cordon.yaml");
    std::fs::write(&p, m).unwrap();
    p
}

struct Served {
    url: String,
    audit: PathBuf,
    _gateway: cordon_testkit::serve::Gateway,
    _dir: cordon_testkit::Scratch,
}

async fn serve() -> Option<Served> {
    if !cordon_testkit::is_root() {
        skip::skip_or_fail(
            "access",
            "the gateway's sandboxes are set up as root in this suite",
        );
        return None;
    }
    if !Path::new("/usr/bin/python3").exists() {
        skip::skip_or_fail("access", "/usr/bin/python3 is missing (the fixture server)");
        return None;
    }
    let dir = cordon_testkit::scratch();
    let audit = dir.path().join("audit.jsonl");
    let opts = GatewayOptions {
        audit: Some(audit.clone()),
        ..GatewayOptions::default()
    };
    let gw = Gateway::from_manifest(&manifest(dir.path()), &opts).expect("gateway");
    let names = gw.tool_names();
    for t in ["word_count", "byte_count", "started", "fx"] {
        assert!(
            names.iter().any(|n| n == t),
            "{t} not served: {:?}",
            gw.warnings()
        );
    }
    let http = HttpOptions {
        authenticator: Some(Arc::new(TestHeader)),
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

async fn client(url: &str, who: &str) -> Client {
    cordon_mcp::install_crypto_provider();
    let mut headers = HashMap::new();
    headers.insert(
        reqwest::header::HeaderName::from_static(HEADER),
        reqwest::header::HeaderValue::from_str(who).unwrap(),
    );
    let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
    let t = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    ().serve(t).await.expect("initialize over HTTP")
}

fn args(v: Value) -> Option<JsonObject> {
    v.as_object().cloned()
}

async fn call(c: &Client, tool: &str, a: Value) -> Result<CallToolResult, ServiceError> {
    let mut p = CallToolRequestParams::new(tool.to_owned());
    p.arguments = args(a);
    c.peer().call_tool(p).await
}

/// The `cordon/status` of a refused request.
fn status(e: ServiceError) -> String {
    match e {
        ServiceError::McpError(e) => e
            .data
            .as_ref()
            .and_then(|d| d.get("cordon/status"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned(),
        other => panic!("not an MCP error: {other}"),
    }
}

fn text_of(r: &CallToolResult) -> String {
    r.content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect()
}

async fn tool_names(c: &Client) -> Vec<String> {
    let mut v: Vec<String> = c
        .peer()
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.to_string())
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn grants_hide_and_refuse_what_they_do_not_give() {
    let Some(s) = serve().await else { return };
    let alice = client(&s.url, ALICE).await;
    let bob = client(&s.url, BOB).await;

    // Listings: each sees exactly what it was granted.
    assert_eq!(
        tool_names(&alice).await,
        ["fx__echo", "started", "word_count"]
    );
    assert_eq!(tool_names(&bob).await, ["byte_count", "started"]);

    // The positive control: the granted principal calls it.
    let r = call(&alice, "word_count", json!({"text": "a b c"}))
        .await
        .unwrap();
    assert!(text_of(&r).contains('3'), "{r:?}");
    let r = call(&alice, "fx__echo", json!({"text": "hi"}))
        .await
        .unwrap();
    assert!(text_of(&r).contains("hi"), "{r:?}");
    // The same tools are refused to the other principal, typed, and so
    // is a name that does not exist (nothing tells the two apart).
    for name in ["word_count", "fx__echo", "fx__secret", "no_such_tool"] {
        let e = call(&bob, name, json!({"text": "a b c"}))
            .await
            .unwrap_err();
        assert_eq!(status(e), "not_granted", "{name}");
    }
    let r = call(&bob, "byte_count", json!({"text": "abcd"}))
        .await
        .unwrap();
    assert!(text_of(&r).contains('4'), "{r:?}");
    let e = call(&alice, "byte_count", json!({"text": "a"}))
        .await
        .unwrap_err();
    assert_eq!(status(e), "not_granted");
    // A server tool outside the glob is refused to the granted principal.
    let e = call(&alice, "fx__crash", json!({})).await.unwrap_err();
    assert_eq!(status(e), "not_granted");

    // Prompts and resources, likewise.
    let prompts: Vec<String> = alice
        .peer()
        .list_all_prompts()
        .await
        .unwrap()
        .into_iter()
        .map(|p| p.name)
        .collect();
    assert!(prompts.iter().any(|p| p == "fx__greet"), "{prompts:?}");
    let resources: Vec<String> = alice
        .peer()
        .list_all_resources()
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.uri.clone())
        .collect();
    assert_eq!(resources, ["fx://note"]);
    alice
        .peer()
        .read_resource(ReadResourceRequestParams::new("fx://note"))
        .await
        .expect("a granted resource is read");
    let e = alice
        .peer()
        .read_resource(ReadResourceRequestParams::new("fx://hostile"))
        .await
        .unwrap_err();
    assert_eq!(status(e), "not_granted");

    // Bob is granted no prompt or resource: none listed, none got or read.
    match bob.peer().list_all_prompts().await {
        Ok(p) => assert!(p.is_empty(), "{p:?}"),
        Err(e) => panic!("prompts/list: {e}"),
    }
    match bob.peer().list_all_resources().await {
        Ok(r) => assert!(r.is_empty(), "{r:?}"),
        Err(e) => panic!("resources/list: {e}"),
    }
    let e = bob
        .peer()
        .get_prompt(GetPromptRequestParams::new("fx__greet"))
        .await
        .unwrap_err();
    assert_eq!(status(e), "not_granted");
    let e = bob
        .peer()
        .read_resource(ReadResourceRequestParams::new("fx://note"))
        .await
        .unwrap_err();
    assert_eq!(status(e), "not_granted");
    alice.cancel().await.unwrap();
    bob.cancel().await.unwrap();

    // Every refusal is audited as denied, with the principal; a query by
    // principal or tenant returns only theirs.
    let q = |principal: Option<&str>, tenant: Option<&str>| -> Vec<cordon_audit::AuditRecord> {
        let f = cordon_audit::Filter {
            principal: principal.map(Into::into),
            tenant: tenant.map(Into::into),
            ..Default::default()
        };
        cordon_audit::query(&s.audit, &f)
            .collect::<Result<_, _>>()
            .unwrap()
    };
    let bobs = q(Some("bob"), None);
    assert!(!bobs.is_empty());
    assert!(bobs.iter().all(|r| r.principal.as_deref() == Some("bob")
        && r.tenant.as_deref() == Some("globex")));
    let denied: Vec<&str> = bobs
        .iter()
        .filter(|r| r.status == cordon_audit::Status::Denied)
        .map(|r| r.tool.as_str())
        .collect();
    for name in ["word_count", "fx__echo", "fx__secret", "no_such_tool"] {
        assert!(
            denied.contains(&name),
            "{name} not audited as denied: {denied:?}"
        );
    }
    assert!(
        bobs.iter()
            .any(|r| r.tool == "byte_count" && r.status == cordon_audit::Status::Ok)
    );
    let acme = q(None, Some("acme"));
    assert!(
        acme.iter()
            .any(|r| r.tool == "word_count" && r.status == cordon_audit::Status::Ok)
    );
    assert!(acme.iter().all(|r| r.principal.as_deref() == Some("alice")));
    assert!(q(Some("alice"), Some("globex")).is_empty());
}

/// The `mcp-session-id` of an `initialize` sent as `who`.
async fn raw_initialize(http: &reqwest::Client, url: &str, who: &str) -> String {
    let r = raw(
        http,
        url,
        who,
        None,
        json!({
            "jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "raw", "version": "0"}}
        }),
    )
    .await;
    assert!(r.status().is_success(), "{}", r.status());
    let id = r
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_owned());
    let status = r.status();
    let headers = format!("{:?}", r.headers());
    let body = r.text().await;
    let Some(id) = id else {
        panic!("no session id: {status} {headers} {body:?}");
    };
    let r = raw(
        http,
        url,
        who,
        Some(&id),
        json!({
            "jsonrpc": "2.0", "method": "notifications/initialized"
        }),
    )
    .await;
    assert!(r.status().is_success(), "{}", r.status());
    id
}

async fn raw(
    http: &reqwest::Client,
    url: &str,
    who: &str,
    session: Option<&str>,
    body: Value,
) -> reqwest::Response {
    let mut req = http
        .post(url)
        .header(HEADER, who)
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .body(body.to_string());
    if let Some(s) = session {
        req = req.header("mcp-session-id", s);
    }
    req.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_is_served_only_to_the_principal_that_opened_it() {
    let Some(s) = serve().await else { return };
    cordon_mcp::install_crypto_provider();
    let http = reqwest::Client::new();
    let id = raw_initialize(&http, &s.url, ALICE).await;
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    // The positive control: its own principal is served.
    let mine = raw(&http, &s.url, ALICE, Some(&id), list.clone()).await;
    let mine = mine.text().await.unwrap();
    assert!(mine.contains("word_count"), "{mine}");
    // Another principal with the same session id is refused, before the
    // session sees the request.
    let refused = |r: reqwest::Response| async move {
        let status = r.status();
        let text = r.text().await.unwrap();
        assert_eq!(status, reqwest::StatusCode::FORBIDDEN, "{text}");
        assert!(text.contains("opened by another principal"), "{text}");
        assert!(!text.contains("word_count"), "{text}");
    };
    refused(raw(&http, &s.url, BOB, Some(&id), list).await).await;
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                      "params": {"name": "started", "arguments": {}}});
    refused(raw(&http, &s.url, BOB, Some(&id), call).await).await;
    // A second initialize by another principal does not take it over.
    let again = raw(
        &http,
        &s.url,
        BOB,
        Some(&id),
        json!({
            "jsonrpc": "2.0", "id": 4, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "raw", "version": "0"}}
        }),
    )
    .await
    .text()
    .await
    .unwrap();
    assert!(!again.contains("\"serverInfo\""), "{again}");
    let list = json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"});
    let mine = raw(&http, &s.url, ALICE, Some(&id), list)
        .await
        .text()
        .await
        .unwrap();
    assert!(mine.contains("word_count"), "{mine}");
    // The refused call is audited as denied, as bob's.
    let f = cordon_audit::Filter {
        principal: Some("bob".into()),
        ..Default::default()
    };
    let recs: Vec<_> = cordon_audit::query(&s.audit, &f)
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    assert!(
        recs.iter().any(|r| r.status == cordon_audit::Status::Denied
            && r.session == id
            && r.reason
                .as_deref()
                .is_some_and(|x| x.contains("another principal"))),
        "{recs:#?}"
    );
}

/// Clock ticks since boot now (the unit of a process's start time in
/// `/proc/<pid>/stat`, on the same clock).
fn ticks_now() -> u64 {
    let up = std::fs::read_to_string("/proc/uptime").unwrap();
    let secs = up.split_whitespace().next().unwrap();
    let (s, frac) = secs.split_once('.').unwrap();
    // /proc/uptime has two decimals: hundredths, as USER_HZ is 100.
    s.parse::<u64>().unwrap() * 100 + frac.parse::<u64>().unwrap()
}

/// When the sandbox of a call of `started` was started.
async fn started(c: &Client) -> u64 {
    let r = call(c, "started", json!({})).await.unwrap();
    let t = text_of(&r);
    t.lines()
        .find_map(|l| l.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no start time in {t:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_never_gets_a_sandbox_pooled_for_another() {
    let Some(s) = serve().await else { return };
    let alice = client(&s.url, ALICE).await;
    let bob = client(&s.url, BOB).await;
    // The positive control: once alice's pool is warm, her call takes a
    // sandbox started before the call.
    let _ = started(&alice).await;
    let mut pooled = false;
    for _ in 0..40 {
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        let before = ticks_now();
        if started(&alice).await < before {
            pooled = true;
            break;
        }
    }
    assert!(pooled, "alice's calls never took a pooled sandbox");
    // Alice's pool is warm again (the refill), but bob's first call gets
    // no sandbox of it: his was started after his call began.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let before = ticks_now();
    let bobs = started(&bob).await;
    assert!(
        bobs >= before,
        "bob's first call took a sandbox started before it ({bobs} < {before})"
    );
    // Both at once: distinct sandboxes, each from its own tenant's pool.
    let (a, b) = tokio::join!(started(&alice), started(&bob));
    assert_ne!(a, 0);
    assert_ne!(b, 0);
    alice.cancel().await.unwrap();
    bob.cancel().await.unwrap();
    let f = |t: &str| cordon_audit::Filter {
        tenant: Some(t.into()),
        tool: Some("started".into()),
        ..Default::default()
    };
    let acme: Vec<_> = cordon_audit::query(&s.audit, &f("acme"))
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let globex: Vec<_> = cordon_audit::query(&s.audit, &f("globex"))
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    assert!(acme.len() >= 3 && acme.iter().all(|r| r.principal.as_deref() == Some("alice")));
    assert_eq!(globex.len(), 2);
    assert!(globex.iter().all(|r| r.principal.as_deref() == Some("bob")));
}

/// A gateway over `manifest` whose broker has (or lacks) a subordinate
/// range for tenants' host uids.
async fn serve_with_uids(manifest: &str, uids: cordon_broker::tenant_uids::Availability) -> Served {
    let dir = cordon_testkit::scratch();
    let m = dir.path().join("cordon.yaml");
    std::fs::write(&m, manifest).unwrap();
    let audit = dir.path().join("audit.jsonl");
    let opts = GatewayOptions {
        audit: Some(audit.clone()),
        ..GatewayOptions::default()
    };
    let broker = Arc::new(
        cordon_broker::Broker::new(cordon_broker::BrokerOptions {
            audit: Some(audit.clone()),
            tenant_uids: Some(uids),
            ..Default::default()
        })
        .unwrap(),
    );
    let sandbox = Arc::new(cordon_mcp::servers_for(&broker, &opts));
    let loaded = cordon_policy::load(&m).unwrap();
    let gw = Gateway::new(&loaded.policy, broker, sandbox).unwrap();
    assert!(
        gw.tool_names().iter().any(|n| n == "mark"),
        "{:?}",
        gw.warnings()
    );
    let http = HttpOptions {
        authenticator: Some(Arc::new(TestHeader)),
        ..HttpOptions::default()
    };
    let gateway = cordon_testkit::serve::gateway(gw, http).await;
    Served {
        url: gateway.url.clone(),
        audit,
        _gateway: gateway,
        _dir: dir,
    }
}

const MARK: &str = r#"tools:
  mark:
    profile: P1
    lifetime: pool
    pool: {size: 1}
    command: ["/bin/cat", "/proc/self/uid_map"]
"#;

/// The host uid a call of `mark` ran as: its user namespace's map says
/// `<inner uid> <host uid> 1`.
async fn marked_by(c: &Client) -> u32 {
    let r = call(c, "mark", json!({})).await.unwrap();
    let t = text_of(&r);
    t.lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() == 3 && f[2] == "1")
                .then(|| f[1].parse().ok())
                .flatten()
        })
        .unwrap_or_else(|| panic!("no uid map in {t:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_tenant_runs_under_a_host_uid_of_its_own() {
    use cordon_broker::tenant_uids::{Availability, TenantUids};
    if !cordon_testkit::is_root() {
        skip::skip_or_fail("tenant uids", "only a root broker maps other host uids");
        return;
    }
    // The control: without a range every tenant is the shared uid.
    let s = serve_with_uids(MARK, Availability::Off("no range (test)".into())).await;
    let alice = client(&s.url, ALICE).await;
    let bob = client(&s.url, BOB).await;
    assert_eq!(marked_by(&alice).await, 65534);
    assert_eq!(marked_by(&bob).await, 65534);
    alice.cancel().await.unwrap();
    bob.cancel().await.unwrap();
    let recs: Vec<_> = cordon_audit::query(&s.audit, &Default::default())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    // Every call's record (the sessions' ends, at the clients' DELETE,
    // name no sandbox).
    let calls: Vec<_> = recs.iter().filter(|r| r.tool == "mark").collect();
    assert_eq!(calls.len(), 2, "{recs:#?}");
    assert!(
        calls
            .iter()
            .all(|r| r.tenant_uid.is_none() && r.shared_uid.as_deref() == Some("no range (test)")),
        "{recs:#?}"
    );
    drop(s);

    let state = cordon_testkit::scratch();
    let uids = TenantUids {
        uid_first: 420_000,
        gid_first: 420_000,
        count: 16,
        state_dir: state.path().join("tenant-uids"),
    };
    let s = serve_with_uids(MARK, Availability::InForce(uids.clone())).await;
    let alice = client(&s.url, ALICE).await;
    let bob = client(&s.url, BOB).await;
    let (a, b) = tokio::join!(marked_by(&alice), marked_by(&bob));
    assert_ne!(a, b, "two tenants share host uid {a}");
    assert!((420_000..420_016).contains(&a) && (420_000..420_016).contains(&b));
    // Stable: later calls (from the refilled pools) keep each tenant's uid.
    assert_eq!(marked_by(&alice).await, a);
    assert_eq!(marked_by(&bob).await, b);
    assert_eq!(uids.ids_of("acme").unwrap().0, a);
    assert_eq!(uids.ids_of("globex").unwrap().0, b);
    alice.cancel().await.unwrap();
    bob.cancel().await.unwrap();
    let recs: Vec<_> = cordon_audit::query(&s.audit, &Default::default())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let calls: Vec<_> = recs.iter().filter(|r| r.tool == "mark").collect();
    assert_eq!(calls.len(), 4, "{recs:#?}");
    for r in calls {
        let want = if r.tenant.as_deref() == Some("acme") {
            a
        } else {
            b
        };
        assert_eq!(r.tenant_uid, Some(want), "{r:#?}");
        assert!(r.shared_uid.is_none(), "{r:#?}");
    }
}

/// A request for another principal's session whose audit record cannot be
/// written (the log is /dev/full) is refused all the same; the record's
/// loss is counted for `cordon doctor` and said in the next call's
/// warnings (fail-open, so that the next call returns at all).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refusal_whose_record_cannot_be_written_is_refused_counted_and_said() {
    if cordon_sys::io::geteuid() != 0 {
        skip::skip_or_fail(
            "access",
            "the gateway's sandboxes are set up as root in this suite",
        );
        return;
    }
    let dir = cordon_testkit::scratch();
    let m = manifest(dir.path());
    let unwritten = dir.path().join("state/audit-unwritten.jsonl");
    let broker = Arc::new(
        cordon_broker::Broker::new(cordon_broker::BrokerOptions {
            audit: Some("/dev/full".into()),
            audit_fail_open: true,
            audit_unwritten: Some(unwritten.clone()),
            ..Default::default()
        })
        .unwrap(),
    );
    let opts = GatewayOptions {
        audit: Some("/dev/full".into()),
        audit_fail_open: true,
        ..GatewayOptions::default()
    };
    let sandbox = Arc::new(cordon_mcp::servers_for(&broker, &opts));
    let loaded = cordon_policy::load(&m).unwrap();
    let gw = Gateway::new(&loaded.policy, broker, sandbox).unwrap();
    let http_opts = HttpOptions {
        authenticator: Some(Arc::new(TestHeader)),
        ..HttpOptions::default()
    };
    let gateway = cordon_testkit::serve::gateway(gw, http_opts).await;
    let url = gateway.url.clone();
    let _served = Served {
        url: url.clone(),
        audit: "/dev/full".into(),
        _gateway: gateway,
        _dir: dir,
    };
    cordon_mcp::install_crypto_provider();
    let http = reqwest::Client::new();
    let id = raw_initialize(&http, &url, ALICE).await;
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    // The positive control: its own principal is served.
    let mine = raw(&http, &url, ALICE, Some(&id), list.clone())
        .await
        .text()
        .await
        .unwrap();
    assert!(mine.contains("word_count"), "{mine}");
    assert_eq!(
        cordon_audit::read_unwritten(&unwritten).unwrap().count,
        0,
        "nothing was to be recorded yet"
    );
    let r = raw(&http, &url, BOB, Some(&id), list).await;
    let status = r.status();
    let text = r.text().await.unwrap();
    assert_eq!(status, reqwest::StatusCode::FORBIDDEN, "{text}");
    assert!(text.contains("opened by another principal"), "{text}");
    // Counted, with what it was about and whose session.
    let u = cordon_audit::read_unwritten(&unwritten).unwrap();
    assert_eq!(u.count, 1, "{u:?}");
    let last = u.last.unwrap();
    assert_eq!(
        (last.what.as_str(), last.session.as_str()),
        ("refusal", id.as_str())
    );
    // And said in the next call's warnings.
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
                      "params": {"name": "word_count", "arguments": {"text": "a b c"}}});
    let answer = raw(&http, &url, ALICE, Some(&id), call)
        .await
        .text()
        .await
        .unwrap();
    assert!(
        answer.contains("cordon/warnings")
            && answer.contains(&format!("the audit record of refusal (-, session {id})")),
        "{answer}"
    );
}

/// Counts the servers started through it (the broker's own sandboxes).
struct Counting {
    inner: cordon_mcp::RuntimeServers,
    started: Arc<std::sync::atomic::AtomicUsize>,
}

impl cordon_mcp::ServerSandbox for Counting {
    fn start(
        &self,
        who: &cordon_broker::Caller,
        policy: &cordon_policy::policy::ToolPolicy,
        argv: &[String],
    ) -> Result<cordon_mcp::ServerProcess, String> {
        self.started
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        self.inner.start(who, policy, argv)
    }
}

/// [`serve`]'s gateway, counting the servers it starts.
async fn serve_counting() -> Option<(Served, Arc<std::sync::atomic::AtomicUsize>)> {
    if !cordon_testkit::is_root() || !Path::new("/usr/bin/python3").exists() {
        skip::skip_or_fail(
            "access",
            "needs root and /usr/bin/python3 (the fixture server)",
        );
        return None;
    }
    let dir = cordon_testkit::scratch();
    let audit = dir.path().join("audit.jsonl");
    let opts = GatewayOptions {
        audit: Some(audit.clone()),
        ..GatewayOptions::default()
    };
    let broker = Arc::new(
        cordon_broker::Broker::new(cordon_broker::BrokerOptions {
            audit: Some(audit.clone()),
            ..Default::default()
        })
        .unwrap(),
    );
    let started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let sandbox = Arc::new(Counting {
        inner: cordon_mcp::servers_for(&broker, &opts),
        started: started.clone(),
    });
    let loaded = cordon_policy::load(&manifest(dir.path())).unwrap();
    let gw = Gateway::new(&loaded.policy, broker, sandbox).unwrap();
    let http = HttpOptions {
        authenticator: Some(Arc::new(TestHeader)),
        ..HttpOptions::default()
    };
    let gateway = cordon_testkit::serve::gateway(gw, http).await;
    Some((
        Served {
            url: gateway.url.clone(),
            audit,
            _gateway: gateway,
            _dir: dir,
        },
        started,
    ))
}

/// The message of a refused request.
fn message(e: &ServiceError) -> String {
    match e {
        ServiceError::McpError(e) => e.message.to_string(),
        other => panic!("not an MCP error: {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_name_granted_only_by_a_pattern_that_does_not_exist_reads_as_not_granted() {
    let Some((s, started)) = serve_counting().await else {
        return;
    };
    let n = || started.load(std::sync::atomic::Ordering::SeqCst);
    let alice = client(&s.url, ALICE).await;
    // (`initialize` starts fx once, to learn what it offers.)
    let at_start = n();

    // `s*` gives `sx`, which does not exist: the same answer as a name no
    // grant gives, and nothing is started to find out.
    for name in ["sx", "zz"] {
        let e = call(&alice, name, json!({})).await.unwrap_err();
        assert_eq!(
            message(&e),
            format!("tool `{name}` is not granted to `alice`"),
            "{name}"
        );
        assert_eq!(status(e), "not_granted", "{name}");
    }
    assert_eq!(n(), at_start, "a name no server could own started a server");

    // The positive control: listed, then granted by the pattern and
    // existing, it is called.
    assert_eq!(
        tool_names(&alice).await,
        ["fx__echo", "started", "word_count"]
    );
    let listed = n();
    let r = call(&alice, "fx__echo", json!({"text": "hi"}))
        .await
        .unwrap();
    assert!(text_of(&r).contains("hi"), "{r:?}");

    // `fx__e*` gives `fx__eX`, which fx does not have: refused as not
    // granted, naming nothing of fx, with nothing started for it; and
    // `fx__secret` (fx has it, no grant gives it) reads the same.
    for name in ["fx__eX", "fx__secret"] {
        let e = call(&alice, name, json!({"text": "hi"})).await.unwrap_err();
        assert_eq!(
            message(&e),
            format!("tool `{name}` is not granted to `alice`"),
            "{name}"
        );
        assert_eq!(status(e), "not_granted", "{name}");
    }
    assert_eq!(n(), listed, "a refused name started a server");

    // A name a grant gives literally that does not exist is unknown, and
    // the answer names only what alice is granted.
    let e = call(&alice, "fx__gone", json!({})).await.unwrap_err();
    assert_eq!(
        message(&e),
        "unknown tool `fx__gone`; cordon serves: started, word_count, fx__echo"
    );
    assert_eq!(status(e), "unknown_tool");
    alice.cancel().await.unwrap();

    // Prompts likewise: `fx__*` gives `fx__nope`, which fx lacks.
    let alice = client(&s.url, ALICE).await;
    let e = alice
        .peer()
        .get_prompt(GetPromptRequestParams::new("fx__nope"))
        .await
        .unwrap_err();
    assert_eq!(message(&e), "prompt `fx__nope` is not granted to `alice`");
    alice
        .peer()
        .get_prompt(GetPromptRequestParams::new("fx__greet"))
        .await
        .expect("a granted prompt is got");
    alice.cancel().await.unwrap();
}

/// A gateway over the manifest `text`, behind the test authenticator.
async fn serve_text(text: &str) -> Option<Served> {
    if !cordon_testkit::is_root() {
        skip::skip_or_fail(
            "access",
            "the gateway's sandboxes are set up as root in this suite",
        );
        return None;
    }
    let dir = cordon_testkit::scratch();
    let m = dir.path().join("cordon.yaml");
    std::fs::write(&m, text).unwrap();
    let audit = dir.path().join("audit.jsonl");
    let opts = GatewayOptions {
        audit: Some(audit.clone()),
        ..GatewayOptions::default()
    };
    let gw = Gateway::from_manifest(&m, &opts).expect("gateway");
    let http = HttpOptions {
        authenticator: Some(Arc::new(TestHeader)),
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

const ONE_SESSION: &str = r#"tools:
  word_count:
    profile: P1
    command: ["/usr/bin/wc", "-w"]
    input: {stdin: text}
    input_schema: {type: object, properties: {text: {type: string}}, required: [text]}
gateway:
  per_principal: {sessions: 1}
"#;

fn initialize_body() -> Value {
    json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "raw", "version": "0"}}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_initialize_hands_out_no_session_and_an_ended_one_says_so() {
    let Some(s) = serve_text(ONE_SESSION).await else {
        return;
    };
    cordon_mcp::install_crypto_provider();
    let http = reqwest::Client::new();
    // The positive control: the first session is opened, with its id.
    let id = raw_initialize(&http, &s.url, ALICE).await;

    // A second one is over alice's cap: refused, and no id handed out.
    let r = raw(&http, &s.url, ALICE, None, initialize_body()).await;
    assert!(
        r.headers().get("mcp-session-id").is_none(),
        "a refused initialize handed out a session id: {:?}",
        r.headers()
    );
    let body = r.text().await.unwrap();
    assert!(
        body.contains("alice has 1 sessions open already (`per_principal.sessions`)"),
        "{body}"
    );

    // A call in the live session is audited under the id the client has.
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                      "params": {"name": "word_count", "arguments": {"text": "a b"}}});
    let r = raw(&http, &s.url, ALICE, Some(&id), call).await;
    let body = r.text().await.unwrap();
    assert!(body.contains("\"result\""), "{body}");
    let f = cordon_audit::Filter {
        principal: Some("alice".into()),
        ..Default::default()
    };
    let recs: Vec<_> = cordon_audit::query(&s.audit, &f)
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    assert!(
        recs.iter().any(|r| r.tool == "word_count"
            && r.status == cordon_audit::Status::Ok
            && r.session == id),
        "{id}: {recs:#?}"
    );

    // Ended by its client: then its id gets the 404 that says so, to its
    // own principal; another principal is still refused it.
    let r = http
        .delete(&s.url)
        .header(HEADER, ALICE)
        .header("mcp-session-id", &id)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let list = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/list"});
    let r = raw(&http, &s.url, ALICE, Some(&id), list.clone()).await;
    assert_eq!(r.status(), reqwest::StatusCode::NOT_FOUND);
    let body = r.text().await.unwrap();
    assert!(
        body.contains(&format!(
            "session expired: session {id} was ended by its client (DELETE); start a new session (initialize)"
        )),
        "{body}"
    );
    // The end is audited like any other: once, under its id and principal.
    let recs: Vec<_> = cordon_audit::query(&s.audit, &f)
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let ended: Vec<_> = recs
        .iter()
        .filter(|r| r.status == cordon_audit::Status::SessionEnded && r.session == id)
        .collect();
    assert_eq!(ended.len(), 1, "{id}: {recs:#?}");
    assert_eq!(
        ended[0].reason.as_deref(),
        Some("session was ended by its client (DELETE); every sandbox of it was stopped")
    );
    let r = raw(&http, &s.url, BOB, Some(&id), list).await;
    assert_eq!(r.status(), reqwest::StatusCode::FORBIDDEN);
    assert_eq!(
        r.text().await.unwrap(),
        "this session was opened by another principal"
    );
    // Its slot is free again: a new session is opened.
    let again = raw_initialize(&http, &s.url, ALICE).await;
    assert_ne!(again, id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_server_no_grant_could_give_a_caller_anything_of_is_never_started_for_it() {
    let Some((s, started)) = serve_counting().await else {
        return;
    };
    let n = || started.load(std::sync::atomic::Ordering::SeqCst);
    // bob's grants name nothing fx could expose: initialize, listings and
    // a call of an fx name start nothing (no sandbox, no workspace or
    // state directory of his tenant).
    let bob = client(&s.url, BOB).await;
    assert_eq!(tool_names(&bob).await, ["byte_count", "started"]);
    match bob.peer().list_all_prompts().await {
        Ok(p) => assert!(p.is_empty(), "{p:?}"),
        Err(e) => assert!(e.to_string().contains("no MCP server"), "{e}"),
    }
    let e = call(&bob, "fx__echo", json!({"text": "hi"}))
        .await
        .unwrap_err();
    assert_eq!(message(&e), "tool `fx__echo` is not granted to `bob`");
    let r = call(&bob, "byte_count", json!({"text": "abcd"}))
        .await
        .unwrap();
    assert!(text_of(&r).contains('4'), "{r:?}");
    assert_eq!(n(), 0, "a server was started for bob");
    bob.cancel().await.unwrap();

    // The positive control: alice's grants reach fx, which starts.
    let alice = client(&s.url, ALICE).await;
    assert_eq!(
        tool_names(&alice).await,
        ["fx__echo", "started", "word_count"]
    );
    assert!(n() >= 1, "fx was not started for alice");
    alice.cancel().await.unwrap();
}
