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
//!
//!     cargo bench -p cordon-mcp --bench mcp -- --sessions N
//!
//! Agent sessions instead: open N sessions one after the other, each with
//! one `mcp:` server in its P2 sandbox (initialize + tools/list, so the
//! sandbox is up), then measure the memory of the idle sessions and close
//! them. The same N servers started directly (no sandbox, no gateway) are
//! the baseline. Rows for the Python fixture server and, when installed,
//! server-everything under node. See `sessions` below.

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
    if let Some(n) = std::env::args()
        .skip_while(|a| a != "--sessions")
        .nth(1)
        .and_then(|n| n.parse().ok())
    {
        sessions::main(n);
        return;
    }
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
        let mcp_cordon = time_calls(&c, "fx__echo", json!({"text": "ping"}), calls).await;
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
            binary = Some(time_calls(&c, "fx__echo", json!({"text": "ping"}), calls).await);
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

/// Sessions per second and memory per idle session.
mod sessions {
    use super::*;
    use std::collections::HashMap;

    /// `(pid, ppid)` of every process.
    fn process_table() -> HashMap<i32, i32> {
        let mut t = HashMap::new();
        for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
                continue;
            };
            // comm may hold spaces and parentheses: ppid is after the last ')'.
            if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                && let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r)
                && let Some(ppid) = rest.split_whitespace().nth(1).and_then(|p| p.parse().ok())
            {
                t.insert(pid, ppid);
            }
        }
        t
    }

    /// Every process descended from this one.
    pub fn descendants() -> Vec<i32> {
        let me = std::process::id() as i32;
        let t = process_table();
        let mut out = Vec::new();
        let mut frontier = vec![me];
        while let Some(p) = frontier.pop() {
            for (&c, &pp) in &t {
                if pp == p {
                    out.push(c);
                    frontier.push(c);
                }
            }
        }
        out
    }

    /// Proportional set size of a process in bytes (0 when it is gone).
    fn pss(pid: i32) -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("Pss:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|kb| kb.parse::<u64>().ok())
            })
            .map(|kb| kb * 1024)
            .unwrap_or(0)
    }

    /// Pss of this process plus all its descendants.
    fn tree_pss() -> u64 {
        pss(std::process::id() as i32) + descendants().into_iter().map(pss).sum::<u64>()
    }

    struct Row {
        name: String,
        n: usize,
        open: Duration,
        per_session: u64,
        /// Of which this process (the gateway, or the direct clients).
        own_per_session: u64,
        procs_open: usize,
        left: usize,
        close: Duration,
    }

    async fn settle_gone() -> (usize, Duration) {
        let t = Instant::now();
        for _ in 0..200 {
            if descendants().is_empty() {
                return (0, t.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        (descendants().len(), t.elapsed())
    }

    fn own_pss() -> u64 {
        pss(std::process::id() as i32)
    }

    /// N direct clients of `argv` (no sandbox): the baseline.
    async fn direct(name: &str, argv: &[String], n: usize) -> Row {
        let own_before = own_pss();
        let before = tree_pss();
        let t = Instant::now();
        let mut clients = Vec::with_capacity(n);
        for _ in 0..n {
            let mut cmd = tokio::process::Command::new(&argv[0]);
            // The environment the sandbox gives the server, so that both
            // rows start the same way (e.g. NODE_EXTRA_CA_CERTS would make
            // node parse a CA bundle at start).
            cmd.args(&argv[1..])
                .env_clear()
                .env("PATH", "/usr/local/bin:/usr/bin:/bin")
                .env("HOME", "/tmp")
                .env("LANG", "C.UTF-8");
            let (tr, _) = TokioChildProcess::builder(cmd)
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn the server");
            let c = ().serve(tr).await.expect("initialize the server");
            c.peer().list_all_tools().await.expect("tools/list");
            clients.push(c);
        }
        let open = t.elapsed();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let procs_open = descendants().len();
        let after = tree_pss();
        let own_after = own_pss();
        let t = Instant::now();
        for c in clients {
            let _ = c.cancel().await;
        }
        let (left, _) = settle_gone().await;
        Row {
            name: format!("{name} direct (no sandbox)"),
            n,
            open,
            per_session: after.saturating_sub(before) / n as u64,
            own_per_session: own_after.saturating_sub(own_before) / n as u64,
            procs_open,
            left,
            close: t.elapsed(),
        }
    }

    /// N agent sessions through the gateway, one sandboxed server each.
    async fn through_cordon(name: &str, manifest: &Path, tool: &str, n: usize) -> Row {
        let dir = tempfile::tempdir().expect("tempdir");
        let opts = GatewayOptions {
            audit: Some(dir.path().join("audit.jsonl")),
            ..GatewayOptions::default()
        };
        let gw = Arc::new(Gateway::from_manifest(manifest, &opts).expect("gateway"));
        let own_before = own_pss();
        let before = tree_pss();
        let t = Instant::now();
        let mut clients = Vec::with_capacity(n);
        for _ in 0..n {
            let c = gateway_client(gw.clone()).await;
            let tools = c.peer().list_all_tools().await.expect("tools/list");
            assert!(tools.iter().any(|t| t.name.starts_with(tool)), "{tools:?}");
            clients.push(c);
        }
        let open = t.elapsed();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let procs_open = descendants().len();
        let after = tree_pss();
        let own_after = own_pss();
        let t = Instant::now();
        for c in clients {
            let _ = c.cancel().await;
        }
        let (left, _) = settle_gone().await;
        Row {
            name: format!("{name} via cordon (P2 sandbox per session)"),
            n,
            open,
            per_session: after.saturating_sub(before) / n as u64,
            own_per_session: own_after.saturating_sub(own_before) / n as u64,
            procs_open,
            left,
            close: t.elapsed(),
        }
    }

    fn manifest(dir: &Path, tool: &str, mounts: &str, memory: &str, argv: &[String]) -> PathBuf {
        let m = dir.join(format!("{tool}.yaml"));
        let cmd = serde_json::to_string(argv).expect("argv");
        std::fs::write(
            &m,
            format!(
                "version: 1\ntools:\n  {tool}:\n    profile: P2\n    description: bench\n    network: none\n    limits: {{wall_seconds: 30, memory: {memory}, tasks: 64}}\n    mounts: [{mounts}]\n    mcp:\n      command: {cmd}\n"
            ),
        )
        .expect("write manifest");
        m
    }

    pub fn main(n: usize) {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("runtime");
        let dir = tempfile::tempdir().expect("tempdir");
        let mut servers: Vec<(&str, PathBuf, Vec<String>, Vec<String>)> = vec![(
            "fixture (python)",
            manifest(
                dir.path(),
                "fx",
                &format!("\"{}:/fixture\"", fixtures().display()),
                "256M",
                &[
                    "/usr/bin/python3".into(),
                    "/fixture/fixture_server.py".into(),
                ],
            ),
            vec![
                "/usr/bin/python3".into(),
                fixtures().join("fixture_server.py").display().to_string(),
            ],
            vec!["fx.".into()],
        )];
        let npm = std::env::var_os("CORDON_E2E_NPM")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/var/cache/cordon-e2e/npm"));
        let everything = "node_modules/@modelcontextprotocol/server-everything/dist/index.js";
        if npm.join(everything).is_file() {
            servers.push((
                "server-everything (node)",
                manifest(
                    dir.path(),
                    "everything",
                    &format!("\"{}:/srv/npm\"", npm.display()),
                    "1G",
                    &[
                        "/usr/bin/node".into(),
                        format!("/srv/npm/{everything}"),
                        "stdio".into(),
                    ],
                ),
                vec![
                    "/usr/bin/node".into(),
                    npm.join(everything).display().to_string(),
                    "stdio".into(),
                ],
                vec!["everything.".into()],
            ));
        } else {
            eprintln!(
                "server-everything is not installed under {}: its rows are skipped",
                npm.display()
            );
        }
        let rows = rt.block_on(async {
            let mut rows = Vec::new();
            for (name, manifest, argv, prefix) in &servers {
                // Warm-up (not counted): the page cache holds the
                // interpreter and the server's files for both rows.
                direct(name, argv, 2).await;
                through_cordon(name, manifest, &prefix[0], 2).await;
                rows.push(direct(name, argv, n).await);
                rows.push(through_cordon(name, manifest, &prefix[0], n).await);
            }
            rows
        });
        println!(
            "| sessions | n | open (total) | sessions/s | ratio | memory per idle session (Pss) | ratio | of which this process | processes while open | left after close | close (total) |"
        );
        println!("|---|---|---|---|---|---|---|---|---|---|---|");
        for (i, r) in rows.iter().enumerate() {
            let base = &rows[i - i % 2];
            let rate = |r: &Row| r.n as f64 / r.open.as_secs_f64();
            println!(
                "| {} | {} | {:.2} s | {:.1} | {:.2} | {:.1} MiB | {:.2} | {:.2} MiB | {} | {} | {:.2} s |",
                r.name,
                r.n,
                r.open.as_secs_f64(),
                rate(r),
                rate(r) / rate(base),
                r.per_session as f64 / (1024.0 * 1024.0),
                r.per_session as f64 / base.per_session.max(1) as f64,
                r.own_per_session as f64 / (1024.0 * 1024.0),
                r.procs_open,
                r.left,
                r.close.as_secs_f64(),
            );
        }
        let left: usize = rows.iter().map(|r| r.left).sum();
        if left > 0 {
            eprintln!("{left} process(es) still running after the sessions closed");
            std::process::exit(1);
        }
    }
}
