//! Exposed names of `mcp:` servers: the server's own names (`expose:
//! as-is`), `rename` to a full name, names no model API accepts refused,
//! and every name belonging to one tool: a collision with a command tool or
//! another server refused at listing time and reported once, a collision
//! the manifest fixes refused at load with both names.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use cordon_mcp::rmcp;
use rmcp::model::GetPromptRequestParams;
use rmcp::service::{RoleClient, RunningService};
use serde_json::json;

/// Two fixture servers exposed as-is beside a command tool `echo`: `a`
/// (every tool, two with names no model API accepts, `crash` renamed) and
/// `b` (only `probe` and `fail`, which the manifest so fixes for it).
fn manifest(dir: &Path) -> PathBuf {
    let server = |name: &str, args: &str, tools: &str| {
        format!(
            r#"  {name}:
    profile: P2
    description: The fixture MCP server.
    network: none
    limits: {{wall_seconds: 5, memory: 256M, tasks: 16}}
    mounts: ["{fixtures}:/srv/fixtures"]
    mcp:
      command: ["/usr/bin/python3", "/srv/fixtures/fixture_server.py"{args}]
      expose: as-is
      tools: {tools}
"#,
            fixtures = fixtures().display()
        )
    };
    let m = format!(
        r#"version: 1
tools:
  echo:
    profile: P1
    description: A command tool with the name of a server's tool.
    command: ["/bin/cat"]
    input: {{stdin: text}}
    input_schema: {{type: object, properties: {{text: {{type: string}}}}, required: [text]}}
{}{}"#,
        server(
            "a",
            r#", "--names", "--prompts""#,
            "{rename: {crash: a_crash}}"
        ),
        server("b", r#", "--prompts""#, "{allow: [probe, fail]}"),
    );
    let p = dir.join("cordon.yaml");
    std::fs::write(&p, m).unwrap();
    p
}

type Client = RunningService<RoleClient, ()>;

async fn client(manifest: &Path, audit: &Path, stderr: &Path) -> Client {
    let log = std::fs::File::create(stderr).unwrap();
    Serve::manifest(env!("CARGO_BIN_EXE_cordon"), manifest, audit)
        .stdio((), Stdio::from(log))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn as_is_names_are_the_servers_and_each_belongs_to_one_tool() {
    let dir = tempdir();
    let m = manifest(dir.path());
    let audit = dir.path().join("audit.jsonl");
    let stderr = dir.path().join("stderr.log");
    let c = client(&m, &audit, &stderr).await;

    let tools = c.peer().list_all_tools().await.unwrap();
    let mut names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
    names.sort();
    // The server's own names; `crash` renamed to a full name; `echo` is the
    // command tool's; `probe` and `fail` are b's; the two invalid names are
    // left out.
    assert_eq!(
        names,
        [
            "a_crash", "echo", "fail", "hang", "image", "probe", "secret", "slow"
        ],
        "{names:?}"
    );
    let server_of = |n: &str| {
        tools
            .iter()
            .find(|t| t.name == n)
            .and_then(|t| t.meta.as_ref())
            .and_then(|m| m.get("cordon/server"))
            .cloned()
    };
    assert_eq!(server_of("probe"), Some(json!("b")));
    assert_eq!(server_of("fail"), Some(json!("b")));
    assert_eq!(server_of("hang"), Some(json!("a")));
    assert_eq!(server_of("echo"), None, "the command tool");

    // `echo` runs the command tool, not server a's echo.
    let r = call(&c, "echo", json!({"text": "from the command tool"}))
        .await
        .unwrap();
    let t = text_of(&r);
    assert!(t.contains("from the command tool"), "{t}");
    assert_eq!(
        r.meta.as_ref().and_then(|m| m.get("cordon/tool")),
        Some(&json!("echo")),
        "{r:?}"
    );
    // `probe` reaches b (a positive control of the routing: a call).
    let r = call(&c, "probe", json!({})).await.unwrap();
    assert!(text_of(&r).contains("pid"), "{}", text_of(&r));
    let recs = audit_records(&audit);
    assert!(
        recs.iter()
            .any(|r| r["tool"] == "probe" && r["status"] == "ok"),
        "{recs:#?}"
    );

    // A name no model API accepts is refused, with the reason.
    let e = mcp_error(call(&c, "bad.name", json!({})).await.unwrap_err());
    assert_eq!(e.data.as_ref().unwrap()["cordon/status"], "name_refused");
    assert!(
        e.message.contains("server `a`")
            && e.message.contains("`bad.name`")
            && e.message.contains("letters, digits"),
        "{}",
        e.message
    );
    let long = "n".repeat(70);
    let e = mcp_error(call(&c, &long, json!({})).await.unwrap_err());
    assert_eq!(e.data.as_ref().unwrap()["cordon/status"], "name_refused");
    assert!(e.message.contains("70 characters"), "{}", e.message);

    // Prompts: both servers have `greet`; the first to list it keeps it,
    // the other's is refused.
    let prompts = c.peer().list_all_prompts().await.unwrap();
    let greet: Vec<_> = prompts.iter().filter(|p| p.name == "greet").collect();
    assert_eq!(greet.len(), 1, "{prompts:?}");
    let owner = greet[0]
        .meta
        .as_ref()
        .and_then(|m| m.get("cordon/server"))
        .and_then(|s| s.as_str())
        .unwrap()
        .to_owned();
    let other = if owner == "a" { "b" } else { "a" };
    let r = c
        .peer()
        .get_prompt(GetPromptRequestParams::new("greet"))
        .await
        .unwrap();
    let text = r.messages[0].content.as_text().unwrap().text.clone();
    assert!(text.contains("hello from greet"), "{text}");

    // List again: the reasons are printed once each.
    c.peer().list_all_tools().await.unwrap();
    c.peer().list_all_prompts().await.unwrap();
    c.cancel().await.unwrap();
    let log = std::fs::read_to_string(&stderr).unwrap();
    for needle in [
        "server `a`: its tool `echo` is refused: the name `echo` is the command tool `echo`"
            .to_owned(),
        "server `a`: its tool `probe` is refused: the name `probe` is a name of server `b`"
            .to_owned(),
        "server `a`: its tool `fail` is refused: the name `fail` is a name of server `b`"
            .to_owned(),
        "server `a`: its tool `bad.name` is refused".to_owned(),
        format!(
            "server `{other}`: its prompt `greet` is refused: the name `greet` is a name of server `{owner}`"
        ),
    ] {
        assert_eq!(log.matches(needle.as_str()).count(), 1, "{needle}\n{log}");
    }
}

#[test]
fn a_collision_the_manifest_fixes_is_refused_at_load_with_both_names() {
    let dir = tempdir();
    let m = dir.path().join("cordon.yaml");
    let text = r#"version: 1
tools:
  a:
    profile: P2
    network: none
    mcp:
      command: ["/usr/bin/python3", "/srv/a.py"]
      expose: as-is
      tools: {allow: [read_file]}
  b:
    profile: P2
    network: none
    mcp:
      command: ["/usr/bin/python3", "/srv/b.py"]
      tools: {rename: {read: read_file}}
"#;
    std::fs::write(&m, text).unwrap();
    for cmd in ["check", "serve"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cordon"))
            .arg(cmd)
            .arg("-m")
            .arg(&m)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(!out.status.success(), "{cmd}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("exposed tool name `read_file` is given twice")
                && err.contains("tool `a`")
                && err.contains("tool `b`")
                && err.contains("cordon.yaml:15:"),
            "{cmd}: {err}"
        );
    }
    // Positive control: prefixed, b's rename target differs.
    std::fs::write(&m, text.replace("read: read_file", "read: b_read_file")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["check", "-m"])
        .arg(&m)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("given twice"), "{err}");
}
