//! A server's requests to the client (`sampling/createMessage`,
//! `elicitation/create`): forwarded only when the manifest allows them for
//! that server, their text gated, the answer passed back; refused ones get
//! -32601; each audited.
#![allow(deprecated)]

mod common;
use common::*;

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use cordon_mcp::rmcp;
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, CreateMessageRequestParams, CreateMessageResult,
    ElicitRequestParams, ElicitResult, ElicitationAction, Implementation, InitializeRequestParams,
    JsonObject, SamplingMessage,
};
use rmcp::service::{RequestContext, RoleClient, RunningService};
use rmcp::{ClientHandler, ErrorData};
use serde_json::{Value, json};

/// A client with a model and a user: records what it was asked.
#[derive(Clone, Default)]
struct Asked(Arc<Mutex<Vec<Value>>>);

impl ClientHandler for Asked {
    #[allow(deprecated)]
    async fn create_message(
        &self,
        params: CreateMessageRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<CreateMessageResult, ErrorData> {
        self.0
            .lock()
            .unwrap()
            .push(serde_json::to_value(&params).unwrap());
        Ok(CreateMessageResult::new(
            SamplingMessage::assistant_text("sampled by the client"),
            "test-model".into(),
        ))
    }

    async fn create_elicitation(
        &self,
        request: ElicitRequestParams,
        _context: RequestContext<RoleClient>,
    ) -> Result<ElicitResult, ErrorData> {
        self.0
            .lock()
            .unwrap()
            .push(serde_json::to_value(&request).unwrap());
        Ok(ElicitResult::new(ElicitationAction::Accept).with_content(json!({"name": "Ada"})))
    }

    fn get_info(&self) -> InitializeRequestParams {
        let mut caps = ClientCapabilities::default();
        caps.sampling = Some(Default::default());
        caps.elicitation = Some(Default::default());
        InitializeRequestParams::new(caps, Implementation::new("asks-test", "1"))
    }
}

fn manifest(dir: &Path) -> std::path::PathBuf {
    let server = |name: &str, allow: &str| {
        format!(
            r#"  {name}:
    profile: P2
    network: none
    limits: {{wall_seconds: 10, memory: 256M, tasks: 16}}
    mounts: ["{fixtures}:/srv/fixtures"]
    mcp:
      command: ["/usr/bin/python3", "/srv/fixtures/fixture_server.py", "--asks"]
{allow}"#,
            fixtures = fixtures().display()
        )
    };
    let m = format!(
        "version: 1\ntools:\n{}{}",
        server(
            "open",
            "      allow_sampling: true\n      allow_elicitation: true\n"
        ),
        server("closed", ""),
    );
    let p = dir.join("cordon.yaml");
    std::fs::write(&p, m).unwrap();
    p
}

async fn ask(c: &RunningService<RoleClient, Asked>, tool: &str) -> Value {
    let mut p = CallToolRequestParams::new(tool.to_owned());
    p.arguments = Some(JsonObject::new());
    let r = c.peer().call_tool(p).await.unwrap();
    let t = text_of(&r);
    // The body of the wrapped result is the server's JSON.
    let body: Vec<&str> = t.lines().collect();
    serde_json::from_str(&body[1..body.len() - 1].join("\n")).unwrap_or_else(|e| panic!("{e}: {t}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_and_elicitation_reach_the_client_only_when_allowed() {
    let dir = tempdir();
    let m = manifest(dir.path());
    let audit = dir.path().join("audit.jsonl");
    let asked = Asked::default();
    let c = Serve::manifest(env!("CARGO_BIN_EXE_cordon"), &m, &audit)
        .stdio(asked.clone(), Stdio::inherit())
        .await;

    // Allowed: both reach the client, gated and labelled; the answers go back.
    let r = ask(&c, "open__ask").await;
    assert_eq!(r["sampling"]["model"], "test-model", "{r}");
    assert_eq!(
        r["sampling"]["content"]["text"], "sampled by the client",
        "{r}"
    );
    assert_eq!(r["elicitation"]["action"], "accept", "{r}");
    assert_eq!(r["elicitation"]["content"]["name"], "Ada", "{r}");
    let seen = asked.0.lock().unwrap().clone();
    assert_eq!(seen.len(), 2, "{seen:#?}");
    assert_eq!(
        seen[0]["messages"][0]["content"]["text"], "hello model",
        "zero-width stripped: {seen:#?}"
    );
    assert_eq!(seen[1]["message"], "your name?", "bidi stripped: {seen:#?}");

    // Not allowed: the server gets -32601 for each, the client is not asked.
    let r = ask(&c, "closed__ask").await;
    for (what, key) in [
        ("sampling", "allow_sampling"),
        ("elicitation", "allow_elicitation"),
    ] {
        let e = &r[what]["error"];
        assert_eq!(e["code"], -32601, "{r}");
        let msg = e["message"].as_str().unwrap_or("");
        assert!(
            msg.contains("server `closed`") && msg.contains(key),
            "{what}: {msg}"
        );
    }
    assert_eq!(
        asked.0.lock().unwrap().len(),
        2,
        "the client was not asked again"
    );
    c.cancel().await.unwrap();

    // Each request is audited: two forwarded, two denied.
    let recs = audit_records(&audit);
    let asks: Vec<&Value> = recs
        .iter()
        .filter(|r| {
            r["caller"] == "mcp-server"
                && r["runtime"] == "mcp"
                && r["egress"].as_array().is_none_or(|e| e.is_empty())
        })
        .collect();
    let count = |tool: &str, status: &str| {
        asks.iter()
            .filter(|r| r["tool"] == tool && r["status"] == status)
            .count()
    };
    assert_eq!(count("open", "ok"), 2, "{asks:#?}");
    assert_eq!(count("closed", "denied"), 2, "{asks:#?}");
}
