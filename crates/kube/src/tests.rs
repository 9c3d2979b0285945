use std::collections::BTreeSet;
use std::path::Path;

use cordon_policy::policy::Profile;
use k8s_openapi::api::core::v1::{Container, PodSpec};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use serde_json::{Value, json};

use super::*;

const DIGEST: &str = "sha256:5100fc600753f3649a76aed513731c73a910ef351a5d7d0fed2e1403aace62c2";

/// One tool of each kind a Pod is rendered for, and each kind that is not.
fn manifest() -> String {
    format!(
        r#"version: 1
tools:
  p2_image:
    profile: P2
    description: An image tool.
    image: busybox@{DIGEST}
    command: ["/bin/sh", "-c", "cat"]
    network: none
    limits: {{wall_seconds: 7, memory: 64M, tasks: 8, output_bytes: 4K}}
  p3_gvisor:
    profile: P3
    runtime: gvisor
    description: A browser-ish tool.
    image: busybox@{DIGEST}
    egress: proxy
    limits: {{wall_seconds: 60, memory: 1G, tasks: 64}}
    workspace: {{mount: /work, size: 16M}}
  p3_vm:
    profile: P3
    runtime: microvm
    accept: [kvm]
    description: A guest.
    image: busybox@{DIGEST}
    network: none
  mcp_api:
    profile: P2
    description: An MCP server from an image.
    mcp:
      image: api-mcp@{DIGEST}
    egress: ["api.example:443"]
    secrets: [{{name: API_TOKEN, scope: read, ttl: 900}}]
  p1_parser:
    profile: P1
    description: A parser.
    command: ["/usr/bin/wc"]
    network: none
  p2_host:
    profile: P2
    description: From the host's files.
    network: none
    mcp:
      command: ["/usr/bin/node", "/srv/x.js"]
"#
    )
}

fn rendered(opts: &Options) -> (PolicySet, Rendered) {
    let text = manifest();
    let loaded = cordon_policy::load_str(Path::new("t.yaml"), &text).expect("manifest loads");
    let r = render(&loaded.policy, &text, opts);
    (loaded.policy, r)
}

fn pod(s: &Sandbox) -> (&PodSpec, &Container) {
    let spec = s
        .template
        .template
        .as_ref()
        .and_then(|t| t.spec.as_ref())
        .expect("a pod spec");
    (spec, &spec.containers[0])
}

#[test]
fn every_p2_p3_tool_has_each_hardening_field() {
    let (set, r) = rendered(&Options::default());
    let names: BTreeSet<&str> = r.sandboxes.iter().map(|s| s.tool.as_str()).collect();
    assert_eq!(
        names,
        BTreeSet::from(["mcp_api", "p2_image", "p3_gvisor", "p3_vm"])
    );
    for s in &r.sandboxes {
        let p = &set.tools[&s.tool];
        assert!(matches!(p.profile, Profile::P2 | Profile::P3));
        let limits = p.limits.expect("limits");
        let (spec, c) = pod(s);
        let t = &s.tool;
        assert!(
            c.image.as_deref().is_some_and(|i| i.ends_with(DIGEST)),
            "{t}"
        );
        assert_eq!(spec.automount_service_account_token, Some(false), "{t}");
        assert_eq!(spec.restart_policy.as_deref(), Some("Never"), "{t}");
        assert_eq!(
            spec.active_deadline_seconds,
            Some(limits.wall.as_secs() as i64),
            "{t}"
        );
        assert!(spec.host_network.is_none() && spec.host_pid.is_none() && spec.host_ipc.is_none());
        assert!(spec.service_account_name.is_none(), "{t}");
        let psc = spec.security_context.as_ref().expect("pod securityContext");
        assert_eq!(psc.run_as_non_root, Some(true), "{t}");
        assert_eq!(
            psc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
            Some("RuntimeDefault")
        );
        let sc = c.security_context.as_ref().expect("securityContext");
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{t}");
        assert_eq!(sc.run_as_non_root, Some(true), "{t}");
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{t}");
        assert_eq!(sc.privileged, Some(false), "{t}");
        let caps = sc.capabilities.as_ref().expect("capabilities");
        assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]), "{t}");
        assert!(caps.add.is_none(), "{t}");
        assert_eq!(
            sc.seccomp_profile.as_ref().map(|s| s.type_.as_str()),
            Some("RuntimeDefault"),
            "{t}"
        );
        // Requests equal limits, from the policy.
        let res = c.resources.as_ref().expect("resources");
        assert_eq!(res.requests, res.limits, "{t}");
        let l = res.limits.as_ref().expect("limits");
        assert_eq!(l["memory"].0, limits.memory_bytes.to_string(), "{t}");
        assert_eq!(
            l["ephemeral-storage"].0,
            limits.disk_bytes.to_string(),
            "{t}"
        );
        // The runtime's class.
        let class = match p.runtime {
            cordon_policy::policy::Runtime::Native | cordon_policy::policy::Runtime::Wasm => None,
            cordon_policy::policy::Runtime::Gvisor => Some("gvisor"),
            cordon_policy::policy::Runtime::Microvm => Some("kata"),
        };
        assert_eq!(spec.runtime_class_name.as_deref(), class, "{t}");
        // Writable paths are memory-backed and capped; nothing else but
        // the session Secret's projection is mounted (no hostPath).
        for v in spec.volumes.iter().flatten() {
            match (&v.empty_dir, &v.projected) {
                (Some(e), None) => {
                    assert_eq!(e.medium.as_deref(), Some("Memory"), "{t}: {}", v.name);
                    assert!(e.size_limit.is_some(), "{t}: {}", v.name);
                }
                (None, Some(pr)) => {
                    for src in pr.sources.iter().flatten() {
                        let secret = src.secret.as_ref().expect("a secret projection");
                        assert_eq!(secret.name, pod_template::SESSION_SECRET);
                    }
                }
                _ => panic!(
                    "{t}: volume {} is neither emptyDir nor the session Secret",
                    v.name
                ),
            }
        }
        for m in c.volume_mounts.iter().flatten() {
            let writable = m.read_only != Some(true);
            assert_eq!(writable, m.name != "session-ca", "{t}: {}", m.name);
        }
        // A credential is a placeholder from the session Secret, never a value.
        for e in c.env.iter().flatten() {
            if p.secrets.iter().any(|s| s.name == e.name) {
                assert!(e.value.is_none(), "{t}: {}", e.name);
                assert!(
                    e.value_from
                        .as_ref()
                        .and_then(|v| v.secret_key_ref.as_ref())
                        .is_some()
                );
            }
        }
    }
    let (_, c) = pod(r.sandboxes.iter().find(|s| s.tool == "mcp_api").unwrap());
    assert!(c.env.iter().flatten().any(|e| e.name == "API_TOKEN"));
    let (spec, _) = pod(r.sandboxes.iter().find(|s| s.tool == "p3_gvisor").unwrap());
    assert!(spec.volumes.iter().flatten().any(|v| v.name == "workspace"));
}

#[test]
fn no_tool_is_dropped_silently() {
    let (set, r) = rendered(&Options::default());
    for name in set.tools.keys() {
        let as_pod = r.sandboxes.iter().any(|s| &s.tool == name);
        let noted = r.notes.iter().any(|n| &n.tool == name);
        assert!(as_pod || noted, "{name} is neither rendered nor noted");
    }
    let note = |t: &str| {
        r.notes
            .iter()
            .find(|n| n.tool == t)
            .map(|n| n.message.clone())
            .unwrap_or_default()
    };
    assert!(note("p1_parser").contains("broker's own pod"));
    assert!(note("p2_host").contains("a Pod runs an image"));
    let annotations = r
        .deployment
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.clone());
    assert_eq!(
        annotations.unwrap_or_default()[deployment::IN_BROKER],
        "p1_parser"
    );
}

#[test]
fn networked_tools_get_their_own_proxy_port_and_nothing_else() {
    let (_, r) = rendered(&Options::default());
    let ports: Vec<(&str, Option<i32>)> = r
        .sandboxes
        .iter()
        .map(|s| (s.tool.as_str(), s.proxy_port))
        .collect();
    assert_eq!(
        ports,
        [
            ("mcp_api", Some(3128)),
            ("p2_image", None),
            ("p3_gvisor", Some(3129)),
            ("p3_vm", None)
        ]
    );
    // The default deny, then one door per networked tool.
    let names: Vec<&str> = r
        .network_policies
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .collect();
    assert_eq!(
        names,
        [
            "cordon-sandbox-default-deny".to_string(),
            network_policy::egress_policy_name("mcp_api"),
            network_policy::egress_policy_name("p3_gvisor"),
        ]
    );
    let deny = r.network_policies[0].spec.as_ref().unwrap();
    assert!(deny.egress.is_none() && deny.ingress.is_none());
    assert_eq!(
        deny.policy_types.as_deref(),
        Some(&["Ingress".to_string(), "Egress".to_string()][..])
    );
    let svc = r.egress_service.as_ref().expect("the egress proxy Service");
    let svc_ports: Vec<i32> = svc
        .spec
        .as_ref()
        .unwrap()
        .ports
        .iter()
        .flatten()
        .map(|p| p.port)
        .collect();
    assert_eq!(svc_ports, [3128, 3129]);
    // cordon's own policies widen nothing.
    assert_eq!(widening::check(&r, &[], "x"), []);
}

#[test]
fn rbac_is_namespaced_and_least() {
    let (_, r) = rendered(&Options::default());
    let rules: Vec<(String, Vec<String>, Vec<String>)> = r
        .role
        .rules
        .iter()
        .flatten()
        .map(|p| {
            (
                p.api_groups.clone().unwrap_or_default().join(","),
                p.resources.clone().unwrap_or_default(),
                p.verbs.clone(),
            )
        })
        .collect();
    let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        rules,
        [
            (
                "".into(),
                s(&["pods"]),
                s(&["create", "get", "list", "watch", "delete"])
            ),
            (
                "".into(),
                s(&["pods/attach", "pods/exec"]),
                s(&["create", "get"])
            ),
            ("".into(), s(&["secrets"]), s(&["create", "delete"])),
        ]
    );
    assert_eq!(r.role.metadata.namespace.as_deref(), Some("cordon"));
    assert_eq!(r.role_binding.role_ref.kind, "Role");
    let docs = r.documents().unwrap();
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"].as_str().unwrap_or("").starts_with("Cluster"))
    );
    assert!(docs.iter().all(|d| d["metadata"]["namespace"] == "cordon"));
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

#[test]
fn agent_sandbox_objects_have_the_v1beta1_fields_only() {
    let (_, r) = rendered(&Options {
        agent_sandbox: true,
        ..Default::default()
    });
    assert_eq!(r.sandbox_templates.len(), 4);
    let docs = r.documents().unwrap();
    assert!(!docs.iter().any(|d| d["kind"] == "PodTemplate"));
    let t = docs
        .iter()
        .find(|d| d["kind"] == "SandboxTemplate")
        .unwrap();
    assert_eq!(t["apiVersion"], "extensions.agents.x-k8s.io/v1beta1");
    assert_eq!(
        keys(t),
        keys(&json!({"apiVersion": 0, "kind": 0, "metadata": 0, "spec": 0}))
    );
    assert_eq!(keys(&t["spec"]), keys(&json!({"podTemplate": 0})));
    assert_eq!(
        keys(&t["spec"]["podTemplate"]),
        keys(&json!({"metadata": 0, "spec": 0}))
    );
    // No tool here is kept warm: no pool.
    assert!(r.warm_pools.is_empty());

    let pool = agent_sandbox::SandboxWarmPool {
        api_version: agent_sandbox::API_VERSION.into(),
        kind: "SandboxWarmPool".into(),
        metadata: Default::default(),
        spec: agent_sandbox::SandboxWarmPoolSpec {
            replicas: 2,
            sandbox_template_ref: agent_sandbox::TemplateRef { name: "t".into() },
        },
    };
    let v = serde_json::to_value(&pool).unwrap();
    assert_eq!(
        keys(&v["spec"]),
        keys(&json!({"replicas": 0, "sandboxTemplateRef": 0}))
    );
    assert_eq!(
        keys(&v["spec"]["sandboxTemplateRef"]),
        keys(&json!({"name": 0}))
    );
    // Read back with an unknown field: refused (the field list is closed).
    let mut bad = v.clone();
    bad["spec"]["warmPoolRef"] = json!({"name": "t"});
    let e = serde_json::from_value::<agent_sandbox::SandboxWarmPool>(bad).unwrap_err();
    assert!(e.to_string().contains("unknown field `warmPoolRef`"), "{e}");
    assert_eq!(
        serde_json::from_value::<agent_sandbox::SandboxWarmPool>(v).unwrap(),
        pool
    );
}

fn policy(yaml: &str) -> NetworkPolicy {
    widening::network_policies_from_yaml(yaml)
        .unwrap()
        .remove(0)
}

#[test]
fn widening_follows_selectors_namespaces_and_policy_types() {
    let (_, r) = rendered(&Options::default());
    let check = |y: &str| widening::check(&r, &[policy(y)], "f.yaml");
    // An empty selector selects every sandbox; an empty rule allows all.
    let all = check(
        "kind: NetworkPolicy\nmetadata: {name: a}\nspec: {podSelector: {}, policyTypes: [Egress], egress: [{}]}\n",
    );
    assert_eq!(all.len(), 4);
    assert!(
        all.iter()
            .all(|w| w.allows == "any destination on any port")
    );
    // Expressions: only the tool named.
    let one = check(&format!(
        "kind: NetworkPolicy\nmetadata: {{name: b}}\nspec:\n  podSelector: {{matchExpressions: [{{key: cordon.dev/tool, operator: In, values: [{}]}}]}}\n  egress: [{{ports: [{{port: 53, protocol: UDP}}]}}]\n",
        names::dns_label("p3_vm")
    ));
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].tool, "p3_vm");
    assert_eq!(one[0].allows, "any destination on UDP/53");
    let not = check(
        "kind: NetworkPolicy\nmetadata: {name: c}\nspec:\n  podSelector: {matchExpressions: [{key: cordon.dev/role, operator: NotIn, values: [sandbox]}]}\n  egress: [{}]\n",
    );
    assert_eq!(not, []);
    // Another namespace's policy does not select these pods.
    let elsewhere = check(
        "kind: NetworkPolicy\nmetadata: {name: d, namespace: other}\nspec: {podSelector: {}, policyTypes: [Egress], egress: [{}]}\n",
    );
    assert_eq!(elsewhere, []);
    // Ingress only: no egress widened.
    let ingress = check(
        "kind: NetworkPolicy\nmetadata: {name: e}\nspec: {podSelector: {}, policyTypes: [Ingress], ingress: [{}]}\n",
    );
    assert_eq!(ingress, []);
    // A user's policy named like cordon's own door is still the user's.
    let same_name = check(&format!(
        "kind: NetworkPolicy\nmetadata: {{name: {}}}\nspec:\n  podSelector: {{matchLabels: {{cordon.dev/tool: {}}}}}\n  policyTypes: [Egress]\n  egress: [{{to: [{{ipBlock: {{cidr: 10.0.0.0/8}}}}]}}]\n",
        network_policy::egress_policy_name("mcp_api"),
        names::dns_label("mcp_api")
    ));
    assert_eq!(same_name.len(), 1);
    assert_eq!(same_name[0].allows, "ipBlock 10.0.0.0/8 on any port");
}

#[test]
fn names_are_labels_and_tell_tools_apart() {
    assert_eq!(names::dns_label("shout"), "shout");
    assert_eq!(names::sandbox_name("shout"), "cordon-tool-shout");
    let (a, b) = (names::dns_label("a_b"), names::dns_label("a-b"));
    assert_ne!(a, b);
    assert!(a.starts_with("a-b-") && a.len() == 12, "{a}");
    let long = "X".repeat(64);
    for t in ["A_b", "_x_", "-", long.as_str(), "pdf_to_text"] {
        let l = names::dns_label(t);
        assert!(l.len() <= 51, "{t}: {l}");
        assert!(
            l.bytes()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-'),
            "{t}: {l}"
        );
        assert!(!l.starts_with('-') && !l.ends_with('-'), "{t}: {l}");
        assert!(names::sandbox_name(t).len() <= 63);
    }
}

#[test]
fn tools_differing_only_in_underscores_get_distinct_objects() {
    let text = format!(
        "version: 1\ntools:\n  a-b:\n    profile: P2\n    description: x\n    image: busybox@{DIGEST}\n    network: none\n  a_b:\n    profile: P2\n    description: y\n    image: busybox@{DIGEST}\n    network: none\n"
    );
    let loaded = cordon_policy::load_str(Path::new("t.yaml"), &text).expect("loads");
    let r = render(&loaded.policy, &text, &Options::default());
    // Different names, different labels: both rendered.
    assert_eq!(r.sandboxes.len(), 2);
    assert!(r.notes.is_empty(), "{:?}", r.notes);
    let names: BTreeSet<String> = r
        .sandboxes
        .iter()
        .filter_map(|s| s.template.metadata.name.clone())
        .collect();
    assert_eq!(names.len(), 2);
}
