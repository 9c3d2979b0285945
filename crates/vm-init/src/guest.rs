//! The guest's PID 1.
//!
//! It needs nothing from the tool's image: everything it reads (its kernel
//! modules, their load order) is in the initramfs beside it. In order:
//!
//! 1. mounts `/proc`, `/sys` and a devtmpfs `/dev`;
//! 2. loads the kernel modules the initramfs lists (`/etc/cordon/modules`:
//!    Debian's cloud kernel has virtio-mmio, virtio-blk, virtio-console and
//!    EROFS as modules);
//! 3. finds its five virtio-serial ports by name and opens them (the fifth,
//!    `cordon.net`, is the network channel), and brings the loopback up;
//! 4. mounts the tool's read-only root (the disk whose virtio serial is
//!    `cordon-root`, EROFS, else ext4) and builds the tool's root tree on a
//!    tmpfs: each top-level entry of the image bound in read-only, a fresh
//!    `/proc`, a `/dev` of six device nodes (none of the guest's virtio
//!    devices), an empty `/sys`, and, when the command line says
//!    `cordon.carry=1`, the `cordon-carry` disk (cordon's own files, such
//!    as the probe agent) read-only at `/.cordon`;
//! 5. says `ready` on the control port and waits for one task (a template
//!    guest is snapshotted here);
//! 6. mixes the task's host entropy into the kernel's pool and reseeds it
//!    (RNDADDENTROPY, RNDRESEEDCRNG), sets the clock;
//! 7. for a task with `net` ports, listens on `127.0.0.1:PORT` for each and
//!    carries every connection over the network channel to the same port
//!    on the host ([`cordon_vm_init::relay::GuestNet`]); the guest has no
//!    network device;
//!    mounts the tool's `/tmp` (tmpfs of the task's size), makes the root
//!    read-only, puts itself into a cgroup v2 with the task's `memory.max`
//!    and `pids.max` (rlimits when the kernel has no cgroup v2) and a
//!    memory-pressure watch that kills a tool thrashing at its limit as out
//!    of memory (the kernel's OOM killer waits while reclaim frees
//!    anything), and starts the tool as the native jail does
//!    ([`spawn_tool`]: its own user, mount, pid, IPC and UTS namespaces,
//!    the task's ids inside mapped to an unprivileged pair, a `/proc` of
//!    its own, chrooted into its root, no capabilities, `no_new_privs`,
//!    the task's seccomp filters) with stdin, stdout and stderr on their
//!    ports;
//! 8. writes the exit status (or signal, and whether the guest's OOM killer
//!    fired) on the control port, and powers the guest off.
//!
//! Every failure after the control port is open is reported there as an
//! `error` line; before that, on the console. Either way the guest powers
//! off: the host never waits on a guest that gave up.

use std::ffi::{CStr, CString};
use std::fs::{self, File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use cordon_vm_init::protocol::{
    CARRY_ARG, CARRY_MOUNT, DISK_CARRY, DISK_ROOT, ENTROPY_BYTES, GuestMessage, LimitKind,
    PORT_CONTROL, PORT_NET, PORT_STDERR, PORT_STDIN, PORT_STDOUT, Task, Trust,
};
use cordon_vm_init::relay::DNS_PORT;
use cordon_vm_init::relay::GuestNet;
use rustix::event::{PollFd, PollFlags};
use rustix::mount::{MountFlags, mount, mount_bind, mount_bind_recursive, mount_remount};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// Where the initramfs lists the modules to load, in order.
const MODULES_LIST: &str = "/etc/cordon/modules";
const MODULES_DIR: &str = "/lib/modules";
/// Where the tool's image is mounted, and where its root is assembled.
const IMAGE_MNT: &str = "/mnt/image";
const ROOT: &str = "/newroot";
const CGROUP: &str = "/sys/fs/cgroup";
/// How long the init waits for its devices to appear (under emulation the
/// drivers probe slowly).
const DEVICE_WAIT: Duration = Duration::from_secs(30);

/// A failed step: which one and why.
struct Fail {
    stage: &'static str,
    message: String,
}

fn fail<E: std::fmt::Display>(stage: &'static str) -> impl Fn(E) -> Fail {
    move |e| Fail {
        stage,
        message: e.to_string(),
    }
}

fn failed(stage: &'static str, message: String) -> Fail {
    Fail { stage, message }
}

/// The guest's control channel once its port is open.
struct Control {
    out: File,
    input: BufReader<File>,
}

impl Control {
    fn send(&mut self, msg: &GuestMessage) -> std::io::Result<()> {
        self.out.write_all(msg.to_line().as_bytes())?;
        self.out.flush()
    }
}

/// The ports the tool's stdio go to, and the network channel's.
struct Stdio3 {
    stdin: File,
    stdout: File,
    stderr: File,
    net: File,
}

/// Runs the init and powers the guest off; never returns.
pub fn main() -> ! {
    let mut control: Option<Control> = None;
    let msg = match run(&mut control) {
        Ok(msg) => msg,
        Err(f) => GuestMessage::Error {
            stage: f.stage.to_owned(),
            message: f.message,
        },
    };
    let reported = control.as_mut().map(|c| c.send(&msg));
    if !matches!(reported, Some(Ok(()))) {
        console(&format!("cordon-vm-init: {}", msg.to_line().trim_end()));
    }
    power_off()
}

fn power_off() -> ! {
    rustix::fs::sync();
    loop {
        if let Err(e) = rustix::system::reboot(rustix::system::RebootCommand::PowerOff) {
            console(&format!("cordon-vm-init: power off: {e}"));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// A line on the kernel console (the host keeps it in a log file).
fn console(line: &str) {
    if let Ok(mut c) = OpenOptions::new().write(true).open("/dev/console") {
        let _ = writeln!(c, "{line}");
    }
}

fn run(control: &mut Option<Control>) -> Result<GuestMessage, Fail> {
    mount_basics()?;
    load_modules()?;
    let (ctl, stdio) = open_ports()?;
    *control = Some(ctl);
    let Some(ctl) = control.as_mut() else {
        return Err(failed("ports", "control port lost".to_owned()));
    };
    // A guest kernel's `lo` starts down. Up before `ready` (so a restore
    // pays nothing for it) in every guest: a connection to a port nobody
    // listens on is then refused, not unreachable. Only a task with `net`
    // ports needs it, so only such a task fails without it.
    let loopback = cordon_sys::net::loopback_up().map_err(|e| format!("bring lo up: {e}"));
    mount_image()?;
    let carry = fs::read_to_string("/proc/cmdline")
        .map_err(fail("cmdline"))?
        .split_whitespace()
        .any(|a| a == CARRY_ARG);
    build_root(carry)?;
    let cgroup_ready = match prepare_cgroup() {
        Ok(()) => true,
        Err(e) => {
            console(&format!("cordon-vm-init: no cgroup v2 ({e}); rlimits only"));
            false
        }
    };
    ctl.send(&GuestMessage::Ready {
        uptime_ms: uptime_ms(),
    })
    .map_err(fail("ready"))?;
    let task = read_task(ctl)?;
    reseed(&task)?;
    set_clock(task.time_ns)?;
    if task.networked() {
        loopback.map_err(|e| failed("net", e))?;
    }
    run_task(&task, stdio, cgroup_ready)
}

fn mkdir_p(path: &str) -> Result<(), Fail> {
    fs::create_dir_all(path).map_err(|e| failed("mkdir", format!("{path}: {e}")))
}

fn mount_fs(
    src: &str,
    target: &str,
    fstype: &str,
    flags: MountFlags,
    data: Option<&CStr>,
) -> Result<(), Fail> {
    mount(src, target, fstype, flags, data)
        .map_err(|e| failed("mount", format!("{fstype} on {target}: {e}")))
}

fn mount_basics() -> Result<(), Fail> {
    for d in ["/proc", "/sys", "/dev"] {
        mkdir_p(d)?;
    }
    let hard = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    mount_fs("proc", "/proc", "proc", hard, None)?;
    mount_fs("sysfs", "/sys", "sysfs", hard, None)?;
    mount_fs(
        "devtmpfs",
        "/dev",
        "devtmpfs",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        None,
    )
}

/// Loads each module `/etc/cordon/modules` names (paths under
/// `/lib/modules`, dependencies first). A module already loaded is fine.
fn load_modules() -> Result<(), Fail> {
    let list = match fs::read_to_string(MODULES_LIST) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(failed("modules", format!("{MODULES_LIST}: {e}"))),
    };
    for name in list.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let path = Path::new(MODULES_DIR).join(name);
        let f =
            File::open(&path).map_err(|e| failed("modules", format!("{}: {e}", path.display())))?;
        match rustix::system::finit_module(f.as_fd(), c"", 0) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(failed("modules", format!("{}: {e}", path.display()))),
        }
    }
    Ok(())
}

/// Waits for `found` to give a value, up to [`DEVICE_WAIT`].
fn wait_for<T>(what: &str, mut found: impl FnMut() -> Option<T>) -> Result<T, Fail> {
    let start = Instant::now();
    loop {
        if let Some(v) = found() {
            return Ok(v);
        }
        if start.elapsed() > DEVICE_WAIT {
            return Err(failed(
                "devices",
                format!("{what} did not appear in {DEVICE_WAIT:?}"),
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// `/dev/vportNpM` of the virtio-serial port called `name`.
fn port_path(name: &str) -> Option<PathBuf> {
    let entries = fs::read_dir("/sys/class/virtio-ports").ok()?;
    for e in entries.flatten() {
        let n = fs::read_to_string(e.path().join("name")).ok()?;
        if n.trim_end() == name {
            let dev = Path::new("/dev").join(e.file_name());
            return dev.exists().then_some(dev);
        }
    }
    None
}

fn open_port(name: &str, write: bool) -> Result<File, Fail> {
    let path = wait_for(&format!("port {name}"), || port_path(name))?;
    OpenOptions::new()
        .read(!write)
        .write(write)
        .open(&path)
        .map_err(|e| failed("ports", format!("{}: {e}", path.display())))
}

fn open_ports() -> Result<(Control, Stdio3), Fail> {
    let ctl_path = wait_for("control port", || port_path(PORT_CONTROL))?;
    let ctl = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&ctl_path)
        .map_err(|e| failed("ports", format!("{}: {e}", ctl_path.display())))?;
    let input = ctl.try_clone().map_err(fail("ports"))?;
    let control = Control {
        out: ctl,
        input: BufReader::new(input),
    };
    let net_path = wait_for("network port", || port_path(PORT_NET))?;
    let net = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&net_path)
        .map_err(|e| failed("ports", format!("{}: {e}", net_path.display())))?;
    let stdio = Stdio3 {
        stdin: open_port(PORT_STDIN, false)?,
        stdout: open_port(PORT_STDOUT, true)?,
        stderr: open_port(PORT_STDERR, true)?,
        net,
    };
    Ok((control, stdio))
}

/// The device node of the disk whose virtio serial number is `serial`.
fn disk(serial: &str) -> Option<PathBuf> {
    for e in fs::read_dir("/sys/block").ok()?.flatten() {
        let s = fs::read_to_string(e.path().join("serial")).ok();
        if s.as_deref().map(str::trim_end) == Some(serial) {
            let dev = Path::new("/dev").join(e.file_name());
            return dev.exists().then_some(dev);
        }
    }
    None
}

/// Mounts the tool's image read-only: EROFS, else ext4.
fn mount_image() -> Result<(), Fail> {
    let dev = wait_for("the image's disk", || disk(DISK_ROOT))?;
    mkdir_p(IMAGE_MNT)?;
    let flags = MountFlags::RDONLY | MountFlags::NODEV;
    let erofs = mount(&dev, IMAGE_MNT, "erofs", flags, None);
    let Err(erofs) = erofs else { return Ok(()) };
    mount(&dev, IMAGE_MNT, "ext4", flags, c"noload").map_err(|ext4| {
        failed(
            "image",
            format!("{}: erofs: {erofs}; ext4: {ext4}", dev.display()),
        )
    })
}

/// The carried disk (cordon's own files), read-only at [`CARRY_MOUNT`] in
/// the tool's root.
fn mount_carry() -> Result<(), Fail> {
    let dev = wait_for("the carried disk", || disk(DISK_CARRY))?;
    let dst = format!("{ROOT}{CARRY_MOUNT}");
    mkdir_p(&dst)?;
    mount(
        &dev,
        &dst,
        "erofs",
        MountFlags::RDONLY | MountFlags::NODEV | MountFlags::NOSUID,
        None,
    )
    .map_err(|e| failed("carry", format!("{} on {dst}: {e}", dev.display())))
}

/// The tool's root: a tmpfs holding the image's top-level entries (bound
/// in read-only), and its own `/proc`, `/dev`, `/sys` and `/tmp`; with
/// `carry`, the carried disk at [`CARRY_MOUNT`] in place of any entry of
/// the image's there.
fn build_root(carry: bool) -> Result<(), Fail> {
    mkdir_p(ROOT)?;
    mount_fs(
        "root",
        ROOT,
        "tmpfs",
        MountFlags::NODEV | MountFlags::NOSUID,
        Some(c"mode=0755,size=1m"),
    )?;
    const OWN: [&str; 4] = ["proc", "dev", "sys", "tmp"];
    let entries = fs::read_dir(IMAGE_MNT).map_err(fail("root"))?;
    for e in entries {
        let e = e.map_err(fail("root"))?;
        let name = e.file_name();
        if OWN.iter().any(|o| name == *o)
            || (carry && Path::new("/").join(&name) == Path::new(CARRY_MOUNT))
        {
            continue;
        }
        let src = e.path();
        let dst = Path::new(ROOT).join(&name);
        let kind = e.file_type().map_err(fail("root"))?;
        let bound = if kind.is_symlink() {
            let target = fs::read_link(&src).map_err(fail("root"))?;
            std::os::unix::fs::symlink(target, &dst).map_err(fail("root"))
        } else if kind.is_dir() {
            fs::create_dir(&dst)
                .map_err(fail("root"))
                .and_then(|()| mount_bind_recursive(&src, &dst).map_err(fail("root")))
        } else if kind.is_file() {
            File::create(&dst)
                .map_err(fail("root"))
                .and_then(|_| mount_bind(&src, &dst).map_err(fail("root")))
        } else {
            Ok(())
        };
        bound.map_err(|f| failed("root", format!("{}: {}", dst.display(), f.message)))?;
    }
    for d in OWN {
        mkdir_p(&format!("{ROOT}/{d}"))?;
    }
    if carry {
        mount_carry()?;
    }
    mount_fs(
        "proc",
        &format!("{ROOT}/proc"),
        "proc",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        None,
    )?;
    build_dev()
}

/// `/dev` for the tool: six device nodes bound from the devtmpfs, and the
/// usual links. Never the guest's disk or its virtio ports.
fn build_dev() -> Result<(), Fail> {
    let dev = format!("{ROOT}/dev");
    mount_fs(
        "dev",
        &dev,
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        Some(c"mode=0755,size=64k"),
    )?;
    for node in ["null", "zero", "full", "random", "urandom", "tty"] {
        let dst = format!("{dev}/{node}");
        File::create(&dst).map_err(|e| failed("dev", format!("{dst}: {e}")))?;
        mount_bind(format!("/dev/{node}"), &dst)
            .map_err(|e| failed("dev", format!("{dst}: {e}")))?;
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        std::os::unix::fs::symlink(target, format!("{dev}/{link}"))
            .map_err(|e| failed("dev", format!("{link}: {e}")))?;
    }
    mount_remount(
        &dev,
        MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NOEXEC,
        c"",
    )
    .map_err(|e| failed("dev", format!("read-only: {e}")))
}

fn uptime_ms() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1000 + u64::try_from(t.tv_nsec).unwrap_or(0) / 1_000_000
}

fn read_task(ctl: &mut Control) -> Result<Task, Fail> {
    let mut line = String::new();
    let n = ctl.input.read_line(&mut line).map_err(fail("task"))?;
    if n == 0 {
        return Err(failed(
            "task",
            "control port closed before a task".to_owned(),
        ));
    }
    let task: Task = serde_json::from_str(line.trim_end()).map_err(fail("task"))?;
    if task.argv.is_empty() {
        return Err(failed("task", "empty argv".to_owned()));
    }
    Ok(task)
}

/// Mixes the host's bytes into the input pool and reseeds the CRNG, so
/// guests restored from one snapshot do not share their random state.
fn reseed(task: &Task) -> Result<(), Fail> {
    let bytes = hex::decode(&task.entropy).map_err(fail("entropy"))?;
    if bytes.len() < ENTROPY_BYTES {
        return Err(failed(
            "entropy",
            format!(
                "{} bytes of host entropy, want {ENTROPY_BYTES}",
                bytes.len()
            ),
        ));
    }
    let random = OpenOptions::new()
        .write(true)
        .open("/dev/random")
        .map_err(fail("entropy"))?;
    cordon_sys::entropy::add_entropy(random.as_fd(), &bytes).map_err(fail("entropy"))?;
    cordon_sys::entropy::reseed_crng(random.as_fd()).map_err(fail("entropy"))
}

fn set_clock(time_ns: u64) -> Result<(), Fail> {
    let ts = rustix::time::Timespec {
        tv_sec: i64::try_from(time_ns / 1_000_000_000).map_err(fail("clock"))?,
        tv_nsec: i64::try_from(time_ns % 1_000_000_000).map_err(fail("clock"))?,
    };
    rustix::time::clock_settime(rustix::time::ClockId::Realtime, ts).map_err(fail("clock"))
}

/// The task's cgroup: its `memory.events`, read after the tool exits, and
/// whether its memory-pressure watch killed it.
struct Cgroup {
    events: File,
    thrashed: Option<Arc<AtomicBool>>,
}

impl Cgroup {
    /// Whether the tool was killed for its memory: by the kernel's OOM
    /// killer, or by the pressure watch.
    fn out_of_memory(&mut self) -> bool {
        self.oom_kills() > 0
            || self
                .thrashed
                .as_ref()
                .is_some_and(|t| t.load(Ordering::SeqCst))
    }

    fn oom_kills(&mut self) -> u64 {
        let mut s = String::new();
        if self.events.seek(SeekFrom::Start(0)).is_err()
            || self.events.read_to_string(&mut s).is_err()
        {
            return 0;
        }
        s.lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

fn write_file(path: &str, value: &str) -> std::io::Result<()> {
    fs::write(path, value).map_err(|e| std::io::Error::new(e.kind(), format!("{path}: {e}")))
}

/// Mounts cgroup v2 and makes the task's (empty) cgroup, before `ready`:
/// a restored guest then only writes its limits. `Err` when the kernel has
/// no cgroup v2 memory and pids controllers.
fn prepare_cgroup() -> std::io::Result<()> {
    fs::create_dir_all(CGROUP)?;
    mount(
        "cgroup2",
        CGROUP,
        "cgroup2",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        None,
    )?;
    write_file(&format!("{CGROUP}/cgroup.subtree_control"), "+memory +pids")?;
    fs::create_dir_all(format!("{CGROUP}/task"))
}

/// The task's limits on its cgroup, with PID 1 in it (the OOM killer never
/// picks PID 1; `pids.max` counts it and its pressure watches' threads, so
/// it gets as many more).
fn cgroup(task: &Task) -> std::io::Result<Cgroup> {
    let dir = format!("{CGROUP}/task");
    if let Some(m) = task.limits.memory_mib {
        write_file(&format!("{dir}/memory.max"), &(m * 1024 * 1024).to_string())?;
        write_file(&format!("{dir}/memory.swap.max"), "0").or_else(|e| {
            // No swap accounting without swap: nothing to bound.
            if e.kind() == std::io::ErrorKind::NotFound {
                Ok(())
            } else {
                Err(e)
            }
        })?;
        write_file(&format!("{dir}/memory.oom.group"), "1")?;
    }
    let events = File::open(format!("{dir}/memory.events"))?;
    let thrashed = match task.limits.memory_mib {
        Some(_) => watch_pressure(&dir)?,
        None => None,
    };
    if let Some(p) = task.limits.pids {
        // PID 1 and its pressure watches' threads are not the tool's.
        let watches = if thrashed.is_some() {
            PRESSURE.len()
        } else {
            0
        };
        write_file(
            &format!("{dir}/pids.max"),
            &(p + 1 + watches as u64).to_string(),
        )?;
    }
    write_file(&format!("{dir}/cgroup.procs"), "0")?;
    Ok(Cgroup { events, thrashed })
}

/// One memory-pressure (PSI) watch on the task's cgroup: every task of the
/// cgroup stalled on memory for the trigger's share of a window, in
/// `windows` windows in a row (an event later than `gap` after the previous
/// one starts the count anew).
struct Pressure {
    trigger: &'static str,
    windows: u32,
    gap: Duration,
}

/// The watches, each killing the task when it fires:
const PRESSURE: [Pressure; 2] = [
    // Stalled for 2 s of every 10 s window, for 30 s: a tool that spends a
    // fifth of its time waiting on its own memory for that long is out of
    // memory, not merely busy (a thrashing tool measured here stalls
    // 20-25%, an ordinary one at its limit in short bursts).
    Pressure {
        trigger: "full 2000000 10000000",
        windows: 3,
        gap: Duration::from_secs(12),
    },
    // Stalled for more than half of every second, for 3 s: stuck. A tool
    // that fills its limit with anonymous memory and then evicts and
    // refaults its own program's pages stalls so (measured under TCG: the
    // probe agent's memory probe at a 64 or 128 MiB limit was killed
    // 3.4-5.5 s after its start by this watch, filling included; by the
    // kernel's OOM killer without it, 2-18 s, and past a 20 s wall clock
    // on a loaded host).
    Pressure {
        trigger: "full 500000 1000000",
        windows: 3,
        gap: Duration::from_millis(1500),
    },
];

/// Watches the task cgroup's memory pressure ([`PRESSURE`]) and kills every
/// process in it (`cgroup.kill`; PID 1, in the cgroup too, ignores the
/// signal) when a watch fires. Without swap the kernel's OOM killer does
/// not fire while reclaim still frees something: a tool whose anonymous
/// memory fills its `memory.max` can evict and refault its own program's
/// pages for minutes. Such a tool is killed as out of memory, not left to
/// hang until its wall clock. `None` when the kernel has no PSI.
fn watch_pressure(dir: &str) -> std::io::Result<Option<Arc<AtomicBool>>> {
    let flag = Arc::new(AtomicBool::new(false));
    for p in &PRESSURE {
        if !watch(dir, p, flag.clone())? {
            return Ok(None);
        }
    }
    Ok(Some(flag))
}

/// Starts one watch; false when the kernel has no PSI.
fn watch(dir: &str, p: &'static Pressure, set: Arc<AtomicBool>) -> std::io::Result<bool> {
    let path = format!("{dir}/memory.pressure");
    let mut fd = match OpenOptions::new().read(true).write(true).open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(std::io::Error::new(e.kind(), format!("{path}: {e}"))),
    };
    match fd.write_all(p.trigger.as_bytes()) {
        Ok(()) => {}
        // PSI compiled in but off (`psi=0`).
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::OPNOTSUPP.raw_os_error()) => {
            return Ok(false);
        }
        Err(e) => return Err(std::io::Error::new(e.kind(), format!("{path}: {e}"))),
    }
    // Opened now, before the tool starts.
    let kill_path = format!("{dir}/cgroup.kill");
    let mut kill = OpenOptions::new()
        .write(true)
        .open(&kill_path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("{kill_path}: {e}")))?;
    // The kernel's log, shown on the console beside the OOM killer's lines.
    let mut kmsg = OpenOptions::new().write(true).open("/dev/kmsg").ok();
    std::thread::spawn(move || {
        let mut windows = 0;
        loop {
            let mut fds = [PollFd::new(&fd, PollFlags::PRI)];
            let gap = rustix::time::Timespec {
                tv_sec: p.gap.as_secs() as i64,
                tv_nsec: i64::from(p.gap.subsec_nanos()),
            };
            match rustix::event::poll(&mut fds, Some(&gap)) {
                // The window passed without an event.
                Ok(0) => {
                    windows = 0;
                    continue;
                }
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => return,
            }
            let revents = fds[0].revents();
            if revents.contains(PollFlags::PRI) {
                windows += 1;
                if windows < p.windows {
                    continue;
                }
                set.store(true, Ordering::SeqCst);
                let said = match kill.write_all(b"1") {
                    Ok(()) => format!(
                        "<3>cordon-vm-init: the task stalled on memory at its limit ({}, {} windows in a row): killed",
                        p.trigger, p.windows
                    ),
                    Err(e) => format!("<3>cordon-vm-init: {kill_path}: {e}"),
                };
                if let Some(k) = kmsg.as_mut() {
                    let _ = k.write_all(said.as_bytes());
                }
                return;
            }
            if revents.intersects(PollFlags::ERR | PollFlags::NVAL) {
                return;
            }
        }
    });
    Ok(true)
}

/// The guest's side of the egress doors: listens on `127.0.0.1:PORT` for
/// each of the task's `net` ports (the proxy door) and, with the task's
/// `doors`, on
/// `0.0.0.0:PORT` for each allowed port, with the doors' networks local on
/// `lo` and DNS answered on `127.0.0.1:53`; each connection goes over the
/// network channel `port` as the address the tool dialed. The threads live
/// until the guest powers off.
fn start_net(task: &Task, port: File) -> Result<(), Fail> {
    let bind = |ip: Ipv4Addr, p: u16| {
        std::net::TcpListener::bind((ip, p))
            .map_err(|e| failed("net", format!("listen on {ip}:{p}: {e}")))
    };
    let mut listeners = Vec::new();
    for &p in &task.net {
        if p == 0 {
            return Err(failed("net", "port 0 in the task's net ports".to_owned()));
        }
        listeners.push(bind(Ipv4Addr::LOCALHOST, p)?);
    }
    let mut dns = None;
    if let Some(d) = &task.doors {
        let route = cordon_sys::net::route_socket().map_err(|e| failed("net", e.to_string()))?;
        for (seq, (ip, prefix)) in (1u32..).zip(&d.local) {
            cordon_sys::net::add_local_address(route.as_fd(), IpAddr::V4(*ip), *prefix, seq)
                .map_err(|e| failed("net", format!("make {ip}/{prefix} local: {e}")))?;
        }
        for &p in &d.ports {
            listeners.push(bind(Ipv4Addr::UNSPECIFIED, p)?);
        }
        if d.dns.is_some() {
            // DNS over TCP on the loopback, unless an allowed port 53
            // catches it already.
            if !d.ports.contains(&DNS_PORT) {
                listeners.push(bind(Ipv4Addr::LOCALHOST, DNS_PORT)?);
            }
            let udp = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, DNS_PORT))
                .map_err(|e| failed("net", format!("listen on 127.0.0.1:53 (udp): {e}")))?;
            dns = Some((udp, route));
        }
    }
    let input = port.try_clone().map_err(fail("net"))?;
    let net = Arc::new(GuestNet::start(input, port).map_err(fail("net"))?);
    for listener in listeners {
        let net = net.clone();
        let name = listener
            .local_addr()
            .map(|a| format!("accept-{}", a.port()))
            .unwrap_or_default();
        std::thread::Builder::new()
            .name(name)
            .stack_size(128 * 1024)
            .spawn(move || {
                for conn in listener.incoming() {
                    match conn {
                        Ok(c) => match c.local_addr() {
                            Ok(SocketAddr::V4(to)) => net.open(c, to),
                            _ => drop(c),
                        },
                        // Out of descriptors, say: the client retries.
                        Err(_) => std::thread::sleep(Duration::from_millis(10)),
                    }
                }
            })
            .map_err(fail("net"))?;
    }
    if let Some((udp, route)) = dns {
        let learned = Arc::new(std::sync::Mutex::new(Learned {
            route,
            known: std::collections::HashSet::new(),
            seq: 1000,
        }));
        for i in 0..DNS_WORKERS {
            let udp = udp.try_clone().map_err(fail("net"))?;
            let learned = learned.clone();
            std::thread::Builder::new()
                .name(format!("dns-{i}"))
                .stack_size(128 * 1024)
                .spawn(move || serve_dns(&udp, &learned))
                .map_err(fail("net"))?;
        }
    }
    Ok(())
}

/// Threads answering DNS queries, each one query at a time; more wait in
/// the socket's queue.
const DNS_WORKERS: usize = 8;

/// The addresses DNS answers made local on `lo`, and the socket that
/// makes them so.
struct Learned {
    route: std::os::fd::OwnedFd,
    known: std::collections::HashSet<Ipv4Addr>,
    seq: u32,
}

/// Answers UDP queries on `udp`, one at a time: each carried over
/// DNS-over-TCP to `127.0.0.1:53` (the init's own listener, whose streams
/// the host relays to the DNS door), each IPv4 address of the answer made
/// local on `lo` first, then the answer sent back.
fn serve_dns(udp: &std::net::UdpSocket, learned: &std::sync::Mutex<Learned>) {
    let mut buf = vec![0u8; 4096];
    loop {
        let Ok((n, peer)) = udp.recv_from(&mut buf) else {
            std::thread::sleep(Duration::from_millis(10));
            continue;
        };
        let Some(answer) = dns_exchange(&buf[..n]) else {
            continue;
        };
        {
            let mut l = learned.lock().unwrap_or_else(|p| p.into_inner());
            for ip in cordon_vm_init::dns::a_records(&answer) {
                if l.known.insert(ip) {
                    l.seq = l.seq.wrapping_add(1);
                    let _ = cordon_sys::net::add_local_address(
                        l.route.as_fd(),
                        IpAddr::V4(ip),
                        32,
                        l.seq,
                    );
                }
            }
        }
        let _ = udp.send_to(&answer, peer);
    }
}

/// One query over DNS-over-TCP to the guest's own `127.0.0.1:53`.
fn dns_exchange(query: &[u8]) -> Option<Vec<u8>> {
    let mut c = std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, DNS_PORT)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    cordon_vm_init::dns::write_tcp(&mut c, query).ok()?;
    cordon_vm_init::dns::read_tcp(&mut c).ok().flatten()
}

fn run_task(task: &Task, stdio: Stdio3, cgroup_ready: bool) -> Result<GuestMessage, Fail> {
    let Stdio3 {
        stdin,
        stdout,
        stderr,
        net,
    } = stdio;
    if task.networked() {
        start_net(task, net)?;
    }
    mount_fs(
        "tmp",
        &format!("{ROOT}/tmp"),
        "tmpfs",
        MountFlags::NOSUID | MountFlags::NODEV,
        Some(
            std::ffi::CString::new(format!("mode=1777,size={}m", task.limits.tmp_mib.max(1)))
                .map_err(fail("tmp"))?
                .as_c_str(),
        ),
    )?;
    mount_remount(
        ROOT,
        MountFlags::RDONLY | MountFlags::NODEV | MountFlags::NOSUID,
        c"",
    )
    .map_err(|e| failed("root", format!("read-only: {e}")))?;

    if let Some(t) = &task.trust {
        install_trust(t)?;
    }
    let (mut cg, kind) = if cgroup_ready {
        let cg = cgroup(task).map_err(fail("cgroup"))?;
        (Some(cg), LimitKind::Cgroup)
    } else {
        (None, LimitKind::Rlimit)
    };
    let mut rlimits = vec![
        (libc::RLIMIT_NOFILE, task.limits.nofile, task.limits.nofile),
        (libc::RLIMIT_CORE, 0, 0),
    ];
    if !cgroup_ready {
        if let Some(m) = task.limits.memory_mib {
            rlimits.push((libc::RLIMIT_AS, m << 20, m << 20));
        }
        if let Some(p) = task.limits.pids {
            rlimits.push((libc::RLIMIT_NPROC, p, p));
        }
    }
    let status = spawn_tool(task, [stdin, stdout, stderr], rlimits)?;
    let signal = match status {
        cordon_sys::io::ExitStatus::Exited(code) => {
            return Ok(GuestMessage::Exited { code, limits: kind });
        }
        cordon_sys::io::ExitStatus::Signaled(s) => s,
    };
    let oom = cg.as_mut().is_some_and(Cgroup::out_of_memory);
    Ok(GuestMessage::Signaled {
        signal,
        oom,
        limits: kind,
    })
}

/// Writes the task's trust bundle into the tool's `/dev` (made writable
/// for it, read-only again after) and binds it read-only over each of the
/// image's own bundle files.
fn install_trust(t: &Trust) -> Result<(), Fail> {
    let simple = |p: &str, under: &str| {
        p.strip_prefix(under).is_some_and(|rest| {
            !rest.is_empty()
                && Path::new(rest)
                    .components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)))
        })
    };
    if !simple(&t.path, "/dev/") || t.path[5..].contains('/') {
        return Err(failed(
            "trust",
            format!("{}: not a file directly in /dev", t.path),
        ));
    }
    let dev = format!("{ROOT}/dev");
    let writable = MountFlags::NOSUID | MountFlags::NOEXEC;
    // Room for the bundle besides the device nodes' 64 KiB.
    let size = CString::new(format!("size={}k", 64 + t.pem.len().div_ceil(1024) + 8))
        .map_err(fail("trust"))?;
    mount_remount(&dev, writable, &size)
        .map_err(|e| failed("trust", format!("{dev} writable: {e}")))?;
    let file = format!("{ROOT}{}", t.path);
    let written = fs::write(&file, &t.pem)
        .and_then(|()| {
            fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o444))
        })
        .map_err(|e| failed("trust", format!("{file}: {e}")));
    mount_remount(&dev, writable | MountFlags::RDONLY, c"")
        .map_err(|e| failed("trust", format!("{dev} read-only: {e}")))?;
    written?;
    for over in &t.over {
        if !simple(over, "/") {
            return Err(failed("trust", format!("{over}: not an absolute path")));
        }
        let target = format!("{ROOT}{over}");
        mount_bind(&file, &target)
            .and_then(|()| {
                mount_remount(
                    &target,
                    MountFlags::BIND | MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
                    c"",
                )
            })
            .map_err(|e| failed("trust", format!("{target}: {e}")))?;
    }
    Ok(())
}

/// The tool's uid and gid outside its user namespace, in the guest: an
/// unprivileged pair, whatever ids the tool has inside (root included).
const OUTER_ID: u32 = 1000;

/// `PATH` when the task's environment has none.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

fn cstring(what: &'static str, s: &str) -> Result<CString, Fail> {
    CString::new(s).map_err(|_| failed(what, format!("{s:?} contains a NUL byte")))
}

/// Where `argv[0]` is looked for: itself when it has a `/`, else each
/// absolute entry of the task's `PATH`.
fn exec_paths(task: &Task) -> Result<Vec<CString>, Fail> {
    let arg0 = task.argv.first().map(String::as_str).unwrap_or("");
    if arg0.contains('/') {
        return Ok(vec![cstring("exec", arg0)?]);
    }
    let path = cordon_sandbox::exec::search_path(&task.env, DEFAULT_PATH);
    let out: Vec<CString> = cordon_sandbox::exec::path_candidates(path, arg0)
        .iter()
        .map(|p| cstring("exec", p))
        .collect::<Result<_, _>>()?;
    if out.is_empty() {
        return Err(failed(
            "exec",
            format!("{arg0}: no absolute PATH entry to look it up in"),
        ));
    }
    Ok(out)
}

/// Starts the tool as the native jail starts one (`cordon_sys::spawn`):
/// new user, mount, pid, IPC and UTS namespaces (the network stays the
/// guest's: it has no device, and the egress listeners are on its
/// loopback), the task's ids inside mapped to [`OUTER_ID`], a fresh
/// `/proc` of its own pid namespace, chrooted into the tool's root (the
/// initramfs cannot be pivoted away from), every capability dropped,
/// `no_new_privs`, its rlimits and the task's seccomp filters; stdio on
/// the ports. Waits for it.
fn spawn_tool(
    task: &Task,
    stdio: [File; 3],
    rlimits: Vec<(u32, u64, u64)>,
) -> Result<cordon_sys::io::ExitStatus, Fail> {
    use cordon_sys::spawn::{ChildFailure, ChildPlan, Op, Step};
    use std::os::fd::AsRawFd;
    let io = |what: &'static str| move |e: cordon_sys::Errno| failed(what, e.to_string());
    let (sync_r, sync_w) = cordon_sys::io::pipe().map_err(io("spawn"))?;
    let (fail_r, fail_w) = cordon_sys::io::pipe().map_err(io("spawn"))?;
    let step = |op| Step {
        op,
        skip_if_missing: false,
    };
    let steps = vec![
        step(Op::Mount {
            src: Some(cstring("proc", "proc")?),
            target: cstring("proc", &format!("{ROOT}/proc"))?,
            fstype: Some(cstring("proc", "proc")?),
            flags: libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            data: None,
        }),
        step(Op::Chroot {
            path: cstring("chroot", ROOT)?,
        }),
        step(Op::Chdir {
            path: cstring("cwd", &task.cwd)?,
        }),
    ];
    let cap_last = fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(40);
    let argv = task
        .argv
        .iter()
        .map(|a| cstring("argv", a))
        .collect::<Result<Vec<_>, _>>()?;
    let envp = task
        .env
        .iter()
        .map(|(k, v)| cstring("env", &format!("{k}={v}")).map(zeroize::Zeroizing::new))
        .collect::<Result<Vec<_>, _>>()?;
    let plan = ChildPlan {
        namespaces: (libc::CLONE_NEWUSER
            | libc::CLONE_NEWNS
            | libc::CLONE_NEWPID
            | libc::CLONE_NEWIPC
            | libc::CLONE_NEWUTS) as u64,
        cgroup_fd: None,
        stdin: stdio[0].as_raw_fd(),
        stdout: stdio[1].as_raw_fd(),
        stderr: stdio[2].as_raw_fd(),
        sync_read: sync_r.as_raw_fd(),
        err_write: fail_w.as_raw_fd(),
        doors_sock: None,
        cgroup_ns: false,
        join_cgroups: Vec::new(),
        join_net: None,
        clear_groups: true,
        uid: task.uid,
        gid: task.gid,
        steps,
        doors: None,
        rlimits,
        landlock: None,
        cap_last,
        keep_capabilities: false,
        seccomp: task
            .seccomp
            .iter()
            .map(|f| cordon_vm_init::protocol::unpack_filter(f))
            .collect(),
        exec_paths: exec_paths(task)?,
        argv,
        envp,
    };
    let mut child = cordon_sys::spawn::spawn(plan).map_err(|e| {
        failed(
            "spawn",
            format!("clone3 with new user, mount, pid, ipc and uts namespaces: {e}"),
        )
    })?;
    // The child has its own copies now.
    drop((sync_r, fail_w, stdio));
    let proc = format!("/proc/{}", child.pid());
    for (file, inner) in [("uid_map", task.uid), ("gid_map", task.gid)] {
        write_file(
            &format!("{proc}/{file}"),
            &format!("{inner} {OUTER_ID} 1\n"),
        )
        .map_err(|e| failed("ids", format!("{file} ({inner} -> {OUTER_ID}): {e}")))?;
    }
    // Kept open until the tool has been executed: the child takes a hung-up
    // go-ahead pipe for its parent's death.
    cordon_sys::io::write(sync_w.as_fd(), b"g").map_err(io("spawn"))?;
    // Eight bytes: a step failed; end of file: the tool was executed.
    let mut buf = [0u8; 8];
    let mut got = 0;
    while got < buf.len() {
        match cordon_sys::io::read(fail_r.as_fd(), &mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(cordon_sys::Errno::EINTR) => {}
            Err(e) => return Err(failed("spawn", format!("the error pipe: {e}"))),
        }
    }
    if got == buf.len() {
        let f = ChildFailure::decode(buf);
        let _ = child.wait(true);
        return Err(failed(
            "exec",
            format!("{}: {}: {}", task.argv[0], f.step, f.errno),
        ));
    }
    drop(sync_w);
    child
        .wait(true)
        .map_err(io("wait"))?
        .ok_or_else(|| failed("wait", "the tool did not end".to_owned()))
}
