//! `cordon import`, `wrap`/`unwrap` and `inventory` on real client
//! configuration files of every format (written here), pointed at the
//! reference servers scripts/setup.sh installs: each imported manifest is
//! checked clean and served; a wrapped configuration, started by the
//! official Python MCP SDK client, lists the same tools under cordon's
//! names; unwrap gives back the original byte for byte.
//!
//! Test files live in the tests' scratch directories, never under /tmp
//! wherever the checkout is: the sandbox builds its own /tmp, so a host
//! path there cannot be mounted at the same place (import refuses it, see
//! `odd_entries_are_refused`).

mod common;
use common::*;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

const CORDON: &str = env!("CARGO_BIN_EXE_cordon");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A fresh scratch directory (see `cordon_testkit::scratch`), removed on
/// drop.
fn dir() -> TempDir {
    cordon_testkit::scratch::named("import-")
}

/// `cordon ARGS` with its state and audit in `d`.
fn cordon(d: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(CORDON);
    c.args(args)
        .env("CORDON_STATE_DIR", d.join("state"))
        .env("CORDON_AUDIT", d.join("audit.jsonl"))
        .env_remove("CORDON_MANIFEST")
        .env_remove("CORDON_PROVIDERS")
        // Set by `pyenv exec` (a pyenv shim runs the test runner on many
        // machines): it would pick the version of the shims tests below.
        .env_remove("PYENV_VERSION");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn out(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The reference servers' package tree, or `None` (the test has failed,
/// or been skipped when skipping is allowed).
fn servers() -> Option<(PathBuf, PathBuf)> {
    let Some(npm) = npm_dir() else {
        skip_or_fail(
            &this_test(),
            "server-everything is not installed under $CORDON_E2E_NPM or /var/cache/cordon-e2e/npm; run scripts/setup.sh",
        );
        return None;
    };
    let m = npm.join("node_modules/@modelcontextprotocol");
    let fs = m.join("server-filesystem/dist/index.js");
    if !fs.is_file() {
        skip_or_fail(
            &this_test(),
            "server-filesystem is not installed; run scripts/setup.sh",
        );
        return None;
    }
    Some((m.join("server-everything/dist/index.js"), fs))
}

/// Import `files` into `d/cordon.yaml` with `--yes`.
fn import(d: &Path, files: &[&Path], extra: &[&str]) -> Output {
    let m = d.join("cordon.yaml");
    let mut args = vec!["import", "--yes", "-o", m.to_str().unwrap()];
    args.extend(extra);
    args.extend(files.iter().map(|f| f.to_str().unwrap()));
    cordon(d, &args, &[])
}

fn write(p: &Path, text: &str) -> PathBuf {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
    p.to_path_buf()
}

/// The manifest's tools, resolved.
fn tools(m: &Path) -> BTreeMap<String, cordon_policy::ToolPolicy> {
    let loaded = cordon_policy::load(m).unwrap_or_else(|e| panic!("{e}"));
    loaded.policy.tools.into_iter().collect()
}

fn argv(t: &cordon_policy::ToolPolicy) -> Vec<String> {
    match &t.exec {
        cordon_policy::policy::Exec::Mcp { command, .. } => command.clone().unwrap_or_default(),
        other => panic!("{}: not an mcp tool: {other:?}", t.name),
    }
}

/// `cordon check` of the manifest passes with no warning at all.
fn check_clean(d: &Path) {
    let m = d.join("cordon.yaml");
    let o = cordon(d, &["check", "-m", m.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", out(&o));
    assert!(!stderr(&o).contains("warning"), "{}", out(&o));
}

/// A provider file with one exec provider (the default), mode 0600.
fn providers(d: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = write(
        &d.join("providers.yaml"),
        "default: mint\nproviders:\n  mint:\n    type: exec\n    command: [\"/bin/true\"]\n",
    );
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

/// One configuration file of every format, each naming one reference
/// server in that format's own shape, with `node` relative (on PATH).
fn every_format(
    d: &Path,
    everything: &Path,
    fs: &Path,
    data: &Path,
) -> Vec<(PathBuf, &'static str)> {
    let (e, f, data) = (everything.display(), fs.display(), data.display());
    vec![
        (
            write(
                &d.join("claude/claude_desktop_config.json"),
                &format!(
                    r#"{{"mcpServers": {{"everything": {{"command": "node", "args": ["{e}", "stdio"]}}}}}}"#
                ),
            ),
            "everything",
        ),
        (
            write(
                &d.join("proj/.mcp.json"),
                &format!(
                    r#"{{"mcpServers": {{"files": {{"type": "stdio", "command": "node", "args": ["{f}", "{data}"], "env": {{}}}}}}}}"#
                ),
            ),
            "files",
        ),
        (
            write(
                &d.join("home/.claude.json"),
                &format!(
                    r#"{{"numStartups": 3, "projects": {{"{p}": {{"mcpServers": {{"proj-files": {{"command": "node", "args": ["{f}", "${{CLAUDE_PROJECT_DIR}}/data"]}}}}}}}}}}"#,
                    p = d.display()
                ),
            ),
            "proj-files",
        ),
        (
            write(
                &d.join("c/.cursor/mcp.json"),
                &format!(
                    r#"{{"mcpServers": {{"cursor-everything": {{"command": "node", "args": ["{e}"]}}}}}}"#
                ),
            ),
            "cursor-everything",
        ),
        (
            write(
                &d.join("v/.vscode/mcp.json"),
                &format!(
                    r#"{{
  // VS Code: JSON with comments and trailing commas.
  "inputs": [
    {{"type": "promptString", "id": "api-key", "description": "The API key", "password": true}},
  ],
  "servers": {{
    "vsc-everything": {{
      "type": "stdio",
      "command": "node",
      "args": ["{e}", "stdio"], /* the reference server */
      "env": {{"API_KEY": "${{input:api-key}}"}},
    }},
  }},
}}
"#
                ),
            ),
            "vsc-everything",
        ),
        (
            write(
                &d.join("w/.codeium/windsurf/mcp_config.json"),
                &format!(
                    r#"{{"mcpServers": {{"windsurf-everything": {{"command": "node", "args": ["{e}"], "disabled": false}}}}}}"#
                ),
            ),
            "windsurf-everything",
        ),
        (
            write(
                &d.join("z/.config/zed/settings.json"),
                &format!(
                    r#"// Zed settings
{{
  "theme": "One Dark",
  "context_servers": {{
    "zed-nested": {{"source": "custom", "command": {{"path": "node", "args": ["{e}"], "env": {{}}}}}},
    "zed-flat": {{"command": "node", "args": ["{f}", "{data}"]}},
  }}
}}"#
                ),
            ),
            "zed-nested",
        ),
        (
            write(
                &d.join("k/.continue/config.yaml"),
                &format!(
                    "name: my assistant\nmcpServers:\n  - name: continue-everything\n    command: node\n    args:\n      - \"{e}\"\n"
                ),
            ),
            "continue-everything",
        ),
        (
            write(
                &d.join("k2/.continue/config.json"),
                &format!(
                    r#"{{"experimental": {{"modelContextProtocolServers": [{{"name": "continue-old", "transport": {{"type": "stdio", "command": "node", "args": ["{e}"]}}}}]}}}}"#
                ),
            ),
            "continue-old",
        ),
        (
            write(
                &d.join("g/.gemini/settings.json"),
                &format!(
                    r#"{{"mcpServers": {{"gemini-files": {{"command": "node", "args": ["{f}", "{data}"], "cwd": "{data}", "timeout": 30000}}}}}}"#
                ),
            ),
            "gemini-files",
        ),
        (
            write(
                &d.join("x/.codex/config.toml"),
                &format!(
                    "model = \"o3\"\n\n[mcp_servers.codex-everything]\ncommand = \"node\"\nargs = [\"{e}\"]\n\n[mcp_servers.codex-everything.env]\nLOG_LEVEL = \"info\"\n"
                ),
            ),
            "codex-everything",
        ),
    ]
}

/// Every format is read into a manifest that `cordon check` passes with
/// no warning, whose tools run node with the server's script on a
/// read-only mount of its package tree, and that `cordon serve` serves.
#[test]
fn every_format_is_imported_checked_and_served() {
    let Some((everything, fs)) = servers() else {
        return;
    };
    let d = dir();
    let data = d.path().join("data");
    write(&data.join("note.txt"), "hello from a file");
    let configs = every_format(d.path(), &everything, &fs, &data);
    let npm_root = everything
        .ancestors()
        .find(|p| p.ends_with("node_modules"))
        .unwrap()
        .to_path_buf();
    for (cfg, server) in &configs {
        let sub = d.path().join(format!("m-{server}"));
        std::fs::create_dir_all(&sub).unwrap();
        let o = import(&sub, &[cfg], &[]);
        assert!(o.status.success(), "{}: {}", cfg.display(), out(&o));
        if *server == "vsc-everything" {
            // Its secret: a provider, and the one warning import wrote
            // down as the secret's comment.
            let m = sub.join("cordon.yaml");
            let p = providers(&sub);
            let o = cordon(
                &sub,
                &[
                    "check",
                    "-m",
                    m.to_str().unwrap(),
                    "--providers",
                    p.to_str().unwrap(),
                ],
                &[],
            );
            assert!(o.status.success(), "{}", out(&o));
            let warnings: Vec<&str> = std::str::from_utf8(&o.stderr)
                .unwrap()
                .lines()
                .filter(|l| l.starts_with("warning"))
                .collect();
            assert_eq!(warnings.len(), 1, "{}", out(&o));
            assert!(warnings[0].contains("`deliver: env`"), "{}", out(&o));
            let text = std::fs::read_to_string(&m).unwrap();
            assert!(
                text.contains(
                    "# `deliver: env` (the server holds the token itself, and `cordon check` warns)"
                ),
                "{text}"
            );
        } else {
            check_clean(&sub);
        }
        let t = tools(&sub.join("cordon.yaml"));
        let tool = t
            .get(*server)
            .unwrap_or_else(|| panic!("{}: no tool {server}: {t:?}", cfg.display()));
        let a = argv(tool);
        assert_eq!(a[0], "/usr/bin/node", "{a:?}");
        assert!(
            a[1] == everything.display().to_string() || a[1] == fs.display().to_string(),
            "{a:?}"
        );
        assert!(
            tool.mounts
                .iter()
                .any(|m| Path::new(&m.src) == npm_root && !m.writable),
            "{:?}",
            tool.mounts
        );
        assert!(
            matches!(tool.network, cordon_policy::policy::Network::None),
            "{:?}",
            tool.network
        );
        if a[1] == fs.display().to_string() {
            // The directory the server is given, mounted read-only.
            assert_eq!(a.last().unwrap(), &data.display().to_string(), "{a:?}");
            assert!(
                tool.mounts
                    .iter()
                    .any(|m| Path::new(&m.src) == data && !m.writable),
                "{:?}",
                tool.mounts
            );
        }
    }
    // VS Code's prompted input is a secret, never a value; `check` with a
    // provider then flags nothing but what import wrote as a comment.
    let vsc = std::fs::read_to_string(d.path().join("m-vsc-everything/cordon.yaml")).unwrap();
    assert!(vsc.contains("name: \"API_KEY\""), "{vsc}");
    assert!(!vsc.contains("input:api-key"), "{vsc}");

    // Zed's two forms in one file; Codex's env table kept as env.
    let zed = tools(&d.path().join("m-zed-nested/cordon.yaml"));
    assert!(zed.contains_key("zed-flat"), "{zed:?}");
    let codex = tools(&d.path().join("m-codex-everything/cordon.yaml"));
    assert_eq!(codex["codex-everything"].env["LOG_LEVEL"], "info");

    // All of them at once, served: the listing of both reference servers
    // through `cordon serve` (rmcp client over stdio).
    let all = d.path().join("all");
    std::fs::create_dir_all(&all).unwrap();
    // Three files, four servers (serve starts and probes each).
    let files: Vec<&Path> = configs
        .iter()
        .filter(|(_, s)| ["everything", "files", "zed-nested"].contains(s))
        .map(|(c, _)| c.as_path())
        .collect();
    let o = import(&all, &files, &[]);
    assert!(o.status.success(), "{}", out(&o));
    check_clean(&all);
    let names = served_tools(&all.join("cordon.yaml"), &all);
    for want in [
        "everything__echo",
        "files__read_text_file",
        "zed-flat__list_directory",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} not in {names:?}");
    }
}

/// The tool names `cordon serve -m M` lists (rmcp client over stdio).
fn served_tools(m: &Path, d: &Path) -> Vec<String> {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = Serve::new(CORDON)
            .arg("-m")
            .arg(m)
            .env("CORDON_AUDIT", d.join("audit.jsonl"))
            .env("CORDON_STATE_DIR", d.join("state"))
            .stdio((), std::process::Stdio::inherit())
            .await;
        let tools = client.list_all_tools().await.expect("tools/list");
        let _ = client.cancel().await;
        let mut names: Vec<String> = tools.iter().map(|t| t.name.to_string()).collect();
        names.sort();
        names
    })
}

/// What cannot be mapped is refused, naming the server and the field,
/// and nothing is written; the same file with those servers left out
/// imports (the positive control).
#[test]
fn odd_entries_are_refused_naming_server_and_field() {
    let Some((everything, _)) = servers() else {
        return;
    };
    let d = dir();
    let e = everything.display();
    let cfg = write(
        &d.path().join("claude_desktop_config.json"),
        &format!(
            r#"{{"mcpServers": {{
  "good": {{"command": "node", "args": ["{e}"]}},
  "win": {{"command": "C:\\Program Files\\nodejs\\node.exe", "args": ["server.js"]}},
  "winarg": {{"command": "node", "args": ["C:\\Users\\me\\server.js"]}},
  "shell": {{"command": "bash", "args": ["-c", "node {e} | tee log"]}},
  "pipeline": {{"command": "node {e} | tee log"}},
  "unset": {{"command": "node", "args": ["${{CORDON_TEST_NOT_SET_ANYWHERE}}/server.js"]}},
  "prompt": {{"command": "node", "args": ["{e}", "${{input:dir}}"]}},
  "remote": {{"url": "https://mcp.example.com/sse"}},
  "remote2": {{"httpUrl": "https://mcp.example.com/mcp"}},
  "envfile": {{"command": "node", "args": ["{e}"], "envFile": "${{workspaceFolder}}/.env"}},
  "intmp": {{"command": "node", "args": ["{e}", "/tmp"]}}
}}}}"#
        ),
    );
    let o = import(d.path(), &[&cfg], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    let err = stderr(&o);
    for (server, field, why) in [
        ("win", "command", "Windows path"),
        ("winarg", "args[0]", "Windows path"),
        ("shell", "command", "is a shell"),
        ("pipeline", "command", "shell command line"),
        (
            "unset",
            "args[0]",
            "`CORDON_TEST_NOT_SET_ANYWHERE` is not set",
        ),
        ("prompt", "args[1]", "${input:dir}"),
        ("remote", "url", "remote servers are not yet supported"),
        ("remote2", "httpUrl", "remote servers are not yet supported"),
        ("envfile", "envFile", "is read by the client at start"),
        ("intmp", "args[1]", "is under /tmp"),
    ] {
        let line = err
            .lines()
            .find(|l| l.contains(&format!("server `{server}`:")))
            .unwrap_or_else(|| panic!("no refusal of {server}: {err}"));
        assert!(line.contains(&format!("`{field}`")), "{line}");
        assert!(line.contains(why), "{line}");
    }
    assert!(!err.contains("server `good`"), "{err}");
    assert!(!d.path().join("cordon.yaml").exists());

    // The positive control: the rest of the file imports.
    let mut skip = Vec::new();
    for s in [
        "win", "winarg", "shell", "pipeline", "unset", "prompt", "remote", "remote2", "envfile",
        "intmp",
    ] {
        skip.push("--skip");
        skip.push(s);
    }
    let o = import(d.path(), &[&cfg], &skip);
    assert!(o.status.success(), "{}", out(&o));
    let t = tools(&d.path().join("cordon.yaml"));
    assert_eq!(t.keys().collect::<Vec<_>>(), ["good"]);
    // And an expansion that is set resolves.
    let cfg2 = write(
        &d.path().join("b/claude_desktop_config.json"),
        r#"{"mcpServers": {"set": {"command": "node", "args": ["${CORDON_TEST_SERVER}", "${MODE:-stdio}"]}}}"#,
    );
    let m2 = d.path().join("b/cordon.yaml");
    let o = cordon(
        d.path(),
        &[
            "import",
            "--yes",
            "-o",
            m2.to_str().unwrap(),
            cfg2.to_str().unwrap(),
        ],
        &[("CORDON_TEST_SERVER", &e.to_string())],
    );
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(
        argv(&tools(&m2)["set"]),
        ["/usr/bin/node".to_string(), e.to_string(), "stdio".into()]
    );
}

/// Credentials (by name, by shape, or prompted) become `secrets` entries
/// and their values never reach the manifest; other values stay `env`.
/// Hosts in URLs become the egress allowlist; a known API server gets its
/// API's host; a secret on a tool with one egress entry stays in the door.
#[test]
fn credentials_become_secrets_and_urls_egress() {
    let d = dir();
    let node = "/usr/bin/node";
    let script = d.path().join("srv/index.js");
    write(&script, "// a local server\n");
    let data = d.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    let cfg = write(
        &d.path().join("proj/.mcp.json"),
        &format!(
            r#"{{"mcpServers": {{
  "github": {{"command": "npx", "args": ["-y", "@modelcontextprotocol/server-github"],
             "env": {{"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_0123456789abcdefghijABCDEFGHIJ012345"}}}},
  "api": {{"command": "{node}", "args": ["{s}", "--base=https://api.example.com/v2"],
          "env": {{"UPSTREAM_CONFIG": "q8Zr2vKx9Lm4Np7Ts1Wy6Bc3Df5Gh0Jk", "LOG_LEVEL": "debug", "DB_PASSWORD": "hunter2",
                   "DATA_DIR": "{data}"}}}}
}}}}"#,
            s = script.display(),
            data = data.display()
        ),
    );
    // npx needs cordon's store (cordon add); leave that server out here.
    let o = import(d.path(), &[&cfg], &["--skip", "github"]);
    assert!(o.status.success(), "{}", out(&o));
    let text = std::fs::read_to_string(d.path().join("cordon.yaml")).unwrap();
    for value in ["q8Zr2vKx9Lm4Np7Ts1Wy6Bc3Df5Gh0Jk", "hunter2", "ghp_"] {
        assert!(!text.contains(value), "{value} copied: {text}");
    }
    let t = tools(&d.path().join("cordon.yaml"));
    let api = &t["api"];
    let secrets: Vec<&str> = api.secrets.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(secrets, ["DB_PASSWORD", "UPSTREAM_CONFIG"]);
    assert_eq!(api.env["LOG_LEVEL"], "debug");
    assert!(!api.env.contains_key("DB_PASSWORD"));
    match &api.network {
        cordon_policy::policy::Network::Allowlist { allow, .. } => {
            assert_eq!(allow, &["api.example.com:443".to_string()])
        }
        other => panic!("{other:?}"),
    }
    // One egress entry: the secrets are the door's (proxy delivery).
    assert!(
        api.secrets
            .iter()
            .all(|s| s.deliver == cordon_policy::manifest::Deliver::Proxy),
        "{:?}",
        api.secrets
    );
    // The script's directory, read-only.
    assert!(
        api.mounts
            .iter()
            .any(|m| Path::new(&m.src) == script.parent().unwrap() && !m.writable),
        "{:?}",
        api.mounts
    );
    // A host path in a variable: kept, and mounted read-only.
    assert_eq!(api.env["DATA_DIR"], data.display().to_string());
    assert!(
        api.mounts
            .iter()
            .any(|m| Path::new(&m.src) == data && !m.writable),
        "{:?}",
        api.mounts
    );
    // Valid (no provider file here: the manifest alone).
    let o = cordon(
        d.path(),
        &[
            "check",
            "--no-host",
            "-m",
            d.path().join("cordon.yaml").to_str().unwrap(),
        ],
        &[],
    );
    assert!(o.status.success(), "{}", out(&o));
    assert!(
        !stderr(&o).contains("looks like a credential"),
        "{}",
        out(&o)
    );
}

/// A server named in two files: the same definition is imported once
/// (both files named in its comment); different ones are refused naming
/// both files.
#[test]
fn duplicates_across_files() {
    let Some((everything, fs)) = servers() else {
        return;
    };
    let d = dir();
    let a = write(
        &d.path().join("a/.cursor/mcp.json"),
        &format!(
            r#"{{"mcpServers": {{"ref": {{"command": "node", "args": ["{}"]}}}}}}"#,
            everything.display()
        ),
    );
    let b = write(
        &d.path().join("b/claude_desktop_config.json"),
        &format!(
            r#"{{"mcpServers": {{"ref": {{"command": "node", "args": ["{}"]}}}}}}"#,
            everything.display()
        ),
    );
    let c = write(
        &d.path().join("c/.mcp.json"),
        &format!(
            r#"{{"mcpServers": {{"ref": {{"command": "node", "args": ["{}", "/srv"]}}}}}}"#,
            fs.display()
        ),
    );
    let o = import(d.path(), &[&a, &b], &[]);
    assert!(o.status.success(), "{}", out(&o));
    let text = std::fs::read_to_string(d.path().join("cordon.yaml")).unwrap();
    assert_eq!(tools(&d.path().join("cordon.yaml")).len(), 1);
    assert!(text.contains(&b.display().to_string()), "{text}");

    let m = d.path().join("other.yaml");
    let o = cordon(
        d.path(),
        &[
            "import",
            "--yes",
            "-o",
            m.to_str().unwrap(),
            a.to_str().unwrap(),
            c.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    let err = stderr(&o);
    assert!(
        err.contains("server `ref`")
            && err.contains("defined differently")
            && err.contains(&a.display().to_string())
            && err.contains(&c.display().to_string()),
        "{err}"
    );
    assert!(!m.exists());
}

/// An existing manifest is never overwritten without --force.
#[test]
fn never_overwrites_without_force() {
    let Some((everything, _)) = servers() else {
        return;
    };
    let d = dir();
    let cfg = write(
        &d.path().join("claude_desktop_config.json"),
        &format!(
            r#"{{"mcpServers": {{"ref": {{"command": "node", "args": ["{}"]}}, "off": {{"command": "node", "disabled": true}}}}}}"#,
            everything.display()
        ),
    );
    std::fs::write(d.path().join("cordon.yaml"), "mine\n").unwrap();
    let o = import(d.path(), &[&cfg], &[]);
    assert!(!o.status.success(), "{}", out(&o));
    assert!(stderr(&o).contains("exists; pass --force"), "{}", out(&o));
    assert_eq!(
        std::fs::read_to_string(d.path().join("cordon.yaml")).unwrap(),
        "mine\n"
    );
    let o = import(d.path(), &[&cfg], &["--force"]);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(
        tools(&d.path().join("cordon.yaml"))
            .keys()
            .collect::<Vec<_>>(),
        ["ref"]
    );
    // A disabled server is left out, and the header says so.
    let text = std::fs::read_to_string(d.path().join("cordon.yaml")).unwrap();
    assert!(text.contains("# Not imported: off (disabled in "), "{text}");
}

fn python_mcp() -> Result<(), String> {
    match Command::new("python3").args(["-c", "import mcp"]).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr)
            .lines()
            .last()
            .unwrap_or("")
            .trim()
            .to_owned()),
        Err(e) => Err(format!("python3: {e}")),
    }
}

/// The tools each stdio server of `config` lists to the Python SDK client
/// started exactly as the configuration says.
fn client_tools(d: &Path, config: &Path, key: &str) -> BTreeMap<String, Vec<String>> {
    let o = Command::new("python3")
        .arg(repo().join("tests/e2e/mcp_list_tools.py"))
        .arg(config)
        .arg(key)
        .env("CORDON_STATE_DIR", d.join("state"))
        .env("CORDON_AUDIT", d.join("audit.jsonl"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", out(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", out(&o)))
}

/// wrap points the client at `cordon serve`: the Python SDK client started
/// from the wrapped file lists the same tools as from the original, under
/// cordon's names (`<tool>__<name>`), and the server it leaves alone
/// (remote) is kept; unwrap restores the original byte for byte, and
/// refuses when the file changed since wrap (unless --force).
#[test]
fn wrap_then_unwrap_restores_the_original_and_the_client_sees_the_same_tools() {
    let Some((everything, fs)) = servers() else {
        return;
    };
    if let Err(why) = python_mcp() {
        skip_or_fail(
            &this_test(),
            &format!("the Python mcp SDK is not importable ({why}); run scripts/setup.sh"),
        );
        return;
    }
    let d = dir();
    let data = d.path().join("data");
    write(&data.join("note.txt"), "hello");
    let cfg = write(
        &d.path().join("proj/.vscode/mcp.json"),
        &format!(
            r#"{{
  // Project servers.
  "servers": {{
    "everything": {{"type": "stdio", "command": "node", "args": ["{e}", "stdio"]}},
    "files": {{"type": "stdio", "command": "node", "args": ["{f}", "{data}"]}}, // the data
    "remote": {{"type": "http", "url": "https://mcp.example.com/mcp"}},
  }},
}}
"#,
            e = everything.display(),
            f = fs.display(),
            data = data.display()
        ),
    );
    let original = std::fs::read(&cfg).unwrap();
    let before = client_tools(d.path(), &cfg, "servers");
    assert!(
        before["everything"].iter().any(|t| t == "echo"),
        "{before:?}"
    );
    assert!(
        before["files"].iter().any(|t| t == "read_text_file"),
        "{before:?}"
    );

    let o = import(d.path(), &[&cfg], &["--skip", "remote"]);
    assert!(o.status.success(), "{}", out(&o));
    let m = d.path().join("cordon.yaml");

    // --dry-run prints the diff and changes nothing.
    let o = cordon(
        d.path(),
        &[
            "wrap",
            "--dry-run",
            "-m",
            m.to_str().unwrap(),
            cfg.to_str().unwrap(),
        ],
        &[],
    );
    assert!(o.status.success(), "{}", out(&o));
    let diff = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        diff.lines()
            .any(|l| l.starts_with('+') && l.contains("\"cordon\"")),
        "{}",
        out(&o)
    );
    assert!(
        diff.lines()
            .any(|l| l.starts_with('-') && l.contains("\"files\"")),
        "{}",
        out(&o)
    );
    assert_eq!(std::fs::read(&cfg).unwrap(), original);

    let o = cordon(
        d.path(),
        &["wrap", "-m", m.to_str().unwrap(), cfg.to_str().unwrap()],
        &[],
    );
    assert!(o.status.success(), "{}", out(&o));
    let wrapped = std::fs::read_to_string(&cfg).unwrap();
    assert!(wrapped.contains("// Project servers."), "{wrapped}");
    assert!(wrapped.contains("https://mcp.example.com/mcp"), "{wrapped}");
    // A second wrap is refused: the backup is not overwritten.
    let o = cordon(
        d.path(),
        &["wrap", "-m", m.to_str().unwrap(), cfg.to_str().unwrap()],
        &[],
    );
    assert!(!o.status.success(), "{}", out(&o));

    let after = client_tools(d.path(), &cfg, "servers");
    let mut want: Vec<String> = before
        .iter()
        .flat_map(|(s, ts)| ts.iter().map(move |t| format!("{s}__{t}")))
        .collect();
    want.sort();
    assert_eq!(after.keys().collect::<Vec<_>>(), ["cordon"], "{after:?}");
    assert_eq!(after["cordon"], want);

    // Changed since wrap: refused, unless --force.
    std::fs::write(&cfg, format!("{wrapped}\n")).unwrap();
    let o = cordon(d.path(), &["unwrap", cfg.to_str().unwrap()], &[]);
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    assert!(
        stderr(&o).contains("changed since `cordon wrap`"),
        "{}",
        out(&o)
    );
    std::fs::write(&cfg, &wrapped).unwrap();
    let o = cordon(d.path(), &["unwrap", cfg.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(std::fs::read(&cfg).unwrap(), original);
    assert!(!cfg.with_file_name("mcp.json.cordon-backup").exists());

    // And --force restores over a later edit.
    let o = cordon(
        d.path(),
        &["wrap", "-m", m.to_str().unwrap(), cfg.to_str().unwrap()],
        &[],
    );
    assert!(o.status.success(), "{}", out(&o));
    std::fs::write(&cfg, "{}\n").unwrap();
    let o = cordon(d.path(), &["unwrap", "--force", cfg.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(std::fs::read(&cfg).unwrap(), original);
}

/// inventory has one row per tool with the documented fields; a probe run
/// (the whole catalogue, aimed at stand-ins in a namespace of its own) is
/// recorded and shown; a changed policy no longer counts as probed.
#[test]
fn inventory_reflects_a_probe_run() {
    let Some((everything, _)) = servers() else {
        return;
    };
    let d = dir();
    let cfg = write(
        &d.path().join("claude_desktop_config.json"),
        &format!(
            r#"{{"mcpServers": {{"ref": {{"command": "node", "args": ["{}"]}}}}}}"#,
            everything.display()
        ),
    );
    let o = import(d.path(), &[&cfg], &[]);
    assert!(o.status.success(), "{}", out(&o));
    let m = d.path().join("cordon.yaml");
    // Short limits: the resource probes run into them in seconds.
    let text = std::fs::read_to_string(&m).unwrap();
    let short = text.replace(
        "limits: {memory: \"1G\"}",
        "limits: {memory: \"128M\", wall_seconds: 3}",
    );
    assert_ne!(short, text);
    std::fs::write(&m, short).unwrap();
    let inventory = || {
        let o = cordon(
            d.path(),
            &["inventory", "--json", "-m", m.to_str().unwrap()],
            &[],
        );
        assert!(o.status.success(), "{}", out(&o));
        serde_json::from_slice::<Value>(&o.stdout).unwrap()
    };
    let v = inventory();
    let row = &v["tools"][0];
    for k in [
        "tool",
        "kind",
        "parses",
        "egress",
        "secrets",
        "profile",
        "runtime",
        "requires",
        "accepts",
        "enforceable",
        "enforcement",
        "probe_passed",
        "probe",
    ] {
        assert!(row.get(k).is_some(), "no {k}: {row}");
    }
    assert_eq!(row["tool"], "ref");
    assert_eq!(row["kind"], "mcp");
    assert_eq!(row["profile"], "P2");
    assert_eq!(row["runtime"], "native");
    assert_eq!(row["egress"], serde_json::json!(["none"]));
    assert_eq!(row["enforceable"], true, "{row}");
    assert!(
        row["requires"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == "seccomp"),
        "{row}"
    );
    assert_eq!(row["probe"], "never");
    assert_eq!(row["probe_passed"], Value::Null);

    let o = Command::new(repo().join("scripts/probe-standins.sh"))
        .args([CORDON, "probe", "-m", m.to_str().unwrap()])
        .env("CORDON_STATE_DIR", d.path().join("state"))
        .env("CORDON_AUDIT", d.path().join("audit.jsonl"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", out(&o));
    let v = inventory();
    let row = &v["tools"][0];
    assert_eq!(row["probe"], "passed", "{row}");
    assert!(
        row["probe_passed"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{row}"
    );

    // The markdown table names the tool and the run.
    let o = cordon(
        d.path(),
        &["inventory", "--markdown", "-m", m.to_str().unwrap()],
        &[],
    );
    let md = String::from_utf8_lossy(&o.stdout);
    assert!(md.starts_with("| tool | profile |"), "{md}");
    assert!(md.contains("| ref | P2 | native |"), "{md}");
    // The text form: one block per tool, its mounts and whether each is
    // read-only, one field per line.
    let o = cordon(d.path(), &["inventory", "-m", m.to_str().unwrap()], &[]);
    let txt = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(txt.starts_with("ref  P2 native\n"), "{txt}");
    let mounts = txt
        .lines()
        .find(|l| l.starts_with("  mounts "))
        .unwrap_or_else(|| panic!("{txt}"));
    assert!(mounts.contains(" (ro)"), "{txt}");
    assert_eq!(
        inventory()["tools"][0]["mounts"].as_array().map(Vec::len),
        Some(mounts.split(", ").count()),
        "{txt}"
    );

    // A different policy is not the one that was probed.
    let text = std::fs::read_to_string(&m).unwrap();
    std::fs::write(&m, text.replace("memory: \"128M\"", "memory: \"96M\"")).unwrap();
    let row = inventory()["tools"][0].clone();
    assert_eq!(row["probe"], "policy changed since the last run", "{row}");
    assert_eq!(row["probe_passed"], Value::Null);

    // A tool this host cannot start (a mount source that does not exist)
    // is not enforceable, and the row says why.
    let gone = d.path().join("no-such-dir");
    let text = std::fs::read_to_string(&m).unwrap();
    let broken = text.replacen(
        "    mounts:\n",
        &format!("    mounts:\n      - \"{}\"\n", gone.display()),
        1,
    );
    assert_ne!(broken, text);
    std::fs::write(&m, broken).unwrap();
    let row = inventory()["tools"][0].clone();
    assert_eq!(row["enforceable"], false, "{row}");
    assert!(
        row["enforcement"][0]
            .as_str()
            .unwrap()
            .contains("no-such-dir"),
        "{row}"
    );
}

/// `npx -y PKG@V` and `uvx PKG==V` entries become the store's install (no
/// download at every start): the command, mounts and environment come from
/// `Store::install`, the version is recorded in a comment.
#[test]
fn launcher_entries_are_installed_into_the_store() {
    let cache = std::env::var_os("CORDON_E2E_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/cordon-e2e"))
        .join("add");
    if !cache.join("npm.done").is_file() || !cache.join("wheels.done").is_file() {
        skip_or_fail(
            &this_test(),
            "cordon add's npm cache and wheelhouse are missing; run scripts/setup.sh",
        );
        return;
    }
    let d = dir();
    let cfg = write(
        &d.path().join("claude_desktop_config.json"),
        r#"{"mcpServers": {
  "memory": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"]},
  "time": {"command": "uvx", "args": ["mcp-server-time"]}
}}"#,
    );
    // Offline, from the caches setup.sh fills: no test downloads.
    let store = d.path().join("store");
    let npm_cache = cache.join("npm-cache");
    let wheels = cache.join("wheels");
    let o = import(
        d.path(),
        &[&cfg],
        &[
            "--offline",
            "--npm-cache",
            npm_cache.to_str().unwrap(),
            "--wheels",
            wheels.to_str().unwrap(),
            "--package-store",
            store.to_str().unwrap(),
        ],
    );
    assert!(o.status.success(), "{}", out(&o));
    let text = std::fs::read_to_string(d.path().join("cordon.yaml")).unwrap();
    assert!(
        text.contains("npm:@modelcontextprotocol/server-memory@"),
        "{text}"
    );
    assert!(text.contains("pypi:mcp-server-time@"), "{text}");
    let t = tools(&d.path().join("cordon.yaml"));
    for name in ["memory", "time"] {
        let a = argv(&t[name]);
        assert!(
            !a.iter().any(|w| w.ends_with("npx") || w.ends_with("uvx")),
            "{a:?}"
        );
    }
    // One proposal per package, whichever door it came in by: `cordon add`
    // proposes the same memory limit, start-up time and environment.
    let o = cordon(
        d.path(),
        &[
            "add",
            "npm:@modelcontextprotocol/server-memory",
            "--print",
            "--store",
            store.to_str().unwrap(),
            "--from",
            npm_cache.to_str().unwrap(),
        ],
        &[],
    );
    assert!(o.status.success(), "{}", out(&o));
    let added = String::from_utf8_lossy(&o.stdout).into_owned();
    let imported = &t["memory"];
    assert_eq!(imported.limits.unwrap().memory_bytes, 512 << 20, "{text}");
    assert!(added.contains("memory: 512M"), "{added}");
    let startup = |text: &str| {
        text.lines().find_map(|l| {
            l.trim()
                .strip_prefix("startup_seconds: ")
                .map(str::to_string)
        })
    };
    assert_eq!(startup(&text), Some("30".to_string()), "{text}");
    assert_eq!(startup(&added), startup(&text), "{added}");
    assert_eq!(
        imported.env.get("MEMORY_FILE_PATH").map(String::as_str),
        Some("/tmp/memory.jsonl")
    );
    assert!(
        added.contains("MEMORY_FILE_PATH: \"/tmp/memory.jsonl\""),
        "{added}"
    );
    check_clean(d.path());
    let names = served_tools(&d.path().join("cordon.yaml"), d.path());
    assert!(names.iter().any(|n| n.starts_with("memory__")), "{names:?}");
    assert!(names.iter().any(|n| n.starts_with("time__")), "{names:?}");
}

/// wrap then unwrap gives back each format's file byte for byte (JSON
/// with and without comments, Zed's settings, Codex's TOML), and the
/// wrapped file starts `cordon serve` with the manifest.
#[test]
fn wrap_and_unwrap_every_format_byte_for_byte() {
    let Some((everything, fs)) = servers() else {
        return;
    };
    let d = dir();
    let data = d.path().join("data");
    std::fs::create_dir_all(&data).unwrap();
    for (cfg, server) in every_format(d.path(), &everything, &fs, &data) {
        // Continue's files are pointed at cordon by hand; ~/.claude.json's
        // servers here are a project's, which wrap leaves alone.
        if server.starts_with("continue") || server == "proj-files" {
            continue;
        }
        let sub = d.path().join(format!("w-{server}"));
        std::fs::create_dir_all(&sub).unwrap();
        let o = import(&sub, &[&cfg], &[]);
        assert!(o.status.success(), "{}", out(&o));
        let m = sub.join("cordon.yaml");
        let original = std::fs::read(&cfg).unwrap();
        // Some servers declare secrets: the wrapped serve gets a provider file.
        let providers = write(&sub.join("providers.yaml"), "providers: {}\n");
        let o = cordon(
            &sub,
            &[
                "wrap",
                "-m",
                m.to_str().unwrap(),
                "--providers",
                providers.to_str().unwrap(),
                cfg.to_str().unwrap(),
            ],
            &[],
        );
        assert!(o.status.success(), "{}: {}", cfg.display(), out(&o));
        let wrapped = std::fs::read_to_string(&cfg).unwrap();
        assert!(
            !wrapped.contains(&everything.display().to_string()),
            "{wrapped}"
        );
        assert!(wrapped.contains(&m.display().to_string()), "{wrapped}");
        assert!(wrapped.contains(CORDON), "{wrapped}");
        let o = cordon(&sub, &["unwrap", cfg.to_str().unwrap()], &[]);
        assert!(o.status.success(), "{}: {}", cfg.display(), out(&o));
        assert_eq!(std::fs::read(&cfg).unwrap(), original, "{}", cfg.display());
    }
}

/// A server that declares secrets: wrap refuses to drop its tools silently
/// when no provider file would be found, and writes `--providers` into the
/// client's entry when given one; the backup of a 0644 configuration (which
/// often holds tokens) is 0600 and byte for byte the original.
#[test]
fn wrap_passes_the_provider_file_and_keeps_a_private_backup() {
    use std::os::unix::fs::PermissionsExt;
    if Path::new("/etc/cordon/providers.yaml").exists() {
        panic!("/etc/cordon/providers.yaml exists on this host: the refusal below cannot be seen");
    }
    let d = dir();
    let cfg = write(
        &d.path().join("claude_desktop_config.json"),
        r#"{"mcpServers": {"gh": {"command": "/usr/bin/node", "args": ["gh.js"], "env": {"GITHUB_TOKEN": "ghp_not_a_real_token"}}}}
"#,
    );
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o644)).unwrap();
    let m = write(
        &d.path().join("cordon.yaml"),
        "version: 1\ntools:\n  gh:\n    profile: P2\n    egress: [\"api.github.com:443\"]\n    secrets: [{name: GITHUB_TOKEN, scope: repo, ttl: 900}]\n    mcp:\n      command: [/usr/bin/node, gh.js]\n",
    );
    let original = std::fs::read(&cfg).unwrap();
    let args = ["wrap", "-m", m.to_str().unwrap(), cfg.to_str().unwrap()];
    let o = cordon(d.path(), &args, &[]);
    assert!(!o.status.success(), "{}", out(&o));
    assert!(
        stderr(&o).contains("gh declare(s) secrets, and no provider file is given")
            && stderr(&o).contains("--providers FILE"),
        "{}",
        out(&o)
    );
    assert_eq!(std::fs::read(&cfg).unwrap(), original, "refused: unchanged");
    // A provider file that does not exist is refused too.
    let missing = d.path().join("nope.yaml");
    let mut with = args.to_vec();
    with.extend(["--providers", missing.to_str().unwrap()]);
    let o = cordon(d.path(), &with, &[]);
    assert!(
        !o.status.success() && stderr(&o).contains("--providers"),
        "{}",
        out(&o)
    );
    // Positive control: with a provider file the wrap goes through.
    let providers = write(&d.path().join("providers.yaml"), "providers: {}\n");
    let mut with = args.to_vec();
    with.extend(["--providers", providers.to_str().unwrap()]);
    let o = cordon(d.path(), &with, &[]);
    assert!(o.status.success(), "{}", out(&o));
    let v: Value = serde_json::from_slice(&std::fs::read(&cfg).unwrap()).unwrap();
    let a: Vec<&str> = v["mcpServers"]["cordon"]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_str().unwrap())
        .collect();
    assert_eq!(
        a[a.len() - 2..],
        ["--providers", providers.to_str().unwrap()],
        "{v}"
    );
    let backup = cfg.with_file_name("claude_desktop_config.json.cordon-backup");
    assert_eq!(std::fs::read(&backup).unwrap(), original);
    let mode = std::fs::metadata(&backup).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "backup mode {mode:o}");
}

/// A fake pyenv in a home of its own: `shims/python3` is a shell script
/// (as pyenv's are), `versions/3.12.1/bin/python3` a symlink to the
/// system's. `python3` found on PATH is the shim: import writes the real
/// interpreter, with a comment saying what it was resolved from, and
/// mounts nothing of the home. A version that is not installed is
/// refused naming the shim and the version; the first import is the
/// positive control of that refusal.
#[test]
fn a_pyenv_shim_is_resolved_to_the_real_interpreter_or_refused() {
    use std::os::unix::fs::PermissionsExt;
    let d = dir();
    let home = d.path().join("home");
    let root = home.join(".pyenv");
    let shim = write(
        &root.join("shims/python3"),
        "#!/usr/bin/env bash\nset -e\nexport PYENV_ROOT=\"$HOME/.pyenv\"\nexec \"$PYENV_ROOT/libexec/pyenv\" exec \"python3\" \"$@\"\n",
    );
    std::fs::set_permissions(&shim, std::fs::Permissions::from_mode(0o755)).unwrap();
    let bin = root.join("versions/3.12.1/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::os::unix::fs::symlink("/usr/bin/python3", bin.join("python3")).unwrap();
    write(&root.join("version"), "3.12.1\n");
    let cfg = write(
        &d.path().join("claude_desktop_config.json"),
        r#"{"mcpServers": {"py": {"command": "python3", "args": ["-m", "http.server"]}}}"#,
    );
    let m = d.path().join("cordon.yaml");
    let path = format!("{}:/usr/bin:/bin", root.join("shims").display());
    let env = [("HOME", home.to_str().unwrap()), ("PATH", path.as_str())];
    let o = cordon(
        d.path(),
        &[
            "import",
            "--yes",
            "-o",
            m.to_str().unwrap(),
            cfg.to_str().unwrap(),
        ],
        &env,
    );
    assert!(o.status.success(), "{}", out(&o));
    let real = std::fs::canonicalize("/usr/bin/python3").unwrap();
    let t = tools(&m);
    assert_eq!(
        argv(&t["py"]),
        [
            real.display().to_string(),
            "-m".into(),
            "http.server".into()
        ]
    );
    assert!(
        !t["py"]
            .mounts
            .iter()
            .any(|m| m.src.starts_with(home.to_str().unwrap())),
        "{:?}",
        t["py"].mounts
    );
    let text = std::fs::read_to_string(&m).unwrap();
    assert!(
        text.contains(&format!(
            "      # {}: resolved from the pyenv shim {} (version 3.12.1, from {})",
            real.display(),
            shim.display(),
            root.join("version").display()
        )),
        "{text}"
    );

    // A version that is not installed: refused, saying why and what to do.
    write(&root.join("version"), "3.9.9\n");
    let o = cordon(
        d.path(),
        &[
            "import",
            "--yes",
            "--force",
            "-o",
            m.to_str().unwrap(),
            cfg.to_str().unwrap(),
        ],
        &env,
    );
    assert_eq!(o.status.code(), Some(1), "{}", out(&o));
    let err = stderr(&o);
    assert!(
        err.contains("server `py`: `command`:")
            && err.contains(&format!("{} is a pyenv shim", shim.display()))
            && err.contains("version 3.9.9")
            && err.contains("`pyenv which python3` prints it"),
        "{err}"
    );
}

/// `--only NAME` into an existing manifest replaces that tool's block and
/// leaves every other byte as it was (hand edits in other tools, their
/// comments), adds a tool the manifest lacks, and refuses a name the
/// configuration does not have (listing the ones it has) or a layout whose
/// blocks cannot be located, the manifest untouched.
#[test]
fn only_replaces_one_block_and_keeps_every_other_byte() {
    let d = dir();
    let cfg = d.path().join("claude_desktop_config.json");
    write(
        &cfg,
        r#"{"mcpServers": {"a": {"command": "/bin/cat"}, "b": {"command": "/bin/echo", "args": ["hi"]}, "c": {"command": "/bin/true"}}}"#,
    );
    let m = d.path().join("cordon.yaml");
    let o = import(d.path(), &[&cfg], &[]);
    assert!(o.status.success(), "{}", out(&o));
    // Hand edits in `b`: a comment and a limit.
    let text = std::fs::read_to_string(&m).unwrap();
    let hand = text.replacen(
        "      command: [\"/bin/echo\", \"hi\"]\n",
        "      command: [\"/bin/echo\", \"hi\"]\n    # mine: 2G, measured by hand\n    limits: {memory: \"2G\"}\n",
        1,
    );
    assert_ne!(hand, text);
    std::fs::write(&m, &hand).unwrap();
    // The configuration changes `a` and `b`, and gains `d`.
    write(
        &cfg,
        r#"{"mcpServers": {"a": {"command": "/bin/cat", "args": ["-u"]}, "b": {"command": "/bin/echo", "args": ["bye"]}, "c": {"command": "/bin/true"}, "d": {"command": "/bin/false"}}}"#,
    );

    let o = import(d.path(), &[&cfg], &["--only", "a"]);
    assert!(o.status.success(), "{}", out(&o));
    assert!(
        stderr(&o).contains("updated") && stderr(&o).contains("replaced `a`"),
        "{}",
        out(&o)
    );
    let after = std::fs::read_to_string(&m).unwrap();
    // Everything before `a`'s block and from `b`'s on is byte-identical.
    let a_at = hand.find("  # From ").unwrap();
    let b_at = hand.find("\n\n  # From ").unwrap();
    assert!(after.starts_with(&hand[..a_at]), "{after}");
    assert!(after.ends_with(&hand[b_at..]), "{after}");
    let new_a = &after[a_at..after.len() - (hand.len() - b_at)];
    assert!(
        new_a.contains("command: [\"/bin/cat\", \"-u\"]") && new_a.contains("`mcpServers.a`"),
        "{new_a}"
    );
    let t = tools(&m);
    assert_eq!(argv(&t["a"]), ["/bin/cat", "-u"]);
    assert_eq!(argv(&t["b"]), ["/bin/echo", "hi"]);
    assert_eq!(t["b"].limits.unwrap().memory_bytes, 2 << 30);
    assert!(
        after.contains("    # mine: 2G, measured by hand\n"),
        "{after}"
    );

    // A server the manifest lacks is added at the end of `tools:`.
    let o = import(d.path(), &[&cfg], &["--only", "d"]);
    assert!(o.status.success(), "{}", out(&o));
    assert!(stderr(&o).contains("added `d`"), "{}", out(&o));
    let added = std::fs::read_to_string(&m).unwrap();
    assert!(added.starts_with(&after), "{added}");
    assert!(added[after.len()..].starts_with("\n  # From "), "{added}");
    assert_eq!(argv(&tools(&m)["d"]), ["/bin/false"]);

    // An unknown name: refused, naming the servers there are.
    let o = import(d.path(), &[&cfg], &["--only", "a", "--only", "nope"]);
    assert!(!o.status.success(), "{}", out(&o));
    assert!(
        stderr(&o).contains("no server `nope`")
            && stderr(&o).contains("its servers are: a, b, c, d"),
        "{}",
        out(&o)
    );
    assert_eq!(std::fs::read_to_string(&m).unwrap(), added);

    // A flow-style `tools:` cannot be edited a block at a time: refused.
    let flow =
        "version: 1\ntools: {a: {profile: P2, network: none, mcp: {command: [\"/bin/cat\"]}}}\n";
    std::fs::write(&m, flow).unwrap();
    let o = import(d.path(), &[&cfg], &["--only", "a"]);
    assert!(!o.status.success(), "{}", out(&o));
    assert!(
        stderr(&o).contains("`tools:` is not a block mapping")
            && stderr(&o).contains("nothing was changed"),
        "{}",
        out(&o)
    );
    assert_eq!(std::fs::read_to_string(&m).unwrap(), flow);

    // Without a manifest, --only writes one with just those servers.
    std::fs::remove_file(&m).unwrap();
    let o = import(d.path(), &[&cfg], &["--only", "b", "--only", "c"]);
    assert!(o.status.success(), "{}", out(&o));
    assert_eq!(tools(&m).keys().collect::<Vec<_>>(), ["b", "c"]);
}

/// A second import with nothing changed reuses the stored resolution of an
/// `npx` package (said on stderr, kept in the state directory) while its
/// install verifies; `--refresh` resolves again, and so does an import
/// whose stored install is gone.
#[test]
fn a_stored_package_resolution_is_reused_until_refreshed() {
    let cache = std::env::var_os("CORDON_E2E_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/cordon-e2e"))
        .join("add");
    if !cache.join("npm.done").is_file() {
        skip_or_fail(
            &this_test(),
            "cordon add's npm cache is missing; run scripts/setup.sh",
        );
        return;
    }
    let d = dir();
    let cfg = write(
        &d.path().join("claude_desktop_config.json"),
        r#"{"mcpServers": {"memory": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-memory"]}}}"#,
    );
    let store = d.path().join("store");
    let npm_cache = cache.join("npm-cache");
    let args = |extra: &'static [&'static str]| {
        let mut v = vec![
            "--force",
            "--offline",
            "--npm-cache",
            npm_cache.to_str().unwrap(),
            "--package-store",
            store.to_str().unwrap(),
        ];
        v.extend(extra);
        v
    };
    let state = d.path().join("state/import-resolutions.json");
    let resolved = "`memory`: resolved npm:@modelcontextprotocol/server-memory (npx, offline:";
    let reused = "`memory`: reused the stored resolution of npm:@modelcontextprotocol/server-memory (npx, offline:";

    let o = import(d.path(), &[&cfg], &args(&[]));
    assert!(o.status.success(), "{}", out(&o));
    assert!(
        stderr(&o).contains(resolved) && !stderr(&o).contains(reused),
        "{}",
        out(&o)
    );
    let first = std::fs::read_to_string(d.path().join("cordon.yaml")).unwrap();
    let stored: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    let list = stored.as_array().unwrap();
    assert_eq!(list.len(), 1, "{stored}");
    assert_eq!(list[0]["key"]["runner"], "npx", "{stored}");
    assert_eq!(list[0]["key"]["version"], Value::Null, "{stored}");
    let install = PathBuf::from(list[0]["install"].as_str().unwrap());
    assert!(install.starts_with(&store) && install.is_dir(), "{stored}");

    // Nothing changed: reused, the same manifest.
    let o = import(d.path(), &[&cfg], &args(&[]));
    assert!(o.status.success(), "{}", out(&o));
    assert!(
        stderr(&o).contains(reused) && !stderr(&o).contains(resolved),
        "{}",
        out(&o)
    );
    assert_eq!(
        std::fs::read_to_string(d.path().join("cordon.yaml")).unwrap(),
        first
    );

    // --refresh: resolved again.
    let o = import(d.path(), &[&cfg], &args(&["--refresh"]));
    assert!(o.status.success(), "{}", out(&o));
    assert!(
        stderr(&o).contains(resolved) && !stderr(&o).contains(reused),
        "{}",
        out(&o)
    );

    // The stored install is gone: it no longer verifies, so resolved again.
    std::fs::remove_dir_all(&install).unwrap();
    let o = import(d.path(), &[&cfg], &args(&[]));
    assert!(o.status.success(), "{}", out(&o));
    let err = stderr(&o);
    assert!(
        err.contains("the stored resolution of npm:@modelcontextprotocol/server-memory")
            && err.contains("no longer holds")
            && err.contains(resolved)
            && !err.contains(reused),
        "{}",
        out(&o)
    );
    assert!(install.is_dir());
}
