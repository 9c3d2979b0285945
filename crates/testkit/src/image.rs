//! Tiny image root file systems for tests of image roots, built from
//! Debian's `busybox-static` (`scripts/setup.sh` installs it): what an
//! unpacked OCI image looks like on the host, without the image store.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

use crate::Scratch;

/// The static busybox of Debian's `busybox-static`.
pub const BUSYBOX: &str = "/bin/busybox";

/// The image's own `/etc/passwd`: nothing like the host's.
pub const PASSWD: &str = "root:x:0:0:image root:/root:/bin/sh\n\
                          imageuser:x:4242:4242:cordon test image user:/home/imageuser:/bin/sh\n";

/// The applets the busybox image has as `/bin` symlinks.
pub const APPLETS: [&str; 4] = ["sh", "ls", "id", "cat"];

/// Why this machine cannot build the images, if it cannot.
pub fn missing() -> Option<String> {
    if Path::new(BUSYBOX).is_file() {
        None
    } else {
        Some(format!(
            "{BUSYBOX} is missing (apt-get install busybox-static)"
        ))
    }
}

/// A scratch directory every uid can enter, for a rootfs.
fn rootfs_dir(prefix: &str) -> Scratch {
    crate::scratch::named(prefix)
}

fn mkdir(p: &Path) {
    fs::create_dir(p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
    fs::set_permissions(p, fs::Permissions::from_mode(0o755)).expect("chmod");
}

fn copy_exe(from: &str, to: &Path) {
    fs::copy(from, to).unwrap_or_else(|e| panic!("copy {from} to {}: {e}", to.display()));
    fs::set_permissions(to, fs::Permissions::from_mode(0o755)).expect("chmod");
}

/// A busybox image: `/bin/busybox` with the [`APPLETS`] as symlinks to
/// it (`sh -> busybox`), and an `/etc/passwd` ([`PASSWD`]) of its own; no
/// `/tmp`, `/proc` or `/dev` at all.
pub fn busybox() -> Scratch {
    let d = rootfs_dir("cordon-image-busybox");
    let root = d.path();
    mkdir(&root.join("bin"));
    copy_exe(BUSYBOX, &root.join("bin/busybox"));
    for a in APPLETS {
        symlink("busybox", root.join("bin").join(a)).expect("symlink an applet");
    }
    mkdir(&root.join("etc"));
    fs::write(root.join("etc/passwd"), PASSWD).expect("write /etc/passwd");
    fs::set_permissions(root.join("etc/passwd"), fs::Permissions::from_mode(0o644))
        .expect("chmod /etc/passwd");
    d
}

/// What [`busybox_with_bundle`] puts in the image's trust bundle.
pub const IMAGE_ROOTS: &str = "IMAGE ROOTS\n";

/// [`busybox`] with a trust bundle of its own
/// (`/etc/ssl/certs/ca-certificates.crt` holding [`IMAGE_ROOTS`]) and
/// `/etc/ssl/cert.pem` a symlink to it, as Debian has them.
pub fn busybox_with_bundle() -> Scratch {
    let d = busybox();
    let root = d.path();
    mkdir(&root.join("etc/ssl"));
    mkdir(&root.join("etc/ssl/certs"));
    fs::write(root.join("etc/ssl/certs/ca-certificates.crt"), IMAGE_ROOTS)
        .expect("write the image's bundle");
    symlink("certs/ca-certificates.crt", root.join("etc/ssl/cert.pem")).expect("symlink cert.pem");
    d
}

/// A distroless image: one static binary, `/app/busybox`, and nothing
/// else (no shell, no `/etc`).
pub fn distroless() -> Scratch {
    let d = rootfs_dir("cordon-image-distroless");
    mkdir(&d.path().join("app"));
    copy_exe(BUSYBOX, &d.path().join("app/busybox"));
    d
}
