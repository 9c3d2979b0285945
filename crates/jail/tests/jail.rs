//! The jail against the real kernel. Every test body runs twice, in a
//! re-executed copy of this test binary: once as root (the broker's usual
//! case, the tool is mapped to host uid 65534) and once as uid 65534 via
//! `setpriv` (unprivileged broker: no cgroup delegation here, so limits
//! fall back to rlimits with warnings). `HOST_SECRET_TOKEN` is set in both
//! copies' environment and must never reach the tool.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::OwnedFd;
use std::time::Duration;

use cordon_jail::*;

use cordon_testkit::reexec::Harness;
use cordon_testkit::{euid, image, skip, skip_or_fail};

/// Set (to anything) where the jail must use cgroup limits, as root and as
/// a user with systemd delegation in the test bed of tests/vm: a jail on
/// the rlimit fallback there fails the test instead of taking the
/// fallback's branch of its assertions. The copies run as uid 65534
/// through setpriv (no user manager of theirs) do not get it.
const CGROUPS_REQUIRED_ENV: &str = "CORDON_TEST_CGROUPS_REQUIRED";
const SECRET_ENV: &str = "HOST_SECRET_TOKEN";
const SECRET: &str = "s3cr3t-value-that-must-not-leak";

/// Every body re-run as root and as uid 65534, with the host secret in its
/// environment.
const HARNESS: Harness = Harness {
    child_env: "CORDON_JAIL_TEST_CHILD",
    env: &[(SECRET_ENV, SECRET)],
    env_remove_as_nobody: &[CGROUPS_REQUIRED_ENV],
    ..Harness::NONE
};

/// The host uid and gid a tool runs as: 65534 when the broker is root, the
/// broker's own otherwise (uid 65534 under these tests' setpriv; another
/// user's in the test bed of tests/vm).
fn tool_host_ids() -> (u32, u32) {
    if euid() == 0 {
        return (65534, 65534);
    }
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let id = |key: &str| -> u32 {
        let line = s.lines().find(|l| l.starts_with(key)).unwrap();
        line.split_whitespace().nth(2).unwrap().parse().unwrap()
    };
    (id("Uid:"), id("Gid:"))
}

macro_rules! jail_test {
    ($name:ident) => {
        cordon_testkit::reexec_test!(HARNESS, $name);
    };
}

/// `Jail::new` removes stale cgroups; `stale_cgroup_is_cleaned` plants one
/// and holds this for writing so no other test's jail removes it first.
static NEW_JAIL: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn jail() -> Jail {
    let _g = NEW_JAIL.read().unwrap_or_else(|e| e.into_inner());
    let j = Jail::new().expect("Jail::new");
    if std::env::var_os(CGROUPS_REQUIRED_ENV).is_some() {
        assert!(
            cgroup_limits(&j),
            "{CGROUPS_REQUIRED_ENV} is set, but this jail has no cgroup memory and pids limits: delegation {:?}, notes {:?}",
            delegate::current(),
            j.notes()
        );
    }
    j
}

fn privileged(j: &Jail) -> bool {
    j.host().root
}

/// Whether this jail's memory and task limits go through cgroups (root
/// here; an unprivileged broker too where systemd delegates it a scope, as
/// in the test bed of tests/vm) rather than the rlimit fallback.
fn cgroup_limits(j: &Jail) -> bool {
    let l = &j.host().cgroup_layout;
    j.uses_cgroups() && l.memory.is_some() && l.pids.is_some()
}

fn py(tool: &str, code: &str) -> JailSpec {
    JailSpec::new(tool, ["/usr/bin/python3", "-c", code])
}

fn sh(tool: &str, script: &str) -> JailSpec {
    JailSpec::new(tool, ["/bin/sh", "-c", script])
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn run_ok(j: &Jail, spec: &JailSpec, stdin: Stdin) -> Outcome {
    let o = j
        .run(spec, stdin)
        .unwrap_or_else(|e| panic!("{}: {e}", spec.tool));
    assert_eq!(
        o.status,
        Status::Ok,
        "{}: {} stdout={} stderr={}",
        spec.tool,
        o.reason,
        text(&o.stdout),
        text(&o.stderr)
    );
    o
}

/// Lines `key value` printed by a probe.
fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {key} in:\n{out}"))
}

/// Python helpers for probes: errno names of failing calls.
const PY_PRELUDE: &str = r#"
import os, sys, socket, ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def name(e): return errno.errorcode.get(e, str(e))
def sc(label, nr, *args):
    r = libc.syscall(ctypes.c_long(nr), *args)
    print(label, "ok" if r >= 0 else name(ctypes.get_errno()))
def tryit(label, f):
    try:
        f(); print(label, "ok")
    except OSError as e:
        print(label, name(e.errno))
"#;

fn probe(code: &str) -> String {
    format!("{PY_PRELUDE}\n{code}")
}

// ---------------------------------------------------------------- positive

fn positive_control() {
    let j = jail();
    let o = run_ok(
        &j,
        &sh("echo", "echo hello; cat"),
        Stdin::Bytes(b"from stdin".to_vec()),
    );
    assert_eq!(text(&o.stdout), "hello\nfrom stdin");
    assert_eq!(o.reason, "echo: exit 0");
    assert_eq!(o.exit_code, Some(0));
    let o = run_ok(
        &j,
        &py(
            "python",
            "import sys; print(sum(range(10))); print('err', file=sys.stderr)",
        ),
        Stdin::Null,
    );
    assert_eq!(text(&o.stdout), "45\n");
    assert_eq!(text(&o.stderr), "err\n");
    // Name looked up in PATH; environment is exactly the spec's.
    let mut spec = JailSpec::new("env", ["env"]);
    spec.env.push(("EXTRA".into(), "1".into()));
    let o = run_ok(&j, &spec, Stdin::Null);
    let mut lines: Vec<&str> = text(&o.stdout).leak().lines().collect();
    lines.sort();
    assert_eq!(
        lines,
        [
            "EXTRA=1",
            "HOME=/tmp",
            "LANG=C.UTF-8",
            "PATH=/usr/local/bin:/usr/bin:/bin"
        ]
    );
    assert_eq!(
        std::env::var(SECRET_ENV).as_deref(),
        Ok(SECRET),
        "control: the secret is in the broker's env"
    );
    assert!(!text(&o.stdout).contains(SECRET));
    // Tools with options: awk through /etc/alternatives.
    let o = run_ok(
        &j,
        &sh("awk", "echo 3 4 | awk '{print $1*$2}'"),
        Stdin::Null,
    );
    assert_eq!(text(&o.stdout), "12\n");
    // Landlock is on.
    assert_eq!(o.landlock, LandlockStatus::FullyEnforced);
    if cgroup_limits(&j) {
        assert!(o.warnings.is_empty(), "{:?}", o.warnings);
        assert!(o.peak_memory_bytes.unwrap_or(0) > 0);
    } else {
        assert!(
            o.warnings.iter().any(|w| w.contains("cgroups unavailable")),
            "{:?}",
            o.warnings
        );
    }
}
jail_test!(positive_control);

fn exit_codes_and_signals() {
    let j = jail();
    let o = j.run(&sh("three", "exit 3"), Stdin::Null).unwrap();
    assert_eq!(
        (o.status, o.exit_code, o.reason.as_str()),
        (Status::Exited, Some(3), "three: exit 3")
    );
    let o = j
        .run(
            &py("segv", "import ctypes; ctypes.string_at(0)"),
            Stdin::Null,
        )
        .unwrap();
    assert_eq!(o.status, Status::Exited);
    assert_eq!(o.signal, Some(libc::SIGSEGV));
    if j.uses_cgroups() {
        assert_eq!(o.reason, "segv: killed by signal 11");
    } else {
        // On the rlimit fallback the reason also names it (see
        // `fallback_crash_names_the_fallback`).
        assert!(
            o.reason
                .starts_with("segv: killed by signal 11 (SIGSEGV); without cgroups"),
            "{}",
            o.reason
        );
    }
}
jail_test!(exit_codes_and_signals);

fn stdin_from_fd() {
    let j = jail();
    let mut f = tempfile::tempfile().unwrap();
    f.write_all(b"file contents").unwrap();
    use std::io::Seek;
    f.rewind().unwrap();
    let o = run_ok(
        &j,
        &JailSpec::new("cat", ["/bin/cat"]),
        Stdin::Fd(OwnedFd::from(f)),
    );
    assert_eq!(text(&o.stdout), "file contents");
}
jail_test!(stdin_from_fd);

// ------------------------------------------------------------ filesystem

fn filesystem_escapes() {
    let j = jail();
    for landlock in [true, false] {
        let mut spec = py(
            "fs",
            &probe(
                r#"
for p in ["/etc/shadow", "/root", "/home", "/sys", "/etc/resolv.conf", "/var", "/boot"]:
    tryit("stat" + p, lambda: os.stat(p))
for p in ["/usr/x", "/etc/x", "/x", "/bin/x", "/proc/sys/kernel/hostname"]:
    tryit("write" + p, lambda: open(p, "w").write("x"))
tryit("write/tmp/ok", lambda: open("/tmp/ok", "w").write("x"))
tryit("write/dev/null", lambda: open("/dev/null", "w").write("x"))
tryit("mkdir/etc/d", lambda: os.mkdir("/etc/d"))
for f in ["kcore", "keys", "timer_list", "sched_debug", "sysrq-trigger", "kallsyms"]:
    try: print("proc/" + f, len(open("/proc/" + f, "rb").read(4096)))
    except OSError as e: print("proc/" + f, name(e.errno))
print("cwd", os.getcwd())
print("tmpmode", oct(os.stat("/tmp").st_mode & 0o7777))
print("passwd", open("/etc/passwd").read().count("\n"))
"#,
            ),
        );
        spec.landlock = landlock;
        let o = run_ok(&j, &spec, Stdin::Null);
        let out = text(&o.stdout);
        for p in [
            "/etc/shadow",
            "/root",
            "/home",
            "/sys",
            "/etc/resolv.conf",
            "/var",
            "/boot",
        ] {
            assert_eq!(field(&out, &format!("stat{p}")), "ENOENT", "{p}\n{out}");
        }
        // Read-only mounts: EROFS (Landlock would say EACCES, but the
        // read-only check comes first).
        for p in [
            "/usr/x",
            "/etc/x",
            "/x",
            "/bin/x",
            "/proc/sys/kernel/hostname",
        ] {
            assert_eq!(
                field(&out, &format!("write{p}")),
                "EROFS",
                "{p} landlock={landlock}\n{out}"
            );
        }
        assert_eq!(field(&out, "mkdir/etc/d"), "EROFS");
        assert_eq!(field(&out, "write/tmp/ok"), "ok");
        assert_eq!(field(&out, "write/dev/null"), "ok");
        // Files the host's /proc has are masked with /dev/null (empty);
        // files it lacks stay absent.
        let mut masked = 0;
        for f in [
            "kcore",
            "keys",
            "timer_list",
            "sched_debug",
            "sysrq-trigger",
            "kallsyms",
        ] {
            let host_has = std::path::Path::new("/proc").join(f).exists();
            let inside = field(&out, &format!("proc/{f}"));
            if host_has {
                masked += 1;
                assert_eq!(inside, "0", "/proc/{f} not masked\n{out}");
            } else {
                assert_eq!(inside, "ENOENT", "/proc/{f}\n{out}");
            }
        }
        assert!(
            masked >= 3,
            "control: the host has few of these files\n{out}"
        );
        assert_eq!(field(&out, "cwd"), "/tmp");
        assert_eq!(field(&out, "tmpmode"), "0o1777");
        assert_eq!(field(&out, "passwd"), "3");
    }
}
jail_test!(filesystem_escapes);

fn landlock_is_a_second_layer() {
    // What only Landlock stops: /proc is mounted read-write (the kernel
    // decides per file), and writing /proc/self/comm is outside the
    // Landlock rules (write only under /tmp and to /dev devices).
    let j = jail();
    let code = probe(
        r#"
tryit("write/proc/self/comm", lambda: open("/proc/self/comm", "w").write("x"))
"#,
    );
    let mut spec = py("ll", &code);
    let with = text(&run_ok(&j, &spec, Stdin::Null).stdout);
    spec.landlock = false;
    let without = text(&run_ok(&j, &spec, Stdin::Null).stdout);
    assert_eq!(field(&with, "write/proc/self/comm"), "EACCES", "{with}");
    assert_eq!(field(&without, "write/proc/self/comm"), "ok", "{without}");
}
jail_test!(landlock_is_a_second_layer);

fn tmp_does_not_persist() {
    let j = jail();
    run_ok(
        &j,
        &sh("w", "echo data > /tmp/marker && test -f /tmp/marker"),
        Stdin::Null,
    );
    let o = j.run(&sh("r", "test -e /tmp/marker"), Stdin::Null).unwrap();
    assert_eq!(
        o.exit_code,
        Some(1),
        "/tmp/marker survived into the next call"
    );
}
jail_test!(tmp_does_not_persist);

fn binds_are_read_only() {
    let j = jail();
    let d = cordon_testkit::scratch::named("cordon-bind");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    std::fs::write(d.path().join("data.txt"), "bound").unwrap();
    let mut spec = py(
        "bind",
        &probe(
            r#"
print("read", open("/opt/data/data.txt").read())
tryit("write", lambda: open("/opt/data/new", "w"))
print("file", open("/etc/extra.txt").read())
"#,
        ),
    );
    spec.binds.push(Bind {
        src: d.path().to_path_buf(),
        dst: "/opt/data".into(),
    });
    spec.binds.push(Bind {
        src: d.path().join("data.txt"),
        dst: "/etc/extra.txt".into(),
    });
    let out = text(&run_ok(&j, &spec, Stdin::Null).stdout);
    assert_eq!(field(&out, "read"), "bound");
    assert_eq!(field(&out, "write"), "EROFS");
    assert_eq!(field(&out, "file"), "bound");
}
jail_test!(binds_are_read_only);

fn setup_errors_are_precise() {
    let j = jail();
    let e = j
        .run(
            &JailSpec::new("missing", ["/nonexistent/tool"]),
            Stdin::Null,
        )
        .unwrap_err();
    match &e {
        JailError::Setup { step, errno, .. } => {
            assert_eq!(step, "execve /nonexistent/tool");
            assert_eq!(*errno, Errno::ENOENT);
        }
        other => panic!("{other}"),
    }
    assert_eq!(
        e.to_string(),
        "missing: sandbox setup failed: execve /nonexistent/tool: ENOENT"
    );
    // A bind source below a directory the sandbox's uid cannot traverse (a
    // project in a 0700 home): a root broker clones the source's mount
    // tree itself, so the sandbox gets the directory with its own
    // permissions, still read-only; a volume there is read-write.
    let private = cordon_testkit::scratch::named("cordon-private");
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(private.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        for d in ["inner", "vol"] {
            std::fs::create_dir(private.path().join(d)).unwrap();
            std::fs::set_permissions(
                private.path().join(d),
                std::fs::Permissions::from_mode(0o777),
            )
            .unwrap();
        }
    }
    std::fs::write(private.path().join("inner/f.txt"), "inside").unwrap();
    if privileged(&j) {
        let mut spec = py(
            "bind",
            &probe(
                r#"
print("read", open("/opt/inner/f.txt").read())
tryit("write", lambda: open("/opt/inner/new", "w"))
open("/vol/out.txt", "w").write("written")
print("wrote", "yes")
tryit("list", lambda: os.listdir("/opt/inner"))
"#,
            ),
        );
        spec.binds.push(Bind {
            src: private.path().join("inner"),
            dst: "/opt/inner".into(),
        });
        spec.volumes.push(Bind {
            src: private.path().join("vol"),
            dst: "/vol".into(),
        });
        let out = text(&run_ok(&j, &spec, Stdin::Null).stdout);
        assert_eq!(field(&out, "read"), "inside", "{out}");
        assert_eq!(field(&out, "write"), "EROFS", "{out}");
        assert_eq!(field(&out, "list"), "ok", "{out}");
        assert_eq!(
            std::fs::read_to_string(private.path().join("vol/out.txt")).unwrap(),
            "written"
        );
        // The preflight agrees: nothing to say about the 0700 parent.
        assert_eq!(
            cordon_jail::preflight::preflight(&spec),
            Vec::<String>::new()
        );
        // Binding a directory the tool cannot read works, but the tool
        // still cannot read it (/root is 0700 root).
        let mut spec = py(
            "bind",
            &probe("tryit('list', lambda: os.listdir('/opt/root'))"),
        );
        spec.binds.push(Bind {
            src: "/root".into(),
            dst: "/opt/root".into(),
        });
        assert_eq!(
            field(&text(&run_ok(&j, &spec, Stdin::Null).stdout), "list"),
            "EACCES"
        );
    }
    let mut spec = JailSpec::new("bad", ["/bin/true"]);
    spec.binds.push(Bind {
        src: "/usr".into(),
        dst: "/proc/x".into(),
    });
    assert!(matches!(j.run(&spec, Stdin::Null), Err(JailError::Spec(_))));
}
jail_test!(setup_errors_are_precise);

/// A scratch directory the sandbox's uid can enter, with executable
/// files written into it.
fn tool_dir(files: &[(&str, &[u8], u32)]) -> cordon_testkit::Scratch {
    use std::os::unix::fs::PermissionsExt;
    let d = cordon_testkit::scratch::named("cordon-preflight");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    for (name, body, mode) in files {
        let p = d.path().join(name);
        std::fs::write(&p, body).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)).unwrap();
    }
    d
}

fn with_bind(mut spec: JailSpec, src: &std::path::Path, dst: &str) -> JailSpec {
    spec.binds.push(Bind {
        src: src.to_path_buf(),
        dst: dst.into(),
    });
    spec
}

/// A copy of /bin/true whose PT_INTERP names a loader that is nowhere:
/// the first NUL-terminated absolute path naming an `ld` in its first
/// 4 KiB (where `.interp` lives), overwritten in place.
fn true_with_missing_loader() -> Option<Vec<u8>> {
    let mut b = std::fs::read("/bin/true").ok()?;
    let head = b.len().min(4096);
    let mut i = 0;
    while i < head {
        if b[i] == b'/' && (i == 0 || b[i - 1] == 0) {
            let len = b[i..head].iter().position(|&c| c == 0)?;
            let s = &b[i..i + len];
            if s.windows(3).any(|w| w == b"/ld") && len >= 12 {
                let new = b"/nope/ld.so";
                b[i..i + new.len()].copy_from_slice(new);
                b[i + new.len()..i + len].fill(0);
                return Some(b);
            }
            i += len;
        }
        i += 1;
    }
    None
}

fn setup_error(r: Result<Outcome, JailError>) -> (String, Errno) {
    match r {
        Err(JailError::Setup { step, errno, .. }) => (step, errno),
        Ok(o) => panic!("ran: {}", o.reason),
        Err(e) => panic!("{e}"),
    }
}

fn preflight_agrees_with_the_jail() {
    use cordon_jail::preflight::preflight;
    let j = jail();
    // Positive controls: programs, a bound script, a symlinked interpreter
    // whose target is bound too.
    let target = tool_dir(&[("python3", b"#!/bin/sh\necho interp \"$@\"\n", 0o755)]);
    let d = tool_dir(&[
        ("ok.sh", b"#!/bin/sh\necho ok\n", 0o755),
        ("via-env", b"#!/usr/bin/env sh\necho env\n", 0o755),
        ("run.py", b"#!/opt/tool/python\nprint()\n", 0o755),
        ("no-interp", b"#!/opt/nope/python\n", 0o755),
        ("no-env-prog", b"#!/usr/bin/env nosuchprog\n", 0o755),
        ("data", b"#!/bin/sh\n", 0o644),
    ]);
    std::os::unix::fs::symlink(target.path().join("python3"), d.path().join("python")).unwrap();
    let bound = |argv: &[&str]| {
        with_bind(
            JailSpec::new("t", argv.iter().copied()),
            d.path(),
            "/opt/tool",
        )
    };
    for spec in [
        JailSpec::new("t", ["/bin/true"]),
        JailSpec::new("t", ["true"]),
        bound(&["/opt/tool/ok.sh"]),
        bound(&["/opt/tool/via-env"]),
        with_bind(
            bound(&["/opt/tool/run.py"]),
            target.path(),
            &target.path().to_string_lossy(),
        ),
    ] {
        assert_eq!(preflight(&spec), Vec::<String>::new(), "{:?}", spec.argv);
        let o = run_ok(&j, &spec, Stdin::Null);
        assert_eq!(o.status, Status::Ok, "{:?}", spec.argv);
    }
    // Refused by preflight, and by the sandbox's exec.
    let exec_refusals = [
        (JailSpec::new("t", ["nosuch-cordon-command"]), Errno::ENOENT),
        (bound(&["/opt/tool/no-interp"]), Errno::ENOENT),
        // The interpreter's symlink points outside everything bound.
        (bound(&["/opt/tool/run.py"]), Errno::ENOENT),
        (bound(&["/opt/tool/data"]), Errno::EACCES),
    ];
    for (spec, errno) in exec_refusals {
        let p = preflight(&spec);
        assert_eq!(p.len(), 1, "{:?}: {p:?}", spec.argv);
        let (step, e) = setup_error(j.run(&spec, Stdin::Null));
        assert!(step.starts_with("execve "), "{step}");
        assert_eq!(e, errno, "{:?}", spec.argv);
    }
    if let Some(elf) = true_with_missing_loader() {
        let e = tool_dir(&[("true", &elf, 0o755)]);
        let spec = with_bind(
            JailSpec::new("t", ["/opt/tool/true"]),
            e.path(),
            "/opt/tool",
        );
        assert_eq!(
            preflight(&spec),
            [
                "t: dynamic loader /nope/ld.so of /opt/tool/true does not exist inside the sandbox (not bound)"
            ]
        );
        assert_eq!(
            setup_error(j.run(&spec, Stdin::Null)),
            ("execve /opt/tool/true".to_string(), Errno::ENOENT)
        );
    } else {
        skip_or_fail(
            &skip::this_test(),
            "the preflight ELF-loader case needs a dynamically linked /bin/true (no PT_INTERP found)",
        );
    }
    // `env` runs but does not find its program: exit 127.
    let spec = bound(&["/opt/tool/no-env-prog"]);
    assert_eq!(preflight(&spec).len(), 1);
    assert_eq!(j.run(&spec, Stdin::Null).unwrap().exit_code, Some(127));
    // Setup steps.
    let spec = with_bind(
        JailSpec::new("t", ["/bin/true"]),
        &d.path().join("data"),
        "/etc/passwd",
    );
    assert_eq!(
        preflight(&spec),
        ["t: sandbox setup would fail: create /etc/passwd: /etc/passwd already exists"]
    );
    assert_eq!(
        setup_error(j.run(&spec, Stdin::Null)),
        ("create /etc/passwd".to_string(), Errno::EEXIST)
    );
    let spec = with_bind(
        JailSpec::new("t", ["/bin/true"]),
        d.path(),
        "/usr/cordon-nonexistent/x",
    );
    assert_eq!(preflight(&spec).len(), 1);
    assert_eq!(
        setup_error(j.run(&spec, Stdin::Null)),
        ("mkdir /usr/cordon-nonexistent".to_string(), Errno::EROFS)
    );
}
jail_test!(preflight_agrees_with_the_jail);

// ------------------------------------------------------- processes, ids

fn proc_shows_only_the_sandbox() {
    let j = jail();
    let o = run_ok(
        &j,
        &sh("ps", "for p in /proc/[0-9]*; do echo ${p#/proc/}; done"),
        Stdin::Null,
    );
    let pids: Vec<u32> = text(&o.stdout)
        .lines()
        .map(|l| l.parse().unwrap())
        .collect();
    // sh is pid 1 of its namespace; the glob runs in the shell itself.
    assert_eq!(pids, [1], "host processes visible: {pids:?}");
}
jail_test!(proc_shows_only_the_sandbox);

fn find_marker(marker: &str) -> Vec<i32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if pid as u32 == std::process::id() {
            continue;
        }
        if let Ok(c) = std::fs::read(e.path().join("cmdline"))
            && String::from_utf8_lossy(&c).contains(marker)
        {
            out.push(pid);
        }
    }
    out
}

fn wait_for_marker(marker: &str) -> Vec<i32> {
    for _ in 0..2000 {
        let f = find_marker(marker);
        if !f.is_empty() {
            return f;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("marker {marker} never appeared");
}

fn uid_is_unprivileged_inside_and_out() {
    let j = jail();
    let marker = format!("uidmarker{}", std::process::id());
    let (r, mut w) = std::io::pipe().unwrap();
    let spec = sh(
        "ids",
        &format!("read x; echo $(id -u) $(id -g); : {marker}"),
    );
    std::thread::scope(|s| {
        let h = s.spawn(|| j.run(&spec, Stdin::Fd(OwnedFd::from(r))));
        let pids = wait_for_marker(&marker);
        for pid in pids {
            let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
            let uid_line = st.lines().find(|l| l.starts_with("Uid:")).unwrap();
            let uids: Vec<u32> = uid_line
                .split_whitespace()
                .skip(1)
                .map(|x| x.parse().unwrap())
                .collect();
            assert!(
                uids.iter().all(|&u| u == tool_host_ids().0),
                "host-side uids of the tool: {uids:?}"
            );
            let cap = st.lines().find(|l| l.starts_with("CapEff:")).unwrap();
            assert!(cap.ends_with("0000000000000000"), "{cap}");
        }
        w.write_all(b"go\n").unwrap();
        drop(w);
        let o = h.join().unwrap().unwrap();
        assert_eq!(text(&o.stdout), "1000 1000\n");
    });
}
jail_test!(uid_is_unprivileged_inside_and_out);

fn daemon_does_not_survive() {
    let j = jail();
    let marker = format!("daemonmarker{}", std::process::id());
    let (r, mut w) = std::io::pipe().unwrap();
    // The daemon double-forks away from the tool and would sleep for 1000 s.
    let spec = sh(
        "daemon",
        &format!("(sh -c 'sleep 1000; : {marker}' &) & read x; echo started"),
    );
    std::thread::scope(|s| {
        let h = s.spawn(|| j.run(&spec, Stdin::Fd(OwnedFd::from(r))));
        // Positive control: while the tool runs, the daemon is visible.
        assert!(!wait_for_marker(&marker).is_empty());
        w.write_all(b"\n").unwrap();
        drop(w);
        let o = h.join().unwrap().unwrap();
        assert_eq!(text(&o.stdout), "started\n");
    });
    // The call returned: nothing of the sandbox is left.
    assert_eq!(
        find_marker(&marker),
        Vec::<i32>::new(),
        "daemon survived the call"
    );
}
jail_test!(daemon_does_not_survive);

// ---------------------------------------------------------------- seccomp

fn syscalls_are_refused() {
    let j = jail();
    let code = probe(
        r#"
sc("mount", 165, b"none", b"/tmp", b"tmpfs", 0, None)
sc("umount2", 166, b"/proc", 2)
sc("pivot_root", 155, b"/tmp", b"/tmp")
sc("unshare_user", 272, 0x10000000)
sc("unshare_net", 272, 0x40000000)
sc("setns", 308, 0, 0)
sc("clone_newns", 56, 0x00020000 | 17, 0, 0, 0, 0)
sc("clone3", 435, None, 0)
sc("ptrace", 101, 0, 0, 0, 0)
sc("process_vm_readv", 310, 1, None, 0, None, 0, 0)
sc("keyctl", 250, 0, -3, 0)
sc("add_key", 248, b"user", b"k", b"v", 1, -3)
sc("bpf", 321, 0, None, 0)
sc("perf_event_open", 298, None, 0, -1, -1, 0)
sc("userfaultfd", 323, 0)
sc("io_uring_setup", 425, 1, None)
sc("init_module", 175, None, 0, b"")
sc("kexec_load", 246, 0, 0, None, 0)
sc("reboot", 169, 0, 0, 0, None)
sc("open_by_handle_at", 304, 0, None, 0)
sc("fsopen", 430, b"tmpfs", 0)
sc("open_tree", 428, -100, b"/", 1)
sc("personality", 135, 0x0040000)
sc("personality_query", 135, 0xffffffff)
sc("x32_getpid", 0x40000000 | 39)
sc("socket_raw", 41, 2, 3, 1)
sc("socket_inet", 41, 2, 1, 0)
sc("socket_inet6", 41, 10, 2, 0)
sc("socket_netlink", 41, 16, 3, 0)
sc("socket_packet", 41, 17, 3, 0)
sc("socketpair_inet", 53, 2, 1, 0, (ctypes.c_int * 2)())
sc("socket_unix", 41, 1, 1, 0)
sc("socketpair_unix", 53, 1, 1, 0, (ctypes.c_int * 2)())
sc("ioctl_tiocsti", 16, 0, 0x5412, b"x")
sc("ioctl_tiocsti_high_bits", 16, 0, 0x100005412, b"x")
sc("ioctl_tioclinux", 16, 0, 0x541C, b"x")
import threading
t = threading.Thread(target=lambda: print("thread ok")); t.start(); t.join()
pid = os.fork()
if pid == 0: os._exit(7)
print("fork", os.waitpid(pid, 0)[1] >> 8)
"#,
    );
    let o = run_ok(&j, &py("seccomp", &code), Stdin::Null);
    let out = text(&o.stdout);
    for k in [
        "mount",
        "umount2",
        "pivot_root",
        "unshare_user",
        "unshare_net",
        "setns",
        "clone_newns",
        "ptrace",
        "process_vm_readv",
        "keyctl",
        "add_key",
        "bpf",
        "perf_event_open",
        "userfaultfd",
        "io_uring_setup",
        "init_module",
        "kexec_load",
        "reboot",
        "open_by_handle_at",
        "fsopen",
        "open_tree",
        "personality",
        "x32_getpid",
        "socket_raw",
        "socket_inet",
        "socket_inet6",
        "socket_netlink",
        "socket_packet",
        "socketpair_inet",
        "ioctl_tiocsti",
        "ioctl_tiocsti_high_bits",
        "ioctl_tioclinux",
    ] {
        assert_eq!(field(&out, k), "EPERM", "{k}\n{out}");
    }
    assert_eq!(field(&out, "clone3"), "ENOSYS");
    // Positive controls.
    assert_eq!(field(&out, "personality_query"), "ok");
    assert_eq!(field(&out, "socket_unix"), "ok");
    assert_eq!(field(&out, "socketpair_unix"), "ok");
    assert!(out.contains("thread ok"));
    assert_eq!(field(&out, "fork"), "7");
}
jail_test!(syscalls_are_refused);

fn foreign_arch_is_killed() {
    // int 0x80 (i386 ABI) getpid from a 64-bit process: the arch check
    // kills the process with SIGSYS.
    let j = jail();
    let code = r#"
import mmap, ctypes
code = bytes([0xb8, 20, 0, 0, 0, 0xcd, 0x80, 0xc3])  # mov eax,20; int 0x80; ret
m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
m.write(code)
addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
print("before", flush=True)
ctypes.CFUNCTYPE(ctypes.c_int)(addr)()
print("after")
"#;
    let o = j.run(&py("i386", code), Stdin::Null).unwrap();
    assert_eq!(text(&o.stdout), "before\n");
    assert_eq!(o.signal, Some(libc::SIGSYS), "{}", o.reason);
}
jail_test!(foreign_arch_is_killed);

fn allow_list_mode() {
    let j = jail();
    let code = probe("sc('getcpu', 309, None, None, None)\nsc('getpid', 39)");
    let mut spec = py("allow", &code);
    spec.seccomp = Seccomp::AllowList { extra: vec![] };
    let out = text(&run_ok(&j, &spec, Stdin::Null).stdout);
    assert_eq!(field(&out, "getcpu"), "EPERM");
    assert_eq!(field(&out, "getpid"), "ok");
    spec.seccomp = Seccomp::AllowList {
        extra: vec!["getcpu".into()],
    };
    let out = text(&run_ok(&j, &spec, Stdin::Null).stdout);
    assert_eq!(field(&out, "getcpu"), "ok");
    // The deny list still applies in allow-list mode.
    let mut spec = py(
        "allow",
        &probe("sc('mount', 165, b'none', b'/tmp', b'tmpfs', 0, None)"),
    );
    spec.seccomp = Seccomp::AllowList {
        extra: vec!["mount".into()],
    };
    assert_eq!(
        field(&text(&run_ok(&j, &spec, Stdin::Null).stdout), "mount"),
        "EPERM"
    );
    let o = run_ok(&j, &sh("allow-sh", "echo ok | cat"), Stdin::Null);
    assert_eq!(text(&o.stdout), "ok\n");
    spec.seccomp = Seccomp::AllowList {
        extra: vec!["not_a_syscall".into()],
    };
    assert!(matches!(j.run(&spec, Stdin::Null), Err(JailError::Spec(_))));
}
jail_test!(allow_list_mode);

// ---------------------------------------------------------------- network

fn network_is_empty() {
    let j = jail();
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = host.local_addr().unwrap().port();
    let code = probe(&format!(
        r#"
def conn(addr):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(addr)
tryit("socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
tryit("loopback", lambda: conn(("127.0.0.1", {port})))
tryit("oneone", lambda: conn(("1.1.1.1", 80)))
tryit("metadata", lambda: conn(("169.254.169.254", 80)))
"#
    ));
    // NetMode::None: no IP socket at all.
    let out = text(&run_ok(&j, &py("net", &code), Stdin::Null).stdout);
    for k in ["socket", "loopback", "oneone", "metadata"] {
        assert_eq!(field(&out, k), "EPERM", "{k}\n{out}");
    }
    // With IP sockets allowed (doors with nothing requested) the namespace
    // itself must refuse: the host's listener is not there, and there is
    // no route off the machine.
    let mut spec = py("net", &code);
    spec.network = NetMode::Doors(DoorRequest::default());
    spec.landlock = false;
    let out = text(&run_ok(&j, &spec, Stdin::Null).stdout);
    assert_eq!(field(&out, "socket"), "ok");
    assert_eq!(field(&out, "loopback"), "ECONNREFUSED", "{out}");
    assert_eq!(field(&out, "oneone"), "ENETUNREACH", "{out}");
    assert_eq!(field(&out, "metadata"), "ENETUNREACH", "{out}");
    // Control: the host listener is really there.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
}
jail_test!(network_is_empty);

fn network_namespace_pool() {
    let j = jail();
    // A root broker lends pooled namespaces; an unprivileged one cannot.
    assert_eq!(j.pools_network_namespaces(), privileged(&j));
    let code = probe(
        r#"
import fcntl, time
print("netns", os.readlink("/proc/self/ns/net"))
def owner():
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    u = fcntl.ioctl(fd, 0xb701)  # NS_GET_USERNS
    print("owner", "self" if os.fstat(u).st_ino == os.stat("/proc/self/ns/user").st_ino else "other")
tryit("owner_ioctl", owner)
def peer():
    c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    c.connect("\0cordon-netns-pool")
tryit("connect_before", peer)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
tryit("bind", lambda: s.bind("\0cordon-netns-pool"))
s.listen(1)
tryit("connect_after", peer)
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 0)
"#,
    );
    let own_ns = std::fs::read_link("/proc/self/ns/net").unwrap();
    let run = |hold: &str| {
        let mut spec = py("netns", &code);
        spec.argv.push(hold.into());
        text(&run_ok(&j, &spec, Stdin::Null).stdout)
    };
    // Sequential calls: the abstract socket of the first is gone in the
    // second (in the same namespace when pooled), and the name is free.
    let first = run("0");
    let second = run("0");
    for out in [&first, &second] {
        assert_ne!(field(out, "netns"), own_ns.to_string_lossy(), "{out}");
        assert_eq!(field(out, "connect_before"), "ECONNREFUSED", "{out}");
        assert_eq!(field(out, "bind"), "ok", "{out}");
        // Control: the socket works while its owner lives.
        assert_eq!(field(out, "connect_after"), "ok", "{out}");
        if j.pools_network_namespaces() {
            // Owned by the broker's user namespace, outside the sandbox's
            // scope: the tool has no capability over it.
            assert_eq!(field(out, "owner_ioctl"), "EPERM", "{out}");
        } else {
            assert_eq!(field(out, "owner"), "self", "{out}");
        }
    }
    if j.pools_network_namespaces() {
        assert_eq!(
            field(&first, "netns"),
            field(&second, "netns"),
            "the pool should have lent the same namespace twice"
        );
    }
    // Control for the ownership check: a sandbox with doors gets a fresh
    // namespace owned by its own user namespace.
    let mut doors = py("netns", &code);
    doors.network = NetMode::Doors(DoorRequest::default());
    doors.landlock = false;
    let out = text(&run_ok(&j, &doors, Stdin::Null).stdout);
    assert_eq!(field(&out, "owner"), "self", "{out}");
    // Two sandboxes at once never share a namespace.
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| run("1"));
        let b = s.spawn(|| run("1"));
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_ne!(field(&a, "netns"), field(&b, "netns"), "{a}\n{b}");
    for out in [&a, &b] {
        assert_eq!(field(out, "connect_before"), "ECONNREFUSED", "{out}");
        assert_eq!(field(out, "bind"), "ok", "{out}");
    }
}
jail_test!(network_namespace_pool);

fn doors_hand_sockets_to_the_broker() {
    let j = jail();
    let tcp_addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)), 8080);
    let udp_addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)), 5353);
    let mut spec = py(
        "doors",
        &probe(
            r#"
s = socket.create_connection(("198.18.0.1", 8080), timeout=10)
print("tcp", s.recv(100).decode())
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.settimeout(10)
u.sendto(b"ping", ("198.18.0.1", 5353))
print("udp", u.recvfrom(100)[0].decode())
tryit("outside", lambda: socket.create_connection(("1.1.1.1", 80), timeout=5))
"#,
        ),
    );
    spec.network = NetMode::Doors(DoorRequest {
        local_cidrs: vec![(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 0)), 15)],
        tcp: vec![tcp_addr],
        udp: vec![udp_addr],
        local_addresses: false,
    });
    let mut handles = Vec::new();
    let o = j
        .run_with_doors(&spec, Stdin::Null, |fds| {
            assert_eq!(fds.len(), 2);
            let mut it = fds.into_iter();
            let l = TcpListener::from(it.next().unwrap());
            assert_eq!(l.local_addr().unwrap(), tcp_addr);
            let u = UdpSocket::from(it.next().unwrap());
            assert_eq!(u.local_addr().unwrap(), udp_addr);
            handles.push(std::thread::spawn(move || {
                let (mut c, _) = l.accept().unwrap();
                c.write_all(b"door-ok").unwrap();
            }));
            handles.push(std::thread::spawn(move || {
                let mut b = [0u8; 16];
                let (n, from) = u.recv_from(&mut b).unwrap();
                assert_eq!(&b[..n], b"ping");
                u.send_to(b"pong", from).unwrap();
            }));
        })
        .unwrap();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(o.status, Status::Ok, "{} {}", o.reason, text(&o.stderr));
    let out = text(&o.stdout);
    assert_eq!(field(&out, "tcp"), "door-ok");
    assert_eq!(field(&out, "udp"), "pong");
    assert_eq!(field(&out, "outside"), "ENETUNREACH");
}
jail_test!(doors_hand_sockets_to_the_broker);

/// With `local_addresses`, the broker gets an rtnetlink socket of the
/// sandbox's namespace: an address it adds there leads to the door, with
/// that address as the accepted socket's local address; any other address
/// still has no route (the metadata address included).
fn doors_make_added_addresses_local() {
    use std::os::fd::AsFd;
    let j = jail();
    let door = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 8080);
    let answered = Ipv4Addr::new(93, 184, 216, 34);
    let mut spec = py(
        "doors-local",
        &probe(
            r#"
s = socket.create_connection(("93.184.216.34", 8080), timeout=10)
print("answered", s.recv(100).decode())
tryit("unanswered", lambda: socket.create_connection(("1.1.1.1", 8080), timeout=5))
tryit("metadata", lambda: socket.create_connection(("169.254.169.254", 8080), timeout=5))
"#,
        ),
    );
    spec.network = NetMode::Doors(DoorRequest {
        local_cidrs: vec![],
        tcp: vec![door],
        udp: vec![],
        local_addresses: true,
    });
    let mut handles = Vec::new();
    let o = j
        .run_with_doors(&spec, Stdin::Null, |fds| {
            assert_eq!(fds.len(), 2);
            let mut it = fds.into_iter();
            let l = TcpListener::from(it.next().unwrap());
            let nl = it.next().unwrap();
            cordon_sys::net::add_local_address(nl.as_fd(), IpAddr::V4(answered), 32, 1).unwrap();
            // Adding it again is not an error.
            cordon_sys::net::add_local_address(nl.as_fd(), IpAddr::V4(answered), 32, 2).unwrap();
            handles.push(std::thread::spawn(move || {
                let (mut c, _) = l.accept().unwrap();
                let local = c.local_addr().unwrap();
                c.write_all(format!("door-ok {local}").as_bytes()).unwrap();
            }));
        })
        .unwrap();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(o.status, Status::Ok, "{} {}", o.reason, text(&o.stderr));
    let out = text(&o.stdout);
    assert_eq!(
        field(&out, "answered"),
        "door-ok 93.184.216.34:8080",
        "{out}"
    );
    assert_eq!(field(&out, "unanswered"), "ENETUNREACH", "{out}");
    assert_eq!(field(&out, "metadata"), "ENETUNREACH", "{out}");
}
jail_test!(doors_make_added_addresses_local);

// -------------------------------------------------------------- resources

fn within_wall(o: &Outcome, wall: Duration) {
    assert!(
        o.duration <= wall + Duration::from_secs(1),
        "took {:?} with wall {:?}",
        o.duration,
        wall
    );
}

fn memory_bomb() {
    let j = jail();
    let mut spec = py("bomb", "b = b'x' * (1 << 30)\nprint(len(b))");
    spec.limits.memory_bytes = 64 << 20;
    spec.limits.wall = Duration::from_secs(20);
    let o = j.run(&spec, Stdin::Null).unwrap();
    within_wall(&o, spec.limits.wall);
    assert!(o.stdout.is_empty());
    if cgroup_limits(&j) {
        assert_eq!(
            o.status,
            Status::MemoryLimit,
            "{} {}",
            o.reason,
            text(&o.stderr)
        );
        assert_eq!(o.reason, "bomb: memory limit 64M exceeded (OOM kill)");
        assert_eq!(o.signal, Some(libc::SIGKILL));
        assert!(o.peak_memory_bytes.unwrap() <= 64 << 20);
    } else {
        // RLIMIT_DATA: the allocation fails inside the tool, which says so.
        assert_eq!(o.status, Status::MemoryLimit, "{}", o.reason);
        assert_eq!(
            o.reason,
            "bomb: memory limit 64M exceeded (an allocation failed under RLIMIT_DATA, the limit without cgroups: \"MemoryError\")"
        );
        assert!(
            text(&o.stderr).contains("MemoryError"),
            "{}",
            text(&o.stderr)
        );
        assert!(
            o.warnings.iter().any(|w| w.contains("RLIMIT_DATA")),
            "{:?}",
            o.warnings
        );
    }
}
jail_test!(memory_bomb);

/// A jail on the rlimit fallback as root too (cgroups turned off), as an
/// unprivileged broker here has it anyway.
fn fallback_jail() -> Jail {
    let _g = NEW_JAIL.read().unwrap_or_else(|e| e.into_inner());
    let j = Jail::with_options(JailOptions {
        cgroups: false,
        ..Default::default()
    })
    .expect("Jail::with_options");
    assert!(!j.uses_cgroups());
    j
}

/// The largest resident set of any process this (test) process has reaped,
/// sandboxes included: measured by the kernel, not by cordon.
fn children_max_rss() -> u64 {
    // SAFETY: getrusage fills the zeroed struct it is given.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out pointer.
    assert_eq!(
        unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut ru) },
        0
    );
    ru.ru_maxrss as u64 * 1024
}

/// Without cgroups, a memory bomb is stopped by RLIMIT_DATA within the
/// limit plus a small margin (the interpreter's own text and libraries),
/// measured by the kernel's count of the sandbox's resident set, and is
/// reported as the memory limit. Positive control: the same loop with a
/// smaller goal finishes.
fn fallback_memory_bomb_is_stopped_at_the_limit() {
    let j = fallback_jail();
    let limit: u64 = 256 << 20;
    let bomb = |goal_mib: u64| {
        let mut spec = py(
            "bomb",
            &format!(
                "import sys\nl = []\nfor i in range({goal_mib}):\n    l.append(bytearray(1 << 20))\nprint(len(l))"
            ),
        );
        spec.limits.memory_bytes = limit;
        // Room for slow (emulated) hosts: the bomb is stopped by its memory
        // limit, not by the clock.
        spec.limits.wall = Duration::from_secs(120);
        spec
    };
    let o = run_ok(&j, &bomb(64), Stdin::Null);
    assert_eq!(text(&o.stdout), "64\n");
    let before = children_max_rss();
    assert!(before >= 64 << 20, "control reached {before} bytes");
    let o = j.run(&bomb(4096), Stdin::Null).unwrap();
    assert_eq!(
        o.status,
        Status::MemoryLimit,
        "{} {}",
        o.reason,
        text(&o.stderr)
    );
    assert!(
        o.reason.starts_with(
            "bomb: memory limit 256M exceeded (an allocation failed under RLIMIT_DATA"
        ),
        "{}",
        o.reason
    );
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
    // The body runs in a process of its own (see `jail_test!`), so the
    // largest resident set is this bomb's.
    let peak = children_max_rss();
    assert!(
        peak >= limit - (32 << 20) && peak <= limit + (32 << 20),
        "resident set {} MiB under a {} MiB limit",
        peak >> 20,
        limit >> 20
    );
}
jail_test!(fallback_memory_bomb_is_stopped_at_the_limit);

/// Without cgroups, address space that is only reserved does not count
/// (V8, the JVM and Go reserve far more than they use): 8 GiB reserved and
/// 16 MiB written pass under a 64 MiB limit, 128 MiB written do not.
/// Shared mappings, which RLIMIT_DATA does not count, meet the RLIMIT_AS
/// backstop (64 GiB here): 1 GiB maps, 80 GiB does not.
fn fallback_counts_written_memory_not_reservations() {
    let j = fallback_jail();
    let run = |code: &str| {
        let mut spec = py("reserve", code);
        spec.limits.memory_bytes = 64 << 20;
        j.run(&spec, Stdin::Null).unwrap()
    };
    let reserve = "import mmap\nr = mmap.mmap(-1, 8 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, prot=0)\nb = bytearray(__N__ << 20)\nprint('ok')";
    let o = run(&reserve.replace("__N__", "16"));
    assert_eq!(
        (o.status, text(&o.stdout)),
        (Status::Ok, "ok\n".into()),
        "{} {}",
        o.reason,
        text(&o.stderr)
    );
    let o = run(&reserve.replace("__N__", "128"));
    assert_eq!(
        o.status,
        Status::MemoryLimit,
        "{} {}",
        o.reason,
        text(&o.stderr)
    );
    let shared = "import mmap\ntry:\n    mmap.mmap(-1, __N__ << 30, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)\n    print('mapped')\nexcept OSError as e:\n    print('refused', e.errno)";
    let o = run(&shared.replace("__N__", "1"));
    assert_eq!(
        text(&o.stdout),
        "mapped\n",
        "{} {}",
        o.reason,
        text(&o.stderr)
    );
    let o = run(&shared.replace("__N__", "80"));
    assert_eq!(
        text(&o.stdout),
        format!("refused {}\n", libc::ENOMEM),
        "{} {}",
        o.reason,
        text(&o.stderr)
    );
    assert!(
        o.warnings
            .iter()
            .any(|w| w.contains("RLIMIT_AS backstop of 64G")),
        "{:?}",
        o.warnings
    );
}
jail_test!(fallback_counts_written_memory_not_reservations);

/// Without cgroups, a tool that crashes is not a bare "killed by signal":
/// the reason names the fallback and the way to real limits. A failure
/// that says nothing of memory stays a plain exit (the control), and with
/// a memory cgroup (root here) a crash is reported as it is.
fn fallback_crash_names_the_fallback() {
    let j = fallback_jail();
    let o = j
        .run(
            &py("crash", "import ctypes\nctypes.string_at(0)"),
            Stdin::Null,
        )
        .unwrap();
    assert_eq!(
        (o.status, o.signal),
        (Status::Exited, Some(libc::SIGSEGV)),
        "{}",
        o.reason
    );
    assert!(
        o.reason.starts_with("crash: killed by signal 11 (SIGSEGV); without cgroups memory is capped per process by RLIMIT_DATA at 512M")
            && o.reason.contains("see `cordon doctor`"),
        "{}",
        o.reason
    );
    let o = j
        .run(
            &py("fail", "import sys\nsys.exit('bad input')"),
            Stdin::Null,
        )
        .unwrap();
    assert_eq!(
        (o.status, o.reason.as_str()),
        (Status::Exited, "fail: exit 1")
    );
    let j = jail();
    if j.uses_cgroups() {
        let o = j
            .run(
                &py("crash", "import ctypes\nctypes.string_at(0)"),
                Stdin::Null,
            )
            .unwrap();
        assert_eq!(
            (o.status, o.reason.as_str()),
            (Status::Exited, "crash: killed by signal 11")
        );
    }
}
jail_test!(fallback_crash_names_the_fallback);

fn fork_bomb() {
    let j = jail();
    let mut spec = sh(
        "forkbomb",
        "i=0; while [ $i -lt 200 ]; do sleep 30 & i=$((i+1)); done; wait",
    );
    spec.limits.tasks = 16;
    spec.limits.wall = Duration::from_secs(20);
    let o = j.run(&spec, Stdin::Null).unwrap();
    within_wall(&o, spec.limits.wall);
    assert!(text(&o.stderr).contains("fork"), "{}", text(&o.stderr));
    if cgroup_limits(&j) {
        assert_eq!(
            o.status,
            Status::TaskLimit,
            "{} {}",
            o.reason,
            text(&o.stderr)
        );
        assert_eq!(o.reason, "forkbomb: task limit 16 reached");
    } else {
        assert_eq!(o.status, Status::Exited, "{}", o.reason);
        assert!(
            o.warnings.iter().any(|w| w.contains("RLIMIT_NPROC")),
            "{:?}",
            o.warnings
        );
    }
}
jail_test!(fork_bomb);

fn output_cap() {
    let j = jail();
    let mut spec = py(
        "flood",
        "import sys\nb = b'x' * (1 << 20)\nfor _ in range(100): sys.stdout.buffer.write(b)",
    );
    spec.limits.output_bytes = 1_000_000;
    let o = j.run(&spec, Stdin::Null).unwrap();
    within_wall(&o, spec.limits.wall);
    assert_eq!(o.status, Status::OutputCap, "{}", o.reason);
    assert_eq!(o.reason, "flood: output over cap (1000000 bytes)");
    assert_eq!(o.stdout.len(), 1_000_000);
    assert!(o.output_bytes > 1_000_000);
    // Control: exactly at the cap is fine.
    let mut spec = py("exact", "import sys; sys.stdout.write('y' * 1000)");
    spec.limits.output_bytes = 1000;
    assert_eq!(run_ok(&j, &spec, Stdin::Null).stdout.len(), 1000);
}
jail_test!(output_cap);

/// A sandbox killed through its cgroup (cgroup.kill on v2) leaves a slot
/// that must not be reused: the next sandbox born into it would be killed
/// at once. Each call after a kill must run normally.
fn calls_after_a_kill_run_normally() {
    let j = jail();
    for i in 0..3 {
        kill_then_call(&j, &format!("after-{i}"));
    }
}

/// A call killed at its wall limit (through the whole cgroup), then a call
/// that must run normally and print `tag`.
fn kill_then_call(j: &Jail, tag: &str) {
    let mut spin = sh("spin", "while :; do :; done");
    spin.limits.wall = Duration::from_millis(300);
    let o = j.run(&spin, Stdin::Null).unwrap();
    assert_eq!(o.status, Status::TimedOut, "{}", o.reason);
    let o = run_ok(j, &sh("after", &format!("echo {tag}")), Stdin::Null);
    assert_eq!(text(&o.stdout), format!("{tag}\n"));
}
jail_test!(calls_after_a_kill_run_normally);

fn shared_jail() -> Jail {
    Jail::with_options(JailOptions {
        share_cgroup_slots: true,
        ..Default::default()
    })
    .expect("Jail::with_options")
}

/// The host's facts for a test that needs cgroups, or `None` (when
/// skipping is allowed) when not run as root. A jail is made first, so
/// that on a pure v2 host with systemd the facts are those under this
/// process's delegated scope.
fn cgroup_host(test: &str) -> Option<host::HostFacts> {
    if euid() != 0 {
        skip_or_fail(test, "needs root for cgroups");
        return None;
    }
    drop(jail());
    Some(host::detect())
}

/// Directories under `base` that hold a process whose command line
/// contains `marker` now.
fn dirs_holding(base: &std::path::Path, marker: &str) -> Vec<String> {
    std::fs::read_dir(base)
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read_to_string(e.path().join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .any(|pid| {
                    std::fs::read(format!("/proc/{}/cmdline", pid.trim()))
                        .map(|c| String::from_utf8_lossy(&c).contains(marker))
                        .unwrap_or(false)
                })
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect()
}

#[test]
/// Shared slots (one-shot brokers): two jails at once never share one, a
/// slot outlives its jail, and one left killed through cgroup.kill by a
/// broker that died before removing it (its marker file says so) is
/// replaced by the next claimant instead of killing every sandbox born
/// into it.
fn shared_cgroup_slots() {
    let Some(facts) = cgroup_host("shared_cgroup_slots") else {
        return;
    };
    let Some(mem) = facts.cgroup_layout.memory.clone() else {
        skip_or_fail("shared_cgroup_slots", "no memory cgroup controller");
        return;
    };
    // Positive control and exclusivity: two jails, two calls at once.
    let (a, b) = (shared_jail(), shared_jail());
    assert!(a.uses_cgroups() && b.uses_cgroups(), "{:?}", a.notes());
    let marker = format!("sharedmark{}", std::process::id());
    let script = |t: &str| format!("sleep 0.6; echo {t} # {marker}");
    let (sa, sb) = (script("a"), script("b"));
    let seen = std::thread::scope(|s| {
        let ha = s.spawn(|| run_ok(&a, &sh("a", &sa), Stdin::Null));
        let hb = s.spawn(|| run_ok(&b, &sh("b", &sb), Stdin::Null));
        std::thread::sleep(Duration::from_millis(300));
        let seen = dirs_holding(&mem.base, &marker);
        assert_eq!(text(&ha.join().unwrap().stdout), "a\n");
        assert_eq!(text(&hb.join().unwrap().stdout), "b\n");
        seen
    });
    assert_eq!(seen.len(), 2, "two sandboxes, one slot: {seen:?}");
    assert!(seen.iter().all(|n| n.starts_with("shared-")), "{seen:?}");
    drop((a, b));
    for n in &seen {
        assert!(mem.base.join(n).exists(), "{n} removed with its jail");
    }

    // A killed slot is replaced within one jail.
    kill_then_call(&shared_jail(), "after");

    // Across processes: every idle shared slot is killed through
    // cgroup.kill and marked, as a broker that died right after the kill
    // would leave it. The next jail must still run its calls.
    let Some(v2) = facts.cgroup_layout.v2_base.clone() else {
        skip_or_fail(
            "shared_cgroup_slots",
            "the kill marker part: no cgroup v2 hierarchy",
        );
        return;
    };
    let locks = std::path::Path::new("/run/cordon/slots");
    let mut poisoned = 0;
    for e in std::fs::read_dir(locks).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(stem) = name.strip_suffix(".lock") else {
            continue;
        };
        let f = std::fs::File::open(e.path()).unwrap();
        if f.try_lock().is_err() {
            continue; // held by a live broker
        }
        let d = v2.join(format!("shared-{stem}"));
        if d.exists() {
            std::fs::write(d.join("cgroup.kill"), "1").unwrap();
            std::fs::write(locks.join(format!("{stem}.killed")), "").unwrap();
            poisoned += 1;
        }
    }
    assert!(poisoned > 0, "no idle shared slot to poison");
    let j = shared_jail();
    for i in 0..3 {
        let o = run_ok(&j, &sh("next", &format!("echo next-{i}")), Stdin::Null);
        assert_eq!(text(&o.stdout), format!("next-{i}\n"));
    }
}

#[test]
/// Two brokers whose sets of cgroup bases differ (here: one without the v2
/// hierarchy, as after a failed v2 probe) but share a v1 base must never
/// claim the same shared directory there: one would count the other's
/// sandbox as left over and kill it.
fn shared_slots_of_different_layouts_never_overlap() {
    let Some(facts) = cgroup_host("shared_slots_of_different_layouts_never_overlap") else {
        return;
    };
    let v1_memory =
        matches!(&facts.cgroup_layout.memory, Some(p) if p.version == cgroup::Version::V1);
    if !v1_memory || facts.cgroup_layout.v2_base.is_none() {
        skip_or_fail(
            "shared_slots_of_different_layouts_never_overlap",
            "needs v1 memory and v2 (a hybrid host)",
        );
        return;
    }
    // The lock directory every shared jail here uses (made by one), so
    // these pools and other tests' jails take turns like brokers would.
    drop(shared_jail());
    let locks = std::path::PathBuf::from("/run/cordon/slots");
    let with_v2 = facts.cgroup_layout.clone();
    let mut without_v2 = with_v2.clone();
    without_v2.v2_base = None;
    let (a, _) = cgroup::Pool::new(with_v2, Some(locks.clone()), true).unwrap();
    let (b, _) = cgroup::Pool::new(without_v2, Some(locks), true).unwrap();
    let (sa, sb) = (a.acquire().unwrap(), b.acquire().unwrap());
    assert!(sa.mem_v1.is_some() && sb.mem_v1.is_some());
    assert_ne!(sa.mem_v1, sb.mem_v1, "two brokers in one memory cgroup");
    a.release(sa);
    b.release(sb);
}

#[test]
/// Sandboxes that move themselves into their v2 cgroup (the path taken
/// where births into it are killed): the sandbox is in the slot's v2
/// directory while it runs, a wall-clock kill ends it, and calls after it
/// run normally.
fn sandboxes_can_move_themselves_into_v2() {
    let Some(facts) = cgroup_host("sandboxes_can_move_themselves_into_v2") else {
        return;
    };
    let Some(v2) = facts.cgroup_layout.v2_base.clone() else {
        skip_or_fail(
            "sandboxes_can_move_themselves_into_v2",
            "no cgroup v2 hierarchy",
        );
        return;
    };
    let j = Jail::with_options(JailOptions {
        born_in_cgroup: false,
        ..Default::default()
    })
    .expect("Jail::with_options");
    assert!(j.uses_cgroups(), "{:?}", j.notes());
    let marker = format!("v2mark{}", std::process::id());
    let script = format!("sleep 0.6; echo moved # {marker}");
    let busy = std::thread::scope(|s| {
        let h = s.spawn(|| run_ok(&j, &sh("v2", &script), Stdin::Null));
        std::thread::sleep(Duration::from_millis(300));
        let busy = dirs_holding(&v2, &marker);
        assert_eq!(text(&h.join().unwrap().stdout), "moved\n");
        busy
    });
    assert_eq!(busy.len(), 1, "sandbox not in its v2 slot: {busy:?}");
    kill_then_call(&j, "after");
}

fn stderr_is_capped_and_counted() {
    let j = jail();
    let mut spec = py(
        "noisy",
        "import sys; sys.stderr.write('e' * 100000); print('done')",
    );
    spec.limits.stderr_bytes = 1000;
    let o = run_ok(&j, &spec, Stdin::Null);
    assert_eq!(o.stderr.len(), 1000);
    assert_eq!(o.stderr_total, 100000);
    assert_eq!(text(&o.stdout), "done\n");
}
jail_test!(stderr_is_capped_and_counted);

fn filling_tmp() {
    let j = jail();
    let mut spec = py(
        "fill",
        &probe(
            r#"
def fill():
    with open("/tmp/big", "wb") as f:
        for _ in range(64):
            f.write(b"z" * (1 << 20))
            f.flush()
tryit("fill", fill)
print("size", os.path.getsize("/tmp/big") >> 20)
"#,
        ),
    );
    spec.limits.disk_bytes = 8 << 20;
    let o = run_ok(&j, &spec, Stdin::Null);
    within_wall(&o, spec.limits.wall);
    let out = text(&o.stdout);
    assert_eq!(field(&out, "fill"), "ENOSPC", "{out}");
    assert!(field(&out, "size").parse::<u64>().unwrap() <= 8);
}
jail_test!(filling_tmp);

fn fd_exhaustion() {
    let j = jail();
    let mut spec = py(
        "fds",
        &probe(
            r#"
fds = []
def grab():
    while True: fds.append(os.open("/dev/null", os.O_RDONLY))
tryit("open", grab)
print("count", len(fds))
"#,
        ),
    );
    spec.limits.nofile = 64;
    let o = run_ok(&j, &spec, Stdin::Null);
    let out = text(&o.stdout);
    assert_eq!(field(&out, "open"), "EMFILE");
    assert!(field(&out, "count").parse::<u64>().unwrap() < 64);
}
jail_test!(fd_exhaustion);

fn busy_loop_times_out() {
    let j = jail();
    let mut spec = sh("spin", "while :; do :; done");
    spec.limits.wall = Duration::from_secs(1);
    let o = j.run(&spec, Stdin::Null).unwrap();
    assert_eq!(o.status, Status::TimedOut);
    assert_eq!(o.reason, "spin: timed out after 1s");
    assert_eq!(o.signal, Some(libc::SIGKILL));
    assert!(o.duration >= spec.limits.wall);
    within_wall(&o, spec.limits.wall);
}
jail_test!(busy_loop_times_out);

fn cpu_quota() {
    // Control of the cpu cgroup: a quota is written and the tool still
    // runs; the throttling itself is a timing property and is covered by
    // the benchmark, not here.
    let j = jail();
    let mut spec = sh("cpu", "echo ok");
    spec.limits.cpu_percent = Some(50);
    let o = run_ok(&j, &spec, Stdin::Null);
    if cgroup_limits(&j) && j.host().cgroup_layout.cpu.is_some() {
        assert!(o.warnings.is_empty(), "{:?}", o.warnings);
    } else {
        assert!(
            o.warnings
                .iter()
                .any(|w| w.contains("cpu quota not enforced"))
        );
    }
}
jail_test!(cpu_quota);

// ------------------------------------------------------------ concurrency

fn concurrent_calls() {
    let j = jail();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..6)
            .map(|t| {
                let j = &j;
                s.spawn(move || {
                    for i in 0..5 {
                        let o = run_ok(j, &sh("c", &format!("echo {t}-{i}")), Stdin::Null);
                        assert_eq!(text(&o.stdout), format!("{t}-{i}\n"));
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
    });
}
jail_test!(concurrent_calls);

// ------------------------------------------------------------ image roots

/// A busybox image (see `cordon_testkit::image`), or None after a skip.
fn busybox_image() -> Option<cordon_testkit::Scratch> {
    if let Some(why) = image::missing() {
        skip_or_fail(&skip::this_test(), &why);
        return None;
    }
    Some(image::busybox())
}

/// `argv` with `rootfs` as the sandbox's root and `PATH=/bin`.
fn image_spec(rootfs: &std::path::Path, argv: &[&str]) -> JailSpec {
    let mut spec = JailSpec::new("img", argv.iter().copied());
    spec.root = Root::Image {
        rootfs: rootfs.to_path_buf(),
        digest: String::new(),
    };
    spec.env[0].1 = "/bin".into();
    spec
}

fn image_sh(rootfs: &std::path::Path, script: &str) -> JailSpec {
    image_spec(rootfs, &["/bin/sh", "-c", script])
}

/// The names in a host directory, sorted.
fn names(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fn image_root_is_what_the_sandbox_sees() {
    let Some(img) = busybox_image() else {
        return;
    };
    let j = jail();
    let o = run_ok(
        &j,
        &image_sh(
            img.path(),
            "ls /; echo --; cat /etc/passwd; echo --; ls /bin; echo --; \
             for p in /proc/[0-9]*; do echo ${p#/proc/}; done; echo --; \
             ls /dev; echo --; pwd",
        ),
        Stdin::Null,
    );
    let out = text(&o.stdout);
    let parts: Vec<&str> = out.split("--\n").collect();
    assert_eq!(parts.len(), 6, "{out}");
    // The image's entries plus the jail's mount points, nothing else.
    assert_eq!(parts[0], "bin\ndev\netc\nproc\ntmp\n", "{out}");
    // The image's /etc, not the host's.
    assert_eq!(parts[1], image::PASSWD);
    let host_passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    let host_first = host_passwd.lines().next().unwrap();
    assert!(!out.contains(host_first), "{out}");
    assert_eq!(parts[2], "busybox\ncat\nid\nls\nsh\n");
    // A fresh /proc of the sandbox's pid namespace, the jail's /dev.
    assert_eq!(parts[3], "1\n");
    for dev in ["null", "zero", "full", "random", "urandom"] {
        assert!(parts[4].lines().any(|l| l == dev), "/dev/{dev}: {out}");
    }
    assert_eq!(parts[5], "/tmp\n");
    // Nothing of the host's system directories.
    let o = j
        .run(
            &image_sh(
                img.path(),
                "ls /usr/lib/x86_64-linux-gnu; ls /usr; ls /lib; ls /etc/shadow",
            ),
            Stdin::Null,
        )
        .unwrap();
    assert_eq!(o.status, Status::Exited, "{}", o.reason);
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
    assert_eq!(
        text(&o.stderr).matches("No such file or directory").count(),
        4,
        "{}",
        text(&o.stderr)
    );
    // Read-only: the image's files, the root, the image's /etc.
    let o = run_ok(
        &j,
        &image_sh(
            img.path(),
            "for p in /bin/x /x /etc/x /bin/busybox; do \
               if echo x > $p; then echo $p written; fi; done 2>&1; \
             echo data > /tmp/ok && cat /tmp/ok",
        ),
        Stdin::Null,
    );
    let out = text(&o.stdout);
    assert_eq!(out.matches("Read-only file system").count(), 4, "{out}");
    assert!(!out.contains("written"), "{out}");
    assert!(out.ends_with("data\n"), "{out}");
    // /tmp is capped at disk_bytes.
    let mut spec = image_sh(
        img.path(),
        "/bin/busybox dd if=/dev/zero of=/tmp/big bs=1048576 count=64 2>&1; \
         echo size $(/bin/busybox stat -c %s /tmp/big)",
    );
    spec.limits.disk_bytes = 8 << 20;
    let out = text(&run_ok(&j, &spec, Stdin::Null).stdout);
    assert!(out.contains("No space left on device"), "{out}");
    let size: u64 = field(&out, "size").parse().unwrap();
    assert!(size > 0 && size <= 8 << 20, "{out}");
    // Nothing was written into the rootfs on the host.
    assert_eq!(names(img.path()), ["bin", "etc"]);
    assert_eq!(
        names(&img.path().join("bin")),
        ["busybox", "cat", "id", "ls", "sh"]
    );
}
jail_test!(image_root_is_what_the_sandbox_sees);

fn image_cwd_and_user() {
    let Some(img) = busybox_image() else {
        return;
    };
    let j = jail();
    // The default: uid 1000, /tmp.
    let o = run_ok(&j, &image_sh(img.path(), "pwd; id -u; id -g"), Stdin::Null);
    assert_eq!(text(&o.stdout), "/tmp\n1000\n1000\n");
    // The image's WorkingDir and User.
    let mut spec = image_sh(img.path(), "pwd; id -un");
    spec.cwd = Some("/etc".into());
    spec.user = Some((4242, 4242));
    let o = run_ok(&j, &spec, Stdin::Null);
    assert_eq!(text(&o.stdout), "/etc\nimageuser\n");
    // uid 0 inside, an unprivileged uid without capabilities outside.
    let marker = format!("imguidmarker{}", std::process::id());
    let (r, mut w) = std::io::pipe().unwrap();
    let mut spec = image_sh(
        img.path(),
        &format!("read x; pwd; id -u; id -g; id -un; : {marker}"),
    );
    spec.cwd = Some("/bin".into());
    spec.user = Some((0, 0));
    std::thread::scope(|s| {
        let h = s.spawn(|| j.run(&spec, Stdin::Fd(OwnedFd::from(r))));
        let pids = wait_for_marker(&marker);
        for pid in pids {
            let st = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
            for key in ["Uid:", "Gid:"] {
                let line = st.lines().find(|l| l.starts_with(key)).unwrap();
                let ids: Vec<u32> = line
                    .split_whitespace()
                    .skip(1)
                    .map(|x| x.parse().unwrap())
                    .collect();
                let (uid, gid) = tool_host_ids();
                let want = if key == "Uid:" { uid } else { gid };
                assert!(
                    ids.iter().all(|&u| u == want),
                    "host-side {key} of the tool: {ids:?}"
                );
            }
            for key in ["CapEff:", "CapPrm:", "CapBnd:"] {
                let cap = st.lines().find(|l| l.starts_with(key)).unwrap();
                assert!(cap.ends_with("0000000000000000"), "{cap}");
            }
        }
        w.write_all(b"go\n").unwrap();
        drop(w);
        let o = h.join().unwrap().unwrap();
        assert_eq!(text(&o.stdout), "/bin\n0\n0\nroot\n");
    });
    // Root inside is root of nothing: the image stays read-only, and
    // what needs a capability is refused.
    let mut spec = image_sh(
        img.path(),
        "echo x > /bin/x 2>&1; /bin/busybox chown 1000 /bin/busybox 2>&1; \
         /bin/busybox hostname evil 2>&1; echo done",
    );
    spec.user = Some((0, 0));
    let out = text(&run_ok(&j, &spec, Stdin::Null).stdout);
    assert!(out.contains("Read-only file system"), "{out}");
    assert!(!out.contains("evil"), "{out}");
    assert!(out.ends_with("done\n"), "{out}");
    let o = run_ok(
        &j,
        &image_sh(img.path(), "cat /proc/sys/kernel/hostname"),
        Stdin::Null,
    );
    assert_eq!(text(&o.stdout), "cordon\n");
    // A working directory the image lacks is a setup error naming it, and
    // preflight says so first.
    let mut spec = image_sh(img.path(), "pwd");
    spec.cwd = Some("/nonexistent".into());
    assert_eq!(
        preflight::preflight(&spec),
        ["img: sandbox setup would fail: chdir /nonexistent: /nonexistent does not exist"]
    );
    assert_eq!(
        setup_error(j.run(&spec, Stdin::Null)),
        ("chdir /nonexistent".to_string(), Errno::ENOENT)
    );
    // The host root takes a working directory too.
    let mut spec = sh("cwd", "pwd");
    spec.cwd = Some("/usr".into());
    assert_eq!(text(&run_ok(&j, &spec, Stdin::Null).stdout), "/usr\n");
}
jail_test!(image_cwd_and_user);

fn distroless_image_runs_its_program_directly() {
    if let Some(why) = image::missing() {
        skip_or_fail(&skip::this_test(), &why);
        return;
    }
    let img = image::distroless();
    let j = jail();
    let spec = image_spec(img.path(), &["/app/busybox", "echo", "distroless"]);
    assert_eq!(preflight::preflight(&spec), Vec::<String>::new());
    let o = run_ok(&j, &spec, Stdin::Null);
    assert_eq!(text(&o.stdout), "distroless\n");
    // Looked up in PATH, too.
    let mut spec = image_spec(img.path(), &["busybox", "ls", "/"]);
    spec.env[0].1 = "/app".into();
    assert_eq!(preflight::preflight(&spec), Vec::<String>::new());
    let o = run_ok(&j, &spec, Stdin::Null);
    assert_eq!(text(&o.stdout), "app\ndev\nproc\ntmp\n");
    // No shell in the image, and none of the host's: refused by preflight
    // and by the sandbox's exec alike.
    for (argv, msg) in [
        (
            &["/bin/sh", "-c", "true"][..],
            "img: program /bin/sh does not exist inside the sandbox (not in the image)",
        ),
        (
            &["/app/sh"],
            "img: program /app/sh does not exist inside the sandbox",
        ),
    ] {
        let spec = image_spec(img.path(), argv);
        assert_eq!(preflight::preflight(&spec), [msg]);
        assert_eq!(
            setup_error(j.run(&spec, Stdin::Null)),
            (format!("execve {}", argv[0]), Errno::ENOENT)
        );
    }
}
jail_test!(distroless_image_runs_its_program_directly);

fn preflight_looks_inside_the_image() {
    let Some(img) = busybox_image() else {
        return;
    };
    let j = jail();
    // Symlinks resolved inside the image: /bin/sh -> busybox.
    for argv in [
        &["/bin/sh", "-c", "true"][..],
        &["sh", "-c", "true"],
        &["/bin/ls"],
    ] {
        let spec = image_spec(img.path(), argv);
        assert_eq!(
            preflight::preflight(&spec),
            Vec::<String>::new(),
            "{argv:?}"
        );
        run_ok(&j, &spec, Stdin::Null);
    }
    // Programs of the host the image does not have.
    let spec = image_spec(img.path(), &["/usr/bin/env"]);
    assert_eq!(
        preflight::preflight(&spec),
        ["img: program /usr/bin/env does not exist inside the sandbox (not in the image)"]
    );
    assert_eq!(
        setup_error(j.run(&spec, Stdin::Null)),
        ("execve /usr/bin/env".to_string(), Errno::ENOENT)
    );
    let spec = image_spec(img.path(), &["python3"]);
    assert_eq!(
        preflight::preflight(&spec),
        ["img: program python3 is not found in PATH (/bin) inside the sandbox"]
    );
    assert_eq!(
        setup_error(j.run(&spec, Stdin::Null)),
        ("execve python3".to_string(), Errno::ENOENT)
    );
    // A script of the image whose interpreter the image lacks.
    let d = tool_dir(&[
        ("ok.sh", b"#!/bin/sh\necho bound script\n", 0o755),
        ("py", b"#!/usr/bin/python3\n", 0o755),
    ]);
    let spec = with_bind(
        image_spec(img.path(), &["/opt/tool/ok.sh"]),
        d.path(),
        "/opt/tool",
    );
    assert_eq!(preflight::preflight(&spec), Vec::<String>::new());
    assert_eq!(
        text(&run_ok(&j, &spec, Stdin::Null).stdout),
        "bound script\n"
    );
    let spec = with_bind(
        image_spec(img.path(), &["/opt/tool/py"]),
        d.path(),
        "/opt/tool",
    );
    assert_eq!(
        preflight::preflight(&spec),
        [
            "img: interpreter /usr/bin/python3 of /opt/tool/py does not exist inside the sandbox (not in the image)"
        ]
    );
    assert_eq!(
        setup_error(j.run(&spec, Stdin::Null)),
        ("execve /opt/tool/py".to_string(), Errno::ENOENT)
    );
}
jail_test!(preflight_looks_inside_the_image);

fn image_limits_hold() {
    let Some(img) = busybox_image() else {
        return;
    };
    let j = jail();
    // Memory: a shell variable doubled until the cap; control: 512 KiB.
    let grow = |n: &str| {
        format!("x=aaaaaaaa; i=0; while [ $i -lt {n} ]; do x=$x$x; i=$((i+1)); done; echo ${{#x}}")
    };
    let mut spec = image_sh(img.path(), &grow("16"));
    spec.limits.memory_bytes = 64 << 20;
    assert_eq!(text(&run_ok(&j, &spec, Stdin::Null).stdout), "524288\n");
    let mut spec = image_sh(img.path(), &grow("40"));
    spec.limits.memory_bytes = 64 << 20;
    // Room for slow (emulated) hosts, where the shell's byte-by-byte copies
    // take longer than the default wall limit to reach 64 MiB: the bomb is
    // stopped by its memory limit, not by the clock.
    spec.limits.wall = Duration::from_secs(120);
    let o = j.run(&spec, Stdin::Null).unwrap();
    within_wall(&o, spec.limits.wall);
    assert!(o.stdout.is_empty(), "{}", text(&o.stdout));
    if cgroup_limits(&j) {
        assert_eq!(
            o.status,
            Status::MemoryLimit,
            "{} {}",
            o.reason,
            text(&o.stderr)
        );
    } else {
        assert_eq!(
            o.status,
            Status::MemoryLimit,
            "{} {}",
            o.reason,
            text(&o.stderr)
        );
        assert!(
            o.warnings.iter().any(|w| w.contains("RLIMIT_DATA")),
            "{:?}",
            o.warnings
        );
    }
    // Tasks: control with a few, then a fork bomb.
    let sleepers = |n: u32, secs: u32| {
        format!(
            "i=0; while [ $i -lt {n} ]; do /bin/busybox sleep {secs} & i=$((i+1)); done; wait; echo waited"
        )
    };
    let mut spec = image_sh(img.path(), &sleepers(4, 0));
    spec.limits.tasks = 16;
    assert_eq!(text(&run_ok(&j, &spec, Stdin::Null).stdout), "waited\n");
    let mut spec = image_sh(img.path(), &sleepers(200, 30));
    spec.limits.tasks = 16;
    let o = j.run(&spec, Stdin::Null).unwrap();
    within_wall(&o, spec.limits.wall);
    assert!(text(&o.stderr).contains("fork"), "{}", text(&o.stderr));
    if cgroup_limits(&j) {
        assert_eq!(
            o.status,
            Status::TaskLimit,
            "{} {}",
            o.reason,
            text(&o.stderr)
        );
    } else {
        assert!(
            o.warnings.iter().any(|w| w.contains("RLIMIT_NPROC")),
            "{:?}",
            o.warnings
        );
    }
    // Wall clock.
    let mut spec = image_sh(img.path(), "while :; do :; done");
    spec.limits.wall = Duration::from_secs(1);
    let o = j.run(&spec, Stdin::Null).unwrap();
    assert_eq!(o.status, Status::TimedOut, "{}", o.reason);
    within_wall(&o, spec.limits.wall);
    // Output: exactly the cap passes, more is cut.
    let mut spec = image_spec(
        img.path(),
        &["/bin/busybox", "head", "-c", "1000", "/dev/zero"],
    );
    spec.limits.output_bytes = 1000;
    assert_eq!(run_ok(&j, &spec, Stdin::Null).stdout.len(), 1000);
    let mut spec = image_spec(img.path(), &["/bin/busybox", "yes"]);
    spec.limits.output_bytes = 1000;
    let o = j.run(&spec, Stdin::Null).unwrap();
    assert_eq!(o.status, Status::OutputCap, "{}", o.reason);
    assert_eq!(o.stdout.len(), 1000);
}
jail_test!(image_limits_hold);

fn image_network() {
    let Some(img) = busybox_image() else {
        return;
    };
    let j = jail();
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = host.local_addr().unwrap().port();
    let nc = |addr: &str| format!("/bin/busybox nc -w 5 {addr} </dev/null 2>&1; echo rc=$?");
    // No network: no IP socket at all, the host's loopback out of reach.
    let spec = image_sh(
        img.path(),
        &format!("{}; {}", nc(&format!("127.0.0.1 {port}")), nc("1.1.1.1 80")),
    );
    let out = text(&run_ok(&j, &spec, Stdin::Null).stdout);
    assert_eq!(out.matches("rc=1").count(), 2, "{out}");
    assert_eq!(out.matches("Operation not permitted").count(), 2, "{out}");
    // Doors: the door answers (the positive control inside the image),
    // nothing else does.
    let door = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 1)), 8080);
    let mut spec = image_sh(
        img.path(),
        &format!(
            "{}; {}; {}",
            nc("198.18.0.1 8080"),
            nc(&format!("127.0.0.1 {port}")),
            nc("1.1.1.1 80")
        ),
    );
    spec.network = NetMode::Doors(DoorRequest {
        local_cidrs: vec![(IpAddr::V4(Ipv4Addr::new(198, 18, 0, 0)), 15)],
        tcp: vec![door],
        udp: vec![],
        local_addresses: false,
    });
    let mut handles = Vec::new();
    let o = j
        .run_with_doors(&spec, Stdin::Null, |fds| {
            let l = TcpListener::from(fds.into_iter().next().unwrap());
            handles.push(std::thread::spawn(move || {
                let (mut c, _) = l.accept().unwrap();
                c.write_all(b"door-ok\n").unwrap();
            }));
        })
        .unwrap();
    for h in handles {
        h.join().unwrap();
    }
    assert_eq!(o.status, Status::Ok, "{} {}", o.reason, text(&o.stderr));
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "door-ok", "{out}");
    assert_eq!(lines[1], "rc=0", "{out}");
    assert!(out.contains("Connection refused"), "{out}");
    assert!(out.contains("Network is unreachable"), "{out}");
    // Control: the host's listener is really there.
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
}
jail_test!(image_network);

fn image_bind_destinations() {
    let Some(img) = busybox_image() else {
        return;
    };
    let j = jail();
    // An absolute symlink in the image: in the sandbox it resolves inside
    // the image; a bind through it would have set up on the host.
    std::os::unix::fs::symlink("/etc", img.path().join("lnk")).unwrap();
    let d = tool_dir(&[("data", b"bound\n", 0o644)]);
    let spec = with_bind(image_sh(img.path(), "cat /lnk/passwd"), d.path(), "/lnk/x");
    let why = "bind destination /lnk/x passes through /lnk, a symlink in the image";
    assert_eq!(preflight::preflight(&spec), [format!("img: {why}")]);
    match j.run(&spec, Stdin::Null) {
        Err(JailError::Spec(m)) => assert_eq!(m, why),
        other => panic!("{other:?}"),
    }
    // Control: without the bind the link works, inside the image.
    let o = run_ok(
        &j,
        &image_sh(img.path(), "cat /lnk/passwd; ls /"),
        Stdin::Null,
    );
    assert_eq!(
        text(&o.stdout),
        format!("{}bin\ndev\netc\nlnk\nproc\ntmp\n", image::PASSWD)
    );
    // A file bound at a new top-level directory, as the probe agent is.
    let spec = with_bind(
        image_spec(img.path(), &["/bin/cat", "/.cordon/data"]),
        &d.path().join("data"),
        "/.cordon/data",
    );
    assert_eq!(preflight::preflight(&spec), Vec::<String>::new());
    assert_eq!(text(&run_ok(&j, &spec, Stdin::Null).stdout), "bound\n");
    // A rootfs the sandbox's uid cannot enter: preflight says so, and the
    // setup fails at its first bind.
    if privileged(&j) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(img.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        let spec = image_sh(img.path(), "true");
        assert_eq!(
            preflight::preflight(&spec),
            [format!(
                "img: image root {} cannot be searched by the sandbox's uid 65534 (mode 0700)",
                img.path().display()
            )]
        );
        assert_eq!(
            setup_error(j.run(&spec, Stdin::Null)),
            (
                "mount the image's /bin read-only".to_string(),
                Errno::EACCES
            )
        );
        std::fs::set_permissions(img.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    // A missing or relative rootfs is a spec error.
    let mut spec = image_sh(img.path(), "true");
    spec.root = Root::Image {
        rootfs: img.path().join("nonexistent"),
        digest: String::new(),
    };
    assert!(matches!(j.run(&spec, Stdin::Null), Err(JailError::Spec(_))));
    assert_eq!(
        preflight::preflight(&spec),
        [format!(
            "img: image root {}/nonexistent does not exist on the host",
            img.path().display()
        )]
    );
    spec.root = Root::Image {
        rootfs: "relative/rootfs".into(),
        digest: String::new(),
    };
    assert!(matches!(j.run(&spec, Stdin::Null), Err(JailError::Spec(_))));
}
jail_test!(image_bind_destinations);

// ---------------------------------------------------------------- cgroups

#[test]
fn stale_cgroup_is_cleaned() {
    let Some(facts) = cgroup_host("stale_cgroup_is_cleaned") else {
        return;
    };
    let Some(mem) = facts.cgroup_layout.memory.clone() else {
        skip_or_fail("stale_cgroup_is_cleaned", "no memory cgroup controller");
        return;
    };
    let g = NEW_JAIL.write().unwrap_or_else(|e| e.into_inner());
    std::fs::create_dir_all(&mem.base).unwrap();
    // pid_max is at most 2^22, so this broker pid never exists.
    let stale = mem.base.join("99999999-0-0");
    std::fs::create_dir_all(&stale).unwrap();
    let j = Jail::new().expect("Jail::new");
    drop(g);
    assert!(
        !stale.exists(),
        "stale cgroup {} still there",
        stale.display()
    );
    assert!(
        j.notes().iter().any(|n| n.contains("removed stale cgroup")),
        "{:?}",
        j.notes()
    );
    // A live broker's slot (ours) is kept.
    assert!(j.uses_cgroups());
}

#[test]
fn host_facts_serialize() {
    let facts = host::detect();
    let json = serde_json::to_value(&facts).unwrap();
    assert!(json["kernel"].as_str().unwrap().len() > 1);
    assert!(json["landlock_abi"].as_i64().unwrap() >= 0);
    assert!(json["mount_setattr"].is_boolean());
    assert!(json["close_range"].is_boolean());
    assert!(
        facts
            .system_dirs
            .iter()
            .any(|d| d.path == std::path::Path::new("/lib"))
    );
}
