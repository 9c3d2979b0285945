//! Pulls from a real OCI distribution registry on loopback: Debian's
//! `docker-registry` (distribution), started by each test with its storage
//! in a temporary directory; images written by hand as OCI layouts and
//! pushed with `skopeo`. Nothing but 127.0.0.1 is contacted.

mod common;
use cordon_testkit::skip;

use std::ffi::OsString;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use common::{Layout, other_arch, tar_layer};
use cordon_image::digest::VerifyError;
use cordon_image::manifest::{Platform, media};
use cordon_image::reference::ReferenceError;
use cordon_image::registry::{self, PullOptions};
use cordon_image::store::{Progress, StoreError};
use cordon_image::{Digest, ImageRef, Store};
use tempfile::TempDir;

const USER: &str = "alice";
const PASSWORD: &str = "s3cret-pw";

/// Whether `program` is on the PATH; if not, the test fails (or skips,
/// with `CORDON_TEST_ALLOW_SKIP=1`).
fn have(program: &str, package: &str) -> bool {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()));
    if !found {
        skip::skip_or_fail(
            &skip::this_test(),
            &format!("{program} is not installed: apt-get install -y {package} (scripts/setup.sh)"),
        );
    }
    found
}

/// A registry serving on 127.0.0.1, storage in a temporary directory.
struct Registry {
    child: Child,
    port: u16,
    dir: TempDir,
}

impl Registry {
    /// `None` when a program it needs is missing (and skipping is allowed).
    fn start(auth: bool) -> Option<Registry> {
        if !have("docker-registry", "docker-registry")
            || !have("skopeo", "skopeo")
            || (auth && !have("htpasswd", "apache2-utils"))
        {
            return None;
        }
        let mut dir = common::tmp();
        let mut last = String::new();
        for _ in 0..5 {
            let port = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap()
                .port();
            let mut config = format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n  secret: test-secret\n",
                dir.path().join("storage").display()
            );
            if auth {
                let out = Command::new("htpasswd")
                    .args(["-Bbn", USER, PASSWORD])
                    .output()
                    .unwrap();
                assert!(out.status.success());
                std::fs::write(dir.path().join("htpasswd"), out.stdout).unwrap();
                config.push_str(&format!(
                    "auth:\n  htpasswd:\n    realm: cordon-test\n    path: {}\n",
                    dir.path().join("htpasswd").display()
                ));
            }
            let config_path = dir.path().join("config.yml");
            std::fs::write(&config_path, config).unwrap();
            let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
            let child = Command::new("docker-registry")
                .arg("serve")
                .arg(&config_path)
                .stdout(log.try_clone().unwrap())
                .stderr(log)
                .spawn()
                .expect("start docker-registry");
            let mut r = Registry { child, port, dir };
            if r.wait_ready() {
                return Some(r);
            }
            last = std::fs::read_to_string(r.dir.path().join("registry.log")).unwrap_or_default();
            let _ = r.child.kill();
            let _ = r.child.wait();
            dir = std::mem::replace(&mut r.dir, common::tmp());
        }
        panic!("docker-registry did not start: {last}");
    }

    fn wait_ready(&mut self) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(20) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = s.write_all(b"GET /v2/ HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
                let mut head = [0u8; 12];
                if s.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.") {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Push the layout's `tag` as `repo:tag` (all platforms of an index);
    /// returns the digest skopeo pushed.
    fn push(&self, layout: &Path, tag: &str, repo: &str, creds: bool) -> Digest {
        let digestfile = self
            .dir
            .path()
            .join(format!("digest-{repo}-{tag}").replace('/', "_"));
        let mut cmd = Command::new("skopeo");
        cmd.args([
            "--insecure-policy",
            "copy",
            "--all",
            "--preserve-digests",
            "--dest-tls-verify=false",
        ])
        .arg("--digestfile")
        .arg(&digestfile);
        if creds {
            cmd.arg(format!("--dest-creds={USER}:{PASSWORD}"));
        }
        let out = cmd
            .arg(format!("oci:{}:{tag}", layout.display()))
            .arg(format!("docker://{}/{repo}:{tag}", self.addr()))
            .env("HOME", self.dir.path())
            .stdin(Stdio::null())
            .output()
            .expect("run skopeo");
        assert!(
            out.status.success(),
            "skopeo copy failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::read_to_string(digestfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// Where the registry keeps a blob (manifests included).
    fn blob_data(&self, d: &Digest) -> PathBuf {
        let hex = d.hex();
        self.dir
            .path()
            .join("storage/docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(&hex)
            .join("data")
    }

    fn image(&self, repo: &str, d: &Digest) -> ImageRef {
        format!("{}/{repo}@{d}", self.addr()).parse().unwrap()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A layout with one image whose content is unique to `seed`, listed as `tag`.
fn unique_image(dir: &Path, seed: &str, tag: &str) -> common::Built {
    let mut l = Layout::new(dir);
    let b = l.image(&[
        (
            tar_layer(&[
                ("bin/", b""),
                ("bin/tool", b"#!/bin/sh\n"),
                ("seed", seed.as_bytes()),
            ]),
            true,
        ),
        (
            tar_layer(&[("etc/", b""), ("etc/motd", seed.as_bytes())]),
            false,
        ),
    ]);
    l.list(media::OCI_MANIFEST, &b.manifest, b.manifest_size, Some(tag));
    l.finish();
    b
}

/// Options that find no credentials (an empty Docker config directory).
fn anonymous(t: &Path) -> PullOptions {
    let dir = t.join("no-docker-config");
    std::fs::create_dir_all(&dir).unwrap();
    PullOptions {
        docker_config: Some(dir),
        helper_path: Some(OsString::new()),
        ..PullOptions::default()
    }
}

fn pull(
    store: &Store,
    image: &ImageRef,
    opts: &PullOptions,
) -> Result<cordon_image::store::Ingested, StoreError> {
    registry::pull(store, image, opts, &mut |_| {})
}

fn temporaries(store: &Store) -> usize {
    ["blobs/sha256", "images", "rootfs"]
        .iter()
        .flat_map(|s| std::fs::read_dir(store.dir().join(s)).unwrap().flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with(".tmp-"))
        .count()
}

#[test]
fn pull_by_digest_then_unpack() {
    let Some(reg) = Registry::start(false) else {
        return;
    };
    let t = common::tmp();
    let b = unique_image(&t.path().join("layout"), "pull_by_digest", "v1");
    let pushed = reg.push(&t.path().join("layout"), "v1", "tools/hello", false);
    assert_eq!(pushed, b.manifest, "skopeo changed the manifest");

    let store = Store::open(t.path().join("store")).unwrap();
    let image = reg.image("tools/hello", &b.manifest);
    let mut seen: Vec<Progress> = Vec::new();
    let got = registry::pull(&store, &image, &anonymous(t.path()), &mut |p| seen.push(*p)).unwrap();
    assert!(got.fetched);
    assert_eq!(got.record.names, [format!("{}/tools/hello", reg.addr())]);
    assert_eq!(got.record.manifest, b.manifest);
    assert_eq!(got.record.config, b.config);
    let last = seen.last().unwrap();
    assert_eq!((last.layers_done, last.layers_total), (2, 2));
    assert_eq!(last.bytes_done, last.bytes_total);
    assert!(seen.len() > 2);
    assert!(temporaries(&store) == 0);

    let root = store.unpacked(&b.manifest).unwrap();
    assert_eq!(
        std::fs::read(root.join("etc/motd")).unwrap(),
        b"pull_by_digest"
    );
    let info = store.inspect(&b.manifest).unwrap();
    assert_eq!(info.config.entrypoint, Some(vec!["/bin/tool".to_string()]));

    // A second pull finds it complete and asks the registry for nothing.
    drop(reg);
    let again = pull(&store, &image, &anonymous(t.path())).unwrap();
    assert!(!again.fetched);
}

#[test]
fn multi_platform_index_resolves_to_the_host() {
    let Some(reg) = Registry::start(false) else {
        return;
    };
    let t = common::tmp();
    let mut l = Layout::new(&t.path().join("layout"));
    let host = l.image(&[(tar_layer(&[("which", b"host")]), true)]);
    let other = l.image_with(
        &[(tar_layer(&[("which", b"other")]), true)],
        other_arch(),
        serde_json::json!({}),
        None,
    );
    let arch = Platform::host().architecture;
    let (index, size) = l.platform_index(&[(&other, other_arch()), (&host, &arch)]);
    l.list(media::OCI_INDEX, &index, size, Some("multi"));
    l.finish();
    assert_eq!(reg.push(&l.dir, "multi", "tools/multi", false), index);

    let store = Store::open(t.path().join("store")).unwrap();
    let got = pull(
        &store,
        &reg.image("tools/multi", &index),
        &anonymous(t.path()),
    )
    .unwrap();
    assert_eq!(got.record.digest, index);
    assert_eq!(got.record.manifest, host.manifest);
    // Only the host's layers were fetched.
    assert!(!store.blob_path(&other.layers[0]).exists());
    let root = store.unpacked(&index).unwrap();
    assert_eq!(std::fs::read(root.join("which")).unwrap(), b"host");

    // The pin may name the platform manifest instead.
    let store2 = Store::open(t.path().join("store2")).unwrap();
    let got = pull(
        &store2,
        &reg.image("tools/multi", &host.manifest),
        &anonymous(t.path()),
    )
    .unwrap();
    assert_eq!(got.record.digest, host.manifest);
    assert_eq!(got.record.manifest, host.manifest);
}

#[test]
fn a_tag_is_refused() {
    let Some(reg) = Registry::start(false) else {
        return;
    };
    let e = format!("{}/tools/hello:v1", reg.addr())
        .parse::<ImageRef>()
        .unwrap_err();
    assert!(matches!(e, ReferenceError::NotPinned { .. }));
    assert!(
        e.to_string()
            .contains(&format!("{}/tools/hello@sha256:", reg.addr())),
        "{e}"
    );
}

#[test]
fn a_wrong_pin_is_refused() {
    let Some(reg) = Registry::start(false) else {
        return;
    };
    let t = common::tmp();
    let b = unique_image(&t.path().join("layout"), "wrong_pin", "v1");
    reg.push(&t.path().join("layout"), "v1", "tools/hello", false);
    let store = Store::open(t.path().join("store")).unwrap();
    // A digest the registry has no manifest for, and the config's digest
    // (a blob of the repository, but not a manifest).
    for wrong in [Digest::of(b"something else"), b.config] {
        let e = pull(
            &store,
            &reg.image("tools/hello", &wrong),
            &anonymous(t.path()),
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains(&wrong.to_string()), "{msg}");
        assert!(store.ls().unwrap().is_empty());
    }
    // The right pin, in another repository, is not there either.
    let e = pull(
        &store,
        &reg.image("tools/other", &b.manifest),
        &anonymous(t.path()),
    )
    .unwrap_err();
    assert!(e.to_string().contains("registry 127.0.0.1"), "{e}");
    assert!(store.ls().unwrap().is_empty());
}

fn docker_config(dir: &Path, body: &str) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.json"), body).unwrap();
    dir.to_path_buf()
}

#[test]
fn a_private_registry_with_credentials() {
    let Some(reg) = Registry::start(true) else {
        return;
    };
    let t = common::tmp();
    let b = unique_image(&t.path().join("layout"), "private", "v1");
    reg.push(&t.path().join("layout"), "v1", "team/private", true);
    let image = reg.image("team/private", &b.manifest);

    // Anonymous: refused.
    let store = Store::open(t.path().join("store")).unwrap();
    let e = pull(&store, &image, &anonymous(t.path())).unwrap_err();
    assert!(e.to_string().contains("not authorized"), "{e}");
    assert!(store.ls().unwrap().is_empty());

    // Wrong password: refused.
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let wrong = PullOptions {
        docker_config: Some(docker_config(
            &t.path().join("wrong"),
            &format!(
                r#"{{"auths": {{"{}": {{"auth": "{}"}}}}}}"#,
                reg.addr(),
                b64(&format!("{USER}:nope"))
            ),
        )),
        helper_path: Some(OsString::new()),
        ..PullOptions::default()
    };
    assert!(pull(&store, &image, &wrong).is_err());

    // config.json auths (keyed the way `docker login` writes it).
    let auths = PullOptions {
        docker_config: Some(docker_config(
            &t.path().join("auths"),
            &format!(
                r#"{{"auths": {{"http://{}/v1/": {{"auth": "{}"}}}}}}"#,
                reg.addr(),
                b64(&format!("{USER}:{PASSWORD}"))
            ),
        )),
        helper_path: Some(OsString::new()),
        ..PullOptions::default()
    };
    let got = pull(&store, &image, &auths).unwrap();
    assert!(got.fetched);
    assert!(store.unpacked(&b.manifest).unwrap().join("seed").is_file());

    // A credential helper (credHelpers), asked with the registry's address.
    let bin = t.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let helper = bin.join("docker-credential-cordontest");
    std::fs::write(
        &helper,
        format!(
            "#!/bin/sh\n[ \"$1\" = get ] || exit 2\nread -r server\nif [ \"$server\" = \"{addr}\" ]; then\n  printf '{{\"ServerURL\":\"%s\",\"Username\":\"{USER}\",\"Secret\":\"{PASSWORD}\"}}' \"$server\"\nelse\n  echo 'credentials not found in native keychain'; exit 1\nfi\n",
            addr = reg.addr()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&helper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let helped = PullOptions {
        docker_config: Some(docker_config(
            &t.path().join("helper"),
            &format!(r#"{{"credHelpers": {{"{}": "cordontest"}}}}"#, reg.addr()),
        )),
        helper_path: Some(bin.clone().into_os_string()),
        ..PullOptions::default()
    };
    let store2 = Store::open(t.path().join("store2")).unwrap();
    let got = pull(&store2, &image, &helped).unwrap();
    assert!(got.fetched);
    // The helper has nothing for other registries: they stay anonymous.
    assert!(matches!(
        registry::credentials("127.0.0.2:1", &helped).unwrap(),
        oci_client::secrets::RegistryAuth::Anonymous
    ));
    // credsStore names the helper for every registry.
    let store3 = Store::open(t.path().join("store3")).unwrap();
    let stored = PullOptions {
        docker_config: Some(docker_config(
            &t.path().join("store-helper"),
            r#"{"credsStore": "cordontest"}"#,
        )),
        helper_path: Some(bin.into_os_string()),
        ..PullOptions::default()
    };
    assert!(pull(&store3, &image, &stored).unwrap().fetched);
}

/// Change one digit of the first `"size":` in a manifest: still valid JSON
/// of the same length, but not the content its digest names.
fn tamper_manifest(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = bytes
        .windows(7)
        .position(|w| w == b"\"size\":")
        .expect("a size in the manifest")
        + 7;
    bytes[at] = if bytes[at] == b'9' {
        b'8'
    } else {
        bytes[at] + 1
    };
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_blob_that_does_not_match_its_digest_is_refused() {
    let Some(reg) = Registry::start(false) else {
        return;
    };
    let t = common::tmp();
    let b = unique_image(&t.path().join("layout"), "corrupt_blob", "v1");
    reg.push(&t.path().join("layout"), "v1", "tools/corrupt", false);
    // Same size, one byte different, in the registry's own storage.
    let data = reg.blob_data(&b.layers[1]);
    let mut bytes = std::fs::read(&data).unwrap();
    bytes[600] ^= 0x55;
    std::fs::write(&data, bytes).unwrap();

    let store = Store::open(t.path().join("store")).unwrap();
    let image = reg.image("tools/corrupt", &b.manifest);
    let e = pull(&store, &image, &anonymous(t.path())).unwrap_err();
    assert!(
        matches!(&e, StoreError::Verify(VerifyError::WrongDigest { expected, .. }) if *expected == b.layers[1]),
        "{e}"
    );
    assert!(store.ls().unwrap().is_empty(), "a record for a bad image");
    assert!(!store.blob_path(&b.layers[1]).exists());
    assert_eq!(temporaries(&store), 0);
    assert!(matches!(
        store.unpacked(&b.manifest),
        Err(StoreError::NotFound(_))
    ));
}

#[test]
fn a_manifest_that_does_not_match_its_digest_is_refused() {
    let Some(reg) = Registry::start(false) else {
        return;
    };
    let t = common::tmp();
    let b = unique_image(&t.path().join("layout"), "corrupt_manifest", "v1");
    reg.push(&t.path().join("layout"), "v1", "tools/corrupt", false);
    tamper_manifest(&reg.blob_data(&b.manifest));

    let store = Store::open(t.path().join("store")).unwrap();
    let e = pull(
        &store,
        &reg.image("tools/corrupt", &b.manifest),
        &anonymous(t.path()),
    )
    .unwrap_err();
    assert!(
        matches!(&e, StoreError::Verify(VerifyError::WrongDigest { expected, .. }) if *expected == b.manifest),
        "{e}"
    );
    assert!(store.ls().unwrap().is_empty());
    assert!(!store.blob_path(&b.manifest).exists());
    assert_eq!(temporaries(&store), 0);
}

const CHILD: &str = "CORDON_IMAGE_TEST_PULL";

/// Run inside a child process by the kill test: `STORE|REFERENCE|DOCKER_CONFIG`.
#[test]
fn child_process_entry() {
    let Ok(job) = std::env::var(CHILD) else {
        return;
    };
    let parts: Vec<&str> = job.split('|').collect();
    let store = Store::open(parts[0]).unwrap();
    let opts = PullOptions {
        docker_config: Some(parts[2].into()),
        helper_path: Some(OsString::new()),
        ..PullOptions::default()
    };
    pull(&store, &parts[1].parse().unwrap(), &opts).unwrap();
}

#[test]
fn kill_9_during_a_pull_then_pull_again() {
    let Some(reg) = Registry::start(false) else {
        return;
    };
    let t = common::tmp();
    let mut l = Layout::new(&t.path().join("layout"));
    let names: Vec<String> = (0..3000).map(|i| format!("d{}/f{i}", i % 30)).collect();
    let data: Vec<Vec<u8>> = (0..3000u32)
        .map(|i| i.to_le_bytes().repeat(1024 + (i as usize % 5) * 200))
        .collect();
    let files: Vec<(&str, &[u8])> = names
        .iter()
        .zip(&data)
        .map(|(n, d)| (n.as_str(), d.as_slice()))
        .collect();
    let b = l.image(&[(tar_layer(&files), false)]);
    l.list(
        media::OCI_MANIFEST,
        &b.manifest,
        b.manifest_size,
        Some("big"),
    );
    l.finish();
    assert_eq!(reg.push(&l.dir, "big", "tools/big", false), b.manifest);

    let store_dir = t.path().join("store");
    let store = Store::open(&store_dir).unwrap();
    let image = reg.image("tools/big", &b.manifest);
    let opts = anonymous(t.path());
    let job = format!(
        "{}|{image}|{}",
        store_dir.display(),
        opts.docker_config.as_ref().unwrap().display()
    );
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_process_entry", "--test-threads=1"])
        .env(CHILD, job)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let layer_tmp = format!(".tmp-{}-", b.layers[0].hex());
    let start = Instant::now();
    loop {
        let midway = std::fs::read_dir(store_dir.join("blobs/sha256"))
            .unwrap()
            .flatten()
            .any(|e| {
                e.file_name().to_string_lossy().starts_with(&layer_tmp)
                    && e.metadata().is_ok_and(|m| m.len() > 0)
            });
        if midway {
            break;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the pull ended before it could be killed"
        );
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the pull never started its layer"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        store.ls().unwrap().is_empty(),
        "a killed pull left a record"
    );
    assert!(!store.blob_path(&b.layers[0]).exists());
    assert!(temporaries(&store) > 0);

    let got = pull(&store, &image, &opts).unwrap();
    assert!(got.fetched);
    assert_eq!(temporaries(&store), 0);
    let root = store.unpacked(&b.manifest).unwrap();
    assert_eq!(std::fs::read_dir(root.join("d0")).unwrap().count(), 100);
}

/// Everything under the store's blobs, images and rootfs directories.
fn contents(store: &Store) -> Vec<PathBuf> {
    ["blobs/sha256", "images", "rootfs"]
        .iter()
        .flat_map(|s| std::fs::read_dir(store.dir().join(s)).unwrap().flatten())
        .map(|e| e.path())
        .collect()
}

/// A pull is verified as an import is (the same ingest, tests/verify.rs):
/// a layer the unpacker refuses is refused at the pull, naming the layer
/// and the entry, and nothing of the image stays.
#[test]
fn a_layer_that_could_never_unpack_is_refused_at_the_pull() {
    let Some(reg) = Registry::start(false) else {
        return;
    };
    let t = common::tmp();
    let mut l = Layout::new(&t.path().join("layout"));
    let mut top = Vec::new();
    {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Link);
        h.set_size(0);
        h.set_mode(0o644);
        h.as_old_mut().name[..6].copy_from_slice(b"shadow");
        h.as_old_mut().linkname[..11].copy_from_slice(b"/etc/shadow");
        h.set_cksum();
        top.extend_from_slice(h.as_bytes());
        top.extend(std::iter::repeat_n(0u8, 1024));
    }
    let b = l.image(&[
        (
            tar_layer(&[("bin/", b""), ("bin/tool", b"#!/bin/sh\n")]),
            true,
        ),
        (top, true),
    ]);
    l.list(
        media::OCI_MANIFEST,
        &b.manifest,
        b.manifest_size,
        Some("v1"),
    );
    l.finish();
    reg.push(&l.dir, "v1", "tools/hostile", false);

    let store = Store::open(t.path().join("store")).unwrap();
    let e = pull(
        &store,
        &reg.image("tools/hostile", &b.manifest),
        &anonymous(t.path()),
    )
    .unwrap_err();
    assert!(matches!(e, StoreError::Unpack { index: 1, .. }), "{e}");
    assert_eq!(
        e.to_string(),
        format!(
            "layer 1 ({}): entry \"shadow\" refused: the hard link's target is not in the rootfs",
            b.layers[1]
        )
    );
    assert!(store.ls().unwrap().is_empty());
    assert_eq!(contents(&store), Vec::<PathBuf>::new());

    // The positive control: the same registry, a good image, pulled and
    // unpacked by the pull.
    let good = unique_image(&t.path().join("good"), "good_control", "v1");
    reg.push(&t.path().join("good"), "v1", "tools/good", false);
    pull(
        &store,
        &reg.image("tools/good", &good.manifest),
        &anonymous(t.path()),
    )
    .unwrap();
    assert!(store.inspect(&good.manifest).unwrap().rootfs.is_some());
}

/// A hand-written distribution server on loopback whose manifest never
/// ends (or announces more than 4 MiB): `/v2/` answers 200, a manifest
/// request gets `total` bytes of JSON-ish filler. Returns its address and
/// a handle that yields how many body bytes it managed to send.
fn endless_manifest(announce: bool, total: u64) -> (String, std::thread::JoinHandle<u64>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let handle = std::thread::spawn(move || {
        for conn in listener.incoming() {
            let mut s = conn.unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match s.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
                if head.len() == 4 && &head[..] != b"GET " {
                    break; // TLS, tried first: refused.
                }
            }
            let head = String::from_utf8_lossy(&head).into_owned();
            if !head.starts_with("GET ") {
                continue;
            }
            if !head.contains("/manifests/") {
                let _ = s.write_all(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
                );
                continue;
            }
            let framing = if announce {
                format!("Content-Length: {total}\r\n")
            } else {
                "Transfer-Encoding: chunked\r\n".to_string()
            };
            let _ = s.write_all(
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: {}\r\n{framing}Connection: close\r\n\r\n",
                    media::OCI_MANIFEST
                )
                .as_bytes(),
            );
            let chunk = vec![b' '; 64 << 10];
            let mut sent = 0u64;
            while sent < total {
                let r = if announce {
                    s.write_all(&chunk)
                } else {
                    s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes())
                        .and_then(|()| s.write_all(&chunk))
                        .and_then(|()| s.write_all(b"\r\n"))
                };
                if r.is_err() {
                    break;
                }
                sent += chunk.len() as u64;
            }
            return sent;
        }
        0
    });
    (addr, handle)
}

#[test]
fn a_manifest_over_4_mib_is_refused_without_reading_it_whole() {
    let t = common::tmp();
    let pin = Digest::of(b"a manifest");
    // Chunked, no length: refused once 4 MiB have arrived, the rest never
    // read (the server could not send its 256 MiB).
    let (addr, server) = endless_manifest(false, 256 << 20);
    let store = Store::open(t.path().join("store")).unwrap();
    let image: ImageRef = format!("{addr}/tools/big@{pin}").parse().unwrap();
    let e = pull(&store, &image, &anonymous(t.path())).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains(&format!(
            "manifest {pin} refused: over the 4 MiB limit on a manifest (4194304 bytes)"
        )),
        "{msg}"
    );
    assert!(msg.contains("bytes arrived"), "{msg}");
    let sent = server.join().unwrap();
    assert!(sent < 64 << 20, "the whole body was read: {sent}");
    assert!(store.ls().unwrap().is_empty());
    assert_eq!(contents(&store), Vec::<PathBuf>::new());

    // A Content-Length over the limit: refused before any of the body.
    let (addr, server) = endless_manifest(true, 5 << 20);
    let image: ImageRef = format!("{addr}/tools/big@{pin}").parse().unwrap();
    let e = pull(&store, &image, &anonymous(t.path())).unwrap_err();
    assert!(
        e.to_string()
            .contains("over the 4 MiB limit on a manifest (4194304 bytes): the registry announces 5242880 bytes"),
        "{e}"
    );
    drop(server);
    assert_eq!(contents(&store), Vec::<PathBuf>::new());
}
