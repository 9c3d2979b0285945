//! `cordon doctor` shows the manifest's warm pools: the configured size
//! when no `cordon serve` runs with the state directory (it says so), and
//! with one running the live state it publishes: ready servers once the
//! pool fills, and a refill failure's reason when a server cannot start.
//! A status file left by a serve that was killed is not taken for a live
//! one.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn manifest(dir: &Path) -> PathBuf {
    let m = format!(
        r#"version: 1
tools:
  fx:
    profile: P2
    description: The fixture MCP server, kept warm.
    network: none
    limits: {{wall_seconds: 20, memory: 256M, tasks: 16}}
    mounts: ["{fixtures}:/fixture"]
    mcp:
      command: ["/usr/bin/python3", "/fixture/fixture_server.py"]
      warm: 2
  broken:
    profile: P2
    description: A server that exits before it answers.
    network: none
    limits: {{wall_seconds: 20, memory: 256M, tasks: 16}}
    mcp:
      command: ["/usr/bin/python3", "-c", "import sys; sys.stderr.write('no config here\\n'); sys.exit(3)"]
      warm: 1
"#,
        fixtures = fixtures().display()
    );
    let p = dir.join("cordon.yaml");
    std::fs::write(&p, m).unwrap();
    p
}

fn doctor(manifest: &Path, state: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["doctor", "-m"])
        .arg(manifest)
        .env("CORDON_STATE_DIR", state)
        .env_remove("CORDON_MANIFEST")
        .output()
        .expect("run cordon doctor");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The lines of `tool`'s pool in doctor's output.
fn pool_lines(out: &str, tool: &str) -> String {
    let head = format!("pool {tool} ");
    let mut lines = out.lines().skip_while(|l| !l.starts_with(&head));
    let mut got: Vec<&str> = lines.next().into_iter().collect();
    got.extend(lines.take_while(|l| l.starts_with("      ")));
    got.join("\n")
}

/// Run doctor until `ok` holds of `tool`'s pool lines (a generous bound
/// for a loaded machine; the assertion is on what it shows).
fn wait_for(manifest: &Path, state: &Path, tool: &str, ok: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let lines = pool_lines(&doctor(manifest, state), tool);
        if ok(&lines) || Instant::now() > deadline {
            return lines;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_shows_pool_sizes_and_a_running_serves_pool_state() {
    use cordon_mcp::rmcp::ServiceExt as _;
    if !cordon_testkit::is_root() || !Path::new("/usr/bin/python3").exists() {
        skip_or_fail(
            &this_test(),
            "needs root and /usr/bin/python3 (the fixture server)",
        );
        return;
    }
    let dir = cordon_testkit::scratch();
    let m = manifest(dir.path());
    let audit = dir.path().join("audit.jsonl");

    // No serve: the configured sizes, and that none is running.
    let out = doctor(&m, dir.path());
    let fx = pool_lines(&out, "fx");
    assert!(fx.contains("pool fx (warm mcp: server): size 2"), "{out}");
    assert!(fx.contains("cordon serve not running"), "{out}");
    let broken = pool_lines(&out, "broken");
    assert!(broken.contains("size 1"), "{out}");

    // A running serve: its pools' live state.
    let serve = Serve::manifest(env!("CARGO_BIN_EXE_cordon"), &m, &audit)
        .arg("--no-probe")
        .http();
    let pid = serve.child.0.id();
    let fx = wait_for(&m, dir.path(), "fx", |l| l.contains("ready 2"));
    assert!(
        fx.contains(&format!("serve {pid}, tenant ")) && fx.contains("ready 2, starting 0"),
        "{fx}"
    );
    assert!(!fx.contains("not running"), "{fx}");
    let broken = wait_for(&m, dir.path(), "broken", |l| l.contains("last failure:"));
    assert!(broken.contains("ready 0"), "{broken}");
    assert!(!broken.contains("refill failures 0"), "{broken}");
    assert!(broken.contains("last failure: "), "{broken}");
    let reason = broken.split("last failure: ").nth(1).unwrap_or("");
    assert!(!reason.trim().is_empty(), "{broken}");

    // A session takes one: the hand-over is shown, and the pool refills.
    let session = ().serve(cordon_mcp::http_client(&serve.url)).await.unwrap();
    let r = call(&session, "fx__echo", serde_json::json!({"text": "hi"}))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(false), "{r:?}");
    let fx = wait_for(&m, dir.path(), "fx", |l| {
        l.contains("ready 2") && l.contains("handed out 1")
    });
    assert!(fx.contains("ready 2, starting 0, handed out 1"), "{fx}");
    session.cancel().await.unwrap();

    // The audit log has the refill's records, with the pool's sandbox ids.
    let log = std::fs::read_to_string(&audit).unwrap();
    let events: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|r: &serde_json::Value| r.get("pool").is_some_and(|p| !p.is_null()))
        .collect();
    let of = |tool: &str, event: &str| {
        events
            .iter()
            .filter(|r| r["tool"] == tool && r["pool"]["event"] == event)
            .count()
    };
    assert!(of("fx", "ready") >= 3, "{log}");
    assert_eq!(of("fx", "handed_over"), 1, "{log}");
    assert!(of("broken", "failed") >= 1, "{log}");
    assert!(
        events.iter().all(|r| r["pool"]["sandbox"]
            .as_str()
            .is_some_and(|s| s.starts_with("mcp-warm-"))),
        "{log}"
    );

    // Killed without removing its status: not taken for a running one.
    drop(serve);
    let out = doctor(&m, dir.path());
    assert!(
        pool_lines(&out, "fx").contains("cordon serve not running"),
        "{out}"
    );
    assert!(!out.contains(&format!("serve {pid},")), "{out}");
}
