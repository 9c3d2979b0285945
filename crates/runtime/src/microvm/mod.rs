//! The microVM runtime (`runtime: microvm`, profile P3): each task is a
//! guest kernel of its own under QEMU `-M microvm`, started by restoring a
//! template's memory snapshot (or, with `boot: cold`, booted from
//! nothing), run once and destroyed.
//!
//! The guest side and the QEMU launcher are `cordon-vm-init`'s (see
//! `docs/microvm.md`); this module holds what is the runtime's:
//!
//! - **Finding the parts**: QEMU (at least 9.0; the snapshots need 8.2), the
//!   guest kernel and its modules, the static `cordon-vm-init` binary.
//! - **The accelerator**: KVM when a tiny guest boots under it here
//!   (checked once per kernel, QEMU and host kernel, and cached), else
//!   QEMU's TCG emulation, reported as the `kvm` mechanism missing: a
//!   microvm tool requires `kvm` unless the manifest accepts it.
//! - **Artifacts in the image store** (`vm/` beside the images): the
//!   initramfs per init and kernel, the read-only block image per image
//!   (EROFS, verified by sha256 before use), and one template snapshot per
//!   (block image, initramfs, kernel, QEMU, memory, vCPUs, accelerator),
//!   made on first use under a lock by booting a template guest, its RAM
//!   in a file, to its init's `ready` line and migrating its device state
//!   alone. Each restore maps that RAM file privately (copy-on-write: the
//!   guests share its pages, the file is never written); the device state
//!   is checked by sha256 before each restore, the RAM file whenever its
//!   version differs from the one last hashed (docs/microvm.md,
//!   "Snapshots").
//! - **The child of the supervisor** ([`Child`]): the sandbox's command
//!   line is `cordon-vm-init host DIR`, which runs as pid 1 of the
//!   supervisor's namespaces (no network at all), starts QEMU as the
//!   sandbox's host ids (a root broker never leaves QEMU root) with its
//!   own `-sandbox on` seccomp, streams the tool's stdio over the guest's
//!   virtio ports and exits like the tool; the cgroup slot bounds QEMU
//!   (guest memory plus its own overhead), the wall clock and output caps
//!   are the jail's, and the in-guest end (exit, signal, an OOM inside the
//!   guest, a guest error or panic) comes back in `DIR/status.json`.
//!
//! Egress: the guest has no NIC; its init stands for the doors (proxy,
//! DNS, the allowlist's ports) and carries each connection over a virtio
//! channel to the doors in the helper's namespace ([`task`]).
//!
//! Not yet: host binds, workspaces and state (nothing of the host is
//! shared into the guest; cordon's own read-only files go in by copy,
//! [`carry`]), a root that is not an image.

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cordon_jail::{Jail, JailOptions};
use cordon_sandbox::Status;
use cordon_vm_init::host::{self, End, Job, Start};
use cordon_vm_init::image::{self, BlockImage, FileId, FsKind};
use cordon_vm_init::protocol::{Doors, Limits as TaskLimits, Task, Trust};
use cordon_vm_init::qemu::{self, Accel, VmConfig};
use sha2::{Digest, Sha256};

pub mod artifacts;
pub mod carry;

use crate::mechanism::{Mechanism, MechanismState};
use crate::outcome::{Outcome, RunError};
use crate::spec::{Boot, Network, Root, SandboxSpec};
use crate::supervisor::{Child, Guest, Launch, Supervisor, WorkDir};
use crate::{Check, Context, Facts, Runtime, Spawned};

/// What a microVM sandbox's directory is called in notes and errors.
const LEFTOVER: &str = "microVM sandbox";

/// The oldest QEMU cordon runs (tested with 10.0; the snapshots need
/// 8.2's `file:` migration and `rom=` of a memory backend).
pub const MIN_QEMU: (u32, u32) = (9, 0);

/// Guest memory beyond the tool's limit: the guest kernel and the init.
const GUEST_OVERHEAD_MIB: u64 = 96;

/// QEMU's own memory beyond the guest's, in the cgroup slot: TCG's
/// translation buffers and QEMU itself (KVM needs less).
const VMM_OVERHEAD_TCG_MIB: u64 = 320;
const VMM_OVERHEAD_KVM_MIB: u64 = 96;

/// How long a cold boot (a template, the KVM check) may take.
const BOOT_TIMEOUT: Duration = Duration::from_secs(180);
/// How long the KVM check waits for a tiny guest.
const KVM_CHECK_TIMEOUT: Duration = Duration::from_secs(15);

/// Options of the microVM runtime. Each `None` takes its variable, else
/// the default.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// QEMU (`$CORDON_QEMU`, else `qemu-system-x86_64` in `PATH`).
    pub qemu: Option<PathBuf>,
    /// The guest kernel (`$CORDON_VM_KERNEL`, else the newest
    /// `/boot/vmlinuz-*-cloud-amd64`, else the newest `/boot/vmlinuz-*`);
    /// its modules from `/lib/modules/<its release>`.
    pub kernel: Option<PathBuf>,
    /// The static `cordon-vm-init` (`$CORDON_VM_INIT`, else beside the
    /// running executable, else where `scripts/build-vm-init.sh` puts it
    /// relative to it).
    pub init: Option<PathBuf>,
    /// Sandboxes' directories (`microvm` in cordon's runtime directory).
    pub state_dir: Option<PathBuf>,
    /// Block images, initramfs and snapshots (`vm` in the image store).
    pub store: Option<PathBuf>,
    /// `$CORDON_VM_ACCEL`: `tcg` skips the KVM check and emulates;
    /// `kvm` skips it and insists.
    pub accel: Option<Accel>,
}

#[derive(Debug, Clone)]
struct Qemu {
    path: PathBuf,
    version: String,
    sandbox: bool,
    /// What QEMU's own root holds besides the guest's files (its loader,
    /// libraries and firmware), [`qemu_root`].
    root: Vec<PathBuf>,
}

#[derive(Debug, Clone)]
struct Kernel {
    path: PathBuf,
    release: String,
    modules: Option<PathBuf>,
}

/// What the runtime finds on first use.
struct Found {
    qemu: Result<Qemu, String>,
    kernel: Result<Kernel, String>,
    init: Result<PathBuf, String>,
    state: Result<PathBuf, String>,
    store: Result<PathBuf, String>,
    notes: Vec<String>,
}

fn file_id(p: &Path) -> Option<FileId> {
    FileId::path(p)
}

/// The format of a template's files: part of its key, so that a store
/// holding templates of another format makes new ones (and `gc` removes
/// the old).
const SNAPSHOT_FORMAT: &str = "cow-ram-file v2";

/// The microVM runtime.
pub struct Microvm {
    sup: Supervisor,
    opts: Options,
    found: OnceLock<Found>,
    accel: OnceLock<Result<Accel, String>>,
    /// Files whose sha256 matched their record, as they were then.
    verified: Mutex<HashMap<PathBuf, FileId>>,
    /// Templates are made one at a time per broker (and under a file lock
    /// across brokers).
    templates: Mutex<()>,
    /// The init binary's sha256, as the file was when it was read (the
    /// initramfs is named by it; a call does not hash the init again).
    init_sha: Mutex<Option<(FileId, String)>>,
    root: bool,
}

/// `QEMU emulator version 10.0.2 (Debian ...)` -> (10, 0).
pub fn parse_qemu_version(text: &str) -> Option<(u32, u32)> {
    let rest = text.lines().next()?.split("version ").nth(1)?;
    let mut it = rest.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

fn find_qemu(opt: Option<&Path>) -> Result<Qemu, String> {
    let path = match opt
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("CORDON_QEMU").map(PathBuf::from))
    {
        Some(p) => p,
        None => image::find_tool("qemu-system-x86_64").ok_or_else(|| {
            "qemu-system-x86_64 not found (run scripts/setup.sh: QEMU 10 from bookworm-backports)"
                .to_string()
        })?,
    };
    let out = Command::new(&path)
        .arg("--version")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("run {} --version: {e}", path.display()))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let v = parse_qemu_version(&text)
        .ok_or_else(|| format!("{} --version: no version in {text:?}", path.display()))?;
    if v < MIN_QEMU {
        return Err(format!(
            "QEMU {} is {}.{}, older than {}.{} (no copy-on-write snapshots); install QEMU 10 from bookworm-backports",
            path.display(),
            v.0,
            v.1,
            MIN_QEMU.0,
            MIN_QEMU.1
        ));
    }
    let sandbox = qemu::qemu_has_sandbox(&path);
    let root = qemu_root(&path)?;
    Ok(Qemu {
        path,
        version: text.lines().next().unwrap_or("").to_string(),
        sandbox,
        root,
    })
}

/// Where QEMU looks for its firmware (`bios-microvm.bin`): its data
/// directory, then the directories Debian's build adds.
const QEMU_FIRMWARE: [&str; 3] = [
    "/usr/share/qemu",
    "/usr/share/seabios",
    "/usr/lib/ipxe/qemu",
];

/// The paths QEMU's root holds for QEMU itself (`cordon_vm_init::root`):
/// the directories of its loader and libraries by every path the loader
/// may take to them, `/etc/ld.so.cache`, and its firmware directories,
/// those that exist. Nothing else of the host is in its view.
fn qemu_root(qemu: &Path) -> Result<Vec<PathBuf>, String> {
    let mut paths = cordon_jail::libs::dirs(qemu)
        .map_err(|e| format!("QEMU's libraries (for its own root): {e}"))?;
    paths.extend(
        ["/etc/ld.so.cache"]
            .iter()
            .chain(QEMU_FIRMWARE.iter())
            .map(PathBuf::from)
            .filter(|p| p.exists()),
    );
    Ok(paths)
}

fn find_kernel(opt: Option<&Path>) -> Result<Kernel, String> {
    let path = match opt
        .map(Path::to_path_buf)
        .or_else(|| std::env::var_os("CORDON_VM_KERNEL").map(PathBuf::from))
    {
        Some(p) => p,
        None => {
            let mut all: Vec<PathBuf> = fs::read_dir("/boot")
                .map(|d| d.flatten().map(|e| e.path()).collect())
                .unwrap_or_default();
            all.retain(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with("vmlinuz-"))
            });
            all.sort();
            let cloud = all
                .iter()
                .rev()
                .find(|p| p.to_string_lossy().ends_with("-cloud-amd64"));
            cloud.or(all.last()).cloned().ok_or_else(|| {
                "no guest kernel in /boot (run scripts/setup.sh: linux-image-cloud-amd64), or set CORDON_VM_KERNEL".to_string()
            })?
        }
    };
    let release = cordon_vm_init::initramfs::kernel_release(&path)
        .map_err(|e| format!("guest kernel {}: {e}", path.display()))?;
    let moddir = PathBuf::from(format!("/lib/modules/{release}"));
    let modules = moddir.join("modules.dep").is_file().then_some(moddir);
    fs::File::open(&path).map_err(|e| format!("guest kernel {}: {e}", path.display()))?;
    Ok(Kernel {
        path,
        release,
        modules,
    })
}

fn find_init(opt: Option<&Path>) -> Result<PathBuf, String> {
    // A dynamic build of the same name (cargo's ordinary one, beside
    // cordon) is passed over for the static one.
    let is_static = |p: &Path| {
        cordon_jail::elf::read(p)
            .map(|e| e.interp.is_none())
            .unwrap_or(false)
    };
    let release = "x86_64-unknown-linux-gnu/release/cordon-vm-init";
    crate::companion::find_where(
        opt,
        "CORDON_VM_INIT",
        &[
            PathBuf::from("cordon-vm-init"),
            Path::new("..").join(release),
            Path::new("../..").join(release),
        ],
        is_static,
        "statically linked guest init cordon-vm-init",
        "build it with scripts/build-vm-init.sh and set CORDON_VM_INIT to the path it prints",
    )
}

/// A directory of cordon's, made 0711 (0755 for the store) and used only
/// when owned by this uid and writable by it alone.
fn own_dir(dir: &Path, mode: u32, euid: u32) -> Result<PathBuf, String> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(|e| format!("create {}: {e}", dir.display()))?;
    let m = fs::symlink_metadata(dir).map_err(|e| format!("stat {}: {e}", dir.display()))?;
    if !m.is_dir() || m.uid() != euid || m.mode() & 0o022 != 0 {
        return Err(format!(
            "{} is not a directory owned by uid {euid} and writable by it alone",
            dir.display()
        ));
    }
    Ok(dir.to_path_buf())
}

/// `path`'s sha256 (over its data extents when `sparse`) and the version
/// of the file it is of (unchanged while it was read).
fn hashed(path: &Path, sparse: bool) -> Result<(String, FileId), String> {
    let id = file_id(path).ok_or_else(|| format!("{} is missing", path.display()))?;
    let sha = if sparse {
        image::sha256_sparse(path)
    } else {
        image::sha256_file(path)
    }
    .map_err(|e| e.to_string())?;
    if file_id(path) != Some(id) {
        return Err(format!("{} changed while it was hashed", path.display()));
    }
    Ok((sha, id))
}

/// Writes `v` to `stamp` (atomically; a stamp that cannot be written
/// only costs the next process a full hash).
fn write_stamp(stamp: &Path, v: &artifacts::Verified) {
    let Ok(text) = serde_json::to_vec(v) else {
        return;
    };
    let name = stamp
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = stamp.with_file_name(format!(".{name}.tmp{}", std::process::id()));
    if fs::write(&tmp, text).is_ok() && fs::rename(&tmp, stamp).is_err() {
        let _ = fs::remove_file(&tmp);
    }
}

fn sha256_hex(parts: &[&[u8]]) -> String {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_le_bytes());
        h.update(p);
    }
    hex::encode(h.finalize())
}

/// A template as verified: its device state and digest, its RAM file
/// and the version of it whose digest matched.
#[derive(Debug, Clone)]
struct Template {
    state: PathBuf,
    state_sha256: String,
    ram: PathBuf,
    ram_id: FileId,
}

/// Everything one task's guest is made of.
#[derive(Debug, Clone)]
struct Parts {
    vm: VmConfig,
    /// The template it is restored from; `None`: a cold boot.
    snapshot: Option<Template>,
    /// QEMU's ids on the host (when the broker is root).
    qemu_ids: Option<(u32, u32)>,
}

fn mib(bytes: u64) -> u64 {
    bytes.div_ceil(1 << 20)
}

impl Microvm {
    /// The runtime over a jail of its own.
    pub fn new(opts: Options, jail: JailOptions) -> Result<Microvm, String> {
        let jail = Jail::with_options(jail).map_err(|e| e.to_string())?;
        Ok(Microvm::with_jail(opts, Arc::new(jail)))
    }

    /// [`Microvm::new`] over an existing jail (its cgroup slots shared).
    pub fn with_jail(mut opts: Options, jail: Arc<Jail>) -> Microvm {
        let root = jail.host().euid == 0;
        if opts.accel.is_none() {
            opts.accel = match std::env::var("CORDON_VM_ACCEL").as_deref() {
                Ok("tcg") => Some(Accel::Tcg),
                Ok("kvm") => Some(Accel::Kvm),
                _ => None,
            };
        }
        Microvm {
            sup: Supervisor::new(jail),
            opts,
            found: OnceLock::new(),
            accel: OnceLock::new(),
            verified: Mutex::new(HashMap::new()),
            templates: Mutex::new(()),
            init_sha: Mutex::new(None),
            root,
        }
    }

    fn found(&self) -> &Found {
        self.found.get_or_init(|| {
            let euid = self.sup.jail().host().euid;
            let dirs = cordon_dirs::Dirs::current();
            let state = match &self.opts.state_dir {
                Some(p) => Ok(p.clone()),
                None => dirs
                    .runtime()
                    .map(|d| d.join("microvm"))
                    .map_err(|e| e.to_string()),
            }
            .and_then(|d| own_dir(&d, 0o711, euid));
            let store = match &self.opts.store {
                Some(p) => Ok(p.clone()),
                None => dirs
                    .images()
                    .map(|d| d.join("vm"))
                    .map_err(|e| e.to_string()),
            }
            .and_then(|d| own_dir(&d, 0o755, euid));
            let notes = match &state {
                Ok(s) => crate::supervisor::sweep(s, LEFTOVER),
                Err(_) => Vec::new(),
            };
            Found {
                qemu: find_qemu(self.opts.qemu.as_deref()),
                kernel: find_kernel(self.opts.kernel.as_deref()),
                init: find_init(self.opts.init.as_deref()),
                state,
                store,
                notes,
            }
        })
    }

    /// The jail underneath.
    pub fn jail(&self) -> &Arc<Jail> {
        self.sup.jail()
    }

    /// Why no guest would start here (empty: they would).
    fn problems(&self) -> Vec<String> {
        self.parts_problem()
            .map(|p| vec![format!("runtime microvm: {p}")])
            .unwrap_or_default()
    }

    /// The child for one task of `spec`: its parts ready (the template
    /// made on first use).
    fn task_child(&self, spec: &SandboxSpec, ctx: &Context) -> Result<VmChild<'_>, RunError> {
        let problems = self.problems();
        if !problems.is_empty() {
            return Err(RunError::Refused(format!(
                "{}: would not start on this host: {}",
                spec.tool,
                problems.join("; ")
            )));
        }
        let parts = self.parts(spec, ctx)?;
        let (start, wall_ms) = match parts.snapshot {
            Some(t) => (
                Start::Restore {
                    snapshot: t.state,
                    state_sha256: t.state_sha256,
                    ram: t.ram,
                    ram_id: t.ram_id,
                },
                None,
            ),
            // A cold guest's boot is cordon's, not the tool's: the helper
            // keeps the tool's wall clock from the task's start.
            None => (
                Start::Cold,
                Some(
                    u64::try_from(ctx.placement.limits(spec).wall.as_millis()).unwrap_or(u64::MAX),
                ),
            ),
        };
        Ok(VmChild {
            rt: self,
            tool: spec.tool.clone(),
            job: Job {
                vm: parts.vm,
                start,
                task: None,
                qemu_ids: parts.qemu_ids,
                confine_dev: true,
                qemu_root: self.qemu_root(),
                wall_ms,
            },
            template_out: None,
        })
    }

    fn parts_problem(&self) -> Option<String> {
        let f = self.found();
        [
            f.qemu.as_ref().err(),
            f.kernel.as_ref().err(),
            f.init.as_ref().err(),
            f.state.as_ref().err().map(|e| e as &String),
            f.store.as_ref().err(),
        ]
        .into_iter()
        .flatten()
        .next()
        .cloned()
    }

    /// The accelerator guests run under: KVM when a tiny guest boots with
    /// it here, else TCG with why KVM is not used.
    pub fn accel(&self) -> (Accel, Option<String>) {
        let r = self.accel.get_or_init(|| match self.opts.accel {
            Some(Accel::Tcg) => Err("CORDON_VM_ACCEL=tcg: emulation chosen by the host".into()),
            Some(Accel::Kvm) => Ok(Accel::Kvm),
            None => self.kvm_verdict(),
        });
        match r {
            Ok(a) => (*a, None),
            Err(why) => (Accel::Tcg, Some(why.clone())),
        }
    }

    /// Whether a tiny guest boots under KVM here: cached in the state
    /// directory per guest kernel, QEMU build, host kernel and guest init
    /// (a verdict an older cordon reached, rightly or not, is not kept
    /// past its init).
    fn kvm_verdict(&self) -> Result<Accel, String> {
        if let Err(e) = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/kvm")
        {
            return Err(format!("/dev/kvm: {e}"));
        }
        if let Some(p) = self.parts_problem() {
            return Err(p);
        }
        let f = self.found();
        let (Ok(q), Ok(k), Ok(state), Ok(init)) = (&f.qemu, &f.kernel, &f.state, &f.init) else {
            return Err("the microVM parts are missing".into());
        };
        let init_sha = self.init_sha(init)?;
        let key = sha256_hex(&[
            k.path.as_os_str().as_encoded_bytes(),
            k.release.as_bytes(),
            q.version.as_bytes(),
            cordon_sys::io::kernel_release().as_bytes(),
            init_sha.as_bytes(),
        ]);
        let cache = state.join(format!("kvm-{}.json", &key[..16]));
        if let Ok(text) = fs::read_to_string(&cache)
            && let Ok(v) = serde_json::from_str::<Result<(), String>>(&text)
        {
            return v.map(|()| Accel::Kvm);
        }
        let v = self.try_kvm();
        if let Ok(text) = serde_json::to_string(&v) {
            let tmp = cache.with_extension(format!("tmp{}", std::process::id()));
            if fs::write(&tmp, text).is_ok() {
                let _ = fs::rename(&tmp, &cache);
            }
        }
        v.map(|()| Accel::Kvm)
    }

    /// Boots a guest of an empty image under KVM once.
    fn try_kvm(&self) -> Result<(), String> {
        let f = self.found();
        let (Ok(state), Ok(store)) = (&f.state, &f.store) else {
            return Err("no state directory".into());
        };
        let empty = state.join(format!(".kvm-root-{}", std::process::id()));
        let _ = fs::remove_dir_all(&empty);
        fs::create_dir_all(&empty).map_err(|e| format!("{}: {e}", empty.display()))?;
        let img = image::build(&empty, &store.join("images"), FsKind::Erofs)
            .map_err(|e| format!("a test image: {e}"));
        let _ = fs::remove_dir_all(&empty);
        let mut vm = self.vm_config(img?, 64, 1, Accel::Kvm)?;
        vm.boot_timeout = KVM_CHECK_TIMEOUT;
        let dir = state.join(format!(".kvm-check-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let ids = self.qemu_ids(None, Accel::Kvm);
        if let Some((u, g)) = ids {
            let _ = std::os::unix::fs::chown(&dir, Some(u), Some(g));
        }
        let r = qemu::Vm::boot_as(&vm, &dir, ids).map(drop).map_err(|e| {
            let e = e.to_string().replace('\n', "; ");
            let short: String = e.chars().take(300).collect();
            format!("a guest did not boot under KVM here: {short}")
        });
        let _ = fs::remove_dir_all(&dir);
        r
    }

    /// QEMU's host ids: the sandbox's, when the broker is root; under KVM
    /// with the group of `/dev/kvm`, which QEMU must open.
    fn qemu_ids(&self, placement: Option<(u32, u32)>, accel: Accel) -> Option<(u32, u32)> {
        let (uid, gid) = self
            .root
            .then(|| placement.unwrap_or_else(|| self.sup.jail().sandbox_host_ids()))?;
        let kvm_gid = fs::metadata("/dev/kvm").map(|m| m.gid()).ok();
        Some(match (accel, kvm_gid) {
            (Accel::Kvm, Some(g)) => (uid, g),
            _ => (uid, gid),
        })
    }

    /// The initramfs for this init and kernel, built once.
    fn initramfs(&self) -> Result<PathBuf, String> {
        let f = self.found();
        let (Ok(init), Ok(k), Ok(store)) = (&f.init, &f.kernel, &f.store) else {
            return Err(self.parts_problem().unwrap_or_default());
        };
        let init_sha = self.init_sha(init)?;
        let key = sha256_hex(&[init_sha.as_bytes(), k.release.as_bytes()]);
        let dir = store.join("initramfs");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&dir)
            .map_err(|e| format!("create {}: {e}", dir.display()))?;
        let out = dir.join(format!("{}.cpio", &key[..32]));
        if out.is_file() {
            return Ok(out);
        }
        let tmp = dir.join(format!(".{}.tmp{}", &key[..32], std::process::id()));
        cordon_vm_init::initramfs::build(init, k.modules.as_deref(), &tmp)
            .map_err(|e| format!("build the guest's initramfs: {e}"))?;
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o644))
            .and_then(|()| fs::rename(&tmp, &out))
            .map_err(|e| format!("{}: {e}", out.display()))?;
        Ok(out)
    }

    /// The sha256 of `init`, hashed again only when the file changed.
    fn init_sha(&self, init: &Path) -> Result<String, String> {
        let id = file_id(init);
        let mut memo = self.init_sha.lock().unwrap_or_else(|p| p.into_inner());
        if let (Some(id), Some((was, sha))) = (id, memo.as_ref())
            && id == *was
        {
            return Ok(sha.clone());
        }
        let sha = image::sha256_file(init).map_err(|e| e.to_string())?;
        if let Some(id) = id {
            *memo = Some((id, sha.clone()));
        }
        Ok(sha)
    }

    /// The block image of `rootfs`: found by the image's digest when it
    /// has one (an index in the store), else by the digest of its tree;
    /// verified against its record once per version of the file.
    fn block_image(&self, rootfs: &Path, digest: &str) -> Result<BlockImage, String> {
        let Ok(store) = &self.found().store else {
            return Err(self.parts_problem().unwrap_or_default());
        };
        let images = store.join("images");
        let index = store.join("index");
        let named = digest.strip_prefix("sha256:").filter(|h| {
            h.len() == 64
                && h.bytes()
                    .all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase())
        });
        if let Some(h) = named
            && let Ok(block) = fs::read_to_string(index.join(h))
        {
            let img = BlockImage::open_unverified(&images, block.trim())
                .map_err(|e| format!("the block image of {digest}: {e}"))?;
            self.verify(&img.path, &img.sha256, false)?;
            return Ok(img);
        }
        let img = image::build(rootfs, &images, FsKind::Erofs)
            .map_err(|e| format!("build the block image of {}: {e}", rootfs.display()))?;
        let _ = fs::set_permissions(&img.path, fs::Permissions::from_mode(0o644));
        if let Some(h) = named {
            let _ = fs::create_dir_all(&index);
            let tmp = index.join(format!(".{h}.tmp{}", std::process::id()));
            if fs::write(&tmp, &img.digest).is_ok() {
                let _ = fs::rename(&tmp, index.join(h));
            }
        }
        self.remember(&img.path);
        Ok(img)
    }

    /// The carried disk of `files` (none for no files): found through the
    /// index of their versions, else copied and built now; verified
    /// against its record once per version of the file.
    fn carried_disk(&self, files: &[carry::Carried]) -> Result<Option<BlockImage>, String> {
        if files.is_empty() {
            return Ok(None);
        }
        let Ok(store) = &self.found().store else {
            return Err(self.parts_problem().unwrap_or_default());
        };
        let images = store.join("images");
        let index = store.join("carry");
        let key = carry::key(files);
        let entry = index.join(&key[..32]);
        if let Ok(d) = fs::read_to_string(&entry)
            && let Ok(img) = BlockImage::open_unverified(&images, d.trim())
        {
            self.verify(&img.path, &img.sha256, false)?;
            return Ok(Some(img));
        }
        let staged = index.join(format!(".stage-{}.tmp{}", &key[..16], std::process::id()));
        let _ = fs::remove_dir_all(&staged);
        let built = carry::stage(files, &staged).and_then(|()| {
            image::build(&staged, &images, FsKind::Erofs)
                .map_err(|e| format!("build the carried disk: {e}"))
        });
        let _ = fs::remove_dir_all(&staged);
        let img = built?;
        let _ = fs::set_permissions(&img.path, fs::Permissions::from_mode(0o644));
        let tmp = index.join(format!(".{}.tmp{}", &key[..32], std::process::id()));
        if fs::write(&tmp, &img.digest).is_ok() {
            let _ = fs::rename(&tmp, &entry);
        }
        self.remember(&img.path);
        Ok(Some(img))
    }

    fn remember(&self, path: &Path) {
        if let Some(id) = file_id(path) {
            self.remember_as(path, id);
        }
    }

    fn remember_as(&self, path: &Path, id: FileId) {
        let mut v = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        v.insert(path.to_path_buf(), id);
    }

    /// `path`'s sha256 is `sha256`, or an error naming both; a file
    /// already verified and unchanged since (device, inode, size,
    /// modification and change time) is not read again. Returns the
    /// version of the file that matched.
    fn verify(&self, path: &Path, sha256: &str, sparse: bool) -> Result<FileId, String> {
        let id = file_id(path).ok_or_else(|| format!("{} is missing", path.display()))?;
        {
            let v = self.verified.lock().unwrap_or_else(|p| p.into_inner());
            if v.get(path) == Some(&id) {
                return Ok(id);
            }
        }
        let actual = if sparse {
            image::sha256_sparse(path)
        } else {
            image::sha256_file(path)
        }
        .map_err(|e| e.to_string())?;
        if actual != sha256 {
            return Err(format!(
                "{} is corrupt: its sha256 is {actual}, its record says {sha256}; refusing to boot it (remove it and it is made again)",
                path.display()
            ));
        }
        if file_id(path) != Some(id) {
            return Err(format!(
                "{} changed while it was verified; refusing to boot it",
                path.display()
            ));
        }
        self.remember_as(path, id);
        Ok(id)
    }

    /// [`Microvm::verify`] for a large file whose last full hash is
    /// recorded in `stamp` (the store's own, beside the record): a version
    /// of the file the stamp names with the same digest is not read again,
    /// in this process or a later one; any other is hashed in full and
    /// the stamp rewritten.
    fn verify_stamped(&self, path: &Path, sha256: &str, stamp: &Path) -> Result<FileId, String> {
        let id = file_id(path).ok_or_else(|| format!("{} is missing", path.display()))?;
        let stamped = fs::read(stamp)
            .ok()
            .and_then(|t| serde_json::from_slice::<artifacts::Verified>(&t).ok());
        if let Some(v) = stamped
            && v.file == id
            && v.sha256 == sha256
        {
            self.remember_as(path, id);
            return Ok(id);
        }
        let id = self.verify(path, sha256, true)?;
        write_stamp(
            stamp,
            &artifacts::Verified {
                sha256: sha256.to_owned(),
                file: id,
            },
        );
        Ok(id)
    }

    fn vm_config(
        &self,
        image: BlockImage,
        memory_mib: u64,
        cpus: u32,
        accel: Accel,
    ) -> Result<VmConfig, String> {
        let f = self.found();
        let (Ok(q), Ok(k)) = (&f.qemu, &f.kernel) else {
            return Err(self.parts_problem().unwrap_or_default());
        };
        Ok(VmConfig {
            qemu: q.path.clone(),
            kernel: k.path.clone(),
            initramfs: self.initramfs()?,
            image,
            memory_mib: u32::try_from(memory_mib + GUEST_OVERHEAD_MIB).unwrap_or(u32::MAX),
            cpus,
            accel,
            tsc_khz: (accel == Accel::Tcg).then(qemu::host_tsc_khz).flatten(),
            sandbox: q.sandbox,
            extra_append: Vec::new(),
            boot_timeout: BOOT_TIMEOUT,
            image_verified: true,
            carry: None,
        })
    }

    /// What QEMU's own root holds for QEMU (found with it).
    fn qemu_root(&self) -> Option<Vec<PathBuf>> {
        self.found().qemu.as_ref().ok().map(|q| q.root.clone())
    }

    /// Everything a task of `spec` needs, its template snapshot made if
    /// there is none yet.
    fn parts(&self, spec: &SandboxSpec, ctx: &Context) -> Result<Parts, RunError> {
        let refuse = |e: String| RunError::Setup(format!("{}: microvm: {e}", spec.tool));
        let Root::Image { rootfs, digest } = &spec.root else {
            return Err(RunError::Refused(format!(
                "{}: runtime microvm needs an image root",
                spec.tool
            )));
        };
        // Admission refuses mounts for a microvm tool; a caller that runs a
        // spec directly (the probes, their agent) gets read-only files
        // under /.cordon carried in on a disk of their own.
        let carried =
            carry::files(spec).map_err(|e| RunError::Refused(format!("{}: {e}", spec.tool)))?;
        let img = self.block_image(rootfs, digest).map_err(refuse)?;
        let carried = self.carried_disk(&carried).map_err(refuse)?;
        let (accel, _) = self.accel();
        let mut vm = self
            .vm_config(img, guest_mib(spec), vcpus(spec), accel)
            .map_err(refuse)?;
        vm.carry = carried;
        let qemu_ids = self.qemu_ids(ctx.placement.host_ids, accel);
        let snapshot = match spec.boot {
            Boot::Snapshot => Some(self.template(spec, &vm, qemu_ids, ctx)?),
            Boot::Cold => None,
        };
        Ok(Parts {
            vm,
            snapshot,
            qemu_ids,
        })
    }

    /// The template snapshot of `vm`: verified, or made now (one boot of
    /// a guest that runs no task).
    fn template(
        &self,
        spec: &SandboxSpec,
        vm: &VmConfig,
        qemu_ids: Option<(u32, u32)>,
        ctx: &Context,
    ) -> Result<Template, RunError> {
        let fail = |e: String| RunError::Setup(format!("{}: microvm template: {e}", spec.tool));
        let Ok(store) = &self.found().store else {
            return Err(fail(self.parts_problem().unwrap_or_default()));
        };
        let q = self.found().qemu.as_ref().map_err(|e| fail(e.clone()))?;
        let kmeta = fs::metadata(&vm.kernel).map_err(|e| fail(e.to_string()))?;
        let key = sha256_hex(&[
            SNAPSHOT_FORMAT.as_bytes(),
            vm.image.sha256.as_bytes(),
            vm.initramfs.as_os_str().as_encoded_bytes(),
            vm.kernel.as_os_str().as_encoded_bytes(),
            &kmeta.len().to_le_bytes(),
            &kmeta.mtime().to_le_bytes(),
            q.version.as_bytes(),
            &vm.memory_mib.to_le_bytes(),
            &vm.cpus.to_le_bytes(),
            format!("{:?} {:?}", vm.accel, vm.tsc_khz).as_bytes(),
            vm.carry.as_ref().map_or(&b""[..], |c| c.sha256.as_bytes()),
        ]);
        let key = &key[..32];
        let dir = store.join("snapshots");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&dir)
            .map_err(|e| fail(format!("create {}: {e}", dir.display())))?;
        let snap = dir.join(format!("{key}.snap"));
        let ram = dir.join(format!("{key}.ram"));
        let record = dir.join(format!("{key}.json"));
        let stamp = dir.join(format!("{key}.verified"));
        let check = || -> Result<Option<Template>, RunError> {
            match fs::read(&record) {
                Ok(text) => {
                    let r: artifacts::SnapRecord = serde_json::from_slice(&text)
                        .map_err(|e| fail(format!("{}: {e}", record.display())))?;
                    // The helper checks the state again on the copy QEMU
                    // reads; the RAM file is hashed once per version of it.
                    self.verify(&snap, &r.sha256, false).map_err(fail)?;
                    let ram_id = self
                        .verify_stamped(&ram, &r.ram_sha256, &stamp)
                        .map_err(fail)?;
                    Ok(Some(Template {
                        state: snap.clone(),
                        state_sha256: r.sha256,
                        ram: ram.clone(),
                        ram_id,
                    }))
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(e) => Err(fail(format!("{}: {e}", record.display()))),
            }
        };
        if let Some(s) = check()? {
            return Ok(s);
        }
        let _one = self.templates.lock().unwrap_or_else(|p| p.into_inner());
        let lock = fs::File::create(dir.join(format!("{key}.lock")))
            .and_then(|f| f.lock().map(|()| f))
            .map_err(|e| fail(format!("lock: {e}")))?;
        if let Some(s) = check()? {
            return Ok(s);
        }
        let out = dir.join(format!(".{key}.tmp{}", std::process::id()));
        let _ = fs::remove_dir_all(&out);
        fs::DirBuilder::new()
            .mode(0o700)
            .create(&out)
            .map_err(|e| fail(format!("create {}: {e}", out.display())))?;
        if let Some((u, g)) = qemu_ids {
            std::os::unix::fs::chown(&out, Some(u), Some(g))
                .map_err(|e| fail(format!("chown {}: {e}", out.display())))?;
        }
        let made = self.boot_template(spec, vm, qemu_ids, &out, ctx);
        let r = made.and_then(|()| {
            // QEMU wrote them as the sandbox's ids; the store keeps them
            // as its own, read-only to everyone (QEMU maps the RAM file
            // as the sandbox's ids, privately).
            for (taken, to) in [
                (out.join(host::TEMPLATE_SNAPSHOT), &snap),
                (out.join(host::TEMPLATE_RAM), &ram),
            ] {
                if qemu_ids.is_some() {
                    let me = self.sup.jail().host();
                    std::os::unix::fs::chown(&taken, Some(me.euid), Some(me.egid))
                        .map_err(|e| fail(format!("chown {}: {e}", taken.display())))?;
                }
                fs::set_permissions(&taken, fs::Permissions::from_mode(0o444))
                    .and_then(|()| fs::rename(&taken, to))
                    .map_err(|e| fail(format!("{}: {e}", to.display())))?;
            }
            // Hashed where they stay, and remembered as they were hashed.
            let (sha256, _) = hashed(&snap, false).map_err(fail)?;
            let (ram_sha256, ram_id) = hashed(&ram, true).map_err(fail)?;
            let ram_sha_for_stamp = ram_sha256.clone();
            let rec = artifacts::SnapRecord {
                sha256: sha256.clone(),
                ram_sha256,
                image: vm.image.digest.clone(),
                carry: vm.carry.as_ref().map(|c| c.digest.clone()),
                initramfs: vm
                    .initramfs
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_default(),
            };
            let rec = serde_json::to_vec(&rec).map_err(|e| fail(e.to_string()))?;
            let tmp = out.join("record.json");
            fs::write(&tmp, rec)
                .and_then(|()| fs::rename(&tmp, &record))
                .map_err(|e| fail(format!("{}: {e}", record.display())))?;
            self.remember(&snap);
            self.remember_as(&ram, ram_id);
            write_stamp(
                &stamp,
                &artifacts::Verified {
                    sha256: ram_sha_for_stamp,
                    file: ram_id,
                },
            );
            Ok(Template {
                state: snap.clone(),
                state_sha256: sha256,
                ram: ram.clone(),
                ram_id,
            })
        });
        let _ = fs::remove_dir_all(&out);
        drop(lock);
        r
    }

    /// One template boot through the supervisor: the guest boots to its
    /// init's `ready`, QEMU writes the snapshot into `out`.
    fn boot_template(
        &self,
        spec: &SandboxSpec,
        vm: &VmConfig,
        qemu_ids: Option<(u32, u32)>,
        out: &Path,
        ctx: &Context,
    ) -> Result<(), RunError> {
        let t = VmChild {
            rt: self,
            tool: spec.tool.clone(),
            job: Job {
                vm: vm.clone(),
                start: Start::Template,
                task: None,
                qemu_ids,
                confine_dev: true,
                qemu_root: self.qemu_root(),
                wall_ms: None,
            },
            template_out: Some(out.to_path_buf()),
        };
        let mut tspec = SandboxSpec::new(&spec.tool, ["template"]);
        tspec.network = Network::None;
        tspec.limits = spec.limits;
        // The template is cordon's own boot, not the tool's task: it gets
        // a boot's time, however short the tool's wall clock (a start-up
        // probe's is 3 s).
        tspec.limits.wall = tspec.limits.wall.max(BOOT_TIMEOUT);
        let mut o = self.sup.run(&t, &tspec, Vec::new(), ctx)?;
        if o.status == Status::TimedOut {
            // An emulated boot that stalled (a loaded host, or a guest
            // stuck early in its boot) is tried once more from nothing:
            // the template is cordon's own boot, not the tool's task.
            tracing::warn!(
                "{}: microvm template: the template guest did not snapshot within the wall clock; booting it once more",
                spec.tool
            );
            if let Ok(entries) = fs::read_dir(out) {
                for e in entries.flatten() {
                    let _ = fs::remove_file(e.path());
                }
            }
            o = self.sup.run(&t, &tspec, Vec::new(), ctx)?;
        }
        if o.status != Status::Ok {
            return Err(RunError::Setup(format!(
                "{}: microvm template: the template guest did not snapshot: {} {}",
                spec.tool,
                o.reason,
                String::from_utf8_lossy(&o.stderr).trim()
            )));
        }
        Ok(())
    }

    /// How each mechanism holds for a sandbox of `spec` here.
    pub fn mechanisms(&self, spec: &SandboxSpec) -> Vec<MechanismState> {
        let (accel, why) = self.accel();
        let mut out = vec![
            MechanismState::enforced(Mechanism::Namespaces),
            MechanismState::enforced(Mechanism::ReadonlyRoot),
            MechanismState::enforced(Mechanism::Descriptors),
            MechanismState::enforced(Mechanism::Network),
            MechanismState::enforced(Mechanism::Seccomp),
            MechanismState::missing(
                Mechanism::Landlock,
                "not applied inside the guest: its own kernel serves a read-only block image and nothing of the host's",
            ),
        ];
        out.push(match (accel, why) {
            (Accel::Kvm, _) => MechanismState::enforced(Mechanism::Kvm),
            (Accel::Tcg, why) => MechanismState::missing(
                Mechanism::Kvm,
                format!(
                    "guests run under QEMU's TCG emulation (slow): {}",
                    why.unwrap_or_default()
                ),
            ),
        });
        out.push(self.sup.cgroup(
            spec,
            "QEMU (the guest's memory and QEMU's own)",
            "memory, task or CPU",
        ));
        out
    }
}

/// The guest's memory for `spec`'s tool: its limit rounded up to a power
/// of two (at least 128 MiB), so that tools of nearby limits share one
/// template; the init holds the tool to its own limit inside the guest.
fn guest_mib(spec: &SandboxSpec) -> u64 {
    mib(spec.limits.memory_bytes).max(128).next_power_of_two()
}

/// vCPUs from the CPU limit: one per 100 %, at least one.
fn vcpus(spec: &SandboxSpec) -> u32 {
    let want = u64::from(spec.limits.cpu_percent.unwrap_or(100))
        .div_ceil(100)
        .max(1);
    let have = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    u32::try_from(want.min(have)).unwrap_or(1)
}

/// Threads the guest's init may run for the egress channel (one per
/// listener, two per open connection, at most 32 connections), which count
/// in the task's cgroup beside the tool's own.
const NET_THREADS: u64 = 1 + 2 * 32 + 4;
/// The DNS threads beside them: the TCP listener and the workers that
/// answer UDP queries, one at a time each (as many on the host, relaying).
const DNS_THREADS: u64 = 1 + 8;

/// The task the guest's init runs for `spec`: with egress doors, the init
/// listens on the guest's loopback at the proxy door's port (the tool's
/// `HTTP_PROXY`/`HTTPS_PROXY` name that address already), on the
/// allowlist's ports at the doors' local addresses, and for DNS, and
/// carries each connection to the doors in the helper's network namespace.
fn task(spec: &SandboxSpec, guest: &Guest, jail: &Jail) -> Result<Task, cordon_jail::JailError> {
    let (uid, gid) = spec.user.unwrap_or((1000, 1000));
    // The doors' plan, as the native jail sets it up in a sandbox's own
    // namespace: the proxy door on the loopback, the allowlist's ports at
    // any local address, the doors' networks local, DNS.
    let (net, doors): (Vec<u16>, Option<Doors>) = match &spec.network {
        Network::Doors(ep) if guest.doors => {
            let plan = cordon_egress::plan(ep);
            let doors = (!plan.is_empty()).then(|| Doors {
                local: plan
                    .local_cidrs
                    .iter()
                    .filter_map(|n| match n {
                        ipnet::IpNet::V4(v) => Some((v.addr(), v.prefix_len())),
                        ipnet::IpNet::V6(_) => None,
                    })
                    .collect(),
                ports: plan
                    .tcp
                    .iter()
                    .filter(|a| a.ip().is_unspecified())
                    .map(|a| a.port())
                    .collect(),
                dns: plan.udp.first().copied(),
            });
            (plan.proxy.map(|a| a.port()).into_iter().collect(), doors)
        }
        _ => (Vec::new(), None),
    };
    let pids = spec.limits.tasks
        + match &doors {
            Some(d) => NET_THREADS + d.ports.len() as u64 + DNS_THREADS,
            None if !net.is_empty() => NET_THREADS,
            None => 0,
        };
    // The native jail's filters, installed by the guest's init before the
    // tool's execve (sockets of the internet family only with egress).
    let seccomp = jail
        .filters_for(&spec.seccomp, !net.is_empty() || doors.is_some())?
        .iter()
        .map(|f| cordon_vm_init::protocol::pack_filter(f))
        .collect();
    // The session CA with the host's roots, where the jail puts an image
    // root's (the variables name that path), and over the image's own.
    let trust = match (&guest.trust_bundle, &spec.root) {
        (Some(pem), Root::Image { rootfs, .. }) => Some(Trust {
            pem: String::from_utf8_lossy(pem).into_owned(),
            path: cordon_jail::TRUST_BUNDLE_IMAGE.to_owned(),
            over: cordon_jail::TRUST_BUNDLE_PATHS
                .iter()
                .filter(|p| crate::oci::image_regular_file(rootfs, Path::new(p)))
                .map(|p| p.to_string())
                .collect(),
        }),
        _ => None,
    };
    Ok(Task {
        doors,
        trust,
        seccomp,
        net,
        argv: spec.argv.clone(),
        env: guest.env.clone(),
        cwd: spec.cwd.clone().unwrap_or_else(|| "/tmp".into()),
        uid,
        gid,
        limits: TaskLimits {
            tmp_mib: mib(spec.limits.disk_bytes).max(1),
            memory_mib: Some(mib(spec.limits.memory_bytes)),
            pids: Some(pids),
            nofile: spec.limits.nofile,
        },
        entropy: String::new(),
        time_ns: 0,
    })
}

/// The supervisor's limits for a VMM of `vm`: the tool's, with the memory
/// of the guest plus QEMU's own.
fn vmm_limits(spec: &SandboxSpec, vm: &VmConfig) -> cordon_sandbox::Limits {
    let mut l = spec.limits;
    let overhead = match vm.accel {
        Accel::Kvm => VMM_OVERHEAD_KVM_MIB,
        Accel::Tcg => VMM_OVERHEAD_TCG_MIB,
    };
    l.memory_bytes = (u64::from(vm.memory_mib) + overhead) << 20;
    // QEMU's threads (vCPUs, I/O, RCU) beside the helper's (its stdio
    // pumps, and the egress channel's: two per open connection).
    l.tasks = l.tasks.max(64) + NET_THREADS + DNS_THREADS;
    l
}

fn write_job(dir: &WorkDir, job: &Job) -> Result<(), RunError> {
    let text = serde_json::to_vec(job)
        .map_err(|e| RunError::Setup(format!("microvm: encode the job: {e}")))?;
    let path = dir.path().join(host::JOB);
    fs::write(&path, text)
        .map_err(|e| RunError::Setup(format!("microvm: write {}: {e}", path.display())))
}

/// The helper's command line.
fn helper_argv(init: &Path, dir: &WorkDir) -> Vec<String> {
    vec![
        init.display().to_string(),
        "host".into(),
        dir.path().display().to_string(),
    ]
}

/// One sandbox of the helper: a task restored from its template, or a
/// template boot (no task; QEMU writes the snapshot into `template_out`).
struct VmChild<'a> {
    rt: &'a Microvm,
    /// The tool's name, for the outcome's reason.
    tool: String,
    job: Job,
    template_out: Option<PathBuf>,
}

impl Child for VmChild<'_> {
    fn name(&self) -> &'static str {
        "microvm"
    }

    fn leftover(&self) -> &'static str {
        LEFTOVER
    }

    fn problems(&self) -> Vec<String> {
        self.rt.problems()
    }

    fn state_dir(&self) -> Result<&Path, String> {
        self.rt.found().state.as_deref().map_err(Clone::clone)
    }

    /// The job (the guest, its snapshot and the task) and the helper
    /// that runs it.
    fn launch(&self, spec: &SandboxSpec, guest: &Guest, dir: &WorkDir) -> Result<Launch, RunError> {
        let init = self
            .rt
            .found()
            .init
            .as_ref()
            .map_err(|e| RunError::Refused(format!("{}: runtime microvm: {e}", spec.tool)))?;
        let mut job = self.job.clone();
        if let Some(out) = &self.template_out {
            // The snapshot goes straight into the store's temporary
            // directory (QEMU's, like the rest of the guest's directory).
            let vm_dir = dir.path().join(host::VM_DIR);
            std::os::unix::fs::symlink(out, &vm_dir).map_err(|e| {
                RunError::Setup(format!("{}: microvm: {}: {e}", spec.tool, vm_dir.display()))
            })?;
        } else {
            job.task = Some(task(spec, guest, self.rt.jail()).map_err(|e| {
                RunError::Setup(format!(
                    "{}: microvm: the task's seccomp filters: {e}",
                    spec.tool
                ))
            })?);
        }
        write_job(dir, &job)?;
        Ok(Launch {
            argv: helper_argv(init, dir),
            cleanup: Vec::new(),
            limits: Some(vmm_limits(spec, &job.vm)),
            on_end: None,
            // A cold boot's time on top of the tool's wall clock, which
            // the helper keeps from the task's start.
            boot: if job.start == Start::Cold {
                BOOT_TIMEOUT
            } else {
                Duration::ZERO
            },
        })
    }

    /// The guest's end, from the helper's status file.
    fn finish(&self, dir: &WorkDir, out: &mut Outcome) {
        let path = dir.path().join(host::STATUS);
        let Ok(text) = fs::read(&path) else {
            return;
        };
        let Ok(st) = serde_json::from_slice::<host::Status>(&text) else {
            out.reason = format!("{}; unreadable guest status", out.reason);
            return;
        };
        if let Some(e) = &st.net_error {
            out.warnings.push(format!(
                "the guest broke its network channel's protocol, and its network was cut: {e}"
            ));
        }
        if !matches!(out.status, Status::Ok | Status::Exited) {
            return;
        }
        match st.end {
            End::Exited { code } => {
                out.exit_code = Some(code);
                out.signal = None;
            }
            End::Signaled { signal, oom } => {
                out.exit_code = None;
                out.signal = Some(signal);
                if oom {
                    out.status = Status::MemoryLimit;
                    out.reason = format!(
                        "{}: killed at its memory limit in the guest (the OOM killer, or stalled on memory at the limit)",
                        out.reason
                    );
                } else {
                    out.status = Status::Exited;
                    out.reason = format!("killed by signal {signal} in the guest");
                }
            }
            End::GuestError { stage, message } => {
                out.status = Status::Exited;
                out.exit_code = Some(127);
                out.reason = format!("the guest could not run the tool ({stage}): {message}");
            }
            End::GuestDied { panic, console } => {
                out.status = Status::Exited;
                out.exit_code = None;
                let last: String = console
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("")
                    .chars()
                    .take(200)
                    .collect();
                out.reason = if panic {
                    format!("the guest kernel panicked: {last}")
                } else {
                    format!("the guest died without a status: {last}")
                };
            }
            End::WallClock { after_ms } => {
                out.status = Status::TimedOut;
                out.exit_code = None;
                out.signal = None;
                out.reason = format!(
                    "{}: timed out after {} (the tool's wall clock, kept from the task's start: the guest booted cold)",
                    self.tool,
                    cordon_sandbox::units::format_duration(Duration::from_millis(after_ms))
                );
            }
            End::HostError { message } => {
                out.status = Status::Exited;
                out.exit_code = None;
                out.reason = format!("microvm host side: {message}");
            }
            End::Snapshotted => {}
        }
    }
}

impl Runtime for Microvm {
    fn name(&self) -> &'static str {
        "microvm"
    }

    fn check(&self, spec: &SandboxSpec) -> Check {
        let mut problems: Vec<crate::Problem> =
            self.problems().into_iter().map(Into::into).collect();
        if !matches!(spec.root, Root::Image { .. }) {
            problems.push(format!(
                "{}: runtime microvm runs an image (`image: NAME@sha256:...`): the guest's root is a block image made from it, and nothing of the host's file system is shared into the guest",
                spec.tool
            ).into());
        }
        if let Some(m) = spec.mounts.first() {
            problems.push(crate::Problem::at_bind(
                &m.src,
                format!(
                    "mount {}:{}: runtime microvm shares no host directory into the guest",
                    m.src.display(),
                    m.dst.display()
                ),
            ));
        }
        if spec.workspace.is_some() || spec.state.is_some() {
            problems.push(
                format!(
                    "{}: runtime microvm has no workspace or state volumes yet",
                    spec.tool
                )
                .into(),
            );
        }
        Check {
            mechanisms: self.mechanisms(spec),
            problems,
        }
    }

    fn run(&self, spec: &SandboxSpec, input: Vec<u8>, ctx: &Context) -> Result<Outcome, RunError> {
        let child = self.task_child(spec, ctx)?;
        self.sup.run(&child, spec, input, ctx)
    }

    fn spawn(&self, spec: &SandboxSpec, ctx: &Context) -> Result<Spawned, RunError> {
        let child = self.task_child(spec, ctx)?;
        self.sup.spawn(&child, spec, ctx)
    }

    /// The image's block disk and, for `boot: snapshot`, its template.
    fn prepare(&self, spec: &SandboxSpec, ctx: &Context) -> Result<(), RunError> {
        self.parts(spec, ctx).map(|_| ())
    }

    fn facts(&self) -> Facts {
        let spec = SandboxSpec::new("doctor", ["/bin/true"]);
        let f = self.found();
        let mut notes = Vec::new();
        match &f.qemu {
            Ok(q) => notes.push(format!(
                "QEMU {} ({}){}",
                q.path.display(),
                q.version,
                if q.sandbox {
                    ", -sandbox on"
                } else {
                    ", no -sandbox (built without seccomp)"
                }
            )),
            Err(e) => notes.push(format!("refused: {e}")),
        }
        match &f.kernel {
            Ok(k) => notes.push(format!(
                "guest kernel {} ({}), modules {}",
                k.path.display(),
                k.release,
                k.modules
                    .as_ref()
                    .map_or("built in".to_string(), |m| m.display().to_string())
            )),
            Err(e) => notes.push(format!("refused: {e}")),
        }
        match &f.init {
            Ok(p) => notes.push(format!("guest init {}", p.display())),
            Err(e) => notes.push(format!("refused: {e}")),
        }
        if self.parts_problem().is_none() {
            match self.accel() {
                (Accel::Kvm, _) => notes.push("accelerator: kvm".into()),
                (Accel::Tcg, why) => notes.push(format!(
                    "accelerator: tcg (emulation; a microvm tool must `accept: [kvm]`): {}",
                    why.unwrap_or_default()
                )),
            }
        }
        for (what, d) in [("state", &f.state), ("store", &f.store)] {
            match d {
                Ok(p) => notes.push(format!("{what}: {}", p.display())),
                Err(e) => notes.push(format!("refused: {what}: {e}")),
            }
        }
        notes.push("network: no NIC; egress through the proxy door only, over a virtio channel (the guest's init listens on its loopback at the door's port)".into());
        notes.extend(f.notes.iter().cloned());
        Facts {
            runtime: "microvm",
            mechanisms: self.mechanisms(&spec),
            notes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qemu_versions() {
        assert_eq!(
            parse_qemu_version(
                "QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-1~bpo12+1)\nCopyright"
            ),
            Some((10, 0))
        );
        assert_eq!(
            parse_qemu_version("QEMU emulator version 7.2.15 (Debian 1:7.2+dfsg-7+deb12u12)"),
            Some((7, 2))
        );
        assert_eq!(parse_qemu_version("nothing"), None);
    }
}
