//! `cordon serve --idle-timeout` ends an idle HTTP session (audited so, a
//! later request refused), and `cordon explain` without a tool prints the
//! gateway section.

mod common;
use common::*;

use std::io::BufRead;
use std::process::Stdio;
use std::time::Duration;

use cordon_mcp::rmcp;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, JsonObject};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

const MANIFEST: &str = "version: 1
gateway:
  idle_timeout: 30m
  per_principal: {sessions: 3, calls_in_flight: 2, sandboxes: 2}
  per_tenant: {calls_in_flight: 6, sandboxes: 4}
tools:
  hello:
    profile: P1
    description: Say hello.
    command: [/bin/echo, hello]
    max_concurrent: 2
";

#[test]
fn explain_without_a_tool_prints_the_gateway_section() {
    let dir = tempdir();
    let m = dir.path().join("cordon.yaml");
    std::fs::write(&m, MANIFEST).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["explain", "--json", "-m"])
        .arg(&m)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["gateway"]["idle_timeout_seconds"], 1800, "{v}");
    assert_eq!(v["gateway"]["per_principal"]["sessions"], 3, "{v}");
    assert_eq!(v["gateway"]["per_principal"]["calls_in_flight"], 2, "{v}");
    assert_eq!(v["gateway"]["per_principal"]["sandboxes"], 2, "{v}");
    assert_eq!(v["gateway"]["per_tenant"]["calls_in_flight"], 6, "{v}");
    assert_eq!(v["gateway"]["per_tenant"]["sandboxes"], 4, "{v}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["explain", "hello", "--json", "-m"])
        .arg(&m)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["concurrency"]["max_concurrent"], 2, "{v}");
    assert_eq!(v["concurrency"]["queue_seconds"], 10, "{v}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_idle_timeout_ends_an_idle_session() {
    let dir = tempdir();
    let m = dir.path().join("cordon.yaml");
    std::fs::write(&m, MANIFEST).unwrap();
    let audit = dir.path().join("audit.jsonl");
    let _guard = Serve::manifest(env!("CARGO_BIN_EXE_cordon"), &m, &audit)
        .args(["--idle-timeout", "1"])
        .http();
    let url = _guard.url.clone();
    cordon_mcp::install_crypto_provider();
    let mut config = StreamableHttpClientTransportConfig::with_uri(url);
    config.reinit_on_expired_session = false;
    let c = ().serve(StreamableHttpClientTransport::from_config(config)).await.unwrap();
    let call = |c: &rmcp::service::RunningService<rmcp::RoleClient, ()>| {
        let mut p = CallToolRequestParams::new("hello");
        p.arguments = Some(JsonObject::new());
        let peer = c.peer().clone();
        async move { peer.call_tool(p).await }
    };
    // Positive control: the live session answers.
    let r = call(&c).await.expect("a call of the live session");
    assert!(text_of(&r).contains("hello"));
    let mut ended = false;
    for _ in 0..300 {
        ended = audit_records(&audit).iter().any(|r| {
            r["status"] == "session_ended"
                && r["reason"].as_str().is_some_and(|s| s.contains("1s idle"))
        });
        if ended {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(ended, "{:#?}", audit_records(&audit));
    assert!(
        call(&c).await.is_err(),
        "the expired session still answered"
    );
}

/// A session's end whose audit record cannot be written (the log is
/// /dev/full; fail-open, so that calls return at all) is never dropped
/// silently: it is counted for `cordon doctor` and said in the next call's
/// warnings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_end_whose_record_cannot_be_written_is_counted_and_said() {
    let dir = tempdir();
    let m = dir.path().join("cordon.yaml");
    std::fs::write(&m, MANIFEST).unwrap();
    let unwritten = dir.path().join("audit-unwritten.jsonl");
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args([
            "serve",
            "--http",
            "127.0.0.1:0",
            "--idle-timeout",
            "1",
            "--audit-fail-open",
            "-m",
        ])
        .arg(&m)
        .env("CORDON_AUDIT", "/dev/full")
        .env("CORDON_STATE_DIR", dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stderr.take().unwrap()).lines();
    let url = loop {
        let line = lines.next().expect("cordon serve exited").unwrap();
        if let Some(rest) = line.split("serving MCP on ").nth(1) {
            break rest.split_whitespace().next().unwrap().to_owned();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    let _guard = Kill(child);
    cordon_mcp::install_crypto_provider();
    let connect = || {
        let mut config = StreamableHttpClientTransportConfig::with_uri(url.clone());
        config.reinit_on_expired_session = false;
        ().serve(StreamableHttpClientTransport::from_config(config))
    };
    let call = |c: &rmcp::service::RunningService<rmcp::RoleClient, ()>| {
        let mut p = CallToolRequestParams::new("hello");
        p.arguments = Some(JsonObject::new());
        let peer = c.peer().clone();
        async move { peer.call_tool(p).await }
    };
    let ends = || {
        std::fs::read_to_string(&unwritten)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(r#""what":"session end""#))
            .count()
    };
    let c = connect().await.unwrap();
    // Positive control: the live session answers, and no end is counted.
    let r = call(&c).await.expect("a call of the live session");
    assert!(text_of(&r).contains("hello"));
    assert_eq!(ends(), 0);
    for _ in 0..300 {
        if ends() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ends(), 1, "the idle session's end was not counted");
    // The next call (of a new session) is told.
    let c2 = connect().await.unwrap();
    let r = call(&c2).await.expect("a call of a new session");
    let warnings = r
        .meta
        .as_ref()
        .and_then(|m| m.0.get("cordon/warnings"))
        .map(|w| w.to_string())
        .unwrap_or_default();
    assert!(
        warnings.contains("the audit record of session end ((session), session "),
        "{warnings}"
    );
}
