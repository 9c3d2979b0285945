//! The broker side of one call: spawn, identity maps, cgroups, go-ahead,
//! doors, then the I/O loop with the wall clock, and the verdict.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use cordon_sys::Errno;
use cordon_sys::io as sio;
use cordon_sys::spawn::{Child, ChildFailure, ChildPlan, ChildStep};

use crate::cgroup::{Slot, Stats};
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
/// [`Jail::run_supervisor`]).
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
    let facts = &jail.facts;
    let doors_req = match &spec.network {
        NetMode::Doors(d) => Some(d),
        NetMode::None => None,
    };

    // Identity: inside uid/gid, and what they map to on the host.
    let (host_uid, host_gid) = if facts.root {
        spec.host_ids
            .unwrap_or((jail.opts.host_uid_when_root, jail.opts.host_gid_when_root))
    } else {
        (facts.euid, facts.egid)
    };
    let (uid, gid) = if supervisor {
        // Root of its namespaces: it builds the tool's sandbox.
        (0, 0)
    } else {
        spec.user
            .unwrap_or((jail.opts.inner_uid, jail.opts.inner_gid))
    };
    let (host_uid, host_gid) = if supervisor {
        (facts.euid, facts.egid)
    } else {
        (host_uid, host_gid)
    };

    // Everything the child needs, built now.
    let (program, exec_paths, filters, landlock, landlock_status) = if supervisor {
        let Some(arg0) = spec.argv.first().filter(|a| a.starts_with('/')) else {
            return Err(JailError::Spec(
                "a supervisor's program must be an absolute host path".into(),
            ));
        };
        let exec = std::ffi::CString::new(arg0.as_bytes())
            .map_err(|_| JailError::Spec("argv contains a NUL byte".into()))?;
        (
            plan::supervisor_program()?,
            vec![exec],
            Vec::new(),
            None,
            LandlockStatus::Disabled,
        )
    } else {
        let program = plan::program(jail.root_dir.path(), &facts.system_dirs, spec, uid, gid)?;
        let exec_paths = plan::exec_paths(spec)?;
        let filters = jail.filters_for(&spec.seccomp, doors_req.is_some())?;
        let (landlock, landlock_status) = if spec.landlock {
            plan::landlock(facts.landlock_abi, doors_req.is_some(), &spec.volumes)?
        } else {
            (None, LandlockStatus::Disabled)
        };
        (
            program,
            exec_paths,
            filters.as_ref().clone(),
            landlock,
            landlock_status,
        )
    };
    let doors = doors_req.map(plan::doors).transpose()?;
    let n_doors = doors
        .as_ref()
        .map(|d| d.sockets.len() + usize::from(d.route_socket))
        .unwrap_or(0);

    let mut warnings = Vec::new();
    let mut guard = SlotGuard {
        jail,
        slot: None,
        discard: false,
    };
    if let Some(pool) = &jail.pool {
        let mut slot = pool.acquire().map_err(|e| broker("create cgroup", e))?;
        let prep = slot.apply(limits).and_then(|()| slot.begin());
        guard.slot = Some(slot);
        prep.map_err(|e| broker("set cgroup limits", e))?;
    }
    let slot = guard.get();
    let cg_mem = slot.map(Slot::has_memory).unwrap_or(false);
    let cg_pids = slot.map(Slot::has_pids).unwrap_or(false);
    let cg_cpu = slot.map(Slot::has_cpu).unwrap_or(false);
    let why = jail
        .no_cgroup_warning
        .as_deref()
        .unwrap_or("controller not available");
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
        // Private writable memory per process, and the address space only
        // as a far looser backstop (see `fallback.rs`); neither above the
        // broker's own hard limit, which an unprivileged broker cannot
        // raise (and a lower one is stricter still).
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
        // RLIMIT_NPROC is counted per user namespace: the sandbox's fresh
        // namespace makes it a per-sandbox task limit.
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
    if landlock_status == LandlockStatus::PartiallyEnforced {
        warnings.push(format!(
            "Landlock ABI {} is older than {:?}: some rights not enforced",
            facts.landlock_abi,
            plan::LANDLOCK_TARGET
        ));
    } else if landlock_status == LandlockStatus::NotEnforced {
        warnings.push("Landlock unavailable on this kernel".into());
    }

    // Descriptors.
    let p = |what: &str| {
        let w = what.to_string();
        move |e: Errno| broker(&w, errno_io(e))
    };
    let (out_r, out_w) = sio::pipe().map_err(p("create stdout pipe"))?;
    let (err_r, err_w) = sio::pipe().map_err(p("create stderr pipe"))?;
    let (sync_r, sync_w) = sio::pipe().map_err(p("create sync pipe"))?;
    let (fail_r, fail_w) = sio::pipe().map_err(p("create error pipe"))?;
    let mut stdin_bytes = None;
    let mut relay: Option<Relay> = None;
    let (in_child, in_w): (OwnedFd, Option<OwnedFd>) = match stdin {
        Stdin::Stream(st) => {
            let (r, w) = sio::pipe().map_err(p("create stdin pipe"))?;
            relay = Some(Relay::new(st, limits.output_bytes));
            (r, Some(w))
        }
        Stdin::Bytes(b) => {
            let (r, w) = sio::pipe().map_err(p("create stdin pipe"))?;
            stdin_bytes = Some(b);
            (r, Some(w))
        }
        Stdin::Fd(fd) => (fd, None),
        Stdin::Null => (
            jail.dev_null
                .try_clone()
                .map_err(|e| broker("dup /dev/null", e))?,
            None,
        ),
    };
    let doors_pair = if doors.is_some() {
        Some(sio::seqpacket_pair().map_err(p("create door socket pair"))?)
    } else {
        None
    };

    // A sandbox without network joins an empty namespace from the pool
    // (declared before the child, so it is returned only after the child
    // has been killed and reaped on every path).
    let net_lease = match (&jail.net_pool, doors_req) {
        (Some(pool), None) if !supervisor => pool
            .acquire()
            .map(|fd| crate::netns::NetLease { pool, fd: Some(fd) }),
        _ => None,
    };
    let join_net = net_lease
        .as_ref()
        .and_then(|l| l.fd.as_ref())
        .map(|f| f.as_raw_fd());
    let namespaces = if supervisor && facts.root {
        SUPERVISOR_NS_FLAGS
    } else if supervisor {
        SUPERVISOR_NS_FLAGS | libc::CLONE_NEWUSER as u64
    } else if join_net.is_some() {
        NS_FLAGS & !(libc::CLONE_NEWNET as u64)
    } else {
        NS_FLAGS
    };
    let new_user_ns = namespaces & libc::CLONE_NEWUSER as u64 != 0;
    // The child moves itself into its v1 cgroups (and into v2 where it
    // cannot be born there) through these (see `ChildPlan::join_cgroups`).
    let born_in_v2 = jail.pool.as_ref().is_none_or(|p| p.born_in_v2());
    let join_files = match slot {
        Some(s) => s
            .open_join_files(born_in_v2)
            .map_err(|e| broker("open the slot's cgroup files", e))?,
        None => Vec::new(),
    };
    let cgroup_names: Vec<&'static str> = join_files.iter().map(|(n, _)| *n).collect();

    // The slot's own O_PATH descriptor of its v2 directory (clone3 takes
    // one for CLONE_INTO_CGROUP).
    let cgroup_fd = match slot.and_then(|s| s.v2.as_ref().map(|d| (s, d))) {
        Some((s, d)) if born_in_v2 => Some(s.v2_fd().map(|f| f.as_raw_fd()).ok_or_else(|| {
            broker(
                &format!("open {}", d.display()),
                io::Error::from(io::ErrorKind::NotFound),
            )
        })?),
        _ => None,
    };

    let child_plan = ChildPlan {
        namespaces,
        join_net,
        join_cgroups: join_files.iter().map(|(_, f)| f.as_raw_fd()).collect(),
        cgroup_fd,
        stdin: in_child.as_raw_fd(),
        stdout: out_w.as_raw_fd(),
        stderr: err_w.as_raw_fd(),
        sync_read: sync_r.as_raw_fd(),
        err_write: fail_w.as_raw_fd(),
        doors_sock: doors_pair.as_ref().map(|(_, c)| c.as_raw_fd()),
        cgroup_ns: !supervisor,
        clear_groups: facts.root,
        uid,
        gid,
        steps: program.steps,
        doors,
        rlimits,
        landlock,
        cap_last: facts.cap_last_cap,
        keep_capabilities: supervisor,
        seccomp: filters,
        exec_paths,
        argv: spec
            .argv
            .iter()
            .map(|a| std::ffi::CString::new(a.as_bytes()))
            .collect::<Result<_, _>>()
            .map_err(|_| JailError::Spec("argv contains a NUL byte".into()))?,
        envp: spec
            .env
            .iter()
            .map(|(k, v)| {
                if k.is_empty() || k.contains('=') {
                    return Err(JailError::Spec(format!("bad environment name {k:?}")));
                }
                std::ffi::CString::new(format!("{k}={v}"))
                    .map_err(|_| JailError::Spec("environment contains a NUL byte".into()))
            })
            .collect::<Result<_, _>>()?,
    };

    let exec_paths = child_plan.exec_paths.clone();
    // The child (which kills and reaps itself on drop) is declared after
    // everything it reads from, so it goes first on every return path.
    let mut child = cordon_sys::spawn::spawn(child_plan).map_err(|e| {
        JailError::broker(
            tool,
            "clone3 with new user, mount, pid, net, ipc, uts namespaces",
            errno_io(e),
        )
    })?;
    let pid = child.pid();
    // The child's ends are its own now.
    drop(out_w);
    drop(err_w);
    drop(sync_r);
    drop(fail_w);
    drop(in_child);
    drop(join_files);
    let doors_sock = doors_pair.map(|(parent, _child)| parent);

    // uid/gid maps. An unprivileged broker must deny setgroups first.
    let proc = format!("/proc/{pid}");
    if new_user_ns {
        if !facts.root {
            std::fs::write(format!("{proc}/setgroups"), "deny")
                .map_err(|e| broker("write setgroups", e))?;
        }
        std::fs::write(format!("{proc}/uid_map"), format!("{uid} {host_uid} 1\n"))
            .map_err(|e| broker(&format!("write uid_map ({uid} -> host {host_uid})"), e))?;
        std::fs::write(format!("{proc}/gid_map"), format!("{gid} {host_gid} 1\n"))
            .map_err(|e| broker(&format!("write gid_map ({gid} -> host {host_gid})"), e))?;
    }
    sio::write(sync_w.as_fd(), b"g").map_err(p("release the sandbox"))?;

    let setup_failure = |buf: [u8; 8]| {
        let f = ChildFailure::decode(buf);
        JailError::Setup {
            tool: tool.to_string(),
            step: describe(f.step, &program.names, &cgroup_names, spec, &exec_paths),
            errno: f.errno,
        }
    };
    let deadline = start + limits.wall;

    // Doors: receive every socket, hand them over, then let the child go on.
    if let Some(sock) = &doors_sock {
        let mut fds = Vec::with_capacity(n_doors);
        while fds.len() < n_doors {
            let mut pfd = [
                pfd(sock.as_fd(), libc::POLLIN),
                pfd(fail_r.as_fd(), libc::POLLIN),
            ];
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(JailError::broker(
                    tool,
                    "receive door sockets",
                    io::Error::new(
                        io::ErrorKind::TimedOut,
                        "sandbox setup exceeded the wall limit",
                    ),
                ));
            }
            poll_retry(&mut pfd, left).map_err(p("poll door socket"))?;
            if pfd[1].revents != 0 {
                let mut buf = [0u8; 8];
                if read_full(fail_r.as_fd(), &mut buf) == 8 {
                    return Err(setup_failure(buf));
                }
                return Err(JailError::broker(
                    tool,
                    "receive door sockets",
                    io::Error::new(io::ErrorKind::UnexpectedEof, "sandbox exited during setup"),
                ));
            }
            if pfd[0].revents != 0 {
                match cordon_sys::spawn::recv_fd(sock).map_err(p("receive door socket"))? {
                    Some(fd) => fds.push(fd),
                    None => {
                        let mut buf = [0u8; 8];
                        if read_full(fail_r.as_fd(), &mut buf) == 8 {
                            return Err(setup_failure(buf));
                        }
                        return Err(JailError::broker(
                            tool,
                            "receive door sockets",
                            io::Error::new(
                                io::ErrorKind::UnexpectedEof,
                                "sandbox closed the door socket",
                            ),
                        ));
                    }
                }
            }
        }
        on_doors(fds);
        sio::write(sock.as_fd(), b"g").map_err(p("release the sandbox after doors"))?;
    }

    // The I/O loop.
    let mut io = IoState::new(limits.output_bytes, limits.stderr_bytes);
    let mut out_r = Some(out_r);
    let mut err_r = Some(err_r);
    let mut fail_r = Some(fail_r);
    let mut in_w = in_w;
    let stdin_bytes = stdin_bytes.unwrap_or_default();
    let mut in_off = 0usize;
    if let Some(w) = &in_w {
        if stdin_bytes.is_empty() && relay.is_none() {
            in_w = None;
        } else {
            sio::set_nonblocking(w.as_fd(), true).map_err(p("stdin non-blocking"))?;
        }
    }
    if let Some(r) = &relay {
        sio::set_nonblocking(r.socket.as_fd(), true).map_err(p("stream non-blocking"))?;
    }
    for fd in [&out_r, &err_r].into_iter().flatten() {
        sio::set_nonblocking(fd.as_fd(), true).map_err(p("pipe non-blocking"))?;
    }
    let mut exit: Option<sio::ExitStatus> = None;
    let mut killed_for: Option<Status> = None;
    let mut buf = vec![0u8; 64 << 10];
    loop {
        if exit.is_some() && out_r.is_none() && err_r.is_none() {
            break;
        }
        if let Some(r) = &mut relay
            && killed_for.is_none()
            && exit.is_none()
            && r.stopped
        {
            killed_for = Some(Status::Killed);
            kill_all(&child, slot);
        }
        let now = Instant::now();
        if killed_for.is_none() && now >= deadline && exit.is_none() {
            killed_for = Some(Status::TimedOut);
            kill_all(&child, slot);
        }
        // After the kill (or the exit) the pipes reach EOF once every
        // process of the sandbox is gone; a process outside the sandbox
        // that inherited a pipe end must not keep the call alive.
        let timeout = if exit.is_some() {
            Duration::from_millis(500)
        } else if killed_for.is_some() {
            Duration::from_secs(5)
        } else {
            deadline.saturating_duration_since(now)
        };
        let mut fds: Vec<sio::PollFd> = Vec::with_capacity(8);
        let mut kinds: Vec<u8> = Vec::with_capacity(8);
        if let Some(f) = &out_r
            && relay.as_ref().is_none_or(Relay::wants_output)
        {
            fds.push(pfd(f.as_fd(), libc::POLLIN));
            kinds.push(b'o');
        }
        if let Some(r) = &relay {
            r.poll_fds(&mut fds, &mut kinds);
        }
        if let Some(f) = &err_r {
            fds.push(pfd(f.as_fd(), libc::POLLIN));
            kinds.push(b'e');
        }
        if let Some(f) = &in_w
            && relay.as_ref().is_none_or(|r| !r.to_child.is_empty())
        {
            fds.push(pfd(f.as_fd(), libc::POLLOUT));
            kinds.push(b'i');
        }
        if let Some(f) = &fail_r {
            fds.push(pfd(f.as_fd(), libc::POLLIN));
            kinds.push(b'f');
        }
        if exit.is_none() {
            fds.push(pfd(child.pidfd(), libc::POLLIN));
            kinds.push(b'p');
        }
        let n = poll_retry(&mut fds, timeout).map_err(p("poll"))?;
        if n == 0 && exit.is_some() {
            // Pipes held open from outside the sandbox: stop waiting.
            out_r = None;
            err_r = None;
            continue;
        }
        for (pf, kind) in fds.iter().zip(kinds.iter()) {
            if pf.revents == 0 {
                continue;
            }
            match kind {
                b'o' => {
                    if let Some(f) = &out_r {
                        let drained = match &mut relay {
                            Some(r) => drain(f.as_fd(), &mut buf, |chunk| r.child_wrote(chunk)),
                            None => drain(f.as_fd(), &mut buf, |chunk| io.stdout(chunk)),
                        };
                        match drained {
                            Drain::Eof => out_r = None,
                            Drain::Stop => {
                                out_r = None;
                                if killed_for.is_none() && exit.is_none() {
                                    killed_for = Some(Status::OutputCap);
                                    kill_all(&child, slot);
                                }
                            }
                            Drain::More => {}
                        }
                    }
                }
                b'e' => {
                    if let Some(f) = &err_r
                        && let Drain::Eof = drain(f.as_fd(), &mut buf, |chunk| {
                            io.stderr(chunk);
                            true
                        })
                    {
                        err_r = None;
                    }
                }
                b'i' if relay.is_some() => {
                    if let (Some(w), Some(r)) = (&in_w, &mut relay)
                        && !r.write_child(w.as_fd())
                    {
                        in_w = None;
                    }
                }
                b's' | b'w' | b'x' => {
                    if let Some(r) = &mut relay {
                        r.ready(*kind, pf.revents);
                    }
                }
                b'i' => {
                    if let Some(w) = &in_w {
                        let rest = stdin_bytes.get(in_off..).unwrap_or(&[]);
                        match sio::write(w.as_fd(), rest) {
                            Ok(k) => {
                                in_off += k;
                                if in_off >= stdin_bytes.len() {
                                    in_w = None;
                                }
                            }
                            Err(Errno::EAGAIN) | Err(Errno::EINTR) => {}
                            // EPIPE: the tool closed stdin; it may still be
                            // fine.
                            Err(_) => in_w = None,
                        }
                    }
                }
                b'f' => {
                    if let Some(f) = &fail_r {
                        let mut b = [0u8; 8];
                        let n = read_full(f.as_fd(), &mut b);
                        if n == 8 {
                            drop(child);
                            return Err(setup_failure(b));
                        }
                        // EOF: execve succeeded (or the child died before
                        // reporting; the exit status will tell).
                        fail_r = None;
                    }
                }
                b'p' => {
                    if let Some(st) = child.wait(false).map_err(p("waitid"))? {
                        exit = Some(st);
                        in_w = None;
                    }
                }
                _ => {}
            }
        }
        if let Some(r) = &relay
            && r.stdin_done()
        {
            in_w = None;
        }
    }
    if let Some(r) = &mut relay {
        r.flush(Duration::from_secs(1));
    }
    drop(sync_w);
    drop(doors_sock);
    let Some(exit) = exit else {
        return Err(JailError::broker(
            tool,
            "wait for the sandbox",
            io::Error::other("sandbox did not exit"),
        ));
    };
    let (exit_code, signal) = match exit {
        sio::ExitStatus::Exited(c) => (Some(c), None),
        sio::ExitStatus::Signaled(s) => (None, Some(s)),
    };
    // A child that died before exec without reporting (killed at the wall
    // limit during setup is the usual case) still ends up here.
    let (mut status, stats) = match verdict(killed_for, exit_code, slot.map(Slot::stats)) {
        Ok(v) => v,
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
    let duration = start.elapsed();
    // Without a memory cgroup nothing counts OOM kills: a tool that failed
    // is taken at its word on stderr (see `fallback.rs`).
    let oom_line = if !cg_mem && status == Status::Exited {
        fallback::oom_line(&io.stderr).or_else(|| fallback::oom_line(&io.stderr_tail))
    } else {
        None
    };
    if oom_line.is_some() {
        status = Status::MemoryLimit;
    }
    let reason = match status {
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
        Status::OutputCap if relay.is_some() => format!(
            "{tool}: a message over the output cap ({} bytes)",
            limits.output_bytes
        ),
        Status::OutputCap => format!("{tool}: output over cap ({} bytes)", limits.output_bytes),
        Status::Killed => format!("{tool}: stopped by the broker"),
        Status::Ok | Status::Exited => match (exit_code, signal) {
            (Some(c), _) => format!("{tool}: exit {c}"),
            (None, Some(s)) if !cg_mem && let Some(name) = fallback::crash_signal(s) => format!(
                "{tool}: killed by signal {s} ({name}); without cgroups memory is capped per process by RLIMIT_DATA at {}, and a crash like this can follow a failed allocation: for a real memory limit run cordon where it gets a cgroup (see `cordon doctor`)",
                format_size(limits.memory_bytes)
            ),
            (None, Some(s)) => format!("{tool}: killed by signal {s}"),
            (None, None) => format!("{tool}: ended"),
        },
    };
    let (stdout, mut output_bytes, stderr, stderr_total) = io.finish();
    if let Some(r) = &relay {
        output_bytes = r.out_total;
    }
    drop(guard);
    Ok(Outcome {
        status,
        exit_code,
        signal,
        duration,
        peak_memory_bytes: stats.peak_memory,
        stdout,
        output_bytes,
        stderr,
        stderr_total,
        reason,
        warnings,
        landlock: landlock_status,
    })
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

fn kill_all(child: &Child, slot: Option<&Slot>) {
    // SIGKILL of the pid-namespace init takes every process of the
    // namespace with it; cgroup.kill (v2) as well when there is one.
    let _ = child.kill();
    if let Some(s) = slot
        && s.v2.is_some()
    {
        s.kill();
    }
}

fn pfd(fd: BorrowedFd<'_>, events: libc::c_short) -> sio::PollFd {
    sio::PollFd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    }
}

fn poll_retry(fds: &mut [sio::PollFd], timeout: Duration) -> Result<usize, Errno> {
    let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
    // Round up so a sub-millisecond remainder does not spin.
    let ms = if ms == 0 && !timeout.is_zero() { 1 } else { ms };
    loop {
        match sio::poll(fds, ms) {
            Err(Errno::EINTR) => continue,
            r => return r,
        }
    }
}

fn read_full(fd: BorrowedFd<'_>, buf: &mut [u8; 8]) -> usize {
    let mut got = 0;
    while got < buf.len() {
        match sio::read(fd, &mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(Errno::EINTR) => {}
            Err(_) => break,
        }
    }
    got
}

enum Drain {
    More,
    Eof,
    Stop,
}

fn drain(fd: BorrowedFd<'_>, buf: &mut [u8], mut sink: impl FnMut(&[u8]) -> bool) -> Drain {
    loop {
        match sio::read(fd, buf) {
            Ok(0) => return Drain::Eof,
            Ok(n) => {
                if !sink(&buf[..n]) {
                    return Drain::Stop;
                }
            }
            Err(Errno::EAGAIN) => return Drain::More,
            Err(Errno::EINTR) => {}
            Err(_) => return Drain::Eof,
        }
    }
}

/// Stderr bytes kept past the cap, the last ones written (where runtimes
/// put their fatal errors), for [`fallback::oom_line`].
const STDERR_TAIL: usize = 16 << 10;

struct IoState {
    out_cap: u64,
    err_cap: u64,
    stdout: Vec<u8>,
    out_total: u64,
    stderr: Vec<u8>,
    err_total: u64,
    /// The last bytes of stderr beyond `stderr` (up to twice
    /// [`STDERR_TAIL`] before it is trimmed).
    stderr_tail: Vec<u8>,
}

impl IoState {
    fn new(out_cap: u64, err_cap: u64) -> IoState {
        IoState {
            out_cap,
            err_cap,
            stdout: Vec::new(),
            out_total: 0,
            stderr: Vec::new(),
            err_total: 0,
            stderr_tail: Vec::new(),
        }
    }

    /// false once over the cap.
    fn stdout(&mut self, chunk: &[u8]) -> bool {
        self.out_total += chunk.len() as u64;
        let room = self.out_cap.saturating_sub(self.stdout.len() as u64) as usize;
        self.stdout
            .extend_from_slice(&chunk[..chunk.len().min(room)]);
        self.out_total <= self.out_cap
    }

    fn stderr(&mut self, chunk: &[u8]) {
        self.err_total += chunk.len() as u64;
        let room = self.err_cap.saturating_sub(self.stderr.len() as u64) as usize;
        let kept = chunk.len().min(room);
        self.stderr.extend_from_slice(&chunk[..kept]);
        let rest = &chunk[kept..];
        if !rest.is_empty() {
            self.stderr_tail.extend_from_slice(rest);
            if self.stderr_tail.len() > 2 * STDERR_TAIL {
                let cut = self.stderr_tail.len() - STDERR_TAIL;
                self.stderr_tail.drain(..cut);
            }
        }
    }

    fn finish(self) -> (Vec<u8>, u64, Vec<u8>, u64) {
        (self.stdout, self.out_total, self.stderr, self.err_total)
    }
}

/// Bytes held in either direction of a [`crate::Stream`] relay before the
/// broker stops reading from that side (back-pressure).
const RELAY_HIGH_WATER: usize = 256 << 10;

/// The broker's side of a long-lived sandbox's stdio (see
/// [`crate::Stream`]).
struct Relay {
    socket: OwnedFd,
    stop: Option<OwnedFd>,
    /// From the socket, for the sandbox's stdin.
    to_child: Vec<u8>,
    /// From the sandbox's stdout, for the socket.
    to_sock: Vec<u8>,
    /// The socket gave end of file (or failed): no more input.
    sock_eof: bool,
    /// The socket can no longer be written: nobody reads the output.
    sock_dead: bool,
    /// Stop requested (or nobody is left to read).
    stopped: bool,
    cap: u64,
    /// Bytes of the line being written, held in `partial` until its end.
    line: u64,
    partial: Vec<u8>,
    out_total: u64,
}

impl Relay {
    fn new(st: crate::Stream, cap: u64) -> Relay {
        Relay {
            socket: st.socket,
            stop: Some(st.stop),
            to_child: Vec::new(),
            to_sock: Vec::new(),
            sock_eof: false,
            sock_dead: false,
            stopped: false,
            cap,
            line: 0,
            partial: Vec::new(),
            out_total: 0,
        }
    }

    fn wants_output(&self) -> bool {
        self.to_sock.len() < RELAY_HIGH_WATER
    }

    fn stdin_done(&self) -> bool {
        self.sock_eof && self.to_child.is_empty()
    }

    fn poll_fds(&self, fds: &mut Vec<sio::PollFd>, kinds: &mut Vec<u8>) {
        if !self.sock_eof && self.to_child.len() < RELAY_HIGH_WATER {
            fds.push(pfd(self.socket.as_fd(), libc::POLLIN));
            kinds.push(b's');
        }
        if !self.to_sock.is_empty() && !self.sock_dead {
            fds.push(pfd(self.socket.as_fd(), libc::POLLOUT));
            kinds.push(b'w');
        }
        if let Some(s) = &self.stop {
            fds.push(pfd(s.as_fd(), libc::POLLIN));
            kinds.push(b'x');
        }
    }

    fn ready(&mut self, kind: u8, revents: libc::c_short) {
        match kind {
            b's' => {
                let mut buf = [0u8; 64 << 10];
                loop {
                    match sio::read(self.socket.as_fd(), &mut buf) {
                        Ok(0) => {
                            self.sock_eof = true;
                            break;
                        }
                        Ok(n) => {
                            self.to_child.extend_from_slice(&buf[..n]);
                            if self.to_child.len() >= RELAY_HIGH_WATER {
                                break;
                            }
                        }
                        Err(Errno::EINTR) => {}
                        Err(Errno::EAGAIN) => break,
                        Err(_) => {
                            self.sock_eof = true;
                            break;
                        }
                    }
                }
            }
            b'w' => self.write_sock(),
            b'x' => {
                let _ = revents;
                self.stopped = true;
                self.stop = None;
            }
            _ => {}
        }
    }

    fn write_sock(&mut self) {
        while !self.to_sock.is_empty() {
            match sio::write(self.socket.as_fd(), &self.to_sock) {
                Ok(n) => {
                    self.to_sock.drain(..n);
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return,
                Err(_) => {
                    // Nobody reads the sandbox's output any more.
                    self.sock_dead = true;
                    self.stopped = true;
                    self.to_sock.clear();
                    return;
                }
            }
        }
    }

    /// Output from the sandbox: false once a line is over the cap. Only
    /// whole lines go on to the socket, so a message over the cap never
    /// reaches the caller, not even in part.
    fn child_wrote(&mut self, chunk: &[u8]) -> bool {
        self.out_total += chunk.len() as u64;
        let mut rest = chunk;
        while let Some(i) = rest.iter().position(|&b| b == b'\n') {
            if self.line + i as u64 > self.cap {
                self.partial.clear();
                return false;
            }
            if !self.sock_dead {
                self.to_sock.extend_from_slice(&self.partial);
                self.to_sock.extend_from_slice(&rest[..=i]);
            }
            self.partial.clear();
            self.line = 0;
            rest = &rest[i + 1..];
        }
        self.line += rest.len() as u64;
        if self.line > self.cap {
            self.partial.clear();
            return false;
        }
        self.partial.extend_from_slice(rest);
        true
    }

    /// Write what the socket accepts to the sandbox's stdin; false when
    /// the stdin pipe is closed.
    fn write_child(&mut self, w: BorrowedFd<'_>) -> bool {
        while !self.to_child.is_empty() {
            match sio::write(w, &self.to_child) {
                Ok(n) => {
                    self.to_child.drain(..n);
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return true,
                Err(_) => {
                    self.to_child.clear();
                    self.sock_eof = true;
                    return false;
                }
            }
        }
        true
    }

    /// After the sandbox is gone: hand the socket what is left, for at most
    /// `within`.
    fn flush(&mut self, within: Duration) {
        // A last message without its newline still goes out whole.
        if !self.sock_dead {
            let last = std::mem::take(&mut self.partial);
            self.to_sock.extend_from_slice(&last);
        }
        let until = Instant::now() + within;
        while !self.to_sock.is_empty() && !self.sock_dead {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            let mut f = [pfd(self.socket.as_fd(), libc::POLLOUT)];
            match poll_retry(&mut f, left) {
                Ok(n) if n > 0 => self.write_sock(),
                _ => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
