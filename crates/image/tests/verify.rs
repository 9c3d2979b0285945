//! An image is verified whole when it enters the store (an import here; a
//! pull goes through the same ingest, tests/registry.rs): every blob's
//! digest, every layer's diff_id, every entry as the unpacker applies it.
//! An image refused leaves nothing in the store, and the refusal names the
//! layer (index and digest) and the entry.

mod common;

use std::path::{Path, PathBuf};

use common::{Layout, tar_dir, tar_layer};
use cordon_image::layout;
use cordon_image::manifest::{Platform, media};
use cordon_image::store::{ImageRecord, Progress, RecordLayer, StoreError};
use cordon_image::{Digest, Store};
use serde_json::json;
use tar::{EntryType, Header};

fn no_progress() -> impl FnMut(&Progress) {
    |_| {}
}

/// A tar entry with a raw name and link name (as a hostile writer would
/// put them; the `tar` crate's own setters refuse some).
fn raw(out: &mut Vec<u8>, ty: EntryType, name: &str, link: &str, data: &[u8]) {
    let mut h = Header::new_gnu();
    h.set_entry_type(ty);
    h.set_mode(0o644);
    h.set_size(data.len() as u64);
    {
        let old = h.as_old_mut();
        old.name[..name.len()].copy_from_slice(name.as_bytes());
        old.linkname[..link.len()].copy_from_slice(link.as_bytes());
    }
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out.extend(std::iter::repeat_n(0u8, (512 - data.len() % 512) % 512));
}

fn end(mut out: Vec<u8>) -> Vec<u8> {
    out.extend(std::iter::repeat_n(0u8, 1024));
    out
}

/// The good bottom layer every image here has.
fn base() -> Vec<u8> {
    tar_layer(&[
        ("bin/", b""),
        ("bin/tool", b"#!/bin/sh\necho hi\n"),
        ("etc/", b""),
        ("etc/passwd", b"root:x:0:0::/:/bin/sh\n"),
    ])
}

/// Everything under the store's blobs, images and rootfs directories.
fn contents(store: &Store) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in ["blobs/sha256", "images", "rootfs"] {
        for e in std::fs::read_dir(store.dir().join(sub)).unwrap().flatten() {
            out.push(e.path());
        }
    }
    out
}

/// Import a layout of `base()` and `top` (gzipped) into a fresh store;
/// the store, the image and the import's result.
fn import_with_top(
    dir: &Path,
    top: Vec<u8>,
    diff_ids: Option<Vec<String>>,
) -> (
    Store,
    common::Built,
    Result<Vec<layout::Loaded>, StoreError>,
) {
    let mut l = Layout::new(&dir.join("layout"));
    let b = l.image_with(
        &[(base(), true), (top, true)],
        &Platform::host().architecture,
        json!({"Entrypoint": ["/bin/tool"]}),
        diff_ids,
    );
    l.list(media::OCI_MANIFEST, &b.manifest, b.manifest_size, Some("t"));
    l.finish();
    let store = Store::open(dir.join("store")).unwrap();
    let r = layout::import(&store, &l.dir, None, &mut no_progress());
    (store, b, r)
}

/// The import was refused by layer 1 of `b` naming every one of
/// `needles`, and left nothing in the store.
fn refused_at_layer_1(
    store: &Store,
    b: &common::Built,
    r: Result<Vec<layout::Loaded>, StoreError>,
    needles: &[&str],
) -> StoreError {
    let e = r.expect_err("the image was imported");
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!("layer 1 ({}): ", b.layers[1])),
        "{msg}"
    );
    for n in needles {
        assert!(msg.contains(n), "{n:?} not in: {msg}");
    }
    assert!(
        store.ls().unwrap().is_empty(),
        "a record of a refused image"
    );
    assert!(store.find(&b.manifest).unwrap().is_none());
    assert_eq!(
        contents(store),
        Vec::<PathBuf>::new(),
        "a refused image left something"
    );
    e
}

#[test]
fn a_good_image_is_unpacked_when_imported() {
    let t = common::tmp();
    let top = tar_layer(&[("etc/motd", b"hello\n")]);
    let (store, b, r) = import_with_top(t.path(), top, None);
    let loaded = r.unwrap();
    assert_eq!(loaded[0].digest, b.manifest);
    // Unpacked at import: the tree is complete and first use unpacks nothing.
    let info = store.inspect(&b.manifest).unwrap();
    let root = info.rootfs.expect("not unpacked at import");
    assert_eq!(std::fs::read(root.join("etc/motd")).unwrap(), b"hello\n");
    assert!(root.join("bin/tool").is_file());
    let u = store.unpack(&b.manifest).unwrap();
    assert!(!u.fresh);
    assert_eq!(u.path, root);
}

#[test]
fn a_diff_id_that_does_not_match_is_refused_at_import() {
    let t = common::tmp();
    let top = tar_layer(&[("etc/motd", b"hello\n")]);
    let wrong = vec![
        Digest::of(&base()).to_string(),
        Digest::of(b"not the layer").to_string(),
    ];
    let (store, b, r) = import_with_top(t.path(), top.clone(), Some(wrong));
    let e = refused_at_layer_1(
        &store,
        &b,
        r,
        &[
            &format!("its uncompressed content has digest {}", Digest::of(&top)),
            &format!(
                "the image config's rootfs.diff_ids says {}",
                Digest::of(b"not the layer")
            ),
        ],
    );
    assert!(matches!(e, StoreError::DiffId { index: 1, .. }), "{e}");
}

#[test]
fn a_hard_link_to_a_host_path_is_refused_at_import() {
    let t = common::tmp();
    let mut top = Vec::new();
    raw(&mut top, EntryType::Link, "shadow", "/etc/shadow", b"");
    let (store, b, r) = import_with_top(t.path(), end(top), None);
    let e = refused_at_layer_1(
        &store,
        &b,
        r,
        &[
            "entry \"shadow\" refused",
            "the hard link's target is not in the rootfs",
        ],
    );
    assert!(matches!(e, StoreError::Unpack { index: 1, .. }), "{e}");
}

#[test]
fn a_hard_link_through_a_symlink_is_refused_at_import() {
    let t = common::tmp();
    let bait = t.path().join("bait");
    std::fs::create_dir(&bait).unwrap();
    std::fs::write(bait.join("secret"), b"host secret\n").unwrap();
    let mut top = Vec::new();
    raw(
        &mut top,
        EntryType::Symlink,
        "host",
        bait.to_str().unwrap(),
        b"",
    );
    raw(&mut top, EntryType::Link, "stolen", "host/secret", b"");
    let (store, b, r) = import_with_top(t.path(), end(top), None);
    refused_at_layer_1(
        &store,
        &b,
        r,
        &[
            "entry \"stolen\" refused",
            "the hard link's target is not in the rootfs",
        ],
    );
    // The host file has no new link.
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(bait.join("secret")).unwrap().nlink(), 1);
}

#[test]
fn a_file_through_a_symlink_is_refused_at_import() {
    let t = common::tmp();
    let bait = t.path().join("bait");
    std::fs::create_dir(&bait).unwrap();
    let target = bait.join("ssh");
    let mut top = Vec::new();
    raw(
        &mut top,
        EntryType::Symlink,
        "keys",
        target.to_str().unwrap(),
        b"",
    );
    raw(
        &mut top,
        EntryType::Regular,
        "keys/authorized_keys",
        "",
        b"ssh-ed25519 AAAA attacker\n",
    );
    let (store, b, r) = import_with_top(t.path(), end(top), None);
    refused_at_layer_1(
        &store,
        &b,
        r,
        &[
            "entry \"keys/authorized_keys\" refused",
            "the parent \"keys\" is a symlink to nothing",
        ],
    );
    assert!(!target.exists(), "written outside the rootfs");
    assert_eq!(std::fs::read_dir(&bait).unwrap().count(), 0);
}

#[test]
fn a_refused_archive_leaves_nothing_and_keeps_what_others_use() {
    let t = common::tmp();
    // A good image first: its blobs (the shared bottom layer among them)
    // stay.
    let (store, good, r) = import_with_top(
        &t.path().join("good"),
        tar_layer(&[("etc/motd", b"hi\n")]),
        None,
    );
    r.unwrap();
    let kept = contents(&store);
    let mut top = Vec::new();
    raw(&mut top, EntryType::Link, "shadow", "/etc/shadow", b"");
    let mut l = Layout::new(&t.path().join("bad"));
    let b = l.image(&[(base(), true), (end(top), true)]);
    l.list(media::OCI_MANIFEST, &b.manifest, b.manifest_size, Some("t"));
    l.finish();
    tar_dir(&l.dir, &t.path().join("bad.tar"));
    let e =
        layout::import(&store, &t.path().join("bad.tar"), None, &mut no_progress()).unwrap_err();
    assert!(
        e.to_string()
            .starts_with(&format!("layer 1 ({}): entry \"shadow\"", b.layers[1])),
        "{e}"
    );
    // Only the good image, whole; nothing of the archive (not even its
    // index.json) is left.
    assert_eq!(b.layers[0], good.layers[0]);
    let mut now = contents(&store);
    let mut kept = kept;
    now.sort();
    kept.sort();
    assert_eq!(now, kept);
    assert_eq!(store.ls().unwrap().len(), 1);
    assert!(store.unpack(&good.manifest).is_ok());
}

#[test]
fn a_record_from_before_is_verified_again_and_dropped_when_refused() {
    // A store written before imports unpacked: the blobs and the record of
    // an image whose layer could never be unpacked, and no tree.
    let t = common::tmp();
    let mut top = Vec::new();
    raw(&mut top, EntryType::Link, "shadow", "/etc/shadow", b"");
    let mut l = Layout::new(&t.path().join("layout"));
    let b = l.image(&[(base(), true), (end(top), true)]);
    l.list(media::OCI_MANIFEST, &b.manifest, b.manifest_size, Some("t"));
    l.finish();
    let store = Store::open(t.path().join("store")).unwrap();
    let mut layers = Vec::new();
    for d in [b.manifest, b.config].iter().chain(&b.layers) {
        std::fs::copy(l.blob_path(d), store.blob_path(d)).unwrap();
    }
    for d in &b.layers {
        layers.push(RecordLayer {
            digest: *d,
            size: std::fs::metadata(l.blob_path(d)).unwrap().len(),
            media_type: media::OCI_LAYER_GZIP.to_string(),
        });
    }
    let record = ImageRecord {
        names: vec!["t".into()],
        digest: b.manifest,
        manifest: b.manifest,
        config: b.config,
        layers,
    };
    std::fs::write(
        store
            .dir()
            .join(format!("images/{}.json", b.manifest.hex())),
        serde_json::to_vec(&record).unwrap(),
    )
    .unwrap();
    // Its first use refuses it, naming the layer and the entry...
    let e = store.unpack(&b.manifest).unwrap_err();
    assert!(
        e.to_string()
            .starts_with(&format!("layer 1 ({}): entry \"shadow\"", b.layers[1])),
        "{e}"
    );
    // ...and so does importing it again, which drops it whole.
    let e = layout::import(&store, &l.dir, None, &mut no_progress()).unwrap_err();
    assert!(matches!(e, StoreError::Unpack { index: 1, .. }), "{e}");
    assert!(store.ls().unwrap().is_empty());
    assert_eq!(contents(&store), Vec::<PathBuf>::new());
}
