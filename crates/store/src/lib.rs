//! cordon-store: MCP servers from npm and PyPI, installed once at an exact
//! version into cordon's own store (a `node_modules` tree, or a relocatable
//! virtual environment on the host's interpreter), keyed by package,
//! version and the lock of its dependencies, so that a sandbox starts them
//! without the network.
//!
//! Layout: `<store>/<ecosystem>/<name>@<version>-<lock digest>/`, where the
//! name's `/` (npm scopes) is written `+` and the digest is the first 16
//! hex digits of the SHA-256 of the dependency lock (npm's
//! `package-lock.json`; for PyPI, the virtual environment's `pip freeze`,
//! kept as `cordon-lock.txt`). Each install is made in a temporary
//! directory beside its final one and renamed into place when complete,
//! with a record (`cordon-store.json`) of what it is and how it runs. An
//! install already present for the same package and version is reused
//! after its lock is checked against the digest it was stored under.
//!
//! Nothing a package ships runs on the host at install: npm installs with
//! `--ignore-scripts`, pip installs wheels only (`--only-binary :all:`: an
//! sdist's build runs its setup code, and may need a compiler).
//!
//! Inside a sandbox an install is mounted read-only at
//! [`SANDBOX_ROOT`]`/<ecosystem>/<dir>`, and its command names paths there:
//! `node <entry script>` resolved from the package's `bin`, or the virtual
//! environment's `python3` running the console script (whose `#!` line,
//! naming a host path, is not used) or `-m <module>`.
#![forbid(unsafe_code)]

mod npm;
mod pypi;

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Where an install is mounted inside a sandbox (`/tmp` is refused as a
/// mount target, and the host's store path may be one).
pub const SANDBOX_ROOT: &str = "/opt/cordon/store";

/// The host interpreter every virtual environment is made on.
pub const HOST_PYTHON: &str = "/usr/bin/python3";

/// The record kept in each install.
const RECORD: &str = "cordon-store.json";

/// Where a package comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Ecosystem {
    Npm,
    Pypi,
}

impl Ecosystem {
    /// `npm` or `pypi`: the prefix of a package reference and the store's
    /// directory for it.
    pub fn name(self) -> &'static str {
        match self {
            Ecosystem::Npm => "npm",
            Ecosystem::Pypi => "pypi",
        }
    }
}

/// A package as asked for: `npm:NAME@VERSION`, `pypi:NAME==VERSION`
/// (version `None`: the newest, resolved and recorded at install).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageRef {
    pub ecosystem: Ecosystem,
    pub name: String,
    pub version: Option<String>,
}

impl PackageRef {
    /// Parse `npm:NAME[@VERSION]` or `pypi:NAME[==VERSION]`. Names and
    /// versions are limited to the characters their registries allow (no
    /// URLs, paths, git or file specs, nor anything that reads as an
    /// option), and a version must be exact (no ranges).
    pub fn parse(s: &str) -> Result<PackageRef, StoreError> {
        let refused = |why: &str| {
            Err(StoreError::Refused(format!(
                "`{s}`: {why} (e.g. npm:@modelcontextprotocol/server-memory@2026.8.31 or pypi:mcp-server-time==2026.10.19)"
            )))
        };
        let (ecosystem, rest) = if let Some(r) = s.strip_prefix("npm:") {
            (Ecosystem::Npm, r)
        } else if let Some(r) = s.strip_prefix("pypi:") {
            (Ecosystem::Pypi, r)
        } else {
            return refused("a package is `npm:NAME[@VERSION]` or `pypi:NAME[==VERSION]`");
        };
        let (name, version) = match ecosystem {
            Ecosystem::Npm => match rest.rfind('@').filter(|&i| i > 0) {
                Some(i) => (&rest[..i], Some(&rest[i + 1..])),
                None => (rest, None),
            },
            Ecosystem::Pypi => match rest.split_once("==") {
                Some((n, v)) => (n, Some(v)),
                None => (rest, None),
            },
        };
        let name_ok = match ecosystem {
            Ecosystem::Npm => npm::valid_name(name),
            Ecosystem::Pypi => pypi::valid_name(name),
        };
        if !name_ok {
            return refused(&format!(
                "`{name}` is not a valid {} package name",
                ecosystem.name()
            ));
        }
        if let Some(v) = version
            && !valid_version(v)
        {
            return refused(&format!(
                "`{v}` is not an exact version (ranges, tags with `/`, URLs and paths are not taken)"
            ));
        }
        Ok(PackageRef {
            ecosystem,
            name: name.to_string(),
            version: version.map(str::to_string),
        })
    }
}

impl fmt::Display for PackageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.ecosystem, &self.version) {
            (Ecosystem::Npm, Some(v)) => write!(f, "npm:{}@{v}", self.name),
            (Ecosystem::Pypi, Some(v)) => write!(f, "pypi:{}=={v}", self.name),
            (e, None) => write!(f, "{}:{}", e.name(), self.name),
        }
    }
}

/// An exact version: letters, digits, `.`, `-`, `+`, `_`, starting with a
/// letter or digit (npm's `1.2.3-rc.1`, PEP 440's `0.0.1a8`, `1!2.0`
/// excepted).
fn valid_version(v: &str) -> bool {
    v.len() <= 64
        && v.starts_with(|c: char| c.is_ascii_alphanumeric())
        && v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+' | '_'))
}

/// A bind mount the installed server needs (read-only unless `rw`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub src: PathBuf,
    pub dst: PathBuf,
    pub rw: bool,
}

/// A package in the store, and how a sandbox runs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub package: PackageRef,
    /// The exact version installed.
    pub version: String,
    /// The store directory of this install.
    pub root: PathBuf,
    /// The server's argv as seen inside the sandbox.
    pub command: Vec<String>,
    /// Host paths the sandbox needs (the install, the interpreter).
    pub mounts: Vec<Mount>,
    /// Environment the server needs (PyPI: `PYTHONDONTWRITEBYTECODE`, the
    /// environment being mounted read-only).
    pub env: BTreeMap<String, String>,
    /// Digest of the dependency lock the install was keyed by.
    pub lock_digest: String,
    /// `false` when this call installed it, `true` when an install already
    /// in the store was reused.
    pub reused: bool,
}

/// Why a package could not be installed or found.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0}")]
    Refused(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> StoreError {
    let what = what.into();
    move |source| StoreError::Io { what, source }
}

/// Where packages are fetched from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Source {
    /// The registries (npm's and pip's own configuration: registry, index,
    /// proxy).
    #[default]
    Network,
    /// No network. npm installs from its cache (`from`: an npm cache
    /// directory, as `npm cache add --cache DIR` or any `npm install
    /// --cache DIR` fills; else npm's default cache); pip from `from`, a
    /// directory of wheels (as `pip download --only-binary :all: -d DIR`
    /// makes), which PyPI installs offline require.
    Offline { from: Option<PathBuf> },
}

/// The store, rooted at a directory.
#[derive(Debug, Clone)]
pub struct Store {
    pub root: PathBuf,
    /// Where installs fetch packages from.
    pub source: Source,
}

impl Store {
    /// The store at `root`, fetching from the network.
    pub fn at(root: PathBuf) -> Store {
        Store {
            root,
            source: Source::Network,
        }
    }

    /// The same store, fetching from `source`.
    pub fn with_source(mut self, source: Source) -> Store {
        self.source = source;
        self
    }

    /// The default store: `store/` in the directory cordon's image store
    /// uses, so that `$CORDON_STORE` moves both: `$CORDON_STORE/store`,
    /// else `/var/lib/cordon/store` as root, else
    /// `$XDG_DATA_HOME/cordon/store` (default `~/.local/share/cordon/store`).
    /// (See `cordon_dirs`.)
    pub fn default_root() -> Result<PathBuf, StoreError> {
        cordon_dirs::Dirs::current().packages().map_err(|_| {
            StoreError::Refused(
                "no store directory: set $CORDON_STORE or $HOME, or pass --store".into(),
            )
        })
    }

    /// Install `pkg` (once: an install already in the store is reused).
    /// A `pkg` built by hand is held to the same rules as a parsed one.
    pub fn install(&self, pkg: &PackageRef) -> Result<Installed, StoreError> {
        if PackageRef::parse(&pkg.to_string())? != *pkg {
            return Err(StoreError::Refused(format!(
                "`{pkg}`: not a package name and exact version"
            )));
        }
        // The installers run in the install's directory, and the manifest
        // needs absolute mount sources.
        let absolute =
            |p: &Path| std::path::absolute(p).map_err(io(format!("the directory {}", p.display())));
        let store = Store {
            root: absolute(&self.root)?,
            source: match &self.source {
                Source::Offline { from: Some(d) } => Source::Offline {
                    from: Some(absolute(d)?),
                },
                s => s.clone(),
            },
        };
        store.install_absolute(pkg)
    }

    /// The install of `pkg` at `dir`, a directory of this store that an
    /// earlier [`Store::install`] returned (`Installed::root`), checked as
    /// an install found in the store is: its record names `pkg` (and its
    /// version, when `pkg` has one) and its lock still has the digest it is
    /// stored under. Nothing is fetched.
    pub fn verify(&self, pkg: &PackageRef, dir: &Path) -> Result<Installed, StoreError> {
        let root = std::path::absolute(&self.root)
            .map_err(io(format!("the directory {}", self.root.display())))?;
        if dir.parent() != Some(root.join(pkg.ecosystem.name()).as_path()) {
            return Err(StoreError::Refused(format!(
                "{pkg}: {} is not an install of the store {}",
                dir.display(),
                root.display()
            )));
        }
        if !dir.is_dir() {
            return Err(StoreError::Refused(format!(
                "{pkg}: the store's install {} is gone",
                dir.display()
            )));
        }
        self.open(pkg, dir)
    }

    fn install_absolute(&self, pkg: &PackageRef) -> Result<Installed, StoreError> {
        let eco_dir = self.root.join(pkg.ecosystem.name());
        if let Some(v) = &pkg.version
            && let Some(found) = self.find(pkg, v)?
        {
            return Ok(found);
        }
        if let Source::Offline { from: Some(d) } = &self.source
            && !d.is_dir()
        {
            return Err(StoreError::Refused(format!(
                "{pkg}: the offline source {} is not a directory",
                d.display()
            )));
        }
        mkdir_all(&eco_dir)?;
        let tmp = TempDir::new(&eco_dir)?;
        let built = match pkg.ecosystem {
            Ecosystem::Npm => npm::build(&tmp.0, pkg, &self.source)?,
            Ecosystem::Pypi => pypi::build(&tmp.0, pkg, &self.source)?,
        };
        let lock_digest = digest_file(&tmp.0.join(built.lock_file))?;
        let dir = eco_dir.join(dir_name(&pkg.name, &built.version, &lock_digest));
        if dir.exists() {
            // The same package, version and lock: installed before (by an
            // add without a version, or a concurrent one).
            return self.open(pkg, &dir);
        }
        let record = Record {
            ecosystem: pkg.ecosystem,
            name: pkg.name.clone(),
            version: built.version,
            lock_digest,
            lock_file: built.lock_file.to_string(),
            run: built.run,
        };
        let json = serde_json::to_vec_pretty(&record).map_err(|e| StoreError::Io {
            what: "encode the store record".into(),
            source: std::io::Error::other(e),
        })?;
        std::fs::write(tmp.0.join(RECORD), json).map_err(io("write the store record"))?;
        readable_by_all(&tmp.0)?;
        match std::fs::rename(&tmp.0, &dir) {
            Ok(()) => tmp.keep(),
            // Another install of the same lock won the rename.
            Err(_) if dir.join(RECORD).is_file() => return self.open(pkg, &dir),
            Err(e) => {
                return Err(StoreError::Io {
                    what: format!("move the install into {}", dir.display()),
                    source: e,
                });
            }
        }
        let mut installed = self.open(pkg, &dir)?;
        installed.reused = false;
        Ok(installed)
    }

    /// The newest verified install of `pkg` at `version`, if any.
    fn find(&self, pkg: &PackageRef, version: &str) -> Result<Option<Installed>, StoreError> {
        let eco_dir = self.root.join(pkg.ecosystem.name());
        let prefix = format!("{}@{version}-", escape_name(&pkg.name));
        let entries = match std::fs::read_dir(&eco_dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(StoreError::Io {
                    what: format!("read the store {}", eco_dir.display()),
                    source: e,
                });
            }
        };
        let mut found: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
        for e in entries {
            let e = e.map_err(io(format!("read the store {}", eco_dir.display())))?;
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some(digest) = name.strip_prefix(&prefix) else {
                continue;
            };
            if digest.len() != 16 || !digest.chars().all(|c| c.is_ascii_hexdigit()) {
                continue;
            }
            let mtime = e
                .metadata()
                .and_then(|m| m.modified())
                .unwrap_or(std::time::UNIX_EPOCH);
            found.push((mtime, e.path()));
        }
        found.sort();
        match found.pop() {
            Some((_, dir)) => self.open(pkg, &dir).map(Some),
            None => Ok(None),
        }
    }

    /// An install in the store, its lock checked against the digest it is
    /// stored under.
    fn open(&self, pkg: &PackageRef, dir: &Path) -> Result<Installed, StoreError> {
        let corrupt = |why: String| {
            StoreError::Refused(format!(
                "{pkg}: the store's install {} is not intact ({why}); remove it to install afresh",
                dir.display()
            ))
        };
        let text = std::fs::read(dir.join(RECORD))
            .map_err(|e| corrupt(format!("its record {RECORD}: {e}")))?;
        let r: Record = serde_json::from_slice(&text)
            .map_err(|e| corrupt(format!("its record {RECORD}: {e}")))?;
        if r.ecosystem != pkg.ecosystem || r.name != pkg.name {
            return Err(corrupt(format!(
                "it records {}:{}",
                r.ecosystem.name(),
                r.name
            )));
        }
        if pkg.version.as_ref().is_some_and(|v| *v != r.version) {
            return Err(corrupt(format!("it records version {}", r.version)));
        }
        let want = dir_name(&pkg.name, &r.version, &r.lock_digest);
        if dir.file_name().and_then(|n| n.to_str()) != Some(want.as_str()) {
            return Err(corrupt(format!(
                "its record's lock digest {} is not the one it is stored under",
                r.lock_digest
            )));
        }
        if !matches!(r.lock_file.as_str(), npm::LOCK | pypi::LOCK) {
            return Err(corrupt(format!("unknown lock file {}", r.lock_file)));
        }
        let now =
            digest_file(&dir.join(&r.lock_file)).map_err(|e| corrupt(format!("its lock: {e}")))?;
        if now != r.lock_digest {
            return Err(corrupt(format!(
                "its lock {} has digest {now}, recorded {}",
                r.lock_file, r.lock_digest
            )));
        }
        let dst = Path::new(SANDBOX_ROOT)
            .join(pkg.ecosystem.name())
            .join(dir.file_name().unwrap_or_default());
        let mut mounts = vec![Mount {
            src: dir.to_path_buf(),
            dst: dst.clone(),
            rw: false,
        }];
        let mut env = BTreeMap::new();
        let command = match pkg.ecosystem {
            Ecosystem::Npm => {
                let (node, mount) = npm::interpreter()?;
                mounts.extend(mount);
                let mut c = vec![node];
                c.extend(r.run.iter().map(|a| in_sandbox(&dst, a)));
                c
            }
            Ecosystem::Pypi => {
                env.insert("PYTHONDONTWRITEBYTECODE".into(), "1".into());
                let mut c = vec![dst.join("bin/python3").to_string_lossy().into_owned()];
                c.extend(r.run.iter().map(|a| in_sandbox(&dst, a)));
                c
            }
        };
        Ok(Installed {
            package: pkg.clone(),
            version: r.version,
            root: dir.to_path_buf(),
            command,
            mounts,
            env,
            lock_digest: r.lock_digest,
            reused: true,
        })
    }
}

/// A `run` argument of the record: `@/rel` is a path in the install.
fn in_sandbox(dst: &Path, arg: &str) -> String {
    match arg.strip_prefix("@/") {
        Some(rel) => dst.join(rel).to_string_lossy().into_owned(),
        None => arg.to_string(),
    }
}

/// What is kept in each install's `cordon-store.json`.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    ecosystem: Ecosystem,
    name: String,
    version: String,
    /// Full SHA-256 (hex, 64 digits) of `lock_file`.
    lock_digest: String,
    lock_file: String,
    /// The interpreter's arguments: `@/PATH` is PATH inside the install.
    run: Vec<String>,
}

/// What an ecosystem's installer made in the temporary directory.
struct Built {
    version: String,
    lock_file: &'static str,
    run: Vec<String>,
}

fn escape_name(name: &str) -> String {
    name.replace('/', "+")
}

fn dir_name(name: &str, version: &str, lock_digest: &str) -> String {
    format!(
        "{}@{version}-{}",
        escape_name(name),
        &lock_digest[..16.min(lock_digest.len())]
    )
}

fn digest_file(p: &Path) -> Result<String, StoreError> {
    let bytes = std::fs::read(p).map_err(io(format!("read {}", p.display())))?;
    Ok(hex::encode(Sha256::digest(&bytes)))
}

fn mkdir_all(p: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(p)
        .map_err(io(format!("create the store directory {}", p.display())))
}

/// Make a tree readable (and its directories searchable) by every uid: a
/// sandbox runs its server as an unprivileged one.
fn readable_by_all(root: &Path) -> Result<(), StoreError> {
    use std::os::unix::fs::PermissionsExt;
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let m = std::fs::symlink_metadata(&p).map_err(io(format!("stat {}", p.display())))?;
        if m.file_type().is_symlink() {
            continue;
        }
        let mode = m.permissions().mode();
        // Directories and executables: read and search; files: read.
        let want = if m.is_dir() || mode & 0o111 != 0 {
            mode | 0o555
        } else {
            mode | 0o444
        };
        if want != mode {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(want))
                .map_err(io(format!("chmod {}", p.display())))?;
        }
        if m.is_dir() {
            for e in std::fs::read_dir(&p).map_err(io(format!("read {}", p.display())))? {
                stack.push(e.map_err(io(format!("read {}", p.display())))?.path());
            }
        }
    }
    Ok(())
}

/// A directory in the store removed on drop unless kept.
struct TempDir(PathBuf, bool);

impl TempDir {
    fn new(parent: &Path) -> Result<TempDir, StoreError> {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        let p = parent.join(format!(".tmp-{}-{nanos}", std::process::id()));
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .mode(0o755)
            .create(&p)
            .map_err(io(format!("create {}", p.display())))?;
        Ok(TempDir(p, false))
    }

    fn keep(mut self) {
        self.1 = true;
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if !self.1 {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// Run an installer; its output on failure, for the caller to explain.
fn run(cmd: &mut Command, what: &str) -> Result<Result<String, String>, StoreError> {
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(io(format!("run {what}")))?;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    if out.status.success() {
        Ok(Ok(String::from_utf8_lossy(&out.stdout).into_owned()))
    } else {
        Ok(Err(format!(
            "{}\n{stderr}",
            String::from_utf8_lossy(&out.stdout)
        )))
    }
}

/// The last few non-empty lines of an installer's output.
fn tail(out: &str) -> String {
    let lines: Vec<&str> = out.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(6)..].join("\n")
}

/// Does an installer's output say the network could not be reached?
fn network_failed(out: &str) -> bool {
    [
        "ENOTFOUND",
        "EAI_AGAIN",
        "ECONNREFUSED",
        "ETIMEDOUT",
        "ENETUNREACH",
        "Temporary failure in name resolution",
        "Network is unreachable",
        "NewConnectionError",
        "Failed to establish a new connection",
        "Name or service not known",
    ]
    .iter()
    .any(|s| out.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse() {
        let p = PackageRef::parse("npm:@modelcontextprotocol/server-memory@2026.8.31").unwrap();
        assert_eq!(p.ecosystem, Ecosystem::Npm);
        assert_eq!(p.name, "@modelcontextprotocol/server-memory");
        assert_eq!(p.version.as_deref(), Some("2026.8.31"));
        let p = PackageRef::parse("npm:@scope/x").unwrap();
        assert_eq!((p.name.as_str(), p.version), ("@scope/x", None));
        let p = PackageRef::parse("pypi:markitdown-mcp==0.0.1a8").unwrap();
        assert_eq!(p.ecosystem, Ecosystem::Pypi);
        assert_eq!(p.name, "markitdown-mcp");
        assert_eq!(p.version.as_deref(), Some("0.0.1a8"));
        assert_eq!(p.to_string(), "pypi:markitdown-mcp==0.0.1a8");
        assert_eq!(
            PackageRef::parse("pypi:mcp_server_time").unwrap().version,
            None
        );
    }

    #[test]
    fn specs_that_are_not_exact_packages_are_refused() {
        for s in [
            "server-memory",
            "npm:",
            "npm:--foo",
            "npm:git+https://example.com/x.git",
            "npm:x@^1.2",
            "npm:x@latest/../..",
            "npm:file:../x",
            "npm:../x",
            "npm:X",
            "pypi:x>=1",
            "pypi:x==1.*",
            "pypi:-r",
            "pypi:x @ https://example.com/x.whl",
            "pypi:x[extra]",
        ] {
            let e = PackageRef::parse(s).unwrap_err().to_string();
            assert!(e.starts_with(&format!("`{s}`: ")), "{s}: {e}");
        }
    }

    #[test]
    fn verify_takes_only_an_intact_install_of_this_store() {
        let root = std::env::temp_dir().join(format!("cordon-store-verify-{}", std::process::id()));
        let store = Store::at(root.clone());
        let pkg = PackageRef::parse("pypi:mcp-server-time").unwrap();
        let e = store
            .verify(&pkg, Path::new("/usr/lib"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("is not an install of the store"), "{e}");
        let dir = root.join("pypi/mcp-server-time@1.0-0123456789abcdef");
        let e = store.verify(&pkg, &dir).unwrap_err().to_string();
        assert!(e.contains("is gone"), "{e}");
        // There, but with no record: not intact.
        std::fs::create_dir_all(&dir).unwrap();
        let e = store.verify(&pkg, &dir).unwrap_err().to_string();
        assert!(e.contains("is not intact"), "{e}");
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_hand_built_reference_is_checked_too() {
        let store = Store::at(std::env::temp_dir().join("cordon-store-unit-never-made"));
        for (name, version) in [("../x", None), ("x==1", None), ("x", Some("1 2"))] {
            let pkg = PackageRef {
                ecosystem: Ecosystem::Pypi,
                name: name.into(),
                version: version.map(String::from),
            };
            let e = store.install(&pkg).unwrap_err().to_string();
            assert!(e.starts_with('`'), "{name}: {e}");
        }
        assert!(!store.root.exists());
    }

    #[test]
    fn a_store_install_whose_lock_changed_is_refused() {
        let root = std::env::temp_dir().join(format!("cordon-store-unit-{}", std::process::id()));
        let dir = root.join("npm");
        std::fs::create_dir_all(&dir).unwrap();
        let lock = b"{\"lockfileVersion\": 3}";
        let digest = hex::encode(Sha256::digest(lock));
        let inst = dir.join(dir_name("x", "1.0.0", &digest));
        std::fs::create_dir_all(&inst).unwrap();
        std::fs::write(inst.join(npm::LOCK), lock).unwrap();
        let r = Record {
            ecosystem: Ecosystem::Npm,
            name: "x".into(),
            version: "1.0.0".into(),
            lock_digest: digest,
            lock_file: npm::LOCK.into(),
            run: vec!["@/node_modules/x/index.js".into()],
        };
        std::fs::write(inst.join(RECORD), serde_json::to_vec(&r).unwrap()).unwrap();
        let store = Store::at(root.clone());
        let pkg = PackageRef::parse("npm:x@1.0.0").unwrap();
        // Positive control: intact, it is reused without an install.
        match store.install(&pkg) {
            Ok(i) => {
                assert!(i.reused);
                assert_eq!(
                    i.command.last().unwrap(),
                    &format!(
                        "{SANDBOX_ROOT}/npm/{}/node_modules/x/index.js",
                        inst.file_name().unwrap().to_str().unwrap()
                    )
                );
            }
            // No node on this host: the interpreter lookup is what failed.
            Err(e) => assert!(e.to_string().contains("node"), "{e}"),
        }
        std::fs::write(inst.join(npm::LOCK), b"{\"lockfileVersion\": 2}").unwrap();
        let e = store.install(&pkg).unwrap_err().to_string();
        std::fs::remove_dir_all(&root).unwrap();
        assert!(
            e.contains("is not intact") && e.contains("has digest"),
            "{e}"
        );
    }
}
