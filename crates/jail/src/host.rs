//! What the host offers, for `Jail::new` and `cordon doctor`.

use std::fs;
use std::path::{Path, PathBuf};

use serde::Serialize;

pub use cordon_sandbox::layout::SystemDir;

use crate::cgroup::{Layout, Placement, Version};

/// One mounted cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Hierarchy {
    /// v1 or v2.
    pub version: Version,
    /// Controllers (v1: mount options; v2: the own cgroup's
    /// `cgroup.controllers`).
    pub controllers: Vec<String>,
    /// Mount point.
    pub mount: PathBuf,
    /// The broker's own cgroup in it, as a directory.
    pub own: PathBuf,
}

/// Host facts.
#[derive(Debug, Clone, Serialize)]
pub struct HostFacts {
    /// `uname -r`.
    pub kernel: String,
    /// CPU architecture.
    pub arch: String,
    /// Effective uid of the broker.
    pub euid: u32,
    /// Effective gid of the broker.
    pub egid: u32,
    /// Whether the broker runs as root (then the tool runs as
    /// `unprivileged_uid` on the host).
    pub root: bool,
    /// `/proc/sys/user/max_user_namespaces` > 0.
    pub user_namespaces: bool,
    /// Landlock ABI version (0: none).
    pub landlock_abi: i32,
    /// seccomp filter mode available (`Seccomp:` in /proc/self/status).
    pub seccomp: bool,
    /// `/proc/sys/kernel/cap_last_cap`.
    pub cap_last_cap: u32,
    /// The kernel has `mount_setattr(2)` (Linux 5.12+), which makes a bind
    /// and every mount below it read-only. When false, read-only binds
    /// fall back to a bind remount, which covers only the top mount of a
    /// bind: mounts below a bound host directory stay as the host has them
    /// (writable, if they are).
    pub mount_setattr: bool,
    /// The kernel has `close_range(2)` (Linux 5.9+). When false, the
    /// sandbox closes inherited descriptors one by one, up to descriptor
    /// 4095 (one above that stays open unless it is close-on-exec).
    pub close_range: bool,
    /// `/bin`, `/lib`... are symlinks into /usr.
    pub merged_usr: bool,
    /// The system directories bound into the sandbox besides /usr.
    pub system_dirs: Vec<SystemDir>,
    /// Mounted cgroup hierarchies.
    pub cgroup_hierarchies: Vec<Hierarchy>,
    /// Where memory, pids and cpu limits would go.
    pub cgroup_layout: Layout,
    /// Anything noteworthy.
    pub notes: Vec<String>,
}

/// Detect the host (read-only; creates nothing). After this process was
/// given a delegated scope (see [`crate::delegate`]), the cgroup layout is
/// the one under it.
pub fn detect() -> HostFacts {
    let mut notes = Vec::new();
    let euid = cordon_sys::io::geteuid();
    let user_namespaces = read_proc("/proc/sys/user/max_user_namespaces")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(|n| n > 0)
        .unwrap_or(false);
    if !user_namespaces {
        notes.push("user namespaces are disabled (user.max_user_namespaces = 0)".into());
    }
    let seccomp = cordon_sys::io::seccomp_available();
    let cap_last_cap = read_proc("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(63);
    let (system_dirs, merged_usr) = system_dirs();
    let cgroup_hierarchies = cgroup_hierarchies(&mut notes);
    // Once this process is in a delegated scope, its slots go under it.
    let cgroup_layout = match crate::delegate::current().and_then(|d| d.scope()) {
        Some(scope) => delegated_layout(scope),
        None => layout(&cgroup_hierarchies),
    };
    HostFacts {
        kernel: cordon_sys::io::kernel_release(),
        arch: std::env::consts::ARCH.to_string(),
        euid,
        egid: cordon_sys::io::getegid(),
        root: euid == 0,
        user_namespaces,
        landlock_abi: cordon_sys::io::landlock_abi(),
        seccomp,
        cap_last_cap,
        mount_setattr: cordon_sys::io::mount_setattr_available(),
        close_range: cordon_sys::io::close_range_available(),
        merged_usr,
        system_dirs,
        cgroup_hierarchies,
        cgroup_layout,
        notes,
    }
}

/// The top-level system directories the sandbox gets besides /usr, as the
/// host has them, and whether /usr is merged (`/bin` and `/lib` are
/// symlinks into it).
pub fn system_dirs() -> (Vec<SystemDir>, bool) {
    let mut system_dirs = Vec::new();
    let mut merged_usr = true;
    for d in cordon_sandbox::layout::SYSTEM_DIRS {
        let p = Path::new(d);
        match fs::symlink_metadata(p) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(t) = fs::read_link(p) {
                    system_dirs.push(SystemDir {
                        path: p.to_path_buf(),
                        symlink: Some(t),
                    });
                }
            }
            Ok(m) if m.is_dir() => {
                if matches!(d, "/bin" | "/lib") {
                    merged_usr = false;
                }
                system_dirs.push(SystemDir {
                    path: p.to_path_buf(),
                    symlink: None,
                });
            }
            _ => {}
        }
    }
    (system_dirs, merged_usr)
}

/// Parse /proc/self/mountinfo and /proc/self/cgroup.
fn cgroup_hierarchies(notes: &mut Vec<String>) -> Vec<Hierarchy> {
    let Ok(mountinfo) = read_proc("/proc/self/mountinfo") else {
        notes.push("cannot read /proc/self/mountinfo".into());
        return Vec::new();
    };
    let Ok(own) = read_proc("/proc/self/cgroup") else {
        notes.push("cannot read /proc/self/cgroup".into());
        return Vec::new();
    };
    parse_hierarchies(&mountinfo, &own)
}

/// A procfs or cgroupfs file, read in few system calls.
fn read_proc(path: impl AsRef<Path>) -> std::io::Result<String> {
    cordon_sys::io::read_small(fs::File::open(path)?.into())
}

/// Unescape mountinfo's octal escapes (`\040` for a space).
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && let Some(oct) = b.get(i + 1..i + 4)
            && let Ok(oct) = std::str::from_utf8(oct)
            && let Ok(v) = u8::from_str_radix(oct, 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Pure parser (unit-tested): mountinfo + /proc/self/cgroup → hierarchies.
pub fn parse_hierarchies(mountinfo: &str, own: &str) -> Vec<Hierarchy> {
    // /proc/self/cgroup: "id:controllers:path"; v2 is "0::path".
    let mut own_v1: Vec<(Vec<String>, String)> = Vec::new();
    let mut own_v2: Option<String> = None;
    for l in own.lines() {
        let mut it = l.splitn(3, ':');
        let (Some(id), Some(ctl), Some(path)) = (it.next(), it.next(), it.next()) else {
            continue;
        };
        if id == "0" && ctl.is_empty() {
            own_v2 = Some(path.to_string());
        } else {
            own_v1.push((
                ctl.split(',').map(str::to_string).collect(),
                path.to_string(),
            ));
        }
    }
    let mut out = Vec::new();
    let mut seen_mounts: Vec<String> = Vec::new();
    for l in mountinfo.lines() {
        let fields: Vec<&str> = l.split(' ').collect();
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let (Some(root), Some(mnt), Some(fstype), Some(superopts)) = (
            fields.get(3),
            fields.get(4),
            fields.get(sep + 1),
            fields.get(sep + 3),
        ) else {
            continue;
        };
        let root = unescape(root);
        let mnt = unescape(mnt);
        let rel = |path: &str| -> Option<PathBuf> {
            // The own cgroup path is relative to the hierarchy root; the
            // mount shows `root` of that hierarchy at `mnt`.
            let stripped = if root == "/" {
                path.to_string()
            } else {
                path.strip_prefix(root.as_str())?.to_string()
            };
            Some(Path::new(&mnt).join(stripped.trim_start_matches('/')))
        };
        match *fstype {
            "cgroup2" => {
                if seen_mounts.contains(&mnt) {
                    continue;
                }
                let Some(p) = own_v2.as_deref() else { continue };
                let Some(dir) = rel(p) else { continue };
                let controllers = read_proc(dir.join("cgroup.controllers"))
                    .map(|s| s.split_whitespace().map(str::to_string).collect())
                    .unwrap_or_default();
                seen_mounts.push(mnt.clone());
                out.push(Hierarchy {
                    version: Version::V2,
                    controllers,
                    mount: PathBuf::from(&mnt),
                    own: dir,
                });
            }
            "cgroup" => {
                let opts: Vec<String> = superopts.split(',').map(str::to_string).collect();
                let Some((ctls, p)) = own_v1
                    .iter()
                    .find(|(ctls, _)| ctls.iter().any(|c| !c.is_empty() && opts.contains(c)))
                else {
                    continue;
                };
                if seen_mounts.contains(&mnt) {
                    continue;
                }
                let Some(dir) = rel(p) else { continue };
                seen_mounts.push(mnt.clone());
                out.push(Hierarchy {
                    version: Version::V1,
                    controllers: ctls.clone(),
                    mount: PathBuf::from(&mnt),
                    own: dir,
                });
            }
            _ => {}
        }
    }
    out
}

/// Choose v2 for a controller when the own v2 cgroup offers it, else v1.
pub fn layout(h: &[Hierarchy]) -> Layout {
    let v2 = h.iter().find(|x| x.version == Version::V2);
    let place = |name: &str| -> Option<Placement> {
        if let Some(v) = v2
            && v.controllers.iter().any(|c| c == name)
        {
            return Some(Placement {
                version: Version::V2,
                base: v.own.join("cordon"),
            });
        }
        h.iter()
            .find(|x| x.version == Version::V1 && x.controllers.iter().any(|c| c == name))
            .map(|x| Placement {
                version: Version::V1,
                base: x.own.join("cordon"),
            })
    };
    let memory = place("memory");
    let pids = place("pids");
    let cpu = place("cpu");
    // A v2 directory per slot wherever a v2 hierarchy is mounted, also on
    // a hybrid host whose controllers are all v1: the sandbox is born in it
    // (CLONE_INTO_CGROUP) and `cgroup.kill` ends everything in it at once.
    // On a hybrid host it is optional (`Pool::new` drops it, with a note,
    // when it cannot be made).
    let v2_base = v2.map(|v| v.own.join("cordon"));
    Layout {
        memory,
        pids,
        cpu,
        v2_base,
    }
}

/// The layout under a delegated cgroup `scope` (see [`crate::delegate`]):
/// every controller the scope offers is v2 at `<scope>/cordon`, and so is
/// the v2 base.
pub fn delegated_layout(scope: &Path) -> Layout {
    let controllers: Vec<String> = read_proc(scope.join("cgroup.controllers"))
        .map(|s| s.split_whitespace().map(str::to_string).collect())
        .unwrap_or_default();
    let base = scope.join("cordon");
    let place = |name: &str| {
        controllers.iter().any(|c| c == name).then(|| Placement {
            version: Version::V2,
            base: base.clone(),
        })
    };
    Layout {
        memory: place("memory"),
        pids: place("pids"),
        cpu: place("cpu"),
        v2_base: Some(base.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";
    const HYBRID_OWN: &str = "\
9:name=systemd:/
8:pids:/
4:memory:/process_api/abc
1:cpu:/
0::/
";

    #[test]
    fn hybrid_host_uses_v1_for_limits() {
        let h = parse_hierarchies(HYBRID_MOUNTINFO, HYBRID_OWN);
        let l = layout(&h);
        let mem = l.memory.unwrap();
        assert_eq!(mem.version, Version::V1);
        assert_eq!(
            mem.base,
            Path::new("/sys/fs/cgroup/memory/process_api/abc/cordon")
        );
        assert_eq!(
            l.pids.unwrap().base,
            Path::new("/sys/fs/cgroup/pids/cordon")
        );
        assert_eq!(l.cpu.unwrap().base, Path::new("/sys/fs/cgroup/cpu/cordon"));
        // The unified hierarchy still gives each slot a directory to be born
        // in and to kill through.
        assert_eq!(
            l.v2_base.as_deref(),
            Some(Path::new("/sys/fs/cgroup/unified/cordon"))
        );
    }

    #[test]
    fn pure_v2_host() {
        let mi = "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n";
        let own = "0::/user.slice/user-1000.slice/session-1.scope\n";
        let h = parse_hierarchies(mi, own);
        assert_eq!(h.len(), 1);
        assert_eq!(
            h[0].own,
            Path::new("/sys/fs/cgroup/user.slice/user-1000.slice/session-1.scope")
        );
        // No cgroup.controllers readable in this fake: no controllers, but
        // a v2 base for kill/CLONE_INTO_CGROUP.
        let l = layout(&h);
        assert!(l.memory.is_none());
        assert!(l.v2_base.is_some());
    }

    #[test]
    fn delegated_scope_layout() {
        let t = tempfile::tempdir().unwrap();
        fs::write(t.path().join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        let l = delegated_layout(t.path());
        let base = t.path().join("cordon");
        for p in [&l.memory, &l.pids, &l.cpu] {
            let p = p.as_ref().unwrap();
            assert_eq!((p.version, &p.base), (Version::V2, &base));
        }
        assert_eq!(l.v2_base.as_ref(), Some(&base));
        // A manager that delegates no cpu controller: no cpu placement.
        fs::write(t.path().join("cgroup.controllers"), "memory pids\n").unwrap();
        assert!(delegated_layout(t.path()).cpu.is_none());
    }

    #[test]
    fn unescape_octal() {
        assert_eq!(unescape("/a\\040b"), "/a b");
        assert_eq!(unescape("/plain"), "/plain");
    }
}
