//! The listing each `mcp:` server last gave, kept in cordon's state dir so
//! that `initialize` and `tools/list` need not start it: a server starts at
//! the first request that needs it to run.
//!
//! A listing is keyed by the program: its image (by digest) or command,
//! its mounts, the names of its environment variables (not their values)
//! and the client capabilities cordon declares to it (sampling,
//! elicitation). It holds the server's own tool list (before `allow`, `rename`
//! and the pins, which are applied to it as to a fresh one) and what the
//! server offers. When the server starts, its fresh listing replaces the
//! cached one; a listing that differs is handled like `list_changed`.
//!
//! Listings are kept per tenant (the tenant is part of the key): a server's
//! listing can depend on what it holds (its state, the account its
//! credentials reach), so one started for a session of tenant A never
//! answers a session of tenant B, whose first listing starts a server of
//! its own. What a server offers (a few capability flags, the same for
//! every tenant of one program) is shared by the gateway's sessions.

use std::path::{Path, PathBuf};

use cordon_policy::policy::{Exec, ToolPolicy};
use rmcp::model::Tool;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;

use crate::offers::Offers;

/// The default directory: `mcp` in cordon's state directory
/// (`$CORDON_STATE_DIR/mcp`, else `/var/lib/cordon/mcp` as root, else
/// `$XDG_STATE_HOME/cordon/mcp` or `~/.local/state/cordon/mcp`; see
/// `cordon_dirs`). `Err`: no safe place, saying what to set.
pub fn default_dir() -> Result<PathBuf, String> {
    cordon_dirs::Dirs::current()
        .mcp_listings()
        .map_err(|e| e.to_string())
}

/// One cached listing.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Listing {
    pub tools: Vec<Tool>,
    pub offers: Offers,
}

/// The cache (none: disabled).
#[derive(Debug, Clone, Default)]
pub(crate) struct ListingCache {
    dir: Option<PathBuf>,
}

impl ListingCache {
    pub fn new(dir: Option<PathBuf>) -> ListingCache {
        ListingCache { dir }
    }

    /// The key of a server's program for `tenant`.
    pub fn key(policy: &ToolPolicy, tenant: &str) -> String {
        // What cordon declares to the server (its listing can depend on
        // it: a server may offer tools only to a client that can sample).
        let program = match &policy.exec {
            Exec::Mcp {
                command,
                image,
                allow_sampling,
                allow_elicitation,
                ..
            } => serde_json::json!({
                "command": command,
                "image": image,
                "sampling": allow_sampling,
                "elicitation": allow_elicitation,
            }),
            other => serde_json::json!({"exec": other}),
        };
        let env: Vec<&String> = policy.env.keys().collect();
        let v = serde_json::json!({
            "tenant": tenant,
            "program": program,
            "mounts": policy.mounts,
            "env": env,
        });
        let mut h = sha2::Sha256::new();
        h.update(v.to_string().as_bytes());
        hex::encode(h.finalize())
    }

    fn path(&self, policy: &ToolPolicy, tenant: &str) -> Option<PathBuf> {
        Some(
            self.dir
                .as_ref()?
                .join(format!("{}.json", ListingCache::key(policy, tenant))),
        )
    }

    /// The listing cached for this program and tenant, if any (an
    /// unreadable one is none).
    pub fn get(&self, policy: &ToolPolicy, tenant: &str) -> Option<Listing> {
        let text = std::fs::read(self.path(policy, tenant)?).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Keep `listing` for this program and tenant; a failure is logged,
    /// not fatal.
    pub fn put(&self, policy: &ToolPolicy, tenant: &str, listing: &Listing) {
        let Some(path) = self.path(policy, tenant) else {
            return;
        };
        if let Err(e) = write(&path, listing) {
            tracing::warn!(tool = %policy.name, "listing not cached at {}: {e}", path.display());
        }
    }
}

fn write(path: &Path, listing: &Listing) -> std::io::Result<()> {
    if let Some(dir) = path.parent() {
        // This user's alone: a listing read back is trusted as the
        // server's.
        cordon_dirs::ensure_private(dir, cordon_sys::io::geteuid())?;
    }
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, serde_json::to_vec(listing)?)?;
    std::fs::rename(&tmp, path)
}
