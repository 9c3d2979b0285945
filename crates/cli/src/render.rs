//! `cordon render kubernetes`: the objects a manifest needs on a cluster,
//! printed as one multi-document YAML stream (crates/kube,
//! docs/kubernetes.md). Each tool not rendered as a Pod gets a note on
//! stderr, and each NetworkPolicy that would widen a sandbox's egress is
//! reported (exit 1).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, anyhow};

use crate::{ManifestArg, exit};

#[derive(clap::Subcommand)]
pub enum RenderCmd {
    /// Kubernetes objects: the broker (Deployment, Services, ServiceAccount,
    /// Role, RoleBinding, PodDisruptionBudget, the manifest's ConfigMap),
    /// the sandboxes' NetworkPolicies, and a Pod template per P2/P3 tool
    /// run from an image. Exit 1 if a NetworkPolicy would widen a sandbox's egress.
    Kubernetes(KubernetesArgs),
}

#[derive(clap::Args)]
pub struct KubernetesArgs {
    #[command(flatten)]
    manifest: ManifestArg,
    /// The namespace of every object.
    #[arg(long, default_value = "cordon")]
    namespace: String,
    /// The broker's image (best pinned by digest). Default: cordon:<version>.
    #[arg(long, value_name = "IMAGE")]
    broker_image: Option<String>,
    /// The sandboxes as agent-sandbox SandboxTemplate and SandboxWarmPool
    /// objects (extensions.agents.x-k8s.io/v1beta1) instead of Pod templates.
    #[arg(long)]
    agent_sandbox: bool,
    /// The namespace's own NetworkPolicies (YAML, one or more documents):
    /// each one that would widen a sandbox's egress is reported.
    #[arg(long, value_name = "FILE")]
    existing: Option<PathBuf>,
}

pub fn run(cmd: RenderCmd) -> anyhow::Result<ExitCode> {
    let RenderCmd::Kubernetes(a) = cmd;
    let ns = a.namespace.as_str();
    if ns.is_empty()
        || ns.len() > 63
        || !ns
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        || ns.starts_with('-')
        || ns.ends_with('-')
    {
        return Err(anyhow!(
            "--namespace {ns}: a namespace is a DNS label (lower case letters, digits and `-`, \
             at most 63, a letter or digit at both ends)"
        ));
    }
    let path = &a.manifest.path;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let loaded = cordon_policy::load_str(path, &text).map_err(|e| anyhow!("{e}"))?;
    let mut opts = cordon_kube::Options {
        namespace: a.namespace.clone(),
        agent_sandbox: a.agent_sandbox,
        ..Default::default()
    };
    if let Some(i) = &a.broker_image {
        opts.broker_image = i.clone();
    }
    let rendered = cordon_kube::render(&loaded.policy, &text, &opts);
    let existing = match &a.existing {
        None => Vec::new(),
        Some(f) => {
            let t =
                std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
            cordon_kube::widening::network_policies_from_yaml(&t)
                .map_err(|e| anyhow!("{}: {e}", f.display()))?
        }
    };
    let source = a
        .existing
        .as_ref()
        .map(|f| f.display().to_string())
        .unwrap_or_default();
    let widenings = cordon_kube::widening::check(&rendered, &existing, &source);
    print!("{}", rendered.to_yaml().map_err(|e| anyhow!(e))?);
    for n in &rendered.notes {
        eprintln!("cordon: note: {}: {}", n.tool, n.message);
    }
    for w in &widenings {
        eprintln!("cordon: {w}");
    }
    Ok(if widenings.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(exit::FINDING)
    })
}
