//! The native runtime: cordon's own jail (namespaces, a read-only root of
//! host binds or of an unpacked image, seccomp, Landlock, cgroups) with the
//! egress doors served by the broker. See `cordon-jail` for the mechanism
//! itself.

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex, OnceLock};

use cordon_egress::{
    DoorContext, DoorHandle, Doors, EgressPolicy, EventSink, Interception, SessionCa, UpstreamTrust,
};
use cordon_jail::{Bind, DoorRequest, Jail, JailError, JailOptions, JailSpec, NetMode, Stdin};

use crate::mechanism::{Mechanism, MechanismState};
use crate::outcome::{Outcome, RunError};
use crate::spec::{Network, SandboxSpec};
use crate::{Check, Context, Facts, Runtime, SandboxHandle, Spawned};

/// Options of the native runtime.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// The jail's options (cgroup slot sharing for one-shot brokers, ...).
    pub jail: JailOptions,
    /// Check the host (`preflight`: program, interpreter, loader, mount
    /// sources) only when a sandbox fails to set up, to say why, instead of
    /// at every admission: for a one-shot call, whose sandbox setup finds
    /// the same failures (and nothing runs), so the common case does not
    /// pay for the check. The refusal is the same either way.
    pub preflight_on_failure: bool,
}

impl Options {
    /// For a process that makes one call and exits (`cordon run`/`exec`).
    pub fn one_shot() -> Options {
        Options {
            jail: JailOptions {
                share_cgroup_slots: true,
                ..Default::default()
            },
            preflight_on_failure: true,
        }
    }
}

/// The native runtime.
pub struct Native {
    jail: Arc<Jail>,
    preflight_on_failure: bool,
    /// Serves egress doors; started on first use.
    net: OnceLock<tokio::runtime::Runtime>,
}

impl Drop for Native {
    fn drop(&mut self) {
        // Never block: the last owner may be a task on another runtime.
        if let Some(rt) = self.net.take() {
            rt.shutdown_background();
        }
    }
}

impl Native {
    /// Detect the host and prepare the jail.
    pub fn new(opts: Options) -> Result<Native, JailError> {
        let mut n = Native::from_jail(Arc::new(Jail::with_options(opts.jail)?));
        n.preflight_on_failure = opts.preflight_on_failure;
        Ok(n)
    }

    /// Over an existing jail.
    pub fn from_jail(jail: Arc<Jail>) -> Native {
        Native {
            jail,
            preflight_on_failure: false,
            net: OnceLock::new(),
        }
    }

    /// The jail underneath (host facts, notes).
    pub fn jail(&self) -> &Arc<Jail> {
        &self.jail
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

    fn preflight(&self, js: &JailSpec) -> Vec<String> {
        cordon_jail::preflight::preflight_on(js, &self.jail.host().system_dirs)
    }

    /// How each mechanism holds for a sandbox of `spec` here.
    pub fn mechanisms(&self, spec: &SandboxSpec) -> Vec<MechanismState> {
        let f = self.jail.host();
        let mut out = vec![MechanismState::enforced(Mechanism::Namespaces)];
        out.push(if f.mount_setattr {
            MechanismState::enforced(Mechanism::ReadonlyRoot)
        } else {
            MechanismState::partial(
                Mechanism::ReadonlyRoot,
                "no mount_setattr (Linux before 5.12): a read-only bind covers its top mount only, not the mounts below it",
            )
        });
        out.push(if f.close_range {
            MechanismState::enforced(Mechanism::Descriptors)
        } else {
            MechanismState::partial(
                Mechanism::Descriptors,
                "no close_range (Linux before 5.9): descriptors are closed one by one below 4096 only",
            )
        });
        out.push(MechanismState::enforced(Mechanism::Network));
        out.push(if f.seccomp {
            MechanismState::enforced(Mechanism::Seccomp)
        } else {
            MechanismState::missing(Mechanism::Seccomp, "the kernel has no seccomp filter mode")
        });
        let target = cordon_jail::landlock_target_abi();
        out.push(if !spec.landlock {
            MechanismState::missing(Mechanism::Landlock, "turned off for this sandbox")
        } else if f.landlock_abi <= 0 {
            MechanismState::missing(Mechanism::Landlock, "the kernel has no Landlock")
        } else if f.landlock_abi < target {
            MechanismState::partial(
                Mechanism::Landlock,
                format!(
                    "Landlock ABI {} is older than {target}: the newer rights are not enforced",
                    f.landlock_abi
                ),
            )
        } else {
            MechanismState::enforced(Mechanism::Landlock)
        });
        out.push(match self.jail.cgroup_fallback_reason() {
            Some(why) => MechanismState::partial(
                Mechanism::Cgroup,
                format!(
                    "{why}: rlimit fallback in force: memory capped per process by RLIMIT_DATA (RLIMIT_AS only as a backstop of 16x, at least {}), tasks by RLIMIT_NPROC, no CPU quota, no peak memory; a memory-limit failure is reported from the tool's stderr; for real limits run cordon in a delegated cgroup (see `cordon doctor`)",
                    cordon_sandbox::units::format_size(cordon_jail::fallback::AS_BACKSTOP_MIN)
                ),
            ),
            None => {
                let l = &f.cgroup_layout;
                let absent: Vec<&str> = [
                    ("memory", l.memory.is_some()),
                    ("pids", l.pids.is_some()),
                    ("cpu", l.cpu.is_some() || spec.limits.cpu_percent.is_none()),
                ]
                .into_iter()
                .filter(|(_, ok)| !ok)
                .map(|(n, _)| n)
                .collect();
                let delegated = cordon_jail::delegate::current().and_then(|d| d.scope());
                if absent.is_empty() {
                    MechanismState::enforced(Mechanism::Cgroup)
                } else if let (Some(scope), false) = (delegated, f.root) {
                    MechanismState::partial(
                        Mechanism::Cgroup,
                        format!(
                            "no {} controller in the delegated scope {} (the systemd user manager was given none: a drop-in for user@.service with `Delegate=pids memory cpu` gives it them)",
                            absent.join(", "),
                            scope.display()
                        ),
                    )
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

    /// The jail's spec for `spec`, and its egress policy.
    fn jail_spec(spec: &SandboxSpec) -> Result<(JailSpec, Option<EgressPolicy>), String> {
        if let Some(m) = spec.mounts.iter().find(|m| m.writable) {
            return Err(format!(
                "mount {}:{}:rw: the native runtime binds host paths read-only only",
                m.src.display(),
                m.dst.display()
            ));
        }
        if spec.workspace.is_some() || spec.state.is_some() {
            crate::volume::mechanism().map_err(|e| format!("{}: {e}", spec.tool))?;
        }
        let mut env = spec.env.clone();
        let (network, egress) = match &spec.network {
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
                        local_addresses: true,
                    }),
                    Some((**ep).clone()),
                )
            }
        };
        Ok((
            JailSpec {
                tool: spec.tool.clone(),
                argv: spec.argv.clone(),
                env,
                binds: spec
                    .mounts
                    .iter()
                    .map(cordon_sandbox::Mount::bind)
                    .collect(),
                volumes: spec
                    .volumes
                    .iter()
                    .map(|v| Bind {
                        src: v.src.clone(),
                        dst: v.dst.clone(),
                    })
                    .collect(),
                limits: spec.limits,
                network,
                seccomp: spec.seccomp.clone(),
                landlock: spec.landlock,
                root: spec.root.clone(),
                cwd: spec.cwd.as_ref().map(PathBuf::from),
                user: spec.user,
                trust_bundle: None,
                host_ids: spec.host_ids,
            },
            egress,
        ))
    }

    /// Run `spec` with its doors (if any) served for the sandbox's life.
    fn run_jail(
        &self,
        spec: &JailSpec,
        egress: Option<EgressPolicy>,
        icpt: Option<Interception>,
        stdin: Stdin,
        ctx: &Context,
    ) -> Result<Outcome, RunError> {
        let net = match &egress {
            Some(_) => Some(self.net()?.handle().clone()),
            None => None,
        };
        run_jail(
            &self.jail,
            net.as_ref(),
            spec,
            egress.map(|e| (e, icpt)),
            stdin,
            ctx,
            false,
        )
    }
}

fn setup(e: JailError) -> RunError {
    RunError::Setup(e.to_string())
}

impl Runtime for Native {
    fn name(&self) -> &'static str {
        "native"
    }

    fn check(&self, spec: &SandboxSpec) -> Check {
        let mechanisms = self.mechanisms(spec);
        let problems = match Native::jail_spec(spec) {
            Err(e) => vec![e],
            Ok(_) if self.preflight_on_failure => Vec::new(),
            Ok((js, _)) => self.preflight(&js),
        };
        Check {
            mechanisms,
            problems,
        }
    }

    fn run(&self, spec: &SandboxSpec, input: Vec<u8>, ctx: &Context) -> Result<Outcome, RunError> {
        if let Some(why) = spec.unprepared_volumes() {
            return Err(RunError::Refused(why));
        }
        let (mut js, egress) = Native::jail_spec(spec).map_err(RunError::Refused)?;
        let icpt = add_credentials(&mut js, egress.as_ref(), ctx)?;
        match self.run_jail(&js, egress, icpt, Stdin::Bytes(input), ctx) {
            Ok(o) => Ok(o),
            // Nothing ran: say why, as admission would have.
            Err(RunError::Setup(e)) if self.preflight_on_failure => {
                let problems = self.preflight(&js);
                if problems.is_empty() {
                    Err(RunError::Setup(e))
                } else {
                    Err(RunError::Refused(format!(
                        "{}: would not start on this host: {}",
                        spec.tool,
                        problems.join("; ")
                    )))
                }
            }
            Err(e) => Err(e),
        }
    }

    fn spawn(&self, spec: &SandboxSpec, ctx: &Context) -> Result<Spawned, RunError> {
        if let Some(why) = spec.unprepared_volumes() {
            return Err(RunError::Refused(why));
        }
        let (mut js, egress) = Native::jail_spec(spec).map_err(RunError::Refused)?;
        let icpt = add_credentials(&mut js, egress.as_ref(), ctx)?;
        js.limits.output_bytes = crate::spec::message_cap(spec.limits.output_bytes);
        let tool = spec.tool.clone();
        let io = |what: &str, e: std::io::Error| RunError::Setup(format!("{tool}: {what}: {e}"));
        let (ours, theirs) = UnixStream::pair().map_err(|e| io("socket pair", e))?;
        let (stop_r, stop_w) = std::io::pipe().map_err(|e| io("stop pipe", e))?;
        let stream = cordon_jail::Stream {
            socket: OwnedFd::from(theirs),
            stop: OwnedFd::from(stop_r),
        };
        let handle = Arc::new(NativeHandle::new(tool.clone(), OwnedFd::from(stop_w)));
        // The jail blocks its thread for the sandbox's life; the doors are
        // served on this runtime's own workers.
        let jail = self.jail.clone();
        let net = match &egress {
            Some(_) => Some(self.net()?.handle().clone()),
            None => None,
        };
        let h = handle.clone();
        let ctx = ctx.clone();
        std::thread::Builder::new()
            .name(format!("sandbox-{tool}"))
            .spawn(move || {
                let r = run_jail(
                    &jail,
                    net.as_ref(),
                    &js,
                    egress.map(|e| (e, icpt)),
                    Stdin::Stream(stream),
                    &ctx,
                    false,
                );
                h.finish(r);
            })
            .map_err(|e| io("start the sandbox thread", e))?;
        Ok(Spawned {
            stream: ours,
            handle,
        })
    }

    fn jail(&self) -> Option<Arc<Jail>> {
        Some(self.jail.clone())
    }

    fn facts(&self) -> Facts {
        let spec = SandboxSpec::new("doctor", ["/bin/true"]);
        let mut notes = vec![if self.jail.pools_network_namespaces() {
            "network: sandboxes without network get an exclusive, empty namespace from a pool, owned by the broker's user namespace (the tool cannot configure it); sandboxes with egress doors get a new one".to_string()
        } else {
            "network: a new network namespace per sandbox, made inside its own user namespace (this broker cannot make them itself: an unprivileged broker, or root without CAP_SYS_ADMIN)".to_string()
        }];
        notes.extend(self.jail.notes());
        Facts {
            runtime: "native",
            mechanisms: self.mechanisms(&spec),
            notes,
        }
    }
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

/// A sandbox run on a thread of its own: a stop pipe to kill it, and its
/// outcome once it has ended (the native and gVisor runtimes' handle).
#[derive(Debug)]
pub(crate) struct NativeHandle {
    tool: String,
    /// Dropping it stops the sandbox.
    stop: Mutex<Option<OwnedFd>>,
    done: Mutex<Option<Result<Outcome, RunError>>>,
    ended: Condvar,
}

impl NativeHandle {
    /// The handle of `tool`'s sandbox, stopped when `stop` is dropped.
    pub(crate) fn new(tool: String, stop: OwnedFd) -> NativeHandle {
        NativeHandle {
            tool,
            stop: Mutex::new(Some(stop)),
            done: Mutex::new(None),
            ended: Condvar::new(),
        }
    }

    pub(crate) fn finish(&self, r: Result<Outcome, RunError>) {
        let mut d = self.done.lock().unwrap_or_else(|p| p.into_inner());
        *d = Some(r);
        self.ended.notify_all();
    }
}

impl SandboxHandle for NativeHandle {
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

/// Variables that name a trust bundle, for the usual TLS stacks (OpenSSL,
/// Python `requests`, curl, Node, git, cargo, Deno).
pub const TRUST_BUNDLE_ENV: [&str; 7] = [
    "SSL_CERT_FILE",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "NODE_EXTRA_CA_CERTS",
    "GIT_SSL_CAINFO",
    "CARGO_HTTP_CAINFO",
    "DENO_CERT",
];

/// The host's roots, read once per broker.
fn system_trust() -> Result<UpstreamTrust, String> {
    static TRUST: OnceLock<Result<UpstreamTrust, String>> = OnceLock::new();
    TRUST.get_or_init(UpstreamTrust::system).clone()
}

/// The session's credential variables, over any of the same name. With
/// injections and egress doors: a session CA for the doors to intercept
/// with, made the sandbox's trust (the host's roots plus the CA, in the
/// root's trust-bundle paths and the [`TRUST_BUNDLE_ENV`] variables).
fn add_credentials(
    js: &mut JailSpec,
    egress: Option<&EgressPolicy>,
    ctx: &Context,
) -> Result<Option<Interception>, RunError> {
    for (k, v) in &ctx.credentials.env {
        js.env.retain(|(ek, _)| ek != k);
        js.env.push((k.clone(), v.to_string()));
    }
    if ctx.credentials.injections.is_empty() || egress.is_none() {
        return Ok(None);
    }
    let tool = js.tool.clone();
    let fail = |e: String| RunError::Setup(format!("{tool}: credential injection: {e}"));
    let ca = Arc::new(SessionCa::new(&format!("{tool} {}", ctx.session)).map_err(fail)?);
    let trust = system_trust().map_err(fail)?;
    let mut bundle = trust.pem();
    bundle.push_str(ca.cert_pem());
    let icpt = Interception::new(ctx.credentials.injections.clone(), ca, trust).map_err(fail)?;
    js.trust_bundle = Some(bundle.into_bytes());
    if let Some(path) = js.trust_bundle_path() {
        for k in TRUST_BUNDLE_ENV {
            js.env.retain(|(ek, _)| ek != k);
            js.env.push((k.to_string(), path.to_string()));
        }
    }
    Ok(Some(icpt))
}
