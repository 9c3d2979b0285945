//! cordon-jail: the native P1 sandbox. One tool call runs in a fresh set of
//! Linux namespaces (user, mount, pid, network, ipc, uts, cgroup) on a
//! read-only root assembled on an empty tmpfs, as a non-root uid without
//! capabilities, under no_new_privs, Landlock and a seccomp filter, with
//! memory, task and cpu limits from cgroups (v2 or v1) and rlimits.
//!
//! Nothing is exec'd but the tool: no bubblewrap, no helper. Raw system
//! calls are in `cordon-sys`; this crate is `forbid(unsafe_code)`.
//!
//! One call, in order (broker side in `run.rs`, child side in
//! `cordon_sys::spawn`):
//!
//! 1. the broker builds the whole child program before cloning: mount
//!    steps (layout in step 5), exec candidates, rlimits,
//!    the Landlock ruleset, the (cached) seccomp BPF;
//! 2. a pooled cgroup slot gets the limits (only changed values are
//!    written), its peak counter reset, its event counters recorded;
//! 3. `clone3(CLONE_NEWUSER|NEWNS|NEWPID|NEWNET|NEWIPC|NEWUTS|CLONE_PIDFD)`
//!    (with `CLONE_VM` on its own stack on x86_64, like `posix_spawn`); the
//!    child resets signal dispositions, keeps only its stdio and control
//!    descriptors, and waits;
//! 4. the broker writes `uid_map`/`gid_map` (inside 1000, or the spec's
//!    `user`, → the broker's uid, or 65534 when the broker is root: the
//!    tool never runs as host root),
//!    moves the child into the v1 cgroups (v2: `CLONE_INTO_CGROUP`), and
//!    releases it;
//! 5. the child: `unshare(CLONE_NEWCGROUP)`, setgroups/setresgid/setresuid,
//!    `PR_SET_PDEATHSIG(SIGKILL)`, private mounts, tmpfs root with, for the
//!    host root ([`Root::HostBinds`]), read-only binds of /usr (and /bin,
//!    /lib... as the host has them: symlinks when /usr is merged) and a
//!    written /etc (passwd, group, nsswitch.conf, hosts; plus read-only
//!    ld.so.cache and alternatives), or, for an image root
//!    ([`Root::Image`]), the image's top-level entries bound read-only
//!    and its own /etc (see `plan.rs`); then /dev (null, zero, full,
//!    random, urandom), a fresh /proc with the OCI masks, tmpfs /tmp of
//!    `disk_bytes`, the spec's read-only binds, `pivot_root`, old root
//!    detached, / remounted read-only, cwd /tmp (or the spec's `cwd`);
//!    then doors, rlimits (NOFILE, FSIZE, CORE=0; DATA, an AS backstop and
//!    NPROC without cgroups), `setsid`, no_new_privs, Landlock, all capabilities dropped,
//!    seccomp last, execve. A failure is reported as (step, errno) on a
//!    close-on-exec pipe and becomes [`JailError::Setup`];
//! 6. the broker feeds stdin, reads stdout up to the cap and stderr, and
//!    kills the pid-namespace init at the wall limit or the output cap
//!    (which kills every process of the sandbox);
//! 7. status from the exit and the cgroup counters (`oom_kill`, pids
//!    `max` events), the slot waits until empty and goes back to the pool.
//!
//! [`preflight::preflight`] tells, without starting anything, why a spec
//! would not start on this host (a missing program or bind source, an
//! interpreter or loader the sandbox does not see...).
//!
//! The tool is pid 1 of its pid namespace (as with `unshare --fork` or
//! `bwrap --as-pid-1`): when it exits, the kernel kills everything else
//! in the sandbox, so a double-forked daemon cannot outlive the call. Like
//! any pid 1, it ignores signals it has no handler for when they come from
//! inside its namespace (`kill $$`, and SIGPIPE, so a write to a closed pipe
//! returns EPIPE instead of killing it); signals from the kernel (faults,
//! OOM) and from the broker still end it.
//!
//! ```no_run
//! use cordon_jail::{Jail, JailSpec, Stdin};
//! let jail = Jail::new()?;
//! let spec = JailSpec::new("upper", ["/usr/bin/tr", "a-z", "A-Z"]);
//! let out = jail.run(&spec, Stdin::Bytes(b"hello".to_vec()))?;
//! assert_eq!(out.stdout, b"HELLO");
//! # Ok::<(), cordon_jail::JailError>(())
//! ```
#![forbid(unsafe_code)]

pub mod cgroup;
pub mod delegate;
pub mod elf;
pub mod fallback;
pub mod host;
pub mod libs;
mod netns;
mod plan;
pub mod preflight;
mod pump;
mod rootdir;
mod run;
pub mod seccomp;

use std::net::{IpAddr, SocketAddr};
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

pub use cordon_sandbox::{Bind, LandlockStatus, Limits, Outcome, Root, Seccomp, Status};
pub use cordon_sys::Errno;
pub use host::HostFacts;

/// One tool call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JailSpec {
    /// Name for messages, e.g. "pdf_to_text".
    pub tool: String,
    /// `argv[0]`: an absolute path inside the sandbox, or a name looked up
    /// in the `PATH` of `env` (default `/usr/local/bin:/usr/bin:/bin`).
    pub argv: Vec<String>,
    /// The environment, but for [`JailSpec::secret_env`].
    pub env: Vec<(String, String)>,
    /// Variables holding a secret (a `deliver: env` token, a placeholder),
    /// over any of the same name in `env`. Zeroised when the spec (and
    /// the child's envp built from it) is dropped; never printed (`Debug`
    /// shows the names and `Zeroizing { .. }`) nor serialized.
    #[serde(skip)]
    pub secret_env: Vec<(String, zeroize::Zeroizing<String>)>,
    /// Extra read-only binds beyond the system ones.
    pub binds: Vec<Bind>,
    /// Read-write binds (nosuid, nodev) of directories the broker made for
    /// the sandbox (a session workspace, a tool's state), never a host
    /// path of the manifest's; writable under Landlock too.
    pub volumes: Vec<Bind>,
    /// Resource limits.
    pub limits: Limits,
    /// Network.
    pub network: NetMode,
    /// System-call filter.
    pub seccomp: Seccomp,
    /// Landlock as a second layer when the kernel has it (default true).
    pub landlock: bool,
    /// What the sandbox's `/` is made of (default: the host's system
    /// directories).
    pub root: Root,
    /// The working directory, an absolute path inside the sandbox, entered
    /// after `pivot_root` (default `None`: `/tmp`).
    pub cwd: Option<PathBuf>,
    /// uid and gid inside the sandbox's user namespace (default `None`:
    /// [`JailOptions::inner_uid`] and [`JailOptions::inner_gid`], 1000).
    /// Whatever they are, they map to the same unprivileged host uid and
    /// gid, and the tool has no capabilities: uid 0 is allowed, and is root
    /// only of the sandbox's own user namespace, without any capability
    /// in it after the drop before exec.
    pub user: Option<(u32, u32)>,
    /// A PEM bundle of trusted CA certificates made the sandbox's system
    /// trust bundle (default `None`: the root's own). Host root: written at
    /// [`TRUST_BUNDLE`], with `/etc/ssl/cert.pem` and
    /// `/etc/pki/tls/certs/ca-bundle.crt` linked to it. Image root: written
    /// at [`TRUST_BUNDLE_IMAGE`] and bound over each of those three paths
    /// that the image has as a regular file (reached without a symlink).
    /// [`JailSpec::trust_bundle_path`] says which file to name in variables
    /// such as `SSL_CERT_FILE`.
    pub trust_bundle: Option<Vec<u8>>,
    /// The host uid and gid the sandbox maps to when the broker is root,
    /// instead of [`JailOptions::host_uid_when_root`] and
    /// [`JailOptions::host_gid_when_root`] (default `None`): a tenant's own
    /// identity from a subordinate range. Ignored for an unprivileged
    /// broker, which can map only its own uid, and for a supervisor.
    pub host_ids: Option<(u32, u32)>,
}

/// Where a host root's trust bundle is written.
pub const TRUST_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
/// Where an image root's trust bundle is written (the image's `/etc` is
/// never written; the bundle is bound over its own).
pub const TRUST_BUNDLE_IMAGE: &str = "/dev/cordon-ca-bundle.crt";
/// The usual trust-bundle paths of a root, in the order OpenSSL-based
/// distributions look.
pub const TRUST_BUNDLE_PATHS: [&str; 3] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/cert.pem",
];

impl JailSpec {
    /// A spec with default limits, no network, the deny-list seccomp
    /// filter, Landlock, the host root, working directory `/tmp`, the
    /// jail's inner uid and gid, and the environment
    /// `PATH=/usr/local/bin:/usr/bin:/bin HOME=/tmp LANG=C.UTF-8`.
    pub fn new<I, S>(tool: &str, argv: I) -> JailSpec
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        JailSpec {
            tool: tool.to_string(),
            argv: argv.into_iter().map(Into::into).collect(),
            env: vec![
                ("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into()),
                ("HOME".into(), "/tmp".into()),
                ("LANG".into(), "C.UTF-8".into()),
            ],
            secret_env: Vec::new(),
            binds: Vec::new(),
            volumes: Vec::new(),
            limits: Limits::default(),
            network: NetMode::None,
            seccomp: Seccomp::DenyList,
            landlock: true,
            root: Root::HostBinds,
            cwd: None,
            user: None,
            trust_bundle: None,
            host_ids: None,
        }
    }

    /// The file inside the sandbox holding [`JailSpec::trust_bundle`], when
    /// there is one.
    pub fn trust_bundle_path(&self) -> Option<&'static str> {
        self.trust_bundle.as_ref()?;
        Some(match self.root {
            Root::HostBinds => TRUST_BUNDLE,
            Root::Image { .. } => TRUST_BUNDLE_IMAGE,
        })
    }
}

/// Network of the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum NetMode {
    /// An empty network namespace (lo down): no route anywhere.
    #[default]
    None,
    /// Listening sockets inside the sandbox's namespace handed to the
    /// broker (see [`DoorRequest`]).
    Doors(DoorRequest),
}

/// Doors: local addresses on `lo` and sockets bound to them, created
/// inside the sandbox's network namespace and handed to the broker before
/// the tool starts. The tool connects to those addresses; the broker
/// accepts on the door sockets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DoorRequest {
    /// Addresses (with prefix length) assigned to `lo`, e.g. 198.18.0.0/15:
    /// on `lo` the whole IPv4 prefix is local.
    pub local_cidrs: Vec<(IpAddr, u8)>,
    /// Listening TCP sockets.
    pub tcp: Vec<SocketAddr>,
    /// Bound UDP sockets.
    pub udp: Vec<SocketAddr>,
    /// Also hand over an rtnetlink (`NETLINK_ROUTE`) socket of the
    /// namespace, after the door sockets, with which the broker adds
    /// addresses to `lo` while the sandbox runs (the egress DNS door makes
    /// each address it answers local, so only those lead to a door).
    #[serde(default)]
    pub local_addresses: bool,
}

/// The tool's stdin.
#[derive(Debug)]
pub enum Stdin {
    /// These bytes, then end of file.
    Bytes(Vec<u8>),
    /// A descriptor (file, pipe, socket) the tool reads directly.
    Fd(OwnedFd),
    /// /dev/null.
    Null,
    /// A long-lived sandbox's stdio, relayed by the broker (see [`Stream`]).
    Stream(Stream),
}

/// The stdio of a long-lived sandbox (an MCP server): the broker relays
/// what arrives on `socket` to the sandbox's stdin pipe, and what the
/// sandbox writes to its stdout pipe back to `socket`, counting each line
/// (one JSON-RPC message) against `output_bytes`: a longer one kills the
/// sandbox ([`Status::OutputCap`]). End of file on `socket` closes the
/// sandbox's stdin; when `stop` becomes readable or its write end is
/// closed, the sandbox is killed ([`Status::Killed`]). Nothing runs in the
/// sandbox for this: no shell, no helper.
#[derive(Debug)]
pub struct Stream {
    /// The broker's end of the caller's byte stream.
    pub socket: OwnedFd,
    /// The read end of a pipe whose write end the caller holds.
    pub stop: OwnedFd,
}

/// Setup failures.
#[derive(Debug, thiserror::Error)]
pub enum JailError {
    /// A step inside the sandbox failed before the tool ran.
    #[error("{tool}: sandbox setup failed: {step}: {errno:?}")]
    Setup {
        /// Tool name.
        tool: String,
        /// Which step, e.g. `mount /usr read-only`.
        step: String,
        /// errno from the kernel.
        errno: Errno,
    },
    /// A step in the broker failed.
    #[error("{tool}: {step}: {source}")]
    Broker {
        /// Tool name.
        tool: String,
        /// Which step, e.g. `write uid_map`.
        step: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// The host cannot run sandboxes.
    #[error("host not usable: {0}")]
    Host(String),
    /// The spec is invalid.
    #[error("invalid spec: {0}")]
    Spec(String),
    /// A seccomp filter did not compile.
    #[error("seccomp filter: {0}")]
    Seccomp(String),
}

impl JailError {
    fn broker(tool: &str, step: impl Into<String>, source: std::io::Error) -> JailError {
        JailError::Broker {
            tool: tool.to_string(),
            step: step.into(),
            source,
        }
    }
}

/// Options of a [`Jail`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JailOptions {
    /// uid the tool has inside its user namespace unless its spec names
    /// one ([`JailSpec::user`]) (default 1000).
    pub inner_uid: u32,
    /// gid inside, likewise (default 1000).
    pub inner_gid: u32,
    /// Host uid the tool maps to when the broker is root (default 65534).
    /// An unprivileged broker can only map its own uid.
    pub host_uid_when_root: u32,
    /// Host gid when the broker is root (default 65534).
    pub host_gid_when_root: u32,
    /// Use cgroups when the host allows it (default true).
    pub cgroups: bool,
    /// Give each sandbox without network an exclusive, empty network
    /// namespace from a pool instead of a new one (root broker only;
    /// default true). See `netns.rs` for why this is as strong.
    pub pool_network_namespaces: bool,
    /// Take cgroup slots from a set shared by every broker of this uid on
    /// the host, kept between processes, instead of making this jail's own
    /// and removing them on drop (default false; for short-lived brokers
    /// such as a one-shot `cordon exec`; see `cgroup::Pool::new`).
    pub share_cgroup_slots: bool,
    /// Start each sandbox in its v2 cgroup (`CLONE_INTO_CGROUP`) where the
    /// host allows it (default true). False has it move itself in through
    /// `cgroup.procs`, as on a host where such births are killed (see
    /// `cgroup::Pool::new`); for tests of that path.
    pub born_in_cgroup: bool,
    /// On a pure cgroup v2 host, ask the reachable systemd manager for a
    /// delegated scope for this process and put the slots under it (default
    /// true; see [`delegate`]).
    pub systemd_delegation: bool,
}

impl Default for JailOptions {
    fn default() -> JailOptions {
        JailOptions {
            inner_uid: cordon_sandbox::layout::DEFAULT_USER.0,
            inner_gid: cordon_sandbox::layout::DEFAULT_USER.1,
            host_uid_when_root: 65534,
            host_gid_when_root: 65534,
            cgroups: true,
            pool_network_namespaces: true,
            share_cgroup_slots: false,
            born_in_cgroup: true,
            systemd_delegation: true,
        }
    }
}

/// The network namespace pool [`start_early`] began, for the next jail.
static EARLY: Mutex<Option<netns::NetPool>> = Mutex::new(None);

/// For a process about to make one jail (a one-shot `cordon exec` or
/// `cordon run`): start making the first network namespace now, about a
/// millisecond of kernel work on another CPU, so that it overlaps the
/// caller's own start-up (argument parsing, the manifest) as well as the
/// jail's. The next [`Jail::with_options`] that pools namespaces takes it;
/// nothing happens for an unprivileged caller, which cannot pool them.
pub fn start_early() {
    if cordon_sys::io::geteuid() != 0 {
        return;
    }
    let mut early = EARLY.lock().unwrap_or_else(|p| p.into_inner());
    if early.is_none() {
        *early = Some(netns::NetPool::start());
    }
}

fn take_early() -> Option<netns::NetPool> {
    EARLY.lock().unwrap_or_else(|p| p.into_inner()).take()
}

/// The long-lived sandbox runner: host facts, the root mount point, the
/// cgroup pool, cached seccomp programs. `run` is thread-safe.
#[derive(Debug)]
pub struct Jail {
    facts: HostFacts,
    opts: JailOptions,
    root_dir: rootdir::RootDir,
    pool: Option<cgroup::Pool>,
    net_pool: Option<netns::NetPool>,
    notes: Vec<String>,
    no_cgroup_warning: Option<String>,
    dev_null: OwnedFd,
    filters: Mutex<Vec<(Seccomp, bool, Arc<seccomp::Filters>)>>,
}

impl Jail {
    /// Detect the host and prepare what can be prepared once.
    pub fn new() -> Result<Jail, JailError> {
        Jail::with_options(JailOptions::default())
    }

    /// [`Jail::new`] with options.
    pub fn with_options(opts: JailOptions) -> Result<Jail, JailError> {
        // The first pooled network namespace is made while the rest of the
        // jail, host detection included, is prepared (or was started
        // earlier still, by `start_early`).
        let net_pool = if cordon_sys::io::geteuid() == 0 && opts.pool_network_namespaces {
            Some(take_early().unwrap_or_else(netns::NetPool::start))
        } else {
            None
        };
        let mut facts = host::detect();
        // Delegation moves this process into a new cgroup: the facts are
        // read again after it, with the slots under the delegated scope.
        let delegation = if opts.cgroups && opts.systemd_delegation {
            let d = delegate::ensure(&facts);
            if d.scope().is_some() {
                facts = host::detect();
            }
            Some(d)
        } else {
            None
        };
        if !facts.user_namespaces {
            return Err(JailError::Host(
                "user namespaces are disabled (user.max_user_namespaces = 0)".into(),
            ));
        }
        // The new root is a tmpfs mounted (inside the sandbox's own mount
        // namespace) on this directory; it must be traversable by the
        // sandbox's uid.
        let root_dir = rootdir::RootDir::new(facts.euid)
            .map_err(|e| JailError::Host(format!("create root mount point: {e}")))?;
        let mut notes = facts.notes.clone();
        if let Some(d) = delegation {
            notes.push(format!("systemd delegation: {d}"));
        }
        let mut pool = None;
        let mut no_cgroup_warning = None;
        let layout = facts.cgroup_layout.clone();
        if !opts.cgroups {
            no_cgroup_warning = Some("cgroups disabled by configuration".to_string());
        } else if layout.memory.is_none() && layout.pids.is_none() {
            no_cgroup_warning =
                Some("no memory or pids cgroup controller on this host".to_string());
        } else {
            let shared = if opts.share_cgroup_slots {
                root_dir.slots_dir(facts.euid)
            } else {
                None
            };
            match cgroup::Pool::new(layout, shared, opts.born_in_cgroup) {
                Ok((p, n)) => {
                    notes.extend(n);
                    // The controllers the pool could use.
                    facts.cgroup_layout = p.layout().clone();
                    pool = Some(p);
                }
                Err(e) => no_cgroup_warning = Some(format!("cannot create cgroups ({e})")),
            }
        }
        // Without a pool, say too why no delegated subtree was had.
        if pool.is_none()
            && let (Some(w), Some(d)) = (&mut no_cgroup_warning, delegation)
            && d.scope().is_none()
        {
            *w = format!("{w}; systemd delegation: {d}");
        }
        let dev_null = std::fs::File::open("/dev/null")
            .map_err(|e| JailError::Host(format!("open /dev/null: {e}")))?
            .into();
        Ok(Jail {
            facts,
            opts,
            root_dir,
            pool,
            net_pool,
            notes,
            no_cgroup_warning,
            dev_null,
            filters: Mutex::new(Vec::new()),
        })
    }

    /// What was detected.
    pub fn host(&self) -> &HostFacts {
        &self.facts
    }

    /// The host uid and gid a tool's sandbox runs as: `host_uid_when_root`
    /// and `host_gid_when_root` for a root broker, the broker's own ids
    /// otherwise.
    pub fn sandbox_host_ids(&self) -> (u32, u32) {
        if self.facts.root {
            (self.opts.host_uid_when_root, self.opts.host_gid_when_root)
        } else {
            (self.facts.euid, self.facts.egid)
        }
    }

    /// Notes from setup (stale cgroups removed, controllers not enabled,
    /// no network namespaces...).
    pub fn notes(&self) -> Vec<String> {
        let mut notes = self.notes.clone();
        if let Some(Err(e)) = self.net_pool.as_ref().map(netns::NetPool::status) {
            notes.push(e);
        }
        notes
    }

    /// Whether limits go through cgroups (false: rlimit fallback).
    pub fn uses_cgroups(&self) -> bool {
        self.pool.is_some()
    }

    /// Why limits do not go through cgroups, when they do not.
    pub fn cgroup_fallback_reason(&self) -> Option<&str> {
        match &self.pool {
            Some(_) => None,
            None => Some(
                self.no_cgroup_warning
                    .as_deref()
                    .unwrap_or("no cgroup pool could be made"),
            ),
        }
    }

    /// Whether sandboxes without network get a pooled (exclusive, empty,
    /// not owned by the sandbox) network namespace rather than a new one.
    pub fn pools_network_namespaces(&self) -> bool {
        self.net_pool.as_ref().is_some_and(|p| p.status().is_ok())
    }

    /// Run one call; blocks until the sandbox is gone.
    pub fn run(&self, spec: &JailSpec, stdin: Stdin) -> Result<Outcome, JailError> {
        self.run_with_doors(spec, stdin, |_fds| {})
    }

    /// Run one call with network doors: the door sockets (TCP in request
    /// order, then UDP, then the rtnetlink socket when
    /// [`DoorRequest::local_addresses`] asks for it) are handed to
    /// `on_doors` before the tool starts.
    pub fn run_with_doors<F>(
        &self,
        spec: &JailSpec,
        stdin: Stdin,
        on_doors: F,
    ) -> Result<Outcome, JailError>
    where
        F: FnOnce(Vec<OwnedFd>) + Send,
    {
        run::run(self, spec, stdin, on_doors)
    }

    /// Run a supervisor: a host program that builds a sandbox of its own
    /// for the tool (gVisor's `runsc`), held by the jail as a tool is. Its
    /// `argv[0]` is an absolute host path; it runs in new pid, mount (with
    /// its own `/proc`) and network namespaces (an empty one, or one with
    /// the spec's doors exactly as a tool's), inside a new user namespace
    /// (uid 0 inside, the broker's uid outside) only when the broker is
    /// unprivileged; in a cgroup slot with the spec's limits, under its wall
    /// clock and output caps, and with the parent-death signal, so that a
    /// broker that dies takes it and everything it started with it. Unlike
    /// a tool it keeps its capabilities within those namespaces (it needs
    /// them to build its sandbox) and has no seccomp filter, Landlock or
    /// rlimits of the jail's (the root and binds of the spec are
    /// not used): what it runs is confined by the supervisor. The door
    /// sockets are handed to `on_doors` as by [`Jail::run_with_doors`].
    pub fn run_supervisor<F>(
        &self,
        spec: &JailSpec,
        stdin: Stdin,
        on_doors: F,
    ) -> Result<Outcome, JailError>
    where
        F: FnOnce(Vec<OwnedFd>) + Send,
    {
        run::run_as(self, spec, stdin, on_doors, true)
    }

    /// The seccomp filters of `mode` (`inet`: sockets of the internet
    /// family allowed), compiled once per jail and kept: a microVM's guest
    /// installs the same ones, sent with each task.
    pub fn filters_for(
        &self,
        mode: &Seccomp,
        inet: bool,
    ) -> Result<Arc<seccomp::Filters>, JailError> {
        if let Ok(cache) = self.filters.lock()
            && let Some((_, _, f)) = cache.iter().find(|(m, i, _)| m == mode && *i == inet)
        {
            return Ok(f.clone());
        }
        let f = Arc::new(seccomp::filters(mode, inet)?);
        if let Ok(mut cache) = self.filters.lock() {
            if cache.len() > 64 {
                cache.clear();
            }
            cache.push((mode.clone(), inet, f.clone()));
        }
        Ok(f)
    }
}

/// The Landlock ABI whose rights the jail handles: a kernel with an older
/// one enforces only part of them.
pub fn landlock_target_abi() -> i32 {
    plan::LANDLOCK_TARGET as i32
}
