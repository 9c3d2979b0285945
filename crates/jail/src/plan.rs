//! Build the child's setup program (mounts, files, Landlock, rlimits,
//! exec candidates) from a spec, in the broker, before clone.
//!
//! # The root
//!
//! Every sandbox's root is a small tmpfs of the jail's own, mounted on the
//! jail's root mount point inside the sandbox's mount namespace, filled,
//! then made the root with `pivot_root` and remounted read-only.
//!
//! - [`Root::HostBinds`]: read-only binds of the host's `/usr` and the other
//!   system directories (symlinks where the host has them), and an `/etc`
//!   the jail writes (passwd, group, nsswitch.conf, hosts, hostname, plus
//!   the host's ld.so.cache and alternatives, read-only).
//! - [`Root::Image`]: the tmpfs mirrors the image's top level. Each
//!   directory of the rootfs is bound read-only (recursively, nosuid,
//!   nodev) at its own name, each regular file likewise; each symlink is
//!   made again with the same target, so it is never followed on the host
//!   and resolves inside the sandbox; anything else (a device node, FIFO
//!   or socket) is left out. Nothing of the host's system directories and
//!   no written `/etc`: the image's `/etc` is used as it is. The rootfs is
//!   only read, never written.
//!
//! Then, for both: `/dev` (five device binds and the fd symlinks), a fresh
//! `/proc` with the OCI masks and an empty tmpfs `/tmp` of `disk_bytes`,
//! always the jail's own whatever an image has at those names (so an image
//! without them gets them too), and the spec's binds. `ls /` in an image
//! sandbox shows the image's entries plus `dev`, `proc`, `tmp` and the
//! first component of each bind (`.cordon` for the probe agent).
//!
//! Why a mirror rather than the rootfs bound as the root itself: that bind
//! would need `/proc`, `/dev` and `/tmp` mount points inside the image,
//! which a read-only image without them cannot get short of writing into
//! the store or stacking an overlay. One bind per top-level entry (a
//! dozen or two in a usual image) needs neither.
//!
//! The setup program resolves its paths before `pivot_root`, where an
//! absolute symlink would lead to the host: so a bind destination that
//! passes through a symlink of the image is refused ([`JailError::Spec`]).

use std::ffi::CString;
use std::net::{IpAddr, SocketAddr};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use cordon_sys::spawn::{DoorsPlan, LandlockPlan, Op, Step};
use landlock::{ABI, Access, AccessFs, AccessNet, BitFlags, Scope};

use cordon_sandbox::layout::{self, HOST_ETC, ImageEntryKind, USR, etc_files};

use crate::host::SystemDir;
use crate::{DoorRequest, JailError, JailSpec, LandlockStatus, Root};

/// The Landlock ABI whose rights we ask for.
pub const LANDLOCK_TARGET: ABI = ABI::V6;

/// How the tool's binds and volumes are made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BindBy {
    /// The child binds the host path: it must be able to walk to it with
    /// the sandbox's credentials (an unprivileged broker's own uid).
    Path,
    /// The broker clones each source's mount tree with its own credentials
    /// and the child attaches it ([`cordon_sys::mount::clone_tree`]): a
    /// source under a directory the sandbox's uid cannot search (a 0700
    /// home) is mounted all the same; inside, its own permissions apply.
    /// A root broker's way; a source it cannot clone (EPERM, ENOSYS) falls
    /// back to the path.
    Tree,
}

impl BindBy {
    /// How this process's sandboxes get their binds: [`BindBy::Tree`] when
    /// it is root (it can clone mount trees), else [`BindBy::Path`].
    pub fn for_this_broker() -> BindBy {
        if cordon_sys::io::geteuid() == 0 {
            BindBy::Tree
        } else {
            BindBy::Path
        }
    }
}

/// The filesystem program plus a description of each step for errors.
pub struct Program {
    pub steps: Vec<Step>,
    pub names: Vec<String>,
    /// Mount trees attached so far ([`Op::AttachTree`] slots).
    trees: u32,
}

fn c(s: impl AsRef<[u8]>) -> Result<CString, JailError> {
    CString::new(s.as_ref().to_vec())
        .map_err(|_| JailError::Spec("path or string contains a NUL byte".into()))
}

fn cp(p: &Path) -> Result<CString, JailError> {
    c(p.as_os_str().as_bytes())
}

impl Program {
    fn push(&mut self, name: String, op: Op) {
        self.steps.push(Step {
            op,
            skip_if_missing: false,
        });
        self.names.push(name);
    }

    fn push_optional(&mut self, name: String, op: Op) {
        self.steps.push(Step {
            op,
            skip_if_missing: true,
        });
        self.names.push(name);
    }
}

/// A sandbox path: absolute, normal components only, not one the jail
/// owns.
pub fn check_dst(dst: &Path) -> Result<(), JailError> {
    if !dst.is_absolute() {
        return Err(JailError::Spec(format!(
            "bind destination {} is not absolute",
            dst.display()
        )));
    }
    let mut first = None;
    for comp in dst.components() {
        match comp {
            Component::RootDir => {}
            Component::Normal(n) => {
                if first.is_none() {
                    first = Some(n.to_string_lossy().into_owned());
                }
            }
            _ => {
                return Err(JailError::Spec(format!(
                    "bind destination {} must not contain . or ..",
                    dst.display()
                )));
            }
        }
    }
    match first.as_deref() {
        None => Err(JailError::Spec("bind destination / is not allowed".into())),
        Some(top)
            if (layout::is_own_dir(std::ffi::OsStr::new(top)) || top == "etc")
                && dst.components().count() == 2 =>
        {
            Err(JailError::Spec(format!(
                "bind destination {} would hide a sandbox directory",
                dst.display()
            )))
        }
        Some("proc" | "dev") => Err(JailError::Spec(format!(
            "bind destination {} is inside /proc or /dev",
            dst.display()
        ))),
        _ => Ok(()),
    }
}

/// /proc entries masked as OCI runtimes do, limited to those the host's
/// /proc has (checked once): files bound over with /dev/null, directories
/// made read-only, directories hidden under an empty read-only tmpfs.
#[allow(clippy::type_complexity)]
fn proc_masks() -> &'static (Vec<&'static str>, Vec<&'static str>, Vec<&'static str>) {
    static MASKS: OnceLock<(Vec<&'static str>, Vec<&'static str>, Vec<&'static str>)> =
        OnceLock::new();
    MASKS.get_or_init(|| {
        let present = |names: &[&'static str]| -> Vec<&'static str> {
            names
                .iter()
                .copied()
                .filter(|n| Path::new("/proc").join(n).exists())
                .collect()
        };
        (
            present(&[
                "kcore",
                "keys",
                "key-users",
                "timer_list",
                "sched_debug",
                "sysrq-trigger",
                "latency_stats",
                "timer_stats",
                "kallsyms",
                "kpagecount",
                "kpageflags",
                "kpagecgroup",
                "config.gz",
            ]),
            present(&["sys", "bus", "fs", "irq"]),
            present(&["acpi", "scsi", "asound", "driver"]),
        )
    })
}

/// Mounts and files of the sandbox root (see the module docs for the
/// layout). `root` is the host directory the new root's tmpfs is mounted on;
/// `system_dirs` are the host's (`HostFacts::system_dirs`, used for the
/// host root only); `uid` and `gid` go into the written `/etc` of the host
/// root.
pub fn program(
    root: &Path,
    system_dirs: &[SystemDir],
    spec: &JailSpec,
    uid: u32,
    gid: u32,
) -> Result<Program, JailError> {
    program_by(root, system_dirs, spec, uid, gid, BindBy::Path)
}

/// [`program`] with the tool's binds and volumes made `by` paths or
/// cloned trees.
pub fn program_by(
    root: &Path,
    system_dirs: &[SystemDir],
    spec: &JailSpec,
    uid: u32,
    gid: u32,
    by: BindBy,
) -> Result<Program, JailError> {
    let mut p = Program {
        steps: Vec::with_capacity(64),
        names: Vec::with_capacity(64),
        trees: 0,
    };
    p.push("hostname".into(), Op::Hostname { name: c("cordon")? });
    p.push(
        "make every mount private".into(),
        Op::Mount {
            src: None,
            target: c("/")?,
            fstype: None,
            flags: libc::MS_REC | libc::MS_PRIVATE,
            data: None,
        },
    );
    p.push(
        "mount tmpfs on the new root".into(),
        Op::Mount {
            src: Some(c("tmpfs")?),
            target: cp(root)?,
            fstype: Some(c("tmpfs")?),
            flags: libc::MS_NOSUID | libc::MS_NODEV,
            data: Some(c("mode=0755,size=1m,nr_inodes=4096")?),
        },
    );
    match &spec.root {
        Root::HostBinds => host_root(&mut p, root, system_dirs, uid, gid)?,
        Root::Image { rootfs, .. } => image_root(&mut p, root, rootfs)?,
    }
    jail_dirs(&mut p, root, spec, by)?;
    Ok(p)
}

/// The filesystem program of a supervisor ([`crate::Jail::run_supervisor`]):
/// its mount namespace private, and a `/proc` of its own pid namespace
/// (the host's would show the wrong pids); nothing else changes.
pub fn supervisor_program() -> Result<Program, JailError> {
    let mut p = Program {
        steps: Vec::with_capacity(2),
        names: Vec::with_capacity(2),
        trees: 0,
    };
    p.push(
        "make every mount private".into(),
        Op::Mount {
            src: None,
            target: c("/")?,
            fstype: None,
            flags: libc::MS_REC | libc::MS_PRIVATE,
            data: None,
        },
    );
    p.push(
        "mount /proc of the new pid namespace".into(),
        Op::Mount {
            src: Some(c("proc")?),
            target: c("/proc")?,
            fstype: Some(c("proc")?),
            flags: libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            data: None,
        },
    );
    Ok(p)
}

/// The host's system directories and a written `/etc`.
fn host_root(
    p: &mut Program,
    root: &Path,
    system_dirs: &[SystemDir],
    uid: u32,
    gid: u32,
) -> Result<(), JailError> {
    let r = |rel: &str| -> PathBuf { root.join(rel.trim_start_matches('/')) };
    let ro = libc::MS_NOSUID | libc::MS_NODEV;
    // /usr and the other system directories.
    p.push(
        format!("mkdir {USR}"),
        Op::Mkdir {
            path: cp(&r(USR))?,
            mode: 0o755,
        },
    );
    p.push(
        format!("mount {USR} read-only"),
        Op::BindReadOnly {
            src: c(USR)?,
            target: cp(&r(USR))?,
            flags: ro,
        },
    );
    for d in system_dirs {
        let rel = d.path.to_string_lossy();
        match &d.symlink {
            Some(target) => p.push(
                format!("symlink {rel}"),
                Op::Symlink {
                    target: cp(target)?,
                    link: cp(&r(&rel))?,
                },
            ),
            None => {
                p.push(
                    format!("mkdir {rel}"),
                    Op::Mkdir {
                        path: cp(&r(&rel))?,
                        mode: 0o755,
                    },
                );
                p.push(
                    format!("mount {rel} read-only"),
                    Op::BindReadOnly {
                        src: cp(&d.path)?,
                        target: cp(&r(&rel))?,
                        flags: ro,
                    },
                );
            }
        }
    }
    // /etc: written files, plus the host's entries of the layout.
    p.push(
        "mkdir /etc".into(),
        Op::Mkdir {
            path: cp(&r("etc"))?,
            mode: 0o755,
        },
    );
    for (name, content) in etc_files(uid, gid) {
        p.push(
            format!("write /etc/{name}"),
            Op::WriteFile {
                path: cp(&r(&format!("etc/{name}")))?,
                mode: 0o644,
                contents: content.into_bytes(),
            },
        );
    }
    for e in HOST_ETC {
        if !e.on_host() {
            continue;
        }
        let path = e.path();
        let shown = path.display();
        let target = cp(&r(&path.to_string_lossy()))?;
        if e.dir {
            p.push(
                format!("mkdir {shown}"),
                Op::Mkdir {
                    path: target.clone(),
                    mode: 0o755,
                },
            );
        } else {
            p.push(
                format!("create {shown}"),
                Op::WriteFile {
                    path: target.clone(),
                    mode: 0o644,
                    contents: Vec::new(),
                },
            );
        }
        p.push(
            format!("mount {shown} read-only"),
            Op::BindReadOnly {
                src: cp(&path)?,
                target,
                flags: ro,
            },
        );
    }
    Ok(())
}

/// The top level of an image's rootfs, mirrored on the root's tmpfs (see
/// the module docs).
fn image_root(p: &mut Program, root: &Path, rootfs: &Path) -> Result<(), JailError> {
    let entries = layout::image_entries(rootfs).map_err(|e| match e {
        layout::ImageError::Io(_, _, err) => {
            JailError::Spec(format!("image root {}: {err}", rootfs.display()))
        }
        e @ layout::ImageError::NotAbsolute(_) => JailError::Spec(e.to_string()),
    })?;
    let ro = libc::MS_NOSUID | libc::MS_NODEV;
    for entry in entries {
        let shown = entry.name.to_string_lossy();
        let src = entry.src(rootfs);
        let target = cp(&root.join(&entry.name))?;
        match &entry.kind {
            ImageEntryKind::Symlink(to) => {
                p.push(
                    format!("symlink /{shown}"),
                    Op::Symlink {
                        target: cp(to)?,
                        link: target,
                    },
                );
                continue;
            }
            ImageEntryKind::Dir => p.push(
                format!("mkdir /{shown}"),
                Op::Mkdir {
                    path: target.clone(),
                    mode: 0o755,
                },
            ),
            ImageEntryKind::File => p.push(
                format!("create /{shown}"),
                Op::WriteFile {
                    path: target.clone(),
                    mode: 0o644,
                    contents: Vec::new(),
                },
            ),
        }
        p.push(
            format!("mount the image's /{shown} read-only"),
            Op::BindReadOnly {
                src: cp(&src)?,
                target,
                flags: ro,
            },
        );
    }
    Ok(())
}

/// The spec's trust bundle (see [`JailSpec::trust_bundle`]).
fn trust_bundle(p: &mut Program, root: &Path, spec: &JailSpec) -> Result<(), JailError> {
    let Some(bundle) = &spec.trust_bundle else {
        return Ok(());
    };
    let r = |rel: &str| -> PathBuf { root.join(rel.trim_start_matches('/')) };
    match &spec.root {
        Root::HostBinds => {
            for d in [
                "etc/ssl",
                "etc/ssl/certs",
                "etc/pki",
                "etc/pki/tls",
                "etc/pki/tls/certs",
            ] {
                p.push(
                    format!("mkdir /{d}"),
                    Op::Mkdir {
                        path: cp(&r(d))?,
                        mode: 0o755,
                    },
                );
            }
            p.push(
                format!("write {}", crate::TRUST_BUNDLE),
                Op::WriteFile {
                    path: cp(&r(crate::TRUST_BUNDLE))?,
                    mode: 0o644,
                    contents: bundle.clone(),
                },
            );
            for link in &crate::TRUST_BUNDLE_PATHS[1..] {
                p.push(
                    format!("symlink {link}"),
                    Op::Symlink {
                        target: c(crate::TRUST_BUNDLE)?,
                        link: cp(&r(link))?,
                    },
                );
            }
        }
        Root::Image { rootfs, .. } => {
            let copy = cp(&r(crate::TRUST_BUNDLE_IMAGE))?;
            p.push(
                format!("write {}", crate::TRUST_BUNDLE_IMAGE),
                Op::WriteFile {
                    path: copy.clone(),
                    mode: 0o644,
                    contents: bundle.clone(),
                },
            );
            for path in crate::TRUST_BUNDLE_PATHS {
                if !image_regular_file(rootfs, Path::new(path)) {
                    continue;
                }
                p.push(
                    format!("bind the trust bundle over {path}"),
                    Op::BindReadOnly {
                        src: copy.clone(),
                        target: cp(&r(path))?,
                        flags: libc::MS_NOSUID | libc::MS_NODEV,
                    },
                );
            }
        }
    }
    Ok(())
}

/// Is `path` a regular file of the image, reached without a symlink?
fn image_regular_file(rootfs: &Path, path: &Path) -> bool {
    let mut cur = rootfs.to_path_buf();
    let comps: Vec<_> = path.components().skip(1).collect();
    for (i, comp) in comps.iter().enumerate() {
        cur.push(comp);
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => return false,
            Ok(m) if i + 1 == comps.len() => return m.is_file(),
            Ok(m) if m.is_dir() => {}
            _ => return false,
        }
    }
    false
}

/// A bind destination in an image root must not pass through a symlink
/// of the image: the setup program resolves it before `pivot_root`.
fn check_image_dst(rootfs: &Path, dst: &Path) -> Result<(), JailError> {
    if layout::under_own_dir(dst) {
        // The jail's own directory, not the image's.
        return Ok(());
    }
    let mut cur = rootfs.to_path_buf();
    for comp in dst.components().skip(1) {
        cur.push(comp);
        match std::fs::symlink_metadata(&cur) {
            Ok(m) if m.file_type().is_symlink() => {
                let inside = Path::new("/").join(cur.strip_prefix(rootfs).unwrap_or(&cur));
                return Err(JailError::Spec(format!(
                    "bind destination {} passes through {}, a symlink in the image",
                    dst.display(),
                    inside.display()
                )));
            }
            Ok(m) if m.is_dir() => {}
            // A file, or nothing: the setup goes no further through the
            // image (it fails there, or makes the rest on the tmpfs).
            _ => return Ok(()),
        }
    }
    Ok(())
}

/// `/dev`, `/proc`, `/tmp`, the spec's binds, `pivot_root`, the read-only
/// remount and the working directory.
fn jail_dirs(p: &mut Program, root: &Path, spec: &JailSpec, by: BindBy) -> Result<(), JailError> {
    dev_dir(p, root)?;
    proc_dir(p, root)?;
    tmp_dir(p, root, spec)?;
    trust_bundle(p, root, spec)?;
    for b in &spec.binds {
        tool_bind(p, root, spec, b, by)?;
    }
    for v in &spec.volumes {
        volume(p, root, spec, v, by)?;
    }
    enter_root(p, root, spec)
}

/// `/dev`: five device binds and the fd symlinks.
fn dev_dir(p: &mut Program, root: &Path) -> Result<(), JailError> {
    let r = |rel: &str| -> PathBuf { root.join(rel.trim_start_matches('/')) };
    p.push(
        "mkdir /dev".into(),
        Op::Mkdir {
            path: cp(&r("dev"))?,
            mode: 0o755,
        },
    );
    for dev in ["null", "zero", "full", "random", "urandom"] {
        let target = cp(&r(&format!("dev/{dev}")))?;
        p.push(
            format!("create /dev/{dev}"),
            Op::WriteFile {
                path: target.clone(),
                mode: 0o666,
                contents: Vec::new(),
            },
        );
        p.push(
            format!("bind /dev/{dev}"),
            Op::Mount {
                src: Some(c(format!("/dev/{dev}"))?),
                target,
                fstype: None,
                flags: libc::MS_BIND,
                data: None,
            },
        );
    }
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        p.push(
            format!("symlink /dev/{name}"),
            Op::Symlink {
                target: c(target)?,
                link: cp(&r(&format!("dev/{name}")))?,
            },
        );
    }
    Ok(())
}

/// `/proc` of the new pid namespace, with the OCI masks. Mounted while
/// the host's /proc is still visible (the kernel refuses a new proc in
/// a user namespace otherwise).
fn proc_dir(p: &mut Program, root: &Path) -> Result<(), JailError> {
    let r = |rel: &str| -> PathBuf { root.join(rel.trim_start_matches('/')) };
    p.push(
        "mkdir /proc".into(),
        Op::Mkdir {
            path: cp(&r("proc"))?,
            mode: 0o555,
        },
    );
    p.push(
        "mount /proc".into(),
        Op::Mount {
            src: Some(c("proc")?),
            target: cp(&r("proc"))?,
            fstype: Some(c("proc")?),
            flags: libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            data: None,
        },
    );
    let (files, dirs, empties) = proc_masks();
    for f in files {
        p.push_optional(
            format!("mask /proc/{f}"),
            Op::Mount {
                src: Some(c("/dev/null")?),
                target: cp(&r(&format!("proc/{f}")))?,
                fstype: None,
                flags: libc::MS_BIND,
                data: None,
            },
        );
    }
    for d in dirs {
        let t = cp(&r(&format!("proc/{d}")))?;
        p.push_optional(
            format!("mount /proc/{d} read-only"),
            Op::BindReadOnly {
                src: t.clone(),
                target: t,
                flags: libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
            },
        );
    }
    for d in empties {
        p.push_optional(
            format!("mask /proc/{d}"),
            Op::Mount {
                src: Some(c("tmpfs")?),
                target: cp(&r(&format!("proc/{d}")))?,
                fstype: Some(c("tmpfs")?),
                flags: libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                data: Some(c("size=0,mode=0555")?),
            },
        );
    }
    Ok(())
}

/// `/tmp`: the only writable place, a tmpfs sized by the disk limit.
fn tmp_dir(p: &mut Program, root: &Path, spec: &JailSpec) -> Result<(), JailError> {
    let r = |rel: &str| -> PathBuf { root.join(rel.trim_start_matches('/')) };
    p.push(
        "mkdir /tmp".into(),
        Op::Mkdir {
            path: cp(&r("tmp"))?,
            mode: 0o1777,
        },
    );
    p.push(
        "mount tmpfs on /tmp".into(),
        Op::Mount {
            src: Some(c("tmpfs")?),
            target: cp(&r("tmp"))?,
            fstype: Some(c("tmpfs")?),
            flags: libc::MS_NOSUID | libc::MS_NODEV,
            data: Some(c(format!(
                "mode=1777,size={},nr_inodes={}",
                spec.limits.disk_bytes.max(4096),
                (spec.limits.disk_bytes / 4096).clamp(64, 1 << 20)
            ))?),
        },
    );
    Ok(())
}

/// One of the tool's binds: its destination's parents made, then the
/// source mounted there read-only.
fn tool_bind(
    p: &mut Program,
    root: &Path,
    spec: &JailSpec,
    b: &crate::Bind,
    by: BindBy,
) -> Result<(), JailError> {
    let r = |rel: &str| -> PathBuf { root.join(rel.trim_start_matches('/')) };
    check_dst(&b.dst)?;
    if let Root::Image { rootfs, .. } = &spec.root {
        check_image_dst(rootfs, &b.dst)?;
    }
    let meta = std::fs::metadata(&b.src)
        .map_err(|e| JailError::Spec(format!("bind source {}: {e}", b.src.display())))?;
    let mut cur = PathBuf::from("/");
    let comps: Vec<_> = b.dst.components().skip(1).collect();
    for (i, comp) in comps.iter().enumerate() {
        cur.push(comp);
        let last = i + 1 == comps.len();
        let target = cp(&r(&cur.to_string_lossy()))?;
        if last && !meta.is_dir() {
            p.push(
                format!("create {}", cur.display()),
                Op::WriteFile {
                    path: target,
                    mode: 0o644,
                    contents: Vec::new(),
                },
            );
        } else {
            p.push(
                format!("mkdir {}", cur.display()),
                Op::Mkdir {
                    path: target,
                    mode: 0o755,
                },
            );
        }
    }
    let target = cp(&r(&b.dst.to_string_lossy()))?;
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    if let Some((tree, slot)) = tree_of(p, &b.src, by) {
        p.push(
            format!("attach {} on {}", b.src.display(), b.dst.display()),
            Op::AttachTree {
                tree,
                slot,
                target: target.clone(),
            },
        );
        p.push(
            format!("make {} read-only", b.dst.display()),
            Op::SetReadOnly { target, flags },
        );
        return Ok(());
    }
    p.push(
        format!("mount {} on {} read-only", b.src.display(), b.dst.display()),
        Op::BindReadOnly {
            src: cp(&b.src)?,
            target,
            flags,
        },
    );
    Ok(())
}

/// A detached clone of `src`'s mount tree and its slot, when binds go by
/// tree, the kernel allows it here and the plan has a slot left; `None`:
/// bind the path.
fn tree_of(p: &mut Program, src: &Path, by: BindBy) -> Option<(std::os::fd::OwnedFd, u32)> {
    if by == BindBy::Path || p.trees >= cordon_sys::spawn::MAX_TREES {
        return None;
    }
    let tree = cordon_sys::mount::clone_tree(src).ok()?;
    p.trees += 1;
    Some((tree, p.trees - 1))
}

/// One volume: mounted read-write, never setuid or device files.
fn volume(
    p: &mut Program,
    root: &Path,
    spec: &JailSpec,
    v: &crate::Bind,
    by: BindBy,
) -> Result<(), JailError> {
    let r = |rel: &str| -> PathBuf { root.join(rel.trim_start_matches('/')) };
    check_dst(&v.dst)?;
    if let Root::Image { rootfs, .. } = &spec.root {
        check_image_dst(rootfs, &v.dst)?;
    }
    if spec.binds.iter().any(|b| b.dst == v.dst) {
        return Err(JailError::Spec(format!(
            "volume {} is also a bind destination",
            v.dst.display()
        )));
    }
    let mut cur = PathBuf::from("/");
    for comp in v.dst.components().skip(1) {
        cur.push(comp);
        p.push(
            format!("mkdir {}", cur.display()),
            Op::Mkdir {
                path: cp(&r(&cur.to_string_lossy()))?,
                mode: 0o755,
            },
        );
    }
    let target = cp(&r(&v.dst.to_string_lossy()))?;
    let name = format!(
        "mount {} on {} read-write",
        v.src.display(),
        v.dst.display()
    );
    match tree_of(p, &v.src, by) {
        Some((tree, slot)) => p.push(
            name,
            Op::AttachTree {
                tree,
                slot,
                target: target.clone(),
            },
        ),
        None => p.push(
            name,
            Op::Mount {
                src: Some(cp(&v.src)?),
                target: target.clone(),
                fstype: None,
                flags: libc::MS_BIND,
                data: None,
            },
        ),
    }
    p.push(
        format!("remount {} nosuid, nodev", v.dst.display()),
        Op::Remount {
            target,
            flags: libc::MS_NOSUID | libc::MS_NODEV,
        },
    );
    Ok(())
}

/// `pivot_root` into the new root, `/` remounted read-only, and the
/// working directory.
fn enter_root(p: &mut Program, root: &Path, spec: &JailSpec) -> Result<(), JailError> {
    p.push(
        "pivot_root into the new root".into(),
        Op::PivotRoot {
            new_root: cp(root)?,
        },
    );
    p.push(
        "remount / read-only".into(),
        Op::Remount {
            target: c("/")?,
            flags: libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV,
        },
    );
    let cwd = spec.cwd.as_deref().unwrap_or(Path::new("/tmp"));
    if !cwd.is_absolute() {
        return Err(JailError::Spec(format!(
            "working directory {} is not an absolute path",
            cwd.display()
        )));
    }
    p.push(
        format!("chdir {}", cwd.display()),
        Op::Chdir { path: cp(cwd)? },
    );
    Ok(())
}

/// Landlock: read+execute everywhere, write under /tmp and each volume,
/// device files under /dev; TCP bind/connect refused without doors; abstract unix
/// sockets and signals scoped to the sandbox. The rules name paths of the
/// new root, which has `/tmp` and `/dev` of the jail's own whatever the
/// root is made of, so they hold for an image root as for the host's.
pub fn landlock(
    kernel_abi: i32,
    doors: bool,
    volumes: &[crate::Bind],
) -> Result<(Option<LandlockPlan>, LandlockStatus), JailError> {
    if kernel_abi <= 0 {
        return Ok((None, LandlockStatus::NotEnforced));
    }
    let kabi = ABI::from(kernel_abi);
    let abi = if kabi < LANDLOCK_TARGET {
        kabi
    } else {
        LANDLOCK_TARGET
    };
    let status = if kabi >= LANDLOCK_TARGET {
        LandlockStatus::FullyEnforced
    } else {
        LandlockStatus::PartiallyEnforced
    };
    let all: BitFlags<AccessFs> = AccessFs::from_all(abi);
    let read: BitFlags<AccessFs> = AccessFs::from_read(abi);
    let dev: BitFlags<AccessFs> = all
        & (AccessFs::ReadFile
            | AccessFs::WriteFile
            | AccessFs::ReadDir
            | AccessFs::Truncate
            | AccessFs::IoctlDev);
    let handled_net = if abi >= ABI::V4 && !doors {
        AccessNet::from_all(abi).bits()
    } else {
        0
    };
    let scoped = if abi >= ABI::V6 {
        Scope::from_all(abi).bits()
    } else {
        0
    };
    let attr_size = if abi >= ABI::V6 {
        24
    } else if abi >= ABI::V4 {
        16
    } else {
        8
    };
    let mut rules = vec![
        (c"/".to_owned(), read.bits()),
        (c"/tmp".to_owned(), all.bits()),
        (c"/dev".to_owned(), dev.bits()),
    ];
    for v in volumes {
        rules.push((cp(&v.dst)?, all.bits()));
    }
    Ok((
        Some(LandlockPlan {
            handled_fs: all.bits(),
            handled_net,
            scoped,
            attr_size,
            rules,
        }),
        status,
    ))
}

/// The `PATH` a bare argv[0] is looked up in: the spec environment's, or
/// `/usr/local/bin:/usr/bin:/bin`.
pub fn search_path(spec: &JailSpec) -> &str {
    cordon_sandbox::exec::search_path(&spec.env, "/usr/local/bin:/usr/bin:/bin")
}

pub use cordon_sandbox::exec::path_candidates;

/// Exec candidates for argv[0].
pub fn exec_paths(spec: &JailSpec) -> Result<Vec<CString>, JailError> {
    let Some(arg0) = spec.argv.first() else {
        return Err(JailError::Spec("argv is empty".into()));
    };
    if arg0.is_empty() {
        return Err(JailError::Spec("argv[0] is empty".into()));
    }
    if arg0.contains('/') {
        if !arg0.starts_with('/') {
            return Err(JailError::Spec(format!(
                "argv[0] {arg0:?} must be absolute or a bare name"
            )));
        }
        return Ok(vec![c(arg0)?]);
    }
    let out = path_candidates(search_path(spec), arg0)
        .into_iter()
        .map(c)
        .collect::<Result<Vec<_>, _>>()?;
    if out.is_empty() {
        return Err(JailError::Spec(format!(
            "no absolute PATH entry to look up {arg0:?}"
        )));
    }
    Ok(out)
}

fn sockaddr(a: &SocketAddr) -> (libc::c_int, Vec<u8>) {
    match a {
        SocketAddr::V4(v4) => {
            let mut b = Vec::with_capacity(16);
            b.extend_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            b.extend_from_slice(&v4.port().to_be_bytes());
            b.extend_from_slice(&v4.ip().octets());
            b.extend_from_slice(&[0u8; 8]);
            (libc::AF_INET, b)
        }
        SocketAddr::V6(v6) => {
            let mut b = Vec::with_capacity(28);
            b.extend_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            b.extend_from_slice(&v6.port().to_be_bytes());
            b.extend_from_slice(&v6.flowinfo().to_be_bytes());
            b.extend_from_slice(&v6.ip().octets());
            b.extend_from_slice(&v6.scope_id().to_ne_bytes());
            (libc::AF_INET6, b)
        }
    }
}

/// One RTM_NEWADDR request adding `ip/prefix` to `lo` (ifindex 1 in a new
/// network namespace).
pub fn newaddr_message(ip: IpAddr, prefix: u8, seq: u32) -> Vec<u8> {
    cordon_sys::net::newaddr_message(ip, prefix, seq)
}

/// The child's doors program.
pub fn doors(req: &DoorRequest) -> Result<DoorsPlan, JailError> {
    let mut addr_messages = Vec::new();
    for (i, (ip, prefix)) in req.local_cidrs.iter().enumerate() {
        let max = if ip.is_ipv4() { 32 } else { 128 };
        if *prefix > max {
            return Err(JailError::Spec(format!(
                "door address {ip}/{prefix}: prefix too long"
            )));
        }
        addr_messages.push(newaddr_message(*ip, *prefix, i as u32 + 1));
    }
    let mut sockets = Vec::new();
    for a in &req.tcp {
        let (fam, b) = sockaddr(a);
        sockets.push((fam, libc::SOCK_STREAM, b));
    }
    for a in &req.udp {
        let (fam, b) = sockaddr(a);
        sockets.push((fam, libc::SOCK_DGRAM, b));
    }
    Ok(DoorsPlan {
        addr_messages,
        sockets,
        route_socket: req.local_addresses,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destinations() {
        assert!(check_dst(Path::new("/opt/tools")).is_ok());
        assert!(check_dst(Path::new("/etc/ssl")).is_ok());
        assert!(check_dst(Path::new("relative")).is_err());
        assert!(check_dst(Path::new("/")).is_err());
        assert!(check_dst(Path::new("/tmp")).is_err());
        assert!(check_dst(Path::new("/proc/x")).is_err());
        assert!(check_dst(Path::new("/opt/../etc")).is_err());
    }

    #[test]
    fn a_trust_bundle_goes_where_each_root_looks() {
        use std::os::unix::fs::symlink;
        let names = |spec: &JailSpec| -> Vec<String> {
            program(Path::new("/root-mp"), &[], spec, 0, 0)
                .unwrap()
                .names
                .into_iter()
                .filter(|n| n.contains("ssl") || n.contains("pki") || n.contains("bundle"))
                .collect()
        };
        // Positive control: without a bundle, nothing of the kind.
        let mut spec = JailSpec::new("t", ["/bin/sh"]);
        assert!(names(&spec).is_empty());
        assert_eq!(spec.trust_bundle_path(), None);
        spec.trust_bundle = Some(b"-----BEGIN CERTIFICATE-----\n".to_vec());
        assert_eq!(spec.trust_bundle_path(), Some(crate::TRUST_BUNDLE));
        assert_eq!(
            names(&spec),
            [
                "mkdir /etc/ssl",
                "mkdir /etc/ssl/certs",
                "mkdir /etc/pki",
                "mkdir /etc/pki/tls",
                "mkdir /etc/pki/tls/certs",
                "write /etc/ssl/certs/ca-certificates.crt",
                "symlink /etc/pki/tls/certs/ca-bundle.crt",
                "symlink /etc/ssl/cert.pem",
            ]
        );
        // An image: the bundle is bound over the files the image has,
        // never through a symlink, and the image is not written.
        let d = tempfile::tempdir().unwrap();
        let img = d.path();
        std::fs::create_dir_all(img.join("etc/ssl/certs")).unwrap();
        std::fs::write(img.join("etc/ssl/certs/ca-certificates.crt"), "").unwrap();
        symlink("certs/ca-certificates.crt", img.join("etc/ssl/cert.pem")).unwrap();
        spec.root = Root::Image {
            rootfs: img.to_path_buf(),
            digest: String::new(),
        };
        assert_eq!(spec.trust_bundle_path(), Some(crate::TRUST_BUNDLE_IMAGE));
        assert_eq!(
            names(&spec),
            [
                "write /dev/cordon-ca-bundle.crt",
                "bind the trust bundle over /etc/ssl/certs/ca-certificates.crt",
            ]
        );
    }

    #[test]
    fn image_root_mirrors_the_top_level() {
        use std::os::unix::fs::symlink;
        let d = tempfile::tempdir().unwrap();
        let img = d.path();
        std::fs::create_dir_all(img.join("usr/bin")).unwrap();
        std::fs::create_dir(img.join("etc")).unwrap();
        std::fs::create_dir(img.join("tmp")).unwrap();
        std::fs::write(img.join("proc"), "").unwrap();
        std::fs::write(img.join(".dockerenv"), "").unwrap();
        symlink("usr/bin", img.join("bin")).unwrap();
        symlink("/usr/lib", img.join("lib")).unwrap();
        let mut spec = JailSpec::new("t", ["/bin/sh"]);
        spec.root = Root::Image {
            rootfs: img.to_path_buf(),
            digest: String::new(),
        };
        spec.cwd = Some("/usr".into());
        let p = program(Path::new("/root-mp"), &[], &spec, 0, 0).unwrap();
        let image: Vec<&str> = p
            .names
            .iter()
            .map(String::as_str)
            .skip_while(|n| *n != "mount tmpfs on the new root")
            .skip(1)
            .take_while(|n| *n != "mkdir /dev")
            .collect();
        assert_eq!(
            image,
            [
                "create /.dockerenv",
                "mount the image's /.dockerenv read-only",
                "symlink /bin",
                "mkdir /etc",
                "mount the image's /etc read-only",
                "symlink /lib",
                "mkdir /usr",
                "mount the image's /usr read-only",
            ]
        );
        // The image's own /etc; no host directory; the jail's /tmp and /proc.
        assert!(!p.names.iter().any(|n| n.starts_with("write /etc")));
        assert!(!p.names.iter().any(|n| n == "mount /usr read-only"));
        assert!(p.names.iter().any(|n| n == "mount tmpfs on /tmp"));
        assert!(p.names.iter().any(|n| n == "mount /proc"));
        assert_eq!(p.names.last().map(String::as_str), Some("chdir /usr"));
        // Symlinks are made again, never followed on the host.
        let link = p.steps.iter().find_map(|s| match &s.op {
            Op::Symlink { target, link } if link.as_bytes() == b"/root-mp/lib" => Some(target),
            _ => None,
        });
        assert_eq!(link.map(|t| t.as_bytes()), Some(&b"/usr/lib"[..]));
        // A bind through a symlink of the image is refused; one into the
        // jail's /tmp or a new directory is fine.
        for (dst, ok) in [
            ("/lib/x", false),
            ("/bin/tool", false),
            ("/usr/bin/tool", true),
            ("/tmp/x/y", true),
            ("/.cordon/agent", true),
        ] {
            let mut spec = spec.clone();
            spec.binds.push(crate::Bind {
                src: img.join("etc"),
                dst: dst.into(),
            });
            let r = program(Path::new("/root-mp"), &[], &spec, 0, 0);
            assert_eq!(r.is_ok(), ok, "{dst}");
        }
        spec.cwd = Some("relative".into());
        assert!(program(Path::new("/root-mp"), &[], &spec, 0, 0).is_err());
    }

    #[test]
    fn netlink_message_layout() {
        let m = newaddr_message("198.18.0.0".parse().unwrap(), 15, 1);
        // 16 header + 8 ifaddrmsg + 2 * (4 + 4) attributes.
        assert_eq!(m.len(), 40);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()), 40);
        assert_eq!(m[16], libc::AF_INET as u8);
        assert_eq!(m[17], 15);
        assert_eq!(&m[28..32], &[198, 18, 0, 0]);
    }

    #[test]
    fn landlock_masks() {
        let (plan, status) = landlock(7, false, &[]).unwrap();
        let plan = plan.unwrap();
        assert_eq!(status, LandlockStatus::FullyEnforced);
        assert_ne!(plan.handled_net, 0);
        assert_eq!(plan.attr_size, 24);
        let (plan, status) = landlock(3, true, &[]).unwrap();
        assert_eq!(status, LandlockStatus::PartiallyEnforced);
        assert_eq!(plan.unwrap().attr_size, 8);
        assert_eq!(
            landlock(0, false, &[]).unwrap().1,
            LandlockStatus::NotEnforced
        );
    }

    #[test]
    fn a_volume_is_bound_read_write_and_writable_under_landlock() {
        let vol = crate::Bind {
            src: "/run/cordon/workspaces/t/abc".into(),
            dst: "/work/session".into(),
        };
        let mut spec = JailSpec::new("t", ["/bin/sh"]);
        let names = |spec: &JailSpec| -> Vec<String> {
            program(Path::new("/root-mp"), &[], spec, 0, 0)
                .unwrap()
                .names
                .into_iter()
                .filter(|n| n.contains("/work"))
                .collect()
        };
        // Positive control: no volume, nothing at /work.
        assert!(names(&spec).is_empty());
        spec.volumes.push(vol.clone());
        assert_eq!(
            names(&spec),
            [
                "mkdir /work",
                "mkdir /work/session",
                "mount /run/cordon/workspaces/t/abc on /work/session read-write",
                "remount /work/session nosuid, nodev",
            ]
        );
        // Never over a directory the jail builds, nor over a bind.
        let mut bad = spec.clone();
        bad.volumes[0].dst = "/tmp".into();
        assert!(program(Path::new("/root-mp"), &[], &bad, 0, 0).is_err());
        let mut bad = spec.clone();
        bad.binds.push(crate::Bind {
            src: "/usr".into(),
            dst: "/work/session".into(),
        });
        assert!(program(Path::new("/root-mp"), &[], &bad, 0, 0).is_err());
        // Landlock: every right at the volume, as at /tmp.
        let (plan, _) = landlock(7, false, std::slice::from_ref(&vol)).unwrap();
        let rules = plan.unwrap().rules;
        let tmp = rules
            .iter()
            .find(|(p, _)| p.as_bytes() == b"/tmp")
            .unwrap()
            .1;
        assert!(
            rules
                .iter()
                .any(|(p, a)| p.as_bytes() == b"/work/session" && *a == tmp),
            "{rules:?}"
        );
        let (plan, _) = landlock(7, false, &[]).unwrap();
        assert!(
            !plan
                .unwrap()
                .rules
                .iter()
                .any(|(p, _)| p.as_bytes() == b"/work/session")
        );
    }
}
