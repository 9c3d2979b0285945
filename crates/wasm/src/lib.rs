//! cordon-wasm: the runner of `runtime: wasm` tools.
//!
//! Two steps, one binary:
//!
//! - [`compile_cached`] runs on the broker's side, outside any sandbox: it
//!   checks the module against its pinned sha256, and compiles it with
//!   Cranelift into cordon's cache, keyed by the module's digest and the
//!   engine's (wasmtime's version and this configuration), written as a
//!   temporary file renamed into place, with the sha256 of the compiled
//!   bytes beside it. An entry whose bytes do not match that digest is
//!   compiled again, never loaded.
//! - [`run`] runs inside the native P1 jail, as the tool's program: it
//!   loads the compiled code (only after checking its sha256 against the
//!   one the broker read from the cache), and runs the WASI preview 1
//!   command with nothing but what it is given: its arguments, the jail's
//!   environment (the manifest's), stdio, and read-only preopens of the
//!   directories the manifest binds. No socket, no writable directory. Its
//!   linear memory is capped (a growth past the cap traps), and an epoch
//!   deadline stops it at the wall clock.
//!
//! A trap ends the runner with [`TRAP_EXIT`] and a last line on stderr,
//! [`TRAP_MARKER`] and the trap's kind ([`TrapKind`]), which the runtime
//! turns into the call's outcome.
#![forbid(unsafe_code)]

use std::fmt;
use std::fs;
use std::io::Write;
use std::os::fd::AsFd;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use wasmtime::component::ResourceTable;
use wasmtime::{Config, Engine, Linker, Precompiled, ResourceLimiter, Store, Trap};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::bindings::sync::CommandPre;
use wasmtime_wasi::{DirPerms, FilePerms, I32Exit, WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

pub mod component;
pub mod worker;

/// The runner's exit code for a trap (the kind is on stderr's last line).
pub const TRAP_EXIT: i32 = 125;
/// The start of the runner's last stderr line for a trap.
pub const TRAP_MARKER: &str = "cordon-wasm: trap: ";
/// The start of the runner's stderr line for a failure before the module
/// ran (compiled code that does not load, a preopen that does not open).
pub const SETUP_MARKER: &str = "cordon-wasm: setup: ";
/// The runner's exit code for such a failure.
pub const SETUP_EXIT: i32 = 126;
/// The start of the runner's stderr line when a typed function's
/// arguments do not fit its parameters.
pub const ARGUMENTS_MARKER: &str = "cordon-wasm: arguments: ";
/// The runner's exit code then (nothing of the module ran).
pub const ARGUMENTS_EXIT: i32 = 2;

/// Elements a table may grow to.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

/// Bytes in a WebAssembly page.
const WASM_PAGE: u64 = 64 << 10;

/// Memories, tables and instances the worker's pool keeps slots for: one
/// call runs at a time, and this is more than any one instance of a module
/// or a component (its adapter and shims included) needs.
const POOL_MEMORIES: u32 = 8;
const POOL_MEMORIES_PER_MODULE: u32 = 4;
const POOL_TABLES: u32 = 16;
const POOL_TABLES_PER_MODULE: u32 = 8;
/// Elements a worker's table may grow to. The pool's tables are mapped
/// writable whole (8 bytes an element), so this is far below the per-call
/// runner's [`MAX_TABLE_ELEMENTS`]: 2 MiB for all of them. A module that
/// declares more is refused when the worker loads it.
const POOL_TABLE_ELEMENTS: usize = 1 << 14;
const POOL_CORE_INSTANCES: u32 = 64;
const POOL_COMPONENT_INSTANCES: u32 = 4;

/// How a runner makes each instance's memories and tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allocation {
    /// Mapped when the instance is made, unmapped when it is dropped (one
    /// run per process: `cordon-wasm run`).
    OnDemand,
    /// Slots reserved once and reused, each reset between instances (the
    /// warm worker, `cordon-wasm serve`): a call's linear memory starts as
    /// a private copy-on-write mapping of the module's initial image, and
    /// what a call wrote is discarded (`madvise(MADV_DONTNEED)`) before the
    /// slot is handed to the next.
    Pooled,
}

/// The engine for a module whose linear memory may grow to `memory` bytes.
///
/// Compiled code is only valid for the configuration that made it (the
/// cache key includes it), so the compile step and the runner derive it
/// alike from the same `memory`. The allocation does not change compiled
/// code: the per-call runner and the worker load the same entry.
///
/// Each linear memory gets a reservation of `memory` (rounded up to a
/// WebAssembly page) and never moves: pages past its current size are
/// inaccessible, so an access past them traps, and no guard region or
/// multi-GiB reservation is made (the jail's memory limit, or its
/// `RLIMIT_AS` backstop, bounds the runner's address space). Memory is
/// initialised copy-on-write from the module's data segments.
pub fn engine(memory: u64, allocation: Allocation) -> Result<Engine, String> {
    let reservation = memory.div_ceil(WASM_PAGE).max(1) * WASM_PAGE;
    let mut c = Config::new();
    c.epoch_interruption(true)
        .cranelift_opt_level(wasmtime::OptLevel::Speed)
        .memory_reservation(reservation)
        .memory_guard_size(0)
        .guard_before_linear_memory(false)
        .memory_reservation_for_growth(0)
        .memory_init_cow(true)
        .max_wasm_stack(1 << 20)
        // A trap is reported by its kind; no Wasm backtrace is kept (a
        // deep recursion's would drown stderr).
        .wasm_backtrace(false)
        .wasm_backtrace_details(wasmtime::WasmBacktraceDetails::Disable);
    if allocation == Allocation::Pooled {
        let mut pool = wasmtime::PoolingAllocationConfig::new();
        pool.max_memory_size(usize::try_from(reservation).unwrap_or(usize::MAX))
            .total_memories(POOL_MEMORIES)
            .max_memories_per_module(POOL_MEMORIES_PER_MODULE)
            .total_tables(POOL_TABLES)
            .max_tables_per_module(POOL_TABLES_PER_MODULE)
            .table_elements(POOL_TABLE_ELEMENTS)
            .total_core_instances(POOL_CORE_INSTANCES)
            .total_component_instances(POOL_COMPONENT_INSTANCES)
            // Calls run on the worker's own thread, never on a fiber: no
            // stacks are pooled (wasmtime's default maps 2 GiB of them).
            .total_stacks(0)
            // What a call wrote is discarded before the next: nothing of
            // it stays resident for reuse.
            .linear_memory_keep_resident(0)
            .table_keep_resident(0);
        c.allocation_strategy(wasmtime::InstanceAllocationStrategy::Pooling(pool));
    }
    Engine::new(&c).map_err(|e| format!("wasmtime engine: {e:#}"))
}

/// The engine's identity in cache keys: wasmtime's version and every
/// setting that makes compiled code compatible or not, hashed.
pub fn engine_id(engine: &Engine) -> String {
    struct Sha(Sha256);
    impl std::hash::Hasher for Sha {
        fn finish(&self) -> u64 {
            0
        }
        fn write(&mut self, bytes: &[u8]) {
            self.0.update(bytes);
        }
    }
    let mut h = Sha(Sha256::new());
    h.0.update(b"wasmtime ");
    h.0.update(wasmtime_version().as_bytes());
    h.0.update(b"\0");
    std::hash::Hash::hash(&engine.precompile_compatibility_hash(), &mut h);
    hex::encode(h.0.finalize())
}

/// The wasmtime release line this runner is built with (`cordon-wasm
/// version`). The exact version is in the engine id all the same:
/// `precompile_compatibility_hash` hashes wasmtime's own crate version.
pub fn wasmtime_version() -> &'static str {
    // Kept with the dependency's version in Cargo.toml.
    "37"
}

/// Lowercase hex sha256 of `bytes`.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A module's compiled code in the cache.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Compiled {
    /// The compiled code.
    pub path: PathBuf,
    /// The sha256 of its bytes, as recorded when it was written.
    pub code_sha256: String,
    /// Whether it was already there (`false`: compiled now).
    pub hit: bool,
    /// For a typed function (`compile --function NAME`): the JSON Schema
    /// of its arguments, one line of JSON.
    pub schema: Option<String>,
}

impl Compiled {
    /// The compile step's answer on stdout: `hit|compiled SHA256 PATH`,
    /// and for a typed function a second line, `schema JSON`.
    pub fn line(&self) -> String {
        let mut l = format!(
            "{} {} {}",
            if self.hit { "hit" } else { "compiled" },
            self.code_sha256,
            self.path.display()
        );
        if let Some(s) = &self.schema {
            l.push_str("\nschema ");
            l.push_str(s);
        }
        l
    }

    /// [`Compiled::line`] read back.
    pub fn parse(line: &str) -> Option<Compiled> {
        let mut it = line.trim_end().splitn(3, ' ');
        let hit = match it.next()? {
            "hit" => true,
            "compiled" => false,
            _ => return None,
        };
        let code_sha256 = it.next()?.to_string();
        let path = PathBuf::from(it.next()?);
        (code_sha256.len() == 64).then_some(Compiled {
            path,
            code_sha256,
            hit,
            schema: None,
        })
    }
}

/// What the bytes of a `.wasm` file are, by their header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A core module (version 1).
    Module,
    /// A component (version 0x0d, layer 1).
    Component,
}

/// The format of `bytes`, or why it is neither.
pub fn format_of(bytes: &[u8]) -> Result<Format, String> {
    match bytes.get(..8) {
        Some([0, b'a', b's', b'm', 1, 0, 0, 0]) => Ok(Format::Module),
        Some([0, b'a', b's', b'm', _, _, 1, 0]) => Ok(Format::Component),
        _ => Err("not a WebAssembly module or component (its header)".into()),
    }
}

/// Check `module` against its pinned `sha256`, and have its compiled code
/// for a linear memory of at most `memory` bytes (see [`engine`]) in
/// `cache`: the entry already there when its bytes match the digest
/// recorded beside it, else compiled now and written atomically. With a
/// `function`, the module must be a component exporting that function
/// with types JSON can carry, and the answer has its arguments' schema;
/// without, a component must be a WASI command.
pub fn compile_cached(
    module: &Path,
    sha256: &str,
    cache: &Path,
    memory: u64,
    function: Option<&str>,
) -> Result<Compiled, String> {
    // The compiled bytes as compile_code hashed them (read or made there).
    let (mut c, bytes) = compile_code(module, sha256, cache, memory)?;
    let what = |e: String| format!("module {}: {e}", module.display());
    let engine = engine(memory, Allocation::OnDemand)?;
    match (Engine::detect_precompiled(&bytes), function) {
        (Some(Precompiled::Module), None) => {}
        (Some(Precompiled::Module), Some(f)) => {
            return Err(what(format!(
                "a core module: `function: {f}` names a typed function of a component"
            )));
        }
        (Some(Precompiled::Component), f) => {
            let comp = cordon_sys_wasm::deserialize_component_verified(&engine, &bytes)
                .map_err(|e| what(format!("{e:#}")))?;
            component::refuse_sockets(&engine, &comp).map_err(what)?;
            match f {
                None if !component::is_command(&engine, &comp) => {
                    return Err(what(
                        "a component that exports no `wasi:cli/run`: name the typed function to serve (`function: NAME`)".into(),
                    ));
                }
                None => {}
                Some(f) => {
                    let func = component::find(&engine, &comp, f).map_err(what)?;
                    let schema = component::schema(&func)
                        .map_err(|e| what(format!("function `{f}`: {e}")))?;
                    c.schema = Some(schema.to_string());
                }
            }
        }
        (None, _) => return Err(what("its compiled code is not wasmtime's".into())),
    }
    Ok(c)
}

fn compile_code(
    module: &Path,
    sha256: &str,
    cache: &Path,
    memory: u64,
) -> Result<(Compiled, Vec<u8>), String> {
    let bytes =
        fs::read(module).map_err(|e| format!("module {}: cannot read: {e}", module.display()))?;
    let actual = sha256_hex(&bytes);
    let expected = sha256.trim().to_ascii_lowercase();
    if actual != expected {
        return Err(format!(
            "module {}: sha256 mismatch: expected {expected}, actual {actual}; refusing to run a module that is not the one pinned",
            module.display()
        ));
    }
    let engine = engine(memory, Allocation::OnDemand)?;
    let id = engine_id(&engine);
    let name = format!("{actual}-{}.cwasm", &id[..32]);
    let path = cache.join(&name);
    let sum_path = cache.join(format!("{name}.sha256"));
    if let (Ok(code), Ok(sum)) = (fs::read(&path), fs::read_to_string(&sum_path)) {
        let recorded = sum.trim();
        if sha256_hex(&code) == recorded {
            mark_used(&sum_path);
            return Ok((
                Compiled {
                    path,
                    code_sha256: recorded.to_string(),
                    hit: true,
                    schema: None,
                },
                code,
            ));
        }
        // A torn or altered entry: compiled again below, never loaded.
    }
    let code = match format_of(&bytes) {
        Ok(Format::Module) => engine.precompile_module(&bytes),
        Ok(Format::Component) => engine.precompile_component(&bytes),
        Err(e) => return Err(format!("module {}: {e}", module.display())),
    }
    .map_err(|e| format!("module {}: does not compile: {e:#}", module.display()))?;
    let code_sha256 = sha256_hex(&code);
    fs::create_dir_all(cache)
        .and_then(|()| fs::set_permissions(cache, fs::Permissions::from_mode(0o755)))
        .map_err(|e| format!("wasm cache {}: {e}", cache.display()))?;
    write_atomic(&path, &code)?;
    write_atomic(&sum_path, format!("{code_sha256}\n").as_bytes())?;
    Ok((
        Compiled {
            path,
            code_sha256,
            hit: false,
            schema: None,
        },
        code,
    ))
}

/// Record that the cache entry whose digest file is `sum_path` was used
/// now (its modification time: `cordon image gc` ages entries from their
/// last use). Best effort: an entry whose time cannot be set ages from
/// its last recorded use.
fn mark_used(sum_path: &Path) {
    if let Ok(f) = fs::File::options().write(true).open(sum_path) {
        let _ = f.set_modified(std::time::SystemTime::now());
    }
}

/// Write `bytes` to a temporary file beside `path`, then rename it there.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), String> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let file = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{file}.{}.tmp", std::process::id()));
    let res = (|| -> std::io::Result<()> {
        let mut f = fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o644)
            .open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        fs::rename(&tmp, path)
    })();
    res.map_err(|e| {
        let _ = fs::remove_file(&tmp);
        format!("wasm cache {}: {e}", path.display())
    })
}

/// Why a module stopped without exiting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TrapKind {
    /// A load or store outside linear memory (or a table).
    OutOfBounds,
    /// An `unreachable` instruction.
    Unreachable,
    /// The Wasm stack was exhausted.
    StackOverflow,
    /// Linear memory would have grown past the limit.
    MemoryLimit,
    /// The wall clock ran out (epoch deadline).
    TimeLimit,
    /// Any other trap, by wasmtime's description.
    Other(String),
}

impl TrapKind {
    /// Its name on the runner's last stderr line and in outcomes.
    pub fn name(&self) -> &str {
        match self {
            TrapKind::OutOfBounds => "out of bounds",
            TrapKind::Unreachable => "unreachable",
            TrapKind::StackOverflow => "stack overflow",
            TrapKind::MemoryLimit => "memory limit",
            TrapKind::TimeLimit => "time limit",
            TrapKind::Other(s) => s,
        }
    }

    /// [`TrapKind::name`] read back.
    pub fn from_name(s: &str) -> TrapKind {
        match s {
            "out of bounds" => TrapKind::OutOfBounds,
            "unreachable" => TrapKind::Unreachable,
            "stack overflow" => TrapKind::StackOverflow,
            "memory limit" => TrapKind::MemoryLimit,
            "time limit" => TrapKind::TimeLimit,
            o => TrapKind::Other(o.to_string()),
        }
    }

    fn of(trap: Trap) -> TrapKind {
        match trap {
            Trap::MemoryOutOfBounds | Trap::TableOutOfBounds | Trap::HeapMisaligned => {
                TrapKind::OutOfBounds
            }
            Trap::UnreachableCodeReached => TrapKind::Unreachable,
            Trap::StackOverflow => TrapKind::StackOverflow,
            Trap::Interrupt => TrapKind::TimeLimit,
            other => TrapKind::Other(other.to_string()),
        }
    }
}

impl fmt::Display for TrapKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a run ended without the module exiting.
#[derive(Debug)]
pub enum Failure {
    /// The module trapped: its kind and wasmtime's words.
    Trap(TrapKind, String),
    /// Nothing ran: why.
    Setup(String),
    /// It wrote past its output cap and was stopped there (a worker's
    /// call; a runner alone is stopped by the jail).
    OutputCap,
    /// A typed function's arguments do not fit its parameters: why.
    Arguments(String),
}

/// One run inside the jail.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The compiled code (bound read-only into the jail).
    pub code: PathBuf,
    /// Its sha256, as the compile step recorded it.
    pub code_sha256: String,
    /// The linear-memory limit, bytes.
    pub memory: u64,
    /// The wall clock (epoch deadline).
    pub wall: Duration,
    /// Directories preopened read-only, each at its own path.
    pub dirs: Vec<String>,
    /// The module's argv (`argv[0]` its name).
    pub argv: Vec<String>,
    /// The typed function of a component to call (its arguments, a JSON
    /// object, on stdin; its result, JSON, on stdout); `None`: run the
    /// module's or component's command (`_start`, `wasi:cli/run`).
    pub call: Option<String>,
}

/// Linear memory past its limit.
#[derive(Debug)]
struct MemoryLimitHit {
    desired: usize,
    limit: usize,
}

impl fmt::Display for MemoryLimitHit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "linear memory would grow to {} bytes, past the limit of {} bytes",
            self.desired, self.limit
        )
    }
}

impl std::error::Error for MemoryLimitHit {}

struct Limiter {
    memory: usize,
}

impl ResourceLimiter for Limiter {
    fn memory_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory {
            return Err(wasmtime::Error::new(MemoryLimitHit {
                desired,
                limit: self.memory,
            }));
        }
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= MAX_TABLE_ELEMENTS)
    }
}

struct State {
    wasi: WasiP1Ctx,
    limiter: Limiter,
}

/// A component's store: WASI 0.2 and its resources.
struct P2State {
    wasi: WasiCtx,
    table: ResourceTable,
    limiter: Limiter,
}

impl WasiView for P2State {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

/// What was loaded, its imports resolved once: each run only makes the
/// instance.
enum Pre {
    /// A WASI preview 1 command module (`_start`).
    Module(wasmtime::InstancePre<State>),
    /// A WASI 0.2 command component (`wasi:cli/run`).
    Command(CommandPre<P2State>),
    /// A component's typed function.
    Function {
        pre: wasmtime::component::InstancePre<P2State>,
        name: String,
        ty: wasmtime::component::types::ComponentFunc,
    },
}

/// A module loaded and linked once, run any number of times, each run in a
/// fresh [`Store`] and instance (the warm worker, [`crate::worker`]).
pub struct Loaded {
    engine: Engine,
    pre: Pre,
    /// A core module and its linker, for tests that run it by hand.
    #[cfg(test)]
    module: Option<(wasmtime::Module, Linker<State>)>,
}

/// Load the compiled code (only when its sha256 is the one recorded) into
/// an engine that makes instances by `allocation`, and link WASI.
pub fn load(o: &RunOptions, allocation: Allocation) -> Result<Loaded, Failure> {
    let engine = engine(o.memory, allocation).map_err(Failure::Setup)?;
    let code = fs::read(&o.code)
        .map_err(|e| Failure::Setup(format!("compiled code {}: {e}", o.code.display())))?;
    let actual = sha256_hex(&code);
    if actual != o.code_sha256 {
        return Err(Failure::Setup(format!(
            "compiled code {}: sha256 {actual}, not the {} recorded when it was written; refusing to load it",
            o.code.display(),
            o.code_sha256
        )));
    }
    let bad =
        |e: wasmtime::Error| Failure::Setup(format!("compiled code {}: {e:#}", o.code.display()));
    let link = |e: wasmtime::Error| Failure::Setup(format!("linking the module: {e:#}"));
    #[cfg(test)]
    let mut kept = None;
    let pre = match Engine::detect_precompiled(&code) {
        Some(Precompiled::Component) => {
            let comp =
                cordon_sys_wasm::deserialize_component_verified(&engine, &code).map_err(bad)?;
            component::refuse_sockets(&engine, &comp).map_err(Failure::Setup)?;
            let mut l = wasmtime::component::Linker::<P2State>::new(&engine);
            wasmtime_wasi::p2::add_to_linker_sync(&mut l)
                .map_err(|e| Failure::Setup(format!("WASI: {e:#}")))?;
            let pre = l.instantiate_pre(&comp).map_err(link)?;
            match &o.call {
                None => Pre::Command(CommandPre::new(pre).map_err(|e| {
                    Failure::Setup(format!(
                        "the component is not a WASI command (no `wasi:cli/run`): {e:#}"
                    ))
                })?),
                Some(name) => Pre::Function {
                    ty: component::find(&engine, &comp, name).map_err(Failure::Setup)?,
                    name: name.clone(),
                    pre,
                },
            }
        }
        _ if o.call.is_some() => {
            return Err(Failure::Setup(
                "a core module has no typed functions to call".into(),
            ));
        }
        _ => {
            let module = cordon_sys_wasm::deserialize_verified(&engine, &code).map_err(bad)?;
            // WASI preview 1, linked only for a core module.
            let mut linker: Linker<State> = Linker::new(&engine);
            wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |s| &mut s.wasi)
                .map_err(|e| Failure::Setup(format!("WASI: {e:#}")))?;
            let pre = linker.instantiate_pre(&module).map_err(link)?;
            #[cfg(test)]
            {
                kept = Some((module, linker));
            }
            Pre::Module(pre)
        }
    };
    drop(code);
    Ok(Loaded {
        engine,
        pre,
        #[cfg(test)]
        module: kept,
    })
}

/// Where a run's stdio goes.
pub(crate) enum Stdio {
    /// The runner's own (one run per process).
    Inherit,
    /// In memory (a worker's call): stdin given, stdout and stderr kept
    /// up to their caps.
    Memory {
        stdin: Vec<u8>,
        stdout: worker::Capped,
        stderr: worker::Capped,
    },
}

/// Run the compiled module: its exit code, or how it failed.
pub fn run(o: &RunOptions) -> Result<i32, Failure> {
    let loaded = load(o, Allocation::OnDemand)?;
    // The deadline: one epoch tick when the wall clock runs out.
    let ticker = loaded.engine.clone();
    let wall = o.wall;
    std::thread::Builder::new()
        .name("wasm-deadline".into())
        .spawn(move || {
            std::thread::sleep(wall);
            ticker.increment_epoch();
        })
        .map_err(|e| Failure::Setup(format!("deadline thread: {e}")))?;
    run_in(&loaded, o, Stdio::Inherit, 1)
}

/// One run of `loaded` in a fresh store and instance, stopped at the
/// `deadline`-th epoch tick from now.
pub(crate) fn run_in(
    loaded: &Loaded,
    o: &RunOptions,
    stdio: Stdio,
    deadline: u64,
) -> Result<i32, Failure> {
    let mut b = WasiCtxBuilder::new();
    b.args(&o.argv)
        .inherit_env()
        .allow_blocking_current_thread(true)
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false);
    let function = matches!(loaded.pre, Pre::Function { .. });
    // A typed function's arguments come on stdin, its result goes on
    // stdout: the component itself gets no stdin, and its own writes to
    // stdout go to stderr.
    let mut call_input = Vec::new();
    let mut call_output: Option<worker::Capped> = None;
    match stdio {
        Stdio::Inherit if function => {
            use std::io::Read;
            std::io::stdin()
                .read_to_end(&mut call_input)
                .map_err(|e| Failure::Setup(format!("reading the arguments (stdin): {e}")))?;
            b.stdout(std::io::stderr()).inherit_stderr();
        }
        Stdio::Memory {
            stdin,
            stdout,
            stderr,
        } if function => {
            call_input = stdin;
            call_output = Some(stdout);
            b.stdout(stderr.clone()).stderr(stderr);
        }
        Stdio::Inherit => {
            // Stdin read straight from the runner's fd 0 on the calling
            // thread: `inherit_stdin` hands every read to a helper thread,
            // which costs tens of milliseconds on a 1 MiB input read in
            // small pieces.
            let fd = std::io::stdin()
                .as_fd()
                .try_clone_to_owned()
                .map_err(|e| Failure::Setup(format!("duplicating stdin (fd 0): {e}")))?;
            b.stdin(wasmtime_wasi::cli::InputFile::new(fs::File::from(fd)))
                .inherit_stdout()
                .inherit_stderr();
        }
        Stdio::Memory {
            stdin,
            stdout,
            stderr,
        } => {
            b.stdin(wasmtime_wasi::p2::pipe::MemoryInputPipe::new(stdin))
                .stdout(stdout)
                .stderr(stderr);
        }
    }
    for d in &o.dirs {
        b.preopened_dir(d, d, DirPerms::READ, FilePerms::READ)
            .map_err(|e| Failure::Setup(format!("preopen {d}: {e:#}")))?;
    }
    let limiter = Limiter {
        memory: usize::try_from(o.memory).unwrap_or(usize::MAX),
    };
    let result = match &loaded.pre {
        Pre::Module(pre) => {
            let mut store = Store::new(
                &loaded.engine,
                State {
                    wasi: b.build_p1(),
                    limiter,
                },
            );
            store.limiter(|s| &mut s.limiter);
            store.set_epoch_deadline(deadline);
            store.epoch_deadline_trap();
            pre.instantiate(&mut store)
                .and_then(|inst| inst.get_typed_func::<(), ()>(&mut store, "_start"))
                .and_then(|start| start.call(&mut store, ()))
                .map(|()| 0)
        }
        Pre::Command(pre) => {
            let mut store = p2_store(loaded, b.build(), limiter, deadline);
            pre.instantiate(&mut store)
                .and_then(|cmd| cmd.wasi_cli_run().call_run(&mut store))
                .map(|r| i32::from(r.is_err()))
        }
        Pre::Function { pre, name, ty } => {
            let args = match component::arguments(ty, &call_input) {
                Ok(a) => a,
                Err(why) => return Err(Failure::Arguments(why)),
            };
            let mut store = p2_store(loaded, b.build(), limiter, deadline);
            let mut results = vec![wasmtime::component::Val::Bool(false); ty.results().len()];
            let called = pre
                .instantiate(&mut store)
                .and_then(|inst| {
                    inst.get_func(&mut store, name.as_str())
                        .ok_or_else(|| wasmtime::Error::msg(format!("no function `{name}`")))
                })
                .and_then(|f| {
                    f.call(&mut store, &args, &mut results)?;
                    f.post_return(&mut store)
                });
            called.and_then(|()| {
                let (bytes, code) = component::output(&results);
                match &call_output {
                    Some(out) => out.put(&bytes).map_err(wasmtime::Error::new)?,
                    None => {
                        let mut out = std::io::stdout().lock();
                        out.write_all(&bytes)
                            .and_then(|()| out.flush())
                            .map_err(|e| wasmtime::Error::msg(format!("stdout: {e}")))?;
                    }
                }
                Ok(code)
            })
        }
    };
    match result {
        Ok(code) => Ok(code),
        Err(e) => match classify(e) {
            Classified::Exit(c) => Ok(c),
            Classified::Failure(f) => Err(f),
        },
    }
}

fn p2_store(loaded: &Loaded, wasi: WasiCtx, limiter: Limiter, deadline: u64) -> Store<P2State> {
    let mut store = Store::new(
        &loaded.engine,
        P2State {
            wasi,
            table: ResourceTable::new(),
            limiter,
        },
    );
    store.limiter(|s| &mut s.limiter);
    store.set_epoch_deadline(deadline);
    store.epoch_deadline_trap();
    store
}

enum Classified {
    Exit(i32),
    Failure(Failure),
}

fn classify(e: wasmtime::Error) -> Classified {
    if let Some(x) = e.downcast_ref::<I32Exit>() {
        return Classified::Exit(x.0);
    }
    if e.downcast_ref::<worker::OutputCapHit>().is_some()
        || format!("{e:#}").contains(worker::OUTPUT_CAP_HIT)
    {
        return Classified::Failure(Failure::OutputCap);
    }
    if let Some(m) = e.downcast_ref::<MemoryLimitHit>() {
        return Classified::Failure(Failure::Trap(TrapKind::MemoryLimit, m.to_string()));
    }
    if let Some(t) = e.downcast_ref::<Trap>() {
        return Classified::Failure(Failure::Trap(TrapKind::of(*t), t.to_string()));
    }
    let text = format!("{e:#}");
    if text.contains("_start") || text.contains("unknown import") {
        return Classified::Failure(Failure::Setup(text));
    }
    Classified::Failure(Failure::Trap(TrapKind::Other("error".into()), text))
}
