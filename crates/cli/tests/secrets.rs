//! The credential broker through the CLI: `cordon check` refusals at the
//! line, the provider file's permissions, `deliver: env` and `deliver:
//! proxy` in a real sandbox (the token in that one variable and nowhere
//! else: not in any other process's environment, cordon's output, the
//! audit log or any file), and a `cordon serve` session's tokens minted
//! for its real session id and revoked on SIGTERM. The `exec` provider is
//! tests/fixtures/mint.py of cordon-secrets, which records every token it
//! mints so that the test can look for it.

mod common;
use common::*;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cordon_mcp::rmcp;
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use serde_json::json;

const CORDON: &str = env!("CARGO_BIN_EXE_cordon");

fn secrets_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../secrets/tests/fixtures")
        .join(name)
        .canonicalize()
        .unwrap()
}

fn private(path: &Path, text: &str) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// A provider file whose default is the exec fixture recording into `dir`.
fn exec_providers(dir: &Path) -> PathBuf {
    let p = dir.join("providers.yaml");
    private(
        &p,
        &format!(
            "default: mint\nproviders:\n  mint:\n    type: exec\n    command: [\"{m}\", \"{d}\"]\n    revoke: [\"{r}\", \"{d}\"]\n  dev:\n    type: static\n    env: HOME\n",
            m = secrets_fixture("mint.py").display(),
            r = secrets_fixture("revoke.py").display(),
            d = dir.display()
        ),
    );
    p
}

fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

use cordon_testkit::is_root;

#[test]
fn check_refuses_an_unknown_provider_at_its_line_and_flags_weak_secrets() {
    let dir = tempdir();
    let providers = exec_providers(dir.path());
    let m = dir.path().join("m.yaml");
    std::fs::write(
        &m,
        "tools:\n  a:\n    profile: P2\n    command: [/bin/true]\n    egress: [\"api.example:443\"]\n    secrets:\n      - {name: A, scope: r, ttl: 60}\n      - {name: B, scope: r, ttl: 60, provider: vault}\n",
    )
    .unwrap();
    let out = Command::new(CORDON)
        .args(["check", "--no-host", "--providers"])
        .arg(&providers)
        .arg("-m")
        .arg(&m)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("{}:8:", m.display()))
            && err.contains("provider `vault` is not defined"),
        "{err}"
    );
    // Positive control: a known provider passes; the static one and
    // `deliver: env` are flagged as weak.
    std::fs::write(
        &m,
        "tools:\n  a:\n    profile: P2\n    command: [/bin/true]\n    egress: [\"api.example:443\"]\n    secrets:\n      - {name: A, scope: r, ttl: 60}\n      - {name: B, scope: r, ttl: 60, provider: dev, deliver: env}\n",
    )
    .unwrap();
    let out = Command::new(CORDON)
        .args(["check", "--no-host", "--providers"])
        .arg(&providers)
        .arg("-m")
        .arg(&m)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("static provider `dev`"), "{err}");
    assert!(err.contains("delivered in the environment"), "{err}");
    // explain shows provider, scope, ttl, delivery and binding.
    let out = Command::new(CORDON)
        .args(["explain", "a", "--json", "--providers"])
        .arg(&providers)
        .arg("-m")
        .arg(&m)
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        v["secrets"][0],
        json!({"name": "A", "scope": "r", "ttl_seconds": 60, "provider": "mint", "deliver": "proxy",
               "bind": {"host": "api.example", "port": 443,
                        "placement": {"header": {"name": "Authorization", "template": "Bearer {token}"}}}})
    );
    assert_eq!(v["secrets"][1]["deliver"], "env");
}

/// Without a provider file `serve` refuses every tool that declares
/// secrets, so `check` does too: at each secret's line, with the stanza
/// to write; `--no-host` (the manifest alone) only warns. A tool without
/// secrets beside it passes (positive control).
#[test]
fn check_refuses_secrets_without_a_provider_file_at_their_line() {
    let dir = tempdir();
    let m = dir.path().join("m.yaml");
    std::fs::write(
        &m,
        "tools:\n  plain:\n    profile: P1\n    command: [/bin/true]\n  a:\n    profile: P2\n    command: [/bin/true]\n    network: none\n    secrets:\n      - {name: A, scope: repo, ttl: 60, deliver: env}\n      - {name: B, scope: r, ttl: 60, provider: vault, deliver: env}\n",
    )
    .unwrap();
    let check = |args: &[&str]| {
        Command::new(CORDON)
            .args(args)
            .arg("-m")
            .arg(&m)
            .env_remove("CORDON_PROVIDERS")
            .output()
            .unwrap()
    };
    if std::path::Path::new(cordon_secrets::config::DEFAULT_PATH).exists() {
        panic!(
            "{} exists on this host: this test needs no provider file",
            cordon_secrets::config::DEFAULT_PATH
        );
    }
    let out = check(&["check"]);
    let err = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{err}");
    assert!(
        stdout.contains("1 would not start on this host"),
        "{stdout}{err}"
    );
    let md = m.display();
    assert!(
        err.contains(&format!(
            "{md}:10:9: tool `a`: would not start here: secret `A` needs a credential broker, and there is no provider file"
        )),
        "{err}"
    );
    assert!(
        err.contains("defining the provider `mint` as its `default`")
            && err.contains("default: mint\n    providers:\n      mint:\n        type: exec"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "{md}:11:9: tool `a`: would not start here: secret `B`"
        )) && err.contains("providers:\n      vault:\n"),
        "{err}"
    );
    assert!(!err.contains("tool `plain`"), "{err}");
    // The manifest alone: valid, with the warning.
    let out = check(&["check", "--no-host"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("warning: no provider file"), "{err}");
    // Positive control: with a provider file, it would start.
    let providers = exec_providers(dir.path());
    std::fs::write(
        &m,
        "tools:\n  plain:\n    profile: P1\n    command: [/bin/true]\n  a:\n    profile: P2\n    command: [/bin/true]\n    network: none\n    secrets:\n      - {name: A, scope: repo, ttl: 60, deliver: env}\n",
    )
    .unwrap();
    let out = Command::new(CORDON)
        .args(["check", "--providers"])
        .arg(&providers)
        .arg("-m")
        .arg(&m)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("every tool would start on this host"),
        "{err}"
    );
}

#[test]
fn a_provider_file_others_can_read_is_refused() {
    let dir = tempdir();
    let providers = exec_providers(dir.path());
    let m = dir.path().join("m.yaml");
    std::fs::write(
        &m,
        "tools:\n  a:\n    profile: P2\n    command: [/bin/true]\n    network: none\n    secrets: [{name: A, scope: r, ttl: 60, deliver: env}]\n",
    )
    .unwrap();
    std::fs::set_permissions(&providers, std::fs::Permissions::from_mode(0o644)).unwrap();
    for args in [&["check", "--no-host"][..], &["run", "a"][..]] {
        let out = Command::new(CORDON)
            .args(args)
            .arg("--providers")
            .arg(&providers)
            .arg("-m")
            .arg(&m)
            .env("CORDON_AUDIT", dir.path().join("audit.jsonl"))
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_ne!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(
            err.contains(&providers.display().to_string()) && err.contains("mode 0644"),
            "{args:?}: {err}"
        );
    }
    assert!(lines(&dir.path().join("minted")).is_empty());
}

#[test]
fn without_a_provider_file_a_tool_with_secrets_is_still_refused() {
    let dir = tempdir();
    let m = dir.path().join("m.yaml");
    std::fs::write(
        &m,
        "tools:\n  a:\n    profile: P2\n    command: [/bin/true]\n    network: none\n    secrets: [{name: A, scope: r, ttl: 60, deliver: env}]\n",
    )
    .unwrap();
    let out = Command::new(CORDON)
        .args(["run", "a", "-m"])
        .arg(&m)
        .env("CORDON_PROVIDERS", dir.path().join("absent.yaml"))
        .env("CORDON_AUDIT", dir.path().join("audit.jsonl"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("absent.yaml"), "{err}");
}

/// Every file under `dir` (recursively) but the provider fixture's own
/// records, with its contents.
fn files_under(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_file() {
                let name = p.file_name().unwrap().to_string_lossy().to_string();
                if name != "minted" && name != "revoked" {
                    out.push((p.clone(), std::fs::read(&p).unwrap_or_default()));
                }
            }
        }
    }
    out
}

/// Processes holding a value: pid, name, the environment entries with it.
type Holders = Vec<(i32, String, Vec<String>)>;

/// Processes on this host whose environment holds `needle`.
fn environs_with(needle: &str) -> Holders {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) {
            let hits: Vec<String> = env
                .split(|b| *b == 0)
                .map(|kv| String::from_utf8_lossy(kv).to_string())
                .filter(|kv| kv.contains(needle))
                .collect();
            if !hits.is_empty() {
                let status =
                    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                let name = status
                    .lines()
                    .find_map(|l| l.strip_prefix("Name:"))
                    .unwrap_or("(gone)")
                    .trim()
                    .to_string();
                out.push((pid, name, hits));
            }
        }
    }
    out
}

/// Pids of processes whose command line mentions `needle`.
fn procs_with(needle: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        if let Ok(c) = std::fs::read(format!("/proc/{pid}/cmdline"))
            && String::from_utf8_lossy(&c).contains(needle)
        {
            out.push(pid);
        }
    }
    out
}

/// `cordon run` of a tool that reports what its variable looks like and
/// then sleeps, so that the test can look at every process's environment
/// while it runs (found by a marker in its command line).
fn run_sleeper(dir: &Path, secret: &str, network: &str) -> (String, String, Holders, u32, String) {
    // Unique to this test (tests of this binary run at once).
    let marker = format!(
        "cordon-secret-test-{}",
        dir.file_name().unwrap().to_string_lossy()
    );
    let m = dir.join("m.yaml");
    std::fs::write(
        &m,
        format!(
            "tools:\n  t:\n    profile: P2\n    command: [/bin/sh, -c, 'case \"$API_TOKEN\" in cordon-ph-*) echo \"placeholder $API_TOKEN\";; \"\") echo empty;; *) echo \"value of length ${{#API_TOKEN}}\";; esac; sleep 4; : {marker}']\n    {network}\n    limits: {{wall_seconds: 20}}\n    secrets: [{secret}]\n"
        ),
    )
    .unwrap();
    let providers = exec_providers(dir);
    let audit = dir.join("audit.jsonl");
    let mut child = Command::new(CORDON)
        .args(["run", "t", "--providers"])
        .arg(&providers)
        .arg("-m")
        .arg(&m)
        .arg("--audit")
        .arg(&audit)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let cordon_pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(30);
    while procs_with(&marker).is_empty() {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            panic!(
                "cordon run ended before the tool ran: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(Instant::now() < deadline, "the tool never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let token = lines(&dir.join("minted"))
        .first()
        .cloned()
        .expect("a token was minted");
    let holders = environs_with(&token);
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    (
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
        holders,
        cordon_pid,
        token,
    )
}

/// The token is in no output, no file cordon wrote, and no audit record;
/// mint and revocation are audited (scope, ttl, expiry) and the token was
/// revoked at the call's end.
fn assert_contained(dir: &Path, stdout: &str, stderr: &str, token: &str) {
    assert!(!stdout.contains(token), "stdout: {stdout}");
    assert!(!stderr.contains(token), "stderr: {stderr}");
    for (p, bytes) in files_under(dir) {
        assert!(
            !String::from_utf8_lossy(&bytes).contains(token),
            "{} holds the token",
            p.display()
        );
    }
    assert_eq!(lines(&dir.join("revoked")), vec![token.to_string()]);
    let recs: Vec<serde_json::Value> = lines(&dir.join("audit.jsonl"))
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let events: Vec<&str> = recs
        .iter()
        .filter_map(|r| r["credential"]["event"].as_str())
        .collect();
    assert_eq!(events, ["mint", "revoke"], "{recs:#?}");
    let mint = recs
        .iter()
        .find(|r| r["credential"]["event"] == "mint")
        .unwrap();
    assert_eq!(mint["credential"]["scope"], "read:issues");
    assert_eq!(mint["credential"]["ttl_seconds"], 300);
    assert_eq!(mint["credential"]["provider"], "mint");
    assert!(mint["credential"]["expires_at"].is_string());
    let call = recs.iter().find(|r| r["credential"].is_null()).unwrap();
    assert_eq!(call["session"], mint["session"]);
}

#[test]
fn deliver_env_puts_the_token_in_that_one_variable_and_nowhere_else() {
    if !is_root() {
        skip_or_fail(&this_test(), "needs root to build the sandbox");
        return;
    }
    let dir = tempdir();
    let (stdout, stderr, holders, cordon_pid, token) = run_sleeper(
        dir.path(),
        "{name: API_TOKEN, scope: \"read:issues\", ttl: 300, deliver: env}",
        "network: none",
    );
    assert!(
        stdout.contains(&format!("value of length {}", token.len())),
        "{stdout}"
    );
    // Positive control: the tool's processes hold it, and only as that
    // variable; cordon itself (and every other process) does not.
    assert!(!holders.is_empty(), "no process holds the token");
    for (pid, name, hits) in &holders {
        assert_ne!(*pid as u32, cordon_pid, "cordon's own environment holds it");
        assert_eq!(hits, &vec![format!("API_TOKEN={token}")], "pid {pid}");
        assert!(
            name == "sh" || name == "sleep",
            "pid {pid} ({name}) is not the tool: {holders:?}"
        );
    }
    assert_contained(dir.path(), &stdout, &stderr, &token);
}

#[test]
fn deliver_proxy_gives_the_sandbox_only_a_placeholder() {
    if !is_root() {
        skip_or_fail(&this_test(), "needs root to build the sandbox");
        return;
    }
    let dir = tempdir();
    let (stdout, stderr, holders, _, token) = run_sleeper(
        dir.path(),
        "{name: API_TOKEN, scope: \"read:issues\", ttl: 300}",
        "egress: [\"api.example:443\"]",
    );
    let ph = stdout
        .lines()
        .find_map(|l| l.strip_prefix("placeholder "))
        .unwrap_or_else(|| panic!("no placeholder: {stdout}"));
    assert!(
        ph.strip_prefix("cordon-ph-")
            .is_some_and(|h| h.len() == 32 && h.chars().all(|c| c.is_ascii_hexdigit())),
        "{ph}"
    );
    assert!(holders.is_empty(), "processes hold the token: {holders:?}");
    assert_contained(dir.path(), &stdout, &stderr, &token);
}

/// `cordon run` of a tool that sleeps, stopped by `signal` while it does:
/// its token is revoked at the provider and audited, the tool is gone, and
/// cordon exits with 128 + the signal.
fn run_stopped_by(signal: &str, number: i32) {
    let dir = tempdir();
    let marker = format!(
        "cordon-signal-test-{}",
        dir.path().file_name().unwrap().to_string_lossy()
    );
    let m = dir.path().join("m.yaml");
    std::fs::write(
        &m,
        format!(
            "tools:\n  t:\n    profile: P2\n    command: [/bin/sh, -c, 'sleep 600; : {marker}']\n    network: none\n    limits: {{wall_seconds: 900}}\n    secrets: [{{name: API_TOKEN, scope: \"read:issues\", ttl: 300, deliver: env}}]\n"
        ),
    )
    .unwrap();
    let providers = exec_providers(dir.path());
    let audit = dir.path().join("audit.jsonl");
    let mut child = Command::new(CORDON)
        .args(["run", "t", "--providers"])
        .arg(&providers)
        .arg("-m")
        .arg(&m)
        .arg("--audit")
        .arg(&audit)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while procs_with(&marker).is_empty() {
        if child.try_wait().unwrap().is_some() {
            let out = child.wait_with_output().unwrap();
            panic!(
                "cordon run ended before the tool ran: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        assert!(Instant::now() < deadline, "the tool never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Positive control: minted, not yet revoked while the tool runs.
    let minted = lines(&dir.path().join("minted"));
    assert_eq!(minted.len(), 1, "{minted:?}");
    assert!(lines(&dir.path().join("revoked")).is_empty());
    let st = Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(child.id().to_string())
        .status()
        .unwrap();
    assert!(st.success());
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(128 + number), "{stderr}");
    assert!(
        stderr.contains(&format!("cordon: SIG{signal}: stopping t")),
        "{stderr}"
    );
    // Revoked at the provider, and audited.
    assert_eq!(lines(&dir.path().join("revoked")), minted);
    let recs: Vec<serde_json::Value> = lines(&audit)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let events: Vec<&str> = recs
        .iter()
        .filter_map(|r| r["credential"]["event"].as_str())
        .collect();
    assert_eq!(events, ["mint", "revoke"], "{recs:#?}");
    let revoke = recs
        .iter()
        .find(|r| r["credential"]["event"] == "revoke")
        .unwrap();
    assert_eq!(
        revoke["reason"],
        format!("cordon run was stopped by SIG{signal}"),
        "{revoke:#?}"
    );
    let end = recs
        .iter()
        .find(|r| r["credential"].is_null())
        .unwrap_or_else(|| panic!("no record of the call: {recs:#?}"));
    assert_eq!(end["status"], "killed", "{end:#?}");
    assert_eq!(end["signal"], number, "{end:#?}");
    assert_eq!(end["session"], revoke["session"], "{recs:#?}");
    // The tool went with cordon.
    let deadline = Instant::now() + Duration::from_secs(30);
    while !procs_with(&marker).is_empty() {
        assert!(Instant::now() < deadline, "the tool outlived cordon run");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!stderr.contains(&minted[0]), "{stderr}");
}

#[test]
fn run_revokes_on_sigterm() {
    if !is_root() {
        skip_or_fail(&this_test(), "needs root to build the sandbox");
        return;
    }
    run_stopped_by("TERM", 15);
}

#[test]
fn run_revokes_on_sigint() {
    if !is_root() {
        skip_or_fail(&this_test(), "needs root to build the sandbox");
        return;
    }
    run_stopped_by("INT", 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_mints_for_the_session_and_revokes_on_sigterm() {
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
    let mut served = Serve::new(CORDON)
        .args(["--no-probe", "--providers"])
        .arg(&providers)
        .arg("-m")
        .arg(&m)
        .arg("--audit")
        .arg(&audit)
        .http();
    let pid = served.pid();
    let url = served.url.clone();
    let stderr_rest = served.rest();
    let client = ().serve(cordon_mcp::http_client(&url)).await.unwrap();
    let mut p = CallToolRequestParams::new("fx__probe");
    p.arguments = json!({}).as_object().cloned();
    let r = client.peer().call_tool(p).await.unwrap();
    assert_eq!(r.is_error, Some(false), "{r:?}");
    assert!(text_of(&r).contains("FX_TOKEN"), "{}", text_of(&r));
    let minted = lines(&dir.path().join("minted"));
    assert_eq!(minted.len(), 1);
    assert!(lines(&dir.path().join("revoked")).is_empty());
    // The mint is the session's, not a shared "serve".
    let recs: Vec<serde_json::Value> = lines(&audit)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mint = recs
        .iter()
        .find(|r| r["credential"]["event"] == "mint")
        .expect("a mint record");
    let session = mint["session"].as_str().unwrap().to_string();
    // (Over HTTP, a session's id is the `Mcp-Session-Id` it was given.)
    let groups: Vec<usize> = session.split('-').map(str::len).collect();
    assert_eq!(groups, [8, 4, 4, 4, 12], "{session}");
    // SIGTERM with the session still open: revoked before cordon exits.
    let st = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(s) = served.child.0.try_wait().unwrap() {
            assert!(s.success(), "{s}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "cordon serve did not exit on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(client);
    let stderr: Vec<String> = stderr_rest.join().unwrap();
    assert_eq!(lines(&dir.path().join("revoked")), minted);
    let recs: Vec<serde_json::Value> = lines(&audit)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        recs.iter()
            .any(|r| r["credential"]["event"] == "revoke" && r["session"] == session.as_str()),
        "{recs:#?}"
    );
    for l in stderr.iter().chain(lines(&audit).iter()) {
        assert!(!l.contains(&minted[0]), "{l}");
    }
}

/// A third-party MCP server of the seed's `jira_search` shape: it calls its
/// one API with `Authorization: Bearer $JIRA_TOKEN`, where the variable is
/// a placeholder.
const JIRA_SERVER: &str = r#"import json, os, sys, urllib.request, urllib.error

def send(m):
    sys.stdout.write(json.dumps(m) + "\n")
    sys.stdout.flush()

TOOLS = [{"name": "jira_search", "description": "Search issues.",
          "inputSchema": {"type": "object", "properties": {"url": {"type": "string"}},
                          "required": ["url"]}}]

for line in sys.stdin:
    line = line.strip()
    if not line:
        continue
    msg = json.loads(line)
    req_id, method, params = msg.get("id"), msg.get("method"), msg.get("params") or {}
    if req_id is None:
        continue
    if method == "initialize":
        send({"jsonrpc": "2.0", "id": req_id, "result": {
            "protocolVersion": params.get("protocolVersion", "2025-06-18"),
            "capabilities": {"tools": {}},
            "serverInfo": {"name": "jira-fixture", "version": "1"}}})
    elif method == "tools/list":
        send({"jsonrpc": "2.0", "id": req_id, "result": {"tools": TOOLS}})
    elif method == "tools/call":
        url = (params.get("arguments") or {}).get("url", "")
        req = urllib.request.Request(url, headers={"Authorization": "Bearer " + os.environ.get("JIRA_TOKEN", "")})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                text, err = r.read().decode(), False
        except urllib.error.HTTPError as e:
            text, err = "HTTP %d: %s" % (e.code, e.read().decode(errors="replace")), True
        except Exception as e:
            text, err = "fetch failed: %r" % (e,), True
        send({"jsonrpc": "2.0", "id": req_id, "result": {
            "content": [{"type": "text", "text": text}], "isError": err}})
    else:
        send({"jsonrpc": "2.0", "id": req_id,
              "error": {"code": -32601, "message": "method not found: %s" % method}})
"#;

/// End to end through the egress door's substitution (which the door's own
/// change provides): a `cordon serve` session of a third-party MCP server
/// whose API calls carry the placeholder reaches its loopback upstream with
/// the minted token, and only there. Named `e2e_door_` because it needs
/// the door's placeholder substitution as well as this broker; ignored
/// until both are in one tree (then drop the `ignore`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jira_search_calls_its_api_with_the_minted_token() {
    if !is_root() {
        skip_or_fail(&this_test(), "needs root to build the sandbox");
        return;
    }
    let dir = tempdir();
    // The upstream: records each request's head.
    let (addr, seen) = cordon_testkit::loopback::request_heads(|_| "issues".into());
    let port = addr.port();
    std::fs::write(dir.path().join("jira_server.py"), JIRA_SERVER).unwrap();
    let providers = exec_providers(dir.path());
    let m = dir.path().join("m.yaml");
    std::fs::write(
        &m,
        format!(
            "tools:\n  jira:\n    profile: P2\n    lifetime: session\n    limits: {{wall_seconds: 10}}\n    egress: [\"api.test:{port}\"]\n    resolve: {{api.test: 127.0.0.1}}\n    allow_cidrs: [127.0.0.1/32]\n    mounts: [\"{}:/fx-jira\"]\n    secrets: [{{name: JIRA_TOKEN, scope: \"read:issues\", ttl: 300, bind: {{path: /rest/}}}}]\n    mcp:\n      command: [\"/usr/bin/python3\", \"/fx-jira/jira_server.py\"]\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let c = Serve::new(CORDON)
        .args(["--no-probe", "--providers"])
        .arg(&providers)
        .arg("-m")
        .arg(&m)
        .arg("--audit")
        .arg(dir.path().join("audit.jsonl"))
        .stdio((), Stdio::inherit())
        .await;
    let call = |path: &str| {
        let mut p = CallToolRequestParams::new("jira__jira_search");
        p.arguments = json!({"url": format!("http://api.test:{port}{path}")})
            .as_object()
            .cloned();
        p
    };
    let r = c
        .peer()
        .call_tool(call("/rest/api/2/search"))
        .await
        .unwrap();
    assert_eq!(r.is_error, Some(false), "{}", text_of(&r));
    let token = lines(&dir.path().join("minted"))[0].clone();
    let heads = seen.lock().unwrap().clone();
    assert_eq!(heads.len(), 1, "{heads:?}");
    // Header names are case-insensitive (the door may lower-case them).
    assert!(
        heads[0]
            .to_ascii_lowercase()
            .contains(&format!("authorization: bearer {token}")),
        "{heads:?}"
    );
    // Outside the bound path prefix the placeholder is not replaced: the
    // request is refused, and the token never reaches the upstream.
    let r = c.peer().call_tool(call("/other")).await.unwrap();
    assert_eq!(r.is_error, Some(true), "{}", text_of(&r));
    let heads = seen.lock().unwrap().clone();
    assert!(
        heads.iter().skip(1).all(|h| !h.contains(&token)),
        "{heads:?}"
    );
    let _ = c.cancel().await;
}
