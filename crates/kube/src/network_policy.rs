//! The sandboxes' NetworkPolicies: one default-deny for every sandbox pod
//! (no ingress, no egress), and for each tool with a network one policy
//! that lets its pods reach their own port of the egress proxy Service and
//! nothing else. NetworkPolicy allows are unioned, so no other policy may
//! select a sandbox pod: [`crate::widening`] says when one does. The
//! domain allowlist is not here: it stays in cordon's proxy, which knows
//! the tool by the port it is reached on.

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyPeer, NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::Sandbox;
use crate::names;

/// The default-deny policy's name.
pub const DEFAULT_DENY: &str = "cordon-sandbox-default-deny";

/// The name of a tool's egress policy.
pub fn egress_policy_name(tool: &str) -> String {
    format!("{}-egress", names::sandbox_name(tool))
}

/// The rule of a tool's egress policy: the broker's pods, on the tool's
/// own proxy port, over TCP.
pub fn proxy_rule(port: i32) -> NetworkPolicyEgressRule {
    NetworkPolicyEgressRule {
        to: Some(vec![NetworkPolicyPeer {
            pod_selector: Some(names::broker_selector()),
            ..Default::default()
        }]),
        ports: Some(vec![NetworkPolicyPort {
            port: Some(IntOrString::Int(port)),
            protocol: Some("TCP".into()),
            end_port: None,
        }]),
    }
}

pub fn default_deny(ns: &str) -> NetworkPolicy {
    NetworkPolicy {
        metadata: names::meta(DEFAULT_DENY, ns, names::labels(&[])),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(names::all_sandboxes()),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: None,
            egress: None,
        }),
    }
}

pub fn tool_egress(ns: &str, tool: &str, port: i32) -> NetworkPolicy {
    NetworkPolicy {
        metadata: names::meta(&egress_policy_name(tool), ns, names::labels(&[])),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(names::one_sandbox(tool)),
            policy_types: Some(vec!["Egress".into()]),
            ingress: None,
            egress: Some(vec![proxy_rule(port)]),
        }),
    }
}

/// The default deny, then each networked tool's door.
pub fn network_policies(ns: &str, sandboxes: &[Sandbox]) -> Vec<NetworkPolicy> {
    std::iter::once(default_deny(ns))
        .chain(
            sandboxes
                .iter()
                .filter_map(|s| s.proxy_port.map(|port| tool_egress(ns, &s.tool, port))),
        )
        .collect()
}
