//! The warm worker (`cordon-wasm serve`, `module: {worker: true}`): one
//! runner in one jail serving one call at a time, the module loaded and
//! linked once, each call run in a fresh [`wasmtime::Store`] and instance
//! (nothing of a call's linear memory, globals, tables or WASI state is
//! kept), its stdin given and its stdout and stderr kept in memory up to
//! their caps. The protocol is `cordon_wasm_wire`'s.
//!
//! The wall clock of each call is an epoch deadline counted in ticks of a
//! thread that advances the engine's epoch once per [`TICK`] of real time
//! (catching up when it wakes late, as it does on a loaded host); a module past
//! its stdout cap is stopped there (a trap the worker reports as the
//! output cap); stderr past its cap is counted and dropped.

use std::io::{self, BufReader, BufWriter};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use cordon_wasm_wire::{End, Reply};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

use crate::{Failure, RunOptions, Stdio};

/// How often the worker's epoch advances: a call's wall clock is kept to
/// within about this.
pub const TICK: Duration = Duration::from_millis(10);

/// Advances the epoch (`bump`) to one tick per [`TICK`] of real time from
/// `start` to `now`, `ticks` being how many it has had: a thread that
/// wakes late (a loaded host stretches every sleep) catches up, so a
/// call's wall clock is real time, never a count of sleeps.
fn catch_up(start: Instant, now: Instant, ticks: &mut u64, mut bump: impl FnMut()) {
    let since = now.saturating_duration_since(start);
    let due = u64::try_from(since.as_micros() / TICK.as_micros()).unwrap_or(u64::MAX);
    while *ticks < due {
        bump();
        *ticks += 1;
    }
}

/// The longest request (a call's stdin) a worker reads.
pub const REQUEST_MAX: u64 = 256 << 20;

/// The error of a write past the stdout cap.
pub const OUTPUT_CAP_HIT: &str = "cordon-wasm: output past its cap";

/// A write past the stdout cap (the module is stopped there).
#[derive(Debug)]
pub struct OutputCapHit;

impl std::fmt::Display for OutputCapHit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(OUTPUT_CAP_HIT)
    }
}

impl std::error::Error for OutputCapHit {}

/// An output kept in memory up to `cap` bytes. Past it, stdout stops the
/// module (`stop`), stderr is counted and dropped.
#[derive(Clone)]
pub struct Capped {
    cap: usize,
    stop: bool,
    kept: Arc<Mutex<Vec<u8>>>,
    total: Arc<AtomicU64>,
}

impl Capped {
    pub fn new(cap: u64, stop: bool) -> Capped {
        Capped {
            cap: usize::try_from(cap).unwrap_or(usize::MAX),
            stop,
            kept: Arc::default(),
            total: Arc::default(),
        }
    }

    /// What was kept, and every byte written.
    fn taken(&self) -> (Vec<u8>, u64) {
        let kept = self
            .kept
            .lock()
            .map(|mut k| std::mem::take(&mut *k))
            .unwrap_or_default();
        (kept, self.total.load(Ordering::SeqCst))
    }

    /// Keep what fits; `Err` when past the cap and stopping.
    pub(crate) fn put(&self, bytes: &[u8]) -> Result<(), OutputCapHit> {
        self.total.fetch_add(bytes.len() as u64, Ordering::SeqCst);
        let Ok(mut kept) = self.kept.lock() else {
            return Err(OutputCapHit);
        };
        let room = self.cap.saturating_sub(kept.len());
        kept.extend_from_slice(&bytes[..bytes.len().min(room)]);
        if bytes.len() > room && self.stop {
            return Err(OutputCapHit);
        }
        Ok(())
    }
}

impl IsTerminal for Capped {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for Capped {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

impl OutputStream for Capped {
    fn write(&mut self, bytes: bytes::Bytes) -> StreamResult<()> {
        self.put(&bytes)
            .map_err(|e| StreamError::Trap(wasmtime::Error::new(e)))
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        // Always writable: what is past the cap is refused or dropped
        // by `write`.
        Ok(1 << 20)
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for Capped {
    async fn ready(&mut self) {}
}

impl tokio::io::AsyncWrite for Capped {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Poll::Ready(
            self.put(buf)
                .map(|()| buf.len())
                .map_err(|e| io::Error::other(e.to_string())),
        )
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// Serve calls on stdin and stdout until stdin ends: each a fresh
/// instance of `o`'s module with the request as its stdin, stdout capped
/// at `output_cap` and stderr at `stderr_cap`. `Err` only when the module
/// does not load or the stream fails (nothing more can be served).
pub fn serve(o: &RunOptions, output_cap: u64, stderr_cap: u64) -> Result<(), String> {
    let loaded = crate::load(o, crate::Allocation::Pooled).map_err(|f| match f {
        Failure::Setup(why) => why,
        other => format!("{other:?}"),
    })?;
    let ticker = loaded.engine.clone();
    let start = Instant::now();
    std::thread::Builder::new()
        .name("wasm-epoch".into())
        .spawn(move || {
            let mut ticks = 0;
            loop {
                std::thread::sleep(TICK);
                catch_up(start, Instant::now(), &mut ticks, || {
                    ticker.increment_epoch()
                });
            }
        })
        .map_err(|e| format!("epoch thread: {e}"))?;
    let deadline = (o.wall.as_micros() / TICK.as_micros()).max(1) as u64 + 1;
    let mut input = BufReader::new(io::stdin().lock());
    let mut output = BufWriter::new(io::stdout().lock());
    while let Some(stdin) = cordon_wasm_wire::read_request(&mut input, REQUEST_MAX)
        .map_err(|e| format!("reading a request: {e}"))?
    {
        let stdout = Capped::new(output_cap, true);
        let stderr = Capped::new(stderr_cap, false);
        let began = Instant::now();
        let r = crate::run_in(
            &loaded,
            o,
            Stdio::Memory {
                stdin,
                stdout: stdout.clone(),
                stderr: stderr.clone(),
            },
            deadline,
        );
        let run = began.elapsed();
        let (end, over) = match r {
            Ok(code) => (End::Exit(code), false),
            Err(Failure::OutputCap) => (End::Exit(0), true),
            Err(Failure::Trap(kind, detail)) => (
                End::Trap {
                    kind: kind.name().to_string(),
                    detail,
                },
                false,
            ),
            Err(Failure::Setup(why)) => (End::Setup(why), false),
            Err(Failure::Arguments(why)) => {
                let line = format!("{}{why}\n", crate::ARGUMENTS_MARKER);
                // stderr drops what is past its cap: never an error.
                let _ = stderr.put(line.as_bytes());
                (End::Exit(crate::ARGUMENTS_EXIT), false)
            }
        };
        let (out, out_total) = stdout.taken();
        let (err, err_total) = stderr.taken();
        let reply = Reply {
            end,
            stdout_over: over || out_total > out.len() as u64,
            stdout: out,
            stderr: err,
            stderr_total: err_total,
            run,
        };
        cordon_wasm_wire::write_reply(&mut output, &reply)
            .map_err(|e| format!("writing a reply: {e}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Limiter, State};
    use wasmtime::Store;
    use wasmtime_wasi::WasiCtxBuilder;

    /// Prints '0' + a global it increments + a byte of memory it
    /// increments, which a data segment sets to 2 (memory made from the
    /// module's copy-on-write image).
    const STATEFUL: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_write" (func $write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (global $g (mut i32) (i32.const 0))
  (data (i32.const 600) "\02")
  (func (export "_start")
    (global.set $g (i32.add (global.get $g) (i32.const 1)))
    (i32.store8 (i32.const 600) (i32.add (i32.load8_u (i32.const 600)) (i32.const 1)))
    (i32.store8 (i32.const 100)
      (i32.add (i32.const 48) (i32.add (global.get $g) (i32.load8_u (i32.const 600)))))
    (i32.store (i32.const 0) (i32.const 100))
    (i32.store (i32.const 4) (i32.const 1))
    (drop (call $write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))"#;

    /// `wat` compiled into `dir`'s cache for a 16 MiB linear memory, and
    /// the options that run it.
    fn compiled(dir: &std::path::Path, wat: &str) -> RunOptions {
        let module = dir.join("m.wasm");
        let bytes = wat::parse_str(wat).unwrap();
        std::fs::write(&module, &bytes).unwrap();
        let c = crate::compile_cached(
            &module,
            &crate::sha256_hex(&bytes),
            &dir.join("cache"),
            16 << 20,
            None,
        )
        .unwrap();
        RunOptions {
            code: c.path.clone(),
            code_sha256: c.code_sha256.clone(),
            memory: 16 << 20,
            wall: Duration::from_secs(10),
            dirs: Vec::new(),
            argv: vec!["m".into()],
            call: None,
        }
    }

    fn printed(c: &Capped) -> String {
        String::from_utf8_lossy(&c.taken().0).into_owned()
    }

    /// The epoch counts real time: woken late, the thread catches up (a
    /// count of sleeps would have advanced once, and a loaded host would
    /// have let a call run past its wall clock).
    #[test]
    fn a_late_epoch_thread_catches_up_with_real_time() {
        let start = Instant::now();
        let late = start + TICK * 5 + TICK / 2;
        let mut ticks = 0;
        let mut bumped = 0;
        catch_up(start, late, &mut ticks, || bumped += 1);
        assert_eq!((ticks, bumped), (5, 5));
        // Nothing more is due until the next tick; then one.
        catch_up(start, late, &mut ticks, || bumped += 1);
        assert_eq!(bumped, 5);
        catch_up(start, late + TICK, &mut ticks, || bumped += 1);
        assert_eq!((ticks, bumped), (6, 6));
    }

    /// What the worker does per call (a fresh store and instance) sees
    /// nothing of the call before; the control, one instance run twice,
    /// does: the test would see state that crossed.
    #[test]
    fn each_call_is_a_fresh_instance_and_a_kept_one_would_show() {
        let dir = tempfile::tempdir().unwrap();
        let o = compiled(dir.path(), STATEFUL);
        // The worker's engine: instances from the pool, each slot reset
        // between them.
        let loaded = crate::load(&o, crate::Allocation::Pooled).unwrap();

        // Control: one instance, `_start` twice.
        let out = Capped::new(1024, true);
        let mut b = WasiCtxBuilder::new();
        b.stdout(out.clone());
        let mut store = Store::new(
            &loaded.engine,
            State {
                wasi: b.build_p1(),
                limiter: Limiter { memory: 16 << 20 },
            },
        );
        store.set_epoch_deadline(1 << 30);
        let (module, linker) = loaded.module.as_ref().unwrap();
        let inst = linker.instantiate(&mut store, module).unwrap();
        let start = inst.get_typed_func::<(), ()>(&mut store, "_start").unwrap();
        start.call(&mut store, ()).unwrap();
        start.call(&mut store, ()).unwrap();
        assert_eq!(printed(&out), "46", "a kept instance keeps its state");

        // The worker's way: a fresh store and instance each call.
        for _ in 0..3 {
            let out = Capped::new(1024, true);
            let r = crate::run_in(
                &loaded,
                &o,
                Stdio::Memory {
                    stdin: Vec::new(),
                    stdout: out.clone(),
                    stderr: Capped::new(1024, false),
                },
                1 << 30,
            );
            assert_eq!(r.ok(), Some(0));
            assert_eq!(printed(&out), "4");
        }
    }

    /// The worker's instances come from the pool, whose slots have fixed
    /// sizes: a module whose table could never fit one is refused when
    /// the worker loads it, naming the limit, while the per-call runner
    /// (instances mapped on demand) loads it.
    #[test]
    fn the_worker_pools_its_instances_and_refuses_a_module_no_slot_fits() {
        let dir = tempfile::tempdir().unwrap();
        let o = compiled(
            dir.path(),
            &format!(
                r#"(module (table {} funcref) (func (export "_start")))"#,
                crate::POOL_TABLE_ELEMENTS + 1
            ),
        );
        assert!(crate::load(&o, crate::Allocation::OnDemand).is_ok());
        match crate::load(&o, crate::Allocation::Pooled) {
            Err(Failure::Setup(why)) => assert!(
                why.contains("table") && why.contains(&crate::POOL_TABLE_ELEMENTS.to_string()),
                "{why}"
            ),
            Err(other) => panic!("{other:?}"),
            Ok(_) => panic!("a table past the pool's slots loaded"),
        }
    }

    /// The runner refuses a component importing a socket interface when
    /// it loads it, even when its compiled code got past the compile
    /// step's check (here: compiled by hand, as a tampered cache would
    /// hold it). Positive control: the same component without the import
    /// loads.
    #[test]
    fn the_runner_refuses_a_component_that_imports_sockets_when_it_loads_it() {
        let dir = tempfile::tempdir().unwrap();
        let component = |name: &str, import: &str| {
            let bytes = wat::parse_str(format!(
                r#"(component {import} (core module $m (func (export "f") (result i32) i32.const 7))
                     (core instance $i (instantiate $m))
                     (func (export "seven") (result u32) (canon lift (core func $i "f"))))"#
            ))
            .unwrap();
            let engine = crate::engine(16 << 20, crate::Allocation::OnDemand).unwrap();
            let code = engine.precompile_component(&bytes).unwrap();
            let path = dir.path().join(name);
            std::fs::write(&path, &code).unwrap();
            RunOptions {
                code: path,
                code_sha256: crate::sha256_hex(&code),
                memory: 16 << 20,
                wall: Duration::from_secs(10),
                dirs: Vec::new(),
                argv: vec!["c".into()],
                call: Some("seven".into()),
            }
        };
        let plain = component("plain.cwasm", "");
        assert!(crate::load(&plain, crate::Allocation::OnDemand).is_ok());
        let net = component(
            "net.cwasm",
            r#"(import "wasi:sockets/tcp@0.2.0" (instance))"#,
        );
        for allocation in [crate::Allocation::OnDemand, crate::Allocation::Pooled] {
            match crate::load(&net, allocation) {
                Err(Failure::Setup(why)) => assert!(
                    why.contains("the component imports wasi:sockets/tcp@0.2.0"),
                    "{why}"
                ),
                Err(other) => panic!("{other:?}"),
                Ok(_) => panic!("a component importing sockets loaded"),
            }
        }
    }
}
