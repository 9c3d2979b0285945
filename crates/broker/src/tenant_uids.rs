//! Host uids of their own for each tenant's sandboxes.
//!
//! A root broker maps every sandbox to one unprivileged host uid (65534)
//! unless it has a subordinate range: the `cordon` user's line in
//! `/etc/subuid` (and `/etc/subgid`), or `CORDON_TENANT_UIDS=<first>:<count>`.
//! Then each tenant gets a uid (and the gid of the same offset) of its own
//! from that range, stable across restarts: the assignment is kept in the
//! state directory (`tenant-uids/`), one file per taken offset created with
//! `O_EXCL` (so two brokers never take the same one) and one per tenant
//! naming its offset.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use sha2::Digest as _;

/// The user whose subordinate ranges cordon uses.
pub const SUBID_USER: &str = "cordon";
/// `<first>:<count>` overriding `/etc/subuid` (the gid range is the same).
pub const RANGE_ENV: &str = "CORDON_TENANT_UIDS";

/// A subordinate range and where its assignments are kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantUids {
    pub uid_first: u32,
    pub gid_first: u32,
    pub count: u32,
    pub state_dir: PathBuf,
}

/// Whether tenants have their own uids here, and why not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Availability {
    InForce(TenantUids),
    Off(String),
}

/// The `first:count` of `user` in a subid file's text.
pub fn subid_range(text: &str, user: &str) -> Option<(u32, u32)> {
    text.lines().find_map(|l| {
        let mut f = l.trim().split(':');
        if f.next()? != user {
            return None;
        }
        let first = f.next()?.parse().ok()?;
        let count = f.next()?.parse().ok()?;
        Some((first, count))
    })
}

fn parse_range(s: &str) -> Result<(u32, u32), String> {
    let (a, b) = s
        .split_once(':')
        .ok_or_else(|| format!("{RANGE_ENV}={s}: write <first>:<count>"))?;
    let first = a
        .parse()
        .map_err(|e| format!("{RANGE_ENV}={s}: first: {e}"))?;
    let count = b
        .parse()
        .map_err(|e| format!("{RANGE_ENV}={s}: count: {e}"))?;
    Ok((first, count))
}

impl TenantUids {
    /// What this host offers: only a root broker can map other uids.
    pub fn discover() -> Availability {
        if cordon_sys::io::geteuid() != 0 {
            return Availability::Off(
                "the broker is not root: every sandbox maps to the broker's own uid".into(),
            );
        }
        // `tenant-uids` in cordon's state directory (`$CORDON_STATE_DIR`,
        // else `/var/lib/cordon` as root).
        let state_dir = match cordon_dirs::Dirs::current().tenant_uids() {
            Ok(d) => d,
            Err(e) => return Availability::Off(e.to_string()),
        };
        let range = match std::env::var(RANGE_ENV) {
            Ok(s) => parse_range(&s).map(|(f, c)| (f, f, c)),
            Err(_) => {
                let uid = std::fs::read_to_string("/etc/subuid")
                    .ok()
                    .and_then(|t| subid_range(&t, SUBID_USER));
                let gid = std::fs::read_to_string("/etc/subgid")
                    .ok()
                    .and_then(|t| subid_range(&t, SUBID_USER));
                match (uid, gid) {
                    (Some((u, uc)), Some((g, gc))) => Ok((u, g, uc.min(gc))),
                    _ => Err(format!(
                        "no subordinate uid and gid range for user `{SUBID_USER}` in /etc/subuid and /etc/subgid (nor {RANGE_ENV}): every tenant's sandboxes run as uid 65534"
                    )),
                }
            }
        };
        match range {
            Ok((_, _, 0)) => Availability::Off("the subordinate range is empty".into()),
            Ok((u, g, count)) => Availability::InForce(TenantUids {
                uid_first: u,
                gid_first: g,
                count,
                state_dir,
            }),
            Err(why) => Availability::Off(why),
        }
    }

    fn tenant_file(&self, tenant: &str) -> PathBuf {
        let h = hex::encode(sha2::Sha256::digest(tenant.as_bytes()));
        self.state_dir.join("tenants").join(h)
    }

    fn taken_file(&self, offset: u32) -> PathBuf {
        self.state_dir.join("taken").join(offset.to_string())
    }

    /// The host uid and gid of `tenant`, assigned at its first call and
    /// kept.
    pub fn ids_of(&self, tenant: &str) -> Result<(u32, u32), String> {
        let offset = self.offset_of(tenant)?;
        Ok((self.uid_first + offset, self.gid_first + offset))
    }

    fn offset_of(&self, tenant: &str) -> Result<u32, String> {
        let tf = self.tenant_file(tenant);
        if let Some(o) = read_offset(&tf)? {
            return Ok(o);
        }
        for dir in ["tenants", "taken"] {
            let d = self.state_dir.join(dir);
            std::fs::create_dir_all(&d).map_err(|e| format!("create {}: {e}", d.display()))?;
        }
        for offset in 0..self.count {
            let taken = self.taken_file(offset);
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&taken);
            let mut f = match f {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(format!("create {}: {e}", taken.display())),
            };
            f.write_all(tenant.as_bytes())
                .map_err(|e| format!("write {}: {e}", taken.display()))?;
            let tmp = tf.with_extension(format!("tmp.{}", std::process::id()));
            std::fs::write(&tmp, offset.to_string())
                .and_then(|()| std::fs::rename(&tmp, &tf))
                .map_err(|e| format!("write {}: {e}", tf.display()))?;
            // Another broker may have assigned this tenant at the same
            // time: the file that stayed is the assignment.
            return Ok(read_offset(&tf)?.unwrap_or(offset));
        }
        Err(format!(
            "the subordinate range ({} uids from {}) has no uid left for another tenant",
            self.count, self.uid_first
        ))
    }
}

impl Availability {
    /// The host uid and gid of `tenant` for a sandbox of `policy`: `None`
    /// where tenants share one (no range, an unprivileged broker, a
    /// runtime other than native, P0); `Err` when the range has none left.
    pub fn ids_for(
        &self,
        policy: &cordon_policy::ToolPolicy,
        tenant: &str,
    ) -> Result<Option<(u32, u32)>, String> {
        use cordon_policy::policy::{Profile, Runtime};
        match self {
            Availability::InForce(u)
                if policy.runtime == Runtime::Native && policy.profile != Profile::P0 =>
            {
                u.ids_of(tenant)
                    .map(Some)
                    .map_err(|e| format!("{}: no host uid for tenant `{tenant}`: {e}", policy.name))
            }
            _ => Ok(None),
        }
    }
}

fn read_offset(path: &Path) -> Result<Option<u32>, String> {
    match std::fs::read_to_string(path) {
        Ok(s) => s
            .trim()
            .parse()
            .map(Some)
            .map_err(|e| format!("{}: {e}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(format!("read {}: {e}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cordon_line_of_a_subid_file() {
        let text = "root:100000:65536\ncordon:200000:1000\n";
        assert_eq!(subid_range(text, "cordon"), Some((200000, 1000)));
        assert_eq!(subid_range(text, "nobody"), None);
        assert_eq!(subid_range("cordon:x:1\n", "cordon"), None);
    }

    #[test]
    fn each_tenant_gets_its_own_uid_and_keeps_it() {
        let dir = tempfile::tempdir().unwrap();
        let u = TenantUids {
            uid_first: 300000,
            gid_first: 400000,
            count: 2,
            state_dir: dir.path().join("tenant-uids"),
        };
        let a = u.ids_of("acme").unwrap();
        let b = u.ids_of("globex").unwrap();
        assert_eq!(a, (300000, 400000));
        assert_eq!(b, (300001, 400001));
        assert_eq!(u.ids_of("acme").unwrap(), a);
        // Kept across brokers: a new one reads the same assignment.
        let again = TenantUids { ..u.clone() };
        assert_eq!(again.ids_of("globex").unwrap(), b);
        // The range is full: a third tenant is refused, never given a
        // uid another tenant has.
        let e = u.ids_of("initech").unwrap_err();
        assert!(e.contains("no uid left"), "{e}");
    }
}
