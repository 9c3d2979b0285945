//! Warm pools (`lifetime: pool`): sandboxes started ahead of the task that
//! will use them, for any runtime that can [`Runtime::spawn`].
//!
//! A pooled sandbox is the tool's own sandbox, fully built (for gVisor: the
//! Sentry booted, the gofer serving the root), whose first process is a
//! shell waiting for one line on its stdin before it `exec`s the tool's
//! program: `/bin/sh -c 'IFS= read -r _ || exit 125; exec "$0" "$@"' ARGV`.
//! A task takes one (writes that line, then its input, and closes stdin),
//! reads its whole stdout under the output cap and its own wall clock,
//! and the sandbox is destroyed when the task ends: never reused, never
//! given to a second task. The pool then starts another in the background.
//! An empty pool falls back to a cold start ([`Runtime::run`]), as does a
//! call with credentials (a pooled sandbox was made before its session
//! was known). After [`MAX_FAILURES`] starts in a row fail, the pool stops
//! refilling and says why ([`Pool::stopped`]; the broker puts it in the
//! call's audit record, and a status file in cordon's runtime directory
//! tells `cordon doctor`). Each pool's size, idle and starting sandboxes,
//! hand-overs and failed starts are on [`crate::pool_status`]'s board,
//! which `cordon serve` publishes for `cordon doctor`. A pool made with
//! an observer ([`Pool::observed`]) also tells it of each sandbox that did
//! not start (`failed`) or ended before a task took it (`discarded`): the
//! broker audits them.

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::{Duration, Instant};

use crate::outcome::{Outcome, RunError, Status};
use crate::spec::{Root, SandboxSpec};
use crate::{Context, EgressSink, Runtime, Spawned};

/// Starts that fail in a row before the refill stops (a start is good
/// once its sandbox was taken by a task or retired alive; one that ended
/// before either counts as failed).
pub const MAX_FAILURES: u32 = 3;

/// How long an idle pooled sandbox is kept before it is replaced by a new
/// one (its wall clock is this plus the task's).
pub const MAX_IDLE: Duration = Duration::from_secs(600);

/// The gate in front of the tool's program.
const GATE: &str = "IFS= read -r _ || exit 125; exec \"$0\" \"$@\"";

/// A pool's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settings {
    /// Idle sandboxes kept ready.
    pub size: usize,
    /// Start a new one after each take (false: the pool drains and then
    /// every task cold-starts).
    pub refill: bool,
}

struct Idle {
    /// Its own id (`pool-<pid>-<n>`), in the audit record of the task
    /// that takes it.
    id: String,
    spawned: Spawned,
    /// Where the sandbox's egress events go: the task's sink once taken.
    sink: Arc<Mutex<Option<EgressSink>>>,
    born: Instant,
}

#[derive(Default)]
struct State {
    idle: VecDeque<Idle>,
    failures: u32,
    stopped: Option<String>,
    closing: bool,
    /// Starts under way.
    starting: usize,
    /// Sandboxes started successfully so far.
    started: usize,
    /// Sandboxes handed to a task so far.
    handed_out: u64,
    /// Failed starts so far (not only in a row), and the last one's reason.
    failed_total: u64,
    last_failure: Option<String>,
}

/// A pooled sandbox that did not serve a task, told to the pool's
/// observer (the broker writes its audit record): `failed` when it could
/// not be made (its runtime's error, at the start or reported later),
/// `discarded` when it was made and ended before a task took it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lost {
    /// `failed` (its start failed) or `discarded` (it ended before a task
    /// took it).
    pub event: &'static str,
    /// Its id (`pool-<pid>-<n>`).
    pub sandbox: String,
    /// `discarded`: how long it waited idle; `failed`: 0.
    pub waited_ms: u64,
    /// Why, and whether the pool stopped refilling because of it.
    pub reason: String,
}

/// What a pool tells of its lost sandboxes ([`Pool::observed`]); called
/// on the pool's own threads, never with its lock held.
pub type Observer = Arc<dyn Fn(&Lost) + Send + Sync>;

/// The pooled sandbox a task took: its id and how long it waited idle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    pub sandbox: String,
    pub waited_ms: u64,
}

/// Numbers the pooled sandboxes of this process (their ids).
static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A pool of never-used sandboxes for one tool's spec.
pub struct Pool {
    runtime: Arc<dyn Runtime>,
    spec: SandboxSpec,
    /// The host ids its sandboxes run under (`None`: the shared ones).
    host_ids: Option<(u32, u32)>,
    settings: Settings,
    state: Mutex<State>,
    wake: Condvar,
    status_file: Option<PathBuf>,
    /// Its entry on the pool status board ([`crate::pool_status`]).
    label: String,
    /// Told of each sandbox that did not serve a task.
    observer: Option<Observer>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("tool", &self.spec.tool)
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

/// Where pools whose refill stopped leave a status file
/// (`<broker pid>-<tool>.stopped`) for `cordon doctor`: `pools` in
/// cordon's runtime directory (`/run/cordon/pools` for root,
/// `$XDG_RUNTIME_DIR/cordon/pools` otherwise; see `cordon_dirs`). Made
/// (0700) if missing; `None` when there is no runtime directory or it is
/// not this uid's alone.
pub fn status_dir() -> Option<PathBuf> {
    let dirs = cordon_dirs::Dirs::current();
    let d = dirs.pools().ok()?;
    cordon_dirs::ensure_private(&d, dirs.euid()).ok()?;
    Some(d)
}

/// Pools of live brokers whose refill stopped: `(broker pid, why)`.
pub fn stopped_pools() -> Vec<(u32, String)> {
    let Some(d) = status_dir() else {
        return Vec::new();
    };
    let Ok(rd) = std::fs::read_dir(&d) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .split_once('-')
            .and_then(|(p, _)| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !cordon_sys::io::pid_alive(pid as i32) {
            let _ = std::fs::remove_file(e.path());
            continue;
        }
        if let Ok(text) = std::fs::read_to_string(e.path()) {
            out.push((pid, text.lines().nth(1).unwrap_or("").to_string()));
        }
    }
    out
}

/// Whether `spec` can be pooled (its root has the gate's `/bin/sh`).
pub fn poolable(spec: &SandboxSpec) -> Result<(), String> {
    let sh = match &spec.root {
        Root::HostBinds => PathBuf::from("/bin/sh"),
        Root::Image { rootfs, .. } => rootfs.join("bin/sh"),
    };
    if sh.exists() {
        Ok(())
    } else {
        Err(format!(
            "{}: lifetime: pool needs /bin/sh in the sandbox's root to hold a sandbox until its task",
            spec.tool
        ))
    }
}

impl Pool {
    /// A pool of `settings.size` sandboxes of `spec` on `runtime`, filled
    /// in the background; `status_dir` gets a status file while the
    /// refill is stopped (for `cordon doctor`).
    pub fn new(
        runtime: Arc<dyn Runtime>,
        spec: SandboxSpec,
        settings: Settings,
        status_dir: Option<PathBuf>,
    ) -> Result<Arc<Pool>, String> {
        let label = spec.tool.clone();
        Pool::observed(runtime, spec, None, settings, status_dir, &label, None)
    }

    /// [`Pool::new`] of sandboxes run under `host_ids` (a tenant's own;
    /// `None`: the shared ones), whose status file is named by `label`
    /// instead of the tool (a broker keeps one pool of a tool per tenant),
    /// and whose sandboxes that do not start or end before a task are told
    /// to `observer` (each once, as it happens).
    pub fn observed(
        runtime: Arc<dyn Runtime>,
        spec: SandboxSpec,
        host_ids: Option<(u32, u32)>,
        settings: Settings,
        status_dir: Option<PathBuf>,
        label: &str,
        observer: Option<Observer>,
    ) -> Result<Arc<Pool>, String> {
        poolable(&spec)?;
        let status_file = status_dir.map(|d| {
            d.join(format!(
                "{}-{}.stopped",
                std::process::id(),
                label.replace(['/', '\0'], "_")
            ))
        });
        let pool = Arc::new(Pool {
            runtime,
            spec,
            host_ids,
            settings,
            state: Mutex::new(State::default()),
            wake: Condvar::new(),
            status_file,
            label: label.to_string(),
            observer,
        });
        let weak = Arc::downgrade(&pool);
        std::thread::Builder::new()
            .name(format!("pool-{}", pool.spec.tool))
            .spawn(move || refill(weak))
            .map_err(|e| format!("start the pool's refill thread: {e}"))?;
        Ok(pool)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Put `st` on the pool status board (what `cordon doctor` shows of a
    /// running `cordon serve`).
    fn report(&self, st: &State) {
        let tool = self.spec.tool.as_str();
        crate::pool_status::update("command", &self.label, tool, &self.label, |e| {
            e.size = self.settings.size;
            e.ready = st.idle.len();
            e.starting = st.starting;
            e.handed_out = st.handed_out;
            e.refill_failures = st.failed_total;
            e.last_failure = st.last_failure.clone();
            e.stopped = st.stopped.clone();
        });
    }

    /// Idle sandboxes now.
    pub fn idle(&self) -> usize {
        self.lock().idle.len()
    }

    /// Why the refill stopped, if it did.
    pub fn stopped(&self) -> Option<String> {
        self.lock().stopped.clone()
    }

    /// Block until `n` sandboxes are idle or the refill stopped (tests,
    /// benchmarks); false on timeout.
    pub fn wait_idle(&self, n: usize, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if st.idle.len() >= n {
                return true;
            }
            if st.stopped.is_some() {
                return false;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            st = self
                .wake
                .wait_timeout(st, left.min(Duration::from_millis(100)))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// The spec a pooled sandbox runs: the gate, then the tool, with a wall
    /// clock long enough to wait idle.
    fn pooled_spec(&self) -> SandboxSpec {
        let mut s = self.spec.clone();
        let mut argv = vec!["/bin/sh".to_string(), "-c".into(), GATE.into()];
        argv.extend(self.spec.argv.iter().cloned());
        s.argv = argv;
        s.limits.wall = self.spec.limits.wall + MAX_IDLE;
        // The task's whole output is capped below; a message cap as large.
        s.limits.output_bytes = self.spec.limits.output_bytes;
        s
    }

    fn start_one(&self, id: String) -> Result<Idle, RunError> {
        let sink: Arc<Mutex<Option<EgressSink>>> = Arc::default();
        let fwd = sink.clone();
        let ctx = Context {
            session: "pool".into(),
            tenant: crate::DEFAULT_TENANT.into(),
            on_egress: Arc::new(move |e| {
                if let Some(s) = fwd.lock().unwrap_or_else(|p| p.into_inner()).as_ref() {
                    s(e);
                }
            }),
            credentials: Default::default(),
            placement: crate::Placement {
                host_ids: self.host_ids,
                ..Default::default()
            },
        };
        let spawned = self.runtime.spawn(&self.pooled_spec(), &ctx)?;
        Ok(Idle {
            id,
            spawned,
            sink,
            born: Instant::now(),
        })
    }

    /// One task: a pooled sandbox if one is idle (and the call carries no
    /// credentials), else a cold start. The second value says which.
    pub fn run(&self, input: Vec<u8>, ctx: &Context) -> Result<(Outcome, bool), RunError> {
        self.run_taking(input, ctx).map(|(o, t)| (o, t.is_some()))
    }

    /// [`Pool::run`], saying which pooled sandbox the task took (`None`:
    /// a cold start).
    pub fn run_taking(
        &self,
        input: Vec<u8>,
        ctx: &Context,
    ) -> Result<(Outcome, Option<Taken>), RunError> {
        let taken = if ctx.credentials.is_empty() {
            let mut lost = Vec::new();
            let mut st = self.lock();
            let mut t = None;
            while let Some(i) = st.idle.pop_front() {
                let (made, why) = match i.spawned.handle.outcome() {
                    None => {
                        t = Some(i);
                        break;
                    }
                    Some(Ok(o)) => (true, o.reason),
                    Some(Err(e)) => (false, e.to_string()),
                };
                let stop = self.failed(&mut st, "a pooled sandbox ended before its task");
                lost.push(lost_idle(&i, made, &why, stop));
            }
            if t.is_some() {
                st.handed_out += 1;
                // It stayed up until a task took it: a good start.
                st.failures = 0;
            }
            self.report(&st);
            self.wake.notify_all();
            drop(st);
            self.tell(&lost);
            t
        } else {
            None
        };
        match taken {
            Some(idle) => {
                let t = Taken {
                    sandbox: idle.id.clone(),
                    waited_ms: idle.born.elapsed().as_millis() as u64,
                };
                Ok((self.run_taken(idle, input, ctx)?, Some(t)))
            }
            None => Ok((self.runtime.run(&self.spec, input, ctx)?, None)),
        }
    }

    fn run_taken(&self, idle: Idle, input: Vec<u8>, ctx: &Context) -> Result<Outcome, RunError> {
        let start = Instant::now();
        *idle.sink.lock().unwrap_or_else(|p| p.into_inner()) = Some(ctx.on_egress.clone());
        let Spawned { stream, handle } = idle.spawned;
        let tool = self.spec.tool.clone();
        let io = |what: &str, e: std::io::Error| RunError::Setup(format!("{tool}: {what}: {e}"));
        let mut w = stream.try_clone().map_err(|e| io("pooled stream", e))?;
        let writer = std::thread::spawn(move || {
            let _ = w.write_all(b"\n");
            let _ = w.write_all(&input);
            let _ = w.shutdown(std::net::Shutdown::Write);
        });
        // The task's wall clock, from the take.
        let h = handle.clone();
        let wall = self.spec.limits.wall;
        let done = Arc::new((Mutex::new(false), Condvar::new()));
        let d = done.clone();
        let timer = std::thread::spawn(move || {
            let (m, c) = &*d;
            let mut fin = m.lock().unwrap_or_else(|p| p.into_inner());
            let deadline = Instant::now() + wall;
            while !*fin {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    h.kill();
                    return true;
                }
                fin = c
                    .wait_timeout(fin, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            false
        });
        let cap = self.spec.limits.output_bytes;
        let mut out = Vec::new();
        let mut total: u64 = 0;
        let mut over = false;
        let mut r = stream;
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    total += n as u64;
                    if total > cap {
                        over = true;
                        handle.kill();
                        break;
                    }
                    out.extend_from_slice(&buf[..n]);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        drop(r);
        let waited = handle.wait();
        {
            let (m, c) = &*done;
            *m.lock().unwrap_or_else(|p| p.into_inner()) = true;
            c.notify_all();
        }
        let timed_out = timer.join().unwrap_or(false);
        let _ = writer.join();
        let mut o = waited?;
        o.duration = start.elapsed();
        // Made and released long before the take: all of this call's
        // time in the sandbox is its program running.
        o.setup = Some(std::time::Duration::ZERO);
        o.stdout = out;
        o.output_bytes = total;
        if over {
            o.status = Status::OutputCap;
            o.reason = format!("{}: output over cap ({cap} bytes)", self.spec.tool);
        } else if timed_out && matches!(o.status, Status::Killed | Status::Exited | Status::Ok) {
            o.status = Status::TimedOut;
            o.reason = format!(
                "{}: timed out after {}",
                self.spec.tool,
                cordon_sandbox::units::format_duration(wall)
            );
        }
        Ok(o)
    }

    /// Count a failed start; the last of [`MAX_FAILURES`] in a row stops
    /// the refill (then `Some`: why it stopped).
    fn failed(&self, st: &mut State, why: &str) -> Option<String> {
        st.failures += 1;
        st.failed_total += 1;
        st.last_failure = Some(why.to_string());
        if st.failures >= MAX_FAILURES && st.stopped.is_none() {
            let why = format!(
                "pool of {}: refill stopped after {} failed starts in a row (last: {why}); tasks cold-start",
                self.spec.tool, st.failures
            );
            tracing::warn!("{why}");
            self.write_status(&why);
            st.stopped = Some(why.clone());
            return Some(why);
        }
        None
    }

    /// Tell the observer of sandboxes lost (the pool's lock not held).
    fn tell(&self, lost: &[Lost]) {
        if let Some(o) = &self.observer {
            for l in lost {
                o(l);
            }
        }
    }

    fn write_status(&self, why: &str) {
        if let Some(f) = &self.status_file {
            let _ = std::fs::write(f, format!("{}\n{why}\n", self.spec.tool));
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let mut st = self.lock();
        st.closing = true;
        for i in st.idle.drain(..) {
            i.spawned.handle.kill();
        }
        if let Some(f) = &self.status_file {
            let _ = std::fs::remove_file(f);
        }
        crate::pool_status::remove("command", &self.label);
    }
}

/// The observer's word of `idle`, which ended before a task took it:
/// `failed` when its sandbox could not be made (`made` false: its
/// runtime's error), else `discarded`.
fn lost_idle(idle: &Idle, made: bool, why: &str, stop: Option<String>) -> Lost {
    let (event, waited_ms, reason) = if made {
        (
            "discarded",
            idle.born.elapsed().as_millis() as u64,
            format!(
                "pooled sandbox {} discarded: it ended before a task took it ({why})",
                idle.id
            ),
        )
    } else {
        (
            "failed",
            0,
            format!("pooled sandbox {} did not start: {why}", idle.id),
        )
    };
    Lost {
        event,
        sandbox: idle.id.clone(),
        waited_ms,
        reason: with_stop(reason, stop),
    }
}

fn with_stop(reason: String, stop: Option<String>) -> String {
    match stop {
        Some(s) => format!("{reason}; {s}"),
        None => reason,
    }
}

/// The refill loop: keep `size` idle, replace the stale, stop after
/// [`MAX_FAILURES`] failed starts in a row. Ends with the pool.
fn refill(pool: Weak<Pool>) {
    loop {
        let Some(p) = pool.upgrade() else { return };
        // Replace sandboxes idle too long; a sandbox that ended before any
        // task took it is a failed start.
        let (stale, lost) = {
            let mut st = p.lock();
            if st.closing {
                return;
            }
            let mut dead = Vec::new();
            let mut keep = VecDeque::new();
            let mut old = Vec::new();
            for i in st.idle.drain(..) {
                if let Some(o) = i.spawned.handle.outcome() {
                    let (made, why) = match o {
                        Ok(o) => (true, o.reason),
                        Err(e) => (false, e.to_string()),
                    };
                    dead.push((i, made, why));
                } else if i.born.elapsed() > MAX_IDLE - Duration::from_secs(30) {
                    old.push(i);
                } else {
                    keep.push_back(i);
                }
            }
            st.idle = keep;
            if !old.is_empty() {
                // They stayed up until they were retired: good starts.
                st.failures = 0;
            }
            let changed = !dead.is_empty();
            let mut lost = Vec::new();
            for (i, made, why) in dead {
                let stop = p.failed(&mut st, &why);
                lost.push(lost_idle(&i, made, &why, stop));
            }
            if changed {
                p.report(&st);
            }
            (old, lost)
        };
        p.tell(&lost);
        for i in stale {
            i.spawned.handle.kill();
        }
        let need = {
            let mut st = p.lock();
            let need = st.stopped.is_none()
                && st.idle.len() + st.starting < p.settings.size
                && (p.settings.refill || st.started + st.starting < p.settings.size);
            if need {
                st.starting += 1;
                p.report(&st);
            }
            need
        };
        if need {
            let id = format!(
                "pool-{}-{}",
                std::process::id(),
                SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            );
            let r = p.start_one(id.clone());
            let mut st = p.lock();
            st.starting -= 1;
            let mut lost = None;
            match r {
                Ok(i) => {
                    // Not yet a good start: a sandbox can end right after
                    // it (its runtime reports a setup failure later);
                    // the count goes back to 0 when one is taken or
                    // retired alive.
                    st.started += 1;
                    st.idle.push_back(i);
                }
                Err(e) => {
                    let why = e.to_string();
                    let stop = p.failed(&mut st, &why);
                    lost = Some(Lost {
                        event: "failed",
                        reason: with_stop(
                            format!("pooled sandbox {id} did not start: {why}"),
                            stop,
                        ),
                        sandbox: id,
                        waited_ms: 0,
                    });
                }
            }
            p.report(&st);
            p.wake.notify_all();
            // A sandbox that dies right after its start is counted too.
            drop(st);
            p.tell(lost.as_slice());
            std::thread::sleep(Duration::from_millis(20));
            continue;
        }
        // Wait for a take (or a stale sandbox to replace).
        let st = p.lock();
        let _ = p
            .wake
            .wait_timeout(st, Duration::from_secs(5))
            .unwrap_or_else(|p| p.into_inner());
        drop(p);
    }
}
