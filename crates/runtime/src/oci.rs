//! An OCI bundle (`config.json` and its root directory) built from the
//! neutral [`SandboxSpec`], for runtimes that take one (gVisor's `runsc`).
//!
//! The bundle's root is a fresh empty directory of cordon's own, never an
//! image's rootfs: the OCI runtime creates mount points in it, which must
//! not touch the image store. What the sandbox sees at `/` is read-only
//! binds into it: the host's system directories (with `/etc` written by
//! cordon) or each top-level entry of an unpacked image's rootfs, its
//! top-level symlinks made again; then the spec's mounts, read-only; a
//! fresh `/proc`, an empty read-only `/sys`, and `/tmp` and `/dev/shm` as
//! tmpfs of `disk_bytes` each. The process gets
//! the spec's environment, user (1000:1000 by default), working directory
//! (`/tmp` by default) and rlimits, no capabilities and no new privileges.
//!
//! **Tasks.** The spec's `tasks` is the process's `RLIMIT_NPROC`, which
//! gVisor's Sentry enforces on every task it creates for the tool (threads
//! included, counted per uid across the application kernel, where only the
//! tool runs): the tool's own tasks, whatever gVisor's own host threads
//! number. `linux.resources.pids` is not written: with `--ignore-cgroups`
//! `runsc` ignores it, and without it `runsc` would make it the host pids
//! cgroup of the whole sandbox, gVisor's threads included. The host-side
//! bound is the supervisor's cgroup slot (see `crate::gvisor`). The Sentry
//! exempts a task with `CAP_SYS_ADMIN` or `CAP_SYS_RESOURCE` in its own
//! user namespace, so the filter refuses `clone(2)` with namespace flags
//! as the jail's does; `clone3(2)`, whose flags the filter cannot see and
//! which glibc needs for threads, stays: a tool that makes a user
//! namespace with it escapes `RLIMIT_NPROC` and meets the host bound.
//!
//! **Devices.** gVisor's `/dev` always carries its own `/dev/fuse`, and
//! `/dev/net/tun` when its network stack is used (`--network=none`), which
//! no `runsc` flag of the releases cordon runs removes. The bundle puts an
//! empty read-only tmpfs over `/dev/net` and an empty mode-0000 file of its
//! own, bound read-only, over `/dev/fuse` (the tool has no capability to
//! override its mode); the filter refuses `mknod(2)`/`mknodat(2)` of
//! character and block devices, since the Sentry of these releases checks
//! no `CAP_MKNOD` and ignores `nodev` (a node made in `/tmp` would open the
//! device); and `mount(2)` (a fresh `devtmpfs`) is refused already.

use std::collections::HashSet;
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};

use cordon_sandbox::layout::{
    self, HOST_ETC, HOST_TRUST_STORE, ImageEntryKind, SystemDir, USR, etc_files,
};
use oci_spec::runtime::{
    Linux, LinuxBuilder, LinuxCapabilitiesBuilder, LinuxMemoryBuilder, LinuxNamespaceBuilder,
    LinuxNamespaceType, LinuxResourcesBuilder, LinuxSeccomp, LinuxSeccompAction,
    LinuxSeccompArgBuilder, LinuxSeccompBuilder, LinuxSeccompOperator, LinuxSyscall,
    LinuxSyscallBuilder, Mount, MountBuilder, PosixRlimitBuilder, PosixRlimitType, Process,
    ProcessBuilder, RootBuilder, Spec, SpecBuilder, UserBuilder,
};

use crate::spec::{Limits, Root, SandboxSpec, Seccomp};

/// Default uid and gid of the sandbox's process.
pub use cordon_sandbox::layout::DEFAULT_USER;

/// The bundle's empty mode-0000 file bound over `/dev/fuse`.
const NO_DEVICE: &str = "no-device";

/// How the bundle's network is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Net {
    /// A network namespace of the OCI runtime's own (`--network=none`).
    Own,
    /// The namespace the runtime runs in (`--network=host`): no network
    /// namespace in `config.json`.
    Inherit,
}

/// Write a bundle for `spec` into `dir` (which must exist and be empty):
/// `config.json`, `rootfs/` and, for a host root, `etc/`. `env` is the
/// complete environment of the process. `trust_bundle` is made the
/// sandbox's system trust as the jail makes it: for a host root, written
/// at `/etc/ssl/certs/ca-certificates.crt` (the host's `/etc/ssl` is then
/// not bound) with the other usual paths linked to it; for an image root,
/// written into the bundle directory and bound at
/// `/dev/cordon-ca-bundle.crt` and over each usual path the image has as a
/// regular file.
pub fn write_bundle(
    dir: &Path,
    spec: &SandboxSpec,
    env: &[(String, String)],
    trust_bundle: Option<&[u8]>,
    system_dirs: &[SystemDir],
    net: Net,
) -> Result<(), String> {
    let io = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    let rootfs = dir.join("rootfs");
    fs::create_dir(&rootfs).map_err(|e| io("create", &rootfs, e))?;
    fs::set_permissions(&rootfs, fs::Permissions::from_mode(0o755))
        .map_err(|e| io("chmod", &rootfs, e))?;
    let (uid, gid) = spec.user.unwrap_or(DEFAULT_USER);
    let mut binds: Vec<(PathBuf, PathBuf)> = Vec::new();
    match &spec.root {
        Root::HostBinds => {
            binds.push((USR.into(), USR.into()));
            for d in system_dirs {
                let rel = d.path.strip_prefix("/").unwrap_or(&d.path);
                match &d.symlink {
                    Some(target) => {
                        let link = rootfs.join(rel);
                        symlink(target, &link).map_err(|e| io("symlink", &link, e))?;
                    }
                    None => binds.push((d.path.clone(), d.path.clone())),
                }
            }
            let etc = dir.join("etc");
            fs::create_dir(&etc).map_err(|e| io("create", &etc, e))?;
            fs::set_permissions(&etc, fs::Permissions::from_mode(0o755))
                .map_err(|e| io("chmod", &etc, e))?;
            for (name, content) in etc_files(uid, gid) {
                let p = etc.join(name);
                fs::write(&p, content).map_err(|e| io("write", &p, e))?;
                fs::set_permissions(&p, fs::Permissions::from_mode(0o644))
                    .map_err(|e| io("chmod", &p, e))?;
            }
            // The host's entries of the layout, and its trust store unless
            // this bundle writes a trust bundle of its own.
            let host_etc: Vec<_> = HOST_ETC
                .into_iter()
                .chain(trust_bundle.is_none().then_some(HOST_TRUST_STORE))
                .filter(|e| e.on_host())
                .collect();
            for e in host_etc.iter().filter(|e| e.dir) {
                let p = etc.join(e.name);
                fs::create_dir(&p).map_err(|e| io("create", &p, e))?;
            }
            if let Some(bundle) = trust_bundle {
                write_trust_bundle(&etc, bundle)?;
            }
            binds.push((etc.clone(), "/etc".into()));
            for e in &host_etc {
                if !e.dir {
                    let p = etc.join(e.name);
                    fs::write(&p, b"").map_err(|e| io("write", &p, e))?;
                }
                binds.push((e.path(), e.path()));
            }
        }
        Root::Image { rootfs: image, .. } => {
            for entry in layout::image_entries(image).map_err(|e| e.to_string())? {
                match &entry.kind {
                    ImageEntryKind::Symlink(target) => {
                        let link = rootfs.join(&entry.name);
                        symlink(target, &link).map_err(|e| io("symlink", &link, e))?;
                    }
                    ImageEntryKind::Dir | ImageEntryKind::File => {
                        binds.push((entry.src(image), Path::new("/").join(&entry.name)));
                    }
                }
            }
            if let Some(bundle) = trust_bundle {
                let p = dir.join("ca-bundle.crt");
                fs::write(&p, bundle).map_err(|e| io("write", &p, e))?;
                fs::set_permissions(&p, fs::Permissions::from_mode(0o644))
                    .map_err(|e| io("chmod", &p, e))?;
                binds.push((p.clone(), cordon_jail::TRUST_BUNDLE_IMAGE.into()));
                for path in cordon_jail::TRUST_BUNDLE_PATHS {
                    if image_regular_file(image, Path::new(path)) {
                        binds.push((p.clone(), path.into()));
                    }
                }
            }
        }
    }
    // Over gVisor's own /dev/fuse: a file nobody in the sandbox may open.
    let nodev = dir.join(NO_DEVICE);
    fs::write(&nodev, b"").map_err(|e| io("write", &nodev, e))?;
    fs::set_permissions(&nodev, fs::Permissions::from_mode(0o000))
        .map_err(|e| io("chmod", &nodev, e))?;
    binds.push((nodev, "/dev/fuse".into()));
    for m in &spec.mounts {
        check_dst(&m.dst)?;
        if m.writable {
            return Err(format!(
                "mount {}:{}:rw: the gvisor runtime binds host paths read-only only",
                m.src.display(),
                m.dst.display()
            ));
        }
        binds.push((m.src.clone(), m.dst.clone()));
    }
    let config = config(spec, env, &binds, net)?;
    let path = dir.join("config.json");
    config
        .save(&path)
        .map_err(|e| format!("write {}: {e}", path.display()))?;
    Ok(())
}

/// A host root's trust bundle in the `/etc` written for it (`etc`), where
/// the jail writes it, the other usual paths linked to it.
fn write_trust_bundle(etc: &Path, bundle: &[u8]) -> Result<(), String> {
    let io = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    let r = |abs: &str| etc.join(abs.trim_start_matches("/etc/"));
    for d in ["ssl", "ssl/certs", "pki", "pki/tls", "pki/tls/certs"] {
        let p = etc.join(d);
        fs::create_dir(&p).map_err(|e| io("create", &p, e))?;
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755))
            .map_err(|e| io("chmod", &p, e))?;
    }
    let file = r(cordon_jail::TRUST_BUNDLE);
    fs::write(&file, bundle).map_err(|e| io("write", &file, e))?;
    fs::set_permissions(&file, fs::Permissions::from_mode(0o644))
        .map_err(|e| io("chmod", &file, e))?;
    for link in &cordon_jail::TRUST_BUNDLE_PATHS[1..] {
        let l = r(link);
        symlink(cordon_jail::TRUST_BUNDLE, &l).map_err(|e| io("symlink", &l, e))?;
    }
    Ok(())
}

/// Whether `path` (absolute, in the sandbox) is a regular file of the
/// image at `root`, reached without a symlink.
pub(crate) fn image_regular_file(root: &Path, path: &Path) -> bool {
    let mut p = root.to_path_buf();
    let mut comps = path
        .components()
        .filter(|c| matches!(c, Component::Normal(_)));
    let Some(last) = comps.next_back() else {
        return false;
    };
    for c in comps {
        p.push(c);
        if !fs::symlink_metadata(&p).is_ok_and(|m| m.is_dir()) {
            return false;
        }
    }
    p.push(last);
    fs::symlink_metadata(&p).is_ok_and(|m| m.is_file())
}

/// Why a bundle for `spec` could not be written, whatever the host: a
/// mount destination that is not a plain absolute path or is the
/// sandbox's own, an environment variable `config.json` cannot carry (for
/// admission, which otherwise would let them through to the first call).
pub fn problems(spec: &SandboxSpec) -> Vec<String> {
    let mut out: Vec<String> = spec
        .mounts
        .iter()
        .filter_map(|m| check_dst(&m.dst).err())
        .collect();
    out.extend(spec.env.iter().filter_map(|(k, v)| env_entry(k, v).err()));
    out
}

/// `KEY=value` for `config.json`.
fn env_entry(k: &str, v: &str) -> Result<String, String> {
    if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
        Err(format!("bad environment variable {k:?}"))
    } else {
        Ok(format!("{k}={v}"))
    }
}

/// A destination inside the sandbox: absolute, normal components only.
fn check_dst(dst: &Path) -> Result<(), String> {
    if !dst.is_absolute()
        || dst
            .components()
            .any(|c| matches!(c, Component::ParentDir | Component::CurDir))
    {
        return Err(format!(
            "mount destination {} is not a plain absolute path",
            dst.display()
        ));
    }
    if layout::under_own_dir(dst) && dst.components().count() == 2 {
        return Err(format!(
            "mount destination {} is the sandbox's own",
            dst.display()
        ));
    }
    Ok(())
}

fn bind(src: &Path, dst: &Path) -> Result<Mount, String> {
    MountBuilder::default()
        .destination(dst)
        .typ("bind")
        .source(src)
        .options(
            ["rbind", "ro", "nosuid", "nodev"]
                .map(String::from)
                .to_vec(),
        )
        .build()
        .map_err(|e| format!("mount {}: {e}", dst.display()))
}

/// The `config.json` of a bundle whose root directory is `rootfs` (relative
/// to the bundle) with these read-only binds `(host, sandbox)`.
pub fn config(
    spec: &SandboxSpec,
    env: &[(String, String)],
    binds: &[(PathBuf, PathBuf)],
    net: Net,
) -> Result<Spec, String> {
    let process = process(spec, env)?;
    let mounts = mounts(&spec.limits, binds)?;
    let linux = linux(spec, net)?;
    SpecBuilder::default()
        .version("1.0.2")
        .hostname("cordon")
        .root(
            RootBuilder::default()
                .path("rootfs")
                .readonly(true)
                .build()
                .map_err(oci_err("root"))?,
        )
        .process(process)
        .mounts(mounts)
        .linux(linux)
        .build()
        .map_err(oci_err("spec"))
}

/// The message of an error building the OCI `what`.
fn oci_err(what: &'static str) -> impl Fn(oci_spec::OciSpecError) -> String {
    move |err| format!("OCI {what}: {err}")
}

/// The process: the spec's program, environment, user and working directory, its rlimits,
/// no capabilities and no new privileges.
fn process(spec: &SandboxSpec, env: &[(String, String)]) -> Result<Process, String> {
    let (uid, gid) = spec.user.unwrap_or(DEFAULT_USER);
    let l = &spec.limits;
    let rlimit = |typ: PosixRlimitType, v: u64| {
        PosixRlimitBuilder::default()
            .typ(typ)
            .soft(v)
            .hard(v)
            .build()
            .map_err(oci_err("rlimit"))
    };
    let none: HashSet<oci_spec::runtime::Capability> = HashSet::new();
    ProcessBuilder::default()
        .terminal(false)
        .user(
            UserBuilder::default()
                .uid(uid)
                .gid(gid)
                .build()
                .map_err(oci_err("user"))?,
        )
        .args(spec.argv.clone())
        .env(
            env.iter()
                .map(|(k, v)| env_entry(k, v))
                .collect::<Result<Vec<_>, _>>()?,
        )
        .cwd(spec.cwd.clone().unwrap_or_else(|| "/tmp".into()))
        .capabilities(
            LinuxCapabilitiesBuilder::default()
                .bounding(none.clone())
                .effective(none.clone())
                .inheritable(none.clone())
                .permitted(none.clone())
                .ambient(none)
                .build()
                .map_err(oci_err("capabilities"))?,
        )
        .rlimits(vec![
            rlimit(PosixRlimitType::RlimitNofile, l.nofile)?,
            // A page over the tmpfs size, so filling /tmp ends in ENOSPC.
            rlimit(
                PosixRlimitType::RlimitFsize,
                l.disk_bytes.saturating_add(4096),
            )?,
            rlimit(PosixRlimitType::RlimitCore, 0)?,
            // The tool's own tasks, counted and refused by the Sentry.
            rlimit(PosixRlimitType::RlimitNproc, l.tasks)?,
        ])
        .no_new_privileges(true)
        .build()
        .map_err(oci_err("process"))
}

/// The mounts: a fresh `/proc`, `/tmp` and `/dev/shm` as tmpfs of `disk_bytes`, an empty
/// read-only `/sys` and `/dev/net`, then the read-only binds `(host, sandbox)`.
fn mounts(l: &Limits, binds: &[(PathBuf, PathBuf)]) -> Result<Vec<Mount>, String> {
    let mut mounts = vec![
        MountBuilder::default()
            .destination("/proc")
            .typ("proc")
            .source("proc")
            .options(["nosuid", "noexec", "nodev"].map(String::from).to_vec())
            .build()
            .map_err(oci_err("mount /proc"))?,
        MountBuilder::default()
            .destination("/tmp")
            .typ("tmpfs")
            .source("tmpfs")
            .options(vec![
                "nosuid".into(),
                "nodev".into(),
                "mode=1777".into(),
                format!("size={}", l.disk_bytes.max(4096)),
            ])
            .build()
            .map_err(oci_err("mount /tmp"))?,
        // No /sys: an empty read-only directory over gVisor's own.
        MountBuilder::default()
            .destination("/sys")
            .typ("tmpfs")
            .source("tmpfs")
            .options(
                ["ro", "nosuid", "nodev", "noexec", "size=4k"]
                    .map(String::from)
                    .to_vec(),
            )
            .build()
            .map_err(oci_err("mount /sys"))?,
        // Shared memory (a browser's renderers need it), as small.
        MountBuilder::default()
            .destination("/dev/shm")
            .typ("tmpfs")
            .source("shm")
            .options(vec![
                "nosuid".into(),
                "nodev".into(),
                "noexec".into(),
                "mode=1777".into(),
                format!("size={}", l.disk_bytes.max(4096)),
            ])
            .build()
            .map_err(oci_err("mount /dev/shm"))?,
        // No /dev/net/tun: an empty read-only directory over gVisor's.
        MountBuilder::default()
            .destination("/dev/net")
            .typ("tmpfs")
            .source("tmpfs")
            .options(
                ["ro", "nosuid", "nodev", "noexec", "mode=0755", "size=4k"]
                    .map(String::from)
                    .to_vec(),
            )
            .build()
            .map_err(oci_err("mount /dev/net"))?,
    ];
    for (src, dst) in binds {
        mounts.push(bind(src, dst)?);
    }
    Ok(mounts)
}

/// The Linux part: the namespaces (a network one for [`Net::Own`]), the memory limit
/// (the task limit is the process's `RLIMIT_NPROC`, see the module's notes), and cordon's
/// system-call filter.
fn linux(spec: &SandboxSpec, net: Net) -> Result<Linux, String> {
    let l = &spec.limits;
    let mut namespaces = vec![
        LinuxNamespaceType::Pid,
        LinuxNamespaceType::Mount,
        LinuxNamespaceType::Ipc,
        LinuxNamespaceType::Uts,
    ];
    if net == Net::Own {
        namespaces.push(LinuxNamespaceType::Network);
    }
    LinuxBuilder::default()
        .namespaces(
            namespaces
                .into_iter()
                .map(|t| LinuxNamespaceBuilder::default().typ(t).build())
                .collect::<Result<Vec<_>, _>>()
                .map_err(oci_err("namespace"))?,
        )
        .resources(
            LinuxResourcesBuilder::default()
                .memory(
                    LinuxMemoryBuilder::default()
                        .limit(i64::try_from(l.memory_bytes).unwrap_or(i64::MAX))
                        .build()
                        .map_err(oci_err("memory"))?,
                )
                .build()
                .map_err(oci_err("resources"))?,
        )
        .seccomp(seccomp(&spec.seccomp)?)
        .build()
        .map_err(oci_err("linux"))
}

/// `S_IFMT` and the device types of a `mknod(2)` mode.
const S_IFMT: u64 = 0o170000;
const S_IFCHR: u64 = 0o020000;
const S_IFBLK: u64 = 0o060000;

/// What the filter refuses (`EPERM`) by argument, in either mode, before
/// its allow rules: `mknod`/`mknodat` of a character or block device
/// (the mode is argument 1 of one, 2 of the other), and `clone` with any
/// namespace flag (as the jail's filter does).
fn refused_by_argument() -> Result<Vec<LinuxSyscall>, String> {
    let e = |err: oci_spec::OciSpecError| format!("OCI seccomp: {err}");
    let masked = |index: usize, mask: u64, value: u64| {
        LinuxSeccompArgBuilder::default()
            .index(index)
            .value(mask)
            .value_two(value)
            .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
            .build()
            .map_err(e)
    };
    let refuse = |name: &str, arg| {
        LinuxSyscallBuilder::default()
            .names(vec![name.to_string()])
            .action(LinuxSeccompAction::ScmpActErrno)
            .errno_ret(1u32)
            .args(vec![arg])
            .build()
            .map_err(e)
    };
    let mut out = Vec::new();
    for (name, index) in [("mknod", 1), ("mknodat", 2)] {
        for kind in [S_IFCHR, S_IFBLK] {
            out.push(refuse(name, masked(index, S_IFMT, kind)?)?);
        }
    }
    for &(_, bit) in cordon_jail::seccomp::CLONE_NAMESPACE_FLAGS {
        out.push(refuse("clone", masked(0, bit, bit)?)?);
    }
    Ok(out)
}

/// cordon's filter in OCI form (applied by the OCI runtime to the tool):
/// the deny table with `EPERM`, or the allow list with `EPERM` for the
/// rest, and in both the rules of [`refused_by_argument`] first (`runsc`
/// checks a call's rules in order, the first match deciding).
fn seccomp(s: &Seccomp) -> Result<LinuxSeccomp, String> {
    let e = |err: oci_spec::OciSpecError| format!("OCI seccomp: {err}");
    // EPERM.
    let eperm = 1u32;
    let (default, names, action): (LinuxSeccompAction, Vec<String>, LinuxSeccompAction) = match s {
        Seccomp::DenyList => (
            LinuxSeccompAction::ScmpActAllow,
            cordon_jail::seccomp::DENY_ALWAYS
                .iter()
                .map(|(n, _)| n.to_string())
                .collect(),
            LinuxSeccompAction::ScmpActErrno,
        ),
        Seccomp::AllowList { extra } => (
            LinuxSeccompAction::ScmpActErrno,
            cordon_jail::seccomp::ALLOW_BASE
                .iter()
                .map(|n| n.to_string())
                .chain(extra.iter().cloned())
                .collect(),
            LinuxSeccompAction::ScmpActAllow,
        ),
    };
    let mut rule = LinuxSyscallBuilder::default().names(names).action(action);
    if action == LinuxSeccompAction::ScmpActErrno {
        rule = rule.errno_ret(eperm);
    }
    let mut syscalls = refused_by_argument()?;
    syscalls.push(rule.build().map_err(e)?);
    let mut b = LinuxSeccompBuilder::default()
        .default_action(default)
        .syscalls(syscalls);
    if default == LinuxSeccompAction::ScmpActErrno {
        b = b.default_errno_ret(eperm);
    }
    b.build().map_err(e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::Mount;

    #[test]
    fn what_no_bundle_can_carry_is_a_problem_before_the_first_call() {
        // Positive control: a plain mount and variable.
        let mut spec = SandboxSpec::new("t", ["/bin/true"]);
        spec.mounts.push(Mount {
            src: "/srv/data".into(),
            dst: "/data".into(),
            writable: false,
        });
        assert!(problems(&spec).is_empty(), "{:?}", problems(&spec));
        spec.mounts.push(Mount {
            src: "/srv/x".into(),
            dst: "/proc".into(),
            writable: false,
        });
        spec.env.push(("A=B".into(), "c".into()));
        assert_eq!(
            problems(&spec),
            [
                "mount destination /proc is the sandbox's own",
                "bad environment variable \"A=B\"",
            ]
        );
    }

    #[test]
    fn a_trust_bundle_goes_where_the_jail_puts_it() {
        let d = tempfile::tempdir().unwrap();
        let etc = d.path().join("etc");
        fs::create_dir(&etc).unwrap();
        write_trust_bundle(&etc, b"PEM").unwrap();
        assert_eq!(
            fs::read(etc.join("ssl/certs/ca-certificates.crt")).unwrap(),
            b"PEM"
        );
        for l in ["ssl/cert.pem", "pki/tls/certs/ca-bundle.crt"] {
            assert_eq!(
                fs::read_link(etc.join(l)).unwrap(),
                Path::new(cordon_jail::TRUST_BUNDLE)
            );
        }
        // An image: only a regular file reached without a symlink.
        let img = d.path().join("img");
        fs::create_dir_all(img.join("etc/ssl/certs")).unwrap();
        fs::write(img.join("etc/ssl/certs/ca-certificates.crt"), "").unwrap();
        symlink("certs/ca-certificates.crt", img.join("etc/ssl/cert.pem")).unwrap();
        assert!(image_regular_file(
            &img,
            Path::new("/etc/ssl/certs/ca-certificates.crt")
        ));
        assert!(!image_regular_file(&img, Path::new("/etc/ssl/cert.pem")));
        assert!(!image_regular_file(
            &img,
            Path::new("/etc/pki/tls/certs/ca-bundle.crt")
        ));
    }

    #[test]
    fn tasks_are_the_processs_rlimit_and_devices_are_covered() {
        let mut spec = SandboxSpec::new("t", ["/bin/true"]);
        spec.limits.tasks = 32;
        let c = config(
            &spec,
            &[],
            &[("/b/no-device".into(), "/dev/fuse".into())],
            Net::Own,
        )
        .unwrap();
        let rl = c.process().as_ref().unwrap().rlimits().clone().unwrap();
        let nproc: Vec<_> = rl
            .iter()
            .filter(|r| r.typ() == PosixRlimitType::RlimitNproc)
            .map(|r| (r.soft(), r.hard()))
            .collect();
        assert_eq!(nproc, [(32, 32)]);
        // No pids resource: runsc would make it the host cgroup's limit.
        let res = c.linux().as_ref().unwrap().resources().clone().unwrap();
        assert!(res.pids().is_none(), "{res:?}");
        assert!(res.memory().is_some());
        let mounts = c.mounts().clone().unwrap();
        let net = mounts
            .iter()
            .find(|m| m.destination() == Path::new("/dev/net"))
            .unwrap();
        assert_eq!(net.typ().as_deref(), Some("tmpfs"));
        assert!(net.options().as_ref().unwrap().contains(&"ro".to_string()));
        let fuse = mounts
            .iter()
            .find(|m| m.destination() == Path::new("/dev/fuse"))
            .unwrap();
        assert_eq!(fuse.source().as_deref(), Some(Path::new("/b/no-device")));
        assert!(fuse.options().as_ref().unwrap().contains(&"ro".to_string()));
        // The bundle's own file: empty, mode 0000, bound there.
        let d = tempfile::tempdir().unwrap();
        write_bundle(d.path(), &spec, &[], None, &[], Net::Own).unwrap();
        let m = fs::metadata(d.path().join(NO_DEVICE)).unwrap();
        assert_eq!((m.len(), m.permissions().mode() & 0o7777), (0, 0));
        let c = Spec::load(d.path().join("config.json")).unwrap();
        assert!(c.mounts().as_ref().unwrap().iter().any(|m| {
            m.destination() == Path::new("/dev/fuse")
                && m.source().as_deref() == Some(d.path().join(NO_DEVICE).as_path())
        }));
    }

    #[test]
    fn device_nodes_and_namespaces_are_refused_before_any_allow_rule() {
        for s in [Seccomp::DenyList, Seccomp::AllowList { extra: Vec::new() }] {
            let f = seccomp(&s).unwrap();
            let calls = f.syscalls().clone().unwrap();
            let n = 4 + cordon_jail::seccomp::CLONE_NAMESPACE_FLAGS.len();
            assert_eq!(calls.len(), n + 1, "{s:?}");
            for c in &calls[..n] {
                assert_eq!(c.action(), LinuxSeccompAction::ScmpActErrno);
                assert_eq!(c.errno_ret(), Some(1));
                let args = c.args().clone().unwrap();
                assert_eq!(args.len(), 1);
                assert_eq!(args[0].op(), LinuxSeccompOperator::ScmpCmpMaskedEq);
            }
            let what: Vec<(String, usize, u64, Option<u64>)> = calls[..n]
                .iter()
                .map(|c| {
                    let a = &c.args().as_ref().unwrap()[0];
                    (c.names()[0].clone(), a.index(), a.value(), a.value_two())
                })
                .collect();
            assert_eq!(
                what[..4],
                [
                    ("mknod".into(), 1, S_IFMT, Some(S_IFCHR)),
                    ("mknod".into(), 1, S_IFMT, Some(S_IFBLK)),
                    ("mknodat".into(), 2, S_IFMT, Some(S_IFCHR)),
                    ("mknodat".into(), 2, S_IFMT, Some(S_IFBLK)),
                ]
            );
            let user = 0x1000_0000; // CLONE_NEWUSER
            assert!(
                what[4..].contains(&("clone".into(), 0, user, Some(user))),
                "{what:?}"
            );
            // Positive control: the filter's own rule comes last, and the
            // allow list keeps mknod for FIFOs and files.
            let last = &calls[n];
            match s {
                Seccomp::DenyList => {
                    assert_eq!(last.action(), LinuxSeccompAction::ScmpActErrno);
                    assert!(last.names().contains(&"mount".to_string()));
                }
                Seccomp::AllowList { .. } => {
                    assert_eq!(last.action(), LinuxSeccompAction::ScmpActAllow);
                    assert!(last.names().contains(&"mknod".to_string()));
                }
            }
        }
    }
}
