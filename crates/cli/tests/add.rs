//! `cordon add`: MCP servers from npm and PyPI installed into cordon's
//! store offline (from the npm cache and the wheelhouse scripts/setup.sh
//! fills), their entries written to a manifest, checked clean, then served
//! by `cordon serve` and called by the rmcp client, with no hand editing.
//! As root every `cordon add` runs in a network namespace of its own with
//! nothing in it, so nothing can be fetched from off this machine.
//!
//! markitdown-mcp (about 140 MB of wheels; its install and its start take
//! minutes on a loaded machine) is `#[ignore]`d here and run by
//! tests/e2e/add_slow.sh.

mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use cordon_mcp::rmcp;
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService};
use serde_json::{Value, json};

const MEMORY: &str = "npm:@modelcontextprotocol/server-memory@2026.8.31";
const THINKING: &str = "npm:@modelcontextprotocol/server-sequential-thinking@2026.8.31";
const TIME: &str = "pypi:mcp-server-time==2026.10.19";
const GIT: &str = "pypi:mcp-server-git==2026.10.19";
const MARKITDOWN: &str = "pypi:markitdown-mcp==0.0.1a8";

fn euid() -> u32 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

/// The npm cache and the wheelhouse scripts/setup.sh fills, or why not.
fn sources() -> Result<(PathBuf, PathBuf), String> {
    let cache = std::env::var_os("CORDON_E2E_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/cordon-e2e"))
        .join("add");
    for done in ["npm.done", "wheels.done"] {
        if !cache.join(done).is_file() {
            return Err(format!(
                "{} is missing: scripts/setup.sh fills cordon add's npm cache and wheelhouse",
                cache.join(done).display()
            ));
        }
    }
    for prog in ["npm", "node", "/usr/bin/python3"] {
        let ok = Command::new(prog)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Err(format!("{prog} is not installed (scripts/setup.sh)"));
        }
    }
    Ok((cache.join("npm-cache"), cache.join("wheels")))
}

/// A test's directory (readable by the sandbox's uid), its store, its
/// manifest and its offline sources.
struct Work {
    _dir: TempDir,
    root: PathBuf,
    store: PathBuf,
    manifest: PathBuf,
    npm_cache: PathBuf,
    wheels: PathBuf,
}

fn work() -> Option<Work> {
    let test = this_test();
    let (npm_cache, wheels) = match sources() {
        Ok(s) => s,
        Err(why) => {
            skip_or_fail(&test, &why);
            return None;
        }
    };
    let dir = tempdir();
    let root = dir.path().to_path_buf();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    Some(Work {
        store: root.join("store"),
        manifest: root.join("cordon.yaml"),
        root,
        _dir: dir,
        npm_cache,
        wheels,
    })
}

impl Work {
    /// `cordon add PKG --from <its source> ARGS...`, with no network.
    fn add(&self, pkg: &str, args: &[&str]) -> Output {
        let from = if pkg.starts_with("npm:") {
            &self.npm_cache
        } else {
            &self.wheels
        };
        self.add_from(pkg, from, args)
    }

    /// `cordon add PKG --from FROM ARGS...`, with no network.
    fn add_from(&self, pkg: &str, from: &Path, args: &[&str]) -> Output {
        let mut cmd = if euid() == 0 {
            let mut c = Command::new("unshare");
            c.args(["--net", "--"]).arg(env!("CARGO_BIN_EXE_cordon"));
            c
        } else {
            Command::new(env!("CARGO_BIN_EXE_cordon"))
        };
        cmd.arg("add")
            .arg(pkg)
            .arg("--store")
            .arg(&self.store)
            .arg("--from")
            .arg(from)
            .arg("-m")
            .arg(&self.manifest)
            .args(args)
            .env_remove("CORDON_STORE")
            .env_remove("CORDON_MANIFEST")
            // Refusals come at once, not after the installers' retries.
            .env("npm_config_fetch_retries", "0")
            .env("PIP_RETRIES", "0");
        cmd.output().expect("run cordon add")
    }

    fn add_ok(&self, pkg: &str, args: &[&str]) -> String {
        let o = self.add(pkg, args);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(o.status.success(), "cordon add {pkg} {args:?}: {err}");
        err
    }

    /// `cordon check` on the manifest: every tool valid, no warnings.
    fn check_clean(&self) {
        let o = Command::new(env!("CARGO_BIN_EXE_cordon"))
            .arg("check")
            .arg("-m")
            .arg(&self.manifest)
            .output()
            .unwrap();
        let all = format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        assert!(o.status.success(), "{all}");
        assert!(
            !all.contains("warning: ")
                && all.contains(" 0 warnings, every tool would start on this host"),
            "{all}"
        );
    }

    /// The store's installs of one ecosystem.
    fn installs(&self, eco: &str) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(self.store.join(eco))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    async fn serve(&self) -> RunningService<RoleClient, ()> {
        Serve::new(env!("CARGO_BIN_EXE_cordon"))
            .arg("-m")
            .arg(&self.manifest)
            .env("CORDON_AUDIT", self.root.join("audit.jsonl"))
            .env("CORDON_STATE_DIR", self.root.join("state"))
            .stdio((), Stdio::inherit())
            .await
    }
}

async fn tool_names(c: &RunningService<RoleClient, ()>) -> Vec<String> {
    let tools = c.peer().list_all_tools().await.expect("tools/list");
    tools.iter().map(|t| t.name.to_string()).collect()
}

/// A tool call that succeeded, its text.
async fn call_ok(c: &RunningService<RoleClient, ()>, tool: &str, args: Value) -> String {
    let mut p = CallToolRequestParams::new(tool.to_owned());
    p.arguments = args.as_object().cloned();
    let r = c.peer().call_tool(p).await.expect("tools/call");
    let t = text_of(&r);
    assert_ne!(r.is_error, Some(true), "{tool}: {t}");
    t
}

fn has_all(names: &[String], want: &[&str]) {
    for w in want {
        assert!(names.iter().any(|n| n == w), "{w} not in {names:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn npm_servers_are_added_checked_and_served() {
    let Some(w) = work() else { return };
    let err = w.add_ok(MEMORY, &[]);
    assert!(err.contains("installed npm:"), "{err}");
    w.add_ok(THINKING, &[]);
    let m = std::fs::read_to_string(&w.manifest).unwrap();
    assert!(
        m.contains("  memory:\n") && m.contains("  sequential_thinking:\n"),
        "{m}"
    );
    // node runs the entry script of the package's `bin`, in the store's
    // install mounted read-only outside /tmp.
    assert!(
        m.contains("command: [\"/usr/bin/node\", \"/opt/cordon/store/npm/@modelcontextprotocol+server-memory@2026.8.31-"),
        "{m}"
    );
    assert!(m.contains("server-memory/dist/index.js\"]"), "{m}");
    w.check_clean();

    // Reuse: the same package again installs nothing (and the manifest's
    // tool of that name is not overwritten without --force).
    let before = w.installs("npm");
    assert_eq!(before.len(), 2, "{before:?}");
    let o = w.add(MEMORY, &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("a tool `memory` is already there: pass --force"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&w.manifest).unwrap(), m);
    let o = w.add(MEMORY, &["--print"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.starts_with("reusing npm:"), "{err}");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("  memory:\n    profile: P2\n"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let err = w.add_ok(MEMORY, &["--force"]);
    assert!(err.starts_with("reusing npm:"), "{err}");
    assert_eq!(w.installs("npm"), before);
    assert_eq!(
        std::fs::read_to_string(&w.manifest)
            .unwrap()
            .matches("  memory:\n")
            .count(),
        1
    );
    w.check_clean();

    let c = w.serve().await;
    let names = tool_names(&c).await;
    has_all(
        &names,
        &[
            "memory__create_entities",
            "memory__read_graph",
            "sequential_thinking__sequentialthinking",
        ],
    );
    call_ok(
        &c,
        "memory__create_entities",
        json!({"entities": [{"name": "cordon", "entityType": "project", "observations": ["sandboxes tools"]}]}),
    )
    .await;
    let g = call_ok(&c, "memory__read_graph", json!({})).await;
    assert!(
        g.contains("\"cordon\"") && g.contains("sandboxes tools"),
        "{g}"
    );
    let t = call_ok(
        &c,
        "sequential_thinking__sequentialthinking",
        json!({"thought": "one step", "thoughtNumber": 1, "totalThoughts": 1, "nextThoughtNeeded": false}),
    )
    .await;
    assert!(t.contains("\"thoughtHistoryLength\": 1"), "{t}");
    c.cancel().await.ok();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pypi_servers_are_added_checked_and_served() {
    let Some(w) = work() else { return };
    // A repository for the git server, mounted as the test says.
    let repo = w.root.join("repo");
    std::fs::create_dir(&repo).unwrap();
    let git = |args: &[&str]| {
        let o = Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
            .args(args)
            .output()
            .expect("git");
        assert!(o.status.success(), "{:?}", o);
    };
    git(&["init", "-q"]);
    std::fs::write(repo.join("tracked.txt"), "one\n").unwrap();
    git(&["add", "tracked.txt"]);
    git(&["commit", "-qm", "first"]);
    std::fs::write(repo.join("untracked-by-test.txt"), "two\n").unwrap();
    Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(&repo)
        .status()
        .unwrap();

    let err = w.add_ok(TIME, &[]);
    assert!(err.contains("installed pypi:mcp-server-time"), "{err}");
    let mount = format!("{}:/repo:ro", repo.display());
    w.add_ok(GIT, &["--mount", &mount]);
    let m = std::fs::read_to_string(&w.manifest).unwrap();
    // The virtual environment's python3 runs the console script (not its
    // `#!` line, which names the host path it was installed at).
    assert!(
        m.contains("command: [\"/opt/cordon/store/pypi/mcp-server-time@2026.10.19-"),
        "{m}"
    );
    assert!(
        m.contains("/bin/python3\", \"/opt/cordon/store/pypi/mcp-server-time@2026.10.19-"),
        "{m}"
    );
    assert!(
        m.contains("/bin/mcp-server-time\", \"--local-timezone\", \"UTC\"]"),
        "{m}"
    );
    w.check_clean();
    let before = w.installs("pypi");
    let err = w.add_ok(TIME, &["--print"]);
    assert!(err.starts_with("reusing pypi:"), "{err}");
    assert_eq!(w.installs("pypi"), before);

    let c = w.serve().await;
    let names = tool_names(&c).await;
    has_all(&names, &["time__get_current_time", "git__git_status"]);
    let t = call_ok(
        &c,
        "time__get_current_time",
        json!({"timezone": "Asia/Tokyo"}),
    )
    .await;
    assert!(
        t.contains("\"timezone\": \"Asia/Tokyo\"") && t.contains("+09:00"),
        "{t}"
    );
    let s = call_ok(&c, "git__git_status", json!({"repo_path": "/repo"})).await;
    assert!(s.contains("untracked-by-test.txt"), "{s}");
    c.cancel().await.ok();
}

/// What cannot be done is refused, naming why: a package the offline
/// source does not have, one it has only as an sdist, an unreachable
/// registry, a spec that is not an exact package, `--image`; nothing is
/// written and no install is left.
#[test]
fn what_cannot_be_installed_is_refused() {
    let Some(w) = work() else { return };
    let refused = |o: Output, want: &str| {
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(err.contains(want), "want {want:?}: {err}");
    };
    // A version the cache lacks of a package it has, and a package it
    // does not have at all.
    refused(
        w.add("npm:@modelcontextprotocol/server-everything@0.0.1", &[]),
        "not in ",
    );
    refused(
        w.add("npm:@modelcontextprotocol/server-puppeteer@2025.5.12", &[]),
        "not in ",
    );
    refused(
        w.add("pypi:mcp-server-fetch==2025.4.7", &[]),
        "no wheel of mcp-server-fetch==2025.4.7 in ",
    );
    // Only an sdist: never built (its setup code would run on the host).
    let sdists = w.root.join("sdists");
    std::fs::create_dir(&sdists).unwrap();
    std::fs::write(sdists.join("cordon_sdist_only-1.0.tar.gz"), b"not built").unwrap();
    let o = w.add_from("pypi:cordon-sdist-only==1.0", &sdists, &[]);
    refused(
        o,
        "cordon add installs wheels only, never building an sdist",
    );
    refused(w.add("npm:left-pad@^1.0", &[]), "is not an exact version");
    refused(
        w.add("pypi:x @ https://example.com/x.whl", &[]),
        "is not a valid pypi package name",
    );
    refused(w.add(MEMORY, &["--image"]), "--image is not available");
    if euid() == 0 {
        // No --from, in a network namespace with nothing in it.
        let o = Command::new("unshare")
            .args(["--net", "--"])
            .arg(env!("CARGO_BIN_EXE_cordon"))
            .args(["add", "pypi:mcp-server-time==2026.10.19", "--store"])
            .arg(&w.store)
            .arg("-m")
            .arg(&w.manifest)
            // One retry: pip names the connection error only then.
            .env("PIP_RETRIES", "1")
            .env("PIP_TIMEOUT", "2")
            .output()
            .unwrap();
        refused(o, "PyPI cannot be reached (network unavailable?)");
    }
    assert!(!w.manifest.exists());
    for eco in ["npm", "pypi"] {
        assert_eq!(w.installs(eco), Vec::<String>::new(), "{eco}");
    }
    // Positive control: the same store and manifest take a package the
    // source has.
    w.add_ok(MEMORY, &[]);
    assert!(w.manifest.exists());
}

/// As uid 65534: its default store under its home (and a copy of the npm
/// cache: npm writes to its cache); the install is then served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unprivileged_user_adds_and_serves() {
    let test = this_test();
    if euid() != 0 {
        skip_or_fail(&test, "needs root to switch to uid 65534 with setpriv");
        return;
    }
    if !Path::new("/usr/bin/setpriv").exists() {
        skip_or_fail(&test, "needs /usr/bin/setpriv to run as uid 65534");
        return;
    }
    let Some(w) = work() else { return };
    let cache = w.root.join("npm-cache");
    let cp = Command::new("cp")
        .arg("-r")
        .arg(&w.npm_cache)
        .arg(&cache)
        .status()
        .unwrap();
    assert!(cp.success());
    let own = Command::new("chown")
        .args(["-R", "65534:65534"])
        .arg(&w.root)
        .status()
        .unwrap();
    assert!(own.success());
    let nobody = |args: &[&str]| {
        Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(env!("CARGO_BIN_EXE_cordon"))
            .args(args)
            .env("HOME", &w.root)
            .env_remove("CORDON_STORE")
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("XDG_DATA_HOME")
            .env("npm_config_fetch_retries", "0")
            .output()
            .unwrap()
    };
    // The default store of a user who is not root: under their home.
    let o = nobody(&[
        "add",
        MEMORY,
        "--from",
        cache.to_str().unwrap(),
        "-m",
        w.manifest.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let home_store = w.root.join(".local/share/cordon/store/npm");
    assert!(
        err.contains(&format!(
            "at {}/@modelcontextprotocol+server-memory@2026.8.31-",
            home_store.display()
        )),
        "{err}"
    );
    // Its broker has no cgroup delegation here, which P2 requires: the
    // manifest is valid for it, and root serves the same manifest.
    let o = nobody(&["check", "--no-host", "-m", w.manifest.to_str().unwrap()]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    w.check_clean();
    let c = w.serve().await;
    has_all(&tool_names(&c).await, &["memory__read_graph"]);
    let g = call_ok(&c, "memory__read_graph", json!({})).await;
    assert!(g.contains("\"entities\""), "{g}");
    c.cancel().await.ok();
}

/// markitdown-mcp: slow (tests/e2e/add_slow.sh runs it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "slow: about 140 MB of wheels; run by tests/e2e/add_slow.sh"]
async fn markitdown_is_added_checked_and_served() {
    let Some(w) = work() else { return };
    let data = w.root.join("data");
    std::fs::create_dir(&data).unwrap();
    std::fs::write(
        data.join("page.html"),
        "<html><body><h1>Quarterly report</h1><p>Revenue <b>grew</b>.</p></body></html>",
    )
    .unwrap();
    Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(&data)
        .status()
        .unwrap();
    let mount = format!("{}:/data", data.display());
    let err = w.add_ok(MARKITDOWN, &["--mount", &mount]);
    assert!(err.contains("installed pypi:markitdown-mcp"), "{err}");
    w.check_clean();
    let c = w.serve().await;
    has_all(&tool_names(&c).await, &["markitdown__convert_to_markdown"]);
    let t = call_ok(
        &c,
        "markitdown__convert_to_markdown",
        json!({"uri": "file:///data/page.html"}),
    )
    .await;
    assert!(
        t.contains("# Quarterly report") && t.contains("**grew**"),
        "{t}"
    );
    c.cancel().await.ok();
}
