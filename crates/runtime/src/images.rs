//! Images as the runtime seam sees them: a reference pinned by digest
//! resolved to an unpacked, verified rootfs and the image config's
//! defaults. Where the images come from (the store, a registry, an archive)
//! is `cordon-image`'s business; admission only asks [`Images::resolve`].

use std::path::{Path, PathBuf};

/// An image ready to be a sandbox root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedImage {
    /// The unpacked rootfs (complete and verified).
    pub rootfs: PathBuf,
    /// The manifest digest it was unpacked from (`sha256:...`).
    pub digest: String,
    /// The config's `Entrypoint`.
    pub entrypoint: Vec<String>,
    /// The config's `Cmd`.
    pub cmd: Vec<String>,
    /// The config's `Env` (`KEY=VALUE`).
    pub env: Vec<String>,
    /// The config's `WorkingDir`.
    pub working_dir: Option<String>,
    /// The config's `User` (`uid`, `uid:gid`, `name`, `name:group`).
    pub user: Option<String>,
}

/// Resolves image references for admission.
pub trait Images: Send + Sync {
    /// `reference` is `NAME@sha256:HEX`. `Err` says why it cannot be used
    /// here (not in the store, not verified, ...) and what to do.
    fn resolve(&self, reference: &str) -> Result<ResolvedImage, String>;
}

/// The uid and gid an image's `User` names, looked up in the image's own
/// `/etc/passwd` and `/etc/group` for names (never the host's). Empty:
/// uid 0 (inside the sandbox's user namespace; an unprivileged uid on the
/// host).
pub fn image_user(rootfs: &Path, user: Option<&str>) -> Result<(u32, u32), String> {
    let user = user.unwrap_or("").trim();
    if user.is_empty() {
        return Ok((0, 0));
    }
    let (u, g) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let passwd = read_table(rootfs, "passwd")?;
    let group = read_table(rootfs, "group")?;
    let (uid, primary) = match u.parse::<u32>() {
        Ok(n) => (
            n,
            lookup(&passwd, |f| f.get(2) == Some(&u)).and_then(|f| f.get(3)?.parse().ok()),
        ),
        Err(_) => {
            let f = lookup(&passwd, |f| f.first() == Some(&u))
                .ok_or_else(|| format!("image user `{u}` is not in the image's /etc/passwd"))?;
            let uid = f
                .get(2)
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| format!("image user `{u}`: bad /etc/passwd entry"))?;
            (uid, f.get(3).and_then(|s| s.parse().ok()))
        }
    };
    let gid = match g {
        None => primary.unwrap_or(0),
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => lookup(&group, |f| f.first() == Some(&g))
                .and_then(|f| f.get(2)?.parse().ok())
                .ok_or_else(|| format!("image group `{g}` is not in the image's /etc/group"))?,
        },
    };
    Ok((uid, gid))
}

/// Most of an image's `/etc/passwd` or `/etc/group` read.
const TABLE_LIMIT: u64 = 1 << 20;

/// The image's `/etc/<name>`, resolved inside the image's root as the
/// unpacker resolves paths (`openat2` `RESOLVE_IN_ROOT`: a symlink never
/// leads out of it), read only when it is a regular file of at most
/// [`TABLE_LIMIT`] bytes. Absent: empty. A FIFO, a device, a dangling link
/// or anything else is refused, never waited on.
fn read_table(rootfs: &Path, name: &str) -> Result<String, String> {
    use cordon_sys::fsat::{self, DirOpen, Name};
    use std::io::Read;
    use std::os::fd::AsFd;
    let what = format!("the image's /etc/{name}");
    let fail = |e: cordon_sys::Errno| format!("{what} cannot be read inside the image root: {e}");
    let (Some(etc), Some(file)) = (Name::new(b"etc"), Name::new(name.as_bytes())) else {
        return Err(format!("{what}: not a file name"));
    };
    let root =
        fsat::open_root(rootfs).map_err(|e| format!("image root {}: {e}", rootfs.display()))?;
    let dir = match fsat::open_dir_in_root(root.as_fd(), std::slice::from_ref(&etc), DirOpen::Path)
    {
        Ok(d) => d,
        Err(cordon_sys::Errno::ENOENT) => return Ok(String::new()),
        Err(e) => return Err(fail(e)),
    };
    match fsat::stat_at(dir.as_fd(), &file) {
        Ok(_) => {}
        Err(cordon_sys::Errno::ENOENT) => return Ok(String::new()),
        Err(e) => return Err(fail(e)),
    }
    let f = match fsat::open_file_in_root(root.as_fd(), &[etc, file]) {
        Ok(f) => f,
        Err(cordon_sys::Errno::EINVAL) => {
            return Err(format!(
                "{what} is not a regular file (a FIFO, a device or a directory): refused"
            ));
        }
        Err(e) => return Err(fail(e)),
    };
    let mut buf = Vec::new();
    f.take(TABLE_LIMIT + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("{what}: {e}"))?;
    if buf.len() as u64 > TABLE_LIMIT {
        return Err(format!(
            "{what} is larger than {TABLE_LIMIT} bytes: refused"
        ));
    }
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn lookup(table: &str, pick: impl Fn(&[&str]) -> bool) -> Option<Vec<&str>> {
    table
        .lines()
        .map(|l| l.split(':').collect::<Vec<_>>())
        .find(|f| pick(f))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn users_are_looked_up_in_the_image() {
        let d = tempfile_dir();
        std::fs::create_dir_all(d.join("etc")).unwrap();
        std::fs::write(
            d.join("etc/passwd"),
            "root:x:0:0::/root:/bin/sh\nnode:x:1000:1001::/home/node:/bin/sh\n",
        )
        .unwrap();
        std::fs::write(d.join("etc/group"), "root:x:0:\nstaff:x:50:\n").unwrap();
        assert_eq!(image_user(&d, None), Ok((0, 0)));
        assert_eq!(image_user(&d, Some("node")), Ok((1000, 1001)));
        assert_eq!(image_user(&d, Some("1000")), Ok((1000, 1001)));
        assert_eq!(image_user(&d, Some("65532:65532")), Ok((65532, 65532)));
        assert_eq!(image_user(&d, Some("node:staff")), Ok((1000, 50)));
        assert!(
            image_user(&d, Some("nobody"))
                .unwrap_err()
                .contains("not in the image's")
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    /// A FIFO, a link to a device, a link out of the root and an oversized
    /// table are refused with a clear error, never waited on or followed.
    #[test]
    fn hostile_tables_are_refused_not_followed() {
        use std::os::unix::fs::symlink;
        let d = tempfile_dir_named("hostile");
        std::fs::create_dir_all(d.join("etc")).unwrap();
        std::fs::write(d.join("etc/group"), "staff:x:50:\n").unwrap();
        // Positive control: a regular table is read.
        std::fs::write(d.join("etc/passwd"), "node:x:1000:1001::/:/bin/sh\n").unwrap();
        assert_eq!(image_user(&d, Some("node:staff")), Ok((1000, 50)));
        // A FIFO (nobody writes it: a plain read would block forever).
        std::fs::remove_file(d.join("etc/passwd")).unwrap();
        nix::unistd::mkfifo(
            &d.join("etc/passwd"),
            nix::sys::stat::Mode::from_bits_truncate(0o644),
        )
        .unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let dd = d.clone();
        std::thread::spawn(move || {
            let _ = tx.send(image_user(&dd, Some("node")));
        });
        let r = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("the lookup hung on a FIFO");
        let e = r.unwrap_err();
        assert!(e.contains("/etc/passwd is not a regular file"), "{e}");
        // A link to /dev/zero: resolved inside the root, where it is a
        // device here, or missing.
        std::fs::remove_file(d.join("etc/passwd")).unwrap();
        symlink("/dev/zero", d.join("etc/passwd")).unwrap();
        let e = image_user(&d, Some("1000")).unwrap_err();
        assert!(
            e.contains("/etc/passwd cannot be read inside the image root"),
            "{e}"
        );
        std::fs::create_dir_all(d.join("dev")).unwrap();
        nix::sys::stat::mknod(
            &d.join("dev/zero"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(1, 5),
        )
        .unwrap();
        let e = image_user(&d, Some("node")).unwrap_err();
        assert!(e.contains("/etc/passwd is not a regular file"), "{e}");
        // A link that climbs out of the root lands inside it.
        std::fs::remove_file(d.join("etc/passwd")).unwrap();
        std::fs::write(d.join("passwd.real"), "node:x:7:8::/:/bin/sh\n").unwrap();
        symlink("../../../../../../passwd.real", d.join("etc/passwd")).unwrap();
        assert_eq!(image_user(&d, Some("node")), Ok((7, 8)));
        // Too large.
        std::fs::remove_file(d.join("etc/passwd")).unwrap();
        std::fs::write(d.join("etc/passwd"), vec![b'#'; (TABLE_LIMIT + 1) as usize]).unwrap();
        let e = image_user(&d, Some("node")).unwrap_err();
        assert!(e.contains("larger than"), "{e}");
        let _ = std::fs::remove_dir_all(&d);
    }

    fn tempfile_dir() -> PathBuf {
        tempfile_dir_named("user")
    }

    fn tempfile_dir_named(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cordon-image-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}

/// [`Images`] over cordon's image store (`cordon-image`): a reference
/// resolves only to an image already pulled or loaded (`cordon image pull`
/// / `load`), verified and unpacked then (again here if its tree was
/// removed since). The store is opened on the first resolve, so a broker
/// that runs no image tool never touches it.
#[derive(Debug, Default)]
pub struct StoreImages {
    dir: Option<PathBuf>,
}

impl StoreImages {
    /// The store at `dir`, or the default one (`$CORDON_STORE`,
    /// `/var/lib/cordon` as root, else `~/.local/share/cordon`).
    pub fn new(dir: Option<PathBuf>) -> StoreImages {
        StoreImages { dir }
    }
}

impl Images for StoreImages {
    fn resolve(&self, reference: &str) -> Result<ResolvedImage, String> {
        let r: cordon_image::reference::ImageRef = reference.parse().map_err(|e| format!("{e}"))?;
        let dir = match &self.dir {
            Some(d) => d.clone(),
            None => cordon_image::store::Store::default_dir().map_err(|e| e.to_string())?,
        };
        let store = cordon_image::store::Store::open(&dir).map_err(|e| e.to_string())?;
        if store.find(&r.digest).map_err(|e| e.to_string())?.is_none() {
            return Err(format!(
                "not in the image store {} (run `cordon image pull {reference}`, or `cordon image load` an archive of it)",
                dir.display()
            ));
        }
        let rootfs = store.unpacked(&r.digest).map_err(|e| e.to_string())?;
        let info = store.inspect(&r.digest).map_err(|e| e.to_string())?;
        let c = info.config;
        Ok(ResolvedImage {
            rootfs,
            digest: info.record.manifest.to_string(),
            entrypoint: c.entrypoint.unwrap_or_default(),
            cmd: c.cmd.unwrap_or_default(),
            env: c.env,
            working_dir: c.working_dir,
            user: c.user,
        })
    }
}
