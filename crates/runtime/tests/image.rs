//! The native runtime with an image root (`Root::Image`): the image's
//! rootfs, read-only, is the sandbox's `/`, with the jail's `/proc`, `/dev`
//! and `/tmp`; the spec's working directory and user apply; every limit
//! and the network stay as for the host root. The images are built here
//! from busybox-static (`cordon_testkit::image`).

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use cordon_runtime::native::Native;
use cordon_runtime::{Context, EgressPolicy, Network, Outcome, Root, Runtime, SandboxSpec, Status};

use cordon_testkit::image;
use cordon_testkit::skip;

const DIGEST: &str = "sha256:0000000000000000000000000000000000000000000000000000000000000000";

fn native() -> Native {
    Native::new(Default::default()).expect("native runtime")
}

/// Whether busybox is there to build the images (else a skip or a failure).
fn can_build(test: &str) -> bool {
    match image::missing() {
        None => true,
        Some(why) => {
            skip::skip_or_fail(test, &why);
            false
        }
    }
}

fn spec(rootfs: &Path, argv: &[&str]) -> SandboxSpec {
    let mut spec = SandboxSpec::new("img", argv.iter().copied());
    spec.root = Root::Image {
        rootfs: rootfs.to_path_buf(),
        digest: DIGEST.into(),
    };
    spec.env[0].1 = "/bin".into();
    spec
}

fn sh(rootfs: &Path, script: &str) -> SandboxSpec {
    spec(rootfs, &["/bin/sh", "-c", script])
}

fn run(rt: &Native, spec: &SandboxSpec) -> Outcome {
    rt.run(spec, Vec::new(), &Context::discard("t"))
        .unwrap_or_else(|e| panic!("{}: {e}", spec.tool))
}

fn run_ok(rt: &Native, spec: &SandboxSpec) -> String {
    let o = run(rt, spec);
    assert_eq!(o.status, Status::Ok, "{} {}", o.reason, text(&o.stderr));
    text(&o.stdout)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn euid() -> u32 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = s.lines().find(|l| l.starts_with("Uid:")).unwrap();
    line.split_whitespace().nth(2).unwrap().parse().unwrap()
}

#[test]
fn the_image_is_the_read_only_root() {
    if !can_build("the_image_is_the_read_only_root") {
        return;
    }
    let img = image::busybox();
    let rt = native();
    let s = sh(
        img.path(),
        "ls /; echo --; cat /etc/passwd; echo --; \
         ls /usr/lib/x86_64-linux-gnu /usr /lib 2>&1; echo --; \
         for p in /bin/x /x /etc/passwd; do echo x > $p; done 2>&1; echo --; \
         echo data > /tmp/ok && cat /tmp/ok; \
         /bin/busybox dd if=/dev/zero of=/tmp/big bs=1048576 count=64 2>&1 | /bin/busybox grep -c 'No space'",
    );
    let mut s = s;
    s.limits.disk_bytes = 8 << 20;
    assert!(rt.check(&s).problems.is_empty(), "{:?}", rt.check(&s));
    let out = run_ok(&rt, &s);
    let parts: Vec<&str> = out.split("--\n").collect();
    assert_eq!(parts.len(), 5, "{out}");
    assert_eq!(parts[0], "bin\ndev\netc\nproc\ntmp\n");
    // The image's /etc/passwd, never the host's.
    assert_eq!(parts[1], image::PASSWD);
    let host = std::fs::read_to_string("/etc/passwd").unwrap();
    assert!(!out.contains(host.lines().next().unwrap()), "{out}");
    // None of the host's system directories.
    assert_eq!(
        parts[2].matches("No such file or directory").count(),
        3,
        "{out}"
    );
    assert_eq!(
        parts[3].matches("Read-only file system").count(),
        3,
        "{out}"
    );
    assert_eq!(parts[4], "data\n1\n", "{out}");
    // Nothing was written into the rootfs.
    let mut names: Vec<String> = std::fs::read_dir(img.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["bin", "etc"]);
    assert_eq!(
        std::fs::read_to_string(img.path().join("etc/passwd")).unwrap(),
        image::PASSWD
    );
}

#[test]
fn the_working_directory_and_user_apply() {
    if !can_build("the_working_directory_and_user_apply") {
        return;
    }
    let img = image::busybox();
    let rt = native();
    // The defaults: /tmp, uid and gid 1000 (which the image's passwd
    // does not name).
    let mut s = sh(img.path(), "pwd; id -u; id -g");
    assert_eq!(run_ok(&rt, &s), "/tmp\n1000\n1000\n");
    s.argv[2] = "pwd; id -u; id -g; id -un".into();
    s.cwd = Some("/etc".into());
    s.user = Some((0, 0));
    assert_eq!(run_ok(&rt, &s), "/etc\n0\n0\nroot\n");
    s.user = Some((4242, 4242));
    assert_eq!(run_ok(&rt, &s), "/etc\n4242\n4242\nimageuser\n");
    // A directory the image lacks: refused by the check, a setup error.
    s.cwd = Some("/work".into());
    assert_eq!(
        rt.check(&s).problems,
        ["img: sandbox setup would fail: chdir /work: /work does not exist"]
    );
    let e = rt.run(&s, Vec::new(), &Context::discard("t")).unwrap_err();
    assert!(e.to_string().contains("chdir /work: ENOENT"), "{e}");
    // uid 0 inside is an unprivileged uid without capabilities on the host.
    let marker = format!("imgrtmarker{}", std::process::id());
    let mut s = sh(img.path(), &format!("read x; id -u; : {marker}"));
    s.user = Some((0, 0));
    let spawned = rt.spawn(&s, &Context::discard("t")).expect("spawn");
    let pid = wait_for(&marker);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let want = if euid() == 0 { 65534 } else { euid() };
    for key in ["Uid:", "Gid:"] {
        let ids: Vec<u32> = status
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap()
            .split_whitespace()
            .skip(1)
            .map(|x| x.parse().unwrap())
            .collect();
        if key == "Uid:" {
            assert!(ids.iter().all(|&u| u == want), "{key} {ids:?}");
        } else if euid() == 0 {
            assert!(ids.iter().all(|&g| g == 65534), "{key} {ids:?}");
        }
    }
    for key in ["CapEff:", "CapPrm:", "CapBnd:"] {
        let l = status.lines().find(|l| l.starts_with(key)).unwrap();
        assert!(l.ends_with("0000000000000000"), "{l}");
    }
    let mut w = spawned.stream.try_clone().unwrap();
    w.write_all(b"go\n").unwrap();
    let mut line = String::new();
    BufReader::new(spawned.stream).read_line(&mut line).unwrap();
    assert_eq!(line, "0\n");
    assert_eq!(spawned.handle.wait().unwrap().status, Status::Ok);
}

/// The host pid of the process whose command line holds `marker`.
fn wait_for(marker: &str) -> i32 {
    for _ in 0..2000 {
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
                return pid;
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    panic!("marker {marker} never appeared");
}

#[test]
fn a_distroless_image_runs_its_program_directly() {
    if !can_build("a_distroless_image_runs_its_program_directly") {
        return;
    }
    let img = image::distroless();
    let rt = native();
    let s = spec(img.path(), &["/app/busybox", "ls", "/"]);
    assert!(rt.check(&s).problems.is_empty(), "{:?}", rt.check(&s));
    assert_eq!(run_ok(&rt, &s), "app\ndev\nproc\ntmp\n");
    // No shell: refused by the check, and by the sandbox.
    let s = spec(img.path(), &["/bin/sh", "-c", "true"]);
    assert_eq!(
        rt.check(&s).problems,
        ["img: program /bin/sh does not exist inside the sandbox (not in the image)"]
    );
    let e = rt.run(&s, Vec::new(), &Context::discard("t")).unwrap_err();
    assert!(e.to_string().contains("execve /bin/sh: ENOENT"), "{e}");
}

#[test]
fn limits_hold_in_an_image() {
    if !can_build("limits_hold_in_an_image") {
        return;
    }
    let img = image::busybox();
    let rt = native();
    let privileged = euid() == 0;
    let grow = |n: u32| {
        format!("x=aaaaaaaa; i=0; while [ $i -lt {n} ]; do x=$x$x; i=$((i+1)); done; echo ${{#x}}")
    };
    let mut s = sh(img.path(), &grow(16));
    s.limits.memory_bytes = 64 << 20;
    assert_eq!(run_ok(&rt, &s), "524288\n");
    let mut s = sh(img.path(), &grow(40));
    s.limits.memory_bytes = 64 << 20;
    let o = run(&rt, &s);
    assert!(o.stdout.is_empty());
    assert_eq!(
        o.status,
        if privileged {
            Status::MemoryLimit
        } else {
            Status::Exited
        },
        "{} {}",
        o.reason,
        text(&o.stderr)
    );
    let sleepers = |n: u32, secs: u32| {
        format!(
            "i=0; while [ $i -lt {n} ]; do /bin/busybox sleep {secs} & i=$((i+1)); done; wait; echo waited"
        )
    };
    let mut s = sh(img.path(), &sleepers(4, 0));
    s.limits.tasks = 16;
    assert_eq!(run_ok(&rt, &s), "waited\n");
    let mut s = sh(img.path(), &sleepers(200, 30));
    s.limits.tasks = 16;
    let o = run(&rt, &s);
    assert!(text(&o.stderr).contains("fork"), "{}", text(&o.stderr));
    if privileged {
        assert_eq!(o.status, Status::TaskLimit, "{}", o.reason);
    }
    let mut s = sh(img.path(), "while :; do :; done");
    s.limits.wall = Duration::from_secs(1);
    let o = run(&rt, &s);
    assert_eq!(o.status, Status::TimedOut, "{}", o.reason);
    assert!(o.duration < Duration::from_secs(3), "{:?}", o.duration);
}

#[test]
fn the_network_holds_in_an_image() {
    if !can_build("the_network_holds_in_an_image") {
        return;
    }
    let img = image::busybox();
    let rt = native();
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = host.local_addr().unwrap().port();
    // No network: no IP socket; control: the host's listener is there.
    let s = sh(
        img.path(),
        &format!("/bin/busybox nc -w 5 127.0.0.1 {port} </dev/null 2>&1; echo rc=$?"),
    );
    let out = run_ok(&rt, &s);
    assert!(
        out.contains("Operation not permitted") && out.contains("rc=1"),
        "{out}"
    );
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    // Egress doors: the proxy door answers inside the image (the control)
    // and refuses a host the policy does not allow; the host's loopback
    // is not the sandbox's.
    let mut s = sh(
        img.path(),
        &format!(
            "(printf 'CONNECT other.example:443 HTTP/1.1\\r\\nHost: other.example:443\\r\\n\\r\\n'; \
               /bin/busybox sleep 1) | /bin/busybox nc -w 5 127.0.0.1 3128 | /bin/busybox head -n 1; \
             /bin/busybox nc -w 5 127.0.0.1 {port} </dev/null 2>&1; echo rc=$?"
        ),
    );
    s.network = Network::Doors(Box::new(
        EgressPolicy::allowlist("img", ["allowed.example:443"]).unwrap(),
    ));
    let out = run_ok(&rt, &s);
    let first = out.lines().next().unwrap_or("");
    assert!(first.starts_with("HTTP/1.1 403"), "{out}");
    assert!(
        out.contains("Connection refused") && out.contains("rc=1"),
        "{out}"
    );
}
