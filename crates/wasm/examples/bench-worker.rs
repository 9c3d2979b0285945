//! The broker path of a Wasm call, same run (docs/benchmarks.md, "Wasm
//! worker"): the example parser (target/wasm/json-check.wasm, built by
//! scripts/setup.sh) called through `Runtime::run` three ways, with the
//! same limits, on the same jail:
//!
//! - **native**: the same C source compiled natively
//!   (target/wasm/json-check), a fresh native P1 jail per call;
//! - **wasm**: the module, a fresh jail and runner per call (its compiled
//!   code cached);
//! - **worker**: the module on a warm worker (`module: {worker: true}`):
//!   one jail kept, each call a fresh instance.
//!
//! For trivial work (`[]`) and a parse of 1 MiB of JSON; calls
//! interleaved, medians and the ratio of each to native. Then the same
//! parser as components (target/wasm/json-check.component.wasm, a WASI 0.2
//! command, and target/wasm/json-tools.wasm's typed function `check`, its
//! argument the document as a JSON string), per call and on a worker,
//! against the same native calls. Run as root after
//! scripts/setup.sh: `cargo run --release -p cordon-wasm --example
//! bench-worker -- [CALLS]` (the runner: target/release/cordon-wasm, built
//! by the same command's workspace, or $CORDON_WASM). Nothing leaves the
//! machine.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cordon_runtime::native::Native;
use cordon_runtime::spec::WasmModule;
use cordon_runtime::wasm::{Options, Wasm};
use cordon_runtime::{Context, Mount, Runtime, SandboxSpec, Status};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap_or_default()
}

fn document(size: usize) -> Vec<u8> {
    let item =
        r#"{"id": 12345, "name": "caf\u00e9 \"x\"", "tags": [true, false, null], "v": -1.5e3}"#;
    let n = size / (item.len() + 1);
    format!("[{}]", vec![item; n].join(",")).into_bytes()
}

fn median(mut v: Vec<Duration>) -> f64 {
    v.sort();
    v[v.len() / 2].as_secs_f64() * 1e3
}

fn main() -> Result<(), String> {
    let calls: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse().map_err(|_| format!("not a count: {a}")))
        .transpose()?
        .unwrap_or(200);
    let module = root().join("target/wasm/json-check.wasm");
    let native_bin = root().join("target/wasm/json-check");
    for f in [&module, &native_bin] {
        if !f.exists() {
            return Err(format!("{} missing: run scripts/setup.sh", f.display()));
        }
    }
    let runner = std::env::var_os("CORDON_WASM")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            std::env::current_exe()
                .ok()
                .and_then(|e| Some(e.parent()?.parent()?.join("cordon-wasm")))
                .unwrap_or_default()
        });
    let cache = tempfile::tempdir().map_err(|e| e.to_string())?;
    let jail = std::sync::Arc::new(
        cordon_jail::Jail::with_options(Default::default()).map_err(|e| e.to_string())?,
    );
    let wasm = Wasm::with_jail(
        Options {
            runner: Some(runner),
            cache: Some(cache.path().to_path_buf()),
        },
        jail.clone(),
    );
    let native = Native::from_jail(jail);
    let bytes = std::fs::read(&module).map_err(|e| e.to_string())?;
    let sha = cordon_wasm::sha256_hex(&bytes);
    let limits = |s: &mut SandboxSpec| {
        s.limits.wall = Duration::from_secs(20);
        s.limits.memory_bytes = 256 << 20;
        s.limits.output_bytes = 64 << 10;
    };
    let mut per_call = SandboxSpec::new("wasm", ["json-check"]);
    per_call.wasm = Some(WasmModule {
        path: module.clone(),
        sha256: sha.clone(),
        worker: false,
        function: None,
    });
    limits(&mut per_call);
    let mut worker = per_call.clone();
    if let Some(w) = worker.wasm.as_mut() {
        w.worker = true;
    }
    let mut nat = SandboxSpec::new("native", [native_bin.to_string_lossy().into_owned()]);
    nat.mounts.push(Mount {
        src: native_bin.clone(),
        dst: native_bin.clone(),
        writable: false,
    });
    limits(&mut nat);
    let ctx = Context::discard("bench");
    // Each call's time, and the part of it the worker spent on the call
    // (from the fresh instance to its end; the rest is the round trip).
    let inside = std::cell::RefCell::new(Vec::new());
    let run = |rt: &dyn Runtime, s: &SandboxSpec, input: &[u8]| -> Result<Duration, String> {
        let t = Instant::now();
        let o = rt
            .run(s, input.to_vec(), &ctx)
            .map_err(|e| format!("{}: {e}", s.tool))?;
        let took = t.elapsed();
        if s.wasm.as_ref().is_some_and(|w| w.worker) {
            inside
                .borrow_mut()
                .push(o.duration.saturating_sub(o.setup.unwrap_or_default()));
        }
        if o.status != Status::Ok
            || !(o.stdout.starts_with(b"ok:") || o.stdout.starts_with(b"{\"depth\""))
        {
            return Err(format!("{}: {:?} {}", s.tool, o.status, o.reason));
        }
        Ok(took)
    };
    println!(
        "| work | native P1 jail ms | wasm, jail per call ms (ratio) | wasm worker ms (ratio) |"
    );
    println!("|---|---:|---:|---:|");
    for (label, input) in [
        ("`[]`", b"[]".to_vec()),
        ("1 MiB of JSON", document(1 << 20)),
    ] {
        // Warm-up: the cache filled, the worker started.
        run(&wasm, &per_call, &input)?;
        run(&wasm, &worker, &input)?;
        run(&native, &nat, &input)?;
        inside.borrow_mut().clear();
        let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..calls {
            a.push(run(&native, &nat, &input)?);
            b.push(run(&wasm, &per_call, &input)?);
            c.push(run(&wasm, &worker, &input)?);
        }
        let (a, b, c) = (median(a), median(b), median(c));
        let within = median(std::mem::take(&mut *inside.borrow_mut()));
        println!(
            "| {label} | {a:.2} | {b:.2} ({:.2}x) | {c:.2} ({:.3}x; {within:.2} of it in the worker) |",
            b / a,
            c / a
        );
    }
    // Components: the command, and the typed function (its argument the
    // document as a JSON string: the runner parses the arguments, then
    // the function parses the document).
    let component = |name: &str, function: Option<&str>| -> Result<SandboxSpec, String> {
        let path = root().join("target/wasm").join(name);
        let bytes = std::fs::read(&path)
            .map_err(|e| format!("{}: {e}: run scripts/setup.sh", path.display()))?;
        let mut s = SandboxSpec::new(name, ["json-check"]);
        s.wasm = Some(WasmModule {
            path,
            sha256: cordon_wasm::sha256_hex(&bytes),
            worker: false,
            function: function.map(str::to_string),
        });
        limits(&mut s);
        Ok(s)
    };
    let on_worker = |mut s: SandboxSpec| {
        if let Some(w) = s.wasm.as_mut() {
            w.worker = true;
        }
        s
    };
    let command = component("json-check.component.wasm", None)?;
    let function = component("json-tools.wasm", Some("check"))?;
    println!(
        "\n| work | native P1 jail ms | command component, jail per call (ratio) | on a worker (ratio) | typed function, jail per call (ratio) | on a worker (ratio) |"
    );
    println!("|---|---:|---:|---:|---:|---:|");
    for (label, input) in [
        ("`[]`", b"[]".to_vec()),
        ("1 MiB of JSON", document(1 << 20)),
    ] {
        let args = serde_json::to_vec(&serde_json::json!({
            "document": String::from_utf8_lossy(&input)
        }))
        .map_err(|e| e.to_string())?;
        let specs = [
            (command.clone(), &input),
            (on_worker(command.clone()), &input),
            (function.clone(), &args),
            (on_worker(function.clone()), &args),
        ];
        for (s, i) in &specs {
            run(&wasm, s, i)?;
        }
        run(&native, &nat, &input)?;
        let mut times = vec![Vec::new(); specs.len() + 1];
        for _ in 0..calls {
            times[0].push(run(&native, &nat, &input)?);
            for (k, (s, i)) in specs.iter().enumerate() {
                times[k + 1].push(run(&wasm, s, i)?);
            }
        }
        let m: Vec<f64> = times.into_iter().map(median).collect();
        print!("| {label} | {:.2} |", m[0]);
        for x in &m[1..] {
            print!(" {x:.2} ({:.3}x) |", x / m[0]);
        }
        println!();
    }
    println!(
        "\n{calls} calls of each, interleaved; workers started: {}",
        wasm.workers_started()
    );
    Ok(())
}
