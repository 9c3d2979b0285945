//! `cordon explain` and `cordon diff`: the resolved policy, printed and compared.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, anyhow};

use crate::exit;

pub fn load(path: &Path) -> anyhow::Result<cordon_policy::Loaded> {
    cordon_policy::load(path).map_err(|e| anyhow!("{e}"))
}

/// A tool of a loaded manifest, or an error that lists the tools it has.
pub fn tool_in<'a>(
    loaded: &'a cordon_policy::Loaded,
    path: &Path,
    tool: &str,
) -> anyhow::Result<&'a cordon_policy::ToolPolicy> {
    loaded.policy.get(tool).ok_or_else(|| {
        let names: Vec<&str> = loaded.policy.tools.keys().map(String::as_str).collect();
        anyhow!(
            "no tool `{tool}` in {}; it has: {}",
            path.display(),
            names.join(", ")
        )
    })
}

/// The resolved policy of one tool. A secret without `provider` shows the
/// provider file's default when that file loads; no value is ever shown
/// (the policy holds none).
pub fn explain(
    path: &Path,
    tool: &str,
    json: bool,
    providers: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    let loaded = load(path)?;
    let mut policy = tool_in(&loaded, path, tool)?.clone();
    if policy.secrets.iter().any(|s| s.provider.is_none())
        && let Ok(Some(cb)) = cordon_secrets::CredentialBroker::discover(providers)
        && let Some(d) = cb.default_provider()
    {
        for s in policy.secrets.iter_mut().filter(|s| s.provider.is_none()) {
            s.provider = Some(d.to_string());
        }
    }
    // With an `access:` section, the grants that can reach this tool's
    // names follow its policy (without one, every caller may use it).
    match &loaded.policy.access {
        None => print(&policy, json)?,
        Some(access) => print(
            &Explained {
                policy: &policy,
                access: grants_for(access, &policy),
            },
            json,
        )?,
    }
    Ok(ExitCode::from(exit::OK))
}

/// The resolved `gateway` section: session lifetime and caps of `cordon
/// serve`, every default filled in.
pub fn explain_gateway(path: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let loaded = load(path)?;
    let g = serde_json::json!({ "gateway": loaded.policy.gateway });
    print(&g, json)?;
    Ok(ExitCode::from(exit::OK))
}

fn print(value: &impl serde::Serialize, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(value)?);
    } else {
        let yaml = serde_saphyr::to_string(value).context("rendering the policy as YAML")?;
        println!("{}", yaml.trim_end());
    }
    Ok(())
}

/// A tool's policy and the grants that reach it.
#[derive(serde::Serialize)]
struct Explained<'a> {
    #[serde(flatten)]
    policy: &'a cordon_policy::ToolPolicy,
    access: cordon_policy::access::Access,
}

/// The grants of `access` with a name that can be one of `policy`'s: its
/// own name for a command tool; for an `mcp:` server, every tool, prompt
/// and resource name (a server's names are known only once it lists them).
fn grants_for(
    access: &cordon_policy::access::Access,
    policy: &cordon_policy::ToolPolicy,
) -> cordon_policy::access::Access {
    use cordon_policy::access::glob_matches;
    let server = matches!(policy.exec, cordon_policy::policy::Exec::Mcp { .. });
    let grants = access
        .grants
        .iter()
        .filter_map(|g| {
            let mut g = g.clone();
            if !server {
                g.tools.retain(|p| glob_matches(p, &policy.name));
                g.prompts.clear();
                g.resources.clear();
            }
            (!g.tools.is_empty() || !g.prompts.is_empty() || !g.resources.is_empty()).then_some(g)
        })
        .collect();
    cordon_policy::access::Access { grants }
}

pub fn diff(old: &Path, new: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let a = load(old)?;
    let b = load(new)?;
    let changes = cordon_policy::diff::diff(&a.policy, &b.policy);
    let weakening = changes.iter().filter(|c| c.weakens).count();
    if json {
        println!("{}", serde_json::to_string_pretty(&changes)?);
    } else {
        for c in &changes {
            println!("{c}");
        }
        println!(
            "{} changes, {} weaken isolation{}",
            changes.len(),
            weakening,
            if weakening > 0 {
                ": review required"
            } else {
                ""
            }
        );
    }
    Ok(ExitCode::from(if weakening > 0 {
        exit::FINDING
    } else {
        exit::OK
    }))
}
