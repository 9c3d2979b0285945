//! Object names and labels, shared by every object kind.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};

/// Every object cordon renders carries this label.
pub const PART_OF: (&str, &str) = ("app.kubernetes.io/part-of", "cordon");
/// `broker` or `sandbox`.
pub const ROLE: &str = "cordon.dev/role";
/// A sandbox's tool (its name made a label value).
pub const TOOL: &str = "cordon.dev/tool";
/// The tool's name as the manifest writes it.
pub const TOOL_ANNOTATION: &str = "cordon.dev/tool";

/// The broker's objects' name.
pub const BROKER: &str = "cordon";
/// The egress proxy Service's name.
pub const EGRESS: &str = "cordon-egress";
/// The ConfigMap holding the manifest.
pub const MANIFEST: &str = "cordon-manifest";
/// The Secret the broker writes with the session CA's certificate (never
/// a key).
pub const SESSION_CA: &str = "cordon-session-ca";

/// A tool's name as a DNS-1123 label: lower case, `_` as `-`, at most 63
/// characters, alphanumeric at both ends.
pub fn dns_label(tool: &str) -> String {
    let mut s: String = tool
        .chars()
        .map(|c| match c {
            'A'..='Z' => c.to_ascii_lowercase(),
            'a'..='z' | '0'..='9' => c,
            _ => '-',
        })
        .collect();
    s.truncate(63);
    let s = s.trim_matches('-').to_string();
    if s.is_empty() { "tool".into() } else { s }
}

/// The name of a tool's sandbox objects: `cordon-tool-<label>`, at most 63
/// characters (a tool name is at most 64).
pub fn sandbox_name(tool: &str) -> String {
    let mut n = format!("cordon-tool-{}", dns_label(tool));
    n.truncate(63);
    n.trim_end_matches('-').to_string()
}

pub fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    std::iter::once(PART_OF)
        .chain(pairs.iter().copied())
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The broker's pods' labels.
pub fn broker_labels() -> BTreeMap<String, String> {
    labels(&[(ROLE, "broker")])
}

/// A tool's sandbox pods' labels.
pub fn sandbox_labels(tool: &str) -> BTreeMap<String, String> {
    labels(&[(ROLE, "sandbox"), (TOOL, &dns_label(tool))])
}

/// Selects every sandbox pod.
pub fn all_sandboxes() -> LabelSelector {
    LabelSelector {
        match_labels: Some(labels(&[(ROLE, "sandbox")])),
        ..Default::default()
    }
}

/// Selects one tool's sandbox pods.
pub fn one_sandbox(tool: &str) -> LabelSelector {
    LabelSelector {
        match_labels: Some(sandbox_labels(tool)),
        ..Default::default()
    }
}

/// Selects the broker's pods.
pub fn broker_selector() -> LabelSelector {
    LabelSelector {
        match_labels: Some(broker_labels()),
        ..Default::default()
    }
}

/// Metadata: this name in this namespace, these labels.
pub fn meta(name: &str, ns: &str, labels: BTreeMap<String, String>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: Some(ns.to_string()),
        labels: Some(labels),
        ..Default::default()
    }
}
