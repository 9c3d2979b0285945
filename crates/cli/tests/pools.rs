//! `cordon doctor` shows the manifest's warm pools: the configured size
//! when no `cordon serve` runs with the state directory (it says so), and
//! with one running the live state it publishes: ready servers once the
//! pool fills, and a refill failure's reason when a server cannot start.
//! A status file left by a serve that was killed is not taken for a live
//! one. A command tool's pool audits each sandbox it could not make.

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

/// The records of `tool`'s pool with `event`.
fn pool_records(audit: &Path, tool: &str, event: &str) -> Vec<serde_json::Value> {
    audit_records(audit)
        .into_iter()
        .filter(|r| r["tool"] == tool && r["pool"]["event"] == event)
        .collect()
}

/// A command tool's pool (`lifetime: pool`) whose sandboxes cannot be made
/// (the directory it mounts was removed after the tool was admitted):
/// each failed start is an audit record of the pool's own
/// (`pool: {event: failed}`, the sandbox's id, the reason), the last one
/// saying the refill stopped. The control: a working pool beside it hands
/// its sandboxes over and writes no `failed` record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_pools_failed_starts_are_audited() {
    use cordon_mcp::rmcp::ServiceExt as _;
    let dir = cordon_testkit::scratch();
    let mut tools = String::from("version: 1\ntools:\n");
    for name in ["good", "bad"] {
        let data = dir.path().join(name);
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("notes.txt"), "a file\n").unwrap();
        tools.push_str(&format!(
            r#"  {name}:
    profile: P1
    description: List a directory, from a pool.
    lifetime: pool
    pool: {{size: 1}}
    command: [/usr/bin/ls, /data]
    limits: {{wall_seconds: 10, memory: 64M, tasks: 4}}
    network: none
    mounts: ["{}:/data"]
"#,
            data.display()
        ));
    }
    let m = dir.path().join("cordon.yaml");
    std::fs::write(&m, tools).unwrap();
    let audit = dir.path().join("audit.jsonl");
    let serve = Serve::manifest(env!("CARGO_BIN_EXE_cordon"), &m, &audit)
        .arg("--no-probe")
        .http();
    // Admitted with its directory; gone before its pool is made (at the
    // tool's first call).
    std::fs::remove_dir_all(dir.path().join("bad")).unwrap();
    let session = ().serve(cordon_mcp::http_client(&serve.url)).await.unwrap();
    let _ = call(&session, "bad", serde_json::json!({})).await;

    // The control: the working pool hands a sandbox over (its first call
    // made the pool and cold-started).
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let r = call(&session, "good", serde_json::json!({})).await.unwrap();
        assert_ne!(r.is_error, Some(true), "{r:?}");
        assert!(text_of(&r).contains("notes.txt"), "{r:?}");
        if !pool_records(&audit, "good", "handed_over").is_empty() || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(
        !pool_records(&audit, "good", "handed_over").is_empty(),
        "{:#?}",
        audit_records(&audit)
    );

    // The broken pool's failed starts, up to the one that stops its refill.
    let stopped = |r: &serde_json::Value| {
        r["reason"]
            .as_str()
            .is_some_and(|s| s.contains("refill stopped after 3 failed starts"))
    };
    let deadline = Instant::now() + Duration::from_secs(180);
    while !pool_records(&audit, "bad", "failed").iter().any(stopped) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let failed = pool_records(&audit, "bad", "failed");
    let of_bad: Vec<_> = audit_records(&audit)
        .into_iter()
        .filter(|r| r["tool"] == "bad")
        .collect();
    assert_eq!(failed.len(), 3, "{of_bad:#?}");
    assert!(failed.iter().any(stopped), "{failed:#?}");
    for r in &failed {
        let sandbox = r["pool"]["sandbox"].as_str().unwrap_or("");
        assert!(sandbox.starts_with("pool-"), "{r}");
        assert_eq!(r["session"], sandbox, "{r}");
        assert_eq!(r["pool"]["pooled"], true, "{r}");
        assert_eq!(r["caller"], "pool", "{r}");
        assert_eq!(r["status"], "tool_error", "{r}");
        assert!(
            r["reason"]
                .as_str()
                .is_some_and(|s| s.contains(&format!("pooled sandbox {sandbox} did not start: "))),
            "{r}"
        );
    }
    // Each sandbox once.
    let mut ids: Vec<&str> = failed
        .iter()
        .filter_map(|r| r["pool"]["sandbox"].as_str())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), 3, "{failed:#?}");
    // The control wrote none.
    for event in ["failed", "discarded"] {
        assert!(
            pool_records(&audit, "good", event).is_empty(),
            "{:#?}",
            audit_records(&audit)
        );
    }
    session.cancel().await.unwrap();
}
