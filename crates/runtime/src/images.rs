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
    let passwd = std::fs::read_to_string(rootfs.join("etc/passwd")).unwrap_or_default();
    let group = std::fs::read_to_string(rootfs.join("etc/group")).unwrap_or_default();
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

    fn tempfile_dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!("cordon-image-user-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}

/// [`Images`] over cordon's image store (`cordon-image`): a reference
/// resolves only to an image already pulled or loaded (`cordon image pull`
/// / `load`), verified, and unpacked on first use. The store is opened on
/// the first resolve, so a broker that runs no image tool never touches it.
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
