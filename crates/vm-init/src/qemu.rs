//! QEMU `-M microvm` as the VMM: one guest, one task.
//!
//! The guest gets no NIC and no shared directory: a read-only virtio-blk
//! disk (the tool's [`BlockImage`]), four virtio-serial ports (control,
//! stdin, stdout, stderr: one direction each for the stdio, because a
//! port's EOF reaches the guest only when the host side disconnects) and a
//! console kept in a log file. Every port, and QMP, is a unix socket the
//! host listens on before QEMU starts; QEMU connects to each as a client at
//! start-up, so no byte is written before the host is there to read it.
//!
//! A fifth port, `cordon.net`, is the network channel (see [`crate::mux`]):
//! always on the command line, so that a template and its restores have
//! the same devices, and served by [`Vm::run_io`] only for a task with
//! `net` ports.
//!
//! A guest either boots cold ([`Vm::boot`]: the init mounts the tool's
//! root and says `ready`) or is restored from a template's [`Snapshot`]
//! ([`Vm::restore`]). A template ([`Vm::boot_template`]) keeps its RAM in
//! a file (`memory-backend-file`, `share=on`); its snapshot is that file
//! plus the device state, migrated with `x-ignore-shared` (the RAM stays
//! in the file, complete once the template has stopped). A restore maps
//! the same file privately (`share=off,readonly=on,rom=off`: opened
//! read-only, the guest's writes copy-on-write into QEMU's own memory, never
//! the file), starts QEMU with `-incoming defer`, then `migrate-incoming`
//! reads the device state. Restored guests share the file's pages in the
//! page cache and pay only for what they write. Either way [`Vm::run`]
//! sends one task (with fresh host entropy and the clock), carries stdin,
//! stdout and stderr, and returns the typed [`Outcome`]; the guest powers
//! itself off, and a guest that outlives the wall clock is killed.

use std::fs;
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::json;
use thiserror::Error;

use crate::image::{BlockImage, ImageError};
#[cfg(doc)]
use crate::protocol::CARRY_MOUNT;
use crate::protocol::{
    CARRY_ARG, DISK_CARRY, DISK_ROOT, ENTROPY_BYTES, GuestMessage, PORT_CONTROL, PORT_NET,
    PORT_STDERR, PORT_STDIN, PORT_STDOUT, Task,
};
use crate::qmp::{Qmp, QmpError};

/// The accelerator QEMU is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    /// Hardware virtualization (`/dev/kvm`).
    Kvm,
    /// QEMU's own emulation: slow, works everywhere.
    Tcg,
}

/// What every guest of one template shares.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VmConfig {
    pub qemu: PathBuf,
    /// The kernel (a bzImage through microvm's linuxboot ROM, or an
    /// uncompressed vmlinux through its PVH note).
    pub kernel: PathBuf,
    pub initramfs: PathBuf,
    pub image: BlockImage,
    /// A second read-only disk of cordon's own files (the probe agent),
    /// mounted at [`CARRY_MOUNT`] in the tool's root: copied in, never
    /// shared. Part of the device set, so a template and its restores
    /// have it alike.
    #[serde(default)]
    pub carry: Option<BlockImage>,
    pub memory_mib: u32,
    pub cpus: u32,
    pub accel: Accel,
    /// `tsc_early_khz=` for the guest: under TCG without it a share of
    /// boots hang calibrating the TSC. [`host_tsc_khz`] reads it.
    pub tsc_khz: Option<u64>,
    /// QEMU's own seccomp filter (`-sandbox on,...`), where the build has it
    /// ([`qemu_has_sandbox`]).
    pub sandbox: bool,
    /// More kernel command line (`loglevel=7 printk.time=1` to see a boot).
    pub extra_append: Vec<String>,
    /// From QEMU's start to the init's `ready` line (or a restore's running
    /// guest).
    pub boot_timeout: Duration,
    /// The image was verified against its record by the caller already
    /// (a broker checks it once per file version): the launcher does not
    /// read it again.
    #[serde(default)]
    pub image_verified: bool,
}

#[derive(Debug, Error)]
pub enum VmError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Qmp(#[from] QmpError),
    #[error("QEMU exited before the guest was ready ({status}); console: {console}")]
    EarlyExit {
        status: std::process::ExitStatus,
        console: String,
    },
    #[error("the guest was not ready in {timeout:?}; console: {console}")]
    BootTimeout { timeout: Duration, console: String },
    #[error("the guest said {0:?} where it should have said ready")]
    Protocol(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> VmError {
    let what = what.into();
    move |source| VmError::Io { what, source }
}

/// How a task ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The tool exited with this code.
    Exited(i32),
    /// The tool was killed by a signal; `oom` when the guest's OOM killer
    /// did it.
    Signaled { signal: i32, oom: bool },
    /// The init could not run the task.
    GuestError { stage: String, message: String },
    /// The wall clock ran out and QEMU was killed.
    WallClock,
    /// The guest went away without a status: a kernel panic (`panic` set
    /// when the console says so) or a crash of the init.
    GuestDied { panic: bool, console: String },
}

/// A finished task.
#[derive(Debug, Clone)]
pub struct RunResult {
    pub outcome: Outcome,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    /// Output past the cap was read and dropped.
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    /// From QEMU's start to the status line (or the kill).
    pub since_start: Duration,
    /// From the task sent to the status line.
    pub task_time: Duration,
    /// How the guest broke the network channel's protocol (its network
    /// was cut then), or how the channel failed.
    pub net_error: Option<String>,
}

/// The guest's socket files and console log, in a directory of the
/// caller's.
struct Paths {
    dir: PathBuf,
}

impl Paths {
    fn sock(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.sock"))
    }
    fn console(&self) -> PathBuf {
        self.dir.join("console.log")
    }
}

const SOCKETS: [&str; 6] = ["qmp", "ctl", "stdin", "stdout", "stderr", "net"];

/// A template's snapshot: the device state (a QEMU migration stream
/// without the RAM) and the file holding the guest's RAM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    pub state: PathBuf,
    pub ram: PathBuf,
}

/// Where the guest's RAM lives.
#[derive(Debug, Clone, Copy)]
enum Memory<'a> {
    /// QEMU's anonymous memory (a cold boot).
    Anonymous,
    /// A template's: the file, mapped shared (the guest's memory is the
    /// file's contents).
    Template(&'a Path),
    /// A restore's: the template's file mapped privately and read-only
    /// (the guest's writes are copied on write, the file is never written)
    /// and QEMU waiting for the device state.
    Restore(&'a Path),
}

/// The migration capability that leaves RAM in a shared, named file out
/// of the stream.
const IGNORE_SHARED: &str = "x-ignore-shared";
/// The host's TSC frequency in kHz from `/proc/cpuinfo` (`cpu MHz` of the
/// first CPU): the guest's TSC under TCG runs at the host's.
pub fn host_tsc_khz() -> Option<u64> {
    let info = fs::read_to_string("/proc/cpuinfo").ok()?;
    let mhz: f64 = info
        .lines()
        .find_map(|l| l.strip_prefix("cpu MHz"))?
        .trim_start_matches([' ', '\t', ':'])
        .trim()
        .parse()
        .ok()?;
    let khz = (mhz * 1000.0).round();
    (1.0..1e9).contains(&khz).then_some(khz as u64)
}

/// Whether this QEMU build has `-sandbox` (libseccomp).
pub fn qemu_has_sandbox(qemu: &Path) -> bool {
    Command::new(qemu)
        .args(["-sandbox", "on", "-version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

impl VmConfig {
    /// QEMU's command line for this configuration, its sockets in `dir`.
    fn args(&self, paths: &Paths, memory: Memory<'_>) -> Vec<String> {
        let mut append = vec![
            "console=ttyS0".to_owned(),
            "quiet".to_owned(),
            "panic=-1".to_owned(),
            "oops=panic".to_owned(),
        ];
        if let Some(khz) = self.tsc_khz {
            // Under TCG the guest's TSC is the host's: give its rate (a
            // share of boots hang calibrating it otherwise), and keep the
            // clocksource watchdog from demoting it to jiffies mid-boot.
            append.push(format!("tsc_early_khz={khz}"));
            append.push("tsc=reliable".to_owned());
        }
        if self.carry.is_some() {
            append.push(CARRY_ARG.to_owned());
        }
        append.extend(self.extra_append.iter().cloned());
        let p = |name: &str| paths.sock(name).display().to_string();
        let mut a: Vec<String> = vec![
            "-M".into(),
            match memory {
                Memory::Anonymous => "microvm".into(),
                Memory::Template(_) | Memory::Restore(_) => "microvm,memory-backend=ram".into(),
            },
            "-accel".into(),
            match self.accel {
                Accel::Kvm => "kvm".into(),
                Accel::Tcg => "tcg".into(),
            },
        ];
        if self.accel == Accel::Kvm {
            a.extend(["-cpu".into(), "host".into()]);
        }
        a.extend([
            "-m".into(),
            self.memory_mib.to_string(),
            "-smp".into(),
            self.cpus.to_string(),
            "-nodefaults".into(),
            "-no-user-config".into(),
            "-display".into(),
            "none".into(),
            "-nic".into(),
            "none".into(),
            "-no-reboot".into(),
            "-kernel".into(),
            self.kernel.display().to_string(),
            "-initrd".into(),
            self.initramfs.display().to_string(),
            "-append".into(),
            append.join(" "),
            "-chardev".into(),
            format!("file,id=con,path={}", paths.console().display()),
            "-serial".into(),
            "chardev:con".into(),
            "-drive".into(),
            format!(
                "id=root,file={},format=raw,if=none,read-only=on",
                self.image.path.display()
            ),
            "-device".into(),
            format!("virtio-blk-device,drive=root,serial={DISK_ROOT}"),
            "-device".into(),
            "virtio-serial-device".into(),
            "-chardev".into(),
            format!("socket,id=qmp,path={}", p("qmp")),
            "-mon".into(),
            "chardev=qmp,mode=control".into(),
        ]);
        if let Some(c) = &self.carry {
            a.extend([
                "-drive".into(),
                format!(
                    "id=carry,file={},format=raw,if=none,read-only=on",
                    c.path.display()
                ),
                "-device".into(),
                format!("virtio-blk-device,drive=carry,serial={DISK_CARRY}"),
            ]);
        }
        for (id, name) in [
            ("ctl", PORT_CONTROL),
            ("stdin", PORT_STDIN),
            ("stdout", PORT_STDOUT),
            ("stderr", PORT_STDERR),
            ("net", PORT_NET),
        ] {
            a.push("-chardev".into());
            a.push(format!("socket,id={id},path={}", p(id)));
            a.push("-device".into());
            a.push(format!("virtserialport,chardev={id},name={name}"));
        }
        if self.sandbox {
            a.push("-sandbox".into());
            a.push(
                "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny".into(),
            );
        }
        let backend = |path: &Path, how: &str| {
            format!(
                "memory-backend-file,id=ram,size={}M,mem-path={},{how}",
                self.memory_mib,
                path.display()
            )
        };
        match memory {
            Memory::Anonymous => {}
            Memory::Template(ram) => {
                a.push("-object".into());
                a.push(backend(ram, "share=on"));
            }
            Memory::Restore(ram) => {
                // Opened read-only, mapped MAP_PRIVATE, and RAM (not ROM)
                // to the guest: its writes land in QEMU's own pages.
                a.push("-object".into());
                a.push(backend(ram, "share=off,readonly=on,rom=off"));
                a.push("-incoming".into());
                a.push("defer".into());
            }
        }
        a
    }
}

/// A running QEMU and the host ends of its guest's channels.
pub struct Vm {
    child: Child,
    paths: Paths,
    qmp: Qmp,
    ctl: BufReader<UnixStream>,
    ctl_out: UnixStream,
    stdin: Option<UnixStream>,
    stdout: UnixStream,
    stderr: UnixStream,
    /// The network channel's host end.
    net: UnixStream,
    started: Instant,
    /// A template's RAM file.
    ram: Option<PathBuf>,
    /// Spawn to ready (cold) or to running (restored).
    pub ready_after: Duration,
}

fn tail(path: &Path, max: usize) -> String {
    let bytes = fs::read(path).unwrap_or_default();
    let from = bytes.len().saturating_sub(max);
    String::from_utf8_lossy(&bytes[from..]).into_owned()
}

impl Vm {
    /// Starts QEMU for `cfg` with its sockets in `dir`, QEMU running as `ids` (uid, gid) when given (a
    /// root caller drops it; the sockets are handed to those ids).
    fn spawn_as(
        cfg: &VmConfig,
        dir: &Path,
        memory: Memory<'_>,
        ids: Option<(u32, u32)>,
    ) -> Result<Vm, VmError> {
        if !cfg.image_verified {
            cfg.image.verify()?;
            if let Some(c) = &cfg.carry {
                c.verify()?;
            }
        }
        fs::create_dir_all(dir).map_err(io(format!("{}", dir.display())))?;
        let paths = Paths {
            dir: dir.to_owned(),
        };
        let _ = fs::remove_file(paths.console());
        let mut listeners = Vec::new();
        for name in SOCKETS {
            let path = paths.sock(name);
            let _ = fs::remove_file(&path);
            let l = UnixListener::bind(&path).map_err(io(format!("{}", path.display())))?;
            l.set_nonblocking(true)
                .map_err(io(format!("{}", path.display())))?;
            if let Some((uid, gid)) = ids {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                    .map_err(io(format!("chown {}", path.display())))?;
            }
            listeners.push(l);
        }
        let started = Instant::now();
        let mut cmd = Command::new(&cfg.qemu);
        cmd.args(cfg.args(&paths, memory))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if let Some((uid, gid)) = ids {
            // std drops the supplementary groups too when a root caller
            // changes the uid.
            std::os::unix::process::CommandExt::uid(&mut cmd, uid);
            std::os::unix::process::CommandExt::gid(&mut cmd, gid);
        }
        let mut child = cmd.spawn().map_err(io(format!("{}", cfg.qemu.display())))?;
        // QEMU connects to every socket while it starts up.
        let streams = accept_all(&listeners, &mut child, started, cfg.boot_timeout)?;
        for (_, name) in listeners.into_iter().zip(SOCKETS) {
            let _ = fs::remove_file(paths.sock(name));
        }
        let mut it = streams.into_iter();
        let (Some(qmp), Some(ctl), Some(stdin), Some(stdout), Some(stderr), Some(net)) = (
            it.next(),
            it.next(),
            it.next(),
            it.next(),
            it.next(),
            it.next(),
        ) else {
            kill(&mut child);
            return Err(VmError::Protocol("missing sockets".to_owned()));
        };
        let qmp = match Qmp::handshake(qmp, Duration::from_secs(30)) {
            Ok(q) => q,
            Err(e) => {
                // QEMU giving up at start-up says why on its stderr.
                std::thread::sleep(Duration::from_millis(50));
                let exited = child.try_wait().ok().flatten();
                kill(&mut child);
                let mut err = String::new();
                if let Some(mut s) = child.stderr.take() {
                    let _ = s.read_to_string(&mut err);
                }
                return Err(match exited {
                    Some(status) if !err.trim().is_empty() => VmError::EarlyExit {
                        status,
                        console: err.trim().to_owned(),
                    },
                    _ => e.into(),
                });
            }
        };
        let ctl_out = ctl.try_clone().map_err(io("ctl"))?;
        Ok(Vm {
            child,
            paths,
            qmp,
            ctl: BufReader::new(ctl),
            ctl_out,
            stdin: Some(stdin),
            stdout,
            stderr,
            net,
            started,
            ram: match memory {
                Memory::Template(p) => Some(p.to_owned()),
                _ => None,
            },
            ready_after: Duration::ZERO,
        })
    }

    /// Boots a guest cold and waits for its init's `ready` line. `dir`
    /// holds its sockets and console log.
    pub fn boot(cfg: &VmConfig, dir: &Path) -> Result<Vm, VmError> {
        Vm::boot_as(cfg, dir, None)
    }

    /// [`Vm::boot`] with QEMU as `ids` (see [`Vm::restore_as`]).
    pub fn boot_as(cfg: &VmConfig, dir: &Path, ids: Option<(u32, u32)>) -> Result<Vm, VmError> {
        Vm::boot_in(cfg, dir, Memory::Anonymous, ids)
    }

    /// Boots a template guest cold, its RAM in the file `ram` (made by
    /// QEMU, as `ids` when given): [`Vm::snapshot`] it once it is ready.
    pub fn boot_template(
        cfg: &VmConfig,
        dir: &Path,
        ram: &Path,
        ids: Option<(u32, u32)>,
    ) -> Result<Vm, VmError> {
        let _ = fs::remove_file(ram);
        Vm::boot_in(cfg, dir, Memory::Template(ram), ids)
    }

    fn boot_in(
        cfg: &VmConfig,
        dir: &Path,
        memory: Memory<'_>,
        ids: Option<(u32, u32)>,
    ) -> Result<Vm, VmError> {
        let mut vm = Vm::spawn_as(cfg, dir, memory, ids)?;
        let deadline = vm.started + cfg.boot_timeout;
        match vm.read_ctl(deadline) {
            Ok(Some(GuestMessage::Ready { .. })) => {
                vm.ready_after = vm.started.elapsed();
                Ok(vm)
            }
            Ok(Some(other)) => Err(VmError::Protocol(format!("{other:?}"))),
            Ok(None) => {
                let status = vm.reap(Duration::from_secs(5));
                let console = tail(&vm.paths.console(), 2000);
                match status {
                    Some(status) => Err(VmError::EarlyExit { status, console }),
                    None => Err(VmError::BootTimeout {
                        timeout: cfg.boot_timeout,
                        console,
                    }),
                }
            }
            Err(e) => Err(e),
        }
    }

    /// Restores a guest from `snapshot` (taken by [`Vm::snapshot`] of a
    /// template with the same `cfg`).
    pub fn restore(cfg: &VmConfig, snapshot: &Snapshot, dir: &Path) -> Result<Vm, VmError> {
        Vm::restore_as(cfg, snapshot, dir, None)
    }

    /// [`Vm::restore`] with QEMU running as `ids` (uid, gid): a root caller
    /// never leaves QEMU root. `dir` must be usable by them, the snapshot's
    /// files readable.
    pub fn restore_as(
        cfg: &VmConfig,
        snapshot: &Snapshot,
        dir: &Path,
        ids: Option<(u32, u32)>,
    ) -> Result<Vm, VmError> {
        let mut vm = Vm::spawn_as(cfg, dir, Memory::Restore(&snapshot.ram), ids)?;
        let r = (|| -> Result<(), QmpError> {
            vm.qmp.execute(
                "migrate-set-capabilities",
                Some(json!({"capabilities": [{"capability": IGNORE_SHARED, "state": true}]})),
            )?;
            vm.qmp.execute(
                "migrate-incoming",
                Some(json!({"uri": format!("file:{}", snapshot.state.display())})),
            )?;
            vm.qmp.resume_incoming(cfg.boot_timeout)
        })();
        if let Err(e) = r {
            vm.kill();
            return Err(e.into());
        }
        vm.ready_after = vm.started.elapsed();
        Ok(vm)
    }

    /// Stops this (ready, task-less) template guest, writes its device
    /// state to `state` (QEMU migration to a file with `x-ignore-shared`:
    /// the RAM stays in the template's file, which holds all of it once
    /// QEMU has stopped), and ends QEMU.
    pub fn snapshot(mut self, state: &Path) -> Result<Snapshot, VmError> {
        let Some(ram) = self.ram.clone() else {
            self.kill();
            return Err(VmError::Protocol(
                "only a template guest (Vm::boot_template) is snapshotted".to_owned(),
            ));
        };
        let _ = fs::remove_file(state);
        let r = (|| -> Result<(), QmpError> {
            self.qmp.execute("stop", None)?;
            self.qmp.execute(
                "migrate-set-capabilities",
                Some(json!({"capabilities": [{"capability": IGNORE_SHARED, "state": true}]})),
            )?;
            self.qmp.execute(
                "migrate",
                Some(json!({"uri": format!("file:{}", state.display())})),
            )?;
            self.qmp.wait_migration(Duration::from_secs(120))?;
            // QEMU's quit unmaps the file; its pages are in the page cache
            // (and the file) whether or not they reached the disk yet.
            Ok(())
        })();
        self.kill();
        r.map_err(VmError::from)?;
        Ok(Snapshot {
            state: state.to_owned(),
            ram,
        })
    }

    /// The guest's console log (kernel messages, the init's last words).
    pub fn console_log(&self) -> PathBuf {
        self.paths.console()
    }

    /// The QEMU process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Reads the next control line before `deadline`; `None` when the
    /// guest closed the port (QEMU exited) or the deadline passed.
    fn read_ctl(&mut self, deadline: Instant) -> Result<Option<GuestMessage>, VmError> {
        let mut line = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            self.ctl
                .get_ref()
                .set_read_timeout(Some(left))
                .map_err(io("ctl"))?;
            match self.ctl.read_until(b'\n', &mut line) {
                Ok(0) => return Ok(None),
                Ok(_) if line.ends_with(b"\n") => break,
                Ok(_) => continue,
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                    ) =>
                {
                    continue;
                }
                Err(e) => return Err(io("ctl")(e)),
            }
        }
        serde_json::from_slice(&line)
            .map(Some)
            .map_err(|e| VmError::Protocol(format!("{e}: {}", String::from_utf8_lossy(&line))))
    }

    /// Waits up to `grace` for QEMU to exit by itself, then kills it;
    /// returns its status when it exited by itself.
    fn reap(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        let until = Instant::now() + grace;
        loop {
            match self.child.try_wait() {
                Ok(Some(s)) => return Some(s),
                Ok(None) if Instant::now() < until => std::thread::sleep(Duration::from_millis(2)),
                _ => {
                    self.kill();
                    return None;
                }
            }
        }
    }

    fn kill(&mut self) {
        kill(&mut self.child);
    }

    /// Runs `task` with `stdin` as its standard input, keeping at most
    /// `output_cap` bytes of each output stream, killing QEMU when `wall`
    /// runs out. The task's entropy and clock are filled in here.
    pub fn run(
        self,
        task: &Task,
        stdin: Vec<u8>,
        wall: Duration,
        output_cap: usize,
    ) -> Result<RunResult, VmError> {
        let out = Capped::new(output_cap);
        let err = Capped::new(output_cap);
        let ran = self.run_io(task, std::io::Cursor::new(stdin), out, err, Some(wall))?;
        Ok(RunResult {
            outcome: ran.outcome,
            stdout: ran.stdout.kept,
            stderr: ran.stderr.kept,
            stdout_truncated: ran.stdout.truncated,
            stderr_truncated: ran.stderr.truncated,
            since_start: ran.since_start,
            task_time: ran.task_time,
            net_error: ran.net_error,
        })
    }

    /// Runs `task`, streaming: `stdin` is copied to the guest's stdin port
    /// until its EOF (then the port is disconnected: the guest reads EOF),
    /// the guest's stdout and stderr ports to `stdout` and `stderr` as
    /// they arrive. A task with `net` ports gets the network channel
    /// served ([`crate::relay::serve_host`]: each stream the guest opens
    /// to one of those ports becomes a connection to it on this process's
    /// loopback). With `wall`, QEMU is killed when it runs out (a caller
    /// whose own supervisor keeps the clock passes `None`). Returns the
    /// writers once the guest is gone.
    pub fn run_io<R, O, E>(
        mut self,
        task: &Task,
        stdin: R,
        stdout: O,
        stderr: E,
        wall: Option<Duration>,
    ) -> Result<Ran<O, E>, VmError>
    where
        R: Read + Send + 'static,
        O: Write + Send + 'static,
        E: Write + Send + 'static,
    {
        let mut task = task.clone();
        let mut entropy = [0u8; ENTROPY_BYTES];
        rustix::rand::getrandom(&mut entropy, rustix::rand::GetRandomFlags::empty())
            .map_err(|e| io("getrandom")(e.into()))?;
        task.entropy = hex::encode(entropy);
        task.time_ns = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        let mut line =
            serde_json::to_string(&task).map_err(|e| VmError::Protocol(format!("task: {e}")))?;
        line.push('\n');

        let sent = Instant::now();
        // Thirty days stands for "no deadline of ours".
        let deadline = sent + wall.unwrap_or(Duration::from_secs(30 * 86400));
        let out = pump(self.stdout.try_clone().map_err(io("stdout"))?, stdout);
        let err = pump(self.stderr.try_clone().map_err(io("stderr"))?, stderr);
        self.ctl_out
            .write_all(line.as_bytes())
            .map_err(io("send the task"))?;
        if let Some(s) = self.stdin.take() {
            feed(stdin, s);
        }
        // The DNS relay lives as long as this run (dropped at its end).
        let mut dns_relay = None;
        let net = if !task.networked() {
            None
        } else {
            let input = self.net.try_clone().map_err(io("net"))?;
            let output = self.net.try_clone().map_err(io("net"))?;
            let mut reach = crate::relay::Reach {
                loopback: task.net.clone(),
                ..Default::default()
            };
            if let Some(d) = &task.doors {
                reach.transparent = d.ports.clone();
                if let Some(door) = d.dns {
                    let r = crate::dns_relay::DnsRelay::start(door).map_err(io("the DNS relay"))?;
                    reach.dns = Some(r.addr());
                    dns_relay = Some(r);
                }
            }
            // Ends when QEMU does (the channel's EOF), shutting every
            // stream; a guest that breaks the protocol loses its network
            // at once, and the run says why (kept as it happens: nothing
            // waits for the thread).
            let broke = Arc::new(Mutex::new(None));
            let keep = broke.clone();
            std::thread::Builder::new()
                .name("net".to_owned())
                .spawn(move || {
                    if let Err(e) = crate::relay::serve_host(input, output, &reach) {
                        *keep.lock().unwrap_or_else(PoisonError::into_inner) = Some(e);
                    }
                })
                .map_err(io("a thread for the network channel"))?;
            Some(broke)
        };

        let msg = self.read_ctl(deadline)?;
        let since_start = self.started.elapsed();
        let task_time = sent.elapsed();
        let outcome = match msg {
            Some(GuestMessage::Exited { code, .. }) => Outcome::Exited(code),
            Some(GuestMessage::Signaled { signal, oom, .. }) => Outcome::Signaled { signal, oom },
            Some(GuestMessage::Error { stage, message }) => Outcome::GuestError { stage, message },
            Some(GuestMessage::Ready { .. }) => {
                self.kill();
                return Err(VmError::Protocol("ready after the task".to_owned()));
            }
            None if Instant::now() >= deadline => {
                self.kill();
                Outcome::WallClock
            }
            None => {
                self.reap(Duration::from_secs(5));
                let console = tail(&self.paths.console(), 4000);
                Outcome::GuestDied {
                    panic: console.contains("Kernel panic"),
                    console,
                }
            }
        };
        // The guest powers itself off after its status line; its ports
        // close with QEMU, which ends the pumps.
        self.reap(Duration::from_secs(10));
        drop(dns_relay);
        let stdout = out
            .join()
            .map_err(|_| VmError::Protocol("the stdout pump panicked".to_owned()))?;
        let stderr = err
            .join()
            .map_err(|_| VmError::Protocol("the stderr pump panicked".to_owned()))?;
        Ok(Ran {
            outcome,
            stdout,
            stderr,
            since_start,
            task_time,
            net_error: net.and_then(|b| b.lock().unwrap_or_else(PoisonError::into_inner).take()),
        })
    }
}

/// A finished streaming task ([`Vm::run_io`]): the outcome, the writers
/// given, and the times.
#[derive(Debug)]
pub struct Ran<O, E> {
    pub outcome: Outcome,
    pub stdout: O,
    pub stderr: E,
    /// From QEMU's start to the status line (or the kill).
    pub since_start: Duration,
    /// From the task sent to the status line.
    pub task_time: Duration,
    /// As [`RunResult::net_error`].
    pub net_error: Option<String>,
}

/// Keeps at most `cap` bytes; the rest is counted as truncated.
#[derive(Debug, Default)]
pub struct Capped {
    pub kept: Vec<u8>,
    pub truncated: bool,
    cap: usize,
}

impl Capped {
    pub fn new(cap: usize) -> Capped {
        Capped {
            kept: Vec::new(),
            truncated: false,
            cap,
        }
    }
}

impl Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let room = self.cap.saturating_sub(self.kept.len());
        self.kept.extend_from_slice(&buf[..buf.len().min(room)]);
        self.truncated |= buf.len() > room;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Copies `from` into the guest's stdin port on a thread of its own; at
/// EOF (or an error either side) the port's host end is dropped, which
/// disconnects it: the guest reads EOF.
fn feed<R: Read + Send + 'static>(mut from: R, mut port: UnixStream) {
    std::thread::spawn(move || {
        let mut buf = [0u8; 16 * 1024];
        loop {
            match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if port.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
    });
}

/// Copies `s` to `w` until EOF; once `w` fails the rest is read and
/// dropped (the guest never blocks on a full port).
fn pump<W: Write + Send + 'static>(mut s: UnixStream, mut w: W) -> JoinHandle<W> {
    std::thread::spawn(move || {
        let mut ok = true;
        let mut buf = [0u8; 16 * 1024];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if ok {
                        ok = w.write_all(&buf[..n]).and_then(|()| w.flush()).is_ok();
                    }
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => break,
            }
        }
        w
    })
}

/// Accepts QEMU's connection on each of `listeners` (in [`SOCKETS`]'
/// order), while watching that QEMU is still there and within `timeout` of
/// `started`; QEMU is killed on a failure.
fn accept_all(
    listeners: &[UnixListener],
    child: &mut Child,
    started: Instant,
    timeout: Duration,
) -> Result<Vec<UnixStream>, VmError> {
    let mut streams = Vec::new();
    for (l, name) in listeners.iter().zip(SOCKETS) {
        let s = loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                Err(e) => {
                    kill(child);
                    return Err(io(format!("accept {name}"))(e));
                }
            }
            if let Some(status) = child.try_wait().map_err(io("qemu"))? {
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err);
                }
                return Err(VmError::EarlyExit {
                    status,
                    console: err.trim().to_owned(),
                });
            }
            if started.elapsed() > timeout {
                kill(child);
                return Err(VmError::BootTimeout {
                    timeout,
                    console: format!("QEMU never connected to {name}"),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        s.set_nonblocking(false).map_err(io(name))?;
        streams.push(s);
    }
    Ok(streams)
}

fn kill(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

impl Drop for Vm {
    fn drop(&mut self) {
        kill(&mut self.child);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::FsKind;

    #[test]
    fn the_command_line_has_no_nic_a_read_only_disk_and_the_sandbox() {
        let cfg = VmConfig {
            qemu: "qemu-system-x86_64".into(),
            kernel: "/boot/vmlinuz-x".into(),
            initramfs: "/tmp/i.cpio".into(),
            image: BlockImage {
                digest: "d".into(),
                path: "/store/d.img".into(),
                kind: FsKind::Erofs,
                sha256: "s".into(),
            },
            memory_mib: 256,
            cpus: 1,
            accel: Accel::Tcg,
            tsc_khz: Some(2_445_406),
            sandbox: true,
            extra_append: Vec::new(),
            boot_timeout: Duration::from_secs(30),
            image_verified: false,
            carry: None,
        };
        let paths = Paths {
            dir: "/run/x".into(),
        };
        let a = cfg.args(&paths, Memory::Anonymous).join(" ");
        assert!(a.starts_with("-M microvm -accel tcg -m 256 -smp 1 -nodefaults -no-user-config"));
        assert!(a.contains("-nic none"));
        assert!(a.contains("file=/store/d.img,format=raw,if=none,read-only=on"));
        assert!(a.contains("tsc_early_khz=2445406"));
        assert!(a.contains("-sandbox on,"));
        assert!(a.contains("virtserialport,chardev=stdin,name=cordon.stdin"));
        assert!(a.contains("virtserialport,chardev=net,name=cordon.net"));
        assert!(!a.contains("-incoming"));
        assert!(!a.contains("netdev"));
        assert!(!a.contains("memory-backend"));
        let t = cfg
            .args(&paths, Memory::Template(Path::new("/run/x/t.ram")))
            .join(" ");
        assert!(t.starts_with("-M microvm,memory-backend=ram -accel tcg"));
        assert!(t.contains(
            "-object memory-backend-file,id=ram,size=256M,mem-path=/run/x/t.ram,share=on"
        ));
        assert!(!t.contains("-incoming"));
        let r = cfg
            .args(&paths, Memory::Restore(Path::new("/run/x/ram")))
            .join(" ");
        assert!(r.contains(
            "memory-backend-file,id=ram,size=256M,mem-path=/run/x/ram,share=off,readonly=on,rom=off"
        ));
        assert!(r.ends_with("-incoming defer"));
    }
}
