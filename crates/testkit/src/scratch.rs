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
//! is removed when its [`Scratch`] is dropped.

use std::ffi::OsStr;
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
pub struct Scratch(pub PathBuf);

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
    }
}

/// A fresh scratch directory named `cordon-test-…`.
pub fn scratch() -> Scratch {
    named("cordon-test-")
}

/// A fresh scratch directory whose name starts with `prefix`.
pub fn named(prefix: &str) -> Scratch {
    let base = root();
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
    Scratch(d)
}
