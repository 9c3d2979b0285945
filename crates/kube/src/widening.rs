//! Whether any NetworkPolicy would widen a sandbox's egress. Kubernetes
//! unions the allows of every policy that selects a pod, so cordon's
//! default deny and each tool's one door hold only while no other policy
//! in the namespace selects a sandbox pod with an egress rule: one that
//! does (the user's own, or one of cordon's that selects another tool's
//! pods) is reported, with what it allows.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::networking::v1::{NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyPeer};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use serde::Serialize;

use crate::network_policy::egress_policy_name;
use crate::{Rendered, names};

/// A policy that would let a tool's sandbox pods reach more than their
/// door.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Widening {
    /// The policy's name (`(unnamed)` when it has none).
    pub policy: String,
    /// Where it comes from: `rendered` or the file it was read from.
    pub source: String,
    pub tool: String,
    /// What it allows, one rule.
    pub allows: String,
}

impl fmt::Display for Widening {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NetworkPolicy {} ({}) widens the egress of tool {}'s sandbox pods: it allows {} \
             (NetworkPolicy allows are unioned)",
            self.policy, self.source, self.tool, self.allows
        )
    }
}

/// Whether `selector` selects pods labelled `labels` (a missing selector
/// selects every pod of the namespace).
pub fn selects(selector: Option<&LabelSelector>, labels: &BTreeMap<String, String>) -> bool {
    let Some(s) = selector else {
        return true;
    };
    let by_labels = s
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expressions = s.match_expressions.iter().flatten().all(|e| {
        let value = labels.get(&e.key);
        let values = e.values.as_deref().unwrap_or_default();
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            // An operator the API server would refuse selects nothing.
            _ => false,
        }
    });
    by_labels && by_expressions
}

fn peer(p: &NetworkPolicyPeer) -> String {
    let mut parts = Vec::new();
    if let Some(b) = &p.ip_block {
        let mut s = format!("ipBlock {}", b.cidr);
        if let Some(except) = b.except.as_ref().filter(|e| !e.is_empty()) {
            s.push_str(&format!(" except {}", except.join(",")));
        }
        parts.push(s);
    }
    if let Some(n) = &p.namespace_selector {
        parts.push(format!("namespaceSelector {}", selector_text(n)));
    }
    if let Some(s) = &p.pod_selector {
        parts.push(format!("podSelector {}", selector_text(s)));
    }
    parts.join(" ")
}

fn selector_text(s: &LabelSelector) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "?".into())
}

/// One egress rule in words.
pub fn rule_text(r: &NetworkPolicyEgressRule) -> String {
    let to = match r.to.as_deref() {
        None | Some([]) => "any destination".to_string(),
        Some(peers) => peers.iter().map(peer).collect::<Vec<_>>().join("; "),
    };
    let ports = match r.ports.as_deref() {
        None | Some([]) => "any port".to_string(),
        Some(ports) => ports
            .iter()
            .map(|p| {
                let port = match &p.port {
                    None => "any".to_string(),
                    Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n)) => {
                        n.to_string()
                    }
                    Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::String(s)) => {
                        s.clone()
                    }
                };
                let end = p.end_port.map(|e| format!("-{e}")).unwrap_or_default();
                format!("{}/{port}{end}", p.protocol.as_deref().unwrap_or("TCP"))
            })
            .collect::<Vec<_>>()
            .join(","),
    };
    format!("{to} on {ports}")
}

fn applies_to_egress(np: &NetworkPolicy) -> bool {
    let Some(spec) = &np.spec else {
        return false;
    };
    match &spec.policy_types {
        Some(t) => t.iter().any(|t| t == "Egress"),
        // Without policyTypes, Egress applies when there are egress rules.
        None => spec.egress.as_ref().is_some_and(|e| !e.is_empty()),
    }
}

/// Every rule of `policies` (from `source`) that would widen a rendered
/// sandbox's egress. Policies of another namespace do not select these
/// pods; a policy without a namespace is taken to be applied in this one.
pub fn check_policies(
    rendered: &Rendered,
    policies: &[NetworkPolicy],
    source: &str,
    own: bool,
) -> Vec<Widening> {
    let mut out = Vec::new();
    for np in policies {
        if np
            .metadata
            .namespace
            .as_deref()
            .is_some_and(|n| n != rendered.namespace)
            || !applies_to_egress(np)
        {
            continue;
        }
        let name = np.metadata.name.as_deref().unwrap_or("(unnamed)");
        let Some(spec) = &np.spec else { continue };
        for s in &rendered.sandboxes {
            let labels = names::sandbox_labels(&s.tool);
            if !selects(spec.pod_selector.as_ref(), &labels) {
                continue;
            }
            // A tool's own door, as cordon rendered it, is not a widening.
            if own && name == egress_policy_name(&s.tool) {
                continue;
            }
            for r in spec.egress.iter().flatten() {
                out.push(Widening {
                    policy: name.to_string(),
                    source: source.to_string(),
                    tool: s.tool.clone(),
                    allows: rule_text(r),
                });
            }
        }
    }
    out
}

/// The rendered policies' widenings, then those of `existing` (the user's
/// own, read from `source`).
pub fn check(rendered: &Rendered, existing: &[NetworkPolicy], source: &str) -> Vec<Widening> {
    let mut out = check_policies(rendered, &rendered.network_policies, "rendered", true);
    out.extend(check_policies(rendered, existing, source, false));
    out
}

/// The NetworkPolicies of a multi-document YAML file (other kinds are
/// skipped; a `List` or `NetworkPolicyList` is read item by item).
pub fn network_policies_from_yaml(text: &str) -> Result<Vec<NetworkPolicy>, String> {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(text).map_err(|e| format!("not YAML: {e}"))?;
    let mut out = Vec::new();
    let mut take = |v: &serde_json::Value| -> Result<(), String> {
        if v.get("kind").and_then(|k| k.as_str()) == Some("NetworkPolicy") {
            let np: NetworkPolicy = serde_json::from_value(v.clone()).map_err(|e| {
                let name = v
                    .pointer("/metadata/name")
                    .and_then(|n| n.as_str())
                    .unwrap_or("(unnamed)");
                format!("NetworkPolicy {name}: {e}")
            })?;
            out.push(np);
        }
        Ok(())
    };
    for d in &docs {
        match d.get("kind").and_then(|k| k.as_str()) {
            Some("List" | "NetworkPolicyList") => {
                for item in d
                    .get("items")
                    .and_then(|i| i.as_array())
                    .into_iter()
                    .flatten()
                {
                    take(item)?;
                }
            }
            _ => take(d)?,
        }
    }
    Ok(out)
}
