//! The carried disk: cordon's own files (the probe agent, its loader and
//! libraries) copied onto a second read-only EROFS disk of the guest,
//! mounted at `/.cordon` in the tool's root. Nothing of the host is
//! shared into a guest; what a guest needs of cordon's goes in by copy.
//!
//! A sandbox spec's mounts are carried when every one is a read-only
//! regular file bound under `/.cordon/`; any other mount is refused. The
//! disk is named by its tree's digest and found again through an index
//! keyed by the files' paths and versions (device, inode, size, times),
//! so an unchanged agent is neither copied nor hashed again; the template
//! of a guest with the disk is keyed by it (a template and its restores
//! have one device set).

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use cordon_vm_init::image::FileId;
use cordon_vm_init::protocol::CARRY_MOUNT;

use crate::spec::{Mount, SandboxSpec};

/// One file to carry: where it is on the host, where it goes on the disk
/// (relative to its root), and the version of it that was seen.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Carried {
    pub src: PathBuf,
    pub rel: PathBuf,
    pub id: FileId,
}

/// The files `spec`'s mounts carry (empty: no carried disk), or why a
/// mount cannot go into a guest.
pub fn files(spec: &SandboxSpec) -> Result<Vec<Carried>, String> {
    spec.mounts.iter().map(one).collect()
}

fn one(m: &Mount) -> Result<Carried, String> {
    let refused = |why: &str| {
        format!(
            "runtime microvm shares no host file or directory into the guest (mount {}:{}): {why}",
            m.src.display(),
            m.dst.display()
        )
    };
    let rel = m
        .dst
        .strip_prefix(CARRY_MOUNT)
        .ok()
        .filter(|r| {
            !r.as_os_str().is_empty()
                && r.components()
                    .all(|c| matches!(c, std::path::Component::Normal(_)))
        })
        .ok_or_else(|| {
            refused(&format!(
                "only cordon's own read-only files under {CARRY_MOUNT}/ are carried in, by copy"
            ))
        })?;
    if m.writable {
        return Err(refused("a carried file is read-only"));
    }
    let meta = fs::metadata(&m.src).map_err(|e| refused(&e.to_string()))?;
    if !meta.is_file() {
        return Err(refused("only regular files are carried"));
    }
    Ok(Carried {
        src: m.src.clone(),
        rel: rel.to_path_buf(),
        id: FileId::of(&meta),
    })
}

/// The index key of `files`: their places and versions.
pub fn key(files: &[Carried]) -> String {
    let mut parts: Vec<Vec<u8>> = vec![b"carry v1".to_vec()];
    for f in files {
        parts.push(f.rel.as_os_str().as_encoded_bytes().to_vec());
        parts.push(f.src.as_os_str().as_encoded_bytes().to_vec());
        parts.push(serde_json::to_vec(&f.id).unwrap_or_default());
    }
    let refs: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
    super::sha256_hex(&refs)
}

/// Copies `files` into a new directory `dir` (made 0755, files 0555), and
/// checks each is the version that was seen: a file changed meanwhile is
/// refused, never carried half-old.
pub fn stage(files: &[Carried], dir: &Path) -> Result<(), String> {
    let mkdir = |d: &Path| {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(d)
            .map_err(|e| format!("create {}: {e}", d.display()))
    };
    mkdir(dir)?;
    for f in files {
        let to = dir.join(&f.rel);
        if let Some(parent) = to.parent() {
            mkdir(parent)?;
        }
        fs::copy(&f.src, &to)
            .map_err(|e| format!("copy {} to {}: {e}", f.src.display(), to.display()))?;
        fs::set_permissions(&to, fs::Permissions::from_mode(0o555))
            .map_err(|e| format!("{}: {e}", to.display()))?;
        if FileId::path(&f.src) != Some(f.id) {
            return Err(format!(
                "{} changed while it was copied into the carried disk",
                f.src.display()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec_with(mounts: Vec<Mount>) -> SandboxSpec {
        let mut s = SandboxSpec::new("t", ["/x"]);
        s.mounts = mounts;
        s
    }

    #[test]
    fn only_read_only_files_under_the_carry_mount_are_carried() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("agent");
        fs::write(&f, b"agent").unwrap();
        let m = |src: &Path, dst: &str, writable: bool| Mount {
            src: src.to_path_buf(),
            dst: PathBuf::from(dst),
            writable,
        };
        let ok = files(&spec_with(vec![m(&f, "/.cordon/lib/agent", false)])).unwrap();
        assert_eq!(ok.len(), 1);
        assert_eq!(ok[0].rel, Path::new("lib/agent"));
        for (mount, why) in [
            (m(&f, "/etc/agent", false), "only cordon's own"),
            (m(&f, "/.cordon/../etc/x", false), "only cordon's own"),
            (m(&f, "/.cordon", false), "only cordon's own"),
            (m(&f, "/.cordon/agent", true), "read-only"),
            (m(d.path(), "/.cordon/dir", false), "only regular files"),
        ] {
            let e = files(&spec_with(vec![mount])).unwrap_err();
            assert!(e.contains("shares no host file") && e.contains(why), "{e}");
        }
    }

    #[test]
    fn a_changed_file_changes_the_key_and_staging_copies_it() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("agent");
        fs::write(&f, b"one").unwrap();
        let mount = Mount {
            src: f.clone(),
            dst: PathBuf::from("/.cordon/agent"),
            writable: false,
        };
        let a = files(&spec_with(vec![mount.clone()])).unwrap();
        let staged = d.path().join("staged");
        stage(&a, &staged).unwrap();
        assert_eq!(fs::read(staged.join("agent")).unwrap(), b"one");
        std::thread::sleep(std::time::Duration::from_millis(20));
        fs::write(&f, b"two!").unwrap();
        let b = files(&spec_with(vec![mount])).unwrap();
        assert_ne!(key(&a), key(&b));
        // The version seen first is gone: staging it is refused.
        let e = stage(&a, &d.path().join("again")).unwrap_err();
        assert!(e.contains("changed while it was copied"), "{e}");
    }
}
