//! The supervisor of runtimes that run a VMM or an application kernel as a
//! child under the jail (gVisor's `runsc` today, QEMU next), and the parts
//! of it the native runtime shares (the egress doors, the credentials at
//! the door, the sandbox thread and its handle).
//!
//! **What such a runtime gives** ([`Child`]): its state directory and the
//! name of what it keeps there (a "gVisor bundle"), why it cannot start on
//! this host, and for each sandbox its command line, with its own files
//! written into the sandbox's directory ([`WorkDir`]) from the [`Guest`]
//! the supervisor decided, and any extra path to remove once the sandbox
//! is gone ([`Launch`]). Nothing else.
//!
//! **What the supervisor does**: runs that command line as pid 1 of new
//! pid, mount and network namespaces under the jail
//! ([`Jail::run_supervisor`]), in one of the jail's cgroup slots with the
//! spec's memory, task and CPU limits (the child, its helpers and the
//! guest alike); the network namespace holds the egress doors of the spec's
//! policy, served on its own egress runtime, where the session's
//! credentials are substituted (the session CA made the guest's trust
//! bundle); the wall clock, the output caps (the message cap for a spawned
//! sandbox), the stdio relay and kill are the jail's. It makes the
//! sandbox's directory, locked while it lives, removes it afterwards, and
//! removes what a broker that died left ([`sweep`]).

use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use zeroize::Zeroizing;

use cordon_egress::{
    DoorContext, DoorHandle, Doors, EgressPolicy, EventSink, Interception, SessionCa, UpstreamTrust,
};
use cordon_jail::{DoorRequest, Jail, JailError, JailSpec, NetMode, Stdin};

use crate::mechanism::{Mechanism, MechanismState};
use crate::outcome::{Outcome, RunError};
use crate::spec::{Network, Root, SandboxSpec};
use crate::{Context, SandboxHandle, Spawned};

pub use cordon_policy::policy::TRUST_BUNDLE_ENV;

/// What a runtime run by the [`Supervisor`] gives.
pub(crate) trait Child {
    /// Its name in messages (`gvisor`).
    fn name(&self) -> &'static str;
    /// What a sandbox's directory is, in notes (`gVisor bundle`).
    fn leftover(&self) -> &'static str;
    /// Why it would not start on this host (empty: it would).
    fn problems(&self) -> Vec<String>;
    /// Where its sandboxes' directories go.
    fn state_dir(&self) -> Result<&Path, String>;
    /// The command line that runs `spec` as `guest` says, its files
    /// written into `dir`.
    fn launch(&self, spec: &SandboxSpec, guest: &Guest, dir: &WorkDir) -> Result<Launch, RunError>;
    /// Reads what the child left in `dir` about how the sandbox ended into
    /// `out` (a VMM's guest status), once one call has ended and before
    /// the directory is removed.
    fn finish(&self, _dir: &WorkDir, _out: &mut Outcome) {}
}

/// What a [`Launch`] does once its sandbox has ended, a call's or a
/// spawned sandbox's alike, to how it ended (gVisor's task limit, seen in
/// the Sentry's log). Dropped without being called when the sandbox could
/// not run.
pub(crate) struct OnEnd(pub Box<dyn FnOnce(&mut Outcome) + Send>);

impl std::fmt::Debug for OnEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnEnd")
    }
}

/// What the supervisor decided a sandbox gets, for the child to render.
#[derive(Debug)]
pub(crate) struct Guest {
    /// The whole environment of the tool: the spec's, the egress plan's,
    /// the credentials' and the trust-bundle variables.
    pub env: Vec<(String, String)>,
    /// `true`: the child runs in the network namespace with the doors and
    /// the guest must use it (gVisor's `--network=host`); `false`: no
    /// network but a loopback of the guest's own.
    pub doors: bool,
    /// A PEM bundle to make the guest's system trust, at
    /// [`Guest::trust_bundle_path`] (and the root's usual trust-bundle
    /// paths, as the jail does), when credentials are substituted at the
    /// doors.
    pub trust_bundle: Option<Vec<u8>>,
}

/// Where a sandbox of `root` finds its trust bundle (the jail's rule:
/// written over the host root's bundle, beside an image's).
pub(crate) fn trust_bundle_path(root: &Root) -> &'static str {
    match root {
        Root::HostBinds => cordon_jail::TRUST_BUNDLE,
        Root::Image { .. } => cordon_jail::TRUST_BUNDLE_IMAGE,
    }
}

/// A child's command line for one sandbox.
#[derive(Debug, Default)]
pub(crate) struct Launch {
    /// Run as the supervisor's pid 1 (an absolute program path).
    pub argv: Vec<String>,
    /// Removed once the sandbox is gone, besides its [`WorkDir`].
    pub cleanup: Vec<PathBuf>,
    /// The supervisor's limits when they are not the tool's (a VMM holds
    /// the guest's memory and its own); `None`: the tool's.
    pub limits: Option<cordon_sandbox::Limits>,
    /// Applied to the outcome once the sandbox has ended.
    pub on_end: Option<OnEnd>,
    /// How long the child's own start may take on top of the tool's wall
    /// clock (a guest's cold boot); the child then keeps the tool's wall
    /// clock from the task's start itself.
    pub boot: std::time::Duration,
}

/// Numbers this process's sandbox directories (every runtime of it may
/// share a state directory).
static SEQ: AtomicU64 = AtomicU64::new(0);

/// One sandbox's directory in a runtime's state directory,
/// `cordon-<broker pid>-<n>`, locked while it exists (so that [`sweep`]
/// leaves it); removed on drop.
#[derive(Debug)]
pub(crate) struct WorkDir {
    dir: PathBuf,
    id: String,
    what: &'static str,
    _lock: fs::File,
}

impl WorkDir {
    /// A new directory in `state` (`what` names it in errors).
    fn new(state: &Path, what: &'static str) -> Result<WorkDir, (String, std::io::Error)> {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let id = format!("cordon-{}-{n}", std::process::id());
        let dir = state.join(&id);
        fs::DirBuilder::new()
            .mode(0o711)
            .create(&dir)
            .map_err(|e| (format!("create {}", dir.display()), e))?;
        let lock = fs::File::create(dir.join("lock")).and_then(|f| f.lock().map(|()| f));
        let lock = match lock {
            Ok(l) => l,
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                return Err(("lock".into(), e));
            }
        };
        let wd = WorkDir {
            dir,
            id,
            what,
            _lock: lock,
        };
        fs::set_permissions(&wd.dir, fs::Permissions::from_mode(0o711))
            .map_err(|e| ("chmod".to_string(), e))?;
        Ok(wd)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Its name, unique on this host while it exists.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            tracing::warn!(dir = %self.dir.display(), "cannot remove the {}: {e}", self.what);
        }
    }
}

/// What is removed once a sandbox is gone: its directory and the extra
/// paths of its [`Launch`].
struct Leftovers {
    _dir: WorkDir,
    paths: Vec<PathBuf>,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        for p in &self.paths {
            let r = match fs::symlink_metadata(p) {
                Ok(m) if m.is_dir() => fs::remove_dir_all(p),
                Ok(_) => fs::remove_file(p),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e),
            };
            if let Err(e) = r {
                tracing::warn!(path = %p.display(), "cannot remove a sandbox's file: {e}");
            }
        }
    }
}

/// Remove the sandbox directories of brokers that are gone from `state`:
/// a directory whose lock file nobody holds (`what` names it in the
/// notes). What ran in it died with its supervisor (pid 1 of its pid
/// namespace, with the parent-death signal).
pub(crate) fn sweep(state: &Path, what: &str) -> Vec<String> {
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
        // A directory another broker is making this instant has no lock
        // file yet: only one without a lock for a minute is left over.
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
                    "removed a {what} left by a broker that is gone: {}",
                    p.display()
                )),
                Err(err) => notes.push(format!(
                    "cannot remove the leftover {what} {}: {err}",
                    p.display()
                )),
            },
            Ok(Err(_)) => {}
        }
    }
    notes
}

/// Serves egress doors: a runtime of its own, started on first use.
#[derive(Default)]
pub(crate) struct EgressRuntime(OnceLock<tokio::runtime::Runtime>);

impl EgressRuntime {
    /// Its handle when there are doors to serve.
    pub(crate) fn for_doors<T>(
        &self,
        egress: Option<&T>,
    ) -> Result<Option<tokio::runtime::Handle>, RunError> {
        if egress.is_none() {
            return Ok(None);
        }
        if let Some(rt) = self.0.get() {
            return Ok(Some(rt.handle().clone()));
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("cordon-egress")
            .enable_all()
            .build()
            .map_err(|e| RunError::Setup(format!("start the egress runtime: {e}")))?;
        Ok(Some(self.0.get_or_init(|| rt).handle().clone()))
    }
}

impl Drop for EgressRuntime {
    fn drop(&mut self) {
        // Never block: the last owner may be a task on another runtime.
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// The jail's network for `network`, and its egress policy; the egress
/// plan's variables replace any of the same name in `env`. With
/// `local_addresses`, the DNS door's answers are added to the sandbox's
/// `lo` (a guest kernel with a resolver of its own is not pointed at it).
pub(crate) fn network(
    network: &Network,
    env: &mut Vec<(String, String)>,
    local_addresses: bool,
) -> (NetMode, Option<EgressPolicy>) {
    match network {
        Network::None => (NetMode::None, None),
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
                    local_addresses,
                }),
                Some((**ep).clone()),
            )
        }
    }
}

/// The host's roots, read once per broker.
fn system_trust() -> Result<UpstreamTrust, String> {
    static TRUST: OnceLock<Result<UpstreamTrust, String>> = OnceLock::new();
    TRUST.get_or_init(UpstreamTrust::system).clone()
}

/// What the session's credentials add to a sandbox.
pub(crate) struct Delivery {
    /// What the doors substitute, with the session CA they intercept with.
    pub interception: Option<Interception>,
    /// The host's roots plus the session CA: the sandbox's trust bundle.
    pub trust_bundle: Option<Vec<u8>>,
}

/// The session's credential variables, put in `secret` (zeroised with
/// it) and taken out of `env` (any of the same name). With injections and
/// egress doors: a session CA for the doors to intercept with, made the
/// sandbox's trust (the host's roots plus the CA), which the sandbox finds
/// at `trust_path` (named in the [`TRUST_BUNDLE_ENV`] variables).
pub(crate) fn credentials(
    tool: &str,
    env: &mut Vec<(String, String)>,
    secret: &mut Vec<(String, Zeroizing<String>)>,
    egress: Option<&EgressPolicy>,
    ctx: &Context,
    trust_path: &str,
) -> Result<Delivery, RunError> {
    for (k, v) in &ctx.credentials.env {
        env.retain(|(ek, _)| ek != k);
        secret.retain(|(ek, _)| ek != k);
        secret.push((k.clone(), v.clone()));
    }
    if ctx.credentials.injections.is_empty() || egress.is_none() {
        return Ok(Delivery {
            interception: None,
            trust_bundle: None,
        });
    }
    let fail = |e: String| RunError::Setup(format!("{tool}: credential injection: {e}"));
    let ca = Arc::new(SessionCa::new(&format!("{tool} {}", ctx.session)).map_err(fail)?);
    let trust = system_trust().map_err(fail)?;
    let mut bundle = trust.pem();
    bundle.push_str(ca.cert_pem());
    let icpt = Interception::new(ctx.credentials.injections.clone(), ca, trust).map_err(fail)?;
    for k in TRUST_BUNDLE_ENV {
        env.retain(|(ek, _)| ek != k);
        env.push((k.to_string(), trust_path.to_string()));
    }
    Ok(Delivery {
        interception: Some(icpt),
        trust_bundle: Some(bundle.into_bytes()),
    })
}

/// The cgroup controllers a sandbox of `spec` would need that this host's
/// cgroup layout lacks.
pub(crate) fn absent_controllers(jail: &Jail, spec: &SandboxSpec) -> Vec<&'static str> {
    let l = &jail.host().cgroup_layout;
    [
        ("memory", l.memory.is_some()),
        ("pids", l.pids.is_some()),
        ("cpu", l.cpu.is_some() || spec.limits.cpu_percent.is_none()),
    ]
    .into_iter()
    .filter(|(_, ok)| !ok)
    .map(|(n, _)| n)
    .collect()
}

/// The rtnetlink socket the jail made in a sandbox's namespace: adds the addresses the DNS
/// door answers to the sandbox's `lo`.
#[derive(Debug)]
struct RouteSocket {
    /// The socket, and the sequence number of the last request (one request at a time).
    nl: Mutex<(OwnedFd, u32)>,
}

impl RouteSocket {
    fn new(fd: OwnedFd) -> Self {
        RouteSocket {
            nl: Mutex::new((fd, 0)),
        }
    }
}

impl cordon_egress::LocalAddresses for RouteSocket {
    fn add(&self, ip: std::net::Ipv4Addr) -> Result<(), String> {
        // A poisoned lock only means another add panicked; the socket is still usable (a
        // stale answer is skipped by its sequence number).
        let mut g = self.nl.lock().unwrap_or_else(|p| p.into_inner());
        g.1 = g.1.wrapping_add(1);
        let seq = g.1;
        cordon_sys::net::add_local_address(g.0.as_fd(), ip.into(), 32, seq)
            .map_err(|e| format!("add {ip}/32 to lo: {e}"))
    }
}

fn setup(e: JailError) -> RunError {
    RunError::Setup(e.to_string())
}

/// Run `spec` in `jail` (as a supervisor, see `Jail::run_supervisor`,
/// when `supervisor`); with `egress`, its doors are served on `rt` for the
/// sandbox's whole life and shut down once it is gone. Blocks the calling
/// thread, which must not be one of `rt`'s workers.
pub(crate) fn run_jail(
    jail: &Jail,
    rt: Option<&tokio::runtime::Handle>,
    spec: &JailSpec,
    egress: Option<(EgressPolicy, Option<Interception>)>,
    stdin: Stdin,
    ctx: &Context,
    supervisor: bool,
) -> Result<Outcome, RunError> {
    let (Some(rt), Some((policy, icpt))) = (rt, egress) else {
        return if supervisor {
            jail.run_supervisor(spec, stdin, |_| {})
        } else {
            jail.run(spec, stdin)
        }
        .map_err(setup);
    };
    let plan = cordon_egress::plan(&policy);
    let n_tcp = plan.tcp.len();
    let dctx = DoorContext {
        tool: spec.tool.clone(),
        session: ctx.session.clone(),
    };
    let on = ctx.on_egress.clone();
    let sink = EventSink::new(move |e| on(e));
    let handle: Mutex<Option<Result<DoorHandle, String>>> = Mutex::new(None);
    let policy = Arc::new(policy);
    let n_udp = plan.udp.len();
    let on_doors = |fds: Vec<OwnedFd>| {
        let mut doors = Doors::default();
        for (i, fd) in fds.into_iter().enumerate() {
            if i < n_tcp {
                doors.tcp.push(std::net::TcpListener::from(fd));
            } else if i < n_tcp + n_udp {
                doors.udp.push(std::net::UdpSocket::from(fd));
            } else {
                doors.local = Some(Arc::new(RouteSocket::new(fd)));
            }
        }
        let served = rt
            .block_on(cordon_egress::serve_with(policy, dctx, doors, sink, icpt))
            .map_err(|e| e.to_string());
        if let Ok(mut h) = handle.lock() {
            *h = Some(served);
        }
    };
    let out = if supervisor {
        jail.run_supervisor(spec, stdin, on_doors)
    } else {
        jail.run_with_doors(spec, stdin, on_doors)
    };
    let served = handle.lock().ok().and_then(|mut h| h.take());
    match served {
        Some(Ok(h)) => rt.block_on(h.shutdown()),
        Some(Err(e)) => {
            return Err(RunError::Setup(format!("{}: egress doors: {e}", spec.tool)));
        }
        None => {}
    }
    out.map_err(setup)
}

/// What [`spawn_jail`] runs.
pub(crate) struct Thread {
    /// The jail.
    pub jail: Arc<Jail>,
    /// The egress runtime, when there are doors.
    pub net: Option<tokio::runtime::Handle>,
    /// The sandbox (its output cap made the message cap).
    pub spec: JailSpec,
    /// Its doors and what they substitute.
    pub egress: Option<(EgressPolicy, Option<Interception>)>,
    /// As a supervisor ([`Jail::run_supervisor`]).
    pub supervisor: bool,
    /// The thread's name: this, a dash and the tool's.
    pub name: &'static str,
    /// Applied to the outcome once the sandbox has ended.
    pub on_end: Option<OnEnd>,
}

/// Start a long-lived sandbox on a thread of its own, with one byte stream
/// for its stdin and stdout (the jail blocks its thread for the sandbox's
/// life; the doors are served on the egress runtime's own workers).
/// `keep` is dropped once it has ended.
pub(crate) fn spawn_jail<K: Send + 'static>(
    t: Thread,
    ctx: &Context,
    keep: K,
) -> Result<Spawned, RunError> {
    let Thread {
        jail,
        net,
        mut spec,
        egress,
        supervisor,
        name,
        on_end,
    } = t;
    spec.limits.output_bytes = crate::spec::message_cap(spec.limits.output_bytes);
    let tool = spec.tool.clone();
    let io = |what: &str, e: std::io::Error| RunError::Setup(format!("{tool}: {what}: {e}"));
    let (ours, theirs) = UnixStream::pair().map_err(|e| io("socket pair", e))?;
    let (stop_r, stop_w) = std::io::pipe().map_err(|e| io("stop pipe", e))?;
    let stream = cordon_jail::Stream {
        socket: OwnedFd::from(theirs),
        stop: OwnedFd::from(stop_r),
    };
    let handle = Arc::new(ThreadHandle::new(tool.clone(), OwnedFd::from(stop_w)));
    let h = handle.clone();
    let ctx = ctx.clone();
    std::thread::Builder::new()
        .name(format!("{name}-{tool}"))
        .spawn(move || {
            let mut r = run_jail(
                &jail,
                net.as_ref(),
                &spec,
                egress,
                Stdin::Stream(stream),
                &ctx,
                supervisor,
            );
            if let (Ok(o), Some(f)) = (r.as_mut(), on_end) {
                (f.0)(o);
            }
            drop(keep);
            // Before the end is told: whoever waits for it may then drop
            // the last reference to the jail (its temporary root directory
            // goes with it) and exit.
            drop(jail);
            drop(net);
            h.finish(r);
        })
        .map_err(|e| io("start the sandbox thread", e))?;
    Ok(Spawned {
        stream: ours,
        handle,
    })
}

/// A sandbox run on a thread of its own: a stop pipe to kill it, and its
/// outcome once it has ended.
#[derive(Debug)]
pub(crate) struct ThreadHandle {
    tool: String,
    /// Dropping it stops the sandbox.
    stop: Mutex<Option<OwnedFd>>,
    done: Mutex<Option<Result<Outcome, RunError>>>,
    ended: Condvar,
}

impl ThreadHandle {
    /// The handle of `tool`'s sandbox, stopped when `stop` is dropped.
    fn new(tool: String, stop: OwnedFd) -> ThreadHandle {
        ThreadHandle {
            tool,
            stop: Mutex::new(Some(stop)),
            done: Mutex::new(None),
            ended: Condvar::new(),
        }
    }

    fn finish(&self, r: Result<Outcome, RunError>) {
        let mut d = self.done.lock().unwrap_or_else(|p| p.into_inner());
        *d = Some(r);
        self.ended.notify_all();
    }
}

impl SandboxHandle for ThreadHandle {
    fn kill(&self) {
        let mut s = self.stop.lock().unwrap_or_else(|p| p.into_inner());
        if s.take().is_some() {
            tracing::debug!(tool = %self.tool, "stopping the sandbox");
        }
    }

    fn outcome(&self) -> Option<Result<Outcome, RunError>> {
        self.done.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn wait(&self) -> Result<Outcome, RunError> {
        let mut d = self.done.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if let Some(r) = d.as_ref() {
                return r.clone();
            }
            d = self.ended.wait(d).unwrap_or_else(|p| p.into_inner());
        }
    }
}

/// Runs a [`Child`]'s command line as the jail's supervisor.
pub(crate) struct Supervisor {
    jail: Arc<Jail>,
    net: EgressRuntime,
}

/// One sandbox ready to start: the supervisor's jail spec, its doors, and
/// what is removed once it is gone.
struct Prepared {
    spec: JailSpec,
    egress: Option<(EgressPolicy, Option<Interception>)>,
    leftovers: Leftovers,
    on_end: Option<OnEnd>,
}

impl Supervisor {
    /// A supervisor over `jail`.
    pub(crate) fn new(jail: Arc<Jail>) -> Supervisor {
        Supervisor {
            jail,
            net: EgressRuntime::default(),
        }
    }

    /// The jail underneath.
    pub(crate) fn jail(&self) -> &Arc<Jail> {
        &self.jail
    }

    /// The cgroup mechanism for a sandbox of `spec` whose whole (`what`:
    /// the child and its guest) is in one cgroup slot; without cgroups it
    /// would have no `lost` limit (`memory, task or CPU`).
    pub(crate) fn cgroup(&self, spec: &SandboxSpec, what: &str, lost: &str) -> MechanismState {
        match self.jail.cgroup_fallback_reason() {
            Some(why) => MechanismState::missing(
                Mechanism::Cgroup,
                format!("{why}: {what} would have no {lost} limit"),
            ),
            None => {
                let absent = absent_controllers(&self.jail, spec);
                if absent.is_empty() {
                    MechanismState::enforced(Mechanism::Cgroup)
                } else {
                    MechanismState::partial(
                        Mechanism::Cgroup,
                        format!("no {} controller here", absent.join(", ")),
                    )
                }
            }
        }
    }

    /// The guest, the child's command line and the supervisor's spec for
    /// `spec`.
    fn prepare(
        &self,
        child: &dyn Child,
        spec: &SandboxSpec,
        ctx: &Context,
    ) -> Result<Prepared, RunError> {
        let problems = child.problems();
        if !problems.is_empty() {
            return Err(RunError::Refused(format!(
                "{}: would not start on this host: {}",
                spec.tool,
                problems.join("; ")
            )));
        }
        let state = child.state_dir().map_err(|_| {
            RunError::Refused(format!(
                "{}: runtime {} cannot start here",
                spec.tool,
                child.name()
            ))
        })?;
        let mut env = spec.env.clone();
        let (network, egress) = network(&spec.network, &mut env, false);
        let mut secret = Vec::new();
        let delivery = credentials(
            &spec.tool,
            &mut env,
            &mut secret,
            egress.as_ref(),
            ctx,
            trust_bundle_path(&spec.root),
        )?;
        // A guest's environment is handed to its runtime as plain strings
        // (gVisor's OCI bundle, the microVM's guest init): not zeroised.
        env.extend(secret.iter().map(|(k, v)| (k.clone(), v.to_string())));
        let guest = Guest {
            env,
            doors: egress.is_some(),
            trust_bundle: delivery.trust_bundle,
        };
        let dir = WorkDir::new(state, child.leftover()).map_err(|(what, e)| {
            RunError::Setup(format!("{}: {}: {what}: {e}", spec.tool, child.leftover()))
        })?;
        let launch = child.launch(spec, &guest, &dir)?;
        let mut limits = launch.limits.unwrap_or_else(|| ctx.placement.limits(spec));
        limits.wall = ctx.placement.limits(spec).wall.saturating_add(launch.boot);
        let js = JailSpec {
            tool: spec.tool.clone(),
            argv: launch.argv,
            env: vec![("PATH".into(), "/usr/sbin:/usr/bin:/sbin:/bin".into())],
            secret_env: Vec::new(),
            binds: Vec::new(),
            volumes: Vec::new(),
            limits,
            network,
            seccomp: crate::spec::Seccomp::DenyList,
            landlock: false,
            trust_bundle: None,
            root: Root::HostBinds,
            cwd: None,
            user: None,
            host_ids: None,
        };
        Ok(Prepared {
            spec: js,
            egress: egress.map(|e| (e, delivery.interception)),
            leftovers: Leftovers {
                _dir: dir,
                paths: launch.cleanup,
            },
            on_end: launch.on_end,
        })
    }

    /// One call of `spec` run by `child`.
    pub(crate) fn run(
        &self,
        child: &dyn Child,
        spec: &SandboxSpec,
        input: Vec<u8>,
        ctx: &Context,
    ) -> Result<Outcome, RunError> {
        let p = self.prepare(child, spec, ctx)?;
        let net = self.net.for_doors(p.egress.as_ref())?;
        let mut r = run_jail(
            &self.jail,
            net.as_ref(),
            &p.spec,
            p.egress,
            Stdin::Bytes(input),
            ctx,
            true,
        );
        if let Ok(o) = r.as_mut() {
            child.finish(&p.leftovers._dir, o);
            if let Some(f) = p.on_end {
                (f.0)(o);
            }
        }
        drop(p.leftovers);
        r
    }

    /// A long-lived sandbox of `spec` run by `child`.
    pub(crate) fn spawn(
        &self,
        child: &dyn Child,
        spec: &SandboxSpec,
        ctx: &Context,
    ) -> Result<Spawned, RunError> {
        let p = self.prepare(child, spec, ctx)?;
        let net = self.net.for_doors(p.egress.as_ref())?;
        spawn_jail(
            Thread {
                jail: self.jail.clone(),
                net,
                spec: p.spec,
                egress: p.egress,
                supervisor: true,
                name: child.name(),
                on_end: p.on_end,
            },
            ctx,
            p.leftovers,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sweep_removes_only_what_no_live_broker_holds() {
        let d = tempfile::tempdir().unwrap();
        let state = d.path();
        // Positive control: a live sandbox's directory is left.
        let live = WorkDir::new(state, "test bundle").unwrap();
        assert!(live.path().join("lock").is_file());
        assert!(
            live.id()
                .starts_with(&format!("cordon-{}-", std::process::id()))
        );
        // A dead broker's: its lock file is held by nobody.
        let dead = state.join("cordon-1-0");
        fs::create_dir(&dead).unwrap();
        fs::write(dead.join("lock"), "").unwrap();
        // One being made this instant: no lock file yet.
        let young = state.join("cordon-2-0");
        fs::create_dir(&young).unwrap();
        let notes = sweep(state, "test bundle");
        assert_eq!(
            notes,
            [format!(
                "removed a test bundle left by a broker that is gone: {}",
                dead.display()
            )]
        );
        assert!(live.path().is_dir() && young.is_dir() && !dead.exists());
        let p = live.path().to_path_buf();
        drop(live);
        assert!(!p.exists(), "the directory outlived its sandbox");
    }
}
