//! `cordon serve`'s Prometheus metrics: `GET /metrics` on the HTTP gateway
//! behind its authentication, and `--metrics ADDR` on loopback. What is
//! served is parsed with the Python `prometheus_client` parser (installed
//! by scripts/setup.sh), and its counters move with the calls made.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};

use common::{Serve, tempdir, text_of};
use cordon_mcp::rmcp;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

/// `word_count` (tests/common), and `pooled_count`: the same tool served
/// from a pool of one sandbox.
fn manifest() -> String {
    let (_, tool) = common::WORD_COUNT
        .split_once("tools:\n")
        .expect("a manifest with tools");
    let pooled = tool
        .replacen("  word_count:", "  pooled_count:", 1)
        .replacen(
            "    command:",
            "    lifetime: pool\n    pool: {size: 1}\n    command:",
            1,
        );
    format!("{}{pooled}", common::WORD_COUNT)
}

/// `GET path` on `addr` with `authorization`: status, headers, body.
fn get(addr: &str, path: &str, authorization: Option<&str>) -> (u16, String, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(a) = authorization {
        req.push_str(&format!("Authorization: {a}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let resp = String::from_utf8_lossy(&resp).into_owned();
    let (head, body) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    // The body may be chunked: keep only what the parser needs (lines).
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, head.to_owned(), body)
}

fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        body = rest[n..].trim_start_matches("\r\n");
    }
    out
}

/// One sample: its name, labels and value.
#[derive(Debug)]
struct Sample {
    name: String,
    labels: serde_json::Map<String, Value>,
    value: f64,
}

/// `text` parsed by the Python `prometheus_client` parser; `None` (the
/// test said so) when it is not installed.
fn parse(text: &str) -> Option<Vec<Sample>> {
    let script = r#"
import json, sys
try:
    from prometheus_client.parser import text_string_to_metric_families
except ImportError as e:
    print("MISSING", e)
    sys.exit(2)
out = []
for fam in text_string_to_metric_families(sys.stdin.read()):
    for s in fam.samples:
        out.append([s.name, s.labels, s.value])
print(json.dumps(out))
"#;
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    if out.status.code() == Some(2) && stdout.contains("MISSING") {
        common::skip_or_fail(
            &common::this_test(),
            &format!("the Python prometheus_client: {stdout}"),
        );
        return None;
    }
    assert!(
        out.status.success(),
        "prometheus_client did not parse the metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Vec<(String, serde_json::Map<String, Value>, f64)> =
        serde_json::from_str(&stdout).unwrap();
    Some(
        v.into_iter()
            .map(|(name, labels, value)| Sample {
                name,
                labels,
                value,
            })
            .collect(),
    )
}

/// The value of `name` with (at least) `labels`; 0 when there is none
/// (a counter no event has moved yet).
fn value(samples: &[Sample], name: &str, labels: &[(&str, &str)]) -> f64 {
    let hits: Vec<&Sample> = samples
        .iter()
        .filter(|s| {
            s.name == name
                && labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).and_then(Value::as_str) == Some(*v))
        })
        .collect();
    assert!(hits.len() <= 1, "{name} {labels:?}: {hits:#?}");
    hits.first().map_or(0.0, |s| s.value)
}

/// The sum of `name` over every label set.
fn total(samples: &[Sample], name: &str) -> f64 {
    samples
        .iter()
        .filter(|s| s.name == name)
        .map(|s| s.value)
        .sum()
}

fn write_private(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

use common::http_client as client;

async fn call(
    c: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    tool: &str,
    args: Value,
) -> Result<String, rmcp::ServiceError> {
    let mut p = CallToolRequestParams::new(tool.to_owned());
    p.arguments = args.as_object().cloned();
    c.peer().call_tool(p).await.map(|r| text_of(&r))
}

/// Authenticated `/metrics` parses, and its counters move by exactly the
/// calls made, per status; without a token it is refused as MCP is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_behind_authentication_count_the_calls() {
    let dir = tempdir();
    let tokens = dir.path().join("tokens");
    let token = cordon_auth::static_tokens::add(&tokens, "ci", None, &[]).unwrap();
    let auth = dir.path().join("auth.yaml");
    write_private(
        &auth,
        &format!(
            "resource: http://127.0.0.1/mcp\nstatic_tokens: {}\n",
            tokens.display()
        ),
        0o600,
    );
    let m = dir.path().join("cordon.yaml");
    std::fs::write(&m, manifest()).unwrap();
    let audit = dir.path().join("audit.jsonl");
    let s = Serve::manifest(env!("CARGO_BIN_EXE_cordon"), &m, &audit)
        .arg("--auth")
        .arg(&auth)
        .http();
    let addr = s.addr();
    let bearer = format!("Bearer {token}");

    // Unauthenticated, and with a wrong token: refused like MCP requests.
    let (st, head, _) = get(&addr, "/metrics", None);
    assert_eq!(st, 401, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("www-authenticate: bearer"),
        "{head}"
    );
    let (st, head, _) = get(&addr, "/metrics", Some("Bearer cordon_wrong"));
    assert_eq!(st, 401, "{head}");

    // The control: before any session or call, every counter is at zero.
    let (st, head, body) = get(&addr, "/metrics", Some(&bearer));
    assert_eq!(st, 200, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/openmetrics-text"),
        "{head}"
    );
    let Some(before) = parse(&body) else { return };
    assert_eq!(total(&before, "cordon_calls_total"), 0.0, "{body}");
    assert_eq!(total(&before, "cordon_refusals_total"), 0.0, "{body}");
    assert_eq!(value(&before, "cordon_sessions", &[]), 0.0, "{body}");
    assert_eq!(value(&before, "cordon_sandboxes", &[]), 0.0, "{body}");
    // The start probe's verdict of the tool, and when it was proved.
    let held = value(
        &before,
        "cordon_probe_verdicts",
        &[("tool", "word_count"), ("verdict", "held")],
    ) + value(
        &before,
        "cordon_probe_verdicts",
        &[("tool", "word_count"), ("verdict", "cached")],
    );
    assert_eq!(held, 1.0, "{body}");
    assert!(
        value(
            &before,
            "cordon_tool_last_proved_timestamp_seconds",
            &[("tool", "word_count")]
        ) > 1.0e9,
        "{body}"
    );

    // Two calls that succeed, one refused by the schema, one for a tool
    // that does not exist (its name is not a label value).
    let c = client(&s.url, Some(&token)).await;
    for _ in 0..2 {
        let out = call(&c, "word_count", json!({"text": "a b\nc\n"}))
            .await
            .unwrap();
        assert!(out.contains('6'), "{out}");
    }
    let e = call(&c, "word_count", json!({"txt": 1})).await.unwrap_err();
    assert!(format!("{e:?}").contains("invalid_arguments"), "{e:?}");
    let e = call(&c, "no_such_tool_x1", json!({})).await.unwrap_err();
    assert!(format!("{e:?}").contains("unknown_tool"), "{e:?}");

    let (st, head, body) = get(&addr, "/metrics", Some(&bearer));
    assert_eq!(st, 200, "{head}");
    let Some(after) = parse(&body) else { return };
    let wc = |status| {
        value(
            &after,
            "cordon_calls_total",
            &[
                ("tool", "word_count"),
                ("profile", "P1"),
                ("status", status),
            ],
        )
    };
    assert_eq!(wc("ok"), 2.0, "{body}");
    assert_eq!(wc("denied"), 1.0, "{body}");
    assert_eq!(
        value(
            &after,
            "cordon_calls_total",
            &[("tool", "_other"), ("status", "denied")]
        ),
        1.0,
        "{body}"
    );
    assert_eq!(total(&after, "cordon_calls_total"), 4.0, "{body}");
    assert!(!body.contains("no_such_tool_x1"), "{body}");
    assert_eq!(
        value(&after, "cordon_refusals_total", &[("reason", "denied")]),
        2.0,
        "{body}"
    );
    assert_eq!(total(&after, "cordon_refusals_total"), 2.0, "{body}");
    assert_eq!(
        value(
            &after,
            "cordon_call_duration_seconds_count",
            &[("tool", "word_count"), ("phase", "call")]
        ),
        3.0,
        "{body}"
    );
    // Each phase counted where the call reached it: the admission of all
    // three (the schema refused one), the sandbox's start, the run and
    // the gate of the two that ran. Counts, not times.
    let phase = |p| {
        value(
            &after,
            "cordon_call_duration_seconds_count",
            &[("tool", "word_count"), ("phase", p)],
        )
    };
    assert_eq!(phase("admission"), 3.0, "{body}");
    for p in ["start", "run", "gate"] {
        assert_eq!(phase(p), 2.0, "{p}: {body}");
    }
    // The control: none before any call.
    for p in ["admission", "start", "run", "gate"] {
        assert_eq!(
            value(
                &before,
                "cordon_call_duration_seconds_count",
                &[("tool", "word_count"), ("phase", p)]
            ),
            0.0,
            "{p}"
        );
    }
    // The audit records carry the timings the histograms were fed.
    let records = common::audit_records(&audit);
    let calls: Vec<&Value> = records
        .iter()
        .filter(|r| {
            r["tool"] == "word_count" && r["caller"].as_str().is_some_and(|c| c.starts_with("mcp"))
        })
        .collect();
    let ok: Vec<&Value> = calls
        .iter()
        .copied()
        .filter(|r| r["status"] == "ok")
        .collect();
    assert_eq!(ok.len(), 2, "{calls:#?}");
    for r in &ok {
        for k in ["admission_us", "start_us", "run_us", "gate_us"] {
            assert!(r["timings"][k].is_u64(), "{k}: {r}");
        }
        println!("timings of a word_count call: {}", r["timings"]);
    }
    let denied: Vec<&Value> = calls
        .iter()
        .copied()
        .filter(|r| r["status"] == "denied")
        .collect();
    assert_eq!(denied.len(), 1, "{calls:#?}");
    assert!(
        denied[0]["timings"]["admission_us"].is_u64(),
        "{}",
        denied[0]
    );
    for k in ["start_us", "run_us", "gate_us"] {
        assert!(denied[0]["timings"].get(k).is_none(), "{k}: {}", denied[0]);
    }
    assert_eq!(value(&after, "cordon_sessions", &[]), 1.0, "{body}");
    // Each command call's sandbox is gone once it answered.
    assert_eq!(value(&after, "cordon_sandboxes", &[]), 0.0, "{body}");

    // A pooled tool: its first call makes the pool (and cold-starts);
    // calls go on until one took a pooled sandbox. Each is counted once,
    // the hand-overs as pool events too.
    let pooled = |r: &Value| r["tool"] == "pooled_count" && r["pool"]["event"] == "handed_over";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
    let mut n = 0;
    loop {
        let out = call(&c, "pooled_count", json!({"text": "a b\nc\n"}))
            .await
            .unwrap();
        assert!(out.contains('6'), "{out}");
        n += 1;
        let records = common::audit_records(&audit);
        if records.iter().any(pooled) || std::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let handed = common::audit_records(&audit)
        .iter()
        .filter(|r| pooled(r))
        .count();
    assert!(handed >= 1, "no call took a pooled sandbox in {n} calls");
    let (_, _, body) = get(&addr, "/metrics", Some(&bearer));
    let Some(pool) = parse(&body) else { return };
    assert_eq!(
        value(
            &pool,
            "cordon_calls_total",
            &[("tool", "pooled_count"), ("status", "ok")]
        ),
        n as f64,
        "{n} calls, {handed} from the pool: {body}"
    );
    assert_eq!(
        value(
            &pool,
            "cordon_pool_events_total",
            &[("tool", "pooled_count"), ("event", "handed_over")]
        ),
        handed as f64,
        "{body}"
    );
    // The other tool's counts did not move.
    assert_eq!(total(&pool, "cordon_calls_total"), 4.0 + n as f64, "{body}");
    println!("{n} calls of the pooled tool, {handed} from its pool");
    c.cancel().await.unwrap();
}

/// `--metrics ADDR`: the metrics on their own loopback listener, without
/// authentication; a non-loopback address is refused before anything
/// starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_separate_metrics_listener_on_loopback_only() {
    let dir = tempdir();
    let m = dir.path().join("cordon.yaml");
    std::fs::write(&m, manifest()).unwrap();
    let audit = dir.path().join("audit.jsonl");

    // Refused: the address is checked before it is bound (no packet).
    let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["serve", "--no-probe", "-m"])
        .arg(&m)
        .args(["--metrics", "192.0.2.1:9464"])
        .env("CORDON_AUDIT", &audit)
        .env("CORDON_STATE_DIR", dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(
            "refusing to serve metrics on 192.0.2.1:9464, which is not a loopback address"
        ),
        "{err}"
    );

    // Loopback: served, unauthenticated, and it counts the calls of the
    // gateway it belongs to.
    let s = Serve::manifest(env!("CARGO_BIN_EXE_cordon"), &m, &audit)
        .args(["--no-probe", "--metrics", "127.0.0.1:0"])
        .http();
    let line = s
        .stderr
        .iter()
        .find_map(|l| l.split("serving metrics on http://").nth(1))
        .unwrap_or_else(|| panic!("{:#?}", s.stderr));
    let maddr = line.split('/').next().unwrap().to_owned();
    let (st, head, body) = get(&maddr, "/metrics", None);
    assert_eq!(st, 200, "{head}");
    let Some(before) = parse(&body) else { return };
    assert_eq!(total(&before, "cordon_calls_total"), 0.0, "{body}");
    let c = client(&s.url, None).await;
    let out = call(&c, "word_count", json!({"text": "a b\nc\n"}))
        .await
        .unwrap();
    assert!(out.contains('6'), "{out}");
    let (_, _, body) = get(&maddr, "/metrics", None);
    let Some(after) = parse(&body) else { return };
    assert_eq!(
        value(
            &after,
            "cordon_calls_total",
            &[("tool", "word_count"), ("status", "ok")]
        ),
        1.0,
        "{body}"
    );
    c.cancel().await.unwrap();
}

/// `--no-metrics`: neither `/metrics` nor `/console` is served (the
/// control: the same gateway serves MCP, and without the flag both answer,
/// as the tests above show); `--metrics ADDR` with it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_metrics_serves_neither_metrics_nor_console() {
    let dir = tempdir();
    let m = dir.path().join("cordon.yaml");
    std::fs::write(&m, manifest()).unwrap();
    let audit = dir.path().join("audit.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["serve", "-m"])
        .arg(&m)
        .args(["--no-metrics", "--metrics", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cannot be used with"), "{err}");

    let s = Serve::manifest(env!("CARGO_BIN_EXE_cordon"), &m, &audit)
        .args(["--no-probe", "--no-metrics"])
        .http();
    assert!(
        s.stderr
            .iter()
            .any(|l| l.contains("metrics and console: off")),
        "{:?}",
        s.stderr
    );
    let addr = s.addr();
    for path in ["/metrics", "/console"] {
        let (st, head, body) = get(&addr, path, None);
        assert_eq!(st, 404, "{path}: {head}");
        assert!(body.contains("--no-metrics"), "{path}: {body}");
    }
    let c = client(&s.url, None).await;
    let out = call(&c, "word_count", json!({"text": "a b"}))
        .await
        .unwrap();
    assert!(out.contains("0       2       3"), "{out}");
    let (st, _, _) = get(&addr, "/metrics", None);
    assert_eq!(st, 404);
    c.cancel().await.unwrap();
}
