//! The microVM runtime against real QEMU under TCG, Debian's cloud kernel
//! and the static guest init (`scripts/setup.sh` installs the first two;
//! `scripts/build-vm-init.sh` builds the init). A missing piece fails the
//! tests, naming it.
//!
//! One store per test binary: the first task makes the template snapshot
//! (one cold boot, about 10 s of CPU here), every later task restores it.
//! At most two guests at once (two cores).

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use cordon_runtime::microvm::{Microvm, Options};
use cordon_runtime::{Context, Mechanism, Root, Runtime, SandboxSpec, State, Status};
use cordon_testkit::vm::processes_naming;
use cordon_vm_init::qemu::Accel;

struct Env {
    _dir: cordon_testkit::Scratch,
    rootfs: cordon_testkit::Scratch,
    opts: Options,
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        assert!(
            cordon_testkit::image::missing().is_none(),
            "{:?}",
            cordon_testkit::image::missing()
        );
        let dir = cordon_testkit::scratch::named("cordon-microvm-rt-");
        let opts = Options {
            init: Some(cordon_testkit::vm::init().clone()),
            state_dir: Some(dir.path().join("state")),
            store: Some(dir.path().join("store")),
            accel: Some(Accel::Tcg),
            ..Options::default()
        };
        Env {
            rootfs: cordon_testkit::image::busybox(),
            _dir: dir,
            opts,
        }
    })
}

/// The runtime, or a failure naming what is missing on this host.
fn microvm() -> Microvm {
    let m = Microvm::new(env().opts.clone(), Default::default()).expect("microvm runtime");
    let problems = m.check(&spec(&["/bin/true"])).problems;
    assert!(problems.is_empty(), "run scripts/setup.sh: {problems:?}");
    m
}

/// A runtime with a state directory of its own (the store shared), so
/// that what it leaves can be told from other tests' live guests.
fn microvm_alone(tag: &str) -> (Microvm, PathBuf) {
    let state = env()
        .opts
        .state_dir
        .clone()
        .unwrap()
        .with_file_name(format!("state-{tag}"));
    let mut opts = env().opts.clone();
    opts.state_dir = Some(state.clone());
    (
        Microvm::new(opts, Default::default()).expect("microvm runtime"),
        state,
    )
}

/// At most two guests at once.
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

fn spec(argv: &[&str]) -> SandboxSpec {
    let mut s = SandboxSpec::new("vm", argv.iter().copied());
    s.profile = cordon_policy::policy::Profile::P3;
    s.limits = cordon_policy::resolve::default_limits(s.profile).expect("P3 limits");
    s.limits.memory_bytes = 256 << 20;
    s.limits.cpu_percent = Some(100);
    s.limits.wall = Duration::from_secs(120);
    s.root = Root::Image {
        rootfs: env().rootfs.path().to_path_buf(),
        digest: String::new(),
    };
    s.env = vec![("PATH".into(), "/bin".into())];
    s
}

fn sh(script: &str) -> SandboxSpec {
    spec(&["/bin/sh", "-c", script])
}

fn run(m: &Microvm, s: &SandboxSpec, input: &[u8]) -> cordon_runtime::Outcome {
    let _slot = slot();
    m.run(s, input.to_vec(), &Context::discard("t"))
        .expect("run")
}

/// Runs `s` on `m` (one guest slot held): its outcome and the egress
/// events its doors reported.
fn run_with_egress(
    m: &Microvm,
    s: &SandboxSpec,
) -> (cordon_runtime::Outcome, Vec<cordon_runtime::EgressEvent>) {
    use std::sync::{Arc, Mutex};
    let events: Arc<Mutex<Vec<cordon_runtime::EgressEvent>>> = Arc::default();
    let ev = events.clone();
    let mut ctx = Context::discard("t");
    ctx.on_egress = Arc::new(move |e| ev.lock().unwrap().push(e));
    let o = {
        let _slot = slot();
        m.run(s, Vec::new(), &ctx).expect("run")
    };
    let ev = events.lock().unwrap().clone();
    (o, ev)
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Sandbox directories left in `state`.
fn leftovers(state: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(state)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("cordon-"))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_task_runs_in_a_guest_kernel_with_stdin_stdout_and_its_exit_status() {
    let m = microvm();
    let input: Vec<u8> = (0..=255u8).collect();
    let o = run(
        &m,
        &sh("cat; id -u; cat /proc/cmdline; echo oops >&2; exit 3"),
        &input,
    );
    assert_eq!(o.status, Status::Exited, "{o:?} {}", text(&o.stderr));
    assert_eq!(o.exit_code, Some(3), "{}", o.reason);
    let (echoed, rest) = o.stdout.split_at(input.len());
    assert_eq!(echoed, &input[..], "stdin came back changed");
    let rest = text(rest);
    let lines: Vec<&str> = rest.lines().collect();
    assert_eq!(lines[0], "1000");
    // The guest's own kernel, booted by cordon: its command line is
    // cordon's, not the host's.
    assert!(lines[1].contains("panic=-1"), "{rest}");
    let host = std::fs::read_to_string("/proc/cmdline").unwrap();
    assert_ne!(lines[1], host.trim());
    assert_eq!(text(&o.stderr), "oops\n");
    // The mechanisms as this host has them: no KVM here, said so.
    let c = m.check(&sh("true"));
    let kvm = c
        .mechanisms
        .iter()
        .find(|s| s.mechanism == Mechanism::Kvm)
        .expect("kvm is reported");
    assert!(matches!(kvm.state, State::Missing(_)), "{kvm:?}");
}

#[test]
fn each_task_is_a_fresh_guest_that_sees_nothing_of_the_last() {
    let m = microvm();
    let script = "ls /tmp; echo mark > /tmp/mark; sleep 300 & head -c16 /dev/urandom | od -An -tx1; date +%s";
    let a = run(&m, &sh(script), b"");
    let b = run(&m, &sh(script), b"");
    for o in [&a, &b] {
        assert_eq!(o.status, Status::Ok, "{o:?} {}", text(&o.stderr));
    }
    let (a, b) = (text(&a.stdout), text(&b.stdout));
    let (al, bl): (Vec<&str>, Vec<&str>) = (a.lines().collect(), b.lines().collect());
    // Nothing of the first task's /tmp in the second's.
    assert!(!b.contains("mark"), "{b}");
    assert_eq!(al.len(), 2, "{a}");
    assert_eq!(bl.len(), 2, "{b}");
    // Restored from one snapshot, yet their generators differ: fresh
    // entropy and a reseed per guest.
    assert_ne!(al[0], bl[0], "two restored guests drew the same bytes");
    // And the clock is the host's, not the template's.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let guest: u64 = bl[1].trim().parse().unwrap();
    assert!(now.abs_diff(guest) < 120, "guest {guest}, host {now}");
}

#[test]
fn a_wall_clock_kill_leaves_no_qemu_and_no_directory() {
    let (m, state) = microvm_alone("wall");
    let mut s = sh("echo started; sleep 1000");
    // Positive control first: a short task within the same wall clock.
    s.limits.wall = Duration::from_secs(60);
    let ok = run(&m, &sh("echo fine"), b"");
    assert_eq!(ok.status, Status::Ok, "{ok:?}");
    s.limits.wall = Duration::from_secs(8);
    let o = run(&m, &s, b"");
    assert_eq!(o.status, Status::TimedOut, "{o:?} {}", text(&o.stderr));
    let left = processes_naming(&state.display().to_string());
    assert!(left.is_empty(), "left behind: {left:?}");
    let dirs = leftovers(&state);
    assert!(dirs.is_empty(), "left behind: {dirs:?}");
}

#[test]
fn the_guest_holds_the_tool_to_its_memory_limit() {
    let m = microvm();
    // 16 MiB of shell variable: fine under 64 MiB...
    let grow = |mib: u32| {
        format!(
            "x=$(head -c {} /dev/zero | tr '\\0' a); echo ${{#x}}",
            mib << 20
        )
    };
    let mut s = sh(&grow(8));
    s.limits.memory_bytes = 64 << 20;
    let o = run(&m, &s, b"");
    assert_eq!(o.status, Status::Ok, "{o:?} {}", text(&o.stderr));
    assert_eq!(text(&o.stdout).trim(), (8u32 << 20).to_string());
    // ...killed by the guest's OOM killer over it.
    let mut s = sh(&grow(200));
    s.limits.memory_bytes = 64 << 20;
    let o = run(&m, &s, b"");
    assert_eq!(o.status, Status::MemoryLimit, "{o:?} {}", text(&o.stderr));
    assert_eq!(o.signal, Some(9), "{o:?}");
    assert!(
        o.reason.contains("killed at its memory limit in the guest"),
        "{}",
        o.reason
    );
}

#[test]
fn output_over_the_cap_is_cut_and_the_guest_killed() {
    let (m, state) = microvm_alone("cap");
    let mut s = sh("head -c 100000 /dev/zero; echo done >&2");
    s.limits.output_bytes = 1 << 20;
    let o = run(&m, &s, b"");
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_eq!(o.stdout.len(), 100000);
    let mut s = sh("while :; do head -c 1048576 /dev/zero; done");
    s.limits.output_bytes = 1 << 20;
    let o = run(&m, &s, b"");
    assert_eq!(o.status, Status::OutputCap, "{o:?}");
    assert!(o.stdout.len() <= 1 << 20);
    let left = processes_naming(&state.display().to_string());
    assert!(left.is_empty(), "left behind: {left:?}");
    let dirs = leftovers(&state);
    assert!(dirs.is_empty(), "left behind: {dirs:?}");
}

#[test]
fn a_spawned_guest_streams_both_ways() {
    use std::io::{BufRead, BufReader, Write};
    let m = microvm();
    let s = sh("while read l; do echo \"got $l\"; done; echo bye");
    let sp = {
        let _slot = slot();
        m.spawn(&s, &Context::discard("t")).expect("spawn")
    };
    let mut w = sp.stream.try_clone().unwrap();
    let mut r = BufReader::new(sp.stream.try_clone().unwrap());
    for i in 0..3 {
        writeln!(w, "line {i}").unwrap();
        let mut got = String::new();
        r.read_line(&mut got).unwrap();
        assert_eq!(got, format!("got line {i}\n"));
    }
    sp.stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut last = String::new();
    r.read_line(&mut last).unwrap();
    assert_eq!(last, "bye\n");
    let o = sp.handle.wait().expect("outcome");
    assert_eq!(o.status, Status::Ok, "{o:?}");
}

/// Flips the byte at `at` of a (read-only) store file.
fn flip(path: &Path, at: u64) {
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path).unwrap().permissions();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut b = [0u8; 1];
    f.seek(SeekFrom::Start(at)).unwrap();
    f.read_exact(&mut b).unwrap();
    f.seek(SeekFrom::Start(at)).unwrap();
    f.write_all(&[b[0] ^ 0x5a]).unwrap();
    drop(f);
    std::fs::set_permissions(path, mode).unwrap();
}

/// The one template's files in `store`.
fn template_files(store: &Path, ext: &str) -> PathBuf {
    let found: Vec<PathBuf> = std::fs::read_dir(store.join("snapshots"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    assert_eq!(found.len(), 1, "{found:?}");
    found[0].clone()
}

#[test]
fn a_corrupted_snapshot_is_refused_and_never_restored() {
    // A store of its own: its template is corrupted on purpose.
    let dir = cordon_testkit::scratch::named("cordon-microvm-corrupt-");
    let mut opts = env().opts.clone();
    opts.store = Some(dir.path().join("store"));
    let m = Microvm::new(opts.clone(), Default::default()).unwrap();
    // Positive control: the template is made and a task runs.
    let o = run(&m, &sh("echo ok"), b"");
    assert_eq!(o.status, Status::Ok, "{o:?}");
    let store = dir.path().join("store");
    // The device state, then (the state put right) one byte of the
    // guest's RAM file.
    for ext in ["snap", "ram"] {
        let file = template_files(&store, ext);
        // A byte of data (not a hole of the sparse RAM file, which a
        // write would turn into data for good).
        let at = {
            use std::io::{Read, Seek, SeekFrom};
            let mut f = std::fs::File::open(&file).unwrap();
            let from: u64 = if ext == "ram" { 16 << 20 } else { 4096 };
            f.seek(SeekFrom::Start(from)).unwrap();
            let mut buf = vec![0u8; 1 << 20];
            let n = f.read(&mut buf).unwrap();
            from + buf[..n].iter().position(|&b| b != 0).expect("data") as u64
        };
        flip(&file, at);
        // A new broker (nothing verified yet) and this one (which verified
        // the file before it changed) both refuse it.
        let fresh = Microvm::new(opts.clone(), Default::default()).unwrap();
        for m in [&fresh, &m] {
            let e = {
                let _slot = slot();
                m.run(&sh("echo never"), Vec::new(), &Context::discard("t"))
                    .expect_err("a corrupted snapshot was restored")
            };
            assert!(e.to_string().contains("is corrupt"), "{ext}: {e}");
        }
        flip(&file, at);
    }
    // Put right, it verifies again.
    let o = run(&m, &sh("echo ok"), b"");
    assert_eq!(o.status, Status::Ok, "{o:?}");
    let left = processes_naming(&dir.path().display().to_string());
    assert!(left.is_empty(), "{left:?}");
}

/// A restored guest writing 96 MiB of its memory leaves the template's RAM
/// file as its record says, and a broker that hashes it afresh restores it.
#[test]
fn a_guests_writes_never_reach_the_templates_ram_file() {
    let dir = cordon_testkit::scratch::named("cordon-microvm-cow-");
    let mut opts = env().opts.clone();
    opts.store = Some(dir.path().join("store"));
    let m = Microvm::new(opts.clone(), Default::default()).unwrap();
    let mut s = sh("yes 0123456789abcdef | head -c 100663296 > /tmp/fill; wc -c < /tmp/fill");
    s.limits.disk_bytes = 128 << 20;
    s.limits.wall = Duration::from_secs(300);
    let o = run(&m, &s, b"");
    // Positive control: the guest wrote them.
    assert_eq!(o.status, Status::Ok, "{o:?} {}", text(&o.stderr));
    assert_eq!(text(&o.stdout).trim(), "100663296");
    let store = dir.path().join("store");
    let record: serde_json::Value =
        serde_json::from_slice(&std::fs::read(template_files(&store, "json")).unwrap()).unwrap();
    let ram = template_files(&store, "ram");
    assert_eq!(
        cordon_vm_init::image::sha256_sparse(&ram).unwrap(),
        record["ram_sha256"].as_str().unwrap(),
        "a guest's writes reached the template's RAM file"
    );
    // The template's zero pages are holes: none is left to punch (the
    // file, as root, opens for writing despite its mode; it is changed
    // only if this fails).
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(&ram).unwrap();
    eprintln!(
        "template RAM file: {} MiB, {} MiB allocated",
        meta.len() >> 20,
        (meta.blocks() * 512) >> 20
    );
    assert_eq!(
        cordon_vm_init::holes::punch_zero_pages(&ram).unwrap(),
        cordon_vm_init::holes::Punched::default(),
        "whole zero pages were left in the template's RAM file"
    );
    let fresh = Microvm::new(opts, Default::default()).unwrap();
    let o = run(&fresh, &sh("echo again"), b"");
    assert_eq!(o.status, Status::Ok, "{o:?}");
    assert_eq!(text(&o.stdout), "again\n");
}

#[test]
fn a_pool_keeps_restored_guests_ready_one_task_each() {
    use cordon_runtime::pool::{Pool, Settings};
    use std::sync::Arc;
    let m: Arc<dyn Runtime> = Arc::new(microvm());
    let s = sh("cat; ls -A /tmp; echo mark > /tmp/mark; cat /tmp/mark");
    let pool = {
        let _slot = slot();
        let p = Pool::new(
            m,
            s,
            Settings {
                size: 1,
                refill: true,
            },
            None,
        )
        .expect("pool");
        assert!(
            p.wait_idle(1, Duration::from_secs(300)),
            "{:?}",
            p.stopped()
        );
        p
    };
    for i in 0..2 {
        let _slot = slot();
        let (o, pooled) = pool
            .run(format!("task{i}\n").into_bytes(), &Context::discard("t"))
            .expect("run");
        assert_eq!(o.status, Status::Ok, "{o:?} {}", text(&o.stderr));
        // Nothing of the task before: a guest is never given twice.
        assert_eq!(text(&o.stdout), format!("task{i}\nmark\n"));
        assert!(pooled, "task {i} did not get a pooled guest");
        assert!(
            pool.wait_idle(1, Duration::from_secs(300)),
            "{:?}",
            pool.stopped()
        );
    }
}

#[test]
fn egress_goes_through_the_proxy_door_over_the_channel_and_nowhere_else() {
    use cordon_runtime::{EgressPolicy, Network};
    let m = microvm();
    let (up, seen) =
        cordon_testkit::loopback::request_lines(|first| format!("upstream saw {first}"));
    let port = up.port();
    let mut ep = EgressPolicy::allowlist(
        "vm",
        [format!("web.test:{port}"), format!("private.test:{port}")],
    )
    .unwrap();
    ep.resolve.insert("web.test".into(), up.ip());
    ep.resolve
        .insert("private.test".into(), "10.0.0.1".parse().unwrap());
    ep.allow_cidrs.push("127.0.0.1/32".parse().unwrap());
    // busybox wget reads `http_proxy`; each answer or refusal on a line.
    let mut s = sh(&format!(
        "for u in http://web.test:{port}/hello http://169.254.169.254/latest/meta-data/ http://private.test:{port}/; do \
           /bin/busybox wget -q -O- $u 2>&1 | /bin/busybox head -c 120; echo; done; \
           /bin/busybox wget -q -O- -Y off http://{up}/direct 2>&1 | /bin/busybox head -c 80; echo"
    ));
    s.network = Network::Doors(Box::new(ep));
    let (o, ev) = run_with_egress(&m, &s);
    assert_eq!(o.status, Status::Ok, "{o:?} {}", text(&o.stderr));
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
    // Positive control: the allowed name, through the door.
    assert_eq!(lines[0], "upstream saw GET /hello HTTP/1.1", "{out}");
    // The metadata address and a name pinned to a private address:
    // refused by the door (403), as for every other runtime.
    assert!(lines[1].contains("403"), "{out}");
    assert!(lines[2].contains("403"), "{out}");
    // Around the proxy, straight to the upstream's address and port (an
    // allowed port): the transparent door in the sandbox's namespace
    // refuses it, as in a native sandbox; the upstream never sees it.
    assert!(lines[3].contains("error getting response"), "{out}");
    assert_eq!(seen.lock().unwrap().clone(), vec!["GET /hello HTTP/1.1"]);
    // One event per connection; an allowed one is recorded when it closes,
    // so a busy broker may record the refusals that followed first.
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
    assert!(
        ev.iter()
            .any(|e| e.door == cordon_runtime::Door::Transparent
                && e.decision == cordon_runtime::Decision::Refused),
        "{ev:?}"
    );
}

#[test]
fn dns_and_a_non_http_port_reach_an_allowed_name_and_nothing_else() {
    use cordon_runtime::{Decision, Door, EgressPolicy, Network};
    use std::io::{BufRead, BufReader, Write};
    use std::sync::{Arc, Mutex};
    let m = microvm();
    // A line-based upstream on the host's loopback (no HTTP at all).
    let up = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = up.local_addr().unwrap().port();
    let heard: Arc<Mutex<Vec<String>>> = Arc::default();
    let h = heard.clone();
    std::thread::spawn(move || {
        for c in up.incoming().flatten() {
            let mut line = String::new();
            let mut r = BufReader::new(c.try_clone().unwrap());
            let _ = r.read_line(&mut line);
            h.lock().unwrap().push(line.trim().to_string());
            let _ = (&c).write_all(format!("upstream heard {}", line).as_bytes());
        }
    });
    let mut ep = EgressPolicy::allowlist("vm", [format!("db.test:{port}")]).unwrap();
    ep.resolve
        .insert("db.test".into(), "127.0.0.1".parse().unwrap());
    ep.allow_cidrs.push("127.0.0.1/32".parse().unwrap());
    ep.upstream_dns = Some("127.0.0.1:9".parse().unwrap());
    let bb = "/bin/busybox";
    let mut s = sh(&format!(
        "addr() {{ {bb} nslookup $1 127.0.0.1 2>&1 | {bb} awk '/^Address/ {{a=$NF}} END {{print a}}'; }}; \
         a=$(addr db.test); echo \"db.test is $a\"; \
         echo hello | {bb} nc -w 5 $a {port}; echo \"rc=$?\"; \
         {bb} nslookup other.test 127.0.0.1 2>&1 | {bb} grep -c NXDOMAIN; \
         {bb} nc -w 5 1.1.1.1 {port} </dev/null 2>&1; echo \"rc=$?\"; \
         {bb} nc -w 5 $a 22 </dev/null 2>&1; echo \"rc=$?\""
    ));
    s.network = Network::Doors(Box::new(ep));
    let (o, ev) = run_with_egress(&m, &s);
    assert_eq!(o.status, Status::Ok, "{o:?} {}", text(&o.stderr));
    let out = text(&o.stdout);
    let lines: Vec<&str> = out.lines().collect();
    // Positive control: the allowed name resolves through the DNS door,
    // and a plain TCP connection to it goes through the transparent door.
    // (An address of the doors' range: these doors cannot make a real
    // address local in the helper's namespace, so they answer with one.)
    assert!(
        lines
            .first()
            .is_some_and(|l| l.starts_with("db.test is 198.18.")),
        "{out}"
    );
    assert_eq!(lines.get(1), Some(&"upstream heard hello"), "{out}");
    assert_eq!(lines.get(2), Some(&"rc=0"), "{out}");
    assert_eq!(heard.lock().unwrap().clone(), vec!["hello".to_string()]);
    // A name the allowlist does not have: NXDOMAIN (for A and AAAA).
    assert!(
        lines
            .get(3)
            .and_then(|l| l.parse::<u32>().ok())
            .is_some_and(|n| n >= 1),
        "{out}"
    );
    // An address no answer gave: no route in the guest.
    assert!(
        out.contains("Network is unreachable") && lines.get(5) == Some(&"rc=1"),
        "{out}"
    );
    // The allowed host on a port the allowlist does not have: refused.
    assert!(
        out.contains("Connection refused") && lines.last() == Some(&"rc=1"),
        "{out}"
    );
    // The doors saw the lookup and the connection, and the refused name.
    let saw = |door: Door, decision: Decision| {
        ev.iter().any(|e| e.door == door && e.decision == decision)
    };
    assert!(saw(Door::Dns, Decision::Allowed), "{ev:?}");
    assert!(saw(Door::Dns, Decision::Refused), "{ev:?}");
    assert!(saw(Door::Transparent, Decision::Allowed), "{ev:?}");
}

/// A token source that always gives one token.
struct Fixed(&'static str);

impl cordon_egress::TokenSource for Fixed {
    fn current(&self) -> Result<zeroize::Zeroizing<String>, String> {
        Ok(zeroize::Zeroizing::new(self.0.to_string()))
    }
}

#[test]
fn a_secret_delivered_at_the_door_reaches_a_guest_as_a_placeholder_with_the_session_ca() {
    use cordon_egress::{Binding, Injection, Injections, Placement};
    use cordon_runtime::{Credentials, EgressPolicy, Network};
    use std::sync::Arc;
    const PH: &str = "cordon-ph-Vm3Qc8Wd2Lx6Kb0Tz5Hn9Rs4";
    const TOKEN: &str = "vm-real-token-7c2e0d9a55b1f3";
    let m = microvm();
    // An image with a trust bundle of its own, linked from cert.pem.
    let img = cordon_testkit::image::busybox_with_bundle();
    let root = img.path();
    let (up, seen) = cordon_testkit::loopback::request_heads(|_| "upstream answered".into());
    let port = up.port();
    let mut ep = EgressPolicy::allowlist("vm", [format!("api.test:{port}")]).unwrap();
    ep.resolve.insert("api.test".into(), up.ip());
    ep.allow_cidrs.push("127.0.0.1/32".parse().unwrap());
    let mut s = sh(&format!(
        "/bin/busybox grep -c 'BEGIN CERTIFICATE' /etc/ssl/certs/ca-certificates.crt; \
         /bin/busybox head -n 1 /etc/ssl/cert.pem; echo \"env $SSL_CERT_FILE\"; echo \"ph $JIRA_TOKEN\"; \
         /bin/busybox wget -q -O- --header \"Authorization: Bearer $JIRA_TOKEN\" http://api.test:{port}/rest/x 2>&1; echo"
    ));
    s.root = Root::Image {
        rootfs: root.to_path_buf(),
        digest: String::new(),
    };
    s.network = Network::Doors(Box::new(ep));
    let run_with = |ctx: &Context| {
        let _slot = slot();
        let o = m.run(&s, Vec::new(), ctx).expect("run");
        assert_eq!(o.status, Status::Ok, "{o:?} {}", text(&o.stderr));
        text(&o.stdout)
    };
    // Positive control: without a secret at the door, the image's own
    // bundle and no token.
    let out = run_with(&Context::discard("t"));
    assert!(out.starts_with("0\nIMAGE ROOTS\nenv \nph \n"), "{out}");
    let ctx = Context {
        session: "s".into(),
        tenant: cordon_runtime::DEFAULT_TENANT.into(),
        on_egress: Arc::new(|_| {}),
        credentials: Credentials {
            env: vec![("JIRA_TOKEN".into(), zeroize::Zeroizing::new(PH.to_string()))],
            injections: Injections::new(vec![Injection {
                secret: "JIRA_TOKEN".into(),
                placeholder: PH.into(),
                binding: Binding {
                    host: "api.test".into(),
                    port,
                    path_prefix: Some("/rest".into()),
                    placement: Placement::Header {
                        name: "Authorization".into(),
                        template: "Bearer {token}".into(),
                    },
                    upstream_ca: None,
                },
                source: Arc::new(Fixed(TOKEN)),
            }]),
        },
        placement: Default::default(),
    };
    let out = run_with(&ctx);
    let lines: Vec<&str> = out.lines().collect();
    assert!(lines.len() >= 5, "{out}");
    // The host's roots and the session CA, over the image's bundle and
    // through its link, named by the variables.
    assert!(lines[0].parse::<usize>().unwrap() >= 2, "{out}");
    assert_eq!(lines[1], "-----BEGIN CERTIFICATE-----", "{out}");
    assert_eq!(lines[2], "env /dev/cordon-ca-bundle.crt", "{out}");
    // The guest holds the placeholder; the upstream got the token.
    assert_eq!(lines[3], format!("ph {PH}"), "{out}");
    assert_eq!(lines[4], "upstream answered", "{out}");
    assert!(!out.contains(TOKEN), "{out}");
    // The control's request (no token) and this one's (the token, never
    // the placeholder).
    let heads = seen.lock().unwrap().clone();
    assert_eq!(heads.len(), 2, "{heads:?}");
    assert!(!heads[0].contains(TOKEN), "{heads:?}");
    assert!(heads[1].contains(&format!("Bearer {TOKEN}")), "{heads:?}");
    assert!(!heads.iter().any(|h| h.contains(PH)), "{heads:?}");
    // The image itself is untouched.
    assert_eq!(
        std::fs::read_to_string(root.join("etc/ssl/certs/ca-certificates.crt")).unwrap(),
        cordon_testkit::image::IMAGE_ROOTS
    );
}

/// The names in `dir`, sorted.
fn names_in(dir: &Path) -> Vec<String> {
    let mut n: Vec<String> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    n.sort();
    n
}

#[test]
fn qemu_sees_only_its_own_files_and_the_device_nodes_it_needs() {
    let (m, state) = microvm_alone("dev");
    let mut s = sh("sleep 600");
    s.limits.wall = Duration::from_secs(20);
    let needle = state.display().to_string();
    let listing = std::thread::scope(|sc| {
        let run = sc.spawn(|| run(&m, &s, b""));
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        let qemu = loop {
            let found = std::fs::read_dir("/proc").unwrap().flatten().find(|p| {
                std::fs::read(p.path().join("cmdline")).is_ok_and(|c| {
                    let c = String::from_utf8_lossy(&c);
                    // The restored guest's QEMU (not a template's).
                    c.starts_with("/usr/bin/qemu-system")
                        && c.contains(&needle)
                        && c.contains("incoming")
                })
            });
            if let Some(p) = found {
                break p.path();
            }
            assert!(std::time::Instant::now() < deadline, "no QEMU");
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut names: Vec<String> = std::fs::read_dir(qemu.join("root/dev"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        // The template's RAM file: mounted read-only in QEMU's view and
        // mapped privately (copy-on-write).
        let mountinfo = std::fs::read_to_string(qemu.join("mountinfo")).unwrap();
        let ram_mount = mountinfo
            .lines()
            .find(|l| l.split(' ').nth(4).is_some_and(|m| m.ends_with("/vm/ram")))
            .unwrap_or_else(|| panic!("no RAM file mount in QEMU's view: {mountinfo}"));
        let opts = ram_mount.split(' ').nth(5).unwrap();
        assert!(opts.split(',').any(|o| o == "ro"), "{ram_mount}");
        // QEMU maps it while it starts up.
        let maps = loop {
            let maps = std::fs::read_to_string(qemu.join("maps")).unwrap();
            if maps.lines().any(|l| l.ends_with("/vm/ram")) {
                break maps;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the RAM file is not mapped: {maps}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        let ram_maps: Vec<&str> = maps.lines().filter(|l| l.ends_with("/vm/ram")).collect();
        for l in &ram_maps {
            assert_eq!(l.split(' ').nth(1), Some("rw-p"), "{l}");
        }
        // Positive control: the host's /dev has far more.
        let host = std::fs::read_dir("/dev").unwrap().count();
        assert!(host > 10, "{host}");
        // QEMU's root: its binary, loader, libraries and firmware, the
        // guest's files and the sandbox's own directory, nothing else.
        let root = qemu.join("root");
        let top = names_in(&root);
        for host_only in ["home", "root", "proc", "sys", "srv", "opt", "run"] {
            assert!(
                !top.iter().any(|n| n == host_only),
                "/{host_only} in QEMU's root: {top:?}"
            );
        }
        assert!(top.iter().any(|n| n == "usr"), "{top:?}");
        assert_eq!(names_in(&root.join("etc")), ["ld.so.cache"]);
        assert!(!root.join("etc/shadow").exists());
        assert!(
            root.join("usr/bin").read_dir().unwrap().count() == 1,
            "{:?}",
            names_in(&root.join("usr/bin"))
        );
        // Of cordon's state, only this sandbox's directory; of the store,
        // only the guest's image, not the template's snapshot.
        let sandboxes = names_in(&root.join(state.strip_prefix("/").unwrap()));
        assert_eq!(sandboxes.len(), 1, "{sandboxes:?}");
        let store = env().opts.store.clone().unwrap();
        let in_store = root.join(store.strip_prefix("/").unwrap());
        let mut shown = Vec::new();
        let mut stack = vec![in_store.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                if e.file_type().unwrap().is_dir() {
                    stack.push(e.path());
                } else {
                    shown.push(e.path().strip_prefix(&in_store).unwrap().to_path_buf());
                }
            }
        }
        // The image and the initramfs (cached there per init and kernel).
        assert_eq!(shown.len(), 2, "{shown:?}");
        assert!(
            !shown.iter().any(|p| p.starts_with("snapshots")),
            "{shown:?}"
        );
        // Positive control: the store holds the template too.
        assert!(store.join("snapshots").read_dir().unwrap().count() > 0);
        // Positive control: the host's side has them.
        assert!(Path::new("/etc/shadow").exists() && Path::new("/proc/self").exists());
        assert!(!names_in(&state).is_empty());
        let o = run.join().unwrap();
        assert_eq!(o.status, Status::TimedOut, "{o:?}");
        names
    });
    assert_eq!(listing, ["null", "random", "urandom", "zero"]);
}
