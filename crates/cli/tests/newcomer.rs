//! What a new user does, end to end and offline: a Claude Desktop
//! configuration with eight servers written as people write them (`npx -y
//! …`, `uvx …`, a token in `env`), in a home directory only its owner can
//! enter, with cordon's binary in that home too; `cordon import` (from the
//! package caches scripts/setup.sh fills, no download), `cordon check`
//! (which says what github's secret needs: the provider file it proposes
//! is written), `cordon serve` and one real call answered per server; then
//! a second start with nothing changed, which reuses the proofs.
//!
//! No packet leaves this machine: the page fetch reads is served here on a
//! loopback address, and github's API host is pinned (`resolve:`) to a
//! loopback listener that sees the egress door's TLS hello and answers
//! nothing, as the jira demo pins its host (examples/jira.yaml).
//!
//! Timings are printed (`--nocapture`), never asserted.

mod common;
use common::*;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cordon_mcp::rmcp::service::ServiceError;
use serde_json::json;

const CORDON: &str = env!("CARGO_BIN_EXE_cordon");

/// The package caches scripts/setup.sh fills (`add_npm`, `add_pypi`).
fn caches() -> Option<PathBuf> {
    let cache = std::env::var_os("CORDON_E2E_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/cordon-e2e"))
        .join("add");
    // Which packages they hold is import's to find (it refuses a package
    // that is not there, naming it).
    if cache.join("npm.done").is_file() && cache.join("wheels.done").is_file() {
        Some(cache)
    } else {
        skip_or_fail(
            &this_test(),
            "the npm cache and wheelhouse of scripts/setup.sh are missing; run scripts/setup.sh",
        );
        None
    }
}

/// A loopback address of this test's own (`127.A.B.C`), so that two runs
/// on one host do not take each other's port.
fn loopback(a: u8) -> Ipv4Addr {
    let pid = std::process::id();
    Ipv4Addr::new(127, a, (pid / 250 % 250) as u8 + 1, (pid % 250) as u8 + 1)
}

/// The new user's home: mode 0700, with cordon's binary, a git project
/// and a Claude Desktop configuration.
struct Home {
    _scratch: TempDir,
    home: PathBuf,
    cordon: PathBuf,
    project: PathBuf,
}

impl Home {
    fn new() -> Home {
        let scratch = cordon_testkit::scratch::named("newcomer-");
        let home = scratch.path().join("home");
        std::fs::create_dir(&home).unwrap();
        std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o700)).unwrap();
        let bin = home.join(".local/bin");
        std::fs::create_dir_all(&bin).unwrap();
        let cordon = bin.join("cordon");
        std::fs::copy(CORDON, &cordon).unwrap();
        let project = home.join("project");
        std::fs::create_dir(&project).unwrap();
        std::fs::write(
            project.join("README.md"),
            "hello from the newcomer's project\n",
        )
        .unwrap();
        for args in [
            &["init", "-q"][..],
            &["add", "README.md"],
            &[
                "-c",
                "user.name=newcomer",
                "-c",
                "user.email=newcomer@example.invalid",
                "commit",
                "-q",
                "-m",
                "first",
            ],
        ] {
            let o = Command::new("git")
                .args(args)
                .current_dir(&project)
                .env("HOME", &home)
                .output()
                .unwrap();
            assert!(o.status.success(), "git {args:?}: {}", out(&o));
        }
        Home {
            _scratch: scratch,
            home,
            cordon,
            project,
        }
    }

    /// The variables every cordon command of this user gets: its home,
    /// and its state and audit log in there.
    fn env(&self) -> Vec<(&'static str, PathBuf)> {
        vec![
            ("HOME", self.home.clone()),
            ("CORDON_STATE_DIR", self.home.join(".local/state/cordon")),
            (
                "CORDON_AUDIT",
                self.home.join(".local/state/cordon/audit.jsonl"),
            ),
        ]
    }

    /// `cordon ARGS`, from the copy in the home.
    fn cordon(&self, args: &[&str]) -> Output {
        let mut c = Command::new(&self.cordon);
        c.args(args)
            .current_dir(&self.home)
            .env_remove("CORDON_MANIFEST")
            .env_remove("CORDON_PROVIDERS");
        for (k, v) in self.env() {
            c.env(k, v);
        }
        c.output().unwrap()
    }

    /// `cordon serve -m M --providers P` over stdio, its stderr in `log`;
    /// initialized, and how long that took.
    async fn serve(
        &self,
        m: &Path,
        providers: &Path,
        log: &Path,
    ) -> (
        cordon_mcp::rmcp::service::RunningService<cordon_mcp::rmcp::service::RoleClient, ()>,
        Duration,
    ) {
        let mut s = Serve::new(&self.cordon)
            .arg("-m")
            .arg(m)
            .arg("--providers")
            .arg(providers);
        for (k, v) in self.env() {
            s = s.env(k, v);
        }
        let t = Instant::now();
        let c = s
            .stdio((), Stdio::from(std::fs::File::create(log).unwrap()))
            .await;
        (c, t.elapsed())
    }
}

fn out(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Replace the one `from` in `text` by `to`.
fn edit(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "`{from}` once in:\n{text}");
    text.replacen(from, to, 1)
}

/// A page on `addr:80`: `/robots.txt` is not found, anything else is
/// `body`.
fn page(addr: Ipv4Addr, body: &'static str) -> TcpListener {
    let l = TcpListener::bind((addr, 80)).unwrap_or_else(|e| panic!("bind {addr}:80: {e}"));
    let server = l.try_clone().unwrap();
    std::thread::spawn(move || {
        for c in server.incoming() {
            let Ok(mut c) = c else { continue };
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                match c.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => req.extend_from_slice(&buf[..n]),
                }
            }
            let robots = req.starts_with(b"GET /robots.txt ");
            let (status, body) = if robots {
                ("404 Not Found", "")
            } else {
                ("200 OK", body)
            };
            let _ = write!(
                c,
                "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    l
}

/// A listener on `addr:443` that sends the first bytes of each connection
/// (a TLS client hello) to the receiver, and closes it.
fn hello_catcher(addr: Ipv4Addr) -> mpsc::Receiver<Vec<u8>> {
    let l = TcpListener::bind((addr, 443)).unwrap_or_else(|e| panic!("bind {addr}:443: {e}"));
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { continue };
            let _ = c.set_read_timeout(Some(Duration::from_secs(30)));
            let mut buf = vec![0u8; 2048];
            let n = c.read(&mut buf).unwrap_or(0);
            buf.truncate(n);
            if tx.send(buf).is_err() {
                return;
            }
        }
    });
    rx
}

#[test]
fn a_newcomer_imports_checks_and_serves_a_claude_desktop_config() {
    let Some(cache) = caches() else {
        return;
    };
    let begin = Instant::now();
    let h = Home::new();
    let p = h.project.display().to_string();
    let cfg = h.home.join(".config/Claude/claude_desktop_config.json");
    std::fs::create_dir_all(cfg.parent().unwrap()).unwrap();
    std::fs::write(
        &cfg,
        format!(
            r#"{{
  "mcpServers": {{
    "filesystem": {{"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "{p}"]}},
    "memory": {{"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"]}},
    "sequential-thinking": {{"command": "npx", "args": ["-y", "@modelcontextprotocol/server-sequential-thinking"]}},
    "everything": {{"command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything"]}},
    "github": {{
      "command": "npx",
      "args": ["-y", "@modelcontextprotocol/server-github"],
      "env": {{"GITHUB_PERSONAL_ACCESS_TOKEN": "<YOUR_TOKEN>"}}
    }},
    "fetch": {{"command": "uvx", "args": ["mcp-server-fetch"]}},
    "git": {{"command": "uvx", "args": ["mcp-server-git", "--repository", "{p}"]}},
    "time": {{"command": "uvx", "args": ["mcp-server-time"]}}
  }}
}}
"#
        ),
    )
    .unwrap();

    // 1. Import, offline, from the caches.
    let m = h.home.join("cordon.yaml");
    let store = h.home.join(".local/share/cordon/store");
    let (npm_cache, wheels) = (cache.join("npm-cache"), cache.join("wheels"));
    let o = h.cordon(&[
        "import",
        "--yes",
        "-o",
        m.to_str().unwrap(),
        "--offline",
        "--npm-cache",
        npm_cache.to_str().unwrap(),
        "--wheels",
        wheels.to_str().unwrap(),
        "--package-store",
        store.to_str().unwrap(),
        cfg.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "import: {}", out(&o));
    let imported = std::fs::read_to_string(&m).unwrap();
    for name in [
        "filesystem",
        "memory",
        "sequential-thinking",
        "everything",
        "github",
        "fetch",
        "git",
        "time",
    ] {
        assert!(
            imported.contains(&format!("\n  {name}:\n")),
            "{name}: {imported}"
        );
    }
    assert!(!imported.contains("<YOUR_TOKEN>"), "{imported}");

    // 2. Check: everything would start but github, whose secret needs a
    // provider file; the refusal says so and proposes one.
    let o = h.cordon(&["check", "-m", m.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{}", out(&o));
    assert!(
        err.contains("tool `github`: would not start here: secret `GITHUB_PERSONAL_ACCESS_TOKEN` needs a credential broker, and there is no provider file"),
        "{}",
        out(&o)
    );
    // The count says as many warnings as were printed (fetch, under
    // gVisor, runs without Landlock: the application kernel serves its
    // files).
    assert!(
        err.contains("warning: fetch: landlock: missing"),
        "{}",
        out(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&format!(
            "8 tools valid, {}, 1 would not start on this host",
            warnings(&err)
        )),
        "{}",
        out(&o)
    );
    // The proposed stanza, written with a minting command of our own.
    let proposed: String = err
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("hint: write a provider file"))
        .skip(1)
        .take_while(|l| l.starts_with("    "))
        .map(|l| format!("{}\n", &l[4..]))
        .collect();
    assert!(proposed.contains("type: exec"), "{}", out(&o));
    let mint = h.home.join(".local/bin/mint-token");
    std::fs::write(
        &mint,
        "#!/bin/sh\ncat >/dev/null\necho '{\"token\": \"not-a-real-github-token\"}'\n",
    )
    .unwrap();
    std::fs::set_permissions(&mint, std::fs::Permissions::from_mode(0o755)).unwrap();
    let providers = h.home.join(".config/cordon/providers.yaml");
    std::fs::create_dir_all(providers.parent().unwrap()).unwrap();
    std::fs::write(
        &providers,
        edit(
            &proposed,
            "\"/usr/local/bin/mint-token\"",
            &format!("\"{}\"", mint.display()),
        ),
    )
    .unwrap();
    std::fs::set_permissions(&providers, std::fs::Permissions::from_mode(0o600)).unwrap();

    // No packet leaves: github's API host and the page fetch reads are
    // pinned to loopback listeners of this test (the user's edit, as in
    // examples/jira.yaml), and fetch is told private addresses are fine
    // (its own guard refuses them otherwise).
    let (page_ip, api_ip) = (loopback(83), loopback(84));
    let _page = page(page_ip, "the newcomer's page, served on loopback\n");
    let hellos = hello_catcher(api_ip);
    let mut text = edit(
        &imported,
        "    egress: proxy\n",
        &format!(
            "    egress: proxy\n    resolve: {{page.test: {page_ip}}}\n    allow_cidrs: [{page_ip}/32]\n"
        ),
    );
    text = edit(
        &text,
        "/bin/mcp-server-fetch\"]",
        "/bin/mcp-server-fetch\", \"--allow-private-ips\"]",
    );
    text = edit(
        &text,
        "      - \"api.github.com:443\"\n",
        &format!(
            "      - \"api.github.com:443\"\n    resolve: {{api.github.com: {api_ip}}}\n    allow_cidrs: [{api_ip}/32]\n"
        ),
    );
    std::fs::write(&m, text).unwrap();
    let o = h.cordon(&[
        "check",
        "-m",
        m.to_str().unwrap(),
        "--providers",
        providers.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", out(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains(&format!(
            "8 tools valid, {}, every tool would start on this host",
            warnings(&String::from_utf8_lossy(&o.stderr))
        )),
        "{}",
        out(&o)
    );

    // 3. Serve, and one call per server.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let log1 = h.home.join("serve-1.log");
    let (first_ready, answered) = rt.block_on(async {
        let (c, ready) = h.serve(&m, &providers, &log1).await;
        let log = || std::fs::read_to_string(&log1).unwrap_or_default();
        let tools = c.list_all_tools().await.expect("tools/list");
        assert!(
            tools.iter().any(|t| t.name == "github__search_repositories"),
            "{:?}\n{}",
            tools.iter().map(|t| t.name.to_string()).collect::<Vec<_>>(),
            log()
        );
        let readme = h.project.join("README.md").display().to_string();
        for (tool, args, want) in [
            ("filesystem__list_directory", json!({"path": p}), "README.md"),
            (
                "filesystem__read_text_file",
                json!({"path": readme}),
                "hello from the newcomer's project",
            ),
            (
                "memory__create_entities",
                json!({"entities": [{"name": "cordon", "entityType": "project", "observations": ["imported"]}]}),
                "\"entityType\": \"project\"",
            ),
            (
                "sequential-thinking__sequentialthinking",
                json!({"thought": "one step", "nextThoughtNeeded": false, "thoughtNumber": 1, "totalThoughts": 1}),
                "\"thoughtNumber\": 1",
            ),
            ("everything__echo", json!({"message": "hi cordon"}), "Echo: hi cordon"),
            (
                "fetch__fetch",
                json!({"url": "http://page.test/index.txt"}),
                "the newcomer's page, served on loopback",
            ),
            ("git__git_status", json!({"repo_path": p}), "working tree clean"),
            (
                "time__get_current_time",
                json!({"timezone": "UTC"}),
                "\"timezone\": \"UTC\"",
            ),
        ] {
            let r = call(&c, tool, args)
                .await
                .unwrap_or_else(|e| panic!("{tool}: {e:?}\n{}", log()));
            let t = text_of(&r);
            assert_ne!(r.is_error, Some(true), "{tool}: {t}\n{}", log());
            assert!(t.contains(want), "{tool}: `{want}` not in {t}\n{}", log());
        }
        // github: the call reaches the egress door, which opens TLS to
        // the pinned address (its hello names api.github.com); nothing
        // answers there, so the server reports an API error.
        let r = call(&c, "github__search_repositories", json!({"query": "cordon"})).await;
        let said = match r {
            Ok(r) => {
                assert_eq!(r.is_error, Some(true), "{}", text_of(&r));
                text_of(&r)
            }
            Err(ServiceError::McpError(e)) => e.message.to_string(),
            Err(e) => panic!("github: {e:?}\n{}", log()),
        };
        assert!(said.contains("GitHub API"), "{said}\n{}", log());
        let hello = hellos
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no connection reached {api_ip}:443\n{}", log()));
        assert_eq!(hello.first(), Some(&0x16), "not a TLS handshake: {hello:?}");
        assert!(
            hello.windows(14).any(|w| w == b"api.github.com"),
            "{hello:?}"
        );
        let answered = begin.elapsed();
        c.cancel().await.expect("stop cordon serve");
        (ready, answered)
    });

    // What each start probe took (printed, for a slow host's record).
    for l in std::fs::read_to_string(&log1).unwrap_or_default().lines() {
        if l.contains(": held (") || l.contains("proved in") || l.contains("not proved") {
            eprintln!("newcomer: first start: {l}");
        }
    }

    // 4. Again, nothing changed: every proof is reused.
    let log2 = h.home.join("serve-2.log");
    let again = rt.block_on(async {
        let (c, ready) = h.serve(&m, &providers, &log2).await;
        let r = call(&c, "time__get_current_time", json!({"timezone": "UTC"}))
            .await
            .expect("time, second start");
        assert_ne!(r.is_error, Some(true), "{}", text_of(&r));
        c.cancel().await.expect("stop cordon serve");
        ready
    });
    let log = std::fs::read_to_string(&log2).unwrap();
    let held = log
        .lines()
        .filter(|l| {
            l.contains(": held (proved ")
                && l.contains(" ago; policy, programs, binary and host unchanged)")
        })
        .count();
    assert_eq!(held, 8, "{log}");
    eprintln!(
        "newcomer: first start ready in {:.1} s; from the configuration to every server answering: {:.1} s; second start ready in {:.2} s",
        first_ready.as_secs_f64(),
        answered.as_secs_f64(),
        again.as_secs_f64()
    );
}

/// `check`'s count of the warnings it printed on `stderr`.
fn warnings(stderr: &str) -> String {
    match stderr
        .lines()
        .filter(|l| l.starts_with("warning: "))
        .count()
    {
        1 => "1 warning".to_string(),
        n => format!("{n} warnings"),
    }
}
