//! The gVisor runtime (`runtime: gvisor`, profile P3): each sandbox is a
//! fresh application kernel (gVisor's Sentry) started by `runsc` for one
//! task and destroyed at its end.
//!
//! cordon writes the OCI bundle itself ([`crate::oci`]) and runs `runsc`
//! directly (no Docker, no containerd), with a `--root` state directory of
//! its own per sandbox under cordon's state directory, inside the bundle
//! directory, removed after every exit or kill.
//!
//! `runsc` runs as a supervisor of the jail ([`Jail::run_supervisor`]): in
//! new pid, mount and network namespaces (and a user namespace when the
//! broker is unprivileged, where it also gets `--rootless`), with the
//! parent-death signal. **Limits.** The whole of it (the `runsc` command,
//! its gofer, the Sentry and the stub processes that run the tool's code)
//! is born in one of cordon's own cgroup slots, with the spec's memory,
//! task and CPU limits, and `runsc` gets `--ignore-cgroups`. That choice,
//! rather than letting `runsc` make cgroups: the same code then holds for
//! a root and an unprivileged broker (`runsc --rootless` cannot create
//! cgroups at all), on v1, v2 and hybrid hosts alike (which the jail's
//! cgroup code already handles, OOM read from `oom_kill`), and the limit
//! covers the Sentry and gofer too, not only the container's processes;
//! the wall clock and output caps are the jail's, as for P1. **Cleanup.**
//! When the supervisor (pid 1 of its pid namespace) exits or is killed,
//! the kernel kills everything `runsc` started; the broker then removes
//! the bundle and state directory, and a broker that died leaves a bundle
//! whose lock nobody holds, which the next start removes (its cgroup slot
//! is removed by the jail's own leftover sweep).
//!
//! **Network.** With egress doors, `runsc` runs with `--network=host` in a
//! network namespace made exactly as a native sandbox's: only `lo`, the
//! doors' addresses on it, and the doors' listening sockets, which the
//! broker serves. gVisor's own network stack is not used: the Sentry makes
//! host sockets in that namespace, whose only reachable endpoints are the
//! doors. Without network, `--network=none`: gVisor's stack with a
//! loopback only, in an empty namespace.

use std::fs;
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use cordon_jail::{DoorRequest, Jail, JailOptions, JailSpec, NetMode, RootFs, Stdin};
use serde::Serialize;

use crate::mechanism::{Mechanism, MechanismState};
use crate::oci::{self, Net};
use crate::outcome::{Outcome, RunError};
use crate::spec::{Network, SandboxSpec};
use crate::{Check, Context, Facts, Runtime, Spawned};

/// Numbers this process's bundles (every runtime of it shares the state
/// directory).
static SEQ: AtomicU64 = AtomicU64::new(0);

/// The oldest `runsc` release cordon runs (its systrap platform).
pub const MIN_RUNSC: u32 = 20240101;

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
    jail: Arc<Jail>,
    opts: Options,
    /// Looked up on first use, so that a process that never runs a gVisor
    /// sandbox (a one-shot P1 call) pays nothing for it.
    found: OnceLock<Found>,
    rootless: bool,
    platforms: OnceLock<Vec<PlatformState>>,
    net: OnceLock<tokio::runtime::Runtime>,
}

impl Drop for Gvisor {
    fn drop(&mut self) {
        if let Some(rt) = self.net.take() {
            rt.shutdown_background();
        }
    }
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

/// Remove the bundles of brokers that are gone: a bundle whose lock file
/// nobody holds. What ran in it died with its supervisor (pid 1 of its
/// pid namespace, with the parent-death signal).
fn sweep(state: &Path) -> Vec<String> {
    let mut notes = Vec::new();
    let Ok(entries) = fs::read_dir(state) else {
        return notes;
    };
    for e in entries.flatten() {
        let p = e.path();
        if !e.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let held = fs::File::open(p.join("lock")).map(|f| f.try_lock());
        // A bundle another broker is making this instant has no lock file
        // yet: only one without a lock for a minute is left over.
        if held
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
            && e.metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_none_or(|age| age < std::time::Duration::from_secs(60))
        {
            continue;
        }
        match held {
            Ok(Ok(())) | Err(_) => match fs::remove_dir_all(&p) {
                Ok(()) => notes.push(format!(
                    "removed a gVisor bundle left by a broker that is gone: {}",
                    p.display()
                )),
                Err(err) => notes.push(format!(
                    "cannot remove the leftover gVisor bundle {}: {err}",
                    p.display()
                )),
            },
            Ok(Err(_)) => {}
        }
    }
    notes
}

/// One sandbox's bundle directory, locked while it exists; removed on
/// drop.
struct Bundle {
    dir: PathBuf,
    _lock: fs::File,
}

impl Drop for Bundle {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), "cannot remove the gVisor bundle: {e}");
        }
    }
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
            jail,
            opts,
            found: OnceLock::new(),
            rootless: euid != 0,
            platforms: OnceLock::new(),
            net: OnceLock::new(),
        }
    }

    fn found(&self) -> &Found {
        self.found.get_or_init(|| {
            let state = state_dir(self.opts.state_dir.as_deref(), self.jail.host().euid);
            let notes = match &state {
                Ok(s) => sweep(s),
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
        out.push(match self.jail.cgroup_fallback_reason() {
            Some(why) => MechanismState::missing(
                Mechanism::Cgroup,
                format!(
                    "{why}: the gVisor sandbox (Sentry included) would have no memory, task or CPU limit"
                ),
            ),
            None => {
                let l = &self.jail.host().cgroup_layout;
                let absent: Vec<&str> = [
                    ("memory", l.memory.is_some()),
                    ("pids", l.pids.is_some()),
                    ("cpu", l.cpu.is_some() || spec.limits.cpu_percent.is_none()),
                ]
                .into_iter()
                .filter(|(_, ok)| !ok)
                .map(|(n, _)| n)
                .collect();
                if absent.is_empty() {
                    MechanismState::enforced(Mechanism::Cgroup)
                } else {
                    MechanismState::partial(
                        Mechanism::Cgroup,
                        format!("no {} controller here", absent.join(", ")),
                    )
                }
            }
        });
        out
    }

    fn net(&self) -> Result<&tokio::runtime::Runtime, RunError> {
        if let Some(rt) = self.net.get() {
            return Ok(rt);
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cordon-egress")
            .enable_all()
            .build()
            .map_err(|e| RunError::Setup(format!("start the egress runtime: {e}")))?;
        Ok(self.net.get_or_init(|| rt))
    }

    /// A new bundle for `spec` and the supervisor's spec that runs it.
    fn prepare(
        &self,
        spec: &SandboxSpec,
        ctx: &Context,
    ) -> Result<(Bundle, JailSpec, Option<cordon_egress::EgressPolicy>), RunError> {
        let problems = self.problems();
        if !problems.is_empty() {
            return Err(RunError::Refused(format!(
                "{}: would not start on this host: {}",
                spec.tool,
                problems.join("; ")
            )));
        }
        if !ctx.credentials.is_empty() {
            // Fail closed: no session CA or substitution is wired into a
            // gVisor sandbox's doors yet, so its secrets could not be
            // delivered as the manifest says.
            return Err(RunError::Refused(format!(
                "{}: the gvisor runtime does not deliver secrets in this build; refusing rather than running without them",
                spec.tool
            )));
        }
        let (Ok(runsc), Ok(state), Ok(platform)) =
            (&self.found().runsc, &self.found().state, self.chosen())
        else {
            return Err(RunError::Refused(format!(
                "{}: runtime gvisor cannot start here",
                spec.tool
            )));
        };
        let setup = |what: &str, e: std::io::Error| {
            RunError::Setup(format!("{}: gVisor bundle: {what}: {e}", spec.tool))
        };
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let id = format!("cordon-{}-{n}", std::process::id());
        let dir = state.join(&id);
        fs::DirBuilder::new()
            .mode(0o711)
            .create(&dir)
            .map_err(|e| setup(&format!("create {}", dir.display()), e))?;
        let lock = fs::File::create(dir.join("lock"))
            .and_then(|f| f.lock().map(|()| f))
            .map_err(|e| setup("lock", e));
        let lock = match lock {
            Ok(l) => l,
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(e);
            }
        };
        let bundle = Bundle {
            dir: dir.clone(),
            _lock: lock,
        };
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o711))
            .map_err(|e| setup("chmod", e))?;

        let mut env = spec.env.clone();
        let (network, egress, net) = match &spec.network {
            Network::None => (NetMode::None, None, Net::Own),
            Network::Doors(ep) => {
                let plan = cordon_egress::plan(ep);
                env.retain(|(k, _)| !plan.env.iter().any(|(pk, _)| pk == k));
                env.extend(plan.env.iter().cloned());
                (
                    NetMode::Doors(DoorRequest {
                        local_cidrs: plan
                            .local_cidrs
                            .iter()
                            .map(|n| (n.addr(), n.prefix_len()))
                            .collect(),
                        tcp: plan.tcp.clone(),
                        udp: plan.udp.clone(),
                        // The DNS door answers from 198.18.0.0/15 here:
                        // gVisor's own resolver is not pointed at it.
                        local_addresses: false,
                    }),
                    Some((**ep).clone()),
                    Net::Inherit,
                )
            }
        };
        for (k, v) in &ctx.credentials.env {
            env.retain(|(ek, _)| ek != k);
            env.push((k.clone(), v.to_string()));
        }
        oci::write_bundle(&dir, spec, &env, &self.jail.host().system_dirs, net)
            .map_err(|e| RunError::Refused(format!("{}: {e}", spec.tool)))?;

        let mut argv: Vec<String> = vec![
            runsc.path.to_string_lossy().into_owned(),
            "--root".into(),
            dir.join("state").to_string_lossy().into_owned(),
            format!("--platform={}", platform.name()),
            format!(
                "--network={}",
                if net == Net::Inherit { "host" } else { "none" }
            ),
            "--ignore-cgroups".into(),
            "--overlay2=none".into(),
            "--oci-seccomp".into(),
        ];
        if self.rootless {
            argv.push("--rootless".into());
        }
        argv.extend([
            "run".into(),
            "--bundle".into(),
            dir.to_string_lossy().into_owned(),
            id,
        ]);
        let l = &spec.limits;
        let js = JailSpec {
            tool: spec.tool.clone(),
            argv,
            env: vec![("PATH".into(), "/usr/sbin:/usr/bin:/sbin:/bin".into())],
            binds: Vec::new(),
            volumes: Vec::new(),
            limits: crate::native::jail_limits(l),
            network,
            seccomp: cordon_jail::SeccompMode::DenyList,
            landlock: false,
            trust_bundle: None,
            root: RootFs::Host,
            cwd: None,
            user: None,
            host_ids: None,
        };
        Ok((bundle, js, egress))
    }

    /// The jail underneath (host facts).
    pub fn jail(&self) -> &Arc<Jail> {
        &self.jail
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

impl Runtime for Gvisor {
    fn name(&self) -> &'static str {
        "gvisor"
    }

    fn check(&self, spec: &SandboxSpec) -> Check {
        let mut problems = self.problems();
        if spec.workspace.is_some() || spec.state.is_some() {
            problems.push(format!(
                "{}: the gvisor runtime does not mount a workspace or state yet (use `runtime: native`)",
                spec.tool
            ));
        }
        if let Some(m) = spec.mounts.iter().find(|m| m.writable) {
            problems.push(format!(
                "mount {}:{}:rw: the gvisor runtime binds host paths read-only only",
                m.src.display(),
                m.dst.display()
            ));
        }
        Check {
            mechanisms: self.mechanisms(spec),
            problems,
        }
    }

    fn run(&self, spec: &SandboxSpec, input: Vec<u8>, ctx: &Context) -> Result<Outcome, RunError> {
        let (bundle, js, egress) = self.prepare(spec, ctx)?;
        let net = match &egress {
            Some(_) => Some(self.net()?.handle().clone()),
            None => None,
        };
        let r = crate::native::run_jail(
            &self.jail,
            net.as_ref(),
            &js,
            egress.map(|e| (e, None)),
            Stdin::Bytes(input),
            ctx,
            true,
        );
        drop(bundle);
        r.map(crate::native::outcome)
    }

    fn spawn(&self, spec: &SandboxSpec, ctx: &Context) -> Result<Spawned, RunError> {
        let (bundle, mut js, egress) = self.prepare(spec, ctx)?;
        js.limits.output_bytes = crate::spec::message_cap(spec.limits.output_bytes);
        let tool = spec.tool.clone();
        let io = |what: &str, e: std::io::Error| RunError::Setup(format!("{tool}: {what}: {e}"));
        let (ours, theirs) =
            std::os::unix::net::UnixStream::pair().map_err(|e| io("socket pair", e))?;
        let (stop_r, stop_w) = std::io::pipe().map_err(|e| io("stop pipe", e))?;
        let stream = cordon_jail::Stream {
            socket: std::os::fd::OwnedFd::from(theirs),
            stop: std::os::fd::OwnedFd::from(stop_r),
        };
        let handle = Arc::new(crate::native::NativeHandle::new(
            tool.clone(),
            std::os::fd::OwnedFd::from(stop_w),
        ));
        let jail = self.jail.clone();
        let net = match &egress {
            Some(_) => Some(self.net()?.handle().clone()),
            None => None,
        };
        let h = handle.clone();
        let ctx = ctx.clone();
        std::thread::Builder::new()
            .name(format!("gvisor-{tool}"))
            .spawn(move || {
                let r = crate::native::run_jail(
                    &jail,
                    net.as_ref(),
                    &js,
                    egress.map(|e| (e, None)),
                    Stdin::Stream(stream),
                    &ctx,
                    true,
                );
                drop(bundle);
                h.finish(r.map(crate::native::outcome));
            })
            .map_err(|e| io("start the sandbox thread", e))?;
        Ok(Spawned {
            stream: ours,
            handle,
        })
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
}
