//! What the microVM runtime keeps in the image store (`vm/` beside the
//! images), and its garbage collection:
//!
//! - `initramfs/<key>.cpio`: the guest's init and modules, per init binary
//!   and kernel release;
//! - `images/<digest>.img` and `.json`: an image's read-only EROFS disk
//!   (`cordon_vm_init::image`), named by the digest of its tree;
//! - `index/<manifest hex>`: which disk an image of the store became;
//! - `snapshots/<key>.snap` (the device state), `.ram` (the guest's RAM,
//!   which restores map privately), `.json` ([`SnapRecord`]) and `.lock`:
//!   one template per (snapshot format, disk, initramfs, kernel, QEMU,
//!   memory, vCPUs, accelerator). Both files are read-only (0444) and the
//!   store's own; `.verified` ([`Verified`]) names the version of the RAM
//!   file last hashed in full.
//!
//! [`gc`] keeps what the kept images need and removes the rest.

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What a snapshot's record says: its digest and what it was made of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapRecord {
    /// sha256 of the device state (`.snap`).
    pub sha256: String,
    /// sha256 over the RAM file's data extents and their offsets
    /// (`cordon_vm_init::image::sha256_sparse`).
    pub ram_sha256: String,
    /// The disk's digest (`images/<digest>.img`).
    pub image: String,
    /// The initramfs's file name in `initramfs/`.
    pub initramfs: String,
    /// The carried disk's digest (`images/<digest>.img`), for a template
    /// of guests that have one.
    #[serde(default)]
    pub carry: Option<String>,
}

/// `<key>.verified`: the version of a template's RAM file last hashed in
/// full, and the digest it had. A broker reads the file again only when
/// its device, inode, size, modification or change time differ.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verified {
    pub sha256: String,
    pub file: cordon_vm_init::image::FileId,
}

/// What [`gc`] removed.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Removed {
    pub disks: usize,
    pub snapshots: usize,
    pub initramfs: usize,
    pub bytes: u64,
}

/// Temporary files younger than this may belong to a broker at work.
const TMP_GRACE: Duration = Duration::from_secs(600);

fn size(p: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    fs::symlink_metadata(p).map_or(0, |m| m.blocks() * 512)
}

fn remove(p: &Path, out: &mut Removed) {
    let n = size(p);
    let r = if p.is_dir() {
        fs::remove_dir_all(p)
    } else {
        fs::remove_file(p)
    };
    if r.is_ok() {
        out.bytes += n;
    }
}

fn old_enough(p: &Path) -> bool {
    fs::symlink_metadata(p)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.elapsed().ok())
        .is_some_and(|age| age > TMP_GRACE)
}

fn names(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// Removes from `vm` (the store's `vm/` directory) every disk, snapshot
/// and initramfs that no image in `keep` (manifest digests, hex) needs, and
/// stale temporaries. A template being made (its lock held) is left.
pub fn gc(vm: &Path, keep: &BTreeSet<String>) -> Removed {
    let mut out = Removed::default();
    // The index: kept images' disks.
    let index = vm.join("index");
    let mut disks = BTreeSet::new();
    for n in names(&index) {
        let p = index.join(&n);
        if n.starts_with('.') {
            if old_enough(&p) {
                remove(&p, &mut out);
            }
        } else if keep.contains(&n) {
            if let Ok(d) = fs::read_to_string(&p) {
                disks.insert(d.trim().to_string());
            }
        } else {
            remove(&p, &mut out);
        }
    }
    // Snapshots of kept disks; their initramfs.
    let snaps = vm.join("snapshots");
    let mut initramfs = BTreeSet::new();
    let mut carried = BTreeSet::new();
    for n in names(&snaps) {
        let Some(key) = n.strip_suffix(".json") else {
            continue;
        };
        let rec = fs::read(snaps.join(&n))
            .ok()
            .and_then(|t| serde_json::from_slice::<SnapRecord>(&t).ok());
        let busy = fs::File::open(snaps.join(format!("{key}.lock")))
            .map(|f| f.try_lock().is_err())
            .unwrap_or(false);
        match rec {
            Some(r) if disks.contains(&r.image) || busy => {
                initramfs.insert(r.initramfs);
                carried.extend(r.carry);
            }
            _ if busy => {}
            _ => {
                for ext in ["snap", "ram", "verified", "json", "lock"] {
                    remove(&snaps.join(format!("{key}.{ext}")), &mut out);
                }
                out.snapshots += 1;
            }
        }
    }
    for n in names(&snaps) {
        let p = snaps.join(&n);
        let key = n.split('.').next().unwrap_or("");
        let orphan = [".snap", ".ram", ".verified"]
            .iter()
            .any(|e| n.ends_with(e))
            && !snaps.join(format!("{key}.json")).exists();
        if (n.starts_with('.') && old_enough(&p)) || orphan {
            remove(&p, &mut out);
        }
    }
    // Carried disks of kept templates, and their index entries.
    let carry = vm.join("carry");
    for n in names(&carry) {
        let p = carry.join(&n);
        let kept = fs::read_to_string(&p).is_ok_and(|d| carried.contains(d.trim()));
        if n.starts_with('.') {
            if old_enough(&p) {
                remove(&p, &mut out);
            }
        } else if !kept {
            remove(&p, &mut out);
        }
    }
    disks.extend(carried);
    // Disks no kept image has.
    let images = vm.join("images");
    for n in names(&images) {
        let p = images.join(&n);
        let digest = n.split('.').next().unwrap_or("");
        if n.contains(".tmp") {
            if old_enough(&p) {
                remove(&p, &mut out);
            }
        } else if !disks.contains(digest) {
            if n.ends_with(".img") {
                out.disks += 1;
            }
            remove(&p, &mut out);
        }
    }
    // Initramfs no kept snapshot was made with (the next call makes it
    // again in a fraction of a second).
    let dir = vm.join("initramfs");
    for n in names(&dir) {
        let p = dir.join(&n);
        if n.starts_with('.') {
            if old_enough(&p) {
                remove(&p, &mut out);
            }
        } else if !initramfs.contains(&n) {
            remove(&p, &mut out);
            out.initramfs += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gc_keeps_what_kept_images_need() {
        let d = tempfile::tempdir().unwrap();
        let vm = d.path();
        for sub in ["index", "images", "snapshots", "initramfs", "carry"] {
            fs::create_dir_all(vm.join(sub)).unwrap();
        }
        let w = |p: &str, s: &str| fs::write(vm.join(p), s).unwrap();
        w("index/aaaa", "disk-a");
        w("index/bbbb", "disk-b");
        for d in ["disk-a", "disk-b", "disk-anon", "carry-a", "carry-b"] {
            w(&format!("images/{d}.img"), "x");
            w(&format!("images/{d}.json"), "{}");
        }
        let rec_with = |img: &str, init: &str, carry: Option<&str>| {
            serde_json::to_string(&SnapRecord {
                sha256: "s".into(),
                ram_sha256: "r".into(),
                image: img.into(),
                initramfs: init.into(),
                carry: carry.map(str::to_string),
            })
            .unwrap()
        };
        let rec = |img: &str, init: &str| rec_with(img, init, None);
        // A template of a kept image with a carried disk, and one of a
        // removed image with another: the first disk stays, the second
        // goes with its template, each index entry with its disk.
        w("snapshots/k6.snap", "x");
        w("snapshots/k6.ram", "x");
        w(
            "snapshots/k6.json",
            &rec_with("disk-a", "i1.cpio", Some("carry-a")),
        );
        w("snapshots/k7.snap", "x");
        w(
            "snapshots/k7.json",
            &rec_with("disk-b", "i2.cpio", Some("carry-b")),
        );
        w("carry/c1", "carry-a");
        w("carry/c2", "carry-b");
        w("snapshots/k1.snap", "x");
        w("snapshots/k1.ram", "x");
        w("snapshots/k1.json", &rec("disk-a", "i1.cpio"));
        w("snapshots/k2.snap", "x");
        w("snapshots/k2.ram", "x");
        w("snapshots/k2.json", &rec("disk-b", "i2.cpio"));
        w("snapshots/k3.snap", "orphan");
        w("snapshots/k3.ram", "orphan");
        w("snapshots/k3.verified", "orphan");
        w("snapshots/k2.verified", "{}");
        // A template of an older format (no RAM file in its record).
        w("snapshots/k5.snap", "x");
        w(
            "snapshots/k5.json",
            r#"{"sha256":"s","image":"disk-a","initramfs":"i1.cpio"}"#,
        );
        w("initramfs/i1.cpio", "x");
        w("initramfs/i2.cpio", "x");
        w("initramfs/old.cpio", "x");
        // A template being made for a removed image: its lock is held.
        w("snapshots/k4.json", &rec("disk-gone", "i4.cpio"));
        w("initramfs/i4.cpio", "x");
        let held = fs::File::create(vm.join("snapshots/k4.lock")).unwrap();
        held.lock().unwrap();

        let keep: BTreeSet<String> = ["aaaa".to_string()].into();
        let r = gc(vm, &keep);
        let left = |sub: &str| {
            let mut v = names(&vm.join(sub));
            v.sort();
            v
        };
        assert_eq!(left("index"), ["aaaa"]);
        assert_eq!(
            left("images"),
            ["carry-a.img", "carry-a.json", "disk-a.img", "disk-a.json"]
        );
        assert_eq!(
            left("snapshots"),
            [
                "k1.json", "k1.ram", "k1.snap", "k4.json", "k4.lock", "k6.json", "k6.ram",
                "k6.snap"
            ]
        );
        assert_eq!(left("initramfs"), ["i1.cpio", "i4.cpio"]);
        assert_eq!(left("carry"), ["c1"]);
        assert_eq!((r.disks, r.snapshots, r.initramfs), (3, 3, 2));
        drop(held);
    }
}
