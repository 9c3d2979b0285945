//! The broker's least RBAC: a namespaced Role (nothing cluster-wide) to
//! start, watch, attach to and delete the sandbox pods, and to write and
//! delete each session's Secret (the CA bundle and placeholders; it never
//! reads a Secret), bound to its ServiceAccount.

use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};

use crate::agent_sandbox;
use crate::names;

fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_string()]),
        resources: Some(resources.iter().map(|s| s.to_string()).collect()),
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

/// The rules; with `agent_sandbox`, the claims and sandboxes of the
/// agent-sandbox controller too.
pub fn rules(agent_sandbox: bool) -> Vec<PolicyRule> {
    let mut r = vec![
        rule("", &["pods"], &["create", "get", "list", "watch", "delete"]),
        rule("", &["pods/attach", "pods/exec"], &["create", "get"]),
        rule("", &["secrets"], &["create", "delete"]),
    ];
    if agent_sandbox {
        r.push(rule(
            agent_sandbox::EXTENSIONS_GROUP,
            &["sandboxclaims"],
            &["create", "get", "list", "watch", "delete"],
        ));
        r.push(rule(
            agent_sandbox::CORE_GROUP,
            &["sandboxes"],
            &["get", "list", "watch"],
        ));
    }
    r
}

pub fn role(ns: &str, agent_sandbox: bool) -> Role {
    Role {
        metadata: names::meta(names::BROKER, ns, names::broker_labels()),
        rules: Some(rules(agent_sandbox)),
    }
}

pub fn role_binding(ns: &str) -> RoleBinding {
    RoleBinding {
        metadata: names::meta(names::BROKER, ns, names::broker_labels()),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: names::BROKER.into(),
        },
        subjects: Some(vec![Subject {
            api_group: None,
            kind: "ServiceAccount".into(),
            name: names::BROKER.into(),
            namespace: Some(ns.into()),
        }]),
    }
}
