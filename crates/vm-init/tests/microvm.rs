//! Real guests: QEMU `-M microvm` under TCG, Debian's cloud kernel, the
//! static init, and a busybox root as an EROFS image. Everything comes from
//! `scripts/setup.sh`; a missing piece fails the test with that name.
//!
//! Each cold boot costs about 2 s of CPU under TCG; the tests share one
//! initramfs, one image and one template snapshot, and at most two guests
//! run at once.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use cordon_vm_init::image::{self, BlockImage, FileId, FsKind, ImageError};
use cordon_vm_init::protocol::{Limits, Task};
use cordon_vm_init::qemu::{self, Accel, Outcome, Snapshot, Vm, VmConfig, VmError};
use cordon_vm_init::{image::find_tool, initramfs};

struct Env {
    _dir: cordon_testkit::Scratch,
    root: PathBuf,
    cfg: VmConfig,
    store: PathBuf,
    rootfs: PathBuf,
}

fn need(what: &str, ok: bool) {
    assert!(ok, "{what} missing: run scripts/setup.sh");
}

fn newest_kernel() -> PathBuf {
    let mut kernels: Vec<PathBuf> = std::fs::read_dir("/boot")
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .and_then(|n| n.to_str())
                        .is_some_and(|n| n.starts_with("vmlinuz-") && n.ends_with("-cloud-amd64"))
                })
                .collect()
        })
        .unwrap_or_default();
    kernels.sort();
    let k = kernels.pop();
    need("the guest kernel (linux-image-cloud-amd64)", k.is_some());
    k.unwrap()
}

/// A busybox root: `/bin/busybox` and its applets as links.
fn busybox_root(root: &Path) {
    let bin = root.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for d in ["etc", "tmp", "proc", "dev"] {
        std::fs::create_dir_all(root.join(d)).unwrap();
    }
    std::fs::copy("/bin/busybox", bin.join("busybox")).unwrap();
    for applet in [
        "sh",
        "echo",
        "cat",
        "head",
        "od",
        "date",
        "sleep",
        "true",
        "id",
        "ls",
        "grep",
        "touch",
        "wget",
        "sha256sum",
        "wc",
    ] {
        std::os::unix::fs::symlink("busybox", bin.join(applet)).unwrap();
    }
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let qemu = find_tool("qemu-system-x86_64");
        need(
            "qemu-system-x86_64 (qemu-system-x86, bookworm-backports)",
            qemu.is_some(),
        );
        need(
            "mkfs.erofs (erofs-utils)",
            find_tool("mkfs.erofs").is_some(),
        );
        need(
            "/bin/busybox (busybox-static)",
            Path::new("/bin/busybox").is_file(),
        );
        let kernel = newest_kernel();
        let release = initramfs::kernel_release(&kernel).unwrap();
        let moddir = PathBuf::from(format!("/lib/modules/{release}"));
        need(
            "the guest kernel's modules",
            moddir.join("modules.dep").is_file(),
        );

        let dir = cordon_testkit::scratch();
        let init = cordon_testkit::vm::init().clone();
        let initrd = dir.path().join("initramfs.cpio");
        initramfs::build(&init, Some(&moddir), &initrd).unwrap();
        let rootfs = dir.path().join("rootfs");
        busybox_root(&rootfs);
        let store = dir.path().join("images");
        let image = image::build(&rootfs, &store, FsKind::Erofs).unwrap();
        let qemu = qemu.unwrap();
        let sandbox = qemu::qemu_has_sandbox(&qemu);
        let cfg = VmConfig {
            qemu,
            kernel,
            initramfs: initrd,
            image,
            memory_mib: 256,
            cpus: 1,
            accel: Accel::Tcg,
            tsc_khz: qemu::host_tsc_khz(),
            sandbox,
            // CORDON_TEST_VM_APPEND="loglevel=7 printk.time=1" shows the
            // boot in the console logs kept beside the test's guests.
            extra_append: std::env::var("CORDON_TEST_VM_APPEND")
                .map(|a| a.split_whitespace().map(str::to_owned).collect())
                .unwrap_or_default(),
            boot_timeout: Duration::from_secs(120),
            image_verified: false,
            carry: None,
        };
        Env {
            root: dir.path().to_owned(),
            _dir: dir,
            cfg,
            store,
            rootfs,
        }
    })
}

/// At most two guests at once (two cores).
fn slot() -> MutexGuard<'static, ()> {
    static SLOTS: [Mutex<()>; 2] = [Mutex::new(()), Mutex::new(())];
    loop {
        for s in &SLOTS {
            if let Ok(g) = s.try_lock() {
                return g;
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn run_dir(name: &str) -> PathBuf {
    env().root.join("run").join(name)
}

fn task(argv: &[&str]) -> Task {
    Task {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: vec![("PATH".into(), "/bin".into())],
        cwd: "/".into(),
        uid: 1000,
        gid: 1000,
        limits: Limits {
            memory_mib: Some(128),
            pids: Some(64),
            ..Limits::default()
        },
        entropy: String::new(),
        time_ns: 0,
        net: Vec::new(),
        seccomp: Vec::new(),
        trust: None,
        doors: None,
    }
}

const WALL: Duration = Duration::from_secs(60);
const CAP: usize = 1 << 20;

fn cold(name: &str, t: &Task, stdin: &[u8], wall: Duration) -> qemu::RunResult {
    let e = env();
    let _slot = slot();
    let vm = Vm::boot(&e.cfg, &run_dir(name)).unwrap();
    eprintln!("{name}: cold boot to ready {:?}", vm.ready_after);
    if std::env::var_os("CORDON_TEST_VM_APPEND").is_some() {
        let _ = std::fs::copy(
            vm.console_log(),
            cordon_testkit::scratch::root().join(format!("cordon-vm-{name}.log")),
        );
    }
    let r = vm.run(t, stdin.to_vec(), wall, CAP).unwrap();
    eprintln!(
        "{name}: {:?} task {:?}, start to status {:?}",
        r.outcome, r.task_time, r.since_start
    );
    r
}

#[test]
fn echo_hi_from_an_erofs_image() {
    let r = cold("echo", &task(&["/bin/echo", "hi"]), b"", WALL);
    assert_eq!(
        r.outcome,
        Outcome::Exited(0),
        "stderr: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert_eq!(r.stdout, b"hi\n");
    assert!(r.stderr.is_empty());
}

#[test]
fn exit_status_stdin_and_the_tools_view() {
    // stdin arrives binary-clean with its EOF; stderr is its own stream;
    // the tool runs as its uid without capabilities, on a read-only root
    // with a writable /tmp and no virtio device nodes.
    let script = "cat; id -u; id -g; grep -E '^(CapEff|NoNewPrivs)' /proc/self/status >&2; \
                  touch /x 2>/dev/null && echo root-writable; echo t > /tmp/t && cat /tmp/t; \
                  ls /dev >&2; exit 3";
    let mut t = task(&["sh", "-c", script]);
    t.env.push(("X".into(), "y".into()));
    let stdin: Vec<u8> = (0..=255u8).chain(0..=255u8).collect();
    let r = cold("exit3", &t, &stdin, WALL);
    assert_eq!(
        r.outcome,
        Outcome::Exited(3),
        "stderr: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    let (echoed, rest) = r.stdout.split_at(stdin.len());
    assert_eq!(echoed, &stdin[..]);
    let rest = String::from_utf8_lossy(rest);
    assert_eq!(
        rest,
        "1000\n1000\nt\n",
        "stderr: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("CapEff:\t0000000000000000"), "{err}");
    assert!(err.contains("NoNewPrivs:\t1"), "{err}");
    assert!(err.contains("null") && err.contains("urandom"), "{err}");
    assert!(!err.contains("vda") && !err.contains("vport"), "{err}");
}

#[test]
fn a_wall_clock_kill_leaves_no_process() {
    let e = env();
    let dir = run_dir("wall");
    let _slot = slot();
    let vm = Vm::boot(&e.cfg, &dir).unwrap();
    let pid = vm.pid();
    let r = vm
        .run(
            &task(&["sleep", "1000"]),
            Vec::new(),
            Duration::from_secs(3),
            CAP,
        )
        .unwrap();
    assert_eq!(r.outcome, Outcome::WallClock);
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "QEMU {pid} still there"
    );
    // No process anywhere still refers to this guest's directory.
    let needle = dir.display().to_string();
    for p in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(cmd) = std::fs::read(p.path().join("cmdline")) {
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            assert!(
                !cmd.contains(&needle),
                "left behind: {} {cmd}",
                p.path().display()
            );
        }
    }
}

#[test]
fn a_corrupted_image_is_refused_before_qemu_starts() {
    let e = env();
    let store = e.root.join("corrupt-store");
    std::fs::create_dir_all(&store).unwrap();
    let img = image::build(&e.rootfs, &store, FsKind::Erofs).unwrap();
    assert_eq!(img.digest, e.cfg.image.digest);
    let mut bytes = std::fs::read(&img.path).unwrap();
    bytes[1024 + 7] ^= 1;
    std::fs::write(&img.path, bytes).unwrap();
    let mut cfg = e.cfg.clone();
    cfg.image = img;
    match Vm::boot(&cfg, &run_dir("corrupt")) {
        Err(VmError::Image(ImageError::Corrupt { .. })) => {}
        Err(other) => panic!("wrong error: {other}"),
        Ok(_) => panic!("a corrupted image booted"),
    }
    assert!(matches!(
        BlockImage::open(&store, &cfg.image.digest),
        Err(ImageError::Corrupt { .. })
    ));
    // The store's good copy is untouched.
    assert!(BlockImage::open(&e.store, &e.cfg.image.digest).is_ok());
}

/// One template per test run: booted cold with its RAM in a file,
/// snapshotted while its init waits for a task.
fn template() -> &'static Snapshot {
    static SNAP: OnceLock<Snapshot> = OnceLock::new();
    SNAP.get_or_init(|| {
        let e = env();
        let _slot = slot();
        let vm = Vm::boot_template(
            &e.cfg,
            &run_dir("template"),
            &e.root.join("template.ram"),
            None,
        )
        .unwrap();
        eprintln!("template: cold boot to ready {:?}", vm.ready_after);
        let t = Instant::now();
        let snap = vm.snapshot(&e.root.join("template.state")).unwrap();
        for p in [&snap.state, &snap.ram] {
            let md = std::fs::metadata(p).unwrap();
            eprintln!(
                "template: {p:?} after {:?}, {} bytes apparent, {} bytes on disk",
                t.elapsed(),
                md.len(),
                std::os::unix::fs::MetadataExt::blocks(&md) * 512
            );
        }
        snap
    })
}

fn restored(name: &str, t: &Task) -> qemu::RunResult {
    restored_for(name, t, WALL)
}

fn restored_for(name: &str, t: &Task, wall: Duration) -> qemu::RunResult {
    let e = env();
    let snap = template();
    let _slot = slot();
    let vm = Vm::restore(&e.cfg, snap, &run_dir(name)).unwrap();
    eprintln!("{name}: restore to running {:?}", vm.ready_after);
    let r = vm.run(t, Vec::new(), wall, CAP).unwrap();
    eprintln!(
        "{name}: {:?} task {:?}, start to status {:?}",
        r.outcome, r.task_time, r.since_start
    );
    r
}

#[test]
fn restored_guests_run_tasks_with_their_own_randomness_and_the_right_time() {
    let t = task(&["sh", "-c", "head -c16 /dev/urandom | od -An -tx1; date +%s"]);
    let a = restored("restore-a", &t);
    let b = restored("restore-b", &t);
    for r in [&a, &b] {
        assert_eq!(
            r.outcome,
            Outcome::Exited(0),
            "stderr: {}",
            String::from_utf8_lossy(&r.stderr)
        );
    }
    let lines = |r: &qemu::RunResult| {
        String::from_utf8(r.stdout.clone())
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect::<Vec<_>>()
    };
    let (la, lb) = (lines(&a), lines(&b));
    assert_eq!(la.len(), 2, "{la:?}");
    assert_eq!(lb.len(), 2, "{lb:?}");
    assert_eq!(la[0].split_whitespace().count(), 16, "{la:?}");
    assert_ne!(
        la[0], lb[0],
        "two restored guests drew the same random bytes"
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    for l in [&la, &lb] {
        let t: i64 = l[1].trim().parse().unwrap();
        assert!((now - t).abs() < 120, "guest clock {t}, host {now}");
    }
}

/// 80 MiB of a task's `/tmp` (guest RAM) written in a restored guest:
/// the template's RAM file, mapped privately, keeps its digest and its
/// version, and the next restore of it runs.
#[test]
fn a_guests_writes_never_reach_the_templates_ram_file() {
    let snap = template();
    let id = FileId::path(&snap.ram).unwrap();
    let digest = image::sha256_sparse(&snap.ram).unwrap();
    let mut t = task(&[
        "sh",
        "-c",
        "yes 0123456789abcdef | head -c 83886080 > /tmp/fill; wc -c < /tmp/fill",
    ]);
    t.limits.tmp_mib = 96;
    t.limits.memory_mib = Some(160);
    let r = restored_for("fill", &t, Duration::from_secs(180));
    // Positive control: the guest did write them.
    assert_eq!(
        r.outcome,
        Outcome::Exited(0),
        "{}",
        String::from_utf8_lossy(&r.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&r.stdout).trim(), "83886080");
    assert_eq!(FileId::path(&snap.ram), Some(id), "the RAM file changed");
    assert_eq!(
        image::sha256_sparse(&snap.ram).unwrap(),
        digest,
        "a guest's writes reached the template's RAM file"
    );
    let r = restored("after-fill", &task(&["/bin/echo", "still"]));
    assert_eq!(r.outcome, Outcome::Exited(0));
    assert_eq!(r.stdout, b"still\n");
}

#[test]
fn the_guests_oom_killer_is_reported() {
    let mut t = task(&[
        "sh",
        "-c",
        "a=$(head -c 30000000 /dev/zero | tr '\\0' x); echo survived",
    ]);
    t.limits.memory_mib = Some(12);
    // Room for the pressure trigger (30 s and more) should the tool thrash
    // before the OOM killer fires.
    let r = restored_for("oom", &t, Duration::from_secs(180));
    assert_eq!(
        r.outcome,
        Outcome::Signaled {
            signal: 9,
            oom: true
        },
        "stdout: {} stderr: {}",
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr)
    );
}

/// A tool whose unreclaimable memory (its `/tmp`, a tmpfs) nearly fills
/// its `memory.max` and that then rereads a file bigger than what is left
/// thrashes: reclaim always frees a page, so the kernel's OOM killer waits;
/// the init's memory-pressure trigger kills it, as out of memory.
#[test]
fn a_tool_thrashing_at_its_limit_is_killed_as_out_of_memory() {
    let mut t = task(&[
        "sh",
        "-c",
        "head -c 15000000 /dev/zero > /tmp/fill && echo filled && \
         while :; do cat /bin/busybox > /dev/null; done",
    ]);
    t.limits.memory_mib = Some(16);
    t.limits.tmp_mib = 32;
    let r = restored_for("thrash", &t, Duration::from_secs(180));
    let console = std::fs::read_to_string(run_dir("thrash").join("console.log")).unwrap();
    assert_eq!(
        r.outcome,
        Outcome::Signaled {
            signal: 9,
            oom: true
        },
        "stdout: {} stderr: {} console: {console}",
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr)
    );
    // The positive control: it got as far as the loop.
    assert_eq!(String::from_utf8_lossy(&r.stdout), "filled\n");
    assert!(
        console.contains("stalled on memory at its limit") && !console.contains("Killed process"),
        "killed, but not by the pressure trigger: {console}"
    );
}

/// A loopback HTTP server in the test process (the host's namespace):
/// answers `GET /PATH` with `reply(path)`, and keeps every request line.
struct Server {
    port: u16,
    seen: std::sync::Arc<Mutex<Vec<String>>>,
}

impl Server {
    fn start(reply: impl Fn(&str) -> Vec<u8> + Send + Sync + 'static) -> Server {
        use std::io::{Read, Write};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
        let reply = std::sync::Arc::new(reply);
        let s = seen.clone();
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let (s, reply) = (s.clone(), reply.clone());
                std::thread::spawn(move || {
                    let mut c = c;
                    let mut req = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                        match c.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => req.extend_from_slice(&buf[..n]),
                        }
                    }
                    let line = String::from_utf8_lossy(&req)
                        .lines()
                        .next()
                        .unwrap_or("")
                        .to_owned();
                    s.lock().unwrap().push(line.clone());
                    let path = line.split(' ').nth(1).unwrap_or("").to_owned();
                    let body = reply(&path);
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = c.write_all(head.as_bytes());
                    let _ = c.write_all(&body);
                });
            }
        });
        Server { port, seen }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn a_guest_without_a_nic_reaches_a_host_loopback_port_it_was_given() {
    let server = Server::start(|path| format!("body of {path}\n").into_bytes());
    // Listening on the host too, but not given to the task.
    let other = Server::start(|_| b"not for the guest\n".to_vec());
    let script = format!(
        "wget -q -O- http://127.0.0.1:{p}/x; echo rc=$?; \
         wget -q -O- http://127.0.0.1:{o}/y 2>&1; echo rc=$?",
        p = server.port,
        o = other.port
    );
    let mut t = task(&["sh", "-c", &script]);
    t.net = vec![server.port];
    let r = restored("net-get", &t);
    assert_eq!(r.outcome, Outcome::Exited(0), "stderr: {}", text(&r.stderr));
    let out = text(&r.stdout);
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("body of /x"), "{out}");
    assert_eq!(lines.next(), Some("rc=0"), "{out}");
    let refused = lines.next().unwrap_or("");
    assert!(refused.contains("Connection refused"), "{out}");
    assert_eq!(lines.next(), Some("rc=1"), "{out}");
    assert_eq!(server.seen(), vec!["GET /x HTTP/1.1".to_owned()]);
    assert!(other.seen().is_empty(), "{:?}", other.seen());
}

#[test]
fn a_guest_without_net_ports_cannot_connect() {
    let server = Server::start(|_| b"should not arrive\n".to_vec());
    let script = format!(
        "wget -q -O- http://127.0.0.1:{}/x 2>&1; echo rc=$?",
        server.port
    );
    let r = restored("net-none", &task(&["sh", "-c", &script]));
    assert_eq!(r.outcome, Outcome::Exited(0), "stderr: {}", text(&r.stderr));
    let out = text(&r.stdout);
    assert!(out.contains("Connection refused"), "{out}");
    assert!(out.ends_with("rc=1\n"), "{out}");
    assert!(server.seen().is_empty(), "{:?}", server.seen());
}

#[test]
fn two_connections_of_one_task_are_open_at_once() {
    use std::sync::{Arc, Condvar};
    // Neither request is answered before both have arrived.
    let gate = Arc::new((Mutex::new(0u32), Condvar::new()));
    let g = gate.clone();
    let server = Server::start(move |path| {
        let (n, cv) = &*g;
        let mut n = n.lock().unwrap();
        *n += 1;
        cv.notify_all();
        let (n, timeout) = cv
            .wait_timeout_while(n, Duration::from_secs(60), |n| *n < 2)
            .unwrap();
        if timeout.timed_out() {
            return format!("{path} alone ({})\n", *n).into_bytes();
        }
        format!("{path} together\n").into_bytes()
    });
    let script = format!(
        "wget -q -O /tmp/a http://127.0.0.1:{p}/a & wget -q -O /tmp/b http://127.0.0.1:{p}/b & \
         wait; cat /tmp/a /tmp/b",
        p = server.port
    );
    let mut t = task(&["sh", "-c", &script]);
    t.net = vec![server.port];
    let r = restored("net-two", &t);
    assert_eq!(r.outcome, Outcome::Exited(0), "stderr: {}", text(&r.stderr));
    assert_eq!(text(&r.stdout), "/a together\n/b together\n");
    let mut seen = server.seen();
    seen.sort();
    assert_eq!(seen, vec!["GET /a HTTP/1.1", "GET /b HTTP/1.1"]);
}

#[test]
fn megabytes_arrive_byte_exact() {
    use sha2::{Digest, Sha256};
    let body: Vec<u8> = (0..4 * 1024 * 1024 + 333u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect();
    let want = hex::encode(Sha256::digest(&body));
    let len = body.len();
    let server = Server::start(move |_| body.clone());
    let script = format!(
        "wget -q -O- http://127.0.0.1:{}/big | tee /tmp/big | sha256sum; wc -c < /tmp/big",
        server.port
    );
    let mut t = task(&["sh", "-c", &script]);
    t.net = vec![server.port];
    t.limits.tmp_mib = 16;
    let started = Instant::now();
    let r = restored("net-big", &t);
    eprintln!(
        "net-big: {len} bytes in {:?} (restore included)",
        started.elapsed()
    );
    assert_eq!(r.outcome, Outcome::Exited(0), "stderr: {}", text(&r.stderr));
    let out = text(&r.stdout);
    let mut lines = out.lines();
    assert_eq!(
        lines.next().and_then(|l| l.split_whitespace().next()),
        Some(want.as_str()),
        "{out}"
    );
    assert_eq!(lines.next().map(str::trim), Some(len.to_string().as_str()));
}
