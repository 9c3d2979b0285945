//! `cordon serve --http`'s live console, `GET /console`: behind the same
//! authentication as the MCP endpoint, and, in a real browser (headless
//! Chromium), a page that shows the served tool, a successful call and the
//! refusal of another, and none of their input.
//!
//! Chromium cannot send an `Authorization` header from the command line,
//! so the page is loaded from a gateway on loopback without `--auth` (the
//! gateway's own unauthenticated loopback mode: every caller is the
//! unauthenticated principal); the authentication of `/console` is tested
//! on a gateway with `--auth`, with plain HTTP requests.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{Serve, tempdir, text_of};
use cordon_mcp::rmcp;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

const MANIFEST: &str = common::WORD_COUNT;

/// What the successful call sends, and the refused one: neither may be on
/// the page.
const INPUT_MARK: &str = "console-input-mark-7f3a";
const REFUSED_VALUE: i64 = 424_242_017;

/// `GET path` on `addr` with `authorization`: status and head.
fn get_status(addr: &str, path: &str, authorization: Option<&str>) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(60)))
        .unwrap();
    let mut req = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    if let Some(a) = authorization {
        req.push_str(&format!("Authorization: {a}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    let resp = String::from_utf8_lossy(&resp).into_owned();
    let head = resp.split("\r\n\r\n").next().unwrap_or("").to_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head)
}

use common::http_client as client;

async fn call(
    c: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    tool: &str,
    args: Value,
) -> Result<String, rmcp::ServiceError> {
    let mut p = CallToolRequestParams::new(tool.to_owned());
    p.arguments = args.as_object().cloned();
    c.peer().call_tool(p).await.map(|r| text_of(&r))
}

/// Where test artifacts are kept: `test-artifacts` in the target directory
/// this test was built in.
fn artifacts() -> PathBuf {
    let bin = Path::new(env!("CARGO_BIN_EXE_cordon"));
    let target = bin
        .parent()
        .and_then(Path::parent)
        .expect("the target directory");
    let dir = target.join("test-artifacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Headless Chromium with `args` on `url`: its stdout. Every name but
/// loopback's resolves to nothing and no proxy is used, so nothing leaves
/// the machine.
fn chromium(profile: &Path, args: &[&str], url: &str) -> Option<String> {
    let bin = Path::new("/usr/bin/chromium");
    if !bin.exists() {
        common::skip_or_fail(&common::this_test(), "/usr/bin/chromium is not installed");
        return None;
    }
    let out = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--no-proxy-server",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--host-resolver-rules=MAP * ~NOTFOUND , EXCLUDE 127.0.0.1",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chromium {args:?} {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The `<tr class="CLASS">` rows of `dom`, each row's text with its tags
/// left in.
fn rows<'a>(dom: &'a str, class: &str) -> Vec<&'a str> {
    let open = format!("<tr class=\"{class}\"");
    dom.match_indices(&open)
        .map(|(i, _)| {
            let rest = &dom[i..];
            &rest[..rest.find("</tr>").unwrap_or(rest.len())]
        })
        .collect()
}

/// The text of the `<td class="CLASS">` cell of `row`.
fn cell<'a>(row: &'a str, class: &str) -> &'a str {
    let open = format!("<td class=\"{class}\">");
    let i = row
        .find(&open)
        .unwrap_or_else(|| panic!("{class} in {row}"))
        + open.len();
    let rest = &row[i..];
    &rest[..rest.find("</td>").unwrap_or(rest.len())]
}

/// `/console` is refused without a token or with a wrong one, as MCP
/// requests are, and served with one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_is_behind_the_gateways_authentication() {
    let dir = tempdir();
    let tokens = dir.path().join("tokens");
    let token = cordon_auth::static_tokens::add(&tokens, "ci", None, &[]).unwrap();
    let auth = dir.path().join("auth.yaml");
    std::fs::write(
        &auth,
        format!(
            "resource: http://127.0.0.1/mcp\nstatic_tokens: {}\n",
            tokens.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&auth, std::fs::Permissions::from_mode(0o600)).unwrap();
    let m = dir.path().join("cordon.yaml");
    std::fs::write(&m, MANIFEST).unwrap();
    let audit = dir.path().join("audit.jsonl");
    let s = Serve::manifest(env!("CARGO_BIN_EXE_cordon"), &m, &audit)
        .args(["--no-probe", "--auth"])
        .arg(&auth)
        .http();
    let addr = s.addr();
    let (st, head) = get_status(&addr, "/console", None);
    assert_eq!(st, 401, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("www-authenticate: bearer"),
        "{head}"
    );
    let (st, head) = get_status(&addr, "/console", Some("Bearer cordon_wrong"));
    assert_eq!(st, 401, "{head}");
    // The control: the same request with the token.
    let (st, head) = get_status(&addr, "/console", Some(&format!("Bearer {token}")));
    assert_eq!(st, 200, "{head}");
    let lower = head.to_ascii_lowercase();
    assert!(lower.contains("content-type: text/html"), "{head}");
    assert!(
        lower.contains("content-security-policy: default-src 'none'"),
        "{head}"
    );
}

/// In headless Chromium, after one successful call and one refused by the
/// input schema: the tool with its profile, runtime, state and proof; the
/// refusal with its tool, kind and reason; the call plot; and neither
/// call's input. A screenshot is kept in target/test-artifacts/.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_browser_shows_tools_and_refusals() {
    let dir = tempdir();
    let m = dir.path().join("cordon.yaml");
    std::fs::write(&m, MANIFEST).unwrap();
    let audit = dir.path().join("audit.jsonl");
    let s = Serve::manifest(env!("CARGO_BIN_EXE_cordon"), &m, &audit).http();
    let addr = s.addr();
    let url = format!("http://{addr}/console");

    let c = client(&s.url, None).await;
    let out = call(
        &c,
        "word_count",
        json!({"text": format!("{INPUT_MARK} b\n")}),
    )
    .await
    .unwrap();
    assert!(out.contains('2'), "{out}");
    let e = call(&c, "word_count", json!({"text": REFUSED_VALUE}))
        .await
        .unwrap_err();
    assert!(format!("{e:?}").contains("invalid_arguments"), "{e:?}");

    let profile = dir.path().join("chromium");
    let Some(dom) = chromium(&profile, &["--dump-dom"], &url) else {
        return;
    };
    // The tool, as served and proved at start.
    let tools = rows(&dom, "tool");
    assert_eq!(tools.len(), 1, "{dom}");
    let t = tools[0];
    assert!(t.contains("data-tool=\"word_count\""), "{t}");
    assert!(t.contains("<td>P1</td><td>native</td>"), "{t}");
    assert_eq!(
        cell(t, "state"),
        "<span class=\"in\">in service</span>",
        "{t}"
    );
    let proof = cell(t, "proof");
    assert!(
        proof.starts_with("held at ") || proof.starts_with("cached at "),
        "{proof}"
    );
    // The refusal: exactly one, the schema's, with where and which keyword.
    let refusals = rows(&dom, "refusal");
    assert_eq!(refusals.len(), 1, "{dom}");
    let r = refusals[0];
    assert_eq!(cell(r, "tool"), "word_count", "{r}");
    assert_eq!(cell(r, "kind"), "denied", "{r}");
    assert_eq!(
        cell(r, "why"),
        "word_count: arguments refused by input_schema at /text (keyword `type`)",
        "{r}"
    );
    // Both calls counted in the last minute's bar (or the one before, at a
    // minute's turn).
    assert!(
        dom.contains("<span id=\"calls-last-hour\">2</span>"),
        "{dom}"
    );
    assert_eq!(dom.matches("<rect class=\"bar\"").count(), 60, "{dom}");
    assert!(dom.contains("<span id=\"sessions\">1</span>"), "{dom}");
    assert!(dom.contains("<span id=\"sandboxes\">0</span>"), "{dom}");
    // No input of either call.
    assert!(!dom.contains(INPUT_MARK), "{dom}");
    assert!(!dom.contains(&REFUSED_VALUE.to_string()), "{dom}");
    // The audit log has the refused value (the console left it out).
    let log = std::fs::read_to_string(&audit).unwrap();
    assert!(log.contains(&REFUSED_VALUE.to_string()), "{log}");

    let shot = artifacts().join("console.png");
    let _ = std::fs::remove_file(&shot);
    let screenshot = format!("--screenshot={}", shot.display());
    if chromium(&profile, &[&screenshot, "--window-size=1200,900"], &url).is_none() {
        return;
    }
    let png = std::fs::read(&shot).unwrap();
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "{}", shot.display());
    eprintln!("console screenshot: {}", shot.display());
    c.cancel().await.unwrap();
}
