//! The host directory each sandbox mounts its new root on.
//!
//! A sandbox mounts a fresh tmpfs on this directory inside its own mount
//! namespace and pivots into it; nothing is ever written to the directory
//! on the host. So one directory serves every sandbox at once, and a
//! broker need not create and remove one of its own (a one-shot
//! `cordon exec` otherwise pays a mkdir and an rmdir per run, the rmdir
//! after the sandbox's mount namespace is torn down).
//!
//! The shared directory is `/run/cordon/root` for a root broker and
//! `$XDG_RUNTIME_DIR/cordon/root` for an unprivileged one; without
//! `XDG_RUNTIME_DIR`, `$TMPDIR/cordon-<uid>/root` (`/tmp` by default). It
//! is used only when every component is a real directory that nobody else
//! can replace: owned by the broker's uid (the top one by root or the
//! broker), writable by its owner alone (the top one may be a sticky
//! directory such as `/tmp`, whose entries only their owner can rename or
//! remove). Otherwise (another user made `cordon-<uid>` first, say) a
//! private temporary directory is made, removed when the broker lets go of
//! it; a broker killed before then leaves it behind, which the shared
//! directories never do.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// The mount point for sandbox roots.
#[derive(Debug)]
pub(crate) enum RootDir {
    /// Shared by every broker of this uid.
    Shared(PathBuf),
    /// Shared too, but under `TMPDIR` (no `XDG_RUNTIME_DIR`): a mount
    /// point only; no cgroup slots are kept there, as with a private one.
    InTmp(PathBuf),
    /// This broker's own, removed on drop.
    Temp(tempfile::TempDir),
}

impl RootDir {
    /// The shared directory when it is safe, else a new temporary one.
    pub(crate) fn new(euid: u32) -> io::Result<RootDir> {
        for c in shared_candidates(euid) {
            if prepare(c.path(), euid).is_ok() {
                return Ok(c);
            }
        }
        let t = tempfile::Builder::new().prefix("cordon-root-").tempdir()?;
        fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755))?;
        Ok(RootDir::Temp(t))
    }

    /// `<cordon dir>/slots` for the shared cgroup slots' lock files
    /// (mode 0700, checked like the rest), when the mount point is the
    /// shared one.
    pub(crate) fn slots_dir(&self, euid: u32) -> Option<PathBuf> {
        let RootDir::Shared(root) = self else {
            return None;
        };
        let slots = root.parent()?.join("slots");
        let m = existing_or_new(&slots, 0o700).ok()?;
        check_meta(&slots, &m, &[euid]).ok()?;
        Some(slots)
    }

    pub(crate) fn path(&self) -> &Path {
        match self {
            RootDir::Shared(p) | RootDir::InTmp(p) => p,
            RootDir::Temp(t) => t.path(),
        }
    }
}

/// Where the shared directory may be, best first.
fn shared_candidates(euid: u32) -> Vec<RootDir> {
    if euid == 0 {
        return vec![RootDir::Shared(PathBuf::from("/run/cordon/root"))];
    }
    let mut v = Vec::new();
    if let Some(xdg) = std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from)
        && xdg.is_absolute()
    {
        v.push(RootDir::Shared(xdg.join("cordon").join("root")));
    }
    let tmp = std::env::temp_dir();
    if tmp.is_absolute() {
        v.push(RootDir::InTmp(
            tmp.join(format!("cordon-{euid}")).join("root"),
        ));
    }
    v
}

/// Create `root` (and its parent `cordon` directory) as needed and check
/// every component; the directory above `cordon` must exist already.
fn prepare(root: &Path, euid: u32) -> io::Result<()> {
    let cordon = root.parent().ok_or_else(|| refuse(root, "has no parent"))?;
    let top = cordon
        .parent()
        .ok_or_else(|| refuse(cordon, "has no parent"))?;
    check_top(top, &[0, euid])?;
    for d in [cordon, root] {
        let m = existing_or_new(d, 0o755)?;
        check_meta(d, &m, &[euid])?;
        // A restrictive umask must not leave it untraversable for the
        // sandbox's uid.
        if m.mode() & 0o755 != 0o755 {
            fs::set_permissions(d, fs::Permissions::from_mode(0o755))?;
        }
    }
    Ok(())
}

/// The metadata of `d` (not following a symlink), made first with `mode`
/// if it does not exist: one system call when it does, as on every run
/// but the first.
fn existing_or_new(d: &Path, mode: u32) -> io::Result<fs::Metadata> {
    match fs::symlink_metadata(d) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            match fs::DirBuilder::new().mode(mode).create(d) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(e),
            }
            fs::symlink_metadata(d)
        }
        other => other,
    }
}

/// The directory the broker's own `cordon` directory is made in: as
/// [`check_meta`] asks, or writable by others but sticky (`/tmp`), where
/// nobody but its owner (or root) can rename or remove `cordon`.
fn check_top(d: &Path, owners: &[u32]) -> io::Result<()> {
    let m = fs::symlink_metadata(d)?;
    if m.file_type().is_dir() && owners.contains(&m.uid()) && m.mode() & 0o1000 != 0 {
        return Ok(());
    }
    check_meta(d, &m, owners)
}

fn check_meta(d: &Path, m: &fs::Metadata, owners: &[u32]) -> io::Result<()> {
    if !m.file_type().is_dir() {
        return Err(refuse(d, "is not a directory"));
    }
    if !owners.contains(&m.uid()) {
        return Err(refuse(d, "is owned by another user"));
    }
    if m.mode() & 0o022 != 0 {
        return Err(refuse(d, "is writable by group or others"));
    }
    Ok(())
}

fn refuse(d: &Path, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{} {why}", d.display()),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_directory_is_made_and_checked() {
        let euid = nix_euid();
        let top = tempfile::tempdir().unwrap();
        fs::set_permissions(top.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let root = top.path().join("cordon").join("root");
        prepare(&root, euid).unwrap();
        let m = fs::metadata(&root).unwrap();
        assert!(m.is_dir());
        assert_eq!(m.mode() & 0o777, 0o755);
        // Twice is fine.
        prepare(&root, euid).unwrap();
    }

    #[test]
    fn refuses_a_symlink_or_a_writable_directory() {
        let euid = nix_euid();
        let top = tempfile::tempdir().unwrap();
        fs::set_permissions(top.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), top.path().join("cordon")).unwrap();
        let e = prepare(&top.path().join("cordon").join("root"), euid).unwrap_err();
        assert!(e.to_string().contains("is not a directory"), "{e}");

        let top2 = tempfile::tempdir().unwrap();
        fs::set_permissions(top2.path(), fs::Permissions::from_mode(0o777)).unwrap();
        let e = prepare(&top2.path().join("cordon").join("root"), euid).unwrap_err();
        assert!(e.to_string().contains("writable by group or others"), "{e}");

        let top3 = tempfile::tempdir().unwrap();
        fs::set_permissions(top3.path(), fs::Permissions::from_mode(0o755)).unwrap();
        fs::DirBuilder::new()
            .mode(0o775)
            .create(top3.path().join("cordon"))
            .unwrap();
        fs::set_permissions(
            top3.path().join("cordon"),
            fs::Permissions::from_mode(0o775),
        )
        .unwrap();
        let e = prepare(&top3.path().join("cordon").join("root"), euid).unwrap_err();
        assert!(e.to_string().contains("writable by group or others"), "{e}");
    }

    #[test]
    fn a_sticky_top_is_accepted_and_a_cordon_directory_of_others_is_not() {
        let euid = nix_euid();
        let top = tempfile::tempdir().unwrap();
        // World-writable without the sticky bit: refused (the control).
        fs::set_permissions(top.path(), fs::Permissions::from_mode(0o777)).unwrap();
        let root = top.path().join(format!("cordon-{euid}")).join("root");
        let e = prepare(&root, euid).unwrap_err();
        assert!(e.to_string().contains("writable by group or others"), "{e}");
        // Sticky, as /tmp is: accepted, and made 0755.
        fs::set_permissions(top.path(), fs::Permissions::from_mode(0o1777)).unwrap();
        prepare(&root, euid).unwrap();
        assert_eq!(fs::metadata(&root).unwrap().mode() & 0o777, 0o755);
        // `cordon-<uid>` writable by others: refused (`new` then makes a
        // private directory instead).
        let cordon = root.parent().unwrap();
        fs::set_permissions(cordon, fs::Permissions::from_mode(0o777)).unwrap();
        let e = prepare(&root, euid).unwrap_err();
        assert!(e.to_string().contains("writable by group or others"), "{e}");
        // Made first by another user (a squatter): refused too.
        if euid == 0 {
            fs::set_permissions(cordon, fs::Permissions::from_mode(0o755)).unwrap();
            std::os::unix::fs::lchown(cordon, Some(65534), Some(65534)).unwrap();
            let e = prepare(&root, euid).unwrap_err();
            assert!(e.to_string().contains("is owned by another user"), "{e}");
        }
    }

    #[test]
    fn without_xdg_runtime_dir_the_temporary_directory_is_a_candidate() {
        if nix_euid() == 0 {
            let c = shared_candidates(0);
            assert!(
                matches!(&c[..], [RootDir::Shared(p)] if p == Path::new("/run/cordon/root")),
                "{c:?}"
            );
            return;
        }
        let c = shared_candidates(nix_euid());
        let want = std::env::temp_dir()
            .join(format!("cordon-{}", nix_euid()))
            .join("root");
        assert!(
            matches!(c.last(), Some(RootDir::InTmp(p)) if *p == want),
            "{c:?}"
        );
    }

    fn nix_euid() -> u32 {
        fs::metadata("/proc/self").unwrap().uid()
    }
}
