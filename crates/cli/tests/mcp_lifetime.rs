//! `cordon serve --idle-timeout` ends an idle HTTP session (audited so, a
//! later request refused), and `cordon explain` without a tool prints the
//! gateway section.

mod common;
use common::*;

use std::time::Duration;

use cordon_mcp::rmcp;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, JsonObject};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

const MANIFEST: &str = "version: 1
gateway: {idle_timeout: 30m, per_principal: {sessions: 3}}
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
