//! `cordon doctor`'s pools: for each tool of the manifest with a warm
//! pool (`mcp: {warm: N}`, `lifetime: pool`) its configured size, and the
//! live state of each `cordon serve` running with this state directory
//! (read from the status files it keeps, see
//! `cordon_runtime::pool_status`).

use std::path::{Path, PathBuf};

use serde::Serialize;

use cordon_policy::policy::{Exec, Lifetime, ToolPolicy};
use cordon_runtime::pool_status::{PoolState, StatusFile};

#[derive(Serialize)]
pub struct PoolsReport {
    /// The manifest read (`None`: none given and no ./cordon.yaml).
    manifest: Option<PathBuf>,
    /// Why the manifest could not be read.
    manifest_error: Option<String>,
    /// Where serving processes keep their pool status.
    status_dir: Option<PathBuf>,
    configured: Vec<Configured>,
    /// Each running `cordon serve`'s pools.
    serving: Vec<StatusFile>,
}

#[derive(Serialize)]
struct Configured {
    tool: String,
    /// `mcp` (`mcp: {warm: N}`) or `command` (`lifetime: pool`).
    kind: &'static str,
    size: usize,
}

fn configured_of(p: &ToolPolicy) -> Option<Configured> {
    match &p.exec {
        Exec::Mcp { warm, .. } if *warm > 0 && p.lifetime == Lifetime::Session => {
            Some(Configured {
                tool: p.name.clone(),
                kind: "mcp",
                size: *warm as usize,
            })
        }
        _ => p.pool.map(|s| Configured {
            tool: p.name.clone(),
            kind: "command",
            size: s.size as usize,
        }),
    }
}

/// The manifest given (`-m`, `$CORDON_MANIFEST`), else ./cordon.yaml if
/// there is one.
pub fn collect(manifest: Option<&Path>) -> PoolsReport {
    let path = manifest.map(Path::to_path_buf).or_else(|| {
        let d = PathBuf::from("cordon.yaml");
        d.is_file().then_some(d)
    });
    let mut manifest_error = None;
    let mut configured = Vec::new();
    if let Some(p) = &path {
        match cordon_policy::load(p) {
            Ok(l) => configured = l.policy.tools.values().filter_map(configured_of).collect(),
            Err(e) => manifest_error = Some(e.to_string()),
        }
    }
    let status_dir = crate::state::state_dir()
        .ok()
        .map(|d| cordon_runtime::pool_status::dir_in(&d));
    let serving = status_dir
        .as_deref()
        .map(cordon_runtime::pool_status::live)
        .unwrap_or_default();
    PoolsReport {
        manifest: path,
        manifest_error,
        status_dir,
        configured,
        serving,
    }
}

fn live_line(pid: u32, s: &PoolState) -> String {
    let mut line = format!(
        "serve {pid}, tenant {}: ready {}, starting {}, handed out {}, refill failures {}",
        s.tenant, s.ready, s.starting, s.handed_out, s.refill_failures
    );
    if let Some(w) = &s.last_failure {
        line.push_str(&format!("; last failure: {w}"));
    }
    if let Some(w) = &s.stopped {
        line.push_str(&format!("; {w}"));
    }
    line
}

pub fn print(r: &PoolsReport) {
    if let Some(e) = &r.manifest_error {
        println!("pools: the manifest cannot be read: {e}");
    }
    let dir = r
        .status_dir
        .as_ref()
        .map_or("(no state directory)".to_string(), |d| {
            d.display().to_string()
        });
    for c in &r.configured {
        let what = match c.kind {
            "mcp" => "warm mcp: server",
            _ => "lifetime: pool",
        };
        println!("pool {} ({what}): size {}", c.tool, c.size);
        let live: Vec<String> = r
            .serving
            .iter()
            .flat_map(|f| {
                f.pools
                    .iter()
                    .filter(|s| s.tool == c.tool && s.kind == c.kind)
                    .map(|s| live_line(f.pid, s))
            })
            .collect();
        if live.is_empty() {
            if r.serving.is_empty() {
                println!("      cordon serve not running (no live pool status in {dir})");
            } else {
                println!("      no pool of it started yet in the running cordon serve");
            }
        }
        for l in live {
            println!("      {l}");
        }
    }
    // Pools of a running serve whose tool the manifest read does not have.
    for f in &r.serving {
        for s in &f.pools {
            if !r
                .configured
                .iter()
                .any(|c| c.tool == s.tool && c.kind == s.kind)
            {
                println!("pool {} (size {}): {}", s.tool, s.size, live_line(f.pid, s));
            }
        }
    }
}
