//! Probes of what the sandbox shows of the host: files, environment,
//! processes, identity, terminal and descriptors. Also the positive control.

use std::collections::BTreeSet;
use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{CANARY_NAME, CANARY_PREFIX, Finding, Opts, Verdict, errname, own_exe, unique};

/// Positive control: the agent runs, prints (the start line already did),
/// writes to /tmp and reads /usr (the root, in an image without /usr). If
/// this fails every other result of the same sandbox is void.
pub(super) fn control() -> Verdict {
    let path = PathBuf::from(format!("/tmp/.cordon-control-{}", unique()));
    let body = format!("cordon control {}", std::process::id());
    let tmp = (|| -> io::Result<()> {
        let mut f = fs::File::create_new(&path)?;
        f.write_all(body.as_bytes())?;
        drop(f);
        let back = fs::read_to_string(&path)?;
        fs::remove_file(&path)?;
        if back != body {
            return Err(io::Error::other("read back different bytes"));
        }
        Ok(())
    })();
    if let Err(e) = tmp {
        let _ = fs::remove_file(&path);
        return Verdict::error(format!("write {}: {}", path.display(), errname(&e)));
    }
    // The root's programs: /usr, or the root itself in an image that has
    // no /usr (a busybox or distroless image).
    let dir = match fs::symlink_metadata("/usr") {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Path::new("/"),
        _ => Path::new("/usr"),
    };
    match fs::read_dir(dir) {
        Ok(rd) => {
            let n = rd.count();
            if n == 0 {
                return Verdict::error(format!("{} is empty", dir.display()));
            }
            Verdict::held(format!(
                "ran as pid {}, wrote and read back {}, {} has {n} entries",
                std::process::id(),
                path.display(),
                dir.display()
            ))
        }
        Err(e) => Verdict::error(format!("read {}: {}", dir.display(), errname(&e))),
    }
}

/// Entries of a directory, sorted, or the error.
fn list(dir: &Path) -> io::Result<Vec<String>> {
    let mut v: Vec<String> = fs::read_dir(dir)?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    Ok(v)
}

fn preview(v: &[String]) -> String {
    let mut s = v.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
    if v.len() > 5 {
        s.push_str(", ...");
    }
    s
}

/// A directory the sandbox should not show: escaped if it lists entries,
/// but for what the manifest mounts on purpose (`mounts`, paths inside
/// the sandbox): a directory below one is the user's own, and in an
/// ancestor of one, the entries leading to it are. A mount at the very
/// directory the probe guards (`/home`, `/root`) still puts host files
/// where the boundary promises none: escaped, the mount named.
fn dir_check(dir: &Path, mounts: &[PathBuf]) -> Finding {
    match list(dir) {
        Ok(v) => judge_listing(dir, v, mounts),
        Err(e) => Finding::held(format!("list {}: {}", dir.display(), errname(&e))),
    }
}

/// [`dir_check`] of what listing `dir` gave.
fn judge_listing(dir: &Path, v: Vec<String>, mounts: &[PathBuf]) -> Finding {
    if v.is_empty() {
        return Finding::held(format!("{} is empty", dir.display()));
    }
    if let Some(m) = mounts.iter().find(|m| m.as_path() == dir) {
        return Finding::escaped(format!(
            "listed {}: {} entries ({}): the manifest mounts a host directory at {} itself",
            dir.display(),
            v.len(),
            preview(&v),
            m.display()
        ));
    }
    if let Some(m) = mounts.iter().find(|m| dir.starts_with(m)) {
        return Finding::held(format!(
            "listed {}: {} entries ({}): inside the manifest's own mount {}, readable on purpose (not an escape)",
            dir.display(),
            v.len(),
            preview(&v),
            m.display()
        ));
    }
    let (own, other): (Vec<String>, Vec<String>) = v
        .into_iter()
        .partition(|e| mounts.iter().any(|m| m.starts_with(dir.join(e))));
    let named: Vec<String> = mounts
        .iter()
        .filter(|m| m.starts_with(dir))
        .map(|m| m.display().to_string())
        .collect();
    if other.is_empty() {
        return Finding::held(format!(
            "listed {}: {} entries ({}): the way to the manifest's own mount {}, readable on purpose (not an escape)",
            dir.display(),
            own.len(),
            preview(&own),
            named.join(", ")
        ));
    }
    let also = if own.is_empty() {
        String::new()
    } else {
        format!(
            "; besides the way to the manifest's own mount {}",
            named.join(", ")
        )
    };
    Finding::escaped(format!(
        "listed {}: {} entries ({}){also}",
        dir.display(),
        other.len(),
        preview(&other)
    ))
}

/// The paths inside the sandbox the manifest mounts (`--mounts`, one per
/// line).
fn own_mounts(opts: &Opts) -> Vec<PathBuf> {
    opts.get("mounts")
        .unwrap_or("")
        .lines()
        .filter(|l| l.starts_with('/'))
        .map(PathBuf::from)
        .collect()
}

/// Host files: /etc/shadow, /root, /home, the invoking user's home
/// (`--home`), /proc/1/root when it is another root than ours, /sys, and
/// container runtime sockets.
pub(super) fn host_fs(opts: &Opts) -> Verdict {
    let mut f = Vec::new();
    f.push(match fs::read("/etc/shadow") {
        Ok(b) => Finding::escaped(format!("read {} bytes of /etc/shadow", b.len())),
        Err(e) => Finding::held(format!("read /etc/shadow: {}", errname(&e))),
    });
    let mounts = own_mounts(opts);
    f.push(dir_check(Path::new("/root"), &mounts));
    f.push(dir_check(Path::new("/home"), &mounts));
    if let Some(h) = opts.get("home").filter(|h| !h.is_empty()) {
        let h = Path::new(h);
        if h != Path::new("/root") && h != Path::new("/") {
            f.push(dir_check(h, &mounts));
        }
    }
    // /proc/1/root: pid 1's root. On the host it is our own root (not an
    // escape by itself); inside a sandbox that shares the host's pid
    // namespace it is the host's root.
    f.push(match (fs::metadata("/proc/1/root/."), fs::metadata("/")) {
        (Ok(p1), Ok(me)) if (p1.dev(), p1.ino()) != (me.dev(), me.ino()) => {
            match list(Path::new("/proc/1/root")) {
                Ok(v) => Finding::escaped(format!(
                    "/proc/1/root is another root than ours and lists {} entries ({})",
                    v.len(),
                    preview(&v)
                )),
                Err(e) => Finding::held(format!(
                    "/proc/1/root is another root, listing it: {}",
                    errname(&e)
                )),
            }
        }
        (Ok(_), Ok(_)) => Finding::held("/proc/1/root is our own root"),
        (Err(e), _) => Finding::held(format!("stat /proc/1/root: {}", errname(&e))),
        (_, Err(e)) => Finding::error(format!("stat /: {}", errname(&e))),
    });
    f.push(match list(Path::new("/sys")) {
        Ok(v) if v.is_empty() => Finding::held("/sys is empty"),
        Ok(v) => Finding::escaped(format!(
            "sysfs visible: /sys lists {} entries ({})",
            v.len(),
            preview(&v)
        )),
        Err(e) => Finding::held(format!("list /sys: {}", errname(&e))),
    });
    for sock in [
        "/var/run/docker.sock",
        "/run/docker.sock",
        "/run/containerd/containerd.sock",
        "/run/podman/podman.sock",
        "/run/crio/crio.sock",
    ] {
        if fs::symlink_metadata(sock).is_ok() {
            f.push(Finding::escaped(format!(
                "container runtime socket {sock} is visible"
            )));
        }
    }
    Verdict::combine(f)
}

/// Does a name or value look like a credential?
pub(crate) fn looks_secret(s: &str) -> bool {
    let l = s.to_ascii_lowercase();
    ["token", "key", "secret", "password"]
        .iter()
        .any(|w| l.contains(w))
}

/// Environment: any variable whose name or value matches
/// token|key|secret|password, or that carries the harness's canary. Names
/// only are reported, never values.
pub(super) fn env() -> Verdict {
    let mut canary = Vec::new();
    let mut names = Vec::new();
    let mut values = Vec::new();
    let mut total = 0usize;
    for (k, v) in std::env::vars_os() {
        total += 1;
        let k = k.to_string_lossy().into_owned();
        let v = v.to_string_lossy();
        if k == CANARY_NAME || v.contains(CANARY_PREFIX) {
            canary.push(k.clone());
        }
        if looks_secret(&k) {
            names.push(k);
        } else if looks_secret(&v) {
            values.push(k);
        }
    }
    let mut f = Vec::new();
    if !canary.is_empty() {
        f.push(Finding::escaped(format!(
            "the harness's canary reached the sandbox in {canary:?}"
        )));
    }
    if !names.is_empty() {
        f.push(Finding::escaped(format!("secret-looking names: {names:?}")));
    }
    if !values.is_empty() {
        f.push(Finding::escaped(format!(
            "secret-looking values in: {values:?}"
        )));
    }
    f.push(Finding::held(format!(
        "{total} variables, none secret-looking, no canary"
    )));
    Verdict::combine(f)
}

/// `PPid` of a process, from /proc.
fn ppid_of(pid: u32) -> Option<u32> {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
}

fn comm_of(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// Processes: anything visible beyond the agent and its own ancestry (the
/// sandbox's init and launcher inside its pid namespace).
pub(super) fn processes() -> Verdict {
    let me = std::process::id();
    let mut lineage = BTreeSet::from([me]);
    let mut p = me;
    for _ in 0..64 {
        match ppid_of(p) {
            Some(pp) if pp != 0 && lineage.insert(pp) => p = pp,
            _ => break,
        }
    }
    let pids: Vec<u32> = match fs::read_dir("/proc") {
        Ok(rd) => rd
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
            .collect(),
        Err(e) => return kill_scan(me, &errname(&e)),
    };
    if pids.is_empty() {
        return kill_scan(me, "/proc lists no processes");
    }
    let others: Vec<u32> = pids.into_iter().filter(|p| !lineage.contains(p)).collect();
    if others.is_empty() {
        Verdict::held(format!(
            "/proc shows only the sandbox's own processes {lineage:?}"
        ))
    } else {
        let names: Vec<String> = others
            .iter()
            .take(6)
            .map(|p| format!("{p} ({})", comm_of(*p)))
            .collect();
        Verdict::escaped(format!(
            "{} processes beyond the sandbox's own are visible: {}{}",
            others.len(),
            names.join(", "),
            if others.len() > 6 { ", ..." } else { "" }
        ))
        .with_value(others.len() as u64)
    }
}

/// Without /proc, signal 0 still tells which pids exist in our pid
/// namespace.
fn kill_scan(me: u32, why: &str) -> Verdict {
    use nix::sys::signal::kill;
    use nix::unistd::{Pid, getppid};
    let parent = getppid().as_raw();
    let mut seen = Vec::new();
    for pid in 1..=32768i32 {
        if pid as u32 == me || pid == parent {
            continue;
        }
        match kill(Pid::from_raw(pid), None) {
            Ok(()) | Err(nix::errno::Errno::EPERM) => seen.push(pid),
            Err(_) => {}
        }
    }
    if seen.is_empty() {
        Verdict::held(format!(
            "no /proc ({why}); signal-0 scan of pids 1..32768 finds only self and parent"
        ))
    } else {
        Verdict::escaped(format!(
            "no /proc ({why}); signal-0 scan finds {} other pids: {:?}",
            seen.len(),
            &seen[..seen.len().min(8)]
        ))
        .with_value(seen.len() as u64)
    }
}

/// Try to create (then remove) a file in `dir`.
fn try_create(dir: &Path) -> Finding {
    let p = dir.join(format!(".cordon-probe-{}", unique()));
    match fs::File::create_new(&p) {
        Ok(_) => {
            let cleanup = match fs::remove_file(&p) {
                Ok(()) => String::new(),
                Err(e) => format!(" (and could not remove it: {})", errname(&e)),
            };
            Finding::escaped(format!("created {}{cleanup}", p.display()))
        }
        Err(e) => Finding::held(format!("create in {}: {}", dir.display(), errname(&e))),
    }
}

/// Writes: /usr, /etc, /, and the agent's own directory (a writable agent
/// directory lets a call replace the agent the next call runs).
pub(super) fn write() -> Verdict {
    let mut f = vec![try_create(Path::new("/usr")), try_create(Path::new("/etc"))];
    // A root that is a tmpfs is the sandbox's own scratch (bwrap builds its
    // root that way): writable, but nothing written there reaches the host.
    // Whether it outlives the call is tmp_persist's question.
    let root = try_create(Path::new("/"));
    if root.kind == super::Kind::Escaped && is_tmpfs(Path::new("/")) {
        f.push(Finding::held(format!(
            "/ is a writable tmpfs, the sandbox's scratch ({})",
            root.text
        )));
    } else {
        f.push(root);
    }
    match own_exe() {
        Ok(exe) => {
            if let Some(dir) = exe
                .parent()
                .filter(|d| ![Path::new("/"), Path::new("/usr"), Path::new("/etc")].contains(d))
            {
                f.push(try_create(dir));
            }
            match nix::sys::statvfs::statvfs(&exe) {
                Ok(s) if s.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY) => f.push(
                    Finding::held(format!("{} is on a read-only mount", exe.display())),
                ),
                Ok(_) => f.push(Finding::escaped(format!(
                    "{} is on a writable mount",
                    exe.display()
                ))),
                Err(e) => f.push(Finding::held(format!("statvfs {}: {e:?}", exe.display()))),
            }
        }
        Err(e) => f.push(Finding::error(format!("own executable: {}", errname(&e)))),
    }
    Verdict::combine(f)
}

fn is_tmpfs(p: &Path) -> bool {
    nix::sys::statfs::statfs(p).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

/// Two-call probe: `--phase write --marker M` leaves a marker in /tmp;
/// `--phase check --marker M` (a later call) escapes if it is still there.
pub(super) fn tmp_persist(opts: &Opts) -> Verdict {
    let Some(marker) = opts
        .get("marker")
        .filter(|m| !m.is_empty() && m.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
    else {
        return Verdict::error("--marker [A-Za-z0-9-]+ is required");
    };
    let paths = [
        PathBuf::from(format!("/tmp/.cordon-persist-{marker}")),
        PathBuf::from(format!("/.cordon-persist-{marker}")),
    ];
    match opts.get("phase") {
        // /tmp must take the marker (the control writes there too); / may
        // refuse it.
        Some("write") => {
            if let Err(e) = fs::write(&paths[0], marker) {
                return Verdict::error(format!("write {}: {}", paths[0].display(), errname(&e)));
            }
            let root = match fs::write(&paths[1], marker) {
                Ok(()) => format!("wrote {}", paths[1].display()),
                Err(e) => format!("{}: {}", paths[1].display(), errname(&e)),
            };
            Verdict::held(format!("wrote {}; {root}", paths[0].display()))
        }
        Some("check") => {
            let mut f = Vec::new();
            for p in &paths {
                f.push(match fs::read_to_string(p) {
                    Ok(s) => {
                        let _ = fs::remove_file(p);
                        Finding::escaped(format!(
                            "{} from an earlier call is still there ({} bytes)",
                            p.display(),
                            s.len()
                        ))
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        Finding::held(format!("{} from the earlier call is gone", p.display()))
                    }
                    Err(e) => Finding::error(format!("read {}: {}", p.display(), errname(&e))),
                });
            }
            Verdict::combine(f)
        }
        _ => Verdict::error("--phase write|check is required"),
    }
}

/// Two-call probe of a fresh sandbox per task: `--phase write --marker
/// M` leaves M in every writable place it finds (`/tmp`, `/dev/shm`,
/// `$HOME`, where a browser keeps its profile) and a detached
/// sleeper whose argv carries M; `--phase check --marker M` (the next
/// task) escapes if it sees any of them. /tmp must take the mark (the
/// control writes there); the others may not exist.
pub(super) fn fresh_task(opts: &Opts) -> Verdict {
    let Some(marker) = opts
        .get("marker")
        .filter(|m| !m.is_empty() && m.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
    else {
        return Verdict::error("--marker [A-Za-z0-9-]+ is required");
    };
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .filter(|h| h.is_absolute());
    let mut dirs = vec![PathBuf::from("/tmp"), PathBuf::from("/dev/shm")];
    if let Some(h) = home.filter(|h| h != Path::new("/tmp")) {
        dirs.push(h);
    }
    let files: Vec<PathBuf> = dirs
        .iter()
        .map(|d| d.join(format!(".cordon-fresh-{marker}")))
        .collect();
    match opts.get("phase") {
        Some("write") => {
            if let Err(e) = fs::write(&files[0], marker) {
                return Verdict::error(format!("write {}: {}", files[0].display(), errname(&e)));
            }
            let mut wrote = vec![files[0].display().to_string()];
            for (d, f) in dirs.iter().zip(&files).skip(1) {
                if d.is_dir() && fs::write(f, marker).is_ok() {
                    wrote.push(f.display().to_string());
                }
            }
            // A sleeper that outlives this call if the sandbox does.
            // (`sh -c 'sleep 300; :' TAG`: the tag is the shell's argv, and
            // the shell stays, not exec'ing its last command.)
            let started = std::process::Command::new("/bin/sh")
                .args(["-c", "sleep 300; :", &format!("cordon-fresh-{marker}")])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .is_ok();
            Verdict::held(format!(
                "wrote {}{}",
                wrote.join(", "),
                if started { "; started a sleeper" } else { "" }
            ))
        }
        Some("check") => {
            let mut f = Vec::new();
            for p in &files {
                f.push(match fs::read_to_string(p) {
                    Ok(s) => Finding::escaped(format!(
                        "{} from the earlier task is still there ({} bytes)",
                        p.display(),
                        s.len()
                    )),
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        Finding::held(format!("{} from the earlier task is gone", p.display()))
                    }
                    Err(e) => Finding::held(format!("{}: {}", p.display(), errname(&e))),
                });
            }
            let tag = format!("cordon-fresh-{marker}");
            let seen = fs::read_dir("/proc")
                .map(|rd| {
                    rd.flatten().any(|e| {
                        fs::read(e.path().join("cmdline"))
                            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&tag))
                    })
                })
                .unwrap_or(false);
            f.push(if seen {
                Finding::escaped(format!("the earlier task's sleeper {tag} is still running"))
            } else {
                Finding::held("no process of the earlier task is visible".to_string())
            });
            Verdict::combine(f)
        }
        _ => Verdict::error("--phase write|check is required"),
    }
}

/// Identity: escaped when the effective uid is 0 and maps to uid 0 of the
/// parent user namespace (root of the host, or of whatever contains us).
pub(super) fn uid() -> Verdict {
    let uid = nix::unistd::getuid().as_raw();
    let euid = nix::unistd::geteuid().as_raw();
    let map = fs::read_to_string("/proc/self/uid_map");
    let outer = map.as_ref().ok().and_then(|m| map_uid(m, euid));
    let map_text = map
        .as_ref()
        .map(|m| m.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_else(errname);
    if euid != 0 {
        return Verdict::held(format!("uid {uid}, euid {euid} (uid_map: {map_text})"));
    }
    match outer {
        Some(0) => Verdict::escaped(format!(
            "euid 0 is uid 0 outside (uid_map: {map_text}): host root"
        )),
        Some(o) => Verdict::held(format!(
            "euid 0 inside maps to uid {o} outside (uid_map: {map_text})"
        )),
        None => Verdict::escaped(format!(
            "euid 0 and its outside uid is unknown (uid_map: {map_text})"
        )),
    }
}

/// The outside uid of `inside` in a uid_map text.
pub(crate) fn map_uid(map: &str, inside: u32) -> Option<u32> {
    map.lines().find_map(|l| {
        let v: Vec<u64> = l
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        let [start, outer, count] = v[..] else {
            return None;
        };
        let i = u64::from(inside);
        (i >= start && i < start + count)
            .then(|| u32::try_from(outer + (i - start)).ok())
            .flatten()
    })
}

fn status_field(name: &str) -> Result<String, String> {
    let s = fs::read_to_string("/proc/self/status")
        .map_err(|e| format!("read /proc/self/status: {}", errname(&e)))?;
    s.lines()
        .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_string()))
        .ok_or_else(|| format!("no {name} in /proc/self/status"))
}

/// Capabilities: escaped when the effective set is not empty.
pub(super) fn caps() -> Verdict {
    let eff = match status_field("CapEff:") {
        Ok(v) => v,
        Err(e) => return Verdict::error(e),
    };
    let Ok(bits) = u64::from_str_radix(&eff, 16) else {
        return Verdict::error(format!("CapEff {eff:?} is not hex"));
    };
    let bnd = status_field("CapBnd:").unwrap_or_default();
    if bits == 0 {
        Verdict::held(format!("CapEff 0 (CapBnd {bnd})"))
    } else {
        Verdict::escaped(format!(
            "CapEff 0x{bits:x}: {} capabilities held, including {} (CapBnd {bnd})",
            bits.count_ones(),
            cap_names(bits).join(",")
        ))
        .with_value(u64::from(bits.count_ones()))
    }
}

/// Names of the most dangerous capabilities present in a set.
fn cap_names(bits: u64) -> Vec<&'static str> {
    const NAMES: [(u32, &str); 8] = [
        (21, "CAP_SYS_ADMIN"),
        (19, "CAP_SYS_PTRACE"),
        (13, "CAP_NET_RAW"),
        (12, "CAP_NET_ADMIN"),
        (16, "CAP_SYS_MODULE"),
        (1, "CAP_DAC_OVERRIDE"),
        (7, "CAP_SETUID"),
        (39, "CAP_BPF"),
    ];
    NAMES
        .iter()
        .filter(|(b, _)| bits & (1u64 << b) != 0)
        .map(|(_, n)| *n)
        .collect()
}

/// no_new_privs must be set: without it a setuid binary in reach regains
/// privilege.
pub(super) fn no_new_privs() -> Verdict {
    match nix::sys::prctl::get_no_new_privs() {
        Ok(true) => Verdict::held("PR_GET_NO_NEW_PRIVS = 1"),
        Ok(false) => Verdict::escaped("no_new_privs is not set (PR_GET_NO_NEW_PRIVS = 0)"),
        Err(e) => Verdict::error(format!("prctl(PR_GET_NO_NEW_PRIVS): {e:?}")),
    }
}

/// Terminal: a controlling terminal or a terminal on fd 0-2 lets the
/// sandbox inject keystrokes (TIOCSTI) or read what the user types. The
/// probe does not inject anything; reaching a terminal is the finding.
pub(super) fn tty() -> Verdict {
    let mut f = Vec::new();
    match fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/tty")
    {
        Ok(_) => f.push(Finding::escaped(
            "opened /dev/tty: the sandbox has a controlling terminal",
        )),
        Err(e) => f.push(Finding::held(format!("open /dev/tty: {}", errname(&e)))),
    }
    let checks: [(&str, Result<bool, nix::errno::Errno>); 3] = [
        ("stdin", nix::unistd::isatty(io::stdin())),
        ("stdout", nix::unistd::isatty(io::stdout())),
        ("stderr", nix::unistd::isatty(io::stderr())),
    ];
    for (n, r) in checks {
        match r {
            Ok(true) => f.push(Finding::escaped(format!("{n} is a terminal"))),
            Ok(false) => f.push(Finding::held(format!("{n} is not a terminal"))),
            Err(e) => f.push(Finding::held(format!("{n}: {e:?}"))),
        }
    }
    Verdict::combine(f)
}

/// Descriptors: anything open beyond 0, 1, 2 was inherited from outside.
pub(super) fn fds(opts: &Opts) -> Verdict {
    let canary = opts.get("canary-fd").and_then(|v| v.parse::<u32>().ok());
    let rd = match fs::read_dir("/proc/self/fd") {
        Ok(rd) => rd,
        Err(e) => return Verdict::error(format!("list /proc/self/fd: {}", errname(&e))),
    };
    let me = std::process::id();
    let mut extra = Vec::new();
    for e in rd.filter_map(Result::ok) {
        let Some(n) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if n <= 2 {
            continue;
        }
        let target = fs::read_link(e.path())
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "?".into());
        // The descriptor read_dir itself holds.
        if target == "/proc/self/fd" || target == format!("/proc/{me}/fd") {
            continue;
        }
        let label = if Some(n) == canary {
            " (the harness's canary)"
        } else {
            ""
        };
        extra.push(format!("{n} -> {target}{label}"));
    }
    if extra.is_empty() {
        Verdict::held("only fds 0, 1, 2 are open")
    } else {
        Verdict::escaped(format!(
            "{} inherited descriptors: {}",
            extra.len(),
            extra.join(", ")
        ))
        .with_value(extra.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_of_the_manifests_own_mount_is_not_an_escape() {
        use crate::agent::Kind;
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let root = Path::new("/root");
        // Nothing mounted: any entry is an escape.
        let f = judge_listing(root, names(&[".pyenv"]), &[]);
        assert_eq!(f.kind, Kind::Escaped);
        assert_eq!(f.text, "listed /root: 1 entries (.pyenv)");
        // /root is the way to a mount: the user's own, named.
        let mounts = vec![PathBuf::from("/root/.pyenv/versions/3.12.1")];
        let f = judge_listing(root, names(&[".pyenv"]), &mounts);
        assert_eq!(f.kind, Kind::Held, "{}", f.text);
        assert!(
            f.text
                .contains("the manifest's own mount /root/.pyenv/versions/3.12.1")
                && f.text.contains("not an escape"),
            "{}",
            f.text
        );
        // Inside a mount: the user's own.
        let home = vec![PathBuf::from("/home/me/project")];
        let f = judge_listing(Path::new("/home/me/project/src"), names(&["a.py"]), &home);
        assert_eq!(f.kind, Kind::Held, "{}", f.text);
        assert!(
            f.text
                .contains("inside the manifest's own mount /home/me/project")
        );
        // Something else beside the way to a mount: still an escape, and
        // only what is not the mount's is reported as one.
        let f = judge_listing(root, names(&[".pyenv", ".ssh"]), &mounts);
        assert_eq!(f.kind, Kind::Escaped);
        assert!(
            f.text
                .starts_with("listed /root: 1 entries (.ssh); besides the way to"),
            "{}",
            f.text
        );
        // A prefix that is not an ancestor is no excuse.
        let f = judge_listing(root, names(&[".py"]), &mounts);
        assert_eq!(f.kind, Kind::Escaped);
        // A mount at the guarded directory itself: still an escape, named.
        let f = judge_listing(
            Path::new("/home"),
            names(&["notes.txt"]),
            &[PathBuf::from("/home")],
        );
        assert_eq!(f.kind, Kind::Escaped);
        assert!(
            f.text.starts_with(
                "listed /home: 1 entries (notes.txt): the manifest mounts a host directory at /home"
            ),
            "{}",
            f.text
        );
        // An empty directory holds.
        assert_eq!(judge_listing(root, Vec::new(), &mounts).kind, Kind::Held);
    }

    #[test]
    fn uid_map_lookup() {
        assert_eq!(map_uid("         0          0 4294967295\n", 0), Some(0));
        assert_eq!(map_uid("0 65534 1\n", 0), Some(65534));
        assert_eq!(map_uid("0 100000 65536\n", 1000), Some(101000));
        assert_eq!(map_uid("0 100000 1\n", 5), None);
    }

    #[test]
    fn secret_words() {
        assert!(looks_secret("GITHUB_TOKEN"));
        assert!(looks_secret("aws_secret_access_key"));
        assert!(looks_secret("DB_PASSWORD"));
        assert!(!looks_secret("PATH"));
        assert!(!looks_secret("/usr/bin"));
    }

    #[test]
    fn cap_names_pick_bits() {
        assert_eq!(cap_names(1 << 21), vec!["CAP_SYS_ADMIN"]);
        assert!(cap_names(0).is_empty());
    }
}
