//! The gVisor runtime (`runtime: gvisor`, profile P3): each sandbox is a
//! fresh application kernel (gVisor's Sentry) started by `runsc` for one
//! task and destroyed at its end.
//!
//! cordon writes the OCI bundle itself ([`crate::oci`]) and runs `runsc`
//! directly (no Docker, no containerd), with a `--root` state directory of
//! its own per sandbox under cordon's state directory, inside the bundle
//! directory, removed after every exit or kill.
//!
//! `runsc` is the child of the shared [`crate::supervisor`]: it runs as the
//! jail's supervisor in new pid, mount and network namespaces (and a user
//! namespace when the broker is unprivileged, where it also gets
//! `--rootless`), with the parent-death signal, in one of cordon's own
//! cgroup slots with the spec's memory, task and CPU limits, and gets
//! `--ignore-cgroups`: the same code then holds for a root and an
//! unprivileged broker (`runsc --rootless` cannot create cgroups at all),
//! on v1, v2 and hybrid hosts alike, and the limit covers the Sentry and
//! gofer too, not only the container's processes. This module holds only
//! what is gVisor's own: finding `runsc` and its release, probing its
//! platforms, its flags, and the bundle ([`crate::oci`]) written from the
//! supervisor's [`Guest`] (environment, trust bundle, network).
//!
//! **Tasks.** `tasks: N` is the tool's own tasks (processes and threads),
//! as on every runtime: the bundle makes N the tool's `RLIMIT_NPROC`,
//! which the Sentry enforces on each task it creates (see [`crate::oci`]).
//! The cgroup slot's `pids.max` is a host-side backstop, [`host_tasks`]
//! of N, sized for gVisor's own host threads besides the tool's. The
//! Sentry refuses a task silently (`EAGAIN`), so to report the limit
//! `runsc` traces the calls that create tasks (`--strace` of `clone`,
//! `clone3`, `fork`, `vfork` only) into its log, a FIFO in the sandbox's
//! directory that the broker reads and discards ([`TaskWatch`]); a tool
//! that failed after such a call was refused ended at its task limit, the
//! outcome the jail reports from `pids.events`.
//!
//! **Network.** With egress doors, `runsc` runs with `--network=host` in
//! the supervisor's network namespace: only `lo`, the doors' addresses on
//! it, and the doors' listening sockets, which the broker serves (and
//! where a session's credentials are substituted, the session CA being the
//! bundle's trust). gVisor's own network stack is not used: the Sentry
//! makes host sockets in that namespace, whose only reachable endpoints
//! are the doors. Without network, `--network=none`: gVisor's stack with a
//! loopback only, in an empty namespace.

use std::fs;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock, mpsc};
use std::time::{Duration, Instant};

use cordon_jail::{Jail, JailOptions};
use serde::Serialize;

use crate::mechanism::{Mechanism, MechanismState};
use crate::oci::{self, Net};
use crate::outcome::{Outcome, RunError, Status};
use crate::spec::SandboxSpec;
use crate::supervisor::{Child, Guest, Launch, OnEnd, Supervisor, WorkDir};
use crate::{Check, Context, Facts, Runtime, Spawned};

/// What a gVisor sandbox's directory is called in notes and errors.
const BUNDLE: &str = "gVisor bundle";

/// The oldest `runsc` release cordon runs (its systrap platform).
pub const MIN_RUNSC: u32 = 20240101;

/// The FIFO in a sandbox's directory that `runsc --debug-log` writes the
/// Sentry's log into; the broker reads it as it comes and keeps nothing.
const SENTRY_LOG: &str = "sentry-log";

/// The calls that create tasks, traced into the Sentry's log.
const TASK_CALLS: [&str; 4] = ["clone", "clone3", "fork", "vfork"];

/// The host tasks of a gVisor sandbox besides its tool's: `runsc`, the
/// gofer and the Sentry's Go runtime (measured: about 30 with systrap and
/// one guest process, `runsc` 20240729), with room for the Go runtime to
/// add threads while host calls block.
pub const HOST_TASKS_BASE: u64 = 128;

/// Host tasks per task of the tool: with systrap each guest process adds
/// about 3 (its address space's stub process and threads; measured up to
/// 100 busy processes), a guest thread fewer.
pub const HOST_TASKS_PER_TASK: u64 = 4;

/// The host pids bound (the cgroup slot's `pids.max`) of a gVisor sandbox
/// whose tool may have `tasks` tasks: a backstop behind the Sentry's own
/// limit, for gVisor's threads plus the tool's.
pub fn host_tasks(tasks: u64) -> u64 {
    HOST_TASKS_BASE.saturating_add(tasks.saturating_mul(HOST_TASKS_PER_TASK))
}

/// Reads the Sentry's log for the task limit: whether a traced call that
/// creates a task failed with `EAGAIN` (the tool's `RLIMIT_NPROC`; the
/// Sentry has no other cause of it within the limits cordon sets).
struct TaskWatch {
    /// The broker's own write end: the reader sees the log's end only once
    /// this is dropped and the sandbox is gone.
    writer: OwnedFd,
    refused: Arc<AtomicBool>,
    ended: mpsc::Receiver<()>,
}

/// How long a finished sandbox's log is waited for at most
/// ([`TaskWatch::refused`]).
const LOG_END_WAIT: Duration = Duration::from_secs(30);

/// The longest log line looked at; longer ones (none that matters) are
/// skipped.
const MAX_LOG_LINE: usize = 4096;

impl TaskWatch {
    /// The FIFO `SENTRY_LOG` in `dir`, and a thread reading it.
    fn start(dir: &Path) -> Result<TaskWatch, String> {
        let err = |what: &str, e: cordon_sys::Errno| format!("the Sentry's log: {what}: {e}");
        let d =
            cordon_sys::io::open_dir(dir).map_err(|e| err("open the sandbox's directory", e))?;
        let name = cordon_sys::fsat::Name::new(SENTRY_LOG.as_bytes())
            .ok_or_else(|| format!("the Sentry's log: bad name {SENTRY_LOG:?}"))?;
        cordon_sys::fsat::mkfifo_at(d.as_fd(), &name).map_err(|e| err("mkfifo", e))?;
        let mut reader =
            cordon_sys::fsat::open_fifo_at(d.as_fd(), &name).map_err(|e| err("open", e))?;
        let writer = cordon_sys::io::open_at(d.as_fd(), SENTRY_LOG, true)
            .map_err(|e| err("open for writing", e))?;
        cordon_sys::io::set_nonblocking(reader.as_fd(), false)
            .map_err(|e| err("make blocking", e))?;
        let refused = Arc::new(AtomicBool::new(false));
        let (tx, ended) = mpsc::channel();
        let r = refused.clone();
        std::thread::Builder::new()
            .name("gvisor-log".into())
            .spawn(move || {
                read_log(&mut reader, &r);
                let _ = tx.send(());
            })
            .map_err(|e| format!("the Sentry's log: start its reader: {e}"))?;
        Ok(TaskWatch {
            writer,
            refused,
            ended,
        })
    }

    /// Whether the Sentry refused the tool a task, once the sandbox has
    /// ended: after the rest of the log is read. The end comes as soon as
    /// the last of the sandbox's processes lets go of the log; the wait is
    /// bounded ([`LOG_END_WAIT`]) only so that a process that keeps it open
    /// cannot hang the call, and long enough for a reader that lags on a
    /// loaded host.
    fn refused(self) -> bool {
        let TaskWatch {
            writer,
            refused,
            ended,
        } = self;
        drop(writer);
        let _ = ended.recv_timeout(LOG_END_WAIT);
        refused.load(Ordering::SeqCst)
    }
}

/// Read the Sentry's log to its end, setting `refused` on a task refused.
fn read_log(log: &mut fs::File, refused: &AtomicBool) {
    let mut buf = vec![0u8; 64 << 10];
    let mut lines = Lines::default();
    loop {
        match log.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if lines.feed(&buf[..n]) {
                    refused.store(true, Ordering::SeqCst);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return,
        }
    }
}

/// The Sentry's log cut into lines as it arrives, each looked at once
/// whole ([`task_refused`]); a line over [`MAX_LOG_LINE`] is skipped.
#[derive(Default)]
struct Lines {
    line: Vec<u8>,
    overlong: bool,
}

impl Lines {
    /// Whether a line that `data` completes is a task refused.
    fn feed(&mut self, data: &[u8]) -> bool {
        let mut refused = false;
        for chunk in data.split_inclusive(|&b| b == b'\n') {
            let (part, end) = match chunk.split_last() {
                Some((b'\n', rest)) => (rest, true),
                _ => (chunk, false),
            };
            if !self.overlong {
                if self.line.len() + part.len() > MAX_LOG_LINE {
                    self.overlong = true;
                    self.line.clear();
                } else {
                    self.line.extend_from_slice(part);
                }
            }
            if end {
                refused |= !self.overlong && task_refused(&self.line);
                self.line.clear();
                self.overlong = false;
            }
        }
        refused
    }
}

/// Whether one line of the Sentry's log is a traced call that creates a
/// task ending in `EAGAIN`: `... X clone(ARGS) = 0 (0x0) errno=11 (try
/// again) (12µs)`. The task's name (the tool's to choose) comes before the
/// call, the return value after the last `) = `.
fn task_refused(line: &[u8]) -> bool {
    let line = String::from_utf8_lossy(line);
    let Some(at) = line.rfind(") = ") else {
        return false;
    };
    let (call, rval) = (&line[..at], &line[at + 4..]);
    let traced = TASK_CALLS
        .iter()
        .any(|n| call.contains(&format!(" X {n}(")));
    let mut words = rval.splitn(3, ' ');
    let (_, _, rest) = (words.next(), words.next(), words.next().unwrap_or(""));
    traced && rest.starts_with("errno=11 (")
}

/// How a gVisor sandbox ended, from the jail's outcome and whether the
/// Sentry refused the tool a task: a tool that failed after a refusal hit
/// its task limit (as the jail reads `pids.events`); one stopped by the
/// host backstop says so.
fn task_outcome(out: &mut Outcome, tool: &str, tasks: u64, host: u64, refused: bool) {
    match out.status {
        Status::Exited if refused => {
            out.status = Status::TaskLimit;
            out.reason = format!("{tool}: task limit {tasks} reached");
        }
        Status::TaskLimit if refused => {
            out.reason = format!("{tool}: task limit {tasks} reached");
        }
        Status::TaskLimit => {
            out.reason = format!(
                "{tool}: task limit {tasks} reached (at the sandbox's host bound of {host} tasks, gVisor's own included)"
            );
        }
        _ => {}
    }
}

/// Options of the gVisor runtime.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The `runsc` binary (default: `$CORDON_RUNSC`, else `runsc` in
    /// `PATH`).
    pub runsc: Option<PathBuf>,
    /// Where bundles and `runsc` state go (default: `gvisor` in cordon's
    /// runtime directory, `/run/cordon/gvisor` for root,
    /// `$XDG_RUNTIME_DIR/cordon/gvisor` otherwise; see `cordon_dirs`).
    pub state_dir: Option<PathBuf>,
}

/// A gVisor platform: how the Sentry intercepts the tool's system calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Platform {
    /// seccomp traps and a shared-memory stub (the default of recent
    /// `runsc`).
    Systrap,
    /// Hardware virtualisation (`/dev/kvm`).
    Kvm,
    /// `ptrace(2)`: works everywhere, slowest.
    Ptrace,
}

impl Platform {
    /// In the order cordon prefers them.
    pub const ALL: [Platform; 3] = [Platform::Systrap, Platform::Kvm, Platform::Ptrace];

    /// `runsc --platform=` name.
    pub fn name(self) -> &'static str {
        match self {
            Platform::Systrap => "systrap",
            Platform::Kvm => "kvm",
            Platform::Ptrace => "ptrace",
        }
    }

    fn from_name(s: &str) -> Option<Platform> {
        Platform::ALL.into_iter().find(|p| p.name() == s)
    }
}

/// Whether each platform works on this host, and why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlatformState {
    /// The platform.
    pub platform: Platform,
    /// `None`: it ran a program; otherwise why not.
    pub error: Option<String>,
}

#[derive(Debug, Clone)]
struct Runsc {
    path: PathBuf,
    /// `YYYYMMDD` of the release.
    version: u32,
}

/// What the runtime finds on first use: `runsc`, the state directory, and
/// what the sweep of a dead broker's leftovers did.
struct Found {
    runsc: Result<Runsc, String>,
    state: Result<PathBuf, String>,
    notes: Vec<String>,
}

/// The gVisor runtime.
pub struct Gvisor {
    sup: Supervisor,
    opts: Options,
    /// Looked up on first use, so that a process that never runs a gVisor
    /// sandbox (a one-shot P1 call) pays nothing for it.
    found: OnceLock<Found>,
    rootless: bool,
    platforms: OnceLock<Vec<PlatformState>>,
}

/// The release date in `runsc --version`'s first line (`runsc version
/// release-20240729.0` or Debian's `runsc version 0.0~20240729.0`).
pub fn parse_version(text: &str) -> Option<u32> {
    let line = text.lines().next()?;
    let rest = line.strip_prefix("runsc version ")?;
    let digits: String = rest
        .split(|c: char| !c.is_ascii_digit())
        .find(|w| w.len() == 8)?
        .to_string();
    digits.parse().ok()
}

/// `runsc --version` of `path`, remembered in `state` per binary (path,
/// size and modification time): a one-shot call does not pay for starting
/// `runsc` once more just to ask.
fn runsc_version_text(path: &Path, state: Option<&Path>) -> Result<String, String> {
    let key = fs::metadata(path).ok().and_then(|m| {
        let t = m
            .modified()
            .ok()?
            .duration_since(std::time::UNIX_EPOCH)
            .ok()?;
        Some(format!(
            "{}\n{}\n{}\n",
            path.display(),
            m.len(),
            t.as_nanos()
        ))
    });
    let cache = state.map(|s| s.join("runsc-version"));
    if let (Some(k), Some(c)) = (&key, &cache)
        && let Ok(text) = fs::read_to_string(c)
        && let Some(rest) = text.strip_prefix(k.as_str())
    {
        return Ok(rest.to_string());
    }
    let out = Command::new(path)
        .arg("--version")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("run {} --version: {e}", path.display()))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if let (Some(k), Some(c)) = (key, cache) {
        let tmp = c.with_extension(format!("{}", std::process::id()));
        if fs::write(&tmp, format!("{k}{text}")).is_ok() {
            let _ = fs::rename(&tmp, &c);
        }
    }
    Ok(text)
}

fn find_runsc(opt: Option<&Path>, state: Option<&Path>) -> Result<Runsc, String> {
    let path = match opt {
        Some(p) => p.to_path_buf(),
        None => match std::env::var_os("CORDON_RUNSC") {
            Some(p) => PathBuf::from(p),
            None => std::env::var_os("PATH")
                .into_iter()
                .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
                .chain([
                    "/usr/bin".into(),
                    "/usr/sbin".into(),
                    "/usr/local/bin".into(),
                ])
                .map(|d| d.join("runsc"))
                .find(|p| p.is_file())
                .ok_or_else(|| {
                    "runsc not found (install it: `apt-get install -t bookworm-backports runsc`)"
                        .to_string()
                })?,
        },
    };
    if !path.is_absolute() {
        return Err(format!("runsc {} is not an absolute path", path.display()));
    }
    let text = runsc_version_text(&path, state)?;
    let version = parse_version(&text).ok_or_else(|| {
        format!(
            "{} --version: no release date in {:?}",
            path.display(),
            text.lines().next().unwrap_or("")
        )
    })?;
    if version < MIN_RUNSC {
        return Err(format!(
            "runsc {} is release {version}, older than {MIN_RUNSC} (no working systrap platform); install bookworm-backports' runsc",
            path.display()
        ));
    }
    Ok(Runsc { path, version })
}

/// cordon's gVisor state directory: made 0711 if missing, and used only
/// when it is a real directory owned by this uid that only it can write.
fn state_dir(opt: Option<&Path>, euid: u32) -> Result<PathBuf, String> {
    let dir = match opt {
        Some(p) => p.to_path_buf(),
        None => cordon_dirs::Dirs::current()
            .gvisor()
            .map_err(|e| e.to_string())?,
    };
    if let Some(parent) = dir.parent()
        && !parent.exists()
    {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(|e| format!("create {}: {e}", parent.display()))?;
    }
    match fs::DirBuilder::new().mode(0o711).create(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(format!("create {}: {e}", dir.display())),
    }
    let m = fs::symlink_metadata(&dir).map_err(|e| format!("stat {}: {e}", dir.display()))?;
    if !m.is_dir() || m.uid() != euid || m.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is not a directory owned by uid {euid} and writable by it alone",
            dir.display()
        ));
    }
    Ok(dir)
}

impl Gvisor {
    /// The runtime over a jail of its own. Fails only when the jail
    /// cannot be made. `runsc` and the state directory are found (and what
    /// a dead broker left removed) on first use; a missing or old `runsc`
    /// is reported by [`Runtime::check`].
    pub fn new(opts: Options, jail: JailOptions) -> Result<Gvisor, String> {
        let jail = Jail::with_options(jail).map_err(|e| e.to_string())?;
        Ok(Gvisor::with_jail(opts, Arc::new(jail)))
    }

    /// [`Gvisor::new`] over an existing jail (its cgroup slots are shared
    /// with the native runtime's).
    pub fn with_jail(opts: Options, jail: Arc<Jail>) -> Gvisor {
        let euid = jail.host().euid;
        Gvisor {
            sup: Supervisor::new(jail),
            opts,
            found: OnceLock::new(),
            rootless: euid != 0,
            platforms: OnceLock::new(),
        }
    }

    fn found(&self) -> &Found {
        self.found.get_or_init(|| {
            let state = state_dir(self.opts.state_dir.as_deref(), self.sup.jail().host().euid);
            let notes = match &state {
                Ok(s) => crate::supervisor::sweep(s, BUNDLE),
                Err(_) => Vec::new(),
            };
            Found {
                runsc: find_runsc(self.opts.runsc.as_deref(), state.as_deref().ok()),
                state,
                notes,
            }
        })
    }

    /// The `runsc` version (`YYYYMMDD`), or why there is none.
    pub fn runsc_version(&self) -> Result<u32, String> {
        self.found()
            .runsc
            .as_ref()
            .map(|r| r.version)
            .map_err(Clone::clone)
    }

    /// Whether each platform works here (tried once, briefly, and cached
    /// in the state directory per `runsc` release and kernel).
    pub fn platforms(&self) -> Vec<PlatformState> {
        self.platforms
            .get_or_init(|| match (&self.found().runsc, &self.found().state) {
                (Ok(r), Ok(s)) => probe_platforms(r, s, self.rootless),
                (Err(e), _) | (_, Err(e)) => Platform::ALL
                    .into_iter()
                    .map(|platform| PlatformState {
                        platform,
                        error: Some(e.clone()),
                    })
                    .collect(),
            })
            .clone()
    }

    /// The platform sandboxes use: the first that works, in
    /// [`Platform::ALL`]'s order.
    pub fn chosen(&self) -> Result<Platform, String> {
        let ps = self.platforms();
        if let Some(p) = ps.iter().find(|p| p.error.is_none()) {
            return Ok(p.platform);
        }
        Err(format!(
            "no gVisor platform works here: {}",
            ps.iter()
                .map(|p| format!(
                    "{}: {}",
                    p.platform.name(),
                    p.error.as_deref().unwrap_or("?")
                ))
                .collect::<Vec<_>>()
                .join("; ")
        ))
    }

    /// How each mechanism holds for a sandbox of `spec` here.
    pub fn mechanisms(&self, spec: &SandboxSpec) -> Vec<MechanismState> {
        let mut out = vec![
            MechanismState::enforced(Mechanism::Namespaces),
            MechanismState::enforced(Mechanism::ReadonlyRoot),
            MechanismState::enforced(Mechanism::Descriptors),
            MechanismState::enforced(Mechanism::Network),
            MechanismState::enforced(Mechanism::Seccomp),
            MechanismState::missing(
                Mechanism::Landlock,
                "not applied inside gVisor: the application kernel serves the tool's file system from read-only binds through its gofer",
            ),
        ];
        out.push(self.sup.cgroup(
            spec,
            "the gVisor sandbox (Sentry included)",
            "memory or CPU",
        ));
        out
    }

    /// The jail underneath (host facts).
    pub fn jail(&self) -> &Arc<Jail> {
        self.sup.jail()
    }

    /// Where bundles go; each is `cordon-<broker pid>-<n>`, which is also
    /// its `runsc` container id.
    pub fn state_dir(&self) -> Result<&Path, String> {
        self.found().state.as_deref().map_err(Clone::clone)
    }
}

/// Try each platform with `runsc do /bin/true` (a few seconds at most
/// each), or read the answer cached for this `runsc` and kernel.
fn probe_platforms(runsc: &Runsc, state: &Path, rootless: bool) -> Vec<PlatformState> {
    let kernel = cordon_sys::io::kernel_release();
    let key = format!("{}-{}", runsc.version, kernel.replace(['/', ' '], "_"));
    let cache = state.join(format!("platforms-{key}.json"));
    if let Ok(text) = fs::read_to_string(&cache)
        && let Ok(v) = serde_json::from_str::<Vec<(String, Option<String>)>>(&text)
    {
        let states: Vec<PlatformState> = v
            .into_iter()
            .filter_map(|(n, error)| {
                Some(PlatformState {
                    platform: Platform::from_name(&n)?,
                    error,
                })
            })
            .collect();
        if states.len() == Platform::ALL.len() {
            return states;
        }
    }
    let states: Vec<PlatformState> = Platform::ALL
        .into_iter()
        .map(|platform| PlatformState {
            platform,
            error: try_platform(runsc, state, platform, rootless).err(),
        })
        .collect();
    let v: Vec<(&str, Option<&String>)> = states
        .iter()
        .map(|s| (s.platform.name(), s.error.as_ref()))
        .collect();
    if let Ok(text) = serde_json::to_string(&v) {
        let tmp = state.join(format!(".platforms-{key}.{}", std::process::id()));
        if fs::File::create(&tmp)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .is_ok()
        {
            let _ = fs::rename(&tmp, &cache);
        }
    }
    states
}

fn try_platform(
    runsc: &Runsc,
    state: &Path,
    platform: Platform,
    rootless: bool,
) -> Result<(), String> {
    if platform == Platform::Kvm && !Path::new("/dev/kvm").exists() {
        return Err("no /dev/kvm".into());
    }
    let root = state.join(format!(".probe-{}-{}", std::process::id(), platform.name()));
    let _ = fs::remove_dir_all(&root);
    let mut cmd = Command::new(&runsc.path);
    cmd.arg("--root")
        .arg(&root)
        .arg(format!("--platform={}", platform.name()))
        .args(["--network=none", "--ignore-cgroups"]);
    if rootless {
        cmd.arg("--rootless");
    }
    cmd.args(["do", "/bin/true"])
        .current_dir("/")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let r = (|| {
        let mut child = cmd.spawn().map_err(|e| format!("run runsc: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            match child.try_wait() {
                Ok(Some(st)) if st.success() => return Ok(()),
                Ok(Some(st)) => {
                    let mut err = String::new();
                    if let Some(mut e) = child.stderr.take() {
                        let _ = std::io::Read::read_to_string(&mut e, &mut err);
                    }
                    let last = err.lines().rev().find(|l| !l.trim().is_empty());
                    return Err(format!(
                        "runsc do /bin/true: {st}{}",
                        last.map(|l| format!(": {}", l.trim())).unwrap_or_default()
                    ));
                }
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err("runsc do /bin/true did not finish within 5 s".into());
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(10)),
                Err(e) => return Err(format!("wait for runsc: {e}")),
            }
        }
    })();
    let _ = fs::remove_dir_all(&root);
    r
}

impl Child for Gvisor {
    fn name(&self) -> &'static str {
        "gvisor"
    }

    fn leftover(&self) -> &'static str {
        BUNDLE
    }

    fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Err(e) = &self.found().runsc {
            out.push(format!("runtime gvisor: {e}"));
            return out;
        }
        if let Err(e) = &self.found().state {
            out.push(format!("runtime gvisor: state directory: {e}"));
            return out;
        }
        if let Err(e) = self.chosen() {
            out.push(format!("runtime gvisor: {e}"));
        }
        out
    }

    fn state_dir(&self) -> Result<&Path, String> {
        Gvisor::state_dir(self)
    }

    /// The bundle (the guest's environment, trust bundle and network
    /// written into `config.json`, see [`oci`]) and `runsc run` of it.
    fn launch(&self, spec: &SandboxSpec, guest: &Guest, dir: &WorkDir) -> Result<Launch, RunError> {
        let (Ok(runsc), Ok(platform)) = (&self.found().runsc, self.chosen()) else {
            return Err(RunError::Refused(format!(
                "{}: runtime gvisor cannot start here",
                spec.tool
            )));
        };
        let net = if guest.doors { Net::Inherit } else { Net::Own };
        oci::write_bundle(
            dir.path(),
            spec,
            &guest.env,
            guest.trust_bundle.as_deref(),
            &self.jail().host().system_dirs,
            net,
        )
        .map_err(|e| RunError::Refused(format!("{}: {e}", spec.tool)))?;
        let watch = TaskWatch::start(dir.path())
            .map_err(|e| RunError::Setup(format!("{}: {e}", spec.tool)))?;
        let mut argv: Vec<String> = vec![
            runsc.path.to_string_lossy().into_owned(),
            "--root".into(),
            dir.path().join("state").to_string_lossy().into_owned(),
            format!("--platform={}", platform.name()),
            format!(
                "--network={}",
                if net == Net::Inherit { "host" } else { "none" }
            ),
            "--ignore-cgroups".into(),
            "--overlay2=none".into(),
            "--oci-seccomp".into(),
            // The Sentry's log (only the sandbox's, not each runsc
            // command's), with the calls that create tasks traced.
            format!(
                "--debug-log={}",
                dir.path().join(SENTRY_LOG).to_string_lossy()
            ),
            "--debug-command=boot".into(),
            "--strace".into(),
            format!("--strace-syscalls={}", TASK_CALLS.join(",")),
        ];
        if self.rootless {
            argv.push("--rootless".into());
        }
        argv.extend([
            "run".into(),
            "--bundle".into(),
            dir.path().to_string_lossy().into_owned(),
            dir.id().to_string(),
        ]);
        let mut limits = spec.limits;
        limits.tasks = host_tasks(spec.limits.tasks);
        let (tool, tasks, host) = (spec.tool.clone(), spec.limits.tasks, limits.tasks);
        Ok(Launch {
            argv,
            cleanup: Vec::new(),
            limits: Some(limits),
            on_end: Some(OnEnd(Box::new(move |out| {
                task_outcome(out, &tool, tasks, host, watch.refused());
            }))),
            boot: std::time::Duration::ZERO,
        })
    }
}

impl Runtime for Gvisor {
    fn name(&self) -> &'static str {
        "gvisor"
    }

    fn check(&self, spec: &SandboxSpec) -> Check {
        let mut problems: Vec<crate::Problem> =
            Child::problems(self).into_iter().map(Into::into).collect();
        if spec.workspace.is_some() || spec.state.is_some() {
            problems.push(format!(
                "{}: the gvisor runtime does not mount a workspace or state yet (use `runtime: native`)",
                spec.tool
            ).into());
        }
        if let Some(m) = spec.mounts.iter().find(|m| m.writable) {
            problems.push(crate::Problem::at_bind(
                &m.src,
                format!(
                    "mount {}:{}:rw: the gvisor runtime binds host paths read-only only",
                    m.src.display(),
                    m.dst.display()
                ),
            ));
        }
        problems.extend(oci::problems(spec).into_iter().map(Into::into));
        Check {
            mechanisms: self.mechanisms(spec),
            problems,
        }
    }

    fn run(&self, spec: &SandboxSpec, input: Vec<u8>, ctx: &Context) -> Result<Outcome, RunError> {
        self.sup.run(self, spec, input, ctx)
    }

    fn spawn(&self, spec: &SandboxSpec, ctx: &Context) -> Result<Spawned, RunError> {
        self.sup.spawn(self, spec, ctx)
    }

    fn facts(&self) -> Facts {
        let spec = SandboxSpec::new("doctor", ["/bin/true"]);
        let mut notes = Vec::new();
        let found = self.found();
        match &found.runsc {
            Ok(r) => notes.push(format!(
                "runsc {} (release {}){}",
                r.path.display(),
                r.version,
                if self.rootless { ", --rootless" } else { "" }
            )),
            Err(e) => notes.push(format!("refused: {e}")),
        }
        if found.runsc.is_ok() {
            let ps = self.platforms();
            notes.push(format!(
                "platforms: {}",
                ps.iter()
                    .map(|p| match &p.error {
                        None => format!("{} works", p.platform.name()),
                        Some(e) => format!("{} does not ({e})", p.platform.name()),
                    })
                    .collect::<Vec<_>>()
                    .join("; ")
            ));
            match self.chosen() {
                Ok(p) => notes.push(format!("chosen platform: {}", p.name())),
                Err(e) => notes.push(format!("refused: {e}")),
            }
        }
        if let Ok(s) = &found.state {
            notes.push(format!("state: {}", s.display()));
        } else if let Err(e) = &found.state {
            notes.push(format!("refused: state directory: {e}"));
        }
        notes.push("network: egress doors in a network namespace of the sandbox's own, reached with --network=host (gVisor's network stack unused); without network, --network=none".into());
        notes.push(format!(
            "tasks: the tool's own, its RLIMIT_NPROC in the Sentry (refusals read from the Sentry's log of the calls that create tasks); the host pids bound is {HOST_TASKS_BASE} + {HOST_TASKS_PER_TASK} per task, for gVisor's own threads"
        ));
        notes.push("devices: no /dev/fuse or /dev/net/tun (covered in the bundle; device nodes cannot be made)".into());
        notes.extend(found.notes.iter().cloned());
        Facts {
            runtime: "gvisor",
            mechanisms: self.mechanisms(&spec),
            notes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions() {
        assert_eq!(
            parse_version("runsc version release-20240729.0\nspec: 1.1.0"),
            Some(20240729)
        );
        assert_eq!(
            parse_version("runsc version 0.0~20240729.0\nspec: 1.0.2-dev"),
            Some(20240729)
        );
        assert_eq!(
            parse_version("runsc version 0.0~20221219.0"),
            Some(20221219)
        );
        assert_eq!(parse_version("something else"), None);
    }

    #[test]
    fn a_refused_task_is_read_from_the_sentrys_log() {
        let refused = "I1203 07:39:59.131355   32285 strace.go:611] [   2:   2] python3 X clone(CLONE_CHILD_CLEARTID|CLONE_CHILD_SETTID|0x11, 0x0, 0x0, 0x7ec80502f310, 0x0) = 0 (0x0) errno=11 (try again) (612.049\u{b5}s)";
        assert!(task_refused(refused.as_bytes()));
        for call in ["clone3(0x7ffd1000, 0x58)", "vfork()", "fork()"] {
            let l = format!(
                "I1203 strace.go:611] [   1:   1] sh X {call} = 0 (0x0) errno=11 (try again) (1\u{b5}s)"
            );
            assert!(task_refused(l.as_bytes()), "{l}");
        }
        // Positive controls for what is not a refusal: a task made, the
        // entry line, another errno, another call.
        for l in [
            "I1203 strace.go:611] [   2:   2] python3 X clone(0x1200011, 0x0, 0x0, 0x7e, 0x0) = 7 (0x7) (90\u{b5}s)",
            "I1203 strace.go:559] [   2:   2] python3 E clone(0x1200011, 0x0, 0x0, 0x7e, 0x0)",
            "I1203 strace.go:611] [   2:   2] python3 X clone(0x1200011, 0x0, 0x0, 0x7e, 0x0) = 0 (0x0) errno=12 (cannot allocate memory) (9\u{b5}s)",
            "I1203 strace.go:611] [   2:   2] python3 X read(0x3, 0x7f, 0x10) = 0 (0x0) errno=11 (try again) (9\u{b5}s)",
            // The task's name is the tool's: it cannot make a task made
            // look refused.
            "I1203 strace.go:611] [   2:   2] errno=11 ( X clone(0x1200011, 0x0, 0x0, 0x7e, 0x0) = 7 (0x7) (90\u{b5}s)",
            "",
        ] {
            assert!(!task_refused(l.as_bytes()), "{l}");
        }
    }

    #[test]
    fn the_log_is_read_to_its_end_line_by_line() {
        let refusal = "I1 strace.go:611] [ 1: 1] sh X vfork() = 0 (0x0) errno=11 (try again) (1s)";
        let mut lines = Lines::default();
        // An overlong line that ends like a refusal is skipped.
        let long = format!("{}{refusal}\n", "x".repeat(MAX_LOG_LINE));
        assert!(!lines.feed(long.as_bytes()));
        // A refusal split across reads counts once it is whole.
        let (a, b) = refusal.split_at(60);
        assert!(!lines.feed(format!("I1 other line\n{a}").as_bytes()));
        assert!(lines.feed(format!("{b}\nI1 next").as_bytes()));
        assert!(!lines.feed(b" line\n"));
        // Read from a pipe to its end.
        let (r, mut w) = std::io::pipe().unwrap();
        let refused = AtomicBool::new(false);
        std::thread::scope(|sc| {
            let h = sc.spawn(|| read_log(&mut fs::File::from(OwnedFd::from(r)), &refused));
            w.write_all(long.as_bytes()).unwrap();
            w.write_all(a.as_bytes()).unwrap();
            w.write_all(format!("{b}\n").as_bytes()).unwrap();
            drop(w);
            h.join().unwrap();
        });
        assert!(refused.load(Ordering::SeqCst));
    }

    fn ended(status: Status, exit_code: Option<i32>) -> Outcome {
        Outcome {
            status,
            exit_code,
            signal: None,
            duration: Duration::ZERO,
            setup: None,
            peak_memory_bytes: None,
            stdout: Vec::new(),
            output_bytes: 0,
            stderr: Vec::new(),
            stderr_total: 0,
            reason: "gv: something".into(),
            warnings: Vec::new(),
            landlock: crate::outcome::LandlockStatus::Disabled,
        }
    }

    #[test]
    fn a_refusal_makes_a_failed_call_a_task_limit() {
        // Refused and failed: the task limit, named as the tool's.
        let mut o = ended(Status::Exited, Some(2));
        task_outcome(&mut o, "gv", 32, host_tasks(32), true);
        assert_eq!(
            (o.status, o.reason.as_str()),
            (Status::TaskLimit, "gv: task limit 32 reached")
        );
        // Refused but the tool coped, or nothing refused: as it was.
        for (status, code, refused) in [
            (Status::Ok, Some(0), true),
            (Status::Exited, Some(2), false),
            (Status::TimedOut, None, true),
        ] {
            let mut o = ended(status, code);
            task_outcome(&mut o, "gv", 32, host_tasks(32), refused);
            assert_eq!((o.status, o.reason.as_str()), (status, "gv: something"));
        }
        // The host backstop (the jail's outcome names its own figure).
        let mut o = ended(Status::TaskLimit, Some(1));
        task_outcome(&mut o, "gv", 32, host_tasks(32), false);
        assert_eq!(
            o.reason,
            "gv: task limit 32 reached (at the sandbox's host bound of 256 tasks, gVisor's own included)"
        );
        assert_eq!(host_tasks(512), 2176);
        assert_eq!(host_tasks(u64::MAX), u64::MAX);
    }
}
