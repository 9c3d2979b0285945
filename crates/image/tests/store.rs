//! The store: imports from OCI layouts and archives, verification,
//! atomicity, locking, unpacking, gc.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime};

use common::{Layout, gzip, other_arch, tar_dir, tar_layer};
use cordon_image::digest::VerifyError;
use cordon_image::layout;
use cordon_image::manifest::media;
use cordon_image::reference::ReferenceError;
use cordon_image::store::{Progress, StoreError};
use cordon_image::{Digest, ImageRef, Store};
use serde_json::json;

fn no_progress() -> impl FnMut(&Progress) {
    |_| {}
}

fn two_layers() -> Vec<(Vec<u8>, bool)> {
    vec![
        (
            tar_layer(&[
                ("bin/", b""),
                ("bin/tool", b"#!/bin/sh\necho hi\n"),
                ("etc/a", b"one"),
            ]),
            true,
        ),
        (tar_layer(&[("etc/a", b"two"), ("etc/b", b"bee")]), false),
    ]
}

/// A layout with one image listed under `ref_name`.
fn simple_layout(dir: &Path, ref_name: Option<&str>) -> (Layout, common::Built) {
    let mut l = Layout::new(dir);
    let b = l.image(&two_layers());
    l.list(media::OCI_MANIFEST, &b.manifest, b.manifest_size, ref_name);
    l.finish();
    (l, b)
}

/// Remove the unpacked tree an import made, as if removed since: the
/// next use unpacks it again.
fn drop_tree(store: &Store, manifest: &Digest) {
    std::fs::remove_dir_all(store.dir().join("rootfs").join(manifest.hex())).unwrap();
    assert!(store.inspect(manifest).unwrap().rootfs.is_none());
}

fn temporaries(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in ["blobs/sha256", "images", "rootfs"] {
        for e in std::fs::read_dir(dir.join(sub)).unwrap().flatten() {
            if e.file_name().to_string_lossy().starts_with(".tmp-") {
                out.push(e.path());
            }
        }
    }
    out
}

#[test]
fn layout_import_inspect_unpack() {
    let t = common::tmp();
    let (_, b) = simple_layout(
        &t.path().join("layout"),
        Some("registry.internal/mcp/jira:1.0"),
    );
    let store = Store::open(t.path().join("store")).unwrap();
    let mut seen = Vec::new();
    let loaded = layout::import(&store, &t.path().join("layout"), None, &mut |p| {
        seen.push(*p)
    })
    .unwrap();
    assert_eq!(loaded.len(), 1);
    assert_eq!(
        loaded[0].to_string(),
        format!("registry.internal/mcp/jira@{}", b.manifest)
    );
    // The printed reference parses back to the same pin.
    let r: ImageRef = loaded[0].to_string().parse().unwrap();
    assert_eq!(r.digest, b.manifest);
    let last = seen.last().unwrap();
    assert_eq!((last.layers_done, last.layers_total), (2, 2));
    assert_eq!(last.bytes_done, last.bytes_total);

    let ls = store.ls().unwrap();
    assert_eq!(ls.len(), 1);
    assert_eq!(ls[0].manifest, b.manifest);
    assert_eq!(ls[0].config, b.config);
    let info = store.inspect(&b.manifest).unwrap();
    assert_eq!(info.config.entrypoint, Some(vec!["/bin/tool".to_string()]));
    assert_eq!(info.config.working_dir.as_deref(), Some("/w"));
    assert_eq!(info.config.diff_ids.len(), 2);
    // Unpacked by the import.
    assert!(info.rootfs.is_some());

    let u = store.unpack(&b.manifest).unwrap();
    assert!(!u.fresh);
    assert_eq!(info.rootfs.as_ref(), Some(&u.path));
    assert_eq!(std::fs::read(u.path.join("etc/a")).unwrap(), b"two");
    assert_eq!(std::fs::read(u.path.join("etc/b")).unwrap(), b"bee");
    assert!(u.path.join("bin/tool").is_file());
    let again = store.unpack(&b.manifest).unwrap();
    assert!(!again.fresh);
    assert_eq!(again.path, u.path);
    assert_eq!(store.inspect(&b.manifest).unwrap().rootfs, Some(u.path));

    // A second import finds the image complete and fetches nothing.
    let again = layout::import(
        &store,
        &t.path().join("layout"),
        Some("other"),
        &mut no_progress(),
    )
    .unwrap();
    assert_eq!(again[0].to_string(), format!("other@{}", b.manifest));
    let names = &store.ls().unwrap()[0].names;
    assert_eq!(names, &["registry.internal/mcp/jira", "other"]);

    // Every store directory is private, but for the store itself and
    // `rootfs/`: traversable (never listable) by the sandbox's uid.
    for (sub, want) in [
        ("", 0o711),
        ("blobs", 0o700),
        ("blobs/sha256", 0o700),
        ("images", 0o700),
        ("rootfs", 0o711),
        ("locks", 0o700),
    ] {
        let mode = std::fs::metadata(store.dir().join(sub))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, want, "{sub}");
    }
    assert!(temporaries(store.dir()).is_empty());
}

#[test]
fn unnamed_image_is_local_and_archives_import_the_same() {
    let t = common::tmp();
    let (_, b) = simple_layout(&t.path().join("layout"), None);
    tar_dir(&t.path().join("layout"), &t.path().join("image.tar"));
    let store = Store::open(t.path().join("store")).unwrap();
    let loaded = layout::import(
        &store,
        &t.path().join("image.tar"),
        None,
        &mut no_progress(),
    )
    .unwrap();
    assert_eq!(loaded[0].to_string(), format!("local@{}", b.manifest));
    assert!(store.inspect(&b.manifest).unwrap().rootfs.is_some());
    assert!(!store.unpack(&b.manifest).unwrap().fresh);
}

#[test]
fn index_resolves_to_the_host_platform() {
    let t = common::tmp();
    let mut l = Layout::new(&t.path().join("layout"));
    let host = l.image(&two_layers());
    let other = l.image_with(
        &[(tar_layer(&[("other", b"x")]), false)],
        other_arch(),
        json!({}),
        None,
    );
    // The other platform's layer is absent: only the host's is fetched.
    std::fs::remove_file(l.blob_path(&other.layers[0])).unwrap();
    let host_arch = cordon_image::manifest::Platform::host().architecture;
    let (index, size) = l.platform_index(&[(&other, other_arch()), (&host, &host_arch)]);
    l.list(media::OCI_INDEX, &index, size, Some("multi"));
    // The same image pinned by its platform manifest.
    l.list(
        media::OCI_MANIFEST,
        &host.manifest,
        host.manifest_size,
        Some("single"),
    );
    l.finish();
    let store = Store::open(t.path().join("store")).unwrap();
    let loaded = layout::import(&store, &l.dir, None, &mut no_progress()).unwrap();
    let refs: Vec<String> = loaded.iter().map(ToString::to_string).collect();
    assert_eq!(
        refs,
        [
            format!("multi@{index}"),
            format!("single@{}", host.manifest)
        ]
    );
    let by_index = store.find(&index).unwrap().unwrap();
    assert_eq!(by_index.digest, index);
    assert_eq!(by_index.manifest, host.manifest);
    // Both pins share one rootfs, keyed by the platform manifest.
    let a = store.unpack(&index).unwrap();
    let b = store.unpack(&host.manifest).unwrap();
    assert!(!a.fresh && !b.fresh);
    assert_eq!(a.path, b.path);
    assert!(a.path.ends_with(format!("{}/root", host.manifest.hex())));
}

#[test]
fn index_without_the_host_platform_is_refused() {
    let t = common::tmp();
    let mut l = Layout::new(&t.path().join("layout"));
    let other = l.image_with(&two_layers(), other_arch(), json!({}), None);
    let (index, size) = l.platform_index(&[(&other, other_arch())]);
    l.list(media::OCI_INDEX, &index, size, None);
    l.finish();
    let store = Store::open(t.path().join("store")).unwrap();
    let e = layout::import(&store, &l.dir, None, &mut no_progress()).unwrap_err();
    assert!(e.to_string().contains("no manifest for linux/"), "{e}");
    assert!(store.ls().unwrap().is_empty());
}

#[test]
fn docker_save_archive() {
    let t = common::tmp();
    let layer1 = tar_layer(&[("bin/", b""), ("bin/tool", b"tool")]);
    let layer2 = tar_layer(&[("etc/motd", b"hello")]);
    let config = serde_json::to_vec(&json!({
        "architecture": cordon_image::manifest::Platform::host().architecture, "os": "linux",
        "config": {"Cmd": ["/bin/tool"], "User": "1000"},
        "rootfs": {"type": "layers", "diff_ids": [
            Digest::of(&layer1).to_string(), Digest::of(&layer2).to_string()]},
    }))
    .unwrap();
    let config_name = format!("{}.json", Digest::of(&config).hex());
    let manifest = json!([{
        "Config": config_name,
        "RepoTags": ["example.org/tools/thing:1.2", "example.org/tools/thing:latest"],
        "Layers": ["aaa/layer.tar", "bbb/layer.tar"],
    }]);
    let mut b = tar::Builder::new(std::fs::File::create(t.path().join("save.tar")).unwrap());
    let mut add = |path: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, path, data).unwrap();
    };
    add(&config_name, &config);
    add("aaa/layer.tar", &layer1);
    add("ccc/layer.tar", &layer2);
    add("aaa/json", b"{}");
    add("manifest.json", &serde_json::to_vec(&manifest).unwrap());
    add("repositories", b"{}");
    // Newer docker writes a repeated layer as a symlink to the first copy.
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    b.append_link(&mut h, "bbb/layer.tar", "../ccc/layer.tar")
        .unwrap();
    b.finish().unwrap();
    drop(b);

    let store = Store::open(t.path().join("store")).unwrap();
    let loaded =
        layout::import(&store, &t.path().join("save.tar"), None, &mut no_progress()).unwrap();
    assert_eq!(loaded.len(), 1, "{loaded:?}");
    assert!(
        loaded[0]
            .to_string()
            .starts_with("example.org/tools/thing@sha256:")
    );
    let info = store.inspect(&loaded[0].digest).unwrap();
    assert_eq!(info.config.cmd, Some(vec!["/bin/tool".to_string()]));
    assert_eq!(info.config.user.as_deref(), Some("1000"));
    assert_eq!(info.record.layers[0].media_type, media::DOCKER_LAYER);
    let root = store.unpacked(&loaded[0].digest).unwrap();
    assert_eq!(std::fs::read(root.join("etc/motd")).unwrap(), b"hello");
    // The synthesised manifest is deterministic: a second import pins the same.
    let store2 = Store::open(t.path().join("store2")).unwrap();
    let again = layout::import(
        &store2,
        &t.path().join("save.tar"),
        None,
        &mut no_progress(),
    )
    .unwrap();
    assert_eq!(again[0].digest, loaded[0].digest);
}

#[test]
fn tag_is_refused_with_the_digest_form() {
    let e = "registry.internal/mcp/jira:1.0"
        .parse::<ImageRef>()
        .unwrap_err();
    assert!(matches!(e, ReferenceError::NotPinned { .. }));
    assert!(
        e.to_string().contains("registry.internal/mcp/jira@sha256:"),
        "{e}"
    );
    let d = Digest::of(b"x");
    let r: ImageRef = format!("registry.internal/mcp/jira:1.0@{d}")
        .parse()
        .unwrap();
    assert_eq!(r.digest, d);
    assert_eq!(r.name(), "registry.internal/mcp/jira");
}

fn expect_verify(e: StoreError) -> VerifyError {
    match e {
        StoreError::Verify(v) => v,
        other => panic!("expected a verification error, got {other}"),
    }
}

#[test]
fn blob_with_the_wrong_digest_is_refused() {
    let t = common::tmp();
    let (l, b) = simple_layout(&t.path().join("layout"), None);
    // Same size, different content.
    let path = l.blob_path(&b.layers[1]);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[600] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let store = Store::open(t.path().join("store")).unwrap();
    let e = layout::import(&store, &l.dir, None, &mut no_progress()).unwrap_err();
    assert!(
        matches!(expect_verify(e), VerifyError::WrongDigest { expected, .. } if expected == b.layers[1])
    );
    assert!(store.ls().unwrap().is_empty());
    assert!(!store.blob_path(&b.layers[1]).exists());
    assert!(temporaries(store.dir()).is_empty());
}

#[test]
fn blob_of_the_wrong_size_is_refused() {
    let t = common::tmp();
    let (l, b) = simple_layout(&t.path().join("layout"), None);
    let store = Store::open(t.path().join("store")).unwrap();
    // Longer than the manifest says: refused at the boundary.
    let path = l.blob_path(&b.layers[1]);
    let good = std::fs::read(&path).unwrap();
    let mut long = good.clone();
    long.extend_from_slice(&[0; 512]);
    std::fs::write(&path, &long).unwrap();
    let e = layout::import(&store, &l.dir, None, &mut no_progress()).unwrap_err();
    assert!(matches!(expect_verify(e), VerifyError::TooLong { .. }));
    // Shorter.
    std::fs::write(&path, &good[..good.len() - 512]).unwrap();
    let e = layout::import(&store, &l.dir, None, &mut no_progress()).unwrap_err();
    assert!(matches!(expect_verify(e), VerifyError::WrongSize { .. }));
    assert!(store.ls().unwrap().is_empty());
    // Put right, the same store completes the image.
    std::fs::write(&path, &good).unwrap();
    let ok = layout::import(&store, &l.dir, None, &mut no_progress()).unwrap();
    assert_eq!(ok[0].digest, b.manifest);
}

#[test]
fn diff_id_mismatch_is_refused_and_leaves_no_tree() {
    let t = common::tmp();
    let mut l = Layout::new(&t.path().join("layout"));
    let layers = two_layers();
    let wrong = vec![
        Digest::of(&layers[0].0).to_string(),
        Digest::of(b"not the layer").to_string(),
    ];
    let b = l.image_with(
        &layers,
        &cordon_image::manifest::Platform::host().architecture,
        json!({}),
        Some(wrong),
    );
    l.list(media::OCI_MANIFEST, &b.manifest, b.manifest_size, None);
    l.finish();
    let store = Store::open(t.path().join("store")).unwrap();
    // Refused at import (tests/verify.rs has the rest of such refusals).
    let e = layout::import(&store, &l.dir, None, &mut no_progress()).unwrap_err();
    assert!(matches!(e, StoreError::DiffId { index: 1, .. }), "{e}");
    assert!(e.to_string().contains("rootfs.diff_ids"), "{e}");
    assert!(store.ls().unwrap().is_empty());
    assert!(matches!(
        store.unpack(&b.manifest),
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(
        std::fs::read_dir(store.dir().join("rootfs"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn a_layer_changed_in_the_store_is_not_unpacked() {
    let t = common::tmp();
    let (_, b) = simple_layout(&t.path().join("layout"), None);
    let store = Store::open(t.path().join("store")).unwrap();
    layout::import(&store, &t.path().join("layout"), None, &mut no_progress()).unwrap();
    drop_tree(&store, &b.manifest);
    let path = store.blob_path(&b.layers[1]);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[600] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let e = store.unpack(&b.manifest).unwrap_err();
    assert!(matches!(e, StoreError::Verify(_)), "{e}");
    assert_eq!(
        std::fs::read_dir(store.dir().join("rootfs"))
            .unwrap()
            .count(),
        0
    );
    // The damaged blob is dropped, so the image is incomplete and the next
    // import fetches it again.
    assert!(!path.exists());
    let again = layout::import(&store, &t.path().join("layout"), None, &mut no_progress()).unwrap();
    assert!(again[0].fetched);
    assert!(store.inspect(&b.manifest).unwrap().rootfs.is_some());
}

fn set_old(path: &Path) {
    let f = std::fs::File::options().write(true).open(path).unwrap();
    f.set_modified(SystemTime::now() - Duration::from_secs(3600))
        .unwrap();
}

#[test]
fn leftovers_of_a_killed_writer_are_ignored_and_cleaned() {
    let t = common::tmp();
    let (l, b) = simple_layout(&t.path().join("layout"), None);
    let store = Store::open(t.path().join("store")).unwrap();
    let dir = store.dir().to_path_buf();
    let hex = b.manifest.hex();

    // A pull killed after some blobs: verified blobs under their names, a
    // half-written temporary, a half-written record temporary, no record.
    for d in [&b.manifest, &b.config] {
        std::fs::copy(l.blob_path(d), store.blob_path(d)).unwrap();
    }
    let half = dir.join(format!("blobs/sha256/.tmp-{}-1-2-3", b.layers[0].hex()));
    std::fs::write(&half, b"partial").unwrap();
    let empty_old = dir.join("blobs/sha256/.tmp-unnamed-4-5-6");
    std::fs::write(&empty_old, b"").unwrap();
    set_old(&empty_old);
    let record_tmp = dir.join(format!("images/.tmp-{hex}.json-7-8-9"));
    std::fs::write(&record_tmp, b"{\"names\":").unwrap();
    // A live writer's temporary: locked, and younger than the stale age.
    let live = dir.join("blobs/sha256/.tmp-live-1-1-1");
    std::fs::write(&live, b"").unwrap();
    let _held = nix::fcntl::Flock::lock(
        std::fs::File::open(&live).unwrap(),
        nix::fcntl::FlockArg::LockExclusive,
    )
    .unwrap();
    // A live writer's non-empty temporary.
    let live2 = dir.join("blobs/sha256/.tmp-live-2-2-2");
    std::fs::write(&live2, b"data").unwrap();
    let _held2 = nix::fcntl::Flock::lock(
        std::fs::File::open(&live2).unwrap(),
        nix::fcntl::FlockArg::LockExclusive,
    )
    .unwrap();

    // Nothing looks complete.
    assert!(store.ls().unwrap().is_empty());
    assert!(store.find(&b.manifest).unwrap().is_none());
    assert!(matches!(
        store.unpack(&b.manifest),
        Err(StoreError::NotFound(_))
    ));

    // The next import finishes the image and removes the dead temporaries.
    let ingested = layout::import(&store, &l.dir, None, &mut no_progress()).unwrap();
    assert_eq!(ingested[0].digest, b.manifest);
    assert!(!half.exists() && !empty_old.exists() && !record_tmp.exists());
    assert!(
        live.exists() && live2.exists(),
        "a live writer's file was removed"
    );

    // An unpack killed midway: a temporary tree, and a tree without its marker.
    drop_tree(&store, &b.manifest);
    let tmp_tree = dir.join(format!("rootfs/.tmp-{hex}/root/etc"));
    std::fs::create_dir_all(&tmp_tree).unwrap();
    std::fs::write(tmp_tree.join("a"), b"partial").unwrap();
    let unmarked = dir.join(format!("rootfs/{hex}/root"));
    std::fs::create_dir_all(unmarked.join("etc")).unwrap();
    std::fs::write(unmarked.join("etc/a"), b"partial").unwrap();
    // A read-only directory in it must not stop its removal.
    std::fs::create_dir(unmarked.join("ro")).unwrap();
    std::fs::set_permissions(unmarked.join("ro"), std::fs::Permissions::from_mode(0o500)).unwrap();
    assert!(store.inspect(&b.manifest).unwrap().rootfs.is_none());
    let u = store.unpack(&b.manifest).unwrap();
    assert!(u.fresh);
    assert_eq!(std::fs::read(u.path.join("etc/a")).unwrap(), b"two");
    assert!(!u.path.join("ro").exists());
    assert!(!dir.join(format!("rootfs/.tmp-{hex}")).exists());

    // gc removes the remaining temporaries (no writer runs while it holds
    // the store lock).
    drop((_held, _held2));
    let report = store.gc(&[]).unwrap();
    assert_eq!(report.temporary, 2);
    assert_eq!(report.blobs, 0);
    assert!(temporaries(&dir).is_empty());
    assert!(store.unpack(&b.manifest).unwrap().path.is_dir());
}

#[test]
fn concurrent_imports_and_unpacks_do_the_work_once() {
    let t = common::tmp();
    let (l, b) = simple_layout(&t.path().join("layout"), None);
    let store = Store::open(t.path().join("store")).unwrap();
    let n = 4;
    let barrier = Arc::new(Barrier::new(n));
    let imports: Vec<layout::Loaded> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|i| {
                let (store, barrier, dir) = (store.clone(), barrier.clone(), l.dir.clone());
                s.spawn(move || {
                    barrier.wait();
                    let name = format!("n{i}");
                    let mut last = Progress::default();
                    let mut loaded =
                        layout::import(&store, &dir, Some(&name), &mut |p| last = *p).unwrap();
                    assert_eq!(last.layers_done, last.layers_total);
                    loaded.remove(0)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(imports.iter().filter(|x| x.fetched).count(), 1);
    assert!(imports.iter().all(|x| x.digest == b.manifest));
    let records = store.ls().unwrap();
    assert_eq!(records.len(), 1);
    let mut names = records[0].names.clone();
    names.sort();
    assert_eq!(names, ["n0", "n1", "n2", "n3"]);
    // Unpacked once, by the import that fetched; again once below.
    drop_tree(&store, &b.manifest);

    let barrier = Arc::new(Barrier::new(n));
    let results: Vec<_> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|_| {
                let (store, barrier) = (store.clone(), barrier.clone());
                let d = b.manifest;
                s.spawn(move || {
                    barrier.wait();
                    store.unpack(&d).unwrap()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(results.iter().filter(|u| u.fresh).count(), 1);
    assert!(results.iter().all(|u| u.path == results[0].path));
}

#[test]
fn rm_and_gc() {
    let t = common::tmp();
    let (_, b) = simple_layout(&t.path().join("a"), Some("a"));
    let mut l2 = Layout::new(&t.path().join("b"));
    let b2 = l2.image(&[(tar_layer(&[("only-b", b"b")]), true)]);
    l2.list(
        media::OCI_MANIFEST,
        &b2.manifest,
        b2.manifest_size,
        Some("b"),
    );
    l2.finish();
    let store = Store::open(t.path().join("store")).unwrap();
    layout::import(&store, &t.path().join("a"), None, &mut no_progress()).unwrap();
    layout::import(&store, &t.path().join("b"), None, &mut no_progress()).unwrap();
    store.unpack(&b.manifest).unwrap();
    store.unpack(&b2.manifest).unwrap();
    assert_eq!(store.gc(&[]).unwrap(), Default::default());

    assert_eq!(store.rm(&b.manifest).unwrap(), 1);
    assert_eq!(store.rm(&b.manifest).unwrap(), 0);
    // Kept by name (e.g. named in a cordon manifest) even without a record.
    let kept = store.gc(&[b.manifest]).unwrap();
    assert_eq!(kept.blobs, 0);
    let report = store.gc(&[]).unwrap();
    // a's manifest, config and two layers; none of b's.
    assert_eq!(report.blobs, 4, "{report:?}");
    assert_eq!(report.rootfs, 1);
    assert!(!store.blob_path(&b.layers[0]).exists());
    assert!(store.blob_path(&b2.layers[0]).exists());
    assert!(store.unpack(&b2.manifest).unwrap().path.is_dir());
    assert!(matches!(
        store.inspect(&b.manifest),
        Err(StoreError::NotFound(_))
    ));
}

#[test]
fn schema1_and_foreign_layers_are_refused_by_name() {
    let t = common::tmp();
    let mut l = Layout::new(&t.path().join("layout"));
    let s1 = br#"{"schemaVersion":1,"name":"x","tag":"y","architecture":"amd64","fsLayers":[]}"#;
    let d1 = l.blob(s1);
    l.list(media::OCI_MANIFEST, &d1, s1.len(), None);
    l.finish();
    let store = Store::open(t.path().join("store")).unwrap();
    let e = layout::import(&store, &l.dir, None, &mut no_progress()).unwrap_err();
    assert!(e.to_string().contains("schema 1"), "{e}");

    let mut l = Layout::new(&t.path().join("layout2"));
    let layer = gzip(&tar_layer(&[("a", b"a")]));
    let ld = l.blob(&layer);
    let cfg = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [Digest::of(b"").to_string()]},
    }))
    .unwrap();
    let cd = l.blob(&cfg);
    let m = serde_json::to_vec(&json!({
        "schemaVersion": 2, "mediaType": media::DOCKER_MANIFEST,
        "config": common::desc(media::DOCKER_CONFIG, &cd, cfg.len()),
        "layers": [common::desc(media::DOCKER_FOREIGN, &ld, layer.len())],
    }))
    .unwrap();
    let md = l.blob(&m);
    l.list(media::DOCKER_MANIFEST, &md, m.len(), None);
    l.finish();
    let e = layout::import(&store, &l.dir, None, &mut no_progress()).unwrap_err();
    assert!(e.to_string().contains("foreign"), "{e}");
    assert!(store.ls().unwrap().is_empty());
}

// ---- kill -9 of a real writer ----

const CHILD: &str = "CORDON_IMAGE_TEST_CHILD";

/// Run inside a child process by the kill tests: `import:STORE:LAYOUT` or
/// `unpack:STORE:DIGEST`.
#[test]
fn child_process_entry() {
    let Ok(job) = std::env::var(CHILD) else {
        return;
    };
    let mut parts = job.splitn(3, ':');
    let (what, store, arg) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let store = Store::open(store).unwrap();
    match what {
        "import" => {
            layout::import(&store, Path::new(arg), None, &mut no_progress()).unwrap();
        }
        "unpack" => {
            store.unpack(&arg.parse().unwrap()).unwrap();
        }
        _ => panic!("unknown job {what}"),
    }
}

fn spawn_child(job: &str) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_process_entry",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, job)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Wait until `cond` while `child` runs, or panic.
fn wait_for(child: &mut std::process::Child, what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the child ended before {what}"
        );
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// A layout whose one layer is big enough to catch its writer midway.
fn big_layout(dir: &Path) -> common::Built {
    let mut l = Layout::new(dir);
    let names: Vec<String> = (0..2000).map(|i| format!("d{}/f{i}", i % 20)).collect();
    let data: Vec<Vec<u8>> = (0..2000u32)
        .map(|i| i.to_le_bytes().repeat(1024 + (i as usize % 7) * 100))
        .collect();
    let files: Vec<(&str, &[u8])> = names
        .iter()
        .zip(&data)
        .map(|(n, d)| (n.as_str(), d.as_slice()))
        .collect();
    let b = l.image(&[(tar_layer(&files), false)]);
    l.list(media::OCI_MANIFEST, &b.manifest, b.manifest_size, None);
    l.finish();
    b
}

#[test]
fn kill_9_during_import_then_import_again() {
    let t = common::tmp();
    let b = big_layout(&t.path().join("layout"));
    let store_dir = t.path().join("store");
    let store = Store::open(&store_dir).unwrap();
    let job = format!(
        "import:{}:{}",
        store_dir.display(),
        t.path().join("layout").display()
    );
    let mut child = spawn_child(&job);
    let layer_tmp = format!(".tmp-{}-", b.layers[0].hex());
    wait_for(&mut child, "the layer's temporary file", || {
        std::fs::read_dir(store_dir.join("blobs/sha256"))
            .unwrap()
            .flatten()
            .any(|e| {
                e.file_name().to_string_lossy().starts_with(&layer_tmp)
                    && e.metadata().is_ok_and(|m| m.len() > 0)
            })
    });
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        store.ls().unwrap().is_empty(),
        "a killed import left a record"
    );
    assert!(!store.blob_path(&b.layers[0]).exists());
    assert!(!temporaries(&store_dir).is_empty());

    let again = layout::import(&store, &t.path().join("layout"), None, &mut no_progress()).unwrap();
    assert_eq!(again[0].digest, b.manifest);
    assert!(
        temporaries(&store_dir).is_empty(),
        "{:?}",
        temporaries(&store_dir)
    );
    assert!(
        store
            .unpack(&b.manifest)
            .unwrap()
            .path
            .join("d0/f0")
            .is_file()
    );
}

#[test]
fn kill_9_during_unpack_then_unpack_again() {
    let t = common::tmp();
    let b = big_layout(&t.path().join("layout"));
    let store_dir = t.path().join("store");
    let store = Store::open(&store_dir).unwrap();
    layout::import(&store, &t.path().join("layout"), None, &mut no_progress()).unwrap();
    drop_tree(&store, &b.manifest);
    let mut child = spawn_child(&format!("unpack:{}:{}", store_dir.display(), b.manifest));
    let tmp = store_dir.join(format!("rootfs/.tmp-{}/root/d0", b.manifest.hex()));
    wait_for(&mut child, "the unpack's temporary tree", || tmp.is_dir());
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(store.inspect(&b.manifest).unwrap().rootfs.is_none());

    let u = store.unpack(&b.manifest).unwrap();
    assert!(u.fresh);
    let count = std::fs::read_dir(u.path.join("d0")).unwrap().count();
    assert_eq!(count, 100);
    assert!(temporaries(&store_dir).is_empty());
}

const DEFAULT_DIR_CHILD: &str = "CORDON_IMAGE_TEST_DEFAULT_DIR";

/// Run inside a child process by `default_store_dir`: prints the default.
#[test]
fn default_dir_entry() {
    if std::env::var_os(DEFAULT_DIR_CHILD).is_some() {
        println!("DIR={}", Store::default_dir().unwrap().display());
    }
}

fn default_dir_with(env: &[(&str, &str)], as_nobody: bool) -> String {
    let exe = std::env::current_exe().unwrap();
    let mut cmd = if as_nobody {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&exe);
        c
    } else {
        Command::new(&exe)
    };
    cmd.args([
        "--exact",
        "default_dir_entry",
        "--nocapture",
        "--test-threads=1",
    ])
    .env_remove("CORDON_STORE")
    .env_remove("XDG_DATA_HOME")
    .env(DEFAULT_DIR_CHILD, "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.split_once("DIR=").map(|(_, d)| d))
        .unwrap_or_else(|| panic!("no answer: {text} {}", String::from_utf8_lossy(&out.stderr)))
        .to_string()
}

#[test]
fn default_store_dir() {
    assert_eq!(
        default_dir_with(&[("CORDON_STORE", "/srv/images")], false),
        "/srv/images"
    );
    if cordon_testkit::is_root() {
        assert_eq!(default_dir_with(&[], false), "/var/lib/cordon");
        assert_eq!(
            default_dir_with(&[("HOME", "/home/u"), ("XDG_DATA_HOME", "/x/data")], true),
            "/x/data/cordon"
        );
        assert_eq!(
            default_dir_with(&[("HOME", "/home/u")], true),
            "/home/u/.local/share/cordon"
        );
        assert_eq!(
            default_dir_with(&[("HOME", "/home/u"), ("CORDON_STORE", "/s")], true),
            "/s"
        );
    }
}
