//! The probe module against the real wasm runtime (the runner
//! `cordon-wasm` inside the native P1 jail): every probe holds for a tool
//! shaped like examples/wasm.yaml's, and each probe that can be made to
//! get through does, when the sandbox gives more than the profile claims
//! (the host's /etc preopened, a higher memory limit, a longer wall clock, a larger
//! output cap, a variable the manifest does not give). The module is built
//! from crates/probes/wasm/probe.c with Debian's clang-14 for wasm32-wasi
//! (scripts/setup.sh installs it): without it these tests fail, they never
//! skip. The runner is `cordon-wasm` beside the test's target directory
//! (`cargo build -p cordon-wasm`; the workspace's test build makes it).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cordon_probes::wasm::WasmTarget;
use cordon_probes::{Filter, Profile, Report, Verdict, run_wasm_suite};
use cordon_runtime::spec::WasmModule;
use cordon_runtime::wasm::{Options, Wasm};
use cordon_runtime::{Mount, SandboxSpec};

/// The probe module built from its committed source into `dir`.
fn probe_module(dir: &Path) -> PathBuf {
    let out = dir.join("cordon-probe.wasm");
    cordon_testkit::wasm::clang("crates/probes/wasm/probe.c", &out, &[]);
    out
}

/// The runner: `cordon-wasm` in the target directory this test runs from.
fn runner() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    let r = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("cordon-wasm");
    assert!(
        r.is_file(),
        "no runner at {}: build it with `cargo build -p cordon-wasm`",
        r.display()
    );
    r
}

struct Setup {
    _dir: cordon_testkit::Scratch,
    runtime: Arc<Wasm>,
    module: PathBuf,
}

fn setup() -> Setup {
    let dir = cordon_testkit::scratch();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).expect("chmod");
    let module = probe_module(&dir);
    let runtime = Wasm::new(
        Options {
            runner: Some(runner()),
            cache: Some(dir.join("cache")),
        },
        Default::default(),
    )
    .expect("wasm runtime");
    Setup {
        _dir: dir,
        runtime: Arc::new(runtime),
        module,
    }
}

/// A tool shaped like examples/wasm.yaml's: P1 limits but the example's
/// memory (128M), output cap (64K) and a short wall clock; the manifest's
/// environment.
fn spec(s: &Setup) -> SandboxSpec {
    let mut spec = SandboxSpec::new("w", ["json-check"]);
    spec.wasm = Some(WasmModule {
        path: s.module.clone(),
        sha256: cordon_wasm_sha(&s.module),
        worker: false,
        function: None,
    });
    spec.limits.memory_bytes = 128 << 20;
    spec.limits.output_bytes = 64 << 10;
    spec.limits.wall = Duration::from_secs(5);
    spec.env = vec![
        ("PATH".into(), "/usr/bin:/bin".into()),
        ("HOME".into(), "/nonexistent".into()),
        ("LANG".into(), "C.UTF-8".into()),
        ("TOOL_MODE".into(), "strict".into()),
    ];
    spec
}

fn cordon_wasm_sha(p: &Path) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(fs::read(p).expect("read module")))
}

/// What `spec` claims, as `cordon probe` derives it from a manifest.
fn claims(spec: &SandboxSpec) -> Profile {
    let mut p = Profile::unclaimed("w (P1)");
    p.limits.memory_bytes = Some(spec.limits.memory_bytes);
    p.limits.wall = Some(spec.limits.wall);
    p.limits.output_bytes = Some(spec.limits.output_bytes);
    p.mounts = spec.mounts.iter().map(|m| m.dst.clone()).collect();
    p
}

fn run(s: &Setup, spec: SandboxSpec, claimed: &Profile, only: &[&str]) -> Report {
    let target = WasmTarget::new(s.runtime.clone(), spec, s.module.clone());
    let filter = Filter {
        only: only.iter().map(|s| s.to_string()).collect(),
        skip: Vec::new(),
    };
    let r = run_wasm_suite(&target, claimed, &filter);
    print!("{}", r.to_human());
    r
}

fn verdict(r: &Report, probe: &str) -> (Verdict, String) {
    let res = r
        .get(probe)
        .unwrap_or_else(|| panic!("no result for {probe}"));
    (res.verdict, res.evidence.clone())
}

#[test]
fn every_probe_holds_in_the_example_shaped_tool() {
    let s = setup();
    let data = cordon_testkit::scratch();
    fs::write(data.join("input.json"), "{}").expect("write");
    fs::set_permissions(&data, fs::Permissions::from_mode(0o755)).expect("chmod");
    fs::set_permissions(data.join("input.json"), fs::Permissions::from_mode(0o644)).expect("chmod");
    let mut spec = spec(&s);
    // A read-only preopen with a file in it: the write probe tries it.
    spec.mounts.push(Mount {
        src: data.to_path_buf(),
        dst: "/data".into(),
        writable: false,
    });
    let claimed = claims(&spec);
    let r = run(&s, spec, &claimed, &[]);
    for p in [
        "control",
        "host_fs",
        "write",
        "env",
        "network",
        "fds",
        "tty",
        "fresh_task",
        "memory",
        "time",
        "output",
    ] {
        let (v, ev) = verdict(&r, p);
        assert_eq!(v, Verdict::Held, "{p}: {ev}");
    }
    // On a warm worker, two calls in a row share the jail, not the
    // instance (the control, a kept instance that shows the first call's
    // state, is crates/wasm/src/worker.rs's test).
    let mut on_worker = self::spec(&s);
    if let Some(w) = on_worker.wasm.as_mut() {
        w.worker = true;
    }
    let w = run(&s, on_worker, &claimed, &["fresh_task"]);
    let (v, ev) = verdict(&w, "fresh_task");
    assert_eq!(v, Verdict::Held, "{ev}");
    assert!(
        ev.contains("the second of two calls in a row: no global or memory of an earlier call"),
        "{ev}"
    );
    assert_eq!(r.count(Verdict::Escaped), 0);
    assert_eq!(r.count(Verdict::Error), 0);
    // Every other probe says why it does not apply.
    for res in &r.results {
        if res.verdict == Verdict::Skipped {
            assert!(
                res.evidence.starts_with("not applicable: "),
                "{}: {}",
                res.probe,
                res.evidence
            );
        }
    }
    assert!(verdict(&r, "mount").1.contains("no system calls"));
    // The specific refusals.
    let (_, ev) = verdict(&r, "host_fs");
    assert!(
        ev.contains("/etc/passwd: Capabilities insufficient"),
        "{ev}"
    );
    assert!(ev.contains("/data/../etc/passwd: "), "{ev}");
    let (_, ev) = verdict(&r, "write");
    assert!(ev.contains("create /data/.cordon-probe-write: "), "{ev}");
    assert!(ev.contains("append /data/input.json: "), "{ev}");
    assert!(ev.contains("unlink /data/input.json: "), "{ev}");
    assert_eq!(
        fs::read_to_string(data.join("input.json")).expect("read"),
        "{}"
    );
    let (_, ev) = verdict(&r, "env");
    assert!(ev.contains("TOOL_MODE"), "{ev}");
    let (_, ev) = verdict(&r, "network");
    assert!(ev.contains("sock_accept(0): Not a socket"), "{ev}");
    let (_, ev) = verdict(&r, "memory");
    assert!(ev.contains("wasm trap: memory limit"), "{ev}");
    let (_, ev) = verdict(&r, "time");
    assert!(ev.contains("wasm trap: time limit"), "{ev}");
    let (_, ev) = verdict(&r, "output");
    assert!(ev.contains("status OutputCap"), "{ev}");
    assert_eq!(r.exit_code(), cordon_probes::report::EXIT_ALL_HELD);
}

#[test]
fn a_preopen_of_the_hosts_etc_lets_the_module_read_its_files() {
    let s = setup();
    let mut spec = spec(&s);
    spec.mounts.push(Mount {
        src: "/etc".into(),
        dst: "/host-etc".into(),
        writable: false,
    });
    let claimed = claims(&spec);
    let r = run(&s, spec, &claimed, &["host_fs", "write"]);
    let (v, ev) = verdict(&r, "host_fs");
    assert_eq!(v, Verdict::Escaped, "{ev}");
    assert!(
        ev.contains("OPENED /host-etc/passwd and read 64 bytes through the preopen /host-etc"),
        "{ev}"
    );
    // Read-only all the same.
    let (v, ev) = verdict(&r, "write");
    assert_eq!(v, Verdict::Held, "{ev}");
    assert!(
        ev.contains("create /host-etc/.cordon-probe-write: "),
        "{ev}"
    );
    assert!(ev.contains("append /host-etc/"), "{ev}");
    assert_eq!(r.exit_code(), cordon_probes::report::EXIT_ESCAPED);
}

#[test]
fn limits_larger_than_claimed_let_the_module_through() {
    let s = setup();
    let mut spec = spec(&s);
    spec.limits.memory_bytes = 256 << 20;
    spec.limits.wall = Duration::from_secs(20);
    spec.limits.output_bytes = 4 << 20;
    // The profile claims the example's limits; the sandbox gives more.
    let mut claimed = claims(&spec);
    claimed.limits.memory_bytes = Some(64 << 20);
    claimed.limits.wall = Some(Duration::from_secs(1));
    claimed.limits.output_bytes = Some(64 << 10);
    let r = run(&s, spec, &claimed, &["memory", "time", "output"]);
    let (v, ev) = verdict(&r, "memory");
    assert_eq!(v, Verdict::Escaped, "{ev}");
    assert!(ev.contains("linear memory GREW to"), "{ev}");
    let (v, ev) = verdict(&r, "time");
    assert_eq!(v, Verdict::Escaped, "{ev}");
    assert!(ev.contains("RAN "), "{ev}");
    let (v, ev) = verdict(&r, "output");
    assert_eq!(v, Verdict::Escaped, "{ev}");
    assert!(
        ev.contains("bytes of output reached the caller, past the cap of 65536"),
        "{ev}"
    );
}

#[test]
fn a_variable_the_manifest_does_not_give_is_an_escape() {
    let s = setup();
    let spec = spec(&s);
    let claimed = claims(&spec);
    let mut target = WasmTarget::new(s.runtime.clone(), spec, s.module.clone());
    // The sandbox gives TOOL_MODE; say the manifest did not.
    target.env.retain(|v| v != "TOOL_MODE");
    let filter = Filter {
        only: vec!["env".into()],
        skip: Vec::new(),
    };
    let r = run_wasm_suite(&target, &claimed, &filter);
    print!("{}", r.to_human());
    let (v, ev) = verdict(&r, "env");
    assert_eq!(v, Verdict::Escaped, "{ev}");
    assert!(
        ev.contains("variables the manifest does not give: TOOL_MODE"),
        "{ev}"
    );
}
