//! `runtime: wasm` end to end: the runner compiles into the cache outside
//! the jail and runs the module inside the native P1 jail. Every body runs
//! in a re-executed copy of this test binary, as root and as uid 65534.
//! The example parser is built from its committed C source with Debian's
//! clang-14 for wasm32-wasi (scripts/setup.sh installs it): without it the
//! tests fail, they never skip.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use cordon_runtime::spec::WasmModule;
use cordon_runtime::wasm::{Options, Wasm};
use cordon_runtime::{Context, Mount, RunError, Runtime, SandboxSpec, Status};
use cordon_testkit::reexec::Harness;

const HARNESS: Harness = Harness {
    child_env: "CORDON_WASM_TEST_CHILD",
    env_remove: &["XDG_RUNTIME_DIR"],
    run_dir_as_nobody: true,
    ..Harness::NONE
};

macro_rules! wasm_test {
    ($name:ident) => {
        cordon_testkit::reexec_test!(HARNESS, $name);
    };
}

/// The example parser built for wasm32-wasi into `dir`.
fn json_check(dir: &Path) -> PathBuf {
    let out = dir.join("json-check.wasm");
    cordon_testkit::wasm::clang("examples/wasm/json-check.c", &out, &[]);
    out
}

/// A module from WAT text, written into `dir`.
fn wat(dir: &Path, name: &str, text: &str) -> PathBuf {
    let bytes = wat::parse_str(text).expect("valid WAT");
    let p = dir.join(format!("{name}.wasm"));
    fs::write(&p, bytes).expect("write module");
    fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).expect("chmod");
    p
}

fn sha(path: &Path) -> String {
    cordon_wasm::sha256_hex(&fs::read(path).expect("read module"))
}

fn runtime(cache: &Path) -> Wasm {
    Wasm::new(
        Options {
            runner: Some(env!("CARGO_BIN_EXE_cordon-wasm").into()),
            cache: Some(cache.to_path_buf()),
        },
        Default::default(),
    )
    .expect("wasm runtime")
}

fn spec(module: &Path, argv: &[&str]) -> SandboxSpec {
    let mut s = SandboxSpec::new("w", argv.iter().copied());
    s.wasm = Some(WasmModule {
        path: module.to_path_buf(),
        sha256: sha(module),
        worker: false,
        function: None,
    });
    s.limits.wall = Duration::from_secs(20);
    s
}

fn call(rt: &Wasm, s: &SandboxSpec, input: &[u8]) -> cordon_runtime::Outcome {
    let problems = rt.check(s).problems;
    assert!(problems.is_empty(), "{problems:?}");
    rt.run(s, input.to_vec(), &Context::discard("t"))
        .expect("the call runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

wasm_test!(the_example_parses_good_input_rejects_bad_and_is_cached);
fn the_example_parses_good_input_rejects_bad_and_is_cached() {
    let d = cordon_testkit::scratch();
    let rt = runtime(&d.join("cache"));
    let s = spec(&json_check(&d), &["json-check"]);
    let good = call(
        &rt,
        &s,
        br#"{"a": [1, 2.5e3, "x\u00e9", true, null], "b": {}}"#,
    );
    assert_eq!(good.status, Status::Ok, "{good:?} {}", text(&good.stderr));
    assert_eq!(text(&good.stdout), "ok: 8 values, depth 2\n");
    assert_eq!(
        rt.cache_stats(),
        cordon_runtime::wasm::CacheStats {
            compiled: 1,
            hits: 0
        }
    );
    let cached: Vec<_> = fs::read_dir(d.join("cache"))
        .expect("the cache directory")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        cached.iter().any(|n| n.ends_with(".cwasm"))
            && cached.iter().any(|n| n.ends_with(".cwasm.sha256")),
        "{cached:?}"
    );
    // The second call runs the cached code.
    let bad = call(&rt, &s, br#"{"a": [1, 2,]}"#);
    assert_eq!(bad.status, Status::Exited, "{bad:?}");
    assert_eq!(bad.exit_code, Some(1));
    assert_eq!(text(&bad.stdout), "invalid: byte 12: value expected\n");
    assert_eq!(
        rt.cache_stats(),
        cordon_runtime::wasm::CacheStats {
            compiled: 1,
            hits: 1
        }
    );
    // Another broker (a later `cordon run`) finds it in the cache too.
    let again = runtime(&d.join("cache"));
    assert_eq!(call(&again, &s, b"[]").status, Status::Ok);
    assert_eq!(
        again.cache_stats(),
        cordon_runtime::wasm::CacheStats {
            compiled: 0,
            hits: 1
        }
    );
}

wasm_test!(a_corrupt_cache_entry_is_compiled_again);
fn a_corrupt_cache_entry_is_compiled_again() {
    let d = cordon_testkit::scratch();
    let rt = runtime(&d.join("cache"));
    let s = spec(&json_check(&d), &["json-check"]);
    assert_eq!(call(&rt, &s, b"[1]").status, Status::Ok);
    let code = fs::read_dir(d.join("cache"))
        .expect("cache")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "cwasm"))
        .expect("a compiled entry");
    let mut bytes = fs::read(&code).expect("read");
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0xff;
    fs::write(&code, bytes).expect("corrupt it");
    let o = call(&rt, &s, b"[2]");
    assert_eq!(o.status, Status::Ok, "{o:?} {}", text(&o.stderr));
    assert_eq!(
        rt.cache_stats(),
        cordon_runtime::wasm::CacheStats {
            compiled: 2,
            hits: 0
        },
        "the corrupt entry was not trusted"
    );
}

wasm_test!(a_module_whose_sha256_differs_is_refused);
fn a_module_whose_sha256_differs_is_refused() {
    let d = cordon_testkit::scratch();
    let rt = runtime(&d.join("cache"));
    let m = wat(&d, "ok", r#"(module (func (export "_start")))"#);
    // Positive control: the pinned digest runs.
    let s = spec(&m, &["ok"]);
    assert_eq!(call(&rt, &s, b"").status, Status::Ok);
    let actual = sha(&m);
    let mut wrong = s.clone();
    let expected = "0".repeat(64);
    wrong.wasm = Some(WasmModule {
        path: m.clone(),
        sha256: expected.clone(),
        worker: false,
        function: None,
    });
    let want = format!("sha256 mismatch: expected {expected}, actual {actual}");
    let problems = rt.check(&wrong).problems;
    assert!(problems.iter().any(|p| p.contains(&want)), "{problems:?}");
    match rt.run(&wrong, Vec::new(), &Context::discard("t")) {
        Err(RunError::Refused(why)) => assert!(why.contains(&want), "{why}"),
        other => panic!("not refused: {other:?}"),
    }
}

wasm_test!(a_runaway_loop_stops_at_the_wall_clock_as_a_time_limit_trap);
fn a_runaway_loop_stops_at_the_wall_clock_as_a_time_limit_trap() {
    let d = cordon_testkit::scratch();
    let rt = runtime(&d.join("cache"));
    let m = wat(
        &d,
        "spin",
        r#"(module (func (export "_start") (loop $l (br $l))))"#,
    );
    let mut s = spec(&m, &["spin"]);
    s.limits.wall = Duration::from_secs(2);
    let o = call(&rt, &s, b"");
    assert_eq!(o.status, Status::TimedOut, "{o:?} {}", text(&o.stderr));
    assert!(o.reason.contains("wasm trap: time limit"), "{}", o.reason);
}

/// A module that grows its linear memory by `pages` of 64 KiB.
fn grower(d: &Path, pages: u32) -> PathBuf {
    wat(
        d,
        &format!("grow{pages}"),
        &format!(
            r#"(module (memory 1)
                 (func (export "_start")
                   (if (i32.lt_s (memory.grow (i32.const {pages})) (i32.const 0))
                     (then unreachable))
                   (i32.store (i32.const {last}) (i32.const 7))))"#,
            last = (pages as u64 + 1) * 65536 - 4
        ),
    )
}

wasm_test!(linear_memory_past_the_limit_traps_as_a_memory_limit);
fn linear_memory_past_the_limit_traps_as_a_memory_limit() {
    let d = cordon_testkit::scratch();
    let rt = runtime(&d.join("cache"));
    // 96 MiB of linear memory.
    let m = grower(&d, 1536);
    // Positive control: under a 256 MiB limit it grows, writes its last
    // page and exits 0.
    let mut s = spec(&m, &["grow"]);
    s.limits.memory_bytes = 256 << 20;
    let o = call(&rt, &s, b"");
    assert_eq!(o.status, Status::Ok, "{o:?} {}", text(&o.stderr));
    // Under 64 MiB, the growth traps.
    s.limits.memory_bytes = 64 << 20;
    let o = call(&rt, &s, b"");
    assert_eq!(o.status, Status::MemoryLimit, "{o:?} {}", text(&o.stderr));
    assert!(o.reason.contains("wasm trap: memory limit"), "{}", o.reason);
}

wasm_test!(traps_are_reported_by_kind);
fn traps_are_reported_by_kind() {
    let d = cordon_testkit::scratch();
    let rt = runtime(&d.join("cache"));
    for (name, body, kind) in [
        (
            "oob",
            r#"(memory 1) (func (export "_start") (drop (i32.load (i32.const 0x7ffffff0))))"#,
            "out of bounds",
        ),
        (
            "unreachable",
            r#"(func (export "_start") unreachable)"#,
            "unreachable",
        ),
        (
            "recurse",
            r#"(func $f (export "_start") (call $f))"#,
            "stack overflow",
        ),
    ] {
        let m = wat(&d, name, &format!("(module {body})"));
        let o = call(&rt, &spec(&m, &[name]), b"");
        assert_eq!(o.status, Status::Exited, "{name}: {o:?}");
        assert!(
            o.reason.contains(&format!("wasm trap: {kind}")),
            "{name}: {} {}",
            o.reason,
            text(&o.stderr)
        );
    }
}

wasm_test!(only_the_manifests_directories_are_preopened_read_only);
fn only_the_manifests_directories_are_preopened_read_only() {
    let d = cordon_testkit::scratch();
    let rt = runtime(&d.join("cache"));
    let data = d.join("data");
    fs::create_dir(&data).expect("mkdir");
    fs::set_permissions(&data, fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::write(data.join("doc.json"), br#"{"k": [true]}"#).expect("write");
    fs::set_permissions(data.join("doc.json"), fs::Permissions::from_mode(0o644)).expect("chmod");
    let m = json_check(&d);
    let mut s = spec(&m, &["json-check", "/data/doc.json"]);
    s.mounts.push(Mount {
        src: data.clone(),
        dst: "/data".into(),
        writable: false,
    });
    // Positive control: the preopened file reads.
    let o = call(&rt, &s, b"");
    assert_eq!(o.status, Status::Ok, "{o:?} {}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "ok: 3 values, depth 2\n");
    // A file the jail has (its /etc) but no preopen covers: refused.
    s.argv = vec!["json-check".into(), "/etc/passwd".into()];
    let o = call(&rt, &s, b"");
    assert_eq!(o.exit_code, Some(2), "{o:?} {}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("/etc/passwd: Capabilities insufficient"),
        "{}",
        text(&o.stderr)
    );
    // A writable mount is refused, not preopened.
    s.mounts[0].writable = true;
    let problems = rt.check(&s).problems;
    assert!(
        problems
            .iter()
            .any(|p| p.contains("preopened read-only only")),
        "{problems:?}"
    );
}

#[test]
fn the_runtime_reads_the_runners_markers() {
    assert_eq!(cordon_runtime::wasm::TRAP_MARKER, cordon_wasm::TRAP_MARKER);
    assert_eq!(cordon_runtime::wasm::TRAP_EXIT, cordon_wasm::TRAP_EXIT);
    assert_eq!(
        cordon_runtime::wasm::SETUP_MARKER,
        cordon_wasm::SETUP_MARKER
    );
    assert_eq!(cordon_runtime::wasm::SETUP_EXIT, cordon_wasm::SETUP_EXIT);
}

#[test]
fn the_examples_pin_is_the_module_its_source_builds() {
    let d = cordon_testkit::scratch();
    let built = sha(&json_check(&d));
    let manifest =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/wasm.yaml"))
            .expect("examples/wasm.yaml");
    let pins: Vec<&str> = manifest
        .lines()
        .filter_map(|l| l.trim().strip_prefix("sha256: "))
        .collect();
    assert_eq!(
        pins.first().copied(),
        Some(built.as_str()),
        "examples/wasm.yaml pins another build of examples/wasm/json-check.c"
    );
    // Its components, built by scripts/build-wasm-example.sh's steps.
    for (m, what) in [
        (json_check_component(&d), "json-check.component.wasm"),
        (json_tools(&d), "json-tools.wasm"),
    ] {
        let built = sha(&m);
        assert!(
            pins.contains(&built.as_str()),
            "examples/wasm.yaml pins another build of {what} (built: {built})"
        );
    }
}

/// The directory of the workspace's binaries (`cordon-wasm-componentize`
/// is built there beside the runner).
fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_cordon-wasm"))
        .parent()
        .expect("the runner's directory")
        .to_path_buf()
}

/// The example parser as a WASI 0.2 command component, built into `dir`
/// as scripts/build-wasm-example.sh builds it.
fn json_check_component(dir: &Path) -> PathBuf {
    let out = dir.join("json-check.component.wasm");
    cordon_testkit::wasm::componentize(&bin_dir(), &[Path::new("command"), &json_check(dir), &out]);
    out
}

fn json_tools(dir: &Path) -> PathBuf {
    cordon_testkit::wasm::json_tools(&bin_dir(), dir)
}

fn function(mut s: SandboxSpec, name: &str) -> SandboxSpec {
    if let Some(w) = s.wasm.as_mut() {
        w.function = Some(name.to_string());
    }
    s
}

wasm_test!(a_components_typed_function_takes_json_arguments_and_answers_json);
fn a_components_typed_function_takes_json_arguments_and_answers_json() {
    let d = cordon_testkit::scratch();
    let rt = runtime(&d.join("cache"));
    let m = json_tools(&d);
    for on_worker in [false, true] {
        let mut s = function(spec(&m, &["json-tools"]), "check");
        if on_worker {
            s = worker(s);
        }
        // Its schema, read from the component's types.
        let schema = rt.input_schema(&s).expect("admitted").expect("a schema");
        assert_eq!(
            schema,
            serde_json::json!({"type": "object", "properties": {"document": {"type": "string"}},
                               "required": ["document"], "additionalProperties": false})
        );
        let ok = call(&rt, &s, br#"{"document": "{\"a\": [1, 2]}"}"#);
        assert_eq!(ok.status, Status::Ok, "{ok:?} {}", text(&ok.stderr));
        assert_eq!(text(&ok.stdout), "{\"depth\":2,\"values\":4}\n");
        // An error of the function's own `result`: exit 1, its value.
        let bad = call(&rt, &s, br#"{"document": "[1,"}"#);
        assert_eq!(
            (bad.status, bad.exit_code),
            (Status::Exited, Some(1)),
            "{bad:?}"
        );
        assert_eq!(
            text(&bad.stdout),
            "{\"byte\":3,\"reason\":\"value expected\"}\n"
        );
        // Arguments that do not fit the parameters: refused before the
        // function runs, naming the argument.
        for (args, why) in [
            (
                &br#"{"document": 7}"#[..],
                "`document`: expected a string, found a number",
            ),
            (b"{}", "argument `document` is missing"),
            (
                br#"{"document": "1", "more": 1}"#,
                "argument `more`: the function has no such parameter",
            ),
            (b"not json", "not JSON"),
        ] {
            let o = call(&rt, &s, args);
            assert_eq!(o.exit_code, Some(cordon_wasm::ARGUMENTS_EXIT), "{o:?}");
            assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
            let err = text(&o.stderr);
            assert!(
                err.contains(&format!("{}{why}", cordon_wasm::ARGUMENTS_MARKER)),
                "{err}"
            );
        }
        // A list, an omitted option and a given one.
        let all = function(s.clone(), "check-all");
        let o = call(&rt, &all, br#"{"documents": ["[1]", "{", "[[[0]]]"]}"#);
        assert_eq!(text(&o.stdout), "[true,false,true]\n", "{o:?}");
        let o = call(
            &rt,
            &all,
            br#"{"documents": ["[1]", "[[[0]]]"], "max-depth": 2}"#,
        );
        assert_eq!(text(&o.stdout), "[true,false]\n", "{o:?}");
    }
    assert_eq!(rt.workers_started(), 2, "one worker per function");
}

wasm_test!(a_command_component_runs_as_its_module_does);
fn a_command_component_runs_as_its_module_does() {
    let d = cordon_testkit::scratch();
    let rt = runtime(&d.join("cache"));
    let module = spec(&json_check(&d), &["json-check"]);
    let component = spec(&json_check_component(&d), &["json-check"]);
    assert_eq!(rt.input_schema(&component).expect("admitted"), None);
    for input in [&br#"{"a": [1, 2]}"#[..], b"[1, 2,]"] {
        let (a, b) = (call(&rt, &module, input), call(&rt, &component, input));
        assert_eq!((a.status, a.exit_code), (b.status, b.exit_code), "{b:?}");
        assert_eq!(text(&a.stdout), text(&b.stdout));
    }
    // On a worker too.
    let o = call(&rt, &worker(component), b"[true]");
    assert_eq!(text(&o.stdout), "ok: 2 values, depth 1\n", "{o:?}");
}

/// A component exporting `seven: func() -> u32`, importing `imports`.
fn seven(d: &Path, name: &str, imports: &str) -> PathBuf {
    wat(
        d,
        name,
        &format!(
            r#"(component
  {imports}
  (core module $m (func (export "f") (result i32) i32.const 7))
  (core instance $i (instantiate $m))
  (func (export "seven") (result u32) (canon lift (core func $i "f"))))"#
        ),
    )
}

wasm_test!(a_component_importing_a_socket_interface_is_refused);
fn a_component_importing_a_socket_interface_is_refused() {
    let d = cordon_testkit::scratch();
    let rt = runtime(&d.join("cache"));
    // Positive control: the same component without the import is called.
    let plain = function(spec(&seven(&d, "plain", ""), &["seven"]), "seven");
    assert!(rt.input_schema(&plain).is_ok());
    assert_eq!(text(&call(&rt, &plain, b"{}").stdout), "7\n");
    let net = function(
        spec(
            &seven(&d, "net", r#"(import "wasi:sockets/tcp@0.2.0" (instance))"#),
            &["seven"],
        ),
        "seven",
    );
    let why = rt.input_schema(&net).expect_err("refused");
    assert!(
        why.contains("the component imports wasi:sockets/tcp@0.2.0: a wasm tool has no network"),
        "{why}"
    );
    let e = rt
        .run(&net, b"{}".to_vec(), &Context::discard("t"))
        .expect_err("refused");
    assert!(
        matches!(&e, RunError::Refused(why) if why.contains("the component imports wasi:sockets/tcp@0.2.0")),
        "{e:?}"
    );
}

wasm_test!(a_function_that_is_not_there_or_of_a_core_module_is_refused);
fn a_function_that_is_not_there_or_of_a_core_module_is_refused() {
    let d = cordon_testkit::scratch();
    let rt = runtime(&d.join("cache"));
    let m = json_tools(&d);
    let why = rt
        .input_schema(&function(spec(&m, &["t"]), "parse"))
        .expect_err("refused");
    assert!(
        why.contains("the component exports no function `parse`; its functions: check, check-all"),
        "{why}"
    );
    // Without a function, a component that is no command is refused.
    let e = rt
        .run(&spec(&m, &["t"]), Vec::new(), &Context::discard("t"))
        .expect_err("refused");
    assert!(
        e.to_string()
            .contains("a component that exports no `wasi:cli/run`: name the typed function"),
        "{e}"
    );
    let core = function(spec(&json_check(&d), &["t"]), "check");
    let why = rt.input_schema(&core).expect_err("refused");
    assert!(
        why.contains("a core module: `function: check` names a typed function of a component"),
        "{why}"
    );
}

/// A module that prints a digit, then its stdin (up to 64 bytes): the
/// digit is '0' + a global it increments + a byte of linear memory it sets,
/// so a fresh instance prints `1`, and one whose globals and memory were
/// kept from a run before prints `3`.
fn stateful(d: &Path) -> PathBuf {
    wat(
        d,
        "stateful",
        r#"(module
  (import "wasi_snapshot_preview1" "fd_read" (func $read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $g (mut i32) (i32.const 0))
  (func (export "_start")
    (global.set $g (i32.add (global.get $g) (i32.const 1)))
    (i32.store8 (i32.const 100)
      (i32.add (i32.const 48) (i32.add (global.get $g) (i32.load8_u (i32.const 600)))))
    (i32.store8 (i32.const 600) (i32.const 1))
    (i32.store (i32.const 16) (i32.const 300))
    (i32.store (i32.const 20) (i32.const 64))
    (drop (call $read (i32.const 0) (i32.const 16) (i32.const 1) (i32.const 24)))
    (i32.store (i32.const 0) (i32.const 100))
    (i32.store (i32.const 4) (i32.const 1))
    (i32.store (i32.const 8) (i32.const 300))
    (i32.store (i32.const 12) (i32.load (i32.const 24)))
    ;; One iovec a call: WASI writes the first non-empty one.
    (drop (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 28)))
    (drop (call $write (i32.const 1) (i32.const 8) (i32.const 1) (i32.const 28)))))"#,
    )
}

fn worker(mut s: SandboxSpec) -> SandboxSpec {
    if let Some(w) = s.wasm.as_mut() {
        w.worker = true;
    }
    s
}

wasm_test!(a_warm_worker_serves_each_call_in_a_fresh_instance);
fn a_warm_worker_serves_each_call_in_a_fresh_instance() {
    let d = cordon_testkit::scratch();
    let rt = runtime(&d.join("cache"));
    let m = stateful(&d);
    // Positive control: in a jail per call, each run is a fresh process.
    let o = call(&rt, &spec(&m, &["stateful"]), b"a");
    assert_eq!((o.status, text(&o.stdout)), (Status::Ok, "1a".into()));
    assert_eq!(rt.workers_started(), 0);
    // Through one warm worker: every call its own stdin, and nothing of
    // the call before (its global, its memory) is seen.
    let s = worker(spec(&m, &["stateful"]));
    for input in ["first", "second", "third"] {
        let o = call(&rt, &s, input.as_bytes());
        assert_eq!(
            (o.status, text(&o.stdout)),
            (Status::Ok, format!("1{input}")),
            "{o:?}"
        );
        assert!(
            o.warnings.iter().any(|w| w.contains("warm Wasm worker")),
            "the call says how it ran: {:?}",
            o.warnings
        );
    }
    assert_eq!(rt.workers_started(), 1, "one worker served all three");
    assert_eq!(rt.idle_workers(), 1);
}

wasm_test!(a_warm_workers_calls_keep_their_limits_and_a_failed_call_harms_no_other);
fn a_warm_workers_calls_keep_their_limits_and_a_failed_call_harms_no_other() {
    let d = cordon_testkit::scratch();
    let rt = runtime(&d.join("cache"));
    let ok = worker(spec(&stateful(&d), &["stateful"]));
    let spin = wat(
        &d,
        "spin",
        r#"(module (func (export "_start") (loop $l (br $l))))"#,
    );
    let mut s = worker(spec(&spin, &["spin"]));
    s.limits.wall = Duration::from_secs(1);
    let o = call(&rt, &s, b"");
    assert_eq!(o.status, Status::TimedOut, "{o:?} {}", text(&o.stderr));
    assert!(o.reason.contains("wasm trap: time limit"), "{}", o.reason);

    let mut s = worker(spec(&grower(&d, 1536), &["grow"]));
    s.limits.memory_bytes = 256 << 20;
    assert_eq!(call(&rt, &s, b"").status, Status::Ok);
    s.limits.memory_bytes = 64 << 20;
    let o = call(&rt, &s, b"");
    assert_eq!(o.status, Status::MemoryLimit, "{o:?} {}", text(&o.stderr));

    // 64 bytes of stdin echoed: past a cap of 10 the call is stopped.
    let mut capped = ok.clone();
    capped.limits.output_bytes = 10;
    let o = call(&rt, &capped, &[b'x'; 64]);
    assert_eq!(o.status, Status::OutputCap, "{o:?}");
    assert!(o.stdout.len() <= 10, "{o:?}");
    // Within the cap: the same worker answers.
    let o = call(&rt, &capped, b"abc");
    assert_eq!((o.status, text(&o.stdout)), (Status::Ok, "1abc".into()));

    let mut trap = worker(spec(
        &wat(
            &d,
            "unreachable",
            r#"(module (func (export "_start") unreachable))"#,
        ),
        &["u"],
    ));
    trap.limits.wall = Duration::from_secs(5);
    let o = call(&rt, &trap, b"");
    assert!(o.reason.contains("wasm trap: unreachable"), "{o:?}");
    // After all of it, a call is as on a fresh worker.
    let o = call(&rt, &ok, b"z");
    assert_eq!((o.status, text(&o.stdout)), (Status::Ok, "1z".into()));
}
