//! A session workspace over MCP: `cordon serve` on stdio, driven by the
//! rmcp client. Two tools of the session share the workspace, a second
//! session has its own, and once a client goes (its session ends) its
//! workspace is unmounted.

mod common;

use std::path::Path;
use std::process::Stdio;

use cordon_mcp::rmcp;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use serde_json::json;

use common::{Serve, skip, tempdir, text_of};

type Client = RunningService<RoleClient, ()>;

const MANIFEST: &str = r#"
tools:
  put:
    profile: P1
    description: Run a shell script with the workspace at /work.
    command: ["/bin/sh"]
    workspace: {mount: /work, size: 1M}
    input: {stdin: script}
    input_schema: {type: object, properties: {script: {type: string}}, required: [script]}
  get:
    profile: P1
    description: Run a shell script with the workspace at /shared.
    command: ["/bin/sh"]
    workspace: {mount: /shared, size: 1M}
    input: {stdin: script}
    input_schema: {type: object, properties: {script: {type: string}}, required: [script]}
"#;

/// `cordon serve` of `dir/cordon.yaml` on stdio; `probe`: with the
/// conformance probes at start (which run each tool's sandbox without its
/// workspace), else `--no-probe`.
async fn client(dir: &Path, probe: bool) -> Client {
    let mut serve = Serve::new(env!("CARGO_BIN_EXE_cordon"));
    if !probe {
        serve = serve.arg("--no-probe");
    }
    serve
        .arg("-m")
        .arg(dir.join("cordon.yaml"))
        .env("CORDON_AUDIT", dir.join("audit.jsonl"))
        .env("CORDON_RUN_DIR", dir.join("run"))
        .env("CORDON_STATE_DIR", dir.join("state"))
        .stdio((), Stdio::inherit())
        .await
}

async fn sh(c: &Client, tool: &str, script: &str) -> String {
    let mut p = CallToolRequestParams::new(tool.to_owned());
    p.arguments = json!({"script": script}).as_object().cloned();
    let r = c.peer().call_tool(p).await.expect("call");
    assert_ne!(r.is_error, Some(true), "{tool}: {}", text_of(&r));
    text_of(&r)
}

fn workspace_mounts(dir: &Path) -> Vec<String> {
    let run = dir.join("run").join("workspaces");
    let run = run.to_string_lossy();
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
        .filter(|m| m.starts_with(&*run))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_workspace_is_shared_by_its_tools_and_goes_with_it() {
    if !cordon_testkit::is_root() {
        skip::skip_or_fail(
            "a_session_workspace_is_shared_by_its_tools_and_goes_with_it",
            "needs root (workspaces are tmpfs mounts of the broker's)",
        );
        return;
    }
    let dir = tempdir();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::write(dir.0.join("cordon.yaml"), MANIFEST).unwrap();
    let one = client(&dir.0, false).await;
    let two = client(&dir.0, false).await;
    sh(&one, "put", "echo from-one > /work/note").await;
    sh(&two, "put", "echo from-two > /work/note").await;
    // The session's second tool sees the first one's file.
    assert!(
        sh(&one, "get", "cat /shared/note")
            .await
            .contains("from-one")
    );
    assert!(
        sh(&two, "get", "cat /shared/note")
            .await
            .contains("from-two")
    );
    assert_eq!(
        workspace_mounts(&dir.0).len(),
        2,
        "{:?}",
        workspace_mounts(&dir.0)
    );
    // The first client goes: its session's workspace is unmounted (the
    // server exits when stdin closes).
    one.cancel().await.expect("close the first client");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while workspace_mounts(&dir.0).len() > 1 {
        assert!(
            std::time::Instant::now() < deadline,
            "the ended session's workspace stayed: {:?}",
            workspace_mounts(&dir.0)
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(
        sh(&two, "get", "cat /shared/note")
            .await
            .contains("from-two")
    );
    two.cancel().await.expect("close the second client");
}

/// `cordon run` of a tool with state, then `cordon state ls` and
/// `cordon state rm`.
#[test]
fn cordon_state_ls_and_rm() {
    if !cordon_testkit::is_root() {
        skip::skip_or_fail(
            "cordon_state_ls_and_rm",
            "needs root (a state is a loop-mounted ext4 image)",
        );
        return;
    }
    let dir = tempdir();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::write(
        dir.0.join("cordon.yaml"),
        "tools:\n  memo:\n    profile: P1\n    command: [\"/bin/sh\"]\n    state: {mount: /data, size: 2M}\n",
    )
    .unwrap();
    let cordon = |args: &[&str], stdin: &str| {
        use std::io::Write;
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_cordon"))
            .args(args)
            .env("CORDON_AUDIT", dir.0.join("audit.jsonl"))
            .env("CORDON_RUN_DIR", dir.0.join("run"))
            .env("CORDON_STATE_DIR", dir.0.join("state"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        c.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        let o = c.wait_with_output().unwrap();
        (
            o.status.code(),
            String::from_utf8_lossy(&o.stdout).into_owned(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let m = dir.0.join("cordon.yaml");
    let m = m.to_str().unwrap();
    let (code, _, err) = cordon(&["run", "-m", m, "memo"], "echo 1 >> /data/n");
    assert_eq!(code, Some(0), "{err}");
    let (_, out, err) = cordon(&["run", "-m", m, "memo"], "echo 2 >> /data/n; cat /data/n");
    assert!(out.contains("1\n2"), "{out} {err}");
    let (code, out, _) = cordon(&["state", "ls"], "");
    assert_eq!(code, Some(0));
    assert_eq!(out, "default\tmemo\t2M\n");
    let (code, _, err) = cordon(&["state", "rm", "--tenant", "other", "memo"], "");
    assert_ne!(code, Some(0), "removed another tenant's state: {err}");
    let (code, out, err) = cordon(&["state", "rm", "memo"], "");
    assert_eq!(code, Some(0), "{out} {err}");
    assert_eq!(cordon(&["state", "ls"], "").1, "");
    let (_, out, _) = cordon(&["run", "-m", m, "memo"], "cat /data/n; echo rc=$?");
    assert!(out.contains("rc=1"), "the state came back: {out}");
}

/// An `mcp:` server that declares a workspace gets the session's, like a
/// command tool (the fixture server reports whether `/work` exists), and
/// it goes when the session ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_server_gets_the_session_workspace() {
    if !cordon_testkit::is_root() {
        skip::skip_or_fail(
            "an_mcp_server_gets_the_session_workspace",
            "needs root (workspaces are tmpfs mounts of the broker's)",
        );
        return;
    }
    let dir = tempdir();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o711)).unwrap();
    let fixtures = common::fixtures();
    let server = |name: &str, workspace: &str| {
        format!(
            r#"  {name}:
    profile: P2
    network: none
    limits: {{wall_seconds: 5, memory: 256M, tasks: 16}}
    mounts: ["{f}:/fixtures"]
{workspace}    mcp:
      command: ["/usr/bin/python3", "/fixtures/fixture_server.py"]
      tools: {{allow: [probe]}}
"#,
            f = fixtures.display()
        )
    };
    std::fs::write(
        dir.0.join("cordon.yaml"),
        format!(
            "tools:\n{}{}{}",
            server("with", "    workspace: {mount: /work, size: 1M}\n"),
            server("without", ""),
            // A command tool of the same session, probed at start too.
            MANIFEST
                .split_once("  get:")
                .unwrap()
                .0
                .trim_start_matches("\ntools:\n")
        ),
    )
    .unwrap();
    let c = client(&dir.0, true).await;
    let probe = |tool: &'static str| {
        let c = &c;
        async move {
            let r = c
                .peer()
                .call_tool(CallToolRequestParams::new(format!("{tool}__probe")))
                .await
                .expect("probe");
            let t = text_of(&r);
            let (a, b) = (t.find('{').unwrap(), t.rfind('}').unwrap());
            serde_json::from_str::<serde_json::Value>(&t[a..=b]).unwrap()
        }
    };
    // Served after its probes, and writing into the session's workspace.
    sh(&c, "put", "echo x > /work/x").await;
    let with = probe("with").await;
    assert_eq!(with["work_visible"], true, "{with}");
    // The control: the same server without a workspace has no /work.
    let without = probe("without").await;
    assert_eq!(without["work_visible"], false, "{without}");
    assert_eq!(
        workspace_mounts(&dir.0).len(),
        1,
        "{:?}",
        workspace_mounts(&dir.0)
    );
    c.cancel().await.expect("close the client");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !workspace_mounts(&dir.0).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the ended session's workspace stayed: {:?}",
            workspace_mounts(&dir.0)
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
