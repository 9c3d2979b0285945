//! The Wasm runtime (`runtime: wasm`): a WASI preview 1 module, pinned by
//! sha256, run by wasmtime inside the native P1 jail.
//!
//! Two layers, each doing what it can:
//!
//! - outside the jail, as the broker, the runner `cordon-wasm compile`
//!   checks the module's sha256 and compiles it into cordon's cache (keyed
//!   by the module's digest and wasmtime's version and configuration,
//!   written atomically with the compiled bytes' sha256 beside it);
//! - the spec is then lowered onto the native runtime (reused, not copied):
//!   the tool's program is the runner (`cordon-wasm run`), bound read-only
//!   with the compiled code and nothing else new; the manifest's read-only
//!   mounts are the module's only preopened directories; its environment
//!   is the manifest's; the jail's namespaces, seccomp, Landlock and cgroup
//!   are around the runner; inside it wasmtime caps linear memory and stops
//!   the module at the wall clock (epoch interruption). A trap is reported
//!   by kind in the outcome.
//!
//! The runner itself (and wasmtime) is the crate `cordon-wasm`, so this
//! crate and the broker do not link wasmtime.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cordon_jail::Jail;
use cordon_sandbox::{Mount, Status};

use crate::mechanism::{MechanismState, State};
use crate::native::Native;
use crate::outcome::{Outcome, RunError};
use crate::spec::{Network, SandboxSpec};
use crate::{Check, Context, Facts, Problem, Runtime, Spawned};

/// Where the runner is inside the jail.
pub const RUNNER_IN_JAIL: &str = "/.cordon-wasm/cordon-wasm";
/// Where the compiled code is inside the jail.
pub const CODE_IN_JAIL: &str = "/.cordon-wasm/module.cwasm";
/// The jail's wall clock past the module's: the runner's epoch deadline
/// stops the module first (a time-limit trap); the jail kills what is left
/// after this margin.
pub const WALL_MARGIN: Duration = Duration::from_secs(2);
/// The most of the memory limit kept for the runner itself (wasmtime, the
/// compiled code, WASI's buffers): the module's linear memory gets the
/// rest (and at least half).
pub const RUNNER_RESERVE: u64 = 32 << 20;
/// The runner's exit code for a trap (as `cordon_wasm::TRAP_EXIT`).
pub const TRAP_EXIT: i32 = 125;
/// The start of the runner's last stderr line for a trap (as
/// `cordon_wasm::TRAP_MARKER`).
pub const TRAP_MARKER: &str = "cordon-wasm: trap: ";
/// The runner's exit code when nothing of the module ran.
pub const SETUP_EXIT: i32 = 126;
/// The start of the runner's stderr line then.
pub const SETUP_MARKER: &str = "cordon-wasm: setup: ";

/// Options of the Wasm runtime.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The runner (`None`: `$CORDON_WASM`, else `cordon-wasm` beside this
    /// program or one directory up).
    pub runner: Option<PathBuf>,
    /// The compiled-code cache (`None`: `wasm-cache` in cordon's state
    /// directory).
    pub cache: Option<PathBuf>,
}

/// What the cache did since this runtime was made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheStats {
    /// Modules compiled (not found, or found corrupt).
    pub compiled: u64,
    /// Calls that found their compiled code in the cache.
    pub hits: u64,
}

/// The Wasm runtime.
pub struct Wasm {
    native: Native,
    runner: Result<PathBuf, String>,
    cache: Result<PathBuf, String>,
    compiled: AtomicU64,
    hits: AtomicU64,
    /// The compiled code found for each pinned module, with the identity
    /// of its cache file then: a later call whose file is unchanged skips
    /// the compile step's process (the runner checks the code's digest
    /// before loading it).
    known: Mutex<Vec<Known>>,
    /// Warm workers of `module: {worker: true}` tools.
    workers: crate::wasm_worker::Workers,
    /// Module files found to hold their pinned bytes, with their identity
    /// then.
    pinned: Mutex<std::collections::HashMap<(PathBuf, String), FileId>>,
}

/// A file's identity: device, inode, size and modification time.
type FileId = (u64, u64, u64, i64, i64);

/// A pinned module (path, sha256, the typed function called), its
/// compiled code, the identity of the code's cache file when it was found,
/// and when it was last marked used.
type Known = (
    (PathBuf, String, Option<String>, u64),
    Compiled,
    FileId,
    std::time::Instant,
);

/// How often a call that skips the compile step marks its cache entry
/// used (the compile step marks it each time it finds it).
const MARK_USED_EVERY: Duration = Duration::from_secs(3600);

fn file_id(p: &Path) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(p).ok()?;
    Some((m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec()))
}

/// Compiled code for one call, as the compile step reported it.
#[derive(Clone)]
struct Compiled {
    path: PathBuf,
    sha256: String,
    /// A typed function's arguments schema, as the compile step read it
    /// from the component's types.
    schema: Option<serde_json::Value>,
}

impl Wasm {
    /// Over the native runtime's jail.
    pub fn with_jail(opts: Options, jail: Arc<Jail>) -> Wasm {
        Wasm {
            native: Native::from_jail(jail),
            runner: find_runner(opts.runner.as_deref()),
            cache: match opts.cache {
                Some(c) => Ok(c),
                None => cordon_dirs::Dirs::current()
                    .wasm_cache()
                    .map_err(|e| e.to_string()),
            },
            compiled: AtomicU64::new(0),
            hits: AtomicU64::new(0),
            known: Mutex::new(Vec::new()),
            workers: Default::default(),
            pinned: Mutex::default(),
        }
    }

    /// Warm workers started so far.
    pub fn workers_started(&self) -> u64 {
        self.workers.started()
    }

    /// Warm workers waiting for a call now.
    pub fn idle_workers(&self) -> usize {
        self.workers.idle()
    }

    /// The native spec of a warm worker of `spec`: the runner serving
    /// calls (`cordon-wasm serve`) with the call's caps, in a jail whose
    /// wall clock is the worker's life and whose output bound is a whole
    /// reply's.
    fn lower_worker(&self, spec: &SandboxSpec, code: &Compiled) -> SandboxSpec {
        let mut n = self.lower(spec, Some(code));
        let run = n.argv.split_off(2);
        n.argv.truncate(1);
        n.argv.extend([
            "serve".to_string(),
            "--output-bytes".into(),
            spec.limits.output_bytes.to_string(),
            "--stderr-bytes".into(),
            spec.limits.stderr_bytes.to_string(),
        ]);
        n.argv.extend(run);
        n.limits.wall = crate::wasm_worker::WORKER_WALL;
        n.limits.output_bytes =
            cordon_wasm_wire::reply_max(spec.limits.output_bytes, spec.limits.stderr_bytes);
        n
    }

    /// One call on a warm worker of `spec` (`module: {worker: true}`).
    fn run_on_worker(
        &self,
        spec: &SandboxSpec,
        code: &Compiled,
        input: &[u8],
        ctx: &Context,
    ) -> Result<Outcome, RunError> {
        use crate::wasm_worker::Failed;
        use cordon_wasm_wire::End;
        let lowered = self.lower_worker(spec, code);
        let key = format!("{lowered:?}");
        let began = std::time::Instant::now();
        let wait = spec.limits.wall.saturating_add(WALL_MARGIN);
        let bounds = cordon_wasm_wire::Bounds {
            stdout: spec.limits.output_bytes,
            stderr: spec.limits.stderr_bytes,
            text: cordon_wasm_wire::TEXT_MAX,
        };
        let r = self.workers.call(
            &key,
            || self.native.spawn(&lowered, ctx),
            input,
            wait,
            bounds,
        );
        let duration = began.elapsed();
        let landlock = self.landlock(spec);
        let mut o = Outcome {
            status: Status::Ok,
            exit_code: None,
            signal: None,
            duration,
            setup: None,
            peak_memory_bytes: None,
            stdout: Vec::new(),
            output_bytes: 0,
            stderr: Vec::new(),
            stderr_total: 0,
            reason: String::new(),
            warnings: vec![format!(
                "{}: served by a warm Wasm worker (module: {{worker: true}}): a fresh instance of the module, in a jail shared with the tool's earlier calls",
                spec.tool
            )],
            landlock,
        };
        let (reply, _fresh) = match r {
            Ok(r) => r,
            Err(Failed::Start(e)) => return Err(e),
            Err(Failed::Timeout) => {
                o.status = Status::TimedOut;
                o.reason = format!(
                    "{}: timed out after {}: the worker did not answer and was killed",
                    spec.tool,
                    cordon_sandbox::units::format_duration(spec.limits.wall)
                );
                return Ok(o);
            }
            Err(Failed::Broken(why, jail)) => {
                return match jail {
                    Some(j) if j.status == Status::MemoryLimit => {
                        o.status = Status::MemoryLimit;
                        o.peak_memory_bytes = j.peak_memory_bytes;
                        o.reason = format!(
                            "{}: the worker's jail reached its memory limit and was killed",
                            spec.tool
                        );
                        Ok(o)
                    }
                    Some(j) => {
                        // The runner said why it could not serve (the code
                        // does not load...): that is the reason.
                        let text = String::from_utf8_lossy(&j.stderr);
                        let said = text.lines().find_map(|l| l.strip_prefix(SETUP_MARKER));
                        Err(RunError::Setup(match said {
                            Some(s) => format!("{}: {s}", spec.tool),
                            None => format!("{}: the wasm worker failed: {why}", spec.tool),
                        }))
                    }
                    None => Err(RunError::Setup(format!(
                        "{}: the wasm worker failed: {why}",
                        spec.tool
                    ))),
                };
            }
        };
        o.setup = Some(duration.saturating_sub(reply.run));
        o.output_bytes = reply.stdout.len() as u64 + u64::from(reply.stdout_over);
        o.stdout = reply.stdout;
        o.stderr = reply.stderr;
        o.stderr_total = reply.stderr_total;
        // As the runner's own process would have ended: its markers on
        // stderr, read by `finish` as for a call in a jail of its own.
        match reply.end {
            _ if reply.stdout_over => {
                o.status = Status::OutputCap;
                o.reason = format!(
                    "{}: output over cap ({} bytes)",
                    spec.tool, spec.limits.output_bytes
                );
                return Ok(o);
            }
            End::Exit(c) => {
                o.exit_code = Some(c);
                o.status = if c == 0 { Status::Ok } else { Status::Exited };
                // As the jail says it of a process.
                o.reason = format!("{}: exit {c}", spec.tool);
            }
            End::Trap { kind, detail } => {
                o.exit_code = Some(TRAP_EXIT);
                o.status = Status::Exited;
                o.stderr
                    .extend_from_slice(format!("{detail}\n{TRAP_MARKER}{kind}\n").as_bytes());
            }
            End::Setup(why) => {
                o.exit_code = Some(SETUP_EXIT);
                o.status = Status::Exited;
                o.stderr
                    .extend_from_slice(format!("{SETUP_MARKER}{why}\n").as_bytes());
            }
        }
        finish(spec, o)
    }

    /// Landlock as the jail applies it to `spec`'s sandboxes.
    fn landlock(&self, spec: &SandboxSpec) -> cordon_sandbox::LandlockStatus {
        use cordon_sandbox::LandlockStatus as L;
        self.native
            .mechanisms(spec)
            .into_iter()
            .find(|m| m.mechanism == crate::mechanism::Mechanism::Landlock)
            .map_or(L::NotEnforced, |m| match m.state {
                State::Enforced => L::FullyEnforced,
                State::Partial(_) => L::PartiallyEnforced,
                State::Missing(_) => L::NotEnforced,
            })
    }

    /// With a jail of its own.
    pub fn new(opts: Options, jail: cordon_jail::JailOptions) -> Result<Wasm, String> {
        let j = Jail::with_options(jail).map_err(|e| e.to_string())?;
        Ok(Wasm::with_jail(opts, Arc::new(j)))
    }

    /// What the cache did so far.
    pub fn cache_stats(&self) -> CacheStats {
        CacheStats {
            compiled: self.compiled.load(Ordering::Relaxed),
            hits: self.hits.load(Ordering::Relaxed),
        }
    }

    /// Every reason `spec` cannot run here, before anything runs.
    fn problems(&self, spec: &SandboxSpec) -> Vec<Problem> {
        let mut out: Vec<Problem> = Vec::new();
        let tool = &spec.tool;
        if let Err(e) = &self.runner {
            out.push(format!("{tool}: {e}").into());
        }
        if let Err(e) = &self.cache {
            out.push(format!("{tool}: no place for the wasm cache: {e}").into());
        }
        let Some(m) = &spec.wasm else {
            out.push(
                format!("{tool}: the wasm runtime runs a `module`, and this tool names none")
                    .into(),
            );
            return out;
        };
        if matches!(spec.network, Network::Doors(_)) {
            out.push(
                format!("{tool}: a wasm tool has no network (WASI preview 1 is given no socket)")
                    .into(),
            );
        }
        if spec.workspace.is_some() || spec.state.is_some() {
            out.push(
                format!(
                    "{tool}: a wasm tool gets read-only preopens only: no `workspace` or `state`"
                )
                .into(),
            );
        }
        for mo in &spec.mounts {
            if mo.writable {
                out.push(Problem {
                    message: format!(
                        "{tool}: mount {}: a wasm tool's directories are preopened read-only only",
                        mo.src.display()
                    ),
                    bind_source: Some(mo.src.clone()),
                });
            } else if !mo.src.is_dir() {
                out.push(Problem {
                    message: format!(
                        "{tool}: mount {}: not a directory: a wasm tool is given directories (preopens), not files",
                        mo.src.display()
                    ),
                    bind_source: Some(mo.src.clone()),
                });
            }
        }
        // The file was found to hold the pinned bytes, and is the same
        // file (device, inode, size, modification time) still: not read
        // again. What runs is always code compiled from the pinned bytes
        // (the cache is keyed by that digest, and the runner checks the
        // code's own digest when it loads it); this only says when a
        // changed file is noticed.
        let id = file_id(&m.path);
        let key = (m.path.clone(), m.sha256.clone());
        if id.is_some()
            && self
                .pinned
                .lock()
                .is_ok_and(|v| v.get(&key).is_some_and(|seen| Some(*seen) == id))
        {
            return out;
        }
        match std::fs::read(&m.path) {
            Err(e) => out.push(format!("{tool}: module {}: {e}", m.path.display()).into()),
            Ok(bytes) => {
                let actual = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
                if actual == m.sha256
                    && let (Some(id), Ok(mut v)) = (id, self.pinned.lock())
                {
                    v.insert(key, id);
                }
                if actual != m.sha256 {
                    out.push(
                        format!(
                            "{tool}: module {}: sha256 mismatch: expected {}, actual {actual}; refusing to run a module that is not the one pinned",
                            m.path.display(),
                            m.sha256
                        )
                        .into(),
                    );
                }
            }
        }
        out
    }

    /// The module compiled into the cache (or found there), by the runner
    /// outside the jail.
    fn compile(&self, spec: &SandboxSpec) -> Result<Compiled, RunError> {
        let problems = self.problems(spec);
        if !problems.is_empty() {
            return Err(RunError::Refused(format!(
                "{}: would not start on this host: {}",
                spec.tool,
                problems.join("; ")
            )));
        }
        let (Some(m), Ok(runner), Ok(cache)) = (&spec.wasm, &self.runner, &self.cache) else {
            return Err(RunError::Setup(format!("{}: no module", spec.tool)));
        };
        let memory = linear_memory(spec);
        let key = (m.path.clone(), m.sha256.clone(), m.function.clone(), memory);
        if let Ok(mut known) = self.known.lock()
            && let Some((_, c, id, marked)) = known.iter_mut().find(|(k, _, _, _)| *k == key)
            && file_id(&c.path).as_ref() == Some(id)
        {
            self.hits.fetch_add(1, Ordering::Relaxed);
            if marked.elapsed() >= MARK_USED_EVERY {
                *marked = std::time::Instant::now();
                mark_used(&c.path);
            }
            return Ok(c.clone());
        }
        let out = Command::new(runner)
            .arg("compile")
            .arg(&m.path)
            .arg(&m.sha256)
            .arg(cache)
            .arg(memory.to_string())
            .args(m.function.iter())
            .env_clear()
            .stdin(Stdio::null())
            .output()
            .map_err(|e| RunError::Setup(format!("{}: {}: {e}", spec.tool, runner.display())))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr);
            return Err(RunError::Refused(format!("{}: {}", spec.tool, why.trim())));
        }
        let mut lines = stdout.lines();
        let line = lines.next().unwrap_or_default();
        let schema = match (
            &m.function,
            lines.next().and_then(|l| l.strip_prefix("schema ")),
        ) {
            (None, _) => None,
            (Some(_), Some(s)) => Some(serde_json::from_str(s).map_err(|e| {
                RunError::Setup(format!(
                    "{}: the wasm compile step's schema is not JSON: {e}",
                    spec.tool
                ))
            })?),
            (Some(f), None) => {
                return Err(RunError::Setup(format!(
                    "{}: the wasm compile step gave no schema for function `{f}`",
                    spec.tool
                )));
            }
        };
        let mut it = line.splitn(3, ' ');
        let (kind, sha256, path) = (it.next(), it.next(), it.next());
        match (kind, sha256, path) {
            (Some(k @ ("hit" | "compiled")), Some(sha), Some(path)) if sha.len() == 64 => {
                if k == "hit" {
                    self.hits.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.compiled.fetch_add(1, Ordering::Relaxed);
                }
                let c = Compiled {
                    path: PathBuf::from(path),
                    sha256: sha.to_string(),
                    schema,
                };
                if let (Ok(mut known), Some(id)) = (self.known.lock(), file_id(&c.path)) {
                    known.retain(|(k, _, _, _)| *k != key);
                    known.push((key, c.clone(), id, std::time::Instant::now()));
                }
                Ok(c)
            }
            _ => Err(RunError::Setup(format!(
                "{}: the wasm compile step answered `{line}`",
                spec.tool
            ))),
        }
    }

    /// The native spec that runs `spec`'s module: the runner as the
    /// program, bound read-only with the compiled code (when there is
    /// some yet).
    fn lower(&self, spec: &SandboxSpec, code: Option<&Compiled>) -> SandboxSpec {
        let mut n = spec.clone();
        n.wasm = None;
        let runner = self.runner.clone().unwrap_or_default();
        n.mounts.push(Mount {
            src: runner,
            dst: RUNNER_IN_JAIL.into(),
            writable: false,
        });
        if let Some(c) = code {
            n.mounts.push(Mount {
                src: c.path.clone(),
                dst: CODE_IN_JAIL.into(),
                writable: false,
            });
        }
        let linear = linear_memory(spec);
        let mut argv = vec![
            RUNNER_IN_JAIL.to_string(),
            "run".into(),
            "--code".into(),
            CODE_IN_JAIL.into(),
            "--code-sha256".into(),
            code.map(|c| c.sha256.clone()).unwrap_or_default(),
            "--memory".into(),
            linear.to_string(),
            "--wall-ms".into(),
            spec.limits.wall.as_millis().to_string(),
        ];
        for mo in &spec.mounts {
            argv.push("--dir".into());
            argv.push(mo.dst.to_string_lossy().into_owned());
        }
        if let Some(f) = spec.wasm.as_ref().and_then(|w| w.function.as_ref()) {
            argv.push("--call".into());
            argv.push(f.clone());
        }
        argv.push("--".into());
        argv.extend(spec.argv.iter().cloned());
        n.argv = argv;
        n.limits.wall = spec.limits.wall.saturating_add(WALL_MARGIN);
        n
    }

    /// How each mechanism holds: the jail's, each said with what the Wasm
    /// layer adds where the jail's is not whole.
    fn mechanisms(&self, spec: &SandboxSpec) -> Vec<MechanismState> {
        self.native
            .mechanisms(spec)
            .into_iter()
            .map(|mut s| {
                if let (State::Partial(why) | State::Missing(why), Some(w)) =
                    (&mut s.state, crate::mechanism::wasm_layer(s.mechanism))
                {
                    why.push_str(&format!("; inside it, wasm: {w}"));
                }
                s
            })
            .collect()
    }
}

/// The module's linear-memory limit: the memory limit less what is kept
/// for the runner. The compile step and the runner both take it (the
/// compiled code is made for it).
fn linear_memory(spec: &SandboxSpec) -> u64 {
    let memory = spec.limits.memory_bytes;
    memory.saturating_sub(RUNNER_RESERVE.min(memory / 2))
}

/// The runner: `opt`, else `$CORDON_WASM`, else `cordon-wasm` beside this
/// program or one directory up (a test binary's `deps/`).
fn find_runner(opt: Option<&Path>) -> Result<PathBuf, String> {
    crate::companion::find(
        opt,
        "CORDON_WASM",
        &["cordon-wasm".into(), "../cordon-wasm".into()],
        "Wasm runner cordon-wasm",
        "build it with `cargo build -p cordon-wasm` (it is installed beside cordon) or set CORDON_WASM",
    )
}

/// The trap kind on the runner's last stderr line, if it trapped.
pub fn trap_kind(o: &Outcome) -> Option<String> {
    if o.exit_code != Some(TRAP_EXIT) {
        return None;
    }
    let text = String::from_utf8_lossy(&o.stderr);
    let last = text.lines().rev().find(|l| !l.is_empty())?;
    last.strip_prefix(TRAP_MARKER).map(str::to_string)
}

/// The runner's outcome as the call's: a trap said by kind (the time limit
/// as a timeout, the memory limit as a memory-limit stop), a failure
/// before the module ran as a setup error.
fn finish(spec: &SandboxSpec, mut o: Outcome) -> Result<Outcome, RunError> {
    if let Some(kind) = trap_kind(&o) {
        o.status = match kind.as_str() {
            "time limit" => Status::TimedOut,
            "memory limit" => Status::MemoryLimit,
            _ => Status::Exited,
        };
        o.reason = match kind.as_str() {
            "time limit" => format!(
                "{}: wasm trap: time limit: stopped at the wall clock of {}",
                spec.tool,
                cordon_sandbox::units::format_duration(spec.limits.wall)
            ),
            "memory limit" => format!(
                "{}: wasm trap: memory limit: linear memory would have grown past its limit",
                spec.tool
            ),
            k => format!("{}: wasm trap: {k}", spec.tool),
        };
        return Ok(o);
    }
    if o.exit_code == Some(SETUP_EXIT) {
        let text = String::from_utf8_lossy(&o.stderr);
        if let Some(why) = text.lines().find_map(|l| l.strip_prefix(SETUP_MARKER)) {
            return Err(RunError::Setup(format!("{}: {why}", spec.tool)));
        }
    }
    Ok(o)
}

impl Runtime for Wasm {
    fn name(&self) -> &'static str {
        "wasm"
    }

    fn check(&self, spec: &SandboxSpec) -> Check {
        let problems = self.problems(spec);
        let lowered = self.lower(spec, None);
        let mut native = self.native.check(&lowered);
        native.problems.retain(|p| {
            // The runner's bind is checked (as the runner) above.
            p.bind_source.as_deref() != self.runner.as_deref().ok()
        });
        let mut all = problems;
        all.extend(native.problems);
        Check {
            mechanisms: self.mechanisms(spec),
            problems: all,
        }
    }

    fn run(&self, spec: &SandboxSpec, input: Vec<u8>, ctx: &Context) -> Result<Outcome, RunError> {
        let code = self.compile(spec)?;
        if spec.wasm.as_ref().is_some_and(|w| w.worker) {
            return match self.run_on_worker(spec, &code, &input, ctx) {
                // As below: the cache file changed under a remembered
                // entry; compile (or find) it again, once.
                Err(RunError::Setup(why)) if why.contains("refusing to load it") => {
                    if let Ok(mut known) = self.known.lock() {
                        known.clear();
                    }
                    let code = self.compile(spec)?;
                    self.run_on_worker(spec, &code, &input, ctx)
                }
                other => other,
            };
        }
        let lowered = self.lower(spec, Some(&code));
        match self
            .native
            .run(&lowered, input.clone(), ctx)
            .and_then(|o| finish(spec, o))
        {
            // The cache file changed under a remembered entry: the runner
            // refused to load it; compile (or find) it again, once.
            Err(RunError::Setup(why)) if why.contains("refusing to load it") => {
                if let Ok(mut known) = self.known.lock() {
                    known.clear();
                }
                let code = self.compile(spec)?;
                let lowered = self.lower(spec, Some(&code));
                let o = self.native.run(&lowered, input, ctx)?;
                finish(spec, o)
            }
            other => other,
        }
    }

    fn spawn(&self, spec: &SandboxSpec, _ctx: &Context) -> Result<Spawned, RunError> {
        Err(RunError::Refused(format!(
            "{}: a wasm tool runs once per call, not as a long-lived sandbox",
            spec.tool
        )))
    }

    fn facts(&self) -> Facts {
        let spec = SandboxSpec::new("doctor", ["/bin/true"]);
        let mut notes = vec![
            format!(
                "runs WASI preview 1 modules (wasmtime, in cordon-wasm) inside the native jail: {}",
                match &self.runner {
                    Ok(p) => format!("runner {}", p.display()),
                    Err(e) => format!("unavailable: {e}"),
                }
            ),
            match &self.cache {
                Ok(c) => format!(
                    "compiled code cached in {} by module sha256 and engine (wasmtime version and configuration)",
                    c.display()
                ),
                Err(e) => format!("no wasm cache: {e}"),
            },
        ];
        for m in crate::mechanism::Mechanism::ALL {
            if let Some(w) = crate::mechanism::wasm_layer(m) {
                notes.push(format!("{m}: jail as native; inside it, wasm: {w}"));
            }
        }
        Facts {
            runtime: "wasm",
            mechanisms: self.mechanisms(&spec),
            notes,
        }
    }

    fn jail(&self) -> Option<Arc<Jail>> {
        Some(self.native.jail().clone())
    }

    /// A typed function's arguments schema: the module compiled (or found
    /// in the cache) and the function's types read by the compile step.
    fn input_schema(&self, spec: &SandboxSpec) -> Result<Option<serde_json::Value>, String> {
        if spec.wasm.as_ref().is_none_or(|w| w.function.is_none()) {
            return Ok(None);
        }
        self.compile(spec)
            .map(|c| c.schema)
            .map_err(|e| e.to_string())
    }
}

/// Record that the compiled code at `code` was used now: the modification
/// time of the digest file beside it, which [`gc_cache`] ages entries by
/// (as the runner's compile step does when it finds an entry). Best
/// effort: an entry whose time cannot be set ages from its last use.
fn mark_used(code: &Path) {
    let mut sum = code.as_os_str().to_owned();
    sum.push(".sha256");
    if let Ok(f) = std::fs::File::options()
        .write(true)
        .open(PathBuf::from(sum))
    {
        let _ = f.set_modified(std::time::SystemTime::now());
    }
}

/// Which compiled modules [`gc_cache`] keeps.
#[derive(Debug, Clone)]
pub enum Keep {
    /// The modules with these sha256 digests (those the manifests pin),
    /// whatever engine compiled them.
    Pinned(std::collections::BTreeSet<String>),
    /// Entries used (found by a call, or compiled) less than this long
    /// ago.
    NewerThan(Duration),
}

/// What [`gc_cache`] removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheGc {
    /// Each compiled module removed: its file name and the bytes it held
    /// (its code and the digest beside it).
    pub removed: Vec<(String, u64)>,
    /// Leftovers removed: temporaries of an interrupted write (an hour
    /// old or more), digests whose code is gone.
    pub leftovers: usize,
    /// Bytes freed in all.
    pub bytes: u64,
}

/// A temporary younger than this may be a write under way.
const TEMPORARY_AGE: Duration = Duration::from_secs(3600);

/// Remove from the compiled-code cache `cache` every entry `keep` does not
/// keep, and the leftovers of interrupted writes. Files that are not the
/// cache's are left alone; a cache that does not exist is empty. A call
/// that already found its entry has it bound into its jail, and a broker
/// that remembered it compiles it again at its next call.
pub fn gc_cache(cache: &Path, keep: &Keep) -> std::io::Result<CacheGc> {
    let mut out = CacheGc::default();
    let dir = match std::fs::read_dir(cache) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(e),
    };
    let mut names: Vec<String> = dir
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    let age = |p: &Path| -> Option<Duration> {
        let m = std::fs::symlink_metadata(p).ok()?.modified().ok()?;
        std::time::SystemTime::now().duration_since(m).ok()
    };
    let size = |p: &Path| std::fs::symlink_metadata(p).map_or(0, |m| m.len());
    for name in &names {
        let path = cache.join(name);
        if name.starts_with('.') && name.ends_with(".tmp") {
            if age(&path).is_some_and(|a| a >= TEMPORARY_AGE) {
                let n = size(&path);
                std::fs::remove_file(&path)?;
                out.leftovers += 1;
                out.bytes += n;
            }
            continue;
        }
        if let Some(code) = name.strip_suffix(".sha256") {
            if code.ends_with(".cwasm") && !names.iter().any(|n| n == code) {
                let n = size(&path);
                std::fs::remove_file(&path)?;
                out.leftovers += 1;
                out.bytes += n;
            }
            continue;
        }
        let Some(module) = name
            .strip_suffix(".cwasm")
            .and_then(|stem| stem.split_once('-'))
            .map(|(module, _engine)| module)
            .filter(|m| m.len() == 64 && m.bytes().all(|b| b.is_ascii_hexdigit()))
        else {
            continue;
        };
        let sum = cache.join(format!("{name}.sha256"));
        let kept = match keep {
            Keep::Pinned(pins) => pins.contains(&module.to_ascii_lowercase()),
            // Aged from its last use: the newer of its code's time and
            // its digest file's.
            Keep::NewerThan(bound) => match (age(&path), age(&sum)) {
                (Some(a), Some(b)) => a.min(b) < *bound,
                _ => true,
            },
        };
        if kept {
            continue;
        }
        let n = size(&path) + size(&sum);
        std::fs::remove_file(&path)?;
        match std::fs::remove_file(&sum) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        out.removed.push((name.clone(), n));
        out.bytes += n;
    }
    Ok(out)
}

#[cfg(test)]
mod gc_tests {
    use super::*;

    fn entry(dir: &Path, module: char, bytes: usize) -> String {
        let name = format!("{}-{}.cwasm", module.to_string().repeat(64), "e".repeat(32));
        std::fs::write(dir.join(&name), vec![0u8; bytes]).unwrap();
        std::fs::write(dir.join(format!("{name}.sha256")), "x\n").unwrap();
        name
    }

    fn age_by(p: &Path, by: Duration) {
        let f = std::fs::File::options().write(true).open(p).unwrap();
        f.set_modified(std::time::SystemTime::now() - by).unwrap();
    }

    #[test]
    fn unpinned_or_old_entries_and_leftovers_go_the_rest_stays() {
        let d = tempfile::tempdir().unwrap();
        let a = entry(d.path(), 'a', 100);
        let b = entry(d.path(), 'b', 50);
        std::fs::write(d.path().join("notes.txt"), "mine").unwrap();
        let fresh_tmp = d.path().join(format!(".{a}.7.tmp"));
        std::fs::write(&fresh_tmp, "w").unwrap();
        let old_tmp = d.path().join(format!(".{b}.8.tmp"));
        std::fs::write(&old_tmp, "ww").unwrap();
        age_by(&old_tmp, Duration::from_secs(7200));
        let orphan = d.path().join(format!(
            "{}-{}.cwasm.sha256",
            "c".repeat(64),
            "e".repeat(32)
        ));
        std::fs::write(&orphan, "y\n").unwrap();

        let pins = [("a".repeat(64))].into_iter().collect();
        let g = gc_cache(d.path(), &Keep::Pinned(pins)).unwrap();
        assert_eq!(g.removed, vec![(b.clone(), 52)]);
        assert_eq!(g.leftovers, 2);
        assert_eq!(g.bytes, 52 + 2 + 2);
        assert!(d.path().join(&a).exists() && d.path().join(format!("{a}.sha256")).exists());
        assert!(!d.path().join(format!("{b}.sha256")).exists());
        assert!(fresh_tmp.exists() && d.path().join("notes.txt").exists());

        // By last use: the entry compiled and last used long ago goes; one
        // compiled as long ago but used since (its digest file's time)
        // stays, as does a fresh one.
        let c = entry(d.path(), 'c', 10);
        let e = entry(d.path(), 'e', 10);
        let long_ago = Duration::from_secs(40 * 86400);
        age_by(&d.path().join(&a), long_ago);
        age_by(&d.path().join(format!("{a}.sha256")), long_ago);
        age_by(&d.path().join(&e), long_ago);
        age_by(&d.path().join(format!("{e}.sha256")), long_ago);
        mark_used(&d.path().join(&e));
        let g = gc_cache(d.path(), &Keep::NewerThan(Duration::from_secs(30 * 86400))).unwrap();
        assert_eq!(g.removed, vec![(a, 102)]);
        assert!(d.path().join(&c).exists());
        assert!(d.path().join(&e).exists(), "used since: kept");
        // No cache yet: nothing to do.
        let none = gc_cache(&d.path().join("absent"), &Keep::NewerThan(Duration::ZERO)).unwrap();
        assert_eq!(none, CacheGc::default());
    }
}
