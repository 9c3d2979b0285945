//! Warm pools of `mcp:` servers (`mcp: {warm: N}`) over streamable HTTP,
//! with the fixture server in the native jail: sessions get servers started
//! before they began, each its own (the control, `warm: 0`, starts them at
//! the sessions' first calls); a pooled server that died while it waited is
//! discarded and audited, never handed out; a session's pooled server is
//! stopped at its end and never handed to another; a failed start is
//! retried in the background until a server is ready.
//!
//! Which sandbox ran for whom is read through the sandbox seam (each start's
//! session id: `mcp-warm-*` for a pool's) and the audit log's pool records.

use cordon_testkit::skip;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cordon_mcp::rmcp;
use cordon_mcp::{Gateway, GatewayOptions, HttpOptions, ServerHandle};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::Value;

type Client = RunningService<RoleClient, ()>;

/// Each server start: the session it was started under, its handle and
/// its policy's memory limit.
type Starts = Arc<Mutex<Vec<(String, Arc<dyn ServerHandle>, u64)>>>;

/// Records every server started through it.
struct Recording {
    inner: cordon_mcp::RuntimeServers,
    starts: Starts,
}

impl cordon_mcp::ServerSandbox for Recording {
    fn start(
        &self,
        who: &cordon_broker::Caller,
        policy: &cordon_policy::policy::ToolPolicy,
        argv: &[String],
    ) -> Result<cordon_mcp::ServerProcess, String> {
        let p = self.inner.start(who, policy, argv)?;
        self.starts.lock().unwrap().push((
            who.session.clone(),
            p.handle.clone(),
            policy.limits.map_or(0, |l| l.memory_bytes),
        ));
        Ok(p)
    }
}

struct Served {
    url: String,
    /// The manifest (a reload's edits start from it).
    manifest: String,
    reloader: cordon_mcp::reload::Reloader,
    service: Arc<cordon_mcp::Service>,
    audit: PathBuf,
    starts: Starts,
    _gateway: cordon_testkit::serve::Gateway,
    _dir: cordon_testkit::Scratch,
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

async fn serve(warm: u32) -> Option<Served> {
    serve_with(warm, "").await
}

async fn serve_with(warm: u32, extra: &str) -> Option<Served> {
    if !cordon_testkit::is_root() || !Path::new("/usr/bin/python3").exists() {
        skip::skip_or_fail(
            "warm",
            "needs root and /usr/bin/python3 (the fixture server)",
        );
        return None;
    }
    let dir = cordon_testkit::scratch();
    let m = dir.path().join("cordon.yaml");
    std::fs::write(
        &m,
        format!(
            r#"tools:
  fx:
    profile: P2
    network: none
    limits: {{wall_seconds: 20, memory: 256M, tasks: 16}}
    mounts: ["{}:/fixture"]
    mcp:
      command: ["/usr/bin/python3", "/fixture/fixture_server.py"]
      warm: {warm}
{extra}"#,
            fixtures().display()
        ),
    )
    .unwrap();
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
    let starts: Starts = Arc::default();
    let sandbox = Arc::new(Recording {
        inner: cordon_mcp::servers_for(&broker, &opts),
        starts: starts.clone(),
    });
    let loaded = cordon_policy::load(&m).unwrap();
    let gw = Gateway::new(&loaded.policy, broker, sandbox).unwrap();
    let reloader = gw.reloader();
    let service = gw.service().clone();
    assert!(
        gw.tool_names().iter().any(|n| n == "fx"),
        "{:?}",
        gw.warnings()
    );
    let gateway = cordon_testkit::serve::gateway(gw, HttpOptions::default()).await;
    Some(Served {
        url: gateway.url.clone(),
        manifest: std::fs::read_to_string(&m).unwrap(),
        reloader,
        service,
        audit,
        starts,
        _gateway: gateway,
        _dir: dir,
    })
}

async fn client(url: &str) -> Client {
    cordon_mcp::install_crypto_provider();
    let config = StreamableHttpClientTransportConfig::with_uri(url);
    let t = StreamableHttpClientTransport::with_client(reqwest::Client::new(), config);
    ().serve(t).await.expect("initialize over HTTP")
}

/// The id of the server process that answered the session's probe.
async fn instance(c: &Client) -> String {
    let r = c
        .peer()
        .call_tool(CallToolRequestParams::new("fx__probe"))
        .await
        .expect("fx__probe");
    let text: String = r
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.clone()))
        .collect();
    let at = text.find("\"instance\": \"").expect(&text) + "\"instance\": \"".len();
    text[at..at + 16].to_string()
}

/// The sessions the servers were started under, in order.
fn started(s: &Served) -> Vec<String> {
    s.starts
        .lock()
        .unwrap()
        .iter()
        .map(|(id, _, _)| id.clone())
        .collect()
}

fn handle_of(s: &Served, id: &str) -> Arc<dyn ServerHandle> {
    s.starts
        .lock()
        .unwrap()
        .iter()
        .find(|(i, _, _)| i == id)
        .map(|(_, h, _)| h.clone())
        .unwrap()
}

/// Wait (bounded) until `f` holds.
async fn until(what: &str, f: impl Fn() -> bool) {
    for _ in 0..1200 {
        if f() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("never: {what}");
}

/// The audit log's pool records: (event, session, sandbox, pooled).
fn pool_records(s: &Served) -> Vec<(String, String, String, bool)> {
    std::fs::read_to_string(&s.audit)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r.get("pool").is_some())
        .map(|r| {
            (
                r["pool"]["event"].as_str().unwrap().to_string(),
                r["session"].as_str().unwrap().to_string(),
                r["pool"]["sandbox"].as_str().unwrap().to_string(),
                r["pool"]["pooled"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// The pooled sandboxes ready so far.
fn ready(s: &Served) -> Vec<String> {
    pool_records(s)
        .into_iter()
        .filter(|r| r.0 == "ready")
        .map(|r| r.2)
        .collect()
}

fn warm_id(id: &str) -> bool {
    id.starts_with("mcp-warm-")
}

#[tokio::test(flavor = "multi_thread")]
async fn sessions_get_servers_started_before_them_each_its_own() {
    let Some(s) = serve(2).await else { return };
    // Both started and ready before any session.
    until("two warm servers ready", || ready(&s).len() == 2).await;
    let warm = started(&s);
    assert_eq!(warm.len(), 2, "{warm:?}");
    assert!(warm.iter().all(|id| warm_id(id)), "{warm:?}");
    let a = client(&s.url).await;
    let b = client(&s.url).await;
    let ia = instance(&a).await;
    let ib = instance(&b).await;
    assert_ne!(ia, ib);
    // Each was handed over once, to its own session, and no session
    // started a server of its own.
    let handed: Vec<_> = pool_records(&s)
        .into_iter()
        .filter(|r| r.0 == "handed_over")
        .collect();
    assert_eq!(handed.len(), 2, "{handed:?}");
    assert_ne!(handed[0].1, handed[1].1);
    assert!(handed.iter().all(|r| r.3));
    let mut sandboxes: Vec<_> = handed.iter().map(|r| r.2.clone()).collect();
    sandboxes.sort();
    let mut w = warm.clone();
    w.sort();
    assert_eq!(sandboxes, w);
    assert!(
        started(&s).iter().all(|id| warm_id(id)),
        "{:?}",
        started(&s)
    );
    // The pool refilled behind them.
    until("the pool refilled", || ready(&s).len() == 4).await;
    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_pool_the_servers_start_at_the_sessions_first_calls() {
    let Some(s) = serve(0).await else { return };
    // Nothing starts before a session needs it (with no listing cached,
    // its `initialize` does).
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(started(&s).is_empty(), "{:?}", started(&s));
    let a = client(&s.url).await;
    let b = client(&s.url).await;
    let ia = instance(&a).await;
    let ib = instance(&b).await;
    assert_ne!(ia, ib);
    let ids = started(&s);
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids.iter().all(|id| !warm_id(id)), "{ids:?}");
    assert!(pool_records(&s).is_empty());
    // Each forwarded call's record has its phases: the server's start
    // among them (it started for this call).
    let calls: Vec<Value> = std::fs::read_to_string(&s.audit)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| r["tool"] == "fx__probe" && r["status"] == "ok")
        .collect();
    assert_eq!(calls.len(), 2, "{calls:#?}");
    for r in &calls {
        for k in ["admission_us", "start_us", "run_us", "gate_us"] {
            assert!(r["timings"][k].is_u64(), "{k}: {r}");
        }
    }
    a.cancel().await.unwrap();
    b.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pooled_server_that_died_waiting_is_discarded_never_handed_out() {
    let Some(s) = serve(1).await else { return };
    until("a warm server ready", || ready(&s).len() == 1).await;
    let dead = ready(&s)[0].clone();
    assert!(warm_id(&dead), "{dead}");
    let h = handle_of(&s, &dead);
    h.kill();
    until("the killed server ended", || h.exited().is_some()).await;
    // The session still works, with a server started for it.
    let a = client(&s.url).await;
    instance(&a).await;
    let recs = pool_records(&s);
    assert!(
        recs.iter()
            .any(|r| r.0 == "discarded" && r.2 == dead && r.3),
        "{recs:?}"
    );
    assert!(
        !recs.iter().any(|r| r.0 == "handed_over" && r.2 == dead),
        "{recs:?}"
    );
    // The discard is recorded under the session that found it.
    let discard = recs.iter().find(|r| r.0 == "discarded").unwrap();
    assert!(!warm_id(&discard.1), "{discard:?}");
    // Its server: cold (started under the session's own id), or the
    // pool's refill if that was ready first (handed over, audited).
    let own = started(&s).into_iter().any(|id| id == discard.1);
    let refilled = pool_records(&s)
        .iter()
        .any(|r| r.0 == "handed_over" && r.1 == discard.1 && r.2 != dead);
    assert!(own || refilled, "{:?} {recs:?}", started(&s));
    a.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_sessions_pooled_server_ends_with_it_and_is_never_reused() {
    let Some(s) = serve(1).await else { return };
    until("a warm server ready", || ready(&s).len() == 1).await;
    let first = ready(&s)[0].clone();
    let a = client(&s.url).await;
    let ia = instance(&a).await;
    assert!(
        pool_records(&s)
            .iter()
            .any(|r| r.0 == "handed_over" && r.2 == first),
        "{:?}",
        pool_records(&s)
    );
    a.cancel().await.unwrap();
    let h = handle_of(&s, &first);
    until("the session's server stopped", || h.exited().is_some()).await;
    let b = client(&s.url).await;
    let ib = instance(&b).await;
    assert_ne!(ia, ib);
    let recs = pool_records(&s);
    let handed: Vec<_> = recs.iter().filter(|r| r.0 == "handed_over").collect();
    assert!(
        handed.iter().filter(|r| r.2 == first).count() == 1,
        "{recs:?}"
    );
    b.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_server_is_pooled_only_after_its_warm_up_call_succeeds() {
    // Positive control: a warm-up that answers; the server is pooled and
    // handed over.
    let Some(s) = serve_with(
        1,
        "      warm_up: {tool: echo, arguments: {text: warming}}\n",
    )
    .await
    else {
        return;
    };
    until("a warm server ready", || ready(&s).len() == 1).await;
    let w = ready(&s)[0].clone();
    let a = client(&s.url).await;
    instance(&a).await;
    assert!(
        pool_records(&s)
            .iter()
            .any(|r| r.0 == "handed_over" && r.2 == w),
        "{:?}",
        pool_records(&s)
    );
    a.cancel().await.unwrap();
    // A warm-up that kills the server: never pooled (a `failed` record),
    // and a session starts its own.
    let Some(s) = serve_with(1, "      warm_up: {tool: crash}\n").await else {
        return;
    };
    until("the warm-up failed", || {
        pool_records(&s).iter().any(|r| r.0 == "failed")
    })
    .await;
    let a = client(&s.url).await;
    instance(&a).await;
    let recs = pool_records(&s);
    assert!(
        !recs.iter().any(|r| r.0 == "ready" || r.0 == "handed_over"),
        "{recs:?}"
    );
    let audit = std::fs::read_to_string(&s.audit).unwrap();
    assert!(audit.contains("its warm-up call `crash` failed"), "{audit}");
    a.cancel().await.unwrap();
}

/// A warm server that cannot start yet (its program exits until a marker
/// file exists) is audited as `failed`, and its pool is retried in the
/// background: once the marker is there a server becomes ready without
/// any session taking one.
#[tokio::test(flavor = "multi_thread")]
async fn a_failed_warm_start_is_retried_until_a_server_is_ready() {
    let marker = cordon_testkit::scratch();
    let extra = format!(
        r#"  flaky:
    profile: P2
    network: none
    limits: {{wall_seconds: 20, memory: 256M, tasks: 16}}
    mounts: ["{fixtures}:/fixture", "{marker}:/marker"]
    mcp:
      command: ["/bin/sh", "-c", "test -e /marker/ok || {{ echo 'no marker yet' >&2; exit 3; }}; exec /usr/bin/python3 /fixture/fixture_server.py"]
      warm: 1
"#,
        fixtures = fixtures().display(),
        marker = marker.path().display()
    );
    // `fx` is not pooled: every pool record is `flaky`'s.
    let Some(s) = serve_with(0, &extra).await else {
        return;
    };
    until("a failed warm start", || {
        pool_records(&s).iter().any(|r| r.0 == "failed")
    })
    .await;
    // The control: without the marker nothing is ready.
    let recs = pool_records(&s);
    assert!(!recs.iter().any(|r| r.0 == "ready"), "{recs:?}");
    let audit = std::fs::read_to_string(&s.audit).unwrap();
    assert!(audit.contains("the server did not initialize"), "{audit}");

    std::fs::write(marker.path().join("ok"), "").unwrap();
    // The retries back off up to a minute: a generous bound.
    for _ in 0..3600 {
        if !ready(&s).is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let recs = pool_records(&s);
    assert_eq!(ready(&s).len(), 1, "{recs:?}");
    // No session took one, none was started for a session, and each
    // failed start was audited once.
    assert!(!recs.iter().any(|r| r.0 == "handed_over"), "{recs:?}");
    assert!(
        started(&s).iter().all(|id| warm_id(id)),
        "{:?}",
        started(&s)
    );
    let failed: Vec<_> = recs.iter().filter(|r| r.0 == "failed").collect();
    let mut ids: Vec<&String> = failed.iter().map(|r| &r.2).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), failed.len(), "{recs:?}");
    println!("{} failed starts before the marker was seen", failed.len());
}

/// A reload that changes a pooled server's policy (a lower memory limit)
/// stops the servers waiting with the old one and refills the pool with
/// the new one: a session begun after the reload is handed a server of
/// the new policy, never one started before it.
#[tokio::test(flavor = "multi_thread")]
async fn a_reload_replaces_the_waiting_servers_of_a_changed_pool() {
    let Some(s) = serve(1).await else { return };
    until("a warm server ready", || ready(&s).len() == 1).await;
    let old = ready(&s)[0].clone();
    let mem = |id: &str| {
        s.starts
            .lock()
            .unwrap()
            .iter()
            .find(|(i, _, _)| i == id)
            .map(|(_, _, m)| *m)
            .unwrap()
    };
    assert_eq!(mem(&old), 256 << 20);
    let changed = s.manifest.replace("memory: 256M", "memory: 192M");
    assert_ne!(changed, s.manifest);
    let new = cordon_policy::load_str(Path::new("cordon.yaml"), &changed)
        .unwrap()
        .policy;
    s.reloader.apply(&new, &["fx".to_string()], &[]).unwrap();
    // The waiting server of the old policy is stopped, one of the new
    // policy made ready in its place.
    until("the old waiting server stopped", || {
        handle_of(&s, &old).exited().is_some()
    })
    .await;
    until("a server of the new policy ready", || {
        ready(&s)
            .iter()
            .any(|id| *id != old && mem(id) == 192 << 20)
    })
    .await;
    let c = client(&s.url).await;
    instance(&c).await;
    let handed: Vec<String> = pool_records(&s)
        .into_iter()
        .filter(|r| r.0 == "handed_over")
        .map(|r| r.2)
        .collect();
    assert_eq!(handed.len(), 1, "{handed:?}");
    assert_ne!(
        handed[0], old,
        "the old policy's server is never handed out"
    );
    assert_eq!(mem(&handed[0]), 192 << 20);
    c.cancel().await.unwrap();
}

/// A tool taken out of service has its waiting servers stopped; back in
/// service, its pool fills again at once, before any session asks.
#[tokio::test(flavor = "multi_thread")]
async fn a_pool_refills_as_soon_as_its_tool_is_back_in_service() {
    let Some(s) = serve(1).await else { return };
    until("a warm server ready", || ready(&s).len() == 1).await;
    let first = ready(&s)[0].clone();
    s.service.take_out(
        "fx",
        "test",
        cordon_mcp::OutOfService {
            probes: vec!["host_fs".into()],
            at: "2026-12-04T00:00:00Z".into(),
            why: "a test".into(),
        },
    );
    until("the waiting server stopped", || {
        handle_of(&s, &first).exited().is_some()
    })
    .await;
    // Out of service: none is started.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(ready(&s).len(), 1, "{:?}", ready(&s));
    s.service.held("fx", "test", 0.0);
    until("a new server ready without a session", || {
        ready(&s).len() == 2
    })
    .await;
    assert!(
        started(&s).iter().all(|id| warm_id(id)),
        "{:?}",
        started(&s)
    );
}
