//! The gVisor runtime against the real `runsc`. Every test body runs in a
//! re-executed copy of this test binary, as root and (where it does not
//! need cgroup limits, which uid 65534 has no delegation for here) as uid
//! 65534 through `setpriv`. A missing or too old `runsc` fails the tests
//! (unless `CORDON_TEST_ALLOW_SKIP=1`).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cordon_runtime::gvisor::{Gvisor, Options};
use cordon_runtime::{Context, EgressEvent, EgressPolicy, Network, Runtime, SandboxSpec, Status};

use cordon_testkit::reexec::Harness;
use cordon_testkit::{skip, skip_or_fail};

/// Every body re-run as root and (where it does not need cgroup limits) as
/// uid 65534; an unprivileged broker's runtime directory is its own.
const HARNESS: Harness = Harness {
    child_env: "CORDON_GVISOR_TEST_CHILD",
    env_remove: &["XDG_RUNTIME_DIR"],
    run_dir_as_nobody: true,
    ..Harness::NONE
};

/// Both as root and as uid 65534.
macro_rules! gvisor_test {
    ($name:ident) => {
        cordon_testkit::reexec_test!(HARNESS, $name);
    };
}

/// As root only: needs cgroup limits.
macro_rules! gvisor_root_test {
    ($name:ident) => {
        cordon_testkit::reexec_test!(root_only, HARNESS, $name);
    };
}

/// The runtime, or a failure (skip only when allowed) naming what is
/// missing.
fn gvisor() -> Option<Gvisor> {
    let g = Gvisor::new(Options::default(), Default::default()).expect("gvisor runtime");
    let problems = g.check(&SandboxSpec::new("probe", ["/bin/true"])).problems;
    if !problems.is_empty() {
        skip_or_fail(&skip::this_test(), &problems.join("; "));
        return None;
    }
    Some(g)
}

fn spec(argv: &[&str]) -> SandboxSpec {
    let mut s = SandboxSpec::new("gv", argv.iter().copied());
    s.profile = cordon_policy::policy::Profile::P3;
    let l = cordon_policy::resolve::default_limits(s.profile).expect("P3 limits");
    s.limits = l;
    s.limits.wall = Duration::from_secs(30);
    s
}

fn sh(script: &str) -> SandboxSpec {
    spec(&["/bin/sh", "-c", script])
}

fn run(g: &Gvisor, s: &SandboxSpec, input: &[u8]) -> cordon_runtime::Outcome {
    g.run(s, input.to_vec(), &Context::discard("t"))
        .expect("run")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

gvisor_test!(runs_a_program_with_stdin_and_stdout);
fn runs_a_program_with_stdin_and_stdout() {
    let Some(g) = gvisor() else { return };
    let o = run(&g, &sh("cat; echo; id -u; uname -r; exit 3"), b"hello");
    assert_eq!(o.status, Status::Exited, "{o:?} {}", text(&o.stderr));
    assert_eq!(o.exit_code, Some(3));
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "hello");
    assert_eq!(lines[1], "1000");
    // gVisor's own kernel answers, not the host's.
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_ne!(lines[2], host.trim(), "uname came from the host kernel");
}

gvisor_root_test!(a_memory_bomb_is_a_memory_limit);
fn a_memory_bomb_is_a_memory_limit() {
    let Some(g) = gvisor() else { return };
    // Positive control: well under the limit, it runs.
    let mut s = spec(&[
        "/usr/bin/python3",
        "-c",
        "b = b'x' * (32 << 20); print(len(b))",
    ]);
    s.limits.memory_bytes = 384 << 20;
    let o = run(&g, &s, b"");
    assert_eq!(o.status, Status::Ok, "{o:?} {}", text(&o.stderr));
    assert_eq!(text(&o.stdout).trim(), (32u64 << 20).to_string());
    // The bomb: the whole sandbox (Sentry included) is over its cgroup.
    let mut s = spec(&[
        "/usr/bin/python3",
        "-c",
        "b = b'x' * (1 << 30); print(len(b))",
    ]);
    s.limits.memory_bytes = 384 << 20;
    let o = run(&g, &s, b"");
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
    assert_eq!(o.status, Status::MemoryLimit, "{o:?} {}", text(&o.stderr));
    assert_eq!(o.reason, "gv: memory limit 384M exceeded (OOM kill)");
}

/// Start processes (`fork`) or threads until one is refused, print how many
/// were started and the refusal, then fail.
const BOMB: &str = "
import os, sys, threading, time
n = 0
try:
    while n < 1000:
        if sys.argv[1] == 'fork':
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
        else:
            threading.Thread(target=time.sleep, args=(60,), daemon=True).start()
        n += 1
except (OSError, RuntimeError) as e:
    print(n, type(e).__name__, getattr(e, 'errno', None), flush=True)
    os._exit(1)
print(n, 'none', flush=True)
";

// As root and as uid 65534, which has no cgroup here: the limit is the
// Sentry's, counting the tool's own tasks whatever gVisor's host threads
// number, and the outcome is the task limit's either way.
gvisor_test!(tasks_are_the_tools_own_and_a_fork_bomb_is_a_task_limit);
fn tasks_are_the_tools_own_and_a_fork_bomb_is_a_task_limit() {
    let Some(g) = gvisor() else { return };
    // Positive control: python3 under `tasks: 32` (gVisor's own host
    // threads alone are about as many).
    let mut s = spec(&["/usr/bin/python3", "-c", "print(1)"]);
    s.limits.tasks = 32;
    let o = run(&g, &s, b"");
    assert_eq!(o.status, Status::Ok, "{o:?} {}", text(&o.stderr));
    assert_eq!(
        text(&o.stdout),
        "1
"
    );
    // A few processes under the limit.
    let mut s = sh(
        "i=0; while [ $i -lt 4 ]; do sleep 1 & i=$((i+1)); done; echo started; wait; echo waited",
    );
    s.limits.tasks = 32;
    let o = run(&g, &s, b"");
    assert_eq!(o.status, Status::Ok, "{o:?} {}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "started\nwaited\n");
    // Processes: python3 and 31 children are 32; the 32nd child is
    // refused (EAGAIN) and the call ends at the task limit.
    for (kind, refusal) in [
        ("fork", "31 BlockingIOError 11\n"),
        ("thread", "31 RuntimeError None\n"),
    ] {
        let mut s = spec(&["/usr/bin/python3", "-c", BOMB, kind]);
        s.limits.tasks = 32;
        let o = run(&g, &s, b"");
        assert_eq!(
            text(&o.stdout),
            refusal,
            "{kind}: {o:?} {}",
            text(&o.stderr)
        );
        assert_eq!(
            o.status,
            Status::TaskLimit,
            "{kind}: {o:?} {}",
            text(&o.stderr)
        );
        assert_eq!(o.reason, "gv: task limit 32 reached", "{kind}");
    }
    // A shell's fork bomb: far more sleepers than the limit.
    let mut s = sh("i=0; while [ $i -lt 400 ]; do sleep 30 & i=$((i+1)); done; echo started; wait");
    s.limits.tasks = 32;
    let o = run(&g, &s, b"");
    assert_eq!(o.status, Status::TaskLimit, "{o:?} {}", text(&o.stderr));
    assert_eq!(o.reason, "gv: task limit 32 reached");
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
}

// The Sentry does not count the tasks of one with CAP_SYS_ADMIN in its own
// user namespace, which `clone3` (whose flags the filter cannot see) still
// makes: such a bomb meets the host bound, and is still the task limit.
gvisor_root_test!(a_bomb_in_a_user_namespace_meets_the_host_bound);
fn a_bomb_in_a_user_namespace_meets_the_host_bound() {
    let Some(g) = gvisor() else { return };
    let bomb = "
import ctypes, os, struct, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
# clone3(CLONE_NEWUSER, exit signal SIGCHLD): a fork into a new user namespace.
args = struct.pack('8Q', 0x10000000, 0, 0, 0, 17, 0, 0, 0)
buf = ctypes.create_string_buffer(args, len(args))
pid = libc.syscall(435, buf, ctypes.c_size_t(len(args)))
if pid < 0:
    print('clone3', ctypes.get_errno(), flush=True)
    os._exit(3)
if pid == 0:
    n = 0
    try:
        while n < int(sys.argv[1]):
            if os.fork() == 0:
                time.sleep(60)
                os._exit(0)
            n += 1
    except OSError:
        os._exit(1)
    print(n, flush=True)
    os._exit(0)
_, st = os.waitpid(pid, 0)
os._exit(1 if st else 0)
";
    // Positive control: a few processes in the user namespace.
    let mut s = spec(&["/usr/bin/python3", "-c", bomb, "4"]);
    s.limits.tasks = 32;
    let o = run(&g, &s, b"");
    assert_eq!(o.status, Status::Ok, "{o:?} {}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "4\n");
    let mut s = spec(&["/usr/bin/python3", "-c", bomb, "1000"]);
    s.limits.tasks = 32;
    let o = run(&g, &s, b"");
    assert_eq!(o.status, Status::TaskLimit, "{o:?} {}", text(&o.stderr));
    assert!(
        o.reason.starts_with("gv: task limit 32 reached"),
        "{}",
        o.reason
    );
}

// gVisor's own /dev/fuse and /dev/net/tun (there without network) do not
// open, and no device node can be made to reach them.
gvisor_test!(fuse_and_tun_do_not_open);
fn fuse_and_tun_do_not_open() {
    let Some(g) = gvisor() else { return };
    let probe = "
import errno, os
def open_(p):
    try:
        os.close(os.open(p, os.O_RDWR))
        return 'opened'
    except OSError as e:
        return errno.errorcode[e.errno]
def mknod(p, kind):
    try:
        os.mknod(p, kind | 0o666, os.makedev(10, 229))
        return 'made'
    except OSError as e:
        return errno.errorcode[e.errno]
for p in ['/dev/null', '/dev/fuse', '/dev/net/tun']:
    print(p, open_(p))
print('fifo', mknod('/tmp/fifo', 0o010000))
print('chr', mknod('/tmp/fuse', 0o020000), open_('/tmp/fuse'))
print('blk', mknod('/tmp/blk', 0o060000))
";
    // With the deny table and with the allow list (which allows mknod).
    for filter in [
        cordon_runtime::Seccomp::DenyList,
        cordon_runtime::Seccomp::AllowList { extra: Vec::new() },
    ] {
        let mut s = spec(&["/usr/bin/python3", "-c", probe]);
        s.seccomp = filter.clone();
        let o = run(&g, &s, b"");
        assert_eq!(
            o.status,
            Status::Ok,
            "{filter:?}: {o:?} {}",
            text(&o.stderr)
        );
        // Positive controls: /dev/null opens, a FIFO is made.
        assert_eq!(
            text(&o.stdout),
            "/dev/null opened\n/dev/fuse EACCES\n/dev/net/tun ENOENT\nfifo made\nchr EPERM ENOENT\nblk EPERM\n",
            "{filter:?}"
        );
    }
}

/// Processes whose command line names one of this process's bundles, and
/// the bundles left in the state directory.
fn leftovers(g: &Gvisor) -> (Vec<String>, Vec<String>) {
    let tag = format!("cordon-{}-", std::process::id());
    let mut procs = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) || name == std::process::id().to_string() {
            continue;
        }
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.contains(&tag) {
                procs.push(format!("{name}: {c}"));
            }
        }
    }
    let dirs = std::fs::read_dir(g.state_dir().unwrap())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&tag))
        .collect();
    (procs, dirs)
}

gvisor_test!(a_wall_clock_kill_leaves_no_process_or_state);
fn a_wall_clock_kill_leaves_no_process_or_state() {
    let Some(g) = gvisor() else { return };
    // Positive control: while a sandbox runs, the scan sees its runsc
    // processes and its bundle.
    let s = g
        .spawn(&sh("sleep 60"), &Context::discard("t"))
        .expect("spawn");
    let mut seen = (Vec::new(), Vec::new());
    for _ in 0..100 {
        seen = leftovers(&g);
        if seen.0.len() >= 2 && !seen.1.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        seen.0.len() >= 2,
        "the scan found no runsc processes: {seen:?}"
    );
    assert_eq!(seen.1.len(), 1, "{seen:?}");
    s.handle.kill();
    let o = s.handle.wait().expect("outcome");
    assert_eq!(o.status, Status::Killed, "{o:?}");
    assert_eq!(leftovers(&g), (vec![], vec![]));
    // The wall clock: the whole sandbox is gone, its state removed.
    let mut sp = sh("sleep 60; echo never");
    sp.limits.wall = Duration::from_secs(2);
    let o = run(&g, &sp, b"");
    assert_eq!(o.status, Status::TimedOut, "{o:?}");
    assert_eq!(o.reason, "gv: timed out after 2s");
    assert!(o.stdout.is_empty());
    assert_eq!(leftovers(&g), (vec![], vec![]));
}

gvisor_test!(without_network_there_is_only_lo);
fn without_network_there_is_only_lo() {
    let Some(g) = gvisor() else { return };
    let o = run(
        &g,
        &sh(
            "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '; curl -sS -m 3 http://10.0.0.1/ 2>&1 >/dev/null | head -c 80; echo; curl -sS -m 3 http://127.0.0.1:1/ 2>&1 >/dev/null | head -c 60",
        ),
        b"",
    );
    assert_eq!(o.status, Status::Ok, "{o:?} {}", text(&o.stderr));
    let out = text(&o.stdout);
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("lo"), "{out}");
    let next = lines.next().unwrap_or("");
    assert!(next.starts_with("curl: (7)"), "10.0.0.1 reached? {out}");
}

/// A loopback HTTP upstream: answers every request with `upstream saw
/// <request line>`; counts requests.
fn upstream() -> (SocketAddr, Arc<Mutex<Vec<String>>>) {
    cordon_testkit::loopback::request_lines(|first| format!("upstream saw {first}"))
}

gvisor_test!(egress_goes_through_the_doors_only);
fn egress_goes_through_the_doors_only() {
    let Some(g) = gvisor() else { return };
    let (up, seen) = upstream();
    let (other, other_seen) = upstream();
    let port = up.port();
    let mut ep = EgressPolicy::allowlist(
        "gv",
        [format!("web.test:{port}"), format!("private.test:{port}")],
    )
    .unwrap();
    ep.resolve.insert("web.test".into(), up.ip());
    ep.resolve
        .insert("private.test".into(), "10.0.0.1".parse().unwrap());
    ep.allow_cidrs.push("127.0.0.1/32".parse().unwrap());
    let mut s = sh(&format!(
        "for u in http://web.test:{port}/hello http://169.254.169.254/latest/meta-data/ http://private.test:{port}/ http://localhost:{port}/; do \
           code=$(curl -sS -m 10 -o /tmp/body -w '%{{http_code}}' $u); echo \"$code $(cat /tmp/body)\"; done; \
           curl -sS -m 3 --noproxy '*' http://{other}/direct 2>&1 >/dev/null | head -c 9; echo"
    ));
    s.network = Network::Doors(Box::new(ep));
    let events: Arc<Mutex<Vec<EgressEvent>>> = Arc::default();
    let ev = events.clone();
    let mut ctx = Context::discard("t");
    ctx.on_egress = Arc::new(move |e| ev.lock().unwrap().push(e));
    let o = g.run(&s, Vec::new(), &ctx).expect("run");
    assert_eq!(o.status, Status::Ok, "{o:?} {}", text(&o.stderr));
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    // Positive control: the allowed name, through the proxy door.
    assert_eq!(lines[0], "200 upstream saw GET /hello HTTP/1.1", "{out}");
    // The metadata address, a name pinned to a private address, loopback:
    // refused by the door with its reason, as for a native sandbox.
    assert_eq!(
        lines[1],
        "403 egress to 169.254.169.254:80 refused: IP literal 169.254.169.254 is not in the allowlist of gv"
    );
    assert_eq!(
        lines[2],
        format!(
            "403 egress to private.test:{port} refused: private.test resolves to 10.0.0.1, a private address (RFC 1918), not in allow_cidrs"
        )
    );
    assert!(lines[3].starts_with("403 "), "{out}");
    assert!(lines[3].contains("refused"), "{out}");
    // Around the doors, the host's loopback is not there.
    assert_eq!(lines[4], "curl: (7)", "{out}");
    assert!(other_seen.lock().unwrap().is_empty());
    assert_eq!(seen.lock().unwrap().clone(), vec!["GET /hello HTTP/1.1"]);
    let ev = events.lock().unwrap();
    // One event per connection. An allowed connection is recorded when it
    // closes (with its byte counts), a refusal when it is refused: a busy
    // broker may record the refusals that followed first.
    assert_eq!(ev.len(), 4, "{ev:?}");
    let allowed = ev
        .iter()
        .filter(|e| e.decision == cordon_runtime::Decision::Allowed)
        .count();
    let refused = ev
        .iter()
        .filter(|e| e.decision == cordon_runtime::Decision::Refused)
        .count();
    assert_eq!((allowed, refused), (1, 3), "{ev:?}");
}

gvisor_test!(nothing_written_in_one_task_is_seen_in_the_next);
fn nothing_written_in_one_task_is_seen_in_the_next() {
    let Some(g) = gvisor() else { return };
    // Every place the tool can write: /tmp (also $HOME) and /dev/shm.
    let write = "for d in /tmp /dev/shm; do echo mark > $d/mark && echo wrote $d; done; \
                 sleep 300 & echo $! > /tmp/pid; \
                 for d in /tmp /dev/shm; do cat $d/mark; done; kill -0 $(cat /tmp/pid) && echo alive";
    let o = run(&g, &sh(write), b"");
    assert_eq!(o.status, Status::Ok, "{o:?} {}", text(&o.stderr));
    // Positive control: within the task, each write is there, and so is
    // the process it started.
    assert_eq!(
        text(&o.stdout),
        "wrote /tmp\nwrote /dev/shm\nmark\nmark\nalive\n"
    );
    // The next task: none of it.
    let read = "for d in /tmp /dev/shm; do ls -A $d; done; echo listed; \
                ps -e -o comm= 2>/dev/null | grep -c sleep || true";
    let o = run(&g, &sh(read), b"");
    assert_eq!(o.status, Status::Ok, "{o:?} {}", text(&o.stderr));
    assert_eq!(text(&o.stdout), "listed\n0\n");
}

#[test]
fn a_missing_or_old_runsc_is_named_by_check() {
    let state = cordon_testkit::scratch();
    let opts = |runsc: &std::path::Path| Options {
        runsc: Some(runsc.to_path_buf()),
        state_dir: Some(state.path().join("gv")),
    };
    let g = Gvisor::new(
        opts(std::path::Path::new("/nonexistent/runsc")),
        Default::default(),
    )
    .expect("gvisor runtime");
    let p = g.check(&SandboxSpec::new("t", ["/bin/true"])).problems;
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with("runtime gvisor: run /nonexistent/runsc --version:"),
        "{p:?}"
    );
    let refused = g.run(
        &SandboxSpec::new("t", ["/bin/true"]),
        Vec::new(),
        &Context::discard("t"),
    );
    assert!(
        matches!(refused, Err(cordon_runtime::RunError::Refused(_))),
        "{refused:?}"
    );
    // Bookworm's own 2022 build.
    let old = state.path().join("runsc");
    std::fs::write(
        &old,
        "#!/bin/sh\necho 'runsc version 0.0~20221219.0'\necho 'spec: 1.0.2-dev'\n",
    )
    .unwrap();
    std::fs::set_permissions(&old, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let g = Gvisor::new(opts(&old), Default::default()).expect("gvisor runtime");
    let p = g.check(&SandboxSpec::new("t", ["/bin/true"])).problems;
    assert_eq!(
        p,
        vec![format!(
            "runtime gvisor: runsc {} is release 20221219, older than 20240101 (no working systrap platform); install bookworm-backports' runsc",
            old.display()
        )]
    );
    // Positive control: the installed runsc passes.
    let Some(g) = gvisor() else { return };
    assert!(g.runsc_version().unwrap() >= cordon_runtime::gvisor::MIN_RUNSC);
}

gvisor_root_test!(a_pool_gives_each_task_a_never_used_sandbox);
fn a_pool_gives_each_task_a_never_used_sandbox() {
    use cordon_runtime::pool::{Pool, Settings};
    let Some(g) = gvisor() else { return };
    let g: Arc<dyn Runtime> = Arc::new(g);
    let s = sh("cat; ls -A /tmp; echo mark > /tmp/mark; cat /tmp/mark");
    let pool = Pool::new(
        g,
        s,
        Settings {
            size: 2,
            refill: true,
        },
        None,
    )
    .expect("pool");
    assert!(
        pool.wait_idle(2, Duration::from_secs(60)),
        "{:?}",
        pool.stopped()
    );
    for i in 0..3 {
        let (o, pooled) = pool
            .run(format!("task{i}\n").into_bytes(), &Context::discard("t"))
            .expect("run");
        assert_eq!(o.status, Status::Ok, "{o:?} {}", text(&o.stderr));
        // Within the task the write is there; nothing of the task before.
        assert_eq!(text(&o.stdout), format!("task{i}\nmark\n"));
        if i == 0 {
            assert!(pooled, "the first task did not get a pooled sandbox");
        }
        // Refilled in the background.
        assert!(
            pool.wait_idle(2, Duration::from_secs(60)),
            "{:?}",
            pool.stopped()
        );
    }
    // The task's own wall clock holds in a pooled sandbox.
    let mut s = sh("sleep 60");
    s.limits.wall = Duration::from_secs(2);
    let g2: Arc<dyn Runtime> = Arc::new(gvisor().unwrap());
    let p2 = Pool::new(
        g2,
        s,
        Settings {
            size: 1,
            refill: false,
        },
        None,
    )
    .expect("pool");
    assert!(p2.wait_idle(1, Duration::from_secs(60)));
    let (o, pooled) = p2.run(Vec::new(), &Context::discard("t")).unwrap();
    assert!(pooled);
    assert_eq!(o.status, Status::TimedOut, "{o:?}");
    assert_eq!(o.reason, "gv: timed out after 2s");
    // refill: false: drained, the next task cold-starts.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(p2.idle(), 0);
}

/// Env of the copy that churns native jails (see [`native_churn`]): the
/// file whose existence tells it to stop.
const CHURN_STOP: &str = "CORDON_GVISOR_TEST_CHURN_STOP";

/// The slot directories (per v1 hierarchy and v2) that processes of this
/// process's gVisor sandboxes are in, each with whether it exists.
fn sandbox_slots(g: &Gvisor) -> Vec<(String, bool)> {
    let l = &g.jail().host().cgroup_layout;
    let bases: Vec<(String, std::path::PathBuf)> = [
        ("memory", l.memory.as_ref()),
        ("pids", l.pids.as_ref()),
        ("cpu", l.cpu.as_ref()),
    ]
    .into_iter()
    .filter_map(|(c, p)| p.map(|p| (c.to_string(), p.base.clone())))
    .collect();
    let tag = format!("cordon-{}-", std::process::id());
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(c) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if !String::from_utf8_lossy(&c).contains(&tag) {
            continue;
        }
        let Ok(cg) = std::fs::read_to_string(e.path().join("cgroup")) else {
            continue;
        };
        for line in cg.lines() {
            let mut f = line.splitn(3, ':');
            let (_, ctls, path) = (f.next(), f.next().unwrap_or(""), f.next().unwrap_or(""));
            for (c, base) in &bases {
                if ctls.split(',').any(|x| x == c) {
                    let slot = path.rsplit('/').next().unwrap_or("");
                    let d = base.join(slot);
                    out.push((d.display().to_string(), d.is_dir()));
                }
            }
        }
    }
    out
}

// gVisor sandboxes started one after another, two at a time (as a
// `cordon serve` with several gVisor tools), while another broker process
// makes and drops native jails, pooled and one-shot (shared slots), and
// runs a sandbox in each: every gVisor start succeeds and, while it runs,
// each of its processes is in slot directories that exist.
gvisor_root_test!(gvisor_starts_hold_their_slots_while_another_broker_churns);
fn gvisor_starts_hold_their_slots_while_another_broker_churns() {
    starts_while_a_broker_churns(false);
}

// The same with the other broker in a pid namespace of its own (a test
// runner's, a container's, sharing this cgroup tree): this broker's pid is
// nobody's there, and its slots must still not be taken for a dead
// broker's.
gvisor_root_test!(gvisor_starts_hold_their_slots_while_a_broker_of_another_pid_namespace_churns);
fn gvisor_starts_hold_their_slots_while_a_broker_of_another_pid_namespace_churns() {
    starts_while_a_broker_churns(true);
}

fn starts_while_a_broker_churns(own_pid_namespace: bool) {
    let Some(g) = gvisor() else { return };
    let g = Arc::new(g);
    let s = sh("read x; echo \"$x\"");
    // Positive control: a sandbox held open is seen in its slot, whose
    // directories exist.
    let held = g
        .spawn(&sh("sleep 60"), &Context::discard("t"))
        .expect("spawn");
    // Polled until seen, for at most a minute (a loaded host starts slowly).
    let mut seen = Vec::new();
    for _ in 0..2400 {
        seen = sandbox_slots(&g);
        if !seen.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    held.handle.kill();
    let _ = held.handle.wait();
    assert!(!seen.is_empty(), "no sandbox process was seen in a slot");
    assert!(seen.iter().all(|(_, e)| *e), "{seen:?}");

    // The other broker: a copy of this binary churning native jails.
    let stop = cordon_testkit::scratch();
    let stop_file = stop.path().join("stop");
    let exe = std::env::current_exe().unwrap();
    let mut churn = if own_pid_namespace {
        let mut c = std::process::Command::new("unshare");
        c.args(["--pid", "--fork", "--mount-proc", "--"]).arg(exe);
        c
    } else {
        std::process::Command::new(exe)
    };
    let churn = churn
        .args([
            "--exact",
            "native_churn",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(HARNESS.child_env, "1")
        .env(CHURN_STOP, &stop_file)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start the churning broker");
    let failures = Arc::new(Mutex::new(Vec::new()));
    let missing = Arc::new(Mutex::new(Vec::new()));
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watcher = {
        let (g, missing, done) = (g.clone(), missing.clone(), done.clone());
        std::thread::spawn(move || {
            let mut looks = 0usize;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                for (d, exists) in sandbox_slots(&g) {
                    looks += 1;
                    if !exists {
                        missing.lock().unwrap().push(d);
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            looks
        })
    };
    const ROUNDS: usize = 25;
    let workers: Vec<_> = (0..2)
        .map(|w| {
            let (g, s, failures) = (g.clone(), s.clone(), failures.clone());
            std::thread::spawn(move || {
                for i in 0..ROUNDS {
                    let input = format!("w{w}-{i}\n");
                    match g.run(&s, input.clone().into_bytes(), &Context::discard("t")) {
                        Ok(o) if o.status == Status::Ok && text(&o.stdout) == input => {}
                        Ok(o) => failures.lock().unwrap().push(format!(
                            "{input:?}: {:?} {} {}",
                            o.status,
                            o.reason,
                            text(&o.stderr)
                        )),
                        Err(e) => failures.lock().unwrap().push(format!("{input:?}: {e}")),
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    let looks = watcher.join().unwrap();
    std::fs::write(&stop_file, b"").unwrap();
    let out = churn
        .wait_with_output()
        .expect("wait for the churning broker");
    let so = String::from_utf8_lossy(&out.stdout);
    // The other broker really made and dropped jails throughout.
    let churned: usize = so
        .lines()
        .find_map(|l| l.split("churned ").nth(1))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(
        out.status.success() && churned > 0,
        "churning broker: {so}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let failures = failures.lock().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} gVisor starts failed (native jails churned: {churned}): {failures:#?}",
        failures.len(),
        2 * ROUNDS
    );
    let missing = missing.lock().unwrap();
    assert!(
        missing.is_empty(),
        "slot directories gone under a live sandbox: {missing:?}"
    );
    println!(
        "gvisor starts: {}, slot looks: {looks}, native jails churned: {churned}",
        2 * ROUNDS
    );
}

/// The churning broker of the test above (runs only as its copy): until
/// the stop file exists (or a bound of iterations), make a jail, pooled or
/// one-shot in turn, run `/bin/true` in it, and drop it.
#[test]
#[ignore = "runs as the copy started by gvisor_starts_hold_their_slots_while_another_broker_churns"]
fn native_churn() {
    let Some(stop) = std::env::var_os(CHURN_STOP) else {
        return;
    };
    use cordon_runtime::native::{Native, Options as NativeOptions};
    let mut n = 0usize;
    while !std::path::Path::new(&stop).exists() && n < 5000 {
        let opts = if n.is_multiple_of(2) {
            NativeOptions::one_shot()
        } else {
            NativeOptions::default()
        };
        let native = Native::new(opts).expect("native runtime");
        let mut s = SandboxSpec::new("churn", ["/bin/true"]);
        s.limits.wall = Duration::from_secs(30);
        let o = native
            .run(&s, Vec::new(), &Context::discard("t"))
            .expect("native run");
        assert_eq!(o.status, Status::Ok, "{o:?}");
        n += 1;
    }
    println!("churned {n}");
}
