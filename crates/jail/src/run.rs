//! The broker side of one call, step by step: build the child's plan,
//! take a cgroup slot, open the pipes, spawn, map the identity, give the
//! go-ahead, hand the doors over, run the I/O ([`crate::pump`]) and say
//! how the call ended.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use cordon_sys::Errno;
use cordon_sys::io as sio;
use cordon_sys::spawn::{ChildFailure, ChildPlan, ChildStep};

use crate::cgroup::{Slot, Stats};
use crate::pump::{self, Ends, Pumped, Relay};
use cordon_sandbox::units::{format_duration, format_size};

use crate::{
    Jail, JailError, JailSpec, LandlockStatus, NetMode, Outcome, Status, Stdin, fallback, plan,
};

const NS_FLAGS: u64 = (libc::CLONE_NEWUSER
    | libc::CLONE_NEWNS
    | libc::CLONE_NEWPID
    | libc::CLONE_NEWNET
    | libc::CLONE_NEWIPC
    | libc::CLONE_NEWUTS) as u64;

/// A supervisor's namespaces (a new user namespace is added when the
/// broker is unprivileged).
const SUPERVISOR_NS_FLAGS: u64 =
    (libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWNET) as u64;

/// Returns a cgroup slot to the pool when the call ends (also on error),
/// or discards it (`discard`, or when it will not empty or was killed).
struct SlotGuard<'a> {
    jail: &'a Jail,
    slot: Option<Slot>,
    discard: bool,
}

impl SlotGuard<'_> {
    fn get(&self) -> Option<&Slot> {
        self.slot.as_ref()
    }
}

impl<'a> SlotGuard<'a> {
    /// A slot of the jail's pool (none without one) with `limits` set and
    /// its counters reset, or the step that failed.
    fn acquire(
        jail: &'a Jail,
        limits: &crate::Limits,
    ) -> Result<SlotGuard<'a>, (&'static str, io::Error)> {
        let mut guard = SlotGuard {
            jail,
            slot: None,
            discard: false,
        };
        if let Some(pool) = &jail.pool {
            let mut slot = pool.acquire().map_err(|e| ("create cgroup", e))?;
            let prep = slot.apply(limits).and_then(|()| slot.begin());
            guard.slot = Some(slot);
            prep.map_err(|e| ("set cgroup limits", e))?;
        }
        Ok(guard)
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        if let (Some(pool), Some(slot)) = (&self.jail.pool, self.slot.take()) {
            if !self.discard && slot.wait_empty(Duration::from_secs(2)) && slot.reusable() {
                pool.release(slot);
            } else {
                pool.discard(slot);
            }
        }
    }
}

fn describe(
    step: ChildStep,
    names: &[String],
    cgroups: &[&str],
    spec: &JailSpec,
    exec: &[std::ffi::CString],
) -> String {
    match step {
        ChildStep::Op(i) => names
            .get(i as usize)
            .cloned()
            .unwrap_or_else(|| format!("setup step {i}")),
        ChildStep::Exec => {
            let arg0 = spec.argv.first().map(String::as_str).unwrap_or("");
            if exec.len() == 1 {
                format!("execve {arg0}")
            } else {
                format!("execve {arg0} (looked up in PATH)")
            }
        }
        ChildStep::Fds => "set up stdio descriptors".into(),
        ChildStep::Sync => "wait for the broker".into(),
        ChildStep::CgroupNs => "unshare cgroup namespace".into(),
        ChildStep::CgroupJoin(i) => match cgroups.get(i as usize) {
            Some(c) => format!("join the {c} cgroup"),
            None => format!("join cgroup #{i}"),
        },
        ChildStep::Groups => "setgroups".into(),
        ChildStep::Gid => "setresgid".into(),
        ChildStep::Uid => "setresuid".into(),
        ChildStep::DeathSignal => "prctl PR_SET_PDEATHSIG".into(),
        ChildStep::Rlimit(r) => format!("setrlimit {}", rlimit_name(r)),
        ChildStep::Setsid => "setsid".into(),
        ChildStep::NoNewPrivs => "prctl PR_SET_NO_NEW_PRIVS".into(),
        ChildStep::LandlockCreate => "landlock_create_ruleset".into(),
        ChildStep::LandlockRule(i) => format!("landlock_add_rule #{i}"),
        ChildStep::LandlockRestrict => "landlock_restrict_self".into(),
        ChildStep::Capabilities => "drop capabilities".into(),
        ChildStep::Seccomp(i) => format!("install seccomp filter #{i}"),
        ChildStep::SignalMask => "unblock signals".into(),
        ChildStep::DoorsLoopback => "bring lo up".into(),
        ChildStep::DoorsAddress(i) => match &spec.network {
            NetMode::Doors(d) => d
                .local_cidrs
                .get(i as usize)
                .map(|(ip, p)| format!("add {ip}/{p} to lo"))
                .unwrap_or_else(|| format!("add address #{i} to lo")),
            NetMode::None => format!("add address #{i} to lo"),
        },
        ChildStep::DoorsSocket(i) => match &spec.network {
            NetMode::Doors(d) => d
                .tcp
                .iter()
                .map(|a| format!("listen on tcp {a}"))
                .chain(d.udp.iter().map(|a| format!("bind udp {a}")))
                .nth(i as usize)
                .unwrap_or_else(|| format!("door socket #{i}")),
            NetMode::None => format!("door socket #{i}"),
        },
        ChildStep::DoorsSend => "send door sockets to the broker".into(),
        ChildStep::Unknown(c) => format!("unknown step {c:#x}"),
    }
}

fn rlimit_name(r: u32) -> &'static str {
    match r {
        x if x == libc::RLIMIT_NOFILE => "RLIMIT_NOFILE",
        x if x == libc::RLIMIT_FSIZE => "RLIMIT_FSIZE",
        x if x == libc::RLIMIT_CORE => "RLIMIT_CORE",
        x if x == libc::RLIMIT_AS => "RLIMIT_AS",
        x if x == libc::RLIMIT_DATA => "RLIMIT_DATA",
        x if x == libc::RLIMIT_NPROC => "RLIMIT_NPROC",
        x if x == libc::RLIMIT_CPU => "RLIMIT_CPU",
        _ => "rlimit",
    }
}

fn errno_io(e: Errno) -> io::Error {
    io::Error::from_raw_os_error(e as i32)
}

pub fn run<F>(jail: &Jail, spec: &JailSpec, stdin: Stdin, on_doors: F) -> Result<Outcome, JailError>
where
    F: FnOnce(Vec<std::os::fd::OwnedFd>) + Send,
{
    run_as(jail, spec, stdin, on_doors, false)
}

/// [`run`] of a tool, or (`supervisor`) of a supervisor (see
/// [`Jail::run_supervisor`]): build what the child needs, take a cgroup
/// slot, open the descriptors, spawn, map its identity, hand its doors
/// over, run its I/O to the end, and say how it ended.
pub fn run_as<F>(
    jail: &Jail,
    spec: &JailSpec,
    stdin: Stdin,
    on_doors: F,
    supervisor: bool,
) -> Result<Outcome, JailError>
where
    F: FnOnce(Vec<std::os::fd::OwnedFd>) + Send,
{
    let start = Instant::now();
    let tool = spec.tool.as_str();
    let broker = |step: &str, e: io::Error| JailError::broker(tool, step, e);
    let limits = &spec.limits;
    if limits.wall.is_zero() {
        return Err(JailError::Spec("wall limit is zero".into()));
    }
    let ids = Ids::of(jail, spec, supervisor);
    let built = Built::new(jail, spec, ids, supervisor)?;
    let mut guard = SlotGuard::acquire(jail, limits).map_err(|(s, e)| broker(s, e))?;
    let slot = guard.get();
    let enforced = Enforced::of(jail, limits, slot, supervisor, built.landlock_status);
    let (ends, child_ends) = open_ends(jail, stdin, limits.output_bytes, built.doors.is_some())
        .map_err(|(s, e)| broker(&s, e))?;
    // A sandbox without network joins an empty namespace from the pool
    // (declared before the child, so it is returned only after the child
    // has been killed and reaped on every path).
    let net_lease = match (&jail.net_pool, &built.doors) {
        (Some(pool), None) if !supervisor => pool
            .acquire()
            .map(|fd| crate::netns::NetLease { pool, fd: Some(fd) }),
        _ => None,
    };
    let join_net = net_lease
        .as_ref()
        .and_then(|l| l.fd.as_ref())
        .map(|f| f.as_raw_fd());
    let namespaces = namespaces(jail.facts.root, supervisor, join_net.is_some());
    let joins = Joins::open(jail, slot).map_err(|(s, e)| broker(&s, e))?;
    let n_doors = built.n_doors();
    let names = built.names.clone();
    let child_plan = child_plan(
        spec,
        built,
        ids,
        &enforced,
        namespaces,
        join_net,
        &joins,
        &child_ends,
        supervisor,
        jail,
    )?;
    let exec_paths = child_plan.exec_paths.clone();
    // The child (which kills and reaps itself on drop) is declared after
    // the slot and the network lease, so it goes first on every return
    // path.
    let mut child = cordon_sys::spawn::spawn(child_plan).map_err(|e| {
        JailError::broker(
            tool,
            "clone3 with new user, mount, pid, net, ipc, uts namespaces",
            errno_io(e),
        )
    })?;
    // The child's ends are its own now.
    drop(child_ends);
    let cgroup_names = joins.names;
    drop(joins.files);
    map_ids(jail, child.pid(), ids, namespaces).map_err(|(s, e)| broker(&s, e))?;
    sio::write(ends.sync_w.as_fd(), b"g")
        .map_err(|e| broker("release the sandbox", errno_io(e)))?;
    // Made and released: the rest is the program running.
    let setup = start.elapsed();

    let setup_failure = |buf: [u8; 8]| {
        let f = ChildFailure::decode(buf);
        JailError::Setup {
            tool: tool.to_string(),
            step: describe(f.step, &names, &cgroup_names, spec, &exec_paths),
            errno: f.errno,
        }
    };
    let deadline = start + limits.wall;
    if let Some(sock) = &ends.doors_sock {
        match hand_over_doors(sock, ends.fail_r.as_fd(), n_doors, deadline, on_doors) {
            Ok(()) => {}
            Err(DoorsFailed::Setup(buf)) => return Err(setup_failure(buf)),
            Err(DoorsFailed::Io(step, e)) => return Err(broker(step, e)),
        }
    }
    let caps = (limits.output_bytes, limits.stderr_bytes);
    let (exit, killed_for, io, relay) = match pump::pump(&mut child, slot, deadline, caps, ends) {
        Ok(Pumped::Ended {
            exit,
            killed_for,
            io,
            relay,
        }) => (exit, killed_for, io, relay),
        Ok(Pumped::SetupFailed(buf)) => return Err(setup_failure(buf)),
        Err((step, e)) => return Err(broker(step, e)),
    };
    let ended = match outcome(tool, limits, slot, enforced, exit, killed_for, *io, relay) {
        Ok(o) => o,
        Err(e) => {
            // Without the counters an OOM or task-limit kill would pass for
            // a plain exit. The child is reaped; the slot, whose files
            // could not be read, is removed rather than reused.
            guard.discard = true;
            drop(child);
            drop(guard);
            return Err(broker("read the sandbox's cgroup statistics", e));
        }
    };
    drop(child);
    drop(guard);
    drop(net_lease);
    Ok(Outcome {
        duration: start.elapsed(),
        setup: Some(setup),
        ..ended
    })
}

/// How the call ended (its duration still to be set), from how the child
/// exited, the kill we made, the slot's counters and what it wrote. `Err`:
/// the counters could not be read.
#[allow(clippy::too_many_arguments)]
fn outcome(
    tool: &str,
    limits: &crate::Limits,
    slot: Option<&Slot>,
    enforced: Enforced,
    exit: sio::ExitStatus,
    killed_for: Option<Status>,
    io: pump::IoState,
    relay: Option<Box<Relay>>,
) -> io::Result<Outcome> {
    let (exit_code, signal) = match exit {
        sio::ExitStatus::Exited(c) => (Some(c), None),
        sio::ExitStatus::Signaled(s) => (None, Some(s)),
    };
    // A child that died before exec without reporting (killed at the wall
    // limit during setup is the usual case) still ends up here.
    let (mut status, stats) = verdict(killed_for, exit_code, slot.map(Slot::stats))?;
    // Without a memory cgroup nothing counts OOM kills: a tool that failed
    // is taken at its word on stderr (see `fallback.rs`).
    let oom_line = if !enforced.cg_mem && status == Status::Exited {
        fallback::oom_line(&io.stderr).or_else(|| fallback::oom_line(&io.stderr_tail))
    } else {
        None
    };
    if oom_line.is_some() {
        status = Status::MemoryLimit;
    }
    let ended = Ended {
        tool,
        limits,
        status,
        exit_code,
        signal,
        cg_mem: enforced.cg_mem,
        relay: relay.is_some(),
    };
    let reason = ended.reason(oom_line);
    let (stdout, mut output_bytes, stderr, stderr_total) = io.finish();
    if let Some(r) = &relay {
        output_bytes = r.out_total;
    }
    Ok(Outcome {
        status,
        exit_code,
        signal,
        duration: Duration::ZERO,
        setup: None,
        peak_memory_bytes: stats.peak_memory,
        stdout,
        output_bytes,
        stderr,
        stderr_total,
        reason,
        warnings: enforced.warnings,
        landlock: enforced.landlock,
    })
}

/// The ids inside the sandbox, and what they map to on the host.
#[derive(Clone, Copy)]
struct Ids {
    inner: (u32, u32),
    host: (u32, u32),
}

impl Ids {
    fn of(jail: &Jail, spec: &JailSpec, supervisor: bool) -> Ids {
        let facts = &jail.facts;
        if supervisor {
            // Root of its namespaces: it builds the tool's sandbox.
            return Ids {
                inner: (0, 0),
                host: (facts.euid, facts.egid),
            };
        }
        let host = if facts.root {
            spec.host_ids
                .unwrap_or((jail.opts.host_uid_when_root, jail.opts.host_gid_when_root))
        } else {
            (facts.euid, facts.egid)
        };
        Ids {
            inner: spec
                .user
                .unwrap_or((jail.opts.inner_uid, jail.opts.inner_gid)),
            host,
        }
    }
}

/// Everything the child needs that does not depend on this host's
/// descriptors: its filesystem program, where to find its program, its
/// seccomp filters, Landlock rules and doors.
struct Built {
    steps: Vec<cordon_sys::spawn::Step>,
    names: Vec<String>,
    exec_paths: Vec<std::ffi::CString>,
    filters: Vec<Vec<libc::sock_filter>>,
    landlock: Option<cordon_sys::spawn::LandlockPlan>,
    landlock_status: LandlockStatus,
    doors: Option<cordon_sys::spawn::DoorsPlan>,
}

impl Built {
    fn new(jail: &Jail, spec: &JailSpec, ids: Ids, supervisor: bool) -> Result<Built, JailError> {
        let doors_req = match &spec.network {
            NetMode::Doors(d) => Some(d),
            NetMode::None => None,
        };
        let doors = doors_req.map(plan::doors).transpose()?;
        if supervisor {
            let Some(arg0) = spec.argv.first().filter(|a| a.starts_with('/')) else {
                return Err(JailError::Spec(
                    "a supervisor's program must be an absolute host path".into(),
                ));
            };
            let exec = std::ffi::CString::new(arg0.as_bytes())
                .map_err(|_| JailError::Spec("argv contains a NUL byte".into()))?;
            let program = plan::supervisor_program()?;
            return Ok(Built {
                steps: program.steps,
                names: program.names,
                exec_paths: vec![exec],
                filters: Vec::new(),
                landlock: None,
                landlock_status: LandlockStatus::Disabled,
                doors,
            });
        }
        let facts = &jail.facts;
        let (uid, gid) = ids.inner;
        let program = plan::program_by(
            jail.root_dir.path(),
            &facts.system_dirs,
            spec,
            uid,
            gid,
            plan::BindBy::for_this_broker(),
        )?;
        let filters = jail.filters_for(&spec.seccomp, doors_req.is_some())?;
        let (landlock, landlock_status) = if spec.landlock {
            plan::landlock(facts.landlock_abi, doors_req.is_some(), &spec.volumes)?
        } else {
            (None, LandlockStatus::Disabled)
        };
        Ok(Built {
            steps: program.steps,
            names: program.names,
            exec_paths: plan::exec_paths(spec)?,
            filters: filters.as_ref().clone(),
            landlock,
            landlock_status,
            doors,
        })
    }

    /// Descriptors the child sends back: one per door socket, and the
    /// route socket.
    fn n_doors(&self) -> usize {
        self.doors
            .as_ref()
            .map(|d| d.sockets.len() + usize::from(d.route_socket))
            .unwrap_or(0)
    }
}

/// What this host enforces of the limits: the cgroup controllers the slot
/// has, the rlimits that stand in for the missing ones (or back them up),
/// and a warning for each limit enforced more weakly than asked.
struct Enforced {
    cg_mem: bool,
    rlimits: Vec<(u32, u64, u64)>,
    warnings: Vec<String>,
    landlock: LandlockStatus,
}

impl Enforced {
    fn of(
        jail: &Jail,
        limits: &crate::Limits,
        slot: Option<&Slot>,
        supervisor: bool,
        landlock: LandlockStatus,
    ) -> Enforced {
        let cg_mem = slot.map(Slot::has_memory).unwrap_or(false);
        let cg_pids = slot.map(Slot::has_pids).unwrap_or(false);
        let cg_cpu = slot.map(Slot::has_cpu).unwrap_or(false);
        let why = jail
            .no_cgroup_warning
            .as_deref()
            .unwrap_or("controller not available");
        let mut warnings = Vec::new();
        // A supervisor gets none of the tool's rlimits (an application
        // kernel reserves far more address space and descriptors than it
        // uses): without a cgroup its memory and tasks are not limited, and
        // the runtime above must refuse what requires them.
        let mut rlimits = if supervisor {
            vec![(libc::RLIMIT_CORE, 0, 0)]
        } else {
            vec![
                (libc::RLIMIT_NOFILE, limits.nofile, limits.nofile),
                // A page over the tmpfs size, so filling /tmp ends in ENOSPC
                // rather than SIGXFSZ.
                (
                    libc::RLIMIT_FSIZE,
                    limits.disk_bytes.saturating_add(4096),
                    limits.disk_bytes.saturating_add(4096),
                ),
                (libc::RLIMIT_CORE, 0, 0),
            ]
        };
        if !cg_mem && supervisor {
            warnings.push(format!(
                "cgroups unavailable ({why}): memory limit not enforced"
            ));
        } else if !cg_mem {
            // Private writable memory per process, and the address space
            // only as a far looser backstop (see `fallback.rs`); neither
            // above the broker's own hard limit, which an unprivileged
            // broker cannot raise (and a lower one is stricter still).
            let cap = |res: u32, v: u64| sio::hard_rlimit(res).map_or(v, |h| v.min(h));
            let data = cap(libc::RLIMIT_DATA, limits.memory_bytes);
            let backstop = cap(libc::RLIMIT_AS, fallback::as_backstop(limits.memory_bytes));
            rlimits.push((libc::RLIMIT_DATA, data, data));
            rlimits.push((libc::RLIMIT_AS, backstop, backstop));
            warnings.push(format!(
                "cgroups unavailable ({why}): memory limit enforced per process by RLIMIT_DATA (private writable memory; shared mappings only by an RLIMIT_AS backstop of {}), no OOM kill, no peak memory",
                format_size(backstop)
            ));
        }
        if !cg_pids && supervisor {
            warnings.push(format!(
                "cgroups unavailable ({why}): task limit not enforced"
            ));
        } else if !cg_pids {
            // RLIMIT_NPROC is counted per user namespace: the sandbox's
            // fresh namespace makes it a per-sandbox task limit.
            rlimits.push((libc::RLIMIT_NPROC, limits.tasks, limits.tasks));
            warnings.push(format!(
                "cgroups unavailable ({why}): task limit enforced by RLIMIT_NPROC in the sandbox's user namespace (no task-limit detection)"
            ));
        }
        if limits.cpu_percent.is_some() && !cg_cpu {
            warnings.push(format!(
                "cgroups unavailable ({why}): cpu quota not enforced"
            ));
        }
        if landlock == LandlockStatus::PartiallyEnforced {
            warnings.push(format!(
                "Landlock ABI {} is older than {:?}: some rights not enforced",
                jail.facts.landlock_abi,
                plan::LANDLOCK_TARGET
            ));
        } else if landlock == LandlockStatus::NotEnforced {
            warnings.push("Landlock unavailable on this kernel".into());
        }
        Enforced {
            cg_mem,
            rlimits,
            warnings,
            landlock,
        }
    }
}

/// The child's ends of its descriptors, closed in the broker once it is
/// spawned.
struct ChildEnds {
    stdin: OwnedFd,
    stdout: OwnedFd,
    stderr: OwnedFd,
    sync_r: OwnedFd,
    fail_w: OwnedFd,
    doors: Option<OwnedFd>,
}

/// Open every pipe of a call: the broker's ends and the child's.
fn open_ends(
    jail: &Jail,
    stdin: Stdin,
    output_bytes: u64,
    doors: bool,
) -> Result<(Ends, ChildEnds), (String, io::Error)> {
    let p = |what: &str| {
        let w = what.to_string();
        move |e: Errno| (w, errno_io(e))
    };
    let (out_r, out_w) = sio::pipe().map_err(p("create stdout pipe"))?;
    let (err_r, err_w) = sio::pipe().map_err(p("create stderr pipe"))?;
    let (sync_r, sync_w) = sio::pipe().map_err(p("create sync pipe"))?;
    let (fail_r, fail_w) = sio::pipe().map_err(p("create error pipe"))?;
    let mut stdin_bytes = Vec::new();
    let mut relay = None;
    let (in_child, in_w) = match stdin {
        Stdin::Stream(st) => {
            let (r, w) = sio::pipe().map_err(p("create stdin pipe"))?;
            relay = Some(Relay::new(st, output_bytes));
            (r, Some(w))
        }
        Stdin::Bytes(b) => {
            let (r, w) = sio::pipe().map_err(p("create stdin pipe"))?;
            stdin_bytes = b;
            (r, Some(w))
        }
        Stdin::Fd(fd) => (fd, None),
        Stdin::Null => (
            jail.dev_null
                .try_clone()
                .map_err(|e| ("dup /dev/null".to_string(), e))?,
            None,
        ),
    };
    let (doors_sock, doors_child) = if doors {
        let (parent, child) = sio::seqpacket_pair().map_err(p("create door socket pair"))?;
        (Some(parent), Some(child))
    } else {
        (None, None)
    };
    Ok((
        Ends {
            out_r,
            err_r,
            sync_w,
            fail_r,
            in_w,
            stdin_bytes,
            relay,
            doors_sock,
        },
        ChildEnds {
            stdin: in_child,
            stdout: out_w,
            stderr: err_w,
            sync_r,
            fail_w,
            doors: doors_child,
        },
    ))
}

/// The namespaces a call's child gets.
fn namespaces(root: bool, supervisor: bool, joins_net: bool) -> u64 {
    if supervisor && root {
        SUPERVISOR_NS_FLAGS
    } else if supervisor {
        SUPERVISOR_NS_FLAGS | libc::CLONE_NEWUSER as u64
    } else if joins_net {
        NS_FLAGS & !(libc::CLONE_NEWNET as u64)
    } else {
        NS_FLAGS
    }
}

/// The slot's cgroup files the child joins by itself (its v1 cgroups, and
/// v2 where it cannot be born there), and the slot's v2 directory it is
/// born in (clone3's `CLONE_INTO_CGROUP`).
struct Joins {
    files: Vec<(&'static str, std::fs::File)>,
    names: Vec<&'static str>,
    cgroup_fd: Option<std::os::fd::RawFd>,
}

impl Joins {
    fn open(jail: &Jail, slot: Option<&Slot>) -> Result<Joins, (String, io::Error)> {
        let born_in_v2 = jail.pool.as_ref().is_none_or(|p| p.born_in_v2());
        let files = match slot {
            Some(s) => s
                .open_join_files(born_in_v2)
                .map_err(|e| ("open the slot's cgroup files".to_string(), e))?,
            None => Vec::new(),
        };
        let names = files.iter().map(|(n, _)| *n).collect();
        let cgroup_fd = match slot.and_then(|s| s.v2.as_ref().map(|d| (s, d))) {
            Some((s, d)) if born_in_v2 => {
                Some(s.v2_fd().map(|f| f.as_raw_fd()).ok_or_else(|| {
                    (
                        format!("open {}", d.display()),
                        io::Error::from(io::ErrorKind::NotFound),
                    )
                })?)
            }
            _ => None,
        };
        Ok(Joins {
            files,
            names,
            cgroup_fd,
        })
    }
}

/// The whole plan of the child.
#[allow(clippy::too_many_arguments)]
fn child_plan(
    spec: &JailSpec,
    built: Built,
    ids: Ids,
    enforced: &Enforced,
    namespaces: u64,
    join_net: Option<std::os::fd::RawFd>,
    joins: &Joins,
    ends: &ChildEnds,
    supervisor: bool,
    jail: &Jail,
) -> Result<ChildPlan, JailError> {
    let facts = &jail.facts;
    Ok(ChildPlan {
        namespaces,
        join_net,
        join_cgroups: joins.files.iter().map(|(_, f)| f.as_raw_fd()).collect(),
        cgroup_fd: joins.cgroup_fd,
        stdin: ends.stdin.as_raw_fd(),
        stdout: ends.stdout.as_raw_fd(),
        stderr: ends.stderr.as_raw_fd(),
        sync_read: ends.sync_r.as_raw_fd(),
        err_write: ends.fail_w.as_raw_fd(),
        doors_sock: ends.doors.as_ref().map(|c| c.as_raw_fd()),
        cgroup_ns: !supervisor,
        clear_groups: facts.root,
        uid: ids.inner.0,
        gid: ids.inner.1,
        steps: built.steps,
        doors: built.doors,
        rlimits: enforced.rlimits.clone(),
        landlock: built.landlock,
        cap_last: facts.cap_last_cap,
        keep_capabilities: supervisor,
        seccomp: built.filters,
        exec_paths: built.exec_paths,
        argv: spec
            .argv
            .iter()
            .map(|a| std::ffi::CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()
            .map_err(|_| JailError::Spec("argv contains a NUL byte".into()))?,
        envp: envp(spec)?,
    })
}

/// The child's environment: `env`, then `secret_env` over any of the same
/// name. Each `K=V` is built in a buffer of its exact size, so that no
/// copy of a secret is left unzeroised on the way (the `CString` takes the
/// buffer as it is).
fn envp(spec: &JailSpec) -> Result<Vec<zeroize::Zeroizing<std::ffi::CString>>, JailError> {
    let secret = |k: &str| spec.secret_env.iter().any(|(s, _)| s == k);
    spec.env
        .iter()
        .filter(|(k, _)| !secret(k))
        .map(|(k, v)| (k, v.as_str()))
        .chain(spec.secret_env.iter().map(|(k, v)| (k, v.as_str())))
        .map(|(k, v)| {
            if k.is_empty() || k.contains('=') {
                return Err(JailError::Spec(format!("bad environment name {k:?}")));
            }
            if k.contains('\0') || v.contains('\0') {
                return Err(JailError::Spec(format!(
                    "environment variable {k} contains a NUL byte"
                )));
            }
            let mut kv = zeroize::Zeroizing::new(Vec::with_capacity(k.len() + v.len() + 2));
            kv.extend_from_slice(k.as_bytes());
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            let c = std::ffi::CString::new(std::mem::take(&mut *kv)).map_err(|_| {
                JailError::Spec(format!("environment variable {k} contains a NUL byte"))
            })?;
            Ok(zeroize::Zeroizing::new(c))
        })
        .collect()
}

/// Write the child's uid and gid maps (an unprivileged broker must deny
/// setgroups first), when it has a user namespace of its own.
fn map_ids(jail: &Jail, pid: i32, ids: Ids, namespaces: u64) -> Result<(), (String, io::Error)> {
    if namespaces & libc::CLONE_NEWUSER as u64 == 0 {
        return Ok(());
    }
    let proc = format!("/proc/{pid}");
    let ((uid, gid), (host_uid, host_gid)) = (ids.inner, ids.host);
    if !jail.facts.root {
        std::fs::write(format!("{proc}/setgroups"), "deny")
            .map_err(|e| ("write setgroups".to_string(), e))?;
    }
    std::fs::write(format!("{proc}/uid_map"), format!("{uid} {host_uid} 1\n"))
        .map_err(|e| (format!("write uid_map ({uid} -> host {host_uid})"), e))?;
    std::fs::write(format!("{proc}/gid_map"), format!("{gid} {host_gid} 1\n"))
        .map_err(|e| (format!("write gid_map ({gid} -> host {host_gid})"), e))?;
    Ok(())
}

/// Why the doors were not handed over.
enum DoorsFailed {
    /// The sandbox reported a failed setup step.
    Setup([u8; 8]),
    Io(&'static str, io::Error),
}

/// Receive every door socket from the child, hand them to `on_doors`,
/// then let the child go on.
fn hand_over_doors<F>(
    sock: &OwnedFd,
    fail_r: BorrowedFd<'_>,
    n_doors: usize,
    deadline: Instant,
    on_doors: F,
) -> Result<(), DoorsFailed>
where
    F: FnOnce(Vec<OwnedFd>),
{
    let step = "receive door sockets";
    let eof = |why: &str| {
        DoorsFailed::Io(
            step,
            io::Error::new(io::ErrorKind::UnexpectedEof, why.to_string()),
        )
    };
    let mut fds = Vec::with_capacity(n_doors);
    while fds.len() < n_doors {
        let mut pfd = [
            pump::pfd(sock.as_fd(), libc::POLLIN),
            pump::pfd(fail_r, libc::POLLIN),
        ];
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(DoorsFailed::Io(
                step,
                io::Error::new(
                    io::ErrorKind::TimedOut,
                    "sandbox setup exceeded the wall limit",
                ),
            ));
        }
        pump::poll_retry(&mut pfd, left)
            .map_err(|e| DoorsFailed::Io("poll door socket", errno_io(e)))?;
        if pfd[1].revents != 0 {
            let mut buf = [0u8; 8];
            if pump::read_full(fail_r, &mut buf) == 8 {
                return Err(DoorsFailed::Setup(buf));
            }
            return Err(eof("sandbox exited during setup"));
        }
        if pfd[0].revents != 0 {
            match cordon_sys::spawn::recv_fd(sock)
                .map_err(|e| DoorsFailed::Io("receive door socket", errno_io(e)))?
            {
                Some(fd) => fds.push(fd),
                None => {
                    let mut buf = [0u8; 8];
                    if pump::read_full(fail_r, &mut buf) == 8 {
                        return Err(DoorsFailed::Setup(buf));
                    }
                    return Err(eof("sandbox closed the door socket"));
                }
            }
        }
    }
    on_doors(fds);
    sio::write(sock.as_fd(), b"g")
        .map_err(|e| DoorsFailed::Io("release the sandbox after doors", errno_io(e)))?;
    Ok(())
}

/// How a call ended, for its one-line reason.
struct Ended<'a> {
    tool: &'a str,
    limits: &'a crate::Limits,
    status: Status,
    exit_code: Option<i32>,
    signal: Option<i32>,
    cg_mem: bool,
    relay: bool,
}

impl Ended<'_> {
    fn reason(&self, oom_line: Option<String>) -> String {
        let Ended {
            tool,
            limits,
            cg_mem,
            ..
        } = *self;
        match self.status {
            Status::MemoryLimit if !cg_mem => format!(
                "{tool}: memory limit {} exceeded (an allocation failed under RLIMIT_DATA, the limit without cgroups: {:?})",
                format_size(limits.memory_bytes),
                oom_line.unwrap_or_default()
            ),
            Status::TimedOut => format!("{tool}: timed out after {}", format_duration(limits.wall)),
            Status::MemoryLimit => format!(
                "{tool}: memory limit {} exceeded (OOM kill)",
                format_size(limits.memory_bytes)
            ),
            Status::TaskLimit => format!("{tool}: task limit {} reached", limits.tasks),
            Status::OutputCap if self.relay => format!(
                "{tool}: a message over the output cap ({} bytes)",
                limits.output_bytes
            ),
            Status::OutputCap => format!("{tool}: output over cap ({} bytes)", limits.output_bytes),
            Status::Killed => format!("{tool}: stopped by the broker"),
            Status::Ok | Status::Exited => match (self.exit_code, self.signal) {
                (Some(c), _) => format!("{tool}: exit {c}"),
                (None, Some(s)) if !cg_mem && let Some(name) = fallback::crash_signal(s) => {
                    format!(
                        "{tool}: killed by signal {s} ({name}); without cgroups memory is capped per process by RLIMIT_DATA at {}, and a crash like this can follow a failed allocation: for a real memory limit run cordon where it gets a cgroup (see `cordon doctor`)",
                        format_size(limits.memory_bytes)
                    )
                }
                (None, Some(s)) => format!("{tool}: killed by signal {s}"),
                (None, None) => format!("{tool}: ended"),
            },
        }
    }
}

/// How a call ended, from the kill we made (if any), the exit code and
/// the slot's counters (`None`: no slot). A failed read of the counters is
/// an error, whatever else happened: zero counters would pass an OOM or
/// task-limit kill off as a plain exit.
fn verdict(
    killed_for: Option<Status>,
    exit_code: Option<i32>,
    stats: Option<io::Result<Stats>>,
) -> io::Result<(Status, Stats)> {
    let stats = stats.transpose()?.unwrap_or_default();
    let failed = exit_code != Some(0);
    let status = if let Some(k) = killed_for {
        k
    } else if stats.oom_kills > 0 {
        Status::MemoryLimit
    } else if stats.pids_max_events > 0 && failed {
        Status::TaskLimit
    } else if failed {
        Status::Exited
    } else {
        Status::Ok
    };
    Ok((status, stats))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A secret variable is held zeroising from the spec to the child's
    /// envp, never printed or serialized with the spec, and over a plain
    /// variable of the same name.
    #[test]
    fn a_secret_variable_is_zeroising_end_to_end_and_never_printed() {
        const TOKEN: &str = "real-token-9f8e7d6c5b4a3921";
        let mut spec = JailSpec::new("t", ["/bin/true"]);
        spec.env
            .push(("API_TOKEN".into(), "from the manifest".into()));
        spec.secret_env
            .push(("API_TOKEN".into(), zeroize::Zeroizing::new(TOKEN.into())));
        // The types: zeroised on drop, in the spec and in the envp.
        let held: &zeroize::Zeroizing<String> = &spec.secret_env[0].1;
        assert_eq!(held.as_str(), TOKEN);
        let built: Vec<zeroize::Zeroizing<std::ffi::CString>> = envp(&spec).unwrap();
        // Positive control: the child gets it, once, over the plain one.
        let vars: Vec<String> = built
            .iter()
            .map(|c| c.to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            vars.iter()
                .filter(|v| v.starts_with("API_TOKEN="))
                .collect::<Vec<_>>(),
            [&format!("API_TOKEN={TOKEN}")],
            "{vars:?}"
        );
        assert!(vars.iter().any(|v| v == "HOME=/tmp"), "{vars:?}");
        // Never printed nor serialized with the spec; its name is.
        let debug = format!("{spec:?}");
        assert!(!debug.contains(TOKEN), "{debug}");
        assert!(debug.contains("API_TOKEN"), "{debug}");
        assert!(!format!("{built:?}").contains(TOKEN));
        let json = serde_json::to_string(&spec).unwrap();
        assert!(!json.contains(TOKEN), "{json}");
        // A NUL in a secret is refused without showing it.
        spec.secret_env[0].1 = zeroize::Zeroizing::new(format!("{TOKEN}\0"));
        let e = envp(&spec).unwrap_err().to_string();
        assert!(
            e.contains("environment variable API_TOKEN contains a NUL byte"),
            "{e}"
        );
        assert!(!e.contains(TOKEN), "{e}");
    }

    #[test]
    fn verdicts() {
        let oom = Stats {
            oom_kills: 1,
            ..Stats::default()
        };
        let pids = Stats {
            pids_max_events: 2,
            ..Stats::default()
        };
        let v = |k, c, s| verdict(k, c, s).map(|(st, _)| st).ok();
        assert_eq!(v(None, Some(0), None), Some(Status::Ok));
        assert_eq!(v(None, Some(1), None), Some(Status::Exited));
        assert_eq!(v(None, None, Some(Ok(oom))), Some(Status::MemoryLimit));
        assert_eq!(v(None, Some(1), Some(Ok(pids))), Some(Status::TaskLimit));
        // Refused forks the tool recovered from.
        assert_eq!(v(None, Some(0), Some(Ok(pids))), Some(Status::Ok));
        assert_eq!(
            v(Some(Status::TimedOut), None, Some(Ok(oom))),
            Some(Status::TimedOut)
        );
        assert_eq!(verdict(None, None, Some(Ok(oom))).unwrap().1.oom_kills, 1);
    }

    #[test]
    fn unreadable_counters_are_an_error() {
        let gone = || Err(io::Error::from(io::ErrorKind::NotFound));
        // A SIGKILL that may have been the OOM killer's.
        assert!(verdict(None, None, Some(gone())).is_err());
        assert!(verdict(None, Some(0), Some(gone())).is_err());
        assert!(verdict(Some(Status::TimedOut), None, Some(gone())).is_err());
    }

    #[test]
    fn counters_of_a_slot_whose_files_are_gone() {
        // A slot over a removed v2 directory: its counters cannot be read.
        let d = tempfile::tempdir().unwrap();
        let v2 = d.path().join("slot");
        std::fs::create_dir(&v2).unwrap();
        std::fs::write(v2.join("memory.events"), "oom_kill 0\n").unwrap();
        std::fs::write(v2.join("pids.events"), "max 0\n").unwrap();
        let slot = Slot::from_dirs(
            Some(v2.clone()),
            Some((crate::cgroup::Version::V2, v2.clone())),
            Some((crate::cgroup::Version::V2, v2.clone())),
            None,
        );
        assert!(verdict(None, Some(0), Some(slot.stats())).is_ok());
        std::fs::remove_file(v2.join("memory.events")).unwrap();
        let e = verdict(None, None, Some(slot.stats())).unwrap_err();
        assert!(e.to_string().contains("memory.events"), "{e}");
    }
}
