//! cordon-kube: the Kubernetes objects a manifest needs, rendered from its
//! resolved policies (`cordon render kubernetes`).
//!
//! Every object is a typed value of `k8s-openapi` (the agent-sandbox
//! CRDs, which it has no types for, are small serde structs of
//! [`agent_sandbox`]); nothing is a string template. Each file renders one
//! kind of object from [`cordon_policy`] values:
//!
//! - [`pod_template`]: a P2/P3 tool's sandbox as a Pod template (image by
//!   digest, the hardened security context, the policy's limits and wall
//!   clock, the runtime class, memory-backed writable paths, the session CA
//!   and credential placeholders);
//! - [`network_policy`]: the sandboxes' default-deny policy and each
//!   networked tool's one door, its own port of the egress proxy Service;
//!   [`widening`] finds any other policy that would widen that;
//! - [`deployment`], [`service`], [`service_account`], [`role`],
//!   [`pod_disruption_budget`], [`config_map`]: the broker;
//! - [`agent_sandbox`]: the same sandboxes as `SandboxTemplate` and
//!   `SandboxWarmPool` objects (`--agent-sandbox`).
//!
//! A tool that is not rendered as a Pod (P0, P1, no image pinned by
//! digest) is never dropped silently: it gets a [`Note`].
#![forbid(unsafe_code)]

pub mod agent_sandbox;
pub mod config_map;
pub mod deployment;
pub mod names;
pub mod network_policy;
pub mod pod_disruption_budget;
pub mod pod_template;
pub mod role;
pub mod service;
pub mod service_account;
pub mod widening;

use cordon_policy::PolicySet;
use cordon_policy::policy::{Network, Profile, ToolPolicy};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, PodTemplate, Service, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use serde::Serialize;

pub use widening::Widening;

/// What `render` is asked for beside the manifest.
#[derive(Debug, Clone)]
pub struct Options {
    /// The namespace of every object.
    pub namespace: String,
    /// The broker's image (`cordon`), best pinned by digest.
    pub broker_image: String,
    /// The sandboxes as agent-sandbox `SandboxTemplate`s (and
    /// `SandboxWarmPool`s) instead of bare Pod templates.
    pub agent_sandbox: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            namespace: "cordon".into(),
            broker_image: format!("cordon:{}", env!("CARGO_PKG_VERSION")),
            agent_sandbox: false,
        }
    }
}

/// Why a tool (or a part of one) is not rendered as the policy says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Note {
    pub tool: String,
    pub message: String,
}

/// One sandboxed tool as rendered: its Pod template and, when it has a
/// network, its port on the egress proxy Service.
#[derive(Debug, Clone)]
pub struct Sandbox {
    pub tool: String,
    pub template: PodTemplate,
    /// Its own port of the egress proxy Service (`None`: no network).
    pub proxy_port: Option<i32>,
}

/// Every object a manifest needs, in the order they are applied.
#[derive(Debug, Clone)]
pub struct Rendered {
    pub namespace: String,
    pub service_account: ServiceAccount,
    pub role: Role,
    pub role_binding: RoleBinding,
    pub manifest: ConfigMap,
    pub deployment: Deployment,
    pub broker_service: Service,
    /// The egress proxy (`None`: no tool has a network).
    pub egress_service: Option<Service>,
    pub disruption_budget: PodDisruptionBudget,
    pub network_policies: Vec<NetworkPolicy>,
    /// The P2/P3 tools' sandboxes (as bare Pod templates unless
    /// `agent_sandbox`).
    pub sandboxes: Vec<Sandbox>,
    pub sandbox_templates: Vec<agent_sandbox::SandboxTemplate>,
    pub warm_pools: Vec<agent_sandbox::SandboxWarmPool>,
    /// The tools (or parts of tools) not rendered, and why.
    pub notes: Vec<Note>,
}

/// The first port of the egress proxy Service; each networked tool has
/// its own, in name order.
pub const FIRST_PROXY_PORT: i32 = 3128;

/// Render everything `set` needs; `manifest_text` is the manifest itself,
/// which the broker reads from a ConfigMap.
pub fn render(set: &PolicySet, manifest_text: &str, opts: &Options) -> Rendered {
    let ns = opts.namespace.as_str();
    let mut notes = Vec::new();
    let mut sandboxes = Vec::new();
    let mut next_port = FIRST_PROXY_PORT;
    for p in set.tools.values() {
        match pod_template::renders_as_pod(p) {
            Err(why) => notes.push(Note {
                tool: p.name.clone(),
                message: why,
            }),
            Ok(image) => {
                let label = names::dns_label(&p.name);
                if let Some(other) = sandboxes
                    .iter()
                    .find(|s: &&Sandbox| names::dns_label(&s.tool) == label)
                {
                    notes.push(Note {
                        tool: p.name.clone(),
                        message: format!(
                            "not rendered: its objects' name and labels ({label}) would be those \
                             of tool {}; rename one",
                            other.tool
                        ),
                    });
                    continue;
                }
                let proxy_port = match p.network {
                    Network::None => None,
                    _ => {
                        let port = next_port;
                        next_port += 1;
                        Some(port)
                    }
                };
                let (template, mut n) = pod_template::pod_template(p, &image, ns, proxy_port);
                notes.append(&mut n);
                sandboxes.push(Sandbox {
                    tool: p.name.clone(),
                    template,
                    proxy_port,
                });
            }
        }
    }
    let in_broker: Vec<&ToolPolicy> = set
        .tools
        .values()
        .filter(|p| p.profile == Profile::P1)
        .collect();
    let proxy_ports: Vec<i32> = sandboxes.iter().filter_map(|s| s.proxy_port).collect();
    let (sandbox_templates, warm_pools) = if opts.agent_sandbox {
        agent_sandbox::render(set, &sandboxes, ns)
    } else {
        (Vec::new(), Vec::new())
    };
    Rendered {
        namespace: ns.to_string(),
        service_account: service_account::service_account(ns),
        role: role::role(ns, opts.agent_sandbox),
        role_binding: role::role_binding(ns),
        manifest: config_map::manifest(ns, manifest_text),
        deployment: deployment::deployment(ns, &opts.broker_image, &in_broker, &proxy_ports),
        broker_service: service::broker(ns),
        egress_service: service::egress_proxy(ns, &sandboxes),
        disruption_budget: pod_disruption_budget::pod_disruption_budget(ns),
        network_policies: network_policy::network_policies(ns, &sandboxes),
        sandboxes,
        sandbox_templates,
        warm_pools,
        notes,
    }
}

impl Rendered {
    /// Every object as JSON, in the order they are applied (the Pod
    /// templates only without `--agent-sandbox`).
    pub fn documents(&self) -> Result<Vec<serde_json::Value>, serde_json::Error> {
        let mut out = vec![
            serde_json::to_value(&self.service_account)?,
            serde_json::to_value(&self.role)?,
            serde_json::to_value(&self.role_binding)?,
            serde_json::to_value(&self.manifest)?,
        ];
        if let Some(s) = &self.egress_service {
            out.push(serde_json::to_value(s)?);
        }
        out.push(serde_json::to_value(&self.broker_service)?);
        for np in &self.network_policies {
            out.push(serde_json::to_value(np)?);
        }
        if self.sandbox_templates.is_empty() && self.warm_pools.is_empty() {
            for s in &self.sandboxes {
                out.push(serde_json::to_value(&s.template)?);
            }
        }
        for t in &self.sandbox_templates {
            out.push(serde_json::to_value(t)?);
        }
        for w in &self.warm_pools {
            out.push(serde_json::to_value(w)?);
        }
        out.push(serde_json::to_value(&self.deployment)?);
        out.push(serde_json::to_value(&self.disruption_budget)?);
        Ok(out)
    }

    /// The documents as one multi-document YAML stream.
    pub fn to_yaml(&self) -> Result<String, String> {
        let mut out = String::new();
        for d in self
            .documents()
            .map_err(|e| format!("rendering JSON: {e}"))?
        {
            out.push_str("---\n");
            let y = serde_saphyr::to_string(&d).map_err(|e| format!("rendering YAML: {e}"))?;
            out.push_str(y.trim_end());
            out.push('\n');
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
