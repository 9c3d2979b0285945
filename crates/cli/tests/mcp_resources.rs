//! Resources and prompts of sandboxed MCP servers behind `cordon serve`:
//! the reference server `@modelcontextprotocol/server-everything` (it has
//! resources, resource templates and prompts) next to the Python fixture
//! server (tools only), driven by the rmcp client. Fails when
//! server-everything is not installed (scripts/setup.sh installs it) unless
//! skipping is allowed (`skip_or_fail`).

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Stdio;

use cordon_mcp::rmcp;
use rmcp::model::{
    ErrorCode, GetPromptRequestParams, ReadResourceRequestParams, ReadResourceResult,
    ResourceContents,
};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use serde_json::{Value, json};

/// server-everything as `everything` (with `extra` appended to its tool
/// entry) and, unless `alone`, the fixture server as `fx`.
fn manifest(dir: &Path, npm: &Path, extra: &str, alone: bool) -> PathBuf {
    let mut m = format!(
        r#"version: 1
tools:
  everything:
    profile: P2
    description: The MCP reference test server.
    network: none
    limits: {{wall_seconds: 20, memory: 1G, tasks: 64}}
    mounts: ["{npm}:/srv/npm"]
    mcp:
      command: ["/usr/bin/node", "/srv/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js", "stdio"]
{extra}"#,
        npm = npm.display()
    );
    if !alone {
        m.push_str(&format!(
            r#"  fx:
    profile: P2
    description: The fixture MCP server.
    network: none
    limits: {{wall_seconds: 5, memory: 256M, tasks: 16}}
    mounts: ["{}:/fixture"]
    mcp:
      command: ["/usr/bin/python3", "/fixture/fixture_server.py"]
"#,
            fixtures().display()
        ));
    }
    let p = dir.join("cordon.yaml");
    std::fs::write(&p, m).unwrap();
    p
}

/// A manifest with only the fixture server (no resources, no prompts).
fn fixture_only(dir: &Path) -> PathBuf {
    let m = format!(
        r#"version: 1
tools:
  fx:
    profile: P2
    description: The fixture MCP server.
    network: none
    limits: {{wall_seconds: 5, memory: 256M, tasks: 16}}
    mounts: ["{}:/fixture"]
    mcp:
      command: ["/usr/bin/python3", "/fixture/fixture_server.py"]
"#,
        fixtures().display()
    );
    let p = dir.join("fx-only.yaml");
    std::fs::write(&p, m).unwrap();
    p
}

type Client = RunningService<RoleClient, ()>;

async fn client(manifest: &Path, audit: &Path) -> Client {
    Serve::manifest(env!("CARGO_BIN_EXE_cordon"), manifest, audit)
        .arg("--no-probe")
        .stdio((), Stdio::inherit())
        .await
}

async fn read(c: &Client, uri: &str) -> Result<ReadResourceResult, ServiceError> {
    c.peer()
        .read_resource(ReadResourceRequestParams::new(uri))
        .await
}

async fn prompt(
    c: &Client,
    name: &str,
    args: Value,
) -> Result<rmcp::model::GetPromptResult, ServiceError> {
    let mut p = GetPromptRequestParams::new(name);
    p.arguments = args.as_object().cloned();
    c.peer().get_prompt(p).await
}

fn status(e: &rmcp::ErrorData) -> &str {
    e.data
        .as_ref()
        .and_then(|d| d.get("cordon/status"))
        .and_then(|s| s.as_str())
        .unwrap_or("")
}

/// The body between the untrusted markers.
fn body(text: &str) -> String {
    assert!(text.starts_with("<untrusted-output "), "{text}");
    let mut lines: Vec<&str> = text.lines().collect();
    lines.remove(0);
    lines.pop();
    lines.join("\n")
}

/// Standard base64, padded (no extra dev-dependency for one decode).
fn b64decode(s: &str) -> Vec<u8> {
    const ABC: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in s.bytes().filter(|c| *c != b'=') {
        let v = ABC.iter().position(|x| *x == c).expect("base64 digit") as u32;
        acc = (acc << 6) | v;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(deprecated)] // resources/subscribe: the servers speak revisions that have it
async fn resources_and_prompts_of_a_sandboxed_server_are_forwarded_gated_and_audited() {
    let Some(npm) = npm_dir() else {
        skip_or_fail(
            "resources_and_prompts_of_a_sandboxed_server_are_forwarded_gated_and_audited",
            "server-everything is not installed; run scripts/setup.sh",
        );
        return;
    };
    let dir = tempdir();
    let audit = dir.0.join("audit.jsonl");
    let c = client(&manifest(&dir.0, &npm, "", false), &audit).await;

    // Advertised, since one server (everything) has them.
    let caps = &c.peer().peer_info().expect("server info").capabilities;
    assert!(caps.resources.is_some(), "{caps:?}");
    assert!(caps.prompts.is_some(), "{caps:?}");

    // resources/list: everything's resources, their original URIs, marked
    // as the server's; the fixture has none and is no error.
    let resources = c.peer().list_all_resources().await.unwrap();
    let doc = resources
        .iter()
        .find(|r| r.uri.starts_with("demo://resource/static/document/"))
        .unwrap_or_else(|| panic!("{resources:?}"));
    let meta = doc.meta.as_ref().unwrap();
    assert_eq!(meta.get("cordon/server"), Some(&json!("everything")));
    assert_eq!(meta.get("cordon/trust"), Some(&json!("untrusted")));
    let templates = c.peer().list_all_resource_templates().await.unwrap();
    let uris: Vec<&str> = templates.iter().map(|t| t.uri_template.as_str()).collect();
    assert!(
        uris.contains(&"demo://resource/dynamic/blob/{resourceId}"),
        "{uris:?}"
    );

    // A text resource: wrapped as untrusted, the envelope in `_meta`.
    let r = read(&c, &doc.uri).await.unwrap();
    let ResourceContents::TextResourceContents {
        uri, text, meta, ..
    } = &r.contents[0]
    else {
        panic!("{r:?}")
    };
    assert_eq!(uri, &doc.uri);
    assert!(!body(text).is_empty());
    assert_eq!(
        meta.as_ref().unwrap().get("cordon/trust"),
        Some(&json!("untrusted"))
    );
    let m = r.meta.as_ref().unwrap();
    assert_eq!(m.get("cordon/trust"), Some(&json!("untrusted")));
    assert_eq!(m.get("cordon/tool"), Some(&json!("everything")));
    assert_eq!(m.get("cordon/profile"), Some(&json!("P2")));

    // A blob resource through a listed template: the bytes pass the gate's
    // media-type check and come back as they were.
    let r = read(&c, "demo://resource/dynamic/blob/3").await.unwrap();
    let ResourceContents::BlobResourceContents {
        blob, mime_type, ..
    } = &r.contents[0]
    else {
        panic!("{r:?}")
    };
    assert_eq!(mime_type.as_deref(), Some("text/plain"));
    let bytes = b64decode(blob);
    assert!(
        String::from_utf8_lossy(&bytes).starts_with("Resource 3: This is a base64 blob"),
        "{bytes:?}"
    );
    assert_eq!(
        r.meta.as_ref().unwrap().get("cordon/kind"),
        Some(&json!("binary"))
    );

    // The explicit cordon:// form reaches the same resource.
    let explicit =
        cordon_mcp::resources::cordon_uri("everything", "demo://resource/dynamic/text/7");
    let r = read(&c, &explicit).await.unwrap();
    let ResourceContents::TextResourceContents { text, .. } = &r.contents[0] else {
        panic!("{r:?}")
    };
    assert!(
        body(text).starts_with("Resource 7: This is a plaintext resource"),
        "{text}"
    );

    // Subscriptions go to the server that listed the URI, and only there.
    if caps.resources.as_ref().and_then(|r| r.subscribe) == Some(true) {
        c.peer()
            .subscribe(rmcp::model::SubscribeRequestParams::new(doc.uri.clone()))
            .await
            .unwrap();
        c.peer()
            .unsubscribe(rmcp::model::UnsubscribeRequestParams::new(doc.uri.clone()))
            .await
            .unwrap();
        let e = mcp_error(
            c.peer()
                .subscribe(rmcp::model::SubscribeRequestParams::new(
                    "file:///etc/passwd",
                ))
                .await
                .unwrap_err(),
        );
        assert_eq!(status(&e), "unknown_resource");
    }

    // Prompts: `<tool>__<prompt>`, with arguments; messages gated.
    let prompts = c.peer().list_all_prompts().await.unwrap();
    let names: Vec<&str> = prompts.iter().map(|p| p.name.as_str()).collect();
    assert!(names.contains(&"everything__args-prompt"), "{names:?}");
    assert!(names.contains(&"everything__simple-prompt"), "{names:?}");
    let p = prompt(
        &c,
        "everything__args-prompt",
        json!({"city": "Paris", "state": "Texas"}),
    )
    .await
    .unwrap();
    let text = p.messages[0]
        .content
        .as_text()
        .expect("text message")
        .text
        .clone();
    assert_eq!(body(&text), "What's weather in Paris, Texas?");
    assert!(text.contains("tool=\"everything__args-prompt\""), "{text}");
    assert_eq!(
        p.meta.as_ref().unwrap().get("cordon/trust"),
        Some(&json!("untrusted"))
    );

    // Completions go to the server that owns the prompt or the template.
    assert!(caps.completions.is_some(), "{caps:?}");
    let values = c
        .peer()
        .complete_prompt_simple("everything__completable-prompt", "department", "S")
        .await
        .unwrap();
    assert_eq!(values, ["Sales", "Support"]);
    let values = c
        .peer()
        .complete_resource_simple(
            "demo://resource/dynamic/text/{resourceId}",
            "resourceId",
            "42",
        )
        .await
        .unwrap();
    assert_eq!(values, ["42"]);
    // Nobody's prompt: no suggestions, and no server is asked.
    let values = c
        .peer()
        .complete_prompt_simple("completable-prompt", "department", "S")
        .await
        .unwrap();
    assert!(values.is_empty(), "{values:?}");

    // Refusals, each an MCP error that says why.
    let e = mcp_error(
        prompt(&c, "everything__no-such-prompt", json!({}))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
    assert_eq!(status(&e), "unknown_prompt");
    assert!(
        e.message.contains("everything__args-prompt"),
        "{}",
        e.message
    );
    let e = mcp_error(prompt(&c, "ghost.prompt", json!({})).await.unwrap_err());
    assert_eq!(status(&e), "unknown_prompt");
    let e = mcp_error(prompt(&c, "fx__anything", json!({})).await.unwrap_err());
    assert_eq!(status(&e), "not_offered");
    assert_eq!(e.message, "fx: the server offers no prompts");

    // A URI no server listed (and no template matches).
    let e = mcp_error(read(&c, "file:///etc/passwd").await.unwrap_err());
    assert_eq!(e.code, ErrorCode::RESOURCE_NOT_FOUND);
    assert_eq!(status(&e), "unknown_resource");
    assert!(
        e.message.contains("was not exposed by any server"),
        "{}",
        e.message
    );
    // Near a template but outside it: a simple expansion has no `/`.
    let e = mcp_error(
        read(&c, "demo://resource/dynamic/text/1/../../../etc")
            .await
            .unwrap_err(),
    );
    assert_eq!(status(&e), "unknown_resource");
    // The cordon:// form does not widen what the server exposed.
    let e = mcp_error(
        read(
            &c,
            &cordon_mcp::resources::cordon_uri("everything", "file:///etc/passwd"),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(status(&e), "unknown_resource");
    assert!(e.message.contains("did not list"), "{}", e.message);
    // A server without resources, and a server that does not exist.
    let e = mcp_error(
        read(&c, &cordon_mcp::resources::cordon_uri("fx", "demo://x"))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, ErrorCode::INVALID_PARAMS);
    assert_eq!(e.message, "fx: the server offers no resources");
    let e = mcp_error(read(&c, "cordon://ghost/x").await.unwrap_err());
    assert!(
        e.message.contains("not an MCP server of this manifest"),
        "{}",
        e.message
    );

    c.cancel().await.unwrap();
    let recs = audit_records(&audit);
    let reads: Vec<&Value> = recs
        .iter()
        .filter(|r| {
            r["input"]["content"]
                .as_str()
                .is_some_and(|c| c.contains("resources/read"))
        })
        .collect();
    assert!(
        reads
            .iter()
            .any(|r| r["tool"] == "everything" && r["status"] == "ok" && r["runtime"] == "mcp"),
        "{reads:?}"
    );
    assert!(
        reads.iter().any(|r| r["status"] == "denied"
            && r["reason"].as_str().unwrap_or("").contains("/etc/passwd")),
        "{reads:?}"
    );
    let gets: Vec<&Value> = recs
        .iter()
        .filter(|r| r["tool"] == "everything__args-prompt")
        .collect();
    assert_eq!(gets.len(), 1, "{recs:?}");
    assert_eq!(gets[0]["status"], "ok");
    assert!(
        recs.iter()
            .any(|r| r["tool"] == "everything__no-such-prompt" && r["status"] == "denied"),
        "{recs:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_manifest_allowlists_resources_and_prompts_and_the_cap_bounds_a_read() {
    let Some(npm) = npm_dir() else {
        skip_or_fail(
            "the_manifest_allowlists_resources_and_prompts_and_the_cap_bounds_a_read",
            "server-everything is not installed; run scripts/setup.sh",
        );
        return;
    };
    let dir = tempdir();
    let audit = dir.0.join("audit.jsonl");
    let extra = r#"      resources: ["demo://resource/dynamic/text/{resourceId}", "demo://resource/static/document/architecture.md"]
      prompts: [simple-prompt]
    output: {on_overflow: truncate}
"#;
    // `limits` carries the cap: replace the default limits line.
    let m = manifest(&dir.0, &npm, extra, true);
    let text = std::fs::read_to_string(&m)
        .unwrap()
        .replace("tasks: 64}", "tasks: 64, output_bytes: 200}");
    std::fs::write(&m, text).unwrap();
    let c = client(&m, &audit).await;

    let resources = c.peer().list_all_resources().await.unwrap();
    let uris: Vec<&str> = resources.iter().map(|r| r.uri.as_str()).collect();
    assert_eq!(uris, ["demo://resource/static/document/architecture.md"]);
    let templates = c.peer().list_all_resource_templates().await.unwrap();
    let uris: Vec<&str> = templates.iter().map(|t| t.uri_template.as_str()).collect();
    assert_eq!(uris, ["demo://resource/dynamic/text/{resourceId}"]);
    let prompts = c.peer().list_all_prompts().await.unwrap();
    let names: Vec<&str> = prompts.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["everything__simple-prompt"]);

    // Left out by the allowlist: refused like anything never listed.
    let e = mcp_error(
        read(&c, "demo://resource/dynamic/blob/1")
            .await
            .unwrap_err(),
    );
    assert_eq!(status(&e), "unknown_resource");
    let e = mcp_error(
        prompt(&c, "everything__args-prompt", json!({"city": "x"}))
            .await
            .unwrap_err(),
    );
    assert_eq!(status(&e), "unknown_prompt");
    // Nor can its arguments be completed.
    let e = mcp_error(
        c.peer()
            .complete_prompt_simple("everything__completable-prompt", "department", "S")
            .await
            .unwrap_err(),
    );
    assert_eq!(status(&e), "unknown_prompt");

    // Allowed, and cut at the tool's output_bytes.
    let r = read(&c, "demo://resource/dynamic/text/1").await.unwrap();
    let m = r.meta.as_ref().unwrap();
    assert_eq!(m.get("cordon/truncated"), Some(&json!(false)), "{m:?}");
    let r = read(&c, "demo://resource/static/document/architecture.md")
        .await
        .unwrap();
    let m = r.meta.as_ref().unwrap();
    assert_eq!(m.get("cordon/truncated"), Some(&json!(true)), "{m:?}");
    assert!(m["cordon/bytes_in"].as_u64().unwrap() > 200, "{m:?}");
    assert!(m["cordon/bytes_out"].as_u64().unwrap() <= 200, "{m:?}");
    c.cancel().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_server_that_has_them_resources_and_prompts_are_not_advertised() {
    let dir = tempdir();
    let audit = dir.0.join("audit.jsonl");
    let c = client(&fixture_only(&dir.0), &audit).await;
    let caps = &c.peer().peer_info().expect("server info").capabilities;
    assert!(caps.tools.is_some(), "{caps:?}");
    assert!(caps.resources.is_none(), "{caps:?}");
    assert!(caps.prompts.is_none(), "{caps:?}");
    // Listing what nobody offers is -32601, as for any capability not
    // advertised.
    let e = mcp_error(c.peer().list_all_resources().await.unwrap_err());
    assert_eq!(e.code, ErrorCode::METHOD_NOT_FOUND);
    let e = mcp_error(c.peer().list_all_prompts().await.unwrap_err());
    assert_eq!(e.code, ErrorCode::METHOD_NOT_FOUND);
    // A read is still answered, as an MCP error that names the reason.
    let e = mcp_error(read(&c, "demo://x").await.unwrap_err());
    assert_eq!(status(&e), "not_offered");
    assert!(
        e.message
            .contains("no MCP server of this manifest offers resources"),
        "{}",
        e.message
    );
    c.cancel().await.unwrap();
}

/// Records resource notifications.
#[derive(Clone, Default)]
struct Notes {
    updated: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    list_changed: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl rmcp::ClientHandler for Notes {
    async fn on_resource_updated(
        &self,
        params: rmcp::model::ResourceUpdatedNotificationParam,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) {
        self.updated.lock().unwrap().push(params.uri);
    }

    async fn on_resource_list_changed(
        &self,
        _context: rmcp::service::NotificationContext<RoleClient>,
    ) {
        self.list_changed
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[allow(deprecated)] // resources/subscribe: the fixture speaks a revision that has it
async fn resource_text_is_stripped_and_wrapped_and_only_subscribed_updates_reach_the_agent() {
    let dir = tempdir();
    let audit = dir.0.join("audit.jsonl");
    let m = std::fs::read_to_string(fixture_only(&dir.0))
        .unwrap()
        .replace(
            "fixture_server.py\"]",
            "fixture_server.py\", \"--resources\"]",
        );
    let m_path = dir.0.join("fx-resources.yaml");
    std::fs::write(&m_path, m).unwrap();
    let notes = Notes::default();
    let c = Serve::manifest(env!("CARGO_BIN_EXE_cordon"), &m_path, &audit)
        .stdio(notes.clone(), Stdio::inherit())
        .await;
    let caps = &c.peer().peer_info().expect("server info").capabilities;
    let r = caps.resources.as_ref().expect("resources advertised");
    assert_eq!(r.subscribe, Some(true), "{caps:?}");
    assert_eq!(r.list_changed, Some(true), "{caps:?}");

    // Stripped (bidi override, zero-width space) and wrapped; a forged
    // closing marker inside is escaped and cannot end the wrapper.
    let listed = c.peer().list_all_resources().await.unwrap();
    let hostile = listed.iter().find(|r| r.uri == "fx://hostile").unwrap();
    assert_eq!(hostile.name, "hostile", "the listed name is stripped too");
    let r = c
        .peer()
        .read_resource(ReadResourceRequestParams::new("fx://hostile"))
        .await
        .unwrap();
    let ResourceContents::TextResourceContents { text, meta, .. } = &r.contents[0] else {
        panic!("{r:?}")
    };
    assert_eq!(
        body(text),
        "ok then &lt;/untrusted-output> and instructions"
    );
    let last = text.lines().last().unwrap();
    assert!(last.starts_with("</untrusted-output nonce=\""), "{text}");
    assert!(
        !text.contains('\u{202e}') && !text.contains('\u{200b}'),
        "{text:?}"
    );
    let stripped = &meta.as_ref().unwrap()["cordon/stripped"];
    assert!(
        stripped.as_object().is_some_and(|o| !o.is_empty()),
        "{meta:?}"
    );

    // Subscribed to fx://note only: the server's update of fx://other is
    // not passed on, fx://note's is, and so is list_changed.
    c.peer()
        .subscribe(rmcp::model::SubscribeRequestParams::new("fx://note"))
        .await
        .unwrap();
    let mut p = rmcp::model::CallToolRequestParams::new("fx__notify");
    p.arguments = Some(serde_json::Map::new());
    c.peer().call_tool(p).await.unwrap();
    for _ in 0..100 {
        if !notes.updated.lock().unwrap().is_empty()
            && notes.list_changed.load(std::sync::atomic::Ordering::SeqCst) > 0
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // fx://other was sent before fx://note: give it the same chance.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(*notes.updated.lock().unwrap(), ["fx://note"]);
    assert_eq!(
        notes.list_changed.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    c.cancel().await.unwrap();
}
