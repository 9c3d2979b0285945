//! `cordon inventory`: one row per tool of a manifest: what it parses,
//! what it can reach, its secrets, profile, runtime and required
//! mechanisms, whether this host can enforce it (the runtime registry's
//! `admit`, exactly as `run` and `serve` admit it), and when `cordon probe`
//! last passed for it (recorded in the state directory, see [`crate::state`]).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::anyhow;
use serde::Serialize;

use cordon_policy::ToolPolicy;
use cordon_policy::policy::{Exec, Network, Profile};

use crate::{exit, state};

#[derive(clap::Args)]
pub struct InventoryArgs {
    #[command(flatten)]
    pub manifest: crate::ManifestArg,
    /// One JSON object: `{"manifest": ..., "tools": [...]}`.
    #[arg(long, conflicts_with = "markdown")]
    pub json: bool,
    /// A Markdown table (for reviews).
    #[arg(long)]
    pub markdown: bool,
    /// The credential broker's provider file (admission of tools that
    /// declare secrets needs it). Default: /etc/cordon/providers.yaml.
    #[arg(long, env = "CORDON_PROVIDERS", value_name = "FILE")]
    pub providers: Option<PathBuf>,
}

/// One tool's row.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub tool: String,
    /// What the tool runs: `command`, `image` or `mcp`.
    pub kind: &'static str,
    /// What the tool parses: the bytes it is handed, in words.
    pub parses: String,
    /// `none`, `proxy` (any public destination on 80 and 443), or the
    /// allowlist's `host:port` entries.
    pub egress: Vec<String>,
    pub secrets: Vec<String>,
    /// Host paths bound into the sandbox: `SRC -> DST (ro|rw)`.
    pub mounts: Vec<String>,
    pub profile: String,
    pub runtime: String,
    /// Mechanisms the runtime must fully enforce, else the tool is refused.
    pub requires: Vec<String>,
    /// Degradations the manifest accepts.
    pub accepts: Vec<String>,
    /// This host can run it with every required mechanism.
    pub enforceable: bool,
    /// Why not, or the degradations it runs with.
    pub enforcement: Vec<String>,
    /// When `cordon probe` last passed for its sandbox (RFC 3339), with
    /// this very policy.
    pub probe_passed: Option<String>,
    /// The last probe run: `passed`, `failed`, `policy changed since`, or
    /// `never`.
    pub probe: String,
}

fn parses(p: &ToolPolicy) -> String {
    match &p.exec {
        Exec::Mcp { command, image, .. } => {
            let what = command
                .as_ref()
                .and_then(|c| c.first().cloned())
                .or_else(|| image.clone())
                .unwrap_or_default();
            format!("MCP requests and what its server reads or fetches ({what})")
        }
        Exec::Unspecified => "nothing (no command, image or mcp)".into(),
        Exec::Command { .. } | Exec::Image { .. } | Exec::Wasm { .. } => {
            let mut parts = Vec::new();
            if let Some(s) = &p.input.stdin {
                parts.push(format!(
                    "argument `{s}` on stdin ({})",
                    serde_json::to_value(p.input.encoding)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_string))
                        .unwrap_or_default()
                ));
            }
            if !p.input.argv.is_empty() {
                parts.push(format!("arguments {} in argv", p.input.argv.join(", ")));
            }
            if parts.is_empty() {
                "no input (empty stdin)".into()
            } else {
                parts.join("; ")
            }
        }
    }
}

fn lower<T: Serialize + std::fmt::Debug>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|j| j.as_str().map(str::to_string))
        .unwrap_or_else(|| format!("{v:?}").to_lowercase())
}

pub fn rows(path: &Path, providers: Option<&Path>) -> anyhow::Result<Vec<Row>> {
    let loaded = cordon_policy::load(path).map_err(|e| anyhow!("{e}"))?;
    let mut registry = cordon_runtime::Registry::for_host(Default::default())
        .with_upstream_dns(crate::run::upstream_dns());
    if let Some(cb) = crate::credentials::credentials_for(loaded.policy.tools.values(), providers)?
    {
        registry = registry.with_credentials(cb);
    }
    let records = state::probe_records(&state::state_dir()?)?;
    let mut out = Vec::new();
    for p in loaded.policy.tools.values() {
        let (enforceable, enforcement) = if p.profile == Profile::P0 {
            (true, vec!["P0: no sandbox, nothing to enforce".to_string()])
        } else {
            match registry.admit(p, cordon_runtime::Use::of(p)) {
                Ok(a) => (true, a.warnings),
                Err(why) => (false, vec![why]),
            }
        };
        let rec = records.get(&p.name);
        let same = rec.is_some_and(|r| r.policy_sha256 == state::policy_digest(p));
        let probe = match rec {
            None => "never".to_string(),
            Some(_) if !same => "policy changed since the last run".to_string(),
            Some(r) if r.passed => "passed".to_string(),
            Some(r) => format!("failed ({} escaped, {} not judged)", r.escaped, r.other),
        };
        out.push(Row {
            tool: p.name.clone(),
            kind: match p.exec {
                Exec::Command { .. } => "command",
                Exec::Image { .. } => "image",
                Exec::Wasm { .. } => "wasm",
                Exec::Mcp { .. } => "mcp",
                Exec::Unspecified => "none",
            },
            parses: parses(p),
            egress: match &p.network {
                Network::None => vec!["none".into()],
                Network::Allowlist { allow, .. } => allow.clone(),
                Network::Proxy { .. } => vec!["proxy".into()],
                Network::Host => vec!["host (no network isolation)".into()],
            },
            secrets: p.secrets.iter().map(|s| s.name.clone()).collect(),
            mounts: p
                .mounts
                .iter()
                .map(|m| {
                    format!(
                        "{} -> {} ({})",
                        m.src,
                        m.dst,
                        if m.writable { "rw" } else { "ro" }
                    )
                })
                .collect(),
            profile: cordon_broker::profile_name(p.profile).to_string(),
            runtime: lower(&p.runtime),
            requires: p.require.iter().map(|m| m.name().to_string()).collect(),
            accepts: p.accept.iter().map(|m| m.name().to_string()).collect(),
            enforceable,
            enforcement,
            probe_passed: rec.filter(|_| same).and_then(|r| r.last_passed.clone()),
            probe,
        });
    }
    Ok(out)
}

fn cell(v: &[String]) -> String {
    if v.is_empty() {
        "-".into()
    } else {
        v.join(", ")
    }
}

pub fn run(a: &InventoryArgs) -> anyhow::Result<ExitCode> {
    let rows = rows(&a.manifest.path, a.providers.as_deref())?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "manifest": a.manifest.path,
                "tools": rows,
            }))?
        );
        return Ok(ExitCode::from(exit::OK));
    }
    let enforced = |r: &Row| {
        if r.enforceable {
            if r.enforcement.is_empty() {
                "yes".to_string()
            } else {
                format!("yes ({})", r.enforcement.join("; "))
            }
        } else {
            format!("NO: {}", r.enforcement.join("; "))
        }
    };
    let probe = |r: &Row| match &r.probe_passed {
        Some(t) if r.probe == "passed" => t.clone(),
        Some(t) => format!("{t} (last run: {})", r.probe),
        None => r.probe.clone(),
    };
    if a.markdown {
        let header = [
            "tool",
            "profile",
            "runtime",
            "parses",
            "egress",
            "secrets",
            "mounts",
            "requires",
            "enforced here",
            "probe passed",
        ];
        println!("| {} |", header.join(" | "));
        println!("|{}", " --- |".repeat(header.len()));
        for r in &rows {
            let cells = [
                r.tool.clone(),
                r.profile.clone(),
                r.runtime.clone(),
                r.parses.clone(),
                cell(&r.egress),
                cell(&r.secrets),
                cell(&r.mounts),
                cell(&r.requires),
                enforced(r),
                probe(r),
            ];
            let cells: Vec<String> = cells.iter().map(|c| c.replace('|', "\\|")).collect();
            println!("| {} |", cells.join(" | "));
        }
    } else {
        // One block per tool, one field per line: readable in a terminal
        // however long a field is.
        for (i, r) in rows.iter().enumerate() {
            if i > 0 {
                println!();
            }
            println!("{}  {} {}", r.tool, r.profile, r.runtime);
            for (k, v) in [
                ("parses", r.parses.clone()),
                ("egress", cell(&r.egress)),
                ("secrets", cell(&r.secrets)),
                ("mounts", cell(&r.mounts)),
                ("requires", cell(&r.requires)),
                ("enforced", enforced(r)),
                ("probed", probe(r)),
            ] {
                println!("  {k:<9} {v}");
            }
        }
    }
    Ok(ExitCode::from(exit::OK))
}
