//! Cgroup limits through v2 or v1, whichever the host has per controller.
//!
//! Layout: under the broker's own cgroup in each hierarchy used,
//! `<own>/cordon/<broker pid>-<jail>-<n>`. Slots are created on demand and
//! kept in a pool: a call takes a slot, writes only the limits that differ
//! from what the slot already has, resets the peak counter, records the
//! event counters (v1 `oom_kill` cannot be reset, so deltas are used), moves
//! the child in, and afterwards waits until the slot is empty before
//! putting it back. A broker holds an exclusive `flock` on each directory of
//! its own slots for as long as it has them; a slot left by a broker that
//! died (no lock held, and its pid gone) is removed by the next
//! `Jail::new()` (after killing anything still in it). The lock, not the
//! pid, is what marks a live broker's slot: a broker in another pid
//! namespace sees another process, or none, at that pid. One-shot brokers use
//! `<own>/cordon/shared-<key>-<n>` slots instead, kept between processes (see
//! [`Pool::new`]). The sandbox moves itself into v1 directories (see
//! `Slot::open_join_files`) and is born in the v2 one.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::Limits;

/// Which cgroup version carries a controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Version {
    /// cgroup v1 hierarchy.
    V1,
    /// cgroup v2 (unified).
    V2,
}

/// One controller's placement: version and the parent directory under
/// which slots are created (`<mount>/<own cgroup>/cordon`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// v1 or v2.
    pub version: Version,
    /// `<own cgroup>/cordon` in that hierarchy.
    pub base: PathBuf,
}

/// Where memory, pids and cpu limits go (each may be missing).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Layout {
    /// Memory controller.
    pub memory: Option<Placement>,
    /// Pids controller.
    pub pids: Option<Placement>,
    /// Cpu controller.
    pub cpu: Option<Placement>,
    /// `<own v2 cgroup>/cordon`, when a v2 hierarchy is mounted and
    /// writable (used for cgroup.kill and CLONE_INTO_CGROUP even without
    /// controllers; only on a pure v2 host).
    pub v2_base: Option<PathBuf>,
}

/// Counters read after a run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// OOM kills during the run.
    pub oom_kills: u64,
    /// Forks refused by pids.max during the run.
    pub pids_max_events: u64,
    /// Peak memory usage in bytes.
    pub peak_memory: Option<u64>,
}

/// The limits a slot currently has, to skip identical writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Applied {
    memory: u64,
    tasks: u64,
    cpu: Option<u32>,
}

/// One set of cgroup directories a sandbox runs in.
#[derive(Debug)]
pub struct Slot {
    /// v2 directory (when any controller is v2, or for kill on pure v2).
    pub v2: Option<PathBuf>,
    /// v1 memory directory.
    pub mem_v1: Option<PathBuf>,
    /// v1 pids directory.
    pub pids_v1: Option<PathBuf>,
    /// v1 cpu directory.
    pub cpu_v1: Option<PathBuf>,
    mem_v2: bool,
    pids_v2: bool,
    cpu_v2: bool,
    applied: Option<Applied>,
    base_oom: u64,
    base_pids: u64,
    /// v2 memory.peak opened at `begin` and reset through that descriptor
    /// (Linux 6.12+: a write resets the peak seen by that open file).
    peak_v2: Option<fs::File>,
    /// `cgroup.kill` was written: the slot must not be reused (see
    /// [`Slot::reusable`]).
    killed: std::sync::atomic::AtomicBool,
    /// A shared slot (see [`Pool::new`]): the claim, an exclusive `flock`
    /// held while this process has the slot, and the file that marks it
    /// killed (created before `cgroup.kill`, so a claimant after a crash
    /// knows to replace the directories).
    shared: Option<SharedClaim>,
    /// `O_PATH` descriptors of the directories above, opened once: files
    /// are opened relative to them instead of walking the (long) cgroup
    /// path on every read and write.
    fds: Vec<(PathBuf, std::os::fd::OwnedFd)>,
    /// The directories of a slot this broker made, each opened and held
    /// with an exclusive `flock` while the slot exists (see
    /// [`clean_stale`]).
    held: Vec<fs::File>,
}

#[derive(Debug)]
struct SharedClaim {
    _lock: fs::File,
    killed_marker: PathBuf,
}

fn ctx(what: &str, path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

fn write_file(dir: &Path, name: &str, value: &str) -> io::Result<()> {
    let p = dir.join(name);
    fs::write(&p, value).map_err(|e| ctx("write", &p, e))
}

fn read_file(dir: &Path, name: &str) -> io::Result<String> {
    let p = dir.join(name);
    fs::read_to_string(&p).map_err(|e| ctx("read", &p, e))
}

/// `key value` lines (memory.events, pids.events, memory.oom_control).
pub fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some(key)).then(|| it.next()?.parse().ok())?
    })
}

impl Slot {
    /// A slot over existing directories (also used by tests with a fake
    /// cgroupfs tree).
    pub fn from_dirs(
        v2: Option<PathBuf>,
        mem: Option<(Version, PathBuf)>,
        pids: Option<(Version, PathBuf)>,
        cpu: Option<(Version, PathBuf)>,
    ) -> Slot {
        let v1 = |c: &Option<(Version, PathBuf)>| match c {
            Some((Version::V1, p)) => Some(p.clone()),
            _ => None,
        };
        let is_v2 = |c: &Option<(Version, PathBuf)>| matches!(c, Some((Version::V2, _)));
        let mut slot = Slot {
            mem_v1: v1(&mem),
            pids_v1: v1(&pids),
            cpu_v1: v1(&cpu),
            mem_v2: is_v2(&mem),
            pids_v2: is_v2(&pids),
            cpu_v2: is_v2(&cpu),
            v2,
            applied: None,
            base_oom: 0,
            base_pids: 0,
            peak_v2: None,
            killed: std::sync::atomic::AtomicBool::new(false),
            shared: None,
            fds: Vec::new(),
            held: Vec::new(),
        };
        slot.fds = slot
            .dirs()
            .filter_map(|d| {
                cordon_sys::io::open_path_dir(d)
                    .ok()
                    .map(|fd| (d.clone(), fd))
            })
            .collect();
        slot
    }

    fn dir_fd(&self, dir: &Path) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.fds
            .iter()
            .find(|(p, _)| p == dir)
            .map(|(_, fd)| fd.as_fd())
    }

    /// The `O_PATH` descriptor of the v2 directory, if any.
    pub fn v2_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.v2.as_deref().and_then(|d| self.dir_fd(d))
    }

    /// Open a file of one of the slot's directories for writing (relative
    /// to its descriptor when it has one).
    fn open_write(&self, dir: &Path, name: &str) -> io::Result<fs::File> {
        let p = || dir.join(name);
        match self.dir_fd(dir) {
            Some(fd) => cordon_sys::io::open_at(fd, name, true)
                .map(fs::File::from)
                .map_err(|e| ctx("open", &p(), io::Error::from(e))),
            None => fs::OpenOptions::new()
                .write(true)
                .open(p())
                .map_err(|e| ctx("open", &p(), e)),
        }
    }

    /// Write a file of one of the slot's directories.
    fn write(&self, dir: &Path, name: &str, value: &str) -> io::Result<()> {
        let mut f = self.open_write(dir, name)?;
        io::Write::write_all(&mut f, value.as_bytes()).map_err(|e| ctx("write", &dir.join(name), e))
    }

    /// Read a file of one of the slot's directories.
    fn read(&self, dir: &Path, name: &str) -> io::Result<String> {
        let Some(fd) = self.dir_fd(dir) else {
            return read_file(dir, name);
        };
        let f = cordon_sys::io::open_at(fd, name, false)
            .map_err(|e| ctx("open", &dir.join(name), io::Error::from(e)))?;
        cordon_sys::io::read_small(f).map_err(|e| ctx("read", &dir.join(name), e))
    }

    /// Whether the slot may serve another sandbox. Not after `cgroup.kill`:
    /// on the kernels measured (6.18), a process later born into that
    /// cgroup with `CLONE_INTO_CGROUP` is killed at once (the fork path
    /// compares the kill count of the parent's cgroup with the target's),
    /// so a killed slot is removed and a fresh one made.
    pub fn reusable(&self) -> bool {
        !self.killed.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn dirs(&self) -> impl Iterator<Item = &PathBuf> {
        self.v2
            .iter()
            .chain(self.mem_v1.iter())
            .chain(self.pids_v1.iter())
            .chain(self.cpu_v1.iter())
    }

    /// Open each directory and take an exclusive `flock` on it, held
    /// until the slot is dropped. `WouldBlock` when another process holds
    /// one, or one was removed meanwhile (see [`Pool::create`]).
    fn hold(&mut self) -> io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        let busy = |d: &Path, why: &str| {
            io::Error::new(
                io::ErrorKind::WouldBlock,
                format!("cgroup {}: {why}", d.display()),
            )
        };
        let mut held = Vec::new();
        let mut seen = Vec::new();
        for d in self.dirs() {
            if seen.contains(&d) {
                continue;
            }
            seen.push(d);
            let f = match fs::File::open(d) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(busy(d, "removed as it was made"));
                }
                Err(e) => return Err(ctx("open", d, e)),
            };
            match f.try_lock() {
                Ok(()) => {}
                Err(fs::TryLockError::WouldBlock) => {
                    return Err(busy(d, "held by another process"));
                }
                Err(fs::TryLockError::Error(e)) => return Err(ctx("flock", d, e)),
            }
            let locked = f.metadata().map_err(|e| ctx("fstat", d, e))?;
            let now = fs::metadata(d).ok().map(|m| (m.dev(), m.ino()));
            if now != Some((locked.dev(), locked.ino())) {
                return Err(busy(d, "removed as it was made"));
            }
            held.push(f);
        }
        self.held = held;
        Ok(())
    }

    /// Whether the slot enforces a memory limit.
    pub fn has_memory(&self) -> bool {
        self.mem_v1.is_some() || self.mem_v2
    }

    /// Whether the slot enforces a task limit.
    pub fn has_pids(&self) -> bool {
        self.pids_v1.is_some() || self.pids_v2
    }

    /// Whether the slot enforces a cpu quota.
    pub fn has_cpu(&self) -> bool {
        self.cpu_v1.is_some() || self.cpu_v2
    }

    /// Write the limits (only what changed since the last call).
    pub fn apply(&mut self, limits: &Limits) -> io::Result<()> {
        let want = Applied {
            memory: limits.memory_bytes,
            tasks: limits.tasks,
            cpu: limits.cpu_percent,
        };
        let old = self.applied;
        if old.map(|a| a.memory) != Some(want.memory) {
            if let Some(d) = &self.mem_v1 {
                let v = want.memory.to_string();
                // memsw must stay >= limit: lift it first, then set both.
                // It is missing where swap is not accounted.
                let memsw = match self.write(d, "memory.memsw.limit_in_bytes", "-1") {
                    Ok(()) => true,
                    Err(e) if e.kind() == io::ErrorKind::NotFound => false,
                    Err(e) => return Err(e),
                };
                self.write(d, "memory.limit_in_bytes", &v)?;
                if memsw {
                    self.write(d, "memory.memsw.limit_in_bytes", &v)?;
                }
            }
            if self.mem_v2
                && let Some(d) = &self.v2
            {
                self.write(d, "memory.max", &want.memory.to_string())?;
                self.write(d, "memory.swap.max", "0")?;
            }
        }
        if old.map(|a| a.tasks) != Some(want.tasks) {
            let v = want.tasks.to_string();
            if let Some(d) = &self.pids_v1 {
                self.write(d, "pids.max", &v)?;
            }
            if self.pids_v2
                && let Some(d) = &self.v2
            {
                self.write(d, "pids.max", &v)?;
            }
        }
        if old.map(|a| a.cpu) != Some(want.cpu) {
            const PERIOD: u64 = 100_000;
            if let Some(d) = &self.cpu_v1 {
                self.write(d, "cpu.cfs_period_us", &PERIOD.to_string())?;
                let q = match want.cpu {
                    Some(p) => (u64::from(p.max(1)) * PERIOD / 100).max(1000).to_string(),
                    None => "-1".to_string(),
                };
                self.write(d, "cpu.cfs_quota_us", &q)?;
            }
            if self.cpu_v2
                && let Some(d) = &self.v2
            {
                let v = match want.cpu {
                    Some(p) => format!(
                        "{} {PERIOD}",
                        (u64::from(p.max(1)) * PERIOD / 100).max(1000)
                    ),
                    None => format!("max {PERIOD}"),
                };
                self.write(d, "cpu.max", &v)?;
            }
        }
        self.applied = Some(want);
        Ok(())
    }

    /// Reset the peak counter and remember the event counters.
    pub fn begin(&mut self) -> io::Result<()> {
        if let Some(d) = &self.mem_v1 {
            self.write(d, "memory.max_usage_in_bytes", "0")?;
        }
        if self.mem_v2
            && let Some(d) = &self.v2
        {
            // Writable (reset per open file) since Linux 6.12; on older
            // kernels the write fails and the figure is the slot's
            // lifetime peak, which can only be too high.
            self.peak_v2 = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(d.join("memory.peak"))
                .ok();
            if let Some(f) = &self.peak_v2 {
                use std::os::unix::fs::FileExt;
                let _ = f.write_at(b"reset", 0);
            }
        }
        let s = self.counters()?;
        self.base_oom = s.0;
        self.base_pids = s.1;
        Ok(())
    }

    fn counters(&self) -> io::Result<(u64, u64)> {
        let mut oom = 0;
        let mut pids = 0;
        if let Some(d) = &self.mem_v1 {
            oom = keyed(&self.read(d, "memory.oom_control")?, "oom_kill").unwrap_or(0);
        }
        if self.mem_v2
            && let Some(d) = &self.v2
        {
            oom = keyed(&self.read(d, "memory.events")?, "oom_kill").unwrap_or(0);
        }
        if let Some(d) = &self.pids_v1 {
            pids = keyed(&self.read(d, "pids.events")?, "max").unwrap_or(0);
        }
        if self.pids_v2
            && let Some(d) = &self.v2
        {
            pids = keyed(&self.read(d, "pids.events")?, "max").unwrap_or(0);
        }
        Ok((oom, pids))
    }

    /// The files the sandbox moves itself in through, opened for writing,
    /// each with its controller's name (see
    /// `cordon_sys::spawn::ChildPlan::join_cgroups`): the v1 `tasks`
    /// files, and the v2 directory's `cgroup.procs` when the sandbox is not
    /// born there with CLONE_INTO_CGROUP (`born_in_v2` false).
    pub fn open_join_files(&self, born_in_v2: bool) -> io::Result<Vec<(&'static str, fs::File)>> {
        let v2 = if born_in_v2 { &None } else { &self.v2 };
        let mut out = Vec::new();
        for (name, d, file) in [
            ("memory", &self.mem_v1, "tasks"),
            ("pids", &self.pids_v1, "tasks"),
            ("cpu", &self.cpu_v1, "tasks"),
            ("v2", v2, "cgroup.procs"),
        ] {
            if let Some(d) = d {
                out.push((name, self.open_write(d, file)?));
            }
        }
        Ok(out)
    }

    /// Move `pid` into the v2 directory by writing cgroup.procs.
    pub fn attach_v2(&self, pid: i32) -> io::Result<()> {
        if let Some(d) = &self.v2 {
            self.write(d, "cgroup.procs", &pid.to_string())?;
        }
        Ok(())
    }

    /// Counters since `begin`.
    pub fn stats(&self) -> io::Result<Stats> {
        let (oom, pids) = self.counters()?;
        let mut peak = None;
        if let Some(d) = &self.mem_v1 {
            peak = self
                .read(d, "memory.max_usage_in_bytes")?
                .trim()
                .parse()
                .ok();
        }
        if self.mem_v2
            && let Some(d) = &self.v2
        {
            peak = self
                .read(d, "memory.peak")
                .ok()
                .and_then(|s| s.trim().parse().ok());
        }
        Ok(Stats {
            oom_kills: oom.saturating_sub(self.base_oom),
            pids_max_events: pids.saturating_sub(self.base_pids),
            peak_memory: peak,
        })
    }

    /// Kill everything in the slot: `cgroup.kill` on v2, else SIGKILL each
    /// listed pid.
    pub fn kill(&self) {
        if let Some(d) = &self.v2 {
            // Marked before the write: a failed write may still have
            // reached the kernel.
            self.killed
                .store(true, std::sync::atomic::Ordering::Relaxed);
            if let Some(c) = &self.shared {
                let _ = fs::write(&c.killed_marker, b"");
            }
            if self.write(d, "cgroup.kill", "1").is_ok() {
                return;
            }
        }
        for d in self.dirs() {
            if let Ok(t) = self.read(d, "cgroup.procs") {
                // 0: a process of another pid namespace (see
                // `kill_pid`), which this one cannot name. Each is asked
                // its cgroup through a pidfd first: one that ended after
                // the listing may have left its pid to an outsider.
                for pid in procs(&t).filter(|p| *p > 0) {
                    let _ = cordon_sys::io::kill_pid_if(pid, |text| in_dir(text, d));
                }
            }
        }
    }

    /// Whether no process is left in any of the slot's directories.
    pub fn is_empty(&self) -> bool {
        if let Some(d) = &self.v2
            && let Ok(ev) = self.read(d, "cgroup.events")
        {
            // Every process of the sandbox is in the v2 directory (it was
            // born there, and nothing in it can write a host cgroup), so
            // the v1 directories need no separate look.
            return keyed(&ev, "populated") == Some(0);
        } else if let Some(d) = &self.v2
            && self
                .read(d, "cgroup.procs")
                .map(|t| !t.trim().is_empty())
                .unwrap_or(false)
        {
            return false;
        }
        for d in [&self.mem_v1, &self.pids_v1, &self.cpu_v1]
            .into_iter()
            .flatten()
        {
            match self.read(d, "cgroup.procs") {
                Ok(t) if t.trim().is_empty() => {}
                Ok(_) => return false,
                Err(_) => {}
            }
        }
        true
    }

    /// Poll until empty with exponential backoff from 50 µs; false after
    /// `limit`.
    pub fn wait_empty(&self, limit: Duration) -> bool {
        let start = Instant::now();
        let mut pause = Duration::from_micros(50);
        loop {
            if self.is_empty() {
                return true;
            }
            if start.elapsed() > limit {
                return false;
            }
            sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(20));
        }
    }

    /// rmdir every directory (retrying EBUSY with backoff).
    pub fn remove(&self) -> io::Result<()> {
        let mut result = Ok(());
        for d in self.dirs() {
            if let Err(e) = rmdir_retry(d, Duration::from_secs(2)) {
                result = Err(e);
            }
        }
        result
    }

    /// rmdir every directory once, without waiting.
    pub fn remove_now(&self) -> io::Result<()> {
        let mut result = Ok(());
        for d in self.dirs() {
            match fs::remove_dir(d) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => result = Err(ctx("rmdir", d, e)),
            }
        }
        result
    }
}

/// Whether a `/proc/PID/cgroup` text places its process in `dir` on one
/// of its hierarchies (`ID:CONTROLLERS:PATH`, the path as the hierarchy's
/// root names it, which `dir` ends with).
fn in_dir(text: &str, dir: &Path) -> bool {
    text.lines()
        .filter_map(|l| l.splitn(3, ':').nth(2))
        .map(|p| p.trim().trim_start_matches('/'))
        .any(|p| !p.is_empty() && dir.ends_with(p))
}

/// The pids of a `cgroup.procs` file.
fn procs(text: &str) -> impl Iterator<Item = i32> + '_ {
    text.lines().filter_map(|l| l.trim().parse::<i32>().ok())
}

fn rmdir_retry(d: &Path, limit: Duration) -> io::Result<()> {
    let start = Instant::now();
    let mut pause = Duration::from_micros(50);
    loop {
        match fs::remove_dir(d) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) && start.elapsed() < limit => {
                sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
            Err(e) => return Err(ctx("rmdir", d, e)),
        }
    }
}

static JAIL_SEQ: AtomicU64 = AtomicU64::new(0);

/// The pool of slots of one `Jail`.
#[derive(Debug)]
pub struct Pool {
    layout: Layout,
    prefix: String,
    next: AtomicU64,
    free: Mutex<Vec<Slot>>,
    all: Mutex<Vec<String>>,
    /// Directory of the shared slots' lock files, in shared mode.
    shared: Option<PathBuf>,
    /// Sandboxes are born in their v2 directory (`CLONE_INTO_CGROUP`);
    /// false when such births are killed (see [`births_survive`]).
    born_in_v2: bool,
}

/// Shared slots per set of cgroup bases at most.
const MAX_SHARED: usize = 256;

impl Pool {
    /// Create the `cordon` parent directories, clean slots of dead brokers,
    /// and check that a slot can be made (one is created and pooled).
    ///
    /// With `shared` (a directory only the broker's uid can write), slots
    /// are not this process's own `<pid>-<jail>-<n>` but
    /// `shared-<bases hash>-<n>`, kept between processes: a process claims
    /// one with an exclusive `flock` on `<shared>/<bases hash>-<n>.lock`, uses it like its own
    /// (all limits written afresh, counters read at the start of each
    /// call, empty before it is let go) and leaves it in place when it
    /// exits. Short-lived brokers (a one-shot `cordon exec`) then make and
    /// remove no cgroup directories. A slot that was killed through
    /// `cgroup.kill` is removed instead (see [`Slot::reusable`]); a marker
    /// file written before the kill tells the next claimant to replace it
    /// if this process died first.
    ///
    /// `born_in_v2` false: sandboxes always move themselves into their v2
    /// directory instead of being born there.
    pub fn new(
        mut layout: Layout,
        shared: Option<PathBuf>,
        born_in_v2: bool,
    ) -> io::Result<(Pool, Vec<String>)> {
        let mut notes = Vec::new();
        // With every controller on v1, the v2 directory only adds
        // CLONE_INTO_CGROUP and cgroup.kill: go on without it if it cannot
        // be made (v1 limits and the per-pid kill still hold).
        let v2_controllers = [&layout.memory, &layout.pids, &layout.cpu]
            .into_iter()
            .flatten()
            .any(|p| p.version == Version::V2);
        let prefix = format!(
            "{}-{}",
            std::process::id(),
            JAIL_SEQ.fetch_add(1, Ordering::Relaxed)
        );
        if !v2_controllers && let Some(b) = layout.v2_base.clone() {
            let (usable, births) = if shared.is_some() && !own_killable(&b) {
                // Shared slots with nothing to test about births (the
                // broker's own cgroup cannot have been killed): whether
                // v2 can be written shows when the first slot is claimed
                // (below), without a probe directory made and removed.
                (fs::create_dir_all(&b).is_ok(), true)
            } else {
                // The probe: the first slot's own v2 directory, or in
                // shared mode (where a shared slot's directory may exist
                // already) a separate one, removed again.
                let first = b.join(format!("{prefix}-0"));
                let probe = b.join(format!(".probe-{}", std::process::id()));
                let dir = if shared.is_some() { &probe } else { &first };
                let usable = fs::create_dir_all(&b).is_ok() && fs::create_dir(dir).is_ok();
                let births = usable && births_survive(&b, dir);
                if shared.is_some() || !births {
                    let _ = fs::remove_dir(dir);
                }
                (usable, births)
            };
            if !usable {
                notes.push(format!(
                    "cgroup v2 at {} cannot be written: sandboxes are moved into their v1 cgroups only, and killed pid by pid",
                    b.display()
                ));
                layout.v2_base = None;
            } else if !births {
                notes.push(format!(
                    "a process born into a cgroup under {} is killed at birth (this broker's own cgroup was once killed through cgroup.kill): sandboxes are moved into their v1 cgroups only, and killed pid by pid",
                    b.display()
                ));
                layout.v2_base = None;
            }
        }
        for base in layout_bases(&layout) {
            notes.extend(clean_stale(base)?);
        }
        if let Some(b) = &layout.v2_base {
            enable_v2_controllers(&layout, b, &mut notes);
        }
        let mut pool = Pool {
            layout,
            prefix,
            next: AtomicU64::new(0),
            free: Mutex::new(Vec::new()),
            all: Mutex::new(Vec::new()),
            shared,
            born_in_v2,
        };
        let mut first = match pool.create() {
            Ok(slot) => slot,
            Err(e) if !v2_controllers && pool.shared.is_some() && pool.layout.v2_base.is_some() => {
                let b = pool.layout.v2_base.take().unwrap_or_default();
                notes.push(format!(
                    "cgroup v2 at {} cannot be written ({e}): sandboxes are moved into their v1 cgroups only, and killed pid by pid",
                    b.display()
                ));
                pool.create()?
            }
            Err(e) => return Err(e),
        };
        // A v2 controller whose files the slot lacks was not enabled above
        // it (e.g. other processes sit in the broker's own cgroup, which v2
        // then does not let split): it is dropped, and a slot made again.
        if let Some(d) = first.v2.clone() {
            let mut dropped = Vec::new();
            for (name, file) in [
                ("memory", "memory.max"),
                ("pids", "pids.max"),
                ("cpu", "cpu.max"),
            ] {
                let p = match name {
                    "memory" => &mut pool.layout.memory,
                    "pids" => &mut pool.layout.pids,
                    _ => &mut pool.layout.cpu,
                };
                if matches!(p, Some(pl) if pl.version == Version::V2) && !d.join(file).exists() {
                    *p = None;
                    dropped.push(name);
                }
            }
            if !dropped.is_empty() {
                let why = if notes.is_empty() {
                    "not enabled in cgroup.subtree_control above it".to_string()
                } else {
                    notes.join("; ")
                };
                let _ = first.remove_now();
                if pool.layout.memory.is_none() && pool.layout.pids.is_none() {
                    return Err(io::Error::other(format!(
                        "no {} controller in {} ({why})",
                        dropped.join(", "),
                        d.display()
                    )));
                }
                notes.push(format!(
                    "no {} controller in {} ({why}): that limit falls back",
                    dropped.join(", "),
                    d.display()
                ));
                first = pool.create()?;
            }
        }
        // Limits in v2: the sandbox must be in its v2 directory. If it
        // cannot be born there, it moves itself in with a write to
        // cgroup.procs instead (which can wait an RCU grace period).
        if v2_controllers
            && let (Some(b), Some(d)) = (pool.layout.v2_base.clone(), first.v2.clone())
            && !births_survive(&b, &d)
        {
            pool.born_in_v2 = false;
            notes.push(format!(
                "a process born into a cgroup under {} is killed at birth (this broker's own cgroup was once killed through cgroup.kill): sandboxes move themselves into their cgroup by a write to cgroup.procs instead, which can wait an RCU grace period",
                b.display()
            ));
        }
        pool.release(first);
        Ok((pool, notes))
    }

    /// Whether sandboxes are born in their slot's v2 directory
    /// (`CLONE_INTO_CGROUP`) or move themselves in.
    pub fn born_in_v2(&self) -> bool {
        self.born_in_v2
    }

    /// The layout in use.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    fn create(&self) -> io::Result<Slot> {
        if let Some(dir) = &self.shared {
            return self.claim_shared(dir);
        }
        // Made, then locked. A directory of that name held by another
        // process is not ours: a broker of another pid namespace with our
        // pid (its slots have our names), or another broker's
        // `clean_stale` that took it between mkdir and flock (it cannot
        // tell a slot being made from a dead broker's) and removes it.
        // Either way, the next name.
        let mut tries = 0;
        loop {
            let n = self.next.fetch_add(1, Ordering::Relaxed);
            let mut slot = self.create_named(&format!("{}-{n}", self.prefix))?;
            match slot.hold() {
                Ok(()) => return Ok(slot),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock && tries < 16 => tries += 1,
                Err(e) => return Err(e),
            }
        }
    }

    /// Claim the first shared slot nobody holds (see [`Pool::new`]).
    fn claim_shared(&self, dir: &Path) -> io::Result<Slot> {
        let key = bases_key(&self.layout);
        for n in 0..MAX_SHARED {
            let lock_path = dir.join(format!("{key:016x}-{n}.lock"));
            let lock = fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .open(&lock_path)
                .map_err(|e| ctx("open", &lock_path, e))?;
            match lock.try_lock() {
                Ok(()) => {}
                Err(fs::TryLockError::WouldBlock) => continue,
                Err(fs::TryLockError::Error(e)) => return Err(ctx("flock", &lock_path, e)),
            }
            let killed_marker = dir.join(format!("{key:016x}-{n}.killed"));
            // Named after the same key as the lock: brokers whose bases
            // differ in one hierarchy never share a directory in another.
            let name = format!("shared-{key:016x}-{n}");
            let mut slot = self.create_named(&name)?;
            // Left killed by a process that died before removing it, or
            // not empty (nothing should be left in an idle slot): replace.
            let replace = killed_marker.exists() || !slot.is_empty();
            slot.shared = Some(SharedClaim {
                _lock: lock,
                killed_marker,
            });
            if replace {
                clear(&slot)?;
                let claim = slot.shared.take();
                slot = self.create_named(&name)?;
                slot.shared = claim;
            }
            return Ok(slot);
        }
        Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!("all {MAX_SHARED} shared cgroup slots are in use"),
        ))
    }

    fn create_named(&self, name: &str) -> io::Result<Slot> {
        let mk = |p: &Option<Placement>, want: Version| -> io::Result<Option<(Version, PathBuf)>> {
            match p {
                Some(pl) if pl.version == want => {
                    let d = pl.base.join(name);
                    match fs::create_dir(&d) {
                        Ok(()) => {}
                        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                        Err(e) => return Err(ctx("mkdir", &d, e)),
                    }
                    Ok(Some((want, d)))
                }
                _ => Ok(None),
            }
        };
        let v2 = match &self.layout.v2_base {
            Some(b) => {
                let d = b.join(name);
                match fs::create_dir(&d) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => return Err(ctx("mkdir", &d, e)),
                }
                Some(d)
            }
            None => None,
        };
        let pick = |p: &Option<Placement>| -> io::Result<Option<(Version, PathBuf)>> {
            match p {
                Some(pl) if pl.version == Version::V2 => Ok(v2.clone().map(|d| (Version::V2, d))),
                _ => mk(p, Version::V1),
            }
        };
        let mem = pick(&self.layout.memory)?;
        let pids = pick(&self.layout.pids)?;
        let cpu = pick(&self.layout.cpu)?;
        if let Ok(mut all) = self.all.lock() {
            all.push(name.to_string());
        }
        Ok(Slot::from_dirs(v2, mem, pids, cpu))
    }

    /// Take a slot (pooled or new).
    pub fn acquire(&self) -> io::Result<Slot> {
        let pooled = self.free.lock().ok().and_then(|mut f| f.pop());
        match pooled {
            Some(s) => Ok(s),
            None => self.create(),
        }
    }

    /// Put a slot back; it must be empty.
    pub fn release(&self, slot: Slot) {
        if let Ok(mut f) = self.free.lock() {
            f.push(slot);
        }
    }

    /// A slot that would not empty: kill what is left and remove it.
    pub fn discard(&self, slot: Slot) {
        let _ = clear(&slot);
    }
}

/// Kill what is in `slot`, remove its directories and then, for a shared
/// slot, its killed marker (the directories it marks are gone).
fn clear(slot: &Slot) -> io::Result<()> {
    slot.kill();
    let _ = slot.wait_empty(Duration::from_secs(1));
    slot.remove()?;
    if let Some(c) = &slot.shared {
        let _ = fs::remove_file(&c.killed_marker);
    }
    Ok(())
}

impl Drop for Pool {
    fn drop(&mut self) {
        if let Ok(mut free) = self.free.lock() {
            // Pooled slots were empty and reusable when released, and
            // nothing joins an idle slot: shared ones stay for the next
            // process (the lock goes with the slot), our own are removed,
            // killed first only if one will not go.
            for s in free.drain(..) {
                if s.shared.is_none() && s.remove_now().is_err() {
                    self.discard(s);
                }
            }
        }
    }
}

/// Whether a process born into `dir` (under the v2 base `base`) with
/// `CLONE_INTO_CGROUP` survives: see
/// `cordon_sys::spawn::born_into_cgroup_survives`. Tested only when the
/// broker's own v2 cgroup is not the root.
fn births_survive(base: &Path, dir: &Path) -> bool {
    // The root cgroup cannot be killed (it has no cgroup.kill): a broker
    // there needs no test.
    if !own_killable(base) {
        return true;
    }
    match cordon_sys::io::open_dir(dir) {
        Ok(fd) => {
            use std::os::fd::AsFd;
            cordon_sys::spawn::born_into_cgroup_survives(fd.as_fd()).unwrap_or(true)
        }
        Err(_) => true,
    }
}

/// Whether the broker's own v2 cgroup (the parent of the v2 base) could
/// have been killed through `cgroup.kill`; the root cgroup has none.
fn own_killable(base: &Path) -> bool {
    base.parent()
        .is_some_and(|own| own.join("cgroup.kill").exists())
}

/// A stable key for a set of cgroup bases (FNV-1a over their paths), so
/// that brokers in different cgroups never share a lock for different
/// directories.
fn bases_key(l: &Layout) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in layout_bases(l) {
        for byte in b.as_os_str().as_encoded_bytes().iter().chain(b"\0") {
            h ^= u64::from(*byte);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

fn layout_bases(l: &Layout) -> Vec<&PathBuf> {
    let mut v: Vec<&PathBuf> = Vec::new();
    for p in [&l.memory, &l.pids, &l.cpu].into_iter().flatten() {
        if p.version == Version::V1 && !v.contains(&&p.base) {
            v.push(&p.base);
        }
    }
    if let Some(b) = &l.v2_base {
        v.push(b);
    }
    v
}

/// Remove slots `<pid>-*` of brokers that are gone: nobody holds the
/// slot's `flock` (a live broker holds it on each of its slots' directories,
/// see [`Slot::hold`]) and no process of this pid namespace has that pid (a
/// broker from before the locks; a pid seen alive may be another process's
/// in another namespace, and the slot is then kept, never removed wrongly).
/// The pid alone does not do: a broker in another pid namespace (a test
/// runner's, a container's) sharing this cgroup tree names its slots by a
/// pid that here is dead, or someone else's.
///
/// Creates `base` when it cannot be listed (it does not exist yet): on
/// every start but the first, one open serves both.
fn clean_stale(base: &Path) -> io::Result<Vec<String>> {
    let mut notes = Vec::new();
    let Ok(rd) = fs::read_dir(base) else {
        fs::create_dir_all(base).map_err(|e| ctx("mkdir", base, e))?;
        return Ok(notes);
    };
    for ent in rd.flatten() {
        let name = ent.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.split('-').next().and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        if pid == std::process::id() as i32 || cordon_sys::io::pid_alive(pid) {
            continue;
        }
        let d = ent.path();
        if !d.is_dir() {
            continue;
        }
        // Held while it is killed and removed, so that a broker making a
        // slot of this name meanwhile waits, and sees it gone.
        let Ok(lock) = fs::File::open(&d) else {
            continue;
        };
        match lock.try_lock() {
            Ok(()) => {}
            Err(fs::TryLockError::WouldBlock) => continue,
            Err(fs::TryLockError::Error(e)) => {
                notes.push(format!(
                    "stale cgroup {} kept: {}",
                    d.display(),
                    ctx("flock", &d, e)
                ));
                continue;
            }
        }
        // Processes of another pid namespace are listed as 0: a broker
        // there (from before the locks) is using it.
        if fs::read_to_string(d.join("cgroup.procs")).is_ok_and(|t| procs(&t).any(|p| p == 0)) {
            notes.push(format!(
                "stale cgroup {} kept: it holds processes of another pid namespace",
                d.display()
            ));
            continue;
        }
        let slot = Slot::from_dirs(None, Some((Version::V1, d.clone())), None, None);
        slot.kill();
        let _ = slot.wait_empty(Duration::from_millis(500));
        match rmdir_retry(&d, Duration::from_millis(500)) {
            Ok(()) => notes.push(format!("removed stale cgroup {}", d.display())),
            Err(e) => notes.push(format!("could not remove stale cgroup: {e}")),
        }
    }
    Ok(notes)
}

/// On v2, controllers must be enabled in the subtree_control of every
/// ancestor of the slots below the broker's own cgroup.
fn enable_v2_controllers(layout: &Layout, base: &Path, notes: &mut Vec<String>) {
    let mut ctl = Vec::new();
    for (name, p) in [
        ("memory", &layout.memory),
        ("pids", &layout.pids),
        ("cpu", &layout.cpu),
    ] {
        if matches!(p, Some(pl) if pl.version == Version::V2) {
            ctl.push(format!("+{name}"));
        }
    }
    if ctl.is_empty() {
        return;
    }
    let v = ctl.join(" ");
    for d in [base.parent(), Some(base)].into_iter().flatten() {
        if let Err(e) = write_file(d, "cgroup.subtree_control", &v) {
            notes.push(format!("enabling {v} in {}: {e}", d.display()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_dir_reads_a_procs_cgroup_lines() {
        let v1 = "12:pids:/cordon/slot-7\n11:memory:/cordon/slot-7\n0::/user.slice\n";
        let d = Path::new("/sys/fs/cgroup/pids/cordon/slot-7");
        assert!(in_dir(v1, d));
        // Another slot, a name that only starts the same, the root.
        assert!(!in_dir(v1, Path::new("/sys/fs/cgroup/pids/cordon/slot-8")));
        assert!(!in_dir("12:pids:/cordon/slot-77\n", d));
        assert!(!in_dir("12:pids:/\n0::/\n", d));
    }

    fn fake_v2() -> (tempfile::TempDir, Slot) {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().to_path_buf();
        for (f, c) in [
            ("memory.max", "max\n"),
            ("memory.swap.max", "max\n"),
            ("pids.max", "max\n"),
            ("cpu.max", "max 100000\n"),
            ("cgroup.procs", ""),
            ("cgroup.kill", ""),
            ("cgroup.events", "populated 0\nfrozen 0\n"),
            (
                "memory.events",
                "low 0\nhigh 0\nmax 0\noom 0\noom_kill 2\noom_group_kill 0\n",
            ),
            ("pids.events", "max 7\n"),
            ("memory.peak", "4096\n"),
        ] {
            fs::write(d.join(f), c).unwrap();
        }
        let slot = Slot::from_dirs(
            Some(d.clone()),
            Some((Version::V2, d.clone())),
            Some((Version::V2, d.clone())),
            Some((Version::V2, d.clone())),
        );
        (t, slot)
    }

    fn limits(mem: u64, tasks: u64, cpu: Option<u32>) -> Limits {
        Limits {
            memory_bytes: mem,
            tasks,
            cpu_percent: cpu,
            ..Limits::default()
        }
    }

    /// A pid no process has: pids are below `pid_max`, which is at most
    /// 2^22.
    const NOBODY: u32 = 1 << 22;

    /// A pool of v1 memory slots under `base`, named `<prefix>-<n>`.
    fn v1_pool(base: &Path, prefix: &str) -> Pool {
        Pool {
            layout: Layout {
                memory: Some(Placement {
                    version: Version::V1,
                    base: base.to_path_buf(),
                }),
                pids: None,
                cpu: None,
                v2_base: None,
            },
            prefix: prefix.to_string(),
            next: AtomicU64::new(0),
            free: Mutex::new(Vec::new()),
            all: Mutex::new(Vec::new()),
            shared: None,
            born_in_v2: false,
        }
    }

    /// A live broker's slot is kept whatever its pid says here: it names
    /// a pid of its own namespace, which here is nobody's (a broker in
    /// another pid namespace sharing this cgroup tree). A slot nobody
    /// holds, of a pid nobody has, is removed (the positive control).
    #[test]
    fn a_held_slot_of_a_pid_not_seen_here_is_kept() {
        let t = tempfile::tempdir().unwrap();
        let live = v1_pool(t.path(), &format!("{NOBODY}-0")).create().unwrap();
        let dir = live.mem_v1.clone().unwrap();
        assert_eq!(dir, t.path().join(format!("{NOBODY}-0-0")));
        let dead = t.path().join(format!("{NOBODY}-1-0"));
        fs::create_dir(&dead).unwrap();
        let notes = clean_stale(t.path()).unwrap();
        assert!(dir.is_dir(), "the live slot was removed: {notes:?}");
        assert!(!dead.exists(), "{notes:?}");
        assert_eq!(
            notes,
            vec![format!("removed stale cgroup {}", dead.display())]
        );
        // Once its broker lets go, it is stale too.
        drop(live);
        clean_stale(t.path()).unwrap();
        assert!(!dir.exists());
    }

    /// A slot nobody holds whose processes this pid namespace cannot see
    /// (listed as 0) is a broker's of another namespace: kept, and nothing
    /// signalled (a kill of pid 0 would be this process's own group).
    #[test]
    fn a_slot_with_processes_of_another_pid_namespace_is_kept() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join(format!("{NOBODY}-2-0"));
        fs::create_dir(&d).unwrap();
        fs::write(d.join("cgroup.procs"), "0\n0\n").unwrap();
        let notes = clean_stale(t.path()).unwrap();
        assert_eq!(
            notes,
            vec![format!(
                "stale cgroup {} kept: it holds processes of another pid namespace",
                d.display()
            )]
        );
        assert!(d.is_dir());
    }

    /// Two brokers of different pid namespaces with the same pid make
    /// slots of the same names: the second takes the next name rather
    /// than the directory the first holds.
    #[test]
    fn a_slot_name_held_by_another_process_is_passed_over() {
        let t = tempfile::tempdir().unwrap();
        let prefix = format!("{NOBODY}-0");
        let first = v1_pool(t.path(), &prefix).create().unwrap();
        let second = v1_pool(t.path(), &prefix).create().unwrap();
        assert_eq!(first.mem_v1, Some(t.path().join(format!("{prefix}-0"))));
        assert_eq!(second.mem_v1, Some(t.path().join(format!("{prefix}-1"))));
    }

    fn rd(t: &tempfile::TempDir, f: &str) -> String {
        fs::read_to_string(t.path().join(f)).unwrap()
    }

    #[test]
    fn v2_writer_sets_every_limit() {
        let (t, mut slot) = fake_v2();
        slot.apply(&limits(64 << 20, 32, Some(50))).unwrap();
        assert_eq!(rd(&t, "memory.max"), "67108864");
        assert_eq!(rd(&t, "memory.swap.max"), "0");
        assert_eq!(rd(&t, "pids.max"), "32");
        assert_eq!(rd(&t, "cpu.max"), "50000 100000");
        // No cpu quota: "max".
        slot.apply(&limits(64 << 20, 32, None)).unwrap();
        assert_eq!(rd(&t, "cpu.max"), "max 100000");
        // 200% = two cores.
        slot.apply(&limits(64 << 20, 32, Some(200))).unwrap();
        assert_eq!(rd(&t, "cpu.max"), "200000 100000");
    }

    #[test]
    fn v2_writer_skips_unchanged_limits() {
        let (t, mut slot) = fake_v2();
        slot.apply(&limits(1 << 30, 8, None)).unwrap();
        // Tamper with the file: an identical second apply must not rewrite it.
        fs::write(t.path().join("pids.max"), "untouched").unwrap();
        slot.apply(&limits(1 << 30, 8, None)).unwrap();
        assert_eq!(rd(&t, "pids.max"), "untouched");
        slot.apply(&limits(1 << 30, 9, None)).unwrap();
        assert_eq!(rd(&t, "pids.max"), "9");
    }

    #[test]
    fn v2_counters_are_deltas_since_begin() {
        let (t, mut slot) = fake_v2();
        slot.begin().unwrap();
        // begin() resets the peak through its own descriptor.
        assert_eq!(rd(&t, "memory.peak"), "reset");
        // The kernel would now report the peak since the reset.
        fs::write(t.path().join("memory.peak"), "8192\n").unwrap();
        let s = slot.stats().unwrap();
        assert_eq!((s.oom_kills, s.pids_max_events), (0, 0));
        assert_eq!(s.peak_memory, Some(8192));
        fs::write(t.path().join("memory.events"), "max 9\noom 3\noom_kill 3\n").unwrap();
        fs::write(t.path().join("pids.events"), "max 10\n").unwrap();
        let s = slot.stats().unwrap();
        assert_eq!(s.oom_kills, 1);
        assert_eq!(s.pids_max_events, 3);
    }

    #[test]
    fn v2_attach_kill_and_populated() {
        let (t, slot) = fake_v2();
        slot.attach_v2(4242).unwrap();
        assert_eq!(rd(&t, "cgroup.procs"), "4242");
        slot.kill();
        assert_eq!(rd(&t, "cgroup.kill"), "1");
        assert!(slot.is_empty());
        fs::write(t.path().join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
        assert!(!slot.is_empty());
        assert!(!slot.wait_empty(Duration::from_millis(5)));
    }

    #[test]
    fn v1_memsw_written_after_limit() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().to_path_buf();
        for f in [
            "memory.limit_in_bytes",
            "memory.memsw.limit_in_bytes",
            "pids.max",
            "cpu.cfs_period_us",
            "cpu.cfs_quota_us",
        ] {
            fs::write(d.join(f), "").unwrap();
        }
        let mut slot = Slot::from_dirs(
            None,
            Some((Version::V1, d.clone())),
            Some((Version::V1, d.clone())),
            Some((Version::V1, d.clone())),
        );
        slot.apply(&limits(512 << 20, 16, Some(100))).unwrap();
        assert_eq!(rd(&t, "memory.limit_in_bytes"), "536870912");
        assert_eq!(rd(&t, "memory.memsw.limit_in_bytes"), "536870912");
        assert_eq!(rd(&t, "pids.max"), "16");
        assert_eq!(rd(&t, "cpu.cfs_quota_us"), "100000");
        assert_eq!(rd(&t, "cpu.cfs_period_us"), "100000");
    }

    #[test]
    fn v1_memory_limit_without_swap_accounting() {
        // No memory.memsw.limit_in_bytes (swap not accounted): the limit
        // alone is written, and the missing file is not created.
        let t = tempfile::tempdir().unwrap();
        let d = t.path().to_path_buf();
        fs::write(d.join("memory.limit_in_bytes"), "").unwrap();
        let mut slot = Slot::from_dirs(None, Some((Version::V1, d.clone())), None, None);
        slot.apply(&limits(64 << 20, 16, None)).unwrap();
        assert_eq!(rd(&t, "memory.limit_in_bytes"), "67108864");
        assert!(!d.join("memory.memsw.limit_in_bytes").exists());
    }

    #[test]
    fn shared_slots_go_on_without_an_unwritable_v2() {
        // A v2 base that exists but takes no new directories (procfs), and
        // a broker cgroup that cannot have been killed: no probe is made,
        // the first claim fails on v2 and is retried on v1 alone.
        let v1 = tempfile::tempdir().unwrap();
        let locks = tempfile::tempdir().unwrap();
        let layout = Layout {
            memory: Some(Placement {
                version: Version::V1,
                base: v1.path().join("cordon"),
            }),
            pids: None,
            cpu: None,
            v2_base: Some(PathBuf::from("/proc/self")),
        };
        let (pool, notes) = Pool::new(layout, Some(locks.path().to_path_buf()), true).unwrap();
        assert!(pool.layout().v2_base.is_none());
        assert!(
            notes
                .iter()
                .any(|n| n.contains("/proc/self cannot be written")),
            "{notes:?}"
        );
        let slots: Vec<String> = fs::read_dir(v1.path().join("cordon"))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            slots.len() == 1 && slots[0].starts_with("shared-"),
            "{slots:?}"
        );
    }

    #[test]
    fn v2_controllers_that_are_not_enabled_are_dropped() {
        // A v2 base whose slots get no controller files (here a plain
        // directory: as in a cgroup whose parent could not enable them):
        // with neither memory nor pids, no pool; the error names them.
        let t = tempfile::tempdir().unwrap();
        let base = t.path().join("cordon");
        let v2 = |b: &Path| {
            Some(Placement {
                version: Version::V2,
                base: b.to_path_buf(),
            })
        };
        let layout = Layout {
            memory: v2(&base),
            pids: v2(&base),
            cpu: None,
            v2_base: Some(base.clone()),
        };
        let e = Pool::new(layout, None, true).unwrap_err();
        assert!(
            e.to_string()
                .starts_with(&format!("no memory, pids controller in {}", base.display())),
            "{e}"
        );
    }

    #[test]
    fn keyed_parses_oom_control() {
        let t = "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n";
        assert_eq!(keyed(t, "oom_kill"), Some(4));
        assert_eq!(keyed(t, "missing"), None);
    }
}
