//! Session workspaces and per-tenant state: the read-write places a
//! sandbox gets besides its own `/tmp`, made by the broker and bound into
//! every sandbox of a tool that declares them.
//!
//! - A **workspace** belongs to one (tenant, session): a tmpfs of the
//!   declared size mounted by the broker on
//!   `<run dir>/workspaces/<tenant>/<hash of the session id>`, made at the
//!   session's first call that needs it and bound at each tool's `mount`
//!   (so every tool of the session that declares one sees the same files).
//!   When the session ends it is unmounted (lazily: a sandbox still
//!   running keeps its view until it ends) and its mount point removed,
//!   at once or `retain` seconds later. Nothing a tool wrote there is read,
//!   walked or deleted file by file: dropping the tmpfs drops it all, so
//!   a symlink a tool planted is never followed.
//! - A **state** belongs to one (tenant, tool): an ext4 image of the
//!   declared size under `<state dir>/tool-state/<tenant>/<tool>.ext4`, loop-mounted
//!   (nosuid, nodev) on `<run dir>/state/<tenant>/<tool>` at its first use,
//!   held under an exclusive lock by this broker, kept across sessions,
//!   unmounted when the broker ends, removed with `cordon state rm`.
//!
//! Sizes are enforced by the file system itself: a write past the size
//! fails with ENOSPC in the tool, and nothing of it reaches the host's
//! disk but the state image's fixed size. Both need root (a mount on the
//! host); an unprivileged broker refuses tools that declare either, so
//! that no size is merely advisory.
//!
//! Tenants and tools name directories only once validated
//! ([`valid_component`]); a session id is hashed, so that no id can
//! traverse a path.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use cordon_policy::policy;

use crate::spec::SandboxSpec;

/// A read-write bind of a directory the broker made.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Volume {
    /// The directory on the host.
    pub src: PathBuf,
    /// Absolute path inside the sandbox.
    pub dst: PathBuf,
    /// `workspace` or `state`, for messages.
    pub what: &'static str,
}

/// How sizes are enforced on this host, for `cordon doctor` and refusals.
pub fn mechanism() -> Result<&'static str, String> {
    if cordon_sys::io::geteuid() == 0 {
        Ok(
            "workspaces: a size-limited tmpfs per session; state: a loop-mounted ext4 image per tenant and tool",
        )
    } else {
        Err("a workspace's or state's size is enforced by a file system cordon mounts on the host, which needs root; this broker is not root, so tools that declare `workspace` or `state` are refused".into())
    }
}

pub use cordon_config::valid_name_component as valid_component;

fn component<'a>(what: &str, s: &'a str) -> Result<&'a str, String> {
    cordon_config::check_name_component(what, s)
}

/// A session id's directory name: a hash, so that no id traverses a path.
fn session_key(session: &str) -> String {
    use sha2::{Digest, Sha256};
    let d = Sha256::digest(session.as_bytes());
    d.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// The default directories (see `cordon_dirs`): cordon's runtime
/// directory (`CORDON_RUN_DIR`, else `/run/cordon` as root) for the
/// mounts, and `tool-state` under its state directory (`CORDON_STATE_DIR`,
/// else `/var/lib/cordon` as root) for the state images. `Err`: there is
/// no safe place for one of them (which variable to set).
pub fn default_dirs() -> Result<(PathBuf, PathBuf), String> {
    let dirs = cordon_dirs::Dirs::current();
    let run = dirs.runtime().map_err(|e| e.to_string())?;
    let state = dirs.tool_state().map_err(|e| e.to_string())?;
    Ok((run, state))
}

struct Workspace {
    dir: PathBuf,
    size: u64,
    /// When it is destroyed, once its session has ended.
    expires: Option<Instant>,
}

struct StateMount {
    dir: PathBuf,
    /// The exclusive lock on the image, held while it is mounted.
    _lock: File,
}

#[derive(Default)]
struct Inner {
    workspaces: HashMap<(String, String), Workspace>,
    states: HashMap<(String, String), StateMount>,
    reaper: bool,
}

/// The broker's workspaces and states.
pub struct Volumes {
    run_dir: PathBuf,
    state_dir: PathBuf,
    /// Host uid and gid of the sandboxes: the owner of each volume's root
    /// (a placement's `host_ids`, a tenant's own, take its place).
    owner: (u32, u32),
    /// Why there are no directories for volumes (every volume is refused
    /// with it).
    unplaced: Option<String>,
    inner: Mutex<Inner>,
}

impl std::fmt::Debug for Volumes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Volumes")
            .field("run_dir", &self.run_dir)
            .field("state_dir", &self.state_dir)
            .finish_non_exhaustive()
    }
}

/// A directory made with `mode`, owned by the broker, not a symlink.
fn own_dir(p: &Path, mode: u32) -> Result<(), String> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(p)
        .map_err(|e| format!("creating {}: {e}", p.display()))?;
    let m = std::fs::symlink_metadata(p).map_err(|e| format!("{}: {e}", p.display()))?;
    if !m.is_dir() || m.uid() != cordon_sys::io::geteuid() {
        return Err(format!(
            "{} is not a directory of uid {}",
            p.display(),
            cordon_sys::io::geteuid()
        ));
    }
    Ok(())
}

impl Volumes {
    /// Workspaces and state mounts under `run_dir`, state images under
    /// `state_dir`, owned by host uid and gid `owner` (the sandboxes').
    pub fn new(run_dir: PathBuf, state_dir: PathBuf, owner: (u32, u32)) -> Arc<Volumes> {
        Arc::new(Volumes {
            run_dir,
            state_dir,
            owner,
            unplaced: None,
            inner: Mutex::new(Inner::default()),
        })
    }

    /// Volumes in the [`default_dirs`], or, when those have no safe place,
    /// none: every workspace and state is refused, saying why.
    pub fn at_default_dirs(owner: (u32, u32)) -> Arc<Volumes> {
        match default_dirs() {
            Ok((run_dir, state_dir)) => Volumes::new(run_dir, state_dir, owner),
            Err(why) => Arc::new(Volumes {
                run_dir: PathBuf::new(),
                state_dir: PathBuf::new(),
                owner,
                unplaced: Some(why),
                inner: Mutex::new(Inner::default()),
            }),
        }
    }

    /// The state images' directory.
    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The read-write binds a sandbox of `spec` run under `host_ids` (the
    /// shared ones: `None`) gets for `tenant`'s `session`: its workspace (made now if the session has none yet)
    /// and its state (mounted now if this broker has not yet). `Err`: why
    /// not (the call is refused; nothing runs without its size enforced).
    pub fn prepare(
        self: &Arc<Self>,
        spec: &SandboxSpec,
        host_ids: Option<(u32, u32)>,
        tenant: &str,
        session: &str,
    ) -> Result<Vec<Volume>, String> {
        if spec.workspace.is_none() && spec.state.is_none() {
            return Ok(Vec::new());
        }
        mechanism().map_err(|e| format!("{}: {e}", spec.tool))?;
        let tenant = component("tenant", tenant)?;
        // The sandbox's host ids: the tenant's own where the broker gave it
        // some, else the shared ones.
        let owner = host_ids.unwrap_or(self.owner);
        let mut out = Vec::new();
        if let Some(w) = &spec.workspace {
            out.push(Volume {
                src: self.workspace(w, tenant, session, owner)?,
                dst: PathBuf::from(&w.mount),
                what: "workspace",
            });
        }
        if let Some(s) = &spec.state {
            out.push(Volume {
                src: self.state(s, tenant, component("tool", &spec.tool)?, owner)?,
                dst: PathBuf::from(&s.mount),
                what: "state",
            });
        }
        Ok(out)
    }

    fn tmpfs_options(size: u64, owner: (u32, u32)) -> String {
        format!(
            "size={size},nr_inodes={},mode=0700,uid={},gid={}",
            (size / 4096).clamp(64, 1 << 20),
            owner.0,
            owner.1
        )
    }

    fn workspace(
        self: &Arc<Self>,
        w: &policy::Workspace,
        tenant: &str,
        session: &str,
        owner: (u32, u32),
    ) -> Result<PathBuf, String> {
        if let Some(why) = &self.unplaced {
            return Err(why.clone());
        }
        let key = (tenant.to_string(), session.to_string());
        let mut inner = self.lock();
        if let Some(ws) = inner.workspaces.get_mut(&key) {
            // A session that calls again within `retain` keeps its files.
            ws.expires = None;
            if w.size_bytes > ws.size {
                cordon_sys::mount::remount_tmpfs(
                    &ws.dir,
                    &Self::tmpfs_options(w.size_bytes, owner),
                )
                .map_err(|e| {
                    format!(
                        "growing the workspace {} to {}: {e}",
                        ws.dir.display(),
                        w.size_bytes
                    )
                })?;
                ws.size = w.size_bytes;
            }
            return Ok(ws.dir.clone());
        }
        // Searchable, not listable: a sandbox's setup reaches its own
        // directory by path, as the sandbox's host uid.
        let parent = self.run_dir.join("workspaces").join(tenant);
        own_dir(&self.run_dir, 0o711)?;
        own_dir(&self.run_dir.join("workspaces"), 0o711)?;
        own_dir(&parent, 0o711)?;
        let dir = parent.join(session_key(session));
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            // Left by a broker that died: whatever is mounted there goes.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                while cordon_sys::mount::unmount_detach(&dir).is_ok() {}
            }
            Err(e) => return Err(format!("creating {}: {e}", dir.display())),
        }
        cordon_sys::mount::mount_tmpfs(&dir, &Self::tmpfs_options(w.size_bytes, owner))
            .map_err(|e| format!("mounting the workspace's tmpfs on {}: {e}", dir.display()))?;
        inner.workspaces.insert(
            key,
            Workspace {
                dir: dir.clone(),
                size: w.size_bytes,
                expires: None,
            },
        );
        Ok(dir)
    }

    fn state(
        &self,
        s: &policy::State,
        tenant: &str,
        tool: &str,
        owner: (u32, u32),
    ) -> Result<PathBuf, String> {
        if let Some(why) = &self.unplaced {
            return Err(why.clone());
        }
        let key = (tenant.to_string(), tool.to_string());
        let mut inner = self.lock();
        if let Some(m) = inner.states.get(&key) {
            return Ok(m.dir.clone());
        }
        own_dir(&self.state_dir, 0o700)?;
        let images = self.state_dir.join(tenant);
        own_dir(&images, 0o700)?;
        let image = images.join(format!("{tool}.ext4"));
        let lock = lock_image(&images, tool)?;
        if !image.exists() {
            make_image(&image, s.size_bytes, owner)?;
        }
        own_dir(&self.run_dir, 0o711)?;
        own_dir(&self.run_dir.join("state"), 0o711)?;
        let parent = self.run_dir.join("state").join(tenant);
        own_dir(&parent, 0o711)?;
        let dir = parent.join(tool);
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                // We hold the image's lock: a mount left here is stale.
                while cordon_sys::mount::unmount_detach(&dir).is_ok() {}
            }
            Err(e) => return Err(format!("creating {}: {e}", dir.display())),
        }
        let out = std::process::Command::new("mount")
            .args(["-t", "ext4", "-o", "loop,nosuid,nodev"])
            .arg(&image)
            .arg(&dir)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| format!("running mount for {}: {e}", image.display()))?;
        if !out.status.success() {
            return Err(format!(
                "mounting the state image {}: {}",
                image.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        inner.states.insert(
            key,
            StateMount {
                dir: dir.clone(),
                _lock: lock,
            },
        );
        Ok(dir)
    }

    /// `tenant`'s `session` has ended: its workspace is destroyed now, or
    /// after the `retain` seconds of `retain` (the longest any of the
    /// session's tools declares).
    pub fn end_session(self: &Arc<Self>, tenant: &str, session: &str, retain: Duration) {
        let key = (tenant.to_string(), session.to_string());
        let mut inner = self.lock();
        if retain.is_zero() {
            if let Some(ws) = inner.workspaces.remove(&key) {
                drop(inner);
                destroy(&ws.dir);
            }
            return;
        }
        let Some(ws) = inner.workspaces.get_mut(&key) else {
            return;
        };
        ws.expires = Some(Instant::now() + retain);
        if !inner.reaper {
            inner.reaper = true;
            let weak = Arc::downgrade(self);
            let spawned = std::thread::Builder::new()
                .name("cordon-workspace-reaper".into())
                .spawn(move || reaper(weak));
            if spawned.is_err() {
                inner.reaper = false;
            }
        }
    }

    /// Destroy every workspace whose `retain` has passed. Each is unmounted
    /// before it leaves the table (under its lock): while it is counted it
    /// may still be mounted, never the other way round.
    pub fn reap(&self) {
        let now = Instant::now();
        let mut inner = self.lock();
        let keys: Vec<_> = inner
            .workspaces
            .iter()
            .filter(|(_, w)| w.expires.is_some_and(|e| e <= now))
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            if let Some(w) = inner.workspaces.get(&k) {
                destroy(&w.dir);
            }
            inner.workspaces.remove(&k);
        }
    }

    /// One warning per volume of a finished sandbox that is full: a write
    /// past its size failed with ENOSPC there (for the call's audit
    /// record). Reads the file system's counters, nothing a tool wrote.
    pub fn full(volumes: &[Volume]) -> Vec<String> {
        volumes
            .iter()
            .filter_map(|v| {
                let (total, free) = cordon_sys::mount::space(&v.src).ok()?;
                // Less than one page free: a write has hit the size.
                (free < 4096).then(|| {
                    format!(
                        "the {} at {} is full ({total} bytes): writes past its size fail with ENOSPC",
                        v.what,
                        v.dst.display()
                    )
                })
            })
            .collect()
    }

    /// How many workspaces exist (for tests and `cordon doctor`).
    pub fn workspace_count(&self) -> usize {
        self.lock().workspaces.len()
    }
}

fn reaper(weak: Weak<Volumes>) {
    loop {
        std::thread::sleep(Duration::from_millis(500));
        let Some(v) = weak.upgrade() else { return };
        v.reap();
    }
}

/// Unmount a workspace and remove its now empty mount point: nothing in it
/// is walked, so nothing a tool planted there is followed.
fn destroy(dir: &Path) {
    if let Err(e) = cordon_sys::mount::unmount_detach(dir) {
        tracing::warn!("unmounting the workspace {}: {e}", dir.display());
        return;
    }
    if let Err(e) = std::fs::remove_dir(dir) {
        tracing::warn!(
            "removing the workspace's mount point {}: {e}",
            dir.display()
        );
    }
}

impl Drop for Volumes {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        for (_, w) in inner.workspaces.drain() {
            destroy(&w.dir);
        }
        for (_, s) in inner.states.drain() {
            if let Err(e) = cordon_sys::mount::unmount_detach(&s.dir) {
                tracing::warn!("unmounting the state {}: {e}", s.dir.display());
            }
            let _ = std::fs::remove_dir(&s.dir);
        }
    }
}

/// The exclusive lock of a state image (`<tool>.lock` beside it): one
/// broker mounts an image at a time.
fn lock_image(images: &Path, tool: &str) -> Result<File, String> {
    let path = images.join(format!("{tool}.lock"));
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| format!("opening {}: {e}", path.display()))?;
    match f.try_lock() {
        Ok(()) => Ok(f),
        Err(std::fs::TryLockError::WouldBlock) => Err(format!(
            "the state {} is in use by another cordon process",
            path.with_extension("ext4").display()
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(format!("locking {}: {e}", path.display())),
    }
}

/// A new ext4 image of `size` bytes whose root directory `owner` owns,
/// no blocks reserved for root.
fn make_image(image: &Path, size: u64, owner: (u32, u32)) -> Result<(), String> {
    let tmp = image.with_extension("ext4.new");
    let f = File::create(&tmp).map_err(|e| format!("creating {}: {e}", tmp.display()))?;
    f.set_len(size)
        .map_err(|e| format!("sizing {}: {e}", tmp.display()))?;
    drop(f);
    let out = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-m", "0", "-E"])
        .arg(format!("root_owner={}:{}", owner.0, owner.1))
        .arg(&tmp)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("running mkfs.ext4 (e2fsprogs) for {}: {e}", tmp.display()))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!(
            "mkfs.ext4 {}: {}",
            tmp.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    std::fs::rename(&tmp, image).map_err(|e| format!("renaming {}: {e}", tmp.display()))
}

/// One tenant's state of one tool, as `cordon state ls` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StateEntry {
    pub tenant: String,
    pub tool: String,
    /// The image's size in bytes.
    pub size: u64,
}

/// Every state image under `state_dir`.
pub fn list_states(state_dir: &Path) -> Result<Vec<StateEntry>, String> {
    let mut out = Vec::new();
    let tenants = match std::fs::read_dir(state_dir) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(format!("{}: {e}", state_dir.display())),
    };
    for t in tenants.flatten() {
        let tenant = t.file_name().to_string_lossy().into_owned();
        if !valid_component(&tenant) || !t.file_type().is_ok_and(|f| f.is_dir()) {
            continue;
        }
        let Ok(images) = std::fs::read_dir(t.path()) else {
            continue;
        };
        for i in images.flatten() {
            let name = i.file_name().to_string_lossy().into_owned();
            let Some(tool) = name.strip_suffix(".ext4") else {
                continue;
            };
            if !valid_component(tool) || !i.file_type().is_ok_and(|f| f.is_file()) {
                continue;
            }
            out.push(StateEntry {
                tenant: tenant.clone(),
                tool: tool.to_string(),
                size: i.metadata().map(|m| m.len()).unwrap_or(0),
            });
        }
    }
    out.sort_by(|a, b| (&a.tenant, &a.tool).cmp(&(&b.tenant, &b.tool)));
    Ok(out)
}

/// Remove `tenant`'s state of `tool`: refused while a broker has it
/// mounted. `Ok(false)`: there was none.
pub fn remove_state(state_dir: &Path, tenant: &str, tool: &str) -> Result<bool, String> {
    let tenant = component("tenant", tenant)?;
    let tool = component("tool", tool)?;
    let images = state_dir.join(tenant);
    let image = images.join(format!("{tool}.ext4"));
    match std::fs::symlink_metadata(&image) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(format!("{}: {e}", image.display())),
        Ok(m) if !m.is_file() => {
            return Err(format!("{} is not a state image", image.display()));
        }
        Ok(_) => {}
    }
    let _lock = lock_image(&images, tool)?;
    std::fs::remove_file(&image).map_err(|e| format!("removing {}: {e}", image.display()))?;
    let _ = std::fs::remove_file(images.join(format!("{tool}.lock")));
    Ok(true)
}
