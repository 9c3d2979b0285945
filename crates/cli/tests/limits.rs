//! Limits for an unprivileged cordon without cgroups (uid 65534 here, run
//! through setpriv: no cgroup delegation, so memory falls back to
//! RLIMIT_DATA): a Node.js MCP server starts and answers under a 1 GiB
//! memory limit, and a memory bomb in a P1 tool is stopped within the limit
//! plus a small margin and reported as the memory limit. Each has its
//! control as root, where the same manifests run with cgroups.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const CORDON: &str = env!("CARGO_BIN_EXE_cordon");

use cordon_testkit::skip;

use cordon_testkit::is_root;

/// Root and setpriv, or the test fails (unless skipping is allowed).
fn need_root(test: &str) -> bool {
    if is_root() && Path::new("/usr/bin/setpriv").exists() {
        return true;
    }
    skip::skip_or_fail(
        test,
        "needs root and /usr/bin/setpriv (runs cordon as uid 65534 too)",
    );
    false
}

/// Where scripts/setup.sh installs the reference MCP servers, when
/// server-filesystem is there (`$CORDON_E2E_NPM` overrides).
fn npm_dir() -> Option<PathBuf> {
    let d = std::env::var_os("CORDON_E2E_NPM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/cordon-e2e/npm"));
    d.join("node_modules/@modelcontextprotocol/server-filesystem/dist/index.js")
        .is_file()
        .then_some(d)
}

/// A world-readable directory of its own.
fn dir(tag: &str) -> cordon_testkit::Scratch {
    let d = cordon_testkit::scratch::named(&format!("cordon-limits-{tag}-"));
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    d
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    p
}

/// `cordon` as root or (`nobody`) as uid 65534, under a Python wrapper
/// that prints, last on stderr, `maxrss <bytes>`: the largest resident set
/// of any process it waited for, the sandbox's included (the kernel's
/// count, folded up through cordon when cordon is reaped).
fn cordon_measured(nobody: bool, args: &[&str], audit: &Path) -> (Output, u64) {
    const WRAP: &str = "import resource, subprocess, sys\n\
        r = subprocess.run(sys.argv[1:])\n\
        sys.stderr.write('\\nmaxrss %d\\n' % (resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024))\n\
        sys.exit(r.returncode if r.returncode >= 0 else 128 - r.returncode)\n";
    let mut cmd = Command::new("/usr/bin/python3");
    cmd.args(["-c", WRAP]);
    if nobody {
        cmd.args([
            "/usr/bin/setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
        ]);
    }
    cmd.arg(CORDON)
        .args(args)
        .env_remove("CORDON_MANIFEST")
        .env_remove("CORDON_AUDIT_FAIL_OPEN")
        .env("CORDON_AUDIT", audit)
        .env("HOME", "/tmp")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let o = cmd.output().expect("spawn cordon");
    let err = String::from_utf8_lossy(&o.stderr);
    let rss = err
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("maxrss "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no maxrss in {err}"));
    (o, rss)
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// A P1 memory bomb (Python, 1 MiB at a time) under a 256 MiB limit: as
/// uid 65534 (RLIMIT_DATA) it stops within the limit plus 32 MiB, as the
/// kernel counts its resident set, and `cordon run` reports the memory
/// limit (exit 12) with the fallback named; as root (cgroup) the same tool
/// is OOM-killed, the control of the cgroup path. A smaller goal finishes
/// (the positive control), and so does a Node.js bomb's smaller goal,
/// while its full one is the memory limit too.
#[test]
fn a_memory_bomb_in_a_p1_tool_is_the_memory_limit() {
    if !need_root("a_memory_bomb_in_a_p1_tool_is_the_memory_limit") {
        return;
    }
    let d = dir("bomb");
    let py = |goal: u32| {
        format!(
            "[/usr/bin/python3, -c, \"l = []\\nfor i in range({goal}):\\n    l.append(bytearray(1 << 20))\\nprint(len(l))\"]"
        )
    };
    let node = |goal: u32| {
        format!(
            "[/usr/bin/node, -e, \"const a = []; for (let i = 0; i < {goal}; i++) a.push(Buffer.alloc(1 << 20, 1)); console.log(a.length)\"]"
        )
    };
    // The wall limits are only a backstop, with room for an emulated host
    // (the test bed of tests/vm), where Node.js alone takes most of 20 s.
    let m = write(
        &d,
        "m.yaml",
        &format!(
            "tools:\n  small:\n    profile: P1\n    command: {}\n    limits: {{memory: 256M, wall_seconds: 120}}\n  bomb:\n    profile: P1\n    command: {}\n    limits: {{memory: 256M, wall_seconds: 120}}\n  node_small:\n    profile: P1\n    command: {}\n    limits: {{memory: 256M, wall_seconds: 120, tasks: 32}}\n  node_bomb:\n    profile: P1\n    command: {}\n    limits: {{memory: 256M, wall_seconds: 120, tasks: 32}}\n",
            py(64),
            py(100_000),
            node(64),
            node(100_000)
        ),
    );
    let m = m.to_str().unwrap();
    let limit: u64 = 256 << 20;
    for nobody in [false, true] {
        let audit = d.join(format!("audit-{nobody}.jsonl"));
        for tool in ["small", "node_small"] {
            let (o, _) = cordon_measured(nobody, &["run", tool, "-m", m], &audit);
            let (out, err) = text(&o);
            assert_eq!(
                o.status.code(),
                Some(0),
                "{tool} nobody={nobody}: {out}{err}"
            );
            assert_eq!(out.trim(), "64", "{tool} nobody={nobody}: {err}");
        }
        for tool in ["bomb", "node_bomb"] {
            let (o, rss) = cordon_measured(nobody, &["run", tool, "-m", m], &audit);
            let (out, err) = text(&o);
            assert_eq!(
                o.status.code(),
                Some(12),
                "{tool} nobody={nobody}: {out}{err}"
            );
            let want = if nobody {
                format!(
                    "{tool}: memory limit 256M exceeded (an allocation failed under RLIMIT_DATA, the limit without cgroups: "
                )
            } else {
                format!("{tool}: memory limit 256M exceeded (OOM kill)")
            };
            assert!(
                err.contains(&want),
                "{tool} nobody={nobody}: `{err}` lacks `{want}`"
            );
            eprintln!("{tool} nobody={nobody}: resident set {} MiB", rss >> 20);
            if !nobody {
                // The cgroup counts what the sandbox charged (memory.peak,
                // checked by the jail's tests), not the host's cached
                // program text its resident set also shows.
                continue;
            }
            assert!(
                rss <= limit + (32 << 20),
                "{tool} nobody={nobody}: resident set {} MiB under a 256 MiB limit",
                rss >> 20
            );
            if nobody && tool == "bomb" {
                // It did allocate up to the limit before it was stopped.
                assert!(rss >= limit - (32 << 20), "{tool}: only {} MiB", rss >> 20);
            }
        }
    }
}

/// `cordon serve` with `@modelcontextprotocol/server-filesystem` (Node.js)
/// under a 1 GiB memory limit: as uid 65534, on the rlimit fallback, it
/// starts and answers `list_allowed_directories` (it died at start under
/// the RLIMIT_AS fallback of the same size), and the result names the
/// fallback in its warnings; as root, with cgroups, it answers with none
/// (the control).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_mcp_server_answers_under_a_1g_limit_without_cgroups() {
    use cordon_mcp::rmcp::ServiceExt;
    use cordon_mcp::rmcp::model::CallToolRequestParams;
    use cordon_mcp::rmcp::transport::TokioChildProcess;
    let test = "a_node_mcp_server_answers_under_a_1g_limit_without_cgroups";
    if !need_root(test) {
        return;
    }
    let Some(npm) = npm_dir() else {
        skip::skip_or_fail(
            test,
            "server-filesystem is not installed under $CORDON_E2E_NPM or /var/cache/cordon-e2e/npm; run scripts/setup.sh",
        );
        return;
    };
    let d = dir("node");
    // A long start-up allowance: under emulation (the test bed of
    // tests/vm) Node.js takes over the default 20 s to initialize.
    let m = write(
        &d,
        "m.yaml",
        &format!(
            r#"accept: [cgroup]
tools:
  scratch:
    profile: P2
    network: none
    lifetime: session
    limits: {{wall_seconds: 30, memory: 1G, tasks: 64}}
    mounts: ["{npm}:/srv/npm"]
    mcp:
      command: ["/usr/bin/node", "/srv/npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js", "/tmp"]
      tools: {{allow: [list_allowed_directories]}}
      startup_seconds: 300
"#,
            npm = npm.display()
        ),
    );
    for nobody in [false, true] {
        let audit = d.join(format!("audit-{nobody}.jsonl"));
        let mut cmd = if nobody {
            let mut c = tokio::process::Command::new("/usr/bin/setpriv");
            c.args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "--",
                CORDON,
            ]);
            c
        } else {
            tokio::process::Command::new(CORDON)
        };
        cmd.args(["serve", "-m", m.to_str().unwrap()])
            .env("CORDON_AUDIT", &audit)
            .env("HOME", "/tmp");
        let (transport, _) = TokioChildProcess::builder(cmd)
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn cordon serve");
        let c = ().serve(transport).await.expect("initialize");
        let p = CallToolRequestParams::new("scratch__list_allowed_directories".to_owned());
        let r = c
            .peer()
            .call_tool(p)
            .await
            .unwrap_or_else(|e| panic!("nobody={nobody}: {e}"));
        let body: String = r
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect();
        assert_ne!(r.is_error, Some(true), "nobody={nobody}: {body}");
        assert!(body.contains("/tmp"), "nobody={nobody}: {body}");
        let w = r
            .meta
            .as_ref()
            .and_then(|m| m.0.get("cordon/warnings").cloned());
        if nobody {
            let w = w.map(|w| w.to_string()).unwrap_or_default();
            assert!(
                w.contains("cgroup: partial") && w.contains("RLIMIT_DATA"),
                "warnings: {w}"
            );
        } else {
            assert!(w.is_none(), "{w:?}");
        }
        let _ = c.cancel().await;
    }
}
