//! The package resolutions `cordon import` stored: which install of the
//! package store an `npx`/`uvx` entry was resolved to, keyed by the runner,
//! the package, its pinned version (if any), where it was fetched from and
//! the store. The next import with the same key reuses the install without
//! resolving again, as long as the store still verifies it
//! (`Store::verify`); `--refresh` resolves again. Kept in
//! `<state dir>/import-resolutions.json`.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use cordon_store::{Installed, PackageRef, Source, Store};

const FILE: &str = "import-resolutions.json";

/// What a resolution depends on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Key {
    /// The launcher the client runs (`npx`, `uvx`, ...).
    pub runner: String,
    /// `npm:NAME` or `pypi:NAME`.
    pub package: String,
    /// The version the configuration pins; `None`: the newest, as resolved.
    pub version: Option<String>,
    /// `network`, `offline`, or `offline:DIR` (the npm cache or wheels).
    pub source: String,
    /// The package store (absolute).
    pub store: PathBuf,
}

impl Key {
    pub fn new(runner: &str, pkg: &PackageRef, store: &Store) -> Key {
        let abs = |p: &Path| std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf());
        Key {
            runner: runner.to_string(),
            package: format!("{}:{}", pkg.ecosystem.name(), pkg.name),
            version: pkg.version.clone(),
            source: match &store.source {
                Source::Network => "network".into(),
                Source::Offline { from: None } => "offline".into(),
                Source::Offline { from: Some(d) } => format!("offline:{}", abs(d).display()),
            },
            store: abs(&store.root),
        }
    }

    /// `npm:NAME[@V] (npx, offline:DIR)`, for messages.
    pub fn shown(&self) -> String {
        let v = self
            .version
            .as_deref()
            .map(|v| format!(" {v}"))
            .unwrap_or_default();
        format!("{}{v} ({}, {})", self.package, self.runner, self.source)
    }
}

/// One stored resolution.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Resolution {
    pub key: Key,
    /// The store's install it was resolved to (`Installed::root`).
    pub install: PathBuf,
    /// The exact version installed.
    pub resolved: String,
    pub lock_digest: String,
    /// When it was resolved (RFC 3339, UTC).
    pub at: String,
}

/// The stored resolutions, and where they are kept (`None`: no state
/// directory; nothing is stored or reused).
#[derive(Debug, Default)]
pub struct Resolutions {
    dir: Option<PathBuf>,
    list: Vec<Resolution>,
    changed: bool,
}

impl Resolutions {
    /// Those stored in `dir` (none when the file is missing or unreadable:
    /// they are only a shortcut).
    pub fn load(dir: Option<PathBuf>) -> Resolutions {
        let list = dir
            .as_ref()
            .and_then(|d| std::fs::read(d.join(FILE)).ok())
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        Resolutions {
            dir,
            list,
            changed: false,
        }
    }

    pub fn find(&self, key: &Key) -> Option<&Resolution> {
        self.list.iter().find(|r| r.key == *key)
    }

    /// Record that `key` was resolved to `inst` (replacing the one before).
    pub fn record(&mut self, key: Key, inst: &Installed) {
        self.list.retain(|r| r.key != key);
        self.list.push(Resolution {
            key,
            install: inst.root.clone(),
            resolved: inst.version.clone(),
            lock_digest: inst.lock_digest.clone(),
            at: crate::state::now_rfc3339(),
        });
        self.changed = true;
    }

    /// Write them back when a resolution was recorded, in one rename.
    pub fn save(&self) -> anyhow::Result<()> {
        let Some(dir) = &self.dir else { return Ok(()) };
        if !self.changed {
            return Ok(());
        }
        crate::state::replace_file(dir, FILE, &self.list)
    }
}
