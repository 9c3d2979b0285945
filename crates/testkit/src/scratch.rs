//! The one place tests keep their temporary files.
//!
//! Not under `/tmp`, nor anywhere else a sandbox builds itself (`/tmp`,
//! `/etc`, `/proc`, `/dev`, `/sys`): tests mount their scratch files into
//! sandboxes at the same path, and `cordon import` rightly refuses a host
//! path that cannot be mounted where it is. Not under the checkout either,
//! whose location is nobody's to assume (a clone under `/tmp` puts
//! `target/tmp` there; one under a private home cannot be entered by the
//! uid 65534 the tests re-run as). `/var/tmp` is on every Linux, every uid
//! can write there, and a sandbox does not build it; `CORDON_TEST_SCRATCH`
//! names another directory.
//!
//! Each directory has a fresh unpredictable name, mode 0755 (sandboxed
//! tools run as other uids and must reach what the test gives them), and
//! is removed when its [`Scratch`] is dropped. One a test process keeps to
//! its end (in a `static`, never dropped) is removed by the next test
//! process that makes a scratch directory: beside each directory is a
//! `NAME.cordon-scratch-lock` file its process holds locked while it lives, and a lock
//! nobody holds is a directory nobody uses.

use std::ffi::OsStr;
use std::fs::File;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Set to a directory to keep the tests' scratch directories there.
pub const SCRATCH_ENV: &str = "CORDON_TEST_SCRATCH";

/// Where scratch directories are made.
pub fn root() -> PathBuf {
    std::env::var_os(SCRATCH_ENV)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/tmp"))
}

/// A directory removed (with all it holds) on drop.
#[derive(Debug)]
pub struct Scratch(pub PathBuf, Option<File>);

impl Scratch {
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<OsStr> for Scratch {
    fn as_ref(&self) -> &OsStr {
        self.0.as_os_str()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
        if self.1.take().is_some() {
            let _ = std::fs::remove_file(lock_path(&self.0));
        }
    }
}

/// The end of a lock file's name: distinct, so that a sweep never takes
/// another program's lock and directory for a test's.
const LOCK_SUFFIX: &str = ".cordon-scratch-lock";

/// The lock file beside `dir`.
fn lock_path(dir: &Path) -> PathBuf {
    let mut name = dir.as_os_str().to_owned();
    name.push(LOCK_SUFFIX);
    PathBuf::from(name)
}

/// `dir`'s lock, taken before it is put in place, so that no sweep ever
/// sees it unlocked while its process lives: `None` when it cannot be
/// made (the directory is then only removed on drop).
fn lock(dir: &Path) -> Option<File> {
    let mut new = dir.as_os_str().to_owned();
    new.push(LOCK_SUFFIX);
    new.push("-new");
    let new = PathBuf::from(new);
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&new)
        .ok()?;
    if f.try_lock().is_err() || std::fs::rename(&new, lock_path(dir)).is_err() {
        let _ = std::fs::remove_file(&new);
        return None;
    }
    let _ = std::fs::set_permissions(lock_path(dir), std::fs::Permissions::from_mode(0o644));
    Some(f)
}

/// Remove the scratch directories under `base` whose lock nobody holds
/// (their test process has ended without dropping them).
fn sweep(base: &Path) {
    let Ok(entries) = std::fs::read_dir(base) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(dir) = name.strip_suffix(LOCK_SUFFIX) else {
            continue;
        };
        let Ok(f) = File::open(e.path()) else {
            continue;
        };
        if f.try_lock().is_ok() {
            let _ = std::fs::remove_dir_all(base.join(dir));
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// A fresh scratch directory named `cordon-test-…`.
pub fn scratch() -> Scratch {
    named("cordon-test-")
}

/// A fresh scratch directory whose name starts with `prefix`.
pub fn named(prefix: &str) -> Scratch {
    named_in(&root(), prefix)
}

fn named_in(base: &Path, prefix: &str) -> Scratch {
    let base = base.to_path_buf();
    sweep(&base);
    let d = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in(&base)
        .unwrap_or_else(|e| {
            panic!(
                "cannot make a scratch directory in {} (set {SCRATCH_ENV} to another): {e}",
                base.display()
            )
        })
        .keep();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755))
        .unwrap_or_else(|e| panic!("chmod 0755 {}: {e}", d.display()));
    let lock = lock(&d);
    Scratch(d, lock)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory whose process ended without dropping it is removed by
    /// the next one made; one whose lock is held (the positive control)
    /// and one without a lock of ours stay.
    #[test]
    fn a_directory_nobody_holds_is_swept() {
        let base = named("cordon-sweep-");
        let live = named_in(&base, "live-");
        let mut dead = named_in(&base, "dead-");
        let foreign = base.join("foreign");
        std::fs::create_dir(&foreign).unwrap();
        std::fs::write(base.join("foreign.lock"), "").unwrap();
        assert!(lock_path(&dead).exists());
        // As its process's end would: the lock released, nothing removed.
        drop(dead.1.take());
        let dead_path = dead.0.clone();
        std::mem::forget(dead);
        let _next = named_in(&base, "next-");
        assert!(!dead_path.exists(), "{}", dead_path.display());
        assert!(!lock_path(&dead_path).exists());
        assert!(live.exists() && lock_path(&live).exists());
        assert!(foreign.exists());
        drop(live);
    }
}
