//! The guest's initramfs: the init as `/init`, the kernel modules it loads
//! (with their dependencies, in load order, listed in
//! `/etc/cordon/modules`), and nothing else. Written as a `newc` cpio
//! archive (the format the kernel unpacks), byte-for-byte reproducible:
//! every entry is owned by root with mtime 0.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use thiserror::Error;

/// The modules a guest needs when the kernel has them as modules: the
/// virtio-mmio transport (`-M microvm`), the block device, the serial
/// ports, and EROFS.
pub const GUEST_MODULES: &[&str] = &["virtio_mmio", "virtio_blk", "virtio_console", "erofs"];

#[derive(Debug, Error)]
pub enum InitramfsError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("kernel module {0} is neither built in nor in modules.dep")]
    UnknownModule(String),
    #[error("cannot tell the kernel release of {0} (expected vmlinuz-RELEASE or vmlinux-RELEASE)")]
    Release(PathBuf),
}

fn io(path: &Path) -> impl Fn(std::io::Error) -> InitramfsError + '_ {
    move |source| InitramfsError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The release of a Debian kernel image from its file name
/// (`/boot/vmlinuz-6.1.0-57-cloud-amd64` → `6.1.0-57-cloud-amd64`).
pub fn kernel_release(kernel: &Path) -> Result<String, InitramfsError> {
    kernel
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(|n| {
            n.strip_prefix("vmlinuz-")
                .or_else(|| n.strip_prefix("vmlinux-"))
        })
        .map(str::to_owned)
        .ok_or_else(|| InitramfsError::Release(kernel.to_owned()))
}

fn module_name(path: &str) -> String {
    let file = path.rsplit('/').next().unwrap_or(path);
    let stem = file.split(".ko").next().unwrap_or(file);
    stem.replace('-', "_")
}

/// The module files (relative to `moddir`, e.g.
/// `kernel/drivers/virtio/virtio.ko`) to load for `wanted`, dependencies
/// first, each once. Modules built into the kernel (`modules.builtin`) are
/// left out.
pub fn resolve_modules(moddir: &Path, wanted: &[&str]) -> Result<Vec<String>, InitramfsError> {
    let dep_path = moddir.join("modules.dep");
    let deps_text = fs::read_to_string(&dep_path).map_err(io(&dep_path))?;
    let builtin_path = moddir.join("modules.builtin");
    let builtin: BTreeSet<String> = match fs::read_to_string(&builtin_path) {
        Ok(t) => t.lines().map(module_name).collect(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeSet::new(),
        Err(e) => return Err(io(&builtin_path)(e)),
    };
    // name -> (file, its dependencies' files)
    let mut deps: HashMap<String, (String, Vec<String>)> = HashMap::new();
    for line in deps_text.lines() {
        let Some((file, rest)) = line.split_once(':') else {
            continue;
        };
        let needs = rest.split_whitespace().map(str::to_owned).collect();
        deps.insert(module_name(file), (file.to_owned(), needs));
    }
    let mut order = Vec::new();
    let mut seen = BTreeSet::new();
    for w in wanted {
        let name = w.replace('-', "_");
        if builtin.contains(&name) {
            continue;
        }
        let Some((file, needs)) = deps.get(&name) else {
            return Err(InitramfsError::UnknownModule(name));
        };
        // modules.dep lists every (transitive) dependency, the ones loaded
        // last first: load them in reverse.
        for f in needs.iter().rev().chain(std::iter::once(file)) {
            if seen.insert(f.clone()) {
                order.push(f.clone());
            }
        }
    }
    Ok(order)
}

/// A `newc` cpio archive being written.
pub struct Cpio {
    buf: Vec<u8>,
    ino: u32,
    dirs: BTreeSet<String>,
}

impl Default for Cpio {
    fn default() -> Self {
        Self::new()
    }
}

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFCHR: u32 = 0o020000;

impl Cpio {
    pub fn new() -> Self {
        Cpio {
            buf: Vec::new(),
            ino: 1,
            dirs: BTreeSet::new(),
        }
    }

    fn entry(&mut self, name: &str, mode: u32, rdev: (u32, u32), data: &[u8]) {
        let name = name.trim_start_matches('/');
        let fields = [
            self.ino,
            mode,
            0,
            0,
            if mode & S_IFDIR == S_IFDIR { 2 } else { 1 },
            0,
            u32::try_from(data.len()).unwrap_or(u32::MAX),
            0,
            0,
            rdev.0,
            rdev.1,
            u32::try_from(name.len() + 1).unwrap_or(u32::MAX),
            0,
        ];
        self.ino += 1;
        self.buf.extend_from_slice(b"070701");
        for f in fields {
            self.buf.extend_from_slice(format!("{f:08x}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    /// A directory and every missing parent (mode 0755).
    pub fn dir(&mut self, path: &str) {
        let mut cur = String::new();
        for part in path.trim_matches('/').split('/').filter(|p| !p.is_empty()) {
            if !cur.is_empty() {
                cur.push('/');
            }
            cur.push_str(part);
            if self.dirs.insert(cur.clone()) {
                let c = cur.clone();
                self.entry(&c, S_IFDIR | 0o755, (0, 0), &[]);
            }
        }
    }

    /// A regular file (its parents created).
    pub fn file(&mut self, path: &str, mode: u32, data: &[u8]) {
        if let Some((parent, _)) = path.trim_start_matches('/').rsplit_once('/') {
            self.dir(parent);
        }
        self.entry(path, S_IFREG | (mode & 0o7777), (0, 0), data);
    }

    /// A character device node.
    pub fn char_dev(&mut self, path: &str, mode: u32, major: u32, minor: u32) {
        if let Some((parent, _)) = path.trim_start_matches('/').rsplit_once('/') {
            self.dir(parent);
        }
        self.entry(path, S_IFCHR | (mode & 0o7777), (major, minor), &[]);
    }

    /// The archive, trailer included.
    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, (0, 0), &[]);
        // The kernel reads initramfs in 512-byte blocks; pad like cpio(1).
        while !self.buf.len().is_multiple_of(512) {
            self.buf.push(0);
        }
        self.buf
    }
}

/// Writes the guest initramfs to `out`: `init` as `/init`, and the modules
/// [`GUEST_MODULES`] needs from `moddir` (the kernel's
/// `/lib/modules/RELEASE`; `None` for a kernel with those drivers built
/// in).
pub fn build(init: &Path, moddir: Option<&Path>, out: &Path) -> Result<(), InitramfsError> {
    let mut cpio = Cpio::new();
    for d in [
        "dev",
        "proc",
        "sys",
        "mnt",
        "tmp",
        "etc/cordon",
        "lib/modules",
    ] {
        cpio.dir(d);
    }
    cpio.char_dev("dev/console", 0o600, 5, 1);
    let init_bytes = fs::read(init).map_err(io(init))?;
    cpio.file("init", 0o755, &init_bytes);
    let mut list = String::new();
    if let Some(moddir) = moddir {
        for rel in resolve_modules(moddir, GUEST_MODULES)? {
            let src = moddir.join(&rel);
            let bytes = fs::read(&src).map_err(io(&src))?;
            cpio.file(&format!("lib/modules/{rel}"), 0o644, &bytes);
            list.push_str(&rel);
            list.push('\n');
        }
    }
    cpio.file("etc/cordon/modules", 0o644, list.as_bytes());
    let bytes = cpio.finish();
    let tmp = out.with_extension("tmp");
    let mut f = fs::File::create(&tmp).map_err(io(&tmp))?;
    f.write_all(&bytes).map_err(io(&tmp))?;
    f.sync_all().map_err(io(&tmp))?;
    fs::rename(&tmp, out).map_err(io(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn release_from_the_file_name() {
        assert_eq!(
            kernel_release(Path::new("/boot/vmlinuz-6.1.0-57-cloud-amd64")).unwrap(),
            "6.1.0-57-cloud-amd64"
        );
        assert!(kernel_release(Path::new("/boot/bzImage")).is_err());
    }

    #[test]
    fn modules_in_dependency_order_without_builtins() {
        let d = tempfile::tempdir().unwrap();
        fs::write(
            d.path().join("modules.dep"),
            "kernel/drivers/virtio/virtio_mmio.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko\n\
             kernel/drivers/block/virtio_blk.ko: kernel/drivers/virtio/virtio.ko kernel/drivers/virtio/virtio_ring.ko\n\
             kernel/drivers/virtio/virtio.ko:\n\
             kernel/drivers/virtio/virtio_ring.ko:\n\
             kernel/fs/erofs/erofs.ko: kernel/lib/libcrc32c.ko\n",
        )
        .unwrap();
        fs::write(
            d.path().join("modules.builtin"),
            "kernel/drivers/char/virtio_console.ko\n",
        )
        .unwrap();
        let order = resolve_modules(d.path(), GUEST_MODULES).unwrap();
        assert_eq!(
            order,
            [
                "kernel/drivers/virtio/virtio_ring.ko",
                "kernel/drivers/virtio/virtio.ko",
                "kernel/drivers/virtio/virtio_mmio.ko",
                "kernel/drivers/block/virtio_blk.ko",
                "kernel/lib/libcrc32c.ko",
                "kernel/fs/erofs/erofs.ko",
            ]
        );
        assert!(matches!(
            resolve_modules(d.path(), &["nope"]),
            Err(InitramfsError::UnknownModule(_))
        ));
    }

    #[test]
    fn cpio_lists_like_cpio_1() {
        let d = tempfile::tempdir().unwrap();
        let mut c = Cpio::new();
        c.dir("etc/cordon");
        c.file("etc/cordon/modules", 0o644, b"a\n");
        c.file("init", 0o755, b"#!x");
        c.char_dev("dev/console", 0o600, 5, 1);
        let bytes = c.finish();
        assert_eq!(bytes.len() % 512, 0);
        let path = d.path().join("a.cpio");
        fs::write(&path, &bytes).unwrap();
        let out = std::process::Command::new("cpio")
            .args(["-it", "--quiet"])
            .stdin(fs::File::open(&path).unwrap())
            .output()
            .expect("cpio(1) missing: run scripts/setup.sh");
        assert!(out.status.success());
        let names = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            names,
            "etc\netc/cordon\netc/cordon/modules\ninit\ndev\ndev/console\n"
        );
        assert!(bytes.starts_with(b"070701"));
    }
}
