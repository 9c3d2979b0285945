//! Fail closed, everywhere: each path that used to run weaker than it said
//! now refuses, or names the degradation, and each test has its positive
//! control. Run as root; the unprivileged cases run as uid 65534 through
//! setpriv (a test that cannot do either fails).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const CORDON: &str = env!("CARGO_BIN_EXE_cordon");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn fixtures() -> PathBuf {
    repo()
        .join("crates/mcp/tests/fixtures")
        .canonicalize()
        .unwrap()
}

use cordon_testkit::is_root;

use cordon_testkit::skip;

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

/// A world-readable directory of its own.
fn dir(tag: &str) -> cordon_testkit::Scratch {
    let d = cordon_testkit::scratch::named(&format!("cordon-fc-{tag}-"));
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o777)).unwrap();
    d
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
    p
}

/// `cordon ARGS` as root (`nobody` false) or as uid 65534, stdin `input`,
/// with a state directory of its own (the records it cannot write are
/// counted there, not in the host's).
fn cordon(nobody: bool, args: &[&str], input: &[u8], audit: &Path) -> Output {
    let state = cordon_testkit::scratch::named("cordon-fc-state-");
    if nobody {
        std::os::unix::fs::chown(&state, Some(65534), Some(65534)).unwrap();
    }
    let mut cmd = if nobody {
        let mut c = Command::new("/usr/bin/setpriv");
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            CORDON,
        ]);
        c
    } else {
        Command::new(CORDON)
    };
    cmd.args(args)
        .env_remove("CORDON_MANIFEST")
        .env_remove("CORDON_AUDIT_FAIL_OPEN")
        // Set by `pyenv exec` (a shim running the test runner): it would
        // pick the version of the shims the tests below make.
        .env_remove("PYENV_VERSION")
        .env("CORDON_AUDIT", audit)
        .env("CORDON_STATE_DIR", state.path())
        .env("HOME", "/tmp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn cordon");
    {
        use std::io::Write;
        let mut si = child.stdin.take().unwrap();
        let _ = si.write_all(input);
    }
    child.wait_with_output().unwrap()
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// `cordon serve` probes every tool it serves, `mcp:` servers and egress
/// tools included, and does not serve the one whose sandbox leaks: an
/// `mcp:` server given a "debugging" mount of a host directory at /home.
/// The same server without the mount is served (the positive control).
///
/// Deterministic under load: a start probe that runs out of its 3 s wall
/// is inconclusive and runs again with a longer one (6, 12, 24 s), so a
/// loaded host neither refuses the sound tools nor passes the leaky one
/// (the retry decision is unit-tested in `src/probe.rs`, without timing).
/// Checked by running this file three times with both cores busy:
/// `stress-ng --cpu 4 --io 2 --timeout 1200s & for i in 1 2 3; do cargo test
/// -p cordon --test fail_closed; done` (on a 2-core host, load average
/// about 16-22 during the runs: 3 of 3 passed).
#[test]
fn serve_probes_every_tool_and_refuses_a_leaky_mcp_server_by_name() {
    if !need_root("serve_probes_every_tool_and_refuses_a_leaky_mcp_server_by_name") {
        return;
    }
    let d = dir("leaky");
    let bait = dir("leaky-bait");
    write(&bait, "notes.txt", "a host file");
    let fx = fixtures();
    let m = write(
        &d,
        "m.yaml",
        &format!(
            r#"tools:
  fetcher:
    profile: P2
    command: [/usr/bin/true]
    egress: ["api.example.com:443"]
    limits: {{wall_seconds: 5}}
  fx:
    profile: P2
    network: none
    limits: {{wall_seconds: 5, memory: 256M}}
    mounts: ["{fx}:/srv/fx"]
    mcp: {{command: [/usr/bin/python3, /srv/fx/fixture_server.py]}}
  leaky:
    profile: P2
    network: none
    limits: {{wall_seconds: 5, memory: 256M}}
    mounts: ["{fx}:/srv/fx", "{bait}:/home"]
    mcp: {{command: [/usr/bin/python3, /srv/fx/fixture_server.py]}}
"#,
            fx = fx.display(),
            bait = bait.display()
        ),
    );
    let audit = d.join("audit.jsonl");
    // stdin at end of file: serve probes, prints what it serves, and exits.
    let o = cordon(false, &["serve", "-m", m.to_str().unwrap()], b"", &audit);
    let (_, err) = text(&o);
    assert!(
        err.contains("leaky: refusing to start: ")
            && err.contains("host_fs Escaped: ")
            && err.contains("listed /home: 1 entries (notes.txt)"),
        "{err}"
    );
    let serving = err
        .lines()
        .find(|l| l.contains("serving MCP on stdio"))
        .unwrap_or_else(|| panic!("no serving line: {err}"));
    assert!(
        serving.contains("(tools: fetcher, fx)"),
        "the probed egress tool and the clean server are served, the leaky one is not: {serving}"
    );
    assert!(!err.contains("fx: refusing"), "{err}");
    assert!(!err.contains("fetcher: refusing"), "{err}");
}

/// P2 requires cgroup limits by default: where they are not in force (uid
/// 65534 here has no cgroup delegation, only the rlimit fallback) a P2 tool is refused at `check`
/// and at run time with the mechanism named; `accept: [cgroup]` runs it
/// on the rlimit fallback, said in the call's warnings and audit record.
/// As root the same manifest runs with cgroups (the positive control).
#[test]
fn a_required_mechanism_missing_refuses_and_an_accepted_one_is_named() {
    if !need_root("a_required_mechanism_missing_refuses_and_an_accepted_one_is_named") {
        return;
    }
    let d = dir("require");
    let strict = write(
        &d,
        "strict.yaml",
        "tools:\n  count:\n    profile: P2\n    command: [/usr/bin/wc, -c]\n    network: none\n",
    );
    let lenient = write(
        &d,
        "lenient.yaml",
        "accept: [cgroup]\ntools:\n  count:\n    profile: P2\n    command: [/usr/bin/wc, -c]\n    network: none\n",
    );
    let audit = d.join("audit.jsonl");
    let s = strict.to_str().unwrap();
    let l = lenient.to_str().unwrap();

    // Positive control: root has cgroups.
    let o = cordon(false, &["check", "-m", s], b"", &audit);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    let o = cordon(false, &["run", "count", "-m", s], b"abc", &audit);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    assert_eq!(text(&o).0.trim(), "3");

    // Unprivileged: refused, with the mechanism named.
    let audit = d.join("audit-nobody.jsonl");
    let o = cordon(true, &["check", "-m", s], b"", &audit);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(
        err.contains(&format!("{s}:3:5: tool `count`: would not start here: refused: required mechanism not enforced on this host: cgroup: partial")),
        "{err}"
    );
    assert!(err.contains("`accept: [cgroup]`"), "{err}");
    let o = cordon(true, &["run", "count", "-m", s], b"abc", &audit);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(21), "{out}{err}");
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("cgroup: partial"), "{err}");

    // Accepted: it runs, and says so in the result and the audit record.
    let o = cordon(true, &["check", "-m", l], b"", &audit);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    let o = cordon(true, &["run", "count", "-m", l, "--json"], b"abc", &audit);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let warnings = v["warnings"].to_string();
    assert!(
        warnings.contains("cgroup: partial") && warnings.contains("[accepted]"),
        "{v}"
    );
    let log = std::fs::read_to_string(&audit).unwrap();
    let last: serde_json::Value = serde_json::from_str(log.lines().last().unwrap()).unwrap();
    assert_eq!(last["tool"], "count");
    assert!(
        last["warnings"].to_string().contains("[accepted]"),
        "{last}"
    );
}

/// `cordon check` admits every tool on this host: a program that does not
/// exist, an interpreter that is a dangling symlink as the sandbox sees it,
/// and a missing mount source are each refused by name; a mount whose mode
/// is not `ro`/`rw` is an error with its line. The valid manifest passes.
#[test]
fn check_refuses_what_would_not_start_here() {
    let d = dir("check");
    let audit = d.join("audit.jsonl");
    let tools = dir("check-tools");
    // A script whose interpreter is a venv-style symlink into a directory
    // the sandbox does not see.
    std::os::unix::fs::symlink("/home/nobody-here/.pyenv/bin/python3", tools.join("python"))
        .unwrap();
    let script = write(&tools, "run.py", "#!/opt/tool/python\nprint('hi')\n");
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let good = write(
        &d,
        "good.yaml",
        "tools:\n  count:\n    profile: P1\n    command: [/usr/bin/wc]\n    mounts: [\"/usr/share/doc:/opt/doc:ro\"]\n",
    );
    let o = cordon(false, &["check", "-m", good.to_str().unwrap()], b"", &audit);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    assert!(
        text(&o).0.contains("every tool would start on this host"),
        "{:?}",
        text(&o)
    );

    let bad = write(
        &d,
        "bad.yaml",
        &format!(
            "tools:\n  nocmd:\n    profile: P1\n    command: [/usr/bin/no-such-program]\n  venv:\n    profile: P1\n    command: [/opt/tool/run.py]\n    mounts: [\"{t}:/opt/tool\"]\n  nosrc:\n    profile: P1\n    command: [/usr/bin/wc]\n    mounts: [\"/no/such/dir:/opt/x\"]\n",
            t = tools.display()
        ),
    );
    let o = cordon(false, &["check", "-m", bad.to_str().unwrap()], b"", &audit);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(out.contains("3 would not start on this host"), "{out}{err}");
    // Each reason once, as a diagnostic at the manifest's line (the
    // tool's, or the mount's), with what to do.
    let b = bad.display();
    assert!(
        err.contains(&format!(
            "{b}:3:5: tool `nocmd`: would not start here: program /usr/bin/no-such-program "
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!("{b}:6:5: tool `venv`: would not start here: "))
            && err.contains("/home/nobody-here/.pyenv/bin/python3"),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "{b}:12:14: tool `nosrc`: would not start here: bind source /no/such/dir (for /opt/x) does not exist on the host\n  hint: create /no/such/dir on this host"
        )),
        "{err}"
    );
    assert_eq!(err.matches("/no/such/dir (for").count(), 1, "{err}");
    // Placed by the mount each reason is about, not by its text: one
    // source is the start of the other's, each reason at its own line.
    let spaced = write(
        &d,
        "spaced.yaml",
        "tools:\n  spaced:\n    profile: P1\n    command: [/usr/bin/wc]\n    mounts:\n      - \"/no/such:/opt/x\"\n      - \"/no/such dir:/opt/y\"\n",
    );
    let o = cordon(
        false,
        &["check", "-m", spaced.to_str().unwrap()],
        b"",
        &audit,
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    let s = spaced.display();
    for (line, src, dst) in [(6, "/no/such", "/opt/x"), (7, "/no/such dir", "/opt/y")] {
        assert!(
            err.contains(&format!(
                "{s}:{line}:9: tool `spaced`: would not start here: bind source {src} (for {dst}) does not exist on the host\n  hint: create {src} on this host"
            )),
            "{err}"
        );
    }
    // The same manifest without host checks is valid.
    let o = cordon(
        false,
        &["check", "--no-host", "-m", bad.to_str().unwrap()],
        b"",
        &audit,
    );
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));

    let syntax = write(
        &d,
        "syntax.yaml",
        "tools:\n  count:\n    profile: P1\n    command: [/usr/bin/wc]\n    mounts:\n      - \"/usr/share/doc:/opt/doc:ro\"\n      - \"/usr/share/doc:/opt/doc2:xx\"\n",
    );
    let o = cordon(
        false,
        &["check", "-m", syntax.to_str().unwrap()],
        b"",
        &audit,
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(
        err.contains(":7:") && err.contains("`xx` is not a mode (write `ro` or `rw`)"),
        "{err}"
    );
}

/// A version manager's shim as the program (or a script's `#!`
/// interpreter) runs the manager, which needs the whole home: `cordon
/// check` refuses it at the tool's line, naming the real interpreter to
/// write, even when its directory is mounted (the sandbox could exec the
/// shim). The real interpreter passes (the positive control).
#[test]
fn check_refuses_a_version_manager_shim() {
    let d = dir("shim");
    let audit = d.join("audit.jsonl");
    let root = d.join("home/.pyenv");
    std::fs::create_dir_all(root.join("shims")).unwrap();
    let shim = write(
        &root.join("shims"),
        "python3",
        "#!/usr/bin/env bash\nexec \"$PYENV_ROOT/libexec/pyenv\" exec python3 \"$@\"\n",
    );
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = root.join("versions/3.12.1/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink("/usr/bin/python3", bin.join("python3")).unwrap();
    write(&root, "version", "3.12.1\n");
    let script = write(
        &d,
        "server.py",
        &format!("#!{}\nprint('hi')\n", shim.display()),
    );
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let m = write(
        &d,
        "m.yaml",
        &format!(
            "tools:\n  shim:\n    profile: P1\n    command: [{s}]\n    mounts: [\"{r}\"]\n  script:\n    profile: P1\n    command: [{p}]\n    mounts: [\"{r}\", \"{p}\"]\n  real:\n    profile: P1\n    command: [/usr/bin/python3, -c, pass]\n",
            s = shim.display(),
            r = root.display(),
            p = script.display()
        ),
    );
    let o = cordon(false, &["check", "-m", m.to_str().unwrap()], b"", &audit);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(out.contains("2 would not start on this host"), "{out}{err}");
    let real = std::fs::canonicalize("/usr/bin/python3").unwrap();
    assert!(
        err.contains(&format!(
            "{}:3:5: tool `shim`: would not start here: program {} is a pyenv shim",
            m.display(),
            shim.display()
        )) && err.contains(&format!(
            "hint: write the real program in its place: {}",
            real.display()
        )),
        "{err}"
    );
    assert!(
        err.contains(&format!(
            "{}:7:5: tool `script`: would not start here: the #! interpreter of {}: {} is a pyenv shim",
            m.display(),
            script.display(),
            shim.display()
        )),
        "{err}"
    );
    assert!(!err.contains("tool `real`"), "{err}");
}

/// The audit log is fail-closed: a log that cannot be opened, or a record
/// that cannot be written (`/dev/full`), fails the call with status 22 and
/// withholds its output; `--audit-fail-open` keeps going, announced.
#[test]
fn an_unwritable_audit_log_fails_the_call() {
    let d = dir("audit");
    let cant_open = d.join("no-such-dir/sub/audit.jsonl");
    std::fs::write(d.join("no-such-dir"), "a file, not a directory").unwrap();
    for audit in [cant_open.as_path(), Path::new("/dev/full")] {
        let o = cordon(false, &["exec", "--", "/bin/echo", "secret"], b"", audit);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(22), "{audit:?}: {out}{err}");
        assert!(!out.contains("secret"), "output withheld: {out}");
        assert!(err.contains("audit"), "{err}");
        let o = cordon(
            false,
            &["exec", "--audit-fail-open", "--", "/bin/echo", "secret"],
            b"",
            audit,
        );
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(0), "{audit:?}: {out}{err}");
        assert_eq!(out.trim(), "secret");
        assert!(err.contains("audit"), "the fallback is announced: {err}");
    }
    // Positive control: a writable log.
    let ok = d.join("audit.jsonl");
    let o = cordon(false, &["exec", "--", "/bin/echo", "secret"], b"", &ok);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    assert!(
        std::fs::read_to_string(&ok)
            .unwrap()
            .contains("\"tool\":\"exec\"")
    );
}

/// `cordon probe`: a tool that cannot be probed here counts against the
/// run (status 3, never 0), and is reported by name; an escape elsewhere
/// would still win (status 1, see the unit test of `combined_exit`).
#[test]
fn probe_counts_an_unprobeable_tool() {
    let d = dir("probe");
    let audit = d.join("audit.jsonl");
    let m = write(
        &d,
        "m.yaml",
        "tools:\n  count:\n    profile: P1\n    command: [/usr/bin/wc]\n    limits: {wall_seconds: 3}\n  browser:\n    profile: P3\n    runtime: microvm\n    command: [/usr/bin/true]\n",
    );
    let o = cordon(
        false,
        &["probe", "-m", m.to_str().unwrap(), "--only", "control"],
        b"",
        &audit,
    );
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(3), "{out}{err}");
    assert!(
        out.contains("NOT PROBED tool browser: ") && out.contains("runtime microvm runs an image"),
        "{out}"
    );
    assert!(out.contains("HELD     control"), "{out}");
    // Positive control: the probeable tool alone holds.
    let o = cordon(
        false,
        &[
            "probe",
            "-m",
            m.to_str().unwrap(),
            "--tool",
            "count",
            "--only",
            "control",
        ],
        b"",
        &audit,
    );
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
}

/// Over MCP, every mechanism a sandbox does not fully enforce reaches the
/// client in the result's `_meta` and the call's audit record: as uid
/// 65534 here (no cgroups) with `accept: [cgroup]`, for a command tool and
/// for an `mcp:` server. As root, where everything is enforced, there are
/// none (the positive control).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_results_carry_the_sandbox_warnings() {
    use cordon_mcp::rmcp::ServiceExt;
    use cordon_mcp::rmcp::model::CallToolRequestParams;
    use cordon_mcp::rmcp::transport::TokioChildProcess;
    if !need_root("mcp_results_carry_the_sandbox_warnings") {
        return;
    }
    let d = dir("mcp-warn");
    let fx = fixtures();
    let m = write(
        &d,
        "m.yaml",
        &format!(
            r#"accept: [cgroup]
tools:
  count:
    profile: P1
    command: [/usr/bin/wc, -c]
    input: {{stdin: text}}
    input_schema: {{type: object, properties: {{text: {{type: string}}}}, required: [text]}}
  fx:
    profile: P2
    network: none
    limits: {{wall_seconds: 10, memory: 256M}}
    mounts: ["{fx}:/srv/fx"]
    mcp: {{command: [/usr/bin/python3, /srv/fx/fixture_server.py], tools: {{allow: [echo]}}}}
"#,
            fx = fx.display()
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
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn cordon serve");
        let c = ().serve(transport).await.expect("initialize");
        for (tool, arg) in [("count", "text"), ("fx__echo", "text")] {
            let mut p = CallToolRequestParams::new(tool.to_owned());
            p.arguments = serde_json::json!({ arg: "abc" }).as_object().cloned();
            let r = c.peer().call_tool(p).await.expect(tool);
            let w = r
                .meta
                .as_ref()
                .and_then(|m| m.0.get("cordon/warnings").cloned());
            if nobody {
                let w = w.unwrap_or_else(|| panic!("{tool}: no warnings in {:?}", r.meta));
                assert!(
                    w.to_string().contains("cgroup: partial")
                        && w.to_string().contains("[accepted]"),
                    "{tool}: {w}"
                );
            } else {
                assert!(w.is_none(), "{tool}: {w:?}");
            }
        }
        let _ = c.cancel().await;
        let log = std::fs::read_to_string(&audit).unwrap();
        for tool in ["count", "fx__echo"] {
            let rec = log
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|r| r["tool"] == tool)
                .unwrap_or_else(|| panic!("no record of {tool}: {log}"));
            assert_eq!(
                rec["warnings"].to_string().contains("cgroup: partial"),
                nobody,
                "{tool}: {rec}"
            );
        }
    }
}
