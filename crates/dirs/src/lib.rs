//! Where cordon keeps what it keeps, answered in one place.
//!
//! | what | root | another user | set by |
//! |------|------|--------------|--------|
//! | state: probe records, MCP listings (`mcp/`), state images (`tool-state/`), tenant uids (`tenant-uids/`) | `/var/lib/cordon` | `$XDG_STATE_HOME/cordon`, else `~/.local/state/cordon` | `CORDON_STATE_DIR` |
//! | runtime: workspaces and state mounts, pool status (`pools/`), gVisor bundles (`gvisor/`) | `/run/cordon` | `$XDG_RUNTIME_DIR/cordon` | `CORDON_RUN_DIR` |
//! | data: the image store, the package store (`store/`) | `/var/lib/cordon` | `$XDG_DATA_HOME/cordon`, else `~/.local/share/cordon` | `CORDON_STORE` |
//! | the audit log | `/var/log/cordon/audit.jsonl` | `$XDG_STATE_HOME/cordon/audit.jsonl`, else `~/.local/state/cordon/audit.jsonl` | `CORDON_AUDIT` |
//! | config: the report signing key (`report-key.pem`, outside the state directory) | `/etc/cordon` | `$XDG_CONFIG_HOME/cordon`, else `~/.config/cordon` | `CORDON_CONFIG_DIR` |
//!
//! An `XDG_*` variable or `HOME` that is empty or not an absolute path is
//! ignored. No answer is ever a fixed path under a directory every user
//! can write (`/tmp`): another user could make it first. Where no safe
//! place is known (an unprivileged user without `XDG_RUNTIME_DIR`, or
//! without `HOME`), the answer is a [`DirError`] naming the variable to set.
//!
//! [`Dirs`] is a pure function of an effective uid and the environment
//! ([`Dirs::new`]); [`Dirs::current`] reads this process's. [`ensure`]
//! makes a directory with a given mode and refuses one that is not a real
//! directory of this uid that only it can write.

use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};

/// The variables [`Dirs`] reads.
pub const VARS: &[&str] = &[
    "CORDON_STATE_DIR",
    "CORDON_RUN_DIR",
    "CORDON_STORE",
    "CORDON_AUDIT",
    "CORDON_CONFIG_DIR",
    "XDG_STATE_HOME",
    "XDG_CONFIG_HOME",
    "XDG_RUNTIME_DIR",
    "XDG_DATA_HOME",
    "HOME",
];

/// No safe place for something: which, for whom, why, and what to set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirError {
    /// What has no place ("state directory").
    pub what: &'static str,
    pub euid: u32,
    /// Why none of the defaults applies.
    pub why: &'static str,
    /// The variables that would give it one, the override first.
    pub set: &'static str,
}

impl std::fmt::Display for DirError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "no {} for uid {}: {}; set {}",
            self.what, self.euid, self.why, self.set
        )
    }
}

impl std::error::Error for DirError {}

/// Where everything lives for one effective uid and environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dirs {
    euid: u32,
    vars: Vec<(&'static str, OsString)>,
}

/// Where one of cordon's directories is, and what to say when it cannot
/// be placed.
struct Base {
    var: &'static str,
    as_root: &'static str,
    xdg: &'static str,
    under_home: &'static str,
    what: &'static str,
    why: &'static str,
    set: &'static str,
}

impl Dirs {
    /// The answers for `euid` with the variables `vars` (others than
    /// [`VARS`] are ignored).
    pub fn new<K, V>(euid: u32, vars: impl IntoIterator<Item = (K, V)>) -> Dirs
    where
        K: AsRef<str>,
        V: Into<OsString>,
    {
        let vars = vars
            .into_iter()
            .filter_map(|(k, v)| {
                let name = VARS.iter().find(|n| **n == k.as_ref())?;
                Some((*name, v.into()))
            })
            .collect();
        Dirs { euid, vars }
    }

    /// This process's answers: its effective uid and environment.
    pub fn current() -> Dirs {
        Dirs::new(
            cordon_sys::io::geteuid(),
            VARS.iter()
                .filter_map(|k| std::env::var_os(k).map(|v| (*k, v))),
        )
    }

    /// The effective uid the answers are for.
    pub fn euid(&self) -> u32 {
        self.euid
    }

    fn root(&self) -> bool {
        self.euid == 0
    }

    /// A variable's value, when set and not empty.
    fn var(&self, name: &str) -> Option<PathBuf> {
        self.vars
            .iter()
            .rev()
            .find(|(k, v)| *k == name && !v.is_empty())
            .map(|(_, v)| PathBuf::from(v))
    }

    /// An `XDG_*` directory or `HOME`: only an absolute path counts.
    fn absolute(&self, name: &str) -> Option<PathBuf> {
        self.var(name).filter(|p| p.is_absolute())
    }

    /// `$XDG_<xdg>`, else `~/<under_home>`.
    fn xdg_or_home(&self, xdg: &str, under_home: &str) -> Option<PathBuf> {
        self.absolute(xdg)
            .or_else(|| self.absolute("HOME").map(|h| h.join(under_home)))
    }

    /// A directory of cordon's own: `$var`, else `as_root` as root, else
    /// `$XDG_<xdg>/cordon` (or `~/<under_home>/cordon`).
    fn base(&self, b: Base) -> Result<PathBuf, DirError> {
        if let Some(d) = self.var(b.var) {
            return Ok(d);
        }
        if self.root() {
            return Ok(PathBuf::from(b.as_root));
        }
        self.xdg_or_home(b.xdg, b.under_home)
            .map(|d| d.join("cordon"))
            .ok_or_else(|| self.error(b.what, b.why, b.set))
    }

    fn error(&self, what: &'static str, why: &'static str, set: &'static str) -> DirError {
        DirError {
            what,
            euid: self.euid,
            why,
            set,
        }
    }

    /// cordon's state directory: `$CORDON_STATE_DIR`, else
    /// `/var/lib/cordon` as root, else `$XDG_STATE_HOME/cordon` (or
    /// `~/.local/state/cordon`).
    pub fn state(&self) -> Result<PathBuf, DirError> {
        self.base(Base {
            var: "CORDON_STATE_DIR",
            as_root: "/var/lib/cordon",
            xdg: "XDG_STATE_HOME",
            under_home: ".local/state",
            what: "state directory",
            why: "neither XDG_STATE_HOME nor HOME is set to an absolute path",
            set: "CORDON_STATE_DIR (or XDG_STATE_HOME or HOME)",
        })
    }

    /// The MCP listing cache: `mcp` in the state directory.
    pub fn mcp_listings(&self) -> Result<PathBuf, DirError> {
        self.state().map(|d| d.join("mcp"))
    }

    /// The state images of `state:` tools: `tool-state` in the state
    /// directory.
    pub fn tool_state(&self) -> Result<PathBuf, DirError> {
        self.state().map(|d| d.join("tool-state"))
    }

    /// The compiled code of `runtime: wasm` modules: `wasm-cache` in the
    /// state directory.
    pub fn wasm_cache(&self) -> Result<PathBuf, DirError> {
        self.state().map(|d| d.join("wasm-cache"))
    }

    /// The tenant uid allocations: `tenant-uids` in the state directory.
    pub fn tenant_uids(&self) -> Result<PathBuf, DirError> {
        self.state().map(|d| d.join("tenant-uids"))
    }

    /// cordon's runtime directory (gone at reboot): `$CORDON_RUN_DIR`,
    /// else `/run/cordon` as root, else `$XDG_RUNTIME_DIR/cordon`.
    pub fn runtime(&self) -> Result<PathBuf, DirError> {
        if let Some(d) = self.var("CORDON_RUN_DIR") {
            return Ok(d);
        }
        if self.root() {
            return Ok(PathBuf::from("/run/cordon"));
        }
        self.absolute("XDG_RUNTIME_DIR")
            .map(|d| d.join("cordon"))
            .ok_or_else(|| {
                self.error(
                    "runtime directory",
                    "XDG_RUNTIME_DIR is not set to an absolute path",
                    "CORDON_RUN_DIR or XDG_RUNTIME_DIR (a directory of this user only)",
                )
            })
    }

    /// Where pools whose refill stopped leave their status files: `pools`
    /// in the runtime directory.
    pub fn pools(&self) -> Result<PathBuf, DirError> {
        self.runtime().map(|d| d.join("pools"))
    }

    /// gVisor's bundles and `runsc` state: `gvisor` in the runtime
    /// directory.
    pub fn gvisor(&self) -> Result<PathBuf, DirError> {
        self.runtime().map(|d| d.join("gvisor"))
    }

    /// The image store: `$CORDON_STORE`, else `/var/lib/cordon` as root,
    /// else `$XDG_DATA_HOME/cordon` (or `~/.local/share/cordon`).
    pub fn images(&self) -> Result<PathBuf, DirError> {
        self.base(Base {
            var: "CORDON_STORE",
            as_root: "/var/lib/cordon",
            xdg: "XDG_DATA_HOME",
            under_home: ".local/share",
            what: "image store",
            why: "neither XDG_DATA_HOME nor HOME is set to an absolute path",
            set: "CORDON_STORE (or XDG_DATA_HOME or HOME)",
        })
    }

    /// The package store: `store` in the image store's directory, so that
    /// `$CORDON_STORE` moves both.
    pub fn packages(&self) -> Result<PathBuf, DirError> {
        self.images().map(|d| d.join("store"))
    }

    /// cordon's configuration directory: `$CORDON_CONFIG_DIR`, else
    /// `/etc/cordon` as root, else `$XDG_CONFIG_HOME/cordon` (or
    /// `~/.config/cordon`).
    pub fn config(&self) -> Result<PathBuf, DirError> {
        self.base(Base {
            var: "CORDON_CONFIG_DIR",
            as_root: "/etc/cordon",
            xdg: "XDG_CONFIG_HOME",
            under_home: ".config",
            what: "configuration directory",
            why: "neither XDG_CONFIG_HOME nor HOME is set to an absolute path",
            set: "CORDON_CONFIG_DIR (or XDG_CONFIG_HOME or HOME)",
        })
    }

    /// The private key `cordon probe --report` signs reports with:
    /// `report-key.pem` in the configuration directory (never in the
    /// state directory, which holds what the key vouches for).
    pub fn report_key(&self) -> Result<PathBuf, DirError> {
        self.config().map(|d| d.join("report-key.pem"))
    }

    /// The audit log: `$CORDON_AUDIT`, else `/var/log/cordon/audit.jsonl`
    /// as root, else `$XDG_STATE_HOME/cordon/audit.jsonl` (or
    /// `~/.local/state/cordon/audit.jsonl`).
    pub fn audit_log(&self) -> Result<PathBuf, DirError> {
        if let Some(p) = self.var("CORDON_AUDIT") {
            return Ok(p);
        }
        if self.root() {
            return Ok(PathBuf::from("/var/log/cordon/audit.jsonl"));
        }
        self.xdg_or_home("XDG_STATE_HOME", ".local/state")
            .map(|d| d.join("cordon/audit.jsonl"))
            .ok_or_else(|| {
                self.error(
                    "audit log",
                    "neither XDG_STATE_HOME nor HOME is set to an absolute path",
                    "CORDON_AUDIT (or XDG_STATE_HOME or HOME), or give --audit PATH",
                )
            })
    }
}

fn refused(dir: &Path, why: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("{}: {why}: refused", dir.display()),
    )
}

/// Make `dir` if missing (its missing parents too, each with `mode`), and
/// check that it is a directory (not a symlink) owned by `euid` that no
/// other user can write. An existing directory keeps its mode.
pub fn ensure(dir: &Path, mode: u32, euid: u32) -> io::Result<()> {
    fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", dir.display())))?;
    check(dir, euid)
}

/// [`ensure`] with mode 0700: a directory of this user only.
pub fn ensure_private(dir: &Path, euid: u32) -> io::Result<()> {
    ensure(dir, 0o700, euid)
}

/// `dir` is a directory (not a symlink) owned by `euid`, that neither its
/// group nor others can write.
pub fn check(dir: &Path, euid: u32) -> io::Result<()> {
    let m = fs::symlink_metadata(dir)
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", dir.display())))?;
    if m.file_type().is_symlink() {
        return Err(refused(dir, "is a symbolic link".into()));
    }
    if !m.is_dir() {
        return Err(refused(dir, "is not a directory".into()));
    }
    if m.uid() != euid {
        return Err(refused(
            dir,
            format!("belongs to uid {}, not to uid {euid}", m.uid()),
        ));
    }
    if m.mode() & 0o022 != 0 {
        return Err(refused(
            dir,
            format!(
                "is writable by others than its owner (mode {:o})",
                m.mode() & 0o7777
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dirs(euid: u32, vars: &[(&str, &str)]) -> Dirs {
        Dirs::new(euid, vars.iter().copied())
    }

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    #[test]
    fn root_keeps_the_system_directories() {
        let d = dirs(0, &[("HOME", "/root"), ("XDG_RUNTIME_DIR", "/run/user/0")]);
        assert_eq!(d.state().unwrap(), p("/var/lib/cordon"));
        assert_eq!(d.mcp_listings().unwrap(), p("/var/lib/cordon/mcp"));
        assert_eq!(d.tool_state().unwrap(), p("/var/lib/cordon/tool-state"));
        assert_eq!(d.tenant_uids().unwrap(), p("/var/lib/cordon/tenant-uids"));
        assert_eq!(d.runtime().unwrap(), p("/run/cordon"));
        assert_eq!(d.pools().unwrap(), p("/run/cordon/pools"));
        assert_eq!(d.gvisor().unwrap(), p("/run/cordon/gvisor"));
        assert_eq!(d.images().unwrap(), p("/var/lib/cordon"));
        assert_eq!(d.packages().unwrap(), p("/var/lib/cordon/store"));
        assert_eq!(d.audit_log().unwrap(), p("/var/log/cordon/audit.jsonl"));
        assert_eq!(d.report_key().unwrap(), p("/etc/cordon/report-key.pem"));
        // Nothing at all set: the same.
        let bare = dirs(0, &[]);
        assert_eq!(bare.state().unwrap(), p("/var/lib/cordon"));
        assert_eq!(bare.runtime().unwrap(), p("/run/cordon"));
        assert_eq!(bare.images().unwrap(), p("/var/lib/cordon"));
        assert_eq!(bare.audit_log().unwrap(), p("/var/log/cordon/audit.jsonl"));
    }

    #[test]
    fn overrides_win_for_root_and_for_users() {
        let vars = [
            ("CORDON_STATE_DIR", "/s"),
            ("CORDON_RUN_DIR", "/r"),
            ("CORDON_STORE", "/i"),
            ("CORDON_AUDIT", "/a/log.jsonl"),
            ("HOME", "/home/u"),
            ("XDG_RUNTIME_DIR", "/run/user/1000"),
        ];
        for euid in [0, 1000] {
            let d = dirs(euid, &vars);
            assert_eq!(d.state().unwrap(), p("/s"));
            assert_eq!(d.mcp_listings().unwrap(), p("/s/mcp"));
            assert_eq!(d.runtime().unwrap(), p("/r"));
            assert_eq!(d.gvisor().unwrap(), p("/r/gvisor"));
            assert_eq!(d.images().unwrap(), p("/i"));
            assert_eq!(d.packages().unwrap(), p("/i/store"));
            assert_eq!(d.audit_log().unwrap(), p("/a/log.jsonl"));
        }
        // An empty override is no override.
        let d = dirs(0, &[("CORDON_STATE_DIR", ""), ("CORDON_STORE", "")]);
        assert_eq!(d.state().unwrap(), p("/var/lib/cordon"));
        assert_eq!(d.images().unwrap(), p("/var/lib/cordon"));
    }

    #[test]
    fn a_user_gets_the_xdg_directories_then_home() {
        let xdg = dirs(
            1000,
            &[
                ("HOME", "/home/u"),
                ("XDG_STATE_HOME", "/x/state"),
                ("XDG_DATA_HOME", "/x/data"),
                ("XDG_RUNTIME_DIR", "/run/user/1000"),
            ],
        );
        assert_eq!(xdg.state().unwrap(), p("/x/state/cordon"));
        assert_eq!(xdg.mcp_listings().unwrap(), p("/x/state/cordon/mcp"));
        assert_eq!(xdg.runtime().unwrap(), p("/run/user/1000/cordon"));
        assert_eq!(xdg.pools().unwrap(), p("/run/user/1000/cordon/pools"));
        assert_eq!(xdg.gvisor().unwrap(), p("/run/user/1000/cordon/gvisor"));
        assert_eq!(xdg.images().unwrap(), p("/x/data/cordon"));
        assert_eq!(xdg.packages().unwrap(), p("/x/data/cordon/store"));
        assert_eq!(xdg.audit_log().unwrap(), p("/x/state/cordon/audit.jsonl"));
        let home = dirs(1000, &[("HOME", "/home/u")]);
        assert_eq!(
            home.report_key().unwrap(),
            p("/home/u/.config/cordon/report-key.pem")
        );
        let cfg = dirs(1000, &[("HOME", "/home/u"), ("XDG_CONFIG_HOME", "/x/cfg")]);
        assert_eq!(cfg.config().unwrap(), p("/x/cfg/cordon"));
        let over = dirs(0, &[("CORDON_CONFIG_DIR", "/c")]);
        assert_eq!(over.report_key().unwrap(), p("/c/report-key.pem"));
        assert!(dirs(1000, &[]).config().is_err());
        assert_eq!(home.state().unwrap(), p("/home/u/.local/state/cordon"));
        assert_eq!(home.images().unwrap(), p("/home/u/.local/share/cordon"));
        assert_eq!(
            home.packages().unwrap(),
            p("/home/u/.local/share/cordon/store")
        );
        assert_eq!(
            home.audit_log().unwrap(),
            p("/home/u/.local/state/cordon/audit.jsonl")
        );
        // A relative or empty XDG directory is ignored (the XDG rule).
        let rel = dirs(
            1000,
            &[
                ("HOME", "/home/u"),
                ("XDG_STATE_HOME", "state"),
                ("XDG_DATA_HOME", ""),
            ],
        );
        assert_eq!(rel.state().unwrap(), p("/home/u/.local/state/cordon"));
        assert_eq!(rel.images().unwrap(), p("/home/u/.local/share/cordon"));
    }

    #[test]
    fn a_user_with_no_safe_place_is_refused_with_the_variable_to_set() {
        // No HOME, no XDG_*: never a fallback under /tmp.
        let none = dirs(
            1000,
            &[("XDG_RUNTIME_DIR", "run/user/1000"), ("HOME", "home")],
        );
        let e = none.state().unwrap_err();
        assert_eq!(e.euid, 1000);
        assert!(e.to_string().contains("set CORDON_STATE_DIR"), "{e}");
        let e = none.runtime().unwrap_err();
        assert!(
            e.to_string()
                .contains("set CORDON_RUN_DIR or XDG_RUNTIME_DIR"),
            "{e}"
        );
        assert!(none.pools().is_err() && none.gvisor().is_err());
        let e = none.images().unwrap_err();
        assert!(e.to_string().contains("set CORDON_STORE"), "{e}");
        let e = none.audit_log().unwrap_err();
        assert!(e.to_string().contains("set CORDON_AUDIT"), "{e}");
        // HOME alone gives no runtime directory: that needs XDG_RUNTIME_DIR.
        let home = dirs(1000, &[("HOME", "/home/u")]);
        assert!(home.runtime().is_err());
        for d in [&none, &home] {
            for path in [
                d.state(),
                d.runtime(),
                d.images(),
                d.audit_log(),
                d.mcp_listings(),
            ]
            .into_iter()
            .flatten()
            {
                assert!(!path.starts_with("/tmp"), "{}", path.display());
            }
        }
    }

    #[test]
    fn unknown_variables_are_ignored() {
        let d = dirs(1000, &[("TMPDIR", "/tmp"), ("XDG_CACHE_HOME", "/c")]);
        assert!(d.state().is_err());
        assert_eq!(d, dirs(1000, &[]));
    }

    #[test]
    fn ensure_makes_private_directories_and_refuses_foreign_ones() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let euid = cordon_sys::io::geteuid();
        let d = t.path().join("a/b/cordon");
        ensure_private(&d, euid).unwrap();
        for dir in [t.path().join("a"), t.path().join("a/b"), d.clone()] {
            let m = fs::metadata(&dir).unwrap();
            assert_eq!(m.mode() & 0o077, 0, "{}", dir.display());
        }
        // Again: the existing directory is accepted.
        ensure_private(&d, euid).unwrap();
        // Owned by someone else (as this uid sees it).
        let e = ensure_private(&d, euid + 1).unwrap_err();
        assert!(e.to_string().contains("belongs to uid"), "{e}");
        // Writable by others.
        fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).unwrap();
        let e = ensure_private(&d, euid).unwrap_err();
        assert!(e.to_string().contains("writable by others"), "{e}");
        // A symlink to a good directory.
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&d, &link).unwrap();
        let e = ensure_private(&link, euid).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        // A file.
        let f = t.path().join("file");
        fs::write(&f, "").unwrap();
        assert!(ensure_private(&f, euid).is_err());
    }
}
