//! A browser MCP server per conversation under gVisor: the official Python
//! MCP SDK client drives whole conversations with @playwright/mcp and
//! Debian's Chromium (`examples/playwright-mcp.yaml`) through
//! `cordon serve --http` (tests/e2e/browser_conversation.py): navigate,
//! snapshot, click, type; a cookie of one conversation absent from the next;
//! the metadata address, private addresses, a closed port and a loopback
//! name refused at the proxy door and audited (the allowed page and its
//! image the positive control); the conversation's sandbox gone after its
//! client's `DELETE` and after its client is killed. Root only (P3 cgroup
//! limits, a port 80 stand-in on loopback); nothing leaves the machine.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

/// The loopback address the test's pages are served on, in place of the
/// example's 127.0.0.80 (scripts/demo.sh's and the browse test's), so the
/// test never meets another stand-in on port 80.
const UPSTREAM: &str = "127.0.0.86";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// What the test needs that scripts/setup.sh installs, or why it is missing.
fn missing() -> Option<String> {
    if !cordon_testkit::is_root() {
        return Some("needs root (P3 cgroup limits, a port 80 stand-in)".into());
    }
    let doctor = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["doctor", "--json"])
        .output()
        .expect("cordon doctor");
    let v: serde_json::Value = serde_json::from_slice(&doctor.stdout).expect("doctor --json");
    let runsc = v["checks"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "gvisor (runsc)"))
        .cloned()
        .unwrap_or_default();
    if runsc["ok"] != true {
        return Some(format!("gvisor: {}", runsc["detail"]));
    }
    if !Path::new("/usr/lib/chromium/chromium").exists() {
        return Some("chromium is not installed (scripts/setup.sh)".into());
    }
    if !pw_dir()
        .join("node_modules/@playwright/mcp/cli.js")
        .is_file()
    {
        return Some(format!(
            "@playwright/mcp is not installed under {} (scripts/setup.sh)",
            pw_dir().display()
        ));
    }
    match Command::new("python3").args(["-c", "import mcp"]).output() {
        Ok(o) if o.status.success() => None,
        _ => Some("python3 with the `mcp` package (scripts/setup.sh)".into()),
    }
}

/// Where scripts/setup.sh installs @playwright/mcp (`$CORDON_E2E_CACHE`
/// overrides the cache).
fn pw_dir() -> PathBuf {
    std::env::var_os("CORDON_E2E_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/cordon-e2e"))
        .join("playwright-mcp")
}

#[test]
fn a_browser_conversation_through_cordon_under_gvisor() {
    if let Some(why) = missing() {
        skip_or_fail(&this_test(), &why);
        return;
    }
    let dir = cordon_testkit::scratch::named("cordon-browser-");
    // The example itself, with only the stand-in's address and (when the
    // cache is elsewhere) the package's directory changed.
    let example = std::fs::read_to_string(repo().join("examples/playwright-mcp.yaml")).unwrap();
    assert!(example.contains("news.example: 127.0.0.80"), "{example}");
    let manifest = dir.join("playwright-mcp.yaml");
    std::fs::write(
        &manifest,
        example.replace("127.0.0.80", UPSTREAM).replace(
            "/var/cache/cordon-e2e/playwright-mcp:",
            &format!("{}:", pw_dir().display()),
        ),
    )
    .unwrap();
    // `cordon check` admits it on this host; `cordon explain` prints the
    // policy it runs under.
    let cordon = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_cordon"))
            .args(args)
            .arg("-m")
            .arg(&manifest)
            .env_remove("CORDON_MANIFEST")
            .output()
            .expect("run cordon");
        let out = String::from_utf8_lossy(&o.stdout).into_owned();
        assert!(
            o.status.success(),
            "{args:?}: {out}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        out
    };
    let checked = cordon(&["check"]);
    assert!(
        checked.contains("1 tool valid") && checked.contains("every tool would start on this host"),
        "{checked}"
    );
    let policy: serde_json::Value =
        serde_json::from_str(&cordon(&["explain", "browser", "--json"])).expect("explain --json");
    assert_eq!(policy["profile"], "P3", "{policy}");
    assert_eq!(policy["runtime"], "gvisor", "{policy}");
    assert_eq!(policy["lifetime"], "session", "{policy}");
    assert_eq!(policy["network"]["mode"], "proxy", "{policy}");
    assert_eq!(policy["exec"]["mcp"]["expose"], "as-is", "{policy}");
    assert_eq!(policy["secrets"], serde_json::json!([]), "{policy}");
    let out = Command::new("python3")
        .arg(repo().join("tests/e2e/browser_conversation.py"))
        .args(["--cordon", env!("CARGO_BIN_EXE_cordon")])
        .arg("--manifest")
        .arg(&manifest)
        .arg("--work")
        .arg(dir.join("work"))
        .args(["--upstream", UPSTREAM])
        .env_remove("CORDON_MANIFEST")
        .output()
        .expect("run the Python client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}");
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every part ran (not a silent skip), each with its checks.
    for part in [
        "PASS conversation 1: browser_click follows the link",
        "PASS conversation 1: the typed text reached the upstream",
        "PASS conversation 1: the cookie set earlier in this conversation is sent (positive control)",
        "PASS conversation 1: its allowed image loads (positive control)",
        "PASS conversation 1: 169.254.169.254:80 refused at the proxy and audited",
        "PASS conversation 1: 10.1.2.3:80 refused at the proxy and audited",
        "PASS conversation 1: news.example:8080 refused at the proxy and audited",
        "PASS conversation 1: after DELETE the session's sandbox is gone",
        "PASS conversation 2: the first conversation's cookie is absent",
        "PASS conversation 2: after DELETE its sandbox is gone",
        "PASS conversation 3 (client killed): its sandbox runs (positive control)",
        "PASS conversation 3 (client killed): its sandbox is gone once cordon notices",
        "OK: 0 failed",
    ] {
        assert!(stdout.contains(part), "{part}: {stdout}");
    }
}
