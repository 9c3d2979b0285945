//! `runtime: wasm` through the CLI as a user runs it: `cordon run -m
//! examples/wasm.yaml json_check` with valid and invalid JSON, a module
//! that is not the one pinned, and `cordon probe` on the example (every
//! probe holds) and on a variant that preopens the host's /etc (host_fs
//! escapes). The example parser and the probe module are built from their
//! committed C sources with Debian's clang-14 for wasm32-wasi
//! (scripts/setup.sh installs it): without it these tests fail, they never
//! skip. The runner is `cordon-wasm` beside the cordon binary
//! (`cargo build -p cordon-wasm`; the workspace's test build makes it).

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const CORDON: &str = env!("CARGO_BIN_EXE_cordon");

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `src` (relative to the checkout) built for wasm32-wasi into `out`.
fn build_wasm(src: &str, out: &Path) {
    cordon_testkit::wasm::clang(src, out, &[]);
}

/// A scratch directory with the example's module and the probe module
/// built, the example manifest pointing at its module (its pin unchanged),
/// and cordon's state and audit log inside it.
struct Setup {
    dir: cordon_testkit::Scratch,
    manifest: PathBuf,
    example: String,
}

fn setup() -> Setup {
    let runner = Path::new(CORDON).with_file_name("cordon-wasm");
    assert!(
        runner.is_file(),
        "no runner at {}: build it with `cargo build -p cordon-wasm`",
        runner.display()
    );
    let dir = cordon_testkit::scratch();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
    let module = dir.join("json-check.wasm");
    build_wasm("examples/wasm/json-check.c", &module);
    build_wasm("crates/probes/wasm/probe.c", &dir.join("cordon-probe.wasm"));
    // The components, as scripts/build-wasm-example.sh makes them.
    let bin_dir = Path::new(CORDON).parent().expect("cordon's directory");
    for name in ["json-check", "cordon-probe"] {
        cordon_testkit::wasm::componentize(
            bin_dir,
            &[
                Path::new("command"),
                &dir.join(format!("{name}.wasm")),
                &dir.join(format!("{name}.component.wasm")),
            ],
        );
    }
    cordon_testkit::wasm::json_tools(bin_dir, &dir);
    let mut example =
        fs::read_to_string(repo().join("examples/wasm.yaml")).expect("read examples/wasm.yaml");
    for name in [
        "json-check.wasm",
        "json-check.component.wasm",
        "json-tools.wasm",
    ] {
        let from = format!("path: ../target/wasm/{name}\n");
        assert!(example.contains(&from), "examples/wasm.yaml names {from}");
        example = example.replace(&from, &format!("path: {}\n", dir.join(name).display()));
    }
    let manifest = dir.join("wasm.yaml");
    fs::write(&manifest, &example).expect("write manifest");
    Setup {
        dir,
        manifest,
        example,
    }
}

impl Setup {
    fn cordon(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut c = Command::new(CORDON)
            .args(args)
            .current_dir(repo())
            .env_remove("CORDON_MANIFEST")
            .env_remove("CORDON_WASM")
            .env("CORDON_STATE_DIR", self.dir.join("state"))
            .env("CORDON_AUDIT", self.dir.join("audit.jsonl"))
            .env("CORDON_WASM_PROBE", self.dir.join("cordon-probe.wasm"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run cordon");
        c.stdin
            .take()
            .expect("stdin")
            .write_all(stdin)
            .expect("write stdin");
        let o = c.wait_with_output().expect("wait for cordon");
        println!(
            "cordon {args:?}: {:?}\nstdout:\n{}\nstderr:\n{}",
            o.status,
            text(&o.stdout),
            text(&o.stderr)
        );
        o
    }

    /// A variant of the example manifest, written beside it.
    fn variant(&self, name: &str, yaml: &str) -> String {
        let p = self.dir.join(name);
        fs::write(&p, yaml).expect("write manifest");
        p.display().to_string()
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn run_checks_valid_and_invalid_json_through_the_cli() {
    let s = setup();
    let m = s.manifest.display().to_string();
    let good = s.cordon(&["run", "-m", &m, "json_check"], br#"{"a": [1, 2]}"#);
    assert_eq!(good.status.code(), Some(0));
    assert_eq!(text(&good.stdout), "ok: 4 values, depth 2\n");
    // Compiled once, into the state directory's cache.
    let cache: Vec<_> = fs::read_dir(s.dir.join("state/wasm-cache"))
        .expect("the wasm cache")
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(cache.len(), 2, "{cache:?}");

    // The module's own exit status 1: the tool failed (10), and its
    // answer is still printed.
    let bad = s.cordon(&["run", "-m", &m, "json_check"], br#"{"a": }"#);
    assert_eq!(bad.status.code(), Some(10));
    assert_eq!(text(&bad.stdout), "invalid: byte 6: value expected\n");
    assert!(
        text(&bad.stderr).contains("json_check: exit 1"),
        "{}",
        text(&bad.stderr)
    );
}

#[test]
fn a_module_that_is_not_the_one_pinned_is_refused() {
    let s = setup();
    let pin = "05038da42601da3af236f44f3580ae43eea50c9327d3c97a436218740df41d47";
    // The example's pin is the digest of its committed source's build.
    assert!(s.example.contains(&format!("sha256: {pin}")));
    let wrong = "0".repeat(64);
    let m = s.variant(
        "wrong-pin.yaml",
        &s.example
            .replace(&format!("sha256: {pin}"), &format!("sha256: {wrong}")),
    );
    let o = s.cordon(&["run", "-m", &m, "json_check"], b"{}");
    assert_eq!(o.status.code(), Some(21));
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
    let err = text(&o.stderr);
    assert!(
        err.contains(&format!(
            "sha256 mismatch: expected {wrong}, actual {pin}; refusing to run a module that is not the one pinned"
        )),
        "{err}"
    );
    // Nothing was compiled for it.
    assert!(!s.dir.join("state/wasm-cache").exists());
}

#[test]
fn probe_holds_every_probe_of_the_example() {
    let s = setup();
    let m = s.manifest.display().to_string();
    let o = s.cordon(&["probe", "-m", &m], b"");
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    for p in [
        "control",
        "network",
        "host_fs",
        "env",
        "write",
        "tty",
        "fds",
        "fresh_task",
        "memory",
        "output",
        "time",
    ] {
        assert!(
            out.lines()
                .any(|l| l.starts_with("HELD ") && l.split_whitespace().nth(1) == Some(p)),
            "{p} not held:\n{out}"
        );
    }
    // The module, and its three component tools probed by the probe
    // module as a component (`network` said not to apply, with why).
    assert!(
        out.contains("11 held, 0 escaped, 0 error, 21 skipped, 0 void"),
        "{out}"
    );
    assert_eq!(
        out.matches("10 held, 0 escaped, 0 error, 22 skipped, 0 void")
            .count(),
        3,
        "{out}"
    );
    assert_eq!(
        out.matches("cordon-probe.component.wasm as the module of")
            .count(),
        3,
        "{out}"
    );
    assert!(
        out.contains(
            "SKIPPED  network        not applicable: a component is linked with no socket"
        ),
        "{out}"
    );
    assert!(
        out.contains("SKIPPED  userns         not applicable: the module has no system calls"),
        "{out}"
    );
    assert!(out.contains("wasm trap: memory limit"), "{out}");
    assert!(
        out.contains("wasm trap: time limit: stopped at the wall clock of 10s"),
        "{out}"
    );
}

#[test]
fn probe_finds_the_hosts_files_through_a_preopen_of_etc() {
    let s = setup();
    let leaky = s.example.replace(
        "    network: none\n",
        "    network: none\n    mounts: [\"/etc:/host-etc\"]\n",
    );
    assert_ne!(leaky, s.example);
    let m = s.variant("leaky.yaml", &leaky);
    let o = s.cordon(
        &["probe", "-m", &m, "--only", "host_fs", "--only", "write"],
        b"",
    );
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let host_fs = out
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("host_fs"))
        .unwrap_or_default();
    assert!(host_fs.starts_with("ESCAPED "), "{out}");
    assert!(
        host_fs.contains("OPENED /host-etc/passwd and read 64 bytes through the preopen /host-etc"),
        "{host_fs}"
    );
    assert!(
        host_fs.contains("/etc/passwd: Capabilities insufficient"),
        "{host_fs}"
    );
    // Read-only all the same.
    let write = out
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("write"))
        .unwrap_or_default();
    assert!(write.starts_with("HELD "), "{out}");
}

/// Set `p`'s modification time `days` back.
fn age_by_days(p: &Path, days: u64) {
    let f = fs::File::options().write(true).open(p).expect("open");
    f.set_modified(std::time::SystemTime::now() - std::time::Duration::from_secs(days * 86400))
        .expect("set mtime");
}

#[test]
fn image_gc_removes_the_wasm_code_no_manifest_pins_or_too_old() {
    let s = setup();
    let m = s.manifest.display().to_string();
    let store = s.dir.join("store");
    let store = store.display().to_string();
    let good = s.cordon(&["run", "-m", &m, "json_check"], b"[]");
    assert_eq!(good.status.code(), Some(0));
    let cache = s.dir.join("state/wasm-cache");
    let names = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(d)
            .expect("the wasm cache")
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    let example: Vec<String> = names(&cache);
    assert_eq!(example.len(), 2, "{example:?}");
    let code = example
        .iter()
        .find(|n| n.ends_with(".cwasm"))
        .expect("the example's code")
        .clone();
    let code_bytes = fs::metadata(cache.join(&code)).expect("stat").len()
        + fs::metadata(cache.join(format!("{code}.sha256")))
            .expect("stat")
            .len();
    // The code of a module no manifest pins any more (as a cache would
    // hold after the module changed), with its digest.
    let engine = code
        .strip_suffix(".cwasm")
        .and_then(|c| c.split_once('-'))
        .expect("MODULE-ENGINE.cwasm")
        .1;
    let stale = format!("{}-{engine}.cwasm", "ab".repeat(32));
    fs::write(cache.join(&stale), vec![7u8; 1000]).expect("write");
    fs::write(
        cache.join(format!("{stale}.sha256")),
        format!("{}\n", "0".repeat(64)),
    )
    .expect("write");

    // With the manifest: the example's code stays, the other goes.
    let o = s.cordon(&["image", "--store", &store, "gc", "-m", &m], b"");
    assert_eq!(o.status.code(), Some(0));
    let out = text(&o.stdout);
    assert!(
        out.contains(&format!("removed wasm-cache/{stale} (1065 bytes)")),
        "{out}"
    );
    assert!(
        out.contains(": removed 1 compiled modules, 0 leftovers (1065 bytes)"),
        "{out}"
    );
    assert_eq!(names(&cache), example);

    // Without a manifest: only what was last used too long ago goes.
    let o = s.cordon(&["image", "--store", &store, "gc"], b"");
    assert_eq!(o.status.code(), Some(0));
    assert!(text(&o.stdout).contains(": removed 0 compiled modules"));
    assert_eq!(names(&cache), example);
    // Compiled 31 days ago, and used by a call since: kept.
    let digest = cache.join(format!("{code}.sha256"));
    age_by_days(&cache.join(&code), 31);
    age_by_days(&digest, 31);
    let used = s.cordon(&["run", "-m", &m, "json_check"], b"[]");
    assert_eq!(used.status.code(), Some(0));
    let o = s.cordon(&["image", "--store", &store, "gc"], b"");
    assert_eq!(o.status.code(), Some(0));
    assert!(
        text(&o.stdout).contains(": removed 0 compiled modules"),
        "{}",
        text(&o.stdout)
    );
    assert_eq!(names(&cache), example);
    // Neither compiled nor used in 31 days: removed.
    age_by_days(&cache.join(&code), 31);
    age_by_days(&digest, 31);
    let o = s.cordon(&["image", "--store", &store, "gc"], b"");
    assert_eq!(o.status.code(), Some(0));
    let out = text(&o.stdout);
    assert!(
        out.contains(&format!("removed wasm-cache/{code} ({code_bytes} bytes)")),
        "{out}"
    );
    assert!(names(&cache).is_empty());

    // The next call compiles it again.
    let again = s.cordon(&["run", "-m", &m, "json_check"], b"[1]");
    assert_eq!(again.status.code(), Some(0));
    assert_eq!(text(&again.stdout), "ok: 2 values, depth 1\n");
    assert_eq!(names(&cache), example);
}

/// `cordon serve` with the example served from a warm worker
/// (`module: {worker: true}`): calls answer as without one, the invalid
/// document's failure is the tool's and the next call is whole, and every
/// call's audit record says how it ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_answers_from_a_warm_worker_and_says_so_in_the_audit_record() {
    use cordon_mcp::rmcp::ServiceExt as _;
    use cordon_testkit::serve::{Serve, call};
    let s = setup();
    let from = "      sha256: ".to_string();
    assert!(s.example.contains(&from));
    let yaml = {
        let yaml = &s.example;
        let at = yaml.find(&from).expect("the pin");
        let end = at + yaml[at..].find('\n').expect("its line");
        format!("{}\n      worker: true{}", &yaml[..end], &yaml[end..])
    };
    let m = s.variant("worker.yaml", &yaml);
    let audit = s.dir.join("serve-audit.jsonl");
    let serve = Serve::manifest(CORDON, Path::new(&m), &audit)
        .arg("--no-probe")
        .env("CORDON_WASM_PROBE", s.dir.join("cordon-probe.wasm"))
        .http();
    let c = ().serve(cordon_mcp::http_client(&serve.url)).await.unwrap();
    let doc = |d: &str| serde_json::json!({ "document": d });
    for (d, ok, answer) in [
        (r#"{"a": [1, 2]}"#, true, "ok: 4 values, depth 2"),
        // A failure's result is its reason and stderr (as for any tool).
        (r#"{"a": }"#, false, "json_check: exit 1"),
        ("[true]", true, "ok: 2 values, depth 1"),
    ] {
        let r = call(&c, "json_check", doc(d)).await.unwrap();
        let t: String = r
            .content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect();
        assert_eq!(r.is_error != Some(true), ok, "{d}: {r:?}");
        assert!(t.contains(answer), "{d}: {t}");
    }
    c.cancel().await.unwrap();
    let recs: Vec<serde_json::Value> = fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|r: &serde_json::Value| r["tool"] == "json_check")
        .collect();
    assert_eq!(recs.len(), 3, "{recs:#?}");
    for r in &recs {
        assert!(
            r.to_string().contains("served by a warm Wasm worker"),
            "{r:#}"
        );
    }
}

/// A one-shot run on a warm worker leaves nothing behind: as uid 65534
/// without `XDG_RUNTIME_DIR`, cordon's own `cordon-root-*` under `TMPDIR`
/// is there while the run waits for its input (the control) and gone once
/// cordon has exited, the worker's jail torn down before the process ends.
#[test]
fn a_one_shot_run_on_a_worker_leaves_no_root_directory_behind() {
    assert!(
        cordon_testkit::is_root() && Path::new("/usr/bin/setpriv").exists(),
        "the run as uid 65534 needs root and /usr/bin/setpriv"
    );
    let s = setup();
    let from = "      sha256: ";
    let at = s.example.find(from).expect("the pin");
    let end = at + s.example[at..].find('\n').expect("its line");
    let yaml = format!(
        "{}\n      worker: true{}",
        &s.example[..end],
        &s.example[end..]
    );
    let m = s.variant("worker-once.yaml", &yaml);
    let tmp = s.dir.join("own-tmp");
    fs::create_dir(&tmp).unwrap();
    fs::set_permissions(&tmp, fs::Permissions::from_mode(0o777)).unwrap();
    let roots = || -> Vec<String> {
        fs::read_dir(&tmp)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("cordon-root-"))
            .collect()
    };
    let mut c = Command::new("/usr/bin/setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args([CORDON, "run", "-m", &m, "json_check"])
        .current_dir(repo())
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("CORDON_WASM")
        .env("TMPDIR", &tmp)
        .env("HOME", &tmp)
        .env("CORDON_STATE_DIR", tmp.join("state"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while roots().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no cordon-root-* appeared in {}",
            tmp.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    c.stdin.take().unwrap().write_all(b"[1]").unwrap();
    let o = c.wait_with_output().unwrap();
    assert_eq!(
        text(&o.stdout),
        "ok: 2 values, depth 1\n",
        "{}",
        text(&o.stderr)
    );
    assert!(
        text(&o.stderr).contains("served by a warm Wasm worker"),
        "{}",
        text(&o.stderr)
    );
    assert_eq!(roots(), Vec::<String>::new(), "left behind after the run");
}

/// `cordon serve` lists each typed function of the example's component as
/// a tool whose input schema is read from the component's types, calls it
/// with the caller's arguments as JSON and answers its result as JSON;
/// arguments the schema refuses never reach it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_lists_a_components_typed_functions_with_their_schemas_and_calls_them() {
    use cordon_mcp::rmcp::ServiceExt as _;
    use cordon_testkit::serve::{Serve, call};
    let s = setup();
    let audit = s.dir.join("serve-audit.jsonl");
    let serve = Serve::manifest(CORDON, &s.manifest, &audit)
        .arg("--no-probe")
        .env("CORDON_WASM_PROBE", s.dir.join("cordon-probe.wasm"))
        .http();
    let c = ().serve(cordon_mcp::http_client(&serve.url)).await.unwrap();
    let tools = c.list_all_tools().await.unwrap();
    let schema = |name: &str| {
        let t = tools
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("{name} listed: {tools:?}"));
        serde_json::Value::Object((*t.input_schema).clone())
    };
    assert_eq!(
        schema("json_parse"),
        serde_json::json!({"type": "object", "properties": {"document": {"type": "string"}},
                           "required": ["document"], "additionalProperties": false})
    );
    assert_eq!(
        schema("json_check_all")["properties"]["max-depth"],
        serde_json::json!({"anyOf": [{"type": "null"},
                                     {"type": "integer", "minimum": 0, "maximum": 4294967295u64}]})
    );
    let texts = |r: &cordon_mcp::rmcp::model::CallToolResult| -> String {
        r.content
            .iter()
            .filter_map(|c| c.as_text().map(|t| t.text.clone()))
            .collect()
    };
    let ok = call(
        &c,
        "json_parse",
        serde_json::json!({"document": "[1, {\"a\": 2}]"}),
    )
    .await
    .unwrap();
    assert_ne!(ok.is_error, Some(true), "{ok:?}");
    assert!(texts(&ok).contains(r#"{"depth":2,"values":4}"#), "{ok:?}");
    // The function's own error: the tool failed, its value answered.
    let bad = call(&c, "json_parse", serde_json::json!({"document": "[1,"}))
        .await
        .unwrap();
    assert_eq!(bad.is_error, Some(true), "{bad:?}");
    assert!(
        texts(&bad).contains(r#"{"byte":3,"reason":"value expected"}"#),
        "{bad:?}"
    );
    let all = call(
        &c,
        "json_check_all",
        serde_json::json!({"documents": ["[1]", "nope"], "max-depth": 3}),
    )
    .await
    .unwrap();
    assert!(texts(&all).contains("[true,false]"), "{all:?}");
    // Refused by the schema before anything runs.
    let refused = call(&c, "json_parse", serde_json::json!({"document": 7}))
        .await
        .expect_err("refused");
    assert!(
        refused
            .to_string()
            .contains("json_parse: arguments refused by input_schema at /document"),
        "{refused}"
    );
    c.cancel().await.unwrap();
    let runs = fs::read_to_string(&audit)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["tool"] == "json_parse")
        .count();
    assert_eq!(runs, 3, "two calls and the refusal, each audited");
}

/// A function the component does not export: the tool is refused at
/// `cordon check`, naming the functions there are.
#[test]
fn check_refuses_a_function_the_component_does_not_export() {
    let s = setup();
    let m = s.variant(
        "nope.yaml",
        &s.example
            .replace("      function: check\n", "      function: parse\n"),
    );
    let o = s.cordon(&["check", "-m", &m], b"");
    assert_ne!(o.status.code(), Some(0));
    let all = format!("{}{}", text(&o.stdout), text(&o.stderr));
    assert!(
        all.contains("the component exports no function `parse`; its functions: check, check-all"),
        "{all}"
    );
    // The control: the example as it is passes.
    let ok = s.cordon(&["check", "-m", &s.manifest.display().to_string()], b"");
    assert_eq!(ok.status.code(), Some(0));
}
