//! Round-trip latency of a trivial MCP tool call through cordon's gateway
//! against the same call made directly, measured in the same run.
//!
//!     cargo bench -p cordon-mcp --bench mcp [-- --calls N]
//!
//! Rows:
//! - `mcp direct`: the rmcp client talks to the fixture MCP server
//!   (crates/mcp/tests/fixtures/fixture_server.py) over its stdio, no sandbox.
//! - `mcp via cordon`: the rmcp client talks to the gateway (in this process,
//!   over an in-memory stream), which forwards to the same server running in
//!   its P2 sandbox (one sandbox for the session), gates the result and
//!   writes the audit record.
//! - `wc direct`: fork/exec of /usr/bin/wc with the text on stdin.
//! - `word_count via cordon`: the example manifest's word_count over MCP: a
//!   fresh P1 jail per call, the gate, the audit record.
//!
//! Prints a markdown table: median, p95, and the ratio of each cordon row to
//! its direct baseline.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use cordon_mcp::rmcp;
use cordon_mcp::{Gateway, GatewayOptions};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use rmcp::transport::TokioChildProcess;
use serde_json::json;

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .canonicalize()
        .expect("fixtures")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

struct Stats {
    median: Duration,
    p95: Duration,
    n: usize,
}

fn stats(mut v: Vec<Duration>) -> Stats {
    v.sort();
    let n = v.len();
    Stats {
        median: v[n / 2],
        p95: v[((n * 95) / 100).min(n - 1)],
        n,
    }
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1000.0)
}

async fn time_calls(
    c: &RunningService<RoleClient, ()>,
    tool: &str,
    args: serde_json::Value,
    calls: usize,
) -> Vec<Duration> {
    let mut p = CallToolRequestParams::new(tool.to_owned());
    p.arguments = args.as_object().cloned();
    for _ in 0..10 {
        c.peer().call_tool(p.clone()).await.expect("warm-up call");
    }
    let mut out = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = Instant::now();
        let r = c.peer().call_tool(p.clone()).await.expect("call");
        out.push(t.elapsed());
        assert_eq!(r.is_error, Some(false), "{r:?}");
    }
    out
}

/// Serve `gw` on one end of an in-memory stream; connect an rmcp client to the other.
async fn gateway_client(gw: Arc<Gateway>) -> RunningService<RoleClient, ()> {
    let (client_io, server_io) = tokio::io::duplex(1 << 20);
    let session = gw.session("bench");
    tokio::spawn(async move {
        if let Ok(running) = session.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    ().serve(client_io).await.expect("initialize the gateway")
}

fn main() {
    let calls: usize = std::env::args()
        .skip_while(|a| a != "--calls")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(300);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let audit = dir.path().join("audit.jsonl");
    let manifest = dir.path().join("bench.yaml");
    std::fs::write(
        &manifest,
        format!(
            r#"version: 1
tools:
  fx:
    profile: P2
    description: The fixture MCP server.
    network: none
    limits: {{wall_seconds: 10, memory: 256M, tasks: 16}}
    mounts: ["{}:/fixture"]
    mcp:
      command: ["/usr/bin/python3", "/fixture/fixture_server.py"]
"#,
            fixtures().display()
        ),
    )
    .expect("write manifest");
    let opts = GatewayOptions {
        audit: Some(audit.clone()),
        ..GatewayOptions::default()
    };
    let text = "the quick brown fox jumps over the lazy dog\n";

    let rows = rt.block_on(async {
        // MCP server: direct.
        let mut cmd = tokio::process::Command::new("/usr/bin/python3");
        cmd.arg(fixtures().join("fixture_server.py"));
        let direct =
            ().serve(TokioChildProcess::new(cmd).expect("spawn the fixture"))
                .await
                .expect("initialize the fixture");
        let mcp_direct = time_calls(&direct, "echo", json!({"text": "ping"}), calls).await;
        let _ = direct.cancel().await;

        // MCP server: through cordon, sandboxed.
        let gw = Arc::new(Gateway::from_manifest(&manifest, &opts).expect("gateway"));
        let c = gateway_client(gw).await;
        let mcp_cordon = time_calls(&c, "fx.echo", json!({"text": "ping"}), calls).await;
        let _ = c.cancel().await;

        // The same through the `cordon serve` binary over stdio, when given.
        let mut binary = None;
        if let Some(bin) = std::env::var_os("CORDON_BIN") {
            let mut cmd = tokio::process::Command::new(bin);
            cmd.arg("serve")
                .arg("-m")
                .arg(&manifest)
                .env("CORDON_AUDIT", &audit);
            let (t, _) = TokioChildProcess::builder(cmd)
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn cordon serve");
            let c = ().serve(t).await.expect("initialize cordon serve");
            binary = Some(time_calls(&c, "fx.echo", json!({"text": "ping"}), calls).await);
            let _ = c.cancel().await;
        }

        // Command tool: wc directly, then word_count through cordon.
        let mut wc_direct = Vec::with_capacity(calls);
        for i in 0..calls + 10 {
            let t = Instant::now();
            let mut child = Command::new("/usr/bin/wc")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn wc");
            child
                .stdin
                .take()
                .expect("stdin")
                .write_all(text.as_bytes())
                .expect("write");
            let out = child.wait_with_output().expect("wc");
            assert!(out.status.success());
            if i >= 10 {
                wc_direct.push(t.elapsed());
            }
        }
        let gw = Arc::new(
            Gateway::from_manifest(&repo().join("examples/cordon.yaml"), &opts).expect("gateway"),
        );
        let c = gateway_client(gw).await;
        let wc_cordon = time_calls(&c, "word_count", json!({"text": text}), calls).await;
        let _ = c.cancel().await;
        let mut rows = vec![
            (
                "mcp direct (fixture server, no sandbox)",
                stats(mcp_direct.clone()),
            ),
            (
                "mcp via cordon (same server in its P2 sandbox)",
                stats(mcp_cordon),
            ),
        ];
        if let Some(b) = binary {
            rows.push(("mcp direct (fixture server, no sandbox)", stats(mcp_direct)));
            rows.push(("mcp via `cordon serve` over stdio (CORDON_BIN)", stats(b)));
        }
        rows.push(("wc direct (fork/exec)", stats(wc_direct)));
        rows.push((
            "word_count via cordon (fresh P1 jail per call)",
            stats(wc_cordon),
        ));
        rows
    });

    println!("| call | n | median | p95 | median ratio | p95 ratio |");
    println!("|---|---|---|---|---|---|");
    for (i, (name, s)) in rows.iter().enumerate() {
        let base = &rows[i - i % 2].1;
        let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
        let (rm, rp) = if i % 2 == 0 {
            ("1.00".to_string(), "1.00".to_string())
        } else {
            (
                format!("{:.2}", ratio(s.median, base.median)),
                format!("{:.2}", ratio(s.p95, base.p95)),
            )
        };
        println!(
            "| {name} | {} | {} | {} | {rm} | {rp} |",
            s.n,
            ms(s.median),
            ms(s.p95)
        );
    }
    let added = rows[1].1.median.saturating_sub(rows[0].1.median);
    println!(
        "\ncordon adds {} (median) to a call of a sandboxed MCP server.",
        ms(added)
    );
}
