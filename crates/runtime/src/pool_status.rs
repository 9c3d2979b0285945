//! What the pools of a running `cordon serve` hold now, for `cordon
//! doctor`: the warm pools of `mcp:` servers (`mcp: {warm: N}`) and of
//! command tools (`lifetime: pool`).
//!
//! Every pool keeps its entry on one board of this process
//! ([`update`]); a process that [`publish`]es it writes the board to
//! `<pid>.json` in `pools` under cordon's state directory on every change
//! (a temporary file renamed over it, so a reader never sees half of one)
//! and holds an exclusive `flock` on `<pid>.lock` there for as long as it
//! serves. Both are removed when the [`Published`] guard drops. A reader
//! ([`live`]) trusts a status file only while its lock is held: one whose
//! lock it can take was left by a process that ended without removing it
//! (killed), and is removed.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// One pool's state.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PoolState {
    /// `mcp` (a warm `mcp:` server's pool) or `command` (`lifetime: pool`).
    pub kind: String,
    pub tool: String,
    /// The tenant whose pool it is (for a command tool's pool: the
    /// broker's label of it).
    pub tenant: String,
    /// Sandboxes the manifest keeps ready.
    pub size: usize,
    /// Ready and waiting for a session or task.
    pub ready: usize,
    /// Starts under way.
    pub starting: usize,
    /// Handed to a session (or task) so far.
    pub handed_out: u64,
    /// Starts (or warm-ups) that failed so far, and sandboxes that ended
    /// while they waited.
    pub refill_failures: u64,
    /// The last failure's reason.
    pub last_failure: Option<String>,
    /// Why the refill stopped, if it did.
    pub stopped: Option<String>,
}

/// A status file: one serving process's pools.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusFile {
    pub pid: u32,
    /// Seconds since the epoch of its last change.
    pub updated: u64,
    pub pools: Vec<PoolState>,
}

struct Board {
    pools: BTreeMap<(String, String), PoolState>,
    out: Option<(PathBuf, u64)>,
}

static BOARD: Mutex<Board> = Mutex::new(Board {
    pools: BTreeMap::new(),
    out: None,
});

/// Counts the publications (one file at a time).
static GENERATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn board() -> std::sync::MutexGuard<'static, Board> {
    BOARD.lock().unwrap_or_else(|p| p.into_inner())
}

/// `pools` under cordon's state directory `state`.
pub fn dir_in(state: &Path) -> PathBuf {
    state.join("pools")
}

/// Change the entry of the pool `key` (made with `kind`, `tool` and
/// `tenant` if new), and write the board if it is published.
pub fn update(kind: &str, key: &str, tool: &str, tenant: &str, f: impl FnOnce(&mut PoolState)) {
    let mut b = board();
    let e = b
        .pools
        .entry((kind.to_string(), key.to_string()))
        .or_insert_with(|| PoolState {
            kind: kind.to_string(),
            tool: tool.to_string(),
            tenant: tenant.to_string(),
            ..Default::default()
        });
    f(e);
    write(&b);
}

/// Every pool's entry on this process's board.
pub fn snapshot() -> Vec<PoolState> {
    board().pools.values().cloned().collect()
}

/// Remove the entry of the pool `key` (it ended).
pub fn remove(kind: &str, key: &str) {
    let mut b = board();
    if b.pools
        .remove(&(kind.to_string(), key.to_string()))
        .is_some()
    {
        write(&b);
    }
}

fn write(b: &Board) {
    let Some((dir, _)) = &b.out else {
        return;
    };
    let pid = std::process::id();
    let file = StatusFile {
        pid,
        updated: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        pools: b.pools.values().cloned().collect(),
    };
    let Ok(text) = serde_json::to_vec_pretty(&file) else {
        return;
    };
    let tmp = dir.join(format!(".{pid}.json.tmp"));
    let put = || -> std::io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(&text)?;
        f.sync_data()?;
        fs::rename(&tmp, dir.join(format!("{pid}.json")))
    };
    if let Err(e) = put() {
        tracing::debug!("pool status in {}: {e}", dir.display());
    }
}

/// Holds the lock of a published board; removes its files when dropped.
pub struct Published {
    dir: PathBuf,
    generation: u64,
    _lock: File,
}

impl Drop for Published {
    fn drop(&mut self) {
        let mut b = board();
        if b.out.as_ref().is_some_and(|(_, g)| *g == self.generation) {
            b.out = None;
        }
        drop(b);
        let pid = std::process::id();
        let _ = fs::remove_file(self.dir.join(format!("{pid}.json")));
        let _ = fs::remove_file(self.dir.join(format!("{pid}.lock")));
    }
}

/// Publish this process's board in `dir` (made 0700 if missing) until
/// the guard drops.
pub fn publish(dir: &Path) -> Result<Published, String> {
    let ctx = |what: &str, p: &Path, e: std::io::Error| format!("{what} {}: {e}", p.display());
    fs::create_dir_all(dir).map_err(|e| ctx("create", dir, e))?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        let _ = fs::set_permissions(dir, fs::Permissions::from_mode(0o700));
    }
    let pid = std::process::id();
    let lock_path = dir.join(format!("{pid}.lock"));
    let lock = File::create(&lock_path).map_err(|e| ctx("create", &lock_path, e))?;
    lock.try_lock().map_err(|e| match e {
        fs::TryLockError::WouldBlock => format!("{} is held already", lock_path.display()),
        fs::TryLockError::Error(e) => ctx("flock", &lock_path, e),
    })?;
    let generation = GENERATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut b = board();
    b.out = Some((dir.to_path_buf(), generation));
    write(&b);
    Ok(Published {
        dir: dir.to_path_buf(),
        generation,
        _lock: lock,
    })
}

/// The status files in `dir` of processes still serving (their lock is
/// held), by pid. Files left by a process that ended are removed.
pub fn live(dir: &Path) -> Vec<StatusFile> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_suffix(".json")
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let lock_path = dir.join(format!("{pid}.lock"));
        let held = match File::open(&lock_path) {
            Ok(f) => match f.try_lock_shared() {
                Ok(()) => false,
                Err(fs::TryLockError::WouldBlock) => true,
                Err(fs::TryLockError::Error(_)) => false,
            },
            Err(_) => false,
        };
        if !held {
            let _ = fs::remove_file(e.path());
            let _ = fs::remove_file(&lock_path);
            let _ = fs::remove_file(dir.join(format!(".{pid}.json.tmp")));
            continue;
        }
        if let Ok(text) = fs::read(e.path())
            && let Ok(f) = serde_json::from_slice::<StatusFile>(&text)
        {
            out.push(f);
        }
    }
    out.sort_by_key(|f| f.pid);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_published_board_is_live_while_held_and_a_left_one_is_not() {
        let dir = std::env::temp_dir().join(format!("cordon-pool-status-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        // A status file whose lock nobody holds (a killed serve's).
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("4000000.json"),
            r#"{"pid":4000000,"updated":0,"pools":[]}"#,
        )
        .unwrap();
        fs::write(dir.join("4000000.lock"), "").unwrap();
        let guard = publish(&dir).unwrap();
        update("mcp", "default/t", "t", "default", |e| {
            e.size = 2;
            e.ready = 1;
        });
        let live_now = live(&dir);
        assert_eq!(live_now.len(), 1, "{live_now:?}");
        assert_eq!(live_now[0].pid, std::process::id());
        let t = live_now[0].pools.iter().find(|p| p.tool == "t").unwrap();
        assert_eq!((t.size, t.ready, t.kind.as_str()), (2, 1, "mcp"));
        assert!(!dir.join("4000000.json").exists());
        drop(guard);
        assert!(live(&dir).is_empty());
        assert!(!dir.join(format!("{}.json", std::process::id())).exists());
        remove("mcp", "default/t");
        let _ = fs::remove_dir_all(&dir);
    }
}
