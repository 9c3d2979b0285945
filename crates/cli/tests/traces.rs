//! `cordon serve --otlp`: OpenTelemetry spans of each call, exported over
//! OTLP/HTTP to a receiver this test runs on loopback, decoded with the
//! official protobuf definitions (`opentelemetry-proto`). The agent's W3C
//! `traceparent` (in the request's `_meta`) is the parent of the call's
//! span; the audit record names the same trace and span; no input reaches
//! an attribute.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Serve, audit_records, tempdir};
use cordon_mcp::rmcp;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::{Span, span::SpanKind, status::StatusCode};
use prost::Message;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

const MANIFEST: &str = common::WORD_COUNT;

/// What the agent sends: a text no attribute may carry.
const INPUT: &str = "quokka-zebra-7731 never leaves the audit log";

/// Each request's path and body.
type Posts = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

/// An OTLP/HTTP receiver on loopback: every request's path and body.
#[derive(Clone, Default)]
struct Receiver {
    posts: Posts,
}

impl Receiver {
    /// Listen on a free loopback port; `http://127.0.0.1:PORT`.
    fn start() -> (Receiver, String) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", l.local_addr().unwrap());
        let r = Receiver::default();
        let posts = r.posts.clone();
        std::thread::spawn(move || {
            for conn in l.incoming() {
                let Ok(conn) = conn else { continue };
                let posts = posts.clone();
                std::thread::spawn(move || serve(conn, posts));
            }
        });
        (r, base)
    }

    /// The spans of every request so far.
    fn spans(&self) -> Vec<Span> {
        let posts = self.posts.lock().unwrap();
        let mut out = Vec::new();
        for (path, body) in posts.iter() {
            assert_eq!(path, "/v1/traces");
            let req = ExportTraceServiceRequest::decode(body.as_slice())
                .expect("an OTLP ExportTraceServiceRequest");
            for rs in req.resource_spans {
                let service = rs
                    .resource
                    .as_ref()
                    .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
                    .and_then(|a| a.value.as_ref())
                    .and_then(|v| v.value.clone());
                assert_eq!(service, Some(Any::StringValue("cordon".into())));
                for ss in rs.scope_spans {
                    out.extend(ss.spans);
                }
            }
        }
        out
    }

    fn bodies(&self) -> Vec<Vec<u8>> {
        let posts = self.posts.lock().unwrap();
        posts.iter().map(|(_, b)| b.clone()).collect()
    }

    /// Wait (up to a minute) until `pred` holds of the spans.
    fn wait_for(&self, what: &str, pred: impl Fn(&[Span]) -> bool) -> Vec<Span> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let spans = self.spans();
            if pred(&spans) {
                return spans;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not exported: {spans:#?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// HTTP/1.1 requests on one connection, each answered 200 with an empty
/// `ExportTraceServiceResponse`.
fn serve(conn: std::net::TcpStream, posts: Posts) {
    let mut w = conn.try_clone().unwrap();
    let mut r = BufReader::new(conn);
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
        let mut len = 0usize;
        loop {
            let mut h = String::new();
            if r.read_line(&mut h).unwrap_or(0) == 0 {
                return;
            }
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; len];
        r.read_exact(&mut body).unwrap();
        posts.lock().unwrap().push((path, body));
        let _ = w.write_all(
            b"HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n",
        );
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn attr(s: &Span, key: &str) -> Option<String> {
    s.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.as_ref())
        .and_then(|v| match &v.value {
            Some(Any::StringValue(t)) => Some(t.clone()),
            _ => None,
        })
}

/// `tools/call` with `traceparent` in its `_meta` when given.
async fn call(
    c: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    args: Value,
    traceparent: Option<&str>,
) -> bool {
    let mut p = CallToolRequestParams::new("word_count");
    p.arguments = args.as_object().cloned();
    if let Some(tp) = traceparent {
        let mut meta = rmcp::model::MetaObject::default();
        meta.insert("traceparent".into(), json!(tp));
        p.meta = Some(meta.into());
    }
    c.peer().call_tool(p).await.is_ok()
}

/// Stop `cordon serve` as an operator does (SIGTERM) and wait for it:
/// the spans still queued are sent on the way out.
fn stop(mut s: cordon_testkit::serve::Http) {
    let rest = s.rest();
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &s.pid().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);
    let _ = rest.join();
}

const AGENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const AGENT_SPAN: &str = "00f067aa0ba902b7";
const UNSAMPLED_TRACE: &str = "0af7651916cd43dd8448eb211c80319c";

fn record_of<'a>(records: &'a [Value], trace: &str) -> &'a Value {
    records
        .iter()
        .find(|r| r["trace"]["trace_id"] == trace)
        .unwrap_or_else(|| panic!("no audit record in trace {trace}: {records:#?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_call_is_a_span_under_the_agents_traceparent_with_its_phases() {
    let dir = tempdir();
    let m = dir.path().join("cordon.yaml");
    std::fs::write(&m, MANIFEST).unwrap();
    let audit = dir.path().join("audit.jsonl");
    let (rx, base) = Receiver::start();
    let s = Serve::manifest(env!("CARGO_BIN_EXE_cordon"), &m, &audit)
        .arg("--no-probe")
        .arg("--otlp")
        .arg(&base)
        // Send each batch within 100 ms, not the SDK's 5 s.
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .http();
    assert!(
        s.stderr
            .iter()
            .any(|l| l.contains(&format!("traces: exported to {base}/v1/traces"))),
        "{:?}",
        s.stderr
    );
    let c = common::http_client(&s.url, None).await;
    let tp = format!("00-{AGENT_TRACE}-{AGENT_SPAN}-01");
    assert!(call(&c, json!({"text": INPUT}), Some(&tp)).await);
    // No traceparent: a trace of its own. A refused call (arguments not
    // of the schema) is a span too, marked an error.
    assert!(call(&c, json!({"text": "own trace"}), None).await);
    assert!(
        !call(
            &c,
            json!({"words": 3}),
            Some(&format!("00-{AGENT_TRACE}-1111111111111111-01"))
        )
        .await
    );
    // The agent did not sample this one: recorded, not exported.
    assert!(
        call(
            &c,
            json!({"text": "unsampled"}),
            Some(&format!("00-{UNSAMPLED_TRACE}-{AGENT_SPAN}-00"))
        )
        .await
    );

    let spans = rx.wait_for("three calls and their phases", |spans| {
        spans
            .iter()
            .filter(|s| s.name == "tools/call word_count")
            .count()
            >= 3
            && spans.iter().filter(|s| s.name == "audit write").count() >= 3
    });
    c.cancel().await.unwrap();
    stop(s);
    let records = audit_records(&audit);

    // The call under the agent's span.
    let rec = record_of(
        &records
            .iter()
            .filter(|r| r["status"] == "ok")
            .cloned()
            .collect::<Vec<_>>(),
        AGENT_TRACE,
    )
    .clone();
    assert_eq!(rec["trace"]["parent_span_id"], AGENT_SPAN, "{rec:#}");
    assert_eq!(rec["trace"]["sampled"], true, "{rec:#}");
    let root = spans
        .iter()
        .find(|s| hex(&s.span_id) == rec["trace"]["span_id"])
        .unwrap_or_else(|| panic!("the record's span was not exported: {rec:#} {spans:#?}"));
    assert_eq!(hex(&root.trace_id), AGENT_TRACE);
    assert_eq!(hex(&root.parent_span_id), AGENT_SPAN);
    assert_eq!(root.name, "tools/call word_count");
    assert_eq!(root.kind, SpanKind::Server as i32);
    assert_eq!(
        attr(root, "gen_ai.tool.name").as_deref(),
        Some("word_count")
    );
    assert_eq!(attr(root, "mcp.method.name").as_deref(), Some("tools/call"));
    assert_eq!(attr(root, "cordon.profile").as_deref(), Some("P1"));
    assert_eq!(attr(root, "cordon.runtime").as_deref(), Some("native"));
    assert_eq!(attr(root, "cordon.status").as_deref(), Some("ok"));
    assert_eq!(
        root.status.as_ref().map(|s| s.code),
        Some(StatusCode::Ok as i32)
    );
    // Its phases, children of it, in order, within it.
    let children: Vec<&Span> = spans
        .iter()
        .filter(|s| s.parent_span_id == root.span_id)
        .collect();
    let mut names: Vec<(&str, u64, u64)> = children
        .iter()
        .map(|s| {
            (
                s.name.as_str(),
                s.start_time_unix_nano,
                s.end_time_unix_nano,
            )
        })
        .collect();
    names.sort_by_key(|(_, start, _)| *start);
    let order: Vec<&str> = names.iter().map(|(n, _, _)| *n).collect();
    assert_eq!(
        order,
        ["admission", "sandbox start", "run", "gate", "audit write"],
        "{children:#?}"
    );
    for (n, start, end) in &names {
        assert!(
            root.start_time_unix_nano <= *start && start <= end && *end <= root.end_time_unix_nano,
            "{n} outside the call: {root:#?} {children:#?}"
        );
        assert_eq!(
            children.iter().find(|s| s.name == *n).unwrap().trace_id,
            root.trace_id
        );
    }
    // The phases are the record's.
    let run = children.iter().find(|s| s.name == "run").unwrap();
    assert_eq!(
        (run.end_time_unix_nano - run.start_time_unix_nano) / 1000,
        rec["timings"]["run_us"].as_u64().unwrap(),
        "{rec:#}"
    );

    // The call without a traceparent: a root of its own trace.
    let own = records
        .iter()
        .find(|r| r["trace"].is_object() && r["trace"]["parent_span_id"].is_null())
        .unwrap_or_else(|| panic!("{records:#?}"));
    let own_root = spans
        .iter()
        .find(|s| hex(&s.span_id) == own["trace"]["span_id"])
        .unwrap();
    assert_eq!(hex(&own_root.trace_id), own["trace"]["trace_id"]);
    assert!(own_root.parent_span_id.is_empty(), "{own_root:#?}");

    // The refused call: an error span under its own agent span.
    let refused = spans
        .iter()
        .find(|s| hex(&s.parent_span_id) == "1111111111111111")
        .unwrap_or_else(|| panic!("{spans:#?}"));
    assert_eq!(attr(refused, "cordon.status").as_deref(), Some("denied"));
    assert_eq!(
        refused.status.as_ref().map(|s| s.code),
        Some(StatusCode::Error as i32)
    );

    // Unsampled: in the audit log, in no span.
    let unsampled = record_of(&records, UNSAMPLED_TRACE);
    assert_eq!(unsampled["trace"]["sampled"], false, "{unsampled:#}");
    assert!(
        !rx.spans()
            .iter()
            .any(|s| hex(&s.trace_id) == UNSAMPLED_TRACE)
    );

    // No input reached the collector.
    for body in rx.bodies() {
        assert!(
            !body.windows(INPUT.len()).any(|w| w == INPUT.as_bytes())
                && !body.windows(9).any(|w| w == b"own trace"),
            "an input was exported"
        );
    }
}

/// The control: without `--otlp` (nor the environment's endpoint) nothing
/// is sent, and only an agent's own `traceparent` is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_an_endpoint_nothing_is_exported() {
    let dir = tempdir();
    let m = dir.path().join("cordon.yaml");
    std::fs::write(&m, MANIFEST).unwrap();
    let audit = dir.path().join("audit.jsonl");
    let (rx, _base) = Receiver::start();
    let s = Serve::manifest(env!("CARGO_BIN_EXE_cordon"), &m, &audit)
        .arg("--no-probe")
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "")
        .env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
        .http();
    assert!(
        !s.stderr.iter().any(|l| l.contains("traces:")),
        "{:?}",
        s.stderr
    );
    let c = common::http_client(&s.url, None).await;
    let tp = format!("00-{AGENT_TRACE}-{AGENT_SPAN}-01");
    assert!(call(&c, json!({"text": INPUT}), Some(&tp)).await);
    assert!(call(&c, json!({"text": "no trace"}), None).await);
    c.cancel().await.unwrap();
    stop(s);
    assert!(rx.bodies().is_empty());
    let records = audit_records(&audit);
    let calls: Vec<&Value> = records
        .iter()
        .filter(|r| r["tool"] == "word_count")
        .collect();
    assert_eq!(calls.len(), 2, "{records:#?}");
    assert_eq!(
        record_of(&records, AGENT_TRACE)["trace"]["parent_span_id"],
        AGENT_SPAN
    );
    assert_eq!(
        calls.iter().filter(|r| r.get("trace").is_none()).count(),
        1,
        "{calls:#?}"
    );
}
