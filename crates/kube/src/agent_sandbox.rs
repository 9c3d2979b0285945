//! The agent-sandbox CRDs (kubernetes-sigs/agent-sandbox,
//! `extensions.agents.x-k8s.io/v1beta1`), which `k8s-openapi` has no
//! types for: a `SandboxTemplate` per sandboxed tool (`spec.podTemplate`:
//! the same Pod template as without `--agent-sandbox`) and a
//! `SandboxWarmPool` (`spec.replicas`, `spec.sandboxTemplateRef`) per tool
//! kept warm (`lifetime: pool`, or an `mcp:` server's `warm`). The broker
//! claims a sandbox per session (`SandboxClaim`, not rendered: it is made
//! per session). Only the fields named here are written; unknown ones
//! are refused when read back (`deny_unknown_fields`).

use cordon_policy::PolicySet;
use cordon_policy::policy::{Exec, Lifetime, ToolPolicy};
use k8s_openapi::api::core::v1::PodTemplateSpec;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::{Deserialize, Serialize};

use crate::Sandbox;
use crate::names;

/// The group of the templates, claims and warm pools.
pub const EXTENSIONS_GROUP: &str = "extensions.agents.x-k8s.io";
/// The group of the sandboxes themselves.
pub const CORE_GROUP: &str = "agents.x-k8s.io";
/// The apiVersion of the objects rendered here.
pub const API_VERSION: &str = "extensions.agents.x-k8s.io/v1beta1";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxTemplate {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: SandboxTemplateSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxTemplateSpec {
    pub pod_template: PodTemplateSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxWarmPool {
    pub api_version: String,
    pub kind: String,
    pub metadata: ObjectMeta,
    pub spec: SandboxWarmPoolSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SandboxWarmPoolSpec {
    pub replicas: i32,
    pub sandbox_template_ref: TemplateRef,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TemplateRef {
    pub name: String,
}

/// Sandboxes kept ready for a tool: its pool's size (`lifetime: pool`),
/// or its server's `warm`; `None`: none.
pub fn warm(p: &ToolPolicy) -> Option<i32> {
    let n = match (&p.exec, p.lifetime, &p.pool) {
        (_, Lifetime::Pool, Some(pool)) => pool.size,
        (Exec::Mcp { warm, .. }, _, _) => *warm,
        _ => 0,
    };
    (n > 0).then(|| i32::try_from(n).unwrap_or(i32::MAX))
}

/// A template per sandbox, and a warm pool per tool kept warm.
pub fn render(
    set: &PolicySet,
    sandboxes: &[Sandbox],
    ns: &str,
) -> (Vec<SandboxTemplate>, Vec<SandboxWarmPool>) {
    let mut templates = Vec::new();
    let mut pools = Vec::new();
    for s in sandboxes {
        let name = names::sandbox_name(&s.tool);
        let Some(pod_template) = s.template.template.clone() else {
            continue;
        };
        templates.push(SandboxTemplate {
            api_version: API_VERSION.into(),
            kind: "SandboxTemplate".into(),
            metadata: s.template.metadata.clone(),
            spec: SandboxTemplateSpec { pod_template },
        });
        if let Some(replicas) = set.get(&s.tool).and_then(warm) {
            pools.push(SandboxWarmPool {
                api_version: API_VERSION.into(),
                kind: "SandboxWarmPool".into(),
                metadata: names::meta(&name, ns, names::labels(&[])),
                spec: SandboxWarmPoolSpec {
                    replicas,
                    sandbox_template_ref: TemplateRef { name },
                },
            });
        }
    }
    (templates, pools)
}
