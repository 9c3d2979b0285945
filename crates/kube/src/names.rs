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

/// A tool's name as a DNS-1123 label: the name itself when it is one
/// (lower case letters, digits and `-`, alphanumeric at both ends, at most
/// 51 characters), else the name made one (lower case, anything else as
/// `-`, cut to 42 characters) and `-` and 8 hex digits of a hash of the
/// name as written: `a_b` and `a-b` are different tools, and their objects
/// and labels must differ too. At most 51 characters, so that
/// `cordon-tool-<label>` is a label too.
pub fn dns_label(tool: &str) -> String {
    const MAX: usize = 51;
    let is_label = !tool.is_empty()
        && tool.len() <= MAX
        && tool
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !tool.starts_with('-')
        && !tool.ends_with('-');
    if is_label {
        return tool.to_string();
    }
    let mut s: String = tool
        .chars()
        .map(|c| match c {
            'A'..='Z' => c.to_ascii_lowercase(),
            'a'..='z' | '0'..='9' => c,
            _ => '-',
        })
        .take(MAX - 9)
        .collect();
    s = s.trim_matches('-').to_string();
    if s.is_empty() {
        s = "tool".into();
    }
    format!("{s}-{:08x}", fnv1a(tool))
}

/// FNV-1a, 32 bits: a stable short hash for names. Two tools whose labels
/// would still be equal are not both rendered ([`crate::render`] notes the
/// second).
fn fnv1a(s: &str) -> u32 {
    s.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// The name of a tool's sandbox objects: `cordon-tool-<label>`, at most 63
/// characters.
pub fn sandbox_name(tool: &str) -> String {
    format!("cordon-tool-{}", dns_label(tool))
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
