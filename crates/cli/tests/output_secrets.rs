//! The output gate's secret scans through the CLI: a tool whose output
//! carries the live token minted for its session (as it is, base64,
//! JSON-escaped; on stdout and stderr) gets the session's placeholder in
//! its result and a flag in its audit record, for a command tool (`cordon
//! run`) and an `mcp:` server (`cordon serve`); a tool with `output:
//! {block_secrets: true}` has well-known secret formats redacted, one
//! without it does not. The `exec` provider is tests/fixtures/mint.py of
//! cordon-secrets, which records every token it mints. Fake secrets are
//! built at run time (in the tool's shell), so that the repository holds
//! no string that looks like a real one.

mod common;
use common::*;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use base64::Engine as _;
use cordon_mcp::rmcp;
use cordon_testkit::is_root;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

const CORDON: &str = env!("CARGO_BIN_EXE_cordon");

fn secrets_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../secrets/tests/fixtures")
        .join(name)
        .canonicalize()
        .unwrap()
}

/// A provider file whose default is the exec fixture recording into `dir`.
fn exec_providers(dir: &Path) -> PathBuf {
    let p = dir.join("providers.yaml");
    std::fs::write(
        &p,
        format!(
            "default: mint\nproviders:\n  mint:\n    type: exec\n    command: [\"{m}\", \"{d}\"]\n    revoke: [\"{r}\", \"{d}\"]\n",
            m = secrets_fixture("mint.py").display(),
            r = secrets_fixture("revoke.py").display(),
            d = dir.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn records(p: &Path) -> Vec<Value> {
    lines(p)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `cordon run TOOL` of manifest `m`: (exit ok, stdout, stderr).
fn run(dir: &Path, m: &Path, tool: &str) -> (bool, String, String) {
    let out = Command::new(CORDON)
        .args(["run", tool, "--providers"])
        .arg(exec_providers(dir))
        .arg("-m")
        .arg(m)
        .arg("--audit")
        .arg(dir.join("audit.jsonl"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The placeholder on the line of stdout that starts with `prefix`.
fn after<'a>(stdout: &'a str, prefix: &str) -> &'a str {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no line {prefix}: {stdout}"))
}

fn is_placeholder(s: &str) -> bool {
    s.strip_prefix("cordon-ph-")
        .is_some_and(|h| h.len() == 32 && h.chars().all(|c| c.is_ascii_hexdigit()))
}

fn unescape_json(s: &str) -> String {
    serde_json::from_str::<String>(&format!("\"{s}\"")).unwrap()
}

#[test]
fn a_command_tool_that_prints_its_token_gets_the_placeholder_and_a_flagged_record() {
    if !is_root() {
        skip_or_fail(&this_test(), "needs root to build the sandbox");
        return;
    }
    let dir = tempdir();
    // The token as it is, in base64, every character JSON-escaped, on
    // stderr; and a value of the token's shape that is not the live token
    // (the control: passed unchanged).
    let script = r#"printf 'raw:%s\n' "$API_TOKEN"; printf 'b64:%s\n' "$(printf %s "$API_TOKEN" | base64 -w0)"; printf 'json:%s\n' "$(printf %s "$API_TOKEN" | od -An -v -tx1 | tr -s ' \n' '  ' | sed 's/ \([0-9a-f][0-9a-f]\)/\\u00\1/g; s/ //g')"; printf 'other:tok-%s\n' 0123456789abcdef0123456789abcdef; printf 'err:%s\n' "$API_TOKEN" >&2"#;
    let m = dir.path().join("m.yaml");
    std::fs::write(
        &m,
        format!(
            "tools:\n  t:\n    profile: P2\n    command: [/bin/sh, -c, {}]\n    network: none\n    limits: {{wall_seconds: 20}}\n    secrets: [{{name: API_TOKEN, scope: s, ttl: 300, deliver: env}}]\n",
            serde_json::to_string(script).unwrap()
        ),
    )
    .unwrap();
    let (ok, stdout, stderr) = run(dir.path(), &m, "t");
    assert!(ok, "{stderr}");
    let token = lines(&dir.path().join("minted"))
        .first()
        .cloned()
        .expect("a token was minted");
    let b64 = base64::engine::general_purpose::STANDARD.encode(&token);
    assert!(!stdout.contains(&token), "{stdout}");
    assert!(!stdout.contains(&b64[2..b64.len() - 2]), "{stdout}");
    assert!(!stderr.contains(&token), "{stderr}");
    // The same placeholder in each form.
    let ph = after(&stdout, "raw:");
    assert!(is_placeholder(ph), "{stdout}");
    // Token and placeholder lengths agree modulo 3: the replaced base64
    // decodes to the placeholder.
    assert_eq!(token.len() % 3, ph.len() % 3);
    let dec = base64::engine::general_purpose::STANDARD
        .decode(after(&stdout, "b64:"))
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&dec), ph, "{stdout}");
    let json = after(&stdout, "json:");
    assert!(json.starts_with("\\u00"), "{stdout}");
    assert_eq!(unescape_json(json), ph);
    // The control: unchanged.
    assert_eq!(
        after(&stdout, "other:"),
        "tok-0123456789abcdef0123456789abcdef"
    );
    // The call's record: flagged, and no token in it (its stderr neither).
    let audit = dir.path().join("audit.jsonl");
    let recs = records(&audit);
    let call = recs
        .iter()
        .find(|r| r["credential"].is_null())
        .unwrap_or_else(|| panic!("no call record: {recs:#?}"));
    assert_eq!(
        call["gate"]["tokens_replaced"],
        json!(["API_TOKEN"]),
        "{call:#}"
    );
    let warnings: Vec<&str> = call["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(
        warnings.contains(
            &"the live token of secret API_TOKEN was in the output: replaced by its placeholder"
        ),
        "{warnings:?}"
    );
    assert!(
        warnings.contains(
            &"the live token of secret API_TOKEN was in the tool's stderr: replaced by its placeholder"
        ),
        "{warnings:?}"
    );
    assert!(
        call["stderr"]
            .as_str()
            .unwrap_or("")
            .contains("err:cordon-ph-"),
        "{call:#}"
    );
    let all = std::fs::read_to_string(&audit).unwrap();
    assert!(!all.contains(&token), "the audit log holds the token");
}

#[test]
fn secret_formats_are_redacted_for_a_tool_that_enables_it() {
    if !is_root() {
        skip_or_fail(&this_test(), "needs root to build the sandbox");
        return;
    }
    let dir = tempdir();
    // An AWS access key id and a GitHub token, assembled by the shell; a
    // near miss of each (one character short).
    let script = r#"a=AK; b=IA; g=gh; printf 'key:%s%sZ3QXJ7M2LPW4N5R6\n' $a $b; printf 'gh:%sp_%s\n' $g aB3dE5fG7hJ9kL2mN4pQ6rS8tV1wX3yZ5bC7; printf 'near:%s%sZ3QXJ7M2LPW4N5R\n' $a $b; printf 'near-gh:%sp_%s\n' $g aB3dE5fG7hJ9kL2mN4pQ6rS8tV1wX3yZ5bC"#;
    let m = dir.path().join("m.yaml");
    let tool = |name: &str, block: bool| {
        format!(
            "  {name}:\n    profile: P1\n    command: [/bin/sh, -c, {}]\n    output: {{block_secrets: {block}}}\n",
            serde_json::to_string(script).unwrap()
        )
    };
    std::fs::write(
        &m,
        format!("tools:\n{}{}", tool("on", true), tool("off", false)),
    )
    .unwrap();
    let (ok, stdout, stderr) = run(dir.path(), &m, "on");
    assert!(ok, "{stderr}");
    assert_eq!(after(&stdout, "key:"), "[REDACTED:aws-access-key-id]");
    assert_eq!(after(&stdout, "gh:"), "[REDACTED:github-token]");
    assert_eq!(
        after(&stdout, "near:"),
        ["AK", "IA", "Z3QXJ7M2LPW4N5R"].concat()
    );
    assert!(
        after(&stdout, "near-gh:").starts_with("ghp_aB3"),
        "{stdout}"
    );
    // Positive control: the same output of a tool without it, unchanged.
    let (ok, plain, stderr) = run(dir.path(), &m, "off");
    assert!(ok, "{stderr}");
    assert_eq!(
        after(&plain, "key:"),
        ["AK", "IA", "Z3QXJ7M2LPW4N5R6"].concat()
    );
    assert!(after(&plain, "gh:").starts_with("ghp_aB3"), "{plain}");
    let recs = records(&dir.path().join("audit.jsonl"));
    let of = |tool: &str| {
        recs.iter()
            .find(|r| r["tool"] == tool)
            .unwrap_or_else(|| panic!("no record of {tool}: {recs:#?}"))
            .clone()
    };
    assert_eq!(
        of("on")["gate"]["secrets_redacted"],
        json!({"aws-access-key-id": 1, "github-token": 1})
    );
    assert!(of("off")["gate"].get("secrets_redacted").is_none());
    // `cordon explain` shows the setting.
    let out = Command::new(CORDON)
        .args(["explain", "on", "--json", "-m"])
        .arg(&m)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["output"]["block_secrets"], true, "{v:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_server_that_echoes_its_token_gets_the_placeholder_and_a_flagged_record() {
    if !is_root() {
        skip_or_fail(&this_test(), "needs root to build the sandbox");
        return;
    }
    let dir = tempdir();
    let providers = exec_providers(dir.path());
    let m = dir.path().join("m.yaml");
    std::fs::write(
        &m,
        format!(
            "tools:\n  fx:\n    profile: P2\n    network: none\n    lifetime: session\n    limits: {{wall_seconds: 5}}\n    mounts: [\"{}:/fx-secrets\"]\n    secrets: [{{name: FX_TOKEN, scope: \"read:fx\", ttl: 300, deliver: env}}]\n    mcp:\n      command: [\"/usr/bin/python3\", \"/fx-secrets/fixture_server.py\"]\n      tools: {{allow: [echo, probe]}}\n",
            fixtures().display()
        ),
    )
    .unwrap();
    let audit = dir.path().join("audit.jsonl");
    let served = Serve::new(CORDON)
        .args(["--no-probe", "--providers"])
        .arg(&providers)
        .arg("-m")
        .arg(&m)
        .arg("--audit")
        .arg(&audit)
        .http();
    let client = ().serve(cordon_mcp::http_client(&served.url)).await.unwrap();
    let call = |text: Option<String>| {
        let mut p = CallToolRequestParams::new(if text.is_some() {
            "fx__echo"
        } else {
            "fx__probe"
        });
        p.arguments = match &text {
            Some(t) => json!({"text": t}),
            None => json!({}),
        }
        .as_object()
        .cloned();
        p
    };
    // The first call starts the server, which mints its token.
    let r = client.peer().call_tool(call(None)).await.unwrap();
    assert_eq!(r.is_error, Some(false), "{r:?}");
    let token = lines(&dir.path().join("minted"))
        .first()
        .cloned()
        .expect("a token was minted");
    // Positive control: text without the token comes back as sent.
    let r = client
        .peer()
        .call_tool(call(Some("nothing secret here".into())))
        .await
        .unwrap();
    assert!(text_of(&r).contains("nothing secret here"), "{r:?}");
    assert!(
        r.meta
            .as_ref()
            .and_then(|m| m.get("cordon/tokens_replaced"))
            .is_none(),
        "{r:?}"
    );
    // The token and its base64, echoed back.
    let b64 = base64::engine::general_purpose::STANDARD.encode(&token);
    let r = client
        .peer()
        .call_tool(call(Some(format!("a {token} b {b64} c"))))
        .await
        .unwrap();
    let text = text_of(&r);
    assert!(!text.contains(&token), "{text}");
    assert!(!text.contains(&b64[2..b64.len() - 2]), "{text}");
    assert!(text.contains("a cordon-ph-"), "{text}");
    assert_eq!(
        r.meta
            .as_ref()
            .and_then(|m| m.get("cordon/tokens_replaced")),
        Some(&json!(["FX_TOKEN"])),
        "{r:?}"
    );
    drop(client);
    drop(served);
    let recs = records(&audit);
    let flagged: Vec<&Value> = recs
        .iter()
        .filter(|r| r["gate"]["tokens_replaced"] == json!(["FX_TOKEN"]))
        .collect();
    assert_eq!(flagged.len(), 1, "{recs:#?}");
    assert_eq!(flagged[0]["tool"], "fx__echo");
    assert!(
        flagged[0]["warnings"].as_array().unwrap().iter().any(|w| w
            .as_str()
            .is_some_and(|w| w.contains("live token of secret FX_TOKEN"))),
        "{:#}",
        flagged[0]
    );
    let all = std::fs::read_to_string(&audit).unwrap();
    assert!(!all.contains(&token), "the audit log holds the token");
}
