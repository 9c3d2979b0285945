//! Fuzz the layer unpacker: one or two layers of fuzzed tar bytes (plain or gzip) applied to a
//! scratch rootfs. Whatever the bytes, nothing lands outside the rootfs: the rootfs lives in a
//! parent directory beside an `outside` directory holding a canary file; afterwards the parent
//! holds only the rootfs, `outside` holds only the canary, unchanged and with no other link to
//! it; every hard-linked inode in the rootfs has all its links inside it; and what the rootfs
//! holds keeps the unpacker's promises (no device nodes, no setuid or setgid bits,
//! directories writable by their owner).
#![no_main]

use std::collections::HashMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;

use cordon_image::unpack::{Budget, Caps, Compression, apply_layer};
use libfuzzer_sys::fuzz_target;

const CANARY: &[u8] = b"canary\n";

/// Every entry under `dir` (not following symlinks): (path, metadata).
fn walk(dir: &Path, out: &mut Vec<(std::path::PathBuf, fs::Metadata)>) {
    let Ok(rd) = fs::read_dir(dir) else {
        panic!("cannot read {}", dir.display());
    };
    for e in rd {
        let e = e.expect("directory entry");
        let p = e.path();
        let m = fs::symlink_metadata(&p).expect("metadata");
        let is_dir = m.is_dir();
        out.push((p.clone(), m));
        if is_dir {
            walk(&p, out);
        }
    }
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, rest)) = data.split_first() else {
        return;
    };
    let compression = if sel & 1 != 0 {
        Compression::Gzip
    } else {
        Compression::None
    };
    // Two layers when asked: the split point in 512-byte blocks.
    let layers: Vec<&[u8]> = if sel & 2 != 0 {
        let at = (usize::from(sel >> 2) * 512).min(rest.len());
        vec![&rest[..at], &rest[at..]]
    } else {
        vec![rest]
    };
    let top = tempfile::tempdir().expect("tempdir");
    let parent = top.path().join("parent");
    let outside = top.path().join("outside");
    let root = parent.join("root");
    fs::create_dir(&parent).expect("parent");
    fs::create_dir(&outside).expect("outside");
    fs::write(outside.join("canary"), CANARY).expect("canary");
    fs::create_dir(&root).expect("root");
    let mut budget = Budget::new(Caps {
        max_bytes: 4 << 20,
        max_entries: 512,
    });
    for layer in layers {
        if apply_layer(&root, layer, compression, &mut budget).is_err() {
            break;
        }
    }
    assert_eq!(
        names(top.path()),
        ["outside", "parent"],
        "beside the parent"
    );
    assert_eq!(names(&parent), ["root"], "in the parent");
    assert_eq!(names(&outside), ["canary"], "in outside");
    let cm = fs::symlink_metadata(outside.join("canary")).expect("canary metadata");
    assert!(cm.is_file(), "the canary is no longer a file");
    assert_eq!(cm.nlink(), 1, "the canary gained a link");
    assert_eq!(fs::read(outside.join("canary")).expect("canary"), CANARY);
    let rm = fs::symlink_metadata(&root).expect("root metadata");
    assert!(rm.is_dir(), "the rootfs is no longer a directory");

    let mut all = Vec::new();
    walk(&root, &mut all);
    let mut links: HashMap<(u64, u64), (u64, u64)> = HashMap::new();
    for (p, m) in &all {
        let ft = m.file_type();
        assert!(
            !ft.is_block_device() && !ft.is_char_device(),
            "a device node: {}",
            p.display()
        );
        assert!(!ft.is_socket(), "a socket: {}", p.display());
        if !ft.is_symlink() {
            assert_eq!(m.mode() & 0o6000, 0, "setuid/setgid: {}", p.display());
        }
        if ft.is_dir() {
            assert_eq!(m.mode() & 0o700, 0o700, "owner rwx: {}", p.display());
        } else {
            let e = links.entry((m.dev(), m.ino())).or_insert((m.nlink(), 0));
            e.1 += 1;
        }
    }
    for ((_, ino), (nlink, seen)) in links {
        assert_eq!(
            nlink, seen,
            "inode {ino} has {nlink} links, {seen} of them in the rootfs"
        );
    }
});
